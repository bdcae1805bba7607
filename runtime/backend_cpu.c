/*
 * backend_cpu.c: the CPU reference backend: host memory, the reference dense-path kernels of
 * cpu/ and the contract kernels through the variant table (moet_cpu_kernels_get(): AVX-512
 * where the CPU has it, bit-identical to the scalar reference; MOET_KERNEL_EXPERT=ref forces
 * the reference).
 *
 * NOTE: weights are not copied: bind_mat returns the checkpoint's own view (the mmap'd
 * bytes). Ops run synchronously on the calling thread, row after row, so batch invariance is
 * immediate. Scratch that an op needs (attention scores, router work, expert h rows) is one
 * grow-only buffer of the backend: a backend serves one forward pass at a time.
 */
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_cpu.h"
#include "moet_err.h"
#include "moet_expc.h"

typedef struct cpu_be {
	moet_backend be;
	const moet_cpu_kernels *kern;
	float *scratch;
	size_t scratch_elems;
} cpu_be;

static cpu_be *impl(moet_backend *be)
{
	return (cpu_be *)be->impl;
}

static float *scratch(moet_backend *be, size_t elems)
{
	cpu_be *c = impl(be);
	if (elems > c->scratch_elems) {
		float *p = realloc(c->scratch, elems * sizeof(float));
		if (!p)
			return NULL;
		c->scratch = p;
		c->scratch_elems = elems;
	}
	return c->scratch;
}

static void cpu_destroy(moet_backend *be)
{
	cpu_be *c = impl(be);
	free(c->scratch);
	free(c);
}

static int cpu_alloc(moet_backend *be, size_t bytes, void **out)
{
	(void)be;
	void *p = NULL;
	if (posix_memalign(&p, 64, bytes ? bytes : 64))
		return moet_err(MOET_ENOMEM, "host buffer of %zu bytes", bytes);
	*out = p;
	return 0;
}

static void cpu_free(moet_backend *be, void *p)
{
	(void)be;
	free(p);
}

static int cpu_copy(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	(void)be;
	if (bytes && dst != src)
		memmove(dst, src, bytes);
	return 0;
}

static int cpu_bind_mat(moet_backend *be, const moet_mat *host, moet_mat *out)
{
	(void)be;
	*out = *host;
	return 0;
}

static int cpu_bind_vec(moet_backend *be, const float *host, int64_t n, const float **out)
{
	(void)be;
	(void)n;
	*out = host;
	return 0;
}

static int cpu_embed(moet_backend *be, const moet_mat *table, const int64_t *tokens, int64_t n,
		     float *x)
{
	(void)be;
	const int64_t H = table->cols;
	for (int64_t t = 0; t < n; t++) {
		const size_t off = (size_t)tokens[t] * (size_t)H;
		float *row = x + t * H;
		for (int64_t i = 0; i < H; i++) {
			switch (table->dtype) {
			case MOET_DT_BF16:
				row[i] = moet_dec_bf16(((const uint16_t *)table->data)[off + i]);
				break;
			case MOET_DT_F16:
				row[i] = moet_dec_f16(((const uint16_t *)table->data)[off + i]);
				break;
			default:
				row[i] = ((const float *)table->data)[off + i];
				break;
			}
		}
	}
	return 0;
}

static int cpu_rmsnorm(moet_backend *be, const float *x, int64_t x_stride, const float *w,
		       int64_t n, int64_t dim, double eps, float *out, int64_t out_stride)
{
	(void)be;
	for (int64_t t = 0; t < n; t++)
		moet_rmsnorm_ref(x + t * x_stride, w, dim, eps, out + t * out_stride);
	return 0;
}

static int cpu_linear(moet_backend *be, const moet_mat *w, const float *x, int64_t x_stride,
		      int64_t n, float *y, int64_t y_stride)
{
	impl(be)->kern->rows(w, 0, w->rows, x, x_stride, n, y, y_stride);
	return 0;
}

static int cpu_add(moet_backend *be, float *x, const float *y, int64_t n_elems)
{
	(void)be;
	for (int64_t i = 0; i < n_elems; i++)
		x[i] = x[i] + y[i];
	return 0;
}

static int cpu_rope(moet_backend *be, float *x, int64_t x_stride, int64_t head_stride,
		    int64_t n_heads, int64_t n, const moet_rowinfo *rows, const float *inv_freq,
		    int64_t n_freq, float attn_factor, int interleave)
{
	(void)be;
	float cos_t[256], sin_t[256]; /* n_freq <= 256: the model checks qk_rope_head_dim <= 512 */
	for (int64_t t = 0; t < n; t++) {
		moet_rope_tables_ref(inv_freq, n_freq, attn_factor, rows[t].pos, cos_t, sin_t);
		for (int64_t h = 0; h < n_heads; h++)
			moet_rope_ref(x + t * x_stride + h * head_stride, n_freq, cos_t, sin_t,
				      interleave);
	}
	return 0;
}

static int cpu_kv_store(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *kvb,
			int64_t kvb_stride, const float *k_pe, int64_t k_pe_stride, int64_t n,
			const moet_rowinfo *rows)
{
	(void)be;
	const int64_t qk = d->nope + d->rope, k_row = d->n_heads * qk, v_row = d->n_heads * d->v_dim;
	for (int64_t t = 0; t < n; t++) {
		float *krow = rows[t].k + l * rows[t].k_layer + rows[t].pos * k_row;
		float *vrow = rows[t].v + l * rows[t].v_layer + rows[t].pos * v_row;
		for (int64_t h = 0; h < d->n_heads; h++) {
			const float *src = kvb + t * kvb_stride + h * (d->nope + d->v_dim);
			memcpy(krow + h * qk, src, (size_t)d->nope * sizeof(float));
			memcpy(krow + h * qk + d->nope, k_pe + t * k_pe_stride,
			       (size_t)d->rope * sizeof(float));
			memcpy(vrow + h * d->v_dim, src + d->nope, (size_t)d->v_dim * sizeof(float));
		}
	}
	return 0;
}

static int cpu_attend(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *q,
		      int64_t q_stride, int64_t n, const moet_rowinfo *rows, float *out,
		      int64_t out_stride)
{
	const int64_t qk = d->nope + d->rope, k_row = d->n_heads * qk, v_row = d->n_heads * d->v_dim;
	int64_t max_pos = 0;
	for (int64_t t = 0; t < n; t++)
		max_pos = rows[t].pos + 1 > max_pos ? rows[t].pos + 1 : max_pos;
	float *s = scratch(be, (size_t)max_pos);
	if (!s)
		return moet_err(MOET_ENOMEM, "attention scores for %lld positions", (long long)max_pos);
	for (int64_t t = 0; t < n; t++) {
		const float *kb = rows[t].k + l * rows[t].k_layer;
		const float *vb = rows[t].v + l * rows[t].v_layer;
		for (int64_t h = 0; h < d->n_heads; h++)
			moet_attend_ref(q + t * q_stride + h * qk, kb + h * qk, k_row, vb + h * d->v_dim,
					v_row, rows[t].pos + 1, qk, d->v_dim, d->softmax_scale, s,
					out + t * out_stride + h * d->v_dim);
	}
	return 0;
}

static int cpu_route(moet_backend *be, const moet_config *c, const float *logits,
		     const float *bias, int64_t n, int32_t *ids, float *weights)
{
	const int64_t E = c->n_routed_experts, k = c->num_experts_per_tok;
	float *s = scratch(be, (size_t)(2 * E + c->n_group + 1));
	if (!s)
		return moet_err(MOET_ENOMEM, "router scratch");
	for (int64_t t = 0; t < n; t++) {
		for (int64_t e = 0; e < E; e++)
			s[e] = 1.0f / (1.0f + moet_exp_c(-logits[t * E + e]));
		moet_router_select_ref(s, bias, E, c->n_group, c->topk_group, k, c->norm_topk_prob,
				       (float)c->routed_scaling_factor, s + E, ids + t * k,
				       weights + t * k);
	}
	return 0;
}

static int cpu_experts(moet_backend *be, const moet_ffn_w *experts, const int32_t *ids,
		       int64_t top_k, const float *h, int64_t n, float *y)
{
	const int64_t H = experts[0].gate.cols, I = experts[0].gate.rows;
	float *s = scratch(be, (size_t)I);
	int rc;
	if (!s)
		return moet_err(MOET_ENOMEM, "expert scratch");
	for (int64_t t = 0; t < n; t++)
		for (int64_t i = 0; i < top_k; i++) {
			const moet_ffn_w *e = &experts[ids[t * top_k + i]];
			if ((rc = moet_expert_ffn(impl(be)->kern, &e->gate, &e->up, &e->down,
						  h + t * H, 1, s, y + (t * top_k + i) * H)))
				return rc;
		}
	return 0;
}

static int cpu_ffn(moet_backend *be, const moet_ffn_w *w, const float *h, int64_t n, float *out)
{
	float *s = scratch(be, (size_t)(n * w->gate.rows));
	if (!s)
		return moet_err(MOET_ENOMEM, "ffn scratch");
	return moet_expert_ffn(impl(be)->kern, &w->gate, &w->up, &w->down, h, n, s, out);
}

static int cpu_combine(moet_backend *be, const float *y, const float *weights, int64_t top_k,
		       const float *shared, int64_t n, int64_t dim, float *out)
{
	(void)be;
	for (int64_t t = 0; t < n; t++)
		for (int64_t j = 0; j < dim; j++) {
			float r = 0.0f;
			for (int64_t i = 0; i < top_k; i++)
				r = MOET_FMA(weights[t * top_k + i], y[(t * top_k + i) * dim + j], r);
			if (shared)
				r = r + shared[t * dim + j];
			out[t * dim + j] = moet_canon_nan(r);
		}
	return 0;
}

static const moet_backend_ops cpu_ops = {
	.name = "cpu",
	.destroy = cpu_destroy,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_copy,
	.download = cpu_copy,
	.bind_mat = cpu_bind_mat,
	.bind_vec = cpu_bind_vec,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.linear = cpu_linear,
	.add = cpu_add,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.attend = cpu_attend,
	.route = cpu_route,
	.experts = cpu_experts,
	.ffn = cpu_ffn,
	.combine = cpu_combine,
};

int moet_backend_cpu_create(moet_backend **out)
{
	cpu_be *c = calloc(1, sizeof(*c));
	if (!c)
		return moet_err(MOET_ENOMEM, "CPU backend");
	c->kern = moet_cpu_kernels_get();
	c->be = (moet_backend){ .ops = &cpu_ops, .impl = c };
	*out = &c->be;
	return 0;
}
