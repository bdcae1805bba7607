/*
 * rows_int.h: private interface of gpu/rows.cu, the one implementation of the contract dot
 * product D(W, r, x) on the device (docs/numerics.md), shared by the expert FFN (expert.cu)
 * and the dense linear layers (linear.cu). CUDA files of gpu/ only.
 *
 * A job computes, for a list of groups (an expert each, or one matrix), every (row, token) of
 * each group:
 *   nmat 2:  out[p][i] = silu_c(D(W0, i, x[tok[p]])) * D(W1, i, x[tok[p]])
 *   nmat 1:  out[p][i] = D(W0, i, x[tok[p]])   (canon != 0: NaN canonicalized)
 * where the pairs p are numbered group by group (group g owns n_0 + .. + n_{g-1} .. + n_g - 1)
 * and tok == NULL means tok[p] = p. Groups come from a callback so that callers need no array
 * of their own (no allocation inside an op).
 */
#ifndef MOET_GPU_ROWS_INT_H
#define MOET_GPU_ROWS_INT_H

#include <cuda_runtime.h>
#include <stdint.h>

enum { MOET_ROWS_F8 = 0, MOET_ROWS_BF16 = 1, MOET_ROWS_F32 = 2 };

typedef struct moet_rows_group {
	const void *w[2];     /* device weights of matrix 0 (and 1 when nmat == 2) */
	const float *s[2];    /* device block scales, or NULL (1.0f) */
	int64_t n;            /* tokens (pairs) of the group, >= 0 */
} moet_rows_group;

typedef void (*moet_rows_get_fn)(const void *ctx, int64_t i, moet_rows_group *out);

typedef struct moet_rows_job {
	int dt;               /* MOET_ROWS_*; F32 only with nmat 1 */
	int nmat;             /* 1 or 2 */
	int rows, K;          /* output rows of every group, dot length */
	const float *x;       /* activations: row xr at x + xr * x_stride */
	long long x_stride;   /* floats */
	const int32_t *tok;   /* pair -> activation row (outside [0, n_x): a row of +0), or NULL */
	int n_x;              /* activation rows */
	float *out;           /* out[p * out_stride + row] */
	long long out_stride; /* floats */
	int vec;              /* 16-byte staging: caller checked K * esize % 16 == 0, K % 4 == 0 and
			       * 16-byte aligned weights and x (x_stride % 4 == 0) */
	int canon;            /* nmat 1: canonicalize NaN outputs */
} moet_rows_job;

/*
 * Queues the job on `stream`: a few launches of one kernel template per token-count class.
 * The caller validated shapes, pointers and that the total of pairs and tiles fits in int.
 * Returns 0, MOET_EINVAL (too many tiles for one launch) or MOET_EDEVICE.
 */
int moet_rows_run(const moet_rows_job *job, moet_rows_get_fn get, const void *ctx,
		  int64_t n_groups, cudaStream_t stream);

#endif
