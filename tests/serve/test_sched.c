/*
 * test_sched.c: the scheduler without HTTP (runtime/moet_sched.h) on a tiny synthetic model
 * with the demo tokenizer (runtime/moet_gen_tokenizer.h).
 *
 * References are independent of the scheduler: moet_model_generate(_sampled) run alone for
 * the tokens, moet_tokenizer_decode of those ids for the text, a long-double log-softmax of
 * moet_model_forward's logits for the logprobs.
 *   - greedy and seeded requests equal their solo generation, also 6 at once with prefill
 *     chunks of 3 tokens (continuous batching mixes decodes and chunks);
 *   - KV budget: never more reserved than the budget, the right number running at once,
 *     every cache back in the pool at the end, the pool within the budget; refusals;
 *   - stop strings across token boundaries: the released text is exactly the text before the
 *     first match, also when polled token by token; a tail that is a prefix of a stop
 *     string is held and released at the end;
 *   - cancellation while running and while queued frees the slot; max_requests;
 *   - logprobs and top_logprobs against the reference;
 *   - the demo tokenizer: loads, size, round trips, chat encoding.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_chat.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_gen_tokenizer.h"
#include "moet_model.h"
#include "moet_sched.h"
#include "moet_test.h"
#include "moet_tokenizer.h"

static moet_model *M;
static moet_tokenizer *TOK;

typedef struct result {
	int32_t ids[512];
	size_t n;
	char text[8192];
	size_t n_text;
	int finish;
	int max_piece_tokens;
} result;

/* Polls r to the end, collecting everything. */
static int drain(moet_sched_req *r, result *out)
{
	memset(out, 0, sizeof(*out));
	for (int guard = 0; guard < 100000; guard++) {
		moet_sched_update u;
		int rc = moet_sched_poll(r, 1000, &u);
		if (rc < 0)
			return rc;
		for (size_t i = 0; i < u.n_tokens && out->n < 512; i++)
			out->ids[out->n++] = u.tokens[i].id;
		if (out->n_text + u.n_text < sizeof(out->text)) {
			memcpy(out->text + out->n_text, u.text, u.n_text);
			out->n_text += u.n_text;
		}
		int fin = u.finish;
		moet_sched_update_free(&u);
		if (fin) {
			out->finish = fin;
			return 0;
		}
	}
	return -1;
}

static moet_sched_params greedy(const int64_t *prompt, int64_t n, int64_t max_tokens)
{
	return (moet_sched_params){ .prompt = prompt, .n_prompt = n, .max_tokens = max_tokens,
				    .sp = { .temperature = 0, .top_p = 1 }, .top_logprobs = -1,
				    .ignore_eos = 1 };
}

static void wait_idle(moet_sched *s, moet_sched_stats *st)
{
	for (int i = 0; i < 2000; i++) {
		moet_sched_get_stats(s, st);
		if (!st->running && !st->queued)
			return;
		usleep(5000);
	}
}

static void test_batching(void)
{
	enum { NR = 6 };
	int64_t prompts[NR][16], want[NR][64], n_want[NR];
	moet_sched_req *r[NR] = { 0 };
	moet_sched_params p[NR];
	for (int i = 0; i < NR; i++) {
		for (int k = 0; k < 16; k++)
			prompts[i][k] = 4 + (i * 37 + k * 11) % 1000;
		p[i] = greedy(prompts[i], 3 + 2 * i, 5 + i);
		if (i % 2) { /* seeded sampling on every other one */
			p[i].sp = (moet_sample_params){ .temperature = 0.9, .top_k = 50,
							.top_p = 0.95, .seed = 1000 + i };
		}
		/* NOTE: the references first: one forward pass at a time per model, and the
		 * scheduler's engine owns the model while it runs */
		CHECK(moet_model_generate_sampled(M, p[i].prompt, p[i].n_prompt, p[i].max_tokens, 0,
						  &p[i].sp, want[i], &n_want[i]) == 0, "reference");
	}
	moet_sched_opts o = { .max_requests = 8, .kv_tokens = 1024, .max_batch_tokens = 3 };
	moet_sched *s = NULL;
	CHECK(moet_sched_create(M, TOK, &o, &s) == 0, "create: %s", moet_errmsg());
	if (!s)
		return;
	for (int i = 0; i < NR; i++)
		CHECK(moet_sched_submit(s, &p[i], &r[i]) == 0, "submit %d: %s", i, moet_errmsg());
	for (int i = 0; i < NR; i++) {
		result got;
		CHECK(r[i] && drain(r[i], &got) == 0, "drain %d", i);
		CHECK(got.finish == MOET_SCHED_FINISH_LENGTH, "request %d finish %d", i, got.finish);
		CHECK(got.n == (size_t)n_want[i], "request %d: %zu tokens, want %lld", i, got.n,
		      (long long)n_want[i]);
		for (size_t k = 0; k < got.n && k < (size_t)n_want[i]; k++)
			CHECK(got.ids[k] == want[i][k], "request %d token %zu: %d, solo %lld", i, k,
			      got.ids[k], (long long)want[i][k]);
		/* the text is the decode of the ids (specials skipped) */
		int32_t ids32[64];
		for (int64_t k = 0; k < n_want[i]; k++)
			ids32[k] = (int32_t)want[i][k];
		char *txt = NULL;
		size_t nt = 0;
		CHECK(moet_tokenizer_decode(TOK, ids32, (size_t)n_want[i], 1, &txt, &nt) == 0,
		      "dec");
		CHECK(txt && nt == got.n_text && !memcmp(txt, got.text, nt),
		      "request %d: text differs from the decode of its ids", i);
		free(txt);
		moet_sched_release(r[i]);
	}
	moet_sched_stats st;
	wait_idle(s, &st);
	CHECK(st.kv_in_use == 0 && st.kv_reserved == 0, "caches still held: %d, %lld",
	      st.kv_in_use, (long long)st.kv_reserved);
	CHECK(st.requests_done == NR, "done %llu", (unsigned long long)st.requests_done);
	moet_sched_destroy(s);
}

static void test_kv_budget(void)
{
	/* each request needs 10 + 10 = 20 positions; a budget of 45 runs two at once */
	moet_sched_opts o = { .max_requests = 6, .kv_tokens = 45, .max_batch_tokens = 64 };
	moet_sched *s = NULL;
	CHECK(moet_sched_create(M, TOK, &o, &s) == 0, "create: %s", moet_errmsg());
	if (!s)
		return;
	int64_t prompt[10] = { 5, 6, 7, 8, 9, 10, 11, 12, 13, 14 };
	moet_sched_params p = greedy(prompt, 10, 10);
	moet_sched_req *r[5] = { 0 };
	for (int i = 0; i < 5; i++)
		CHECK(moet_sched_submit(s, &p, &r[i]) == 0, "submit: %s", moet_errmsg());
	int max_running = 0;
	moet_sched_stats st;
	for (int it = 0; it < 4000; it++) {
		moet_sched_get_stats(s, &st);
		CHECK(st.kv_reserved <= 45 && st.kv_blocks_reserved <= st.kv_blocks &&
		      st.kv_blocks_used <= st.kv_blocks_reserved &&
		      st.kv_blocks_used + st.kv_blocks_free == st.kv_blocks,
		      "blocks: reserved %lld used %lld free %lld of %lld",
		      (long long)st.kv_blocks_reserved, (long long)st.kv_blocks_used,
		      (long long)st.kv_blocks_free, (long long)st.kv_blocks);
		CHECK(st.kv_in_use == st.running, "caches %d vs running %d", st.kv_in_use,
		      st.running);
		max_running = st.running > max_running ? st.running : max_running;
		if (st.requests_done == 5)
			break;
		usleep(500);
	}
	CHECK(max_running == 2, "at most 2 fit; saw %d running", max_running);
	for (int i = 0; i < 5; i++) {
		result got;
		CHECK(drain(r[i], &got) == 0 && got.n == 10, "request %d", i);
		moet_sched_release(r[i]);
	}
	wait_idle(s, &st);
	CHECK(st.kv_in_use == 0 && st.kv_reserved == 0 && st.kv_blocks_used == 0 &&
	      st.kv_blocks_free == st.kv_blocks, "pool after: in use %d, blocks used %lld, free "
	      "%lld of %lld", st.kv_in_use, (long long)st.kv_blocks_used,
	      (long long)st.kv_blocks_free, (long long)st.kv_blocks);
	/* the default block halves to 4 positions for 6 requests in 45: 11 blocks, 44 positions;
	 * a request of 20 positions reserves 5 blocks, so two run at once */
	moet_sched_opts eff;
	moet_sched_get_opts(s, &eff);
	CHECK(eff.kv_block == 4 && eff.kv_tokens == 44 && st.kv_blocks == 11,
	      "block %lld, budget %lld, blocks %lld", (long long)eff.kv_block,
	      (long long)eff.kv_tokens, (long long)st.kv_blocks);
	/* never fits; bad ids; bad max_tokens; bad stop; bad logprobs */
	moet_sched_req *x = NULL;
	moet_sched_params q = greedy(prompt, 10, 40);
	CHECK(moet_sched_submit(s, &q, &x) == MOET_EINVAL, "more than the budget");
	CHECK(strstr(moet_errmsg(), "context"), "message: %s", moet_errmsg());
	int64_t bad[2] = { 3, 5000 };
	q = greedy(bad, 2, 4);
	CHECK(moet_sched_submit(s, &q, &x) == MOET_EINVAL && strstr(moet_errmsg(), "prompt[1]"),
	      "bad id: %s", moet_errmsg());
	q = greedy(prompt, 2, 0);
	CHECK(moet_sched_submit(s, &q, &x) == MOET_EINVAL && strstr(moet_errmsg(), "max_tokens"),
	      "max_tokens: %s", moet_errmsg());
	const char *stops[1] = { "\xff" };
	q = greedy(prompt, 2, 4);
	q.stop = stops;
	q.n_stop = 1;
	CHECK(moet_sched_submit(s, &q, &x) == MOET_EINVAL && strstr(moet_errmsg(), "stop[0]"),
	      "stop: %s", moet_errmsg());
	q = greedy(prompt, 2, 4);
	q.top_logprobs = 21;
	CHECK(moet_sched_submit(s, &q, &x) == MOET_EINVAL, "top_logprobs 21");
	q = greedy(prompt, 2, 4);
	q.sp.temperature = -1;
	CHECK(moet_sched_submit(s, &q, &x) == MOET_EINVAL, "temperature -1");
	moet_sched_destroy(s);
}

/* An ASCII stretch of text: start of a window [a, a + len) inside t, or -1. */
static long ascii_window(const char *t, size_t n, size_t from, size_t len)
{
	for (size_t a = from; a + len <= n; a++) {
		size_t k = 0;
		while (k < len && (unsigned char)t[a + k] >= 32 && (unsigned char)t[a + k] < 127)
			k++;
		if (k == len)
			return (long)a;
	}
	return -1;
}

static void test_stop_strings(void)
{
	moet_sched_opts o = { .max_requests = 4, .kv_tokens = 2048, .max_batch_tokens = 64 };
	moet_sched *s = NULL;
	CHECK(moet_sched_create(M, TOK, &o, &s) == 0, "create: %s", moet_errmsg());
	if (!s)
		return;
	/* a prompt whose greedy continuation has an ASCII stretch of 6 bytes, first seen there,
	 * with a token boundary strictly inside it (the stop string spans two tokens) */
	int64_t prompt[4] = { 300, 301, 302, 303 };
	result full = { 0 };
	moet_sched_req *r = NULL;
	long at = -1;
	for (int tries = 0; tries < 40 && at < 0; tries++) {
		prompt[0] = 300 + tries * 7;
		moet_sched_params p = greedy(prompt, 4, 120);
		CHECK(moet_sched_submit(s, &p, &r) == 0, "submit");
		CHECK(drain(r, &full) == 0, "drain");
		moet_sched_release(r);
		size_t bound[600], nb = 0, off = 0; /* byte offsets where a token's text starts */
		for (size_t k = 0; k < full.n && nb < 600; k++) {
			const char *b;
			size_t len = 0;
			if (moet_tokenizer_is_special(TOK, full.ids[k]) ||
			    moet_tokenizer_token_bytes(TOK, full.ids[k], &b, &len))
				continue;
			bound[nb++] = off;
			off += len;
		}
		for (long a = 0; a >= 0 && at < 0; a++) {
			a = ascii_window(full.text, full.n_text, (size_t)a, 6);
			if (a < 0)
				break;
			int inside = 0;
			for (size_t q = 0; q < nb; q++)
				inside |= bound[q] > (size_t)a && bound[q] < (size_t)a + 6;
			if (inside && memmem(full.text, full.n_text, full.text + a, 6) ==
					      full.text + a)
				at = a;
		}
	}
	CHECK(at >= 0, "no ASCII stretch spanning tokens in 40 continuations");
	if (at < 0) {
		moet_sched_destroy(s);
		return;
	}
	char stop[8];
	memcpy(stop, full.text + at, 6);
	stop[6] = 0;
	const char *stops[2] = { "\x01\x02never", stop };
	moet_sched_params p = greedy(prompt, 4, 120);
	p.stop = stops;
	p.n_stop = 2;
	size_t want_len = (size_t)at;
	CHECK(moet_sched_submit(s, &p, &r) == 0, "submit with stop");
	result got;
	CHECK(drain(r, &got) == 0, "drain");
	CHECK(got.finish == MOET_SCHED_FINISH_STOP, "finish %d", got.finish);
	CHECK(got.n_text == want_len && !memcmp(got.text, full.text, want_len),
	      "text with stop '%s': %zu bytes, want %zu", stop, got.n_text, want_len);
	moet_sched_release(r);
	/* a tail that is only a prefix of a stop string: held, then released at the end */
	result tail;
	moet_sched_params p2 = greedy(prompt, 4, 120);
	char pre[16];
	long t0 = ascii_window(full.text, full.n_text, full.n_text - 3, 3);
	if (t0 >= 0 && !memmem(full.text, full.n_text - 3, full.text + t0, 3)) {
		memcpy(pre, full.text + t0, 3);
		memcpy(pre + 3, "\x01z", 3);
		const char *st2[1] = { pre };
		p2.stop = st2;
		p2.n_stop = 1;
		CHECK(moet_sched_submit(s, &p2, &r) == 0, "submit tail");
		CHECK(drain(r, &tail) == 0, "drain");
		CHECK(tail.finish == MOET_SCHED_FINISH_LENGTH && tail.n_text == full.n_text &&
		      !memcmp(tail.text, full.text, full.n_text), "held tail not released");
		moet_sched_release(r);
	}
	moet_sched_destroy(s);
}

static void test_cancel_and_limits(void)
{
	moet_sched_opts o = { .max_requests = 2, .kv_tokens = 600, .max_batch_tokens = 16 };
	moet_sched *s = NULL;
	CHECK(moet_sched_create(M, TOK, &o, &s) == 0, "create: %s", moet_errmsg());
	if (!s)
		return;
	int64_t prompt[3] = { 40, 41, 42 };
	moet_sched_params p = greedy(prompt, 3, 500);
	moet_sched_req *a = NULL, *b = NULL, *c = NULL;
	CHECK(moet_sched_submit(s, &p, &a) == 0, "a");
	CHECK(moet_sched_submit(s, &p, &b) == 0, "b (queued: the budget holds one)");
	CHECK(moet_sched_submit(s, &p, &c) == MOET_ERANGE, "third over max_requests");
	moet_sched_update u;
	int got_token = 0;
	for (int i = 0; i < 200 && !got_token; i++) {
		CHECK(moet_sched_poll(a, 1000, &u) >= 0, "poll");
		got_token = u.n_tokens > 0;
		moet_sched_update_free(&u);
	}
	CHECK(got_token, "no token from a");
	moet_sched_stats st;
	moet_sched_get_stats(s, &st);
	CHECK(st.running == 1 && st.queued == 1, "running %d queued %d", st.running, st.queued);
	moet_sched_release(b); /* cancelled while queued */
	moet_sched_release(a); /* cancelled while running */
	wait_idle(s, &st);
	CHECK(st.requests_cancelled == 2 && st.kv_in_use == 0 && st.kv_reserved == 0,
	      "cancelled %llu, in use %d", (unsigned long long)st.requests_cancelled,
	      st.kv_in_use);
	CHECK(st.kv_blocks_used == 0 && st.kv_blocks_free == st.kv_blocks,
	      "every block back, none lost: %lld free of %lld", (long long)st.kv_blocks_free,
	      (long long)st.kv_blocks);
	/* the slot serves again, reusing the pooled cache */
	p.max_tokens = 4;
	CHECK(moet_sched_submit(s, &p, &c) == 0, "after cancel");
	result got;
	CHECK(c && drain(c, &got) == 0 && got.n == 4, "after cancel: %zu tokens", got.n);
	moet_sched_release(c);
	moet_sched_destroy(s);
}

/* Regression (pool overflow, found by ASan): caches that do not fit later requests stayed
 * pooled while new ones were made, and the pool array of max_requests overflowed. */
static void test_pool_overflow(void)
{
	moet_sched_opts o = { .max_requests = 2, .kv_tokens = 4000, .max_batch_tokens = 64 };
	moet_sched *s = NULL;
	CHECK(moet_sched_create(M, TOK, &o, &s) == 0, "create");
	if (!s)
		return;
	int64_t prompt[2] = { 20, 21 };
	int64_t sizes[4] = { 8, 100, 400, 30 };
	for (int round = 0; round < 4; round++) {
		moet_sched_req *r[2] = { 0 };
		/* a different reservation each round: prompt 2 + max_tokens */
		moet_sched_params p = greedy(prompt, 2, sizes[round]);
		for (int i = 0; i < 2; i++)
			CHECK(moet_sched_submit(s, &p, &r[i]) == 0, "submit");
		for (int i = 0; i < 2; i++) {
			result got;
			CHECK(r[i] && drain(r[i], &got) == 0, "drain");
			moet_sched_release(r[i]);
		}
		moet_sched_stats st;
		wait_idle(s, &st);
		CHECK(st.kv_in_use == 0 && st.kv_blocks_used == 0 &&
		      st.kv_blocks_free == st.kv_blocks && st.kv_tokens <= 4000,
		      "round %d: %lld blocks used, %lld free of %lld", round,
		      (long long)st.kv_blocks_used, (long long)st.kv_blocks_free,
		      (long long)st.kv_blocks);
	}
	moet_sched_destroy(s);
}

static void test_logprobs(void)
{
	moet_sched_opts o = { .max_requests = 2, .kv_tokens = 256 };
	moet_sched *s = NULL;
	CHECK(moet_sched_create(M, TOK, &o, &s) == 0, "create");
	if (!s)
		return;
	int64_t prompt[5] = { 9, 8, 7, 6, 5 };
	moet_sched_params p = greedy(prompt, 5, 1);
	p.top_logprobs = 5;
	moet_sched_req *r = NULL;
	CHECK(moet_sched_submit(s, &p, &r) == 0, "submit");
	moet_sched_update u = { 0 };
	moet_sched_token t = { 0 };
	int n = 0;
	for (int i = 0; i < 100; i++) {
		moet_sched_update_free(&u);
		CHECK(moet_sched_poll(r, 1000, &u) >= 0, "poll");
		if (u.n_tokens && !n) {
			t = u.tokens[0];
			n = 1;
		}
		if (u.finish)
			break;
	}
	moet_sched_update_free(&u);
	moet_sched_release(r);
	moet_sched_destroy(s);
	const moet_config *c = moet_model_config(M);
	int64_t V = c->vocab_size;
	float *lg = malloc((size_t)V * 5 * sizeof(float));
	moet_kv *kv = NULL;
	CHECK(lg && moet_kv_create(M, 8, &kv) == 0 && moet_model_forward(M, kv, prompt, 5, lg) == 0,
	      "reference forward");
	const float *row = lg + 4 * V;
	long double mx = -INFINITY, sum = 0;
	for (int64_t i = 0; i < V; i++)
		mx = row[i] > mx ? row[i] : mx;
	for (int64_t i = 0; i < V; i++)
		sum += expl((long double)row[i] - mx);
	long double lse = mx + logl(sum);
	CHECK(n && t.id == moet_argmax(row, V), "chosen %d", t.id);
	CHECK(fabs(t.logprob - (double)(row[t.id] - lse)) < 1e-12, "logprob %.17g vs %.17Lg",
	      t.logprob, row[t.id] - lse);
	CHECK(t.n_top == 5, "n_top %d", t.n_top);
	for (int k = 0; k < t.n_top; k++) {
		int above = 0; /* ids strictly better, or equal with a lower id */
		for (int64_t i = 0; i < V; i++)
			above += row[i] > row[t.top_id[k]] ||
				 (row[i] == row[t.top_id[k]] && i < t.top_id[k]);
		CHECK(above == k, "top %d is id %d with %d above it", k, t.top_id[k], above);
		CHECK(fabs(t.top_logprob[k] - (double)(row[t.top_id[k]] - lse)) < 1e-12, "top lp");
	}
	moet_kv_destroy(kv);
	free(lg);
}

static void test_demo_tokenizer(void)
{
	CHECK(moet_tokenizer_n_ids(TOK) == 1024, "n_ids %d", moet_tokenizer_n_ids(TOK));
	const char *texts[] = { "Hello, world!", "The robot painted 12 birds.\n",
				"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\x89", "  a\tb  ",
				"x" };
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		int32_t *ids = NULL;
		size_t n = 0;
		char *back = NULL;
		size_t nb = 0;
		CHECK(moet_tokenizer_encode(TOK, texts[i], strlen(texts[i]), &ids, &n) == 0, "enc");
		CHECK(moet_tokenizer_decode(TOK, ids, n, 0, &back, &nb) == 0 && nb == strlen(texts[i])
		      && !memcmp(back, texts[i], nb), "round trip of '%s'", texts[i]);
		if (i == 0)
			CHECK(n < strlen(texts[i]), "merges apply: %zu ids for %zu bytes", n,
			      strlen(texts[i]));
		free(ids);
		free(back);
	}
	moet_chat_msg msgs[2] = { { "system", "Be brief." }, { "user", "Hi" } };
	int32_t *ids = NULL;
	size_t n = 0;
	CHECK(moet_chat_encode(TOK, msgs, 2, 1, &ids, &n) == 0, "chat: %s", moet_errmsg());
	CHECK(n > 3 && ids[0] == 0 && ids[n - 1] == 3, "BOS first (0), Assistant last (3)");
	free(ids);
	char *a = NULL, *b = NULL, *a2 = NULL, *b2 = NULL;
	CHECK(moet_gen_tokenizer_text(1024, &a, &b) == 0 && moet_gen_tokenizer_text(1024, &a2, &b2)
	      == 0 && !strcmp(a, a2) && !strcmp(b, b2), "deterministic");
	CHECK(strstr(b, "chat_template") && strstr(b, MOET_CHAT_USER), "config has the template");
	free(a);
	free(b);
	free(a2);
	free(b2);
	CHECK(moet_gen_tokenizer_text(100, &a, &b) == MOET_ERANGE, "vocab 100 refused");
}

/* resident_check_s: with a placement whose CPU tier was populated at the bind, the engine
 * checks between steps; the stats show the checks with every sampled page resident. */
static void test_resident_check(void)
{
	const moet_config *c = moet_model_config(M);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts;
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	for (int64_t i = 0; own && i < L * E; i++)
		own[i] = (int16_t)(i % 2 ? -1 : 0);
	CHECK(own && moet_model_set_placement(M, own, 1) == 0, "placement: %s", moet_errmsg());
	moet_sched_opts o = { .max_requests = 2, .kv_tokens = 256, .resident_check_s = 1e-9 };
	moet_sched *s = NULL;
	CHECK(moet_sched_create(M, TOK, &o, &s) == 0, "create: %s", moet_errmsg());
	if (s) {
		int64_t prompt[4] = { 5, 9, 2, 7 };
		moet_sched_params p = greedy(prompt, 4, 6);
		moet_sched_req *r = NULL;
		result got;
		CHECK(moet_sched_submit(s, &p, &r) == 0 && r && drain(r, &got) == 0, "request");
		if (r)
			moet_sched_release(r);
		moet_sched_stats st;
		wait_idle(s, &st);
		const moet_resident_report *rr = &st.resident;
		CHECK(rr->populated_bytes > 0 && rr->checks >= 2 && rr->pages_checked > 0 &&
			      rr->pages_resident == rr->pages_checked && rr->evicted_ranges == 0,
		      "resident: %llu bytes, %llu checks, %llu of %llu pages, %llu evicted",
		      (unsigned long long)rr->populated_bytes, (unsigned long long)rr->checks,
		      (unsigned long long)rr->pages_resident, (unsigned long long)rr->pages_checked,
		      (unsigned long long)rr->evicted_ranges);
		moet_sched_destroy(s);
	}
	CHECK(moet_model_set_placement(M, NULL, 0) == 0, "no placement: %s", moet_errmsg());
	free(own);
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 3;
	gp.n_layers = 2;
	char *dir = NULL;
	M = moet_test_gen_open("sched-tiny", &gp, &dir);
	char *tj = NULL, *cj = NULL;
	CHECK(moet_gen_tokenizer_text(1024, &tj, &cj) == 0, "tokenizer: %s", moet_errmsg());
	CHECK(tj && moet_tokenizer_load_text(tj, strlen(tj), "demo tokenizer.json", &TOK) == 0,
	      "load: %s", moet_errmsg());
	free(tj);
	free(cj);
	if (M && TOK) {
		test_demo_tokenizer();
		test_batching();
		test_kv_budget();
		test_stop_strings();
		test_cancel_and_limits();
		test_pool_overflow();
		test_logprobs();
		test_resident_check();
	}
	moet_model_close(M);
	moet_tokenizer_destroy(TOK);
	if (dir) {
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		moet_test_run(cmd, NULL);
	}
	free(dir);
	return moet_test_done("test_sched");
}
