/*
 * alloc.cu: device memory for the rest of the program (house style: device memory only from
 * gpu/'s allocator). Plain cudaMalloc (never managed memory), synchronous host<->device copies,
 * an asynchronous device-to-device copy on a stream, and a stream wait. Every CUDA failure
 * becomes MOET_EDEVICE with file:line, the call and CUDA's message (gpu_int.h).
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <stdlib.h>
#include <string.h>

/* MOET_GPU_MEM_CAP (bytes, or with a unit: 32GiB, 32000MiB, 32GB): each device is treated
 * as if it had that much memory (to emulate smaller cards on a big one); 0 when unset. */
static size_t mem_cap(void)
{
	static size_t cap = (size_t)-1;
	if (cap != (size_t)-1)
		return cap;
	const char *s = getenv("MOET_GPU_MEM_CAP");
	cap = 0;
	if (!s || !*s)
		return cap;
	char *end;
	double v = strtod(s, &end);
	double unit = !strcmp(end, "GiB") ? 1073741824.0 : !strcmp(end, "MiB") ? 1048576.0
		    : !strcmp(end, "GB") ? 1e9 : !strcmp(end, "MB") ? 1e6 : !*end ? 1.0 : -1.0;
	cap = unit > 0 && v > 0 ? (size_t)(v * unit) : (size_t)-2; /* -2: unreadable */
	return cap;
}

extern "C" int moet_gpu_alloc(size_t bytes, void **out_ptr)
{
	void *p = NULL;
	if (!out_ptr)
		return moet_err(MOET_EINVAL, "moet_gpu_alloc: out_ptr is NULL");
	*out_ptr = NULL;
	if (bytes == 0)
		return 0;
	if (mem_cap() == (size_t)-2)
		return moet_err(MOET_EINVAL, "MOET_GPU_MEM_CAP='%s': expected a size such as "
				"32GiB, 32000MiB or a byte count", getenv("MOET_GPU_MEM_CAP"));
	if (mem_cap()) {
		/* NOTE: the device's used memory includes the context, as on the emulated card */
		size_t free_b = 0, total_b = 0;
		MOET_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
		if (total_b - free_b + bytes > mem_cap()) {
			int dev = 0;
			cudaGetDevice(&dev);
			return moet_err(MOET_ENOMEM, "CUDA device %d: %zu more bytes would pass "
					"MOET_GPU_MEM_CAP=%s (%zu used of %zu)", dev, bytes,
					getenv("MOET_GPU_MEM_CAP"), total_b - free_b, mem_cap());
		}
	}
	moet_gpu_epoch_bump();
	MOET_CUDA_TRY(cudaMalloc(&p, bytes));
	*out_ptr = p;
	return 0;
}

extern "C" void moet_gpu_free(void *ptr)
{
	if (ptr) {
		moet_gpu_epoch_bump();
		cudaFree(ptr);
	}
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
				      moet_stream(stream)));
	return 0;
}

extern "C" int moet_gpu_sync(void *stream)
{
	MOET_CUDA_TRY(cudaStreamSynchronize(moet_stream(stream)));
	return 0;
}
