/*
 * forward.c: the model graph, once for every backend (moet_backend.h).
 *
 *   x = embed(tokens)                                          [n rows x H]
 *   per layer:  x += o_proj(MLA(rmsnorm(x)))                   (K, V of the new positions
 *               x += ffn(rmsnorm(x))                            stored before any row attends)
 *   logits = lm_head(rmsnorm(x))                               (rows that want logits)
 *
 * MLA: q = q_b(rmsnorm(q_a(h))) (or q_proj(h)), RoPE on each head's rope part; [c | k_pe] =
 * kv_a(h), RoPE on k_pe (shared by all heads), kvb = kv_b(rmsnorm(c)) = per head [k_nope | v];
 * K = [k_nope | k_pe] and V into the row's cache at its position; attention over positions
 * 0..pos; o_proj. MoE: router logits (linear), selection and weights (route), each selected
 * expert's FFN per (row, slot) pair on the tier that owns it (dispatch.c), shared experts
 * (ffn), the canonical combine.
 *
 * A batch holds several sequences (moet_seq_step), each with its own cache and positions:
 * every op is row-wise and batch-invariant, so a sequence's logits do not depend on how its
 * tokens are split into calls or which sequences share the batch (tested bit for bit).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_int.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_sample.h"
#include "moet_trace.h"

static int64_t imax(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

static void free_bufs(moet_model *m, moet_fwd_bufs *b)
{
	void *p[] = { b->x, b->h, b->q, b->qa, b->kva, b->kvb, b->attn, b->out, b->rlogits,
		      b->rw, b->y, b->shared, b->logits, b->ids, b->slot };
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		if (p[i])
			m->be->ops->free(m->be, p[i]);
	memset(b, 0, sizeof(*b));
}

void moet_model_free_bufs(moet_model *m)
{
	for (int i = 0; i < 2; i++) {
		free_bufs(m, &m->bufs[i]);
		free(m->host[i].rows);
		free(m->host[i].tok);
		free(m->host[i].draw);
		memset(&m->host[i], 0, sizeof(m->host[i]));
	}
}

/* Micro-batch i's host tables for n rows and n_draw draws, grown (never shrunk) as the
 * buffers are: once a batch size has run, a step allocates nothing. */
static int ensure_host(moet_model *m, int i, int64_t n, int n_draw)
{
	if (n > m->host[i].cap_rows) {
		moet_rowinfo *r = realloc(m->host[i].rows, (size_t)n * sizeof(*r));
		if (r)
			m->host[i].rows = r;
		int64_t *t = r ? realloc(m->host[i].tok, (size_t)n * sizeof(*t)) : NULL;
		if (!t)
			return moet_err(MOET_ENOMEM, "row table of %lld rows", (long long)n);
		m->host[i].tok = t;
		m->host[i].cap_rows = n;
	}
	if (n_draw > m->host[i].cap_draw) {
		moet_draw *d = realloc(m->host[i].draw, (size_t)n_draw * sizeof(*d));
		if (!d)
			return moet_err(MOET_ENOMEM, "draws of %d entries", n_draw);
		m->host[i].draw = d;
		m->host[i].cap_draw = n_draw;
	}
	return 0;
}

/* Grows a buffer set to n rows (never shrinks: the next batch likely is as large). */
static int ensure_bufs(moet_model *m, moet_fwd_bufs *b, int64_t n)
{
	const moet_config *c = &m->cfg;
	const int64_t H = c->hidden_size, nh = c->num_attention_heads;
	const int64_t qk = moet_config_qk_head_dim(c), k = imax(c->num_experts_per_tok, 1);
	const int64_t E = imax(c->n_routed_experts, 1);
	if (n <= b->cap_rows)
		return 0;
	free_bufs(m, b);
	const struct { void **p; int64_t elems; size_t size; } want[] = {
		{ (void **)&b->x, n * H, 4 },
		{ (void **)&b->h, n * H, 4 },
		{ (void **)&b->q, n * nh * qk, 4 },
		{ (void **)&b->qa, n * imax(c->q_lora_rank, 1), 4 },
		{ (void **)&b->kva, n * (c->kv_lora_rank + c->qk_rope_head_dim), 4 },
		{ (void **)&b->kvb, n * nh * (c->qk_nope_head_dim + c->v_head_dim), 4 },
		{ (void **)&b->attn, n * nh * c->v_head_dim, 4 },
		{ (void **)&b->out, n * H, 4 },
		{ (void **)&b->rlogits, n * E, 4 },
		{ (void **)&b->rw, n * k, 4 },
		{ (void **)&b->y, n * k * H, 4 },
		{ (void **)&b->shared, n * H, 4 },
		{ (void **)&b->logits, n * c->vocab_size, 4 },
		{ (void **)&b->ids, n * k, 4 },
		{ (void **)&b->slot, n * k, 4 },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		int rc = m->be->ops->alloc(m->be, (size_t)want[i].elems * want[i].size, want[i].p);
		if (rc) {
			free_bufs(m, b);
			return moet_err_prefix(rc, "forward buffers for %lld rows", (long long)n);
		}
	}
	b->cap_rows = n;
	return moet_tp_reserve(m->tp, n);
}

/* Validates a batch and counts its rows. */
static int check_batch(const moet_model *m, const moet_seq_step *steps, int n_steps,
		       int64_t *out_rows)
{
	const int64_t V = m->cfg.vocab_size;
	int64_t rows = 0;
	for (int s = 0; s < n_steps; s++) {
		const moet_seq_step *st = &steps[s];
		if (!st->kv || st->n_tok < 0 || (st->n_tok > 0 && !st->tokens))
			return moet_err(MOET_EINVAL, "batch entry %d: no cache, or no tokens", s);
		for (int r = 0; r < s; r++)
			if (steps[r].kv == st->kv && st->n_tok > 0)
				return moet_err(MOET_EINVAL, "batch entries %d and %d share a KV cache",
						r, s);
		for (int64_t t = 0; t < st->n_tok; t++)
			if (st->tokens[t] < 0 || st->tokens[t] >= V)
				return moet_err(MOET_ERANGE, "token %lld at index %lld is outside the "
						"vocabulary [0, %lld)", (long long)st->tokens[t],
						(long long)t, (long long)V);
		int rc = moet_kv_check(m, st->kv, s);
		if (rc)
			return rc;
		if (st->kv->len + st->n_tok > st->kv->max_tokens)
			return moet_err(MOET_ERANGE, "KV cache full: %lld + %lld tokens > %lld",
					(long long)st->kv->len, (long long)st->n_tok,
					(long long)st->kv->max_tokens);
		rows += st->n_tok;
	}
	*out_rows = rows;
	return 0;
}

/* Layer l's split matrix `which` (MOET_TP) or w on the backend: y = W x (the contract dot). */
static int linear_tp(moet_model *m, int64_t l, int which, const moet_mat *w, const float *x,
		     int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
	if (m->tp)
		return moet_tp_linear(m->tp, moet_tp_layer_mat(m->tp, l, which), x, x_stride, n, y,
				      y_stride);
	return m->be->ops->linear(m->be, w, x, x_stride, n, y, y_stride);
}

/* Layer l's dense MLP or shared experts: split over the MOET_TP ranks, or the backend's ffn. */
static int ffn_tp(moet_model *m, int64_t l, const moet_ffn_w *w, const float *x, int64_t n,
		  float *out)
{
	if (moet_tp_splits_ffn(m->tp))
		return moet_tp_ffn(m->tp, moet_tp_layer_mat(m->tp, l, MOET_TP_GATE),
				   moet_tp_layer_mat(m->tp, l, MOET_TP_UP),
				   moet_tp_layer_mat(m->tp, l, MOET_TP_DOWN), x, n, out);
	return m->be->ops->ffn(m->be, w, x, n, out);
}

#define TRY(call)                                                                          \
	do {                                                                               \
		if ((rc = (call)))                                                         \
			return rc;                                                         \
	} while (0)

static int attention(moet_model *m, int64_t l, int64_t n, const moet_rows *rows)
{
	const moet_config *c = &m->cfg;
	const moet_layer_w *lw = &m->layers[l];
	const moet_backend_ops *op = m->be->ops;
	moet_backend *be = m->be;
	moet_fwd_bufs *b = m->cur;
	const int64_t H = c->hidden_size, nh = c->num_attention_heads;
	const int64_t nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
	const int64_t qk = nope + rope, kva_w = c->kv_lora_rank + rope;
	const int64_t kvb_w = nh * (nope + c->v_head_dim), attn_w = nh * c->v_head_dim;
	const moet_attn_dims d = { nh, nope, rope, c->v_head_dim, c->rope_interleave,
				   m->softmax_scale };
	const float *qx = b->h; /* q's input: qa, or h without q_lora */
	int64_t qx_stride = H, h0, heads;
	int rc;
	if (c->q_lora_rank > 0) {
		TRY(op->linear(be, &lw->q_a, b->h, H, n, b->qa, c->q_lora_rank));
		TRY(op->rmsnorm(be, b->qa, c->q_lora_rank, lw->q_a_norm, n, c->q_lora_rank,
				c->rms_norm_eps, b->qa, c->q_lora_rank));
		qx = b->qa;
		qx_stride = c->q_lora_rank;
	}
	TRY(op->linear(be, &lw->kv_a, b->h, H, n, b->kva, kva_w));
	TRY(op->rope(be, b->kva + c->kv_lora_rank, kva_w, 0, 1, n, rows, m->inv_freq_b, rope / 2,
		     m->rope_attn_factor, c->rope_interleave));
	TRY(op->rmsnorm(be, b->kva, kva_w, lw->kv_a_norm, n, c->kv_lora_rank, c->rms_norm_eps,
			b->kva, kva_w));
	if (moet_tp_local(m->tp)) { /* MOET_TP: each rank its heads' q, kvb, cache, attention */
		const moet_tp_rope rp = { m->inv_freq_b, rope / 2, m->rope_attn_factor,
					  c->rope_interleave };
		TRY(moet_tp_attention(m->tp, m->mb_slot, &d, l, qx, qx_stride, b->kva, kva_w, n,
				      rows, &rp, b->q, b->kvb, b->attn));
		return linear_tp(m, l, MOET_TP_O, &lw->o, b->attn, attn_w, n, b->out, H);
	}
	TRY(linear_tp(m, l, MOET_TP_Q, c->q_lora_rank > 0 ? &lw->q_b : &lw->q_proj, qx, qx_stride,
		      n, b->q, nh * qk));
	TRY(op->rope(be, b->q + nope, nh * qk, qk, nh, n, rows, m->inv_freq_b, rope / 2,
		     m->rope_attn_factor, c->rope_interleave));
	if (m->mla_absorbed && moet_tp_heads(m->tp, 0, &h0, &heads)) { /* each rank its heads */
		TRY(moet_tp_attend(m->tp, m->mb_slot, &d, l, b->q, NULL, b->kva + c->kv_lora_rank,
				   kva_w, n, rows, b->attn));
	} else if (m->mla_absorbed) {
		/* the cache holds the latent [c | k_pe]; kv_b enters inside the attention */
		TRY(op->kv_store_latent(be, l, b->kva, kva_w, kva_w, n, rows));
		TRY(op->attend_latent(be, &d, &lw->kv_b, l, b->q, nh * qk, n, rows, b->attn,
				      attn_w));
	} else {
		TRY(linear_tp(m, l, MOET_TP_KVB, &lw->kv_b, b->kva, kva_w, n, b->kvb, kvb_w));
		/* NOTE: every row's K/V enters its cache before any row attends; a row then sees
		 * positions 0 .. its own only, exactly as if each token came in a call of its
		 * own. */
		if (moet_tp_heads(m->tp, 0, &h0, &heads)) { /* each rank its heads (MOET_TP) */
			TRY(moet_tp_attend(m->tp, m->mb_slot, &d, l, b->q, b->kvb,
					   b->kva + c->kv_lora_rank, kva_w, n, rows, b->attn));
		} else {
			TRY(op->kv_store(be, &d, l, b->kvb, kvb_w, b->kva + c->kv_lora_rank, kva_w, n,
					 rows));
			TRY(op->attend(be, &d, l, b->q, nh * qk, n, rows, b->attn, attn_w));
		}
	}
	return linear_tp(m, l, MOET_TP_O, &lw->o, b->attn, attn_w, n, b->out, H);
}

/* Routing decisions to the observer (host copies of the ids and weights). */
static int observe_routes(moet_model *m, int64_t l, int64_t n, const moet_seq_step *steps,
			  int n_steps)
{
	const int64_t k = m->cfg.num_experts_per_tok;
	int32_t *ids = malloc((size_t)(n * k) * sizeof(*ids));
	float *wts = malloc((size_t)(n * k) * sizeof(*wts));
	int rc = (!ids || !wts) ? moet_err(MOET_ENOMEM, "route observer copies") : 0;
	if (!rc)
		rc = m->be->ops->download(m->be, ids, m->cur->ids, (size_t)(n * k) * sizeof(*ids));
	if (!rc)
		rc = m->be->ops->download(m->be, wts, m->cur->rw, (size_t)(n * k) * sizeof(*wts));
	for (int s = 0, t = 0; !rc && s < n_steps; s++)
		for (int64_t i = 0; i < steps[s].n_tok; i++, t++) {
			moet_route_event ev = { .layer = l, .seq = m->mb_seq_base + s,
						.pos = steps[s].kv->len + i,
						.is_prefill = steps[s].n_tok > 1, .top_k = (int)k,
						.ids = ids + t * k, .weights = wts + t * k };
			m->route_fn(m->route_ctx, &ev);
		}
	free(ids);
	free(wts);
	return rc;
}

/* The feed-forward of layer l up to the point where the expert tiers run, in two steps: for a
 * MoE layer ff_route runs the router and the selection (and queues the routing's copies:
 * moet_moe_dispatch_queue), ff_start the dispatch (the CPU tier and other GPUs left running)
 * and the shared experts; a dense layer's MLP is all in ff_start. ff_finish completes it. */
static int ff_route(moet_model *m, int64_t l, int64_t n, const moet_seq_step *steps,
		    int n_steps)
{
	const moet_config *c = &m->cfg;
	const moet_layer_w *lw = &m->layers[l];
	const moet_backend_ops *op = m->be->ops;
	moet_backend *be = m->be;
	moet_fwd_bufs *b = m->cur;
	int rc;
	if (!lw->is_moe)
		return 0;
	TRY(op->linear(be, &lw->router, b->h, c->hidden_size, n, b->rlogits, c->n_routed_experts));
	TRY(op->route(be, c, b->rlogits, lw->router_bias, n, b->ids, b->rw));
	/* the CPU tier's workers woken now, while the device routes (MOET_CPU_PREWAKE) */
	if (m->cpu_layer && m->cpu_layer[l])
		moet_hybrid_prewake(m->hy);
	if (m->route_fn)
		TRY(observe_routes(m, l, n, steps, n_steps));
	return moet_moe_dispatch_queue(m, l, b->ids, n, b->h);
}

static int ff_start(moet_model *m, int64_t l, int64_t n)
{
	const moet_layer_w *lw = &m->layers[l];
	moet_fwd_bufs *b = m->cur;
	int rc;
	if (!lw->is_moe)
		return ffn_tp(m, l, &lw->mlp, b->h, n, b->out);
	/* routing copies queued (MOET_MB_QUEUE): the shared experts go first, so that the
	 * device has their work while the driver waits for the copies (not split over MOET_TP
	 * ranks: their collectives keep the order of the reference) */
	const int early = lw->has_shared && m->q[m->mb_slot & 1].layer == l &&
			  !moet_tp_splits_ffn(m->tp);
	if (early)
		TRY(ffn_tp(m, l, &lw->mlp, b->h, n, b->shared));
	TRY(moet_moe_dispatch(m, l, b->ids, n, b->h, b->y, b->slot));
	/* the CPU tier may still run: the shared experts go on the backend meanwhile */
	rc = lw->has_shared && !early ? ffn_tp(m, l, &lw->mlp, b->h, n, b->shared) : 0;
	if (rc)
		moet_moe_dispatch_finish(m);
	return rc;
}

static int ff_finish(moet_model *m, int64_t l, int64_t n)
{
	const moet_config *c = &m->cfg;
	const moet_layer_w *lw = &m->layers[l];
	moet_fwd_bufs *b = m->cur;
	const int64_t H = c->hidden_size, k = c->num_experts_per_tok;
	int rc;
	if (!lw->is_moe)
		return 0;
	TRY(moet_moe_dispatch_finish(m));
	/* two micro-batches with their expert calls merged: the layer's shared y (dispatch.c);
	 * on two streams the first half's combine waits for the second's stream (the call) */
	const float *ym = m->mg.ycur[m->mb_slot & 1];
	if (ym && m->mb_streams && !(m->mb_slot & 1))
		TRY(m->be->ops->stream_wait(m->be, 1));
	return m->be->ops->combine(m->be, ym ? ym : b->y, ym ? m->mg.cap_pairs : n * k, b->slot,
				   b->rw, k,
				   lw->has_shared ? b->shared : NULL, n, H, b->out);
}

/* Final norm and lm_head for the rows that want logits (logits_deliver downloads them into
 * each step and draws the sampled ones). */
static int logits_compute(moet_model *m, const moet_seq_step *steps, int n_steps)
{
	const moet_config *c = &m->cfg;
	const moet_backend_ops *op = m->be->ops;
	moet_backend *be = m->be;
	moet_fwd_bufs *b = m->cur;
	const int64_t H = c->hidden_size, V = c->vocab_size;
	int64_t n_sel = 0, run_from = -1, run_len = 0;
	int rc;
	/* the final norm of the wanted rows of x into h, in batch order: one call per run of
	 * consecutive wanted rows (a decode batch is one run) */
	for (int s = 0, t = 0; s <= n_steps; s++)
		for (int64_t i = 0; i < (s < n_steps ? steps[s].n_tok : 1); i++, t++) {
			const moet_seq_step *st = &steps[s < n_steps ? s : 0];
			const int last = i == st->n_tok - 1;
			/* out_token: the last row is sampled (issue 4) */
			int want = s < n_steps && ((st->out_logits && (!st->last_only || last)) ||
						   (st->out_token && last));
			if (want && run_len && run_from + run_len == t) {
				run_len++;
				continue;
			}
			if (run_len) {
				TRY(op->rmsnorm(be, b->x + run_from * H, H, m->final_norm, run_len, H,
						c->rms_norm_eps, b->h + n_sel * H, H));
				n_sel += run_len;
			}
			run_from = t;
			run_len = want;
		}
	if (n_sel && m->tp)
		return moet_tp_linear(m->tp, moet_tp_lm_head(m->tp), b->h, H, n_sel, b->logits, V);
	return n_sel ? op->linear(be, &m->lm_head, b->h, H, n_sel, b->logits, V) : 0;
}

static int logits_deliver(moet_model *m, const moet_seq_step *steps, int n_steps)
{
	const int64_t V = m->cfg.vocab_size;
	moet_backend *be = m->be;
	moet_fwd_bufs *b = m->cur;
	int64_t sel = 0, n_draw = 0;
	int rc;
	const int hi = (int)(m->cur - m->bufs); /* this micro-batch's host tables */
	TRY(ensure_host(m, hi, 0, n_steps));
	moet_draw *draw = m->host[hi].draw; /* issue 4: sampled rows */
	for (int s = 0; s < n_steps && !rc; s++) {
		const moet_seq_step *st = &steps[s];
		if (!st->out_logits && !st->out_token)
			continue;
		int64_t rows = st->last_only || !st->out_logits ? (st->n_tok > 0) : st->n_tok;
		if (st->out_logits)
			rc = be->ops->download(be, st->out_logits, b->logits + sel * V,
					  (size_t)(rows * V) * sizeof(float));
		sel += rows;
		if (!rc && st->out_token && rows > 0) /* the next token from the last row */
			draw[n_draw++] = (moet_draw){ st->sample, sel - 1, st->kv->len + st->n_tok,
						      st->out_token };
		if (!rc && st->out_token && !st->sample)
			rc = moet_err(MOET_EINVAL, "batch entry %d: out_token without sample", s);
	}
	if (!rc)
		rc = moet_backend_draw(be, b->logits, V, draw, n_draw);
	return rc;
}

/* One micro-batch of a pass: its entries, rows, row table, buffers and dispatch slot. */
typedef struct mb_pass {
	const moet_seq_step *steps;
	int n_steps, seq_base, slot;
	int64_t n;
	const moet_rows *rows;
	moet_fwd_bufs *b;
} mb_pass;

static int use(moet_model *m, const mb_pass *p)
{
	m->cur = p->b;
	m->mb_slot = p->slot;
	m->mb_seq_base = p->seq_base;
	/* two streams (MOET_MB_STREAMS): the micro-batch's work on its own */
	return m->mb_streams ? m->be->ops->stream_select(m->be, p->slot) : 0;
}

/* Row table of a micro-batch (host work and its upload: never in a captured graph). */
static int mb_rows(moet_model *m, mb_pass *p)
{
	const moet_config *c = &m->cfg;
	const int hi = (int)(p->b - m->bufs);
	int rc = ensure_host(m, hi, p->n, 0);
	moet_rowinfo *rows = m->host[hi].rows;
	int64_t *tok = m->host[hi].tok;
	for (int s = 0, t = 0; !rc && s < p->n_steps; s++) {
		const moet_kv *kv = p->steps[s].kv;
		for (int64_t i = 0; i < p->steps[s].n_tok; i++, t++) {
			moet_kv_rowinfo(kv, kv->len + i, &rows[t]);
			tok[t] = p->steps[s].tokens[i];
		}
	}
	if (!rc)
		rc = ensure_bufs(m, p->b, p->n);
	if (!rc)
		rc = m->be->ops->prepare_rows(m->be, p->slot, rows, tok, p->n, c->num_hidden_layers,
					      &p->rows);
	if (!rc) /* MOET_TP with the attention split: the ranks' tables of their heads' caches */
		rc = moet_tp_rows(m->tp, p->slot, p->steps, p->n_steps, tok, p->n,
				  c->num_hidden_layers);
	return rc;
}

int moet_fwd_attn_block(moet_model *m, int64_t l, int64_t n, const moet_rows *rows)
{
	const moet_config *c = &m->cfg;
	const moet_layer_w *lw = &m->layers[l];
	const moet_backend_ops *op = m->be->ops;
	const int64_t H = c->hidden_size;
	moet_fwd_bufs *b = m->cur;
	int rc;
	TRY(op->rmsnorm(m->be, b->x, H, lw->in_norm, n, H, c->rms_norm_eps, b->h, H));
	TRY(attention(m, l, n, rows));
	TRY(op->add(m->be, b->x, b->out, n * H));
	return op->rmsnorm(m->be, b->x, H, lw->post_norm, n, H, c->rms_norm_eps, b->h, H);
}

int moet_fwd_ensure_bufs(moet_model *m, moet_fwd_bufs *b, int64_t n)
{
	return ensure_bufs(m, b, n);
}

int moet_fwd_ensure_host(moet_model *m, int i, int64_t n)
{
	return ensure_host(m, i, n, 0);
}

/* Layer l of a micro-batch up to its routing (stage 1a; attn 0: its attention block ran
 * early, moet_early_end) ... */
static int mb_stage1a(moet_model *m, const mb_pass *p, int64_t l, int attn)
{
	int rc;
	TRY(use(m, p));
	if (attn)
		TRY(moet_fwd_attn_block(m, l, p->n, p->rows));
	return ff_route(m, l, p->n, p->steps, p->n_steps);
}

/* ... to the running expert tiers (1b) ... */
static int mb_stage1b(moet_model *m, const mb_pass *p, int64_t l)
{
	int rc = use(m, p);
	return rc ? rc : ff_start(m, l, p->n);
}

static int mb_stage1(moet_model *m, const mb_pass *p, int64_t l)
{
	int rc = mb_stage1a(m, p, l, 1);
	return rc ? rc : mb_stage1b(m, p, l);
}

/* ... and from there to the layer's output (stage 2). */
static int mb_stage2(moet_model *m, const mb_pass *p, int64_t l)
{
	int rc;
	TRY(use(m, p));
	TRY(ff_finish(m, l, p->n));
	TRY(m->be->ops->add(m->be, p->b->x, p->b->out, p->n * m->cfg.hidden_size));
	if (m->xtier) /* the next MoE layer's experts, predicted from x, read ahead */
		moet_xtier_prefetch(m->xtier, l, p->b->x, p->n);
	return 0;
}

/* MOET_MB_POLL=1: each half goes through its own steps (1a; 1b once its routing copies are
 * there; 2 once its CPU tier is done; then the next layer's 1a) and the driver takes whichever
 * half can go on without waiting, so that neither half's work waits in the queue behind the
 * other half's wait (the plain order queues the second half's next layer only after the first
 * half's routing copies are in). A half runs at most one layer ahead of the other. */
static int pass_polled(moet_model *m, mb_pass *p)
{
	const int64_t L = m->cfg.num_hidden_layers;
	int64_t lay[2] = { 0, 0 };
	int due[2] = { 1, 1 }; /* the step due at lay[i]: 1 (1b) or 2 */
	int rc = mb_stage1a(m, &p[0], 0, 1);
	rc = rc ? rc : mb_stage1a(m, &p[1], 0, 1);
	while (!rc && (lay[0] < L || lay[1] < L)) {
		int moved = 0;
		for (int i = 0; i < 2 && !rc; i++) {
			const int64_t l = lay[i];
			int ready = 1;
			if (l >= L || l > lay[!i] + 1)
				continue;
			if (due[i] == 1) {
				if ((rc = moet_moe_dispatch_ready(m, p[i].slot, l, &ready)) || !ready)
					continue;
				rc = mb_stage1b(m, &p[i], l);
				due[i] = 2;
			} else {
				if (!moet_hybrid_cpu_ready(m->hy, p[i].slot))
					continue;
				rc = mb_stage2(m, &p[i], l);
				lay[i]++;
				due[i] = 1;
				if (!rc && l + 1 < L)
					rc = mb_stage1a(m, &p[i], l + 1, 1);
			}
			moved = 1;
		}
		if (!moved) /* both wait: the device or the CPU tier works */
			sched_yield();
	}
	m->polled_passes += !rc;
	return rc;
}

/* The pass's work from the embedding to the lm_head, for one or two micro-batches (what a
 * CUDA graph captures: graph.c). */
static int pass_body(moet_model *m, mb_pass *p, int n_mb)
{
	const int64_t L = m->cfg.num_hidden_layers;
	int rc = 0;
	for (int i = 0; i < n_mb && !rc; i++)
		rc = m->be->ops->embed(m->be, &m->embed, p[i].rows, p[i].n, p[i].b->x);
	if (rc)
		return rc;
	if (n_mb == 1) {
		/* early rows (MOET_EARLY_ROWS): layer l + 1's attention block queued before layer
		 * l's finish, then only its routing and tiers */
		for (int64_t l = 0, early = 0; l < L && !rc; l++) {
			int did = 0;
			rc = mb_stage1a(m, &p[0], l, !early);
			rc = rc ? rc : mb_stage1b(m, &p[0], l);
			if (!rc && m->early_min && l + 1 < L)
				rc = moet_early_begin(m, p[0].b, p[0].n, p[0].rows, l, &did);
			rc = rc ? rc : mb_stage2(m, &p[0], l);
			if (!rc && did)
				rc = moet_early_end(m, p[0].b, p[0].n, l);
			early = did;
		}
	} else if (m->q_poll) {
		rc = pass_polled(m, p);
	} else if (m->q_reorder) {
		/* queued routing copies reordered (MOET_MB_REORDER=1): each half's dispatch waits
		 * for its own copies, so the other half's work is queued behind them before (see the
		 * NOTE at moet_model_forward_batch) */
		rc = mb_stage1a(m, &p[0], 0, 1);
		rc = rc ? rc : mb_stage1a(m, &p[1], 0, 1);
		for (int64_t l = 0; l < L && !rc; l++) {
			if ((rc = mb_stage1b(m, &p[0], l)) || (rc = mb_stage1b(m, &p[1], l)) ||
			    (rc = mb_stage2(m, &p[0], l)) ||
			    (l + 1 < L && (rc = mb_stage1a(m, &p[0], l + 1, 1))) ||
			    (rc = mb_stage2(m, &p[1], l)))
				break;
			if (l + 1 < L)
				rc = mb_stage1a(m, &p[1], l + 1, 1);
		}
	} else {
		rc = mb_stage1(m, &p[0], 0);
		for (int64_t l = 0; l < L && !rc; l++) {
			if ((rc = mb_stage1(m, &p[1], l)) || (rc = mb_stage2(m, &p[0], l)) ||
			    (l + 1 < L && (rc = mb_stage1(m, &p[0], l + 1))))
				break;
			rc = mb_stage2(m, &p[1], l);
		}
	}
	for (int i = 0; rc && i < n_mb; i++) { /* nothing left running on a failure */
		(void)use(m, &p[i]);
		moet_moe_dispatch_finish(m);
	}
	for (int i = 0; i < n_mb && !rc; i++)
		if (!(rc = use(m, &p[i])))
			rc = logits_compute(m, p[i].steps, p[i].n_steps);
	return rc;
}

/* The body as the graph cache says (graph.c): directly, captured then launched, or replayed. */
static int pass_run(moet_model *m, mb_pass *p, int n_mb, const moet_seq_step *steps,
		    int n_steps)
{
	moet_graph_mode gm = MOET_GRAPH_OFF;
	moet_graph_rec rec;
	int rc = moet_graph_plan(m, steps, n_steps, n_mb, &gm);
	if (rc)
		return rc;
	if (gm != MOET_GRAPH_OFF) /* a graph's pass keeps one shape: no early rows */
		m->early_min = 0;
	if (gm == MOET_GRAPH_REPLAY)
		return moet_graph_replay(m);
	if (gm == MOET_GRAPH_CAPTURE) {
		if (!moet_graph_capture_begin(m, &rec)) {
			rc = pass_body(m, p, n_mb);
			if ((rc = moet_graph_capture_end(m, &rec, rc)) != 1)
				return rc;
		}
		gm = MOET_GRAPH_OFF; /* the capture failed (counted): directly */
	}
	rc = pass_body(m, p, n_mb);
	if (!rc && gm == MOET_GRAPH_DIRECT)
		moet_graph_direct_done(m);
	return rc;
}

/* Where a batch would split into two micro-batches (by entries, at half the rows), or n_steps
 * when it cannot: no placement or one entry; or when it would gain nothing: no routed expert on
 * the CPU tier, unless forced (MOET_MICROBATCH=1). GPUs beyond the first take one call per
 * micro-batch slot (remote.c). */
static int split_point(const moet_model *m, const moet_seq_step *steps, int n_steps, int64_t n,
		       int forced)
{
	if (!m->hy || n_steps < 2 || (!m->cpu_tier && !forced))
		return n_steps;
	int64_t rows = 0;
	int k = 0;
	while (k < n_steps - 1 && 2 * (rows + steps[k].n_tok) <= n)
		rows += steps[k++].n_tok;
	return k == 0 ? 1 : k;
}

#define MB_TRIALS 3   /* passes of each form before choosing */
_Static_assert(2 * MB_TRIALS == MOET_MB_TRIAL_PASSES, "moet_model.h says how many trial passes");
#define MB_RETRY 512  /* then the other form once every this many passes */

/* The timings of batches of n rows: one bucket per power of two. */
static moet_mb_tune *mb_tune_of(moet_model *m, int64_t n)
{
	int b = 0;
	while (b < 31 && ((int64_t)1 << (b + 1)) <= n)
		b++;
	return &m->mb_tune[b];
}

/*
 * Where to split the batch (*out_k: split_point) and in which form (*out_form): one pass (0)
 * or two micro-batches (1). MOET_MICROBATCH=0 or 1 forces the form where the batch can split;
 * auto (default; unset or empty) chooses per batch size (rows, in powers of two) the faster as
 * measured: each form MB_TRIALS times, then the one with the lower median (mb_record), the
 * other tried again now and then. The micro-batches hide GPU work behind the CPU tier, but a cold
 * expert both halves route to is read twice, which costs more than it hides while the CPU tier
 * is bandwidth-bound (bench e2e records). Both forms give the same bits. Another value:
 * MOET_EINVAL naming it, at every pass (with or without a placement), before any cache grows.
 *
 * MOET_STAGE_BALANCE=auto multiplies the arms so chosen by the balance's link prices (none, 1
 * and 2 times MOET_STAGE_LINK_PRICE; *out_price, else -1): on the H200 the best price depended
 * on the form and the placement (record 2026-12-01-stage-balance-h200-b8ff68b.txt: with two
 * micro-batches at hot 84, 1 gained nothing and 2 made batch 16 9-10% shorter; in one pass at
 * hot 106, 1 made it 5% shorter and batch 64 longer). The prices give the same bits too.
 */
/* n comma-separated seconds (0 .. 1e6) from the variable `var` into out; unset or empty: 0s. */
static int skew_list(const char *var, const char *want, int n, double *out)
{
	const char *v = getenv(var), *q = v;
	for (int i = 0; i < n; i++)
		out[i] = 0;
	if (!v || !*v)
		return 0;
	for (int i = 0; i < n; i++) {
		char *end;
		out[i] = strtod(q, &end);
		if (end == q || !(out[i] >= 0 && out[i] < 1e6) || *end != (i + 1 < n ? ',' : 0))
			return moet_err(MOET_EINVAL, "%s='%s': want %s (seconds >= 0)", var, v,
					want);
		q = end + 1;
	}
	return 0;
}

/* MOET_MB_TEST_SKEW=A,B (tests only; unset or empty: 0,0): seconds added to the recorded time
 * of each batch size's first one-pass trial (A) and of every two-micro-batch pass (B), so that a
 * test can make a slow first pass and a slower form without timing anything.
 * MOET_STAGE_TEST_SKEW=N,P,Q (the same): seconds added to every pass at each of the
 * balance's prices (none, 1, 2) under MOET_STAGE_BALANCE=auto.
 * MOET_STAGE_TEST_CYCLE=1 (the same; unset, empty or 0: off): after the trials, decode passes
 * take the prices in turn instead of the lowest mean, so that a test sees a row of mixed
 * prices (as the running means make on a GPU) without timing anything. */
static int mb_skew(moet_model *m)
{
	static const char *const cyc[] = { "0", "1" };
	int rc = skew_list("MOET_MB_TEST_SKEW", "A,B", 2, m->mb_skew);
	rc = rc ? rc : skew_list("MOET_STAGE_TEST_SKEW", "N,P,Q", MOET_MB_PRICES, m->price_skew);
	return rc ? rc : moet_env_choice("MOET_STAGE_TEST_CYCLE", cyc, 2, &m->price_cycle);
}

/* MOET_STAGE_BALANCE=auto, with something to price: cold experts, and no NVMe tier (which
 * keeps the prefill threshold: dispatch.c). */
static int prices_tried(const moet_model *m)
{
	return m->hy && m->cpu_tier && !m->xtier && moet_hybrid_stage_price_auto(m->hy);
}

/* The arms a pass of this model chooses among (forms, then prices), arms[] in that order.
 * NOTE: MOET_STAGE_BALANCE=auto tries the prices in decode passes only; a prompt's pass runs at
 * the price 1 arm (an 8K-token prompt without staging took 30.2 s against 21.0 on the H200:
 * docs/hybrid.md, so trying none on long prompts would be dear). */
static int mb_arms(const moet_model *m, int mode, int can_split, int decode, int *arms)
{
	const int price_auto = prices_tried(m);
	const int p0 = price_auto && !decode, p1 = price_auto ? (decode ? 2 : 1) : 0;
	const int f0 = can_split && mode == 2, f1 = can_split && mode != 1;
	int na = 0;
	for (int f = f0; f <= f1; f++)
		for (int p = p0; p <= p1; p++)
			arms[na++] = f * MOET_MB_PRICES + p;
	return na;
}

int moet_model_trial_passes(const moet_model *m)
{
	static const char *const modes[] = { "auto", "0", "1" };
	int mode = 0, arms[MOET_MB_ARMS];
	if (moet_env_choice("MOET_MICROBATCH", modes, 3, &mode))
		moet_err_clear();
	const int na = mb_arms(m, mode, 1, 1, arms);
	return na > 1 ? na * MB_TRIALS : 0;
}

/* An arm's form at link price p (arms are form * MOET_MB_PRICES + price). */
static int at_price(int arm, int p)
{
	return arm / MOET_MB_PRICES * MOET_MB_PRICES + p;
}

/* *out_arm: the arm to record the pass under (mb_record), -1: none. */
static int mb_choose(moet_model *m, const moet_seq_step *steps, int n_steps, int64_t n,
		     int *out_k, int *out_form, int *out_price, int *out_arm)
{
	static const char *const modes[] = { "auto", "0", "1" };
	int mode = 0, rc = moet_env_choice("MOET_MICROBATCH", modes, 3, &mode);
	*out_k = n_steps;
	*out_form = 0;
	*out_price = *out_arm = -1;
	if (rc || (rc = mb_skew(m)))
		return rc;
	*out_k = split_point(m, steps, n_steps, n, mode == 2);
	const int can_split = *out_k < n_steps;
	int arms[MOET_MB_ARMS];
	const int na = mb_arms(m, mode, can_split, n == n_steps, arms);
	int arm = arms[0];
	if (na > 1) {
		moet_mb_tune *t = mb_tune_of(m, n);
		t->passes++;
		int least = 0, best = 0; /* the arm tried fewest times (the first of those) */
		for (int i = 1; i < na; i++) {
			least = t->cnt[arms[i]] < t->cnt[arms[least]] ? i : least;
			best = t->mean[arms[i]] < t->mean[arms[best]] ? i : best;
		}
		if (t->cnt[arms[least]] < MB_TRIALS)
			arm = arms[least];
		else if (t->passes % MB_RETRY == 0) /* now and then another, in turn */
			arm = arms[(best + 1 + (int)(t->passes / MB_RETRY) % (na - 1)) % na];
		else
			arm = arms[best];
		if (m->price_cycle && prices_tried(m) && n == n_steps &&
		    t->cnt[arms[least]] >= MB_TRIALS) /* MOET_STAGE_TEST_CYCLE (tests) */
			arm = at_price(arm, (int)(t->passes % MOET_MB_PRICES));
	}
	/* moet_model_force_price: the arm's form, at the forced price, recorded for none */
	const int forced = m->price_forced && prices_tried(m) && n == n_steps;
	if (forced)
		arm = at_price(arm, m->price_forced - 1);
	*out_form = arm / MOET_MB_PRICES;
	*out_price = prices_tried(m) ? arm % MOET_MB_PRICES : -1;
	/* NOTE: a forced form's passes count for it too, as before the prices (can_split) */
	*out_arm = !forced && (na > 1 || can_split) ? arm : -1;
	return 0;
}

int moet_model_last_price(const moet_model *m)
{
	return m->price_last - 1;
}

int moet_model_force_price(moet_model *m, int arm)
{
	if (arm < -1 || arm >= MOET_MB_PRICES)
		return moet_err(MOET_EINVAL, "forced link price arm %d (want 0..%d, or -1)", arm,
				MOET_MB_PRICES - 1);
	m->price_forced = arm + 1;
	return 0;
}

/* NOTE: a form's trial passes count by their median, not a running mean: the first pass of a
 * batch size may grow buffers (and run with cold caches) and, weighted most in a running
 * mean, made the slower form win (bench e2e on the H200, 2026-12-01: two micro-batches chosen
 * at batch 16 for a 27.9 ms step against 21.7 ms in one pass). After the trials the running
 * mean goes on from that median. */
static void mb_record(moet_model *m, int64_t n, int arm, double seconds)
{
	_Static_assert(sizeof(((moet_mb_tune *)0)->trial[0]) / sizeof(double) == MB_TRIALS,
		       "one trial slot per trial pass");
	moet_mb_tune *t = mb_tune_of(m, n);
	const int c = t->cnt[arm]++, form = arm / MOET_MB_PRICES;
	seconds += form ? m->mb_skew[1] : c == 0 ? m->mb_skew[0] : 0; /* tests: mb_skew */
	if (prices_tried(m))
		seconds += m->price_skew[arm % MOET_MB_PRICES];
	if (c < MB_TRIALS) {
		double *v = t->trial[arm];
		v[c] = seconds;
		if (c == MB_TRIALS - 1) { /* the median of three */
			double lo = v[0] < v[1] ? v[0] : v[1], hi = v[0] < v[1] ? v[1] : v[0];
			t->mean[arm] = v[2] < lo ? lo : v[2] > hi ? hi : v[2];
		}
		return;
	}
	t->mean[arm] = 0.75 * t->mean[arm] + 0.25 * seconds;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/*
 * NOTE: with two micro-batches A and B the layers interleave as
 *   A1(0) B1(0) A2(0) A1(1) B2(0) B1(1) A2(1) A1(2) ...   (1: up to the expert tiers, 2: rest)
 * so that while the CPU tier computes one micro-batch's experts of layer l, the driving thread
 * queues the other's attention, router and GPU experts: CPU and GPU busy at once. Rows are
 * independent, so the bits equal those of one pass (tests: test_hybrid_sim, test_gpu_hybrid).
 * Each 1 copies the routing ids to the host, which waits for everything queued before them.
 * With MOET_MB_QUEUE=1 those copies are queued instead (1a: up to the routing and its copies,
 * 1b: the shared experts, then the expert tiers started once the copies are there), in the
 * same order; with MOET_MB_REORDER=1 too the order is
 *   A1a(0) B1a(0) | A1b(l) B1b(l) A2(l) A1a(l+1) B2(l) B1a(l+1) | ...
 * so that whenever the driver waits (for a half's copies, or for its CPU tier) the other
 * half's work is queued on the device behind it.
 */
int moet_model_forward_batch(moet_model *m, const moet_seq_step *steps, int n_steps)
{
	int64_t n = 0;
	int rc = check_batch(m, steps, n_steps, &n);
	if (rc || n == 0)
		return rc;
	if (m->experts_unbound && !m->owner)
		TRY(moet_model_bind_experts(m, NULL));
	int k = n_steps, form = 0, price = -1, arm = -1;
	TRY(mb_choose(m, steps, n_steps, n, &k, &form, &price, &arm));
	if (price >= 0) { /* MOET_STAGE_BALANCE=auto */
		moet_hybrid_stage_set_arm(m->hy, price);
		m->price_passes[price]++;
	}
	m->price_last = price + 1;
	const double t0 = now_s();
	const uint64_t t0_ns = moet_now_ns();
	if (!form)
		k = n_steps;
	mb_pass p[2] = { { .steps = steps, .n_steps = k, .seq_base = 0, .slot = 0,
			   .b = &m->bufs[0] },
			 { .steps = steps + k, .n_steps = n_steps - k, .seq_base = k, .slot = 1,
			   .b = &m->bufs[1] } };
	const int n_mb = k < n_steps ? 2 : 1;
	m->split_passes += n_mb == 2;
	for (int i = 0; i < n_mb; i++)
		for (int s = 0; s < p[i].n_steps; s++)
			p[i].n += p[i].steps[s].n_tok;
	const int grown = !(rc = moet_kv_grow_batch(steps, n_steps));
	for (int i = 0; i < n_mb && !rc; i++)
		rc = mb_rows(m, &p[i]);
	int merged = 0;
	if (!rc)
		rc = moet_pass_switches(m, n_mb, n == n_steps);
	if (!rc)
		rc = moet_early_switch(m, n_mb, n == n_steps);
	if (!rc && n_mb == 2)
		rc = moet_mb_merge_begin(m, n, &merged);
	if (merged) { /* a merged call reads both halves' rows: no polled halves; two streams
		       * only where they can wait for each other (dispatch.c) */
		m->mb_streams = m->mb_streams && m->be->ops->stream_wait;
		m->q_poll = 0;
	}
	if (!rc)
		rc = pass_run(m, p, n_mb, steps, n_steps);
	/* MOET_TIER_FINISH=queued: the CPU tier's last calls' ends, also on a failure */
	const int rq = moet_hybrid_cpu_collect_all(m->hy);
	rc = rc ? rc : rq;
	if (merged)
		moet_mb_merge_end(m);
	if (m->mb_streams) { /* the pass's stream after both halves' work, also on a failure */
		m->stream_passes += !rc;
		m->mb_streams = 0;
		const int rj = m->be->ops->stream_select(m->be, -1);
		rc = rc ? rc : rj;
	}
	for (int i = 0; i < n_mb && !rc; i++) {
		(void)use(m, &p[i]);
		rc = logits_deliver(m, p[i].steps, p[i].n_steps);
	}
	/* after the logits' download every idle mark of the pass was reached; a failed pass's
	 * marks are dropped (an open one would pair with the next pass's) */
	const int ri = moet_model_gpu_idle_take(m);
	rc = rc ? rc : ri;
	const int rl = moet_hybrid_stage_take_link(m->hy); /* the staged copies' device times */
	rc = rc ? rc : rl;
	/* MOET_GPU_DEVGROUP=1: the device's error words, after the logits' download */
	const int rd = moet_devgroup_check(m, rc != 0);
	rc = rc ? rc : rd;
	if (m->trace) { /* MOET_TRACE: the pass's op spans (all of it has run), and the pass */
		const int rt = moet_backend_trace_flush(m->be);
		char name[64];
		snprintf(name, sizeof(name), "%s %lld rows, %s%s", n == n_steps ? "decode" : "prompts",
			 (long long)n, n_mb == 2 ? "two micro-batches" : "one pass",
			 m->hy && !moet_hybrid_overlapped(m->hy) ? ", CPU tier alone" : "");
		moet_trace_span(m->trace, MOET_TRACE_PASS, name, t0_ns, moet_now_ns());
		rc = rc ? rc : rt;
	}
	if (rc) {
		if (grown) /* every cache keeps only the blocks it had */
			moet_kv_undo_batch(steps, n_steps);
		return rc;
	}
	for (int s = 0; s < n_steps; s++)
		steps[s].kv->len += steps[s].n_tok;
	/* NOTE: not a pass with the CPU tier alone (moet_model_set_hybrid_overlap 0: bench e2e's
	 * Tc): slower in every arm, it would steer the choice while Tc is measured */
	if (arm >= 0 && (!m->hy || moet_hybrid_overlapped(m->hy)))
		mb_record(m, n, arm, now_s() - t0);
	return 0;
}

int moet_model_forward(moet_model *m, moet_kv *kv, const int64_t *tokens, int64_t n_tok,
		       float *out_logits)
{
	moet_seq_step st = { .kv = kv, .tokens = tokens, .n_tok = n_tok,
			     .out_logits = out_logits };
	return moet_model_forward_batch(m, &st, 1);
}

int moet_model_generate_sampled(moet_model *m, const int64_t *prompt, int64_t n_prompt,
				int64_t max_new, int stop_at_eos, const moet_sample_params *sp,
				int64_t *out_ids, int64_t *out_n)
{
	const moet_config *c = &m->cfg;
	moet_kv *kv = NULL;
	int64_t next = 0;
	int rc;
	*out_n = 0;
	if (n_prompt <= 0)
		return moet_err(MOET_EINVAL, "generate: empty prompt");
	if ((rc = moet_sample_check(sp)) || (rc = moet_kv_create(m, n_prompt + max_new, &kv)))
		return rc;
	/* the token is drawn where the logits are (moet_backend_draw): only ids cross PCIe */
	moet_seq_step st = { .kv = kv, .tokens = prompt, .n_tok = n_prompt, .sample = sp,
			     .out_token = &next };
	for (int64_t i = 0; i < max_new; i++) {
		if ((rc = moet_model_forward_batch(m, &st, 1)))
			goto out;
		out_ids[(*out_n)++] = next;
		if ((stop_at_eos && next == c->eos_token_id) || i + 1 == max_new)
			break;
		st.tokens = &out_ids[*out_n - 1];
		st.n_tok = 1;
	}
out:
	moet_kv_destroy(kv);
	return rc;
}

int moet_model_generate(moet_model *m, const int64_t *prompt, int64_t n_prompt, int64_t max_new,
			int stop_at_eos, int64_t *out_ids, int64_t *out_n)
{
	const moet_sample_params greedy = { .temperature = 0, .top_k = 0, .top_p = 1, .seed = 0 };
	return moet_model_generate_sampled(m, prompt, n_prompt, max_new, stop_at_eos, &greedy,
					   out_ids, out_n);
}
