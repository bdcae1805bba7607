/*
 * test_e2e_ab_script.c: tests/gpu/e2e_ab.sh and its table (tests/gpu/e2e_table.py) on the CPU
 * backend with the tiny preset, so that a change of bench e2e's records or of the scripts
 * breaks here rather than on the GPU machine. Two variants (the defaults, and two
 * micro-batches forced) and a third whose environment the engine refuses, two rounds, one
 * placement of half the experts on the simulated GPU. Checked against the bench's own JSON
 * records, not the scripts' arithmetic:
 *   - one record per good variant and round, none for the refused one, whose rows say
 *     "no record" and whose failure names the variable on stderr; the run still exits 0;
 *   - every table row's step, Tc, Tg, bound and step / bound equal its record's, within
 *     the table's rounding; the forced variant ran its passes in two micro-batches;
 *   - the medians over rounds are the medians of the records' steps;
 *   - the archive holds the records and the table;
 *   - MOET_AB_MODE=gpu (every expert resident): its table's steps are the records' gpu ones;
 *   - with staging by balance the table's last columns (the staged copies' GB/s in the row
 *     and its serial run) are the records' stage_bytes over stage_link_s, "-" without;
 *   - usage errors: too few arguments, a bad variant name, a bad round count, a bad mode.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_test.h"

#define BATCH 4

static const json_t *mode_step(const json_t *rec, const char *want)
{
	size_t i;
	const json_t *s;
	json_array_foreach(json_object_get(rec, "steps"), i, s) {
		const char *mode = json_string_value(json_object_get(s, "mode"));
		if (mode && !strcmp(mode, want) &&
		    json_integer_value(json_object_get(s, "batch")) == BATCH)
			return s;
	}
	return NULL;
}

/* A run's row of the table ("name round batch step ..."), not a median row ("name batch step
 * ratio (runs)"): 1 with its fields, else 0. */
static int run_row(const char *line, char name[32], int *r, int *b, double *st)
{
	return !strchr(line, '(') && sscanf(line, "%31s %d %d %lf", name, r, b, st) == 4;
}

static double num(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static int run(const char *args, char **text)
{
	char cmd[8192];
	snprintf(cmd, sizeof(cmd), "cd %s && MOET_AB_DEVICE=cpu MOET_AB_BATCHES=%d "
		 "MOET_AB_STEPS=3 %s", moet_test_source_dir(), BATCH, args);
	return moet_test_run(cmd, text);
}

/* Runs e2e_ab.sh with args (*text: its output, the last one freed first), CHECKs its exit
 * status, and opens the table it wrote into dir (NULL, CHECKed, when missing). */
static FILE *run_table(const char *args, const char *what, const char *dir, char **text)
{
	free(*text);
	*text = NULL;
	int rc = run(args, text);
	CHECK(rc == 0 && *text, "e2e_ab.sh, %s: exit %d\n%s", what, rc, *text ? *text : "");
	char path[800];
	snprintf(path, sizeof(path), "%s/table.txt", dir);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "table %s", path);
	return f;
}

int main(void)
{
	if (system("command -v bash python3 tar >/dev/null 2>&1")) {
		fprintf(stderr, "SKIP: needs bash, python3 and tar\n");
		return 77;
	}
	char *dir = moet_test_mkdtemp("e2e-ab-sh");
	char ckpt[512], place[600], out[512], build[1024], path[800], args[4000];
	snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
	snprintf(place, sizeof(place), "%s/place.yaml", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	moet_test_build_dir(build, sizeof(build));
	CHECK(moet_test_cli(NULL, "gen-checkpoint --preset tiny --seed 3 --out %s --quiet",
			    ckpt) == 0, "gen-checkpoint");
	FILE *f = fopen(place, "w");
	CHECK(f != NULL, "write %s", place);
	if (f) {
		fputs("version: 1\ngpus:\n  - {name: gpu0, budget: 1GiB, reserve: 0B}\n"
		      "default: {gpu0: \"0-15\"}\n", f);
		fclose(f);
	}
	char *text = NULL;
	snprintf(args, sizeof(args), "MOET_AB_ROUNDS=2 MOET_AB_TRACE=1 bash tests/gpu/e2e_ab.sh "
		 "%s %s %s %s def 'split:MOET_MICROBATCH=1' 'bad:MOET_MB_QUEUE=2'", build, out,
		 ckpt, place);
	int rc = run(args, &text);
	CHECK(rc == 0 && text, "e2e_ab.sh: exit %d\n%s", rc, text ? text : "");
	CHECK(text && strstr(text, "MOET_MB_QUEUE") && strstr(text, "bad round 1 failed"),
	      "the refused variant's failure named:\n%s", text ? text : "");
	/* MOET_AB_TRACE=1: a traced run per variant, summed up (the refused one failed) */
	for (int v = 0; v < 2; v++) {
		size_t tn = 0;
		snprintf(path, sizeof(path), "%s/trace-%s.txt", out, v ? "split" : "def");
		char *tt = moet_test_read_file(path, &tn);
		CHECK(tt &&
		      strstr(tt, v ? "decode 4 rows, two micro-batches:" : "decode 4 rows, ") &&
		      strstr(tt, "cpu tier busy"), "%s:\n%s", path, tt ? tt : "(missing)");
		free(tt);
	}
	CHECK(text && strstr(text, "bad traced run failed"), "the refused variant's traced run "
	      "failed:\n%s", text ? text : "");

	/* the table against the records */
	snprintf(path, sizeof(path), "%s/table.txt", out);
	f = fopen(path, "r");
	CHECK(f != NULL, "table %s", path);
	const char *names[2] = { "def", "split" };
	double steps[2][2] = { { 0 } };
	int rows = 0, missing = 0, medians = 0;
	char line[512];
	while (f && fgets(line, sizeof(line), f)) {
		char name[32];
		int r, b;
		double st, p1, tc, tg, bd, ratio;
		if (sscanf(line, "%31s %d %d %lf %lf %lf %lf %lf %lf", name, &r, &b, &st, &p1, &tc,
			   &tg, &bd, &ratio) == 9) {
			int v = !strcmp(name, "def") ? 0 : !strcmp(name, "split") ? 1 : -1;
			CHECK(v >= 0 && r >= 1 && r <= 2 && b == BATCH, "table row: %s", line);
			if (v < 0 || r < 1 || r > 2)
				continue;
			snprintf(path, sizeof(path), "%s/e2e-%s-%d.json", out, names[v], r);
			json_t *rec = json_load_file(path, 0, NULL);
			const json_t *s = mode_step(rec, "hybrid");
			CHECK(s != NULL, "record %s: the hybrid step at batch %d", path, BATCH);
			if (s) {
				CHECK(fabs(st - 1e3 * num(s, "step_s")) <= 0.006 &&
				      fabs(tc - 1e3 * num(s, "tc_s")) <= 0.006 &&
				      fabs(tg - 1e3 * num(s, "tg_s")) <= 0.006 &&
				      fabs(bd - 1e3 * num(s, "overlap_bound_s")) <= 0.006 &&
				      fabs(ratio - num(s, "step_over_bound")) <= 0.0006,
				      "table row of %s round %d against its record: %s", names[v], r,
				      line);
				if (v == 1)
					CHECK(num(s, "split_share") == 1.0, "split round %d: %g of its "
					      "passes in two micro-batches", r, num(s, "split_share"));
				steps[v][r - 1] = 1e3 * num(s, "step_s");
			}
			json_decref(rec);
			rows++;
		} else if (strstr(line, "no record")) {
			CHECK(!strncmp(line, "bad", 3), "a missing record of a good variant: %s", line);
			missing++;
		} else if (sscanf(line, "%31s %d %lf %lf", name, &b, &st, &ratio) == 4 &&
			   strstr(line, "(2)")) {
			int v = !strcmp(name, "def") ? 0 : !strcmp(name, "split") ? 1 : -1;
			CHECK(v >= 0 && b == BATCH, "median row: %s", line);
			if (v >= 0)
				CHECK(fabs(st - 0.5 * (steps[v][0] + steps[v][1])) <= 0.006,
				      "%s: median %g of the rounds' %g and %g", names[v], st,
				      steps[v][0], steps[v][1]);
			medians++;
		}
	}
	if (f)
		fclose(f);
	CHECK(rows == 4 && missing == 2 && medians == 2, "table: %d rows, %d missing, %d medians",
	      rows, missing, medians);
	snprintf(args, sizeof(args), "tar -tzf %s/ab.tar.gz", out);
	free(text);
	text = NULL;
	CHECK(moet_test_run(args, &text) == 0 && text && strstr(text, "table.txt") &&
	      strstr(text, "e2e-split-2.json"), "the archive:\n%s", text ? text : "");

	/* MOET_AB_MODE=gpu: every expert resident, the table's steps from the gpu entries */
	snprintf(args, sizeof(args), "MOET_AB_MODE=gpu MOET_AB_ROUNDS=1 bash tests/gpu/e2e_ab.sh "
		 "%s %s-gpu %s %s def 'off:MOET_MB_QUEUE=0'", build, out, ckpt, place);
	snprintf(path, sizeof(path), "%s-gpu", out);
	f = run_table(args, "gpu mode", path, &text);
	int gpu_rows = 0;
	while (f && fgets(line, sizeof(line), f)) {
		char name[32];
		int r, b;
		double st;
		if (!run_row(line, name, &r, &b, &st) || b != BATCH)
			continue;
		snprintf(path, sizeof(path), "%s-gpu/e2e-%s-%d.json", out, name, r);
		json_t *rec = json_load_file(path, 0, NULL);
		const json_t *s = mode_step(rec, "gpu");
		CHECK(s && fabs(st - 1e3 * num(s, "step_s")) <= 0.006 && !mode_step(rec, "hybrid"),
		      "gpu-mode row of %s against its record (%s): %s", name, path, line);
		json_decref(rec);
		gpu_rows++;
	}
	if (f)
		fclose(f);
	CHECK(gpu_rows == 2, "gpu-mode table: %d rows", gpu_rows);

	/* again into the first folder with one round of one variant: its table has that round
	 * alone (the earlier invocation's round 2 of def removed, split's kept but not read) */
	snprintf(args, sizeof(args), "MOET_AB_ROUNDS=1 bash tests/gpu/e2e_ab.sh %s %s %s %s def",
		 build, out, ckpt, place);
	f = run_table(args, "again", out, &text);
	int again_rows = 0, again_other = 0;
	while (f && fgets(line, sizeof(line), f)) {
		char name[32];
		int r, b;
		double st;
		if (!run_row(line, name, &r, &b, &st)) {
			again_other += strstr(line, "no record") != NULL;
			continue;
		}
		CHECK(!strcmp(name, "def") && r == 1, "table row of the second invocation: %s", line);
		again_rows++;
	}
	if (f)
		fclose(f);
	snprintf(path, sizeof(path), "%s/e2e-def-2.json", out);
	FILE *stale = fopen(path, "r");
	snprintf(path, sizeof(path), "%s/e2e-split-2.json", out);
	FILE *kept = fopen(path, "r");
	CHECK(again_rows == 1 && again_other == 0 && !stale && kept, "second invocation: %d "
	      "rows, %d missing, def round 2 %s, split round 2 %s", again_rows, again_other,
	      stale ? "still there" : "removed", kept ? "kept" : "gone");
	if (stale)
		fclose(stale);
	if (kept)
		fclose(kept);

	/* staging by balance (the "even" hardware figures stage some cold experts): the table's
	 * last two columns, the staged copies' GB/s in the row and its serial run, are the
	 * record's stage_bytes over stage_link_s (and tc_); "-" where nothing was staged */
	char hwp[600];
	moet_test_hw_even(dir, hwp, sizeof(hwp));
	snprintf(args, sizeof(args), "MOET_AB_ROUNDS=1 bash tests/gpu/e2e_ab.sh %s %s-bal %s %s "
		 "'off:MOET_STAGE_BALANCE=0' 'bal:MOET_STAGE_BALANCE=1,MOET_HARDWARE=%s'", build,
		 out, ckpt, place, hwp);
	snprintf(path, sizeof(path), "%s-bal", out);
	f = run_table(args, "staging", path, &text);
	int bal_rows = 0;
	while (f && fgets(line, sizeof(line), f)) {
		char name[32], lnk[2][16];
		int r, b;
		double st;
		if (!run_row(line, name, &r, &b, &st) || b != BATCH)
			continue;
		snprintf(path, sizeof(path), "%s-bal/e2e-%s-%d.json", out, name, r);
		json_t *rec = json_load_file(path, 0, NULL);
		const json_t *s = mode_step(rec, "hybrid");
		const char *tail = line + strlen(line); /* the last two fields */
		for (int k = 0; k < 2 && tail > line; k++) { /* back over spaces, then a field */
			while (tail > line && (tail[-1] == ' ' || tail[-1] == '\n'))
				tail--;
			while (tail > line && tail[-1] != ' ')
				tail--;
		}
		const int got = sscanf(tail, "%15s %15s", lnk[0], lnk[1]) == 2 ? 2 : 0;
		CHECK(got == 2 && s, "staging row: %s", line);
		const int staged = !strcmp(name, "bal");
		for (int k = 0; s && k < 2 && got == 2; k++) {
			const char *pre = k ? "tc_" : "";
			char kb[32], kt[32];
			snprintf(kb, sizeof(kb), "%sstage_bytes", pre);
			snprintf(kt, sizeof(kt), "%sstage_link_s", pre);
			const double bytes = num(s, kb), t = num(s, kt);
			if (!staged) {
				CHECK(bytes == 0 && !strcmp(lnk[k], "-"), "off: %s %g, column %s",
				      kb, bytes, lnk[k]);
				continue;
			}
			CHECK(bytes > 0 && t > 0 && fabs(atof(lnk[k]) - bytes / t / 1e9) <= 0.051,
			      "bal: column %s against %s %g / %s %g", lnk[k], kb, bytes, kt, t);
		}
		json_decref(rec);
		bal_rows++;
	}
	if (f)
		fclose(f);
	CHECK(bal_rows == 2, "staging table: %d rows", bal_rows);

	/* usage errors */
	static const char *const bad[4] = {
		"bash tests/gpu/e2e_ab.sh a b c d",
		"bash tests/gpu/e2e_ab.sh a b c d 'two words'",
		"MOET_AB_ROUNDS=0 bash tests/gpu/e2e_ab.sh a b c d def",
		"MOET_AB_MODE=cpu bash tests/gpu/e2e_ab.sh a b c d def",
	};
	static const char *const why[4] = { "Usage", "variant name", "MOET_AB_ROUNDS",
					     "MOET_AB_MODE" };
	for (int i = 0; i < 4; i++) {
		free(text);
		text = NULL;
		rc = run(bad[i], &text);
		CHECK(rc != 0 && text && strstr(text, why[i]), "%s: exit %d\n%s", bad[i], rc,
		      text ? text : "");
	}
	free(text);
	free(dir);
	return moet_test_done("test_e2e_ab_script");
}
