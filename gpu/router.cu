/*
 * router.cu: the noaux_tc router on the device, one warp (one block) per token: scores from
 * the router logits, then expert selection and weights exactly as moet_router_select_ref
 * (cpu/router_ref.c) and the CPU forward pass compute them:
 *   score[e]  = 1 / (1 + exp_c(-logit[e]))      (IEEE division, exp_c from moet_expc.h)
 *   biased[e] = score[e] + bias[e]
 *   groups (n_group > 1): group score = the sum of its two largest biased scores (the CPU's
 *             scan, by one lane per group); the topk_group best groups, by lane 0 in the CPU's
 *             order; experts of other groups are masked
 *   top_k times: the largest eligible biased score, ties to the lower id (a warp argmax)
 *   weights: score (/ (sum of the k scores in canonical order + 1e-20) when norm_topk_prob)
 *            * routed_scaling_factor, in binary32, by lane 0 in canonical order
 *
 * NOTE (why the warp argmax is the CPU's). The CPU keeps the first index whose value is
 * greater than every earlier one, skipping NaN and masked entries: the lowest index among the
 * entries equal (==) to the maximum. Each lane scans its indices (lane, lane + 32, ..) upward
 * with the same rule; the shuffle tree keeps the greater value, on equality the lower index,
 * which selects the same entry whatever the pairing. Ids and weights are therefore identical
 * (memcmp) to the CPU's for the same logits.
 *
 *   shared (dynamic): score [E] | biased [E] | gscore [G] | ok [E] bytes | gok, keep [G] bytes
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "moet_expc.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define ROUTER_MAX_EXP 4096 /* as the CPU reference */
#define SM120_SMEM_MAX (99 * 1024)

static_assert(ROUTER_MAX_EXP * (4 + 4 + 4 + 1 + 2) <= SM120_SMEM_MAX,
	      "sm_120: 99 KB of shared memory per block");

/* Warp argmax of v[i] over i < n with ok[i] (NaN never wins); -1 if none. All lanes get it. */
static __device__ int warp_argmax(const float *v, const unsigned char *ok, int n)
{
	const int lane = threadIdx.x;
	float bv = 0.0f;
	int bi = -1;
	for (int i = lane; i < n; i += 32) {
		const float x = v[i];
		if (ok[i] && x == x && (bi < 0 || x > bv)) {
			bv = x;
			bi = i;
		}
	}
	for (int off = 16; off > 0; off >>= 1) {
		const float ov = __shfl_down_sync(0xFFFFFFFFu, bv, off);
		const int oi = __shfl_down_sync(0xFFFFFFFFu, bi, off);
		if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
			bv = ov;
			bi = oi;
		}
	}
	return __shfl_sync(0xFFFFFFFFu, bi, 0);
}

static __global__ void __launch_bounds__(32)
router_kernel(const float *logits, long long l_stride, int E, const float *bias, int G,
	      int topk_group, int top_k, int norm, float rsf, int32_t *out_ids, float *out_w)
{
	extern __shared__ float sm[];
	float *score = sm, *biased = sm + E, *gscore = biased + E;
	unsigned char *ok = (unsigned char *)(gscore + G), *gok = ok + E, *keep = gok + G;
	const int lane = threadIdx.x, t = blockIdx.x;
	const float *lg = logits + t * l_stride;
	for (int e = lane; e < E; e += 32) {
		score[e] = 1.0f / (1.0f + moet_exp_c(-lg[e]));
		biased[e] = score[e] + bias[e];
		ok[e] = 1;
	}
	__syncwarp();
	if (G > 1) {
		const int per = E / G;
		for (int g = lane; g < G; g += 32) {
			const float *b = biased + g * per;
			int i1 = 0;
			for (int i = 1; i < per; i++)
				if (b[i] > b[i1])
					i1 = i;
			if (per == 1) {
				gscore[g] = b[0];
			} else {
				int i2 = (i1 == 0) ? 1 : 0;
				for (int i = 0; i < per; i++)
					if (i != i1 && b[i] > b[i2])
						i2 = i;
				gscore[g] = b[i1] + b[i2];
			}
			gok[g] = 1;
			keep[g] = 0;
		}
		__syncwarp();
		if (lane == 0)
			for (int j = 0; j < topk_group; j++) {
				int best = -1;
				for (int g = 0; g < G; g++) {
					if (!gok[g] || gscore[g] != gscore[g])
						continue;
					if (best < 0 || gscore[g] > gscore[best])
						best = g;
				}
				if (best < 0)
					break;
				gok[best] = 0;
				keep[best] = 1;
			}
		__syncwarp();
		for (int e = lane; e < E; e += 32)
			ok[e] = keep[e / per];
		__syncwarp();
	}
	float sum = 0.0f;
	int32_t *ids = out_ids + (long long)t * top_k;
	float *w = out_w + (long long)t * top_k;
	for (int i = 0; i < top_k; i++) {
		int e = warp_argmax(biased, ok, E);
		if (e < 0)
			e = 0; /* as the CPU: unreachable with valid configurations */
		if (lane == 0) {
			ok[e] = 0;
			ids[i] = e;
			w[i] = score[e];
			sum += score[e];
		}
		__syncwarp();
	}
	if (lane == 0) {
		if (norm) {
			const float den = sum + 1e-20f;
			for (int i = 0; i < top_k; i++)
				w[i] = w[i] / den;
		}
		for (int i = 0; i < top_k; i++)
			w[i] = w[i] * rsf;
	}
}

extern "C" int moet_gpu_router(const float *logits, int64_t n_tok, int64_t n_exp,
			       const float *bias, int64_t n_group, int64_t topk_group,
			       int64_t top_k, int norm_topk_prob, float routed_scaling_factor,
			       int32_t *out_ids, float *out_w, void *stream)
{
	const int64_t G = n_group > 1 ? n_group : 1;
	if (n_tok < 0 || n_tok > INT32_MAX || n_exp < 1 || n_exp > ROUTER_MAX_EXP ||
	    n_exp % G != 0 || top_k < 1 || top_k > n_exp ||
	    (n_group > 1 && (topk_group < 1 || topk_group > n_group ||
			     top_k > topk_group * (n_exp / n_group))))
		return moet_err(MOET_EINVAL, "router: %lld tokens, %lld experts (at most %d) in %lld "
				"groups, top %lld groups, top_k %lld: inconsistent",
				(long long)n_tok, (long long)n_exp, ROUTER_MAX_EXP,
				(long long)n_group, (long long)topk_group, (long long)top_k);
	if (n_tok == 0)
		return 0;
	if (!logits || !bias || !out_ids || !out_w)
		return moet_err(MOET_EINVAL, "router: NULL pointer");
	const size_t smem = (size_t)(2 * n_exp + G) * sizeof(float) + (size_t)(n_exp + 2 * G);
	MOET_CUDA_TRY(cudaFuncSetAttribute(router_kernel,
					   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	router_kernel<<<(unsigned)n_tok, 32, smem, moet_stream(stream)>>>(
		logits, n_exp, (int)n_exp, bias, (int)G, (int)topk_group, (int)top_k,
		norm_topk_prob != 0, routed_scaling_factor, out_ids, out_w);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}
