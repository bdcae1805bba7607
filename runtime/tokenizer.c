/*
 * tokenizer.c: encode and decode (moet_tokenizer.h).
 *
 * Encode, as HF `tokenizers` does it for a byte-level BPE with an identity normalizer:
 *
 *   1. added tokens with normalized=false are found leftmost-longest in the whole text;
 *   2. in the gaps between them, added tokens with normalized=true, the same way;
 *   3. each remaining gap goes through the Splits in order: every match of split k (and
 *      every gap between matches) is a piece that split k+1 cuts further;
 *   4. every final piece is one word for BPE (tokenizer_bpe.c).
 *
 * Pieces are (pointer, length) views of the caller's text: nothing is copied until BPE.
 *
 * NOTE: each regex runs on one piece as its whole subject, as HF does, so that a lookahead
 * such as (?!\S) sees the end of the piece, not the text after it.
 */
#include "tokenizer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"

/* Length of the valid UTF-8 sequence at s[0..n): > 0 complete and valid; 0 a valid but
 * incomplete prefix that reaches the end; -1 invalid. */
static int utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	int len;
	unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		lo = c == 0xE0 ? 0xA0 : 0x80;
		hi = c == 0xED ? 0x9F : 0xBF;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		lo = c == 0xF0 ? 0x90 : 0x80;
		hi = c == 0xF4 ? 0x8F : 0xBF;
	} else {
		return -1;
	}
	for (int i = 1; i < len; i++) {
		if ((size_t)i >= n)
			return 0;
		unsigned char lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
		if (s[i] < lo_i || s[i] > hi_i)
			return -1;
	}
	return len;
}

size_t moet_utf8_valid_prefix(const char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		int k = utf8_seq((const unsigned char *)s + i, n - i);
		if (k <= 0)
			break;
		i += (size_t)k;
	}
	return i;
}

/* ---- load / destroy / lookups ------------------------------------------------------------ */

static int tok_alloc(const char *name, moet_tokenizer **out)
{
	moet_tokenizer *t = calloc(1, sizeof(*t));
	if (!t)
		return moet_err(MOET_ENOMEM, "%s: out of memory", name);
	t->name = strdup(name);
	t->cache = calloc(TOK_CACHE_SLOTS, sizeof(*t->cache));
	pthread_mutex_init(&t->cache_lock, NULL);
	*out = t;
	if (!t->name || !t->cache)
		return moet_err(MOET_ENOMEM, "%s: out of memory", name);
	return 0;
}

int moet_tokenizer_load_text(const char *json_text, size_t n, const char *name,
			     moet_tokenizer **out_tok)
{
	moet_tokenizer *t = NULL;
	int rc;
	*out_tok = NULL;
	if ((rc = tok_alloc(name, &t)) || (rc = tok_load_json(t, json_text, n)))
		goto fail;
	*out_tok = t;
	return 0;
fail:
	moet_tokenizer_destroy(t);
	return rc;
}

int moet_tokenizer_load(const char *path, moet_tokenizer **out_tok)
{
	FILE *f = fopen(path, "rb");
	char *text = NULL;
	long n = -1;
	int rc;
	*out_tok = NULL;
	if (!f)
		return moet_err(MOET_EIO, "%s: cannot open", path);
	if (fseek(f, 0, SEEK_END) == 0)
		n = ftell(f);
	if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
		rc = moet_err(MOET_EIO, "%s: cannot read", path);
		goto fail;
	}
	text = malloc((size_t)n + 1);
	if (!text) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory for %ld bytes", path, n);
		goto fail;
	}
	if (fread(text, 1, (size_t)n, f) != (size_t)n) {
		rc = moet_err(MOET_EIO, "%s: short read", path);
		goto fail;
	}
	rc = moet_tokenizer_load_text(text, (size_t)n, path, out_tok);
fail:
	free(text);
	fclose(f);
	return rc;
}

void moet_tokenizer_destroy(moet_tokenizer *tok)
{
	if (!tok)
		return;
	for (int32_t i = 0; tok->tokens && i < tok->n_ids; i++)
		free(tok->tokens[i]);
	for (int32_t i = 0; tok->bytes && i < tok->n_ids; i++)
		free(tok->bytes[i]);
	free(tok->tokens);
	free(tok->token_len);
	free(tok->bytes);
	free(tok->bytes_len);
	free(tok->special);
	free(tok->added);
	tok_strmap_free(&tok->vocab);
	tok_pairmap_free(&tok->merges);
	for (size_t i = 0; i < tok->n_splits; i++)
		pcre2_code_free(tok->splits[i].re);
	free(tok->splits);
	free(tok->add_raw.tok);
	free(tok->add_norm.tok);
	pthread_mutex_destroy(&tok->cache_lock);
	free(tok->cache);
	free(tok->name);
	free(tok);
}

int32_t moet_tokenizer_n_ids(const moet_tokenizer *tok) { return tok->n_ids; }

int moet_tokenizer_find(const moet_tokenizer *tok, const char *token, int32_t *out_id)
{
	int32_t id = tok_strmap_get(&tok->vocab, token, strlen(token));
	if (id < 0)
		return moet_err(MOET_ENOTFOUND, "%s: no token '%s'", tok->name, token);
	*out_id = id;
	return 0;
}

int moet_tokenizer_is_special(const moet_tokenizer *tok, int32_t id)
{
	return id >= 0 && id < tok->n_ids && tok->special[id];
}

int moet_tokenizer_token_bytes(const moet_tokenizer *tok, int32_t id, const char **out_bytes,
			       size_t *out_n)
{
	if (id < 0 || id >= tok->n_ids || !tok->bytes[id])
		return moet_err(MOET_ERANGE, "%s: id %d is no token (ids 0..%d)", tok->name, id,
				tok->n_ids - 1);
	*out_bytes = tok->bytes[id];
	*out_n = tok->bytes_len[id];
	return 0;
}

/* ---- encode ------------------------------------------------------------------------------ */

typedef struct enc_state {
	const moet_tokenizer *tok;
	pcre2_match_data *md;
	int32_t *ids;
	size_t n, cap;
} enc_state;

/* Cuts s[0..n) with split `level` and recurses; past the last split, BPE. */
static int pretok(enc_state *st, size_t level, const char *s, size_t n)
{
	if (n == 0)
		return 0;
	if (level == st->tok->n_splits)
		return tok_bpe_word(st->tok, s, n, &st->ids, &st->n, &st->cap);
	const tok_split *sp = &st->tok->splits[level];
	size_t pos = 0, gap = 0; /* next search offset; start of the pending gap */
	int rc;
	while (pos < n) {
		int m = pcre2_match(sp->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, st->md,
				    NULL);
		if (m == PCRE2_ERROR_NOMATCH)
			break;
		if (m < 0) {
			PCRE2_UCHAR msg[160];
			pcre2_get_error_message(m, msg, sizeof(msg));
			return moet_err(MOET_EINVAL, "%s: pre-tokenizer split %zu: PCRE2 match: %s",
					st->tok->name, level, (char *)msg);
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
		size_t ms = ov[0], me = ov[1];
		if (me == ms) { /* NOTE: an empty match cuts nothing; step one character */
			pos = ms + 1;
			while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80)
				pos++;
			continue;
		}
		/* the gap [gap, ms) and the match [ms, me); invert swaps their roles */
		int keep_gap = !(sp->removed && sp->invert);
		int keep_match = !(sp->removed && !sp->invert);
		if (keep_gap && (rc = pretok(st, level + 1, s + gap, ms - gap)))
			return rc;
		if (keep_match && (rc = pretok(st, level + 1, s + ms, me - ms)))
			return rc;
		gap = pos = me;
	}
	if (!(sp->removed && sp->invert))
		return pretok(st, level + 1, s + gap, n - gap);
	return 0;
}

/* Added tokens of set `which` (0 raw, 1 normalized) leftmost-longest in s[0..n); the gaps go
 * to the next stage. */
static int added_pass(enc_state *st, int which, const char *s, size_t n)
{
	const tok_addset *set = which == 0 ? &st->tok->add_raw : &st->tok->add_norm;
	size_t gap = 0;
	int rc;
	for (size_t i = 0; i < n && set->n; i++) {
		unsigned char c = (unsigned char)s[i];
		for (size_t j = set->first[c]; j < set->first[c + 1]; j++) {
			const tok_added *a = &set->tok[j];
			if (a->len > n - i || memcmp(s + i, a->text, a->len) != 0)
				continue;
			rc = which == 0 ? added_pass(st, 1, s + gap, i - gap)
					: pretok(st, 0, s + gap, i - gap);
			if (rc || (rc = tok_push_id(&st->ids, &st->n, &st->cap, a->id)))
				return rc;
			gap = i + a->len;
			i = gap - 1;
			break;
		}
	}
	return which == 0 ? added_pass(st, 1, s + gap, n - gap) : pretok(st, 0, s + gap, n - gap);
}

int moet_tokenizer_encode(const moet_tokenizer *tok, const char *text, size_t n,
			  int32_t **out_ids, size_t *out_n)
{
	enc_state st = {.tok = tok};
	int rc;
	*out_ids = NULL;
	*out_n = 0;
	size_t ok = moet_utf8_valid_prefix(text, n);
	if (ok != n)
		return moet_err(MOET_EINVAL, "%s: text is not valid UTF-8 at byte %zu", tok->name,
				ok);
	st.md = pcre2_match_data_create(1, NULL);
	if (!st.md)
		return moet_err(MOET_ENOMEM, "%s: out of memory", tok->name);
	rc = added_pass(&st, 0, text, n);
	pcre2_match_data_free(st.md);
	if (rc) {
		free(st.ids);
		return rc;
	}
	*out_ids = st.ids;
	*out_n = st.n;
	return 0;
}

/* ---- decode ------------------------------------------------------------------------------ */

int moet_tokenizer_decode(const moet_tokenizer *tok, const int32_t *ids, size_t n_ids,
			  int skip_special, char **out_text, size_t *out_n)
{
	size_t total = 0;
	*out_text = NULL;
	*out_n = 0;
	for (size_t i = 0; i < n_ids; i++) {
		const char *b;
		size_t nb;
		int rc = moet_tokenizer_token_bytes(tok, ids[i], &b, &nb);
		if (rc)
			return moet_err_prefix(rc, "ids[%zu]", i);
		total += skip_special && tok->special[ids[i]] ? 0 : nb;
	}
	char *out = malloc(total + 1);
	if (!out)
		return moet_err(MOET_ENOMEM, "%s: out of memory for %zu bytes", tok->name, total);
	size_t k = 0;
	for (size_t i = 0; i < n_ids; i++) {
		if (skip_special && tok->special[ids[i]])
			continue;
		memcpy(out + k, tok->bytes[ids[i]], tok->bytes_len[ids[i]]);
		k += tok->bytes_len[ids[i]];
	}
	out[k] = 0;
	*out_text = out;
	*out_n = k;
	return 0;
}

void moet_detok_init(moet_detok *d, const moet_tokenizer *tok, int skip_special)
{
	memset(d, 0, sizeof(*d));
	d->tok = tok;
	d->skip_special = skip_special;
}

void moet_detok_free(moet_detok *d)
{
	free(d->buf);
	memset(d, 0, sizeof(*d));
}

int moet_detok_push(moet_detok *d, int32_t id, const char **out_text, size_t *out_n)
{
	const char *b;
	size_t nb;
	int rc = moet_tokenizer_token_bytes(d->tok, id, &b, &nb);
	*out_text = "";
	*out_n = 0;
	if (rc)
		return rc;
	if (d->skip_special && d->tok->special[id])
		nb = 0;
	size_t n = d->n_held + nb;
	if (n + 1 > d->cap) {
		size_t c = n + 64;
		char *p = realloc(d->buf, c);
		if (!p)
			return moet_err(MOET_ENOMEM, "detok: out of memory");
		d->buf = p;
		d->cap = c;
	}
	memcpy(d->buf, d->held, d->n_held);
	memcpy(d->buf + d->n_held, b, nb);
	/* emit complete sequences and invalid bytes; hold a valid incomplete tail */
	size_t i = 0;
	while (i < n) {
		int k = utf8_seq((const unsigned char *)d->buf + i, n - i);
		if (k == 0)
			break;
		i += k < 0 ? 1 : (size_t)k;
	}
	d->n_held = n - i;
	memcpy(d->held, d->buf + i, d->n_held);
	d->buf[i] = 0;
	*out_text = d->buf;
	*out_n = i;
	return 0;
}

int moet_detok_flush(moet_detok *d, const char **out_text, size_t *out_n)
{
	if (d->cap < 5) {
		char *p = realloc(d->buf, 64);
		if (!p)
			return moet_err(MOET_ENOMEM, "detok: out of memory");
		d->buf = p;
		d->cap = 64;
	}
	memcpy(d->buf, d->held, d->n_held);
	d->buf[d->n_held] = 0;
	*out_text = d->buf;
	*out_n = d->n_held;
	d->n_held = 0;
	return 0;
}
