/*
 * xtier_bound.c: hindsight bounds of the NVMe tier's cache (issue 9), pure functions of a
 * lookup trace (keys in [0, n_keys), the order of the tier's lookups): the misses of
 * Belady's MIN (on a miss with every slot full, evict the key whose next use is farthest:
 * the fewest misses of any demand cache of n_slots, from given start contents or from any),
 * and the hits of the best static set (the n_slots most used keys). moet_xtier_stats_bounds
 * (xtier.c) applies them to the tier's own trace; docs/io-uring.md says what they bound.
 */
#include <stdint.h>
#include <stdlib.h>

#include "moet_err.h"
#include "moet_xtier.h"

/* The checks every bound shares: the keys in [0, n_keys). */
static int check_keys(const int32_t *keys, int64_t n, int64_t n_keys, int64_t n_slots)
{
	if (n < 0 || n_keys < 1 || n_slots < 0 || (n > 0 && !keys))
		return moet_err(MOET_EINVAL, "hindsight bound: trace of %lld lookups, %lld keys, "
				"%lld slots", (long long)n, (long long)n_keys, (long long)n_slots);
	for (int64_t i = 0; i < n; i++)
		if (keys[i] < 0 || keys[i] >= n_keys)
			return moet_err(MOET_EINVAL, "hindsight bound: trace entry %lld: key "
					"%lld is not in [0, %lld)", (long long)i,
					(long long)keys[i], (long long)n_keys);
	return 0;
}

typedef struct use_ent {
	int64_t next;   /* index of the key's next use (n: none) */
	int32_t key;
} use_ent;

/* The max-heap by next use: push, and pop of the top. */
static void heap_push(use_ent *h, int64_t *hn, use_ent v)
{
	int64_t i = (*hn)++;
	while (i > 0 && h[(i - 1) / 2].next < v.next) {
		h[i] = h[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h[i] = v;
}

static use_ent heap_pop(use_ent *h, int64_t *hn)
{
	use_ent top = h[0], v = h[--*hn];
	int64_t i = 0, n = *hn;
	for (;;) {
		int64_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && h[c + 1].next > h[c].next)
			c++;
		if (h[c].next <= v.next)
			break;
		h[i] = h[c];
		i = c;
	}
	if (n > 0)
		h[i] = v;
	return top;
}

int moet_xtier_min_misses(const int32_t *keys, int64_t n, int64_t n_keys, int64_t n_slots,
			  const int32_t *init, int64_t n_init, uint64_t *out_misses)
{
	int rc = check_keys(keys, n, n_keys, n_slots);
	if (rc)
		return rc;
	if (n_slots < 1 || n_init < 0 || n_init > n_slots || (n_init > 0 && !init))
		return moet_err(MOET_EINVAL, "Belady bound: %lld slots, %lld resident at the start",
				(long long)n_slots, (long long)n_init);
	int64_t *nxt = malloc((size_t)(n + 1) * sizeof(*nxt));
	int64_t *cur = malloc((size_t)n_keys * sizeof(*cur));
	uint8_t *res = calloc((size_t)n_keys, 1);
	use_ent *h = malloc((size_t)(n + n_init + 1) * sizeof(*h));
	int64_t hn = 0, size = 0;
	uint64_t miss = 0;
	if (!nxt || !cur || !res || !h) {
		rc = moet_err(MOET_ENOMEM, "Belady bound: %lld lookups", (long long)n);
		goto fail;
	}
	for (int64_t k = 0; k < n_keys; k++)
		cur[k] = n; /* scanning backwards: the next occurrence after i */
	for (int64_t i = n - 1; i >= 0; i--) {
		nxt[i] = cur[keys[i]];
		cur[keys[i]] = i;
	}
	for (int64_t j = 0; j < n_init; j++) {
		const int32_t k = init[j];
		if (k < 0 || k >= n_keys || res[k]) {
			rc = moet_err(MOET_EINVAL, "Belady bound: start content %lld: key %lld "
				      "is %s", (long long)j, (long long)k,
				      k < 0 || k >= n_keys ? "out of range" : "repeated");
			goto fail;
		}
		res[k] = 1;
		heap_push(h, &hn, (use_ent){ cur[k], k }); /* cur[k]: its first use, or n */
		size++;
	}
	for (int64_t i = 0; i < n; i++) {
		const int32_t k = keys[i];
		if (!res[k]) {
			miss++;
			if (size == n_slots) {
				use_ent v;
				do /* the first live entry: the resident key used farthest ahead */
					v = heap_pop(h, &hn);
				while (!res[v.key] || cur[v.key] != v.next);
				res[v.key] = 0;
				size--;
			}
			res[k] = 1;
			size++;
		}
		cur[k] = nxt[i];
		heap_push(h, &hn, (use_ent){ nxt[i], k });
	}
	*out_misses = miss;
fail:
	free(nxt);
	free(cur);
	free(res);
	free(h);
	return rc;
}

int moet_xtier_min_misses_any_start(const int32_t *keys, int64_t n, int64_t n_keys,
				    int64_t n_slots, uint64_t *out_misses)
{
	uint64_t m = 0;
	int rc = moet_xtier_min_misses(keys, n, n_keys, n_slots, NULL, 0, &m);
	if (rc)
		return rc;
	uint8_t *seen = calloc((size_t)n_keys, 1);
	if (!seen)
		return moet_err(MOET_ENOMEM, "Belady bound: %lld keys", (long long)n_keys);
	int64_t distinct = 0;
	for (int64_t i = 0; i < n; i++)
		if (!seen[keys[i]]++)
			distinct++;
	free(seen);
	*out_misses = m - (uint64_t)(distinct < n_slots ? distinct : n_slots);
	return 0;
}

static int cmp_count_desc(const void *a, const void *b)
{
	const uint64_t p = *(const uint64_t *)a, q = *(const uint64_t *)b;
	return p < q ? 1 : p > q ? -1 : 0;
}

int moet_xtier_static_hits(const int32_t *keys, int64_t n, int64_t n_keys, int64_t n_slots,
			   uint64_t *out_hits)
{
	int rc = check_keys(keys, n, n_keys, n_slots);
	if (rc)
		return rc;
	uint64_t *cnt = calloc((size_t)n_keys, sizeof(*cnt));
	if (!cnt)
		return moet_err(MOET_ENOMEM, "static-set bound: %lld keys", (long long)n_keys);
	for (int64_t i = 0; i < n; i++)
		cnt[keys[i]]++;
	qsort(cnt, (size_t)n_keys, sizeof(*cnt), cmp_count_desc);
	uint64_t sum = 0;
	for (int64_t k = 0; k < n_keys && k < n_slots; k++)
		sum += cnt[k];
	free(cnt);
	*out_hits = sum;
	return 0;
}

