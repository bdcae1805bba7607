/*
 * test_expc_exhaustive.c: the AVX-512 exp_c and silu_c (moet_cpu_kernels_avx512) against the
 * scalar definition in common/moet_expc.h on all 2^32 binary32 inputs, bit for bit (a NaN
 * equals any NaN: docs/numerics.md). The range is split over two threads.
 *
 * NOTE: the scalar side is the same moet_exp_c / moet_silu_c, inlined into a function built
 * for the FMA instruction set (target attribute) so that fmaf becomes one vfmadd instead of a
 * libm call: same correctly rounded result, about ten times faster. It runs only after the
 * AVX-512 check (which includes FMA). Skips (77) where the avx512 variant is not available.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <xmmintrin.h>

#include "moet_cpu.h"
#include "moet_expc.h"
#include "moet_test.h"

enum { CHUNK = 4096 };

typedef struct job {
	const moet_cpu_kernels *k;
	uint64_t lo, hi;      /* input bit patterns [lo, hi) */
	uint64_t bad[2];      /* mismatches: exp_c, silu_c */
	uint32_t first_in[2]; /* the first mismatching input of each */
	uint32_t first_got[2], first_want[2];
} job;

__attribute__((target("fma"))) static void scalar_exp(const float *in, float *out, int n)
{
	for (int i = 0; i < n; i++)
		out[i] = moet_exp_c(in[i]);
}

__attribute__((target("fma"))) static void scalar_silu(const float *in, float *out, int n)
{
	for (int i = 0; i < n; i++)
		out[i] = moet_silu_c(in[i]);
}

static int same(uint32_t a, uint32_t b)
{
	int an = (a & 0x7FFFFFFFu) > 0x7F800000u, bn = (b & 0x7FFFFFFFu) > 0x7F800000u;
	return a == b || (an && bn);
}

static void compare(job *j, int f, const float *in, const float *got, const float *want, int n)
{
	for (int i = 0; i < n; i++) {
		uint32_t g, w;
		memcpy(&g, got + i, 4);
		memcpy(&w, want + i, 4);
		if (same(g, w))
			continue;
		if (!j->bad[f]++) {
			memcpy(&j->first_in[f], in + i, 4);
			j->first_got[f] = g;
			j->first_want[f] = w;
		}
	}
}

static void *run(void *arg)
{
	job *j = arg;
	static __thread float in[CHUNK], vg[CHUNK], sg[CHUNK];
	for (uint64_t base = j->lo; base < j->hi; base += CHUNK) {
		for (int i = 0; i < CHUNK; i++) {
			uint32_t u = (uint32_t)(base + (uint64_t)i);
			memcpy(in + i, &u, 4);
		}
		j->k->exp_c(in, vg, CHUNK);
		scalar_exp(in, sg, CHUNK);
		compare(j, 0, in, vg, sg, CHUNK);
		j->k->silu_c(in, vg, CHUNK);
		scalar_silu(in, sg, CHUNK);
		compare(j, 1, in, vg, sg, CHUNK);
	}
	return NULL;
}

int main(void)
{
	const moet_cpu_kernels *k = moet_cpu_kernels_named("avx512");
	if (!k) {
		printf("test_expc_exhaustive: SKIP (no AVX-512 variant on this machine)\n");
		return MOET_TEST_SKIP;
	}
	unsigned csr = _mm_getcsr();
	CHECK(!(csr & 0x8040u), "MXCSR %#x has FTZ or DAZ set: the contract forbids both", csr);
	/* a short tail with an odd length exercises the masked last vector */
	float in[21], out[21];
	for (int i = 0; i < 21; i++)
		in[i] = (float)i - 10.5f;
	k->exp_c(in, out, 21);
	for (int i = 0; i < 21; i++)
		CHECK(out[i] == moet_exp_c(in[i]), "tail exp_c(%a) = %a", in[i], out[i]);
	k->silu_c(in, in, 21); /* in place */
	for (int i = 0; i < 21; i++)
		CHECK(in[i] == moet_silu_c((float)i - 10.5f), "in-place silu_c[%d]", i);

	enum { NT = 2 };
	job jobs[NT];
	pthread_t th[NT];
	const uint64_t span = (1ull << 32) / NT;
	for (int t = 0; t < NT; t++) {
		memset(&jobs[t], 0, sizeof(jobs[t]));
		jobs[t].k = k;
		jobs[t].lo = span * (uint64_t)t;
		jobs[t].hi = span * (uint64_t)(t + 1);
		CHECK(pthread_create(&th[t], NULL, run, &jobs[t]) == 0, "pthread_create");
	}
	const char *name[2] = { "exp_c", "silu_c" };
	for (int t = 0; t < NT; t++) {
		pthread_join(th[t], NULL);
		for (int f = 0; f < 2; f++)
			CHECK(jobs[t].bad[f] == 0,
			      "%s: %llu mismatches in [%#llx, %#llx); first: in %08x got %08x want %08x",
			      name[f], (unsigned long long)jobs[t].bad[f],
			      (unsigned long long)jobs[t].lo, (unsigned long long)jobs[t].hi,
			      jobs[t].first_in[f], jobs[t].first_got[f], jobs[t].first_want[f]);
	}
	return moet_test_done("test_expc_exhaustive");
}
