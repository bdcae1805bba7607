/*
 * moet_model.h: the model graph of the DeepSeek-V3 family over a checkpoint read in place,
 * and a sequence's KV cache.
 *
 *   tokens -> embed -> [ layer l: x += attn(rmsnorm(x)); x += mlp_or_moe(rmsnorm(x)) ] x L
 *          -> rmsnorm -> lm_head -> logits
 *
 * The routed experts are computed by the contract kernel straight from the checkpoint's
 * bytes; every other weight is read in place too (FP8 weights with their block scales through
 * the same contract dot). Results are deterministic and batch-invariant: a token's logits do
 * not depend on how many tokens are passed in one call.
 */
#ifndef MOET_MODEL_H
#define MOET_MODEL_H

#include <stdint.h>
#include <stdio.h>

#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_sample.h"

typedef struct moet_model moet_model;
typedef struct moet_kv moet_kv;

/*
 * Opens the checkpoint directory DIR: config.json, the shards, and every tensor the graph
 * needs, with its shape checked against config.json. MTP layers (model.layers.L for L >=
 * num_hidden_layers) are accepted and skipped. Returns 0 and *out, or a negative code with a
 * one-line detail in moet_errmsg() naming the file, tensor or field.
 */
int moet_model_open(const char *dir, moet_model **out);

/* The same on a named backend: "cpu" (the reference backend) or "cuda". */
int moet_model_open_on(const char *dir, const char *device, moet_model **out);

/* moet_model_open_on with the dense part split over tp ranks (runtime/tp.c: CUDA devices
 * 0..tp-1, or CPU backends); tp 0 reads MOET_TP (what moet_model_open_on does), 1 no split.
 * MOET_EINVAL for tp outside 0..8. */
int moet_model_open_tp(const char *dir, const char *device, int tp, moet_model **out);

/* Accepts NULL. */
void moet_model_close(moet_model *m);

/* MOET_TRACE=FILE at open (docs/cli.md): the timeline of the model's passes, one JSON file of
 * Chrome trace events (runtime/moet_trace.h). This ends it now and returns its first write error
 * (MOET_EIO naming the file; 0 without a trace); moet_model_close ends it too, quietly. */
int moet_model_trace_end(moet_model *m);

/* Borrowed; valid while the model is open. */
const moet_config *moet_model_config(const moet_model *m);
const moet_ckpt *moet_model_ckpt(const moet_model *m);

/*
 * KV caches (runtime/kv_pool.c). A pool is one backend allocation of a fixed budget of
 * positions, cut into blocks of block_tokens positions (a power of two); a sequence's cache
 * (moet_kv) holds a block table and takes blocks from its pool as moet_model_forward(_batch)
 * writes past its last block, and gives them all back at reset or destroy. A pass that needs
 * more blocks than its pool has free fails with MOET_ERANGE naming the pool's budget, and no
 * cache changes. Pools and caches are used by the thread that runs the model's passes (no
 * locking); a pool lives until it and every cache made from it are destroyed.
 */
typedef struct moet_kv_pool moet_kv_pool;

#define MOET_KV_BLOCK_TOKENS 64 /* the default block size, positions */

/* Bytes of backend memory one cached position takes over all layers, in the model's MLA form
 * (expanded: heads x (qk_head + v_head) floats per layer; absorbed: kv_lora + rope), on the
 * backend's device: with MOET_TP's attention split by heads, rank 0's heads only. */
size_t moet_kv_token_bytes(const moet_model *m);

/*
 * The KV budget that fits: min(cap, floor(share x free_bytes / token_bytes)) positions, where
 * free_bytes is the memory the model's backend has free now (CUDA: the device's free memory;
 * CPU: the host's MemAvailable), so a server sized after the weights (and the placement's
 * experts) are in. *out_free gets free_bytes (may be NULL). Errors: MOET_EDEVICE when the
 * backend's free memory cannot be read, MOET_ENOMEM (naming the bytes per position, the free
 * bytes and the MLA form) when fewer than min_tokens positions fit.
 */
int moet_kv_fit_tokens(const moet_model *m, double share, int64_t cap, int64_t min_tokens,
		       int64_t *out_tokens, size_t *out_free);

/*
 * A pool of budget_tokens positions rounded down to whole blocks of block_tokens (0: 64; a
 * power of two, 1 .. 65536), allocated at once on the model's backend. Errors: MOET_EINVAL
 * (block size, or a budget below one block), MOET_ENOMEM (naming the bytes).
 */
int moet_kv_pool_create(const moet_model *m, int64_t budget_tokens, int64_t block_tokens,
			moet_kv_pool **out);
/* Drops the caller's hold; the memory goes when the last cache of the pool is destroyed too.
 * Accepts NULL. */
void moet_kv_pool_destroy(moet_kv_pool *p);
int64_t moet_kv_pool_blocks(const moet_kv_pool *p);      /* blocks in all */
int64_t moet_kv_pool_free_blocks(const moet_kv_pool *p); /* blocks no cache holds */
int64_t moet_kv_pool_block_tokens(const moet_kv_pool *p);

/* A cache for one sequence of at most max_tokens positions (0: the pool's budget) drawing its
 * blocks from pool (which it holds: the pool outlives it). Holds no block until written.
 * Errors: MOET_EINVAL (max_tokens), MOET_ENOMEM. */
int moet_kv_create_in(moet_kv_pool *pool, int64_t max_tokens, moet_kv **out);

/* A KV cache for one sequence of at most max_tokens positions, in a private pool of exactly
 * that size (one block: positions laid out contiguously per layer). */
int moet_kv_create(const moet_model *m, int64_t max_tokens, moet_kv **out);
/* Returns the cache's blocks to its pool. Accepts NULL. */
void moet_kv_destroy(moet_kv *kv);
int64_t moet_kv_len(const moet_kv *kv);
/* Blocks the cache holds now. */
int64_t moet_kv_blocks(const moet_kv *kv);
/* Empties the cache for another sequence: its blocks go back to the pool. */
void moet_kv_reset(moet_kv *kv);

/*
 * Runs n_tok tokens of one sequence at positions moet_kv_len(kv) ... + n_tok - 1, appends
 * them to the cache, and writes logits [n_tok][vocab_size] to out_logits (or, when out_logits
 * is NULL, computes no logits). Token ids must be in [0, vocab_size). Errors: MOET_ERANGE
 * (token id, cache full, no free block in the cache's pool), MOET_ENOMEM. One forward pass
 * at a time per model (the pass's buffers belong to the model); batch sequences with
 * moet_model_forward_batch instead.
 */
int moet_model_forward(moet_model *m, moet_kv *kv, const int64_t *tokens, int64_t n_tok,
		       float *out_logits);

/* One sequence's part of a batch. */
typedef struct moet_seq_step {
	moet_kv *kv;           /* the sequence's cache; tokens go to positions kv->len .. */
	const int64_t *tokens; /* n_tok ids in [0, vocab_size) */
	int64_t n_tok;
	float *out_logits;     /* [n_tok][vocab] (or [vocab] with last_only), or NULL: none */
	int last_only;         /* logits of the last token only */
	/* The next token, drawn from the last token's logits with moet_sample (position
	 * kv->len + n_tok), into *out_token (NULL: none); on a backend that samples (CUDA) only
	 * the id leaves the device (moet_backend_draw; MOET_SAMPLE_DEVICE=0: on the host). */
	const moet_sample_params *sample;
	int64_t *out_token;
} moet_seq_step;

/*
 * Runs a batch of sequences in one pass (ragged lengths, each at its own positions) and
 * advances each cache by its n_tok. Each sequence's logits are bit-identical to running it
 * alone (batch invariance). Two entries must not share a cache. Errors as for
 * moet_model_forward, naming the entry; on error no cache advances and every cache keeps the
 * blocks it held before (a failed batch may leave K/V rows written past kv->len in those,
 * which the next call overwrites).
 */
int moet_model_forward_batch(moet_model *m, const moet_seq_step *steps, int n_steps);

/*
 * Places the routed experts: owner[l * n_routed_experts + e] = -1 (the CPU tier: computed from
 * the checkpoint's mapped bytes) or g in [0, n_devices) (device g). On the CPU backend the
 * devices are simulated: test doubles, each with a private copy of its experts' bytes,
 * computed by the same kernels; any placement gives the same logits bit for bit (the
 * contract). On a GPU backend device g is CUDA device g, device 0 the backend's own: each
 * gets only the experts it owns (device 0: all of them if a pass ran before without a
 * placement), devices 1.. compute theirs on copies of the hidden rows (runtime/remote.c), the
 * CPU tier runs on the hybrid engine's executor (runtime/hybrid.c). owner NULL removes the
 * placement. The table is copied. Errors: MOET_EINVAL (an owner out of range), MOET_EDEVICE
 * (fewer CUDA devices than n_devices, or a CUDA failure), MOET_ENOMEM.
 */
int moet_model_set_placement(moet_model *m, const int16_t *owner, int n_devices);

/* MOET_TP (runtime/tp.c, read at open): the ranks the dense part's large matrices (q_b or
 * q_proj, kv_b, o_proj, the dense MLP and shared experts, lm_head) are split over by output
 * rows, 1 without a split; bytes (optional, [ranks]): each rank's bytes of those matrices. */
int moet_model_tp_ranks(const moet_model *m, uint64_t *bytes);
/* How MOET_TP runs the attention: 0 whole on rank 0 (or no split), 1 split by heads with q
 * and kvb from rank 0, 2 split by heads with each rank computing its heads' q and kvb (the
 * split of q_b and kv_b falls on head boundaries). */
int moet_model_tp_attention(const moet_model *m);

/* Prefill staging's slots (runtime/stage.c) on the first GPU, one expert's bytes each, made at
 * the first staged expert: with MOET_STAGE_COPY=pinned (the default on a GPU: waves of 4
 * experts, one half of the ring computing, the other filling) and with driver (one expert at
 * a time: one computing, one copying, one spare). */
#define MOET_STAGE_SLOTS_PINNED 8
#define MOET_STAGE_SLOTS_DRIVER 3

/* What the hybrid engine's CPU tier did (runtime/hybrid.c), summed since the placement was
 * set or the stats were reset. Times are wall-clock ns seen by the thread driving the pass. */
typedef struct moet_hybrid_stats {
	uint64_t calls;      /* MoE layer calls with work for the CPU tier */
	uint64_t cpu_pairs;  /* routing pairs the CPU tier computed */
	uint64_t cpu_calls;  /* expert calls it ran for them: one per expert and MoE layer call,
				more where an expert had more rows than one call takes */
	uint64_t cpu_weight_bytes; /* the weights those calls read (codes and block scales) */
	uint64_t ns_cpu;     /* from the tier's submit to its end: exact when it runs alone
				(overlap off), else to the moment the driver saw it done */
	uint64_t ns_wait;    /* the driving thread blocked waiting for the tier */
	uint64_t ns_cpu_run; /* the executor team's own span of each call (its first worker's
				start to its last worker's end), summed: the tier's time also
				when overlapped */
	uint64_t ns_cpu_start; /* from each call's submit to its first worker's start */
	uint64_t ns_cpu_wake;  /* from each call's last worker's end to the driving thread's
				  return from its wait, where it was waiting by then */
	uint64_t bytes_d2h;  /* hidden rows copied to the host staging (MOET_MB_QUEUE=1: every
				row of each queued layer, copied whole) */
	uint64_t bytes_h2d;  /* expert outputs copied back to the backend */
	uint64_t ns_d2h, ns_h2d;
	uint64_t split_passes; /* forward passes run as two pipelined micro-batches */
	uint64_t stream_passes; /* of which with the halves on two streams (MOET_MB_STREAMS) */
	uint64_t polled_passes; /* of which with the driver polling both halves (MOET_MB_POLL) */
	uint64_t price_passes[3]; /* MOET_STAGE_BALANCE=auto: passes at each link price (none,
				     1, 2 times MOET_STAGE_LINK_PRICE) */
	uint64_t d2h_copies; /* copies of hidden rows: only the rows the CPU tier's pairs use, in
				ranges (gaps merged when cheaper than a copy's latency); queued:
				one per layer */
	uint64_t staged_experts; /* cold experts computed on the backend (GPU 0) from a staging
				    slot instead (MOET_PREFILL_STAGE; counted in the CPU's
				    tier_counts, not in cpu_pairs) */
	uint64_t staged_pairs;   /* their routing pairs */
	uint64_t bytes_staged;   /* their weights' bytes copied host -> backend */
	uint64_t ns_stage;       /* the driving thread's time staging (copies, waits, launches) */
	uint64_t ns_stage_copy;  /* of which in the copies (MOET_STAGE_COPY=pinned: the
				    uploader's runs; driver: queueing them) */
	uint64_t ns_stage_wait;  /* of which waiting for a slot's last kernel (or its copies) */
	uint64_t ns_stage_link;  /* the staged copies' own time (bytes_staged over it: their
				    rate): driver copies on a GPU, the device's between marks on
				    the copy stream; else the copying thread's (stage.c) */
	uint64_t devgroup_calls; /* MoE layer calls grouped on the device (MOET_GPU_DEVGROUP=1:
				    no id download, no host grouping; with or without placement) */
	uint64_t merged_calls;   /* MoE layer calls of the home device that computed both
				    micro-batches' pairs in one (MOET_MB_MERGE=1) */
	uint64_t ns_gpu_idle;    /* with moet_model_set_gpu_idle: the home device's time with
				    nothing queued while the driver waited (for each MoE layer's
				    routing ids, their grouping and the CPU tier's start; for the
				    CPU tier's end): its idle marks, taken after each pass */
	uint64_t ns_gpu_idle_route; /* of which at the routing's waits (the rest at the CPU
				       tier's end) */
	uint64_t queued_finishes; /* CPU-tier calls whose end the device's queue waited for
				     (MOET_TIER_FINISH=queued), the driver going on */
	uint64_t early_layers;   /* MoE layers whose next attention block ran early for the
				    rows without CPU-tier pairs (MOET_EARLY_ROWS) */
} moet_hybrid_stats;

/* What binding a placement made resident of its CPU tier (MOET_CPU_RESIDENT: populate, the
 * default; lock; off; docs/residency.md "In the engine"). Zeros without a placement, with
 * off, or with no expert on the CPU. */
typedef struct moet_resident_report {
	int64_t experts;         /* CPU-tier experts (layer, expert) */
	uint64_t bytes;          /* their tensors' bytes (codes and scales) */
	uint64_t populated_bytes;/* page-rounded bytes read in and mapped */
	uint64_t populate_ns;    /* the populate's wall time */
	int locked;              /* 1: every range mlock'd (MOET_CPU_RESIDENT=lock) */
	uint64_t locked_bytes;
	char note[512];          /* lock asked and not done: why, with the limit */
	/* the last moet_model_resident_check (zeros before the first) */
	uint64_t checks;         /* checks run */
	uint64_t pages_checked, pages_resident;
	uint64_t evicted_ranges; /* tensors with a checked page not in memory */
	char evicted_example[160]; /* one of them in words (moet_res_describe), or "" */
} moet_resident_report;
void moet_model_resident_report(const moet_model *m, moet_resident_report *out);

/* Checks that the CPU tier made resident at the bind still is (mincore over every
 * stride_pages-th page, the phase advancing per call) and updates the report's check fields.
 * No-op (0) without a resident set (MOET_CPU_RESIDENT=off, no placement or no CPU expert).
 * Errors: MOET_EINVAL (stride 0), MOET_ERANGE (a mapping is gone). The engine's thread only. */
int moet_model_resident_check(moet_model *m, size_t stride_pages);

/* The CPU tier's counters (zeros without a placement; devgroup_calls counts either way);
 * reset clears them after reading. */
void moet_model_hybrid_stats(moet_model *m, moet_hybrid_stats *out, int reset);

/* MOET_CUDA_GRAPH=1 (runtime/graph.c): passes captured into CUDA graphs, replayed, captures
 * that failed (then run directly) and graphs dropped (buffers changed, or evicted); last_error:
 * why the last capture failed (empty if none). reset clears them after reading. */
typedef struct moet_graph_stats {
	uint64_t captured, replayed, failed, dropped;
	char last_error[200];
} moet_graph_stats;
void moet_graph_stats_get(moet_model *m, moet_graph_stats *out, int reset);

/* MOET_GPU_DEVGROUP is read once per process, at the first MoE layer call that asks for it,
 * and kept (a value it refuses is not: every call refuses it again, naming it). A program
 * that changes the variable afterwards (setenv, unsetenv: tests) calls this between passes,
 * so the next call reads it again. Thread-safe. */
void moet_devgroup_env_reset(void);

/* The routed experts' upload to a GPU backend so far (at the placement, or at the first pass
 * without one): bytes (codes and scales) and wall seconds. */
void moet_model_upload_stats(const moet_model *m, double *out_bytes, double *out_seconds);
/* Of that upload through the staged source (GPU 0's): the seconds the driving thread waited for
 * the threads' fills of the staging chunks, and for the link (a buffer's copy to end before
 * it is filled again, and the last copies); 0 for other sources. */
void moet_model_upload_split(const moet_model *m, double *out_fill_s, double *out_wait_s);

/* The dense matrices' bulk upload at open on a device backend (embedding, attention, routers,
 * dense and shared MLPs, lm_head; the hot experts' source): bytes and wall seconds; zeros on
 * a host-memory backend. */
void moet_model_dense_upload_stats(const moet_model *m, double *out_bytes, double *out_seconds);

/* With MOET_OP_TIMES=1 at open, every backend op is timed (waited for after it: figures that
 * attribute time, not step times): prints the ops by time per step (divided by per) to f (NULL:
 * nothing) and resets them if asked. MOET_EINVAL when the model was opened without it. */
int moet_model_op_times(moet_model *m, double per, FILE *f, int reset);

/* The shadow check (runtime/shadow.c): with probability `rate` per MoE layer call that has
 * CPU-tier work, one of the CPU tier's experts of that call is computed again by the
 * backend's own kernel (its bytes copied to a staging slot there) and the two results are
 * compared bit for bit. For placements whose experts do not all fit on the GPUs, where
 * `verify` has no all-resident reference. rate 0 turns it off. MOET_EINVAL (rate outside
 * 0 .. 1), MOET_ENOMEM. */
int moet_model_set_shadow(moet_model *m, double rate);

typedef struct moet_shadow_stats {
	uint64_t checks;      /* expert calls checked */
	uint64_t pairs;       /* routing pairs compared */
	uint64_t mismatches;  /* checks whose bits differed */
	uint64_t errors;      /* checks that could not run (memory, copies) */
	int64_t last_layer, last_expert; /* of the last mismatch */
} moet_shadow_stats;

/* The shadow check's counters so far (zeros when off). */
void moet_model_shadow_stats(const moet_model *m, moet_shadow_stats *out);

/* Passes of one batch size (rows in powers of two) that MOET_MICROBATCH=auto spends measuring
 * both forms (one pass, two micro-batches) before it keeps the faster (forward.c): a
 * benchmark of the steady state warms up at least this many passes. */
#define MOET_MB_TRIAL_PASSES 6

/* The trial passes of one decode batch size under the switches now (MOET_MICROBATCH, and
 * MOET_STAGE_BALANCE=auto, which tries three link prices in each form: 18 with both forms):
 * MOET_MB_TRIAL_PASSES by default, 0 where there is nothing to choose. */
int moet_model_trial_passes(const moet_model *m);

/* MOET_STAGE_BALANCE=auto: the link price arm (0: none, 1, 2: times MOET_STAGE_LINK_PRICE) the
 * last pass ran at, -1 where it priced nothing (the balance not auto, nothing cold). */
int moet_model_last_price(const moet_model *m);

/* MOET_STAGE_BALANCE=auto: decode passes from now on run at the price arm `arm` (0..2) instead
 * of the measured choice, and are not recorded for it; -1: the choice again. bench e2e's
 * overlap check replays the timed steps' arms in its serial run with it, so that Tc and Tg
 * time the row's own split of the cold experts. MOET_EINVAL for another value. */
int moet_model_force_price(moet_model *m, int arm);

/* Overlap of the CPU tier with the device's work on (1, the default) or off (0: the CPU tier
 * runs alone, the reference path; MOET_HYBRID_OVERLAP=0 at set_placement does the same).
 * Same bits either way. MOET_EINVAL without a placement. */
int moet_model_set_hybrid_overlap(moet_model *m, int on);

/* The home backend's idle marks around the driving thread's waits on (1) or off (0, the
 * default): moet_hybrid_stats.ns_gpu_idle. Each pass then records a few CUDA events per MoE
 * layer (a few microseconds of host time each). MOET_EUNSUP if the backend cannot tell. The
 * host-grouped path only: device-grouped layers (MOET_GPU_DEVGROUP=1) wait on the stream. */
int moet_model_set_gpu_idle(moet_model *m, int on);

/*
 * Keeps the CPU tier's experts on disk behind a host-RAM expert cache of `bytes` (the NVMe
 * tier, runtime/moet_xtier.h: io_uring reads, prefetch by the next layer's router), with
 * admission and eviction from `profile`'s routing frequencies (may be NULL) and recent use.
 * Results do not change by a bit. bytes 0 removes the tier. Errors: MOET_EINVAL (budget
 * below one expert), MOET_EUNSUP (no CPU tier on this backend), MOET_EIO, MOET_ENOMEM.
 */
struct moet_profile;
int moet_model_set_ram_budget(moet_model *m, size_t bytes, const struct moet_profile *profile);

/* Routing pairs served per tier since the placement was set: out[0] the CPU tier, out[1 + g]
 * device g (n_out entries written; 0 beyond the tiers). */
void moet_model_tier_counts(const moet_model *m, uint64_t *out, int n_out);

/* One routing decision, as the router made it (canonical order). */
typedef struct moet_route_event {
	int64_t layer;
	int seq;               /* index of the batch entry (moet_seq_step) */
	int64_t pos;           /* position of the token in its sequence */
	int is_prefill;        /* the entry ran more than one token in this call */
	int top_k;
	const int32_t *ids;    /* [top_k] expert ids, canonical order; borrowed for the call */
	const float *weights;  /* [top_k] routing weights (normalized x routed_scaling_factor) */
} moet_route_event;

typedef void (*moet_route_fn)(void *ctx, const moet_route_event *ev);

/* Calls fn for every (MoE layer, token) routing decision of later forward calls, from the
 * thread running the forward pass; NULL turns it off. For `profile` (routing statistics). */
void moet_model_set_route_observer(moet_model *m, moet_route_fn fn, void *ctx);

/*
 * Greedy decoding: feeds `prompt` then appends max_new argmax tokens (ties: lowest id) to
 * out_ids (capacity max_new). Stops early after eos_token_id when stop_at_eos. *out_n gets
 * the count.
 */
int moet_model_generate(moet_model *m, const int64_t *prompt, int64_t n_prompt, int64_t max_new,
			int stop_at_eos, int64_t *out_ids, int64_t *out_n);

/* The same with sampling (moet_sample.h): the token at position p is drawn with the draw of
 * (sp->seed, p), so a seeded generation is reproducible on every backend and batch. */
int moet_model_generate_sampled(moet_model *m, const int64_t *prompt, int64_t n_prompt,
				int64_t max_new, int stop_at_eos, const moet_sample_params *sp,
				int64_t *out_ids, int64_t *out_n);

#endif
