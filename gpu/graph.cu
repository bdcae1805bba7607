/*
 * graph.cu: CUDA graphs of a stream's work (the decode step's capture, runtime/graph.c), and
 * the memory epoch that tells a captured graph whether the buffers it names still exist.
 *
 * A graph holds the device pointers of the kernels' arguments as they were at the capture: it
 * is valid while none of those buffers has been freed or replaced. Every device or pinned
 * allocation and free of the program goes through gpu/ (alloc.cu, host.cu), and each bumps one
 * process-wide counter; a caller that captured at epoch e may replay while the epoch is still
 * e (conservative: an unrelated allocation also ends the graph's life, which only costs a
 * capture).
 *
 * Capture is thread-local (cudaStreamCaptureModeThreadLocal): another thread's CUDA calls do
 * not break it, and a call of the capturing thread that a capture cannot hold (a synchronous
 * copy, work on the legacy stream) fails, invalidating the capture; moet_gpu_capture_end then
 * reports MOET_EDEVICE and the caller runs the work directly.
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <atomic>

static std::atomic<unsigned long long> epoch{ 0 };

void moet_gpu_epoch_bump(void)
{
	epoch.fetch_add(1, std::memory_order_relaxed);
}

extern "C" uint64_t moet_gpu_mem_epoch(void)
{
	return (uint64_t)epoch.load(std::memory_order_relaxed);
}

extern "C" int moet_gpu_capture_begin(void *stream)
{
	if (!stream)
		return moet_err(MOET_EINVAL, "moet_gpu_capture_begin: the legacy stream cannot be "
				"captured");
	MOET_CUDA_TRY(cudaStreamBeginCapture((cudaStream_t)stream,
					     cudaStreamCaptureModeThreadLocal));
	return 0;
}

extern "C" int moet_gpu_capture_end(void *stream, void **out_exec)
{
	cudaGraph_t g = nullptr;
	cudaGraphExec_t x = nullptr;
	*out_exec = NULL;
	cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
	if (e != cudaSuccess || !g) {
		if (g)
			cudaGraphDestroy(g);
		return MOET_CUDA_ERR(e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated,
				     "cudaStreamEndCapture");
	}
	e = cudaGraphInstantiate(&x, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess)
		return MOET_CUDA_ERR(e, "cudaGraphInstantiate");
	*out_exec = (void *)x;
	return 0;
}

extern "C" int moet_gpu_graph_launch(void *exec, void *stream)
{
	MOET_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream));
	return 0;
}

extern "C" void moet_gpu_graph_destroy(void *exec)
{
	if (exec)
		cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
