/*
 * hybrid.c: the CPU tier of the hybrid engine: the routed experts a placement leaves on the
 * CPU, computed by the expert executor's pinned team from the checkpoint's mapped bytes while
 * the backend (a GPU) computes everything else.
 *
 *   begin   the h rows (backend memory) the tier's pairs use -> staging (host_alloc: pinned
 *           on CUDA), in ranges: rows no pair uses stay on the device unless the gap between
 *           two ranges costs less than a copy's latency (gap bytes < pcie_latency x pcie, the
 *           cost model's figures: one copy instead of two); each pair's row gathered into y
 *           staging, expert by expert (the sorted order of moet_expert_pairs_sort); jobs
 *           submitted to the executor; returns at once
 *           (fetch then go: the driver may queue the device tiers in between,
 *           MOET_TIER_ORDER)
 *   ...     the caller queues the device tier and the shared experts on the backend
 *   finish  waits for the executor; the y staging rows go to the backend's y in one copy,
 *           queued on the backend (MOET_STEP_UPLOAD=async) or waited for
 *
 * Each (pair, row) result comes from the contract kernel in its fixed order, so the bits equal
 * the backend's and the simulated devices'. With overlap off (MOET_HYBRID_OVERLAP=0, the
 * reference path of this optimization) begin waits for the team itself, so nothing runs
 * beside it; the bits are the same either way (tests/runtime/test_hybrid_sim.c).
 *
 * Staging buffers and the job table grow to the largest batch seen and are kept: after the
 * first step of a given size nothing is allocated (ARCHITECTURE.md: nothing per token).
 * MOET_HYBRID_SLOTS calls may be in flight at once, one per slot (forward.c's micro-batches);
 * the executor runs their batches in submission order.
 *
 * Prefill staging (MOET_PREFILL_STAGE, docs/staging.md): a cold expert with many tokens in a
 * call can be cheaper on the GPU even counting the copy of its bytes (the cost model's
 * crossover, moet_cost_stage_min_rows). dispatch.c takes such experts out of the tier's
 * pairs and hands them to moet_hybrid_stage_run, which computes them from a ring of
 * staging slots (stage.c, the shadow check's mechanism) with the backend's kernel: the same
 * bits. The ring is made at the first staged expert and kept.
 *
 * Decode staging by balance (MOET_STAGE_BALANCE=1 or auto; unset: auto on one GPU, else off,
 * dispatch.c): the link is idle while a decode layer's CPU tier reads its cold experts, and a
 * batch-16 layer with three or four of them outlasts the GPU's own experts (docs/staging.md,
 * "Decode staging by balance"). With the balance, each call's cold experts are split between
 * the CPU tier and the staging slots by moet_hybrid_stage_pick (the split whose longer side,
 * CPU or link, the cost model prices shortest, and none where the GPU's own experts of the
 * layer take longer anyway), and dispatch.c page-locks the checkpoint's mappings at the
 * placement so that a staged expert's copy is one DMA from them (driver copies, no pinned
 * uploader).
 *
 * NOTE: the team is the executor of cpu/exec.c made for this model (MOET_CPU_THREADS, else
 * every core but one on a GPU backend: the thread that drives the GPU needs a core too). On
 * the CPU backend it stands beside the backend's own team (a test setting: the cores are
 * shared).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_int.h"
#include "moet_cost.h"
#include "moet_cpuexec.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_topo.h"
#include "moet_trace.h"

/* What each side keeps of its rate while the other runs (tests/gpu/probe_dma.sh on the H200
 * machine, record 2026-12-01-stage-balance-h200-85db4db.txt: the team's reads 94.3 -> 80.0
 * GB/s, the DMA from the page-locked mapping 55.0 -> 45.1 GB/s). */
#define STAGE_CPU_SHARE 0.85
#define STAGE_DMA_SHARE 0.82

#define HY_MAX_TOK 512   /* tokens per executor batch */
#define HY_MAX_JOBS 256  /* jobs per executor batch */
#define HY_MAX_PENDING 8 /* batches in flight */

enum { HY_STAGE_AUTO, HY_STAGE_NEVER, HY_STAGE_ALWAYS };

/* One call of the tier: a micro-batch of the pass (forward.c pipelines two). */
typedef struct hy_call {
	float *h_stage;           /* [cap_rows][H] host_alloc */
	float *y_stage;           /* [cap_pairs][H] host_alloc */
	int64_t cap_rows, cap_pairs;
	unsigned char *mark;      /* [cap_rows]: rows the pairs use */
	moet_cpuexec_job *jobs;   /* [cap_pairs] */
	moet_expert_pair *pairs_stage; /* [cap_pstage] host_alloc: the device-grouped form's */
	int64_t cap_pstage;
	int32_t *count_stage;     /* [1] host_alloc: its pair count, written by the device */
	moet_expert_pair *pairs;  /* [cap_pairs]: a fetched call's pairs (moet_hybrid_cpu_fetch) */
	const moet_ffn_w *table;  /* its expert table */
	const float *h_src;       /* its rows: h_stage, or the caller's host copy of h */
	int64_t fetched, top_k;   /* its pair count (0: none fetched) and top_k */
	uint64_t tickets[HY_MAX_PENDING];
	int n_tickets;
	float *y_dst;             /* backend y rows of the pending call */
	int64_t pending;          /* pairs of the pending call */
	uint64_t t_submit;        /* ns, begin's submit */
	uint64_t t_done;          /* ns, the tier's end when begin saw it (serial), else 0 */
	uint64_t t_first, t_last; /* ns, the team's span of the call's batches (first worker
				     start, last worker end), 0 before the first is waited for */
	int deferred;             /* its finish queued on the device (MOET_TIER_FINISH=queued):
				     its end still to collect (moet_hybrid_cpu_collect) */
} hy_call;

struct moet_hybrid {
	moet_cpuexec *ex;         /* NULL: compute on the calling thread */
	const moet_cpu_kernels *kern;
	int overlap;              /* 0: begin waits (MOET_HYBRID_OVERLAP=0) */
	float *scratch;           /* [HY_MAX_TOK][max_inter] (calling-thread path) */
	int64_t H, max_inter;
	hy_call call[MOET_HYBRID_SLOTS];
	moet_hybrid_stats st;
	size_t gap_bytes;         /* merge two row ranges when the gap is smaller */
	int stage_mode;           /* HY_STAGE_* (MOET_PREFILL_STAGE) */
	int64_t stage_min;        /* tokens from which a cold expert is staged; 0: never */
	int64_t n_experts;
	moet_stage *ring;         /* staging slots, made at the first staged expert */
	int stage_pinned;         /* MOET_STAGE_COPY: 1 pinned (waves), 0 driver */
	int stage_balance;        /* MOET_STAGE_BALANCE=1 or auto: each call's cold experts
				   * split by moet_hybrid_stage_pick */
	double link_base;         /* MOET_STAGE_LINK_PRICE */
	double link_price;        /* the pick's link times this: link_base, or under
				   * MOET_STAGE_BALANCE=auto the pass's arm times it */
	int price_auto;           /* MOET_STAGE_BALANCE=auto: the price set per pass */
	int balance_by_default;   /* the balance on with MOET_STAGE_BALANCE unset */
	moet_cost_in cost;        /* the hardware figures the pick prices with */
	struct moet_trace *trace; /* MOET_TRACE, or NULL */
	uint32_t *done_word;      /* host_alloc: the executor's finished tickets, which a queued
				     finish's device wait reads (moet_cpuexec_set_done_word); NULL
				     without an executor or a backend's wait_word */
};

void moet_hybrid_set_trace(moet_hybrid *hy, struct moet_trace *t)
{
	hy->trace = t;
}

int moet_hybrid_create(moet_backend *be, const moet_config *c, moet_hybrid **out)
{
	moet_hybrid *hy = calloc(1, sizeof(*hy));
	int rc = 0;
	if (!hy)
		return moet_err(MOET_ENOMEM, "hybrid engine");
	hy->H = c->hidden_size;
	hy->max_inter = c->moe_intermediate_size;
	hy->n_experts = c->n_routed_experts;
	hy->stage_mode = HY_STAGE_NEVER; /* until moet_hybrid_stage_setup */
	hy->kern = moet_cpu_kernels_get();
	static const char *const overlaps[] = { "1", "0" };
	int no_overlap = 0;
	if ((rc = moet_env_choice("MOET_HYBRID_OVERLAP", overlaps, 2, &no_overlap)))
		goto fail;
	hy->overlap = !no_overlap;
	int n_threads = 0;
	const char *env = getenv("MOET_CPU_THREADS");
	if (env && env[0])
		n_threads = atoi(env);
	if (n_threads == 0 && !be->ops->host_memory)
		n_threads = moet_topo_cores_but_one(); /* 0 (unknown): every core */
	if (n_threads != 1) {
		moet_cpuexec_opts o = { .node = MOET_TOPO_ALL_NODES, .n_threads = n_threads,
					.max_tok = HY_MAX_TOK, .max_inter = hy->max_inter,
					.max_jobs = HY_MAX_JOBS,
					.max_pending = HY_MAX_PENDING * MOET_HYBRID_SLOTS,
					.kernels = hy->kern };
		if ((rc = moet_cpuexec_create(&o, &hy->ex))) {
			rc = moet_err_prefix(rc, "hybrid engine: CPU expert executor");
			goto fail;
		}
		if (be->ops->wait_word) {
			if ((rc = be->ops->host_alloc(be, 64, (void **)&hy->done_word))) {
				rc = moet_err_prefix(rc, "hybrid engine: the tier's done word");
				goto fail;
			}
			*hy->done_word = 0; /* tickets start at 1 */
			moet_cpuexec_set_done_word(hy->ex, hy->done_word);
		}
	}
	if (!hy->ex && !(hy->scratch = malloc((size_t)HY_MAX_TOK * (size_t)hy->max_inter *
					       sizeof(float)))) {
		rc = moet_err(MOET_ENOMEM, "hybrid engine scratch");
		goto fail;
	}
	*out = hy;
	return 0;
fail:
	moet_hybrid_destroy(hy, be);
	return rc;
}

void moet_hybrid_destroy(moet_hybrid *hy, moet_backend *be)
{
	if (!hy)
		return;
	moet_cpuexec_destroy(hy->ex); /* finishes anything in flight first */
	moet_stage_destroy(hy->ring, be);
	for (int i = 0; i < MOET_HYBRID_SLOTS; i++) {
		be->ops->host_free(be, hy->call[i].h_stage);
		be->ops->host_free(be, hy->call[i].y_stage);
		be->ops->host_free(be, hy->call[i].pairs_stage);
		be->ops->host_free(be, hy->call[i].count_stage);
		free(hy->call[i].jobs);
		free(hy->call[i].pairs);
		free(hy->call[i].mark);
	}
	free(hy->scratch);
	be->ops->host_free(be, hy->done_word); /* last: the team and the device are done with it */
	free(hy);
}

static int grow(const moet_hybrid *hy, hy_call *cl, moet_backend *be, int64_t rows,
		int64_t pairs)
{
	const size_t row_bytes = (size_t)hy->H * sizeof(float);
	int rc;
	if (rows > cl->cap_rows) {
		be->ops->host_free(be, cl->h_stage);
		free(cl->mark);
		cl->h_stage = NULL;
		cl->cap_rows = 0;
		if (!(cl->mark = malloc((size_t)rows)))
			return moet_err(MOET_ENOMEM, "hybrid engine: row marks of %lld rows",
					(long long)rows);
		if ((rc = be->ops->host_alloc(be, (size_t)rows * row_bytes, (void **)&cl->h_stage)))
			return moet_err_prefix(rc, "hybrid engine: staging of %lld rows",
					       (long long)rows);
		cl->cap_rows = rows;
	}
	if (pairs > cl->cap_pairs) {
		be->ops->host_free(be, cl->y_stage);
		free(cl->jobs);
		free(cl->pairs);
		cl->y_stage = NULL;
		cl->pairs = NULL;
		cl->cap_pairs = 0;
		if (!(cl->jobs = malloc((size_t)pairs * sizeof(*cl->jobs))) ||
		    !(cl->pairs = malloc((size_t)pairs * sizeof(*cl->pairs))))
			return moet_err(MOET_ENOMEM, "hybrid engine: %lld jobs", (long long)pairs);
		if ((rc = be->ops->host_alloc(be, (size_t)pairs * row_bytes,
					      (void **)&cl->y_stage)))
			return moet_err_prefix(rc, "hybrid engine: staging of %lld rows",
					       (long long)pairs);
		cl->cap_pairs = pairs;
	}
	return 0;
}

/* Waits for the oldest batch in flight. */
static int wait_oldest(moet_hybrid *hy, hy_call *cl)
{
	uint64_t t0 = 0, t1 = 0;
	int rc = moet_cpuexec_wait_span(hy->ex, cl->tickets[0], &t0, &t1);
	if (t0 && (!cl->t_first || t0 < cl->t_first))
		cl->t_first = t0;
	if (t1 > cl->t_last)
		cl->t_last = t1;
	memmove(cl->tickets, cl->tickets + 1, (size_t)(--cl->n_tickets) * sizeof(uint64_t));
	return rc;
}

static int wait_all(moet_hybrid *hy, hy_call *cl)
{
	int rc = 0;
	while (cl->n_tickets) {
		int r = wait_oldest(hy, cl);
		if (!rc)
			rc = r;
	}
	return rc;
}

/* Submits jobs[0..n_jobs) in executor batches (at most HY_MAX_JOBS jobs, HY_MAX_TOK tokens). */
static int submit_jobs(moet_hybrid *hy, hy_call *cl, int64_t n_jobs)
{
	int64_t at = 0;
	int rc = 0;
	while (at < n_jobs && !rc) {
		int cnt = 0;
		int64_t tok = 0;
		while (at + cnt < n_jobs && cnt < HY_MAX_JOBS &&
		       (cnt == 0 || tok + cl->jobs[at + cnt].n_tok <= HY_MAX_TOK))
			tok += cl->jobs[at + cnt++].n_tok;
		if (cl->n_tickets == HY_MAX_PENDING && (rc = wait_oldest(hy, cl)))
			break;
		rc = moet_cpuexec_submit(hy->ex, cl->jobs + at, cnt, &cl->tickets[cl->n_tickets]);
		if (!rc)
			cl->n_tickets++;
		at += cnt;
	}
	return rc;
}

/* The rows of h that pairs use, into h_stage at their own row index: ranges of used rows, two
 * ranges merged when the rows between them are fewer bytes than gap_bytes. */
static int download_rows(moet_hybrid *hy, hy_call *cl, moet_backend *be,
			 const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
			 int64_t n)
{
	const size_t row_bytes = (size_t)hy->H * sizeof(float);
	const int64_t gap = (int64_t)(hy->gap_bytes / row_bytes); /* rows a gap may span */
	memset(cl->mark, 0, (size_t)n);
	for (int64_t q = 0; q < cnt; q++)
		cl->mark[pairs[q].pair / top_k] = 1;
	int rc = 0;
	for (int64_t a = 0; a < n && !rc;) {
		if (!cl->mark[a]) {
			a++;
			continue;
		}
		int64_t b = a + 1; /* [a, b): a range ending on a used row */
		for (int64_t t = b; t < n && t - b <= gap; t++)
			if (cl->mark[t])
				b = t + 1;
		const size_t bytes = (size_t)(b - a) * row_bytes;
		rc = be->ops->download(be, cl->h_stage + a * hy->H, h + a * hy->H, bytes);
		hy->st.bytes_d2h += bytes;
		hy->st.d2h_copies++;
		a = b;
	}
	return rc;
}

/* The bytes an expert call reads: its three matrices' codes and block scales. */
static uint64_t ffn_bytes(const moet_ffn_w *e)
{
	const moet_mat *w[3] = { &e->gate, &e->up, &e->down };
	uint64_t b = 0;
	for (int i = 0; i < 3; i++)
		b += moet_mat_data_bytes(w[i]) + moet_mat_scale_bytes(w[i]);
	return b;
}

/* The call's jobs (the pairs' rows in y_stage, in place), expert by expert, started: submitted
 * to the team (waited for with overlap off), or computed here without one. */
static int start(moet_hybrid *hy, hy_call *cl, moet_hybrid_stats *st, const moet_ffn_w *table,
		 const moet_expert_pair *pairs, int64_t cnt)
{
	const int64_t H = hy->H;
	int64_t n_jobs = 0;
	int rc = 0;
	for (int64_t q = 0; q < cnt;) {
		int64_t k = 1;
		while (q + k < cnt && pairs[q + k].expert == pairs[q].expert && k < HY_MAX_TOK)
			k++;
		const moet_ffn_w *e = &table[pairs[q].expert];
		st->cpu_calls++;
		st->cpu_weight_bytes += ffn_bytes(e);
		cl->jobs[n_jobs++] = (moet_cpuexec_job){ e->gate, e->up, e->down,
							 cl->y_stage + q * H,
							 cl->y_stage + q * H, k };
		q += k;
	}
	cl->pending = cnt;
	cl->t_first = cl->t_last = 0;
	cl->t_submit = moet_now_ns();
	st->cpu_pairs += (uint64_t)cnt;
	if (!hy->ex) {
		for (int64_t j = 0; j < n_jobs && !rc; j++) {
			moet_cpuexec_job *jb = &cl->jobs[j];
			/* NOTE: x and y alias: moet_expert_ffn consumes h before writing y */
			rc = moet_expert_ffn(hy->kern, &jb->gate, &jb->up, &jb->down, jb->x,
					     jb->n_tok, hy->scratch, jb->y);
		}
	} else {
		rc = submit_jobs(hy, cl, n_jobs);
		if (!rc && !hy->overlap)
			rc = wait_all(hy, cl);
	}
	if (!hy->ex || !hy->overlap)
		cl->t_done = moet_now_ns(); /* the tier ran alone: its time is exact */
	if (rc) {
		int r = hy->ex ? wait_all(hy, cl) : 0;
		(void)r;
		cl->pending = 0;
	}
	return rc;
}

/* Waits for the call's team work; the stats of its end (the caller moves the rows). A
 * deferred call's end was the device's (MOET_TIER_FINISH=queued): its time ends at its last
 * worker's end, and the driver neither waited nor woke for it. */
static int end(moet_hybrid *hy, hy_call *cl, moet_hybrid_stats *st)
{
	uint64_t t0 = moet_now_ns();
	int rc = hy->ex ? wait_all(hy, cl) : 0;
	uint64_t t1 = moet_now_ns();
	const int deferred = cl->deferred;
	cl->deferred = 0;
	if (deferred && cl->t_last) {
		cl->t_done = cl->t_last;
		t0 = t1;
	}
	/* NOTE: overlapped, the tier's end is only seen here (an upper bound of its time) */
	st->ns_cpu += (cl->t_done ? cl->t_done : t1) - cl->t_submit;
	cl->t_done = 0;
	st->ns_wait += t1 - t0;
	if (hy->trace) { /* MOET_TRACE: the driver's wait, and the team's span */
		moet_trace_span(hy->trace, MOET_TRACE_DRIVER, "wait CPU tier", t0, t1);
		if (cl->t_first && cl->t_last >= cl->t_first)
			moet_trace_span(hy->trace, MOET_TRACE_CPU + (int)(cl - hy->call),
					"CPU tier", cl->t_first, cl->t_last);
	}
	/* the team's own span, and what stood around it: from the submit to its first worker,
	 * from its last worker to the driver's return when the driver was waiting by then */
	if (cl->t_first && cl->t_last >= cl->t_first && cl->t_first >= cl->t_submit) {
		st->ns_cpu_run += cl->t_last - cl->t_first;
		st->ns_cpu_start += cl->t_first - cl->t_submit;
		const uint64_t seen = t0 > cl->t_last ? t0 : cl->t_last;
		st->ns_cpu_wake += t1 > seen && !deferred ? t1 - seen : 0;
	}
	cl->t_first = cl->t_last = 0;
	st->bytes_h2d += (uint64_t)cl->pending * (uint64_t)hy->H * sizeof(float);
	st->calls++;
	return rc;
}

int moet_hybrid_cpu_fetch(moet_hybrid *hy, int slot, moet_backend *be, const moet_ffn_w *table,
			  const moet_expert_pair *pairs, int64_t cnt, int64_t top_k,
			  const float *h, const float *h_host, int64_t n, float *y_dst)
{
	if (slot < 0 || slot >= MOET_HYBRID_SLOTS)
		return moet_err(MOET_EINVAL, "hybrid engine: slot %d", slot);
	hy_call *cl = &hy->call[slot];
	int rc;
	if (cl->deferred && (rc = moet_hybrid_cpu_collect(hy, slot)))
		return rc;
	if (cl->pending)
		return moet_err(MOET_EINVAL, "hybrid engine: begin with a call still in flight");
	cl->fetched = 0;
	if (cnt <= 0)
		return 0;
	if ((rc = grow(hy, cl, be, n, cnt)))
		return rc;
	uint64_t t0 = moet_now_ns();
	if (!h_host && (rc = download_rows(hy, cl, be, pairs, cnt, top_k, h, n)))
		return rc;
	hy->st.ns_d2h += moet_now_ns() - t0;
	cl->h_src = h_host ? h_host : cl->h_stage;
	memcpy(cl->pairs, pairs, (size_t)cnt * sizeof(*pairs));
	cl->table = table;
	cl->top_k = top_k;
	cl->y_dst = y_dst;
	cl->fetched = cnt;
	return 0;
}

void moet_hybrid_prewake(moet_hybrid *hy)
{
	if (hy)
		moet_cpuexec_prewake(hy->ex);
}

int moet_hybrid_cpu_go(moet_hybrid *hy, int slot)
{
	if (slot < 0 || slot >= MOET_HYBRID_SLOTS)
		return moet_err(MOET_EINVAL, "hybrid engine: slot %d", slot);
	hy_call *cl = &hy->call[slot];
	const int64_t H = hy->H, cnt = cl->fetched;
	const size_t row_bytes = (size_t)H * sizeof(float);
	if (!cnt)
		return 0;
	cl->fetched = 0;
	for (int64_t i = 0; i < cnt; i++)
		memcpy(cl->y_stage + i * H, cl->h_src + (cl->pairs[i].pair / cl->top_k) * H,
		       row_bytes);
	return start(hy, cl, &hy->st, cl->table, cl->pairs, cnt);
}

int moet_hybrid_cpu_begin(moet_hybrid *hy, int slot, moet_backend *be, const moet_ffn_w *table,
			  const moet_expert_pair *pairs, int64_t cnt, int64_t top_k,
			  const float *h, int64_t n, float *y_dst)
{
	int rc = moet_hybrid_cpu_fetch(hy, slot, be, table, pairs, cnt, top_k, h, NULL, n, y_dst);
	return rc ? rc : moet_hybrid_cpu_go(hy, slot);
}

int moet_hybrid_cpu_ready(moet_hybrid *hy, int slot)
{
	if (!hy || slot < 0 || slot >= MOET_HYBRID_SLOTS)
		return 1;
	const hy_call *cl = &hy->call[slot];
	/* NOTE: every batch of the call, not just the last: the team's batches may end in any
	 * order as far as this caller knows */
	for (int i = 0; cl->pending && hy->ex && i < cl->n_tickets; i++)
		if (!moet_cpuexec_done(hy->ex, cl->tickets[i]))
			return 0;
	return 1;
}

int moet_hybrid_cpu_collect(moet_hybrid *hy, int slot)
{
	if (!hy || slot < 0 || slot >= MOET_HYBRID_SLOTS || !hy->call[slot].deferred)
		return 0;
	hy_call *cl = &hy->call[slot];
	const int rc = end(hy, cl, &hy->st);
	cl->pending = 0;
	return rc;
}

int moet_hybrid_cpu_collect_all(moet_hybrid *hy)
{
	int rc = 0;
	for (int i = 0; hy && i < MOET_HYBRID_SLOTS; i++) {
		const int r = moet_hybrid_cpu_collect(hy, i);
		rc = rc ? rc : r;
	}
	return rc;
}

/* MOET_TIER_FINISH=queued: the device's stream waits for the call's last batch (the
 * executor's done word) and then copies the rows, all queued; the driver goes on, and
 * collects the call's end later (moet_hybrid_cpu_collect). With idle marks the stream's wait
 * lies between two marks of its own: the device's idle time for the tier (on the other path
 * the driver's wait). */
static int finish_queued(moet_hybrid *hy, hy_call *cl, moet_backend *be, size_t bytes,
			 int marks)
{
	const uint32_t last = (uint32_t)cl->tickets[cl->n_tickets - 1];
	uint64_t t1 = moet_now_ns();
	int rc = marks ? be->ops->idle_mark(be, 0, MOET_IDLE_TIER) : 0;
	if (!rc)
		rc = be->ops->wait_word(be, hy->done_word, last);
	if (marks) {
		const int r1 = be->ops->idle_mark(be, 1, MOET_IDLE_TIER);
		rc = rc ? rc : r1;
	}
	if (!rc)
		rc = be->ops->upload_async ? be->ops->upload_async(be, cl->y_dst, cl->y_stage, bytes)
					   : be->ops->upload(be, cl->y_dst, cl->y_stage, bytes);
	hy->st.ns_h2d += moet_now_ns() - t1;
	hy->st.queued_finishes++;
	cl->deferred = 1;
	if (rc) { /* the call's end collected now: nothing left in flight on a failure */
		const int r = moet_hybrid_cpu_collect(hy, (int)(cl - hy->call));
		(void)r;
	}
	return rc;
}

int moet_hybrid_cpu_finish(moet_hybrid *hy, int slot, moet_backend *be, int idle_marks,
			   int async, int queued)
{
	if (!hy || slot < 0 || slot >= MOET_HYBRID_SLOTS)
		return 0;
	hy_call *cl = &hy->call[slot];
	cl->fetched = 0; /* fetched and never started: a failed dispatch */
	if (cl->deferred) /* finished on the device already: its end collected */
		return moet_hybrid_cpu_collect(hy, slot);
	if (!cl->pending)
		return 0;
	const int marks = idle_marks && be->ops->idle_mark;
	if (queued && hy->done_word && hy->overlap && cl->n_tickets && be->ops->wait_word)
		return finish_queued(hy, cl, be, (size_t)cl->pending * (size_t)hy->H *
							 sizeof(float), marks);
	/* the device may run out of work while the driver waits here; it resumes before the
	 * rows' copy (PCIe time of its own) */
	int rm = marks ? be->ops->idle_mark(be, 0, MOET_IDLE_TIER) : 0;
	int rc = end(hy, cl, &hy->st);
	if (marks) {
		int r1 = be->ops->idle_mark(be, 1, MOET_IDLE_TIER);
		rm = rm ? rm : r1;
	}
	rc = rc ? rc : rm;
	uint64_t t1 = moet_now_ns();
	/* NOTE: queued (async), y_stage is next written at this slot's next go, after its
	 * fetch's download has returned */
	const size_t bytes = (size_t)cl->pending * (size_t)hy->H * sizeof(float);
	if (!rc)
		rc = async && be->ops->upload_async
			     ? be->ops->upload_async(be, cl->y_dst, cl->y_stage, bytes)
			     : be->ops->upload(be, cl->y_dst, cl->y_stage, bytes);
	hy->st.ns_h2d += moet_now_ns() - t1;
	cl->pending = 0;
	return rc;
}

/* ---- the device-grouped form (devgroup.c) ------------------------------------------------ */

int moet_hybrid_dev_prepare(moet_hybrid *hy, int slot, moet_backend *be, int64_t max_pairs,
			    moet_expert_pair **out_pairs, int32_t **out_count, float **out_rows)
{
	if (slot < 0 || slot >= MOET_HYBRID_SLOTS || max_pairs < 1)
		return moet_err(MOET_EINVAL, "hybrid engine: slot %d, %lld pairs", slot,
				(long long)max_pairs);
	hy_call *cl = &hy->call[slot];
	/* a call of today's path finished on the queue (MOET_TIER_FINISH=queued): its end before
	 * its buffers may be regrown */
	int rc = moet_hybrid_cpu_collect(hy, slot);
	if (!rc)
		rc = grow(hy, cl, be, 0, max_pairs);
	/* NOTE: its own capacity: begin on today's path grows the rest, not this */
	if (!rc && cl->cap_pstage < max_pairs) {
		be->ops->host_free(be, cl->pairs_stage);
		cl->pairs_stage = NULL;
		cl->cap_pstage = 0;
		if (!(rc = be->ops->host_alloc(be, (size_t)max_pairs * sizeof(*cl->pairs_stage),
					       (void **)&cl->pairs_stage)))
			cl->cap_pstage = max_pairs;
	}
	if (!rc && !cl->count_stage)
		rc = be->ops->host_alloc(be, sizeof(*cl->count_stage), (void **)&cl->count_stage);
	if (rc)
		return moet_err_prefix(rc, "hybrid engine: device-grouped staging");
	*out_pairs = cl->pairs_stage;
	*out_count = cl->count_stage;
	*out_rows = cl->y_stage;
	return 0;
}

/* A host function's failure, kept for moet_devgroup_check (the message is thread-local). */
static void dev_fail(moet_hybrid_dev *dc, int rc)
{
	if (rc && !dc->rc) {
		dc->rc = rc;
		snprintf(dc->msg, sizeof(dc->msg), "%s", moet_errmsg());
	}
}

void moet_hybrid_dev_begin(void *arg)
{
	moet_hybrid_dev *dc = arg;
	moet_hybrid *hy = dc->hy;
	hy_call *cl = &hy->call[dc->slot];
	const int64_t cnt = *(volatile int32_t *)cl->count_stage;
	if (cl->pending)
		dev_fail(dc, moet_err(MOET_EINVAL, "hybrid engine: begin with a call still in "
				      "flight"));
	else if (cnt < 0 || cnt > cl->cap_pairs || cnt > cl->cap_pstage)
		dev_fail(dc, moet_err(MOET_ERANGE, "hybrid engine: %lld CPU-tier pairs from the "
				      "device, room for %lld", (long long)cnt,
				      (long long)(cl->cap_pairs < cl->cap_pstage ? cl->cap_pairs
									 : cl->cap_pstage)));
	else if (cnt > 0) {
		dc->st.bytes_d2h += (uint64_t)cnt * (uint64_t)hy->H * sizeof(float);
		dev_fail(dc, start(hy, cl, &dc->st, dc->table, cl->pairs_stage, cnt));
	}
}

void moet_hybrid_dev_finish(void *arg)
{
	moet_hybrid_dev *dc = arg;
	moet_hybrid *hy = dc->hy;
	hy_call *cl = &hy->call[dc->slot];
	if (cl->pending)
		dev_fail(dc, end(hy, cl, &dc->st));
	cl->pending = 0;
}

void moet_hybrid_dev_collect(moet_hybrid_dev *dc)
{
	moet_hybrid_stats *a = &dc->hy->st;
	const moet_hybrid_stats *b = &dc->st;
	a->calls += b->calls;
	a->cpu_pairs += b->cpu_pairs;
	a->cpu_calls += b->cpu_calls;
	a->cpu_weight_bytes += b->cpu_weight_bytes;
	a->ns_cpu += b->ns_cpu;
	a->ns_wait += b->ns_wait;
	a->ns_cpu_run += b->ns_cpu_run;
	a->ns_cpu_start += b->ns_cpu_start;
	a->ns_cpu_wake += b->ns_cpu_wake;
	a->bytes_d2h += b->bytes_d2h;
	a->bytes_h2d += b->bytes_h2d;
	memset(&dc->st, 0, sizeof(dc->st));
}

void moet_hybrid_set_overlap(moet_hybrid *hy, int on)
{
	hy->overlap = on != 0;
}

void moet_hybrid_count_d2h(moet_hybrid *hy, uint64_t bytes)
{
	if (hy) {
		hy->st.bytes_d2h += bytes;
		hy->st.d2h_copies++;
	}
}

int moet_hybrid_overlapped(const moet_hybrid *hy)
{
	return hy && hy->overlap;
}

void moet_hybrid_get_stats(const moet_hybrid *hy, moet_hybrid_stats *out)
{
	if (hy)
		*out = hy->st;
	else
		memset(out, 0, sizeof(*out));
}

void moet_hybrid_reset_stats(moet_hybrid *hy)
{
	if (hy)
		memset(&hy->st, 0, sizeof(hy->st));
}

int moet_hybrid_stage_setup(moet_hybrid *hy, const moet_config *c, uint64_t expert_bytes,
			    int on_gpu, int balance_unset)
{
	const char *min = getenv("MOET_PREFILL_STAGE_MIN"), *hw_file = getenv("MOET_HARDWARE");
	moet_cost_in in = { .batch = 1, .top_k = c->num_experts_per_tok, .d_model = c->hidden_size,
			    .expert_bytes = expert_bytes, .n_gpus = 1,
			    .moe_inter = c->moe_intermediate_size };
	/* NOTE: unset, auto on a GPU (measured on the H200: an 8192-token prefill with the hot
	 * 120 of 384 experts on the GPU 30.2 s never, 21.0 s auto; docs/hybrid.md) and never on
	 * the CPU backend, whose simulated devices have no link to price */
	static const char *const modes[] = { "0", "1", "auto" };
	static const int mode_of[] = { HY_STAGE_NEVER, HY_STAGE_ALWAYS, HY_STAGE_AUTO };
	const char *v = getenv("MOET_PREFILL_STAGE");
	int mode = 0, rc = moet_env_choice("MOET_PREFILL_STAGE", modes, 3, &mode);
	if (rc)
		return rc;
	if ((rc = moet_stage_copy_pinned(on_gpu, &hy->stage_pinned)))
		return rc;
	hy->stage_mode = v && *v ? mode_of[mode] : on_gpu ? HY_STAGE_AUTO : HY_STAGE_NEVER;
	static const char *const bal[] = { NULL, "0", "1", "auto" }; /* NULL: unset or empty */
	int bi = 0;
	if ((rc = moet_env_choice("MOET_STAGE_BALANCE", bal, 4, &bi)))
		return rc;
	hy->balance_by_default = bi == 0 && balance_unset > 0;
	bi = bi ? bi - 1 : balance_unset; /* 0 off, 1, 2 auto */
	hy->stage_balance = bi > 0;
	hy->price_auto = bi == 2;
	if (hy->stage_balance)
		hy->stage_pinned = 0; /* the copies DMA from the registered mapping (dispatch.c) */
	/* NOTE: the link's side as the pick prices it, times this (unset or empty: 1). Measured
	 * on the H200 (record 2026-12-01-stage-balance-h200-b8ff68b.txt, hot 84, batch 16): 16
	 * experts a step staged put the CPU tier 8.6 ms shorter and the GPU's 8.6 ms longer,
	 * the step unchanged: a staged kernel's wait for its copy holds the stream that the
	 * other micro-batch's work would use, which the pick's link side (copies beside the
	 * GPU's own experts) leaves out. A price above 1 stages fewer. */
	static const char *const prices[] = { "1", "1.5", "2", "3", "4" };
	static const double price_of[] = { 1, 1.5, 2, 3, 4 };
	int pi = 0;
	if ((rc = moet_env_choice("MOET_STAGE_LINK_PRICE", prices, 5, &pi)))
		return rc;
	hy->link_base = hy->link_price = price_of[pi];
	long long at_least = 0;
	if (min && min[0]) {
		char *end = NULL;
		at_least = strtoll(min, &end, 10);
		if (*end || at_least < 1 || at_least > MOET_COST_STAGE_MAX_ROWS)
			return moet_err(MOET_EINVAL, "MOET_PREFILL_STAGE_MIN='%s': expected tokens "
					"per expert, 1 .. %d", min, MOET_COST_STAGE_MAX_ROWS);
	}
	moet_cost_hw_defaults(&in.hw);
	if (hw_file && hw_file[0] && (rc = moet_cost_hw_load(hw_file, &in.hw)))
		return moet_err_prefix(rc, "MOET_HARDWARE");
	if (hy->stage_pinned) /* the crossover's copy at the pinned uploader's rate */
		in.hw.stage_copy_gbps = in.hw.stage_pinned_gbps;
	/* NOTE: with the balance the copies DMA from the page-locked mapping at the link's rate,
	 * less what the CPU tier's reads beside them take (tests/gpu/probe_dma.sh on the H200
	 * machine: 55 GB/s alone, 45 beside the team's reads, which fell from 94 to 80 GB/s) */
	if (hy->stage_balance)
		in.hw.stage_copy_gbps = in.hw.pcie_gbps * STAGE_DMA_SHARE;
	hy->cost = in;
	/* NOTE: a gap is worth copying when its bytes cross the link faster than a second
	 * copy's latency (0 latency: only the rows used) */
	hy->gap_bytes = (size_t)(in.hw.pcie_latency_us * in.hw.pcie_gbps * 1e3);
	if (hy->stage_mode == HY_STAGE_NEVER)
		hy->stage_min = 0;
	else if (hy->stage_mode == HY_STAGE_ALWAYS)
		hy->stage_min = 1;
	else
		hy->stage_min = at_least ? at_least
					 : moet_cost_stage_min_rows(&in, MOET_COST_STAGE_MAX_ROWS);
	return 0;
}

int64_t moet_hybrid_stage_min(const moet_hybrid *hy)
{
	return hy ? hy->stage_min : 0;
}

int moet_hybrid_stage_balance(const moet_hybrid *hy)
{
	return hy && hy->stage_balance;
}

int moet_hybrid_stage_balance_by_default(const moet_hybrid *hy)
{
	return hy && hy->balance_by_default;
}

int moet_hybrid_stage_price_auto(const moet_hybrid *hy)
{
	return hy && hy->price_auto;
}

void moet_hybrid_stage_set_arm(moet_hybrid *hy, int arm)
{
	hy->link_price = arm * hy->link_base;
}

static int rows_desc(const void *a, const void *b)
{
	const int64_t *x = a, *y = b; /* (rows, index): more rows first, then the lower index */
	return x[0] != y[0] ? (x[0] < y[0] ? 1 : -1) : (x[1] > y[1]) - (x[1] < y[1]);
}

double moet_hybrid_stage_gpu_ms(const moet_hybrid *hy, int64_t rows)
{
	return moet_cost_call_ms(&hy->cost, true, (double)rows);
}

/* A split's time from its sides: the CPU tier's calls (cpu, at its own rate), the staged
 * experts' copies and kernels (link; 0: nothing staged, the CPU at full rate) and the floor. */
static double split_time(double cpu, double link, double floor_ms)
{
	if (link > 0)
		cpu /= STAGE_CPU_SHARE;
	const double t = cpu > link ? cpu : link;
	return t > floor_ms ? t : floor_ms;
}

double moet_hybrid_stage_split_ms(const moet_hybrid *hy, const int64_t *rows, int n,
				  const uint8_t *pick, double floor_ms)
{
	double cpu = 0, link = 0;
	for (int i = 0; i < n; i++) {
		if (pick[i])
			link += hy->link_price * moet_cost_stage_ms(&hy->cost, (double)rows[i]);
		else
			cpu += moet_cost_call_ms(&hy->cost, false, (double)rows[i]);
	}
	return split_time(cpu, link, floor_ms);
}

void moet_hybrid_stage_pick(const moet_hybrid *hy, const int64_t *rows, int n, double floor_ms,
			    int64_t *scratch, uint8_t *pick)
{
	/* the experts with the most rows gain the most from the link (a CPU call grows with
	 * its rows, a staged one hardly): stage a prefix of them in that order, the prefix
	 * whose split is the shortest, never below the GPU's own work of the layer (floor_ms:
	 * staging then gains nothing), none on a tie */
	memset(pick, 0, (size_t)n);
	if (hy->link_price <= 0) /* MOET_STAGE_BALANCE=auto's arm 0: nothing staged */
		return;
	double cpu = 0;
	for (int i = 0; i < n; i++) {
		scratch[2 * i] = rows[i], scratch[2 * i + 1] = i;
		cpu += moet_cost_call_ms(&hy->cost, false, (double)rows[i]);
	}
	qsort(scratch, (size_t)n, 2 * sizeof(int64_t), rows_desc);
	double best = split_time(cpu, 0, floor_ms), link = 0;
	int n_best = 0;
	for (int j = 0; j < n; j++) {
		cpu -= moet_cost_call_ms(&hy->cost, false, (double)scratch[2 * j]);
		link += hy->link_price * moet_cost_stage_ms(&hy->cost, (double)scratch[2 * j]);
		const double t = split_time(cpu, link, floor_ms);
		if (t < best)
			best = t, n_best = j + 1;
	}
	for (int j = 0; j < n_best; j++)
		pick[scratch[2 * j + 1]] = 1;
}

int moet_hybrid_stage_run(moet_hybrid *hy, moet_backend *be, const moet_ffn_w *table,
			  const moet_expert_pair *pairs, int64_t cnt, int64_t top_k,
			  const float *h, int64_t n, float *y)
{
	int rc;
	if (cnt <= 0)
		return 0;
	if (!hy->ring) { /* made at the first staged expert, kept with the engine */
		if ((rc = moet_stage_create(be, hy->stage_pinned ? MOET_STAGE_SLOTS_PINNED
								 : MOET_STAGE_SLOTS_DRIVER,
					    hy->stage_pinned, hy->n_experts, &hy->ring)))
			return moet_err_prefix(rc, "prefill staging");
		moet_stage_set_dev_wait(hy->ring, hy->stage_balance);
	}
	uint64_t t0 = moet_now_ns();
	moet_stage_counts ct = { 0 };
	rc = moet_stage_run(hy->ring, be, table, pairs, cnt, top_k, h, n, y, hy->H, &ct);
	hy->st.ns_stage += moet_now_ns() - t0;
	hy->st.bytes_staged += ct.bytes;
	hy->st.staged_experts += ct.experts;
	hy->st.ns_stage_copy += ct.ns_copy;
	hy->st.ns_stage_wait += ct.ns_wait;
	hy->st.ns_stage_link += ct.ns_link;
	hy->st.staged_pairs += (uint64_t)cnt;
	return rc ? moet_err_prefix(rc, "prefill staging") : 0;
}

int moet_hybrid_stage_take_link(moet_hybrid *hy)
{
	if (!hy || !hy->ring)
		return 0;
	moet_stage_counts ct = { 0 };
	int rc = moet_stage_take_link(hy->ring, &ct);
	hy->st.ns_stage_link += ct.ns_link;
	return rc ? moet_err_prefix(rc, "staging: the copies' times") : 0;
}
