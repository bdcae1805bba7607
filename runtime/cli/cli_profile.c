/*
 * cli_profile.c: `moet-hybrid profile`: routing statistics of prompts, for the planner.
 *
 *   prompts (JSONL token ids, or drawn from generator.json's mix)
 *     -> batches of --batch sequences: one prefill call, then --max-new greedy decode calls
 *        (moet_model_forward_batch; argmax, ties to the lowest id)
 *     -> the route observer counts every (phase, layer, expert) plainly and by weight
 *     -> profile.json (placement/moet_profile.h), optionally added to merged profiles
 *
 * NOTE: the phase is the call's (the prompt's tokens are prefill, every fed-back token decode),
 * not the observer's is_prefill flag, which calls a one-token prompt decode. Decoding does not
 * stop at eos: the profile is of routing, and a fixed step count keeps the totals simple.
 */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "moet_err.h"
#include "moet_json.h"
#include "moet_model.h"
#include "moet_profile.h"

#define MAX_PROMPT_TOKENS 65536

static void usage(FILE *f)
{
	fprintf(f,
		"usage: moet-hybrid profile --model DIR (--prompts FILE.jsonl | --synthetic N "
		"[--seed S])\n"
		"                           [--max-new N] [--batch N] [--device cpu] "
		"[--quiet] --out PROFILE.json\n"
		"                           [--merge A.json,B.json,...]\n"
		"       moet-hybrid profile --merge A.json,B.json,... --out PROFILE.json\n\n"
		"Runs prompts through prefill and --max-new greedy decode steps and counts, per\n"
		"phase (prefill, decode), MoE layer and routed expert, how often the router\n"
		"chose the expert and the sum of its routing weights. Merging adds counts.\n"
		"The file format is in docs/profile-and-plan.md.\n\n"
		"  --model DIR       checkpoint directory\n"
		"  --prompts FILE    JSON lines, each {\"tokens\": [id, ...]} (\"prompt\" strings\n"
		"                    need a tokenizer: not yet, issue 7)\n"
		"  --synthetic N     N prompts from the generator's mix (gen-checkpoint models:\n"
		"                    DIR/generator.json): a random token class, a random length\n"
		"                    8..64, tokens uniform within the class\n"
		"  --seed S          seed of --synthetic (default 0)\n"
		"  --max-new N       decode steps per prompt (default 16; 0: prefill only)\n"
		"  --batch N         sequences per forward call (default 8)\n"
		"  --device D        cpu (default) or cuda\n"
		"  --merge LIST      profiles to add (comma-separated); alone: just merge them\n"
		"  --out FILE        the profile to write\n"
		"  --quiet           no progress on stderr\n");
}

typedef struct prompts {
	int64_t n;
	int64_t **tok;
	int64_t *len;
} prompts;

static void prompts_free(prompts *ps)
{
	for (int64_t i = 0; i < ps->n; i++)
		free(ps->tok[i]);
	free(ps->tok);
	free(ps->len);
}

static int prompts_push(prompts *ps, int64_t *tok, int64_t len)
{
	int64_t **t = realloc(ps->tok, (size_t)(ps->n + 1) * sizeof(*t));
	if (t)
		ps->tok = t;
	int64_t *l = realloc(ps->len, (size_t)(ps->n + 1) * sizeof(*l));
	if (l)
		ps->len = l;
	if (!t || !l) {
		free(tok);
		return moet_err(MOET_ENOMEM, "prompts");
	}
	ps->tok[ps->n] = tok;
	ps->len[ps->n++] = len;
	return 0;
}

/* One JSONL line: {"tokens": [ids]}. */
static int parse_line(const char *path, int64_t ln, const char *line, int64_t V, int64_t max_len,
		      prompts *ps)
{
	json_error_t je;
	json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &je), *t;
	int64_t *tok = NULL;
	int rc = 0;
	if (!o)
		return moet_err(MOET_EFORMAT, "%s:%" PRId64 ":%d: malformed JSON: %s", path, ln,
				je.column, je.text);
	if (!json_is_object(o)) {
		rc = moet_err(MOET_EFORMAT,
			      "%s:%" PRId64 ": must be an object {\"tokens\": [...]}, "
			      "not %s",
			      path, ln, moet_json_kind(o));
	} else if (json_object_get(o, "prompt")) {
		rc = moet_err(MOET_EUNSUP, "%s:%" PRId64 ": \"prompt\" strings need a tokenizer, "
			      "which moet-hybrid does not have yet (issue 7); give token ids as "
			      "{\"tokens\": [...]}", path, ln);
	} else if (!(t = json_object_get(o, "tokens"))) {
		rc = moet_err(MOET_EFORMAT, "%s:%" PRId64 ": field tokens is missing", path, ln);
	} else if (!json_is_array(t) || !json_array_size(t) ||
		   (int64_t)json_array_size(t) > max_len) {
		rc = moet_err(MOET_EFORMAT,
			      "%s:%" PRId64 ": tokens: must be an array of 1..%" PRId64
			      " token ids, not %s of %zu",
			      path, ln, max_len, moet_json_kind(t),
			      json_is_array(t) ? json_array_size(t) : (size_t)0);
	} else if (!(tok = malloc(json_array_size(t) * sizeof(*tok)))) {
		rc = moet_err(MOET_ENOMEM, "prompts");
	} else {
		size_t i;
		json_t *v;
		json_array_foreach(t, i, v) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 ||
			    json_integer_value(v) >= V) {
				rc = moet_err(MOET_EFORMAT,
					      "%s:%" PRId64 ": tokens[%zu]: must be a "
					      "token id in [0, %" PRId64 ") (vocab_size)",
					      path, ln, i, V);
				break;
			}
			tok[i] = json_integer_value(v);
		}
		if (!rc)
			rc = prompts_push(ps, tok, (int64_t)json_array_size(t));
		else
			free(tok);
	}
	json_decref(o);
	return rc;
}

static int read_jsonl(const char *path, int64_t V, int64_t max_len, prompts *ps)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	int64_t ln = 0;
	int rc = 0;
	if (!f)
		return moet_err(MOET_EIO, "%s: cannot open", path);
	while (!rc && getline(&line, &cap, f) >= 0) {
		ln++;
		if (strspn(line, " \t\r\n") == strlen(line))
			continue;
		rc = parse_line(path, ln, line, V, max_len, ps);
	}
	if (!rc && ferror(f))
		rc = moet_err(MOET_EIO, "%s: read error", path);
	if (!rc && !ps->n)
		rc = moet_err(MOET_EFORMAT, "%s: no prompts", path);
	free(line);
	fclose(f);
	return rc;
}

static uint64_t next_rand(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* N prompts of the generator's mix: class uniform, length 8..64, ids uniform in the class. */
static int draw_synthetic(const moet_gen_truth *t, int64_t n, uint64_t seed, prompts *ps)
{
	uint64_t x = seed;
	for (int64_t i = 0; i < n; i++) {
		int c = (int)(next_rand(&x) % (uint64_t)t->n_classes);
		int64_t len = 8 + (int64_t)(next_rand(&x) % 57), lo, hi;
		int64_t *tok = malloc((size_t)len * sizeof(*tok));
		if (!tok)
			return moet_err(MOET_ENOMEM, "prompts");
		moet_gen_truth_class_range(t, c, &lo, &hi);
		for (int64_t j = 0; j < len; j++)
			tok[j] = lo + (int64_t)(next_rand(&x) % (uint64_t)(hi - lo));
		int rc = prompts_push(ps, tok, len);
		if (rc)
			return rc;
	}
	return 0;
}

typedef struct observer {
	moet_profile *p;
	int phase;
	int rc;
} observer;

static void on_route(void *ctx, const moet_route_event *ev)
{
	observer *o = ctx;
	if (!o->rc)
		o->rc = moet_profile_record(o->p, o->phase, ev->layer, ev->ids, ev->weights,
					    ev->top_k);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prompts [first, first + n) in one batch: prefill, then max_new decode steps. */
static int run_batch(moet_model *m, const prompts *ps, int64_t first, int n, int64_t max_new,
		     observer *ob, float *logits, int64_t *next)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	moet_kv *kv[256] = { 0 };
	moet_seq_step st[256];
	int rc = 0;
	for (int s = 0; !rc && s < n; s++)
		rc = moet_kv_create(m, ps->len[first + s] + max_new, &kv[s]);
	for (int64_t step = 0; !rc && step <= max_new; step++) {
		for (int s = 0; s < n; s++) {
			st[s] = (moet_seq_step){.kv = kv[s],
						.last_only = 1,
						.out_logits =
							step < max_new ? logits + s * V : NULL};
			if (step == 0) {
				st[s].tokens = ps->tok[first + s];
				st[s].n_tok = ps->len[first + s];
			} else {
				st[s].tokens = &next[s];
				st[s].n_tok = 1;
			}
		}
		ob->phase = step == 0 ? MOET_PROFILE_PREFILL : MOET_PROFILE_DECODE;
		rc = moet_model_forward_batch(m, st, n);
		if (!rc)
			rc = ob->rc;
		for (int s = 0; !rc && s < n && step < max_new; s++) {
			const float *row = logits + s * V;
			int64_t best = 0;
			for (int64_t v = 1; v < V; v++)
				best = row[v] > row[best] ? v : best;
			next[s] = best;
		}
		for (int s = 0; !rc && s < n; s++)
			ob->p->n_tokens[ob->phase] += (uint64_t)st[s].n_tok;
	}
	for (int s = 0; s < n; s++)
		moet_kv_destroy(kv[s]);
	return rc;
}

typedef struct popts {
	const char *model, *jsonl, *device, *out, *merge;
	int64_t synthetic, max_new;
	uint64_t seed;
	int batch, quiet;
} popts;

static int run_prompts(const popts *o, moet_profile **out)
{
	moet_model *m = NULL;
	moet_gen_truth *truth = NULL;
	moet_profile *p = NULL;
	prompts ps = { 0 };
	float *logits = NULL;
	int64_t *next = NULL;
	observer ob = { 0 };
	int rc = moet_model_open_on(o->model, o->device, &m);
	if (rc)
		return rc;
	const moet_config *cf = moet_model_config(m);
	const int64_t max_len = cf->max_position_embeddings - o->max_new < MAX_PROMPT_TOKENS ?
				cf->max_position_embeddings - o->max_new : MAX_PROMPT_TOKENS;
	if (max_len < 1)
		rc = moet_err(MOET_ERANGE, "--max-new %" PRId64 " leaves no room for a prompt "
			      "(max_position_embeddings %" PRId64 ")", o->max_new,
			      cf->max_position_embeddings);
	if (!rc && o->jsonl)
		rc = read_jsonl(o->jsonl, cf->vocab_size, max_len, &ps);
	if (!rc && !o->jsonl) {
		rc = moet_gen_truth_load(o->model, cf, &truth);
		if (rc == MOET_ENOTFOUND)
			rc = moet_err(rc,
				      "--synthetic: %s/generator.json not found: the prompt mix "
				      "is known only for models made by gen-checkpoint (use "
				      "--prompts)",
				      o->model);
		if (!rc && max_len < 64)
			rc = moet_err(MOET_ERANGE, "--synthetic: prompts of up to 64 tokens + "
				      "--max-new exceed max_position_embeddings");
		if (!rc)
			rc = draw_synthetic(truth, o->synthetic, o->seed, &ps);
	}
	if (!rc)
		rc = moet_profile_create(cf, &p);
	if (!rc && (!(logits = malloc((size_t)o->batch * (size_t)cf->vocab_size * sizeof(float))) ||
		    !(next = malloc((size_t)o->batch * sizeof(*next)))))
		rc = moet_err(MOET_ENOMEM, "logits of %d sequences", o->batch);
	ob.p = p;
	if (!rc)
		moet_model_set_route_observer(m, on_route, &ob);
	const double t0 = now_s();
	const int tty = isatty(2);
	for (int64_t i = 0; !rc && i < ps.n; i += o->batch) {
		int n = ps.n - i < o->batch ? (int)(ps.n - i) : o->batch;
		rc = run_batch(m, &ps, i, n, o->max_new, &ob, logits, next);
		if (!rc && !o->quiet) {
			double dt = now_s() - t0;
			fprintf(stderr, "%sprofile: %" PRId64 "/%" PRId64 " prompts, %" PRIu64
				" prefill + %" PRIu64 " decode tokens, %.1f s (%.0f tok/s)%s",
				tty ? "\r" : "", i + n, ps.n, p->n_tokens[0], p->n_tokens[1], dt,
				dt > 0 ? (double)(p->n_tokens[0] + p->n_tokens[1]) / dt : 0.0,
				tty && i + n < ps.n ? "" : "\n");
		}
	}
	char line[4200];
	if (!rc) {
		p->n_prompts = (uint64_t)ps.n;
		if (o->jsonl)
			snprintf(line, sizeof(line), "model %s; prompts %s (%" PRId64 "); max_new %"
				 PRId64 "; batch %d; device %s", o->model, o->jsonl, ps.n,
				 o->max_new, o->batch, o->device);
		else
			snprintf(line, sizeof(line),
				 "model %s; synthetic %" PRId64 " (seed %" PRIu64
				 "); max_new %" PRId64 "; batch %d; device %s",
				 o->model, ps.n, o->seed, o->max_new, o->batch, o->device);
		rc = moet_profile_add_run(p, line);
	}
	if (m)
		moet_model_set_route_observer(m, NULL, NULL);
	free(logits);
	free(next);
	prompts_free(&ps);
	moet_gen_truth_free(truth);
	if (!rc)
		rc = moet_profile_check(p, cf, o->out);
	moet_model_close(m);
	if (rc) {
		moet_profile_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

/* Adds every profile of the comma-separated list into *acc (the first one becomes *acc
 * when it is NULL). */
static int merge_list(const char *list, moet_profile **acc)
{
	char *copy = strdup(list), *save = NULL;
	int rc = copy ? 0 : moet_err(MOET_ENOMEM, "--merge");
	for (char *f = copy ? strtok_r(copy, ",", &save) : NULL; !rc && f;
	     f = strtok_r(NULL, ",", &save)) {
		moet_profile *p = NULL;
		if ((rc = moet_profile_load(f, &p)))
			break;
		if (!*acc) {
			*acc = p;
			continue;
		}
		rc = moet_profile_merge(*acc, p, f);
		moet_profile_free(p);
	}
	free(copy);
	return rc;
}

int moet_cli_profile(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "prompts", required_argument, NULL, 'p' },
		{ "synthetic", required_argument, NULL, 'S' },
		{ "seed", required_argument, NULL, 's' },
		{ "max-new", required_argument, NULL, 'n' },
		{ "batch", required_argument, NULL, 'b' },
		{ "device", required_argument, NULL, 'd' },
		{ "out", required_argument, NULL, 'o' },
		{ "merge", required_argument, NULL, 'M' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	popts o = { .device = "cpu", .max_new = 16, .batch = 8, .synthetic = -1 };
	int c, bad = 0;
	char *end;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o.model = optarg; break;
		case 'p': o.jsonl = optarg; break;
		case 'S': o.synthetic = strtoll(optarg, &end, 10); bad |= *end || o.synthetic < 1;
			break;
		case 's': o.seed = strtoull(optarg, &end, 10); bad |= *end != 0; break;
		case 'n': o.max_new = strtoll(optarg, &end, 10); bad |= *end || o.max_new < 0 ||
			  o.max_new > 65536; break;
		case 'b': o.batch = (int)strtol(optarg, &end, 10); bad |= *end || o.batch < 1 ||
			  o.batch > 256; break;
		case 'd': o.device = optarg; break;
		case 'o': o.out = optarg; break;
		case 'M': o.merge = optarg; break;
		case 'q': o.quiet = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || !o.out || (o.jsonl && o.synthetic > 0) ||
	    (!o.jsonl && o.synthetic < 0 && !o.merge) ||
	    ((o.jsonl || o.synthetic > 0) && !o.model)) {
		usage(stderr);
		return 2;
	}
	if (bad)
		return moet_cli_fail("profile", moet_err(MOET_EINVAL, "--synthetic (>= 1), "
							 "--max-new (0..65536), --batch (1..256) "
							 "and --seed take integers in range"));
	moet_profile *p = NULL;
	int rc = 0;
	if (o.jsonl || o.synthetic > 0)
		rc = run_prompts(&o, &p);
	if (!rc && o.merge)
		rc = merge_list(o.merge, &p);
	if (!rc)
		rc = moet_profile_save(p, o.out);
	if (!rc && !o.quiet)
		fprintf(stderr, "profile: wrote %s (%" PRIu64 " prompts, %" PRIu64 " prefill + %"
			PRIu64 " decode tokens, %d runs)\n", o.out, p->n_prompts, p->n_tokens[0],
			p->n_tokens[1], p->n_runs);
	moet_profile_free(p);
	return rc ? moet_cli_fail("profile", rc) : 0;
}
