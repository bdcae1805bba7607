/*
 * attend_avx512.c: moet_attend_ref's attention (cpu/dense_ref.c) with AVX-512, bit for bit the
 * same (the CPU backend's default where the CPU has AVX-512; MOET_CPU_ATTN=ref keeps the
 * scalar one: cpu/kernels.c).
 *
 * The reference's operations, in its order, per output:
 *   s[p] = (float)(binary64 sum over d in index order of q[d] * k_p[d]) * scale
 *   mx = max over p of s[p] (a serial scan: "s > mx")
 *   e[p] = exp_c(s[p] - mx); sum = binary64 sum over p in order of e[p]
 *   out[d] = (float)((binary64 sum over p in order of e[p] * v_p[d]) / sum)
 * Where the lanes go: a score vector holds 8 positions (each lane its own dot, the terms still
 * in d order; the K values of 8 columns brought into the lanes by an 8 x 8 transpose of the
 * 8 cache rows), four such vectors at a time so that their fma chains overlap; an output vector holds 8 dimensions (each lane its own
 * sum, the terms still in p order). The products are of two binary32 values, exact in binary64,
 * so fma(a, b, c) = c + a * b, the reference's two operations. exp_c is the exhaustively
 * checked moet_exp_c_avx512 (cpu/expc_avx512.h); the maximum and the softmax sum stay serial
 * scans as in the reference.
 */
#include "moet_cpu.h"

#if defined(__AVX512F__)

#include <immintrin.h>
#include <math.h>

#include "expc_avx512.h"
#include "moet_kvrow.h"

#define GROUPS 4 /* score vectors in flight: 32 positions */

/* Columns d .. d+7 of rows r[0..7] transposed: c[j] holds column d + j, lane i row i. */
static inline void transpose8(const float *const r[8], int64_t d, __m256 c[8])
{
	const __m256 t0 = _mm256_unpacklo_ps(_mm256_loadu_ps(r[0] + d), _mm256_loadu_ps(r[1] + d));
	const __m256 t1 = _mm256_unpackhi_ps(_mm256_loadu_ps(r[0] + d), _mm256_loadu_ps(r[1] + d));
	const __m256 t2 = _mm256_unpacklo_ps(_mm256_loadu_ps(r[2] + d), _mm256_loadu_ps(r[3] + d));
	const __m256 t3 = _mm256_unpackhi_ps(_mm256_loadu_ps(r[2] + d), _mm256_loadu_ps(r[3] + d));
	const __m256 t4 = _mm256_unpacklo_ps(_mm256_loadu_ps(r[4] + d), _mm256_loadu_ps(r[5] + d));
	const __m256 t5 = _mm256_unpackhi_ps(_mm256_loadu_ps(r[4] + d), _mm256_loadu_ps(r[5] + d));
	const __m256 t6 = _mm256_unpacklo_ps(_mm256_loadu_ps(r[6] + d), _mm256_loadu_ps(r[7] + d));
	const __m256 t7 = _mm256_unpackhi_ps(_mm256_loadu_ps(r[6] + d), _mm256_loadu_ps(r[7] + d));
	const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
	const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
	const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
	const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
	const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
	const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
	const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
	const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
	c[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
	c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
	c[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
	c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
	c[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
	c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
	c[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
	c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The scores of positions p0 .. p0 + n - 1 (n <= 8 * GROUPS) into s. NOTE: the K columns
 * reach the lanes by 8 x 8 transposes of the cache rows (a gather per column measured slower
 * on the development VM's Zen), the last d_qk % 8 by gathers. */
static void scores(const float *q, const float *k, int64_t k_stride, const int32_t *blocks,
		   int block_shift, int64_t p0, int64_t n, int64_t d_qk, float scale, float *s)
{
	const float *rows[GROUPS][8];
	__m512i idx[GROUPS];
	__m512d acc[GROUPS];
	for (int g = 0; g < GROUPS; g++) {
		long long off[8];
		for (int i = 0; i < 8; i++) {
			/* a lane past the end reads position p0 (valid memory); it is not stored */
			const int64_t p = 8 * g + i < n ? p0 + 8 * g + i : p0;
			off[i] = (long long)(moet_kv_row(blocks, block_shift, p) * k_stride);
			rows[g][i] = k + off[i];
		}
		idx[g] = _mm512_loadu_si512(off);
		acc[g] = _mm512_setzero_pd();
	}
	const int ng = (int)((n + 7) / 8);
	const int64_t d8 = d_qk & ~(int64_t)7;
	for (int64_t d = 0; d < d8; d += 8) {
		for (int g = 0; g < ng; g++) {
			__m256 c[8];
			transpose8(rows[g], d, c);
			for (int j = 0; j < 8; j++)
				acc[g] = _mm512_fmadd_pd(_mm512_set1_pd((double)q[d + j]),
							 _mm512_cvtps_pd(c[j]), acc[g]);
		}
	}
	for (int64_t d = d8; d < d_qk; d++) {
		const __m512d qd = _mm512_set1_pd((double)q[d]);
		for (int g = 0; g < ng; g++) {
			const __m256 kf = _mm512_i64gather_ps(idx[g], k + d, 4);
			acc[g] = _mm512_fmadd_pd(qd, _mm512_cvtps_pd(kf), acc[g]);
		}
	}
	const __m256 sc = _mm256_set1_ps(scale);
	for (int g = 0; g < ng; g++) {
		const __m256 v = _mm256_mul_ps(_mm512_cvtpd_ps(acc[g]), sc);
		float tmp[8];
		_mm256_storeu_ps(tmp, v);
		for (int i = 0; i < 8 && 8 * g + i < n; i++)
			s[8 * g + i] = tmp[i];
	}
}

void moet_attend_avx512(const float *q, const float *k, int64_t k_stride, const float *v,
			int64_t v_stride, const int32_t *blocks, int block_shift, int64_t n_pos,
			int64_t d_qk, int64_t d_v, float scale, float *scratch, float *out)
{
	for (int64_t p0 = 0; p0 < n_pos; p0 += 8 * GROUPS) {
		const int64_t n = n_pos - p0 < 8 * GROUPS ? n_pos - p0 : 8 * GROUPS;
		scores(q, k, k_stride, blocks, block_shift, p0, n, d_qk, scale, scratch + p0);
	}
	float mx = -INFINITY;
	for (int64_t p = 0; p < n_pos; p++)
		if (scratch[p] > mx)
			mx = scratch[p];
	/* e[p] = exp_c(s[p] - mx), 16 at a time (the tail masked), then the serial sum */
	const __m512 vm = _mm512_set1_ps(mx);
	for (int64_t p = 0; p < n_pos; p += 16) {
		const __mmask16 m = n_pos - p >= 16 ? (__mmask16)0xFFFF
						    : (__mmask16)((1u << (n_pos - p)) - 1);
		const __m512 x = _mm512_maskz_loadu_ps(m, scratch + p);
		_mm512_mask_storeu_ps(scratch + p, m, moet_exp_c_avx512(_mm512_sub_ps(x, vm)));
	}
	double sum = 0.0;
	for (int64_t p = 0; p < n_pos; p++)
		sum += scratch[p];
	/* the outputs, 16 vectors of 8 dimensions per pass over the positions */
	for (int64_t d0 = 0; d0 < d_v; d0 += 128) {
		const int64_t w = d_v - d0 < 128 ? d_v - d0 : 128;
		const int nv = (int)((w + 7) / 8);
		__m512d acc[16];
		for (int j = 0; j < 16; j++)
			acc[j] = _mm512_setzero_pd();
		for (int64_t p = 0; p < n_pos; p++) {
			const float *vr = v + moet_kv_row(blocks, block_shift, p) * v_stride + d0;
			const __m512d e = _mm512_set1_pd((double)scratch[p]);
			for (int j = 0; j < nv; j++) {
				const int64_t left = w - 8 * j;
				const __mmask8 m = left >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << left) - 1);
				const __m256 x = _mm256_maskz_loadu_ps(m, vr + 8 * j);
				acc[j] = _mm512_fmadd_pd(e, _mm512_cvtps_pd(x), acc[j]);
			}
		}
		const __m512d vs = _mm512_set1_pd(sum);
		for (int j = 0; j < nv; j++) {
			const int64_t left = w - 8 * j;
			const __mmask8 m = left >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << left) - 1);
			_mm256_mask_storeu_ps(out + d0 + 8 * j, m,
					      _mm512_cvtpd_ps(_mm512_div_pd(acc[j], vs)));
		}
	}
}

#endif
