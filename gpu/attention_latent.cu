/*
 * attention_latent.cu: MLA attention in the absorbed form over a latent cache, on the device,
 * with exactly the operations of moet_attend_latent_ref (cpu/dense_ref.c). For row t, head h,
 * with L = kv_lora and the cache holding [c_p | kpe_p] (L + rope floats) per position:
 *
 *   q_abs[j] = (float) sum_i (double)q_nope[i] * W_UK(i, j)        (i ascending)
 *   s[p]     = (float)(sum over [q_abs | q_pe] . [c_p | kpe_p] in binary64, index order) * scale
 *   e[p]     = exp_c(s[p] - max s);  sum = sum_p (double)e[p]        (p ascending)
 *   o[j]     = (float)((sum_p (double)e[p] * (double)c_p[j]) / sum)  (p ascending)
 *   out[d]   = D(kv_b, h*(nope+v) + nope + d, o)                     (the contract dot)
 *
 * W_UK(i, j) = dec(kv_b[h*(nope+v) + i][j]) * scale (the product exact in binary64), the
 * host's weight_at. NOTE (why exact): every binary64 sum is added by one thread in the host's
 * order, and binary32 x binary32 products are exact in binary64; the contract dot is the
 * scalar reference's loop, run by one thread per output. One block per (row, head): a row's
 * bits never depend on the other rows. No atomics, no scratch memory: the scores are computed
 * twice (max pass, then the weighted pass), tile by tile. Paged caches (moet_gpu_pages):
 * position p is read at its cache row (looked up per score, and per tile for the o sums).
 *
 *   shared:  qv [L + rope]  |  o [L]  |  e tile [TILE]   (+ row [TILE], static)
 *
 * Two kernels compute those same operations (MOET_GPU_LATENT=ref|fast, read at every call;
 * default fast): latent_kernel, the first one, 64 threads per (row, head), every weight and
 * cache value read by the thread that uses it; and latent_fast_kernel, FT threads per (row,
 * head), which keeps the same per-value order of every sum and changes only who does what:
 * q_nope staged in shared memory; a position's score by one thread, cached in shared memory
 * (tiles of SC_CAP positions: no second score pass when the context fits one tile); the
 * output's contract dot by 16 threads, one per lane (lane l of output d runs the reference's
 * p[l] / acc[l] recurrences), folded by shuffles pairing lanes as the reference's halving
 * tree does (l with l + 8, then + 4, + 2, + 1; binary32 addition commutes exactly). The
 * first kernel took 0.74 ms per Kimi-K2 layer call at batch 1 on the H200 (64 blocks of 2
 * warps: every load waited for alone), 44% of the absorbed form's decode step.
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "moet_dtype.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 64             /* positions per tile = threads per block */
#define LAT_MAX_L 1024      /* kv_lora limit */
#define LAT_MAX_ROPE 256
#define J_PER_THREAD (LAT_MAX_L / TILE)
#define FT 256              /* threads per block of the fast kernel */
#define FJ (LAT_MAX_L / FT) /* its o values per thread */
#define SC_CAP 1024         /* its positions per score tile */
#define LAT_MAX_NOPE 256    /* its q_nope staging */
#define SM120_SMEM_MAX (99 * 1024)

/* dynamic (qv, o, e) + static (mx_s, row, sum_s) */
static_assert((2 * LAT_MAX_L + LAT_MAX_ROPE + TILE) * 4 + TILE * (4 + 8) + 8 <= SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block");

/* W[r][k] * scale of a device weight matrix, in binary64 (exact). */
static __device__ double weight_at(const moet_mat w, long long r, long long k)
{
	size_t i = (size_t)r * (size_t)w.cols + (size_t)k;
	double v;
	if (w.dtype == MOET_DT_F8_E4M3)
		v = moet_dec_e4m3(((const uint8_t *)w.data)[i]);
	else if (w.dtype == MOET_DT_BF16)
		v = moet_dec_bf16(((const uint16_t *)w.data)[i]);
	else
		v = ((const float *)w.data)[i];
	if (w.scale_inv) {
		const long long n_blk = (w.cols + MOET_BLOCK - 1) / MOET_BLOCK;
		v *= (double)w.scale_inv[(r / MOET_BLOCK) * n_blk + k / MOET_BLOCK];
	}
	return v;
}

/* The contract dot D(W, r, v), the scalar reference's loop (cpu/expert_ref.c), one thread. */
static __device__ float dot_ref(const moet_mat w, long long r, const float *v)
{
	const long long K = w.cols, n_blk = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const size_t row = (size_t)r * (size_t)K;
	float acc[16];
	for (int l = 0; l < 16; l++)
		acc[l] = 0.0f;
	for (long long b = 0; b < n_blk; b++) {
		float p[16];
		for (int l = 0; l < 16; l++)
			p[l] = 0.0f;
		for (int t = 0; t < 8; t++)
			for (int l = 0; l < 16; l++) {
				long long k = b * MOET_BLOCK + t * 16 + l;
				if (k >= K)
					continue;
				float wv;
				if (w.dtype == MOET_DT_F8_E4M3)
					wv = moet_dec_e4m3(((const uint8_t *)w.data)[row + k]);
				else if (w.dtype == MOET_DT_BF16)
					wv = moet_dec_bf16(((const uint16_t *)w.data)[row + k]);
				else
					wv = ((const float *)w.data)[row + k];
				p[l] = __fmaf_rn(wv, v[k], p[l]);
			}
		float s = w.scale_inv ? w.scale_inv[(r / MOET_BLOCK) * n_blk + b] : 1.0f;
		for (int l = 0; l < 16; l++)
			acc[l] = __fmaf_rn(p[l], s, acc[l]);
	}
	float q[8], s4[4], u2[2];
	for (int l = 0; l < 8; l++)
		q[l] = __fadd_rn(acc[l], acc[l + 8]);
	for (int l = 0; l < 4; l++)
		s4[l] = __fadd_rn(q[l], q[l + 4]);
	for (int l = 0; l < 2; l++)
		u2[l] = __fadd_rn(s4[l], s4[l + 2]);
	return __fadd_rn(u2[0], u2[1]);
}

static __global__ void __launch_bounds__(TILE)
latent_kernel(const float *q, long long q_stride, int nope, int rope, int v_dim,
	      const moet_mat kv_b, float *const *c_base, long long c_stride, const int32_t *pos,
	      const moet_gpu_pages pg, float scale, float *out, long long out_stride)
{
	extern __shared__ float sm[];
	const int L = (int)kv_b.cols, W = L + rope;
	float *qv = sm, *o = sm + W, *et = o + L;
	const int tid = threadIdx.x, h = blockIdx.x, t = blockIdx.y;
	const int n_pos = pos[t] + 1;
	const float *qh = q + t * q_stride + (long long)h * (nope + rope);
	const long long row0 = (long long)h * (nope + v_dim);
	const float *cache = c_base[t];

	/* q_abs into qv[0 .. L), q_pe into qv[L .. L + rope) */
	for (int j = tid; j < L; j += TILE) {
		double acc = 0.0;
		for (int i = 0; i < nope; i++)
			acc = acc + (double)qh[i] * weight_at(kv_b, row0 + i, j);
		qv[j] = (float)acc;
	}
	for (int r = tid; r < rope; r += TILE)
		qv[L + r] = qh[nope + r];
	__syncthreads();

	auto score = [&](int p) -> float {
		const float *cp = cache + moet_gpu_page_row(pg, t, p) * c_stride;
		double dot = 0.0;
		for (int j = 0; j < W; j++)
			dot = dot + (double)qv[j] * (double)cp[j];
		return (float)dot * scale;
	};
	float mx = -INFINITY;
	for (int p = tid; p < n_pos; p += TILE)
		mx = fmaxf(mx, score(p));
	__shared__ float mx_s[TILE];
	mx_s[tid] = mx;
	__syncthreads();
	mx = -INFINITY;
	for (int i = 0; i < TILE; i++)
		mx = fmaxf(mx, mx_s[i]);

	double oacc[J_PER_THREAD];
	for (int i = 0; i < J_PER_THREAD; i++)
		oacc[i] = 0.0;
	double sum = 0.0; /* thread 0's, in p order */
	__shared__ long long row[TILE]; /* cache rows of the tile's positions */
	for (int p0 = 0; p0 < n_pos; p0 += TILE) {
		const int np = min(TILE, n_pos - p0);
		__syncthreads(); /* the previous tile's e and rows are consumed */
		if (tid < np) {
			row[tid] = moet_gpu_page_row(pg, t, p0 + tid);
			et[tid] = moet_exp_c(score(p0 + tid) - mx);
		}
		__syncthreads();
		if (tid == 0)
			for (int i = 0; i < np; i++)
				sum = sum + (double)et[i];
		for (int jj = 0, j = tid; j < L; jj++, j += TILE)
			for (int i = 0; i < np; i++)
				oacc[jj] = oacc[jj] + (double)et[i] *
						      (double)cache[row[i] * c_stride + j];
	}
	__shared__ double sum_s;
	if (tid == 0)
		sum_s = sum;
	__syncthreads();
	for (int jj = 0, j = tid; j < L; jj++, j += TILE)
		o[j] = (float)(oacc[jj] / sum_s);
	__syncthreads();
	for (int d = tid; d < v_dim; d += TILE)
		out[t * out_stride + (long long)h * v_dim + d] = dot_ref(kv_b, row0 + nope + d, o);
}

/* s[p] of the header, position p's cache row at cp (the reference's order). */
static __device__ __forceinline__ float score_at(const float *cp, const float *qv, int W,
						 float scale)
{
	double dot = 0.0;
#pragma unroll 16
	for (int j = 0; j < W; j++)
		dot = dot + (double)qv[j] * (double)cp[j];
	return (float)dot * scale;
}

/* W[i] of a device weight matrix, decoded (no scale): dot_ref's wv. */
static __device__ __forceinline__ float code_at(const moet_mat w, size_t i)
{
	if (w.dtype == MOET_DT_F8_E4M3)
		return moet_dec_e4m3(((const uint8_t *)w.data)[i]);
	if (w.dtype == MOET_DT_BF16)
		return moet_dec_bf16(((const uint16_t *)w.data)[i]);
	return ((const float *)w.data)[i];
}

static_assert((LAT_MAX_L + LAT_MAX_ROPE + LAT_MAX_L + SC_CAP) * 4 + SC_CAP * 8 +
			      (FT + LAT_MAX_NOPE) * 4 + 8 <= SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block");

static __global__ void __launch_bounds__(FT, 1)
latent_fast_kernel(const float *q, long long q_stride, int nope, int rope, int v_dim,
		   const moet_mat kv_b, float *const *c_base, long long c_stride,
		   const int32_t *pos, const moet_gpu_pages pg, float scale, float *out,
		   long long out_stride)
{
	extern __shared__ float sm[];
	__shared__ long long rows[SC_CAP];
	__shared__ float qn[LAT_MAX_NOPE], red[FT];
	__shared__ double sum_s;
	const int L = (int)kv_b.cols, W = L + rope;
	float *qv = sm, *o = sm + W, *sc = o + L;
	const int tid = threadIdx.x, h = blockIdx.x, t = blockIdx.y;
	const int n_pos = pos[t] + 1;
	const float *qh = q + t * q_stride + (long long)h * (nope + rope);
	const long long row0 = (long long)h * (nope + v_dim);
	const float *cache = c_base[t];
	const bool cached = n_pos <= SC_CAP;

	for (int i = tid; i < nope; i += FT)
		qn[i] = qh[i];
	for (int r = tid; r < rope; r += FT)
		qv[L + r] = qh[nope + r];
	__syncthreads();
	for (int j = tid; j < L; j += FT) {
		double acc = 0.0;
#pragma unroll 8
		for (int i = 0; i < nope; i++)
			acc = acc + (double)qn[i] * weight_at(kv_b, row0 + i, j);
		qv[j] = (float)acc;
	}
	__syncthreads();

	/* the max: fmaxf of every score in any order is the same value */
	float mx = -INFINITY;
	for (int p = tid; p < n_pos; p += FT) {
		const float s = score_at(cache + moet_gpu_page_row(pg, t, p) * c_stride, qv, W,
					 scale);
		if (cached)
			sc[p] = s;
		mx = fmaxf(mx, s);
	}
	red[tid] = mx;
	__syncthreads();
	for (int k = FT / 2; k > 0; k >>= 1) {
		if (tid < k)
			red[tid] = fmaxf(red[tid], red[tid + k]);
		__syncthreads();
	}
	mx = red[0];

	double oacc[FJ];
	for (int i = 0; i < FJ; i++)
		oacc[i] = 0.0;
	double sum = 0.0; /* thread 0's, in p order */
	for (int p0 = 0; p0 < n_pos; p0 += SC_CAP) {
		const int np = min(SC_CAP, n_pos - p0);
		__syncthreads(); /* the previous tile's e and rows are consumed */
		for (int i = tid; i < np; i += FT) {
			const long long r = moet_gpu_page_row(pg, t, p0 + i);
			rows[i] = r;
			const float s = cached ? sc[i] : score_at(cache + r * c_stride, qv, W, scale);
			sc[i] = moet_exp_c(s - mx);
		}
		__syncthreads();
		if (tid == 0)
			for (int i = 0; i < np; i++)
				sum = sum + (double)sc[i];
#pragma unroll
		for (int jj = 0; jj < FJ; jj++) {
			const int j = tid + jj * FT;
			if (j >= L)
				break;
			double a = oacc[jj];
#pragma unroll 8
			for (int i = 0; i < np; i++)
				a = a + (double)sc[i] * (double)cache[rows[i] * c_stride + j];
			oacc[jj] = a;
		}
	}
	if (tid == 0)
		sum_s = sum;
	__syncthreads();
#pragma unroll
	for (int jj = 0; jj < FJ; jj++)
		if (tid + jj * FT < L)
			o[tid + jj * FT] = (float)(oacc[jj] / sum_s);
	__syncthreads();

	/* out[d] = D(kv_b, row0 + nope + d, o): lane l of 16 runs dot_ref's p[l], acc[l] */
	const int lane = tid & 15, grp = tid >> 4;
	const long long K = L, n_blk = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	for (int d0 = 0; d0 < v_dim; d0 += FT / 16) {
		const int d = d0 + grp;
		float acc = 0.0f;
		if (d < v_dim) {
			const long long r = row0 + nope + d;
			const size_t row = (size_t)r * (size_t)K;
			for (long long b = 0; b < n_blk; b++) {
				float p = 0.0f;
#pragma unroll
				for (int u = 0; u < 8; u++) {
					const long long k = b * MOET_BLOCK + u * 16 + lane;
					if (k < K)
						p = __fmaf_rn(code_at(kv_b, row + k), o[k], p);
				}
				const float s = kv_b.scale_inv ?
							kv_b.scale_inv[(r / MOET_BLOCK) * n_blk + b] : 1.0f;
				acc = __fmaf_rn(p, s, acc);
			}
		}
		/* dot_ref's tree: q[l] = acc[l] + acc[l + 8], then + 4, + 2, + 1 */
		for (int off = 8; off > 0; off >>= 1)
			acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, off, 16));
		if (lane == 0 && d < v_dim)
			out[t * out_stride + (long long)h * v_dim + d] = acc;
	}
}

/* MOET_GPU_LATENT: 1 for the fast kernel (default), 0 for the first one (ref). */
static int latent_fast(int *out_fast)
{
	static const char *const names[] = { "fast", "ref" };
	int ref = 0, rc = moet_env_choice("MOET_GPU_LATENT", names, 2, &ref);
	*out_fast = !ref;
	return rc;
}

extern "C" int moet_gpu_attention_latent(const float *q, long long q_stride, long long n_rows,
					 long long n_heads, long long nope, long long rope,
					 long long v_dim, const moet_mat *kv_b,
					 float *const *c_base, long long c_stride,
					 const int32_t *pos, const moet_gpu_pages *pages,
					 float scale, float *out, long long out_stride,
					 void *stream)
{
	if (!q || !kv_b || !kv_b->data || !c_base || !pos || !out ||
	    (pages && (!pages->table || !pages->off || !pages->shift)))
		return moet_err(MOET_EINVAL, "attention_latent: NULL pointer");
	if (n_rows <= 0)
		return 0;
	if (kv_b->cols > LAT_MAX_L || rope > LAT_MAX_ROPE || n_rows > 65535 || n_heads > 65535 ||
	    kv_b->rows != n_heads * (nope + v_dim) || c_stride < kv_b->cols + rope)
		return moet_err(MOET_EINVAL, "attention_latent: kv_lora %lld (<= %d), rope %lld "
				"(<= %d), kv_b rows %lld (want heads x (nope + v) = %lld), cache "
				"stride %lld", (long long)kv_b->cols, LAT_MAX_L, rope, LAT_MAX_ROPE,
				(long long)kv_b->rows, n_heads * (nope + v_dim), c_stride);
	if (kv_b->dtype != MOET_DT_F8_E4M3 && kv_b->dtype != MOET_DT_BF16 &&
	    kv_b->dtype != MOET_DT_F32)
		return moet_err(MOET_EUNSUP, "attention_latent: kv_b dtype %d is not F8_E4M3, BF16 "
				"or F32", (int)kv_b->dtype);
	int fast = 0, rc;
	if ((rc = latent_fast(&fast)))
		return rc;
	const moet_gpu_pages pg = pages ? *pages : moet_gpu_pages{ NULL, NULL, NULL };
	dim3 grid((unsigned)n_heads, (unsigned)n_rows);
	if (fast && nope <= LAT_MAX_NOPE) {
		const size_t smem = (size_t)(2 * kv_b->cols + rope + SC_CAP) * sizeof(float);
		latent_fast_kernel<<<grid, FT, smem, moet_stream(stream)>>>(
			q, q_stride, (int)nope, (int)rope, (int)v_dim, *kv_b, c_base, c_stride, pos,
			pg, scale, out, out_stride);
	} else {
		const size_t smem = (size_t)(2 * kv_b->cols + rope + TILE) * sizeof(float);
		latent_kernel<<<grid, TILE, smem, moet_stream(stream)>>>(
			q, q_stride, (int)nope, (int)rope, (int)v_dim, *kv_b, c_base, c_stride, pos,
			pg, scale, out, out_stride);
	}
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
