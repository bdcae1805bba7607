/*
 * backend.c: choosing a backend by name, and the CUDA backend's entry point.
 */
#include <string.h>

#include "moet_backend.h"
#include "moet_err.h"
#include "moet_gpu.h"

int moet_backend_cuda_create(int device, moet_backend **out)
{
	const char *why = NULL;
	(void)out;
	if (moet_gpu_count(&why) <= device)
		return moet_err(MOET_EDEVICE, "--device cuda: no CUDA device %d (%s)", device,
				why ? why : "fewer devices");
	/* NOTE: the CUDA kernels of the graph's ops exist in gpu/ in part (issue 4); the backend
	 * that binds them behind moet_backend_ops is the next step. Until then, say so. */
	return moet_err(MOET_EUNSUP, "--device cuda: the CUDA backend of the model graph is not "
			"built yet (issue 4); use --device cpu");
}

int moet_backend_create(const char *name, const moet_config *c, moet_backend **out)
{
	int64_t max_inter = c->intermediate_size;
	if (c->moe_intermediate_size * c->n_shared_experts > max_inter)
		max_inter = c->moe_intermediate_size * c->n_shared_experts;
	if (c->moe_intermediate_size > max_inter)
		max_inter = c->moe_intermediate_size;
	if (!name || !strcmp(name, "cpu"))
		return moet_backend_cpu_create(0, max_inter, out);
	if (!strcmp(name, "cuda"))
		return moet_backend_cuda_create(0, out);
	return moet_err(MOET_EINVAL, "--device '%s': expected cpu or cuda", name);
}
