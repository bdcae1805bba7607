/*
 * test_tokenizer.c: the tokenizer (moet_tokenizer.h).
 *
 *   1. a small byte-level BPE built here (256 byte tokens, a few merges and added tokens):
 *      ids worked out by hand, Removed/invert splits, invalid UTF-8, incremental decode of
 *      split and invalid sequences;
 *   2. bad tokenizer.json inputs (mutations of that small one): each a one-line error naming
 *      the file and the JSON path;
 *   3. DeepSeek-V3's tokenizer.json from ../shared against the ids HF `tokenizers` gave for
 *      the strings of tests/runtime/tokenizer_ref/deepseek-v3.jsonl.gz
 *      (make_tokenizer_ref.py): identical ids, decode(encode(s)) == s, decode(ref ids) == s,
 *      and the incremental decode equal to the whole one with every piece valid UTF-8.
 *      Skipped (77) when ../shared lacks the file, after parts 1 and 2 have run.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moet_err.h"
#include "moet_test.h"
#include "moet_tokenizer.h"

/* ---- the small tokenizer ----------------------------------------------------------------- */

/* GPT-2's byte -> code point map, written out again here as the test's own reference. */
static unsigned byte_cp(int b)
{
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
		return (unsigned)b;
	int n = 0;
	for (int x = 0; x < b; x++)
		if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
			n++;
	return 256u + (unsigned)n;
}

static void cp_utf8(unsigned cp, char *out)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		out[2] = 0;
	}
}

/* vocab: byte b is id b; he 256, ll 257, hell 258, hello 259, Ġw 260; added <s> 261 (special),
 * <|x|> 262 (normalized, not special). */
static json_t *small_json(void)
{
	json_t *vocab = json_object();
	char u[4];
	for (int b = 0; b < 256; b++) {
		cp_utf8(byte_cp(b), u);
		json_object_set_new(vocab, u, json_integer(b));
	}
	const char *extra[] = {"he", "ll", "hell", "hello", "\xc4\xa0w"}; /* Ġ = U+0120 */
	for (int i = 0; i < 5; i++)
		json_object_set_new(vocab, extra[i], json_integer(256 + i));
	json_t *merges = json_pack("[s, s, s, s, [s, s]]", "h e", "l l", "he ll", "hell o",
				   "\xc4\xa0", "w");
	json_t *root = json_pack(
		"{s:n, s:{s:s, s:o, s:o, s:n}, s:[{s:i, s:s, s:b, s:b}, {s:i, s:s, s:b, s:b}],"
		" s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]},"
		" s:{s:s}, s:n}",
		"normalizer",
		"model", "type", "BPE", "vocab", vocab, "merges", merges, "dropout",
		"added_tokens", "id", 261, "content", "<s>", "special", 1, "normalized", 0,
		"id", 262, "content", "<|x|>", "special", 0, "normalized", 1,
		"pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern",
		"Regex", " ?\\p{L}+|\\p{N}", "behavior", "Isolated", "invert", 0,
		"type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0,
		"decoder", "type", "ByteLevel", "post_processor");
	return root;
}

static moet_tokenizer *load_json(json_t *root, const char *name, int *out_rc)
{
	char *text = json_dumps(root, 0);
	moet_tokenizer *t = NULL;
	*out_rc = moet_tokenizer_load_text(text, strlen(text), name, &t);
	free(text);
	return t;
}

static void expect_ids(moet_tokenizer *t, const char *s, size_t n, const int32_t *want,
		       size_t n_want)
{
	int32_t *ids;
	size_t k;
	int rc = moet_tokenizer_encode(t, s, n, &ids, &k);
	CHECK(rc == 0, "encode '%s': %s", s, moet_errmsg());
	int same = rc == 0 && k == n_want && (k == 0 || !memcmp(ids, want, k * sizeof(*ids)));
	CHECK(same, "encode '%s': %zu ids, want %zu (first %d)", s, k, n_want, k ? ids[0] : -1);
	char *back;
	size_t nb;
	if (rc == 0 && moet_tokenizer_decode(t, ids, k, 0, &back, &nb) == 0) {
		CHECK(nb == n && !memcmp(back, s, n), "round trip of '%s'", s);
		free(back);
	}
	free(ids);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / 4

static void test_small(void)
{
	json_t *root = small_json();
	int rc;
	moet_tokenizer *t = load_json(root, "small.json", &rc);
	CHECK(rc == 0, "load: %s", moet_errmsg());
	if (!t) {
		json_decref(root);
		return;
	}
	CHECK(moet_tokenizer_n_ids(t) == 263, "n_ids %d", moet_tokenizer_n_ids(t));
	expect_ids(t, "hello", 5, IDS(259));
	/* h e l l l l o: he, then ll leftmost twice, then he+ll; hell+ll and ll+o do not merge */
	expect_ids(t, "hellllo", 7, IDS(258, 257, 'o'));
	expect_ids(t, "hello world", 11, IDS(259, 260, 'o', 'r', 'l', 'd'));
	expect_ids(t, "<s>hello<s>", 11, IDS(261, 259, 261));
	expect_ids(t, "a<|x|>12", 8, IDS('a', 262, '1', '2'));
	expect_ids(t, "<s", 2, IDS('<', 's'));
	expect_ids(t, "\xc3\xa9\t", 3, IDS(0xc3, 0xa9, '\t'));
	expect_ids(t, "", 0, NULL, 0);
	CHECK(moet_tokenizer_is_special(t, 261) && !moet_tokenizer_is_special(t, 262),
	      "special flags");
	int32_t id = -1;
	CHECK(moet_tokenizer_find(t, "<|x|>", &id) == 0 && id == 262, "find <|x|>: %d", id);
	CHECK(moet_tokenizer_find(t, "nope", &id) == MOET_ENOTFOUND, "find nope");

	/* invalid UTF-8 input is refused with the offset */
	int32_t *ids = NULL;
	size_t k;
	rc = moet_tokenizer_encode(t, "ab\xff", 3, &ids, &k);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "byte 2"), "bad utf-8: %d %s", rc,
	      moet_errmsg());
	rc = moet_tokenizer_encode(t, "\xed\xa0\x80", 3, &ids, &k); /* a surrogate */
	CHECK(rc == MOET_EINVAL, "surrogate accepted");

	/* decode: skip_special, and bad ids */
	char *out;
	size_t n;
	rc = moet_tokenizer_decode(t, (const int32_t[]){261, 259}, 2, 1, &out, &n);
	CHECK(rc == 0 && n == 5 && !memcmp(out, "hello", 5), "skip special");
	if (rc == 0)
		free(out);
	rc = moet_tokenizer_decode(t, (const int32_t[]){259, 263}, 2, 0, &out, &n);
	CHECK(rc == MOET_ERANGE && strstr(moet_errmsg(), "ids[1]"), "bad id: %s", moet_errmsg());

	/* incremental decode: one byte token at a time */
	const int32_t seq[] = {'a', 0xc3, 0xa9, 0xff, 0xe2, 0x82, 'b', 0xf0, 0x9f, 0x98, 0x80,
			       0xf0, 0x9f};
	const size_t want_n[] = {1, 0, 2, 1, 0, 0, 3, 0, 0, 0, 4, 0, 0};
	moet_detok d;
	moet_detok_init(&d, t, 0);
	char acc[64];
	size_t na = 0;
	for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
		const char *p;
		rc = moet_detok_push(&d, seq[i], &p, &n);
		CHECK(rc == 0 && n == want_n[i], "push %zu: %zu bytes, want %zu", i, n, want_n[i]);
		memcpy(acc + na, p, n);
		na += n;
	}
	const char *p;
	rc = moet_detok_flush(&d, &p, &n);
	CHECK(rc == 0 && n == 2, "flush: %zu bytes", n);
	memcpy(acc + na, p, n);
	na += n;
	rc = moet_tokenizer_decode(t, seq, sizeof(seq) / sizeof(seq[0]), 0, &out, &n);
	CHECK(rc == 0 && n == na && !memcmp(out, acc, n), "incremental != whole");
	if (rc == 0)
		free(out);
	CHECK(moet_detok_push(&d, 999, &p, &n) == MOET_ERANGE, "detok bad id");
	moet_detok_free(&d);
	moet_tokenizer_destroy(t);

	/* a literal Split with behavior Removed, and the same inverted */
	json_t *step = json_array_get(json_object_get(json_object_get(root, "pre_tokenizer"),
						      "pretokenizers"), 0);
	json_object_set_new(step, "pattern", json_pack("{s:s}", "String", " "));
	json_object_set_new(step, "behavior", json_string("Removed"));
	t = load_json(root, "removed.json", &rc);
	CHECK(rc == 0, "load removed: %s", moet_errmsg());
	if (t) {
		rc = moet_tokenizer_encode(t, " hello  he ", 11, &ids, &k);
		CHECK(rc == 0 && k == 2 && ids[0] == 259 && ids[1] == 256, "Removed: %zu ids", k);
		free(ids);
		moet_tokenizer_destroy(t);
	}
	json_object_set_new(step, "invert", json_true());
	t = load_json(root, "inverted.json", &rc);
	CHECK(rc == 0, "load inverted: %s", moet_errmsg());
	if (t) {
		rc = moet_tokenizer_encode(t, "a  b", 4, &ids, &k);
		CHECK(rc == 0 && k == 2 && ids[0] == 32 && ids[1] == 32, "inverted: %zu ids", k);
		free(ids);
		moet_tokenizer_destroy(t);
	}
	json_decref(root);
}

/* ---- bad inputs -------------------------------------------------------------------------- */

typedef void (*mutate_fn)(json_t *root);
static json_t *model_of(json_t *r) { return json_object_get(r, "model"); }
static json_t *step0(json_t *r)
{
	return json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"),
					      "pretokenizers"), 0);
}
static void m_no_model(json_t *r) { json_object_del(r, "model"); }
static void m_unigram(json_t *r)
{
	json_object_set_new(model_of(r), "type", json_string("Unigram"));
}
static void m_no_type(json_t *r) { json_object_del(model_of(r), "type"); }
static void m_no_vocab(json_t *r) { json_object_del(model_of(r), "vocab"); }
static void m_no_merges(json_t *r) { json_object_del(model_of(r), "merges"); }
static void m_merge_nospace(json_t *r)
{
	json_array_set_new(json_object_get(model_of(r), "merges"), 0, json_string("he"));
}
static void m_merge_oov(json_t *r)
{
	json_array_set_new(json_object_get(model_of(r), "merges"), 1,
			   json_string("l \xe2\x82\xac"));
}
static void m_merge_result_oov(json_t *r)
{
	json_array_set_new(json_object_get(model_of(r), "merges"), 2, json_string("h o"));
}
static void m_merge_triple(json_t *r)
{
	json_array_set_new(json_object_get(model_of(r), "merges"), 4,
			   json_pack("[s, s, s]", "a", "b", "c"));
}
static void m_vocab_string_id(json_t *r)
{
	json_object_set_new(json_object_get(model_of(r), "vocab"), "he", json_string("256"));
}
static void m_vocab_negative(json_t *r)
{
	json_object_set_new(json_object_get(model_of(r), "vocab"), "he", json_integer(-5));
}
static void m_no_byte(json_t *r) { json_object_del(json_object_get(model_of(r), "vocab"), "a"); }
static void m_nfc(json_t *r)
{
	json_object_set_new(r, "normalizer", json_pack("{s:s}", "type", "NFC"));
}
static void m_bad_regex(json_t *r)
{
	json_object_set_new(step0(r), "pattern", json_pack("{s:s}", "Regex", "(\\p{L}"));
}
static void m_and_class(json_t *r)
{
	json_object_set_new(step0(r), "pattern", json_pack("{s:s}", "Regex", "[a-z&&[^aeiou]]"));
}
static void m_contiguous(json_t *r)
{
	json_object_set_new(step0(r), "behavior", json_string("Contiguous"));
}
static void m_no_decoder(json_t *r) { json_object_del(r, "decoder"); }
static void m_template(json_t *r)
{
	json_object_set_new(r, "post_processor", json_pack("{s:s}", "type", "TemplateProcessing"));
}
static void m_lstrip(json_t *r)
{
	json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 1), "lstrip",
			    json_true());
}
static void m_added_no_content(json_t *r)
{
	json_object_del(json_array_get(json_object_get(r, "added_tokens"), 0), "content");
}
static void m_prefix_space(json_t *r)
{
	json_t *list = json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers");
	json_object_set_new(json_array_get(list, 1), "add_prefix_space", json_true());
}
static void m_no_bytelevel(json_t *r)
{
	json_array_remove(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 1);
}
static void m_dropout(json_t *r) { json_object_set_new(model_of(r), "dropout", json_real(0.1)); }

static void test_bad(void)
{
	static const struct {
		mutate_fn f;
		int code;
		const char *needle; /* the JSON path the message must name */
	} cases[] = {
		{m_no_model, MOET_EFORMAT, "model: missing"},
		{m_unigram, MOET_EUNSUP, "model.type: 'Unigram'"},
		{m_no_type, MOET_EFORMAT, "model.type: missing"},
		{m_no_vocab, MOET_EFORMAT, "model.vocab"},
		{m_no_merges, MOET_EFORMAT, "model.merges"},
		{m_merge_nospace, MOET_EFORMAT, "model.merges[0]"},
		{m_merge_oov, MOET_EFORMAT, "model.merges[1]: token"},
		{m_merge_result_oov, MOET_EFORMAT, "model.merges[2]: the merged token"},
		{m_merge_triple, MOET_EFORMAT, "model.merges[4]"},
		{m_vocab_string_id, MOET_EFORMAT, "model.vocab.\"he\""},
		{m_vocab_negative, MOET_ERANGE, "model.vocab.\"he\""},
		{m_no_byte, MOET_EFORMAT, "no token for byte 0x61"},
		{m_nfc, MOET_EUNSUP, "normalizer"},
		{m_bad_regex, MOET_EUNSUP, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
		{m_and_class, MOET_EUNSUP, "'&&'"},
		{m_contiguous, MOET_EUNSUP, "pre_tokenizer.pretokenizers[0].behavior"},
		{m_no_decoder, MOET_EUNSUP, "decoder"},
		{m_template, MOET_EUNSUP, "post_processor"},
		{m_lstrip, MOET_EUNSUP, "added_tokens[1].lstrip"},
		{m_added_no_content, MOET_EFORMAT, "added_tokens[0].content"},
		{m_prefix_space, MOET_EUNSUP, "pretokenizers[1].add_prefix_space"},
		{m_no_bytelevel, MOET_EUNSUP, "no ByteLevel"},
		{m_dropout, MOET_EUNSUP, "model.dropout"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		json_t *root = small_json();
		cases[i].f(root);
		int rc;
		moet_tokenizer *t = load_json(root, "bad.json", &rc);
		const char *msg = moet_errmsg();
		CHECK(!t && rc == cases[i].code, "case %zu: rc %d want %d (%s)", i, rc,
		      cases[i].code, msg);
		CHECK(!strncmp(msg, "bad.json: ", 10) && strstr(msg, cases[i].needle) &&
		      !strchr(msg, '\n'), "case %zu: message '%s' lacks '%s'", i, msg,
		      cases[i].needle);
		moet_tokenizer_destroy(t);
		json_decref(root);
	}
	moet_tokenizer *t = NULL;
	int rc = moet_tokenizer_load_text("{\"model\": ", 10, "trunc.json", &t);
	CHECK(rc == MOET_EFORMAT && strstr(moet_errmsg(), "trunc.json: JSON"), "%s", moet_errmsg());
	rc = moet_tokenizer_load_text("[1]", 3, "arr.json", &t);
	CHECK(rc == MOET_EFORMAT && strstr(moet_errmsg(), "arr.json"), "%s", moet_errmsg());
	rc = moet_tokenizer_load("/nonexistent/tokenizer.json", &t);
	CHECK(rc == MOET_EIO && strstr(moet_errmsg(), "/nonexistent/tokenizer.json"), "%s",
	      moet_errmsg());
}

/* ---- DeepSeek-V3 against HF `tokenizers` ------------------------------------------------- */

static void print_escaped(const char *s, size_t n)
{
	for (size_t i = 0; i < n && i < 200; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			fprintf(stderr, "\\x%02x", c);
		else
			fputc(c, stderr);
	}
}

static void check_one(moet_tokenizer *t, const char *s, size_t n, const int32_t *ref, size_t nref,
		      size_t line, size_t *same, double *enc_s)
{
	int32_t *ids = NULL;
	size_t k = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = moet_tokenizer_encode(t, s, n, &ids, &k);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	*enc_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
	CHECK(rc == 0, "line %zu: encode: %s", line, moet_errmsg());
	int eq = rc == 0 && k == nref && (k == 0 || !memcmp(ids, ref, k * sizeof(*ids)));
	if (eq) {
		(*same)++;
	} else if (moet_test_failures < 10) {
		size_t d = 0;
		while (d < k && d < nref && ids[d] == ref[d])
			d++;
		fprintf(stderr, "line %zu: ids differ at %zu (ours %zu ids, HF %zu): "
			"ours %d, HF %d for '", line, d, k, nref, d < k ? ids[d] : -1,
			d < nref ? ref[d] : -1);
		print_escaped(s, n);
		fprintf(stderr, "'\n");
	}
	CHECK(eq, "line %zu: ids differ from HF tokenizers", line);
	char *back = NULL;
	size_t nb = 0;
	rc = moet_tokenizer_decode(t, ids, k, 0, &back, &nb);
	CHECK(rc == 0 && nb == n && !memcmp(back, s, n), "line %zu: decode(encode(s)) != s", line);
	free(back);
	rc = moet_tokenizer_decode(t, ref, nref, 0, &back, &nb);
	CHECK(rc == 0 && nb == n && !memcmp(back, s, n), "line %zu: decode(HF ids) != s", line);
	free(back);
	/* incremental: the pieces concatenated equal the whole, each piece valid UTF-8 */
	moet_detok d;
	moet_detok_init(&d, t, 0);
	char *acc = malloc(n + 8);
	size_t na = 0;
	for (size_t i = 0; acc && i <= nref; i++) {
		const char *p;
		size_t np;
		rc = i < nref ? moet_detok_push(&d, ref[i], &p, &np)
			      : moet_detok_flush(&d, &p, &np);
		if (rc || na + np > n) {
			CHECK(0, "line %zu: incremental decode: rc %d, %zu bytes", line, rc,
			      na + np);
			break;
		}
		CHECK(moet_utf8_valid_prefix(p, np) == np, "line %zu: piece %zu not UTF-8", line,
		      i);
		memcpy(acc + na, p, np);
		na += np;
	}
	CHECK(acc && na == n && !memcmp(acc, s, n), "line %zu: incremental != whole", line);
	free(acc);
	moet_detok_free(&d);
	free(ids);
}

static int test_reference(void)
{
	char path[4096], cmd[4200];
	snprintf(path, sizeof(path), "%s/data/tokenizers/deepseek-v3/tokenizer.json",
		 moet_test_shared_dir());
	FILE *probe = fopen(path, "rb");
	if (!probe) {
		printf("test_tokenizer: %s absent: DeepSeek-V3 reference skipped\n", path);
		return MOET_TEST_SKIP;
	}
	fclose(probe);
	moet_tokenizer *t = NULL;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = moet_tokenizer_load(path, &t);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK(rc == 0, "load %s: %s", path, moet_errmsg());
	if (rc)
		return 1;
	printf("test_tokenizer: loaded %d ids in %.0f ms\n", moet_tokenizer_n_ids(t),
	       1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec));
	snprintf(cmd, sizeof(cmd), "gzip -dc '%s/tests/runtime/tokenizer_ref/deepseek-v3.jsonl.gz'",
		 moet_test_source_dir());
	FILE *f = popen(cmd, "r");
	CHECK(f != NULL, "popen %s", cmd);
	char *line = NULL;
	size_t cap = 0, n_lines = 0, same = 0, bytes = 0;
	double enc_s = 0;
	while (f && getline(&line, &cap, f) > 0) {
		json_error_t err;
		json_t *o = json_loads(line, JSON_ALLOW_NUL, &err);
		const json_t *js = json_object_get(o, "s"), *ji = json_object_get(o, "ids");
		n_lines++;
		if (!json_is_string(js) || !json_is_array(ji)) {
			CHECK(0, "reference line %zu malformed", n_lines);
			json_decref(o);
			continue;
		}
		size_t nref = json_array_size(ji);
		int32_t *ref = malloc((nref + 1) * sizeof(*ref));
		for (size_t i = 0; ref && i < nref; i++)
			ref[i] = (int32_t)json_integer_value(json_array_get(ji, i));
		if (ref)
			check_one(t, json_string_value(js), json_string_length(js), ref, nref,
				  n_lines, &same, &enc_s);
		bytes += json_string_length(js);
		free(ref);
		json_decref(o);
	}
	free(line);
	CHECK(f && pclose(f) == 0, "gzip -dc failed");
	CHECK(n_lines >= 10000, "only %zu reference strings", n_lines);
	printf("test_tokenizer: %zu/%zu strings with ids identical to HF tokenizers; %zu bytes "
	       "encoded in %.1f ms (%.1f MB/s)\n", same, n_lines, bytes, 1e3 * enc_s,
	       enc_s > 0 ? (double)bytes / enc_s / 1e6 : 0.0);
	moet_tokenizer_destroy(t);
	return 0;
}

int main(void)
{
	test_small();
	test_bad();
	int rc = test_reference();
	if (rc == MOET_TEST_SKIP && !moet_test_failures)
		return MOET_TEST_SKIP;
	return moet_test_done("test_tokenizer");
}
