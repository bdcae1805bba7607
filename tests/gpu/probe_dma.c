/*
 * probe_dma.c: does a DMA from the checkpoint's page-locked mapped pages run beside the CPU
 * tier's reads without slowing them? A measurement for issue 5's batch-16 overlap (decode
 * staging of cold experts over the otherwise idle link, docs/staging.md), not a test.
 *
 * Usage: probe_dma FILE [SECONDS]   (tests/gpu/probe_dma.sh makes FILE and runs it)
 *   FILE     a file of at least 1 GiB (its pages are mapped read-only and page-locked)
 *   SECONDS  length of each timed phase (default 1.5)
 * Prints one line per phase:
 *   register   cudaHostRegister(read-only) of the whole mapping, one call: GB/s, and the
 *              process's anonymous memory before and after (RssAnon of /proc/self/status)
 *   dma        44 MB copies (a Kimi-K2 expert) from the registered mapping to the GPU: GB/s
 *   pinned     the same copies from cudaHostAlloc memory (the link's ceiling): GB/s
 *   cpu        every core but one streaming an anonymous buffer (the CPU tier's read): GB/s
 *   cpu+dma    both at once: each one's GB/s
 *   cpu+pinned both at once, the copies from pinned memory
 * Environment: MOET_PROBE_MAP=private maps FILE MAP_PRIVATE (as the checkpoint was mapped
 * until 2026-12-01) instead of MAP_SHARED; MOET_PROBE_REGISTER_ONLY=1 stops after register.
 */
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moet_bench.h"
#include "moet_cpuexec.h"
#include "moet_topo.h"

#define CHUNK ((size_t)44040192) /* 3 x 7168 x 2048 bytes: one F8 Kimi-K2 expert */

typedef struct dma_arg {
	const uint8_t *src;
	size_t bytes;
	void *dst;
	cudaStream_t st;
	double seconds;
	int until_stop;   /* run until `stop` is set instead of for `seconds` */
	atomic_int stop;
	double GBps;
	int rc;
} dma_arg;

/* Copies CHUNK after CHUNK of src (wrapping) to dst, two in flight, for a.seconds. */
static void *dma_loop(void *p)
{
	dma_arg *a = p;
	size_t off = 0, moved = 0;
	cudaEvent_t ev[2];
	a->rc = 0;
	if (cudaEventCreate(&ev[0]) || cudaEventCreate(&ev[1])) {
		a->rc = 1;
		return NULL;
	}
	double t0 = moet_bench_now_s(), t = t0;
	for (int i = 0;; i++) {
		if (i >= 2 && cudaEventSynchronize(ev[i % 2])) {
			a->rc = 1;
			break;
		}
		t = moet_bench_now_s();
		if (a->until_stop ? atomic_load(&a->stop) : t - t0 >= a->seconds)
			break;
		if (off + CHUNK > a->bytes)
			off = 0;
		if (cudaMemcpyAsync(a->dst, a->src + off, CHUNK, cudaMemcpyHostToDevice, a->st) ||
		    cudaEventRecord(ev[i % 2], a->st)) {
			a->rc = 1;
			break;
		}
		off += CHUNK;
		if (i >= 1)
			moved += CHUNK; /* the copy before this one is done once its event is */
	}
	cudaStreamSynchronize(a->st);
	a->GBps = (double)moved / (t - t0) / 1e9;
	cudaEventDestroy(ev[0]);
	cudaEventDestroy(ev[1]);
	return NULL;
}

static double cpu_read(moet_cpuexec *ex, const uint8_t *buf, size_t bytes, double seconds)
{
	size_t moved = 0;
	double t0 = moet_bench_now_s(), t = t0;
	while (t - t0 < seconds) {
		if (moet_bench_read_par(ex, buf, bytes))
			return -1;
		moved += bytes;
		t = moet_bench_now_s();
	}
	return (double)moved / (t - t0) / 1e9;
}

static int both(const char *name, moet_cpuexec *ex, const uint8_t *buf, size_t bytes,
		dma_arg *a, double seconds)
{
	pthread_t th;
	a->until_stop = 1;
	atomic_store(&a->stop, 0);
	if (pthread_create(&th, NULL, dma_loop, a))
		return 1;
	double cpu = cpu_read(ex, buf, bytes, seconds);
	atomic_store(&a->stop, 1);
	pthread_join(th, NULL);
	a->until_stop = 0;
	printf("%-10s cpu %.1f GB/s  dma %.1f GB/s\n", name, cpu, a->GBps);
	return cpu < 0 || a->rc;
}

/* RssAnon of /proc/self/status in MB (-1 unread). */
static long rss_anon_mb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %ld kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb < 0 ? -1 : kb / 1024;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: probe_dma FILE [SECONDS]\n");
		return 2;
	}
	const double secs = argc > 2 ? atof(argv[2]) : 1.5;
	int fd = open(argv[1], O_RDONLY);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) || sb.st_size < (off_t)(1 << 30)) {
		fprintf(stderr, "probe_dma: %s: not a readable file of >= 1 GiB\n", argv[1]);
		return 1;
	}
	const size_t fbytes = (size_t)sb.st_size & ~(size_t)4095;
	const char *mode = getenv("MOET_PROBE_MAP");
	const int priv = mode && !strcmp(mode, "private");
	uint8_t *map = mmap(NULL, fbytes, PROT_READ, priv ? MAP_PRIVATE : MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		perror("probe_dma: mmap");
		return 1;
	}
	madvise(map, fbytes, MADV_POPULATE_READ);
	const long anon0 = rss_anon_mb();
	double t0 = moet_bench_now_s();
	cudaError_t e = cudaHostRegister(map, fbytes, cudaHostRegisterReadOnly);
	double tr = moet_bench_now_s() - t0;
	if (e) {
		fprintf(stderr, "probe_dma: cudaHostRegister: %s\n", cudaGetErrorString(e));
		return 1;
	}
	printf("register   %s mapping, %.2f GB in %.3f s: %.2f GB/s; anonymous memory %ld -> "
	       "%ld MB\n", priv ? "private" : "shared", fbytes / 1e9, tr, fbytes / tr / 1e9, anon0,
	       rss_anon_mb());
	if (getenv("MOET_PROBE_REGISTER_ONLY"))
		return cudaHostUnregister(map) ? 1 : 0;

	dma_arg a = { .src = map, .bytes = fbytes, .seconds = secs };
	void *pinned = NULL;
	if (cudaMalloc(&a.dst, CHUNK) || cudaStreamCreateWithFlags(&a.st, cudaStreamNonBlocking) ||
	    cudaHostAlloc(&pinned, (size_t)1 << 30, cudaHostAllocDefault)) {
		fprintf(stderr, "probe_dma: CUDA allocations failed\n");
		return 1;
	}
	for (size_t i = 0; i < ((size_t)1 << 30); i += 4096)
		((uint8_t *)pinned)[i] = (uint8_t)i;
	dma_loop(&a);
	printf("dma        %.1f GB/s\n", a.GBps);
	dma_arg b = { .src = pinned, .bytes = (size_t)1 << 30, .dst = a.dst, .st = a.st,
		      .seconds = secs };
	dma_loop(&b);
	printf("pinned     %.1f GB/s\n", b.GBps);

	moet_cpuexec *ex = NULL;
	moet_cpuexec_opts eo = { .node = MOET_TOPO_ALL_NODES,
				 .n_threads = moet_topo_cores_but_one(), .max_tok = 8,
				 .max_jobs = 1 };
	const size_t cbytes = (size_t)4 << 30;
	uint8_t *buf = aligned_alloc((size_t)2 << 20, cbytes);
	if (!buf || moet_cpuexec_create(&eo, &ex) || moet_bench_touch_par(ex, buf, cbytes)) {
		fprintf(stderr, "probe_dma: CPU team or buffer failed\n");
		return 1;
	}
	printf("cpu        %.1f GB/s (%d threads)\n", cpu_read(ex, buf, cbytes, secs),
	       moet_cpuexec_n_threads(ex));
	int rc = both("cpu+dma", ex, buf, cbytes, &a, secs) ||
		 both("cpu+pinned", ex, buf, cbytes, &b, secs);
	printf("cpu        %.1f GB/s (again)\n", cpu_read(ex, buf, cbytes, secs));
	moet_cpuexec_destroy(ex);
	free(buf);
	cudaHostUnregister(map);
	cudaFreeHost(pinned);
	cudaFree(a.dst);
	munmap(map, fbytes);
	close(fd);
	return rc;
}
