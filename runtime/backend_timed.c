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
#include <time.h>

#include "moet_backend.h"
#include "moet_err.h"

#define MAX_KEYS 96

typedef struct op_time {
	char key[48];
	double s;
	uint64_t calls;
} op_time;

typedef struct timed_be {
	moet_backend be;
	moet_backend *in;
	moet_backend_ops ops; /* the inner ops with ours in place */
	void *probe;          /* 64 bytes of inner memory to download from */
	op_time t[MAX_KEYS];
	int n;
} timed_be;

static timed_be *tb(moet_backend *be)
{
	return (timed_be *)be->impl;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for the inner backend, then charges the time since t0 to key. */
static int settle(timed_be *t, const char *key, double t0, int rc)
{
	char x[4];
	if (!rc && t->probe)
		rc = t->in->ops->download(t->in, x, t->probe, sizeof(x));
	double s = now_s() - t0;
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

#define FWD(key, call)                                                                     \
	do {                                                                               \
		timed_be *t_ = tb(be);                                                     \
		double t0_ = now_s();                                                      \
		int rc_ = t_->in->ops->call;                                               \
		return settle(t_, key, t0_, rc_);                                          \
	} while (0)

static void td_destroy(moet_backend *be)
{
	timed_be *t = tb(be);
	if (t->probe)
		t->in->ops->free(t->in, t->probe);
	moet_backend_destroy(t->in);
	free(t);
}

/* Memory and binding: forwarded untimed. */
static int td_alloc(moet_backend *be, size_t b, void **o)
{
	return tb(be)->in->ops->alloc(tb(be)->in, b, o);
}

static void td_free(moet_backend *be, void *p)
{
	tb(be)->in->ops->free(tb(be)->in, p);
}

static int td_host_alloc(moet_backend *be, size_t b, void **o)
{
	return tb(be)->in->ops->host_alloc(tb(be)->in, b, o);
}

static void td_host_free(moet_backend *be, void *p)
{
	tb(be)->in->ops->host_free(tb(be)->in, p);
}

static int td_bind_mat(moet_backend *be, const moet_mat *h, moet_mat *o)
{
	return tb(be)->in->ops->bind_mat(tb(be)->in, h, o);
}

static int td_bind_vec(moet_backend *be, const float *h, int64_t n, const float **o)
{
	return tb(be)->in->ops->bind_vec(tb(be)->in, h, n, o);
}

static int td_upload(moet_backend *be, void *d, const void *s, size_t b)
{
	FWD("upload", upload(t_->in, d, s, b));
}

static int td_download(moet_backend *be, void *d, const void *s, size_t b)
{
	FWD("download", download(t_->in, d, s, b));
}

static int td_prepare_rows(moet_backend *be, int slot, const moet_rowinfo *rows,
			   const int64_t *tokens, int64_t n, int64_t n_layers, const moet_rows **out)
{
	FWD("prepare_rows", prepare_rows(t_->in, slot, rows, tokens, n, n_layers, out));
}

static int td_embed(moet_backend *be, const moet_mat *table, const moet_rows *rows, int64_t n,
		    float *x)
{
	FWD("embed", embed(t_->in, table, rows, n, x));
}

static int td_rmsnorm(moet_backend *be, const float *x, int64_t xs, const float *w, int64_t n,
		      int64_t dim, double eps, float *out, int64_t os)
{
	FWD("rmsnorm", rmsnorm(t_->in, x, xs, w, n, dim, eps, out, os));
}

static int td_linear(moet_backend *be, const moet_mat *w, const float *x, int64_t xs, int64_t n,
		     float *y, int64_t ys)
{
	char key[48];
	snprintf(key, sizeof(key), "linear %lldx%lld", (long long)w->rows, (long long)w->cols);
	FWD(key, linear(t_->in, w, x, xs, n, y, ys));
}

static int td_copy(moet_backend *be, void *dst, const void *src, size_t bytes)
{
	FWD("copy", copy(t_->in, dst, src, bytes));
}

static int td_add(moet_backend *be, float *x, const float *y, int64_t n)
{
	FWD("add", add(t_->in, x, y, n));
}

static int td_rope(moet_backend *be, float *x, int64_t xs, int64_t hs, int64_t nh, int64_t n,
		   const moet_rows *rows, const float *f, int64_t nf, float af, int il)
{
	FWD("rope", rope(t_->in, x, xs, hs, nh, n, rows, f, nf, af, il));
}

static int td_kv_store(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *kvb,
		       int64_t kvs, const float *kpe, int64_t kps, int64_t n, const moet_rows *r)
{
	FWD("kv_store", kv_store(t_->in, d, l, kvb, kvs, kpe, kps, n, r));
}

static int td_attend(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *q,
		     int64_t qs, int64_t n, const moet_rows *r, float *out, int64_t os)
{
	FWD("attend", attend(t_->in, d, l, q, qs, n, r, out, os));
}

static int td_kv_store_latent(moet_backend *be, int64_t l, const float *kva, int64_t kvs,
			      int64_t w, int64_t n, const moet_rows *r)
{
	FWD("kv_store_latent", kv_store_latent(t_->in, l, kva, kvs, w, n, r));
}

static int td_attend_latent(moet_backend *be, const moet_attn_dims *d, const moet_mat *kv_b,
			    int64_t l, const float *q, int64_t qs, int64_t n, const moet_rows *r,
			    float *out, int64_t os)
{
	FWD("attend_latent", attend_latent(t_->in, d, kv_b, l, q, qs, n, r, out, os));
}

static int td_route(moet_backend *be, const moet_config *c, const float *lg, const float *bias,
		    int64_t n, int32_t *ids, float *w)
{
	FWD("route", route(t_->in, c, lg, bias, n, ids, w));
}

static int td_experts_grouped(moet_backend *be, const moet_ffn_w *table,
			      const moet_expert_pair *pairs, int64_t np, int64_t k, const float *h,
			      int64_t n, float *y)
{
	FWD("experts_grouped", experts_grouped(t_->in, table, pairs, np, k, h, n, y));
}

static int td_ffn(moet_backend *be, const moet_ffn_w *w, const float *h, int64_t n, float *out)
{
	char key[48];
	snprintf(key, sizeof(key), "ffn inter %lld", (long long)w->gate.rows);
	FWD(key, ffn(t_->in, w, h, n, out));
}

static int td_gate_up(moet_backend *be, const moet_mat *gate, const moet_mat *up,
		      const float *x, int64_t xs, int64_t n, float *h, int64_t hs)
{
	char key[48];
	snprintf(key, sizeof(key), "gate_up %lldx%lld", (long long)gate->rows,
		 (long long)gate->cols);
	FWD(key, gate_up(t_->in, gate, up, x, xs, n, h, hs));
}

static int td_combine(moet_backend *be, const float *y, int64_t n_y, const int32_t *slot,
		      const float *w, int64_t k, const float *shared, int64_t n, int64_t dim,
		      float *out)
{
	FWD("combine", combine(t_->in, y, n_y, slot, w, k, shared, n, dim, out));
}

static int td_sample(moet_backend *be, const float *logits, int64_t V, const moet_draw *d,
		     int64_t n)
{
	FWD("sample", sample(t_->in, logits, V, d, n));
}

int moet_backend_timed_create(moet_backend *inner, moet_backend **out)
{
	timed_be *t = calloc(1, sizeof(*t));
	if (!t)
		return moet_err(MOET_ENOMEM, "timed backend");
	const moet_backend_ops *in = inner->ops;
	t->in = inner;
	t->ops = *in; /* name, host_memory and any op left as it is */
	t->ops.destroy = td_destroy;
	t->ops.alloc = td_alloc;
	t->ops.free = td_free;
	t->ops.upload = td_upload;
	t->ops.download = td_download;
	t->ops.host_alloc = td_host_alloc;
	t->ops.host_free = td_host_free;
	t->ops.bind_mat = td_bind_mat;
	t->ops.bind_vec = td_bind_vec;
	t->ops.prepare_rows = td_prepare_rows;
	t->ops.embed = td_embed;
	t->ops.rmsnorm = td_rmsnorm;
	t->ops.linear = td_linear;
	t->ops.copy = in->copy ? td_copy : NULL;
	t->ops.add = td_add;
	t->ops.rope = td_rope;
	t->ops.kv_store = td_kv_store;
	t->ops.attend = td_attend;
	t->ops.kv_store_latent = in->kv_store_latent ? td_kv_store_latent : NULL;
	t->ops.attend_latent = in->attend_latent ? td_attend_latent : NULL;
	t->ops.route = td_route;
	t->ops.experts_grouped = td_experts_grouped;
	t->ops.ffn = td_ffn;
	t->ops.gate_up = in->gate_up ? td_gate_up : NULL;
	t->ops.combine = td_combine;
	t->ops.sample = in->sample ? td_sample : NULL;
	/* NOTE: the inner backend's other optional ops take the inner be, which the wrapper's
	 * callers do not hold: not offered (a timed run captures no graph, tells no idle time) */
	t->ops.upload_async = NULL; /* every op waited for: the plain copies */
	t->ops.download_async = NULL;
	t->ops.fence = NULL;
	t->ops.fence_wait = NULL;
	t->ops.capture_begin = NULL;
	t->ops.capture_end = NULL;
	t->ops.graph_launch = NULL;
	t->ops.graph_free = NULL;
	t->ops.mem_epoch = NULL;
	t->ops.idle_mark = NULL;
	t->ops.idle_take = NULL;
	t->be = (moet_backend){ .ops = &t->ops, .impl = t };
	int rc = in->alloc(inner, 64, &t->probe);
	if (rc) {
		free(t);
		return rc;
	}
	*out = &t->be;
	return 0;
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
	if (be->ops->destroy != td_destroy)
		return moet_err(MOET_EINVAL, "op times: the backend is not timed (MOET_OP_TIMES=1 "
				"at open)");
	timed_be *t = tb(be);
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
