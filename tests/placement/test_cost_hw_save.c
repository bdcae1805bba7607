/*
 * test_cost_hw_save.c: the hardware file writer (moet_cost_hw_save, placement/cost.c).
 *
 * - Every key written (odd values: thirds, tiny and large numbers, curves of several points,
 *   an empty curve) loads back bit for bit with the reader; the numbers are written in the
 *   fewest digits ("0.1", not 0.10000000000000001); comments and the header come out as
 *   '#' lines of at most 100 columns, in the entries' order, a long word unbroken.
 * - A subset leaves the other keys out: the loaded file equals the defaults but for them.
 * - Refusals: an unknown or repeated key, a name with a quote, a figure the reader refuses
 *   (a bandwidth of 0, a falling gpu_dense_ms): MOET_EINVAL naming it, no file written; a
 *   path that cannot be created: MOET_EIO naming the path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_cost.h"
#include "moet_err.h"
#include "moet_test.h"

static char *tmp;

static int same_curve(const moet_cost_curve *a, const moet_cost_curve *b)
{
	if (a->n != b->n)
		return 0;
	for (int i = 0; i < a->n; i++)
		if (a->tokens[i] != b->tokens[i] || a->frac[i] != b->frac[i])
			return 0;
	return 1;
}

/* Every figure of a and b bit for bit (the name and from_file aside). */
static int same_hw(const moet_cost_hw *a, const moet_cost_hw *b)
{
	return a->cpu_read_gbps == b->cpu_read_gbps && a->gpu_read_gbps == b->gpu_read_gbps &&
	       a->pcie_gbps == b->pcie_gbps && a->pcie_latency_us == b->pcie_latency_us &&
	       a->stage_copy_gbps == b->stage_copy_gbps &&
	       a->stage_pinned_gbps == b->stage_pinned_gbps &&
	       a->cpu_overhead_us == b->cpu_overhead_us &&
	       a->gpu_overhead_us == b->gpu_overhead_us && a->act_bytes == b->act_bytes &&
	       a->cpu_fma_gflops == b->cpu_fma_gflops &&
	       a->gpu_sgemm_gflops == b->gpu_sgemm_gflops &&
	       same_curve(&a->cpu_fma_frac, &b->cpu_fma_frac) &&
	       same_curve(&a->gpu_sgemm_frac, &b->gpu_sgemm_frac) &&
	       same_curve(&a->gpu_dense_ms, &b->gpu_dense_ms);
}

static void test_round_trip(void)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/all.yaml", tmp);
	moet_cost_hw hw, back;
	moet_cost_hw_defaults(&hw);
	snprintf(hw.name, sizeof(hw.name), "test rig: 2 x H200");
	hw.cpu_read_gbps = 1.0 / 3.0;
	hw.gpu_read_gbps = 2701.123456789012;
	hw.pcie_gbps = 0.1;
	hw.pcie_latency_us = 0;
	hw.stage_copy_gbps = 4.9999999999999991;
	hw.stage_pinned_gbps = 37.999999999999993;
	hw.cpu_overhead_us = 1e-7;
	hw.gpu_overhead_us = 123456.75;
	hw.act_bytes = 2;
	hw.cpu_fma_gflops = 1328.7;
	hw.gpu_sgemm_gflops = 50575;
	hw.cpu_fma_frac.n = 0; /* written as {} */
	hw.gpu_sgemm_frac.n = 3;
	const double gt[3] = { 1, 7, 1024 }, gf[3] = { 0.1, 0.7 / 3, 0.999 };
	for (int i = 0; i < 3; i++)
		hw.gpu_sgemm_frac.tokens[i] = gt[i], hw.gpu_sgemm_frac.frac[i] = gf[i];
	hw.gpu_dense_ms.n = 2;
	hw.gpu_dense_ms.tokens[0] = 1, hw.gpu_dense_ms.frac[0] = 2.5430000000000001;
	hw.gpu_dense_ms.tokens[1] = 64, hw.gpu_dense_ms.frac[1] = 20.547 + 1e-12;
	const char *longword = "x123456789x123456789x123456789x123456789x123456789x123456789"
			       "x123456789x123456789x123456789x123456789";
	char longc[256];
	snprintf(longc, sizeof(longc), "a word longer than a line: %s end", longword);
	const moet_cost_hw_entry e[] = {
		{ "name", "the rig" },
		{ "cpu_read_gbps", "first line\nsecond line, and a long one that has to be wrapped "
		  "because it goes on and on past the ninety-six columns of a comment line" },
		{ "gpu_read_gbps", NULL },
		{ NULL, "a comment alone: something left out" },
		{ "pcie_gbps", longc },
		{ "pcie_latency_us", "" },
		{ "stage_copy_gbps", NULL }, { "stage_pinned_gbps", NULL },
		{ "cpu_overhead_us", NULL },
		{ "gpu_overhead_us", NULL }, { "act_bytes", NULL }, { "cpu_fma_gflops", NULL },
		{ "gpu_sgemm_gflops", NULL }, { "cpu_fma_frac", "empty" },
		{ "gpu_sgemm_frac", NULL }, { "gpu_dense_ms", "dense" },
	};
	const int n = (int)(sizeof(e) / sizeof(e[0]));
	int rc = moet_cost_hw_save(path, &hw, "header line one\nheader line two", e, n);
	CHECK(rc == 0, "save: %d %s", rc, moet_errmsg());
	rc = moet_cost_hw_load(path, &back);
	CHECK(rc == 0, "load: %d %s", rc, moet_errmsg());
	CHECK(same_hw(&hw, &back) && !strcmp(back.name, hw.name) && back.from_file,
	      "every figure reads back bit for bit");
	char *t = moet_test_read_file(path, NULL);
	CHECK(t != NULL, "read %s", path);
	if (!t)
		return;
	CHECK(!strncmp(t, "# header line one\n# header line two\n", 36), "header first:\n%s", t);
	CHECK(strstr(t, "\npcie_gbps: 0.1\n") && strstr(t, "\nact_bytes: 2\n") &&
	      strstr(t, "\ncpu_fma_frac: {}\n") && strstr(t, "\n  64: 20.547000000001\n") &&
	      strstr(t, "\n  1: 2.5430000000000001\n") == NULL && strstr(t, "\n  1: 2.543\n"),
	      "fewest digits that read back:\n%s", t);
	/* the comments in order, each above its key */
	const char *a = strstr(t, "# first line\n# second line"), *b = strstr(t, "cpu_read_gbps:");
	const char *c = strstr(t, "# a comment alone"), *d = strstr(t, "gpu_read_gbps:");
	const char *w = strstr(t, longword), *p = strstr(t, "\npcie_gbps:");
	CHECK(a && b && c && d && w && p && a < b && b < d && d < c && c < w && w < p,
	      "order of comments and keys:\n%s", t);
	CHECK(w && w[-1] == ' ' && w[-2] == '#' && w[-3] == '\n' && strstr(t, "# a word longer "
	      "than a line:\n"), "a long word on a line of its own after a wrap:\n%s", t);
	int lines = 0, bad = 0;
	for (char *s = t, *nl; *s; s = nl + 1, lines++) {
		nl = strchr(s, '\n');
		if (!nl)
			break;
		const size_t len = (size_t)(nl - s);
		/* NOTE: the unbreakable word's line is the one allowed past 100 columns */
		if ((len > 100 && !(len < 120 && strstr(s, longword) == s + 2)) ||
		    (len && s[0] != '#' && s[0] != ' ' && !strchr(s, ':')))
			bad++;
	}
	CHECK(lines > 20 && bad == 0, "%d lines, %d not comments or keys:\n%s", lines, bad, t);
	free(t);
}

static void test_subset(void)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/some.yaml", tmp);
	moet_cost_hw hw, def, back;
	moet_cost_hw_defaults(&def);
	moet_cost_hw_defaults(&hw);
	hw.cpu_read_gbps = 11.491993884502614;
	hw.gpu_read_gbps = 1; /* not written: the file keeps the default */
	hw.gpu_dense_ms.n = 1;
	hw.gpu_dense_ms.tokens[0] = 3, hw.gpu_dense_ms.frac[0] = 0.25;
	const moet_cost_hw_entry e[] = { { "cpu_read_gbps", "measured" },
					 { "gpu_dense_ms", NULL },
					 { NULL, "gpu_read_gbps: not measured" } };
	int rc = moet_cost_hw_save(path, &hw, NULL, e, 3);
	CHECK(rc == 0 && moet_cost_hw_load(path, &back) == 0, "subset: %s", moet_errmsg());
	def.cpu_read_gbps = hw.cpu_read_gbps;
	def.gpu_dense_ms = hw.gpu_dense_ms;
	CHECK(same_hw(&def, &back) && !strcmp(back.name, def.name), "subset: the defaults but "
	      "for the written keys");
	char *t = moet_test_read_file(path, NULL);
	CHECK(t && !strstr(t, "\ngpu_read_gbps:") && !strstr(t, "name:") &&
	      strstr(t, "# gpu_read_gbps: not measured"), "left out:\n%s", t ? t : "");
	free(t);
}

/* A refused save: rc, the detail naming `want`, and no file. */
static void refused(const char *what, const moet_cost_hw *hw, const moet_cost_hw_entry *e,
		    int n, int want_rc, const char *want)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/refused.yaml", tmp);
	unlink(path);
	int rc = moet_cost_hw_save(path, hw, "h", e, n);
	const char *msg = moet_errmsg();
	CHECK(rc == want_rc && strstr(msg, want) && strstr(msg, path) && !strchr(msg, '\n'),
	      "%s: rc %d, '%s' (want %d, '%s')", what, rc, msg, want_rc, want);
	CHECK(access(path, F_OK) != 0, "%s: no file written", what);
}

static void test_refusals(void)
{
	moet_cost_hw hw;
	moet_cost_hw_defaults(&hw);
	const moet_cost_hw_entry unk[] = { { "cpu_read_gbps", NULL }, { "cpu_read_gpbs", NULL } };
	refused("unknown key", &hw, unk, 2, MOET_EINVAL, "unknown key 'cpu_read_gpbs'");
	const moet_cost_hw_entry two[] = { { "pcie_gbps", NULL }, { "pcie_gbps", "again" } };
	refused("repeated key", &hw, two, 2, MOET_EINVAL, "pcie_gbps given twice");
	const moet_cost_hw_entry nm[] = { { "name", NULL } };
	snprintf(hw.name, sizeof(hw.name), "a \"quoted\" name");
	refused("quoted name", &hw, nm, 1, MOET_EINVAL, "name");
	moet_cost_hw_defaults(&hw);
	hw.cpu_read_gbps = 0;
	const moet_cost_hw_entry cr[] = { { "cpu_read_gbps", NULL } };
	refused("zero bandwidth", &hw, cr, 1, MOET_EINVAL, "cpu_read_gbps");
	moet_cost_hw_defaults(&hw);
	hw.gpu_dense_ms.n = 2;
	hw.gpu_dense_ms.tokens[0] = 1, hw.gpu_dense_ms.frac[0] = 2;
	hw.gpu_dense_ms.tokens[1] = 4, hw.gpu_dense_ms.frac[1] = 1.5;
	const moet_cost_hw_entry dn[] = { { "gpu_dense_ms", NULL } };
	refused("falling dense curve", &hw, dn, 1, MOET_EINVAL, "gpu_dense_ms");
	/* a path that cannot be created */
	moet_cost_hw_defaults(&hw);
	int rc = moet_cost_hw_save("/nonexistent-dir/h.yaml", &hw, NULL, cr, 1);
	CHECK(rc == MOET_EIO && strstr(moet_errmsg(), "/nonexistent-dir/h.yaml: cannot create"),
	      "bad path: %d %s", rc, moet_errmsg());
}

int main(void)
{
	tmp = moet_test_mkdtemp("cost-hw-save");
	test_round_trip();
	test_subset();
	test_refusals();
	free(tmp);
	return moet_test_done("test_cost_hw_save");
}
