/*
 * test_oracle.c: the CPU reference model against the outside oracle (transformers, float64).
 *
 * For every fixture folder under $MOET_SOURCE_DIR/tests/oracle/fixtures (made by
 * make_fixtures.py; see README.md there):
 *   1. logits: the prompt in ONE moet_model_forward call; at every position t,
 *        max_v |logit[t][v] - ref[t][v]| <= tolerance x max_v |ref[t][v]|
 *      (tolerance from fixture.json); the worst ratio of each fixture is printed;
 *   2. greedy: moet_model_generate (no stop at EOS) gives exactly fixture.json's "greedy" ids
 *      (the fixtures were chosen so that every greedy step has a top-2 gap > 1e-3 x max|logit|
 *      and every routing decision a relative margin > 1e-4 in float64);
 *   3. batch invariance: the prompt fed one token at a time into a fresh KV cache gives logits
 *      bit-identical (memcmp) to the one-call run.
 * Skips (77) only when the fixtures folder is absent.
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "moet_err.h"
#include "moet_model.h"
#include "moet_npy.h"
#include "moet_test.h"

#define MAX_FIXTURES 64

/*
 * Known gaps between a fixture's real layout and what the runtime accepts. Such a fixture
 * still runs: its failure prints as XFAIL with the reason; if it passes, that is a failure
 * (XPASS) so that the entry is removed rather than left to hide a regression.
 */
static const struct {
	const char *name;
	const char *reason;
} xfail[] = {
	/* { "fixture-name", "why the runtime cannot take it yet" }, */
	{ NULL, NULL },
};

static const char *xfail_reason(const char *name)
{
	for (size_t i = 0; i < sizeof(xfail) / sizeof(xfail[0]); i++)
		if (xfail[i].name && strcmp(xfail[i].name, name) == 0)
			return xfail[i].reason;
	return NULL;
}

typedef struct fixture {
	int64_t *prompt;
	int64_t n_prompt;
	int64_t *greedy;
	int64_t n_greedy;
	double tolerance;
} fixture;

static void fixture_free(fixture *f)
{
	free(f->prompt);
	free(f->greedy);
	memset(f, 0, sizeof(*f));
}

static int int_array(json_t *root, const char *key, const char *path, int64_t **out,
		     int64_t *out_n)
{
	json_t *a = json_object_get(root, key);
	if (!json_is_array(a) || json_array_size(a) == 0) {
		fprintf(stderr, "%s: \"%s\" is not a non-empty array\n", path, key);
		return -1;
	}
	size_t n = json_array_size(a);
	*out = calloc(n, sizeof(int64_t));
	if (!*out)
		return -1;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(a, i);
		if (!json_is_integer(v)) {
			fprintf(stderr, "%s: \"%s\"[%zu] is not an integer\n", path, key, i);
			return -1;
		}
		(*out)[i] = json_integer_value(v);
	}
	*out_n = (int64_t)n;
	return 0;
}

static int fixture_load(const char *dir, fixture *f)
{
	char path[4096 + 400];
	json_error_t jerr;
	memset(f, 0, sizeof(*f));
	snprintf(path, sizeof(path), "%s/fixture.json", dir);
	json_t *root = json_load_file(path, 0, &jerr);
	if (!root) {
		fprintf(stderr, "%s:%d: %s\n", path, jerr.line, jerr.text);
		return -1;
	}
	int rc = -1;
	json_t *tol = json_object_get(root, "tolerance");
	if (!json_is_number(tol) || !(json_number_value(tol) > 0)) {
		fprintf(stderr, "%s: \"tolerance\" is not a positive number\n", path);
		goto out;
	}
	f->tolerance = json_number_value(tol);
	if (int_array(root, "prompt", path, &f->prompt, &f->n_prompt) ||
	    int_array(root, "greedy", path, &f->greedy, &f->n_greedy))
		goto out;
	rc = 0;
out:
	json_decref(root);
	return rc;
}

/* One fixture; failures are counted through CHECK. */
static void run_fixture(const char *name, const char *dir)
{
	char path[4096 + 400];
	fixture fx;
	moet_npy ref = { 0 };
	moet_model *m = NULL;
	moet_kv *kv = NULL;
	float *one = NULL, *step = NULL;
	int64_t *ids = NULL;
	int rc;

	if (fixture_load(dir, &fx)) {
		CHECK(0, "%s: fixture.json unusable", name);
		return;
	}
	snprintf(path, sizeof(path), "%s/ref_logits.npy", dir);
	rc = moet_npy_read(path, &ref);
	CHECK(rc == 0, "%s: %s", name, moet_errmsg());
	if (rc)
		goto out;
	rc = moet_model_open(dir, &m);
	CHECK(rc == 0, "%s: moet_model_open: %s: %s", name, moet_strerror(rc), moet_errmsg());
	if (rc)
		goto out;
	const int64_t T = fx.n_prompt, V = moet_model_config(m)->vocab_size;
	bool shape_ok = ref.dtype == MOET_DT_F64 && ref.ndim == 2 && ref.shape[0] == T &&
			ref.shape[1] == V;
	CHECK(shape_ok, "%s: ref_logits.npy is not float64 [%lld, %lld]", name, (long long)T,
	      (long long)V);
	if (!shape_ok)
		goto out;
	const double *r = ref.data;
	one = malloc((size_t)(T * V) * sizeof(float));
	step = malloc((size_t)V * sizeof(float));
	ids = calloc((size_t)fx.n_greedy, sizeof(int64_t));
	if (!one || !step || !ids) {
		CHECK(0, "%s: out of memory", name);
		goto out;
	}

	/* 1. One call against the oracle. */
	rc = moet_kv_create(m, T, &kv);
	CHECK(rc == 0, "%s: moet_kv_create: %s", name, moet_errmsg());
	if (rc)
		goto out;
	rc = moet_model_forward(m, kv, fx.prompt, T, one);
	CHECK(rc == 0, "%s: moet_model_forward: %s", name, moet_errmsg());
	if (rc)
		goto out;
	double worst = 0;
	int64_t worst_t = 0, worst_v = 0, bad_rows = 0, argmax_diff = 0;
	for (int64_t t = 0; t < T; t++) {
		double rmax = 0, dmax = 0;
		int64_t dv = 0, am_ref = 0, am_got = 0;
		for (int64_t v = 0; v < V; v++) {
			double want = r[t * V + v], got = one[t * V + v];
			if (fabs(want) > rmax)
				rmax = fabs(want);
			double d = fabs(got - want);
			if (!(d <= dmax)) { /* NaN counts as the worst */
				dmax = isnan(d) ? INFINITY : d;
				dv = v;
			}
			if (want > r[t * V + am_ref])
				am_ref = v;
			if (got > one[t * V + am_got])
				am_got = v;
		}
		double ratio = rmax > 0 ? dmax / rmax : (dmax > 0 ? INFINITY : 0);
		if (ratio > fx.tolerance)
			bad_rows++;
		if (am_ref != am_got)
			argmax_diff++;
		if (!(ratio <= worst)) {
			worst = ratio;
			worst_t = t;
			worst_v = dv;
		}
	}
	printf("%s: worst |logit - ref| / max|ref row| = %.3e at position %lld (vocab %lld: got "
	       "%.9g, ref %.9g); tolerance %.1e; %lld of %lld rows over; argmax differs in %lld rows\n",
	       name, worst, (long long)worst_t, (long long)worst_v,
	       (double)one[worst_t * V + worst_v], r[worst_t * V + worst_v], fx.tolerance,
	       (long long)bad_rows, (long long)T, (long long)argmax_diff);
	CHECK(bad_rows == 0, "%s: %lld positions exceed the tolerance (worst %.3e at %lld)", name,
	      (long long)bad_rows, worst, (long long)worst_t);

	/* 2. Greedy continuation. */
	int64_t n_out = 0;
	rc = moet_model_generate(m, fx.prompt, T, fx.n_greedy, 0, ids, &n_out);
	CHECK(rc == 0, "%s: moet_model_generate: %s", name, moet_errmsg());
	if (rc == 0) {
		CHECK(n_out == fx.n_greedy, "%s: generated %lld ids, expected %lld", name,
		      (long long)n_out, (long long)fx.n_greedy);
		for (int64_t i = 0; i < n_out && i < fx.n_greedy; i++) {
			if (ids[i] != fx.greedy[i]) {
				CHECK(0, "%s: greedy id %lld is %lld, oracle says %lld", name,
				      (long long)i, (long long)ids[i], (long long)fx.greedy[i]);
				break;
			}
		}
	}

	/* 3. Token by token into a fresh cache: bit-identical to the one-call logits. */
	moet_kv_destroy(kv);
	kv = NULL;
	rc = moet_kv_create(m, T, &kv);
	CHECK(rc == 0, "%s: moet_kv_create: %s", name, moet_errmsg());
	if (rc)
		goto out;
	for (int64_t t = 0; t < T; t++) {
		rc = moet_model_forward(m, kv, &fx.prompt[t], 1, step);
		CHECK(rc == 0, "%s: token %lld: moet_model_forward: %s", name, (long long)t,
		      moet_errmsg());
		if (rc)
			goto out;
		if (memcmp(step, one + t * V, (size_t)V * sizeof(float)) != 0) {
			int64_t v = 0;
			while (v < V && memcmp(&step[v], &one[t * V + v], sizeof(float)) == 0)
				v++;
			uint32_t a, b;
			memcpy(&a, &step[v], 4);
			memcpy(&b, &one[t * V + v], 4);
			CHECK(0, "%s: position %lld token-by-token differs from one call at vocab %lld: "
			      "0x%08x vs 0x%08x", name, (long long)t, (long long)v, a, b);
			break;
		}
	}
	CHECK(moet_kv_len(kv) == T, "%s: kv length %lld after %lld tokens", name,
	      (long long)moet_kv_len(kv), (long long)T);
out:
	free(one);
	free(step);
	free(ids);
	moet_kv_destroy(kv);
	moet_model_close(m);
	moet_npy_free(&ref);
	fixture_free(&fx);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
	char root[4096];
	snprintf(root, sizeof(root), "%s/tests/oracle/fixtures", moet_test_source_dir());
	DIR *d = opendir(root);
	if (!d) {
		printf("test_oracle: %s absent: skipped\n", root);
		return MOET_TEST_SKIP;
	}
	char *names[MAX_FIXTURES];
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < MAX_FIXTURES) {
		char p[4096 + 300];
		struct stat st;
		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s/fixture.json", root, e->d_name);
		if (stat(p, &st) == 0)
			names[n++] = strdup(e->d_name);
	}
	closedir(d);
	CHECK(n > 0, "%s holds no fixture", root);
	qsort(names, (size_t)n, sizeof(names[0]), cmp_str);
	for (int i = 0; i < n; i++) {
		char dir[4096 + 300];
		snprintf(dir, sizeof(dir), "%s/%s", root, names[i]);
		int before = moet_test_failures;
		const char *why = xfail_reason(names[i]);
		run_fixture(names[i], dir);
		bool failed = moet_test_failures != before;
		if (why && failed) {
			moet_test_failures = before;
			printf("%s: XFAIL (expected failure: %s)\n", names[i], why);
		} else if (why) {
			CHECK(0, "%s: XPASS: passes although listed as a known gap; remove it from "
			      "xfail[] in test_oracle.c", names[i]);
		} else {
			printf("%s: %s\n", names[i], failed ? "FAILED" : "ok");
		}
		free(names[i]);
	}
	return moet_test_done("test_oracle");
}
