/*
 * rows_wide.cu: the wide variant of the contract row machinery (rows.cu) for groups of 5 or more
 * tokens (8-token tiles for 5-8, 16-token tiles above), F8_E4M3 or BF16 weights with K a multiple of 16 under 16-byte staging. Same job, same
 * bits as rows_kernel (and moet_dot_ref); chosen per call by moet_rows_job.wide (the
 * MOET_GPU_ROWS_KERNEL switch, moet_rows_variant). Interface: rows_int.h.
 *
 * Why. From 8 tokens per group up the work is the fmas, and rows_kernel gives each (row, token)
 * dot to a quad of threads, so no operand is shared inside a warp. Here each warp works on two
 * contract lanes (w and w + 8) of a tile of 32 virtual rows x 16 tokens, like a small SGEMM:
 * half-warp hh works on lane w + 8hh, its thread (rt, tt) keeps an 8 x 4 register tile of
 * (row, token) dots, and a step loads two 16-byte row fragments (shared by the 4 token threads
 * of the half-warp) and one 16-byte token fragment (shared by the 4 row threads) for 32 fmas:
 * 3 LDS.128 per 32 fmas. The 8 warps hold the 16 lanes; the contract's halving tree runs once
 * per tile at the end (its first level between the half-warps, the rest through shared memory).
 * MOET_ROWS_WIDE_TR 4 (rows_wide_body.cuh) builds the previous 4 x 4 tile instead: the whole
 * warp on one lane, the thread's two lanes one after the other, 2 LDS.128 per 16 fmas.
 *
 * NOTE (the mapping, and why it is exact). The contract (docs/numerics.md) gives every (row,
 * token) sixteen lanes; lane l owns the columns k = 128b + 16t + l. Warp w holds p and acc of
 * lanes w and w + 8 of every (row, token) of the tile, in the registers of the thread that owns
 * the pair in the lane's half-warp, and performs per lane, per 128-column block b, in the
 * reference's order:
 *   p = +0; for t = 0..7: p = fma(dec(W[r][k]), x[k], p) if k < K (else nothing);
 *   acc = fma(p, S[r/128][b], acc)  (every lane, every block, partial blocks too).
 * A lane's condition k < K is the same for the whole warp, so partial blocks cost no
 * divergence. At the end the tree in the reference's pairing:
 *   q[l] = acc[l] + acc[l+8] (a shuffle across the half-warps; in the thread at TR 4);
 *   s[l] = q[l] + q[l+4]; u[l] = s[l] + s[l+2];
 *   D = u[0] + u[1] (through shared memory).
 * Decoding is exact, in two steps as in rows.cu: cvt.rn.f16x2.e4m3x2 then cvt.f32.f16 (NaN
 * codes give NaN; outputs are canonicalized), BF16 a 16-bit shift. With MOET_ROWS_WIDE_W16 1
 * (the default) the first step happens once per staged chunk, into 16-bit values in shared
 * memory (binary16 for F8, the raw bits for BF16), and the second in the step, per use; with 0
 * both happen once per chunk, into binary32. Either way the fma receives the same binary32
 * value. fmaf, --fmad=false, -ftz=false as everywhere in gpu/. Nothing depends on the tiling:
 * every output has its own fixed sequence of operations.
 *
 *   block: 256 threads = 8 warps, two blocks per SM (sm_90); in warp w thread li: hh = li / 16
 *          (lane w + 8hh), rt = li % 4 (virtual rows 8rt .. 8rt+7), tt = li / 4 % 4 (tokens
 *          4tt .. 4tt+3); at TR 4: rt = li % 8 (rows 4rt .. 4rt+3), tt = li / 8, both lanes
 *   virtual rows: 32 per tile; NMAT 1: rows row0 .. row0+31; NMAT 2: gate rows row0 .. row0+15
 *          (virtual 0..15) and up rows row0 .. row0+15 (16..31); a tile lies in one 128-row
 *          block of the scales (row0 is a multiple of 32 / NMAT)
 *   shared: two decoded chunks, each wf[16 lanes][8 steps][32 rows] (warp w decodes step w,
 *          thread li row li: 32 consecutive floats per store; at W16 wf[16][8][16 words], word
 *          i holding virtual rows i and i + 16 as 16-bit values, thread (rt, tt)'s rows being
 *          4rt .. 4rt+3 and 16+4rt .. 16+4rt+3 (at NMAT 2 the gate and up rows of the same
 *          outputs): one LDS.128 of rows per step instead of two) and xf[16][8][16] (tokens), lanes
 *          8..15 of each 4 (wf) and 16 (xf) floats later, so that the two half-warps' loads of
 *          one step fall in disjoint banks, and
 *          NS raw stages filled by cp.async (weight rows as bytes, activation rows as floats,
 *          zero-filled past the edges; each thread's source rows found once per tile); per
 *          chunk c: wait for raw chunk c+1, one sync, fetch chunk c+NS, decode chunk c+1 into
 *          the other decoded buffer, compute chunk c. At the end the decoded chunks' memory
 *          holds red[8][16][33] for the tree.
 *   thread order: per chunk 8 steps of its lane, then its fold (TR 4: the two lanes one after
 *          the other, so one p tile is live, not two).
 *
 * NOTE (measured, H200, bench gpu-experts, 8 Kimi-K2 experts, docs/gpu.md): 16 tokens per
 * expert 0.37 of the SGEMM rate (ref 0.34), 256 tokens 0.40 (0.37); at 8 tokens this layout is
 * slower than rows_kernel, so classes below 9 tokens kept it (until the 8-token tiles of the
 * 16-bit layout, moet_rows_wide_pick: 8 tokens 0.418 against 0.38-0.39). Timing the parts
 * (each part skipped in turn) showed the fmas alone near 41 TFLOP/s and the staging (fetch, decode, syncs)
 * costing as much again: each 32-row tile re-reads its tokens' activations from L2, and the
 * register budget of the contract's 16 lanes x (p, acc) caps the tile. Larger tiles with 16
 * warps per block (one lane each, 64 x 32 and 32 x 32 tiles) measured slower; see docs/gpu.md.
 * Those figures predate the one-sync pipeline with two decoded chunks and the per-tile fetch
 * addresses (SASS sm_90, F8 gate_up, per full chunk and thread: 552 -> 471 instructions
 * issued on average, FFMA share 0.52 -> 0.61, two barriers -> one; H200: 256 tokens 0.46 of
 * SGEMM). The 8 x 4 tile (same trace, averaged over the threads that decode activations and
 * those that do not): 469 -> 460 instructions, FFMA share 0.615 -> 0.626, LDS in the steps
 * 32 -> 24 per chunk (LDS per step fma 0.125 -> 0.094), ptxas sm_90 127 registers (two blocks
 * per SM kept), sm_120 137-142; no spills; not yet measured on a GPU.
 * The 16-bit decoded weights (W16) with 4 raw stages and the check-free fetch of full chunks
 * (2026-12-01, H200): 256 tokens 0.503 of SGEMM against 0.481 for the layout before.
 */
#include "rows_int.h"
#include "rows_wide_body.cuh"

#include "gpu_int.h"
#include "moet_dtype.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <stdint.h>

template <int DT, int NMAT, int TBV>
static __global__ void __launch_bounds__(MOET_ROWS_WTHREADS, MOET_ROWS_WIDE_MINB)
	rows_wide_kernel(const __grid_constant__ moet_rows_args a)
{
	using C = moet_rows_wcfg<DT, NMAT, TBV>;
	int e, row0, tok0;
	moet_rows_tile(a, blockIdx.x, C::RB, C::TB, &e, &row0, &tok0);
	moet_rows_wide_body<DT, NMAT, TBV>(a, moet_rows_param_group{ a, e }, row0, tok0, a.n[e],
					   a.pdl);
}

template <int DT, int NMAT, int TBV> static moet_rows_kernel went(void)
{
	using C = moet_rows_wcfg<DT, NMAT, TBV>;
	return moet_rows_kernel{ rows_wide_kernel<DT, NMAT, TBV>, C::SMEM, C::RB, C::TB,
				 MOET_ROWS_WTHREADS };
}

template <int TBV> static moet_rows_kernel went_dt(int dt, int nmat)
{
	if (dt == MOET_ROWS_F8)
		return nmat == 2 ? went<MOET_ROWS_F8, 2, TBV>() : went<MOET_ROWS_F8, 1, TBV>();
	if (dt == MOET_ROWS_BF16)
		return nmat == 2 ? went<MOET_ROWS_BF16, 2, TBV>() : went<MOET_ROWS_BF16, 1, TBV>();
	return moet_rows_kernel{ NULL, 0, 1, 1, 0 };
}

/* Classes (rows.cu): 4 = 9-16 tokens and 5 = 17 or more: 16-token tiles; 3 = 5-8 tokens:
 * 8-token tiles of 64 virtual rows (the 16-bit layout only; MOET_ROWS_WIDE_T8=0 at compile
 * time keeps rows_kernel there, as before); 0-2 (1-4 tokens) stay with rows_kernel. */
#ifndef MOET_ROWS_WIDE_T8
#define MOET_ROWS_WIDE_T8 1
#endif
moet_rows_kernel moet_rows_wide_pick(int dt, int nmat, int cl)
{
	if (cl < 3 || (nmat != 1 && nmat != 2))
		return moet_rows_kernel{ NULL, 0, 1, 1, 0 };
#if MOET_ROWS_WIDE_W16 && MOET_ROWS_WIDE_TR == 8 && MOET_ROWS_WIDE_T8
	if (cl == 3)
		return went_dt<8>(dt, nmat);
#else
	if (cl == 3)
		return moet_rows_kernel{ NULL, 0, 1, 1, 0 };
#endif
	return went_dt<16>(dt, nmat);
}
