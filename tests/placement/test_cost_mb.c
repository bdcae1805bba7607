/*
 * test_cost_mb.c: the two-micro-batch form of the decode step cost model (placement/cost_mb.c,
 * moet_cost.h) and its printing by `plan --predict`.
 *
 * - Brute force: routings drawn from a layer's frequencies (each token picks top_k distinct
 *   experts by systematic sampling, whose inclusion chance of expert e is exactly p_e), the
 *   tokens split into the engine's halves; the means over many steps of the CPU experts each
 *   half touches, of those both touch, of the one-pass count and of the CPU tier's call times
 *   (one call per touched expert, t(rows) of moet_cost_call_ms) against the model's
 *   expectations, within 5 standard errors of the simulation.
 * - Properties: the halves' CPU reads are never fewer than one pass's, and exceed them by
 *   exactly the expected experts both halves read (P_a + P_b - P_a P_b = P_ab); that excess
 *   vanishes with the CPU experts' routing chance (bounded by B_b p_max x the one-pass reads)
 *   and is 0 when the CPU holds no routed expert; bandwidth only, the halves' CPU time is never
 *   below one pass's.
 * - The step: moet_cost_predict's two-half step against this file's own evaluation of the
 *   formula of moet_cost.h (binomial sums with lgamma, products for the busy chances, the
 *   dense curve), several layers, a dense layer, overheads.
 * - The choice: no split at B = 1 or with two GPUs; nothing to hide (no copies, no dense
 *   work): one pass always; every expert on the GPU: one pass; a dense part as large as a
 *   CPU tier of rarely shared cold experts: two halves, and chosen_ms is the smaller step.
 * - moet_cost_dense_moe_share against the checkpoint's own tensor bytes.
 * - The binary: plan --predict --json on a one-GPU placement: one_pass_ms, two_halves_ms,
 *   chosen, chosen_ms equal moet_cost_predict_step's (with the spread, plan's default); batch
 *   1 has no two-half form; the table has the forms.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_cost.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_placement.h"
#include "moet_profile.h"
#include "moet_test.h"

static char *tmp;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double uniform(void)
{
	return (double)(moet_test_xorshift64(&rng) >> 11) / 9007199254740992.0;
}

enum { E = 64, K = 8 };

/* A Kimi-K2 expert on the H200 figures, one GPU, no fixed costs unless asked. */
static moet_cost_in kimi_in(int64_t batch)
{
	moet_cost_in in = { .batch = batch, .top_k = K, .d_model = 7168,
			    .expert_bytes = 44050944, .dense_bytes = 0, .n_gpus = 1,
			    .moe_inter = 2048 };
	moet_cost_hw_defaults(&in.hw);
	return in;
}

/* Zipf-like scores over a shuffled order: s_e = 1 / (1 + rank)^alpha. */
static void zipf(double *s, double alpha)
{
	int perm[E];
	for (int e = 0; e < E; e++)
		perm[e] = e;
	for (int e = E - 1; e > 0; e--) {
		int j = (int)(uniform() * (e + 1)), t = perm[e];
		perm[e] = perm[j];
		perm[j] = t;
	}
	for (int e = 0; e < E; e++)
		s[perm[e]] = 1 / pow(1.0 + e, alpha);
}

static void halves(int64_t B, int64_t *a, int64_t *b)
{
	*a = B / 2 > 1 ? B / 2 : 1;
	*b = B - *a;
}

/* ---- brute force ------------------------------------------------------------------------- */

/* One token's K experts: systematic sampling on the cumulative p (sum K, each p < 1): the
 * points u, u + 1, ..., u + K - 1 each fall in one expert's interval. */
static void draw_token(const double *p, int *rows)
{
	const double u = uniform();
	double cum = 0;
	int e = 0;
	for (int i = 0; i < K; i++) {
		const double x = u + i;
		while (e < E - 1 && cum + p[e] <= x)
			cum += p[e++];
		rows[e]++;
	}
}

typedef struct moments {
	double n, sum, sq;
} moments;

static void add(moments *m, double x)
{
	m->n++;
	m->sum += x;
	m->sq += x * x;
}

/* |mean - want| within 5 standard errors (and a hair of rounding). */
static void check_mean(const char *what, int64_t B, const moments *m, double want)
{
	const double mean = m->sum / m->n, var = fmax(0, m->sq / m->n - mean * mean);
	const double se = sqrt(var / m->n);
	CHECK(fabs(mean - want) <= 5 * se + 1e-9 * fabs(want), "B %" PRId64 " %s: simulated "
	      "%.6f (se %.6f), model %.6f", B, what, mean, se, want);
	printf("  B %3" PRId64 " %-22s simulated %10.5f +- %.5f, model %10.5f\n", B, what, mean,
	       se, want);
}

static void test_brute_force(void)
{
	double s[E], p[E], tot = 0;
	int16_t own[E];
	zipf(s, 0.9);
	for (int e = 0; e < E; e++)
		tot += s[e];
	for (int e = 0; e < E; e++) {
		p[e] = s[e] * K / tot;
		own[e] = (e % 3 == 0) ? 0 : -1; /* two thirds on the CPU */
	}
	CHECK(p[0] < 1, "p < 1");
	static const int64_t Bs[] = { 2, 3, 8, 16, 64 };
	printf("brute force against the model (one layer of %d experts, top-%d):\n", E, K);
	for (size_t bi = 0; bi < sizeof(Bs) / sizeof(Bs[0]); bi++) {
		const int64_t B = Bs[bi];
		moet_cost_in in = kimi_in(B);
		in.hw.cpu_overhead_us = in.hw.gpu_overhead_us = 0; /* cpu_ms: the calls alone */
		moet_cost_pred pr;
		CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0, "%s", moet_errmsg());
		int64_t ba, bb;
		halves(B, &ba, &bb);
		CHECK(pr.two.possible && pr.two.batch_a == ba && pr.two.batch_b == bb, "halves");
		moments d2 = { 0 }, sh = { 0 }, d1 = { 0 }, t2 = { 0 }, t1 = { 0 };
		const int trials = B >= 64 ? 3000 : 8000;
		for (int it = 0; it < trials; it++) {
			int ra[E] = { 0 }, rb[E] = { 0 };
			for (int64_t t = 0; t < B; t++)
				draw_token(p, t < ba ? ra : rb);
			double nd2 = 0, nsh = 0, nd1 = 0, x2 = 0, x1 = 0;
			for (int e = 0; e < E; e++) {
				if (own[e] >= 0)
					continue;
				nd2 += (ra[e] > 0) + (rb[e] > 0);
				nsh += ra[e] > 0 && rb[e] > 0;
				nd1 += ra[e] + rb[e] > 0;
				x2 += moet_cost_call_ms(&in, false, ra[e]) +
				      moet_cost_call_ms(&in, false, rb[e]);
				x1 += moet_cost_call_ms(&in, false, ra[e] + rb[e]);
			}
			add(&d2, nd2);
			add(&sh, nsh);
			add(&d1, nd1);
			add(&t2, x2);
			add(&t1, x1);
		}
		check_mean("CPU reads, two halves", B, &d2, pr.two.cpu_distinct);
		check_mean("read by both halves", B, &sh, pr.two.cpu_shared);
		check_mean("CPU reads, one pass", B, &d1, pr.cpu_distinct);
		check_mean("CPU ms, two halves", B, &t2, pr.two.cpu_ms);
		check_mean("CPU ms, one pass", B, &t1, pr.cpu_ms);
	}
}

/* ---- properties -------------------------------------------------------------------------- */

static void test_properties(void)
{
	for (int k = 0; k < 300; k++) {
		double s[E];
		int16_t own[E];
		zipf(s, 0.2 + 2 * uniform());
		const double cpu_share = uniform();
		for (int e = 0; e < E; e++)
			own[e] = uniform() < cpu_share ? -1 : 0;
		const int64_t B = 2 + (int64_t)(uniform() * 100);
		moet_cost_in in = kimi_in(B), bw = kimi_in(B);
		bw.hw.cpu_fma_frac.n = bw.hw.gpu_sgemm_frac.n = 0; /* bandwidth only */
		bw.hw.cpu_overhead_us = 0;
		moet_cost_pred pr, pb;
		CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0 &&
		      moet_cost_predict(&bw, s, 1, E, own, &pb) == 0, "%s", moet_errmsg());
		const double d1 = pr.cpu_distinct, d2 = pr.two.cpu_distinct, sh = pr.two.cpu_shared;
		CHECK(d2 >= d1 - 1e-12 && fabs(d2 - d1 - sh) <= 1e-9 * fmax(1, d2),
		      "case %d B %" PRId64 ": reads %.12g (two) vs %.12g (one) + %.12g shared", k,
		      B, d2, d1, sh);
		CHECK(pb.two.cpu_ms >= pb.cpu_ms * (1 - 1e-12), "case %d: bandwidth only, two "
		      "halves' CPU %.9g ms below one pass's %.9g", k, pb.two.cpu_ms, pb.cpu_ms);
		/* The excess vanishes with the CPU experts' chance: shared <= B_b p_max D_one. */
		double tot = 0, pmax = 0;
		for (int e = 0; e < E; e++)
			tot += s[e];
		for (int e = 0; e < E; e++)
			if (own[e] < 0)
				pmax = fmax(pmax, fmin(1, s[e] * K / tot));
		int64_t ba, bb;
		halves(B, &ba, &bb);
		CHECK(sh <= (double)bb * pmax * d1 * (1 + 1e-12) + 1e-15, "case %d: shared %.9g > "
		      "B_b p_max D = %.9g", k, sh, (double)bb * pmax * d1);
	}
	/* No routed expert on the CPU: nothing read, nothing read twice. */
	double s[E];
	int16_t own[E];
	zipf(s, 1);
	for (int e = 0; e < E; e++) {
		own[e] = e < 32 ? 0 : -1;
		if (e >= 32)
			s[e] = 0;
	}
	moet_cost_in in = kimi_in(16);
	moet_cost_pred pr;
	CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0, "%s", moet_errmsg());
	CHECK(pr.cpu_distinct == 0 && pr.two.cpu_distinct == 0 && pr.two.cpu_shared == 0 &&
	      pr.two.cpu_ms == 0 && pr.two.transfer_ms == 0, "unrouted CPU experts: %g %g %g",
	      pr.cpu_distinct, pr.two.cpu_distinct, pr.two.cpu_shared);
}

/* ---- the step against the formula --------------------------------------------------------- */

static double ref_dense(const moet_cost_in *in, int64_t batch)
{
	const moet_cost_curve *c = &in->hw.gpu_dense_ms;
	if (!c->n)
		return (double)in->dense_bytes / (in->hw.gpu_read_gbps * 1e6);
	const double b = (double)batch;
	if (c->n == 1 || b <= c->tokens[0])
		return c->frac[0];
	int i = c->n - 1;
	for (int j = 1; j < c->n; j++)
		if (b <= c->tokens[j]) {
			i = j;
			break;
		}
	return c->frac[i - 1] + (b - c->tokens[i - 1]) / (c->tokens[i] - c->tokens[i - 1]) *
				       (c->frac[i] - c->frac[i - 1]);
}

/* E[t(R)], R ~ Binomial(n, p): every term by lgamma. */
static double ref_expect(const moet_cost_in *in, int gpu, double p, int64_t n)
{
	if (p >= 1)
		return moet_cost_call_ms(in, gpu, (double)n);
	double sum = 0;
	for (int64_t r = 1; r <= n; r++) {
		const double lp = lgamma((double)n + 1) - lgamma((double)r + 1) -
				  lgamma((double)(n - r) + 1) + (double)r * log(p) +
				  (double)(n - r) * log1p(-p);
		if (lp > -745)
			sum += exp(lp) * moet_cost_call_ms(in, gpu, (double)r);
	}
	return sum;
}

/* The two-half step of moet_cost.h's design note, evaluated here from its text. */
static double ref_two(const moet_cost_in *in, const double *sc, int64_t nl, const int16_t *own)
{
	int64_t bh[2], n_moe = 0;
	halves(in->batch, &bh[0], &bh[1]);
	const moet_cost_hw *h = &in->hw;
	const double share = in->dense_moe_share;
	for (int64_t l = 0; l < nl; l++) {
		double tot = 0;
		for (int e = 0; e < E; e++)
			tot += sc[l * E + e];
		n_moe += tot > 0;
	}
	double step = 0;
	for (int k = 0; k < 2; k++)
		step += ref_dense(in, bh[k]) * (1 - share);
	for (int64_t l = 0; l < nl; l++) {
		double tot = 0;
		for (int e = 0; e < E; e++)
			tot += sc[l * E + e];
		if (tot == 0)
			continue;
		double cpu = 0, gpu = 0, chain = 0;
		for (int k = 0; k < 2; k++) {
			double xc = 0, xg = 0, nc = 1, ng = 1;
			for (int e = 0; e < E; e++) {
				const double p = fmin(1, sc[l * E + e] * K / tot);
				if (!(p > 0))
					continue;
				const double none = pow(1 - p, (double)bh[k]);
				if (own[l * E + e] < 0) {
					xc += ref_expect(in, 0, p, bh[k]);
					nc *= none;
				} else {
					xg += ref_expect(in, 1, p, bh[k]);
					ng *= none;
				}
			}
			const double C = (1 - nc) * h->cpu_overhead_us / 1e3 + xc;
			const double G = (1 - ng) * h->gpu_overhead_us / 1e3 + xg;
			const double act = (double)bh[k] * (double)in->d_model * h->act_bytes;
			const double Y = (1 - nc) * (2 * h->pcie_latency_us / 1e3 +
						     2 * act / (h->pcie_gbps * 1e6));
			const double N = ref_dense(in, bh[k]) * share / (double)n_moe;
			cpu += C;
			gpu += N + G + Y;
			chain = fmax(chain, N + fmax(C, G) + Y);
		}
		step += fmax(fmax(cpu, gpu), chain);
	}
	return step;
}

static void test_formula(void)
{
	enum { NL = 4 };
	double sc[NL * E] = { 0 };
	int16_t own[NL * E];
	for (int l = 1; l < NL; l++) /* layer 0 dense */
		zipf(sc + l * E, 0.3 + 0.7 * l);
	for (int i = 0; i < NL * E; i++)
		own[i] = uniform() < 0.4 ? -1 : 0;
	const char *curve = "gpu_dense_ms: {1: 2.5, 4: 3.6, 16: 6.1, 64: 20.5}\n";
	for (int64_t B = 2; B <= 64; B = B * 2 + 1) {
		for (int v = 0; v < 2; v++) {
			moet_cost_in in = kimi_in(B);
			in.dense_bytes = 3000000000ull;
			in.dense_moe_share = v ? 0.8 : 0.35;
			if (v)
				CHECK(moet_cost_hw_parse("c.yaml", curve, strlen(curve),
							 &in.hw) == 0, "%s", moet_errmsg());
			moet_cost_pred pr;
			CHECK(moet_cost_predict(&in, sc, NL, E, own, &pr) == 0, "%s",
			      moet_errmsg());
			const double want = ref_two(&in, sc, NL, own);
			CHECK(fabs(pr.two.step_ms - want) <= 1e-9 * want, "B %" PRId64 " v %d: two "
			      "halves %.12g ms, the formula %.12g", B, v, pr.two.step_ms, want);
			CHECK(fabs(pr.two.layers_ms + pr.two.dense_ms - pr.two.step_ms) <= 1e-12 *
			      pr.two.step_ms && pr.chosen_ms == fmin(pr.step_ms, pr.two.step_ms) &&
			      pr.form == (pr.two.step_ms < pr.step_ms ? MOET_COST_TWO_HALVES :
					  MOET_COST_ONE_PASS), "parts and choice at B %" PRId64, B);
		}
	}
}

/* ---- the choice --------------------------------------------------------------------------- */

static void test_choice(void)
{
	double s[E];
	int16_t own[E];
	zipf(s, 1);
	for (int e = 0; e < E; e++)
		own[e] = e % 2 ? -1 : 0;
	moet_cost_pred pr;
	moet_cost_in in = kimi_in(1);
	CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0 && !pr.two.possible &&
	      pr.form == MOET_COST_ONE_PASS && pr.chosen_ms == pr.step_ms, "B = 1: one pass");
	in = kimi_in(16);
	in.n_gpus = 2;
	CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0 && !pr.two.possible &&
	      pr.chosen_ms == pr.step_ms, "two GPUs: one pass");
	/* Nothing to hide (no copies, no dense work): never two halves. */
	for (int k = 0; k < 200; k++) {
		zipf(s, 0.2 + 2 * uniform());
		for (int e = 0; e < E; e++)
			own[e] = uniform() < 0.5 ? -1 : 0;
		in = kimi_in(2 + (int64_t)(uniform() * 100));
		in.hw.pcie_latency_us = 0;
		in.hw.pcie_gbps = 1e6;
		in.dense_moe_share = uniform();
		CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0, "%s", moet_errmsg());
		CHECK(pr.two.step_ms >= pr.step_ms - 1e-9 && pr.form == MOET_COST_ONE_PASS,
		      "case %d B %" PRId64 ": nothing to hide, yet two halves %.9g < %.9g", k,
		      in.batch, pr.two.step_ms, pr.step_ms);
	}
	/* Every expert on the GPU: the halves only add fixed costs. */
	const char *curve = "gpu_dense_ms: {1: 2.5, 4: 3.6, 16: 6.1, 64: 20.5}\n";
	for (int64_t B = 2; B <= 128; B *= 2) {
		zipf(s, 1);
		for (int e = 0; e < E; e++)
			own[e] = 0;
		in = kimi_in(B);
		in.dense_moe_share = 0.8;
		CHECK(moet_cost_hw_parse("c.yaml", curve, strlen(curve), &in.hw) == 0, "%s",
		      moet_errmsg());
		CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0 && pr.form ==
		      MOET_COST_ONE_PASS && pr.two.step_ms > pr.step_ms, "all on the GPU, B %"
		      PRId64 ": two halves %.6f, one pass %.6f", B, pr.two.step_ms, pr.step_ms);
	}
	/* Hiding pays: 48 hot experts on the GPU, 16 cold ones with 2% of routings on the CPU
	 * (seldom shared by the halves), a dense part that grows with the batch and is as
	 * long as the CPU tier: the GPU's dense work of one half hides behind the other's CPU
	 * tier. */
	for (int e = 0; e < E; e++) {
		own[e] = e < 48 ? 0 : -1;
		s[e] = e < 48 ? 0.98 / 48 : 0.02 / 16;
	}
	const char *lin = "gpu_dense_ms: {1: 0.03125, 64: 2}\n";
	in = kimi_in(64);
	in.dense_moe_share = 1;
	CHECK(moet_cost_hw_parse("l.yaml", lin, strlen(lin), &in.hw) == 0, "%s", moet_errmsg());
	CHECK(moet_cost_predict(&in, s, 1, E, own, &pr) == 0, "%s", moet_errmsg());
	CHECK(pr.form == MOET_COST_TWO_HALVES && pr.two.step_ms < 0.85 * pr.step_ms &&
	      pr.chosen_ms == pr.two.step_ms, "overlap pays: two halves %.4f ms, one pass %.4f ms "
	      "(CPU %.4f, reads %.2f -> %.2f)", pr.two.step_ms, pr.step_ms, pr.cpu_ms,
	      pr.cpu_distinct, pr.two.cpu_distinct);
	printf("overlap case, B 64: one pass %.3f ms, two halves %.3f ms (CPU reads %.2f -> "
	       "%.2f)\n", pr.step_ms, pr.two.step_ms, pr.cpu_distinct, pr.two.cpu_distinct);
}

/* ---- a checkpoint and the binary ----------------------------------------------------------- */

static void test_ckpt_and_cli(void)
{
	char dir[1024], prof[1100], place[1100];
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.n_layers = 4;
	snprintf(dir, sizeof(dir), "%s/ck", tmp);
	snprintf(prof, sizeof(prof), "%s/p.json", tmp);
	snprintf(place, sizeof(place), "%s/p.yaml", tmp);
	moet_config cf;
	moet_ckpt *ck = NULL;
	moet_placement_sizes *sz = NULL;
	moet_profile *p = NULL;
	moet_placement *pl = NULL;
	if (moet_gen_checkpoint(dir, &gp) || moet_config_load(dir, &cf) ||
	    moet_ckpt_open(dir, &ck) || moet_placement_sizes_from_ckpt(&cf, ck, &sz) ||
	    moet_profile_create(&cf, &p)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	/* The share of the dense part in the MoE layers, from the tensors themselves (norms
	 * are counted apart by the sizes, and left out of the share). */
	double in_moe = 0, whole = 0;
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		long long l = -1;
		if (strstr(t->name, ".experts.") || !strcmp(t->name, "model.embed_tokens.weight"))
			continue;
		whole += (double)t->n_bytes;
		if (sscanf(t->name, "model.layers.%lld.", &l) == 1 &&
		    moet_config_is_moe_layer(&cf, l) && !strstr(t->name, "layernorm") && (strstr(t->name, ".self_attn.") ||
		    strstr(t->name, ".mlp.gate.") || strstr(t->name, ".mlp.shared_experts.")))
			in_moe += (double)t->n_bytes;
	}
	const double share = moet_cost_dense_moe_share(&cf, sz);
	CHECK(fabs(share - in_moe / whole) <= 1e-12 && share > 0 && share < 1, "dense share "
	      "%.15g, the tensors say %.15g", share, in_moe / whole);
	const int64_t nl = cf.num_hidden_layers, ne = cf.n_routed_experts;
	for (int64_t l = 0; l < nl; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&cf, l) && e < ne; e++)
			p->counts[moet_profile_at(p, MOET_PROFILE_DECODE, l) + e] =
				(uint64_t)(1e5 / pow(1.0 + (double)((e * 7 + l) % ne), 0.8));
	moet_placement_gpu g = { .name = "a", .budget_bytes = 1ull << 40 };
	if (moet_profile_save(p, prof) ||
	    moet_placement_create("p.yaml", &cf, 1, &g, 0, &pl)) {
		CHECK(0, "profile / placement: %s", moet_errmsg());
		goto done;
	}
	for (int64_t l = 0; l < nl; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&cf, l) && e < ne; e++)
			if ((e * 7 + l) % ne < ne / 2 && moet_placement_set_owner(pl, l, e, 0))
				CHECK(0, "owner: %s", moet_errmsg());
	CHECK(moet_placement_save(pl, place, NULL, NULL) == 0, "%s", moet_errmsg());
	char *out = NULL;
	int st = moet_test_cli(&out, "plan --predict --model %s --placement %s --profile %s "
			       "--batch 1,4,64 --json", dir, place, prof);
	json_t *j = st == 0 && out ? json_loads(out, 0, NULL) : NULL;
	json_t *a = j ? json_object_get(j, "predictions") : NULL;
	CHECK(json_is_array(a) && json_array_size(a) == 3, "--json: exit %d\n%s", st,
	      out ? out : "");
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	hw.layer_max = MOET_COST_MAX_SPREAD; /* plan's default */
	for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
		json_t *r = json_array_get(a, i);
		const int64_t B = json_integer_value(json_object_get(r, "batch"));
		moet_cost_pred pr;
		CHECK(moet_cost_predict_step(&cf, sz, pl, p, MOET_PROFILE_DECODE, &hw, B, &pr) == 0,
		      "%s", moet_errmsg());
		json_t *two = json_object_get(r, "two_halves_ms");
		const char *ch = json_string_value(json_object_get(r, "chosen"));
		const double one = json_number_value(json_object_get(r, "one_pass_ms"));
		const double cho = json_number_value(json_object_get(r, "chosen_ms"));
		CHECK(fabs(one - pr.step_ms) <= 1e-8 * pr.step_ms &&
		      fabs(cho - pr.chosen_ms) <= 1e-8 * pr.chosen_ms && ch &&
		      !strcmp(ch, moet_cost_form_name(pr.form)), "row %zu: one pass %g (%g), "
		      "chosen %s %g (%g)", i, one, pr.step_ms, ch ? ch : "-", cho, pr.chosen_ms);
		if (B == 1)
			CHECK(json_is_null(two) && json_is_null(json_object_get(r, "two_halves")),
			      "batch 1: no two-half form");
		else
			CHECK(json_is_number(two) &&
			      fabs(json_number_value(two) - pr.two.step_ms) <= 1e-8 * pr.two.step_ms && json_is_object(json_object_get(r,
								      "two_halves")),
			      "batch %" PRId64 ": two halves %g, the library %g", B,
			      json_number_value(two), pr.two.step_ms);
	}
	json_decref(j);
	free(out);
	out = NULL;
	st = moet_test_cli(&out, "plan --predict --model %s --placement %s --profile %s "
			   "--batch 1,8", dir, place, prof);
	CHECK(st == 0 && out && strstr(out, "two_halves_ms") && strstr(out, "chosen") &&
	      strstr(out, "4+4"), "table: exit %d\n%s", st, out ? out : "");
	free(out);
done:
	moet_placement_free(pl);
	moet_profile_free(p);
	moet_placement_sizes_free(sz);
	moet_ckpt_close(ck);
}

int main(void)
{
	tmp = moet_test_mkdtemp("costmb");
	if (!tmp)
		return 1;
	test_brute_force();
	test_properties();
	test_formula();
	test_choice();
	test_ckpt_and_cli();
	free(tmp);
	return moet_test_done("test_cost_mb");
}
