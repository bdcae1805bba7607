/*
 * moet_cpu.h: the CPU kernels. Contract kernels (docs/numerics.md) exist as a scalar `_ref`
 * that is the specification; optimized variants must return the same bits.
 */
#ifndef MOET_CPU_H
#define MOET_CPU_H

#include <stdint.h>

#include "moet_mat.h"

/*
 * The contract dot product D(W, r, v): row r of W (W->cols columns) with v[W->cols], in the
 * contract's order (16 lanes, 8 steps per 128-column block, one block-scale fma per lane per
 * block, a halving tree at the end). W->dtype must be F8_E4M3, BF16 or F32. Pure function;
 * thread-safe.
 */
float moet_dot_ref(const moet_mat *w, int64_t r, const float *v);

/* y[r] = D(W, r, v) for r = 0 .. W->rows-1. Thread-safe. */
void moet_matvec_ref(const moet_mat *w, const float *v, float *y);

/*
 * The contract expert FFN for n_tok tokens: for each token t,
 *   g = D(gate, ., x_t); u = D(up, ., x_t); h = silu_c(g) * u; y_t = D(down, ., h),
 * with NaN outputs canonicalized. x is [n_tok][gate->cols], y is [n_tok][down->rows];
 * scratch holds gate->rows floats (borrowed). Returns 0, or MOET_ESHAPE if the three
 * matrices do not chain (gate and up [I x H], down [H x I]).
 */
int moet_expert_ffn_ref(const moet_mat *gate, const moet_mat *up, const moet_mat *down,
			const float *x, int64_t n_tok, float *scratch, float *y);

/*
 * ---- Kernel variants ------------------------------------------------------------------------
 * One table per instruction set, all variants returning the bits of the scalar reference
 * (docs/numerics.md). moet_cpu_kernels_get() picks the best variant this CPU runs, once; the
 * environment variable MOET_KERNEL_EXPERT=ref|avx512 overrides the choice (a variant the CPU
 * cannot run falls back to ref). All functions are pure and thread-safe; callers split rows
 * over threads freely, since every (row, token) result has its own fixed order.
 */

/* y[t * y_stride + (r - r0)] = D(W, r, x + t * x_stride) for r0 <= r < r1, 0 <= t < n_tok. */
typedef void (*moet_rows_fn)(const moet_mat *w, int64_t r0, int64_t r1, const float *x,
			     int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride);

/* h[t * h_stride + (i - r0)] = silu_c(D(gate, i, x_t)) * D(up, i, x_t), for r0 <= i < r1. */
typedef void (*moet_gate_up_fn)(const moet_mat *gate, const moet_mat *up, int64_t r0,
				int64_t r1, const float *x, int64_t x_stride, int64_t n_tok,
				float *h, int64_t h_stride);

/* out[i] = f(in[i]) for i < n (exp_c or silu_c); out may alias in. */
typedef void (*moet_vec_fn)(const float *in, float *out, int64_t n);

typedef struct moet_cpu_kernels {
	const char *isa;         /* "ref", "avx512" */
	moet_rows_fn rows;
	moet_gate_up_fn gate_up;
	moet_vec_fn exp_c;
	moet_vec_fn silu_c;
} moet_cpu_kernels;

/* The variant in use (best supported, or per MOET_KERNEL_EXPERT). Never NULL. */
const moet_cpu_kernels *moet_cpu_kernels_get(void);

/* A variant by name ("ref", "avx512"); NULL if not built or not supported by this CPU. */
const moet_cpu_kernels *moet_cpu_kernels_named(const char *isa);

/* The scalar reference variant (the specification). */
extern const moet_cpu_kernels moet_cpu_kernels_ref;

/*
 * The contract expert FFN through kernel table k: h = gate_up(x) for all I rows, then
 * y = canon(rows(down, h)). x [n_tok][H], y [n_tok][H]; scratch holds n_tok x I floats.
 * Returns 0 or MOET_ESHAPE (matrices do not chain). Single-threaded; the CPU executor splits
 * the same two steps over its threads.
 */
int moet_expert_ffn(const moet_cpu_kernels *k, const moet_mat *gate, const moet_mat *up,
		    const moet_mat *down, const float *x, int64_t n_tok, float *scratch, float *y);

/*
 * Dense-path kernels of the CPU reference backend. These are outside the placement contract:
 * each is deterministic and works row by row (batch-invariant), with float sums accumulated
 * in binary64 in index order and rounded once.
 */

/* out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)), the mean accumulated in binary64.
 * out may alias x. */
void moet_rmsnorm_ref(const float *x, const float *w, int64_t n, double eps, float *out);

/*
 * Rotary embedding of one head's rope part (d = 2 * n_freq values) at one position, in place.
 * cos_t/sin_t[n_freq] hold cos(pos * inv_freq[i]) * attention_factor and the same for sin.
 * interleave = 1 (the published checkpoints): pairs (x[2i], x[2i+1]) rotate together and the
 * result is stored de-interleaved: out[i] = a cos - b sin, out[i + n_freq] = b cos + a sin.
 * interleave = 0: pairs (x[i], x[i + n_freq]) (the rotate-half layout).
 */
void moet_rope_ref(float *x, int64_t n_freq, const float *cos_t, const float *sin_t,
		   int interleave);

/* cos_t[i] = cos(pos * inv_freq[i]) * attn_factor, sin_t likewise, for i < n_freq: the angle
 * in binary32 (as transformers computes it), cos/sin in binary64 rounded once. */
void moet_rope_tables_ref(const float *inv_freq, int64_t n_freq, float attn_factor, int64_t pos,
			  float *cos_t, float *sin_t);

/*
 * Causal attention of one query head over n_pos cached positions:
 *   s[p] = (q . k_p) * scale, w = softmax(s) (exp_c, max-subtracted), out = sum_p w[p] v_p.
 * Position p is row r = moet_kv_row(blocks, block_shift, p) of a paged cache
 * (common/moet_kvrow.h; blocks NULL: r = p): k_p at k + r * k_stride, v_p at v + r * v_stride;
 * q and k have d_qk values, v and out d_v. scratch holds n_pos floats.
 */
void moet_attend_ref(const float *q, const float *k, int64_t k_stride, const float *v,
		     int64_t v_stride, const int32_t *blocks, int block_shift, int64_t n_pos,
		     int64_t d_qk, int64_t d_v, float scale, float *scratch, float *out);

/* The same bits with AVX-512 (cpu/attend_avx512.c; built where the compiler has it). */
void moet_attend_avx512(const float *q, const float *k, int64_t k_stride, const float *v,
			int64_t v_stride, const int32_t *blocks, int block_shift, int64_t n_pos,
			int64_t d_qk, int64_t d_v, float scale, float *scratch, float *out);

typedef void (*moet_attend_fn)(const float *q, const float *k, int64_t k_stride, const float *v,
			       int64_t v_stride, const int32_t *blocks, int block_shift,
			       int64_t n_pos, int64_t d_qk, int64_t d_v, float scale,
			       float *scratch, float *out);

/*
 * The attention kernel of the CPU backend, by MOET_CPU_ATTN: avx512 (unset: where built and
 * the CPU has it, else ref) or ref (moet_attend_ref, the specification); same bits. avx512 where
 * it cannot run, or another value: MOET_EINVAL naming it.
 */
int moet_cpu_attend_choose(moet_attend_fn *out);

/*
 * MLA attention of one head in the absorbed (latent-cache) form, for one query row:
 *   q_abs[j] = sum_i q_nope[i] * W_UK[i][j]          (W_UK = kv_b's k_nope rows of head h)
 *   s[p]     = (q_abs . c_p + q_pe . kpe_p) * scale   (the cache holds [c_p | kpe_p] per
 *                                                      position: kv_lora + rope floats)
 *   w = softmax(s) (exp_c, max-subtracted);  o[j] = sum_p w[p] c_p[j]
 *   out[d]   = D(kv_b, row of v_d of head h, o)       (the contract dot)
 * Sums other than the last run in binary64 in index order, rounded once. kv_b is the
 * [heads*(nope+v) x kv_lora] matrix (FP8 with block scales, BF16 or F32); position p is the
 * cache row moet_kv_row(blocks, block_shift, p) (blocks NULL: row p), rows c_stride floats
 * apart. scratch holds kv_lora * 2 + n_pos floats.
 */
void moet_attend_latent_ref(const float *q_nope, const float *q_pe, const moet_mat *kv_b,
			    int64_t head, int64_t nope, int64_t v_dim, int64_t rope,
			    const float *cache, int64_t c_stride, const int32_t *blocks,
			    int block_shift, int64_t n_pos, float scale, float *scratch,
			    float *out);

/*
 * Expert selection of the noaux_tc router (DeepSeek-V3), for one token.
 *   biased[e] = score[e] + bias[e]   (score = sigmoid of the router logit)
 *   n_group > 1: group score = sum of the two largest biased scores of the group (the one
 *                score if a group has one expert); the topk_group best groups stay eligible
 *   the top_k eligible experts by biased score, in canonical order: descending biased score,
 *   ties by lower expert id (groups likewise by lower group id).
 *   weight[i] = score[e_i] (/ (sum of the k scores, in canonical order, + 1e-20) when
 *   norm_topk_prob) * routed_scaling_factor, in binary32.
 * out_ids[top_k], out_w[top_k]; scratch holds n_exp + n_group floats. Pure; thread-safe.
 */
void moet_router_select_ref(const float *score, const float *bias, int64_t n_exp,
			    int64_t n_group, int64_t topk_group, int64_t top_k, int norm_topk_prob,
			    float routed_scaling_factor, float *scratch, int32_t *out_ids,
			    float *out_w);

#endif
