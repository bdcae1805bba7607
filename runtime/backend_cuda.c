/*
 * backend_cuda.c: the CUDA backend of the model graph: device memory, the checkpoint's bytes
 * copied verbatim to the device, and the ops of gpu/ (moet_gpu.h).
 *
 * Every op of gpu/ returns the CPU reference's bits (docs/gpu.md: linear, attention, router,
 * combine, embed bit-equal; rmsnorm and rope measured bit-equal too), so this backend's
 * logits are expected to equal the CPU backend's; tests/gpu/test_gpu_model.c checks it.
 *
 *   prepare_rows   host row table -> device: tokens and positions as int32, per layer the
 *                  K and V base pointers of every row's cache pool (what kv_write and
 *                  attention take), and the block tables of the batch's sequences (one copy
 *                  per sequence, moet_gpu_pages), in one upload
 *   experts        the graph hands over the (expert, pair) list grouped by expert (host); the
 *                  token index of each pair goes up and the grouped call of gpu/expert.cu
 *                  computes them
 *
 * NOTE: a pass's work goes on one stream (the legacy default stream, or with
 * MOET_GPU_STREAM=own a blocking stream of the backend's, which CUDA graphs capture:
 * runtime/graph.c), or its two micro-batches' on two streams of their own
 * (backend_cuda_sync.c, with the fences, idle marks, trace points and capture); on each,
 * copies and kernels run in issue order, and a download waits for what came before it.
 * Weights are bound once at open; nothing but the grow-only row table and expert scratch is
 * allocated per batch.
 */
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_int.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_upload.h"


static int keep(cuda_be *c, void *p)
{
	if (c->n_owned == c->cap_owned) {
		int cap = c->cap_owned ? 2 * c->cap_owned : 256;
		void **n = realloc(c->owned, (size_t)cap * sizeof(*n));
		if (!n) {
			moet_gpu_free(p);
			return moet_err(MOET_ENOMEM, "CUDA backend: weight list");
		}
		c->owned = n;
		c->cap_owned = cap;
	}
	c->owned[c->n_owned++] = p;
	return 0;
}

static void cu_destroy(moet_backend *be)
{
	cuda_be *c = impl(be);
	if (c->stream) {
		/* NOTE: this thread's default stream must not outlive it (the other threads that
		 * ran passes set theirs again at their next pass, or end) */
		(void)moet_gpu_sync(c->stream);
		if (moet_gpu_thread_stream() == c->stream)
			moet_gpu_set_thread_stream(NULL);
	}
	for (int i = 0; i < 2; i++) { /* their work done before anything is freed */
		if (!c->mb_stream[i])
			continue;
		(void)moet_gpu_sync(c->mb_stream[i]);
		if (moet_gpu_thread_stream() == c->mb_stream[i])
			moet_gpu_set_thread_stream(NULL);
	}
	for (int i = 0; i < 2; i++) /* the low-priority expert streams (MOET_MB_PRIO=1) */
		if (c->xs_stream[i])
			(void)moet_gpu_sync(c->xs_stream[i]);
	for (int i = 0; i < c->n_owned; i++)
		moet_gpu_free(c->owned[i]);
	free(c->owned);
	for (int i = 0; i < 2; i++) {
		moet_gpu_free(c->rows_dev[i]);
		if (c->stream) {
			if (c->rows_ev_used[i])
				(void)moet_gpu_event_sync(c->rows_ev[i]);
			moet_gpu_host_free(c->host_stage[i]);
			moet_gpu_event_destroy(c->rows_ev[i]);
		} else {
			free(c->host_stage[i]);
		}
	}
	for (int i = 0; i < 2; i++) {
		cu_half *hf = &c->half[i];
		moet_gpu_free(hf->scratch);
		moet_gpu_free(hf->pair_tok);
		if (hf->tok_ev_used) /* no copy may read freed memory */
			(void)moet_gpu_event_sync(hf->tok_ev);
		moet_gpu_host_free(hf->tok_pin);
		free(hf->ge);
		moet_gpu_event_destroy(hf->tok_ev);
		moet_gpu_free(hf->fast_scratch);
		moet_gpu_stream_destroy(c->mb_stream[i]);
		moet_gpu_event_destroy(c->mb_ev[i]);
		moet_gpu_event_destroy(c->wait_ev[i]);
		moet_gpu_stream_destroy(c->xs_stream[i]);
		moet_gpu_event_destroy(c->xs_ev[i][0]);
		moet_gpu_event_destroy(c->xs_ev[i][1]);
	}
	moet_gpu_event_destroy(c->base_ev);
	for (int64_t i = 0; i < c->tp_cap; i++)
		moet_gpu_event_destroy(c->tp_ev[i]);
	free(c->tp_ev);
	moet_gpu_event_destroy(c->tp_anchor);
	moet_gpu_free(c->iota);
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < CU_IDLE_PAIRS; j++)
			moet_gpu_event_destroy(c->idle_ev[i][j]);
	for (int j = 0; j < CU_IDLE_PAIRS; j++)
		moet_gpu_event_destroy(c->idle_ev_other[j]);
	for (int i = 0; i < MOET_BACKEND_FENCES; i++)
		moet_gpu_event_destroy(c->fence_ev[i]);
	moet_gpu_free(c->smp_scratch); /* issue 4 */
	moet_gpu_free(c->smp_ids);
	moet_gpu_fast_destroy(c->fast);
	moet_gpu_stream_destroy(c->stream);
	free(c);
}

static int cu_alloc(moet_backend *be, size_t bytes, void **out)
{
	(void)be;
	return moet_gpu_alloc(bytes ? bytes : 64, out);
}

static void cu_free(moet_backend *be, void *p)
{
	(void)be;
	moet_gpu_free(p);
}

static int cu_upload(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	(void)be;
	return bytes ? moet_gpu_copy_h2d(dst, src, bytes) : 0;
}

static int cu_upload_async(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	return moet_gpu_copy_h2d_async(dst, src, bytes, cur_stream(impl(be)));
}

static int cu_wait_word(moet_backend *be, const uint32_t *word, uint32_t value)
{
	return moet_gpu_wait_word(word, value, cur_stream(impl(be)));
}

static int cu_download_async(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	return moet_gpu_copy_d2h_async(dst, src, bytes, cur_stream(impl(be)));
}


static int cu_download(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	(void)be;
	return bytes ? moet_gpu_copy_d2h(dst, src, bytes) : 0;
}

static int cu_copy(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	(void)be;
	return bytes ? moet_gpu_copy_d2d(dst, src, bytes, NULL) : 0;
}

static int cu_host_alloc(moet_backend *be, size_t bytes, void **out)
{
	(void)be;
	return moet_gpu_host_alloc(bytes ? bytes : 64, out);
}

static void cu_host_free(moet_backend *be, void *p)
{
	(void)be;
	moet_gpu_host_free(p);
}

/* A device copy of n bytes of host memory, owned by the backend. */
static int dev_copy(cuda_be *c, const void *host, size_t bytes, void **out)
{
	void *d = NULL;
	int rc = moet_gpu_alloc(bytes ? bytes : 64, &d);
	if (rc)
		return rc;
	if ((rc = keep(c, d)))
		return rc;
	if (bytes && (rc = moet_gpu_copy_h2d(d, host, bytes)))
		return rc;
	*out = d;
	return 0;
}

static int cu_bind_mat(moet_backend *be, const moet_mat *host, moet_mat *out)
{
	cuda_be *c = impl(be);
	void *d = NULL, *s = NULL;
	size_t bytes = (size_t)host->rows * (size_t)host->cols * moet_dtype_size(host->dtype);
	int rc = dev_copy(c, host->data, bytes, &d);
	if (rc)
		return rc;
	*out = *host;
	out->data = d;
	if (host->scale_inv) {
		if ((rc = dev_copy(c, host->scale_inv, moet_mat_scale_bytes(host), &s)))
			return rc;
		out->scale_inv = s;
	}
	return 0;
}

static int cu_bind_vec(moet_backend *be, const float *host, int64_t n, const float **out)
{
	void *d = NULL;
	int rc = dev_copy(impl(be), host, (size_t)n * sizeof(float), &d);
	if (!rc)
		*out = d;
	return rc;
}

static int cu_prepare_rows(moet_backend *be, int slot, const moet_rowinfo *rows,
			   const int64_t *tokens, int64_t n, int64_t n_layers,
			   const moet_rows **out)
{
	cuda_be *c = impl(be);
	if (slot < 0 || slot > 1)
		return moet_err(MOET_EINVAL, "row table slot %d (0 or 1)", slot);
	/* a pass starts here: its work goes to this backend's stream (NULL: the legacy one) */
	moet_gpu_set_thread_stream(c->stream);
	/* layout of the block: kbase[L][n] vbase[L][n] tok[n] pos[n] off[n] shift[n]
	 * table[n_tab] (int32). NOTE: the rows of one sequence are consecutive and share its
	 * block table: one copy per sequence. Every part but the tables' is at an offset that
	 * depends on n and L only, so the pointers handed to the kernels are the same at every
	 * step of a batch shape (what a captured CUDA graph holds, runtime/graph.c). */
	int64_t n_tab = 0;
	for (int64_t t = 0; t < n; t++) {
		if (!rows[t].blocks || rows[t].n_blocks < 1 ||
		    (rows[t].pos >> rows[t].block_shift) >= rows[t].n_blocks)
			return moet_err(MOET_EINVAL, "row %lld: no block table for position %lld",
					(long long)t, (long long)rows[t].pos);
		if (t == 0 || rows[t].blocks != rows[t - 1].blocks)
			n_tab += rows[t].n_blocks;
	}
	const size_t ptrs = (size_t)(2 * n_layers * n) * sizeof(float *);
	const size_t bytes = ptrs + (size_t)(4 * n + n_tab) * sizeof(int32_t);
	int rc;
	/* NOTE: with an own stream the staging is pinned and its copy asynchronous (a CUDA graph
	 * replays the pass after it): it is rewritten only once the last copy from it is done */
	if (c->rows_ev_used[slot]) {
		if ((rc = moet_gpu_event_sync(c->rows_ev[slot])))
			return rc;
		c->rows_ev_used[slot] = 0;
	}
	if (bytes > c->rows_bytes[slot]) {
		void *stage = NULL;
		if (c->stream) {
			if ((rc = moet_gpu_host_alloc(bytes, &stage)))
				return rc;
			moet_gpu_host_free(c->host_stage[slot]);
		} else if (!(stage = realloc(c->host_stage[slot], bytes))) {
			return moet_err(MOET_ENOMEM, "row table staging");
		}
		c->host_stage[slot] = stage;
		moet_gpu_free(c->rows_dev[slot]);
		c->rows_dev[slot] = NULL;
		c->rows_bytes[slot] = 0;
		if ((rc = moet_gpu_alloc(bytes, &c->rows_dev[slot])))
			return rc;
		c->rows_bytes[slot] = bytes;
	}
	float **kb = c->host_stage[slot], **vb = kb + n_layers * n;
	int32_t *tok = (int32_t *)((char *)c->host_stage[slot] + ptrs), *pos = tok + n;
	int32_t *off = pos + n, *shift = off + n, *tab = shift + n;
	int64_t max_run = 0;
	for (int64_t t = 0, o = 0, run = 0; t < n; t++) {
		run = t > 0 && rows[t].blocks == rows[t - 1].blocks && rows[t].k == rows[t - 1].k ?
			      run + 1 : 1;
		max_run = run > max_run ? run : max_run;
		tok[t] = (int32_t)tokens[t];
		pos[t] = (int32_t)rows[t].pos;
		if (t == 0 || rows[t].blocks != rows[t - 1].blocks) {
			memcpy(tab + o, rows[t].blocks, (size_t)rows[t].n_blocks * sizeof(int32_t));
			o += rows[t].n_blocks;
		}
		off[t] = (int32_t)(o - rows[t].n_blocks);
		shift[t] = rows[t].block_shift;
		for (int64_t l = 0; l < n_layers; l++) {
			kb[l * n + t] = rows[t].k + l * rows[t].k_layer;
			/* the absorbed form has no V */
			vb[l * n + t] = rows[t].v ? rows[t].v + l * rows[t].v_layer : NULL;
		}
	}
	if (c->stream) {
		if ((rc = moet_gpu_copy_h2d_async(c->rows_dev[slot], c->host_stage[slot], bytes,
						  c->stream)) ||
		    (rc = moet_gpu_event_record(c->rows_ev[slot], c->stream)))
			return rc;
		c->rows_ev_used[slot] = 1;
	} else if ((rc = moet_gpu_copy_h2d(c->rows_dev[slot], c->host_stage[slot], bytes))) {
		return rc;
	}
	moet_rows *r = &c->rows[slot];
	r->kbase = c->rows_dev[slot];
	r->vbase = r->kbase + n_layers * n;
	r->tok = (int32_t *)((char *)c->rows_dev[slot] + ptrs);
	r->pos = r->tok + n;
	r->pages = (moet_gpu_pages){ .table = r->tok + 4 * n, .off = r->tok + 2 * n,
				     .shift = r->tok + 3 * n };
	r->n = n;
	r->max_run = max_run;
	*out = r;
	return 0;
}

static int cu_embed(moet_backend *be, const moet_mat *table, const moet_rows *rows, int64_t n,
		    float *x)
{
	(void)be;
	return moet_gpu_embed(table, rows->tok, n, x, NULL);
}

static int cu_rmsnorm(moet_backend *be, const float *x, int64_t x_stride, const float *w,
		      int64_t n, int64_t dim, double eps, float *out, int64_t out_stride)
{
	(void)be;
	return moet_gpu_rmsnorm(x, x_stride, w, dim, n, eps, out, out_stride, NULL);
}

static int cu_linear(moet_backend *be, const moet_mat *w, const float *x, int64_t x_stride,
		     int64_t n, float *y, int64_t y_stride)
{
	(void)be;
	return moet_gpu_linear(w, x, x_stride, n, y, y_stride, NULL);
}

static int cu_add(moet_backend *be, float *x, const float *y, int64_t n_elems)
{
	(void)be;
	return moet_gpu_add(x, y, n_elems, NULL);
}

static int cu_rope(moet_backend *be, float *x, int64_t x_stride, int64_t head_stride,
		   int64_t n_heads, int64_t n, const moet_rows *rows, const float *inv_freq,
		   int64_t n_freq, float attn_factor, int interleave)
{
	(void)be;
	if (n_heads == 1)
		head_stride = 2 * n_freq; /* unused with one head; gpu/rope.cu checks overlap */
	return moet_gpu_rope(x, n, x_stride, n_heads, head_stride, n_freq, rows->pos, inv_freq,
			     attn_factor, interleave, NULL);
}

static int cu_kv_store(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *kvb,
		       int64_t kvb_stride, const float *k_pe, int64_t k_pe_stride, int64_t n,
		       const moet_rows *rows)
{
	(void)be;
	const int64_t qk = d->nope + d->rope;
	return moet_gpu_kv_write(kvb, kvb_stride, k_pe, k_pe_stride, n, d->n_heads, d->nope,
				 d->rope, d->v_dim, rows->kbase + l * rows->n,
				 rows->vbase + l * rows->n, d->n_heads * qk, d->n_heads * d->v_dim,
				 rows->pos, &rows->pages, NULL);
}

static int cu_attend(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *q,
		     int64_t q_stride, int64_t n, const moet_rows *rows, float *out,
		     int64_t out_stride)
{
	(void)be;
	const int64_t qk = d->nope + d->rope;
	return moet_gpu_attention(q, q_stride, n, d->n_heads, qk, d->v_dim,
				  rows->kbase + l * rows->n, rows->vbase + l * rows->n,
				  d->n_heads * qk, d->n_heads * d->v_dim, rows->pos, &rows->pages,
				  rows->max_run, d->softmax_scale, out, out_stride, NULL);
}

static int cu_kv_store_latent(moet_backend *be, int64_t l, const float *kva, int64_t kva_stride,
			      int64_t width, int64_t n, const moet_rows *rows)
{
	(void)be;
	return moet_gpu_kv_write_latent(kva, kva_stride, width, n, rows->kbase + l * rows->n,
					width, rows->pos, &rows->pages, NULL);
}

static int cu_attend_latent(moet_backend *be, const moet_attn_dims *d, const moet_mat *kv_b,
			    int64_t l, const float *q, int64_t q_stride, int64_t n,
			    const moet_rows *rows, float *out, int64_t out_stride)
{
	(void)be;
	return moet_gpu_attention_latent(q, q_stride, n, d->n_heads, d->nope, d->rope, d->v_dim,
					 kv_b, rows->kbase + l * rows->n, kv_b->cols + d->rope,
					 rows->pos, &rows->pages, d->softmax_scale, out, out_stride,
					 NULL);
}

static int cu_route(moet_backend *be, const moet_config *c, const float *logits,
		    const float *bias, int64_t n, int32_t *ids, float *weights)
{
	(void)be;
	return moet_gpu_router(logits, n, c->n_routed_experts, bias, c->n_group, c->topk_group,
			       c->num_experts_per_tok, c->norm_topk_prob,
			       (float)c->routed_scaling_factor, ids, weights, NULL);
}

/* Grow-only device scratch of the selected stream: expert h rows and the pair token table;
 * and the shared iota. NOTE: a buffer freed to grow may still be read by work queued on
 * another stream: moet_gpu_free (cudaFree) waits for the device first. */
static int ensure_pairs(cuda_be *c, int64_t pairs, int64_t inter)
{
	cu_half *hf = cur_half(c);
	size_t need = moet_gpu_expert_scratch_bytes(pairs, inter);
	int rc;
	if (need > hf->scratch_bytes) {
		moet_gpu_free(hf->scratch);
		hf->scratch = NULL;
		hf->scratch_bytes = 0;
		if ((rc = moet_gpu_alloc(need, &hf->scratch)))
			return rc;
		hf->scratch_bytes = need;
	}
	if (pairs > hf->cap_pairs) {
		moet_gpu_free(hf->pair_tok);
		hf->pair_tok = NULL;
		hf->cap_pairs = 0;
		if ((rc = moet_gpu_alloc((size_t)pairs * sizeof(int32_t), (void **)&hf->pair_tok)))
			return rc;
		hf->cap_pairs = pairs;
	}
	if (pairs > c->cap_iota) {
		int32_t *iota = malloc((size_t)pairs * sizeof(*iota));
		if (!iota)
			return moet_err(MOET_ENOMEM, "iota");
		for (int64_t i = 0; i < pairs; i++)
			iota[i] = (int32_t)i;
		moet_gpu_free(c->iota);
		c->iota = NULL;
		c->cap_iota = 0;
		rc = moet_gpu_alloc((size_t)pairs * sizeof(int32_t), (void **)&c->iota);
		if (!rc) /* synchronous, on the legacy stream: done before any use */
			rc = moet_gpu_copy_h2d(c->iota, iota, (size_t)pairs * sizeof(int32_t));
		free(iota);
		if (rc)
			return rc;
		c->cap_iota = pairs;
	}
	return 0;
}

/* ---- issue 4: fast expert mode and device sampling ---------------------------------------- */

/* Grow-only device buffer: *p holds at least `need` bytes afterwards. */
static int grow(void **p, size_t *bytes, size_t need)
{
	if (need <= *bytes)
		return 0;
	moet_gpu_free(*p);
	*p = NULL;
	*bytes = 0;
	int rc = moet_gpu_alloc(need, p);
	if (!rc)
		*bytes = need;
	return rc;
}

/* The grouped call in the mode MOET_GPU_EXPERT_MODE asks for (read at every call): exact
 * (moet_gpu_expert_ffn) or fast (tensor cores for experts of MOET_GPU_FAST_MIN_TOK+ tokens,
 * docs/fast-mode.md). The selected stream's pair_tok holds the pairs' tokens. */
static int grouped_call(cuda_be *c, const moet_gpu_expert *ge, int n_exp, const float *h,
			int64_t n, float *y)
{
	cu_half *hf = cur_half(c);
	int fast = 0, rc = moet_gpu_expert_mode(&fast);
	int64_t min_tok = 0, pairs = 0;
	if (rc)
		return rc;
	if (!fast)
		return moet_gpu_expert_ffn(ge, n_exp, h, n, hf->pair_tok, hf->scratch,
					   hf->scratch_bytes, y, NULL);
	for (int e = 0; e < n_exp; e++)
		pairs += ge[e].n_tok;
	if ((rc = moet_gpu_fast_min_tok(&min_tok)) || (!c->fast && (rc = moet_gpu_fast_create(
								     &c->fast))) ||
	    (rc = grow(&hf->fast_scratch, &hf->fast_bytes, moet_gpu_expert_fast_scratch_bytes(
				pairs, ge[0].gate.rows, ge[0].gate.cols))))
		return rc;
	return moet_gpu_expert_ffn_fast(c->fast, ge, n_exp, h, n, hf->pair_tok, min_tok,
					hf->fast_scratch, hf->fast_bytes, y, NULL);
}

/* The backend's sample op (moet_backend_draw): gpu/sample.cu on the logits in place; only the
 * ids come back. */
static int cu_sample(moet_backend *be, const float *logits, int64_t V, const moet_draw *d,
		     int64_t n)
{
	cuda_be *c = impl(be);
	moet_gpu_sample_row *rows = malloc((size_t)n * sizeof(*rows));
	int32_t *ids = malloc((size_t)n * sizeof(*ids));
	size_t need = 0, ids_bytes = (size_t)c->smp_cap * sizeof(int32_t);
	int rc = (!rows || !ids) ? moet_err(MOET_ENOMEM, "sampling %lld rows", (long long)n) : 0;
	if (!rc && !(rc = moet_gpu_sample_scratch_bytes(n, V, &need)) &&
	    !(rc = grow(&c->smp_scratch, &c->smp_bytes, need))) {
		rc = grow((void **)&c->smp_ids, &ids_bytes, (size_t)n * sizeof(int32_t));
		c->smp_cap = (int64_t)(ids_bytes / sizeof(int32_t)); /* 0 after a failed grow */
	}
	if (!rc) {
		for (int64_t r = 0; r < n; r++)
			rows[r] = (moet_gpu_sample_row){ .temperature = d[r].p->temperature,
				.top_p = d[r].p->top_p, .top_k = d[r].p->top_k, .seed = d[r].p->seed,
				.pos = d[r].pos, .row = d[r].row };
		if (!(rc = moet_gpu_sample(logits, n, V, V, rows, c->smp_scratch, c->smp_bytes,
					   c->smp_ids, NULL, NULL)) &&
		    !(rc = moet_gpu_copy_d2h(ids, c->smp_ids, (size_t)n * sizeof(*ids))))
			for (int64_t r = 0; r < n; r++)
				*d[r].out_id = ids[r];
	}
	free(rows);
	free(ids);
	return rc;
}

/* The grouped call's host tables for n pairs. The pinned token list is rewritten only after
 * its last copy has run (its event): the copy is asynchronous. */
static int ensure_group(cu_half *hf, int64_t n)
{
	int rc = 0;
	if (!hf->tok_ev && (rc = moet_gpu_event_create(&hf->tok_ev)))
		return rc;
	if (hf->tok_ev_used && (rc = moet_gpu_event_sync(hf->tok_ev)))
		return rc;
	hf->tok_ev_used = 0;
	if (n <= hf->cap_group)
		return 0;
	moet_gpu_host_free(hf->tok_pin);
	free(hf->ge);
	hf->tok_pin = NULL;
	hf->ge = NULL;
	hf->cap_group = 0;
	if ((rc = moet_gpu_host_alloc((size_t)n * sizeof(*hf->tok_pin), (void **)&hf->tok_pin)))
		return rc;
	if (!(hf->ge = malloc((size_t)n * sizeof(*hf->ge))))
		return moet_err(MOET_ENOMEM, "expert grouping of %lld pairs", (long long)n);
	hf->cap_group = n;
	return 0;
}

static int experts_grouped(cuda_be *c, const moet_ffn_w *table, const moet_expert_pair *pairs,
			   int64_t n_pairs, int64_t top_k, const float *h, int64_t n, float *y);

/* MOET_MB_PRIO=1 on a micro-batch stream: the call on the half's low-priority stream, after
 * the work queued on the half's stream, which then waits for it (the rows it reads and the y
 * it writes are touched by nothing else in between: the CPU tier's rows of y go up later, the
 * combine reads y after the wait). */
static int cu_experts_grouped(moet_backend *be, const moet_ffn_w *table,
			      const moet_expert_pair *pairs, int64_t n_pairs, int64_t top_k,
			      const float *h, int64_t n, float *y)
{
	cuda_be *c = impl(be);
	const int i = c->sel;
	if (!c->prio || i < 0 || n_pairs <= 0)
		return experts_grouped(c, table, pairs, n_pairs, top_k, h, n, y);
	void **ev = c->xs_ev[i];
	int rc = 0;
	if (!c->xs_stream[i] &&
	    (rc = moet_gpu_stream_create_blocking_prio(&c->xs_stream[i], -1)))
		return rc;
	for (int k = 0; k < 2 && !rc; k++)
		rc = ev[k] ? 0 : moet_gpu_event_create(&ev[k]);
	if (rc || (rc = moet_gpu_event_record(ev[0], c->mb_stream[i])) ||
	    (rc = moet_gpu_stream_wait_event(c->xs_stream[i], ev[0])))
		return rc;
	moet_gpu_set_thread_stream(c->xs_stream[i]);
	rc = experts_grouped(c, table, pairs, n_pairs, top_k, h, n, y);
	moet_gpu_set_thread_stream(c->mb_stream[i]);
	/* also after a failure: nothing of the call's may be left unjoined */
	const int rj = moet_gpu_event_record(ev[1], c->xs_stream[i]);
	rc = rc ? rc : rj;
	return rc ? rc : moet_gpu_stream_wait_event(c->mb_stream[i], ev[1]);
}

static int experts_grouped(cuda_be *c, const moet_ffn_w *table, const moet_expert_pair *pairs,
			   int64_t n_pairs, int64_t top_k, const float *h, int64_t n, float *y)
{
	cu_half *hf = cur_half(c);
	if (n_pairs <= 0)
		return 0;
	int n_exp = 0;
	int rc = ensure_group(hf, n_pairs);
	if (!rc)
		rc = ensure_pairs(c, n_pairs, table[pairs[0].expert].gate.rows);
	if (rc)
		return rc;
	int32_t *tok = hf->tok_pin;
	moet_gpu_expert *ge = hf->ge;
	for (int64_t q = 0; q < n_pairs; q++) {
		if (q == 0 || pairs[q].expert != pairs[q - 1].expert) {
			const moet_ffn_w *e = &table[pairs[q].expert];
			ge[n_exp++] = (moet_gpu_expert){ e->gate, e->up, e->down, 0 };
		}
		ge[n_exp - 1].n_tok++;
		tok[q] = (int32_t)(pairs[q].pair / top_k);
	}
	/* NOTE: on the thread's stream, as the kernels: they see the tokens, the host goes on */
	if ((rc = moet_gpu_copy_h2d_async(hf->pair_tok, tok, (size_t)n_pairs * sizeof(*tok),
					  NULL)) ||
	    (rc = moet_gpu_event_record(hf->tok_ev, NULL)))
		return rc;
	hf->tok_ev_used = 1;
	return grouped_call(c, ge, n_exp, h, n, y); /* exact, or fast (MOET_GPU_EXPERT_MODE) */
}

static int cu_ffn(moet_backend *be, const moet_ffn_w *w, const float *h, int64_t n, float *out)
{
	cuda_be *c = impl(be);
	moet_gpu_expert e = { w->gate, w->up, w->down, n };
	int rc = ensure_pairs(c, n, w->gate.rows);
	if (rc)
		return rc;
	cu_half *hf = cur_half(c);
	/* a few tokens through gpu/linear_ks.cu where MOET_GPU_LINEAR sends all three matrices */
	int taken = 0;
	rc = moet_gpu_ffn_ks(&w->gate, &w->up, &w->down, h, w->gate.cols, n, (float *)hf->scratch,
			     hf->scratch_bytes, out, w->down.rows, NULL, &taken);
	if (rc || taken)
		return rc;
	return moet_gpu_expert_ffn(&e, 1, h, n, c->iota, hf->scratch, hf->scratch_bytes, out, NULL);
}

static int cu_gate_up(moet_backend *be, const moet_mat *gate, const moet_mat *up,
		      const float *x, int64_t x_stride, int64_t n, float *h, int64_t h_stride)
{
	cuda_be *c = impl(be);
	int rc = ensure_pairs(c, n, 1);
	return rc ? rc : moet_gpu_gate_up(gate, up, x, x_stride, n, c->iota, h, h_stride, NULL);
}

static int cu_combine(moet_backend *be, const float *y, int64_t n_y, const int32_t *slot,
		      const float *weights, int64_t top_k, const float *shared, int64_t n,
		      int64_t dim, float *out)
{
	(void)be;
	return moet_gpu_combine(y, n_y, slot, weights, top_k, shared, n, dim, out, NULL);
}


static const moet_backend_ops cuda_ops = {
	.name = "cuda",
	.destroy = cu_destroy,
	.alloc = cu_alloc,
	.free = cu_free,
	.upload = cu_upload,
	.upload_async = cu_upload_async,
	.wait_word = cu_wait_word,
	.download_async = cu_download_async,
	.fence = moet_cu_fence,
	.fence_wait = moet_cu_fence_wait,
	.fence_done = moet_cu_fence_done,
	.download = cu_download,
	.copy = cu_copy,
	.host_alloc = cu_host_alloc,
	.host_free = cu_host_free,
	.bind_mat = cu_bind_mat,
	.bind_vec = cu_bind_vec,
	.prepare_rows = cu_prepare_rows,
	.embed = cu_embed,
	.rmsnorm = cu_rmsnorm,
	.linear = cu_linear,
	.add = cu_add,
	.rope = cu_rope,
	.kv_store = cu_kv_store,
	.attend = cu_attend,
	.kv_store_latent = cu_kv_store_latent,
	.attend_latent = cu_attend_latent,
	.route = cu_route,
	.experts_grouped = cu_experts_grouped,
	.ffn = cu_ffn,
	.gate_up = cu_gate_up,
	.combine = cu_combine,
	.sample = cu_sample, /* issue 4 */
	.capture_begin = moet_cu_capture_begin,
	.capture_end = moet_cu_capture_end,
	.graph_launch = moet_cu_graph_launch,
	.graph_free = moet_cu_graph_free,
	.mem_epoch = moet_cu_mem_epoch,
	.idle_mark = moet_cu_idle_mark,
	.idle_take = moet_cu_idle_take,
	.stream_select = moet_cu_stream_select,
	.stream_wait = moet_cu_stream_wait,
	.trace_point = moet_cu_trace_point,
	.trace_times = moet_cu_trace_times,
};

/* MOET_GPU_STREAM: legacy (default: the passes' work on the legacy default stream, as
 * before) or own (a blocking stream of the backend's own, which a CUDA graph can capture);
 * *out_own 0 or 1; MOET_EINVAL naming the value otherwise. */
int moet_backend_cuda_stream_switch(int *out_own)
{
	static const char *const names[] = { "legacy", "own" };
	int rc = moet_env_choice("MOET_GPU_STREAM", names, 2, out_own);
	/* MOET_CUDA_GRAPH=1 captures the passes: the stream must be capturable */
	return rc ? rc : moet_graph_needs("MOET_GPU_STREAM", "own", out_own);
}

int moet_backend_cuda_create(int device, moet_backend **out)
{
	static const char *const prios[] = { "0", "1" };
	const char *why = NULL;
	int own = 0, prio = 0;
	int rc = moet_backend_cuda_stream_switch(&own);
	if (!rc) /* MOET_MB_PRIO: read here, the streams' priorities are fixed when made */
		rc = moet_env_choice("MOET_MB_PRIO", prios, 2, &prio);
	if (rc)
		return rc;
	if (moet_gpu_count(&why) <= device)
		return moet_err(MOET_EDEVICE, "--device cuda: no CUDA device %d (%s)", device,
				why ? why : "fewer devices");
	cuda_be *c = calloc(1, sizeof(*c));
	if (!c)
		return moet_err(MOET_ENOMEM, "CUDA backend");
	c->device = device;
	c->sel = -1;
	c->prio = prio;
	if (own && ((rc = moet_gpu_stream_create_blocking(&c->stream)) ||
		    (rc = moet_gpu_event_create(&c->rows_ev[0])) ||
		    (rc = moet_gpu_event_create(&c->rows_ev[1])))) {
		moet_gpu_event_destroy(c->rows_ev[0]);
		moet_gpu_stream_destroy(c->stream);
		free(c);
		return rc;
	}
	c->be = (moet_backend){ .ops = &cuda_ops, .impl = c };
	*out = &c->be;
	return 0;
}
