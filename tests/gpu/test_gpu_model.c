/*
 * test_gpu_model.c: the model graph on the CUDA backend against the CPU reference backend,
 * on every oracle fixture (tests/oracle/fixtures: checkpoints and greedy ids from
 * transformers):
 *   - the prompt's logits on CUDA equal the CPU backend's bit for bit (every gpu/ op returns
 *     the reference's bits), hence also transformers' within the oracle tolerance;
 *   - greedy generation on CUDA equals transformers' greedy ids;
 *   - batch invariance on the GPU: three sequences with ragged lengths at different positions
 *     in one batch give each sequence's solo logits bit for bit; a repeat run is identical;
 *   - with MOET_GPU_LINEAR=rows, auto (the default) and ksplit (dense linears of up to 16
 *     tokens by the row machinery or with K over the warps, gpu/linear_ks.cu) the prompt in
 *     chunks of 16 gives the CPU's logits again and greedy generation transformers' ids;
 *     linear_ks's calls counted (none with rows; some where hidden_size allows them).
 * All of it for both MLA forms (MOET_MLA=expanded, absorbed).
 * Skips (77) without a CUDA device or without the fixtures.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_model.h"
#include "moet_test.h"

static int64_t *read_ids(const char *path, const char *key, size_t *n)
{
	json_t *j = json_load_file(path, 0, NULL);
	json_t *a = j ? json_object_get(j, key) : NULL;
	*n = json_array_size(a);
	int64_t *ids = malloc((*n ? *n : 1) * sizeof(*ids));
	for (size_t i = 0; i < *n && ids; i++)
		ids[i] = json_integer_value(json_array_get(a, i));
	json_decref(j);
	return ids;
}

static int run(moet_model *m, const int64_t *tok, int64_t n, float *out)
{
	moet_kv *kv = NULL;
	int rc = moet_kv_create(m, n + 16, &kv);
	if (!rc)
		rc = moet_model_forward(m, kv, tok, n, out);
	moet_kv_destroy(kv);
	return rc;
}

/* The prompt in chunks of up to 16 tokens on one cache (each chunk's logits into out): calls
 * gpu/linear_ks.cu may take. Batch invariance makes them the
 * whole prompt's logits. */
static int run_chunked(moet_model *m, const int64_t *tok, int64_t n, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	moet_kv *kv = NULL;
	int rc = moet_kv_create(m, n + 16, &kv);
	for (int64_t at = 0; !rc && at < n; at += 16) {
		const int64_t c = n - at < 16 ? n - at : 16;
		rc = moet_model_forward(m, kv, tok + at, c, out + at * V);
	}
	moet_kv_destroy(kv);
	return rc;
}

static void batch_invariance(moet_model *m, const int64_t *tok, int64_t n_tok, const char *name)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	const int64_t hist[3] = { 5, 0, 2 }, nnew[3] = { 3, 7, 1 };
	moet_kv *solo[3] = { 0 }, *bat[3] = { 0 };
	float *want[3], *got[3];
	moet_seq_step steps[3];
	if (n_tok < 12)
		return;
	for (int s = 0; s < 3; s++) {
		want[s] = malloc((size_t)(nnew[s] * V) * sizeof(float));
		got[s] = malloc((size_t)(nnew[s] * V) * sizeof(float));
		CHECK(moet_kv_create(m, 16, &solo[s]) == 0 && moet_kv_create(m, 16, &bat[s]) == 0,
		      "kv");
		if (hist[s]) {
			CHECK(moet_model_forward(m, solo[s], tok + s, hist[s], NULL) == 0, "hist");
			CHECK(moet_model_forward(m, bat[s], tok + s, hist[s], NULL) == 0, "hist");
		}
		CHECK(moet_model_forward(m, solo[s], tok + s + hist[s], nnew[s], want[s]) == 0,
		      "solo: %s", moet_errmsg());
		steps[s] = (moet_seq_step){ .kv = bat[s], .tokens = tok + s + hist[s],
					    .n_tok = nnew[s], .out_logits = got[s] };
	}
	CHECK(moet_model_forward_batch(m, steps, 3) == 0, "batch: %s", moet_errmsg());
	for (int s = 0; s < 3; s++) {
		CHECK(memcmp(want[s], got[s], (size_t)(nnew[s] * V) * sizeof(float)) == 0,
		      "%s: sequence %d batched on the GPU differs from its solo run", name, s);
		moet_kv_destroy(solo[s]);
		moet_kv_destroy(bat[s]);
		free(want[s]);
		free(got[s]);
	}
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	char root[2048], dir[4096], path[4200];
	snprintf(root, sizeof(root), "%s/tests/oracle/fixtures", moet_test_source_dir());
	DIR *d = opendir(root);
	if (!d) {
		printf("skip: no fixtures at %s\n", root);
		return MOET_TEST_SKIP;
	}
	struct dirent *de;
	int n_fix = 0;
	for (int form = 0; form < 2; form++) {
	const char *form_name = form ? "absorbed" : "expanded";
	setenv("MOET_MLA", form_name, 1);
	rewinddir(d);
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", root, de->d_name);
		snprintf(path, sizeof(path), "%s/fixture.json", dir);
		size_t np = 0, ng = 0;
		int64_t *prompt = read_ids(path, "prompt", &np);
		int64_t *greedy = read_ids(path, "greedy", &ng);
		moet_model *cpu = NULL, *gpu = NULL;
		CHECK(moet_model_open_on(dir, "cpu", &cpu) == 0, "%s cpu: %s", de->d_name,
		      moet_errmsg());
		CHECK(moet_model_open_on(dir, "cuda", &gpu) == 0, "%s cuda: %s", de->d_name,
		      moet_errmsg());
		if (cpu && gpu && np) {
			const int64_t V = moet_model_config(cpu)->vocab_size;
			float *a = malloc(np * (size_t)V * sizeof(float));
			float *b = malloc(np * (size_t)V * sizeof(float));
			float *b2 = malloc(np * (size_t)V * sizeof(float));
			CHECK(run(cpu, prompt, (int64_t)np, a) == 0, "cpu forward: %s", moet_errmsg());
			CHECK(run(gpu, prompt, (int64_t)np, b) == 0, "gpu forward: %s", moet_errmsg());
			CHECK(run(gpu, prompt, (int64_t)np, b2) == 0, "gpu repeat: %s", moet_errmsg());
			size_t diff = 0, first = 0;
			for (size_t i = 0; i < np * (size_t)V; i++)
				if (memcmp(&a[i], &b[i], sizeof(float)) && !diff++)
					first = i;
			CHECK(diff == 0, "%s: %zu of %zu GPU logits differ from the CPU's (first at "
			      "row %zu col %zu: cpu %a gpu %a)", de->d_name, diff, np * (size_t)V,
			      first / (size_t)V, first % (size_t)V, a[first], b[first]);
			CHECK(memcmp(b, b2, np * (size_t)V * sizeof(float)) == 0,
			      "%s: GPU repeat run differs", de->d_name);
			int64_t *out = malloc((ng ? ng : 1) * sizeof(*out)), n_out = 0;
			CHECK(moet_model_generate(gpu, prompt, (int64_t)np, (int64_t)ng, 0, out,
						  &n_out) == 0 && n_out == (int64_t)ng &&
			      memcmp(out, greedy, ng * sizeof(*out)) == 0,
			      "%s: GPU greedy ids differ from transformers'", de->d_name);
			batch_invariance(gpu, prompt, (int64_t)np, de->d_name);
			/* the dense linears by the row machinery (MOET_GPU_LINEAR=rows), by the
			 * default rule (auto) and with K over the warps wherever it fits (ksplit),
			 * the prompt in chunks of 16 tokens: the CPU's logits again, and greedy ids;
			 * linear_ks taken by auto and ksplit wherever hidden_size is whole
			 * 128-column blocks (the fixtures' matrices are far below 16 rows per SM) */
			static const char *const lv[3] = { "rows", "", "ksplit" };
			const int ks_want = moet_model_config(gpu)->hidden_size % 128 == 0;
			for (int v = 0; v < 3; v++) {
				const uint64_t ks0 = moet_gpu_linear_ks_calls();
				setenv("MOET_GPU_LINEAR", lv[v], 1);
				memset(b2, 0, np * (size_t)V * sizeof(float));
				CHECK(run_chunked(gpu, prompt, (int64_t)np, b2) == 0, "gpu %s: %s",
				      lv[v], moet_errmsg());
				int64_t n_ks = 0;
				CHECK(moet_model_generate(gpu, prompt, (int64_t)np, (int64_t)ng, 0,
							  out, &n_ks) == 0 && n_ks == (int64_t)ng &&
				      memcmp(out, greedy, ng * sizeof(*out)) == 0,
				      "%s: GPU greedy ids with MOET_GPU_LINEAR=%s differ", de->d_name,
				      lv[v]);
				unsetenv("MOET_GPU_LINEAR");
				const uint64_t n_calls = moet_gpu_linear_ks_calls() - ks0;
				CHECK(v && ks_want ? n_calls > 0 : n_calls == 0,
				      "%s: %llu calls through linear_ks with MOET_GPU_LINEAR=%s (hidden "
				      "%lld)", de->d_name, (unsigned long long)n_calls, lv[v],
				      (long long)moet_model_config(gpu)->hidden_size);
				CHECK(memcmp(a, b2, np * (size_t)V * sizeof(float)) == 0,
				      "%s: GPU logits with MOET_GPU_LINEAR=%s (chunks of 16) differ "
				      "from the CPU's", de->d_name, lv[v]);
			}
			printf("%s (%s MLA): GPU logits %s the CPU's (%zu values); greedy %s\n",
			       de->d_name, form_name, diff ? "DIFFER from" : "equal", np * (size_t)V,
			       memcmp(out, greedy, ng * sizeof(*out)) ? "differs" : "equal");
			free(out);
			free(a);
			free(b);
			free(b2);
		}
		moet_model_close(cpu);
		moet_model_close(gpu);
		free(prompt);
		free(greedy);
		n_fix++;
	}
	}
	closedir(d);
	CHECK(n_fix > 0, "no fixtures found");
	return moet_test_done("test_gpu_model");
}
