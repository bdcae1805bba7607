/*
 * rope.cu: rotary embedding on the device, in place, for every row (token) and head, each row
 * at its own position. The cos/sin tables are computed on the device from inv_freq, with the
 * host's arithmetic (moet_rope_tables_ref, cpu/dense_ref.c):
 *   ang = (float)pos * inv_freq[i]                    (binary32 multiply, identical)
 *   cos_t[i] = (float)cos((double)ang) * attn_factor  (binary64 cos rounded once, then one
 *   sin_t[i] = (float)sin((double)ang) * attn_factor   binary32 multiply)
 * then moet_rope_ref's rotation per head:
 *   interleave 1: a = x[2i], b = x[2i+1];  interleave 0: a = x[i], b = x[i + n_freq]
 *   x[i] = a * cos_t[i] - b * sin_t[i];  x[i + n_freq] = b * cos_t[i] + a * sin_t[i]
 * (two rounded products, one rounded add: --fmad=false keeps them apart, as -ffp-contract=off
 * does on the host).
 *
 * NOTE: the device's binary64 cos/sin are within 2 ulp of binary64 (CUDA's documented bound),
 * glibc's are correctly rounded in practice: after rounding to binary32 the tables differ only
 * when the binary64 value lies within a few binary64 ulp of a binary32 rounding boundary, about
 * one entry in 2^27. Outputs are therefore equal to the CPU's nearly always and within 1 ulp of
 * the table otherwise (the test states its tolerance and counts exact matches).
 *
 * Layout: the rope part of head h of row t starts at x + t * row_stride + h * head_stride
 * (the caller points x at the first head's rope part, e.g. q + nope or kv_a_out + kv_lora).
 * One block per row: the tables once, then heads in chunks staged through shared memory (the
 * interleaved layout permutes values within a head, so a head is read whole before written).
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define ROPE_THREADS 128
#define ROPE_MAX_FREQ 256                  /* qk_rope_head_dim <= 512, as on the CPU */
#define ROPE_STAGE_FLOATS 8192             /* staged head values per chunk (32 KB) */
#define SM120_SMEM_MAX (99 * 1024)

static_assert((2 * ROPE_MAX_FREQ + ROPE_STAGE_FLOATS) * 4 <= SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block");

static __global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(float *x, long long row_stride, int n_heads, long long head_stride, int n_freq,
	    const int32_t *pos, const float *inv_freq, float attn_factor, int interleave)
{
	__shared__ float ct[ROPE_MAX_FREQ], st[ROPE_MAX_FREQ];
	__shared__ float buf[ROPE_STAGE_FLOATS];
	const int tid = threadIdx.x, d = 2 * n_freq;
	const float fpos = (float)pos[blockIdx.x];
	for (int i = tid; i < n_freq; i += ROPE_THREADS) {
		float ang = fpos * inv_freq[i];
		ct[i] = (float)cos((double)ang) * attn_factor;
		st[i] = (float)sin((double)ang) * attn_factor;
	}
	float *xr = x + blockIdx.x * row_stride;
	const int hc = ROPE_STAGE_FLOATS / d; /* heads per chunk */
	for (int h0 = 0; h0 < n_heads; h0 += hc) {
		const int nh = min(hc, n_heads - h0);
		__syncthreads(); /* tables ready; previous chunk written back */
		for (int i = tid; i < nh * d; i += ROPE_THREADS)
			buf[i] = xr[(h0 + i / d) * head_stride + i % d];
		__syncthreads();
		for (int i = tid; i < nh * n_freq; i += ROPE_THREADS) {
			const int h = i / n_freq, f = i % n_freq;
			const float *v = buf + h * d;
			const float a = interleave ? v[2 * f] : v[f];
			const float b = interleave ? v[2 * f + 1] : v[f + n_freq];
			float *o = xr + (h0 + h) * head_stride;
			o[f] = a * ct[f] - b * st[f];
			o[f + n_freq] = b * ct[f] + a * st[f];
		}
	}
}

extern "C" int moet_gpu_rope(float *x, int64_t n_rows, int64_t row_stride, int64_t n_heads,
			     int64_t head_stride, int64_t n_freq, const int32_t *pos,
			     const float *inv_freq, float attn_factor, int interleave, void *stream)
{
	if (n_rows < 0 || n_rows > INT32_MAX || n_heads < 1 || n_heads > INT32_MAX || n_freq < 1 ||
	    n_freq > ROPE_MAX_FREQ)
		return moet_err(MOET_EINVAL, "rope: %lld rows, %lld heads, %lld frequencies (at most "
				"%d)", (long long)n_rows, (long long)n_heads, (long long)n_freq,
				ROPE_MAX_FREQ);
	if (n_rows == 0)
		return 0;
	if (!x || !pos || !inv_freq || head_stride < 2 * n_freq ||
	    row_stride < (n_heads - 1) * head_stride + 2 * n_freq)
		return moet_err(MOET_EINVAL, "rope: x %p, pos %p, inv_freq %p, head stride %lld, row "
				"stride %lld: NULL or overlapping heads/rows", (void *)x,
				(const void *)pos, (const void *)inv_freq, (long long)head_stride,
				(long long)row_stride);
	rope_kernel<<<(unsigned)n_rows, ROPE_THREADS, 0, moet_stream(stream)>>>(
		x, row_stride, (int)n_heads, head_stride, (int)n_freq, pos, inv_freq, attn_factor,
		interleave != 0);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
