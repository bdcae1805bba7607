/*
 * test_plan_mix.c: `plan --auto` for a batch mix (placement/moet_plan.h: n_mix, mix_batch,
 * mix_weight; `moet-hybrid plan --auto --batch B[:W],...`).
 *
 * - Brute force (the convex case: the H200 figures without fixed overheads or copy latency):
 *   3 MoE layers of 12 Kimi-K2-sized experts of different concentration, top-2, one GPU,
 *   mixes of 2 and 3 batches with weights, 4 to 20 slots. The test prices every layer at
 *   every count n (its top n experts by the test's own ranking on the GPU) through the public
 *   moet_cost_predict at each batch, and searches every allocation n_1..n_L with sum <= S
 *   for the least weighted sum of the steps; the plan's weighted objective equals it. With
 *   the overheads (greedy then a heuristic) the plan never predicts more than the even split
 *   on the weighted objective, and its gap to the optimum is printed.
 * - A one-batch mix is the plain batch: the same counts and prediction in the library (weight
 *   1 and 2), and through the binary `--batch 16:1` writes the same file and prints the same
 *   lines as `--batch 16`.
 * - The binary with a mix: a row per batch and plan, each batch's predicted step, the
 *   weighted sums (checked against the printed steps), the file's header lines; a list with
 *   --hot-per-layer --hardware prints each batch; a list or weights without a cost model and
 *   bad lists (1:0, 1:-2, 1:x, ,4, 4:, 1,,4, weights with --predict) are one-line errors
 *   naming --batch; the library refuses a bad mix too.
 * - Kimi-K2's 61 x 384 on 4 GPUs with the mix 1,4,16,64: the planning time is printed
 *   (target <= 1 s, asserted generously for sanitizer builds).
 */
#include <inttypes.h>
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

enum { L = 4, E = 12 }; /* layer 0 dense */

static char *tmp;

/* Distinct scores; each layer's concentration (Zipf exponent) from al[k], expert ids shuffled
 * so that rank and id differ. */
static void scores_make(double *sc, uint64_t seed, int k)
{
	static const double als[3][L] = { { 0, 0.2, 1.0, 2.2 }, { 0, 1.5, 0.5, 0.9 },
					   { 0, 0.8, 2.5, 0.1 } };
	const double *al = als[k];
	uint64_t x = seed;
	for (int64_t l = 0; l < L; l++) {
		int32_t perm[E];
		for (int e = 0; e < E; e++)
			perm[e] = e;
		for (int e = E - 1; e > 0; e--) {
			int j = (int)(moet_test_xorshift64(&x) % (uint64_t)(e + 1)), t = perm[e];
			perm[e] = perm[j];
			perm[j] = t;
		}
		for (int e = 0; e < E; e++)
			sc[l * E + perm[e]] = l ? floor(1e6 / pow(1.0 + e, al[l])) + e : 0;
	}
}

/* The test's own ranking: top[l][i] = the i-th expert of layer l by score (repeated maximum;
 * the scores are distinct). */
static void rank_layers(const double *sc, int top[L][E])
{
	for (int l = 0; l < L; l++) {
		uint8_t used[E] = { 0 };
		for (int i = 0; i < E; i++) {
			int best = -1;
			for (int e = 0; e < E; e++)
				if (!used[e] && (best < 0 || sc[l * E + e] > sc[l * E + best]))
					best = e;
			used[best] = 1;
			top[l][i] = best;
		}
	}
}

typedef struct mix {
	int n;
	int64_t b[4];
	double w[4];
} mix;

/*
 * T[l][n]: the weighted sum over the mix of layer l's predicted time (experts_ms) with its top
 * n experts on GPU 0, each from moet_cost_predict on a table of that layer alone; *dense:
 * the weighted dense part. 0 or the error.
 */
static int layer_table(const moet_cost_in *in0, const double *sc, const mix *m,
		       double T[L][E + 1], double *dense)
{
	int top[L][E];
	double one[L * E];
	int16_t own[L * E];
	rank_layers(sc, top);
	*dense = 0;
	for (int l = 0; l < L; l++)
		for (int n = 0; n <= E; n++) {
			T[l][n] = 0;
			for (int i = 0; i < L * E; i++) {
				one[i] = i / E == l ? sc[i] : 0;
				own[i] = MOET_PLACEMENT_CPU;
			}
			for (int i = 0; i < n; i++)
				own[l * E + top[l][i]] = 0;
			for (int b = 0; b < m->n; b++) {
				moet_cost_in in = *in0;
				moet_cost_pred pr;
				in.batch = m->b[b];
				int rc = moet_cost_predict(&in, one, L, E, own, &pr);
				if (rc)
					return rc;
				T[l][n] += m->w[b] * pr.experts_ms;
				if (l == 0 && n == 0)
					*dense += m->w[b] * pr.dense_ms;
			}
		}
	return 0;
}

/* The least sum_l T[l][n_l] over n_1..n_{L-1} in 0..E with sum <= S (layer 0: dense). */
static double brute(double T[L][E + 1], int S, int best_n[L])
{
	double best = INFINITY;
	for (int a = 0; a <= E && a <= S; a++)
		for (int b = 0; b <= E && a + b <= S; b++)
			for (int c = 0; c <= E && a + b + c <= S; c++) {
				const double t = T[1][a] + T[2][b] + T[3][c];
				if (t < best) {
					best = t;
					best_n[0] = 0, best_n[1] = a, best_n[2] = b, best_n[3] = c;
				}
			}
	return best;
}

static moet_plan_budget budget_mix(const moet_placement_sizes *sz, int S, const moet_cost_hw *hw,
				   const mix *m)
{
	moet_plan_budget b = { .n_gpus = 1, .budget_bytes = sz->dense_bytes + (uint64_t)S *
			       sz->expert_bytes[E] + sz->expert_bytes[E] / 2, .hw = hw,
			       .auto_slots = true, .n_mix = m->n };
	for (int i = 0; i < m->n; i++) {
		b.mix_batch[i] = m->b[i];
		b.mix_weight[i] = m->w[i];
	}
	return b;
}

static void test_brute(void)
{
	moet_config cf;
	moet_placement_sizes *sz = NULL;
	moet_plan *pl = NULL;
	moet_cost_hw hw, flat;
	double sc[L * E], T[L][E + 1];
	moet_cost_hw_defaults(&hw);
	flat = hw;
	flat.cpu_overhead_us = flat.gpu_overhead_us = flat.pcie_latency_us = 0;
	if (moet_test_kimi(L, E, &cf, &sz)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	cf.num_experts_per_tok = 2;
	static const mix mixes[3] = {
		{ 2, { 1, 16 }, { 1, 1 } },
		{ 3, { 1, 4, 64 }, { 3, 1, 0.25 } },
		{ 3, { 64, 2, 16 }, { 0.5, 2.5, 1 } },
	};
	static const int slots[4] = { 4, 9, 14, 20 };
	int n_cases = 0;
	for (int k = 0; k < 3; k++) {
		scores_make(sc, 0x1234567ull + (uint64_t)k, k);
		for (int si = 0; si < 4; si++)
			for (int v = 0; v < 2; v++) {
				const mix *m = &mixes[k];
				const int S = slots[si];
				moet_plan_budget b = budget_mix(sz, S, v ? &hw : &flat, m);
				int rc = moet_plan_make(&cf, sz, sc, &b, &pl);
				CHECK(rc == 0, "mix %d, S %d: %s", k, S, moet_errmsg());
				if (rc)
					goto done;
				double dense, best;
				int bn[L] = { 0 };
				if ((rc = layer_table(&pl->cost, sc, m, T, &dense))) {
					CHECK(0, "layer table: %s", moet_errmsg());
					goto done;
				}
				best = brute(T, S, bn) + dense;
				/* The plan's objective from its own per-batch predictions. */
				double obj = 0;
				int64_t used = 0;
				for (int i = 0; i < m->n; i++) {
					CHECK(pl->batch[i] == m->b[i] && pl->weight[i] == m->w[i],
					      "batch %d: %" PRId64 ":%g", i, pl->batch[i],
					      pl->weight[i]);
					obj += m->w[i] * pl->mix_pred[i].step_ms;
				}
				for (int l = 0; l < L; l++)
					used += pl->per_layer[l];
				CHECK(pl->n_batch == m->n && fabs(obj - pl->objective_ms) <=
				      1e-12 * obj && used <= S, "mix %d S %d: %d batches, "
				      "objective %.15g, sum %.15g, %" PRId64 " slots used", k, S,
				      pl->n_batch, pl->objective_ms, obj, used);
				/* The plan's allocation priced by the table: the same figure. */
				const double mine = T[1][pl->per_layer[1]] +
						    T[2][pl->per_layer[2]] +
						    T[3][pl->per_layer[3]] + dense;
				CHECK(fabs(mine - pl->objective_ms) <= 1e-12 * mine, "mix %d S %d: "
				      "the table prices the plan at %.15g, the plan %.15g", k, S,
				      mine, pl->objective_ms);
				if (!v) {
					CHECK(pl->objective_ms <= best * (1 + 1e-12), "mix %d S %d: "
					      "greedy %.15g (%" PRId64 "/%" PRId64 "/%" PRId64
					      "), brute force %.15g (%d/%d/%d)", k, S,
					      pl->objective_ms, pl->per_layer[1], pl->per_layer[2],
					      pl->per_layer[3], best, bn[1], bn[2], bn[3]);
					n_cases++;
				} else {
					CHECK(pl->objective_ms <= pl->even_objective_ms * (1 + 1e-12),
					      "mix %d S %d, overheads: --auto %.9g, even %.9g", k, S,
					      pl->objective_ms, pl->even_objective_ms);
				}
				if (si == 2)
					printf("mix %d, %2d slots, %s: --auto %.6f ms (%" PRId64 "/%"
					       PRId64 "/%" PRId64 "), brute force %.6f ms (%d/%d/%d), "
					       "even split %.6f ms\n", k, S, v ? "h200 figures" :
					       "no overheads", pl->objective_ms, pl->per_layer[1],
					       pl->per_layer[2], pl->per_layer[3], best, bn[1], bn[2],
					       bn[3], pl->even_objective_ms);
				moet_plan_free(pl);
				pl = NULL;
			}
	}
	CHECK(n_cases == 12, "%d convex cases", n_cases);
	/* A one-batch mix is the plain batch: weight 1 (bit for bit) and 2 (exact scaling). */
	scores_make(sc, 99, 1);
	for (int w = 1; w <= 2; w++) {
		moet_plan *a = NULL, *c = NULL;
		const mix one = { 1, { 16 }, { (double)w } }, none = { 0, { 0 }, { 0 } };
		moet_plan_budget bm = budget_mix(sz, 11, &hw, &one), bp = budget_mix(sz, 11, &hw,
										       &none);
		bp.batch = 16;
		CHECK(moet_plan_make(&cf, sz, sc, &bm, &a) == 0 &&
		      moet_plan_make(&cf, sz, sc, &bp, &c) == 0, "%s", moet_errmsg());
		if (a && c)
			CHECK(!memcmp(a->per_layer, c->per_layer, sizeof(int64_t) * L) &&
			      a->pred.step_ms == c->pred.step_ms &&
			      a->objective_ms == w * c->pred.step_ms && c->n_batch == 1 &&
			      c->weight[0] == 1 && c->objective_ms == c->pred.step_ms,
			      "weight %d: %" PRId64 "/%" PRId64 "/%" PRId64 " vs %" PRId64 "/%"
			      PRId64 "/%" PRId64, w, a->per_layer[1], a->per_layer[2],
			      a->per_layer[3], c->per_layer[1], c->per_layer[2], c->per_layer[3]);
		moet_plan_free(a);
		moet_plan_free(c);
	}
	/* The library's refusals. */
	const mix bad[3] = { { 2, { 1, 0 }, { 1, 1 } }, { 1, { 4 }, { 0 } },
			     { 1, { 4 }, { NAN } } };
	for (int i = 0; i < 3; i++) {
		moet_plan_budget b = budget_mix(sz, 4, &hw, &bad[i]);
		CHECK(moet_plan_make(&cf, sz, sc, &b, &pl) == MOET_EINVAL && !pl &&
		      strstr(moet_errmsg(), "batch mix item"), "bad mix %d: %s", i,
		      moet_errmsg());
	}
	moet_plan_budget b = budget_mix(sz, 4, &hw, &mixes[0]);
	b.n_mix = MOET_PLAN_MAX_BATCHES + 1;
	CHECK(moet_plan_make(&cf, sz, sc, &b, &pl) == MOET_EINVAL && !pl &&
	      strstr(moet_errmsg(), "batch sizes in the mix"), "33 batches: %s", moet_errmsg());
done:
	moet_plan_free(pl);
	moet_placement_sizes_free(sz);
}

/* ---- the binary -------------------------------------------------------------------------- */

typedef struct tiny {
	char dir[1024], prof[1024], budget[64];
	moet_config cf;
	moet_placement_sizes *sz;
} tiny;

static int tiny_make(tiny *t)
{
	moet_gen_params gp;
	moet_ckpt *ck = NULL;
	moet_profile *p = NULL;
	moet_gen_params_init(&gp);
	gp.n_layers = 4;
	snprintf(t->dir, sizeof(t->dir), "%s/ck", tmp);
	snprintf(t->prof, sizeof(t->prof), "%s/p.json", tmp);
	int rc = moet_gen_checkpoint(t->dir, &gp);
	if (!rc)
		rc = moet_config_load(t->dir, &t->cf);
	if (!rc)
		rc = moet_ckpt_open(t->dir, &ck);
	if (!rc)
		rc = moet_placement_sizes_from_ckpt(&t->cf, ck, &t->sz);
	if (!rc)
		rc = moet_profile_create(&t->cf, &p);
	const int64_t nl = t->cf.num_hidden_layers, ne = t->cf.n_routed_experts;
	static const double al[3] = { 0.2, 1.0, 2.2 };
	for (int64_t l = 0; !rc && l < nl; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&t->cf, l) && e < ne; e++)
			p->counts[moet_profile_at(p, MOET_PROFILE_DECODE, l) + e] =
				(uint64_t)(1e5 / pow(1.0 + (double)((e * 5 + l) % ne), al[l % 3]));
	if (!rc)
		rc = moet_profile_save(p, t->prof);
	/* 24 slots on one GPU: 8 per MoE layer evenly. */
	if (!rc)
		snprintf(t->budget, sizeof(t->budget), "%" PRIu64 "B", t->sz->dense_bytes + 24 *
			 t->sz->expert_bytes[ne] + t->sz->expert_bytes[ne] / 2);
	moet_profile_free(p);
	moet_ckpt_close(ck);
	return rc;
}

/* The output without its timing line ("planned in ..."). */
static void drop_timing(char *s)
{
	char *at = s ? strstr(s, "planned in ") : NULL;
	char *nl = at ? strchr(at, '\n') : NULL;
	if (at && nl)
		memmove(at, nl + 1, strlen(nl + 1) + 1);
}

/* The number after `key` in s, or NAN. */
static double num_after(const char *s, const char *key)
{
	const char *at = s ? strstr(s, key) : NULL;
	return at ? strtod(at + strlen(key), NULL) : NAN;
}

/* Exit 1 with one line "moet-hybrid plan: ..." holding `want`. */
static void expect_fail(const char *want, const char *args)
{
	char *out = NULL;
	int st = moet_test_cli(&out, "%s", args);
	const char *nl = out ? strchr(out, '\n') : NULL;
	CHECK(st == 1 && out && !strncmp(out, "moet-hybrid plan: ", 18) && strstr(out, want) &&
	      nl && !nl[1], "want one line with '%s', exit %d:\n%s", want, st, out ? out : "");
	free(out);
}

static void test_cli(const tiny *t)
{
	char base[4096], args[8192], fa[1100], fb[1100], *oa = NULL, *ob = NULL;
	snprintf(base, sizeof(base), "plan --model %s --profile %s --gpus 1 --vram-gb %s "
		 "--reserve-gb 0B", t->dir, t->prof, t->budget);
	snprintf(fa, sizeof(fa), "%s/a.yaml", tmp);
	snprintf(fb, sizeof(fb), "%s/b.yaml", tmp);
	/* --batch 16:1 against --batch 16: the same lines and the same file. */
	int sa = moet_test_cli(&oa, "%s --auto --batch 16 --out %s", base, fa);
	int sb = moet_test_cli(&ob, "%s --auto --batch 16:1 --out %s", base, fb);
	drop_timing(oa);
	drop_timing(ob);
	CHECK(sa == 0 && sb == 0 && oa && ob && strstr(oa, "decode batch 16\n"),
	      "exit %d, %d:\n%s\n%s", sa, sb, oa ? oa : "", ob ? ob : "");
	size_t na = 0, nb = 0;
	char *ya = moet_test_read_file(fa, &na), *yb = moet_test_read_file(fb, &nb);
	if (oa && ob) {
		/* The lines naming the file differ: compare from the plan's first line on. */
		const char *pa = strstr(oa, "expert bytes:"), *pb = strstr(ob, "expert bytes:");
		const char *wa = pa ? strstr(pa, "wrote ") : NULL, *wb = pb ? strstr(pb, "wrote ")
									   : NULL;
		CHECK(pa && pb && wa && wb && wa - pa == wb - pb && !memcmp(pa, pb, (size_t)(wa - pa)),
		      "--batch 16:1 prints otherwise than --batch 16:\n%s\n---\n%s", oa, ob);
	}
	CHECK(ya && yb && na == nb && !memcmp(ya, yb, na), "the files differ:\n%s\n---\n%s",
	      ya ? ya : "", yb ? yb : "");
	free(oa);
	free(ob);
	free(ya);
	free(yb);
	oa = ob = NULL;
	/* A mix of three: each batch's rows and step, the weighted sums. */
	sa = moet_test_cli(&oa, "%s --auto --batch 1,4:2,16:0.5 --out %s", base, fa);
	CHECK(sa == 0 && oa && strstr(oa, "decode batch mix (batch:weight): 1:1, 4:2, 16:0.5;"),
	      "mix: exit %d\n%s", sa, oa ? oa : "");
	static const int64_t bs[3] = { 1, 4, 16 };
	static const double ws[3] = { 1, 2, 0.5 };
	double sum_a = 0, sum_e = 0;
	for (int i = 0; oa && i < 3; i++) {
		char key[96], *at;
		snprintf(key, sizeof(key), "predicted decode step at batch %" PRId64 ": ", bs[i]);
		at = strstr(oa, key);
		double a = NAN, e = NAN;
		if (at) {
			a = strtod(at + strlen(key), &at);
			at = strstr(at, "ms with --auto, ");
			e = at ? strtod(at + 16, NULL) : NAN;
		}
		CHECK(a > 0 && e > 0, "batch %" PRId64 ": %g, %g\n%s", bs[i], a, e, oa);
		sum_a += ws[i] * a;
		sum_e += ws[i] * e;
	}
	const char *wl = oa ? strstr(oa, "predicted decode step, weighted sum over the mix: ")
			    : NULL;
	double oba = num_after(wl, "mix: "), obe = num_after(wl, "ms with --auto, ");
	/* The printed steps have 3 decimals: the sums agree within 3.5 x 0.0005 ms. */
	CHECK(wl && fabs(oba - sum_a) <= 2e-3 && fabs(obe - sum_e) <= 2e-3 && oba <= obe,
	      "weighted sums %.3f / %.3f, from the rows %.4f / %.4f\n%s", oba, obe, sum_a, sum_e,
	      oa ? oa : "");
	ya = moet_test_read_file(fa, &na);
	CHECK(ya && strstr(ya, "decode batch mix (batch:weight) 1:1, 4:2, 16:0.5") &&
	      strstr(ya, "\n# batch 4: predicted decode step ") &&
	      fabs(num_after(ya, "weighted objective (sum of weight x predicted step): ") - oba) <
	      1e-9, "the file's header:\n%s", ya ? ya : "");
	free(ya);
	moet_placement *pp = NULL;
	CHECK(moet_placement_load(fa, &t->cf, t->sz, &pp) == 0, "%s", moet_errmsg());
	int64_t on = 0;
	for (int64_t l = 0; pp && l < t->cf.num_hidden_layers; l++)
		for (int64_t e = 0; e < t->cf.n_routed_experts; e++)
			on += moet_placement_owner(pp, l, e) >= 0;
	CHECK(on == 24, "%" PRId64 " experts on the GPU, want the 24 slots", on);
	moet_placement_free(pp);
	free(oa);
	oa = NULL;
	/* A list with --hot-per-layer and --hardware: each batch printed, one plan. */
	sa = moet_test_cli(&oa, "%s --hot-per-layer 8 --hardware %s/configs/hardware-h200-host.yaml"
			   " --batch 1,64 --out %s", base, moet_test_source_dir(), fa);
	CHECK(sa == 0 && oa && strstr(oa, "predicted decode step at batch 64: ") &&
	      strstr(oa, "experts per MoE layer: 8 x 3 layers") &&
	      strstr(oa, "weighted sum over the mix: ") && !strstr(oa, "--auto"),
	      "hot-per-layer: exit %d\n%s", sa, oa ? oa : "");
	free(oa);
	/* Refusals: one line naming --batch. */
	static const char *const bad[7][2] = {
		{ "1:0", "--batch '1:0': item 1: weight 0 must be positive" },
		{ "1:-2", "--batch '1:-2': item 1: weight -2 must be positive" },
		{ "1:x", "--batch '1:x': item 1: weight 'x' is not a number" },
		{ ",4", "--batch ',4': item 1 is empty" },
		{ "4:", "--batch '4:': item 1: no weight after ':'" },
		{ "1,,4", "--batch '1,,4': item 2 is empty" },
		{ "4,16,", "--batch '4,16,': ends with a comma" },
	};
	for (int i = 0; i < 7; i++) {
		snprintf(args, sizeof(args), "%s --auto --batch %s --out %s", base, bad[i][0], fa);
		expect_fail(bad[i][1], args);
	}
	snprintf(args, sizeof(args), "%s --batch 1,4 --out %s", base, fa);
	expect_fail("--batch '1,4': a list only with --predict, --auto or --hardware", args);
	snprintf(args, sizeof(args), "%s --batch 4:2 --out %s", base, fa);
	expect_fail("--batch '4:2': weights only with --auto or --hardware", args);
	snprintf(args, sizeof(args), "plan --predict --model %s --profile %s --placement %s "
		 "--batch 1:2,4", t->dir, t->prof, fb);
	expect_fail("--batch '1:2,4': weights (B:W) only go with planning", args);
}

/* ---- Kimi-K2 ------------------------------------------------------------------------------ */

static void test_kimi(void)
{
	moet_config kc;
	moet_placement_sizes *ks = NULL;
	moet_plan *pl = NULL;
	moet_cost_hw hw;
	double *sc = NULL;
	moet_cost_hw_defaults(&hw);
	if (moet_test_kimi(0, 0, &kc, &ks)) {
		CHECK(0, "kimi setup: %s", moet_errmsg());
		goto done;
	}
	const int64_t KL = kc.num_hidden_layers, KE = kc.n_routed_experts;
	sc = calloc((size_t)(KL * KE), sizeof(*sc));
	for (int64_t l = 0; sc && l < KL; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&kc, l) && e < KE; e++)
			sc[l * KE + e] = floor(1e7 / pow(1.0 + (double)((e * 7919 + 31 * l) % KE),
							 0.4 + 0.03 * (double)l));
	const mix m = { 4, { 1, 4, 16, 64 }, { 1, 1, 1, 1 } };
	moet_plan_budget b = { .n_gpus = 4, .budget_bytes = 139ull << 30,
			       .reserve_bytes = 16ull << 30, .hw = &hw, .auto_slots = true,
			       .n_mix = m.n };
	for (int i = 0; i < m.n; i++)
		b.mix_batch[i] = m.b[i], b.mix_weight[i] = m.w[i];
	const double t0 = moet_test_now_ms();
	int rc = sc ? moet_plan_make(&kc, ks, sc, &b, &pl) : MOET_ENOMEM;
	const double ms = moet_test_now_ms() - t0;
	CHECK(rc == 0, "kimi --auto mix: %s", moet_errmsg());
	if (rc)
		goto done;
	printf("kimi-k2 61 x 384, 4 GPUs, --auto, mix 1,4,16,64: planned in %.1f ms; weighted "
	       "%.3f ms, even split %.3f ms (batch 1: %.3f / %.3f, 64: %.3f / %.3f)\n", ms,
	       pl->objective_ms, pl->even_objective_ms, pl->mix_pred[0].step_ms,
	       pl->mix_even[0].step_ms, pl->mix_pred[3].step_ms, pl->mix_even[3].step_ms);
	/* NOTE: generous (target 1 s) for sanitizer builds on a shared 2-core machine. */
	CHECK(ms < 5000, "planning took %.0f ms", ms);
	CHECK(pl->objective_ms <= pl->even_objective_ms * (1 + 1e-9), "--auto %.6f, even %.6f",
	      pl->objective_ms, pl->even_objective_ms);
done:
	free(sc);
	moet_plan_free(pl);
	moet_placement_sizes_free(ks);
}

int main(void)
{
	tiny t;
	memset(&t, 0, sizeof(t));
	tmp = moet_test_mkdtemp("planmix");
	if (!tmp)
		return 1;
	test_brute();
	if (tiny_make(&t))
		CHECK(0, "tiny setup: %s", moet_errmsg());
	else
		test_cli(&t);
	test_kimi();
	moet_placement_sizes_free(t.sz);
	free(tmp);
	return moet_test_done("test_plan_mix");
}
