/*
 * add.cu: the residual add on the device, x[i] = x[i] + y[i] (one binary32 add per element,
 * as the CPU forward pass; elementwise, so trivially batch-invariant and deterministic).
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define ADD_THREADS 256

static __global__ void __launch_bounds__(ADD_THREADS) add_kernel(float *x, const float *y,
								long long n)
{
	for (long long i = blockIdx.x * (long long)ADD_THREADS + threadIdx.x; i < n;
	     i += (long long)gridDim.x * ADD_THREADS)
		x[i] = x[i] + y[i];
}

extern "C" int moet_gpu_add(float *x, const float *y, int64_t n, void *stream)
{
	if (n < 0)
		return moet_err(MOET_EINVAL, "add: n %lld", (long long)n);
	if (n == 0)
		return 0;
	if (!x || !y)
		return moet_err(MOET_EINVAL, "add: NULL pointer");
	long long blocks = (n + ADD_THREADS - 1) / ADD_THREADS;
	if (blocks > 65536)
		blocks = 65536;
	add_kernel<<<(unsigned)blocks, ADD_THREADS, 0, moet_stream(stream)>>>(x, y, n);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
