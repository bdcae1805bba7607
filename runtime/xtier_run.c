/*
 * xtier_run.c: the NVMe expert tier at work (moet_xtier.h): acquire and release of a MoE
 * layer's CPU-tier experts, the value that decides evictions, and the router-based prefetch.
 *
 *   value(l, e) = f(l, e) / (1 + age)       f: routing frequency within layer l,
 *                                             (profile share + this run's share) / 2, each
 *                                             add-one smoothed (this run's share alone
 *                                             without a profile)
 *                                             age: tokens since the expert was last acquired
 *                                             (acquire ticks / MoE layers)
 *   demand miss      -> a free slot, else the unpinned ready slot of least value (always:
 *                       the layer cannot run without it); in-flight slots are waited for
 *   prefetch         -> a free slot, else an unpinned ready slot of value below the
 *                       candidate's (f at age 0) and not predicted in the same round:
 *                       a predicted cold expert never evicts a hotter one
 *
 * Prefetch predicts with the next MoE layer's own router applied to the hidden state after
 * the current layer: h = rmsnorm(x, post_attention_layernorm of that layer), logits = router
 * x h (the contract rows kernel), scores = sigmoid (exp_c), the reference noaux_tc selection.
 * NOTE: the real router input also has that layer's attention added; the residual stream
 * changes little per layer, which is what makes this a predictor (recall is measured, not
 * assumed: moet_xtier_stats).
 */
#include "xtier_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moet_cpu.h"
#include "moet_err.h"
#include "moet_expc.h"

double xt_value(const moet_xtier *x, int64_t l, int64_t e, uint64_t last_use)
{
	const double E = (double)x->E;
	double f = ((double)x->obs[l * x->E + e] + 1.0) / ((double)x->obs_tot[l] + E);
	if (x->prior_tot[l] > 0)
		f = 0.5 * (f + (x->prior[l * x->E + e] + 1.0) / (x->prior_tot[l] + E));
	double age = (double)(x->tick - last_use) / (double)(x->n_moe ? x->n_moe : 1);
	return f / (1.0 + age);
}

/* A slot to read into: a free one, else the unpinned ready one of least value below `below`
 * (not protected by round `protect` when non-zero); -1 if none. *out_wait: some unpinned slot
 * is still loading (it may become a candidate). */
static int64_t victim(moet_xtier *x, double below, uint64_t protect, int *out_wait)
{
	int64_t best = -1;
	double best_v = below;
	*out_wait = 0;
	for (int64_t s = 0; s < x->n_slots; s++) {
		const xt_slot *sl = &x->slots[s];
		if (sl->pins)
			continue;
		if (sl->state == XT_FREE)
			return s;
		if (sl->state == XT_LOADING) {
			*out_wait = 1;
			continue;
		}
		if (protect && sl->round == protect)
			continue;
		double v = xt_value(x, sl->layer, sl->expert, sl->last_use);
		if (v < best_v) {
			best_v = v;
			best = s;
		}
	}
	return best;
}

int moet_xtier_is_resident(const moet_xtier *x, int64_t layer, int64_t expert)
{
	if (layer < 0 || layer >= x->L || expert < 0 || expert >= x->E)
		return 0;
	int32_t s = x->where[layer * x->E + expert];
	return s >= 0 && x->slots[s].state == XT_READY;
}

void moet_xtier_release(moet_xtier *x, int64_t layer)
{
	(void)layer;
	for (int64_t i = 0; i < x->n_pinned; i++)
		x->slots[x->pinned[i]].pins--;
	x->n_pinned = 0;
}

/* Waits until no pinned slot is loading; a pinned prefetch that failed is read again once as
 * a demand read. Returns 0 or the error of a failed read. */
static int wait_pinned(moet_xtier *x, int64_t l, const int64_t *pinned_e)
{
	uint64_t t0 = moet_now_ns();
	int rc = 0;
	for (;;) {
		int loading = 0;
		for (int64_t i = 0; i < x->n_pinned && !rc; i++) {
			xt_slot *sl = &x->slots[x->pinned[i]];
			if (sl->state == XT_FREE && sl->failed && !sl->demand) {
				sl->failed = 0;
				rc = xt_load(x, x->pinned[i], l, pinned_e[i], 1);
			}
			loading |= sl->state == XT_LOADING;
		}
		if (rc || !loading)
			break;
		int got = moet_uring_poll(x->u, 1);
		if (got < 0)
			rc = got;
	}
	x->st.wait_ns += moet_now_ns() - t0;
	for (int64_t i = 0; !rc && i < x->n_pinned; i++)
		if (x->slots[x->pinned[i]].state != XT_READY)
			rc = moet_err(MOET_EIO, "NVMe expert tier, layer %lld expert %lld: %s",
				      (long long)l, (long long)pinned_e[i], x->err);
	return rc;
}

int moet_xtier_acquire(moet_xtier *x, int64_t layer, const moet_expert_pair *pairs,
		       int64_t n_pairs, const moet_ffn_w **out_table, int64_t *out_n_pairs)
{
	const int64_t E = x->E, l = layer;
	int64_t *pinned_e = x->pinned_e;
	int64_t q = 0, n_cpu = 0;
	int rc = 0;
	moet_xtier_release(x, l);
	*out_n_pairs = 0;
	x->tick++;
	const int counted = x->pred_layer == l;
	const uint64_t misses0 = x->st.misses;
	if (counted && x->pf_t0) {
		/* prediction to use: the time the budget's reads have (moving average) */
		const double w = (double)(moet_now_ns() - x->pf_t0);
		x->pf_window_ns = x->pf_window_ns > 0 ? 0.75 * x->pf_window_ns + 0.25 * w : w;
	}
	for (int64_t e = 0; counted && e < E; e++)
		n_cpu += xt_is_cpu(x, l, e);
	while (q < n_pairs && x->n_pinned < x->n_slots) {
		const int64_t e = pairs[q].expert;
		int64_t r = 1, s = x->where[l * E + e];
		while (q + r < n_pairs && pairs[q + r].expert == e)
			r++;
		if (s < 0) {
			int wait = 1;
			while ((s = victim(x, INFINITY, 0, &wait)) < 0 && wait) {
				int got = moet_uring_poll(x->u, 1);
				if (got < 0) {
					rc = got;
					goto fail;
				}
			}
			if (s < 0)
				break; /* every slot holds an expert of this run */
			if (x->slots[s].state == XT_READY)
				x->st.evictions++;
			if ((rc = xt_load(x, s, l, e, 1)))
				goto fail;
			x->st.misses++;
		} else if (x->slots[s].state == XT_READY) {
			x->st.hits++;
		} else {
			x->st.late_hits++;
		}
		xt_slot *sl = &x->slots[s];
		if (sl->prefetched) {
			x->st.prefetch_used++;
			sl->prefetched = 0;
		}
		sl->pins++;
		sl->last_use = x->tick;
		pinned_e[x->n_pinned] = e;
		x->pinned[x->n_pinned++] = (int32_t)s;
		x->st.lookups++;
		xt_trace_add(x, l, e);
		x->obs[l * E + e] += (uint64_t)r;
		x->obs_tot[l] += (uint64_t)r;
		if (counted) {
			x->st.actual++;
			x->st.predicted_hits += x->pred[e];
			x->pred_hit_tot += x->pred[e];
			x->st.chance_hits_x1e6 += (uint64_t)(1e6 * (double)x->pred_cpu /
							     (double)(n_cpu ? n_cpu : 1));
		}
		q += r;
	}
	x->pf_miss_avg = 0.75 * x->pf_miss_avg + 0.25 * (double)(x->st.misses - misses0);
	if ((rc = wait_pinned(x, l, pinned_e)))
		goto fail;
	for (int64_t i = 0; i < x->n_pinned; i++)
		x->table[pinned_e[i]] = x->slots[x->pinned[i]].views;
	*out_table = x->table;
	*out_n_pairs = q;
	return 0;
fail:
	for (int64_t i = 0; i < x->n_pinned; i++)
		if (x->slots[x->pinned[i]].state == XT_FREE)
			x->slots[x->pinned[i]].failed = 0;
	moet_xtier_release(x, l);
	return rc;
}

typedef struct cand {
	double value;
	int64_t e;
} cand;

static int cmp_cand(const void *a, const void *b)
{
	const cand *p = a, *q = b;
	if (p->value != q->value)
		return p->value > q->value ? -1 : 1;
	return p->e < q->e ? -1 : p->e > q->e;
}

/* The experts layer l2's router picks for rows x_h[n x H] (host), into x->pred. */
static int predict(moet_xtier *x, int64_t l2, const float *xh, int64_t n, float *hn,
		   float *logits, float *sc, int32_t *ids, float *w)
{
	const moet_config *c = &x->m->cfg;
	const int64_t H = x->H, E = x->E;
	for (int64_t t = 0; t < n; t++)
		moet_rmsnorm_ref(xh + t * H, x->post_norm[l2], H, c->rms_norm_eps, hn + t * H);
	moet_cpu_kernels_get()->rows(&x->router[l2], 0, E, hn, H, n, logits, E);
	memset(x->pred, 0, (size_t)E);
	for (int64_t t = 0; t < n; t++) {
		for (int64_t e = 0; e < E; e++)
			sc[e] = 1.0f / (1.0f + moet_exp_c(-logits[t * E + e]));
		moet_router_select_ref(sc, x->router_bias[l2], E, c->n_group, c->topk_group, x->k,
				       c->norm_topk_prob, (float)c->routed_scaling_factor, sc + E,
				       ids, w);
		for (int64_t i = 0; i < x->k; i++)
			x->pred[ids[i]] = 1;
	}
	return 0;
}

/* The budget of one prediction round (moet_xtier.h, MOET_XTIER_PF_BUDGET). */
typedef struct pf_budget {
	int all;         /* no budget: ALL, or nothing measured yet */
	double rate;     /* bytes per ns */
	double idle;     /* ns the disk is left idle before the acquire */
	double p, m;
} pf_budget;

static void pf_begin(const moet_xtier *x, pf_budget *b)
{
	*b = (pf_budget){ .all = 1 };
	if (x->pf_mode == MOET_XTIER_PF_ALL)
		return;
	const double rate = x->o.pf_rate_Bps > 0 ? x->o.pf_rate_Bps * 1e-9 : xt_io_rate(x);
	const double win = x->o.pf_window_ns > 0 ? x->o.pf_window_ns : x->pf_window_ns;
	if (rate <= 0 || win <= 0)
		return; /* NOTE: no figure yet (no read completed, or the first round): read as ALL */
	b->all = 0;
	b->rate = rate;
	b->idle = win - (double)x->loading_bytes / rate;
	b->p = ((double)x->pred_hit_tot + 1.0) / ((double)x->pred_tot + 2.0);
	b->m = x->pf_miss_avg;
}

/* Is the next candidate (its bytes) worth reading ahead? Takes its time off the idle time. */
static int pf_next(pf_budget *b, double bytes)
{
	if (b->all)
		return 1;
	const double t = bytes / b->rate;
	if (!xt_pf_take(b->p, b->m, t, b->idle))
		return 0;
	b->idle -= t;
	return 1;
}

void moet_xtier_prefetch(moet_xtier *x, int64_t layer, const float *x_rows, int64_t n)
{
	const int64_t H = x->H, E = x->E, l2 = x->next_moe[layer];
	x->pred_layer = -1;
	if (l2 < 0 || x->o.no_prefetch || n <= 0) {
		moet_uring_poll(x->u, 0);
		return;
	}
	/* scratch (grown, never shrunk: nothing allocated per token once the batch size has
	 * been seen): x rows, normed rows, logits, scores + selection scratch, weights, then
	 * the candidates at an 8-byte boundary */
	const size_t n_f = (size_t)(2 * n * H + n * E + 2 * E + x->m->cfg.n_group + 1 + 2 * x->k);
	const size_t c_at = (n_f + 1) & ~(size_t)1; /* floats are 4 bytes: an even count */
	size_t need = c_at + (size_t)E * (sizeof(cand) / sizeof(float));
	if (need > x->scr_elems) {
		float *p = realloc(x->scr, need * sizeof(float));
		if (!p)
			return;
		x->scr = p;
		x->scr_elems = need;
	}
	float *xh = x->scr, *hn = xh + n * H, *logits = hn + n * H, *sc = logits + n * E;
	float *w = sc + 2 * E + x->m->cfg.n_group + 1;
	int32_t ids[MOET_MODEL_MAX_TOPK];
	if (x->m->be->ops->download(x->m->be, xh, x_rows, (size_t)(n * H) * sizeof(float)) ||
	    predict(x, l2, xh, n, hn, logits, sc, ids, w))
		return;
	cand *cs = (cand *)(void *)(x->scr + c_at);
	x->pred_layer = l2;
	x->pf_t0 = moet_now_ns();
	x->pred_cpu = 0;
	x->round++;
	int64_t nc = 0;
	for (int64_t e = 0; e < E; e++) {
		if (!x->pred[e] || !xt_is_cpu(x, l2, e))
			continue;
		x->pred_cpu++;
		int32_t s = x->where[l2 * E + e];
		if (s >= 0)
			x->slots[s].round = x->round; /* predicted: not evicted by this round */
		else
			cs[nc++] = (cand){ xt_value(x, l2, e, x->tick), e };
	}
	x->st.predicted += (uint64_t)x->pred_cpu;
	x->pred_tot += (uint64_t)x->pred_cpu;
	qsort(cs, (size_t)nc, sizeof(*cs), cmp_cand);
	pf_budget b;
	pf_begin(x, &b);
	for (int64_t i = 0; i < nc; i++) {
		if (!pf_next(&b, (double)x->info[l2 * E + cs[i].e].bytes)) {
			x->st.prefetch_declined += (uint64_t)(nc - i);
			break; /* candidates come in falling value (and equal sizes within a layer) */
		}
		int wait;
		int64_t s = victim(x, cs[i].value, x->round, &wait);
		if (s < 0)
			break; /* candidates come in falling value: none after this one fits */
		if (x->slots[s].state == XT_READY)
			x->st.evictions++;
		if (xt_load(x, s, l2, cs[i].e, 0))
			break;
		x->slots[s].round = x->round;
		x->st.prefetch_reads++;
	}
	moet_uring_poll(x->u, 0); /* submit; reap what is done */
}
