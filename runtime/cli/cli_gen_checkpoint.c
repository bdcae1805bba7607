/*
 * cli_gen_checkpoint.c: `moet-hybrid gen-checkpoint`, a synthetic checkpoint in the published
 * DeepSeek-V3 layout (runtime/moet_gen.h does the work; docs/gen-checkpoint.md explains it).
 *
 * Progress goes to stderr: one line rewritten with \r (bytes, MB/s, ETA) when stderr is a
 * terminal, otherwise one line per finished shard; nothing with --quiet.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "moet_err.h"
#include "moet_gen.h"

static const char usage_text[] =
	"usage: moet-hybrid gen-checkpoint --out DIR [options]\n"
	"\n"
	"Writes a synthetic FP8 checkpoint in the published DeepSeek-V3 layout: config.json,\n"
	"model.safetensors.index.json, model-NNNNN-of-NNNNN.safetensors, and generator.json\n"
	"(per MoE layer: the hot experts and the share of routings they are calibrated to get).\n"
	"The same arguments always give byte-identical files.\n"
	"\n"
	"options:\n"
	"  --out DIR          output directory (created; must be empty unless --force)\n"
	"  --preset NAME      tiny (default, a few MB), tiny-tp (tiny with 8 heads of 128\n"
	"                     rows: tensor-parallel tests) or kimi-k2 (Kimi-K2's layer geometry)\n"
	"  --layers N         number of layers (default: tiny 3, kimi-k2 61; layer 0 is dense)\n"
	"  --experts E        routed experts per MoE layer (a multiple of n_group)\n"
	"  --seed S           random seed, 0 <= S < 2^63 (default 0)\n"
	"  --hot-count N      hot experts per MoE layer (default: E x 120/384, rounded)\n"
	"  --hot-share F      mean share of routings the hot sets get, 0 < F < 1 (default 0.8)\n"
	"  --hot-share-by-layer F1,F2,...\n"
	"                     each MoE layer's hot share instead, one per MoE layer in order\n"
	"  --shard-mb M       shard size limit in MiB (default 4096)\n"
	"  --threads N        generator threads (default: online CPUs, at most 8)\n"
	"  --force            write into a non-empty DIR (old shards there are removed)\n"
	"  --quiet            no progress on stderr\n"
	"  --help             this text\n";

typedef struct progress_state {
	int tty;
	double t0;
	double last;
} progress_state;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void show_progress(void *ctx, const moet_gen_progress *p)
{
	progress_state *s = ctx;
	double t = now_s(), dt = t - s->t0;
	double mb = (double)p->done_bytes / 1e6, rate = dt > 0 ? mb / dt : 0;
	double left = rate > 0 ? ((double)p->total_bytes / 1e6 - mb) / rate : 0;
	bool last = p->shard_done && p->shard == p->n_shards;
	if (s->tty) {
		if (!last && !p->shard_done && t - s->last < 0.25)
			return;
		s->last = t;
		fprintf(stderr, "\rshard %d/%d  %.0f / %.0f MB  %.0f MB/s  ETA %.0f s   ", p->shard,
			p->n_shards, mb, (double)p->total_bytes / 1e6, rate, left);
		if (last)
			fputc('\n', stderr);
	} else if (p->shard_done) {
		fprintf(stderr, "shard %d/%d written: %.0f / %.0f MB, %.0f MB/s\n", p->shard,
			p->n_shards, mb, (double)p->total_bytes / 1e6, rate);
	}
}

#define MAX_BY_LAYER 1024 /* --layers' limit */

/* "0.95,0.5,..." into out[] (each a number in (0, 1)); *n the count. */
static int parse_shares(const char *s, double *out, int64_t *n)
{
	*n = 0;
	for (const char *q = s;;) {
		char *end;
		errno = 0;
		const double v = strtod(q, &end);
		if (errno || end == q || (*end && *end != ',') || !(v > 0.0 && v < 1.0))
			return moet_err(MOET_EINVAL, "--hot-share-by-layer '%s': value %lld is "
					"not a number in (0, 1)", s, (long long)*n + 1);
		if (*n == MAX_BY_LAYER)
			return moet_err(MOET_EINVAL, "--hot-share-by-layer: more than %d values",
					MAX_BY_LAYER);
		out[(*n)++] = v;
		if (!*end)
			return 0;
		q = end + 1;
	}
}

/* Whole-string integer in [lo, hi]. */
static int parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return moet_err(MOET_EINVAL, "%s '%s' is not an integer in [%lld, %lld]", opt, s,
				(long long)lo, (long long)hi);
	*out = v;
	return 0;
}

int moet_cli_gen_checkpoint(int argc, char **argv)
{
	enum { O_OUT = 256, O_PRESET, O_LAYERS, O_EXPERTS, O_SEED, O_HOT_COUNT, O_HOT_SHARE,
	       O_HOT_BY_LAYER, O_SHARD_MB, O_THREADS, O_FORCE, O_QUIET, O_HELP };
	static const struct option opts[] = {
		{ "out", required_argument, NULL, O_OUT },
		{ "preset", required_argument, NULL, O_PRESET },
		{ "layers", required_argument, NULL, O_LAYERS },
		{ "experts", required_argument, NULL, O_EXPERTS },
		{ "seed", required_argument, NULL, O_SEED },
		{ "hot-count", required_argument, NULL, O_HOT_COUNT },
		{ "hot-share", required_argument, NULL, O_HOT_SHARE },
		{ "hot-share-by-layer", required_argument, NULL, O_HOT_BY_LAYER },
		{ "shard-mb", required_argument, NULL, O_SHARD_MB },
		{ "threads", required_argument, NULL, O_THREADS },
		{ "force", no_argument, NULL, O_FORCE },
		{ "quiet", no_argument, NULL, O_QUIET },
		{ "help", no_argument, NULL, O_HELP },
		{ NULL, 0, NULL, 0 },
	};
	const char *cmd = argv[0], *out = NULL;
	moet_gen_params p;
	double by_layer[MAX_BY_LAYER];
	moet_gen_params_init(&p);
	bool quiet = false;
	int64_t v = 0;
	int rc = 0, c;

	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case O_OUT: out = optarg; break;
		case O_PRESET: rc = moet_gen_preset_parse(optarg, &p.preset); break;
		case O_LAYERS:
			rc = parse_i64("--layers", optarg, 1, 1024, &p.n_layers);
			break;
		case O_EXPERTS:
			rc = parse_i64("--experts", optarg, 1, 4096, &p.n_experts);
			break;
		case O_SEED:
			rc = parse_i64("--seed", optarg, 0, INT64_MAX, &v);
			p.seed = (uint64_t)v;
			break;
		case O_HOT_COUNT:
			rc = parse_i64("--hot-count", optarg, 1, 4096, &p.hot_count);
			break;
		case O_HOT_SHARE: {
			char *end;
			errno = 0;
			p.hot_share = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(p.hot_share > 0.0) ||
			    !(p.hot_share < 1.0))
				rc = moet_err(MOET_EINVAL,
					      "--hot-share '%s' is not a number in (0, 1)", optarg);
			break;
		}
		case O_HOT_BY_LAYER:
			rc = parse_shares(optarg, by_layer, &p.n_layer_hot_share);
			p.layer_hot_share = by_layer;
			break;
		case O_SHARD_MB:
			rc = parse_i64("--shard-mb", optarg, 1, 1 << 20, &p.shard_mb);
			break;
		case O_THREADS:
			rc = parse_i64("--threads", optarg, 1, 64, &v);
			p.n_threads = (int)v;
			break;
		case O_FORCE: p.force = true; break;
		case O_QUIET: quiet = true; break;
		case O_HELP: fputs(usage_text, stdout); return 0;
		default:
			if (optopt >= O_OUT && optopt <= O_THREADS)
				rc = moet_err(MOET_EINVAL, "option '%s' needs a value",
					      argv[optind - 1]);
			else
				rc = moet_err(MOET_EINVAL, "unknown option '%s' (see --help)",
					      argv[optind - 1]);
			break;
		}
		if (rc)
			return moet_cli_fail(cmd, rc);
	}
	if (optind < argc)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "unexpected argument '%s'",
						   argv[optind]));
	if (!out)
		return moet_cli_fail(cmd, moet_err(MOET_EINVAL, "--out DIR is required"));

	progress_state ps = { .tty = isatty(STDERR_FILENO), .t0 = now_s() };
	if (!quiet) {
		p.progress = show_progress;
		p.progress_ctx = &ps;
	}
	rc = moet_gen_checkpoint(out, &p);
	if (rc) {
		if (!quiet && ps.tty)
			fputc('\n', stderr);
		return moet_cli_fail(cmd, rc);
	}
	if (!quiet) {
		double dt = now_s() - ps.t0;
		fprintf(stderr, "wrote %s in %.1f s\n", out, dt);
	}
	return 0;
}
