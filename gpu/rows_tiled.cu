/*
 * rows_tiled.cu: the register-tiled variant of the contract row machinery (rows.cu) for groups
 * of 5 or more tokens, F8_E4M3 or BF16 weights under 16-byte staging. Same job, same bits as
 * rows_kernel (and moet_dot_ref); selected per call by moet_rows_job.tiled (expert.cu reads
 * MOET_GPU_EXPERT_KERNEL). Interface: rows_int.h.
 *
 * Why. From 8 tokens per expert up, rows_kernel is bound by its own instructions: each token
 * group of a block decodes the same weights again, and a quad spends a shared-memory load per
 * 8 fmas. Here each staged 128-column chunk is decoded to binary32 ONCE per block, into shared
 * memory in k-major order (wf[k][row], xf[k][token]), and each thread keeps an 8 x T tile of
 * (row, token) accumulators for ONE contract lane, so a step costs 2 + T/4 128-bit loads for
 * 8T fmas (T = 8: 4 loads per 64 fmas).
 *
 * NOTE (the mapping, and why it is exact). The contract (docs/numerics.md) gives every (row,
 * token) sixteen lanes; lane l owns the columns k = 128b + 16t + l. Here thread l (0..15) of a
 * half-warp holds lane l of all 8 x T (row, token) dots of its tile, in p[8][T] and acc[8][T].
 * Per lane the operations are the reference's, in its order:
 *   p = +0 at each block; for t = 0..7: p = fma(dec(W[r][k]), x[k], p) if k < K (else no op);
 *   acc = fma(p, S[r/128][b], acc) for every lane, every block (partial blocks too);
 * then the halving tree across the 16 threads of the half-warp with shuffles in the
 * reference's pairing: q[l] = acc[l] + acc[l+8] (shfl_down 8), s[l] = q[l] + q[l+4] (4),
 * u[l] = s[l] + s[l+2] (2), D = u[0] + u[1] (1); thread l == 0 holds D. The decode is exact
 * (cvt.rn.f16x2.e4m3x2 + cvt.f32.f16 as in rows.cu, BF16 a shift), so staging binary32 in
 * shared memory changes no value. fmaf, --fmad=false, -ftz=false as everywhere in gpu/.
 *
 *   block: 256 threads = 8 warps; warp w holds rows vr = 8w .. 8w+7 (virtual rows, below),
 *          its half-warp h tokens hT .. hT+T-1; thread l = tid % 16 the lane
 *   virtual rows: 64 per tile; NMAT 1: the rows row0 .. row0+63 of W0; NMAT 2: gate rows
 *          row0 .. row0+31 then up rows row0 .. row0+31, a thread holding rows 4w..4w+3 of
 *          each, so that h = silu_c(gate) * up is formed in the thread
 *   shared: 2 buffers of [wf: 128 x WS floats][xf: 128 x XS floats], double buffered through
 *          registers: chunk c+1 is fetched from global memory (ld.global.nc) while chunk c is
 *          computed, then decoded and stored; one __syncthreads per chunk
 * A tile of 64 virtual rows lies in one 128-row scale block (row0 is a multiple of 64 / NMAT).
 *
 * NOTE (measured, H200, bench gpu-experts, 8 Kimi-K2 experts): 8 tokens 13.9 TFLOP/s (ref
 * 16.9), 64 tokens 18.0 (17.8), 256 tokens 18.5 (18.3): no gain, so not the default. The
 * likely bound is shared-memory bandwidth: a thread holds one lane, so no two threads of a
 * half-warp share an operand; a step reads 16 + 16 (w, x) 16-byte words per warp per 64
 * fmas, about 1 byte per fma, the SM's 128 bytes per clock against its 128 fmas; the decode
 * stores (40 per thread per chunk) and the one block per SM (241 registers) add to it. The
 * next layout should spread the 16 lanes over warps (4 lanes per warp, 8 tiles per warp that
 * share row and token fragments, so loads broadcast) and run the halving tree through shared
 * memory at the end.
 */
#include "rows_int.h"

#include "gpu_int.h"
#include "moet_dtype.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define SM120_SMEM_MAX (99 * 1024)

template <int DT, int NMAT, int T> struct tcfg {
	static constexpr int VR = 64;                     /* virtual rows per tile */
	static constexpr int RB = VR / NMAT;              /* output rows per tile */
	static constexpr int TB = 2 * T;                  /* tokens per tile */
	static constexpr int WS = VR + 4;                 /* floats per k in wf (16-byte pad) */
	static constexpr int XS = TB + 4;                 /* floats per k in xf */
	static constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : 2;
	static constexpr int WP = 32 * ESZ / 16;          /* 16-byte pieces a thread fetches */
	static constexpr int XP = TB * 32 / MOET_ROWS_THREADS; /* float4 pieces a thread fetches */
	static constexpr int BUF = (128 * WS + 128 * XS) * 4;
	static constexpr int SMEM = 2 * BUF;
	static_assert(T == 4 || T == 8, "a thread holds 4 or 8 tokens");
	static_assert(VR * 4 == MOET_ROWS_THREADS, "a thread fetches 32 columns of one row");
	static_assert(XP >= 1 && XP * MOET_ROWS_THREADS == TB * 32, "activation pieces");
	static_assert(SMEM + TB * 4 <= SM120_SMEM_MAX, "sm_120: 99 KB of shared memory per block");
	static_assert((128 * WS * 4) % 16 == 0, "xf 16-byte aligned");
};

/* Two weights from their codes: F8 a pair of e4m3 codes, BF16 a pair of bf16 patterns. */
template <int DT> static __device__ __forceinline__ void dec2(uint32_t u, float *w)
{
	if (DT == MOET_ROWS_F8) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
		uint32_t h;
		asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(u & 0xFFFFu)));
		asm("cvt.f32.f16 %0, %1;" : "=f"(w[0]) : "h"((unsigned short)(h & 0xFFFFu)));
		asm("cvt.f32.f16 %0, %1;" : "=f"(w[1]) : "h"((unsigned short)(h >> 16)));
#else
		w[0] = moet_dec_e4m3((uint8_t)u);
		w[1] = moet_dec_e4m3((uint8_t)(u >> 8));
#endif
	} else {
		w[0] = __uint_as_float(u << 16);
		w[1] = __uint_as_float(u & 0xFFFF0000u);
	}
}

template <int DT, int NMAT, int T>
static __global__ void __launch_bounds__(MOET_ROWS_THREADS, T == 4 ? 2 : 1)
	rows_tiled_kernel(const __grid_constant__ moet_rows_args a)
{
	using C = tcfg<DT, NMAT, T>;
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ int xrow_s[C::TB];

	const int tid = threadIdx.x, l = tid & 15, h = (tid >> 4) & 1, w = tid >> 5;
	int e, row0, tok0;
	moet_rows_tile(a, blockIdx.x, C::RB, C::TB, &e, &row0, &tok0);
	const int n_rows = min(C::RB, a.rows - row0), n_toks = min(C::TB, a.n[e] - tok0);
	const int K = a.K, n_chunk = (K + 127) / 128;

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

	/* What this thread fetches: 32 columns (fc0 ..) of virtual row fv; activation pieces. */
	const int fv = tid & 63, fc0 = (tid >> 6) * 32;
	const int fm = NMAT == 2 ? fv / 32 : 0, frow = NMAT == 2 ? fv % 32 : fv;
	const unsigned char *wsrc = frow < n_rows ? (const unsigned char *)a.w[e][fm] +
		(size_t)(row0 + frow) * K * C::ESZ : NULL;
	uint4 wr[C::WP];
	float4 xr4[C::XP];

	auto fetch = [&](int c) {
		const int kc0 = c * 128, kcols = min(128, K - kc0);
#pragma unroll
		for (int i = 0; i < C::WP; i++) {
			const int col = fc0 + i * (16 / C::ESZ); /* first column of the piece */
			wr[i] = make_uint4(0u, 0u, 0u, 0u);
			if (wsrc && col < kcols) /* under vec a piece is wholly in or out */
				wr[i] = __ldg((const uint4 *)(wsrc + (size_t)(kc0 + col) * C::ESZ));
		}
#pragma unroll
		for (int i = 0; i < C::XP; i++) {
			const int p = tid + i * MOET_ROWS_THREADS, tk = p % C::TB, q = p / C::TB;
			const int xr = xrow_s[tk];
			xr4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (xr >= 0 && 4 * q < kcols)
				xr4[i] = __ldg((const float4 *)(a.x + xr * a.x_stride + kc0 + 4 * q));
		}
	};
	/* Decodes the fetched chunk into buffer b (k-major). */
	auto put = [&](int b) {
		float *wf = (float *)(smem + b * C::BUF), *xf = wf + 128 * C::WS;
#pragma unroll
		for (int i = 0; i < C::WP; i++) {
			const uint32_t u[4] = { wr[i].x, wr[i].y, wr[i].z, wr[i].w };
			const int col = fc0 + i * (16 / C::ESZ);
#pragma unroll
			for (int q = 0; q < 4; q++) {
				float f[4];
				if (DT == MOET_ROWS_F8) {
					dec2<DT>(u[q] & 0xFFFFu, f);
					dec2<DT>(u[q] >> 16, f + 2);
#pragma unroll
					for (int z = 0; z < 4; z++)
						wf[(col + 4 * q + z) * C::WS + fv] = f[z];
				} else {
					dec2<DT>(u[q], f);
#pragma unroll
					for (int z = 0; z < 2; z++)
						wf[(col + 2 * q + z) * C::WS + fv] = f[z];
				}
			}
		}
#pragma unroll
		for (int i = 0; i < C::XP; i++) {
			const int p = tid + i * MOET_ROWS_THREADS, tk = p % C::TB, q = p / C::TB;
			xf[(4 * q + 0) * C::XS + tk] = xr4[i].x;
			xf[(4 * q + 1) * C::XS + tk] = xr4[i].y;
			xf[(4 * q + 2) * C::XS + tk] = xr4[i].z;
			xf[(4 * q + 3) * C::XS + tk] = xr4[i].w;
		}
	};

	float p[8][T], acc[8][T];
#pragma unroll
	for (int r = 0; r < 8; r++)
#pragma unroll
		for (int i = 0; i < T; i++)
			p[r][i] = acc[r][i] = 0.0f;

	/* My rows in wf: two runs of 4 (NMAT 1: 8w.., 8w+4..; NMAT 2: gate 4w.., up 32+4w..). */
	const int wb0 = NMAT == 2 ? 4 * w : 8 * w, wb1 = NMAT == 2 ? 32 + 4 * w : 8 * w + 4;
	auto step = [&](const float *wf, const float *xf, int t) {
		const int k = 16 * t + l;
		const float4 w0 = *(const float4 *)(wf + k * C::WS + wb0);
		const float4 w1 = *(const float4 *)(wf + k * C::WS + wb1);
		const float wv[8] = { w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w };
		float xv[T];
#pragma unroll
		for (int i = 0; i < T; i += 4) {
			const float4 x4 = *(const float4 *)(xf + k * C::XS + h * T + i);
			xv[i] = x4.x;
			xv[i + 1] = x4.y;
			xv[i + 2] = x4.z;
			xv[i + 3] = x4.w;
		}
#pragma unroll
		for (int r = 0; r < 8; r++)
#pragma unroll
			for (int i = 0; i < T; i++)
				p[r][i] = fmaf(wv[r], xv[i], p[r][i]);
	};

	/* Block scales of the tile (one 128-row block): gate / W0, up. */
	const float *s0 = a.s[e][0], *s1 = NMAT == 2 ? a.s[e][1] : NULL;
	const size_t sb = (size_t)(row0 / 128) * n_chunk;

	fetch(0);
	put(0);
	__syncthreads();
	for (int c = 0; c < n_chunk; c++) {
		if (c + 1 < n_chunk)
			fetch(c + 1);
		const float sc0 = s0 ? __ldg(s0 + sb + c) : 1.0f;
		const float sc1 = NMAT == 2 ? (s1 ? __ldg(s1 + sb + c) : 1.0f) : sc0;
		const float *wf = (const float *)(smem + (c & 1) * C::BUF), *xf = wf + 128 * C::WS;
		const int kcols = min(128, K - c * 128);
		if (kcols == 128) {
#pragma unroll
			for (int t = 0; t < 8; t++)
				step(wf, xf, t);
		} else {
#pragma unroll
			for (int t = 0; t < 8; t++)
				if (16 * t + l < kcols)
					step(wf, xf, t);
		}
#pragma unroll
		for (int r = 0; r < 8; r++)
#pragma unroll
			for (int i = 0; i < T; i++) {
				const float sc = (NMAT == 2 && r >= 4) ? sc1 : sc0;
				acc[r][i] = fmaf(p[r][i], sc, acc[r][i]);
				p[r][i] = 0.0f;
			}
		if (c + 1 < n_chunk)
			put((c + 1) & 1);
		__syncthreads();
	}

	/* The halving tree over the half-warp's 16 lanes; valid in thread l == 0. */
#pragma unroll
	for (int r = 0; r < 8; r++)
#pragma unroll
		for (int i = 0; i < T; i++) {
			float v = acc[r][i];
			v = v + __shfl_down_sync(0xFFFFFFFFu, v, 8, 16);
			v = v + __shfl_down_sync(0xFFFFFFFFu, v, 4, 16);
			v = v + __shfl_down_sync(0xFFFFFFFFu, v, 2, 16);
			acc[r][i] = v + __shfl_down_sync(0xFFFFFFFFu, v, 1, 16);
		}
	if (l != 0)
		return;
	constexpr int RO = 8 / NMAT; /* output rows per thread */
#pragma unroll
	for (int r = 0; r < RO; r++)
#pragma unroll
		for (int i = 0; i < T; i++) {
			const int rl = (NMAT == 2 ? 4 * w : 8 * w) + r, tl = h * T + i;
			if (rl < n_rows && tl < n_toks) {
				float v = NMAT == 2 ? moet_silu_c(acc[r][i]) * acc[r + 4][i]
						    : a.canon ? moet_canon_nan(acc[r][i]) : acc[r][i];
				long long pair = (long long)a.pair0[e] + tok0 + tl;
				a.out[pair * a.out_stride + row0 + rl] = v;
			}
		}
}

template <int DT, int NMAT, int T> static moet_rows_kernel tent(void)
{
	using C = tcfg<DT, NMAT, T>;
	return moet_rows_kernel{ rows_tiled_kernel<DT, NMAT, T>, C::SMEM, C::RB, C::TB };
}

/* Classes (rows.cu): 3 = 5-8 tokens (T 4, tiles of 8 tokens), 4 = 9 or more (T 8, 16). */
moet_rows_kernel moet_rows_tiled_pick(int dt, int nmat, int cl)
{
	const bool big = cl >= 4;
	if (cl < 3 || (nmat != 1 && nmat != 2))
		return moet_rows_kernel{ NULL, 0, 1, 1 };
	if (dt == MOET_ROWS_F8)
		return nmat == 2 ? (big ? tent<MOET_ROWS_F8, 2, 8>() : tent<MOET_ROWS_F8, 2, 4>())
				 : (big ? tent<MOET_ROWS_F8, 1, 8>() : tent<MOET_ROWS_F8, 1, 4>());
	if (dt == MOET_ROWS_BF16)
		return nmat == 2 ? (big ? tent<MOET_ROWS_BF16, 2, 8>() : tent<MOET_ROWS_BF16, 2, 4>())
				 : (big ? tent<MOET_ROWS_BF16, 1, 8>() : tent<MOET_ROWS_BF16, 1, 4>());
	return moet_rows_kernel{ NULL, 0, 1, 1 };
}
