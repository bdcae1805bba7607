/*
 * test_ckpt.c: moet_ckpt_open over directories written by st_build.h: a valid two-shard
 * checkpoint with its index (lookups, shapes, data read in place, shard sizes against
 * stat(), each shard mapped read-only and shared as /proc/self/maps says), a single-file
 * checkpoint, and each index/shard disagreement, which must fail with a one-line message
 * naming the file and the tensor.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_test.h"
#include "st_build.h"

#define S1 "model-00001-of-00002.safetensors"
#define S2 "model-00002-of-00002.safetensors"
#define IDX "model.safetensors.index.json"

static int one_line(const char *s)
{
	return s[0] && !strchr(s, '\n');
}

static char *path_of(const char *dir, const char *file)
{
	size_t n = strlen(dir) + strlen(file) + 2;
	char *p = malloc(n);
	snprintf(p, n, "%s/%s", dir, file);
	return p;
}

static char *fresh_dir(const char *tag)
{
	char *d = moet_test_mkdtemp(tag);
	if (!d) {
		fprintf(stderr, "cannot make a scratch directory under %s\n", moet_test_tmp_dir());
		exit(1);
	}
	return d;
}

/* Shard 1: a, b; shard 2: c, d. The contents of `a` are known floats. */
static const float a_vals[4] = { 0.5f, -1.0f, 2.0f, 3.25f };

static void write_shards(const char *dir, int with_extra_in_s2, int dup_a_in_s2)
{
	stb_tensor t1[] = {
		{ .name = "a", .dtype = "F32", .ndim = 2, .shape = { 2, 2 }, .data = a_vals },
		{ .name = "b", .dtype = "BF16", .ndim = 1, .shape = { 3 } },
	};
	stb_tensor t2[] = {
		{ .name = "c", .dtype = "F8_E4M3", .ndim = 2, .shape = { 4, 4 } },
		{ .name = "d", .dtype = "F32", .ndim = 0 },
		{ .name = with_extra_in_s2 ? "extra" : "a", .dtype = "U8", .ndim = 1,
		  .shape = { 1 } },
	};
	size_t n;
	uint8_t *img = stb_build(t1, 2, NULL, &n);
	CHECK(stb_write(dir, S1, img, n) == 0, "write %s", S1);
	free(img);
	img = stb_build(t2, (with_extra_in_s2 || dup_a_in_s2) ? 3 : 2, NULL, &n);
	CHECK(stb_write(dir, S2, img, n) == 0, "write %s", S2);
	free(img);
}

static const char *index_ok = "{\"metadata\": {\"total_size\": 40}, \"weight_map\": {"
			      "\"a\": \"" S1 "\", \"b\": \"" S1 "\", \"c\": \"" S2 "\", "
			      "\"d\": \"" S2 "\"}}";

static off_t file_size(const char *dir, const char *file)
{
	char *p = path_of(dir, file);
	struct stat st;
	off_t r = stat(p, &st) == 0 ? st.st_size : -1;
	free(p);
	return r;
}

/* The permissions of the mapping that holds p, as /proc/self/maps gives them ("r--s"), into
 * perm[5]; 0 found, -1 not. */
static int map_perms(const void *p, char perm[5])
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int rc = -1;
	while (f && rc && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perm) == 3 && (uintptr_t)p >= lo &&
		    (uintptr_t)p < hi)
			rc = 0;
	}
	if (f)
		fclose(f);
	return rc;
}

static void test_valid(void)
{
	char *dir = fresh_dir("ckpt-valid");
	write_shards(dir, 0, 0);
	stb_write_text(dir, IDX, index_ok);
	moet_ckpt *ck = NULL;
	int rc = moet_ckpt_open(dir, &ck);
	CHECK(rc == 0, "open: %s", moet_errmsg());
	if (rc) {
		stb_rmdir(dir);
		return;
	}
	CHECK(moet_ckpt_count(ck) == 4, "count %zu", moet_ckpt_count(ck));
	CHECK(moet_ckpt_shard_count(ck) == 2, "shards %d", moet_ckpt_shard_count(ck));
	char *p1 = path_of(dir, S1), *p2 = path_of(dir, S2);
	CHECK(!strcmp(moet_ckpt_shard_path(ck, 0), p1), "shard 0 path %s",
	      moet_ckpt_shard_path(ck, 0));
	CHECK(!strcmp(moet_ckpt_shard_path(ck, 1), p2), "shard 1 path %s",
	      moet_ckpt_shard_path(ck, 1));
	CHECK((off_t)moet_ckpt_shard_bytes(ck, 0) == file_size(dir, S1), "shard 0 bytes");
	CHECK((off_t)moet_ckpt_shard_bytes(ck, 1) == file_size(dir, S2), "shard 1 bytes");
	CHECK(!strcmp(moet_ckpt_dir(ck), dir), "dir");
	/* read-only and shared: page-locking a private file mapping copies every page into
	 * anonymous memory, or on a disk filesystem did not finish (docs/hybrid.md) */
	for (int i = 0; i < 2; i++) {
		char perm[5] = "";
		CHECK(map_perms(moet_ckpt_shard_base(ck, i), perm) == 0 && !strcmp(perm, "r--s"),
		      "shard %d mapped '%s', want r--s (read-only, shared)", i, perm);
	}
	static const char *names[] = { "a", "b", "c", "d" };
	for (size_t i = 0; i < 4; i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		CHECK(t && !strcmp(t->name, names[i]), "at(%zu) = %s", i, t ? t->name : "NULL");
		CHECK(moet_ckpt_get(ck, names[i]) == t, "get(%s)", names[i]);
	}
	CHECK(moet_ckpt_at(ck, 4) == NULL, "at past the end");
	CHECK(moet_ckpt_get(ck, "nope") == NULL && moet_ckpt_get(ck, "") == NULL &&
	      moet_ckpt_get(ck, "aa") == NULL, "get of absent names");
	const moet_tensor *a = moet_ckpt_get(ck, "a"), *c = moet_ckpt_get(ck, "c");
	CHECK(a && a->shard == 0 && a->dtype == MOET_DT_F32 && a->numel == 4 &&
	      a->n_bytes == 16 && !memcmp(a->data, a_vals, 16), "tensor a");
	CHECK(c && c->shard == 1 && c->dtype == MOET_DT_F8_E4M3 && c->ndim == 2 &&
	      c->shape[0] == 4 && c->shape[1] == 4, "tensor c");
	const moet_tensor *d = moet_ckpt_get(ck, "d");
	CHECK(d && d->ndim == 0 && d->numel == 1 && d->n_bytes == 4, "scalar d");

	const moet_tensor *f = NULL;
	int64_t shp[2] = { 2, 2 }, any[2] = { -1, 2 }, bad[2] = { 2, 3 };
	CHECK(moet_ckpt_find(ck, "a", MOET_DT_F32, 2, shp, &f) == 0 && f == a, "find a");
	CHECK(moet_ckpt_find(ck, "a", MOET_DT_INVALID, 2, any, &f) == 0 && f == a, "find any");
	rc = moet_ckpt_find(ck, "a", MOET_DT_F32, 2, bad, &f);
	CHECK(rc == MOET_ESHAPE && f == NULL, "find bad shape rc %d", rc);
	CHECK(strstr(moet_errmsg(), p1) && strstr(moet_errmsg(), "tensor a has shape [2, 2], "
							   "config.json implies [2, 3]"),
	      "shape message: %s", moet_errmsg());
	rc = moet_ckpt_find(ck, "a", MOET_DT_F32, 1, shp, &f);
	CHECK(rc == MOET_ESHAPE, "find wrong ndim rc %d", rc);
	rc = moet_ckpt_find(ck, "a", MOET_DT_BF16, 2, shp, &f);
	CHECK(rc == MOET_ESHAPE && strstr(moet_errmsg(), "dtype F32") &&
	      strstr(moet_errmsg(), "BF16"), "dtype message: %s", moet_errmsg());
	rc = moet_ckpt_find(ck, "zz", MOET_DT_F32, 2, shp, &f);
	CHECK(rc == MOET_ENOTFOUND && strstr(moet_errmsg(), dir) &&
	      strstr(moet_errmsg(), "tensor zz is missing"), "missing message: %s",
	      moet_errmsg());
	moet_ckpt_close(ck);
	moet_ckpt_close(NULL);

	/* trailing slash on the directory: paths still have one separator */
	size_t n = strlen(dir) + 2;
	char *slashed = malloc(n);
	snprintf(slashed, n, "%s/", dir);
	rc = moet_ckpt_open(slashed, &ck);
	CHECK(rc == 0 && !strcmp(moet_ckpt_shard_path(ck, 0), p1), "open DIR/: %s",
	      rc ? moet_errmsg() : moet_ckpt_shard_path(ck, 0));
	moet_ckpt_close(ck);
	free(slashed);
	free(p1);
	free(p2);
	stb_rmdir(dir);
}

static void test_single(void)
{
	char *dir = fresh_dir("ckpt-single");
	stb_tensor t[] = { { .name = "w", .dtype = "BF16", .ndim = 2, .shape = { 3, 2 } } };
	size_t n;
	uint8_t *img = stb_build(t, 1, NULL, &n);
	stb_write(dir, "model.safetensors", img, n);
	free(img);
	moet_ckpt *ck = NULL;
	int rc = moet_ckpt_open(dir, &ck);
	CHECK(rc == 0 && moet_ckpt_count(ck) == 1 && moet_ckpt_shard_count(ck) == 1,
	      "single file: %s", moet_errmsg());
	moet_ckpt_close(ck);

	/* zero tensors, zero-size data buffer */
	img = stb_raw("{\"__metadata__\":{\"format\":\"pt\"}}", NULL, 0, &n);
	stb_write(dir, "model.safetensors", img, n);
	free(img);
	rc = moet_ckpt_open(dir, &ck);
	CHECK(rc == 0 && moet_ckpt_count(ck) == 0, "empty checkpoint: %s", moet_errmsg());
	moet_ckpt_close(ck);

	/* a zero-byte file (cannot be mapped): clean error */
	stb_write(dir, "model.safetensors", "", 0);
	rc = moet_ckpt_open(dir, &ck);
	CHECK(rc == MOET_EFORMAT && ck == NULL && strstr(moet_errmsg(), "model.safetensors") &&
	      strstr(moet_errmsg(), "shorter"), "zero-byte file: %s", moet_errmsg());
	stb_rmdir(dir);

	dir = fresh_dir("ckpt-none");
	rc = moet_ckpt_open(dir, &ck);
	CHECK(rc == MOET_ENOTFOUND && ck == NULL && strstr(moet_errmsg(), dir),
	      "empty dir: %d %s", rc, moet_errmsg());
	rc = moet_ckpt_open("/nonexistent/moet/dir", &ck);
	CHECK(rc == MOET_ENOTFOUND && strstr(moet_errmsg(), "/nonexistent/moet/dir"),
	      "missing dir: %s", moet_errmsg());
	stb_rmdir(dir);
}

/* Writes the shards and `index`, opens, expects `code` and the needles (NULL-terminated).
 * "@DIR" in a needle stands for the directory. */
static void expect_open_fail(const char *what, const char *index, int extra, int dup, int code,
			     const char *n1, const char *n2, const char *n3)
{
	char *dir = fresh_dir("ckpt-bad");
	write_shards(dir, extra, dup);
	stb_write_text(dir, IDX, index);
	moet_ckpt *ck = (moet_ckpt *)1;
	int rc = moet_ckpt_open(dir, &ck);
	const char *msg = moet_errmsg();
	if (getenv("MOET_TEST_VERBOSE"))
		printf("%-42s -> %s\n", what, msg);
	CHECK(rc == code, "%s: rc %d (%s) want %d: %s", what, rc, moet_strerror(rc), code, msg);
	CHECK(ck == NULL, "%s: *out not NULL", what);
	CHECK(one_line(msg), "%s: not one line: %s", what, msg);
	CHECK(strstr(msg, dir) == msg, "%s: message does not start with the directory: %s",
	      what, msg);
	const char *needles[] = { n1, n2, n3 };
	for (int i = 0; i < 3; i++)
		if (needles[i])
			CHECK(strstr(msg, needles[i]), "%s: lacks \"%s\": %s", what, needles[i],
			      msg);
	stb_rmdir(dir);
}

static void test_index_errors(void)
{
	expect_open_fail("index naming a missing shard",
			 "{\"weight_map\": {\"a\": \"" S1 "\", \"b\": \"" S1 "\", \"c\": \"" S2
			 "\", \"d\": \"model-00003-of-00002.safetensors\"}}", 0, 0, MOET_ENOTFOUND,
			 IDX ": tensor d: shard model-00003-of-00002.safetensors", "No such file",
			 NULL);
	expect_open_fail("index naming a tensor the shard lacks",
			 "{\"weight_map\": {\"a\": \"" S1 "\", \"b\": \"" S1 "\", \"c\": \"" S2
			 "\", \"d\": \"" S2 "\", \"e\": \"" S2 "\"}}", 0, 0, MOET_ENOTFOUND,
			 S2 ": tensor e:", "missing from the shard", IDX);
	expect_open_fail("tensor in shard but not index", index_ok, 1, 0, MOET_EFORMAT,
			 S2 ": tensor extra:", "not listed in", IDX);
	expect_open_fail("duplicate tensor across shards", index_ok, 0, 1, MOET_EFORMAT,
			 "tensor a:", S1, S2);
	expect_open_fail("index places a tensor in the wrong shard",
			 "{\"weight_map\": {\"a\": \"" S2 "\", \"b\": \"" S1 "\", \"c\": \"" S2
			 "\", \"d\": \"" S2 "\"}}", 0, 0, MOET_EFORMAT,
			 S1 ": tensor a: the index places it in " S2, NULL, NULL);
	expect_open_fail("shard name with a slash",
			 "{\"weight_map\": {\"a\": \"sub/" S1 "\"}}", 0, 0, MOET_EFORMAT,
			 IDX ": tensor a:", "plain file name", NULL);
	expect_open_fail("shard name with ..", "{\"weight_map\": {\"a\": \"..\"}}", 0, 0,
			 MOET_EFORMAT, IDX ": tensor a:", NULL, NULL);
	expect_open_fail("shard name not a string", "{\"weight_map\": {\"a\": 1}}", 0, 0,
			 MOET_EFORMAT, IDX ": tensor a:", NULL, NULL);
	expect_open_fail("index malformed", "{\"weight_map\": {", 0, 0, MOET_EFORMAT,
			 IDX ": not valid JSON", NULL, NULL);
	expect_open_fail("index duplicate key",
			 "{\"weight_map\": {\"a\": \"" S1 "\", \"a\": \"" S1 "\"}}", 0, 0,
			 MOET_EFORMAT, IDX ": not valid JSON", "duplicate", NULL);
	expect_open_fail("index without weight_map", "{\"metadata\": {}}", 0, 0, MOET_EFORMAT,
			 IDX ": key weight_map", NULL, NULL);
	expect_open_fail("index not an object", "[]", 0, 0, MOET_EFORMAT, IDX ": key weight_map",
			 NULL, NULL);
	expect_open_fail("index tensor name with control chars",
			 "{\"weight_map\": {\"a\\u0001\": \"" S1 "\"}}", 0, 0, MOET_EFORMAT,
			 IDX ": key weight_map", "control characters", NULL);
}

static void test_broken_shard(void)
{
	char *dir = fresh_dir("ckpt-trunc");
	write_shards(dir, 0, 0);
	stb_write_text(dir, IDX, index_ok);
	/* cut 2 bytes off shard 2: its last tensor's offsets now run past the end */
	char *p2 = path_of(dir, S2);
	off_t sz = file_size(dir, S2);
	CHECK(truncate(p2, sz - 2) == 0, "truncate");
	moet_ckpt *ck = NULL;
	int rc = moet_ckpt_open(dir, &ck);
	CHECK(rc == MOET_EFORMAT && ck == NULL, "truncated shard rc %d", rc);
	CHECK(strstr(moet_errmsg(), p2) == moet_errmsg() && strstr(moet_errmsg(), "tensor ") &&
	      strstr(moet_errmsg(), "run past the end") && one_line(moet_errmsg()),
	      "truncated shard message: %s", moet_errmsg());
	free(p2);
	stb_rmdir(dir);
}

int main(void)
{
	test_valid();
	test_single();
	test_index_errors();
	test_broken_shard();
	return moet_test_done("test_ckpt");
}
