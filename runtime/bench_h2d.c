/*
 * bench_h2d.c: the host-to-device ceiling shared by `bench e2e` and `bench load`: pinned copies
 * of 256 MiB to the current GPU, median of 5 (moet_bench.h).
 */
#include <string.h>

#include "moet_bench.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"

int moet_bench_h2d_GBps(double *out_GBps)
{
	const size_t bytes = (size_t)256 << 20;
	void *h = NULL, *d = NULL;
	double t[5];
	int rc = moet_gpu_host_alloc(bytes, &h);
	if (!rc)
		rc = moet_gpu_alloc(bytes, &d);
	if (!rc)
		memset(h, 1, bytes);
	for (int i = 0; i < 5 && !rc; i++) {
		double t0 = moet_bench_now_s();
		rc = moet_gpu_copy_h2d(d, h, bytes);
		t[i] = moet_bench_now_s() - t0;
	}
	moet_gpu_free(d);
	moet_gpu_host_free(h);
	if (!rc) {
		moet_bench_stats st;
		moet_bench_stats_of(t, 5, &st);
		*out_GBps = (double)bytes / st.median_s / 1e9;
	}
	return rc;
}
