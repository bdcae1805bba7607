/*
 * sample.c: greedy and seeded top-k / top-p sampling (moet_sample.h).
 *
 * NOTE: candidates are ranked with one sort of indices by (value desc, id asc), through a
 * thread-local pointer to the values (qsort has no context argument). The full sort costs
 * ~10 ms at a 160K vocabulary on one core: fine for the reference; a partial selection for
 * small top_k is the obvious next step.
 *
 * NOTE: the softmax terms use moet_exp64 (common/moet_exp64.h), not libm's exp, so that the
 * device sampler (gpu/sample.cu) computes the same binary64 sums bit for bit.
 */
#include "moet_sample.h"

#include <math.h>
#include <stdlib.h>

#include "moet_err.h"
#include "moet_exp64.h"

int64_t moet_argmax(const float *logits, int64_t n)
{
	int64_t best = -1;
	for (int64_t i = 0; i < n; i++) {
		if (logits[i] != logits[i])
			continue;
		if (best < 0 || logits[i] > logits[best])
			best = i;
	}
	return best < 0 ? 0 : best;
}

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

double moet_sample_uniform(uint64_t seed, int64_t pos)
{
	uint64_t r = splitmix64(splitmix64(seed) ^ (uint64_t)pos);
	return (double)(r >> 11) * 0x1p-53;
}

static _Thread_local const float *sort_vals;

static int by_value_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	float vx = sort_vals[x], vy = sort_vals[y];
	int nx = vx != vx, ny = vy != vy; /* NaN sorts last */
	if (nx != ny)
		return nx - ny;
	if (!nx && vx != vy)
		return vx > vy ? -1 : 1;
	return (x > y) - (x < y);
}

int moet_sample_check(const moet_sample_params *p)
{
	if (!(p->temperature >= 0) || isinf(p->temperature))
		return moet_err(MOET_EINVAL, "temperature %g: must be finite and >= 0", p->temperature);
	if (p->top_k < 0)
		return moet_err(MOET_EINVAL, "top_k %lld: must be >= 0", (long long)p->top_k);
	if (!(p->top_p > 0 && p->top_p <= 1))
		return moet_err(MOET_EINVAL, "top_p %g: must be in (0, 1]", p->top_p);
	return 0;
}

int moet_sample(const float *logits, int64_t n, const moet_sample_params *p, int64_t pos,
		int64_t *scratch, int64_t *out_id)
{
	int rc = moet_sample_check(p);
	if (rc)
		return rc;
	if (n < 1)
		return moet_err(MOET_EINVAL, "sampling over %lld logits", (long long)n);
	if (p->temperature == 0) {
		*out_id = moet_argmax(logits, n);
		return 0;
	}
	for (int64_t i = 0; i < n; i++)
		scratch[i] = i;
	sort_vals = logits;
	qsort(scratch, (size_t)n, sizeof(*scratch), by_value_desc);
	int64_t keep = (p->top_k > 0 && p->top_k < n) ? p->top_k : n;
	while (keep > 1 && logits[scratch[keep - 1]] != logits[scratch[keep - 1]])
		keep--; /* drop NaNs */
	const double inv_t = 1.0 / p->temperature, top = (double)logits[scratch[0]];
	double total = 0.0;
	for (int64_t i = 0; i < keep; i++)
		total += moet_exp64(((double)logits[scratch[i]] - top) * inv_t);
	/* top-p: the shortest prefix reaching top_p of the kept mass */
	double mass = 0.0;
	int64_t cut = keep;
	for (int64_t i = 0; i < keep; i++) {
		mass += moet_exp64(((double)logits[scratch[i]] - top) * inv_t);
		if (mass >= p->top_p * total) {
			cut = i + 1;
			break;
		}
	}
	double prefix = 0.0;
	for (int64_t i = 0; i < cut; i++)
		prefix += moet_exp64(((double)logits[scratch[i]] - top) * inv_t);
	double u = moet_sample_uniform(p->seed, pos) * prefix, run = 0.0;
	for (int64_t i = 0; i < cut; i++) {
		run += moet_exp64(((double)logits[scratch[i]] - top) * inv_t);
		if (run > u) {
			*out_id = scratch[i];
			return 0;
		}
	}
	*out_id = scratch[cut - 1];
	return 0;
}
