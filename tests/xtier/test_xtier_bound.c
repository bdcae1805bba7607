/*
 * test_xtier_bound.c: the hindsight bounds of the NVMe tier (moet_xtier.h, issue 9) as pure
 * functions, against references written here that share nothing with the code under test:
 *   - Belady/MIN's misses = the optimum of an exhaustive search over every eviction choice
 *     of a demand-fetch cache (dynamic programming over (position, resident set)), on 400
 *     random traces of 12 accesses over 5 experts, 2 and 3 slots, from an empty cache and
 *     from random start contents;
 *   - MIN from the best start contents = the search's minimum over every start set;
 *   - the claim the tier's property rests on: a cache that may read any expert at any time
 *     (prefetch) needs no fewer reads than demand MIN (search over every read schedule);
 *   - a cyclic trace of k + 1 experts with k slots: MIN misses k + ceil((n - k) / k) (closed
 *     form: after the fills, every k-th access), LRU (simulated here) misses every access;
 *   - the best static set = the top-k counts found by repeated maximum; a trace where it
 *     beats MIN (it bypasses, MIN must admit every miss);
 *   - refusals: a key out of range, a repeated start key, no slot (one-line messages).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_test.h"
#include "moet_xtier.h"

#define NK 5   /* experts of the random traces */
#define N 12   /* accesses */
#define BIG 1000

static int popcount(unsigned m)
{
	int c = 0;
	for (; m; m &= m - 1)
		c++;
	return c;
}

/* Demand cache, k slots: the fewest misses serving t[i ..] from resident set `mask`, over
 * every choice of victim (memo[i][mask], -1 unknown). */
static int demand_opt(const int *t, int i, unsigned mask, int k, int memo[N + 1][1 << NK])
{
	if (i == N)
		return 0;
	if (memo[i][mask] >= 0)
		return memo[i][mask];
	const unsigned bit = 1u << t[i];
	int best;
	if (mask & bit) {
		best = demand_opt(t, i + 1, mask, k, memo);
	} else if (popcount(mask) < k) {
		best = 1 + demand_opt(t, i + 1, mask | bit, k, memo);
	} else {
		best = BIG;
		for (int v = 0; v < NK; v++)
			if (mask & (1u << v)) {
				const unsigned next = (mask & ~(1u << v)) | bit;
				int c = 1 + demand_opt(t, i + 1, next, k, memo);
				best = c < best ? c : best;
			}
	}
	return memo[i][mask] = best;
}

/* Any read schedule, k slots: before access i the cache may become any set S of at most k
 * experts holding t[i], at the cost of the experts read (S less the current set). */
static int prefetch_opt(const int *t, int i, unsigned mask, int k, int memo[N + 1][1 << NK])
{
	if (i == N)
		return 0;
	if (memo[i][mask] >= 0)
		return memo[i][mask];
	int best = BIG;
	for (unsigned s = 0; s < (1u << NK); s++) {
		if (!(s & (1u << t[i])) || popcount(s) > k)
			continue;
		int c = popcount(s & ~mask) + prefetch_opt(t, i + 1, s, k, memo);
		best = c < best ? c : best;
	}
	return memo[i][mask] = best;
}

static void reset(int memo[N + 1][1 << NK])
{
	memset(memo, 0xff, sizeof(int) * (N + 1) * (1 << NK));
}

static void random_traces(void)
{
	static int memo[N + 1][1 << NK], pmemo[N + 1][1 << NK];
	uint64_t rs = 0x5eed1234ull;
	int checked = 0;
	for (int trial = 0; trial < 400; trial++) {
		const int k = 2 + trial % 2;
		int t[N];
		int32_t keys[N];
		/* skewed: expert 0 and 1 more often, so that hits happen */
		for (int i = 0; i < N; i++) {
			uint64_t r = moet_test_xorshift64(&rs) % 8;
			t[i] = r < 4 ? (int)(r % 2) : (int)(r % NK);
			keys[i] = t[i];
		}
		/* start contents: every subset of at most k experts, each checked */
		int best_any = BIG;
		for (unsigned s = 0; s < (1u << NK); s++) {
			if (popcount(s) > k)
				continue;
			int32_t init[NK];
			int ni = 0;
			for (int v = NK - 1; v >= 0; v--) /* any order: descending here */
				if (s & (1u << v))
					init[ni++] = v;
			reset(memo);
			const int want = demand_opt(t, 0, s, k, memo);
			best_any = want < best_any ? want : best_any;
			uint64_t got = 0;
			int rc = moet_xtier_min_misses(keys, N, NK, k, init, ni, &got);
			CHECK(rc == 0 && got == (uint64_t)want, "trial %d, k %d, start %#x: MIN "
			      "%llu, search %d (rc %d %s)", trial, k, s, (unsigned long long)got,
			      want, rc, moet_errmsg());
			if (trial % 8 == 0) {
				reset(pmemo);
				const int pf = prefetch_opt(t, 0, s, k, pmemo);
				CHECK(pf == want, "trial %d, k %d, start %#x: any read schedule %d "
				      "reads, demand optimum %d", trial, k, s, pf, want);
			}
			checked++;
		}
		uint64_t any = 0;
		int rc = moet_xtier_min_misses_any_start(keys, N, NK, k, &any);
		CHECK(rc == 0 && any == (uint64_t)best_any, "trial %d, k %d: MIN from any start "
		      "%llu, search %d", trial, k, (unsigned long long)any, best_any);
	}
	printf("Belady/MIN = exhaustive search: %d (trace, start) cases, 400 traces of %d "
	       "accesses, 2-3 slots; prefetch schedules never need fewer reads\n", checked, N);
}

/* LRU with k slots on keys[0 .. n): misses (reference for the cyclic case). */
static uint64_t lru_misses(const int32_t *keys, int64_t n, int64_t k)
{
	int32_t *c = malloc((size_t)k * sizeof(*c)); /* c[0] most recent */
	int64_t sz = 0;
	uint64_t miss = 0;
	for (int64_t i = 0; i < n; i++) {
		int64_t at = -1;
		for (int64_t j = 0; j < sz; j++)
			if (c[j] == keys[i])
				at = j;
		if (at < 0) {
			miss++;
			at = sz < k ? sz++ : k - 1;
		}
		memmove(c + 1, c, (size_t)at * sizeof(*c));
		c[0] = keys[i];
	}
	free(c);
	return miss;
}

static void cyclic(void)
{
	for (int64_t k = 1; k <= 6; k++)
		for (int64_t n = k + 1; n <= 40; n += 3) {
			int32_t keys[64];
			for (int64_t i = 0; i < n; i++)
				keys[i] = (int32_t)(i % (k + 1));
			uint64_t got = 0;
			const uint64_t want = (uint64_t)(k + (n - k + k - 1) / k);
			int rc = moet_xtier_min_misses(keys, n, k + 1, k, NULL, 0, &got);
			CHECK(rc == 0 && got == want, "cyclic k %lld n %lld: MIN %llu, closed "
			      "form %llu", (long long)k, (long long)n, (unsigned long long)got,
			      (unsigned long long)want);
			CHECK(lru_misses(keys, n, k) == (uint64_t)n, "cyclic k %lld n %lld: LRU "
			      "hits", (long long)k, (long long)n);
		}
	printf("cyclic k+1 experts, k slots: MIN misses k + ceil((n - k) / k), LRU all\n");
}

static void static_set(void)
{
	uint64_t rs = 0xabcdef01ull;
	for (int trial = 0; trial < 200; trial++) {
		const int64_t nk = 1 + (int64_t)(moet_test_xorshift64(&rs) % 20);
		const int64_t n = (int64_t)(moet_test_xorshift64(&rs) % 200);
		const int64_t k = (int64_t)(moet_test_xorshift64(&rs) % 25);
		int32_t keys[200];
		uint64_t cnt[20] = { 0 };
		for (int64_t i = 0; i < n; i++) {
			uint64_t r = moet_test_xorshift64(&rs);
			keys[i] = (int32_t)((r % 3 ? r % 4 : r >> 8) % (uint64_t)nk);
			cnt[keys[i]]++;
		}
		/* the k largest counts by repeated maximum */
		uint64_t want = 0;
		int taken[20] = { 0 };
		for (int64_t j = 0; j < k && j < nk; j++) {
			int64_t b = -1;
			for (int64_t e = 0; e < nk; e++)
				if (!taken[e] && (b < 0 || cnt[e] > cnt[b]))
					b = e;
			taken[b] = 1;
			want += cnt[b];
		}
		uint64_t got = 0;
		int rc = moet_xtier_static_hits(keys, n, nk, k, &got);
		CHECK(rc == 0 && got == want, "static trial %d: %llu, direct count %llu", trial,
		      (unsigned long long)got, (unsigned long long)want);
		/* NOTE: no order against MIN: the static set serves a miss without admitting it
		 * (admission control), which a demand cache may not; either can be higher */
	}
	/* a case where it is higher: a b c a b c a b c with 2 slots */
	const int32_t cyc[9] = { 0, 1, 2, 0, 1, 2, 0, 1, 2 };
	uint64_t st = 0, any = 0;
	CHECK(moet_xtier_static_hits(cyc, 9, 3, 2, &st) == 0 &&
	      moet_xtier_min_misses_any_start(cyc, 9, 3, 2, &any) == 0 && st == 6 && 9 - any == 5,
	      "abc x 3, 2 slots: static %llu (want 6), MIN any start %llu hits (want 5)",
	      (unsigned long long)st, (unsigned long long)(9 - any));
	printf("best static set = direct top-k count\n");
}

static void refusals(void)
{
	const int32_t keys[4] = { 0, 1, 7, 1 }, init[2] = { 1, 1 };
	uint64_t v = 0;
	moet_err_clear();
	int rc = moet_xtier_min_misses(keys, 4, 4, 2, NULL, 0, &v);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "trace entry 2: key 7 is not in [0, 4)"),
	      "key out of range: %d %s", rc, moet_errmsg());
	rc = moet_xtier_static_hits(keys, 4, 4, 2, &v);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "key 7"), "static: %s", moet_errmsg());
	rc = moet_xtier_min_misses(keys, 2, 4, 2, init, 2, &v);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "start content 1: key 1 is repeated"),
	      "repeated start: %s", moet_errmsg());
	rc = moet_xtier_min_misses(keys, 2, 4, 0, NULL, 0, &v);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "0 slots"), "no slot: %s",
	      moet_errmsg());
	rc = moet_xtier_min_misses(keys, 2, 4, 1, init, 2, &v);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "2 resident at the start"),
	      "start above the slots: %s", moet_errmsg());
	rc = moet_xtier_min_misses(NULL, 0, 4, 1, NULL, 0, &v);
	CHECK(rc == 0 && v == 0, "empty trace: %d %llu", rc, (unsigned long long)v);
	printf("refusals: one-line messages naming the entry\n");
}

int main(void)
{
	random_traces();
	cyclic();
	static_set();
	refusals();
	return moet_test_done("test_xtier_bound");
}
