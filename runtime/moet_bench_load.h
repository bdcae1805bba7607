/*
 * moet_bench_load.h: `moet-hybrid bench load` (runtime/bench_load.c): the time to make the
 * CPU tier (every routed expert, without a placement) resident in RAM slots by io_uring
 * reads (the NVMe tier's warm fill, runtime/moet_xtier.h), and the time to ready of a start
 * on a device (open, hot experts' upload, CPU tier fill), against the disk's sequential read
 * bandwidth and, with a GPU, the host-to-device bandwidth, both measured in the same run; and
 * the staged upload's fill of its staging without the transfer (map fresh, map warm, pread).
 */
#ifndef MOET_BENCH_LOAD_H
#define MOET_BENCH_LOAD_H

#include "moet_bench.h"

typedef struct moet_bench_load_opts {
	const char *model_dir;
	size_t ram_budget_bytes;  /* slots to fill; 0: the whole tier, at most 80% of MemAvailable */
	unsigned queue_depth;     /* io_uring requests in flight; 0: 64 */
	int direct;               /* MOET_URING_DIRECT_* (moet_uring.h); 0: auto */
	size_t disk_bytes;        /* sequential read: at most this much of the shards; 0: 8 GiB */
	int no_gpu;               /* skip the host-to-device measurement */
	int no_register;          /* slots not registered with io_uring */
	int progress;             /* progress bar on `log` (bytes, rate, ETA) */
	/* the start (time to ready of a serving model), measured when device is set */
	const char *device;       /* "cuda", or "cpu" (simulated devices: tests); NULL: none */
	const int16_t *owner;     /* placement [layers x E] (borrowed); NULL: every routed
				     expert on device 0 */
	int n_devices;            /* the placement's GPUs (0: 1) */
	const char *upload;       /* MOET_UPLOAD for the hot experts: "uring", "staged",
				     "plain"; NULL: the environment's */
	size_t fill_bytes;        /* the fill rows' experts: at most this much; 0: 8 GiB */
	int cold;                 /* the start: the shards' pages dropped from the page cache
				     first (posix_fadvise; record start.cold) */
} moet_bench_load_opts;

/* Runs the bench: ceilings disk_read_GBps (and h2d_GBps), rows disk-seq-read and load-tier,
 * a "load" object into rec (moet_bench_record_new("load")); with o->device also row "start"
 * and object "start" (open + hot experts' upload + the CPU tier's fill, against max(bytes
 * read / disk, bytes uploaded / h2d)); progress to log, the table to out. Returns 0 or the
 * first error. */
int moet_bench_load(const moet_bench_load_opts *o, json_t *rec, FILE *log, FILE *out);

struct moet_model;
/*
 * The staged upload's fill alone (runtime/bench_load_fill.c): the placement's hot experts
 * (o->owner >= 0; every routed expert without one), at most o->fill_bytes, copied into the
 * upload's ring of staging buffers by its threads (moet_upload_many_opts with fill_only: no
 * transfer, no GPU) three ways: from a fresh mapping of the shards (mapped for the row: its
 * pages faulted by the fill), from that mapping again (faulted), and by pread from the
 * files. Rows fill-map-fresh, fill-map-warm, fill-pread (ratio: GB/s over read_GBps, the
 * disk_read_GBps ceiling), object "fill" into rec; the table lines to out. m is borrowed (its
 * checkpoint is read, not changed). Returns 0 or the first error.
 */
int moet_bench_load_fill(const moet_bench_load_opts *o, const struct moet_model *m,
			 double read_GBps, json_t *rec, FILE *log, FILE *out);

#endif
