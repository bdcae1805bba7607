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
		"  --kv-tokens N          KV positions shared by all sequences (default: what fits\n"
		"                         in 90%% of the free memory beside the model, at most\n"
		"                         16384); each request reserves prompt + max_tokens when\n"
		"                         admitted\n"
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
	if ((rc = moet_cli_open(model_dir, device, place, &m)))
		goto out;
	if (place && (rc = moet_cli_apply_placement(m, place, (int)sim, &n_dev)))
		goto out;
	if (shadow > 0 && (rc = moet_model_set_shadow(m, shadow)))
		goto out;
	so.sched.n_devices = n_dev;
	/* the CPU tier made resident at the bind: every 60 s, is it still? (metrics, a warning) */
	so.sched.resident_check_s = 60.0;
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

static void bench_usage(FILE *f)
{
	fprintf(f,
		"usage: moet-hybrid bench serve [--model DIR] [--device cpu|cuda] [--streams LIST]\n"
		"                          [--tokens N] [--prompt-words N] [--reps N] [--quick]\n"
		"                          [--same-prompt]\n"
		"                          [--placement FILE | --hot-per-layer K --profile P]\n"
		"                          [--json FILE]\n\n"
		"Per stream count N, each rep runs N prompts (stream s its own) three ways: bare\n"
		"(N decodes in lockstep), served (N streaming clients on loopback; every engine\n"
		"step recorded) and replay (the served steps again on the bare model: the same\n"
		"prompts, batches and work). Reported (docs/serve.md): the server's overhead\n"
		"(served / replay - 1), the served steps of N decodes against the bare step, the\n"
		"served batch-size histogram, tokens/s and its ratio to the smallest count's.\n"
		"Default: the demo, --streams 16, 64 tokens, 5 reps; --quick: 2 reps x 32 tokens.\n\n"
		"  --streams LIST       stream counts, each measured in the same run (e.g. 1,16)\n"
		"  --same-prompt        every stream stream 0's prompt, bare and served (the load\n"
		"                       before issue 7's fix: one sequence's experts per step)\n"
		"  --placement FILE     a hybrid placement (docs/placement.md) for every row; on\n"
		"                       --device cpu its GPUs are simulated devices\n"
		"  --hot-per-layer K --profile P\n"
		"                       the placement `plan --hot-per-layer K` makes from profile P\n"
		"                       (one GPU, no memory budget)\n"
		"With a placement, before it is set: every expert resident, each count's bare step\n"
		"and the experts each step touches; the CPU tier's read ceiling and the GPU's copy\n"
		"ceiling measured now; then the rows beside the bytes-roofline prediction (max over\n"
		"tiers of touched bytes / bandwidth, plus the resident step's non-expert time) and\n"
		"measured / predicted for the bare step and the served steps of N decodes. The\n"
		"model must fit on the device with every expert resident.\n");
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
		{ "same-prompt", no_argument, NULL, 'S' },
		{ "placement", required_argument, NULL, 'p' },
		{ "hot-per-layer", required_argument, NULL, 'k' },
		{ "profile", required_argument, NULL, 'P' },
		{ "json", required_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	moet_serve_bench_opts o = { .tokens = 64, .prompt_words = 16, .reps = 5 };
	const char *json_path = NULL, *place = NULL, *prof = NULL;
	char demo[4096], label[4200];
	int64_t *streams = NULL;
	int16_t *owner = NULL;
	long long v, hot = 0;
	int c, rc = 0;
	optind = 1;
	while (!rc && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o.model_dir = optarg; break;
		case 'd':
			if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu"))
				rc = moet_err(MOET_EINVAL, "--device: '%s' (want cpu or cuda)", optarg);
			o.device = optarg;
			break;
		case 's':
			rc = moet_cli_parse_list("--streams", optarg, 1, 1024, &streams, &o.n_streams);
			if (!rc && o.n_streams > 64)
				rc = moet_err(MOET_EINVAL, "--streams: %d counts (at most 64)",
					      o.n_streams);
			o.streams = streams;
			break;
		case 't': rc = parse_num("--tokens", optarg, 2, 100000, &v); o.tokens = (int)v; break;
		case 'w':
			rc = parse_num("--prompt-words", optarg, 1, 500, &v);
			o.prompt_words = (int)v;
			break;
		case 'r': rc = parse_num("--reps", optarg, 1, 100, &v); o.reps = (int)v; break;
		case 'q': o.reps = 2; o.tokens = 32; break;
		case 'S': o.same_prompt = 1; break;
		case 'p': place = optarg; break;
		case 'k': rc = parse_num("--hot-per-layer", optarg, 1, 1 << 20, &hot); break;
		case 'P': prof = optarg; break;
		case 'j': json_path = optarg; break;
		case 'h': bench_usage(stdout); free(streams); return 0;
		default: bench_usage(stderr); free(streams); return 2;
		}
	}
	if (!rc && optind < argc)
		rc = moet_err(MOET_EINVAL, "unexpected argument '%s'", argv[optind]);
	if (!rc && place && (hot || prof))
		rc = moet_err(MOET_EINVAL, "--placement FILE or --hot-per-layer K --profile P, not "
			      "both");
	if (!rc && !!hot != !!prof)
		rc = moet_err(MOET_EINVAL, hot ? "--hot-per-layer needs --profile P (the routing "
			      "it ranks experts by)" : "--profile needs --hot-per-layer K");
	/* the placement is read against the model: the demo's when there is no --model */
	if (!rc && (place || hot) && !o.model_dir &&
	    !(rc = moet_serve_demo_dir(demo, sizeof(demo))) && !(rc = moet_serve_demo_ensure(demo)))
		o.model_dir = demo;
	if (!rc && place) {
		if ((rc = moet_cli_load_owner(o.model_dir, place, &owner, &o.n_devices)))
			rc = moet_err_prefix(rc, "--placement");
		snprintf(label, sizeof(label), "%s", place);
	} else if (!rc && hot) {
		if ((rc = moet_cli_hot_owner(o.model_dir, prof, hot, &owner)))
			rc = moet_err_prefix(rc, "--hot-per-layer %lld --profile", hot);
		o.n_devices = 1;
		snprintf(label, sizeof(label), "hot %lld per layer of %s", hot, prof);
	}
	if (!rc && owner && o.n_devices < 1)
		rc = moet_err(MOET_EINVAL, "--placement %s names no GPU: nothing to predict a "
			      "hybrid step for", place);
	o.owner = owner;
	o.placement = owner ? label : NULL;
	json_t *rec = NULL;
	if (!rc) {
		signal(SIGPIPE, SIG_IGN);
		rc = moet_bench_record_new("serve", &rec);
	}
	if (!rc)
		rc = moet_serve_bench(&o, rec, stderr, stdout);
	if (!rc && json_path)
		rc = moet_bench_write(rec, json_path);
	json_decref(rec);
	free(streams);
	free(owner);
	return rc ? moet_cli_fail("bench serve", rc) : 0;
}
