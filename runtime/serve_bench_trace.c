/*
 * serve_bench_trace.c: what the server's engine ran, step by step, during a `bench serve`
 * served run, and the same steps run again bare (serve_bench_int.h; docs/serve.md).
 *
 * Why: a served run is not N sequences decoding in lockstep. Clients arrive over a few
 * milliseconds, so the first steps hold one or two prefills, later steps decodes beside the
 * late-comers' prefill chunks, and the last steps only the streams that started last. Timing
 * "wall / engine steps" against a bare step of N decodes compares steps of different
 * composition (issue 7: the served step came out 26% *shorter* than the bare one on the
 * H200). The trace records every forward call of the served run (which request, how many
 * tokens, decode or prefill chunk, whether it drew a token, when it began, how long the call
 * took) and the replay runs exactly those calls on the model with no server around it, so
 *   served wall / replay forward time - 1
 * is the server's own cost on the same work.
 *
 *   the observer (engine thread, after each forward call, no lock):
 *     entry e of the call:  kv  --live slots-->  slot k   (a prefill chunk at position 0
 *                                                          opens a new slot)
 *                           prefill: its tokens appended to slot k's prompt
 *                           *out_token: appended to slot k's drawn tokens
 *   the replay (bench thread, server stopped):
 *     step s: the same entries on caches of its own (one pool of the server's geometry),
 *             decodes fed the replay's own drawn tokens, each call timed; the drawn tokens
 *             compared with the server's (greedy and batch-invariant: they must agree)
 *
 * NOTE: the observer's cost (a few stores per entry, a copy of prefill chunks) falls in the
 * served engine's step, outside its forward time; it is tiny against a forward pass.
 */
#include <stdlib.h>
#include <string.h>

#include "moet_bench.h"
#include "moet_err.h"
#include "serve_bench_int.h"

void sb_trace_init(sb_trace *t, int tokens)
{
	memset(t, 0, sizeof(*t));
	t->tokens = tokens;
}

void sb_trace_free(sb_trace *t)
{
	for (int i = 0; i < t->n_slots; i++) {
		free(t->slot[i].prompt);
		free(t->slot[i].gen);
	}
	free(t->slot);
	free(t->live);
	free(t->step);
	free(t->ent);
	memset(t, 0, sizeof(*t));
}

/* Room for one more item of `size` bytes in the array *pp points to (n held, capacity *cap).
 * 0, or 1 (no memory; the array unchanged). NOTE: pp is a T **; the pointer is moved with
 * memcpy so that no T ** is read as a void **. */
static int grow(void *pp, int n, int *cap, size_t size)
{
	if (n < *cap)
		return 0;
	int c = *cap ? 2 * *cap : 64;
	void *arr;
	memcpy(&arr, pp, sizeof(arr));
	void *p = realloc(arr, (size_t)c * size);
	if (!p)
		return 1;
	memcpy(pp, &p, sizeof(p));
	*cap = c;
	return 0;
}

#define GROW(ptr, n, cap) grow(&(ptr), n, &(cap), sizeof(*(ptr)))

static void trace_fail(sb_trace *t, int code, const char *why)
{
	if (!t->err) {
		t->err = code;
		snprintf(t->why, sizeof(t->why), "%s", why);
	}
}

/* The slot of entry st (a prefill chunk at position 0 opens one); -1: a request the trace
 * never saw start, -2: no memory. */
static int slot_of(sb_trace *t, const moet_seq_step *st, int decode)
{
	const int64_t pos = moet_kv_len(st->kv) - st->n_tok; /* the call advanced the cache */
	if (!decode && pos == 0) {
		int live_cap = t->cap_slots;
		if (GROW(t->slot, t->n_slots, t->cap_slots))
			return -2;
		if (t->cap_slots != live_cap || !t->live) {
			int *l = realloc(t->live, (size_t)t->cap_slots * sizeof(int));
			if (!l)
				return -2;
			t->live = l;
		}
		int64_t *gen = malloc((size_t)t->tokens * sizeof(int64_t));
		if (!gen)
			return -2;
		t->slot[t->n_slots] = (sb_slot){ .kv = st->kv, .gen = gen, .stream = -1 };
		t->live[t->n_live++] = t->n_slots;
		return t->n_slots++;
	}
	for (int i = t->n_live - 1; i >= 0; i--) /* NOTE: a freed cache's address may come back:
						    only slots still generating are looked up */
		if (t->slot[t->live[i]].kv == st->kv)
			return t->live[i];
	return -1;
}

void sb_trace_step(void *ctx, const moet_sched_step_info *si)
{
	sb_trace *t = ctx;
	if (t->err)
		return;
	if (si->rc) {
		trace_fail(t, MOET_EIO, "a forward call of the server failed");
		return;
	}
	if (GROW(t->step, t->n_steps, t->cap_steps)) {
		trace_fail(t, MOET_ENOMEM, "out of memory for the step trace");
		return;
	}
	t->step[t->n_steps] = (sb_step){ .t0_s = si->t_start_s, .fwd_s = si->forward_s,
					 .first = t->n_ent, .n = si->n, .n_decode = si->n_decode,
					 .n_tok = si->n_tokens };
	for (int e = 0; e < si->n; e++) {
		const moet_seq_step *st = &si->entries[e];
		const int decode = e < si->n_decode;
		const int k = slot_of(t, st, decode);
		if (k == -1 || k == -2 || GROW(t->ent, t->n_ent, t->cap_ent)) {
			trace_fail(t, k == -1 ? MOET_EIO : MOET_ENOMEM, k == -1 ?
				   "an entry of a request the trace never saw start" :
				   "out of memory for the step trace");
			return;
		}
		sb_slot *sl = &t->slot[k];
		if (!decode) {
			int64_t need = sl->n_prompt + st->n_tok;
			if (need > sl->cap_prompt) {
				int64_t c = need > 2 * sl->cap_prompt ? need : 2 * sl->cap_prompt;
				int64_t *p = realloc(sl->prompt, (size_t)c * sizeof(int64_t));
				if (!p) {
					trace_fail(t, MOET_ENOMEM, "out of memory for the step trace");
					return;
				}
				sl->prompt = p;
				sl->cap_prompt = c;
			}
			memcpy(sl->prompt + sl->n_prompt, st->tokens, (size_t)st->n_tok *
			       sizeof(int64_t));
			sl->n_prompt = need;
		}
		const int wants = st->out_token != NULL;
		if (wants && sl->n_gen < t->tokens)
			sl->gen[sl->n_gen++] = *st->out_token;
		if (wants && sl->n_gen == t->tokens) /* the request ends: off the live list */
			for (int i = 0; i < t->n_live; i++)
				if (t->live[i] == k) {
					t->live[i] = t->live[--t->n_live];
					break;
				}
		t->ent[t->n_ent++] = (sb_entry){ .slot = k, .n_tok = (int32_t)st->n_tok,
						 .decode = (uint8_t)decode, .wants = (uint8_t)wants };
	}
	t->n_steps++;
}

void sb_trace_hist(const sb_trace *t, int n_max, uint64_t *out_hist, int *out_prefill,
		   int *out_full)
{
	*out_prefill = 0;
	*out_full = 0;
	for (int s = 0; s < t->n_steps; s++) {
		const sb_step *st = &t->step[s];
		out_hist[st->n < n_max ? st->n : n_max]++;
		*out_prefill += st->n_decode < st->n;
		*out_full += st->n == n_max && st->n_decode == n_max;
	}
}

int sb_trace_match(sb_trace *t, int64_t *const *ids, const int64_t *len, int n_streams,
		   int *out_distinct)
{
	unsigned char *used = calloc((size_t)n_streams + 1, 1);
	if (!used)
		return moet_err(MOET_ENOMEM, "bench serve: prompt match");
	int matched = 0, distinct = 0;
	for (int k = 0; k < t->n_slots; k++) {
		sb_slot *sl = &t->slot[k];
		sl->stream = -1;
		for (int s = 0; s < n_streams && sl->stream < 0; s++)
			if (!used[s] && len[s] == sl->n_prompt &&
			    !memcmp(ids[s], sl->prompt, (size_t)len[s] * sizeof(int64_t))) {
				used[s] = 1;
				sl->stream = s;
				matched++;
			}
		int seen = 0;
		for (int j = 0; j < k && !seen; j++)
			seen = t->slot[j].n_prompt == sl->n_prompt &&
			       !memcmp(t->slot[j].prompt, sl->prompt,
				       (size_t)sl->n_prompt * sizeof(int64_t));
		distinct += !seen;
	}
	free(used);
	*out_distinct = distinct;
	return matched;
}

int sb_replay(moet_model *m, const sb_trace *t, int64_t kv_tokens, int64_t kv_block,
	      double *out_step_s, int *out_same)
{
	static const moet_sample_params greedy = { .temperature = 0, .top_k = 0, .top_p = 1 };
	moet_kv_pool *pool = NULL;
	moet_kv **kv = calloc((size_t)t->n_slots + 1, sizeof(*kv));
	int64_t *fed = calloc((size_t)t->n_slots + 1, sizeof(int64_t));   /* prompt tokens run */
	int64_t *ngen = calloc((size_t)t->n_slots + 1, sizeof(int64_t));  /* tokens drawn */
	int64_t *last = calloc((size_t)t->n_slots + 1, sizeof(int64_t));  /* the next input */
	int64_t *drawn = calloc((size_t)t->n_slots + 1, sizeof(int64_t));
	int max_n = 1;
	for (int s = 0; s < t->n_steps; s++)
		max_n = t->step[s].n > max_n ? t->step[s].n : max_n;
	moet_seq_step *st = calloc((size_t)max_n, sizeof(*st));
	int rc = 0;
	*out_same = 1;
	if (!kv || !fed || !ngen || !last || !drawn || !st) {
		rc = moet_err(MOET_ENOMEM, "bench serve: replay of %d steps", t->n_steps);
		goto out;
	}
	if ((rc = moet_kv_pool_create(m, kv_tokens, kv_block, &pool)))
		goto out;
	for (int s = 0; s < t->n_steps && !rc; s++) {
		const sb_step *sp = &t->step[s];
		for (int i = 0; i < sp->n && !rc; i++) {
			const sb_entry *e = &t->ent[sp->first + i];
			const sb_slot *sl = &t->slot[e->slot];
			if (!kv[e->slot])
				rc = moet_kv_create_in(pool, sl->n_prompt + t->tokens, &kv[e->slot]);
			st[i] = (moet_seq_step){ .kv = kv[e->slot], .n_tok = e->n_tok,
						 .last_only = 1 };
			st[i].tokens = e->decode ? &last[e->slot] : sl->prompt + fed[e->slot];
			if (e->wants) {
				st[i].sample = &greedy;
				st[i].out_token = &drawn[e->slot];
			}
		}
		double t0 = moet_bench_now_s();
		if (!rc)
			rc = moet_model_forward_batch(m, st, sp->n);
		out_step_s[s] = moet_bench_now_s() - t0;
		for (int i = 0; i < sp->n && !rc; i++) {
			const sb_entry *e = &t->ent[sp->first + i];
			const sb_slot *sl = &t->slot[e->slot];
			if (!e->decode)
				fed[e->slot] += e->n_tok;
			if (!e->wants)
				continue;
			const int64_t g = ngen[e->slot]++;
			*out_same &= g < sl->n_gen && sl->gen[g] == drawn[e->slot];
			last[e->slot] = drawn[e->slot];
			if (ngen[e->slot] == t->tokens) { /* as the server: its blocks back */
				moet_kv_destroy(kv[e->slot]);
				kv[e->slot] = NULL;
			}
		}
	}
out:
	for (int i = 0; kv && i < t->n_slots; i++)
		moet_kv_destroy(kv[i]);
	moet_kv_pool_destroy(pool);
	free(kv);
	free(fed);
	free(ngen);
	free(last);
	free(drawn);
	free(st);
	return rc;
}
