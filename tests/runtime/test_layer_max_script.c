/*
 * test_layer_max_script.c: tests/gpu/layer_max.sh (the cost model's --layer-max means and
 * spread beside measured steps) on the CPU backend with the tiny preset, so that a change of
 * bench e2e's predictions or of the script breaks here rather than on the GPU machine. Two
 * placements (a quarter and half of the experts on the simulated GPU), batch 4, two rounds.
 * Checked against the bench's own JSON records, not the script's arithmetic:
 *   - the probe run wrote the profile and the hardware file the predictions read;
 *   - one table row per placement: two runs, the median (mean of two) of its records'
 *     measured one-pass steps and their range, round 1's predictions (round 2's the same:
 *     the same routing and figures), each error their ratio to the median, the spread's
 *     prediction never below the means'; the mean absolute errors line over both rows;
 *   - usage errors: too few arguments, a device other than cuda or cpu, a missing placement
 *     file, MOET_LM_ROUNDS not a count (exit 2, naming the fault).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_gen.h"
#include "moet_test.h"

static int run(const char *args, char **text)
{
	char cmd[8192];
	snprintf(cmd, sizeof(cmd), "cd %s && MOET_LM_DEVICE=cpu MOET_LM_BATCHES=4 "
		 "MOET_LM_STEPS=3 %s", moet_test_source_dir(), args);
	return moet_test_run(cmd, text);
}

/* The script run with args exits 2 naming the fault (want in its output). */
static void usage_error(const char *args, const char *want, const char *what)
{
	char *text = NULL;
	const int rc = run(args, &text);
	CHECK(rc == 2 && text && strstr(text, want), "%s: %d\n%s", what, rc, text ? text : "");
	free(text);
}

static int write_place(const char *path, const char *experts)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f, "version: 1\ngpus:\n  - {name: gpu0, budget: 1GiB, reserve: 0B}\n"
		"default: {gpu0: \"%s\"}\n", experts);
	return fclose(f);
}

static double num(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Placement i's round r record's hybrid prediction at batch 4, or NULL. */
static json_t *prediction(const char *out, int i, int r, json_t **rec)
{
	char path[800];
	snprintf(path, sizeof(path), "%s/e2e-%d-%d.json", out, i, r);
	*rec = json_load_file(path, 0, NULL);
	size_t k;
	json_t *p;
	json_array_foreach(json_object_get(*rec, "predictions"), k, p) {
		const char *m = json_string_value(json_object_get(p, "mode"));
		const json_int_t b = json_integer_value(json_object_get(p, "batch"));
		if (m && !strcmp(m, "hybrid") && b == 4)
			return p;
	}
	return NULL;
}

int main(void)
{
	if (system("command -v bash python3 timeout >/dev/null 2>&1")) {
		fprintf(stderr, "SKIP: needs bash, python3 and timeout\n");
		return 77;
	}
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 3;
	/* the checkpoint is the folder itself; the placements and the output go beside it */
	char *ckpt = moet_test_gen("layer-max-sh", &gp);
	if (!ckpt)
		return moet_test_done("test_layer_max_script");
	char pa[600], pb[600], out[600], build[1024], path[800], args[4000];
	snprintf(pa, sizeof(pa), "%s/a.yaml", ckpt);
	snprintf(pb, sizeof(pb), "%s/b.yaml", ckpt);
	snprintf(out, sizeof(out), "%s/out", ckpt);
	moet_test_build_dir(build, sizeof(build));
	CHECK(write_place(pa, "0-3") == 0 && write_place(pb, "0-7") == 0, "placements");
	char *text = NULL;
	snprintf(args, sizeof(args), "MOET_LM_ROUNDS=2 bash tests/gpu/layer_max.sh %s %s %s %s %s",
		 build, out, ckpt, pa, pb);
	int rc = run(args, &text);
	CHECK(rc == 0 && text, "layer_max.sh: exit %d\n%s", rc, text ? text : "");
	free(text);
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof(path), "%s/%s", out, k ? "hw.yaml" : "profile.json");
		FILE *f = fopen(path, "r");
		CHECK(f != NULL, "%s written", path);
		if (f)
			fclose(f);
	}
	snprintf(path, sizeof(path), "%s/table.txt", out);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "table %s", path);
	char line[512];
	int rows = 0, maes = 0;
	double sum_ea = 0, sum_es = 0;
	while (f && fgets(line, sizeof(line), f)) {
		char name[256];
		int b, runs;
		double rg, m, a, ea, s, es, mea, mes;
		if (sscanf(line, "mean absolute error over 2 rows: means %lf%%, spread %lf%%", &mea,
			   &mes) == 2) {
			CHECK(rows == 2 && fabs(mea - sum_ea / 2) <= 0.06 &&
			      fabs(mes - sum_es / 2) <= 0.06, "%s: rows' %.3f %.3f", line,
			      sum_ea / 2, sum_es / 2);
			maes++;
			continue;
		}
		if (sscanf(line, "%255s %d %d %lf%% %lf %lf %lf%% %lf %lf%%", name, &b, &runs, &rg,
			   &m, &a, &ea, &s, &es) != 9)
			continue;
		const int i = strstr(name, "a.yaml") ? 1 : strstr(name, "b.yaml") ? 2 : 0;
		json_t *rec = NULL, *rec2 = NULL, *p = i ? prediction(out, i, 1, &rec) : NULL;
		json_t *p2 = i ? prediction(out, i, 2, &rec2) : NULL;
		CHECK(p != NULL && p2 != NULL && b == 4 && runs == 2, "row %s: its records' "
		      "predictions", line);
		if (p && p2) {
			const double m1 = 1e3 * num(p, "measured_one_pass_s"),
				     m2 = 1e3 * num(p2, "measured_one_pass_s"), rm = (m1 + m2) / 2,
				     rr = 100 * (fmax(m1, m2) / fmin(m1, m2) - 1),
				     ra = 1e3 * num(p, "predicted_one_pass_s"),
				     rs = 1e3 * num(p, "predicted_one_pass_spread_s");
			CHECK(fabs(m - rm) <= 6e-4 && fabs(rg - rr) <= 0.6 && fabs(a - ra) <= 6e-4 &&
			      fabs(s - rs) <= 6e-4 &&
			      fabs(ea - 100 * (ra / rm - 1)) <= 0.06 &&
			      fabs(es - 100 * (rs / rm - 1)) <= 0.06 && rs >= ra,
			      "row %s: records %.4f %.4f %.4f %.4f", line, m1, m2, ra, rs);
			CHECK(num(p2, "predicted_one_pass_s") == num(p, "predicted_one_pass_s") &&
			      num(p2, "predicted_one_pass_spread_s") ==
				      num(p, "predicted_one_pass_spread_s"),
			      "row %s: round 2 predicted as round 1", line);
			sum_ea += fabs(100 * (ra / rm - 1));
			sum_es += fabs(100 * (rs / rm - 1));
		}
		json_decref(rec);
		json_decref(rec2);
		rows++;
	}
	if (f)
		fclose(f);
	CHECK(rows == 2 && maes == 1, "%d table rows, want 2; %d error lines, want 1", rows, maes);

	snprintf(args, sizeof(args), "bash tests/gpu/layer_max.sh %s %s %s", build, out, ckpt);
	usage_error(args, "usage", "too few arguments");
	/* the later assignment of the variable wins */
	snprintf(args, sizeof(args), "MOET_LM_DEVICE=tpu bash tests/gpu/layer_max.sh %s %s %s %s",
		 build, out, ckpt, pa);
	usage_error(args, "MOET_LM_DEVICE 'tpu'", "bad device");
	snprintf(args, sizeof(args), "MOET_LM_ROUNDS=x bash tests/gpu/layer_max.sh %s %s %s %s",
		 build, out, ckpt, pa);
	usage_error(args, "MOET_LM_ROUNDS 'x'", "bad rounds");
	snprintf(args, sizeof(args), "bash tests/gpu/layer_max.sh %s %s %s %s/none.yaml", build,
		 out, ckpt, ckpt);
	usage_error(args, "none.yaml: no such file", "missing placement");
	free(ckpt);
	return moet_test_done("test_layer_max_script");
}
