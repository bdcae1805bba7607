/*
 * serve_bench_rec.c: the record (docs/benchmarks.md's schema) and the table of `bench serve`
 * (serve_bench.c measures; docs/serve.md says what each figure compares).
 *
 * Rows per stream count N (ceiling names carry N; N0 = the smallest count):
 *   decode-step-bare          N decodes in lockstep            ceiling decode-step-bare-N, 1
 *   decode-step-replay        the served steps, run bare       ceiling decode-step-replay-N, 1
 *   decode-step-served        served wall / steps              vs decode-step-replay-N
 *   decode-step-served-full   served steps of N decodes        vs decode-step-bare-N
 *                             (only when the served run had such steps)
 *   tokens-per-s-bare / -served   scaling against N0           ceiling tokens-per-s-*-N0
 *   with a placement: tokens-per-s-bare-vs-predicted (N / bare step) and
 *   tokens-per-s-served-vs-predicted (N / served full step): the predicted steps are N
 *   decodes, so both compare steps of that composition
 */
#include <stdio.h>
#include <string.h>

#include "moet_err.h"
#include "serve_bench_int.h"

/* A row whose ratio compares tokens/s; the row carries its own "tokens_per_s". */
static int tps_row(json_t *rec, const char *name, int n, moet_bench_stats st, const char *ceil,
		   double ratio, double tps)
{
	moet_bench_row r = { .name = name, .tokens = n, .st = st, .ceiling = ceil, .ratio = ratio };
	int rc = moet_bench_add_row(rec, &r);
	json_t *res = json_object_get(rec, "results");
	if (!rc)
		json_object_set_new(json_array_get(res, json_array_size(res) - 1), "tokens_per_s",
				    json_real(tps));
	return rc;
}

static json_t *doubles(const double *v, int n)
{
	json_t *a = json_array();
	for (int i = 0; a && i < n; i++)
		json_array_append_new(a, json_real(v[i]));
	return a;
}

static json_t *counts(const uint64_t *v, int n)
{
	json_t *a = json_array();
	for (int i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer((json_int_t)v[i]));
	return a;
}

/* The step rows of run r. */
static int step_rows(json_t *rec, const sb_run *r)
{
	char cb[64], cr[64];
	snprintf(cb, sizeof(cb), "decode-step-bare-%d", r->n);
	snprintf(cr, sizeof(cr), "decode-step-replay-%d", r->n);
	moet_bench_row rows[4] = {
		{ .name = "decode-step-bare", .tokens = r->n, .st = r->bare, .ceiling = cb,
		  .ratio = 1 },
		{ .name = "decode-step-replay", .tokens = r->n, .st = r->replay, .ceiling = cr,
		  .ratio = 1 },
		{ .name = "decode-step-served", .tokens = r->n, .st = r->served, .ceiling = cr,
		  .ratio = r->served.median_s / r->replay.median_s },
		{ .name = "decode-step-served-full", .tokens = r->n, .st = r->full, .ceiling = cb,
		  .ratio = r->full.median_s / r->bare.median_s },
	};
	int rc = moet_bench_add_ceiling(rec, cb, r->bare.median_s, "s");
	if (!rc)
		rc = moet_bench_add_ceiling(rec, cr, r->replay.median_s, "s");
	for (int k = 0; k < (r->full_reps ? 4 : 3) && !rc; k++)
		rc = moet_bench_add_row(rec, &rows[k]);
	return rc;
}

/* The prediction's rows and object for run r (into j). */
static int pred_rows(json_t *rec, json_t *j, const sb_run *r, int n_devices, const sb_bw *bw)
{
	const sb_pred *p = &r->pred;
	const int nt = 1 + n_devices;
	double tbw[SB_MAX_TIERS], bound[SB_MAX_TIERS];
	char cp[64];
	for (int k = 0; k < nt; k++) {
		tbw[k] = k ? bw->dev_GBps : bw->cpu_GBps;
		bound[k] = p->bound_tier_steps[k];
	}
	snprintf(cp, sizeof(cp), "predicted-tokens-per-s-%d", r->n);
	const double full_tps = r->full_reps ? r->n / r->full.median_s : 0;
	const double mb = r->bare_tps / p->tokens_per_s, ms = full_tps / p->tokens_per_s;
	int rc = moet_bench_add_ceiling(rec, cp, p->tokens_per_s, "tokens/s");
	if (!rc)
		rc = tps_row(rec, "tokens-per-s-bare-vs-predicted", r->n, r->bare, cp, mb,
			     r->bare_tps);
	if (!rc && r->full_reps)
		rc = tps_row(rec, "tokens-per-s-served-vs-predicted", r->n, r->full, cp, ms,
			     full_tps);
	if (rc)
		return rc;
	json_t *o = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:o, s:o, s:o, s:o, s:O}",
			      "resident_step_s", p->resident_step_s, "resident_expert_s",
			      p->resident_expert_s, "nonexpert_s", p->nonexpert_s,
			      "predicted_step_s", p->step_s, "predicted_tokens_per_s",
			      p->tokens_per_s, "bare_over_predicted", mb, "device_ceiling",
			      bw->dev_ceiling, "tier_GBps", doubles(tbw, nt), "mean_bytes",
			      doubles(p->mean_bytes, nt), "mean_distinct",
			      doubles(p->mean_distinct, nt), "bound_steps", doubles(bound, nt),
			      "steps", r->pred_steps);
	if (!o)
		return moet_err(MOET_ENOMEM, "bench serve: record");
	json_object_set_new(o, "served_full_over_predicted", r->full_reps ? json_real(ms)
									   : json_null());
	json_object_set_new(j, "prediction", o);
	return 0;
}

/* The figures of run r (its scaling xb, xs against the base). */
static json_t *run_json(const sb_run *r, double xb, double xs)
{
	json_t *j = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
			      "streams", r->n, "bare_step_s", r->bare.median_s, "replay_step_s",
			      r->replay.median_s, "served_step_s", r->served.median_s,
			      "overhead_share", r->served.median_s / r->replay.median_s - 1,
			      "overhead_s_per_step", r->served.median_s - r->replay.median_s,
			      "served_forward_s_per_step", r->fwd, "served_forward_over_replay",
			      r->fwd_over_replay, "outside_forward_s_per_step", r->outside_s,
			      "engine_non_forward_share", r->share);
	json_t *k = json_pack("{s:f, s:f, s:f, s:f, s:f, s:I, s:o, s:i, s:i, s:b, s:i, s:b, "
			      "s:{s:I, s:I, s:I}, s:i}",
			      "bare_tokens_per_s", r->bare_tps, "replay_tokens_per_s",
			      r->replay_tps, "served_tokens_per_s", r->served_tps, "bare_scaling",
			      xb, "served_scaling", xs, "steps", (json_int_t)r->steps,
			      "batch_hist", counts(r->hist, r->n + 1), "prefill_steps",
			      r->prefill_steps, "full_steps", r->full_steps, "prompts_same",
			      r->prompts_same, "distinct_prompts", r->distinct, "tokens_same",
			      r->tokens_same, "split_passes", "bare", (json_int_t)r->split[0],
			      "served", (json_int_t)r->split[1], "replay", (json_int_t)r->split[2],
			      "errors", r->errors);
	if (!j || !k || json_object_update(j, k)) {
		json_decref(j);
		json_decref(k);
		return NULL;
	}
	json_decref(k);
	json_object_set_new(j, "full_step_s", r->full_reps ? json_real(r->full.median_s)
							    : json_null());
	json_object_set_new(j, "bare_step_min_s", json_real(r->bare_min_s));
	json_object_set_new(j, "full_step_min_s", r->full_reps ? json_real(r->full_min_s)
								: json_null());
	json_object_set_new(j, "full_forward_s", r->full_reps ? json_real(r->full_fwd.median_s)
							       : json_null());
	if (r->last_steps)
		json_object_set(j, "last_rep_steps", r->last_steps);
	json_object_set_new(j, "full_overhead_share", r->full_reps ?
			    json_real(r->full.median_s / r->bare.median_s - 1) : json_null());
	return j;
}

int sb_record(json_t *rec, json_t *jruns, const sb_run *runs, int n_runs, const sb_run *base,
	      const int16_t *owner, int n_devices, const sb_bw *bw)
{
	char ct[64], cs[64];
	snprintf(ct, sizeof(ct), "tokens-per-s-bare-%d", base->n);
	snprintf(cs, sizeof(cs), "tokens-per-s-served-%d", base->n);
	int rc = moet_bench_add_ceiling(rec, ct, base->bare_tps, "tokens/s");
	if (!rc)
		rc = moet_bench_add_ceiling(rec, cs, base->served_tps, "tokens/s");
	for (int i = 0; i < n_runs && !rc; i++) {
		const sb_run *r = &runs[i];
		const double xb = r->bare_tps / base->bare_tps, xs = r->served_tps / base->served_tps;
		if ((rc = step_rows(rec, r)) ||
		    (rc = tps_row(rec, "tokens-per-s-bare", r->n, r->bare, ct, xb, r->bare_tps)) ||
		    (rc = tps_row(rec, "tokens-per-s-served", r->n, r->served, cs, xs,
				  r->served_tps)))
			break;
		json_t *j = run_json(r, xb, xs);
		if (!j || json_array_append_new(jruns, j)) {
			rc = moet_err(MOET_ENOMEM, "bench serve: record");
			break;
		}
		if (owner)
			rc = pred_rows(rec, j, r, n_devices, bw);
	}
	return rc;
}

void sb_table(FILE *f, const sb_run *runs, int n_runs, const sb_run *base, const int16_t *owner,
	      const char *placement)
{
	fprintf(f, "%7s %9s %9s %9s %9s %9s %9s %10s %6s %11s %6s", "streams", "bare_ms",
		"replay_ms", "served_ms", "overhead", "full_ms", "full_ovh", "bare_tok/s", "x",
		"served_tok/s", "x");
	if (owner)
		fprintf(f, " %9s %10s %9s %9s", "pred_ms", "pred_tok/s", "bare/pred",
			"full/pred");
	fputc('\n', f);
	for (int i = 0; i < n_runs; i++) {
		const sb_run *r = &runs[i];
		fprintf(f, "%7d %9.3f %9.3f %9.3f %8.1f%%", r->n, r->bare.median_s * 1e3,
			r->replay.median_s * 1e3, r->served.median_s * 1e3,
			(r->served.median_s / r->replay.median_s - 1) * 100);
		if (r->full_reps)
			fprintf(f, " %9.3f %8.1f%%", r->full.median_s * 1e3,
				(r->full.median_s / r->bare.median_s - 1) * 100);
		else
			fprintf(f, " %9s %9s", "-", "-");
		fprintf(f, " %10.1f %6.2f %11.1f %6.2f", r->bare_tps, r->bare_tps / base->bare_tps,
			r->served_tps, r->served_tps / base->served_tps);
		if (owner) {
			fprintf(f, " %9.3f %10.1f %9.3f", r->pred.step_s * 1e3, r->pred.tokens_per_s,
				r->bare_tps / r->pred.tokens_per_s);
			if (r->full_reps)
				fprintf(f, " %9.3f", r->n / r->full.median_s / r->pred.tokens_per_s);
			else
				fprintf(f, " %9s", "-");
		}
		fputc('\n', f);
	}
	fprintf(f, "bare: N decodes in lockstep; replay: the served run's steps run bare (same "
		"prompts, batches, work); overhead: served / replay - 1 (target <= 3%% at 16); "
		"full: served steps of N decodes, start to next start, against bare; x: tokens/s "
		"against %d stream%s (target >= 4 at 16, every expert resident)\n", base->n,
		base->n == 1 ? "" : "s");
	for (int i = 0; i < n_runs; i++) {
		const sb_run *r = &runs[i];
		fprintf(f, "%d streams: %llu served steps (%d with prefill, %d full), batch sizes",
			r->n, (unsigned long long)r->steps, r->prefill_steps, r->full_steps);
		for (int k = 0; k <= r->n; k++)
			if (r->hist[k])
				fprintf(f, " %d:%llu", k, (unsigned long long)r->hist[k]);
		fprintf(f, "; forward inside the server %.3f ms per step (%.3f x the same calls "
			"bare), outside it %.3f ms; engine outside forward %.1f%% of its step; "
			"prompts %s (%d distinct), tokens %s; %d errors\n", r->fwd * 1e3,
			r->fwd_over_replay, r->outside_s * 1e3, r->share * 100,
			r->prompts_same ? "same" : "DIFFER", r->distinct,
			r->tokens_same ? "same" : "DIFFER", r->errors);
	}
	if (owner)
		fprintf(f, "pred: max over tiers (touched expert bytes / tier bandwidth) + the "
			"all-resident step's non-expert time, placement %s\n", placement ?
			placement : "(owner table)");
}
