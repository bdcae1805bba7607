/*
 * moet_ckpt.h: a checkpoint directory in the Hugging Face layout, read in place.
 *
 *   DIR/config.json                          (parsed by moet_config.h, not here)
 *   DIR/model.safetensors.index.json         {"metadata": {...}, "weight_map": {name: shard}}
 *   DIR/model-00001-of-000NN.safetensors     shards, each mmap'd read-only, whole
 *   or DIR/model.safetensors                 a single file without index
 *
 * safetensors file:  [u64 little-endian N][N bytes JSON header][data buffer]
 *   header: {"__metadata__": {str: str}?, NAME: {"dtype": D, "shape": [..], "data_offsets":
 *   [begin, end]}, ...}, offsets relative to the data buffer.
 *
 * Validation at open (each failure is a one-line error naming the file and tensor): N within
 * MOET_CKPT_MAX_HEADER_BYTES and within the file; header is a JSON object; known dtypes;
 * non-negative integer shapes; begin <= end <= data buffer size; end - begin = numel x dtype
 * size; tensors do not overlap and cover the data buffer exactly; the data pointer of every
 * tensor is aligned to its dtype size (safetensors writers order tensors so that it is); every
 * weight_map entry names a shard that exists and holds that tensor; no tensor in two shards.
 *
 * Tensor data is borrowed from the mapping: valid until moet_ckpt_close.
 */
#ifndef MOET_CKPT_H
#define MOET_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "moet_dtype.h"

#define MOET_CKPT_MAX_HEADER_BYTES (100u << 20) /* as the reference implementation */
#define MOET_CKPT_MAX_DIMS 8

typedef struct moet_ckpt moet_ckpt;

typedef struct moet_tensor {
	const char *name;                  /* owned by the checkpoint */
	moet_dtype dtype;
	int ndim;
	int64_t shape[MOET_CKPT_MAX_DIMS];
	int64_t numel;
	const void *data;                  /* borrowed from the shard mapping */
	size_t n_bytes;
	int shard;                         /* index into the shard list */
} moet_tensor;

/*
 * Opens DIR: reads the index (or the single model.safetensors), maps and validates every
 * shard. Returns 0 and *out, or a negative code with the detail in moet_errmsg().
 */
int moet_ckpt_open(const char *dir, moet_ckpt **out);

/* Unmaps and frees. Accepts NULL. */
void moet_ckpt_close(moet_ckpt *ck);

/* The tensor called `name`, or NULL. Borrowed. O(log n). */
const moet_tensor *moet_ckpt_get(const moet_ckpt *ck, const char *name);

/*
 * Like moet_ckpt_get, but checks dtype and shape: `dtype` MOET_DT_INVALID accepts any dtype;
 * shape[] of ndim entries, -1 accepting any extent. Errors: MOET_ENOTFOUND "DIR: tensor NAME
 * is missing", MOET_ESHAPE "FILE: tensor NAME has shape [..], config.json implies [..]".
 */
int moet_ckpt_find(const moet_ckpt *ck, const char *name, moet_dtype dtype, int ndim,
		   const int64_t *shape, const moet_tensor **out);

/* Number of tensors, and the i-th in name order (0 <= i < count). */
size_t moet_ckpt_count(const moet_ckpt *ck);
const moet_tensor *moet_ckpt_at(const moet_ckpt *ck, size_t i);

/* Shards: count, path of shard i, mapped size of shard i. */
int moet_ckpt_shard_count(const moet_ckpt *ck);
const char *moet_ckpt_shard_path(const moet_ckpt *ck, int i);
size_t moet_ckpt_shard_bytes(const moet_ckpt *ck, int i);
/* The base of shard i's mapping (page-aligned; NULL for an empty file or i out of range). */
const void *moet_ckpt_shard_base(const moet_ckpt *ck, int i);

/* The directory given to open. */
const char *moet_ckpt_dir(const moet_ckpt *ck);

/*
 * Parses and validates one safetensors file image already in memory (the shard reader and
 * the fuzzer use this): `file_name` only labels errors. On success *out_tensors is an array
 * of *out_count tensors (names malloc'd, data pointing into buf), freed with
 * moet_safetensors_free.
 */
int moet_safetensors_parse(const char *file_name, const uint8_t *buf, size_t n_bytes,
			   moet_tensor **out_tensors, size_t *out_count);
void moet_safetensors_free(moet_tensor *tensors, size_t count);

/* The parts of a DeepSeek-V3-layout model, by tensor name (runtime/tensor_part.c). */
typedef enum moet_part {
	MOET_PART_EMBED,
	MOET_PART_LM_HEAD,
	MOET_PART_ATTN,
	MOET_PART_NORM,      /* every RMSNorm weight, the final norm included */
	MOET_PART_DENSE_MLP,
	MOET_PART_ROUTER,    /* mlp.gate.* (weight and e_score_correction_bias) */
	MOET_PART_SHARED,
	MOET_PART_EXPERT,    /* mlp.experts.E.* */
	MOET_PART_MTP,       /* model.layers.L.* for L >= n_layers */
	MOET_PART_OTHER,
	MOET_PART_COUNT
} moet_part;

extern const char *const moet_part_names[MOET_PART_COUNT];

/* The part of tensor `name` in a model of n_layers layers; *out_layer gets L of
 * model.layers.L.* (else -1), *out_expert E of mlp.experts.E.* (else -1). */
moet_part moet_tensor_part(const char *name, int64_t n_layers, int64_t *out_layer,
			   int64_t *out_expert);

#endif
