/*
 * moet_tokenizer.h: a model's tokenizer.json (HF `tokenizers` format) read natively: byte-level
 * BPE after a Sequence of regex Splits (DeepSeek-V3, GPT-2 style), added and special tokens,
 * and a UTF-8-correct incremental decoder for streaming. docs/tokenizer.md has the details.
 *
 *   text --added tokens (leftmost-longest, before anything else)--> pieces + added ids
 *        --Split regexes in order (PCRE2, UTF + UCP)--> words
 *        --bytes -> 256 printable chars (GPT-2 byte-level)--> BPE merges by rank --> ids
 *   ids  --per-id bytes (byte-level map inverted; added tokens as written)--> bytes
 *
 * Supported: model BPE (vocab; merges as "a b" strings or [a, b] pairs; ignore_merges);
 * pre_tokenizer Split (Regex or String pattern, behavior Isolated or Removed, invert) and
 * ByteLevel (use_regex, no add_prefix_space), alone or in a Sequence; normalizer null or an
 * empty Sequence; decoder ByteLevel; post_processor null or ByteLevel. Anything else is refused
 * with a one-line error naming the file and the JSON path.
 *
 * Thread-safety: a loaded tokenizer is read-only except for its word cache, which has its own
 * lock; encode and decode may be called from any number of threads at once.
 */
#ifndef MOET_TOKENIZER_H
#define MOET_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct moet_tokenizer moet_tokenizer;

/* Loads tokenizer.json from `path`. Returns 0 and *out_tok (destroy with
 * moet_tokenizer_destroy), or MOET_EIO / MOET_EFORMAT / MOET_EUNSUP / MOET_ENOMEM with a
 * one-line detail "<path>: <json path>: <problem>". */
int moet_tokenizer_load(const char *path, moet_tokenizer **out_tok);

/* The same from JSON text in memory (n bytes); `name` stands for the file in messages. */
int moet_tokenizer_load_text(const char *json_text, size_t n, const char *name,
			     moet_tokenizer **out_tok);

/* Frees everything; NULL is fine. */
void moet_tokenizer_destroy(moet_tokenizer *tok);

/* One past the largest id (model vocabulary and added tokens). */
int32_t moet_tokenizer_n_ids(const moet_tokenizer *tok);

/* The id of a token written as in tokenizer.json (an added token's content, or a model token
 * in its byte-level form). Returns 0 and *out_id, or MOET_ENOTFOUND. */
int moet_tokenizer_find(const moet_tokenizer *tok, const char *token, int32_t *out_id);

/* 1 if `id` is an added token marked "special", else 0 (also for ids out of range). */
int moet_tokenizer_is_special(const moet_tokenizer *tok, int32_t id);

/*
 * Encodes n bytes of UTF-8 text. Added tokens (special or not) found in the text become their
 * ids; everything else goes through the pre-tokenizer and BPE. No BOS/EOS is added.
 * Returns 0 with *out_ids (malloc'd, the caller frees; NULL when *out_n is 0) and *out_n, or
 * MOET_EINVAL (text is not valid UTF-8: the detail names the byte offset), MOET_ENOMEM.
 */
int moet_tokenizer_encode(const moet_tokenizer *tok, const char *text, size_t n,
			  int32_t **out_ids, size_t *out_n);

/*
 * Decodes ids to bytes: each id's bytes concatenated (special tokens left out when
 * skip_special). The bytes are not necessarily valid UTF-8 (a token can hold part of a
 * character). Returns 0 with *out_text (malloc'd, NUL-terminated, the caller frees) and
 * *out_n (bytes, without the NUL), or MOET_ERANGE naming the first id that is no token.
 */
int moet_tokenizer_decode(const moet_tokenizer *tok, const int32_t *ids, size_t n_ids,
			  int skip_special, char **out_text, size_t *out_n);

/* The bytes of one id, borrowed from the tokenizer (*out_n bytes, not NUL-terminated), or
 * MOET_ERANGE. */
int moet_tokenizer_token_bytes(const moet_tokenizer *tok, int32_t id, const char **out_bytes,
			       size_t *out_n);

/*
 * Incremental decoding for streaming: push ids one at a time; each push gives the bytes that
 * have become complete UTF-8 sequences and holds back a trailing incomplete one (at most 3
 * bytes) until the next push completes it. Bytes that can never start or continue a valid
 * sequence are passed through as they come, so the concatenation of every push and the final
 * flush equals moet_tokenizer_decode of the same ids, byte for byte.
 * The struct is the caller's (one per stream); init before use, free after.
 */
typedef struct moet_detok {
	const moet_tokenizer *tok; /* borrowed */
	int skip_special;
	unsigned char held[4]; /* a UTF-8 prefix waiting for its continuation bytes */
	size_t n_held;
	char *buf; /* output of the last push/flush, owned */
	size_t cap;
} moet_detok;

void moet_detok_init(moet_detok *d, const moet_tokenizer *tok, int skip_special);

/* Returns 0 with *out_text (borrowed from d, valid until the next call on d) and *out_n
 * (possibly 0), or MOET_ERANGE / MOET_ENOMEM. */
int moet_detok_push(moet_detok *d, int32_t id, const char **out_text, size_t *out_n);

/* The held bytes (an incomplete sequence at the end of the stream), then d is empty again. */
int moet_detok_flush(moet_detok *d, const char **out_text, size_t *out_n);

void moet_detok_free(moet_detok *d);

/* Length of the longest prefix of s[0..n) that is valid UTF-8 (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF). */
size_t moet_utf8_valid_prefix(const char *s, size_t n);

#endif
