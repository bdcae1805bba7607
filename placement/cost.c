/*
 * cost.c: the decode step cost model (moet_cost.h): the hardware file reader and the
 * prediction of a placement's step time.
 *
 * The hardware file is a flat YAML mapping (configs/hardware-h200-host.yaml):
 *
 *   name: h200-host
 *   cpu_read_gbps: 94        # every key optional; a missing one keeps its default
 *   ...
 *
 * read with libyaml's document API, so every fault names its line. Scalars are read as text
 * and converted with strtod, whatever their YAML tag.
 *
 * NOTE: A_tier (the chance that a tier works at all in a step) is 1 - prod(1 - P_e), summed
 * in log space (log1p) so that 384 small P_e do not lose their product to rounding.
 */
#include <inttypes.h>
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
	out->cpu_overhead_us = 20.0;
	out->gpu_overhead_us = 10.0;
	out->act_bytes = 4.0;
	out->from_file = false;
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
	{ "cpu_overhead_us", offsetof(moet_cost_hw, cpu_overhead_us), 0, false, 1e6 },
	{ "gpu_overhead_us", offsetof(moet_cost_hw, gpu_overhead_us), 0, false, 1e6 },
	{ "act_bytes", offsetof(moet_cost_hw, act_bytes), 1, false, 8 },
};
#define N_HW_KEYS ((int)(sizeof(hw_keys) / sizeof(hw_keys[0])))

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
	if (!v || v->type != YAML_SCALAR_NODE)
		return moet_err(MOET_EFORMAT, "%s:%d: %s: expected a scalar", label, hw_line(k),
				key);
	const char *val = (const char *)v->data.scalar.value;
	int idx = -1;
	if (!strcmp(key, "name")) {
		idx = N_HW_KEYS;
	} else {
		for (int i = 0; i < N_HW_KEYS; i++)
			if (!strcmp(key, hw_keys[i].name))
				idx = i;
	}
	if (idx < 0)
		return moet_err(MOET_EFORMAT, "%s:%d: unknown key '%.64s' (name, cpu_read_gbps, "
				"gpu_read_gbps, pcie_gbps, pcie_latency_us, cpu_overhead_us, "
				"gpu_overhead_us, act_bytes)", label, hw_line(k), key);
	if (seen[idx])
		return moet_err(MOET_EFORMAT, "%s:%d: %s given twice (first on line %d)", label,
				hw_line(k), key, seen[idx]);
	seen[idx] = hw_line(k);
	if (idx == N_HW_KEYS) {
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
	int seen[N_HW_KEYS + 1] = { 0 };
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

/* ---- the model -------------------------------------------------------------------------- */

void moet_cost_touch(const double *s, int64_t n, int64_t top_k, int64_t batch, double *P)
{
	double tot = 0;
	for (int64_t i = 0; i < n; i++)
		tot += s[i];
	for (int64_t i = 0; i < n; i++) {
		if (!(tot > 0) || !(s[i] > 0)) {
			P[i] = 0;
			continue;
		}
		double p = s[i] * (double)top_k / tot;
		p = p < 1 ? p : 1;
		/* 1 - (1 - p)^B without losing small p to rounding. */
		P[i] = p >= 1 ? 1 : -expm1((double)batch * log1p(-p));
	}
}

/* One tier's time (ms): overhead when it works, plus its distinct experts' bytes read.
 * bytes / (GB/s x 1e9) s = bytes / (GB/s x 1e6) ms. */
static double tier_ms(const moet_cost_in *in, double d, double a, double gbps, double ovh_us)
{
	return a * ovh_us * 1e-3 + d * (double)in->expert_bytes / (gbps * 1e6);
}

static double gpus_ms(const moet_cost_in *in, const double *d_gpu, const double *a_gpu)
{
	double t_gpu = 0;
	for (int g = 0; g < in->n_gpus; g++) {
		double t = tier_ms(in, d_gpu[g], a_gpu[g], in->hw.gpu_read_gbps,
				   in->hw.gpu_overhead_us);
		t_gpu = t > t_gpu ? t : t_gpu;
	}
	return t_gpu;
}

double moet_cost_layer_ms(const moet_cost_in *in, double d_cpu, double a_cpu,
			  const double *d_gpu, const double *a_gpu)
{
	const moet_cost_hw *h = &in->hw;
	const double t_cpu = tier_ms(in, d_cpu, a_cpu, h->cpu_read_gbps, h->cpu_overhead_us);
	const double t_gpu = gpus_ms(in, d_gpu, a_gpu);
	double act = (double)in->batch * (double)in->d_model * h->act_bytes;
	double xfer = a_cpu * (2 * h->pcie_latency_us * 1e-3 + 2 * act / (h->pcie_gbps * 1e6));
	return (t_cpu > t_gpu ? t_cpu : t_gpu) + xfer;
}

int moet_cost_predict(const moet_cost_in *in, const double *scores, int64_t n_layers,
		      int64_t n_experts, const int16_t *owner, moet_cost_pred *out)
{
	const int n = in->n_gpus;
	if (in->batch < 1 || n < 1 || n > 64 || in->top_k < 1)
		return moet_err(MOET_EINVAL, "cost model: batch %" PRId64 ", %d GPUs, top-k %"
				PRId64, in->batch, n, in->top_k);
	for (int64_t i = 0; i < n_layers * n_experts; i++)
		if (owner[i] < -1 || owner[i] >= n)
			return moet_err(MOET_EINVAL, "cost model: layer %" PRId64 " expert %" PRId64
					": owner %d is not a GPU of %d nor the CPU",
					i / n_experts, i % n_experts, owner[i], n);
	double *P = malloc((size_t)(n_experts ? n_experts : 1) * sizeof(*P));
	if (!P)
		return moet_err(MOET_ENOMEM, "cost model");
	memset(out, 0, sizeof(*out));
	for (int64_t l = 0; l < n_layers; l++) {
		double d_gpu[64] = { 0 }, lq_gpu[64] = { 0 }, a_gpu[64];
		double d_cpu = 0, lq_cpu = 0;
		moet_cost_touch(scores + l * n_experts, n_experts, in->top_k, in->batch, P);
		for (int64_t e = 0; e < n_experts; e++) {
			const int g = owner[l * n_experts + e];
			const double q = P[e] < 1 ? log1p(-P[e]) : -INFINITY;
			if (g < 0) {
				d_cpu += P[e];
				lq_cpu += q;
			} else {
				d_gpu[g] += P[e];
				lq_gpu[g] += q;
			}
		}
		double any = d_cpu;
		for (int g = 0; g < n; g++)
			any += d_gpu[g];
		if (any == 0)
			continue; /* a dense layer or one without routings */
		const double a_cpu = -expm1(lq_cpu);
		for (int g = 0; g < n; g++) {
			a_gpu[g] = -expm1(lq_gpu[g]);
			out->gpu_distinct += d_gpu[g];
		}
		const double t = moet_cost_layer_ms(in, d_cpu, a_cpu, d_gpu, a_gpu);
		const double t_gpu = gpus_ms(in, d_gpu, a_gpu);
		const double t_cpu = tier_ms(in, d_cpu, a_cpu, in->hw.cpu_read_gbps,
					     in->hw.cpu_overhead_us);
		out->experts_ms += t;
		out->cpu_ms += t_cpu;
		out->gpu_ms += t_gpu;
		out->transfer_ms += t - (t_cpu > t_gpu ? t_cpu : t_gpu);
		out->cpu_distinct += d_cpu;
	}
	out->dense_ms = (double)in->dense_bytes / (in->hw.gpu_read_gbps * 1e6);
	out->step_ms = out->experts_ms + out->dense_ms;
	free(P);
	return 0;
}
