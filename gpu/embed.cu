/*
 * embed.cu: token embedding rows to binary32 on the device, x[t][i] = dec(table[tok[t]][i]),
 * for BF16 (a shift), F16 (cvt.f32.f16, exact) or F32 (a copy) tables: the values of the CPU's
 * embed_row (runtime/forward.c) bit for bit, NaN payloads of F16 aside. A token outside
 * [0, vocab) gives a row of +0 (never an out-of-bounds read; the host validates tokens first).
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define EMBED_THREADS 256

static __global__ void __launch_bounds__(EMBED_THREADS)
embed_kernel(const void *table, int dt, long long vocab, int H, const int32_t *tok, float *x)
{
	const int t = blockIdx.x;
	const long long id = tok[t];
	float *xr = x + (long long)t * H;
	const bool in = id >= 0 && id < vocab;
	const size_t off = in ? (size_t)id * (size_t)H : 0;
	for (int i = threadIdx.x; i < H; i += EMBED_THREADS) {
		float v = 0.0f;
		if (in) {
			if (dt == MOET_DT_BF16)
				v = __uint_as_float((uint32_t)((const uint16_t *)table)[off + i] << 16);
			else if (dt == MOET_DT_F16)
				v = __half2float(__ushort_as_half(((const uint16_t *)table)[off + i]));
			else
				v = ((const float *)table)[off + i];
		}
		xr[i] = v;
	}
}

extern "C" int moet_gpu_embed(const moet_mat *table, const int32_t *tok, int64_t n_tok, float *x,
			      void *stream)
{
	if (!table || !table->data || (table->dtype != MOET_DT_BF16 &&
					table->dtype != MOET_DT_F16 && table->dtype != MOET_DT_F32))
		return moet_err(MOET_EINVAL, "embed: no table, or dtype %d (BF16, F16 or F32)",
				table ? (int)table->dtype : -1);
	if (table->rows < 1 || table->cols < 1 || table->cols > INT32_MAX || n_tok < 0 ||
	    n_tok > INT32_MAX)
		return moet_err(MOET_EINVAL, "embed: table %lldx%lld, %lld tokens",
				(long long)table->rows, (long long)table->cols, (long long)n_tok);
	if (n_tok == 0)
		return 0;
	if (!tok || !x)
		return moet_err(MOET_EINVAL, "embed: NULL tokens or output");
	embed_kernel<<<(unsigned)n_tok, EMBED_THREADS, 0, moet_stream(stream)>>>(
		table->data, (int)table->dtype, table->rows, (int)table->cols, tok, x);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
