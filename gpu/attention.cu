/*
 * attention.cu: causal attention of a batch of rows (tokens) on the device, each row with its
 * own KV cache and position: for row t, head h, over cached positions p = 0 .. pos[t]:
 *   s[p] = (float)(sum_d (double)q[d] * (double)k_p[d]) * scale
 *   mx = max_p s[p];  e[p] = exp_c(s[p] - mx);  sum = sum_p (double)e[p]
 *   out[d] = (float)((sum_p (double)e[p] * (double)v_p[d]) / sum)
 * with every sum in index order: exactly moet_attend_ref's operations (cpu/dense_ref.c), so
 * the outputs equal the CPU reference's bit for bit (NaN payloads aside).
 *
 * NOTE (why it is exact and batch-invariant). A binary32 x binary32 product is exact in
 * binary64, so each term is the host's; one thread adds the terms of one sum in index order
 * (the dot of one position; the softmax sum; the weighted sum of one output dimension), so each
 * rounding is the host's. The maximum is order-free (max of values; a zero's sign cannot reach
 * the output, exp_c(+-0) = 1). One block per (row, head) reads only its row's q, cache and
 * position: a row's bits never depend on the other rows, the batch size or the launch shape.
 * No atomics; repeated calls give the same bits.
 *
 * Two passes over the positions in tiles of TILE: the first finds mx, the second recomputes
 * each score, e[p] into shared memory, then thread 0 extends the softmax sum and every thread
 * its output dimensions (V rows read coalesced). Paged caches (moet_gpu_pages): each tile
 * first looks up the cache rows of its positions (row[TILE] in shared memory); only where a
 * position is read changes, never the arithmetic. Recomputing the scores keeps the op free of
 * scratch memory for any context length. K tiles are staged in shared memory, rows padded by
 * one float so that the 64 threads reading 64 rows hit different banks:
 *
 *   shared:  q [d_qk]  |  K tile [TILE][d_qk + 1]  |  e [TILE]   (+ row [TILE], static)
 *
 * Cost: binary64 arithmetic (fast on the H100/H200, 1/64 rate on sm_120) and serial sums; a
 * binary32 fixed-split variant would be the fast path for long contexts, not written yet.
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define TILE 64                 /* positions per tile = threads per block */
#define ATT_MAX_D 256           /* d_qk and d_v limits */
#define DV_PER_THREAD (ATT_MAX_D / TILE)
#define SM120_SMEM_MAX (99 * 1024)

/* dynamic (q, K tile, e) + static (mx_s, row, sum_s) */
static_assert((ATT_MAX_D + TILE * (ATT_MAX_D + 1) + TILE) * 4 + TILE * (4 + 8) + 8 <=
		      SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block");

static __global__ void __launch_bounds__(TILE)
attention_kernel(const float *q, long long q_stride, int d_qk, int d_v, float *const *k_base,
		 float *const *v_base, long long k_pos_stride, long long v_pos_stride,
		 const int32_t *pos, const moet_gpu_pages pg, float scale, float *out,
		 long long out_stride)
{
	extern __shared__ float sm[];
	float *qs = sm, *kt = sm + d_qk, *et = kt + TILE * (d_qk + 1);
	__shared__ float mx_s[TILE];
	__shared__ long long row[TILE]; /* cache rows of the tile's positions */
	const int tid = threadIdx.x, h = blockIdx.x, t = blockIdx.y, ks = d_qk + 1;
	const int n_pos = pos[t] + 1;
	const float *kb = k_base[t] + (long long)h * d_qk;
	const float *vb = v_base[t] + (long long)h * d_v;
	for (int d = tid; d < d_qk; d += TILE)
		qs[d] = q[t * q_stride + (long long)h * d_qk + d];

	/* Scores of the tile at p0 (thread tid: position p0 + tid), or NaN past the end. */
	auto scores = [&](int p0) -> float {
		const int np = min(TILE, n_pos - p0);
		__syncthreads(); /* q staged; the previous tile is consumed */
		if (tid < np)
			row[tid] = moet_gpu_page_row(pg, t, p0 + tid);
		__syncthreads();
		/* NOTE: a warp per position row (its cache row looked up once, no division per
		 * element). With a flat loop over the tile's elements reading row[] per element,
		 * prefill of 1024 tokens (4-layer Kimi-K2, H200) took 745 ms; this loop 538 ms
		 * (the contiguous cache before paging: 528 ms) */
		for (int pp = tid >> 5; pp < np; pp += TILE / 32) {
			const float *src = kb + row[pp] * k_pos_stride;
			float *dst = kt + pp * ks;
			for (int d = tid & 31; d < d_qk; d += 32)
				dst[d] = src[d];
		}
		__syncthreads();
		if (tid >= np)
			return 0.0f;
		const float *kr = kt + tid * ks;
		double dot = 0.0;
		for (int d = 0; d < d_qk; d++)
			dot = dot + (double)qs[d] * (double)kr[d];
		return (float)dot * scale;
	};

	float mx = -INFINITY;
	for (int p0 = 0; p0 < n_pos; p0 += TILE) {
		float s = scores(p0);
		if (tid < n_pos - p0 && s > mx)
			mx = s;
	}
	mx_s[tid] = mx;
	__syncthreads();
	for (int i = 0; i < TILE; i++)
		if (mx_s[i] > mx)
			mx = mx_s[i];

	double sum = 0.0, acc[DV_PER_THREAD];
	for (int k = 0; k < DV_PER_THREAD; k++)
		acc[k] = 0.0;
	for (int p0 = 0; p0 < n_pos; p0 += TILE) {
		const int np = min(TILE, n_pos - p0);
		float s = scores(p0);
		if (tid < np)
			et[tid] = moet_exp_c(s - mx);
		__syncthreads();
		if (tid == 0)
			for (int pp = 0; pp < np; pp++)
				sum = sum + (double)et[pp];
		for (int pp = 0; pp < np; pp++) {
			const float *vr = vb + row[pp] * v_pos_stride;
			const double e = (double)et[pp];
#pragma unroll
			for (int k = 0; k < DV_PER_THREAD; k++) {
				const int d = tid + k * TILE;
				if (d < d_v)
					acc[k] = acc[k] + e * (double)vr[d];
			}
		}
	}
	__shared__ double sum_s;
	if (tid == 0)
		sum_s = sum;
	__syncthreads();
	sum = sum_s;
	float *o = out + t * out_stride + (long long)h * d_v;
#pragma unroll
	for (int k = 0; k < DV_PER_THREAD; k++) {
		const int d = tid + k * TILE;
		if (d < d_v)
			o[d] = (float)(acc[k] / sum);
	}
}

extern "C" int moet_gpu_attention(const float *q, int64_t q_stride, int64_t n_rows,
				  int64_t n_heads, int64_t d_qk, int64_t d_v,
				  float *const *k_base, float *const *v_base,
				  int64_t k_pos_stride, int64_t v_pos_stride, const int32_t *pos,
				  const moet_gpu_pages *pages, float scale, float *out,
				  int64_t out_stride, void *stream)
{
	if (n_rows < 0 || n_rows > 65535 || n_heads < 1 || n_heads > 65535 || d_qk < 1 ||
	    d_qk > ATT_MAX_D || d_v < 1 || d_v > ATT_MAX_D)
		return moet_err(MOET_EINVAL, "attention: %lld rows (at most 65535), %lld heads, "
				"d_qk %lld, d_v %lld (at most %d)", (long long)n_rows,
				(long long)n_heads, (long long)d_qk, (long long)d_v, ATT_MAX_D);
	if (n_rows == 0)
		return 0;
	if (!q || !k_base || !v_base || !pos || !out ||
	    (pages && (!pages->table || !pages->off || !pages->shift)) ||
	    q_stride < n_heads * d_qk ||
	    out_stride < n_heads * d_v || k_pos_stride < n_heads * d_qk ||
	    v_pos_stride < n_heads * d_v)
		return moet_err(MOET_EINVAL, "attention: NULL pointer or a stride below its row (q "
				"%lld, out %lld, K %lld, V %lld)", (long long)q_stride,
				(long long)out_stride, (long long)k_pos_stride,
				(long long)v_pos_stride);
	const size_t smem = (size_t)(d_qk + TILE * (d_qk + 1) + TILE) * sizeof(float);
	MOET_CUDA_TRY(cudaFuncSetAttribute(attention_kernel,
					   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	const moet_gpu_pages pg = pages ? *pages : moet_gpu_pages{ NULL, NULL, NULL };
	dim3 grid((unsigned)n_heads, (unsigned)n_rows);
	attention_kernel<<<grid, TILE, smem, moet_stream(stream)>>>(
		q, q_stride, (int)d_qk, (int)d_v, k_base, v_base, k_pos_stride, v_pos_stride, pos,
		pg, scale, out, out_stride);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
