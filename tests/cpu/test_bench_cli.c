/*
 * test_bench_cli.c: `moet-hybrid bench cpu-experts --quick --json F` at a tiny expert geometry:
 * the record has the keys of ../shared/design/BENCHMARKS.md, its byte and flop counts are the
 * ones computed here from the geometry, every ratio is finite, positive and equal to the
 * row's rate over its ceiling, each row's ceiling is its roofline bound, and the table comes
 * last. Bad arguments give one-line errors and non-zero exits.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "moet_test.h"

#define H 256
#define I 128

static int finite_pos(const json_t *v)
{
	return json_is_number(v) && isfinite(json_number_value(v)) && json_number_value(v) > 0;
}

static double num(const json_t *obj, const char *key)
{
	return json_number_value(json_object_get(obj, key));
}

static void check_record(const char *path)
{
	json_error_t err;
	json_t *r = json_load_file(path, 0, &err);
	CHECK(r != NULL, "%s: %s (line %d)", path, err.text, err.line);
	if (!r)
		return;
	CHECK(json_integer_value(json_object_get(r, "schema")) == 1, "schema");
	CHECK(json_is_string(json_object_get(r, "date")) &&
	      strlen(json_string_value(json_object_get(r, "date"))) == 20, "date");
	const json_t *git = json_object_get(r, "git");
	CHECK(json_is_string(json_object_get(git, "commit")), "git.commit");
	const json_t *dirty = json_object_get(git, "dirty");
	CHECK(json_is_boolean(dirty) || json_is_null(dirty), "git.dirty");
	const char *cmd = json_string_value(json_object_get(r, "command"));
	CHECK(cmd && strstr(cmd, "bench cpu-experts --quick"), "command: %s", cmd ? cmd : "-");
	const json_t *m = json_object_get(r, "machine");
	CHECK(json_is_string(json_object_get(m, "cpu_model")), "machine.cpu_model");
	CHECK(json_integer_value(json_object_get(m, "cores")) >= 1, "machine.cores");
	CHECK(json_integer_value(json_object_get(m, "numa_nodes")) >= 1, "machine.numa_nodes");
	CHECK(json_integer_value(json_object_get(m, "ram_bytes")) > 0, "machine.ram_bytes");
	CHECK(json_is_array(json_object_get(m, "flags")), "machine.flags");
	CHECK(json_integer_value(json_object_get(m, "gpus")) >= 0, "machine.gpus");
	CHECK(json_is_string(json_object_get(m, "kernel_variant")), "machine.kernel_variant");
	const json_t *geo = json_object_get(r, "geometry");
	CHECK(json_integer_value(json_object_get(geo, "hidden")) == H &&
	      json_integer_value(json_object_get(geo, "moe_intermediate")) == I, "geometry");
	CHECK(json_integer_value(json_object_get(json_object_get(r, "executor"), "threads")) >= 1,
	      "executor.threads");

	const json_t *ceil = json_object_get(r, "ceilings");
	const json_t *rd = json_object_get(ceil, "read_GBps"), *fm = json_object_get(ceil,
										    "fma_GFLOPs");
	CHECK(finite_pos(json_object_get(rd, "value")) &&
	      !strcmp(json_string_value(json_object_get(rd, "unit")), "GB/s"), "read_GBps");
	CHECK(finite_pos(json_object_get(fm, "value")) &&
	      !strcmp(json_string_value(json_object_get(fm, "unit")), "GFLOP/s"), "fma_GFLOPs");
	const double read_Bps = num(rd, "value") * 1e9, fma = num(fm, "value") * 1e9;

	/* bytes of one expert: three H x I e4m3 matrices and their 128x128 block scales */
	const double scales = (double)(((I + 127) / 128) * ((H + 127) / 128)) * 4;
	const double expert_bytes = 3 * ((double)H * I + scales);
	const json_t *res = json_object_get(r, "results");
	CHECK(json_array_size(res) >= 2, "%zu rows", json_array_size(res));
	int saw_decode = 0, saw_expert1 = 0;
	size_t i;
	const json_t *row;
	json_array_foreach(res, i, row) {
		const char *name = json_string_value(json_object_get(row, "name"));
		const char *cn = json_string_value(json_object_get(row, "ceiling"));
		double T = num(row, "tokens"), med = num(row, "median_s");
		CHECK(name && cn && json_is_integer(json_object_get(row, "tokens")), "row %zu keys",
		      i);
		if (!name || !cn)
			continue;
		CHECK(finite_pos(json_object_get(row, "median_s")) &&
		      finite_pos(json_object_get(row, "min_s")) &&
		      finite_pos(json_object_get(row, "max_s")), "row %zu times", i);
		CHECK(num(row, "min_s") <= med && med <= num(row, "max_s"), "row %zu min<=med<=max",
		      i);
		CHECK(finite_pos(json_object_get(row, "ratio")), "row %zu ratio finite, > 0", i);
		double n_exp = !strcmp(name, "decode-8x1") ? 8 : 1;
		saw_decode |= n_exp == 8 && T == 1;
		saw_expert1 |= !strcmp(name, "expert") && T == 1;
		CHECK(num(row, "bytes") == n_exp * expert_bytes, "row %zu bytes %.0f, want %.0f", i,
		      num(row, "bytes"), n_exp * expert_bytes);
		CHECK(num(row, "flops") == n_exp * 6.0 * H * I * T, "row %zu flops", i);
		int bw = n_exp * expert_bytes / read_Bps >= num(row, "flops") / fma;
		CHECK(!strcmp(cn, bw ? "read_GBps" : "fma_GFLOPs"), "row %zu ceiling %s", i, cn);
		double want = bw ? num(row, "bytes") / med / read_Bps : num(row, "flops") / med / fma;
		CHECK(fabs(num(row, "ratio") - want) <= 1e-9 * want, "row %zu ratio %g, want %g", i,
		      num(row, "ratio"), want);
	}
	CHECK(saw_decode && saw_expert1, "rows expert@1 and decode-8x1");
	json_decref(r);
}

int main(void)
{
	char *dir = moet_test_mkdtemp("bench");
	if (!dir) {
		fprintf(stderr, "no scratch directory\n");
		return 1;
	}
	char cmd[1024], json[600];
	snprintf(json, sizeof(json), "%s/r.json", dir);
	snprintf(cmd, sizeof(cmd), "%s bench cpu-experts --quick --hidden %d --inter %d --json %s",
		 moet_test_bin(), H, I, json);
	char *out = NULL;
	int rc = moet_test_run(cmd, &out);
	CHECK(rc == 0, "exit %d: %s", rc, out ? out : "");
	if (out) { /* the table comes last */
		size_t n = strlen(out);
		while (n && out[n - 1] == '\n')
			out[--n] = '\0';
		const char *last = strrchr(out, '\n');
		CHECK(last && !strncmp(last + 1, "decode-8x1", 10), "last line: %s",
		      last ? last + 1 : out);
	}
	free(out);
	if (rc == 0)
		check_record(json);

	moet_test_cli_expect("bench", 2, "usage: moet-hybrid bench");
	moet_test_cli_expect("bench nope", 2, "unknown bench 'nope'");
	moet_test_cli_expect("bench cpu-experts --tokens 1,0", 1, "--tokens: 0");
	moet_test_cli_expect("bench cpu-experts --tokens 1,x", 1, "--tokens");
	moet_test_cli_expect("bench cpu-experts --threads -2", 1, "--threads: '-2'");
	moet_test_cli_expect("bench cpu-experts --split diagonal", 1, "--split: 'diagonal'");
	moet_test_cli_expect("bench cpu-experts --node 99 --quick", 1, "NUMA node 99");
	moet_test_cli_expect("bench cpu-experts extra", 1, "unexpected argument 'extra'");
	snprintf(cmd, sizeof(cmd), "bench cpu-experts --quick --hidden 128 --inter 128 --tokens 1 "
		 "--reps 1 --json %s/no/such/dir/r.json", dir);
	moet_test_cli_expect(cmd, 1, "cannot write the bench record");
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	moet_test_run(cmd, NULL);
	free(dir);
	return moet_test_done("test_bench_cli");
}
