/*
 * test_attend_avx512.c: moet_attend_avx512 (cpu/attend_avx512.c) against moet_attend_ref, bit
 * for bit, and MOET_CPU_ATTN.
 *
 *   shapes   d_qk in {1, 7, 48, 192, 256} x d_v in {1, 7, 32, 100, 128, 129, 256} x positions
 *            in {1, 2, 7, 8, 31, 32, 33, 63, 64, 65, 300, 1025}: every score-vector and
 *            output-vector tail; contiguous caches and paged ones (a shuffled block table,
 *            16 positions a block), row strides wider than the head
 *   values   benign (unit-scale q and cache) and extreme (huge scores that make most weights
 *            underflow to 0, subnormal and signed-zero cache values, a NaN in q: then every
 *            output is NaN in both, compared as equal)
 *   switch   MOET_CPU_ATTN: unset and avx512 choose moet_attend_avx512 where the CPU has
 *            AVX-512, ref moet_attend_ref; a bad value is refused by name
 * Skips (77) without AVX-512.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moet_cpu.h"
#include "moet_err.h"
#include "moet_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float unit(void)
{
	return (float)((double)(moet_test_xorshift64(&rng) >> 11) / 9007199254740992.0) * 2.0f -
	       1.0f;
}

/* 1 if a and b hold the same bits (any NaN equal to any NaN). */
static int same(const float *a, const float *b, int64_t n, int64_t *at)
{
	for (int64_t i = 0; i < n; i++) {
		if (isnan(a[i]) && isnan(b[i]))
			continue;
		if (memcmp(&a[i], &b[i], sizeof(float))) {
			*at = i;
			return 0;
		}
	}
	return 1;
}

static void one_case(int64_t d_qk, int64_t d_v, int64_t n_pos, int paged, int extreme)
{
	const int shift = 4;
	const int64_t n_blk = (n_pos + 15) >> shift, rows = n_blk << shift;
	const int64_t k_stride = d_qk + 3, v_stride = d_v + 5; /* wider than the head */
	float *k = malloc((size_t)(rows * k_stride) * sizeof(float));
	float *v = malloc((size_t)(rows * v_stride) * sizeof(float));
	float *q = malloc((size_t)d_qk * sizeof(float));
	float *s1 = malloc((size_t)n_pos * sizeof(float)), *s2 = malloc((size_t)n_pos * sizeof(float));
	float *o1 = malloc((size_t)d_v * sizeof(float)), *o2 = malloc((size_t)d_v * sizeof(float));
	int32_t *blocks = malloc((size_t)n_blk * sizeof(int32_t));
	if (!k || !v || !q || !s1 || !s2 || !o1 || !o2 || !blocks) {
		CHECK(0, "host memory");
		goto out;
	}
	for (int64_t i = 0; i < rows * k_stride; i++)
		k[i] = unit();
	for (int64_t i = 0; i < rows * v_stride; i++)
		v[i] = unit();
	for (int64_t i = 0; i < d_qk; i++)
		q[i] = unit() * (extreme ? 40.0f : 1.0f);
	if (extreme) {
		for (int64_t i = 0; i < rows * v_stride; i += 7)
			v[i] = i % 2 ? 1e-40f : -0.0f;
		if (n_pos % 3 == 0)
			q[d_qk / 2] = NAN;
	}
	for (int64_t b = 0; b < n_blk; b++)
		blocks[b] = (int32_t)b;
	for (int64_t b = n_blk - 1; b > 0; b--) { /* shuffled */
		const int64_t j = (int64_t)(moet_test_xorshift64(&rng) % (uint64_t)(b + 1));
		const int32_t t = blocks[b];
		blocks[b] = blocks[j];
		blocks[j] = t;
	}
	const int32_t *bt = paged ? blocks : NULL;
	const float scale = 0.0721f;
	memset(o1, 0xAB, (size_t)d_v * sizeof(float));
	memset(o2, 0xCD, (size_t)d_v * sizeof(float));
	moet_attend_ref(q, k, k_stride, v, v_stride, bt, shift, n_pos, d_qk, d_v, scale, s1, o1);
	moet_attend_avx512(q, k, k_stride, v, v_stride, bt, shift, n_pos, d_qk, d_v, scale, s2, o2);
	int64_t at = 0;
	CHECK(same(o1, o2, d_v, &at), "d_qk %lld d_v %lld positions %lld %s %s: out[%lld] %08x, "
	      "reference %08x", (long long)d_qk, (long long)d_v, (long long)n_pos,
	      paged ? "paged" : "contiguous", extreme ? "extreme" : "benign", (long long)at,
	      *(uint32_t *)&o2[at], *(uint32_t *)&o1[at]);
out:
	free(k);
	free(v);
	free(q);
	free(s1);
	free(s2);
	free(o1);
	free(o2);
	free(blocks);
}

int main(void)
{
	if (!moet_cpu_kernels_named("avx512")) {
		printf("test_attend_avx512: SKIP (no AVX-512 variant on this machine)\n");
		return MOET_TEST_SKIP;
	}
	static const int64_t dq[] = { 1, 7, 48, 192, 256 };
	static const int64_t dv[] = { 1, 7, 32, 100, 128, 129, 256 };
	static const int64_t np[] = { 1, 2, 7, 8, 31, 32, 33, 63, 64, 65, 300, 1025 };
	int cases = 0;
	for (size_t a = 0; a < sizeof(dq) / sizeof(dq[0]); a++)
		for (size_t b = 0; b < sizeof(dv) / sizeof(dv[0]); b++)
			for (size_t c = 0; c < sizeof(np) / sizeof(np[0]); c++) {
				one_case(dq[a], dv[b], np[c], (int)(c % 2), 0);
				one_case(dq[a], dv[b], np[c], (int)((c + 1) % 2), 1);
				cases += 2;
			}
	printf("%d cases compared with moet_attend_ref\n", cases);

	moet_attend_fn f = NULL;
	unsetenv("MOET_CPU_ATTN");
	CHECK(moet_cpu_attend_choose(&f) == 0 && f == moet_attend_avx512, "unset: avx512");
	setenv("MOET_CPU_ATTN", "avx512", 1);
	CHECK(moet_cpu_attend_choose(&f) == 0 && f == moet_attend_avx512, "avx512");
	setenv("MOET_CPU_ATTN", "ref", 1);
	CHECK(moet_cpu_attend_choose(&f) == 0 && f == moet_attend_ref, "ref");
	setenv("MOET_CPU_ATTN", "fast", 1);
	CHECK(moet_cpu_attend_choose(&f) == MOET_EINVAL && strstr(moet_errmsg(), "MOET_CPU_ATTN"),
	      "a bad value refused by name: %s", moet_errmsg());
	unsetenv("MOET_CPU_ATTN");
	return moet_test_done("test_attend_avx512");
}
