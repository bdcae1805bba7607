/*
 * device.cu: device discovery, and exp_c evaluated on the device (the contract's
 * transcendental, from the same header the host uses).
 */
#include "moet_gpu.h"
#include "gpu_int.h"

extern "C" {
#include "moet_err.h"
}
#include "moet_expc.h"

#include <cuda_runtime.h>

#define CUDA_TRY(call)                                                                      \
	do {                                                                                \
		cudaError_t e_ = (call);                                                    \
		if (e_ != cudaSuccess)                                                      \
			return moet_err(MOET_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
					cudaGetErrorString(e_));                            \
	} while (0)

/* NOTE: per thread, not per process: each forward pass sets it on its own thread (the CUDA
 * backend's prepare_rows), so two models on two threads never see each other's stream. A
 * stream belongs to one device: while the thread's current device is another (remote.c's
 * calls on GPUs 1..), NULL means that device's legacy stream, as before. */
static thread_local cudaStream_t thread_stream = nullptr;
static thread_local int thread_stream_dev = 0, thread_dev = 0;

cudaStream_t moet_stream(void *stream)
{
	if (stream)
		return (cudaStream_t)stream;
	return thread_dev == thread_stream_dev ? thread_stream : nullptr;
}

void moet_note_device(int device)
{
	thread_dev = device;
}

extern "C" void moet_gpu_set_thread_stream(void *stream)
{
	thread_stream = (cudaStream_t)stream;
	thread_stream_dev = thread_dev;
}

extern "C" void *moet_gpu_thread_stream(void)
{
	return (void *)thread_stream;
}

extern "C" int moet_gpu_count(const char **out_why)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		if (out_why)
			*out_why = cudaGetErrorString(e);
		return 0;
	}
	if (n == 0 && out_why)
		*out_why = "no CUDA device";
	return n;
}

static __global__ void exp_c_kernel(const float *in, float *out, long long n)
{
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		out[i] = moet_exp_c(in[i]);
}

extern "C" int moet_gpu_exp_c(const float *in, float *out, long long n)
{
	float *d_in = NULL, *d_out = NULL;
	int rc = 0;
	size_t bytes = (size_t)n * sizeof(float);
	if (n <= 0)
		return 0;
	CUDA_TRY(cudaMalloc(&d_in, bytes));
	if (cudaMalloc(&d_out, bytes) != cudaSuccess) {
		cudaFree(d_in);
		return moet_err(MOET_EDEVICE, "cudaMalloc of %zu bytes failed", bytes);
	}
	if (cudaMemcpy(d_in, in, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
		rc = moet_err(MOET_EDEVICE, "copy to device failed");
		goto fail;
	}
	exp_c_kernel<<<(unsigned)((n + 255) / 256), 256>>>(d_in, d_out, n);
	if (cudaGetLastError() != cudaSuccess ||
	    cudaMemcpy(out, d_out, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
		rc = moet_err(MOET_EDEVICE, "exp_c kernel or copy back failed");
fail:
	cudaFree(d_in);
	cudaFree(d_out);
	return rc;
}
