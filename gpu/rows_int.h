/*
 * rows_int.h: private interface of gpu/rows.cu, the one implementation of the contract dot
 * product D(W, r, x) on the device (docs/numerics.md), shared by the expert FFN (expert.cu)
 * and the dense linear layers (linear.cu). CUDA files of gpu/ only.
 *
 * A job computes, for a list of groups (an expert each, or one matrix), every (row, token) of
 * each group:
 *   nmat 2:  out[p][i] = silu_c(D(W0, i, x[tok[p]])) * D(W1, i, x[tok[p]])
 *   nmat 1:  out[p][i] = D(W0, i, x[tok[p]])   (canon != 0: NaN canonicalized)
 * where the pairs p are numbered group by group (group g owns n_0 + .. + n_{g-1} .. + n_g - 1)
 * and tok == NULL means tok[p] = p. Groups come from a callback so that callers need no array
 * of their own (no allocation inside an op).
 */
#ifndef MOET_GPU_ROWS_INT_H
#define MOET_GPU_ROWS_INT_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "moet_dtype.h"

enum { MOET_ROWS_F8 = 0, MOET_ROWS_BF16 = 1, MOET_ROWS_F32 = 2 };

/* The rows kind of a weight dtype (F8_E4M3, BF16, anything else F32: callers validate). */
static inline int moet_rows_dt(moet_dtype dt)
{
	return dt == MOET_DT_F8_E4M3 ? MOET_ROWS_F8 : dt == MOET_DT_BF16 ? MOET_ROWS_BF16
								   : MOET_ROWS_F32;
}

typedef struct moet_rows_group {
	const void *w[2];     /* device weights of matrix 0 (and 1 when nmat == 2) */
	const float *s[2];    /* device block scales, or NULL (1.0f) */
	int64_t n;            /* tokens (pairs) of the group, >= 0 */
} moet_rows_group;

typedef void (*moet_rows_get_fn)(const void *ctx, int64_t i, moet_rows_group *out);

typedef struct moet_rows_job {
	int dt;               /* MOET_ROWS_*; F32 only with nmat 1 */
	int nmat;             /* 1 or 2 */
	int rows, K;          /* output rows of every group, dot length */
	const float *x;       /* activations: row xr at x + xr * x_stride */
	long long x_stride;   /* floats */
	const int32_t *tok;   /* pair -> activation row (outside [0, n_x): a row of +0), or NULL */
	int n_x;              /* activation rows */
	float *out;           /* out[p * out_stride + row] */
	long long out_stride; /* floats */
	int vec;              /* 16-byte staging: caller checked K * esize % 16 == 0, K % 4 == 0 and
			       * 16-byte aligned weights and x (x_stride % 4 == 0) */
	int canon;            /* nmat 1: canonicalize NaN outputs */
	int wide;             /* F8/BF16 under vec with K % 16 == 0: groups of >= 9 tokens take
			       * the wide kernel (rows_wide.cu); same bits, other speed */
	int pdl;              /* MOET_ROWS_PDL_* bits (0: plain launches); see below */
} moet_rows_job;

/* A job of nmat matrices of `rows` rows over K columns, x's rows (tok: pair -> row, or NULL)
 * into out, plain launches (pdl 0): the one place the fields are filled. */
static inline moet_rows_job moet_rows_job_of(int dt, int nmat, int64_t rows, int64_t K,
					     const float *x, long long x_stride,
					     const int32_t *tok, int64_t n_x, float *out,
					     long long out_stride, int vec, int canon, int wide)
{
	moet_rows_job j = {};
	j.dt = dt;
	j.nmat = nmat;
	j.rows = (int)rows;
	j.K = (int)K;
	j.x = x;
	j.x_stride = x_stride;
	j.tok = tok;
	j.n_x = (int)n_x;
	j.out = out;
	j.out_stride = out_stride;
	j.vec = vec;
	j.canon = canon;
	j.wide = wide;
	return j;
}

/*
 * Programmatic dependent launch (sm_90+; docs/gpu.md): lets a job's first kernel start while
 * the kernel queued before it on the stream is still running, and start fetching its weights.
 *   MOET_ROWS_PDL_WAIT     the job's first launch carries cudaLaunchAttributeProgrammatic-
 *                          StreamSerialization; its blocks may ask L2 for their first weight
 *                          chunks, then wait (griddepcontrol.wait) for the previous kernel to
 *                          complete and its writes to be visible, before they read anything else.
 *                          Precondition: the previous kernel does not write the job's weights.
 *                          The job's later launches are plain (stream order).
 *   MOET_ROWS_PDL_TRIGGER  rows_kernel blocks signal griddepcontrol.launch_dependents once they
 *                          have issued their last loads (without it: at their exit); has an
 *                          effect only if the next kernel on the stream is launched with WAIT.
 * Only for devices of compute capability >= 9.0 (moet_rows_pdl says). Changes overlap, never
 * bits: every output's operations and the data they read are the same.
 */
enum { MOET_ROWS_PDL_WAIT = 1, MOET_ROWS_PDL_TRIGGER = 2 };

/*
 * Queues the job on `stream`: a few launches of one kernel template per token-count class.
 * The caller validated shapes, pointers and that the total of pairs and tiles fits in int.
 * Returns 0, MOET_EINVAL (too many tiles for one launch) or MOET_EDEVICE.
 */
int moet_rows_run(const moet_rows_job *job, moet_rows_get_fn get, const void *ctx,
		  int64_t n_groups, cudaStream_t stream);

/*
 * The variant MOET_GPU_ROWS_KERNEL asks for, read at every call: `ref` (rows_kernel for every
 * token count; *out_wide = 0) or `wide` (rows_wide.cu where it applies; 1); unset or empty:
 * the default. MOET_EINVAL (recorded) for other text. Both give the same bits.
 */
int moet_rows_variant(int *out_wide);

/*
 * Whether to chain the passes of an expert call with programmatic dependent launch: the switch
 * MOET_GPU_PDL, read at every call: `1` (or unset or empty: the default) asks for it, `0` not.
 * *out_pdl = 1 only if asked for and the current device's compute capability is >= 9.0
 * (queried once per device; below, silently 0). MOET_EINVAL (recorded) for other text,
 * MOET_EDEVICE if the device cannot be queried.
 */
int moet_rows_pdl(int *out_pdl);

/* The current device's SM count (cached per device). */
int moet_rows_sm_count(int *out);

/* ---- shared by rows.cu and rows_wide.cu ------------------------------------------------- */

#define MOET_ROWS_THREADS 256
#define MOET_ROWS_EXP_MAX 64 /* experts per launch (kernel parameter space) */

/* One launch's parameters: up to MOET_ROWS_EXP_MAX groups of one token-count class, their tiles
 * numbered group by group (row tile, then token tile fastest). */
struct moet_rows_args {
	const void *w[MOET_ROWS_EXP_MAX][2];  /* weight data per group, per matrix */
	const float *s[MOET_ROWS_EXP_MAX][2]; /* block scales, or NULL (1.0f) */
	int pair0[MOET_ROWS_EXP_MAX];         /* first pair (output row) of the group */
	int n[MOET_ROWS_EXP_MAX];             /* pairs of the group */
	int tile0[MOET_ROWS_EXP_MAX + 1];     /* first tile of the group in this launch */
	int n_exp;
	int rows, K;                /* output rows, columns (dot length) */
	const float *x;             /* activations: row xr at x + xr * x_stride */
	long long x_stride;         /* floats */
	const int32_t *tok;         /* pair -> activation row, or NULL (identity) */
	int n_x;                    /* activation rows (bounds for tok) */
	float *out;                 /* out[pair * out_stride + row] */
	long long out_stride;       /* floats */
	int vec;                    /* 16-byte staging allowed (alignment checked on the host) */
	int canon;                  /* NMAT 1: canonicalize NaN outputs */
	int pdl;                    /* MOET_ROWS_PDL_* bits of this launch */
};

typedef void (*moet_rows_kernel_fn)(moet_rows_args);

/* A kernel instance and its launch shape: dynamic shared bytes, rows and tokens per tile,
 * threads per block. */
struct moet_rows_kernel {
	moet_rows_kernel_fn fn;
	int smem, rb, tb, threads;
};

/* Token-count classes of a launch: n = 1, 2, 3-4, 5-8, 9-16, >= 17 tokens per group. */
#define MOET_ROWS_N_CLASS 6

/* A dense linear layer's call for gpu/linear_ks.cu (gpu/linear.cu chooses): dt MOET_ROWS_*,
 * W [R][K] with its block scales s (NULL: 1.0f), x [n_tok][x_stride], y [n_tok][y_stride];
 * K % 128 == 0, n_tok 1 .. MOET_GPU_KS_MAX_TOK, the row machinery's vec alignment. */
#define MOET_GPU_KS_MAX_TOK 16
/* ... and whose weight bytes times its token tiles (gpu/linear_ks.cu reads the matrix once per
 * tile of 8 tokens, 4 for BF16 and F32) stay within this: an LM head (2.35 GB of BF16) keeps the
 * row machinery, whose many row tiles already fill the GPU. */
#define MOET_GPU_KS_MAX_BYTES (256ll << 20)
/* linear_ks's token tile for n_tok tokens: the fewest of 1, 2, 4, 8 holding them, BF16 and F32
 * at most 4 (their weight stages are 2x and 4x wider: two stages of 8 tokens pass 99 KB) */
static inline int moet_gpu_ks_tb(int dt, int64_t n_tok)
{
	return dt == MOET_ROWS_F8 && n_tok > 4 ? 8 : n_tok > 2 ? 4 : n_tok > 1 ? 2 : 1;
}
static inline int moet_gpu_ks_tiles(int dt, int64_t n_tok)
{
	const int tb = moet_gpu_ks_tb(dt, n_tok);
	return (int)((n_tok + tb - 1) / tb);
}
enum { MOET_KS_PLAIN, MOET_KS_SILU_MUL, MOET_KS_CANON }; /* linear_ks_kernel's epilogues */
struct moet_gpu_ks_args {
	int dt, epi; /* MOET_ROWS_*, MOET_KS_* */
	const float *g; /* MOET_KS_SILU_MUL: the gate outputs, laid out as y (may be y) */
	const void *w;
	const float *s;
	int64_t R, K;
	const float *x;
	long long x_stride;
	int64_t n_tok;
	float *y;
	long long y_stride;
};
int moet_gpu_linear_ks(const moet_gpu_ks_args *a, void *stream);
/* The same call for gpu/linear_tall.cu (one warp per 8 rows; gpu/linear.cu chooses): the
 * conditions of linear_ks but at most MOET_GPU_TALL_MAX_TOK tokens (tiles of 4) and no cap on
 * the weight bytes. */
#define MOET_GPU_TALL_MAX_TOK 16
int moet_gpu_linear_tall(const moet_gpu_ks_args *a, void *stream);

/* The wide instance for (dt F8 or BF16, nmat, token class 4 or 5), or fn NULL. */
moet_rows_kernel moet_rows_wide_pick(int dt, int nmat, int cl);

/* cp.async of 16 bytes global -> shared (L2 only); moet_cp_async16z: zero-filled instead of
 * read when !ok (src is then not read). */
static __device__ __forceinline__ void moet_cp_async16(void *dst, const void *src)
{
	unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}

static __device__ __forceinline__ void moet_cp_async16z(void *dst, const void *src, bool ok)
{
	unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	int n = ok ? 16 : 0;
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}

static __device__ __forceinline__ void moet_cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> static __device__ __forceinline__ void moet_cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Two e4m3fn codes (low byte, high byte) to a binary16 pair (low half, high half): exact, as
 * every e4m3fn value is a binary16 value; then one binary16 to binary32 (exact). Together
 * they are moet_dec4_f8's two steps (below), apart for layouts that keep the 16-bit form in
 * between. */
static __device__ __forceinline__ uint32_t moet_f8x2_to_h2(uint32_t b2)
{
	uint32_t h;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)b2));
#else
	const __half lo = __float2half_rn(moet_dec_e4m3((uint8_t)b2));
	const __half hi = __float2half_rn(moet_dec_e4m3((uint8_t)(b2 >> 8)));
	h = (uint32_t)__half_as_ushort(lo) | (uint32_t)__half_as_ushort(hi) << 16;
#endif
	return h;
}

static __device__ __forceinline__ float moet_h_to_f32(unsigned short h)
{
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
}

/* Four exactly decoded F8_E4M3 weights from one 32-bit word of codes (columns k..k+3):
 * cvt.rn.f16x2.e4m3x2 then cvt.f32.f16 (sm_89+; both exact, NaN codes give NaN), else
 * moet_dec_e4m3. */
static __device__ __forceinline__ void moet_dec4_f8(uint32_t wd, float w[4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	const uint32_t h01 = moet_f8x2_to_h2(wd & 0xFFFFu), h23 = moet_f8x2_to_h2(wd >> 16);
	w[0] = moet_h_to_f32((unsigned short)(h01 & 0xFFFFu));
	w[1] = moet_h_to_f32((unsigned short)(h01 >> 16));
	w[2] = moet_h_to_f32((unsigned short)(h23 & 0xFFFFu));
	w[3] = moet_h_to_f32((unsigned short)(h23 >> 16));
#else
	for (int q = 0; q < 4; q++)
		w[q] = moet_dec_e4m3((uint8_t)(wd >> (8 * q)));
#endif
}

/* griddepcontrol (PTX, sm_90+): wait for the prerequisite grid's completion and the visibility
 * of its writes; signal that dependents may be scheduled. Both are no-ops in a grid launched
 * without programmatic serialization, and compile to nothing below sm_90 (where the host never
 * asks for them). The memory clobber keeps loads and stores on their side of the call. */
static __device__ __forceinline__ void moet_grid_dep_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void moet_grid_dep_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Asks L2 for `bytes` (a multiple of 16) from p (16-byte aligned), without waiting
 * (cp.async.bulk.prefetch, sm_90+; nothing below). */
static __device__ __forceinline__ void moet_prefetch_l2(const void *p, unsigned bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes)
		     : "memory");
#endif
}

/* The tile of block `tile` in a launch: group e (last with tile0[e] <= tile), then the row
 * tile and the token tile (fastest) inside the group. */
static __device__ __forceinline__ void moet_rows_tile(const moet_rows_args &a, int tile, int rb,
						      int tb, int *e, int *row0, int *tok0)
{
	int lo = 0, hi = a.n_exp - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) >> 1;
		if (a.tile0[mid] <= tile)
			lo = mid;
		else
			hi = mid - 1;
	}
	const int n_tt = (a.n[lo] + tb - 1) / tb, local = tile - a.tile0[lo];
	*e = lo;
	*row0 = (local / n_tt) * rb;
	*tok0 = (local % n_tt) * tb;
}

#endif
