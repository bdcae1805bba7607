/*
 * moet_gpu.h: the GPU side as seen from C. Built from the .cu files of gpu/ by nvcc when the toolkit is
 * present (sm_90 and sm_120); without it, gpu/nocuda.c answers "no GPU".
 */
#ifndef MOET_GPU_H
#define MOET_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "moet_mat.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices: 0 when there is no driver or no device (never an error).
 * *out_why (optional) gets a static string saying why there are none. */
int moet_gpu_count(const char **out_why);

/*
 * The calling thread's default stream: where every gpu/ call given a NULL stream runs
 * (cudaStream_t as void *; NULL: the legacy default stream, the initial state). A CUDA
 * backend with a stream of its own (MOET_GPU_STREAM=own) sets it at the start of each pass, so
 * that a pass's work can be captured into a CUDA graph (the legacy stream cannot be); the
 * stream must be blocking (moet_gpu_stream_create_blocking) so that synchronous copies on the
 * legacy stream stay ordered with it. It belongs to the device current when it was set:
 * while the thread works on another device (moet_gpu_set_device), NULL means that device's
 * legacy stream. Never fails; without CUDA, no effect.
 */
void moet_gpu_set_thread_stream(void *stream);
void *moet_gpu_thread_stream(void);

/*
 * CUDA graphs (graph.cu; runtime/graph.c captures the decode step). moet_gpu_mem_epoch: a
 * counter that every allocation and free of device or pinned memory through gpu/ advances (a
 * graph captured at epoch e names only live buffers while the epoch is e). capture_begin
 * starts capturing `stream` (not NULL: the legacy stream cannot be captured; thread-local
 * mode); capture_end ends it and instantiates *out_exec, or returns MOET_EDEVICE (the capture
 * was invalidated, e.g. by a synchronous call in between: nothing is left captured, nothing
 * ran). graph_launch queues an instance on `stream`; graph_destroy frees one (NULL accepted).
 * Without CUDA: epoch 0, MOET_EUNSUP.
 */
uint64_t moet_gpu_mem_epoch(void);
int moet_gpu_capture_begin(void *stream);
int moet_gpu_capture_end(void *stream, void **out_exec);
int moet_gpu_graph_launch(void *exec, void *stream);
void moet_gpu_graph_destroy(void *exec);

/*
 * Evaluates the contract's exp_c on the device for n inputs (host arrays) and writes the
 * results to out. Returns 0, MOET_EDEVICE (detail names the CUDA call and error) or
 * MOET_EUNSUP without CUDA. Used by the GPU tests to check exp_c exhaustively.
 */
int moet_gpu_exp_c(const float *in, float *out, long long n);

/*
 * ---- Device memory (gpu/alloc.cu) ------------------------------------------------------------
 * The one source of device memory. Pointers returned are cudaMalloc'd (256-byte aligned).
 * Streams are cudaStream_t passed as void*; NULL is the default stream. Every function returns
 * 0, MOET_EINVAL (NULL pointer), MOET_EDEVICE (detail: file:line, the CUDA call and its error)
 * or MOET_EUNSUP in a build without CUDA.
 */

/* *out_ptr = bytes of device memory (NULL for 0 bytes). Free with moet_gpu_free. */
int moet_gpu_alloc(size_t bytes, void **out_ptr);
/* Frees memory from moet_gpu_alloc; NULL is accepted. */
void moet_gpu_free(void *ptr);
/* Synchronous copies (return when the bytes have arrived). */
int moet_gpu_copy_h2d(void *dst, const void *src, size_t bytes);
int moet_gpu_copy_d2h(void *dst, const void *src, size_t bytes);
/* Device-to-device copy queued on `stream` (no host wait). */
int moet_gpu_copy_d2d(void *dst, const void *src, size_t bytes, void *stream);
/* Waits until everything queued on `stream` has finished; reports asynchronous errors. */
int moet_gpu_sync(void *stream);

/*
 * ---- The contract expert FFN, grouped over experts and tokens (gpu/expert.cu) ----------------
 * One expert of a grouped call: gate and up [I x H], down [H x I], as moet_mat views whose
 * data and scale_inv are DEVICE pointers holding the checkpoint's bytes verbatim (F8_E4M3 codes
 * with F32 128x128 block scales, or BF16; scale_inv NULL means 1.0f). n_tok is the number of
 * (expert, token) pairs of this expert.
 */
typedef struct moet_gpu_expert {
	moet_mat gate, up, down; /* borrowed device views */
	int64_t n_tok;           /* tokens routed to this expert (>= 0) */
} moet_gpu_expert;

/* Bytes of scratch that moet_gpu_expert_ffn needs for n_pairs pairs of experts of
 * intermediate size `inter` (the h rows, each padded to a multiple of 4 floats). */
size_t moet_gpu_expert_scratch_bytes(int64_t n_pairs, int64_t inter);

/*
 * The contract expert FFN (docs/numerics.md) for every (expert, token) pair, on the device:
 *
 *   pairs are numbered expert by expert: expert e owns rows P_e .. P_e + n_tok_e - 1, with
 *   P_e = n_tok_0 + ... + n_tok_{e-1};  for pair p of expert e, t = tok[p]:
 *   y[p][.] = canon(D(down_e, ., silu_c(D(gate_e, ., x[t])) * D(up_e, ., x[t])))
 *
 * bit for bit what moet_expert_ffn (cpu/) returns for that expert and token. x [n_x][H]
 * binary32, tok [n_pairs] int32 and y [n_pairs][H] binary32 are device memory; scratch is
 * device memory of at least moet_gpu_expert_scratch_bytes(n_pairs, I) bytes (borrowed; holds
 * h). All experts share I, H and one weight dtype (F8_E4M3 or BF16). A token index outside
 * [0, n_x) reads as a row of +0 (never out of bounds).
 *
 * Asynchronous: the work is queued on `stream` (cudaStream_t, NULL = default stream); no
 * allocation and no host synchronization happen inside; the output is ready after
 * moet_gpu_sync(stream). Deterministic (no atomics): the same inputs give the same bits.
 * Returns 0, MOET_EINVAL (NULL pointers, misaligned data, scratch too small, counts out of
 * range), MOET_ESHAPE (matrices do not chain or differ between experts), MOET_EUNSUP (dtype
 * other than F8_E4M3/BF16, or a build without CUDA) or MOET_EDEVICE (a launch failed).
 * Thread-safe for different streams and outputs.
 */
int moet_gpu_expert_ffn(const moet_gpu_expert *exps, int64_t n_exp, const float *x, int64_t n_x,
			const int32_t *tok, void *scratch, size_t scratch_bytes, float *y,
			void *stream);

/*
 * The first pass of moet_gpu_expert_ffn for one FFN whose gate and up may be row slices (the
 * tensor-parallel split, runtime/tp.c): h[t * h_stride + i] = silu_c(D(gate, i, x[tok[t]])) *
 * D(up, i, x[tok[t]]) for t < n, i < gate.rows, with x rows x_stride floats apart; the same
 * kernels, so the same bits as the h inside moet_gpu_expert_ffn. Device memory; queued on
 * `stream`. Returns 0, MOET_EINVAL, MOET_ESHAPE, MOET_EUNSUP or MOET_EDEVICE.
 */
int moet_gpu_gate_up(const moet_mat *gate, const moet_mat *up, const float *x, int64_t x_stride,
		     int64_t n, const int32_t *tok, float *h, int64_t h_stride, void *stream);

/*
 * ---- The dense path (gpu/linear.cu, rmsnorm.cu, rope.cu, attention.cu, kv_write.cu,
 * router.cu, embed.cu, add.cu, combine.cu) ----------------------------------------------------
 * Every op works on DEVICE pointers (borrowed), is queued on `stream` (cudaStream_t, NULL = the
 * default stream), allocates nothing, never waits on the host, and is deterministic (no
 * atomics) and batch-invariant (a row's result never depends on the other rows of the call).
 * Each returns 0, MOET_EINVAL (NULL pointers, strides, counts or sizes out of range; the detail
 * names them), MOET_EUNSUP (a dtype it does not take, or a build without CUDA) or MOET_EDEVICE
 * (a launch failed; file:line in the detail). Strides are in floats. How each relates to the
 * CPU reference backend: docs/gpu.md, "The dense path".
 */

/*
 * Linear layer: y[t * y_stride + r] = D(W, r, x + t * x_stride) for every row r of W and
 * t < n_tok: the contract dot, bit for bit moet_dot_ref (non-NaN outputs; a NaN's payload may
 * differ). W is a moet_mat whose data and scale_inv are device pointers (F8_E4M3 with F32
 * block scales, BF16 or F32; scale_inv NULL = 1.0f). Shares the expert kernel's row machinery;
 * calls of up to 16 tokens with K % 128 == 0 and aligned rows may go through gpu/linear_ks.cu
 * (the blocks of K over the warps of a block) or gpu/linear_tall.cu (a warp per 8 rows)
 * instead, the same bits: MOET_GPU_LINEAR=auto (unset: the default) sends to linear_ks those
 * whose matrix has at most 16 rows per SM of the current device, ksplit every one to
 * linear_ks, tall every one to linear_tall, rows none; other values give MOET_EINVAL naming
 * it. Returns MOET_ESHAPE for an empty or oversized matrix.
 */
int moet_gpu_linear(const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
		    int64_t y_stride, void *stream);
/* The calls moet_gpu_linear sent to gpu/linear_ks.cu so far (tests: the path was taken). */
uint64_t moet_gpu_linear_ks_calls(void);
/* ... and to gpu/linear_tall.cu (moet_gpu_ffn_ks's calls included in both). */
uint64_t moet_gpu_linear_tall_calls(void);

/*
 * The expert FFN E(x) of docs/numerics.md for n_tok tokens (one expert: a dense MLP or the
 * shared experts) through gpu/linear_ks.cu or gpu/linear_tall.cu where MOET_GPU_LINEAR sends
 * its gate and up matrices there (moet_gpu_linear's conditions and rule; the down matrix too
 * where sent, else the row machinery; all three must fit a kernel the variant may send them
 * to, linear_ks under auto and ksplit, linear_tall under tall): gate's dot into scratch (n_tok x
 * gate->rows floats of scratch_bytes), then h = silu_c(g) * u over it, then the down pass into
 * out [n_tok][out_stride] with NaN made canonical: the bits of moet_gpu_expert_ffn.
 * *out_taken 1 when it ran; 0 (returning 0) where MOET_GPU_LINEAR=rows, a matrix does not
 * fit or gate or up is not sent, and nothing was queued. A bad MOET_GPU_LINEAR gives
 * MOET_EINVAL naming it.
 */
int moet_gpu_ffn_ks(const moet_mat *gate, const moet_mat *up, const moet_mat *down,
		    const float *x, int64_t x_stride, int64_t n_tok, float *scratch,
		    size_t scratch_bytes, float *out, int64_t out_stride, void *stream,
		    int *out_taken);

/*
 * RMSNorm of n_rows rows of n values: out[i] = w[i] * (x[i] * inv), inv = 1/sqrt(mean(x^2)+eps)
 * with the sum of squares in binary64 in a fixed order (rmsnorm.cu says which) and rounded
 * once: within 2 ulp of moet_rmsnorm_ref, nearly always equal. out may be x (same stride);
 * otherwise they must not overlap.
 */
int moet_gpu_rmsnorm(const float *x, int64_t x_stride, const float *w, int64_t n, int64_t n_rows,
		     double eps, float *out, int64_t out_stride, void *stream);

/*
 * Rotary embedding in place of n_heads heads of each of n_rows rows, row t at position pos[t]
 * (device int32 [n_rows]): the rope part of head h of row t is the 2 * n_freq floats at
 * x + t * row_stride + h * head_stride. The cos/sin tables are computed on the device from
 * inv_freq (device [n_freq]) and attn_factor with moet_rope_tables_ref's arithmetic (binary64
 * cos/sin of the binary32 angle); the rotation is moet_rope_ref's, interleave as there.
 * n_freq <= 256.
 */
int moet_gpu_rope(float *x, int64_t n_rows, int64_t row_stride, int64_t n_heads,
		  int64_t head_stride, int64_t n_freq, const int32_t *pos, const float *inv_freq,
		  float attn_factor, int interleave, void *stream);

/*
 * Paged KV caches (runtime/kv_pool.c): position p of row t's cache is cache row
 *   R(t, p) = moet_kv_row(table + off[t], shift[t], p)      (common/moet_kvrow.h)
 * of the row's layer base (k_base[t], ...). All three are device arrays. Passing NULL for a
 * moet_gpu_pages argument means contiguous caches: R(t, p) = p.
 */
typedef struct moet_gpu_pages {
	const int32_t *table; /* the block tables of the call's rows, concatenated */
	const int32_t *off;   /* [n_rows]: row t's table starts at table + off[t] */
	const int32_t *shift; /* [n_rows]: log2 of row t's positions per block */
} moet_gpu_pages;

/*
 * Appends each row's K and V to its own cache, in runtime/forward.c's layout: kvb row t
 * (t * kvb_stride) holds per head [k_nope (d_nope) | v (d_v)] (kv_b's output); k_pe row t
 * (t * k_pe_stride) the roped shared key part (d_rope). Position pos[t] of row t's cache, at
 * cache row r = R(t, pos[t]) (pages; NULL: r = pos[t]), gets
 *   K: k_base[t] + r * k_pos_stride + h * (d_nope + d_rope) <- [k_nope_h | k_pe]
 *   V: v_base[t] + r * v_pos_stride + h * d_v              <- v_h
 * k_base, v_base: device arrays [n_rows] of device pointers (a row's cache of this layer);
 * pos: device int32 [n_rows]. No two rows may name the same (cache, position). n_rows <= 65535.
 */
int moet_gpu_kv_write(const float *kvb, int64_t kvb_stride, const float *k_pe,
		      int64_t k_pe_stride, int64_t n_rows, int64_t n_heads, int64_t d_nope,
		      int64_t d_rope, int64_t d_v, float *const *k_base, float *const *v_base,
		      int64_t k_pos_stride, int64_t v_pos_stride, const int32_t *pos,
		      const moet_gpu_pages *pages, void *stream);

/*
 * Causal attention of n_rows rows, each over its own cache: for row t and head h, the query
 * at q + t * q_stride + h * d_qk attends to positions 0 .. pos[t] of K (k_base[t] +
 * R(t, p) * k_pos_stride + h * d_qk) and V (v_base[t] + R(t, p) * v_pos_stride + h * d_v),
 * R the pages' row (NULL: R(t, p) = p); the result goes to out + t * out_stride + h * d_v.
 * Arithmetic: moet_attend_ref's (binary64 sums in index order, exp_c softmax), so the
 * outputs equal the CPU's bit for bit (NaN payloads aside).
 * The K/V of a row's own position must be in the cache first (moet_gpu_kv_write).
 * d_qk, d_v <= 256; n_rows, n_heads <= 65535; pos[t] >= 0.
 * run: the longest run of consecutive rows of one sequence in the call (a hint, 0 if
 * unknown): from 8 on, the grouped kernel (MOET_GPU_ATTN=grouped, the default; ref: always
 * the per-row kernel) stages each K/V tile once per run of rows (rows of one sequence: same
 * k_base, v_base and, with pages, the same table offset and shift); the bits are the same.
 */
int moet_gpu_attention(const float *q, int64_t q_stride, int64_t n_rows, int64_t n_heads,
		       int64_t d_qk, int64_t d_v, float *const *k_base, float *const *v_base,
		       int64_t k_pos_stride, int64_t v_pos_stride, const int32_t *pos,
		       const moet_gpu_pages *pages, int64_t run, float scale, float *out,
		       int64_t out_stride, void *stream);

/*
 * The noaux_tc router for n_tok tokens: logits [n_tok][n_exp] (from moet_gpu_linear with the
 * router weights) -> scores 1 / (1 + exp_c(-logit)), then out_ids [n_tok][top_k] and out_w
 * [n_tok][top_k] identical to moet_router_select_ref's (canonical order, groups, weights).
 * bias: device [n_exp] (e_score_correction_bias). n_exp <= 4096, divisible by n_group when
 * n_group > 1.
 */
int moet_gpu_router(const float *logits, int64_t n_tok, int64_t n_exp, const float *bias,
		    int64_t n_group, int64_t topk_group, int64_t top_k, int norm_topk_prob,
		    float routed_scaling_factor, int32_t *out_ids, float *out_w, void *stream);

/*
 * Embedding: x [n_tok][table->cols] = rows tok[t] of the table (device data, BF16, F16 or F32)
 * decoded exactly to binary32; a token outside [0, table->rows) gives a row of +0.
 */
int moet_gpu_embed(const moet_mat *table, const int32_t *tok, int64_t n_tok, float *x,
		   void *stream);

/* Residual add: x[i] = x[i] + y[i] for i < n. */
int moet_gpu_add(float *x, const float *y, int64_t n, void *stream);

/*
 * The canonical combine (docs/numerics.md) of n_tok tokens: for each token t and j < H,
 *   routed = +0; routed = fma(w[t][i], y[slot[t][i]][j], routed) for i = 0 .. top_k-1;
 *   out[t][j] = canon(routed + shared[t][j])   (shared NULL: canon(routed))
 * y [n_y][H]: the expert outputs; slot, w [n_tok][top_k]: each token's rows of y and weights
 * in canonical order (a slot outside [0, n_y) reads as +0). out may be shared. Bit for bit the
 * CPU forward pass's combine. n_tok <= 65535.
 */
int moet_gpu_combine(const float *y, int64_t n_y, const int32_t *slot, const float *w,
		     int64_t top_k, const float *shared, int64_t n_tok, int64_t H, float *out,
		     void *stream);

/*
 * ---- Seeded sampling on the device (gpu/sample.cu) -------------------------------------------
 * One draw: the parameters of moet_sample (runtime/moet_sample.h), the draw's position and the
 * logits row it reads. Plain data, the same layout in C and CUDA.
 */
typedef struct moet_gpu_sample_row {
	double temperature; /* 0: greedy (moet_argmax); else finite > 0 */
	double top_p;       /* in (0, 1] */
	int64_t top_k;      /* 0: no limit */
	uint64_t seed;
	int64_t pos;        /* the position the drawn token takes (moet_sample's pos) */
	int64_t row;        /* logits row: logits + row * stride */
} moet_gpu_sample_row;

/* *out_bytes = device scratch moet_gpu_sample needs for n_rows draws over n_cols logits (the
 * row table; with n_cols > 2048 also one sort of up to 8 rows). Returns 0, MOET_EINVAL,
 * MOET_EDEVICE (cub's size query failed) or MOET_EUNSUP without CUDA. */
int moet_gpu_sample_scratch_bytes(int64_t n_rows, int64_t n_cols, size_t *out_bytes);

/*
 * out_ids[r] (device int32) = the token moet_sample(logits + rows[r].row * stride, n_cols,
 * params of rows[r], rows[r].pos) returns on the host, for every r < n_rows: the same
 * candidate order, the same binary64 sums in the same order (with moet_exp64, the one exp of
 * host and device) and the same splitmix64 uniform, so the ids are equal, not just close.
 * logits: device binary32; rows: a HOST array (copied into the scratch before this returns);
 * scratch: device memory of moet_gpu_sample_scratch_bytes(n_rows, n_cols) bytes, 256-byte
 * aligned (borrowed). out_mass (optional, device double [n_rows]): the kept prefix's total
 * (the number the uniform is scaled by; 0 for greedy rows), for tests.
 * Queued on `stream`; no allocation, no host wait. Batch-invariant and deterministic.
 * Returns 0, MOET_EINVAL (counts, pointers, alignment, stride < n_cols, scratch too small, a
 * parameter moet_sample_check would refuse; the detail names the row), MOET_EDEVICE or
 * MOET_EUNSUP without CUDA.
 */
int moet_gpu_sample(const float *logits, int64_t n_rows, int64_t n_cols, int64_t stride,
		    const moet_gpu_sample_row *rows, void *scratch, size_t scratch_bytes,
		    int32_t *out_ids, double *out_mass, void *stream);

/*
 * ---- Grouping of a MoE layer's routing pairs on the device (gpu/group.cu) --------------------
 * What runtime/dispatch.c does on the host after downloading the router's ids (staging off),
 * element for element: the pairs sorted by (expert, pair index) (moet_expert_pairs_sort),
 * split by tier with the layer's owner row (device 0, 1, .., n_dev-1, then the CPU tier), and
 * the combine's slot table. Used by the engine under MOET_GPU_DEVGROUP=1 (runtime/devgroup.c).
 */
#define MOET_GPU_GROUP_MAX_PAIRS (65536 * 8) /* n_pairs limit (65536 tokens x top_k 8) */
#define MOET_GPU_GROUP_MAX_EXP 4096          /* n_exp limit */
#define MOET_GPU_GROUP_MAX_DEV 64            /* n_dev limit (moet_model_set_placement's) */
#define MOET_GPU_GROUP_N_CLASS 6 /* token-count classes 1, 2, 3-4, 5-8, 9-16, 17+ (rows.cu) */

/* err[0] flags (err[1], err[2]: the first offender, -1 if none) */
#define MOET_GPU_GROUP_BAD_ID 1    /* an id outside [0, n_exp); err[1] = its smallest pair */
#define MOET_GPU_GROUP_BAD_OWNER 2 /* owner[e] not in [-1, n_dev); err[2] = smallest such e */

/* One routing pair: the layout of moet_expert_pair (runtime/moet_backend.h), its padding
 * spelled out and written as 0, so that arrays of both compare with memcmp. */
typedef struct moet_gpu_pair {
	int32_t expert;
	int32_t pad;  /* 0 */
	int64_t pair; /* t * top_k + i */
} moet_gpu_pair;

/* One touched expert of device 0: its pairs are positions first .. first + n_tok - 1. */
typedef struct moet_gpu_group_exp {
	int32_t expert;
	int32_t first; /* position of its first pair in the tier-ordered list (= its y row) */
	int32_t n_tok; /* its pairs (>= 1) */
} moet_gpu_group_exp;

/* The outputs: device memory of the caller, sizes in elements; P = n_pairs, X = min(P, n_exp),
 * T = n_dev + 1. Every field is required. */
typedef struct moet_gpu_group_bufs {
	moet_gpu_pair *pairs;      /* [P] the pairs in tier order (positions 0 .. P-1) */
	int32_t *slot;             /* [P] slot[pair] = the pair's position in `pairs` */
	int32_t *tier_first;       /* [T] first position of tier g (g = n_dev: the CPU tier) */
	int32_t *tier_count;       /* [T] its number of pairs */
	moet_gpu_group_exp *dev0;  /* [X] device 0's touched experts, by expert id */
	moet_gpu_group_exp *dev0_class; /* [X] the same, by (class of n_tok, expert id) */
	int32_t *class_first;      /* [6] first index in dev0_class of each class */
	int32_t *class_count;      /* [6] experts of each class */
	int32_t *n_dev0;           /* [1] number of device 0's touched experts */
	int32_t *err;              /* [3] 0, -1, -1 or the MOET_GPU_GROUP_BAD_* report */
} moet_gpu_group_bufs;

/* *out_bytes = device scratch of moet_gpu_group_pairs for n_pairs pairs over n_exp experts.
 * Returns 0, MOET_EINVAL (counts outside the limits above) or MOET_EUNSUP without CUDA. */
int moet_gpu_group_scratch_bytes(int64_t n_pairs, int64_t n_exp, size_t *out_bytes);

/*
 * Groups the n_pairs routing pairs of ids (device int32 [n_pairs], pair p = t * top_k + i, the
 * router's output) over n_exp experts:
 *   tier of expert e:  owner NULL: device 0 (n_dev >= 1);  else owner[e] (device int16
 *                      [n_exp], the layer's row of the placement): g >= 0 device g, -1 the CPU
 *   pairs:             for g = 0 .. n_dev-1 the pairs of g's experts, then the CPU tier's, each
 *                      tier in (expert, pair) order: runtime/dispatch.c's y rows with staging
 *                      off (the staged class of long prefills is not separated: the CPU tier
 *                      takes every cold pair)
 *   slot[p]:           p's position; tier_first/tier_count: each tier's run
 *   dev0, n_dev0:      device 0's experts with >= 1 pair, by id, with first and n_tok (what a
 *                      row kernel's group table needs); dev0_class, class_first/count: the same
 *                      list ordered by token-count class (1, 2, 3-4, 5-8, 9-16, 17+), then id
 * Entries past n_dev0 (dev0, dev0_class) are left as they were.
 * Bad input on the device never writes out of bounds: a pair whose id is outside [0, n_exp),
 * or whose expert has an owner outside [-1, n_dev), gets slot -1 and is in no tier (the tiers
 * then end before P); err (see MOET_GPU_GROUP_BAD_*) says so. err is written by every call,
 * so the caller reads it after moet_gpu_sync(stream) (or on the stream) instead of checking
 * the ids on the host.
 * Deterministic: the ranks within an expert come from one warp walking each chunk of pairs in
 * order, integer counts only (gpu/group.cu); repeated calls give the same bytes.
 * scratch: device memory of moet_gpu_group_scratch_bytes(n_pairs, n_exp) bytes, 256-byte
 * aligned (borrowed). Queued on `stream` (a few kernels); no allocation, no host wait.
 * Returns 0, MOET_EINVAL (counts outside the limits, NULL pointers, misaligned or small
 * scratch; the detail names which), MOET_EDEVICE (a launch failed) or MOET_EUNSUP without CUDA.
 * Thread-safe for different outputs and scratch.
 */
int moet_gpu_group_pairs(const int32_t *ids, int64_t n_pairs, int64_t n_exp,
			 const int16_t *owner, int n_dev, void *scratch, size_t scratch_bytes,
			 const moet_gpu_group_bufs *out, void *stream);

/*
 * ---- The expert FFN grouped on the device (gpu/rows_dev.cu; docs/cuda-graphs.md,
 * step 2) -------------------------------------------------------------------------------------
 * moet_gpu_expert_ffn's computation for device 0's pairs of a moet_gpu_group_pairs result,
 * with no host knowledge of the routing: the kernels read the group table and the experts'
 * weight pointers from device memory, so the launches depend on the batch size only.
 */

/* One expert's weights as the device-grouped call reads them (an entry of a device table
 * indexed by expert id): gate, up, down data and their F32 block scales (NULL: 1.0f). An
 * expert whose w[0] is NULL is not resident (its entry is never read for weights). */
typedef struct moet_gpu_expert_ptrs {
	const void *w[3];  /* gate, up, down: device pointers */
	const float *s[3];
} moet_gpu_expert_ptrs;

/* What the host knows of a layer's table, checked once (moet_gpu_expert_table). */
typedef struct moet_gpu_expert_geom {
	int64_t n_exp;        /* entries of the table (the layer's experts) */
	int64_t inter, hidden; /* I, H: gate and up [I x H], down [H x I] */
	int dtype;            /* moet_dtype: MOET_DT_F8_E4M3 or MOET_DT_BF16 */
	int up16, down16;     /* 16-byte staging for gate and up (down): rows of a multiple of
			       * 16 bytes, every resident expert's data 16-byte aligned */
} moet_gpu_expert_geom;

/*
 * Builds a layer's table on the host (the caller uploads it once, e.g. when the placement is
 * bound): exps [n_exp] (host array, index = expert id) are device views as for
 * moet_gpu_expert_ffn, an expert with gate.data NULL not resident (its other fields and
 * n_tok are ignored); out_table [n_exp] (host) gets the pointers, out_geom the shape.
 * Returns 0, MOET_EINVAL (NULL pointers, n_exp outside [1, MOET_GPU_GROUP_MAX_EXP], no
 * resident expert, misaligned data), MOET_ESHAPE (matrices that do not chain or differ between
 * experts; the detail names the expert) or MOET_EUNSUP (dtype, or a build without CUDA).
 */
int moet_gpu_expert_table(const moet_gpu_expert *exps, int64_t n_exp,
			  moet_gpu_expert_ptrs *out_table, moet_gpu_expert_geom *out_geom);

/* err[0] flags of moet_gpu_experts_devgroup (0: every pair of device 0 computed) */
#define MOET_GPU_DEVGROUP_OVER_MAX 1  /* an expert had more than max_tok pairs: not computed */
#define MOET_GPU_DEVGROUP_ABSENT 2    /* an expert of device 0 with no resident weights (or an
				       * id outside the table): not computed */

/*
 * For every touched expert e of device 0 in grp (dev0_class, class_first, class_count, pairs:
 * a moet_gpu_group_pairs result for these n_pairs pairs, device memory) and each of its pair
 * positions q = first .. first + n_tok - 1, with t = pairs[q].pair / top_k:
 *   y[q][.] = canon(D(down_e, ., silu_c(D(gate_e, ., x[t])) * D(up_e, ., x[t])))
 * bit for bit moet_gpu_expert_ffn over the same experts with tok[q] = t (the same kernels'
 * arithmetic; tests/gpu/test_gpu_devgroup.c). Rows of y of other tiers are not written.
 * table: device [geom->n_exp] (moet_gpu_expert_table's, uploaded); x [n_x][H], y [n_pairs][H]
 * binary32, device; a token outside [0, n_x) reads as a row of +0. scratch: device memory of
 * moet_gpu_expert_scratch_bytes(n_pairs, I) bytes (h). max_tok: a bound on any expert's pairs
 * (the token count when each token's ids are distinct, as the router's are; n_pairs always
 * holds): classes of more tokens are not launched, so fewer launches at small batches. err:
 * device int32 [1], set to 0 then to the MOET_GPU_DEVGROUP_* flags on the stream; read it
 * after moet_gpu_sync(stream).
 * The launches (a memset and at most 6 kernels per pass, each with the worst-case grid of its
 * token-count class) depend only on n_pairs, max_tok, geom, the variant switches
 * (MOET_GPU_ROWS_KERNEL, MOET_GPU_PDL, read at every call) and the alignment of x and scratch:
 * capturable in a CUDA graph and replayed for new ids of the same batch size. No allocation,
 * no host wait. Deterministic. Returns 0, MOET_EINVAL (NULL or misaligned pointers, counts
 * out of range, scratch too small, a bad geometry), MOET_EUNSUP (without CUDA) or
 * MOET_EDEVICE. Thread-safe for different outputs, scratch and err.
 */
int moet_gpu_experts_devgroup(const moet_gpu_expert_geom *geom,
			      const moet_gpu_expert_ptrs *table, const moet_gpu_group_bufs *grp,
			      int64_t n_pairs, int64_t top_k, int64_t max_tok, const float *x,
			      int64_t n_x, void *scratch, size_t scratch_bytes, float *y,
			      int32_t *err, void *stream);

/*
 * ---- The CPU tier of a device-grouped layer (gpu/tier_rows.cu; runtime/devgroup.c) ----------
 * What lets a layer with a CPU tier run with no host decision between its kernels: the rows
 * go to pinned host memory and back by kernels that read the tier's size on the device, and
 * the host's work is queued in stream order (a host node when the stream is captured).
 * host_* are pinned host memory (moet_gpu_host_alloc: with unified addressing the device reads
 * and writes them through their host address). g is a moet_gpu_group_pairs result with n_dev
 * devices (tier n_dev: the CPU's); max_pairs bounds its pairs (the grid: blocks past the
 * tier's count exit, so the launch depends on max_pairs only). Queued on stream; no host wait.
 * Return 0, MOET_EINVAL (NULL pointers, counts outside the grouping's limits), MOET_EDEVICE or
 * MOET_EUNSUP without CUDA.
 */
/* *host_count = the CPU tier's count n; for i < n: host_pairs[i] = its i-th pair (tier order)
 * and host_rows[i][0..H) = h[host_pairs[i].pair / top_k] (h device [..][H]); keep (device
 * int32 [2]) = the tier's first position and n, for moet_gpu_tier_rows_in after g is reused. */
int moet_gpu_tier_rows_out(const moet_gpu_group_bufs *g, int n_dev, int64_t max_pairs,
			   int64_t top_k, const float *h, int64_t H, moet_gpu_pair *host_pairs,
			   int32_t *host_count, float *host_rows, int32_t *keep, void *stream);
/* y[keep[0] + i][0..H) = host_rows[i] for i < keep[1] (y device). */
int moet_gpu_tier_rows_in(const int32_t *keep, int64_t max_pairs, const float *host_rows,
			  int64_t H, float *y, void *stream);
/* fn(arg) on a host thread of CUDA's once the stream's earlier work is done, before its later
 * work starts (cudaLaunchHostFunc). fn may not call CUDA. */
int moet_gpu_host_fn(void (*fn)(void *), void *arg, void *stream);
/* The stream's later work waits until (int32_t)(*word - value) >= 0: one thread of a kernel
 * polls the pinned host word (moet_gpu_host_alloc) about every microsecond, after the stream's
 * earlier work (MOET_TIER_FINISH=queued: the CPU tier's executor stores its finished tickets
 * there, cpu/moet_cpuexec.h). Queued; no host wait. 0, MOET_EINVAL (NULL), MOET_EDEVICE. */
int moet_gpu_wait_word(const uint32_t *word, uint32_t value, void *stream);

/*
 * ---- Fast mode of the expert FFN (gpu/expert_fast.cu; docs/fast-mode.md) ---------------------
 * NOT the exact-numerics contract: tensor-core GEMMs (cuBLAS, bf16 inputs, binary32
 * accumulation) on weights dequantized to bf16 per expert. Outputs differ from
 * moet_gpu_expert_ffn by bf16 rounding (tests/gpu/test_gpu_expert_fast.c bounds it), and
 * depend on the token count of the expert (cuBLAS picks kernels by shape).
 */
typedef struct moet_gpu_fast moet_gpu_fast;

/* A cuBLAS handle and its 32 MiB workspace on the current device. *out is the caller's
 * (moet_gpu_fast_destroy). Returns 0, MOET_ENOMEM, MOET_EDEVICE (cuBLAS's status in the
 * detail) or MOET_EUNSUP without CUDA. */
int moet_gpu_fast_create(moet_gpu_fast **out);
void moet_gpu_fast_destroy(moet_gpu_fast *f); /* accepts NULL */

/* MOET_GPU_EXPERT_MODE: unset, empty or "exact" -> *out_fast 0; "fast" -> 1; other text
 * MOET_EINVAL (a typo never changes numerics silently). Read at every call. */
int moet_gpu_expert_mode(int *out_fast);

/* MOET_GPU_FAST_MIN_TOK: the fewest tokens per expert that fast mode computes on tensor cores
 * (experts with fewer take the exact kernel; dequantizing costs more than it saves there);
 * unset or empty: 32. MOET_EINVAL for anything but an integer in [1, 2^31). */
int moet_gpu_fast_min_tok(int64_t *out_min_tok);

/* Device scratch bytes of moet_gpu_expert_ffn_fast for n_pairs pairs of experts of
 * intermediate size inter and hidden size hidden. */
size_t moet_gpu_expert_fast_scratch_bytes(int64_t n_pairs, int64_t inter, int64_t hidden);

/*
 * moet_gpu_expert_ffn's call (same experts, pairs, x, tok and y conventions) in fast mode:
 * experts with n_tok >= min_tok by tensor cores, per expert:
 *   xb = bf16(x[tok[p]]) (0 for a token outside [0, n_x));  W = bf16(dec(code) * scale)
 *   (the product in binary32, then rounded; BF16 weights as they are);  g, u = xb . W^T
 *   (cuBLAS, fp32 accumulation);  hb = bf16(silu_c(g) * u);  y = canon(hb . Wd^T)
 * and experts with fewer tokens by the exact kernel (bit for bit moet_gpu_expert_ffn).
 * min_tok <= 1: every expert on tensor cores. scratch: device memory of
 * moet_gpu_expert_fast_scratch_bytes(n_pairs, I, H) bytes (borrowed). Queued on `stream`; no
 * allocation, no host wait; deterministic for a given device and cuBLAS version. One call at a
 * time per handle. Returns moet_gpu_expert_ffn's codes, and MOET_EDEVICE for a cuBLAS failure.
 */
int moet_gpu_expert_ffn_fast(moet_gpu_fast *f, const moet_gpu_expert *exps, int64_t n_exp,
			     const float *x, int64_t n_x, const int32_t *tok, int64_t min_tok,
			     void *scratch, size_t scratch_bytes, float *y, void *stream);

/*
 * ---- Benchmark support (gpu/bench_ceil.cu): `moet-hybrid bench gpu-experts` --------------
 * The device's description, its ceilings measured in the calling process (device copy
 * bandwidth, cuBLAS binary32 GEMM rate with TF32 off), a CUDA-event timer and random fills.
 * Not for the inference path. Each returns 0, MOET_EINVAL, MOET_ENOMEM, MOET_EDEVICE (detail:
 * file:line, the call, CUDA's or cuBLAS's status) or MOET_EUNSUP in a build without CUDA.
 */
typedef struct moet_gpu_info {
	char name[256];          /* e.g. "NVIDIA H200" */
	int cc_major, cc_minor;  /* compute capability */
	int sm_count;
	size_t mem_bytes, l2_bytes;
	int driver_version;      /* cudaDriverGetVersion, e.g. 13000 */
	int runtime_version;     /* cudaRuntimeGetVersion (the cudart linked in) */
	int cublas_version;      /* cublasGetProperty major*10000 + minor*100 + patch */
} moet_gpu_info;

/* Describes device 0 (the one every other call of this header uses). */
int moet_gpu_info_get(moet_gpu_info *out);

/*
 * Device-to-device copy ceiling: allocates two buffers of `bytes`, fills the source, makes one
 * untimed copy, then times `reps` cudaMemcpyAsync D2D copies one by one with CUDA events:
 * samples_s[i] = seconds of copy i. Each copy reads and writes `bytes`. Frees what it took.
 */
int moet_gpu_bench_copy(size_t bytes, int reps, double *samples_s);

/*
 * Binary32 GEMM ceiling: cuBLAS SGEMM C[m x n] = A[m x k] B[k x n] (column-major, random
 * operands in [-1, 1)) with the math mode CUBLAS_PEDANTIC_MATH (no TF32, no reduced
 * precision): 2 untimed calls, then `reps` calls each timed with CUDA events into samples_s.
 * flops of one call: 2 m n k. Frees what it took (the handle too).
 */
int moet_gpu_bench_sgemm(int64_t m, int64_t n, int64_t k, int reps, double *samples_s);

/* Fills `bytes` of device memory with pseudo-random bytes (a function of seed and offset),
 * each ANDed with `mask` (0xFE keeps F8_E4M3 codes off the NaNs 0x7F/0xFF). Queued on stream. */
int moet_gpu_bench_fill_bytes(void *dst, size_t bytes, uint64_t seed, uint8_t mask,
			      void *stream);

/* Fills n floats of device memory with pseudo-random values uniform in [lo, hi). */
int moet_gpu_bench_fill_f32(float *dst, size_t n, uint64_t seed, float lo, float hi,
			    void *stream);

/* A pair of CUDA events: start() records the first on stream, stop() records the second, waits
 * for it, and gives the seconds between them (the GPU time of the work queued in between). */
typedef struct moet_gpu_timer moet_gpu_timer;
int moet_gpu_timer_create(moet_gpu_timer **out);
void moet_gpu_timer_destroy(moet_gpu_timer *t); /* accepts NULL */
int moet_gpu_timer_start(moet_gpu_timer *t, void *stream);
int moet_gpu_timer_stop(moet_gpu_timer *t, void *stream, double *out_s);

/*
 * Absorbed MLA (the latent cache; gpu/attention_latent.cu, kv_write_latent.cu).
 * kv_write_latent: row t's latent (width = kv_lora + rope floats at kva + t * kva_stride) to
 * c_base[t] + R(t, pos[t]) * c_stride (c_base: device array of the rows' layer caches; R the
 * pages' row, NULL: R(t, p) = p).
 * attention_latent: for every row and head, moet_attend_latent_ref's operations (cpu/) over
 * positions 0 .. pos[t] (cache row R(t, p)): q row t holds per head [q_nope (nope) |
 * q_pe (rope)]; kv_b (device view, [heads*(nope+v) x kv_lora], F8_E4M3 + scales, BF16 or
 * F32); out row t gets per head v_dim values. Bit for bit the CPU's (NaN payloads aside). kv_lora <= 1024, rope <= 256.
 */
int moet_gpu_kv_write_latent(const float *kva, long long kva_stride, long long width,
			     long long n_rows, float *const *c_base, long long c_stride,
			     const int32_t *pos, const moet_gpu_pages *pages, void *stream);
int moet_gpu_attention_latent(const float *q, long long q_stride, long long n_rows,
			      long long n_heads, long long nope, long long rope, long long v_dim,
			      const moet_mat *kv_b, float *const *c_base, long long c_stride,
			      const int32_t *pos, const moet_gpu_pages *pages, float scale,
			      float *out, long long out_stride, void *stream);

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)
#include "moet_kvrow.h"
/* R(t, p) of a moet_gpu_pages passed by value to a kernel (table NULL: contiguous). For the
 * kernels of gpu/ only. */
static __device__ __forceinline__ long long moet_gpu_page_row(const moet_gpu_pages pg, int t,
							      long long p)
{
	return pg.table ? (long long)moet_kv_row(pg.table + pg.off[t], pg.shift[t], p) : p;
}
#endif

#endif
