/*
 * backend.c: choosing a backend by name; helpers the backends share.
 */
#include <stdlib.h>
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

static int by_expert_then_pair(const void *a, const void *b)
{
	const moet_expert_pair *x = a, *y = b;
	if (x->expert != y->expert)
		return x->expert < y->expert ? -1 : 1;
	return (x->pair > y->pair) - (x->pair < y->pair);
}

int moet_expert_pairs_sort(const int32_t *ids, int64_t n, moet_expert_pair *out)
{
	for (int64_t p = 0; p < n; p++) {
		if (ids[p] < 0)
			return moet_err(MOET_EINVAL, "routing pair %lld: expert id %d", (long long)p,
					ids[p]);
		out[p] = (moet_expert_pair){ ids[p], p };
	}
	qsort(out, (size_t)n, sizeof(*out), by_expert_then_pair);
	return 0;
}
