/*
 * moet_expc.h: exp_c and silu, the contract's own exponential (docs/numerics.md).
 *
 * One definition for host and device, built only from +, -, *, fma and exponent-bit
 * construction, so that every implementation (scalar, AVX-512, CUDA) can repeat it operation
 * for operation. Any vector version must equal this on all 2^32 inputs.
 *
 *   x NaN                 -> NaN (quiet; callers canonicalize)
 *   x > 89.0f             -> +inf       (covers +inf)
 *   x < -104.0f           -> +0         (covers -inf)
 *   otherwise:
 *     t = fma(x, LOG2E, SHIFT)          SHIFT = 1.5 * 2^23: t - SHIFT is round-to-nearest-even
 *     n = t - SHIFT                     of x*log2(e), computed exactly (|n| <= 151)
 *     r = fma(-n, LN2_HI, x)            Cody-Waite reduction, |r| <= ~0.347
 *     r = fma(-n, LN2_LO, r)
 *     p = 1/7!; p = fma(p, r, 1/k!) for k = 6..0         (Taylor degree 7, Horner)
 *     result = (p * 2^n1) * 2^n2        n1 = n / 2 (truncating), n2 = n - n1, both built as
 *                                       exponent bits; the first multiply is exact, the second
 *                                       rounds once (to a subnormal, or to +inf, correctly)
 * Between -104 and 89 the two-step scale gives +inf above ~88.72 and gradual underflow below
 * ~-87.34 without special cases. Accuracy: within a few ulp of e^x (tests measure it).
 *
 *   silu(z) = z / (1.0f + exp_c(-z))    IEEE division; silu(-inf) = NaN, silu(+inf) = +inf.
 */
#ifndef MOET_EXPC_H
#define MOET_EXPC_H

#include "moet_hd.h"

#define MOET_EXPC_LOG2E 0x1.715476p+0f
#define MOET_EXPC_SHIFT 0x1.8p+23f
#define MOET_EXPC_LN2_HI 0x1.62e400p-1f /* 0.693145751953125: low bits zero */
#define MOET_EXPC_LN2_LO 0x1.7f7d1cp-20f /* ln2 - LN2_HI */
#define MOET_EXPC_HI 89.0f
#define MOET_EXPC_LO (-104.0f)

MOET_HD float moet_exp2i(int n) /* 2^n as binary32 for -126 <= n <= 127 */
{
	return moet_bits_f32((uint32_t)(n + 127) << 23);
}

MOET_HD float moet_exp_c(float x)
{
	if (x != x)
		return x + x;
	if (x > MOET_EXPC_HI)
		return moet_bits_f32(0x7F800000u);
	if (x < MOET_EXPC_LO)
		return 0.0f;
	float t = MOET_FMA(x, MOET_EXPC_LOG2E, MOET_EXPC_SHIFT);
	float n = t - MOET_EXPC_SHIFT;
	float r = MOET_FMA(-n, MOET_EXPC_LN2_HI, x);
	r = MOET_FMA(-n, MOET_EXPC_LN2_LO, r);
	float p = 0x1.a01a02p-13f;            /* 1/5040 */
	p = MOET_FMA(p, r, 0x1.6c16c2p-10f);  /* 1/720 */
	p = MOET_FMA(p, r, 0x1.111112p-7f);   /* 1/120 */
	p = MOET_FMA(p, r, 0x1.555556p-5f);   /* 1/24 */
	p = MOET_FMA(p, r, 0x1.555556p-3f);   /* 1/6 */
	p = MOET_FMA(p, r, 0.5f);
	p = MOET_FMA(p, r, 1.0f);
	p = MOET_FMA(p, r, 1.0f);
	int ni = (int)n;
	int n1 = ni / 2;
	int n2 = ni - n1;
	return (p * moet_exp2i(n1)) * moet_exp2i(n2);
}

MOET_HD float moet_silu_c(float z)
{
	return z / (1.0f + moet_exp_c(-z));
}

#endif
