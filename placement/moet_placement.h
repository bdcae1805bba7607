/*
 * moet_placement.h: which GPU holds which routed expert of which layer (the placement file).
 *
 * A placement file is YAML that people edit and `moet-hybrid plan` writes (docs/placement.md
 * is the reference):
 *
 *   gpus:                                  # GPU g = the g-th entry; names are free
 *     - {name: gpu0, budget: 139GiB, reserve: 16GiB}
 *     - {name: gpu1, budget: 139GiB, reserve: 16GiB}
 *   dense: split                           # or a GPU name: where the dense part lives
 *   default: {gpu0: "0-29", gpu1: "30-59"} # every MoE layer not listed under layers
 *   layers:
 *     # expected hit rate 0.81             (the planner's comment)
 *     3: {gpu0: [0, 5, "7-9"], gpu1: "10-20"}
 *     4-10: {gpu0: "0-29"}                 # replaces the default entirely
 *
 * Every expert not named for a GPU is on the CPU. Resolved, a placement is a table
 * owner[layer][expert]: MOET_PLACEMENT_CPU (-1) or a GPU index g >= 0; dense layers hold no
 * routed experts and are all -1.
 *
 *   owner (int16, row-major):   expert 0   1   2  ...  E-1
 *                     layer 0   [ -1  -1  -1  ...  -1 ]   dense layer
 *                     layer 1   [  0   0   1  ...  -1 ]
 *                       ...
 *
 * Memory accounting needs byte sizes: moet_placement_sizes holds the bytes of every routed
 * expert (gate/up/down weights with their block scales) and of the dense part, either as
 * the checkpoint stores them (real sizes) or computed from config.json's geometry for the
 * published layout (for models one has not downloaded). A GPU's total is the experts it holds,
 * its share of the dense part (all of it with `dense: NAME`, 1/n with `split`) and its
 * reserve (KV cache, activations, workspaces, CUDA context); it must not exceed its budget.
 *
 * Errors are one line, "FILE:LINE: fault", with the line from libyaml's marks (1-based).
 * Handles are not thread-safe for writing; concurrent readers are fine.
 */
#ifndef MOET_PLACEMENT_H
#define MOET_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moet_ckpt.h"
#include "moet_config.h"

#define MOET_PLACEMENT_CPU (-1)          /* owner of an expert not resident on a GPU */
#define MOET_PLACEMENT_DENSE_SPLIT (-1)  /* dense part split over the GPUs (tensor-parallel) */
#define MOET_PLACEMENT_MAX_GPUS 64
#define MOET_PLACEMENT_NAME_BYTES 32     /* GPU name, NUL included */
#define MOET_PLACEMENT_MAX_FILE_BYTES (64u << 20)

typedef struct moet_placement moet_placement;

/* One GPU of a placement. */
typedef struct moet_placement_gpu {
	char name[MOET_PLACEMENT_NAME_BYTES]; /* [A-Za-z0-9_.-]+, not "cpu", unique */
	uint64_t budget_bytes;                /* memory the runtime may use on it, > 0 */
	uint64_t reserve_bytes;               /* KV cache, activations, workspaces */
	int line;                             /* line of its entry in the file, 0 if none */
} moet_placement_gpu;

/* Byte sizes of the parts of a model (see moet_placement_sizes_from_*). */
#define MOET_PLACEMENT_TP_MAX 8 /* GPUs a `split` dense part spans (MOET_TP's ranks) */

typedef struct moet_placement_sizes {
	int64_t n_layers;            /* num_hidden_layers (MTP layers are not loaded) */
	int64_t n_experts;           /* n_routed_experts */
	uint64_t *expert_bytes;      /* [n_layers x n_experts]; 0 in dense layers */
	uint64_t embed_bytes;        /* model.embed_tokens */
	uint64_t lm_head_bytes;      /* 0 with tied embeddings */
	uint64_t attn_bytes;         /* self_attn.* of every layer */
	uint64_t norm_bytes;         /* every RMSNorm weight */
	uint64_t dense_mlp_bytes;    /* the MLPs of the dense layers */
	uint64_t router_bytes;       /* mlp.gate.* (weight and correction bias) */
	uint64_t shared_bytes;       /* shared experts */
	uint64_t other_bytes;        /* tensors of no known part (kept with the dense part) */
	uint64_t dense_bytes;        /* sum of the eight above */
	uint64_t mtp_bytes;          /* MTP layers: not loaded, not counted anywhere else */
	bool from_ckpt;              /* true: the checkpoint's bytes; false: from the geometry */
	/* The tensor-parallel split (`dense: split` over n GPUs, MOET_TP; common/moet_tpsplit.h):
	 * tp_bytes[n][r] the bytes of the split matrices (q_b or q_proj, kv_b, o_proj, the
	 * dense MLPs, the shared experts, lm_head) rank r holds, from the geometry; tp_whole the dense bytes that stay whole on the first GPU (the rest of
	 * dense_bytes; with tied embeddings lm_head's slices come on top of the embedding). */
	uint64_t tp_bytes[MOET_PLACEMENT_TP_MAX + 1][MOET_PLACEMENT_TP_MAX];
	uint64_t tp_whole;
} moet_placement_sizes;

/* GPU g's share of the dense part (of n_gpus; dense_gpu a GPU index or
 * MOET_PLACEMENT_DENSE_SPLIT): all of it on the named GPU; `split`: its rows of the matrices
 * the engine splits (sz->tp_bytes) and, on GPU 0, what stays whole (sz->tp_whole); one GPU:
 * all; more than MOET_PLACEMENT_TP_MAX GPUs: an even share, the remainder on GPU 0. */
uint64_t moet_placement_dense_share(const moet_placement_sizes *sz, int n_gpus, int dense_gpu,
				    int g);

/* Per-GPU (or CPU tier) usage of a placement. */
typedef struct moet_placement_usage {
	int64_t n_experts;           /* routed experts held, over all MoE layers */
	int64_t min_per_layer;       /* fewest held in one MoE layer */
	int64_t max_per_layer;       /* most held in one MoE layer */
	uint64_t expert_bytes;
	uint64_t dense_bytes;        /* its share of the dense part */
	uint64_t reserve_bytes;
	uint64_t total_bytes;        /* expert + dense + reserve */
	uint64_t budget_bytes;       /* 0 for the CPU tier (no budget) */
} moet_placement_usage;

/* ---- sizes ------------------------------------------------------------------------------ */

/*
 * The real sizes: every tensor of the open checkpoint sorted into its part by its name in the
 * published layout (model.layers.L.mlp.experts.E.* is expert E of layer L, and so on; see
 * docs/placement.md). Errors: MOET_ENOTFOUND when a MoE layer lacks one of its experts.
 * *out is freed with moet_placement_sizes_free. `ck` is only read during the call.
 */
int moet_placement_sizes_from_ckpt(const moet_config *cf, const moet_ckpt *ck,
				   moet_placement_sizes **out);

/*
 * The sizes a checkpoint in the published layout has for this geometry: with cf->fp8 every
 * linear weight is F8_E4M3 plus F32 block scales [ceil(r/br), ceil(c/bc)], otherwise BF16;
 * embeddings, norms and router weights BF16, the router's correction bias F32. For models not
 * on disk (gen-checkpoint presets, the examples in configs/). *out as above.
 */
int moet_placement_sizes_from_config(const moet_config *cf, moet_placement_sizes **out);

/* Frees. Accepts NULL. */
void moet_placement_sizes_free(moet_placement_sizes *sz);

/* ---- reading ---------------------------------------------------------------------------- */

/*
 * Reads and validates a placement file against the model's geometry (layer count, which
 * layers are MoE, n_routed_experts) and, when `sz` is not NULL, against the GPUs' budgets
 * (moet_placement_check). Errors, each one line "PATH:LINE: fault":
 *   MOET_EIO      the file cannot be read (or is larger than MOET_PLACEMENT_MAX_FILE_BYTES)
 *   MOET_EFORMAT  malformed YAML, a value of the wrong type, an unknown or repeated key,
 *                 a malformed id list, size or name
 *   MOET_EINVAL   unknown GPU name, a layer that is not a MoE layer, a layer given twice, an
 *                 expert owned twice (the message names both lines)
 *   MOET_ERANGE   an expert id or layer out of range, a GPU over its budget
 * *out is freed with moet_placement_free. `cf` and `sz` are only read during the call.
 */
int moet_placement_load(const char *path, const moet_config *cf, const moet_placement_sizes *sz,
			moet_placement **out);

/* Like moet_placement_load, from text in memory; `label` stands for the path in errors. */
int moet_placement_parse(const char *label, const char *text, size_t n_bytes,
			 const moet_config *cf, const moet_placement_sizes *sz,
			 moet_placement **out);

/*
 * The budget check: each GPU's total (experts held at their sizes in `sz`, its share of
 * sz->dense_bytes, its reserve) against its budget. MOET_ERANGE for the first GPU over,
 * "PATH:LINE: gpu NAME over its budget: TOTAL bytes (experts + dense + reserve) > BUDGET";
 * MOET_EINVAL if `sz` is for another geometry.
 */
int moet_placement_check(const moet_placement *p, const moet_placement_sizes *sz);

/* ---- building (for the planner) ------------------------------------------------------- */

/*
 * A placement with every expert on the CPU, for `n_gpus` GPUs copied from `gpus` (names
 * checked as the reader does) and the dense part on `dense_gpu` (or
 * MOET_PLACEMENT_DENSE_SPLIT). `label` names it in errors (copied). Errors: MOET_EINVAL.
 */
int moet_placement_create(const char *label, const moet_config *cf, int n_gpus,
			  const moet_placement_gpu *gpus, int dense_gpu, moet_placement **out);

/* Sets the owner of (layer, expert): a GPU index or MOET_PLACEMENT_CPU. MOET_ERANGE for an
 * index out of range, MOET_EINVAL for a layer that is not a MoE layer. */
int moet_placement_set_owner(moet_placement *p, int64_t layer, int64_t expert, int owner);

/*
 * The placement as YAML text (malloc'd, NUL-terminated, into *out_text): `header` (may be
 * NULL; may span lines) as comment lines at the top, then gpus, dense, and every MoE layer
 * explicitly, preceded by its comment lines from layer_comments[layer] when that array and
 * entry are not NULL (the array has n_layers entries). Reading the text back gives the same
 * table. Errors: MOET_ENOMEM.
 */
int moet_placement_write(const moet_placement *p, const char *header,
			 const char *const *layer_comments, char **out_text);

/* moet_placement_write into a file (replaced). MOET_EIO naming the path on failure. */
int moet_placement_save(const moet_placement *p, const char *path, const char *header,
			const char *const *layer_comments);

/* Frees. Accepts NULL. */
void moet_placement_free(moet_placement *p);

/* ---- reading a placement ------------------------------------------------------------------ */

int moet_placement_n_gpus(const moet_placement *p);
/* GPU g (0 <= g < n_gpus), borrowed. */
const moet_placement_gpu *moet_placement_gpu_at(const moet_placement *p, int g);
/* A GPU index or MOET_PLACEMENT_DENSE_SPLIT. */
int moet_placement_dense_gpu(const moet_placement *p);
int64_t moet_placement_n_layers(const moet_placement *p);
int64_t moet_placement_n_experts(const moet_placement *p);
/* The label (path) it was read from or created with. Borrowed. */
const char *moet_placement_label(const moet_placement *p);
/* owner[layer][expert]; MOET_PLACEMENT_CPU for indices out of range. */
int moet_placement_owner(const moet_placement *p, int64_t layer, int64_t expert);
/* The whole table, [n_layers x n_experts] row-major, borrowed. */
const int16_t *moet_placement_owners(const moet_placement *p);

/*
 * Usage of GPU g, or of the CPU tier with g = MOET_PLACEMENT_CPU (its experts; the dense part
 * too when the placement has no GPU). MOET_EINVAL if g is out of range or `sz` is for another
 * geometry.
 */
int moet_placement_usage_of(const moet_placement *p, const moet_placement_sizes *sz, int g,
			    moet_placement_usage *out);

/* "139GiB" / "32GB" / "31.5GiB" / "1234" (bytes) -> bytes. Units: B, KB, MB, GB, TB (10^3k),
 * KiB, MiB, GiB, TiB (2^10k); at most 3 decimals. MOET_EFORMAT with a detail naming `s`. */
int moet_placement_parse_bytes(const char *s, uint64_t *out);

#endif
