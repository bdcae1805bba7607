/*
 * moet_hd.h: what lets one numeric definition compile for host C and CUDA device code.
 *
 * MOET_HD marks an inline function usable on both sides. MOET_FMA is a correctly rounded
 * fused multiply-add on both. Plain * and + in contract code rely
 * on -ffp-contract=off (host) and --fmad=false (device) never fusing them.
 */
#ifndef MOET_HD_H
#define MOET_HD_H

#include <stdint.h>
#include <string.h>

#include <math.h>
#if defined(__CUDACC__)
#define MOET_HD static __host__ __device__ __forceinline__
#else
#define MOET_HD static inline
#endif
/* NOTE: fmaf is a single correctly rounded fma on both sides (CUDA's device fmaf is
 * __fmaf_rn); glibc's host fmaf is exact and uses the FMA instruction where present. */
#define MOET_FMA(a, b, c) fmaf((a), (b), (c))

MOET_HD uint32_t moet_f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
	return __float_as_uint(f);
#else
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
#endif
}

MOET_HD float moet_bits_f32(uint32_t u)
{
#if defined(__CUDA_ARCH__)
	return __uint_as_float(u);
#else
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
#endif
}

/* Any NaN becomes the canonical quiet NaN 0x7FC00000 (numerics contract, "NaN"). */
MOET_HD float moet_canon_nan(float f)
{
	return (f != f) ? moet_bits_f32(0x7FC00000u) : f;
}

#endif
