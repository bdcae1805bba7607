/*
 * moet_serve.h: the OpenAI-compatible HTTP server of `moet-hybrid serve` (docs/serve.md),
 * on libmicrohttpd, over the scheduler (moet_sched.h).
 *
 *   client --HTTP/1.1--> libmicrohttpd (one thread per connection)
 *            POST /v1/completions, /v1/chat/completions   JSON in; JSON or SSE out
 *            GET  /v1/models, /health, /metrics
 *          --> serve_api.c: parse, validate (400/404/413), tokenize, chat format
 *          --> moet_sched_submit (429 when full) --> poll --> JSON / SSE chunks
 *
 * Files: serve.c (daemon, routing, auth, body limits, streaming, disconnects), serve_api.c
 * (request fields -> scheduler parameters; response bodies), serve_metrics.c (Prometheus
 * text), serve_demo.c (the embedded demo checkpoint).
 */
#ifndef MOET_SERVE_H
#define MOET_SERVE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moet_model.h"
#include "moet_sched.h"
#include "moet_tokenizer.h"

typedef struct moet_serve moet_serve;

typedef struct moet_serve_opts {
	const char *host;          /* address to bind; NULL: "127.0.0.1" */
	int port;                  /* 0: any free port (moet_serve_port says which) */
	const char *api_key;       /* NULL: no authentication; else /v1/ needs Bearer KEY */
	const char *model_id;      /* the name in /v1/models and responses; NULL: "moet" */
	const char *model_note;    /* a line for /v1/models (e.g. "synthetic untrained demo") */
	size_t max_body_bytes;     /* request body limit (413); 0: 1 MiB */
	int64_t max_prompt_tokens; /* prompt limit (413); 0: the context (kv_tokens, positions) */
	moet_sched_opts sched;
} moet_serve_opts;

/*
 * Starts the scheduler and the HTTP daemon over m and tok (both borrowed until stop; tok may
 * be NULL: then only token-id prompts are accepted and responses carry no text). Returns 0 and
 * *out, or MOET_EINVAL (bad host), MOET_EIO (cannot bind: the detail names host:port),
 * MOET_ENOMEM.
 */
int moet_serve_start(moet_model *m, const moet_tokenizer *tok, const moet_serve_opts *o,
		     moet_serve **out);

/* The port the daemon listens on. */
int moet_serve_port(const moet_serve *s);

/* The scheduler (borrowed), for stats. */
moet_sched *moet_serve_sched(moet_serve *s);

/* Stops accepting, cancels every request in flight, joins the threads, frees. NULL ok. */
void moet_serve_stop(moet_serve *s);

/* ---- serve_demo.c ------------------------------------------------------------------------ */

/* ${XDG_CACHE_HOME:-$HOME/.cache}/moet-hybrid/demo-tiny into buf. 0 or MOET_ERANGE. */
int moet_serve_demo_dir(char *buf, size_t n);

/*
 * Makes sure dir holds the demo: the tiny synthetic checkpoint (gen-checkpoint --preset tiny
 * --seed 1, as quickstart.sh's demo) and the project's tokenizer (moet_gen_tokenizer.h),
 * writing what is missing. Safe against a concurrent call for the same dir (each writes into
 * its own temporary directory and renames it into place). Returns 0 or an error naming the
 * path.
 */
int moet_serve_demo_ensure(const char *dir);

/* ---- serve_bench.c: `moet-hybrid bench serve` ------------------------------------------- */

typedef struct moet_serve_bench_opts {
	const char *model_dir;     /* NULL: the demo */
	const char *device;        /* NULL: "cpu" */
	const int64_t *streams;    /* stream counts, each measured in turn; NULL: { 16 } */
	int n_streams;
	int tokens;                /* tokens per stream (the bare run: tokens - 1 decode steps) */
	int prompt_words;          /* words of the text prompt */
	int reps;                  /* bare/served/replay rounds per stream count */
	int same_prompt;           /* every stream stream 0's prompt (the load before issue 7's
				      fix, to compare); else each stream its own */
	/* A hybrid placement (NULL: none): owner[layer x expert] = -1 (the CPU tier) or device
	 * g < n_devices (simulated devices on the CPU backend); with it the bytes-roofline
	 * prediction of each stream count's step (docs/serve.md) */
	const int16_t *owner;
	int n_devices;
	const char *placement;     /* what the placement is, for the record and the log */
} moet_serve_bench_opts;

/*
 * Server overhead against a bare replay of the steps it ran (the same prompts, batches and
 * work; its steps of N decodes against the bare N-decode step) at each stream count, the
 * served batch-size histogram, the tokens/s of each count against the smallest one's and,
 * with a placement, the measured tokens/s against the bytes-roofline prediction
 * (docs/serve.md): adds ceilings, rows and a "serve" object to rec, progress to log, the table
 * to table. Returns 0, or an error (MOET_EIO when a stream failed or the server ran prompts
 * other than the streams'; MOET_EINVAL for options out of range, naming the option).
 */
int moet_serve_bench(const moet_serve_bench_opts *o, json_t *rec, FILE *log, FILE *table);

#endif
