/*
 * xtier_int.h: internals of the NVMe expert tier shared by xtier.c (layout, slots, creation,
 * warm fill) and xtier_run.c (acquire, release, prefetch, eviction). Not a public header.
 */
#ifndef MOET_XTIER_INT_H
#define MOET_XTIER_INT_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "model_int.h"
#include "moet_uring.h"
#include "moet_xtier.h"

#define XT_TENSORS 6          /* gate, gate scale, up, up scale, down, down scale */
#define XT_MERGE_GAP (64u << 10) /* tensors closer than this in a shard are read as one */

enum { XT_FREE = 0, XT_LOADING, XT_READY };

/* A run of one expert's bytes in one shard, read by one range. */
typedef struct xt_seg {
	int file;                 /* reader file id (= shard index) */
	uint64_t off;             /* file offset of the first byte */
	size_t bytes;
	size_t slot_off;          /* MOET_URING_ALIGN-aligned start of its buffer in the slot */
} xt_seg;

/* Where an expert's bytes are and how they sit in a slot. */
typedef struct xt_info {
	int n_seg;
	xt_seg seg[XT_TENSORS];
	size_t tpos[XT_TENSORS];  /* slot byte position of each tensor's first byte (scales of
				     a model without them: unused) */
	size_t bytes;             /* exact bytes of its tensors */
	size_t slot_need;         /* slot bytes its segments need */
} xt_info;

typedef struct xt_slot {
	int64_t layer, expert;    /* what it holds (LOADING or READY); -1 when FREE */
	int state;                /* XT_* */
	int pins;
	int failed;               /* a segment's read failed (slot is FREE again) */
	int prefetched;           /* read ahead and not acquired since */
	int demand;               /* read for an acquire */
	unsigned segs_left;
	uint64_t last_use;        /* tick of the last acquire */
	uint64_t round;           /* prefetch round that protects it */
	moet_ffn_w views;         /* READY: views into the slot */
} xt_slot;

struct moet_xtier {
	moet_model *m;            /* borrowed: the model owns the tier */
	moet_xtier_opts o;
	moet_uring *u;
	int64_t L, E, H, k;
	int64_t n_moe;            /* MoE layers */
	xt_info *info;            /* [L x E] (MoE layers only filled) */
	int32_t *where;           /* [L x E]: slot or -1 */
	double *prior;            /* [L x E]: profile counts (0 without a profile) */
	double *prior_tot;        /* [L] */
	uint64_t *obs;            /* [L x E]: pairs acquired this run */
	uint64_t *obs_tot;        /* [L] */
	size_t slot_bytes;
	int64_t n_slots;
	uint8_t *mem;             /* n_slots x slot_bytes, page-aligned (mmap) */
	xt_slot *slots;
	int32_t *pinned;          /* slots pinned by the last acquire */
	int64_t *pinned_e;        /* their experts (acquire's list; allocated once) */
	int64_t n_pinned;
	moet_ffn_w *table;        /* [E]: acquire's answer */
	uint64_t tick, round;
	/* predictor */
	int64_t *next_moe;        /* [L]: the next MoE layer after l, or -1 */
	moet_mat *router;         /* [L]: host views of the routers (MoE layers) */
	float **router_bias;      /* [L]: decoded, owned (MoE layers) */
	float **post_norm;        /* [L]: decoded, owned (MoE layers) */
	int64_t pred_layer;       /* the layer the prediction is for, or -1 */
	uint8_t *pred;            /* [E]: predicted experts of pred_layer */
	int64_t pred_cpu;         /* how many of them are in the CPU tier */
	/* the prefetch budget (moet_xtier.h, MOET_XTIER_PF_BUDGET): the disk's busy time (some
	 * slot loading) and the bytes it delivered, what is loading now, the prediction-to-use
	 * time and misses per acquire (moving averages), the predictor over the run */
	int pf_mode;
	int64_t n_loading;
	uint64_t loading_bytes, io_bytes, io_busy_ns, io_busy_t0, pf_t0;
	double pf_window_ns, pf_miss_avg;
	uint64_t pred_tot, pred_hit_tot;
	float *scr;               /* prefetch scratch */
	size_t scr_elems;
	/* slot registration in groups of whole slots (alloc_slots); with a warm fill, group g
	 * is registered just before its slots' reads start, overlapping earlier groups' reads */
	void **reg_buf;           /* [n_reg] */
	size_t *reg_bytes;
	int n_reg, reg_done;      /* groups, and groups registered so far */
	int64_t reg_per;          /* slots per group */
	/* the lookup trace (moet_xtier_stats_bounds): keys l x E + e, up to tr_cap */
	int32_t *tr;
	int64_t tr_n, tr_alloc, tr_cap;
	int32_t *tr_init;         /* [n_slots]: keys resident (or loading) at the trace's start */
	char err[512];            /* the last failed read */
	moet_xtier_stats st;
};

/*
 * The prefetch budget's rule (moet_xtier.h): read a candidate ahead iff
 * p x clamp(w, 0, t) >= (1 - p) x t x min(m, 1), with t its read time, w the disk's idle time
 * left before the acquire (ns), p the predictor's precision, m misses per acquire.
 */
static inline int xt_pf_take(double p, double m, double t, double w)
{
	const double saved = w <= 0 ? 0 : w < t ? w : t;
	return p * saved >= (1.0 - p) * t * (m < 1 ? m : 1);
}

double xt_io_rate(const moet_xtier *x);

/* Is expert e of layer l in the CPU tier now? */
static inline int xt_is_cpu(const moet_xtier *x, int64_t l, int64_t e)
{
	return !x->m->owner || x->m->owner[l * x->E + e] < 0;
}

/* xtier.c: starts the reads of expert (l, e) into slot s (state LOADING). */
int xt_load(moet_xtier *x, int64_t s, int64_t l, int64_t e, int demand);

/* xtier.c: one lookup of (l, e) into the trace (acquire, after counting it). */
void xt_trace_add(moet_xtier *x, int64_t l, int64_t e);

/* xtier_numa.c: decides the slots' NUMA policy (x->o.numa, MOET_XTIER_NUMA, the topology and
 * the CPU team) and applies it to the fresh mapping x->mem of total_bytes (mbind, before any
 * page is touched); the outcome in x->st.numa_*. A refused mbind is a note, not an error.
 * Errors: MOET_EINVAL (a bad MOET_XTIER_NUMA), MOET_ERANGE (numa_nodes names a node this
 * machine lacks), MOET_EIO (topology), MOET_ENOMEM. */
int xt_numa_place(moet_xtier *x, size_t total_bytes);

/* xtier_run.c: the value of keeping (l, e) (frequency x recency; higher stays). */
double xt_value(const moet_xtier *x, int64_t l, int64_t e, uint64_t last_use);

#endif
