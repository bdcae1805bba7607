/*
 * test_microbatch_switch.c: MOET_MICROBATCH and where a batch splits (runtime/forward.c).
 *   - auto (and unset, empty), 0 and 1 give the reference's logits (no placement: one pass);
 *     any other value fails the pass with MOET_EINVAL naming the variable and the value, with
 *     or without a placement, and the failed pass leaves the caches as they were: their
 *     lengths unchanged, and the same step run again with a good value gives the logits of
 *     the run that never failed;
 *   - over simulated devices (the CPU backend's test double): a placement whose every routed
 *     expert is on a device (a dense layer's owner -1 does not count) never splits a batch
 *     under auto, and =1 still forces two micro-batches; a placement with CPU-tier experts
 *     under auto tries both forms (some passes split); the bits equal the reference in each;
 *   - the choice after the trials goes by each form's median of three: with a first trial
 *     made slow and the split form slower (MOET_MB_TEST_SKEW, tests only) only the trials
 *     split; malformed skews are refused naming the variable.
 */
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define SEQS 3
#define STEPS 3

/* Two sequences prefilled together, then one batched decode step; with `bad`, that step first
 * runs under MOET_MICROBATCH=bad (must fail naming it, the caches unchanged), then again with
 * the switch unset. out: [2 calls][2 seqs][V] last-row logits. */
static int two_calls(moet_model *m, const char *bad, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	static const int64_t prompt[2][4] = { { 3, 9, 14, 2 }, { 7, 1, 5, 11 } };
	const int64_t plen[2] = { 4, 3 }, next[2] = { 6, 13 };
	moet_kv *kv[2] = { NULL, NULL };
	moet_seq_step st[2];
	int rc = 0;
	for (int s = 0; s < 2 && !rc; s++)
		rc = moet_kv_create(m, 8, &kv[s]);
	for (int s = 0; s < 2 && !rc; s++)
		st[s] = (moet_seq_step){ .kv = kv[s], .tokens = prompt[s], .n_tok = plen[s],
					 .out_logits = out + s * V, .last_only = 1 };
	if (!rc)
		rc = moet_model_forward_batch(m, st, 2);
	for (int s = 0; s < 2 && !rc; s++)
		st[s] = (moet_seq_step){ .kv = kv[s], .tokens = &next[s], .n_tok = 1,
					 .out_logits = out + (2 + s) * V, .last_only = 1 };
	if (!rc && bad) {
		int64_t blocks[2] = { moet_kv_blocks(kv[0]), moet_kv_blocks(kv[1]) };
		moet_test_env("MOET_MICROBATCH", bad);
		int r = moet_model_forward_batch(m, st, 2);
		moet_test_env("MOET_MICROBATCH", NULL);
		char want[64];
		snprintf(want, sizeof(want), "MOET_MICROBATCH='%s'", bad);
		CHECK(r == MOET_EINVAL && strstr(moet_errmsg(), want), "MOET_MICROBATCH=%s: rc %d "
		      "(%s)", bad, r, moet_errmsg());
		for (int s = 0; s < 2; s++)
			CHECK(moet_kv_len(kv[s]) == plen[s] && moet_kv_blocks(kv[s]) == blocks[s],
			      "MOET_MICROBATCH=%s: cache %d has %lld positions, %lld blocks (want "
			      "%lld, %lld)", bad, s, (long long)moet_kv_len(kv[s]),
			      (long long)moet_kv_blocks(kv[s]), (long long)plen[s],
			      (long long)blocks[s]);
	}
	if (!rc)
		rc = moet_model_forward_batch(m, st, 2);
	for (int s = 0; s < 2; s++)
		moet_kv_destroy(kv[s]);
	return rc;
}

/* The ragged run under MOET_MICROBATCH=mb: the reference's bits; returns the split passes. */
static unsigned long long ragged(moet_model *m, const char *mb, const float *ref, float *got,
				 size_t n_log, const char *what)
{
	moet_hybrid_stats hs;
	moet_model_hybrid_stats(m, &hs, 1);
	moet_test_env("MOET_MICROBATCH", mb);
	memset(got, 0xCD, n_log * sizeof(float));
	int rc = moet_test_ragged_run(m, SEQS, STEPS, 1, got);
	moet_test_env("MOET_MICROBATCH", NULL);
	CHECK(rc == 0, "%s, MOET_MICROBATCH=%s: %s", what, mb ? mb : "(unset)", moet_errmsg());
	CHECK(rc || memcmp(ref, got, n_log * sizeof(float)) == 0, "%s, MOET_MICROBATCH=%s: logits "
	      "differ from the reference", what, mb ? mb : "(unset)");
	moet_model_hybrid_stats(m, &hs, 1);
	return (unsigned long long)hs.split_passes;
}

/* Three sequences prefilled with 2 tokens each, then `steps` decode steps of all three; the
 * passes that ran as two micro-batches, or ~0ull on an error. */
static unsigned long long decode_splits(moet_model *m, int steps)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	float *out = malloc((size_t)(3 * V) * sizeof(float));
	moet_kv *kv[3] = { NULL, NULL, NULL };
	int64_t tok[3][64];
	int rc = out ? 0 : MOET_ENOMEM;
	for (int s = 0; s < 3 && !rc; s++) {
		rc = moet_kv_create(m, 2 + steps, &kv[s]);
		for (int i = 0; i < 64; i++)
			tok[s][i] = (s * 29 + i * 7 + 1) % V;
	}
	moet_hybrid_stats hs;
	moet_model_hybrid_stats(m, &hs, 1);
	for (int step = 0; step <= steps && !rc; step++) {
		moet_seq_step st[3];
		for (int s = 0; s < 3; s++)
			st[s] = (moet_seq_step){ .kv = kv[s], .tokens = tok[s] + (step ? step + 1 : 0),
						 .n_tok = step ? 1 : 2, .out_logits = out + s * V,
						 .last_only = 1 };
		rc = moet_model_forward_batch(m, st, 3);
	}
	moet_model_hybrid_stats(m, &hs, 1);
	for (int s = 0; s < 3; s++)
		moet_kv_destroy(kv[s]);
	free(out);
	return rc ? ~0ull : (unsigned long long)hs.split_passes;
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 31;
	gp.n_layers = 3;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("microbatch-switch", &gp, &dir);
	if (!m) {
		free(dir);
		return moet_test_done("test_microbatch_switch");
	}
	const moet_config *c = moet_model_config(m);
	const int64_t V = c->vocab_size, L = c->num_hidden_layers, E = c->n_routed_experts;
	const size_t n_log = (size_t)(SEQS * (STEPS + 1) * V);
	float *ref = malloc(n_log * sizeof(float)), *got = malloc(n_log * sizeof(float));
	float *ref2 = malloc((size_t)(4 * V) * sizeof(float));
	float *got2 = malloc((size_t)(4 * V) * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	CHECK(ref && got && ref2 && got2 && own, "host memory");
	if (!ref || !got || !ref2 || !got2 || !own)
		goto out;
	CHECK(c->first_k_dense_replace >= 1 && L > c->first_k_dense_replace, "a dense layer 0 "
	      "and MoE layers after it (first_k_dense_replace %lld of %lld layers)",
	      (long long)c->first_k_dense_replace, (long long)L);
	moet_test_env("MOET_MICROBATCH", NULL);
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, ref) == 0, "reference: %s", moet_errmsg());
	CHECK(two_calls(m, NULL, ref2) == 0, "two calls, reference: %s", moet_errmsg());

	/* the values: good ones the reference's bits, others refused naming them */
	static const char *const good[] = { "auto", "", "0", "1" };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		ragged(m, good[i], ref, got, n_log, "no placement");
	static const char *const bad[] = { "2", "yes", "AUTO", " 1", "01", "auto " };
	for (int pl = 0; pl < 2; pl++) {
		/* pl 1: CPU tier + 2 simulated devices */
		for (int64_t i = 0; i < L * E; i++)
			own[i] = (int16_t)(i % 3 == 0 ? -1 : i % 2);
		CHECK(moet_model_set_placement(m, pl ? own : NULL, pl ? 2 : 0) == 0, "placement: %s",
		      moet_errmsg());
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			memset(got2, 0xCD, (size_t)(4 * V) * sizeof(float));
			CHECK(two_calls(m, bad[i], got2) == 0 &&
			      memcmp(ref2, got2, (size_t)(4 * V) * sizeof(float)) == 0,
			      "placement %d: after MOET_MICROBATCH=%s refused, the step again: the "
			      "reference's logits (%s)", pl, bad[i], moet_errmsg());
		}
	}

	/* every routed expert on a simulated device; layer 0 (dense) says -1, which is no expert */
	for (int64_t l = 0; l < L; l++)
		for (int64_t e = 0; e < E; e++)
			own[l * E + e] = (int16_t)(l < c->first_k_dense_replace ? -1 : e % 2);
	CHECK(moet_model_set_placement(m, own, 2) == 0, "all-device placement: %s", moet_errmsg());
	unsigned long long sp = ragged(m, NULL, ref, got, n_log, "all on devices");
	CHECK(sp == 0, "all on devices, auto: %llu passes split, want none", sp);
	sp = ragged(m, "auto", ref, got, n_log, "all on devices");
	CHECK(sp == 0, "all on devices, =auto: %llu passes split, want none", sp);
	sp = ragged(m, "1", ref, got, n_log, "all on devices");
	CHECK(sp == STEPS + 1, "all on devices, =1: %llu of %d passes split (forced)", sp,
	      STEPS + 1);
	printf("all on devices: auto splits nothing, =1 forces %llu splits; bits equal\n", sp);

	/* one MoE expert on the CPU tier: auto tries both forms (fresh timings per placement) */
	own[(L - 1) * E + 1] = -1;
	CHECK(moet_model_set_placement(m, own, 2) == 0, "one CPU-tier expert: %s", moet_errmsg());
	sp = ragged(m, NULL, ref, got, n_log, "one CPU-tier expert");
	CHECK(sp >= 1 && sp <= STEPS, "one CPU-tier expert, auto: %llu of %d passes split (both "
	      "forms tried)", sp, STEPS + 1);
	printf("one CPU-tier expert: auto split %llu of %d passes; bits equal\n", sp, STEPS + 1);
	sp = ragged(m, "0", ref, got, n_log, "one CPU-tier expert");
	CHECK(sp == 0, "one CPU-tier expert, =0: %llu passes split", sp);

	/* the choice after the trial passes goes by each form's median: a first one-pass trial
	 * 1 s slow (MOET_MB_TEST_SKEW's A) and every split pass 0.5 s slower (B) make one pass
	 * the faster form, so after the 3 + 3 trials nothing splits; a running mean weighting
	 * the first trial most chose the split (3 + 9 split passes of 15) */
	CHECK(moet_model_set_placement(m, own, 2) == 0, "fresh timings: %s", moet_errmsg());
	moet_test_env("MOET_MB_TEST_SKEW", "1,0.5");
	sp = decode_splits(m, 15);
	CHECK(sp == MOET_MB_TRIAL_PASSES / 2, "a slow first trial: %llu split passes of 15 decode "
	      "steps, want the %d trials only", sp, MOET_MB_TRIAL_PASSES / 2);
	static const char *const bad_skew[] = { "1", "x,1", "1,", "-1,0", "1,2,3", "nan,1" };
	for (size_t i = 0; i < sizeof(bad_skew) / sizeof(bad_skew[0]); i++) {
		moet_test_env("MOET_MB_TEST_SKEW", bad_skew[i]);
		CHECK(decode_splits(m, 1) == ~0ull && strstr(moet_errmsg(), "MOET_MB_TEST_SKEW"),
		      "MOET_MB_TEST_SKEW='%s' accepted (%s)", bad_skew[i], moet_errmsg());
	}
	moet_test_env("MOET_MB_TEST_SKEW", NULL);

	/* and the placement removed: nothing splits, whatever the switch */
	CHECK(moet_model_set_placement(m, NULL, 0) == 0, "no placement: %s", moet_errmsg());
	sp = ragged(m, "1", ref, got, n_log, "no placement");
	CHECK(sp == 0, "no placement, =1: %llu passes split", sp);
out:
	moet_model_close(m);
	free(ref);
	free(got);
	free(ref2);
	free(got2);
	free(own);
	free(dir);
	return moet_test_done("test_microbatch_switch");
}
