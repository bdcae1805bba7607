/*
 * backend_cuda_int.h: the CUDA backend's state (runtime/backend_cuda.c), shared with
 * runtime/backend_cuda_sync.c, which holds its ordering ops: fences, idle marks, the
 * micro-batch streams, trace points and graph capture. Private to those two files.
 */
#ifndef MOET_BACKEND_CUDA_INT_H
#define MOET_BACKEND_CUDA_INT_H

#include <stdint.h>

#include "moet_backend.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"

#define CU_IDLE_PAIRS 256 /* idle marks kept between two takes (a pass has a few per layer) */

struct moet_rows {
	int32_t *tok;        /* device [n] */
	int32_t *pos;        /* device [n] */
	float **kbase;       /* device [n_layers][n]: row t's cache K at layer l */
	float **vbase;       /* device [n_layers][n] */
	moet_gpu_pages pages;/* device: each row's block table, its offset and block shift */
	int64_t k_row, v_row;/* floats per position (from the row table) */
	int64_t n;
	int64_t max_run;     /* the longest run of consecutive rows of one sequence */
};

/* An expert call's device scratch and host tables, grown (never shrunk): nothing allocated per
 * call. One per micro-batch stream, so that the two halves' calls never share them. */
typedef struct cu_half {
	void *scratch;       /* expert h rows */
	size_t scratch_bytes;
	int32_t *pair_tok;   /* device [cap_pairs]: the token of each grouped pair */
	int64_t cap_pairs;
	int32_t *tok_pin;    /* pinned [cap_group]: the pairs' tokens, copied to pair_tok */
	moet_gpu_expert *ge; /* [cap_group]: the call's experts */
	int64_t cap_group;
	void *tok_ev;        /* recorded after tok_pin's copy: it may be rewritten once done */
	int tok_ev_used;
	void *fast_scratch;  /* issue 4's fast mode */
	size_t fast_bytes;
} cu_half;

typedef struct cuda_be {
	moet_backend be;
	int device;
	void *stream;        /* MOET_GPU_STREAM=own: the passes' stream (blocking), else NULL */
	void **owned;        /* bound weights and vectors */
	int n_owned, cap_owned;
	moet_rows rows[2];   /* per slot (the micro-batches of a pass) */
	void *rows_dev[2];   /* one device block behind each slot's rows */
	size_t rows_bytes[2];
	void *host_stage[2]; /* host staging of the row block (pinned with an own stream) */
	void *rows_ev[2];    /* own stream: recorded after each slot's async row copy */
	int rows_ev_used[2];
	/* the expert calls' state, one per micro-batch stream (moet_cu_stream_select; [0] on one) */
	cu_half half[2];
	int32_t *iota;       /* device [cap_iota]: 0, 1, 2, ... (dense FFN pairs), read-only */
	int64_t cap_iota;
	/* two micro-batch streams (MOET_MB_STREAMS, moet_cu_stream_select): made at the first
	 * select, blocking; `sel` the selected one (-1: the pass's stream, `stream`), `joined`
	 * whether stream i has waited for the pass's stream since its last join; wait_ev[i]
	 * recorded on stream i for the other's wait (moet_cu_stream_wait) */
	void *mb_stream[2], *mb_ev[2], *base_ev, *wait_ev[2];
	int sel, joined[2];
	/* MOET_MB_PRIO=1: the micro-batch streams at the device's highest priority, and each
	 * half's grouped expert calls on a stream of the lowest (`xs`, made at the first call;
	 * events xs_ev[i][0] into it, [1] back), so that one half's dense work (the CPU tier's
	 * next start waits for it) runs before the other's expert blocks */
	int prio;
	void *xs_stream[2], *xs_ev[2][2];
	/* trace points (MOET_TRACE): events, created as needed and kept; tp_n queued since the
	 * last trace_times; tp_anchor recorded at trace_times to place them on the host clock */
	void **tp_ev;
	int64_t tp_n, tp_cap;
	void *tp_anchor;
	/* issue 4: device sampling and the fast expert mode (grow-only, own scratch) */
	void *smp_scratch;   /* gpu/sample.cu's scratch */
	size_t smp_bytes;
	int32_t *smp_ids;    /* device [smp_cap] */
	int64_t smp_cap;
	moet_gpu_fast *fast; /* created at the first fast call */
	/* idle_mark / idle_take: event pairs (created at the first mark, kept), the pairs
	 * recorded since the last take, whether a pair is open, whether a capture is */
	void *idle_ev[2][CU_IDLE_PAIRS];
	/* with two micro-batch streams, a pair's first mark on the other stream too (the
	 * device is idle once both have run dry): idle_other[i] whether pair i has it */
	void *idle_ev_other[CU_IDLE_PAIRS];
	unsigned char idle_other[CU_IDLE_PAIRS];
	unsigned char idle_kind[CU_IDLE_PAIRS]; /* each pair's kind (MOET_IDLE_*) */
	int idle_n, idle_open, capturing;
	void *fence_ev[MOET_BACKEND_FENCES]; /* created at their first record, kept */
} cuda_be;

static inline cuda_be *impl(moet_backend *be)
{
	return (cuda_be *)be->impl;
}

/* The expert calls' state of the selected stream (moet_cu_stream_select). */
static inline cu_half *cur_half(cuda_be *c)
{
	return &c->half[c->sel > 0];
}

/* The stream the backend's own copies and marks go on: the selected micro-batch's, or the
 * pass's (NULL: the legacy stream). */
static inline void *cur_stream(cuda_be *c)
{
	return c->sel >= 0 ? c->mb_stream[c->sel] : c->stream;
}

/* backend_cuda_sync.c: the ops of moet_backend_ops of those names */
int moet_cu_fence(moet_backend *be, int i);
int moet_cu_fence_wait(moet_backend *be, int i);
int moet_cu_fence_done(moet_backend *be, int i, int *out_done);
int moet_cu_idle_mark(moet_backend *be, int resume, int kind);
int moet_cu_idle_take(moet_backend *be, double out_s[MOET_IDLE_KINDS]);
int moet_cu_stream_select(moet_backend *be, int slot);
int moet_cu_stream_wait(moet_backend *be, int slot);
int moet_cu_trace_point(moet_backend *be, int64_t *out_id);
int moet_cu_trace_times(moet_backend *be, int64_t n, uint64_t *out_ns);
int moet_cu_capture_begin(moet_backend *be);
int moet_cu_capture_end(moet_backend *be, void **out_graph);
int moet_cu_graph_launch(moet_backend *be, void *graph);
void moet_cu_graph_free(moet_backend *be, void *graph);
uint64_t moet_cu_mem_epoch(moet_backend *be);

#endif
