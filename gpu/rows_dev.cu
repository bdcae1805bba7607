/*
 * rows_dev.cu: the contract expert FFN of device 0's routing pairs with the group table in
 * device memory (moet_gpu_experts_devgroup, moet_gpu.h): step 2 of the CUDA-graph plan
 * (docs/hybrid.md). The host-grouped call (expert.cu -> rows.cu) passes each launch's experts,
 * pair offsets and tile offsets as kernel parameters, so its launches change with the routing;
 * here a launch per token-count class reads them from moet_gpu_group_pairs's outputs:
 *
 *   dev0_class:  | class 0: e3 e9 e40 | class 1: e7 | ... | class 5: e1 e12 |   (by id)
 *                  class_first[c], class_count[c] delimit class c; entry = (expert, first, n)
 *   table[e]:    gate, up, down data and scales of expert e (uploaded once per layer)
 *
 * and its blocks walk the class's tiles, numbered as rows.cu numbers them (expert by expert;
 * row tile, then token tile fastest):
 *   classes 0..4  every expert fits one token tile (rows_body.cuh's NOTE): tile t is expert
 *                 t / RT, row tile t % RT (RT row tiles per expert)
 *   class 5       expert k spans ceil(n_k / TB) token tiles: a block-wide exclusive scan of
 *                 them (cub, integers) once per block, then the thread whose range holds t
 *                 finds the expert
 * Block b takes tile b; the grid is the class's worst case for the batch (at most n_pairs / lo
 * experts of the class, each of at most min(hi, max_tok) pairs, n_pairs in all), so the launch
 * is fixed whatever the ids, and a block past the class's tiles exits at once. The work of a
 * tile is moet_rows_body / moet_rows_wide_body, the very code of the host-grouped kernels, so
 * every output has the same operations and bits (nothing depends on which block computes a
 * tile, or when).
 * NOTE (measured only by ptxas, not yet on a GPU): the worst case is many blocks at larger
 * batches (257 tokens: up to 384 one-token experts x the row tiles in class 0's launch, most
 * exiting at once). Blocks that loop over tiles b, b + G, .. with G one wave would avoid that,
 * but ptxas (sm_90) gave that loop 124-174 registers per thread against 64-80 for one tile
 * (the host-grouped kernels: 40-80), a quarter of the blocks per SM on the weight-streaming
 * path; so one tile per block until the H200 says otherwise.
 *
 * Passes and overlap as in expert.cu: gate_up (h = silu_c(D(gate)) * D(up), x row = the
 * pair's token) then down (y = canon(D(down, h))), the down pass's first launch a programmatic
 * dependent of the gate_up pass's last one under MOET_GPU_PDL=1. A block that computes no tile
 * still waits for the previous grid before it exits (NOTE: so the dependent grid never
 * completes before the one it depends on, and the plain launches after it stay ordered).
 * Triggers as in the host-grouped kernels (rows_kernel after its last loads, wide at exit).
 *
 * Checks on the device (err, MOET_GPU_DEVGROUP_*): classes not launched because of max_tok
 * must be empty (block 0 of the first launch looks), and a touched expert must be resident.
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "rows_int.h"
#include "rows_body.cuh"
#include "rows_wide_body.cuh"

#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#define THREADS MOET_ROWS_THREADS
#define N_CLASS MOET_ROWS_N_CLASS

static_assert(MOET_ROWS_WTHREADS == THREADS, "one block size for the tile search");
static_assert(N_CLASS == MOET_GPU_GROUP_N_CLASS, "group.cu's classes are rows.cu's");

typedef cub::BlockScan<int, THREADS, cub::BLOCK_SCAN_WARP_SCANS> tile_scan;

/* The fewest and most tokens of each class (1, 2, 3-4, 5-8, 9-16, 17+). */
static const int class_lo[N_CLASS] = { 1, 2, 3, 5, 9, 17 };
static const int class_hi[N_CLASS] = { 1, 2, 4, 8, 16, INT_MAX };

/* One launch: the group table, the class, the weights, and the job (moet_rows_args's names,
 * read by the tile bodies). */
struct dev_args {
	const moet_gpu_group_exp *cls;       /* dev0_class */
	const int32_t *class_first, *class_count;
	int cl;                              /* this launch's class */
	int one_tt;                          /* every expert of the class is one token tile */
	const moet_gpu_expert_ptrs *table;   /* [n_table], by expert id */
	int n_table;
	int m0;                              /* matrices m0 (.. m0 + 1): 0 gate_up, 2 down */
	const moet_gpu_pair *pairs;          /* x row of position q: pairs[q].pair / top_k; */
	int top_k;                           /*   pairs NULL: q (the down pass reads h) */
	int32_t *err;                        /* MOET_GPU_DEVGROUP_* flags */
	int skip_mask;                       /* classes not launched (block 0 checks them) */
	int rows, K;
	const float *x;
	long long x_stride;
	int n_x;
	float *out;
	long long out_stride;
	int vec, canon, pdl;
};

/* An expert of the table as the tile bodies' group object G. */
struct dev_group {
	const void *w0, *w1;
	const float *s0, *s1;
	int first;
	const moet_gpu_pair *pairs;
	int top_k;
	__device__ __forceinline__ const void *w(int m) const { return m ? w1 : w0; }
	__device__ __forceinline__ const float *s(int m) const { return m ? s1 : s0; }
	__device__ __forceinline__ int pair0() const { return first; }
	__device__ __forceinline__ long long src(long long q) const
	{
		return pairs ? (long long)(pairs[q].pair / top_k) : q;
	}
};

/* Finds this block's tile of the class and runs body(g, row0, tok0, n, pdl) on it, or, past
 * the class's tiles, only waits (as a dependent) and exits. */
template <int NMAT, int RB, int TB, class Body>
static __device__ __forceinline__ void dev_tile(const dev_args &a, Body body)
{
	__shared__ typename tile_scan::TempStorage scan_tmp;
	__shared__ int found[2]; /* class-5 search: the expert's index, its first token tile */
	const int tid = threadIdx.x, t = (int)blockIdx.x;
	if (a.skip_mask && t == 0 && tid == 0)
		for (int c = 0; c < N_CLASS; c++)
			if (((a.skip_mask >> c) & 1) && a.class_count[c] > 0)
				atomicOr(a.err, MOET_GPU_DEVGROUP_OVER_MAX);
	const int cnt = a.class_count[a.cl], base = a.class_first[a.cl];
	const int rt = (a.rows + RB - 1) / RB;
	int i = -1, row0 = 0, tok0 = 0;
	if (a.one_tt) {
		if (t / rt < cnt) {
			i = t / rt;
			row0 = (t % rt) * RB;
		}
	} else {
		/* thread tid's experts [i0, i0 + per), their token tiles `mine`, those before them
		 * `pre`, all of the class's n_tt */
		const int per = (cnt + THREADS - 1) / THREADS;
		const int i0 = min(cnt, tid * per), i1 = min(cnt, i0 + per), v = t / rt;
		int mine = 0, pre = 0, n_tt = 0;
		for (int k = i0; k < i1; k++)
			mine += (a.cls[base + k].n_tok + TB - 1) / TB;
		tile_scan(scan_tmp).ExclusiveSum(mine, pre, n_tt);
		if (v < n_tt) {
			if (v >= pre && v < pre + mine) {
				int k = i0, p = pre;
				for (;; k++) {
					const int nt = (a.cls[base + k].n_tok + TB - 1) / TB;
					if (v < p + nt)
						break;
					p += nt;
				}
				found[0] = k;
				found[1] = p;
			}
			__syncthreads();
			i = found[0];
			const int nt = (a.cls[base + i].n_tok + TB - 1) / TB;
			const int local = t - found[1] * rt;
			row0 = (local / nt) * RB;
			tok0 = (local % nt) * TB;
		}
	}
	const moet_gpu_group_exp ge = i >= 0 ? a.cls[base + i] : moet_gpu_group_exp{ -1, 0, 0 };
	const moet_gpu_expert_ptrs *ep =
		ge.expert >= 0 && ge.expert < a.n_table ? a.table + ge.expert : NULL;
	const void *w0 = ep ? ep->w[a.m0] : NULL;
	if (w0) {
		const dev_group g{ w0, NMAT == 2 ? ep->w[a.m0 + 1] : NULL, ep->s[a.m0],
				   NMAT == 2 ? ep->s[a.m0 + 1] : NULL, ge.first, a.pairs, a.top_k };
		body(g, row0, tok0, ge.n_tok, a.pdl);
		return;
	}
	if (i >= 0 && tid == 0)
		atomicOr(a.err, MOET_GPU_DEVGROUP_ABSENT);
	if (a.pdl & MOET_ROWS_PDL_WAIT)
		moet_grid_dep_wait();
}

template <int DT, int NMAT, int TT, int WR>
static __device__ __forceinline__ void rows_dev(const dev_args &a)
{
	using C = moet_rows_cfg<DT, NMAT, TT, WR>;
	dev_tile<NMAT, C::RB, C::TB>(a, [&](const dev_group &g, int row0, int tok0, int n,
					    int pdl) {
		moet_rows_body<DT, NMAT, TT, WR>(a, g, row0, tok0, n, pdl);
	});
}

/* NOTE: instances of 4 tokens per thread (rows_dev_kernel4) ask for 2 blocks per SM (<= 128
 * registers), what ptxas gives the host-grouped ones unasked; without it the tile search
 * pushed them to 176-184 registers (sm_90), one block per SM. The 1- and 2-token instances
 * ask nothing: any minimum (even 1) made ptxas take 94-156 registers there, against 64-80. */
template <int DT, int NMAT, int TT, int WR>
static __global__ void __launch_bounds__(THREADS)
	rows_dev_kernel(const __grid_constant__ dev_args a)
{
	rows_dev<DT, NMAT, TT, WR>(a);
}

template <int DT, int NMAT, int TT, int WR>
static __global__ void __launch_bounds__(THREADS, 2)
	rows_dev_kernel4(const __grid_constant__ dev_args a)
{
	rows_dev<DT, NMAT, TT, WR>(a);
}

template <int DT, int NMAT>
static __global__ void __launch_bounds__(MOET_ROWS_WTHREADS, MOET_ROWS_WIDE_MINB)
	rows_dev_wide_kernel(const __grid_constant__ dev_args a)
{
	using C = moet_rows_wcfg<DT, NMAT>;
	dev_tile<NMAT, C::RB, C::TB>(a, [&](const dev_group &g, int row0, int tok0, int n,
					     int pdl) {
		moet_rows_wide_body<DT, NMAT>(a, g, row0, tok0, n, pdl);
	});
}

/* Static shared memory beside the tile body's: the search's scan and `found`. */
#define SEARCH_SMEM ((int)sizeof(tile_scan::TempStorage) + 8)
static_assert(SEARCH_SMEM <= 512, "the tile search's shared memory stays small");

/* ---- host side -------------------------------------------------------------------------- */

struct dev_kernel {
	void (*fn)(dev_args);
	int smem, rb, tb, threads;
};

template <int DT, int NMAT, int TT, int WR> static dev_kernel ent(void)
{
	using C = moet_rows_cfg<DT, NMAT, TT, WR>;
	static_assert(C::SMEM + C::TB * 4 + SEARCH_SMEM <= MOET_ROWS_SM120_SMEM_MAX,
		      "sm_120: 99 KB of shared memory per block");
	if constexpr (TT == 4)
		return dev_kernel{ rows_dev_kernel4<DT, NMAT, TT, WR>, C::SMEM, C::RB, C::TB,
				   THREADS };
	else
		return dev_kernel{ rows_dev_kernel<DT, NMAT, TT, WR>, C::SMEM, C::RB, C::TB,
				   THREADS };
}

template <int DT, int NMAT> static dev_kernel went(void)
{
	using C = moet_rows_wcfg<DT, NMAT>;
	static_assert(C::SMEM + C::TB * 4 + SEARCH_SMEM <= MOET_ROWS_SM120_SMEM_MAX,
		      "sm_120: 99 KB of shared memory per block");
	return dev_kernel{ rows_dev_wide_kernel<DT, NMAT>, C::SMEM, C::RB, C::TB,
			   MOET_ROWS_WTHREADS };
}

/* The instance rows.cu's moet_rows_run would take for (dtype, nmat, class, wide). */
template <int DT, int NMAT> static dev_kernel pick_dt(int cl, bool wide)
{
	if (wide && cl >= 4)
		return went<DT, NMAT>();
	return moet_rows_by_class(cl, [](auto tt, auto wr) {
		return ent<DT, NMAT, decltype(tt)::value, decltype(wr)::value>();
	});
}

static dev_kernel pick(int dt, int nmat, int cl, bool wide)
{
	if (dt == MOET_ROWS_F8)
		return nmat == 2 ? pick_dt<MOET_ROWS_F8, 2>(cl, wide)
				 : pick_dt<MOET_ROWS_F8, 1>(cl, wide);
	return nmat == 2 ? pick_dt<MOET_ROWS_BF16, 2>(cl, wide) : pick_dt<MOET_ROWS_BF16, 1>(cl, wide);
}

/* One pass: a launch per class that can have experts (lo <= m = min(max_tok, n_pairs)). The
 * first launch checks the classes left out and is a dependent if first_pdl says so. */
static int run_pass(dev_args a, int dt, int nmat, bool wide, int64_t n_pairs, int64_t m,
		    int first_pdl, int pdl, cudaStream_t stream)
{
	int skip = 0;
	for (int cl = 0; cl < N_CLASS; cl++)
		if (class_lo[cl] > m)
			skip |= 1 << cl;
	bool first = true;
	for (int cl = 0; cl < N_CLASS; cl++) {
		if (class_lo[cl] > m)
			continue;
		const bool wd = wide && a.vec && a.K % 16 == 0 && cl >= 4;
		const dev_kernel k = pick(dt, nmat, cl, wd);
		/* NOTE: sets the limit on the current device; cheap, no sync (rows.cu does too) */
		MOET_CUDA_TRY(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
						   k.smem));
		/* the class's worst case for the batch: at most n_pairs / lo experts (and the
		 * table's), each of at most min(hi, m) pairs, all of them n_pairs */
		const int64_t cnt = n_pairs / class_lo[cl] < a.n_table ? n_pairs / class_lo[cl]
								     : a.n_table;
		const int64_t h = class_hi[cl] < m ? class_hi[cl] : m;
		const int64_t per = (h + k.tb - 1) / k.tb, all = (n_pairs + cnt * (k.tb - 1)) / k.tb;
		const int64_t rt = (a.rows + k.rb - 1) / k.rb;
		const int64_t worst = rt * (cnt * per < all ? cnt * per : all);
		a.cl = cl;
		a.one_tt = class_hi[cl] <= k.tb;
		a.skip_mask = first ? skip : 0;
		a.pdl = first ? first_pdl : pdl;
		if (worst > INT_MAX)
			return moet_err(MOET_EINVAL, "expert devgroup: %lld tiles in one launch",
					(long long)worst);
		MOET_CUDA_TRY(moet_rows_launch(k.fn, (unsigned)worst, k.threads, k.smem, stream, a,
					       a.pdl & MOET_ROWS_PDL_WAIT));
		first = false;
	}
	return 0;
}

static bool misaligned(const void *p, uintptr_t a)
{
	return ((uintptr_t)p & (a - 1)) != 0;
}

extern "C" int moet_gpu_experts_devgroup(const moet_gpu_expert_geom *geom,
					 const moet_gpu_expert_ptrs *table,
					 const moet_gpu_group_bufs *grp, int64_t n_pairs,
					 int64_t top_k, int64_t max_tok, const float *x,
					 int64_t n_x, void *scratch, size_t scratch_bytes, float *y,
					 int32_t *err, void *stream)
{
	if (!geom || !table || !grp || !grp->pairs || !grp->dev0_class || !grp->class_first ||
	    !grp->class_count || !err || misaligned(table, 8) || misaligned(grp->pairs, 8) ||
	    misaligned(grp->dev0_class, 4) || misaligned(grp->class_first, 4) ||
	    misaligned(grp->class_count, 4) || misaligned(err, 4))
		return moet_err(MOET_EINVAL, "expert devgroup: a NULL or misaligned geometry, "
				"table, group buffer or err");
	if (geom->dtype != MOET_DT_F8_E4M3 && geom->dtype != MOET_DT_BF16)
		return moet_err(MOET_EUNSUP, "expert devgroup: weight dtype %d (F8_E4M3 or BF16 "
				"only)", geom->dtype);
	const int64_t I = geom->inter, H = geom->hidden;
	if (I < 1 || H < 1 || I > INT_MAX / 2 || H > INT_MAX / 2 || geom->n_exp < 1 ||
	    geom->n_exp > MOET_GPU_GROUP_MAX_EXP)
		return moet_err(MOET_EINVAL, "expert devgroup: geometry %lldx%lld, %lld experts "
				"(1 .. %d)", (long long)I, (long long)H, (long long)geom->n_exp,
				MOET_GPU_GROUP_MAX_EXP);
	if (n_pairs < 0 || n_pairs > MOET_GPU_GROUP_MAX_PAIRS || top_k < 1 || top_k > INT_MAX ||
	    max_tok < 1)
		return moet_err(MOET_EINVAL, "expert devgroup: %lld pairs (0 .. %d), top_k %lld, "
				"max_tok %lld", (long long)n_pairs, MOET_GPU_GROUP_MAX_PAIRS,
				(long long)top_k, (long long)max_tok);
	cudaStream_t s = moet_stream(stream);
	if (n_pairs == 0) {
		MOET_CUDA_TRY(cudaMemsetAsync(err, 0, sizeof(*err), s));
		return 0;
	}
	if (!x || !y || !scratch || n_x < 1 || n_x > INT_MAX || misaligned(x, 4) ||
	    misaligned(y, 4) || misaligned(scratch, 4))
		return moet_err(MOET_EINVAL, "expert devgroup: x %p (%lld rows), y %p, scratch %p: "
				"NULL, misaligned or no rows", (const void *)x, (long long)n_x,
				(void *)y, scratch);
	if (scratch_bytes < moet_gpu_expert_scratch_bytes(n_pairs, I))
		return moet_err(MOET_EINVAL, "expert devgroup: scratch of %zu bytes, %zu needed",
				scratch_bytes, moet_gpu_expert_scratch_bytes(n_pairs, I));
	int wide = 0, pdl = 0, rc;
	if ((rc = moet_rows_variant(&wide)) || (rc = moet_rows_pdl(&pdl)))
		return rc;
	const int dt = moet_rows_dt((moet_dtype)geom->dtype);
	const int64_t m = max_tok < n_pairs ? max_tok : n_pairs;
	const int64_t hs = (I + 3) / 4 * 4; /* h row stride, as expert.cu's */
	MOET_CUDA_TRY(cudaMemsetAsync(err, 0, sizeof(*err), s));

	dev_args g = {};
	g.cls = grp->dev0_class;
	g.class_first = grp->class_first;
	g.class_count = grp->class_count;
	g.table = table;
	g.n_table = (int)geom->n_exp;
	g.err = err;
	g.m0 = 0;
	g.pairs = grp->pairs;
	g.top_k = (int)top_k;
	g.rows = (int)I;
	g.K = (int)H;
	g.x = x;
	g.x_stride = H;
	g.n_x = (int)n_x;
	g.out = (float *)scratch;
	g.out_stride = hs;
	g.vec = geom->up16 && H % 4 == 0 && !misaligned(x, 16);
	const int trig = pdl ? MOET_ROWS_PDL_TRIGGER : 0;
	if ((rc = run_pass(g, dt, 2, wide, n_pairs, m, trig, trig, s)))
		return rc;

	dev_args d = g;
	d.m0 = 2;
	d.pairs = NULL;
	d.rows = (int)H;
	d.K = (int)I;
	d.x = (const float *)scratch;
	d.x_stride = hs;
	d.n_x = (int)n_pairs;
	d.out = y;
	d.out_stride = H;
	d.vec = geom->down16 && !misaligned(scratch, 16);
	d.canon = 1;
	return run_pass(d, dt, 1, wide, n_pairs, m, pdl ? MOET_ROWS_PDL_WAIT : 0, 0, s);
}
