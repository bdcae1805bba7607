/*
 * tokenizer_bpe.c: the tokenizer's tables (string -> id, pair -> merge), the GPT-2 byte-level
 * map, and BPE of one word.
 *
 * BPE of a word: the word's bytes become their byte-level characters' ids, one symbol each,
 * in a doubly linked list; every adjacent pair with a merge goes into a binary heap ordered by
 * (rank, position); the top is merged if it is still current, and the new symbol's pairs with
 * its neighbours are pushed. This is the lowest-rank-leftmost-pair rule in O(n log n).
 *
 *   symbols:  [t] <-> [h] <-> [e]      heap: (rank(t,h), 0) (rank(h,e), 1)
 *   pop (t,h) -> [th] <-> [e]          push (rank(th,e), 0)
 *
 * NOTE: an entry is stale when a symbol it names has been merged away or changed; it is
 * skipped when its left symbol is gone, it has no right neighbour, or the current pair's
 * merged id is not the entry's: the same test as HF `tokenizers` (word.rs), so that the rare
 * case of two pairs merging to one id resolves the same way.
 *
 * Words up to TOK_CACHE_MAX_BYTES bytes are cached (a direct-mapped table under a mutex):
 * text repeats its short words, and their BPE is most of the encode time.
 */
#include "tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

#include "moet_err.h"

void tok_bytelevel_init(uint32_t byte_cp[256], int16_t cp_byte[512])
{
	int n = 0;
	for (int i = 0; i < 512; i++)
		cp_byte[i] = -1;
	for (int b = 0; b < 256; b++) {
		int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
				(b >= 0xAE && b <= 0xFF);
		byte_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
		cp_byte[byte_cp[b]] = (int16_t)b;
	}
}

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

static size_t slots_for(size_t n_keys)
{
	size_t s = 16;
	while (s < 2 * n_keys + 16)
		s <<= 1;
	return s;
}

int tok_strmap_init(tok_strmap *m, size_t n_keys)
{
	size_t s = slots_for(n_keys);
	m->key = calloc(s, sizeof(*m->key));
	m->klen = calloc(s, sizeof(*m->klen));
	m->val = calloc(s, sizeof(*m->val));
	m->mask = s - 1;
	m->used = 0;
	if (!m->key || !m->klen || !m->val) {
		tok_strmap_free(m);
		return moet_err(MOET_ENOMEM, "tokenizer: out of memory for the vocabulary map");
	}
	return 0;
}

void tok_strmap_free(tok_strmap *m)
{
	free(m->key);
	free(m->klen);
	free(m->val);
	memset(m, 0, sizeof(*m));
}

int tok_strmap_put(tok_strmap *m, const char *key, uint32_t klen, int32_t val)
{
	size_t i = fnv1a(key, klen) & m->mask;
	while (m->key[i]) {
		if (m->klen[i] == klen && memcmp(m->key[i], key, klen) == 0)
			return 1;
		i = (i + 1) & m->mask;
	}
	m->key[i] = key;
	m->klen[i] = klen;
	m->val[i] = val;
	m->used++;
	return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t klen)
{
	if (!m->key)
		return -1;
	size_t i = fnv1a(key, klen) & m->mask;
	while (m->key[i]) {
		if (m->klen[i] == klen && memcmp(m->key[i], key, klen) == 0)
			return m->val[i];
		i = (i + 1) & m->mask;
	}
	return -1;
}

int tok_pairmap_init(tok_pairmap *m, size_t n_keys)
{
	size_t s = slots_for(n_keys);
	m->slot = calloc(s, sizeof(*m->slot));
	m->mask = s - 1;
	m->used = 0;
	if (!m->slot)
		return moet_err(MOET_ENOMEM, "tokenizer: out of memory for the merges map");
	return 0;
}

void tok_pairmap_free(tok_pairmap *m)
{
	free(m->slot);
	memset(m, 0, sizeof(*m));
}

static uint64_t pair_key(int32_t a, int32_t b)
{
	return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id)
{
	uint64_t k = pair_key(a, b);
	size_t i = mix64(k) & m->mask;
	while (m->slot[i].key) {
		if (m->slot[i].key == k) {
			m->slot[i].rank = rank;
			m->slot[i].new_id = new_id;
			return 1;
		}
		i = (i + 1) & m->mask;
	}
	m->slot[i] = (tok_merge){.key = k, .rank = rank, .new_id = new_id};
	m->used++;
	return 0;
}

const tok_merge *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b)
{
	uint64_t k = pair_key(a, b);
	size_t i = mix64(k) & m->mask;
	while (m->slot[i].key) {
		if (m->slot[i].key == k)
			return &m->slot[i];
		i = (i + 1) & m->mask;
	}
	return NULL;
}

int tok_push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 64;
		int32_t *p = realloc(*ids, c * sizeof(*p));
		if (!p)
			return moet_err(MOET_ENOMEM, "tokenizer: out of memory for %zu ids", c);
		*ids = p;
		*cap = c;
	}
	(*ids)[(*n)++] = id;
	return 0;
}

/* ---- heap of candidate merges ------------------------------------------------------------ */

typedef struct heap_ent {
	int32_t rank;
	int32_t pos;
	int32_t new_id;
} heap_ent;

static int ent_less(const heap_ent *a, const heap_ent *b)
{
	return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!ent_less(&e, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n)
{
	heap_ent top = h[0], last = h[--(*n)];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && ent_less(&h[c + 1], &h[c]))
			c++;
		if (!ent_less(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

static void push_pair(const moet_tokenizer *tok, heap_ent *h, size_t *nh, const int32_t *sym,
		      int32_t left, int32_t right)
{
	const tok_merge *m = tok_pairmap_get(&tok->merges, sym[left], sym[right]);
	if (m)
		heap_push(h, nh, (heap_ent){.rank = m->rank, .pos = left, .new_id = m->new_id});
}

/* The word's ids by merges, into out[] (n entries at most); returns the count. */
static size_t bpe_merge(const moet_tokenizer *tok, const unsigned char *w, size_t n,
			int32_t *sym, int32_t *prev, int32_t *next, heap_ent *h, int32_t *out)
{
	size_t nh = 0;
	for (size_t i = 0; i < n; i++) {
		sym[i] = tok->byte_id[w[i]];
		prev[i] = (int32_t)i - 1;
		next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
	}
	for (size_t i = 0; i + 1 < n; i++)
		push_pair(tok, h, &nh, sym, (int32_t)i, (int32_t)i + 1);
	while (nh) {
		heap_ent e = heap_pop(h, &nh);
		int32_t l = e.pos, r = next[l];
		if (sym[l] < 0 || r < 0)
			continue;
		const tok_merge *m = tok_pairmap_get(&tok->merges, sym[l], sym[r]);
		if (!m || m->new_id != e.new_id)
			continue;
		sym[l] = e.new_id;
		sym[r] = -1;
		next[l] = next[r];
		if (next[r] >= 0)
			prev[next[r]] = l;
		if (prev[l] >= 0)
			push_pair(tok, h, &nh, sym, prev[l], l);
		if (next[l] >= 0)
			push_pair(tok, h, &nh, sym, l, next[l]);
	}
	size_t k = 0;
	for (int32_t i = 0; i >= 0; i = next[i])
		out[k++] = sym[i];
	return k;
}

/* ignore_merges: the word's byte-level form, if it is a vocab token, is taken whole. */
static int32_t whole_word_id(const moet_tokenizer *tok, const unsigned char *w, size_t n)
{
	char buf[4 * 64] = {0};
	size_t k = 0;
	if (n > 64)
		return -1; /* NOTE: no vocab has tokens this long; not looked up */
	for (size_t i = 0; i < n; i++) {
		/* byte-level code points are < 512: 1 or 2 UTF-8 bytes */
		const char *t = tok->tokens[tok->byte_id[w[i]]];
		size_t tl = strlen(t);
		memcpy(buf + k, t, tl);
		k += tl;
	}
	return tok_strmap_get(&tok->vocab, buf, k);
}

int tok_bpe_word(const moet_tokenizer *tok, const char *word, size_t n, int32_t **ids,
		 size_t *n_ids, size_t *cap)
{
	const unsigned char *w = (const unsigned char *)word;
	int rc = 0;
	uint64_t hash = fnv1a(word, n);
	tok_cache_entry *ce = NULL;
	if (n <= TOK_CACHE_MAX_BYTES) {
		ce = &tok->cache[hash & (TOK_CACHE_SLOTS - 1)];
		pthread_mutex_lock((pthread_mutex_t *)&tok->cache_lock);
		if (ce->len == n && memcmp(ce->word, word, n) == 0) {
			int32_t got[TOK_CACHE_MAX_BYTES];
			size_t k = ce->n_ids;
			memcpy(got, ce->ids, k * sizeof(got[0]));
			pthread_mutex_unlock((pthread_mutex_t *)&tok->cache_lock);
			for (size_t i = 0; i < k && rc == 0; i++)
				rc = tok_push_id(ids, n_ids, cap, got[i]);
			return rc;
		}
		pthread_mutex_unlock((pthread_mutex_t *)&tok->cache_lock);
	}
	int32_t whole = tok->ignore_merges ? whole_word_id(tok, w, n) : -1;
	if (whole >= 0)
		return tok_push_id(ids, n_ids, cap, whole);

	int32_t s_sym[64], s_prev[64], s_next[64], s_out[64];
	heap_ent s_heap[3 * 64];
	int32_t *sym = s_sym, *prev = s_prev, *next = s_next, *out = s_out;
	heap_ent *heap = s_heap;
	void *big = NULL;
	if (n > 64) {
		big = malloc(n * (4 * sizeof(int32_t) + 3 * sizeof(heap_ent)));
		if (!big)
			return moet_err(MOET_ENOMEM, "tokenizer: out of memory for a %zu-byte word",
					n);
		heap = big;
		sym = (int32_t *)(heap + 3 * n);
		prev = sym + n;
		next = prev + n;
		out = next + n;
	}
	size_t k = bpe_merge(tok, w, n, sym, prev, next, heap, out);
	for (size_t i = 0; i < k && rc == 0; i++)
		rc = tok_push_id(ids, n_ids, cap, out[i]);
	if (ce && rc == 0) {
		pthread_mutex_lock((pthread_mutex_t *)&tok->cache_lock);
		ce->len = (uint8_t)n;
		ce->n_ids = (uint8_t)k;
		memcpy(ce->word, word, n);
		memcpy(ce->ids, out, k * sizeof(out[0]));
		pthread_mutex_unlock((pthread_mutex_t *)&tok->cache_lock);
	}
	free(big);
	return rc;
}
