/*
 * plan.c: the frequency planner and the evaluation of placements (moet_plan.h).
 *
 * Three steps, each simple enough to check by hand:
 *
 * 1. Slots. Per GPU: free = budget - reserve - dense share; slots = free / slot_bytes, with
 *    slot_bytes the largest routed expert (all are equal in this family; counting each at the
 *    largest can only leave room unused, never overfill). S = sum of slots.
 * 2. Experts per layer. --hot-per-layer K: K everywhere (refused when K x MoE layers > S).
 *    Otherwise K = min(E, floor(S / MoE layers)) everywhere, and the S - K x layers leftover
 *    slots (fewer than one per layer) go one each to the layers whose next expert has the
 *    most routings: an even split that wastes no slot.
 *    --auto (budget hw set, auto_slots): the S slots are dealt one at a time to the layer
 *    whose next expert saves the most predicted step time (moet_cost.h), or, for a batch
 *    mix, the most of the weighted sum of the steps at each batch; see auto_counts.
 * 3. GPUs. Per layer, the layer's K_l slots are first dealt to GPUs one at a time, each to the
 *    GPU with the most slots left over all layers (ties: lower index), so no GPU ever gets
 *    more experts than its slots and the GPUs fill evenly. Then the layer's experts, heaviest
 *    first, each go to the GPU with a slot of this layer left and the least load in this layer
 *    (ties: the least load over all layers, then the lower index): the longest-processing-
 *    time rule, which keeps each layer's largest GPU load near the mean (a layer waits for
 *    its slowest GPU).
 *
 * NOTE: ranking ties go to the lower expert id, so a profile with unseen experts still gives
 * one plan, and the same inputs always give the same file.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_plan.h"

int moet_plan_phase_parse(const char *s, moet_plan_phase *out)
{
	static const char *const names[] = { "decode", "prefill", "both" };
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, names[i])) {
			*out = (moet_plan_phase)i;
			return 0;
		}
	return moet_err(MOET_EINVAL, "phase '%s': must be decode, prefill or both", s);
}

const char *moet_plan_phase_name(moet_plan_phase ph)
{
	return ph == MOET_PLAN_PREFILL ? "prefill" : ph == MOET_PLAN_BOTH ? "both" : "decode";
}

int moet_plan_scores(const moet_profile *p, moet_plan_phase ph, double **out)
{
	const int64_t n = p->n_layers * p->n_experts;
	double *s = calloc((size_t)n, sizeof(*s));
	if (!s)
		return moet_err(MOET_ENOMEM, "plan scores");
	for (int q = 0; q < MOET_PROFILE_PHASES; q++) {
		if ((ph == MOET_PLAN_DECODE && q != MOET_PROFILE_DECODE) ||
		    (ph == MOET_PLAN_PREFILL && q != MOET_PROFILE_PREFILL))
			continue;
		const uint64_t *c = p->counts + moet_profile_at(p, q, 0);
		for (int64_t i = 0; i < n; i++)
			s[i] += (double)c[i];
	}
	*out = s;
	return 0;
}

void moet_plan_free(moet_plan *pl)
{
	if (!pl)
		return;
	free(pl->per_layer);
	free(pl->owner);
	free(pl->layer_hit);
	free(pl);
}

/* ---- ranking ------------------------------------------------------------------------------ */

typedef struct ranked {
	double s;
	int32_t e;
} ranked;

static int by_score(const void *a, const void *b)
{
	const ranked *x = a, *y = b;
	if (x->s != y->s)
		return x->s > y->s ? -1 : 1;
	return (x->e > y->e) - (x->e < y->e);
}

/* rank[l*E + i] = the i-th expert of layer l by score. */
static int rank_all(const double *scores, int64_t L, int64_t E, int32_t **out)
{
	int32_t *rank = malloc((size_t)(L * E) * sizeof(*rank));
	ranked *tmp = malloc((size_t)E * sizeof(*tmp));
	if (!rank || !tmp) {
		free(rank);
		free(tmp);
		return moet_err(MOET_ENOMEM, "plan ranking");
	}
	for (int64_t l = 0; l < L; l++) {
		for (int64_t e = 0; e < E; e++)
			tmp[e] = (ranked){ scores[l * E + e], (int32_t)e };
		qsort(tmp, (size_t)E, sizeof(*tmp), by_score);
		for (int64_t e = 0; e < E; e++)
			rank[l * E + e] = tmp[e].e;
	}
	free(tmp);
	*out = rank;
	return 0;
}

int moet_plan_top_mask(const double *scores, int64_t n_layers, int64_t n_experts,
		       const int64_t *per_layer, uint8_t *mask)
{
	int32_t *rank = NULL;
	int rc = rank_all(scores, n_layers, n_experts, &rank);
	if (rc)
		return rc;
	memset(mask, 0, (size_t)(n_layers * n_experts));
	for (int64_t l = 0; l < n_layers; l++)
		for (int64_t i = 0; i < per_layer[l] && i < n_experts; i++)
			mask[l * n_experts + rank[l * n_experts + i]] = 1;
	free(rank);
	return 0;
}

double moet_plan_hit_rate(const double *scores, int64_t n_layers, int64_t n_experts,
			  const uint8_t *mask)
{
	double hit = 0, all = 0;
	for (int64_t i = 0; i < n_layers * n_experts; i++) {
		all += scores[i];
		hit += mask[i] ? scores[i] : 0;
	}
	return all > 0 ? hit / all : -1;
}

/* ---- planning ----------------------------------------------------------------------------- */

/* Step 1: bytes and slots per GPU. */
static int plan_slots(moet_plan *pl, const moet_config *cf, const moet_placement_sizes *sz,
		      const moet_plan_budget *b)
{
	const int64_t L = pl->n_layers, E = pl->n_experts;
	uint64_t lo = UINT64_MAX;
	for (int64_t l = 0; l < L; l++) {
		if (!moet_config_is_moe_layer(cf, l))
			continue;
		pl->n_moe++;
		for (int64_t e = 0; e < E; e++) {
			uint64_t x = sz->expert_bytes[l * E + e];
			pl->slot_bytes = x > pl->slot_bytes ? x : pl->slot_bytes;
			lo = x < lo ? x : lo;
		}
	}
	if (!pl->n_moe || !pl->slot_bytes)
		return moet_err(MOET_EINVAL, "plan: the model has no routed expert bytes");
	pl->equal_sizes = lo == pl->slot_bytes;
	pl->dense_bytes = sz->dense_bytes;
	for (int g = 0; g < b->n_gpus; g++) {
		pl->dense_share[g] = moet_placement_dense_share(sz, b->n_gpus,
								MOET_PLACEMENT_DENSE_SPLIT, g);
		uint64_t fixed = pl->dense_share[g] + b->reserve_bytes;
		if (fixed > b->budget_bytes)
			return moet_err(MOET_ERANGE,
					"plan: gpu%d: dense share %" PRIu64 " + reserve %" PRIu64
					" = %" PRIu64 " bytes exceed the budget %" PRIu64
					" bytes: no room for experts",
					g, pl->dense_share[g], b->reserve_bytes, fixed,
					b->budget_bytes);
		pl->free_bytes[g] = b->budget_bytes - fixed;
		pl->slots[g] = (int64_t)(pl->free_bytes[g] / pl->slot_bytes);
	}
	return 0;
}

/* Step 2: experts per layer. */
static int plan_counts(moet_plan *pl, const moet_config *cf, const double *scores,
		       const int32_t *rank, const moet_plan_budget *b)
{
	const int64_t L = pl->n_layers, E = pl->n_experts;
	int64_t S = 0;
	for (int g = 0; g < pl->n_gpus; g++)
		S += pl->slots[g];
	if (b->hot_per_layer > 0) {
		if (b->hot_per_layer > E || b->hot_per_layer * pl->n_moe > S)
			return moet_err(
				MOET_ERANGE,
				"plan: --hot-per-layer %" PRId64 " x %" PRId64
				" MoE layers = %" PRId64 " experts of %" PRIu64 " bytes, but "
				"the GPUs have room for %" PRId64 " (n_routed_experts %" PRId64 ")",
				b->hot_per_layer, pl->n_moe, b->hot_per_layer * pl->n_moe,
				pl->slot_bytes, S, E);
		pl->even_k = b->hot_per_layer;
	} else {
		pl->even_k = S / pl->n_moe < E ? S / pl->n_moe : E;
	}
	for (int64_t l = 0; l < L; l++)
		pl->per_layer[l] = moet_config_is_moe_layer(cf, l) ? pl->even_k : 0;
	if (b->hot_per_layer > 0 || pl->even_k >= E)
		return 0;
	/* Leftover slots: one more in the layers whose next expert is busiest. */
	int64_t left = S - pl->even_k * pl->n_moe;
	while (left > 0) {
		int64_t best = -1;
		double bs = -1;
		for (int64_t l = 0; l < L; l++) {
			if (!pl->per_layer[l] && !moet_config_is_moe_layer(cf, l))
				continue;
			if (pl->per_layer[l] != pl->even_k)
				continue;
			double s = scores[l * E + rank[l * E + pl->even_k]];
			if (s > bs) {
				bs = s;
				best = l;
			}
		}
		if (best < 0)
			break;
		pl->per_layer[best]++;
		pl->n_extra++;
		left--;
	}
	return 0;
}

/* ---- --auto: experts per layer by the cost model --------------------------------------- */

/*
 * Per MoE layer and per batch b of the mix (one batch without a mix) the prefix sums over its
 * experts in rank order of the expected call times on each tier, X^cpu and X^gpu
 * (moet_cost_expert_ms at batch b: bandwidth and compute; both grow with the score, so
 * ranking by score ranks them too), and of log(1 - P), so that the layer's predicted time
 * with its top n experts on the GPUs is O(n_gpus) to evaluate per batch:
 *
 *   f_lb(n): x_cpu = X^cpu_lb(E) - X^cpu_lb(n), a_cpu = 1 - exp(Q_lb(E) - Q_lb(n)); the n GPU
 *            experts counted as spread evenly, X^gpu_lb(n) / n_gpus and 1 - exp(Q_lb(n) /
 *            n_gpus) per GPU (plan_assign balances load per layer, so this is what it aims
 *            at).
 *   F_l(n) = sum_b W_b f_lb(n): the layer's share of the objective sum_b W_b step_b (the
 *            weighted predicted decode steps of the mix; one batch: W = 1, F_l = f_l).
 *   With hw.layer_max MOET_COST_MAX_SPREAD, f_lb also takes V^cpu_lb(E) - V^cpu_lb(n), the
 *            CPU tier's variance (prefix sums of its calls' variances), for the expected max
 *            of the tiers (moet_cost_layer_spread_ms).
 *
 * One ranking (by score) serves every batch: a layer's GPU experts are its top n whatever the
 * batch, so the mix only changes how many.
 *
 * Greedy: S times, give one slot to the layer with the largest gain g_l = F_l(n_l) -
 * F_l(n_l + 1) (ties: the busier next expert, then the lower layer); stop early only when
 * every gain is negative (a GPU slower than the CPU) or every layer is full.
 *
 * Why greedy is optimal when each F_l is convex in n (non-increasing gains; the separable
 * concave-saving case): any allocation n_1..n_L with sum n_l <= S saves sum_l (F_l(0) -
 * F_l(n_l)) = the sum of the first n_l gains of each layer: at most S gains, at most one
 * from each (layer, position), and only prefixes of each layer's sequence. The S largest
 * gains over all layers form such prefixes, because within a layer the gains do not
 * increase; greedy takes exactly those (it always takes the largest gain still available,
 * and a layer's next gain is never larger than the one just taken). So no allocation saves
 * more. F_l is convex wherever every f_lb is: a sum of convex functions with positive
 * weights is convex (its gains are the weighted sums of non-increasing gains), so the mix
 * keeps the argument. The CPU's expert term is convex: with the experts sorted by score its
 * time falls by X^cpu_(n), a non-increasing step. The max of the tiers and the A_tier
 * (overhead, copy) terms can break convexity (e.g. emptying a layer's CPU tier removes its
 * fixed costs at once), and so can the spread's expected max; greedy is then a
 * heuristic, so the plan keeps whichever of greedy and the even split has the smaller
 * weighted objective sum_l F_l (auto_kept_even says which).
 */
typedef struct auto_ctx {
	const moet_cost_in *in; /* [nb]: the cost input at each batch of the mix */
	const double *w;        /* [nb] weights */
	int nb;
	int64_t L, E;
	double *Xc, *Xg, *Q; /* [nb x L x (E + 1)] prefix sums of the CPU and GPU expected call
			      * times and of log(1 - P), in rank order */
	double *Vc;          /* the same of the CPU calls' variances (MOET_COST_MAX_SPREAD) */
} auto_ctx;

/* F_l(n) = sum_b W_b f_lb(n). NOTE: with one batch of weight 1 this is f_l(n) bit for bit
 * (0 + 1 x f), so a one-batch mix plans exactly as the plain batch. */
static double auto_f(const auto_ctx *c, int64_t l, int64_t n)
{
	double xg[MOET_PLACEMENT_MAX_GPUS], ag[MOET_PLACEMENT_MAX_GPUS], t = 0;
	const int ng = c->in[0].n_gpus;
	for (int b = 0; b < c->nb; b++) {
		const int64_t o = ((int64_t)b * c->L + l) * (c->E + 1);
		const double *Xc = c->Xc + o, *Xg = c->Xg + o, *Q = c->Q + o, *Vc = c->Vc + o;
		for (int g = 0; g < ng; g++) {
			xg[g] = Xg[n] / ng;
			ag[g] = -expm1(Q[n] / ng);
		}
		t += c->w[b] * moet_cost_layer_spread_ms(&c->in[b], Xc[c->E] - Xc[n],
							 Vc[c->E] - Vc[n],
							 -expm1(Q[c->E] - Q[n]), xg, ag);
	}
	return t;
}

static double auto_total(const auto_ctx *c, const int64_t *n, const moet_config *cf)
{
	double t = 0;
	for (int64_t l = 0; l < c->L; l++)
		t += moet_config_is_moe_layer(cf, l) ? auto_f(c, l, n[l]) : 0;
	return t;
}

static double next_score(const double *scores, const int32_t *rank, int64_t E, int64_t l,
			 int64_t n)
{
	return scores[l * E + rank[l * E + n]];
}

static int auto_counts(moet_plan *pl, const moet_config *cf, const double *scores,
		       const int32_t *rank)
{
	const int64_t L = pl->n_layers, E = pl->n_experts;
	const int nb = pl->n_batch;
	const size_t per = (size_t)(L * (E + 1)) * (size_t)nb;
	moet_cost_in *in = malloc((size_t)nb * sizeof(*in));
	auto_ctx c = { .in = in, .w = pl->weight, .nb = nb, .L = L, .E = E };
	int64_t *n = calloc((size_t)L, sizeof(*n));
	double *gain = malloc((size_t)L * sizeof(*gain));
	double *P = malloc((size_t)E * 4 * sizeof(*P)), *tc = NULL, *tg = NULL, *vc = NULL;
	c.Xc = calloc(per, sizeof(double));
	c.Xg = calloc(per, sizeof(double));
	c.Q = calloc(per, sizeof(double));
	c.Vc = calloc(per, sizeof(double));
	int rc = 0;
	if (!in || !n || !gain || !P || !c.Xc || !c.Xg || !c.Q || !c.Vc) {
		rc = moet_err(MOET_ENOMEM, "plan --auto");
		goto done;
	}
	tc = P + E;
	tg = P + 2 * E;
	vc = P + 3 * E;
	int64_t S = 0;
	for (int g = 0; g < pl->n_gpus; g++)
		S += pl->slots[g];
	for (int b = 0; b < nb; b++) {
		in[b] = pl->cost;
		in[b].batch = pl->batch[b];
		for (int64_t l = 0; l < L; l++) {
			moet_cost_expert_var_ms(&in[b], scores + l * E, E, P, tc, tg, vc);
			const int64_t o = ((int64_t)b * L + l) * (E + 1);
			double *Xc = c.Xc + o, *Xg = c.Xg + o, *Q = c.Q + o, *Vc = c.Vc + o;
			for (int64_t i = 0; i < E; i++) {
				const int32_t e = rank[l * E + i];
				const double p = P[e];
				/* NOTE: log(1 - 1) clamped: exp(-800) is 0 and differences stay
				 * finite. */
				Xc[i + 1] = Xc[i] + tc[e];
				Xg[i + 1] = Xg[i] + tg[e];
				Vc[i + 1] = Vc[i] + vc[e];
				Q[i + 1] = Q[i] + (p < 1 ? log1p(-p) : -800.0);
			}
		}
	}
	for (int64_t l = 0; l < L; l++)
		gain[l] = moet_config_is_moe_layer(cf, l) && E > 0 ?
				  auto_f(&c, l, 0) - auto_f(&c, l, 1) : -INFINITY;
	for (int64_t s = 0; s < S; s++) {
		int64_t best = -1;
		for (int64_t l = 0; l < L; l++) {
			if (n[l] >= E || gain[l] == -INFINITY)
				continue;
			if (best < 0 || gain[l] > gain[best] ||
			    (gain[l] == gain[best] && next_score(scores, rank, E, l, n[l]) >
						      next_score(scores, rank, E, best, n[best])))
				best = l;
		}
		if (best < 0 || gain[best] < 0)
			break;
		n[best]++;
		gain[best] = n[best] < E ? auto_f(&c, best, n[best]) - auto_f(&c, best, n[best] + 1)
					 : -INFINITY;
	}
	if (auto_total(&c, n, cf) < auto_total(&c, pl->per_layer, cf)) {
		memcpy(pl->per_layer, n, (size_t)L * sizeof(*n));
		pl->n_extra = 0;
	} else {
		pl->auto_kept_even = true;
	}
done:
	free(in);
	free(n);
	free(gain);
	free(P);
	free(c.Xc);
	free(c.Xg);
	free(c.Q);
	free(c.Vc);
	return rc;
}

/* The predicted step at each batch of the mix for `owner`, into out[], and its weighted sum. */
static int predict_mix(const moet_plan *pl, const double *scores, const int16_t *owner,
		       moet_cost_pred *out, double *out_objective)
{
	moet_cost_in in = pl->cost;
	double obj = 0;
	for (int b = 0; b < pl->n_batch; b++) {
		in.batch = pl->batch[b];
		int rc = moet_cost_predict(&in, scores, pl->n_layers, pl->n_experts, owner, &out[b]);
		if (rc)
			return rc;
		obj += pl->weight[b] * out[b].step_ms;
	}
	*out_objective = obj;
	return 0;
}

/* Step 3: GPUs, layer by layer. */
static void plan_assign(moet_plan *pl, const double *scores, const int32_t *rank)
{
	const int64_t L = pl->n_layers, E = pl->n_experts;
	const int n = pl->n_gpus;
	int64_t rem[MOET_PLACEMENT_MAX_GPUS], quota[MOET_PLACEMENT_MAX_GPUS];
	double lload[MOET_PLACEMENT_MAX_GPUS];
	memcpy(rem, pl->slots, sizeof(rem));
	double hit = 0, all = 0;
	for (int64_t l = 0; l < L; l++) {
		double tot = 0, placed = 0;
		for (int64_t e = 0; e < E; e++)
			tot += scores[l * E + e];
		all += tot;
		pl->layer_hit[l] = -1;
		if (!pl->per_layer[l])
			continue;
		for (int g = 0; g < n; g++)
			quota[g] = 0, lload[g] = 0;
		for (int64_t i = 0; i < pl->per_layer[l]; i++) {
			int best = 0;
			for (int g = 1; g < n; g++)
				best = rem[g] > rem[best] ? g : best;
			quota[best]++;
			rem[best]--;
		}
		for (int64_t i = 0; i < pl->per_layer[l]; i++) {
			const int32_t e = rank[l * E + i];
			const double s = scores[l * E + e];
			int best = -1;
			for (int g = 0; g < n; g++) {
				if (!quota[g])
					continue;
				if (best < 0 || lload[g] < lload[best] ||
				    (lload[g] == lload[best] && pl->load[g] < pl->load[best]))
					best = g;
			}
			if (best < 0) /* the quotas add up to per_layer[l]: cannot happen */
				break;
			quota[best]--;
			lload[best] += s;
			pl->load[best] += s;
			pl->used[best]++;
			pl->owner[l * E + e] = (int16_t)best;
			placed += s;
		}
		if (tot > 0)
			pl->layer_hit[l] = placed / tot;
		hit += placed;
		double mx = 0;
		for (int g = 0; g < n; g++)
			mx = lload[g] > mx ? lload[g] : mx;
		if (placed > 0 && mx * n / placed > pl->max_imbalance)
			pl->max_imbalance = mx * n / placed;
	}
	pl->hit_rate = all > 0 ? hit / all : -1;
}

/* The even split's GPUs and predicted steps (a shadow plan with the same slots). */
static int plan_even_pred(moet_plan *pl, const double *scores, const int32_t *rank)
{
	const int64_t L = pl->n_layers, E = pl->n_experts;
	/* NOTE: the shadow is only assigned (owner, layer_hit, loads): its copy of the
	 * prediction arrays is not used. */
	moet_plan sh = *pl;
	int rc = 0;
	sh.owner = malloc((size_t)(L * E) * sizeof(*sh.owner));
	sh.layer_hit = calloc((size_t)L, sizeof(*sh.layer_hit));
	if (!sh.owner || !sh.layer_hit) {
		rc = moet_err(MOET_ENOMEM, "plan: even split");
		goto done;
	}
	for (int64_t i = 0; i < L * E; i++)
		sh.owner[i] = MOET_PLACEMENT_CPU;
	plan_assign(&sh, scores, rank);
	pl->even_hit_rate = sh.hit_rate;
	if (!(rc = predict_mix(pl, scores, sh.owner, pl->mix_even, &pl->even_objective_ms)))
		pl->even_pred = pl->mix_even[0];
done:
	free(sh.owner);
	free(sh.layer_hit);
	return rc;
}

int moet_plan_make(const moet_config *cf, const moet_placement_sizes *sz, const double *scores,
		   const moet_plan_budget *b, moet_plan **out)
{
	const int64_t L = cf->num_hidden_layers, E = cf->n_routed_experts;
	int32_t *rank = NULL;
	moet_plan *pl = NULL;
	int rc;
	if (b->n_gpus < 1 || b->n_gpus > MOET_PLACEMENT_MAX_GPUS || !b->budget_bytes ||
	    b->hot_per_layer < 0)
		return moet_err(MOET_EINVAL, "plan: %d GPUs (1..%d), budget %" PRIu64 " bytes, "
				"hot per layer %" PRId64, b->n_gpus, MOET_PLACEMENT_MAX_GPUS,
				b->budget_bytes, b->hot_per_layer);
	if (b->n_mix < 0 || b->n_mix > MOET_PLAN_MAX_BATCHES)
		return moet_err(MOET_EINVAL, "plan: %d batch sizes in the mix (0..%d)", b->n_mix,
				MOET_PLAN_MAX_BATCHES);
	if (b->hw && !b->n_mix && b->batch < 1)
		return moet_err(MOET_EINVAL, "plan: decode batch %" PRId64 " (>= 1)", b->batch);
	for (int i = 0; b->hw && i < b->n_mix; i++)
		if (b->mix_batch[i] < 1 || !(b->mix_weight[i] > 0) || !isfinite(b->mix_weight[i]))
			return moet_err(MOET_EINVAL, "plan: batch mix item %d: batch %" PRId64
					" (>= 1), weight %g (positive, finite)", i + 1,
					b->mix_batch[i], b->mix_weight[i]);
	if (b->auto_slots && (!b->hw || b->hot_per_layer))
		return moet_err(MOET_EINVAL, "plan: --auto needs a cost model and no "
				"--hot-per-layer");
	if (sz->n_layers != L || sz->n_experts != E)
		return moet_err(MOET_EINVAL, "plan: sizes for %" PRId64 " x %" PRId64 ", model %"
				PRId64 " x %" PRId64, sz->n_layers, sz->n_experts, L, E);
	if (!(pl = calloc(1, sizeof(*pl))) ||
	    !(pl->per_layer = calloc((size_t)L, sizeof(*pl->per_layer))) ||
	    !(pl->owner = malloc((size_t)(L * E) * sizeof(*pl->owner))) ||
	    !(pl->layer_hit = calloc((size_t)L, sizeof(*pl->layer_hit)))) {
		rc = moet_err(MOET_ENOMEM, "plan");
		goto fail;
	}
	pl->n_layers = L;
	pl->n_experts = E;
	pl->n_gpus = b->n_gpus;
	for (int64_t i = 0; i < L * E; i++)
		pl->owner[i] = MOET_PLACEMENT_CPU;
	if ((rc = plan_slots(pl, cf, sz, b)) || (rc = rank_all(scores, L, E, &rank)) ||
	    (rc = plan_counts(pl, cf, scores, rank, b)))
		goto fail;
	if (b->hw) {
		pl->has_cost = true;
		pl->n_batch = b->n_mix ? b->n_mix : 1;
		for (int i = 0; i < pl->n_batch; i++) {
			pl->batch[i] = b->n_mix ? b->mix_batch[i] : b->batch;
			pl->weight[i] = b->n_mix ? b->mix_weight[i] : 1.0;
		}
		pl->cost = (moet_cost_in){ .hw = *b->hw, .batch = pl->batch[0],
					   .top_k = cf->num_experts_per_tok,
					   .d_model = cf->hidden_size,
					   .expert_bytes = pl->slot_bytes,
					   .dense_bytes = sz->dense_bytes - sz->embed_bytes,
					   .n_gpus = b->n_gpus,
					   .moe_inter = cf->moe_intermediate_size,
					   .dense_moe_share = moet_cost_dense_moe_share(cf, sz) };
		/* The even split first: its owner table is the comparison. */
		if ((rc = plan_even_pred(pl, scores, rank)))
			goto fail;
		if (b->auto_slots && !b->hot_per_layer) {
			pl->auto_slots = true;
			if ((rc = auto_counts(pl, cf, scores, rank)))
				goto fail;
		}
	}
	plan_assign(pl, scores, rank);
	if (pl->has_cost) {
		if ((rc = predict_mix(pl, scores, pl->owner, pl->mix_pred, &pl->objective_ms)))
			goto fail;
		pl->pred = pl->mix_pred[0];
	}
	free(rank);
	*out = pl;
	return 0;
fail:
	free(rank);
	moet_plan_free(pl);
	return rc;
}

int moet_plan_to_placement(const moet_plan *pl, const moet_config *cf, const char *label,
			   const moet_plan_budget *b, moet_placement **out)
{
	moet_placement_gpu gpus[MOET_PLACEMENT_MAX_GPUS];
	moet_placement *p = NULL;
	memset(gpus, 0, sizeof(gpus));
	for (int g = 0; g < pl->n_gpus; g++) {
		snprintf(gpus[g].name, sizeof(gpus[g].name), "gpu%d", g);
		gpus[g].budget_bytes = b->budget_bytes;
		gpus[g].reserve_bytes = b->reserve_bytes;
	}
	int rc = moet_placement_create(label, cf, pl->n_gpus, gpus, MOET_PLACEMENT_DENSE_SPLIT, &p);
	for (int64_t i = 0; !rc && i < pl->n_layers * pl->n_experts; i++)
		if (pl->owner[i] != MOET_PLACEMENT_CPU)
			rc = moet_placement_set_owner(p, i / pl->n_experts, i % pl->n_experts,
						      pl->owner[i]);
	if (rc) {
		moet_placement_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

/* ---- evaluation --------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

int moet_plan_evaluate(const moet_plan *pl, const double *test, const moet_gen_truth *truth,
		       uint64_t seed, moet_plan_eval *out)
{
	const int64_t L = pl->n_layers, E = pl->n_experts;
	uint8_t *mask = malloc((size_t)(L * E));
	int32_t *perm = malloc((size_t)E * sizeof(*perm));
	int rc = 0;
	if (!mask || !perm) {
		rc = moet_err(MOET_ENOMEM, "plan evaluation");
		goto done;
	}
	out->train_hit_rate = pl->hit_rate;
	for (int64_t i = 0; i < L * E; i++)
		mask[i] = pl->owner[i] != MOET_PLACEMENT_CPU;
	out->hit_rate = moet_plan_hit_rate(test, L, E, mask);
	if ((rc = moet_plan_top_mask(test, L, E, pl->per_layer, mask)))
		goto done;
	out->optimal_hit_rate = moet_plan_hit_rate(test, L, E, mask);
	for (int64_t i = 0; i < L * E; i++)
		mask[i] = i % E < pl->per_layer[i / E];
	out->first_k_hit_rate = moet_plan_hit_rate(test, L, E, mask);
	/* One uniform draw of K_l experts per layer (partial Fisher-Yates), and its mean. */
	memset(mask, 0, (size_t)(L * E));
	double all = 0, expect = 0;
	uint64_t x = seed;
	for (int64_t l = 0; l < L; l++) {
		double tot = 0;
		for (int64_t e = 0; e < E; e++) {
			perm[e] = (int32_t)e;
			tot += test[l * E + e];
		}
		for (int64_t i = 0; i < pl->per_layer[l]; i++) {
			int64_t j = i + (int64_t)(splitmix(&x) % (uint64_t)(E - i));
			int32_t t = perm[i];
			perm[i] = perm[j];
			perm[j] = t;
			mask[l * E + perm[i]] = 1;
		}
		all += tot;
		expect += tot * (double)pl->per_layer[l] / (double)E;
	}
	out->random_hit_rate = moet_plan_hit_rate(test, L, E, mask);
	out->random_expected = all > 0 ? expect / all : -1;
	out->generator_hit_rate = out->generator_expected = -1;
	if (truth) {
		int64_t *k = calloc((size_t)L, sizeof(*k));
		if (!k) {
			rc = moet_err(MOET_ENOMEM, "plan evaluation");
			goto done;
		}
		for (int64_t l = 0; l < L; l++)
			k[l] = truth->has_layer[l] ? pl->per_layer[l] : 0;
		rc = moet_plan_top_mask(truth->expert_share, L, E, k, mask);
		free(k);
		if (rc)
			goto done;
		out->generator_hit_rate = moet_plan_hit_rate(test, L, E, mask);
		double sum = 0;
		int64_t nl = 0;
		for (int64_t l = 0; l < L; l++) {
			if (!truth->has_layer[l] || !pl->per_layer[l])
				continue;
			nl++;
			for (int64_t e = 0; e < E; e++)
				sum += mask[l * E + e] ? truth->expert_share[l * E + e] : 0;
		}
		out->generator_expected = nl ? sum / (double)nl : -1;
	}
done:
	free(mask);
	free(perm);
	return rc;
}
