/*
 * cost_mb.c: the two-micro-batch form of a decode step in the cost model (moet_cost.h).
 *
 * The engine (runtime/forward.c) may run a batch as two halves interleaved layer by layer,
 *
 *   GPU:  Na(l) Ga(l)  Nb(l) Gb(l)  Ya(l) Na(l+1) Ga(l+1)  Yb(l) Nb(l+1) ...
 *   CPU:        [ Ca(l)          ]  [ Cb(l)          ]  [ Ca(l+1)        ] ...
 *
 * (N: the half's dense work of the layer, attention and router first; G: its GPU experts; C:
 * its CPU tier; Y: its copies), so that while the CPU tier works on one half the GPU runs the
 * other half's dense work. Each half is a job that visits the GPU side (N, then G beside its
 * own C, then Y) and the CPU once per layer; two such jobs on two machines settle into a
 * period of
 *
 *   max(load of the CPU, load of the GPU side, the longer half's own chain)
 *
 * which is t_layer2 of moet_cost.h. Each half's terms come from the same per-expert
 * quantities as one pass, at the half's batch: its touch chances P_e,h = 1 - (1 - p_e)^B_h
 * (so its CPU tier reads the experts its own tokens route to; one both halves route to is
 * read by each) and its expected call times E[t(R)] with R ~ Binomial(B_h, p_e).
 *
 * NOTE: expectations per tier and half before the max, as in one pass (optimistic when the
 * terms are close); the fill and drain of the pipeline (the first half's first dense work,
 * the last half's last combine) are not counted.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cost_int.h"
#include "moet_err.h"

/* One half's sums over a layer's experts. */
typedef struct half_acc {
	double x_cpu, lq_cpu, d_cpu; /* CPU: expected call time, log Pr(no touch), distinct */
	double x_gpu, lq_gpu;        /* the GPU's */
} half_acc;

int cost_mb_predict(const moet_cost_in *in, const double *scores, int64_t n_layers,
		    int64_t n_experts, const int16_t *owner, moet_cost_mb *out)
{
	const size_t ne = (size_t)(n_experts ? n_experts : 1);
	double *buf = malloc(6 * ne * sizeof(*buf));
	if (!buf)
		return moet_err(MOET_ENOMEM, "cost model: two micro-batches");
	memset(out, 0, sizeof(*out));
	moet_cost_in h[2] = { *in, *in };
	h[0].batch = in->batch / 2 > 1 ? in->batch / 2 : 1; /* as forward.c's split_point */
	h[1].batch = in->batch - h[0].batch;
	out->possible = true;
	out->batch_a = h[0].batch;
	out->batch_b = h[1].batch;
	int64_t n_moe = 0;
	for (int64_t l = 0; l < n_layers; l++) {
		double tot = 0;
		for (int64_t e = 0; e < n_experts; e++)
			tot += scores[l * n_experts + e];
		n_moe += tot > 0;
	}
	const double share = fmin(1, fmax(0, in->dense_moe_share));
	double dense[2];
	for (int k = 0; k < 2; k++) {
		dense[k] = cost_dense_ms(&h[k], h[k].batch);
		out->dense_ms += dense[k] * (1 - share);
	}
	const double ovh_c = in->hw.cpu_overhead_us * 1e-3, ovh_g = in->hw.gpu_overhead_us * 1e-3;
	for (int64_t l = 0; l < n_layers; l++) {
		const double *s = scores + l * n_experts;
		const int16_t *own = owner + l * n_experts;
		double tot = 0;
		for (int64_t e = 0; e < n_experts; e++)
			tot += s[e];
		if (!(tot > 0))
			continue; /* a dense layer or one without routings */
		half_acc a[2];
		double *P[2] = { buf, buf + ne };
		memset(a, 0, sizeof(a));
		for (int k = 0; k < 2; k++) {
			double *xc = buf + (2 + 2 * k) * ne, *xg = xc + ne;
			moet_cost_expert_ms(&h[k], s, n_experts, P[k], xc, xg);
			for (int64_t e = 0; e < n_experts; e++) {
				const double q = P[k][e] < 1 ? log1p(-P[k][e]) : -INFINITY;
				if (own[e] < 0) {
					a[k].x_cpu += xc[e];
					a[k].lq_cpu += q;
					a[k].d_cpu += P[k][e];
				} else {
					a[k].x_gpu += xg[e];
					a[k].lq_gpu += q;
				}
			}
		}
		double cpu = 0, gpu = 0, chain = 0;
		for (int k = 0; k < 2; k++) {
			const double a_cpu = -expm1(a[k].lq_cpu), a_gpu = -expm1(a[k].lq_gpu);
			const double C = a_cpu * ovh_c + a[k].x_cpu, G = a_gpu * ovh_g + a[k].x_gpu;
			const double Y = cost_transfer_ms(in, h[k].batch, a_cpu);
			const double N = dense[k] * share / (double)n_moe;
			cpu += C;
			gpu += N + G + Y;
			chain = fmax(chain, N + fmax(C, G) + Y);
			out->transfer_ms += Y;
			out->dense_in_layers_ms += N;
			out->cpu_distinct += a[k].d_cpu;
		}
		for (int64_t e = 0; e < n_experts; e++)
			if (own[e] < 0)
				out->cpu_shared += P[0][e] * P[1][e];
		out->cpu_ms += cpu;
		out->gpu_ms += gpu;
		out->layers_ms += fmax(fmax(cpu, gpu), chain);
	}
	out->step_ms = out->layers_ms + out->dense_ms;
	free(buf);
	return 0;
}
