/*
 * group.cu: the grouping of a MoE layer's routing pairs on the device, element for element
 * what runtime/dispatch.c does on the host after downloading the ids (staging off): step 1 of
 * the CUDA-graph plan (docs/cuda-graphs.md), so that a captured step needs no host decision here.
 *
 * The result (moet_gpu.h, moet_gpu_group_pairs), for tiers t = device 0 .. n_dev-1, CPU:
 *
 *   pairs:  | dev 0: e0 p.. e0 p.. e3 p.. | dev 1: e1 p.. e5 p.. | ... | CPU: e2 p.. e4 p.. |
 *           each tier's experts ascending, each expert's pairs by ascending pair index
 *   slot[p] = the position of pair p above (the y row the combine reads)
 *
 * The position of pair p (expert e, in chunk c of CHUNK consecutive pairs) is
 *
 *   tier_first[t(e)] + (pairs of the tier's experts below e) + (pairs of e in chunks < c)
 *                    + (pairs of e in chunk c before p)
 *
 * computed by three kernels:
 *   count_kernel    one warp per chunk: hist[c][e] = pairs of e in chunk c (and the chunk's
 *                   smallest pair with a bad id)
 *   plan_kernel     one block of PLAN_THREADS: per expert the column prefix over chunks, the
 *                   tiers' block-wide scans (expert start positions, tier_first/count), the
 *                   device 0 lists (by id, and by token-count class), the error report;
 *                   hist[c][e] becomes the position of e's first pair in chunk c (-1: its
 *                   owner is bad)
 *   scatter_kernel  one warp per chunk walks its pairs in order, 32 at a time: the lanes with
 *                   one expert find each other (__match_any_sync), each takes base + (its
 *                   peers in lower lanes), the highest peer advances the base
 *
 * NOTE: deterministic by construction: every number is an integer count or sum (exact in any
 * order), and the order within an expert comes from the warp's in-order walk, never from which
 * thread wins an atomic. The only atomic (atomicMin of the smallest bad expert) has one result
 * whatever the order.
 *
 * Scratch (moet_gpu_group_scratch_bytes), each part 256-byte aligned:
 *   hist      [n_chunks][n_exp] int32
 *   first_bad [n_chunks] int32   (INT_MAX: none)
 * Limits: n_pairs <= MOET_GPU_GROUP_MAX_PAIRS (positions fit int32 with room), n_exp <=
 * MOET_GPU_GROUP_MAX_EXP (the plan kernel's shared tables), n_dev <= MOET_GPU_GROUP_MAX_DEV.
 */
#include "moet_gpu.h"

#include "gpu_int.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#define CHUNK 1024        /* pairs per warp of count_kernel and scatter_kernel */
#define PLAN_THREADS 1024 /* plan_kernel's one block: 32 full warps */
#define N_CLASS MOET_GPU_GROUP_N_CLASS
#define MAX_EXP MOET_GPU_GROUP_MAX_EXP
#define FULL 0xFFFFFFFFu

static_assert(CHUNK % 32 == 0, "chunks of whole warp rounds");
static_assert(PLAN_THREADS == 1024, "block_excl_scan takes 32 warps");
static_assert(MOET_GPU_GROUP_MAX_DEV < 127, "tiers stored as signed char");
/* plan_kernel's static shared memory: cnt, base, tier, scan and min words */
static_assert(MAX_EXP * (4 + 4 + 1) + 32 * 4 + 16 <= 48 * 1024, "static shared memory (48 KB)");
static_assert(sizeof(moet_gpu_pair) == 16 && sizeof(moet_gpu_group_exp) == 12, "layouts");

static size_t align256(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

/* Token-count classes of gpu/rows.cu's class_of: 1, 2, 3-4, 5-8, 9-16, 17+. */
static __device__ __forceinline__ int class_of(int n)
{
	return n <= 1 ? 0 : n == 2 ? 1 : n <= 4 ? 2 : n <= 8 ? 3 : n <= 16 ? 4 : 5;
}

/* ---- per chunk: counts ------------------------------------------------------------------- */

static __global__ void __launch_bounds__(32)
count_kernel(const int32_t *ids, int P, int E, int32_t *hist, int32_t *first_bad)
{
	extern __shared__ int cnt[]; /* [E] */
	const int lane = threadIdx.x, c = blockIdx.x;
	for (int e = lane; e < E; e += 32)
		cnt[e] = 0;
	__syncwarp();
	const int p0 = c * CHUNK, p1 = min(P, p0 + CHUNK);
	int bad = INT_MAX;
	for (int r = p0; r < p1; r += 32) {
		const int p = r + lane;
		const bool in = p < p1;
		const int e = in ? ids[p] : -1;
		const bool ok = in && e >= 0 && e < E;
		if (in && !ok && p < bad)
			bad = p;
		const unsigned peers = __match_any_sync(FULL, ok ? e : -1 - lane);
		if (ok && lane == 31 - __clz(peers))
			cnt[e] += __popc(peers);
		__syncwarp();
	}
	for (int e = lane; e < E; e += 32)
		hist[(long long)c * E + e] = cnt[e];
	for (int o = 16; o > 0; o >>= 1)
		bad = min(bad, __shfl_xor_sync(FULL, bad, o));
	if (lane == 0)
		first_bad[c] = bad;
}

/* ---- one block: the plan ----------------------------------------------------------------- */

/* Exclusive prefix of v over the block's threads in thread order; *total = the sum. Every
 * thread of the (PLAN_THREADS) block calls it. */
static __device__ int block_excl_scan(int v, int *total)
{
	__shared__ int wsum[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int x = v;
	for (int o = 1; o < 32; o <<= 1) {
		const int y = __shfl_up_sync(FULL, x, o);
		if (lane >= o)
			x += y;
	}
	if (lane == 31)
		wsum[warp] = x;
	__syncthreads();
	if (warp == 0) {
		int w = wsum[lane];
		for (int o = 1; o < 32; o <<= 1) {
			const int y = __shfl_up_sync(FULL, w, o);
			if (lane >= o)
				w += y;
		}
		wsum[lane] = w;
	}
	__syncthreads();
	const int r = x - v + (warp ? wsum[warp - 1] : 0);
	*total = wsum[31];
	__syncthreads(); /* wsum is reused by the next call */
	return r;
}

static __global__ void __launch_bounds__(PLAN_THREADS)
plan_kernel(int n_chunks, int E, const int16_t *owner, int n_dev, int32_t *hist,
	    const int32_t *first_bad, moet_gpu_group_bufs o)
{
	__shared__ int cnt[MAX_EXP], base[MAX_EXP];
	__shared__ signed char tier[MAX_EXP]; /* 0 .. n_dev (the CPU tier), -1: bad owner */
	__shared__ int bad_e;
	const int tid = threadIdx.x;
	/* thread tid's consecutive experts [e0, e1) for the scans (expert order = thread order) */
	const int per = (E + PLAN_THREADS - 1) / PLAN_THREADS;
	const int e0 = min(E, tid * per), e1 = min(E, e0 + per);
	if (tid == 0)
		bad_e = INT_MAX;
	__syncthreads();
	for (int e = tid; e < E; e += PLAN_THREADS) {
		int s = 0;
		for (int c = 0; c < n_chunks; c++) {
			int32_t *h = hist + (long long)c * E + e;
			const int v = *h;
			*h = s;
			s += v;
		}
		cnt[e] = s;
		const int w = owner ? owner[e] : 0;
		tier[e] = (signed char)(w >= 0 && w < n_dev ? w : w == -1 ? n_dev : -1);
		if (w < -1 || w >= n_dev)
			atomicMin(&bad_e, e);
	}
	__syncthreads();

	/* expert start positions, tier by tier */
	int first = 0, tot;
	for (int t = 0; t <= n_dev; t++) {
		int v = 0;
		for (int e = e0; e < e1; e++)
			v += tier[e] == t ? cnt[e] : 0;
		int at = first + block_excl_scan(v, &tot);
		for (int e = e0; e < e1; e++)
			if (tier[e] == t) {
				base[e] = at;
				at += cnt[e];
			}
		if (tid == 0) {
			o.tier_first[t] = first;
			o.tier_count[t] = tot;
		}
		first += tot;
	}
	__syncthreads();
	for (int e = tid; e < E; e += PLAN_THREADS) {
		const int b = tier[e] >= 0 ? base[e] : -1;
		for (int c = 0; c < n_chunks; c++) {
			int32_t *h = hist + (long long)c * E + e;
			*h = b < 0 ? -1 : *h + b;
		}
	}

	/* device 0's touched experts: by id, then by (class, id) */
	int v = 0;
	for (int e = e0; e < e1; e++)
		v += n_dev >= 1 && tier[e] == 0 && cnt[e] > 0;
	int at = block_excl_scan(v, &tot);
	for (int e = e0; e < e1; e++)
		if (n_dev >= 1 && tier[e] == 0 && cnt[e] > 0)
			o.dev0[at++] = moet_gpu_group_exp{ e, base[e], cnt[e] };
	if (tid == 0)
		*o.n_dev0 = tot;
	first = 0;
	for (int cl = 0; cl < N_CLASS; cl++) {
		v = 0;
		for (int e = e0; e < e1; e++)
			v += n_dev >= 1 && tier[e] == 0 && cnt[e] > 0 && class_of(cnt[e]) == cl;
		at = first + block_excl_scan(v, &tot);
		for (int e = e0; e < e1; e++)
			if (n_dev >= 1 && tier[e] == 0 && cnt[e] > 0 && class_of(cnt[e]) == cl)
				o.dev0_class[at++] = moet_gpu_group_exp{ e, base[e], cnt[e] };
		if (tid == 0) {
			o.class_first[cl] = first;
			o.class_count[cl] = tot;
		}
		first += tot;
	}

	/* the error report: the smallest bad pair over the chunks, the smallest bad owner */
	int bad_p = INT_MAX;
	for (int c = tid; c < n_chunks; c += PLAN_THREADS)
		bad_p = min(bad_p, first_bad[c]);
	for (int off = 16; off > 0; off >>= 1)
		bad_p = min(bad_p, __shfl_xor_sync(FULL, bad_p, off));
	__shared__ int bad_pw[32];
	if ((tid & 31) == 0)
		bad_pw[tid >> 5] = bad_p;
	__syncthreads();
	if (tid == 0) {
		for (int w = 0; w < 32; w++)
			bad_p = min(bad_p, bad_pw[w]);
		const int be = bad_e;
		o.err[0] = (bad_p != INT_MAX ? MOET_GPU_GROUP_BAD_ID : 0) |
			   (be != INT_MAX ? MOET_GPU_GROUP_BAD_OWNER : 0);
		o.err[1] = bad_p != INT_MAX ? bad_p : -1;
		o.err[2] = be != INT_MAX ? be : -1;
	}
}

/* ---- per chunk: positions ---------------------------------------------------------------- */

static __global__ void __launch_bounds__(32)
scatter_kernel(const int32_t *ids, int P, int E, const int32_t *hist, moet_gpu_pair *pairs,
	       int32_t *slot)
{
	extern __shared__ int run[]; /* [E]: the position e's next pair in this chunk takes */
	const int lane = threadIdx.x, c = blockIdx.x;
	for (int e = lane; e < E; e += 32)
		run[e] = hist[(long long)c * E + e];
	__syncwarp();
	const unsigned lower = (1u << lane) - 1;
	const int p0 = c * CHUNK, p1 = min(P, p0 + CHUNK);
	for (int r = p0; r < p1; r += 32) {
		const int p = r + lane;
		const bool in = p < p1;
		const int e = in ? ids[p] : -1;
		const bool ok = in && e >= 0 && e < E;
		const unsigned peers = __match_any_sync(FULL, ok ? e : -1 - lane);
		const int b = ok ? run[e] : -1;
		__syncwarp(); /* every peer has read run[e] before the highest one moves it */
		if (ok && b >= 0) {
			const int pos = b + __popc(peers & lower);
			pairs[pos] = moet_gpu_pair{ e, 0, (int64_t)p };
			slot[p] = pos;
			if (lane == 31 - __clz(peers))
				run[e] = b + __popc(peers);
		} else if (in) {
			slot[p] = -1;
		}
		__syncwarp();
	}
}

/* ---- host side --------------------------------------------------------------------------- */

static int check_counts(int64_t P, int64_t E)
{
	if (P < 0 || P > MOET_GPU_GROUP_MAX_PAIRS || E < 1 || E > MAX_EXP)
		return moet_err(MOET_EINVAL, "group pairs: %lld pairs (0 .. %d), %lld experts "
				"(1 .. %d)", (long long)P, MOET_GPU_GROUP_MAX_PAIRS,
				(long long)E, MAX_EXP);
	return 0;
}

extern "C" int moet_gpu_group_scratch_bytes(int64_t n_pairs, int64_t n_exp, size_t *out_bytes)
{
	if (!out_bytes)
		return moet_err(MOET_EINVAL, "group scratch: NULL out_bytes");
	int rc = check_counts(n_pairs, n_exp);
	if (rc)
		return rc;
	const size_t n_chunks = (size_t)((n_pairs + CHUNK - 1) / CHUNK);
	*out_bytes = align256(n_chunks * (size_t)n_exp * sizeof(int32_t)) +
		     align256(n_chunks * sizeof(int32_t));
	return 0;
}

static int misaligned(const void *p, size_t a)
{
	return ((uintptr_t)p % a) != 0;
}

extern "C" int moet_gpu_group_pairs(const int32_t *ids, int64_t n_pairs, int64_t n_exp,
				    const int16_t *owner, int n_dev, void *scratch,
				    size_t scratch_bytes, const moet_gpu_group_bufs *out,
				    void *stream)
{
	size_t need = 0;
	int rc = moet_gpu_group_scratch_bytes(n_pairs, n_exp, &need);
	if (rc)
		return rc;
	if (n_dev < 0 || n_dev > MOET_GPU_GROUP_MAX_DEV || (!owner && n_dev < 1))
		return moet_err(MOET_EINVAL, "group pairs: %d devices (%d .. %d%s)", n_dev,
				owner ? 0 : 1, MOET_GPU_GROUP_MAX_DEV,
				owner ? "" : "; without an owner row every expert is on device 0");
	if (!out || !out->pairs || !out->slot || !out->tier_first || !out->tier_count ||
	    !out->dev0 || !out->dev0_class || !out->class_first || !out->class_count ||
	    !out->n_dev0 || !out->err || (n_pairs > 0 && !ids))
		return moet_err(MOET_EINVAL, "group pairs: NULL ids or output buffer");
	if (misaligned(out->pairs, 8) || misaligned(out->slot, 4) || misaligned(ids, 4) ||
	    misaligned(owner, 2) || misaligned(out->dev0, 4) || misaligned(out->dev0_class, 4) ||
	    misaligned(out->tier_first, 4) || misaligned(out->tier_count, 4) ||
	    misaligned(out->class_first, 4) || misaligned(out->class_count, 4) ||
	    misaligned(out->n_dev0, 4) || misaligned(out->err, 4))
		return moet_err(MOET_EINVAL, "group pairs: a misaligned ids, owner or output buffer");
	if (scratch_bytes < need || (need && (!scratch || misaligned(scratch, 256))))
		return moet_err(MOET_EINVAL, "group pairs: scratch of %zu bytes at %p (needs %zu, "
				"256-byte aligned)", scratch_bytes, scratch, need);
	const int P = (int)n_pairs, E = (int)n_exp, n_chunks = (P + CHUNK - 1) / CHUNK;
	int32_t *hist = (int32_t *)scratch;
	int32_t *first_bad =
		(int32_t *)((char *)scratch + align256((size_t)n_chunks * E * sizeof(int32_t)));
	cudaStream_t s = moet_stream(stream);
	const size_t sh = (size_t)E * sizeof(int);
	if (n_chunks) {
		count_kernel<<<n_chunks, 32, sh, s>>>(ids, P, E, hist, first_bad);
		MOET_CUDA_TRY(cudaGetLastError());
	}
	plan_kernel<<<1, PLAN_THREADS, 0, s>>>(n_chunks, E, owner, n_dev, hist, first_bad, *out);
	MOET_CUDA_TRY(cudaGetLastError());
	if (n_chunks) {
		scatter_kernel<<<n_chunks, 32, sh, s>>>(ids, P, E, hist, out->pairs, out->slot);
		MOET_CUDA_TRY(cudaGetLastError());
	}
	return 0;
}
