/*
 * gpu_check.h: the GPU test programs' shared helpers (tests/gpu/test_gpu_dense.c,
 * test_gpu_latent.c): a reproducible random stream, device buffers whose failures are
 * counted as checks, bit comparisons that print the first mismatch, weight fills.
 * Included by the test programs only; every function static inline.
 */
#ifndef MOET_TESTS_GPU_CHECK_H
#define MOET_TESTS_GPU_CHECK_H

#include <stdint.h>
#include <string.h>

#include "moet_dtype.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_test.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static inline uint64_t rnd(void)
{
	return moet_test_xorshift64(&rng_state);
}
static inline float rnd_unit(void) /* [-1, 1) */
{
	return (float)((double)(rnd() >> 11) * 0x1p-52 - 1.0);
}

/* ---- device helpers: every failure is counted and printed ------------------------------- */

static inline int dev_fail(int rc, const char *what)
{
	if (rc)
		CHECK(0, "%s: %s", what, moet_errmsg());
	return rc;
}

static inline void *up(const void *h, size_t bytes)
{
	void *d = NULL;
	if (dev_fail(moet_gpu_alloc(bytes ? bytes : 4, &d), "alloc"))
		return NULL;
	if (h && dev_fail(moet_gpu_copy_h2d(d, h, bytes), "h2d")) {
		moet_gpu_free(d);
		return NULL;
	}
	return d;
}

static inline int down(void *h, const void *d, size_t bytes)
{
	int rc = dev_fail(moet_gpu_sync(NULL), "sync");
	return rc ? rc : dev_fail(moet_gpu_copy_d2h(h, d, bytes), "d2h");
}

static inline int nan_f(float f)
{
	return f != f;
}

/* Bit-equal, any NaN equal to any NaN when nan_any. Prints the first mismatch. */
static inline int same_bits(const char *what, const float *g, const float *c, size_t n, int nan_any)
{
	for (size_t i = 0; i < n; i++) {
		if (nan_any && nan_f(g[i]) && nan_f(c[i]))
			continue;
		if (memcmp(&g[i], &c[i], 4)) {
			CHECK(0, "%s: element %zu: gpu %08x (%g), cpu %08x (%g)", what, i,
			      moet_f32_bits(g[i]), (double)g[i], moet_f32_bits(c[i]), (double)c[i]);
			return 0;
		}
	}
	return 1;
}

/* Fills n weight elements quickly (large matrices): e4m3 codes without NaN, bf16 of [-2, 2),
 * f32 of [-2, 2); edge != 0 mixes in zeros of both signs and subnormals. */
static inline void fill_weights(moet_dtype dt, void *p, size_t n, int edge)
{
	for (size_t i = 0; i < n; i += 4) {
		uint64_t r = rnd();
		for (size_t k = i; k < i + 4 && k < n; k++, r >>= 16) {
			uint16_t b = (uint16_t)r;
			if (edge && (b & 7) == 0)
				b = (b & 0x8000) | ((b >> 3) & 3); /* +-0, tiny subnormal */
			if (dt == MOET_DT_F8_E4M3) {
				uint8_t c = (uint8_t)b;
				((uint8_t *)p)[k] = (c & 0x7F) == 0x7F ? (uint8_t)(c ^ 1) : c;
			} else if (dt == MOET_DT_BF16) { /* sign, 2^-7 .. 2^0, any mantissa */
				uint16_t v = (uint16_t)((b & 0x807F) | ((120 + ((b >> 7) & 7)) << 7));
				((uint16_t *)p)[k] = edge && (b & 7) == 0 ? b : v;
			} else {
				((float *)p)[k] = edge && (b & 7) == 0 ? moet_bits_f32(b & 0x8003)
								       : rnd_unit() * 2.0f;
			}
		}
	}
}

#endif
