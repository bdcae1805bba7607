/*
 * alloc.cu: device memory for the rest of the program (house style: device memory only from
 * gpu/'s allocator). Plain cudaMalloc (never managed memory), synchronous host<->device copies,
 * an asynchronous device-to-device copy on a stream, and a stream wait. Every CUDA failure
 * becomes MOET_EDEVICE with file:line, the call and CUDA's message (gpu_int.h).
 */
#include "moet_gpu.h"

#include "gpu_int.h"

extern "C" int moet_gpu_alloc(size_t bytes, void **out_ptr)
{
	void *p = NULL;
	if (!out_ptr)
		return moet_err(MOET_EINVAL, "moet_gpu_alloc: out_ptr is NULL");
	*out_ptr = NULL;
	if (bytes == 0)
		return 0;
	MOET_CUDA_TRY(cudaMalloc(&p, bytes));
	*out_ptr = p;
	return 0;
}

extern "C" void moet_gpu_free(void *ptr)
{
	if (ptr)
		cudaFree(ptr);
}

extern "C" int moet_gpu_copy_h2d(void *dst, const void *src, size_t bytes)
{
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return moet_err(MOET_EINVAL, "moet_gpu_copy_h2d: NULL pointer");
	MOET_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
	return 0;
}

extern "C" int moet_gpu_copy_d2h(void *dst, const void *src, size_t bytes)
{
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return moet_err(MOET_EINVAL, "moet_gpu_copy_d2h: NULL pointer");
	MOET_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
	return 0;
}

extern "C" int moet_gpu_copy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return moet_err(MOET_EINVAL, "moet_gpu_copy_d2d: NULL pointer");
	MOET_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
				      (cudaStream_t)stream));
	return 0;
}

extern "C" int moet_gpu_sync(void *stream)
{
	MOET_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
	return 0;
}
