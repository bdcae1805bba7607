/*
 * cli_inspect.c: `moet-hybrid inspect --model DIR [--validate] [--json]`.
 *
 * Opens config.json and the checkpoint (both fully validated by their readers), then sorts
 * every tensor into one part by its name in the published DeepSeek-V3 layout:
 *
 *   model.embed_tokens.weight                         embedding
 *   lm_head.weight                                    lm_head
 *   model.norm.weight, *layernorm*                    norms
 *   model.layers.L.self_attn.* (not the layernorms)   attention
 *   model.layers.L.mlp.{gate,up,down}_proj.*          dense_mlp
 *   model.layers.L.mlp.gate.*                         router
 *   model.layers.L.mlp.shared_experts.*               shared_experts
 *   model.layers.L.mlp.experts.E.*                    routed_experts
 *   model.layers.L.* with L >= num_hidden_layers      mtp (multi-token prediction: skipped)
 *   anything else                                     other
 *
 * and sums bytes per part and per layer (attention, norms, MLP/MoE, routed experts found,
 * bytes of one expert). --validate then reads every F8_E4M3, BF16, F16 and F32 tensor and
 * reports the first NaN code / non-finite value of each. Text output uses the JSON key names
 * so that both forms are easy to grep and parse.
 *
 * --placement FILE prints the per-GPU memory plan of a placement file instead (placement/,
 * docs/placement.md): per GPU the experts it holds (count, per layer min-max), expert, dense
 * and reserve bytes, the total against the budget, and the CPU tier; sizes are the
 * checkpoint's (--model DIR) or computed from a gen-checkpoint preset's geometry (--preset
 * NAME, for models not on disk). An invalid file, or a GPU over budget, exits 1 with the
 * file's one-line error (after the table, for a GPU over budget).
 */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_placement.h"

#define P_COUNT MOET_PART_COUNT
#define part_names moet_part_names

typedef struct layer_sum {
	uint64_t attn_bytes, norm_bytes, mlp_bytes;
	uint64_t *expert_bytes;   /* [n_routed_experts], 0: expert absent */
	int64_t n_experts;        /* experts with at least one tensor */
	uint64_t exp_min, exp_max;/* bytes of one expert, over the experts present */
} layer_sum;

typedef struct mtp_sum {
	int64_t layer;
	int64_t n_tensors;
	uint64_t bytes;
} mtp_sum;

typedef struct summary {
	uint64_t part_bytes[P_COUNT];
	int64_t part_tensors[P_COUNT];
	layer_sum *layers;        /* [num_hidden_layers] */
	mtp_sum *mtp;
	int64_t n_mtp;
	uint64_t data_bytes, shard_bytes;
	uint64_t exp_min, exp_max;/* one routed expert, over all MoE layers */
} summary;

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid inspect --model DIR [--validate] [--json]\n"
		   "       moet-hybrid inspect --model DIR|--preset NAME --placement FILE "
		   "[--json]\n"
		   "  --model DIR   checkpoint directory (config.json + safetensors shards)\n"
		   "  --validate    also scan every FP8/BF16/F16/F32 tensor for NaN/Inf values\n"
		   "  --json        print the summary as one JSON object\n"
		   "  --placement FILE  print the per-GPU memory plan of a placement file\n"
		   "  --preset NAME     with --placement: sizes from the geometry of a\n"
		   "                    gen-checkpoint preset (tiny, kimi-k2) instead of --model\n"
		   "exit status: 0 ok, 1 error (one line on stderr)\n");
}

static int add_mtp(summary *S, int64_t layer, uint64_t bytes)
{
	for (int64_t i = 0; i < S->n_mtp; i++)
		if (S->mtp[i].layer == layer) {
			S->mtp[i].n_tensors++;
			S->mtp[i].bytes += bytes;
			return 0;
		}
	mtp_sum *m = realloc(S->mtp, (size_t)(S->n_mtp + 1) * sizeof(*m));
	if (!m)
		return moet_err(MOET_ENOMEM, "out of memory");
	S->mtp = m;
	m[S->n_mtp++] = (mtp_sum){ layer, 1, bytes };
	return 0;
}

/* Sorts one tensor into its part (and layer). */
static int classify(summary *S, const moet_config *cf, const moet_tensor *t)
{
	uint64_t b = t->n_bytes;
	int64_t L, E;
	moet_part p = moet_tensor_part(t->name, cf->num_hidden_layers, &L, &E);
	if (p == MOET_PART_MTP) {
		int rc = add_mtp(S, L, b);
		if (rc)
			return rc;
	} else if (L >= 0) {
		layer_sum *ls = &S->layers[L];
		if (p == MOET_PART_NORM)
			ls->norm_bytes += b;
		else if (p == MOET_PART_ATTN)
			ls->attn_bytes += b;
		else if (p == MOET_PART_EXPERT || p == MOET_PART_SHARED || p == MOET_PART_ROUTER ||
			 p == MOET_PART_DENSE_MLP)
			ls->mlp_bytes += b;
		if (p == MOET_PART_EXPERT && E < cf->n_routed_experts)
			ls->expert_bytes[E] += b;
	}
	S->part_bytes[p] += b;
	S->part_tensors[p]++;
	S->data_bytes += b;
	return 0;
}

static int summarize(const moet_config *cf, const moet_ckpt *ck, summary *S)
{
	memset(S, 0, sizeof(*S));
	S->layers = calloc((size_t)cf->num_hidden_layers, sizeof(*S->layers));
	if (!S->layers)
		return moet_err(MOET_ENOMEM, "out of memory");
	for (int64_t l = 0; l < cf->num_hidden_layers; l++) {
		S->layers[l].expert_bytes = calloc((size_t)cf->n_routed_experts, sizeof(uint64_t));
		if (!S->layers[l].expert_bytes)
			return moet_err(MOET_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		int rc = classify(S, cf, moet_ckpt_at(ck, i));
		if (rc)
			return rc;
	}
	for (int s = 0; s < moet_ckpt_shard_count(ck); s++)
		S->shard_bytes += moet_ckpt_shard_bytes(ck, s);
	S->exp_min = UINT64_MAX;
	for (int64_t l = 0; l < cf->num_hidden_layers; l++) {
		layer_sum *ls = &S->layers[l];
		ls->exp_min = UINT64_MAX;
		for (int64_t e = 0; e < cf->n_routed_experts; e++) {
			uint64_t x = ls->expert_bytes[e];
			if (!x)
				continue;
			ls->n_experts++;
			ls->exp_min = x < ls->exp_min ? x : ls->exp_min;
			ls->exp_max = x > ls->exp_max ? x : ls->exp_max;
		}
		if (!ls->n_experts)
			ls->exp_min = 0;
		else {
			S->exp_min = ls->exp_min < S->exp_min ? ls->exp_min : S->exp_min;
			S->exp_max = ls->exp_max > S->exp_max ? ls->exp_max : S->exp_max;
		}
	}
	if (S->exp_min == UINT64_MAX)
		S->exp_min = 0;
	return 0;
}

static void summary_free(summary *S, const moet_config *cf)
{
	if (S->layers)
		for (int64_t l = 0; l < cf->num_hidden_layers; l++)
			free(S->layers[l].expert_bytes);
	free(S->layers);
	free(S->mtp);
}

/* ---- validate ------------------------------------------------------------------------ */

typedef struct bad_value {
	const char *tensor;
	int64_t index;
	char what[48];
} bad_value;

/* First NaN/Inf element of t, or -1. */
static int64_t first_bad(const moet_tensor *t, char *what, size_t n)
{
	const uint8_t *p = t->data;
	switch (t->dtype) {
	case MOET_DT_F8_E4M3:
		for (int64_t i = 0; i < t->numel; i++)
			if ((p[i] & 0x7F) == 0x7F) {
				snprintf(what, n, "NaN code 0x%02X", p[i]);
				return i;
			}
		return -1;
	case MOET_DT_BF16:
	case MOET_DT_F16: {
		const uint16_t *h = t->data;
		uint16_t m = t->dtype == MOET_DT_BF16 ? 0x7F80 : 0x7C00;
		for (int64_t i = 0; i < t->numel; i++)
			if ((h[i] & m) == m) {
				snprintf(what, n, "non-finite (0x%04X)", h[i]);
				return i;
			}
		return -1;
	}
	case MOET_DT_F32: {
		const uint32_t *w = t->data;
		for (int64_t i = 0; i < t->numel; i++)
			if ((w[i] & 0x7F800000u) == 0x7F800000u) {
				snprintf(what, n, "non-finite (0x%08" PRIX32 ")", w[i]);
				return i;
			}
		return -1;
	}
	default:
		return -1;
	}
}

static int validate(const moet_ckpt *ck, bad_value **out_bad, int64_t *out_n,
		    int64_t *out_scanned)
{
	bad_value *bad = NULL;
	int64_t nb = 0, scanned = 0;
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		if (t->dtype != MOET_DT_F8_E4M3 && t->dtype != MOET_DT_BF16 &&
		    t->dtype != MOET_DT_F16 && t->dtype != MOET_DT_F32)
			continue;
		scanned++;
		bad_value bv = { t->name, 0, "" };
		bv.index = first_bad(t, bv.what, sizeof(bv.what));
		if (bv.index < 0)
			continue;
		bad_value *nbv = realloc(bad, (size_t)(nb + 1) * sizeof(*bad));
		if (!nbv) {
			free(bad);
			return moet_err(MOET_ENOMEM, "out of memory");
		}
		bad = nbv;
		bad[nb++] = bv;
	}
	*out_bad = bad;
	*out_n = nb;
	*out_scanned = scanned;
	return 0;
}

/* ---- output -------------------------------------------------------------------------- */

static double gib(uint64_t b)
{
	return (double)b / (double)(1ull << 30);
}

static const char *rope_name(const moet_config *cf)
{
	return cf->rope_type == MOET_ROPE_YARN ? "yarn" : "default";
}

static void print_text(const char *dir, const moet_config *cf, const moet_ckpt *ck,
		       const summary *S)
{
	printf("model: %s\n", dir);
	printf("model_type: %s  weights: %s\n", cf->model_type,
	       cf->fp8 ? "fp8 e4m3 with block scales" : "unquantized");
	if (cf->fp8)
		printf("fp8_block: %" PRId64 "x%" PRId64 "\n", cf->fp8_block_rows,
		       cf->fp8_block_cols);
	printf("geometry: vocab_size %" PRId64 ", hidden_size %" PRId64 ", num_hidden_layers %"
	       PRId64 " (first_k_dense_replace %" PRId64 ", moe_layer_freq %" PRId64 ")\n",
	       cf->vocab_size, cf->hidden_size, cf->num_hidden_layers, cf->first_k_dense_replace,
	       cf->moe_layer_freq);
	printf("  attention: heads %" PRId64 ", q_lora_rank %" PRId64 ", kv_lora_rank %" PRId64
	       ", qk_nope_head_dim %" PRId64 ", qk_rope_head_dim %" PRId64 ", v_head_dim %"
	       PRId64 "\n", cf->num_attention_heads, cf->q_lora_rank, cf->kv_lora_rank,
	       cf->qk_nope_head_dim, cf->qk_rope_head_dim, cf->v_head_dim);
	printf("  mlp: intermediate_size %" PRId64 ", moe_intermediate_size %" PRId64
	       ", n_routed_experts %" PRId64 " (top %" PRId64 ", n_group %" PRId64
	       ", topk_group %" PRId64 "), n_shared_experts %" PRId64 "\n",
	       cf->intermediate_size, cf->moe_intermediate_size, cf->n_routed_experts,
	       cf->num_experts_per_tok, cf->n_group, cf->topk_group, cf->n_shared_experts);
	printf("  rope: %s, theta %g, factor %g, max_position_embeddings %" PRId64
	       ", num_nextn_predict_layers %" PRId64 "\n", rope_name(cf), cf->rope_theta,
	       cf->rope_factor, cf->max_position_embeddings, cf->num_nextn_predict_layers);
	printf("shards: %d\nshard_bytes: %" PRIu64 " (%.2f GiB)\n", moet_ckpt_shard_count(ck),
	       S->shard_bytes, gib(S->shard_bytes));
	printf("tensors: %zu\ndata_bytes: %" PRIu64 " (%.2f GiB)\n", moet_ckpt_count(ck),
	       S->data_bytes, gib(S->data_bytes));
	printf("bytes by part:\n");
	for (int p = 0; p < P_COUNT; p++)
		printf("  %-16s %16" PRIu64 " bytes %10.3f GiB %8" PRId64 " tensors\n",
		       part_names[p], S->part_bytes[p], gib(S->part_bytes[p]), S->part_tensors[p]);
	printf("per layer:\n  %5s %-5s %14s %12s %16s %8s %s\n", "layer", "kind", "attention",
	       "norms", "mlp", "experts", "bytes/expert");
	for (int64_t l = 0; l < cf->num_hidden_layers; l++) {
		const layer_sum *ls = &S->layers[l];
		printf("  %5" PRId64 " %-5s %14" PRIu64 " %12" PRIu64 " %16" PRIu64 " %8" PRId64,
		       l, moet_config_is_moe_layer(cf, l) ? "moe" : "dense", ls->attn_bytes,
		       ls->norm_bytes, ls->mlp_bytes, ls->n_experts);
		if (ls->exp_min == ls->exp_max)
			printf(" %" PRIu64 "\n", ls->exp_min);
		else
			printf(" %" PRIu64 "-%" PRIu64 "\n", ls->exp_min, ls->exp_max);
	}
	printf("mtp_layers (skipped): %" PRId64 "\n", S->n_mtp);
	for (int64_t i = 0; i < S->n_mtp; i++)
		printf("  layer %" PRId64 ": %" PRId64 " tensors, %" PRIu64 " bytes\n",
		       S->mtp[i].layer, S->mtp[i].n_tensors, S->mtp[i].bytes);
	if (S->exp_min == S->exp_max)
		printf("routed_expert_bytes: %" PRIu64 " (gate+up+down with scales)\n", S->exp_min);
	else
		printf("routed_expert_bytes: %" PRIu64 "-%" PRIu64 " (varies by layer/expert)\n",
		       S->exp_min, S->exp_max);
}

static json_t *summary_json(const char *dir, const moet_config *cf, const moet_ckpt *ck,
			    const summary *S)
{
	json_t *o = json_object(), *g = json_object(), *parts = json_object();
	json_t *layers = json_array(), *mtp = json_array();
	if (!o || !g || !parts || !layers || !mtp) {
		json_decref(o);
		json_decref(g);
		json_decref(parts);
		json_decref(layers);
		json_decref(mtp);
		return NULL;
	}
	json_object_set_new(o, "model", json_string(dir));
	json_object_set_new(o, "model_type", json_string(cf->model_type));
	json_object_set_new(o, "fp8", json_boolean(cf->fp8));
#define G(x) json_object_set_new(g, #x, json_integer(cf->x))
	G(vocab_size); G(hidden_size); G(intermediate_size); G(moe_intermediate_size);
	G(num_hidden_layers); G(num_attention_heads); G(num_key_value_heads);
	G(n_shared_experts); G(n_routed_experts); G(num_experts_per_tok); G(n_group);
	G(topk_group); G(first_k_dense_replace); G(moe_layer_freq); G(num_nextn_predict_layers);
	G(q_lora_rank); G(kv_lora_rank); G(qk_nope_head_dim); G(qk_rope_head_dim); G(v_head_dim);
	G(max_position_embeddings);
#undef G
	json_object_set_new(g, "rope_type", json_string(rope_name(cf)));
	json_object_set_new(g, "rope_theta", json_real(cf->rope_theta));
	json_object_set_new(o, "geometry", g);
	json_object_set_new(o, "shards", json_integer(moet_ckpt_shard_count(ck)));
	json_object_set_new(o, "shard_bytes", json_integer((json_int_t)S->shard_bytes));
	json_object_set_new(o, "tensors", json_integer((json_int_t)moet_ckpt_count(ck)));
	json_object_set_new(o, "data_bytes", json_integer((json_int_t)S->data_bytes));
	for (int p = 0; p < P_COUNT; p++)
		json_object_set_new(parts, part_names[p],
				    json_integer((json_int_t)S->part_bytes[p]));
	json_object_set_new(o, "parts", parts);
	for (int64_t l = 0; l < cf->num_hidden_layers; l++) {
		const layer_sum *ls = &S->layers[l];
		json_t *x = json_pack("{sI ss sI sI sI sI sI sI}", "layer", (json_int_t)l, "kind",
				      moet_config_is_moe_layer(cf, l) ? "moe" : "dense",
				      "attention_bytes", (json_int_t)ls->attn_bytes,
				      "norm_bytes", (json_int_t)ls->norm_bytes,
				      "mlp_bytes", (json_int_t)ls->mlp_bytes,
				      "routed_experts", (json_int_t)ls->n_experts,
				      "expert_bytes_min", (json_int_t)ls->exp_min,
				      "expert_bytes_max", (json_int_t)ls->exp_max);
		json_array_append_new(layers, x);
	}
	json_object_set_new(o, "layers", layers);
	for (int64_t i = 0; i < S->n_mtp; i++)
		json_array_append_new(mtp, json_pack("{sI sI sI}", "layer",
						     (json_int_t)S->mtp[i].layer, "tensors",
						     (json_int_t)S->mtp[i].n_tensors, "bytes",
						     (json_int_t)S->mtp[i].bytes));
	json_object_set_new(o, "mtp_layers", mtp);
	json_object_set_new(o, "routed_expert_bytes_min", json_integer((json_int_t)S->exp_min));
	json_object_set_new(o, "routed_expert_bytes_max", json_integer((json_int_t)S->exp_max));
	return o;
}

/* ---- placement plan ------------------------------------------------------------------- */

static json_t *usage_json(const char *name, const moet_placement_usage *u, bool gpu)
{
	json_t *o = json_pack("{sI sI sI sI sI}", "experts", (json_int_t)u->n_experts,
			      "per_layer_min", (json_int_t)u->min_per_layer,
			      "per_layer_max", (json_int_t)u->max_per_layer,
			      "expert_bytes", (json_int_t)u->expert_bytes,
			      "dense_bytes", (json_int_t)u->dense_bytes);
	if (o && gpu) {
		json_object_set_new(o, "name", json_string(name));
		json_object_set_new(o, "reserve_bytes", json_integer((json_int_t)u->reserve_bytes));
		json_object_set_new(o, "total_bytes", json_integer((json_int_t)u->total_bytes));
		json_object_set_new(o, "budget_bytes", json_integer((json_int_t)u->budget_bytes));
		json_object_set_new(o, "fits", json_boolean(u->total_bytes <= u->budget_bytes));
	}
	return o;
}

static void print_usage_row(const char *name, const moet_placement_usage *u, bool gpu)
{
	char per[48];
	snprintf(per, sizeof(per), "%" PRId64 "-%" PRId64, u->min_per_layer, u->max_per_layer);
	printf("  %-10s %8" PRId64 " %9s %11.3f %9.3f", name, u->n_experts, per,
	       gib(u->expert_bytes), gib(u->dense_bytes));
	if (!gpu) {
		printf("\n");
		return;
	}
	bool fits = u->total_bytes <= u->budget_bytes;
	double room = fits ? gib(u->budget_bytes - u->total_bytes)
			   : -gib(u->total_bytes - u->budget_bytes);
	printf(" %11.3f %9.3f %10.3f %9.3f  %s\n", gib(u->reserve_bytes), gib(u->total_bytes),
	       gib(u->budget_bytes), room, fits ? "ok" : "OVER BUDGET");
}

/* Prints the plan of `pl` at the sizes `sz`; `source` says where the sizes come from. */
static int print_plan(const moet_placement *pl, const moet_placement_sizes *sz,
		      const moet_config *cf, const char *source, bool as_json)
{
	const int n_gpus = moet_placement_n_gpus(pl);
	const int dg = moet_placement_dense_gpu(pl);
	uint64_t emin = UINT64_MAX, emax = 0;
	int64_t n_moe = 0;
	for (int64_t l = 0; l < sz->n_layers; l++) {
		if (!moet_config_is_moe_layer(cf, l))
			continue;
		n_moe++;
		for (int64_t e = 0; e < sz->n_experts; e++) {
			uint64_t b = sz->expert_bytes[l * sz->n_experts + e];
			emin = b < emin ? b : emin;
			emax = b > emax ? b : emax;
		}
	}
	if (emin == UINT64_MAX)
		emin = 0;
	const char *dense = dg == MOET_PLACEMENT_DENSE_SPLIT ? "split"
				: moet_placement_gpu_at(pl, dg)->name;
	moet_placement_usage u;
	int rc;
	if (as_json) {
		json_t *o = json_object(), *gpus = json_array();
		if (!o || !gpus) {
			json_decref(o);
			json_decref(gpus);
			return moet_err(MOET_ENOMEM, "out of memory");
		}
		json_object_set_new(o, "placement", json_string(moet_placement_label(pl)));
		json_object_set_new(o, "sizes_from", json_string(source));
		json_object_set_new(o, "moe_layers", json_integer(n_moe));
		/* prefill staging's slots on the first GPU (runtime/stage.c), from its reserve */
		if (n_gpus)
			json_object_set_new(o, "stage_slot_bytes",
					    json_pack("{s:I, s:I}", "pinned",
						      (json_int_t)(MOET_STAGE_SLOTS_PINNED * emax),
						      "driver",
						      (json_int_t)(MOET_STAGE_SLOTS_DRIVER * emax)));
		json_object_set_new(o, "n_routed_experts", json_integer(sz->n_experts));
		json_object_set_new(o, "expert_bytes_min", json_integer((json_int_t)emin));
		json_object_set_new(o, "expert_bytes_max", json_integer((json_int_t)emax));
		json_object_set_new(o, "dense_bytes", json_integer((json_int_t)sz->dense_bytes));
		json_object_set_new(o, "dense", json_string(dense));
		for (int g = 0; g < n_gpus; g++) {
			if ((rc = moet_placement_usage_of(pl, sz, g, &u))) {
				json_decref(o);
				json_decref(gpus);
				return rc;
			}
			json_array_append_new(gpus, usage_json(moet_placement_gpu_at(pl, g)->name,
							       &u, true));
		}
		json_object_set_new(o, "gpus", gpus);
		if ((rc = moet_placement_usage_of(pl, sz, MOET_PLACEMENT_CPU, &u))) {
			json_decref(o);
			return rc;
		}
		json_object_set_new(o, "cpu", usage_json("cpu", &u, false));
		json_dumpf(o, stdout, JSON_INDENT(2));
		fputc('\n', stdout);
		json_decref(o);
		return 0;
	}
	printf("placement: %s\n", moet_placement_label(pl));
	printf("sizes: %s\n", source);
	printf("moe_layers: %" PRId64 " of %" PRId64 ", n_routed_experts %" PRId64
	       ", expert_bytes %" PRIu64, n_moe, sz->n_layers, sz->n_experts, emin);
	if (emax != emin)
		printf("-%" PRIu64, emax);
	printf(" (%.2f MiB, gate+up+down with scales)\n", (double)emax / (1 << 20));
	printf("dense_bytes: %" PRIu64 " (%.3f GiB: embedding %.3f, lm_head %.3f, attention %.3f,"
	       " norms %.3f, dense_mlp %.3f, router %.3f, shared_experts %.3f, other %.3f)\n",
	       sz->dense_bytes, gib(sz->dense_bytes), gib(sz->embed_bytes), gib(sz->lm_head_bytes),
	       gib(sz->attn_bytes), gib(sz->norm_bytes), gib(sz->dense_mlp_bytes),
	       gib(sz->router_bytes), gib(sz->shared_bytes), gib(sz->other_bytes));
	printf("dense: %s%s\n", dense,
	       dg != MOET_PLACEMENT_DENSE_SPLIT || n_gpus == 1 ? (n_gpus ? "" : " (no GPU: on the CPU)")
	       : n_gpus <= MOET_PLACEMENT_TP_MAX
		       ? " (tensor-parallel: each GPU its rows of the split matrices, the first GPU "
			 "also the embedding and what stays whole)"
		       : " (an even share on every GPU: more GPUs than the split spans)");
	printf("  %-10s %8s %9s %11s %9s %11s %9s %10s %9s\n", "tier", "experts", "per_layer",
	       "expert_GiB", "dense_GiB", "reserve_GiB", "total_GiB", "budget_GiB", "free_GiB");
	for (int g = 0; g < n_gpus; g++) {
		if ((rc = moet_placement_usage_of(pl, sz, g, &u)))
			return rc;
		print_usage_row(moet_placement_gpu_at(pl, g)->name, &u, true);
	}
	if ((rc = moet_placement_usage_of(pl, sz, MOET_PLACEMENT_CPU, &u)))
		return rc;
	print_usage_row("cpu", &u, false);
	printf("cpu_expert_bytes: %" PRIu64 " (%.3f GiB)\n", u.expert_bytes, gib(u.expert_bytes));
	if (n_gpus)
		printf("prefill staging: %s also holds %d slots of one expert (%.3f GiB, "
		       "MOET_STAGE_COPY=pinned, the default) or %d (%.3f GiB, driver) once a long "
		       "prefill stages a cold expert; none with MOET_PREFILL_STAGE=0: keep them in "
		       "its reserve\n", moet_placement_gpu_at(pl, 0)->name, MOET_STAGE_SLOTS_PINNED,
		       gib(MOET_STAGE_SLOTS_PINNED * emax), MOET_STAGE_SLOTS_DRIVER,
		       gib(MOET_STAGE_SLOTS_DRIVER * emax));
	return 0;
}

/* inspect --placement: sizes from the checkpoint (dir) or the preset's geometry. */
static int inspect_placement(const char *cmd, const char *dir, const char *preset,
			     const char *file, bool as_json)
{
	moet_config cf;
	moet_ckpt *ck = NULL;
	moet_placement_sizes *sz = NULL;
	moet_placement *pl = NULL;
	char source[512];
	int rc;
	if (dir && preset)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "--model and --preset exclude each "
						   "other"));
	if (!dir && !preset)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "--placement needs --model DIR or "
						   "--preset NAME"));
	if (preset) {
		moet_gen_params gp;
		moet_gen_params_init(&gp);
		if ((rc = moet_gen_preset_parse(preset, &gp.preset)) ||
		    (rc = moet_gen_config(&gp, &cf)) ||
		    (rc = moet_placement_sizes_from_config(&cf, &sz)))
			goto fail;
		snprintf(source, sizeof(source), "computed from the geometry of preset %s", preset);
	} else {
		if ((rc = moet_config_load(dir, &cf)) || (rc = moet_ckpt_open(dir, &ck)) ||
		    (rc = moet_placement_sizes_from_ckpt(&cf, ck, &sz)))
			goto fail;
		snprintf(source, sizeof(source), "the checkpoint %s", dir);
	}
	if ((rc = moet_placement_load(file, &cf, NULL, &pl)) ||
	    (rc = print_plan(pl, sz, &cf, source, as_json)))
		goto fail;
	fflush(stdout);
	rc = moet_placement_check(pl, sz);
fail:
	moet_placement_free(pl);
	moet_placement_sizes_free(sz);
	moet_ckpt_close(ck);
	return rc ? moet_cli_fail(cmd, rc) : 0;
}

int moet_cli_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "validate", no_argument, NULL, 'v' },
		{ "json", no_argument, NULL, 'j' },
		{ "placement", required_argument, NULL, 'p' },
		{ "preset", required_argument, NULL, 'P' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *cmd = argv[0], *dir = NULL, *placement = NULL, *preset = NULL;
	bool do_validate = false, as_json = false;
	int c, rc = 0, status = 1;
	moet_config cf;
	moet_ckpt *ck = NULL;
	summary S;
	bad_value *bad = NULL;
	int64_t n_bad = 0, scanned = 0;
	json_t *js = NULL;

	memset(&S, 0, sizeof(S));
	memset(&cf, 0, sizeof(cf));
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":m:vjp:P:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': dir = optarg; break;
		case 'p': placement = optarg; break;
		case 'P': preset = optarg; break;
		case 'v': do_validate = true; break;
		case 'j': as_json = true; break;
		case 'h': usage(stdout); return 0;
		case ':':
			return moet_cli_fail(cmd, moet_err(MOET_EINVAL,
							   "option %s needs an argument",
							   argv[optind - 1]));
		default:
			return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "unknown option %s (see "
							   "--help)", argv[optind - 1]));
		}
	}
	if (optind < argc)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "unexpected argument %s",
						   argv[optind]));
	if (placement && do_validate)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "--validate and --placement are "
						   "separate runs"));
	if (placement)
		return inspect_placement(cmd, dir, preset, placement, as_json);
	if (preset)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "--preset goes with --placement"));
	if (!dir)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "--model DIR is required"));

	if ((rc = moet_config_load(dir, &cf)) || (rc = moet_ckpt_open(dir, &ck)))
		goto fail;
	if ((rc = summarize(&cf, ck, &S)))
		goto fail;
	if (do_validate && (rc = validate(ck, &bad, &n_bad, &scanned)))
		goto fail;
	if (as_json) {
		js = summary_json(dir, &cf, ck, &S);
		if (!js) {
			rc = moet_err(MOET_ENOMEM, "out of memory");
			goto fail;
		}
		if (do_validate) {
			json_t *arr = json_array();
			for (int64_t i = 0; i < n_bad; i++)
				json_array_append_new(arr, json_pack("{ss sI ss}", "tensor",
								     bad[i].tensor, "index",
								     (json_int_t)bad[i].index,
								     "problem", bad[i].what));
			json_object_set_new(js, "validate", json_pack("{sI so}", "scanned",
								      (json_int_t)scanned, "bad",
								      arr));
		}
		json_dumpf(js, stdout, JSON_INDENT(2));
		fputc('\n', stdout);
	} else {
		print_text(dir, &cf, ck, &S);
		if (do_validate) {
			for (int64_t i = 0; i < n_bad; i++)
				printf("invalid: tensor %s: element %" PRId64 ": %s\n",
				       bad[i].tensor, bad[i].index, bad[i].what);
			printf("validate: %" PRId64 " tensors scanned, %" PRId64 " with NaN/Inf\n",
			       scanned, n_bad);
		}
	}
	fflush(stdout);
	if (n_bad > 0) {
		rc = moet_err(MOET_EFORMAT, "%s: %" PRId64 " tensors hold NaN/Inf values (first: "
			      "tensor %s element %" PRId64 ": %s)", dir, n_bad, bad[0].tensor,
			      bad[0].index, bad[0].what);
		goto fail;
	}
	status = 0;
fail:
	if (rc)
		status = moet_cli_fail(cmd, rc);
	json_decref(js);
	free(bad);
	summary_free(&S, &cf);
	moet_ckpt_close(ck);
	return status;
}
