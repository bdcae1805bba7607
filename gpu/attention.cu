/*
 * attention.cu: causal attention of a batch of rows (tokens) on the device, each row with its
 * own KV cache and position: for row t, head h, over cached positions p = 0 .. pos[t]:
 *   s[p] = (float)(sum_d (double)q[d] * (double)k_p[d]) * scale
 *   mx = max_p s[p];  e[p] = exp_c(s[p] - mx);  sum = sum_p (double)e[p]
 *   out[d] = (float)((sum_p (double)e[p] * (double)v_p[d]) / sum)
 * with every sum in index order: exactly moet_attend_ref's operations (cpu/dense_ref.c), so
 * the outputs equal the CPU reference's bit for bit (NaN payloads aside).
 *
 * NOTE (why it is exact and batch-invariant). A binary32 x binary32 product is exact in
 * binary64, so each term is the host's; one thread adds the terms of one sum in index order
 * (the dot of one position; the softmax sum; the weighted sum of one output dimension), so each
 * rounding is the host's. The maximum is order-free (max of values; a zero's sign cannot reach
 * the output, exp_c(+-0) = 1). One block per (row, head) reads only its row's q, cache and
 * position: a row's bits never depend on the other rows, the batch size or the launch shape.
 * No atomics; repeated calls give the same bits.
 *
 * The reference kernel (attention_kernel, MOET_GPU_ATTN=ref; the default kernels below, the
 * decode one and the grouped one, do the same operations with other loads):
 * two passes over the positions in tiles of TILE: the first finds mx, the second recomputes
 * each score, e[p] into shared memory, then thread 0 extends the softmax sum and every thread
 * its output dimensions (V rows read coalesced). Paged caches (moet_gpu_pages): each tile
 * first looks up the cache rows of its positions (row[TILE] in shared memory); only where a
 * position is read changes, never the arithmetic. Recomputing the scores keeps the op free of
 * scratch memory for any context length. K tiles are staged in shared memory, rows padded by
 * one float so that the 64 threads reading 64 rows hit different banks:
 *
 *   shared:  q [d_qk]  |  K tile [TILE][d_qk + 1]  |  e [TILE]   (+ row [TILE], static)
 *
 * Cost: binary64 arithmetic (fast on the H100/H200, 1/64 rate on sm_120) and serial sums; a
 * binary32 fixed-split variant would be the fast path for long contexts, not written yet.
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <type_traits>

#define TILE 64                 /* positions per tile = threads per block */
#define ATT_MAX_D 256           /* d_qk and d_v limits */
#define DV_PER_THREAD (ATT_MAX_D / TILE)
#define SM120_SMEM_MAX (99 * 1024)

/* dynamic (q, K tile, e) + static (mx_s, row, sum_s) */
static_assert((ATT_MAX_D + TILE * (ATT_MAX_D + 1) + TILE) * 4 + TILE * (4 + 8) + 8 <=
		      SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block");

/* n_p cache rows (row[i] of base, stride floats apart) of d_n floats into dst, ts floats
 * apart, by the block's n_threads threads: a warp per row. NOTE: with a flat loop over the
 * tile's elements reading row[] per element, prefill of 1024 tokens (4-layer Kimi-K2, H200)
 * took 745 ms; this loop 538 ms (the contiguous cache before paging: 528 ms) */
static __device__ __forceinline__ void stage_rows(float *dst, int ts, const float *base,
						  const long long *row, long long stride, int n_p,
						  int d_n, int tid, int n_threads)
{
	for (int i = tid >> 5; i < n_p; i += n_threads / 32) {
		const float *src = base + row[i] * stride;
		for (int d = tid & 31; d < d_n; d += 32)
			dst[i * ts + d] = src[d];
	}
}

static __global__ void __launch_bounds__(TILE)
attention_kernel(const float *q, long long q_stride, int d_qk, int d_v, float *const *k_base,
		 float *const *v_base, long long k_pos_stride, long long v_pos_stride,
		 const int32_t *pos, const moet_gpu_pages pg, float scale, float *out,
		 long long out_stride)
{
	extern __shared__ float sm[];
	float *qs = sm, *kt = sm + d_qk, *et = kt + TILE * (d_qk + 1);
	__shared__ float mx_s[TILE];
	__shared__ long long row[TILE]; /* cache rows of the tile's positions */
	const int tid = threadIdx.x, h = blockIdx.x, t = blockIdx.y, ks = d_qk + 1;
	const int n_pos = pos[t] + 1;
	const float *kb = k_base[t] + (long long)h * d_qk;
	const float *vb = v_base[t] + (long long)h * d_v;
	for (int d = tid; d < d_qk; d += TILE)
		qs[d] = q[t * q_stride + (long long)h * d_qk + d];

	/* Scores of the tile at p0 (thread tid: position p0 + tid), or NaN past the end. */
	auto scores = [&](int p0) -> float {
		const int np = min(TILE, n_pos - p0);
		__syncthreads(); /* q staged; the previous tile is consumed */
		if (tid < np)
			row[tid] = moet_gpu_page_row(pg, t, p0 + tid);
		__syncthreads();
		stage_rows(kt, ks, kb, row, k_pos_stride, np, d_qk, tid, TILE);
		__syncthreads();
		if (tid >= np)
			return 0.0f;
		const float *kr = kt + tid * ks;
		double dot = 0.0;
		for (int d = 0; d < d_qk; d++)
			dot = dot + (double)qs[d] * (double)kr[d];
		return (float)dot * scale;
	};

	float mx = -INFINITY;
	for (int p0 = 0; p0 < n_pos; p0 += TILE) {
		float s = scores(p0);
		if (tid < n_pos - p0 && s > mx)
			mx = s;
	}
	mx_s[tid] = mx;
	__syncthreads();
	for (int i = 0; i < TILE; i++)
		if (mx_s[i] > mx)
			mx = mx_s[i];

	double sum = 0.0, acc[DV_PER_THREAD];
	for (int k = 0; k < DV_PER_THREAD; k++)
		acc[k] = 0.0;
	for (int p0 = 0; p0 < n_pos; p0 += TILE) {
		const int np = min(TILE, n_pos - p0);
		float s = scores(p0);
		if (tid < np)
			et[tid] = moet_exp_c(s - mx);
		__syncthreads();
		if (tid == 0)
			for (int pp = 0; pp < np; pp++)
				sum = sum + (double)et[pp];
		for (int pp = 0; pp < np; pp++) {
			const float *vr = vb + row[pp] * v_pos_stride;
			const double e = (double)et[pp];
#pragma unroll
			for (int k = 0; k < DV_PER_THREAD; k++) {
				const int d = tid + k * TILE;
				if (d < d_v)
					acc[k] = acc[k] + e * (double)vr[d];
			}
		}
	}
	__shared__ double sum_s;
	if (tid == 0)
		sum_s = sum;
	__syncthreads();
	sum = sum_s;
	float *o = out + t * out_stride + (long long)h * d_v;
#pragma unroll
	for (int k = 0; k < DV_PER_THREAD; k++) {
		const int d = tid + k * TILE;
		if (d < d_v)
			o[d] = (float)(acc[k] / sum);
	}
}

/*
 * The decode kernel (the default for rows without a run of GR / 2 rows of one sequence, as a
 * decode batch has): one block of DTHREADS threads per (row, head), the reference kernel's
 * operations in its order (so the same bits as attention_kernel and moet_attend_ref):
 *   scores: thread p, position p (p += DTHREADS): the binary64 dot in index order (fma: a
 *           binary32 product is exact in binary64), s = (float)dot * scale, its K row read
 *           straight from global memory, DKV float4 loads in flight; scores and cache rows of
 *           up to DKEEP positions kept in shared memory (longer contexts: chunks of DKEEP
 *           positions whose scores the second pass recomputes, as the reference always does);
 *   max:    order-free (as the reference's: a zero's sign cannot reach the output);
 *   e[p] = exp_c(s[p] - mx); the last thread adds the softmax sum in position order, thread d
 *   output d's sum in position order (fma again: e * v is exact in binary64), V rows read
 *   straight, DVV positions' loads in flight.
 * What changed against the reference kernel is who loads: its 64 threads staged each K tile
 * one dependent load at a time and read V inside the position loop, a load's latency per
 * position (0.23 ms per Kimi-K2 layer call at batch 16, 0.89 ms at 64; H200, Nsight Compute at
 * base clocks, context 64). A first version of this kernel staged K and V tiles in shared
 * memory with 256 threads and was bound by its barriers (the staging threads waiting for the
 * 64 score threads): 0.09 / 0.32 ms; this one needs no staging (docs/gpu.md has the steps).
 * shared: rows [DKEEP] (long long) | q [d_qk] | s [DKEEP]
 */
#define DTHREADS 128
#define DKEEP 1024
#define DND (ATT_MAX_D / DTHREADS) /* output dimensions per thread */
#define DKV 8 /* float4 K loads in flight per thread */
#define DVV 8 /* positions' V loads in flight per thread */

static size_t dec_smem(int d_qk)
{
	return (size_t)DKEEP * sizeof(long long) + (size_t)(d_qk + DKEEP) * sizeof(float);
}

static_assert(DKEEP * 8 + (ATT_MAX_D + DKEEP) * 4 + DTHREADS / 32 * 4 + 8 <= SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block");

/* NOTE: 6 blocks per SM on sm_90: 80 registers, no spill (uncapped: 110, 4 blocks); 4 on sm_120
 * (whose binary64 rate is 1/64 anyway), where 80 registers spilled */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define DMINB 4
#else
#define DMINB 6
#endif
static __global__ void __launch_bounds__(DTHREADS, DMINB)
attention_dec_kernel(const float *q, long long q_stride, int d_qk, int d_v,
		      float *const *k_base, float *const *v_base, long long k_pos_stride,
		      long long v_pos_stride, const int32_t *pos, const moet_gpu_pages pg,
		      float scale, float *out, long long out_stride)
{
	extern __shared__ long long smr[];
	long long *rw = smr;
	float *qs = (float *)(rw + DKEEP), *ss = qs + d_qk;
	__shared__ float mx_w[DTHREADS / 32];
	__shared__ double sum_s;
	const int tid = threadIdx.x, h = blockIdx.x, t = blockIdx.y;
	const int n_pos = pos[t] + 1;
	const bool kept = n_pos <= DKEEP;
	const float *kb = k_base[t] + (long long)h * d_qk;
	const float *vb = v_base[t] + (long long)h * d_v;
	const bool vec = d_qk % 4 == 0 && k_pos_stride % 4 == 0 && ((uintptr_t)kb & 15) == 0;
	for (int d = tid; d < d_qk; d += DTHREADS)
		qs[d] = q[t * q_stride + (long long)h * d_qk + d];
	__syncthreads();

	/* position p's score, its K row at cache row r */
	auto score = [&](long long r) -> float {
		const float *kr = kb + r * k_pos_stride;
		double dot = 0.0;
		if (vec) {
			for (int d0 = 0; d0 < d_qk; d0 += 4 * DKV) {
				float4 kv[DKV];
#pragma unroll
				for (int j = 0; j < DKV; j++)
					kv[j] = d0 + 4 * j < d_qk ? __ldg((const float4 *)(kr + d0) + j)
								  : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
				for (int j = 0; j < DKV; j++) {
					const int d = d0 + 4 * j;
					if (d < d_qk) {
						dot = __fma_rn((double)qs[d], (double)kv[j].x, dot);
						dot = __fma_rn((double)qs[d + 1], (double)kv[j].y, dot);
						dot = __fma_rn((double)qs[d + 2], (double)kv[j].z, dot);
						dot = __fma_rn((double)qs[d + 3], (double)kv[j].w, dot);
					}
				}
			}
		} else {
			for (int d0 = 0; d0 < d_qk; d0 += 16) {
				float kv[16];
#pragma unroll
				for (int j = 0; j < 16; j++)
					kv[j] = d0 + j < d_qk ? __ldg(kr + d0 + j) : 0.0f;
#pragma unroll
				for (int j = 0; j < 16; j++)
					if (d0 + j < d_qk)
						dot = __fma_rn((double)qs[d0 + j], (double)kv[j], dot);
			}
		}
		return (float)dot * scale;
	};

	float mx = -INFINITY;
	for (int p = tid; p < n_pos; p += DTHREADS) {
		const long long r = moet_gpu_page_row(pg, t, p);
		const float s = score(r);
		if (kept) {
			rw[p] = r;
			ss[p] = s;
		}
		if (s > mx)
			mx = s;
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const float x = __shfl_xor_sync(0xFFFFFFFFu, mx, o);
		if (x > mx)
			mx = x;
	}
	if ((tid & 31) == 0)
		mx_w[tid >> 5] = mx;
	__syncthreads();
	for (int i = 0; i < DTHREADS / 32; i++)
		if (mx_w[i] > mx)
			mx = mx_w[i];

	const int sum_tid = DTHREADS - 1;
	double sum = 0.0, acc[DND];
#pragma unroll
	for (int k = 0; k < DND; k++)
		acc[k] = 0.0;
	for (int c0 = 0; c0 < n_pos; c0 += DKEEP) {
		const int n_c = min(DKEEP, n_pos - c0);
		__syncthreads(); /* the previous chunk consumed (and mx_w read) */
		for (int i = tid; i < n_c; i += DTHREADS) {
			if (!kept) {
				rw[i] = moet_gpu_page_row(pg, t, c0 + i);
				ss[i] = score(rw[i]);
			}
			ss[i] = moet_exp_c(ss[i] - mx);
		}
		__syncthreads();
		if (tid == sum_tid)
			for (int i = 0; i < n_c; i++)
				sum = sum + (double)ss[i];
		for (int i0 = 0; i0 < n_c; i0 += DVV) {
			float v[DVV][DND];
#pragma unroll
			for (int j = 0; j < DVV; j++) {
				const int i = i0 + j;
				const float *vr = vb + (i < n_c ? rw[i] : 0) * v_pos_stride;
#pragma unroll
				for (int k = 0; k < DND; k++) {
					const int d = tid + k * DTHREADS;
					v[j][k] = i < n_c && d < d_v ? __ldg(vr + d) : 0.0f;
				}
			}
#pragma unroll
			for (int j = 0; j < DVV; j++)
				if (i0 + j < n_c)
#pragma unroll
					for (int k = 0; k < DND; k++)
						acc[k] = __fma_rn((double)ss[i0 + j], (double)v[j][k],
								  acc[k]);
		}
	}
	if (tid == sum_tid)
		sum_s = sum;
	__syncthreads();
#pragma unroll
	for (int k = 0; k < DND; k++) {
		const int d = tid + k * DTHREADS;
		if (d < d_v)
			out[t * out_stride + (long long)h * d_v + d] = (float)(acc[k] / sum_s);
	}
}

/*
 * The grouped kernel (MOET_GPU_ATTN=grouped, the default where a call has runs of rows of one
 * sequence, as a prefill has): one block per (head, GR consecutive rows). The rows' runs of
 * one sequence (same K and V cache, same block table: runtime/backend_cuda.c keeps one table
 * copy per sequence) are found on the device; each run is worked as one: every K and V tile
 * of the run's positions is staged once for all of its rows, instead of once per row. Per
 * (row, head) the operations are the reference kernel's, in its order (so the same bits as
 * attention_kernel and moet_attend_ref):
 *   pass 1: s[p] = (float)(binary64 dot, index order) * scale for p <= pos, mx = their max
 *           (order-free: a zero's sign cannot reach the output, see above);
 *   pass 2: the scores again, e[p] = exp_c(s[p] - mx) in shared memory, then one thread per
 *           row extends the row's sum in p order and each (row, dimension) its output sum in
 *           p order; out = (float)(acc / sum).
 * The binary64 dot and sums use fma: a product of two binary32 values is exact in binary64, so
 * fma(a, b, c) = c + a * b bit for bit (the reference's two operations).
 * Threads: scores, pair (r, p) of the tile = tid + 256 k (k < 4): row tid / 64 + 4k,
 * position tid % 64 (a thread reads each K element once for its 4 rows); outputs, chain
 * (r, d) = tid + 256 j: row (tid + 256 j) / d_v, dimension (tid + 256 j) % d_v.
 * shared: q [GR][d_qk] | tile [TILE][max(d_qk, d_v) + 1] (K, then V) | e [GR][TILE]
 */
#define GR 16      /* rows per block */
#define GTHREADS 256

/* Shared memory of the grouped kernel: e [GR][TILE] and, with QD, q [GR][d_qk] in binary64
 * (converted once, not at every use), then the tile [TILE][max(d_qk, d_v) + 1] (binary32). */
static size_t group_smem(int d_qk, int d_v, bool qd)
{
	const int dm = d_qk > d_v ? d_qk : d_v;
	return (size_t)GR * TILE * 8 + (size_t)GR * d_qk * (qd ? 8 : 4) +
	       (size_t)TILE * (dm + 1) * 4;
}

static_assert(GR * TILE == 4 * GTHREADS, "4 score pairs per thread");
static_assert(GR * TILE * 8 + GR * ATT_MAX_D * 4 + TILE * (ATT_MAX_D + 1) * 4 + TILE * 8 +
		      GR * 12 + 64 <= SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block (q in binary32 at the largest dims)");

/* CH: output chains per thread, >= GR * d_v / GTHREADS; QD: q staged in binary64.
 * NOTE (ptxas, cuobjdump --dump-resource-usage at c8bc301): Kimi-K2's instance <8, true> on
 * sm_90 takes 128 registers and no stack; <16, true> (d_v above 128) uses 152 bytes of stack on
 * sm_90, and sm_120's <8, *> 24-32 bytes (its binary64 rate is 1/64 anyway). */
template <int CH, bool QD>
static __global__ void __launch_bounds__(GTHREADS)
attention_group_kernel(const float *q, long long q_stride, int n_rows, int d_qk, int d_v,
		       float *const *k_base, float *const *v_base, long long k_pos_stride,
		       long long v_pos_stride, const int32_t *pos, const moet_gpu_pages pg,
		       float scale, float *out, long long out_stride)
{
	extern __shared__ double smd[];
	using qt = typename std::conditional<QD, double, float>::type;
	const int tid = threadIdx.x, h = blockIdx.x, t0 = blockIdx.y * GR;
	const int ts = (d_qk > d_v ? d_qk : d_v) + 1;
	double *et = smd;
	qt *qs = (qt *)(smd + GR * TILE);
	float *tile = (float *)(qs + GR * d_qk);
	__shared__ long long row[TILE];
	__shared__ float mx_r[GR];
	__shared__ double sum_r[GR];
	__shared__ int run_end;
	const int n_g = min(GR, n_rows - t0);
	/* output chains (r, d) = tid + GTHREADS j; where d_v divides GTHREADS every chain of a
	 * thread has one dimension, so each V element is read and widened once for them all */
	const bool one_d = GTHREADS % d_v == 0;

	for (int a = 0; a < n_g;) {
		/* the run of rows a .. b-1 of one sequence, mapped through row lead's table */
		if (tid == 0) {
			int b = a + 1;
			const int ta = t0 + a;
			while (b < n_g && k_base[t0 + b] == k_base[ta] &&
			       v_base[t0 + b] == v_base[ta] &&
			       (!pg.table || (pg.off[t0 + b] == pg.off[ta] &&
					      pg.shift[t0 + b] == pg.shift[ta])))
				b++;
			run_end = b;
		}
		__syncthreads();
		const int b = run_end, g = b - a;
		int lead = t0 + a, n_max = 0;
		for (int r = a; r < b; r++)
			if (pos[t0 + r] + 1 > n_max)
				n_max = pos[t0 + r] + 1, lead = t0 + r;
		const float *kb = k_base[lead] + (long long)h * d_qk;
		const float *vb = v_base[lead] + (long long)h * d_v;
		for (int i = tid; i < g * d_qk; i += GTHREADS)
			qs[i] = (qt)q[(long long)(t0 + a + i / d_qk) * q_stride + (long long)h * d_qk +
				      i % d_qk];
		const int pp = tid % TILE, rq = tid / TILE;
		int npos[4];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const int r = rq + 4 * k;
			npos[k] = r < g ? pos[t0 + a + r] + 1 : 0;
		}
		int cr[CH], cd[CH], cn[CH]; /* chain j: row, dimension, positions */
#pragma unroll
		for (int j = 0; j < CH; j++) {
			const int c = tid + GTHREADS * j;
			cr[j] = c / d_v;
			cd[j] = c % d_v;
			cn[j] = cr[j] < g ? pos[t0 + a + cr[j]] + 1 : 0;
		}

		/* the tile at p0: its cache rows, then n_p rows of K (v: V) into tile */
		auto stage = [&](int p0, int n_p, bool v) {
			__syncthreads(); /* the previous tile is consumed */
			if (!v && tid < n_p)
				row[tid] = moet_gpu_page_row(pg, lead, p0 + tid);
			if (!v)
				__syncthreads();
			if (v)
				stage_rows(tile, ts, vb, row, v_pos_stride, n_p, d_v, tid, GTHREADS);
			else
				stage_rows(tile, ts, kb, row, k_pos_stride, n_p, d_qk, tid, GTHREADS);
			__syncthreads();
		};
		/* the scores of pairs k < 4 (row rq + 4k, position p0 + pp): each K element read
		 * once for the four rows; NaN where a row has ended (or is past the run) */
		auto scores = [&](int p0, float sc[4]) {
			const float *kr = tile + pp * ts;
			double dot[4] = { 0.0, 0.0, 0.0, 0.0 };
			for (int d = 0; d < d_qk; d++) {
				const double kd = (double)kr[d];
#pragma unroll
				for (int k = 0; k < 4; k++)
					dot[k] = __fma_rn((double)qs[(rq + 4 * k) * d_qk + d], kd, dot[k]);
			}
#pragma unroll
			for (int k = 0; k < 4; k++)
				sc[k] = p0 + pp < npos[k] ? (float)dot[k] * scale
							  : __int_as_float(0x7FC00000);
		};

		float mx[4] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
		for (int p0 = 0; p0 < n_max; p0 += TILE) {
			stage(p0, min(TILE, n_max - p0), false);
			float sc[4];
			scores(p0, sc);
#pragma unroll
			for (int k = 0; k < 4; k++)
				if (sc[k] > mx[k]) /* NaN (past the row) never is */
					mx[k] = sc[k];
		}
		__syncthreads();
#pragma unroll
		for (int k = 0; k < 4; k++)
			et[(rq + 4 * k) * TILE + pp] = (double)mx[k];
		__syncthreads();
		if (tid < g) {
			double m = -INFINITY;
			for (int i = 0; i < TILE; i++)
				if (et[tid * TILE + i] > m)
					m = et[tid * TILE + i];
			mx_r[tid] = (float)m; /* a binary32 value: exact both ways */
		}
		double sum = 0.0, acc[CH];
#pragma unroll
		for (int j = 0; j < CH; j++)
			acc[j] = 0.0;
		for (int p0 = 0; p0 < n_max; p0 += TILE) {
			const int n_p = min(TILE, n_max - p0);
			stage(p0, n_p, false); /* (its first sync orders mx_r too) */
			float sc[4];
			scores(p0, sc);
#pragma unroll
			for (int k = 0; k < 4; k++) {
				const int r = rq + 4 * k;
				if (p0 + pp < npos[k])
					et[r * TILE + pp] = (double)moet_exp_c(sc[k] - mx_r[r]);
			}
			stage(p0, n_p, true);
			if (tid < g)
				for (int i = 0, ne = min(TILE, pos[t0 + a + tid] + 1 - p0); i < ne; i++)
					sum = sum + et[tid * TILE + i];
			/* each chain in position order; position-major so that one V element serves
			 * every chain of the thread */
			int ne_max = 0;
#pragma unroll
			for (int j = 0; j < CH; j++)
				ne_max = max(ne_max, min(n_p, cn[j] - p0));
			for (int i = 0; i < ne_max; i++) {
				const float *vr = tile + i * ts;
				const double v0 = (double)vr[cd[0]];
#pragma unroll
				for (int j = 0; j < CH; j++)
					if (i < cn[j] - p0)
						acc[j] = __fma_rn(et[cr[j] * TILE + i],
								  one_d ? v0 : (double)vr[cd[j]], acc[j]);
			}
		}
		if (tid < g)
			sum_r[tid] = sum;
		__syncthreads();
#pragma unroll
		for (int j = 0; j < CH; j++)
			if (cr[j] < g)
				out[(long long)(t0 + a + cr[j]) * out_stride + (long long)h * d_v +
				    cd[j]] = (float)(acc[j] / sum_r[cr[j]]);
		__syncthreads(); /* run_end, qs and sum_r are rewritten by the next run */
		a = b;
	}
}

template <int CH, bool QD> static int group_launch(dim3 grid, size_t smem, cudaStream_t st,
						   const float *q, long long q_stride, int n_rows,
						   int d_qk, int d_v, float *const *k_base,
						   float *const *v_base, long long kps, long long vps,
						   const int32_t *pos, const moet_gpu_pages &pg,
						   float scale, float *out, long long out_stride)
{
	MOET_CUDA_TRY(cudaFuncSetAttribute(attention_group_kernel<CH, QD>,
					   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	attention_group_kernel<CH, QD><<<grid, GTHREADS, smem, st>>>(
		q, q_stride, n_rows, d_qk, d_v, k_base, v_base, kps, vps, pos, pg, scale, out,
		out_stride);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

/* MOET_GPU_ATTN: 1 (grouped, the default) for the grouped kernel where the call has runs and
 * the decode kernel elsewhere, 0 (ref) for the reference kernel (attention_kernel) always. */
static int attn_grouped(int *out)
{
	static const char *const names[] = { "grouped", "ref" };
	int ref = 0, rc = moet_env_choice("MOET_GPU_ATTN", names, 2, &ref);
	*out = !ref;
	return rc;
}

extern "C" int moet_gpu_attention(const float *q, int64_t q_stride, int64_t n_rows,
				  int64_t n_heads, int64_t d_qk, int64_t d_v,
				  float *const *k_base, float *const *v_base,
				  int64_t k_pos_stride, int64_t v_pos_stride, const int32_t *pos,
				  const moet_gpu_pages *pages, int64_t run, float scale, float *out,
				  int64_t out_stride, void *stream)
{
	if (n_rows < 0 || n_rows > 65535 || n_heads < 1 || n_heads > 65535 || d_qk < 1 ||
	    d_qk > ATT_MAX_D || d_v < 1 || d_v > ATT_MAX_D)
		return moet_err(MOET_EINVAL, "attention: %lld rows (at most 65535), %lld heads, "
				"d_qk %lld, d_v %lld (at most %d)", (long long)n_rows,
				(long long)n_heads, (long long)d_qk, (long long)d_v, ATT_MAX_D);
	if (n_rows == 0)
		return 0;
	if (!q || !k_base || !v_base || !pos || !out ||
	    (pages && (!pages->table || !pages->off || !pages->shift)) ||
	    q_stride < n_heads * d_qk ||
	    out_stride < n_heads * d_v || k_pos_stride < n_heads * d_qk ||
	    v_pos_stride < n_heads * d_v)
		return moet_err(MOET_EINVAL, "attention: NULL pointer or a stride below its row (q "
				"%lld, out %lld, K %lld, V %lld)", (long long)q_stride,
				(long long)out_stride, (long long)k_pos_stride,
				(long long)v_pos_stride);
	int grouped = 0, rc = attn_grouped(&grouped);
	if (rc)
		return rc;
	const moet_gpu_pages pg = pages ? *pages : moet_gpu_pages{ NULL, NULL, NULL };
	/* NOTE: runs of fewer rows gain little from the grouped kernel, and a decode batch of
	 * distinct sequences (runs of one) would have each block work its rows one by one: they
	 * take the decode kernel */
	if (grouped && run >= GR / 2) {
		/* q in binary64 where it fits (99 KB: sm_120's limit per block) */
		const bool qd = group_smem((int)d_qk, (int)d_v, true) <= 96 * 1024;
		const size_t gsm = group_smem((int)d_qk, (int)d_v, qd);
		const int ch = (int)((GR * d_v + GTHREADS - 1) / GTHREADS);
		dim3 gg((unsigned)n_heads, (unsigned)((n_rows + GR - 1) / GR));
		cudaStream_t st = moet_stream(stream);
#define GROUP_ARGS gg, gsm, st, q, q_stride, (int)n_rows, (int)d_qk, (int)d_v, k_base, v_base, \
		   k_pos_stride, v_pos_stride, pos, pg, scale, out, out_stride
		if (ch <= 2)
			return qd ? group_launch<2, true>(GROUP_ARGS) : group_launch<2, false>(GROUP_ARGS);
		if (ch <= 4)
			return qd ? group_launch<4, true>(GROUP_ARGS) : group_launch<4, false>(GROUP_ARGS);
		if (ch <= 8)
			return qd ? group_launch<8, true>(GROUP_ARGS) : group_launch<8, false>(GROUP_ARGS);
		return qd ? group_launch<16, true>(GROUP_ARGS) : group_launch<16, false>(GROUP_ARGS);
#undef GROUP_ARGS
	}
	if (grouped) { /* the decode kernel (above) */
		const size_t dsm = dec_smem((int)d_qk);
		MOET_CUDA_TRY(cudaFuncSetAttribute(attention_dec_kernel,
						   cudaFuncAttributeMaxDynamicSharedMemorySize,
						   (int)dsm));
		dim3 grid((unsigned)n_heads, (unsigned)n_rows);
		attention_dec_kernel<<<grid, DTHREADS, dsm, moet_stream(stream)>>>(
			q, q_stride, (int)d_qk, (int)d_v, k_base, v_base, k_pos_stride, v_pos_stride,
			pos, pg, scale, out, out_stride);
		MOET_CUDA_TRY(cudaGetLastError());
		return 0;
	}
	const size_t smem = (size_t)(d_qk + TILE * (d_qk + 1) + TILE) * sizeof(float);
	MOET_CUDA_TRY(cudaFuncSetAttribute(attention_kernel,
					   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	dim3 grid((unsigned)n_heads, (unsigned)n_rows);
	attention_kernel<<<grid, TILE, smem, moet_stream(stream)>>>(
		q, q_stride, (int)d_qk, (int)d_v, k_base, v_base, k_pos_stride, v_pos_stride, pos,
		pg, scale, out, out_stride);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
