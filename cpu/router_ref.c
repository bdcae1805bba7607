/*
 * router_ref.c: expert selection and routing weights of the noaux_tc router, one token.
 *
 * NOTE: masked (ineligible) experts are excluded outright, as DeepSeek's own inference code
 * does with -inf; transformers fills them with 0.0 instead, which differs only when every
 * eligible biased score is negative (never in practice: scores are sigmoids and biases small).
 */
#include "moet_cpu.h"

#include <math.h>

/* Index of the largest v[i] among i in [0, n) with ok[i] != 0, ties to the lowest index;
 * -1 if none. NaN never wins. */
static int64_t argmax_masked(const float *v, const unsigned char *ok, int64_t n)
{
	int64_t best = -1;
	for (int64_t i = 0; i < n; i++) {
		if (!ok[i] || v[i] != v[i])
			continue;
		if (best < 0 || v[i] > v[best])
			best = i;
	}
	return best;
}

void moet_router_select_ref(const float *score, const float *bias, int64_t n_exp,
			    int64_t n_group, int64_t topk_group, int64_t top_k, int norm_topk_prob,
			    float routed_scaling_factor, float *scratch, int32_t *out_ids,
			    float *out_w)
{
	float *biased = scratch;
	float *gscore = scratch + n_exp;
	/* NOTE: eligibility flags live in the scratch's float slots reinterpreted as bytes would
	 * be fragile; a small stack array bounds the expert count instead (checked at open). */
	unsigned char ok[4096];
	for (int64_t e = 0; e < n_exp; e++) {
		biased[e] = score[e] + bias[e];
		ok[e] = 1;
	}
	if (n_group > 1) {
		const int64_t per = n_exp / n_group;
		unsigned char gok[4096];
		for (int64_t g = 0; g < n_group; g++) {
			const float *b = biased + g * per;
			int64_t i1 = 0;
			for (int64_t i = 1; i < per; i++)
				if (b[i] > b[i1])
					i1 = i;
			if (per == 1) {
				gscore[g] = b[0];
			} else {
				int64_t i2 = (i1 == 0) ? 1 : 0;
				for (int64_t i = 0; i < per; i++)
					if (i != i1 && b[i] > b[i2])
						i2 = i;
				gscore[g] = b[i1] + b[i2];
			}
			gok[g] = 1;
		}
		unsigned char keep[4096] = { 0 };
		for (int64_t j = 0; j < topk_group; j++) {
			int64_t g = argmax_masked(gscore, gok, n_group);
			if (g < 0)
				break;
			gok[g] = 0;
			keep[g] = 1;
		}
		for (int64_t e = 0; e < n_exp; e++)
			ok[e] = keep[e / per];
	}
	float sum = 0.0f;
	for (int64_t i = 0; i < top_k; i++) {
		int64_t e = argmax_masked(biased, ok, n_exp);
		if (e < 0)
			e = 0; /* unreachable with valid configs (top_k <= eligible experts) */
		ok[e] = 0;
		out_ids[i] = (int32_t)e;
		out_w[i] = score[e];
		sum += score[e];
	}
	if (norm_topk_prob) {
		float den = sum + 1e-20f;
		for (int64_t i = 0; i < top_k; i++)
			out_w[i] = out_w[i] / den;
	}
	for (int64_t i = 0; i < top_k; i++)
		out_w[i] = out_w[i] * routed_scaling_factor;
}
