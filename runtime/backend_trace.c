/*
 * backend_trace.c: a backend that forwards every op to another and brackets each with the inner
 * backend's trace points (MOET_TRACE=FILE at model open: moet_trace.h), without waiting for
 * anything, so that the engine's overlap is what it would be; after each pass
 * moet_backend_trace_flush reads the points' times and writes one span per op on the lane of
 * the stream it was queued on (the pass's, or a micro-batch's: stream_select). An op's span runs
 * from its stream reaching the point queued before it (the work queued earlier done) to
 * reaching the one after it: where the stream had nothing queued the span starts late, so the
 * gaps between spans are the stream's idle time. Two event records per op cost the driving
 * thread a few microseconds each (the CUDA backend); the CPU backend's points are the clock's
 * readings around each call (its ops run on the calling thread).
 *
 * Unlike the timed backend (backend_timed.c) every optional op is forwarded (queued copies,
 * fences, streams, idle marks), except CUDA graph capture: a traced run replays no graph.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_clock.h"
#include "moet_err.h"
#include "moet_trace.h"

typedef struct tr_span {
	char key[40];
	int lane;
	int64_t p0, p1; /* the inner backend's points before and after */
} tr_span;

typedef struct trace_be {
	moet_backend be;
	moet_backend *in;
	moet_backend_ops ops; /* the inner ops with ours in place */
	moet_trace *t;
	int lane;             /* the stream the next op goes on (stream_select) */
	tr_span *sp;          /* the spans queued since the last flush (grow-only) */
	int64_t n_sp, cap_sp, n_points;
	uint64_t *ns;         /* [cap_ns]: the points' times at a flush */
	int64_t cap_ns;
	int err;              /* a point failed: the flush reports it and drops the pass's spans */
} trace_be;

static trace_be *trb(moet_backend *be)
{
	return (trace_be *)be->impl;
}

/* The point before an op queued, and a span for it: its index, or -1 when either failed (the
 * op still runs; the flush reports the failure). */
static int64_t open_span(trace_be *t, const char *key)
{
	if (t->n_sp == t->cap_sp) {
		const int64_t cap = t->cap_sp ? 2 * t->cap_sp : 1024;
		tr_span *n = realloc(t->sp, (size_t)cap * sizeof(*n));
		if (!n) {
			t->err = t->err ? t->err : moet_err(MOET_ENOMEM, "MOET_TRACE: %lld spans",
							     (long long)cap);
			return -1;
		}
		t->sp = n;
		t->cap_sp = cap;
	}
	tr_span *s = &t->sp[t->n_sp];
	snprintf(s->key, sizeof(s->key), "%s", key);
	s->lane = t->lane;
	int rc = t->in->ops->trace_point(t->in, &s->p0);
	if (rc) {
		t->err = t->err ? t->err : rc;
		return -1;
	}
	t->n_points++;
	return t->n_sp++;
}

static int close_span(trace_be *t, int64_t i, int rc)
{
	if (i < 0)
		return rc;
	int r = t->in->ops->trace_point(t->in, &t->sp[i].p1);
	if (r) {
		t->err = t->err ? t->err : r;
		t->n_sp = i; /* the span dropped; its first point stays counted */
		return rc;
	}
	t->n_points++;
	return rc;
}

#define FWD(key, call)                                                                     \
	do {                                                                               \
		trace_be *t_ = trb(be);                                                    \
		const int64_t i_ = open_span(t_, key);                                     \
		int rc_ = t_->in->ops->call;                                               \
		return close_span(t_, i_, rc_);                                            \
	} while (0)

static void tr_destroy(moet_backend *be);

void moet_backend_trace_set(moet_backend *be, moet_trace *t)
{
	if (be && be->ops->destroy == tr_destroy)
		trb(be)->t = t;
}

int moet_backend_trace_flush(moet_backend *be)
{
	if (!be || be->ops->destroy != tr_destroy)
		return moet_err(MOET_EINVAL, "MOET_TRACE: the backend is not traced");
	trace_be *t = trb(be);
	int rc = t->err;
	t->err = 0;
	if (t->n_points > t->cap_ns) {
		uint64_t *n = realloc(t->ns, (size_t)t->n_points * sizeof(*n));
		if (!n && !rc)
			rc = moet_err(MOET_ENOMEM, "MOET_TRACE: %lld points", (long long)t->n_points);
		if (n) {
			t->ns = n;
			t->cap_ns = t->n_points;
		}
	}
	/* NOTE: always read (and so reset) the inner points, also after a failure */
	const int64_t np = t->n_points <= t->cap_ns ? t->n_points : 0;
	int r = t->in->ops->trace_times(t->in, np, t->ns);
	rc = rc ? rc : r;
	for (int64_t i = 0; i < t->n_sp && !rc; i++) {
		const tr_span *s = &t->sp[i];
		if (s->p0 < np && s->p1 < np)
			moet_trace_span(t->t, s->lane, s->key, t->ns[s->p0], t->ns[s->p1]);
	}
	t->n_sp = 0;
	t->n_points = 0;
	return rc ? rc : moet_trace_error(t->t);
}

static void tr_destroy(moet_backend *be)
{
	trace_be *t = trb(be);
	moet_backend_destroy(t->in);
	free(t->sp);
	free(t->ns);
	free(t);
}

/* Memory and binding: forwarded, no span (not queued work of a pass). */
static int tr_alloc(moet_backend *be, size_t b, void **o)
{
	return trb(be)->in->ops->alloc(trb(be)->in, b, o);
}

static void tr_free(moet_backend *be, void *p)
{
	trb(be)->in->ops->free(trb(be)->in, p);
}

static int tr_host_alloc(moet_backend *be, size_t b, void **o)
{
	return trb(be)->in->ops->host_alloc(trb(be)->in, b, o);
}

static void tr_host_free(moet_backend *be, void *p)
{
	trb(be)->in->ops->host_free(trb(be)->in, p);
}

static int tr_bind_mat(moet_backend *be, const moet_mat *h, moet_mat *o)
{
	return trb(be)->in->ops->bind_mat(trb(be)->in, h, o);
}

static int tr_bind_vec(moet_backend *be, const float *h, int64_t n, const float **o)
{
	return trb(be)->in->ops->bind_vec(trb(be)->in, h, n, o);
}

static uint64_t tr_mem_epoch(moet_backend *be)
{
	return trb(be)->in->ops->mem_epoch(trb(be)->in);
}

static int tr_upload(moet_backend *be, void *d, const void *s, size_t b)
{
	FWD("upload", upload(t_->in, d, s, b));
}

static int tr_download(moet_backend *be, void *d, const void *s, size_t b)
{
	FWD("download", download(t_->in, d, s, b));
}

static int tr_upload_async(moet_backend *be, void *d, const void *s, size_t b)
{
	FWD("upload_async", upload_async(t_->in, d, s, b));
}

static int tr_download_async(moet_backend *be, void *d, const void *s, size_t b)
{
	FWD("download_async", download_async(t_->in, d, s, b));
}

static int tr_fence(moet_backend *be, int i)
{
	return trb(be)->in->ops->fence(trb(be)->in, i);
}

/* The driver's wait for a fence: a span on the driver's lane, host clock. */
static int tr_fence_wait(moet_backend *be, int i)
{
	trace_be *t = trb(be);
	const uint64_t t0 = moet_now_ns();
	int rc = t->in->ops->fence_wait(t->in, i);
	moet_trace_span(t->t, MOET_TRACE_DRIVER, "wait fence (routing copies)", t0, moet_now_ns());
	return rc;
}

static int tr_copy(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	FWD("copy", copy(t_->in, dst, src, bytes));
}

static int tr_prepare_rows(moet_backend *be, int slot, const moet_rowinfo *rows,
			   const int64_t *tokens, int64_t n, int64_t n_layers, const moet_rows **out)
{
	FWD("prepare_rows", prepare_rows(t_->in, slot, rows, tokens, n, n_layers, out));
}

static int tr_embed(moet_backend *be, const moet_mat *table, const moet_rows *rows, int64_t n,
		    float *x)
{
	FWD("embed", embed(t_->in, table, rows, n, x));
}

static int tr_rmsnorm(moet_backend *be, const float *x, int64_t xs, const float *w, int64_t n,
		      int64_t dim, double eps, float *out, int64_t os)
{
	FWD("rmsnorm", rmsnorm(t_->in, x, xs, w, n, dim, eps, out, os));
}

static int tr_linear(moet_backend *be, const moet_mat *w, const float *x, int64_t xs, int64_t n,
		     float *y, int64_t ys)
{
	char key[40];
	snprintf(key, sizeof(key), "linear %lldx%lld", (long long)w->rows, (long long)w->cols);
	FWD(key, linear(t_->in, w, x, xs, n, y, ys));
}

static int tr_add(moet_backend *be, float *x, const float *y, int64_t n)
{
	FWD("add", add(t_->in, x, y, n));
}

static int tr_rope(moet_backend *be, float *x, int64_t xs, int64_t hs, int64_t nh, int64_t n,
		   const moet_rows *rows, const float *f, int64_t nf, float af, int il)
{
	FWD("rope", rope(t_->in, x, xs, hs, nh, n, rows, f, nf, af, il));
}

static int tr_kv_store(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *kvb,
		       int64_t kvs, const float *kpe, int64_t kps, int64_t n, const moet_rows *r)
{
	FWD("kv_store", kv_store(t_->in, d, l, kvb, kvs, kpe, kps, n, r));
}

static int tr_attend(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *q,
		     int64_t qs, int64_t n, const moet_rows *r, float *out, int64_t os)
{
	FWD("attend", attend(t_->in, d, l, q, qs, n, r, out, os));
}

static int tr_kv_store_latent(moet_backend *be, int64_t l, const float *kva, int64_t kvs,
			      int64_t w, int64_t n, const moet_rows *r)
{
	FWD("kv_store_latent", kv_store_latent(t_->in, l, kva, kvs, w, n, r));
}

static int tr_attend_latent(moet_backend *be, const moet_attn_dims *d, const moet_mat *kv_b,
			    int64_t l, const float *q, int64_t qs, int64_t n, const moet_rows *r,
			    float *out, int64_t os)
{
	FWD("attend_latent", attend_latent(t_->in, d, kv_b, l, q, qs, n, r, out, os));
}

static int tr_route(moet_backend *be, const moet_config *c, const float *lg, const float *bias,
		    int64_t n, int32_t *ids, float *w)
{
	FWD("route", route(t_->in, c, lg, bias, n, ids, w));
}

static int tr_experts_grouped(moet_backend *be, const moet_ffn_w *table,
			      const moet_expert_pair *pairs, int64_t np, int64_t k, const float *h,
			      int64_t n, float *y)
{
	FWD("experts_grouped", experts_grouped(t_->in, table, pairs, np, k, h, n, y));
}

static int tr_ffn(moet_backend *be, const moet_ffn_w *w, const float *h, int64_t n, float *out)
{
	char key[40];
	snprintf(key, sizeof(key), "ffn inter %lld", (long long)w->gate.rows);
	FWD(key, ffn(t_->in, w, h, n, out));
}

static int tr_gate_up(moet_backend *be, const moet_mat *gate, const moet_mat *up,
		      const float *x, int64_t xs, int64_t n, float *h, int64_t hs)
{
	FWD("gate_up", gate_up(t_->in, gate, up, x, xs, n, h, hs));
}

static int tr_combine(moet_backend *be, const float *y, int64_t n_y, const int32_t *slot,
		      const float *w, int64_t k, const float *shared, int64_t n, int64_t dim,
		      float *out)
{
	FWD("combine", combine(t_->in, y, n_y, slot, w, k, shared, n, dim, out));
}

static int tr_sample(moet_backend *be, const float *logits, int64_t V, const moet_draw *d,
		     int64_t n)
{
	FWD("sample", sample(t_->in, logits, V, d, n));
}

static int tr_idle_mark(moet_backend *be, int resume, int kind)
{
	return trb(be)->in->ops->idle_mark(trb(be)->in, resume, kind);
}

static int tr_idle_take(moet_backend *be, double out_s[MOET_IDLE_KINDS])
{
	return trb(be)->in->ops->idle_take(trb(be)->in, out_s);
}

static int tr_stream_select(moet_backend *be, int slot)
{
	trace_be *t = trb(be);
	int rc = t->in->ops->stream_select(t->in, slot);
	if (!rc)
		t->lane = MOET_TRACE_STREAM + (slot < 0 ? 0 : 1 + slot);
	return rc;
}

int moet_backend_trace_create(moet_backend *inner, moet_trace *tr, moet_backend **out)
{
	const moet_backend_ops *in = inner->ops;
	if (!in->trace_point || !in->trace_times)
		return moet_err(MOET_EUNSUP, "MOET_TRACE: the %s backend has no trace points",
				in->name);
	trace_be *t = calloc(1, sizeof(*t));
	if (!t)
		return moet_err(MOET_ENOMEM, "traced backend");
	t->in = inner;
	t->t = tr;
	t->lane = MOET_TRACE_STREAM;
	t->ops = *in; /* name, host_memory */
	t->ops.destroy = tr_destroy;
	t->ops.alloc = tr_alloc;
	t->ops.free = tr_free;
	t->ops.upload = tr_upload;
	t->ops.download = tr_download;
	t->ops.upload_async = in->upload_async ? tr_upload_async : NULL;
	t->ops.download_async = in->download_async ? tr_download_async : NULL;
	t->ops.fence = in->fence ? tr_fence : NULL;
	t->ops.fence_wait = in->fence_wait ? tr_fence_wait : NULL;
	t->ops.copy = in->copy ? tr_copy : NULL;
	t->ops.host_alloc = tr_host_alloc;
	t->ops.host_free = tr_host_free;
	t->ops.bind_mat = tr_bind_mat;
	t->ops.bind_vec = tr_bind_vec;
	t->ops.prepare_rows = tr_prepare_rows;
	t->ops.embed = tr_embed;
	t->ops.rmsnorm = tr_rmsnorm;
	t->ops.linear = tr_linear;
	t->ops.add = tr_add;
	t->ops.rope = tr_rope;
	t->ops.kv_store = tr_kv_store;
	t->ops.attend = tr_attend;
	t->ops.kv_store_latent = in->kv_store_latent ? tr_kv_store_latent : NULL;
	t->ops.attend_latent = in->attend_latent ? tr_attend_latent : NULL;
	t->ops.route = tr_route;
	t->ops.experts_grouped = tr_experts_grouped;
	t->ops.ffn = tr_ffn;
	t->ops.gate_up = in->gate_up ? tr_gate_up : NULL;
	t->ops.combine = tr_combine;
	t->ops.sample = in->sample ? tr_sample : NULL;
	/* a traced run captures no graph: the points are queued by the driving thread */
	t->ops.capture_begin = NULL;
	t->ops.capture_end = NULL;
	t->ops.graph_launch = NULL;
	t->ops.graph_free = NULL;
	t->ops.mem_epoch = in->mem_epoch ? tr_mem_epoch : NULL;
	t->ops.idle_mark = in->idle_mark ? tr_idle_mark : NULL;
	t->ops.idle_take = in->idle_take ? tr_idle_take : NULL;
	t->ops.stream_select = in->stream_select ? tr_stream_select : NULL;
	t->ops.trace_point = NULL; /* no nesting */
	t->ops.trace_times = NULL;
	t->be = (moet_backend){ .ops = &t->ops, .impl = t };
	*out = &t->be;
	return 0;
}
