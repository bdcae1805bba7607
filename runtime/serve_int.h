/*
 * serve_int.h: internals shared by serve.c, serve_api.c and serve_metrics.c.
 */
#ifndef MOET_SERVE_INT_H
#define MOET_SERVE_INT_H

#include <jansson.h>
#include <stdint.h>

#include "moet_serve.h"

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status. */
typedef struct serve_error {
	int status;            /* 400, 401, 404, 405, 413, 429, 500, 503 */
	const char *type;      /* "invalid_request_error", "authentication_error", ... */
	const char *code;      /* NULL or e.g. "model_not_found", "context_length_exceeded" */
	char param[64];        /* the field, or "" */
	char message[400];
} serve_error;

/* Fills e and returns -1, so a parser can `return serve_fail(e, 400, ...)`. */
int serve_fail(serve_error *e, int status, const char *type, const char *code,
	       const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The error's JSON body (malloc'd), or NULL on no memory. */
char *serve_error_body(const serve_error *e);

/* What the server knows while it parses and answers (borrowed from moet_serve). */
typedef struct serve_info {
	const moet_tokenizer *tok;
	const char *model_id;
	int64_t vocab;
	int64_t max_prompt_tokens;
	int64_t context;         /* min(kv_tokens, max_position_embeddings) */
	int32_t bos_id;          /* the tokenizer's BOS, prepended to text prompts; -1: none */
	uint64_t default_seed;   /* the seed of a request that names none (fresh per request) */
	uint64_t serial;         /* for the response id (fresh per request) */
} serve_info;

/* One parsed completion request. */
typedef struct serve_req {
	int chat;                /* /v1/chat/completions */
	int stream, include_usage;
	int logprobs;            /* 0: none; else logprobs were asked (top N in p.top_logprobs) */
	int tokens_as_ids;       /* vLLM's return_tokens_as_token_ids: "token_id:N" strings */
	int64_t *prompt;         /* owned */
	char *stop[MOET_SCHED_MAX_STOP];
	moet_sched_params p;     /* points into the above */
	char id[48];
	int64_t created;
} serve_req;

/* Parses a request body (n bytes). 0 and *out (free with serve_req_free), or -1 with e. */
int serve_parse(const serve_info *si, const char *body, size_t n, int chat, serve_req *out,
		serve_error *e);
void serve_req_free(serve_req *r);

/* What a response accumulates (non-streaming), or one update's share (streaming). */
typedef struct serve_out {
	const char *text;
	size_t n_text;
	const moet_sched_token *toks;
	size_t n_toks;
	size_t text_offset;      /* bytes of text sent before this piece (completions logprobs) */
	int finish;              /* MOET_SCHED_RUNNING or a finish */
	int64_t n_prompt, n_generated;
} serve_out;

/* The whole non-streaming response body (malloc'd) or NULL. */
char *serve_response(const serve_info *si, const serve_req *r, const serve_out *o);

/* One SSE event "data: {...}\n\n" (malloc'd) for a streamed piece; first: the chat stream's
 * opening role delta. NULL on no memory. */
char *serve_chunk(const serve_info *si, const serve_req *r, const serve_out *o, int first);

/* The usage chunk of stream_options.include_usage (malloc'd) or NULL. */
char *serve_usage_chunk(const serve_info *si, const serve_req *r, int64_t n_prompt,
			int64_t n_generated);

/* /v1/models body. */
char *serve_models_body(const serve_info *si, const char *note, int64_t created);

/* Prometheus text of the scheduler's stats (serve_metrics.c), malloc'd, or NULL. */
char *serve_metrics_text(const moet_sched_stats *st, uint64_t http_requests,
			 uint64_t http_errors);

/* Appends n bytes to a growing NUL-terminated buffer. 0 or -1 (no memory). */
int serve_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

/* s[0, n) with every invalid UTF-8 sequence replaced by U+FFFD, as a JSON string. */
json_t *serve_json_text(const char *s, size_t n);

#endif
