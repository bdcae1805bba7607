/*
 * moet_gpu.h: the GPU side as seen from C. Built from the .cu files of gpu/ by nvcc when the toolkit is
 * present (sm_90 and sm_120); without it, gpu/nocuda.c answers "no GPU".
 */
#ifndef MOET_GPU_H
#define MOET_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "moet_mat.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices: 0 when there is no driver or no device (never an error).
 * *out_why (optional) gets a static string saying why there are none. */
int moet_gpu_count(const char **out_why);

/*
 * Evaluates the contract's exp_c on the device for n inputs (host arrays) and writes the
 * results to out. Returns 0, MOET_EDEVICE (detail names the CUDA call and error) or
 * MOET_EUNSUP without CUDA. Used by the GPU tests to check exp_c exhaustively.
 */
int moet_gpu_exp_c(const float *in, float *out, long long n);

/*
 * ---- Device memory (gpu/alloc.cu) ------------------------------------------------------------
 * The one source of device memory. Pointers returned are cudaMalloc'd (256-byte aligned).
 * Streams are cudaStream_t passed as void*; NULL is the default stream. Every function returns
 * 0, MOET_EINVAL (NULL pointer), MOET_EDEVICE (detail: file:line, the CUDA call and its error)
 * or MOET_EUNSUP in a build without CUDA.
 */

/* *out_ptr = bytes of device memory (NULL for 0 bytes). Free with moet_gpu_free. */
int moet_gpu_alloc(size_t bytes, void **out_ptr);
/* Frees memory from moet_gpu_alloc; NULL is accepted. */
void moet_gpu_free(void *ptr);
/* Synchronous copies (return when the bytes have arrived). */
int moet_gpu_copy_h2d(void *dst, const void *src, size_t bytes);
int moet_gpu_copy_d2h(void *dst, const void *src, size_t bytes);
/* Device-to-device copy queued on `stream` (no host wait). */
int moet_gpu_copy_d2d(void *dst, const void *src, size_t bytes, void *stream);
/* Waits until everything queued on `stream` has finished; reports asynchronous errors. */
int moet_gpu_sync(void *stream);

/*
 * ---- The contract expert FFN, grouped over experts and tokens (gpu/expert.cu) ----------------
 * One expert of a grouped call: gate and up [I x H], down [H x I], as moet_mat views whose
 * data and scale_inv are DEVICE pointers holding the checkpoint's bytes verbatim (F8_E4M3 codes
 * with F32 128x128 block scales, or BF16; scale_inv NULL means 1.0f). n_tok is the number of
 * (expert, token) pairs of this expert.
 */
typedef struct moet_gpu_expert {
	moet_mat gate, up, down; /* borrowed device views */
	int64_t n_tok;           /* tokens routed to this expert (>= 0) */
} moet_gpu_expert;

/* Bytes of scratch that moet_gpu_expert_ffn needs for n_pairs pairs of experts of
 * intermediate size `inter` (the h rows, each padded to a multiple of 4 floats). */
size_t moet_gpu_expert_scratch_bytes(int64_t n_pairs, int64_t inter);

/*
 * The contract expert FFN (docs/numerics.md) for every (expert, token) pair, on the device:
 *
 *   pairs are numbered expert by expert: expert e owns rows P_e .. P_e + n_tok_e - 1, with
 *   P_e = n_tok_0 + ... + n_tok_{e-1};  for pair p of expert e, t = tok[p]:
 *   y[p][.] = canon(D(down_e, ., silu_c(D(gate_e, ., x[t])) * D(up_e, ., x[t])))
 *
 * bit for bit what moet_expert_ffn (cpu/) returns for that expert and token. x [n_x][H]
 * binary32, tok [n_pairs] int32 and y [n_pairs][H] binary32 are device memory; scratch is
 * device memory of at least moet_gpu_expert_scratch_bytes(n_pairs, I) bytes (borrowed; holds
 * h). All experts share I, H and one weight dtype (F8_E4M3 or BF16). A token index outside
 * [0, n_x) reads as a row of +0 (never out of bounds).
 *
 * Asynchronous: the work is queued on `stream` (cudaStream_t, NULL = default stream); no
 * allocation and no host synchronization happen inside; the output is ready after
 * moet_gpu_sync(stream). Deterministic (no atomics): the same inputs give the same bits.
 * Returns 0, MOET_EINVAL (NULL pointers, misaligned data, scratch too small, counts out of
 * range), MOET_ESHAPE (matrices do not chain or differ between experts), MOET_EUNSUP (dtype
 * other than F8_E4M3/BF16, or a build without CUDA) or MOET_EDEVICE (a launch failed).
 * Thread-safe for different streams and outputs.
 */
int moet_gpu_expert_ffn(const moet_gpu_expert *exps, int64_t n_exp, const float *x, int64_t n_x,
			const int32_t *tok, void *scratch, size_t scratch_bytes, float *y,
			void *stream);

#ifdef __cplusplus
}
#endif

#endif
