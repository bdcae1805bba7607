/*
 * serve_bench_pred.c: the bytes-roofline prediction of `bench serve` for a hybrid placement
 * (serve_bench_int.h has the arithmetic; docs/serve.md what it means).
 *
 * NOTE: per step, not from a profile: the cost model (placement/moet_cost.h) predicts from
 * routing frequencies what a step touches on average; here the touched experts are counted
 * from the measured steps themselves (a replay of the same greedy decode), so the prediction
 * is what the bytes of exactly those steps allow, tier by tier.
 */
#include <stdlib.h>
#include <string.h>

#include "moet_bench.h"
#include "moet_err.h"
#include "serve_bench_int.h"

int sb_touch_init(sb_touch *t, const moet_model *m, int steps)
{
	const moet_config *c = moet_model_config(m);
	*t = (sb_touch){ .L = c->num_hidden_layers, .E = c->n_routed_experts, .steps = steps,
			 .cur = -1 };
	size_t n = (size_t)steps * (size_t)(t->L * (t->E > 0 ? t->E : 1));
	if (!(t->seen = calloc(n ? n : 1, 1)))
		return moet_err(MOET_ENOMEM, "bench serve: routing record of %d steps", steps);
	return 0;
}

void sb_touch_free(sb_touch *t)
{
	free(t->seen);
	t->seen = NULL;
}

void sb_touch_route(void *ctx, const moet_route_event *ev)
{
	sb_touch *t = ctx;
	if (t->cur < 0 || t->cur >= t->steps || ev->is_prefill || ev->layer < 0 ||
	    ev->layer >= t->L)
		return;
	uint8_t *row = t->seen + ((size_t)t->cur * (size_t)t->L + (size_t)ev->layer) *
				 (size_t)t->E;
	for (int i = 0; i < ev->top_k; i++)
		if (ev->ids[i] >= 0 && ev->ids[i] < t->E)
			row[ev->ids[i]] = 1;
}

void sb_touch_tiers(const sb_touch *t, int s, const moet_placement_sizes *sz,
		    const int16_t *owner, int n_tiers, double *out_bytes, int64_t *out_n)
{
	const size_t LE = (size_t)(t->L * t->E);
	const uint8_t *seen = t->seen + (size_t)s * LE;
	for (int k = 0; k < n_tiers; k++) {
		out_bytes[k] = 0;
		out_n[k] = 0;
	}
	for (size_t i = 0; i < LE; i++) {
		if (!seen[i])
			continue;
		int tier = owner ? 1 + owner[i] : 1; /* -1 (the CPU tier) -> 0 */
		if (tier < 0 || tier >= n_tiers)
			continue; /* the owner table was checked when it was set */
		out_bytes[tier] += (double)sz->expert_bytes[i];
		out_n[tier]++;
	}
}

static double tier_bw(const sb_bw *bw, int k)
{
	return k == 0 ? bw->cpu_GBps : bw->dev_GBps;
}

int sb_predict(const sb_touch *t, const moet_placement_sizes *sz, const int16_t *owner,
	       int n_tiers, const sb_bw *bw, double resident_step_s, int streams,
	       json_t *steps_out, sb_pred *out)
{
	double *pred = malloc((size_t)(t->steps > 0 ? t->steps : 1) * sizeof(double));
	if (!pred)
		return moet_err(MOET_ENOMEM, "bench serve: prediction");
	memset(out, 0, sizeof(*out));
	double bytes[SB_MAX_TIERS];
	int64_t cnt[SB_MAX_TIERS];
	/* the all-resident run: every touched expert on device 0 */
	double res_e = 0;
	for (int s = 0; s < t->steps; s++) {
		sb_touch_tiers(t, s, sz, NULL, 2, bytes, cnt);
		res_e += bytes[1] / (bw->dev_GBps * 1e9);
	}
	out->resident_step_s = resident_step_s;
	out->resident_expert_s = t->steps ? res_e / t->steps : 0;
	/* NOTE: clamped: a copy ceiling above what the expert kernel streams makes the expert
	 * time small, never negative; a negative rest would mean a ceiling below the kernel */
	out->nonexpert_s = resident_step_s - out->resident_expert_s;
	if (out->nonexpert_s < 0)
		out->nonexpert_s = 0;
	for (int s = 0; s < t->steps; s++) {
		sb_touch_tiers(t, s, sz, owner, n_tiers, bytes, cnt);
		double worst = 0;
		int at = 0;
		json_t *jb = json_array(), *jn = json_array(), *je = json_array();
		for (int k = 0; k < n_tiers; k++) {
			double e = bytes[k] / (tier_bw(bw, k) * 1e9);
			if (e > worst) {
				worst = e;
				at = k;
			}
			out->mean_bytes[k] += bytes[k] / t->steps;
			out->mean_distinct[k] += (double)cnt[k] / t->steps;
			json_array_append_new(jb, json_real(bytes[k]));
			json_array_append_new(jn, json_integer((json_int_t)cnt[k]));
			json_array_append_new(je, json_real(e));
		}
		out->bound_tier_steps[at]++;
		pred[s] = worst + out->nonexpert_s;
		if (steps_out)
			json_array_append_new(steps_out, json_pack("{s:o, s:o, s:o, s:f}", "bytes", jb,
								   "distinct", jn, "expert_s", je,
								   "predicted_step_s", pred[s]));
		else {
			json_decref(jb);
			json_decref(jn);
			json_decref(je);
		}
	}
	moet_bench_stats st = { 0 };
	if (t->steps)
		moet_bench_stats_of(pred, t->steps, &st);
	out->step_s = st.median_s;
	out->tokens_per_s = st.median_s > 0 ? streams / st.median_s : 0;
	free(pred);
	return 0;
}
