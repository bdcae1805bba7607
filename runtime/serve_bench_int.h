/*
 * serve_bench_int.h: private to `bench serve` (serve_bench.c, serve_bench_pred.c): the
 * routed experts each measured decode step touches, and the bytes-roofline prediction of a
 * hybrid placement's step from them (docs/serve.md).
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

#include "moet_model.h"
#include "moet_placement.h"

#define SB_MAX_TIERS 65 /* the CPU tier + 64 devices */

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

#endif
