/*
 * moet_mat.h: a borrowed view of one weight matrix as the checkpoint stores it.
 *
 *   data       rows x cols elements, row-major, dtype F8_E4M3, BF16 or F32 (the bytes of the
 *              mmap'd shard: never copied, never repacked)
 *   scale_inv  F32 [ceil(rows/128)][ceil(cols/128)], the checkpoint's weight_scale_inv for
 *              F8_E4M3 weights; NULL means every block scale is 1.0f (BF16, F32 weights)
 *
 * The dequantized weight is W[r][k] = dec(data[r][k]) * scale_inv[r/128][k/128], but the
 * contract never forms that product: the scale is applied once per 128-column block partial.
 */
#ifndef MOET_MAT_H
#define MOET_MAT_H

#include <stdint.h>

#include "moet_dtype.h"

#define MOET_BLOCK 128 /* rows and columns per weight_scale_inv block */

typedef struct moet_mat {
	moet_dtype dtype;       /* F8_E4M3, BF16 or F32 */
	int64_t rows;           /* output features */
	int64_t cols;           /* input features (K) */
	const void *data;       /* borrowed */
	const float *scale_inv; /* borrowed, or NULL (scale 1.0f) */
} moet_mat;

/* Bytes of w's elements, and of its block scales (0 without scales). */
static inline size_t moet_mat_data_bytes(const moet_mat *w)
{
	return (size_t)w->rows * (size_t)w->cols * moet_dtype_size(w->dtype);
}

static inline size_t moet_mat_scale_bytes(const moet_mat *w)
{
	return w->scale_inv ? (size_t)((w->rows + MOET_BLOCK - 1) / MOET_BLOCK) *
				      (size_t)((w->cols + MOET_BLOCK - 1) / MOET_BLOCK) * sizeof(float)
			    : 0;
}

#endif
