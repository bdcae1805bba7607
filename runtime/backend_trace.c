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
 * Built on backend_wrap.c with the queued ops offered (queued copies, fences, streams, idle
 * marks, unlike the op times of backend_timed.c); no CUDA graph capture: a traced run replays
 * no graph.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_wrap.h"
#include "moet_backend.h"
#include "moet_err.h"
#include "moet_trace.h"

typedef struct tr_span {
	char key[40];
	int lane;
	int64_t p0, p1; /* the inner backend's points before and after */
} tr_span;

typedef struct trace_be {
	moet_backend *in;
	moet_trace *t;
	int lane;             /* the stream the next op goes on (stream_select) */
	tr_span *sp;          /* the spans queued since the last flush (grow-only) */
	int64_t n_sp, cap_sp, n_points;
	uint64_t *ns;         /* [cap_ns]: the points' times at a flush */
	int64_t cap_ns;
	int err;              /* a point failed: the flush reports it */
} trace_be;

/* The point before an op queued, and a span for it: its index, or -1 when either failed (the
 * op still runs; the flush reports the failure). */
static int64_t tr_pre(void *ctx, const char *key)
{
	trace_be *t = ctx;
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

static int tr_post(void *ctx, const char *key, int64_t i, int rc)
{
	trace_be *t = ctx;
	(void)key;
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

/* The driver's wait for a fence: a span on its lane, host clock. */
static void tr_host_wait(void *ctx, const char *key, uint64_t t0, uint64_t t1)
{
	(void)key;
	moet_trace_span(((trace_be *)ctx)->t, MOET_TRACE_DRIVER, "wait fence (routing copies)",
			t0, t1);
}

static void tr_selected(void *ctx, int slot)
{
	((trace_be *)ctx)->lane = MOET_TRACE_STREAM + (slot < 0 ? 0 : 1 + slot);
}

static void tr_destroy(void *ctx)
{
	trace_be *t = ctx;
	free(t->sp);
	free(t->ns);
	free(t);
}

static const moet_wrap_hooks trace_hooks = { .pre = tr_pre, .post = tr_post,
					     .host_wait = tr_host_wait, .selected = tr_selected,
					     .destroy = tr_destroy };

void moet_backend_trace_set(moet_backend *be, moet_trace *t)
{
	trace_be *tb = moet_backend_wrap_ctx(be, &trace_hooks);
	if (tb)
		tb->t = t;
}

int moet_backend_trace_flush(moet_backend *be)
{
	trace_be *t = moet_backend_wrap_ctx(be, &trace_hooks);
	if (!t)
		return moet_err(MOET_EINVAL, "MOET_TRACE: the backend is not traced");
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
	int rc = moet_backend_wrap(inner, &trace_hooks, t, 1, out);
	if (rc)
		free(t);
	return rc;
}
