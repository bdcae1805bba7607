/*
 * model_int.h: internals of the model graph shared by model.c (weights), rope.c and
 * forward.c. Not a public header.
 *
 * Every matrix is a moet_mat view of the checkpoint's bytes (FP8 with its block scales, BF16
 * or F32), bound by the backend (CPU: the same view; CUDA: a device copy of the bytes). Only
 * small vectors are decoded into owned binary32 arrays at open (norm weights, the router's
 * e_score_correction_bias) and then bound likewise.
 */
#ifndef MOET_MODEL_INT_H
#define MOET_MODEL_INT_H

#include <time.h>

#include "moet_backend.h"
#include "moet_clock.h"
#include "moet_mat.h"
#include "moet_model.h"
#include "moet_residency.h"
#include "moet_upload.h"
#include "moet_xtier.h"

#define MOET_MODEL_MAX_EXPERTS 4096 /* the router's eligibility arrays */
#define MOET_MODEL_MAX_TOPK 64

/* A simulated device (the test double of issue 5, CPU backend only): its own copies of the
 * bytes of the experts placed on it, table[l][e] (empty views for the others). */
typedef struct moet_sim_device {
	moet_ffn_w *table;        /* [layers x E] */
	void **copies;            /* owned byte copies */
	int64_t n_copies;
} moet_sim_device;

typedef struct moet_layer_w {
	const float *in_norm;     /* [H] (bound) */
	const float *post_norm;   /* [H] */
	/* attention (MLA) */
	moet_mat q_a;             /* [q_lora x H] (q_lora_rank > 0) */
	const float *q_a_norm;    /* [q_lora] */
	moet_mat q_b;             /* [heads*qk_head x q_lora] */
	moet_mat q_proj;          /* [heads*qk_head x H] (q_lora_rank == 0) */
	moet_mat kv_a;            /* [kv_lora + rope x H] */
	const float *kv_a_norm;   /* [kv_lora] */
	moet_mat kv_b;            /* [heads*(nope+v) x kv_lora] */
	moet_mat o;               /* [H x heads*v] */
	/* feed-forward */
	int is_moe;
	moet_ffn_w mlp;           /* dense MLP, or the shared experts of a MoE layer */
	int has_shared;           /* MoE layer with n_shared_experts > 0 */
	moet_mat router;          /* [E x H] */
	const float *router_bias; /* [E] (zeros if the checkpoint has none) */
	moet_ffn_w *experts;      /* [E], owned array of bound views */
	moet_ffn_w *experts_host; /* [E], owned array of host views (the CPU tier's) */
} moet_layer_w;

/* hybrid.c: the CPU tier of the hybrid engine (executor, staging buffers, counters). */
typedef struct moet_hybrid moet_hybrid;
#define MOET_HYBRID_SLOTS 2 /* calls in flight at once: one per micro-batch of a pass */
int moet_hybrid_create(moet_backend *be, const moet_config *c, moet_hybrid **out);
void moet_hybrid_destroy(moet_hybrid *hy, moet_backend *be);
/* MOET_TRACE: the CPU tier's calls (team span per slot) and the driver's waits for them go to
 * t from now on (NULL: nowhere). */
void moet_hybrid_set_trace(moet_hybrid *hy, struct moet_trace *t);
/* Starts the CPU tier's pairs (sorted by expert; table: host views by expert) on h (backend
 * memory, n rows): results go to y_dst (backend memory, cnt rows) at finish. One call in
 * flight per slot (0 .. MOET_HYBRID_SLOTS - 1). */
int moet_hybrid_cpu_begin(moet_hybrid *hy, int slot, moet_backend *be, const moet_ffn_w *table,
			  const moet_expert_pair *pairs, int64_t cnt, int64_t top_k,
			  const float *h, int64_t n, float *y_dst);
/* The same in two steps, so that the driver can launch the device tiers in between: fetch
 * copies the rows the pairs use to host staging (none with h_host: a host copy of all of h,
 * which the caller keeps until go), keeping the pairs; go gathers the rows by expert and
 * starts the jobs; begin is fetch then go. A fetched call never started is dropped by
 * finish. */
int moet_hybrid_cpu_fetch(moet_hybrid *hy, int slot, moet_backend *be, const moet_ffn_w *table,
			  const moet_expert_pair *pairs, int64_t cnt, int64_t top_k,
			  const float *h, const float *h_host, int64_t n, float *y_dst);
int moet_hybrid_cpu_go(moet_hybrid *hy, int slot);
/* hybrid.c: a CPU-tier call is near (MOET_CPU_PREWAKE: moet_cpuexec_prewake); NULL fine. */
void moet_hybrid_prewake(moet_hybrid *hy);
/* dispatch.c: the idle time marked in the pass just run (moet_model_set_gpu_idle), added to
 * ns_gpu_idle, the marks cleared; call after the pass's last download (or its failure). */
int moet_model_gpu_idle_take(moet_model *m);
/* Waits for the call in flight (if any) and copies its rows to the backend, queued with
 * async (moet_backend_ops.upload_async) where the backend can; with idle_marks, the backend's
 * idle marks around the wait (moet_backend_ops.idle_mark). With queued (MOET_TIER_FINISH=
 * queued), where the backend has wait_word and the tier overlaps on an executor: no wait
 * here; the backend's queue waits for the executor's done word, then copies the rows, and the
 * call's end is collected later (moet_hybrid_cpu_collect: at the slot's next fetch, at a
 * finish, at the pass's end). A finish of a call so deferred collects it. */
int moet_hybrid_cpu_finish(moet_hybrid *hy, int slot, moet_backend *be, int idle_marks,
			   int async, int queued);
/* The end of a call whose finish was queued (its tickets waited for, its stats), if any;
 * collect_all: of every slot. Returns the team's result. */
int moet_hybrid_cpu_collect(moet_hybrid *hy, int slot);
int moet_hybrid_cpu_collect_all(moet_hybrid *hy);
/* Whether moet_hybrid_cpu_finish(slot) would not wait for the CPU tier: no call in flight,
 * or its team work done (MOET_MB_POLL). */
int moet_hybrid_cpu_ready(moet_hybrid *hy, int slot);
/*
 * The device-grouped form (runtime/devgroup.c, CUDA): the device writes the CPU tier's pairs,
 * their count and their rows (in tier order, in place for the jobs) into the slot's pinned
 * buffers, which moet_hybrid_dev_prepare grows to max_pairs (before anything is queued) and
 * returns; moet_hybrid_dev_begin / _finish (host functions queued on the backend's stream: no
 * CUDA call, no return value) start the call from them and wait for it; the device then
 * reads the rows back. A failure is kept in the moet_hybrid_dev (rc, msg) for the caller to
 * report after the pass. Its counters go to st (moet_hybrid_dev_collect adds them to the
 * engine's, on the driving thread after the pass: the host functions run on CUDA's thread).
 */
typedef struct moet_hybrid_dev {
	moet_hybrid *hy;
	int slot;
	const moet_ffn_w *table;   /* the layer's host views by expert */
	int rc;                    /* the first failure since the caller cleared it */
	char msg[192];
	moet_hybrid_stats st;      /* this call's counters since the last collect */
} moet_hybrid_dev;
int moet_hybrid_dev_prepare(moet_hybrid *hy, int slot, moet_backend *be, int64_t max_pairs,
			    moet_expert_pair **out_pairs, int32_t **out_count, float **out_rows);
void moet_hybrid_dev_begin(void *dc);
void moet_hybrid_dev_finish(void *dc);
void moet_hybrid_dev_collect(moet_hybrid_dev *dc);
void moet_hybrid_get_stats(const moet_hybrid *hy, moet_hybrid_stats *out);
/* Prefill staging of cold experts (MOET_PREFILL_STAGE, docs/staging.md): reads the switches
 * and, for auto, the crossover of the cost model (placement/moet_cost.h) for experts of
 * expert_bytes on the hardware of MOET_HARDWARE (a configs/hardware-*.yaml file) or the
 * defaults; unset, auto when on_gpu (the home backend is a GPU), else never. Decode staging
 * by balance (MOET_STAGE_BALANCE): unset or empty, balance_unset (0 off, 1, 2 auto).
 * MOET_EINVAL naming a malformed switch; the hardware file's own errors. */
int moet_hybrid_stage_setup(moet_hybrid *hy, const moet_config *c, uint64_t expert_bytes,
			    int on_gpu, int balance_unset);
/* The tokens from which a cold expert of a call is staged (0: never). */
int64_t moet_hybrid_stage_min(const moet_hybrid *hy);
/* MOET_STAGE_BALANCE=1 or auto: a call's cold experts are split by moet_hybrid_stage_pick
 * instead. */
int moet_hybrid_stage_balance(const moet_hybrid *hy);
/* The balance is on with MOET_STAGE_BALANCE unset (its default: dispatch.c). */
int moet_hybrid_stage_balance_by_default(const moet_hybrid *hy);
/* MOET_STAGE_BALANCE unset on one GPU: 0 off, 1, 2 auto (dispatch.c says why). */
#define MOET_STAGE_BALANCE_GPU_DEFAULT 2
/* MOET_STAGE_BALANCE=auto: the link's price is set per pass (forward.c: by measured passes). */
int moet_hybrid_stage_price_auto(const moet_hybrid *hy);
/* MOET_STAGE_BALANCE=auto: the pick's link price from now on, MOET_STAGE_LINK_PRICE times
 * arm (0: nothing staged, 1, 2). */
void moet_hybrid_stage_set_arm(moet_hybrid *hy, int arm);
/* The split of one call's n cold experts (rows[i] tokens each) between the CPU tier and the
 * staging slots: pick[i] = 1 for the staged ones. Stages the prefix of the experts ordered
 * by rows (most first, then index) that minimizes moet_hybrid_stage_split_ms; none on a tie.
 * floor_ms: the layer's own GPU expert work (moet_hybrid_stage_gpu_ms summed), which a split
 * cannot beat. scratch: 2 n values. Allocates nothing. */
void moet_hybrid_stage_pick(const moet_hybrid *hy, const int64_t *rows, int n, double floor_ms,
			    int64_t *scratch, uint8_t *pick);
/* The cost model's time (ms) of such a split: the longest of the CPU tier's calls (slowed by
 * the copies' share of the host's memory when any expert is staged), the staged experts'
 * copies and kernels one after the other (times MOET_STAGE_LINK_PRICE), and floor_ms. */
double moet_hybrid_stage_split_ms(const moet_hybrid *hy, const int64_t *rows, int n,
				  const uint8_t *pick, double floor_ms);
/* The cost model's time (ms) of one GPU expert call of `rows` rows. */
double moet_hybrid_stage_gpu_ms(const moet_hybrid *hy, int64_t rows);
/* Computes cold pairs (sorted by expert; table: host views by expert) on the backend from
 * the engine's staging slots (stage.c) into y (backend, cnt rows of H); counts them. */
int moet_hybrid_stage_run(moet_hybrid *hy, moet_backend *be, const moet_ffn_w *table,
			  const moet_expert_pair *pairs, int64_t cnt, int64_t top_k,
			  const float *h, int64_t n, float *y);
/* The staged copies' device times not read yet into the stats (ns_stage_link): after each
 * pass (forward.c), when they are done. Accepts NULL. */
int moet_hybrid_stage_take_link(moet_hybrid *hy);
void moet_hybrid_set_overlap(moet_hybrid *hy, int on);
/* A copy of hidden rows to the host made for the tier by its caller (moet_moe_dispatch_queue),
 * counted in the stats as the tier's own (bytes_d2h, d2h_copies); nothing without an engine. */
void moet_hybrid_count_d2h(moet_hybrid *hy, uint64_t bytes);
/* Whether the tier runs beside the caller (0: begin waits for it; also without an engine). */
int moet_hybrid_overlapped(const moet_hybrid *hy);
void moet_hybrid_reset_stats(moet_hybrid *hy);

/* stage.c: experts computed by the backend from staging slots (copies of their host bytes
 * in backend memory), the copies of the next in flight while the current ones compute. */
typedef struct moet_stage moet_stage;
#define MOET_STAGE_MAX_SLOTS 8
/* What moet_stage_run did, added to by each call. */
typedef struct moet_stage_counts {
	uint64_t bytes;      /* weights' bytes copied */
	uint64_t experts;    /* experts computed */
	uint64_t ns_copy;    /* the calling thread in the copies: pinned, the uploader's runs
				(fill and link); driver, queueing them */
	uint64_t ns_wait;    /* its waits for a slot's last kernel or its queued copies */
	uint64_t ns_link;    /* the copies' own time: driver copies on a GPU, the device's
				between marks around each expert's copies on the copy stream
				(read later: moet_stage_take_link); else the calling thread's in
				them (the uploader's runs, host copies) */
} moet_stage_counts;
/* n_slots: 1 (one expert at a time), or a ring; pinned: the copies through an uploader (the
 * ring's halves then take waves of n_slots / 2 experts), else the driver's (stage.c). */
int moet_stage_create(moet_backend *be, int n_slots, int pinned, int64_t n_experts,
		      moet_stage **out);
/* MOET_STAGE_COPY: *out_pinned 1 for pinned, 0 for driver; unset or empty: pinned where
 * on_gpu (the backend's memory is a GPU's), else driver; another value is MOET_EINVAL naming
 * it. Read where the placement is set (the prefill staging) or the shadow check made. */
int moet_stage_copy_pinned(int on_gpu, int *out_pinned);
/* Waits for anything in flight; accepts NULL. */
void moet_stage_destroy(moet_stage *s, moet_backend *be);
/* A driver copy's kernel waits for the copy on the device (the stream), not on the host. */
void moet_stage_set_dev_wait(moet_stage *s, int on);
/* y[q] (backend, rows of H floats) = expert pairs[q].expert of host[] (host views: copied
 * to a slot, then the backend's experts_grouped) on h (backend, n rows), q < cnt, pairs
 * sorted by expert. Adds to *ct. On return the work is queued on the backend (its stream),
 * the slots' copies all done, or with moet_stage_set_dev_wait queued on the copy stream,
 * each kernel waiting for its copy on the device. */
int moet_stage_run(moet_stage *s, moet_backend *be, const moet_ffn_w *host,
		   const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
		   int64_t n, float *y, int64_t H, moet_stage_counts *ct);
/* The device's time in the driver copies whose marks have not been read yet, added to
 * ct->ns_link (waits for those copies: after a pass they are done). Accepts NULL. */
int moet_stage_take_link(moet_stage *s, moet_stage_counts *ct);


/* resident.c: at a placement's bind, its CPU-tier experts populated (and locked) per
 * MOET_CPU_RESIDENT; released (set and report) with the placement. */
int moet_resident_bind(moet_model *m, const int16_t *owner);
void moet_resident_release(moet_model *m);

/* remote.c: the expert tier of a GPU beyond the backend's own (placement device g >= 1). */
typedef struct moet_remote moet_remote;
int moet_remote_create(const struct moet_model *m, int g, const int16_t *owner,
		       moet_remote **out);
void moet_remote_destroy(moet_remote *r);
/* Starts layer l's pairs of this GPU on h (home GPU, n rows): results to y_dst (home GPU,
 * cnt rows) at finish. One call in flight per micro-batch slot (0 .. MOET_HYBRID_SLOTS - 1). */
int moet_remote_begin(moet_remote *r, int slot, int64_t l, int64_t E,
		      const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
		      int64_t n, float *y_dst);
/* Waits for the slot's call (if any) and copies its rows to the home GPU. */
int moet_remote_finish(moet_remote *r, int slot);
/* Adds this tier's upload bytes and seconds. */
void moet_remote_upload_stats(const moet_remote *r, double *bytes, double *seconds);

/* tp.c: the dense part's large matrices split by output rows over MOET_TP ranks (devices).
 * Rank r holds rows [r0[r], r0[r+1]) of a split matrix, bound on its backend. */
#define MOET_TP_MAX 8
#define MOET_TP_PER_LAYER 6 /* the split matrices of a layer: */
#define MOET_TP_Q 0         /* q_b (or q_proj) */
#define MOET_TP_KVB 1       /* kv_b (the absorbed form: with the attention split by heads) */
#define MOET_TP_O 2         /* o_proj */
#define MOET_TP_GATE 3      /* the dense MLP's or the shared experts' gate, up, down (where */
#define MOET_TP_UP 4        /* every backend has gate_up) */
#define MOET_TP_DOWN 5
typedef struct moet_tp moet_tp;
typedef struct moet_tp_mat {
	moet_mat part[MOET_TP_MAX];
	int64_t r0[MOET_TP_MAX + 1];
} moet_tp_mat;
/* MOET_TP: *out_n ranks (unset, empty or 1: 1, no split); MOET_EINVAL naming a bad value. */
int moet_tp_switch(int *out_n);
/* The ranks of m's backend (CUDA devices 0..n-1, or n-1 more CPU backends), NULL for n < 2.
 * wide: the widest row (floats) an input of a split matrix has in its buffer. */
int moet_tp_create(struct moet_model *m, int n, int64_t wide, moet_tp **out);
void moet_tp_destroy(moet_tp *tp);
int moet_tp_ranks(const moet_tp *tp);
moet_tp_mat *moet_tp_layer_mat(moet_tp *tp, int64_t l, int which);
moet_tp_mat *moet_tp_lm_head(moet_tp *tp);
/* Split bytes of the weights rank r holds. */
uint64_t moet_tp_rank_bytes(const moet_tp *tp, int r);
/* Splits host (a checkpoint view) into out's parts: *rank0_host is rank 0's part (for the
 * caller to bind into out->part[0]); the other ranks' are bound by moet_tp_flush. */
int moet_tp_split(moet_tp *tp, const moet_mat *host, moet_tp_mat *out, moet_mat *rank0_host);
/* moet_tp_split with rank r's rows at its heads (h0[r] x head_rows) where the attention is
 * split by heads and those boundaries keep the matrix's block scales whole; otherwise as
 * moet_tp_split, and the ranks then do not compute q and kvb locally (moet_tp_local). */
int moet_tp_split_heads(moet_tp *tp, const moet_mat *host, int64_t head_rows, moet_tp_mat *out,
			moet_mat *rank0_host);
/* Rank r >= 1's copy of a small vector (RoPE's inverse frequencies), kept by tp. */
int moet_tp_bind_freq(moet_tp *tp, const float *host, int64_t n);
/* 1 when each rank computes its heads' q and kvb itself (moet_tp_attention). */
int moet_tp_local(const moet_tp *tp);
/* RoPE's arguments (moet_backend_ops.rope) for moet_tp_attention. */
typedef struct moet_tp_rope {
	const float *inv_freq; /* rank 0's (bound) */
	int64_t n_freq;
	float attn_factor;
	int interleave;
} moet_tp_rope;
/* Layer l's attention from q's input (qa or h, rows qx_stride floats apart) and [c | k_pe]
 * (kva, rows kva_stride apart: normed, k_pe roped), all rank 0's, with each rank computing its
 * heads' q (q split Q, RoPE), kvb (split KVB), K/V store and attention; q and kvb land in
 * rank 0's q and kvb for its own heads, the attention of every head in out (rank 0). */
int moet_tp_attention(moet_tp *tp, int slot, const moet_attn_dims *d, int64_t l,
		      const float *qx, int64_t qx_stride, const float *kva, int64_t kva_stride,
		      int64_t n, const moet_rows *rows, const moet_tp_rope *rope, float *q,
		      float *kvb, float *out);
int moet_tp_flush(moet_tp *tp, const moet_ckpt *ck);
/* The exchange buffers grown to `rows` rows (grow-only; accepts NULL). */
int moet_tp_reserve(moet_tp *tp, int64_t rows);
/* y[t][r] = D(W, r, x[t]) for the rows of every rank (the backend's linear, split): x and y
 * rank 0's (the model backend's) memory, x rows x_stride floats apart. */
int moet_tp_linear(moet_tp *tp, const moet_tp_mat *w, const float *x, int64_t x_stride,
		   int64_t n, float *y, int64_t y_stride);
/* The attention split by heads (MOET_TP, unless MOET_TP_ATTN=rank0):
 * 1 and rank r's heads [*h0, *h0 + *nh) (possibly none), else 0 (the attention on rank 0). */
int moet_tp_heads(const moet_tp *tp, int r, int64_t *h0, int64_t *nh);
/* Memory of rank r's backend (the KV pools' parts); free accepts NULL. */
int moet_tp_rank_alloc(moet_tp *tp, int r, size_t bytes, void **out);
void moet_tp_rank_free(moet_tp *tp, int r, void *p);
/* The ranks' row tables of a micro-batch (slot), from its entries (the caches' rank parts). */
int moet_tp_rows(moet_tp *tp, int slot, const moet_seq_step *steps, int n_steps,
		 const int64_t *tok, int64_t n, int64_t n_layers);
/* Layer l's K/V store and attention with the heads split: q [n][heads x qk], kvb [n][heads x
 * (nope + v)] (the expanded form; NULL in the absorbed form, whose ranks read their kv_b rows
 * inside the latent attention) and k_pe (rows kpe_stride apart, after c) are rank 0's, as
 * forward.c has them; rows: rank 0's row table of the slot; out [n][heads x v] on rank 0. */
int moet_tp_attend(moet_tp *tp, int slot, const moet_attn_dims *d, int64_t l, const float *q,
		   const float *kvb, const float *k_pe, int64_t kpe_stride, int64_t n,
		   const moet_rows *rows, float *out);
/* 1 when the ranks split FFNs too (every rank's backend has gate_up). */
int moet_tp_splits_ffn(const moet_tp *tp);
/* out[t] = FFN(x[t]) (x rows H floats apart, out [n][H]) with gate, up and down split: h's
 * rows by the ranks of gate and up (gate_up), gathered on rank 0, then down split as
 * moet_tp_linear. The same bits as the backend's ffn but for the NaN canonicalization of
 * its output (a NaN's payload may differ). */
int moet_tp_ffn(moet_tp *tp, const moet_tp_mat *gate, const moet_tp_mat *up,
		const moet_tp_mat *down, const float *x, int64_t n, float *out);

/* stage_lock.c: a range of the checkpoint's mapped bytes page-locked for MOET_STAGE_BALANCE. */
typedef struct moet_lock_range {
	const void *p;
	size_t bytes;
} moet_lock_range;
/* At a placement with MOET_STAGE_BALANCE: the ranges of MOET_STAGE_REGISTER (cold: the CPU
 * side's experts, owner < 0, page-aligned and merged per shard; all: every shard; 0: none)
 * into m->stage_lock, locked on a GPU backend (host 0); by default (MOET_STAGE_BALANCE unset)
 * only when they take at most half the host's memory. Nothing behind the NVMe tier (attaching
 * one unlocks them). Errors: MOET_EINVAL naming a bad value, MOET_ENOMEM (also the default's
 * decline), the driver's, naming the shard. */
int moet_stage_lock(moet_model *m, const int16_t *owner, int host);
/* Unlocks and forgets them. */
void moet_stage_unlock(moet_model *m);

/* forward.c: measured step times of a pass's arms for one batch-size bucket: its two forms
 * (one pass, two micro-batches) x MOET_STAGE_BALANCE=auto's link prices (none, 1, 2 times
 * MOET_STAGE_LINK_PRICE; without auto only the first), arm = form * MOET_MB_PRICES + price. */
#define MOET_MB_PRICES 3
#define MOET_MB_ARMS (2 * MOET_MB_PRICES)
typedef struct moet_mb_tune {
	double mean[MOET_MB_ARMS];
	double trial[MOET_MB_ARMS][3]; /* each arm's trial passes (forward.c MB_TRIALS) */
	int cnt[MOET_MB_ARMS];
	uint32_t passes;
} moet_mb_tune;

/* shadow.c: the CPU tier checked against the backend on a sample of calls. */
typedef struct moet_shadow moet_shadow;
void moet_shadow_destroy(moet_shadow *s, moet_backend *be);
/* At dispatch: maybe picks one CPU-tier expert of layer l (cpu: the tier's pairs in sorted
 * order, their rows from cpu_row of y) for the check at finish. */
void moet_shadow_pick(moet_shadow *s, int slot, int64_t l, const moet_expert_pair *cpu,
		      int64_t cnt, int64_t cpu_row, const float *h, int64_t n, float *y);
/* At finish, once the CPU tier's rows are in y: the pick recomputed by the backend and
 * compared. */
int moet_shadow_check(struct moet_model *m, int slot);

/* Activation buffers of the forward pass (backend memory), grown to the largest batch. */
typedef struct moet_fwd_bufs {
	int64_t cap_rows;         /* rows the buffers hold */
	float *x, *h, *q, *qa, *kva, *kvb, *attn, *out, *rlogits, *rw, *y, *shared, *logits;
	int32_t *ids, *slot;
} moet_fwd_bufs;

struct moet_model {
	moet_config cfg;
	moet_ckpt *ck;
	struct moet_trace *trace; /* MOET_TRACE: the timeline (m->be then traced), or NULL */
	moet_res *res;            /* the placement's CPU tier made resident (resident.c) */
	moet_resident_report res_report;
	moet_backend *be;
	moet_mat embed;           /* [V x H] BF16/F16/F32 (bound) */
	moet_mat lm_head;         /* [V x H] (bound) */
	const float *final_norm;  /* [H] (bound) */
	moet_layer_w *layers;     /* [num_hidden_layers] */
	float **host_vecs;        /* decoded small vectors (norms, biases), owned */
	int n_host_vecs;
	/* rope */
	float *inv_freq;          /* [rope/2] on the host, binary32 as transformers computes */
	const float *inv_freq_b;  /* bound */
	float rope_attn_factor;   /* multiplies cos and sin (yarn attention factor) */
	float softmax_scale;      /* qk_head^-0.5 x mscale^2 */
	int mla_absorbed;         /* attention in the absorbed form over a latent cache */
	/* expert placement (moet_model_set_placement); NULL: every expert on the backend */
	int16_t *owner;           /* [layers x E]: -1 CPU tier, g >= 0 device g */
	int cpu_tier;             /* some routed expert of a MoE layer has owner -1 */
	unsigned char *cpu_layer; /* [layers]: layer l's MoE has a routed expert with owner -1 */
	int n_devices;
	moet_sim_device *sim;     /* [n_devices] test doubles (CPU backend only) */
	moet_hybrid *hy;          /* the CPU tier's engine (with a placement) */
	moet_remote **remote;     /* [n_devices]: GPUs 1.. of a GPU backend ([0] unused) */
	int mb_slot;              /* the micro-batch being dispatched (forward.c) */
	moet_shadow *shadow;      /* online check of the CPU tier (moet_model_set_shadow) */
	uint64_t split_passes;    /* passes run as two micro-batches (moet_hybrid_stats) */
	uint64_t merged_calls;    /* home-device expert calls of both micro-batches (the same) */
	int idle_on;              /* the backend's idle marks around the driver's waits (dispatch.c,
				     moet_model_set_gpu_idle) */
	uint64_t ns_gpu_idle;     /* their time, taken after each pass (moet_hybrid_stats) */
	uint64_t ns_gpu_idle_route; /* of which at the routing's waits (MOET_IDLE_ROUTE) */
	moet_mb_tune mb_tune[32]; /* per batch size, rows in powers of two (forward.c) */
	double mb_skew[2];        /* MOET_MB_TEST_SKEW (forward.c, tests only) */
	double price_skew[MOET_MB_PRICES]; /* MOET_STAGE_TEST_SKEW (the same) */
	uint64_t price_passes[MOET_MB_PRICES]; /* MOET_STAGE_BALANCE=auto: passes per arm */
	int price_last;           /* 1 + the last pass's price arm, 0: none
				     (moet_model_last_price) */
	int price_forced;         /* 1 + the arm decode passes run at, 0: the choice
				     (moet_model_force_price) */
	int price_cycle;          /* MOET_STAGE_TEST_CYCLE (forward.c, tests only) */
	int experts_unbound;      /* some routed experts are not bound yet (GPU backends bind
				     them at the placement or the first pass) */
	uint64_t upload_bytes;    /* routed experts' bytes bound by moet_model_bind_experts */
	double upload_s;          /* and its wall time */
	double upload_fill_s;     /* of it, staged: waiting for the threads' fills of chunks, */
	double upload_wait_s;     /* and waiting for the link (moet_model_upload_split) */
	moet_upload_stats staged_last; /* the last staged bind's (moet_bind_staged) */
	/* open on a device backend: the dense matrices (embedding, attention, routers, dense and
	 * shared MLPs, lm_head) wait for one bulk upload at the end (model.c, bind_dense) */
	int defer_dense;
	moet_mat *dense_host;     /* [n_dense] their host views */
	moet_mat **dense_out;     /* [n_dense] where each bound view goes */
	int64_t n_dense, dense_cap;
	double dense_upload_s;    /* that upload's wall time */
	size_t dense_upload_bytes;
	void **dev_blocks;        /* backend memory of bulk binds (staged, uring), owned */
	int n_dev_blocks;
	uint64_t *tier_pairs;     /* [1 + n_devices]: pairs served, CPU tier first */
	moet_expert_pair *pairs;  /* host scratch of the dispatch, grown */
	moet_expert_pair *tier_list;
	moet_expert_pair *stage_list; /* the cold pairs staged to the backend (hybrid.c) */
	int64_t *stage_rows;      /* [3 E]: a call's cold experts' rows, then the pick's scratch */
	uint8_t *stage_pick;      /* [E]: which of them are staged */
	moet_lock_range *stage_lock; /* what MOET_STAGE_BALANCE page-locks (stage_lock.c) */
	int n_stage_lock;
	int n_stage_locked;       /* of which locked now (a GPU backend) */
	int32_t *ids_h, *slot_h;
	int64_t cap_pairs;
	int gpu_first;            /* this pass starts the CPU tier after the device tiers */
	int up_async;             /* this pass queues its slot tables and CPU-tier rows */
	int tier_queued;          /* and the CPU tier's finish (MOET_TIER_FINISH=queued) */
	int32_t *slot_pin[3];     /* host_alloc: the queued slot tables (dispatch.c) */
	int64_t cap_slot_pin[3];
	int q_on;                 /* this pass queues its routing downloads (MOET_MB_QUEUE) */
	int q_reorder;            /* and reorders its halves' steps around them (MOET_MB_REORDER) */
	int q_poll;               /* or polls both halves' waits (MOET_MB_POLL) */
	uint64_t polled_passes;   /* split passes run so (moet_hybrid_stats) */
	uint64_t stream_passes;   /* split passes on two streams (the same) */
	int mb_streams;           /* its halves run on two streams (MOET_MB_STREAMS) */
	struct {                  /* per micro-batch: moet_moe_dispatch_queue's copies */
		int32_t *ids;     /* host_alloc [cap_p]: the layer's routing ids */
		float *h;         /* host_alloc [cap_rows x hidden]: its rows */
		int64_t cap_p, cap_rows;
		int64_t layer;    /* the layer queued and not yet dispatched, or -1; its rows
				     were copied where it has CPU-tier experts (cpu_layer) */
	} q[2];
	/* Two micro-batches' home-device experts as one call (MOET_MB_MERGE, dispatch.c): the
	 * first micro-batch's dispatch of a layer defers its pairs, the second's computes both. */
	struct {
		int on;                  /* this pass merges (forward.c) */
		int64_t layer;           /* the layer the first micro-batch deferred, or -1 */
		int64_t n;               /* its rows */
		int64_t cnt;             /* its deferred pairs (pairs[0 .. cnt)) */
		int64_t rows;            /* its staged and CPU-tier rows, first in the layer's y */
		const float *h;          /* its hidden rows */
		int32_t *slot;           /* its backend slot table, uploaded by the second */
		moet_expert_pair *pairs; /* [cap_pairs]: the deferred pairs, then the merged call's */
		int32_t *slot_h;         /* [cap_pairs]: its slot table (host) */
		int64_t cap_pairs, cap_rows;
		float *y[2];             /* backend [cap_pairs][H]: the layer's y, by layer parity */
		float *h2;               /* backend [cap_rows][H]: both micro-batches' rows */
		float *ycur[2];          /* per micro-batch slot: the y its combine reads (NULL: its
					  * own) */
	} mg;
	moet_fwd_bufs bufs[2];    /* per micro-batch of a pass (forward.c) */
	struct {                  /* their host tables, grown like them (forward.c) */
		moet_rowinfo *rows;
		int64_t *tok;
		int64_t cap_rows;
		moet_draw *draw;
		int cap_draw;
	} host[2];
	moet_fwd_bufs *cur;       /* the micro-batch being computed */
	int mb_seq_base;          /* its first entry's index in the caller's batch */
	moet_route_fn route_fn;   /* optional observer of routing decisions */
	void *route_ctx;
	struct moet_xtier *xtier; /* NVMe expert tier of the CPU tier (moet_xtier.h), or NULL */
	struct moet_devgroup *dg; /* MOET_GPU_DEVGROUP=1's tables and scratch (devgroup.c) */
	struct moet_graphs *graphs; /* MOET_CUDA_GRAPH=1's captured passes (graph.c) */
	moet_tp *tp;              /* MOET_TP >= 2: the split dense matrices (tp.c), or NULL */
	/* Early rows (MOET_EARLY_ROWS, early_rows.c) */
	int early_min;            /* this pass: the CPU-tier experts a layer needs; 0: off */
	int64_t *early_rows;      /* [early_cap]: a layer's rows with CPU-tier pairs, ascending */
	uint8_t *early_mask;      /* [early_cap] */
	int64_t early_cap;
	int64_t early_n;          /* the last dispatch's early_rows; 0: its layer does not go early */
	const moet_rows *early_tab; /* their row table (slot 1) */
	uint64_t early_layers;    /* layers whose next attention ran early (moet_hybrid_stats) */
};

/* kv_pool.c: a pool of KV blocks in one backend allocation (moet_model.h).
 *
 *   mem:  K [layers][rows][k_row]  |  V [layers][rows][v_row]      rows = n_blocks x 2^shift
 *                                                                 (a private pool: max_tokens)
 *   block b of layer l: K rows b << shift .. +2^shift of layer l; a sequence's positions go
 *   through its block table (common/moet_kvrow.h).
 */
struct moet_kv_pool {
	moet_backend *be;       /* borrowed from the model */
	int64_t n_layers;
	int64_t k_row, v_row;   /* floats per position per layer (as struct moet_kv's) */
	int shift;              /* log2 of the positions per block */
	int64_t n_blocks;
	int64_t rows;           /* positions per layer in memory */
	int64_t budget_tokens;  /* as asked (for the messages) */
	float *k, *v;           /* v: NULL when v_row is 0 (absorbed form) */
	/* MOET_TP with the attention split by heads (tp.c): rank 0's heads are k, v above (k_row,
	 * v_row count only them); rank r >= 1 keeps its heads' K and V on its device */
	moet_tp *tp;
	float *rk[MOET_TP_MAX], *rv[MOET_TP_MAX];
	int64_t rk_row[MOET_TP_MAX], rv_row[MOET_TP_MAX];
	int32_t *free_ids;      /* [n_blocks], a stack: free_ids[0 .. n_free) */
	int64_t n_free;
	int64_t want;           /* moet_kv_grow_batch's scratch */
	int refs;               /* the creator's hold + one per cache */
};

struct moet_kv {
	int64_t max_tokens;
	int64_t len;
	int64_t n_layers;
	int64_t k_row;  /* floats per position per layer: heads x qk_head (expanded form), or
			   kv_lora + rope (absorbed form: the latent [c | k_pe]) */
	int64_t v_row;  /* heads x v_head (expanded form), 0 (absorbed form) */
	moet_kv_pool *pool;
	int32_t *blocks;  /* [max_blocks] the block table: n_blocks held */
	int64_t n_blocks, max_blocks;
	int64_t mark;     /* blocks held before the pass in flight (moet_kv_grow_batch) */
};

/* kv_pool.c: gives every entry's cache the blocks its n_tok new positions need, all or
 * nothing: a pool short of blocks gives MOET_ERANGE naming its budget and no cache changes.
 * Remembers what each held for moet_kv_undo_batch. */
int moet_kv_grow_batch(const moet_seq_step *steps, int n_steps);
/* After a failed pass: each entry's cache gives back the blocks the grow gave it. */
void moet_kv_undo_batch(const moet_seq_step *steps, int n_steps);
/* Rank r's row table entry of a row of kv's sequence at position pos (its heads' cache,
 * MOET_TP with the attention split; rank 0: moet_kv_rowinfo's). */
void moet_kv_rowinfo_rank(const moet_kv *kv, int64_t pos, int r, moet_rowinfo *out);
/* The row table entry (moet_rowinfo) of a row of kv's sequence at position pos. */
void moet_kv_rowinfo(const moet_kv *kv, int64_t pos, moet_rowinfo *out);
/* MOET_EINVAL (naming the entry) when kv was not made for a model of m's geometry and form. */
int moet_kv_check(const struct moet_model *m, const moet_kv *kv, int entry);

/* dispatch.c: with m->q_on (MOET_MB_QUEUE: no NVMe tier, MOET_GPU_DEVGROUP off), queues the
 * copies of layer l's routing ids (and rows h, where the layer has CPU-tier experts) of the
 * current micro-batch to host memory and a fence, so that its dispatch later waits for them
 * alone instead of copying them itself (which drains the backend's queue: the other
 * micro-batch's work, or the shared experts queued meanwhile (forward.c's ff_start),
 * included); otherwise nothing. */
int moet_moe_dispatch_queue(struct moet_model *m, int64_t l, const int32_t *ids, int64_t n,
			    const float *h);
/* dispatch.c: the routed experts of MoE layer l for n rows: ids [n x top_k] (backend) ->
 * y rows and slot[pair] (backend), per the placement. */
int moet_moe_dispatch(struct moet_model *m, int64_t l, const int32_t *ids, int64_t n,
		      const float *h, float *y, int32_t *slot);
/* MOET_MB_POLL: whether micro-batch slot's dispatch of layer l would not wait for its queued
 * routing copies (*out_ready; 1 where nothing is queued for it); its finish waits for nothing
 * once moet_hybrid_cpu_ready says so (one device only). */
int moet_moe_dispatch_ready(struct moet_model *m, int slot, int64_t l, int *out_ready);
/* Completes a dispatch whose CPU tier may still be running (the hybrid engine overlaps it
 * with whatever the caller queues on the backend in between). */
int moet_moe_dispatch_finish(struct moet_model *m);
/* A pass's dispatch switches (dispatch.c), read at every pass (n_mb micro-batches); the same
 * bits either way; MOET_EINVAL for a bad value, naming it.
 * MOET_MB_QUEUE: "1", "0" or unset (on in a decode pass, `decode`: one token per sequence,
 * with one device and no MOET_TP ranks, in one pass, n_mb 1, or in two on two streams): m->q_on
 * (moet_moe_dispatch_queue): forward.c then queues the shared experts before the dispatch's
 * wait. MOET_MB_REORDER: "0" (unset) or "1": with queued copies in two micro-batches,
 * forward.c orders the halves' steps around them (m->q_reorder) instead of the plain order.
 * MOET_MB_STREAMS: "1", "2" or unset (as 2 in a decode pass, as 1 otherwise): two
 * micro-batches on two backend streams (moet_backend_ops.stream_select; m->mb_streams) where
 * the backend has them, one device without MOET_TP ranks, no NVMe tier, MOET_GPU_DEVGROUP
 * off; with merged calls only where the backend has stream_wait (forward.c clears it
 * otherwise).
 * MOET_TIER_ORDER: whether the CPU tier's jobs start before the device tiers' launches ("cpu",
 * unset) or after them ("gpu": m->gpu_first; measured no faster, docs/hybrid.md); always
 * before them when the tier does not overlap (MOET_HYBRID_OVERLAP=0: it runs alone, the
 * reference of bench e2e's Tc).
 * MOET_STEP_UPLOAD: "async" (unset) queues the slot tables and the CPU tier's rows on the
 * backend (moet_backend_ops.upload_async) where it can, so that the driver does not wait for
 * the work queued before them (m->up_async); "sync" copies them at once. */
int moet_pass_switches(struct moet_model *m, int n_mb, int decode);
/* early_rows.c: the next layer's attention of the rows without CPU-tier pairs queued before
 * the wait for the CPU tier (MOET_EARLY_ROWS, docs/hybrid.md "Early rows").
 * moet_early_switch: m->early_min for a pass (0 unless asked for and the pass is a decode pass
 * in one pass on one device without MOET_TP ranks, NVMe tier, shadow check or device grouping;
 * forward.c's pass_run clears it for a CUDA graph's pass); MOET_EINVAL naming the variable
 * for a bad value.
 * moet_early_begin: after layer l's dispatch (b the pass's buffers, rows its row table): when
 * the layer qualifies, queues layer l + 1's attention block for every row on m->bufs[1], the
 * rows without CPU-tier pairs from this layer's complete output, and sets *out_did.
 * moet_early_end: after layer l's finish, with *out_did set: the same block for the other
 * rows, then b holds layer l + 1's attention output and post-norm for every row. */
int moet_early_switch(struct moet_model *m, int n_mb, int decode);
int moet_early_begin(struct moet_model *m, moet_fwd_bufs *b, int64_t n, const moet_rows *rows,
		     int64_t l, int *out_did);
int moet_early_end(struct moet_model *m, moet_fwd_bufs *b, int64_t n, int64_t l);
/* dispatch.c, with m->early_min: from the CPU tier's cnt pairs (m->tier_list, before the
 * device tiers reuse it) of `experts` experts in a call of n rows, m->early_rows and
 * m->early_n (0 unless experts >= m->early_min and those rows are at most half of n). */
int moet_early_note(struct moet_model *m, int64_t n, int64_t cnt, int experts);
void moet_early_free(struct moet_model *m);
/* forward.c, for early_rows.c: a layer's attention block on m->cur (norm, attention, residual
 * add, post-attention norm into h), the buffers and host row tables grown. */
int moet_fwd_attn_block(struct moet_model *m, int64_t l, int64_t n, const moet_rows *rows);
int moet_fwd_ensure_bufs(struct moet_model *m, moet_fwd_bufs *b, int64_t n);
int moet_fwd_ensure_host(struct moet_model *m, int i, int64_t n);
/* Whether a pass of two micro-batches merges their home-device expert calls (MOET_MB_MERGE,
 * dispatch.c): *out 1 if asked for and the placement allows it (one device, no NVMe tier, a
 * backend with copy); then m->mg is ready for n_rows rows (both micro-batches) of top_k pairs
 * each, and m->mg.on set until moet_mb_merge_end. MOET_EINVAL for a bad switch value. */
int moet_mb_merge_begin(struct moet_model *m, int64_t n_rows, int *out);
void moet_mb_merge_end(struct moet_model *m);
/* model.c: binds the routed experts the backend lacks: those of device 0 in owner (NULL:
 * all). */
int moet_model_bind_experts(struct moet_model *m, const int16_t *owner);
void moet_model_free_dispatch(struct moet_model *m);

/* devgroup.c: a MoE layer's routed experts grouped on the device (MOET_GPU_DEVGROUP=1). */
typedef struct moet_devgroup moet_devgroup;
/* *out_on = MOET_GPU_DEVGROUP (unset or empty: 0); MOET_EINVAL naming it for other values.
 * Read once per process and kept (moet_devgroup_env_reset in moet_model.h reads it again). */
int moet_devgroup_switch(int *out_on);
/* Layer l's routed experts with no host sync when the switch is on and every expert of the
 * layer is on GPU 0, or on GPU 0 and the CPU tier (one device, every MoE layer so, a call of
 * decode size, devgroup.c): *out_done = 1, y and slot written as moet_moe_dispatch's, the
 * CPU tier's work queued behind host functions and its rows' return left to
 * moet_devgroup_finish; else *out_done = 0 and nothing was done. Errors on the device or in
 * the host functions are reported by moet_devgroup_check. */
int moet_devgroup_dispatch(struct moet_model *m, int64_t l, const int32_t *ids, int64_t n,
			   const float *h, float *y, int32_t *slot, int *out_done);
/* Before the combine of the micro-batch slot's layer: *out_grouped = 1 if its dispatch went
 * device-grouped (the hybrid engine's finish then has nothing of it), and its CPU tier's end
 * and rows queued. */
int moet_devgroup_finish(struct moet_model *m, int *out_grouped);
/* Once per forward pass, after its last device-grouped call: the device's error words read
 * back (one download), a fault as MOET_EDEVICE naming the layer; discard: forget them. */
int moet_devgroup_check(struct moet_model *m, int discard);
/* The expert tables dropped (placement changing); built again at the next call. */
void moet_devgroup_reset(struct moet_model *m);
void moet_devgroup_free(struct moet_model *m);
/* Device-grouped layer calls so far (reset: cleared after reading). */
uint64_t moet_devgroup_calls(const struct moet_model *m, int reset);

/* What a pass's device-grouped calls recorded on the host, for graph.c: pass_all says
 * whether every MoE layer of slot 0's pass went device-grouped (0 without MoE layers);
 * pass_save copies the per-slot-and-layer record (used: [2 * L], or NULL) and the counters it
 * advances (calls, and device 0's pairs); pass_restore sets them (used NULL: left as is). */
int moet_devgroup_pass_all(const struct moet_model *m);
void moet_devgroup_pass_save(const struct moet_model *m, int64_t *used, uint64_t *out_calls,
			     uint64_t *out_pairs);
void moet_devgroup_pass_restore(struct moet_model *m, const int64_t *used, uint64_t calls,
				uint64_t pairs);

/* graph.c: a pass captured into a CUDA graph and replayed (MOET_CUDA_GRAPH=1). */
typedef struct moet_graphs moet_graphs;
typedef enum moet_graph_mode {
	MOET_GRAPH_OFF,     /* not for graphs: run directly, nothing recorded */
	MOET_GRAPH_DIRECT,  /* run directly, then moet_graph_direct_done */
	MOET_GRAPH_CAPTURE, /* moet_graph_capture_begin, the pass body, moet_graph_capture_end */
	MOET_GRAPH_REPLAY,  /* moet_graph_replay instead of the pass body */
} moet_graph_mode;
typedef struct moet_graph_rec {
	uint64_t dg_calls, dg_pairs; /* the counters before the capture */
} moet_graph_rec;
/* After the pass's row tables are written (nothing allocated after this but by the body): what
 * to do with this batch of n_mb micro-batches. */
int moet_graph_plan(struct moet_model *m, const moet_seq_step *steps, int n_steps, int n_mb,
		    moet_graph_mode *out);
/* After a MOET_GRAPH_DIRECT pass's body succeeded (before moet_devgroup_check). */
void moet_graph_direct_done(struct moet_model *m);
int moet_graph_capture_begin(struct moet_model *m, moet_graph_rec *rec);
/* body_rc: the captured body's result. 0: the graph was instantiated and launched (the pass's
 * work is queued); 1: the capture failed or did not qualify, nothing ran: the caller runs the
 * body directly; else a MOET_E* code of the launch. */
int moet_graph_capture_end(struct moet_model *m, const moet_graph_rec *rec, int body_rc);
/* Queues the shape's graph (the pass body's work) and replays the body's host record. */
int moet_graph_replay(struct moet_model *m);
void moet_graph_free(struct moet_model *m);

/* model.c: n matrices bound on backend `be` (not host memory) through the upload's staging
 * (runtime/upload.c; MOET_UPLOAD_READ=pread reads ck's shard files), out[i] their views, all
 * in one backend allocation appended to (*blocks)[*n_blocks] (grown), which the caller owns and
 * frees with be's free. On failure nothing is appended and out[] is not to be used. stats
 * (optional): the upload's (moet_upload_many_opts). */
int moet_bind_staged(moet_backend *be, const moet_ckpt *ck, const moet_mat *host, int64_t n,
		     moet_mat *out, void ***blocks, int *n_blocks, moet_upload_stats *stats);

/* forward.c: releases the forward pass's buffers (backend memory). */
void moet_model_free_bufs(struct moet_model *m);

/* rope.c: fills m->inv_freq, rope_attn_factor, softmax_scale from m->cfg. */
int moet_rope_init(struct moet_model *m);


#endif
