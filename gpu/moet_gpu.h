/*
 * moet_gpu.h: the GPU side as seen from C. Built from the .cu files of gpu/ by nvcc when the toolkit is
 * present (sm_90 and sm_120); without it, gpu/nocuda.c answers "no GPU".
 */
#ifndef MOET_GPU_H
#define MOET_GPU_H

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

#ifdef __cplusplus
}
#endif

#endif
