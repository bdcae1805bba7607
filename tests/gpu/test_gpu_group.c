/*
 * test_gpu_group.c: the device grouping of routing pairs (gpu/group.cu) gives, byte for byte,
 * what the host specification (runtime/group_ref.c: moet_expert_pairs_sort, then one walk per
 * tier as runtime/dispatch.c does) gives:
 *
 *   1. n in {1, 7, 8, 64, 512, 4096, 65536} tokens x top_k {8, 6}, E in {384, 256, 64}, ids
 *      distinct per token over all experts or over top_k + 2 hot ones (heavy ties), owner rows
 *      none, random over {-1, 0, 1, 2}, all -1, all 1; plus repeats within a token, no pairs,
 *      no devices, and the limits (4096 experts, 64 devices, 65536 x 8 pairs): every output
 *      array memcmp-equal to the reference; a second call (fresh poison everywhere, other
 *      scratch bytes) gives the same bytes;
 *   2. every output sits between guard zones of poison, the scratch has one after it, and the
 *      entries past n_dev0 are documented as untouched: all still poison after each call;
 *   3. ids outside [0, E) and owners outside [-1, n_dev): the error report (flags, first pair,
 *      first expert) and every output equal the reference's, nothing outside the buffers is
 *      written, and moet_group_check names the pair;
 *   4. bad arguments: MOET_EINVAL with a message.
 * Skips (77) without a CUDA device.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_group.h"
#include "moet_test.h"

_Static_assert(sizeof(moet_gpu_pair) == sizeof(moet_expert_pair) &&
	       offsetof(moet_gpu_pair, expert) == offsetof(moet_expert_pair, expert) &&
	       offsetof(moet_gpu_pair, pair) == offsetof(moet_expert_pair, pair),
	       "moet_gpu_pair has moet_expert_pair's layout");

#define GUARD 256
#define POISON 0xA5
#define N_BUF 10

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n)
{
	return (uint32_t)(moet_test_xorshift64(&rng) % n);
}

/* The outputs of one call in one device block: buffer i at off[i], len[i] bytes, each with
 * GUARD poisoned bytes before and after. */
typedef struct arena {
	uint8_t *d, *h, *first; /* device block; its download; the first call's download */
	size_t bytes, off[N_BUF], len[N_BUF];
	moet_gpu_group_bufs b; /* device pointers */
} arena;

static size_t up256(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

static int arena_make(arena *a, int64_t P, int64_t E, int n_dev)
{
	const int64_t X = P < E ? P : E, T = n_dev + 1;
	const size_t len[N_BUF] = { (size_t)P * sizeof(moet_gpu_pair), (size_t)P * 4,
		(size_t)T * 4, (size_t)T * 4, (size_t)X * sizeof(moet_gpu_group_exp),
		(size_t)X * sizeof(moet_gpu_group_exp), MOET_GPU_GROUP_N_CLASS * 4,
		MOET_GPU_GROUP_N_CLASS * 4, 4, 12 };
	memset(a, 0, sizeof(*a));
	size_t at = GUARD;
	for (int i = 0; i < N_BUF; i++) {
		a->off[i] = at;
		a->len[i] = len[i];
		at = up256(at + len[i] + GUARD);
	}
	a->bytes = at;
	a->h = malloc(a->bytes);
	a->first = malloc(a->bytes);
	if (!a->h || !a->first || moet_gpu_alloc(a->bytes, (void **)&a->d))
		return -1;
	uint8_t *d = a->d;
	a->b = (moet_gpu_group_bufs){
		.pairs = (moet_gpu_pair *)(d + a->off[0]), .slot = (int32_t *)(d + a->off[1]),
		.tier_first = (int32_t *)(d + a->off[2]), .tier_count = (int32_t *)(d + a->off[3]),
		.dev0 = (moet_gpu_group_exp *)(d + a->off[4]),
		.dev0_class = (moet_gpu_group_exp *)(d + a->off[5]),
		.class_first = (int32_t *)(d + a->off[6]),
		.class_count = (int32_t *)(d + a->off[7]), .n_dev0 = (int32_t *)(d + a->off[8]),
		.err = (int32_t *)(d + a->off[9]) };
	return 0;
}

static void arena_free(arena *a)
{
	moet_gpu_free(a->d);
	free(a->h);
	free(a->first);
}

/* Poisons the whole block on the device. */
static int arena_poison(arena *a)
{
	memset(a->h, POISON, a->bytes);
	return moet_gpu_copy_h2d(a->d, a->h, a->bytes);
}

/* Checks the downloaded block: every byte outside the buffers, and outside the first n_dev0
 * entries of dev0 and dev0_class, is still poison. */
static void check_guards(const char *what, const arena *a)
{
	int32_t nx;
	memcpy(&nx, a->h + a->off[8], 4);
	size_t keep[N_BUF];
	for (int i = 0; i < N_BUF; i++)
		keep[i] = a->len[i];
	if (nx >= 0 && (size_t)nx * sizeof(moet_gpu_group_exp) <= a->len[4])
		keep[4] = keep[5] = (size_t)nx * sizeof(moet_gpu_group_exp);
	size_t at = 0;
	for (int i = 0; i <= N_BUF; i++) {
		const size_t end = i < N_BUF ? a->off[i] : a->bytes;
		for (size_t j = at; j < end; j++)
			if (a->h[j] != POISON) {
				CHECK(0, "%s: byte %zu (after buffer %d's %zu bytes) was written: "
				      "0x%02x", what, j, i - 1, i ? keep[i - 1] : 0, a->h[j]);
				return;
			}
		if (i < N_BUF)
			at = a->off[i] + keep[i];
	}
}

/* memcmp of one output with the reference, printing the first differing element in hex. */
static int same(const char *what, const char *name, const void *got, const void *want,
		size_t bytes, size_t elem)
{
	if (!memcmp(got, want, bytes))
		return 1;
	const uint8_t *g = got, *w = want;
	size_t i = 0;
	while (g[i] == w[i])
		i++;
	i -= i % elem;
	char gs[80] = "", ws[80] = "";
	for (size_t j = 0; j < elem && j < 32; j++) {
		snprintf(gs + 2 * j, 3, "%02x", g[i + j]);
		snprintf(ws + 2 * j, 3, "%02x", w[i + j]);
	}
	CHECK(0, "%s: %s element %zu: got %s, want %s", what, name, i / elem, gs, ws);
	return 0;
}

/* Runs one case on the device twice and compares with moet_group_ref. */
static void run_case(const char *what, const int32_t *ids, int64_t P, int64_t E,
		     const int16_t *owner, int n_dev)
{
	const int64_t X = P < E ? P : E, T = n_dev + 1;
	moet_gpu_group_bufs r = { 0 };
	arena a;
	int32_t *d_ids = NULL;
	int16_t *d_owner = NULL;
	uint8_t *scratch = NULL, *sh = NULL;
	size_t need = 0;
	r.pairs = calloc((size_t)P + 1, sizeof(*r.pairs));
	r.slot = calloc((size_t)P + 1, 4);
	r.tier_first = calloc((size_t)T, 4);
	r.tier_count = calloc((size_t)T, 4);
	r.dev0 = calloc((size_t)X + 1, sizeof(*r.dev0));
	r.dev0_class = calloc((size_t)X + 1, sizeof(*r.dev0));
	r.class_first = calloc(MOET_GPU_GROUP_N_CLASS, 4);
	r.class_count = calloc(MOET_GPU_GROUP_N_CLASS, 4);
	r.n_dev0 = calloc(1, 4);
	r.err = calloc(3, 4);
	int rc = arena_make(&a, P, E, n_dev);
	if (!rc)
		rc = moet_gpu_group_scratch_bytes(P, E, &need);
	if (!rc && !(sh = malloc(need + GUARD)))
		rc = -1;
	if (!rc)
		rc = moet_gpu_alloc(need + GUARD, (void **)&scratch);
	if (!rc)
		rc = moet_gpu_alloc((size_t)(P ? P : 1) * 4, (void **)&d_ids);
	if (!rc && owner)
		rc = moet_gpu_alloc((size_t)E * 2, (void **)&d_owner);
	if (!rc && P)
		rc = moet_gpu_copy_h2d(d_ids, ids, (size_t)P * 4);
	if (!rc && owner)
		rc = moet_gpu_copy_h2d(d_owner, owner, (size_t)E * 2);
	if (rc || !r.pairs || !r.slot || !r.tier_first || !r.tier_count || !r.dev0 ||
	    !r.dev0_class || !r.class_first || !r.class_count || !r.n_dev0 || !r.err) {
		CHECK(0, "%s: setup (%s)", what, moet_errmsg());
		goto out;
	}
	rc = moet_group_ref(ids, P, E, owner, n_dev, &r);
	CHECK(rc == 0, "%s: reference rc %d (%s)", what, rc, moet_errmsg());
	for (int rep = 0; rep < 2 && !rc; rep++) {
		for (size_t i = 0; i < need + GUARD; i++)
			sh[i] = i >= need ? POISON : (uint8_t)rnd(256);
		if ((rc = arena_poison(&a)) || (rc = moet_gpu_copy_h2d(scratch, sh, need + GUARD)))
			break;
		rc = moet_gpu_group_pairs(d_ids, P, E, d_owner, n_dev, scratch, need, &a.b, NULL);
		CHECK(rc == 0, "%s: rc %d (%s)", what, rc, moet_errmsg());
		if (rc || (rc = moet_gpu_sync(NULL)) || (rc = moet_gpu_copy_d2h(a.h, a.d, a.bytes)) ||
		    (rc = moet_gpu_copy_d2h(sh, scratch, need + GUARD))) {
			CHECK(0, "%s: device (%s)", what, moet_errmsg());
			break;
		}
		for (size_t i = need; i < need + GUARD; i++)
			if (sh[i] != POISON) {
				CHECK(0, "%s: scratch byte %zu past its %zu written", what, i, need);
				break;
			}
		check_guards(what, &a);
		if (rep) {
			same(what, "repeat call (whole block)", a.h, a.first, a.bytes, 1);
			break;
		}
		memcpy(a.first, a.h, a.bytes);
		int32_t nx;
		memcpy(&nx, a.h + a.off[8], 4);
		const size_t xb = (size_t)*r.n_dev0 * sizeof(*r.dev0);
		int ok = same(what, "n_dev0", &nx, r.n_dev0, 4, 4) &&
			 same(what, "err", a.h + a.off[9], r.err, 12, 4) &&
			 same(what, "tier_first", a.h + a.off[2], r.tier_first, a.len[2], 4) &&
			 same(what, "tier_count", a.h + a.off[3], r.tier_count, a.len[3], 4);
		/* only the positions the tiers fill are defined (all P unless the input is bad) */
		const int32_t filled = r.tier_first[n_dev] + r.tier_count[n_dev];
		ok = ok && same(what, "pairs", a.h + a.off[0], r.pairs,
				(size_t)filled * sizeof(*r.pairs), sizeof(*r.pairs));
		for (size_t i = (size_t)filled * sizeof(*r.pairs); ok && i < a.len[0]; i++)
			if (a.h[a.off[0] + i] != POISON) {
				CHECK(0, "%s: pairs byte %zu past the %d filled positions written", what,
				      i, filled);
				ok = 0;
			}
		ok = ok && same(what, "slot", a.h + a.off[1], r.slot, a.len[1], 4) &&
		     same(what, "dev0", a.h + a.off[4], r.dev0, xb, sizeof(*r.dev0)) &&
		     same(what, "dev0_class", a.h + a.off[5], r.dev0_class, xb, sizeof(*r.dev0)) &&
		     same(what, "class_first", a.h + a.off[6], r.class_first, a.len[6], 4) &&
		     same(what, "class_count", a.h + a.off[7], r.class_count, a.len[7], 4);
		if (!ok)
			break;
	}
out:
	arena_free(&a);
	moet_gpu_free(scratch);
	moet_gpu_free(d_ids);
	moet_gpu_free(d_owner);
	free(sh);
	free(r.pairs), free(r.slot), free(r.tier_first), free(r.tier_count), free(r.dev0);
	free(r.dev0_class), free(r.class_first), free(r.class_count), free(r.n_dev0), free(r.err);
}

/* owner rows: 0 none (1 device), 1 random over {-1, 0, 1, 2}, 2 all -1, 3 all 1 (3 devices),
 * 4 all -1 with no devices, 5 random over {-1 .. n_dev-1} */
static void one(int64_t n, int64_t k, int64_t E, int mode, int ow, int n_dev)
{
	int32_t *ids = malloc((size_t)(n * k + 1) * sizeof(*ids));
	int16_t *owner = malloc((size_t)E * sizeof(*owner));
	if (!ids || !owner) {
		CHECK(0, "out of memory");
		free(ids), free(owner);
		return;
	}
	moet_test_routing_ids(ids, n, k, E, mode, &rng);
	for (int64_t e = 0; e < E; e++)
		owner[e] = (int16_t)(ow == 1 ? (int)rnd(4) - 1 : ow == 2 || ow == 4 ? -1 :
				     ow == 3 ? 1 : (int)rnd((uint32_t)n_dev + 1) - 1);
	char what[128];
	snprintf(what, sizeof(what), "n %lld k %lld E %lld ids %d owner %d devices %d",
		 (long long)n, (long long)k, (long long)E, mode, ow, n_dev);
	run_case(what, ids, n * k, E, ow ? owner : NULL, n_dev);
	free(ids);
	free(owner);
}

static void test_matrix(void)
{
	const int64_t ns[] = { 1, 7, 8, 64, 512, 4096, 65536 }, ks[] = { 8, 6 };
	const int64_t Es[] = { 384, 256, 64 };
	const double t0 = moet_test_now_ms();
	int cases = 0;
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
		for (int b = 0; b < 2; b++)
			for (int c = 0; c < 3; c++)
				for (int mode = 0; mode < 2; mode++)
					for (int ow = 0; ow < 4; ow++, cases++)
						one(ns[a], ks[b], Es[c], mode, ow, ow ? 3 : 1);
	/* repeats within a token, no pairs, no devices, the limits */
	for (int ow = 0; ow < 4; ow++, cases += 2) {
		one(100, 8, 64, 2, ow, ow ? 3 : 1);
		one(0, 8, 384, 0, ow, ow ? 3 : 1);
	}
	one(64, 8, 384, 0, 4, 0);
	one(65536, 8, 384, 0, 4, 0);
	one(65536, 8, MOET_GPU_GROUP_MAX_EXP, 0, 5, MOET_GPU_GROUP_MAX_DEV);
	one(512, 8, MOET_GPU_GROUP_MAX_EXP, 1, 5, MOET_GPU_GROUP_MAX_DEV);
	one(1, 1, 1, 0, 0, 1);
	cases += 5;
	printf("matrix: %d cases in %.0f ms\n", cases, moet_test_now_ms() - t0);
}

static void test_bad_ids(void)
{
	const int64_t n = 700, k = 8, E = 256, P = n * k;
	int32_t *ids = malloc((size_t)P * sizeof(*ids));
	int16_t owner[256];
	if (!ids) {
		CHECK(0, "out of memory");
		return;
	}
	for (int round = 0; round < 3; round++) {
		moet_test_routing_ids(ids, n, k, E, 0, &rng);
		const int32_t bad[] = { -1, (int32_t)E, INT32_MAX, INT32_MIN, 1000 };
		for (int i = 0; i < 40 && round != 1; i++)
			ids[1 + rnd((uint32_t)P - 1)] = bad[rnd(5)];
		if (round != 1)
			ids[1030] = -7; /* a bad id in the second chunk */
		for (int64_t e = 0; e < E; e++)
			owner[e] = (int16_t)((int)rnd(4) - 1);
		if (round >= 1)
			owner[rnd((uint32_t)E)] = round == 1 ? -2 : 32767;
		char what[64];
		snprintf(what, sizeof(what), "bad input round %d", round);
		run_case(what, ids, P, E, owner, 3);
	}
	/* the report as an error */
	moet_test_routing_ids(ids, n, k, E, 0, &rng);
	ids[77] = 999;
	moet_gpu_group_bufs r = { 0 };
	int32_t *d_ids = NULL, *d_err = NULL, err[3] = { 0 };
	void *scratch = NULL, *d = NULL;
	size_t need = 0, X = (size_t)E, off = 0;
	size_t sz[] = { (size_t)P * 16, (size_t)P * 4, 8, 8, X * 12, X * 12, 24, 24, 4, 12 };
	size_t total = 0;
	for (int i = 0; i < 10; i++)
		total += up256(sz[i]);
	int rc = moet_gpu_group_scratch_bytes(P, E, &need);
	if (!rc && !(rc = moet_gpu_alloc(need, &scratch)) && !(rc = moet_gpu_alloc(total, &d)) &&
	    !(rc = moet_gpu_alloc((size_t)P * 4, (void **)&d_ids)))
		rc = moet_gpu_copy_h2d(d_ids, ids, (size_t)P * 4);
	if (!rc) {
		void *p[10];
		for (int i = 0; i < 10; i++) {
			p[i] = (uint8_t *)d + off;
			off += up256(sz[i]);
		}
		r = (moet_gpu_group_bufs){ p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
					   p[9] };
		d_err = r.err;
		rc = moet_gpu_group_pairs(d_ids, P, E, NULL, 1, scratch, need, &r, NULL);
	}
	if (!rc)
		rc = moet_gpu_copy_d2h(err, d_err, sizeof(err));
	CHECK(rc == 0, "report: %s", moet_errmsg());
	rc = moet_group_check(err, 3, ids, E, 1);
	CHECK(rc == MOET_ERANGE && strstr(moet_errmsg(), "layer 3: routing pair 77 has expert id "
					  "999, outside [0, 256)"), "report: %d %s", rc,
	      moet_errmsg());
	printf("report: %s\n", moet_errmsg());

	/* arguments */
	moet_gpu_group_bufs nb = r;
	nb.dev0 = NULL;
	CHECK(moet_gpu_group_pairs(d_ids, P, E, NULL, 1, scratch, need, &nb, NULL) == MOET_EINVAL,
	      "NULL dev0");
	CHECK(moet_gpu_group_pairs(d_ids, P, E, NULL, 1, scratch, need, NULL, NULL) == MOET_EINVAL,
	      "NULL out");
	CHECK(moet_gpu_group_pairs(NULL, P, E, NULL, 1, scratch, need, &r, NULL) == MOET_EINVAL,
	      "NULL ids");
	CHECK(moet_gpu_group_pairs(d_ids, P, E, NULL, 1, scratch, need - 1, &r, NULL) ==
	      MOET_EINVAL && strstr(moet_errmsg(), "scratch"), "small scratch: %s", moet_errmsg());
	CHECK(moet_gpu_group_pairs(d_ids, P, E, NULL, 1, (uint8_t *)scratch + 4, need, &r, NULL) ==
	      MOET_EINVAL, "misaligned scratch");
	CHECK(moet_gpu_group_pairs(d_ids, P, E, NULL, 0, scratch, need, &r, NULL) == MOET_EINVAL,
	      "no owner row, no device");
	CHECK(moet_gpu_group_pairs(d_ids, P, E, NULL, MOET_GPU_GROUP_MAX_DEV + 1, scratch, need, &r,
				   NULL) == MOET_EINVAL, "too many devices");
	CHECK(moet_gpu_group_pairs(d_ids, MOET_GPU_GROUP_MAX_PAIRS + 1, E, NULL, 1, scratch, need,
				   &r, NULL) == MOET_EINVAL && strstr(moet_errmsg(), "pairs"),
	      "too many pairs: %s", moet_errmsg());
	CHECK(moet_gpu_group_pairs(d_ids, P, MOET_GPU_GROUP_MAX_EXP + 1, NULL, 1, scratch, need, &r,
				   NULL) == MOET_EINVAL, "too many experts");
	CHECK(moet_gpu_group_pairs(d_ids, P, 0, NULL, 1, scratch, need, &r, NULL) == MOET_EINVAL,
	      "no experts");
	nb = r;
	nb.pairs = (moet_gpu_pair *)((uint8_t *)r.pairs + 4);
	CHECK(moet_gpu_group_pairs(d_ids, P, E, NULL, 1, scratch, need, &nb, NULL) == MOET_EINVAL,
	      "misaligned pairs");
	CHECK(moet_gpu_group_scratch_bytes(-1, E, &need) == MOET_EINVAL, "scratch of -1 pairs");
	moet_gpu_free(scratch);
	moet_gpu_free(d);
	moet_gpu_free(d_ids);
	free(ids);
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	test_matrix();
	test_bad_ids();
	return moet_test_done("test_gpu_group");
}
