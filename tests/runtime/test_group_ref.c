/*
 * test_group_ref.c: the host grouping of routing pairs (runtime/group_ref.c), the
 * specification of the device grouping (gpu/group.cu), against independent orderings:
 *
 *   1. random ids (distinct per token as the router gives, heavy ties, arbitrary repeats) over
 *      several expert counts and owner rows (none, random over {-1, 0, 1, 2}, all -1, all 1,
 *      no devices): the list equals a brute-force walk (for each tier, each of its experts
 *      ascending, each pair of that expert ascending); slot is its inverse; tier_first/count,
 *      device 0's expert lists (by id and by class) equal brute-force counts; the padding is 0;
 *      with no owner row the list is moet_expert_pairs_sort's, field for field;
 *   2. bad ids and bad owners: slot -1, in no tier, err names the first of each, and
 *      moet_group_check turns it into MOET_ERANGE with a one-line message naming them;
 *   3. bad arguments: MOET_EINVAL with a message.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_err.h"
#include "moet_group.h"
#include "moet_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
	return (uint32_t)(moet_test_xorshift64(&rng) % n);
}

/* host arrays of one grouping's outputs */
typedef struct bufs {
	moet_gpu_group_bufs b;
	int64_t P, X, T;
} bufs;

static void bufs_free(bufs *h)
{
	free(h->b.pairs);
	free(h->b.slot);
	free(h->b.tier_first);
	free(h->b.tier_count);
	free(h->b.dev0);
	free(h->b.dev0_class);
	free(h->b.class_first);
	free(h->b.class_count);
	free(h->b.n_dev0);
	free(h->b.err);
}

static int bufs_alloc(bufs *h, int64_t P, int64_t E, int n_dev)
{
	memset(h, 0, sizeof(*h));
	h->P = P;
	h->X = P < E ? P : E;
	h->T = n_dev + 1;
	h->b.pairs = calloc((size_t)P + 1, sizeof(moet_gpu_pair));
	h->b.slot = calloc((size_t)P + 1, sizeof(int32_t));
	h->b.tier_first = calloc((size_t)h->T, sizeof(int32_t));
	h->b.tier_count = calloc((size_t)h->T, sizeof(int32_t));
	h->b.dev0 = calloc((size_t)h->X + 1, sizeof(moet_gpu_group_exp));
	h->b.dev0_class = calloc((size_t)h->X + 1, sizeof(moet_gpu_group_exp));
	h->b.class_first = calloc(MOET_GPU_GROUP_N_CLASS, sizeof(int32_t));
	h->b.class_count = calloc(MOET_GPU_GROUP_N_CLASS, sizeof(int32_t));
	h->b.n_dev0 = calloc(1, sizeof(int32_t));
	h->b.err = calloc(3, sizeof(int32_t));
	if (!h->b.pairs || !h->b.slot || !h->b.tier_first || !h->b.tier_count || !h->b.dev0 ||
	    !h->b.dev0_class || !h->b.class_first || !h->b.class_count || !h->b.n_dev0 ||
	    !h->b.err) {
		bufs_free(h);
		return -1;
	}
	return 0;
}

static int tier_of(const int16_t *owner, int n_dev, int64_t e)
{
	int w = owner ? owner[e] : 0;
	return w >= 0 && w < n_dev ? w : w == -1 ? n_dev : -1;
}

static int class_of(int64_t n)
{
	return n <= 1 ? 0 : n == 2 ? 1 : n <= 4 ? 2 : n <= 8 ? 3 : n <= 16 ? 4 : 5;
}

/* Checks h (moet_group_ref's result) against the brute-force walk. */
static void check_brute(const char *what, const int32_t *ids, int64_t P, int64_t E,
			const int16_t *owner, int n_dev, const bufs *h)
{
	const moet_gpu_group_bufs *b = &h->b;
	int64_t q = 0, nx = 0;
	int fails = moet_test_failures;
	for (int t = 0; t <= n_dev && fails == moet_test_failures; t++) {
		CHECK(b->tier_first[t] == q, "%s: tier %d first %d, want %lld", what, t,
		      b->tier_first[t], (long long)q);
		for (int64_t e = 0; e < E; e++) {
			if (tier_of(owner, n_dev, e) != t)
				continue;
			int64_t first = q, n = 0;
			for (int64_t p = 0; p < P; p++) {
				if (ids[p] != e)
					continue;
				const moet_gpu_pair *g = &b->pairs[q];
				if (g->expert != e || g->pair != p || g->pad != 0 || b->slot[p] != q) {
					CHECK(0, "%s: position %lld holds (%d, %lld, pad %d), slot %d; "
					      "want (%lld, %lld), slot %lld", what, (long long)q,
					      g->expert, (long long)g->pair, g->pad, b->slot[p],
					      (long long)e, (long long)p, (long long)q);
					return;
				}
				q++;
				n++;
			}
			if (t == 0 && n_dev >= 1 && n > 0) {
				const moet_gpu_group_exp *x = &b->dev0[nx];
				CHECK(nx < *b->n_dev0 && x->expert == e && x->first == first &&
				      x->n_tok == n, "%s: dev0[%lld] = (%d, %d, %d), want (%lld, %lld, "
				      "%lld)", what, (long long)nx, x->expert, x->first, x->n_tok,
				      (long long)e, (long long)first, (long long)n);
				nx++;
			}
		}
		CHECK(b->tier_count[t] == q - b->tier_first[t], "%s: tier %d count %d, want %lld",
		      what, t, b->tier_count[t], (long long)(q - b->tier_first[t]));
	}
	CHECK(*b->n_dev0 == nx, "%s: %d device 0 experts, want %lld", what, *b->n_dev0,
	      (long long)nx);
	/* the class list: each class's experts of dev0, in id order */
	int64_t m = 0;
	for (int cl = 0; cl < MOET_GPU_GROUP_N_CLASS; cl++) {
		CHECK(b->class_first[cl] == m, "%s: class %d first %d, want %lld", what, cl,
		      b->class_first[cl], (long long)m);
		for (int64_t i = 0; i < nx; i++) {
			if (class_of(b->dev0[i].n_tok) != cl)
				continue;
			CHECK(!memcmp(&b->dev0_class[m], &b->dev0[i], sizeof(b->dev0[i])),
			      "%s: dev0_class[%lld] is not dev0[%lld]", what, (long long)m,
			      (long long)i);
			m++;
		}
		CHECK(b->class_count[cl] == m - b->class_first[cl], "%s: class %d count %d", what,
		      cl, b->class_count[cl]);
	}
	/* pairs of bad ids or bad owners: slot -1 */
	for (int64_t p = 0; p < P; p++)
		if (ids[p] < 0 || ids[p] >= E || tier_of(owner, n_dev, ids[p]) < 0)
			CHECK(b->slot[p] == -1, "%s: bad pair %lld has slot %d", what, (long long)p,
			      b->slot[p]);
}

static void test_random(void)
{
	const int64_t ns[] = { 0, 1, 7, 8, 64, 512 }, ks[] = { 8, 6 }, Es[] = { 384, 256, 64 };
	int cases = 0;
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
		for (size_t b = 0; b < 2; b++)
			for (size_t c = 0; c < 3; c++)
				for (int mode = 0; mode < 3; mode++)
					for (int ow = 0; ow < 5; ow++) {
		const int64_t n = ns[a], k = ks[b], E = Es[c], P = n * k;
		const int n_dev = ow == 0 ? 1 : ow == 4 ? 0 : 3;
		int32_t *ids = malloc((size_t)(P + 1) * sizeof(*ids));
		int16_t *owner = malloc((size_t)E * sizeof(*owner));
		moet_expert_pair *srt = malloc((size_t)(P + 1) * sizeof(*srt));
		bufs h;
		if (!ids || !owner || !srt || bufs_alloc(&h, P, E, n_dev)) {
			CHECK(0, "out of memory");
			free(ids), free(owner), free(srt);
			return;
		}
		moet_test_routing_ids(ids, n, k, E, mode, &rng);
		for (int64_t e = 0; e < E; e++)
			owner[e] = (int16_t)(ow == 1 ? (int)rnd(4) - 1 : ow == 2 || ow == 4 ? -1 : 1);
		const int16_t *orow = ow == 0 ? NULL : owner;
		char what[128];
		snprintf(what, sizeof(what), "n %lld k %lld E %lld ids %d owner %d", (long long)n,
			 (long long)k, (long long)E, mode, ow);
		int rc = moet_group_ref(ids, P, E, orow, n_dev, &h.b);
		CHECK(rc == 0, "%s: rc %d (%s)", what, rc, moet_errmsg());
		if (!rc) {
			check_brute(what, ids, P, E, orow, n_dev, &h);
			CHECK(h.b.err[0] == 0 && h.b.err[1] == -1 && h.b.err[2] == -1,
			      "%s: err %d %d %d", what, h.b.err[0], h.b.err[1], h.b.err[2]);
			CHECK(moet_group_check(h.b.err, 0, ids, E, n_dev) == 0, "%s: check", what);
		}
		if (!rc && !orow && moet_expert_pairs_sort(ids, P, srt) == 0)
			for (int64_t q = 0; q < P; q++)
				if (srt[q].expert != h.b.pairs[q].expert ||
				    srt[q].pair != h.b.pairs[q].pair) {
					CHECK(0, "%s: position %lld differs from moet_expert_pairs_sort",
					      what, (long long)q);
					break;
				}
		cases++;
		bufs_free(&h);
		free(ids);
		free(owner);
		free(srt);
					}
	printf("random: %d cases\n", cases);
}

static void test_bad(void)
{
	const int64_t P = 64, E = 16;
	int32_t ids[64];
	int16_t owner[16];
	bufs h;
	if (bufs_alloc(&h, P, E, 3)) {
		CHECK(0, "out of memory");
		return;
	}
	moet_test_routing_ids(ids, 8, 8, E, 0, &rng);
	ids[9] = -3;
	ids[20] = (int32_t)E;
	ids[40] = INT32_MIN;
	for (int64_t e = 0; e < E; e++)
		owner[e] = (int16_t)((int)rnd(4) - 1);
	owner[5] = -2;
	owner[11] = 3;
	int rc = moet_group_ref(ids, P, E, owner, 3, &h.b);
	CHECK(rc == 0, "bad ids: rc %d", rc);
	check_brute("bad ids and owners", ids, P, E, owner, 3, &h);
	CHECK(h.b.err[0] == (MOET_GPU_GROUP_BAD_ID | MOET_GPU_GROUP_BAD_OWNER) && h.b.err[1] == 9 &&
	      h.b.err[2] == 5, "bad: err %d %d %d", h.b.err[0], h.b.err[1], h.b.err[2]);
	int64_t valid = 0;
	for (int64_t p = 0; p < P; p++)
		valid += ids[p] >= 0 && ids[p] < E && owner[ids[p]] >= -1 && owner[ids[p]] < 3;
	CHECK(h.b.tier_first[3] + h.b.tier_count[3] == valid, "bad: tiers end at %d, %lld valid",
	      h.b.tier_first[3] + h.b.tier_count[3], (long long)valid);
	rc = moet_group_check(h.b.err, 7, ids, E, 3);
	CHECK(rc == MOET_ERANGE && strstr(moet_errmsg(), "layer 7: routing pair 9 has expert id -3"),
	      "check: %d %s", rc, moet_errmsg());
	rc = moet_group_check(h.b.err, 7, NULL, E, 3);
	CHECK(rc == MOET_ERANGE && strstr(moet_errmsg(), "routing pair 9"), "check: %s",
	      moet_errmsg());
	/* owners alone */
	moet_test_routing_ids(ids, 8, 8, E, 0, &rng);
	rc = moet_group_ref(ids, P, E, owner, 3, &h.b);
	CHECK(rc == 0 && h.b.err[0] == MOET_GPU_GROUP_BAD_OWNER && h.b.err[1] == -1 &&
	      h.b.err[2] == 5, "bad owner: err %d %d %d", h.b.err[0], h.b.err[1], h.b.err[2]);
	check_brute("bad owners", ids, P, E, owner, 3, &h);
	rc = moet_group_check(h.b.err, 2, ids, E, 3);
	CHECK(rc == MOET_ERANGE && strstr(moet_errmsg(), "expert 5 has an owner outside [-1, 3)"),
	      "check owner: %s", moet_errmsg());

	/* arguments */
	moet_gpu_group_bufs nb = h.b;
	nb.slot = NULL;
	CHECK(moet_group_ref(ids, P, E, owner, 3, &nb) == MOET_EINVAL && *moet_errmsg(),
	      "NULL slot");
	CHECK(moet_group_ref(NULL, P, E, owner, 3, &h.b) == MOET_EINVAL, "NULL ids");
	CHECK(moet_group_ref(ids, P, 0, owner, 3, &h.b) == MOET_EINVAL, "0 experts");
	CHECK(moet_group_ref(ids, P, MOET_GPU_GROUP_MAX_EXP + 1, owner, 3, &h.b) == MOET_EINVAL,
	      "too many experts");
	CHECK(moet_group_ref(ids, MOET_GPU_GROUP_MAX_PAIRS + 1, E, owner, 3, &h.b) == MOET_EINVAL,
	      "too many pairs");
	CHECK(moet_group_ref(ids, -1, E, owner, 3, &h.b) == MOET_EINVAL, "negative pairs");
	CHECK(moet_group_ref(ids, P, E, NULL, 0, &h.b) == MOET_EINVAL, "no owner, no device");
	CHECK(moet_group_ref(ids, P, E, owner, MOET_GPU_GROUP_MAX_DEV + 1, &h.b) == MOET_EINVAL,
	      "too many devices");
	CHECK(moet_group_check(NULL, 0, NULL, E, 3) == MOET_EINVAL, "NULL report");
	bufs_free(&h);
}

int main(void)
{
	test_random();
	test_bad();
	return moet_test_done("test_group_ref");
}
