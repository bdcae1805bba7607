/*
 * moet_bench_e2e.h: `moet-hybrid bench e2e` (runtime/bench_e2e.c): the whole model under the
 * placements gpu (every routed expert on the GPU), hybrid (a placement file's) and cpu (every
 * routed expert on the CPU tier): decode steps at several batch sizes with the time split,
 * the overlap check against the serial run, prefill, and the time to ready.
 */
#ifndef MOET_BENCH_E2E_H
#define MOET_BENCH_E2E_H

#include "moet_bench.h"
#include "moet_cost.h"
#include "moet_model.h"

enum { MOET_E2E_GPU = 0, MOET_E2E_HYBRID = 1, MOET_E2E_CPU = 2 };

typedef struct moet_bench_e2e_opts {
	const char *model_dir;
	const char *device;       /* "cuda" (or "cpu": the simulated device 0, for tests) */
	const int16_t *owner;     /* [layers x experts] of the hybrid mode (-1 CPU, g GPU g) */
	int n_devices;            /* GPUs of the hybrid mode's placement (0: 1) */
	int modes;                /* bit (1 << MOET_E2E_*) per mode to run */
	const int64_t *batches;   /* decode batch sizes */
	int n_batches;
	const int64_t *prefills;  /* prefill prompt lengths */
	int n_prefills;
	int ctx;                  /* prompt length before the decode steps */
	int steps;                /* timed decode steps per batch */
	int warmup;               /* untimed decode steps before them (the caches, the NVMe
				     tier's slots, the micro-batch choice settle); 1 by default */
	int overlap_check;        /* also run the serial reference for the hybrid and cpu modes */
	int op_times;             /* time every backend op (MOET_OP_TIMES): a table per batch */
	int graph;                /* gpu mode: each decode batch also with CUDA graphs
				     (MOET_CUDA_GRAPH=1): rows decode-gpu-graph */
	const char *profile_out;  /* the routing of the first mode's timed decode steps, as a
				     profile (placement/moet_profile.h), or NULL */
	/* RAM budgets of the NVMe tier (docs/io-uring.md) to decode under as well, for the
	 * hybrid and cpu modes: labels such as "50%" applied by apply_ram (the CLI's parser);
	 * each adds decode-<mode>-ram<label> rows at every batch size */
	const char *const *ram_budgets;
	int n_ram;
	int (*apply_ram)(moet_model *m, const char *label);
	void (*report_ram)(const moet_model *m, FILE *f);
	int ram_only;             /* 1: of each mode only the RAM-budget rows (no all-in-RAM
				     decode rows, hence no overlap check) */
	/* The figures of a hardware file (--hardware-out, moet_bench_e2e_hw_save): */
	int cpu_read;             /* also the source read ceiling with the CPU tier's team
				     (ceiling cpu_source_read_GBps, its "threads"), on any device */
	const moet_cost_hw *dense_hw; /* non-NULL: each gpu-mode step gets "gpu_expert_ms", the
				     cost model's GPU expert time on this hardware for that
				     batch's own routing (its timed steps), and "dense_ms", the
				     step less that; the record's "dense_hardware" names it */
	const char *dense_hw_file;    /* where dense_hw came from (NULL: built-in), recorded */
} moet_bench_e2e_opts;

/* Runs the bench, rows into rec (moet_bench_record_new("e2e")), progress to log, the table
 * to out. Returns 0 or the first error (a mode's open, placement or pass). */
int moet_bench_e2e(const moet_bench_e2e_opts *o, json_t *rec, FILE *log, FILE *out);

/* The CPU tier's team as the engine sizes it on `device` ("cuda" or "cpu"): MOET_CPU_THREADS,
 * else every core on the CPU backend, every core but one beside a GPU (hybrid.c's rule). */
int moet_bench_e2e_tier_threads(const char *device);

/*
 * Writes the hardware file (placement/moet_cost.h's format, moet_cost_hw_save) that the
 * record `rec` of a finished bench e2e run measured, each figure under a comment naming its
 * row of the record and the run (command, date, commit; `rec_path`, where the record was
 * written, may be NULL): cpu_read_gbps (ceiling cpu_source_read_GBps), pcie_gbps (ceiling
 * h2d_GBps), gpu_dense_ms (the gpu-mode steps' dense_ms, batch sorted; points the reader
 * would refuse, <= 0 or below a smaller batch's, left out with their values in a comment).
 * A figure the record lacks, and every figure bench e2e does not measure, is left out with a
 * comment saying so: the reader's default applies. Errors: MOET_EINVAL (nothing measured:
 * no figure at all), MOET_EIO / MOET_ENOMEM of the writer, their details naming `path`.
 */
int moet_bench_e2e_hw_save(const json_t *rec, const char *rec_path, const char *path);

#endif
