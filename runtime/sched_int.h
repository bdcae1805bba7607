/*
 * sched_int.h: internals of the scheduler (sched.c: the engine and the queue; sched_text.c:
 * detokenization, stop strings and log-probabilities of one request).
 */
#ifndef MOET_SCHED_INT_H
#define MOET_SCHED_INT_H

#include <pthread.h>

#include "moet_sched.h"

enum req_state { REQ_QUEUED, REQ_PREFILL, REQ_DECODE, REQ_DONE };

struct moet_sched_req {
	moet_sched *s;
	int refs;                  /* the caller's + the engine's (while queued or running) */
	enum req_state state;
	int released;              /* the caller let go: cancel */
	int64_t *prompt;
	int64_t n_prompt, n_fed;   /* prompt tokens, those already run through the model */
	int64_t max_tokens;
	moet_sample_params sp;
	int top_logprobs, ignore_eos;
	char *stop[MOET_SCHED_MAX_STOP];
	size_t stop_len[MOET_SCHED_MAX_STOP];
	int n_stop;
	moet_kv *kv;               /* while running */
	int64_t kv_cap;            /* its capacity: reserved against the budget */
	int64_t last_tok;          /* the token to feed at the next decode step */
	int64_t drawn;             /* the token the backend drew (requests without logprobs) */
	int64_t n_generated;
	/* output, appended by the engine and taken by poll */
	moet_sched_token *toks;
	size_t n_toks, cap_toks, toks_read;
	char *text;                /* released text */
	size_t n_text, cap_text, text_read;
	char *pend;                /* decoded text held back (could start a stop string) */
	size_t n_pend, cap_pend;
	moet_detok dt;
	int stop_hit;              /* a stop string matched: the text is final */
	int finish;                /* MOET_SCHED_RUNNING or MOET_SCHED_FINISH_* */
	char error[200];
};

/* sched_text.c; all called by the engine with the scheduler's lock held. */

/* Appends the token's text (if the scheduler has a tokenizer) and checks the stop strings;
 * sets r->finish = MOET_SCHED_FINISH_STOP when one matched. 0 or MOET_ENOMEM. */
int sched_text_push(moet_sched_req *r, const moet_tokenizer *tok, int32_t id);

/* End of the request: the decoder's held bytes and the held-back text are released (after a
 * last stop check). 0 or MOET_ENOMEM. */
int sched_text_finish(moet_sched_req *r, const moet_tokenizer *tok);

/* Fills t->logprob and t->top_* (n_top of them) from a row of logits, binary64. */
void sched_logprobs(const float *logits, int64_t n, int32_t chosen, int n_top,
		    moet_sched_token *t);

/* Appends n bytes to a growing buffer. 0 or MOET_ENOMEM. */
int sched_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

#endif
