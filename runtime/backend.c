/*
 * backend.c: choosing a backend by name.
 */
#include <string.h>

#include "moet_backend.h"
#include "moet_err.h"

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
