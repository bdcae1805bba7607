/*
 * moet_config.h: config.json of the DeepSeek-V3 family (DeepSeek-V3/R1/V3.1, Kimi-K2, ...).
 *
 * Accepted: any model_type whose "architectures" names DeepseekV3ForCausalLM (Kimi-K2 says
 * model_type "kimi_k2"); rope given in the published form (rope_theta + rope_scaling) or
 * in newer transformers' rope_parameters. Every field the model needs is read; none is
 * assumed. Fields that transformers defaults when absent are defaulted the same way and
 * listed in docs/config.md; the geometry fields are required.
 */
#ifndef MOET_CONFIG_H
#define MOET_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOET_CONFIG_NAME_BYTES 64

typedef enum moet_rope_type {
	MOET_ROPE_DEFAULT = 0, /* plain RoPE, no scaling */
	MOET_ROPE_YARN,
} moet_rope_type;

typedef struct moet_config {
	char model_type[MOET_CONFIG_NAME_BYTES];
	int64_t vocab_size;
	int64_t hidden_size;              /* d_model */
	int64_t intermediate_size;        /* dense MLP layers */
	int64_t moe_intermediate_size;    /* one routed expert */
	int64_t num_hidden_layers;        /* without the MTP layers */
	int64_t num_attention_heads;
	int64_t num_key_value_heads;
	int64_t n_shared_experts;         /* shared MLP width = n_shared x moe_intermediate */
	int64_t n_routed_experts;
	int64_t num_experts_per_tok;      /* top_k */
	int64_t n_group;
	int64_t topk_group;
	int64_t first_k_dense_replace;    /* layers [0, k) are dense */
	int64_t moe_layer_freq;           /* MoE layer iff l >= k and l % freq == 0 */
	int64_t num_nextn_predict_layers; /* MTP layers after the last layer: skipped */
	double routed_scaling_factor;
	bool norm_topk_prob;
	char scoring_func[16];            /* "sigmoid" (the only one supported) */
	char topk_method[16];             /* "noaux_tc" */
	int64_t q_lora_rank;              /* 0: no q compression (q_proj) */
	int64_t kv_lora_rank;
	int64_t qk_nope_head_dim;
	int64_t qk_rope_head_dim;
	int64_t v_head_dim;
	bool rope_interleave;             /* published checkpoints: true */
	bool attention_bias;              /* must be false (no bias tensors in this family) */
	double rms_norm_eps;
	int64_t max_position_embeddings;
	bool tie_word_embeddings;
	char hidden_act[16];              /* "silu" */
	int64_t bos_token_id;             /* -1 if absent */
	int64_t eos_token_id;             /* -1 if absent */

	/* RoPE */
	moet_rope_type rope_type;
	double rope_theta;
	double rope_factor;               /* yarn: the scaling factor */
	int64_t rope_original_max_pos;    /* yarn: original_max_position_embeddings (0: absent) */
	double rope_beta_fast;            /* yarn, default 32 */
	double rope_beta_slow;            /* yarn, default 1 */
	double rope_mscale;               /* yarn, default 1 (0 if absent: see docs) */
	double rope_mscale_all_dim;       /* yarn, default 0 */
	bool rope_truncate;               /* yarn, default true */
	bool rope_has_attention_factor;   /* yarn: explicit attention_factor given */
	double rope_attention_factor;

	/* quantization_config (FP8 checkpoints) */
	bool fp8;                         /* quant_method "fp8", fmt "e4m3" */
	int64_t fp8_block_rows;           /* weight_block_size[0], 128 */
	int64_t fp8_block_cols;           /* weight_block_size[1], 128 */
} moet_config;

/* Derived sizes */
static inline int64_t moet_config_qk_head_dim(const moet_config *c)
{
	return c->qk_nope_head_dim + c->qk_rope_head_dim;
}

static inline bool moet_config_is_moe_layer(const moet_config *c, int64_t layer)
{
	return c->n_routed_experts > 0 && layer >= c->first_k_dense_replace &&
	       layer % (c->moe_layer_freq > 0 ? c->moe_layer_freq : 1) == 0;
}

/*
 * Reads and validates DIR/config.json (or a file path ending in .json). Errors name the file
 * and the field: "DIR/config.json: field hidden_size is missing" / "... must be a positive
 * integer" / "... n_routed_experts 384 is not a multiple of n_group 7".
 */
int moet_config_load(const char *path, moet_config *out);

/* Parses config JSON text already in memory; `label` names it in errors. */
int moet_config_parse(const char *label, const char *text, size_t n_bytes, moet_config *out);

#endif
