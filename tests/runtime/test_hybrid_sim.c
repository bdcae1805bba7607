/*
 * test_hybrid_sim.c: placement never changes a bit. On the CPU backend with simulated devices
 * (the test double of issue 5: each device holds a private copy of its experts' bytes), the
 * logits of a ragged batch of three sequences (prefill, then decode steps) are memcmp-equal to
 * the run without placement, for placements all-CPU, all on one device, random splits over
 * three devices and the CPU (>= 25% of routings on the CPU), and a different split per layer;
 * at batch sizes 1 and 3. The tier counters add up to the routings. Bad owners are refused.
 * One device and the CPU tier in two micro-batches with MOET_MB_MERGE=1 (the home device's
 * calls of both halves as one, dispatch.c), also with staged cold experts: the same bits, and
 * one merged call per MoE layer of every split pass. The backend's idle marks
 * (moet_model_set_gpu_idle) on for the all-CPU and the serial placements: the same bits, the
 * idle time at least the driver's waits for the CPU tier (serial: the tier's whole time), none
 * counted with the marks off. The CPU tier started after the devices' launches in one pass and
 * in two micro-batches (MOET_TIER_ORDER=gpu), and the routing copies queued with the shared
 * experts before the dispatch's wait (MOET_MB_QUEUE=1: in one pass; in two micro-batches in
 * the plain order and with the halves' steps reordered, MOET_MB_REORDER=1, also merged): the
 * same bits; the halves on two streams (MOET_MB_STREAMS=2, the CPU backend's test double
 * records the selections): the same bits, both halves selected and one join per split pass,
 * none when merged, nothing left selected; the CPU tier's finish queued on the backend
 * (MOET_TIER_FINISH=queued: the CPU backend's test double waits for the executor's done word
 * at once; the calls' ends collected at the next fetch and the pass's end), in two
 * micro-batches and in one pass: the same bits, every CPU-tier call so finished, none without;
 * a bad value of these or of MOET_STEP_UPLOAD refused by name.
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h" /* m->be: the CPU backend's record of its stream test double */
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define SEQS 3
#define STEPS 3

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
	return moet_test_xorshift64(&rng);
}

/* Prefill of ragged lengths then STEPS decode steps; all logits into out (per sequence, per
 * call, concatenated). batched: all sequences in one call, else one call per sequence. */
static size_t run(moet_model *m, int batched, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	const int64_t len[SEQS] = { 5, 9, 2 };
	int64_t tok[SEQS][16];
	moet_kv *kv[SEQS];
	size_t at = 0;
	for (int s = 0; s < SEQS; s++) {
		CHECK(moet_kv_create(m, 32, &kv[s]) == 0, "kv");
		for (int i = 0; i < 16; i++)
			tok[s][i] = (s * 37 + i * 11 + 3) % V;
	}
	for (int step = 0; step <= STEPS; step++) {
		moet_seq_step st[SEQS];
		for (int s = 0; s < SEQS; s++) {
			int64_t from = step == 0 ? 0 : len[s] + step - 1, cnt = step == 0 ? len[s] : 1;
			st[s] = (moet_seq_step){ .kv = kv[s], .tokens = tok[s] + from, .n_tok = cnt,
						 .out_logits = out + at, .last_only = 1 };
			at += (size_t)V;
		}
		if (batched) {
			CHECK(moet_model_forward_batch(m, st, SEQS) == 0, "batch: %s", moet_errmsg());
		} else {
			for (int s = 0; s < SEQS; s++)
				CHECK(moet_model_forward_batch(m, &st[s], 1) == 0, "solo: %s",
				      moet_errmsg());
		}
	}
	for (int s = 0; s < SEQS; s++)
		moet_kv_destroy(kv[s]);
	return at;
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 5;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("hybrid-sim", &gp, &dir);
	if (!m)
		return moet_test_done("test_hybrid_sim");
	const moet_config *c = moet_model_config(m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n_logits = (size_t)(SEQS * (STEPS + 1) * V);
	float *ref = malloc(n_logits * sizeof(float)), *got = malloc(n_logits * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	setenv("MOET_MB_QUEUE", "0", 1); /* the reference path */
	run(m, 1, ref);
	unsetenv("MOET_MB_QUEUE");
	/* no placement, the routing copies queued (the default for its decode passes) */
	memset(got, 0xAB, n_logits * sizeof(float));
	run(m, 1, got);
	CHECK(memcmp(ref, got, n_logits * sizeof(float)) == 0, "no placement, queued: logits "
	      "differ from the unqueued run");

	/* then the reference paths: the CPU tier (hybrid.c) without overlap and on the driving
	 * thread, and batched calls in one pass instead of two micro-batches (forward.c) */
	const char *names[] = { "all-cpu", "all-device", "random-3", "per-layer", "random-3 solo",
				"random-3 serial", "random-3 1-thread", "random-3 one pass",
				"random-1 merged one stream", "random-1 merged staged", "random-1 merged all staged",
				"random-3 gpu-first", "random-3 one pass gpu-first", "random-3 queued",
				"random-1 merged queued reordered", "random-3 one pass queued",
				"random-3 queued reordered", "random-1 merged queued",
				"random-1 two streams", "random-1 merged two streams",
				"random-1 two streams polled", "random-1 queued finish",
				"random-1 one pass queued finish" };
	int64_t moe_layers = 0;
	for (int64_t l = 0; l < L; l++)
		moe_layers += moet_config_is_moe_layer(c, l);
	for (int pl = 0; pl < 23; pl++) {
		const int merged = (pl >= 8 && pl <= 10) || pl == 14 || pl == 17 || pl == 19;
		const int streams = pl == 18 || pl == 19; /* MOET_MB_STREAMS=2 */
		const int fin_q = pl >= 21; /* MOET_TIER_FINISH=queued */
		int n_dev = pl == 0 ? 0 : pl == 1 || merged || streams || pl >= 20 ? 1 : 3;
		for (int64_t l = 0; l < L; l++)
			for (int64_t e = 0; e < E; e++) {
				int16_t o;
				if (pl == 0)
					o = -1;
				else if (pl == 1)
					o = 0;
				else if (pl == 3)
					o = (int16_t)((l % 2) ? (e % 4) - 1 : 2 - (e % 4));
				else /* half the experts on the CPU, the rest over the devices */
					o = (int16_t)((next() % 2) ? -1 : (int)(next() % n_dev));
				own[l * E + e] = o;
			}
		if (pl == 5)
			setenv("MOET_HYBRID_OVERLAP", "0", 1);
		if (pl == 2) /* the CPU tier's workers woken at each router (read at placement) */
			setenv("MOET_CPU_PREWAKE", "20000", 1);
		if (pl == 6)
			setenv("MOET_CPU_THREADS", "1", 1);
		if (pl == 9) { /* cold experts of 2+ tokens in a call staged on the backend */
			setenv("MOET_PREFILL_STAGE", "auto", 1);
			setenv("MOET_PREFILL_STAGE_MIN", "2", 1);
		}
		if (pl == 10) /* every cold expert staged: a layer's staged rows are written when
			       * its first micro-batch dispatches, before the second's combine of
			       * the layer before (the layers' two y) */
			setenv("MOET_PREFILL_STAGE", "1", 1);
		CHECK(moet_model_set_placement(m, own, n_dev) == 0, "%s: %s", names[pl],
		      moet_errmsg());
		unsetenv("MOET_HYBRID_OVERLAP");
		unsetenv("MOET_CPU_PREWAKE");
		unsetenv("MOET_CPU_THREADS");
		unsetenv("MOET_PREFILL_STAGE");
		unsetenv("MOET_PREFILL_STAGE_MIN");
		memset(got, 0xAB, n_logits * sizeof(float));
		/* the device has nothing queued meanwhile (pl 21: the stream's waits of the queued
		 * finish between marks of their own) */
		const int idle = pl == 0 || pl == 5 || pl == 21;
		CHECK(moet_model_set_gpu_idle(m, idle) == 0, "%s: idle marks: %s", names[pl],
		      moet_errmsg());
		/* two micro-batches forced, except: pl 3 the automatic choice (forward.c tries
		 * both forms), pl 7 batched calls in one pass */
		if (pl != 3)
			setenv("MOET_MICROBATCH",
			       pl == 7 || pl == 12 || pl == 15 || pl == 22 ? "0" : "1", 1);
		if (merged)
			setenv("MOET_MB_MERGE", "1", 1);
		/* the CPU tier's jobs started after the device tiers' launches, in two
		 * micro-batches and in one pass */
		if (pl == 11 || pl == 12)
			setenv("MOET_TIER_ORDER", "gpu", 1);
		/* the routing copies queued (in two micro-batches in the plain order, or, pl 14 and
		 * 16, the halves' steps reordered around them) */
		if (pl >= 13)
			setenv("MOET_MB_QUEUE", "1", 1);
		if (pl == 14 || pl == 16)
			setenv("MOET_MB_REORDER", "1", 1);
		/* the halves on two streams: the CPU backend's test double records the driver's
		 * selections (one thread: nothing overlaps) */
		if (streams)
			setenv("MOET_MB_STREAMS", "2", 1);
		if (pl == 1 || pl == 8) /* the reference: one stream (unset: two in the decode
					 * passes of one device: pl 0, merged pl 9, 10, 14, 17) */
			setenv("MOET_MB_STREAMS", "1", 1);
		/* the driver polling both halves' waits (the decode passes: their copies queued) */
		if (pl == 20)
			setenv("MOET_MB_POLL", "1", 1);
		/* the CPU tier's finish queued (pl >= 21); the default (pl 0: the decode passes'
		 * finishes queued, the prompts' not; pl 2: three devices, none queued); the
		 * driver's wait elsewhere */
		if (fin_q || (pl != 0 && pl != 2))
			setenv("MOET_TIER_FINISH", fin_q ? "queued" : "wait", 1);
		int sel0;
		uint64_t sels0, joins0, waits0;
		moet_backend_cpu_streams(m->be, &sel0, &sels0, &joins0, &waits0);
		run(m, pl != 4, got);
		int sel1;
		uint64_t sels1, joins1, waits1;
		moet_backend_cpu_streams(m->be, &sel1, &sels1, &joins1, &waits1);
		unsetenv("MOET_MB_STREAMS");
		unsetenv("MOET_MB_POLL");
		unsetenv("MOET_TIER_FINISH");
		unsetenv("MOET_MICROBATCH");
		unsetenv("MOET_MB_MERGE");
		unsetenv("MOET_TIER_ORDER");
		unsetenv("MOET_MB_QUEUE");
		unsetenv("MOET_MB_REORDER");
		CHECK(memcmp(ref, got, n_logits * sizeof(float)) == 0,
		      "%s: logits differ from the run without placement", names[pl]);
		uint64_t cnt[4];
		moet_model_tier_counts(m, cnt, 4);
		uint64_t total = cnt[0] + cnt[1] + cnt[2] + cnt[3];
		/* routings: every MoE layer routes every token of every call to top_k experts */
		uint64_t want = (uint64_t)(moe_layers * c->num_experts_per_tok *
					   (5 + 9 + 2 + SEQS * STEPS));
		CHECK(total == want, "%s: tier counts add to %llu, want %llu", names[pl],
		      (unsigned long long)total, (unsigned long long)want);
		moet_hybrid_stats hs;
		moet_model_hybrid_stats(m, &hs, 1);
		/* the waits lie inside the marked windows: the CPU tier's end in finish; serial, its
		 * whole run inside the dispatch's window (begin waits) */
		const uint64_t in_window = pl == 5 ? hs.ns_cpu : hs.ns_wait;
		CHECK(idle ? hs.ns_gpu_idle >= in_window && hs.ns_gpu_idle > 0 : hs.ns_gpu_idle == 0,
		      "%s: idle %llu ns, marks %s, the CPU tier's %s %llu ns", names[pl],
		      (unsigned long long)hs.ns_gpu_idle, idle ? "on" : "off",
		      pl == 5 ? "time" : "wait", (unsigned long long)in_window);
		/* by kind: the serial tier's run inside the routing's windows, the overlapped
		 * tier's wait inside the tier's own */
		const uint64_t route = hs.ns_gpu_idle_route, tier = hs.ns_gpu_idle - route;
		CHECK(idle ? route > 0 && route <= hs.ns_gpu_idle &&
				     (pl == 5 ? route >= in_window : tier >= in_window) &&
				     (pl != 21 || tier > 0)
			   : route == 0,
		      "%s: idle %llu ns at the routing, %llu at the CPU tier's end, the tier's %s "
		      "%llu ns", names[pl], (unsigned long long)route, (unsigned long long)tier,
		      pl == 5 ? "time" : "wait", (unsigned long long)in_window);
		/* the cold pairs: the CPU tier's and (staged) the backend's from a staging slot */
		CHECK(hs.cpu_pairs + hs.staged_pairs == cnt[0], "%s: the CPU tier computed %llu "
		      "pairs, %llu staged, counted %llu", names[pl],
		      (unsigned long long)hs.cpu_pairs, (unsigned long long)hs.staged_pairs,
		      (unsigned long long)cnt[0]);
		CHECK(hs.bytes_h2d == hs.cpu_pairs * (uint64_t)c->hidden_size * sizeof(float),
		      "%s: output bytes copied back", names[pl]);
		if (pl == 4 || pl == 7 || pl == 12 || pl == 15 || pl == 22)
			CHECK(hs.split_passes == 0, "%s: no pass in two micro-batches", names[pl]);
		else if (pl == 3)
			CHECK(hs.split_passes >= 1 && hs.split_passes <= STEPS, "%s: auto: %llu of %d "
			      "batched passes split (both forms tried)", names[pl],
			      (unsigned long long)hs.split_passes, STEPS + 1);
		else
			CHECK(hs.split_passes == STEPS + 1, "%s: %llu of %d batched passes in two "
			      "micro-batches", names[pl], (unsigned long long)hs.split_passes,
			      STEPS + 1);
		CHECK(hs.merged_calls == (merged ? hs.split_passes * (uint64_t)moe_layers : 0),
		      "%s: %llu merged device calls for %llu split passes", names[pl],
		      (unsigned long long)hs.merged_calls, (unsigned long long)hs.split_passes);
		/* queued: every row of both halves (or of the one pass) went down once per MoE
		 * layer, nothing else */
		if (pl >= 13)
			CHECK(hs.d2h_copies == (STEPS + 1 + hs.split_passes) * (uint64_t)moe_layers &&
			      hs.bytes_d2h == (uint64_t)((5 + 9 + 2 + SEQS * STEPS) * moe_layers *
							 c->hidden_size) * sizeof(float),
			      "%s: %llu row copies of %llu bytes for %llu split passes of %d", names[pl],
			      (unsigned long long)hs.d2h_copies, (unsigned long long)hs.bytes_d2h,
			      (unsigned long long)hs.split_passes, STEPS + 1);
		/* every split pass selected each half's stream and joined (pl 18, 19; unset, pl 0
		 * and merged 9, 10, 14, 17: the decode passes, all but the prompts' first), and none
		 * was left selected; without the switch (pl 1, merged pl 8) or over several devices
		 * nothing was. Merged on two streams, each MoE layer's call waited for the first
		 * half's stream and the first half's combine for the second's: two waits a layer */
		const int st_dflt =
			pl == 0 || pl == 20 || pl == 21 || (merged && pl != 8 && pl != 19);
		const int st_all = pl == 18 || pl == 19;
		CHECK(hs.stream_passes == joins1 - joins0, "%s: %llu passes on two streams, %llu "
		      "joins", names[pl], (unsigned long long)hs.stream_passes,
		      (unsigned long long)(joins1 - joins0));
		const uint64_t st_passes = st_all ? hs.split_passes
					   : st_dflt && hs.split_passes ? hs.split_passes - 1 : 0;
		CHECK(sel1 == -1 && (st_all || st_dflt ? sels1 - sels0 >= 2 * st_passes &&
							     joins1 - joins0 == st_passes &&
							     st_passes > 0
						       : sels1 == sels0 && joins1 == joins0),
		      "%s: streams: %llu selections, %llu joins for %llu split passes, left at %d",
		      names[pl], (unsigned long long)(sels1 - sels0),
		      (unsigned long long)(joins1 - joins0), (unsigned long long)hs.split_passes,
		      sel1);
		const uint64_t want_waits = merged ? 2 * (uint64_t)moe_layers * st_passes : 0;
		CHECK(waits1 - waits0 == want_waits, "%s: %llu stream waits, want %llu", names[pl],
		      (unsigned long long)(waits1 - waits0), (unsigned long long)want_waits);
		/* polled: every split pass (pl >= 13 queue the prompts' copies too) */
		CHECK(hs.polled_passes == (pl == 20 ? hs.split_passes : 0) &&
		      (pl != 20 || hs.split_passes > 0),
		      "%s: %llu polled passes", names[pl],
		      (unsigned long long)hs.polled_passes);
		/* queued finishes: every CPU-tier call of those runs (each MoE layer call with CPU
		 * work is one), the decode passes' by default on one device, none with the
		 * driver's wait or several devices */
		CHECK(fin_q ? hs.queued_finishes == hs.calls && hs.calls > 0
		      : pl == 0 ? hs.queued_finishes > 0 && hs.queued_finishes < hs.calls
				: hs.queued_finishes == 0,
		      "%s: %llu queued finishes of %llu calls", names[pl],
		      (unsigned long long)hs.queued_finishes, (unsigned long long)hs.calls);
		if (pl == 9 || pl == 10)
			CHECK(hs.staged_pairs > 0 && (hs.cpu_pairs > 0) == (pl == 9), "%s: %llu "
			      "staged pairs, %llu on the CPU tier", names[pl],
			      (unsigned long long)hs.staged_pairs, (unsigned long long)hs.cpu_pairs);
		if (pl == 0)
			CHECK(cnt[0] == total, "all-cpu: every pair on the CPU tier");
		if (pl == 1)
			CHECK(cnt[1] == total, "all-device: every pair on device 0");
		if (merged || streams || pl >= 20)
			CHECK(cnt[0] * 4 >= total && cnt[1], "%s: CPU share %llu of %llu (>= 25%%), "
			      "the device used", names[pl], (unsigned long long)cnt[0],
			      (unsigned long long)total);
		else if (pl >= 2 && pl != 3)
			CHECK(cnt[0] * 4 >= total && cnt[1] && cnt[2] && cnt[3],
			      "random-3: CPU share %llu of %llu (>= 25%%), every device used",
			      (unsigned long long)cnt[0], (unsigned long long)total);
		printf("%-14s CPU %llu, devices %llu %llu %llu of %llu routings: logits equal\n",
		       names[pl], (unsigned long long)cnt[0], (unsigned long long)cnt[1],
		       (unsigned long long)cnt[2], (unsigned long long)cnt[3],
		       (unsigned long long)total);
	}
	CHECK(moet_model_set_gpu_idle(m, 0) == 0, "idle marks off");
	{ /* bad dispatch switches are refused by name, nothing computed */
		moet_kv *kv = NULL;
		const int64_t t1[1] = { 1 };
		CHECK(moet_kv_create(m, 4, &kv) == 0, "kv");
		moet_seq_step st = { .kv = kv, .tokens = t1, .n_tok = 1, .out_logits = got };
		const char *var[7] = { "MOET_TIER_ORDER", "MOET_STEP_UPLOAD", "MOET_MB_QUEUE",
				       "MOET_MB_REORDER", "MOET_MB_STREAMS", "MOET_MB_POLL",
				       "MOET_TIER_FINISH" };
		for (int i = 0; i < 7; i++) {
			setenv(var[i], "sideways", 1);
			int r = moet_model_forward_batch(m, &st, 1);
			unsetenv(var[i]);
			CHECK(r == MOET_EINVAL && strstr(moet_errmsg(), var[i]) &&
			      moet_kv_len(kv) == 0, "%s=sideways: rc %d (%s)", var[i], r,
			      moet_errmsg());
		}
		moet_kv_destroy(kv);
	}
	/* the shadow check: every CPU-tier call recomputed by the backend, bits compared (the
	 * last placement with its devices' experts on one, without staging: every cold pair on
	 * the CPU tier) */
	for (int64_t i = 0; i < L * E; i++)
		own[i] = own[i] > 0 ? 0 : own[i];
	CHECK(moet_model_set_placement(m, own, 1) == 0, "placement: %s", moet_errmsg());
	CHECK(moet_model_set_shadow(m, 1.0) == 0, "shadow on: %s", moet_errmsg());
	CHECK(moet_model_set_shadow(m, 1.5) == MOET_EINVAL, "rate 1.5 refused");
	CHECK(moet_model_set_shadow(m, 1.0) == 0, "shadow on again");
	run(m, 1, got);
	CHECK(memcmp(ref, got, n_logits * sizeof(float)) == 0, "logits with the shadow check");
	moet_shadow_stats ss;
	moet_model_shadow_stats(m, &ss);
	CHECK(ss.checks > 0 && ss.pairs >= ss.checks && ss.mismatches == 0 && ss.errors == 0,
	      "shadow: %llu checks, %llu pairs, %llu mismatches, %llu errors",
	      (unsigned long long)ss.checks, (unsigned long long)ss.pairs,
	      (unsigned long long)ss.mismatches, (unsigned long long)ss.errors);
	setenv("MOET_SHADOW_FAULT", "1", 1); /* a corrupted CPU row must be seen */
	run(m, 1, got);
	unsetenv("MOET_SHADOW_FAULT");
	moet_shadow_stats s2;
	moet_model_shadow_stats(m, &s2);
	CHECK(s2.checks > ss.checks && s2.mismatches == s2.checks - ss.checks,
	      "planted fault: %llu of %llu new checks mismatched",
	      (unsigned long long)s2.mismatches, (unsigned long long)(s2.checks - ss.checks));
	printf("shadow: %llu checks of %llu pairs, equal; with a planted fault %llu mismatches\n",
	       (unsigned long long)ss.checks, (unsigned long long)ss.pairs,
	       (unsigned long long)s2.mismatches);
	moet_model_set_shadow(m, 0);
	own[3] = 7;
	CHECK(moet_model_set_placement(m, own, 3) == MOET_EINVAL, "owner out of range refused");
	CHECK(moet_model_set_placement(m, NULL, 0) == 0, "placement removed");
	run(m, 1, got);
	CHECK(memcmp(ref, got, n_logits * sizeof(float)) == 0, "after removing the placement");
	moet_model_close(m);
	free(ref);
	free(got);
	free(own);
	free(dir);
	return moet_test_done("test_hybrid_sim");
}
