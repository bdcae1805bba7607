/*
 * moet_backend.h: what the model graph (runtime/forward.c) asks of a device.
 *
 * The graph is written once; a backend supplies memory and a small set of row-wise ops. The
 * CPU reference backend (runtime/backend_cpu.c) works on host memory; the CUDA backend works
 * on device memory with the kernels of gpu/. Every op works on a batch of n rows (tokens of
 * possibly different sequences) and must be deterministic and batch-invariant: a row's result
 * never depends on the other rows or on n.
 *
 *   weights     bound once at open: bind_mat turns a checkpoint matrix view (host mmap) into
 *               one the backend computes on (CPU: the same bytes; CUDA: a device copy of the
 *               bytes, verbatim); bind_vec likewise for small binary32 vectors
 *   activations backend buffers from alloc (CPU: malloc), [rows][width] with explicit strides
 *   rows        per batch, prepare_rows turns the host's row table (a moet_rowinfo per row:
 *               which cache, which position; and the token ids) into the backend's own form
 *               (moet_rows, opaque); embed, rope, the K/V store and attention read it; the
 *               caches are paged (block tables, moet_rowinfo)
 *
 * Ops return 0 or a negative MOET_E* code; they may run asynchronously (CUDA: one stream);
 * download and sync wait. NOTE: the op set is deliberately close to the reference's steps, so
 * that a backend can be checked op by op against cpu/ (tests/gpu) and the graph stays one.
 */
#ifndef MOET_BACKEND_H
#define MOET_BACKEND_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "moet_config.h"
#include "moet_kvrow.h"
#include "moet_mat.h"
#include "moet_sample.h"

typedef struct moet_backend moet_backend;
typedef struct moet_rows moet_rows; /* a batch's row table in the backend's form */

/*
 * Where one row of a batch reads and writes its attention cache: a paged cache (a pool of
 * blocks, runtime/kv_pool.c). Position p of the row's sequence lives in pool row
 * moet_kv_row(blocks, block_shift, p) (common/moet_kvrow.h) of each layer: K at
 * k + l * k_layer + row * k_row, V likewise (k_row, v_row: floats per position, known to the
 * ops from the geometry).
 */
typedef struct moet_rowinfo {
	float *k;              /* the pool's K of layer 0: [rows][k_row]; layer l at l*k_layer */
	float *v;              /* the same for V (NULL in the absorbed form) */
	int64_t k_layer;       /* floats from one layer's K to the next */
	int64_t v_layer;
	const int32_t *blocks; /* the sequence's block table (host, borrowed for the call) */
	int64_t n_blocks;      /* its entries: enough for every position of the call */
	int block_shift;       /* log2 of the positions per block */
	int64_t pos;           /* the row's position in its sequence */
} moet_rowinfo;

/* The expert weights a backend computes on (bound views). */
typedef struct moet_ffn_w {
	moet_mat gate; /* [I x H] */
	moet_mat up;   /* [I x H] */
	moet_mat down; /* [H x I] */
} moet_ffn_w;

/* A (row, slot) routing pair and its expert. */
typedef struct moet_expert_pair {
	int32_t expert;
	int64_t pair; /* t * top_k + i */
} moet_expert_pair;

/* Geometry the attention ops need (from config.json). */
typedef struct moet_attn_dims {
	int64_t n_heads, nope, rope, v_dim; /* qk head = nope + rope */
	int rope_interleave;
	float softmax_scale;
} moet_attn_dims;

/* One token to draw from a row of logits: moet_sample's arguments and where the id goes. */
typedef struct moet_draw {
	const moet_sample_params *p; /* borrowed */
	int64_t row;                 /* the logits row: logits + row * V */
	int64_t pos;                 /* the draw's position (moet_sample's pos) */
	int64_t *out_id;             /* host */
} moet_draw;

#define MOET_BACKEND_FENCES 4

/* The driver's waits that idle marks tell apart (moet_backend_ops.idle_mark): for a MoE
 * layer's routing (the ids' download, their grouping, the CPU tier's start) and for the CPU
 * tier's end. */
enum { MOET_IDLE_ROUTE = 0, MOET_IDLE_TIER = 1, MOET_IDLE_KINDS = 2 };

typedef struct moet_backend_ops {
	const char *name;
	int host_memory; /* 1: buffers and bound weights are host memory (the CPU backend) */
	void (*destroy)(moet_backend *be);

	/* memory */
	int (*alloc)(moet_backend *be, size_t bytes, void **out);
	void (*free)(moet_backend *be, void *p);
	int (*upload)(moet_backend *be, void *dst, const void *src, size_t bytes);
	int (*download)(moet_backend *be, void *dst, const void *src, size_t bytes);
	/* Optional (NULL: upload instead): host_alloc memory to backend memory, queued in order
	 * with the ops and returning at once; the caller leaves src unchanged until a later
	 * download has returned (downloads wait for the ops queued before them). */
	int (*upload_async)(moet_backend *be, void *dst, const void *src, size_t bytes);
	/* Optional, all three or none (NULL: not offered): backend memory to host_alloc memory,
	 * queued in order with the ops and returning at once; fence i (0 ..
	 * MOET_BACKEND_FENCES - 1) recorded at this point of the queue; fence_wait returns once
	 * the work queued before fence i's last record is done (the bytes of the downloads
	 * queued before it are then in dst). */
	int (*download_async)(moet_backend *be, void *dst, const void *src, size_t bytes);
	int (*fence)(moet_backend *be, int i);
	int (*fence_wait)(moet_backend *be, int i);
	/* Optional with them (NULL: only fence_wait): *out_done whether fence i has been
	 * reached, without waiting (MOET_MB_POLL). */
	int (*fence_done)(moet_backend *be, int i, int *out_done);
	/* Optional (NULL: not offered): backend memory to backend memory, queued in order with
	 * the ops (the two micro-batches' merged expert call, dispatch.c). */
	int (*copy)(moet_backend *be, void *dst, const void *src, size_t bytes);
	/* Host memory the backend copies to and from at full speed (CUDA: pinned), for the
	 * hybrid engine's staging buffers; host_free accepts NULL. */
	int (*host_alloc)(moet_backend *be, size_t bytes, void **out);
	void (*host_free)(moet_backend *be, void *p);

	/* weights (owned by the backend, released by destroy) */
	int (*bind_mat)(moet_backend *be, const moet_mat *host, moet_mat *out);
	int (*bind_vec)(moet_backend *be, const float *host, int64_t n, const float **out);

	/* The batch's rows (host arrays of n entries) in the backend's form, valid until the
	 * next call with the same slot (0 or 1: the micro-batches of a pipelined pass; owned by
	 * the backend). n_layers: the model's layer count. */
	int (*prepare_rows)(moet_backend *be, int slot, const moet_rowinfo *rows,
			    const int64_t *tokens, int64_t n, int64_t n_layers,
			    const moet_rows **out);
	/* x[t][:] = dec(table[token of row t][:]) for t < n; table [V x H] BF16/F16/F32. */
	int (*embed)(moet_backend *be, const moet_mat *table, const moet_rows *rows, int64_t n,
		     float *x);
	/* out[t] = rmsnorm(x[t]) * w over dim columns; out may alias x. */
	int (*rmsnorm)(moet_backend *be, const float *x, int64_t x_stride, const float *w,
		       int64_t n, int64_t dim, double eps, float *out, int64_t out_stride);
	/* y[t][r] = D(W, r, x[t]) (the contract dot) for every row r of W. */
	int (*linear)(moet_backend *be, const moet_mat *w, const float *x, int64_t x_stride,
		      int64_t n, float *y, int64_t y_stride);
	/* x[i] = x[i] + y[i] for i < n_elems. */
	int (*add)(moet_backend *be, float *x, const float *y, int64_t n_elems);
	/* RoPE at each row's position on n_heads rope parts of 2*n_freq values: the part of
	 * head h of row t starts at x + t*x_stride + h*head_stride. inv_freq[n_freq] (bound),
	 * attn_factor multiplies cos and sin. */
	int (*rope)(moet_backend *be, float *x, int64_t x_stride, int64_t head_stride,
		    int64_t n_heads, int64_t n, const moet_rows *rows, const float *inv_freq,
		    int64_t n_freq, float attn_factor, int interleave);
	/* Writes layer l's K and V of each row into its cache at its position (the pool row
	 * moet_kv_row names): per head h,
	 * K = [kvb[t][h*(nope+v) .. +nope] | k_pe[t][0 .. rope]], V = kvb[t][h*(nope+v)+nope ..]. */
	int (*kv_store)(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *kvb,
			int64_t kvb_stride, const float *k_pe, int64_t k_pe_stride, int64_t n,
			const moet_rows *rows);
	/* out[t][h*v_dim ..] = softmax(q_h . K_h[0..pos] x scale) . V_h for each row, layer l. */
	int (*attend)(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *q,
		      int64_t q_stride, int64_t n, const moet_rows *rows, float *out,
		      int64_t out_stride);
	/* Absorbed MLA (the latent cache; NULL in a backend without it). kv_store_latent: each
	 * row's [c | k_pe] (width = kv_lora + rope floats at kva + t*kva_stride) into its cache
	 * of layer l at its position (the K pointers of the rows; V is unused). attend_latent:
	 * per row and head, cpu/moet_cpu.h's moet_attend_latent_ref over positions 0..pos, with
	 * kv_b [heads*(nope+v) x kv_lora] (bound). */
	int (*kv_store_latent)(moet_backend *be, int64_t l, const float *kva, int64_t kva_stride,
			       int64_t width, int64_t n, const moet_rows *rows);
	int (*attend_latent)(moet_backend *be, const moet_attn_dims *d, const moet_mat *kv_b,
			     int64_t l, const float *q, int64_t q_stride, int64_t n,
			     const moet_rows *rows, float *out, int64_t out_stride);
	/* Router: scores = sigmoid(logits) (exp_c); noaux_tc selection in canonical order and
	 * weights (cpu/router_ref.c), ids [n][top_k], weights [n][top_k]. */
	int (*route)(moet_backend *be, const moet_config *c, const float *logits,
		     const float *bias, int64_t n, int32_t *ids, float *weights);
	/* y[q][:] = expert pairs[q].expert (of table[]) applied to h[pairs[q].pair / top_k], for
	 * q < n_pairs; pairs (a host array) run expert by expert (moet_expert_pairs_sort order).
	 * h has n rows. table entries of experts not named may be empty. */
	int (*experts_grouped)(moet_backend *be, const moet_ffn_w *table,
			       const moet_expert_pair *pairs, int64_t n_pairs, int64_t top_k,
			       const float *h, int64_t n, float *y);
	/* out[t] = FFN(w, h[t]) (dense MLP or shared experts). */
	int (*ffn)(moet_backend *be, const moet_ffn_w *w, const float *h, int64_t n, float *out);
	/* Optional (NULL: MOET_TP keeps the dense MLP and shared experts whole on rank 0): the
	 * first half of ffn, h[t][i] = silu_c(D(gate, i, x[t])) * D(up, i, x[t]) for every row i
	 * of gate and up (the same rows), bit for bit the h that ffn computes inside. */
	int (*gate_up)(moet_backend *be, const moet_mat *gate, const moet_mat *up, const float *x,
		       int64_t x_stride, int64_t n, float *h, int64_t h_stride);
	/* out[t][j] = canon(sum_i fma(weights[t][i], y[slot[t][i]][j], .) + (shared ?
	 * shared[t][j] : 0)), i in canonical order: the contract's combine. y has n_y rows; a
	 * slot outside [0, n_y) reads as a row of +0 (the fma still performed). out may alias
	 * shared. */
	int (*combine)(moet_backend *be, const float *y, int64_t n_y, const int32_t *slot,
		       const float *weights, int64_t top_k, const float *shared, int64_t n,
		       int64_t dim, float *out);
	/* Optional (NULL: moet_backend_draw downloads the rows and samples on the host): the
	 * draws of moet_backend_draw on the backend, the same tokens, only ids coming back. */
	int (*sample)(moet_backend *be, const float *logits, int64_t V, const moet_draw *d,
		      int64_t n);
	/* Optional (NULL: no CUDA graphs, as on the CPU backend): a pass's work captured and
	 * replayed (runtime/graph.c). capture_begin: the backend's work from here is recorded, not
	 * run (MOET_EUNSUP when its stream cannot be captured: CUDA on the legacy stream);
	 * capture_end: *out_graph the instance, or MOET_EDEVICE (the capture failed: nothing
	 * recorded ran, nothing is left recorded); graph_launch queues an instance; graph_free
	 * frees one; mem_epoch: a counter every allocation and free of the backend's memory
	 * advances (a graph names only live buffers while it is unchanged). */
	int (*capture_begin)(moet_backend *be);
	int (*capture_end)(moet_backend *be, void **out_graph);
	int (*graph_launch)(moet_backend *be, void *graph);
	void (*graph_free)(moet_backend *be, void *graph);
	uint64_t (*mem_epoch)(moet_backend *be);
	/* Optional (NULL: the backend cannot tell): the device's idle time around the driving
	 * thread's waits. idle_mark(be, 0) where the driver is about to block (for the routing
	 * ids, for the CPU tier): its queue may run dry; idle_mark(be, 1) where it resumes, before
	 * it queues more work. idle_take, after a point where everything queued has run (a
	 * download), adds up, since the last take, the time from each pair's first mark being
	 * reached (the work queued before it done) to its second (queued when the driver came
	 * back): the time the device had nothing queued, per kind of wait (out_s[kind]: the kind
	 * given at the pair's first mark, MOET_IDLE_*; ignored at the second). Unpaired or surplus
	 * marks are dropped; marks while a capture is open are ignored. */
	int (*idle_mark)(moet_backend *be, int resume, int kind);
	/* Optional (NULL: one stream): two micro-batches on two streams (MOET_MB_STREAMS=2).
	 * stream_select(be, slot) with slot 0 or 1: this thread's following work goes on that
	 * micro-batch's stream, which first waits for the work queued before on the pass's
	 * stream (once after each join); slot -1, the join: the pass's stream waits for both and
	 * takes the following work. The two streams' work may overlap: the caller keeps their
	 * data apart. */
	int (*stream_select)(moet_backend *be, int slot);
	/* Optional with it (NULL: a merged pass keeps one stream): the selected micro-batch
	 * stream waits for the work queued so far on the other one, `slot` (a merged expert call
	 * reads both halves' rows, and the first half's combine its outputs: MOET_MB_MERGE).
	 * MOET_EINVAL unless a half's stream is selected and slot is the other half's. */
	int (*stream_wait)(moet_backend *be, int slot);
	int (*idle_take)(moet_backend *be, double out_s[MOET_IDLE_KINDS]);
	/* Optional (NULL: no timeline; MOET_TRACE, runtime/backend_trace.c): trace_point queues a
	 * timestamp on the current stream (the selected micro-batch's, or the pass's) and gives
	 * its number, counted from 0 since the last trace_times; trace_times(be, n, out_ns), with
	 * n the points queued since then, waits for them and writes each one's time in ns on
	 * moet_now_ns's clock (when the stream reached it: the work queued before it done), then
	 * counts from 0 again. The CPU backend runs each op on the calling thread: its points are
	 * the clock's readings at the calls. */
	int (*trace_point)(moet_backend *be, int64_t *out_id);
	int (*trace_times)(moet_backend *be, int64_t n, uint64_t *out_ns);
	/* Optional (NULL: not offered): the current stream's later work waits until
	 * (int32_t)(*word - value) >= 0, word a host_alloc word another thread stores to
	 * (MOET_TIER_FINISH=queued: the CPU tier's executor, cpu/moet_cpuexec.h
	 * moet_cpuexec_set_done_word). Queued (CUDA: a one-thread kernel polling it); the CPU
	 * backend, which runs each op at once, waits here. */
	int (*wait_word)(moet_backend *be, const uint32_t *word, uint32_t value);
} moet_backend_ops;

/*
 * *d[r].out_id = moet_sample(logits + d[r].row * V, V, d[r].p, d[r].pos) for r < n, logits in
 * backend memory: through the backend's sample op when it has one (CUDA: gpu/sample.cu, the
 * same tokens; only ids cross PCIe), unless MOET_SAMPLE_DEVICE=0; otherwise each row is
 * downloaded and sampled on the host (runtime/draw.c). Returns 0 or a MOET_E* code
 * (MOET_EINVAL naming MOET_SAMPLE_DEVICE when it is set to other than 0 or 1, any backend).
 */
int moet_backend_draw(moet_backend *be, const float *logits, int64_t V, const moet_draw *d,
		      int64_t n);

struct moet_backend {
	const moet_backend_ops *ops;
	void *impl;
};

/* The CPU reference backend (host memory, the cpu/ kernels through the kernel table
 * moet_cpu_kernels_get()); n_threads workers of the expert executor (0: MOET_CPU_THREADS, else
 * one per core; 1: everything on the calling thread); max_inter: the largest FFN width. */
int moet_backend_cpu_create(int n_threads, int64_t max_inter, moet_backend **out);
/* The CPU backend's record of stream_select and stream_wait (its test double of two
 * micro-batch streams): the selected stream (-1: joined), the selections of a half's stream,
 * the joins and the waits so far; zeros and -1 for another backend. */
void moet_backend_cpu_streams(moet_backend *be, int *sel, uint64_t *selects, uint64_t *joins,
			      uint64_t *waits);

/* The CUDA backend on device `device`; MOET_EUNSUP in a build without CUDA. */
int moet_backend_cuda_create(int device, moet_backend **out);

/* MOET_GPU_STREAM=legacy|own, parsed (moet_backend_cuda_create refuses a bad value, naming it,
 * before it looks for a device): *out_own 1 for own, also when unset under MOET_CUDA_GRAPH=1
 * (which refuses an explicit legacy). Returns 0 or MOET_EINVAL. */
int moet_backend_cuda_stream_switch(int *out_own);

/* MOET_CUDA_GRAPH=0|1 (unset or empty: 0), parsed: decode passes captured into CUDA graphs
 * (runtime/graph.c). Returns 0 or MOET_EINVAL naming the value. */
int moet_graph_switch(int *out_on);

/* A switch that MOET_CUDA_GRAPH=1 needs on (MOET_GPU_STREAM=own, MOET_GPU_DEVGROUP=1): *on,
 * parsed from `var` (name `on_name` for on), is set to 1 when the graphs are on and var is
 * unset or empty; MOET_EINVAL naming both when the graphs are on and var is set off. */
int moet_graph_needs(const char *var, const char *on_name, int *on);

/* out[0..n) = the pairs of ids[0..n) sorted by expert, then by pair index: consecutive runs
 * of one expert, in the same order on every backend. Returns 0 or MOET_EINVAL (negative id). */
int moet_expert_pairs_sort(const int32_t *ids, int64_t n, moet_expert_pair *out);

/* A backend that forwards every op to `inner` (which it then owns) and times each one, waiting
 * for inner after it (runtime/backend_timed.c; MOET_OP_TIMES=1 at model open). report prints
 * the ops by time, per step (the times divided by `per`) to f (NULL: prints nothing), and may
 * reset them; MOET_EINVAL if be is not a timed backend. */
int moet_backend_timed_create(moet_backend *inner, moet_backend **out);
/* MOET_TRACE (runtime/backend_trace.c): a backend that forwards every op to `inner` and
 * brackets each with the inner backend's trace points (which it must have), without waiting;
 * moet_backend_trace_flush, after a pass (everything it queued has run), turns the points
 * into spans on the timeline `t` (one lane per stream). The wrapper owns inner, not t. */
struct moet_trace;
int moet_backend_trace_create(moet_backend *inner, struct moet_trace *t, moet_backend **out);
int moet_backend_trace_flush(moet_backend *be);
/* The timeline the traced backend writes to from now on (NULL: none; a backend that is not
 * traced: nothing). */
void moet_backend_trace_set(moet_backend *be, struct moet_trace *t);
int moet_backend_timed_report(moet_backend *be, double per, FILE *f, int reset);

/* By name: "cpu" or "cuda" (device 0), sized for the model of config c. */
int moet_backend_create(const char *name, const moet_config *c, moet_backend **out);

static inline void moet_backend_destroy(moet_backend *be)
{
	if (be)
		be->ops->destroy(be);
}

#endif
