/*
 * moet_xtier.h: the NVMe expert tier: the CPU tier's experts stay on disk and a host-RAM
 * cache of expert slots, filled by io_uring reads (moet_uring.h), holds the ones in use.
 *
 *   shards on disk        |..|gate w|gate s|up w|up s|down w|down s|..|  (one expert's tensors,
 *                                                                      merged into segments)
 *   slot (RAM, aligned)   [head|segment bytes ............ |tail]      one expert per slot
 *   views                 moet_ffn_w whose data/scale_inv point into the slot, at the same
 *                         address residue mod 4096 as in the mapping
 *
 * The CPU computes from the slot views with the same contract kernels, so results are
 * bit-identical to computing from the mapping (the bytes are the same). Which experts stay:
 * demand misses always enter (evicting the slot of least value = frequency x recency, the
 * frequency from a routing profile plus what this run observed); prefetched experts enter only
 * in place of a slot of lower value. Prefetch: after each layer, the next MoE layer's router
 * (rmsnorm with its post-attention norm, router linear, the reference selection) is applied
 * to the current hidden state, and the predicted experts' reads start at once; they complete
 * while the next layer's attention runs (io_uring works asynchronously). Recall of that
 * predictor and the cache's hit rate are counted (moet_xtier_stats_get). docs/io-uring.md.
 *
 * The CPU tier is owner -1 of the placement, or every routed expert when there is no
 * placement (CPU backend). The tier reads the placement at each acquire, so a placement set
 * after the budget is honoured. Single-threaded: the forward pass's thread calls everything.
 *
 * NUMA (runtime/xtier_numa.c): on a host of several nodes the slots get a memory policy
 * (mbind) before any page of them is touched: interleaved over the nodes whose cores run the
 * CPU tier's team (every expert's rows are split over all its workers), or preferred on the
 * one node when the team sits on one; moet_xtier_numa_verify asks the kernel (move_pages)
 * where the pages are. One node: no policy, as before.
 */
#ifndef MOET_XTIER_H
#define MOET_XTIER_H

#include <stddef.h>
#include <stdint.h>

#include "moet_backend.h"

typedef struct moet_xtier moet_xtier;
typedef struct moet_model moet_model;
typedef struct moet_uring moet_uring;
typedef struct moet_topo moet_topo;
struct moet_profile;

#define MOET_XTIER_MAX_NODES 64 /* NUMA node ids 0 .. 63 */

/* Memory policy of the slots (moet_xtier_opts.numa, moet_xtier_stats.numa_mode). */
enum {
	MOET_XTIER_NUMA_AUTO = 0,   /* decide from the topology and the CPU tier's team: off on
				       one node, else bind or interleave as below */
	MOET_XTIER_NUMA_OFF,        /* no policy: pages on the node of whoever faults them */
	MOET_XTIER_NUMA_BIND,       /* every slot preferred on one node (MPOL_PREFERRED) */
	MOET_XTIER_NUMA_INTERLEAVE, /* every slot's pages round-robin over nodes
				       (MPOL_INTERLEAVE) */
};

/*
 * Which predicted experts prefetch reads (moet_xtier_opts.prefetch_mode):
 *   BUDGET  a candidate is read ahead only when that is worth it by the tier's own
 *           measurements (xtier_run.c, xt_pf_take): with T its read time at the disk's rate
 *           (bytes completed per second of the disk being busy), W the time the disk would
 *           still be idle before the predicted layer's acquire (the measured prediction-to-use
 *           time less the bytes already loading / rate), p the predictor's precision (predicted
 *           CPU-tier experts the layer then used, smoothed) and m the demand misses per acquire
 *           (moving average, at most 1): take it iff p x clamp(W, 0, T) >= (1 - p) x T x m,
 *           i.e. the time a right guess saves against the disk time a wrong one takes from the
 *           next demand read; W goes down by T per candidate taken. On a disk whose expert
 *           read takes much longer than a layer (the H200 machine's virtual disk: 21 ms for
 *           44 MB against ~2 ms per layer at batch 1) it reads little or nothing ahead.
 *   ALL     every predicted candidate that finds a slot of lower value (the first policy;
 *           the reference path)
 * Measured (tests/xtier/slow_disk.sh, dev VM, docs/io-uring.md): with a throttled disk where
 * one expert's read takes ~6 all-in-RAM steps, BUDGET's mean decode step is 0.73 x ALL's at
 * batch 1 and 0.54 x at batch 16; unthrottled, about the same as ALL's. NOTE (where BUDGET
 * is too careful): it treats the disk as serving one read at a time at its measured rate, so
 * where reads are latency-bound and more in flight would go faster (small experts) it
 * declines some reads that would have arrived in time (test_xtier's model at 50%: hit rate
 * 0.863 against ALL's 0.934).
 */
enum { MOET_XTIER_PF_ENV = 0, MOET_XTIER_PF_BUDGET, MOET_XTIER_PF_ALL };

typedef struct moet_xtier_opts {
	size_t ram_budget_bytes;   /* host RAM for the slots (whole slots, alignment included) */
	const struct moet_profile *profile; /* routing frequencies (borrowed for the call), or
					     * NULL: recent use only */
	unsigned queue_depth;      /* io_uring requests in flight; 0: 64 */
	int direct;                /* MOET_URING_DIRECT_* (moet_uring.h); 0: auto */
	int no_prefetch;           /* 1: no router-based prefetch */
	int prefetch_mode;         /* MOET_XTIER_PF_*; 0: MOET_XTIER_PREFETCH=budget|all, else
				      budget */
	double pf_rate_Bps;        /* tests: the disk's rate the budget assumes (bytes/s); 0:
				      measured */
	double pf_window_ns;       /* tests: prediction-to-use time the budget assumes; 0:
				      measured */
	int no_warm;               /* 1: start empty (default: fill with the profile's hottest) */
	int no_register;           /* 1: do not register the slots with io_uring (registering
				      pins them: every page is faulted in up front) */
	int numa;                  /* MOET_XTIER_NUMA_*; AUTO (0) may be overridden by the
				      environment: MOET_XTIER_NUMA=auto|off|bind|interleave */
	uint64_t numa_nodes;       /* BIND / INTERLEAVE: the OS nodes (bit n: node n); 0: the
				      nodes of the team's cores (BIND: the lowest of them) */
	int64_t trace_cap;         /* lookups the trace keeps (moet_xtier_stats_bounds); 0:
				      MOET_XTIER_TRACE_CAP; < 0: no trace */
	/* warm fill progress (optional): bytes of experts read so far, of total */
	void (*progress)(void *ctx, uint64_t done_bytes, uint64_t total_bytes);
	void *progress_ctx;
} moet_xtier_opts;

typedef struct moet_xtier_stats {
	/* geometry */
	size_t slot_bytes;         /* RAM per slot */
	int64_t n_slots;
	int64_t tier_experts;      /* experts in the CPU tier at creation */
	size_t tier_bytes;         /* their checkpoint bytes (weights and scales) */
	int direct;                /* 1: every shard read with O_DIRECT */
	int registered;            /* 1: slots are registered io_uring buffers */
	/* cache */
	uint64_t lookups;          /* (layer call, expert) acquisitions */
	uint64_t hits;             /* resident at lookup */
	uint64_t late_hits;        /* prefetch in flight at lookup (waited for the rest) */
	uint64_t misses;           /* demand reads */
	uint64_t evictions;
	uint64_t prefetch_reads;   /* experts read ahead */
	uint64_t prefetch_used;    /* of those, acquired before eviction */
	uint64_t prefetch_declined; /* candidates the budget did not read (mode BUDGET) */
	uint64_t warm_reads;       /* experts read at creation */
	/* predictor */
	uint64_t predicted;        /* CPU-tier experts predicted for the next layer */
	uint64_t actual;           /* CPU-tier experts the predicted layers then needed */
	uint64_t predicted_hits;   /* in both */
	uint64_t chance_hits_x1e6; /* expected hits of a random prediction of the same sizes,
				      times 1e6 (recall of chance = this / 1e6 / actual) */
	/* I/O */
	uint64_t bytes_read;       /* bytes that reached slots (exact, per expert) */
	uint64_t read_errors;      /* failed expert reads (demand and prefetch) */
	uint64_t wait_ns;          /* time acquire spent waiting for reads */
	uint64_t warm_ns;          /* time of the warm fill (reads) */
	uint64_t alloc_ns;         /* time to allocate and register the slots */
	/* trace (since creation or the last reset): every lookup in order, up to the cap */
	uint64_t trace_len;        /* lookups traced */
	uint64_t trace_cut;        /* lookups past the cap, not traced (0: the trace is whole) */
	uint64_t trace_hits;       /* hits + late hits among the traced lookups */
	uint64_t trace_fetches;    /* expert reads started (demand and prefetch) while the trace
				      recorded and was not cut */
	int64_t trace_start_resident; /* slots holding (or reading) an expert at its start */
	/* hindsight bounds on the traced lookups, for n_slots slots (moet_xtier_stats_bounds;
	 * all 0 from moet_xtier_stats_get) */
	int bounds_valid;          /* 1: the three below are computed */
	uint64_t opt_hits;         /* Belady/MIN, a demand cache from the tier's start contents */
	uint64_t opt_any_hits;     /* Belady/MIN from the best start contents (any warm fill) */
	uint64_t static_hits;      /* the n_slots most-used experts of the trace, never evicted */
	/* the prefetch budget's inputs now (moet_xtier_stats_get; carried over a reset) */
	int prefetch_mode;         /* MOET_XTIER_PF_BUDGET or _ALL in effect */
	double pf_rate_Bps;        /* disk rate: bytes read / time busy (0: not measured yet) */
	double pf_window_ns;       /* prediction-to-acquire time, moving average (0: none yet) */
	double pf_precision;       /* (predicted and used + 1) / (predicted + 2) over the run */
	double pf_miss_avg;        /* demand misses per acquire, moving average */
	/* NUMA: the slots' policy (set at creation) and where the last moet_xtier_numa_verify
	 * found their pages (zero before one). Kept last: moet_xtier_stats_reset keeps them
	 * as one block. */
	int numa_mode;             /* MOET_XTIER_NUMA_OFF / _BIND / _INTERLEAVE in effect */
	uint64_t numa_node_mask;   /* the policy's OS nodes (bit n: node n); 0 with OFF */
	char numa_note[192];       /* the decision in words (and a refusal's errno text) */
	uint64_t numa_pages;       /* pages queried */
	uint64_t numa_absent;      /* of those, not faulted in yet (no node) */
	uint64_t numa_off_policy;  /* of those, on a node outside the policy's (BIND: only
				      when the preferred node was full; OFF: 0) */
	uint64_t numa_node_pages[MOET_XTIER_MAX_NODES]; /* pages found on node n */
	int64_t numa_node_slots[MOET_XTIER_MAX_NODES];  /* slots whose queried pages are all
							   on node n */
	int64_t numa_spread_slots; /* slots with pages on more than one node (interleave) */
	int64_t numa_empty_slots;  /* slots with no page faulted in */
	uint64_t numa_verify_ns;
} moet_xtier_stats;

/*
 * Puts the model's CPU tier behind an expert cache of o->ram_budget_bytes (replacing any
 * earlier one; bytes 0 or o NULL removes it). Opens every shard for io_uring reads, sizes
 * the slots (the largest expert's segments with alignment slack), allocates and registers
 * them, and unless o->no_warm fills them with the hottest experts by the profile. Errors:
 * MOET_EINVAL (budget below one slot; profile of another geometry), MOET_EUNSUP (a non-CPU
 * backend without a placement: no CPU tier), MOET_EIO (a shard cannot be opened or read),
 * MOET_ENOMEM.
 */
int moet_model_set_xtier(moet_model *m, const moet_xtier_opts *o);

/* The geometry a tier would have (slot_bytes, tier_experts, tier_bytes, direct; n_slots 0)
 * without allocating slots or reading experts: for budgets given as a share of the tier.
 * Errors as moet_model_set_xtier. */
int moet_xtier_plan(moet_model *m, moet_xtier_stats *out);

/* The model's tier, or NULL. Borrowed. */
moet_xtier *moet_model_xtier(const moet_model *m);

/* ---- NUMA placement of the slots (runtime/xtier_numa.c) --------------------------------- */

typedef struct moet_xtier_numa_plan {
	int mode;                  /* MOET_XTIER_NUMA_OFF / _BIND / _INTERLEAVE */
	int n_nodes;               /* nodes of the policy (0 with OFF) */
	int nodes[MOET_XTIER_MAX_NODES];   /* their OS ids, ascending */
	int workers[MOET_XTIER_MAX_NODES]; /* team workers on nodes[i] (forced nodes: 0 if none) */
	uint64_t mask;             /* the same nodes as bits */
	char why[192];             /* the decision in words */
} moet_xtier_numa_plan;

/*
 * Pure: the slots' policy for topology t when the CPU tier's experts are computed by a team
 * on cores team_cores[0 .. n_team) (moet_topo core indices; n_team 0: threads not pinned,
 * i.e. anywhere). want is MOET_XTIER_NUMA_*; want_nodes forces the nodes of BIND/INTERLEAVE
 * (0: the team's). AUTO: OFF when t has one node (or none of the team's cores has a node),
 * BIND when the team's cores are on one node, else INTERLEAVE over the team's nodes.
 * NOTE (why interleave): the executor splits every expert's rows over all its workers,
 * claimed dynamically, so no node's cores own an expert; interleaving each slot spreads every
 * expert's bytes over the memory controllers of the nodes that read them. Errors: MOET_EINVAL
 * (NULL, n_team < 0, a core out of range, want out of range), MOET_ERANGE (want_nodes names a
 * node t does not have, or more than MOET_XTIER_MAX_NODES).
 */
int moet_xtier_numa_decide(const moet_topo *t, const int *team_cores, int n_team, int want,
			   uint64_t want_nodes, moet_xtier_numa_plan *out);

/*
 * Asks the kernel where the slots' pages are (move_pages in query mode; mincore on a kernel
 * without NUMA, where a present page is on node 0): every stride_pages-th page (1: every
 * page; others take one page at a varying position in each window of stride_pages, so an
 * interleave cannot alias with the stride). Fills the numa_* counters of the stats. Cost:
 * about 70 ns per page queried on the development VM (0.1 s per 6 GB of slots). Errors:
 * MOET_EINVAL (stride 0), MOET_EIO (move_pages failed), MOET_ENOMEM.
 */
int moet_xtier_numa_verify(moet_xtier *x, size_t stride_pages);

/* Counters since creation (or the last reset; geometry and NUMA facts are kept). A reset
 * also restarts the trace (its start contents: the slots holding or reading an expert then). */
void moet_xtier_stats_get(const moet_xtier *x, moet_xtier_stats *out);
void moet_xtier_stats_reset(moet_xtier *x);

/* ---- hindsight bounds on the tier's own trace (issue 9; docs/io-uring.md) ----------------
 *
 * The trace: one entry per lookup (a (layer call, expert) acquisition: what `lookups`
 * counts), key = layer x n_routed_experts + expert, in the order acquire met them; passes and
 * steps are not marked (a bench knows its step count). Kept up to trace_cap lookups (4 bytes
 * each; default MOET_XTIER_TRACE_CAP = 1M = 4 MB), the rest counted in trace_cut and the bounds
 * then cover the prefix only (compare them with trace_hits, not hits).
 *
 * The bounds treat each lookup as one access of a demand-fetch cache of n_slots slots: an
 * expert is read only when a lookup misses, and then must enter (MIN evicts the resident one
 * whose next use is farthest). NOTE (prefetch): the tier also reads ahead, and a prefetching
 * cache can score more hits than demand MIN (it reads before the lookup). What holds for any
 * cache of n_slots slots from the same start contents, prefetching or not, is on reads: it
 * cannot serve the trace with fewer reads than MIN's misses (a prefetching schedule can be
 * made lazy without adding reads). So: trace_fetches >= trace_len - opt_hits always, and
 * trace_hits <= opt_hits when nothing is prefetched; opt_any_hits >= opt_hits. The static
 * set is another policy class: a miss outside the set is served without entering the cache
 * (admission control, which a demand cache may not do), so it can score above MIN (a b c
 * repeated, 2 slots: static 2/3, MIN 5/9 from any start) or below it.
 */
#define MOET_XTIER_TRACE_CAP (1 << 20)

/* moet_xtier_stats_get plus the bounds (bounds_valid 1) computed from the trace: O(n log n)
 * time, about n x 24 bytes of scratch. Errors: MOET_ENOMEM (the counters are still set). */
int moet_xtier_stats_bounds(const moet_xtier *x, moet_xtier_stats *out);

/* The trace (borrowed, valid until the next lookup or reset); *out_n its length. */
const int32_t *moet_xtier_trace(const moet_xtier *x, int64_t *out_n);

/*
 * Pure: the misses of Belady/MIN on keys[0 .. n) (each in [0, n_keys)) with n_slots slots,
 * starting with the distinct keys init[0 .. n_init) resident (n_init <= n_slots). Ties of
 * the farthest next use (experts never used again) are broken arbitrarily: the count is the
 * same. Errors: MOET_EINVAL (n_slots < 1, a key out of range, n_init > n_slots, a repeated
 * init key), MOET_ENOMEM.
 */
int moet_xtier_min_misses(const int32_t *keys, int64_t n, int64_t n_keys, int64_t n_slots,
			  const int32_t *init, int64_t n_init, uint64_t *out_misses);

/*
 * Pure: the misses of MIN from the best start contents: MIN's misses from empty less
 * min(n_slots, distinct keys) (the first fills are the start contents; no start does better:
 * docs/io-uring.md). Errors as moet_xtier_min_misses.
 */
int moet_xtier_min_misses_any_start(const int32_t *keys, int64_t n, int64_t n_keys,
				    int64_t n_slots, uint64_t *out_misses);

/* Pure: the hits of the best static set: the counts of the n_slots most frequent keys of
 * keys[0 .. n), summed. Errors: MOET_EINVAL (n_slots < 0, a key out of range), MOET_ENOMEM. */
int moet_xtier_static_hits(const int32_t *keys, int64_t n, int64_t n_keys, int64_t n_slots,
			   uint64_t *out_hits);

/* 1 if expert e of MoE layer l is in a slot with all its bytes read (tests). */
int moet_xtier_is_resident(const moet_xtier *x, int64_t layer, int64_t expert);

/* The tier's reader (fault injection in tests: moet_uring_fault). Borrowed. */
moet_uring *moet_xtier_reader(moet_xtier *x);

/* Accepts NULL. Waits for reads in flight. */
void moet_xtier_destroy(moet_xtier *x);

/* ---- the engine's side (runtime/dispatch.c, runtime/forward.c) --------------------------- */

/*
 * Makes resident the experts of a prefix of pairs[0 .. n_pairs) (CPU-tier pairs of MoE layer
 * `layer`, sorted by expert as moet_expert_pairs_sort orders them): as many whole experts as
 * the slots hold at once (at least one). *out_table gets views indexed by expert id, valid for
 * the experts of that prefix until moet_xtier_release; *out_n_pairs the prefix's length.
 * Waits for the reads it needs. On error (a read failed: detail names the file, offset and
 * errno text) nothing of the failed read stays cached and the pins are dropped; the next call
 * reads again.
 */
int moet_xtier_acquire(moet_xtier *x, int64_t layer, const moet_expert_pair *pairs,
		       int64_t n_pairs, const moet_ffn_w **out_table, int64_t *out_n_pairs);

/* Unpins what the last acquire of `layer` pinned. */
void moet_xtier_release(moet_xtier *x, int64_t layer);

/*
 * Called after layer `layer` with the hidden state x [n x hidden] (backend memory): predicts
 * the next MoE layer's experts with its router and starts their reads. Best effort: never
 * fails the pass (failures are counted in read_errors and the demand path reads again).
 */
void moet_xtier_prefetch(moet_xtier *x, int64_t layer, const float *x_rows, int64_t n);

#endif
