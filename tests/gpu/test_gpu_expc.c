/*
 * test_gpu_expc.c: exp_c on the GPU equals the host's scalar exp_c on all 2^32 inputs
 * (NaN equal to NaN). One header defines it for both sides (common/moet_expc.h); this proves
 * the device build (no FTZ, no fmad contraction, IEEE division) keeps the contract.
 * Skips (77) without a CUDA device.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "moet_err.h"
#include "moet_expc.h"
#include "moet_gpu.h"
#include "moet_test.h"

#define CHUNK (1u << 26)
#define THREADS 16

typedef struct {
	const float *in, *dev;
	uint32_t lo, hi;
	uint64_t bad;
	uint32_t first_bad;
} slice;

static void *check(void *arg)
{
	slice *s = arg;
	for (uint32_t i = s->lo; i < s->hi; i++) {
		float want = moet_exp_c(s->in[i]), got = s->dev[i];
		int same = (want != want) ? (got != got) : (moet_f32_bits(want) == moet_f32_bits(got));
		if (!same && s->bad++ == 0)
			s->first_bad = i;
	}
	return NULL;
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	float *in = malloc(CHUNK * sizeof(float)), *dev = malloc(CHUNK * sizeof(float));
	uint64_t bad = 0;
	for (uint64_t base = 0; base < (1ull << 32) && in && dev; base += CHUNK) {
		for (uint32_t i = 0; i < CHUNK; i++)
			in[i] = moet_bits_f32((uint32_t)(base + i));
		int rc = moet_gpu_exp_c(in, dev, CHUNK);
		CHECK(rc == 0, "moet_gpu_exp_c: %s", moet_errmsg());
		if (rc)
			break;
		pthread_t th[THREADS];
		slice sl[THREADS];
		for (int t = 0; t < THREADS; t++) {
			sl[t] = (slice){ in, dev, (uint32_t)((uint64_t)CHUNK * t / THREADS),
					 (uint32_t)((uint64_t)CHUNK * (t + 1) / THREADS), 0, 0 };
			pthread_create(&th[t], NULL, check, &sl[t]);
		}
		for (int t = 0; t < THREADS; t++) {
			pthread_join(th[t], NULL);
			if (sl[t].bad && !bad)
				fprintf(stderr, "first mismatch: x=%08x host %08x device %08x\n",
					moet_f32_bits(in[sl[t].first_bad]),
					moet_f32_bits(moet_exp_c(in[sl[t].first_bad])),
					moet_f32_bits(dev[sl[t].first_bad]));
			bad += sl[t].bad;
		}
	}
	CHECK(bad == 0, "%llu of 2^32 inputs differ", (unsigned long long)bad);
	printf("exp_c host vs device: %llu mismatches over 2^32 inputs\n", (unsigned long long)bad);
	free(in);
	free(dev);
	return moet_test_done("test_gpu_expc");
}
