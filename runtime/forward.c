/*
 * forward.c: the forward pass of the CPU reference backend.
 *
 *   x = embed(tokens)                                          [n_tok x H]
 *   per layer:  x += o_proj(MLA(rmsnorm(x)))                   (K, V of the new positions
 *               x += ffn(rmsnorm(x))                            appended to the cache first)
 *   logits = lm_head(rmsnorm(x))
 *
 * MLA, per token: q = q_b(rmsnorm(q_a(h))) (or q_proj(h)); [c | k_pe] = kv_a(h);
 * [k_nope | v] per head = kv_b(rmsnorm(c)); RoPE on q's rope part and on k_pe (shared by all
 * heads); scores over positions <= the token's, softmax, weighted sum of v; o_proj.
 * MoE, per token: router scores, selection (moet_router_select_ref), each selected expert by
 * the contract kernel (the variant moet_cpu_kernels_get() picks: all give the reference's
 * bits), the canonical combine routed[j] = fma(w_i, y_i[j], routed[j]) over
 * i = 0..k-1, plus the shared experts.
 *
 * A batch holds several sequences (moet_seq_step), each with its own cache and positions:
 * every token's arithmetic depends only on its own row and its own cache, so the result does
 * not depend on how tokens are split into calls or which sequences share a batch (batch
 * invariance; tested bit for bit).
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_cpu.h"
#include "moet_err.h"
#include "moet_expc.h"

typedef struct work {
	float *h;       /* [n x H] normalized input of a sub-layer */
	float *q;       /* [n x heads x qk_head] roped queries */
	float *lora;    /* [max(q_lora, kv_lora + rope)] */
	float *kvb;     /* [heads x (nope + v)] */
	float *attn;    /* [n x heads x v] */
	float *out;     /* [n x H] */
	float *ffn;     /* [max(inter, shared inter, moe inter)] scratch of the expert kernel */
	float *y;       /* [H] one expert's output */
	float *routed;  /* [H] */
	float *scores;  /* [E], router */
	float *rscratch;/* [E + n_group] */
	float *cos_t, *sin_t; /* [rope / 2] */
	float *att_s;   /* [max_tokens] attention scores */
} work;

static void work_free(work *w)
{
	float **f[] = { &w->h, &w->q, &w->lora, &w->kvb, &w->attn, &w->out, &w->ffn, &w->y,
			&w->routed, &w->scores, &w->rscratch, &w->cos_t, &w->sin_t, &w->att_s };
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		free(*f[i]);
		*f[i] = NULL;
	}
}

static int64_t max3(int64_t a, int64_t b, int64_t c)
{
	int64_t m = a > b ? a : b;
	return m > c ? m : c;
}

static int work_alloc(const moet_model *m, int64_t max_tokens, int64_t n, work *w)
{
	const moet_config *c = &m->cfg;
	const int64_t H = c->hidden_size, nh = c->num_attention_heads;
	const int64_t E = c->n_routed_experts > 0 ? c->n_routed_experts : 1;
	memset(w, 0, sizeof(*w));
	w->h = malloc((size_t)(n * H) * sizeof(float));
	w->q = malloc((size_t)(n * nh * moet_config_qk_head_dim(c)) * sizeof(float));
	w->lora = malloc((size_t)max3(c->q_lora_rank, c->kv_lora_rank + c->qk_rope_head_dim, 1) *
			 sizeof(float));
	w->kvb = malloc((size_t)(nh * (c->qk_nope_head_dim + c->v_head_dim)) * sizeof(float));
	w->attn = malloc((size_t)(n * nh * c->v_head_dim) * sizeof(float));
	w->out = malloc((size_t)(n * H) * sizeof(float));
	w->ffn = malloc((size_t)max3(c->intermediate_size,
				     c->moe_intermediate_size * (c->n_shared_experts + 1), 1) *
			sizeof(float));
	w->y = malloc((size_t)H * sizeof(float));
	w->routed = malloc((size_t)H * sizeof(float));
	w->scores = malloc((size_t)E * sizeof(float));
	w->rscratch = malloc((size_t)(E + c->n_group + 1) * sizeof(float));
	w->cos_t = malloc((size_t)(c->qk_rope_head_dim / 2 + 1) * sizeof(float));
	w->sin_t = malloc((size_t)(c->qk_rope_head_dim / 2 + 1) * sizeof(float));
	w->att_s = malloc((size_t)max_tokens * sizeof(float));
	if (!w->h || !w->q || !w->lora || !w->kvb || !w->attn || !w->out || !w->ffn || !w->y ||
	    !w->routed || !w->scores || !w->rscratch || !w->cos_t || !w->sin_t || !w->att_s) {
		work_free(w);
		return moet_err(MOET_ENOMEM, "forward work buffers for %lld tokens", (long long)n);
	}
	return 0;
}

static void embed_row(const moet_model *m, int64_t tok, float *x)
{
	const int64_t H = m->cfg.hidden_size;
	const size_t off = (size_t)tok * (size_t)H;
	for (int64_t i = 0; i < H; i++) {
		switch (m->embed->dtype) {
		case MOET_DT_BF16: x[i] = moet_dec_bf16(((const uint16_t *)m->embed->data)[off + i]); break;
		case MOET_DT_F16: x[i] = moet_dec_f16(((const uint16_t *)m->embed->data)[off + i]); break;
		default: x[i] = ((const float *)m->embed->data)[off + i]; break;
		}
	}
}

/* Projections of one token, K/V into the cache at position pos; q (roped) into q. */
static void mla_project(const moet_model *m, const moet_layer_w *lw, moet_kv *kv, int64_t l,
			int64_t pos, const float *h, float *q, work *w)
{
	const moet_config *c = &m->cfg;
	const int64_t nh = c->num_attention_heads, nope = c->qk_nope_head_dim;
	const int64_t rope = c->qk_rope_head_dim, qk = nope + rope, vd = c->v_head_dim;
	const int interleave = c->rope_interleave;
	moet_rope_tables(m, pos, w->cos_t, w->sin_t);

	if (c->q_lora_rank > 0) {
		moet_matvec_ref(&lw->q_a, h, w->lora);
		moet_rmsnorm_ref(w->lora, lw->q_a_norm, c->q_lora_rank, c->rms_norm_eps, w->lora);
		moet_matvec_ref(&lw->q_b, w->lora, q);
	} else {
		moet_matvec_ref(&lw->q_proj, h, q);
	}
	for (int64_t hd = 0; hd < nh; hd++)
		moet_rope_ref(q + hd * qk + nope, rope / 2, w->cos_t, w->sin_t, interleave);

	moet_matvec_ref(&lw->kv_a, h, w->lora);
	float *k_pe = w->lora + c->kv_lora_rank;
	moet_rope_ref(k_pe, rope / 2, w->cos_t, w->sin_t, interleave);
	moet_rmsnorm_ref(w->lora, lw->kv_a_norm, c->kv_lora_rank, c->rms_norm_eps, w->lora);
	moet_matvec_ref(&lw->kv_b, w->lora, w->kvb);

	float *krow = kv->k + ((size_t)l * (size_t)kv->max_tokens + (size_t)pos) * (size_t)kv->k_row;
	float *vrow = kv->v + ((size_t)l * (size_t)kv->max_tokens + (size_t)pos) * (size_t)kv->v_row;
	for (int64_t hd = 0; hd < nh; hd++) {
		const float *src = w->kvb + hd * (nope + vd);
		memcpy(krow + hd * qk, src, (size_t)nope * sizeof(float));
		memcpy(krow + hd * qk + nope, k_pe, (size_t)rope * sizeof(float));
		memcpy(vrow + hd * vd, src + nope, (size_t)vd * sizeof(float));
	}
}

/* Where each row of a batch belongs: its sequence's cache and its position there. */
typedef struct row_desc {
	moet_kv *kv;
	int64_t pos;
	int seq;        /* batch entry */
	int prefill;    /* the entry runs more than one token */
} row_desc;

static void attention(const moet_model *m, const moet_layer_w *lw, int64_t l,
		      const row_desc *rows, int64_t n, work *w)
{
	const moet_config *c = &m->cfg;
	const int64_t H = c->hidden_size, nh = c->num_attention_heads;
	const int64_t qk = moet_config_qk_head_dim(c), vd = c->v_head_dim;
	/* NOTE: every row's K/V enters its sequence's cache before any row attends; a row then
	 * sees positions 0 .. its own only, exactly as if each token came in a call of its own. */
	for (int64_t t = 0; t < n; t++)
		mla_project(m, lw, rows[t].kv, l, rows[t].pos, w->h + t * H, w->q + t * nh * qk, w);
	for (int64_t t = 0; t < n; t++) {
		const moet_kv *kv = rows[t].kv;
		const float *kbase = kv->k + (size_t)l * (size_t)kv->max_tokens * (size_t)kv->k_row;
		const float *vbase = kv->v + (size_t)l * (size_t)kv->max_tokens * (size_t)kv->v_row;
		const float *q = w->q + t * nh * qk;
		for (int64_t hd = 0; hd < nh; hd++)
			moet_attend_ref(q + hd * qk, kbase + hd * qk, kv->k_row, vbase + hd * vd,
					kv->v_row, rows[t].pos + 1, qk, vd, m->softmax_scale, w->att_s,
					w->attn + (t * nh + hd) * vd);
		moet_matvec_ref(&lw->o, w->attn + t * nh * vd, w->out + t * H);
	}
}

/* Dense MLP or MoE of one token (layer l, batch row rd): h -> out. */
static int ffn_token(const moet_model *m, int64_t l, const row_desc *rd, const float *h,
		     float *out, work *w)
{
	const moet_layer_w *lw = &m->layers[l];
	const moet_config *c = &m->cfg;
	const int64_t H = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok;
	int rc;
	const moet_cpu_kernels *kern = moet_cpu_kernels_get();
	if (!lw->is_moe)
		return moet_expert_ffn(kern, &lw->mlp.gate, &lw->mlp.up, &lw->mlp.down, h, 1, w->ffn,
				       out);
	for (int64_t e = 0; e < E; e++) {
		float logit = moet_dot_ref(&lw->router, e, h);
		w->scores[e] = 1.0f / (1.0f + moet_exp_c(-logit));
	}
	int32_t ids[MOET_MODEL_MAX_TOPK];
	float wts[MOET_MODEL_MAX_TOPK];
	moet_router_select_ref(w->scores, lw->router_bias, E, c->n_group, c->topk_group, k,
			       c->norm_topk_prob, (float)c->routed_scaling_factor, w->rscratch, ids,
			       wts);
	if (m->route_fn) {
		moet_route_event ev = { .layer = l, .seq = rd->seq, .pos = rd->pos,
					.is_prefill = rd->prefill, .top_k = (int)k, .ids = ids,
					.weights = wts };
		m->route_fn(m->route_ctx, &ev);
	}
	for (int64_t j = 0; j < H; j++)
		w->routed[j] = 0.0f;
	for (int64_t i = 0; i < k; i++) {
		const moet_expert_w *ex = &lw->experts[ids[i]];
		if ((rc = moet_expert_ffn(kern, &ex->gate, &ex->up, &ex->down, h, 1, w->ffn, w->y)))
			return rc;
		for (int64_t j = 0; j < H; j++)
			w->routed[j] = MOET_FMA(wts[i], w->y[j], w->routed[j]);
	}
	if (lw->has_shared) {
		if ((rc = moet_expert_ffn(kern, &lw->mlp.gate, &lw->mlp.up, &lw->mlp.down, h, 1,
					  w->ffn, out)))
			return rc;
		for (int64_t j = 0; j < H; j++)
			out[j] = moet_canon_nan(w->routed[j] + out[j]);
	} else {
		for (int64_t j = 0; j < H; j++)
			out[j] = moet_canon_nan(w->routed[j]);
	}
	return 0;
}

/* Validates a batch and counts its rows; the largest cache sizes the attention scratch. */
static int check_batch(const moet_model *m, const moet_seq_step *steps, int n_steps,
		       int64_t *out_rows, int64_t *out_max_tokens)
{
	const int64_t V = m->cfg.vocab_size;
	int64_t rows = 0, max_tokens = 1;
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
		if (st->kv->len + st->n_tok > st->kv->max_tokens)
			return moet_err(MOET_ERANGE, "KV cache full: %lld + %lld tokens > %lld",
					(long long)st->kv->len, (long long)st->n_tok,
					(long long)st->kv->max_tokens);
		rows += st->n_tok;
		if (st->kv->max_tokens > max_tokens)
			max_tokens = st->kv->max_tokens;
	}
	*out_rows = rows;
	*out_max_tokens = max_tokens;
	return 0;
}

int moet_model_forward_batch(moet_model *m, const moet_seq_step *steps, int n_steps)
{
	const moet_config *c = &m->cfg;
	const int64_t H = c->hidden_size, V = c->vocab_size;
	int64_t n = 0, max_tokens = 0;
	work w = { 0 };
	float *x = NULL;
	row_desc *rows = NULL;
	int rc = check_batch(m, steps, n_steps, &n, &max_tokens);
	if (rc || n == 0)
		return rc;
	if ((rc = work_alloc(m, max_tokens, n, &w)))
		return rc;
	x = malloc((size_t)(n * H) * sizeof(float));
	rows = malloc((size_t)n * sizeof(*rows));
	if (!x || !rows) {
		rc = moet_err(MOET_ENOMEM, "activations of %lld tokens", (long long)n);
		goto out;
	}
	for (int s = 0, t = 0; s < n_steps; s++)
		for (int64_t i = 0; i < steps[s].n_tok; i++, t++) {
			rows[t] = (row_desc){ steps[s].kv, steps[s].kv->len + i, s,
					      steps[s].n_tok > 1 };
			embed_row(m, steps[s].tokens[i], x + t * H);
		}
	for (int64_t l = 0; l < c->num_hidden_layers; l++) {
		const moet_layer_w *lw = &m->layers[l];
		for (int64_t t = 0; t < n; t++)
			moet_rmsnorm_ref(x + t * H, lw->in_norm, H, c->rms_norm_eps, w.h + t * H);
		attention(m, lw, l, rows, n, &w);
		for (int64_t i = 0; i < n * H; i++)
			x[i] = x[i] + w.out[i];
		for (int64_t t = 0; t < n; t++) {
			moet_rmsnorm_ref(x + t * H, lw->post_norm, H, c->rms_norm_eps, w.h + t * H);
			if ((rc = ffn_token(m, l, &rows[t], w.h + t * H, w.out + t * H, &w)))
				goto out;
		}
		for (int64_t i = 0; i < n * H; i++)
			x[i] = x[i] + w.out[i];
	}
	for (int s = 0, t = 0; s < n_steps; s++) {
		const moet_seq_step *st = &steps[s];
		for (int64_t i = 0; i < st->n_tok; i++, t++) {
			float *dst = NULL;
			if (st->out_logits && !st->last_only)
				dst = st->out_logits + i * V;
			else if (st->out_logits && i == st->n_tok - 1)
				dst = st->out_logits;
			if (!dst)
				continue;
			moet_rmsnorm_ref(x + t * H, m->final_norm, H, c->rms_norm_eps, w.h);
			moet_matvec_ref(&m->lm_head, w.h, dst);
		}
		st->kv->len += st->n_tok;
	}
	rc = 0;
out:
	free(rows);
	free(x);
	work_free(&w);
	return rc;
}

int moet_model_forward(moet_model *m, moet_kv *kv, const int64_t *tokens, int64_t n_tok,
		       float *out_logits)
{
	moet_seq_step st = { .kv = kv, .tokens = tokens, .n_tok = n_tok,
			     .out_logits = out_logits };
	return moet_model_forward_batch(m, &st, 1);
}

int moet_model_generate(moet_model *m, const int64_t *prompt, int64_t n_prompt, int64_t max_new,
			int stop_at_eos, int64_t *out_ids, int64_t *out_n)
{
	const moet_config *c = &m->cfg;
	const int64_t V = c->vocab_size;
	moet_kv *kv = NULL;
	float *logits = NULL;
	int rc;
	*out_n = 0;
	if (n_prompt <= 0)
		return moet_err(MOET_EINVAL, "generate: empty prompt");
	if ((rc = moet_kv_create(m, n_prompt + max_new, &kv)))
		return rc;
	logits = malloc((size_t)V * sizeof(float));
	if (!logits) {
		rc = moet_err(MOET_ENOMEM, "logits");
		goto out;
	}
	moet_seq_step st = { .kv = kv, .tokens = prompt, .n_tok = n_prompt, .out_logits = logits,
			     .last_only = 1 };
	for (int64_t i = 0; i < max_new; i++) {
		if ((rc = moet_model_forward_batch(m, &st, 1)))
			goto out;
		int64_t best = 0;
		for (int64_t v = 1; v < V; v++)
			if (logits[v] > logits[best])
				best = v;
		out_ids[(*out_n)++] = best;
		if ((stop_at_eos && best == c->eos_token_id) || i + 1 == max_new)
			break;
		st.tokens = &out_ids[*out_n - 1];
		st.n_tok = 1;
	}
out:
	free(logits);
	moet_kv_destroy(kv);
	return rc;
}
