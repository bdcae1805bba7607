/*
 * tokenizer_int.h: the tokenizer's internals, shared by tokenizer_load.c (tokenizer.json),
 * tokenizer_bpe.c (tables, byte-level map, merges) and tokenizer.c (encode, decode).
 */
#ifndef MOET_TOKENIZER_INT_H
#define MOET_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "moet_tokenizer.h"

/* String -> id, open addressing (linear probing), power-of-two slots. */
typedef struct tok_strmap {
	const char **key; /* borrowed: points into tok->tokens */
	uint32_t *klen;
	int32_t *val;
	size_t mask; /* slots - 1 */
	size_t used;
} tok_strmap;

/* (left id, right id) -> (rank, merged id), open addressing on the 64-bit key. */
typedef struct tok_merge {
	uint64_t key; /* (left << 32 | right) + 1; 0 marks an empty slot */
	int32_t rank;
	int32_t new_id;
} tok_merge;

typedef struct tok_pairmap {
	tok_merge *slot;
	size_t mask;
	size_t used;
} tok_pairmap;

typedef struct tok_split {
	pcre2_code *re;
	int removed; /* behavior Removed (else Isolated) */
	int invert;  /* the matches are the gaps */
} tok_split;

typedef struct tok_added {
	const char *text; /* borrowed: tok->tokens[id] */
	uint32_t len;
	int32_t id;
} tok_added;

/* One set of added tokens matched together (leftmost-longest), bucketed by first byte, each
 * bucket longest first. */
typedef struct tok_addset {
	tok_added *tok;   /* n entries sorted by (first byte, length desc) */
	size_t n;
	size_t first[257]; /* bucket of byte b: tok[first[b] .. first[b+1]) */
} tok_addset;

#define TOK_CACHE_SLOTS 16384
#define TOK_CACHE_MAX_BYTES 48 /* longer words are not cached */

typedef struct tok_cache_entry {
	uint8_t len;      /* word bytes; 0 = empty */
	uint8_t n_ids;
	char word[TOK_CACHE_MAX_BYTES];
	int32_t ids[TOK_CACHE_MAX_BYTES];
} tok_cache_entry;

struct moet_tokenizer {
	char *name;          /* the file, for messages */
	int32_t n_ids;       /* one past the largest id */
	char **tokens;       /* [n_ids] token as in tokenizer.json (NUL-terminated), or NULL */
	uint32_t *token_len; /* [n_ids] bytes of tokens[i] */
	char **bytes;        /* [n_ids] decoded bytes of each id */
	uint32_t *bytes_len; /* [n_ids] */
	uint8_t *special;    /* [n_ids] 1 for added tokens marked special */
	uint8_t *added;      /* [n_ids] 1 for added tokens */
	tok_strmap vocab;    /* every token string -> id (model vocab and added tokens) */
	tok_pairmap merges;
	int ignore_merges;   /* a word that is itself a vocab token is taken whole */
	int32_t byte_id[256];/* the vocab id of each byte's byte-level character */
	tok_split *splits;
	size_t n_splits;
	tok_addset add_raw;  /* added tokens with normalized false: matched first */
	tok_addset add_norm; /* normalized true: matched in the gaps (normalizer is identity) */
	pthread_mutex_t cache_lock;
	tok_cache_entry *cache; /* [TOK_CACHE_SLOTS] words -> ids */
};

/* GPT-2 byte-level map: byte b <-> code point tok_byte_cp[b]; tok_cp_byte[cp] is b, or -1
 * for code points (< 512) that stand for no byte. */
void tok_bytelevel_init(uint32_t byte_cp[256], int16_t cp_byte[512]);

int tok_strmap_init(tok_strmap *m, size_t n_keys);
void tok_strmap_free(tok_strmap *m);
/* 0 inserted, 1 the key was present (value kept), MOET_ENOMEM never (sized at init). */
int tok_strmap_put(tok_strmap *m, const char *key, uint32_t klen, int32_t val);
/* The id, or -1. */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t klen);

int tok_pairmap_init(tok_pairmap *m, size_t n_keys);
void tok_pairmap_free(tok_pairmap *m);
/* 0 inserted, 1 the pair was already present: the later line wins, as in HF `tokenizers`
 * (its merges map is collected from the list in order). */
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);
const tok_merge *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);

/* BPE of one word (raw bytes, n >= 1): appends the ids to *ids (growing it). 0 or
 * MOET_ENOMEM. */
int tok_bpe_word(const moet_tokenizer *tok, const char *word, size_t n, int32_t **ids,
		 size_t *n_ids, size_t *cap);

/* Appends one id to a growing array. 0 or MOET_ENOMEM. */
int tok_push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id);

/* Parses the JSON into tok (allocated, name set, everything else zero). */
int tok_load_json(moet_tokenizer *tok, const char *text, size_t n);

#endif
