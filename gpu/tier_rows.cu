/*
 * tier_rows.cu: the CPU tier's rows between a device grouping and pinned host memory, and host
 * functions in stream order (moet_gpu.h, "The CPU tier of a device-grouped layer"): what a
 * device-grouped MoE layer with a CPU tier queues so that the host decides nothing between
 * its kernels (runtime/devgroup.c; a CUDA graph then holds the host's work as host nodes).
 *
 * The host buffers are pinned (cudaHostAlloc): with unified addressing a kernel reads and
 * writes them through their host address, over the link. Rows are copied, never computed on:
 * the bits are the host's or the device's, moved.
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <stdint.h>

#define TR_THREADS 256

/* Block i < n (n = count of the CPU tier, read on the device): pair i of the tier and its row
 * of h to the host. Blocks past n exit. */
static __global__ void __launch_bounds__(TR_THREADS)
rows_out_kernel(const moet_gpu_pair *pairs, const int32_t *first, const int32_t *count,
		int64_t top_k, const float *h, int64_t H, moet_gpu_pair *host_pairs,
		int32_t *host_count, float *host_rows, int32_t *keep)
{
	const int64_t i = blockIdx.x, n = *count;
	if (i == 0 && threadIdx.x == 0) {
		*host_count = (int32_t)n;
		keep[0] = *first;
		keep[1] = (int32_t)n;
	}
	if (i >= n)
		return;
	const moet_gpu_pair p = pairs[*first + i];
	if (threadIdx.x == 0)
		host_pairs[i] = p;
	const float *src = h + (p.pair / top_k) * H;
	float *dst = host_rows + i * H;
	for (int64_t c = threadIdx.x; c < H; c += TR_THREADS)
		dst[c] = src[c];
	/* NOTE: the host reads these once the kernel is done (a host function next on the
	 * stream); the fence makes the stores to host memory visible before the block ends */
	__threadfence_system();
}

/* Block i < n (keep: first, n): row i of the host's rows to y at the tier's position first + i. */
static __global__ void __launch_bounds__(TR_THREADS)
rows_in_kernel(const int32_t *keep, const float *host_rows, int64_t H, float *y)
{
	const int64_t i = blockIdx.x;
	if (i >= keep[1])
		return;
	const float *src = host_rows + i * H;
	float *dst = y + (keep[0] + i) * H;
	for (int64_t c = threadIdx.x; c < H; c += TR_THREADS)
		dst[c] = src[c];
}

static int check(int64_t max_pairs, int64_t H, const char *fn)
{
	if (max_pairs < 1 || max_pairs > MOET_GPU_GROUP_MAX_PAIRS || H < 1)
		return moet_err(MOET_EINVAL, "%s: %lld pairs, %lld columns", fn,
				(long long)max_pairs, (long long)H);
	return 0;
}

extern "C" int moet_gpu_tier_rows_out(const moet_gpu_group_bufs *g, int n_dev,
				      int64_t max_pairs, int64_t top_k, const float *h, int64_t H,
				      moet_gpu_pair *host_pairs, int32_t *host_count,
				      float *host_rows, int32_t *keep, void *stream)
{
	int rc = check(max_pairs, H, "moet_gpu_tier_rows_out");
	if (rc)
		return rc;
	if (!g || !g->pairs || !g->tier_first || !g->tier_count || n_dev < 1 ||
	    n_dev > MOET_GPU_GROUP_MAX_DEV || top_k < 1 || !h || !host_pairs || !host_count ||
	    !host_rows || !keep)
		return moet_err(MOET_EINVAL, "moet_gpu_tier_rows_out: %d devices, top_k %lld, NULL "
				"buffers", n_dev, (long long)top_k);
	rows_out_kernel<<<(unsigned)max_pairs, TR_THREADS, 0, moet_stream(stream)>>>(
		g->pairs, g->tier_first + n_dev, g->tier_count + n_dev, top_k, h, H, host_pairs,
		host_count, host_rows, keep);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

extern "C" int moet_gpu_tier_rows_in(const int32_t *keep, int64_t max_pairs,
				     const float *host_rows, int64_t H, float *y, void *stream)
{
	int rc = check(max_pairs, H, "moet_gpu_tier_rows_in");
	if (rc)
		return rc;
	if (!keep || !host_rows || !y)
		return moet_err(MOET_EINVAL, "moet_gpu_tier_rows_in: NULL buffers");
	rows_in_kernel<<<(unsigned)max_pairs, TR_THREADS, 0, moet_stream(stream)>>>(keep, host_rows,
										     H, y);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

/* One thread polls the host word until the executor has stored a ticket at or past `value`
 * (in the 32-bit wrapping order of moet_cpuexec_set_done_word), then the stream goes on. */
static __global__ void wait_word_kernel(const volatile uint32_t *word, uint32_t value)
{
	while ((int32_t)(*word - value) < 0)
		__nanosleep(1000);
	/* NOTE: the stream's next work (a copy of the rows the executor wrote before the word)
	 * starts after this kernel ends; the host's stores before its release store are
	 * visible by then */
	__threadfence_system();
}

extern "C" int moet_gpu_wait_word(const uint32_t *word, uint32_t value, void *stream)
{
	if (!word)
		return moet_err(MOET_EINVAL, "moet_gpu_wait_word: NULL word");
	wait_word_kernel<<<1, 1, 0, moet_stream(stream)>>>(word, value);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

extern "C" int moet_gpu_host_fn(void (*fn)(void *), void *arg, void *stream)
{
	if (!fn)
		return moet_err(MOET_EINVAL, "moet_gpu_host_fn: NULL function");
	MOET_CUDA_TRY(cudaLaunchHostFunc(moet_stream(stream), fn, arg));
	return 0;
}
