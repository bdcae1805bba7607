/*
 * serve_bench_int.h: private to `bench serve` (serve_bench.c, serve_bench_pred.c,
 * serve_bench_trace.c): the served run's step trace and its bare replay; the routed experts
 * each measured decode step touches, and the bytes-roofline prediction of a hybrid
 * placement's step from them (docs/serve.md).
 *
 *   step trace     every forward call of the served engine: its entries (request slot,
 *                  tokens, decode or prefill chunk, drew a token), start time and duration;
 *                  per slot the prompt the server ran and the tokens it drew
 *   replay         the trace's calls again on the bare model (caches of its own), timed:
 *                  the same prompts, the same composition per step, the same work
 *
 *   touch record   steps x [layers x experts] bytes: 1 where step s routed any row to
 *                  (layer, expert); filled by a route observer over a replay of the bare
 *                  decode (greedy, so the replay routes exactly as the timed run did; the
 *                  placement does not change a bit, so neither does it change the routing)
 *   tier bytes     per step, the touched experts' bytes summed per tier of an owner table:
 *                  [0] the CPU tier, [1 + g] device g (no owner table: all on device 0)
 *   prediction     step_s = max over tiers (tier bytes / tier GB/s) + the non-expert time,
 *                  the median over the steps; non-expert = the all-resident step (median)
 *                  minus the mean of its steps' expert bytes / the device's GB/s
 */
#ifndef MOET_SERVE_BENCH_INT_H
#define MOET_SERVE_BENCH_INT_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "moet_bench.h"
#include "moet_model.h"
#include "moet_placement.h"
#include "moet_sched.h"

#define SB_MAX_TIERS 65 /* the CPU tier + 64 devices */

/* ---- serve_bench_trace.c ------------------------------------------------------------------ */

typedef struct sb_slot {   /* one served request, in the order of its first step */
	const moet_kv *kv;     /* the server's cache: the request's identity while it runs */
	int64_t *prompt;       /* the prompt as the server ran it (its prefill chunks) */
	int64_t n_prompt, cap_prompt;
	int64_t *gen;          /* [tokens]: the tokens the server drew for it */
	int64_t n_gen;
	int stream;            /* the bench's stream whose prompt it ran (sb_trace_match); -1 */
} sb_slot;

typedef struct sb_entry {  /* one entry of a forward call */
	int slot;
	int32_t n_tok;
	uint8_t decode;        /* a decode (1 token) or a prefill chunk */
	uint8_t wants;         /* drew a token (*out_token) */
} sb_entry;

typedef struct sb_step {   /* one forward call of the served engine */
	double t0_s, fwd_s;    /* its start (monotonic seconds) and duration */
	int first, n;          /* its entries: ent[first .. first + n) */
	int n_decode;          /* of them decodes (the first n_decode) */
	int64_t n_tok;
} sb_step;

typedef struct sb_trace {
	int tokens;            /* max_tokens of every request */
	sb_step *step;
	int n_steps, cap_steps;
	sb_entry *ent;
	int n_ent, cap_ent;
	sb_slot *slot;
	int n_slots, cap_slots;
	int *live;             /* slots still drawing tokens (the lookup by cache) */
	int n_live;
	int err;               /* 0, or why the trace is unusable: MOET_ENOMEM, MOET_EIO */
	char why[160];
} sb_trace;

void sb_trace_init(sb_trace *t, int tokens);
void sb_trace_free(sb_trace *t);

/* The step observer (moet_sched_step_fn) filling the trace ctx; on the engine thread. */
void sb_trace_step(void *ctx, const moet_sched_step_info *si);

/* Steps by entries into out_hist[0 .. n_max] (more than n_max counted at n_max); steps with a
 * prefill chunk; steps of exactly n_max decodes and nothing else (the "full" steps). */
void sb_trace_hist(const sb_trace *t, int n_max, uint64_t *out_hist, int *out_prefill,
		   int *out_full);

/* Each slot's stream: the first unused one of the n_streams prompts (ids[s], len[s]) equal to
 * the slot's prompt. Returns the slots matched (MOET_ENOMEM: negative); *out_distinct gets the
 * distinct prompts among the slots. */
int sb_trace_match(sb_trace *t, int64_t *const *ids, const int64_t *len, int n_streams,
		   int *out_distinct);

/* The trace's forward calls again on m with caches of its own from a pool of (kv_tokens,
 * kv_block), as the server's: decodes fed the replay's own drawn tokens (greedy, where the
 * logits are), each call timed into out_step_s[t->n_steps]. *out_same = 1 when every token
 * drawn equals the server's. 0 or an error of the model. */
int sb_replay(moet_model *m, const sb_trace *t, int64_t kv_tokens, int64_t kv_block,
	      double *out_step_s, int *out_same);

/* ---- serve_bench_pred.c -------------------------------------------------------------------- */

typedef struct sb_touch {
	int64_t L, E;            /* layers, routed experts per layer */
	int steps;               /* steps recorded (capacity) */
	int cur;                 /* the step being observed; -1: none (prefill, off) */
	uint8_t *seen;           /* [steps][L x E] */
} sb_touch;

/* A record for `steps` steps of m's geometry. 0 or MOET_ENOMEM. */
int sb_touch_init(sb_touch *t, const moet_model *m, int steps);
void sb_touch_free(sb_touch *t);

/* The route observer (moet_route_fn) that fills t->seen for step t->cur. */
void sb_touch_route(void *ctx, const moet_route_event *ev);

/* Step s's touched experts per tier of owner (NULL: all on device 0) over n_tiers tiers
 * (1 + devices): bytes (from sz) and counts into out_bytes[n_tiers], out_n[n_tiers]. */
void sb_touch_tiers(const sb_touch *t, int s, const moet_placement_sizes *sz,
		    const int16_t *owner, int n_tiers, double *out_bytes, int64_t *out_n);

/* The tiers' bandwidths (GB/s): [0] the CPU tier's read ceiling, [1 + g] device g's. */
typedef struct sb_bw {
	double cpu_GBps, dev_GBps;
	const char *dev_ceiling;  /* "copy_GBps" (CUDA) or "read_GBps" (simulated devices) */
} sb_bw;

/* One stream count's prediction. */
typedef struct sb_pred {
	double resident_step_s;  /* all-resident bare step, median */
	double resident_expert_s;/* mean over its steps of expert bytes / dev GB/s */
	double nonexpert_s;      /* resident_step_s - resident_expert_s, at least 0 */
	double step_s;           /* predicted step: median over steps */
	double tokens_per_s;     /* streams / step_s */
	double mean_bytes[SB_MAX_TIERS]; /* per tier, mean over steps */
	double mean_distinct[SB_MAX_TIERS];
	int bound_tier_steps[SB_MAX_TIERS]; /* steps whose max was that tier */
} sb_pred;

/*
 * The prediction for a placement (owner, n_tiers) from the touch record, the bandwidths and
 * the all-resident step; per-step detail appended to steps_out (a JSON array: objects with
 * "bytes" and "distinct" per tier, "expert_s" per tier and "predicted_step_s"), which may
 * be NULL. 0 or MOET_ENOMEM.
 */
int sb_predict(const sb_touch *t, const moet_placement_sizes *sz, const int16_t *owner,
	       int n_tiers, const sb_bw *bw, double resident_step_s, int streams,
	       json_t *steps_out, sb_pred *out);

/* ---- serve_bench.c / serve_bench_rec.c ------------------------------------------------------ */

/* One stream count's measurements (medians over the reps unless said). */
typedef struct sb_run {
	int n;                          /* streams */
	moet_bench_stats bare;          /* N decodes in lockstep: the median step (of reps) */
	moet_bench_stats replay;        /* the served steps run bare: forward time / steps */
	moet_bench_stats served;        /* served: wall / engine steps */
	moet_bench_stats full;          /* served steps of exactly N decodes: start to next start */
	moet_bench_stats full_fwd;      /* ... their forward calls */
	int full_reps;                  /* reps that had full steps (full* are 0 without) */
	double bare_min_s, full_min_s;  /* the least bare step, full step over all reps (what
					   another process's load cannot shorten) */
	double bare_tps, replay_tps, served_tps; /* N / bare; generated / replay; / served wall */
	double share, fwd;              /* engine outside forward; its forward per step (means) */
	double fwd_over_replay;         /* served forward time / the replay's (mean) */
	double outside_s;               /* (served wall - its forward time) / steps (mean) */
	uint64_t *hist;                 /* [n + 1] served steps by entries, summed over the reps */
	uint64_t steps;                 /* served steps over the reps (= the histogram's sum) */
	int prefill_steps, full_steps;  /* over the reps */
	int prompts_same;               /* every rep: each stream's prompt served once, no other */
	int distinct;                   /* distinct prompts the server ran (least over the reps) */
	int tokens_same;                /* every rep: the replay and the bare run drew the
					   server's tokens */
	uint64_t split[3];              /* two-micro-batch passes: bare, served, replay (sums) */
	int errors;
	json_t *last_steps;             /* the last rep's steps, served and replayed (columns) */
	moet_bench_stats resident;      /* with a placement: the all-resident bare step */
	sb_pred pred;
	json_t *pred_steps;             /* per-step detail of the prediction */
} sb_run;

/* Rows, ceilings and the "serve" object's runs into rec / jruns (serve_bench_rec.c); base =
 * the smallest stream count's run. 0 or MOET_ENOMEM. */
int sb_record(json_t *rec, json_t *jruns, const sb_run *runs, int n_runs, const sb_run *base,
	      const int16_t *owner, int n_devices, const sb_bw *bw);

/* The table (serve_bench_rec.c). */
void sb_table(FILE *f, const sb_run *runs, int n_runs, const sb_run *base, const int16_t *owner,
	      const char *placement);

#endif
