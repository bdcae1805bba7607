/*
 * test_profile.c: routing profiles (placement/moet_profile.h) and `moet-hybrid profile`, on a
 * tiny generated checkpoint (4 layers: 0 dense, 1-3 MoE, 32 experts, top-4).
 *
 * - the binary's counts (batched: prompts of a batch in one forward call) equal an
 *   independent count made here: each prompt alone through moet_model_forward, greedy decode
 *   by our own argmax, the route observer counting into our own tables; weights within
 *   summation-order rounding; per layer, counts = tokens x top-k and weights = tokens x
 *   routed_scaling_factor (normalized top-k weights);
 * - --synthetic: same seed, same file; prompt lengths 8..64 seen in the token totals;
 * - merging adds (binary --merge, and a merge into a run), the file round-trips bit for bit;
 * - bad JSONL lines and bad profile files give one-line errors naming the file and the line
 *   or field; --synthetic without generator.json is refused.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "moet_config.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_profile.h"
#include "moet_test.h"

enum { NL = 4, NE = 32, MAX_NEW = 5 };

static char *dir, *tmp;
static moet_config cf;

/* ---- the independent count --------------------------------------------------------------- */

typedef struct tally {
	uint64_t counts[2][NL][NE];
	double weighted[2][NL][NE];
	uint64_t events[2];
} tally;

static void count_route(void *ctx, const moet_route_event *ev)
{
	tally *t = ctx;
	int ph = ev->is_prefill ? 0 : 1;
	t->events[ph]++;
	for (int i = 0; i < ev->top_k; i++) {
		t->counts[ph][ev->layer][ev->ids[i]]++;
		t->weighted[ph][ev->layer][ev->ids[i]] += ev->weights[i];
	}
}

static const int64_t prompt_a[] = { 5, 17, 900, 3, 44, 301 };
static const int64_t prompt_b[] = { 1000, 1001, 2 };
static const int64_t prompt_c[] = { 128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138 };
static const int64_t prompt_d[] = { 7, 7 };
static const int64_t *const prompts[] = { prompt_a, prompt_b, prompt_c, prompt_d };
static const int64_t plen[] = { 6, 3, 11, 2 };
enum { NP = 4 };

static int independent_count(tally *t)
{
	moet_model *m = NULL;
	float *logits = NULL;
	int rc = moet_model_open(dir, &m);
	const int64_t V = cf.vocab_size;
	if (rc || !(logits = malloc((size_t)(16 * V) * sizeof(float))))
		goto done;
	moet_model_set_route_observer(m, count_route, t);
	for (int p = 0; !rc && p < NP; p++) {
		moet_kv *kv = NULL;
		if ((rc = moet_kv_create(m, plen[p] + MAX_NEW, &kv)))
			break;
		rc = moet_model_forward(m, kv, prompts[p], plen[p], logits);
		const float *row = logits + (plen[p] - 1) * V;
		for (int s = 0; !rc && s < MAX_NEW; s++) {
			int64_t best = 0;
			for (int64_t v = 0; v < V; v++)
				if (row[v] > row[best])
					best = v;
			rc = moet_model_forward(m, kv, &best, 1, logits);
			row = logits;
		}
		moet_kv_destroy(kv);
	}
done:
	free(logits);
	moet_model_close(m);
	return rc;
}

static char *path_in(const char *name)
{
	char *p = malloc(strlen(tmp) + strlen(name) + 2);
	sprintf(p, "%s/%s", tmp, name);
	return p;
}

/* Runs the binary; returns its exit status, output in *out (caller frees). */
static void test_counts(void)
{
	char *jsonl = path_in("p.jsonl"), *prof = path_in("p.json"), *out = NULL;
	FILE *f = fopen(jsonl, "w");
	for (int p = 0; f && p < NP; p++) {
		fputs(p == 2 ? "\n  {\"tokens\": [" : "{\"tokens\": [", f);
		for (int64_t i = 0; i < plen[p]; i++)
			fprintf(f, "%s%" PRId64, i ? ", " : "", prompts[p][i]);
		fputs("]}\n", f);
	}
	if (f)
		fclose(f);
	int st = moet_test_cli(&out, "profile --model %s --prompts %s --max-new %d --batch 3 --quiet "
		     "--out %s", dir, jsonl, MAX_NEW, prof);
	CHECK(st == 0, "profile: exit %d\n%s", st, out ? out : "");
	free(out);
	moet_profile *p = NULL;
	tally *t = calloc(1, sizeof(*t));
	CHECK(moet_profile_load(prof, &p) == 0, "%s", moet_errmsg());
	CHECK(independent_count(t) == 0, "independent count: %s", moet_errmsg());
	if (!p)
		goto done;
	int64_t tok[2] = { 0, NP * MAX_NEW };
	for (int i = 0; i < NP; i++)
		tok[0] += plen[i];
	CHECK(p->n_prompts == NP && p->n_tokens[0] == (uint64_t)tok[0] &&
	      p->n_tokens[1] == (uint64_t)tok[1], "totals %" PRIu64 " %" PRIu64 " %" PRIu64,
	      p->n_prompts, p->n_tokens[0], p->n_tokens[1]);
	CHECK(t->events[0] == (uint64_t)(tok[0] * (NL - 1)) &&
	      t->events[1] == (uint64_t)(tok[1] * (NL - 1)), "observer events %" PRIu64 " %" PRIu64,
	      t->events[0], t->events[1]);
	int bad = 0;
	for (int ph = 0; ph < 2; ph++)
		for (int64_t l = 0; l < NL; l++) {
			const int64_t at = moet_profile_at(p, ph, l);
			uint64_t sum = 0;
			double wsum = 0;
			for (int64_t e = 0; e < NE; e++) {
				uint64_t c = p->counts[at + e];
				double w = p->weighted[at + e], tw = t->weighted[ph][l][e];
				sum += c;
				wsum += w;
				if (c == t->counts[ph][l][e] && fabs(w - tw) <= 1e-9 * (1 + tw))
					continue;
				if (!bad++)
					fprintf(stderr,
						"phase %d layer %" PRId64 " expert %" PRId64
						": %" PRIu64 " / %.17g, independent %" PRIu64
						" / %.17g\n",
						ph, l, e, c, w, t->counts[ph][l][e], tw);
			}
			const uint64_t want =
				l == 0 ? 0 : (uint64_t)(tok[ph] * cf.num_experts_per_tok);
			CHECK(sum == want,
			      "phase %d layer %" PRId64 ": %" PRIu64 " routings, want %" PRIu64, ph,
			      l, sum, want);
			const double wwant =
				l == 0 ? 0 : (double)tok[ph] * cf.routed_scaling_factor;
			CHECK(fabs(wsum - wwant) < 1e-4 * (1 + wwant), "phase %d layer %" PRId64
			      ": weights sum %.9g, want tokens x routed_scaling_factor %.9g", ph, l,
			      wsum, wwant);
		}
	CHECK(!bad, "%d entries differ from the independent count", bad);
	CHECK(p->n_runs == 1 && strstr(p->runs[0], "max_new 5"), "runs");
	/* Round trip: text -> parse -> the same numbers, bit for bit. */
	char *text = NULL;
	moet_profile *q = NULL;
	CHECK(moet_profile_to_json(p, &text) == 0 &&
	      moet_profile_parse("rt", text, strlen(text), &q) == 0, "%s", moet_errmsg());
	const size_t cells = (size_t)(2 * NL * NE);
	CHECK(q && !memcmp(q->counts, p->counts, cells * sizeof(uint64_t)) &&
	      !memcmp(q->weighted, p->weighted, cells * sizeof(double)) &&
	      !memcmp(q->is_moe, p->is_moe, NL), "round trip differs");
	free(text);
	moet_profile_free(q);
	/* Merge: the file with itself doubles every entry. */
	char *merged = path_in("m.json");
	st = moet_test_cli(&out, "profile --merge %s,%s --out %s --quiet", prof, prof, merged);
	CHECK(st == 0, "merge: exit %d\n%s", st, out ? out : "");
	free(out);
	CHECK(moet_profile_load(merged, &q) == 0, "%s", moet_errmsg());
	for (size_t i = 0; q && i < cells; i++)
		if (q->counts[i] != 2 * p->counts[i] || q->weighted[i] != 2 * p->weighted[i]) {
			CHECK(0, "merged entry %zu: %" PRIu64 ", want %" PRIu64, i, q->counts[i],
			      2 * p->counts[i]);
			break;
		}
	CHECK(q && q->n_prompts == 2 * NP && q->n_tokens[1] == 2 * p->n_tokens[1] &&
	      q->n_runs == 2, "merged totals");
	moet_profile_free(q);
	q = NULL;
	/* A run merged with an earlier file: the run's counts plus the file's. */
	char *both = path_in("both.json");
	st = moet_test_cli(&out, "profile --model %s --prompts %s --max-new %d --quiet --merge %s --out %s",
		 dir, jsonl, MAX_NEW, merged, both);
	CHECK(st == 0, "run + merge: exit %d\n%s", st, out ? out : "");
	free(out);
	CHECK(moet_profile_load(both, &q) == 0, "%s", moet_errmsg());
	for (size_t i = 0; q && i < cells; i++)
		if (q->counts[i] != 3 * p->counts[i]) {
			CHECK(0, "run + merge entry %zu: %" PRIu64 ", want %" PRIu64, i,
			      q->counts[i], 3 * p->counts[i]);
			break;
		}
	moet_profile_free(q);
	free(merged);
	free(both);
done:
	moet_profile_free(p);
	free(t);
	free(jsonl);
	free(prof);
}

static void test_synthetic(void)
{
	char *a = path_in("s1.json"), *b = path_in("s2.json"), *out = NULL;
	int st = moet_test_cli(&out, "profile --model %s --synthetic 6 --seed 4 --max-new 2 --batch 4 "
		     "--out %s", dir, a);
	CHECK(st == 0 && out && strstr(out, "6/6 prompts"), "synthetic: exit %d\n%s", st,
	      out ? out : "");
	free(out);
	st = moet_test_cli(&out, "profile --model %s --synthetic 6 --seed 4 --max-new 2 --batch 1 --quiet "
		 "--out %s", dir, b);
	CHECK(st == 0, "synthetic again: exit %d\n%s", st, out ? out : "");
	free(out);
	moet_profile *p = NULL, *q = NULL;
	CHECK(moet_profile_load(a, &p) == 0 && moet_profile_load(b, &q) == 0, "%s",
	      moet_errmsg());
	if (p && q) {
		CHECK(!memcmp(p->counts, q->counts, (size_t)(2 * NL * NE) * sizeof(uint64_t)),
		      "the same seed at another batch size gives other counts");
		CHECK(p->n_tokens[0] >= 6 * 8 && p->n_tokens[0] <= 6 * 64 &&
		      p->n_tokens[1] == 12, "synthetic tokens %" PRIu64 " %" PRIu64,
		      p->n_tokens[0], p->n_tokens[1]);
	}
	moet_profile_free(p);
	moet_profile_free(q);
	free(a);
	free(b);
}

/* Exit 1 with exactly one line "moet-hybrid profile: ..." holding `want`. */
static void expect_fail(const char *what, const char *want, const char *fmt, const char *arg)
{
	char *out = NULL, args[4096];
	snprintf(args, sizeof(args), fmt, arg);
	int st = moet_test_cli(&out, "%s", args);
	const char *nl = out ? strchr(out, '\n') : NULL;
	CHECK(st == 1 && out && !strncmp(out, "moet-hybrid profile: ", 21) && strstr(out, want) &&
	      nl && !nl[1], "%s: exit %d, want one line with '%s', got:\n%s", what, st, want,
	      out ? out : "");
	free(out);
}

static void test_bad_jsonl(void)
{
	static const struct { const char *text, *want;
	} cases[] = {
		{"{\"tokens\": [1, 2]}\n{\"tokens\": [1, 2\n", "bad.jsonl:2:"},
		{"{\"prompt\": \"hello\"}\n", "bad.jsonl:1: \"prompt\" strings need a tokenizer"},
		{"\n{\"tokens\": [1, 2]}\n{\"ids\": [1]}\n",
		 "bad.jsonl:3: field tokens is missing"},
		{"{\"tokens\": [1, 1024]}\n", "bad.jsonl:1: tokens[1]: must be a token id in [0, "
					      "1024)"},
		{"{\"tokens\": [1, -1]}\n", "bad.jsonl:1: tokens[1]"},
		{"{\"tokens\": [1, \"2\"]}\n", "bad.jsonl:1: tokens[1]"},
		{"{\"tokens\": []}\n", "bad.jsonl:1: tokens: must be an array of 1.."},
		{"{\"tokens\": 5}\n", "bad.jsonl:1: tokens: must be an array"},
		{"[1, 2]\n", "bad.jsonl:1: must be an object"},
		{"{\"tokens\": [1], \"tokens\": [2]}\n", "bad.jsonl:1:"},
		{"\n\n", "bad.jsonl: no prompts"},
	};
	char *bad = path_in("bad.jsonl"), fmt[2048];
	snprintf(fmt, sizeof(fmt), "profile --model %s --prompts %%s --out %s/x.json --quiet", dir,
		 tmp);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		moet_test_write_file(bad, cases[i].text, strlen(cases[i].text));
		expect_fail(cases[i].want, cases[i].want, fmt, bad);
	}
	expect_fail("missing file", "cannot open", fmt, "/nonexistent/p.jsonl");
	/* --synthetic needs generator.json */
	char *g = malloc(strlen(dir) + 32), *h = malloc(strlen(dir) + 32);
	sprintf(g, "%s/generator.json", dir);
	sprintf(h, "%s/generator.json.away", dir);
	CHECK(rename(g, h) == 0, "rename generator.json");
	snprintf(fmt, sizeof(fmt), "profile --model %%s --synthetic 2 --out %s/x.json --quiet",
		 tmp);
	expect_fail("no generator.json", "generator.json not found", fmt, dir);
	CHECK(rename(h, g) == 0, "rename generator.json back");
	free(g);
	free(h);
	free(bad);
}

/* ---- the file reader ---------------------------------------------------------------------- */

static const char *good =
	"{\"format\": \"moet-hybrid profile\", \"format_version\": 1, \"num_hidden_layers\": 2,\n"
	" \"n_routed_experts\": 3, \"num_experts_per_tok\": 2, \"prompts\": 1,\n"
	" \"tokens\": {\"prefill\": 2, \"decode\": 1}, \"runs\": [\"r\"],\n"
	" \"layers\": [{\"layer\": 1, \"prefill\": {\"counts\": [2, 1, 1], \"weighted\": [1, 0.5, "
	"0.5]},\n  \"decode\": {\"counts\": [1, 1, 0], \"weighted\": [0.5, 0.5, 0]}}]}\n";

/* `good` with the first `from` replaced by `to`, parsed; the message must hold `want`. */
static void bad_file(const char *from, const char *to, int code, const char *want)
{
	char text[2048];
	const char *at = strstr(good, from);
	if (!at) {
		CHECK(0, "test bug: '%s' not in the template", from);
		return;
	}
	snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - good), good, to, at + strlen(from));
	moet_profile *p = NULL;
	int rc = moet_profile_parse("t.json", text, strlen(text), &p);
	CHECK(rc == code && strstr(moet_errmsg(), want) && !strchr(moet_errmsg(), '\n') &&
	      !strncmp(moet_errmsg(), "t.json", 6), "'%s' -> '%s': rc %d (%s), want %d with '%s'",
	      from, to, rc, moet_errmsg(), code, want);
	moet_profile_free(p);
}

static void test_bad_files(void)
{
	moet_profile *p = NULL;
	CHECK(moet_profile_parse("t.json", good, strlen(good), &p) == 0, "%s", moet_errmsg());
	if (p) {
		CHECK(p->counts[moet_profile_at(p, 0, 1) + 0] == 2 &&
		      p->weighted[moet_profile_at(p, 1, 1) + 1] == 0.5 && p->is_moe[1] &&
		      !p->is_moe[0], "template values");
		CHECK(moet_profile_check(p, &cf, "t.json") == MOET_EINVAL &&
		      strstr(moet_errmsg(), "t.json: num_hidden_layers 2 but the model has 4"),
		      "geometry check: %s", moet_errmsg());
	}
	moet_profile_free(p);
	const int F = MOET_EFORMAT;
	bad_file("\"layers\": [{", "\"layers\": [{,", F, "t.json:4:");
	bad_file("moet-hybrid profile", "something else", F, "t.json: format: must be");
	bad_file("\"format_version\": 1", "\"format_version\": 2", F,
		 "t.json: format_version: 2 out of range");
	bad_file("\"n_routed_experts\": 3,", "", F, "t.json: n_routed_experts is missing");
	bad_file("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 4", F,
		 "num_experts_per_tok: 4 out of range [1, 3]");
	bad_file("\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"2\"", F,
		 "num_hidden_layers: must be an integer, not string");
	bad_file("\"prompts\": 1", "\"prompts\": -1", F, "t.json: prompts: -1 out of range");
	bad_file("\"decode\": 1}", "\"decode\": 1.5}", F, "tokens.decode: must be an integer");
	bad_file("\"runs\": [\"r\"]", "\"runs\": [3]", F, "t.json: runs[0]: must be a string");
	bad_file("\"layer\": 1", "\"layer\": 2", F, "t.json: layers[0].layer: 2 out of range");
	bad_file("\"layer\": 1,", "\"layer\": 1, \"x\": 0,", F, "layers[0]: unknown key 'x'");
	bad_file("\"counts\": [2, 1, 1]", "\"counts\": [2, 1]", F,
		 "layers[0].prefill.counts: must be an array of 3 numbers");
	bad_file("\"counts\": [1, 1, 0]", "\"counts\": [1, -1, 0]", F,
		 "layers[0].decode.counts[1]: must be a non-negative integer, not negative");
	bad_file("\"counts\": [1, 1, 0]", "\"counts\": [1, 1.5, 0]", F,
		 "layers[0].decode.counts[1]: must be a non-negative integer, not number");
	bad_file("\"weighted\": [1, 0.5", "\"weighted\": [\"1\", 0.5", F,
		 "layers[0].prefill.weighted[0]: must be a finite non-negative number, not string");
	bad_file("\"weighted\": [0.5, 0.5, 0]", "\"weighted\": [0.5, -0.5, 0]", F,
		 "layers[0].decode.weighted[1]: must be a finite non-negative number");
	bad_file(",\n  \"decode\": {\"counts\": [1, 1, 0], \"weighted\": [0.5, 0.5, 0]}", "", F,
		 "t.json: layers[0].decode is missing");
	bad_file("}}]}", "}}, {\"layer\": 1, \"prefill\": {}, \"decode\": {}}]}", F,
		 "layers[1].layer: layer 1 given twice");
	bad_file("\"layers\": [{", "\"layers\": {\"a\": [{", F, "t.json:");
	bad_file("\"tokens\": {", "\"tokens\": 3, \"t\": {", F,
		 "t.json: tokens: must be an object");
	bad_file("\"prompts\": 1,", "\"prompts\": 1, \"prompts\": 2,", F, "duplicate");
	/* Files: a missing one, and one through the binary's plan (one line, naming the file). */
	CHECK(moet_profile_load("/nonexistent/p.json", &p) == MOET_EIO &&
	      strstr(moet_errmsg(), "/nonexistent/p.json: cannot open"), "%s", moet_errmsg());
	char *f = path_in("bad.json"), *out = NULL;
	moet_test_write_file(f, "{\"format\": 3}", 13);
	int st = moet_test_cli(&out, "plan --model %s --profile %s --gpus 1 --vram-gb 1 --out %s/p.yaml",
		     dir, f, tmp);
	CHECK(st == 1 && out && strstr(out, "moet-hybrid plan: ") && strstr(out, "bad.json: "
	      "format: must be") && strchr(out, '\n') == out + strlen(out) - 1,
	      "plan with a bad profile: exit %d\n%s", st, out ? out : "");
	free(out);
	free(f);
}

int main(void)
{
	moet_gen_params gp;
	dir = moet_test_mkdtemp("profile-ck");
	tmp = moet_test_mkdtemp("profile");
	if (!dir || !tmp)
		return 1;
	moet_gen_params_init(&gp);
	gp.n_layers = NL;
	gp.seed = 5;
	gp.hot_share = 0.9;
	if (moet_gen_checkpoint(dir, &gp) || moet_config_load(dir, &cf)) {
		fprintf(stderr, "setup: %s\n", moet_errmsg());
		return 1;
	}
	CHECK(cf.n_routed_experts == NE && cf.num_hidden_layers == NL, "tiny geometry");
	test_counts();
	test_synthetic();
	test_bad_jsonl();
	test_bad_files();
	free(dir);
	free(tmp);
	return moet_test_done("test_profile");
}
