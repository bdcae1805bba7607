/*
 * test_xtier.c: the NVMe expert tier changes no bit. On a generated checkpoint with skewed
 * routing (8 hot experts of 32 take ~85% of the routings; 4 layers, 3 of them MoE; 1 MiB
 * shards), the logits of a ragged batch (prefill of three sequences, then decode steps) with
 * RAM budgets of 100%, 50%, 25% and one slot of the CPU tier are memcmp-equal to the run
 * without a budget, with and without a profile, with prefetch off, and with a placement over
 * simulated devices (CPU tier = half the experts). The counters add up (lookups = hits + late
 * hits + misses); with 100% nothing misses; the predictor's recall is above twice the recall
 * of a random prediction of the same size. Faults on the tier's reads (EIO, ENOSPC): the pass
 * fails with a message naming the file, offset and errno text, the expert it was for is not
 * resident, and the next pass gives the same bits; a short read changes nothing. The
 * prefetch budget: its rule on hand-worked cases, a 1 byte/s disk reads nothing ahead where
 * ALL does (the same bits both ways), its measured inputs after a run, MOET_XTIER_PREFETCH.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_profile.h"
#include "moet_test.h"
#include "moet_uring.h"
#include "moet_xtier.h"
#include "xtier_int.h"

#define SEQS 3
#define STEPS 6

/* Prefill of ragged lengths then STEPS decode steps, batched; logits into out. Returns the
 * first error (caches destroyed either way). */
static int run(moet_model *m, uint64_t salt, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	const int64_t len[SEQS] = { 6, 11, 3 };
	int64_t tok[SEQS][32];
	moet_kv *kv[SEQS] = { 0 };
	size_t at = 0;
	int rc = 0;
	for (int s = 0; s < SEQS && !rc; s++) {
		rc = moet_kv_create(m, 32, &kv[s]);
		for (int i = 0; i < 32; i++)
			tok[s][i] = (int64_t)((s * 37 + i * 11 + 3 + salt * 101) % (uint64_t)V);
	}
	for (int step = 0; step <= STEPS && !rc; step++) {
		moet_seq_step st[SEQS];
		for (int s = 0; s < SEQS; s++) {
			int64_t from = step == 0 ? 0 : len[s] + step - 1, cnt = step == 0 ? len[s] : 1;
			st[s] = (moet_seq_step){ .kv = kv[s], .tokens = tok[s] + from, .n_tok = cnt,
						 .out_logits = out + at, .last_only = 1 };
			at += (size_t)V;
		}
		rc = moet_model_forward_batch(m, st, SEQS);
	}
	for (int s = 0; s < SEQS; s++)
		moet_kv_destroy(kv[s]);
	return rc;
}

static void record(void *ctx, const moet_route_event *ev)
{
	moet_profile_record(ctx, ev->is_prefill ? MOET_PROFILE_PREFILL : MOET_PROFILE_DECODE,
			    ev->layer, ev->ids, ev->weights, ev->top_k);
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0;
}

/* Sets the tier, runs, compares with ref; returns the stats. */
static moet_xtier_stats check_opts(moet_model *m, const char *name, const moet_xtier_opts *o,
				   const float *ref, float *got, size_t n)
{
	moet_xtier_stats st = { 0 };
	int rc = moet_model_set_xtier(m, o);
	CHECK(rc == 0, "%s: set: %s", name, moet_errmsg());
	if (rc)
		return st;
	memset(got, 0xAB, n * sizeof(float));
	rc = run(m, 0, got);
	CHECK(rc == 0, "%s: run: %s", name, moet_errmsg());
	CHECK(memcmp(ref, got, n * sizeof(float)) == 0, "%s: logits differ from no budget", name);
	moet_xtier_stats_get(moet_model_xtier(m), &st);
	CHECK(st.lookups > 0, "%s: the CPU tier did not go through the NVMe tier (dispatch must "
	      "take the CPU tier's views from moet_xtier_acquire)", name);
	CHECK(st.lookups == st.hits + st.late_hits + st.misses,
	      "%s: lookups %llu = hits %llu + late %llu + misses %llu", name,
	      (unsigned long long)st.lookups, (unsigned long long)st.hits,
	      (unsigned long long)st.late_hits, (unsigned long long)st.misses);
	printf("%-22s slots %3lld of %3lld: logits equal; hit rate %.3f (late %llu, misses %llu, "
	       "evictions %llu, prefetched %llu used %llu), recall %.3f (chance %.3f), %s, %s\n",
	       name, (long long)st.n_slots, (long long)st.tier_experts,
	       ratio(st.hits + st.late_hits, st.lookups), (unsigned long long)st.late_hits,
	       (unsigned long long)st.misses, (unsigned long long)st.evictions,
	       (unsigned long long)st.prefetch_reads, (unsigned long long)st.prefetch_used,
	       ratio(st.predicted_hits, st.actual),
	       st.actual ? (double)st.chance_hits_x1e6 / 1e6 / (double)st.actual : 0,
	       st.direct ? "O_DIRECT" : "buffered", st.registered ? "registered" : "unregistered");
	return st;
}

static moet_xtier_stats check_budget(moet_model *m, const char *name, size_t bytes,
				     const moet_profile *p, int no_prefetch, const float *ref,
				     float *got, size_t n)
{
	moet_xtier_opts o = { .ram_budget_bytes = bytes, .profile = p, .no_prefetch = no_prefetch };
	return check_opts(m, name, &o, ref, got, n);
}

/*
 * The prefetch budget (moet_xtier.h): the rule's cases worked by hand; a disk too slow for
 * any read to pay off (1 byte/s) reads nothing ahead where ALL reads ahead, and neither
 * changes a bit; the measured inputs are there after a run; MOET_XTIER_PREFETCH is parsed.
 */
static void budget_cases(moet_model *m, size_t bytes, const moet_profile *p, const float *ref,
			 float *got, size_t n)
{
	/* p x clamp(w, 0, t) >= (1 - p) x t x min(m, 1) */
	CHECK(xt_pf_take(0.5, 1, 10, 10) && !xt_pf_take(0.4, 1, 10, 10), "even odds at w >= t");
	CHECK(!xt_pf_take(0.9, 1, 21, 2) && xt_pf_take(0.9, 1, 21, 3),
	      "slow disk: 0.9 x 2 < 0.1 x 21, 0.9 x 3 >= 2.1");
	CHECK(xt_pf_take(0.6, 1, 5, 100) == xt_pf_take(0.6, 1, 5, 5), "w beyond t saves t only");
	CHECK(!xt_pf_take(0.99, 0.5, 10, 0) && !xt_pf_take(0.99, 0.5, 10, -3),
	      "no idle time left: nothing saved");
	CHECK(xt_pf_take(0.1, 0, 10, 0) && xt_pf_take(0.1, 0, 10, -3),
	      "no demand misses to delay: free");
	CHECK(!xt_pf_take(0.3, 2, 10, 10) && xt_pf_take(0.3, 0.4, 10, 10),
	      "misses per acquire count up to 1: 3 < 7 x 1, 3 >= 7 x 0.4 = 2.8");

	moet_xtier_opts all = { .ram_budget_bytes = bytes, .profile = p,
				.prefetch_mode = MOET_XTIER_PF_ALL };
	moet_xtier_stats sa = check_opts(m, "prefetch all", &all, ref, got, n);
	CHECK(sa.prefetch_mode == MOET_XTIER_PF_ALL && sa.prefetch_reads > 0 &&
	      sa.prefetch_declined == 0, "ALL: %llu reads ahead, %llu declined",
	      (unsigned long long)sa.prefetch_reads, (unsigned long long)sa.prefetch_declined);
	moet_xtier_opts slow = all;
	slow.prefetch_mode = MOET_XTIER_PF_BUDGET;
	slow.pf_rate_Bps = 1;
	slow.pf_window_ns = 1e6;
	moet_xtier_stats ss = check_opts(m, "prefetch budget, 1 B/s", &slow, ref, got, n);
	CHECK(ss.prefetch_reads == 0 && ss.prefetch_declined > 0, "1 B/s: %llu reads ahead, "
	      "%llu declined", (unsigned long long)ss.prefetch_reads,
	      (unsigned long long)ss.prefetch_declined);
	moet_xtier_opts meas = slow;
	meas.pf_rate_Bps = meas.pf_window_ns = 0;
	moet_xtier_stats sm = check_opts(m, "prefetch budget", &meas, ref, got, n);
	CHECK(sm.pf_rate_Bps > 0 && sm.pf_window_ns > 0 && sm.pf_precision > 0 &&
	      sm.pf_precision < 1 && sm.pf_miss_avg >= 0, "measured: %.3g B/s, %.3g ns, "
	      "precision %.3f, misses %.3f", sm.pf_rate_Bps, sm.pf_window_ns, sm.pf_precision,
	      sm.pf_miss_avg);
	printf("prefetch budget: disk %.3f GB/s busy, window %.3f ms, precision %.3f, misses per "
	       "acquire %.2f: %llu read ahead, %llu declined\n", sm.pf_rate_Bps * 1e-9,
	       sm.pf_window_ns * 1e-6, sm.pf_precision, sm.pf_miss_avg,
	       (unsigned long long)sm.prefetch_reads, (unsigned long long)sm.prefetch_declined);
	/* the environment decides when the option does not */
	const char *env[] = { "all", "budget", "" };
	const int want[] = { MOET_XTIER_PF_ALL, MOET_XTIER_PF_BUDGET, MOET_XTIER_PF_BUDGET };
	moet_xtier_opts o = { .ram_budget_bytes = bytes, .no_warm = 1 };
	for (int i = 0; i < 3; i++) {
		moet_xtier_stats st = { 0 };
		setenv("MOET_XTIER_PREFETCH", env[i], 1);
		CHECK(moet_model_set_xtier(m, &o) == 0, "MOET_XTIER_PREFETCH='%s': %s", env[i],
		      moet_errmsg());
		if (moet_model_xtier(m))
			moet_xtier_stats_get(moet_model_xtier(m), &st);
		CHECK(st.prefetch_mode == want[i], "MOET_XTIER_PREFETCH='%s': mode %d", env[i],
		      st.prefetch_mode);
	}
	setenv("MOET_XTIER_PREFETCH", "sometimes", 1);
	CHECK(moet_model_set_xtier(m, &o) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "MOET_XTIER_PREFETCH='sometimes'") && !moet_model_xtier(m),
	      "bad MOET_XTIER_PREFETCH: %s", moet_errmsg());
	unsetenv("MOET_XTIER_PREFETCH");
	o.prefetch_mode = 7;
	CHECK(moet_model_set_xtier(m, &o) == MOET_EINVAL && strstr(moet_errmsg(), "mode 7"),
	      "bad prefetch_mode: %s", moet_errmsg());
}

/* A fault on the tier's next read: the pass fails cleanly (or, for a prefetch read, recovers),
 * nothing bad is cached, the next pass is bit-identical. */
static void fault(moet_model *m, size_t bytes, int kind, const char *text, int no_prefetch,
		  const float *ref, float *got, size_t n)
{
	moet_xtier_opts o = { .ram_budget_bytes = bytes, .no_prefetch = no_prefetch };
	CHECK(moet_model_set_xtier(m, &o) == 0, "fault set: %s", moet_errmsg());
	moet_xtier *x = moet_model_xtier(m);
	if (!x)
		return;
	CHECK(moet_uring_fault(moet_xtier_reader(x), 1, kind) == 0, "inject");
	moet_err_clear();
	int rc = run(m, 0, got);
	moet_xtier_stats st;
	moet_xtier_stats_get(x, &st);
	if (kind == MOET_URING_FAULT_SHORT) {
		CHECK(rc == 0 && !memcmp(ref, got, n * sizeof(float)), "short read: %s",
		      moet_errmsg());
		printf("fault short (prefetch %s): pass ok, logits equal\n",
		       no_prefetch ? "off" : "on");
		return;
	}
	CHECK(st.read_errors >= 1, "%s: a read error counted", text);
	if (rc) {
		const char *msg = moet_errmsg();
		long long l = -1, e = -1;
		const char *p = strstr(msg, "layer ");
		if (p)
			sscanf(p, "layer %lld expert %lld", &l, &e);
		CHECK(rc == MOET_EIO && strstr(msg, ".safetensors") && strstr(msg, "offset") &&
		      strstr(msg, text) && l >= 0 && e >= 0, "%s: message: %s", text, msg);
		CHECK(!moet_xtier_is_resident(x, l, e), "%s: layer %lld expert %lld not cached",
		      text, l, e);
		printf("fault %s (prefetch %s): pass failed: %s\n", text,
		       no_prefetch ? "off" : "on", msg);
	} else {
		CHECK(!no_prefetch, "%s: a demand read failed and the pass did not", text);
		printf("fault %s (prefetch on): a prefetch read failed, the demand path read again;"
		       " pass ok\n", text);
	}
	memset(got, 0xAB, n * sizeof(float));
	rc = run(m, 0, got);
	CHECK(rc == 0 && !memcmp(ref, got, n * sizeof(float)), "%s: next pass: %s", text,
	      rc ? moet_errmsg() : "logits differ");
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 7;
	gp.n_layers = 4;
	gp.hot_count = 8;
	gp.hot_share = 0.85;
	gp.shard_mb = 1;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("xtier", &gp, &dir);
	if (!m)
		return moet_test_done("test_xtier");
	const moet_config *c = moet_model_config(m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n = (size_t)(SEQS * (STEPS + 1) * V);
	float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	CHECK(run(m, 0, ref) == 0, "reference: %s", moet_errmsg());

	/* a profile of other prompts */
	moet_profile *p = NULL;
	CHECK(moet_profile_create(c, &p) == 0, "profile");
	moet_model_set_route_observer(m, record, p);
	for (uint64_t salt = 1; salt <= 3; salt++)
		CHECK(run(m, salt, got) == 0, "profiling run");
	moet_model_set_route_observer(m, NULL, NULL);

	/* sizes: a tier as large as the model's experts */
	moet_xtier_opts big = { .ram_budget_bytes = (size_t)1 << 40, .no_warm = 1 };
	CHECK(moet_model_set_xtier(m, &big) == 0, "big: %s", moet_errmsg());
	moet_xtier_stats s0;
	moet_xtier_stats_get(moet_model_xtier(m), &s0);
	CHECK(s0.tier_experts == 3 * E && s0.n_slots == s0.tier_experts, "tier of %lld experts",
	      (long long)s0.tier_experts);
	const size_t slot = s0.slot_bytes, all = (size_t)s0.tier_experts * slot;
	printf("tier: %lld experts, %zu bytes; slot %zu bytes\n", (long long)s0.tier_experts,
	       s0.tier_bytes, slot);
	CHECK(moet_model_set_ram_budget(m, slot - 1, NULL) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "below one expert slot"), "budget below a slot: %s",
	      moet_errmsg());

	moet_xtier_stats st = check_budget(m, "100% + profile", all, p, 0, ref, got, n);
	CHECK(st.misses == 0 && st.warm_reads == (uint64_t)s0.tier_experts, "100%%: no miss");
	st = check_budget(m, "50% + profile", all / 2, p, 0, ref, got, n);
	double chance = st.actual ? (double)st.chance_hits_x1e6 / 1e6 / (double)st.actual : 1;
	CHECK(st.actual > 0 && ratio(st.predicted_hits, st.actual) > 2 * chance,
	      "recall %.3f above twice chance %.3f", ratio(st.predicted_hits, st.actual), chance);
	CHECK(ratio(st.hits + st.late_hits, st.lookups) > 0.3, "50%%: hit rate sane");
	check_budget(m, "50% no profile", all / 2, NULL, 0, ref, got, n);
	check_budget(m, "25% + profile", all / 4, p, 0, ref, got, n);
	check_budget(m, "25% no prefetch", all / 4, p, 1, ref, got, n);
	check_budget(m, "one slot", slot, p, 0, ref, got, n);
	check_budget(m, "one slot no prefetch", slot, NULL, 1, ref, got, n);
	budget_cases(m, all / 2, p, ref, got, n);

	/* placement: half the experts on the CPU tier, the rest over 2 simulated devices */
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	for (int64_t i = 0; i < L * E; i++)
		own[i] = (int16_t)((i * 7 + 3) % 4 < 2 ? -1 : (i % 2));
	CHECK(moet_model_set_ram_budget(m, 0, NULL) == 0, "remove");
	CHECK(moet_model_set_placement(m, own, 2) == 0, "placement: %s", moet_errmsg());
	CHECK(moet_model_set_xtier(m, &big) == 0, "big: %s", moet_errmsg());
	moet_xtier_stats_get(moet_model_xtier(m), &s0);
	CHECK(s0.tier_experts > 0 && s0.tier_experts < 3 * E, "CPU tier of %lld experts",
	      (long long)s0.tier_experts);
	const size_t cpu_all = (size_t)s0.tier_experts * slot;
	check_budget(m, "placement 50%", cpu_all / 2, p, 0, ref, got, n);
	check_budget(m, "placement one slot", slot, p, 0, ref, got, n);
	CHECK(moet_model_set_placement(m, NULL, 0) == 0, "no placement");

	/* faults */
	fault(m, all / 4, MOET_URING_FAULT_EIO, "Input/output error", 1, ref, got, n);
	fault(m, all / 4, MOET_URING_FAULT_ENOSPC, "No space left on device", 1, ref, got, n);
	fault(m, all / 4, MOET_URING_FAULT_SHORT, "short", 1, ref, got, n);
	fault(m, all / 4, MOET_URING_FAULT_EIO, "Input/output error", 0, ref, got, n);
	fault(m, all / 4, MOET_URING_FAULT_SHORT, "short", 0, ref, got, n);

	CHECK(moet_model_set_ram_budget(m, 0, NULL) == 0 && !moet_model_xtier(m), "removed");
	CHECK(run(m, 0, got) == 0 && !memcmp(ref, got, n * sizeof(float)), "after removal");
	moet_profile_free(p);
	moet_model_close(m);
	free(own);
	free(ref);
	free(got);
	free(dir);
	return moet_test_done("test_xtier");
}
