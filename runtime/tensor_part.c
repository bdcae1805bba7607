/*
 * tensor_part.c: which part of a DeepSeek-V3-layout model a tensor belongs to, by its name
 * (the published names; docs/checkpoint.md). One classification for inspect's summary and
 * the placement planner's byte accounting.
 */
#include <stdint.h>
#include <string.h>

#include "moet_ckpt.h"

const char *const moet_part_names[MOET_PART_COUNT] = {
	[MOET_PART_EMBED] = "embedding",     [MOET_PART_LM_HEAD] = "lm_head",
	[MOET_PART_ATTN] = "attention",      [MOET_PART_NORM] = "norms",
	[MOET_PART_DENSE_MLP] = "dense_mlp", [MOET_PART_ROUTER] = "router",
	[MOET_PART_SHARED] = "shared_experts", [MOET_PART_EXPERT] = "routed_experts",
	[MOET_PART_MTP] = "mtp",             [MOET_PART_OTHER] = "other",
};

/* "123." at *s -> 123, *s past the dot; -1 if not that form. */
static int64_t take_index(const char **s)
{
	const char *p = *s;
	int64_t v = 0;
	if (*p < '0' || *p > '9')
		return -1;
	while (*p >= '0' && *p <= '9') {
		if (v > (INT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (*p++ - '0');
	}
	if (*p != '.')
		return -1;
	*s = p + 1;
	return v;
}

static int starts(const char *s, const char *pfx)
{
	return strncmp(s, pfx, strlen(pfx)) == 0;
}

moet_part moet_tensor_part(const char *name, int64_t n_layers, int64_t *out_layer,
			   int64_t *out_expert)
{
	*out_layer = -1;
	*out_expert = -1;
	if (!strcmp(name, "model.embed_tokens.weight"))
		return MOET_PART_EMBED;
	if (!strcmp(name, "lm_head.weight"))
		return MOET_PART_LM_HEAD;
	if (!strcmp(name, "model.norm.weight"))
		return MOET_PART_NORM;
	if (!starts(name, "model.layers."))
		return MOET_PART_OTHER;
	const char *r = name + strlen("model.layers.");
	int64_t L = take_index(&r);
	if (L < 0)
		return MOET_PART_OTHER;
	*out_layer = L;
	if (L >= n_layers)
		return MOET_PART_MTP;
	if (starts(r, "mlp.experts.")) {
		const char *e = r + strlen("mlp.experts.");
		*out_expert = take_index(&e);
		return *out_expert >= 0 ? MOET_PART_EXPERT : MOET_PART_OTHER;
	}
	if (starts(r, "mlp.shared_experts."))
		return MOET_PART_SHARED;
	if (starts(r, "mlp.gate."))
		return MOET_PART_ROUTER;
	if (starts(r, "mlp.gate_proj.") || starts(r, "mlp.up_proj.") || starts(r, "mlp.down_proj."))
		return MOET_PART_DENSE_MLP;
	if (strstr(r, "layernorm") && !starts(r, "mlp."))
		return MOET_PART_NORM;
	if (starts(r, "self_attn."))
		return MOET_PART_ATTN;
	return MOET_PART_OTHER;
}
