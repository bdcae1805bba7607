/*
 * kv_write.cu: appends each row's keys and values to its own KV cache (the layout of the CPU
 * reference, runtime/forward.c's mla_project):
 *
 *   kvb row t:   [head 0: k_nope (d_nope) | v (d_v)] [head 1: ...] ...   (kv_b's output)
 *   k_pe row t:  [d_rope]   (roped, shared by all heads)
 *   K cache:     k_base[t] + r * k_pos_stride + h * (d_nope + d_rope): [k_nope | k_pe]
 *   V cache:     v_base[t] + r * v_pos_stride + h * d_v:                [v]
 *   r = the cache row of position pos[t]: its block's (moet_gpu_pages), or pos[t]
 *
 * Plain copies (bit-exact). One block per (head, row); rows write disjoint cache rows as long
 * as no two rows of a call share (cache, position), which the caller guarantees.
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define KV_THREADS 128

static __global__ void __launch_bounds__(KV_THREADS)
kv_write_kernel(const float *kvb, long long kvb_stride, const float *k_pe, long long k_pe_stride,
		int d_nope, int d_rope, int d_v, float *const *k_base, float *const *v_base,
		long long k_pos_stride, long long v_pos_stride, const int32_t *pos,
		const moet_gpu_pages pg)
{
	const int h = blockIdx.x, t = blockIdx.y, qk = d_nope + d_rope;
	const float *src = kvb + t * kvb_stride + (long long)h * (d_nope + d_v);
	const float *pe = k_pe + t * k_pe_stride;
	const long long r = moet_gpu_page_row(pg, t, pos[t]);
	float *kr = k_base[t] + r * k_pos_stride + (long long)h * qk;
	float *vr = v_base[t] + r * v_pos_stride + (long long)h * d_v;
	for (int i = threadIdx.x; i < qk + d_v; i += KV_THREADS) {
		if (i < d_nope)
			kr[i] = src[i];
		else if (i < qk)
			kr[i] = pe[i - d_nope];
		else
			vr[i - qk] = src[d_nope + (i - qk)];
	}
}

extern "C" int moet_gpu_kv_write(const float *kvb, int64_t kvb_stride, const float *k_pe,
				 int64_t k_pe_stride, int64_t n_rows, int64_t n_heads,
				 int64_t d_nope, int64_t d_rope, int64_t d_v,
				 float *const *k_base, float *const *v_base, int64_t k_pos_stride,
				 int64_t v_pos_stride, const int32_t *pos,
				 const moet_gpu_pages *pages, void *stream)
{
	if (n_rows < 0 || n_rows > 65535 || n_heads < 1 || n_heads > 65535 || d_nope < 0 ||
	    d_rope < 0 || d_v < 0 || d_nope + d_rope + d_v > INT32_MAX / 2)
		return moet_err(MOET_EINVAL, "kv write: %lld rows (at most 65535), %lld heads, dims "
				"%lld/%lld/%lld", (long long)n_rows, (long long)n_heads,
				(long long)d_nope, (long long)d_rope, (long long)d_v);
	if (n_rows == 0)
		return 0;
	if (!kvb || !k_pe || !k_base || !v_base || !pos ||
	    (pages && (!pages->table || !pages->off || !pages->shift)) ||
	    kvb_stride < n_heads * (d_nope + d_v) || k_pe_stride < d_rope ||
	    k_pos_stride < n_heads * (d_nope + d_rope) || v_pos_stride < n_heads * d_v)
		return moet_err(MOET_EINVAL, "kv write: NULL pointer or a stride below its row (kvb "
				"%lld, k_pe %lld, K %lld, V %lld)", (long long)kvb_stride,
				(long long)k_pe_stride, (long long)k_pos_stride,
				(long long)v_pos_stride);
	const moet_gpu_pages pg = pages ? *pages : moet_gpu_pages{ NULL, NULL, NULL };
	dim3 grid((unsigned)n_heads, (unsigned)n_rows);
	kv_write_kernel<<<grid, KV_THREADS, 0, moet_stream(stream)>>>(
		kvb, kvb_stride, k_pe, k_pe_stride, (int)d_nope, (int)d_rope, (int)d_v, k_base,
		v_base, k_pos_stride, v_pos_stride, pos, pg);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
