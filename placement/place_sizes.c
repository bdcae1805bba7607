/*
 * place_sizes.c: the byte sizes of a model's parts, from a checkpoint or from its geometry.
 *
 * From a checkpoint, each tensor is sorted by its name in the published DeepSeek-V3 layout:
 *
 *   model.embed_tokens.weight                          embed
 *   lm_head.weight                                     lm_head
 *   model.norm.weight, model.layers.L.*layernorm*      norm
 *   model.layers.L.self_attn.*                         attn
 *   model.layers.L.mlp.{gate,up,down}_proj.*           dense_mlp
 *   model.layers.L.mlp.gate.*                          router
 *   model.layers.L.mlp.shared_experts.*                shared
 *   model.layers.L.mlp.experts.E.*                     expert_bytes[L][E]
 *   model.layers.L.* with L >= num_hidden_layers       mtp (not loaded: counted apart)
 *   anything else                                      other (counted with the dense part)
 *
 * From the geometry, the same parts are computed for the layout gen-checkpoint writes and the
 * published checkpoints have: a linear weight [r, c] is r*c F8_E4M3 bytes plus F32 block
 * scales [ceil(r/br), ceil(c/bc)] when config.json has an fp8 quantization_config, else r*c
 * BF16. A Kimi-K2 expert: 3 x (2048 x 7168 + 16 x 56 x 4) = 44,050,944 bytes.
 * NOTE: the two paths are independent on purpose; tests/placement checks that they agree on a
 * generated checkpoint.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_placement.h"
#include "moet_tpsplit.h"

void moet_placement_sizes_free(moet_placement_sizes *sz)
{
	if (!sz)
		return;
	free(sz->expert_bytes);
	free(sz);
}

static int sizes_alloc(const moet_config *cf, moet_placement_sizes **out)
{
	*out = NULL;
	if (cf->num_hidden_layers <= 0 || cf->n_routed_experts < 0 ||
	    cf->num_hidden_layers > (1 << 20) || cf->n_routed_experts > (1 << 20))
		return moet_err(MOET_EINVAL, "geometry out of range (%" PRId64 " layers, %" PRId64
				" experts)", cf->num_hidden_layers, cf->n_routed_experts);
	moet_placement_sizes *sz = calloc(1, sizeof(*sz));
	size_t n = (size_t)cf->num_hidden_layers * (size_t)cf->n_routed_experts;
	if (!sz || !(sz->expert_bytes = calloc(n ? n : 1, sizeof(uint64_t)))) {
		free(sz);
		return moet_err(MOET_ENOMEM, "out of memory");
	}
	sz->n_layers = cf->num_hidden_layers;
	sz->n_experts = cf->n_routed_experts;
	*out = sz;
	return 0;
}

static void sum_dense(moet_placement_sizes *sz)
{
	sz->dense_bytes = sz->embed_bytes + sz->lm_head_bytes + sz->attn_bytes + sz->norm_bytes +
			  sz->dense_mlp_bytes + sz->router_bytes + sz->shared_bytes +
			  sz->other_bytes;
}

/* Adds to tp_bytes[n][r] each rank's slice of a [rows x cols] matrix split over n ranks. */
static void tp_add(moet_placement_sizes *sz, int64_t rows, int64_t cols, int fp8,
		   int64_t n_heads, int64_t head_rows)
{
	int64_t r0[MOET_PLACEMENT_TP_MAX + 1];
	const uint64_t esz = fp8 ? 1 : 2, cblocks = (uint64_t)((cols + 127) / 128);
	for (int n = 2; n <= MOET_PLACEMENT_TP_MAX; n++) {
		(void)moet_tp_row_split(rows, fp8, n, n_heads, head_rows, r0);
		for (int r = 0; r < n; r++) {
			const uint64_t rr = (uint64_t)(r0[r + 1] - r0[r]);
			sz->tp_bytes[n][r] += rr * (uint64_t)cols * esz +
					      (fp8 ? 4 * ((rr + 127) / 128) * cblocks : 0);
		}
	}
}

/* The split's per-rank bytes and the part left whole (after sum_dense), from the geometry:
 * the engine's split with the attention by heads (the default). */
static void sum_tp(moet_placement_sizes *sz, const moet_config *cf)
{
	const int64_t H = cf->hidden_size, nh = cf->num_attention_heads, QL = cf->q_lora_rank;
	const int64_t qk = moet_config_qk_head_dim(cf), kvh = cf->qk_nope_head_dim + cf->v_head_dim;
	const int64_t S = cf->n_shared_experts * cf->moe_intermediate_size;
	const int fp8 = cf->fp8;
	for (int64_t l = 0; l < sz->n_layers; l++) {
		tp_add(sz, nh * qk, QL > 0 ? QL : H, fp8, nh, qk);
		tp_add(sz, nh * kvh, cf->kv_lora_rank, fp8, nh, kvh);
		tp_add(sz, H, nh * cf->v_head_dim, fp8, 0, 0);
		const int64_t I = moet_config_is_moe_layer(cf, l) ? S : cf->intermediate_size;
		if (I > 0) {
			tp_add(sz, I, H, fp8, 0, 0);
			tp_add(sz, I, H, fp8, 0, 0);
			tp_add(sz, H, I, fp8, 0, 0);
		}
	}
	tp_add(sz, cf->vocab_size, H, 0, 0, 0); /* lm_head: BF16 */
	uint64_t split = 0;
	for (int r = 0; r < 2; r++)
		split += sz->tp_bytes[2][r];
	const uint64_t tied = cf->tie_word_embeddings ? 2 * (uint64_t)cf->vocab_size * (uint64_t)H
						      : 0;
	sz->tp_whole = sz->dense_bytes + tied > split ? sz->dense_bytes + tied - split : 0;
}

/* ---- from the checkpoint ------------------------------------------------------------------ */

/* Adds one tensor to its part. */
static void classify(moet_placement_sizes *sz, const moet_tensor *t)
{
	int64_t L, E;
	uint64_t b = t->n_bytes;
	switch (moet_tensor_part(t->name, sz->n_layers, &L, &E)) {
	case MOET_PART_EMBED: sz->embed_bytes += b; break;
	case MOET_PART_LM_HEAD: sz->lm_head_bytes += b; break;
	case MOET_PART_ATTN: sz->attn_bytes += b; break;
	case MOET_PART_NORM: sz->norm_bytes += b; break;
	case MOET_PART_DENSE_MLP: sz->dense_mlp_bytes += b; break;
	case MOET_PART_ROUTER: sz->router_bytes += b; break;
	case MOET_PART_SHARED: sz->shared_bytes += b; break;
	case MOET_PART_MTP: sz->mtp_bytes += b; break;
	case MOET_PART_EXPERT:
		if (E < sz->n_experts) {
			sz->expert_bytes[L * sz->n_experts + E] += b;
			break;
		}
		sz->other_bytes += b; /* an expert id past the config's count */
		break;
	default: sz->other_bytes += b; break;
	}
}

int moet_placement_sizes_from_ckpt(const moet_config *cf, const moet_ckpt *ck,
				   moet_placement_sizes **out)
{
	moet_placement_sizes *sz = NULL;
	int rc = sizes_alloc(cf, &sz);
	if (rc)
		return rc;
	sz->from_ckpt = true;
	for (size_t i = 0; i < moet_ckpt_count(ck); i++)
		classify(sz, moet_ckpt_at(ck, i));
	for (int64_t l = 0; l < sz->n_layers; l++) {
		if (!moet_config_is_moe_layer(cf, l))
			continue;
		for (int64_t e = 0; e < sz->n_experts; e++)
			if (!sz->expert_bytes[l * sz->n_experts + e]) {
				rc = moet_err(MOET_ENOTFOUND, "%s: MoE layer %" PRId64 " has "
					      "no tensors model.layers.%" PRId64 ".mlp.experts.%"
					      PRId64 ".*", moet_ckpt_dir(ck), l, l, e);
				moet_placement_sizes_free(sz);
				return rc;
			}
	}
	sum_dense(sz);
	sum_tp(sz, cf);
	*out = sz;
	return 0;
}

/* ---- from the geometry -------------------------------------------------------------------- */

/* Bytes of a linear weight [r, c] with its block scales (FP8) or in BF16. */
static uint64_t lin(const moet_config *cf, int64_t r, int64_t c)
{
	uint64_t w = (uint64_t)r * (uint64_t)c;
	if (!cf->fp8)
		return 2 * w;
	uint64_t br = (uint64_t)(cf->fp8_block_rows > 0 ? cf->fp8_block_rows : 128);
	uint64_t bc = (uint64_t)(cf->fp8_block_cols > 0 ? cf->fp8_block_cols : 128);
	return w + 4 * (((uint64_t)r + br - 1) / br) * (((uint64_t)c + bc - 1) / bc);
}

int moet_placement_sizes_from_config(const moet_config *cf, moet_placement_sizes **out)
{
	const int64_t H = cf->hidden_size, V = cf->vocab_size, nh = cf->num_attention_heads;
	const int64_t QL = cf->q_lora_rank, KL = cf->kv_lora_rank, M = cf->moe_intermediate_size;
	const int64_t S = cf->n_shared_experts * M, E = cf->n_routed_experts;
	moet_placement_sizes *sz = NULL;
	int rc = sizes_alloc(cf, &sz);
	if (rc)
		return rc;
	uint64_t attn = lin(cf, KL + cf->qk_rope_head_dim, H) +
			lin(cf, nh * (cf->qk_nope_head_dim + cf->v_head_dim), KL) +
			lin(cf, H, nh * cf->v_head_dim);
	if (QL > 0)
		attn += lin(cf, QL, H) + lin(cf, nh * moet_config_qk_head_dim(cf), QL);
	else
		attn += lin(cf, nh * moet_config_qk_head_dim(cf), H);
	uint64_t norms = 2 * (2 * (uint64_t)H + (uint64_t)(QL > 0 ? QL : 0) + (uint64_t)KL);
	uint64_t expert = 2 * lin(cf, M, H) + lin(cf, H, M);

	sz->embed_bytes = 2 * (uint64_t)V * (uint64_t)H;
	sz->lm_head_bytes = cf->tie_word_embeddings ? 0 : 2 * (uint64_t)V * (uint64_t)H;
	sz->norm_bytes = 2 * (uint64_t)H;
	for (int64_t l = 0; l < sz->n_layers; l++) {
		sz->attn_bytes += attn;
		sz->norm_bytes += norms;
		if (!moet_config_is_moe_layer(cf, l)) {
			sz->dense_mlp_bytes += 2 * lin(cf, cf->intermediate_size, H) +
					       lin(cf, H, cf->intermediate_size);
			continue;
		}
		sz->router_bytes += 2 * (uint64_t)E * (uint64_t)H + 4 * (uint64_t)E;
		if (S > 0)
			sz->shared_bytes += 2 * lin(cf, S, H) + lin(cf, H, S);
		for (int64_t e = 0; e < E; e++)
			sz->expert_bytes[l * E + e] = expert;
	}
	sum_dense(sz);
	sum_tp(sz, cf);
	*out = sz;
	return 0;
}
