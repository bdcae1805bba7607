/*
 * test_chat.c: DeepSeek-V3's chat format (moet_chat.h).
 *
 *   1. a few conversations with the expected text written out here from the template;
 *   2. refusals: missing role/content, unknown role, tool messages, tool calls; each with its
 *      code, a detail naming the message, and no output;
 *   3. tests/runtime/chat_ref/deepseek-v3.jsonl.gz (make_chat_ref.py: 200 conversations
 *      rendered by jinja2 from the real template): byte-for-byte equal renders;
 *   4. with ../shared: the reference was made from the template now in tokenizer_config.json
 *      (and its bos/eos are our constants), and moet_chat_encode gives the ids HF `tokenizers`
 *      gave for the rendered text, starting with exactly one BOS.
 *      Skipped (77) without ../shared, after parts 1 to 3 have run.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_chat.h"
#include "moet_err.h"
#include "moet_test.h"
#include "moet_tokenizer.h"

#define U MOET_CHAT_USER
#define A MOET_CHAT_ASSISTANT
#define E MOET_CHAT_EOS
#define B MOET_CHAT_BOS

static void expect(const moet_chat_msg *m, size_t n, int gen, const char *want)
{
	char *got = NULL;
	size_t n_got = 0;
	int rc = moet_chat_render(m, n, gen, &got, &n_got);
	CHECK(rc == 0, "render: %s", moet_errmsg());
	if (rc)
		return;
	CHECK(n_got == strlen(want) && !memcmp(got, want, n_got), "got '%s' want '%s'", got, want);
	CHECK(got[n_got] == 0, "not NUL-terminated");
	free(got);
}

static void test_hand(void)
{
	/* the spelled-out tokens, byte by byte (U+FF5C = ef bd 9c, U+2581 = e2 96 81) */
	CHECK(!strcmp(B, "<｜begin▁of▁sentence｜>"), "BOS");
	CHECK(!strcmp(E, "<｜end▁of▁sentence｜>"), "EOS");
	CHECK(!strcmp(U, "<｜User｜>") && !strcmp(A, "<｜Assistant｜>"), "roles");

	expect(NULL, 0, 0, "<｜begin▁of▁sentence｜>");
	expect(NULL, 0, 1, "<｜begin▁of▁sentence｜><｜Assistant｜>");
	moet_chat_msg m1[] = {{"user", "Hi"}};
	expect(m1, 1, 1, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");
	expect(m1, 1, 0, "<｜begin▁of▁sentence｜><｜User｜>Hi");
	/* systems hoisted to the front and joined by a blank line; assistant ended by EOS */
	moet_chat_msg m2[] = {{"system", "S1"}, {"user", "q1"}, {"assistant", "a1"},
			      {"system", "S2"}, {"user", ""}, {"system", ""}};
	expect(m2, 6, 1, "<｜begin▁of▁sentence｜>S1\n\nS2\n\n<｜User｜>q1<｜Assistant｜>a1"
			 "<｜end▁of▁sentence｜><｜User｜><｜Assistant｜>");
	moet_chat_msg m3[] = {{"assistant", " x\n"}, {"assistant", ""}};
	expect(m3, 2, 0, "<｜begin▁of▁sentence｜><｜Assistant｜> x\n<｜end▁of▁sentence｜>"
			 "<｜Assistant｜><｜end▁of▁sentence｜>");
}

static void refuse(const moet_chat_msg *m, size_t n, int want_rc, const char *want_detail)
{
	char *got = (char *)1;
	size_t n_got = 7;
	int rc = moet_chat_render(m, n, 1, &got, &n_got);
	CHECK(rc == want_rc, "rc %d want %d (%s)", rc, want_rc, want_detail);
	CHECK(got == NULL && n_got == 0, "output left on failure (%s)", want_detail);
	CHECK(strstr(moet_errmsg(), want_detail) && !strchr(moet_errmsg(), '\n'),
	      "detail '%s' lacks '%s'", moet_errmsg(), want_detail);
}

static void test_refusals(void)
{
	moet_chat_msg noro[] = {{"user", "a"}, {NULL, "b"}};
	refuse(noro, 2, MOET_EINVAL, "messages[1].role: missing");
	moet_chat_msg unk[] = {{"developer", "a"}};
	refuse(unk, 1, MOET_EINVAL, "messages[0].role: 'developer' is not system, user or");
	moet_chat_msg tool[] = {{"user", "a"}, {"assistant", "b"}, {"tool", "42"}};
	refuse(tool, 3, MOET_EUNSUP, "messages[2]: role 'tool'");
	moet_chat_msg calls[] = {{"user", "a"}, {"assistant", NULL}};
	refuse(calls, 2, MOET_EUNSUP, "messages[1]: an assistant message without content");
	moet_chat_msg nouser[] = {{"system", "s"}, {"user", NULL}};
	refuse(nouser, 2, MOET_EINVAL, "messages[1].content: missing");
	moet_chat_msg nosys[] = {{"system", NULL}};
	refuse(nosys, 1, MOET_EINVAL, "messages[0].content: missing");
	size_t n = 0;
	CHECK(moet_chat_render(NULL, 1, 0, NULL, &n) == MOET_EINVAL, "NULL out_text");
}

/* One reference line: its messages as moet_chat_msg (borrowing o's strings). */
static moet_chat_msg *ref_msgs(const json_t *o, size_t *out_n)
{
	const json_t *jm = json_object_get(o, "messages");
	size_t n = json_array_size(jm);
	moet_chat_msg *m = calloc(n + 1, sizeof(*m));
	for (size_t i = 0; m && i < n; i++) {
		const json_t *e = json_array_get(jm, i);
		m[i].role = json_string_value(json_object_get(e, "role"));
		m[i].content = json_string_value(json_object_get(e, "content"));
	}
	*out_n = n;
	return m;
}

static void check_encode(const moet_tokenizer *t, const moet_chat_msg *m, size_t n, int gen,
			 const json_t *jids, size_t line, size_t *n_same)
{
	int32_t *ids = NULL, bos = -1;
	size_t n_ids = 0;
	int rc = moet_chat_encode(t, m, n, gen, &ids, &n_ids);
	CHECK(rc == 0, "line %zu: encode: %s", line, moet_errmsg());
	if (rc)
		return;
	CHECK(moet_tokenizer_find(t, MOET_CHAT_BOS, &bos) == 0, "no BOS id");
	size_t n_bos = 0;
	for (size_t i = 0; i < n_ids; i++)
		n_bos += ids[i] == bos;
	CHECK(n_ids > 0 && ids[0] == bos && n_bos == 1, "line %zu: %zu BOS ids, first id %d",
	      line, n_bos, n_ids ? (int)ids[0] : -1);
	size_t nref = json_array_size(jids), k = 0;
	while (k < n_ids && k < nref &&
	       ids[k] == (int32_t)json_integer_value(json_array_get(jids, k)))
		k++;
	CHECK(k == n_ids && k == nref, "line %zu: ids differ from HF at %zu (%zu vs %zu ids)", line,
	      k, n_ids, nref);
	*n_same += k == n_ids && k == nref;
	free(ids);
}

/* Parts 3 and 4; t may be NULL (no ../shared): then only the renders are compared. */
static void test_reference(const moet_tokenizer *t, const char *shared_template)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "gzip -dc '%s/tests/runtime/chat_ref/deepseek-v3.jsonl.gz'",
		 moet_test_source_dir());
	FILE *f = popen(cmd, "r");
	CHECK(f != NULL, "popen %s", cmd);
	char *line = NULL;
	size_t cap = 0, n_lines = 0, same = 0, same_ids = 0;
	while (f && getline(&line, &cap, f) > 0) {
		json_error_t err;
		json_t *o = json_loads(line, 0, &err);
		CHECK(o != NULL, "reference line %zu: %s", n_lines + 1, err.text);
		if (!o)
			continue;
		if (n_lines++ == 0) { /* the header: what the renders were made from */
			const char *tmpl = json_string_value(json_object_get(o, "chat_template"));
			const char *bos = json_string_value(json_object_get(o, "bos_token"));
			const char *eos = json_string_value(json_object_get(o, "eos_token"));
			CHECK(bos && !strcmp(bos, MOET_CHAT_BOS), "reference bos_token");
			CHECK(eos && !strcmp(eos, MOET_CHAT_EOS), "reference eos_token");
			CHECK(!shared_template || (tmpl && !strcmp(tmpl, shared_template)),
			      "the reference was rendered from another chat_template than "
			      "tokenizer_config.json's: rerun make_chat_ref.py");
			json_decref(o);
			continue;
		}
		const json_t *jt = json_object_get(o, "text");
		int gen = json_is_true(json_object_get(o, "add_generation_prompt"));
		size_t n = 0;
		moet_chat_msg *m = ref_msgs(o, &n);
		char *got = NULL;
		size_t n_got = 0;
		int rc = m ? moet_chat_render(m, n, gen, &got, &n_got) : MOET_ENOMEM;
		CHECK(rc == 0, "line %zu: render: %s", n_lines, moet_errmsg());
		const char *want = json_string_value(jt);
		size_t n_want = json_string_length(jt), k = 0;
		while (got && want && k < n_got && k < n_want && got[k] == want[k])
			k++;
		int ok = got && want && k == n_got && k == n_want;
		CHECK(ok, "line %zu: render differs at byte %zu (%zu vs %zu bytes): got '%.40s' "
		      "want '%.40s'", n_lines, k, n_got, n_want, got ? got + k : "",
		      want ? want + k : "");
		same += ok;
		if (t)
			check_encode(t, m, n, gen, json_object_get(o, "ids"), n_lines, &same_ids);
		free(got);
		free(m);
		json_decref(o);
	}
	free(line);
	CHECK(f && pclose(f) == 0, "gzip -dc failed");
	CHECK(n_lines == 201, "%zu reference lines, want 1 + 200", n_lines);
	printf("test_chat: %zu/%zu renders identical to jinja2's", same, n_lines ? n_lines - 1 : 0);
	if (t)
		printf("; %zu/%zu encodings identical to HF tokenizers' with one BOS", same_ids,
		       n_lines ? n_lines - 1 : 0);
	printf("\n");
}

/* tokenizer_config.json's chat_template (malloc'd), or NULL when absent. */
static char *shared_template(const char *dir)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	json_error_t err;
	json_t *o = json_load_file(path, 0, &err);
	if (!o)
		return NULL;
	const char *s = json_string_value(json_object_get(o, "chat_template"));
	char *r = s ? strdup(s) : NULL;
	CHECK(r != NULL, "%s: no chat_template", path);
	json_decref(o);
	return r;
}

int main(void)
{
	test_hand();
	test_refusals();
	char dir[4096], path[4200];
	snprintf(dir, sizeof(dir), "%s/data/tokenizers/deepseek-v3", moet_test_shared_dir());
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	char *tmpl = shared_template(dir);
	moet_tokenizer *t = NULL;
	if (tmpl) {
		int rc = moet_tokenizer_load(path, &t);
		CHECK(rc == 0, "load %s: %s", path, moet_errmsg());
	}
	test_reference(t, tmpl);
	int skip = !tmpl;
	if (skip)
		printf("test_chat: %s/tokenizer_config.json absent: template and encode checks "
		       "skipped\n", dir);
	free(tmpl);
	moet_tokenizer_destroy(t);
	if (skip && !moet_test_failures)
		return MOET_TEST_SKIP;
	return moet_test_done("test_chat");
}
