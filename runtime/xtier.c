/*
 * xtier.c: the NVMe expert tier (moet_xtier.h). First piece: the engine's entry points, so
 * that dispatch.c and forward.c can call them; the cache itself follows.
 */
#include "moet_xtier.h"

#include <stdlib.h>

#include "model_int.h"
#include "moet_err.h"

struct moet_xtier {
	moet_model *m;
};

int moet_model_set_xtier(moet_model *m, const moet_xtier_opts *o)
{
	moet_xtier_destroy(m->xtier);
	m->xtier = NULL;
	if (!o || !o->ram_budget_bytes)
		return 0;
	return moet_err(MOET_EUNSUP, "RAM budget: the NVMe expert tier is not built yet");
}

int moet_model_set_ram_budget(moet_model *m, size_t bytes, const struct moet_profile *profile)
{
	moet_xtier_opts o = { .ram_budget_bytes = bytes, .profile = profile };
	return moet_model_set_xtier(m, &o);
}

moet_xtier *moet_model_xtier(const moet_model *m)
{
	return m->xtier;
}

void moet_xtier_destroy(moet_xtier *x)
{
	free(x);
}

int moet_xtier_acquire(moet_xtier *x, int64_t layer, const moet_expert_pair *pairs,
		       int64_t n_pairs, const moet_ffn_w **out_table, int64_t *out_n_pairs)
{
	(void)pairs;
	*out_table = x->m->layers[layer].experts_host;
	*out_n_pairs = n_pairs;
	return 0;
}

void moet_xtier_release(moet_xtier *x, int64_t layer)
{
	(void)x;
	(void)layer;
}

void moet_xtier_prefetch(moet_xtier *x, int64_t layer, const float *x_rows, int64_t n)
{
	(void)x;
	(void)layer;
	(void)x_rows;
	(void)n;
}
