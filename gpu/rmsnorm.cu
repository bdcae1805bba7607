/*
 * rmsnorm.cu: RMSNorm over rows on the device,
 *   out[i] = w[i] * (x[i] * inv),  inv = (float)(1 / sqrt(ss / n + eps)),  ss = sum x[i]^2,
 * one block per row; rows never interact (batch-invariant), no atomics (deterministic).
 *
 * NOTE (order of the binary64 sum). Thread j of the block's 256 sums the squares of
 * x[j], x[j + 256], x[j + 512], ... in that order in binary64 (each square is exact: a binary32
 * product fits in 48 bits); then the 256 partials are added by a halving tree in shared memory,
 * s[j] += s[j + h] for h = 128, 64, .., 1. cpu/dense_ref.c adds in index order instead, so ss
 * may differ in its last binary64 bits; after the one rounding to binary32 of inv the outputs
 * agree with the CPU's to within 2 ulp, nearly always exactly (tests/gpu/test_gpu_dense.c
 * counts both). Everything after ss is the CPU's arithmetic: binary64 division and sqrt
 * (IEEE on the device), the two binary32 multiplies in the same order.
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define NORM_THREADS 256

static __global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(const float *x, long long x_stride, const float *w, int n, double eps, float *out,
	       long long out_stride)
{
	__shared__ double s[NORM_THREADS];
	const int tid = threadIdx.x;
	const float *xr = x + blockIdx.x * x_stride;
	float *yr = out + blockIdx.x * out_stride;
	double ss = 0.0;
	for (int i = tid; i < n; i += NORM_THREADS)
		ss = ss + (double)xr[i] * (double)xr[i];
	s[tid] = ss;
	__syncthreads();
	for (int h = NORM_THREADS / 2; h > 0; h >>= 1) {
		if (tid < h)
			s[tid] = s[tid] + s[tid + h];
		__syncthreads();
	}
	const float inv = (float)(1.0 / sqrt(s[0] / (double)n + eps));
	for (int i = tid; i < n; i += NORM_THREADS)
		yr[i] = w[i] * (xr[i] * inv);
}

extern "C" int moet_gpu_rmsnorm(const float *x, int64_t x_stride, const float *w, int64_t n,
				int64_t n_rows, double eps, float *out, int64_t out_stride,
				void *stream)
{
	if (n_rows < 0 || n < 1 || n > INT32_MAX || n_rows > INT32_MAX)
		return moet_err(MOET_EINVAL, "rmsnorm: %lld rows of %lld", (long long)n_rows,
				(long long)n);
	if (n_rows == 0)
		return 0;
	if (!x || !w || !out || x_stride < n || out_stride < n || !(eps >= 0.0))
		return moet_err(MOET_EINVAL, "rmsnorm: x %p (stride %lld), w %p, out %p (stride "
				"%lld), eps %g: NULL, strides below %lld or bad eps", (const void *)x,
				(long long)x_stride, (const void *)w, (void *)out,
				(long long)out_stride, eps, (long long)n);
	rmsnorm_kernel<<<(unsigned)n_rows, NORM_THREADS, 0, moet_stream(stream)>>>(
		x, x_stride, w, (int)n, eps, out, out_stride);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
