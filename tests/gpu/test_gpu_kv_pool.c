/*
 * test_gpu_kv_pool.c: paged KV caches on the CUDA backend (prepare_rows' device block
 * tables; gpu/kv_write.cu, kv_write_latent.cu, attention.cu, attention_latent.cu reading
 * through them), in both MLA forms, on a synthetic tiny checkpoint:
 *   - three sequences of ragged lengths (one past the kernels' 64-position tile) grow in
 *     interleaved batches through one shared pool with blocks of 1, 16 and 64 positions (the
 *     blocks of different sequences interleave in memory): every call's logits equal, by
 *     memcmp, the CPU reference backend's on contiguous caches (moet_kv_create) for the same
 *     calls; so do the CUDA backend's on contiguous caches;
 *   - a batch past the pool fails with MOET_ERANGE and changes nothing: the next calls still
 *     give the CPU's logits.
 * Skips (77) without a CUDA device.
 */
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_gpu.h"
#include "moet_model.h"
#include "moet_test.h"

#define SEQS 3
#define STEPS 7
#define MAXLEN 128

/* Tokens per sequence per call; final lengths 94, 25, 75. */
static const int sched_tok[STEPS][SEQS] = {
	{ 70, 3, 0 }, { 0, 2, 7 }, { 9, 1, 1 }, { 1, 12, 1 }, { 8, 1, 60 }, { 1, 1, 1 },
	{ 5, 5, 5 },
};

static int64_t tok_of(int s, int64_t i, int64_t V)
{
	return (int64_t)((uint64_t)(s * 257 + i * 31 + 11) % (uint64_t)V);
}

static size_t sched_rows(void)
{
	size_t n = 0;
	for (int step = 0; step < STEPS; step++)
		for (int s = 0; s < SEQS; s++)
			n += (size_t)sched_tok[step][s];
	return n;
}

/* The schedule on caches kv[]: every call's logits (all rows) appended to out. */
static int run_sched(moet_model *m, moet_kv **kv, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	static int64_t tok[SEQS][MAXLEN];
	int64_t len[SEQS] = { 0 };
	size_t at = 0;
	for (int s = 0; s < SEQS; s++)
		for (int64_t i = 0; i < MAXLEN; i++)
			tok[s][i] = tok_of(s, i, V);
	for (int step = 0; step < STEPS; step++) {
		moet_seq_step st[SEQS];
		int n = 0;
		for (int s = 0; s < SEQS; s++) {
			if (!sched_tok[step][s])
				continue;
			st[n++] = (moet_seq_step){ .kv = kv[s], .tokens = tok[s] + len[s],
						   .n_tok = sched_tok[step][s],
						   .out_logits = out + at };
			at += (size_t)(sched_tok[step][s] * V);
			len[s] += sched_tok[step][s];
		}
		int rc = moet_model_forward_batch(m, st, n);
		if (rc)
			return rc;
	}
	return 0;
}

static void same(const float *got, const float *want, size_t n, int64_t V, const char *what)
{
	size_t diff = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &want[i], sizeof(float)) && !diff++)
			first = i;
	CHECK(diff == 0, "%s: %zu of %zu logits differ from the CPU's (first at row %zu col %zu: "
	      "cpu %a gpu %a)", what, diff, n, first / (size_t)V, first % (size_t)V,
	      (double)want[first], (double)got[first]);
}

/* n tokens of sequence s from position `from`; the last row's logits into out. */
static int feed(moet_model *m, moet_kv *kv, int s, int64_t from, int64_t n, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	int64_t tok[64];
	float *all = malloc((size_t)(n * V) * sizeof(float));
	if (!all)
		return MOET_ENOMEM;
	for (int64_t i = 0; i < n; i++)
		tok[i] = tok_of(s, from + i, V);
	int rc = moet_model_forward(m, kv, tok, n, all);
	if (!rc && out)
		memcpy(out, all + (n - 1) * V, (size_t)V * sizeof(float));
	free(all);
	return rc;
}

static void form_case(const char *dir, const char *form)
{
	moet_model *cpu = NULL, *gpu = NULL;
	setenv("MOET_MLA", form, 1);
	CHECK(moet_model_open_on(dir, "cpu", &cpu) == 0, "cpu: %s", moet_errmsg());
	CHECK(moet_model_open_on(dir, "cuda", &gpu) == 0, "cuda: %s", moet_errmsg());
	unsetenv("MOET_MLA");
	if (!cpu || !gpu) {
		moet_model_close(cpu);
		moet_model_close(gpu);
		return;
	}
	const int64_t V = moet_model_config(cpu)->vocab_size;
	const size_t n = sched_rows() * (size_t)V;
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	moet_kv *kv[SEQS] = { 0 };
	char what[96];
	for (int s = 0; s < SEQS; s++)
		CHECK(moet_kv_create(cpu, MAXLEN, &kv[s]) == 0, "cpu cache");
	CHECK(run_sched(cpu, kv, want) == 0, "%s cpu: %s", form, moet_errmsg());
	for (int s = 0; s < SEQS; s++) {
		moet_kv_destroy(kv[s]);
		kv[s] = NULL;
		CHECK(moet_kv_create(gpu, MAXLEN, &kv[s]) == 0, "gpu cache");
	}
	CHECK(run_sched(gpu, kv, got) == 0, "%s cuda contiguous: %s", form, moet_errmsg());
	snprintf(what, sizeof(what), "%s MLA, CUDA, contiguous caches", form);
	same(got, want, n, V, what);
	for (int s = 0; s < SEQS; s++) {
		moet_kv_destroy(kv[s]);
		kv[s] = NULL;
	}
	const int64_t bsz[3] = { 1, 16, 64 };
	for (int b = 0; b < 3; b++) {
		moet_kv_pool *pool = NULL;
		CHECK(moet_kv_pool_create(gpu, 3 * MAXLEN, bsz[b], &pool) == 0, "pool: %s",
		      moet_errmsg());
		if (!pool)
			continue;
		for (int s = 0; s < SEQS; s++)
			CHECK(moet_kv_create_in(pool, MAXLEN, &kv[s]) == 0, "pool cache");
		memset(got, 0, n * sizeof(float));
		CHECK(run_sched(gpu, kv, got) == 0, "%s cuda pool: %s", form, moet_errmsg());
		snprintf(what, sizeof(what), "%s MLA, CUDA, shared pool of %lld-position blocks",
			 form, (long long)bsz[b]);
		same(got, want, n, V, what);
		printf("%s: checked (%zu logits)\n", what, n);
		for (int s = 0; s < SEQS; s++) {
			moet_kv_destroy(kv[s]);
			kv[s] = NULL;
		}
		CHECK(moet_kv_pool_free_blocks(pool) == moet_kv_pool_blocks(pool), "blocks lost");
		moet_kv_pool_destroy(pool);
	}
	/* exhaustion on the device: 4 blocks of 16; A 20 positions, B 16; A + 13 and C + 5 want
	 * 2 blocks, 1 is free */
	moet_kv_pool *pool = NULL;
	moet_kv *ref[2] = { 0 };
	float *a = malloc((size_t)V * sizeof(float)), *c = malloc((size_t)V * sizeof(float));
	CHECK(moet_kv_pool_create(gpu, 64, 16, &pool) == 0, "small pool");
	for (int s = 0; pool && s < SEQS; s++)
		CHECK(moet_kv_create_in(pool, 0, &kv[s]) == 0, "cache");
	for (int s = 0; s < 2; s++)
		CHECK(moet_kv_create(cpu, 64, &ref[s]) == 0, "cpu cache");
	if (pool && kv[2] && ref[1] && a && c) {
		CHECK(feed(gpu, kv[0], 0, 0, 20, NULL) == 0 &&
		      feed(gpu, kv[1], 1, 0, 16, NULL) == 0 &&
		      feed(cpu, ref[0], 0, 0, 20, NULL) == 0 &&
		      feed(cpu, ref[1], 1, 0, 16, NULL) == 0, "history: %s", moet_errmsg());
		int64_t tok[18];
		for (int i = 0; i < 13; i++)
			tok[i] = tok_of(0, 20 + i, V);
		for (int i = 0; i < 5; i++)
			tok[13 + i] = tok_of(2, i, V);
		moet_seq_step st[2] = { { .kv = kv[0], .tokens = tok, .n_tok = 13 },
					{ .kv = kv[2], .tokens = tok + 13, .n_tok = 5 } };
		CHECK(moet_model_forward_batch(gpu, st, 2) == MOET_ERANGE &&
		      strstr(moet_errmsg(), "budget 64"), "%s: past the pool: %s", form,
		      moet_errmsg());
		CHECK(moet_kv_len(kv[0]) == 20 && moet_kv_blocks(kv[0]) == 2 &&
		      moet_kv_blocks(kv[2]) == 0 && moet_kv_pool_free_blocks(pool) == 1,
		      "%s: the failed batch changed the caches", form);
		CHECK(feed(gpu, kv[0], 0, 20, 1, a) == 0 && feed(cpu, ref[0], 0, 20, 1, c) == 0,
		      "A after");
		snprintf(what, sizeof(what), "%s MLA, CUDA, A after a full pool", form);
		same(a, c, (size_t)V, V, what);
		CHECK(feed(gpu, kv[1], 1, 16, 1, a) == 0 && feed(cpu, ref[1], 1, 16, 1, c) == 0,
		      "B after");
		snprintf(what, sizeof(what), "%s MLA, CUDA, B after a full pool", form);
		same(a, c, (size_t)V, V, what);
	}
	for (int s = 0; s < SEQS; s++)
		moet_kv_destroy(kv[s]);
	for (int s = 0; s < 2; s++)
		moet_kv_destroy(ref[s]);
	moet_kv_pool_destroy(pool);
	free(a);
	free(c);
	free(want);
	free(got);
	moet_model_close(cpu);
	moet_model_close(gpu);
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 5;
	char *dir = moet_test_gen("gpu-kv-pool", &gp);
	if (dir) {
		form_case(dir, "expanded");
		form_case(dir, "absorbed");
	}
	free(dir);
	return moet_test_done("test_gpu_kv_pool");
}
