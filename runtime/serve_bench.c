/*
 * serve_bench.c: `moet-hybrid bench serve`: what the server costs on top of the decode step
 * (HTTP + tokenizer + JSON/SSE + scheduling + detokenization), how tokens/s grow with the
 * number of concurrent streams, and, for a hybrid placement, how the step compares with what
 * the bytes of the experts it touches allow (docs/serve.md).
 *
 * Per stream count N (--streams 1,16: each in turn, in the same process and model):
 *   bare:   N sequences prefilled, then `tokens` decode steps of moet_model_forward_batch
 *           (N x 1 token, the next token drawn greedily where the logits are, as the server
 *           does), timed step by step -> median step time; tokens/s = N / step
 *   served: the same model behind moet_serve on loopback; N client threads (in this
 *           process: they only count SSE events, no JSON) stream `tokens` tokens each from a
 *           text prompt; wall time / engine steps -> time per served step; tokens/s = the
 *           scheduler's generated tokens / wall time
 *   overhead = served step / bare step - 1   (target <= 0.03 at 16 streams)
 *   scaling  = tokens/s(N) / tokens/s(smallest N), bare and served  (target >= 4 at 16)
 *
 * With a placement (owner table), before it is set: the all-resident bare step at each N, and
 * a replay of it with the route observer on (serve_bench_pred.c: the experts each step
 * touches); the tiers' bandwidths measured in the same run (the CPU tier's read ceiling; the
 * GPU's device copy ceiling, or the read ceiling for simulated devices); then the placement
 * is set and the rows measured under it beside the prediction
 *   predicted step = max over tiers (touched bytes / bandwidth) + (resident step - its
 *                    expert bytes time), median over the steps;  measured / predicted
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
#include "moet_placement.h"
#include "moet_serve.h"
#include "moet_topo.h"
#include "serve_bench_int.h"

/* The clients' start line: they connect when it opens (all at once). */
typedef struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int open;
} gate;

static void gate_wait(gate *g)
{
	pthread_mutex_lock(&g->mu);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

typedef struct client {
	int port, tokens;
	const char *prompt;        /* the JSON value of "prompt" */
	int events, ok;
	struct gate *go;
} client;

static void *client_run(void *arg)
{
	client *c = arg;
	char body[4096], head[512];
	snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,"
		 "\"ignore_eos\":true,\"stream\":true}", c->prompt, c->tokens);
	int hn = snprintf(head, sizeof(head), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
			  "Connection: close\r\nContent-Type: application/json\r\n"
			  "Content-Length: %zu\r\n\r\n", strlen(body));
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	gate_wait(c->go);
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


/* Bare decode: n sequences of `prompt` tokens, `steps` timed steps, the next tokens drawn
 * greedily where the logits are. With obs, the route observer records each step's experts
 * (obs->cur = the step; the steps are then not timed as the engine's: the observer copies
 * the ids to the host). Deterministic: every call with the same arguments routes alike. */
static int bare(moet_model *m, int n, int prompt, int steps, sb_touch *obs,
		moet_bench_stats *out)
{
	static const moet_sample_params greedy = { .temperature = 0, .top_k = 0, .top_p = 1 };
	const int64_t V = moet_model_config(m)->vocab_size;
	moet_kv **kv = calloc((size_t)n, sizeof(*kv));
	moet_seq_step *st = calloc((size_t)n, sizeof(*st));
	int64_t *tok = calloc((size_t)n * (size_t)(prompt + 1), sizeof(int64_t));
	double *t = calloc((size_t)steps, sizeof(double));
	int rc = 0;
	if (!kv || !st || !tok || !t) {
		rc = moet_err(MOET_ENOMEM, "bench serve: buffers");
		goto out;
	}
	for (int s = 0; s < n && !rc; s++) {
		int64_t *row = tok + (size_t)s * (size_t)(prompt + 1);
		rc = moet_kv_create(m, prompt + steps + 2, &kv[s]);
		for (int i = 0; i < prompt; i++)
			row[i] = 4 + (s * 31 + i * 7) % (V - 4);
		st[s] = (moet_seq_step){ .kv = kv[s], .tokens = row, .n_tok = prompt,
					 .sample = &greedy, .out_token = row + prompt };
	}
	for (int step = -1; step < steps && !rc; step++) {
		if (obs && step == 0)
			moet_model_set_route_observer(m, sb_touch_route, obs);
		if (obs)
			obs->cur = step;
		double t0 = moet_bench_now_s();
		rc = moet_model_forward_batch(m, st, n);
		if (step >= 0)
			t[step] = moet_bench_now_s() - t0; /* step -1 is the prefill */
		for (int s = 0; s < n && !rc; s++) { /* the drawn token is the next input */
			int64_t *row = tok + (size_t)s * (size_t)(prompt + 1);
			row[0] = row[prompt];
			st[s].tokens = row;
			st[s].n_tok = 1;
			st[s].out_token = row + prompt;
		}
	}
	if (obs) {
		moet_model_set_route_observer(m, NULL, NULL);
		obs->cur = -1;
	}
	if (!rc)
		moet_bench_stats_of(t, steps, out);
out:
	for (int s = 0; kv && s < n; s++)
		moet_kv_destroy(kv[s]);
	free(kv);
	free(st);
	free(tok);
	free(t);
	return rc;
}

/* One served run of n streams: wall seconds per engine step, the engine's non-forward share,
 * its forward time per step, generated tokens/s, failed streams. */
typedef struct served_out {
	double step_s, engine_share, fwd_step_s, tok_s;
	int errors;
} served_out;

static int served(moet_model *m, const moet_tokenizer *tok, const moet_serve_bench_opts *o,
		  const char *prompt, int n, served_out *out)
{
	moet_serve_opts so = { .port = 0, .model_id = "bench",
			       .sched = { .max_requests = n, .max_batch_tokens = 4096,
					  .kv_tokens = (int64_t)n * (o->tokens + 256),
					  .n_devices = o->owner ? o->n_devices : 0 } };
	moet_serve *sv = NULL;
	int rc = moet_serve_start(m, tok, &so, &sv);
	if (rc)
		return rc;
	client *cl = calloc((size_t)n, sizeof(*cl));
	pthread_t *th = calloc((size_t)n, sizeof(*th));
	gate go = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
	if (!cl || !th) {
		free(cl);
		free(th);
		moet_serve_stop(sv);
		return moet_err(MOET_ENOMEM, "bench serve: clients");
	}
	moet_sched_stats a, b;
	int made = 0;
	for (int i = 0; i < n; i++) {
		cl[i] = (client){ .port = moet_serve_port(sv), .tokens = o->tokens,
				  .prompt = prompt, .go = &go };
		if (pthread_create(&th[i], NULL, client_run, &cl[i]))
			break;
		made++;
	}
	if (made < n)
		rc = moet_err(MOET_EIO, "bench serve: %d of %d client threads started", made, n);
	moet_sched_get_stats(moet_serve_sched(sv), &a);
	gate_open(&go);
	double t0 = moet_bench_now_s();
	for (int i = 0; i < made; i++)
		pthread_join(th[i], NULL);
	double wall = moet_bench_now_s() - t0;
	moet_sched_get_stats(moet_serve_sched(sv), &b);
	int errors = 0;
	for (int i = 0; i < n; i++)
		errors += !cl[i].ok;
	uint64_t steps = b.steps - a.steps;
	double ss = b.step_s - a.step_s, fs = b.forward_s - a.forward_s;
	*out = (served_out){ .step_s = steps ? wall / (double)steps : 0,
			     .engine_share = ss > 0 ? (ss - fs) / ss : 0,
			     .fwd_step_s = steps ? fs / (double)steps : 0,
			     .tok_s = (double)(b.tokens_generated - a.tokens_generated) / wall,
			     .errors = errors };
	free(cl);
	free(th);
	moet_serve_stop(sv);
	return rc;
}

/* One stream count's measurements. */
typedef struct sb_run {
	int n;
	moet_bench_stats bare, served;  /* step times: medians of the reps' */
	double bare_tps, served_tps;    /* n / bare step; the scheduler's tokens / wall (median) */
	double share, fwd;              /* engine outside forward; its forward per step (means) */
	int errors;
	moet_bench_stats resident;      /* with a placement: the all-resident bare step */
	sb_pred pred;
	json_t *pred_steps;             /* per-step detail of the prediction */
} sb_run;

/* The tiers' bandwidths, measured now, into ceilings. The CPU tier's team as the hybrid
 * engine sizes it (MOET_CPU_THREADS, else every core but one beside a GPU, every core on the
 * CPU backend); simulated devices are host memory: the read ceiling again. */
static int measure_bw(const char *device, json_t *rec, FILE *log, sb_bw *bw)
{
	const int on_cpu = !strcmp(device, "cpu");
	const char *env = getenv("MOET_CPU_THREADS");
	int thr = env && env[0] ? atoi(env) : on_cpu ? 0 : moet_topo_cores_but_one();
	size_t rb = 0;
	thr = thr < 0 ? 0 : thr;
	fprintf(log, "bench serve: the CPU tier's read ceiling (%d threads; 0: every core) ...\n",
		thr);
	int rc = moet_bench_tier_read_GBps(thr, 5, &bw->cpu_GBps, &rb);
	if (rc || (rc = moet_bench_add_ceiling(rec, "read_GBps", bw->cpu_GBps, "GB/s")))
		return rc;
	json_t *c = json_object_get(json_object_get(rec, "ceilings"), "read_GBps");
	json_object_set_new(c, "buffer_bytes", json_integer((json_int_t)rb));
	json_object_set_new(c, "threads", json_integer(thr));
	json_object_set_new(c, "isa", json_string(moet_bench_ceil_isa()));
	bw->dev_GBps = bw->cpu_GBps;
	bw->dev_ceiling = "read_GBps";
	if (on_cpu)
		return 0;
	fprintf(log, "bench serve: the GPU's device copy ceiling ...\n");
	if ((rc = moet_bench_copy_GBps(5, &bw->dev_GBps)))
		return rc;
	bw->dev_ceiling = "copy_GBps";
	return moet_bench_add_ceiling(rec, "copy_GBps", bw->dev_GBps, "GB/s");
}

/* With a placement, before it is set: each count's all-resident step, the replay that
 * records its routing, and the prediction. */
static int predict_all(moet_model *m, const moet_serve_bench_opts *o, const sb_bw *bw,
		       const moet_placement_sizes *sz, int prompt, sb_run *runs, int n_runs,
		       FILE *log)
{
	double *med = calloc((size_t)o->reps, sizeof(double));
	int rc = med ? 0 : moet_err(MOET_ENOMEM, "bench serve: samples");
	for (int i = 0; i < n_runs && !rc; i++) {
		sb_run *r = &runs[i];
		moet_bench_stats st;
		for (int k = 0; k < o->reps && !rc; k++) {
			rc = bare(m, r->n, prompt, o->tokens, NULL, &st);
			med[k] = st.median_s;
		}
		if (rc)
			break;
		moet_bench_stats_of(med, o->reps, &r->resident);
		sb_touch t;
		if ((rc = sb_touch_init(&t, m, o->tokens)))
			break;
		if (!(rc = bare(m, r->n, prompt, o->tokens, &t, &st)) &&
		    !(r->pred_steps = json_array()))
			rc = moet_err(MOET_ENOMEM, "bench serve: prediction");
		if (!rc)
			rc = sb_predict(&t, sz, o->owner, 1 + o->n_devices, bw,
					r->resident.median_s, r->n, r->pred_steps, &r->pred);
		sb_touch_free(&t);
		if (!rc)
			fprintf(log, "  %d streams, every expert resident: step %.3f ms (experts "
				"%.3f ms of it by their bytes); predicted with the placement %.3f "
				"ms\n", r->n, r->resident.median_s * 1e3,
				r->pred.resident_expert_s * 1e3, r->pred.step_s * 1e3);
	}
	free(med);
	return rc;
}

/* The measured runs under the placement (if any): bare and served alternating. */
static int measure_all(moet_model *m, const moet_tokenizer *tok, const moet_serve_bench_opts *o,
		       const char *prompt_json, int prompt, sb_run *runs, int n_runs, FILE *log)
{
	double *bs = calloc((size_t)o->reps, sizeof(double));
	double *ss = calloc((size_t)o->reps, sizeof(double));
	double *tp = calloc((size_t)o->reps, sizeof(double));
	int rc = bs && ss && tp ? 0 : moet_err(MOET_ENOMEM, "bench serve: samples");
	for (int i = 0; i < n_runs && !rc; i++) {
		sb_run *r = &runs[i];
		/* NOTE: bare and served alternate, so that drift of a shared machine hits both */
		for (int k = 0; k < o->reps && !rc; k++) {
			moet_bench_stats st;
			served_out so = { 0 };
			if ((rc = bare(m, r->n, prompt, o->tokens, NULL, &st)) ||
			    (rc = served(m, tok, o, prompt_json, r->n, &so)))
				break;
			bs[k] = st.median_s;
			ss[k] = so.step_s;
			tp[k] = so.tok_s;
			r->share += so.engine_share / o->reps;
			r->fwd += so.fwd_step_s / o->reps;
			r->errors += so.errors;
			fprintf(log, "  %d streams, rep %d: bare step %.3f ms, served step %.3f ms, "
				"%.0f tok/s, %d errors\n", r->n, k + 1, bs[k] * 1e3, ss[k] * 1e3,
				so.tok_s, so.errors);
		}
		if (rc)
			break;
		moet_bench_stats_of(bs, o->reps, &r->bare);
		moet_bench_stats_of(ss, o->reps, &r->served);
		moet_bench_stats tps;
		moet_bench_stats_of(tp, o->reps, &tps);
		r->served_tps = tps.median_s;
		r->bare_tps = r->n / r->bare.median_s;
	}
	free(bs);
	free(ss);
	free(tp);
	return rc;
}

/* A row whose ratio compares tokens/s; the row carries its own "tokens_per_s". */
static int tps_row(json_t *rec, const char *name, int n, moet_bench_stats st, const char *ceil,
		   double ratio, double tps)
{
	moet_bench_row r = { .name = name, .tokens = n, .st = st, .ceiling = ceil, .ratio = ratio };
	int rc = moet_bench_add_row(rec, &r);
	json_t *res = json_object_get(rec, "results");
	if (!rc)
		json_object_set_new(json_array_get(res, json_array_size(res) - 1), "tokens_per_s",
				    json_real(tps));
	return rc;
}

static json_t *doubles(const double *v, int n)
{
	json_t *a = json_array();
	for (int i = 0; a && i < n; i++)
		json_array_append_new(a, json_real(v[i]));
	return a;
}

/* Rows, ceilings and the "serve" object's runs; base = the smallest stream count's run. */
static int record(json_t *rec, json_t *jruns, const sb_run *runs, int n_runs, const sb_run *base,
		  const moet_serve_bench_opts *o, const sb_bw *bw)
{
	char cb[64], ct[64], cs[64], cp[64];
	snprintf(ct, sizeof(ct), "tokens-per-s-bare-%d", base->n);
	snprintf(cs, sizeof(cs), "tokens-per-s-served-%d", base->n);
	int rc = moet_bench_add_ceiling(rec, ct, base->bare_tps, "tokens/s");
	if (!rc)
		rc = moet_bench_add_ceiling(rec, cs, base->served_tps, "tokens/s");
	for (int i = 0; i < n_runs && !rc; i++) {
		const sb_run *r = &runs[i];
		const double over = r->served.median_s / r->bare.median_s - 1;
		const double xb = r->bare_tps / base->bare_tps, xs = r->served_tps / base->served_tps;
		snprintf(cb, sizeof(cb), "decode-step-bare-%d", r->n);
		moet_bench_row r1 = { .name = "decode-step-bare", .tokens = r->n, .st = r->bare,
				      .ceiling = cb, .ratio = 1 };
		moet_bench_row r2 = { .name = "decode-step-served", .tokens = r->n, .st = r->served,
				      .ceiling = cb, .ratio = r->served.median_s /
				      r->bare.median_s };
		if ((rc = moet_bench_add_ceiling(rec, cb, r->bare.median_s, "s")) ||
		    (rc = moet_bench_add_row(rec, &r1)) || (rc = moet_bench_add_row(rec, &r2)) ||
		    (rc = tps_row(rec, "tokens-per-s-bare", r->n, r->bare, ct, xb, r->bare_tps)) ||
		    (rc = tps_row(rec, "tokens-per-s-served", r->n, r->served, cs, xs,
				  r->served_tps)))
			break;
		json_t *j = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i}",
				      "streams", r->n, "bare_step_s", r->bare.median_s,
				      "served_step_s", r->served.median_s, "overhead_share", over,
				      "overhead_s_per_step", r->served.median_s - r->bare.median_s,
				      "served_forward_s_per_step", r->fwd,
				      "engine_non_forward_share", r->share, "bare_tokens_per_s",
				      r->bare_tps, "served_tokens_per_s", r->served_tps,
				      "bare_scaling", xb, "served_scaling", xs, "errors", r->errors);
		json_array_append_new(jruns, j);
		if (!o->owner)
			continue;
		const sb_pred *p = &r->pred;
		const int nt = 1 + o->n_devices;
		double tbw[SB_MAX_TIERS], bound[SB_MAX_TIERS];
		for (int k = 0; k < nt; k++) {
			tbw[k] = k ? bw->dev_GBps : bw->cpu_GBps;
			bound[k] = p->bound_tier_steps[k];
		}
		snprintf(cp, sizeof(cp), "predicted-tokens-per-s-%d", r->n);
		const double mb = r->bare_tps / p->tokens_per_s, ms = r->served_tps / p->tokens_per_s;
		if ((rc = moet_bench_add_ceiling(rec, cp, p->tokens_per_s, "tokens/s")) ||
		    (rc = tps_row(rec, "tokens-per-s-bare-vs-predicted", r->n, r->bare, cp, mb,
				  r->bare_tps)) ||
		    (rc = tps_row(rec, "tokens-per-s-served-vs-predicted", r->n, r->served, cp, ms,
				  r->served_tps)))
			break;
		json_object_set_new(j, "prediction", json_pack(
			"{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:o, s:o, s:o, s:o, s:O}",
			"resident_step_s", p->resident_step_s, "resident_expert_s",
			p->resident_expert_s, "nonexpert_s", p->nonexpert_s, "predicted_step_s",
			p->step_s, "predicted_tokens_per_s", p->tokens_per_s, "bare_over_predicted",
			mb, "served_over_predicted", ms, "device_ceiling", bw->dev_ceiling,
			"tier_GBps", doubles(tbw, nt), "mean_bytes", doubles(p->mean_bytes, nt),
			"mean_distinct", doubles(p->mean_distinct, nt), "bound_steps",
			doubles(bound, nt), "steps", r->pred_steps));
	}
	return rc;
}

static void table_out(FILE *f, const sb_run *runs, int n_runs, const sb_run *base,
		      const moet_serve_bench_opts *o)
{
	fprintf(f, "%7s %10s %10s %9s %11s %7s %12s %7s", "streams", "bare_ms", "served_ms",
		"overhead", "bare_tok/s", "x", "served_tok/s", "x");
	if (o->owner)
		fprintf(f, " %10s %10s %10s %11s", "pred_ms", "pred_tok/s", "bare/pred",
			"served/pred");
	fputc('\n', f);
	for (int i = 0; i < n_runs; i++) {
		const sb_run *r = &runs[i];
		fprintf(f, "%7d %10.3f %10.3f %8.1f%% %11.1f %7.2f %12.1f %7.2f", r->n,
			r->bare.median_s * 1e3, r->served.median_s * 1e3,
			(r->served.median_s / r->bare.median_s - 1) * 100, r->bare_tps,
			r->bare_tps / base->bare_tps, r->served_tps, r->served_tps / base->served_tps);
		if (o->owner)
			fprintf(f, " %10.3f %10.1f %10.3f %11.3f", r->pred.step_s * 1e3,
				r->pred.tokens_per_s, r->bare_tps / r->pred.tokens_per_s,
				r->served_tps / r->pred.tokens_per_s);
		fputc('\n', f);
	}
	fprintf(f, "x: tokens/s against %d stream%s (target >= 4 at 16 streams, every expert "
		"resident); overhead: served step / bare step - 1 (target <= 3%% at 16)\n", base->n,
		base->n == 1 ? "" : "s");
	for (int i = 0; i < n_runs; i++)
		fprintf(f, "%d streams: forward inside the server %.3f ms per step; engine outside "
			"forward %.1f%% of its step; %d errors\n", runs[i].n, runs[i].fwd * 1e3,
			runs[i].share * 100, runs[i].errors);
	if (o->owner)
		fprintf(f, "pred: max over tiers (touched expert bytes / tier bandwidth) + the "
			"all-resident step's non-expert time, placement %s\n", o->placement ?
			o->placement : "(owner table)");
}

int moet_serve_bench(const moet_serve_bench_opts *o, json_t *rec, FILE *log, FILE *table)
{
	static const int64_t def_streams[] = { 16 };
	const int64_t *S = o->streams ? o->streams : def_streams;
	const int n_runs = o->streams ? o->n_streams : 1;
	const char *device = o->device ? o->device : "cpu";
	char demo[4096], tpath[4200];
	const char *dir = o->model_dir;
	moet_model *m = NULL;
	moet_tokenizer *tok = NULL;
	moet_placement_sizes *sz = NULL;
	sb_run *runs = NULL;
	sb_bw bw = { 0 };
	json_t *jruns = NULL;
	int rc = 0;
	if (n_runs < 1 || n_runs > 64)
		return moet_err(MOET_EINVAL, "--streams: %d counts (1 .. 64)", n_runs);
	for (int i = 0; i < n_runs; i++)
		if (S[i] < 1 || S[i] > 1024)
			return moet_err(MOET_EINVAL, "--streams: %lld is not in [1, 1024]",
					(long long)S[i]);
	if (o->tokens < 2 || o->reps < 1 || o->prompt_words < 1)
		return moet_err(MOET_EINVAL, "--tokens (>= 2), --reps, --prompt-words (>= 1): %d, "
				"%d, %d", o->tokens, o->reps, o->prompt_words);
	if (o->owner && (o->n_devices < 1 || o->n_devices > SB_MAX_TIERS - 1))
		return moet_err(MOET_EINVAL, "--placement: %d devices (1 .. %d)", o->n_devices,
				SB_MAX_TIERS - 1);
	if (!dir) {
		if ((rc = moet_serve_demo_dir(demo, sizeof(demo))) ||
		    (rc = moet_serve_demo_ensure(demo)))
			return rc;
		dir = demo;
	}
	snprintf(tpath, sizeof(tpath), "%s/tokenizer.json", dir);
	if ((rc = moet_model_open_on(dir, device, &m)))
		goto fail;
	if (access(tpath, F_OK) == 0 && (rc = moet_tokenizer_load(tpath, &tok)))
		goto fail;
	if (!(runs = calloc((size_t)n_runs, sizeof(*runs))) || !(jruns = json_array())) {
		rc = moet_err(MOET_ENOMEM, "bench serve");
		goto fail;
	}
	const sb_run *base = &runs[0];
	for (int i = 0; i < n_runs; i++) {
		runs[i].n = (int)S[i];
		base = runs[i].n < base->n ? &runs[i] : base;
	}
	const moet_config *c = moet_model_config(m);
	fprintf(log, "bench serve: %s on %s, streams", dir, device);
	for (int i = 0; i < n_runs; i++)
		fprintf(log, "%s%d", i ? "," : " ", runs[i].n);
	fprintf(log, " x %d tokens, %d reps%s%s\n", o->tokens, o->reps,
		o->owner ? ", placement " : "", o->owner && o->placement ? o->placement : "");
	/* the prompt: words (tokenized by the server, BOS prepended) or, for a checkpoint
	 * without tokenizer.json (gen-checkpoint's), as many token ids; the bare run gets the
	 * same length */
	char pj[4096];
	int k = 0, prompt = o->prompt_words + 1;
	const int64_t V = c->vocab_size;
	if (tok) {
		char words[3100];
		int32_t *ids = NULL;
		size_t n_ids = 0;
		for (int i = 0; i < o->prompt_words && k < 3000; i++)
			k += snprintf(words + k, sizeof(words) - (size_t)k, "%sword%d", i ? " " : "", i);
		if ((rc = moet_tokenizer_encode(tok, words, (size_t)k, &ids, &n_ids)))
			goto fail;
		free(ids);
		snprintf(pj, sizeof(pj), "\"%s\"", words);
		prompt = (int)n_ids + 1;
	} else {
		fprintf(log, "bench serve: %s has no tokenizer.json: the clients send token ids (no "
			"tokenizer in the served path)\n", dir);
		k = snprintf(pj, sizeof(pj), "[");
		int i = 0;
		for (; i < prompt && k < 3000; i++)
			k += snprintf(pj + k, sizeof(pj) - (size_t)k, "%s%lld", i ? "," : "",
				      (long long)(4 + (i * 7) % (V - 4)));
		prompt = i;
		snprintf(pj + k, sizeof(pj) - (size_t)k, "]");
	}
	if (o->owner &&
	    ((rc = moet_placement_sizes_from_ckpt(c, moet_model_ckpt(m), &sz)) ||
	     (rc = measure_bw(device, rec, log, &bw)) ||
	     (rc = predict_all(m, o, &bw, sz, prompt, runs, n_runs, log)) ||
	     (rc = moet_model_set_placement(m, o->owner, o->n_devices))))
		goto fail;
	if ((rc = measure_all(m, tok, o, pj, prompt, runs, n_runs, log)) ||
	    (rc = record(rec, jruns, runs, n_runs, base, o, &bw)))
		goto fail;
	json_t *sj = json_pack("{s:O, s:i, s:I, s:s, s:s, s:s?, s:{s:I, s:I, s:I, s:I}}", "runs",
			       jruns, "tokens_per_stream", o->tokens, "prompt_tokens",
			       (json_int_t)prompt, "model", dir, "device", device, "placement",
			       o->owner ? (o->placement ? o->placement : "owner table") : NULL,
			       "geometry", "layers", (json_int_t)c->num_hidden_layers, "hidden",
			       (json_int_t)c->hidden_size, "experts",
			       (json_int_t)c->n_routed_experts, "vocab",
			       (json_int_t)c->vocab_size);
	if (!sj || json_object_set_new(rec, "serve", sj)) {
		rc = moet_err(MOET_ENOMEM, "bench serve: record");
		goto fail;
	}
	table_out(table, runs, n_runs, base, o);
	int errors = 0;
	for (int i = 0; i < n_runs; i++)
		errors += runs[i].errors;
	if (errors)
		rc = moet_err(MOET_EIO, "bench serve: %d streams failed", errors);
fail:
	for (int i = 0; runs && i < n_runs; i++)
		json_decref(runs[i].pred_steps);
	free(runs);
	json_decref(jruns);
	moet_placement_sizes_free(sz);
	moet_tokenizer_destroy(tok);
	moet_model_close(m);
	return rc;
}
