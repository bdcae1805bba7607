/*
 * rows_body.cuh: the work of one tile of rows_kernel (gpu/rows.cu), as a device function, so
 * that the kernels that find their tile from kernel parameters (rows.cu: the host-grouped
 * call) and from a group table in device memory (rows_dev.cu: the device-grouped call) run
 * the same code. The mapping onto threads, why it is exact and the memory path are written
 * down at the top of rows.cu; nothing here depends on how the tile was found.
 *
 * A tile is (group g, row0, tok0): rows row0 .. row0 + RB - 1 of the group's matrices and its
 * pairs tok0 .. tok0 + TB - 1 (clipped to the rows and the group's n pairs). The group is an
 * object G with
 *   g.w(m), g.s(m)   the device weights and block scales (NULL: 1.0f) of matrix m < NMAT
 *   g.pair0()        the group's first pair (output row)
 *   g.src(pair)      the activation row of a pair (outside [0, n_x): a row of +0)
 * and the job's fields come from an object A with the members of moet_rows_args of the same
 * names (rows, K, x, x_stride, n_x, out, out_stride, vec, canon). `pdl` are the
 * MOET_ROWS_PDL_* bits of this tile (rows_int.h).
 *
 * CUDA files of gpu/ only; include after rows_int.h.
 */
#ifndef MOET_GPU_ROWS_BODY_CUH
#define MOET_GPU_ROWS_BODY_CUH

#include "rows_int.h"

#include "moet_dtype.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <type_traits>

#define MOET_ROWS_XSTRIDE (128 + 4)      /* floats per staged activation row (16-byte pad) */
#define MOET_ROWS_SMEM_BUDGET (96 * 1024)
#define MOET_ROWS_SM120_SMEM_MAX (99 * 1024)

template <int DT, int NMAT, int TT, int WR> struct moet_rows_cfg {
	static constexpr int WT = 8 / WR;                 /* token groups (warps) */
	/* rows per thread: in the down pass 1 at one token per thread, 4 for F8 at 2 tokens
	 * with 8 row warps (class 1: 256-row tiles), else 2; 1 in gate_up. NOTE: at one token per
	 * expert, smaller down tiles give more blocks than SM slots, so no half-empty wave; at 2
	 * tokens the 256-row tiles (224 blocks for 8 Kimi-K2 experts: one wave, two stages)
	 * measured ahead of 128-row ones (448 blocks, four stages) on the H200: 0.693-0.702 of
	 * the copy bandwidth against 0.655-0.676 (docs/gpu.md). At 4 tokens they gained 1%
	 * (0.515-0.517 against 0.508-0.509) for 225 registers in rows_kernel and 184 bytes of
	 * stack in the device-grouped rows_dev_kernel4 (sm_90): not taken. F32 rows are 4x wider
	 * in shared memory, so 1 keeps two stages under the budget */
	static constexpr int RT = DT == MOET_ROWS_F32 || NMAT == 2 || TT == 1 ? 1
				  : DT == MOET_ROWS_F8 && WR == 8 && TT == 2 ? 4 : 2;
	static constexpr int RB = 8 * WR * RT;            /* rows per block tile */
	static constexpr int TB = WT * TT;                /* tokens per block tile */
	static constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : DT == MOET_ROWS_BF16 ? 2 : 4;
	static constexpr int WSTRIDE = 128 * ESZ + 16;    /* bytes per staged weight row */
	static constexpr int WBYTES = NMAT * RB * WSTRIDE;
	static constexpr int STAGE = WBYTES + TB * MOET_ROWS_XSTRIDE * 4;
	static constexpr int NSTAGE = MOET_ROWS_SMEM_BUDGET / STAGE < 4 ?
					      MOET_ROWS_SMEM_BUDGET / STAGE : 4;
	static constexpr int SMEM = NSTAGE * STAGE;
	static_assert(WR * WT == 8, "8 warps");
	static_assert(NSTAGE >= 2, "at least double buffering");
	static_assert(SMEM + TB * 4 <= MOET_ROWS_SM120_SMEM_MAX,
		      "sm_120: 99 KB of shared memory per block");
	static_assert(WBYTES % 16 == 0, "activation stage 16-byte aligned");
};

/*
 * The rows_kernel configuration (TT tokens per thread, WR row warps) of token-count class cl
 * (1, 2, 3-4, 5-8, 9-16, 17+ tokens): f(TT, WR) with both as std::integral_constant. The one
 * table of it, for rows.cu and rows_dev.cu. NOTE: TB = 8 / WR * TT covers every count of the
 * classes 0..4 in one token tile.
 */
template <class F> static inline auto moet_rows_by_class(int cl, F f)
{
	using std::integral_constant;
	switch (cl) {
	case 0: return f(integral_constant<int, 1>{}, integral_constant<int, 8>{});
	case 1: return f(integral_constant<int, 2>{}, integral_constant<int, 8>{});
	case 2: return f(integral_constant<int, 4>{}, integral_constant<int, 8>{});
	case 3: return f(integral_constant<int, 4>{}, integral_constant<int, 4>{});
	default: return f(integral_constant<int, 4>{}, integral_constant<int, 2>{}); /* 9+ */
	}
}

/* Group e of a host-grouped launch's parameters (moet_rows_args) as the group object G. */
struct moet_rows_param_group {
	const moet_rows_args &a;
	int e;
	__device__ __forceinline__ const void *w(int m) const { return a.w[e][m]; }
	__device__ __forceinline__ const float *s(int m) const { return a.s[e][m]; }
	__device__ __forceinline__ int pair0() const { return a.pair0[e]; }
	__device__ __forceinline__ long long src(long long pair) const
	{
		return a.tok ? (long long)a.tok[pair] : pair;
	}
};

/* Four weights of one step, exactly decoded: columns k..k+3 of a staged row. */
template <int DT> static __device__ __forceinline__ void moet_rows_decode4(const unsigned char *p,
									 float w[4])
{
	if (DT == MOET_ROWS_F8) {
		moet_dec4_f8(*(const uint32_t *)p, w);
	} else if (DT == MOET_ROWS_BF16) {
		uint2 u = *(const uint2 *)p;
		w[0] = __uint_as_float(u.x << 16);
		w[1] = __uint_as_float(u.x & 0xFFFF0000u);
		w[2] = __uint_as_float(u.y << 16);
		w[3] = __uint_as_float(u.y & 0xFFFF0000u);
	} else {
		float4 f = *(const float4 *)p;
		w[0] = f.x;
		w[1] = f.y;
		w[2] = f.z;
		w[3] = f.w;
	}
}

/* The contract's halving tree over the 16 lanes held by a quad (4 per thread); the result is
 * valid in thread j == 0 of the quad. All 32 threads of the warp must call it. */
static __device__ __forceinline__ float moet_rows_quad_tree(const float acc[4])
{
	float q[4], s[4];
#pragma unroll
	for (int i = 0; i < 4; i++)
		q[i] = acc[i] + __shfl_down_sync(0xFFFFFFFFu, acc[i], 2, 4); /* lanes l, l+8 */
#pragma unroll
	for (int i = 0; i < 4; i++)
		s[i] = q[i] + __shfl_down_sync(0xFFFFFFFFu, q[i], 1, 4);     /* lanes l, l+4 */
	float u0 = s[0] + s[2], u1 = s[1] + s[3];                          /* lanes l, l+2 */
	return u0 + u1;
}

/*
 * The activation row of each of a tile's pairs tok0 .. tok0 + TB - 1 into xrow_s[TB] (shared
 * memory): g.src of the pair, or -1 (staged as a row of +0) for a pair at or past n_toks or a
 * row outside [0, a.n_x); then the block syncs. Every thread of the block calls it (tid: its
 * threadIdx.x). For moet_rows_body and moet_rows_wide_body (rows_wide_body.cuh).
 */
template <int TB, class A, class G>
static __device__ __forceinline__ void moet_rows_stage_xrows(const A &a, const G &g, int tok0,
							     int n_toks, int tid, int *xrow_s)
{
	if (tid < TB) {
		int xr = -1;
		if (tid < n_toks) {
			long long r = g.src((long long)g.pair0() + tok0 + tid);
			xr = (r >= 0 && r < a.n_x) ? (int)r : -1;
		}
		xrow_s[tid] = xr;
	}
	__syncthreads();
}

/* f(i0, i1, i2, i3) for every index of an [N0][N1][N2][N3] array, in row-major order, fully
 * unrolled (so that arrays indexed in f stay in registers). */
template <int N0, int N1, int N2, int N3, class F>
static __device__ __forceinline__ void moet_rows_each4(F f)
{
#pragma unroll
	for (int i0 = 0; i0 < N0; i0++)
#pragma unroll
		for (int i1 = 0; i1 < N1; i1++)
#pragma unroll
			for (int i2 = 0; i2 < N2; i2++)
#pragma unroll
				for (int i3 = 0; i3 < N3; i3++)
					f(i0, i1, i2, i3);
}

/*
 * The vec staging of moet_rows_body (cp.async, 16-byte pieces), its per-thread state hoisted
 * out of the chunk loop, for the instance <DT, NMAT, TT, WR> (its moet_rows_cfg C).
 * NOTE (why the state is fixed). A stage holds NMAT * RB * PPR weight pieces (PPR = 128 * ESZ /
 * 16 per staged row, staged row m * RB + r) and TB * 32 activation pieces (32 per token);
 * thread tid takes pieces tid + i * THREADS of each. THREADS is a multiple of PPR and of 32,
 * and RB of RSTEP = THREADS / PPR, so a thread's weight pieces are, in each matrix m, column
 * piece q = tid % PPR of the rows r = tid / PPR + j * RSTEP (j < RB / RSTEP), and its activation
 * pieces column piece tid % 32 of the tokens tid / 32 + i * (THREADS / 32): the shared-memory
 * offsets step by constants, and the source of chunk c is the chunk-0 source + 128 c columns.
 * init keeps, per tile, the chunk-0 source of the thread's first row of each matrix (the next
 * ones are RSTEP rows apart) and the x row of each activation piece; load stages a chunk from
 * them: the same pieces into the same places as the plain loop's divisions and 64-bit address
 * arithmetic per piece and chunk (kept for the other instances), at an add and one cp.async a
 * piece (sm_90 SASS, F8 at one token: about 480 -> 340 instructions per thread and chunk for
 * gate_up, 260 -> 200 for down, the compute's 220 and 110 among them).
 */
template <int DT, int NMAT, int TT, int WR> struct moet_rows_stage {
	using C = moet_rows_cfg<DT, NMAT, TT, WR>;
	static constexpr int THREADS = MOET_ROWS_THREADS;
	static constexpr int PPR = 128 * C::ESZ / 16;                 /* pieces per staged row */
	static constexpr int RSTEP = THREADS / PPR, XSTEP = THREADS / 32;
	static constexpr int XPT = (C::TB * 32 + THREADS - 1) / THREADS; /* activation pieces */
	static constexpr bool FITS = C::RB % RSTEP == 0; /* a thread's rows RSTEP apart */
	static_assert(THREADS % PPR == 0 && THREADS % 32 == 0, "fixed column piece per thread");

	const unsigned char *w[NMAT]; /* chunk 0, row row0 + tid / PPR, column piece tid % PPR */
	int xr[XPT];                  /* activation piece i: its x row; -1: +0; -2: none */

	template <class A, class G>
	__device__ __forceinline__ void init(const A &a, const G &g, int row0, int n_toks, int tid,
					     const int *xrow_s)
	{
#pragma unroll
		for (int m = 0; m < NMAT; m++)
			w[m] = (const unsigned char *)g.w(m) +
			       (size_t)(row0 + tid / PPR) * a.K * C::ESZ + tid % PPR * 16;
#pragma unroll
		for (int i = 0; i < XPT; i++) {
			const int t = tid / 32 + i * XSTEP;
			xr[i] = t < n_toks ? xrow_s[t] : -2;
		}
	}

	/* Chunk columns kc0 .. kc0 + kcols - 1 (K columns, n_rows rows in the tile) into the stage
	 * at ws (weights) and xs (activations); commits nothing. */
	template <bool FULL = false, class A>
	__device__ __forceinline__ void load(const A &a, unsigned char *ws, float *xs, int kc0,
					     int kcols, int K, int n_rows, int tid) const
	{
		/* K * ESZ % 16 == 0 under vec: a partial chunk has whole pieces (FULL: kcols 128) */
		if (FULL || tid % PPR < kcols * C::ESZ / 16) {
			unsigned char *d = ws + tid / PPR * C::WSTRIDE + tid % PPR * 16;
			const size_t off = (size_t)kc0 * C::ESZ;
			const size_t step = (size_t)K * (RSTEP * C::ESZ); /* RSTEP rows */
#pragma unroll
			for (int m = 0; m < NMAT; m++) {
				const unsigned char *src = w[m] + off;
#pragma unroll
				for (int j = 0; j < C::RB / RSTEP; j++, src += step)
					if (tid / PPR + j * RSTEP < n_rows)
						moet_cp_async16(d + (m * C::RB + j * RSTEP) *
								    C::WSTRIDE, src);
			}
		}
		if (FULL || tid % 32 < kcols / 4) {
			float *d = xs + tid / 32 * MOET_ROWS_XSTRIDE + tid % 32 * 4;
#pragma unroll
			for (int i = 0; i < XPT; i++) {
				float *dst = d + i * XSTEP * MOET_ROWS_XSTRIDE;
				if (xr[i] >= 0)
					moet_cp_async16(dst, a.x + xr[i] * a.x_stride + kc0 +
								     tid % 32 * 4);
				else if (xr[i] == -1)
					*(float4 *)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			}
		}
	}
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define MOET_ROWS_SM120 1
#else
#define MOET_ROWS_SM120 0
#endif

/*
 * Whether moet_rows_body stages through moet_rows_stage (value) for the instance <DT, NMAT, TT,
 * WR> with the group object G, and whether it also keeps its rows' block-scale offsets
 * (scales; else it finds them per chunk as the plain loop does); the rest keep the plain loop.
 * NOTE (why these, from ptxas -v on sm_90 and sm_120, rows.cu and rows_dev.cu): the hoisted
 * state (a pointer per matrix, an int per activation piece and per block scale) is a few live
 * registers more. The 1- and 2-token instances take it without spilling; of the device-grouped
 * ones (rows_dev.cu, whose group object holds its pointers in registers) the BF16 ones and
 * sm_120's F8 gate_up at one token gained spills, so they keep the plain loop. At 4 tokens
 * (near 128 registers) the F8 instances take it and lose the plain loop's spills (sm_120
 * rows_kernel <0,1,4,4>/<0,1,4,8>/<0,2,4,8> 8 B -> none, rows_dev_kernel4 <0,1,4,*> sm_90
 * 12 B -> none, sm_120 16-24 B -> none; sm_90 SASS of <0,1,4,8>: 758 -> 575 instructions a
 * chunk per thread), except: sm_120 rows_kernel <0,1,4,2> (more spill bytes), and the
 * device-grouped gate_up at <4,8>, which spills with the scale offsets on both archs, takes
 * the staging without them on sm_90 (no spill) and nothing on sm_120 (spills either way).
 * BF16 at 4 tokens: not tried. Rechecked by ptxas -v at each change of the body.
 */
template <int DT, int NMAT, int TT, int WR, class G> struct moet_rows_hoist {
	static constexpr bool param = std::is_same<G, moet_rows_param_group>::value;
	static constexpr bool value =
		moet_rows_stage<DT, NMAT, TT, WR>::FITS &&
		(TT <= 2 ? param || (DT == MOET_ROWS_F8 &&
				     !(MOET_ROWS_SM120 && NMAT == 2 && TT == 1))
			 : DT == MOET_ROWS_F8 &&
				   !(MOET_ROWS_SM120 && (param ? NMAT == 1 && WR == 2
							       : NMAT == 2 && WR == 8)));
	static constexpr bool scales = value && !(TT == 4 && !param && NMAT == 2 && WR == 8);
};

/*
 * Whether moet_rows_body takes the steady-state path for the instance <DT, NMAT, TT, WR> with
 * the group object G. NOTE (what it is): the chunks c < n_chunk - NSTAGE (under vec) load a
 * full chunk (c + NSTAGE - 1 <= n_chunk - 2), compute a full one and are not the one that
 * triggers the next grid; for them the chunk loop tests that once (c < n_steady) instead of
 * the load's a.vec, chunk-end and partial-chunk tests, the PDL trigger test and the compute's
 * partial-chunk test: the same pieces into the same places, the same scales and the same fmaf
 * sequence. Which instances (ptxas -v, sm_90 and sm_120, rows.cu and rows_dev.cu): the F8 ones
 * of the hoisted staging with its scale offsets, except those where it cost spill bytes: the
 * device-grouped down pass at one token on sm_90 (8 B), and <NMAT 2, TT 4, WR 4> on sm_120
 * (rows_kernel 8 -> 12 B, rows_dev_kernel4 0 -> 24 B). sm_90 SASS, rows_kernel, executed
 * path of a full chunk per thread (one with an activation piece): <0,1,1,8> 223 -> 185
 * instructions, <0,2,1,8> 358 -> 340, <0,1,2,8> 421 -> 397, <0,2,2,8> 427 -> 404, <0,1,4,8>
 * 575 -> 553, <0,2,4,8> 587 -> 561.
 */
template <int DT, int NMAT, int TT, int WR, class G> struct moet_rows_steady {
	static constexpr bool param = moet_rows_hoist<DT, NMAT, TT, WR, G>::param;
	static constexpr bool value =
		moet_rows_hoist<DT, NMAT, TT, WR, G>::scales && DT == MOET_ROWS_F8 &&
		!(!MOET_ROWS_SM120 && !param && NMAT == 1 && TT == 1) &&
		!(MOET_ROWS_SM120 && NMAT == 2 && TT == 4 && WR == 4);
};

/* One tile of rows_kernel (see the top of this file and of rows.cu). Every thread of the block
 * calls it with the same tile; it leaves the shared memory in use until it returns (a caller
 * that runs a second tile syncs first). */
template <int DT, int NMAT, int TT, int WR, class A, class G>
static __device__ __forceinline__ void moet_rows_body(const A &a, const G &g, int row0, int tok0,
						      int n_e, int pdl)
{
	using C = moet_rows_cfg<DT, NMAT, TT, WR>;
	constexpr int THREADS = MOET_ROWS_THREADS, XSTRIDE = MOET_ROWS_XSTRIDE;
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ int xrow_s[C::TB];

	const int tid = threadIdx.x, j = tid & 3, qi = (tid >> 2) & 7, w = tid >> 5;
	const int wr = w % WR, wt = w / WR;
	const int n_rows = min(C::RB, a.rows - row0), n_toks = min(C::TB, n_e - tok0);
	const int K = a.K, n_chunk = (K + 127) / 128;

	if (pdl & MOET_ROWS_PDL_WAIT) {
		/* A programmatic dependent: weights may be read before the previous grid ends. */
		if (a.vec && tid < NMAT * C::RB && tid % C::RB < n_rows) {
			const int m = tid / C::RB, r = tid % C::RB;
			const unsigned bytes = (unsigned)(min(K, (C::NSTAGE - 1) * 128) * C::ESZ);
			moet_prefetch_l2((const unsigned char *)g.w(m) +
					 (size_t)(row0 + r) * K * C::ESZ, bytes);
		}
		moet_grid_dep_wait();
	}
	moet_rows_stage_xrows<C::TB>(a, g, tok0, n_toks, tid, xrow_s);

	/* The vec staging's per-thread state, fixed for the tile (moet_rows_stage's NOTE). */
	using S = moet_rows_stage<DT, NMAT, TT, WR>;
	constexpr bool HOIST = moet_rows_hoist<DT, NMAT, TT, WR, G>::value;
	constexpr bool HOIST_S = moet_rows_hoist<DT, NMAT, TT, WR, G>::scales;
	S sg;
	if (HOIST)
		sg.init(a, g, row0, n_toks, tid, xrow_s);

	/* Stage chunk c (columns 128c ..) into stage st; a cp.async group is committed per call. */
	auto load = [&](int c, int st) {
		unsigned char *ws = smem + st * C::STAGE;
		float *xs = (float *)(ws + C::WBYTES);
		const int kc0 = c * 128, kcols = min(128, K - kc0);
		if (a.vec && HOIST) {
			sg.load(a, ws, xs, kc0, kcols, K, n_rows, tid);
		} else if (a.vec) {
			constexpr int PPR = 128 * C::ESZ / 16; /* 16-byte pieces per row */
			const int pv = kcols * C::ESZ / 16;    /* K * ESZ % 16 == 0 under vec */
			for (int p = tid; p < NMAT * C::RB * PPR; p += THREADS) {
				int m = p / (C::RB * PPR), r = (p / PPR) % C::RB, q = p % PPR;
				if (r < n_rows && q < pv) {
					const unsigned char *src = (const unsigned char *)g.w(m) +
						((size_t)(row0 + r) * K + kc0) * C::ESZ + q * 16;
					moet_cp_async16(ws + (m * C::RB + r) * C::WSTRIDE + q * 16, src);
				}
			}
			const int xv = kcols / 4;
			for (int p = tid; p < C::TB * 32; p += THREADS) {
				int i = p / 32, q = p % 32;
				if (i < n_toks && q < xv) {
					float *dst = xs + i * XSTRIDE + q * 4;
					int xr = xrow_s[i];
					if (xr >= 0)
						moet_cp_async16(dst, a.x + xr * a.x_stride + kc0 + q * 4);
					else
						*(float4 *)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				}
			}
		} else {
			for (int p = tid; p < NMAT * C::RB * 128; p += THREADS) {
				int m = p / (C::RB * 128), r = (p / 128) % C::RB, k = p % 128;
				if (r < n_rows && k < kcols) {
					size_t i = (size_t)(row0 + r) * K + kc0 + k;
					unsigned char *dst = ws + (m * C::RB + r) * C::WSTRIDE;
					if (DT == MOET_ROWS_F8)
						dst[k] = ((const uint8_t *)g.w(m))[i];
					else if (DT == MOET_ROWS_BF16)
						((uint16_t *)dst)[k] = ((const uint16_t *)g.w(m))[i];
					else
						((uint32_t *)dst)[k] = ((const uint32_t *)g.w(m))[i];
				}
			}
			for (int p = tid; p < C::TB * 128; p += THREADS) {
				int i = p / 128, k = p % 128;
				if (i < n_toks && k < kcols) {
					int xr = xrow_s[i];
					xs[i * XSTRIDE + k] = xr >= 0 ? a.x[xr * a.x_stride + kc0 + k] : 0.0f;
				}
			}
		}
		moet_cp_async_commit();
	};

	float p[NMAT][C::RT][TT][4], acc[NMAT][C::RT][TT][4];
	moet_rows_each4<NMAT, C::RT, TT, 4>([&](int m, int r, int i, int q) {
		p[m][r][i][q] = acc[m][r][i][q] = 0.0f;
	});

	/* One step t of a chunk: every lane's partial takes its term (if its column is < kcols). */
	auto step = [&](const unsigned char *ws, const float *xs, int t, int kcols, bool full) {
		const int k = 16 * t + 4 * j;
		float4 xv[TT];
#pragma unroll
		for (int i = 0; i < TT; i++)
			xv[i] = *(const float4 *)(xs + (wt * TT + i) * XSTRIDE + k);
#pragma unroll
		for (int m = 0; m < NMAT; m++)
#pragma unroll
			for (int r = 0; r < C::RT; r++) {
				float wv[4];
				int rl = wr * 8 + qi + 8 * WR * r;
				moet_rows_decode4<DT>(ws + (m * C::RB + rl) * C::WSTRIDE + k * C::ESZ,
						      wv);
#pragma unroll
				for (int i = 0; i < TT; i++) {
					const float xq[4] = { xv[i].x, xv[i].y, xv[i].z, xv[i].w };
#pragma unroll
					for (int q = 0; q < 4; q++)
						if (full || k + q < kcols)
							p[m][r][i][q] = fmaf(wv[q], xq[q], p[m][r][i][q]);
				}
			}
	};

	/* Where the block scales of my rows start (-1: 1.0f), for the hoisted staging's instances.
	 * NOTE: an int: a matrix has fewer than 2^31 scales (rows * K / 16384 ones). */
	int so[NMAT][C::RT];
#pragma unroll
	for (int m = 0; m < NMAT; m++)
#pragma unroll
		for (int r = 0; r < C::RT; r++) {
			const int row = row0 + wr * 8 + qi + 8 * WR * r;
			so[m][r] = (HOIST_S && g.s(m) && row < a.rows) ? row / 128 * n_chunk : -1;
		}

#pragma unroll
	for (int st = 0; st < C::NSTAGE - 1; st++) {
		if (st < n_chunk)
			load(st, st);
		else
			moet_cp_async_commit();
	}
	/* The steady state (moet_rows_steady's NOTE): chunks c < n_steady. */
	const int n_steady = moet_rows_steady<DT, NMAT, TT, WR, G>::value && a.vec ?
				     n_chunk - C::NSTAGE : 0;
	for (int c = 0; c < n_chunk; c++) {
		moet_cp_async_wait<C::NSTAGE - 2>();
		__syncthreads();
		const int nc = c + C::NSTAGE - 1;
		const bool steady = c < n_steady;
		if (steady) {
			unsigned char *ws = smem + nc % C::NSTAGE * C::STAGE;
			sg.template load<true>(a, ws, (float *)(ws + C::WBYTES), nc * 128, 128, K,
					       n_rows, tid);
			moet_cp_async_commit();
		} else {
			if (nc < n_chunk)
				load(nc, nc % C::NSTAGE);
			else
				moet_cp_async_commit();
			/* NOTE: the block's last loads are issued: the next grid (the down pass)
			 * may now take SM slots as this grid's last wave drains. Rows of NSTAGE-1
			 * chunks or fewer (K <= 384) trigger at exit only: covering them here too
			 * changed the registers of F8 instances (sm_90). */
			if ((pdl & MOET_ROWS_PDL_TRIGGER) && nc == n_chunk - 1)
				moet_grid_dep_trigger();
		}

		/* Block scales of my rows for this chunk (1.0f without scales or past the last row). */
		float sc[NMAT][C::RT];
#pragma unroll
		for (int m = 0; m < NMAT; m++)
#pragma unroll
			for (int r = 0; r < C::RT; r++) {
				if (HOIST_S) {
					sc[m][r] = so[m][r] >= 0 ? __ldg(g.s(m) + so[m][r] + c)
								 : 1.0f;
					continue;
				}
				int row = row0 + wr * 8 + qi + 8 * WR * r;
				const float *s = g.s(m);
				sc[m][r] = (s && row < a.rows) ? __ldg(s + (size_t)(row / 128) * n_chunk + c)
							       : 1.0f;
			}
		const unsigned char *ws = smem + (c % C::NSTAGE) * C::STAGE;
		const float *xs = (const float *)(ws + C::WBYTES);
		const int kcols = min(128, K - c * 128);
		if (steady || kcols == 128) {
#pragma unroll
			for (int t = 0; t < 8; t++)
				step(ws, xs, t, 128, true);
		} else {
			for (int t = 0; t < 8; t++)
				step(ws, xs, t, kcols, false);
		}
		moet_rows_each4<NMAT, C::RT, TT, 4>([&](int m, int r, int i, int q) {
			acc[m][r][i][q] = fmaf(p[m][r][i][q], sc[m][r], acc[m][r][i][q]);
			p[m][r][i][q] = 0.0f;
		});
	}
	moet_cp_async_wait<0>();

#pragma unroll
	for (int r = 0; r < C::RT; r++)
#pragma unroll
		for (int i = 0; i < TT; i++) {
			float d[NMAT];
#pragma unroll
			for (int m = 0; m < NMAT; m++)
				d[m] = moet_rows_quad_tree(acc[m][r][i]);
			const int rl = wr * 8 + qi + 8 * WR * r, tl = wt * TT + i;
			if (j == 0 && rl < n_rows && tl < n_toks) {
				float v = NMAT == 2 ? moet_silu_c(d[0]) * d[NMAT - 1]
						    : a.canon ? moet_canon_nan(d[0]) : d[0];
				long long pair = (long long)g.pair0() + tok0 + tl;
				a.out[pair * a.out_stride + row0 + rl] = v;
			}
		}
}

/*
 * Queues fn<<<blocks, threads, smem, stream>>>(args); with `dependent`, as a programmatic
 * dependent of the kernel before it on the stream (cudaLaunchKernelEx with programmatic stream
 * serialization allowed: its blocks may start before that kernel completes and wait for it
 * themselves, the args carrying MOET_ROWS_PDL_WAIT). A failed launch is reported here and not
 * left as CUDA's last error.
 */
template <class Args>
static inline cudaError_t moet_rows_launch(void (*fn)(Args), unsigned blocks, int threads,
					   int smem, cudaStream_t stream, const Args &args,
					   bool dependent)
{
	cudaError_t e;
	if (dependent) {
		cudaLaunchAttribute at[1];
		at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		at[0].val.programmaticStreamSerializationAllowed = 1;
		cudaLaunchConfig_t lc = {};
		lc.gridDim = dim3(blocks);
		lc.blockDim = dim3((unsigned)threads);
		lc.dynamicSmemBytes = (size_t)smem;
		lc.stream = stream;
		lc.attrs = at;
		lc.numAttrs = 1;
		e = cudaLaunchKernelEx(&lc, fn, args);
	} else {
		fn<<<blocks, (unsigned)threads, (size_t)smem, stream>>>(args);
		e = cudaGetLastError();
	}
	if (e != cudaSuccess)
		(void)cudaGetLastError();
	return e;
}

#endif
