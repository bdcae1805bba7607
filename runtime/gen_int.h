/*
 * gen_int.h: internals of gen-checkpoint shared by gen.c (orchestration, JSON files),
 * gen_tensors.c (tensor list, value generators), gen_route.c (routing skew calibration) and
 * st_writer.c (streaming safetensors writer).
 *
 * Randomness. Every random value comes from a xoshiro256++ stream identified by
 * (key, stream index): key = mix(seed, FNV-1a(label)), where label is a tensor name
 * ("model.layers.3.mlp.gate.weight") or a fixed tag ("moet.gen.mc"); a tensor's stream
 * index is its row. So any row of any tensor can be generated alone, in any order, on any
 * thread, and a tensor's bytes do not depend on which other tensors exist (layer 0 of a
 * 2-layer checkpoint equals layer 0 of a 61-layer one, the MoE bias aside).
 */
#ifndef MOET_GEN_INT_H
#define MOET_GEN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moet_config.h"
#include "moet_dtype.h"
#include "moet_gen.h"

#define GEN_MAX_CLASSES 8
#define GEN_MC_SAMPLES 4096      /* Monte-Carlo router inputs per calibration */
#define GEN_BISECT_STEPS 40
#define GEN_BIAS_LIMIT 2.0f      /* |b_l| <= 2 saturates the sigmoid scores' range (0, 1) */
/* Skew model (docs/gen-checkpoint.md): embedding = N(0,1) + ALPHA u_c; router row of an
 * expert of class c = N(0, SIGMA^2/H) + BETA u_c / H; router input = RMSNorm(embedding +
 * NOISE N(0,1)) x post_attention_layernorm. */
#define GEN_ALPHA 1.0f
#define GEN_BETA 2.0f
#define GEN_SIGMA 1.0f
#define GEN_NOISE 0.5f
#define GEN_FP8_BLOCK 128

typedef enum gen_kind {
	GEN_EMBED,    /* BF16 [V,H]: N(0,1) + ALPHA u_class(token) */
	GEN_LM_HEAD,  /* BF16 [V,H]: N(0, 1/H) */
	GEN_NORM,     /* BF16 [n]: 1 + 0.1 N(0,1) */
	GEN_F8,       /* F8_E4M3: codes of N(0,1) from the 65536-entry table */
	GEN_SCALE,    /* F32 [ceil(R/128), ceil(C/128)]: 1/sqrt(fan_in) x 2^U(-1,1) */
	GEN_ROUTER,   /* BF16 [E,H]: N(0, SIGMA^2/H) + BETA u_class(e) / H */
	GEN_BIAS,     /* F32 [E]: b_l for hot experts, 0 otherwise */
} gen_kind;

typedef struct gen_tensor {
	char name[128];
	moet_dtype dtype;
	int ndim;
	int64_t shape[2];
	int64_t rows;        /* shape[0], or 1 for a 1-D tensor */
	size_t row_bytes;
	size_t n_bytes;
	gen_kind kind;
	int64_t layer;       /* -1 for the global tensors */
	int64_t fan_in;      /* GEN_SCALE: columns of the weight it scales */
	int group;           /* shard planning: tensors of one group stay together if they can */
	uint64_t key;        /* stream key: mix(seed, FNV-1a(name)) */
	int shard;           /* 0-based, set by the planner */
} gen_tensor;

typedef struct gen_route {
	int64_t layer;
	int64_t n_hot;
	int64_t *hot;          /* n_hot expert ids, ascending */
	uint8_t *is_hot;       /* [E] */
	uint8_t *expert_class; /* [E] */
	double target;         /* share the calibration aims at */
	float bias;            /* b_l, the e_score_correction_bias of hot experts */
	double share;          /* Monte-Carlo share the hot set gets with b_l */
	double share_at_zero;  /* ... and with no bias */
	double *expert_share;  /* [E]: Monte-Carlo share of routings per expert with b_l */
} gen_route;

typedef struct gen_ctx {
	moet_config cfg;
	moet_gen_params par;
	int n_threads;
	int n_classes;
	float *class_dir;       /* [n_classes x H], each of norm sqrt(H) */
	uint8_t *e4m3_table;    /* [65536] */
	float *gauss_table;     /* [65536] */
	gen_tensor *tensors;
	size_t n_tensors;
	int64_t n_moe;
	gen_route *routes;      /* [n_moe], in layer order */
	int64_t *route_of_layer;/* [num_hidden_layers]: index into routes, or -1 */
} gen_ctx;

/* ---- random streams (gen_tensors.c) ---- */
typedef struct gen_rng {
	uint64_t s[4];
} gen_rng;

uint64_t gen_key(uint64_t seed, const char *label);
void gen_rng_seed(gen_rng *r, uint64_t key, uint64_t stream);

static inline uint64_t gen_rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256++ */
static inline uint64_t gen_rng_next(gen_rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = gen_rotl(s[0] + s[3], 23) + s[0];
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = gen_rotl(s[3], 45);
	return out;
}

/* Uniform integer in [0, n), n < 2^32 (multiply-shift; bias below 2^-32). */
static inline uint64_t gen_rng_below(gen_rng *r, uint64_t n)
{
	return ((gen_rng_next(r) >> 32) * n) >> 32;
}

/* Uniform float in [-1, 1), 24 bits. */
static inline float gen_rng_sym(gen_rng *r)
{
	return (float)(int32_t)(gen_rng_next(r) >> 40) * 0x1p-23f - 1.0f;
}

/* ---- tensors and values (gen_tensors.c) ---- */
int gen_tables_init(gen_ctx *g);
int gen_tensors_build(gen_ctx *g);
/* Fills rows [r0, r1) of tensor ti into out (row_bytes each). Thread-safe. Returns 0. */
int gen_fill_rows(void *g, size_t ti, int64_t r0, int64_t r1, uint8_t *out);
/* The tensor called name, or NULL. */
const gen_tensor *gen_find(const gen_ctx *g, const char *name);

/* ---- routing skew (gen_route.c) ---- */
/* Picks classes, hot sets and targets, then calibrates every layer's bias. */
int gen_route_calibrate(gen_ctx *g);
void gen_route_free(gen_ctx *g);

/* ---- streaming safetensors writer (st_writer.c) ---- */
typedef int (*st_fill_fn)(void *ctx, size_t tensor_id, int64_t r0, int64_t r1, uint8_t *out);
typedef void (*st_bytes_fn)(void *ctx, uint64_t n_bytes, bool file_done);

typedef struct st_tensor {
	const char *name;
	moet_dtype dtype;
	int ndim;
	const int64_t *shape;
	int64_t rows;
	size_t row_bytes;
	size_t tensor_id;    /* passed to fill */
} st_tensor;

/* Size of the file st_write_file would write (header included). */
int st_file_bytes(const st_tensor *t, size_t n, uint64_t *out_bytes);

/*
 * Writes one safetensors file: tensors reordered by dtype size (largest first, stable) so
 * that every tensor's data is aligned to its element size, header padded with spaces to a
 * multiple of 8, data covering the buffer exactly. Bytes come from fill(), called from
 * n_threads worker threads on row ranges of at most a few MB; the calling thread writes them
 * in order and reports each write through on_bytes.
 */
int st_write_file(const char *path, const st_tensor *t, size_t n, st_fill_fn fill,
		  void *fill_ctx, int n_threads, st_bytes_fn on_bytes, void *cb_ctx);

#endif
