/*
 * moet_gpu_host.h: what the hybrid engine needs of the CUDA runtime beyond gpu/moet_gpu.h:
 * pinned (page-locked) host memory, the current device, asynchronous copies and events.
 *
 * Pinned buffers are what makes a host<->device copy run at the link's speed and what lets it
 * overlap with kernels; the engine allocates them once (runtime/hybrid.c) and never per token.
 * Built from gpu/host.cu; without CUDA, gpu/nocuda_host.c answers MOET_EUNSUP.
 */
#ifndef MOET_GPU_HOST_H
#define MOET_GPU_HOST_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* *out = bytes of pinned host memory (cudaHostAlloc, portable), NULL for 0 bytes. Returns 0,
 * MOET_EINVAL, MOET_EDEVICE (detail: the CUDA call and error) or MOET_EUNSUP. */
int moet_gpu_host_alloc(size_t bytes, void **out);
/* Frees memory of moet_gpu_host_alloc; NULL is accepted. */
void moet_gpu_host_free(void *p);

/* Makes device `device` current for the calling thread (cudaSetDevice). */
int moet_gpu_set_device(int device);

/* Copies queued on `stream` (NULL: the legacy default stream); the host side should be pinned
 * for the copy to be truly asynchronous. */
int moet_gpu_copy_h2d_async(void *dst, const void *src, size_t bytes, void *stream);
int moet_gpu_copy_d2h_async(void *dst, const void *src, size_t bytes, void *stream);

/* Device-to-device between devices (cudaMemcpyPeerAsync: through the host when the devices
 * have no peer access), queued on `stream` of the current device. */
int moet_gpu_copy_peer_async(void *dst, int dst_device, const void *src, int src_device,
			     size_t bytes, void *stream);

/* rows x width bytes from src (rows src_pitch bytes apart) to dst (dst_pitch apart), device
 * memory of the current device, queued on `stream` (cudaMemcpy2DAsync). */
int moet_gpu_copy2d_async(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
			  size_t width, size_t rows, void *stream);

/* A stream of the current device (cudaStream_t as void *, non-blocking with respect to the
 * legacy default stream); destroy accepts NULL. */
int moet_gpu_stream_create(void **out);
void moet_gpu_stream_destroy(void *stream);

/* A stream of the current device that is blocking with respect to the legacy default stream
 * (work on either waits for the other's earlier work), as a thread's default stream must be
 * (moet_gpu_set_thread_stream). */
int moet_gpu_stream_create_blocking(void **out);
/* The same with a scheduling priority: prio > 0 the device's highest, < 0 its lowest, 0 the
 * default (the block scheduler starts a higher stream's waiting blocks first). */
int moet_gpu_stream_create_blocking_prio(void **out, int prio);

/* Events (cudaEvent_t as void *): created with timing on. record queues a mark on `stream`;
 * event_sync waits for it; elapsed_ms is the time between two completed marks. */
int moet_gpu_event_create(void **out);
void moet_gpu_event_destroy(void *ev);
int moet_gpu_event_record(void *ev, void *stream);
int moet_gpu_event_sync(void *ev);
/* *out_done: whether the mark of ev has been reached (its last record), without waiting. */
int moet_gpu_event_query(void *ev, int *out_done);
int moet_gpu_event_elapsed_ms(void *start, void *end, float *out_ms);
/* The work queued on `stream` after this call waits for the mark of `ev` (its last record). */
int moet_gpu_stream_wait_event(void *stream, void *ev);

/* Page-locks `bytes` of host memory at p for the device's DMA, read-only (cudaHostRegister
 * with cudaHostRegisterReadOnly: file pages mapped PROT_READ, such as the checkpoint's), so
 * that a copy from it runs at the link's rate without the driver's pageable staging;
 * unregister takes the same p. */
int moet_gpu_host_register_ro(const void *p, size_t bytes);
int moet_gpu_host_unregister(const void *p);

/* Bytes of free and total memory of the current device. */
int moet_gpu_mem_info(size_t *out_free, size_t *out_total);

/*
 * NCCL among CUDA devices 0..n-1 of this process (gpu/nccl.cu; the library is loaded at run
 * time: MOET_EUNSUP naming it when it cannot be). Buffers are float32, one per rank, and each
 * rank's work is queued on stream[r] (NULL: that device's legacy default stream).
 *   bcast   buf[0] (rank 0) -> buf[r] of every rank, count floats
 *   gather  send[r] (count[r] floats, rank r >= 1) -> recv[r] (rank 0); send[0], recv[0] unused
 * Each returns with device 0 current. Errors: MOET_EDEVICE naming the NCCL call and error.
 */
#define MOET_NCCL_MAX 8
typedef struct moet_nccl moet_nccl;
int moet_nccl_create(int n, moet_nccl **out);
void moet_nccl_destroy(moet_nccl *nc);
int moet_nccl_version(const moet_nccl *nc);
int moet_nccl_bcast(moet_nccl *nc, void *const buf[], size_t count, void *const stream[]);
int moet_nccl_gather(moet_nccl *nc, void *const send[], void *const recv[], const size_t count[],
		     void *const stream[]);

#ifdef __cplusplus
}
#endif

#endif
