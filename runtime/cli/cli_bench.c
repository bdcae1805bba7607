/*
 * cli_bench.c: `moet-hybrid bench <name> ...`: the benchmark programs (docs/benchmarks.md).
 * Each bench prints progress to stderr, a table last on stdout and, with --json FILE, the
 * record of ../shared/design/BENCHMARKS.md. One entry per bench in the table below; later
 * benches (e2e) add theirs.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_bench.h"
#include "moet_cpuexec.h"
#include "moet_err.h"

static void cpu_usage(FILE *f)
{
	fprintf(f,
		"usage: moet-hybrid bench cpu-experts [options]\n\n"
		"The CPU expert tier at the Kimi-K2 expert geometry (7168 x 2048, FP8 e4m3, 128x128\n"
		"block scales), through the CPU executor, against the read bandwidth and FMA peak of\n"
		"the same cores measured in the same run. Rows: one expert per batch at each token\n"
		"count, and decode (8 experts, 1 token each). Table last on stdout.\n\n"
		"  --threads N          worker threads (default: every core of the node)\n"
		"  --node N             NUMA node of the workers, -1 for all (default 0)\n"
		"  --tokens LIST        tokens per expert, e.g. 1,8,64 (default 1,2,4,...,256,1024)\n"
		"  --experts-rotate N   experts rotated over (default: >= 2 x L3 and >= 16)\n"
		"  --reps N             timed repetitions per row (default 10; 3 with --quick)\n"
		"  --max-row-s S        stop a row after S seconds, with at least 3 reps (default 30)\n"
		"  --split rows|experts how the executor splits a batch (default rows)\n"
		"  --quick              reduced set (tokens 1,8,64,256, rows over 10 s skipped; 8\n"
		"                       experts; 3 reps): a smoke check within a minute\n"
		"  --fast               also time fast mode (oneDNN bf16, docs/fast-mode.md) at each\n"
		"                       token count: rows expert-fast, ratio = exact / fast time\n"
		"  --hidden N --inter N expert geometry override (tests)\n"
		"  --json FILE          write the JSON record (docs/benchmarks.md)\n");
}

static int parse_int(const char *opt, const char *s, long long lo, long long hi,
		     long long *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (end == s || *end || errno || v < lo || v > hi)
		return moet_err(MOET_EINVAL, "%s: '%s' is not an integer in [%lld, %lld]", opt, s,
				lo, hi);
	*out = v;
	return 0;
}

static int cpu_experts(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "threads", required_argument, NULL, 't' },
		{ "node", required_argument, NULL, 'n' },
		{ "tokens", required_argument, NULL, 'k' },
		{ "experts-rotate", required_argument, NULL, 'e' },
		{ "reps", required_argument, NULL, 'r' },
		{ "max-row-s", required_argument, NULL, 'm' },
		{ "split", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "fast", no_argument, NULL, 'F' },
		{ "hidden", required_argument, NULL, 'H' },
		{ "inter", required_argument, NULL, 'I' },
		{ "json", required_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	moet_bench_cpu_opts o = { .split = MOET_CPUEXEC_SPLIT_ROWS };
	const char *json_path = NULL;
	int64_t *tokens = NULL;
	long long v;
	int c, rc = 0;
	optind = 1;
	while (!rc && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 't': rc = parse_int("--threads", optarg, 0, 4096, &v); o.n_threads = (int)v;
			break;
		case 'n': rc = parse_int("--node", optarg, -1, 4096, &v); o.node = (int)v; break;
		case 'e': rc = parse_int("--experts-rotate", optarg, 1, 1 << 20, &v);
			o.rotate = (int)v;
			break;
		case 'r': rc = parse_int("--reps", optarg, 1, 100000, &v); o.reps = (int)v; break;
		case 'F': o.fast = 1; break;
		case 'H': rc = parse_int("--hidden", optarg, 1, 1 << 20, &v); o.hidden = v; break;
		case 'I': rc = parse_int("--inter", optarg, 1, 1 << 20, &v); o.inter = v; break;
		case 'm': rc = parse_int("--max-row-s", optarg, 1, 86400, &v);
			o.max_row_s = (double)v;
			break;
		case 'k': {
			int64_t n = 0;
			free(tokens);
			tokens = NULL;
			rc = moet_cli_parse_tokens(optarg, &tokens, &n);
			for (int64_t i = 0; !rc && i < n; i++)
				if (tokens[i] < 1 || tokens[i] > (1 << 20))
					rc = moet_err(MOET_EINVAL, "--tokens: %lld is not a token "
						      "count in [1, 1048576]", (long long)tokens[i]);
			o.tokens = tokens;
			o.n_tokens = (int)n;
			break;
		}
		case 's':
			if (!strcmp(optarg, "rows"))
				o.split = MOET_CPUEXEC_SPLIT_ROWS;
			else if (!strcmp(optarg, "experts"))
				o.split = MOET_CPUEXEC_SPLIT_EXPERTS;
			else
				rc = moet_err(MOET_EINVAL, "--split: '%s' (want rows or experts)",
					      optarg);
			break;
		case 'q': o.quick = 1; break;
		case 'j': json_path = optarg; break;
		case 'h': cpu_usage(stdout); free(tokens); return 0;
		default: cpu_usage(stderr); free(tokens); return 2;
		}
	}
	if (!rc && optind < argc)
		rc = moet_err(MOET_EINVAL, "unexpected argument '%s'", argv[optind]);
	json_t *rec = NULL;
	if (!rc)
		rc = moet_bench_record_new("cpu-experts", &rec);
	if (!rc)
		rc = moet_bench_cpu_experts(&o, rec, stderr, stdout);
	if (!rc && json_path)
		rc = moet_bench_write(rec, json_path);
	json_decref(rec);
	free(tokens);
	return rc ? moet_cli_fail("bench cpu-experts", rc) : 0;
}

static void gpu_usage(FILE *f)
{
	fprintf(f,
		"usage: moet-hybrid bench gpu-experts [options]\n\n"
		"The CUDA contract expert kernel at the Kimi-K2 expert geometry (7168 x 2048, FP8\n"
		"e4m3, 128x128 block scales), 8 experts per grouped call, against the device copy\n"
		"bandwidth and the cuBLAS SGEMM rate (TF32 off) measured in the same run; with\n"
		"--model-dir, the decode step time of a whole model on the GPU at batch 1, 16, 64.\n"
		"Needs a CUDA device. Table last on stdout.\n\n"
		"  --tokens LIST        tokens per expert (default 1,2,4,8,16,32,64,128,256,1024)\n"
		"  --group N            experts per grouped call (default 8)\n"
		"  --experts-rotate N   experts rotated over (default: >= 4 x L2 and >= 64)\n"
		"  --reps N             timed repetitions per row (default 10; 3 with --quick)\n"
		"  --model-dir DIR      decode part: a checkpoint; when DIR is missing or empty, a\n"
		"                       2-layer kimi-k2 checkpoint with 384 experts (~22 GB) is\n"
		"                       generated there first\n"
		"  --batches LIST       decode batch sizes (default 1,16,64)\n"
		"  --steps N            timed decode steps per batch size (default 5; 3 with --quick)\n"
		"  --prompt N           prefill tokens per sequence (default 8)\n"
		"  --quick              reduced set (tokens 1,8,64,256; 16 experts; 3 reps)\n"
		"  --hidden N --inter N expert geometry override (tests)\n"
		"  --decode-device D    backend of the decode part (default cuda; cpu for tests)\n"
		"  --no-kernel          skip the ceilings and the kernel rows (tests)\n"
		"  --json FILE          write the JSON record (docs/benchmarks.md)\n");
}

/* A comma list of integers in [lo, hi] into *out (malloc'd; replaces a previous list). */
static int gpu_experts(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tokens", required_argument, NULL, 'k' },
		{ "group", required_argument, NULL, 'g' },
		{ "experts-rotate", required_argument, NULL, 'e' },
		{ "reps", required_argument, NULL, 'r' },
		{ "model-dir", required_argument, NULL, 'd' },
		{ "batches", required_argument, NULL, 'b' },
		{ "steps", required_argument, NULL, 'S' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "quick", no_argument, NULL, 'q' },
		{ "hidden", required_argument, NULL, 'H' },
		{ "inter", required_argument, NULL, 'I' },
		{ "decode-device", required_argument, NULL, 'D' },
		{ "no-kernel", no_argument, NULL, 'N' },
		{ "json", required_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	moet_bench_gpu_opts o = { 0 };
	const char *json_path = NULL;
	int64_t *tokens = NULL, *batches = NULL;
	long long v;
	int c, rc = 0;
	optind = 1;
	while (!rc && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'k': rc = moet_cli_parse_list("--tokens", optarg, 1,
							 1 << 20, &tokens, &o.n_tokens);
			o.tokens = tokens;
			break;
		case 'b': rc = moet_cli_parse_list("--batches", optarg, 1,
							 4096, &batches, &o.n_batches);
			o.batches = batches;
			break;
		case 'g': rc = parse_int("--group", optarg, 1, 64, &v); o.group = (int)v; break;
		case 'e': rc = parse_int("--experts-rotate", optarg, 1, 1 << 16, &v);
			o.rotate = (int)v;
			break;
		case 'r': rc = parse_int("--reps", optarg, 1, 100000, &v); o.reps = (int)v; break;
		case 'S': rc = parse_int("--steps", optarg, 1, 100000, &v); o.decode_steps = (int)v;
			break;
		case 'p': rc = parse_int("--prompt", optarg, 1, 1 << 16, &v); o.prompt_len = (int)v;
			break;
		case 'H': rc = parse_int("--hidden", optarg, 1, 1 << 20, &v); o.hidden = v; break;
		case 'I': rc = parse_int("--inter", optarg, 1, 1 << 20, &v); o.inter = v; break;
		case 'd': o.model_dir = optarg; break;
		case 'D':
			if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu"))
				rc = moet_err(MOET_EINVAL, "--decode-device: '%s' (want cuda or cpu)",
					      optarg);
			o.decode_device = optarg;
			break;
		case 'N': o.no_kernel = 1; break;
		case 'q': o.quick = 1; break;
		case 'j': json_path = optarg; break;
		case 'h': gpu_usage(stdout); free(tokens); free(batches); return 0;
		default: gpu_usage(stderr); free(tokens); free(batches); return 2;
		}
	}
	if (!rc && optind < argc)
		rc = moet_err(MOET_EINVAL, "unexpected argument '%s'", argv[optind]);
	if (!rc && o.no_kernel && !o.model_dir)
		rc = moet_err(MOET_EINVAL, "--no-kernel leaves nothing to run without --model-dir");
	json_t *rec = NULL;
	if (!rc)
		rc = moet_bench_record_new("gpu-experts", &rec);
	if (!rc)
		rc = moet_bench_gpu_experts(&o, rec, stderr, stdout);
	if (!rc && json_path)
		rc = moet_bench_write(rec, json_path);
	json_decref(rec);
	free(tokens);
	free(batches);
	return rc ? moet_cli_fail("bench gpu-experts", rc) : 0;
}

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} benches[] = {
	{ "cpu-experts", cpu_experts, "CPU expert kernel vs read bandwidth and FMA peak" },
	{ "gpu-experts", gpu_experts, "CUDA expert kernel vs copy bandwidth and SGEMM rate" },
	{ "e2e", moet_cli_bench_e2e, "the whole model per placement: decode, prefill, overlap" },
	{ "load", moet_cli_bench_load, "io_uring load of the CPU tier vs disk and h2d bandwidth" },
	{ "serve", moet_cli_bench_serve, "server overhead vs the same steps replayed bare; N streams vs 1" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid bench <name> [options]   (moet-hybrid bench <name> --help)"
		   "\n\nbenches:\n");
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
		fprintf(f, "  %-14s %s\n", benches[i].name, benches[i].summary);
}

int moet_cli_bench(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
		if (!strcmp(argv[1], benches[i].name))
			return benches[i].run(argc - 1, argv + 1);
	fprintf(stderr, "moet-hybrid bench: unknown bench '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
