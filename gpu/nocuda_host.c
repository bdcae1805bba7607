/*
 * nocuda_host.c: moet_gpu_host.h in a build without the CUDA toolkit: every call answers
 * MOET_EUNSUP (frees accept anything).
 */
#include "moet_gpu_host.h"

#include "moet_err.h"

static int no_cuda(const char *what)
{
	return moet_err(MOET_EUNSUP, "%s: this build has no CUDA", what);
}

int moet_gpu_host_alloc(size_t bytes, void **out)
{
	(void)bytes;
	if (out)
		*out = NULL;
	return no_cuda("moet_gpu_host_alloc");
}

void moet_gpu_host_free(void *p)
{
	(void)p;
}

int moet_gpu_set_device(int device)
{
	(void)device;
	return no_cuda("moet_gpu_set_device");
}

int moet_gpu_copy_h2d_async(void *dst, const void *src, size_t bytes, void *stream)
{
	(void)dst, (void)src, (void)bytes, (void)stream;
	return no_cuda("moet_gpu_copy_h2d_async");
}

int moet_gpu_copy_d2h_async(void *dst, const void *src, size_t bytes, void *stream)
{
	(void)dst, (void)src, (void)bytes, (void)stream;
	return no_cuda("moet_gpu_copy_d2h_async");
}

int moet_gpu_copy_peer_async(void *dst, int dst_device, const void *src, int src_device,
			     size_t bytes, void *stream)
{
	(void)dst, (void)dst_device, (void)src, (void)src_device, (void)bytes, (void)stream;
	return no_cuda("moet_gpu_copy_peer_async");
}

int moet_gpu_stream_create(void **out)
{
	if (out)
		*out = NULL;
	return no_cuda("moet_gpu_stream_create");
}

int moet_gpu_stream_create_blocking(void **out)
{
	(void)out;
	return no_cuda("moet_gpu_stream_create_blocking");
}

int moet_gpu_stream_create_blocking_prio(void **out, int prio)
{
	(void)out;
	(void)prio;
	return no_cuda("moet_gpu_stream_create_blocking_prio");
}

void moet_gpu_stream_destroy(void *stream)
{
	(void)stream;
}

int moet_gpu_event_create(void **out)
{
	if (out)
		*out = NULL;
	return no_cuda("moet_gpu_event_create");
}

void moet_gpu_event_destroy(void *ev)
{
	(void)ev;
}

int moet_gpu_event_record(void *ev, void *stream)
{
	(void)ev, (void)stream;
	return no_cuda("moet_gpu_event_record");
}

int moet_gpu_stream_wait_event(void *stream, void *ev)
{
	(void)stream, (void)ev;
	return no_cuda("moet_gpu_stream_wait_event");
}

int moet_gpu_event_query(void *ev, int *out_done)
{
	(void)ev;
	*out_done = 0;
	return no_cuda("moet_gpu_event_query");
}

int moet_gpu_event_sync(void *ev)
{
	(void)ev;
	return no_cuda("moet_gpu_event_sync");
}

int moet_gpu_event_elapsed_ms(void *start, void *end, float *out_ms)
{
	(void)start, (void)end;
	if (out_ms)
		*out_ms = 0;
	return no_cuda("moet_gpu_event_elapsed_ms");
}

int moet_gpu_mem_info(size_t *out_free, size_t *out_total)
{
	if (out_free)
		*out_free = 0;
	if (out_total)
		*out_total = 0;
	return no_cuda("moet_gpu_mem_info");
}

int moet_gpu_copy2d_async(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
			  size_t width, size_t rows, void *stream)
{
	(void)dst, (void)dst_pitch, (void)src, (void)src_pitch, (void)width, (void)rows,
		(void)stream;
	return no_cuda("moet_gpu_copy2d_async");
}

int moet_nccl_create(int n, moet_nccl **out)
{
	(void)n;
	*out = NULL;
	return no_cuda("NCCL (tensor-parallel dense layers)");
}

void moet_nccl_destroy(moet_nccl *nc)
{
	(void)nc;
}

int moet_nccl_version(const moet_nccl *nc)
{
	(void)nc;
	return 0;
}

int moet_nccl_bcast(moet_nccl *nc, void *const buf[], size_t count, void *const stream[])
{
	(void)nc, (void)buf, (void)count, (void)stream;
	return no_cuda("moet_nccl_bcast");
}

int moet_nccl_gather(moet_nccl *nc, void *const send[], void *const recv[], const size_t count[],
		     void *const stream[])
{
	(void)nc, (void)send, (void)recv, (void)count, (void)stream;
	return no_cuda("moet_nccl_gather");
}

int moet_gpu_host_register_ro(const void *p, size_t bytes)
{
	(void)p, (void)bytes;
	return no_cuda("moet_gpu_host_register_ro");
}

int moet_gpu_host_unregister(const void *p)
{
	(void)p;
	return no_cuda("moet_gpu_host_unregister");
}
