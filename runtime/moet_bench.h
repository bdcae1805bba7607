/*
 * moet_bench.h: what every `moet-hybrid bench ...` shares: timing statistics, the JSON
 * record of ../shared/design/BENCHMARKS.md (docs/benchmarks.md), the machine description,
 * the host ceilings (streaming-read bandwidth, binary32 FMA peak) and the benches themselves.
 *
 * Record (schema MOET_BENCH_SCHEMA):
 *   { "schema": 1, "bench": "cpu-experts", "date": "2026-11-30T01:02:03Z",
 *     "git": { "commit": "<sha>"|"unknown", "dirty": true|false|null },
 *     "command": "<exact command line>",
 *     "machine": { "cpu_model", "cores", "numa_nodes", "l3_bytes", "ram_bytes", "flags": [..],
 *                  "gpus", ... (each bench adds its own, e.g. "kernel_variant") },
 *     "ceilings": { "<name>": { "value": x, "unit": "GB/s" }, ... },
 *     "results": [ { "name", "tokens", "median_s", "min_s", "max_s", "reps", "bytes", "flops",
 *                    "ceiling", "ratio" }, ... ],
 *     ... bench-specific objects (geometry, executor) }
 */
#ifndef MOET_BENCH_H
#define MOET_BENCH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MOET_BENCH_SCHEMA 1

typedef struct moet_bench_stats {
	double median_s, min_s, max_s;
	int reps;
} moet_bench_stats;

/* Monotonic seconds. */
double moet_bench_now_s(void);

/* Median (mean of the middle two for even n), min and max of n > 0 samples; sorts them. */
void moet_bench_stats_of(double *samples_s, int n, moet_bench_stats *out);

/* The mean of n > 0 samples. NOTE (why, beside the median): a throughput is the mean; the
 * median hides a few long steps (e.g. the NVMe tier's steps that wait for a read). */
double moet_bench_mean(const double *samples_s, int n);

/*
 * A new record for bench `bench`: schema, date (UTC), git commit and dirty flag of the
 * source tree the binary was built from (asked of git at run time; MOET_GIT_COMMIT and
 * MOET_GIT_DIRTY=0|1 in the environment override it, for runs on a copy without .git;
 * "unknown"/null when neither answers), the exact command line (/proc/self/cmdline), the
 * machine object, empty "ceilings" and "results". Returns 0 or MOET_ENOMEM; *out is the
 * caller's (json_decref).
 */
int moet_bench_record_new(const char *bench, json_t **out);

/* ceilings[name] = { value, unit }. Returns 0 or MOET_ENOMEM. */
int moet_bench_add_ceiling(json_t *rec, const char *name, double value, const char *unit);

typedef struct moet_bench_row {
	const char *name;      /* what was measured */
	int64_t tokens;        /* per expert or per step; -1: not applicable (omitted) */
	moet_bench_stats st;
	double bytes, flops;   /* per repetition; 0: not applicable (omitted) */
	const char *ceiling;   /* the ceiling's name in "ceilings" */
	double ratio;          /* achieved / ceiling, same run */
	double mean_s;         /* the mean repetition, where kept (> 0: written as "mean_s") */
} moet_bench_row;

/* Appends a row to results. Returns 0 or MOET_ENOMEM. */
int moet_bench_add_row(json_t *rec, const moet_bench_row *row);

/* Writes the record (indented, keys in insertion order). Returns 0 or MOET_EIO. */
int moet_bench_write(const json_t *rec, const char *path);

/* ---- host ceilings (bench_ceil.c) -------------------------------------------------------- */

/* Reads bytes (a multiple of 64, buf 64-byte aligned) with the widest loads this CPU has
 * (AVX-512 where present) and returns a value that depends on every byte (so the reads
 * cannot be elided). Thread-safe. */
uint64_t moet_bench_read(const void *buf, size_t bytes);

/* iters rounds of independent binary32 FMA chains in registers (AVX-512 where present);
 * returns the flops performed (2 per lane-FMA). Thread-safe. */
double moet_bench_fma(int64_t iters);

/* Worker w's page-aligned share [lo, hi) of n bytes split over nw workers (the last takes
 * the rest). */
void moet_bench_share(size_t n, int w, int nw, size_t *lo, size_t *hi);

struct moet_cpuexec;
/* Every worker of ex writes its share of buf (first touch: its pages on the worker's node),
 * or reads it with moet_bench_read (the read ceilings' timed pass). Return
 * moet_cpuexec_run's code. */
int moet_bench_touch_par(struct moet_cpuexec *ex, uint8_t *buf, size_t bytes);
int moet_bench_read_par(struct moet_cpuexec *ex, const uint8_t *buf, size_t bytes);

/* "avx512", "avx2" or "scalar": what moet_bench_read / moet_bench_fma use here. */
const char *moet_bench_ceil_isa(void);

/* The host-to-device ceiling: copies of 256 MiB from pinned memory to the current GPU, median
 * of 5, in GB/s (bench_h2d.c). MOET_EUNSUP without CUDA, MOET_EDEVICE, MOET_ENOMEM. */
int moet_bench_h2d_GBps(double *out_GBps);

/* ---- expert-tier ceilings (bench_tier_ceil.c) -------------------------------------------- */

/* The CPU tier's streaming-read ceiling: n_threads workers (0: every core) over every node's
 * cores read disjoint shares of a max(4 x L3, 256 MiB) buffer they first-touched; median of
 * reps (1 .. 64) after a warm-up, in GB/s; *out_bytes (may be NULL) the buffer's size.
 * MOET_EINVAL, MOET_ENOMEM, or the executor's errors. */
int moet_bench_tier_read_GBps(int n_threads, int reps, double *out_GBps, size_t *out_bytes);

/* The current GPU's device-to-device copy ceiling (bytes read + written per second, 1 GiB,
 * median of reps in 1 .. 64), in GB/s. MOET_EUNSUP without CUDA, MOET_EDEVICE, MOET_ENOMEM. */
int moet_bench_copy_GBps(int reps, double *out_GBps);

/* ---- `bench cpu-experts` (bench_cpu.c) --------------------------------------------------- */

typedef struct moet_bench_cpu_opts {
	int n_threads;           /* 0: every core of the node */
	int node;                /* NUMA node (or MOET_TOPO_ALL_NODES) */
	const int64_t *tokens;   /* tokens per expert to measure; NULL: the default list */
	int n_tokens;
	int rotate;              /* experts rotated over; 0: enough for 2 x L3 (8 with quick) */
	int reps;                /* repetitions per row; 0: 10 (3 with quick) */
	int quick;               /* the reduced set: a smoke check within a minute on 2 cores */
	int64_t hidden, inter;   /* expert geometry; 0: Kimi-K2 (7168, 2048) */
	int split;               /* MOET_CPUEXEC_SPLIT_* */
	double max_row_s;        /* stop a row's repetitions after this (at least 3); 0: 30 s */
	int fast;                /* also time fast mode (moet_fast.h) after each expert row */
} moet_bench_cpu_opts;

/*
 * Runs the CPU expert bench (ceilings, expert kernel per token count, decode) through a CPU
 * executor, adds ceilings, rows and the geometry/executor objects to rec, prints progress to
 * `log` and the table last to `table`. Returns 0 or a MOET_E* code (detail set).
 */
int moet_bench_cpu_experts(const moet_bench_cpu_opts *o, json_t *rec, FILE *log, FILE *table);

/* ---- `bench gpu-experts` (bench_gpu.c) --------------------------------------------------- */

typedef struct moet_bench_gpu_opts {
	const int64_t *tokens;   /* tokens per expert to measure; NULL: the default list */
	int n_tokens;
	int group;               /* experts per grouped call; 0: 8 */
	int rotate;              /* experts in the pool; 0: enough to defeat L2 (>= 64; 16 quick) */
	int reps;                /* repetitions per row; 0: 10 (3 with quick) */
	int quick;               /* the reduced set */
	int64_t hidden, inter;   /* expert geometry; 0: Kimi-K2 (7168, 2048) */
	const char *model_dir;   /* decode part: checkpoint dir (generated if empty); NULL: skip */
	const char *decode_device; /* backend of the decode part; NULL: "cuda" */
	const int64_t *batches;  /* decode batch sizes; NULL: 1, 16, 64 */
	int n_batches;
	int decode_steps;        /* timed decode steps per batch size; 0: 5 (3 with quick) */
	int prompt_len;          /* prefill length per sequence; 0: 8 */
	int no_kernel;           /* skip the ceilings and the kernel rows (tests of the decode
				  * part on the CPU backend) */
} moet_bench_gpu_opts;

/*
 * Runs the GPU expert bench: the device copy bandwidth and cuBLAS binary32 GEMM rate, the
 * contract expert kernel (moet_gpu_expert_ffn) per token count, and, with a model dir, the
 * decode step time of the model at each batch size. Adds ceilings, rows and the geometry,
 * device and decode objects to rec, prints progress to `log` and the table last to `table`.
 * Returns 0 or a MOET_E* code (detail set); MOET_EUNSUP when a part needs a CUDA device and
 * there is none (the detail says why).
 */
int moet_bench_gpu_experts(const moet_bench_gpu_opts *o, json_t *rec, FILE *log, FILE *table);

#endif
