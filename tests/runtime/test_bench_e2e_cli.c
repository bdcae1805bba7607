/*
 * test_bench_e2e_cli.c: `moet-hybrid bench e2e` on the CPU backend (device 0 simulated) with a
 * tiny generated checkpoint and a placement file: the record has one decode row per (mode,
 * batch) and one prefill row per (mode, length), each with a positive median; its "steps"
 * split agrees with the placement (no CPU pairs in gpu mode, CPU pairs in hybrid and cpu
 * modes, PCIe bytes = pairs x hidden x 4 up + the batch's hidden rows down); the overlap
 * figures (Tc, Tg, bound) are present and consistent for the modes with a CPU tier; the time
 * to ready is recorded per mode. Bad arguments give one-line errors and exit 1 or 2.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_model.h"
#include "moet_profile.h"
#include "moet_test.h"


static double num(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

int main(void)
{
	char *dir = moet_test_mkdtemp("bench-e2e");
	char model[512], place[512], js[512];
	snprintf(model, sizeof(model), "%s/model", dir);
	snprintf(place, sizeof(place), "%s/place.yaml", dir);
	snprintf(js, sizeof(js), "%s/e2e.json", dir);
	const char *yaml = "version: 1\ngpus:\n  - {name: gpu0, budget: 1GiB, reserve: 0GiB}\n"
			   "default: {gpu0: \"0-3\"}\n";
	CHECK(moet_test_write_file(place, yaml, strlen(yaml)) == 0, "placement file");
	CHECK(moet_test_cli(NULL, "gen-checkpoint --preset tiny --seed 3 --out %s --quiet",
			    model) == 0, "gen-checkpoint");
	/* the geometry from the checkpoint's config.json */
	char cfgp[600];
	snprintf(cfgp, sizeof(cfgp), "%s/config.json", model);
	json_t *cfg = json_load_file(cfgp, 0, NULL);
	const int64_t HIDDEN = json_integer_value(json_object_get(cfg, "hidden_size"));
	const int64_t TOPK = json_integer_value(json_object_get(cfg, "num_experts_per_tok"));
	const int64_t MOE_LAYERS = json_integer_value(json_object_get(cfg, "num_hidden_layers")) -
				   json_integer_value(json_object_get(cfg, "first_k_dense_replace"));
	json_decref(cfg);
	CHECK(HIDDEN > 0 && TOPK > 0 && MOE_LAYERS > 0, "config.json geometry");
	char *out = NULL;
	int rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --placement %s "
			       "--batches 1,3 --prefill 16 --ctx 8 --steps 2 --json %s", model,
			       place, js);
	CHECK(rc == 0, "bench e2e: exit %d\n%s", rc, out ? out : "");
	free(out);
	json_error_t err;
	json_t *r = json_load_file(js, 0, &err);
	CHECK(r != NULL, "%s: %s", js, err.text);
	if (r) {
		CHECK(!strcmp(json_string_value(json_object_get(r, "bench")), "e2e"), "bench name");
		const json_t *rows = json_object_get(r, "results");
		CHECK(json_array_size(rows) == 9, "3 modes x (2 decode + 1 prefill) rows, got %zu",
		      json_array_size(rows));
		size_t i;
		const json_t *row;
		json_array_foreach(rows, i, row) {
			const char *name = json_string_value(json_object_get(row, "name"));
			CHECK(name && (!strncmp(name, "decode-", 7) || !strncmp(name, "prefill-", 8)),
			      "row name %s", name ? name : "-");
			CHECK(num(row, "median_s") > 0 && isfinite(num(row, "median_s")), "median");
		}
		const json_t *steps = json_object_get(r, "steps");
		CHECK(json_array_size(steps) == 6, "3 modes x 2 batches of splits");
		json_array_foreach(steps, i, row) {
			const char *mode = json_string_value(json_object_get(row, "mode"));
			int64_t B = json_integer_value(json_object_get(row, "batch"));
			double pairs = num(row, "cpu_pairs"), bytes = num(row, "pcie_bytes");
			if (!mode)
				continue;
			/* the device's idle time around the driver's waits (routing ids every MoE
			 * layer; the CPU tier's end, so at least the driver's wait for it) and the
			 * rest of the mean step */
			const double idle = num(row, "gpu_idle_s"), busy = num(row, "gpu_busy_s");
			CHECK(idle > 0 && busy >= 0 && idle >= num(row, "cpu_wait_s") * (1 - 1e-9),
			      "%s batch %lld: GPU idle %g s, busy %g s, CPU wait %g s", mode,
			      (long long)B, idle, busy, num(row, "cpu_wait_s"));
			/* of it at the routing's waits; the CPU tier's wait lies in the rest */
			const double route = num(row, "gpu_idle_route_s");
			CHECK(route > 0 && route <= idle &&
				      idle - route >= num(row, "cpu_wait_s") * (1 - 1e-9),
			      "%s batch %lld: GPU idle %g s, %g at the routing, CPU wait %g s", mode,
			      (long long)B, idle, route, num(row, "cpu_wait_s"));
			/* the CPU tier's finishes queued on the device by default: the stream's
			 * waits counted between their own marks */
			CHECK(!strcmp(mode, "gpu") || idle - route > 0, "%s batch %lld: no idle "
			      "at the CPU tier's end (%g s of %g)", mode, (long long)B, idle - route,
			      idle);
			/* the passes per link price of MOET_STAGE_BALANCE=auto: none here */
			const json_t *ps = json_object_get(row, "price_share");
			CHECK(json_array_size(ps) == 3 &&
				      json_number_value(json_array_get(ps, 0)) == 0 &&
				      json_number_value(json_array_get(ps, 1)) == 0 &&
				      json_number_value(json_array_get(ps, 2)) == 0,
			      "%s batch %lld: price_share not three zeros", mode, (long long)B);
			/* the CPU tier's decode calls finished on the queue by default (one device),
			 * none in gpu mode */
			CHECK(num(row, "queued_share") == (strcmp(mode, "gpu") ? 1 : 0),
			      "%s batch %lld: queued share %g without MOET_TIER_FINISH", mode,
			      (long long)B, num(row, "queued_share"));
			if (!strcmp(mode, "gpu")) {
				CHECK(pairs == 0 && bytes == 0, "gpu mode: no CPU tier work");
				CHECK(json_integer_value(json_object_get(row, "warmup_steps")) == 1,
				      "gpu mode: --warmup's 1 step");
				continue;
			}
			CHECK(pairs > 0, "%s batch %lld: CPU pairs", mode, (long long)B);
			if (!strcmp(mode, "cpu"))
				CHECK(pairs == (double)(B * TOPK * MOE_LAYERS), "cpu mode: every pair of "
				      "the MoE layers on the CPU: %g", pairs);
			/* each MoE layer with CPU work: B rows down, the CPU pairs up */
			CHECK(bytes <= (pairs + MOE_LAYERS * B) * HIDDEN * 4 &&
			      bytes >= (pairs + B) * HIDDEN * 4,
			      "%s batch %lld: %g PCIe bytes for %g pairs", mode, (long long)B, bytes,
			      pairs);
			/* MOET_MICROBATCH=auto's trial passes (both forms, alternating) are warm-up:
			 * the timed steps are the engine's choice. NOTE: not checked through the split
			 * share, which the choice's running means may still flip between steps (seen
			 * under ASan, where the tiny model's two forms time alike) */
			CHECK(json_integer_value(json_object_get(row, "warmup_steps")) >=
				      MOET_MB_TRIAL_PASSES, "%s batch %lld: %lld warm-up steps (the "
			      "auto choice's trial passes timed)", mode, (long long)B,
			      (long long)json_integer_value(json_object_get(row, "warmup_steps")));
			double tc = num(row, "tc_s"), tg = num(row, "tg_s"), bd = num(row,
										  "overlap_bound_s");
			double hi = tc > tg ? tc : tg, lo = tc > tg ? tg : tc;
			CHECK(tc > 0 && fabs(bd - (hi + 0.15 * lo)) <= 1e-12 + 1e-9 * bd,
			      "%s: bound = max + 0.15 min", mode);
			/* the serial run (Tc) timed the row's own decode steps: the same tokens, so
			 * the same pairs on the CPU tier; and, where the row ran every pass in one
			 * (split share 0; the auto choice may split, whose halves read an expert
			 * both route to twice), the same weight bytes */
			CHECK(num(row, "tc_cpu_pairs") == pairs &&
				      (num(row, "split_share") > 0 ||
				       num(row, "tc_cpu_weight_bytes") == num(row, "cpu_weight_bytes")),
			      "%s batch %lld: Tc's run had %g CPU pairs / %g bytes a step, the row %g "
			      "/ %g (split share %g)", mode, (long long)B, num(row, "tc_cpu_pairs"),
			      num(row, "tc_cpu_weight_bytes"), pairs, num(row, "cpu_weight_bytes"),
			      num(row, "split_share"));
			/* the executor's own span of the tier: inside what the driver saw (busy: submit
			 * to the driver's return), with the lag before it; nonzero wherever the tier ran */
			const char *pre[] = { "", "one_pass_" };
			for (int q = 0; q < 2; q++) {
				char k_run[48], k_start[48], k_wake[48], k_wait[48];
				snprintf(k_run, sizeof(k_run), "%scpu_run_s", pre[q]);
				snprintf(k_start, sizeof(k_start), "%scpu_start_lag_s", pre[q]);
				snprintf(k_wake, sizeof(k_wake), "%scpu_wake_lag_s", pre[q]);
				snprintf(k_wait, sizeof(k_wait), "%scpu_wait_s", pre[q]);
				double run = num(row, k_run), lag = num(row, k_start),
				       wake = num(row, k_wake), wait = num(row, k_wait);
				CHECK(run > 0 && lag >= 0 && wake >= 0 && wake <= wait + 1e-9,
				      "%s batch %lld: %s %g, %s %g, %s %g, %s %g", mode, (long long)B,
				      k_run, run, k_start, lag, k_wake, wake, k_wait, wait);
				if (!q)
					CHECK(run + lag <= num(row, "cpu_busy_s") * (1 + 1e-9) + 1e-9,
					      "%s batch %lld: run %g + start lag %g > busy %g", mode,
					      (long long)B, run, lag, num(row, "cpu_busy_s"));
			}
			CHECK(num(row, "tc_cpu_run_s") > 0 && num(row, "tc_cpu_run_s") <= tc * (1 + 1e-9),
			      "%s batch %lld: the serial run's span %g, Tc %g", mode, (long long)B,
			      num(row, "tc_cpu_run_s"), tc);
		}
		const json_t *ready = json_object_get(r, "ready");
		const char *modes[] = { "gpu", "hybrid", "cpu" };
		for (int k = 0; k < 3; k++) {
			const json_t *rm = json_object_get(ready, modes[k]);
			CHECK(num(rm, "ready_s") > 0, "%s: time to ready", modes[k]);
			/* the CPU backend binds in place: nothing is uploaded */
			CHECK(json_is_number(json_object_get(rm, "upload_bytes")) &&
			      num(rm, "upload_bytes") == 0, "%s: upload bytes", modes[k]);
		}
		/* MOET_CPU_RESIDENT's populate (the default): none without a CPU tier, more with
		 * every expert on the CPU than with the hybrid placement's share */
		const double rg = num(json_object_get(ready, "gpu"), "cpu_resident_bytes"),
			     rh = num(json_object_get(ready, "hybrid"), "cpu_resident_bytes"),
			     rcpu = num(json_object_get(ready, "cpu"), "cpu_resident_bytes");
		CHECK(rg == 0 && rh > 0 && rcpu > rh, "resident bytes: gpu %g, hybrid %g, cpu %g",
		      rg, rh, rcpu);
		json_decref(r);
	}
	/* --op-times: a table per decode batch with the model's ops and their sum; embed runs
	 * once per pass, so after the reset its calls per step are exactly 1 */
	setenv("MOET_MICROBATCH", "0", 1); /* one pass per step: embed runs once */
	rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --modes cpu --batches 2 "
			   "--prefill 4 --ctx 4 --steps 2 --no-overlap-check --op-times", model);
	CHECK(rc == 0 && out && strstr(out, "op times, cpu decode at batch 2") &&
	      strstr(out, "attend") && strstr(out, "linear ") && strstr(out, "experts_grouped") == NULL
	      && strstr(out, "sum"), "op times table: exit %d\n%s", rc, out ? out : "");
	const char *em = out ? strstr(out, "  embed ") : NULL;
	double ms = 0, calls = 0;
	CHECK(em && sscanf(em, " embed %lf %lf", &ms, &calls) == 2 && calls == 1.0,
	      "embed once per timed step (prefill and warm-up not counted): %g", calls);
	/* and one table for the prefill of 4 tokens: one pass, so embed once */
	const char *pt = out ? strstr(out, "op times, cpu prefill of 4 tokens") : NULL;
	const char *pe = pt ? strstr(pt, "  embed ") : NULL;
	CHECK(pe && sscanf(pe, " embed %lf %lf", &ms, &calls) == 2 && calls == 1.0 &&
	      strstr(pt, "attend"), "prefill op times: embed once (%g)", calls);
	free(out);
	out = NULL;
	/* two micro-batches timed: the timed backend offers one stream (the default's two would
	 * take the inner backend's stream ops, which the wrapper's callers cannot reach), so each
	 * step embeds twice, one half after the other */
	setenv("MOET_MICROBATCH", "1", 1);
	rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --modes cpu --batches 2 "
			   "--prefill none --ctx 4 --steps 2 --no-overlap-check --op-times", model);
	em = out ? strstr(out, "  embed ") : NULL;
	CHECK(rc == 0 && em && sscanf(em, " embed %lf %lf", &ms, &calls) == 2 && calls == 2.0,
	      "op times of two micro-batches: exit %d, embed %g per step\n%s", rc, calls,
	      out ? out : "");
	unsetenv("MOET_MICROBATCH");
	free(out);
	/* MOET_STAGE_BALANCE=auto: the overlap check's serial run replays the row's price arm
	 * step by step (moet_model_force_price), so that Tc and Tg time the row's own split of
	 * the cold experts between the CPU tier and the link. The prices taken in turn
	 * (MOET_STAGE_TEST_CYCLE) make a row of mixed prices, as the running means do on a GPU:
	 * two steps, two of the three prices, and the serial run, later in the turn, would take
	 * another two without the replay. It must have the row's shares, staged and CPU-tier
	 * pairs ("even" hardware figures: prices 1 and 2 stage some of a call's experts) */
	char hwp[600], js4[600];
	moet_test_hw_even(dir, hwp, sizeof(hwp));
	snprintf(js4, sizeof(js4), "%s/e2e-auto.json", dir);
	setenv("MOET_HARDWARE", hwp, 1);
	setenv("MOET_STAGE_BALANCE", "auto", 1);
	setenv("MOET_STAGE_TEST_CYCLE", "1", 1);
	setenv("MOET_MICROBATCH", "0", 1); /* one pass: the pick sees the row's calls whole */
	out = NULL;
	rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --modes hybrid --placement %s "
			   "--batches 3 --prefill none --ctx 4 --steps 2 --json %s", model, place,
			   js4);
	CHECK(rc == 0, "bench e2e, auto: exit %d\n%s", rc, out ? out : "");
	free(out);
	json_t *rau = json_load_file(js4, 0, NULL);
	const json_t *sau = json_array_get(json_object_get(rau, "steps"), 0);
	const json_t *ps = json_object_get(sau, "price_share"),
		     *tps = json_object_get(sau, "tc_price_share");
	int mixed = 0, same = json_array_size(ps) == 3 && json_array_size(tps) == 3;
	for (size_t a = 0; a < 3; a++) {
		mixed += json_number_value(json_array_get(ps, a)) > 0;
		same = same && json_number_value(json_array_get(ps, a)) ==
				       json_number_value(json_array_get(tps, a));
	}
	CHECK(sau && mixed >= 2 && num(sau, "staged_pairs") > 0 && num(sau, "cpu_pairs") > 0,
	      "auto: the row at %d prices, %g pairs staged, %g on the CPU tier a step", mixed,
	      num(sau, "staged_pairs"), num(sau, "cpu_pairs"));
	/* the staged copies: their bytes and own time a step, in the row and the serial run */
	CHECK(num(sau, "stage_bytes") > 0 && num(sau, "stage_link_s") > 0 &&
		      num(sau, "tc_stage_link_s") > 0,
	      "auto: %g bytes staged a step in %g s of copies, the serial run's copies %g s",
	      num(sau, "stage_bytes"), num(sau, "stage_link_s"), num(sau, "tc_stage_link_s"));
	CHECK(same && num(sau, "tc_staged_pairs") == num(sau, "staged_pairs") &&
		      num(sau, "tc_cpu_pairs") == num(sau, "cpu_pairs") &&
		      num(sau, "tc_stage_bytes") == num(sau, "stage_bytes"),
	      "auto: the serial run at prices [%g %g %g] with %g staged and %g CPU-tier pairs a "
	      "step, the row at [%g %g %g] with %g and %g",
	      json_number_value(json_array_get(tps, 0)), json_number_value(json_array_get(tps, 1)),
	      json_number_value(json_array_get(tps, 2)), num(sau, "tc_staged_pairs"),
	      num(sau, "tc_cpu_pairs"), json_number_value(json_array_get(ps, 0)),
	      json_number_value(json_array_get(ps, 1)), json_number_value(json_array_get(ps, 2)),
	      num(sau, "staged_pairs"), num(sau, "cpu_pairs"));
	json_decref(rau);
	unsetenv("MOET_HARDWARE");
	unsetenv("MOET_STAGE_BALANCE");
	unsetenv("MOET_STAGE_TEST_CYCLE");
	unsetenv("MOET_MICROBATCH");
	/* --profile-out: the routing of the timed decode steps, every MoE layer top_k per token,
	 * however many untimed warm-up steps come first (--warmup: 1 by default, 0, 5) */
	char prof[600], jsw[600];
	snprintf(prof, sizeof(prof), "%s/steps-profile.json", dir);
	snprintf(jsw, sizeof(jsw), "%s/e2e-warmup.json", dir);
	static const char *const warm[3] = { "", "--warmup 0", "--warmup 5" };
	static const int warm_n[3] = { 1, 0, 5 };
	moet_profile *pf = NULL;
	for (int w = 0; w < 3; w++) {
		rc = moet_test_cli(NULL, "bench e2e --model %s --device cpu --modes cpu --batches "
				   "2,3 --prefill 4 --ctx 4 --steps 2 --no-overlap-check %s "
				   "--profile-out %s --json %s", model, warm[w], prof, jsw);
		CHECK(rc == 0 && moet_profile_load(prof, &pf) == 0, "profile-out %s: exit %d, %s",
		      warm[w], rc, moet_errmsg());
		json_t *rw = json_load_file(jsw, 0, NULL);
		CHECK(rw && json_integer_value(json_object_get(rw, "decode_warmup_steps")) ==
				    warm_n[w], "%s: the record's decode_warmup_steps", warm[w]);
		json_decref(rw);
		for (int64_t l = 0; pf && l < pf->n_layers; l++) {
			uint64_t sum = 0;
			for (int64_t e = 0; e < pf->n_experts; e++)
				sum += pf->counts[moet_profile_at(pf, MOET_PROFILE_DECODE, l) + e];
			uint64_t want = pf->is_moe[l] ? (uint64_t)(TOPK * (2 + 3) * 2) : 0;
			CHECK(sum == want, "%s layer %lld: %llu decode routings, want %llu (top_k x "
			      "tokens of the timed steps)", warm[w], (long long)l,
			      (unsigned long long)sum, (unsigned long long)want);
		}
		moet_profile_free(pf);
		pf = NULL;
	}
	moet_test_cli_expect("bench e2e --model /nonexistent --warmup -1", 1, "--warmup: '-1'");
	moet_test_cli_expect("bench e2e --model /nonexistent --warmup 2x", 1, "--warmup: '2x'");

	/* --predict-profile: each measured decode step beside the cost model's, the hybrid's
	 * equal to `plan --predict` of the same placement, profile and batch */
	char js3[600];
	snprintf(js3, sizeof(js3), "%s/e2e-pred.json", dir);
	rc = moet_test_cli(NULL, "bench e2e --model %s --device cpu --placement %s --batches 2,3 "
			   "--prefill 4 --ctx 4 --steps 2 --no-overlap-check --predict-profile %s "
			   "--json %s", model, place, prof, js3);
	char *pj = NULL;
	int rc2 = moet_test_cli(&pj, "plan --predict --model %s --placement %s --profile %s "
				"--batch 2,3 --json --layer-max means", model, place, prof);
	json_t *r3 = json_load_file(js3, 0, NULL), *p3 = pj ? json_loads(pj, 0, NULL) : NULL;
	CHECK(rc == 0 && rc2 == 0 && r3 && p3, "predict runs: %d %d", rc, rc2);
	int matched = 0, matched1 = 0;
	size_t qi;
	const json_t *qw;
	json_array_foreach(json_object_get(r3, "predictions"), qi, qw) {
		const char *md = json_string_value(json_object_get(qw, "mode"));
		int64_t B = json_integer_value(json_object_get(qw, "batch"));
		double pred = num(qw, "predicted_step_s"), meas = num(qw, "measured_step_s");
		CHECK(pred > 0 && meas > 0 && fabs(num(qw, "error") - (pred - meas) / meas) < 1e-9,
		      "prediction row %s %lld", md ? md : "-", (long long)B);
		/* both forms (batch >= 2, one device): the chosen one is the faster */
		const double p1 = num(qw, "predicted_one_pass_s"), p2 = num(qw,
								     "predicted_two_halves_s");
		const char *form = json_string_value(json_object_get(qw, "predicted_form"));
		const double split = num(qw, "measured_split_share");
		/* the one-pass form with --layer-max spread: never below the means' */
		const double p1s = num(qw, "predicted_one_pass_spread_s");
		CHECK(p1s >= p1, "row %s %lld: spread %g below the means %g", md ? md : "-",
		      (long long)B, p1s, p1);
		CHECK(p1 > 0 && p2 > 0 && pred == fmin(p1, p2) && form &&
		      !strcmp(form, p2 < p1 ? "two halves" : "one pass") && split >= 0 &&
		      split <= 1,
		      "forms of row %s %lld: one pass %g, two halves %g, chosen %s %g, split %g",
		      md ? md : "-", (long long)B, p1, p2, form ? form : "-", pred, split);
		size_t pi;
		const json_t *pr;
		json_array_foreach(json_object_get(p3, "predictions"), pi, pr)
			if (md && !strcmp(md, "hybrid") &&
			    json_integer_value(json_object_get(pr, "batch")) == B) {
				/* printed digits */
				matched += fabs(num(pr, "chosen_ms") / 1e3 - pred) <= 1e-6 * pred;
				matched1 += fabs(num(pr, "one_pass_ms") / 1e3 - p1) <= 1e-6 * p1;
				/* plan --predict's is means; its spread_ms is 0 */
				matched1 -= num(pr, "spread_ms") != 0;
			}
	}
	CHECK(matched == 2 && matched1 == 2, "hybrid predictions (chosen, one pass) equal plan "
	      "--predict at both batches: %d %d", matched, matched1);
	json_decref(r3);
	json_decref(p3);
	free(pj);
	/* MOET_TIER_FINISH=wait: no CPU-tier call of the hybrid row finished on the queue */
	setenv("MOET_TIER_FINISH", "wait", 1);
	rc = moet_test_cli(NULL, "bench e2e --model %s --device cpu --placement %s --modes "
			   "hybrid --batches 2 --prefill none --ctx 4 --steps 2 --no-overlap-check "
			   "--json %s", model, place, js3);
	unsetenv("MOET_TIER_FINISH");
	json_t *rq = json_load_file(js3, 0, NULL);
	const json_t *sq = json_array_get(json_object_get(rq, "steps"), 0);
	CHECK(rc == 0 && sq && num(sq, "queued_share") == 0, "MOET_TIER_FINISH=wait: rc %d, "
	      "queued share %g", rc, sq ? num(sq, "queued_share") : -1.0);
	json_decref(rq);
	/* MOET_MB_MERGE=1 with two micro-batches: every split step's MoE layers each make one
	 * merged GPU expert call (the record's merged_calls per step), on two streams (the default
	 * of split decode passes, the CPU backend's test double); the forced form holds for every
	 * batch, also after the overlap check's one-pass runs of the first */
	char jsm[600];
	snprintf(jsm, sizeof(jsm), "%s/e2e-merge.json", dir);
	setenv("MOET_MICROBATCH", "1", 1);
	setenv("MOET_MB_MERGE", "1", 1);
	rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --placement %s --modes hybrid "
			   "--batches 2,3 --prefill none --ctx 4 --steps 2 --json %s", model, place,
			   jsm);
	unsetenv("MOET_MB_MERGE");
	unsetenv("MOET_MICROBATCH");
	CHECK(rc == 0, "merged: exit %d\n%s", rc, out ? out : "");
	free(out);
	json_t *r4 = json_load_file(jsm, 0, NULL);
	for (size_t i = 0; i < 2; i++) {
		const json_t *st4 = json_array_get(json_object_get(r4, "steps"), i);
		CHECK(st4 && num(st4, "split_share") == 1 &&
			      num(st4, "merged_calls") == (double)MOE_LAYERS &&
			      num(st4, "stream_share") == 1 && num(st4, "polled_share") == 0,
		      "merged, batch %zu: split share %g, %g merged calls per step (want %lld), "
		      "stream share %g, polled %g", i, st4 ? num(st4, "split_share") : -1.0,
		      st4 ? num(st4, "merged_calls") : -1.0, (long long)MOE_LAYERS,
		      st4 ? num(st4, "stream_share") : -1.0, st4 ? num(st4, "polled_share") : -1.0);
	}
	json_decref(r4);
	/* two micro-batches unmerged on one device: by default on two streams (the CPU
	 * backend's test double), and polled with MOET_MB_POLL=1 */
	for (int pv = 0; pv < 2; pv++) {
		setenv("MOET_MICROBATCH", "1", 1);
		if (pv)
			setenv("MOET_MB_POLL", "1", 1);
		rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --placement %s --modes "
				   "hybrid --batches 2,3 --prefill none --ctx 4 --steps 2 --json %s",
				   model, place, jsm);
		unsetenv("MOET_MB_POLL");
		unsetenv("MOET_MICROBATCH");
		CHECK(rc == 0, "streams%s: exit %d\n%s", pv ? ", polled" : "", rc, out ? out : "");
		free(out);
		json_t *r5 = json_load_file(jsm, 0, NULL);
		for (size_t i = 0; i < 2; i++) {
			const json_t *st5 = json_array_get(json_object_get(r5, "steps"), i);
			CHECK(st5 && num(st5, "split_share") == 1 && num(st5, "stream_share") == 1 &&
				      num(st5, "polled_share") == pv,
			      "streams%s, batch %zu: split %g, streams %g, polled %g",
			      pv ? ", polled" : "", i, st5 ? num(st5, "split_share") : -1.0,
			      st5 ? num(st5, "stream_share") : -1.0,
			      st5 ? num(st5, "polled_share") : -1.0);
		}
		json_decref(r5);
	}
	/* --ram-budgets: decode again behind the NVMe tier, a row per budget and batch */
	char js2[600];
	snprintf(js2, sizeof(js2), "%s/e2e-ram.json", dir);
	rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --placement %s --modes hybrid "
			   "--batches 2 --prefill 4 --ctx 4 --steps 2 --no-overlap-check "
			   "--ram-budgets 100%%,25%% --json %s", model, place, js2);
	CHECK(rc == 0 && out && strstr(out, "RAM budget 25%") && strstr(out, "NVMe tier: hit rate"),
	      "ram budgets: exit %d\n%s", rc, out ? out : "");
	free(out);
	json_t *r2 = json_load_file(js2, 0, NULL);
	int found = 0;
	size_t ri;
	const json_t *rw;
	json_array_foreach(json_object_get(r2, "results"), ri, rw) {
		const char *nm = json_string_value(json_object_get(rw, "name"));
		found += nm && (!strcmp(nm, "decode-hybrid-ram100%") ||
				!strcmp(nm, "decode-hybrid-ram25%")) && num(rw, "median_s") > 0;
		/* decode rows keep their mean step (the throughput's): within [min, max] */
		if (nm && !strncmp(nm, "decode-", 7))
			CHECK(num(rw, "mean_s") >= num(rw, "min_s") &&
			      num(rw, "mean_s") <= num(rw, "max_s") && num(rw, "min_s") > 0,
			      "%s: mean %g outside [%g, %g]", nm, num(rw, "mean_s"),
			      num(rw, "min_s"), num(rw, "max_s"));
	}
	CHECK(found == 2, "rows of both budgets: %d", found);
	json_decref(r2);
	moet_test_cli_expect("bench e2e --model /tmp --ram-budgets 1,2,3,4,5,6,7,8,9", 1,
			     "at most 8 budgets");
	moet_test_cli_expect("bench e2e --model /nonexistent --device cpu --modes cpu --batches 1 "
			     "--prefill 4", 1, "/nonexistent");
	char args[1024];
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --modes hybrid", model);
	moet_test_cli_expect(args, 1, "needs --placement");
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --batches 0", model);
	moet_test_cli_expect(args, 1, "--batches: 0 is not in");
	snprintf(args, sizeof(args), "bench e2e --model %s --modes gpu,tpu", model);
	moet_test_cli_expect(args, 1, "--modes: 'tpu'");
	free(dir);
	return moet_test_done("test_bench_e2e_cli");
}
