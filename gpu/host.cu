/*
 * host.cu: pinned host memory, device selection, asynchronous copies and events for the
 * hybrid engine (moet_gpu_host.h). Thin wrappers: each CUDA failure becomes MOET_EDEVICE
 * naming the call (gpu_int.h).
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
	moet_gpu_epoch_bump();
	MOET_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
	*out = p;
	return 0;
}

extern "C" void moet_gpu_host_free(void *p)
{
	if (p) {
		moet_gpu_epoch_bump();
		cudaFreeHost(p);
	}
}

extern "C" int moet_gpu_set_device(int device)
{
	MOET_CUDA_TRY(cudaSetDevice(device));
	moet_note_device(device);
	return 0;
}

static int copy_async(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
		      void *stream)
{
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return moet_err(MOET_EINVAL, "moet_gpu_copy_*_async: NULL pointer");
	MOET_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, moet_stream(stream)));
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
					  moet_stream(stream)));
	return 0;
}

extern "C" int moet_gpu_copy2d_async(void *dst, size_t dst_pitch, const void *src,
				     size_t src_pitch, size_t width, size_t rows, void *stream)
{
	if (width == 0 || rows == 0)
		return 0;
	if (!dst || !src)
		return moet_err(MOET_EINVAL, "moet_gpu_copy2d_async: NULL pointer");
	MOET_CUDA_TRY(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
					cudaMemcpyDeviceToDevice, moet_stream(stream)));
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

extern "C" int moet_gpu_stream_create_blocking(void **out)
{
	cudaStream_t st;
	if (!out)
		return moet_err(MOET_EINVAL, "moet_gpu_stream_create_blocking: out is NULL");
	MOET_CUDA_TRY(cudaStreamCreate(&st));
	*out = (void *)st;
	return 0;
}

extern "C" int moet_gpu_stream_create_blocking_prio(void **out, int prio)
{
	cudaStream_t st;
	int least = 0, greatest = 0;
	if (!out)
		return moet_err(MOET_EINVAL, "moet_gpu_stream_create_blocking_prio: out is NULL");
	MOET_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
	MOET_CUDA_TRY(cudaStreamCreateWithPriority(&st, cudaStreamDefault,
						   prio > 0 ? greatest : prio < 0 ? least : 0));
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
	MOET_CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, moet_stream(stream)));
	return 0;
}

extern "C" int moet_gpu_stream_wait_event(void *stream, void *ev)
{
	MOET_CUDA_TRY(cudaStreamWaitEvent(moet_stream(stream), (cudaEvent_t)ev, 0));
	return 0;
}

extern "C" int moet_gpu_event_sync(void *ev)
{
	MOET_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)ev));
	return 0;
}

extern "C" int moet_gpu_event_query(void *ev, int *out_done)
{
	const cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
	*out_done = e == cudaSuccess;
	if (e == cudaErrorNotReady)
		return 0;
	MOET_CUDA_TRY(e);
	return 0;
}

extern "C" int moet_gpu_event_elapsed_ms(void *start, void *end, float *out_ms)
{
	MOET_CUDA_TRY(cudaEventElapsedTime(out_ms, (cudaEvent_t)start, (cudaEvent_t)end));
	return 0;
}

extern "C" int moet_gpu_host_register_ro(const void *p, size_t bytes)
{
	MOET_CUDA_TRY(cudaHostRegister(const_cast<void *>(p), bytes, cudaHostRegisterReadOnly));
	return 0;
}

extern "C" int moet_gpu_host_unregister(const void *p)
{
	MOET_CUDA_TRY(cudaHostUnregister(const_cast<void *>(p)));
	return 0;
}

extern "C" int moet_gpu_mem_info(size_t *out_free, size_t *out_total)
{
	MOET_CUDA_TRY(cudaMemGetInfo(out_free, out_total));
	return 0;
}
