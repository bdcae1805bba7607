/*
 * test_cost_stage.c: the prefill staging crossover of the cost model (moet_cost_stage_ms,
 * moet_cost_stage_min_rows; placement/moet_cost.h).
 *
 * - A hardware of one-point curves (constant fractions), where the formula is closed:
 *   t_stage(r) = lat + bytes / pcie + max(bytes / gpu_read, r F / (f_g P_g)),
 *   t_cpu(r) = max(bytes / cpu_read, r F / (f_c P_c)); evaluated here, against the functions
 *   at many r, and the crossover against a brute-force scan of this file's own evaluation
 *   and the algebraic solution ceil((lat + copy) / (a - b)) where both are compute bound.
 * - The H200 figures (configs/hardware-h200-host.yaml, the defaults) at Kimi-K2 size: staging
 *   wins at every r from the crossover to 4096 and loses just below it; t_stage never falls
 *   with r; a faster link never moves the crossover up, a slower CPU never moves it up.
 * - Edges: a GPU slower than the CPU never stages (0); max_rows < 1 gives 0; r = 0 costs 0.
 */
#include <math.h>
#include <string.h>

#include "moet_cost.h"
#include "moet_test.h"

static double mx(double a, double b)
{
	return a > b ? a : b;
}

/* This file's evaluation of the closed form. */
static double own_stage(const moet_cost_in *in, double r)
{
	const moet_cost_hw *h = &in->hw;
	const double F = 6.0 * (double)in->d_model * (double)in->moe_inter;
	const double B = (double)in->expert_bytes;
	return h->pcie_latency_us / 1e3 + B / (h->stage_copy_gbps * 1e6) +
	       mx(B / (h->gpu_read_gbps * 1e6),
		  r * F / (h->gpu_sgemm_frac.frac[0] * h->gpu_sgemm_gflops * 1e6));
}

static double own_cpu(const moet_cost_in *in, double r)
{
	const moet_cost_hw *h = &in->hw;
	const double F = 6.0 * (double)in->d_model * (double)in->moe_inter;
	const double B = (double)in->expert_bytes;
	return mx(B / (h->cpu_read_gbps * 1e6),
		  r * F / (h->cpu_fma_frac.frac[0] * h->cpu_fma_gflops * 1e6));
}

static void closed_form(void)
{
	moet_cost_in in;
	memset(&in, 0, sizeof(in));
	moet_cost_hw_defaults(&in.hw);
	in.expert_bytes = 1000000;
	in.d_model = 1000;
	in.moe_inter = 1000;
	in.top_k = 8;
	in.batch = 1;
	in.n_gpus = 1;
	moet_cost_hw *h = &in.hw;
	h->cpu_read_gbps = 100, h->gpu_read_gbps = 1000, h->stage_copy_gbps = 10;
	h->pcie_latency_us = 10, h->cpu_fma_gflops = 1000, h->gpu_sgemm_gflops = 10000;
	h->cpu_fma_frac = (moet_cost_curve){ .n = 1, .tokens = { 4 }, .frac = { 0.5 } };
	h->gpu_sgemm_frac = (moet_cost_curve){ .n = 1, .tokens = { 4 }, .frac = { 0.5 } };
	for (int r = 0; r <= 300; r++) {
		double a = moet_cost_stage_ms(&in, r), b = r ? own_stage(&in, r) : 0;
		CHECK(fabs(a - b) <= 1e-12 * b, "t_stage(%d) = %.17g, formula %.17g", r, a, b);
		double c = moet_cost_call_ms(&in, false, r), d = r ? own_cpu(&in, r) : 0;
		CHECK(fabs(c - d) <= 1e-12 * d, "t_cpu(%d) = %.17g, formula %.17g", r, c, d);
	}
	/* brute force over this file's evaluation: the smallest r whose tail all stages */
	const int64_t max_r = 2000;
	int64_t want = 0;
	for (int64_t r = max_r; r >= 1 && own_stage(&in, r) < own_cpu(&in, r); r--)
		want = r;
	/* both compute bound there: lat + copy + r b < r a, a and b ms per row */
	const double a = 6e6 / (0.5 * 1000e6), b = 6e6 / (0.5 * 10000e6);
	const double alg = floor((0.01 + 0.1) / (a - b)) + 1;
	int64_t got = moet_cost_stage_min_rows(&in, max_r);
	CHECK(got == want && (double)got == alg, "crossover %lld, brute force %lld, algebra %g",
	      (long long)got, (long long)want, alg);
	printf("closed form: crossover %lld tokens (brute force %lld, algebra %g)\n",
	       (long long)got, (long long)want, alg);
	/* a GPU slower than the CPU: never */
	h->gpu_sgemm_gflops = 100;
	CHECK(moet_cost_stage_min_rows(&in, max_r) == 0, "slow GPU: never stage");
	CHECK(moet_cost_stage_min_rows(&in, 0) == 0, "max_rows 0");
}

static void h200(void)
{
	moet_cost_in in;
	memset(&in, 0, sizeof(in));
	moet_cost_hw_defaults(&in.hw);
	in.expert_bytes = 44050944; /* Kimi-K2: 3 x 7168 x 2048 FP8 codes and their scales */
	in.d_model = 7168;
	in.moe_inter = 2048;
	in.top_k = 8;
	in.batch = 1;
	in.n_gpus = 1;
	const int64_t r0 = moet_cost_stage_min_rows(&in, MOET_COST_STAGE_MAX_ROWS);
	/* the copy at the pageable 5 GB/s: 44 MB take ~8.8 ms, which the CPU's t(r) passes in
	 * the tens of tokens (the 10-20 at the pinned link's rate) */
	CHECK(r0 >= 16 && r0 <= 256, "H200 crossover %lld tokens", (long long)r0);
	for (int64_t r = r0; r <= 4096; r++)
		if (!(moet_cost_stage_ms(&in, r) < moet_cost_call_ms(&in, false, r))) {
			CHECK(0, "H200: staging loses at %lld tokens above the crossover %lld",
			      (long long)r, (long long)r0);
			break;
		}
	CHECK(r0 <= 1 || !(moet_cost_stage_ms(&in, r0 - 1) < moet_cost_call_ms(&in, false,
									      r0 - 1)),
	      "H200: staging wins below the crossover");
	for (int64_t r = 1; r < 4096; r++)
		if (moet_cost_stage_ms(&in, r + 1) < moet_cost_stage_ms(&in, r)) {
			CHECK(0, "t_stage falls from %lld to %lld tokens", (long long)r,
			      (long long)r + 1);
			break;
		}
	/* a faster link, or a slower CPU, never stages later */
	int64_t prev = 0;
	for (double link = 4; link <= 256; link *= 2) {
		in.hw.stage_copy_gbps = link;
		int64_t r = moet_cost_stage_min_rows(&in, MOET_COST_STAGE_MAX_ROWS);
		CHECK(r >= 1 && (!prev || r <= prev), "link %g GB/s: crossover %lld after %lld",
		      link, (long long)r, (long long)prev);
		printf("H200 figures, link %5.0f GB/s: stage from %lld tokens per expert\n", link,
		       (long long)r);
		prev = r;
	}
	moet_cost_hw_defaults(&in.hw);
	prev = 0;
	for (double cpu = 2000; cpu >= 100; cpu /= 2) {
		in.hw.cpu_fma_gflops = cpu;
		int64_t r = moet_cost_stage_min_rows(&in, MOET_COST_STAGE_MAX_ROWS);
		CHECK(!prev || (r >= 1 && r <= prev), "CPU %g GFLOP/s: crossover %lld after %lld",
		      cpu, (long long)r, (long long)prev);
		prev = r;
	}
	printf("H200 figures (defaults), Kimi-K2 expert: crossover %lld tokens\n", (long long)r0);
}

int main(void)
{
	closed_form();
	h200();
	return moet_test_done("test_cost_stage");
}
