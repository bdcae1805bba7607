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
 * run together and read the weights from DRAM once. The work of one tile is moet_rows_body
 * (rows_body.cuh), which the device-grouped kernels of rows_dev.cu run too.
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
#include "rows_body.cuh"

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
#define DT_F8 MOET_ROWS_F8
#define DT_BF16 MOET_ROWS_BF16
#define DT_F32 MOET_ROWS_F32

typedef moet_rows_args pass_args;

/* The tile: expert e (last with tile0[e] <= blockIdx.x), then token tile fastest. */
template <int DT, int NMAT, int TT, int WR>
static __global__ void __launch_bounds__(THREADS) rows_kernel(const __grid_constant__ pass_args a)
{
	using C = moet_rows_cfg<DT, NMAT, TT, WR>;
	int e, row0, tok0;
	moet_rows_tile(a, blockIdx.x, C::RB, C::TB, &e, &row0, &tok0);
	moet_rows_body<DT, NMAT, TT, WR>(a, moet_rows_param_group{ a, e }, row0, tok0, a.n[e],
					 a.pdl);
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

/* Device attributes per device, + 1 (0: not asked yet): the compute capability's major and
 * the SM count. NOTE: caches, the mutable statics of the row machinery: the properties cannot
 * change while the process runs, racing writers store the same value, accesses are atomic.
 * Devices past PDL_DEV_MAX ask each call. */
static int cc_major_p1[PDL_DEV_MAX], sm_count_p1[PDL_DEV_MAX];

static int dev_attr(cudaDeviceAttr attr, int *cache_p1, int *out)
{
	int dev = 0, v = 0;
	MOET_CUDA_TRY(cudaGetDevice(&dev));
	const bool cached = dev >= 0 && dev < PDL_DEV_MAX;
	if (cached && (v = __atomic_load_n(&cache_p1[dev], __ATOMIC_RELAXED)) > 0) {
		*out = v - 1;
		return 0;
	}
	MOET_CUDA_TRY(cudaDeviceGetAttribute(&v, attr, dev));
	if (cached)
		__atomic_store_n(&cache_p1[dev], v + 1, __ATOMIC_RELAXED);
	*out = v;
	return 0;
}

static int cc_major(int *out_major)
{
	return dev_attr(cudaDevAttrComputeCapabilityMajor, cc_major_p1, out_major);
}

int moet_rows_sm_count(int *out)
{
	return dev_attr(cudaDevAttrMultiProcessorCount, sm_count_p1, out);
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
	using C = moet_rows_cfg<DT, NMAT, TT, WR>;
	return kernel_ent{ rows_kernel<DT, NMAT, TT, WR>, C::SMEM, C::RB, C::TB, THREADS };
}

template <int DT, int NMAT> static kernel_ent class_ent(int cl)
{
	return moet_rows_by_class(cl, [](auto tt, auto wr) {
		return ent<DT, NMAT, decltype(tt)::value, decltype(wr)::value>();
	});
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

/*
 * Whether the job's groups of 2 tokens run as two 1-token tiles (class 0's instance) instead of
 * class 1's. NOTE (why): F8 single-matrix tiles at 2 tokens are 256 rows (moet_rows_cfg: best
 * for the down passes of 8 experts, 224 blocks), so a launch of few such groups (a dense linear,
 * one expert's down pass) gets few blocks: a 7168-row o_proj 28 on the H200's 132 SMs, 99 us
 * per call against 50 at one token (record 2026-12-01-linear-ks-h200-892564f.txt). With fewer
 * class-1 tiles than SMs each such group takes 64-row tiles of one token instead (o_proj: 224
 * blocks; the second token's weight bytes come mostly from L2): the same arithmetic per (row,
 * token), the same bits. The default variant only (job->wide); the reference keeps its classes.
 */
static int split2_wanted(const moet_rows_job *job, moet_rows_get_fn get, const void *ctx,
			 int64_t n_groups, int *out)
{
	*out = 0;
	if (!job->wide || job->dt != DT_F8 || job->nmat != 1)
		return 0;
	const kernel_ent k1 = pick(job->dt, 1, 1), k0 = pick(job->dt, 1, 0);
	if (!k1.fn || !k0.fn || k1.rb <= k0.rb)
		return 0;
	long long tiles = 0;
	for (int64_t g = 0; g < n_groups; g++) {
		moet_rows_group gr = {};
		get(ctx, g, &gr);
		if (gr.n == 2)
			tiles += (job->rows + k1.rb - 1) / k1.rb;
	}
	int sms = 0, rc = tiles > 0 ? moet_rows_sm_count(&sms) : 0;
	*out = !rc && tiles > 0 && tiles < sms;
	return rc;
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
	int split2 = 0, rc = split2_wanted(job, get, ctx, n_groups, &split2);
	if (rc)
		return rc;
	for (int cl = 0; cl < N_CLASS; cl++) {
		kernel_ent k = pick(job->dt, job->nmat, cl);
		if (job->wide && job->vec && job->dt != DT_F32 && job->K % 16 == 0 && cl >= 3) {
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
			bool take = g < n_groups && gr.n > 0 &&
				    (split2 && gr.n == 2 ? 0 : class_of(gr.n)) == cl;
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
				MOET_CUDA_TRY(moet_rows_launch(k.fn, (unsigned)tiles, k.threads,
							       k.smem, stream, a,
							       a.pdl & MOET_ROWS_PDL_WAIT));
				a.n_exp = 0;
				tiles = 0;
			}
		}
	}
	return 0;
}
