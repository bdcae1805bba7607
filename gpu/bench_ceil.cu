/*
 * bench_ceil.cu: what `moet-hybrid bench gpu-experts` (runtime/bench_gpu.c) needs from the
 * device beside the ops under test: the device's description, the ceilings measured in the
 * same process, a CUDA-event timer and random fills for the weight pools.
 *
 *   copy    cudaMemcpyAsync device-to-device of >= 1 GiB (the bench's size), each copy timed
 *           alone with a pair of events; it reads and writes `bytes`
 *   sgemm   cublasSgemm with CUBLAS_PEDANTIC_MATH: binary32 FMAs only (TF32 and every
 *           reduced-precision path off), operands random in [-1, 1)
 *
 * NOTE: the fills hash (seed, index) with splitmix64, so a pool's contents do not depend on
 * the launch shape; nothing here is part of the numerics contract.
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FILL_THREADS 256

#define CUBLAS_TRY(call)                                                                     \
	do {                                                                                 \
		cublasStatus_t s_ = (call);                                                  \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                           \
			rc = moet_err(MOET_EDEVICE, "%s:%d: %s: cuBLAS status %d", __FILE__, \
				      __LINE__, #call, (int)s_);                             \
			goto fail;                                                           \
		}                                                                            \
	} while (0)

/* CUDA call inside a function with a `fail` label and an `rc`. */
#define CUDA_GO(call)                                                                        \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess) {                                                     \
			rc = MOET_CUDA_ERR(e_, #call);                                       \
			goto fail;                                                           \
		}                                                                            \
	} while (0)

static __device__ __forceinline__ uint64_t splitmix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* 8 bytes per thread-step; a tail of < 8 bytes byte by byte. */
static __global__ void __launch_bounds__(FILL_THREADS) fill_bytes_kernel(uint8_t *dst,
									 size_t bytes, uint64_t seed,
									 uint8_t mask)
{
	const uint64_t m8 = 0x0101010101010101ull * mask;
	const size_t words = bytes / 8;
	for (size_t i = blockIdx.x * (size_t)FILL_THREADS + threadIdx.x; i < words;
	     i += (size_t)gridDim.x * FILL_THREADS) {
		uint64_t v = splitmix(seed ^ (i * 0xD6E8FEB86659FD93ull)) & m8;
		memcpy(dst + 8 * i, &v, 8);
	}
	if (blockIdx.x == 0 && threadIdx.x == 0)
		for (size_t i = words * 8; i < bytes; i++)
			dst[i] = (uint8_t)(splitmix(seed ^ (i * 0xD6E8FEB86659FD93ull)) & mask);
}

static __global__ void __launch_bounds__(FILL_THREADS) fill_f32_kernel(float *dst, size_t n,
								       uint64_t seed, float lo,
								       float hi)
{
	for (size_t i = blockIdx.x * (size_t)FILL_THREADS + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * FILL_THREADS) {
		float u = (float)(splitmix(seed ^ (i * 0xD6E8FEB86659FD93ull)) >> 40) * 0x1p-24f;
		dst[i] = __fadd_rn(lo, __fmul_rn(u, __fsub_rn(hi, lo)));
	}
}

static unsigned fill_blocks(size_t n)
{
	size_t b = (n + FILL_THREADS - 1) / FILL_THREADS;
	return (unsigned)(b > 16384 ? 16384 : (b ? b : 1));
}

extern "C" int moet_gpu_bench_fill_bytes(void *dst, size_t bytes, uint64_t seed, uint8_t mask,
					 void *stream)
{
	if (bytes == 0)
		return 0;
	if (!dst || ((uintptr_t)dst & 7))
		return moet_err(MOET_EINVAL, "bench fill: dst NULL or not 8-byte aligned");
	fill_bytes_kernel<<<fill_blocks(bytes / 8), FILL_THREADS, 0, (cudaStream_t)stream>>>(
		(uint8_t *)dst, bytes, seed, mask);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

extern "C" int moet_gpu_bench_fill_f32(float *dst, size_t n, uint64_t seed, float lo, float hi,
				       void *stream)
{
	if (n == 0)
		return 0;
	if (!dst || !(lo <= hi))
		return moet_err(MOET_EINVAL, "bench fill: dst NULL or bounds [%g, %g)", lo, hi);
	fill_f32_kernel<<<fill_blocks(n), FILL_THREADS, 0, (cudaStream_t)stream>>>(dst, n, seed,
										 lo, hi);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

extern "C" int moet_gpu_info_get(moet_gpu_info *out)
{
	if (!out)
		return moet_err(MOET_EINVAL, "gpu info: out is NULL");
	memset(out, 0, sizeof(*out));
	cudaDeviceProp p;
	MOET_CUDA_TRY(cudaGetDeviceProperties(&p, 0));
	snprintf(out->name, sizeof(out->name), "%s", p.name);
	out->cc_major = p.major;
	out->cc_minor = p.minor;
	out->sm_count = p.multiProcessorCount;
	out->mem_bytes = p.totalGlobalMem;
	out->l2_bytes = (size_t)p.l2CacheSize;
	MOET_CUDA_TRY(cudaDriverGetVersion(&out->driver_version));
	MOET_CUDA_TRY(cudaRuntimeGetVersion(&out->runtime_version));
	int ma = 0, mi = 0, pa = 0;
	if (cublasGetProperty(MAJOR_VERSION, &ma) == CUBLAS_STATUS_SUCCESS &&
	    cublasGetProperty(MINOR_VERSION, &mi) == CUBLAS_STATUS_SUCCESS &&
	    cublasGetProperty(PATCH_LEVEL, &pa) == CUBLAS_STATUS_SUCCESS)
		out->cublas_version = ma * 10000 + mi * 100 + pa;
	return 0;
}

struct moet_gpu_timer {
	cudaEvent_t a, b;
};

extern "C" int moet_gpu_timer_create(moet_gpu_timer **out)
{
	int rc = 0;
	if (!out)
		return moet_err(MOET_EINVAL, "gpu timer: out is NULL");
	moet_gpu_timer *t = (moet_gpu_timer *)calloc(1, sizeof(*t));
	*out = NULL;
	if (!t)
		return moet_err(MOET_ENOMEM, "gpu timer");
	CUDA_GO(cudaEventCreate(&t->a));
	CUDA_GO(cudaEventCreate(&t->b));
	*out = t;
	return 0;
fail:
	moet_gpu_timer_destroy(t);
	return rc;
}

extern "C" void moet_gpu_timer_destroy(moet_gpu_timer *t)
{
	if (!t)
		return;
	if (t->a)
		cudaEventDestroy(t->a);
	if (t->b)
		cudaEventDestroy(t->b);
	free(t);
}

extern "C" int moet_gpu_timer_start(moet_gpu_timer *t, void *stream)
{
	if (!t)
		return moet_err(MOET_EINVAL, "gpu timer: NULL");
	MOET_CUDA_TRY(cudaEventRecord(t->a, (cudaStream_t)stream));
	return 0;
}

extern "C" int moet_gpu_timer_stop(moet_gpu_timer *t, void *stream, double *out_s)
{
	float ms = 0;
	if (!t || !out_s)
		return moet_err(MOET_EINVAL, "gpu timer: NULL");
	MOET_CUDA_TRY(cudaEventRecord(t->b, (cudaStream_t)stream));
	MOET_CUDA_TRY(cudaEventSynchronize(t->b));
	MOET_CUDA_TRY(cudaEventElapsedTime(&ms, t->a, t->b));
	*out_s = 1e-3 * (double)ms;
	return 0;
}

extern "C" int moet_gpu_bench_copy(size_t bytes, int reps, double *samples_s)
{
	void *src = NULL, *dst = NULL;
	moet_gpu_timer *t = NULL;
	int rc;
	if (bytes == 0 || reps < 1 || !samples_s)
		return moet_err(MOET_EINVAL, "bench copy: %zu bytes, %d reps", bytes, reps);
	if ((rc = moet_gpu_alloc(bytes, &src)) || (rc = moet_gpu_alloc(bytes, &dst)) ||
	    (rc = moet_gpu_timer_create(&t)) ||
	    (rc = moet_gpu_bench_fill_bytes(src, bytes & ~(size_t)7, 1, 0xFF, NULL)))
		goto fail;
	CUDA_GO(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
	for (int i = 0; i < reps; i++) {
		if ((rc = moet_gpu_timer_start(t, NULL)))
			goto fail;
		CUDA_GO(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
		if ((rc = moet_gpu_timer_stop(t, NULL, &samples_s[i])))
			goto fail;
	}
	rc = 0;
fail:
	moet_gpu_timer_destroy(t);
	moet_gpu_free(src);
	moet_gpu_free(dst);
	return rc;
}

extern "C" int moet_gpu_bench_sgemm(int64_t m, int64_t n, int64_t k, int reps,
				    double *samples_s)
{
	float *a = NULL, *b = NULL, *c = NULL;
	cublasHandle_t h = NULL;
	moet_gpu_timer *t = NULL;
	const float one = 1.0f, zero = 0.0f;
	int rc = 0;
	if (m < 1 || n < 1 || k < 1 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX ||
	    reps < 1 || !samples_s)
		return moet_err(MOET_EINVAL, "bench sgemm: %lld x %lld x %lld, %d reps",
				(long long)m, (long long)n, (long long)k, reps);
	if ((rc = moet_gpu_alloc((size_t)(m * k) * sizeof(float), (void **)&a)) ||
	    (rc = moet_gpu_alloc((size_t)(k * n) * sizeof(float), (void **)&b)) ||
	    (rc = moet_gpu_alloc((size_t)(m * n) * sizeof(float), (void **)&c)) ||
	    (rc = moet_gpu_timer_create(&t)) ||
	    (rc = moet_gpu_bench_fill_f32(a, (size_t)(m * k), 2, -1.0f, 1.0f, NULL)) ||
	    (rc = moet_gpu_bench_fill_f32(b, (size_t)(k * n), 3, -1.0f, 1.0f, NULL)))
		goto fail;
	CUBLAS_TRY(cublasCreate(&h));
	CUBLAS_TRY(cublasSetStream(h, 0));
	/* NOTE: pedantic math: binary32 FMAs only; CUBLAS_DEFAULT_MATH would also keep TF32 off
	 * (TF32 needs CUBLAS_TF32_TENSOR_OP_MATH) but lets cuBLAS pick other reduced paths. */
	CUBLAS_TRY(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
	for (int i = 0; i < 2 + reps; i++) {
		if (i >= 2 && (rc = moet_gpu_timer_start(t, NULL)))
			goto fail;
		CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one,
				       a, (int)m, b, (int)k, &zero, c, (int)m));
		if (i >= 2 && (rc = moet_gpu_timer_stop(t, NULL, &samples_s[i - 2])))
			goto fail;
	}
	rc = moet_gpu_sync(NULL);
fail:
	if (h)
		cublasDestroy(h);
	moet_gpu_timer_destroy(t);
	moet_gpu_free(a);
	moet_gpu_free(b);
	moet_gpu_free(c);
	return rc;
}
