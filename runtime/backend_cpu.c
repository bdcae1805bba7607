/*
 * backend_cpu.c: the CPU reference backend: host memory, the reference dense-path kernels of
 * cpu/ and the contract kernels through the variant table (moet_cpu_kernels_get(): AVX-512
 * where the CPU has it, bit-identical to the scalar reference; MOET_KERNEL_EXPERT=ref forces
 * the reference).
 *
 * NOTE: weights are not copied: bind_mat returns the checkpoint's own view (the mmap'd
 * bytes). The heavy ops (linear, the expert and dense FFNs) run on the CPU expert executor's
 * pinned team (cpu/moet_cpuexec.h) when there is more than one core: linear splits W's rows
 * over the workers, experts go to the executor as jobs grouped by expert. Every (row, token)
 * result is still computed by one thread in the contract's order, so the bits do not depend
 * on the thread count (MOET_CPU_THREADS=1 runs everything on the calling thread). The light
 * ops run on the calling thread, row after row. Scratch is grow-only and owned by the
 * backend: a backend serves one forward pass at a time.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_clock.h"
#include "moet_cpu.h"
#include "moet_cpuexec.h"
#include "moet_err.h"
#include "moet_expc.h"

#define CPU_EXEC_MAX_TOK 256 /* tokens per executor batch; larger calls go in pieces */

struct moet_rows {
	moet_rowinfo *info;
	int64_t *tokens;
	int64_t cap;
};

#define JOBS_BATCH 64 /* executor jobs handed over at once (an array on the stack) */

typedef struct cpu_be {
	moet_backend be;
	const moet_cpu_kernels *kern;
	moet_attend_fn attend; /* MOET_CPU_ATTN (moet_cpu_attend_choose) */
	moet_cpuexec *ex;     /* NULL: single-threaded */
	int max_jobs;
	float *scratch;
	size_t scratch_elems;
	moet_rows rows[2];    /* the current batch's row tables (a slot per micro-batch) */
	/* idle_mark / idle_take: this backend runs each op on the calling thread, so its idle
	 * time is the driver's wait itself (clock at the open mark, the sum since the take) */
	uint64_t idle_t0, idle_ns[MOET_IDLE_KINDS];
	int idle_open, idle_kind;
	/* stream_select, a test double of two micro-batch streams (MOET_MB_STREAMS=2): one
	 * thread runs everything in order, so nothing overlaps; the selections are recorded
	 * (moet_backend_cpu_streams) for tests of the driver's protocol, and so are stream_wait's
	 * waits of one half's stream for the other's */
	int st_sel;
	uint64_t st_selects, st_joins, st_waits;
	/* trace_point: the clock's readings since the last trace_times (grow-only) */
	uint64_t *tp;
	int64_t tp_n, tp_cap;
} cpu_be;

static cpu_be *impl(moet_backend *be)
{
	return (cpu_be *)be->impl;
}

#define ATTN_SPAN_MIN 4096 /* positions per worker the attention scratch holds at least */

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
	moet_cpuexec_destroy(c->ex);
	for (int i = 0; i < 2; i++) {
		free(c->rows[i].info);
		free(c->rows[i].tokens);
	}
	free(c->scratch);
	free(c->tp);
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

/* Every op has run when it returns: a fence is always reached. */
static int cpu_fence(moet_backend *be, int i)
{
	(void)be;
	return i < 0 || i >= MOET_BACKEND_FENCES ? moet_err(MOET_EINVAL, "CPU backend: fence %d", i)
						   : 0;
}

/* The ops run at once: the wait is here, on the calling thread (MOET_TIER_FINISH=queued's test
 * double: the same order, the driver blocking as without it). */
static int cpu_wait_word(moet_backend *be, const uint32_t *word, uint32_t value)
{
	(void)be;
	if (!word)
		return moet_err(MOET_EINVAL, "CPU backend: wait_word on NULL");
	while ((int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) < 0)
		sched_yield();
	return 0;
}

static int cpu_fence_done(moet_backend *be, int i, int *out_done)
{
	*out_done = 1;
	return cpu_fence(be, i);
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

static int cpu_prepare_rows(moet_backend *be, int slot, const moet_rowinfo *rows,
			    const int64_t *tokens, int64_t n, int64_t n_layers,
			    const moet_rows **out)
{
	if (slot < 0 || slot > 1)
		return moet_err(MOET_EINVAL, "row table slot %d (0 or 1)", slot);
	moet_rows *r = &impl(be)->rows[slot];
	(void)n_layers;
	if (n > r->cap) {
		moet_rowinfo *ni = realloc(r->info, (size_t)n * sizeof(*ni));
		if (ni)
			r->info = ni;
		int64_t *nt = realloc(r->tokens, (size_t)n * sizeof(*nt));
		if (nt)
			r->tokens = nt;
		if (!ni || !nt)
			return moet_err(MOET_ENOMEM, "row table of %lld rows", (long long)n);
		r->cap = n;
	}
	memcpy(r->info, rows, (size_t)n * sizeof(*rows));
	memcpy(r->tokens, tokens, (size_t)n * sizeof(*tokens));
	*out = r;
	return 0;
}

static int cpu_embed(moet_backend *be, const moet_mat *table, const moet_rows *rw, int64_t n,
		     float *x)
{
	(void)be;
	const int64_t H = table->cols;
	for (int64_t t = 0; t < n; t++) {
		const size_t off = (size_t)rw->tokens[t] * (size_t)H;
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

typedef struct linear_task {
	const moet_cpu_kernels *kern;
	const moet_mat *w;
	const float *x;
	int64_t x_stride, n;
	float *y;
	int64_t y_stride;
} linear_task;

/* Worker i of n takes a contiguous slice [*r0, *r1) of R rows (multiples of 16). */
static void row_slice(int64_t R, int worker, int n_workers, int64_t *r0, int64_t *r1)
{
	const int64_t chunk = ((R + n_workers - 1) / n_workers + 15) / 16 * 16;
	*r0 = chunk * worker;
	*r1 = *r0 + chunk < R ? *r0 + chunk : R;
}

static void linear_slice(void *arg, int worker, int n_workers)
{
	const linear_task *t = arg;
	int64_t r0, r1;
	row_slice(t->w->rows, worker, n_workers, &r0, &r1);
	if (r0 < r1)
		t->kern->rows(t->w, r0, r1, t->x, t->x_stride, t->n, t->y + r0, t->y_stride);
}

static int cpu_linear(moet_backend *be, const moet_mat *w, const float *x, int64_t x_stride,
		      int64_t n, float *y, int64_t y_stride)
{
	cpu_be *c = impl(be);
	linear_task t = { c->kern, w, x, x_stride, n, y, y_stride };
	/* NOTE: small products are not worth waking the team for */
	if (!c->ex || w->rows * w->cols * n < (1 << 18)) {
		linear_slice(&t, 0, 1);
		return 0;
	}
	return moet_cpuexec_run(c->ex, linear_slice, &t);
}

typedef struct gate_up_task {
	const moet_cpu_kernels *kern;
	const moet_mat *gate, *up;
	const float *x;
	int64_t x_stride, n;
	float *h;
	int64_t h_stride;
} gate_up_task;

/* As linear_slice, for the gate and up rows of h. */
static void gate_up_slice(void *arg, int worker, int n_workers)
{
	const gate_up_task *t = arg;
	int64_t r0, r1;
	row_slice(t->gate->rows, worker, n_workers, &r0, &r1);
	if (r0 < r1)
		t->kern->gate_up(t->gate, t->up, r0, r1, t->x, t->x_stride, t->n, t->h + r0,
				 t->h_stride);
}

static int cpu_gate_up(moet_backend *be, const moet_mat *gate, const moet_mat *up,
		       const float *x, int64_t x_stride, int64_t n, float *h, int64_t h_stride)
{
	cpu_be *c = impl(be);
	gate_up_task t = { c->kern, gate, up, x, x_stride, n, h, h_stride };
	if (!c->ex || 2 * gate->rows * gate->cols * n < (1 << 18)) {
		gate_up_slice(&t, 0, 1);
		return 0;
	}
	return moet_cpuexec_run(c->ex, gate_up_slice, &t);
}

static int cpu_add(moet_backend *be, float *x, const float *y, int64_t n_elems)
{
	(void)be;
	for (int64_t i = 0; i < n_elems; i++)
		x[i] = x[i] + y[i];
	return 0;
}

static int cpu_rope(moet_backend *be, float *x, int64_t x_stride, int64_t head_stride,
		    int64_t n_heads, int64_t n, const moet_rows *rw, const float *inv_freq,
		    int64_t n_freq, float attn_factor, int interleave)
{
	(void)be;
	const moet_rowinfo *rows = rw->info;
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
			const moet_rows *rw)
{
	(void)be;
	const moet_rowinfo *rows = rw->info;
	const int64_t qk = d->nope + d->rope, k_row = d->n_heads * qk, v_row = d->n_heads * d->v_dim;
	for (int64_t t = 0; t < n; t++) {
		const int64_t r = moet_kv_row(rows[t].blocks, rows[t].block_shift, rows[t].pos);
		float *krow = rows[t].k + l * rows[t].k_layer + r * k_row;
		float *vrow = rows[t].v + l * rows[t].v_layer + r * v_row;
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

/* One attention task: rows x heads items, each with `per` floats of scratch per worker. */
typedef struct attn_task {
	moet_attend_fn attend;  /* the expanded form's kernel */
	const moet_attn_dims *d;
	const moet_mat *kv_b;   /* NULL: expanded form */
	int64_t l, q_stride, out_stride, n, per;
	const float *q;
	const moet_rows *rw;
	float *out, *scratch;
} attn_task;

static void attn_items(void *arg, int worker, int n_workers)
{
	const attn_task *a = arg;
	const moet_attn_dims *d = a->d;
	const int64_t items = a->n * d->n_heads, qk = d->nope + d->rope;
	const int64_t lo = items * worker / n_workers, hi = items * (worker + 1) / n_workers;
	float *s = a->scratch + (size_t)worker * (size_t)a->per;
	for (int64_t it = lo; it < hi; it++) {
		const int64_t t = it / d->n_heads, h = it % d->n_heads;
		const moet_rowinfo *r = &a->rw->info[t];
		const float *qh = a->q + t * a->q_stride + h * qk;
		float *oh = a->out + t * a->out_stride + h * d->v_dim;
		if (a->kv_b) {
			const int64_t L = a->kv_b->cols;
			moet_attend_latent_ref(qh, qh + d->nope, a->kv_b, h, d->nope, d->v_dim, d->rope,
					       r->k + a->l * r->k_layer, L + d->rope, r->blocks,
					       r->block_shift, r->pos + 1, d->softmax_scale, s, oh);
		} else {
			const int64_t k_row = d->n_heads * qk, v_row = d->n_heads * d->v_dim;
			a->attend(qh, r->k + a->l * r->k_layer + h * qk, k_row,
				  r->v + a->l * r->v_layer + h * d->v_dim, v_row, r->blocks,
				  r->block_shift, r->pos + 1, qk, d->v_dim, d->softmax_scale, s, oh);
		}
	}
}

/* Runs an attention task on the team (or the calling thread), (row, head) items split in
 * contiguous ranges: each item is computed by one thread, so the bits do not depend on it. */
static int run_attention(moet_backend *be, attn_task *a)
{
	cpu_be *c = impl(be);
	int64_t max_pos = 0;
	for (int64_t t = 0; t < a->n; t++)
		max_pos = a->rw->info[t].pos + 1 > max_pos ? a->rw->info[t].pos + 1 : max_pos;
	const int workers = c->ex ? moet_cpuexec_n_threads(c->ex) : 1;
	/* NOTE: each worker's scores span the positions; the span is rounded up to a power of two
	 * of at least ATTN_SPAN_MIN, so that a decode, whose longest sequence grows a position per
	 * step, reallocates at doublings only (none below ATTN_SPAN_MIN positions) instead of at
	 * every step (tests/runtime/test_noalloc.c, with 8+ threads). */
	int64_t span = ATTN_SPAN_MIN;
	while (span < max_pos)
		span *= 2;
	a->per = span + (a->kv_b ? 2 * a->kv_b->cols : 0);
	a->scratch = scratch(be, (size_t)(workers * a->per));
	if (!a->scratch)
		return moet_err(MOET_ENOMEM, "attention scratch for %lld positions",
				(long long)max_pos);
	if (!c->ex || a->n * a->d->n_heads < 2) {
		attn_items(a, 0, 1);
		return 0;
	}
	return moet_cpuexec_run(c->ex, attn_items, a);
}

static int cpu_attend(moet_backend *be, const moet_attn_dims *d, int64_t l, const float *q,
		      int64_t q_stride, int64_t n, const moet_rows *rw, float *out,
		      int64_t out_stride)
{
	attn_task a = { .attend = impl(be)->attend, .d = d, .l = l, .q_stride = q_stride,
			.out_stride = out_stride, .n = n, .q = q, .rw = rw, .out = out };
	return run_attention(be, &a);
}

static int cpu_kv_store_latent(moet_backend *be, int64_t l, const float *kva,
			       int64_t kva_stride, int64_t width, int64_t n, const moet_rows *rw)
{
	(void)be;
	for (int64_t t = 0; t < n; t++) {
		const moet_rowinfo *r = &rw->info[t];
		const int64_t row = moet_kv_row(r->blocks, r->block_shift, r->pos);
		memcpy(r->k + l * r->k_layer + row * width, kva + t * kva_stride,
		       (size_t)width * sizeof(float));
	}
	return 0;
}

static int cpu_attend_latent(moet_backend *be, const moet_attn_dims *d, const moet_mat *kv_b,
			     int64_t l, const float *q, int64_t q_stride, int64_t n,
			     const moet_rows *rw, float *out, int64_t out_stride)
{
	attn_task a = { .d = d, .kv_b = kv_b, .l = l, .q_stride = q_stride,
			.out_stride = out_stride, .n = n, .q = q, .rw = rw, .out = out };
	return run_attention(be, &a);
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

/* Runs jobs on the team in batches of at most max_jobs jobs and CPU_EXEC_MAX_TOK tokens. */
static int run_jobs(cpu_be *c, const moet_cpuexec_job *jobs, int n_jobs)
{
	int at = 0;
	while (at < n_jobs) {
		int cnt = 0;
		int64_t tok = 0;
		while (at + cnt < n_jobs && cnt < c->max_jobs &&
		       tok + jobs[at + cnt].n_tok <= CPU_EXEC_MAX_TOK)
			tok += jobs[at + cnt++].n_tok;
		uint64_t ticket;
		int rc = moet_cpuexec_submit(c->ex, jobs + at, cnt, &ticket);
		if (!rc)
			rc = moet_cpuexec_wait(c->ex, ticket);
		if (rc)
			return rc;
		at += cnt;
	}
	return 0;
}

/* The pairs, expert by expert: each expert's rows gathered into one block, one executor job
 * per block (at most CPU_EXEC_MAX_TOK rows), computed in place in y. */
static int cpu_experts_grouped(moet_backend *be, const moet_ffn_w *table,
			       const moet_expert_pair *pairs, int64_t n_pairs, int64_t top_k,
			       const float *h, int64_t n, float *y)
{
	cpu_be *c = impl(be);
	int rc = 0;
	(void)n;
	if (n_pairs <= 0)
		return 0;
	const int64_t H = table[pairs[0].expert].gate.cols;
	for (int64_t q = 0; q < n_pairs; q++)
		memcpy(y + q * H, h + (pairs[q].pair / top_k) * H, (size_t)H * sizeof(float));
	if (!c->ex) {
		float *s = scratch(be, (size_t)table[pairs[0].expert].gate.rows);
		if (!s)
			return moet_err(MOET_ENOMEM, "expert scratch");
		for (int64_t q = 0; q < n_pairs && !rc; q++) {
			const moet_ffn_w *e = &table[pairs[q].expert];
			/* NOTE: x and y may alias in moet_expert_ffn (h is consumed first) */
			rc = moet_expert_ffn(c->kern, &e->gate, &e->up, &e->down, y + q * H, 1, s,
					     y + q * H);
		}
		return rc;
	}
	/* NOTE: jobs in batches of JOBS_BATCH from the stack, as cpu_ffn: nothing allocated per
	 * call (tests/runtime/test_noalloc.c); the jobs write disjoint rows, so the batching
	 * changes no bit */
	moet_cpuexec_job jobs[JOBS_BATCH];
	int n_jobs = 0;
	for (int64_t q = 0; q < n_pairs && !rc;) {
		const moet_ffn_w *e = &table[pairs[q].expert];
		int64_t cnt = 1;
		while (q + cnt < n_pairs && pairs[q + cnt].expert == pairs[q].expert &&
		       cnt < CPU_EXEC_MAX_TOK)
			cnt++;
		jobs[n_jobs++] = (moet_cpuexec_job){ e->gate, e->up, e->down, y + q * H, y + q * H,
						     cnt };
		q += cnt;
		if (n_jobs == JOBS_BATCH || q == n_pairs) {
			rc = run_jobs(c, jobs, n_jobs);
			n_jobs = 0;
		}
	}
	return rc;
}

static int cpu_ffn(moet_backend *be, const moet_ffn_w *w, const float *h, int64_t n, float *out)
{
	cpu_be *c = impl(be);
	const int64_t H = w->gate.cols;
	if (c->ex) {
		moet_cpuexec_job jobs[JOBS_BATCH];
		int n_jobs = 0;
		for (int64_t t = 0; t < n;) {
			int64_t cnt = n - t < CPU_EXEC_MAX_TOK ? n - t : CPU_EXEC_MAX_TOK;
			jobs[n_jobs++] = (moet_cpuexec_job){ w->gate, w->up, w->down, h + t * H,
							     out + t * H, cnt };
			t += cnt;
			if (n_jobs == JOBS_BATCH || t == n) {
				int rc = run_jobs(c, jobs, n_jobs);
				if (rc)
					return rc;
				n_jobs = 0;
			}
		}
		return 0;
	}
	float *s = scratch(be, (size_t)(n * w->gate.rows));
	if (!s)
		return moet_err(MOET_ENOMEM, "ffn scratch");
	return moet_expert_ffn(c->kern, &w->gate, &w->up, &w->down, h, n, s, out);
}

static int cpu_combine(moet_backend *be, const float *y, int64_t n_y, const int32_t *slot,
		       const float *weights, int64_t top_k, const float *shared, int64_t n,
		       int64_t dim, float *out)
{
	(void)be;
	for (int64_t t = 0; t < n; t++)
		for (int64_t j = 0; j < dim; j++) {
			float r = 0.0f;
			for (int64_t i = 0; i < top_k; i++) {
				const int64_t row = slot[t * top_k + i];
				r = MOET_FMA(weights[t * top_k + i],
					     row >= 0 && row < n_y ? y[row * dim + j] : 0.0f, r);
			}
			if (shared)
				r = r + shared[t * dim + j];
			out[t * dim + j] = moet_canon_nan(r);
		}
	return 0;
}

static int cpu_idle_mark(moet_backend *be, int resume, int kind)
{
	cpu_be *c = impl(be);
	if (c->idle_open != !!resume || (!resume && (kind < 0 || kind >= MOET_IDLE_KINDS)))
		return 0; /* a mark out of turn: dropped, as the CUDA backend's */
	const uint64_t t = moet_now_ns();
	if (resume) {
		c->idle_ns[c->idle_kind] += t - c->idle_t0;
	} else {
		c->idle_t0 = t;
		c->idle_kind = kind;
	}
	c->idle_open = !resume;
	return 0;
}

static int cpu_idle_take(moet_backend *be, double out_s[MOET_IDLE_KINDS])
{
	cpu_be *c = impl(be);
	for (int k = 0; k < MOET_IDLE_KINDS; k++) {
		out_s[k] = 1e-9 * (double)c->idle_ns[k];
		c->idle_ns[k] = 0;
	}
	c->idle_open = 0;
	return 0;
}

/* Trace points (MOET_TRACE): every op ran on this thread when it returned, so a point is the
 * clock's reading now. */
static int cpu_trace_point(moet_backend *be, int64_t *out_id)
{
	cpu_be *c = impl(be);
	if (c->tp_n == c->tp_cap) {
		const int64_t cap = c->tp_cap ? 2 * c->tp_cap : 1024;
		uint64_t *n = realloc(c->tp, (size_t)cap * sizeof(*n));
		if (!n)
			return moet_err(MOET_ENOMEM, "CPU backend: %lld trace points",
					(long long)cap);
		c->tp = n;
		c->tp_cap = cap;
	}
	c->tp[c->tp_n] = moet_now_ns();
	*out_id = c->tp_n++;
	return 0;
}

static int cpu_trace_times(moet_backend *be, int64_t n, uint64_t *out_ns)
{
	cpu_be *c = impl(be);
	if (n != c->tp_n) {
		const int64_t had = c->tp_n;
		c->tp_n = 0;
		return moet_err(MOET_EINVAL, "CPU backend: %lld trace points asked for, %lld queued",
				(long long)n, (long long)had);
	}
	if (n > 0)
		memcpy(out_ns, c->tp, (size_t)n * sizeof(*out_ns));
	c->tp_n = 0;
	return 0;
}

static int cpu_stream_select(moet_backend *be, int slot)
{
	cpu_be *c = impl(be);
	if (slot < -1 || slot > 1)
		return moet_err(MOET_EINVAL, "CPU backend: micro-batch stream %d", slot);
	if (slot < 0)
		c->st_joins++;
	else
		c->st_selects++;
	c->st_sel = slot;
	return 0;
}

static int cpu_stream_wait(moet_backend *be, int slot)
{
	cpu_be *c = impl(be);
	if (c->st_sel < 0 || slot != !c->st_sel)
		return moet_err(MOET_EINVAL, "CPU backend: micro-batch stream %d waits for %d",
				c->st_sel, slot);
	c->st_waits++;
	return 0;
}

static const moet_backend_ops cpu_ops = {
	.name = "cpu",
	.host_memory = 1,
	.destroy = cpu_destroy,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_copy,
	.download = cpu_copy,
	.download_async = cpu_copy,
	.fence = cpu_fence,
	.fence_wait = cpu_fence,
	.fence_done = cpu_fence_done,
	.wait_word = cpu_wait_word,
	.copy = cpu_copy,
	.host_alloc = cpu_alloc,
	.host_free = cpu_free,
	.bind_mat = cpu_bind_mat,
	.bind_vec = cpu_bind_vec,
	.prepare_rows = cpu_prepare_rows,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.linear = cpu_linear,
	.add = cpu_add,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.attend = cpu_attend,
	.kv_store_latent = cpu_kv_store_latent,
	.attend_latent = cpu_attend_latent,
	.route = cpu_route,
	.experts_grouped = cpu_experts_grouped,
	.ffn = cpu_ffn,
	.gate_up = cpu_gate_up,
	.combine = cpu_combine,
	.idle_mark = cpu_idle_mark,
	.idle_take = cpu_idle_take,
	.stream_select = cpu_stream_select,
	.stream_wait = cpu_stream_wait,
	.trace_point = cpu_trace_point,
	.trace_times = cpu_trace_times,
};

void moet_backend_cpu_streams(moet_backend *be, int *sel, uint64_t *selects, uint64_t *joins,
			      uint64_t *waits)
{
	const cpu_be *c = be && be->ops == &cpu_ops ? impl(be) : NULL;
	*sel = c ? c->st_sel : -1;
	*selects = c ? c->st_selects : 0;
	*joins = c ? c->st_joins : 0;
	*waits = c ? c->st_waits : 0;
}

int moet_backend_cpu_create(int n_threads, int64_t max_inter, moet_backend **out)
{
	cpu_be *c = calloc(1, sizeof(*c));
	if (!c)
		return moet_err(MOET_ENOMEM, "CPU backend");
	c->kern = moet_cpu_kernels_get();
	c->st_sel = -1;
	int rc_a = moet_cpu_attend_choose(&c->attend);
	if (rc_a) {
		free(c);
		return moet_err_prefix(rc_a, "CPU backend");
	}
	c->be = (moet_backend){ .ops = &cpu_ops, .impl = c };
	const char *env = getenv("MOET_CPU_THREADS");
	if (n_threads == 0 && env && env[0])
		n_threads = atoi(env);
	if (n_threads != 1) {
		c->max_jobs = 64;
		moet_cpuexec_opts o = { .node = MOET_TOPO_ALL_NODES, .n_threads = n_threads,
					.max_tok = CPU_EXEC_MAX_TOK, .max_inter = max_inter,
					.max_jobs = c->max_jobs, .kernels = c->kern };
		int rc = moet_cpuexec_create(&o, &c->ex);
		if (rc) {
			free(c);
			return moet_err_prefix(rc, "CPU backend: expert executor");
		}
		if (moet_cpuexec_n_threads(c->ex) < 2) {
			moet_cpuexec_destroy(c->ex);
			c->ex = NULL;
		}
	}
	*out = &c->be;
	return 0;
}
