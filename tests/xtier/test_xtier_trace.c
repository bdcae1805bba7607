/*
 * test_xtier_trace.c: the NVMe tier's lookup trace and the bounds on it (moet_xtier.h), on a
 * generated checkpoint with skewed routing, CPU backend (every routed expert in the tier).
 *   - the trace = the lookups the routing implies, rebuilt here from the route observer: per
 *     MoE layer call the distinct experts of its tokens, ascending (acquire's order); its
 *     length = lookups; trace_hits = hits + late hits;
 *   - the cap: trace_cap 10 keeps the first 10 of the same sequence, trace_cut the rest, and
 *     the bounds cover those 10; a reset restarts it (start contents = the resident experts);
 *   - on the tier's own trace: reads (demand and prefetch) >= MIN's misses from the tier's
 *     start; with prefetch off the measured hits <= MIN's; MIN from any start >= MIN; the
 *     static hits = the top-n_slots counts of the rebuilt trace (counted here);
 *   - `bench e2e --device cpu --modes cpu ... --ram-budgets 50%`: with the all-in-RAM rows the
 *     record's disk bound = the decode-cpu row's median + misses per step x slot bytes /
 *     (bytes read / wait), recomputed here from the record's counters; with --ram-only the
 *     bounds are printed and recorded without the step bound.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"
#include "moet_xtier.h"

#define MAXT 100000

/* The lookups the routing implies: per layer call (consecutive events of one layer) the
 * distinct experts, ascending. */
typedef struct rebuild {
	int64_t E;
	int64_t layer;          /* of the open group, -1 none */
	uint8_t seen[1024];
	int32_t keys[MAXT];
	int64_t n;
} rebuild;

static void flush(rebuild *r)
{
	for (int64_t e = 0; r->layer >= 0 && e < r->E; e++)
		if (r->seen[e] && r->n < MAXT)
			r->keys[r->n++] = (int32_t)(r->layer * r->E + e);
	memset(r->seen, 0, sizeof(r->seen));
	r->layer = -1;
}

static void on_route(void *ctx, const moet_route_event *ev)
{
	rebuild *r = ctx;
	if (ev->layer != r->layer)
		flush(r);
	r->layer = ev->layer;
	for (int i = 0; i < ev->top_k; i++)
		r->seen[ev->ids[i]] = 1;
}

static int cmp_u64_desc(const void *a, const void *b)
{
	uint64_t p = *(const uint64_t *)a, q = *(const uint64_t *)b;
	return p < q ? 1 : p > q ? -1 : 0;
}

/* One tier of `slots` slots, the ragged run, every check on its trace. */
static void tier_case(moet_model *m, int64_t slots, int no_prefetch, int64_t cap)
{
	const moet_config *c = moet_model_config(m);
	const int64_t E = c->n_routed_experts, L = c->num_hidden_layers;
	moet_xtier_stats plan;
	CHECK(moet_xtier_plan(m, &plan) == 0, "plan: %s", moet_errmsg());
	moet_xtier_opts o = { .ram_budget_bytes = (size_t)slots * plan.slot_bytes,
			      .no_prefetch = no_prefetch, .trace_cap = cap };
	CHECK(moet_model_set_xtier(m, &o) == 0, "set: %s", moet_errmsg());
	moet_xtier *x = moet_model_xtier(m);
	if (!x)
		return;
	moet_xtier_stats st0;
	moet_xtier_stats_get(x, &st0);
	CHECK(st0.trace_len == 0 && st0.trace_start_resident == st0.n_slots,
	      "fresh tier: trace %llu, start resident %lld of %lld (warm fill)",
	      (unsigned long long)st0.trace_len, (long long)st0.trace_start_resident,
	      (long long)st0.n_slots);
	rebuild *rb = calloc(1, sizeof(*rb));
	rb->E = E;
	rb->layer = -1;
	moet_model_set_route_observer(m, on_route, rb);
	float *lg = malloc((size_t)(3 * 5 * c->vocab_size) * sizeof(float));
	CHECK(moet_test_ragged_run(m, 3, 4, 1, lg) == 0, "run: %s", moet_errmsg());
	moet_model_set_route_observer(m, NULL, NULL);
	flush(rb);
	moet_xtier_stats st;
	CHECK(moet_xtier_stats_bounds(x, &st) == 0 && st.bounds_valid, "bounds: %s",
	      moet_errmsg());
	int64_t tn = 0;
	const int32_t *tr = moet_xtier_trace(x, &tn);
	const uint64_t want_len = cap > 0 && (uint64_t)cap < st.lookups ? (uint64_t)cap
									 : st.lookups;
	CHECK(rb->n == (int64_t)st.lookups, "slots %lld: routing implies %lld lookups, tier "
	      "counted %llu", (long long)slots, (long long)rb->n, (unsigned long long)st.lookups);
	CHECK((uint64_t)tn == want_len && st.trace_len == want_len &&
	      st.trace_cut == st.lookups - want_len, "slots %lld cap %lld: trace %lld (%llu), "
	      "cut %llu of %llu lookups", (long long)slots, (long long)cap, (long long)tn,
	      (unsigned long long)st.trace_len, (unsigned long long)st.trace_cut,
	      (unsigned long long)st.lookups);
	int64_t first_bad = -1;
	for (int64_t i = 0; i < tn && i < rb->n && first_bad < 0; i++)
		if (tr[i] != rb->keys[i])
			first_bad = i;
	CHECK(first_bad < 0, "slots %lld: trace entry %lld is %d, the routing's %d",
	      (long long)slots, (long long)first_bad, first_bad >= 0 ? tr[first_bad] : 0,
	      first_bad >= 0 ? rb->keys[first_bad] : 0);
	if (!st.trace_cut)
		CHECK(st.trace_hits == st.hits + st.late_hits, "trace hits %llu, hits %llu + late "
		      "%llu", (unsigned long long)st.trace_hits, (unsigned long long)st.hits,
		      (unsigned long long)st.late_hits);
	/* the properties on the tier's own trace */
	const uint64_t opt_miss = st.trace_len - st.opt_hits;
	CHECK(st.trace_fetches >= opt_miss, "slots %lld: %llu reads below MIN's %llu misses",
	      (long long)slots, (unsigned long long)st.trace_fetches,
	      (unsigned long long)opt_miss);
	if (no_prefetch)
		CHECK(st.trace_hits <= st.opt_hits, "slots %lld, demand only: %llu hits above "
		      "MIN's %llu", (long long)slots, (unsigned long long)st.trace_hits,
		      (unsigned long long)st.opt_hits);
	CHECK(st.opt_any_hits >= st.opt_hits && st.opt_hits <= st.trace_len,
	      "MIN any start %llu, from the tier's %llu", (unsigned long long)st.opt_any_hits,
	      (unsigned long long)st.opt_hits);
	uint64_t *cnt = calloc((size_t)(L * E), sizeof(*cnt)), want_static = 0;
	for (int64_t i = 0; i < (int64_t)want_len; i++)
		cnt[rb->keys[i]]++;
	qsort(cnt, (size_t)(L * E), sizeof(*cnt), cmp_u64_desc);
	for (int64_t i = 0; i < st.n_slots && i < L * E; i++)
		want_static += cnt[i];
	CHECK(st.static_hits == want_static, "static %llu, counted %llu",
	      (unsigned long long)st.static_hits, (unsigned long long)want_static);
	printf("slots %3lld prefetch %-3s cap %7lld: %5llu lookups, traced %5llu: hits %5llu, "
	       "MIN %5llu (any start %5llu), static %5llu; %4llu reads >= MIN misses %4llu\n",
	       (long long)st.n_slots, no_prefetch ? "off" : "on", (long long)cap,
	       (unsigned long long)st.lookups, (unsigned long long)st.trace_len,
	       (unsigned long long)st.trace_hits, (unsigned long long)st.opt_hits,
	       (unsigned long long)st.opt_any_hits, (unsigned long long)st.static_hits,
	       (unsigned long long)st.trace_fetches, (unsigned long long)opt_miss);
	/* a reset restarts the trace from the resident experts */
	moet_xtier_stats_reset(x);
	moet_xtier_stats_get(x, &st);
	int64_t res = 0;
	for (int64_t l = 0; l < L; l++)
		for (int64_t e = 0; e < E; e++)
			res += moet_xtier_is_resident(x, l, e);
	moet_xtier_trace(x, &tn);
	CHECK(tn == 0 && st.trace_len == 0 && st.trace_cut == 0 && st.trace_fetches == 0 &&
	      st.trace_start_resident == res, "reset: trace %lld, start %lld, resident %lld",
	      (long long)tn, (long long)st.trace_start_resident, (long long)res);
	free(cnt);
	free(lg);
	free(rb);
	moet_model_set_ram_budget(m, 0, NULL);
}

static double num(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static void bench_case(const char *dir, int ram_only)
{
	char js[700];
	snprintf(js, sizeof(js), "%s/e2e-%d.json", dir, ram_only);
	char *out = NULL;
	int rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --modes cpu --batches 1,2 "
			       "--prefill none --ctx 4 --steps 3 --no-overlap-check --ram-budgets "
			       "50%% %s --json %s", dir, ram_only ? "--ram-only" : "", js);
	CHECK(rc == 0 && out && strstr(out, "NVMe tier: hindsight over ") &&
	      strstr(out, "Belady/MIN") && strstr(out, "NVMe tier: disk bound: ") &&
	      (ram_only ? !strstr(out, "of the bound's tokens/s") :
			  !!strstr(out, "of the bound's tokens/s")),
	      "bench e2e (ram-only %d): exit %d\n%s", ram_only, rc, out ? out : "");
	free(out);
	json_t *r = json_load_file(js, 0, NULL);
	const json_t *ram = json_object_get(r, "ram"), *rows = json_object_get(r, "results");
	CHECK(json_array_size(ram) == 2, "ram entries %zu", json_array_size(ram));
	for (size_t i = 0; i < json_array_size(ram); i++) {
		const json_t *t = json_array_get(ram, i);
		const double tl = num(t, "trace_lookups"), opt = num(t, "opt_hits");
		CHECK(tl == num(t, "lookups") && num(t, "trace_cut") == 0 &&
		      fabs(num(t, "opt_hit_rate") - opt / tl) < 1e-12 &&
		      fabs(num(t, "trace_hit_rate") - num(t, "hit_rate")) < 1e-12 &&
		      num(t, "trace_fetches") >= tl - opt &&
		      num(t, "opt_any_start_hits") >= opt &&
		      fabs(num(t, "static_hit_rate") - num(t, "static_hits") / tl) < 1e-12,
		      "ram %zu: trace %g, opt %g, fetches %g, any %g", i, tl, opt,
		      num(t, "trace_fetches"), num(t, "opt_any_start_hits"));
		const double steps = 3, bw = num(t, "bytes_read") / num(t, "wait_s") / 1e9;
		const double io = num(t, "misses") / steps * num(t, "slot_bytes") / (bw * 1e9);
		CHECK(num(t, "misses") == 0 ||
		      (fabs(num(t, "read_GBps") - bw) <= 1e-9 * bw &&
		       fabs(num(t, "read_s_per_step") - io) <= 1e-9 * io),
		      "ram %zu: read %g GB/s (want %g), reads %g s/step (want %g)", i,
		      num(t, "read_GBps"), bw, num(t, "read_s_per_step"), io);
		const json_t *all = json_object_get(t, "all_in_ram_step_s");
		CHECK(ram_only == !all, "ram %zu: all-in-RAM step %s", i,
		      all ? "present" : "absent");
		if (ram_only || !all)
			continue;
		/* the decode-cpu row of the same batch */
		double med = 0;
		for (size_t j = 0; j < json_array_size(rows); j++) {
			const json_t *row = json_array_get(rows, j);
			const char *n = json_string_value(json_object_get(row, "name"));
			if (n && !strcmp(n, "decode-cpu") && json_integer_value(json_object_get(
				row, "tokens")) == json_integer_value(json_object_get(t, "batch")))
				med = num(row, "median_s");
		}
		const double bound = med + num(t, "read_s_per_step");
		CHECK(med > 0 && json_real_value(all) == med &&
		      fabs(num(t, "disk_bound_step_s") - bound) <= 1e-12 * bound &&
		      fabs(num(t, "tier_over_disk_bound") - bound / num(t, "step_s")) <= 1e-12,
		      "ram %zu: all %g (row %g), bound %g (want %g), over %g", i,
		      json_real_value(all), med, num(t, "disk_bound_step_s"), bound,
		      num(t, "tier_over_disk_bound"));
	}
	json_decref(r);
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 11;
	gp.n_layers = 4;
	gp.hot_count = 8;
	gp.hot_share = 0.85;
	gp.shard_mb = 1;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("xtier-trace", &gp, &dir);
	if (!m) {
		free(dir);
		return moet_test_done("test_xtier_trace");
	}
	CHECK(moet_model_config(m)->n_routed_experts <= 1024, "E within the test's table");
	tier_case(m, 12, 1, 0);
	tier_case(m, 12, 0, 0);
	tier_case(m, 3, 1, 0);
	tier_case(m, 12, 0, 10);
	moet_model_close(m);
	bench_case(dir, 0);
	bench_case(dir, 1);
	free(dir);
	return moet_test_done("test_xtier_trace");
}
