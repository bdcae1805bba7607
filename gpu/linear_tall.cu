/*
 * linear_tall.cu: the dense linear layer for a few tokens on a matrix of many rows, one warp
 * per 8 rows walking K on its own (gpu/linear.cu chooses by MOET_GPU_LINEAR), the same bits as
 * the row machinery (rows.cu) and moet_dot_ref.
 *
 * NOTE (why). At a decode batch of 1-4 rows a tall matrix (o_proj 7168 x 8192, q_b 12288 x
 * 1536, kv_b 16384 x 512, a shared expert's down 7168 x 2048 of Kimi-K2) gives the row
 * machinery's 64- or 128-row tiles about one block of 8 warps per SM (112 blocks for o_proj at
 * one token, 56 at four, on 132 SMs), each stepping through K one 128-column chunk after the
 * other behind a block barrier: the H200 took 40-85 us per o_proj call at 1-4 tokens where
 * its 58.7 MB take ~14 us at the copy bandwidth (docs/gpu.md "The dense path"), and linear_ks,
 * which splits K over the warps of a block, was slower still there (8-row blocks restage the
 * activations for every 8 rows). Here each warp owns 8 rows and walks their K alone: its own
 * ring of shared-memory stages fed by cp.async, no block barrier (the warp syncs itself), so
 * that a 7168-row matrix makes 896 independent warps (28-65 us for o_proj at 1-4 tokens).
 *
 * NOTE (why it is exact). The mapping is the row machinery's quad (rows.cu): thread (q, j) of
 * the warp, q = lane / 4, j = lane % 4, holds lanes 4j .. 4j + 3 of row row0 + q for each token
 * of the tile, p[t][4] and acc[t][4]; per block b it runs the contract's eight steps in order
 * (p = fma(dec(W[r][k]), x[k], p), k = 128 b + 16 s + 4 j + i), then acc = fma(p, S[r/128][b],
 * acc), blocks in increasing order, and at the end the contract's halving tree across the
 * quad (moet_rows_quad_tree). Every fma of the contract with the same operands in the same
 * order: the tiling changes speed, never bits.
 *
 * Shared memory per warp: NS stages of BPS 128-column blocks of its 8 rows, rows 16 bytes
 * apart beyond their width so that the warp's 8 rows x 4 threads read 32 banks, and of the
 * tile's tokens' activations over those columns. NOTE: the activations go through the same
 * pipeline: read from L1 / L2 in the step loop (the first version), their latency held each
 * warp to about one block a microsecond (H200, Nsight Compute: o_proj at one token 63 us
 * against the row machinery's 38-40, 0.9 TB/s with 7 blocks in flight per warp). The block
 * scale is an L1 load: staged too it measured slower (docs/gpu.md). Rows past R and columns
 * past K are staged as +0 and never written; tokens past n_tok read the last token's row and
 * are never written. Eligible (gpu/linear.cu): F8_E4M3 (block scales or none), BF16 or F32;
 * K % 128 == 0; 16-byte aligned rows of W and x (the row machinery's vec conditions); at most
 * MOET_GPU_TALL_MAX_TOK tokens (tiles of TB = 1, 2 or 4 tokens, each reading the matrix: the
 * tiles of a row group run next to each other, so the bytes come from L2 after the first).
 * The stage shapes were measured on the H200 only (sm_120's 100 KB of shared memory per SM
 * holds fewer warps of them: not measured there).
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "rows_int.h"
#include "rows_body.cuh"

#include "moet_expc.h"
#include "moet_hd.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define TL_ROWS 8 /* rows per warp (the quads of a warp) */

/* A configuration: NS stages of BPS blocks (128 columns each) per warp, WPB warps per block
 * (each on its own rows: no block barrier). */
template <int ESZ, int TB, int NS, int BPS> struct tall_cfg {
	static constexpr int WROW = BPS * 128 * ESZ + 16;     /* bytes per staged row */
	static constexpr int WBYTES = TL_ROWS * WROW;         /* the warp's rows */
	static constexpr int XROW = BPS * 128;                /* floats per staged token */
	static constexpr int STAGE = WBYTES + TB * XROW * 4;  /* ... and its tokens */
	static constexpr int SMEM = NS * STAGE;               /* per warp */
	static constexpr int PPR = BPS * 128 * ESZ / 16;      /* 16-byte pieces per staged row */
	static constexpr int PIECES = TL_ROWS * PPR;
	static constexpr int XPIECES = TB * BPS * 32;
	static_assert(PIECES % 32 == 0 && XPIECES % 32 == 0, "whole rounds of the warp's copies");
};

template <int TB> static __device__ __forceinline__ void zero(float (&a)[TB][4])
{
#pragma unroll
	for (int t = 0; t < TB; t++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			a[t][i] = 0.0f;
}

/* What a warp writes for (row r, token t) with the dot d: as linear_ks_kernel's epilogues
 * (MOET_KS_PLAIN d, MOET_KS_SILU_MUL silu_c(g[t][r]) * d, MOET_KS_CANON d with a NaN made
 * canonical). Warp w of block i takes the work item i * (blockDim.x / 32) + w: row group
 * item / n_tiles, token tile item % n_tiles. */
template <int DT, int TB, int EPI, int NS, int BPS>
__global__ void __launch_bounds__(128)
	linear_tall_kernel(const unsigned char *__restrict__ W, const float *__restrict__ S, int R,
			   int K, const float *__restrict__ x, long long x_stride, int n_tok,
			   int n_tiles, float *y, long long y_stride, const float *g)
{
	constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : DT == MOET_ROWS_BF16 ? 2 : 4;
	using C = tall_cfg<ESZ, TB, NS, BPS>;
	extern __shared__ __align__(16) unsigned char tall_smem[];

	const int lane = threadIdx.x & 31, q = lane >> 2, j = lane & 3;
	const long long item = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	const long long n_groups = (R + TL_ROWS - 1) / TL_ROWS;
	if (item >= n_groups * n_tiles)
		return; /* the last block's spare warps (no block barrier follows) */
	unsigned char *smem = tall_smem + (threadIdx.x >> 5) * C::SMEM;
	const int row0 = (int)(item / n_tiles) * TL_ROWS, tok0 = (int)(item % n_tiles) * TB;
	const int nb = K / 128, n_st = (nb + BPS - 1) / BPS;
	const int n_rows = min(TL_ROWS, R - row0), n_t = min(TB, n_tok - tok0);
	const float *sp = S ? S + (long long)(row0 / 128) * nb : nullptr;

	/* the tile's token rows (past n_tok: the last token, never written) */
	const float *xt[TB];
#pragma unroll
	for (int t = 0; t < TB; t++)
		xt[t] = x + (long long)(tok0 + min(t, n_t - 1)) * x_stride;

	/* stage st (blocks st * BPS ..): the 8 rows (past R or K as +0) and the tokens'
	 * activations (past K as +0) into slot st % NS */
	auto stage = [&](int st) {
		unsigned char *ws = smem + (st % NS) * C::STAGE;
		const long long c0 = (long long)st * BPS * 128; /* first column */
#pragma unroll
		for (int i = lane; i < C::PIECES; i += 32) {
			const int r = i / C::PPR, pc = i % C::PPR;
			const long long col = c0 * ESZ + pc * 16; /* bytes */
			const bool ok = r < n_rows && col < (long long)K * ESZ;
			moet_cp_async16z(ws + r * C::WROW + pc * 16,
					 ok ? W + (long long)(row0 + r) * K * ESZ + col : W, ok);
		}
		float *xs = (float *)(ws + C::WBYTES);
#pragma unroll
		for (int i = lane; i < C::XPIECES; i += 32) {
			const int t = i / (BPS * 32), pc = i % (BPS * 32);
			const long long col = c0 + pc * 4;
			const bool ok = col < K;
			moet_cp_async16z(xs + t * C::XROW + pc * 4, ok ? xt[t] + col : x, ok);
		}
	};
	float acc[TB][4];
	zero(acc);

#pragma unroll
	for (int st = 0; st < NS - 1; st++) { /* one commit group per stage, empty past n_st */
		if (st < n_st)
			stage(st);
		moet_cp_async_commit();
	}
	for (int st = 0; st < n_st; st++) {
		__syncwarp(); /* stage st - 1's slot, which stage st + NS - 1 takes, is read */
		if (st + NS - 1 < n_st)
			stage(st + NS - 1);
		moet_cp_async_commit();
		moet_cp_async_wait<NS - 1>(); /* this thread's copies of stage st landed */
		__syncwarp();                 /* ... and every thread's */
		const unsigned char *ws = smem + (st % NS) * C::STAGE, *wr = ws + q * C::WROW;
		const float *xs = (const float *)(ws + C::WBYTES);
#pragma unroll
		for (int bb = 0; bb < BPS; bb++) {
			const int b = st * BPS + bb;
			if (b >= nb)
				break;
			float p[TB][4];
			zero(p);
#pragma unroll
			for (int s = 0; s < 8; s++) { /* the block's steps in order */
				const int k = bb * 128 + 16 * s + 4 * j;
				float wv[4];
				moet_rows_decode4<DT>(wr + k * ESZ, wv);
#pragma unroll
				for (int t = 0; t < TB; t++) {
					const float4 xv = *(const float4 *)(xs + t * C::XROW + k);
					p[t][0] = fmaf(wv[0], xv.x, p[t][0]);
					p[t][1] = fmaf(wv[1], xv.y, p[t][1]);
					p[t][2] = fmaf(wv[2], xv.z, p[t][2]);
					p[t][3] = fmaf(wv[3], xv.w, p[t][3]);
				}
			}
			const float sc = sp ? __ldg(sp + b) : 1.0f;
#pragma unroll
			for (int t = 0; t < TB; t++)
#pragma unroll
				for (int i = 0; i < 4; i++)
					acc[t][i] = fmaf(p[t][i], sc, acc[t][i]);
		}
	}
	moet_cp_async_wait<0>(); /* nothing left in flight at exit (the empty groups) */
#pragma unroll
	for (int t = 0; t < TB; t++) {
		float v = moet_rows_quad_tree(acc[t]);
		if (j == 0 && q < n_rows && t < n_t) {
			const long long o = (long long)(tok0 + t) * y_stride + row0 + q;
			if (EPI == MOET_KS_SILU_MUL)
				v = moet_silu_c(g[o]) * v; /* the rows kernel's h, one multiply */
			else if (EPI == MOET_KS_CANON)
				v = moet_canon_nan(v);
			y[o] = v;
		}
	}
}

template <int DT, int TB, int EPI, int NS, int BPS, int WPB>
static int tall_launch5(const moet_gpu_ks_args *a, cudaStream_t st)
{
	constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : DT == MOET_ROWS_BF16 ? 2 : 4;
	constexpr int SMEM = WPB * tall_cfg<ESZ, TB, NS, BPS>::SMEM;
	static_assert(SMEM <= 99 * 1024, "sm_120: 99 KB of shared memory per block");
	auto *fn = linear_tall_kernel<DT, TB, EPI, NS, BPS>;
	if (SMEM > 48 * 1024)
		MOET_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
						   SMEM));
	const long long groups = (a->R + TL_ROWS - 1) / TL_ROWS;
	const int tiles = (int)((a->n_tok + TB - 1) / TB);
	const long long blocks = (groups * tiles + WPB - 1) / WPB;
	if (blocks > 0x7FFFFFFFll)
		return moet_err(MOET_ESHAPE, "linear_tall: %lld rows x %d token tiles",
				(long long)a->R, tiles);
	fn<<<(unsigned)blocks, 32 * WPB, SMEM, st>>>((const unsigned char *)a->w, a->s, (int)a->R,
						     (int)a->K, a->x, a->x_stride, (int)a->n_tok,
						     tiles, a->y, a->y_stride, a->g);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

/* The configuration of a token tile, as measured on the H200 (Nsight Compute, F8, record
 * 2026-12-02-session26-h200-03a2566.txt): at one token 4 stages of 2 blocks per warp took o_proj
 * (7168 x 8192) in 28.4 us, against 30.3 with 8 stages of 1 block, 30.4 with 4 of 4 and 46.7
 * with 3 of 8 (the row machinery: 39.6); at 4 tokens 4 stages of 1 block in blocks of 4 warps,
 * whose smaller stages let twice the warps stay resident on an SM, took q_b (12288 x 1536) in
 * 20.7 us against 29.9 with 8 stages (the row machinery: 20.7). Two tokens take the one-token
 * form (not measured apart; whole decode steps at batch 2 were 5.1% shorter with it). */
template <int DT, int TB, int EPI>
static int tall_launch3(const moet_gpu_ks_args *a, cudaStream_t st)
{
	if constexpr (TB == 4) /* F32: 2 warps a block (4 pass sm_120's 99 KB) */
		return tall_launch5<DT, TB, EPI, 4, 1, DT == MOET_ROWS_F32 ? 2 : 4>(a, st);
	else
		return tall_launch5<DT, TB, EPI, 4, 2, 1>(a, st);
}

template <int DT, int TB> static int tall_launch(const moet_gpu_ks_args *a, cudaStream_t st)
{
	switch (a->epi) {
	case MOET_KS_SILU_MUL: return tall_launch3<DT, TB, MOET_KS_SILU_MUL>(a, st);
	case MOET_KS_CANON: return tall_launch3<DT, TB, MOET_KS_CANON>(a, st);
	default: return tall_launch3<DT, TB, MOET_KS_PLAIN>(a, st);
	}
}

/* The token tile: the fewest of 1, 2, 4 holding the call's tokens, else tiles of 4. */
template <int DT> static int tall_by_tokens(const moet_gpu_ks_args *a, cudaStream_t st)
{
	switch (a->n_tok) {
	case 1: return tall_launch<DT, 1>(a, st);
	case 2: return tall_launch<DT, 2>(a, st);
	default: return tall_launch<DT, 4>(a, st);
	}
}

static unsigned long long tall_calls; /* moet_gpu_linear_tall_calls (atomic) */

extern "C" uint64_t moet_gpu_linear_tall_calls(void)
{
	return __atomic_load_n(&tall_calls, __ATOMIC_RELAXED);
}

int moet_gpu_linear_tall(const moet_gpu_ks_args *a, void *stream)
{
	const cudaStream_t st = moet_stream(stream);
	__atomic_fetch_add(&tall_calls, 1, __ATOMIC_RELAXED);
	switch (a->dt) {
	case MOET_ROWS_F8: return tall_by_tokens<MOET_ROWS_F8>(a, st);
	case MOET_ROWS_BF16: return tall_by_tokens<MOET_ROWS_BF16>(a, st);
	default: return tall_by_tokens<MOET_ROWS_F32>(a, st);
	}
}
