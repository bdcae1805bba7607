/*
 * test_cost_predict.c: the compute terms of the decode step cost model (placement/moet_cost.h),
 * moet_cost_predict_step and `plan --predict`.
 *
 * - The records: at each point of the H200 curves one call costs what the bench measured
 *   (medians typed in from the JSON records in docs/benchmarks, not computed by the code),
 *   and 1 token costs the bandwidth term.
 * - Monotonicity: a call never gets cheaper with more rows (the file's curves, and random
 *   curves the reader accepts); an expert's expected time never falls as p or B grows (also
 *   across the switch to the mean for wide distributions); a placement's predicted step never
 *   falls as B grows; compute never makes a prediction faster than the bandwidth-only one.
 * - Expectations: moet_cost_expert_ms against a sum over every row count (lgamma each) and,
 *   for a wide distribution, against that sum in log space.
 * - B = 1: identical to the bandwidth-only model (every touched expert has one row, and one
 *   row's compute is below its read time); the gap at larger B is printed.
 * - --auto with compute terms: beats the even split on layers of different concentration
 *   at B = 1 .. 64; reaches the brute-force optimum over all allocations of 3 layers (no
 *   overheads: the convex case) at B = 16 and 64; plans Kimi-K2's 61 x 384 on 4 GPUs within
 *   a generous bound (target <= 1 s; the time is printed).
 * - moet_cost_predict_step: its parts add up, it equals this file's own evaluation of the
 *   formula on the placement's owner table, an all-CPU placement has no GPU part, its faults.
 * - The binary: plan --predict (table and --json, parsed with jansson) on a tiny checkpoint:
 *   the JSON's numbers with --layer-max means against the in-file evaluation; by default
 *   (--layer-max spread) the means' step plus spread_ms, the parts adding up; refusals one
 *   line or usage (exit 2).
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_cost.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_placement.h"
#include "moet_plan.h"
#include "moet_profile.h"
#include "moet_test.h"

static char *tmp;

/* A Kimi-K2 expert's call inputs on the built-in H200 figures. */
static moet_cost_in kimi_in(int64_t batch, int n_gpus)
{
	moet_cost_in in = { .batch = batch, .top_k = 8, .d_model = 7168,
			    .expert_bytes = 44050944, .dense_bytes = 0, .n_gpus = n_gpus,
			    .moe_inter = 2048 };
	moet_cost_hw_defaults(&in.hw);
	return in;
}

/* ---- the records ------------------------------------------------------------------------- */

static void test_records(void)
{
	const moet_cost_in in = kimi_in(1, 1);
	/* docs/benchmarks/2026-11-30-cpu-experts-h200host.json: median_s of "expert" rows. */
	static const double ct[9] = { 2, 4, 8, 16, 32, 64, 128, 256, 1024 };
	static const double cs[9] = { 0.0006697020, 0.0008181610, 0.0013553435, 0.0020228160,
				      0.0039942390, 0.0084543995, 0.0153348245, 0.0305914150,
				      0.1226424465 };
	/* docs/benchmarks/2026-11-30-gpu-experts-h200.json: median_s of 8 experts per call. */
	static const double gs[9] = { 0.000150992, 0.000196944, 0.000331488, 0.000653360,
				      0.001284480, 0.002527600, 0.004978112, 0.009856160,
				      0.039227968 };
	for (int i = 0; i < 9; i++) {
		/* NOTE: the file's fractions have 3 decimals (0.198: up to 0.25% off) and its
		 * peaks are whole GFLOP/s: 0.6% covers both. */
		const double c = moet_cost_call_ms(&in, false, ct[i]), g = moet_cost_call_ms(&in,
							true, ct[i]);
		CHECK(fabs(c - cs[i] * 1e3) < 6e-3 * cs[i] * 1e3, "cpu %g tokens: %.6f ms, the "
		      "record %.6f", ct[i], c, cs[i] * 1e3);
		CHECK(fabs(g - gs[i] / 8 * 1e3) < 6e-3 * gs[i] / 8 * 1e3, "gpu %g tokens: %.6f ms, "
		      "the record %.6f", ct[i], g, gs[i] / 8 * 1e3);
	}
	/* 1 token: the read terms (94 and 2700 GB/s). */
	CHECK(moet_cost_call_ms(&in, false, 1) == 44050944 / 94e6, "cpu 1 token %.9g",
	      moet_cost_call_ms(&in, false, 1));
	CHECK(moet_cost_call_ms(&in, true, 1) == 44050944 / 2700e6, "gpu 1 token %.9g",
	      moet_cost_call_ms(&in, true, 1));
	CHECK(moet_cost_call_ms(&in, false, 0) == 0 && moet_cost_call_ms(&in, true, 0) == 0,
	      "0 rows");
}

/* ---- monotonicity ------------------------------------------------------------------------ */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void)
{
	return (double)(moet_test_xorshift64(&rng) >> 11) / 9007199254740992.0;
}

/* A random curve the reader accepts, through the reader. */
static int random_curve(moet_cost_hw *hw)
{
	char text[1024];
	int n = 1 + (int)(uniform() * 10), at;
	double t = 1, q = 0.1;     /* q = t / f must not fall */
	at = snprintf(text, sizeof(text), "gpu_sgemm_frac:\n");
	for (int i = 0; i < n; i++) {
		t += floor(1 + uniform() * 100);
		double f = fmin(1, t / (q + uniform() * t * 3));
		if (t / f < q)
			f = t / q;
		q = t / f;
		at += snprintf(text + at, sizeof(text) - (size_t)at, "  %.0f: %.17g\n", t, f);
	}
	return moet_cost_hw_parse("random.yaml", text, (size_t)at, hw);
}

static void test_monotone(void)
{
	moet_cost_in in = kimi_in(1, 1);
	for (int gpu = 0; gpu < 2; gpu++) {
		double prev = 0;
		for (double r = 0; r <= 2048; r += 0.25) {
			const double t = moet_cost_call_ms(&in, gpu, r);
			CHECK(t >= prev, "%s: %g rows %.9g ms < %.9g", gpu ? "gpu" : "cpu", r, t,
			      prev);
			prev = t;
		}
	}
	for (int k = 0; k < 200; k++) {
		moet_cost_in ri = kimi_in(1, 1);
		int rc = random_curve(&ri.hw);
		CHECK(rc == 0, "random curve %d: %s", k, moet_errmsg());
		double prev = 0;
		for (double r = 0; !rc && r <= 1200; r += 0.5) {
			const double t = moet_cost_call_ms(&ri, true, r);
			CHECK(t >= prev * (1 - 1e-15), "curve %d: %g rows %.12g < %.12g", k, r, t,
			      prev);
			prev = t;
		}
	}
	/* An expert's expected time in p and in B; B crosses the switch to the mean. */
	const double s[2] = { 1, 0 };
	double P[2], t2c[2], t2g[2], pc = 0, pg = 0;
	for (int64_t B = 1; B <= 20000; B = B < 64 ? B + 1 : B * 5 / 4) {
		in.batch = B;
		in.top_k = 1;
		moet_cost_expert_ms(&in, s, 2, P, t2c, t2g);    /* p = 1: every token */
		CHECK(t2c[0] == moet_cost_call_ms(&in, false, (double)B) && t2c[1] == 0,
		      "p 1, B %" PRId64 ": %.9g", B, t2c[0]);
		const double sp[2] = { 1, 3 };
		moet_cost_expert_ms(&in, sp, 2, P, t2c, t2g);   /* p = 1/4 */
		in.top_k = 8;
		CHECK(t2c[0] >= pc && t2g[0] >= pg, "B %" PRId64 ": %.9g %.9g after %.9g %.9g", B,
		      t2c[0], t2g[0], pc, pg);
		pc = t2c[0];
		pg = t2g[0];
	}
	in.batch = 48;
	in.top_k = 1;
	pc = pg = 0;
	for (double p = 0.001; p < 1; p += 0.001) {
		const double sp[2] = { p, 1 - p };
		moet_cost_expert_ms(&in, sp, 2, P, t2c, t2g);
		CHECK(t2c[0] >= pc && t2g[0] >= pg, "p %g: %.9g %.9g after %.9g %.9g", p, t2c[0],
		      t2g[0], pc, pg);
		pc = t2c[0];
		pg = t2g[0];
	}
}

/* ---- expectations ------------------------------------------------------------------------ */

static double ref_expect(const moet_cost_in *in, int gpu, double p)
{
	const double B = (double)in->batch;
	double sum = 0;
	for (double r = 1; r <= B; r++) {
		const double lp = lgamma(B + 1) - lgamma(r + 1) - lgamma(B - r + 1) + r * log(p) +
				  (B - r) * log(1 - p);
		if (lp > -745)
			sum += exp(lp) * moet_cost_call_ms(in, gpu, r);
	}
	return sum;
}

static void test_expect(void)
{
	const double ps[5] = { 0.001, 0.02, 0.1, 0.5, 0.9 };
	const int64_t Bs[6] = { 1, 2, 7, 64, 500, 8000 };
	for (int b = 0; b < 6; b++)
		for (int i = 0; i < 5; i++) {
			moet_cost_in in = kimi_in(Bs[b], 1);
			in.top_k = 1;
			const double s[2] = { ps[i], 1 - ps[i] };
			double P[2], tc[2], tg[2];
			moet_cost_expert_ms(&in, s, 2, P, tc, tg);
			const double wc = ref_expect(&in, 0, ps[i]), wg = ref_expect(&in, 1, ps[i]);
			/* Exact sums agree to rounding; the mean (B 8000, p >= 0.1) to 1e-6. */
			const double tol = Bs[b] == 8000 ? 1e-6 : 1e-11;
			CHECK(fabs(tc[0] - wc) <= tol * wc && fabs(tg[0] - wg) <= tol * wg,
			      "B %" PRId64 " p %g: cpu %.15g (sum %.15g), gpu %.15g (sum %.15g)",
			      Bs[b], ps[i], tc[0], wc, tg[0], wg);
		}
}

/* ---- predictions over a placement -------------------------------------------------------- */

enum { L = 4, E = 64 };   /* layer 0 dense */

static void scores_mixed(double *sc)
{
	static const double al[L] = { 0, 0.3, 1.2, 2.5 };
	for (int64_t l = 0; l < L; l++)
		for (int64_t e = 0; e < E; e++)
			sc[l * E + e] = l ? floor(1e6 / pow(1.0 + (double)e, al[l])) : 0;
}

static void test_batch1_and_growth(void)
{
	double sc[L * E];
	int16_t own[L * E];
	scores_mixed(sc);
	for (int k = 0; k < 20; k++) {
		moet_cost_in in = kimi_in(1, 2), bw = in;
		bw.hw.cpu_fma_frac.n = bw.hw.gpu_sgemm_frac.n = 0;
		for (int64_t i = 0; i < L * E; i++)
			own[i] = i < E ? -1 : (int16_t)(uniform() * 3) - 1;
		moet_cost_pred a, b, prev = { 0 };
		for (int64_t B = 1; B <= 256; B *= 2) {
			in.batch = bw.batch = B;
			CHECK(moet_cost_predict(&in, sc, L, E, own, &a) == 0 &&
			      moet_cost_predict(&bw, sc, L, E, own, &b) == 0, "%s", moet_errmsg());
			if (B == 1)
				CHECK(fabs(a.step_ms - b.step_ms) <= 1e-12 * b.step_ms &&
				      fabs(a.cpu_ms - b.cpu_ms) <= 1e-12 * b.cpu_ms &&
				      fabs(a.gpu_ms - b.gpu_ms) <= 1e-12 * b.gpu_ms,
				      "placement %d, B 1: %.15g vs bandwidth only %.15g", k,
				      a.step_ms, b.step_ms);
			CHECK(a.step_ms >= b.step_ms * (1 - 1e-12) &&
			      a.cpu_ms >= b.cpu_ms * (1 - 1e-12) &&
			      a.gpu_ms >= b.gpu_ms * (1 - 1e-12), "placement %d, B %" PRId64
			      ": compute made it faster: %.9g < %.9g", k, B, a.step_ms, b.step_ms);
			CHECK(a.step_ms >= prev.step_ms && a.cpu_ms >= prev.cpu_ms &&
			      a.cpu_rows >= prev.cpu_rows, "placement %d: B %" PRId64 " predicts "
			      "%.9g ms, less than B/2's %.9g", k, B, a.step_ms, prev.step_ms);
			const double sum = a.gpu_expert_ms + a.cpu_expert_ms + a.transfer_ms +
					   a.overhead_ms + a.dense_ms;
			CHECK(fabs(sum - a.step_ms) <= 1e-12 * a.step_ms, "parts %.15g, step %.15g",
			      sum, a.step_ms);
			if (k == 0)
				printf("mixed placement, B %3" PRId64 ": %.4f ms with compute, "
				       "%.4f bandwidth only (+%.1f%%); rows per touched CPU expert "
				       "%.2f\n", B, a.step_ms, b.step_ms,
				       100 * (a.step_ms / b.step_ms - 1),
				       a.cpu_rows / a.cpu_distinct);
			prev = a;
		}
	}
}

/* --auto vs the even split and vs brute force, with the compute terms. */
static void test_auto(void)
{
	moet_config cf;
	moet_placement_sizes *sz = NULL;
	moet_plan *pl = NULL;
	double sc[L * E];
	moet_cost_hw hw, flat;
	moet_cost_hw_defaults(&hw);
	flat = hw;
	flat.cpu_overhead_us = flat.gpu_overhead_us = flat.pcie_latency_us = 0;
	if (moet_test_kimi(L, E, &cf, &sz)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	scores_mixed(sc);
	const int64_t S = 40;
	for (int64_t B = 1; B <= 64; B *= 4) {
		for (int v = 0; v < 2; v++) {
			moet_plan_budget b = { .n_gpus = 1, .budget_bytes = sz->dense_bytes + S *
					       sz->expert_bytes[E], .hw = v ? &flat : &hw,
					       .batch = B, .auto_slots = true };
			CHECK(moet_plan_make(&cf, sz, sc, &b, &pl) == 0, "%s", moet_errmsg());
			if (!pl)
				goto done;
			if (!v) {
				printf("--auto B %2" PRId64 ": %.4f ms (%" PRId64 "/%" PRId64 "/%"
				       PRId64 "), even split %.4f ms\n", B, pl->pred.step_ms,
				       pl->per_layer[1], pl->per_layer[2], pl->per_layer[3],
				       pl->even_pred.step_ms);
				CHECK(pl->pred.step_ms < 0.97 * pl->even_pred.step_ms, "B %" PRId64
				      ": --auto %.6f ms, even %.6f ms", B, pl->pred.step_ms,
				      pl->even_pred.step_ms);
			}
			/* Experts rank by id here, so top-n is ids 0..n-1: every allocation. */
			int16_t own[L * E];
			moet_cost_pred pr;
			double best = INFINITY;
			for (int64_t a = 0; a <= S; a++)
				for (int64_t c = 0; a + c <= S; c++) {
					int64_t n[L] = { 0, a, c, S - a - c };
					for (int64_t i = 0; i < L * E; i++)
						own[i] = (int16_t)(i % E < n[i / E] ? 0 : -1);
					if (!moet_cost_predict(&pl->cost, sc, L, E, own, &pr) &&
					    pr.step_ms < best)
						best = pr.step_ms;
				}
			printf("  %s: brute force %.6f ms, --auto %.6f ms\n", v ? "no overheads" :
			       "h200 figures", best, pl->pred.step_ms);
			if (v)
				CHECK(pl->pred.step_ms <= best * (1 + 1e-12), "B %" PRId64
				      ": --auto %.12g ms, brute force %.12g ms", B,
				      pl->pred.step_ms, best);
			else
				CHECK(pl->pred.step_ms <= best * 1.01, "B %" PRId64 ": --auto "
				      "%.9g ms more than 1%% above brute force %.9g ms", B,
				      pl->pred.step_ms, best);
			moet_plan_free(pl);
			pl = NULL;
		}
	}
done:
	moet_plan_free(pl);
	moet_placement_sizes_free(sz);
}

static void test_kimi_speed(void)
{
	moet_config kc;
	moet_placement_sizes *ks = NULL;
	moet_plan *pl = NULL;
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	if (moet_test_kimi(0, 0, &kc, &ks)) {
		CHECK(0, "kimi setup: %s", moet_errmsg());
		goto done;
	}
	const int64_t KL = kc.num_hidden_layers, KE = kc.n_routed_experts;
	double *sc = calloc((size_t)(KL * KE), sizeof(*sc));
	for (int64_t l = 0; sc && l < KL; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&kc, l) && e < KE; e++)
			sc[l * KE + e] = floor(1e7 / pow(1.0 + (double)((e * 7919 + 31 * l) % KE),
							 0.4 + 0.03 * (double)l));
	for (int64_t B = 1; sc && B <= 256; B *= 16) {
		moet_plan_budget b = { .n_gpus = 4, .budget_bytes = 139ull << 30,
				       .reserve_bytes = 16ull << 30, .hw = &hw, .batch = B,
				       .auto_slots = true };
		const double t0 = moet_test_now_ms();
		int rc = moet_plan_make(&kc, ks, sc, &b, &pl);
		const double ms = moet_test_now_ms() - t0;
		CHECK(rc == 0, "kimi --auto B %" PRId64 ": %s", B, moet_errmsg());
		if (rc)
			break;
		printf("kimi-k2 61 x 384, 4 GPUs, --auto, B %3" PRId64 ": planned in %.1f ms; "
		       "%.3f ms predicted, even split %.3f ms\n", B, ms, pl->pred.step_ms,
		       pl->even_pred.step_ms);
		/* NOTE: generous (target 1 s) for sanitizer builds on a shared 2-core machine. */
		CHECK(ms < 5000, "B %" PRId64 ": planning took %.0f ms", B, ms);
		CHECK(pl->pred.step_ms <= pl->even_pred.step_ms, "B %" PRId64 ": --auto %.3f, even "
		      "%.3f", B, pl->pred.step_ms, pl->even_pred.step_ms);
		moet_plan_free(pl);
		pl = NULL;
	}
	free(sc);
done:
	moet_plan_free(pl);
	moet_placement_sizes_free(ks);
}

/* ---- moet_cost_predict_step and the binary ----------------------------------------------- */

/* The formula on an owner table: the layers' max(CPU, GPUs) + copies, + dense; calls from
 * moet_cost_call_ms (checked above), the expectation a full binomial sum. */
/* The measured dense curve at batch b (moet_cost.h): the segment holding b, the first
 * point's value below the curve, the last segment's line beyond it. */
static double ref_dense(const moet_cost_curve *c, double b)
{
	if (c->n == 1 || b <= c->tokens[0])
		return c->frac[0];
	int i = c->n - 1; /* the segment [i-1, i] */
	for (int j = 1; j < c->n; j++)
		if (b <= c->tokens[j]) {
			i = j;
			break;
		}
	return c->frac[i - 1] + (b - c->tokens[i - 1]) / (c->tokens[i] - c->tokens[i - 1]) *
				       (c->frac[i] - c->frac[i - 1]);
}

static double ref_step(const moet_cost_in *in, const double *sc, int64_t nl, int64_t ne,
		       const int16_t *own)
{
	double step = in->hw.gpu_dense_ms.n ? ref_dense(&in->hw.gpu_dense_ms, (double)in->batch)
					    : (double)in->dense_bytes / (in->hw.gpu_read_gbps * 1e6);
	for (int64_t l = 0; l < nl; l++) {
		double tot = 0, x[65] = { 0 }, none[65];
		for (int g = 0; g < 65; g++)
			none[g] = 1;
		for (int64_t e = 0; e < ne; e++)
			tot += sc[l * ne + e];
		if (tot == 0)
			continue;
		for (int64_t e = 0; e < ne; e++) {
			const double p = fmin(1, sc[l * ne + e] * (double)in->top_k / tot);
			const int t = own[l * ne + e] + 1;
			if (p > 0)
				x[t] += p < 1 ? ref_expect(in, t > 0, p) :
						moet_cost_call_ms(in, t > 0, (double)in->batch);
			none[t] *= pow(1 - p, (double)in->batch);
		}
		const moet_cost_hw *h = &in->hw;
		double tc = (1 - none[0]) * h->cpu_overhead_us / 1e3 + x[0], tg = 0;
		for (int g = 1; g <= in->n_gpus; g++)
			tg = fmax(tg, (1 - none[g]) * h->gpu_overhead_us / 1e3 + x[g]);
		const double act = (double)in->batch * (double)in->d_model * h->act_bytes;
		step += fmax(tc, tg) + (1 - none[0]) * (2 * h->pcie_latency_us / 1e3 +
							2 * act / h->pcie_gbps / 1e6);
	}
	return step;
}

typedef struct tiny {
	char dir[1024], prof[1024], place[1024];
	moet_config cf;
	moet_ckpt *ck;
	moet_placement_sizes *sz;
	moet_profile *p;
	moet_placement *pl;
	double *sc;
} tiny;

static int tiny_make(tiny *t)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.n_layers = 5;
	snprintf(t->dir, sizeof(t->dir), "%s/ck", tmp);
	snprintf(t->prof, sizeof(t->prof), "%s/p.json", tmp);
	snprintf(t->place, sizeof(t->place), "%s/p.yaml", tmp);
	if (moet_gen_checkpoint(t->dir, &gp) || moet_config_load(t->dir, &t->cf) ||
	    moet_ckpt_open(t->dir, &t->ck) || moet_placement_sizes_from_ckpt(&t->cf, t->ck, &t->sz)
	    || moet_profile_create(&t->cf, &t->p))
		return -1;
	const int64_t nl = t->cf.num_hidden_layers, ne = t->cf.n_routed_experts;
	for (int64_t l = 0; l < nl; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&t->cf, l) && e < ne; e++)
			t->p->counts[moet_profile_at(t->p, MOET_PROFILE_DECODE, l) + e] =
				(uint64_t)(1e5 / pow(1.0 + (double)((e * 5 + l) % ne), 0.3 + 0.25 *
						     (double)(l % 3)));
	moet_placement_gpu g[2] = { { .name = "a", .budget_bytes = 1ull << 40 },
				    { .name = "b", .budget_bytes = 1ull << 40 } };
	if (moet_profile_save(t->p, t->prof) ||
	    moet_placement_create("p.yaml", &t->cf, 2, g, MOET_PLACEMENT_DENSE_SPLIT, &t->pl))
		return -1;
	for (int64_t l = 0; l < nl; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&t->cf, l) && e < ne; e++)
			if ((e * 3 + l) % 4 != 3 &&
			    moet_placement_set_owner(t->pl, l, e, (int)((e + l) % 2)))
				return -1;
	if (moet_placement_save(t->pl, t->place, NULL, NULL) ||
	    moet_plan_scores(t->p, MOET_PLAN_DECODE, &t->sc))
		return -1;
	return 0;
}

static void tiny_free(tiny *t)
{
	free(t->sc);
	moet_placement_free(t->pl);
	moet_profile_free(t->p);
	moet_placement_sizes_free(t->sz);
	moet_ckpt_close(t->ck);
}

static moet_cost_in tiny_in(const tiny *t, int64_t B)
{
	moet_cost_in in = { .batch = B, .top_k = t->cf.num_experts_per_tok,
			    .d_model = t->cf.hidden_size,
			    .expert_bytes = t->sz->expert_bytes[t->cf.first_k_dense_replace *
								t->cf.n_routed_experts],
			    .dense_bytes = t->sz->dense_bytes - t->sz->embed_bytes, .n_gpus = 2,
			    .moe_inter = t->cf.moe_intermediate_size };
	moet_cost_hw_defaults(&in.hw);
	return in;
}

static void test_step(tiny *t)
{
	moet_cost_hw hw;
	moet_cost_pred pr;
	moet_cost_hw_defaults(&hw);
	const int64_t nl = t->cf.num_hidden_layers, ne = t->cf.n_routed_experts;
	for (int64_t B = 1; B <= 64; B *= 4) {
		const moet_cost_in in = tiny_in(t, B);
		int rc = moet_cost_predict_step(&t->cf, t->sz, t->pl, t->p, MOET_PROFILE_DECODE,
						&hw, B, &pr);
		CHECK(rc == 0, "%s", moet_errmsg());
		const double want = ref_step(&in, t->sc, nl, ne, moet_placement_owners(t->pl));
		CHECK(!rc && fabs(pr.step_ms - want) <= 1e-9 * want && pr.batch == B, "B %" PRId64
		      ": %.12g ms, the formula %.12g", B, pr.step_ms, want);
		const double sum = pr.gpu_expert_ms + pr.cpu_expert_ms + pr.transfer_ms +
				   pr.overhead_ms + pr.dense_ms;
		CHECK(fabs(sum - pr.step_ms) <= 1e-12 * pr.step_ms, "parts %.15g, step %.15g", sum,
		      pr.step_ms);
		/* Rows: B x k per MoE layer, split over the tiers. */
		const double rows = (double)(B * t->cf.num_experts_per_tok * (nl -
					     t->cf.first_k_dense_replace));
		CHECK(fabs(pr.cpu_rows + pr.gpu_rows - rows) <= 1e-9 * rows, "rows %.9g + %.9g, "
		      "want %.9g", pr.cpu_rows, pr.gpu_rows, rows);
	}
	/* Sizes from the geometry when none are given: the same expert bytes here. */
	moet_cost_pred a;
	CHECK(moet_cost_predict_step(&t->cf, NULL, t->pl, t->p, MOET_COST_PHASE_BOTH, &hw, 4,
				     &a) == 0, "%s", moet_errmsg());
	/* All on the CPU: no GPU part. */
	moet_placement *cpu = NULL;
	moet_placement_gpu g = { .name = "a", .budget_bytes = 1ull << 40 };
	CHECK(moet_placement_create("cpu", &t->cf, 1, &g, MOET_PLACEMENT_DENSE_SPLIT, &cpu) == 0 &&
	      moet_cost_predict_step(&t->cf, t->sz, cpu, t->p, MOET_PROFILE_DECODE, &hw, 16,
				     &a) == 0 && a.gpu_expert_ms == 0 && a.gpu_ms == 0 &&
	      a.cpu_expert_ms > 0 && a.gpu_rows == 0, "all CPU: gpu %g ms, cpu %g ms",
	      a.gpu_expert_ms, a.cpu_expert_ms);
	moet_placement_free(cpu);
	/* Faults. */
	CHECK(moet_cost_predict_step(&t->cf, t->sz, t->pl, t->p, MOET_PROFILE_DECODE, &hw, 0,
				     &a) == MOET_EINVAL && strstr(moet_errmsg(), "batch 0"),
	      "batch 0: %s", moet_errmsg());
	CHECK(moet_cost_predict_step(&t->cf, t->sz, t->pl, t->p, MOET_PROFILE_PREFILL, &hw, 1,
				     &a) == MOET_EINVAL && strstr(moet_errmsg(), "no prefill"),
	      "no prefill routings: %s", moet_errmsg());
	moet_config other = t->cf;
	other.num_experts_per_tok++;
	CHECK(moet_cost_predict_step(&other, t->sz, t->pl, t->p, MOET_PROFILE_DECODE, &hw, 1,
				     &a) == MOET_EINVAL && strstr(moet_errmsg(), "top-k"),
	      "other top-k: %s", moet_errmsg());
	other = t->cf;
	other.num_hidden_layers--;
	CHECK(moet_cost_predict_step(&other, t->sz, t->pl, t->p, MOET_PROFILE_DECODE, &hw, 1,
				     &a) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "placement p.yaml"),
	      "other layers: %s", moet_errmsg());
}

static double jnum(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

static void test_cli(tiny *t)
{
	char *out = NULL, hwf[1024], bad[1100];
	double means16 = NAN;
	snprintf(hwf, sizeof(hwf), "%s/configs/hardware-h200-host.yaml", moet_test_source_dir());
	int st = moet_test_cli(&out, "plan --predict --model %s --placement %s --profile %s "
			       "--hardware %s --batch 1,4,16 --json --layer-max means", t->dir,
			       t->place, t->prof, hwf);
	json_error_t je;
	json_t *j = st == 0 && out ? json_loads(out, 0, &je) : NULL;
	CHECK(j && json_is_object(j), "--predict --json: exit %d\n%s", st, out ? out : "");
	json_t *a = j ? json_object_get(j, "predictions") : NULL;
	CHECK(json_is_array(a) && json_array_size(a) == 3, "predictions: 3 rows");
	for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
		json_t *r = json_array_get(a, i);
		const int64_t B = (int64_t)jnum(r, "batch");
		moet_cost_in in = tiny_in(t, B);
		CHECK(moet_cost_hw_load(hwf, &in.hw) == 0, "%s", moet_errmsg()); /* the CLI's */
		const double want = ref_step(&in, t->sc, t->cf.num_hidden_layers,
					     t->cf.n_routed_experts, moet_placement_owners(t->pl));
		const double step = jnum(r, "step_ms");
		const double sum = jnum(r, "gpu_expert_ms") + jnum(r, "cpu_expert_ms") +
				   jnum(r, "pcie_ms") + jnum(r, "overhead_ms") +
				   jnum(r, "spread_ms") + jnum(r, "dense_ms");
		if (i == 2)
			means16 = step;
		CHECK(B == (i == 0 ? 1 : i == 1 ? 4 : 16) && fabs(step - want) <= 1e-7 * want &&
		      fabs(sum - step) <= 1e-7 * step && jnum(r, "cpu_busy_ms") > 0 &&
		      fabs(jnum(r, "tokens_per_s") - 1e3 * (double)B / step) <= 1e-6 *
		      jnum(r, "tokens_per_s"), "row %zu: batch %" PRId64 ", step %.9g (want %.9g), "
		      "parts %.9g", i, B, step, want, sum);
	}
	json_t *h = j ? json_object_get(j, "hardware") : NULL;
	CHECK(h && jnum(h, "cpu_fma_gflops") == 1329 && jnum(h, "gpu_sgemm_points") == 9 &&
	      jnum(j, "gpus") == 2 && jnum(j, "hit_rate") > 0 && jnum(j, "hit_rate") < 1 &&
	      !strcmp(json_string_value(json_object_get(h, "layer_max")), "means"),
	      "hardware / gpus / hit rate");
	json_decref(j);
	free(out);
	out = NULL;
	/* The default, --layer-max spread: the means step plus spread_ms, the parts adding up. */
	st = moet_test_cli(&out, "plan --predict --model %s --placement %s --profile %s "
			   "--hardware %s --batch 16 --json", t->dir, t->place, t->prof, hwf);
	j = st == 0 && out ? json_loads(out, 0, &je) : NULL;
	a = j ? json_object_get(j, "predictions") : NULL;
	json_t *r16 = json_is_array(a) ? json_array_get(a, 0) : NULL;
	h = j ? json_object_get(j, "hardware") : NULL;
	const double st16 = r16 ? jnum(r16, "step_ms") : NAN, spr = r16 ? jnum(r16, "spread_ms") :
									  NAN;
	const double parts16 = r16 ? jnum(r16, "gpu_expert_ms") + jnum(r16, "cpu_expert_ms") +
					     jnum(r16, "pcie_ms") + jnum(r16, "overhead_ms") +
					     spr + jnum(r16, "dense_ms") : NAN;
	CHECK(h && !strcmp(json_string_value(json_object_get(h, "layer_max")), "spread") &&
	      spr >= 0 && fabs(st16 - spr - means16) <= 1e-7 * st16 &&
	      fabs(parts16 - st16) <= 1e-7 * st16, "spread: step %.9g, spread %.9g, means %.9g, "
	      "parts %.9g\n%s", st16, spr, means16, parts16, out ? out : "");
	json_decref(j);
	free(out);
	out = NULL;
	st = moet_test_cli(&out, "plan --predict --model %s --placement %s --profile %s "
			   "--batch 2,8", t->dir, t->place, t->prof);
	CHECK(st == 0 && out && strstr(out, "built-in defaults") && strstr(out, "gpu_exp_ms") &&
	      strstr(out, "\n       2 ") && strstr(out, "\n       8 "), "table: exit %d\n%s", st,
	      out ? out : "");
	free(out);
	out = NULL;
	moet_test_cli_expect("plan --predict --model x --profile y", 2, "usage");
	char args[8192];
	snprintf(args, sizeof(args), "plan --predict --model %s --placement %s --profile %s "
		 "--gpus 2", t->dir, t->place, t->prof);
	moet_test_cli_expect(args, 2, "usage");
	snprintf(args, sizeof(args), "plan --predict --model %s --placement %s --profile %s "
		 "--batch 1,,4", t->dir, t->place, t->prof);
	moet_test_cli_expect(args, 1, "--batch '1,,4'");
	snprintf(args, sizeof(args), "plan --predict --model %s --placement %s --profile %s "
		 "--layer-max 1", t->dir, t->place, t->prof);
	moet_test_cli_expect(args, 1, "--layer-max '1': want means or spread");
	snprintf(args, sizeof(args), "plan --model %s --profile %s --gpus 1 --vram-gb 1 --batch "
		 "1,4 --out %s/x.yaml", t->dir, t->prof, tmp);
	moet_test_cli_expect(args, 1, "a list only with --predict");
	snprintf(bad, sizeof(bad), "%s/bad.yaml", tmp);
	const char *bt = "cpu_fma_frac:\n  8: 0.5\n  4: 0.4\n";
	CHECK(moet_test_write_file(bad, bt, strlen(bt)) == 0, "write");
	snprintf(args, sizeof(args), "plan --predict --model %s --placement %s --profile %s "
		 "--hardware %s", t->dir, t->place, t->prof, bad);
	moet_test_cli_expect(args, 1, "bad.yaml:3: cpu_fma_frac: 4 tokens after 8");
	snprintf(args, sizeof(args), "plan --predict --model %s --placement %s/none.yaml "
		 "--profile %s", t->dir, tmp, t->prof);
	moet_test_cli_expect(args, 1, "none.yaml");
}

int main(void)
{
	tmp = moet_test_mkdtemp("costpred");
	if (!tmp)
		return 1;
	test_records();
	test_monotone();
	test_expect();
	test_batch1_and_growth();
	test_auto();
	test_kimi_speed();
	tiny t;
	memset(&t, 0, sizeof(t));
	if (tiny_make(&t))
		CHECK(0, "tiny setup: %s", moet_errmsg());
	else {
		test_step(&t);
		test_cli(&t);
	}
	tiny_free(&t);
	free(tmp);
	return moet_test_done("test_cost_predict");
}
