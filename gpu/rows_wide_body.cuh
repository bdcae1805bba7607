/*
 * rows_wide_body.cuh: the work of one tile of rows_wide_kernel (gpu/rows_wide.cu) as a device
 * function, shared by the host-grouped kernel there and the device-grouped one of rows_dev.cu,
 * as rows_body.cuh does for rows_kernel (its conventions: the group object G, the job object
 * A, the tile, the PDL bits). The mapping onto threads and why it is exact: rows_wide.cu.
 *
 * CUDA files of gpu/ only; include after rows_int.h.
 */
#ifndef MOET_GPU_ROWS_WIDE_BODY_CUH
#define MOET_GPU_ROWS_WIDE_BODY_CUH

#include "rows_body.cuh"

#define MOET_ROWS_WTHREADS 256
#ifndef MOET_ROWS_WIDE_NS
#define MOET_ROWS_WIDE_NS 4 /* raw stages in flight, at most (as many as fit 96 KB) */
#endif
/* Blocks per SM for __launch_bounds__: two on sm_90 (128 registers); one on sm_120, whose 100 KB
 * of shared memory per SM holds one block anyway (there a cap of 128 registers only spilled). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define MOET_ROWS_WIDE_MINB 1
#else
#define MOET_ROWS_WIDE_MINB 2
#endif
/* Rows per thread of the register tile (x 4 tokens): 8 (the default: a half-warp per contract
 * lane, 3 LDS.128 per 32 fmas) or 4 (the whole warp on one lane at a time, two lanes one after
 * the other, 2 LDS.128 per 16 fmas). Same bits either way (rows_wide.cu). */
#ifndef MOET_ROWS_WIDE_TR
#define MOET_ROWS_WIDE_TR 8
#endif
/* Decoded weights in shared memory as 16-bit values (1, the default: binary16 for F8_E4M3,
 * which holds every e4m3fn value exactly, the raw bits for BF16), two rows per 32-bit word,
 * widened to binary32 in the step; or as binary32 (0, the layout before). Same bits either way
 * (rows_wide.cu says why). TR 8 only. */
#ifndef MOET_ROWS_WIDE_W16
#define MOET_ROWS_WIDE_W16 1
#endif

/* TBV: tokens per tile, 16 (9+ tokens per group) or 8 (5-8: the 16-bit layout only); the
 * tile is 512 / TBV virtual rows, so that a half-warp's 16 threads of 8 x 4 dots cover it. */
template <int DT, int NMAT, int TBV = 16> struct moet_rows_wcfg {
	static constexpr int TB = TBV;                    /* tokens per tile */
	static constexpr int VR = 512 / TB;               /* virtual rows per tile: 32 or 64 */
	static constexpr int RB = VR / NMAT;              /* output rows per tile */
	static constexpr int ESZ = DT == MOET_ROWS_F8 ? 1 : 2;
	static constexpr int TR = MOET_ROWS_WIDE_TR;      /* rows per thread */
	static constexpr bool W16 = MOET_ROWS_WIDE_W16 != 0 && TR == 8;
	static_assert(TB == 16 || (TB == 8 && W16), "8-token tiles: the 16-bit layout only");
	/* 4-byte words per (lane, step) in wf: 32 binary32 rows, or (W16) VR / 2 words, word i
	 * holding virtual rows i (low half) and i + VR / 2 (high half) */
	static constexpr int WS = W16 ? VR / 2 : VR;
	/* Lanes 8..15 of wf / xf start WP / XP words later: the two half-warps (lanes w and
	 * w + 8) then read disjoint banks in one LDS.128 (TR 8 only); at W16 the decode's
	 * stores of lanes q and q + 8 by one warp fall in disjoint banks. */
	static constexpr int WP = TR == 8 ? (W16 ? 16 : 4) : 0, XP = TR == 8 ? 16 : 0;
	static constexpr int WF = 16 * 8 * WS + WP;       /* words of wf */
	static constexpr int XF = 16 * 8 * TB + XP;       /* floats of xf */
	static constexpr int DEC = (WF + XF) * 4;         /* bytes of the decoded chunk */
	static constexpr int WRS = 128 * ESZ + 16;        /* bytes per raw weight row */
	static constexpr int XRS = 128 + 4;               /* floats per raw activation row */
	static constexpr int STAGE = VR * WRS + TB * XRS * 4;
	static constexpr int RS = VR + 1;                 /* floats per (lane pair, token) in red */
	static constexpr int RED = 8 * TB * RS * 4;
	static constexpr int NS_FIT = (MOET_ROWS_SMEM_BUDGET - 2 * DEC) / STAGE;
	static constexpr int NS = MOET_ROWS_WIDE_NS < NS_FIT ? MOET_ROWS_WIDE_NS : NS_FIT;
	static constexpr int SMEM = 2 * DEC + NS * STAGE; /* 2 decoded chunks */
	static_assert(NS >= 2, "at least two raw stages");
	static_assert(TR == 4 || TR == 8, "4 or 8 rows per thread");
	static_assert(RED <= 2 * DEC, "the tree's table fits in the decoded chunks");
	static_assert((VR * WRS) % 16 == 0 && DEC % 16 == 0 && STAGE % 16 == 0, "16-byte stages");
	static_assert(TB * 8 <= MOET_ROWS_WTHREADS, "one activation unit per thread at most");
	static_assert(SMEM + TB * 4 <= MOET_ROWS_SM120_SMEM_MAX,
		      "sm_120: 99 KB of shared memory per block");
};

static __device__ __forceinline__ uint32_t moet_rows_word_of(const uint4 &v, int i)
{
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* One tile of rows_wide_kernel (rows_body.cuh says what A, G, the tile and pdl are; the
 * mapping is at the top of rows_wide.cu). Every thread of the block calls it with the same
 * tile; a caller that runs a second tile syncs first. */
template <int DT, int NMAT, int TBV = 16, class A, class G>
static __device__ __forceinline__ void moet_rows_wide_body(const A &a, const G &g, int row0,
							   int tok0, int n_e, int pdl)
{
	using C = moet_rows_wcfg<DT, NMAT, TBV>;
	constexpr int WTHREADS = MOET_ROWS_WTHREADS, NS = C::NS;
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ int xrow_s[C::TB];

	constexpr int TR = C::TR, NL = TR == 4 ? 2 : 1; /* lanes per thread, in turn */
	const int tid = threadIdx.x, li = tid & 31, w = tid >> 5;
	/* thread: rows TR*rt .. TR*rt+TR-1 (W16: vrow below), tokens 4tt .. 4tt+3, lanes
	 * w + 8(hh + h), h < NL; at TR 8 a half-warp is VR / 8 row groups x TB / 4 token groups */
	constexpr int RTN = TR == 8 ? C::VR / 8 : 8;
	const int rt = li % RTN, tt = (li / RTN) % (C::TB / 4), hh = TR == 8 ? li >> 4 : 0;
	const int n_rows = min(C::RB, a.rows - row0), n_toks = min(C::TB, n_e - tok0);
	const int K = a.K, n_chunk = (K + 127) / 128;

	/* NOTE: as a programmatic dependent (rows_int.h) this variant waits before its first load;
	 * it never triggers early (its dependents start as its blocks exit). At 9+ tokens the
	 * work is the fmas, so there is little to overlap. */
	if (pdl & MOET_ROWS_PDL_WAIT)
		moet_grid_dep_wait();
	moet_rows_stage_xrows<C::TB>(a, g, tok0, n_toks, tid, xrow_s);

	unsigned char *const raw = smem + 2 * C::DEC;

	/* Raw stage st <- chunk c: weight rows (16-byte pieces, zero-filled past the last row or
	 * column) and activation rows (zero-filled for tokens past the tile or out of range).
	 * NOTE: each thread's pieces are fixed for the tile (NWP weight pieces, NXP activation
	 * pieces, fixed trip counts); their source rows are found once here, so a chunk's fetch
	 * is a few adds per piece (per-chunk address work was a fifth of the loop's issue). */
	constexpr int PPR = 128 * C::ESZ / 16; /* pieces per weight row */
	constexpr int NWP = C::VR * PPR / WTHREADS, NXP = C::TB * 32 / WTHREADS;
	static_assert(NWP * WTHREADS == C::VR * PPR && NXP * WTHREADS == C::TB * 32,
		      "whole pieces per thread");
	const unsigned char *wsrc[NWP];
	bool wrow_ok[NWP];
#pragma unroll
	for (int i = 0; i < NWP; i++) {
		const int p = tid + i * WTHREADS, vr = p / PPR, q = p % PPR;
		const int m = NMAT == 2 ? vr / C::RB : 0;
		const int row = row0 + (NMAT == 2 ? vr % C::RB : vr);
		wrow_ok[i] = row < a.rows;
		wsrc[i] = (const unsigned char *)g.w(m) +
			  (wrow_ok[i] ? (size_t)row * K * C::ESZ + q * 16 : 0);
	}
	/* a piece not read (past the last row, or a token out of range) points into row 0, so
	 * that any chunk's offset added to it stays inside the matrix */
	const float *xsrc[NXP];
	bool xrow_ok[NXP];
#pragma unroll
	for (int i = 0; i < NXP; i++) {
		const int xr = xrow_s[(tid + i * WTHREADS) >> 5], q = tid & 31;
		xrow_ok[i] = xr >= 0;
		xsrc[i] = a.x + (xr >= 0 ? (long long)xr * a.x_stride : 0) + q * 4;
	}
	auto fetch = [&](int c, int st) {
		unsigned char *ws = raw + st * C::STAGE;
		float *xs = (float *)(ws + C::VR * C::WRS);
		const int kc0 = c * 128, kcols = min(128, K - kc0);
		if (kcols == 128) { /* every chunk but a partial last one: no column checks */
#pragma unroll
			for (int i = 0; i < NWP; i++) {
				const int p = tid + i * WTHREADS, vr = p / PPR, q = p % PPR;
				moet_cp_async16z(ws + vr * C::WRS + q * 16,
						 wsrc[i] + (size_t)kc0 * C::ESZ, wrow_ok[i]);
			}
#pragma unroll
			for (int i = 0; i < NXP; i++) {
				const int p = tid + i * WTHREADS, xi = p >> 5, q = p & 31;
				moet_cp_async16z(xs + xi * C::XRS + q * 4, xsrc[i] + kc0,
						 xrow_ok[i]);
			}
			moet_cp_async_commit();
			return;
		}
#pragma unroll
		for (int i = 0; i < NWP; i++) {
			const int p = tid + i * WTHREADS, vr = p / PPR, q = p % PPR;
			const bool ok = wrow_ok[i] && q * 16 < kcols * C::ESZ;
			moet_cp_async16z(ws + vr * C::WRS + q * 16,
					 ok ? wsrc[i] + (size_t)kc0 * C::ESZ : wsrc[i], ok);
		}
#pragma unroll
		for (int i = 0; i < NXP; i++) {
			const int p = tid + i * WTHREADS, xi = p >> 5, q = p & 31;
			const bool ok = xrow_ok[i] && q * 4 < kcols;
			moet_cp_async16z(xs + xi * C::XRS + q * 4, ok ? xsrc[i] + kc0 : a.x, ok);
		}
		moet_cp_async_commit();
	};

	/* Decode raw stage st into decoded buffer b (wf, then xf): weights unit (virtual row dv,
	 * step dt: 16 columns, one per lane; a warp stores 32 consecutive rows, so wf needs no
	 * padding), activations unit (token xt, step xst). */
	const int dv = li, dt = w;
	const int xt = tid % C::TB, xst = tid / C::TB;
	/* W16: thread (j, gb) of warp w pairs virtual rows j and j + VR / 2 at columns 16w + 8gb ..
	 * 16w + 8gb + 7 (step w, lanes 8gb .. 8gb + 7), for j = pj + 16 pp (VR / 32 of them); a
	 * half-warp's raw loads (rows j of 8, two column halves) then cover the 32 banks once. */
	const int pj = (li & 7) | ((li >> 4) << 3), pgb = (li >> 3) & 1;
	auto decode = [&](int st, int b) {
		const unsigned char *ws = raw + st * C::STAGE;
		float *const wf = (float *)(smem + b * C::DEC), *const xf = wf + C::WF;
		const float *xs = (const float *)(ws + C::VR * C::WRS);
		if constexpr (C::W16) {
#pragma unroll
			for (int pp = 0; pp < C::VR / 32; pp++) {
				const int j = pj + 16 * pp;
				const unsigned char *ra = ws + j * C::WRS + (16 * w + 8 * pgb) * C::ESZ;
				const unsigned char *rb = ra + (C::VR / 2) * C::WRS;
				/* word of lane 8pgb + q: wd[q * 8 * WS] */
				uint32_t *wd = (uint32_t *)wf + (8 * pgb * 8 + w) * C::WS + pgb * C::WP + j;
				if constexpr (DT == MOET_ROWS_F8) {
					const uint2 ua = *(const uint2 *)ra, ub = *(const uint2 *)rb;
#pragma unroll
					for (int i = 0; i < 2; i++) {
						const uint32_t x = i ? ua.y : ua.x, y = i ? ub.y : ub.x;
						/* bytes (a0 b0 a1 b1), (a2 b2 a3 b3): e4m3x2 pairs, row j low */
						const uint32_t lo = __byte_perm(x, y, 0x5140);
						const uint32_t hi = __byte_perm(x, y, 0x7362);
						wd[(4 * i + 0) * 8 * C::WS] = moet_f8x2_to_h2(lo & 0xFFFFu);
						wd[(4 * i + 1) * 8 * C::WS] = moet_f8x2_to_h2(lo >> 16);
						wd[(4 * i + 2) * 8 * C::WS] = moet_f8x2_to_h2(hi & 0xFFFFu);
						wd[(4 * i + 3) * 8 * C::WS] = moet_f8x2_to_h2(hi >> 16);
					}
				} else {
					const uint4 ua = *(const uint4 *)ra, ub = *(const uint4 *)rb;
#pragma unroll
					for (int i = 0; i < 4; i++) {
						const uint32_t x = moet_rows_word_of(ua, i);
						const uint32_t y = moet_rows_word_of(ub, i);
						wd[(2 * i) * 8 * C::WS] = __byte_perm(x, y, 0x5410);
						wd[(2 * i + 1) * 8 * C::WS] = __byte_perm(x, y, 0x7632);
					}
				}
			}
		} else if constexpr (DT == MOET_ROWS_F8) {
			float *d = wf + dt * C::WS + dv;
			const uint4 u = *(const uint4 *)(ws + dv * C::WRS + 16 * dt * C::ESZ);
#pragma unroll
			for (int i = 0; i < 4; i++) {
				float v[4];
				moet_dec4_f8(moet_rows_word_of(u, i), v);
#pragma unroll
				for (int q = 0; q < 4; q++)
					d[(4 * i + q) * 8 * C::WS + (i >= 2 ? C::WP : 0)] = v[q];
			}
		} else {
			float *d = wf + dt * C::WS + dv;
			const uint4 *src = (const uint4 *)(ws + dv * C::WRS + 16 * dt * C::ESZ);
			const uint4 u[2] = { src[0], src[1] };
#pragma unroll
			for (int i = 0; i < 8; i++) {
				uint32_t b = moet_rows_word_of(u[i >> 2], i & 3);
				const int o = i >= 4 ? C::WP : 0;
				d[(2 * i) * 8 * C::WS + o] = __uint_as_float(b << 16);
				d[(2 * i + 1) * 8 * C::WS + o] = __uint_as_float(b & 0xFFFF0000u);
			}
		}
		if (tid < C::TB * 8) {
			const float4 *xsrc = (const float4 *)(xs + xt * C::XRS + 16 * xst);
			float *xd = xf + xst * C::TB + xt;
#pragma unroll
			for (int q = 0; q < 4; q++) {
				const float4 v = xsrc[q];
				const int o = q >= 2 ? C::XP : 0;
				xd[(4 * q + 0) * 8 * C::TB + o] = v.x;
				xd[(4 * q + 1) * 8 * C::TB + o] = v.y;
				xd[(4 * q + 2) * 8 * C::TB + o] = v.z;
				xd[(4 * q + 3) * 8 * C::TB + o] = v.w;
			}
		}
	};

	/* My scales: virtual rows TR*rt .. TR*rt+TR-1 are of one matrix (NMAT 2 splits at 16);
	 * at W16 my rows are 4rt .. 4rt+3 (i < 4) and VR/2+4rt .. VR/2+4rt+3 (i >= 4): at NMAT 2 the
	 * gate and the up rows of the same outputs, scale sp0 and sp1. A tile lies in one 128-row
	 * block of the scales. */
	const int mm = C::W16 ? 0 : NMAT == 2 ? (TR * rt >= 16) : 0;
	const int srow = C::W16 ? row0 : row0 + (NMAT == 2 ? (TR * rt) & 15 : TR * rt);
	const float *sp = g.s(mm), *sp1 = C::W16 && NMAT == 2 ? g.s(1) : sp;
	const bool has_s = sp && srow < a.rows, has_s1 = sp1 && srow < a.rows;
	if (has_s)
		sp += (size_t)(srow / 128) * n_chunk;
	if (has_s1)
		sp1 += (size_t)(srow / 128) * n_chunk;
	/* the virtual row of my tile's row i */
	auto vrow = [&](int i) {
		return C::W16 ? 4 * rt + (i & 3) + (C::VR / 2) * (i >> 2) : TR * rt + i;
	};

	/* NOTE: p is live only inside a chunk, so at TR 4 the thread runs its two lanes one after
	 * the other (8 steps of lane w, its fold, then lane w + 8): one p tile instead of two. */
	float p[TR][4], acc[NL][TR][4];
#pragma unroll
	for (int h = 0; h < NL; h++)
#pragma unroll
		for (int i = 0; i < TR; i++)
#pragma unroll
			for (int j = 0; j < 4; j++)
				acc[h][i][j] = 0.0f;

	/* Step t of lane w + 8(hh + h). */
	auto step = [&](const float *wf, int h, int t) {
		const float *xf = wf + C::WF;
		const int ln = w + 8 * (hh + h), hi = hh + h;
		const float4 x4 = *(const float4 *)(xf + (ln * 8 + t) * C::TB + hi * C::XP + 4 * tt);
		float wr[TR];
		if constexpr (C::W16) {
			const uint4 u4 = *(const uint4 *)(wf + (ln * 8 + t) * C::WS + hi * C::WP + 4 * rt);
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const uint32_t u = moet_rows_word_of(u4, i);
				if constexpr (DT == MOET_ROWS_F8) {
					wr[i] = moet_h_to_f32((unsigned short)(u & 0xFFFFu));
					wr[i + 4] = moet_h_to_f32((unsigned short)(u >> 16));
				} else {
					wr[i] = __uint_as_float(u << 16);
					wr[i + 4] = __uint_as_float(u & 0xFFFF0000u);
				}
			}
		} else {
			const float *wl = wf + (ln * 8 + t) * C::WS + hi * C::WP + TR * rt;
#pragma unroll
			for (int i = 0; i < TR; i += 4) {
				const float4 w4 = *(const float4 *)(wl + i);
				wr[i] = w4.x, wr[i + 1] = w4.y, wr[i + 2] = w4.z, wr[i + 3] = w4.w;
			}
		}
		const float xv[4] = { x4.x, x4.y, x4.z, x4.w };
#pragma unroll
		for (int i = 0; i < TR; i++)
#pragma unroll
			for (int j = 0; j < 4; j++)
				p[i][j] = fmaf(wr[i], xv[j], p[i][j]);
	};

	/* NOTE (the pipeline). NS raw stages and two decoded chunks: iteration c waits for raw
	 * chunk c+1, syncs, fetches chunk c+NS into the stage chunk c left (decoded in iteration
	 * c-1), decodes chunk c+1 into buffer (c+1)%2 (its last readers computed chunk c-1, before
	 * the sync) and computes chunk c from buffer c%2 (decoded before the sync). One barrier
	 * per chunk; a warp's decode overlaps the other warps' fmas. */
#pragma unroll
	for (int st = 0; st < NS; st++) {
		if (st < n_chunk)
			fetch(st, st);
		else
			moet_cp_async_commit();
	}
	moet_cp_async_wait<NS - 1>();
	__syncthreads(); /* raw chunk 0 landed for all */
	decode(0, 0);
	for (int c = 0; c < n_chunk; c++) {
		moet_cp_async_wait<NS - 2>();
		__syncthreads(); /* raw chunk c+1 landed, decoded chunk c visible, buffer (c+1)%2 free */
		if (c + NS < n_chunk)
			fetch(c + NS, c % NS);
		else
			moet_cp_async_commit();
		const float sc = has_s ? __ldg(sp + c) : 1.0f;
		const float sc1 = NMAT == 2 && C::W16 ? (has_s1 ? __ldg(sp1 + c) : 1.0f) : sc;
		if (c + 1 < n_chunk)
			decode((c + 1) % NS, (c + 1) & 1);
		const float *const wfc = (const float *)(smem + (c & 1) * C::DEC);
		const int kcols = min(128, K - c * 128);
#pragma unroll
		for (int h = 0; h < NL; h++) {
#pragma unroll
			for (int i = 0; i < TR; i++)
#pragma unroll
				for (int j = 0; j < 4; j++)
					p[i][j] = 0.0f;
			if (kcols == 128) {
#pragma unroll
				for (int t = 0; t < 8; t++)
					step(wfc, h, t);
			} else {
				for (int t = 0; t < 8; t++)
					if (16 * t + w + 8 * (hh + h) < kcols)
						step(wfc, h, t);
			}
#pragma unroll
			for (int i = 0; i < TR; i++)
#pragma unroll
				for (int j = 0; j < 4; j++)
					acc[h][i][j] = fmaf(p[i][j], i >= 4 ? sc1 : sc, acc[h][i][j]);
		}
	}
	moet_cp_async_wait<0>();
	__syncthreads(); /* every warp is done with wf / xf */

	/* The tree's first level: q[w] = acc[w] + acc[w + 8], in the thread at TR 4; at TR 8
	 * through the other half-warp (half hh writes rows 8rt+4hh .. 8rt+4hh+3). */
	float *red = (float *)smem;
#pragma unroll
	for (int i = 0; i < TR; i++)
#pragma unroll
		for (int j = 0; j < 4; j++) {
			float *r = &red[(w * C::TB + 4 * tt + j) * C::RS + vrow(i)];
			if constexpr (TR == 4) {
				*r = acc[0][i][j] + acc[NL - 1][i][j];
			} else {
				const float o = __shfl_xor_sync(0xFFFFFFFFu, acc[0][i][j], 16);
				if ((i >> 2) == hh)
					*r = acc[0][i][j] + o; /* a + b == b + a, exactly */
			}
		}
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
				v = moet_silu_c(tree(tl, r)) * tree(tl, C::RB + r);
			else
				v = a.canon ? moet_canon_nan(tree(tl, r)) : tree(tl, r);
			long long pair = (long long)g.pair0() + tok0 + tl;
			a.out[pair * a.out_stride + row0 + r] = v;
		}
	}
}

#endif
