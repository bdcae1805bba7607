/*
 * backend_wrap.c: a backend that forwards every op to another, with a hook before and after
 * each queued op (backend_wrap.h). The op times (backend_timed.c) and the timeline
 * (backend_trace.c) are such hooks; this file is the forwarding they share.
 */
#include "backend_wrap.h"

#include <stdio.h>
#include <stdlib.h>

#include "moet_clock.h"
#include "moet_err.h"

typedef struct wrap_be {
	moet_backend be;
	moet_backend *in;
	moet_backend_ops ops; /* the inner ops with ours in place */
	const moet_wrap_hooks *h;
	void *ctx;
} wrap_be;

static wrap_be *wb(moet_backend *be)
{
	return (wrap_be *)be->impl;
}

#define IN(be) (wb(be)->in)

/* An op between the hooks: pre's token goes to post, which returns the op's result. */
#define HOOKED(key, call)                                                                  \
	do {                                                                               \
		wrap_be *w_ = wb(be);                                                      \
		const int64_t tok_ = w_->h->pre(w_->ctx, key);                             \
		const int rc_ = w_->in->ops->call;                                         \
		return w_->h->post(w_->ctx, key, tok_, rc_);                               \
	} while (0)

static void wr_destroy(moet_backend *be)
{
	wrap_be *w = wb(be);
	if (w->h->destroy) /* first: it may free inner memory */
		w->h->destroy(w->ctx);
	moet_backend_destroy(w->in);
	free(w);
}

/* Memory and binding: forwarded without hooks (not queued work of a pass). */
static int wr_alloc(moet_backend *be, size_t b, void **o)
{
	return IN(be)->ops->alloc(IN(be), b, o);
}

static void wr_free(moet_backend *be, void *p)
{
	IN(be)->ops->free(IN(be), p);
}

static int wr_host_alloc(moet_backend *be, size_t b, void **o)
{
	return IN(be)->ops->host_alloc(IN(be), b, o);
}

static void wr_host_free(moet_backend *be, void *p)
{
	IN(be)->ops->host_free(IN(be), p);
}

static int wr_bind_mat(moet_backend *be, const moet_mat *h, moet_mat *o)
{
	return IN(be)->ops->bind_mat(IN(be), h, o);
}

static int wr_bind_vec(moet_backend *be, const float *h, int64_t n, const float **o)
{
	return IN(be)->ops->bind_vec(IN(be), h, n, o);
}

static uint64_t wr_mem_epoch(moet_backend *be)
{
	return IN(be)->ops->mem_epoch(IN(be));
}

static int wr_fence(moet_backend *be, int i)
{
	return IN(be)->ops->fence(IN(be), i);
}

static int wr_fence_done(moet_backend *be, int i, int *out_done)
{
	return IN(be)->ops->fence_done(IN(be), i, out_done);
}

static int wr_idle_mark(moet_backend *be, int resume, int kind)
{
	return IN(be)->ops->idle_mark(IN(be), resume, kind);
}

static int wr_idle_take(moet_backend *be, double out_s[MOET_IDLE_KINDS])
{
	return IN(be)->ops->idle_take(IN(be), out_s);
}

static int wr_stream_select(moet_backend *be, int slot)
{
	wrap_be *w = wb(be);
	int rc = w->in->ops->stream_select(w->in, slot);
	if (!rc && w->h->selected)
		w->h->selected(w->ctx, slot);
	return rc;
}

static int wr_stream_wait(moet_backend *be, int slot)
{
	return IN(be)->ops->stream_wait(IN(be), slot);
}

/* The queued work: each op between the hooks, keyed by its name (linear and ffn by shape). */
static int wr_upload(moet_backend *be, void *d, const void *s, size_t b)
{
	HOOKED("upload", upload(w_->in, d, s, b));
}

static int wr_download(moet_backend *be, void *d, const void *s, size_t b)
{
	HOOKED("download", download(w_->in, d, s, b));
}

static int wr_upload_async(moet_backend *be, void *d, const void *s, size_t b)
{
	HOOKED("upload_async", upload_async(w_->in, d, s, b));
}

static int wr_wait_word(moet_backend *be, const uint32_t *word, uint32_t value)
{
	HOOKED("wait_word", wait_word(w_->in, word, value));
}

static int wr_download_async(moet_backend *be, void *d, const void *s, size_t b)
{
	HOOKED("download_async", download_async(w_->in, d, s, b));
}

static int wr_fence_wait(moet_backend *be, int i)
{
	wrap_be *w = wb(be);
	if (!w->h->host_wait)
		HOOKED("fence_wait", fence_wait(w_->in, i));
	const uint64_t t0 = moet_now_ns();
	const int rc = w->in->ops->fence_wait(w->in, i);
	w->h->host_wait(w->ctx, "fence_wait", t0, moet_now_ns());
	return rc;
}

static int wr_copy(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	HOOKED("copy", copy(w_->in, dst, src, bytes));
}

static int wr_prepare_rows(moet_backend *be, int slot, const moet_rowinfo *rows,
			   const int64_t *tokens, int64_t n, int64_t n_layers, const moet_rows **out)
{
	HOOKED("prepare_rows", prepare_rows(w_->in, slot, rows, tokens, n, n_layers, out));
}

static int wr_embed(moet_backend *be, const moet_mat *table, const moet_rows *rows, int64_t n,
		    float *x)
{
	HOOKED("embed", embed(w_->in, table, rows, n, x));
}

static int wr_rmsnorm(moet_backend *be, const float *x, int64_t xs, const float *w, int64_t n,
		      int64_t dim, double eps, float *out, int64_t os)
{
	HOOKED("rmsnorm", rmsnorm(w_->in, x, xs, w, n, dim, eps, out, os));
}

static int wr_linear(moet_backend *be, const moet_mat *w, const float *x, int64_t xs, int64_t n,
		     float *y, int64_t ys)
{
	char key[48];
	snprintf(key, sizeof(key), "linear %lldx%lld", (long long)w->rows, (long long)w->cols);
	HOOKED(key, linear(w_->in, w, x, xs, n, y, ys));
}

static int wr_add(moet_backend *be, float *x, const float *y, int64_t n)
{
	HOOKED("add", add(w_->in, x, y, n));
}

static int wr_rope(moet_backend *be, float *x, int64_t xs, int64_t hs, int64_t nh, int64_t n,
		   const moet_rows *rows, const float *f, int64_t nf, float af, int il)
{
	HOOKED("rope", rope(w_->in, x, xs, hs, nh, n, rows, f, nf, af, il));
}

static int wr_kv_store(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *kvb,
		       int64_t kvs, const float *kpe, int64_t kps, int64_t n, const moet_rows *r)
{
	HOOKED("kv_store", kv_store(w_->in, d, l, kvb, kvs, kpe, kps, n, r));
}

static int wr_attend(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *q,
		     int64_t qs, int64_t n, const moet_rows *r, float *out, int64_t os)
{
	HOOKED("attend", attend(w_->in, d, l, q, qs, n, r, out, os));
}

static int wr_kv_store_latent(moet_backend *be, int64_t l, const float *kva, int64_t kvs,
			      int64_t w, int64_t n, const moet_rows *r)
{
	HOOKED("kv_store_latent", kv_store_latent(w_->in, l, kva, kvs, w, n, r));
}

static int wr_attend_latent(moet_backend *be, const moet_attn_dims *d, const moet_mat *kv_b,
			    int64_t l, const float *q, int64_t qs, int64_t n, const moet_rows *r,
			    float *out, int64_t os)
{
	HOOKED("attend_latent", attend_latent(w_->in, d, kv_b, l, q, qs, n, r, out, os));
}

static int wr_route(moet_backend *be, const moet_config *c, const float *lg, const float *bias,
		    int64_t n, int32_t *ids, float *w)
{
	HOOKED("route", route(w_->in, c, lg, bias, n, ids, w));
}

static int wr_experts_grouped(moet_backend *be, const moet_ffn_w *table,
			      const moet_expert_pair *pairs, int64_t np, int64_t k, const float *h,
			      int64_t n, float *y)
{
	HOOKED("experts_grouped", experts_grouped(w_->in, table, pairs, np, k, h, n, y));
}

static int wr_ffn(moet_backend *be, const moet_ffn_w *w, const float *h, int64_t n, float *out)
{
	char key[48];
	snprintf(key, sizeof(key), "ffn inter %lld", (long long)w->gate.rows);
	HOOKED(key, ffn(w_->in, w, h, n, out));
}

static int wr_gate_up(moet_backend *be, const moet_mat *gate, const moet_mat *up,
		      const float *x, int64_t xs, int64_t n, float *h, int64_t hs)
{
	char key[48];
	snprintf(key, sizeof(key), "gate_up %lldx%lld", (long long)gate->rows,
		 (long long)gate->cols);
	HOOKED(key, gate_up(w_->in, gate, up, x, xs, n, h, hs));
}

static int wr_combine(moet_backend *be, const float *y, int64_t n_y, const int32_t *slot,
		      const float *w, int64_t k, const float *shared, int64_t n, int64_t dim,
		      float *out)
{
	HOOKED("combine", combine(w_->in, y, n_y, slot, w, k, shared, n, dim, out));
}

static int wr_sample(moet_backend *be, const float *logits, int64_t V, const moet_draw *d,
		     int64_t n)
{
	HOOKED("sample", sample(w_->in, logits, V, d, n));
}

int moet_backend_wrap(moet_backend *inner, const moet_wrap_hooks *h, void *ctx, int queued,
		      moet_backend **out)
{
	wrap_be *w = calloc(1, sizeof(*w));
	if (!w)
		return moet_err(MOET_ENOMEM, "backend wrapper");
	const moet_backend_ops *in = inner->ops;
	w->in = inner;
	w->h = h;
	w->ctx = ctx;
	/* NOTE: from nothing, so that an op added to moet_backend_ops later is not handed out
	 * with the inner backend's signature (its callers would pass the wrapper) */
	w->ops = (moet_backend_ops){ .name = in->name, .host_memory = in->host_memory };
	moet_backend_ops *o = &w->ops;
	o->destroy = wr_destroy;
	o->alloc = wr_alloc;
	o->free = wr_free;
	o->upload = wr_upload;
	o->download = wr_download;
	o->host_alloc = wr_host_alloc;
	o->host_free = wr_host_free;
	o->bind_mat = wr_bind_mat;
	o->bind_vec = wr_bind_vec;
	o->prepare_rows = wr_prepare_rows;
	o->embed = wr_embed;
	o->rmsnorm = wr_rmsnorm;
	o->linear = wr_linear;
	o->copy = in->copy ? wr_copy : NULL;
	o->add = wr_add;
	o->rope = wr_rope;
	o->kv_store = wr_kv_store;
	o->attend = wr_attend;
	o->kv_store_latent = in->kv_store_latent ? wr_kv_store_latent : NULL;
	o->attend_latent = in->attend_latent ? wr_attend_latent : NULL;
	o->route = wr_route;
	o->experts_grouped = wr_experts_grouped;
	o->ffn = wr_ffn;
	o->gate_up = in->gate_up ? wr_gate_up : NULL;
	o->combine = wr_combine;
	o->sample = in->sample ? wr_sample : NULL;
	/* NOTE: the queued copies, fences, streams and idle marks only where asked for (the op
	 * times wait for every op: plain copies, one stream, no idle to tell); never CUDA graphs
	 * (a hook runs on the driving thread at every op, which a replay would skip) nor the
	 * inner backend's trace points (no nesting) */
	o->upload_async = queued && in->upload_async ? wr_upload_async : NULL;
	o->wait_word = queued && in->wait_word ? wr_wait_word : NULL;
	o->download_async = queued && in->download_async ? wr_download_async : NULL;
	o->fence = queued && in->fence ? wr_fence : NULL;
	o->fence_wait = queued && in->fence_wait ? wr_fence_wait : NULL;
	o->fence_done = queued && in->fence_done ? wr_fence_done : NULL;
	o->idle_mark = queued && in->idle_mark ? wr_idle_mark : NULL;
	o->idle_take = queued && in->idle_take ? wr_idle_take : NULL;
	o->stream_select = queued && in->stream_select ? wr_stream_select : NULL;
	o->stream_wait = queued && in->stream_select && in->stream_wait ? wr_stream_wait : NULL;
	o->mem_epoch = in->mem_epoch ? wr_mem_epoch : NULL;
	o->capture_begin = NULL;
	o->capture_end = NULL;
	o->graph_launch = NULL;
	o->graph_free = NULL;
	o->trace_point = NULL;
	o->trace_times = NULL;
	w->be = (moet_backend){ .ops = &w->ops, .impl = w };
	*out = &w->be;
	return 0;
}

void *moet_backend_wrap_ctx(moet_backend *be, const moet_wrap_hooks *h)
{
	return be && be->ops->destroy == wr_destroy && wb(be)->h == h ? wb(be)->ctx : NULL;
}

moet_backend *moet_backend_wrap_inner(moet_backend *be)
{
	return be && be->ops->destroy == wr_destroy ? wb(be)->in : NULL;
}
