/*
 * test_ncu_step.c: tests/gpu/ncu_step.py (the per-kernel sums of tests/gpu/ncu.sh step) on a
 * made-up Nsight Compute raw page, so that the script is checked where no GPU is: three
 * forward passes (each starting with embed_kernel, one launch with a comma in its duration,
 * templated names with a parameter list), the units row ncu prints after the header; the
 * last pass's totals and per-kernel sums, computed here from the same made-up launches, must
 * appear in its output, and every pass's total when all three are asked for; a file without
 * the columns exits non-zero naming the file. Skips (77) without python3.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_test.h"

struct launch {
	const char *name; /* as ncu prints it */
	double ns;
};

static const struct launch L[] = {
	{ "embed_kernel(const void *, int, long long, int, const int *, float *)", 2100 },
	{ "rows_kernel<0, 1, 4, 8>(moet_rows_args)", 1234567 },
	{ "embed_kernel(const void *, int, long long, int, const int *, float *)", 1000 },
	{ "rmsnorm_kernel(const float *, long long, const float *, int, double, float *, long long)",
	  2500 },
	{ "rows_kernel<0, 1, 1, 8>(moet_rows_args)", 30000 },
	{ "embed_kernel(const void *, int, long long, int, const int *, float *)", 1100 },
	{ "rmsnorm_kernel(const float *, long long, const float *, int, double, float *, long long)",
	  2400 },
	{ "rows_kernel<0, 1, 1, 8>(moet_rows_args)", 31000 },
	{ "rmsnorm_kernel(const float *, long long, const float *, int, double, float *, long long)",
	  2600 },
	{ "rows_kernel<0, 1, 1, 8>(moet_rows_args)", 29000 },
};
#define N_L (sizeof(L) / sizeof(L[0]))
#define LAST 5 /* the last pass's first launch */

static char *run(const char *csv, const char *extra)
{
	char cmd[8192], *text = NULL;
	snprintf(cmd, sizeof(cmd), "python3 %s/tests/gpu/ncu_step.py %s %s 2>&1",
		 moet_test_source_dir(), csv, extra);
	int rc = moet_test_run(cmd, &text);
	if (rc) {
		free(text);
		return NULL;
	}
	return text;
}

int main(void)
{
	if (system("command -v python3 >/dev/null 2>&1")) {
		printf("skip: no python3\n");
		return MOET_TEST_SKIP;
	}
	char *dir = moet_test_mkdtemp("ncu-step");
	CHECK(dir != NULL, "temporary directory");
	if (!dir)
		return moet_test_done("test_ncu_step");
	char csv[4096], bad[4096], line[512], *page = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&page, &len);
	CHECK(f != NULL, "memstream");
	if (!f)
		return moet_test_done("test_ncu_step");
	fprintf(f, "\"ID\",\"Kernel Name\",\"Block Size\",\"gpu__time_duration.sum\"\n");
	fprintf(f, "\"\",\"\",\"\",\"nsecond\"\n");
	for (size_t i = 0; i < N_L; i++) {
		if (L[i].ns >= 1000000) /* ncu groups thousands with commas */
			snprintf(line, sizeof(line), "%d,%d,%03d", (int)(L[i].ns / 1000000),
				 (int)(L[i].ns / 1000) % 1000, (int)L[i].ns % 1000);
		else
			snprintf(line, sizeof(line), "%.0f", L[i].ns);
		fprintf(f, "\"%zu\",\"%s\",\"(256, 1, 1)\",\"%s\"\n", i, L[i].name, line);
	}
	fclose(f);
	snprintf(csv, sizeof(csv), "%s/raw.csv", dir);
	snprintf(bad, sizeof(bad), "%s/bad.csv", dir);
	CHECK(moet_test_write_file(csv, page, len) == 0, "write %s", csv);
	CHECK(moet_test_write_file(bad, "\"ID\",\"Duration\"\n\"0\",\"5\"\n", 24) == 0,
	      "write %s", bad);
	free(page);

	/* the last pass, summed here */
	double total = 0, rows = 0, norm = 0;
	int n_rows = 0, n_norm = 0;
	for (size_t i = LAST; i < N_L; i++) {
		total += L[i].ns;
		if (!strncmp(L[i].name, "rows_kernel<0, 1, 1, 8>", 23))
			rows += L[i].ns, n_rows++;
		if (!strncmp(L[i].name, "rmsnorm_kernel", 14))
			norm += L[i].ns, n_norm++;
	}
	char want_head[128], want_rows[128], want_norm[128];
	snprintf(want_head, sizeof(want_head), "== pass 3 of 3: %zu kernels, %.1f us",
		 N_L - LAST, total / 1e3);
	snprintf(want_rows, sizeof(want_rows), "%5d %10.1f us", n_rows, rows / 1e3);
	snprintf(want_norm, sizeof(want_norm), "%5d %10.1f us", n_norm, norm / 1e3);

	char *out = run(csv, "");
	const char *at_rows = out ? strstr(out, "rows_kernel<0, 1, 1, 8>") : NULL;
	const char *at_norm = out ? strstr(out, "rmsnorm_kernel") : NULL;
	CHECK(out && strstr(out, want_head) && at_rows && strstr(at_rows, want_rows) && at_norm &&
		      strstr(at_norm, want_norm) && !strstr(out, "pass 2 of 3"),
	      "ncu_step.py: want \"%s\", \"%s\", \"%s\" in:\n%s", want_head, want_rows, want_norm,
	      out ? out : "(failed)");
	free(out);
	/* every pass (the first one holds the comma-grouped duration), cut at embed_kernel here */
	out = run(csv, "3");
	int pass = 0;
	for (size_t i = 0; i < N_L; pass++) {
		size_t n = 0;
		double t = 0;
		do
			t += L[i + n].ns, n++;
		while (i + n < N_L && strncmp(L[i + n].name, "embed_kernel", 12));
		char want[128];
		snprintf(want, sizeof(want), "== pass %d of 3: %zu kernels, %.1f us", pass + 1, n,
			 t / 1e3);
		CHECK(out && strstr(out, want), "ncu_step.py STEPS 3: want \"%s\" in:\n%s", want,
		      out ? out : "(failed)");
		i += n;
	}
	CHECK(pass == 3, "%d passes made up", pass);
	free(out);
	/* a page without the columns: an error naming the file */
	char cmd[8192], *text = NULL;
	snprintf(cmd, sizeof(cmd), "python3 %s/tests/gpu/ncu_step.py %s 2>&1",
		 moet_test_source_dir(), bad);
	CHECK(moet_test_run(cmd, &text) != 0 && text && strstr(text, "Kernel Name") &&
	      strstr(text, bad), "ncu_step.py on %s: %s", bad, text ? text : "(no output)");
	free(text);
	free(dir);
	return moet_test_done("test_ncu_step");
}
