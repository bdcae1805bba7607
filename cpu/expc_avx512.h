/*
 * expc_avx512.h: exp_c and silu_c on 16 lanes (AVX-512F), operation for operation the scalar
 * definition in common/moet_expc.h (docs/numerics.md), so every lane returns the scalar's bits.
 * Private to the AVX-512 kernels: include only from files built with the AVX-512 flags.
 *
 *   scalar (moet_expc.h)                 here, per lane
 *   t = fma(x, LOG2E, SHIFT)             _mm512_fmadd_ps(x, LOG2E, SHIFT)
 *   n = t - SHIFT                        _mm512_sub_ps
 *   r = fma(-n, LN2_HI, x)               _mm512_fnmadd_ps(n, LN2_HI, x): -(n*c) + x is the
 *   r = fma(-n, LN2_LO, r)               same exact value as (-n)*c + x, rounded once
 *   p = 1/7!; p = fma(p, r, c_k)         _mm512_fmadd_ps, the same 7 constants in order
 *   n1 = (int)n / 2, n2 = (int)n - n1    cvtt (n is integral: exact), (n + (n >>> 31)) >> 1 is
 *                                        C's truncating division by 2, n2 = n - n1
 *   (p * 2^n1) * 2^n2                    2^k built as (k + 127) << 23, two _mm512_mul_ps
 *   x > 89 -> +inf, x < -104 -> +0,      masked moves after the fact (the lanes' polynomial is
 *   NaN -> x + x                         computed and discarded; no exception is unmasked)
 *   silu_c(z) = z / (1 + exp_c(-z))      sign flip, _mm512_add_ps, _mm512_div_ps (IEEE)
 *
 * NaN payloads: x + x keeps the input's payload like the scalar code; where two NaNs meet the
 * hardware's choice of operand may differ from the compiler's scalar operand order, so
 * callers compare NaN with NaN (docs/numerics.md: "NaNs compare equal").
 */
#ifndef MOET_EXPC_AVX512_H
#define MOET_EXPC_AVX512_H

#include <immintrin.h>

#include "moet_expc.h"

static inline __m512 moet_exp_c_avx512(__m512 x)
{
	const __m512 shift = _mm512_set1_ps(MOET_EXPC_SHIFT);
	__m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(MOET_EXPC_LOG2E), shift);
	__m512 n = _mm512_sub_ps(t, shift);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MOET_EXPC_LN2_HI), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MOET_EXPC_LN2_LO), r);
	__m512 p = _mm512_set1_ps(0x1.a01a02p-13f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.6c16c2p-10f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.111112p-7f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.555556p-5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.555556p-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	__m512i ni = _mm512_cvttps_epi32(n);
	__m512i n1 = _mm512_srai_epi32(_mm512_add_epi32(ni, _mm512_srli_epi32(ni, 31)), 1);
	__m512i n2 = _mm512_sub_epi32(ni, n1);
	const __m512i bias = _mm512_set1_epi32(127);
	__m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
	__m512 e2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
	__m512 y = _mm512_mul_ps(_mm512_mul_ps(p, e1), e2);
	__mmask16 hi = _mm512_cmp_ps_mask(x, _mm512_set1_ps(MOET_EXPC_HI), _CMP_GT_OQ);
	__mmask16 lo = _mm512_cmp_ps_mask(x, _mm512_set1_ps(MOET_EXPC_LO), _CMP_LT_OQ);
	__mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
	y = _mm512_mask_mov_ps(y, hi, _mm512_castsi512_ps(_mm512_set1_epi32(0x7F800000)));
	y = _mm512_mask_mov_ps(y, lo, _mm512_setzero_ps());
	return _mm512_mask_mov_ps(y, nan, _mm512_add_ps(x, x));
}

static inline __m512 moet_silu_c_avx512(__m512 z)
{
	__m512 neg = _mm512_castsi512_ps(
		_mm512_xor_si512(_mm512_castps_si512(z), _mm512_set1_epi32((int)0x80000000u)));
	__m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), moet_exp_c_avx512(neg));
	return _mm512_div_ps(z, d);
}

#endif
