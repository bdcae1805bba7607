/*
 * moet_exp64.h: the binary64 exponential of sampling (runtime/sample.c on the host,
 * gpu/sample.cu on the device), one definition for both.
 *
 * Why not libm's exp: glibc's exp and CUDA's device exp differ in the last bit for a share of
 * inputs, and sampling adds these values in binary64 and compares running sums against a
 * uniform draw; a last-bit difference could, rarely, pick another token. Built only from
 * binary64 +, -, * (no fma: identical on a host without FMA hardware), a conversion to int and
 * exponent-bit construction, both sides give the same bits (host -ffp-contract=off, device
 * --fmad=false; binary64 has no flush-to-zero on either).
 *
 *   x NaN          -> NaN
 *   x > 709.79     -> +inf          (covers +inf; exp(709.79) overflows)
 *   x < -746       -> +0            (covers -inf; exp(-746) is below half the least subnormal)
 *   otherwise:
 *     n = (x * LOG2E + SHIFT) - SHIFT    SHIFT = 1.5 * 2^52: x*log2(e) rounded to an integer
 *     r = x - n * LN2_HI                 exact (LN2_HI has 32 significant bits, |n| <= 1077)
 *     r = r - n * LN2_LO                 |r| <= ~0.347
 *     p = Taylor series of e^r to degree 13 by Horner (the first omitted term is below
 *         2^-60 of p)
 *     result = (p * 2^n1) * 2^n2         n1 = n / 2 (truncating), n2 = n - n1, exponent bits;
 *                                        the first product is exact, the second rounds once
 *                                        (to a subnormal or to +inf correctly)
 * Accuracy: within 2 ulp of e^x over the range sampling uses (tests/gpu/test_gpu_sample.c
 * measures it against libm).
 */
#ifndef MOET_EXP64_H
#define MOET_EXP64_H

#include "moet_hd.h"

#define MOET_EXP64_LOG2E 0x1.71547652b82fep+0
#define MOET_EXP64_SHIFT 0x1.8p+52
#define MOET_EXP64_LN2_HI 0x1.62e42feep-1         /* ln 2 rounded to 32 bits */
#define MOET_EXP64_LN2_LO 0x1.a39ef35793c76p-33   /* ln 2 - LN2_HI */

MOET_HD double moet_exp64_2i(int n) /* 2^n for -1022 <= n <= 1023 */
{
	uint64_t u = (uint64_t)(n + 1023) << 52;
#if defined(__CUDA_ARCH__)
	return __longlong_as_double((long long)u);
#else
	double d;
	memcpy(&d, &u, sizeof(d));
	return d;
#endif
}

MOET_HD double moet_exp64(double x)
{
	if (x != x)
		return x + x;
	if (x > 709.79)
		return moet_exp64_2i(1023) * 2.0; /* +inf */
	if (x < -746.0)
		return 0.0;
	double t = x * MOET_EXP64_LOG2E + MOET_EXP64_SHIFT;
	double n = t - MOET_EXP64_SHIFT;
	double r = x - n * MOET_EXP64_LN2_HI;
	r = r - n * MOET_EXP64_LN2_LO;
	double p = 0x1.6124613a86d09p-33;  /* 1/13! */
	p = p * r + 0x1.1eed8eff8d898p-29; /* 1/12! */
	p = p * r + 0x1.ae64567f544e4p-26; /* 1/11! */
	p = p * r + 0x1.27e4fb7789f5cp-22; /* 1/10! */
	p = p * r + 0x1.71de3a556c734p-19; /* 1/9! */
	p = p * r + 0x1.a01a01a01a01ap-16; /* 1/8! */
	p = p * r + 0x1.a01a01a01a01ap-13; /* 1/7! */
	p = p * r + 0x1.6c16c16c16c17p-10; /* 1/6! */
	p = p * r + 0x1.1111111111111p-7;  /* 1/5! */
	p = p * r + 0x1.5555555555555p-5;  /* 1/4! */
	p = p * r + 0x1.5555555555555p-3;  /* 1/3! */
	p = p * r + 0.5;
	p = p * r + 1.0;
	p = p * r + 1.0;
	int ni = (int)n;
	int n1 = ni / 2;
	int n2 = ni - n1;
	return (p * moet_exp64_2i(n1)) * moet_exp64_2i(n2);
}

#endif
