/*
 * cli_serve.c: `moet-hybrid serve`: the OpenAI-compatible server (runtime/moet_serve.h,
 * docs/serve.md). Runs in the foreground until SIGINT or SIGTERM, then stops cleanly
 * (requests in flight are cancelled, every thread joined).
 *
 * The one log line tests and scripts read: "serve: listening on http://HOST:PORT" (stderr),
 * printed once the socket is bound, with the real port when --port 0 asked for any.
 */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "moet_bench.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_serve.h"
#include "moet_tokenizer.h"

#define DEMO_NOTE "synthetic untrained demo model (random weights: its text is meaningless), " \
		  "gen-checkpoint --preset tiny --seed 1 with the project's own tokenizer"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: moet-hybrid serve [--model DIR] [options]\n\n"
		"OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions (SSE\n"
		"streaming or not), GET /v1/models, /health, /metrics (docs/serve.md). Without\n"
		"--model it serves the embedded demo: a synthetic, untrained checkpoint with the\n"
		"project's own tokenizer, made on first use in $XDG_CACHE_HOME/moet-hybrid/demo-tiny.\n\n"
		"  --model DIR            checkpoint directory (config.json, shards, tokenizer.json)\n"
		"  --tokenizer FILE       tokenizer.json (default: DIR/tokenizer.json; without one\n"
		"                         only token-id prompts are accepted)\n"
		"  --model-id NAME        the model's name in the API (default: DIR's base name)\n"
		"  --device D             cpu (default) or cuda\n"
		"  --placement F          expert placement file (docs/placement.md)\n"
		"  --sim-devices N        simulated devices on --device cpu\n"
		"  --shadow RATE          recompute a share of the CPU tier's expert calls on the\n"
		"                         backend and compare bits (metrics moet_shadow_*)\n"
		"  --host ADDR            address to bind (default 127.0.0.1)\n"
		"  --port N               port (default 8000; 0: any free port, printed)\n"
		"  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/ (else 401)\n"
		"  --max-requests N       requests running or queued at once (default 64; more: 429)\n"
		"  --kv-tokens N          KV positions shared by all sequences (default 16384);\n"
		"                         each request reserves prompt + max_tokens when admitted\n"
		"  --max-batch-tokens N   tokens per forward step, decodes + prefill chunks (256)\n"
		"  --max-prompt-tokens N  longest prompt (default: the context - 1; longer: 413)\n"
		"  --max-body-bytes N     largest request body (default 1048576; larger: 413)\n");
}

static int parse_num(const char *opt, const char *s, long long lo, long long hi,
		     long long *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (end == s || *end || errno || v < lo || v > hi)
		return moet_err(MOET_EINVAL, "%s '%s' is not an integer in [%lld, %lld]", opt, s,
				lo, hi);
	*out = v;
	return 0;
}

static int file_exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

int moet_cli_serve(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "tokenizer", required_argument, NULL, 't' },
		{ "model-id", required_argument, NULL, 'i' },
		{ "device", required_argument, NULL, 'd' },
		{ "placement", required_argument, NULL, 'P' },
		{ "sim-devices", required_argument, NULL, 'N' },
		{ "shadow", required_argument, NULL, 'W' },
		{ "host", required_argument, NULL, 'H' },
		{ "port", required_argument, NULL, 'p' },
		{ "api-key", required_argument, NULL, 'k' },
		{ "max-requests", required_argument, NULL, 'r' },
		{ "kv-tokens", required_argument, NULL, 'K' },
		{ "max-batch-tokens", required_argument, NULL, 'b' },
		{ "max-prompt-tokens", required_argument, NULL, 'L' },
		{ "max-body-bytes", required_argument, NULL, 'B' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *model_dir = NULL, *tok_path = NULL, *device = "cpu", *place = NULL;
	moet_serve_opts so = { .port = 8000 };
	long long v = 0, sim = -1;
	double shadow = 0;
	int c, rc = 0;
	optind = 1;
	while (!rc && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model_dir = optarg; break;
		case 't': tok_path = optarg; break;
		case 'i': so.model_id = optarg; break;
		case 'd': device = optarg; break;
		case 'P': place = optarg; break;
		case 'N': rc = parse_num("--sim-devices", optarg, 0, 16, &sim); break;
		case 'W': {
			char *end;
			shadow = strtod(optarg, &end);
			if (*end || !(shadow > 0 && shadow <= 1))
				rc = moet_err(MOET_EINVAL, "--shadow '%s': a rate in (0, 1]", optarg);
			break;
		}
		case 'H': so.host = optarg; break;
		case 'p': rc = parse_num("--port", optarg, 0, 65535, &v); so.port = (int)v; break;
		case 'k': so.api_key = optarg; break;
		case 'r':
			rc = parse_num("--max-requests", optarg, 1, 4096, &v);
			so.sched.max_requests = (int)v;
			break;
		case 'K':
			rc = parse_num("--kv-tokens", optarg, 2, INT64_C(1) << 40, &v);
			so.sched.kv_tokens = v;
			break;
		case 'b':
			rc = parse_num("--max-batch-tokens", optarg, 1, 1 << 20, &v);
			so.sched.max_batch_tokens = v;
			break;
		case 'L':
			rc = parse_num("--max-prompt-tokens", optarg, 1, INT64_C(1) << 40, &v);
			so.max_prompt_tokens = v;
			break;
		case 'B':
			rc = parse_num("--max-body-bytes", optarg, 64, INT64_C(1) << 32, &v);
			so.max_body_bytes = (size_t)v;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (rc)
		return moet_cli_fail("serve", rc);
	/* NOTE: SIGINT/SIGTERM are blocked before any thread starts (the generator's, the CPU
	 * team's, the server's), so every thread inherits the mask and only sigwait below takes
	 * them; one that arrives while the model loads stops the server as soon as it is up. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (optind < argc)
		return moet_cli_fail("serve", moet_err(MOET_EINVAL, "unexpected argument '%s'",
						       argv[optind]));
	char demo[4096], tpath[4200], idbuf[256];
	int is_demo = !model_dir;
	if (is_demo) {
		if ((rc = moet_serve_demo_dir(demo, sizeof(demo))))
			return moet_cli_fail("serve", rc);
		fprintf(stderr, "serve: no --model: the embedded demo in %s (%s)\n", demo,
			DEMO_NOTE);
		if ((rc = moet_serve_demo_ensure(demo)))
			return moet_cli_fail("serve", rc);
		model_dir = demo;
		so.model_note = DEMO_NOTE;
		if (!so.model_id)
			so.model_id = "moet-demo-tiny";
	}
	if (!so.model_id) {
		snprintf(tpath, sizeof(tpath), "%s", model_dir);
		size_t n = strlen(tpath);
		while (n > 1 && tpath[n - 1] == '/')
			tpath[--n] = 0;
		snprintf(idbuf, sizeof(idbuf), "%s", basename(tpath));
		so.model_id = idbuf;
	}
	if (!tok_path) {
		snprintf(tpath, sizeof(tpath), "%s/tokenizer.json", model_dir);
		if (file_exists(tpath))
			tok_path = tpath;
	}
	moet_model *m = NULL;
	moet_tokenizer *tok = NULL;
	moet_serve *sv = NULL;
	int n_dev = 0;
	if ((rc = moet_model_open_on(model_dir, device, &m)))
		goto out;
	if (place && (rc = moet_cli_apply_placement(m, place, (int)sim, &n_dev)))
		goto out;
	if (shadow > 0 && (rc = moet_model_set_shadow(m, shadow)))
		goto out;
	so.sched.n_devices = n_dev;
	if (tok_path && (rc = moet_tokenizer_load(tok_path, &tok)))
		goto out;
	if (!tok)
		fprintf(stderr, "serve: %s has no tokenizer.json: token-id prompts only\n",
			model_dir);
	if ((rc = moet_serve_start(m, tok, &so, &sv)))
		goto out;
	moet_sched_opts eff;
	moet_sched_get_opts(moet_serve_sched(sv), &eff);
	fprintf(stderr, "serve: model '%s' from %s on %s%s%s; max %d requests, %lld KV tokens, "
		"%lld tokens per step\n", so.model_id, model_dir, device, place ? ", placement " : "",
		place ? place : "", eff.max_requests, (long long)eff.kv_tokens,
		(long long)eff.max_batch_tokens);
	fprintf(stderr, "serve: listening on http://%s:%d\n", so.host ? so.host : "127.0.0.1",
		moet_serve_port(sv));
	int sig = 0;
	sigwait(&sigs, &sig);
	fprintf(stderr, "serve: signal %d, stopping\n", sig);
out:
	moet_serve_stop(sv);
	moet_tokenizer_destroy(tok);
	moet_model_close(m);
	return rc ? moet_cli_fail("serve", rc) : 0;
}

/* `moet-hybrid bench serve` (its row in cli_bench.c's table). */
int moet_cli_bench_serve(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "device", required_argument, NULL, 'd' },
		{ "streams", required_argument, NULL, 's' },
		{ "tokens", required_argument, NULL, 't' },
		{ "prompt-words", required_argument, NULL, 'w' },
		{ "reps", required_argument, NULL, 'r' },
		{ "quick", no_argument, NULL, 'q' },
		{ "json", required_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	moet_serve_bench_opts o = { .streams = 16, .tokens = 64, .prompt_words = 16, .reps = 5 };
	const char *json_path = NULL;
	long long v;
	int c, rc = 0;
	optind = 1;
	while (!rc && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o.model_dir = optarg; break;
		case 'd': o.device = optarg; break;
		case 's': rc = parse_num("--streams", optarg, 1, 1024, &v); o.streams = (int)v; break;
		case 't': rc = parse_num("--tokens", optarg, 2, 100000, &v); o.tokens = (int)v; break;
		case 'w':
			rc = parse_num("--prompt-words", optarg, 1, 500, &v);
			o.prompt_words = (int)v;
			break;
		case 'r': rc = parse_num("--reps", optarg, 1, 100, &v); o.reps = (int)v; break;
		case 'q': o.reps = 2; o.tokens = 32; break;
		case 'j': json_path = optarg; break;
		case 'h':
			printf("usage: moet-hybrid bench serve [--model DIR] [--device D] "
			       "[--streams N] [--tokens N]\n"
			       "                          [--prompt-words N] [--reps N] [--quick] "
			       "[--json FILE]\n\n"
			       "Server overhead (HTTP + tokenizer + scheduling) as a share of the decode "
			       "step:\nbare batched decode of N sequences vs the same through the "
			       "server with N\nstreaming clients on loopback (docs/serve.md). Default: "
			       "the demo, 16 streams x 64\ntokens, 5 reps; --quick: 2 reps x 32 "
			       "tokens.\n");
			return 0;
		default: return 2;
		}
	}
	if (rc)
		return moet_cli_fail("bench serve", rc);
	signal(SIGPIPE, SIG_IGN);
	json_t *rec = NULL;
	if (!(rc = moet_bench_record_new("serve", &rec)))
		rc = moet_serve_bench(&o, rec, stderr, stdout);
	if (!rc && json_path)
		rc = moet_bench_write(rec, json_path);
	json_decref(rec);
	return rc ? moet_cli_fail("bench serve", rc) : 0;
}
