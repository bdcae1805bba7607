/*
 * sample.cu: greedy and seeded top-k / top-p sampling on the device, the token for token
 * equal of moet_sample (runtime/sample.c), so that only token ids cross PCIe.
 *
 * What the host does (runtime/sample.c), and what this file repeats exactly:
 *   temperature 0: moet_argmax (the first greatest non-NaN value; 0 if all are NaN).
 *   otherwise: candidates sorted by (logit desc, NaN last, id asc); keep = top_k (if 0 <
 *   top_k < n) else n; trailing NaNs dropped (keep >= 1); top = logit of the first;
 *   e_i = moet_exp64(((double)logit_i - top) * (1.0 / temperature));
 *   S_i = ((0 + e_0) + e_1) + .. + e_i  (binary64, candidate order);  total = S_{keep-1};
 *   cut = 1 + the first i with S_i >= top_p * total (else keep);  prefix = S_{cut-1};
 *   u = uniform(seed, pos) * prefix;  the token = the first i < cut with S_i > u (else cut-1).
 * The host computes total, the running mass, prefix and the running sum of its last loop as
 * four separate loops; each of them adds the same e_i in the same order from 0.0, so each is
 * S_i at the same i: one serial prefix sum (thread 0) gives all four, and the two searches can
 * run in parallel. moet_exp64 is one binary64 definition for host and device (common/), built
 * from +, -, * only; this file is compiled with --fmad=false, so no product is fused.
 *
 * The order: each logit gets a 64-bit key, unique per row, whose ascending order is the
 * host's candidate order:
 *   key = desc(logit) << idbits | id       idbits: bits of n - 1 (at least 1)
 *   desc(f) = ~asc(f) over the float's bits (sign flip for +, complement for -), with -0 read
 *             as +0 (the host's comparisons see them equal) and every NaN as 0xFFFFFFFF (last)
 * Two paths per row (greedy rows take the argmax in the first):
 *   keep <= SMALL_MAX  one block: radix select (8 bits per round, MSB first) of the keep-th
 *                      smallest key, gather the keep keys <= it, bitonic sort in shared
 *                      memory, then the sums above (all in shared memory)
 *   keep > SMALL_MAX   (top_k 0 or large at a big vocabulary): the whole row's keys sorted by
 *                      cub::DeviceSegmentedRadixSort (up to SORT_ROWS rows per sort, one
 *                      segment each), then one block per row does the sums over the sorted
 *                      keys with the binary64 terms in scratch
 * Both end in the same block function (finish). Every row's result depends only on its own
 * logits and parameters (batch-invariant); integer atomics only (histograms, counters,
 * minima), whose results do not depend on their order.
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "moet_exp64.h"

#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <stdint.h>

#define THREADS 1024
#define SMALL_MAX 2048 /* largest keep of the one-block path; a power of two */
#define SORT_ROWS 8    /* rows per segmented sort (bounds the scratch) */

static_assert((SMALL_MAX & (SMALL_MAX - 1)) == 0, "bitonic sort over a power of two");
/* static shared memory of sample_small_kernel: keys, terms, histogram, argmax tree */
static_assert(SMALL_MAX * (8 + 8) + 256 * 4 + THREADS * 8 + 64 <= 48 * 1024,
	      "static shared memory (48 KB; sm_120 allows 99 KB per block)");

/* ---- keys ---------------------------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t desc_key(float f)
{
	if (f != f)
		return 0xFFFFFFFFu;
	uint32_t u = __float_as_uint(f);
	if (u == 0x80000000u)
		u = 0; /* -0 == +0 */
	uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ~asc;
}

static __device__ __forceinline__ uint64_t make_key(float f, int id, int idbits)
{
	return ((uint64_t)desc_key(f) << idbits) | (uint32_t)id;
}

static __device__ __forceinline__ bool key_is_nan(uint64_t k, int idbits)
{
	return (uint32_t)(k >> idbits) == 0xFFFFFFFFu;
}

static __device__ __forceinline__ int keep_of(const moet_gpu_sample_row &p, int n)
{
	return (p.top_k > 0 && p.top_k < n) ? (int)p.top_k : n;
}

/* runtime/sample.c's moet_sample_uniform, operation for operation */
static __device__ __forceinline__ uint64_t splitmix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static __device__ __forceinline__ double uniform(uint64_t seed, int64_t pos)
{
	uint64_t r = splitmix64(splitmix64(seed) ^ (uint64_t)pos);
	return (double)(r >> 11) * 0x1p-53;
}

/* ---- block helpers (every thread of the block calls them) ---------------------------------- */

/* The smallest i < n with s[i] >= thr (ge) or s[i] > thr (!ge); n if none. */
static __device__ int first_index(const double *s, int n, double thr, bool ge, int *sh)
{
	if (threadIdx.x == 0)
		*sh = n;
	__syncthreads();
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		if (ge ? s[i] >= thr : s[i] > thr) {
			atomicMin(sh, i); /* a thread's first hit is its smallest */
			break;
		}
	__syncthreads();
	const int r = *sh;
	__syncthreads(); /* *sh is reused by the next call */
	return r;
}

/*
 * The sums and the draw over the first keep sorted keys (keep >= 1); s: keep doubles of
 * scratch (shared or global). Writes the token to *out_id and the prefix total to *out_mass.
 */
static __device__ void finish(const uint64_t *keys, double *s, int keep, int idbits,
			      const float *l, const moet_gpu_sample_row &p, int32_t *out_id,
			      double *out_mass)
{
	__shared__ int sh_idx;
	const int tid = threadIdx.x;
	const uint64_t idmask = (1ull << idbits) - 1;

	/* trailing NaNs: NaN keys sort last, so the non-NaN ones are a prefix */
	int nn = 0;
	for (int base = 0; base < keep; base += blockDim.x) {
		const int i = base + tid;
		nn += __syncthreads_count(i < keep && !key_is_nan(keys[i], idbits));
	}
	keep = nn > 1 ? nn : 1;

	const double top = (double)l[keys[0] & idmask];
	const double inv_t = 1.0 / p.temperature;
	for (int i = tid; i < keep; i += blockDim.x)
		s[i] = moet_exp64(((double)l[keys[i] & idmask] - top) * inv_t);
	__syncthreads();
	if (tid == 0) {
		/* NOTE: the serial sum in candidate order; loads are issued 16 at a time so that
		 * global-memory latency is not paid per term (same adds, same order) */
		double run = 0.0;
		int i = 0;
		for (; i + 16 <= keep; i += 16) {
			double v[16];
#pragma unroll
			for (int q = 0; q < 16; q++)
				v[q] = s[i + q];
#pragma unroll
			for (int q = 0; q < 16; q++) {
				run += v[q];
				s[i + q] = run;
			}
		}
		for (; i < keep; i++) {
			run += s[i];
			s[i] = run;
		}
	}
	__syncthreads();
	const double total = s[keep - 1];
	const int first = first_index(s, keep, p.top_p * total, true, &sh_idx);
	const int cut = first < keep ? first + 1 : keep;
	const double prefix = s[cut - 1];
	const double u = uniform(p.seed, p.pos) * prefix;
	const int pick = first_index(s, cut, u, false, &sh_idx);
	if (tid == 0) {
		*out_id = (int32_t)(keys[pick < cut ? pick : cut - 1] & idmask);
		if (out_mass)
			*out_mass = prefix;
	}
}

/* ---- the one-block path: greedy rows and keep <= SMALL_MAX --------------------------------- */

static __global__ void __launch_bounds__(THREADS)
sample_small_kernel(const float *logits, long long stride, int n, int idbits,
		    const moet_gpu_sample_row *rows, int32_t *out, double *out_mass)
{
	__shared__ uint64_t cand[SMALL_MAX];
	__shared__ double terms[SMALL_MAX];
	__shared__ unsigned hist[256];
	__shared__ float bv_s[THREADS];
	__shared__ int bi_s[THREADS];
	__shared__ uint64_t sh_prefix;
	__shared__ unsigned sh_rem, sh_cnt;
	const int tid = threadIdx.x;
	const moet_gpu_sample_row p = rows[blockIdx.x];
	const float *l = logits + p.row * stride;
	double *mass = out_mass ? out_mass + blockIdx.x : NULL;

	if (p.temperature == 0) {
		/* moet_argmax: each thread's scan keeps its first greatest; the tree keeps the
		 * greater, on equality the lower id; NaN never enters */
		float bv = 0.0f;
		int bi = -1;
		for (int i = tid; i < n; i += THREADS) {
			const float x = l[i];
			if (x == x && (bi < 0 || x > bv)) {
				bv = x;
				bi = i;
			}
		}
		bv_s[tid] = bv;
		bi_s[tid] = bi;
		__syncthreads();
		for (int h = THREADS / 2; h > 0; h >>= 1) {
			if (tid < h) {
				const float ov = bv_s[tid + h];
				const int oi = bi_s[tid + h];
				if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
					bv = ov;
					bi = oi;
					bv_s[tid] = bv;
					bi_s[tid] = bi;
				}
			}
			__syncthreads();
		}
		if (tid == 0) {
			out[blockIdx.x] = bi < 0 ? 0 : bi;
			if (mass)
				*mass = 0.0;
		}
		return;
	}
	const int keep = keep_of(p, n);
	if (keep > SMALL_MAX)
		return; /* the sorted path */

	/* radix select of the keep-th smallest key (keys are unique: exactly one matches) */
	uint64_t thr = ~0ull;
	if (keep < n) {
		uint64_t prefix = 0, mask = 0;
		unsigned rem = (unsigned)keep; /* rank inside the current bucket, from 1 */
		for (int shift = (32 + idbits + 7) / 8 * 8 - 8; shift >= 0; shift -= 8) {
			for (int i = tid; i < 256; i += THREADS)
				hist[i] = 0;
			__syncthreads();
			for (int i = tid; i < n; i += THREADS) {
				const uint64_t k = make_key(l[i], i, idbits);
				if ((k & mask) == prefix)
					atomicAdd(&hist[(k >> shift) & 255], 1u);
			}
			__syncthreads();
			if (tid == 0) {
				unsigned cum = 0;
				int d = 0;
				while (cum + hist[d] < rem)
					cum += hist[d++];
				sh_rem = rem - cum;
				sh_prefix = prefix | ((uint64_t)d << shift);
			}
			__syncthreads();
			rem = sh_rem;
			prefix = sh_prefix;
			mask |= 255ull << shift;
			__syncthreads();
		}
		thr = prefix;
	}

	/* gather the keep keys <= thr (any order), pad to a power of two, bitonic sort */
	if (tid == 0)
		sh_cnt = 0;
	__syncthreads();
	for (int i = tid; i < n; i += THREADS) {
		const uint64_t k = make_key(l[i], i, idbits);
		if (k <= thr) {
			const unsigned at = atomicAdd(&sh_cnt, 1u);
			if (at < SMALL_MAX) /* exactly keep keys match (unique keys): never false */
				cand[at] = k;
		}
	}
	int P = 1;
	while (P < keep)
		P <<= 1;
	for (int i = keep + tid; i < P; i += THREADS)
		cand[i] = ~0ull;
	__syncthreads();
	for (int size = 2; size <= P; size <<= 1)
		for (int stride_ = size >> 1; stride_ > 0; stride_ >>= 1) {
			for (int i = tid; i < P; i += THREADS) {
				const int j = i ^ stride_;
				if (j > i) {
					const bool up = (i & size) == 0;
					const uint64_t a = cand[i], b = cand[j];
					if ((a > b) == up) {
						cand[i] = b;
						cand[j] = a;
					}
				}
			}
			__syncthreads();
		}
	finish(cand, terms, keep, idbits, l, p, out + blockIdx.x, mass);
}

/* ---- the sorted path ------------------------------------------------------------------------ */

/* Up to SORT_ROWS rows of one segmented sort: their indices in the call. */
struct sort_chunk {
	int row[SORT_ROWS];
	int count;
};

static __global__ void keys_kernel(const float *logits, long long stride, int n, int idbits,
				   const moet_gpu_sample_row *rows, sort_chunk c, uint64_t *keys,
				   int *seg_begin, int *seg_end)
{
	const int j = blockIdx.y;
	const float *l = logits + rows[c.row[j]].row * stride;
	uint64_t *k = keys + (size_t)j * (size_t)n;
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
		k[i] = make_key(l[i], i, idbits);
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		seg_begin[j] = j * n;
		seg_end[j] = (j + 1) * n;
	}
}

static __global__ void __launch_bounds__(THREADS)
finish_sorted_kernel(const float *logits, long long stride, int n, int idbits,
		     const moet_gpu_sample_row *rows, sort_chunk c, const uint64_t *sorted,
		     double *terms, int32_t *out, double *out_mass)
{
	const int j = blockIdx.x, r = c.row[j];
	const moet_gpu_sample_row p = rows[r];
	finish(sorted + (size_t)j * (size_t)n, terms + (size_t)j * (size_t)n, keep_of(p, n),
	       idbits, logits + p.row * stride, p, out + r, out_mass ? out_mass + r : NULL);
}

/* ---- host side ------------------------------------------------------------------------------ */

static size_t up256(size_t b)
{
	return (b + 255) & ~(size_t)255;
}

static int id_bits(int64_t n)
{
	int b = 1;
	while (b < 31 && ((int64_t)1 << b) < n)
		b++;
	return b;
}

/* The scratch layout for (n_rows, n_cols): row table, then (when a row can take the sorted
 * path) segment offsets, two key buffers of chunk x n_cols and cub's temporary storage. */
struct layout {
	size_t rows_off, seg_off, keys_a_off, keys_b_off, cub_off, cub_bytes, total;
	int chunk; /* rows per sort; 0: no sorted path */
};

static int layout_of(int64_t n_rows, int64_t n_cols, layout *o)
{
	*o = layout{};
	o->rows_off = 0;
	o->total = up256((size_t)n_rows * sizeof(moet_gpu_sample_row));
	if (n_cols <= SMALL_MAX)
		return 0;
	int64_t ch = n_rows < SORT_ROWS ? n_rows : SORT_ROWS;
	if (ch > INT_MAX / n_cols)
		ch = INT_MAX / n_cols;
	o->chunk = (int)ch;
	o->seg_off = o->total;
	o->keys_a_off = o->seg_off + up256(2 * SORT_ROWS * sizeof(int));
	o->keys_b_off = o->keys_a_off + up256((size_t)ch * (size_t)n_cols * 8);
	o->cub_off = o->keys_b_off + up256((size_t)ch * (size_t)n_cols * 8);
	size_t tb = 0;
	MOET_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeys(
		NULL, tb, (const uint64_t *)NULL, (uint64_t *)NULL, (int)(ch * n_cols), (int)ch,
		(const int *)NULL, (const int *)NULL, 0, 32 + id_bits(n_cols), (cudaStream_t)0));
	o->cub_bytes = tb;
	o->total = o->cub_off + up256(tb);
	return 0;
}

extern "C" int moet_gpu_sample_scratch_bytes(int64_t n_rows, int64_t n_cols, size_t *out_bytes)
{
	if (!out_bytes || n_rows < 0 || n_cols < 1 || n_cols >= INT_MAX)
		return moet_err(MOET_EINVAL, "sample scratch: %lld rows of %lld", (long long)n_rows,
				(long long)n_cols);
	layout lo;
	int rc = layout_of(n_rows, n_cols, &lo);
	if (!rc)
		*out_bytes = lo.total;
	return rc;
}

static int check_row(const moet_gpu_sample_row *p, int64_t r)
{
	if (!(p->temperature >= 0 && p->temperature <= DBL_MAX))
		return moet_err(MOET_EINVAL, "sample row %lld: temperature %g: must be finite and "
				">= 0", (long long)r, p->temperature);
	if (p->top_k < 0)
		return moet_err(MOET_EINVAL, "sample row %lld: top_k %lld: must be >= 0",
				(long long)r, (long long)p->top_k);
	if (!(p->top_p > 0 && p->top_p <= 1))
		return moet_err(MOET_EINVAL, "sample row %lld: top_p %g: must be in (0, 1]",
				(long long)r, p->top_p);
	if (p->row < 0)
		return moet_err(MOET_EINVAL, "sample row %lld: logits row %lld", (long long)r,
				(long long)p->row);
	return 0;
}

extern "C" int moet_gpu_sample(const float *logits, int64_t n_rows, int64_t n_cols,
			       int64_t stride, const moet_gpu_sample_row *rows, void *scratch,
			       size_t scratch_bytes, int32_t *out_ids, double *out_mass,
			       void *stream)
{
	if (n_rows < 0 || n_rows > INT_MAX || n_cols < 1 || n_cols >= INT_MAX)
		return moet_err(MOET_EINVAL, "sample: %lld rows of %lld logits", (long long)n_rows,
				(long long)n_cols);
	if (n_rows == 0)
		return 0;
	if (!logits || !rows || !scratch || !out_ids || stride < n_cols ||
	    ((uintptr_t)scratch & 255u))
		return moet_err(MOET_EINVAL, "sample: NULL pointer, scratch not 256-byte aligned or "
				"stride %lld below %lld", (long long)stride, (long long)n_cols);
	int rc, any_sorted = 0;
	for (int64_t r = 0; r < n_rows; r++) {
		if ((rc = check_row(&rows[r], r)))
			return rc;
		const int64_t k = rows[r].top_k, keep = (k > 0 && k < n_cols) ? k : n_cols;
		any_sorted |= rows[r].temperature != 0 && keep > SMALL_MAX;
	}
	layout lo;
	if ((rc = layout_of(n_rows, n_cols, &lo)))
		return rc;
	if (scratch_bytes < lo.total)
		return moet_err(MOET_EINVAL, "sample: scratch of %zu bytes, %zu needed",
				scratch_bytes, lo.total);
	cudaStream_t st = moet_stream(stream);
	char *base = (char *)scratch;
	moet_gpu_sample_row *d_rows = (moet_gpu_sample_row *)(base + lo.rows_off);
	/* NOTE: from pageable memory the copy is staged before it returns: rows may be reused */
	MOET_CUDA_TRY(cudaMemcpyAsync(d_rows, rows, (size_t)n_rows * sizeof(*rows),
				      cudaMemcpyHostToDevice, st));
	const int n = (int)n_cols, idbits = id_bits(n_cols);
	sample_small_kernel<<<(unsigned)n_rows, THREADS, 0, st>>>(logits, stride, n, idbits, d_rows,
								    out_ids, out_mass);
	MOET_CUDA_TRY(cudaGetLastError());
	if (!any_sorted)
		return 0;

	int *seg = (int *)(base + lo.seg_off);
	uint64_t *keys_a = (uint64_t *)(base + lo.keys_a_off);
	uint64_t *keys_b = (uint64_t *)(base + lo.keys_b_off);
	sort_chunk c = {};
	for (int64_t r = 0; r <= n_rows; r++) {
		if (r < n_rows) {
			const int64_t k = rows[r].top_k, keep = (k > 0 && k < n_cols) ? k : n_cols;
			if (rows[r].temperature != 0 && keep > SMALL_MAX)
				c.row[c.count++] = (int)r;
		}
		if (c.count == 0 || (c.count < lo.chunk && r < n_rows))
			continue;
		const unsigned bx = (unsigned)((n + 255) / 256 < 64 ? (n + 255) / 256 : 64);
		keys_kernel<<<dim3(bx, (unsigned)c.count), 256, 0, st>>>(
			logits, stride, n, idbits, d_rows, c, keys_a, seg, seg + SORT_ROWS);
		MOET_CUDA_TRY(cudaGetLastError());
		size_t tb = lo.cub_bytes;
		MOET_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeys(
			base + lo.cub_off, tb, keys_a, keys_b, c.count * n, c.count, seg,
			seg + SORT_ROWS, 0, 32 + idbits, st));
		/* the binary64 terms go where the unsorted keys were */
		finish_sorted_kernel<<<(unsigned)c.count, THREADS, 0, st>>>(
			logits, stride, n, idbits, d_rows, c, keys_b, (double *)keys_a, out_ids,
			out_mass);
		MOET_CUDA_TRY(cudaGetLastError());
		c.count = 0;
	}
	return 0;
}
