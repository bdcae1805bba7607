/*
 * cost_model.c: the decode step cost model (moet_cost.h): touch probabilities, the roofline
 * time of one expert call, its expectation over a step's rows, and the prediction of a
 * placement's step time, split into parts.
 *
 * One expert call on r rows, per tier (ms):
 *
 *   bandwidth  bytes / (read GB/s x 1e6)                    the bytes of the expert, once
 *   compute    r x F / (frac(r) x peak GFLOP/s x 1e6)       F = 6 x hidden x moe_inter
 *   t(r)       max(bandwidth, compute)                      (a roofline per call)
 *
 *        t |                                 ___/  compute bound: r / frac(r), the measured
 *          |                             ___/      time of the kernel at r tokens
 *          |________________________ ___/
 *          |   bandwidth bound      /            (frac from the record's medians, so the
 *          +-----------------------+----- r       curve reproduces the bench at its points)
 *
 * The rows R of an expert in a step of B tokens are Binomial(B, p) (each token picks the
 * expert with probability p, independently), so the expected call time is
 * sum_{r >= 1} Pr(R = r) t(r). The sum runs over the binomial's bulk, r in
 * [mean - 12 sd, mean + 12 sd + 16] (the tails beyond hold less than 1e-30 of the mass),
 * with Pr(R = r) from one lgamma at the window's start and the ratio recurrence
 * Pr(r + 1) / Pr(r) = (B - r) p / ((r + 1)(1 - p)) after it. Without a compute curve t is
 * constant and the sum is P x bandwidth, computed as that (the bandwidth-only model, bit for
 * bit as before).
 *
 * NOTE: A_tier (the chance that a tier works at all in a step) is 1 - prod(1 - P_e), summed
 * in log space (log1p) so that 384 small P_e do not lose their product to rounding.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost_int.h"
#include "moet_cost.h"
#include "moet_err.h"

#define MAX_WINDOW 1024   /* binomial terms summed per expert before the mean is used */

void moet_cost_touch(const double *s, int64_t n, int64_t top_k, int64_t batch, double *P)
{
	double tot = 0;
	for (int64_t i = 0; i < n; i++)
		tot += s[i];
	for (int64_t i = 0; i < n; i++) {
		if (!(tot > 0) || !(s[i] > 0)) {
			P[i] = 0;
			continue;
		}
		double p = s[i] * (double)top_k / tot;
		p = p < 1 ? p : 1;
		/* 1 - (1 - p)^B without losing small p to rounding. */
		P[i] = p >= 1 ? 1 : -expm1((double)batch * log1p(-p));
	}
}

/* ---- one call ---------------------------------------------------------------------------- */

/* r / frac(r): rows over the fraction of the peak, interpolated linearly in r between the
 * curve's points (the fraction of the nearest point outside them). */
/* The measured dense part at batch b: linear between the curve's points, the first point's
 * value below it, the line through the last two above it (one point: that value). */
static double dense_curve_ms(const moet_cost_curve *c, double b)
{
	if (c->n == 1 || b <= c->tokens[0])
		return c->frac[0];
	int i = 1;
	while (i < c->n - 1 && b > c->tokens[i])
		i++;
	double x0 = c->tokens[i - 1], x1 = c->tokens[i], y0 = c->frac[i - 1], y1 = c->frac[i];
	return y0 + (y1 - y0) * (b - x0) / (x1 - x0);
}

static double curve_rows(const moet_cost_curve *c, double r)
{
	const int n = c->n;
	if (r <= c->tokens[0])
		return r / c->frac[0];
	if (r >= c->tokens[n - 1])
		return r / c->frac[n - 1];
	int i = 0;
	while (r > c->tokens[i + 1])
		i++;
	const double a = c->tokens[i] / c->frac[i], b = c->tokens[i + 1] / c->frac[i + 1];
	return a + (b - a) * (r - c->tokens[i]) / (c->tokens[i + 1] - c->tokens[i]);
}

typedef struct tier {
	double bw_ms;                /* bytes / read */
	double flop_ms;              /* F / peak: ms per (row / fraction); 0: no compute term */
	const moet_cost_curve *c;
} tier;

static tier tier_of(const moet_cost_in *in, bool gpu)
{
	const moet_cost_hw *h = &in->hw;
	const moet_cost_curve *c = gpu ? &h->gpu_sgemm_frac : &h->cpu_fma_frac;
	const double peak = gpu ? h->gpu_sgemm_gflops : h->cpu_fma_gflops;
	tier t = { .bw_ms = (double)in->expert_bytes / ((gpu ? h->gpu_read_gbps :
							  h->cpu_read_gbps) * 1e6), .c = c };
	if (c->n > 0 && in->moe_inter > 0 && peak > 0)
		t.flop_ms = 6.0 * (double)in->d_model * (double)in->moe_inter / (peak * 1e6);
	return t;
}

static double tier_call(const tier *t, double r)
{
	if (!(r > 0))
		return 0;
	if (!t->flop_ms)
		return t->bw_ms;
	const double c = t->flop_ms * curve_rows(t->c, r);
	return c > t->bw_ms ? c : t->bw_ms;
}

double moet_cost_call_ms(const moet_cost_in *in, bool gpu, double rows)
{
	const tier t = tier_of(in, gpu);
	return tier_call(&t, rows);
}

/* ---- the expected call over a step -------------------------------------------------------- */

/* E[t(R)] for R ~ Binomial(B, p), 0 < p < 1, on both tiers (see the design note), and the
 * CPU call's second moment E[t(R)^2] into *x2c. */
static void expect_calls(const tier *tc, const tier *tg, int64_t batch, double p, double P,
			 double *xc, double *xg, double *x2c)
{
	const double B = (double)batch, mu = B * p, sd = sqrt(mu * (1 - p));
	*xc = P * tc->bw_ms;
	*xg = P * tg->bw_ms;
	*x2c = P * tc->bw_ms * tc->bw_ms;
	if (!tc->flop_ms && !tg->flop_ms)
		return;
	double lo = floor(mu - 12 * sd), hi = ceil(mu + 12 * sd) + 16;
	lo = lo > 1 ? lo : 1;
	hi = hi < B ? hi : B;
	if (hi - lo > MAX_WINDOW) {
		/* A wide, and so relatively narrow, distribution: the mean rows given a touch. */
		const double m = mu / P;
		if (tc->flop_ms) {
			const double t = tier_call(tc, m);
			*xc = P * t;
			*x2c = P * t * t;
		}
		if (tg->flop_ms)
			*xg = P * tier_call(tg, m);
		return;
	}
	double pm = exp(lgamma(B + 1) - lgamma(lo + 1) - lgamma(B - lo + 1) + lo * log(p) +
			(B - lo) * log1p(-p));
	const double odds = p / (1 - p);
	double sc = 0, sg = 0, sc2 = 0;
	for (double r = lo; r <= hi; r++) {
		const double t = tier_call(tc, r);
		sc += pm * t;
		sc2 += pm * t * t;
		sg += pm * tier_call(tg, r);
		pm *= (B - r) / (r + 1) * odds;
	}
	if (tc->flop_ms) {
		*xc = sc;
		*x2c = sc2;
	}
	if (tg->flop_ms)
		*xg = sg;
}

void moet_cost_expert_ms(const moet_cost_in *in, const double *s, int64_t n, double *P,
			 double *t_cpu, double *t_gpu)
{
	moet_cost_expert_var_ms(in, s, n, P, t_cpu, t_gpu, NULL);
}

void moet_cost_expert_var_ms(const moet_cost_in *in, const double *s, int64_t n, double *P,
			     double *t_cpu, double *t_gpu, double *v_cpu)
{
	const tier tc = tier_of(in, false), tg = tier_of(in, true);
	double tot = 0;
	for (int64_t i = 0; i < n; i++)
		tot += s[i];
	moet_cost_touch(s, n, in->top_k, in->batch, P);
	for (int64_t i = 0; i < n; i++) {
		double xc = 0, xg = 0, x2c = 0;
		const double p = tot > 0 && s[i] > 0 ? s[i] * (double)in->top_k / tot : 0;
		if (p >= 1) {
			xc = tier_call(&tc, (double)in->batch);
			xg = tier_call(&tg, (double)in->batch);
			x2c = xc * xc; /* every token: no spread */
		} else if (p > 0) {
			expect_calls(&tc, &tg, in->batch, p, P[i], &xc, &xg, &x2c);
		}
		if (t_cpu)
			t_cpu[i] = xc;
		if (t_gpu)
			t_gpu[i] = xg;
		if (v_cpu) /* NOTE: rounding can leave E[t^2] - E[t]^2 a hair below 0 */
			v_cpu[i] = x2c - xc * xc > 0 ? x2c - xc * xc : 0;
	}
}

/* ---- a layer ----------------------------------------------------------------------------- */

double cost_transfer_ms(const moet_cost_in *in, int64_t batch, double a_cpu)
{
	const moet_cost_hw *h = &in->hw;
	if (in->n_gpus == 0)
		return 0; /* everything on the host: nothing crosses PCIe */
	const double act = (double)batch * (double)in->d_model * h->act_bytes;
	return a_cpu * (2 * h->pcie_latency_us * 1e-3 + 2 * act / (h->pcie_gbps * 1e6));
}

static double transfer_ms(const moet_cost_in *in, double a_cpu)
{
	return cost_transfer_ms(in, in->batch, a_cpu);
}

double cost_dense_ms(const moet_cost_in *in, int64_t batch)
{
	/* The dense part on the GPUs (on the CPU when there are none): measured where the
	 * hardware gives the curve, else its bytes at the read bandwidth. */
	const moet_cost_curve *dc = &in->hw.gpu_dense_ms;
	if (in->n_gpus && dc->n)
		return dense_curve_ms(dc, (double)batch);
	return (double)in->dense_bytes /
	       ((in->n_gpus ? in->hw.gpu_read_gbps : in->hw.cpu_read_gbps) * 1e6);
}

/* The slowest GPU's time, its index in *which (-1 without GPUs). */
static double gpus_ms(const moet_cost_in *in, const double *x_gpu, const double *a_gpu,
		      int *which)
{
	double t_gpu = 0;
	*which = -1;
	for (int g = 0; g < in->n_gpus; g++) {
		const double t = a_gpu[g] * in->hw.gpu_overhead_us * 1e-3 + x_gpu[g];
		if (*which < 0 || t > t_gpu) {
			t_gpu = t;
			*which = g;
		}
	}
	return t_gpu;
}

/* E[max(C, g)] for C ~ Normal(mu, sd^2) (moet_cost.h, MOET_COST_MAX_SPREAD). */
static double expected_max(double mu, double sd, double g)
{
	if (!(sd > 0))
		return mu > g ? mu : g;
	const double d = (mu - g) / sd;
	const double pdf = exp(-0.5 * d * d) / sqrt(2 * M_PI), cdf = 0.5 * erfc(-d / sqrt(2));
	const double e = g + sd * (pdf + d * cdf), m = mu > g ? mu : g;
	/* NOTE: never below the max of the means (Jensen), which rounding could break far in
	 * a tail (pdf 0, cdf 1: g + (mu - g) in floating point) */
	return e > m ? e : m;
}

/* The layer's wait for its tiers: the max of the means, or with the spread the expected max
 * where both a CPU tier and a GPU tier have work. */
static double tiers_ms(const moet_cost_in *in, double t_cpu, double v_cpu, double t_gpu)
{
	if (in->hw.layer_max == MOET_COST_MAX_SPREAD && v_cpu > 0 && t_cpu > 0 && t_gpu > 0)
		return expected_max(t_cpu, sqrt(v_cpu), t_gpu);
	return t_cpu > t_gpu ? t_cpu : t_gpu;
}

double moet_cost_layer_spread_ms(const moet_cost_in *in, double x_cpu, double v_cpu,
				 double a_cpu, const double *x_gpu, const double *a_gpu)
{
	int g;
	const double t_cpu = a_cpu * in->hw.cpu_overhead_us * 1e-3 + x_cpu;
	const double t_gpu = gpus_ms(in, x_gpu, a_gpu, &g);
	return tiers_ms(in, t_cpu, v_cpu, t_gpu) + transfer_ms(in, a_cpu);
}

double moet_cost_layer_time_ms(const moet_cost_in *in, double x_cpu, double a_cpu,
			       const double *x_gpu, const double *a_gpu)
{
	return moet_cost_layer_spread_ms(in, x_cpu, 0, a_cpu, x_gpu, a_gpu);
}

int moet_cost_layer_max_parse(const char *s, int *out)
{
	if (s && !strcmp(s, "means"))
		*out = MOET_COST_MAX_MEANS;
	else if (s && !strcmp(s, "spread"))
		*out = MOET_COST_MAX_SPREAD;
	else
		return moet_err(MOET_EINVAL, "--layer-max '%s': want means or spread",
				s ? s : "(null)");
	return 0;
}

const char *moet_cost_layer_max_name(int layer_max)
{
	return layer_max == MOET_COST_MAX_SPREAD ? "spread" : "means";
}

double moet_cost_layer_ms(const moet_cost_in *in, double d_cpu, double a_cpu,
			  const double *d_gpu, const double *a_gpu)
{
	double x_gpu[64];
	const int n = in->n_gpus < 64 ? in->n_gpus : 64;
	for (int g = 0; g < n; g++)
		x_gpu[g] = d_gpu[g] * (double)in->expert_bytes / (in->hw.gpu_read_gbps * 1e6);
	return moet_cost_layer_time_ms(in, d_cpu * (double)in->expert_bytes /
				       (in->hw.cpu_read_gbps * 1e6), a_cpu, x_gpu, a_gpu);
}

/* ---- a placement ------------------------------------------------------------------------- */

typedef struct layer_acc {
	double x_cpu, v_cpu, lq_cpu, d_cpu, rows_cpu;
	double x_gpu[64], lq_gpu[64], d_gpu[64], rows_gpu[64];
} layer_acc;

/* Adds one layer's tiers to *out; the layer's experts' P, T on both tiers given. */
static void predict_layer(const moet_cost_in *in, const layer_acc *a, moet_cost_pred *out)
{
	const int n = in->n_gpus;
	double a_gpu[64];
	const double a_cpu = -expm1(a->lq_cpu);
	for (int g = 0; g < n; g++) {
		a_gpu[g] = -expm1(a->lq_gpu[g]);
		out->gpu_distinct += a->d_gpu[g];
		out->gpu_rows += a->rows_gpu[g];
	}
	out->cpu_distinct += a->d_cpu;
	out->cpu_rows += a->rows_cpu;
	const double ovh_cpu = a_cpu * in->hw.cpu_overhead_us * 1e-3;
	const double t_cpu = ovh_cpu + a->x_cpu;
	int g;
	const double t_gpu = gpus_ms(in, a->x_gpu, a_gpu, &g);
	const double xfer = transfer_ms(in, a_cpu);
	const double wait = tiers_ms(in, t_cpu, a->v_cpu, t_gpu);
	out->cpu_ms += t_cpu;
	out->gpu_ms += t_gpu;
	out->transfer_ms += xfer;
	out->experts_ms += wait + xfer;
	out->spread_ms += wait - (t_cpu > t_gpu ? t_cpu : t_gpu);
	if (t_cpu >= t_gpu) {
		out->cpu_expert_ms += a->x_cpu;
		out->overhead_ms += ovh_cpu;
	} else {
		out->gpu_expert_ms += a->x_gpu[g];
		out->overhead_ms += t_gpu - a->x_gpu[g];
	}
}

int moet_cost_predict(const moet_cost_in *in, const double *scores, int64_t n_layers,
		      int64_t n_experts, const int16_t *owner, moet_cost_pred *out)
{
	const int n = in->n_gpus;
	if (in->batch < 1 || n < 0 || n > 64 || in->top_k < 1)
		return moet_err(MOET_EINVAL, "cost model: batch %" PRId64 ", %d GPUs, top-k %"
				PRId64, in->batch, n, in->top_k);
	for (int64_t i = 0; i < n_layers * n_experts; i++)
		if (owner[i] < -1 || owner[i] >= n)
			return moet_err(MOET_EINVAL, "cost model: layer %" PRId64 " expert %" PRId64
					": owner %d is not a GPU of %d nor the CPU",
					i / n_experts, i % n_experts, owner[i], n);
	const size_t ne = (size_t)(n_experts ? n_experts : 1);
	double *P = malloc(ne * sizeof(*P)), *xc = malloc(ne * sizeof(*xc));
	double *xg = malloc(ne * sizeof(*xg)), *vc = malloc(ne * sizeof(*vc));
	layer_acc *a = malloc(sizeof(*a));
	int rc = 0;
	if (!P || !xc || !xg || !vc || !a) {
		rc = moet_err(MOET_ENOMEM, "cost model");
		goto done;
	}
	memset(out, 0, sizeof(*out));
	out->batch = in->batch;
	for (int64_t l = 0; l < n_layers; l++) {
		const double *s = scores + l * n_experts;
		double tot = 0;
		memset(a, 0, sizeof(*a));
		moet_cost_expert_var_ms(in, s, n_experts, P, xc, xg, vc);
		for (int64_t e = 0; e < n_experts; e++)
			tot += s[e];
		for (int64_t e = 0; e < n_experts; e++) {
			const int g = owner[l * n_experts + e];
			const double q = P[e] < 1 ? log1p(-P[e]) : -INFINITY;
			const double rows = tot > 0 ? fmin(1, s[e] * (double)in->top_k / tot) *
							      (double)in->batch : 0;
			if (g < 0) {
				a->d_cpu += P[e];
				a->lq_cpu += q;
				a->x_cpu += xc[e];
				a->v_cpu += vc[e];
				a->rows_cpu += rows;
			} else {
				a->d_gpu[g] += P[e];
				a->lq_gpu[g] += q;
				a->x_gpu[g] += xg[e];
				a->rows_gpu[g] += rows;
			}
		}
		if (tot > 0)
			predict_layer(in, a, out);
		/* else: a dense layer or one without routings */
	}
	out->dense_ms = cost_dense_ms(in, in->batch);
	out->step_ms = out->experts_ms + out->dense_ms;
	out->chosen_ms = out->step_ms;
	out->form = MOET_COST_ONE_PASS;
	/* The other form: two micro-batches (cost_mb.c). */
	if (n == 1 && in->batch >= 2 && (rc = cost_mb_predict(in, scores, n_layers, n_experts,
							       owner, &out->two)) == 0 &&
	    out->two.step_ms < out->step_ms) {
		out->form = MOET_COST_TWO_HALVES;
		out->chosen_ms = out->two.step_ms;
	}
done:
	free(P);
	free(xc);
	free(xg);
	free(vc);
	free(a);
	return rc;
}

/* ---- from a model, a placement and a profile ----------------------------------------------- */

int moet_cost_predict_step(const moet_config *cf, const moet_placement_sizes *sz,
			   const moet_placement *pl, const moet_profile *prof, int phase,
			   const moet_cost_hw *hw, int64_t batch, moet_cost_pred *out)
{
	const int64_t L = cf->num_hidden_layers, E = cf->n_routed_experts;
	if (moet_placement_n_layers(pl) != L || moet_placement_n_experts(pl) != E)
		return moet_err(MOET_EINVAL, "predict: placement %s is for %" PRId64 " layers x %"
				PRId64 " experts, the model %" PRId64 " x %" PRId64,
				moet_placement_label(pl), moet_placement_n_layers(pl),
				moet_placement_n_experts(pl), L, E);
	return moet_cost_predict_owners(cf, sz, moet_placement_owners(pl),
					moet_placement_n_gpus(pl), prof, phase, hw, batch, out);
}

int moet_cost_predict_owners(const moet_config *cf, const moet_placement_sizes *sz,
			     const int16_t *owner, int n_gpus, const moet_profile *prof,
			     int phase, const moet_cost_hw *hw, int64_t batch, moet_cost_pred *out)
{
	const int64_t L = cf->num_hidden_layers, E = cf->n_routed_experts;
	moet_placement_sizes *own_sz = NULL;
	double *scores = NULL;
	int rc = 0;
	if (batch < 1)
		return moet_err(MOET_EINVAL, "predict: decode batch %" PRId64 " (>= 1)", batch);
	if (phase < 0 || phase > MOET_COST_PHASE_BOTH)
		return moet_err(MOET_EINVAL, "predict: phase %d", phase);
	if (prof->n_layers != L || prof->n_experts != E || prof->top_k != cf->num_experts_per_tok)
		return moet_err(MOET_EINVAL, "predict: profile for %" PRId64 " layers x %" PRId64
				" experts, top-k %" PRId64 "; the model %" PRId64 " x %" PRId64
				", top-k %" PRId64, prof->n_layers, prof->n_experts, prof->top_k, L,
				E, cf->num_experts_per_tok);
	if (!sz && (rc = moet_placement_sizes_from_config(cf, &own_sz)))
		return rc;
	if (!sz)
		sz = own_sz;
	if (sz->n_layers != L || sz->n_experts != E) {
		rc = moet_err(MOET_EINVAL, "predict: sizes for %" PRId64 " x %" PRId64 ", model %"
			      PRId64 " x %" PRId64, sz->n_layers, sz->n_experts, L, E);
		goto done;
	}
	if (!(scores = calloc((size_t)(L * E > 0 ? L * E : 1), sizeof(*scores)))) {
		rc = moet_err(MOET_ENOMEM, "predict");
		goto done;
	}
	double seen = 0;
	uint64_t eb = 0;
	for (int q = 0; q < MOET_PROFILE_PHASES; q++) {
		if (phase != MOET_COST_PHASE_BOTH && q != phase)
			continue;
		const uint64_t *c = prof->counts + moet_profile_at(prof, q, 0);
		for (int64_t i = 0; i < L * E; i++) {
			scores[i] += (double)c[i];
			seen += (double)c[i];
		}
	}
	if (seen == 0) {
		rc = moet_err(MOET_EINVAL, "predict: the profile has no %s routings", phase ==
			      MOET_PROFILE_DECODE ? "decode" : phase == MOET_PROFILE_PREFILL ?
			      "prefill" : "decode or prefill");
		goto done;
	}
	for (int64_t l = 0; l < L; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(cf, l) && e < E; e++)
			eb = sz->expert_bytes[l * E + e] > eb ? sz->expert_bytes[l * E + e] : eb;
	const moet_cost_in in = { .hw = *hw, .batch = batch, .top_k = cf->num_experts_per_tok,
				  .d_model = cf->hidden_size, .expert_bytes = eb,
				  .dense_bytes = sz->dense_bytes - sz->embed_bytes,
				  .n_gpus = n_gpus,
				  .moe_inter = cf->moe_intermediate_size,
				  .dense_moe_share = moet_cost_dense_moe_share(cf, sz) };
	rc = moet_cost_predict(&in, scores, L, E, owner, out);
done:
	free(scores);
	moet_placement_sizes_free(own_sz);
	return rc;
}

double moet_cost_dense_moe_share(const moet_config *cf, const moet_placement_sizes *sz)
{
	int64_t n_moe = 0;
	for (int64_t l = 0; l < cf->num_hidden_layers; l++)
		n_moe += moet_config_is_moe_layer(cf, l);
	const double whole = (double)(sz->dense_bytes - sz->embed_bytes);
	if (!(whole > 0) || cf->num_hidden_layers <= 0)
		return 0;
	const double in_moe = (double)sz->attn_bytes * (double)n_moe /
			      (double)cf->num_hidden_layers + (double)sz->router_bytes +
			      (double)sz->shared_bytes;
	return in_moe < whole ? in_moe / whole : 1;
}

const char *moet_cost_form_name(int form)
{
	return form == MOET_COST_TWO_HALVES ? "two halves" : "one pass";
}

/* ---- prefill staging of a cold expert (issue 5 item 2) ------------------------------------ */

double moet_cost_stage_ms(const moet_cost_in *in, double rows)
{
	if (!(rows > 0))
		return 0;
	const moet_cost_hw *h = &in->hw;
	return h->pcie_latency_us * 1e-3 + (double)in->expert_bytes / (h->stage_copy_gbps * 1e6) +
	       moet_cost_call_ms(in, true, rows);
}

int64_t moet_cost_stage_min_rows(const moet_cost_in *in, int64_t max_rows)
{
	if (max_rows < 1)
		return 0;
	/* NOTE: scanned down from max_rows rather than solved: the curves make t_cpu - t_stage
	 * piecewise, and the answer must be a tail on which staging always wins (the engine
	 * stages at n >= the answer), whatever the shape between the points. */
	int64_t r = max_rows;
	while (r >= 1 &&
	       moet_cost_stage_ms(in, (double)r) < moet_cost_call_ms(in, false, (double)r))
		r--;
	return r == max_rows ? 0 : r + 1;
}
