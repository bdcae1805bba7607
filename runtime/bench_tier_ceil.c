/*
 * bench_tier_ceil.c: the bandwidth ceilings of the expert tiers, for benches that price a
 * step by the bytes it reads (bench serve's roofline prediction; moet_bench.h):
 *
 *   CPU tier   moet_bench_tier_read_GBps: a team of n_threads workers (an executor over
 *              every node's cores, as the hybrid engine's CPU tier has) streams disjoint
 *              shares of a buffer of max(4 x L3, 256 MiB) with moet_bench_read, each worker
 *              first-touching its own share; median of `reps` after one warm-up pass. The
 *              same measurement as bench cpu-experts' read_GBps (runtime/bench_cpu.c), with
 *              the tier's thread count instead of that bench's --threads/--node.
 *   GPU tier   moet_bench_copy_GBps: device-to-device copies of 1 GiB on the current GPU,
 *              bytes read + written per second, median of `reps` (gpu/bench_ceil.cu's
 *              moet_gpu_bench_copy, as bench gpu-experts' copy_GBps).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "moet_bench.h"
#include "moet_cpuexec.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_topo.h"

#define TIER_MAX_REPS 64

int moet_bench_tier_read_GBps(int n_threads, int reps, double *out_GBps, size_t *out_bytes)
{
	moet_cpuexec *ex = NULL;
	uint8_t *buf = NULL;
	size_t bytes;
	double t[TIER_MAX_REPS];
	if (reps < 1 || reps > TIER_MAX_REPS || n_threads < 0)
		return moet_err(MOET_EINVAL, "read ceiling: %d reps (1 .. %d), %d threads", reps,
				TIER_MAX_REPS, n_threads);
	moet_cpuexec_opts eo = { .node = MOET_TOPO_ALL_NODES, .n_threads = n_threads,
				 .max_tok = 8, .max_jobs = 1 };
	int rc = moet_cpuexec_create(&eo, &ex);
	if (rc)
		return moet_err_prefix(rc, "read ceiling: executor");
	const uint64_t l3 = moet_topo_l3_bytes(moet_cpuexec_topo(ex));
	bytes = (size_t)(4 * l3 > ((size_t)256 << 20) ? 4 * l3 : ((size_t)256 << 20));
	buf = aligned_alloc((size_t)2 << 20, bytes); /* a multiple of 2 MiB */
	if (!buf) {
		rc = moet_err(MOET_ENOMEM, "read ceiling: %zu bytes", bytes);
		goto fail;
	}
	madvise(buf, bytes, MADV_HUGEPAGE); /* a hint, as bench cpu-experts gives */
	if ((rc = moet_bench_touch_par(ex, buf, bytes)) ||
	    (rc = moet_bench_read_par(ex, buf, bytes)))
		goto fail;
	for (int i = 0; i < reps; i++) {
		double t0 = moet_bench_now_s();
		if ((rc = moet_bench_read_par(ex, buf, bytes)))
			goto fail;
		t[i] = moet_bench_now_s() - t0;
	}
	moet_bench_stats st;
	moet_bench_stats_of(t, reps, &st);
	*out_GBps = (double)bytes / st.median_s / 1e9;
	if (out_bytes)
		*out_bytes = bytes;
fail:
	free(buf);
	moet_cpuexec_destroy(ex);
	return rc;
}

int moet_bench_copy_GBps(int reps, double *out_GBps)
{
	const size_t bytes = (size_t)1 << 30;
	double t[TIER_MAX_REPS];
	if (reps < 1 || reps > TIER_MAX_REPS)
		return moet_err(MOET_EINVAL, "copy ceiling: %d reps (1 .. %d)", reps, TIER_MAX_REPS);
	int rc = moet_gpu_bench_copy(bytes, reps, t);
	if (rc)
		return rc;
	moet_bench_stats st;
	moet_bench_stats_of(t, reps, &st);
	*out_GBps = 2.0 * (double)bytes / st.median_s / 1e9;
	return 0;
}
