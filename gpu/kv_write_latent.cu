/*
 * kv_write_latent.cu: appends each row's latent [c | k_pe] (width floats) to its own cache at
 * its position, for the absorbed MLA form: c_base[t] + r * c_stride <- kva row t, r the cache
 * row of position pos[t] (its block's, moet_gpu_pages; or pos[t]).
 * A copy: bit-exact by construction.
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_runtime.h>
#include <stdint.h>

static __global__ void kv_write_latent_kernel(const float *kva, long long kva_stride, int width,
					      float *const *c_base, long long c_stride,
					      const int32_t *pos, const moet_gpu_pages pg)
{
	const int t = blockIdx.x;
	float *dst = c_base[t] + moet_gpu_page_row(pg, t, pos[t]) * c_stride;
	for (int j = threadIdx.x; j < width; j += blockDim.x)
		dst[j] = kva[t * kva_stride + j];
}

extern "C" int moet_gpu_kv_write_latent(const float *kva, long long kva_stride, long long width,
					long long n_rows, float *const *c_base, long long c_stride,
					const int32_t *pos, const moet_gpu_pages *pages,
					void *stream)
{
	if (!kva || !c_base || !pos ||
	    (pages && (!pages->table || !pages->off || !pages->shift)))
		return moet_err(MOET_EINVAL, "kv_write_latent: NULL pointer");
	if (n_rows <= 0)
		return 0;
	if (n_rows > 65535 || width <= 0 || width > c_stride || width > kva_stride)
		return moet_err(MOET_EINVAL, "kv_write_latent: %lld rows (<= 65535), width %lld, "
				"strides %lld/%lld", n_rows, width, kva_stride, c_stride);
	const moet_gpu_pages pg = pages ? *pages : moet_gpu_pages{ NULL, NULL, NULL };
	kv_write_latent_kernel<<<(unsigned)n_rows, 128, 0, moet_stream(stream)>>>(
		kva, kva_stride, (int)width, c_base, c_stride, pos, pg);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
