/*
 * argmax.cu: greedy decoding on the device, out[t] = argmax_v logits[t][v], the CPU's rule
 * (runtime/forward.c, moet_model_generate): best = 0, then best = v whenever
 * logits[v] > logits[best]. So: the lowest id among the values equal to the largest non-NaN
 * value; NaN never wins; and if logits[0] is NaN nothing compares greater, the answer is 0.
 *
 * One block per row: each thread scans its ids (tid, tid + 1024, ..) upward, keeping the first
 * greatest; a shared-memory tree keeps the greater value, on equality the lower id, which
 * selects the CPU's entry whatever the pairing (deterministic, batch-invariant).
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define ARGMAX_THREADS 1024

static __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_kernel(const float *logits, long long stride, long long V, int32_t *out)
{
	__shared__ float bv_s[ARGMAX_THREADS];
	__shared__ int bi_s[ARGMAX_THREADS];
	const int tid = threadIdx.x;
	const float *l = logits + blockIdx.x * stride;
	float bv = 0.0f;
	int bi = -1;
	for (long long v = tid; v < V; v += ARGMAX_THREADS) {
		const float x = l[v];
		if (x == x && (bi < 0 || x > bv)) {
			bv = x;
			bi = (int)v;
		}
	}
	bv_s[tid] = bv;
	bi_s[tid] = bi;
	__syncthreads();
	for (int h = ARGMAX_THREADS / 2; h > 0; h >>= 1) {
		if (tid < h) {
			const float ov = bv_s[tid + h];
			const int oi = bi_s[tid + h];
			if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
				bv = ov;
				bi = oi;
				bv_s[tid] = bv;
				bi_s[tid] = bi;
			}
		}
		__syncthreads();
	}
	if (tid == 0)
		out[blockIdx.x] = (l[0] != l[0] || bi < 0) ? 0 : bi;
}

extern "C" int moet_gpu_argmax(const float *logits, int64_t n_rows, int64_t n_cols,
			       int64_t stride, int32_t *out_ids, void *stream)
{
	if (n_rows < 0 || n_rows > INT32_MAX || n_cols < 1 || n_cols > INT32_MAX)
		return moet_err(MOET_EINVAL, "argmax: %lld rows of %lld", (long long)n_rows,
				(long long)n_cols);
	if (n_rows == 0)
		return 0;
	if (!logits || !out_ids || stride < n_cols)
		return moet_err(MOET_EINVAL, "argmax: NULL pointer or stride %lld below %lld",
				(long long)stride, (long long)n_cols);
	argmax_kernel<<<(unsigned)n_rows, ARGMAX_THREADS, 0, (cudaStream_t)stream>>>(
		logits, stride, n_cols, out_ids);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
