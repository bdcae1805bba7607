/*
 * test_cost_spread.c: the cost model's expected max of a layer's tiers (MOET_COST_MAX_SPREAD,
 * placement/moet_cost.h) against a simulation, and its properties.
 *
 * - Simulation: one MoE layer of 64 Kimi-K2-sized experts at batch 16 on one GPU, its top n
 *   on the GPU and the rest on the CPU, for every n. Each draw takes every expert's rows
 *   R_e ~ Binomial(B, p_e) (the model's own independence: this checks the normal
 *   approximation and the formula, not that assumption), the CPU tier's time C as its
 *   overhead when touched plus moet_cost_call_ms of each CPU expert's rows, and the layer's
 *   wait max(C, G) with G the model's GPU time; the mean over the draws against the model's
 *   layer time less its copies. The spread model is within 4% at every n; where the tiers'
 *   means are close the means model is more than 5% low and the spread model is closer.
 * - Variances: moet_cost_expert_var_ms's v_cpu against E[t^2] - E[t]^2 summed over every row
 *   count; with p = 1 (every token) 0; its t_cpu, t_gpu, P equal moet_cost_expert_ms's.
 * - Properties on random placements (1-4 GPUs, batches 1-64): the spread step is never below
 *   the means step, spread_ms is the difference, the parts add up, and every other part is
 *   the same bits; with the CPU tier or the GPUs empty in every layer the two are the same
 *   bits.
 * - plan --auto in memory (Kimi-K2 geometry, 8 MoE layers of 64 experts of alternating
 *   concentration, one GPU, batch 16, 40 to 400 slots): the plan made with the spread, priced
 *   with the spread, is never slower than the plan made with the means priced the same way
 *   (what the planner optimizes is the model it is then judged by); the gain is printed.
 * - The parser: "means", "spread", and anything else refused naming the value.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "moet_config.h"
#include "moet_cost.h"
#include "moet_err.h"
#include "moet_placement.h"
#include "moet_plan.h"
#include "moet_profile.h"
#include "moet_test.h"

#define NE 64

static moet_cost_in kimi(int64_t batch, int n_gpus, int layer_max)
{
	moet_cost_in in = { .batch = batch, .top_k = 8, .d_model = 7168,
			    .expert_bytes = 44050944, .n_gpus = n_gpus, .moe_inter = 2048 };
	moet_cost_hw_defaults(&in.hw);
	in.hw.layer_max = layer_max;
	return in;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uni(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

/* Scores falling with the rank, as a layer's routing counts do. */
static void layer_scores(double *s)
{
	for (int e = 0; e < NE; e++)
		s[e] = 1e4 / pow(1.0 + e, 0.9);
}

static double one_layer(const moet_cost_in *in, const double *s, const int16_t *own,
			moet_cost_pred *pr)
{
	CHECK(moet_cost_predict(in, s, 1, NE, own, pr) == 0, "%s", moet_errmsg());
	return pr->experts_ms - pr->transfer_ms;
}

static void test_simulation(void)
{
	double s[NE], tot = 0, p[NE];
	layer_scores(s);
	for (int e = 0; e < NE; e++)
		tot += s[e];
	for (int e = 0; e < NE; e++)
		p[e] = s[e] * 8 / tot;
	const int B = 16, draws = 20000;
	const moet_cost_in sp = kimi(B, 1, MOET_COST_MAX_SPREAD), mn = kimi(B, 1, 0);
	double worst_spread = 0, best_gap = 0;
	int close_n = -1;
	for (int n = 1; n < NE; n++) {
		int16_t own[NE];
		for (int e = 0; e < NE; e++)
			own[e] = e < n ? 0 : -1;
		moet_cost_pred a, b;
		const double w_spread = one_layer(&sp, s, own, &a);
		const double w_means = one_layer(&mn, s, own, &b);
		const double G = b.gpu_ms, ovh = sp.hw.cpu_overhead_us * 1e-3;
		double sum = 0;
		for (int d = 0; d < draws; d++) {
			double C = 0;
			int touched = 0;
			for (int e = n; e < NE; e++) {
				int r = 0;
				for (int t = 0; t < B; t++)
					r += uni() < p[e];
				if (r) {
					C += moet_cost_call_ms(&sp, false, r);
					touched = 1;
				}
			}
			C += touched ? ovh : 0;
			sum += C > G ? C : G;
		}
		const double mc = sum / draws;
		const double err = fabs(w_spread - mc) / mc, low = (mc - w_means) / mc;
		worst_spread = err > worst_spread ? err : worst_spread;
		CHECK(err <= 0.04, "n %d: spread %.4f ms against the simulation's %.4f (means "
		      "%.4f)", n, w_spread, mc, w_means);
		CHECK(w_means <= mc * 1.01, "n %d: the means model %.4f above the simulation %.4f",
		      n, w_means, mc);
		if (low > best_gap) {
			best_gap = low;
			close_n = n;
		}
		if (low > 0.05)
			CHECK(err < low, "n %d: spread off by %.3f, means by %.3f", n, err, low);
	}
	/* The case the spread is for must occur: tiers close, the means model clearly low. */
	CHECK(best_gap > 0.05, "no n with the means model > 5%% low (best %.3f at n %d)",
	      best_gap, close_n);
	printf("simulation: spread within %.1f%% at every n; means up to %.1f%% low (n %d)\n",
	       100 * worst_spread, 100 * best_gap, close_n);
}

static double binom_pmf(int B, int r, double p)
{
	return exp(lgamma(B + 1.0) - lgamma(r + 1.0) - lgamma(B - r + 1.0) + r * log(p) +
		   (B - r) * log1p(-p));
}

static void test_variance(void)
{
	const int batches[3] = { 1, 16, 64 };
	for (int bi = 0; bi < 3; bi++) {
		const int B = batches[bi];
		const moet_cost_in in = kimi(B, 1, MOET_COST_MAX_SPREAD);
		double s[NE], P1[NE], P2[NE], tc1[NE], tc2[NE], tg1[NE], tg2[NE], v[NE], tot = 0;
		layer_scores(s);
		s[0] = 1e9; /* p clamped to 1: every token */
		for (int e = 0; e < NE; e++)
			tot += s[e];
		moet_cost_expert_ms(&in, s, NE, P1, tc1, tg1);
		moet_cost_expert_var_ms(&in, s, NE, P2, tc2, tg2, v);
		CHECK(!memcmp(P1, P2, sizeof(P1)) && !memcmp(tc1, tc2, sizeof(tc1)) &&
		      !memcmp(tg1, tg2, sizeof(tg1)), "B %d: var_ms's P, t_cpu, t_gpu", B);
		CHECK(v[0] == 0, "B %d: p = 1: variance %g", B, v[0]);
		for (int e = 1; e < NE; e++) {
			const double p = s[e] * 8 / tot;
			double m1 = 0, m2 = 0;
			for (int r = 1; r <= B; r++) {
				const double t = moet_cost_call_ms(&in, false, r);
				m1 += binom_pmf(B, r, p) * t;
				m2 += binom_pmf(B, r, p) * t * t;
			}
			const double want = m2 - m1 * m1;
			CHECK(fabs(v[e] - want) <= 1e-9 * (want > 1e-6 ? want : 1e-6),
			      "B %d expert %d: variance %.12g, want %.12g", B, e, v[e], want);
		}
	}
}

static void test_properties(void)
{
	enum { L = 6 };
	double s[L * NE];
	int16_t own[L * NE];
	for (int c = 0; c < 40; c++) {
		const int ng = 1 + c % 4, B = (int[]){ 1, 4, 16, 64 }[c / 4 % 4];
		for (int i = 0; i < L * NE; i++) {
			s[i] = uni() < 0.1 ? 0 : 1e4 * pow(uni(), 3);
			own[i] = (int16_t)(uni() < 0.4 ? -1 : (int)(uni() * ng));
		}
		moet_cost_in sp = kimi(B, ng, MOET_COST_MAX_SPREAD), mn = kimi(B, ng, 0);
		sp.dense_bytes = mn.dense_bytes = 1ull << 30;
		moet_cost_pred a, b;
		CHECK(moet_cost_predict(&sp, s, L, NE, own, &a) == 0 &&
		      moet_cost_predict(&mn, s, L, NE, own, &b) == 0, "%s", moet_errmsg());
		const double parts = a.gpu_expert_ms + a.cpu_expert_ms + a.transfer_ms +
				     a.overhead_ms + a.spread_ms + a.dense_ms;
		CHECK(a.step_ms >= b.step_ms && b.spread_ms == 0 && a.spread_ms >= 0 &&
		      fabs(a.step_ms - b.step_ms - a.spread_ms) <= 1e-9 * a.step_ms &&
		      fabs(parts - a.step_ms) <= 1e-9 * a.step_ms,
		      "case %d: spread %.6f means %.6f spread_ms %.6f parts %.6f", c, a.step_ms,
		      b.step_ms, a.spread_ms, parts);
		CHECK(a.cpu_ms == b.cpu_ms && a.gpu_ms == b.gpu_ms &&
		      a.transfer_ms == b.transfer_ms && a.cpu_expert_ms == b.cpu_expert_ms &&
		      a.gpu_expert_ms == b.gpu_expert_ms && a.dense_ms == b.dense_ms &&
		      a.two.step_ms == b.two.step_ms, "case %d: another part moved", c);
		/* One tier empty in every layer: nothing to take the max of. */
		for (int k = 0; k < 2; k++) {
			for (int i = 0; i < L * NE; i++)
				own[i] = (int16_t)(k ? -1 : i % ng);
			CHECK(moet_cost_predict(&sp, s, L, NE, own, &a) == 0 &&
			      moet_cost_predict(&mn, s, L, NE, own, &b) == 0, "%s", moet_errmsg());
			CHECK(a.step_ms == b.step_ms && a.spread_ms == 0,
			      "case %d, all on the %s: %.9g against %.9g", c, k ? "CPU" : "GPUs",
			      a.step_ms, b.step_ms);
		}
	}
}

/* Kimi-K2 geometry, layer 0 dense and 8 MoE layers of NE experts; decode counts of layer l
 * ~ 1 / (1 + r)^a with a = 1.6 and 0.4 alternating (r a per-layer permutation of the ids). */
static void test_plan(void)
{
	enum { AL = 9 };
	moet_config cf;
	moet_placement_sizes *sz = NULL;
	moet_profile *p = NULL;
	double *sc = NULL;
	if (moet_test_kimi(AL, NE, &cf, &sz) || moet_profile_create(&cf, &p)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	for (int64_t l = 1; l < AL; l++)
		for (int64_t e = 0; e < NE; e++)
			p->counts[moet_profile_at(p, MOET_PROFILE_DECODE, l) + e] =
				(uint64_t)(1e6 / pow(1.0 + (double)((e * 37 + 11 * l) % NE),
						     l % 2 ? 1.6 : 0.4));
	if (moet_plan_scores(p, MOET_PLAN_DECODE, &sc)) {
		CHECK(0, "scores: %s", moet_errmsg());
		goto done;
	}
	moet_cost_hw hw[2];
	for (int k = 0; k < 2; k++) {
		moet_cost_hw_defaults(&hw[k]);
		hw[k].layer_max = k ? MOET_COST_MAX_SPREAD : MOET_COST_MAX_MEANS;
	}
	const uint64_t eb = sz->expert_bytes[1 * NE];
	double best = 0;
	for (int64_t S = 40; S <= 400; S += 40) {
		double judged[2] = { 0, 0 };
		for (int k = 0; k < 2; k++) {
			moet_plan_budget b = { .n_gpus = 1,
					       .budget_bytes = sz->dense_bytes + S * eb,
					       .hw = &hw[k], .batch = 16, .auto_slots = true };
			moet_plan *pl = NULL;
			moet_cost_pred pr;
			moet_cost_in in;
			int rc = moet_plan_make(&cf, sz, sc, &b, &pl);
			if (!rc) {
				in = pl->cost;
				in.hw.layer_max = MOET_COST_MAX_SPREAD;
				rc = moet_cost_predict(&in, sc, AL, NE, pl->owner, &pr);
			}
			CHECK(rc == 0, "S %" PRId64 ": %s", S, moet_errmsg());
			judged[k] = rc ? NAN : pr.step_ms;
			if (!rc && k)
				CHECK(fabs(pl->pred.step_ms - pr.step_ms) <= 1e-12 * pr.step_ms,
				      "S %" PRId64 ": the spread plan's own prediction %.9g, %.9g",
				      S, pl->pred.step_ms, pr.step_ms);
			moet_plan_free(pl);
		}
		CHECK(judged[1] <= judged[0] * (1 + 1e-12), "S %" PRId64 ": spread plan %.6f ms, "
		      "means plan %.6f ms (both priced with the spread)", S, judged[1], judged[0]);
		const double g = 1 - judged[1] / judged[0];
		best = g > best ? g : best;
	}
	printf("plan --auto, batch 16: the spread's plan up to %.2f%% faster under the spread\n",
	       100 * best);
done:
	free(sc);
	moet_profile_free(p);
	moet_placement_sizes_free(sz);
}

static void test_parse(void)
{
	int v = -1;
	CHECK(moet_cost_layer_max_parse("means", &v) == 0 && v == MOET_COST_MAX_MEANS, "means");
	CHECK(moet_cost_layer_max_parse("spread", &v) == 0 && v == MOET_COST_MAX_SPREAD,
	      "spread");
	CHECK(moet_cost_layer_max_parse("Spread", &v) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "'Spread'") && strstr(moet_errmsg(), "means or spread"),
	      "refused: %s", moet_errmsg());
	CHECK(!strcmp(moet_cost_layer_max_name(MOET_COST_MAX_SPREAD), "spread") &&
	      !strcmp(moet_cost_layer_max_name(MOET_COST_MAX_MEANS), "means"), "names");
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	CHECK(hw.layer_max == MOET_COST_MAX_MEANS, "the default");
}

int main(void)
{
	test_simulation();
	test_variance();
	test_properties();
	test_plan();
	test_parse();
	return moet_test_done("test_cost_spread");
}
