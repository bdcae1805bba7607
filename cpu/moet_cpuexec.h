/*
 * moet_cpuexec.h: the CPU expert executor, a persistent team of pinned worker threads that
 * computes batches of contract expert FFNs (docs/numerics.md) asynchronously.
 *
 *   caller thread(s)                         team (n workers, one per core, made once)
 *   moet_cpuexec_submit(jobs) -> ticket ---> queue of batches, run one at a time in order:
 *   ... (caller goes on) ...                   phase 1: gate/up rows of every job, in chunks
 *                                              barrier
 *                                              phase 2: down rows of every job, in chunks
 *   moet_cpuexec_wait(ticket) -> rc   <---     barrier; batch done
 *
 * Each (row, token) result is computed by exactly one worker with the kernel table's fixed
 * order, so a batch's outputs are bit-identical to moet_expert_ffn() single-threaded, for
 * every thread count and split. Nothing is allocated per batch: the h scratch and the batch
 * slots are sized at creation from the options.
 */
#ifndef MOET_CPUEXEC_H
#define MOET_CPUEXEC_H

#include <stdint.h>

#include "moet_cpu.h"
#include "moet_mat.h"
#include "moet_topo.h"

typedef struct moet_cpuexec moet_cpuexec;

enum {
	MOET_CPUEXEC_SPLIT_AUTO = 0, /* the executor's choice (currently: rows) */
	MOET_CPUEXEC_SPLIT_ROWS,     /* every job's rows spread over all workers (decode) */
	MOET_CPUEXEC_SPLIT_EXPERTS,  /* whole jobs handed to workers (many tokens per expert) */
};

typedef struct moet_cpuexec_opts {
	const moet_topo *topo;   /* borrowed, must outlive the executor; NULL: this machine's
				    topology, loaded and owned by the executor */
	int node;                /* NUMA node whose cores run the workers, or MOET_TOPO_ALL_NODES */
	int n_threads;           /* 0: one per core of the node(s); see moet_topo_select_cores */
	int64_t max_tok;         /* tokens per batch, summed over its jobs; 0: 256 */
	int64_t max_inter;       /* largest intermediate size I of a job; 0: 2048 */
	int max_jobs;            /* jobs per batch; 0: 64 */
	int max_pending;         /* batches submitted and not yet waited for; 0: 8 */
	int split;               /* MOET_CPUEXEC_SPLIT_* */
	const moet_cpu_kernels *kernels; /* borrowed; NULL: moet_cpu_kernels_get() */
} moet_cpuexec_opts;

/* One expert applied to n_tok tokens: y[t] = E(x[t]) with E = (gate, up, down). */
typedef struct moet_cpuexec_job {
	moet_mat gate, up, down; /* copied at submit; their data and scales are borrowed until
				    the batch is waited for */
	const float *x;          /* [n_tok][H], borrowed until wait */
	float *y;                /* [n_tok][H], written by the team; may alias x */
	int64_t n_tok;           /* 0 is allowed (nothing to do) */
} moet_cpuexec_job;

/*
 * Starts the team: one thread per selected core, each bound to its core and checking its
 * floating-point environment (round-to-nearest, no flush-to-zero, no denormals-are-zero: the
 * contract). Threads inherit the creating thread's environment, so a process that enabled
 * FTZ/DAZ (fast-math startup code) fails here instead of computing wrong bits later.
 * Returns 0, MOET_EINVAL (options out of range, or a worker's FP environment breaks the
 * contract: the detail names the worker, its core and the MXCSR bits), MOET_EIO (binding
 * or thread creation failed) or MOET_ENOMEM. *out is the caller's (moet_cpuexec_destroy).
 */
int moet_cpuexec_create(const moet_cpuexec_opts *opts, moet_cpuexec **out);

/* Finishes every submitted batch, stops and joins the team, frees everything. Results of
 * batches nobody waited for are dropped. NULL is fine. Not concurrent with other calls. */
void moet_cpuexec_destroy(moet_cpuexec *ex);

/*
 * Queues a batch of n_jobs jobs and returns at once with its ticket. The job array is copied;
 * the matrices, x and y stay borrowed until moet_cpuexec_wait(ticket) returns. Validation
 * happens here, so a rejected batch gets no ticket: MOET_ESHAPE (matrices that do not chain,
 * or an unsupported dtype; the detail names the job), MOET_ERANGE (more than max_jobs jobs,
 * more than max_tok tokens in all, I above max_inter, or max_pending batches outstanding),
 * MOET_EINVAL (NULL pointers, negative counts). Thread-safe: several threads may submit.
 */
int moet_cpuexec_submit(moet_cpuexec *ex, const moet_cpuexec_job *jobs, int n_jobs,
			uint64_t *out_ticket);

/*
 * Announces a batch soon (MOET_CPU_PREWAKE=N pause rounds, read at create; 0, the default:
 * nothing happens): the sleeping workers wake and spin up to N rounds for the next batch
 * before they sleep again, so that the batch submitted meanwhile does not wait for their
 * wake-ups. Nothing changes in any result. Thread-safe; NULL is fine.
 */
void moet_cpuexec_prewake(moet_cpuexec *ex);
/* How many times a sleeping worker woke for a moet_cpuexec_prewake (0 for NULL). */
uint64_t moet_cpuexec_prewoken(moet_cpuexec *ex);

/*
 * From now on, when a batch is done (every worker finished it, its outputs written), the low
 * 32 bits of its ticket are stored into *word with release order, batches in ticket order, so
 * that another agent (a device stream: MOET_TIER_FINISH=queued, runtime/hybrid.c) can wait for
 * (int32_t)(*word - (uint32_t)ticket) >= 0 and then read the outputs. NULL stops it. Call it
 * before the first submit; the word must outlive the executor's batches. NULL ex is fine.
 */
void moet_cpuexec_set_done_word(moet_cpuexec *ex, uint32_t *word);

/*
 * Blocks until the batch of `ticket` is done and returns its result: 0, or MOET_EINVAL if a
 * worker's floating-point environment no longer met the contract after computing it (a kernel
 * variant changed MXCSR). Each ticket is waited for once, by one thread; a ticket that is
 * unknown or already waited for gives MOET_EINVAL at once. Thread-safe across tickets.
 */
int moet_cpuexec_wait(moet_cpuexec *ex, uint64_t ticket);

/* Whether the batch of `ticket` is done (a wait for it would not block); 1 also for a ticket
 * that is unknown or already waited for (its wait then says so). Thread-safe. */
int moet_cpuexec_done(moet_cpuexec *ex, uint64_t ticket);

/* moet_cpuexec_wait, and the batch's span on the team (CLOCK_MONOTONIC ns; either pointer may
 * be NULL): when its first worker began it and when its last worker finished. */
int moet_cpuexec_wait_span(moet_cpuexec *ex, uint64_t ticket, uint64_t *t_first,
			   uint64_t *t_last);

/* fn(arg, worker, n_workers) on every worker of the team at once (each on its own core);
 * blocks until all return. For work that must run where the experts are computed: page
 * first-touch, the bandwidth and FMA ceilings of the benches. Same queue as batches:
 * MOET_ERANGE if max_pending batches are outstanding. Thread-safe. */
int moet_cpuexec_run(moet_cpuexec *ex, void (*fn)(void *arg, int worker, int n_workers),
		     void *arg);

/* Team size, the core worker i is bound to (moet_topo core index; -1 if out of range), the
 * topology (borrowed from the options or the executor's own) and the kernel table in use. */
int moet_cpuexec_n_threads(const moet_cpuexec *ex);
int moet_cpuexec_worker_core(const moet_cpuexec *ex, int worker);
const moet_topo *moet_cpuexec_topo(const moet_cpuexec *ex);
const moet_cpu_kernels *moet_cpuexec_kernels(const moet_cpuexec *ex);

#endif
