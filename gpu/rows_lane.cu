/*
 * rows_lane.cu: the contract dot product of the row machinery (rows.cu) for F8_E4M3 groups of
 * 3-4 tokens, with ONE contract lane per thread instead of four. Same job, same groups, same
 * bits as rows_kernel; only the mapping onto threads differs.
 *
 * NOTE (why). rows_kernel's quad gives each thread the lanes 4j..4j+3, because one 32-bit word
 * of a row holds 4 consecutive columns. A thread then keeps p and acc for 4 lanes, 8 registers
 * per (row, token) dot, so its register tile stays small (2 x 4 dots at 4 tokens) and every
 * activation value it loads from shared memory feeds only 2 fmas. Shared memory delivers one
 * 128-byte wavefront per cycle per SM against 4 warp fmas: at 4 tokens a warp step of
 * rows_kernel costs 18 wavefronts (4 LDS.128 of activations, 2 LDS.32 of weights) for 32 warp
 * fmas (8 cycles), a ceiling of ~14 weights per cycle per SM, ~0.8 of the H200's copy
 * bandwidth before staging; issue 4 asks for 0.70 and it measured 0.51. With one lane per
 * thread a dot costs 2 registers, so a thread holds 8 rows x 4 tokens (or 4 x 8), and one
 * 32-bit word holds 4 steps of its lane if the row's bytes are transposed to lane-major order:
 * per 4 steps 4 LDS.128 of activations and 8 LDS.32 of weights (24 wavefronts) for 128 warp
 * fmas (32 cycles).
 *
 * The mapping. A tile is VR = 16 R virtual rows (NMAT 2: RB = VR / 2 gate rows, then the same
 * outputs' up rows) x TT tokens; 8 warps, thread li of warp w: lane l = li % 16, row group
 * rg = li / 16, virtual rows v_i = 16 i + 8 rg + w (i < R; at NMAT 2 i < R/2 gate, i + R/2 the
 * same output's up row), every token of the tile. Per 128-column chunk:
 *   fetch      raw weight rows by cp.async (16-byte pieces, piece t = step t = columns 16t..
 *              16t+15, stored at piece t ^ (v % 8) of the row: the transposition's reads are
 *              free of bank conflicts) and the activations by 4-byte cp.async straight into
 *              lane-major order, x[tok][h][l][t % 4] for t = 4h + t % 4;
 *   transpose  (one barrier later) each thread one (row, half h) unit: 4 raw pieces (steps
 *              4h..4h+3) -> 16 words, word l = lane l's bytes of steps 4h..4h+3 (PRMT), to
 *              the decoded buffer at piece (4h + l / 4) ^ s(v), s(v) = (v % 8) ^ 4 [v / 8 odd]
 *              (the two row groups of a warp then read disjoint banks);
 *   compute    for h = 0, 1: 4 LDS.128 (the tokens' 4 steps), per row 1 LDS.32 (its lane's 4
 *              codes), cvt.rn.f16x2.e4m3x2 + cvt.f32.f16 (exact, as in rows.cu), 16 fmas;
 *              then acc = fma(p, S, acc) per (row, token).
 * The fetch of chunk c + NS - 1 and the transposition of chunk c + 1 run in the iteration that
 * computes chunk c (two decoded buffers, one barrier per chunk).
 *
 * Why it is exact: per (row, token) and lane the operations are the reference's, in its order:
 * p = +0 at each block; for t = 0..7, p = fma(dec(W[r][128b + 16t + l]), x[..], p) (t from 0 to
 * 3 in half 0, 4 to 7 in half 1; K % 128 == 0, so every column exists); acc = fma(p, S, acc)
 * every block; then the halving tree by shuffles inside the 16 lanes of a row group:
 * q[l] = acc[l] + acc[l+8] (shfl_down 8), s[l] = q[l] + q[l+4] (4), u[l] = s[l] + s[l+2] (2),
 * D = u[0] + u[1] (1), in lane 0. Rows past the matrix read zeros and write nothing; tokens
 * past the tile or out of range read zeros and write nothing. The scale of a tile's rows is
 * one per chunk and matrix: a tile's rows lie in one 128-row scale block (RB divides 128).
 *
 * Used by rows.cu for F8 groups under the default variant, with 16-byte staging (vec) and
 * K % 128 == 0, where moet_rows_lane_pick returns an instance, when MOET_GPU_ROWS_LANE=1 (off by
 * default: measured slower than rows_kernel on the H200, 0.46 against 0.50 of the copy
 * bandwidth at 4 tokens; Nsight Compute: issue-bound at 63% of slots with 6% more
 * instructions, the short-scoreboard stalls of rows_kernel gone); MOET_GPU_ROWS_KERNEL=ref
 * never takes it.
 */
#include "rows_int.h"
#include "rows_body.cuh"

#include "gpu_int.h"
#include "moet_dtype.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LTHREADS 256
/* Blocks per SM for __launch_bounds__: two on sm_90 (128 registers, 86 KB of shared memory
 * each); one on sm_120, whose 100 KB of shared memory per SM holds one anyway. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define LMINB 1
#else
#define LMINB 2
#endif

/* R rows x TT tokens per thread. */
template <int NMAT, int TT, int R> struct lane_cfg {
	static constexpr int VR = 16 * R;                 /* virtual rows per tile */
	static constexpr int RB = VR / NMAT;              /* output rows per tile */
	static constexpr int TB = TT;                     /* tokens per tile */
	static constexpr int RAWW = VR * 128;             /* raw weight bytes per stage */
	static constexpr int STAGE = RAWW + TB * 128 * 4; /* + activations, lane-major */
	static constexpr int DEC = VR * 128;              /* one transposed chunk */
	static constexpr int NS_FIT = (MOET_ROWS_SMEM_BUDGET - 2 * DEC) / STAGE;
	static constexpr int NS = NS_FIT < 4 ? NS_FIT : 4;
	static constexpr int SMEM = 2 * DEC + NS * STAGE;
	/* transposition units: (row, half, quad pair or all four quads) */
	static constexpr int QW = VR * 2 >= LTHREADS ? 4 : 2; /* quads per unit */
	static constexpr int NU = VR * 2 * (4 / QW);
	static constexpr int NWP = VR * 8 / LTHREADS;     /* raw pieces per thread */
	static constexpr int NXE = TB * 128 / LTHREADS;   /* activation floats per thread */
	static_assert(R * TT <= 32 && (R == 4 || R == 8), "at most 32 dots per thread");
	static_assert(NS >= 3, "two chunks in flight");
	static_assert(NU == LTHREADS, "one transposition unit per thread");
	static_assert(NWP * LTHREADS == VR * 8 && NXE * LTHREADS == TB * 128, "whole pieces");
	static_assert(128 % RB == 0, "a tile's rows share one scale block");
	static_assert(SMEM + TB * 4 <= MOET_ROWS_SM120_SMEM_MAX, "sm_120: 99 KB per block");
};

static __device__ __forceinline__ void cp_async4z(void *dst, const void *src, bool ok)
{
	unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	int n = ok ? 4 : 0;
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n));
}

static __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
	uint32_t r;
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
	return r;
}

/* The decoded buffer's piece of (row v, piece q = 4h + lane / 4). */
static __device__ __forceinline__ int lane_piece(int v, int q)
{
	return q ^ (v & 7) ^ (((v >> 3) & 1) << 2);
}

template <int NMAT, int TT, int R>
static __global__ void __launch_bounds__(LTHREADS, LMINB) rows_lane_kernel(const __grid_constant__ moet_rows_args a)
{
	using C = lane_cfg<NMAT, TT, R>;
	constexpr int NS = C::NS;
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ int xrow_s[C::TB];

	int e, row0, tok0;
	moet_rows_tile(a, blockIdx.x, C::RB, C::TB, &e, &row0, &tok0);
	const moet_rows_param_group g{ a, e };
	const int tid = threadIdx.x, li = tid & 31, w = tid >> 5;
	const int l = li & 15, rg = li >> 4;
	const int n_rows = min(C::RB, a.rows - row0), n_toks = min(C::TB, a.n[e] - tok0);
	const int K = a.K, n_chunk = K / 128;

	if (a.pdl & MOET_ROWS_PDL_WAIT)
		moet_grid_dep_wait();
	moet_rows_stage_xrows<C::TB>(a, g, tok0, n_toks, tid, xrow_s);

	unsigned char *const dec = smem, *const raw = smem + 2 * C::DEC;

	/* Each thread's fetch pieces, fixed for the tile (as in rows_wide_body.cuh): piece i is
	 * row v = tid / 8 + 32 i, step t = tid % 8, so its shared place is wdst0 + 4096 i and its
	 * source a 32-bit offset into its matrix (a matrix of F8 codes is below 4 GB: rows * K <
	 * 2^32, checked by rows.cu). NOTE: 32-bit offsets and one place per thread
	 * keep the gate/up instance within 128 registers (64-bit pointers per piece spilled). */
	static_assert(C::RB % 32 == 0, "a piece's matrix is fixed by i");
	const int tv0 = tid >> 3, tt = tid & 7;
	const int wdst0 = tv0 * 128 + ((tt ^ (tv0 & 7)) << 4);
	/* piece i's row in its matrix: r0 + 32 i (mod RB at NMAT 2), offset woff0 + 32 i K */
	const int r0 = tv0;
	const uint32_t woff0 = (uint32_t)(row0 + r0) * (uint32_t)K + tt * 16, wstep = 32u * K;
	unsigned wok = 0;
#pragma unroll
	for (int i = 0; i < C::NWP; i++) {
		const int r = NMAT == 2 ? (r0 + 32 * i) % C::RB : r0 + 32 * i;
		if (r < n_rows)
			wok |= 1u << i;
	}
	const float *xsrc[C::NXE];
	unsigned xok = 0;
	const int xk = tid & 127;
	const int xdst0 = ((tid >> 7) * 128 + (xk >> 6) * 64 + (xk & 15) * 4 + ((xk >> 4) & 3)) * 4;
#pragma unroll
	for (int i = 0; i < C::NXE; i++) {
		const int xr = xrow_s[(tid >> 7) + 2 * i];
		if (xr >= 0)
			xok |= 1u << i;
		xsrc[i] = a.x + (xr >= 0 ? (long long)xr * a.x_stride : 0) + xk;
	}
	auto fetch = [&](int c, int st) {
		unsigned char *ws = raw + st * C::STAGE;
		const int kc0 = c * 128;
#pragma unroll
		for (int i = 0; i < C::NWP; i++) {
			const int m = NMAT == 2 ? (32 * i) / C::RB : 0;
			const int ri = NMAT == 2 ? (32 * i) % C::RB / 32 : i; /* 32-row steps */
			const bool ok = (wok >> i) & 1;
			moet_cp_async16z(ws + wdst0 + 4096 * i,
					 (const unsigned char *)g.w(m) +
						 (ok ? woff0 + ri * wstep + kc0 : 0),
					 ok);
		}
#pragma unroll
		for (int i = 0; i < C::NXE; i++)
			cp_async4z(ws + C::RAWW + xdst0 + 1024 * i, xsrc[i] + kc0, (xok >> i) & 1);
		moet_cp_async_commit();
	};

	/* Transposition unit of this thread: row tv, half th, quads tq0 .. tq0 + QW - 1. */
	const int tv = tid % C::VR, th = (tid / C::VR) & 1, tq0 = C::QW == 4 ? 0 : 2 * (tid / (2 * C::VR));
	auto transpose = [&](int st, int b) {
		const unsigned char *ws = raw + st * C::STAGE + tv * 128;
		uint32_t wd[4][C::QW]; /* [step 4th + i][quad] */
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const unsigned char *pc = ws + (((4 * th + i) ^ (tv & 7)) << 4) + tq0 * 4;
			if constexpr (C::QW == 4) {
				const uint4 u = *(const uint4 *)pc;
				wd[i][0] = u.x;
				wd[i][1] = u.y;
				wd[i][2] = u.z;
				wd[i][3] = u.w;
			} else {
				const uint2 u = *(const uint2 *)pc;
				wd[i][0] = u.x;
				wd[i][1] = u.y;
			}
		}
		uint32_t *dw = (uint32_t *)(dec + b * C::DEC) + tv * 32;
#pragma unroll
		for (int q = 0; q < C::QW; q++) {
			/* 4 x 4 bytes: out word j = byte j of steps 4th .. 4th + 3 (lane 4(tq0+q) + j) */
			const uint32_t a01 = prmt(wd[0][q], wd[1][q], 0x5140);
			const uint32_t b01 = prmt(wd[0][q], wd[1][q], 0x7362);
			const uint32_t a23 = prmt(wd[2][q], wd[3][q], 0x5140);
			const uint32_t b23 = prmt(wd[2][q], wd[3][q], 0x7362);
			uint4 o;
			o.x = prmt(a01, a23, 0x5410);
			o.y = prmt(a01, a23, 0x7632);
			o.z = prmt(b01, b23, 0x5410);
			o.w = prmt(b01, b23, 0x7632);
			*(uint4 *)(dw + lane_piece(tv, 4 * th + tq0 + q) * 4) = o;
		}
	};

	float acc[R][TT];
#pragma unroll
	for (int i = 0; i < R; i++)
#pragma unroll
		for (int k = 0; k < TT; k++)
			acc[i][k] = 0.0f;
	/* My rows v_i = 16 i + vb; their words of half h sit at the same place in every row
	 * (lane_piece depends on v % 16 only), so one offset per half. */
	const int vb = 8 * rg + w;
	const int pw0 = lane_piece(vb, l >> 2) * 4 + (l & 3);
	const int pw1 = lane_piece(vb, 4 + (l >> 2)) * 4 + (l & 3);
	/* Scale offsets of the tile's block row (-1: no scales, 1.0f). */
	int so[NMAT];
#pragma unroll
	for (int m = 0; m < NMAT; m++)
		so[m] = g.s(m) ? row0 / 128 * n_chunk : -1;

#pragma unroll
	for (int st = 0; st < NS - 1; st++) {
		if (st < n_chunk)
			fetch(st, st);
		else
			moet_cp_async_commit();
	}
	moet_cp_async_wait<NS - 2>();
	__syncthreads();
	transpose(0, 0);

	for (int c = 0; c < n_chunk; c++) {
		moet_cp_async_wait<NS - 3>();
		__syncthreads();
		const int nc = c + NS - 1;
		if (nc < n_chunk)
			fetch(nc, nc % NS);
		else
			moet_cp_async_commit();
		if ((a.pdl & MOET_ROWS_PDL_TRIGGER) && nc == n_chunk - 1)
			moet_grid_dep_trigger();
		if (c + 1 < n_chunk)
			transpose((c + 1) % NS, (c + 1) & 1);

		float sc[NMAT];
#pragma unroll
		for (int m = 0; m < NMAT; m++)
			sc[m] = so[m] >= 0 ? __ldg(g.s(m) + so[m] + c) : 1.0f;
		const uint32_t *dw = (const uint32_t *)(dec + (c & 1) * C::DEC) + vb * 32;
		const float *xs = (const float *)(raw + (c % NS) * C::STAGE + C::RAWW) + l * 4;
		float p[R][TT];
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float4 xv[TT];
#pragma unroll
			for (int k = 0; k < TT; k++)
				xv[k] = *(const float4 *)(xs + k * 128 + h * 64);
#pragma unroll
			for (int i = 0; i < R; i++) {
				float wv[4];
				moet_dec4_f8(dw[i * 16 * 32 + (h ? pw1 : pw0)], wv);
#pragma unroll
				for (int k = 0; k < TT; k++) {
					const float xq[4] = { xv[k].x, xv[k].y, xv[k].z, xv[k].w };
#pragma unroll
					for (int q = 0; q < 4; q++)
						p[i][k] = fmaf(wv[q], xq[q],
							       h == 0 && q == 0 ? 0.0f : p[i][k]);
				}
			}
		}
#pragma unroll
		for (int i = 0; i < R; i++)
#pragma unroll
			for (int k = 0; k < TT; k++)
				acc[i][k] = fmaf(p[i][k], sc[NMAT == 2 && i >= R / 2 ? 1 : 0], acc[i][k]);
	}
	moet_cp_async_wait<0>();

	/* The halving tree inside each row group's 16 lanes; lane 0 writes. */
#pragma unroll
	for (int i = 0; i < R; i++)
#pragma unroll
		for (int k = 0; k < TT; k++) {
			float s = acc[i][k];
			s = s + __shfl_down_sync(0xFFFFFFFFu, s, 8, 16);
			s = s + __shfl_down_sync(0xFFFFFFFFu, s, 4, 16);
			s = s + __shfl_down_sync(0xFFFFFFFFu, s, 2, 16);
			acc[i][k] = s + __shfl_down_sync(0xFFFFFFFFu, s, 1, 16);
		}
	if (l != 0)
		return;
	constexpr int RO = NMAT == 2 ? R / 2 : R; /* output rows per thread */
#pragma unroll
	for (int i = 0; i < RO; i++) {
		const int r = 16 * i + 8 * rg + w;
		if (r >= n_rows)
			continue;
#pragma unroll
		for (int k = 0; k < TT; k++) {
			if (k >= n_toks)
				continue;
			const float d = acc[i][k];
			const float v = NMAT == 2 ? moet_silu_c(d) * acc[i + R / 2][k]
						  : a.canon ? moet_canon_nan(d) : d;
			a.out[((long long)g.pair0() + tok0 + k) * a.out_stride + row0 + r] = v;
		}
	}
}

template <int NMAT, int TT, int R> static moet_rows_kernel lent(void)
{
	using C = lane_cfg<NMAT, TT, R>;
	return moet_rows_kernel{ rows_lane_kernel<NMAT, TT, R>, C::SMEM, C::RB, C::TB, LTHREADS };
}

/* Rows per thread of the 4-token instances, per pass (MOET_ROWS_LANE_R1, _R2 at compile
 * time: 8 or 4). */
#ifndef MOET_ROWS_LANE_R1
#define MOET_ROWS_LANE_R1 8
#endif
#ifndef MOET_ROWS_LANE_R2
#define MOET_ROWS_LANE_R2 8
#endif

moet_rows_kernel moet_rows_lane_pick(int dt, int nmat, int cl)
{
	if (dt != MOET_ROWS_F8 || cl != 2)
		return moet_rows_kernel{ NULL, 0, 1, 1, 0 };
	if (nmat == 2)
		return lent<2, 4, MOET_ROWS_LANE_R2>();
	if (nmat == 1)
		return lent<1, 4, MOET_ROWS_LANE_R1>();
	return moet_rows_kernel{ NULL, 0, 1, 1, 0 };
}

int moet_rows_lane_on(int *out)
{
	const char *v = getenv("MOET_GPU_ROWS_LANE");
	if (!v || !*v || !strcmp(v, "0"))
		*out = 0;
	else if (!strcmp(v, "1"))
		*out = 1;
	else
		return moet_err(MOET_EINVAL, "MOET_GPU_ROWS_LANE=%.40s (want 0 or 1)", v);
	return 0;
}
