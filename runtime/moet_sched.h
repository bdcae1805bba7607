/*
 * moet_sched.h: the request scheduler of `serve`: continuous batching of prefill and decode
 * over one model, with a fixed KV budget, stop strings, seeded sampling and cancellation.
 * Knows nothing of HTTP; tests drive it directly (tests/serve/test_sched.c).
 *
 *   submit() --> queue --admit (KV budget)--> running --every step, one forward call:-->
 *                  |                            | decodes (1 token each) + prefill chunks
 *                  |                            v (at most max_batch_tokens)
 *   release() ---> cancelled          sample, detokenize, stop strings, max_tokens, EOS
 *                                               | finished: KV slot back to the pool
 *   poll() <-- new tokens and text, finish reason
 *
 * One engine thread owns the model and every KV cache; callers (HTTP connection threads) only
 * submit, poll and release. The KV cache of every request lives in one block pool of
 * --kv-tokens positions (moet_kv_pool, allocated at create): admission reserves the blocks of
 * prompt + max_tokens positions up front, so a running request never runs out of cache;
 * blocks are taken as positions are written and all come back when the request ends.
 *
 * Text: generated ids go through the tokenizer's incremental decoder (special tokens left
 * out); text that could still become the start of a stop string is held back, so a stream
 * never shows part of a stop string; the stop string and everything after it are dropped.
 *
 * Thread-safety: every function may be called from any thread, except that a request handle
 * is used by one caller thread at a time and must not be used after moet_sched_release.
 */
#ifndef MOET_SCHED_H
#define MOET_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "moet_model.h"
#include "moet_sample.h"
#include "moet_tokenizer.h"

#define MOET_SCHED_KV_TOKENS 16384 /* the default KV budget's cap, positions */

typedef struct moet_sched moet_sched;
typedef struct moet_sched_req moet_sched_req;

#define MOET_SCHED_MAX_TOP 20    /* top_logprobs at most (OpenAI's limit) */
#define MOET_SCHED_MAX_STOP 4    /* stop strings per request (OpenAI's limit) */
#define MOET_SCHED_MAX_STOP_LEN 256
#define MOET_SCHED_MAX_TIERS 17  /* CPU + 16 devices in the metrics */

/* One engine step as moet_sched_opts.on_step sees it. */
typedef struct moet_sched_step_info {
	const moet_seq_step *entries; /* the forward call's entries, decodes first (borrowed for
					 the call; *out_token already holds the drawn id) */
	int n;                        /* entries */
	int n_decode;                 /* of them decodes: the first n_decode, 1 token each */
	int64_t n_tokens;             /* tokens of the call */
	double t_start_s;             /* CLOCK_MONOTONIC seconds when the call began */
	double forward_s;             /* the call's duration, seconds */
	int rc;                       /* its result (0: every entry's cache advanced) */
} moet_sched_step_info;

typedef void (*moet_sched_step_fn)(void *ctx, const moet_sched_step_info *info);

typedef struct moet_sched_opts {
	int max_requests;          /* queued + running at once; 0: 64 */
	int64_t kv_tokens;         /* KV positions over all running sequences, rounded down to
				      whole blocks (allocated at create); 0: what fits in 90% of
				      the backend's free memory, at most MOET_SCHED_KV_TOKENS
				      (moet_kv_fit_tokens) */
	int64_t kv_block;          /* positions per KV block, a power of two; 0: 64, halved
				      while kv_tokens holds fewer blocks than max_requests */
	int64_t max_batch_tokens;  /* tokens per forward call; 0: 256 */
	int n_devices;             /* devices of the placement (for the tier counts); 0: none */
	double resident_check_s;   /* seconds between checks that the CPU tier is still
				      resident (moet_model_resident_check, one page in 4096 of
				      each tensor, at least one); 0:
				      never */
	/* NULL, or called by the engine thread after every forward call, without the lock (for
	 * `bench serve`'s step trace): must not call the scheduler, and should be quick (its
	 * time counts in the step, not in the forward pass) */
	moet_sched_step_fn on_step;
	void *on_step_ctx;
} moet_sched_opts;

typedef struct moet_sched_params {
	const int64_t *prompt;     /* copied */
	int64_t n_prompt;          /* >= 1 */
	int64_t max_tokens;        /* >= 1 */
	moet_sample_params sp;     /* temperature 0: greedy */
	const char *const *stop;   /* n_stop strings, valid UTF-8, 1..MAX_STOP_LEN bytes; copied */
	int n_stop;
	int top_logprobs;          /* -1: no logprobs; 0..MAX_TOP: the chosen token's and the top N */
	int ignore_eos;            /* do not stop at eos_token_id */
} moet_sched_params;

enum {
	MOET_SCHED_RUNNING = 0,
	MOET_SCHED_FINISH_LENGTH,    /* max_tokens reached */
	MOET_SCHED_FINISH_STOP,      /* EOS or a stop string */
	MOET_SCHED_FINISH_CANCELLED, /* released before the end */
	MOET_SCHED_FINISH_ERROR,     /* the forward pass failed; error[] says why */
};

typedef struct moet_sched_token {
	int32_t id;
	double logprob;            /* log-softmax of the raw logits (binary64); 0 when not asked */
	int n_top;
	int32_t top_id[MOET_SCHED_MAX_TOP];     /* most likely first, ties to the lower id */
	double top_logprob[MOET_SCHED_MAX_TOP];
} moet_sched_token;

/* What moet_sched_poll hands over: everything new since the previous poll. */
typedef struct moet_sched_update {
	moet_sched_token *tokens;  /* n_tokens new tokens (malloc'd) */
	size_t n_tokens;
	char *text;                /* n_text new bytes of released text (malloc'd, NUL-ended) */
	size_t n_text;
	int finish;                /* MOET_SCHED_RUNNING or MOET_SCHED_FINISH_* */
	char error[200];
	int64_t n_prompt;          /* usage */
	int64_t n_generated;
} moet_sched_update;

typedef struct moet_sched_stats {
	int queued, running;
	int64_t kv_tokens;         /* the budget: positions of the pool (whole blocks) */
	int64_t kv_block;          /* positions per block */
	int64_t kv_blocks;         /* blocks of the pool */
	int64_t kv_blocks_reserved;/* reserved by running requests: ceil((prompt + max_tokens) /
				      block) each */
	int64_t kv_blocks_used;    /* held by caches (written positions) */
	int64_t kv_blocks_free;    /* in the pool's free list: kv_blocks - kv_blocks_used */
	int64_t kv_reserved;       /* positions reserved: kv_blocks_reserved x kv_block */
	int kv_in_use;             /* caches of running requests (equals running) */
	uint64_t steps, tokens_generated, tokens_prefilled;
	uint64_t requests_done, requests_cancelled, requests_failed;
	int last_batch_seqs;
	int64_t last_batch_tokens;
	double tokens_per_s;       /* generated tokens over the last few seconds */
	double forward_s;          /* engine seconds inside moet_model_forward_batch */
	double step_s;             /* engine seconds in steps (forward + scheduling + sampling) */
	int n_tiers;               /* 1 + devices */
	uint64_t tier_pairs[MOET_SCHED_MAX_TIERS]; /* routing pairs: [0] CPU, [1 + g] device g */
	moet_hybrid_stats hybrid;  /* the hybrid engine's CPU-tier counters (moet_model.h) */
	moet_shadow_stats shadow;  /* the shadow check's counters (moet_model_set_shadow) */
	moet_resident_report resident; /* the CPU tier's residency, as of the last check */
} moet_sched_stats;

/*
 * Starts the engine thread over m (borrowed, used only by the engine until destroy) and tok
 * (borrowed; NULL: no text, no stop strings). Returns 0 and *out, or MOET_EINVAL (options out
 * of range), MOET_ENOMEM.
 */
int moet_sched_create(moet_model *m, const moet_tokenizer *tok, const moet_sched_opts *o,
		      moet_sched **out);

/* Stops the engine and frees everything. Every request must have been released. NULL ok. */
void moet_sched_destroy(moet_sched *s);

/* The options in force (defaults filled in). */
void moet_sched_get_opts(const moet_sched *s, moet_sched_opts *out);

/*
 * Queues a request. Returns 0 and *out (release it with moet_sched_release), MOET_ERANGE when
 * max_requests are already queued or running (a server answers 429), MOET_EINVAL for bad
 * parameters (the detail names the field: token ids, max_tokens, stop, top_logprobs,
 * sampling) or a request that could never fit the KV budget or the model's positions, or
 * MOET_ENOMEM.
 */
int moet_sched_submit(moet_sched *s, const moet_sched_params *p, moet_sched_req **out);

/*
 * Waits up to timeout_ms (0: do not wait, < 0: forever) for news and hands it over in *out
 * (free with moet_sched_update_free). Returns 0 when *out holds new tokens, text or the
 * finish, 1 when the time ran out with nothing new (*out empty), or MOET_ENOMEM.
 */
int moet_sched_poll(moet_sched_req *r, int timeout_ms, moet_sched_update *out);

void moet_sched_update_free(moet_sched_update *u);

/* Drops the caller's handle; a request still queued or running is cancelled, and its KV
 * slot goes back to the pool at the engine's next step. NULL ok. */
void moet_sched_release(moet_sched_req *r);

void moet_sched_get_stats(moet_sched *s, moet_sched_stats *out);

/* "length", "stop", "cancelled", "error" (OpenAI's finish_reason words where they exist). */
const char *moet_sched_finish_name(int finish);

#endif
