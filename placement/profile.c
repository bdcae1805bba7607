/*
 * profile.c: routing profiles (moet_profile.h): counting, merging, the JSON file, and the
 * generator's truth read from generator.json.
 *
 * The tables are dense [phase][layer][expert] arrays over all layers, dense ones included, so
 * that a routing event indexes them with the layer number it carries; the file lists only the
 * MoE layers. The writer prints one layer per line group (people read these files); the
 * reader is jansson with duplicate keys rejected, and checks every field before it is used.
 *
 * NOTE: weights are written with %.17g, so a file read back gives the same doubles bit for
 * bit and merging files gives the same sums as merging the profiles in memory.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_json.h"
#include "moet_profile.h"

#define MAX_LAYERS 4096
#define MAX_EXPERTS 65536
#define MAX_CELLS ((int64_t)1 << 26)
#define FORMAT_NAME "moet-hybrid profile"

static const char *const phase_key[MOET_PROFILE_PHASES] = { "prefill", "decode" };

static int alloc_profile(int64_t L, int64_t E, int64_t k, moet_profile **out)
{
	moet_profile *p = calloc(1, sizeof(*p));
	const size_t cells = (size_t)(MOET_PROFILE_PHASES * L * E);
	if (!p)
		return moet_err(MOET_ENOMEM, "profile");
	p->n_layers = L;
	p->n_experts = E;
	p->top_k = k;
	p->is_moe = calloc((size_t)L, 1);
	p->counts = calloc(cells, sizeof(*p->counts));
	p->weighted = calloc(cells, sizeof(*p->weighted));
	if (!p->is_moe || !p->counts || !p->weighted) {
		moet_profile_free(p);
		return moet_err(MOET_ENOMEM, "profile tables (%zu entries)", cells);
	}
	*out = p;
	return 0;
}

int moet_profile_create(const moet_config *cf, moet_profile **out)
{
	const int64_t L = cf->num_hidden_layers, E = cf->n_routed_experts;
	if (E <= 0 || L <= 0 || L > MAX_LAYERS || E > MAX_EXPERTS || L * E > MAX_CELLS ||
	    cf->num_experts_per_tok <= 0 || cf->num_experts_per_tok > E)
		return moet_err(MOET_EINVAL,
				"profile: the model has no routed experts in range "
				"(layers %" PRId64 ", experts %" PRId64 ", top-k %" PRId64 ")",
				L, E, cf->num_experts_per_tok);
	int rc = alloc_profile(L, E, cf->num_experts_per_tok, out);
	for (int64_t l = 0; !rc && l < L; l++)
		(*out)->is_moe[l] = moet_config_is_moe_layer(cf, l);
	return rc;
}

void moet_profile_free(moet_profile *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->n_runs; i++)
		free(p->runs[i]);
	free(p->runs);
	free(p->is_moe);
	free(p->counts);
	free(p->weighted);
	free(p);
}

int moet_profile_record(moet_profile *p, int phase, int64_t layer, const int32_t *ids,
			const float *weights, int k)
{
	if (phase < 0 || phase >= MOET_PROFILE_PHASES || layer < 0 || layer >= p->n_layers ||
	    !p->is_moe[layer] || k < 0 || k > p->n_experts)
		return moet_err(MOET_ERANGE, "profile: routing of phase %d, layer %" PRId64
				", top-k %d out of range", phase, layer, k);
	for (int i = 0; i < k; i++)
		if (ids[i] < 0 || ids[i] >= p->n_experts)
			return moet_err(MOET_ERANGE, "profile: layer %" PRId64 ": expert id %d out "
					"of range", layer, (int)ids[i]);
	const int64_t at = moet_profile_at(p, phase, layer);
	for (int i = 0; i < k; i++) {
		p->counts[at + ids[i]]++;
		p->weighted[at + ids[i]] += weights ? (double)weights[i] : 0.0;
	}
	return 0;
}

int moet_profile_add_run(moet_profile *p, const char *line)
{
	char **r = realloc(p->runs, (size_t)(p->n_runs + 1) * sizeof(*r));
	if (!r)
		return moet_err(MOET_ENOMEM, "profile runs");
	p->runs = r;
	if (!(r[p->n_runs] = strdup(line)))
		return moet_err(MOET_ENOMEM, "profile runs");
	p->n_runs++;
	return 0;
}

int moet_profile_merge(moet_profile *dst, const moet_profile *src, const char *src_label)
{
	if (dst->n_layers != src->n_layers || dst->n_experts != src->n_experts ||
	    dst->top_k != src->top_k || memcmp(dst->is_moe, src->is_moe, (size_t)dst->n_layers))
		return moet_err(MOET_EINVAL, "%s: another geometry (%" PRId64 " layers, %" PRId64
				" experts, top-k %" PRId64 ") than %" PRId64 " / %" PRId64 " / %"
				PRId64 ", or other MoE layers", src_label, src->n_layers,
				src->n_experts, src->top_k, dst->n_layers, dst->n_experts,
				dst->top_k);
	char **r = realloc(dst->runs, (size_t)(dst->n_runs + src->n_runs + 1) * sizeof(*r));
	if (!r)
		return moet_err(MOET_ENOMEM, "profile runs");
	dst->runs = r;
	int n = dst->n_runs;
	for (int i = 0; i < src->n_runs; i++, n++)
		if (!(r[n] = strdup(src->runs[i]))) {
			while (n > dst->n_runs)
				free(r[--n]);
			return moet_err(MOET_ENOMEM, "profile runs");
		}
	dst->n_runs = n;
	const int64_t cells = MOET_PROFILE_PHASES * dst->n_layers * dst->n_experts;
	for (int64_t i = 0; i < cells; i++) {
		dst->counts[i] += src->counts[i];
		dst->weighted[i] += src->weighted[i];
	}
	dst->n_prompts += src->n_prompts;
	for (int ph = 0; ph < MOET_PROFILE_PHASES; ph++)
		dst->n_tokens[ph] += src->n_tokens[ph];
	return 0;
}

int moet_profile_check(const moet_profile *p, const moet_config *cf, const char *label)
{
	if (p->n_layers != cf->num_hidden_layers)
		return moet_err(MOET_EINVAL, "%s: num_hidden_layers %" PRId64 " but the model has %"
				PRId64, label, p->n_layers, cf->num_hidden_layers);
	if (p->n_experts != cf->n_routed_experts)
		return moet_err(MOET_EINVAL, "%s: n_routed_experts %" PRId64 " but the model has %"
				PRId64, label, p->n_experts, cf->n_routed_experts);
	if (p->top_k != cf->num_experts_per_tok)
		return moet_err(MOET_EINVAL,
				"%s: num_experts_per_tok %" PRId64 " but the model has %" PRId64,
				label, p->top_k, cf->num_experts_per_tok);
	for (int64_t l = 0; l < p->n_layers; l++)
		if (!!p->is_moe[l] != moet_config_is_moe_layer(cf, l))
			return moet_err(MOET_EINVAL,
					"%s: layers: layer %" PRId64 " is %s in the "
					"profile but %s in the model",
					label, l, p->is_moe[l] ? "MoE" : "missing",
					p->is_moe[l] ? "dense" : "MoE");
	return 0;
}

/* ---- writing ---------------------------------------------------------------------------- */

static void put_string(FILE *f, const char *s)
{
	json_t *j = json_string(s);
	char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
	fputs(t ? t : "\"\"", f);
	free(t);
	json_decref(j);
}

int moet_profile_to_json(const moet_profile *p, char **out_text)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return moet_err(MOET_ENOMEM, "profile text");
	fprintf(f, "{\"format\": \"%s\", \"format_version\": 1,\n"
		   " \"num_hidden_layers\": %" PRId64 ", \"n_routed_experts\": %" PRId64
		   ", \"num_experts_per_tok\": %" PRId64 ",\n"
		   " \"prompts\": %" PRIu64 ", \"tokens\": {\"prefill\": %" PRIu64 ", \"decode\": %"
		   PRIu64 "},\n \"runs\": [", FORMAT_NAME, p->n_layers, p->n_experts, p->top_k,
		p->n_prompts, p->n_tokens[0], p->n_tokens[1]);
	for (int i = 0; i < p->n_runs; i++) {
		fputs(i ? ",\n  " : "\n  ", f);
		put_string(f, p->runs[i]);
	}
	fputs("],\n \"layers\": [", f);
	int first = 1;
	for (int64_t l = 0; l < p->n_layers; l++) {
		if (!p->is_moe[l])
			continue;
		fprintf(f, "%s\n  {\"layer\": %" PRId64, first ? "" : ",", l);
		first = 0;
		for (int ph = 0; ph < MOET_PROFILE_PHASES; ph++) {
			const int64_t at = moet_profile_at(p, ph, l);
			fprintf(f, ",\n   \"%s\": {\"counts\": [", phase_key[ph]);
			for (int64_t e = 0; e < p->n_experts; e++)
				fprintf(f, "%s%" PRIu64, e ? ", " : "", p->counts[at + e]);
			fputs("],\n     \"weighted\": [", f);
			for (int64_t e = 0; e < p->n_experts; e++)
				fprintf(f, "%s%.17g", e ? ", " : "", p->weighted[at + e]);
			fputs("]}", f);
		}
		fputc('}', f);
	}
	fputs("]}\n", f);
	if (fclose(f) || !buf) {
		free(buf);
		return moet_err(MOET_ENOMEM, "profile text");
	}
	*out_text = buf;
	return 0;
}

int moet_profile_save(const moet_profile *p, const char *path)
{
	char *text = NULL;
	int rc = moet_profile_to_json(p, &text);
	if (rc)
		return rc;
	FILE *f = fopen(path, "w");
	size_t n = strlen(text);
	int bad = !f || fwrite(text, 1, n, f) != n;
	int e = errno;
	if (f && fclose(f) && !bad) { /* closed once, whatever happened before */
		bad = 1;
		e = errno;
	}
	if (bad) {
		free(text);
		return moet_err(MOET_EIO, "%s: cannot write: %s", path, strerror(e));
	}
	free(text);
	return 0;
}

/* ---- reading ---------------------------------------------------------------------------- */

/* An integer field in [lo, hi]. */
static int get_int(const char *label, json_t *obj, const char *key, const char *where,
		   int64_t lo, int64_t hi, int64_t *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v)
		return moet_err(MOET_EFORMAT, "%s: %s%s is missing", label, where, key);
	if (!json_is_integer(v))
		return moet_err(MOET_EFORMAT, "%s: %s%s: must be an integer, not %s", label, where,
				key, moet_json_kind(v));
	json_int_t x = json_integer_value(v);
	if (x < lo || x > hi)
		return moet_err(MOET_EFORMAT, "%s: %s%s: %lld out of range [%" PRId64 ", %" PRId64
				"]", label, where, key, (long long)x, lo, hi);
	*out = x;
	return 0;
}

static int read_phase(const char *label, json_t *ph, const char *where, moet_profile *p,
		      int64_t at)
{
	static const char *const keys[2] = { "counts", "weighted" };
	if (!json_is_object(ph))
		return moet_err(MOET_EFORMAT, "%s: %s: must be an object, not %s", label, where,
				moet_json_kind(ph));
	const char *key;
	json_t *v;
	json_object_foreach(ph, key,
			    v) if (strcmp(key, keys[0]) &&
				   strcmp(key, keys[1])) return moet_err(MOET_EFORMAT,
									 "%s: %s: unknown key '%s'",
									 label, where, key);
	for (int w = 0; w < 2; w++) {
		json_t *a = json_object_get(ph, keys[w]);
		if (!a)
			return moet_err(MOET_EFORMAT, "%s: %s.%s is missing", label, where,
					keys[w]);
		if (!json_is_array(a) || (int64_t)json_array_size(a) != p->n_experts)
			return moet_err(MOET_EFORMAT, "%s: %s.%s: must be an array of %" PRId64
					" numbers (n_routed_experts), not %s of %zu", label, where,
					keys[w], p->n_experts, moet_json_kind(a),
					json_is_array(a) ? json_array_size(a) : (size_t)0);
		for (int64_t e = 0; e < p->n_experts; e++) {
			json_t *x = json_array_get(a, (size_t)e);
			if (w == 0 && (!json_is_integer(x) || json_integer_value(x) < 0))
				return moet_err(MOET_EFORMAT,
						"%s: %s.counts[%" PRId64 "]: must be "
						"a non-negative integer, not %s",
						label, where, e,
						json_is_integer(x) ? "negative"
								   : moet_json_kind(x));
			if (w == 0) {
				p->counts[at + e] = (uint64_t)json_integer_value(x);
				continue;
			}
			double d = json_is_number(x) ? json_number_value(x) : -1.0;
			if (!(d >= 0) || !isfinite(d))
				return moet_err(MOET_EFORMAT,
						"%s: %s.weighted[%" PRId64 "]: must be a "
						"finite non-negative number, not %s",
						label, where, e,
						json_is_number(x) ? "negative" : moet_json_kind(x));
			p->weighted[at + e] = d;
		}
	}
	return 0;
}

static int read_layers(const char *label, json_t *root, moet_profile *p)
{
	json_t *layers = json_object_get(root, "layers");
	if (!layers)
		return moet_err(MOET_EFORMAT, "%s: layers is missing", label);
	if (!json_is_array(layers))
		return moet_err(MOET_EFORMAT, "%s: layers: must be an array, not %s", label,
				moet_json_kind(layers));
	size_t i;
	json_t *ly;
	json_array_foreach(layers, i, ly) {
		char where[64];
		int64_t l;
		snprintf(where, sizeof(where), "layers[%zu].", i);
		if (!json_is_object(ly))
			return moet_err(MOET_EFORMAT, "%s: layers[%zu]: must be an object, not %s",
					label, i, moet_json_kind(ly));
		int rc = get_int(label, ly, "layer", where, 0, p->n_layers - 1, &l);
		if (rc)
			return rc;
		if (p->is_moe[l])
			return moet_err(MOET_EFORMAT, "%s: layers[%zu].layer: layer %" PRId64
					" given twice", label, i, l);
		p->is_moe[l] = 1;
		const char *key;
		json_t *v;
		json_object_foreach(ly, key, v)
			if (strcmp(key, "layer") && strcmp(key, "prefill") && strcmp(key, "decode"))
				return moet_err(MOET_EFORMAT, "%s: layers[%zu]: unknown key '%s'",
						label, i, key);
		for (int ph = 0; ph < MOET_PROFILE_PHASES; ph++) {
			json_t *o = json_object_get(ly, phase_key[ph]);
			snprintf(where, sizeof(where), "layers[%zu].%s", i, phase_key[ph]);
			if (!o)
				return moet_err(MOET_EFORMAT, "%s: %s is missing", label, where);
			if ((rc = read_phase(label, o, where, p, moet_profile_at(p, ph, l))))
				return rc;
		}
	}
	return 0;
}

static int read_meta(const char *label, json_t *root, moet_profile *p)
{
	int64_t x;
	int rc = get_int(label, root, "prompts", "", 0, INT64_MAX, &x);
	if (rc)
		return rc;
	p->n_prompts = (uint64_t)x;
	json_t *tok = json_object_get(root, "tokens");
	if (!json_is_object(tok))
		return moet_err(MOET_EFORMAT,
				"%s: tokens: must be an object {\"prefill\": N, "
				"\"decode\": N}, not %s",
				label, tok ? moet_json_kind(tok) : "missing");
	for (int ph = 0; ph < MOET_PROFILE_PHASES; ph++) {
		if ((rc = get_int(label, tok, phase_key[ph], "tokens.", 0, INT64_MAX, &x)))
			return rc;
		p->n_tokens[ph] = (uint64_t)x;
	}
	json_t *runs = json_object_get(root, "runs");
	if (runs && !json_is_array(runs))
		return moet_err(MOET_EFORMAT, "%s: runs: must be an array of strings, not %s",
				label, moet_json_kind(runs));
	size_t i;
	json_t *r;
	json_array_foreach(runs, i, r) {
		if (!json_is_string(r))
			return moet_err(MOET_EFORMAT, "%s: runs[%zu]: must be a string, not %s",
					label, i, moet_json_kind(r));
		if ((rc = moet_profile_add_run(p, json_string_value(r))))
			return rc;
	}
	return 0;
}

int moet_profile_parse(const char *label, const char *text, size_t n_bytes, moet_profile **out)
{
	json_error_t je;
	json_t *root = json_loadb(text, n_bytes, JSON_REJECT_DUPLICATES, &je);
	moet_profile *p = NULL;
	int64_t L, E, K, ver;
	int rc;
	if (!root)
		return moet_err(MOET_EFORMAT, "%s:%d:%d: malformed JSON: %s", label, je.line,
				je.column, je.text);
	json_t *fmt = json_object_get(root, "format");
	if (!json_is_object(root)) {
		rc = moet_err(MOET_EFORMAT, "%s: must be a JSON object, not %s", label,
			      moet_json_kind(root));
		goto fail;
	}
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), FORMAT_NAME)) {
		rc = moet_err(MOET_EFORMAT, "%s: format: must be \"%s\" (not a profile?)", label,
			      FORMAT_NAME);
		goto fail;
	}
	if ((rc = get_int(label, root, "format_version", "", 1, 1, &ver)) ||
	    (rc = get_int(label, root, "num_hidden_layers", "", 1, MAX_LAYERS, &L)) ||
	    (rc = get_int(label, root, "n_routed_experts", "", 1, MAX_EXPERTS, &E)) ||
	    (rc = get_int(label, root, "num_experts_per_tok", "", 1, E, &K)))
		goto fail;
	if (L * E > MAX_CELLS) {
		rc = moet_err(MOET_EFORMAT, "%s: %" PRId64 " layers x %" PRId64 " experts is too "
			      "large", label, L, E);
		goto fail;
	}
	if ((rc = alloc_profile(L, E, K, &p)) || (rc = read_meta(label, root, p)) ||
	    (rc = read_layers(label, root, p)))
		goto fail;
	json_decref(root);
	*out = p;
	return 0;
fail:
	moet_profile_free(p);
	json_decref(root);
	return rc;
}

/* Reads a whole file of at most `max` bytes (NUL appended). */
static int slurp(const char *path, size_t max, char **out, size_t *out_n)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t n = 0, cap = 0;
	if (!f)
		return moet_err(errno == ENOENT ? MOET_ENOTFOUND : MOET_EIO, "%s: cannot open: %s",
				path, strerror(errno));
	for (;;) {
		if (n + 65536 + 1 > cap) {
			cap = cap ? 2 * cap : 65536 * 2;
			char *b = realloc(buf, cap);
			if (!b) {
				free(buf);
				fclose(f);
				return moet_err(MOET_ENOMEM, "%s: reading", path);
			}
			buf = b;
		}
		size_t got = fread(buf + n, 1, 65536, f);
		n += got;
		if (n > max) {
			free(buf);
			fclose(f);
			return moet_err(MOET_EIO, "%s: larger than %zu bytes", path, max);
		}
		if (got < 65536)
			break;
	}
	int bad = ferror(f);
	fclose(f);
	if (bad) {
		free(buf);
		return moet_err(MOET_EIO, "%s: read error", path);
	}
	buf[n] = '\0';
	*out = buf;
	*out_n = n;
	return 0;
}

int moet_profile_load(const char *path, moet_profile **out)
{
	char *text = NULL;
	size_t n = 0;
	int rc = slurp(path, MOET_PROFILE_MAX_FILE_BYTES, &text, &n);
	if (rc == MOET_ENOTFOUND)
		rc = MOET_EIO;
	if (!rc)
		rc = moet_profile_parse(path, text, n, out);
	free(text);
	return rc;
}

/* ---- generator.json --------------------------------------------------------------------- */

void moet_gen_truth_free(moet_gen_truth *t)
{
	if (!t)
		return;
	free(t->has_layer);
	free(t->is_hot);
	free(t->expert_share);
	free(t);
}

void moet_gen_truth_class_range(const moet_gen_truth *t, int c, int64_t *lo, int64_t *hi)
{
	const int64_t C = t->n_classes, V = t->vocab_size;
	*lo = (c * V + C - 1) / C;
	*hi = ((c + 1) * V + C - 1) / C;
}

static int truth_layer(const char *label, json_t *ly, size_t i, moet_gen_truth *t)
{
	char where[48];
	int64_t l;
	snprintf(where, sizeof(where), "layers[%zu].", i);
	if (!json_is_object(ly))
		return moet_err(MOET_EFORMAT, "%s: layers[%zu]: must be an object", label, i);
	int rc = get_int(label, ly, "layer", where, 0, t->n_layers - 1, &l);
	if (rc)
		return rc;
	if (t->has_layer[l])
		return moet_err(MOET_EFORMAT,
				"%s: layers[%zu].layer: layer %" PRId64 " given twice", label, i,
				l);
	t->has_layer[l] = 1;
	json_t *hot = json_object_get(ly, "hot_experts"), *sh = json_object_get(ly, "expert_share");
	if (!json_is_array(hot))
		return moet_err(MOET_EFORMAT, "%s: %shot_experts: must be an array", label, where);
	if (!json_is_array(sh) || (int64_t)json_array_size(sh) != t->n_experts)
		return moet_err(MOET_EFORMAT, "%s: %sexpert_share: must be an array of %" PRId64
				" numbers", label, where, t->n_experts);
	size_t j;
	json_t *v;
	json_array_foreach(hot, j, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= t->n_experts)
			return moet_err(MOET_EFORMAT, "%s: %shot_experts[%zu]: not an expert id",
					label, where, j);
		t->is_hot[l * t->n_experts + json_integer_value(v)] = 1;
	}
	json_array_foreach(sh, j, v) {
		double d = json_is_number(v) ? json_number_value(v) : -1;
		if (!(d >= 0 && d <= 1))
			return moet_err(MOET_EFORMAT,
					"%s: %sexpert_share[%zu]: must be a number in "
					"[0, 1]",
					label, where, j);
		t->expert_share[l * t->n_experts + (int64_t)j] = d;
	}
	return 0;
}

int moet_gen_truth_load(const char *dir, const moet_config *cf, moet_gen_truth **out)
{
	char path[4096];
	char *text = NULL;
	size_t n = 0;
	json_t *root = NULL;
	json_error_t je;
	moet_gen_truth *t = NULL;
	int64_t x;
	snprintf(path, sizeof(path), "%s/generator.json", dir);
	int rc = slurp(path, 256u << 20, &text, &n);
	if (rc)
		return rc;
	if (!(root = json_loadb(text, n, 0, &je))) {
		rc = moet_err(MOET_EFORMAT, "%s:%d:%d: malformed JSON: %s", path, je.line,
			      je.column, je.text);
		goto fail;
	}
	const int64_t L = cf->num_hidden_layers, E = cf->n_routed_experts;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->has_layer = calloc((size_t)L, 1)) ||
	    !(t->is_hot = calloc((size_t)(L * E), 1)) ||
	    !(t->expert_share = calloc((size_t)(L * E), sizeof(double)))) {
		rc = moet_err(MOET_ENOMEM, "%s", path);
		goto fail;
	}
	t->n_layers = L;
	t->n_experts = E;
	t->vocab_size = cf->vocab_size;
	json_t *skew = json_object_get(root, "skew_model"),
	       *hs = json_object_get(root, "hot_share");
	if ((rc = get_int(path, root, "num_hidden_layers", "", L, L, &x)) ||
	    (rc = get_int(path, root, "n_routed_experts", "", E, E, &x)) ||
	    (rc = get_int(path, root, "hot_count", "", 0, E, &t->hot_count)))
		goto fail;
	if (!json_is_object(skew)) {
		rc = moet_err(MOET_EFORMAT, "%s: skew_model: must be an object", path);
		goto fail;
	}
	if ((rc = get_int(path, skew, "n_classes", "skew_model.", 1,
			  cf->vocab_size < 65536 ? cf->vocab_size : 65536, &x)))
		goto fail;
	t->n_classes = (int)x;
	t->hot_share = json_is_number(hs) ? json_number_value(hs) : 0;
	json_t *layers = json_object_get(root, "layers"), *ly;
	size_t i;
	if (!json_is_array(layers)) {
		rc = moet_err(MOET_EFORMAT, "%s: layers: must be an array", path);
		goto fail;
	}
	json_array_foreach(layers, i, ly)
		if ((rc = truth_layer(path, ly, i, t)))
			goto fail;
	json_decref(root);
	free(text);
	*out = t;
	return 0;
fail:
	moet_gen_truth_free(t);
	json_decref(root);
	free(text);
	return rc;
}
