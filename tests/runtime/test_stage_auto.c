/*
 * test_stage_auto.c: MOET_STAGE_BALANCE=auto, the balance's link price chosen per batch size
 * by measured passes (runtime/forward.c mb_choose) among none, 1 and 2 times
 * MOET_STAGE_LINK_PRICE, on the CPU backend with a placement of cold experts and the "even"
 * hardware figures (where price 1 stages some of a call's experts, not all):
 *
 *   - the trial passes the model reports (moet_model_trial_passes) under each switch, and
 *     unset: off on the CPU backend, on one GPU MOET_STAGE_BALANCE_GPU_DEFAULT (staged
 *     where it is on, logits equal to the run without placement), but off where the
 *     page-locking would take more than half the host's memory (MOET_STAGE_TEST_RAM, a
 *     stand-in for it) unless asked for;
 *   - each arm made the fastest in turn by MOET_STAGE_TEST_SKEW (seconds added to the
 *     recorded time of its passes, nothing timed): after three trials of each the passes
 *     run at that arm, counted per arm (price_passes), nothing staged at price none and
 *     something at the others; every pass's logits equal those of the run without placement;
 *   - passes with the CPU tier alone (bench e2e's Tc) leave the choice as it was;
 *   - moet_model_force_price: every decode pass at the forced arm (bench e2e's serial run
 *     replays a row's arms), the choice untouched; MOET_STAGE_TEST_CYCLE=1: the prices in turn;
 *   - with both forms (MOET_MICROBATCH unset) six arms, three trials each;
 *   - with every expert on the device no price is tried;
 *   - bad values refused, naming the variable.
 * On a GPU (when there is one) the same on the CUDA backend.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define NB 4   /* sequences */
#define ND 12  /* decode steps: 9 trials of three arms, then 3 at the chosen one */
#define TRIALS 3

/* After each pass of run: the hybrid stats reset after the prompts' pass and after pass
 * reset_at; the prompts' pass's price arm by price_passes into prompt_arm (-1: none, -2:
 * several). */
typedef struct hook {
	moet_model *m;
	int reset_at, prompt_arm;
} hook;

static void after(int step, void *ctx)
{
	hook *h = ctx;
	moet_hybrid_stats hs;
	moet_model_hybrid_stats(h->m, &hs, step == h->reset_at || step == 0);
	for (int a = 0; step == 0 && a < 3; a++)
		if (hs.price_passes[a])
			h->prompt_arm = h->prompt_arm == -1 ? a : -2;
}

/* NB ragged prompts (one pass), then ND decode steps of the batch: every pass's last logits
 * into out ((ND + 1) x NB x V); the hook as above. */
static int prompt_arm;
static void run(moet_model *m, float *out, int reset_at)
{
	moet_hybrid_stats hs;
	moet_model_hybrid_stats(m, &hs, 1);
	hook h = { .m = m, .reset_at = reset_at, .prompt_arm = -1 };
	CHECK(moet_test_ragged_run_hook(m, NB, ND, out, after, &h) == 0, "run: %s",
	      moet_errmsg());
	prompt_arm = h.prompt_arm;
}

static void checks(const char *device)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 9;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open_on("stage-auto", &gp, device, &dir);
	if (!m) {
		free(dir);
		return;
	}
	const moet_config *c = moet_model_config(m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n_out = (size_t)((ND + 1) * NB * V);
	float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	char hw[512];
	moet_test_hw_even(dir, hw, sizeof(hw));
	run(m, ref, -1);
	for (int64_t i = 0; i < L * E; i++) /* every third expert on the CPU side */
		own[i] = (int16_t)(i % 3 == 0 ? -1 : 0);
	moet_test_env("MOET_HARDWARE", hw);

	/* the trial passes each switch makes */
	static const struct {
		const char *bal, *mb;
		int trials;
		const char *ram; /* MOET_STAGE_TEST_RAM */
	} tp[] = { { "1", NULL, 6, NULL },	  { "1", "0", 0, NULL },
		   { "auto", "0", 9, NULL },	  { "auto", NULL, 18, NULL },
		   { "auto", "1", 9, NULL },	  { "0", NULL, 6, NULL },
		   { NULL, NULL, -1, NULL },	  { NULL, NULL, 6, "4096" },
		   { "auto", NULL, 18, "4096" } };
	const int gpu = strcmp(device, "cpu") != 0;
	moet_test_env("MOET_PREFILL_STAGE", "0"); /* staged below: by the balance alone */
	for (size_t i = 0; i < sizeof(tp) / sizeof(tp[0]); i++) {
		/* unset: off on the CPU backend (6), on one GPU its default (auto: 18, else 6);
		 * off on a GPU too where the lock would take more than half the host's memory
		 * (here 4096 bytes), but MOET_STAGE_BALANCE=auto locks anyway */
		const int want = tp[i].trials >= 0 ? tp[i].trials
				 : gpu && MOET_STAGE_BALANCE_GPU_DEFAULT == 2 ? 18 : 6;
		if (tp[i].ram && !gpu)
			continue;
		moet_test_env("MOET_STAGE_BALANCE", tp[i].bal);
		moet_test_env("MOET_MICROBATCH", tp[i].mb);
		moet_test_env("MOET_STAGE_TEST_RAM", tp[i].ram);
		CHECK(moet_model_set_placement(m, own, 1) == 0, "%s", moet_errmsg());
		CHECK(moet_model_trial_passes(m) == want,
		      "%s, MOET_STAGE_BALANCE=%s MOET_MICROBATCH=%s MOET_STAGE_TEST_RAM=%s: "
		      "%d trial passes, want %d", device, tp[i].bal ? tp[i].bal : "(unset)",
		      tp[i].mb ? tp[i].mb : "(unset)", tp[i].ram ? tp[i].ram : "(unset)",
		      moet_model_trial_passes(m), want);
		if (!gpu || tp[i].bal)
			continue;
		/* the default on a GPU: staged where it is on (nothing staged by prefill staging
		 * here), logits as without placement */
		moet_hybrid_stats hs;
		memset(got, 0xAB, n_out * sizeof(float));
		run(m, got, -1);
		moet_model_hybrid_stats(m, &hs, 0);
		CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0,
		      "%s, MOET_STAGE_BALANCE unset, MOET_STAGE_TEST_RAM=%s: logits differ", device,
		      tp[i].ram ? tp[i].ram : "(unset)");
		CHECK(tp[i].ram || !MOET_STAGE_BALANCE_GPU_DEFAULT ? hs.staged_pairs == 0
								  : hs.staged_pairs > 0,
		      "%s, MOET_STAGE_BALANCE unset, MOET_STAGE_TEST_RAM=%s: %llu pairs staged",
		      device, tp[i].ram ? tp[i].ram : "(unset)",
		      (unsigned long long)hs.staged_pairs);
	}
	moet_test_env("MOET_STAGE_TEST_RAM", "12x");
	moet_test_env("MOET_STAGE_BALANCE", "auto");
	CHECK(moet_model_set_placement(m, own, 1) != 0 &&
		      strstr(moet_errmsg(), "MOET_STAGE_TEST_RAM='12x'"),
	      "%s, MOET_STAGE_TEST_RAM=12x: %s", device, moet_errmsg());
	moet_test_env("MOET_STAGE_TEST_RAM", NULL);
	moet_test_env("MOET_PREFILL_STAGE", NULL);

	/* one pass (three arms): each made the fastest in turn */
	static const char *const skew[3] = { "0,1,1", "1,0,1", "1,1,0" };
	moet_test_env("MOET_STAGE_BALANCE", "auto");
	moet_test_env("MOET_MICROBATCH", "0");
	for (int best = 0; best < 3; best++) {
		moet_test_env("MOET_STAGE_TEST_SKEW", skew[best]);
		CHECK(moet_model_set_placement(m, own, 1) == 0, "%s", moet_errmsg());
		memset(got, 0xAB, n_out * sizeof(float));
		run(m, got, 3 * TRIALS); /* the prompt's pass, then 9 decode trials */
		moet_hybrid_stats hs;
		moet_model_hybrid_stats(m, &hs, 0);
		CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0,
		      "%s, price arm %d the fastest: logits differ from the run without placement",
		      device, best);
		CHECK(prompt_arm == 1, "%s: the prompt's pass at price arm %d, want 1 (prompts "
		      "try no prices)", device, prompt_arm);
		/* counted since the reset: the passes after the trials, all at the best arm */
		uint64_t want[3] = { 0, 0, 0 };
		want[best] = ND - 3 * TRIALS;
		for (int a = 0; a < 3; a++)
			CHECK(hs.price_passes[a] == want[a],
			      "%s, arm %d the fastest: %llu passes at arm %d after the trials, "
			      "want %llu", device, best, (unsigned long long)hs.price_passes[a], a,
			      (unsigned long long)want[a]);
		CHECK(best == 0 ? hs.staged_pairs == 0 : hs.staged_pairs > 0,
		      "%s, arm %d: %llu pairs staged after the trials", device, best,
		      (unsigned long long)hs.staged_pairs);
		CHECK(hs.cpu_pairs > 0, "%s, arm %d: no pair on the CPU tier (the even figures "
		      "stage some)", device, best);
		printf("%s one pass, arm %d the fastest: logits equal; after the trials %llu "
		       "passes there, %llu pairs staged, %llu on the CPU tier\n", device, best,
		       (unsigned long long)hs.price_passes[best],
		       (unsigned long long)hs.staged_pairs, (unsigned long long)hs.cpu_pairs);
		if (best != 1)
			continue;
		/* the CPU tier alone (bench e2e's Tc): its passes, slower, do not count, so
		 * the arm stays though they are now made the slowest there */
		moet_test_env("MOET_STAGE_TEST_SKEW", "0,5,0");
		CHECK(moet_model_set_hybrid_overlap(m, 0) == 0, "%s", moet_errmsg());
		run(m, got, -1);
		CHECK(moet_model_set_hybrid_overlap(m, 1) == 0, "%s", moet_errmsg());
		moet_model_hybrid_stats(m, &hs, 0);
		CHECK(hs.price_passes[1] == ND && hs.price_passes[0] == 0 && hs.price_passes[2] == 0,
		      "%s, the CPU tier alone: %llu, %llu, %llu decode passes at the arms, want all "
		      "%d at 1", device, (unsigned long long)hs.price_passes[0],
		      (unsigned long long)hs.price_passes[1], (unsigned long long)hs.price_passes[2],
		      ND);
		CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0,
		      "%s, the CPU tier alone: logits differ", device);
	}

	/* both forms: six arms; split passes 0.5 s slower, price 2 the fastest */
	moet_test_env("MOET_MICROBATCH", NULL);
	moet_test_env("MOET_STAGE_TEST_SKEW", "1,1,0");
	moet_test_env("MOET_MB_TEST_SKEW", "0,0.5");
	CHECK(moet_model_set_placement(m, own, 1) == 0, "%s", moet_errmsg());
	memset(got, 0xAB, n_out * sizeof(float));
	run(m, got, -1);
	run(m, got, 6 * TRIALS - ND); /* decode passes 13 .. 18 are trials */
	moet_hybrid_stats hs;
	moet_model_hybrid_stats(m, &hs, 0);
	CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0, "%s, six arms: logits differ",
	      device);
	CHECK(hs.price_passes[2] == (uint64_t)(ND - (6 * TRIALS - ND)) && hs.price_passes[0] == 0 &&
		      hs.price_passes[1] == 0 && hs.split_passes == 0,
	      "%s, six arms: after the trials %llu, %llu, %llu passes at the arms, %llu split; "
	      "want all one-pass at price 2", device, (unsigned long long)hs.price_passes[0],
	      (unsigned long long)hs.price_passes[1], (unsigned long long)hs.price_passes[2],
	      (unsigned long long)hs.split_passes);
	moet_test_env("MOET_MB_TEST_SKEW", NULL);

	/* moet_model_force_price (bench e2e's serial run replays a row's arms with it): every
	 * decode pass at the forced arm and counted there, the choice untouched: arm 1 after
	 * trials at skews 1, 0.5, 1, and the forced passes skewed 0, 0.5, 1, so that arm 0's,
	 * were they recorded, would make it the choice; MOET_STAGE_TEST_CYCLE=1: after the
	 * trials the prices in turn */
	moet_test_env("MOET_MICROBATCH", "0");
	moet_test_env("MOET_STAGE_TEST_SKEW", "1,0.5,1");
	CHECK(moet_model_set_placement(m, own, 1) == 0, "%s", moet_errmsg());
	run(m, got, 3 * TRIALS);
	moet_test_env("MOET_STAGE_TEST_SKEW", "0,0.5,1");
	for (int f = 0; f < 4; f++) {
		const int arm = f < 3 ? f : -1, at = f < 3 ? f : 1; /* -1: the choice again */
		CHECK(moet_model_force_price(m, arm) == 0, "force %d: %s", arm, moet_errmsg());
		memset(got, 0xAB, n_out * sizeof(float));
		run(m, got, -1);
		moet_model_hybrid_stats(m, &hs, 0);
		CHECK(hs.price_passes[at] == ND && hs.price_passes[(at + 1) % 3] == 0 &&
			      hs.price_passes[(at + 2) % 3] == 0 && moet_model_last_price(m) == at,
		      "%s, forced arm %d: %llu, %llu, %llu decode passes at the arms, the last at "
		      "%d; want all %d at %d", device, arm, (unsigned long long)hs.price_passes[0],
		      (unsigned long long)hs.price_passes[1], (unsigned long long)hs.price_passes[2],
		      moet_model_last_price(m), ND, at);
		CHECK(at == 0 ? hs.staged_pairs == 0 : hs.staged_pairs > 0,
		      "%s, forced arm %d: %llu pairs staged", device, arm,
		      (unsigned long long)hs.staged_pairs);
		CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0, "%s, forced arm %d: logits "
		      "differ", device, arm);
	}
	CHECK(moet_model_force_price(m, 3) == MOET_EINVAL && moet_model_force_price(m, -2) ==
		      MOET_EINVAL && strstr(moet_errmsg(), "-2"),
	      "force_price 3 and -2 accepted (%s)", moet_errmsg());
	moet_test_env("MOET_STAGE_TEST_CYCLE", "1");
	memset(got, 0xAB, n_out * sizeof(float));
	run(m, got, -1);
	moet_model_hybrid_stats(m, &hs, 0);
	CHECK(hs.price_passes[0] == ND / 3 && hs.price_passes[1] == ND / 3 &&
		      hs.price_passes[2] == ND / 3,
	      "%s, MOET_STAGE_TEST_CYCLE=1: %llu, %llu, %llu passes at the arms, want %d each",
	      device, (unsigned long long)hs.price_passes[0],
	      (unsigned long long)hs.price_passes[1], (unsigned long long)hs.price_passes[2],
	      ND / 3);
	CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0, "%s, the prices in turn: logits "
	      "differ", device);
	moet_test_env("MOET_STAGE_TEST_CYCLE", NULL);
	moet_test_env("MOET_MICROBATCH", NULL);

	/* every expert on the device: no price to try, so the forms' trials alone, none counted */
	for (int64_t i = 0; i < L * E; i++)
		own[i] = 0;
	moet_test_env("MOET_STAGE_TEST_SKEW", NULL);
	CHECK(moet_model_set_placement(m, own, 1) == 0, "%s", moet_errmsg());
	CHECK(moet_model_trial_passes(m) == 6, "all on the device: %d trial passes, want 6",
	      moet_model_trial_passes(m));
	run(m, got, -1);
	moet_model_hybrid_stats(m, &hs, 0);
	CHECK(hs.price_passes[0] + hs.price_passes[1] + hs.price_passes[2] == 0 &&
		      hs.staged_pairs == 0 && moet_model_last_price(m) == -1,
	      "all on the device: %llu passes counted at prices, %llu pairs staged",
	      (unsigned long long)(hs.price_passes[0] + hs.price_passes[1] + hs.price_passes[2]),
	      (unsigned long long)hs.staged_pairs);
	CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0, "%s, all on the device: logits "
	      "differ", device);
	for (int64_t i = 0; i < L * E; i++)
		own[i] = (int16_t)(i % 3 == 0 ? -1 : 0);

	/* bad values */
	moet_test_env("MOET_STAGE_BALANCE", "Auto");
	CHECK(moet_model_set_placement(m, own, 1) != 0 &&
		      strstr(moet_errmsg(), "MOET_STAGE_BALANCE='Auto'"),
	      "MOET_STAGE_BALANCE=Auto: %s", moet_errmsg());
	moet_test_env("MOET_STAGE_BALANCE", "auto");
	CHECK(moet_model_set_placement(m, own, 1) == 0, "%s", moet_errmsg());
	static const char *const bad[][2] = {
		{ "MOET_STAGE_TEST_SKEW", "1,1" },    { "MOET_STAGE_TEST_SKEW", "1,1,1,1" },
		{ "MOET_STAGE_TEST_SKEW", "x,0,0" },  { "MOET_STAGE_TEST_SKEW", "0,-1,0" },
		{ "MOET_STAGE_TEST_SKEW", "0,0," },   { "MOET_STAGE_TEST_CYCLE", "2" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		moet_test_env(bad[i][0], bad[i][1]);
		moet_kv *kv = NULL;
		const int64_t t = 1;
		CHECK(moet_kv_create(m, 4, &kv) == 0, "kv");
		moet_seq_step st = { .kv = kv, .tokens = &t, .n_tok = 1 };
		CHECK(moet_model_forward_batch(m, &st, 1) != 0 && strstr(moet_errmsg(), bad[i][0]),
		      "%s='%s' accepted (%s)", bad[i][0], bad[i][1], moet_errmsg());
		moet_kv_destroy(kv);
		moet_test_env(bad[i][0], NULL);
	}
	moet_test_env("MOET_STAGE_BALANCE", NULL);
	moet_test_env("MOET_HARDWARE", NULL);
	CHECK(moet_model_set_placement(m, NULL, 0) == 0, "placement removed");
	moet_model_close(m);
	free(ref);
	free(got);
	free(own);
	free(dir);
}

int main(void)
{
	checks("cpu");
	const char *why = NULL;
	if (moet_gpu_count(&why) > 0)
		checks("cuda");
	else
		printf("cuda part skipped: %s\n", why ? why : "no CUDA device");
	return moet_test_done("test_stage_auto");
}
