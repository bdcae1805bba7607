/*
 * test_sample.c: greedy and seeded sampling against the definitions.
 *   - argmax: ties to the lowest id, NaN never wins;
 *   - reproducible: (seed, position) gives the same token; other seeds/positions vary;
 *   - the empirical distribution over 200,000 positions matches softmax(logits / T) restricted
 *     to top_k / top_p (computed here from the definition), within 5 standard deviations, and
 *     never leaves the allowed support; the uniform draws are uniform (mean, buckets);
 *   - bad parameters give MOET_EINVAL.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_sample.h"
#include "moet_test.h"

#define V 6
#define DRAWS 200000

/* Expected probabilities: softmax over the kept set, from the definition. */
static void expected(const float *l, double T, int top_k, double top_p, double *pr)
{
	int order[V];
	for (int i = 0; i < V; i++)
		order[i] = i;
	for (int i = 0; i < V; i++) /* insertion sort, value desc, id asc */
		for (int j = i; j > 0 && (l[order[j]] > l[order[j - 1]] ||
					  (l[order[j]] == l[order[j - 1]] && order[j] < order[j - 1]));
		     j--) {
			int t = order[j];
			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	int keep = top_k > 0 && top_k < V ? top_k : V;
	double w[V], tot = 0;
	for (int i = 0; i < keep; i++)
		tot += (w[i] = exp(l[order[i]] / T));
	double acc = 0;
	int cut = keep;
	for (int i = 0; i < keep; i++) {
		acc += w[i];
		if (acc >= top_p * tot) {
			cut = i + 1;
			break;
		}
	}
	double z = 0;
	for (int i = 0; i < cut; i++)
		z += w[i];
	memset(pr, 0, V * sizeof(double));
	for (int i = 0; i < cut; i++)
		pr[order[i]] = w[i] / z;
}

static void check_distribution(const float *l, double T, int top_k, double top_p)
{
	moet_sample_params p = { T, top_k, top_p, 1234 };
	int64_t scratch[V], id;
	long count[V] = { 0 };
	double pr[V];
	expected(l, T, top_k, top_p, pr);
	for (int64_t pos = 0; pos < DRAWS; pos++) {
		CHECK(moet_sample(l, V, &p, pos, scratch, &id) == 0 && id >= 0 && id < V, "sample");
		count[id]++;
	}
	for (int i = 0; i < V; i++) {
		double mean = pr[i] * DRAWS, sd = sqrt(DRAWS * pr[i] * (1 - pr[i]));
		CHECK(fabs(count[i] - mean) <= 5 * sd + (pr[i] == 0 ? 0 : 1),
		      "T=%g k=%d p=%g: token %d drawn %ld times, expected %.1f (sd %.1f)", T, top_k,
		      top_p, i, count[i], mean, sd);
	}
}

int main(void)
{
	const float l[V] = { 1.0f, 2.5f, 0.5f, 2.5f, -1.0f, 0.0f };
	const float tie[4] = { 3.0f, 3.0f, NAN, 1.0f };
	const float nans[2] = { NAN, NAN };
	CHECK(moet_argmax(l, V) == 1, "argmax ties to the lowest id");
	CHECK(moet_argmax(tie, 4) == 0, "argmax with NaN");
	CHECK(moet_argmax(nans, 2) == 0, "all NaN");

	int64_t scratch[V], a, b;
	moet_sample_params greedy = { 0, 0, 1, 7 };
	CHECK(moet_sample(l, V, &greedy, 5, scratch, &a) == 0 && a == 1, "temperature 0 = greedy");
	moet_sample_params k1 = { 1.3, 1, 1, 7 };
	for (int64_t pos = 0; pos < 100; pos++)
		CHECK(moet_sample(l, V, &k1, pos, scratch, &a) == 0 && a == 1, "top_k 1 = greedy");

	moet_sample_params sp = { 0.8, 0, 1, 99 };
	int same = 1, differ = 0;
	for (int64_t pos = 0; pos < 200; pos++) {
		moet_sample(l, V, &sp, pos, scratch, &a);
		moet_sample(l, V, &sp, pos, scratch, &b);
		same &= a == b;
		moet_sample(l, V, &sp, pos + 1000, scratch, &b);
		differ += a != b;
	}
	CHECK(same, "same (seed, position) gives the same token");
	CHECK(differ > 20, "positions vary the draw (%d of 200 differ)", differ);

	double mean = 0;
	long bucket[10] = { 0 };
	for (int64_t i = 0; i < DRAWS; i++) {
		double u = moet_sample_uniform(42, i);
		CHECK(u >= 0 && u < 1, "uniform in [0, 1)");
		mean += u;
		bucket[(int)(u * 10)]++;
	}
	mean /= DRAWS;
	CHECK(fabs(mean - 0.5) < 5 * sqrt(1.0 / 12 / DRAWS), "uniform mean %g", mean);
	for (int i = 0; i < 10; i++)
		CHECK(labs(bucket[i] - DRAWS / 10) < 5 * sqrt(DRAWS * 0.09), "bucket %d: %ld", i,
		      bucket[i]);

	check_distribution(l, 1.0, 0, 1.0);
	check_distribution(l, 0.5, 0, 1.0);
	check_distribution(l, 2.0, 3, 1.0);
	check_distribution(l, 1.0, 0, 0.5);
	check_distribution(l, 1.0, 4, 0.8);

	moet_sample_params bad[] = { { -1, 0, 1, 0 }, { 1, -2, 1, 0 }, { 1, 0, 0, 0 },
				     { 1, 0, 1.5, 0 } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(moet_sample(l, V, &bad[i], 0, scratch, &a) == MOET_EINVAL, "bad params %zu", i);
	return moet_test_done("test_sample");
}
