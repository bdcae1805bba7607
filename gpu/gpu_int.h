/*
 * gpu_int.h: private helpers of the CUDA files of gpu/ (never included by C code).
 *
 * MOET_CUDA_TRY(call): on failure, record MOET_EDEVICE with file:line, the call's text and
 * CUDA's error string (moet_err), and return the code from the enclosing function.
 *
 * NOTE: a failed runtime call also becomes CUDA's "last error", which a later, unrelated
 * cudaGetLastError() (the launch check) would report again; the error is reported here, so it
 * is cleared here (sticky errors stay: every later call reports them anyway).
 */
#ifndef MOET_GPU_INT_H
#define MOET_GPU_INT_H

#include <cuda_runtime.h>

extern "C" {
#include "moet_env.h"
#include "moet_err.h"
}

#define MOET_CUDA_ERR(e_, call_text)                                                         \
	((void)cudaGetLastError(), moet_err(MOET_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__,  \
					    call_text, cudaGetErrorString(e_)))

/*
 * The stream a call runs on: the caller's, else the calling thread's default
 * (moet_gpu_set_thread_stream, moet_gpu.h), which is the legacy default stream unless a CUDA
 * backend with its own stream (MOET_GPU_STREAM=own) set it for its pass (device.cu).
 */
cudaStream_t moet_stream(void *stream);

/* Every allocation and free of device or pinned memory calls it (graph.cu: moet_gpu_mem_epoch). */
void moet_gpu_epoch_bump(void);

/* moet_gpu_set_device's record of the thread's current device (for moet_stream). */
void moet_note_device(int device);

#define MOET_CUDA_TRY(call)                                                                  \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess)                                                       \
			return MOET_CUDA_ERR(e_, #call);                                     \
	} while (0)

#endif
