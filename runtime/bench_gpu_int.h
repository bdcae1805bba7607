/*
 * bench_gpu_int.h: private to `bench gpu-experts` (bench_gpu.c, bench_gpu_decode.c): the
 * ceilings measured by the kernel part, a row with its own name storage, the row table, and
 * the decode part.
 */
#ifndef MOET_BENCH_GPU_INT_H
#define MOET_BENCH_GPU_INT_H

#include "moet_bench.h"

typedef struct moet_bench_ceil {
	double copy_Bps;        /* device copy, bytes read + written per second; 0: not measured */
	double sgemm_flops;     /* the faster SGEMM shape, flop/s */
	int64_t sgemm_n[2];
	double sgemm_at[2];     /* flop/s at n = sgemm_n[i] */
	int no_kernel;          /* the kernel part (and so the ceilings) was skipped */
} moet_bench_ceil;

typedef struct moet_bench_row_out {
	char name[96];
	moet_bench_row r;
} moet_bench_row_out;

/* The rows as a table (name, tokens, times in ms, GB/s, GFLOP/s, ceiling, ratio). */
void moet_bench_gpu_print_rows(const moet_bench_row_out *rows, int n, FILE *f);

/*
 * The decode part: opens (after generating it, when o->model_dir is missing or empty) the
 * checkpoint on o->decode_device, and for each batch size times the whole model's decode
 * step; adds one row per batch size to rec (and rows[0 ..]), advancing *n_rows, and the
 * "decode" object. Ceiling copy_GBps when c measured it, else "none" (ratio 0).
 */
int moet_bench_gpu_decode(const moet_bench_gpu_opts *o, const moet_bench_ceil *c, json_t *rec,
			  FILE *log, moet_bench_row_out *rows, int *n_rows);

#endif
