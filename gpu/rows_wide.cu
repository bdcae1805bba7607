/*
 * rows_wide.cu: the wide variant of the contract row machinery (rows.cu) for groups of 9 or more
 * tokens, F8_E4M3 or BF16 weights with K a multiple of 16 under 16-byte staging. Same job, same
 * bits as rows_kernel (and moet_dot_ref); chosen per call by moet_rows_job.wide (the
 * MOET_GPU_ROWS_KERNEL switch, moet_rows_variant). Interface: rows_int.h.
 *
 * Why. From 8 tokens per group up the work is the fmas, and rows_kernel gives each (row, token)
 * dot to a quad of threads, so no operand is shared inside a warp. Here each warp works on two
 * contract lanes (w and w + 8) of a tile of 32 virtual rows x 16 tokens, like a small SGEMM:
 * thread (rt, tt) keeps a 4 x 4 register tile of (row, token) dots per lane, and a step loads
 * one 16-byte row fragment (shared by the 4 token threads of the warp) and one 16-byte token
 * fragment (shared by the 8 row threads) for 16 fmas. The 8 warps hold the 16 lanes; the
 * contract's halving tree runs once per tile at the end (its first level in the thread, which
 * holds lanes l and l + 8, the rest through shared memory).
 *
 * NOTE (the mapping, and why it is exact). The contract (docs/numerics.md) gives every (row,
 * token) sixteen lanes; lane l owns the columns k = 128b + 16t + l. Warp w holds p and acc of
 * lanes w and w + 8 of every (row, token) of the tile, in the registers of the thread that owns
 * the pair, and performs per lane, per 128-column block b, in the reference's order:
 *   p = +0; for t = 0..7: p = fma(dec(W[r][k]), x[k], p) if k < K (else nothing);
 *   acc = fma(p, S[r/128][b], acc)  (every lane, every block, partial blocks too).
 * A lane's condition k < K is the same for the whole warp, so partial blocks cost no
 * divergence. At the end the tree in the reference's pairing:
 *   q[l] = acc[l] + acc[l+8] (in the thread); s[l] = q[l] + q[l+4]; u[l] = s[l] + s[l+2];
 *   D = u[0] + u[1] (through shared memory).
 * Decoding is exact and happens once per staged chunk, into binary32 in shared memory:
 * cvt.rn.f16x2.e4m3x2 then cvt.f32.f16 as in rows.cu (NaN codes give NaN; outputs are
 * canonicalized), BF16 a 16-bit shift. fmaf, --fmad=false, -ftz=false as everywhere in gpu/.
 * Nothing depends on the tiling: every output has its own fixed sequence of operations.
 *
 *   block: 256 threads = 8 warps, two blocks per SM; in warp w thread li: rt = li % 8 (virtual
 *          rows 4rt .. 4rt+3), tt = li / 8 (tokens 4tt .. 4tt+3)
 *   virtual rows: 32 per tile; NMAT 1: rows row0 .. row0+31; NMAT 2: gate rows row0 .. row0+15
 *          (virtual 0..15) and up rows row0 .. row0+15 (16..31); a tile lies in one 128-row
 *          block of the scales (row0 is a multiple of 32 / NMAT)
 *   shared: the decoded chunk, wf[16 lanes][8 steps][48] (32 rows, padded so that the staging
 *          stores of steps t and t+1 fall 16 banks apart) and xf[16][8][16] (tokens), and NS
 *          raw stages filled by cp.async (weight rows as bytes, activation rows as floats,
 *          zero-filled past the edges); per chunk: wait, sync, issue the fetch NS-1 chunks
 *          ahead, decode the raw stage into wf / xf, sync, compute. At the end the decoded
 *          chunk's memory holds red[8][16][33] for the tree.
 *
 * NOTE (measured, H200, bench gpu-experts, 8 Kimi-K2 experts, docs/gpu.md): 16 tokens per
 * expert 0.37 of the SGEMM rate (ref 0.34), 256 tokens 0.40 (0.37); at 8 tokens this layout is
 * slower than rows_kernel, so classes below 9 tokens keep it. Timing the parts (each part
 * skipped in turn) showed the fmas alone near 41 TFLOP/s and the staging (fetch, decode, syncs)
 * costing as much again: each 32-row tile re-reads its tokens' activations from L2, and the
 * register budget of the contract's 16 lanes x (p, acc) caps the tile. Larger tiles with 16
 * warps per block (one lane each, 64 x 32 and 32 x 32 tiles) measured slower; see docs/gpu.md.
 */
#include "rows_int.h"

#include "gpu_int.h"
#include "moet_dtype.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define WTHREADS 256
#define NS 3 /* raw stages in flight */
#define SM120_SMEM_MAX (99 * 1024)

template <int DT, int NMAT> struct wcfg {
	static constexpr int VR = 32;                     /* virtual rows per tile */
	static constexpr int RB = VR / NMAT;              /* output rows per tile */
	static constexpr int TB = 16;                     /* tokens per tile */
	static constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : 2;
	static constexpr int WS = VR + 16;                /* floats per (lane, step) in wf */
	static constexpr int WF = 16 * 8 * WS;            /* floats of wf */
	static constexpr int XF = 16 * 8 * TB;            /* floats of xf */
	static constexpr int DEC = (WF + XF) * 4;         /* bytes of the decoded chunk */
	static constexpr int WRS = 128 * ESZ + 16;        /* bytes per raw weight row */
	static constexpr int XRS = 128 + 4;               /* floats per raw activation row */
	static constexpr int STAGE = VR * WRS + TB * XRS * 4;
	static constexpr int RS = VR + 1;                 /* floats per (lane pair, token) in red */
	static constexpr int RED = 8 * TB * RS * 4;
	static constexpr int SMEM = DEC + NS * STAGE;
	static_assert(RED <= DEC, "the tree's table fits in the decoded chunk");
	static_assert((VR * WRS) % 16 == 0 && DEC % 16 == 0 && STAGE % 16 == 0, "16-byte stages");
	static_assert(TB * 8 <= WTHREADS, "one activation unit per thread at most");
	static_assert(SMEM + TB * 4 <= SM120_SMEM_MAX, "sm_120: 99 KB of shared memory per block");
};

static __device__ __forceinline__ uint32_t word_of(const uint4 &v, int i)
{
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int DT, int NMAT>
static __global__ void __launch_bounds__(WTHREADS, 2)
	rows_wide_kernel(const __grid_constant__ moet_rows_args a)
{
	using C = wcfg<DT, NMAT>;
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ int xrow_s[C::TB];

	const int tid = threadIdx.x, li = tid & 31, w = tid >> 5;
	const int rt = li & 7, tt = li >> 3;
	int e, row0, tok0;
	moet_rows_tile(a, blockIdx.x, C::RB, C::TB, &e, &row0, &tok0);
	const int n_rows = min(C::RB, a.rows - row0), n_toks = min(C::TB, a.n[e] - tok0);
	const int K = a.K, n_chunk = (K + 127) / 128;

	/* NOTE: as a programmatic dependent (rows_int.h) this variant waits before its first load;
	 * it never triggers early (its dependents start as its blocks exit). At 9+ tokens the
	 * work is the fmas, so there is little to overlap. */
	if (a.pdl & MOET_ROWS_PDL_WAIT)
		moet_grid_dep_wait();
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

	float *const wf = (float *)smem, *const xf = wf + C::WF;
	unsigned char *const raw = smem + C::DEC;

	/* Raw stage st <- chunk c: weight rows (16-byte pieces, zero-filled past the last row or
	 * column) and activation rows (zero-filled for tokens past the tile or out of range). */
	auto fetch = [&](int c, int st) {
		unsigned char *ws = raw + st * C::STAGE;
		float *xs = (float *)(ws + C::VR * C::WRS);
		const int kc0 = c * 128, kcols = min(128, K - kc0);
		constexpr int PPR = 128 * C::ESZ / 16; /* pieces per weight row */
		for (int p = tid; p < C::VR * PPR; p += WTHREADS) {
			const int vr = p / PPR, q = p % PPR;
			const int m = NMAT == 2 ? vr >> 4 : 0;
			const int row = row0 + (NMAT == 2 ? (vr & 15) : vr);
			const bool ok = row < a.rows && q * 16 < kcols * C::ESZ;
			const unsigned char *src = (const unsigned char *)a.w[e][m] +
				(ok ? ((size_t)row * K + kc0) * C::ESZ + q * 16 : 0);
			moet_cp_async16z(ws + vr * C::WRS + q * 16, src, ok);
		}
		for (int p = tid; p < C::TB * 32; p += WTHREADS) {
			const int i = p >> 5, q = p & 31;
			const int xr = xrow_s[i];
			const bool ok = xr >= 0 && q * 4 < kcols;
			const float *src = a.x + (ok ? (long long)xr * a.x_stride + kc0 + q * 4 : 0);
			moet_cp_async16z(xs + i * C::XRS + q * 4, src, ok);
		}
		moet_cp_async_commit();
	};

	/* Decode raw stage st into wf / xf: weights unit (virtual row dv, step dt: 16 columns, one
	 * per lane), activations unit (token xt, step xst). */
	const int dv = (li & 15) + 16 * (w & 1), dt = 2 * (w >> 1) + (li >> 4);
	const int xt = tid % C::TB, xst = tid / C::TB;
	auto decode = [&](int st) {
		const unsigned char *ws = raw + st * C::STAGE;
		const float *xs = (const float *)(ws + C::VR * C::WRS);
		float *d = wf + dt * C::WS + dv;
		const uint4 *src = (const uint4 *)(ws + dv * C::WRS + 16 * dt * C::ESZ);
		if constexpr (DT == MOET_ROWS_F8) {
			const uint4 u = src[0];
#pragma unroll
			for (int i = 0; i < 4; i++) {
				float v[4];
				moet_dec4_f8(word_of(u, i), v);
#pragma unroll
				for (int q = 0; q < 4; q++)
					d[(4 * i + q) * 8 * C::WS] = v[q];
			}
		} else {
			const uint4 u[2] = { src[0], src[1] };
#pragma unroll
			for (int i = 0; i < 8; i++) {
				uint32_t b = word_of(u[i >> 2], i & 3);
				d[(2 * i) * 8 * C::WS] = __uint_as_float(b << 16);
				d[(2 * i + 1) * 8 * C::WS] = __uint_as_float(b & 0xFFFF0000u);
			}
		}
		if (tid < C::TB * 8) {
			const float4 *xsrc = (const float4 *)(xs + xt * C::XRS + 16 * xst);
			float *xd = xf + xst * C::TB + xt;
#pragma unroll
			for (int q = 0; q < 4; q++) {
				const float4 v = xsrc[q];
				xd[(4 * q + 0) * 8 * C::TB] = v.x;
				xd[(4 * q + 1) * 8 * C::TB] = v.y;
				xd[(4 * q + 2) * 8 * C::TB] = v.z;
				xd[(4 * q + 3) * 8 * C::TB] = v.w;
			}
		}
	};

	/* My scale: virtual rows 4rt .. 4rt+3 are of one matrix (NMAT 2 splits at 16). */
	const int mm = NMAT == 2 ? (rt >= 4) : 0;
	const int srow = row0 + (NMAT == 2 ? (4 * rt) & 15 : 4 * rt);
	const float *sp = a.s[e][mm];
	const bool has_s = sp && srow < a.rows;
	if (has_s)
		sp += (size_t)(srow / 128) * n_chunk;

	float p[2][4][4], acc[2][4][4];
#pragma unroll
	for (int h = 0; h < 2; h++)
#pragma unroll
		for (int i = 0; i < 4; i++)
#pragma unroll
			for (int j = 0; j < 4; j++)
				p[h][i][j] = acc[h][i][j] = 0.0f;

	/* Step t of lane w + 8h. */
	auto step = [&](int h, int t) {
		const int ln = w + 8 * h;
		const float4 w4 = *(const float4 *)(wf + (ln * 8 + t) * C::WS + 4 * rt);
		const float4 x4 = *(const float4 *)(xf + (ln * 8 + t) * C::TB + 4 * tt);
		const float wr[4] = { w4.x, w4.y, w4.z, w4.w };
		const float xv[4] = { x4.x, x4.y, x4.z, x4.w };
#pragma unroll
		for (int i = 0; i < 4; i++)
#pragma unroll
			for (int j = 0; j < 4; j++)
				p[h][i][j] = fmaf(wr[i], xv[j], p[h][i][j]);
	};

#pragma unroll
	for (int st = 0; st < NS - 1; st++) {
		if (st < n_chunk)
			fetch(st, st);
		else
			moet_cp_async_commit();
	}
	for (int c = 0; c < n_chunk; c++) {
		moet_cp_async_wait<NS - 2>();
		__syncthreads(); /* raw chunk c landed for all; every warp is done with wf / xf */
		const int nc = c + NS - 1;
		if (nc < n_chunk)
			fetch(nc, nc % NS);
		else
			moet_cp_async_commit();
		decode(c % NS);
		__syncthreads();
		const float sc = has_s ? __ldg(sp + c) : 1.0f;
		const int kcols = min(128, K - c * 128);
		if (kcols == 128) {
#pragma unroll
			for (int t = 0; t < 8; t++) {
				step(0, t);
				step(1, t);
			}
		} else {
			for (int t = 0; t < 8; t++) {
				if (16 * t + w < kcols)
					step(0, t);
				if (16 * t + w + 8 < kcols)
					step(1, t);
			}
		}
#pragma unroll
		for (int h = 0; h < 2; h++)
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 4; j++) {
					acc[h][i][j] = fmaf(p[h][i][j], sc, acc[h][i][j]);
					p[h][i][j] = 0.0f;
				}
	}
	moet_cp_async_wait<0>();
	__syncthreads(); /* every warp is done with wf / xf */

	float *red = (float *)smem;
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
			red[(w * C::TB + 4 * tt + j) * C::RS + 4 * rt + i] = acc[0][i][j] + acc[1][i][j];
	__syncthreads();
	auto tree = [&](int tl, int vr) {
		float s[4];
#pragma unroll
		for (int i = 0; i < 4; i++)
			s[i] = red[(i * C::TB + tl) * C::RS + vr] + red[((i + 4) * C::TB + tl) * C::RS + vr];
		float u0 = s[0] + s[2], u1 = s[1] + s[3];
		return u0 + u1;
	};
	for (int o = tid; o < C::RB * C::TB; o += WTHREADS) {
		const int r = o % C::RB, tl = o / C::RB;
		if (r < n_rows && tl < n_toks) {
			float v;
			if constexpr (NMAT == 2)
				v = moet_silu_c(tree(tl, r)) * tree(tl, 16 + r);
			else
				v = a.canon ? moet_canon_nan(tree(tl, r)) : tree(tl, r);
			long long pair = (long long)a.pair0[e] + tok0 + tl;
			a.out[pair * a.out_stride + row0 + r] = v;
		}
	}
}

template <int DT, int NMAT> static moet_rows_kernel went(void)
{
	using C = wcfg<DT, NMAT>;
	return moet_rows_kernel{ rows_wide_kernel<DT, NMAT>, C::SMEM, C::RB, C::TB, WTHREADS };
}

/* Classes (rows.cu): 4 = 9-16 tokens and 5 = 17 or more; 3 (5-8) stays with rows_kernel,
 * which is faster there. */
moet_rows_kernel moet_rows_wide_pick(int dt, int nmat, int cl)
{
	if (cl < 4 || (nmat != 1 && nmat != 2))
		return moet_rows_kernel{ NULL, 0, 1, 1, 0 };
	if (dt == MOET_ROWS_F8)
		return nmat == 2 ? went<MOET_ROWS_F8, 2>() : went<MOET_ROWS_F8, 1>();
	if (dt == MOET_ROWS_BF16)
		return nmat == 2 ? went<MOET_ROWS_BF16, 2>() : went<MOET_ROWS_BF16, 1>();
	return moet_rows_kernel{ NULL, 0, 1, 1, 0 };
}
