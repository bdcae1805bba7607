/*
 * test_cost.c: the decode step cost model (placement/moet_cost.h) and `plan --auto`.
 *
 * - Touch probabilities against pow(): 1 - (1 - p)^B with p = count x k / sum; at B = 1
 *   they add up to k.
 * - moet_cost_predict against the formula of docs/profile-and-plan.md evaluated here on a
 *   hand-built owner table of 2 GPUs (pow, products, no log space; the expected call time a
 *   sum over every row count of the binomial, each term from lgamma), with and without the
 *   compute curves.
 * - Hardware files: configs/hardware-h200-host.yaml loads with the documented figures and
 *   equals the defaults; every fault is one line naming the file and the line, the compute
 *   curves' faults too.
 * - --auto in memory (Kimi-K2 expert size, 8 MoE layers of 64 experts, 1 GPU): layers of
 *   different concentration: the predicted step beats the even split, the budget holds
 *   (moet_placement_check), the reported prediction equals this file's own evaluation;
 *   identical layers: the same counts and the same prediction as the even split; no
 *   overheads, B = 1: the GPU set is the global top by touch probability (the optimum);
 *   no overheads, B = 4, 3 layers: the greedy counts reach the brute-force minimum.
 * - The binary: plan --auto --hardware on a tiny checkpoint and a profile made here prints
 *   both predictions and writes them into the file's header; --layer-max spread says so in
 *   both; refusals are one line (--layer-max without the cost model, or not means/spread).
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

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

static void test_touch(void)
{
	const double s[5] = { 40, 30, 20, 10, 0 };
	double P[5];
	for (int64_t B = 1; B <= 64; B *= 4) {
		moet_cost_touch(s, 5, 2, B, P);
		double sum = 0;
		for (int i = 0; i < 5; i++) {
			double p = s[i] * 2 / 100.0;
			double want = 1 - pow(1 - p, (double)B);
			CHECK(fabs(P[i] - want) < 1e-12, "B %" PRId64 " P[%d] %.15g want %.15g", B,
			      i, P[i], want);
			sum += P[i];
		}
		if (B == 1)
			CHECK(fabs(sum - 2) < 1e-12, "B 1: sum %.15g, want k = 2", sum);
	}
	const double z[3] = { 0, 0, 0 };
	moet_cost_touch(z, 3, 2, 4, P);
	CHECK(P[0] == 0 && P[1] == 0 && P[2] == 0, "no routings: P %g %g %g", P[0], P[1], P[2]);
}

/* One call on r rows, t(r) of docs/profile-and-plan.md written out. */
static double ref_call(const moet_cost_in *in, int gpu, double r)
{
	const moet_cost_hw *h = &in->hw;
	const moet_cost_curve *c = gpu ? &h->gpu_sgemm_frac : &h->cpu_fma_frac;
	const double bw = (double)in->expert_bytes / (gpu ? h->gpu_read_gbps : h->cpu_read_gbps)
			  / 1e6;
	if (r <= 0)
		return 0;
	if (!c->n || !in->moe_inter)
		return bw;
	const int k = c->n - 1;
	double q = r / c->frac[r <= c->tokens[0] ? 0 : k];   /* rows / fraction */
	for (int i = 0; i < k; i++)
		if (r >= c->tokens[i] && r <= c->tokens[i + 1]) {
			double w = (r - c->tokens[i]) / (c->tokens[i + 1] - c->tokens[i]);
			q = (1 - w) * c->tokens[i] / c->frac[i] +
			    w * c->tokens[i + 1] / c->frac[i + 1];
		}
	const double flops = 6.0 * (double)in->d_model * (double)in->moe_inter;
	return fmax(bw, q * flops / ((gpu ? h->gpu_sgemm_gflops : h->cpu_fma_gflops) * 1e6));
}

/* E[t(R)], R ~ Binomial(B, p): every r from 1 to B, each probability from lgamma. */
static double ref_expect(const moet_cost_in *in, int gpu, double p)
{
	const double B = (double)in->batch;
	if (p >= 1)
		return ref_call(in, gpu, B);
	double sum = 0;
	for (double r = 1; r <= B; r++)
		sum += exp(lgamma(B + 1) - lgamma(r + 1) - lgamma(B - r + 1) + r * log(p) +
			   (B - r) * log(1 - p)) * ref_call(in, gpu, r);
	return sum;
}

/* The model's formula, written out with pow and products. */
static double ref_layer(const moet_cost_in *in, const double *s, int64_t E,
			const int16_t *own)
{
	double tot = 0, x[3] = { 0 }, none[3] = { 1, 1, 1 };   /* [0]: CPU, [1 + g]: GPU g */
	for (int64_t e = 0; e < E; e++)
		tot += s[e];
	if (tot == 0)
		return 0;
	for (int64_t e = 0; e < E; e++) {
		double p = fmin(1, s[e] * (double)in->top_k / tot);
		double P = 1 - pow(1 - p, (double)in->batch);
		x[own[e] + 1] += p > 0 ? ref_expect(in, own[e] >= 0, p) : 0;
		none[own[e] + 1] *= 1 - P;
	}
	const moet_cost_hw *h = &in->hw;
	double tc = (1 - none[0]) * h->cpu_overhead_us / 1e3 + x[0];
	double tg = 0;
	for (int g = 0; g < in->n_gpus; g++)
		tg = fmax(tg, (1 - none[1 + g]) * h->gpu_overhead_us / 1e3 + x[1 + g]);
	double act = (double)in->batch * (double)in->d_model * h->act_bytes;
	return fmax(tc, tg) + (1 - none[0]) * (2 * h->pcie_latency_us / 1e3 +
					       2 * act / h->pcie_gbps / 1e6);
}

static void test_predict(void)
{
	enum { L = 3, E = 6 };
	const double sc[L * E] = { 0, 0, 0, 0, 0, 0,   /* a dense layer */
				   50, 20, 10, 10, 5, 5, 30, 30, 10, 10, 10, 10 };
	const int16_t own[L * E] = { -1, -1, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1,
				     0, 0, 1, -1, -1, 1 };
	moet_cost_in in = { .batch = 3, .top_k = 2, .d_model = 7168,
			    .expert_bytes = 44050944, .dense_bytes = 1000000000, .n_gpus = 2,
			    .moe_inter = 2048 };
	moet_cost_hw_defaults(&in.hw);
	moet_cost_pred pr;
	/* B 3 and 40 with the compute curves, B 3 without them (bandwidth only). */
	for (int v = 0; v < 3; v++) {
		in.batch = v == 1 ? 40 : 3;
		if (v == 2)
			in.hw.cpu_fma_frac.n = in.hw.gpu_sgemm_frac.n = 0;
		CHECK(moet_cost_predict(&in, sc, L, E, own, &pr) == 0, "%s", moet_errmsg());
		double want = 0;
		for (int l = 0; l < L; l++)
			want += ref_layer(&in, sc + l * E, E, own + l * E);
		CHECK(fabs(pr.experts_ms - want) < 1e-9 * want, "case %d: experts %.12g ms, ours "
		      "%.12g", v, pr.experts_ms, want);
	}
	CHECK(fabs(pr.dense_ms - 1e9 / 2700e6) < 1e-12, "dense %.12g ms", pr.dense_ms);
	CHECK(fabs(pr.step_ms - pr.experts_ms - pr.dense_ms) < 1e-12, "step");
	/* a measured dense curve replaces the bytes: linear between points, the first point's
	 * value below, the last two points' line above; the experts' part is unchanged */
	const char *dc = "gpu_dense_ms: {1: 2.0, 16: 5.0, 64: 17.0}\n";
	CHECK(moet_cost_hw_parse("h.yaml", dc, strlen(dc), &in.hw) == 0, "%s", moet_errmsg());
	const double bs[] = { 1, 10, 16, 40, 64, 100 }, want_d[] = { 2, 3.8, 5, 11, 17, 26 };
	for (int i = 0; i < 6; i++) {
		in.batch = (int64_t)bs[i];
		CHECK(moet_cost_predict(&in, sc, L, E, own, &pr) == 0, "%s", moet_errmsg());
		CHECK(fabs(pr.dense_ms - want_d[i]) < 1e-12 && fabs(pr.step_ms - pr.experts_ms -
		      pr.dense_ms) < 1e-12, "batch %g: dense %.12g ms, want %g", bs[i], pr.dense_ms,
		      want_d[i]);
	}
	moet_cost_hw_defaults(&in.hw);
	int16_t bad[L * E];
	memcpy(bad, own, sizeof(bad));
	bad[7] = 2;
	CHECK(moet_cost_predict(&in, sc, L, E, bad, &pr) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "layer 1 expert 1"), "owner 2 of 2 GPUs: %s", moet_errmsg());
}

/* ---- hardware files ------------------------------------------------------------------------ */

static void hw_fault(const char *text, int want_rc, const char *want)
{
	moet_cost_hw hw;
	int rc = moet_cost_hw_parse("h.yaml", text, strlen(text), &hw);
	const char *m = moet_errmsg();
	CHECK(rc == want_rc && strstr(m, want) && !strchr(m, '\n'), "'%s': rc %d (want %d), "
	      "'%s' (want '%s')", text, rc, want_rc, m, want);
}

static void test_hw(void)
{
	char path[1024];
	moet_cost_hw hw, def;
	snprintf(path, sizeof(path), "%s/configs/hardware-h200-host.yaml", moet_test_source_dir());
	moet_cost_hw_defaults(&def);
	CHECK(moet_cost_hw_load(path, &hw) == 0, "%s", moet_errmsg());
	CHECK(hw.from_file && !strcmp(hw.name, "h200-host") && hw.cpu_read_gbps == 94 &&
	      hw.gpu_read_gbps == 2700 && hw.pcie_gbps == 55 && hw.act_bytes == 4,
	      "%s: %s %g %g %g", path, hw.name, hw.cpu_read_gbps, hw.gpu_read_gbps, hw.pcie_gbps);
	CHECK(hw.cpu_read_gbps == def.cpu_read_gbps && hw.gpu_read_gbps == def.gpu_read_gbps &&
	      hw.pcie_gbps == def.pcie_gbps && hw.pcie_latency_us == def.pcie_latency_us &&
	      hw.cpu_overhead_us == def.cpu_overhead_us &&
	      hw.gpu_overhead_us == def.gpu_overhead_us, "the defaults are not the file's");
	const char *part = "cpu_read_gbps: 120\n";
	CHECK(moet_cost_hw_parse("h.yaml", part, strlen(part), &hw) == 0 &&
	      hw.cpu_read_gbps == 120 && hw.gpu_read_gbps == def.gpu_read_gbps, "partial file");
	hw_fault("cpu_read_gbps: 9\nfoo: 1\n", MOET_EFORMAT, "h.yaml:2: unknown key 'foo'");
	hw_fault("pcie_gbps: 5\npcie_gbps: 6\n", MOET_EFORMAT,
		 "h.yaml:2: pcie_gbps given twice (first on line 1)");
	hw_fault("\n\ngpu_read_gbps: fast\n", MOET_EFORMAT, "h.yaml:3: gpu_read_gbps: 'fast' is "
		 "not a number");
	hw_fault("cpu_read_gbps: 0\n", MOET_ERANGE, "h.yaml:1: cpu_read_gbps: 0 out of range");
	hw_fault("cpu_overhead_us: -1\n", MOET_ERANGE, "h.yaml:1: cpu_overhead_us: -1 out of");
	hw_fault("act_bytes: 16\n", MOET_ERANGE, "h.yaml:1: act_bytes: 16 out of range");
	hw_fault("cpu_read_gbps: nan\n", MOET_EFORMAT, "h.yaml:1: cpu_read_gbps: 'nan' is not");
	hw_fault("cpu_read_gbps: [1, 2]\n", MOET_EFORMAT, "h.yaml:1: cpu_read_gbps: expected a "
		 "scalar");
	hw_fault("- 1\n- 2\n", MOET_EFORMAT, "h.yaml:1: expected a mapping");
	hw_fault("", MOET_EFORMAT, "h.yaml: empty hardware file");
	hw_fault("a: [1,\n", MOET_EFORMAT, "h.yaml:2: malformed YAML");
	hw_fault("name: ''\n", MOET_EFORMAT, "h.yaml:1: name: 1 to 63 characters");
	/* The compute figures: the file's (its comments name the records) are the defaults. */
	static const double tok[9] = { 2, 4, 8, 16, 32, 64, 128, 256, 1024 };
	static const double cf[9] = { 0.198, 0.324, 0.391, 0.524, 0.531, 0.502, 0.553, 0.555,
				      0.554 };
	static const double gf[9] = { 0.185, 0.283, 0.336, 0.341, 0.347, 0.353, 0.358, 0.362,
				      0.364 };
	snprintf(path, sizeof(path), "%s/configs/hardware-h200-host.yaml", moet_test_source_dir());
	CHECK(moet_cost_hw_load(path, &hw) == 0, "%s", moet_errmsg());
	CHECK(hw.cpu_fma_gflops == 1329 && hw.gpu_sgemm_gflops == 50575 &&
	      def.cpu_fma_gflops == 1329 && def.gpu_sgemm_gflops == 50575, "peaks %g %g",
	      hw.cpu_fma_gflops, hw.gpu_sgemm_gflops);
	CHECK(hw.cpu_fma_frac.n == 9 && hw.gpu_sgemm_frac.n == 9 && def.cpu_fma_frac.n == 9 &&
	      def.gpu_sgemm_frac.n == 9, "curve points %d %d", hw.cpu_fma_frac.n,
	      hw.gpu_sgemm_frac.n);
	for (int i = 0; i < 9 && hw.cpu_fma_frac.n == 9 && hw.gpu_sgemm_frac.n == 9; i++)
		CHECK(hw.cpu_fma_frac.tokens[i] == tok[i] &&
		      hw.gpu_sgemm_frac.tokens[i] == tok[i] &&
		      hw.cpu_fma_frac.frac[i] == cf[i] && hw.gpu_sgemm_frac.frac[i] == gf[i] &&
		      def.cpu_fma_frac.tokens[i] == tok[i] && def.cpu_fma_frac.frac[i] == cf[i] &&
		      def.gpu_sgemm_frac.tokens[i] == tok[i] && def.gpu_sgemm_frac.frac[i] == gf[i],
		      "point %d: %g tokens: cpu %g, gpu %g", i, hw.cpu_fma_frac.tokens[i],
		      hw.cpu_fma_frac.frac[i], hw.gpu_sgemm_frac.frac[i]);
	part = "cpu_fma_frac: {}\ngpu_sgemm_frac: {1: 0.5}\n";
	CHECK(moet_cost_hw_parse("h.yaml", part, strlen(part), &hw) == 0 && hw.cpu_fma_frac.n == 0
	      && hw.gpu_sgemm_frac.n == 1 && hw.gpu_sgemm_frac.frac[0] == 0.5, "{} and one point");
	part = "gpu_sgemm_frac:\n  4: 0.3\n  8: 0.6\n";   /* equal time per row: allowed */
	CHECK(moet_cost_hw_parse("h.yaml", part, strlen(part), &hw) == 0 &&
	      hw.gpu_sgemm_frac.n == 2, "equal times: %s", moet_errmsg());
	hw_fault("cpu_fma_frac: 0.5\n", MOET_EFORMAT, "h.yaml:1: cpu_fma_frac: expected a mapping");
	hw_fault("gpu_dense_ms:\n  1: 2.0\n  16: 1.5\n", MOET_ERANGE, "h.yaml:3: gpu_dense_ms: "
		 "batch 16 at 1.5 ms after 2 ms");
	hw_fault("gpu_dense_ms:\n  4: 0\n", MOET_ERANGE, "h.yaml:2: gpu_dense_ms: batch 4: 0 ms "
		 "out of range");
	hw_fault("gpu_dense_ms: 3\n", MOET_EFORMAT, "h.yaml:1: gpu_dense_ms: expected a mapping "
		 "of batch: milliseconds");
	hw_fault("cpu_fma_frac: [1, 2]\n", MOET_EFORMAT, "h.yaml:1: cpu_fma_frac: expected a "
		 "mapping");
	hw_fault("name: x\ncpu_fma_frac:\n", MOET_EFORMAT, "h.yaml:2: cpu_fma_frac: expected a "
		 "mapping");
	hw_fault("cpu_fma_frac:\n  2: 0.2\n  2.5: 0.3\n", MOET_EFORMAT, "h.yaml:3: cpu_fma_frac: "
		 "tokens '2.5' is not a whole number");
	hw_fault("cpu_fma_frac:\n  0: 0.2\n", MOET_EFORMAT, "h.yaml:2: cpu_fma_frac: tokens '0'");
	hw_fault("gpu_sgemm_frac:\n  two: 0.2\n", MOET_EFORMAT, "h.yaml:2: gpu_sgemm_frac: tokens "
		 "'two' is not");
	hw_fault("gpu_sgemm_frac:\n  2: fast\n", MOET_EFORMAT, "h.yaml:2: gpu_sgemm_frac: 2 "
		 "tokens: fraction 'fast' is not a number");
	hw_fault("gpu_sgemm_frac:\n  2: 1.5\n", MOET_ERANGE, "h.yaml:2: gpu_sgemm_frac: 2 tokens: "
		 "fraction 1.5 out of range");
	hw_fault("gpu_sgemm_frac:\n  2: 0\n", MOET_ERANGE, "h.yaml:2: gpu_sgemm_frac: 2 tokens: "
		 "fraction 0 out of range");
	hw_fault("gpu_sgemm_frac:\n  2: [0.1]\n", MOET_EFORMAT, "h.yaml:2: gpu_sgemm_frac: "
		 "expected scalar tokens: fraction pairs");
	hw_fault("cpu_fma_frac:\n  8: 0.4\n  4: 0.3\n", MOET_ERANGE, "h.yaml:3: cpu_fma_frac: 4 "
		 "tokens after 8: tokens must increase");
	hw_fault("cpu_fma_frac:\n  4: 0.2\n  8: 0.5\n", MOET_ERANGE, "h.yaml:3: cpu_fma_frac: 8 "
		 "tokens at 0.5 would take less time than 4 at 0.2");
	hw_fault("cpu_fma_frac: {1: .1, 2: .1, 3: .1, 4: .1, 5: .1, 6: .1, 7: .1, 8: .1, 9: .1, "
		 "10: .1, 11: .1, 12: .1, 13: .1, 14: .1, 15: .1, 16: .1, 17: .1}\n", MOET_ERANGE,
		 "h.yaml:1: cpu_fma_frac: more than 16 points");
	hw_fault("cpu_fma_frac: {}\ncpu_fma_frac: {}\n", MOET_EFORMAT, "h.yaml:2: cpu_fma_frac "
		 "given twice (first on line 1)");
	hw_fault("cpu_fma_gflops: 0\n", MOET_ERANGE, "h.yaml:1: cpu_fma_gflops: 0 out of range");
	hw_fault("gpu_sgemm_gflops: x\n", MOET_EFORMAT, "h.yaml:1: gpu_sgemm_gflops: 'x' is not");
	snprintf(path, sizeof(path), "%s/no-such-hw.yaml", tmp);
	CHECK(moet_cost_hw_load(path, &hw) == MOET_EIO && strstr(moet_errmsg(), "no-such-hw"),
	      "%s", moet_errmsg());
}

/* ---- --auto in memory ----------------------------------------------------------------------- */

enum { AL = 9, AE = 64 };   /* layer 0 dense, 8 MoE layers */

typedef struct world {
	moet_config cf;
	moet_placement_sizes *sz;
	moet_profile *p;
	double *scores;
} world;

/* Kimi-K2 per-layer geometry with AL layers and AE experts; decode counts of MoE layer l
 * ~ 1 / (1 + r)^alpha(l) (r a per-layer permutation of the ids). */
static int world_make(world *w, double (*alpha)(int64_t l))
{
	memset(w, 0, sizeof(*w));
	if (moet_test_kimi(AL, AE, &w->cf, &w->sz) ||
	    moet_profile_create(&w->cf, &w->p))
		return -1;
	for (int64_t l = 0; l < AL; l++) {
		if (!moet_config_is_moe_layer(&w->cf, l))
			continue;
		for (int64_t e = 0; e < AE; e++) {
			int64_t r = (e * 37 + 11 * l) % AE;
			w->p->counts[moet_profile_at(w->p, MOET_PROFILE_DECODE, l) + e] =
				(uint64_t)(1e6 / pow(1.0 + (double)r, alpha(l)));
		}
	}
	return moet_plan_scores(w->p, MOET_PLAN_DECODE, &w->scores);
}

static void world_free(world *w)
{
	free(w->scores);
	moet_profile_free(w->p);
	moet_placement_sizes_free(w->sz);
}

static double alpha_mixed(int64_t l)
{
	return l % 2 ? 2.0 : 0.2;   /* concentrated and flat layers alternate */
}

static double alpha_same(int64_t l)
{
	(void)l;
	return 1.0;
}

/* 1 GPU with room for exactly `slots` experts. */
static moet_plan_budget budget_for(const world *w, int64_t slots, const moet_cost_hw *hw,
				   int64_t batch, bool aut)
{
	const uint64_t eb = w->sz->expert_bytes[1 * AE];
	return (moet_plan_budget){ .n_gpus = 1, .budget_bytes = w->sz->dense_bytes + slots * eb,
				   .hw = hw, .batch = batch, .auto_slots = aut };
}

static void test_auto_mixed(void)
{
	world w;
	moet_plan *pl = NULL;
	moet_placement *pp = NULL;
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	if (world_make(&w, alpha_mixed)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	const int64_t S = 8 * 20;
	for (int64_t B = 1; B <= 16; B *= 4) {
		moet_plan_budget b = budget_for(&w, S, &hw, B, true);
		int rc = moet_plan_make(&w.cf, w.sz, w.scores, &b, &pl);
		if (!rc)
			rc = moet_plan_to_placement(pl, &w.cf, "auto", &b, &pp);
		if (!rc)
			rc = moet_placement_check(pp, w.sz);
		CHECK(rc == 0, "B %" PRId64 ": %s", B, moet_errmsg());
		if (rc)
			goto done;
		int64_t tot = 0, lo = AE, hi = 0;
		for (int64_t l = 1; l < AL; l++) {
			tot += pl->per_layer[l];
			lo = pl->per_layer[l] < lo ? pl->per_layer[l] : lo;
			hi = pl->per_layer[l] > hi ? pl->per_layer[l] : hi;
		}
		printf("mixed layers, B %" PRId64 ": --auto %.4f ms (%" PRId64 "..%" PRId64
		       " per layer, hit %.4f), even %.4f ms (hit %.4f)\n", B, pl->pred.step_ms,
		       lo, hi, pl->hit_rate, pl->even_pred.step_ms, pl->even_hit_rate);
		CHECK(tot <= S && pl->used[0] == tot, "B %" PRId64 ": %" PRId64 " experts placed, "
		      "%" PRId64 " slots", B, tot, S);
		CHECK(pl->auto_slots && !pl->auto_kept_even && lo < hi, "B %" PRId64 ": not uneven",
		      B);
		CHECK(pl->pred.step_ms < 0.97 * pl->even_pred.step_ms, "B %" PRId64 ": --auto %.4f "
		      "ms vs even %.4f ms", B, pl->pred.step_ms, pl->even_pred.step_ms);
		/* The reported prediction is the formula on the plan's own owner table. */
		double want = 0;
		for (int64_t l = 0; l < AL; l++)
			want += ref_layer(&pl->cost, w.scores + l * AE, AE, pl->owner + l * AE);
		CHECK(fabs(pl->pred.experts_ms - want) < 1e-9 * want, "B %" PRId64 ": %.12g vs "
		      "ours %.12g", B, pl->pred.experts_ms, want);
		moet_placement_free(pp);
		moet_plan_free(pl);
		pp = NULL;
		pl = NULL;
	}
done:
	moet_placement_free(pp);
	moet_plan_free(pl);
	world_free(&w);
}

static void test_auto_uniform(void)
{
	world w;
	moet_plan *pl = NULL, *ev = NULL;
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	if (world_make(&w, alpha_same)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	/* The ids are permuted per layer, the counts per rank the same: identical layers. */
	for (int64_t S = 8 * 20; S <= 8 * 20 + 3; S += 3) {
		moet_plan_budget b = budget_for(&w, S, &hw, 4, true);
		moet_plan_budget be = budget_for(&w, S, NULL, 1, false);
		CHECK(moet_plan_make(&w.cf, w.sz, w.scores, &b, &pl) == 0 &&
		      moet_plan_make(&w.cf, w.sz, w.scores, &be, &ev) == 0, "%s", moet_errmsg());
		if (!pl || !ev)
			goto done;
		for (int64_t l = 0; l < AL; l++)
			CHECK(pl->per_layer[l] == ev->per_layer[l], "S %" PRId64 " layer %" PRId64
			      ": --auto %" PRId64 ", even %" PRId64, S, l, pl->per_layer[l],
			      ev->per_layer[l]);
		CHECK(fabs(pl->pred.step_ms - pl->even_pred.step_ms) <= 1e-12 * pl->pred.step_ms,
		      "S %" PRId64 ": --auto %.15g, even %.15g", S, pl->pred.step_ms,
		      pl->even_pred.step_ms);
		moet_plan_free(pl);
		moet_plan_free(ev);
		pl = ev = NULL;
	}
done:
	moet_plan_free(pl);
	moet_plan_free(ev);
	world_free(&w);
}

/* Pure bandwidth (no overheads, no copy latency): the convex case where greedy is optimal. */
static void test_auto_optimal(void)
{
	world w;
	moet_plan *pl = NULL;
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	hw.cpu_overhead_us = hw.gpu_overhead_us = hw.pcie_latency_us = 0;
	if (world_make(&w, alpha_mixed)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	/* B = 1: the time saved by an expert is proportional to its p; the optimum is the
	 * global top S of p over all (layer, expert). */
	const int64_t S = 100;
	moet_plan_budget b = budget_for(&w, S, &hw, 1, true);
	CHECK(moet_plan_make(&w.cf, w.sz, w.scores, &b, &pl) == 0, "%s", moet_errmsg());
	if (!pl)
		goto done;
	double p[AL * AE], got = 0, best = 0;
	for (int64_t l = 0; l < AL; l++)
		moet_cost_touch(w.scores + l * AE, AE, w.cf.num_experts_per_tok, 1, p + l * AE);
	for (int64_t i = 0; i < AL * AE; i++)
		got += pl->owner[i] >= 0 ? p[i] : 0;
	uint8_t taken[AL * AE] = { 0 };
	for (int64_t s = 0; s < S; s++) {
		int64_t j = -1;
		for (int64_t i = 0; i < AL * AE; i++)
			if (!taken[i] && (j < 0 || p[i] > p[j]))
				j = i;
		taken[j] = 1;
		best += p[j];
	}
	CHECK(fabs(got - best) < 1e-12, "B 1: GPU share of p %.15g, global top %.15g", got,
	      best);
	moet_plan_free(pl);
	pl = NULL;
done:
	moet_plan_free(pl);
	world_free(&w);
}

/* B = 4 on 3 MoE layers of 64 experts: every allocation of S slots, by brute force. */
static void test_auto_brute(void)
{
	moet_config cf;
	moet_placement_sizes *sz = NULL;
	moet_plan *pl = NULL;
	double sc[4 * AE];
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	hw.cpu_overhead_us = hw.gpu_overhead_us = hw.pcie_latency_us = 0;
	if (moet_test_kimi(4, AE, &cf, &sz)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	const double al[4] = { 0, 0.3, 1.2, 2.5 };
	for (int64_t l = 0; l < 4; l++)
		for (int64_t e = 0; e < AE; e++)
			sc[l * AE + e] = l ? floor(1e6 / pow(1.0 + (double)e, al[l])) : 0;
	const int64_t S = 40;
	moet_plan_budget b = { .n_gpus = 1,
			       .budget_bytes = sz->dense_bytes + S * sz->expert_bytes[AE],
			       .hw = &hw, .batch = 4, .auto_slots = true };
	CHECK(moet_plan_make(&cf, sz, sc, &b, &pl) == 0, "%s", moet_errmsg());
	if (!pl)
		goto done;
	/* Experts are ranked by id here (counts fall with e), so top-n is ids 0..n-1. */
	int16_t own[4 * AE];
	moet_cost_pred pr;
	double best = INFINITY;
	int64_t bn[3] = { 0 };
	for (int64_t a = 0; a <= S; a++)
		for (int64_t c = 0; a + c <= S; c++) {
			int64_t n[4] = { 0, a, c, S - a - c };
			for (int64_t i = 0; i < 4 * AE; i++)
				own[i] = (int16_t)(i % AE < n[i / AE] ? 0 : -1);
			if (moet_cost_predict(&pl->cost, sc, 4, AE, own, &pr))
				continue;
			if (pr.step_ms < best) {
				best = pr.step_ms;
				bn[0] = a, bn[1] = c, bn[2] = S - a - c;
			}
		}
	printf("brute force B 4: best %.6f ms at %" PRId64 "/%" PRId64 "/%" PRId64
	       "; --auto %.6f ms at %" PRId64 "/%" PRId64 "/%" PRId64 "\n", best, bn[0], bn[1],
	       bn[2], pl->pred.step_ms, pl->per_layer[1], pl->per_layer[2], pl->per_layer[3]);
	CHECK(pl->pred.step_ms <= best * (1 + 1e-12), "--auto %.12g ms, brute force %.12g ms",
	      pl->pred.step_ms, best);
done:
	moet_plan_free(pl);
	moet_placement_sizes_free(sz);
}

/* ---- the binary ------------------------------------------------------------------------------ */

static void test_cli(void)
{
	char dir[1024], prof[1024], place[1024], hwf[1024], bad[1024], budget[64], *out = NULL;
	moet_gen_params gp;
	moet_config cf;
	moet_ckpt *ck = NULL;
	moet_placement_sizes *sz = NULL;
	moet_profile *p = NULL;
	snprintf(dir, sizeof(dir), "%s/ck", tmp);
	snprintf(prof, sizeof(prof), "%s/p.json", tmp);
	snprintf(place, sizeof(place), "%s/auto.yaml", tmp);
	snprintf(bad, sizeof(bad), "%s/bad-hw.yaml", tmp);
	snprintf(hwf, sizeof(hwf), "%s/configs/hardware-h200-host.yaml", moet_test_source_dir());
	moet_gen_params_init(&gp);
	gp.n_layers = 5;
	if (moet_gen_checkpoint(dir, &gp) || moet_config_load(dir, &cf) ||
	    moet_ckpt_open(dir, &ck) || moet_placement_sizes_from_ckpt(&cf, ck, &sz) ||
	    moet_profile_create(&cf, &p)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	const int64_t E = cf.n_routed_experts;
	for (int64_t l = 0; l < cf.num_hidden_layers; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&cf, l) && e < E; e++)
			p->counts[moet_profile_at(p, MOET_PROFILE_DECODE, l) + e] =
				(uint64_t)(1e5 / pow(1.0 + (double)e, l % 2 ? 2.0 : 0.2));
	CHECK(moet_profile_save(p, prof) == 0, "%s", moet_errmsg());
	const uint64_t d = sz->dense_bytes;
	snprintf(budget, sizeof(budget), "%" PRIu64 "B", d + 30 * sz->expert_bytes[E]);
	int st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --reserve-gb 0 "
		     "--auto --hardware %s --batch 4 --out %s", dir, prof, budget, hwf, place);
	CHECK(st == 0 && out && strstr(out, "predicted decode step: ") &&
	      strstr(out, "with the even split") && strstr(out, "cost model: hardware file"),
	      "plan --auto: exit %d\n%s", st, out ? out : "");
	double a = -1, ev = -1;
	const char *at = out ? strstr(out, "predicted decode step: ") : NULL;
	if (at)
		sscanf(at, "predicted decode step: %lf ms with --auto, %lf ms", &a, &ev);
	CHECK(a > 0 && ev > 0 && a < ev, "--auto %.4f ms, even %.4f ms", a, ev);
	free(out);
	out = NULL;
	moet_placement *pp = NULL;
	CHECK(moet_placement_load(place, &cf, sz, &pp) == 0, "%s", moet_errmsg());
	moet_placement_free(pp);
	FILE *f = fopen(place, "r");
	char text[4096] = "";
	if (f) {
		CHECK(fread(text, 1, sizeof(text) - 1, f) > 0, "read %s", place);
		fclose(f);
	}
	CHECK(strstr(text, "# predicted decode step: ") && strstr(text, "# the even split would "
	      "predict "), "header:\n%s", text);
	/* Without --auto, --hardware predicts the even split. */
	st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --reserve-gb 0 "
		 "--hardware %s --batch 4 --out %s.even.yaml", dir, prof, budget, hwf, place);
	double e2 = -1;
	at = out ? strstr(out, "predicted decode step: ") : NULL;
	if (at)
		sscanf(at, "predicted decode step: %lf ms", &e2);
	CHECK(st == 0 && fabs(e2 - ev) < 1.5e-3 && !strstr(out, "with --auto"),
	      "even plan with --hardware: %.4f ms, want %.4f\n%s", e2, ev, out ? out : "");
	free(out);
	out = NULL;
	st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --auto "
		 "--hot-per-layer 3 --out %s", dir, prof, budget, place);
	CHECK(st == 1 && out && strstr(out, "does not go with --hot-per-layer") &&
	      strchr(out, '\n') == out + strlen(out) - 1, "--auto with -k: %s", out ? out : "");
	free(out);
	out = NULL;
	CHECK(moet_test_write_file(bad, "cpu_read_gbps: 100\ngpu_read_gbps: -3\n", 37) == 0,
	      "write");
	st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --auto --hardware "
		 "%s --out %s", dir, prof, budget, bad, place);
	CHECK(st == 1 && out && strstr(out, "bad-hw.yaml:2: gpu_read_gbps: -3 out of range") &&
	      strchr(out, '\n') == out + strlen(out) - 1, "bad hardware: %s", out ? out : "");
	free(out);
	out = NULL;
	st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --auto --batch 0 "
		 "--out %s", dir, prof, budget, place);
	CHECK(st == 1 && out && strstr(out, "--batch"), "--batch 0: %s", out ? out : "");
	free(out);
	out = NULL;
	/* --layer-max spread: said in the printout and the file's header; the file loads. */
	st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --reserve-gb 0 "
		 "--auto --batch 16 --layer-max spread --out %s.spread.yaml", dir, prof, budget,
		 place);
	CHECK(st == 0 && out && strstr(out, "layer max: spread"), "--layer-max spread: exit %d\n%s",
	      st, out ? out : "");
	free(out);
	out = NULL;
	char sp_path[1100];
	snprintf(sp_path, sizeof(sp_path), "%s.spread.yaml", place);
	CHECK(moet_placement_load(sp_path, &cf, sz, &pp) == 0, "%s", moet_errmsg());
	moet_placement_free(pp);
	pp = NULL;
	if ((f = fopen(sp_path, "r"))) {
		memset(text, 0, sizeof(text));
		CHECK(fread(text, 1, sizeof(text) - 1, f) > 0, "read %s", sp_path);
		fclose(f);
	}
	CHECK(strstr(text, "layer max spread)"), "spread header:\n%s", text);
	st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --layer-max "
		 "spread --out %s", dir, prof, budget, place);
	CHECK(st == 1 && out && strstr(out, "--layer-max spread: only with --predict, --auto or "
	      "--hardware"), "--layer-max without the cost model: %s", out ? out : "");
	free(out);
	out = NULL;
	st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb %s --auto "
		 "--layer-max max --out %s", dir, prof, budget, place);
	CHECK(st == 1 && out && strstr(out, "--layer-max 'max': want means or spread"),
	      "--layer-max max: %s", out ? out : "");
done:
	free(out);
	moet_profile_free(p);
	moet_placement_sizes_free(sz);
	moet_ckpt_close(ck);
}

int main(void)
{
	tmp = moet_test_mkdtemp("cost");
	if (!tmp)
		return 1;
	test_touch();
	test_predict();
	test_hw();
	test_auto_mixed();
	test_auto_uniform();
	test_auto_optimal();
	test_auto_brute();
	test_cli();
	free(tmp);
	return moet_test_done("test_cost");
}
