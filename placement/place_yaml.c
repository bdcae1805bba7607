/*
 * place_yaml.c: the placement file reader (libyaml's document API).
 *
 * The file is loaded into a libyaml node tree (each node keeps its start mark, so every fault
 * names its line), then walked in a fixed order: the top-level keys, gpus (names needed by
 * everything after), dense, default, layers. Grammar (docs/placement.md):
 *
 *   top:      {version: 1, gpus: [gpu...], dense: split|NAME, default: spec,
 *              layers: {ids: spec, ...}}          every key but gpus optional
 *   gpu:      {name: NAME, budget: SIZE, reserve: SIZE}
 *   spec:     {NAME: set, ...}                    GPUs not named hold nothing
 *   set:      ids | [ids, ids, ...] | []          ids: "3", "0-29", "0-29, 40, 50-52"
 *
 * A spec is resolved once into an owner row (one entry per expert, with the line that claimed
 * it, so that an expert owned twice names both lines), then copied to each layer of its key.
 * Listed layers replace the default; MoE layers neither listed nor covered by a default keep
 * all their experts on the CPU.
 *
 * NOTE: scalars are read as text whatever their YAML tag, so `gpu0: 5`, `gpu0: "5"` and
 * `gpu0: [5]` mean the same. The work is bounded by the table: a range is checked against
 * n_experts / n_layers before it is walked, and every (layer, expert) is claimed at most once
 * before an error stops the walk, so aliases cannot make it blow up.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "moet_err.h"
#include "place_int.h"

typedef struct rd {
	const char *label;
	yaml_document_t *doc;
	moet_placement *p;
	int16_t *row;          /* [n_experts]: owners of the spec being read */
	int *row_line;         /* [n_experts]: line that claimed each, 0 = none */
	int *layer_line;       /* [n_layers]: line of the key that listed the layer, 0 = none */
} rd;

static int line_of(const yaml_node_t *n)
{
	return (int)n->start_mark.line + 1;
}

/* "LABEL:LINE: message" with `code`. */
static int fail(const rd *r, const yaml_node_t *n, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(const rd *r, const yaml_node_t *n, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return moet_err(code, "%s:%d: %s", r->label, line_of(n), msg);
}

static const char *kind_name(const yaml_node_t *n)
{
	switch (n->type) {
	case YAML_SCALAR_NODE: return "a scalar";
	case YAML_SEQUENCE_NODE: return "a sequence";
	case YAML_MAPPING_NODE: return "a mapping";
	default: return "nothing";
	}
}

static yaml_node_t *node(const rd *r, int id)
{
	return yaml_document_get_node(r->doc, id);
}

/* A scalar's text as a NUL-terminated string of at most n-1 bytes, or an EFORMAT error. */
static int scalar(const rd *r, const yaml_node_t *n, const char *what, char *buf, size_t cap)
{
	if (n->type != YAML_SCALAR_NODE)
		return fail(r, n, MOET_EFORMAT, "%s: expected a scalar, found %s", what,
			    kind_name(n));
	size_t len = n->data.scalar.length;
	if (len >= cap || memchr(n->data.scalar.value, 0, len))
		return fail(r, n, MOET_EFORMAT, "%s: value too long or holds a NUL byte", what);
	memcpy(buf, n->data.scalar.value, len);
	buf[len] = 0;
	return 0;
}

/* The GPU called `name`, or -1. */
static int gpu_index(const moet_placement *p, const char *name)
{
	for (int g = 0; g < p->n_gpus; g++)
		if (!strcmp(p->gpus[g].name, name))
			return g;
	return -1;
}

/* ---- id lists: "3", "0-29", "0-29, 40" ------------------------------------------------------ */

typedef struct idl {
	const char *s, *end;
} idl;

static void skip_ws(idl *c)
{
	while (c->s < c->end && (*c->s == ' ' || *c->s == '\t'))
		c->s++;
}

/* An unsigned decimal; values past 10^15 saturate (they are out of range anyway). */
static int take_num(idl *c, int64_t *v)
{
	int n = 0;
	*v = 0;
	skip_ws(c);
	while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
		if (*v < 1000000000000000)
			*v = *v * 10 + (*c->s - '0');
		c->s++;
		n++;
	}
	skip_ws(c);
	return n ? 0 : -1;
}

/* The next item of the list into [lo, hi]: 1, or 0 at the end, or -1 if malformed. */
static int next_range(idl *c, int64_t *lo, int64_t *hi)
{
	skip_ws(c);
	if (c->s >= c->end)
		return 0;
	if (take_num(c, lo))
		return -1;
	*hi = *lo;
	if (c->s < c->end && *c->s == '-') {
		c->s++;
		if (take_num(c, hi))
			return -1;
	}
	if (c->s < c->end) {
		if (*c->s != ',')
			return -1;
		c->s++;
		skip_ws(c);
		if (c->s >= c->end)
			return -1; /* trailing comma */
	}
	return 1;
}

/*
 * Calls fn(r, n, ctx, lo, hi) for each item of the id list in scalar `n` (`what` names it in
 * errors); items are checked to lie in [0, limit) (`noun` names an id, `limit_txt` the bound).
 */
typedef int (*range_fn)(rd *r, const yaml_node_t *n, void *ctx, int64_t lo, int64_t hi);

static int each_range(rd *r, const yaml_node_t *n, const char *what, const char *noun,
		      int64_t limit, const char *limit_txt, range_fn fn, void *ctx)
{
	if (n->type != YAML_SCALAR_NODE)
		return fail(r, n, MOET_EFORMAT, "%s: expected %s ids or ranges (\"0-29, 40\"), "
			    "found %s", what, noun, kind_name(n));
	const char *v = (const char *)n->data.scalar.value;
	size_t len = n->data.scalar.length;
	if (len == 0 && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
		return fail(r, n, MOET_EFORMAT, "%s: no value (write [] for none)", what);
	idl c = { v, v + len };
	int64_t lo, hi;
	int k, rc;
	while ((k = next_range(&c, &lo, &hi)) == 1) {
		if (hi < lo)
			return fail(r, n, MOET_EFORMAT, "%s: range %" PRId64 "-%" PRId64 " is "
				    "reversed", what, lo, hi);
		if (hi >= 1000000000000000)
			return fail(r, n, MOET_ERANGE, "%s: %s id of 16 or more digits out of "
				    "range (%s)", what, noun, limit_txt);
		if (hi >= limit)
			return fail(r, n, MOET_ERANGE, "%s: %s %" PRId64 " out of range (%s)", what,
				    noun, hi, limit_txt);
		if ((rc = fn(r, n, ctx, lo, hi)))
			return rc;
	}
	if (k < 0)
		return fail(r, n, MOET_EFORMAT, "%s: '%.*s' is not a list of %s ids and ranges "
			    "(\"0-29, 40\")", what, len > 80 ? 80 : (int)len, v, noun);
	return 0;
}

/* ---- specs: {NAME: set, ...} --------------------------------------------------------------- */

typedef struct claim {
	int g;
	const char *what;
} claim;

static int claim_range(rd *r, const yaml_node_t *n, void *ctx, int64_t lo, int64_t hi)
{
	const claim *c = ctx;
	for (int64_t e = lo; e <= hi; e++) {
		if (r->row_line[e])
			return fail(r, n, MOET_EINVAL, "%s: expert %" PRId64 " owned twice: by %s "
				    "(line %d) and by %s (line %d)", c->what, e,
				    r->p->gpus[r->row[e]].name, r->row_line[e],
				    r->p->gpus[c->g].name, line_of(n));
		r->row[e] = (int16_t)c->g;
		r->row_line[e] = line_of(n);
	}
	return 0;
}

/* Resolves spec `n` into r->row; `where` names it ("default", "layers 3-10"). */
static int read_spec(rd *r, const yaml_node_t *n, const char *where)
{
	const moet_placement *p = r->p;
	char what[160], lim[64], name[64];
	for (int64_t e = 0; e < p->n_experts; e++) {
		r->row[e] = MOET_PLACEMENT_CPU;
		r->row_line[e] = 0;
	}
	if (n->type != YAML_MAPPING_NODE)
		return fail(r, n, MOET_EFORMAT, "%s: expected a mapping of GPU names to experts "
			    "({gpu0: \"0-29\"}), found %s", where, kind_name(n));
	snprintf(lim, sizeof(lim), "n_routed_experts %" PRId64 ": ids 0-%" PRId64, p->n_experts,
		 p->n_experts - 1);
	int seen[MOET_PLACEMENT_MAX_GPUS] = { 0 };
	for (yaml_node_pair_t *kv = n->data.mapping.pairs.start; kv < n->data.mapping.pairs.top;
	     kv++) {
		yaml_node_t *k = node(r, kv->key), *v = node(r, kv->value);
		int rc = scalar(r, k, where, name, sizeof(name));
		if (rc)
			return rc;
		int g = gpu_index(p, name);
		if (g < 0)
			return fail(r, k, MOET_EINVAL, "%s: unknown GPU '%s' (not in gpus:)", where,
				    name);
		if (seen[g])
			return fail(r, k, MOET_EFORMAT, "%s: GPU %s given twice (lines %d and %d)",
				    where, name, seen[g], line_of(k));
		seen[g] = line_of(k);
		snprintf(what, sizeof(what), "%s, %s", where, name);
		claim c = { g, what };
		if (v->type == YAML_SEQUENCE_NODE) {
			for (yaml_node_item_t *it = v->data.sequence.items.start;
			     it < v->data.sequence.items.top; it++)
				if ((rc = each_range(r, node(r, *it), what, "expert", p->n_experts,
						     lim, claim_range, &c)))
					return rc;
		} else if ((rc = each_range(r, v, what, "expert", p->n_experts, lim, claim_range,
					    &c))) {
			return rc;
		}
	}
	return 0;
}

/* ---- layers ------------------------------------------------------------------------------ */

typedef struct layer_key {
	const char *key;      /* the key's text */
	bool apply;           /* false: check and mark; true: copy r->row into the layers */
} layer_key;

static int layer_range(rd *r, const yaml_node_t *n, void *ctx, int64_t lo, int64_t hi)
{
	const layer_key *lk = ctx;
	moet_placement *p = r->p;
	for (int64_t l = lo; l <= hi; l++) {
		if (lk->apply) {
			memcpy(p->owner + l * p->n_experts, r->row,
			       (size_t)p->n_experts * sizeof(int16_t));
			continue;
		}
		if (!p->is_moe[l])
			return fail(r, n, MOET_EINVAL, "layers %s: layer %" PRId64 " is not a MoE "
				    "layer (a dense layer has no routed experts)", lk->key, l);
		if (r->layer_line[l])
			return fail(r, n, MOET_EINVAL, "layers %s: layer %" PRId64 " given twice "
				    "(lines %d and %d)", lk->key, l, r->layer_line[l], line_of(n));
		r->layer_line[l] = line_of(n);
	}
	return 0;
}

static int read_layers(rd *r, const yaml_node_t *n)
{
	char lim[64], where[160];
	if (n->type != YAML_MAPPING_NODE)
		return fail(r, n, MOET_EFORMAT, "layers: expected a mapping of layers to specs "
			    "(3-10: {gpu0: \"0-29\"}), found %s", kind_name(n));
	snprintf(lim, sizeof(lim), "num_hidden_layers %" PRId64 ": layers 0-%" PRId64,
		 r->p->n_layers, r->p->n_layers - 1);
	for (yaml_node_pair_t *kv = n->data.mapping.pairs.start; kv < n->data.mapping.pairs.top;
	     kv++) {
		yaml_node_t *k = node(r, kv->key), *v = node(r, kv->value);
		char key[96];
		int rc = scalar(r, k, "layers: key", key, sizeof(key));
		if (rc)
			return rc;
		layer_key lk = { key, false };
		snprintf(where, sizeof(where), "layers %s", key);
		if ((rc = each_range(r, k, "layers", "layer", r->p->n_layers, lim, layer_range,
				     &lk)))
			return rc;
		if ((rc = read_spec(r, v, where)))
			return rc;
		lk.apply = true;
		if ((rc = each_range(r, k, "layers", "layer", r->p->n_layers, lim, layer_range,
				     &lk)))
			return rc;
	}
	return 0;
}

/* ---- gpus ---------------------------------------------------------------------------------- */

static int read_size(rd *r, const yaml_node_t *n, const char *gpu, const char *key,
		     uint64_t *out)
{
	char buf[64], what[96];
	snprintf(what, sizeof(what), "gpu %s: %s", gpu, key);
	int rc = scalar(r, n, what, buf, sizeof(buf));
	if (rc)
		return rc;
	if ((rc = moet_placement_parse_bytes(buf, out)))
		return moet_err_prefix(rc, "%s:%d: %s", r->label, line_of(n), what);
	return 0;
}

static int read_gpu(rd *r, const yaml_node_t *n, moet_placement_gpu *G, int index)
{
	const yaml_node_t *name = NULL, *budget = NULL, *reserve = NULL;
	if (n->type != YAML_MAPPING_NODE)
		return fail(r, n, MOET_EFORMAT, "gpus: entry %d: expected a mapping ({name: gpu0, "
			    "budget: 32GB}), found %s", index, kind_name(n));
	G->line = line_of(n);
	for (yaml_node_pair_t *kv = n->data.mapping.pairs.start; kv < n->data.mapping.pairs.top;
	     kv++) {
		yaml_node_t *k = node(r, kv->key), *v = node(r, kv->value);
		char key[32];
		int rc = scalar(r, k, "gpus: key", key, sizeof(key));
		if (rc)
			return rc;
		const yaml_node_t **slot = !strcmp(key, "name") ? &name :
					   !strcmp(key, "budget") ? &budget :
					   !strcmp(key, "reserve") ? &reserve : NULL;
		if (!slot)
			return fail(r, k, MOET_EFORMAT, "gpus: entry %d: unknown key '%s' (name, "
				    "budget, reserve)", index, key);
		if (*slot)
			return fail(r, k, MOET_EFORMAT, "gpus: entry %d: key %s given twice",
				    index, key);
		*slot = v;
	}
	if (!name || !budget)
		return fail(r, n, MOET_EFORMAT, "gpus: entry %d: %s is required", index,
			    name ? "budget" : "name");
	int rc = scalar(r, name, "gpus: name", G->name, sizeof(G->name));
	if (rc)
		return rc;
	if (place_name_ok(G->name))
		return fail(r, name, MOET_EFORMAT, "gpus: name '%s' is not a GPU name (letters, "
			    "digits, _ . -, starting with a letter or _; not \"cpu\")", G->name);
	for (int g = 0; g < index; g++)
		if (!strcmp(r->p->gpus[g].name, G->name))
			return fail(r, name, MOET_EINVAL, "gpus: name %s given twice (lines %d and "
				    "%d)", G->name, r->p->gpus[g].line, G->line);
	if ((rc = read_size(r, budget, G->name, "budget", &G->budget_bytes)))
		return rc;
	if (!G->budget_bytes)
		return fail(r, budget, MOET_ERANGE, "gpu %s: budget 0", G->name);
	if (reserve && (rc = read_size(r, reserve, G->name, "reserve", &G->reserve_bytes)))
		return rc;
	return 0;
}

static int read_gpus(rd *r, const yaml_node_t *n)
{
	if (n->type != YAML_SEQUENCE_NODE)
		return fail(r, n, MOET_EFORMAT, "gpus: expected a sequence of GPUs, found %s",
			    kind_name(n));
	int count = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
	if (count > MOET_PLACEMENT_MAX_GPUS)
		return fail(r, n, MOET_ERANGE, "gpus: %d GPUs (at most %d)", count,
			    MOET_PLACEMENT_MAX_GPUS);
	if (count) {
		r->p->gpus = calloc((size_t)count, sizeof(*r->p->gpus));
		if (!r->p->gpus)
			return moet_err(MOET_ENOMEM, "out of memory");
	}
	for (int g = 0; g < count; g++) {
		int rc = read_gpu(r, node(r, n->data.sequence.items.start[g]), &r->p->gpus[g], g);
		if (rc)
			return rc;
		r->p->n_gpus = g + 1;
	}
	return 0;
}

/* ---- the document --------------------------------------------------------------------------- */

enum { K_VERSION, K_GPUS, K_DENSE, K_DEFAULT, K_LAYERS, K_COUNT };
static const char *const top_keys[K_COUNT] = { "version", "gpus", "dense", "default",
					       "layers" };

static int read_doc(rd *r, const yaml_node_t *root)
{
	const yaml_node_t *val[K_COUNT] = { NULL }, *key[K_COUNT] = { NULL };
	moet_placement *p = r->p;
	char buf[64];
	int rc;
	if (root->type != YAML_MAPPING_NODE)
		return fail(r, root, MOET_EFORMAT, "expected a mapping with gpus: at the top, found"
			    " %s", kind_name(root));
	for (yaml_node_pair_t *kv = root->data.mapping.pairs.start;
	     kv < root->data.mapping.pairs.top; kv++) {
		yaml_node_t *k = node(r, kv->key);
		if ((rc = scalar(r, k, "top-level key", buf, sizeof(buf))))
			return rc;
		int i = 0;
		while (i < K_COUNT && strcmp(buf, top_keys[i]))
			i++;
		if (i == K_COUNT)
			return fail(r, k, MOET_EFORMAT, "unknown key '%s' (version, gpus, dense, "
				    "default, layers)", buf);
		if (key[i])
			return fail(r, k, MOET_EFORMAT, "key %s given twice (lines %d and %d)", buf,
				    line_of(key[i]), line_of(k));
		key[i] = k;
		val[i] = node(r, kv->value);
	}
	if (val[K_VERSION]) {
		if ((rc = scalar(r, val[K_VERSION], "version", buf, sizeof(buf))))
			return rc;
		if (strcmp(buf, "1"))
			return fail(r, val[K_VERSION], MOET_EFORMAT, "version %s: this reader "
				    "knows version 1", buf);
	}
	if (!val[K_GPUS])
		return fail(r, root, MOET_EFORMAT, "gpus: is required (a list of GPUs; [] for "
			    "none)");
	if ((rc = read_gpus(r, val[K_GPUS])))
		return rc;
	if (val[K_DENSE]) {
		const yaml_node_t *d = val[K_DENSE];
		if ((rc = scalar(r, d, "dense", buf, sizeof(buf))))
			return rc;
		p->dense_line = line_of(d);
		if (strcmp(buf, "split")) {
			p->dense_gpu = gpu_index(p, buf);
			if (p->dense_gpu < 0)
				return fail(r, d, MOET_EINVAL, "dense: unknown GPU '%s' (split or "
					    "a name from gpus:)", buf);
		}
	}
	int16_t *dflt = NULL;
	if (val[K_DEFAULT]) {
		if ((rc = read_spec(r, val[K_DEFAULT], "default")))
			return rc;
		dflt = malloc((size_t)(p->n_experts ? p->n_experts : 1) * sizeof(int16_t));
		if (!dflt)
			return moet_err(MOET_ENOMEM, "out of memory");
		memcpy(dflt, r->row, (size_t)p->n_experts * sizeof(int16_t));
	}
	if (val[K_LAYERS] && (rc = read_layers(r, val[K_LAYERS]))) {
		free(dflt);
		return rc;
	}
	for (int64_t l = 0; dflt && l < p->n_layers; l++)
		if (p->is_moe[l] && !r->layer_line[l])
			memcpy(p->owner + l * p->n_experts, dflt,
			       (size_t)p->n_experts * sizeof(int16_t));
	free(dflt);
	return 0;
}

/* A libyaml parser error as one line. */
static int yaml_fail(const char *label, const yaml_parser_t *ps)
{
	const char *problem = ps->problem ? ps->problem : "unknown error";
	if (ps->error == YAML_READER_ERROR)
		return moet_err(MOET_EFORMAT, "%s: malformed YAML: %s at byte %zu", label, problem,
				ps->problem_offset);
	if (ps->context)
		return moet_err(MOET_EFORMAT, "%s:%zu: malformed YAML: %s (%s at line %zu)", label,
				ps->problem_mark.line + 1, problem, ps->context,
				ps->context_mark.line + 1);
	return moet_err(MOET_EFORMAT, "%s:%zu: malformed YAML: %s", label,
			ps->problem_mark.line + 1, problem);
}

int moet_placement_parse(const char *label, const char *text, size_t n_bytes,
			 const moet_config *cf, const moet_placement_sizes *sz,
			 moet_placement **out)
{
	yaml_parser_t ps;
	yaml_document_t doc, extra;
	bool have_parser = false, have_doc = false;
	rd r = { .label = label, .doc = &doc };
	moet_placement *p = NULL;
	int rc;
	*out = NULL;
	if ((rc = place_alloc(label, cf, &p)))
		return rc;
	r.p = p;
	r.row = malloc((size_t)(p->n_experts ? p->n_experts : 1) * sizeof(int16_t));
	r.row_line = calloc((size_t)(p->n_experts ? p->n_experts : 1), sizeof(int));
	r.layer_line = calloc((size_t)p->n_layers, sizeof(int));
	if (!r.row || !r.row_line || !r.layer_line || !yaml_parser_initialize(&ps)) {
		rc = moet_err(MOET_ENOMEM, "out of memory");
		goto fail;
	}
	have_parser = true;
	yaml_parser_set_input_string(&ps, (const unsigned char *)text, n_bytes);
	if (!yaml_parser_load(&ps, &doc)) {
		rc = yaml_fail(label, &ps);
		goto fail;
	}
	have_doc = true;
	yaml_node_t *root = yaml_document_get_root_node(&doc);
	if (!root) {
		rc = moet_err(MOET_EFORMAT, "%s: empty placement (expected a mapping with gpus:)",
			      label);
		goto fail;
	}
	if (!yaml_parser_load(&ps, &extra)) {
		rc = yaml_fail(label, &ps);
		goto fail;
	}
	yaml_node_t *second = yaml_document_get_root_node(&extra);
	int second_line = second ? line_of(second) : 0;
	yaml_document_delete(&extra);
	if (second) {
		rc = moet_err(MOET_EFORMAT, "%s:%d: a second YAML document (a placement is one)",
			      label, second_line);
		goto fail;
	}
	if ((rc = read_doc(&r, root)))
		goto fail;
	if (sz && (rc = moet_placement_check(p, sz)))
		goto fail;
	*out = p;
	p = NULL;
fail:
	if (have_doc)
		yaml_document_delete(&doc);
	if (have_parser)
		yaml_parser_delete(&ps);
	free(r.row);
	free(r.row_line);
	free(r.layer_line);
	moet_placement_free(p);
	return rc;
}

int moet_placement_load(const char *path, const moet_config *cf, const moet_placement_sizes *sz,
			moet_placement **out)
{
	*out = NULL;
	FILE *f = fopen(path, "rb");
	if (!f)
		return moet_err(MOET_EIO, "%s: cannot open the placement file", path);
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	int rc = 0;
	while (buf) {
		size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (len < cap)
			break;
		if (cap >= MOET_PLACEMENT_MAX_FILE_BYTES) {
			rc = moet_err(MOET_EIO, "%s: larger than %u bytes", path,
				      MOET_PLACEMENT_MAX_FILE_BYTES);
			break;
		}
		char *nb = realloc(buf, cap * 2);
		if (!nb) {
			free(buf);
			buf = NULL;
			break;
		}
		buf = nb;
		cap *= 2;
	}
	if (!rc && !buf)
		rc = moet_err(MOET_ENOMEM, "out of memory");
	if (!rc && ferror(f))
		rc = moet_err(MOET_EIO, "%s: read error", path);
	fclose(f);
	if (!rc)
		rc = moet_placement_parse(path, buf, len, cf, sz, out);
	free(buf);
	return rc;
}
