/*
 * host.cu: pinned host memory (allocated or registered in place), device selection,
 * asynchronous copies and events for the hybrid engine (moet_gpu_host.h). Thin wrappers:
 * each CUDA failure becomes MOET_EDEVICE naming the call (gpu_int.h).
 */
#include "moet_gpu_host.h"

#include "gpu_int.h"

extern "C" int moet_gpu_host_alloc(size_t bytes, void **out)
{
	void *p = NULL;
	if (!out)
		return moet_err(MOET_EINVAL, "moet_gpu_host_alloc: out is NULL");
	*out = NULL;
	if (bytes == 0)
		return 0;
	MOET_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
	*out = p;
	return 0;
}

extern "C" void moet_gpu_host_free(void *p)
{
	if (p)
		cudaFreeHost(p);
}

/* NOTE: a refused cudaHostRegisterReadOnly is retried without it, the first error kept for
 * the message: a read-only mapping registered without the flag fails too, and the detail
 * should say why both attempts failed. */
extern "C" int moet_gpu_host_register(void *p, size_t bytes, int read_only, int *out_read_only)
{
	const unsigned base = cudaHostRegisterPortable;
	cudaError_t e_ro = cudaSuccess, e;
	if (out_read_only)
		*out_read_only = 0;
	if (!p || bytes == 0)
		return moet_err(MOET_EINVAL, "moet_gpu_host_register: %s", p ? "0 bytes" : "NULL");
	if (read_only) {
		e_ro = cudaHostRegister(p, bytes, base | cudaHostRegisterReadOnly);
		if (e_ro == cudaSuccess) {
			if (out_read_only)
				*out_read_only = 1;
			return 0;
		}
		(void)cudaGetLastError();
		if (e_ro != cudaErrorNotSupported && e_ro != cudaErrorInvalidValue)
			return moet_err(MOET_EDEVICE, "%s:%d: cudaHostRegister(%p, %zu, ReadOnly): %s",
					__FILE__, __LINE__, p, bytes, cudaGetErrorString(e_ro));
	}
	e = cudaHostRegister(p, bytes, base);
	if (e == cudaSuccess)
		return 0;
	(void)cudaGetLastError();
	if (read_only)
		return moet_err(MOET_EDEVICE, "%s:%d: cudaHostRegister(%p, %zu): ReadOnly: %s; "
				"default flags: %s", __FILE__, __LINE__, p, bytes,
				cudaGetErrorString(e_ro), cudaGetErrorString(e));
	return moet_err(MOET_EDEVICE, "%s:%d: cudaHostRegister(%p, %zu): %s", __FILE__, __LINE__, p,
			bytes, cudaGetErrorString(e));
}

extern "C" int moet_gpu_host_unregister(void *p)
{
	if (!p)
		return moet_err(MOET_EINVAL, "moet_gpu_host_unregister: NULL");
	MOET_CUDA_TRY(cudaHostUnregister(p));
	return 0;
}

extern "C" int moet_gpu_set_device(int device)
{
	MOET_CUDA_TRY(cudaSetDevice(device));
	return 0;
}

extern "C" int moet_gpu_get_device(int *out)
{
	if (!out)
		return moet_err(MOET_EINVAL, "moet_gpu_get_device: out is NULL");
	MOET_CUDA_TRY(cudaGetDevice(out));
	return 0;
}

static int copy_async(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
		      void *stream)
{
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return moet_err(MOET_EINVAL, "moet_gpu_copy_*_async: NULL pointer");
	MOET_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)stream));
	return 0;
}

extern "C" int moet_gpu_copy_h2d_async(void *dst, const void *src, size_t bytes, void *stream)
{
	return copy_async(dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

extern "C" int moet_gpu_copy_d2h_async(void *dst, const void *src, size_t bytes, void *stream)
{
	return copy_async(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
}

extern "C" int moet_gpu_copy_peer_async(void *dst, int dst_device, const void *src,
					int src_device, size_t bytes, void *stream)
{
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return moet_err(MOET_EINVAL, "moet_gpu_copy_peer_async: NULL pointer");
	MOET_CUDA_TRY(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes,
					  (cudaStream_t)stream));
	return 0;
}

extern "C" int moet_gpu_stream_create(void **out)
{
	cudaStream_t st;
	if (!out)
		return moet_err(MOET_EINVAL, "moet_gpu_stream_create: out is NULL");
	MOET_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	*out = (void *)st;
	return 0;
}

extern "C" void moet_gpu_stream_destroy(void *stream)
{
	if (stream)
		cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int moet_gpu_event_create(void **out)
{
	cudaEvent_t e;
	if (!out)
		return moet_err(MOET_EINVAL, "moet_gpu_event_create: out is NULL");
	MOET_CUDA_TRY(cudaEventCreate(&e));
	*out = (void *)e;
	return 0;
}

extern "C" void moet_gpu_event_destroy(void *ev)
{
	if (ev)
		cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" int moet_gpu_event_record(void *ev, void *stream)
{
	MOET_CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream));
	return 0;
}

extern "C" int moet_gpu_event_sync(void *ev)
{
	MOET_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)ev));
	return 0;
}

extern "C" int moet_gpu_event_elapsed_ms(void *start, void *end, float *out_ms)
{
	MOET_CUDA_TRY(cudaEventElapsedTime(out_ms, (cudaEvent_t)start, (cudaEvent_t)end));
	return 0;
}

extern "C" int moet_gpu_mem_info(size_t *out_free, size_t *out_total)
{
	MOET_CUDA_TRY(cudaMemGetInfo(out_free, out_total));
	return 0;
}
