/*
 * serve_bench.c: `moet-hybrid bench serve`: what the server costs on top of the engine
 * (HTTP + tokenizer + JSON/SSE + scheduling + detokenization), how tokens/s grow with the
 * number of concurrent streams, and, for a hybrid placement, how the step compares with what
 * the bytes of the experts it touches allow (docs/serve.md).
 *
 * Per stream count N (--streams 1,16: each in turn, in the same process and model), every
 * rep runs the same N prompts (stream s's own: token ids, or text the server tokenizes; the
 * bench tokenizes it too, as the server does) three ways:
 *   bare:    N sequences prefilled, then tokens - 1 decode steps in lockstep (N x 1 token,
 *            each next token drawn greedily where the logits are, as the scheduler does;
 *            caches from a pool of the server's geometry), each step timed -> median step;
 *            bare tokens/s = N / step
 *   served:  the model behind moet_serve on loopback; N client threads (in this process:
 *            they only count SSE events) stream `tokens` tokens each, stream s with prompt s;
 *            the engine's step observer records every forward call (serve_bench_trace.c)
 *   replay:  those forward calls again on the bare model: the same prompts, the same
 *            composition per step, the same work, timed call by call
 *   overhead      = (served wall / steps) / (replay forward time / steps) - 1: the server's
 *                   own cost, split into its forward calls running slower than the same
 *                   calls bare, and its time outside them (ramp-up while clients connect,
 *                   scheduling, the tail after the last step)
 *   full steps    = served steps of exactly N decodes: their start-to-next-start time
 *                   against the bare step (the same composition), median
 *   batch hist    = served steps by the number of entries (decodes + prefill chunks)
 *   scaling       = tokens/s(N) / tokens/s(smallest N), bare and served (target >= 4 at 16)
 * Checked every rep, recorded: each stream's prompt was served once (prompts_same), the
 * number of distinct prompts the server ran, and the tokens the replay and the bare run drew
 * equal the server's (tokens_same; greedy and batch-invariant, so they must).
 *   NOTE (issue 7): the bench used to send every client one text prompt while the bare run
 *   had N different ones, and compared wall / steps (prefill steps and partial batches
 *   included) with the lockstep step: the served streams decoded N identical sequences
 *   (one sequence's experts per step), which on the H200 made the "served" step 26% shorter
 *   than the bare one. --same-prompt brings back the one-prompt load, for both runs alike.
 *
 * With a placement (owner table), before it is set: the all-resident bare step at each N, and
 * a replay of it with the route observer on (serve_bench_pred.c: the experts each step
 * touches); the tiers' bandwidths measured in the same run (the CPU tier's read ceiling; the
 * GPU's device copy ceiling, or the read ceiling for simulated devices); then the placement
 * is set and the rows measured under it beside the prediction
 *   predicted step = max over tiers (touched bytes / bandwidth) + (resident step - its
 *                    expert bytes time), median over the steps;  measured / predicted
 * against the steps of the same composition: the bare step and the served full steps.
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
#include "moet_chat.h"
#include "moet_err.h"
#include "moet_placement.h"
#include "moet_serve.h"
#include "moet_topo.h"
#include "serve_bench_int.h"

#define SB_KV_BLOCK 64 /* positions per KV block: the server's default, also for bare runs */

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
	char head[512];
	const size_t cap = strlen(c->prompt) + 256;
	char *body = malloc(cap);
	if (!body)
		return NULL;
	int bn = snprintf(body, cap, "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,"
			  "\"ignore_eos\":true,\"stream\":true}", c->prompt, c->tokens);
	int hn = snprintf(head, sizeof(head), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
			  "Connection: close\r\nContent-Type: application/json\r\n"
			  "Content-Length: %d\r\n\r\n", bn);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	gate_wait(c->go);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    send(fd, head, (size_t)hn, MSG_NOSIGNAL) != hn ||
	    send(fd, body, (size_t)bn, MSG_NOSIGNAL) != bn) {
		if (fd >= 0)
			close(fd);
		free(body);
		return NULL;
	}
	free(body);
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

/* ---- prompts ------------------------------------------------------------------------------ */

/* Stream s's prompt: ids[s] (len[s] tokens) for the bare runs, json[s] for its client. */
typedef struct sb_prompts {
	int n;
	int64_t **ids;
	int64_t *len, max_len;
	char **json;
} sb_prompts;

static void prompts_free(sb_prompts *p)
{
	for (int s = 0; s < p->n; s++) {
		free(p->ids ? p->ids[s] : NULL);
		free(p->json ? p->json[s] : NULL);
	}
	free(p->ids);
	free(p->len);
	free(p->json);
	memset(p, 0, sizeof(*p));
}

/*
 * n streams' prompts of `words` words. With a tokenizer: stream s's text is the words
 * "word<s x words + i>" (so every stream routes its own way), sent as text; its ids are the
 * tokenizer's with the BOS token in front, as the server's completions endpoint makes them.
 * Without one (gen-checkpoint's checkpoints): words + 1 token ids of stream s's own, sent as
 * a list of ids. same: every stream gets stream 0's prompt (the load before issue 7's fix).
 */
static int prompts_make(const moet_tokenizer *tok, int64_t vocab, int n, int words, int same,
			sb_prompts *p)
{
	int32_t bos = -1;
	if (tok && moet_tokenizer_find(tok, MOET_CHAT_BOS, &bos))
		bos = -1;
	memset(p, 0, sizeof(*p));
	p->n = n;
	p->ids = calloc((size_t)n, sizeof(*p->ids));
	p->len = calloc((size_t)n, sizeof(*p->len));
	p->json = calloc((size_t)n, sizeof(*p->json));
	const size_t cap = (size_t)words * 32 + 64;
	char *text = malloc(cap);
	int rc = p->ids && p->len && p->json && text ? 0 : MOET_ENOMEM;
	for (int s = 0; s < n && !rc; s++) {
		const int64_t w = same ? 0 : s;
		size_t k = 0;
		if (tok) {
			int32_t *ids = NULL;
			size_t m = 0;
			for (int i = 0; i < words; i++)
				k += (size_t)snprintf(text + k, cap - k, "%sword%lld", i ? " " : "",
						      (long long)(w * words + i));
			if ((rc = moet_tokenizer_encode(tok, text, k, &ids, &m)))
				break;
			const int b = bos >= 0 && !(m && ids[0] == bos);
			p->len[s] = (int64_t)m + b;
			p->ids[s] = malloc((size_t)(p->len[s] + 1) * sizeof(int64_t));
			p->json[s] = malloc(k + 3);
			if (p->ids[s] && p->json[s]) {
				p->ids[s][0] = bos;
				for (size_t i = 0; i < m; i++)
					p->ids[s][(size_t)b + i] = ids[i];
				snprintf(p->json[s], k + 3, "\"%s\"", text);
			} else {
				rc = MOET_ENOMEM;
			}
			free(ids);
		} else {
			p->len[s] = words + 1;
			p->ids[s] = malloc((size_t)p->len[s] * sizeof(int64_t));
			p->json[s] = malloc((size_t)p->len[s] * 24 + 3);
			if (!p->ids[s] || !p->json[s]) {
				rc = MOET_ENOMEM;
				break;
			}
			char *j = p->json[s];
			j[k++] = '[';
			for (int64_t i = 0; i < p->len[s]; i++) {
				p->ids[s][i] = 4 + (w * 31 + i * 7) % (vocab - 4);
				k += (size_t)sprintf(j + k, "%s%lld", i ? "," : "",
						     (long long)p->ids[s][i]);
			}
			j[k++] = ']';
			j[k] = 0;
		}
		p->max_len = p->len[s] > p->max_len ? p->len[s] : p->max_len;
	}
	free(text);
	if (rc)
		prompts_free(p);
	return rc == MOET_ENOMEM ? moet_err(rc, "bench serve: prompts of %d streams", n) : rc;
}

/* KV positions for n streams of the longest prompt + tokens, in whole blocks each: every
 * request is admitted at once (the server reserves prompt + max_tokens per request). */
static int64_t kv_budget(const sb_prompts *p, int n, int tokens)
{
	const int64_t per = (p->max_len + tokens + SB_KV_BLOCK - 1) / SB_KV_BLOCK * SB_KV_BLOCK;
	return (int64_t)n * per;
}

/* ---- the runs ----------------------------------------------------------------------------- */

/* Bare decode: streams 0 .. n-1 prefilled, then `steps` timed steps of n decodes, the next
 * tokens drawn greedily where the logits are (the scheduler's way: last_only, out_token),
 * caches from one pool of the server's geometry. The tokens drawn go to gen[s * (steps + 1)
 * + i] when gen is not NULL. With obs, the route observer records each step's experts
 * (obs->cur = the step; those steps are not timed as the engine's: the observer copies the
 * ids to the host). Deterministic: every call with the same arguments routes alike. */
static int bare(moet_model *m, const sb_prompts *P, int n, int tokens, int steps, sb_touch *obs,
		moet_bench_stats *out, int64_t *gen)
{
	static const moet_sample_params greedy = { .temperature = 0, .top_k = 0, .top_p = 1 };
	moet_kv_pool *pool = NULL;
	moet_kv **kv = calloc((size_t)n, sizeof(*kv));
	moet_seq_step *st = calloc((size_t)n, sizeof(*st));
	int64_t *next = calloc((size_t)n * 2, sizeof(int64_t)); /* [s][0] input, [s][1] drawn */
	double *t = calloc((size_t)steps, sizeof(double));
	int rc = 0;
	if (!kv || !st || !next || !t) {
		rc = moet_err(MOET_ENOMEM, "bench serve: buffers");
		goto out;
	}
	if ((rc = moet_kv_pool_create(m, kv_budget(P, n, tokens), SB_KV_BLOCK, &pool)))
		goto out;
	for (int s = 0; s < n && !rc; s++) {
		rc = moet_kv_create_in(pool, P->len[s] + tokens, &kv[s]);
		st[s] = (moet_seq_step){ .kv = kv[s], .tokens = P->ids[s], .n_tok = P->len[s],
					 .last_only = 1, .sample = &greedy,
					 .out_token = &next[2 * s + 1] };
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
			if (gen)
				gen[(size_t)s * (size_t)(steps + 1) + (size_t)(step + 1)] =
					next[2 * s + 1];
			next[2 * s] = next[2 * s + 1];
			st[s].tokens = &next[2 * s];
			st[s].n_tok = 1;
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
	moet_kv_pool_destroy(pool);
	free(kv);
	free(st);
	free(next);
	free(t);
	return rc;
}

/* One served run of n streams (stream s: prompt s); the trace gets every forward call. */
typedef struct served_out {
	double wall_s, step_s, fwd_s;   /* wall; the engine's time in steps, in forward (sums) */
	uint64_t steps, generated, split;
	int errors;
} served_out;

static int served(moet_model *m, const moet_tokenizer *tok, const moet_serve_bench_opts *o,
		  const sb_prompts *P, int n, sb_trace *trace, served_out *out)
{
	moet_serve_opts so = { .port = 0, .model_id = "bench",
			       .sched = { .max_requests = n, .max_batch_tokens = 4096,
					  .kv_tokens = kv_budget(P, n, o->tokens),
					  .kv_block = SB_KV_BLOCK,
					  .n_devices = o->owner ? o->n_devices : 0,
					  .on_step = sb_trace_step, .on_step_ctx = trace } };
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
				  .prompt = P->json[i], .go = &go };
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
	*out = (served_out){ .wall_s = wall, .step_s = b.step_s - a.step_s,
			     .fwd_s = b.forward_s - a.forward_s, .steps = b.steps - a.steps,
			     .generated = b.tokens_generated - a.tokens_generated,
			     .split = b.hybrid.split_passes - a.hybrid.split_passes,
			     .errors = errors };
	free(cl);
	free(th);
	moet_serve_stop(sv); /* the engine joined: the trace is complete */
	if (!rc && trace->err)
		rc = moet_err(trace->err, "bench serve: %s", trace->why);
	return rc;
}

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
		       const moet_placement_sizes *sz, const sb_prompts *P, sb_run *runs,
		       int n_runs, FILE *log)
{
	const int steps = o->tokens - 1;
	double *med = calloc((size_t)o->reps, sizeof(double));
	int rc = med ? 0 : moet_err(MOET_ENOMEM, "bench serve: samples");
	for (int i = 0; i < n_runs && !rc; i++) {
		sb_run *r = &runs[i];
		moet_bench_stats st;
		rc = bare(m, P, r->n, o->tokens, steps < 8 ? steps : 8, NULL, &st, NULL); /* warm */
		for (int k = 0; k < o->reps && !rc; k++) {
			rc = bare(m, P, r->n, o->tokens, steps, NULL, &st, NULL);
			med[k] = st.median_s;
		}
		if (rc)
			break;
		moet_bench_stats_of(med, o->reps, &r->resident);
		sb_touch t;
		if ((rc = sb_touch_init(&t, m, steps)))
			break;
		if (!(rc = bare(m, P, r->n, o->tokens, steps, &t, &st, NULL)) &&
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

/* One stream count's samples, a slot per rep (full*: per rep that had full steps). */
typedef struct sb_reps {
	double *bare, *replay, *served, *full, *full_fwd, *tps, *rtps;
	int n_full;
} sb_reps;

static double split_now(moet_model *m)
{
	moet_hybrid_stats h;
	moet_model_hybrid_stats(m, &h, 0);
	return (double)h.split_passes;
}

/* The steps of a trace as columns: entries, decodes, tokens, start (from the first step's),
 * the served forward call and the replayed one (seconds). NULL when out of memory. */
static json_t *steps_json(const sb_trace *tr, const double *rs)
{
	json_t *c[6], *o = json_object();
	static const char *const names[6] = { "entries", "decodes", "tokens", "start_s",
					      "served_forward_s", "replay_s" };
	for (int i = 0; i < 6; i++)
		c[i] = json_array();
	for (int s = 0; s < tr->n_steps; s++) {
		const sb_step *st = &tr->step[s];
		json_array_append_new(c[0], json_integer(st->n));
		json_array_append_new(c[1], json_integer(st->n_decode));
		json_array_append_new(c[2], json_integer((json_int_t)st->n_tok));
		json_array_append_new(c[3], json_real(st->t0_s - tr->step[0].t0_s));
		json_array_append_new(c[4], json_real(st->fwd_s));
		json_array_append_new(c[5], json_real(rs[s]));
	}
	for (int i = 0; i < 6; i++)
		if (!c[i] || json_object_set_new(o, names[i], c[i])) {
			json_decref(o);
			o = NULL;
		}
	return o;
}

/* The figures of rep k from its trace, replay times rs and bare tokens gen. */
static void rep_figures(sb_trace *tr, const double *rs, const served_out *so,
			const sb_prompts *P, const int64_t *gen, int tokens, int reps, sb_run *r,
			sb_reps *x, int k, double *iv, double *fw)
{
	const int n = r->n, S = tr->n_steps;
	int distinct = 0, pf = 0, full = 0, same = 1, c = 0;
	int matched = sb_trace_match(tr, P->ids, P->len, n, &distinct);
	for (int i = 0; i < tr->n_slots; i++) {
		const sb_slot *sl = &tr->slot[i];
		same &= sl->stream >= 0 && sl->n_gen == tokens &&
			!memcmp(sl->gen, gen + (size_t)sl->stream * (size_t)tokens,
				(size_t)tokens * sizeof(int64_t));
	}
	r->prompts_same &= matched == n && tr->n_slots == n;
	r->distinct = k == 0 || distinct < r->distinct ? distinct : r->distinct;
	r->tokens_same &= same;
	sb_trace_hist(tr, n, r->hist, &pf, &full);
	r->steps += (uint64_t)S;
	r->prefill_steps += pf;
	r->full_steps += full;
	double rsum = 0, fsum = 0;
	for (int s = 0; s < S; s++) {
		rsum += rs[s];
		fsum += tr->step[s].fwd_s;
		/* NOTE: a full step's time runs to the next step's start (the server's work
		 * between the calls included); the last step has no next and is left out */
		if (s + 1 < S && tr->step[s].n == n && tr->step[s].n_decode == n) {
			iv[c] = tr->step[s + 1].t0_s - tr->step[s].t0_s;
			fw[c++] = tr->step[s].fwd_s;
		}
	}
	if (k == reps - 1)
		r->last_steps = steps_json(tr, rs);
	x->served[k] = so->wall_s / S;
	x->replay[k] = rsum / S;
	x->tps[k] = (double)so->generated / so->wall_s;
	x->rtps[k] = (double)so->generated / rsum;
	if (c) {
		moet_bench_stats a, b;
		moet_bench_stats_of(iv, c, &a);
		moet_bench_stats_of(fw, c, &b);
		if (!x->n_full || a.min_s < r->full_min_s)
			r->full_min_s = a.min_s;
		x->full[x->n_full] = a.median_s;
		x->full_fwd[x->n_full++] = b.median_s;
	}
	r->share += (so->step_s > 0 ? (so->step_s - so->fwd_s) / so->step_s : 0) / reps;
	r->fwd += fsum / S / reps;
	r->fwd_over_replay += fsum / rsum / reps;
	r->outside_s += (so->wall_s - fsum) / S / reps;
	r->errors += so->errors;
}

/* Rep k of run r: bare, served (traced), replay. */
static int one_rep(moet_model *m, const moet_tokenizer *tok, const moet_serve_bench_opts *o,
		   const sb_prompts *P, sb_run *r, int k, sb_reps *x, FILE *log)
{
	const int n = r->n, T = o->tokens;
	moet_bench_stats st;
	served_out so = { 0 };
	sb_trace tr;
	sb_trace_init(&tr, T);
	int64_t *gen = malloc((size_t)n * (size_t)T * sizeof(int64_t));
	double *rs = NULL, *iv = NULL, *fw = NULL, s0 = split_now(m);
	int same = 0, rc = gen ? 0 : moet_err(MOET_ENOMEM, "bench serve: tokens");
	if (!rc)
		rc = bare(m, P, n, T, T - 1, NULL, &st, gen);
	double s1 = split_now(m);
	if (!rc)
		rc = served(m, tok, o, P, n, &tr, &so);
	const size_t S = (size_t)(tr.n_steps > 0 ? tr.n_steps : 1);
	if (!rc && (!(rs = calloc(S, sizeof(double))) || !(iv = calloc(S, sizeof(double))) ||
		    !(fw = calloc(S, sizeof(double)))))
		rc = moet_err(MOET_ENOMEM, "bench serve: replay of %zu steps", S);
	if (!rc && !tr.n_steps)
		rc = moet_err(MOET_EIO, "bench serve: the server ran no step");
	double s2 = split_now(m);
	if (!rc)
		rc = sb_replay(m, &tr, kv_budget(P, n, T), SB_KV_BLOCK, rs, &same);
	if (rc)
		goto out;
	r->split[0] += (uint64_t)(s1 - s0);
	r->split[1] += so.split;
	r->split[2] += (uint64_t)(split_now(m) - s2);
	x->bare[k] = st.median_s;
	r->bare_min_s = k == 0 || st.min_s < r->bare_min_s ? st.min_s : r->bare_min_s;
	r->tokens_same &= same;
	rep_figures(&tr, rs, &so, P, gen, T, o->reps, r, x, k, iv, fw);
	fprintf(log, "  %d streams, rep %d: bare step %.3f ms; %d served steps: %.3f ms each "
		"(the same steps bare %.3f ms), %.0f tok/s, %d errors\n", n, k + 1,
		st.median_s * 1e3, tr.n_steps, x->served[k] * 1e3, x->replay[k] * 1e3, x->tps[k],
		so.errors);
out:
	sb_trace_free(&tr);
	free(gen);
	free(rs);
	free(iv);
	free(fw);
	return rc;
}

/* The measured runs under the placement (if any). */
static int measure_all(moet_model *m, const moet_tokenizer *tok, const moet_serve_bench_opts *o,
		       const sb_prompts *P, sb_run *runs, int n_runs, FILE *log)
{
	const size_t R = (size_t)o->reps;
	double *buf = calloc(7 * R, sizeof(double));
	int rc = buf ? 0 : moet_err(MOET_ENOMEM, "bench serve: samples");
	for (int i = 0; i < n_runs && !rc; i++) {
		sb_run *r = &runs[i];
		sb_reps x = { .bare = buf, .replay = buf + R, .served = buf + 2 * R,
			      .full = buf + 3 * R, .full_fwd = buf + 4 * R, .tps = buf + 5 * R,
			      .rtps = buf + 6 * R };
		moet_bench_stats st;
		r->prompts_same = r->tokens_same = 1;
		if (!(r->hist = calloc((size_t)r->n + 1, sizeof(uint64_t)))) {
			rc = moet_err(MOET_ENOMEM, "bench serve: histogram");
			break;
		}
		/* NOTE: a short untimed warm-up first: the first passes at a batch size fault the
		 * mapped weights in and (with a CPU tier) try both micro-batch forms */
		rc = bare(m, P, r->n, o->tokens, o->tokens - 1 < 8 ? o->tokens - 1 : 8, NULL, &st,
			  NULL);
		for (int k = 0; k < o->reps && !rc; k++)
			rc = one_rep(m, tok, o, P, r, k, &x, log);
		if (rc)
			break;
		moet_bench_stats tps;
		moet_bench_stats_of(x.bare, o->reps, &r->bare);
		moet_bench_stats_of(x.replay, o->reps, &r->replay);
		moet_bench_stats_of(x.served, o->reps, &r->served);
		if ((r->full_reps = x.n_full)) {
			moet_bench_stats_of(x.full, x.n_full, &r->full);
			moet_bench_stats_of(x.full_fwd, x.n_full, &r->full_fwd);
		}
		moet_bench_stats_of(x.tps, o->reps, &tps);
		r->served_tps = tps.median_s;
		moet_bench_stats_of(x.rtps, o->reps, &tps);
		r->replay_tps = tps.median_s;
		r->bare_tps = r->n / r->bare.median_s;
		if (!r->prompts_same && !r->errors) /* failed streams: reported at the end */
			rc = moet_err(MOET_EIO, "bench serve: at %d streams the server did not run "
				      "each stream's prompt once", r->n);
		else if (!r->tokens_same)
			fprintf(log, "bench serve: WARNING: at %d streams the replay or the bare run "
				"drew tokens other than the server's (batch invariance?)\n", r->n);
	}
	free(buf);
	return rc;
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
	sb_prompts P = { 0 };
	sb_run *runs = NULL;
	sb_bw bw = { 0 };
	json_t *jruns = NULL;
	int rc = 0, max_n = 0;
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
		max_n = runs[i].n > max_n ? runs[i].n : max_n;
	}
	const moet_config *c = moet_model_config(m);
	fprintf(log, "bench serve: %s on %s, streams", dir, device);
	for (int i = 0; i < n_runs; i++)
		fprintf(log, "%s%d", i ? "," : " ", runs[i].n);
	fprintf(log, " x %d tokens, %d reps%s%s%s\n", o->tokens, o->reps,
		o->owner ? ", placement " : "", o->owner && o->placement ? o->placement : "",
		o->same_prompt ? ", one prompt for every stream" : "");
	if (!tok)
		fprintf(log, "bench serve: %s has no tokenizer.json: the clients send token ids (no "
			"tokenizer in the served path)\n", dir);
	if ((rc = prompts_make(tok, c->vocab_size, max_n, o->prompt_words, o->same_prompt, &P)))
		goto fail;
	if (P.max_len + o->tokens > c->max_position_embeddings) {
		rc = moet_err(MOET_EINVAL, "--tokens %d + a prompt of %lld tokens is more than the "
			      "model's %lld positions", o->tokens, (long long)P.max_len,
			      (long long)c->max_position_embeddings);
		goto fail;
	}
	if (o->owner &&
	    ((rc = moet_placement_sizes_from_ckpt(c, moet_model_ckpt(m), &sz)) ||
	     (rc = measure_bw(device, rec, log, &bw)) ||
	     (rc = predict_all(m, o, &bw, sz, &P, runs, n_runs, log)) ||
	     (rc = moet_model_set_placement(m, o->owner, o->n_devices))))
		goto fail;
	if ((rc = measure_all(m, tok, o, &P, runs, n_runs, log)) ||
	    (rc = sb_record(rec, jruns, runs, n_runs, base, o->owner, o->n_devices, &bw)))
		goto fail;
	int64_t min_len = P.len[0];
	for (int s = 1; s < P.n; s++)
		min_len = P.len[s] < min_len ? P.len[s] : min_len;
	json_t *sj = json_pack("{s:O, s:i, s:I, s:I, s:b, s:s, s:s, s:s?, s:{s:I, s:I, s:I, s:I}}",
			       "runs", jruns, "tokens_per_stream", o->tokens, "prompt_tokens_min",
			       (json_int_t)min_len, "prompt_tokens_max", (json_int_t)P.max_len,
			       "same_prompt", o->same_prompt, "model", dir, "device", device,
			       "placement", o->owner ? (o->placement ? o->placement : "owner table")
			       : NULL, "geometry", "layers", (json_int_t)c->num_hidden_layers,
			       "hidden", (json_int_t)c->hidden_size, "experts",
			       (json_int_t)c->n_routed_experts, "vocab", (json_int_t)c->vocab_size);
	if (!sj || json_object_set_new(rec, "serve", sj)) {
		rc = moet_err(MOET_ENOMEM, "bench serve: record");
		goto fail;
	}
	sb_table(table, runs, n_runs, base, o->owner, o->placement);
	int errors = 0;
	for (int i = 0; i < n_runs; i++)
		errors += runs[i].errors;
	if (errors)
		rc = moet_err(MOET_EIO, "bench serve: %d streams failed", errors);
fail:
	for (int i = 0; runs && i < n_runs; i++) {
		json_decref(runs[i].pred_steps);
		json_decref(runs[i].last_steps);
		free(runs[i].hist);
	}
	free(runs);
	json_decref(jruns);
	prompts_free(&P);
	moet_placement_sizes_free(sz);
	moet_tokenizer_destroy(tok);
	moet_model_close(m);
	return rc;
}
