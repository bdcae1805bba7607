/*
 * test_router_ref.c: expert selection against a sort-based reference written from the
 * definition (group scores from sorted groups, groups and experts ranked by qsort with the
 * canonical tie rule), on random scores with deliberate ties, with and without groups.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moet_cpu.h"
#include "moet_test.h"

typedef struct { float v; int id; } ranked;

static int by_value_then_id(const void *a, const void *b)
{
	const ranked *x = a, *y = b;
	if (x->v != y->v)
		return x->v > y->v ? -1 : 1;
	return x->id - y->id;
}

static uint64_t rng = 12345;
static uint32_t next_u32(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng >> 33);
}

static void reference(const float *score, const float *bias, int E, int G, int TG, int K,
		      int norm, float rsf, int32_t *ids, double *w)
{
	ranked all[512], grp[64];
	int per = E / G;
	unsigned char ok[512];
	for (int e = 0; e < E; e++)
		ok[e] = 1;
	if (G > 1) {
		for (int g = 0; g < G; g++) {
			ranked in[512];
			for (int i = 0; i < per; i++)
				in[i] = (ranked){ score[g * per + i] + bias[g * per + i], i };
			qsort(in, (size_t)per, sizeof(ranked), by_value_then_id);
			grp[g] = (ranked){ per > 1 ? in[0].v + in[1].v : in[0].v, g };
		}
		qsort(grp, (size_t)G, sizeof(ranked), by_value_then_id);
		for (int e = 0; e < E; e++)
			ok[e] = 0;
		for (int j = 0; j < TG; j++)
			for (int i = 0; i < per; i++)
				ok[grp[j].id * per + i] = 1;
	}
	int n = 0;
	for (int e = 0; e < E; e++)
		if (ok[e])
			all[n++] = (ranked){ score[e] + bias[e], e };
	qsort(all, (size_t)n, sizeof(ranked), by_value_then_id);
	double sum = 0;
	for (int i = 0; i < K; i++) {
		ids[i] = all[i].id;
		sum += score[all[i].id];
	}
	for (int i = 0; i < K; i++)
		w[i] = (norm ? score[ids[i]] / sum : score[ids[i]]) * rsf;
}

int main(void)
{
	const int cfgs[][4] = { { 16, 1, 1, 4 }, { 32, 4, 2, 4 }, { 256, 8, 4, 8 },
				{ 384, 1, 1, 8 }, { 64, 64, 8, 8 }, { 12, 3, 1, 2 } };
	for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
		int E = cfgs[c][0], G = cfgs[c][1], TG = cfgs[c][2], K = cfgs[c][3];
		for (int trial = 0; trial < 300; trial++) {
			float score[512], bias[512], scratch[600], wts[16];
			int32_t ids[16], rids[16];
			double rw[16];
			for (int e = 0; e < E; e++) {
				/* coarse values force ties among scores, biases and group sums */
				score[e] = (float)(next_u32() % 16) / 16.0f;
				bias[e] = (trial % 2) ? (float)(next_u32() % 4) / 8.0f : 0.0f;
			}
			int norm = trial % 3 != 0;
			moet_router_select_ref(score, bias, E, G, TG, K, norm, 2.5f, scratch, ids, wts);
			reference(score, bias, E, G, TG, K, norm, 2.5f, rids, rw);
			for (int i = 0; i < K; i++) {
				CHECK(ids[i] == rids[i], "E=%d G=%d trial %d: slot %d expert %d, want %d",
				      E, G, trial, i, ids[i], rids[i]);
				CHECK(fabs(wts[i] - rw[i]) <= 1e-6 * fabs(rw[i]) + 1e-30,
				      "E=%d trial %d: weight %d %g vs %g", E, trial, i, wts[i], rw[i]);
			}
			if (moet_test_failures)
				return moet_test_done("test_router_ref");
		}
	}
	return moet_test_done("test_router_ref");
}
