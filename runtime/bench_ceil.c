/*
 * bench_ceil.c: the host ceilings of moet_bench.h: a streaming read and an FMA peak.
 *
 * NOTE: the AVX-512 (and AVX2) bodies are compiled per function with
 * __attribute__((target(...))) rather than by giving the whole file -mavx512f through
 * set_source_files_properties: only these two functions may contain AVX-512 instructions,
 * and the rest of the file (the dispatch, the scalar fallbacks) runs on any x86-64. The
 * choice is made at run time with __builtin_cpu_supports.
 *
 * Read: 64-byte aligned loads into 8 independent XOR accumulators (integer ops: one cycle,
 * never the bottleneck), so the loop is bound by the load ports and memory.
 * FMA: 16 independent chains acc = fma(acc, m, c), m = 1 - 2^-20, c = 2^-20: each chain
 * converges to 1 (no overflow, no subnormals, so no microcode assists); 16 chains cover
 * 2 FMA ports x 4 cycles latency with room to spare.
 */
#include <math.h>
#include <string.h>

#include "moet_cpuexec.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "moet_bench.h"

#define CHAINS 16

/* 16 named accumulators (not an array: the chains must stay in registers at any -O). */
#define FMA16(OP, a, m, c)                                                                  \
	do {                                                                               \
		a##0 = OP(a##0, m, c), a##1 = OP(a##1, m, c), a##2 = OP(a##2, m, c);       \
		a##3 = OP(a##3, m, c), a##4 = OP(a##4, m, c), a##5 = OP(a##5, m, c);       \
		a##6 = OP(a##6, m, c), a##7 = OP(a##7, m, c), a##8 = OP(a##8, m, c);       \
		a##9 = OP(a##9, m, c), a##10 = OP(a##10, m, c), a##11 = OP(a##11, m, c);   \
		a##12 = OP(a##12, m, c), a##13 = OP(a##13, m, c), a##14 = OP(a##14, m, c); \
		a##15 = OP(a##15, m, c);                                                   \
	} while (0)
#define SUM16(ADD, a)                                                                     \
	ADD(ADD(ADD(ADD(a##0, a##1), ADD(a##2, a##3)), ADD(ADD(a##4, a##5), ADD(a##6, a##7))), \
	    ADD(ADD(ADD(a##8, a##9), ADD(a##10, a##11)), ADD(ADD(a##12, a##13), ADD(a##14, a##15))))
#define DECL16(T, a, init)                                                                \
	T a##0 = init(0), a##1 = init(1), a##2 = init(2), a##3 = init(3), a##4 = init(4),   \
	  a##5 = init(5), a##6 = init(6), a##7 = init(7), a##8 = init(8), a##9 = init(9),   \
	  a##10 = init(10), a##11 = init(11), a##12 = init(12), a##13 = init(13),           \
	  a##14 = init(14), a##15 = init(15)

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read_avx512(const void *buf, size_t bytes)
{
	const __m512i *p = buf;
	const size_t n = bytes / 64;
	__m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
		a6 = a0, a7 = a0;
	size_t i = 0;
	/* NOTE: the same software prefetch as the one-token expert kernel (8 KB ahead into L2,
	 * 1.5 KB into L1, one line in four 16 KB ahead): a ceiling must be at least as good at
	 * streaming as the code it rates, or the ratio flatters the code (without it, decode
	 * read more than this ceiling). The 16 KB line changes nothing here (measured on the
	 * dev VM: 32.4 GB/s with and without, 2 cores), so the ceiling is the same as before. */
	for (; i + 8 <= n; i += 8) {
		const char *pf = (const char *)(p + i);
		for (int o = 0; o < 512; o += 64) {
			_mm_prefetch(pf + 8192 + o, _MM_HINT_T1);
			_mm_prefetch(pf + 1536 + o, _MM_HINT_T0);
		}
		_mm_prefetch(pf + 16384, _MM_HINT_T2); /* the kernel's one line per 256 bytes */
		_mm_prefetch(pf + 16384 + 256, _MM_HINT_T2);
		a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
		a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 1));
		a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 2));
		a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 3));
		a4 = _mm512_xor_si512(a4, _mm512_load_si512(p + i + 4));
		a5 = _mm512_xor_si512(a5, _mm512_load_si512(p + i + 5));
		a6 = _mm512_xor_si512(a6, _mm512_load_si512(p + i + 6));
		a7 = _mm512_xor_si512(a7, _mm512_load_si512(p + i + 7));
	}
	for (; i < n; i++)
		a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
	a0 = _mm512_xor_si512(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)),
			      _mm512_xor_si512(_mm512_xor_si512(a4, a5), _mm512_xor_si512(a6, a7)));
	/* NOTE: folded by xor in unsigned lanes, as read_scalar does: _mm512_reduce_add_epi64
	 * adds signed long longs, which overflow (undefined; UBSan stops the program) on real
	 * data such as a checkpoint's bytes (test_bench_read_signed_overflow). */
	uint64_t lane[8], r = 0;
	_mm512_storeu_si512(lane, a0);
	for (int k = 0; k < 8; k++)
		r ^= lane[k];
	return r;
}

#define INIT512(j) _mm512_set1_ps(0.5f + 0.01f * (float)(j))
__attribute__((target("avx512f"))) static double fma_avx512(int64_t iters)
{
	const __m512 m = _mm512_set1_ps(1.0f - 0x1p-20f), c = _mm512_set1_ps(0x1p-20f);
	DECL16(__m512, a, INIT512);
	for (int64_t k = 0; k < iters; k++)
		FMA16(_mm512_fmadd_ps, a, m, c);
	volatile float sink = _mm512_reduce_add_ps(SUM16(_mm512_add_ps, a));
	(void)sink;
	return 2.0 * 16 * CHAINS * (double)iters;
}

#define INIT256(j) _mm256_set1_ps(0.5f + 0.01f * (float)(j))
__attribute__((target("avx2,fma"))) static double fma_avx2(int64_t iters)
{
	const __m256 m = _mm256_set1_ps(1.0f - 0x1p-20f), c = _mm256_set1_ps(0x1p-20f);
	DECL16(__m256, a, INIT256);
	for (int64_t k = 0; k < iters; k++)
		FMA16(_mm256_fmadd_ps, a, m, c);
	float out[8];
	_mm256_storeu_ps(out, SUM16(_mm256_add_ps, a));
	volatile float sink = out[0];
	(void)sink;
	return 2.0 * 8 * CHAINS * (double)iters;
}
#endif

static uint64_t read_scalar(const void *buf, size_t bytes)
{
	const uint64_t *p = buf;
	uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
	for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
		a0 ^= p[i];
		a1 ^= p[i + 1];
		a2 ^= p[i + 2];
		a3 ^= p[i + 3];
	}
	return a0 ^ a1 ^ a2 ^ a3;
}

#define INITF(j) (0.5f + 0.01f * (float)(j))
#define ADDF(x, y) ((x) + (y))
static double fma_scalar(int64_t iters)
{
	const float m = 1.0f - 0x1p-20f, c = 0x1p-20f;
	DECL16(float, a, INITF);
	for (int64_t k = 0; k < iters; k++)
		FMA16(fmaf, a, m, c);
	volatile float sink = SUM16(ADDF, a);
	(void)sink;
	return 2.0 * CHAINS * (double)iters;
}

const char *moet_bench_ceil_isa(void)
{
#if defined(__x86_64__)
	if (__builtin_cpu_supports("avx512f"))
		return "avx512";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "avx2";
#endif
	return "scalar";
}

uint64_t moet_bench_read(const void *buf, size_t bytes)
{
#if defined(__x86_64__)
	if (__builtin_cpu_supports("avx512f"))
		return read_avx512(buf, bytes);
#endif
	return read_scalar(buf, bytes);
}

double moet_bench_fma(int64_t iters)
{
	const char *isa = moet_bench_ceil_isa();
#if defined(__x86_64__)
	if (!strcmp(isa, "avx512"))
		return fma_avx512(iters);
	if (!strcmp(isa, "avx2"))
		return fma_avx2(iters);
#endif
	return fma_scalar(iters);
}

/* ---- reads by a thread team ------------------------------------------------------------- */

void moet_bench_share(size_t n, int w, int nw, size_t *lo, size_t *hi)
{
	size_t pages = n / 4096;
	*lo = pages * (size_t)w / (size_t)nw * 4096;
	*hi = (w == nw - 1) ? n : pages * (size_t)(w + 1) / (size_t)nw * 4096;
}

typedef struct par_buf {
	uint8_t *buf;
	size_t bytes;
	uint64_t sink[256];
} par_buf;

static volatile uint64_t par_sink; /* keeps the reads' results alive */

static void par_touch(void *arg, int w, int nw)
{
	par_buf *p = arg;
	size_t lo, hi;
	moet_bench_share(p->bytes, w, nw, &lo, &hi);
	memset(p->buf + lo, w + 1, hi - lo);
}

static void par_read(void *arg, int w, int nw)
{
	par_buf *p = arg;
	size_t lo, hi;
	moet_bench_share(p->bytes, w, nw, &lo, &hi);
	p->sink[w % 256] += moet_bench_read(p->buf + lo, (hi - lo) & ~(size_t)63);
}

int moet_bench_touch_par(struct moet_cpuexec *ex, uint8_t *buf, size_t bytes)
{
	par_buf p = { .buf = buf, .bytes = bytes };
	return moet_cpuexec_run(ex, par_touch, &p);
}

int moet_bench_read_par(struct moet_cpuexec *ex, const uint8_t *buf, size_t bytes)
{
	/* NOTE: par_read only reads through buf; the cast keeps one worker argument type */
	par_buf p = { .buf = (uint8_t *)(uintptr_t)buf, .bytes = bytes };
	int rc = moet_cpuexec_run(ex, par_read, &p);
	uint64_t s = 0;
	for (int i = 0; i < 256; i++)
		s ^= p.sink[i];
	par_sink = s;
	return rc;
}
