/*
 * exec.c: the CPU expert executor of moet_cpuexec.h.
 *
 * NOTE: plain pthreads, not an OpenMP team. The properties the executor needs are explicit
 * here and implicit (or missing) in libgomp: (1) each worker bound to a chosen core of a
 * chosen NUMA node, per executor, where OMP_PLACES/OMP_PROC_BIND are process-wide settings
 * read once; (2) several executors in one process (one per NUMA node) with teams of their
 * own; (3) destroy joins the threads, where libgomp keeps its pool until exit, so a create/
 * destroy loop can be checked for leaks; (4) failures (binding, FP environment) returned as
 * codes from create, never a runtime abort; (5) a dispatcher-free design: the workers take
 * batches from the queue themselves, so a submit costs one lock and one broadcast and no
 * extra thread sits between the caller (later a CUDA host callback) and the team.
 *
 * Batches: a fixed ring of max_pending slots. submit fills a free slot (copy of the jobs,
 * the work plan, reset claim counters) and gives it the next ticket; every worker runs
 * tickets 1, 2, 3, ... in order, so all agree on the current batch without a dispatcher:
 *
 *   worker w:  wait for slot(ticket == next)  ->  phase 1 items  ->  phase 2 items
 *              ->  FP check  ->  count itself finished (the last one: slot DONE)
 *
 * Items are claimed with an atomic counter (dynamic balance; a claimed item is computed by
 * one worker, whole, in the kernel's order, so the claim order never changes bits).
 *   rows split:     phase 1 item = (job, chunk of gate/up rows): h = silu(g) * u
 *                   phase 2 item = (job, chunk of down rows): y = canon(D(down, h))
 *   experts split:  phase 1 item = one whole job (moet_expert_ffn on that worker)
 * A slot stays PENDING until every worker has counted itself finished (after which it never
 * touches the slot again), and becomes FREE only when its ticket is waited for, so no worker
 * can see a reused slot.
 *
 * NOTE: no barrier between the phases. A phase 2 item of job j needs all of job j's h, so its
 * worker first waits (spinning) until done1[j], the count of job j's finished phase 1 items,
 * is complete (release/acquire: the h rows written before the count are seen after it).
 * Items are claimed in order (all phase 1 items, job by job, then phase 2 items), so in a
 * batch of several experts the early jobs' h is long complete when their phase 2 starts, and
 * no worker idles while the slowest phase 1 item of the batch finishes. Nor is there a
 * barrier at the end: the last worker to finish marks the batch done; a worker that finds
 * the next batch already queued waits (spinning) for that mark only, since batches share the
 * h scratch.
 * Idle workers spin for a short while (SPIN_ROUNDS, or MOET_CPU_SPIN rounds) on the published
 * ticket before they sleep on the condition variable: a wake-up costs tens of microseconds per
 * thread, a decode layer's experts a few milliseconds. The caller's moet_cpuexec_wait does not
 * spin unless MOET_CPU_WAIT_SPIN asks it to: its thread is not pinned and may share a core
 * with a worker (on the 16-core host, a version whose caller spun ran 1-expert batches in 0.57
 * ms against 0.47 ms; beside MOET_GPU_DEVGROUP=1 long spins starved the driving thread,
 * docs/hybrid.md). Measured there with
 * the kernel's paired blocks (bench cpu-experts, 16 workers, medians of runs side by side):
 * decode-8x1 3.3-3.5 ms before, 3.0-3.25 ms after; one expert at 1 token 0.46-0.52 ms before,
 * 0.41-0.45 ms after.
 */
#include <errno.h>
#include <fenv.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "moet_clock.h"
#include "moet_cpuexec.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_hd.h"

#define MAX_WORKERS 4096
#define H_ALIGN 16 /* floats: each job's h starts on a 64-byte line */
#define SPIN_ROUNDS 4096 /* pause rounds (~0.1-0.5 ms) before a thread sleeps */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	_mm_pause();
#endif
}

enum { SLOT_FREE, SLOT_PENDING, SLOT_DONE };

typedef struct slot {
	int state;                /* SLOT_*, under mu */
	int waited;               /* a thread is waiting for it (under mu) */
	uint64_t ticket;
	int n_jobs, split;
	moet_cpuexec_job *jobs;   /* [max_jobs] */
	int64_t *h_off;           /* [max_jobs]: job j's h at scratch + h_off[j] */
	int64_t *pre1, *pre2;     /* [max_jobs + 1]: prefix sums of items per job */
	int64_t chunk1, chunk2;   /* rows per item in phases 1 and 2 */
	void (*fn)(void *, int, int);
	void *fn_arg;
	atomic_llong claim1, claim2;
	atomic_llong *done1;      /* [max_jobs]: finished phase 1 items of job j */
	atomic_int n_finished;    /* workers done with this batch */
	atomic_ullong t_first;    /* ns (CLOCK_MONOTONIC): its first worker began, 0 before */
	uint64_t t_last;          /* ns: its last worker finished (written before the done mark) */
	atomic_int rc;            /* first worker error, 0 if none */
	char msg[256];            /* its detail, written by the worker that set rc */
} slot;

typedef struct team_worker {
	struct moet_cpuexec *ex;
	int idx;
} team_worker;

struct moet_cpuexec {
	moet_topo *own_topo;
	const moet_topo *topo;
	const moet_cpu_kernels *k;
	int n_thr, n_started, split, max_jobs, max_pending;
	int64_t max_tok, max_inter;
	int *cores;
	pthread_t *thr;
	team_worker *wk;
	float *scratch;
	slot *slots;
	pthread_mutex_t mu;
	pthread_cond_t work_cv, done_cv, start_cv;
	int mu_ok;
	uint64_t next_ticket;
	atomic_ullong published;  /* the last ticket enqueued (read without mu by spinning workers) */
	atomic_ullong finished;   /* the last ticket every worker has finished */
	long spin, wait_spin;     /* pause rounds: an idle worker before it sleeps (MOET_CPU_SPIN),
				     moet_cpuexec_wait before it sleeps (MOET_CPU_WAIT_SPIN) */
	int items;                /* items per worker and phase in a rows split (MOET_CPU_ITEMS) */
	long prewake_spin;        /* pause rounds a worker spins after moet_cpuexec_prewake
				     (MOET_CPU_PREWAKE; 0: the call does nothing) */
	atomic_uint prewake;      /* advanced by each moet_cpuexec_prewake */
	atomic_ullong prewoken;   /* workers that woke for one (moet_cpuexec_prewoken) */
	atomic_int stopping;      /* stop, readable without mu (ends a prewake's spin) */
	uint32_t *done_word;      /* moet_cpuexec_set_done_word, or NULL */
	int stop, go, n_ready, start_rc;
	char start_msg[256];
};

/* 0 if this thread's FP environment is the contract's, else MOET_EINVAL with `why` filled. */
static int fpenv_check(char *why, size_t n)
{
	const char *bad = NULL;
	unsigned csr = 0;
#if defined(__x86_64__) || defined(__i386__)
	csr = _mm_getcsr();
	if (csr & 0x8000u)
		bad = "flush-to-zero (FTZ) is on";
	else if (csr & 0x0040u)
		bad = "denormals-are-zero (DAZ) is on";
	else if (csr & 0x6000u)
		bad = "the SSE rounding mode is not round-to-nearest";
#endif
	if (!bad && fegetround() != FE_TONEAREST)
		bad = "the rounding mode is not round-to-nearest";
	if (!bad)
		return 0;
	snprintf(why, n, "%s (MXCSR 0x%04x); the numerics contract needs round-to-nearest-even "
		 "without FTZ/DAZ on every worker (was the program built with -ffast-math?)", bad,
		 csr);
	return MOET_EINVAL;
}

static int64_t find_job(const int64_t *pre, int n_jobs, int64_t item)
{
	int lo = 0, hi = n_jobs - 1; /* largest j with pre[j] <= item */
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (pre[mid] <= item)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

static int64_t item1(moet_cpuexec *ex, slot *s, int64_t it)
{
	int64_t j = find_job(s->pre1, s->n_jobs, it);
	const moet_cpuexec_job *jb = &s->jobs[j];
	const int64_t I = jb->gate.rows, H = jb->gate.cols;
	float *h = ex->scratch + s->h_off[j];
	if (s->split == MOET_CPUEXEC_SPLIT_EXPERTS) {
		/* shapes were checked at submit; moet_expert_ffn cannot fail here */
		(void)moet_expert_ffn(ex->k, &jb->gate, &jb->up, &jb->down, jb->x, jb->n_tok, h,
				      jb->y);
		return j;
	}
	int64_t r0 = (it - s->pre1[j]) * s->chunk1, r1 = r0 + s->chunk1;
	if (r1 > I)
		r1 = I;
	ex->k->gate_up(&jb->gate, &jb->up, r0, r1, jb->x, H, jb->n_tok, h + r0, I);
	return j;
}

static void item2(moet_cpuexec *ex, slot *s, int64_t it)
{
	int64_t j = find_job(s->pre2, s->n_jobs, it);
	const moet_cpuexec_job *jb = &s->jobs[j];
	const int64_t I = jb->gate.rows, H = jb->down.rows;
	const int64_t need = s->pre1[j + 1] - s->pre1[j];
	while (atomic_load_explicit(&s->done1[j], memory_order_acquire) < need)
		cpu_relax(); /* job j's h is still being computed */
	const float *h = ex->scratch + s->h_off[j];
	int64_t r0 = (it - s->pre2[j]) * s->chunk2, r1 = r0 + s->chunk2;
	if (r1 > H)
		r1 = H;
	ex->k->rows(&jb->down, r0, r1, h, I, jb->n_tok, jb->y + r0, H);
	for (int64_t t = 0; t < jb->n_tok; t++)
		for (int64_t r = r0; r < r1; r++)
			jb->y[t * H + r] = moet_canon_nan(jb->y[t * H + r]);
}

static void run_batch(moet_cpuexec *ex, slot *s, int w)
{
	unsigned long long zero_t = 0;
	if (!atomic_load_explicit(&s->t_first, memory_order_relaxed))
		atomic_compare_exchange_strong(&s->t_first, &zero_t, (unsigned long long)moet_now_ns());
	if (s->fn) {
		s->fn(s->fn_arg, w, ex->n_thr);
	} else {
		int64_t it;
		while ((it = atomic_fetch_add(&s->claim1, 1)) < s->pre1[s->n_jobs])
			atomic_fetch_add_explicit(&s->done1[item1(ex, s, it)], 1,
						  memory_order_release);
	}
	if (!s->fn && s->split == MOET_CPUEXEC_SPLIT_ROWS) {
		int64_t it;
		while ((it = atomic_fetch_add(&s->claim2, 1)) < s->pre2[s->n_jobs])
			item2(ex, s, it);
	}
	char why[200];
	if (fpenv_check(why, sizeof(why))) {
		int zero = 0;
		if (atomic_compare_exchange_strong(&s->rc, &zero, MOET_EINVAL))
			snprintf(s->msg, sizeof(s->msg), "CPU worker %d (core %d) after batch %llu: %s",
				 w, ex->cores[w], (unsigned long long)s->ticket, why);
	}
	/* the last worker to finish marks the slot done; no worker touches s after counting */
	if (atomic_fetch_add(&s->n_finished, 1) == ex->n_thr - 1) {
		s->t_last = moet_now_ns();
		atomic_store(&ex->finished, s->ticket);
		/* NOTE: release: the batch's outputs are visible before the word says so (a
		 * device stream may wait on it and then copy them: MOET_TIER_FINISH=queued) */
		if (ex->done_word)
			__atomic_store_n(ex->done_word, (uint32_t)s->ticket, __ATOMIC_RELEASE);
		pthread_mutex_lock(&ex->mu);
		s->state = SLOT_DONE;
		pthread_cond_broadcast(&ex->done_cv);
		pthread_mutex_unlock(&ex->mu);
	}
}

static slot *find_pending(moet_cpuexec *ex, uint64_t ticket)
{
	for (int i = 0; i < ex->max_pending; i++)
		if (ex->slots[i].state == SLOT_PENDING && ex->slots[i].ticket == ticket)
			return &ex->slots[i];
	return NULL;
}

static void *worker_main(void *arg)
{
	team_worker *wk = arg;
	moet_cpuexec *ex = wk->ex;
	const int w = wk->idx;
	char why[200] = "";
	int rc = moet_topo_bind_core(ex->topo, ex->cores[w]);
	if (rc)
		snprintf(why, sizeof(why), "%s", moet_errmsg());
	else
		rc = fpenv_check(why, sizeof(why));
	pthread_mutex_lock(&ex->mu);
	if (rc && !ex->start_rc) {
		ex->start_rc = rc;
		snprintf(ex->start_msg, sizeof(ex->start_msg), "CPU worker %d (core %d): %s", w,
			 ex->cores[w], why);
	}
	ex->n_ready++;
	pthread_cond_broadcast(&ex->start_cv);
	while (!ex->go && !ex->stop)
		pthread_cond_wait(&ex->start_cv, &ex->mu);
	pthread_mutex_unlock(&ex->mu);

	uint64_t next = 1;
	unsigned seen = atomic_load(&ex->prewake); /* the last prewake this worker acted on */
	for (;;) {
		slot *s;
		for (long i = 0; i < ex->spin && atomic_load(&ex->published) < next; i++)
			cpu_relax();
		pthread_mutex_lock(&ex->mu);
		/* a moet_cpuexec_prewake since the last one it acted on (asleep, or while it was
		 * busy) has the worker spin for the batch it announces (prewake_spin rounds),
		 * then sleep again if none came */
		while (!(s = find_pending(ex, next)) && !ex->stop && atomic_load(&ex->prewake) == seen)
			pthread_cond_wait(&ex->work_cv, &ex->mu);
		const int stop = ex->stop;
		/* a batch taken answers the prewakes before it, as one woken for spins for */
		seen = atomic_load(&ex->prewake);
		pthread_mutex_unlock(&ex->mu);
		if (!s && stop)
			break;
		if (!s) {
			atomic_fetch_add(&ex->prewoken, 1u);
			for (long i = 0; i < ex->prewake_spin && atomic_load(&ex->published) < next &&
					 !atomic_load(&ex->stopping);
			     i++)
				cpu_relax();
			continue;
		}
		/* batches share the h scratch: start one only when the team is done with the last */
		while (atomic_load(&ex->finished) < next - 1)
			cpu_relax();
		run_batch(ex, s, w);
		next++;
	}
	return NULL;
}

static void stop_and_join(moet_cpuexec *ex)
{
	atomic_store(&ex->stopping, 1);
	pthread_mutex_lock(&ex->mu);
	ex->stop = 1;
	pthread_cond_broadcast(&ex->work_cv);
	pthread_cond_broadcast(&ex->start_cv);
	pthread_mutex_unlock(&ex->mu);
	for (int i = 0; i < ex->n_started; i++)
		pthread_join(ex->thr[i], NULL);
	ex->n_started = 0;
}

void moet_cpuexec_destroy(moet_cpuexec *ex)
{
	if (!ex)
		return;
	if (ex->mu_ok) {
		stop_and_join(ex);
		pthread_mutex_destroy(&ex->mu);
		pthread_cond_destroy(&ex->work_cv);
		pthread_cond_destroy(&ex->done_cv);
		pthread_cond_destroy(&ex->start_cv);
	}
	for (int i = 0; ex->slots && i < ex->max_pending; i++) {
		free(ex->slots[i].jobs);
		free(ex->slots[i].h_off);
		free(ex->slots[i].pre1);
		free(ex->slots[i].pre2);
		free(ex->slots[i].done1);
	}
	free(ex->slots);
	free(ex->scratch);
	free(ex->cores);
	free(ex->thr);
	free(ex->wk);
	moet_topo_destroy(ex->own_topo);
	free(ex);
}

static int alloc_tables(moet_cpuexec *ex)
{
	const size_t mj = (size_t)ex->max_jobs;
	ex->slots = calloc((size_t)ex->max_pending, sizeof(slot));
	if (!ex->slots)
		return moet_err(MOET_ENOMEM, "CPU executor: %d batch slots", ex->max_pending);
	for (int i = 0; i < ex->max_pending; i++) {
		slot *s = &ex->slots[i];
		s->jobs = calloc(mj, sizeof(*s->jobs));
		s->h_off = calloc(mj, sizeof(int64_t));
		s->pre1 = calloc(mj + 1, sizeof(int64_t));
		s->pre2 = calloc(mj + 1, sizeof(int64_t));
		s->done1 = calloc(mj, sizeof(atomic_llong));
		if (!s->jobs || !s->h_off || !s->pre1 || !s->pre2 || !s->done1)
			return moet_err(MOET_ENOMEM, "CPU executor: slots for %d jobs", ex->max_jobs);
	}
	size_t n = (size_t)(ex->max_tok * ex->max_inter) + mj * H_ALIGN;
	size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
	if (!(ex->scratch = aligned_alloc(64, bytes)))
		return moet_err(MOET_ENOMEM, "CPU executor: %zu bytes of h scratch (max_tok %lld x "
				"max_inter %lld)", bytes, (long long)ex->max_tok,
				(long long)ex->max_inter);
	memset(ex->scratch, 0, bytes);
	return 0;
}

static int start_team(moet_cpuexec *ex)
{
	if (pthread_mutex_init(&ex->mu, NULL))
		return moet_err(MOET_ENOMEM, "CPU executor: mutex");
	pthread_cond_init(&ex->work_cv, NULL);
	pthread_cond_init(&ex->done_cv, NULL);
	pthread_cond_init(&ex->start_cv, NULL);
	ex->mu_ok = 1;
	for (int i = 0; i < ex->n_thr; i++) {
		ex->wk[i] = (team_worker){ .ex = ex, .idx = i };
		int e = pthread_create(&ex->thr[i], NULL, worker_main, &ex->wk[i]);
		if (e)
			return moet_err(MOET_EIO, "CPU executor: starting worker %d of %d: %s", i,
					ex->n_thr, strerror(e));
		ex->n_started++;
	}
	pthread_mutex_lock(&ex->mu);
	while (ex->n_ready < ex->n_started)
		pthread_cond_wait(&ex->start_cv, &ex->mu);
	int rc = ex->start_rc;
	if (!rc) {
		ex->go = 1;
		pthread_cond_broadcast(&ex->start_cv);
	}
	pthread_mutex_unlock(&ex->mu);
	return rc ? moet_err(rc, "%s", ex->start_msg) : 0;
}

/* A count of pause rounds from the environment: `def` when unset or empty, else a whole
 * number 0 .. 2^30 (anything else is refused, naming the variable). */
static int env_rounds(const char *var, long def, long *out)
{
	const char *v = getenv(var);
	*out = def;
	if (!v || !*v)
		return 0;
	char *end;
	errno = 0;
	long long n = strtoll(v, &end, 10);
	if (errno || *end || end == v || n < 0 || n > (1LL << 30))
		return moet_err(MOET_EINVAL, "%s='%s': want a whole number of pause rounds, 0 .. "
				"2^30", var, v);
	*out = (long)n;
	return 0;
}

int moet_cpuexec_create(const moet_cpuexec_opts *opts, moet_cpuexec **out)
{
	*out = NULL;
	moet_cpuexec_opts o = opts ? *opts : (moet_cpuexec_opts){ 0 };
	if (o.max_tok < 0 || o.max_inter < 0 || o.max_jobs < 0 || o.max_pending < 0 ||
	    o.n_threads < 0 || o.split < MOET_CPUEXEC_SPLIT_AUTO ||
	    o.split > MOET_CPUEXEC_SPLIT_EXPERTS)
		return moet_err(MOET_EINVAL, "CPU executor: negative or unknown option");
	moet_cpuexec *ex = calloc(1, sizeof(*ex));
	int rc;
	if (!ex)
		return moet_err(MOET_ENOMEM, "CPU executor");
	ex->max_tok = o.max_tok ? o.max_tok : 256;
	ex->max_inter = o.max_inter ? o.max_inter : 2048;
	ex->max_jobs = o.max_jobs ? o.max_jobs : 64;
	ex->max_pending = o.max_pending ? o.max_pending : 8;
	ex->split = o.split == MOET_CPUEXEC_SPLIT_AUTO ? MOET_CPUEXEC_SPLIT_ROWS : o.split;
	ex->k = o.kernels ? o.kernels : moet_cpu_kernels_get();
	ex->next_ticket = 1;
	if ((rc = env_rounds("MOET_CPU_SPIN", SPIN_ROUNDS, &ex->spin)) ||
	    (rc = env_rounds("MOET_CPU_WAIT_SPIN", 0, &ex->wait_spin)) ||
	    (rc = env_rounds("MOET_CPU_PREWAKE", 0, &ex->prewake_spin)))
		goto fail;
	/* MOET_CPU_ITEMS: finer items shorten a call's tail (the last items' workers alone) at
	 * the price of more claims; the bits do not change (an item is rows, each computed
	 * whole in the kernel's order) */
	static const char *const items[] = { "4", "1", "2", "8", "16" };
	static const int items_of[] = { 4, 1, 2, 8, 16 };
	int it = 0;
	if ((rc = moet_env_choice("MOET_CPU_ITEMS", items, 5, &it)))
		goto fail;
	ex->items = items_of[it];
	if (ex->max_tok > ((int64_t)1 << 40) / ex->max_inter) {
		rc = moet_err(MOET_ERANGE, "CPU executor: max_tok %lld x max_inter %lld is too "
			      "large a scratch", (long long)ex->max_tok, (long long)ex->max_inter);
		goto fail;
	}
	ex->topo = o.topo;
	if (!ex->topo) {
		if ((rc = moet_topo_load(&ex->own_topo)))
			goto fail;
		ex->topo = ex->own_topo;
	}
	if (!(ex->cores = calloc(MAX_WORKERS, sizeof(int)))) {
		rc = moet_err(MOET_ENOMEM, "CPU executor");
		goto fail;
	}
	if ((rc = moet_topo_select_cores(ex->topo, o.node, o.n_threads, ex->cores, MAX_WORKERS,
					 &ex->n_thr)))
		goto fail;
	ex->thr = calloc((size_t)ex->n_thr, sizeof(pthread_t));
	ex->wk = calloc((size_t)ex->n_thr, sizeof(team_worker));
	if (!ex->thr || !ex->wk) {
		rc = moet_err(MOET_ENOMEM, "CPU executor: %d workers", ex->n_thr);
		goto fail;
	}
	if ((rc = alloc_tables(ex)) || (rc = start_team(ex)))
		goto fail;
	*out = ex;
	return 0;
fail:
	moet_cpuexec_destroy(ex);
	return rc;
}

static int mat_ok(const moet_mat *m)
{
	return (m->dtype == MOET_DT_F8_E4M3 || m->dtype == MOET_DT_BF16 ||
		m->dtype == MOET_DT_F32) && m->rows > 0 && m->cols > 0 && m->data;
}

static int check_job(const moet_cpuexec *ex, const moet_cpuexec_job *jb, int j)
{
	if (jb->n_tok < 0)
		return moet_err(MOET_EINVAL, "CPU batch job %d: n_tok %lld is negative", j,
				(long long)jb->n_tok);
	if (!mat_ok(&jb->gate) || !mat_ok(&jb->up) || !mat_ok(&jb->down))
		return moet_err(MOET_ESHAPE, "CPU batch job %d: a matrix is empty, has no data or "
				"a dtype other than F8_E4M3, BF16, F32", j);
	const int64_t I = jb->gate.rows, H = jb->gate.cols;
	if (jb->up.rows != I || jb->up.cols != H || jb->down.rows != H || jb->down.cols != I)
		return moet_err(MOET_ESHAPE, "CPU batch job %d: expert matrices do not chain: gate "
				"%lldx%lld, up %lldx%lld, down %lldx%lld", j, (long long)I,
				(long long)H, (long long)jb->up.rows, (long long)jb->up.cols,
				(long long)jb->down.rows, (long long)jb->down.cols);
	if (I > ex->max_inter)
		return moet_err(MOET_ERANGE, "CPU batch job %d: intermediate size %lld exceeds the "
				"executor's max_inter %lld", j, (long long)I,
				(long long)ex->max_inter);
	if (jb->n_tok > 0 && (!jb->x || !jb->y))
		return moet_err(MOET_EINVAL, "CPU batch job %d: x or y is NULL", j);
	return 0;
}

/* rows per item: about `items` items per worker over the phase (MOET_CPU_ITEMS, default 4),
 * a multiple of 16, in [16, 512] */
static int64_t chunk_rows(int64_t total_rows, int n_thr, int items)
{
	const int64_t per = (int64_t)items * n_thr;
	int64_t c = (total_rows + per - 1) / per;
	c = (c + 15) / 16 * 16;
	return c < 16 ? 16 : c > 512 ? 512 : c;
}

/* Fills slot s with the plan of a validated batch. */
static void plan(moet_cpuexec *ex, slot *s, const moet_cpuexec_job *jobs, int n_jobs)
{
	int64_t rows1 = 0, rows2 = 0, off = 0;
	if (n_jobs)
		memcpy(s->jobs, jobs, (size_t)n_jobs * sizeof(*jobs));
	s->n_jobs = n_jobs;
	s->split = ex->split;
	s->fn = NULL;
	for (int j = 0; j < n_jobs; j++) {
		atomic_store(&s->done1[j], 0);
		s->h_off[j] = off;
		off += (jobs[j].n_tok * jobs[j].gate.rows + H_ALIGN - 1) / H_ALIGN * H_ALIGN;
		if (jobs[j].n_tok) {
			rows1 += jobs[j].gate.rows;
			rows2 += jobs[j].down.rows;
		}
	}
	s->chunk1 = chunk_rows(rows1, ex->n_thr, ex->items);
	s->chunk2 = chunk_rows(rows2, ex->n_thr, ex->items);
	s->pre1[0] = s->pre2[0] = 0;
	for (int j = 0; j < n_jobs; j++) {
		int64_t n1 = 0, n2 = 0;
		if (jobs[j].n_tok && s->split == MOET_CPUEXEC_SPLIT_EXPERTS) {
			n1 = 1;
		} else if (jobs[j].n_tok) {
			n1 = (jobs[j].gate.rows + s->chunk1 - 1) / s->chunk1;
			n2 = (jobs[j].down.rows + s->chunk2 - 1) / s->chunk2;
		}
		s->pre1[j + 1] = s->pre1[j] + n1;
		s->pre2[j + 1] = s->pre2[j] + n2;
	}
}

/* Under mu: a free slot, or NULL with the detail set. */
static slot *take_slot(moet_cpuexec *ex)
{
	for (int i = 0; i < ex->max_pending; i++)
		if (ex->slots[i].state == SLOT_FREE)
			return &ex->slots[i];
	moet_err(MOET_ERANGE, "CPU executor: %d batches outstanding (max_pending): wait for one "
		 "before submitting more", ex->max_pending);
	return NULL;
}

/* Under mu: gives s the next ticket and wakes the team. */
static uint64_t enqueue(moet_cpuexec *ex, slot *s)
{
	atomic_store(&s->claim1, 0);
	atomic_store(&s->claim2, 0);
	atomic_store(&s->rc, 0);
	atomic_store(&s->n_finished, 0);
	atomic_store(&s->t_first, 0);
	s->t_last = 0;
	s->msg[0] = '\0';
	s->waited = 0;
	s->ticket = ex->next_ticket++;
	s->state = SLOT_PENDING;
	atomic_store(&ex->published, s->ticket);
	pthread_cond_broadcast(&ex->work_cv);
	return s->ticket;
}

int moet_cpuexec_submit(moet_cpuexec *ex, const moet_cpuexec_job *jobs, int n_jobs,
			uint64_t *out_ticket)
{
	*out_ticket = 0;
	if (n_jobs < 0 || (n_jobs > 0 && !jobs))
		return moet_err(MOET_EINVAL, "CPU batch: %d jobs at %p", n_jobs, (const void *)jobs);
	if (n_jobs > ex->max_jobs)
		return moet_err(MOET_ERANGE, "CPU batch: %d jobs exceed the executor's max_jobs %d",
				n_jobs, ex->max_jobs);
	int64_t tok = 0;
	for (int j = 0; j < n_jobs; j++) {
		int rc = check_job(ex, &jobs[j], j);
		if (rc)
			return rc;
		tok += jobs[j].n_tok;
	}
	if (tok > ex->max_tok)
		return moet_err(MOET_ERANGE, "CPU batch: %lld tokens in all exceed the executor's "
				"max_tok %lld", (long long)tok, (long long)ex->max_tok);
	pthread_mutex_lock(&ex->mu);
	slot *s = take_slot(ex);
	if (s) {
		plan(ex, s, jobs, n_jobs);
		*out_ticket = enqueue(ex, s);
	}
	pthread_mutex_unlock(&ex->mu);
	return s ? 0 : MOET_ERANGE;
}

void moet_cpuexec_set_done_word(moet_cpuexec *ex, uint32_t *word)
{
	if (ex)
		ex->done_word = word;
}

uint64_t moet_cpuexec_prewoken(moet_cpuexec *ex)
{
	return ex ? atomic_load(&ex->prewoken) : 0;
}

void moet_cpuexec_prewake(moet_cpuexec *ex)
{
	if (!ex || !ex->prewake_spin || !ex->n_started)
		return;
	atomic_fetch_add(&ex->prewake, 1u);
	pthread_mutex_lock(&ex->mu);
	pthread_cond_broadcast(&ex->work_cv);
	pthread_mutex_unlock(&ex->mu);
}

int moet_cpuexec_wait(moet_cpuexec *ex, uint64_t ticket)
{
	return moet_cpuexec_wait_span(ex, ticket, NULL, NULL);
}

int moet_cpuexec_done(moet_cpuexec *ex, uint64_t ticket)
{
	int done = 1;
	pthread_mutex_lock(&ex->mu);
	for (int i = 0; i < ex->max_pending; i++)
		if (ex->slots[i].state != SLOT_FREE && ex->slots[i].ticket == ticket &&
		    !ex->slots[i].waited)
			done = ex->slots[i].state == SLOT_DONE;
	pthread_mutex_unlock(&ex->mu);
	return done;
}

int moet_cpuexec_wait_span(moet_cpuexec *ex, uint64_t ticket, uint64_t *t_first,
			   uint64_t *t_last)
{
	/* MOET_CPU_WAIT_SPIN: before taking the lock and sleeping, spin on the finished mark
	 * (batches finish in ticket order) */
	for (long i = 0; i < ex->wait_spin && atomic_load(&ex->finished) < ticket; i++)
		cpu_relax();
	pthread_mutex_lock(&ex->mu);
	slot *s = NULL;
	for (int i = 0; i < ex->max_pending && !s; i++)
		if (ex->slots[i].state != SLOT_FREE && ex->slots[i].ticket == ticket &&
		    !ex->slots[i].waited)
			s = &ex->slots[i];
	if (!s) {
		pthread_mutex_unlock(&ex->mu);
		return moet_err(MOET_EINVAL, "CPU executor: ticket %llu is unknown or already "
				"waited for", (unsigned long long)ticket);
	}
	s->waited = 1;
	while (s->state != SLOT_DONE)
		pthread_cond_wait(&ex->done_cv, &ex->mu);
	int rc = atomic_load(&s->rc);
	if (rc)
		moet_err(rc, "%s", s->msg);
	if (t_first)
		*t_first = atomic_load(&s->t_first);
	if (t_last)
		*t_last = s->t_last;
	s->state = SLOT_FREE;
	pthread_mutex_unlock(&ex->mu);
	return rc;
}

int moet_cpuexec_run(moet_cpuexec *ex, void (*fn)(void *arg, int worker, int n_workers),
		     void *arg)
{
	if (!fn)
		return moet_err(MOET_EINVAL, "CPU executor: run with no function");
	pthread_mutex_lock(&ex->mu);
	slot *s = take_slot(ex);
	uint64_t ticket = 0;
	if (s) {
		s->n_jobs = 0;
		s->pre1[0] = s->pre2[0] = 0;
		s->fn = fn;
		s->fn_arg = arg;
		ticket = enqueue(ex, s);
	}
	pthread_mutex_unlock(&ex->mu);
	return s ? moet_cpuexec_wait(ex, ticket) : MOET_ERANGE;
}

int moet_cpuexec_n_threads(const moet_cpuexec *ex) { return ex->n_thr; }
const moet_topo *moet_cpuexec_topo(const moet_cpuexec *ex) { return ex->topo; }
const moet_cpu_kernels *moet_cpuexec_kernels(const moet_cpuexec *ex) { return ex->k; }

int moet_cpuexec_worker_core(const moet_cpuexec *ex, int worker)
{
	return (worker >= 0 && worker < ex->n_thr) ? ex->cores[worker] : -1;
}
