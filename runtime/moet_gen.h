/*
 * moet_gen.h: synthetic checkpoints in the published DeepSeek-V3 layout (gen-checkpoint).
 *
 * Writes a directory that loads like a downloaded DeepSeek-V3 / Kimi-K2 FP8 checkpoint:
 *
 *   DIR/config.json                         published field names (DeepseekV3ForCausalLM)
 *   DIR/model.safetensors.index.json        {"metadata": {"total_size": N}, "weight_map": ..}
 *   DIR/model-00001-of-0000K.safetensors    shards, split at tensor boundaries
 *   DIR/generator.json                      how it was made: parameters, and per MoE layer
 *                                           the hot experts and their expected routing share
 *
 * Every byte is a function of (preset, geometry overrides, seed, hot set parameters): the same
 * arguments give byte-identical files whatever the thread count. Weights are random but
 * numerically sane (FP8 codes ~ N(0,1) with 128x128 block scales 1/sqrt(fan_in) x [0.5, 2]),
 * and the routers are built so that a chosen hot set of experts per layer receives a chosen
 * share of the routings (docs/gen-checkpoint.md describes the model and its limits).
 */
#ifndef MOET_GEN_H
#define MOET_GEN_H

#include <stdbool.h>
#include <stdint.h>

#include "moet_config.h"

typedef enum moet_gen_preset {
	MOET_GEN_TINY = 0,    /* a few MB, seconds to write: tests */
	MOET_GEN_KIMI_K2,     /* Kimi-K2's per-layer geometry (61 layers: ~1 TB) */
	MOET_GEN_TINY_TP,     /* tiny with 8 heads of 128 q rows and 128 kv_b rows: MOET_TP's
				 attention split at head boundaries (tests) */
} moet_gen_preset;

/* What the progress callback sees; bytes count shard files including their headers. */
typedef struct moet_gen_progress {
	uint64_t done_bytes;
	uint64_t total_bytes;
	int shard;            /* 1-based index of the shard being written */
	int n_shards;
	bool shard_done;      /* true exactly once per shard, after its last byte */
} moet_gen_progress;

typedef void (*moet_gen_progress_fn)(void *ctx, const moet_gen_progress *p);

typedef struct moet_gen_params {
	moet_gen_preset preset;
	int64_t n_layers;         /* 0: the preset's */
	int64_t n_experts;        /* 0: the preset's n_routed_experts (multiple of n_group) */
	uint64_t seed;            /* < 2^63 (written to JSON as an integer) */
	int64_t hot_count;        /* 0: round(E x 120/384) */
	double hot_share;         /* in (0, 1): mean over MoE layers of the hot set's share */
	const double *layer_hot_share; /* optional, borrowed: each MoE layer's target share in
					* layer order, each in (0, 1), instead of hot_share's
					* spread (hot_share then becomes their mean) */
	int64_t n_layer_hot_share;     /* entries of layer_hot_share: the MoE layers' count */
	int64_t shard_mb;         /* shard limit in MiB (a bigger single tensor gets its own) */
	bool force;               /* write into a non-empty DIR (replacing our files there) */
	int n_threads;            /* 0: online CPUs, at most 8 */
	moet_gen_progress_fn progress; /* optional, called from the calling thread */
	void *progress_ctx;
} moet_gen_params;

/* Defaults: tiny preset, seed 0, hot_share 0.8, shard_mb 4096, everything else 0/false. */
void moet_gen_params_init(moet_gen_params *p);

/* "tiny" / "kimi-k2" -> preset. Returns 0 or MOET_EINVAL. */
int moet_gen_preset_parse(const char *s, moet_gen_preset *out);

/*
 * The geometry the parameters give (config.json's content) without writing anything.
 * Returns 0, or MOET_EINVAL / MOET_ERANGE with a one-line detail naming the parameter.
 */
int moet_gen_config(const moet_gen_params *p, moet_config *out);

/*
 * Writes the checkpoint into `dir` (created if missing; refused if it exists and is not
 * empty, unless p->force). Never holds a shard in memory: tensors stream through a few MB of
 * buffers. Returns 0, or a negative MOET_E* code with a one-line detail in moet_errmsg();
 * on failure the files written so far stay behind. Not thread-safe against another call
 * writing the same dir; otherwise reentrant.
 */
int moet_gen_checkpoint(const char *dir, const moet_gen_params *p);

#endif
