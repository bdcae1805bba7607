/*
 * group_ref.c: the host specification of the device grouping (moet_group.h): sort the pairs
 * (moet_expert_pairs_sort), then walk them once per tier, as runtime/dispatch.c's run_tier
 * does, writing each tier's run, the slots, and device 0's expert lists.
 *
 * Bad input follows the device's rules: a pair whose id is outside [0, n_exp) is sorted last
 * (its id read as n_exp for the sort) and taken by no tier; an expert whose owner is outside
 * [-1, n_dev) belongs to no tier. Their pairs get slot -1.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_err.h"
#include "moet_group.h"

/* gpu/rows.cu's token-count classes: 1, 2, 3-4, 5-8, 9-16, 17+ */
static int class_of(int32_t n)
{
	return n <= 1 ? 0 : n == 2 ? 1 : n <= 4 ? 2 : n <= 8 ? 3 : n <= 16 ? 4 : 5;
}

/* The tier of expert e: 0 .. n_dev-1 a device, n_dev the CPU tier, -1 none (bad owner). */
static int tier_of(const int16_t *owner, int n_dev, int32_t e)
{
	const int w = owner ? owner[e] : 0;
	return w >= 0 && w < n_dev ? w : w == -1 ? n_dev : -1;
}

int moet_group_ref(const int32_t *ids, int64_t n_pairs, int64_t n_exp, const int16_t *owner,
		   int n_dev, const moet_gpu_group_bufs *out)
{
	const int64_t P = n_pairs, E = n_exp;
	if (P < 0 || P > MOET_GPU_GROUP_MAX_PAIRS || E < 1 || E > MOET_GPU_GROUP_MAX_EXP ||
	    n_dev < 0 || n_dev > MOET_GPU_GROUP_MAX_DEV || (!owner && n_dev < 1))
		return moet_err(MOET_EINVAL, "group ref: %lld pairs, %lld experts, %d devices%s",
				(long long)P, (long long)E, n_dev, owner ? "" : " (no owner row)");
	if (!out || !out->pairs || !out->slot || !out->tier_first || !out->tier_count ||
	    !out->dev0 || !out->dev0_class || !out->class_first || !out->class_count ||
	    !out->n_dev0 || !out->err || (P > 0 && !ids))
		return moet_err(MOET_EINVAL, "group ref: NULL ids or output buffer");
	int32_t *key = malloc((size_t)(P ? P : 1) * sizeof(*key));
	moet_expert_pair *sorted = malloc((size_t)(P ? P : 1) * sizeof(*sorted));
	int rc = 0;
	if (!key || !sorted) {
		rc = moet_err(MOET_ENOMEM, "group ref: %lld pairs", (long long)P);
		goto fail;
	}
	int32_t bad_p = -1, bad_e = -1;
	for (int64_t p = 0; p < P; p++) {
		const int ok = ids[p] >= 0 && ids[p] < E;
		key[p] = ok ? ids[p] : (int32_t)E;
		if (!ok && bad_p < 0)
			bad_p = (int32_t)p;
		out->slot[p] = -1;
	}
	for (int32_t e = 0; e < E && bad_e < 0; e++)
		if (tier_of(owner, n_dev, e) < 0)
			bad_e = e;
	if ((rc = moet_expert_pairs_sort(key, P, sorted)))
		goto fail;

	/* the tiers, in order: the sorted pairs each one owns */
	int32_t at = 0;
	for (int t = 0; t <= n_dev; t++) {
		out->tier_first[t] = at;
		for (int64_t q = 0; q < P; q++) {
			const int32_t e = sorted[q].expert;
			if (e >= E || tier_of(owner, n_dev, e) != t)
				continue;
			moet_gpu_pair *d = &out->pairs[at];
			memset(d, 0, sizeof(*d));
			d->expert = e;
			d->pair = sorted[q].pair;
			out->slot[sorted[q].pair] = at++;
		}
		out->tier_count[t] = at - out->tier_first[t];
	}

	/* device 0's run, one entry per expert */
	int32_t nx = 0;
	const int32_t end0 = n_dev >= 1 ? out->tier_count[0] : 0;
	for (int32_t q = 0, r; q < end0; q += r) {
		for (r = 1; q + r < end0 && out->pairs[q + r].expert == out->pairs[q].expert; r++)
			;
		out->dev0[nx++] = (moet_gpu_group_exp){ out->pairs[q].expert, q, r };
	}
	*out->n_dev0 = nx;
	for (int cl = 0, m = 0; cl < MOET_GPU_GROUP_N_CLASS; cl++) {
		out->class_first[cl] = m;
		for (int32_t i = 0; i < nx; i++)
			if (class_of(out->dev0[i].n_tok) == cl)
				out->dev0_class[m++] = out->dev0[i];
		out->class_count[cl] = m - out->class_first[cl];
	}
	out->err[0] = (bad_p >= 0 ? MOET_GPU_GROUP_BAD_ID : 0) |
		      (bad_e >= 0 ? MOET_GPU_GROUP_BAD_OWNER : 0);
	out->err[1] = bad_p;
	out->err[2] = bad_e;
fail:
	free(key);
	free(sorted);
	return rc;
}

int moet_group_check(const int32_t *err, int64_t layer, const int32_t *ids, int64_t n_exp,
		     int n_dev)
{
	if (!err)
		return moet_err(MOET_EINVAL, "group check: NULL report");
	if (err[0] & MOET_GPU_GROUP_BAD_ID) {
		if (ids && err[1] >= 0)
			return moet_err(MOET_ERANGE, "layer %lld: routing pair %d has expert id %d, "
					"outside [0, %lld)", (long long)layer, err[1],
					ids[err[1]], (long long)n_exp);
		return moet_err(MOET_ERANGE, "layer %lld: routing pair %d has an expert id outside "
				"[0, %lld)", (long long)layer, err[1], (long long)n_exp);
	}
	if (err[0] & MOET_GPU_GROUP_BAD_OWNER)
		return moet_err(MOET_ERANGE, "layer %lld: expert %d has an owner outside [-1, %d)",
				(long long)layer, err[2], n_dev);
	if (err[0])
		return moet_err(MOET_ERANGE, "layer %lld: grouping report %d", (long long)layer,
				err[0]);
	return 0;
}
