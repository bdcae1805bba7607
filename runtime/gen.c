/*
 * gen.c: gen-checkpoint's orchestration: presets and parameter checks, the output
 * directory, shard planning, and the three JSON files (config.json, the index,
 * generator.json). The tensors themselves come from gen_tensors.c, the router calibration
 * from gen_route.c, the shard files from st_writer.c.
 *
 *   params -> moet_config (preset + overrides) -> tensor list -> classes, hot sets, biases
 *          -> shard plan -> config.json, generator.json -> shards -> index (written last:
 *             a directory with an index is complete)
 *
 * Shard plan: tensors come in layout order (embedding, layer 0, ..., layer L-1, final norm
 * and lm_head); a shard takes whole groups (one layer, or one global tensor) while it stays
 * within --shard-mb; a group that does not fit starts a new shard; a group bigger than a
 * whole shard is cut at tensor boundaries.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gen_int.h"
#include "moet_err.h"
#include "moet_gen.h"

#define GEN_MAX_LAYERS 1024
#define GEN_MAX_EXPERTS 4096

void moet_gen_params_init(moet_gen_params *p)
{
	memset(p, 0, sizeof(*p));
	p->preset = MOET_GEN_TINY;
	p->hot_share = 0.8;
	p->shard_mb = 4096;
}

int moet_gen_preset_parse(const char *s, moet_gen_preset *out)
{
	if (!strcmp(s, "tiny"))
		*out = MOET_GEN_TINY;
	else if (!strcmp(s, "kimi-k2"))
		*out = MOET_GEN_KIMI_K2;
	else if (!strcmp(s, "tiny-tp"))
		*out = MOET_GEN_TINY_TP;
	else
		return moet_err(MOET_EINVAL, "unknown preset '%s' (tiny, tiny-tp, kimi-k2)", s);
	return 0;
}

static const char *preset_name(moet_gen_preset p)
{
	return p == MOET_GEN_KIMI_K2 ? "kimi-k2" : p == MOET_GEN_TINY_TP ? "tiny-tp" : "tiny";
}

static void preset_tiny(moet_config *c)
{
	snprintf(c->model_type, sizeof(c->model_type), "deepseek_v3");
	c->vocab_size = 1024;
	c->hidden_size = 256;
	c->intermediate_size = 512;
	c->moe_intermediate_size = 128;
	c->num_hidden_layers = 3;
	c->num_attention_heads = 4;
	c->num_key_value_heads = 4;
	c->n_shared_experts = 1;
	c->n_routed_experts = 32;
	c->num_experts_per_tok = 4;
	c->n_group = 4;
	c->topk_group = 2;
	c->routed_scaling_factor = 2.5;
	/* NOTE: q_lora 96 and kv_a rows 64 + 16 = 80 are partial 128-blocks; q_b rows 192 are
	 * one and a half blocks: the tiny model exercises every edge of the block scales. */
	c->q_lora_rank = 96;
	c->kv_lora_rank = 64;
	c->qk_nope_head_dim = 32;
	c->qk_rope_head_dim = 16;
	c->v_head_dim = 32;
	c->max_position_embeddings = 4096;
	c->bos_token_id = 0;
	c->eos_token_id = 1;
	c->rope_theta = 10000.0;
	c->rope_factor = 4.0;
	c->rope_original_max_pos = 1024;
	c->rope_beta_fast = 32.0;
	c->rope_beta_slow = 1.0;
}

/* tiny with heads whose q_b and kv_b rows are whole 128-row blocks (8 heads: nope 64, rope 64,
 * v 64), so that MOET_TP splits the attention's matrices at head boundaries. */
static void preset_tiny_tp(moet_config *c)
{
	preset_tiny(c);
	c->num_attention_heads = 8;
	c->num_key_value_heads = 8;
	c->qk_nope_head_dim = 64;
	c->qk_rope_head_dim = 64;
	c->v_head_dim = 64;
}

/* Kimi-K2-Instruct's config.json (moonshotai/Kimi-K2-Instruct), per-layer geometry. */
static void preset_kimi(moet_config *c)
{
	snprintf(c->model_type, sizeof(c->model_type), "kimi_k2");
	c->vocab_size = 163840;
	c->hidden_size = 7168;
	c->intermediate_size = 18432;
	c->moe_intermediate_size = 2048;
	c->num_hidden_layers = 61;
	c->num_attention_heads = 64;
	c->num_key_value_heads = 64;
	c->n_shared_experts = 1;
	c->n_routed_experts = 384;
	c->num_experts_per_tok = 8;
	c->n_group = 1;
	c->topk_group = 1;
	c->routed_scaling_factor = 2.827;
	c->q_lora_rank = 1536;
	c->kv_lora_rank = 512;
	c->qk_nope_head_dim = 128;
	c->qk_rope_head_dim = 64;
	c->v_head_dim = 128;
	c->max_position_embeddings = 131072;
	c->bos_token_id = 163584;
	c->eos_token_id = 163585;
	c->rope_theta = 50000.0;
	c->rope_factor = 32.0;
	c->rope_original_max_pos = 4096;
	c->rope_beta_fast = 1.0;
	c->rope_beta_slow = 1.0;
}

int moet_gen_config(const moet_gen_params *p, moet_config *out)
{
	moet_config c;
	memset(&c, 0, sizeof(c));
	if (p->preset == MOET_GEN_KIMI_K2)
		preset_kimi(&c);
	else if (p->preset == MOET_GEN_TINY)
		preset_tiny(&c);
	else if (p->preset == MOET_GEN_TINY_TP)
		preset_tiny_tp(&c);
	else
		return moet_err(MOET_EINVAL, "unknown preset %d", (int)p->preset);
	/* Shared by both presets: the published DeepSeek-V3 conventions. */
	c.first_k_dense_replace = 1;
	c.moe_layer_freq = 1;
	c.num_nextn_predict_layers = 0;
	c.norm_topk_prob = true;
	snprintf(c.scoring_func, sizeof(c.scoring_func), "sigmoid");
	snprintf(c.topk_method, sizeof(c.topk_method), "noaux_tc");
	snprintf(c.hidden_act, sizeof(c.hidden_act), "silu");
	c.rope_interleave = true;
	c.attention_bias = false;
	c.rms_norm_eps = 1e-6;
	c.tie_word_embeddings = false;
	c.rope_type = MOET_ROPE_YARN;
	c.rope_mscale = 1.0;
	c.rope_mscale_all_dim = 1.0;
	c.rope_truncate = true;
	c.fp8 = true;
	c.fp8_block_rows = GEN_FP8_BLOCK;
	c.fp8_block_cols = GEN_FP8_BLOCK;

	if (p->n_layers < 0 || p->n_layers > GEN_MAX_LAYERS)
		return moet_err(MOET_ERANGE, "--layers %lld is out of range [1, %d]",
				(long long)p->n_layers, GEN_MAX_LAYERS);
	if (p->n_layers > 0)
		c.num_hidden_layers = p->n_layers;
	if (p->n_experts < 0 || p->n_experts > GEN_MAX_EXPERTS)
		return moet_err(MOET_ERANGE, "--experts %lld is out of range [1, %d]",
				(long long)p->n_experts, GEN_MAX_EXPERTS);
	if (p->n_experts > 0)
		c.n_routed_experts = p->n_experts;
	const int64_t E = c.n_routed_experts;
	if (E % c.n_group != 0)
		return moet_err(MOET_EINVAL, "--experts %lld is not a multiple of n_group %lld",
				(long long)E, (long long)c.n_group);
	if (c.n_group > 1 && E / c.n_group < 2)
		return moet_err(MOET_EINVAL, "--experts %lld leaves fewer than 2 experts in each "
				"of the %lld groups", (long long)E, (long long)c.n_group);
	if (E / c.n_group * c.topk_group < c.num_experts_per_tok)
		return moet_err(MOET_EINVAL, "--experts %lld leaves fewer than top-k %lld experts "
				"in the %lld kept group(s) of %lld", (long long)E,
				(long long)c.num_experts_per_tok, (long long)c.topk_group,
				(long long)c.n_group);
	if (!(p->hot_share > 0.0 && p->hot_share < 1.0))
		return moet_err(MOET_ERANGE, "--hot-share %g must be in (0, 1)", p->hot_share);
	if (p->n_layer_hot_share || p->layer_hot_share) {
		int64_t n_moe = 0;
		for (int64_t l = 0; l < c.num_hidden_layers; l++)
			n_moe += moet_config_is_moe_layer(&c, l);
		if (!p->layer_hot_share || p->n_layer_hot_share != n_moe)
			return moet_err(MOET_EINVAL, "--hot-share-by-layer: %lld values for %lld "
					"MoE layers (one per MoE layer, in layer order)",
					(long long)p->n_layer_hot_share, (long long)n_moe);
		for (int64_t k = 0; k < n_moe; k++)
			if (!(p->layer_hot_share[k] > 0.0 && p->layer_hot_share[k] < 1.0))
				return moet_err(MOET_ERANGE, "--hot-share-by-layer: value %lld "
						"(%g) must be in (0, 1)", (long long)k + 1,
						p->layer_hot_share[k]);
	}
	if (p->hot_count < 0 || p->hot_count > E)
		return moet_err(MOET_ERANGE, "--hot-count %lld is out of range [1, %lld]",
				(long long)p->hot_count, (long long)E);
	if (p->shard_mb < 1 || p->shard_mb > (1 << 20))
		return moet_err(MOET_ERANGE, "--shard-mb %lld is out of range [1, %d]",
				(long long)p->shard_mb, 1 << 20);
	if (p->seed > (uint64_t)INT64_MAX)
		return moet_err(MOET_ERANGE, "--seed %llu is above 2^63 - 1",
				(unsigned long long)p->seed);
	*out = c;
	return 0;
}

/* ---- the directory ---- */

/* "model-00001-of-00012.safetensors" */
static bool is_shard_name(const char *s)
{
	static const char pat[] = "model-#####-of-#####.safetensors";
	if (strlen(s) != sizeof(pat) - 1)
		return false;
	for (size_t i = 0; pat[i]; i++)
		if (pat[i] == '#' ? (s[i] < '0' || s[i] > '9') : s[i] != pat[i])
			return false;
	return true;
}

static int prepare_dir(const char *dir, bool force)
{
	struct stat st;
	if (stat(dir, &st) != 0) {
		if (errno != ENOENT)
			return moet_err(MOET_EIO, "%s: %s", dir, strerror(errno));
		if (mkdir(dir, 0755) != 0)
			return moet_err(MOET_EIO, "%s: cannot create: %s", dir, strerror(errno));
		return 0;
	}
	if (!S_ISDIR(st.st_mode))
		return moet_err(MOET_EINVAL, "%s: exists and is not a directory", dir);
	DIR *d = opendir(dir);
	if (!d)
		return moet_err(MOET_EIO, "%s: %s", dir, strerror(errno));
	struct dirent *de;
	int rc = 0;
	while ((de = readdir(d)) != NULL) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!force) {
			rc = moet_err(MOET_EINVAL,
				      "%s: directory is not empty (--force writes into it)", dir);
			break;
		}
		/* NOTE: stale shards of an earlier run with more shards would otherwise stay
		 * beside the new ones; only names of our own pattern are removed. */
		if (is_shard_name(de->d_name) && unlinkat(dirfd(d), de->d_name, 0) != 0) {
			rc = moet_err(MOET_EIO, "%s/%s: cannot remove: %s", dir, de->d_name,
				      strerror(errno));
			break;
		}
	}
	closedir(d);
	return rc;
}

static int write_json(const char *dir, const char *file, json_t *root, size_t flags)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (!root)
		return moet_err(MOET_ENOMEM, "%s: out of memory building JSON", path);
	char *text = json_dumps(root, flags | JSON_REAL_PRECISION(15));
	json_decref(root);
	if (!text)
		return moet_err(MOET_ENOMEM, "%s: out of memory serializing JSON", path);
	int rc = 0;
	FILE *f = fopen(path, "w");
	if (!f) {
		rc = moet_err(MOET_EIO, "%s: cannot create: %s", path, strerror(errno));
	} else {
		if (fputs(text, f) < 0 || fputc('\n', f) == EOF)
			rc = moet_err(MOET_EIO, "%s: write failed: %s", path, strerror(errno));
		if (fclose(f) != 0 && !rc)
			rc = moet_err(MOET_EIO, "%s: write failed: %s", path, strerror(errno));
	}
	free(text);
	return rc;
}

/* ---- config.json ---- */

static json_t *config_json(const moet_config *c)
{
	json_t *q = json_pack("{s:s, s:s, s:s, s:[i,i]}", "activation_scheme", "dynamic", "fmt",
			      "e4m3", "quant_method", "fp8", "weight_block_size",
			      (json_int_t)c->fp8_block_rows, (json_int_t)c->fp8_block_cols);
	json_t *rs = json_pack("{s:s, s:f, s:I, s:f, s:f, s:f, s:f}", "type", "yarn", "factor",
			       c->rope_factor, "original_max_position_embeddings",
			       (json_int_t)c->rope_original_max_pos, "beta_fast",
			       c->rope_beta_fast, "beta_slow", c->rope_beta_slow, "mscale",
			       c->rope_mscale, "mscale_all_dim", c->rope_mscale_all_dim);
	json_t *o = json_pack(
		"{s:[s], s:b, s:f, s:f, s:I, s:I, s:I, s:I, s:s, s:I, s:f, s:I, s:I, s:I, s:I,"
		" s:s, s:I, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:I, s:I, s:I}",
		"architectures", "DeepseekV3ForCausalLM", "attention_bias", c->attention_bias,
		"attention_dropout", 0.0, "aux_loss_alpha", 0.001,
		"bos_token_id", (json_int_t)c->bos_token_id,
		"eos_token_id", (json_int_t)c->eos_token_id, "ep_size", (json_int_t)1,
		"first_k_dense_replace", (json_int_t)c->first_k_dense_replace,
		"hidden_act", c->hidden_act, "hidden_size", (json_int_t)c->hidden_size,
		"initializer_range", 0.02, "intermediate_size", (json_int_t)c->intermediate_size,
		"kv_lora_rank", (json_int_t)c->kv_lora_rank,
		"max_position_embeddings", (json_int_t)c->max_position_embeddings,
		"moe_intermediate_size", (json_int_t)c->moe_intermediate_size,
		"model_type", c->model_type, "moe_layer_freq", (json_int_t)c->moe_layer_freq,
		"n_group", (json_int_t)c->n_group,
		"n_routed_experts", (json_int_t)c->n_routed_experts,
		"n_shared_experts", (json_int_t)c->n_shared_experts,
		"num_attention_heads", (json_int_t)c->num_attention_heads,
		"norm_topk_prob", c->norm_topk_prob,
		"num_experts_per_tok", (json_int_t)c->num_experts_per_tok,
		"num_hidden_layers", (json_int_t)c->num_hidden_layers,
		"num_key_value_heads", (json_int_t)c->num_key_value_heads,
		"num_nextn_predict_layers", (json_int_t)c->num_nextn_predict_layers,
		"q_lora_rank", (json_int_t)c->q_lora_rank);
	json_t *o2 = json_pack(
		"{s:I, s:I, s:o, s:f, s:o, s:f, s:f, s:s, s:b, s:b, s:I, s:s, s:s, s:b, s:I, s:I}",
		"qk_nope_head_dim", (json_int_t)c->qk_nope_head_dim,
		"qk_rope_head_dim", (json_int_t)c->qk_rope_head_dim, "quantization_config", q,
		"rms_norm_eps", c->rms_norm_eps, "rope_scaling", rs, "rope_theta", c->rope_theta,
		"routed_scaling_factor", c->routed_scaling_factor, "scoring_func", c->scoring_func,
		"seq_aux", 1, "tie_word_embeddings", c->tie_word_embeddings,
		"topk_group", (json_int_t)c->topk_group, "topk_method", c->topk_method,
		"torch_dtype", "bfloat16", "use_cache", 1, "v_head_dim", (json_int_t)c->v_head_dim,
		"vocab_size", (json_int_t)c->vocab_size);
	if (!o || !o2 || json_object_update(o, o2)) {
		json_decref(o);
		json_decref(o2);
		return NULL;
	}
	json_decref(o2);
	return o;
}

/* ---- generator.json ---- */

static json_t *generator_json(const gen_ctx *g)
{
	const moet_config *c = &g->cfg;
	const double F = g->par.hot_share;
	const bool by_layer = g->par.layer_hot_share != NULL;
	json_t *layers = json_array();
	double sum = 0;
	for (int64_t k = 0; layers && k < g->n_moe; k++) {
		const gen_route *rt = &g->routes[k];
		json_t *hot = json_array(), *cls = json_array(), *esh = json_array();
		for (int64_t i = 0; i < rt->n_hot; i++)
			json_array_append_new(hot, json_integer(rt->hot[i]));
		for (int64_t e = 0; e < c->n_routed_experts; e++) {
			json_array_append_new(cls, json_integer(rt->expert_class[e]));
			json_array_append_new(esh, json_real(rt->expert_share[e]));
		}
		json_array_append_new(layers,
			json_pack("{s:I, s:o, s:f, s:f, s:f, s:f, s:o, s:o}", "layer",
				  (json_int_t)rt->layer, "hot_experts", hot, "bias",
				  (double)rt->bias, "target_share", rt->target, "mc_share",
				  rt->share, "mc_share_without_bias", rt->share_at_zero,
				  "expert_class", cls, "expert_share", esh));
		sum += rt->share;
	}
	json_t *skew = json_pack(
		"{s:I, s:s, s:f, s:f, s:f, s:f, s:I, s:I, s:f}", "n_classes",
		(json_int_t)g->n_classes, "class_of_token",
		"floor(token_id * n_classes / vocab_size)",
		"alpha", (double)GEN_ALPHA, "beta", (double)GEN_BETA, "sigma", (double)GEN_SIGMA,
		"noise", (double)GEN_NOISE, "mc_samples", (json_int_t)GEN_MC_SAMPLES,
		"bisect_steps", (json_int_t)GEN_BISECT_STEPS, "target_spread",
		by_layer ? 0.0 : fmin(0.1, fmin((1.0 - F) / 2.0, F / 2.0)));
	if (skew && by_layer)
		json_object_set_new(skew, "targets", json_string("hot_share_by_layer"));
	return json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:f, s:I, s:o, s:f, s:o}",
			 "generator", "moet-hybrid gen-checkpoint", "format_version", 1,
			 "preset", preset_name(g->par.preset), "seed", (json_int_t)g->par.seed,
			 "num_hidden_layers", (json_int_t)c->num_hidden_layers,
			 "n_routed_experts", (json_int_t)c->n_routed_experts,
			 "hot_count", (json_int_t)g->par.hot_count, "hot_share", F,
			 "shard_mb", (json_int_t)g->par.shard_mb, "skew_model", skew,
			 "mean_mc_share", g->n_moe ? sum / (double)g->n_moe : 0.0,
			 "layers", layers);
}

/* ---- shards ---- */

static int plan_shards(gen_ctx *g, int *out_n)
{
	const uint64_t limit = (uint64_t)g->par.shard_mb << 20;
	uint64_t cur = 0;
	int shard = 0;
	for (size_t i = 0; i < g->n_tensors;) {
		size_t j = i;
		uint64_t gb = 0;
		while (j < g->n_tensors && g->tensors[j].group == g->tensors[i].group)
			gb += g->tensors[j++].n_bytes;
		if (cur + gb <= limit || gb <= limit) {
			if (cur + gb > limit && cur > 0) {
				shard++;
				cur = 0;
			}
			for (size_t k = i; k < j; k++)
				g->tensors[k].shard = shard;
			cur += gb;
		} else {
			for (size_t k = i; k < j; k++) {
				if (cur > 0 && cur + g->tensors[k].n_bytes > limit) {
					shard++;
					cur = 0;
				}
				g->tensors[k].shard = shard;
				cur += g->tensors[k].n_bytes;
			}
		}
		i = j;
	}
	*out_n = shard + 1;
	if (*out_n > 99999)
		return moet_err(MOET_ERANGE, "%d shards exceed the 5-digit names "
				"(raise --shard-mb)", *out_n);
	return 0;
}

typedef struct prog {
	const moet_gen_params *p;
	moet_gen_progress st;
} prog;

static void on_bytes(void *ctx, uint64_t n, bool file_done)
{
	prog *pr = ctx;
	pr->st.done_bytes += n;
	pr->st.shard_done = file_done;
	if (pr->p->progress)
		pr->p->progress(pr->p->progress_ctx, &pr->st);
}

/* The st_tensor views of shard s: tensors [first, last) of the list. */
static int shard_view(const gen_ctx *g, int s, st_tensor **out, size_t *out_n)
{
	size_t first = 0;
	while (first < g->n_tensors && g->tensors[first].shard != s)
		first++;
	size_t last = first;
	while (last < g->n_tensors && g->tensors[last].shard == s)
		last++;
	st_tensor *v = malloc((last - first + 1) * sizeof(*v));
	if (!v)
		return moet_err(MOET_ENOMEM, "out of memory");
	for (size_t i = first; i < last; i++) {
		const gen_tensor *t = &g->tensors[i];
		v[i - first] = (st_tensor){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim,
					    .shape = t->shape, .rows = t->rows,
					    .row_bytes = t->row_bytes, .tensor_id = i };
	}
	*out = v;
	*out_n = last - first;
	return 0;
}

static void shard_name(char *buf, size_t n, int s, int n_shards)
{
	snprintf(buf, n, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
}

static int write_shards(gen_ctx *g, const char *dir, int n_shards)
{
	prog pr = { .p = &g->par, .st = { .n_shards = n_shards } };
	st_tensor *v = NULL;
	size_t nv = 0;
	int rc = 0;
	for (int s = 0; !rc && s < n_shards; s++) {
		uint64_t b = 0;
		rc = shard_view(g, s, &v, &nv);
		if (!rc)
			rc = st_file_bytes(v, nv, &b);
		pr.st.total_bytes += b;
		free(v);
	}
	char path[4096], name[64];
	for (int s = 0; !rc && s < n_shards; s++) {
		rc = shard_view(g, s, &v, &nv);
		if (rc)
			break;
		shard_name(name, sizeof(name), s, n_shards);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		pr.st.shard = s + 1;
		rc = st_write_file(path, v, nv, gen_fill_rows, g, g->n_threads, on_bytes, &pr);
		free(v);
	}
	return rc;
}

static json_t *index_json(const gen_ctx *g, int n_shards)
{
	json_t *wm = json_object();
	uint64_t total = 0;
	char name[64];
	for (size_t i = 0; wm && i < g->n_tensors; i++) {
		shard_name(name, sizeof(name), g->tensors[i].shard, n_shards);
		if (json_object_set_new(wm, g->tensors[i].name, json_string(name))) {
			json_decref(wm);
			return NULL;
		}
		total += g->tensors[i].n_bytes;
	}
	return json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
			 "weight_map", wm);
}

int moet_gen_checkpoint(const char *dir, const moet_gen_params *p)
{
	gen_ctx g;
	memset(&g, 0, sizeof(g));
	int n_shards = 0;
	int rc = moet_gen_config(p, &g.cfg);
	if (rc)
		return rc;
	g.par = *p;
	if (g.par.layer_hot_share) { /* checked by moet_gen_config: one per MoE layer */
		double sum = 0;
		for (int64_t k = 0; k < g.par.n_layer_hot_share; k++)
			sum += g.par.layer_hot_share[k];
		g.par.hot_share = sum / (double)g.par.n_layer_hot_share;
	}
	if (g.par.hot_count == 0) {
		g.par.hot_count = llround((double)g.cfg.n_routed_experts * 120.0 / 384.0);
		if (g.par.hot_count < 1)
			g.par.hot_count = 1;
	}
	g.n_threads = p->n_threads;
	if (g.n_threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		g.n_threads = n < 1 ? 1 : n > 8 ? 8 : (int)n;
	}
	g.n_classes = g.cfg.vocab_size < GEN_MAX_CLASSES ? (int)g.cfg.vocab_size
							 : GEN_MAX_CLASSES;
	rc = prepare_dir(dir, p->force);
	if (!rc)
		rc = gen_tables_init(&g);
	if (!rc)
		rc = gen_tensors_build(&g);
	if (!rc)
		rc = gen_route_calibrate(&g);
	if (!rc)
		rc = plan_shards(&g, &n_shards);
	if (!rc)
		rc = write_json(dir, "config.json", config_json(&g.cfg),
				JSON_INDENT(2) | JSON_SORT_KEYS);
	if (!rc)
		rc = write_json(dir, "generator.json", generator_json(&g),
				JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	if (!rc)
		rc = write_shards(&g, dir, n_shards);
	if (!rc)
		rc = write_json(dir, "model.safetensors.index.json", index_json(&g, n_shards),
				JSON_INDENT(2) | JSON_SORT_KEYS);
	gen_route_free(&g);
	free(g.tensors);
	free(g.class_dir);
	free(g.e4m3_table);
	free(g.gauss_table);
	return rc;
}
