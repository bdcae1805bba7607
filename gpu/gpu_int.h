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
#include "moet_err.h"
}

#define MOET_CUDA_ERR(e_, call_text)                                                         \
	((void)cudaGetLastError(), moet_err(MOET_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__,  \
					    call_text, cudaGetErrorString(e_)))

#define MOET_CUDA_TRY(call)                                                                  \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess)                                                       \
			return MOET_CUDA_ERR(e_, #call);                                     \
	} while (0)

#endif
