/*
 * rope.c: rotary frequencies (plain and YaRN), the yarn attention factor, and the softmax
 * scale of MLA, as transformers' DeepseekV3 computes them.
 *
 *   dim = qk_rope_head_dim, i = 0 .. dim/2-1
 *   plain:  inv_freq[i] = 1 / theta^(2i/dim)
 *   yarn:   pos_freq = theta^(2i/dim); extra = 1/pos_freq; inter = 1/(factor*pos_freq)
 *           low/high = correction dims of beta_fast/beta_slow rotations at the original
 *           context length (floor/ceil when truncate), clamped to [0, dim-1]
 *           ramp[i] = clamp((i - low) / (high - low), 0, 1)   (high += 0.001 if equal)
 *           inv_freq = inter * ramp + extra * (1 - ramp)
 *           attention factor (multiplies cos and sin): attention_factor if given, else
 *           mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are non-zero,
 *           else mscale(factor, 1); mscale(s, m) = 1 if s <= 1, else 0.1 m ln(s) + 1
 *   softmax scale = qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 for yarn
 *                   when mscale_all_dim is non-zero
 *
 * NOTE: transformers computes the frequencies, positions x frequencies, cos and sin in
 * binary32 (torch float). We do the same arithmetic in binary32 where it rounds visibly
 * (inv_freq, the angle) and use binary64 cos/sin of that binary32 angle, so the tables
 * agree with transformers' to the last bit or so; the oracle tolerance covers the rest.
 */
#include <math.h>
#include <stdlib.h>

#include "model_int.h"
#include "moet_err.h"

static double yarn_mscale(double scale, double mscale)
{
	return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double correction_dim(double n_rot, double dim, double base, double max_pos)
{
	return (dim * log(max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

int moet_rope_init(struct moet_model *m)
{
	const moet_config *c = &m->cfg;
	const int64_t dim = c->qk_rope_head_dim;
	const int64_t n_freq = dim / 2;
	m->inv_freq = malloc((size_t)n_freq * sizeof(float));
	if (!m->inv_freq)
		return moet_err(MOET_ENOMEM, "rope tables");
	m->rope_attn_factor = 1.0f;
	m->softmax_scale = (float)pow((double)moet_config_qk_head_dim(c), -0.5);
	for (int64_t i = 0; i < n_freq; i++) {
		/* torch: base ** (arange(0, dim, 2).float() / dim), in binary32 */
		float expo = (float)(2 * i) / (float)dim;
		float pos_freq = powf((float)c->rope_theta, expo);
		m->inv_freq[i] = 1.0f / pos_freq;
	}
	if (c->rope_type != MOET_ROPE_YARN)
		return 0;

	double factor = c->rope_factor;
	double orig = c->rope_original_max_pos > 0 ? (double)c->rope_original_max_pos
						   : (double)c->max_position_embeddings;
	double att;
	if (c->rope_has_attention_factor)
		att = c->rope_attention_factor;
	else if (c->rope_mscale != 0.0 && c->rope_mscale_all_dim != 0.0)
		att = yarn_mscale(factor, c->rope_mscale) / yarn_mscale(factor, c->rope_mscale_all_dim);
	else
		att = yarn_mscale(factor, 1.0);
	m->rope_attn_factor = (float)att;

	double low = correction_dim(c->rope_beta_fast, (double)dim, c->rope_theta, orig);
	double high = correction_dim(c->rope_beta_slow, (double)dim, c->rope_theta, orig);
	if (c->rope_truncate) {
		low = floor(low);
		high = ceil(high);
	}
	if (low < 0)
		low = 0;
	if (high > (double)(dim - 1))
		high = (double)(dim - 1);
	if (low == high)
		high += 0.001;
	for (int64_t i = 0; i < n_freq; i++) {
		float pos_freq = powf((float)c->rope_theta, (float)(2 * i) / (float)dim);
		float extra = 1.0f / pos_freq;
		float inter = 1.0f / ((float)factor * pos_freq);
		float ramp = (float)(((float)i - (float)low) / ((float)high - (float)low));
		ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
		float extra_factor = 1.0f - ramp;
		m->inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
	}
	if (c->rope_mscale_all_dim != 0.0) {
		double ms = yarn_mscale(factor, c->rope_mscale_all_dim);
		m->softmax_scale = (float)(pow((double)moet_config_qk_head_dim(c), -0.5) * ms * ms);
	}
	return 0;
}
