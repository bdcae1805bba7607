/*
 * backend_timed.c: a backend that forwards every op to another and times it (MOET_OP_TIMES=1
 * at model open; `bench e2e --op-times` prints the table): where a step's time goes, op by op.
 *
 * After each op it waits for the inner backend (a 4-byte download, which on CUDA returns only
 * when everything queued before it has run), so each op's time is its own, launch and queueing
 * included. That serializes what would overlap (GPU work with the CPU tier): the figures
 * attribute time, they are not the step time. Linear ops are keyed by their weight's shape
 * (the lm_head apart from the attention projections).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_wrap.h"
#include "moet_backend.h"
#include "moet_clock.h"
#include "moet_err.h"

#define MAX_KEYS 96

typedef struct op_time {
	char key[48];
	double s;
	uint64_t calls;
} op_time;

typedef struct timed_be {
	moet_backend *in;
	void *probe;          /* 64 bytes of inner memory to download from */
	op_time t[MAX_KEYS];
	int n;
} timed_be;

static int64_t td_pre(void *ctx, const char *key)
{
	(void)ctx;
	(void)key;
	return (int64_t)moet_now_ns();
}

/* Waits for the inner backend, then charges the time since the op's start to its key. */
static int td_post(void *ctx, const char *key, int64_t t0, int rc)
{
	timed_be *t = ctx;
	char x[4];
	if (!rc && t->probe)
		rc = t->in->ops->download(t->in, x, t->probe, sizeof(x));
	const double s = 1e-9 * (double)(moet_now_ns() - (uint64_t)t0);
	int i = 0;
	while (i < t->n && strcmp(t->t[i].key, key))
		i++;
	if (i == t->n && t->n < MAX_KEYS)
		snprintf(t->t[t->n++].key, sizeof(t->t[0].key), "%s", key);
	if (i < t->n) {
		t->t[i].s += s;
		t->t[i].calls++;
	}
	return rc;
}

static void td_destroy(void *ctx)
{
	timed_be *t = ctx;
	if (t->probe)
		t->in->ops->free(t->in, t->probe);
	free(t);
}

static const moet_wrap_hooks timed_hooks = { .pre = td_pre, .post = td_post,
					     .destroy = td_destroy };

int moet_backend_timed_create(moet_backend *inner, moet_backend **out)
{
	timed_be *t = calloc(1, sizeof(*t));
	if (!t)
		return moet_err(MOET_ENOMEM, "timed backend");
	t->in = inner;
	int rc = inner->ops->alloc(inner, 64, &t->probe);
	/* NOTE: every op waited for: plain copies, one stream, no idle time to tell, no graph */
	if (rc || (rc = moet_backend_wrap(inner, &timed_hooks, t, 0, out))) {
		if (t->probe)
			inner->ops->free(inner, t->probe);
		free(t);
	}
	return rc;
}

static void reset_times(timed_be *t)
{
	memset(t->t, 0, sizeof(t->t));
	t->n = 0;
}

static int by_time(const void *a, const void *b)
{
	double x = ((const op_time *)a)->s, y = ((const op_time *)b)->s;
	return (x < y) - (x > y);
}

int moet_backend_timed_report(moet_backend *be, double per, FILE *f, int reset)
{
	timed_be *t = moet_backend_wrap_ctx(be, &timed_hooks);
	if (!t)
		return moet_err(MOET_EINVAL, "op times: the backend is not timed (MOET_OP_TIMES=1 "
				"at open)");
	if (!f) {
		if (reset)
			reset_times(t);
		return 0;
	}
	op_time sorted[MAX_KEYS];
	double total = 0;
	memcpy(sorted, t->t, (size_t)t->n * sizeof(op_time));
	qsort(sorted, (size_t)t->n, sizeof(op_time), by_time);
	for (int i = 0; i < t->n; i++)
		total += sorted[i].s;
	fprintf(f, "  %-28s %10s %8s %6s\n", "op (backend, waited for)", "ms/step", "calls", "share");
	for (int i = 0; i < t->n; i++)
		fprintf(f, "  %-28s %10.3f %8.1f %5.1f%%\n", sorted[i].key, 1e3 * sorted[i].s / per,
			(double)sorted[i].calls / per, total > 0 ? 100 * sorted[i].s / total : 0);
	fprintf(f, "  %-28s %10.3f\n", "sum", 1e3 * total / per);
	if (reset)
		reset_times(t);
	return 0;
}
