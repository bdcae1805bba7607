/*
 * sched_text.c: the text side of a request (sched_int.h): incremental detokenization, stop
 * strings that never show in a stream, and log-probabilities.
 *
 *   id --moet_detok (whole UTF-8 characters, specials skipped)--> pend (held back)
 *      pend: [ ....... released ...... | tail that is a proper prefix of a stop string ]
 *                                      ^ hold
 *   A stop string found anywhere in pend ends the request: the text before it is released,
 *   the stop string and the rest are dropped.
 *
 * NOTE: text already released can never contain the start of a stop string: whatever could
 * still grow into one stays in pend. So searching pend alone finds every match, including
 * one spread over many tokens.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "sched_int.h"

int sched_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
	if (*len + n + 1 > *cap) {
		size_t c = *cap ? *cap : 64;
		while (c < *len + n + 1)
			c *= 2;
		char *b = realloc(*buf, c);
		if (!b)
			return moet_err(MOET_ENOMEM, "request text of %zu bytes", *len + n);
		*buf = b;
		*cap = c;
	}
	memcpy(*buf + *len, s, n);
	*len += n;
	(*buf)[*len] = 0;
	return 0;
}

/* Moves pend[0, n) to the released text. */
static int release(moet_sched_req *r, size_t n)
{
	int rc = sched_buf_add(&r->text, &r->n_text, &r->cap_text, r->pend, n);
	if (rc)
		return rc;
	memmove(r->pend, r->pend + n, r->n_pend - n);
	r->n_pend -= n;
	return 0;
}

/* Earliest match of any stop string in pend, or -1. */
static long find_stop(const moet_sched_req *r)
{
	long best = -1;
	for (int i = 0; i < r->n_stop; i++) {
		const char *p = memmem(r->pend, r->n_pend, r->stop[i], r->stop_len[i]);
		if (p && (best < 0 || p - r->pend < best))
			best = p - r->pend;
	}
	return best;
}

/* Start of the longest tail of pend that is a proper prefix of a stop string (n_pend when
 * none). */
static size_t hold_from(const moet_sched_req *r)
{
	for (size_t p = 0; p < r->n_pend; p++) {
		size_t tail = r->n_pend - p;
		for (int i = 0; i < r->n_stop; i++)
			if (tail < r->stop_len[i] && !memcmp(r->pend + p, r->stop[i], tail))
				return p;
	}
	return r->n_pend;
}

/* Stop check, then release what cannot start a stop string (all of it when final). */
static int settle(moet_sched_req *r, int final)
{
	long at = find_stop(r);
	if (at >= 0) {
		r->n_pend = (size_t)at;
		r->stop_hit = 1;
		r->finish = MOET_SCHED_FINISH_STOP;
		return release(r, r->n_pend);
	}
	return release(r, final ? r->n_pend : hold_from(r));
}

int sched_text_push(moet_sched_req *r, const moet_tokenizer *tok, int32_t id)
{
	if (!tok)
		return 0;
	const char *s = NULL;
	size_t n = 0;
	if (id < moet_tokenizer_n_ids(tok)) {
		int rc = moet_detok_push(&r->dt, id, &s, &n);
		if (rc == MOET_ENOMEM)
			return rc;
		/* NOTE: an id the tokenizer lacks (a model vocabulary larger than the tokenizer's)
		 * has no text; that is not an error of the request. */
		if (rc)
			n = 0;
	}
	int rc = sched_buf_add(&r->pend, &r->n_pend, &r->cap_pend, s ? s : "", n);
	return rc ? rc : settle(r, 0);
}

int sched_text_finish(moet_sched_req *r, const moet_tokenizer *tok)
{
	if (!tok)
		return 0;
	const char *s = NULL;
	size_t n = 0;
	int rc = 0;
	if (!r->stop_hit) {
		moet_detok_flush(&r->dt, &s, &n);
		rc = sched_buf_add(&r->pend, &r->n_pend, &r->cap_pend, s ? s : "", n);
		if (!rc)
			rc = settle(r, 1);
	}
	r->n_pend = 0;
	return rc;
}

void sched_logprobs(const float *logits, int64_t n, int32_t chosen, int n_top,
		    moet_sched_token *t)
{
	double mx = -INFINITY;
	for (int64_t i = 0; i < n; i++)
		if ((double)logits[i] > mx)
			mx = (double)logits[i];
	double sum = 0;
	for (int64_t i = 0; i < n; i++)
		if (logits[i] == logits[i])
			sum += exp((double)logits[i] - mx);
	double lse = sum > 0 ? mx + log(sum) : mx; /* no finite logit: no log(0) */
	t->logprob = (double)logits[chosen] - lse;
	t->n_top = 0;
	/* top n_top by value, ties to the lower id; NaN never enters */
	for (int64_t i = 0; i < n && n_top > 0; i++) {
		double v = (double)logits[i];
		if (v != v)
			continue;
		int k = t->n_top;
		if (k == n_top && v <= t->top_logprob[k - 1])
			continue;
		if (k < n_top)
			t->n_top++;
		else
			k--;
		while (k > 0 && t->top_logprob[k - 1] < v) {
			t->top_id[k] = t->top_id[k - 1];
			t->top_logprob[k] = t->top_logprob[k - 1];
			k--;
		}
		t->top_id[k] = (int32_t)i;
		t->top_logprob[k] = v;
	}
	for (int k = 0; k < t->n_top; k++)
		t->top_logprob[k] -= lse;
}
