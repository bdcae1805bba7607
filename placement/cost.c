/*
 * cost.c: the hardware descriptions of the decode step cost model (moet_cost.h): the
 * built-in defaults and the hardware file reader. The model itself is cost_model.c.
 *
 * The hardware file is a YAML mapping (configs/hardware-h200-host.yaml):
 *
 *   name: h200-host
 *   cpu_read_gbps: 94        # every key optional; a missing one keeps its default
 *   cpu_fma_gflops: 1329
 *   cpu_fma_frac:            # a curve: tokens per expert: fraction of the peak
 *     2: 0.198
 *     8: 0.391
 *   ...
 *
 * read with libyaml's document API, so every fault names its line. Scalars are read as text
 * and converted with strtod, whatever their YAML tag. A curve is checked whole when read
 * (tokens increasing, fractions in (0, 1], tokens / fraction never falling), so that the
 * model can rely on t(r) never falling as r grows.
 *
 * The writer (moet_cost_hw_save, for `bench e2e --hardware-out`) writes the figures it is
 * told to, each under its comment, in the same format: numbers in the fewest digits that
 * read back to the same double, curves in block style. It reads its own text back with the
 * parser before the file is created, so a file it writes always loads, figure for figure.
 */
#include <inttypes.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "moet_cost.h"
#include "moet_err.h"

void moet_cost_hw_defaults(moet_cost_hw *out)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "built-in defaults (h200-host)");
	out->cpu_read_gbps = 94.0;
	out->gpu_read_gbps = 2700.0;
	out->pcie_gbps = 55.0;
	out->pcie_latency_us = 10.0;
	out->stage_copy_gbps = 5.0;
	out->stage_pinned_gbps = 38.0;
	out->cpu_overhead_us = 20.0;
	out->gpu_overhead_us = 10.0;
	out->act_bytes = 4.0;
	out->from_file = false;
	/* configs/hardware-h200-host.yaml says which record each figure comes from. */
	static const double tok[9] = { 2, 4, 8, 16, 32, 64, 128, 256, 1024 };
	static const double cpu[9] = { 0.198, 0.324, 0.391, 0.524, 0.531, 0.502, 0.553, 0.555,
				       0.554 };
	static const double gpu[9] = { 0.185, 0.283, 0.336, 0.341, 0.347, 0.353, 0.358, 0.362,
				       0.364 };
	out->cpu_fma_gflops = 1329.0;
	out->gpu_sgemm_gflops = 50575.0;
	out->cpu_fma_frac.n = out->gpu_sgemm_frac.n = 9;
	for (int i = 0; i < 9; i++) {
		out->cpu_fma_frac.tokens[i] = out->gpu_sgemm_frac.tokens[i] = tok[i];
		out->cpu_fma_frac.frac[i] = cpu[i];
		out->gpu_sgemm_frac.frac[i] = gpu[i];
	}
}

/* ---- the hardware file -------------------------------------------------------------------- */

typedef struct hw_key {
	const char *name;
	size_t off;        /* offset of the double in moet_cost_hw */
	double lo;         /* smallest allowed value */
	bool lo_open;      /* the value must be > lo (bandwidths) */
	double hi;
} hw_key;

static const hw_key hw_keys[] = {
	{ "cpu_read_gbps", offsetof(moet_cost_hw, cpu_read_gbps), 0, true, 1e6 },
	{ "gpu_read_gbps", offsetof(moet_cost_hw, gpu_read_gbps), 0, true, 1e6 },
	{ "pcie_gbps", offsetof(moet_cost_hw, pcie_gbps), 0, true, 1e6 },
	{ "pcie_latency_us", offsetof(moet_cost_hw, pcie_latency_us), 0, false, 1e6 },
	{ "stage_copy_gbps", offsetof(moet_cost_hw, stage_copy_gbps), 0, true, 1e6 },
	{ "stage_pinned_gbps", offsetof(moet_cost_hw, stage_pinned_gbps), 0, true, 1e6 },
	{ "cpu_overhead_us", offsetof(moet_cost_hw, cpu_overhead_us), 0, false, 1e6 },
	{ "gpu_overhead_us", offsetof(moet_cost_hw, gpu_overhead_us), 0, false, 1e6 },
	{ "act_bytes", offsetof(moet_cost_hw, act_bytes), 1, false, 8 },
	{ "cpu_fma_gflops", offsetof(moet_cost_hw, cpu_fma_gflops), 0, true, 1e9 },
	{ "gpu_sgemm_gflops", offsetof(moet_cost_hw, gpu_sgemm_gflops), 0, true, 1e9 },
};
#define N_HW_KEYS ((int)(sizeof(hw_keys) / sizeof(hw_keys[0])))

/* The curves, after the scalar keys in the seen[] index. */
static const struct {
	const char *name;
	size_t off;        /* offset of the moet_cost_curve in moet_cost_hw */
	int ms;            /* 0: tokens: fraction of a peak; 1: batch: milliseconds */
} hw_curves[] = {
	{ "cpu_fma_frac", offsetof(moet_cost_hw, cpu_fma_frac), 0 },
	{ "gpu_sgemm_frac", offsetof(moet_cost_hw, gpu_sgemm_frac), 0 },
	{ "gpu_dense_ms", offsetof(moet_cost_hw, gpu_dense_ms), 1 },
};
#define N_HW_CURVES 3
#define HW_NAME_IDX (N_HW_KEYS + N_HW_CURVES)

#define HW_KEY_LIST "name, cpu_read_gbps, gpu_read_gbps, pcie_gbps, pcie_latency_us, " \
	"stage_copy_gbps, stage_pinned_gbps, " \
	"cpu_overhead_us, gpu_overhead_us, act_bytes, cpu_fma_gflops, gpu_sgemm_gflops, " \
	"cpu_fma_frac, gpu_sgemm_frac, gpu_dense_ms"

static int hw_yaml_fail(const char *label, const yaml_parser_t *ps)
{
	const char *problem = ps->problem ? ps->problem : "unknown error";
	if (ps->error == YAML_READER_ERROR)
		return moet_err(MOET_EFORMAT, "%s: malformed YAML: %s at byte %zu", label, problem,
				ps->problem_offset);
	return moet_err(MOET_EFORMAT, "%s:%zu: malformed YAML: %s", label,
			ps->problem_mark.line + 1, problem);
}

static int hw_line(const yaml_node_t *n)
{
	return (int)n->start_mark.line + 1;
}

/* A curve, checked whole (moet_cost_curve): tokens: fraction of a peak, or (ms) batch:
 * milliseconds of the dense part, never falling as the batch grows. */
static int hw_curve(const char *label, yaml_document_t *doc, const char *key,
		    const yaml_node_t *v, int ms, moet_cost_curve *out)
{
	moet_cost_curve c = { 0 };
	if (v->type != YAML_MAPPING_NODE)
		return moet_err(MOET_EFORMAT, "%s:%d: %s: expected a mapping of %s (e.g. %s; {} "
				"for none)", label, hw_line(v), key,
				ms ? "batch: milliseconds" : "tokens per expert: fraction of the peak",
				ms ? "{1: 2.6, 64: 20.5}" : "{8: 0.39, 64: 0.5}");
	for (yaml_node_pair_t *pr = v->data.mapping.pairs.start; pr < v->data.mapping.pairs.top;
	     pr++) {
		const yaml_node_t *tk = yaml_document_get_node(doc, pr->key);
		const yaml_node_t *fv = yaml_document_get_node(doc, pr->value);
		if (!tk || !fv || tk->type != YAML_SCALAR_NODE || fv->type != YAML_SCALAR_NODE)
			return moet_err(MOET_EFORMAT, "%s:%d: %s: expected scalar tokens: fraction "
					"pairs", label, tk ? hw_line(tk) : hw_line(v), key);
		const char *ts = (const char *)tk->data.scalar.value;
		const char *fs = (const char *)fv->data.scalar.value;
		char *end;
		double t = strtod(ts, &end);
		if (end == ts || *end || !(t >= 1 && t <= 1e6) || t != floor(t))
			return moet_err(MOET_EFORMAT, "%s:%d: %s: tokens '%.64s' is not a whole "
					"number from 1 to 1000000", label, hw_line(tk), key, ts);
		double f = strtod(fs, &end);
		if (end == fs || *end || !isfinite(f))
			return moet_err(MOET_EFORMAT, "%s:%d: %s: %g tokens: fraction '%.64s' "
					"is not a number", label, hw_line(fv), key, t, fs);
		if (ms && !(f > 0 && f <= 1e6))
			return moet_err(MOET_ERANGE, "%s:%d: %s: batch %g: %g ms out of range "
					"(above 0 .. 1e6)", label, hw_line(fv), key, t, f);
		if (!ms && !(f > 0 && f <= 1))
			return moet_err(MOET_ERANGE, "%s:%d: %s: %g tokens: fraction %g out of "
					"range (above 0 .. 1)", label, hw_line(fv), key, t, f);
		if (c.n == MOET_COST_MAX_POINTS)
			return moet_err(MOET_ERANGE, "%s:%d: %s: more than %d points", label,
					hw_line(tk), key, MOET_COST_MAX_POINTS);
		if (c.n && t <= c.tokens[c.n - 1])
			return moet_err(MOET_ERANGE, "%s:%d: %s: %g tokens after %g: tokens must "
					"increase", label, hw_line(tk), key, t, c.tokens[c.n - 1]);
		if (ms && c.n && f < c.frac[c.n - 1])
			return moet_err(MOET_ERANGE, "%s:%d: %s: batch %g at %g ms after %g ms: a "
					"larger batch must not take less time", label, hw_line(fv),
					key, t, f, c.frac[c.n - 1]);
		/* NOTE: compared as t x f' < t' x f (no division) so that equal times pass. */
		if (!ms && c.n && t * c.frac[c.n - 1] < c.tokens[c.n - 1] * f)
			return moet_err(MOET_ERANGE, "%s:%d: %s: %g tokens at %g would take less "
					"time than %g at %g (tokens / fraction must not fall)",
					label, hw_line(fv), key, t, f, c.tokens[c.n - 1],
					c.frac[c.n - 1]);
		c.tokens[c.n] = t;
		c.frac[c.n] = f;
		c.n++;
	}
	*out = c;
	return 0;
}

/* One key: value pair into *hw; seen[] catches repeats. */
static int hw_entry(const char *label, yaml_document_t *doc, const yaml_node_pair_t *pr,
		    moet_cost_hw *hw, int *seen)
{
	const yaml_node_t *k = yaml_document_get_node(doc, pr->key);
	const yaml_node_t *v = yaml_document_get_node(doc, pr->value);
	if (!k || k->type != YAML_SCALAR_NODE)
		return moet_err(MOET_EFORMAT, "%s:%d: keys must be scalars", label,
				k ? hw_line(k) : 0);
	const char *key = (const char *)k->data.scalar.value;
	int idx = -1;
	if (!strcmp(key, "name"))
		idx = HW_NAME_IDX;
	for (int i = 0; i < N_HW_KEYS; i++)
		if (!strcmp(key, hw_keys[i].name))
			idx = i;
	for (int i = 0; i < N_HW_CURVES; i++)
		if (!strcmp(key, hw_curves[i].name))
			idx = N_HW_KEYS + i;
	if (idx < 0)
		return moet_err(MOET_EFORMAT, "%s:%d: unknown key '%.64s' (" HW_KEY_LIST ")", label,
				hw_line(k), key);
	if (seen[idx])
		return moet_err(MOET_EFORMAT, "%s:%d: %s given twice (first on line %d)", label,
				hw_line(k), key, seen[idx]);
	seen[idx] = hw_line(k);
	if (!v)
		return moet_err(MOET_EFORMAT, "%s:%d: %s: no value", label, hw_line(k), key);
	if (idx >= N_HW_KEYS && idx < HW_NAME_IDX) {
		const int c = idx - N_HW_KEYS;
		return hw_curve(label, doc, key, v, hw_curves[c].ms,
				(moet_cost_curve *)((char *)hw + hw_curves[c].off));
	}
	if (v->type != YAML_SCALAR_NODE)
		return moet_err(MOET_EFORMAT, "%s:%d: %s: expected a scalar", label, hw_line(k),
				key);
	const char *val = (const char *)v->data.scalar.value;
	if (idx == HW_NAME_IDX) {
		if (strlen(val) >= sizeof(hw->name) || !*val)
			return moet_err(MOET_EFORMAT, "%s:%d: name: 1 to %d characters", label,
					hw_line(v), MOET_COST_NAME_BYTES - 1);
		snprintf(hw->name, sizeof(hw->name), "%s", val);
		return 0;
	}
	char *end;
	double x = strtod(val, &end);
	if (end == val || *end || !isfinite(x))
		return moet_err(MOET_EFORMAT, "%s:%d: %s: '%.64s' is not a number", label,
				hw_line(v), key, val);
	const hw_key *hk = &hw_keys[idx];
	if (x > hk->hi || x < hk->lo || (hk->lo_open && x <= hk->lo))
		return moet_err(MOET_ERANGE, "%s:%d: %s: %g out of range (%s %g .. %g)", label,
				hw_line(v), key, x, hk->lo_open ? "above" : "from", hk->lo, hk->hi);
	*(double *)((char *)hw + hk->off) = x;
	return 0;
}

int moet_cost_hw_parse(const char *label, const char *text, size_t n_bytes, moet_cost_hw *out)
{
	yaml_parser_t ps;
	yaml_document_t doc;
	moet_cost_hw hw;
	int seen[HW_NAME_IDX + 1] = { 0 };
	int rc = 0;
	moet_cost_hw_defaults(&hw);
	if (!yaml_parser_initialize(&ps))
		return moet_err(MOET_ENOMEM, "%s: yaml parser", label);
	yaml_parser_set_input_string(&ps, (const unsigned char *)text, n_bytes);
	if (!yaml_parser_load(&ps, &doc)) {
		rc = hw_yaml_fail(label, &ps);
		yaml_parser_delete(&ps);
		return rc;
	}
	yaml_node_t *root = yaml_document_get_root_node(&doc);
	if (!root)
		rc = moet_err(MOET_EFORMAT, "%s: empty hardware file (expected a mapping of "
			      "cpu_read_gbps, gpu_read_gbps, ...)", label);
	else if (root->type != YAML_MAPPING_NODE)
		rc = moet_err(MOET_EFORMAT, "%s:%d: expected a mapping of cpu_read_gbps, "
			      "gpu_read_gbps, ...", label, hw_line(root));
	for (yaml_node_pair_t *pr = root && !rc ? root->data.mapping.pairs.start : NULL;
	     pr && pr < root->data.mapping.pairs.top && !rc; pr++)
		rc = hw_entry(label, &doc, pr, &hw, seen);
	yaml_document_delete(&doc);
	yaml_parser_delete(&ps);
	if (rc)
		return rc;
	hw.from_file = true;
	*out = hw;
	return 0;
}

int moet_cost_hw_load(const char *path, moet_cost_hw *out)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return moet_err(MOET_EIO, "%s: cannot open", path);
	char *buf = malloc(1u << 16);
	size_t n = buf ? fread(buf, 1, 1u << 16, f) : 0;
	int big = buf && n == (1u << 16), err = ferror(f);
	fclose(f);
	int rc;
	if (!buf)
		rc = moet_err(MOET_ENOMEM, "%s", path);
	else if (err)
		rc = moet_err(MOET_EIO, "%s: read error", path);
	else if (big)
		rc = moet_err(MOET_EIO, "%s: larger than 64 KiB: not a hardware file", path);
	else
		rc = moet_cost_hw_parse(path, buf, n, out);
	free(buf);
	return rc;
}


/* ---- the writer --------------------------------------------------------------------------- */

/* A growing text buffer; err latches the first allocation failure. */
typedef struct hw_text {
	char *p;
	size_t n, cap;
	int err;
} hw_text;

static void hw_put(hw_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hw_put(hw_text *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (t->err || k < 0) {
		t->err = 1;
		return;
	}
	if (t->n + (size_t)k + 1 > t->cap) {
		size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)k;
		char *q = realloc(t->p, cap);
		if (!q) {
			t->err = 1;
			return;
		}
		t->p = q;
		t->cap = cap;
	}
	va_start(ap, fmt);
	vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
	va_end(ap);
	t->n += (size_t)k;
}

/* x in the fewest significant digits (at most 17) that strtod reads back as x. */
static void hw_num(char *buf, size_t n, double x)
{
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, n, "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			return;
	}
}

/* Comment text as '# ' lines: broken at '\n' and wrapped at spaces before 96 columns. */
static void hw_comment(hw_text *t, const char *c)
{
	while (c && *c) {
		size_t len = strcspn(c, "\n");
		if (len > 94) {
			size_t cut = 94;
			while (cut > 0 && c[cut] != ' ')
				cut--;
			len = cut ? cut : len;
		}
		hw_put(t, "#%s%.*s\n", len ? " " : "", (int)len, c);
		c += len;
		while (*c == ' ')
			c++;
		if (*c == '\n')
			c++;
	}
}

/* The index of a key in seen[] (as hw_entry), -1 when unknown. */
static int hw_key_idx(const char *key)
{
	if (!strcmp(key, "name"))
		return HW_NAME_IDX;
	for (int i = 0; i < N_HW_KEYS; i++)
		if (!strcmp(key, hw_keys[i].name))
			return i;
	for (int i = 0; i < N_HW_CURVES; i++)
		if (!strcmp(key, hw_curves[i].name))
			return N_HW_KEYS + i;
	return -1;
}

/* Do the figure idx of a and b agree bit for bit? */
static bool hw_same(const moet_cost_hw *a, const moet_cost_hw *b, int idx)
{
	if (idx == HW_NAME_IDX)
		return !strcmp(a->name, b->name);
	if (idx < N_HW_KEYS)
		return *(const double *)((const char *)a + hw_keys[idx].off) ==
		       *(const double *)((const char *)b + hw_keys[idx].off);
	const size_t off = hw_curves[idx - N_HW_KEYS].off;
	const moet_cost_curve *ca = (const void *)((const char *)a + off);
	const moet_cost_curve *cb = (const void *)((const char *)b + off);
	if (ca->n != cb->n)
		return false;
	for (int i = 0; i < ca->n; i++)
		if (ca->tokens[i] != cb->tokens[i] || ca->frac[i] != cb->frac[i])
			return false;
	return true;
}

/* One entry's text: its comment, then the key and its value from hw. */
static int hw_write_entry(const char *path, hw_text *t, const moet_cost_hw *hw,
			  const moet_cost_hw_entry *e, int idx)
{
	char num[40], num2[40];
	hw_comment(t, e->comment);
	if (idx < 0)
		return 0;
	if (idx == HW_NAME_IDX) {
		for (const char *c = hw->name; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == '"' || *c == '\\')
				return moet_err(MOET_EINVAL, "%s: name '%s': no quotes, "
						"backslashes or control characters", path,
						hw->name);
		hw_put(t, "name: \"%s\"\n", hw->name);
		return 0;
	}
	if (idx < N_HW_KEYS) {
		hw_num(num, sizeof(num), *(const double *)((const char *)hw + hw_keys[idx].off));
		hw_put(t, "%s: %s\n", hw_keys[idx].name, num);
		return 0;
	}
	const moet_cost_curve *c = (const void *)((const char *)hw +
						  hw_curves[idx - N_HW_KEYS].off);
	if (c->n < 0 || c->n > MOET_COST_MAX_POINTS)
		return moet_err(MOET_EINVAL, "%s: %s: %d points", path, e->key, c->n);
	hw_put(t, "%s:%s\n", e->key, c->n ? "" : " {}");
	for (int i = 0; i < c->n; i++) {
		hw_num(num, sizeof(num), c->tokens[i]);
		hw_num(num2, sizeof(num2), c->frac[i]);
		hw_put(t, "  %s: %s\n", num, num2);
	}
	return 0;
}

int moet_cost_hw_save(const char *path, const moet_cost_hw *hw, const char *header,
		      const moet_cost_hw_entry *entries, int n_entries)
{
	hw_text t = { 0 };
	int seen[HW_NAME_IDX + 1] = { 0 };
	moet_cost_hw back;
	FILE *f = NULL;
	int rc = 0;
	hw_comment(&t, header);
	for (int i = 0; !rc && i < n_entries; i++) {
		const moet_cost_hw_entry *e = &entries[i];
		const int idx = e->key ? hw_key_idx(e->key) : -1;
		if (e->key && idx < 0)
			rc = moet_err(MOET_EINVAL, "%s: unknown key '%s' (" HW_KEY_LIST ")", path,
				      e->key);
		else if (idx >= 0 && seen[idx]++)
			rc = moet_err(MOET_EINVAL, "%s: %s given twice", path, e->key);
		else {
			if (i || header)
				hw_put(&t, "\n");
			rc = hw_write_entry(path, &t, hw, e, idx);
		}
	}
	if (!rc && (t.err || !t.p))
		rc = moet_err(MOET_ENOMEM, "%s: hardware file text", path);
	/* NOTE: read back before the file exists: a figure the reader refuses (a curve that
	 * falls, a bandwidth of 0) is the caller's error, and leaves no file behind. */
	if (!rc && moet_cost_hw_parse(path, t.p, t.n, &back))
		rc = moet_err_prefix(MOET_EINVAL, "hardware file as written would not load");
	for (int i = 0; !rc && i <= HW_NAME_IDX; i++)
		if (seen[i] && !hw_same(hw, &back, i))
			rc = moet_err(MOET_EINVAL, "%s: %s does not read back as written", path,
				      i == HW_NAME_IDX ? "name" : i < N_HW_KEYS ? hw_keys[i].name
						: hw_curves[i - N_HW_KEYS].name);
	if (!rc && !(f = fopen(path, "w")))
		rc = moet_err(MOET_EIO, "%s: cannot create: %s", path, strerror(errno));
	if (!rc && fwrite(t.p, 1, t.n, f) != t.n)
		rc = moet_err(MOET_EIO, "%s: write error: %s", path, strerror(errno));
	if (f && fclose(f) && !rc)
		rc = moet_err(MOET_EIO, "%s: write error: %s", path, strerror(errno));
	free(t.p);
	return rc;
}
