/*
 * expert_ref.c: the scalar reference of the contract dot product and expert FFN. This file
 * is the specification every other implementation is compared with, bit for bit.
 *
 * Order of operations for one row r (K = W->cols), from docs/numerics.md:
 *
 *   acc[0..15] = +0
 *   for each 128-column block b:            p[0..15] = +0
 *       for t = 0..7, lane l = 0..15:       k = 128b + 16t + l
 *                                           if k < K: p[l] = fma(dec(W[r][k]), v[k], p[l])
 *       for every lane l:                   acc[l] = fma(p[l], S[r/128][b], acc[l])
 *   q[l] = acc[l] + acc[l+8]; s[l] = q[l] + q[l+4]; u[l] = s[l] + s[l+2]; D = u[0] + u[1]
 *
 * NOTE: lanes that receive no term in a partial block still take their fma with the scale
 * (p = +0 gives fma(+0, S, acc) = acc unless acc is -0: the contract performs it anyway).
 */
#include "moet_cpu.h"


#define LANES 16
#define STEPS (MOET_BLOCK / LANES)

static inline float dec_elem(const moet_mat *w, int64_t r, int64_t k)
{
	size_t i = (size_t)r * (size_t)w->cols + (size_t)k;
	switch (w->dtype) {
	case MOET_DT_F8_E4M3:
		return moet_dec_e4m3(((const uint8_t *)w->data)[i]);
	case MOET_DT_BF16:
		return moet_dec_bf16(((const uint16_t *)w->data)[i]);
	default:
		return ((const float *)w->data)[i];
	}
}

float moet_dot_ref(const moet_mat *w, int64_t r, const float *v)
{
	const int64_t K = w->cols;
	const int64_t n_blk = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const float *srow = w->scale_inv ? w->scale_inv + (r / MOET_BLOCK) * n_blk : NULL;
	float acc[LANES];
	for (int l = 0; l < LANES; l++)
		acc[l] = 0.0f;
	for (int64_t b = 0; b < n_blk; b++) {
		float p[LANES];
		for (int l = 0; l < LANES; l++)
			p[l] = 0.0f;
		for (int t = 0; t < STEPS; t++) {
			for (int l = 0; l < LANES; l++) {
				int64_t k = b * MOET_BLOCK + t * LANES + l;
				if (k < K)
					p[l] = MOET_FMA(dec_elem(w, r, k), v[k], p[l]);
			}
		}
		float s = srow ? srow[b] : 1.0f;
		for (int l = 0; l < LANES; l++)
			acc[l] = MOET_FMA(p[l], s, acc[l]);
	}
	float q[8], s4[4], u2[2];
	for (int l = 0; l < 8; l++)
		q[l] = acc[l] + acc[l + 8];
	for (int l = 0; l < 4; l++)
		s4[l] = q[l] + q[l + 4];
	for (int l = 0; l < 2; l++)
		u2[l] = s4[l] + s4[l + 2];
	return u2[0] + u2[1];
}

void moet_matvec_ref(const moet_mat *w, const float *v, float *y)
{
	for (int64_t r = 0; r < w->rows; r++)
		y[r] = moet_dot_ref(w, r, v);
}

int moet_expert_ffn_ref(const moet_mat *gate, const moet_mat *up, const moet_mat *down,
			const float *x, int64_t n_tok, float *scratch, float *y)
{
	/* NOTE: one token at a time so that scratch needs only gate->rows floats. */
	for (int64_t t = 0; t < n_tok; t++) {
		int rc = moet_expert_ffn(&moet_cpu_kernels_ref, gate, up, down, x + t * gate->cols, 1,
					 scratch, y + t * down->rows);
		if (rc)
			return rc;
	}
	return 0;
}
