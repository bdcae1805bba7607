/*
 * bench.c: the bench record of moet_bench.h: statistics, machine description, git state,
 * command line, JSON output.
 *
 * NOTE: the git state is asked at run time (git -C <source dir>), not baked in at configure
 * time, so a binary rebuilt from a tree with new edits never reports a stale commit. The
 * source dir is compiled in (MOET_SOURCE_DIR, CMakeLists.txt); a run on a machine that got a
 * copy without .git passes MOET_GIT_COMMIT / MOET_GIT_DIRTY instead.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moet_bench.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_topo.h"

#ifndef MOET_SOURCE_DIR
#define MOET_SOURCE_DIR ""
#endif

double moet_bench_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

void moet_bench_stats_of(double *s, int n, moet_bench_stats *out)
{
	qsort(s, (size_t)n, sizeof(double), cmp_double);
	out->reps = n;
	out->min_s = s[0];
	out->max_s = s[n - 1];
	out->median_s = (n % 2) ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

double moet_bench_mean(const double *s, int n)
{
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += s[i];
	return sum / n;
}

/* First line of `cmd`'s stdout without its newline, or "" (also when the command fails). */
static void run_line(const char *cmd, char *out, size_t n)
{
	out[0] = '\0';
	FILE *p = popen(cmd, "r");
	if (!p)
		return;
	if (!fgets(out, (int)n, p))
		out[0] = '\0';
	out[strcspn(out, "\n")] = '\0';
	if (pclose(p) != 0)
		out[0] = '\0';
}

static json_t *git_json(void)
{
	const char *c = getenv("MOET_GIT_COMMIT"), *d = getenv("MOET_GIT_DIRTY");
	char commit[128] = "", cmd[1200];
	json_t *dirty = json_null();
	if (c && c[0]) {
		snprintf(commit, sizeof(commit), "%s", c);
		if (d && d[0])
			dirty = json_boolean(d[0] == '1');
	} else if (MOET_SOURCE_DIR[0] && !strchr(MOET_SOURCE_DIR, '\'')) {
		snprintf(cmd, sizeof(cmd), "git -C '%s' rev-parse HEAD 2>/dev/null", MOET_SOURCE_DIR);
		run_line(cmd, commit, sizeof(commit));
		if (commit[0]) {
			char line[512];
			snprintf(cmd, sizeof(cmd), "git -C '%s' status --porcelain --untracked-files=no "
				 "2>/dev/null; echo end", MOET_SOURCE_DIR);
			run_line(cmd, line, sizeof(line));
			dirty = json_boolean(strcmp(line, "end") != 0);
		}
	}
	return json_pack("{s:s, s:o}", "commit", commit[0] ? commit : "unknown", "dirty", dirty);
}

static json_t *cmdline_json(void)
{
	char buf[8192];
	size_t n = 0;
	FILE *f = fopen("/proc/self/cmdline", "rb");
	if (f) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	char out[10000];
	size_t k = 0;
	for (size_t i = 0; i < n && k + 4 < sizeof(out);) {
		const char *arg = buf + i;
		size_t len = strnlen(arg, n - i);
		int quote = len == 0 || strpbrk(arg, " \t\"'$\\") != NULL;
		if (k)
			out[k++] = ' ';
		if (quote)
			out[k++] = '\'';
		for (size_t j = 0; j < len && k + 6 < sizeof(out); j++) {
			if (arg[j] == '\'') {
				memcpy(out + k, "'\\''", 4);
				k += 4;
			} else {
				out[k++] = arg[j];
			}
		}
		if (quote)
			out[k++] = '\'';
		i += len + 1;
	}
	out[k] = '\0';
	return json_string(out);
}

/* "model name" and the flags of interest from /proc/cpuinfo. */
static void cpu_info(char *model, size_t n, json_t *flags)
{
	static const char *const want[] = { "avx2", "fma", "avx512f", "avx512bw", "avx512vl",
					    "avx512dq", "avx512_vbmi", "avx512_bf16", "avx512_fp16",
					    "amx_tile", "amx_bf16", "amx_int8" };
	snprintf(model, n, "unknown");
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (!f)
		return;
	char line[8192];
	int got_model = 0, got_flags = 0;
	while (fgets(line, sizeof(line), f) && !(got_model && got_flags)) {
		char *colon = strchr(line, ':');
		if (!colon)
			continue;
		char *val = colon + 1 + (colon[1] == ' ');
		val[strcspn(val, "\n")] = '\0';
		if (!got_model && !strncmp(line, "model name", 10)) {
			snprintf(model, n, "%s", val);
			got_model = 1;
		} else if (!got_flags && !strncmp(line, "flags", 5)) {
			got_flags = 1;
			for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
				char pat[64];
				snprintf(pat, sizeof(pat), " %s ", want[i]);
				char padded[8200];
				snprintf(padded, sizeof(padded), " %s ", val);
				if (strstr(padded, pat))
					json_array_append_new(flags, json_string(want[i]));
			}
		}
	}
	fclose(f);
}

static json_t *machine_json(void)
{
	char model[256], host[256] = "";
	json_t *flags = json_array();
	cpu_info(model, sizeof(model), flags);
	gethostname(host, sizeof(host) - 1);
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	const char *why = NULL;
	int gpus = moet_gpu_count(&why);
	moet_topo *t = NULL;
	int cores = -1, nodes = -1;
	json_int_t l3 = -1;
	if (moet_topo_load(&t) == 0) {
		cores = moet_topo_n_cores(t);
		nodes = moet_topo_n_nodes(t);
		l3 = (json_int_t)moet_topo_l3_bytes(t);
		moet_topo_destroy(t);
	}
	moet_err_clear();
	return json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:o, s:i, s:s}", "hostname", host,
			 "cpu_model", model, "cores", cores, "cpus_online",
			 (int)sysconf(_SC_NPROCESSORS_ONLN), "numa_nodes", nodes, "l3_bytes", l3,
			 "ram_bytes", (json_int_t)pages * psz, "flags", flags, "gpus", gpus,
			 "gpu_note", gpus ? "" : (why ? why : ""));
}

int moet_bench_record_new(const char *bench, json_t **out)
{
	char date[64];
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm);
	*out = json_pack("{s:i, s:s, s:s, s:o, s:o, s:o, s:{}, s:[]}", "schema", MOET_BENCH_SCHEMA,
			 "bench", bench, "date", date, "git", git_json(), "command", cmdline_json(),
			 "machine", machine_json(), "ceilings", "results");
	return *out ? 0 : moet_err(MOET_ENOMEM, "bench record");
}

int moet_bench_add_ceiling(json_t *rec, const char *name, double value, const char *unit)
{
	json_t *c = json_object_get(rec, "ceilings");
	if (!c || json_object_set_new(c, name, json_pack("{s:f, s:s}", "value", value, "unit",
							       unit)))
		return moet_err(MOET_ENOMEM, "bench record: ceiling %s", name);
	return 0;
}

int moet_bench_add_row(json_t *rec, const moet_bench_row *r)
{
	json_t *row = json_pack("{s:s}", "name", r->name), *res = json_object_get(rec, "results");
	if (!row || !res) {
		json_decref(row);
		goto fail;
	}
	if (r->tokens >= 0)
		json_object_set_new(row, "tokens", json_integer(r->tokens));
	json_object_set_new(row, "median_s", json_real(r->st.median_s));
	json_object_set_new(row, "min_s", json_real(r->st.min_s));
	json_object_set_new(row, "max_s", json_real(r->st.max_s));
	if (r->mean_s > 0)
		json_object_set_new(row, "mean_s", json_real(r->mean_s));
	json_object_set_new(row, "reps", json_integer(r->st.reps));
	if (r->bytes > 0)
		json_object_set_new(row, "bytes", json_real(r->bytes));
	if (r->flops > 0)
		json_object_set_new(row, "flops", json_real(r->flops));
	json_object_set_new(row, "ceiling", json_string(r->ceiling));
	json_object_set_new(row, "ratio", json_real(r->ratio));
	if (json_array_append_new(res, row))
		goto fail;
	return 0;
fail:
	return moet_err(MOET_ENOMEM, "bench record: row %s", r->name);
}

int moet_bench_write(const json_t *rec, const char *path)
{
	if (json_dump_file(rec, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
		return moet_err(MOET_EIO, "%s: cannot write the bench record", path);
	return 0;
}
