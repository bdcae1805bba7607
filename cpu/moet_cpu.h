/*
 * moet_cpu.h: the CPU kernels. Contract kernels (docs/numerics.md) exist as a scalar `_ref`
 * that is the specification; optimized variants must return the same bits.
 */
#ifndef MOET_CPU_H
#define MOET_CPU_H

#include <stdint.h>

#include "moet_mat.h"

/*
 * The contract dot product D(W, r, v): row r of W (W->cols columns) with v[W->cols], in the
 * contract's order (16 lanes, 8 steps per 128-column block, one block-scale fma per lane per
 * block, a halving tree at the end). W->dtype must be F8_E4M3, BF16 or F32. Pure function;
 * thread-safe.
 */
float moet_dot_ref(const moet_mat *w, int64_t r, const float *v);

/* y[r] = D(W, r, v) for r = 0 .. W->rows-1. Thread-safe. */
void moet_matvec_ref(const moet_mat *w, const float *v, float *y);

/*
 * The contract expert FFN for n_tok tokens: for each token t,
 *   g = D(gate, ., x_t); u = D(up, ., x_t); h = silu_c(g) * u; y_t = D(down, ., h),
 * with NaN outputs canonicalized. x is [n_tok][gate->cols], y is [n_tok][down->rows];
 * scratch holds gate->rows floats (borrowed). Returns 0, or MOET_ESHAPE if the three
 * matrices do not chain (gate and up [I x H], down [H x I]).
 */
int moet_expert_ffn_ref(const moet_mat *gate, const moet_mat *up, const moet_mat *down,
			const float *x, int64_t n_tok, float *scratch, float *y);

#endif
