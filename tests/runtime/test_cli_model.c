/*
 * test_cli_model.c: `moet-hybrid generate` and `logits` end to end on the oracle fixture
 * "groups" (a checkpoint and greedy ids made by transformers, tests/oracle):
 *   - generate prints exactly transformers' greedy continuation;
 *   - logits writes [T, vocab] float32 .npy bit-equal to moet_model_forward in process;
 *   - bad input (missing model, malformed --tokens, token outside the vocabulary, no
 *     arguments) exits non-zero with one line naming the problem; --help exits 0.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_model.h"
#include "moet_npy.h"
#include "moet_test.h"

static int count_lines(const char *s)
{
	int n = 0;
	for (; s && *s; s++)
		n += (*s == '\n');
	return n;
}

int main(void)
{
	char fx[2048], path[4096], cmd[16384], toks[8192] = "", want[1024] = "";
	snprintf(fx, sizeof(fx), "%s/tests/oracle/fixtures/groups", moet_test_source_dir());
	snprintf(path, sizeof(path), "%s/fixture.json", fx);
	json_t *j = json_load_file(path, 0, NULL);
	if (!j) {
		printf("skip: no fixture %s\n", path);
		return MOET_TEST_SKIP;
	}
	json_t *p = json_object_get(j, "prompt"), *g = json_object_get(j, "greedy");
	size_t np = json_array_size(p), ng = json_array_size(g);
	int64_t *ids = malloc(np * sizeof(*ids));
	for (size_t i = 0; i < np; i++) {
		ids[i] = json_integer_value(json_array_get(p, i));
		snprintf(toks + strlen(toks), sizeof(toks) - strlen(toks), "%s%lld", i ? "," : "",
			 (long long)ids[i]);
	}
	for (size_t i = 0; i < ng; i++)
		snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%lld", i ? "," : "",
			 (long long)json_integer_value(json_array_get(g, i)));
	strcat(want, "\n");
	json_decref(j);

	char *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s generate --model %s --tokens %s --max-new %zu --ignore-eos",
		 moet_test_bin(), fx, toks, ng);
	int rc = moet_test_run(cmd, &out);
	CHECK(rc == 0 && out && strcmp(out, want) == 0, "generate: rc %d, got '%s' want '%s'", rc,
	      out ? out : "", want);
	free(out);

	char *tmp = moet_test_mkdtemp("cli-logits");
	snprintf(path, sizeof(path), "%s/logits.npy", tmp);
	snprintf(cmd, sizeof(cmd), "%s logits --model %s --tokens %s --out %s", moet_test_bin(), fx,
		 toks, path);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 0, "logits: rc %d: %s", rc, out ? out : "");
	free(out);
	moet_npy a;
	moet_model *m = NULL;
	moet_kv *kv = NULL;
	if (moet_npy_read(path, &a) == 0) {
		CHECK(moet_model_open(fx, &m) == 0, "open: %s", moet_errmsg());
		int64_t V = m ? moet_model_config(m)->vocab_size : 0;
		CHECK(a.dtype == MOET_DT_F32 && a.ndim == 2 && a.shape[0] == (int64_t)np &&
		      a.shape[1] == V, "npy shape/dtype");
		float *ref = malloc(np * (size_t)V * sizeof(float));
		if (m && moet_kv_create(m, (int64_t)np, &kv) == 0 &&
		    moet_model_forward(m, kv, ids, (int64_t)np, ref) == 0)
			CHECK(memcmp(ref, a.data, np * (size_t)V * sizeof(float)) == 0,
			      "logits .npy differs from the in-process forward pass");
		free(ref);
		moet_kv_destroy(kv);
		moet_model_close(m);
		moet_npy_free(&a);
	} else {
		CHECK(0, "read %s: %s", path, moet_errmsg());
	}

	struct { const char *args; int want_rc; const char *needle; } bad[] = {
		{ "generate --model /nonexistent/model --tokens 1,2", 1, "/nonexistent/model" },
		{ "generate --model FX --tokens 1,x,3", 1, "--tokens" },
		{ "generate --model FX --tokens 1,99999", 1, "vocabulary" },
		{ "generate --model FX --tokens 1 --max-new 0", 1, "--max-new" },
		{ "logits --model FX --tokens -4 --out /tmp/x.npy", 1, "--tokens" },
		{ "logits --model FX --tokens 1 --out /nonexistent/dir/x.npy", 1, "/nonexistent/dir" },
		{ "generate --model FX --tokens 1 --device tpu", 1, "--device 'tpu'" },
		{ "generate --model FX --tokens 1 --device cuda", 1, "--device cuda" },
		{ "generate --model FX --tokens 1 --temperature 1 --top-p 2", 1, "top_p 2" },
		{ "generate --model FX --tokens 1 --temperature x", 1, "--temperature" },
		{ "generate", 2, "usage" },
		{ "logits --help", 0, "usage" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char args[4096];
		const char *at = strstr(bad[i].args, "FX");
		if (at)
			snprintf(args, sizeof(args), "%.*s%s%s", (int)(at - bad[i].args), bad[i].args,
				 fx, at + 2);
		else
			snprintf(args, sizeof(args), "%s", bad[i].args);
		snprintf(cmd, sizeof(cmd), "%s %s", moet_test_bin(), args);
		rc = moet_test_run(cmd, &out);
		CHECK(rc == bad[i].want_rc && out && strstr(out, bad[i].needle),
		      "'%s': rc %d (want %d), output '%s' lacks '%s'", args, rc, bad[i].want_rc,
		      out ? out : "", bad[i].needle);
		if (bad[i].want_rc == 1)
			CHECK(count_lines(out) == 1, "'%s': error should be one line: '%s'", args, out);
		free(out);
	}
	free(ids);
	free(tmp);
	return moet_test_done("test_cli_model");
}
