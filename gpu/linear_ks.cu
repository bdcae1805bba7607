/*
 * linear_ks.cu: the dense linear layer for a few tokens with its 128-column blocks spread over
 * the warps of a block (gpu/linear.cu chooses by MOET_GPU_LINEAR), the same bits as the row
 * machinery (rows.cu) and moet_dot_ref.
 *
 * NOTE (why). The row machinery walks a row tile's K in order, one 128-column chunk after the
 * other, and gives a skinny matrix few tiles: at 16 tokens the 576 x 7168 and 1536 x 7168
 * projections of Kimi-K2 / DeepSeek-V3 make 18 and 48 blocks on 132 SMs, each walking 56
 * chunks; the H200 timeline of a batch-16 decode step (docs/benchmarks/
 * 2026-12-01-e2e-poll-h200-431404c.txt) has them at ~51 us each, where their bytes take
 * 1-3 us at the copy bandwidth, and the dense linears of a step at ~3 ms of ~16.
 *
 * NOTE (why it is exact). The contract's dot (docs/numerics.md) keeps, per output (row r,
 * token t), sixteen lane partials p_b[l] per 128-column block b, each an fma chain over the
 * block's eight steps in order, and then acc[l] = fma(p_b[l], S[r/128][b], acc[l]) over the
 * blocks in increasing order. The p_b of different blocks do not depend on each other, so
 * here the eight warps of a block compute the p_b of eight consecutive blocks at once (warp w
 * block 8c + w of round c), each with the contract's step order, leave them in shared memory,
 * and then the block's threads fold them into acc in block order (w = 0, 1, ..., 7): every
 * fma of the contract with the same operands in the same order. The halving tree at the end
 * is the contract's (lanes l, l+8, then l+4, l+2, l+1: shuffles within 16 threads).
 *
 * Mapping: a block holds 8 rows (row0 .. row0 + 7, the same 128-row scale block) and a tile of
 * TB tokens (TB 1, 2, 4 or 8). In the compute, warp w's thread (q = lane / 4, j = lane % 4)
 * takes row q, lanes 4j .. 4j + 3 and the TB tokens: p[TB][4]. In the fold, thread i takes
 * lane i % 16 of row q and TPT = max(1, TB / 2) tokens: acc[TPT], kept over the rounds.
 * Shared memory, two stages (round c + 1 staged by cp.async while round c computes): weights
 * ws[q][w][128 bytes] (a row's eight blocks 1040 bytes apart, so that a warp's 8 rows x 4
 * threads read 32 banks), activations xs[w][t][128 + 4 floats]; the round's p go into its
 * activation stage once every warp is done with it.
 * Eligible (gpu/linear.cu): F8_E4M3 (block scales or none), BF16 or F32; at most
 * MOET_GPU_KS_MAX_TOK tokens; K % 128 == 0; 16-byte aligned rows of W and x (the row
 * machinery's vec conditions); at most MOET_GPU_KS_MAX_BYTES of weight reads over the token
 * tiles (rows_int.h).
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "rows_int.h"
#include "rows_body.cuh"

#include "moet_expc.h"
#include "moet_hd.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define KS_THREADS 256
#define KS_ROWS 8
#define KS_DEV_MAX 64 /* devices whose attribute setting is remembered (others: every call) */

template <int ESZ> struct ks_cfg {
	static constexpr int WROW = 8 * 128 * ESZ + 16; /* bytes per staged weight row */
	static constexpr int WBYTES = KS_ROWS * WROW;
	static constexpr int XSTR = 128 + 4;            /* floats per staged activation row */
};

/* What a block writes for (row r, token t) with the dot d: d (MOET_KS_PLAIN),
 * silu_c(g[t][r]) * d with g laid out as y, possibly y itself (MOET_KS_SILU_MUL: an expert's
 * h from its gate outputs and this, the up dot), or d with a NaN made canonical
 * (MOET_KS_CANON: an expert's output). */
template <int DT, int TB, int EPI>
__global__ void __launch_bounds__(KS_THREADS)
	linear_ks_kernel(const unsigned char *__restrict__ W, const float *__restrict__ S, int R,
			 int K, const float *__restrict__ x, long long x_stride, int n_tok,
			 float *y, long long y_stride, const float *g)
{
	constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : DT == MOET_ROWS_BF16 ? 2 : 4;
	using C = ks_cfg<ESZ>;
	constexpr int XSTR = C::XSTR;
	constexpr int XBYTES = 8 * TB * XSTR * 4;
	constexpr int STAGE = C::WBYTES + XBYTES;
	constexpr int TPT = TB >= 2 ? TB / 2 : 1;   /* tokens per folding thread */
	constexpr int GPR = TB / TPT;               /* folding groups (of 16 threads) per row */
	constexpr int FOLDERS = KS_ROWS * GPR * 16; /* threads that fold */
	static_assert(8 * KS_ROWS * TB * 16 * 4 <= XBYTES, "the p of a round fit its x stage");
	static_assert(FOLDERS <= KS_THREADS && FOLDERS % 32 == 0, "whole warps fold");
	extern __shared__ __align__(16) unsigned char smem[];

	const int tid = threadIdx.x, w = tid >> 5, q = (tid >> 2) & 7, j = tid & 3;
	const int row0 = blockIdx.x * KS_ROWS, tok0 = blockIdx.y * TB;
	const int nb = K / 128, rounds = (nb + 7) / 8;
	const int n_rows = min(KS_ROWS, R - row0), n_t = min(TB, n_tok - tok0);
	const int nbs = (K + 127) / 128; /* scale blocks per row of S */

	/* Round c's weights (8 rows x 8 blocks) and activations (8 blocks x TB tokens) into
	 * stage c % 2: rows past R and tokens past n_tok as +0 (read nothing). */
	auto stage = [&](int c) {
		unsigned char *ws = smem + (c & 1) * STAGE;
		float *xs = (float *)(ws + C::WBYTES);
		constexpr int WP = 8 * 128 * ESZ / 16; /* 16-byte pieces per row and round */
		for (int i = tid; i < KS_ROWS * WP; i += KS_THREADS) {
			const int r = i / WP, pc = i % WP;
			const long long col = (long long)c * 8 * 128 * ESZ + pc * 16; /* bytes */
			const bool ok = r < n_rows && col < (long long)K * ESZ;
			moet_cp_async16z(ws + r * C::WROW + pc * 16,
					 ok ? W + ((long long)(row0 + r) * K) * ESZ + col : W, ok);
		}
		for (int i = tid; i < 8 * TB * 32; i += KS_THREADS) {
			const int b = i / (TB * 32), t = (i / 32) % TB, pc = i % 32;
			const long long col = ((long long)c * 8 + b) * 128 + pc * 4;
			const bool ok = t < n_t && col < K;
			moet_cp_async16z(xs + (b * TB + t) * XSTR + pc * 4,
					 ok ? x + (long long)(tok0 + t) * x_stride + col : x, ok);
		}
		moet_cp_async_commit();
	};

	/* the folding thread's row, lane and tokens */
	const int f_l = tid & 15, f_g = tid >> 4, f_q = f_g / GPR, f_t0 = (f_g % GPR) * TPT;
	const bool folder = tid < FOLDERS;
	float acc[TPT];
#pragma unroll
	for (int i = 0; i < TPT; i++)
		acc[i] = 0.0f;

	stage(0);
	for (int c = 0; c < rounds; c++) {
		if (c + 1 < rounds) {
			moet_cp_async_wait<0>();
			__syncthreads(); /* round c landed; stage (c + 1) % 2 free (round c - 1 folded) */
			stage(c + 1);
		} else {
			moet_cp_async_wait<0>();
			__syncthreads();
		}
		const unsigned char *ws = smem + (c & 1) * STAGE;
		float *xs = (float *)(ws + C::WBYTES);
		const int b = c * 8 + w; /* this warp's block */
		float p[TB][4];
#pragma unroll
		for (int t = 0; t < TB; t++)
#pragma unroll
			for (int l = 0; l < 4; l++)
				p[t][l] = 0.0f;
		if (b < nb) {
#pragma unroll
			for (int s = 0; s < 8; s++) { /* the block's steps in order */
				const int k = 16 * s + 4 * j;
				float wv[4];
				moet_rows_decode4<DT>(ws + q * C::WROW + (w * 128 + k) * ESZ, wv);
#pragma unroll
				for (int t = 0; t < TB; t++) {
					const float4 xv = *(const float4 *)(xs + (w * TB + t) * XSTR + k);
					p[t][0] = fmaf(wv[0], xv.x, p[t][0]);
					p[t][1] = fmaf(wv[1], xv.y, p[t][1]);
					p[t][2] = fmaf(wv[2], xv.z, p[t][2]);
					p[t][3] = fmaf(wv[3], xv.w, p[t][3]);
				}
			}
		}
		__syncthreads(); /* every warp done with this stage's activations */
		float *pe = xs;  /* pe[w][q][t][16 lanes] */
#pragma unroll
		for (int t = 0; t < TB; t++)
			*(float4 *)(pe + ((w * KS_ROWS + q) * TB + t) * 16 + 4 * j) =
				make_float4(p[t][0], p[t][1], p[t][2], p[t][3]);
		__syncthreads();
		if (folder) {
#pragma unroll
			for (int v = 0; v < 8; v++) { /* blocks in increasing order */
				const int bb = c * 8 + v;
				if (bb >= nb)
					break;
				const float sc = S ? S[(long long)(row0 / 128) * nbs + bb] : 1.0f;
#pragma unroll
				for (int i = 0; i < TPT; i++)
					acc[i] = fmaf(pe[((v * KS_ROWS + f_q) * TB + f_t0 + i) * 16 + f_l],
						      sc, acc[i]);
			}
		}
		/* the next round's first sync keeps this stage until every fold read it */
	}
	if (folder) {
		/* the contract's tree over 16 lanes: l + 8, l + 4, l + 2, l + 1 */
#pragma unroll
		for (int i = 0; i < TPT; i++) {
			float v = acc[i];
			v += __shfl_down_sync(0xFFFFFFFFu, v, 8, 16);
			v += __shfl_down_sync(0xFFFFFFFFu, v, 4, 16);
			v += __shfl_down_sync(0xFFFFFFFFu, v, 2, 16);
			v += __shfl_down_sync(0xFFFFFFFFu, v, 1, 16);
			const int t = f_t0 + i;
			if (f_l == 0 && f_q < n_rows && t < n_t) {
				const long long o = (long long)(tok0 + t) * y_stride + row0 + f_q;
				if (EPI == MOET_KS_SILU_MUL)
					v = moet_silu_c(g[o]) * v; /* the rows kernel's h, one multiply */
				else if (EPI == MOET_KS_CANON)
					v = moet_canon_nan(v);
				y[o] = v;
			}
		}
	}
}

template <int DT, int TB, int EPI> static int ks_launch3(const moet_gpu_ks_args *a, cudaStream_t st)
{
	constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : DT == MOET_ROWS_BF16 ? 2 : 4;
	constexpr int SMEM = 2 * (ks_cfg<ESZ>::WBYTES + 8 * TB * ks_cfg<ESZ>::XSTR * 4);
	static_assert(SMEM <= 99 * 1024, "sm_120: 99 KB of shared memory per block");
	auto *fn = linear_ks_kernel<DT, TB, EPI>;
	/* the shared-memory attribute once per device and instance (a decode step makes ~60
	 * calls; racing first calls set the same value) */
	static int attr_set[KS_DEV_MAX];
	int dev = -1;
	MOET_CUDA_TRY(cudaGetDevice(&dev));
	const bool cached = dev >= 0 && dev < KS_DEV_MAX;
	if (!cached || !__atomic_load_n(&attr_set[dev], __ATOMIC_RELAXED)) {
		MOET_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
						   SMEM));
		if (cached)
			__atomic_store_n(&attr_set[dev], 1, __ATOMIC_RELAXED);
	}
	const dim3 grid((unsigned)((a->R + KS_ROWS - 1) / KS_ROWS),
			(unsigned)((a->n_tok + TB - 1) / TB));
	fn<<<grid, KS_THREADS, SMEM, st>>>((const unsigned char *)a->w, a->s, (int)a->R, (int)a->K,
					   a->x, a->x_stride, (int)a->n_tok, a->y, a->y_stride,
					   a->g);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

template <int DT, int TB> static int ks_launch(const moet_gpu_ks_args *a, cudaStream_t st)
{
	switch (a->epi) {
	case MOET_KS_SILU_MUL: return ks_launch3<DT, TB, MOET_KS_SILU_MUL>(a, st);
	case MOET_KS_CANON: return ks_launch3<DT, TB, MOET_KS_CANON>(a, st);
	default: return ks_launch3<DT, TB, MOET_KS_PLAIN>(a, st);
	}
}

/* The instance of the call's token tile (moet_gpu_ks_tb). */
template <int DT> static int ks_by_tokens(const moet_gpu_ks_args *a, cudaStream_t st)
{
	switch (moet_gpu_ks_tb(DT, a->n_tok)) {
	case 1: return ks_launch<DT, 1>(a, st);
	case 2: return ks_launch<DT, 2>(a, st);
	case 4: return ks_launch<DT, 4>(a, st);
	default:
		if constexpr (DT == MOET_ROWS_F8)
			return ks_launch<DT, 8>(a, st);
		return moet_err(MOET_EINVAL, "linear_ks: a tile of 8 tokens for dtype %d", DT);
	}
}

static unsigned long long ks_calls; /* moet_gpu_linear_ks_calls (atomic) */

extern "C" uint64_t moet_gpu_linear_ks_calls(void)
{
	return __atomic_load_n(&ks_calls, __ATOMIC_RELAXED);
}

int moet_gpu_linear_ks(const moet_gpu_ks_args *a, void *stream)
{
	const cudaStream_t st = moet_stream(stream);
	__atomic_fetch_add(&ks_calls, 1, __ATOMIC_RELAXED);
	switch (a->dt) {
	case MOET_ROWS_F8: return ks_by_tokens<MOET_ROWS_F8>(a, st);
	case MOET_ROWS_BF16: return ks_by_tokens<MOET_ROWS_BF16>(a, st);
	default: return ks_by_tokens<MOET_ROWS_F32>(a, st);
	}
}
