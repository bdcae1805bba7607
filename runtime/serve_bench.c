/*
 * serve_bench.c: `moet-hybrid bench serve`: what the server costs on top of the decode step
 * (HTTP + tokenizer + JSON/SSE + scheduling + detokenization), at N concurrent streams.
 *
 *   bare:   N sequences prefilled, then `tokens` decode steps of moet_model_forward_batch
 *           (N x 1 token) + argmax per row, timed step by step -> median step time
 *   served: the same model behind moet_serve on loopback; N client threads (in this
 *           process: they only count SSE events, no JSON) stream `tokens` tokens each from a
 *           text prompt; wall time / engine steps -> time per served step
 *   overhead = served step / bare step - 1   (target <= 0.03 at 16 streams)
 *
 * Also reported from the engine's own clock: the share of its step time spent outside the
 * forward pass (scheduling, sampling, detokenization, stop checks). NOTE: the client threads
 * share the machine's cores with the server, as a real load generator on the same host would;
 * on 2 cores that contention is part of the measured overhead.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "moet_bench.h"
#include "moet_err.h"
#include "moet_serve.h"

typedef struct client {
	int port, tokens, prompt_words;
	int events, ok;
	pthread_barrier_t *go;
} client;

static void *client_run(void *arg)
{
	client *c = arg;
	char body[4096], head[512];
	int k = snprintf(body, sizeof(body), "{\"prompt\":\"");
	for (int i = 0; i < c->prompt_words && k < 3000; i++)
		k += snprintf(body + k, sizeof(body) - (size_t)k, "%sword%d", i ? " " : "", i);
	snprintf(body + k, sizeof(body) - (size_t)k, "\",\"max_tokens\":%d,\"temperature\":0,"
		 "\"ignore_eos\":true,\"stream\":true}", c->tokens);
	int hn = snprintf(head, sizeof(head), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
			  "Connection: close\r\nContent-Type: application/json\r\n"
			  "Content-Length: %zu\r\n\r\n", strlen(body));
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	pthread_barrier_wait(c->go);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    send(fd, head, (size_t)hn, MSG_NOSIGNAL) != hn ||
	    send(fd, body, strlen(body), MSG_NOSIGNAL) != (ssize_t)strlen(body)) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	char buf[16384], tail[8] = { 0 };
	ssize_t n;
	while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
		for (ssize_t i = 0; i < n; i++) { /* "data: " and "[DONE]" across reads */
			memmove(tail, tail + 1, 5);
			tail[5] = buf[i];
			c->events += !memcmp(tail, "data: ", 6);
			c->ok |= !memcmp(tail, "[DONE]", 6);
		}
	}
	close(fd);
	return NULL;
}

/* Bare decode: N sequences, `steps` timed steps; median/min/max of the step times. */
static int bare(moet_model *m, int n, int prompt, int steps, moet_bench_stats *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	moet_kv **kv = calloc((size_t)n, sizeof(*kv));
	moet_seq_step *st = calloc((size_t)n, sizeof(*st));
	int64_t *tok = calloc((size_t)n * (size_t)(prompt + 1), sizeof(int64_t));
	float *lg = malloc((size_t)n * (size_t)V * sizeof(float));
	double *t = calloc((size_t)steps, sizeof(double));
	int rc = 0;
	if (!kv || !st || !tok || !lg || !t) {
		rc = moet_err(MOET_ENOMEM, "bench serve: buffers");
		goto out;
	}
	for (int s = 0; s < n && !rc; s++) {
		rc = moet_kv_create(m, prompt + steps + 2, &kv[s]);
		for (int i = 0; i < prompt; i++)
			tok[(size_t)s * (size_t)(prompt + 1) + (size_t)i] = 4 + (s * 31 + i * 7) % (V - 4);
		st[s] = (moet_seq_step){ .kv = kv[s], .tokens = tok + (size_t)s * (size_t)(prompt + 1),
					 .n_tok = prompt, .last_only = 1,
					 .out_logits = lg + (size_t)s * (size_t)V };
	}
	for (int step = -1; step < steps && !rc; step++) {
		double t0 = moet_bench_now_s();
		rc = moet_model_forward_batch(m, st, n);
		for (int s = 0; s < n && !rc; s++) {
			int64_t *next = tok + (size_t)s * (size_t)(prompt + 1) + (size_t)prompt;
			*next = moet_argmax(st[s].out_logits, V);
			st[s].tokens = next;
			st[s].n_tok = 1;
		}
		if (step >= 0)
			t[step] = moet_bench_now_s() - t0; /* step -1 is the prefill */
	}
	if (!rc)
		moet_bench_stats_of(t, steps, out);
out:
	for (int s = 0; kv && s < n; s++)
		moet_kv_destroy(kv[s]);
	free(kv);
	free(st);
	free(tok);
	free(lg);
	free(t);
	return rc;
}

/* One served run: wall seconds per engine step, and the engine's non-forward share. */
static int served(moet_model *m, const moet_tokenizer *tok, const moet_serve_bench_opts *o,
		  double *out_step_s, double *out_engine_share, double *out_fwd_step_s,
		  double *out_tok_s, int *out_errors)
{
	moet_serve_opts so = { .port = 0, .model_id = "bench",
			       .sched = { .max_requests = o->streams, .max_batch_tokens = 4096,
					  .kv_tokens = (int64_t)o->streams * (o->tokens + 256) } };
	moet_serve *sv = NULL;
	int rc = moet_serve_start(m, tok, &so, &sv);
	if (rc)
		return rc;
	client *cl = calloc((size_t)o->streams, sizeof(*cl));
	pthread_t *th = calloc((size_t)o->streams, sizeof(*th));
	pthread_barrier_t go;
	if (!cl || !th) {
		free(cl);
		free(th);
		moet_serve_stop(sv);
		return moet_err(MOET_ENOMEM, "bench serve: clients");
	}
	pthread_barrier_init(&go, NULL, (unsigned)o->streams + 1);
	moet_sched_stats a, b;
	for (int i = 0; i < o->streams; i++) {
		cl[i] = (client){ .port = moet_serve_port(sv), .tokens = o->tokens,
				  .prompt_words = o->prompt_words, .go = &go };
		pthread_create(&th[i], NULL, client_run, &cl[i]);
	}
	moet_sched_get_stats(moet_serve_sched(sv), &a);
	pthread_barrier_wait(&go);
	double t0 = moet_bench_now_s();
	for (int i = 0; i < o->streams; i++)
		pthread_join(th[i], NULL);
	double wall = moet_bench_now_s() - t0;
	moet_sched_get_stats(moet_serve_sched(sv), &b);
	int errors = 0;
	for (int i = 0; i < o->streams; i++)
		errors += !cl[i].ok;
	uint64_t steps = b.steps - a.steps;
	*out_step_s = steps ? wall / (double)steps : 0;
	double ss = b.step_s - a.step_s, fs = b.forward_s - a.forward_s;
	*out_engine_share = ss > 0 ? (ss - fs) / ss : 0;
	*out_fwd_step_s = steps ? fs / (double)steps : 0;
	*out_tok_s = (double)(b.tokens_generated - a.tokens_generated) / wall;
	*out_errors = errors;
	pthread_barrier_destroy(&go);
	free(cl);
	free(th);
	moet_serve_stop(sv);
	return 0;
}

int moet_serve_bench(const moet_serve_bench_opts *o, json_t *rec, FILE *log, FILE *table)
{
	char demo[4096], tpath[4200];
	const char *dir = o->model_dir;
	moet_model *m = NULL;
	moet_tokenizer *tok = NULL;
	int rc = 0;
	if (!dir) {
		if ((rc = moet_serve_demo_dir(demo, sizeof(demo))) ||
		    (rc = moet_serve_demo_ensure(demo)))
			return rc;
		dir = demo;
	}
	snprintf(tpath, sizeof(tpath), "%s/tokenizer.json", dir);
	if ((rc = moet_model_open_on(dir, o->device ? o->device : "cpu", &m)) ||
	    (rc = moet_tokenizer_load(tpath, &tok)))
		goto out;
	const moet_config *c = moet_model_config(m);
	fprintf(log, "bench serve: %s, %d streams x %d tokens, %d reps\n", dir, o->streams,
		o->tokens, o->reps);
	/* the prompt's length in tokens, to give the bare run the same positions */
	int32_t *ids = NULL;
	size_t n_ids = 0;
	char words[4096];
	int k = 0;
	for (int i = 0; i < o->prompt_words && k < 3000; i++)
		k += snprintf(words + k, sizeof(words) - (size_t)k, "%sword%d", i ? " " : "", i);
	if ((rc = moet_tokenizer_encode(tok, words, (size_t)k, &ids, &n_ids)))
		goto out;
	free(ids);
	double *bs = calloc((size_t)o->reps, sizeof(double));
	double *ss = calloc((size_t)o->reps, sizeof(double));
	double share = 0, tps = 0, fwd = 0;
	int errors = 0;
	if (!bs || !ss) {
		free(bs);
		free(ss);
		rc = moet_err(MOET_ENOMEM, "bench serve");
		goto out;
	}
	/* NOTE: bare and served alternate, so that drift of a shared machine hits both */
	for (int r = 0; r < o->reps && !rc; r++) {
		moet_bench_stats st;
		int e = 0;
		double sh = 0, tp = 0, fw = 0;
		rc = bare(m, o->streams, (int)n_ids + 1, o->tokens, &st);
		if (!rc)
			rc = served(m, tok, o, &ss[r], &sh, &fw, &tp, &e);
		bs[r] = st.median_s;
		share += sh / o->reps;
		fwd += fw / o->reps;
		tps += tp / o->reps;
		errors += e;
		if (!rc)
			fprintf(log, "  rep %d: bare step %.3f ms, served step %.3f ms, %.0f tok/s, "
				"%d errors\n", r + 1, bs[r] * 1e3, ss[r] * 1e3, tp, e);
	}
	moet_bench_stats b, s;
	if (!rc) {
		moet_bench_stats_of(bs, o->reps, &b);
		moet_bench_stats_of(ss, o->reps, &s);
		double over = s.median_s / b.median_s - 1;
		moet_bench_add_ceiling(rec, "decode-step-bare", b.median_s, "s");
		moet_bench_row r1 = { .name = "decode-step-bare", .tokens = o->streams, .st = b,
				      .ceiling = "decode-step-bare", .ratio = 1 };
		moet_bench_row r2 = { .name = "decode-step-served", .tokens = o->streams, .st = s,
				      .ceiling = "decode-step-bare", .ratio = s.median_s /
				      b.median_s };
		moet_bench_add_row(rec, &r1);
		moet_bench_add_row(rec, &r2);
		json_object_set_new(rec, "serve", json_pack(
			"{s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:i, s:s, s:{s:I, s:I, s:I, s:I}}",
			"streams", o->streams, "tokens_per_stream", o->tokens, "prompt_tokens",
			(json_int_t)n_ids + 1, "overhead_share", over, "overhead_s_per_step",
			s.median_s - b.median_s, "served_forward_s_per_step", fwd,
			"engine_non_forward_share", share, "tokens_per_s", tps, "errors", errors,
			"model", dir, "geometry",
			"layers", (json_int_t)c->num_hidden_layers, "hidden",
			(json_int_t)c->hidden_size, "experts", (json_int_t)c->n_routed_experts,
			"vocab", (json_int_t)c->vocab_size));
		fprintf(table, "%-22s %10s %10s %10s\n", "row (step time)", "median ms", "min ms",
			"max ms");
		fprintf(table, "%-22s %10.3f %10.3f %10.3f\n", "decode-step-bare",
			b.median_s * 1e3, b.min_s * 1e3, b.max_s * 1e3);
		fprintf(table, "%-22s %10.3f %10.3f %10.3f\n", "decode-step-served",
			s.median_s * 1e3, s.min_s * 1e3, s.max_s * 1e3);
		fprintf(table, "server overhead: %.1f%% of the decode step at %d streams "
			"(target <= 3%%), %.3f ms per step; forward inside the server %.3f ms per "
			"step; engine outside forward: %.1f%% of its step; %.0f tok/s; %d errors\n",
			over * 100, o->streams, (s.median_s - b.median_s) * 1e3, fwd * 1e3,
			share * 100, tps, errors);
		if (errors)
			rc = moet_err(MOET_EIO, "bench serve: %d streams failed", errors);
	}
	free(bs);
	free(ss);
out:
	moet_tokenizer_destroy(tok);
	moet_model_close(m);
	return rc;
}
