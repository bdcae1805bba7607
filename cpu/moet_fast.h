/*
 * moet_fast.h: the opt-in fast mode of the CPU expert FFN (docs/fast-mode.md). NOT the
 * exact-numerics contract: results differ from moet_expert_ffn() by bf16 rounding, within a
 * bound that tests/cpu/test_expert_fast.c checks. Exact mode stays the default.
 *
 *   x [n_tok][H] f32 --bf16--> xb                      (once per call)
 *   gate/up rows in slices of S (+ S up rows), each slice on one thread of the team:
 *       dequantize the 2S rows (FP8 code x block scale, or BF16 as is) into bf16, a chunk
 *       of at most k_chunk columns at a time, in the thread's own L2
 *       [g | u] (+)= xb . panel^T     single-threaded oneDNN matmul, bf16 in, f32 out
 *       hb[t][i] = bf16(silu_c(g) * u)                 (f32, one multiply, then rounded)
 *   down rows in slices of S2, likewise: y[:, slice] = hb . panel^T   (f32 out)
 *   y = canon_nan(y)
 *
 * No dequantized copy of an expert is kept: each thread's panel holds one slice's chunk.
 * oneDNN picks its kernels at run time (moet_fast_isa()): AMX bf16 where the CPU has it
 * (oneDNN 2.6.3 does so by default), AVX-512 bf16 or plain AVX-512 elsewhere. The speed-up
 * over exact mode comes from AMX; without it fast mode is about as fast as exact mode.
 */
#ifndef MOET_FAST_H
#define MOET_FAST_H

#include <stdint.h>

#include "moet_mat.h"

typedef enum moet_expert_mode_t {
	MOET_EXPERT_MODE_EXACT = 0, /* the contract (docs/numerics.md), bit-identical */
	MOET_EXPERT_MODE_FAST = 1,  /* this module: bf16 oneDNN matmuls, tolerance-tested */
} moet_expert_mode_t;

/* "exact" or "fast" into *out_mode. Returns 0, or MOET_EINVAL for anything else (NULL too). */
int moet_expert_mode_parse(const char *s, moet_expert_mode_t *out_mode);

/*
 * The mode the engine should use: MOET_EXPERT_MODE=exact|fast from the environment, read on
 * every call (cheap; callers read it once at engine creation). Unset or empty: exact. Any
 * other value: exact as well, so a typo never silently changes numerics to fast; callers that
 * want to reject it use moet_expert_mode_parse(getenv("MOET_EXPERT_MODE"), ...).
 */
moet_expert_mode_t moet_expert_mode(void);

/* 1 if this build has the fast path (oneDNN found at configure time), else 0. */
int moet_fast_available(void);

typedef struct moet_fast moet_fast;

typedef struct moet_fast_opts {
	int64_t max_tok;   /* tokens per call; 0: 1024 */
	int64_t max_hidden;/* largest H (gate/up cols, down rows); 0: 7168 */
	int64_t max_inter; /* largest I (gate/up rows, down cols); 0: 2048 */
	int n_threads;     /* OpenMP threads for dequantization and oneDNN; 0: omp default */
	/* work split (docs/fast-mode.md); 0: the defaults measured best on the AMX host */
	int64_t slice_rows;      /* gate rows (and as many up rows) per slice; 0: 64 */
	int64_t slice_rows_down; /* down rows per slice; 0: 128 */
	int64_t k_chunk;         /* most weight columns per matmul (rounded up to 128); 0: 2048 */
} moet_fast_opts;

/*
 * Creates a handle: a oneDNN CPU engine and scratch for max_tok tokens (2 x max_tok x (H + I)
 * bytes of bf16). Each of the n_threads workers allocates its own on its first call: a oneDNN
 * stream, 4 x max_tok x max(2 slice_rows, slice_rows_down) bytes of f32, and a panel and
 * scratchpad sized by its primitives (about 2 x k_chunk x 2 slice_rows bytes). Calls allocate
 * nothing except on the first use of an (n_tok, shape) pair, which creates and caches its
 * oneDNN primitives (32 kept per worker, least recently used evicted). opts may be NULL.
 * Returns 0, MOET_EUNSUP (built without oneDNN, or oneDNN refused to create its engine or
 * stream; the detail has its status), MOET_EINVAL (negative option) or MOET_ENOMEM.
 * *out is the caller's (moet_fast_destroy).
 */
int moet_fast_create(const moet_fast_opts *opts, moet_fast **out);

/* Frees the handle, its primitives and scratch. NULL is fine. */
void moet_fast_destroy(moet_fast *f);

/*
 * Fast-mode expert FFN: y[t] ~= down(silu_c(gate x_t) * up x_t) for t < n_tok, computed as in
 * the note above. x [n_tok][H] and y [n_tok][H] f32 (y must not alias x); gate, up [I x H],
 * down [H x I], each F8_E4M3 with its F32 [ceil(rows/128)][ceil(cols/128)] scales, or BF16
 * (scale_inv NULL); the three may differ in dtype. NaN outputs come out as 0x7FC00000.
 * Runs on the calling thread's OpenMP team (opts.n_threads threads); the caller's OpenMP
 * settings are left as they are. Not thread-safe on one handle: one call at a time.
 * Returns 0, MOET_ESHAPE (matrices do not chain, or a dtype other than F8_E4M3/BF16, or F8
 * without scales), MOET_ERANGE (n_tok, H or I above the handle's maxima), MOET_EINVAL (NULL
 * or negative arguments), MOET_ENOMEM, or MOET_EUNSUP (oneDNN could not create or run a
 * primitive; the detail has its status).
 */
int moet_fast_expert_ffn(moet_fast *f, const moet_mat *gate, const moet_mat *up,
			 const moet_mat *down, const float *x, int64_t n_tok, float *y);

/*
 * The CPU instruction set oneDNN dispatches to in this process, as a short name: "amx"
 * (avx512_core_amx), "avx512_bf16", "avx512_vnni", "avx512", "avx2", "other"; "none" when
 * built without oneDNN. For bench records and logs.
 */
const char *moet_fast_isa(void);

#endif
