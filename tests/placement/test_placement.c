/*
 * test_placement.c: placement files (placement/moet_placement.h) on a tiny generated
 * checkpoint (5 layers: layer 0 dense, 1-4 MoE, 32 experts) and on Kimi-K2's geometry.
 *
 * - sizes: the checkpoint's real bytes and the geometry's arithmetic agree, and both match
 *   the expert size and dense total computed here (by formula; by summing tensor bytes);
 * - valid files (id lists, ranges, defaults, layer ranges, no GPU) resolve to owner tables
 *   built here by hand;
 * - every fault gives its code and a one-line message naming the file and the right line;
 * - budgets: a GPU's total is checked at the byte (budget = total passes, total - 1 fails);
 * - the writer's text reads back to the same table;
 * - configs/: the Kimi-K2 examples validate against the kimi-k2 geometry, the 4x32 GB one is
 *   under budget, and 120 experts per layer on 32 GB cards is refused;
 * - `moet-hybrid inspect --placement` through the binary (JSON figures, one-line errors).
 */
#include <inttypes.h>
#include <jansson.h>
#include <string.h>

#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_placement.h"
#include "moet_test.h"

enum { NL = 5, NE = 32, TINY_H = 256, TINY_M = 128 };
/* One tiny expert: gate, up [128, 256] and down [256, 128] F8 + [1,2] / [2,1] F32 scales. */
#define TINY_EXPERT ((uint64_t)3 * (TINY_M * TINY_H + 2 * 4))
/* One Kimi-K2 expert: 3 x (2048 x 7168 F8 + 16 x 56 F32 scales). */
#define KIMI_EXPERT ((uint64_t)3 * (2048ull * 7168 + 16 * 56 * 4))

static moet_config cf, kimi;
static moet_placement_sizes *sz, *kimi_sz;
static uint64_t dense_sum; /* bytes of every tensor that is not a routed expert */

/* Bytes of a rows x cols F8 slice with its 128 x 128 block scales (rows from a block edge). */
static uint64_t f8(uint64_t r, uint64_t c)
{
	return r ? r * c + 4 * ((r + 127) / 128) * ((c + 127) / 128) : 0;
}

/*
 * GPU g's bytes of the tensor-parallel split (`dense: split`, docs/hybrid.md) of the tiny
 * model over n = 2 or 3 GPUs, rows worked out by hand from the rule: q_b's 48-row heads are not
 * whole 128-row blocks, so it goes by blocks (ceil(blocks / n) each: 128, 64); kv_b's 64-row
 * heads go in pairs (128, 128); o_proj, the dense MLP and the shared expert by blocks; lm_head
 * (BF16, no scales) by rows: 512 + 512, or 342 + 342 + 340.
 */
static uint64_t tiny_split(int n, int g)
{
	static const uint64_t qb[3] = { 128, 64, 0 }, two[3] = { 128, 128, 0 };
	static const uint64_t gu[3] = { 256, 256, 0 }, sh[3] = { 128, 0, 0 };
	static const uint64_t lm[2][3] = { { 512, 512, 0 }, { 342, 342, 340 } };
	uint64_t b = lm[n - 2][g] * TINY_H * 2;
	for (int l = 0; l < NL; l++) {
		b += f8(qb[g], 96) + f8(two[g], 64) + f8(two[g], 128);
		if (l == 0) /* the dense layer's MLP: gate, up [512 x 256], down [256 x 512] */
			b += 2 * f8(gu[g], TINY_H) + f8(two[g], 512);
		else /* the shared expert: gate, up [128 x 256], down [256 x 128] */
			b += 2 * f8(sh[g], TINY_H) + f8(two[g], TINY_M);
	}
	return b;
}

/* The split matrices' bytes of Kimi-K2 (61 layers, layer 0 dense); 4 GPUs take a quarter each
 * (every split falls on 128-row blocks). */
static uint64_t kimi_split_total(void)
{
	uint64_t b = 163840ull * 7168 * 2 + 2 * f8(18432, 7168) + f8(7168, 18432) +
		     60 * (2 * f8(2048, 7168) + f8(7168, 2048));
	return b + 61 * (f8(12288, 1536) + f8(16384, 512) + f8(7168, 8192));
}

static moet_placement *parse(const char *text, int *rc)
{
	moet_placement *p = NULL;
	*rc = moet_placement_parse("t.yaml", text, strlen(text), &cf, sz, &p);
	return p;
}

/* ---- sizes ----------------------------------------------------------------------------- */

static void test_sizes(const moet_ckpt *ck)
{
	moet_placement_sizes *g = NULL;
	CHECK(moet_placement_sizes_from_config(&cf, &g) == 0, "%s", moet_errmsg());
	if (!g)
		return;
	CHECK(sz->from_ckpt && !g->from_ckpt, "from_ckpt flags");
#define SAME(f) CHECK(sz->f == g->f, #f ": checkpoint %" PRIu64 ", geometry %" PRIu64, \
		      (uint64_t)sz->f, (uint64_t)g->f)
	SAME(embed_bytes); SAME(lm_head_bytes); SAME(attn_bytes); SAME(norm_bytes);
	SAME(dense_mlp_bytes); SAME(router_bytes); SAME(shared_bytes); SAME(other_bytes);
	SAME(dense_bytes); SAME(mtp_bytes);
#undef SAME
	CHECK(sz->dense_bytes == dense_sum, "dense %" PRIu64 " vs summed %" PRIu64,
	      sz->dense_bytes, dense_sum);
	for (int64_t l = 0; l < NL; l++)
		for (int64_t e = 0; e < NE; e++) {
			uint64_t want = l == 0 ? 0 : TINY_EXPERT;
			CHECK(sz->expert_bytes[l * NE + e] == want && g->expert_bytes[l * NE + e] ==
			      want, "expert (%" PRId64 ", %" PRId64 "): %" PRIu64 " / %" PRIu64,
			      l, e, sz->expert_bytes[l * NE + e], g->expert_bytes[l * NE + e]);
		}
	moet_placement_sizes_free(g);
	CHECK(kimi_sz->expert_bytes[1 * 384 + 7] == KIMI_EXPERT && KIMI_EXPERT == 44050944ull,
	      "kimi expert %" PRIu64, kimi_sz->expert_bytes[384 + 7]);
	CHECK(kimi_sz->expert_bytes[0] == 0, "kimi layer 0 is dense");
	(void)ck;
}

/* ---- valid files ------------------------------------------------------------------------ */

static const char *gpus3 =
	"gpus:\n"
	"  - {name: gpu0, budget: 64MiB, reserve: 1MiB}\n"
	"  - name: gpu1\n"
	"    budget: 67108864\n"
	"  - {name: big.card-2, budget: \"0.5GiB\"}\n";

static void expect_table(const moet_placement *p, const int16_t *want, const char *what)
{
	int bad = 0;
	for (int64_t l = 0; l < NL; l++)
		for (int64_t e = 0; e < NE; e++)
			if (moet_placement_owner(p, l, e) != want[l * NE + e] && bad++ < 5)
				fprintf(stderr, "%s: owner(%" PRId64 ", %" PRId64 ") = %d, "
					"want %d\n", what, l, e, moet_placement_owner(p, l, e),
					want[l * NE + e]);
	CHECK(!bad, "%s: %d owners differ", what, bad);
	CHECK(!memcmp(moet_placement_owners(p), want, sizeof(int16_t) * NL * NE), "%s: table",
	      what);
}

static void set(int16_t *t, int64_t l, int64_t lo, int64_t hi, int g)
{
	for (int64_t e = lo; e <= hi; e++)
		t[l * NE + e] = (int16_t)g;
}

static void test_valid(void)
{
	char text[2048];
	int16_t want[NL * NE];
	int rc;
	/* default + a single layer + a layer range; sets as lists, ranges, ints, "" and [] */
	snprintf(text, sizeof(text), "# comment\nversion: 1\n%s"
		 "dense: gpu1\n"
		 "default: {gpu0: \"0-3, 10\", gpu1: [4, 5-7, \"20-21,30\"], big.card-2: 31}\n"
		 "layers:\n"
		 "  # expected hit rate 0.5\n"
		 "  2:\n"
		 "    gpu1: 0-15\n"
		 "    gpu0: []\n"
		 "    big.card-2: \"\"\n"
		 "  3-4: {big.card-2: \"16-31\"}\n", gpus3);
	moet_placement *p = parse(text, &rc);
	CHECK(rc == 0 && p, "valid file: %s", moet_errmsg());
	for (int i = 0; i < NL * NE; i++)
		want[i] = MOET_PLACEMENT_CPU;
	set(want, 1, 0, 3, 0); set(want, 1, 10, 10, 0); set(want, 1, 4, 7, 1);
	set(want, 1, 20, 21, 1); set(want, 1, 30, 30, 1); set(want, 1, 31, 31, 2);
	set(want, 2, 0, 15, 1);
	set(want, 3, 16, 31, 2); set(want, 4, 16, 31, 2);
	if (p) {
		expect_table(p, want, "default+layers");
		CHECK(moet_placement_n_gpus(p) == 3 && moet_placement_dense_gpu(p) == 1,
		      "gpus %d dense %d", moet_placement_n_gpus(p), moet_placement_dense_gpu(p));
		const moet_placement_gpu *g0 = moet_placement_gpu_at(p, 0);
		const moet_placement_gpu *g2 = moet_placement_gpu_at(p, 2);
		CHECK(g0->budget_bytes == 64ull << 20 && g0->reserve_bytes == 1ull << 20 &&
		      g0->line == 4, "gpu0 %" PRIu64 " %" PRIu64 " line %d", g0->budget_bytes,
		      g0->reserve_bytes, g0->line);
		CHECK(moet_placement_gpu_at(p, 1)->budget_bytes == 67108864ull, "gpu1 budget");
		CHECK(!strcmp(g2->name, "big.card-2") && g2->budget_bytes == 1ull << 29 &&
		      g2->reserve_bytes == 0, "gpu2 %s %" PRIu64, g2->name, g2->budget_bytes);
		/* usage against hand counts: gpu1 holds 4-7, 20, 21, 30 in layer 1 (7) and 16 in
		 * layer 2; gpu0 5 in layer 1; big.card-2 1 + 16 + 16 */
		moet_placement_usage u;
		CHECK(moet_placement_usage_of(p, sz, 1, &u) == 0, "%s", moet_errmsg());
		CHECK(u.n_experts == 23 && u.min_per_layer == 0 && u.max_per_layer == 16 &&
		      u.expert_bytes == 23 * TINY_EXPERT && u.dense_bytes == dense_sum &&
		      u.reserve_bytes == 0 && u.total_bytes == 23 * TINY_EXPERT + dense_sum,
		      "gpu1 usage %" PRId64 " %" PRId64 "-%" PRId64 " %" PRIu64, u.n_experts,
		      u.min_per_layer, u.max_per_layer, u.total_bytes);
		CHECK(moet_placement_usage_of(p, sz, 0, &u) == 0 && u.n_experts == 5 &&
		      u.dense_bytes == 0 && u.total_bytes == 5 * TINY_EXPERT + (1 << 20),
		      "gpu0 usage %" PRId64 " %" PRIu64, u.n_experts, u.total_bytes);
		CHECK(moet_placement_usage_of(p, sz, MOET_PLACEMENT_CPU, &u) == 0 &&
		      u.n_experts == 4 * NE - (5 + 23 + 33) && u.dense_bytes == 0,
		      "cpu usage %" PRId64, u.n_experts);
	}
	moet_placement_free(p);

	/* no default: unlisted MoE layers are all CPU; split dense shares add up */
	snprintf(text, sizeof(text), "%slayers:\n  1,3: {gpu0: 0-31}\n", gpus3);
	p = parse(text, &rc);
	CHECK(rc == 0 && p, "no default: %s", moet_errmsg());
	for (int i = 0; i < NL * NE; i++)
		want[i] = MOET_PLACEMENT_CPU;
	set(want, 1, 0, 31, 0);
	set(want, 3, 0, 31, 0);
	if (p) {
		expect_table(p, want, "no default");
		uint64_t sum = 0;
		for (int g = 0; g < 3; g++) {
			moet_placement_usage u;
			CHECK(moet_placement_usage_of(p, sz, g, &u) == 0, "usage");
			/* GPUs 1, 2 their slices; GPU 0 the rest */
			const uint64_t share = g ? tiny_split(3, g)
						 : dense_sum - tiny_split(3, 1) - tiny_split(3, 2);
			CHECK(u.dense_bytes == share, "gpu%d split share %" PRIu64 ", want %" PRIu64, g,
			      u.dense_bytes, share);
			sum += u.dense_bytes;
		}
		CHECK(sum == dense_sum, "split shares sum to %" PRIu64 ", dense %" PRIu64, sum,
		      dense_sum);
	}
	moet_placement_free(p);

	/* no GPU at all: everything on the CPU, dense part included */
	p = parse("gpus: []\n", &rc);
	CHECK(rc == 0 && p, "no gpu: %s", moet_errmsg());
	if (p) {
		for (int i = 0; i < NL * NE; i++)
			want[i] = MOET_PLACEMENT_CPU;
		expect_table(p, want, "no gpu");
		moet_placement_usage u;
		CHECK(moet_placement_usage_of(p, sz, MOET_PLACEMENT_CPU, &u) == 0 &&
		      u.n_experts == 4 * NE && u.dense_bytes == dense_sum, "cpu tier");
	}
	moet_placement_free(p);
}

/* ---- faults ------------------------------------------------------------------------------ */

typedef struct bad_case {
	const char *name;
	const char *text;     /* appended to the gpus3 block (lines 1-5) unless own_gpus */
	int own_gpus;
	int code;
	int line;             /* 0: the message names no line */
	const char *needle;   /* a phrase the message must hold */
	const char *needle2;  /* and a second one (e.g. the other line), or NULL */
} bad_case;

static const bad_case bad_cases[] = {
	{ "expert out of range", "default:\n  gpu0: 0-3\n  gpu1: [5, 32]\n", 0, MOET_ERANGE,
	  8, "expert 32 out of range", "n_routed_experts 32" },
	{ "expert out of range in a layer", "layers:\n  2: {gpu0: \"30-40\"}\n", 0, MOET_ERANGE,
	  7, "layers 2, gpu0: expert 40 out of range", NULL },
	{ "expert owned twice", "default:\n  gpu0: 0-10\n  gpu1: \"12, 10\"\n", 0, MOET_EINVAL,
	  8, "expert 10 owned twice: by gpu0 (line 7) and by gpu1 (line 8)", NULL },
	{ "expert listed twice", "layers:\n  1:\n    gpu0: [1, 2,\n      0-3]\n", 0,
	  MOET_EINVAL, 9, "expert 1 owned twice", "(line 8)" },
	{ "unknown gpu", "layers:\n  1: {gpu0: 1}\n  2: {gpu9: 1}\n", 0, MOET_EINVAL, 8,
	  "unknown GPU 'gpu9'", NULL },
	{ "unknown dense gpu", "dense: gpu7\n", 0, MOET_EINVAL, 6, "dense: unknown GPU", NULL },
	{ "layer out of range", "layers:\n  3-5: {gpu0: 1}\n", 0, MOET_ERANGE, 7,
	  "layer 5 out of range", "num_hidden_layers 5" },
	{ "dense layer", "layers:\n  0: {gpu0: 1}\n", 0, MOET_EINVAL, 7,
	  "layer 0 is not a MoE layer", NULL },
	{ "layer given twice", "layers:\n  1-3: {gpu0: 1}\n  4: {}\n  2: {gpu1: 2}\n", 0,
	  MOET_EINVAL, 9, "layer 2 given twice (lines 7 and 9)", NULL },
	{ "malformed yaml", "layers:\n  1: {gpu0: [1, 2}\n", 0, MOET_EFORMAT, 7,
	  "malformed YAML", NULL },
	{ "bad indentation", "default:\n  gpu0: 1\n gpu1: 2\n", 0, MOET_EFORMAT, 8,
	  "malformed YAML", NULL },
	{ "gpus not a list", "gpus: {name: gpu0, budget: 1GB}\n", 1, MOET_EFORMAT, 1,
	  "gpus: expected a sequence", NULL },
	{ "budget a list", "gpus:\n  - {name: gpu0, budget: [1GB]}\n", 1, MOET_EFORMAT, 2,
	  "gpu gpu0: budget: expected a scalar, found a sequence", NULL },
	{ "bad budget", "gpus:\n  - {name: gpu0, budget: 32 GBs}\n", 1, MOET_EFORMAT, 2,
	  "gpu gpu0: budget: '32 GBs' is not a byte size", NULL },
	{ "missing budget", "gpus:\n  - name: gpu0\n    reserve: 1GB\n", 1, MOET_EFORMAT, 2,
	  "budget is required", NULL },
	{ "unknown gpu key", "gpus:\n  - {name: gpu0, budget: 1GB, memory: 2GB}\n", 1,
	  MOET_EFORMAT, 2, "unknown key 'memory'", NULL },
	{ "gpu named cpu", "gpus:\n  - {name: cpu, budget: 1GB}\n", 1, MOET_EFORMAT, 2,
	  "is not a GPU name", NULL },
	{ "gpu name twice", "gpus:\n  - {name: a, budget: 1GB}\n  - {name: a, budget: 1GB}\n",
	  1, MOET_EINVAL, 3, "name a given twice (lines 2 and 3)", NULL },
	{ "spec a scalar", "layers:\n  1: gpu0\n", 0, MOET_EFORMAT, 7,
	  "layers 1: expected a mapping", NULL },
	{ "set a mapping", "default:\n  gpu0: {first: 3}\n", 0, MOET_EFORMAT, 7,
	  "default, gpu0: expected expert ids", NULL },
	{ "set empty", "default:\n  gpu0:\n", 0, MOET_EFORMAT, 7, "no value", NULL },
	{ "reversed range", "default: {gpu0: \"9-3\"}\n", 0, MOET_EFORMAT, 6,
	  "range 9-3 is reversed", NULL },
	{ "negative id", "default: {gpu0: \"-1\"}\n", 0, MOET_EFORMAT, 6,
	  "is not a list of expert ids", NULL },
	{ "trailing comma", "default: {gpu0: \"1,\"}\n", 0, MOET_EFORMAT, 6,
	  "is not a list of expert ids", NULL },
	{ "huge id", "default: {gpu0: 99999999999999999999999}\n", 0, MOET_ERANGE, 6,
	  "out of range", NULL },
	{ "unknown top key", "defaults: {gpu0: 1}\n", 0, MOET_EFORMAT, 6,
	  "unknown key 'defaults'", NULL },
	{ "top key twice", "dense: split\ndense: gpu0\n", 0, MOET_EFORMAT, 7,
	  "key dense given twice (lines 6 and 7)", NULL },
	{ "gpu key twice in a layer", "layers:\n  1: {gpu0: 1, gpu0: 2}\n", 0, MOET_EFORMAT, 7,
	  "GPU gpu0 given twice", NULL },
	{ "version", "version: 2\n", 0, MOET_EFORMAT, 6, "version 2", NULL },
	{ "no gpus", "dense: split\n", 1, MOET_EFORMAT, 1, "gpus: is required", NULL },
	{ "top not a mapping", "- gpu0\n", 1, MOET_EFORMAT, 1, "expected a mapping", NULL },
	{ "empty document", "# nothing\n", 1, MOET_EFORMAT, 0, "empty placement", NULL },
	{ "two documents", "gpus: []\n---\ngpus: []\n", 1, MOET_EFORMAT, 3,
	  "a second YAML document", NULL },
	{ "bad utf-8", "gpus: [\xff]\n", 1, MOET_EFORMAT, 0, "malformed YAML", NULL },
	{ "over budget", "gpus:\n  - {name: gpu0, budget: 1MiB}\ndefault: {gpu0: 0-31}\n", 1,
	  MOET_ERANGE, 2, "gpu gpu0 over its budget", "> budget 1048576 bytes" },
};

static void test_faults(void)
{
	char text[4096], want[64];
	for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
		const bad_case *b = &bad_cases[i];
		snprintf(text, sizeof(text), "%s%s", b->own_gpus ? "" : gpus3, b->text);
		int rc;
		moet_placement *p = parse(text, &rc);
		const char *m = moet_errmsg();
		CHECK(rc == b->code && !p, "%s: rc %d (%s), want %s: %s", b->name, rc,
		      moet_strerror(rc), moet_strerror(b->code), m);
		if (b->line)
			snprintf(want, sizeof(want), "t.yaml:%d: ", b->line);
		else
			snprintf(want, sizeof(want), "t.yaml: ");
		CHECK(!strncmp(m, want, strlen(want)), "%s: message '%s' does not start with '%s'",
		      b->name, m, want);
		CHECK(strstr(m, b->needle), "%s: message '%s' lacks '%s'", b->name, m, b->needle);
		CHECK(!b->needle2 || strstr(m, b->needle2), "%s: message '%s' lacks '%s'", b->name,
		      m, b->needle2);
		CHECK(!strchr(m, '\n'), "%s: message spans lines: %s", b->name, m);
		printf("%-28s %s\n", b->name, m);
		moet_placement_free(p);
	}
	/* a missing file */
	moet_placement *p = NULL;
	CHECK(moet_placement_load("/nonexistent/p.yaml", &cf, sz, &p) == MOET_EIO && !p,
	      "missing file");
	CHECK(strstr(moet_errmsg(), "/nonexistent/p.yaml"), "missing file: %s", moet_errmsg());
}

/* Budget = the total passes; one byte less fails, naming the GPU's line. */
static void test_budget_edge(void)
{
	/* gpu1 holds 10 experts of each MoE layer and the whole dense part; reserve 12345 */
	const uint64_t total = 40 * TINY_EXPERT + dense_sum + 12345;
	char text[1024];
	for (int d = 0; d <= 1; d++) {
		snprintf(text, sizeof(text),
			 "gpus:\n"
			 "  - {name: gpu0, budget: 1KiB}\n"
			 "  - {name: gpu1, budget: %" PRIu64 ", reserve: 12345}\n"
			 "dense: gpu1\n"
			 "default: {gpu1: 0-9}\n", total - (uint64_t)d);
		int rc;
		moet_placement *p = parse(text, &rc);
		if (d == 0) {
			CHECK(rc == 0 && p, "budget == total refused: %s", moet_errmsg());
		} else {
			CHECK(rc == MOET_ERANGE && !p, "budget == total - 1 accepted (rc %d)", rc);
			CHECK(strstr(moet_errmsg(), "t.yaml:3: gpu gpu1 over its budget") &&
			      strstr(moet_errmsg(), "40 experts, 10-10 per layer"), "message: %s",
			      moet_errmsg());
		}
		moet_placement_free(p);
		/* without sizes no budget check happens */
		p = NULL;
		CHECK(moet_placement_parse("t.yaml", text, strlen(text), &cf, NULL, &p) == 0 && p,
		      "no sizes: %s", moet_errmsg());
		moet_placement_free(p);
	}
}

/* ---- writer ------------------------------------------------------------------------------- */

static void test_writer(void)
{
	moet_placement_gpu gpus[3] = {
		{ .name = "gpu0", .budget_bytes = 32ull << 30, .reserve_bytes = 1536ull << 20 },
		{ .name = "gpu_1", .budget_bytes = 32000000000ull, .reserve_bytes = 0 },
		{ .name = "x.y-z", .budget_bytes = 123456789ull, .reserve_bytes = 7 },
	};
	moet_placement *p = NULL, *q = NULL;
	CHECK(moet_placement_create("made", &cf, 3, gpus, 2, &p) == 0, "%s", moet_errmsg());
	if (!p)
		return;
	uint64_t x = 12345;
	for (int64_t l = 1; l < NL; l++)
		for (int64_t e = 0; e < NE; e++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			int o = (int)(x >> 33) % 5 - 1; /* -1..3, 3 = CPU too */
			CHECK(moet_placement_set_owner(p, l, e, o > 2 ? -1 : o) == 0, "set_owner");
		}
	for (int64_t e = 0; e < NE; e++) /* layer 3: nothing on the GPUs */
		moet_placement_set_owner(p, 3, e, MOET_PLACEMENT_CPU);
	CHECK(moet_placement_set_owner(p, 0, 0, 0) == MOET_EINVAL, "dense layer set");
	CHECK(moet_placement_set_owner(p, 1, NE, 0) == MOET_ERANGE, "expert out of range set");
	CHECK(moet_placement_set_owner(p, 1, 0, 3) == MOET_ERANGE, "gpu out of range set");
	const char *comments[NL] = { NULL, "expected hit rate 0.712", NULL,
				     "two lines:\nsecond", "layer 4" };
	char *text = NULL;
	CHECK(moet_placement_write(p, "written by test_placement\nline two", comments, &text) ==
	      0 && text, "write: %s", moet_errmsg());
	if (text) {
		CHECK(strstr(text, "# written by test_placement\n# line two\n") &&
		      strstr(text, "  # expected hit rate 0.712\n  1:\n") &&
		      strstr(text, "  # two lines:\n  # second\n  3: {}\n") &&
		      strstr(text, "budget: 32GiB, reserve: 1536MiB") &&
		      strstr(text, "budget: 32GB, reserve: 0") && strstr(text, "dense: x.y-z"),
		      "writer text:\n%s", text);
		int rc;
		q = parse(text, &rc);
		CHECK(rc == 0 && q, "re-read: %s\n%s", moet_errmsg(), text);
	}
	if (q) {
		CHECK(!memcmp(moet_placement_owners(p), moet_placement_owners(q),
			      sizeof(int16_t) * NL * NE), "re-read table differs");
		CHECK(moet_placement_dense_gpu(q) == 2 && moet_placement_n_gpus(q) == 3, "dense");
		for (int g = 0; g < 3; g++) {
			const moet_placement_gpu *a = moet_placement_gpu_at(p, g);
			const moet_placement_gpu *b = moet_placement_gpu_at(q, g);
			CHECK(!strcmp(a->name, b->name) && a->budget_bytes == b->budget_bytes &&
			      a->reserve_bytes == b->reserve_bytes, "gpu %d differs", g);
		}
		/* and the writer of the re-read placement gives the same text, comments aside */
		char *again = NULL;
		CHECK(moet_placement_write(q, "written by test_placement\nline two", comments,
					   &again) == 0 && again && !strcmp(again, text),
		      "second write differs");
		free(again);
	}
	free(text);
	moet_placement_free(q);
	moet_placement_free(p);
	/* a file read from text with a default writes every layer explicitly, same table */
	int rc;
	p = parse("gpus: [{name: g, budget: 1GiB}]\ndefault: {g: \"0-3,9\"}\n"
		  "layers: {2: {g: 5}}\n", &rc);
	CHECK(rc == 0 && p, "%s", moet_errmsg());
	if (p && moet_placement_write(p, NULL, NULL, &text) == 0) {
		q = parse(text, &rc);
		CHECK(q && !memcmp(moet_placement_owners(p), moet_placement_owners(q),
				   sizeof(int16_t) * NL * NE), "default re-read: %s", text);
		CHECK(strstr(text, "  1:\n    g: \"0-3,9\"\n  2:\n    g: \"5\"\n"), "text: %s",
		      text);
		free(text);
		moet_placement_free(q);
	}
	moet_placement_free(p);
}

/* ---- configs/ ------------------------------------------------------------------------------ */

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *buf = calloc(1, 1 << 20);
	size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
	fclose(f);
	(void)n;
	return buf;
}

static void test_configs(void)
{
	const char *names[2] = { "placement-kimi-k2-4xh200.yaml", "placement-kimi-k2-4x5090.yaml" };
	const int64_t per_layer[2] = { 120, 38 };
	const int64_t per_gpu[2][4] = { { 30, 30, 30, 30 }, { 8, 10, 10, 10 } };
	char path[1024];
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/configs/%s", moet_test_source_dir(), names[i]);
		moet_placement *p = NULL;
		int rc = moet_placement_load(path, &kimi, kimi_sz, &p);
		CHECK(rc == 0 && p, "%s: %s", names[i], moet_errmsg());
		if (!p)
			continue;
		CHECK(moet_placement_n_gpus(p) == 4, "%s: 4 GPUs", names[i]);
		for (int64_t l = 1; l < 61; l++) {
			int64_t n = 0;
			for (int64_t e = 0; e < 384; e++)
				n += moet_placement_owner(p, l, e) >= 0;
			CHECK(n == per_layer[i], "%s: layer %" PRId64 " has %" PRId64 " on GPUs",
			      names[i], l, n);
		}
		for (int g = 0; g < 4; g++) {
			moet_placement_usage u;
			CHECK(moet_placement_usage_of(p, kimi_sz, g, &u) == 0, "usage");
			/* independent figure: experts x 44,050,944 + a quarter of the split
			 * matrices, and on gpu0 the rest of the dense part too */
			const uint64_t D = kimi_sz->dense_bytes, Q = kimi_split_total() / 4;
			uint64_t want = (uint64_t)per_gpu[i][g] * 60 * KIMI_EXPERT +
					(g == 0 ? D - 3 * Q : Q) + (i == 0 ? 16ull << 30 : 4ull << 30);
			CHECK(u.total_bytes == want && u.total_bytes <= u.budget_bytes,
			      "%s gpu%d: total %" PRIu64 " (want %" PRIu64 ") budget %" PRIu64,
			      names[i], g, u.total_bytes, want, u.budget_bytes);
		}
		moet_placement_free(p);
	}
	/* 120 per layer on the 32 GB cards: refused as over budget */
	snprintf(path, sizeof(path), "%s/configs/%s", moet_test_source_dir(), names[1]);
	char *t = read_text(path);
	CHECK(t != NULL, "read %s", path);
	if (!t)
		return;
	char *d = strstr(t, "\ndefault: ");
	CHECK(d != NULL, "no default line in %s", path);
	if (d) {
		sprintf(d, "\ndefault: {gpu0: \"0-29\", gpu1: \"30-59\", gpu2: \"60-89\", "
			"gpu3: \"90-119\"}\n");
		moet_placement *p = NULL;
		int rc = moet_placement_parse("5090-120.yaml", t, strlen(t), &kimi, kimi_sz, &p);
		CHECK(rc == MOET_ERANGE && !p && strstr(moet_errmsg(), "gpu gpu0 over its budget"),
		      "120/layer on 32 GB cards: rc %d %s", rc, moet_errmsg());
		moet_placement_free(p);
	}
	free(t);
}

/* ---- mutations: never a crash, always 0 or a one-line error ------------------------------ */

static void check_outcome(const char *text, size_t n, int *n_ok, int *n_bad)
{
	moet_placement *p = NULL;
	int rc = moet_placement_parse("m.yaml", text, n, &kimi, kimi_sz, &p);
	const char *m = moet_errmsg();
	if (rc == 0) {
		CHECK(p != NULL, "rc 0 without a placement");
		(*n_ok)++;
	} else {
		CHECK(!p && !strncmp(m, "m.yaml", 6) && !strchr(m, '\n'),
		      "rc %d, message '%s'", rc, m);
		(*n_bad)++;
	}
	moet_placement_free(p);
}

static void test_mutations(void)
{
	static const char alphabet[] = "-,:[]{}\"' 09a\n#&*!|>?%@`\t";
	char path[1024];
	snprintf(path, sizeof(path), "%s/configs/placement-kimi-k2-4xh200.yaml",
		 moet_test_source_dir());
	char *t = read_text(path);
	CHECK(t != NULL, "read %s", path);
	if (!t)
		return;
	size_t n = strlen(t);
	char *m = malloc(n + 1);
	int n_ok = 0, n_bad = 0;
	for (size_t cut = 0; m && cut <= n; cut += 7) {
		memcpy(m, t, cut);
		check_outcome(m, cut, &n_ok, &n_bad);
	}
	uint64_t x = 99;
	for (int i = 0; m && i < 3000; i++) {
		memcpy(m, t, n + 1);
		for (int k = 0; k < 1 + i % 3; k++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			size_t at = (size_t)(x >> 20) % n;
			m[at] = alphabet[(x >> 52) % (sizeof(alphabet) - 1)];
		}
		check_outcome(m, n, &n_ok, &n_bad);
	}
	printf("mutations: %d accepted, %d refused with one line\n", n_ok, n_bad);
	CHECK(n_ok > 0 && n_bad > 0, "mutations: %d ok %d bad", n_ok, n_bad);
	free(m);
	free(t);
}

/* ---- the binary ------------------------------------------------------------------------------ */

static void test_cli(const char *dir)
{
	char path[1024], bad[1024], over[1024], cmd[4096];
	char *out = NULL;
	snprintf(path, sizeof(path), "%s/ok.yaml", dir);
	snprintf(bad, sizeof(bad), "%s/bad.yaml", dir);
	snprintf(over, sizeof(over), "%s/over.yaml", dir);
	const char *ok_text = "gpus:\n  - {name: a, budget: 1GiB, reserve: 1MiB}\n"
			      "  - {name: b, budget: 1GiB}\ndefault: {a: 0-9, b: \"10-12\"}\n";
	const char *bad_text = "gpus:\n  - {name: a, budget: 1GiB}\ndefault: {a: 0-9}\n"
			       "layers:\n  7: {a: 1}\n";
	const char *over_text = "gpus:\n  - {name: a, budget: 1MiB}\ndefault: {a: 0-9}\n";
	if (moet_test_write_file(path, ok_text, strlen(ok_text)) ||
	    moet_test_write_file(bad, bad_text, strlen(bad_text)) ||
	    moet_test_write_file(over, over_text, strlen(over_text))) {
		CHECK(0, "cannot write test files");
		return;
	}
	snprintf(cmd, sizeof(cmd), "%s inspect --model %s --placement %s --json 2>&1",
		 moet_test_bin(), dir, path);
	int st = moet_test_run(cmd, &out);
	CHECK(st == 0, "inspect --placement --json: exit %d\n%s", st, out ? out : "");
	json_error_t je;
	json_t *js = out ? json_loads(out, 0, &je) : NULL;
	CHECK(js != NULL, "inspect JSON: %s", out ? out : "");
	if (js) {
		json_t *a = json_array_get(json_object_get(js, "gpus"), 0);
		json_t *b = json_array_get(json_object_get(js, "gpus"), 1);
		json_t *c = json_object_get(js, "cpu");
#define I(o, k) json_integer_value(json_object_get(o, k))
		const uint64_t b1 = tiny_split(2, 1), a0 = dense_sum - b1; /* b: its slices */
		CHECK(I(a, "experts") == 40 && I(a, "per_layer_min") == 10 &&
		      I(a, "expert_bytes") == (json_int_t)(40 * TINY_EXPERT) &&
		      I(a, "dense_bytes") == (json_int_t)a0 && I(a, "reserve_bytes") == 1 << 20 &&
		      I(a, "total_bytes") == (json_int_t)(40 * TINY_EXPERT + a0 + (1 << 20)) &&
		      I(a, "budget_bytes") == 1 << 30, "gpu a: %s", out);
		CHECK(I(b, "experts") == 12 && I(b, "per_layer_max") == 3 &&
		      I(b, "dense_bytes") == (json_int_t)b1, "gpu b: %s", out);
		CHECK(I(c, "experts") == 4 * (NE - 13) &&
		      I(c, "expert_bytes") == (json_int_t)(4 * (NE - 13) * TINY_EXPERT),
		      "cpu: %s", out);
		json_t *stg = json_object_get(js, "stage_slot_bytes");
		CHECK(I(stg, "pinned") == (json_int_t)(MOET_STAGE_SLOTS_PINNED * TINY_EXPERT) &&
		      I(stg, "driver") == (json_int_t)(MOET_STAGE_SLOTS_DRIVER * TINY_EXPERT),
		      "stage_slot_bytes: %s", out);
		const char *from = json_string_value(json_object_get(js, "sizes_from"));
		CHECK(from && !strncmp(from, "the checkpoint ", 15), "sizes_from %s", from);
#undef I
		json_decref(js);
	}
	free(out);
	out = NULL;
	/* text form */
	snprintf(cmd, sizeof(cmd), "%s inspect --model %s --placement %s 2>&1", moet_test_bin(),
		 dir, path);
	st = moet_test_run(cmd, &out);
	const char *row = out ? strstr(out, "\n  a ") : NULL;
	long n_exp = 0, lo = 0, hi = 0;
	CHECK(st == 0 && row && sscanf(row, " a %ld %ld-%ld", &n_exp, &lo, &hi) == 3 &&
	      n_exp == 40 && lo == 10 && hi == 10 && strstr(out, "cpu_expert_bytes:"),
	      "inspect text: exit %d\n%s", st, out ? out : "");
	char stage_line[96];
	snprintf(stage_line, sizeof(stage_line), "prefill staging: a also holds %d slots of one "
		 "expert", MOET_STAGE_SLOTS_PINNED);
	CHECK(out && strstr(out, stage_line), "inspect text: no '%s'\n%s", stage_line,
	      out ? out : "");
	free(out);
	out = NULL;
	/* invalid file: exit 1, one line naming the file and line */
	snprintf(cmd, sizeof(cmd), "%s inspect --model %s --placement %s 2>&1",
		 moet_test_bin(), dir, bad);
	st = moet_test_run(cmd, &out);
	char want[2048];
	snprintf(want, sizeof(want), "moet-hybrid inspect: %s:5: layers: layer 7 out of range",
		 bad);
	CHECK(st == 1 && out && !strncmp(out, want, strlen(want)) &&
	      strchr(out, '\n') == out + strlen(out) - 1, "invalid file: exit %d\n%s", st,
	      out ? out : "");
	free(out);
	out = NULL;
	/* over budget: the table, then exit 1 with the line */
	snprintf(cmd, sizeof(cmd), "%s inspect --model %s --placement %s 2>&1",
		 moet_test_bin(), dir, over);
	st = moet_test_run(cmd, &out);
	CHECK(st == 1 && out && strstr(out, "OVER BUDGET") && strstr(out, ":2: gpu a over its "
	      "budget"), "over budget: exit %d\n%s", st, out ? out : "");
	free(out);
	out = NULL;
	/* the examples through the preset geometry */
	snprintf(cmd, sizeof(cmd), "%s inspect --preset kimi-k2 --placement "
		 "%s/configs/placement-kimi-k2-4x5090.yaml 2>&1", moet_test_bin(),
		 moet_test_source_dir());
	st = moet_test_run(cmd, &out);
	CHECK(st == 0 && out && strstr(out, "expert_bytes 44050944") &&
	      strstr(out, "8-8") && strstr(out, "10-10") && strstr(out, "346-346"),
	      "preset: exit %d\n%s", st,
	      out ? out : "");
	free(out);
}

int main(void)
{
	char *dir = moet_test_mkdtemp("placement");
	moet_ckpt *ck = NULL;
	moet_gen_params gp;
	if (!dir)
		return 1;
	moet_gen_params_init(&gp);
	gp.n_layers = NL;
	gp.seed = 3;
	gp.shard_mb = 1;
	if (moet_gen_checkpoint(dir, &gp) || moet_config_load(dir, &cf) ||
	    moet_ckpt_open(dir, &ck) || moet_placement_sizes_from_ckpt(&cf, ck, &sz)) {
		fprintf(stderr, "setup: %s\n", moet_errmsg());
		return 1;
	}
	if (moet_test_kimi(0, 0, &kimi, &kimi_sz)) {
		fprintf(stderr, "kimi geometry: %s\n", moet_errmsg());
		return 1;
	}
	CHECK(cf.num_hidden_layers == NL && cf.n_routed_experts == NE &&
	      cf.hidden_size == TINY_H && cf.moe_intermediate_size == TINY_M, "tiny geometry");
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		if (!strstr(t->name, ".mlp.experts."))
			dense_sum += t->n_bytes;
	}
	test_sizes(ck);
	test_valid();
	test_faults();
	test_budget_edge();
	test_writer();
	test_configs();
	test_mutations();
	test_cli(dir);
	moet_ckpt_close(ck);
	moet_placement_sizes_free(sz);
	moet_placement_sizes_free(kimi_sz);
	free(dir);
	return moet_test_done("test_placement");
}
