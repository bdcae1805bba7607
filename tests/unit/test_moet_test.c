/*
 * test_moet_test.c: the shared test helpers of tests/moet_test.h that other tests lean on
 * for their setup, checked on their own so that a broken helper fails here by name rather
 * than as a puzzle in every test that uses it:
 *
 *   1. moet_test_read_file against moet_test_write_file: bytes with NULs inside come back
 *      whole with a NUL after them; an empty file; a missing path and a directory give NULL
 *      and a zero length;
 *   2. moet_test_gen_open: the directory holds the checkpoint of these parameters (its
 *      config.json states the requested layer count, and the opened model has it too);
 *   3. their failures: parameters the generator refuses, and a backend that does not exist,
 *      are each one counted CHECK failure and a NULL model, never a crash; the directory is
 *      handed back when only the open failed.
 */
#include <string.h>

#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

static void rm_rf(const char *dir)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK(moet_test_run(cmd, NULL) == 0, "%s", cmd);
}

static void test_read_file(const char *dir)
{
	char path[4096];
	const unsigned char want[7] = { 'a', 0, 'b', 0xff, 0, 'c', '\n' };
	snprintf(path, sizeof(path), "%s/bytes.bin", dir);
	CHECK(moet_test_write_file(path, want, sizeof(want)) == 0, "write %s", path);
	size_t n = 99;
	unsigned char *got = moet_test_read_file(path, &n);
	CHECK(got && n == sizeof(want) && !memcmp(got, want, sizeof(want)) && got[n] == 0,
	      "%s: %zu bytes back, want 7 and a NUL after them", path, n);
	free(got);

	snprintf(path, sizeof(path), "%s/empty", dir);
	CHECK(moet_test_write_file(path, "", 0) == 0, "write %s", path);
	n = 99;
	got = moet_test_read_file(path, &n);
	CHECK(got && n == 0 && got[0] == 0, "empty file: %p, %zu bytes", (void *)got, n);
	free(got);

	snprintf(path, sizeof(path), "%s/missing", dir);
	n = 99;
	got = moet_test_read_file(path, &n);
	CHECK(!got && n == 0, "missing file: %p, %zu bytes", (void *)got, n);
	free(got);

	n = 99;
	got = moet_test_read_file(dir, &n);
	CHECK(!got && n == 0, "a directory: %p, %zu bytes", (void *)got, n);
	free(got);
}

static void test_gen_open(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 2;
	gp.n_layers = 3;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("helpers-gen", &gp, &dir);
	CHECK(m && dir, "tiny checkpoint: model %p, dir %s", (void *)m, dir ? dir : "(null)");
	if (m)
		CHECK(moet_model_config(m)->num_hidden_layers == 3, "opened model has %lld layers",
		      (long long)moet_model_config(m)->num_hidden_layers);
	if (dir) {
		char path[4096];
		size_t n = 0;
		snprintf(path, sizeof(path), "%s/config.json", dir);
		char *cfg = moet_test_read_file(path, &n);
		CHECK(cfg && strstr(cfg, "\"num_hidden_layers\": 3"), "%s: %s", path,
		      cfg ? cfg : "unreadable");
		free(cfg);
		rm_rf(dir);
	}
	moet_model_close(m);
	free(dir);
}

/* Each expected failure: exactly one CHECK counted (then taken back), a NULL model. */
static void test_failures(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.hot_share = 1.5; /* outside (0, 1): the generator refuses it */
	char *dir = (char *)"untouched";
	int before = moet_test_failures;
	moet_model *m = moet_test_gen_open("helpers-bad-gen", &gp, &dir);
	int counted = moet_test_failures - before;
	moet_test_failures = before;
	CHECK(!m && !dir && counted == 1, "refused parameters: model %p, dir %p, %d failures",
	      (void *)m, (void *)dir, counted);
	moet_model_close(m);
	free(dir);

	before = moet_test_failures;
	char *gdir = moet_test_gen("helpers-bad-gen", &gp);
	counted = moet_test_failures - before;
	moet_test_failures = before;
	CHECK(!gdir && counted == 1, "moet_test_gen, refused parameters: %p, %d failures",
	      (void *)gdir, counted);
	free(gdir);

	moet_gen_params_init(&gp);
	gp.n_layers = 2;
	dir = NULL;
	before = moet_test_failures;
	m = moet_test_gen_open_on("helpers-bad-dev", &gp, "tpu", &dir);
	counted = moet_test_failures - before;
	moet_test_failures = before;
	CHECK(!m && dir && counted == 1, "device 'tpu': model %p, dir %s, %d failures", (void *)m,
	      dir ? dir : "(null)", counted);
	moet_model_close(m);
	if (dir)
		rm_rf(dir);
	free(dir);
}

int main(void)
{
	char *dir = moet_test_mkdtemp("helpers");
	CHECK(dir, "scratch directory under %s", moet_test_tmp_dir());
	if (!dir)
		return moet_test_done("test_moet_test");
	test_read_file(dir);
	test_gen_open();
	test_failures();
	rm_rf(dir);
	free(dir);
	return moet_test_done("test_moet_test");
}
