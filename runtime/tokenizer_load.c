/*
 * tokenizer_load.c: tokenizer.json (HF `tokenizers` serialization) -> moet_tokenizer.
 *
 * Reads, in order: normalizer, model (BPE: vocab, merges), added_tokens, pre_tokenizer,
 * decoder, post_processor, truncation/padding. Whatever changes the ids and is not
 * implemented here is refused: an error "<file>: <json path>: <problem>" rather than ids that
 * quietly differ from the reference.
 *
 * NOTE: regex dialects. HF `tokenizers` compiles Split patterns with Oniguruma; we use PCRE2
 * (UTF + UCP) as found on Debian 12 (10.42). The constructs in DeepSeek-V3's three patterns
 * (\p{N} \p{L} \p{M} \p{P} \p{S}, \s, classes with literal CJK ranges, (?!\S)) mean the same
 * in both and all compile on 10.42 unchanged. Two Oniguruma constructs compile in PCRE2 with a
 * different meaning, so they are refused instead: `&&` inside a class (Oniguruma's
 * intersection, literal characters to PCRE2) and \h / \H (a hex digit to Oniguruma, horizontal
 * space to PCRE2). The UTS#18 class operators of PCRE2 10.45 ([\p{L}--\p{Lu}]) fail to compile
 * on 10.42 and are reported with PCRE2's message and offset.
 */
#include "tokenizer_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_json.h"

#define TOK_MAX_IDS (1 << 24) /* refuse ids past this: a typo, not a vocabulary */

/* GPT-2's pattern, the Split that ByteLevel's use_regex stands for. */
static const char GPT2_PATTERN[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *str_or_null(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A field that must be absent, null, false, 0 or "" for this tokenizer to be supported. */
static int must_be_off(const moet_tokenizer *tok, const json_t *o, const char *path,
		       const char *key)
{
	const json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v) || json_is_false(v) ||
	    (json_is_string(v) && json_string_length(v) == 0) ||
	    (json_is_number(v) && json_number_value(v) == 0))
		return 0;
	return moet_err(MOET_EUNSUP, "%s: %s.%s: only null/false is supported", tok->name, path,
			key);
}

static int load_normalizer(moet_tokenizer *tok, const json_t *root)
{
	const json_t *n = json_object_get(root, "normalizer");
	if (!n || json_is_null(n))
		return 0;
	const char *type = str_or_null(n, "type");
	const json_t *list = json_object_get(n, "normalizers");
	if (type && strcmp(type, "Sequence") == 0 && json_is_array(list) && !json_array_size(list))
		return 0;
	return moet_err(MOET_EUNSUP, "%s: normalizer: type '%s' is not supported (only null or an "
			"empty Sequence)", tok->name, type ? type : "?");
}

static int set_token(moet_tokenizer *tok, int32_t id, const char *s, size_t n, const char *path)
{
	if (tok->tokens[id]) {
		if (tok->token_len[id] == n && memcmp(tok->tokens[id], s, n) == 0)
			return 0;
		return moet_err(MOET_EFORMAT, "%s: %s: id %d is already the token '%s'", tok->name,
				path, id, tok->tokens[id]);
	}
	tok->tokens[id] = malloc(n + 1);
	if (!tok->tokens[id])
		return moet_err(MOET_ENOMEM, "%s: out of memory", tok->name);
	memcpy(tok->tokens[id], s, n);
	tok->tokens[id][n] = 0;
	tok->token_len[id] = (uint32_t)n;
	return 0;
}

static int check_id(const moet_tokenizer *tok, const json_t *v, const char *path, int64_t *out)
{
	if (!json_is_integer(v))
		return moet_err(MOET_EFORMAT, "%s: %s: expected an integer id, got %s", tok->name,
				path, v ? moet_json_kind(v) : "nothing");
	int64_t id = json_integer_value(v);
	if (id < 0 || id >= TOK_MAX_IDS)
		return moet_err(MOET_ERANGE, "%s: %s: id %lld outside [0, %d)", tok->name, path,
				(long long)id, TOK_MAX_IDS);
	*out = id;
	return 0;
}

/* Ids of vocab and added tokens: sizes the tables and fills tokens[]. */
static int load_ids(moet_tokenizer *tok, const json_t *vocab, const json_t *added)
{
	int64_t max_id = -1, id;
	const char *key;
	json_t *v;
	char path[96];
	int rc;
	json_object_foreach((json_t *)vocab, key, v) {
		snprintf(path, sizeof(path), "model.vocab.\"%.40s\"", key);
		if ((rc = check_id(tok, v, path, &id)))
			return rc;
		max_id = id > max_id ? id : max_id;
	}
	for (size_t i = 0; i < json_array_size(added); i++) {
		const json_t *a = json_array_get(added, i);
		snprintf(path, sizeof(path), "added_tokens[%zu].id", i);
		if (!json_is_object(a))
			return moet_err(MOET_EFORMAT, "%s: added_tokens[%zu]: expected an object",
					tok->name, i);
		if ((rc = check_id(tok, json_object_get(a, "id"), path, &id)))
			return rc;
		max_id = id > max_id ? id : max_id;
	}
	tok->n_ids = (int32_t)(max_id + 1);
	size_t n = (size_t)tok->n_ids;
	tok->tokens = calloc(n ? n : 1, sizeof(*tok->tokens));
	tok->token_len = calloc(n ? n : 1, sizeof(*tok->token_len));
	tok->bytes = calloc(n ? n : 1, sizeof(*tok->bytes));
	tok->bytes_len = calloc(n ? n : 1, sizeof(*tok->bytes_len));
	tok->special = calloc(n ? n : 1, 1);
	tok->added = calloc(n ? n : 1, 1);
	if (!tok->tokens || !tok->token_len || !tok->bytes || !tok->bytes_len || !tok->special ||
	    !tok->added)
		return moet_err(MOET_ENOMEM, "%s: out of memory for %zu ids", tok->name, n);
	if ((rc = tok_strmap_init(&tok->vocab, n)))
		return rc;
	json_object_foreach((json_t *)vocab, key, v) {
		snprintf(path, sizeof(path), "model.vocab.\"%.40s\"", key);
		id = json_integer_value(v);
		if ((rc = set_token(tok, (int32_t)id, key, strlen(key), path)))
			return rc;
		tok_strmap_put(&tok->vocab, tok->tokens[id], tok->token_len[id], (int32_t)id);
	}
	return 0;
}

static int load_added(moet_tokenizer *tok, const json_t *added)
{
	char path[64];
	int rc;
	for (size_t i = 0; i < json_array_size(added); i++) {
		const json_t *a = json_array_get(added, i);
		const json_t *c = json_object_get(a, "content");
		snprintf(path, sizeof(path), "added_tokens[%zu]", i);
		if (!json_is_string(c) || json_string_length(c) == 0)
			return moet_err(MOET_EFORMAT, "%s: %s.content: expected a non-empty string",
					tok->name, path);
		static const char *const off[] = {"lstrip", "rstrip", "single_word"};
		for (int k = 0; k < 3; k++)
			if ((rc = must_be_off(tok, a, path, off[k])))
				return rc;
		int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
		if ((rc = set_token(tok, id, json_string_value(c), json_string_length(c), path)))
			return rc;
		const json_t *sp = json_object_get(a, "special");
		const json_t *nm = json_object_get(a, "normalized");
		tok->special[id] = json_is_true(sp);
		/* NOTE: HF's default for "normalized" is the opposite of "special" */
		tok->added[id] = nm ? (json_is_true(nm) ? 2 : 1) : (tok->special[id] ? 1 : 2);
		tok_strmap_put(&tok->vocab, tok->tokens[id], tok->token_len[id], id);
	}
	return 0;
}

static int cmp_added(const void *pa, const void *pb)
{
	const tok_added *a = pa, *b = pb;
	unsigned char fa = (unsigned char)a->text[0], fb = (unsigned char)b->text[0];
	if (fa != fb)
		return fa < fb ? -1 : 1;
	if (a->len != b->len)
		return a->len > b->len ? -1 : 1;
	return a->id < b->id ? -1 : a->id > b->id;
}

/* Added tokens of one kind (tok->added[id] == which) into a first-byte-bucketed set. */
static int build_addset(moet_tokenizer *tok, tok_addset *s, uint8_t which)
{
	size_t n = 0;
	for (int32_t id = 0; id < tok->n_ids; id++)
		n += tok->added[id] == which;
	s->tok = calloc(n ? n : 1, sizeof(*s->tok));
	if (!s->tok)
		return moet_err(MOET_ENOMEM, "%s: out of memory", tok->name);
	for (int32_t id = 0; id < tok->n_ids; id++)
		if (tok->added[id] == which)
			s->tok[s->n++] = (tok_added){tok->tokens[id], tok->token_len[id], id};
	qsort(s->tok, s->n, sizeof(*s->tok), cmp_added);
	size_t j = 0;
	for (int b = 0; b <= 256; b++) {
		while (j < s->n && (unsigned char)s->tok[j].text[0] < b)
			j++;
		s->first[b] = j;
	}
	s->first[256] = s->n;
	return 0;
}

/* Splits "a b" or ["a", "b"] at merges[i]. */
static int merge_parts(const moet_tokenizer *tok, const json_t *m, size_t i, const char **a,
		       size_t *na, const char **b, size_t *nb)
{
	if (json_is_string(m)) {
		const char *s = json_string_value(m);
		const char *sp = strchr(s, ' ');
		if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1])
			return moet_err(MOET_EFORMAT, "%s: model.merges[%zu]: '%.60s' is not two "
					"tokens separated by one space", tok->name, i, s);
		*a = s;
		*na = (size_t)(sp - s);
		*b = sp + 1;
		*nb = strlen(sp + 1);
		return 0;
	}
	if (json_is_array(m) && json_array_size(m) == 2 &&
	    json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
		*a = json_string_value(json_array_get(m, 0));
		*na = json_string_length(json_array_get(m, 0));
		*b = json_string_value(json_array_get(m, 1));
		*nb = json_string_length(json_array_get(m, 1));
		return 0;
	}
	return moet_err(MOET_EFORMAT, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"], "
			"got %s", tok->name, i, moet_json_kind(m));
}

static int load_merges(moet_tokenizer *tok, const json_t *merges)
{
	size_t n = json_array_size(merges);
	int rc = tok_pairmap_init(&tok->merges, n);
	char *buf = NULL;
	size_t bufcap = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		const char *a = NULL, *b = NULL;
		size_t na = 0, nb = 0;
		if ((rc = merge_parts(tok, json_array_get(merges, i), i, &a, &na, &b, &nb)))
			break;
		int32_t ia = tok_strmap_get(&tok->vocab, a, na);
		int32_t ib = tok_strmap_get(&tok->vocab, b, nb);
		if (ia < 0 || ib < 0) {
			rc = moet_err(MOET_EFORMAT, "%s: model.merges[%zu]: token '%.*s' is not in "
				      "model.vocab", tok->name, i, (int)(ia < 0 ? na : nb),
				      ia < 0 ? a : b);
			break;
		}
		if (na + nb > bufcap) {
			bufcap = 2 * (na + nb);
			char *p = realloc(buf, bufcap);
			if (!p) {
				rc = moet_err(MOET_ENOMEM, "%s: out of memory", tok->name);
				break;
			}
			buf = p;
		}
		memcpy(buf, a, na);
		memcpy(buf + na, b, nb);
		int32_t im = tok_strmap_get(&tok->vocab, buf, na + nb);
		if (im < 0) {
			rc = moet_err(MOET_EFORMAT, "%s: model.merges[%zu]: the merged token "
				      "'%.*s' is not in model.vocab", tok->name, i, (int)(na + nb),
				      buf);
			break;
		}
		tok_pairmap_put(&tok->merges, ia, ib, (int32_t)i, im);
	}
	free(buf);
	return rc;
}

static int load_model(moet_tokenizer *tok, const json_t *root)
{
	const json_t *m = json_object_get(root, "model");
	const json_t *added = json_object_get(root, "added_tokens");
	int rc;
	if (!json_is_object(m))
		return moet_err(MOET_EFORMAT, "%s: model: missing or not an object", tok->name);
	const char *type = str_or_null(m, "type");
	if (!type)
		return moet_err(MOET_EFORMAT, "%s: model.type: missing", tok->name);
	if (strcmp(type, "BPE") != 0)
		return moet_err(MOET_EUNSUP, "%s: model.type: '%s' is not supported (only BPE)",
				tok->name, type);
	static const char *const off[] = {"dropout", "continuing_subword_prefix",
					  "end_of_word_suffix", "byte_fallback"};
	for (int k = 0; k < 4; k++)
		if ((rc = must_be_off(tok, m, "model", off[k])))
			return rc;
	tok->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
	const json_t *vocab = json_object_get(m, "vocab");
	const json_t *merges = json_object_get(m, "merges");
	if (!json_is_object(vocab))
		return moet_err(MOET_EFORMAT, "%s: model.vocab: missing or not an object",
				tok->name);
	if (!json_is_array(merges))
		return moet_err(MOET_EFORMAT, "%s: model.merges: missing or not an array",
				tok->name);
	if (added && !json_is_null(added) && !json_is_array(added))
		return moet_err(MOET_EFORMAT, "%s: added_tokens: expected an array, got %s",
				tok->name, moet_json_kind(added));
	if ((rc = load_ids(tok, vocab, json_is_array(added) ? added : NULL)))
		return rc;
	/* NOTE: merges are resolved against the model vocabulary only, before added tokens */
	if ((rc = load_merges(tok, merges)))
		return rc;
	if ((rc = load_added(tok, json_is_array(added) ? added : NULL)))
		return rc;
	if ((rc = build_addset(tok, &tok->add_raw, 1)) ||
	    (rc = build_addset(tok, &tok->add_norm, 2)))
		return rc;
	return 0;
}

/* Oniguruma constructs that PCRE2 reads differently (see the NOTE at the top). */
static const char *dialect_trap(const char *p, size_t n)
{
	int in_class = 0;
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '\\' && i + 1 < n) {
			if (p[i + 1] == 'h' || p[i + 1] == 'H')
				return "\\h / \\H (a hex digit in Oniguruma, horizontal space "
				       "in PCRE2)";
			i++;
		} else if (p[i] == '[') {
			in_class++;
		} else if (p[i] == ']' && in_class) {
			in_class--;
		} else if (in_class && p[i] == '&' && i + 1 < n && p[i + 1] == '&') {
			return "'&&' in a class (intersection in Oniguruma, literal in PCRE2)";
		}
	}
	return NULL;
}

static int add_split(moet_tokenizer *tok, const char *pat, size_t n, int literal, int removed,
		     int invert, const char *path)
{
	const char *trap = literal ? NULL : dialect_trap(pat, n);
	if (trap)
		return moet_err(MOET_EUNSUP, "%s: %s: %s is not supported", tok->name, path, trap);
	int err;
	PCRE2_SIZE off;
	uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, opt, &err, &off, NULL);
	if (!re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(err, msg, sizeof(msg));
		return moet_err(MOET_EUNSUP, "%s: %s: PCRE2 cannot compile the pattern at offset "
				"%zu: %s", tok->name, path, (size_t)off, (char *)msg);
	}
	pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* NOTE: the interpreter remains if JIT fails */
	tok_split *s = realloc(tok->splits, (tok->n_splits + 1) * sizeof(*s));
	if (!s) {
		pcre2_code_free(re);
		return moet_err(MOET_ENOMEM, "%s: out of memory", tok->name);
	}
	tok->splits = s;
	s[tok->n_splits++] = (tok_split){.re = re, .removed = removed, .invert = invert};
	return 0;
}

static int load_step(moet_tokenizer *tok, const json_t *p, const char *path, int last,
		     int *saw_bytelevel)
{
	char sub[96];
	const char *type = str_or_null(p, "type");
	if (!type)
		return moet_err(MOET_EFORMAT, "%s: %s.type: missing", tok->name, path);
	if (*saw_bytelevel)
		return moet_err(MOET_EUNSUP, "%s: %s: a step after ByteLevel is not supported",
				tok->name, path);
	if (strcmp(type, "ByteLevel") == 0) {
		int rc = must_be_off(tok, p, path, "add_prefix_space");
		if (rc)
			return rc;
		*saw_bytelevel = 1;
		if (json_is_false(json_object_get(p, "use_regex")))
			return 0;
		snprintf(sub, sizeof(sub), "%s.use_regex", path);
		return add_split(tok, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, 0, 0, sub);
	}
	if (strcmp(type, "Split") != 0)
		return moet_err(MOET_EUNSUP, "%s: %s.type: '%s' is not supported (Split, "
				"ByteLevel)", tok->name, path, type);
	const json_t *pat = json_object_get(p, "pattern");
	const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
	const json_t *s = json_is_string(re) ? re : lit;
	if (!json_is_string(s))
		return moet_err(MOET_EFORMAT, "%s: %s.pattern: expected {\"Regex\": ...} or "
				"{\"String\": ...}", tok->name, path);
	const char *beh = str_or_null(p, "behavior");
	if (!beh || (strcmp(beh, "Isolated") != 0 && strcmp(beh, "Removed") != 0))
		return moet_err(MOET_EUNSUP, "%s: %s.behavior: '%s' is not supported (Isolated, "
				"Removed)", tok->name, path, beh ? beh : "missing");
	snprintf(sub, sizeof(sub), "%s.pattern.%s", path, s == re ? "Regex" : "String");
	(void)last;
	return add_split(tok, json_string_value(s), json_string_length(s), s == lit,
			 strcmp(beh, "Removed") == 0, json_is_true(json_object_get(p, "invert")),
			 sub);
}

static int load_pretok(moet_tokenizer *tok, const json_t *root)
{
	const json_t *p = json_object_get(root, "pre_tokenizer");
	int saw = 0, rc = 0;
	if (!json_is_object(p))
		return moet_err(MOET_EUNSUP, "%s: pre_tokenizer: missing (only byte-level BPE is "
				"supported)", tok->name);
	const char *type = str_or_null(p, "type");
	if (type && strcmp(type, "Sequence") == 0) {
		const json_t *list = json_object_get(p, "pretokenizers");
		if (!json_is_array(list))
			return moet_err(MOET_EFORMAT, "%s: pre_tokenizer.pretokenizers: "
					"expected an array", tok->name);
		for (size_t i = 0; i < json_array_size(list) && rc == 0; i++) {
			char path[64];
			snprintf(path, sizeof(path), "pre_tokenizer.pretokenizers[%zu]", i);
			rc = load_step(tok, json_array_get(list, i), path,
				       i + 1 == json_array_size(list), &saw);
		}
	} else {
		rc = load_step(tok, p, "pre_tokenizer", 1, &saw);
	}
	if (rc == 0 && !saw)
		rc = moet_err(MOET_EUNSUP, "%s: pre_tokenizer: no ByteLevel step (only byte-level "
			      "BPE is supported)", tok->name);
	return rc;
}

static int load_tail(moet_tokenizer *tok, const json_t *root)
{
	const json_t *d = json_object_get(root, "decoder");
	const char *dt = json_is_object(d) ? str_or_null(d, "type") : NULL;
	if (!dt || strcmp(dt, "ByteLevel") != 0)
		return moet_err(MOET_EUNSUP, "%s: decoder: '%s' is not supported (only ByteLevel)",
				tok->name, dt ? dt : "missing");
	const json_t *pp = json_object_get(root, "post_processor");
	const char *pt = json_is_object(pp) ? str_or_null(pp, "type") : NULL;
	if (pp && !json_is_null(pp) && (!pt || strcmp(pt, "ByteLevel") != 0))
		return moet_err(MOET_EUNSUP, "%s: post_processor: '%s' is not supported (null or "
				"ByteLevel)", tok->name, pt ? pt : "?");
	int rc = must_be_off(tok, root, "(root)", "truncation");
	return rc ? rc : must_be_off(tok, root, "(root)", "padding");
}

/* Each id's bytes: HF's ByteLevel decoder maps a token's characters back to bytes when every
 * one is a byte-level character, and keeps the token's own UTF-8 otherwise. */
static int build_bytes(moet_tokenizer *tok)
{
	uint32_t byte_cp[256];
	int16_t cp_byte[512];
	tok_bytelevel_init(byte_cp, cp_byte);
	for (int b = 0; b < 256; b++) {
		char u[3];
		size_t n = 0;
		uint32_t cp = byte_cp[b];
		if (cp < 0x80) {
			u[n++] = (char)cp;
		} else {
			u[n++] = (char)(0xC0 | (cp >> 6));
			u[n++] = (char)(0x80 | (cp & 0x3F));
		}
		tok->byte_id[b] = tok_strmap_get(&tok->vocab, u, n);
		if (tok->byte_id[b] < 0 || tok->added[tok->byte_id[b]])
			return moet_err(MOET_EFORMAT, "%s: model.vocab: no token for byte 0x%02x "
					"(byte-level character U+%04X)", tok->name, b, cp);
	}
	for (int32_t id = 0; id < tok->n_ids; id++) {
		const unsigned char *t = (const unsigned char *)tok->tokens[id];
		if (!t)
			continue;
		size_t n = tok->token_len[id], k = 0, i = 0;
		char *out = malloc(n + 1);
		if (!out)
			return moet_err(MOET_ENOMEM, "%s: out of memory", tok->name);
		while (i < n) {
			uint32_t cp;
			if (t[i] < 0x80) {
				cp = t[i++];
			} else if ((t[i] & 0xE0) == 0xC0 && i + 1 < n) {
				cp = ((uint32_t)(t[i] & 0x1F) << 6) | (t[i + 1] & 0x3F);
				i += 2;
			} else {
				break; /* 3- and 4-byte characters are no byte-level characters */
			}
			if (cp >= 512 || cp_byte[cp] < 0)
				break;
			out[k++] = (char)cp_byte[cp];
		}
		if (i < n) { /* not all byte-level: the token's own bytes */
			memcpy(out, t, n);
			k = n;
		}
		out[k] = 0;
		tok->bytes[id] = out;
		tok->bytes_len[id] = (uint32_t)k;
	}
	return 0;
}

int tok_load_json(moet_tokenizer *tok, const char *text, size_t n)
{
	json_error_t jerr;
	json_t *root = json_loadb(text, n, 0, &jerr);
	int rc;
	if (!root)
		return moet_err(MOET_EFORMAT, "%s: JSON line %d column %d: %s", tok->name,
				jerr.line, jerr.column, jerr.text);
	if (!json_is_object(root)) {
		rc = moet_err(MOET_EFORMAT, "%s: expected a JSON object at the top, got %s",
			      tok->name, moet_json_kind(root));
		goto fail;
	}
	if ((rc = load_normalizer(tok, root)) || (rc = load_model(tok, root)) ||
	    (rc = build_bytes(tok)) || (rc = load_pretok(tok, root)) || (rc = load_tail(tok, root)))
		goto fail;
	rc = 0;
fail:
	json_decref(root);
	return rc;
}
