/*
 * moet_tpsplit.h: where the tensor-parallel split (MOET_TP, runtime/tp.c) cuts a matrix's rows,
 * written once for the engine and for the placement's memory accounting (placement/
 * place_sizes.c), so that `inspect --placement` counts the bytes each GPU really holds.
 *
 * A matrix of `rows` output rows over n ranks: rank r holds rows [r0[r], r0[r+1]).
 *   at heads   head_rows > 0 (q_b or q_proj, kv_b: the attention split by heads): rank r the
 *              rows of heads [h0[r], h0[r+1]), ceil(n_heads / n) heads each, when every boundary is a
 *              multiple of 128 (scaled: F8 with 128 x 128 block scales) or the matrix has no
 *              scales: a slice is then a plain view of data and scale rows;
 *   by blocks  otherwise: ceil(blocks / n) blocks of 128 rows each (of 1 row without scales),
 *              the last ranks possibly empty.
 * Returns 1 for the split at heads, 0 for the split by blocks.
 */
#ifndef MOET_TPSPLIT_H
#define MOET_TPSPLIT_H

#include <stdint.h>

static inline int moet_tp_row_split(int64_t rows, int scaled, int n, int64_t n_heads,
				    int64_t head_rows, int64_t *r0)
{
	const int64_t g = scaled ? 128 : 1;
	int heads = head_rows > 0 && n_heads > 0 && rows == n_heads * head_rows;
	const int64_t per_head = n_heads > 0 ? (n_heads + n - 1) / n : 0;
	for (int r = 0; heads && r <= n; r++) {
		const int64_t h = per_head * r < n_heads ? per_head * r : n_heads;
		r0[r] = h * head_rows;
		heads = r0[r] % g == 0 || r0[r] == rows;
	}
	if (heads)
		return 1;
	const int64_t take = ((rows + g - 1) / g + n - 1) / n * g;
	for (int r = 0; r <= n; r++)
		r0[r] = take * r < rows ? take * r : rows;
	return 0;
}

#endif
