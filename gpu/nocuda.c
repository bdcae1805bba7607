/*
 * nocuda.c: the GPU entry points in a build without the CUDA toolkit.
 */
#include "moet_gpu.h"

#include "moet_err.h"

int moet_gpu_count(const char **out_why)
{
	if (out_why)
		*out_why = "built without CUDA";
	return 0;
}

int moet_gpu_exp_c(const float *in, float *out, long long n)
{
	(void)in;
	(void)out;
	(void)n;
	return moet_err(MOET_EUNSUP, "exp_c on the GPU: this build has no CUDA");
}
