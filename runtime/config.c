/*
 * config.c: reads config.json of the DeepSeek-V3 family into a moet_config.
 *
 * Three passes over the JSON object:
 *   1. identity: model_type, architectures (DeepSeek-V3 layout or an unsupported model);
 *   2. fields: every field read with its JSON type checked; geometry required, the rest
 *      defaulted as listed in docs/config.md; rope from rope_scaling or rope_parameters;
 *      quantization_config;
 *   3. validation: ranges and relations between fields (expert groups, top-k, ...).
 *
 * Every failure is one line "LABEL: field NAME: problem" (nested fields as
 * rope_scaling.factor). Codes: MOET_EFORMAT (not JSON / not an object), MOET_ENOTFOUND (a
 * required field is missing), MOET_EINVAL (wrong JSON type, or fields that disagree),
 * MOET_ERANGE (a value out of its range), MOET_EUNSUP (a valid setting this runtime does not
 * implement: another model, activation, scoring function, rope type or quantization).
 *
 * NOTE: JSON null counts as absent (transformers writes None as null, e.g. q_lora_rank) —
 * a default applies, or the required-field error.
 */

#include "moet_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moet_err.h"
#include "moet_json.h"

#define CONFIG_MAX_BYTES (16u << 20)
#define GEOMETRY_MAX ((int64_t)1 << 31) /* keeps products of two extents inside int64 */

typedef struct ctx {
	const char *label;
	const char *pfx; /* "" or "rope_scaling." etc. */
} ctx;

static const json_t *get(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);
	return (v && !json_is_null(v)) ? v : NULL;
}

static int missing(const ctx *c, const char *k)
{
	return moet_err(MOET_ENOTFOUND, "%s: field %s%s: missing (required)", c->label, c->pfx,
			k);
}

static int wrong_type(const ctx *c, const char *k, const json_t *v, const char *want)
{
	return moet_err(MOET_EINVAL, "%s: field %s%s: is a JSON %s, expected %s", c->label,
			c->pfx, k, moet_json_kind(v), want);
}

static int get_int(const ctx *c, const json_t *o, const char *k, int required, int64_t dflt,
		   int64_t *out)
{
	const json_t *v = get(o, k);
	if (!v) {
		*out = dflt;
		return required ? missing(c, k) : 0;
	}
	if (!json_is_integer(v))
		return wrong_type(c, k, v, "an integer");
	*out = (int64_t)json_integer_value(v);
	return 0;
}

static int get_real(const ctx *c, const json_t *o, const char *k, int required, double dflt,
		    double *out)
{
	const json_t *v = get(o, k);
	if (!v) {
		*out = dflt;
		return required ? missing(c, k) : 0;
	}
	if (!json_is_number(v))
		return wrong_type(c, k, v, "a number");
	*out = json_number_value(v);
	return 0;
}

static int get_bool(const ctx *c, const json_t *o, const char *k, bool dflt, bool *out)
{
	const json_t *v = get(o, k);
	if (!v) {
		*out = dflt;
		return 0;
	}
	if (!json_is_boolean(v))
		return wrong_type(c, k, v, "true or false");
	*out = json_is_true(v);
	return 0;
}

static int get_str(const ctx *c, const json_t *o, const char *k, const char *dflt, char *out,
		   size_t n)
{
	const json_t *v = get(o, k);
	const char *s = dflt;
	if (v) {
		if (!json_is_string(v))
			return wrong_type(c, k, v, "a string");
		s = json_string_value(v);
	}
	if (!s)
		return missing(c, k);
	if (strlen(s) >= n)
		return moet_err(MOET_ERANGE, "%s: field %s%s: longer than %zu characters",
				c->label, c->pfx, k, n - 1);
	for (const char *p = s; *p; p++)
		if ((unsigned char)*p < 0x20)
			return moet_err(MOET_EINVAL, "%s: field %s%s: holds control characters",
					c->label, c->pfx, k);
	strcpy(out, s);
	return 0;
}

/* bos/eos: an integer, a list of integers (the first is taken), or absent/null (-1). */
static int get_token_id(const ctx *c, const json_t *o, const char *k, int64_t *out)
{
	const json_t *v = get(o, k);
	*out = -1;
	if (!v)
		return 0;
	if (json_is_array(v)) {
		if (json_array_size(v) == 0)
			return 0;
		v = json_array_get(v, 0);
		if (!json_is_integer(v))
			return wrong_type(c, k, v, "an integer or a list of integers");
	}
	if (!json_is_integer(v))
		return wrong_type(c, k, v, "an integer or a list of integers");
	*out = (int64_t)json_integer_value(v);
	return 0;
}

static int check_identity(const ctx *c, const json_t *root, moet_config *cf)
{
	int rc = get_str(c, root, "model_type", NULL, cf->model_type, sizeof(cf->model_type));
	if (rc)
		return rc;
	bool arch_ok = false;
	const json_t *ar = get(root, "architectures");
	if (ar) {
		if (!json_is_array(ar))
			return wrong_type(c, "architectures", ar, "a list of strings");
		size_t i;
		const json_t *x;
		json_array_foreach(ar, i, x) {
			if (!json_is_string(x))
				return wrong_type(c, "architectures", x, "a list of strings");
			if (!strcmp(json_string_value(x), "DeepseekV3ForCausalLM"))
				arch_ok = true;
		}
	}
	if (strcmp(cf->model_type, "deepseek_v3") != 0 && !arch_ok)
		return moet_err(MOET_EUNSUP, "%s: field model_type: \"%s\" is not supported "
				"(expected deepseek_v3, or architectures naming "
				"DeepseekV3ForCausalLM)", c->label, cf->model_type);
	return 0;
}

/* rope_scaling (published) or rope_parameters (newer transformers); null/absent: plain. */
static int read_rope(const ctx *c, const json_t *root, moet_config *cf)
{
	int rc;
	const char *rname = "rope_scaling";
	const json_t *r = get(root, "rope_scaling");
	if (!r) {
		r = get(root, "rope_parameters");
		rname = "rope_parameters";
	}
	if (r && !json_is_object(r))
		return wrong_type(c, rname, r, "an object");
	if ((rc = get_real(c, root, "rope_theta", 0, 10000.0, &cf->rope_theta)))
		return rc;
	cf->rope_type = MOET_ROPE_DEFAULT;
	cf->rope_factor = 1.0;
	cf->rope_beta_fast = 32.0;
	cf->rope_beta_slow = 1.0;
	cf->rope_truncate = true;
	if (!r)
		return 0;

	char sub[48];
	snprintf(sub, sizeof(sub), "%s.", rname);
	ctx rc_ctx = { c->label, sub };
	const ctx *rx = &rc_ctx;
	if ((rc = get_real(rx, r, "rope_theta", 0, cf->rope_theta, &cf->rope_theta)))
		return rc;
	char type[32], alt[32];
	const char *tkey = get(r, "rope_type") ? "rope_type" : "type";
	if ((rc = get_str(rx, r, tkey, "default", type, sizeof(type))))
		return rc;
	if (get(r, "rope_type") && get(r, "type")) {
		if ((rc = get_str(rx, r, "type", "default", alt, sizeof(alt))))
			return rc;
		if (strcmp(alt, type))
			return moet_err(MOET_EINVAL, "%s: field %srope_type: \"%s\" disagrees with "
					"type \"%s\"", c->label, sub, type, alt);
	}
	if (!strcmp(type, "default"))
		return 0;
	if (strcmp(type, "yarn"))
		return moet_err(MOET_EUNSUP, "%s: field %s%s: \"%s\" is not supported (default or "
				"yarn)", c->label, sub, tkey, type);
	cf->rope_type = MOET_ROPE_YARN;
	if ((rc = get_real(rx, r, "factor", 1, 0, &cf->rope_factor)) ||
	    (rc = get_int(rx, r, "original_max_position_embeddings", 0, 0,
			  &cf->rope_original_max_pos)) ||
	    (rc = get_real(rx, r, "beta_fast", 0, 32.0, &cf->rope_beta_fast)) ||
	    (rc = get_real(rx, r, "beta_slow", 0, 1.0, &cf->rope_beta_slow)) ||
	    (rc = get_real(rx, r, "mscale", 0, 0.0, &cf->rope_mscale)) ||
	    (rc = get_real(rx, r, "mscale_all_dim", 0, 0.0, &cf->rope_mscale_all_dim)) ||
	    (rc = get_bool(rx, r, "truncate", true, &cf->rope_truncate)))
		return rc;
	cf->rope_has_attention_factor = get(r, "attention_factor") != NULL;
	if ((rc = get_real(rx, r, "attention_factor", 0, 0.0, &cf->rope_attention_factor)))
		return rc;
	if (!(cf->rope_factor > 0) || !isfinite(cf->rope_factor))
		return moet_err(MOET_ERANGE, "%s: field %sfactor: %g is not a positive number",
				c->label, sub, cf->rope_factor);
	if (cf->rope_original_max_pos < 0)
		return moet_err(MOET_ERANGE, "%s: field %soriginal_max_position_embeddings: "
				"negative", c->label, sub);
	if (cf->rope_has_attention_factor && !(cf->rope_attention_factor > 0))
		return moet_err(MOET_ERANGE, "%s: field %sattention_factor: %g is not positive",
				c->label, sub, cf->rope_attention_factor);
	return 0;
}

static int read_quant(const ctx *c, const json_t *root, moet_config *cf)
{
	const json_t *q = get(root, "quantization_config");
	cf->fp8 = false;
	if (!q)
		return 0;
	if (!json_is_object(q))
		return wrong_type(c, "quantization_config", q, "an object");
	ctx qctx = { c->label, "quantization_config." };
	char method[32], fmt[16];
	int rc = get_str(&qctx, q, "quant_method", NULL, method, sizeof(method));
	if (rc)
		return rc;
	if (strcmp(method, "fp8"))
		return moet_err(MOET_EUNSUP, "%s: field quantization_config.quant_method: \"%s\" "
				"is not supported (fp8 only)", c->label, method);
	if ((rc = get_str(&qctx, q, "fmt", "e4m3", fmt, sizeof(fmt))))
		return rc;
	if (strcmp(fmt, "e4m3"))
		return moet_err(MOET_EUNSUP, "%s: field quantization_config.fmt: \"%s\" is not "
				"supported (e4m3 only)", c->label, fmt);
	cf->fp8 = true;
	cf->fp8_block_rows = 128;
	cf->fp8_block_cols = 128;
	const json_t *b = get(q, "weight_block_size");
	if (b) {
		if (!json_is_array(b) || json_array_size(b) != 2 ||
		    !json_is_integer(json_array_get(b, 0)) ||
		    !json_is_integer(json_array_get(b, 1)))
			return moet_err(MOET_EINVAL, "%s: field "
					"quantization_config.weight_block_size: "
					"expected a list of two integers", c->label);
		cf->fp8_block_rows = (int64_t)json_integer_value(json_array_get(b, 0));
		cf->fp8_block_cols = (int64_t)json_integer_value(json_array_get(b, 1));
		if (cf->fp8_block_rows <= 0 || cf->fp8_block_cols <= 0)
			return moet_err(MOET_ERANGE, "%s: field "
					"quantization_config.weight_block_size:"
					" [%lld, %lld] is not positive", c->label,
					(long long)cf->fp8_block_rows,
					(long long)cf->fp8_block_cols);
	}
	return 0;
}

static int read_fields(const ctx *c, const json_t *r, moet_config *cf)
{
	static const struct {
		const char *name;
		size_t off;
	} req[] = {
#define F(x) { #x, offsetof(moet_config, x) }
		F(vocab_size), F(hidden_size), F(intermediate_size), F(moe_intermediate_size),
		F(num_hidden_layers), F(num_attention_heads), F(n_routed_experts),
		F(num_experts_per_tok), F(kv_lora_rank), F(qk_nope_head_dim), F(qk_rope_head_dim),
		F(v_head_dim),
#undef F
	};
	int rc;
	for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++)
		if ((rc = get_int(c, r, req[i].name, 1, 0, (int64_t *)((char *)cf + req[i].off))))
			return rc;
	if ((rc = get_int(c, r, "num_key_value_heads", 0, cf->num_attention_heads,
			  &cf->num_key_value_heads)) ||
	    (rc = get_int(c, r, "n_shared_experts", 0, 1, &cf->n_shared_experts)) ||
	    (rc = get_int(c, r, "n_group", 0, 1, &cf->n_group)) ||
	    (rc = get_int(c, r, "topk_group", 0, 1, &cf->topk_group)) ||
	    (rc = get_int(c, r, "first_k_dense_replace", 0, 0, &cf->first_k_dense_replace)) ||
	    (rc = get_int(c, r, "moe_layer_freq", 0, 1, &cf->moe_layer_freq)) ||
	    (rc = get_int(c, r, "num_nextn_predict_layers", 0, 0,
			  &cf->num_nextn_predict_layers)) ||
	    (rc = get_real(c, r, "routed_scaling_factor", 0, 1.0, &cf->routed_scaling_factor)) ||
	    (rc = get_bool(c, r, "norm_topk_prob", true, &cf->norm_topk_prob)) ||
	    (rc = get_str(c, r, "scoring_func", "sigmoid", cf->scoring_func,
			  sizeof(cf->scoring_func))) ||
	    (rc = get_str(c, r, "topk_method", "noaux_tc", cf->topk_method,
			  sizeof(cf->topk_method))) ||
	    (rc = get_int(c, r, "q_lora_rank", 0, 0, &cf->q_lora_rank)) ||
	    (rc = get_bool(c, r, "rope_interleave", true, &cf->rope_interleave)) ||
	    (rc = get_bool(c, r, "attention_bias", false, &cf->attention_bias)) ||
	    (rc = get_real(c, r, "rms_norm_eps", 0, 1e-6, &cf->rms_norm_eps)) ||
	    (rc = get_int(c, r, "max_position_embeddings", 0, 4096,
			  &cf->max_position_embeddings)) ||
	    (rc = get_bool(c, r, "tie_word_embeddings", false, &cf->tie_word_embeddings)) ||
	    (rc = get_str(c, r, "hidden_act", "silu", cf->hidden_act, sizeof(cf->hidden_act))) ||
	    (rc = get_token_id(c, r, "bos_token_id", &cf->bos_token_id)) ||
	    (rc = get_token_id(c, r, "eos_token_id", &cf->eos_token_id)))
		return rc;
	if ((rc = read_rope(c, r, cf)))
		return rc;
	return read_quant(c, r, cf);
}

static int check_range(const ctx *c, const char *k, int64_t v, int64_t lo)
{
	if (v < lo || v >= GEOMETRY_MAX)
		return moet_err(MOET_ERANGE, "%s: field %s: %lld is out of range [%lld, %lld]",
				c->label, k, (long long)v, (long long)lo,
				(long long)GEOMETRY_MAX - 1);
	return 0;
}

static int validate(const ctx *c, const moet_config *cf)
{
	const struct {
		const char *name;
		int64_t v, lo;
	} r[] = {
		{ "vocab_size", cf->vocab_size, 1 },
		{ "hidden_size", cf->hidden_size, 1 },
		{ "intermediate_size", cf->intermediate_size, 1 },
		{ "moe_intermediate_size", cf->moe_intermediate_size, 1 },
		{ "num_hidden_layers", cf->num_hidden_layers, 1 },
		{ "num_attention_heads", cf->num_attention_heads, 1 },
		{ "num_key_value_heads", cf->num_key_value_heads, 1 },
		{ "n_routed_experts", cf->n_routed_experts, 1 },
		{ "num_experts_per_tok", cf->num_experts_per_tok, 1 },
		{ "kv_lora_rank", cf->kv_lora_rank, 1 },
		{ "qk_nope_head_dim", cf->qk_nope_head_dim, 1 },
		{ "qk_rope_head_dim", cf->qk_rope_head_dim, 1 },
		{ "v_head_dim", cf->v_head_dim, 1 },
		{ "n_shared_experts", cf->n_shared_experts, 0 },
		{ "n_group", cf->n_group, 1 },
		{ "topk_group", cf->topk_group, 1 },
		{ "first_k_dense_replace", cf->first_k_dense_replace, 0 },
		{ "moe_layer_freq", cf->moe_layer_freq, 1 },
		{ "num_nextn_predict_layers", cf->num_nextn_predict_layers, 0 },
		{ "q_lora_rank", cf->q_lora_rank, 0 },
		{ "max_position_embeddings", cf->max_position_embeddings, 1 },
	};
	int rc;
	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
		if ((rc = check_range(c, r[i].name, r[i].v, r[i].lo)))
			return rc;
	if (cf->qk_rope_head_dim % 2)
		return moet_err(MOET_EINVAL, "%s: field qk_rope_head_dim: %lld is odd (rotary "
				"pairs)", c->label, (long long)cf->qk_rope_head_dim);
	if (cf->n_routed_experts % cf->n_group)
		return moet_err(MOET_EINVAL, "%s: field n_routed_experts: %lld is not a multiple "
				"of n_group %lld", c->label, (long long)cf->n_routed_experts,
				(long long)cf->n_group);
	if (cf->topk_group > cf->n_group)
		return moet_err(MOET_EINVAL, "%s: field topk_group: %lld exceeds n_group %lld",
				c->label, (long long)cf->topk_group, (long long)cf->n_group);
	if (cf->num_experts_per_tok > cf->n_routed_experts)
		return moet_err(MOET_EINVAL, "%s: field num_experts_per_tok: %lld exceeds "
				"n_routed_experts %lld", c->label,
				(long long)cf->num_experts_per_tok,
				(long long)cf->n_routed_experts);
	int64_t reachable = cf->topk_group * (cf->n_routed_experts / cf->n_group);
	if (cf->num_experts_per_tok > reachable)
		return moet_err(MOET_EINVAL, "%s: field num_experts_per_tok: %lld exceeds the %lld "
				"experts in topk_group %lld groups of n_routed_experts %lld / "
				"n_group %lld", c->label, (long long)cf->num_experts_per_tok,
				(long long)reachable, (long long)cf->topk_group,
				(long long)cf->n_routed_experts, (long long)cf->n_group);
	if (!(cf->routed_scaling_factor > 0) || !isfinite(cf->routed_scaling_factor))
		return moet_err(MOET_ERANGE, "%s: field routed_scaling_factor: %g is not a "
				"positive number", c->label, cf->routed_scaling_factor);
	if (!(cf->rms_norm_eps > 0) || !isfinite(cf->rms_norm_eps))
		return moet_err(MOET_ERANGE, "%s: field rms_norm_eps: %g is not a positive number",
				c->label, cf->rms_norm_eps);
	if (!(cf->rope_theta > 0) || !isfinite(cf->rope_theta))
		return moet_err(MOET_ERANGE, "%s: field rope_theta: %g is not a positive number",
				c->label, cf->rope_theta);
	if (strcmp(cf->scoring_func, "sigmoid"))
		return moet_err(MOET_EUNSUP, "%s: field scoring_func: \"%s\" is not supported "
				"(sigmoid only)", c->label, cf->scoring_func);
	if (strcmp(cf->topk_method, "noaux_tc"))
		return moet_err(MOET_EUNSUP, "%s: field topk_method: \"%s\" is not supported "
				"(noaux_tc only)", c->label, cf->topk_method);
	if (strcmp(cf->hidden_act, "silu"))
		return moet_err(MOET_EUNSUP, "%s: field hidden_act: \"%s\" is not supported (silu "
				"only)", c->label, cf->hidden_act);
	if (cf->attention_bias)
		return moet_err(MOET_EUNSUP, "%s: field attention_bias: true is not supported",
				c->label);
	return 0;
}

int moet_config_parse(const char *label, const char *text, size_t n_bytes, moet_config *out)
{
	moet_config cf;
	json_error_t jerr;
	ctx c = { label, "" };
	int rc = 0;
	memset(&cf, 0, sizeof(cf));
	json_t *root = json_loadb(text, n_bytes, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		for (char *p = jerr.text; *p; p++)
			if ((unsigned char)*p < 0x20)
				*p = '?';
		return moet_err(MOET_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", label,
				jerr.text, jerr.line, jerr.column);
	}
	if (!json_is_object(root)) {
		rc = moet_err(MOET_EFORMAT, "%s: the top level is a JSON %s, not an object", label,
			      moet_json_kind(root));
		goto fail;
	}
	if ((rc = check_identity(&c, root, &cf)) || (rc = read_fields(&c, root, &cf)) ||
	    (rc = validate(&c, &cf)))
		goto fail;
	json_decref(root);
	*out = cf;
	return 0;
fail:
	json_decref(root);
	return rc;
}

int moet_config_load(const char *path, moet_config *out)
{
	size_t n = strlen(path);
	char *file = NULL, *text = NULL;
	int rc = 0;
	FILE *f = NULL;
	if (n >= 5 && !strcmp(path + n - 5, ".json")) {
		file = strdup(path);
	} else {
		file = malloc(n + 13);
		if (file)
			snprintf(file, n + 13, "%s%sconfig.json", path,
				 (n && path[n - 1] == '/') ? "" : "/");
	}
	if (!file)
		return moet_err(MOET_ENOMEM, "%s: out of memory", path);
	f = fopen(file, "rb");
	if (!f) {
		rc = moet_err(errno == ENOENT ? MOET_ENOTFOUND : MOET_EIO, "%s: %s", file,
			      strerror(errno));
		goto fail;
	}
	struct stat st;
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size > CONFIG_MAX_BYTES) {
		rc = moet_err(MOET_EIO, "%s: not a regular file of at most %u bytes", file,
			      CONFIG_MAX_BYTES);
		goto fail;
	}
	size_t sz = (size_t)st.st_size;
	text = malloc(sz + 1);
	if (!text) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory", file);
		goto fail;
	}
	if (fread(text, 1, sz, f) != sz) {
		rc = moet_err(MOET_EIO, "%s: short read", file);
		goto fail;
	}
	rc = moet_config_parse(file, text, sz, out);
fail:
	if (f)
		fclose(f);
	free(text);
	free(file);
	return rc;
}
