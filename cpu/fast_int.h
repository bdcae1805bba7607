/*
 * fast_int.h: internals of the fast expert mode (moet_fast.h) that need no oneDNN, kept apart
 * so tests can check them everywhere: packing dequantized weight rows into the blocked
 * layout a oneDNN matmul primitive asks for.
 *
 * A panel is the weights operand of one matmul, K x N (k: weight column, n: weight row).
 * Element (k, n) is at panel[off_k[k] + off_n[n]] (uint16 units). oneDNN's AMX/bf16 kernels
 * ask for BA16a<nb>b2a, blocks of 32 k x nb n, 4 KB for nb = 64:
 *
 *   block (kb, nbk) at off_k[32 kb] + off_n[nb nbk], blocks of one n range contiguous in k
 *     +-- k pair 0:  n0 k0 n0 k1 | n1 k0 n1 k1 | ... | n(nb-1) k0 n(nb-1) k1   (2 nb bf16)
 *     +-- k pair 1:  n0 k2 n0 k3 | ...
 *     ...
 *     +-- k pair 15
 *
 * so a k pair of one weight row is one 32-bit word and 16 rows x 32 k are a 16 x 16
 * transpose of words: the vector path dequantizes 16 rows x 32 columns into 16 registers,
 * transposes them and stores 16 x 64 bytes. Other layouts go element by element.
 */
#ifndef MOET_FAST_INT_H
#define MOET_FAST_INT_H

#include <stdint.h>

#include "moet_mat.h"

typedef struct moet_fast_layout {
	int64_t pk, pn;              /* padded K and N of the panel */
	const int32_t *off_k, *off_n; /* [pk], [pn]: element (k, n) at off_k[k] + off_n[n] */
	int nb;                      /* 16, 32 or 64: BA16a<nb>b2a (checked); 0: any other */
} moet_fast_layout;

/* n weight rows r0 .. r0+n-1 of w, as consecutive panel columns (w NULL: n must be 0). */
typedef struct moet_fast_rows {
	const moet_mat *w;
	int64_t r0, n;
} moet_fast_rows;

/*
 * 16, 32 or 64 when (off_k, off_n) over pk x pn are exactly BA16a<nb>b2a (see the note
 * above), else 0. For moet_fast_layout.nb.
 */
int moet_fast_layout_nb(int64_t pk, int64_t pn, const int32_t *off_k, const int32_t *off_n);

/*
 * Writes the panel: column n < a.n is row a.r0 + n of a.w, a.n <= n < a.n + b.n row
 * b.r0 + n - a.n of b.w, over weight columns k0 .. k0+kn-1 (panel k 0 .. kn-1); each
 * element bf16(dec(code) * block scale) for F8_E4M3 (product rounded to binary32, then to
 * bf16 to nearest even, NaN as 0x7FC0) or the BF16 bits as they are; every other element
 * of the pk x pn panel is 0. kn <= pk, a.n + b.n <= pn; the matrices are F8_E4M3 with
 * scales or BF16 (the caller checked). vec 0: scalar, element by element (the reference);
 * 1: the fastest path this CPU has, the same bits: AVX-512 F/BW/VL, 16 x 32 tiles when
 * lay->nb and k0 % 32 == 0, FP8 through per-block tables where it also has VBMI; 2: like 1
 * without the tables (for tests). Single-threaded; writes only where the layout puts
 * elements.
 */
void moet_fast_pack(const moet_fast_layout *lay, moet_fast_rows a, moet_fast_rows b, int64_t k0,
		    int64_t kn, uint16_t *panel, int vec);

/* out[i] = bf16(in[i]) to nearest even, NaN as 0x7FC0, for i < n (AVX-512 where present). */
void moet_fast_to_bf16(const float *in, uint16_t *out, int64_t n);

#endif
