/*
 * dense_ref.c: the dense-path kernels of the CPU reference backend (RMSNorm, RoPE, one
 * head's attention over a paged cache: position p at row moet_kv_row(blocks, shift, p)).
 *
 * NOTE: outside the placement contract, these only need to be deterministic and
 * batch-invariant: each works on one row, sums run in index order in binary64 and are
 * rounded to binary32 once. The exponential is exp_c, the contract's, so that any backend
 * can repeat these bits if it wants to.
 */
#include "moet_cpu.h"

#include <math.h>

#include "moet_expc.h"
#include "moet_kvrow.h"

void moet_rmsnorm_ref(const float *x, const float *w, int64_t n, double eps, float *out)
{
	double ss = 0.0;
	for (int64_t i = 0; i < n; i++)
		ss += (double)x[i] * (double)x[i];
	float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
	for (int64_t i = 0; i < n; i++)
		out[i] = w[i] * (x[i] * inv);
}

void moet_rope_ref(float *x, int64_t n_freq, const float *cos_t, const float *sin_t,
		   int interleave)
{
	float a[256], b[256]; /* qk_rope_head_dim <= 512 (checked by the model loader) */
	for (int64_t i = 0; i < n_freq; i++) {
		a[i] = interleave ? x[2 * i] : x[i];
		b[i] = interleave ? x[2 * i + 1] : x[i + n_freq];
	}
	for (int64_t i = 0; i < n_freq; i++) {
		x[i] = a[i] * cos_t[i] - b[i] * sin_t[i];
		x[i + n_freq] = b[i] * cos_t[i] + a[i] * sin_t[i];
	}
}

void moet_rope_tables_ref(const float *inv_freq, int64_t n_freq, float attn_factor, int64_t pos,
			  float *cos_t, float *sin_t)
{
	for (int64_t i = 0; i < n_freq; i++) {
		float ang = (float)pos * inv_freq[i];
		cos_t[i] = (float)cos((double)ang) * attn_factor;
		sin_t[i] = (float)sin((double)ang) * attn_factor;
	}
}

/* The softmax-weighted sum of an attention: s[p] <- exp_c(s[p] - mx), sum in binary64 in
 * position order, out[d] = (sum_p s[p] * rows[row(p) * stride + d]) / sum for d < width,
 * row(p) = moet_kv_row(blocks, shift, p). */
static void softmax_sum(float *s, int64_t n_pos, float mx, const float *rows, int64_t stride,
			const int32_t *blocks, int shift, int64_t width, float *out)
{
	double sum = 0.0;
	for (int64_t p = 0; p < n_pos; p++) {
		s[p] = moet_exp_c(s[p] - mx);
		sum += s[p];
	}
	for (int64_t d = 0; d < width; d++) {
		double acc = 0.0;
		for (int64_t p = 0; p < n_pos; p++)
			acc += (double)s[p] *
			       (double)rows[moet_kv_row(blocks, shift, p) * stride + d];
		out[d] = (float)(acc / sum);
	}
}

void moet_attend_ref(const float *q, const float *k, int64_t k_stride, const float *v,
		     int64_t v_stride, const int32_t *blocks, int block_shift, int64_t n_pos,
		     int64_t d_qk, int64_t d_v, float scale, float *scratch, float *out)
{
	float mx = -INFINITY;
	for (int64_t p = 0; p < n_pos; p++) {
		const float *kp = k + moet_kv_row(blocks, block_shift, p) * k_stride;
		double dot = 0.0;
		for (int64_t d = 0; d < d_qk; d++)
			dot += (double)q[d] * (double)kp[d];
		float s = (float)dot * scale;
		scratch[p] = s;
		if (s > mx)
			mx = s;
	}
	softmax_sum(scratch, n_pos, mx, v, v_stride, blocks, block_shift, d_v, out);
}

/* W[r][k] of a weight matrix, decoded and scaled, in binary64 (exact: both factors are
 * binary32 and their product fits binary64). */
static double weight_at(const moet_mat *w, int64_t r, int64_t k)
{
	size_t i = (size_t)r * (size_t)w->cols + (size_t)k;
	double v;
	switch (w->dtype) {
	case MOET_DT_F8_E4M3: v = moet_dec_e4m3(((const uint8_t *)w->data)[i]); break;
	case MOET_DT_BF16: v = moet_dec_bf16(((const uint16_t *)w->data)[i]); break;
	default: v = ((const float *)w->data)[i]; break;
	}
	if (w->scale_inv) {
		const int64_t n_blk = (w->cols + MOET_BLOCK - 1) / MOET_BLOCK;
		v *= w->scale_inv[(r / MOET_BLOCK) * n_blk + k / MOET_BLOCK];
	}
	return v;
}

void moet_attend_latent_ref(const float *q_nope, const float *q_pe, const moet_mat *kv_b,
			    int64_t head, int64_t nope, int64_t v_dim, int64_t rope,
			    const float *cache, int64_t c_stride, const int32_t *blocks,
			    int block_shift, int64_t n_pos, float scale, float *scratch, float *out)
{
	const int64_t L = kv_b->cols, row0 = head * (nope + v_dim);
	float *q_abs = scratch, *o = scratch + L, *s = scratch + 2 * L;
	for (int64_t j = 0; j < L; j++) {
		double acc = 0.0;
		for (int64_t i = 0; i < nope; i++)
			acc += (double)q_nope[i] * weight_at(kv_b, row0 + i, j);
		q_abs[j] = (float)acc;
	}
	float mx = -INFINITY;
	for (int64_t p = 0; p < n_pos; p++) {
		const float *cp = cache + moet_kv_row(blocks, block_shift, p) * c_stride;
		double dot = 0.0;
		for (int64_t j = 0; j < L; j++)
			dot += (double)q_abs[j] * (double)cp[j];
		for (int64_t r = 0; r < rope; r++)
			dot += (double)q_pe[r] * (double)cp[L + r];
		s[p] = (float)dot * scale;
		if (s[p] > mx)
			mx = s[p];
	}
	softmax_sum(s, n_pos, mx, cache, c_stride, blocks, block_shift, L, o);
	for (int64_t d = 0; d < v_dim; d++)
		out[d] = moet_dot_ref(kv_b, row0 + nope + d, o);
}
