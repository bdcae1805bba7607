/*
 * moet_profile.h: routing profiles (what `moet-hybrid profile` records and `plan` reads), and
 * the generator's true routing distribution of synthetic checkpoints (generator.json).
 *
 * A profile counts, per phase (prefill, decode), MoE layer and routed expert, how often the
 * router picked the expert (plain count) and the sum of the routing weights it gave it
 * (weighted). Two tables of the same shape, phase-major:
 *
 *   counts[phase][layer][expert]    uint64   phase 0 = prefill, 1 = decode
 *   weighted[phase][layer][expert]  double   layers of the model, dense ones all 0
 *
 * Profiles of the same geometry merge by adding every entry (and the token and prompt
 * totals). The JSON file (docs/profile-and-plan.md) lists only the MoE layers:
 *
 *   {"format": "moet-hybrid profile", "format_version": 1,
 *    "num_hidden_layers": L, "n_routed_experts": E, "num_experts_per_tok": K,
 *    "prompts": P, "tokens": {"prefill": T0, "decode": T1}, "runs": ["...", ...],
 *    "layers": [{"layer": 1, "prefill": {"counts": [E ints], "weighted": [E numbers]},
 *                            "decode":  {"counts": [...],    "weighted": [...]}}, ...]}
 *
 * Errors of the reader are one line naming the file and the field ("p.json: layers[2].decode.
 * counts[7]: -1 is not a non-negative integer"; syntax errors "p.json:LINE:COL: ...").
 * Handles are plain structs, not thread-safe for writing.
 */
#ifndef MOET_PROFILE_H
#define MOET_PROFILE_H

#include <stdint.h>

#include "moet_config.h"

#define MOET_PROFILE_PREFILL 0
#define MOET_PROFILE_DECODE 1
#define MOET_PROFILE_PHASES 2
#define MOET_PROFILE_MAX_FILE_BYTES (1u << 30)

typedef struct moet_profile {
	int64_t n_layers;        /* num_hidden_layers */
	int64_t n_experts;       /* n_routed_experts */
	int64_t top_k;           /* num_experts_per_tok */
	uint8_t *is_moe;         /* [n_layers]: 1 for the layers that route */
	uint64_t *counts;        /* [PHASES][n_layers][n_experts] routings */
	double *weighted;        /* [PHASES][n_layers][n_experts] sums of routing weights */
	uint64_t n_prompts;      /* sequences profiled */
	uint64_t n_tokens[MOET_PROFILE_PHASES]; /* tokens run through the model per phase */
	int n_runs;
	char **runs;             /* one line per profiling run; merging keeps all */
} moet_profile;

/* Offset of (phase, layer, expert 0) in counts / weighted. */
static inline int64_t moet_profile_at(const moet_profile *p, int phase, int64_t layer)
{
	return ((int64_t)phase * p->n_layers + layer) * p->n_experts;
}

/* An empty profile for the model's geometry (MoE layers from cf). MOET_EINVAL for a model
 * without routed experts, MOET_ENOMEM. Free with moet_profile_free. */
int moet_profile_create(const moet_config *cf, moet_profile **out);

/* Accepts NULL. */
void moet_profile_free(moet_profile *p);

/*
 * Counts one routing decision: experts ids[0..k-1] of `layer` with their weights, in `phase`.
 * MOET_ERANGE (nothing counted) for a phase, layer (dense or out of range), expert id or k
 * out of range. Cheap: k additions.
 */
int moet_profile_record(moet_profile *p, int phase, int64_t layer, const int32_t *ids,
			const float *weights, int k);

/* Appends a description line of a run (copied). MOET_ENOMEM. */
int moet_profile_add_run(moet_profile *p, const char *line);

/*
 * dst += src entry by entry (counts, weights, prompts, tokens; runs appended). MOET_EINVAL
 * naming `src_label` when the geometries (layers, experts, top-k, MoE layers) differ; dst is
 * then unchanged.
 */
int moet_profile_merge(moet_profile *dst, const moet_profile *src, const char *src_label);

/* MOET_EINVAL naming `label` and the field when the profile is not for this geometry. */
int moet_profile_check(const moet_profile *p, const moet_config *cf, const char *label);

/* The JSON text (malloc'd, NUL-terminated). MOET_ENOMEM. */
int moet_profile_to_json(const moet_profile *p, char **out_text);

/* Writes the JSON file (replaced). MOET_EIO naming the path. */
int moet_profile_save(const moet_profile *p, const char *path);

/*
 * Reads a profile: MOET_EIO (cannot read, larger than MOET_PROFILE_MAX_FILE_BYTES),
 * MOET_EFORMAT (malformed JSON, a missing field, a wrong type, a value out of range, a layer
 * given twice, an array of the wrong length), each one line naming the file and the field.
 */
int moet_profile_load(const char *path, moet_profile **out);

/* Like moet_profile_load from text in memory; `label` stands for the path in errors. */
int moet_profile_parse(const char *label, const char *text, size_t n_bytes, moet_profile **out);

/* ---- the generator's truth (synthetic checkpoints) -------------------------------------- */

/* What generator.json says about routing: the prompt mix and each MoE layer's distribution. */
typedef struct moet_gen_truth {
	int64_t n_layers;        /* num_hidden_layers */
	int64_t n_experts;
	int64_t vocab_size;      /* from the config passed in */
	int n_classes;           /* token class of id t: floor(t * n_classes / vocab_size) */
	int64_t hot_count;
	double hot_share;
	uint8_t *has_layer;      /* [n_layers]: generator.json lists the layer */
	uint8_t *is_hot;         /* [n_layers x n_experts]: in the layer's hot set */
	double *expert_share; /* [n_layers x n_experts]: expected share of the layer's routings */
} moet_gen_truth;

/*
 * Reads DIR/generator.json of a gen-checkpoint model whose config is cf. MOET_ENOTFOUND when
 * the file does not exist (a model not made by gen-checkpoint); MOET_EFORMAT naming the file
 * and field when it is malformed or disagrees with cf (layers, experts). Free with
 * moet_gen_truth_free (accepts NULL).
 */
int moet_gen_truth_load(const char *dir, const moet_config *cf, moet_gen_truth **out);
void moet_gen_truth_free(moet_gen_truth *t);

/* The id range [*lo, *hi) of token class c (ids t with floor(t * C / V) == c). */
void moet_gen_truth_class_range(const moet_gen_truth *t, int c, int64_t *lo, int64_t *hi);

#endif
