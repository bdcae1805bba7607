/*
 * combine.cu: the contract's canonical combine on the device (docs/numerics.md), per token t
 * and output j:
 *   routed = +0;  routed = fma(w[t][i], y[slot[t][i]][j], routed)  for i = 0 .. top_k-1
 *   out[t][j] = canon(routed + shared[t][j])   (canon(routed) without shared experts)
 * in the router's canonical order i, bit for bit the CPU forward pass's loop (runtime/forward.c).
 * y holds the expert outputs wherever they were computed (rows of moet_gpu_expert_ffn's y, or
 * rows copied from the CPU tier): slot maps (token, i) to a row. A slot outside [0, n_y) reads
 * as a row of +0 (the fma is still performed). One thread per (token, j): no reductions.
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "moet_hd.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define COMBINE_THREADS 256

static __global__ void __launch_bounds__(COMBINE_THREADS)
combine_kernel(const float *y, long long n_y, const int32_t *slot, const float *w, int top_k,
	       const float *shared, int H, float *out)
{
	const int t = blockIdx.y;
	const int j = blockIdx.x * COMBINE_THREADS + threadIdx.x;
	if (j >= H)
		return;
	const int32_t *sl = slot + (long long)t * top_k;
	const float *wt = w + (long long)t * top_k;
	float routed = 0.0f;
	for (int i = 0; i < top_k; i++) {
		const long long r = sl[i];
		const float v = (r >= 0 && r < n_y) ? y[r * H + j] : 0.0f;
		routed = fmaf(wt[i], v, routed);
	}
	const long long o = (long long)t * H + j;
	out[o] = moet_canon_nan(shared ? routed + shared[o] : routed);
}

extern "C" int moet_gpu_combine(const float *y, int64_t n_y, const int32_t *slot, const float *w,
				int64_t top_k, const float *shared, int64_t n_tok, int64_t H,
				float *out, void *stream)
{
	if (n_tok < 0 || n_tok > 65535 || top_k < 0 || top_k > INT32_MAX || H < 1 ||
	    H > INT32_MAX - COMBINE_THREADS || n_y < 0)
		return moet_err(MOET_EINVAL, "combine: %lld tokens (at most 65535), top_k %lld, H "
				"%lld, %lld expert rows", (long long)n_tok, (long long)top_k,
				(long long)H, (long long)n_y);
	if (n_tok == 0)
		return 0;
	if (!out || (top_k > 0 && (!slot || !w || (n_y > 0 && !y))))
		return moet_err(MOET_EINVAL, "combine: NULL pointer");
	dim3 grid((unsigned)((H + COMBINE_THREADS - 1) / COMBINE_THREADS), (unsigned)n_tok);
	combine_kernel<<<grid, COMBINE_THREADS, 0, moet_stream(stream)>>>(
		y, n_y, slot, w, (int)top_k, shared, (int)H, out);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
