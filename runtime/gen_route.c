/*
 * gen_route.c: the routing skew of a synthetic checkpoint, and its calibration.
 *
 * Model (docs/gen-checkpoint.md says it in prose). The vocabulary is split by id range into
 * C classes; class c has a direction u_c (random, norm sqrt(H)). A token's embedding is
 * N(0,1) + ALPHA u_c, an expert of class c has router row N(0, SIGMA^2/H) + BETA u_c / H, so
 * that prompts of class c prefer the experts of class c. Each MoE layer has a random hot set;
 * its experts get e_score_correction_bias b_l, the others 0. b_l only moves selection (as in
 * the real model: the combine weights use the unbiased scores).
 *
 * Calibration, per MoE layer: GEN_MC_SAMPLES router inputs x_n = RMSNorm(embedding of a
 * random token of a random class + NOISE N(0,1)) x post_attention_layernorm.weight; scores
 * s_ne = sigmoid(w_e . x_n) from the stored BF16 weights (float dot, fixed 8-lane order;
 * sigmoid through exp_c), computed once; then b_l by bisection (GEN_BISECT_STEPS) on the
 * share of the N x top_k selections that land on the hot set, with the real selection:
 *
 *   biased = s + bias;  n_group > 1: group score = sum of the group's two largest biased
 *   scores, keep topk_group groups;  top_k experts of the kept groups by biased score
 *   (ties: lower index first).
 *
 * Per-layer targets: spread evenly over [F - d, F + d], d = min(0.1, (1-F)/2, F/2), in a
 * seeded random order, so their mean is F.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen_int.h"
#include "moet_err.h"
#include "moet_expc.h"

typedef float gen_v8 __attribute__((vector_size(32)));

/* Fixed-order float dot: 8 lanes over i = 0, 8, ..., then the tail, lanes summed in order. */
static float dot8(const float *a, const float *b, int64_t n)
{
	gen_v8 acc = { 0 };
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		gen_v8 x, y;
		memcpy(&x, a + i, sizeof(x));
		memcpy(&y, b + i, sizeof(y));
		acc += x * y;
	}
	float s = 0.0f;
	for (int j = 0; j < 8; j++)
		s += acc[j];
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

static float decode_bf16(const uint8_t *p)
{
	return moet_dec_bf16((uint16_t)(p[0] | (p[1] << 8)));
}

/* ---- Monte-Carlo router inputs and scores ---- */

typedef struct mc_job {
	const gen_ctx *g;
	size_t embed_ti;
	const float *w;      /* [E x H] router rows, decoded */
	const float *ln;     /* [H] post_attention_layernorm weight, decoded */
	float *scores;       /* [NS x E] */
	int64_t n0, n1;
	int rc;
} mc_job;

/* Router input n (before the layer's norm weight): the same for every layer. */
static void mc_sample(const gen_ctx *g, size_t embed_ti, int64_t n, uint8_t *row, float *x)
{
	const int64_t H = g->cfg.hidden_size, V = g->cfg.vocab_size, C = g->n_classes;
	gen_rng r;
	gen_rng_seed(&r, gen_key(g->par.seed, "moet.gen.mc"), (uint64_t)n);
	int64_t c = (int64_t)gen_rng_below(&r, (uint64_t)C);
	int64_t lo = (c * V + C - 1) / C, hi = ((c + 1) * V + C - 1) / C;
	int64_t t = lo + (int64_t)gen_rng_below(&r, (uint64_t)(hi - lo));
	gen_fill_rows((void *)g, embed_ti, t, t + 1, row);
	double ss = 0;
	uint64_t w = 0;
	for (int64_t i = 0; i < H; i++) {
		if ((i & 3) == 0)
			w = gen_rng_next(&r);
		x[i] = decode_bf16(row + 2 * i) + GEN_NOISE * g->gauss_table[w & 0xFFFF];
		w >>= 16;
		ss += (double)x[i] * x[i];
	}
	float k = (float)sqrt((double)H / ss);
	for (int64_t i = 0; i < H; i++)
		x[i] *= k;
}

static void *mc_thread(void *arg)
{
	mc_job *j = arg;
	const gen_ctx *g = j->g;
	const int64_t H = g->cfg.hidden_size, E = g->cfg.n_routed_experts;
	uint8_t *row = malloc((size_t)H * 2);
	float *x = malloc((size_t)H * sizeof(float));
	if (!row || !x) {
		j->rc = MOET_ENOMEM;
		goto done;
	}
	for (int64_t n = j->n0; n < j->n1; n++) {
		mc_sample(g, j->embed_ti, n, row, x);
		for (int64_t i = 0; i < H; i++)
			x[i] *= j->ln[i];
		for (int64_t e = 0; e < E; e++) {
			float z = dot8(x, j->w + e * H, H);
			j->scores[n * E + e] = 1.0f / (1.0f + moet_exp_c(-z));
		}
	}
done:
	free(row);
	free(x);
	return NULL;
}

static int mc_scores(const gen_ctx *g, int64_t layer, float *w, float *ln, float *scores)
{
	const int64_t H = g->cfg.hidden_size, E = g->cfg.n_routed_experts;
	char name[96];
	snprintf(name, sizeof(name), "model.layers.%lld.mlp.gate.weight", (long long)layer);
	const gen_tensor *gw = gen_find(g, name);
	snprintf(name, sizeof(name), "model.layers.%lld.post_attention_layernorm.weight",
		 (long long)layer);
	const gen_tensor *gl = gen_find(g, name);
	const gen_tensor *ge = gen_find(g, "model.embed_tokens.weight");
	if (!gw || !gl || !ge)
		return moet_err(MOET_EINVAL, "layer %lld lacks router tensors",
				(long long)layer);
	uint8_t *buf = malloc((size_t)H * 2);
	if (!buf)
		return moet_err(MOET_ENOMEM, "out of memory (router rows)");
	for (int64_t e = 0; e < E; e++) {
		gen_fill_rows((void *)g, (size_t)(gw - g->tensors), e, e + 1, buf);
		for (int64_t i = 0; i < H; i++)
			w[e * H + i] = decode_bf16(buf + 2 * i);
	}
	gen_fill_rows((void *)g, (size_t)(gl - g->tensors), 0, 1, buf);
	for (int64_t i = 0; i < H; i++)
		ln[i] = decode_bf16(buf + 2 * i);
	free(buf);

	int nt = g->n_threads < 1 ? 1 : g->n_threads;
	mc_job jobs[16];
	pthread_t th[16];
	if (nt > 16)
		nt = 16;
	int started = 0, rc = 0;
	for (int i = 0; i < nt; i++) {
		jobs[i] = (mc_job){ .g = g, .embed_ti = (size_t)(ge - g->tensors), .w = w,
				    .ln = ln, .scores = scores,
				    .n0 = (int64_t)GEN_MC_SAMPLES * i / nt,
				    .n1 = (int64_t)GEN_MC_SAMPLES * (i + 1) / nt };
		if (pthread_create(&th[i], NULL, mc_thread, &jobs[i]) != 0) {
			mc_thread(&jobs[i]); /* run it here instead */
			continue;
		}
		started |= 1 << i;
	}
	for (int i = 0; i < nt; i++) {
		if (started & (1 << i))
			pthread_join(th[i], NULL);
		if (jobs[i].rc)
			rc = jobs[i].rc;
	}
	if (rc)
		return moet_err(rc, "out of memory (Monte-Carlo samples)");
	return 0;
}

/* ---- the selection ---- */

typedef struct sel_buf {
	float *biased;      /* [E] */
	uint8_t *allowed;   /* [E] */
	float *gscore;      /* [n_group] */
} sel_buf;

/* The top_k experts for one token's scores s with bias b on the hot set; returns how many
 * are hot and, if counts is not NULL, adds one to counts[e] for each chosen e. */
static int64_t select_hot(const moet_config *c, const gen_route *rt, const float *s, float b,
			  sel_buf *sb, int64_t *counts)
{
	const int64_t E = c->n_routed_experts, G = c->n_group, K = c->num_experts_per_tok;
	for (int64_t e = 0; e < E; e++) {
		sb->biased[e] = rt->is_hot[e] ? s[e] + b : s[e];
		sb->allowed[e] = G > 1 ? 0 : 1;
	}
	if (G > 1) {
		const int64_t gs = E / G;
		for (int64_t gi = 0; gi < G; gi++) {
			float m1 = -INFINITY, m2 = -INFINITY;
			for (int64_t e = gi * gs; e < (gi + 1) * gs; e++) {
				float v = sb->biased[e];
				if (v > m1) {
					m2 = m1;
					m1 = v;
				} else if (v > m2) {
					m2 = v;
				}
			}
			sb->gscore[gi] = m1 + m2;
		}
		for (int64_t k = 0; k < c->topk_group; k++) {
			int64_t best = -1;
			for (int64_t gi = 0; gi < G; gi++)
				if (sb->gscore[gi] != -INFINITY &&
				    (best < 0 || sb->gscore[gi] > sb->gscore[best]))
					best = gi;
			sb->gscore[best] = -INFINITY;
			memset(sb->allowed + best * gs, 1, (size_t)gs);
		}
	}
	int64_t hot = 0;
	for (int64_t k = 0; k < K; k++) {
		int64_t best = -1;
		for (int64_t e = 0; e < E; e++)
			if (sb->allowed[e] && (best < 0 || sb->biased[e] > sb->biased[best]))
				best = e;
		sb->allowed[best] = 0;
		hot += rt->is_hot[best];
		if (counts)
			counts[best]++;
	}
	return hot;
}

static double hot_share(const moet_config *c, const gen_route *rt, const float *scores,
			float b, sel_buf *sb, int64_t *counts)
{
	const int64_t E = c->n_routed_experts;
	int64_t hot = 0;
	for (int64_t n = 0; n < GEN_MC_SAMPLES; n++)
		hot += select_hot(c, rt, scores + n * E, b, sb, counts);
	return (double)hot / ((double)GEN_MC_SAMPLES * (double)c->num_experts_per_tok);
}

static int calibrate(const gen_ctx *g, gen_route *rt, const float *scores, sel_buf *sb,
		     int64_t *counts)
{
	const moet_config *c = &g->cfg;
	float lo = -GEN_BIAS_LIMIT, hi = GEN_BIAS_LIMIT;
	double s_lo = hot_share(c, rt, scores, lo, sb, NULL);
	double s_hi = hot_share(c, rt, scores, hi, sb, NULL);
	if (rt->target > s_hi || rt->target < s_lo)
		return moet_err(MOET_ERANGE,
				"layer %lld: a hot set of %lld experts can get a "
				"share in [%.4f, %.4f] only, not %.4f (change --hot-count or "
				"--hot-share)",
				(long long)rt->layer, (long long)rt->n_hot, s_lo, s_hi,
				rt->target);
	for (int i = 0; i < GEN_BISECT_STEPS; i++) {
		float mid = 0.5f * (lo + hi);
		if (mid == lo || mid == hi)
			break;
		double s = hot_share(c, rt, scores, mid, sb, NULL);
		if (s < rt->target) {
			lo = mid;
			s_lo = s;
		} else {
			hi = mid;
			s_hi = s;
		}
	}
	rt->bias = (s_hi - rt->target <= rt->target - s_lo) ? hi : lo;
	rt->share_at_zero = hot_share(c, rt, scores, 0.0f, sb, NULL);
	memset(counts, 0, (size_t)c->n_routed_experts * sizeof(*counts));
	rt->share = hot_share(c, rt, scores, rt->bias, sb, counts);
	for (int64_t e = 0; e < c->n_routed_experts; e++)
		rt->expert_share[e] = (double)counts[e] /
				      ((double)GEN_MC_SAMPLES * (double)c->num_experts_per_tok);
	return 0;
}

/* ---- setup: classes, hot sets, targets ---- */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static int setup_layer(const gen_ctx *g, gen_route *rt, int64_t *perm)
{
	const int64_t E = g->cfg.n_routed_experts;
	char label[96];
	gen_rng r;
	rt->hot = malloc((size_t)rt->n_hot * sizeof(int64_t));
	rt->is_hot = calloc((size_t)E, 1);
	rt->expert_class = malloc((size_t)E);
	rt->expert_share = calloc((size_t)E, sizeof(double));
	if (!rt->hot || !rt->is_hot || !rt->expert_class || !rt->expert_share)
		return moet_err(MOET_ENOMEM, "out of memory (routing tables)");
	/* Classes: a random permutation dealt round-robin, so classes get equal numbers. */
	snprintf(label, sizeof(label), "moet.gen.layer.%lld.classes", (long long)rt->layer);
	gen_rng_seed(&r, gen_key(g->par.seed, label), 0);
	for (int64_t e = 0; e < E; e++)
		perm[e] = e;
	for (int64_t e = E - 1; e > 0; e--) {
		int64_t k = (int64_t)gen_rng_below(&r, (uint64_t)e + 1), t = perm[e];
		perm[e] = perm[k];
		perm[k] = t;
	}
	for (int64_t e = 0; e < E; e++)
		rt->expert_class[perm[e]] = (uint8_t)(e % g->n_classes);
	/* Hot set: the first n_hot of a second random permutation. */
	snprintf(label, sizeof(label), "moet.gen.layer.%lld.hot", (long long)rt->layer);
	gen_rng_seed(&r, gen_key(g->par.seed, label), 0);
	for (int64_t e = 0; e < E; e++)
		perm[e] = e;
	for (int64_t e = 0; e < rt->n_hot; e++) {
		int64_t k = e + (int64_t)gen_rng_below(&r, (uint64_t)(E - e)), t = perm[e];
		perm[e] = perm[k];
		perm[k] = t;
	}
	memcpy(rt->hot, perm, (size_t)rt->n_hot * sizeof(int64_t));
	qsort(rt->hot, (size_t)rt->n_hot, sizeof(int64_t), cmp_i64);
	for (int64_t i = 0; i < rt->n_hot; i++)
		rt->is_hot[rt->hot[i]] = 1;
	return 0;
}

int gen_route_calibrate(gen_ctx *g)
{
	const moet_config *c = &g->cfg;
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, H = c->hidden_size;
	int64_t *perm = NULL, *counts = NULL;
	float *w = NULL, *ln = NULL, *scores = NULL;
	sel_buf sb = { 0 };
	int rc = 0;

	g->route_of_layer = malloc((size_t)L * sizeof(int64_t));
	if (!g->route_of_layer)
		return moet_err(MOET_ENOMEM, "out of memory");
	g->n_moe = 0;
	for (int64_t l = 0; l < L; l++)
		g->route_of_layer[l] = moet_config_is_moe_layer(c, l) ? g->n_moe++ : -1;
	if (g->n_moe == 0)
		return 0;
	g->routes = calloc((size_t)g->n_moe, sizeof(gen_route));
	perm = malloc((size_t)E * sizeof(int64_t));
	counts = malloc((size_t)E * sizeof(int64_t));
	w = malloc((size_t)E * (size_t)H * sizeof(float));
	ln = malloc((size_t)H * sizeof(float));
	scores = malloc((size_t)GEN_MC_SAMPLES * (size_t)E * sizeof(float));
	sb.biased = malloc((size_t)E * sizeof(float));
	sb.allowed = malloc((size_t)E);
	sb.gscore = malloc((size_t)c->n_group * sizeof(float));
	if (!g->routes || !perm || !counts || !w || !ln || !scores || !sb.biased ||
	    !sb.allowed || !sb.gscore) {
		rc = moet_err(MOET_ENOMEM, "out of memory (calibration)");
		goto fail;
	}

	/* Targets: evenly spread, mean F, in a seeded random order. */
	const double F = g->par.hot_share, M = (double)g->n_moe;
	double d = fmin(0.1, fmin((1.0 - F) / 2.0, F / 2.0));
	gen_rng r;
	gen_rng_seed(&r, gen_key(g->par.seed, "moet.gen.targets"), 0);
	for (int64_t k = 0; k < g->n_moe; k++)
		perm[k] = k;
	for (int64_t k = g->n_moe - 1; k > 0; k--) {
		int64_t j = (int64_t)gen_rng_below(&r, (uint64_t)k + 1), t = perm[k];
		perm[k] = perm[j];
		perm[j] = t;
	}
	for (int64_t l = 0, k = 0; l < L; l++) {
		if (g->route_of_layer[l] < 0)
			continue;
		gen_route *rt = &g->routes[k];
		rt->layer = l;
		rt->n_hot = g->par.hot_count;
		rt->target = g->par.layer_hot_share ? g->par.layer_hot_share[k] : g->n_moe == 1 ? F
			     : F - d + 2.0 * d * (double)perm[k] / (M - 1.0);
		k++;
	}
	for (int64_t k = 0; k < g->n_moe; k++) {
		rc = setup_layer(g, &g->routes[k], perm);
		if (rc)
			goto fail;
	}
	for (int64_t k = 0; k < g->n_moe; k++) {
		rc = mc_scores(g, g->routes[k].layer, w, ln, scores);
		if (!rc)
			rc = calibrate(g, &g->routes[k], scores, &sb, counts);
		if (rc)
			goto fail;
	}
fail:
	free(perm);
	free(counts);
	free(w);
	free(ln);
	free(scores);
	free(sb.biased);
	free(sb.allowed);
	free(sb.gscore);
	return rc;
}

void gen_route_free(gen_ctx *g)
{
	for (int64_t k = 0; g->routes && k < g->n_moe; k++) {
		free(g->routes[k].hot);
		free(g->routes[k].is_hot);
		free(g->routes[k].expert_class);
		free(g->routes[k].expert_share);
	}
	free(g->routes);
	free(g->route_of_layer);
	g->routes = NULL;
	g->route_of_layer = NULL;
}
