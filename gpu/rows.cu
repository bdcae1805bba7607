/*
 * rows.cu: the contract dot product D(W, r, x) on the device, for many (row, token) pairs at
 * once: the row machinery of the expert FFN (expert.cu) and of the dense linear layers
 * (linear.cu), bit-identical to moet_dot_ref (cpu/expert_ref.c). Interface: rows_int.h.
 *
 * A job is a list of groups (an expert, or the one matrix of a linear layer) with their
 * tokens; one kernel template (rows_kernel) computes every (row, token) of every group:
 *   NMAT = 2: out[p][i] = silu_c(D(W0, i, x[tok[p]])) * D(W1, i, x[tok[p]])   (gate_up)
 *   NMAT = 1: out[p][j] = D(W0, j, x[tok[p]]), NaN canonicalized if asked       (down, linear)
 * A launch covers up to EXP_MAX groups of one token-count class; its grid enumerates tiles
 * (group, row tile, token tile), token tiles fastest so that the blocks sharing a row tile
 * run together and read the weights from DRAM once.
 *
 * NOTE (the mapping, and why it is exact). The contract (docs/numerics.md) fixes, for every
 * (row r, token), sixteen lane accumulators; lane l owns the columns k = 128b + 16t + l. Here a
 * QUAD of 4 threads computes one (row, token) dot: thread j (0..3) owns the lanes 4j..4j+3, so
 * in step t it reads the 4 consecutive columns 16t + 4j .. 16t + 4j + 3 of the block as one
 * 32-bit word (F8), 64-bit word (BF16) or 128-bit word (F32) from shared memory, and keeps
 * p[4] and acc[4] in registers. Per lane the operations are exactly the reference's:
 *   p = +0 at each block; for t = 0..7: p = fma(dec(W[r][k]), x[k], p) if k < K (else no op);
 *   acc = fma(p, S[r/128][b], acc) for every lane, every block (partial blocks too);
 * and the halving tree runs across the quad with shuffles in the reference's pairing:
 *   q[l] = acc[l] + acc[l+8]   (thread j gets thread j+2's acc: shfl_down 2)
 *   s[l] = q[l] + q[l+4]       (thread 0 gets thread 1's q: shfl_down 1)
 *   u0 = s[0] + s[2], u1 = s[1] + s[3], D = u0 + u1   (inside thread 0)
 * fmas are fmaf (= __fmaf_rn), adds and multiplies are single IEEE operations that the build
 * never contracts (--fmad=false), no flush-to-zero (-ftz=false), IEEE division in silu_c
 * (-prec-div=true), exp_c from the header the host uses. Nothing depends on the tiling: every
 * (row, token) has its own fixed sequence of operations, so the block shapes, the classes and
 * the grouping of experts change speed, never bits. No atomics: each output has one writer.
 *
 * Decoding. F8_E4M3 uses the hardware conversion cvt.rn.f16x2.e4m3x2 (sm_89+) then
 * cvt.f32.f16: both exact (every e4m3fn value, subnormals included, is a binary16 value; the NaN
 * codes give NaN). A NaN's payload may differ from moet_dec_e4m3's, which no output can show:
 * every operation on a NaN gives a NaN and the result is canonicalized. Older targets use
 * moet_dec_e4m3. BF16 is a 16-bit shift, F32 a copy.
 *
 * Memory path. Each block stages 128-column chunks of its weight rows (raw bytes) and of its
 * tokens' activations in shared memory through an NSTAGE-deep cp.async pipeline (16-byte,
 * coalesced, L2-only loads), so that many rows are in flight per SM at one token per expert;
 * with several tokens per block the decoded weight word is reused by the TT tokens of a thread
 * and the staged chunk by the block's token tile. Rows are padded by 16 bytes in shared memory
 * so that the 8 rows a warp reads fall in different banks. Shapes whose rows are not 16-byte
 * aligned (odd K, tests) take an element-by-element staging path with the same compute.
 *
 * Programmatic dependent launch (MOET_ROWS_PDL_*, rows_int.h; the expert call's down pass after
 * its gate_up pass, MOET_GPU_PDL=1, sm_90+). A dependent block computes its tile, asks L2 for
 * the weight bytes of its first NSTAGE-1 chunks (one bulk prefetch per staged row; no earlier
 * kernel writes weights), then waits (griddepcontrol.wait) for the previous grid; everything
 * after, the token rows and the pipeline, is the plain launch's code. A triggering block
 * signals its dependents once it has issued its last loads. Only the time at which data
 * arrives changes, never the data or the arithmetic.
 * NOTE (why an L2 prefetch, not the first chunks' cp.async into shared memory before the wait):
 * that was built first; reordering the prologue moved the F8 one-token instances from 63 and 55
 * registers without spills to 64 with spills (ptxas, sm_90), on the decode path whether PDL is
 * on or not. The prefetch leaves the plain path's code and registers as they were.
 *
 *   shared memory, one stage:  [NMAT * RB rows][WSTRIDE bytes]  weights, raw
 *                              [TB tokens][XSTRIDE floats]       activations
 *   thread: j = tid % 4 (lanes 4j..4j+3); warp w: row group w % WR, token group w / WR;
 *           quad qi of the warp: rows wr*8 + qi + 8*WR*r (r < RT), tokens wt*TT + i (i < TT)
 */
#include "rows_int.h"

#include "gpu_int.h"
#include "moet_dtype.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define THREADS MOET_ROWS_THREADS
#define EXP_MAX MOET_ROWS_EXP_MAX
#define XSTRIDE (128 + 4)      /* floats per staged activation row (16-byte pad) */
#define SMEM_BUDGET (96 * 1024)
#define SM120_SMEM_MAX (99 * 1024)
#define DT_F8 MOET_ROWS_F8
#define DT_BF16 MOET_ROWS_BF16
#define DT_F32 MOET_ROWS_F32

typedef moet_rows_args pass_args;

template <int DT, int NMAT, int TT, int WR> struct cfg {
	static constexpr int WT = 8 / WR;                 /* token groups (warps) */
	/* rows per thread: 2 in the down pass with several tokens; 1 otherwise (NOTE: at one token
	 * per expert, smaller down tiles give more blocks than SM slots, so no half-empty wave;
	 * F32 rows are 4x wider in shared memory, so 1 keeps two stages under the budget) */
	static constexpr int RT = (NMAT == 2 || TT == 1 || DT == DT_F32) ? 1 : 2;
	static constexpr int RB = 8 * WR * RT;            /* rows per block tile */
	static constexpr int TB = WT * TT;                /* tokens per block tile */
	static constexpr int ESZ = DT == DT_F8 ? 1 : DT == DT_BF16 ? 2 : 4; /* bytes per weight */
	static constexpr int WSTRIDE = 128 * ESZ + 16;    /* bytes per staged weight row */
	static constexpr int WBYTES = NMAT * RB * WSTRIDE;
	static constexpr int STAGE = WBYTES + TB * XSTRIDE * 4;
	static constexpr int NSTAGE = SMEM_BUDGET / STAGE < 4 ? SMEM_BUDGET / STAGE : 4;
	static constexpr int SMEM = NSTAGE * STAGE;
	static_assert(WR * WT == 8, "8 warps");
	static_assert(NSTAGE >= 2, "at least double buffering");
	static_assert(SMEM + TB * 4 <= SM120_SMEM_MAX, "sm_120: 99 KB of shared memory per block");
	static_assert(WBYTES % 16 == 0, "activation stage 16-byte aligned");
};

/* Four weights of one step, exactly decoded: columns k..k+3 of a staged row. */
template <int DT> static __device__ __forceinline__ void decode4(const unsigned char *p,
								   float w[4])
{
	if (DT == DT_F8) {
		moet_dec4_f8(*(const uint32_t *)p, w);
	} else if (DT == DT_BF16) {
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
static __device__ __forceinline__ float quad_tree(const float acc[4])
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

template <int DT, int NMAT, int TT, int WR>
static __global__ void __launch_bounds__(THREADS) rows_kernel(const __grid_constant__ pass_args a)
{
	using C = cfg<DT, NMAT, TT, WR>;
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ int xrow_s[C::TB];

	const int tid = threadIdx.x, j = tid & 3, qi = (tid >> 2) & 7, w = tid >> 5;
	const int wr = w % WR, wt = w / WR;

	/* The tile: expert e (last with tile0[e] <= blockIdx.x), then token tile fastest. */
	int e, row0, tok0;
	moet_rows_tile(a, blockIdx.x, C::RB, C::TB, &e, &row0, &tok0);
	const int n_e = a.n[e];
	const int n_rows = min(C::RB, a.rows - row0), n_toks = min(C::TB, n_e - tok0);
	const int K = a.K, n_chunk = (K + 127) / 128;

	if (a.pdl & MOET_ROWS_PDL_WAIT) {
		/* A programmatic dependent: weights may be read before the previous grid ends. */
		if (a.vec && tid < NMAT * C::RB && tid % C::RB < n_rows) {
			const int m = tid / C::RB, r = tid % C::RB;
			const unsigned bytes = (unsigned)(min(K, (C::NSTAGE - 1) * 128) * C::ESZ);
			moet_prefetch_l2((const unsigned char *)a.w[e][m] +
					 (size_t)(row0 + r) * K * C::ESZ, bytes);
		}
		moet_grid_dep_wait();
	}
	if (tid < C::TB) {
		int xr = -1;
		if (tid < n_toks) {
			long long pair = (long long)a.pair0[e] + tok0 + tid;
			long long r = a.tok ? (long long)a.tok[pair] : pair;
			xr = (r >= 0 && r < a.n_x) ? (int)r : -1;
		}
		xrow_s[tid] = xr;
	}
	__syncthreads();

	/* Stage chunk c (columns 128c ..) into stage st; a cp.async group is committed per call. */
	auto load = [&](int c, int st) {
		unsigned char *ws = smem + st * C::STAGE;
		float *xs = (float *)(ws + C::WBYTES);
		const int kc0 = c * 128, kcols = min(128, K - kc0);
		if (a.vec) {
			constexpr int PPR = 128 * C::ESZ / 16; /* 16-byte pieces per row */
			const int pv = kcols * C::ESZ / 16;    /* K * ESZ % 16 == 0 under vec */
			for (int p = tid; p < NMAT * C::RB * PPR; p += THREADS) {
				int m = p / (C::RB * PPR), r = (p / PPR) % C::RB, q = p % PPR;
				if (r < n_rows && q < pv) {
					const unsigned char *src = (const unsigned char *)a.w[e][m] +
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
					if (DT == DT_F8)
						dst[k] = ((const uint8_t *)a.w[e][m])[i];
					else if (DT == DT_BF16)
						((uint16_t *)dst)[k] = ((const uint16_t *)a.w[e][m])[i];
					else
						((uint32_t *)dst)[k] = ((const uint32_t *)a.w[e][m])[i];
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
#pragma unroll
	for (int m = 0; m < NMAT; m++)
#pragma unroll
		for (int r = 0; r < C::RT; r++)
#pragma unroll
			for (int i = 0; i < TT; i++)
#pragma unroll
				for (int q = 0; q < 4; q++)
					p[m][r][i][q] = acc[m][r][i][q] = 0.0f;

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
				decode4<DT>(ws + (m * C::RB + rl) * C::WSTRIDE + k * C::ESZ, wv);
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

#pragma unroll
	for (int st = 0; st < C::NSTAGE - 1; st++) {
		if (st < n_chunk)
			load(st, st);
		else
			moet_cp_async_commit();
	}
	for (int c = 0; c < n_chunk; c++) {
		moet_cp_async_wait<C::NSTAGE - 2>();
		__syncthreads();
		const int nc = c + C::NSTAGE - 1;
		if (nc < n_chunk)
			load(nc, nc % C::NSTAGE);
		else
			moet_cp_async_commit();
		/* NOTE: the block's last loads are issued: the next grid (the down pass) may now
		 * take SM slots as this grid's last wave drains. Rows of NSTAGE-1 chunks or fewer
		 * (K <= 384) trigger at exit only: covering them here too changed the registers of
		 * F8 instances (sm_90). */
		if ((a.pdl & MOET_ROWS_PDL_TRIGGER) && nc == n_chunk - 1)
			moet_grid_dep_trigger();

		/* Block scales of my rows for this chunk (1.0f without scales or past the last row). */
		float sc[NMAT][C::RT];
#pragma unroll
		for (int m = 0; m < NMAT; m++)
#pragma unroll
			for (int r = 0; r < C::RT; r++) {
				int row = row0 + wr * 8 + qi + 8 * WR * r;
				const float *s = a.s[e][m];
				sc[m][r] = (s && row < a.rows) ? __ldg(s + (size_t)(row / 128) * n_chunk + c)
							       : 1.0f;
			}
		const unsigned char *ws = smem + (c % C::NSTAGE) * C::STAGE;
		const float *xs = (const float *)(ws + C::WBYTES);
		const int kcols = min(128, K - c * 128);
		if (kcols == 128) {
#pragma unroll
			for (int t = 0; t < 8; t++)
				step(ws, xs, t, 128, true);
		} else {
			for (int t = 0; t < 8; t++)
				step(ws, xs, t, kcols, false);
		}
#pragma unroll
		for (int m = 0; m < NMAT; m++)
#pragma unroll
			for (int r = 0; r < C::RT; r++)
#pragma unroll
				for (int i = 0; i < TT; i++)
#pragma unroll
					for (int q = 0; q < 4; q++) {
						acc[m][r][i][q] = fmaf(p[m][r][i][q], sc[m][r],
								       acc[m][r][i][q]);
						p[m][r][i][q] = 0.0f;
					}
	}
	moet_cp_async_wait<0>();

#pragma unroll
	for (int r = 0; r < C::RT; r++)
#pragma unroll
		for (int i = 0; i < TT; i++) {
			float d[NMAT];
#pragma unroll
			for (int m = 0; m < NMAT; m++)
				d[m] = quad_tree(acc[m][r][i]);
			const int rl = wr * 8 + qi + 8 * WR * r, tl = wt * TT + i;
			if (j == 0 && rl < n_rows && tl < n_toks) {
				float v = NMAT == 2 ? moet_silu_c(d[0]) * d[NMAT - 1]
						    : a.canon ? moet_canon_nan(d[0]) : d[0];
				long long pair = (long long)a.pair0[e] + tok0 + tl;
				a.out[pair * a.out_stride + row0 + rl] = v;
			}
		}
}


/* ---- host side ------------------------------------------------------------------------------ */

#define N_CLASS MOET_ROWS_N_CLASS

/* Token-count classes: n = 1, 2, 3-4, 5-8, 9-16, >= 17 tokens per group (rows_int.h). */
static int class_of(int64_t n)
{
	return n <= 1 ? 0 : n == 2 ? 1 : n <= 4 ? 2 : n <= 8 ? 3 : n <= 16 ? 4 : 5;
}

/* NOTE: wide is the default where it applies (9+ tokens per group): on the H200 (bench
 * gpu-experts, docs/gpu.md) 8-9% faster than rows_kernel there, same bits. */
#define DEFAULT_WIDE 1

int moet_rows_variant(int *out_wide)
{
	const char *v = getenv("MOET_GPU_ROWS_KERNEL");
	if (!v || !*v)
		*out_wide = DEFAULT_WIDE;
	else if (!strcmp(v, "ref"))
		*out_wide = 0;
	else if (!strcmp(v, "wide"))
		*out_wide = 1;
	else
		return moet_err(MOET_EINVAL, "MOET_GPU_ROWS_KERNEL=%.40s (want ref or wide)", v);
	return 0;
}

/* NOTE: PDL is on by default since its H200 measurement (docs/gpu.md: 1 token 0.638 of the
 * copy bandwidth against 0.624 plain, same run). */
#define DEFAULT_PDL 1
#define PDL_DEV_MAX 64

/* Compute capability major per device, + 1 (0: not asked yet). NOTE: a cache, the one mutable
 * static of the row machinery: the property cannot change while the process runs, racing
 * writers store the same value, accesses are atomic. Devices past PDL_DEV_MAX ask each call. */
static int cc_major_p1[PDL_DEV_MAX];

static int cc_major(int *out_major)
{
	int dev = 0, v = 0;
	MOET_CUDA_TRY(cudaGetDevice(&dev));
	const bool cached = dev >= 0 && dev < PDL_DEV_MAX;
	if (cached && (v = __atomic_load_n(&cc_major_p1[dev], __ATOMIC_RELAXED)) > 0) {
		*out_major = v - 1;
		return 0;
	}
	MOET_CUDA_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev));
	if (cached)
		__atomic_store_n(&cc_major_p1[dev], v + 1, __ATOMIC_RELAXED);
	*out_major = v;
	return 0;
}

int moet_rows_pdl(int *out_pdl)
{
	const char *v = getenv("MOET_GPU_PDL");
	int want, major = 0;
	if (!v || !*v)
		want = DEFAULT_PDL;
	else if (!strcmp(v, "0"))
		want = 0;
	else if (!strcmp(v, "1"))
		want = 1;
	else
		return moet_err(MOET_EINVAL, "MOET_GPU_PDL=%.40s (want 0 or 1)", v);
	if (want) {
		int rc = cc_major(&major);
		if (rc)
			return rc;
	}
	*out_pdl = want && major >= 9;
	return 0;
}

typedef moet_rows_kernel kernel_ent;

template <int DT, int NMAT, int TT, int WR> static kernel_ent ent(void)
{
	using C = cfg<DT, NMAT, TT, WR>;
	return kernel_ent{ rows_kernel<DT, NMAT, TT, WR>, C::SMEM, C::RB, C::TB, THREADS };
}

template <int DT, int NMAT> static kernel_ent class_ent(int cl)
{
	switch (cl) {
	case 0: return ent<DT, NMAT, 1, 8>();
	case 1: return ent<DT, NMAT, 2, 8>();
	case 2: return ent<DT, NMAT, 4, 8>();
	case 3: return ent<DT, NMAT, 4, 4>();
	default: return ent<DT, NMAT, 4, 2>(); /* 9-16 and >= 17 */
	}
}

/* NOTE: F32 weights (dense layers only) have no NMAT 2 instance: fewer kernels to build. */
static kernel_ent pick(int dt, int nmat, int cl)
{
	if (dt == DT_F8)
		return nmat == 2 ? class_ent<DT_F8, 2>(cl) : class_ent<DT_F8, 1>(cl);
	if (dt == DT_BF16)
		return nmat == 2 ? class_ent<DT_BF16, 2>(cl) : class_ent<DT_BF16, 1>(cl);
	return nmat == 1 ? class_ent<DT_F32, 1>(cl) : kernel_ent{ NULL, 0, 1, 1, 0 };
}

/* Queues k as a programmatic dependent of the kernel before it on the stream (cudaLaunchKernelEx
 * with programmatic stream serialization allowed): its blocks may start before that kernel
 * completes and wait for it themselves (a.pdl has MOET_ROWS_PDL_WAIT). */
static cudaError_t launch_dependent(const kernel_ent &k, unsigned blocks, cudaStream_t stream,
				    const pass_args &a)
{
	cudaLaunchAttribute at[1];
	at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at[0].val.programmaticStreamSerializationAllowed = 1;
	cudaLaunchConfig_t lc = {};
	lc.gridDim = dim3(blocks);
	lc.blockDim = dim3((unsigned)k.threads);
	lc.dynamicSmemBytes = (size_t)k.smem;
	lc.stream = stream;
	lc.attrs = at;
	lc.numAttrs = 1;
	cudaError_t e = cudaLaunchKernelEx(&lc, k.fn, a);
	if (e != cudaSuccess)
		(void)cudaGetLastError(); /* reported here; not left for the next check */
	return e;
}

int moet_rows_run(const moet_rows_job *job, moet_rows_get_fn get, const void *ctx,
		  int64_t n_groups, cudaStream_t stream)
{
	pass_args base = {};
	base.rows = job->rows;
	base.K = job->K;
	base.x = job->x;
	base.x_stride = job->x_stride;
	base.tok = job->tok;
	base.n_x = job->n_x;
	base.out = job->out;
	base.out_stride = job->out_stride;
	base.vec = job->vec;
	base.canon = job->canon;
	bool first = true; /* the job's first launch: the only one that may be a dependent */
	for (int cl = 0; cl < N_CLASS; cl++) {
		kernel_ent k = pick(job->dt, job->nmat, cl);
		if (job->wide && job->vec && job->dt != DT_F32 && job->K % 16 == 0 && cl >= 4) {
			kernel_ent t = moet_rows_wide_pick(job->dt, job->nmat, cl);
			if (t.fn)
				k = t;
		}
		if (!k.fn)
			return moet_err(MOET_EINVAL, "rows: dtype %d with %d matrices", job->dt,
					job->nmat);
		pass_args a = base;
		long long tiles = 0;
		int64_t pair = 0; /* first pair of group g */
		moet_rows_group gr = {};
		a.n_exp = 0;
		for (int64_t g = 0; g <= n_groups; pair += g < n_groups ? gr.n : 0, g++) {
			if (g < n_groups)
				get(ctx, g, &gr);
			bool take = g < n_groups && gr.n > 0 && class_of(gr.n) == cl;
			if (take) {
				a.w[a.n_exp][0] = gr.w[0];
				a.s[a.n_exp][0] = gr.s[0];
				a.w[a.n_exp][1] = job->nmat == 2 ? gr.w[1] : NULL;
				a.s[a.n_exp][1] = job->nmat == 2 ? gr.s[1] : NULL;
				a.pair0[a.n_exp] = (int)pair;
				a.n[a.n_exp] = (int)gr.n;
				a.tile0[a.n_exp] = (int)tiles;
				tiles += (long long)((a.rows + k.rb - 1) / k.rb) *
					 ((gr.n + k.tb - 1) / k.tb);
				if (tiles > INT_MAX)
					return moet_err(MOET_EINVAL, "rows: %lld tiles in one launch",
							tiles);
				a.n_exp++;
			}
			if (a.n_exp > 0 && (a.n_exp == EXP_MAX || g == n_groups)) {
				a.tile0[a.n_exp] = (int)tiles;
				/* NOTE: sets the limit on the current device; cheap, no sync. */
				MOET_CUDA_TRY(cudaFuncSetAttribute(k.fn,
					cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
				a.pdl = first ? job->pdl : job->pdl & ~MOET_ROWS_PDL_WAIT;
				first = false;
				if (a.pdl & MOET_ROWS_PDL_WAIT) {
					MOET_CUDA_TRY(launch_dependent(k, (unsigned)tiles, stream,
								       a));
				} else {
					k.fn<<<(unsigned)tiles, (unsigned)k.threads, (size_t)k.smem,
					       stream>>>(a);
					MOET_CUDA_TRY(cudaGetLastError());
				}
				a.n_exp = 0;
				tiles = 0;
			}
		}
	}
	return 0;
}
