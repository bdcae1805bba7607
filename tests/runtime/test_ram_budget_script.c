/*
 * test_ram_budget_script.c: the logic of tests/gpu/ram_budget.sh (issue 9's side-by-side RAM
 * budget measurement) on the CPU backend with the tiny preset, so that a change of bench e2e's
 * output or of the script breaks here rather than on the GPU machine. A plain directory stands
 * in for the cgroup v2 root (MOET_RB_FAKE_CGROUP: the stand-in charges 3 GiB of which 1 GiB is
 * page cache, and no limit is enforced), so no real cgroup is ever made by this test.
 * Checked against the bench's own JSON records and the checkpoint, not the script's numbers:
 *   - table rows: one per (budget, batch); tok/s of each configuration equal to its record's
 *     (batch / mean step, and the tier's "ram" entry's mean_tokens_per_s), within the
 *     table's rounding; the tier's slot bytes = its record's resident bytes; the hit rate its
 *     record's;
 *   - the mmap limit = the stand-in's 2 GiB outside the page cache + the dense part (on the
 *     CPU backend both processes read it from the mapping): the checkpoint's bytes that are
 *     not routed-expert tensors;
 *   - the ratios are the quotients of the table's own tok/s;
 *   - without a memory cgroup (a stand-in that does not exist) the mmap rows are skipped with
 *     the reason, the rest runs, the checkpoint, profile and placement are reused;
 *   - refusals: a checkpoint directory on tmpfs (/dev/shm), a checkpoint made with other
 *     arguments.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_test.h"

#define TMPFS_MAGIC_ 0x01021994

static double num(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

/* tokens/s of row `name` at batch B of a bench record: B / mean step; 0 if absent. */
static double rec_tok_s(const char *path, const char *name, int64_t B)
{
	json_t *r = json_load_file(path, 0, NULL);
	double v = 0;
	size_t i;
	const json_t *row;
	json_array_foreach(json_object_get(r, "results"), i, row) {
		const char *n = json_string_value(json_object_get(row, "name"));
		if (n && !strcmp(n, name) && json_integer_value(json_object_get(row, "tokens")) == B)
			v = (double)B / num(row, "mean_s"); /* the script's tok/s: the mean step's */
	}
	json_decref(r);
	return v;
}

/* The tier record's "ram" entry at batch B, a new reference (NULL if absent). */
static json_t *rec_ram(const char *path, int64_t B)
{
	json_t *r = json_load_file(path, 0, NULL), *got = NULL;
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(r, "ram"), i, e)
		if (json_integer_value(json_object_get(e, "batch")) == B)
			got = json_incref(e);
	json_decref(r);
	return got;
}

static size_t dense_bytes(const char *dir)
{
	moet_ckpt *ck = NULL;
	size_t sum = 0;
	if (moet_ckpt_open(dir, &ck))
		return 0;
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		if (!strstr(t->name, ".mlp.experts."))
			sum += t->n_bytes;
	}
	moet_ckpt_close(ck);
	return sum;
}

static int run_script(const char *env, const char *out, const char *ckpt, char **text)
{
	char build[1024], cmd[4096];
	moet_test_build_dir(build, sizeof(build));
	snprintf(cmd, sizeof(cmd), "MOET_RB_DEVICE=cpu MOET_RB_PRESET=tiny MOET_RB_DROP=0 "
		 "MOET_RB_STEPS=3 MOET_RB_WARMUP=2 MOET_RB_CTX=4 MOET_RB_BATCHES=1,3 %s bash "
		 "%s/tests/gpu/ram_budget.sh "
		 "%s %s %s", env, moet_test_source_dir(), build, out, ckpt);
	return moet_test_run(cmd, text);
}

int main(void)
{
	if (system("command -v bash awk sed du df >/dev/null 2>&1")) {
		fprintf(stderr, "SKIP: needs bash, awk, sed, du, df\n");
		return 77;
	}
	char *dir = moet_test_mkdtemp("ram-budget-sh");
	char ckpt[512], cg[512], out1[512], out2[512], path[600], env[1400];
	snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
	snprintf(cg, sizeof(cg), "%s/cgroot", dir);
	snprintf(out1, sizeof(out1), "%s/out1", dir);
	snprintf(out2, sizeof(out2), "%s/out2", dir);
	struct statfs sf;
	if (!statfs(dir, &sf) && (unsigned long)sf.f_type == TMPFS_MAGIC_) {
		fprintf(stderr, "SKIP: the scratch folder %s is on tmpfs, which the script refuses\n",
			dir);
		free(dir);
		return 77;
	}
	CHECK(mkdir(cg, 0755) == 0, "mkdir %s", cg);
	snprintf(env, sizeof(env), "MOET_RB_FAKE_CGROUP=%s", cg);
	char *text = NULL;
	int rc = run_script(env, out1, ckpt, &text);
	CHECK(rc == 0 && text && strstr(text, "TEST MODE"), "script with a stand-in cgroup: exit "
	      "%d\n%s", rc, text ? text : "");
	free(text);
	const double dense = (double)dense_bytes(ckpt);
	CHECK(dense > 0, "dense bytes of %s", ckpt);
	snprintf(path, sizeof(path), "%s/ram_budget.json", out1);
	json_t *r = json_load_file(path, 0, NULL);
	const json_t *rows = json_object_get(r, "rows");
	CHECK(json_array_size(rows) == 4, "2 budgets x 2 batches: %zu rows", json_array_size(rows));
	CHECK(json_integer_value(json_object_get(r, "warmup")) == 2, "the table's warm-up steps");
	static const char *const recs[3] = { "all", "tier-50pct", "mmap-25pct" };
	for (int k = 0; k < 3; k++) { /* every bench it ran took them */
		char rp[700];
		snprintf(rp, sizeof(rp), "%s/%s.json", out1, recs[k]);
		json_t *rr = json_load_file(rp, 0, NULL);
		CHECK(rr && json_integer_value(json_object_get(rr, "decode_warmup_steps")) == 2,
		      "%s: decode_warmup_steps", rp);
		json_decref(rr);
	}
	size_t i;
	const json_t *row;
	json_array_foreach(rows, i, row) {
		const char *b = json_string_value(json_object_get(row, "budget"));
		const int64_t B = json_integer_value(json_object_get(row, "batch"));
		const char *tg = b && !strcmp(b, "50%") ? "50pct" : "25pct";
		char tier_p[700], mmap_p[700], all_p[700];
		snprintf(all_p, sizeof(all_p), "%s/all.json", out1);
		snprintf(tier_p, sizeof(tier_p), "%s/tier-%s.json", out1, tg);
		snprintf(mmap_p, sizeof(mmap_p), "%s/mmap-%s.json", out1, tg);
		const double all = num(row, "all_tok_s"), tier = num(row, "tier_tok_s"),
			     mm = num(row, "mmap_tok_s");
		const double all_r = rec_tok_s(all_p, "decode-hybrid", B);
		const double mm_r = rec_tok_s(mmap_p, "decode-hybrid", B);
		json_t *e = rec_ram(tier_p, B);
		CHECK(b && (B == 1 || B == 3) && e, "row %zu: budget %s batch %lld", i, b ? b : "-",
		      (long long)B);
		/* printed with one decimal */
		CHECK(all > 0 && fabs(all - all_r) <= 0.051, "%s %lld: all %g, record %g", b,
		      (long long)B, all, all_r);
		CHECK(mm > 0 && fabs(mm - mm_r) <= 0.051, "%s %lld: mmap %g, record %g", b,
		      (long long)B, mm, mm_r);
		CHECK(tier > 0 && fabs(tier - num(e, "mean_tokens_per_s")) <= 0.051 &&
		      fabs(num(row, "tier_hit_rate") - num(e, "hit_rate")) <= 0.0005 &&
		      num(row, "tier_slot_bytes") == num(e, "resident_bytes"),
		      "%s %lld: tier %g (record %g), hit %g (%g), slots %g (%g)", b, (long long)B,
		      tier, num(e, "mean_tokens_per_s"), num(row, "tier_hit_rate"), num(e, "hit_rate"),
		      num(row, "tier_slot_bytes"), num(e, "resident_bytes"));
		CHECK(num(row, "mmap_limit_bytes") == 2147483648.0 + dense,
		      "%s: limit %.0f, want 2 GiB + dense %.0f", b, num(row, "mmap_limit_bytes"),
		      dense);
		CHECK(fabs(num(row, "tier_over_all") - tier / all) <= 0.0005 + 1e-9 &&
		      fabs(num(row, "tier_over_mmap") - tier / mm) <= 0.0005 + 1e-9 &&
		      fabs(num(row, "mmap_over_all") - mm / all) <= 0.0005 + 1e-9,
		      "%s %lld: ratios", b, (long long)B);
		json_decref(e);
	}
	json_decref(r);

	/* no memory cgroup: the mmap rows skipped with the reason; prep reused; no all row */
	snprintf(env, sizeof(env), "MOET_RB_ROWS='tier mmap' MOET_RB_BUDGETS=50%% "
		 "MOET_RB_FAKE_CGROUP=%s/none", dir);
	rc = run_script(env, out2, ckpt, &text);
	CHECK(rc == 0 && text && strstr(text, "mmap at 50%: SKIPPED") &&
	      strstr(text, "not a directory") && !strstr(text, "gen-checkpoint") &&
	      !strstr(text, "profile --synthetic"), "script without a cgroup: exit %d\n%s", rc,
	      text ? text : "");
	free(text);
	snprintf(path, sizeof(path), "%s/ram_budget.json", out2);
	r = json_load_file(path, 0, NULL);
	rows = json_object_get(r, "rows");
	const char *cgs = json_string_value(json_object_get(r, "cgroup"));
	CHECK(json_array_size(rows) == 2 && cgs && !strncmp(cgs, "none: ", 6), "rows %zu, cgroup "
	      "%s", json_array_size(rows), cgs ? cgs : "-");
	json_array_foreach(rows, i, row) {
		const char *note = json_string_value(json_object_get(row, "note"));
		CHECK(json_is_null(json_object_get(row, "all_tok_s")) &&
		      json_is_null(json_object_get(row, "mmap_tok_s")) &&
		      json_is_null(json_object_get(row, "mmap_limit_bytes")) &&
		      num(row, "tier_tok_s") > 0 && note && strstr(note, "skipped"),
		      "row %zu without a cgroup", i);
	}
	json_decref(r);

	/* refusals, before anything is made */
	struct statfs shm;
	if (!statfs("/dev/shm", &shm) && (unsigned long)shm.f_type == TMPFS_MAGIC_) {
		char bad[256];
		snprintf(bad, sizeof(bad), "/dev/shm/moet-rb-test-%d", (int)getpid());
		rc = run_script("", out2, bad, &text);
		CHECK(rc == 1 && text && strstr(text, "cannot be paged out"), "tmpfs: exit %d\n%s",
		      rc, text ? text : "");
		free(text);
	}
	rc = run_script("MOET_RB_SHARE=0.7 MOET_RB_ROWS=none", out2, ckpt, &text);
	CHECK(rc == 1 && text && strstr(text, "was not made with"), "other gen arguments: exit "
	      "%d\n%s", rc, text ? text : "");
	free(text);
	free(dir);
	return moet_test_done("test_ram_budget_script");
}
