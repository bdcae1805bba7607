/*
 * model_int.h: internals of the model graph shared by model.c (weights), rope.c and
 * forward.c. Not a public header.
 *
 * Every matrix is a moet_mat view of the checkpoint's bytes (FP8 with its block scales, BF16
 * or F32). Only small vectors are decoded into owned binary32 arrays at open: norm weights and
 * the router's e_score_correction_bias.
 */
#ifndef MOET_MODEL_INT_H
#define MOET_MODEL_INT_H

#include "moet_mat.h"
#include "moet_model.h"

#define MOET_MODEL_MAX_EXPERTS 4096 /* the router's eligibility arrays */
#define MOET_MODEL_MAX_TOPK 64

typedef struct moet_expert_w {
	moet_mat gate; /* [I x H] */
	moet_mat up;   /* [I x H] */
	moet_mat down; /* [H x I] */
} moet_expert_w;

typedef struct moet_layer_w {
	float *in_norm;       /* [H], owned */
	float *post_norm;     /* [H], owned */
	/* attention (MLA) */
	moet_mat q_a;         /* [q_lora x H] (q_lora_rank > 0) */
	float *q_a_norm;      /* [q_lora], owned */
	moet_mat q_b;         /* [heads*qk_head x q_lora] */
	moet_mat q_proj;      /* [heads*qk_head x H] (q_lora_rank == 0) */
	moet_mat kv_a;        /* [kv_lora + rope x H] */
	float *kv_a_norm;     /* [kv_lora], owned */
	moet_mat kv_b;        /* [heads*(nope+v) x kv_lora] */
	moet_mat o;           /* [H x heads*v] */
	/* feed-forward */
	int is_moe;
	moet_expert_w mlp;    /* dense MLP, or the shared experts of a MoE layer */
	int has_shared;       /* MoE layer with n_shared_experts > 0 */
	moet_mat router;      /* [E x H] */
	float *router_bias;   /* [E], owned (zeros if the checkpoint has none) */
	moet_expert_w *experts; /* [E], owned array of views */
} moet_layer_w;

struct moet_model {
	moet_config cfg;
	moet_ckpt *ck;
	const moet_tensor *embed; /* [V x H], BF16/F32/F16 */
	moet_mat lm_head;         /* [V x H] */
	float *final_norm;        /* [H], owned */
	moet_layer_w *layers;     /* [num_hidden_layers] */
	/* rope tables */
	float *inv_freq;          /* [rope/2], binary32 as transformers computes them */
	float rope_attn_factor;   /* multiplies cos and sin (yarn attention factor) */
	float softmax_scale;      /* qk_head^-0.5 x mscale^2 */
	moet_route_fn route_fn;   /* optional observer of routing decisions */
	void *route_ctx;
};

struct moet_kv {
	int64_t max_tokens;
	int64_t len;
	int64_t n_layers;
	int64_t k_row;  /* floats per position per layer: heads x qk_head */
	int64_t v_row;  /* heads x v_head */
	float *k;       /* [layers][max_tokens][k_row] */
	float *v;       /* [layers][max_tokens][v_row] */
};

/* rope.c: fills m->inv_freq, rope_attn_factor, softmax_scale from m->cfg. */
int moet_rope_init(struct moet_model *m);

/* rope.c: cos/sin tables (length rope/2) for one position. */
void moet_rope_tables(const struct moet_model *m, int64_t pos, float *cos_t, float *sin_t);

#endif
