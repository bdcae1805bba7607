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

static int no_cuda(const char *what)
{
	return moet_err(MOET_EUNSUP, "%s: this build has no CUDA", what);
}

int moet_gpu_alloc(size_t bytes, void **out_ptr)
{
	(void)bytes;
	if (out_ptr)
		*out_ptr = NULL;
	return no_cuda("moet_gpu_alloc");
}

void moet_gpu_free(void *ptr)
{
	(void)ptr;
}

int moet_gpu_copy_h2d(void *dst, const void *src, size_t bytes)
{
	(void)dst;
	(void)src;
	(void)bytes;
	return no_cuda("moet_gpu_copy_h2d");
}

int moet_gpu_copy_d2h(void *dst, const void *src, size_t bytes)
{
	(void)dst;
	(void)src;
	(void)bytes;
	return no_cuda("moet_gpu_copy_d2h");
}

int moet_gpu_copy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
	(void)dst;
	(void)src;
	(void)bytes;
	(void)stream;
	return no_cuda("moet_gpu_copy_d2d");
}

int moet_gpu_sync(void *stream)
{
	(void)stream;
	return no_cuda("moet_gpu_sync");
}

size_t moet_gpu_expert_scratch_bytes(int64_t n_pairs, int64_t inter)
{
	if (n_pairs <= 0 || inter <= 0)
		return 0;
	return (size_t)n_pairs * (size_t)((inter + 3) / 4 * 4) * sizeof(float);
}

int moet_gpu_expert_ffn(const moet_gpu_expert *exps, int64_t n_exp, const float *x, int64_t n_x,
			const int32_t *tok, void *scratch, size_t scratch_bytes, float *y,
			void *stream)
{
	(void)exps;
	(void)n_exp;
	(void)x;
	(void)n_x;
	(void)tok;
	(void)scratch;
	(void)scratch_bytes;
	(void)y;
	(void)stream;
	return no_cuda("moet_gpu_expert_ffn");
}
