/*
 * expert_avx512.c: the contract expert kernels (docs/numerics.md) on AVX-512, returning the
 * bits of the scalar reference (cpu/expert_ref.c) for every input.
 *
 * NOTE: how the contract maps onto registers.
 *
 *   contract, one (row r, token x)             here
 *   acc[0..15] = +0                            one zmm of 16 lanes (register or a 64-byte slot)
 *   per 128-column block b:  p[0..15] = +0     one zmm P, _mm512_setzero_ps
 *     step t: k = 128b + 16t + l, lane l       weight codes k .. k+15 decoded into one zmm whose
 *       p[l] = fma(dec(W[r][k]), x[k], p[l])   lane l holds column k+l; x[k .. k+15] loaded into
 *                                              one zmm; P = fma(w, x, P) on the 16 lanes
 *       (only where k < K)                     partial steps: masked loads (no read past the row
 *                                              or the vector) and a masked fma (_mask3_: lanes
 *                                              past K keep P untouched, as the reference skips
 *                                              them); steps past K are not executed at all
 *   acc[l] = fma(p[l], S[r/128][b], acc[l])    one fma over all 16 lanes, empty lanes included
 *   halving tree                               extract the 256-bit halves and add (l, l+8), the
 *                                              128-bit halves (l, l+4), movehl (l, l+2), then
 *                                              lane 0 + lane 1: the reference's adds, in order
 *
 * Each lane therefore sees exactly the reference's fmas in the reference's order; the
 * blocking below only changes which (row, token) pairs are in flight, never the order of one
 * pair's operations. Adds and fmas commute in their operands bit for bit (IEEE), except which
 * NaN payload wins where two NaNs meet: outputs agree NaN for NaN (the expert FFN then
 * canonicalizes). -ffp-contract=off keeps the compiler from fusing anything; no fast-math.
 *
 * e4m3 decode, exact, 64 codes at a time (AVX-512 VBMI, one 64-byte load):
 *   the decoded binary32 of every code has its two low bytes zero, so it is two bytes:
 *   b3 = T3[c & 0x7F] | (c & 0x80), b2 = T2[c & 0x7F], two vpermi2b lookups of 128-entry
 *   byte tables (vpermi2b reads index bits 6:0: the sign bit is ignored, then or'ed back);
 *   four zero-masked vpermt2b place (b2, b3) into bytes 2, 3 of the dwords, in column order.
 *   The tables are moet_dec_e4m3's bytes, so subnormals (m x 2^-9) and the NaN codes 0x7F,
 *   0xFF (0x7FC00000 | sign) come out exactly as the reference's (tested on all 256 codes).
 *   On Sapphire Rapids a 2-source byte permute is 3 uops, 2 of them on port 5 (measured:
 *   2 cycles each), so this costs 12 port-5 cycles per 64 codes; the many-token path uses it
 *   (its decode is shared by the tokens). The one-token path uses dec64_e4m3_wt instead: the
 *   same two lookups, but on codes first arranged by one vpermb so that two 1-cycle
 *   vpunpck{l,h}bw(b2, b3) give words b3:b2 paired two steps to a dword; a shift left 16
 *   (port 0) and an and with 0xFFFF0000 (any port) then split each into two steps' weights:
 *   7 port-5 cycles per 64 codes, the same bits (tested for every code at every column of
 *   a block pair). The shift decode the design suggested (((c & 0x7F) << 20) * 2^120,
 *   sign, NaN blend) costs about 6 ops per 16 and its fmas would read subnormal
 *   operands (a microcode assist of ~130 cycles each on these cores, measured), so it is
 *   only the fallback of a build without VBMI support in the compiler (the contract runs
 *   with DAZ/FTZ off, which the tests check in MXCSR).
 * BF16: zero-extend the 16 words to dwords, shift left 16. F32: loaded as is.
 *
 * Blocking (constants below; measured on the 2-core Sapphire Rapids development VM).
 *   1 token (decode): rows one after another, each streamed block by block straight from the
 *     checkpoint's bytes into registers (8 zmm of weights per block), x held in L1, with a
 *     software prefetch of the stream PF_FAR ahead into L2 and PF_NEAR ahead into L1 (the
 *     hardware prefetcher alone left a core at ~40% of its read bandwidth, 3 KB ahead into
 *     L1 at ~75%; the two levels add ~5% more), plus one line per call (every 256 bytes)
 *     PF_HINT ahead. NOTE: that one line is worth ~8%. Without a PMU in the VM, measured: a core
 *     streams ~16.6 GB/s alone, this loop computes ~17.8 GB/s per core from L2, and any
 *     vector work between the loads costs stream rate well before the compute bound (a read
 *     loop with the same prefetches and 18 dummy vector ops per 64 bytes, the kernel's count,
 *     streamed 13.7 GB/s, exactly the kernel's 13.7; 8 ops: 15.8); prefetch distances
 *     (4-24 KB, 0.5-3 KB) and NTA changed nothing; the sparse far line took one core from
 *     13.8 to 14.9 GB/s and two from ~26-27 to ~29.5 (16-64 KB alike). The read ceiling was
 *     unchanged by it (runtime/bench_ceil.c carries the same line). The only serial chain
 *     per row is acc (one fma per block). Full blocks go in pairs (block2): the two blocks'
 *     8-fma chains of P are independent, so their fmas are written interleaved and two
 *     chains are in flight without relying on the out-of-order window (16 zmm of weights);
 *     acc then takes the two blocks' scale fmas in block order. Measured on an L2-resident
 *     matrix, one core: ~13.5 GB/s with dec64_e4m3 (24 port-5 cycles per block: the bound),
 *     ~18 GB/s with dec64_e4m3_wt (~20 cycles per block against an issue bound of ~18.5: 14
 *     port-5 uops, 4 port-0, 19 for either, per block); from DRAM one core then streams at
 *     ~85% of its read bandwidth (was ~75%), two cores at ~80% of theirs (bench cpu-experts,
 *     decode-8x1: was ~67%), ~88% with the far line.
 *   n tokens: tokens in chunks of TCH, rows in panels of RP. For each 128-column block the
 *     chunk's activations of the block are packed into an L1 buffer (TCH x 128 floats,
 *     masked loads past K) and the panel's rows decoded once into another (RP x 128 floats);
 *     then register tiles of TR rows x TT tokens (20 zmm partials P, TR weight vectors, one
 *     x vector) run over the block's steps, every address a constant offset from two
 *     pointers. The step loop is deliberately not unrolled (unrolled, gcc hoists all eight
 *     steps' weight loads and spills partials). acc of every (row, token) lives in a stack
 *     slot, touched once per block (load, fma with the block scale, store). Rows past the
 *     panel's end are computed with zero weights and dropped.
 *   gate_up: per panel of rows (GU_ROWS at one token), the gate rows and the up rows of the
 *     same indices, then h = silu_c(g) * u on 16 lanes (one multiply).
 * None of this touches the order of one (row, token)'s operations: blocks in increasing
 * order, steps in increasing order within a block, one scale fma per block, the same tree.
 * Panel and chunk (RP = 48 rows, TCH = 40 tokens) were chosen by measurement on the dev VM:
 * 64/256/1024 tokens went from 0.47/0.48/0.49 of the FMA peak (24 x 20) to 0.51-0.54 (side by
 * side; 36 x 40 gave ~0.51, 24 x 60 and 24 x 80 were worse).
 * Stack use: about 165 KB per call (acc 120 KB, weights 24 KB, activations 20 KB); no heap,
 * no copy of W. NOTE: threads that run these kernels need stacks of at least ~256 KB (the
 * executor's pthreads and the main thread have the 8 MB default).
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
	defined(__AVX512DQ__) && defined(__FMA__)

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "expc_avx512.h"
#include "moet_cpu.h"

#define AI static inline __attribute__((always_inline))

enum {
	TR = 4,   /* rows per register tile */
	TT = 5,   /* tokens per register tile */
	TCH = 40, /* tokens per chunk (acc slots and packed activations on the stack) */
	RP = 48,  /* rows per panel (a multiple of TR) */
	GU_ROWS = 64, /* rows per gate/up step at one token */
};
#ifndef PF_FAR
#define PF_FAR 8192 /* one-token stream: prefetch to L2 this far ahead ... */
#endif
#ifndef PF_NEAR
#define PF_NEAR 1536 /* ... and to L1 this far ahead */
#endif
#ifndef PF_HINT
#define PF_HINT 16384 /* ... and one line per call this far ahead (see the NOTE above) */
#endif
_Static_assert(RP % TR == 0, "panel of whole tiles");
_Static_assert(TR * TT + TR + 1 <= 28, "register tile fits the 32 zmm with room");
_Static_assert(TCH % TT == 0, "chunks of whole tiles");

static inline int imin(int64_t a, int64_t b) { return (int)(a < b ? a : b); }

/* Lanes of step t of a block of kb columns that hold a column (k < K). */
AI __mmask16 step_mask(int kb, int t)
{
	int n = kb - 16 * t;
	return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* ---- e4m3 decode ---------------------------------------------------------------------- */
#ifdef __AVX512VBMI__
/* Bytes 3 and 2 of moet_dec_e4m3(c) for c = 0 .. 127 (the two low bytes are always zero). */
static const uint8_t e4m3_b3[128] __attribute__((aligned(64))) = {
	0x00, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c,
	0x3c, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
	0x3d, 0x3d, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e,
	0x3e, 0x3e, 0x3e, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
	0x3f, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
	0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
	0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
	0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43,
	0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x7f,
};
static const uint8_t e4m3_b2[128] __attribute__((aligned(64))) = {
	0x00, 0x00, 0x80, 0xc0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0,
	0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0,
	0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0,
	0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0,
	0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0,
	0xb0, 0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90,
	0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80,
	0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70,
	0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xc0,
};

/* Index of vpermt2b for output dword q*16 + l: byte 2 <- b2[16q + l], byte 3 <- b3[16q + l]. */
AI __m512i place_idx(int q)
{
	const __m512i l = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	const __m512i base = _mm512_set1_epi32(0x40000000 + (16 * q) * 0x01010000);
	return _mm512_add_epi32(_mm512_mullo_epi32(l, _mm512_set1_epi32(0x01010000)), base);
}

/*
 * 64 codes into the four steps' weights with 7 shuffle-port uops (the one-token path; full
 * blocks only): the codes are first arranged (one vpermb, constant index) so that byte
 * 16l + k, k < 8, holds column (k & 1) * 16 + 4l + k / 2 and byte 16l + 8 + k column 32 +
 * the same; the two lookups (b3 with the sign, b2) keep that order; vpunpck{l,h}bw(b2, b3)
 * then make words b3:b2 whose dword 4l + k / 2 holds column 4l + k / 2 (low word) and that
 * column + 16 (high word): the first step is the dwords shifted left 16, the second the
 * dwords and 0xFFFF0000 (p0 and any port), the same bits as dec64_e4m3's w[0 .. 3].
 */
static const uint8_t wt_arrange[64] __attribute__((aligned(64))) = {
	0,  16, 1,  17, 2,  18, 3,  19, 32, 48, 33, 49, 34, 50, 35, 51,
	4,  20, 5,  21, 6,  22, 7,  23, 36, 52, 37, 53, 38, 54, 39, 55,
	8,  24, 9,  25, 10, 26, 11, 27, 40, 56, 41, 57, 42, 58, 43, 59,
	12, 28, 13, 29, 14, 30, 15, 31, 44, 60, 45, 61, 46, 62, 47, 63,
};

AI void dec64_e4m3_wt(const uint8_t *p, __m512 w[4])
{
	const __m512i c = _mm512_permutexvar_epi8(_mm512_load_si512(wt_arrange),
						  _mm512_loadu_si512(p));
	__m512i b3 = _mm512_permutex2var_epi8(_mm512_load_si512(e4m3_b3), c,
					      _mm512_load_si512(e4m3_b3 + 64));
	const __m512i b2 = _mm512_permutex2var_epi8(_mm512_load_si512(e4m3_b2), c,
						    _mm512_load_si512(e4m3_b2 + 64));
	b3 = _mm512_ternarylogic_epi32(b3, c, _mm512_set1_epi8((char)0x80), 0xF8); /* b3|(c&80) */
	const __m512i lo = _mm512_unpacklo_epi8(b2, b3), hi = _mm512_unpackhi_epi8(b2, b3);
	const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
	w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16));
	w[1] = _mm512_castsi512_ps(_mm512_and_si512(lo, top));
	w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
	w[3] = _mm512_castsi512_ps(_mm512_and_si512(hi, top));
}

/* Decodes n (1..64) codes at p into w[0 .. ceil(n/16)-1] (codes past n decode as +0). */
AI void dec64_e4m3(const uint8_t *p, int n, __m512 w[4])
{
	__m512i c = n == 64 ? _mm512_loadu_si512(p)
			    : _mm512_maskz_loadu_epi8(n == 64 ? ~0ull : (1ull << n) - 1ull, p);
	__m512i b3 = _mm512_permutex2var_epi8(_mm512_load_si512(e4m3_b3), c,
					      _mm512_load_si512(e4m3_b3 + 64));
	__m512i b2 = _mm512_permutex2var_epi8(_mm512_load_si512(e4m3_b2), c,
					      _mm512_load_si512(e4m3_b2 + 64));
	b3 = _mm512_ternarylogic_epi32(b3, c, _mm512_set1_epi8((char)0x80), 0xF8); /* b3|(c&80) */
	const __mmask64 hi2 = 0xCCCCCCCCCCCCCCCCull; /* bytes 2 and 3 of every dword */
#pragma GCC unroll 4
	for (int q = 0; q < 4; q++)
		w[q] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(hi2, b2, place_idx(q), b3));
}
#else
/* 16 codes: sign-extend, ((c & 0x7F) << 20 | sign) * 2^120, NaN codes -> 0x7FC00000 | sign. */
AI __m512 dec16_e4m3(__m128i c)
{
	__m512i y = _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(c), 20),
				     _mm512_set1_epi32((int)0x87F00000u));
	__m512 f = _mm512_mul_ps(_mm512_castsi512_ps(y), _mm512_set1_ps(0x1p120f));
	__mmask16 nan = _mm512_cmpeq_epi32_mask(
		_mm512_and_si512(y, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x07F00000));
	__m512i qn = _mm512_ternarylogic_epi32(y, _mm512_set1_epi32((int)0x80000000u),
					       _mm512_set1_epi32(0x7FC00000), 0xEA);
	return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(qn));
}

AI void dec64_e4m3(const uint8_t *p, int n, __m512 w[4])
{
#pragma GCC unroll 4
	for (int q = 0; q < 4; q++) {
		if (16 * q >= n)
			break;
		int nq = n - 16 * q;
		__m128i c = nq >= 16 ? _mm_loadu_si128((const __m128i *)(p + 16 * q))
				     : _mm_maskz_loadu_epi8((__mmask16)((1u << nq) - 1u), p + 16 * q);
		w[q] = dec16_e4m3(c);
	}
}
#endif

/* Decodes columns k0 .. k0+kb-1 (kb = 1..128) of a row into w[0 .. ceil(kb/16)-1]. */
AI void dec_block(moet_dtype dt, const void *row, int64_t k0, int kb, __m512 w[8])
{
#pragma GCC unroll 8
	for (int t = 0; t < 8; t++)
		w[t] = _mm512_setzero_ps(); /* steps past kb: defined, never used */
	if (dt == MOET_DT_F8_E4M3) {
		const uint8_t *p = (const uint8_t *)row + k0;
		dec64_e4m3(p, kb < 64 ? kb : 64, w);
		if (kb > 64)
			dec64_e4m3(p + 64, kb - 64, w + 4);
	} else if (dt == MOET_DT_BF16) {
		const uint16_t *p = (const uint16_t *)row + k0;
#pragma GCC unroll 8
		for (int t = 0; t < 8; t++) {
			if (16 * t >= kb)
				break;
			__m256i b = _mm256_maskz_loadu_epi16(step_mask(kb, t), p + 16 * t);
			w[t] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
		}
	} else {
		const float *p = (const float *)row + k0;
#pragma GCC unroll 8
		for (int t = 0; t < 8; t++)
			if (16 * t < kb)
				w[t] = _mm512_maskz_loadu_ps(step_mask(kb, t), p + 16 * t);
	}
}

/* The halving tree: (l, l+8), (l, l+4), (l, l+2), lane 0 + lane 1. */
AI float tree16(__m512 acc)
{
	__m256 q = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
	__m128 u = _mm_add_ps(s, _mm_movehl_ps(s, s));
	return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

static size_t elem_bytes(moet_dtype dt)
{
	return dt == MOET_DT_F8_E4M3 ? 1 : dt == MOET_DT_BF16 ? 2 : 4;
}

/* ---- one token ------------------------------------------------------------------------ */

/* One block of one row decoded for the one-token stream: the one-token decode of full FP8
 * blocks (dec64_e4m3_wt), dec_block otherwise.
 * NOTE (what was tried): a few-token path that streamed each row once for 2..8 tokens through
 * this decode, partials in registers (0b3182a), was slower than the panels below on both
 * machines: on the H200 host (bench cpu-experts, 16 threads, 2026-11-30) 0.718 / 0.891 /
 * 1.067 ms at 2 / 3 / 4 tokens against 0.685 / 0.800 / 0.873 (one x load per FMA costs more
 * than the panels' decode buffer); removed. */
AI void dec_block1(moet_dtype dt, const void *row, int64_t k0, int kb, __m512 w[8])
{
#ifdef __AVX512VBMI__
	if (dt == MOET_DT_F8_E4M3 && kb == MOET_BLOCK) {
		dec64_e4m3_wt((const uint8_t *)row + k0, w);
		dec64_e4m3_wt((const uint8_t *)row + k0 + 64, w + 4);
		return;
	}
#endif
	dec_block(dt, row, k0, kb, w);
}

/* The partial sums P of one block of one row (kb columns from k0) with v: 16 lanes. */
AI __m512 block1(moet_dtype dt, const void *row, int64_t k0, int kb, const float *v)
{
	__m512 w[8], p = _mm512_setzero_ps();
	dec_block1(dt, row, k0, kb, w);
#pragma GCC unroll 8
	for (int t = 0; t < 8; t++) {
		if (16 * t >= kb)
			break;
		const __mmask16 mk = step_mask(kb, t);
		__m512 x = _mm512_maskz_loadu_ps(mk, v + k0 + 16 * t);
		p = _mm512_mask3_fmadd_ps(w[t], x, p, mk);
	}
	return p;
}

/* The partial sums of two consecutive full blocks (k0, k0 + 128) of one row, their fma
 * chains interleaved (two independent chains in flight). */
AI void block2(moet_dtype dt, const void *row, int64_t k0, const float *v, __m512 *p0,
	       __m512 *p1)
{
	__m512 w0[8], w1[8], a = _mm512_setzero_ps(), c = _mm512_setzero_ps();
#ifdef __AVX512VBMI__
	if (dt == MOET_DT_F8_E4M3) {
		const uint8_t *p = (const uint8_t *)row + k0;
		dec64_e4m3_wt(p, w0);
		dec64_e4m3_wt(p + 64, w0 + 4);
		dec64_e4m3_wt(p + 128, w1);
		dec64_e4m3_wt(p + 192, w1 + 4);
	} else
#endif
	{
		dec_block(dt, row, k0, MOET_BLOCK, w0);
		dec_block(dt, row, k0 + MOET_BLOCK, MOET_BLOCK, w1);
	}
#pragma GCC unroll 8
	for (int t = 0; t < 8; t++) {
		a = _mm512_fmadd_ps(w0[t], _mm512_loadu_ps(v + k0 + 16 * t), a);
		c = _mm512_fmadd_ps(w1[t], _mm512_loadu_ps(v + k0 + MOET_BLOCK + 16 * t), c);
	}
	*p0 = a;
	*p1 = c;
}

/* Software prefetch of the n bytes PF_FAR ahead of p into L2 and of those PF_NEAR ahead into
 * L1, and of the one line PF_HINT ahead (rows are contiguous, so past a row's end this fetches
 * the next row's start; past a matrix's end, bytes that a prefetch never faults on). */
AI void prefetch_ahead(const char *p, size_t n)
{
#pragma GCC unroll 16
	for (size_t o = 0; o < n; o += 64) {
		_mm_prefetch(p + PF_FAR + o, _MM_HINT_T1);
		_mm_prefetch(p + PF_NEAR + o, _MM_HINT_T0);
	}
	_mm_prefetch(p + PF_HINT, _MM_HINT_T2);
}

/* One row's D(W, r, v), streamed block by block from the row's bytes. */
AI float dot1(const moet_mat *m, moet_dtype dt, int64_t r, const float *v)
{
	const int64_t K = m->cols, n_blk = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const int64_t n_full = K / MOET_BLOCK;
	const int tail = (int)(K - n_full * MOET_BLOCK);
	const size_t esz = elem_bytes(dt);
	const uint8_t *row = (const uint8_t *)m->data + (size_t)r * (size_t)K * esz;
	const float *srow = m->scale_inv ? m->scale_inv + (r / MOET_BLOCK) * n_blk : NULL;
	__m512 acc = _mm512_setzero_ps();
	int64_t b = 0;
	for (; b + 1 < n_full; b += 2) {
		prefetch_ahead((const char *)row + (size_t)b * MOET_BLOCK * esz,
			       2 * MOET_BLOCK * esz);
		__m512 p0, p1;
		block2(dt, row, b * MOET_BLOCK, v, &p0, &p1);
		acc = _mm512_fmadd_ps(p0, _mm512_set1_ps(srow ? srow[b] : 1.0f), acc);
		acc = _mm512_fmadd_ps(p1, _mm512_set1_ps(srow ? srow[b + 1] : 1.0f), acc);
	}
	for (; b < n_full; b++) {
		prefetch_ahead((const char *)row + (size_t)b * MOET_BLOCK * esz, MOET_BLOCK * esz);
		__m512 p = block1(dt, row, b * MOET_BLOCK, MOET_BLOCK, v);
		acc = _mm512_fmadd_ps(p, _mm512_set1_ps(srow ? srow[b] : 1.0f), acc);
	}
	if (tail) {
		__m512 p = block1(dt, row, n_full * MOET_BLOCK, tail, v);
		acc = _mm512_fmadd_ps(p, _mm512_set1_ps(srow ? srow[n_full] : 1.0f), acc);
	}
	return tree16(acc);
}

/* y[r - r0] = D(W, r, v) for r0 <= r < r1, W's dtype dt. */
AI void rows1_dt(const moet_mat *m, moet_dtype dt, int64_t r0, int64_t r1, const float *v,
		 float *y)
{
	for (int64_t r = r0; r < r1; r++)
		y[r - r0] = dot1(m, dt, r, v);
}

static void rows1_f8(const moet_mat *m, int64_t r0, int64_t r1, const float *v, float *y)
{
	rows1_dt(m, MOET_DT_F8_E4M3, r0, r1, v, y);
}
static void rows1_bf16(const moet_mat *m, int64_t r0, int64_t r1, const float *v, float *y)
{
	rows1_dt(m, MOET_DT_BF16, r0, r1, v, y);
}
static void rows1_f32(const moet_mat *m, int64_t r0, int64_t r1, const float *v, float *y)
{
	rows1_dt(m, MOET_DT_F32, r0, r1, v, y);
}
static void rows1(const moet_mat *m, int64_t r0, int64_t r1, const float *v, float *y)
{
	if (m->dtype == MOET_DT_F8_E4M3)
		rows1_f8(m, r0, r1, v, y);
	else if (m->dtype == MOET_DT_BF16)
		rows1_bf16(m, r0, r1, v, y);
	else
		rows1_f32(m, r0, r1, v, y);
}

/* ---- many tokens ---------------------------------------------------------------------- */

/*
 * One register tile, one block: TR rows (decoded weights w[TR][128]) x T tokens (the block's
 * activations packed at xp + j * 128), P = the block's partials, then acc = fma(P, s_row,
 * acc) in the acc slots (row i, token j at acc + (i * TCH + j) * 16). Steps past kb are not
 * executed; the lanes past kb of the last step keep P (masked fma), as in the reference.
 */
AI void tile(const int T, const float *w, const float *xp, int kb, float *acc, const float *s)
{
	__m512 P[TR][TT];
#pragma GCC unroll 8
	for (int i = 0; i < TR; i++)
#pragma GCC unroll 8
		for (int j = 0; j < T; j++)
			P[i][j] = _mm512_setzero_ps();
	/* NOTE: not unrolled over t, so that the compiler keeps one step's weights in registers
	 * (unrolled, it hoists all 8 steps' weight loads and spills the partials). */
#pragma GCC unroll 1
	for (int t = 0; t < 8; t++) {
		if (16 * t >= kb)
			break;
		const __mmask16 mk = step_mask(kb, t);
		__m512 wv[TR];
#pragma GCC unroll 8
		for (int i = 0; i < TR; i++)
			wv[i] = _mm512_load_ps(w + i * MOET_BLOCK + 16 * t);
#pragma GCC unroll 8
		for (int j = 0; j < T; j++) {
			const __m512 v = _mm512_load_ps(xp + j * MOET_BLOCK + 16 * t);
#pragma GCC unroll 8
			for (int i = 0; i < TR; i++)
				P[i][j] = kb == MOET_BLOCK ? _mm512_fmadd_ps(wv[i], v, P[i][j])
							   : _mm512_mask3_fmadd_ps(wv[i], v, P[i][j], mk);
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < TR; i++) {
		const __m512 si = _mm512_set1_ps(s[i]);
#pragma GCC unroll 8
		for (int j = 0; j < T; j++) {
			float *a = acc + (i * TCH + j) * 16;
			_mm512_store_ps(a, _mm512_fmadd_ps(P[i][j], si, _mm512_load_ps(a)));
		}
	}
}

/* NOTE: T is clamped so that every case compiles for any TT; only T <= TT is ever asked. */
#define TILE_CASE(N, KB)                                                                   \
	case N:                                                                            \
		tile((N) < TT ? (N) : TT, w, xp, KB, acc, s);                              \
		break
#define TILE_CASES(KB)                                                                     \
	switch (T) {                                                                       \
		TILE_CASE(1, KB);                                                          \
		TILE_CASE(2, KB);                                                          \
		TILE_CASE(3, KB);                                                          \
		TILE_CASE(4, KB);                                                          \
		TILE_CASE(5, KB);                                                          \
		TILE_CASE(6, KB);                                                          \
		TILE_CASE(7, KB);                                                          \
		TILE_CASE(8, KB);                                                          \
		TILE_CASE(9, KB);                                                          \
		TILE_CASE(10, KB);                                                         \
		TILE_CASE(11, KB);                                                         \
	default:                                                                           \
		tile(TT, w, xp, KB, acc, s);                                               \
		break;                                                                     \
	}

/* tile() for T tokens (1..TT), compiled for each T, and for full blocks with no masks. */
static void tile_n(int T, const float *w, const float *xp, int kb, float *acc, const float *s)
{
	if (kb == MOET_BLOCK)
		TILE_CASES(MOET_BLOCK)
	else
		TILE_CASES(kb)
}

/* xp[j * 128 + c] = x[j * xs + c] for c < kb, j < nt (masked loads past kb). */
AI void pack_x(const float *x, int64_t xs, int nt, int kb, float *xp)
{
	for (int j = 0; j < nt; j++)
#pragma GCC unroll 8
		for (int t = 0; t < 8; t++)
			if (16 * t < kb)
				_mm512_store_ps(xp + j * MOET_BLOCK + 16 * t,
						_mm512_maskz_loadu_ps(step_mask(kb, t),
								      x + j * xs + 16 * t));
}

/*
 * y[j * ys + i] = D(W, r0 + i, x_j) for i < nr (<= RP), j < nt (<= TCH).
 * Per block: the block's activations of the nt tokens are packed (masked loads: nothing is
 * read past a row), the nr rows decoded, then every (row group, token group) tile runs.
 */
static void rows_panel(const moet_mat *m, int64_t r0, int nr, const float *x, int64_t xs,
		       int nt, float *y, int64_t ys)
{
	float acc[RP * TCH * 16] __attribute__((aligned(64)));
	float wbuf[RP * MOET_BLOCK] __attribute__((aligned(64)));
	float xp[TCH * MOET_BLOCK] __attribute__((aligned(64)));
	float s[RP];
	const int64_t K = m->cols, n_blk = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const size_t esz = elem_bytes(m->dtype);
	const int ng = (nr + TR - 1) / TR;
	for (int i = 0; i < ng * TR; i++) {
		memset(acc + i * TCH * 16, 0, (size_t)nt * 16 * sizeof(float));
		s[i] = 1.0f;
		if (i >= nr)
			memset(wbuf + i * MOET_BLOCK, 0, MOET_BLOCK * sizeof(float));
	}
	for (int64_t b = 0; b < n_blk; b++) {
		const int64_t k0 = b * MOET_BLOCK;
		const int kb = imin(MOET_BLOCK, K - k0);
		if (kb == MOET_BLOCK)
			pack_x(x + k0, xs, nt, MOET_BLOCK, xp);
		else
			pack_x(x + k0, xs, nt, kb, xp);
		for (int i = 0; i < nr; i++) {
			const int64_t r = r0 + i;
			const void *row = (const uint8_t *)m->data + (size_t)r * (size_t)K * esz;
			__m512 w[8];
			/* the next block of this row: two lines ahead for FP8, more for wider types */
			_mm_prefetch((const char *)row + (size_t)(k0 + MOET_BLOCK) * esz, _MM_HINT_T0);
			_mm_prefetch((const char *)row + (size_t)(k0 + MOET_BLOCK) * esz + 64,
				     _MM_HINT_T0);
			dec_block(m->dtype, row, k0, kb, w);
#pragma GCC unroll 8
			for (int t = 0; t < 8; t++)
				if (16 * t < kb)
					_mm512_store_ps(wbuf + i * MOET_BLOCK + 16 * t, w[t]);
			if (m->scale_inv)
				s[i] = m->scale_inv[(r / MOET_BLOCK) * n_blk + b];
		}
		for (int g = 0; g < ng; g++)
			for (int j0 = 0; j0 < nt; j0 += TT)
				tile_n(imin(TT, nt - j0), wbuf + g * TR * MOET_BLOCK,
				       xp + j0 * MOET_BLOCK, kb, acc + (g * TR * TCH + j0) * 16,
				       s + g * TR);
	}
	for (int i = 0; i < nr; i++)
		for (int j = 0; j < nt; j++)
			y[j * ys + i] = tree16(_mm512_load_ps(acc + (i * TCH + j) * 16));
}

/* ---- the table's functions ------------------------------------------------------------ */

static void rows_avx512(const moet_mat *w, int64_t r0, int64_t r1, const float *x,
			int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride)
{
	if (n_tok == 1) {
		rows1(w, r0, r1, x, y);
		return;
	}
	for (int64_t j0 = 0; j0 < n_tok; j0 += TCH)
		for (int64_t i0 = r0; i0 < r1; i0 += RP)
			rows_panel(w, i0, imin(RP, r1 - i0), x + j0 * x_stride, x_stride,
				   imin(TCH, n_tok - j0), y + j0 * y_stride + (i0 - r0), y_stride);
}

/* h[i] = silu_c(g[i]) * u[i] for i < n, 16 lanes at a time. */
static void silu_mul(const float *g, const float *u, float *h, int n)
{
	for (int i = 0; i < n; i += 16) {
		__mmask16 mk = step_mask(n - i, 0);
		__m512 gv = _mm512_maskz_loadu_ps(mk, g + i), uv = _mm512_maskz_loadu_ps(mk, u + i);
		_mm512_mask_storeu_ps(h + i, mk, _mm512_mul_ps(moet_silu_c_avx512(gv), uv));
	}
}

static void gate_up_avx512(const moet_mat *gate, const moet_mat *up, int64_t r0, int64_t r1,
			   const float *x, int64_t x_stride, int64_t n_tok, float *h,
			   int64_t h_stride)
{
	if (n_tok == 1) {
		float g[GU_ROWS], u[GU_ROWS];
		for (int64_t i0 = r0; i0 < r1; i0 += GU_ROWS) {
			const int n = imin(GU_ROWS, r1 - i0);
			rows1(gate, i0, i0 + n, x, g);
			rows1(up, i0, i0 + n, x, u);
			silu_mul(g, u, h + (i0 - r0), n);
		}
		return;
	}
	float g[TCH * RP], u[TCH * RP];
	for (int64_t j0 = 0; j0 < n_tok; j0 += TCH) {
		const int nt = imin(TCH, n_tok - j0);
		for (int64_t i0 = r0; i0 < r1; i0 += RP) {
			const int nr = imin(RP, r1 - i0);
			rows_panel(gate, i0, nr, x + j0 * x_stride, x_stride, nt, g, RP);
			rows_panel(up, i0, nr, x + j0 * x_stride, x_stride, nt, u, RP);
			for (int j = 0; j < nt; j++)
				silu_mul(g + j * RP, u + j * RP, h + (j0 + j) * h_stride + (i0 - r0),
					 nr);
		}
	}
}

static void exp_c_avx512(const float *in, float *out, int64_t n)
{
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 mk = step_mask(imin(16, n - i), 0);
		_mm512_mask_storeu_ps(out + i, mk,
				      moet_exp_c_avx512(_mm512_maskz_loadu_ps(mk, in + i)));
	}
}

static void silu_c_avx512(const float *in, float *out, int64_t n)
{
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 mk = step_mask(imin(16, n - i), 0);
		_mm512_mask_storeu_ps(out + i, mk,
				      moet_silu_c_avx512(_mm512_maskz_loadu_ps(mk, in + i)));
	}
}

const moet_cpu_kernels moet_cpu_kernels_avx512 = {
	.isa = "avx512",
	.rows = rows_avx512,
	.gate_up = gate_up_avx512,
	.exp_c = exp_c_avx512,
	.silu_c = silu_c_avx512,
};

/*
 * Whether this CPU and OS run the kernels above: AVX-512 F/BW/VL/DQ and FMA (and VBMI when
 * the build uses the VBMI decode), and the OS saves opmask and zmm state (XCR0 bits 1, 2,
 * 5, 6, 7). Called once by the kernel table.
 */
int moet_cpu_avx512_supported(void);
int moet_cpu_avx512_supported(void)
{
	unsigned a, b, c, d;
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
	    !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq") ||
	    !__builtin_cpu_supports("fma"))
		return 0;
#ifdef __AVX512VBMI__
	if (!__builtin_cpu_supports("avx512vbmi"))
		return 0;
#endif
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
		return 0;
	uint32_t lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	(void)hi;
	return (lo & 0xE6u) == 0xE6u;
}

#else
/* Built without the AVX-512 flags (CMakeLists.txt): the table has no avx512 entry. */
typedef int moet_expert_avx512_not_built;
#endif
