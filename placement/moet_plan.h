/*
 * moet_plan.h: the frequency planner: which routed experts become GPU-resident, on which GPU,
 * from a routing profile, under each GPU's byte budget; and the evaluation of placements on
 * a held-out profile (docs/profile-and-plan.md).
 *
 *   profile --scores--> score[layer][expert]  (routings in the chosen phase)
 *   sizes + budgets --> slots per GPU --> experts per layer (even, or --hot-per-layer K)
 *   per layer: the top experts by score --> GPUs, heaviest first to the least loaded GPU
 *              with a slot left in that layer (quotas keep every GPU's bytes in budget)
 *
 * Memory per GPU: budget - reserve - its share of the dense part (split as the engine splits
 * it: moet_placement_dense_share) = bytes for experts; each expert counted at the
 * largest routed expert's size (every expert has the same size in this family; the planner
 * says when they differ). With a cost model (moet_cost.h: hw set in the budget) the plan
 * carries the predicted decode step time; with auto_slots the experts per layer are chosen
 * by it (uneven: a slot goes where it saves the most predicted time, plan.c). A batch mix
 * (n_mix batch sizes with weights) is planned for the weighted sum of the predicted steps.
 */
#ifndef MOET_PLAN_H
#define MOET_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "moet_config.h"
#include "moet_cost.h"
#include "moet_placement.h"
#include "moet_profile.h"

typedef enum moet_plan_phase {
	MOET_PLAN_DECODE = 0,   /* decode routings (the default: decode is what waits on bytes) */
	MOET_PLAN_PREFILL,
	MOET_PLAN_BOTH,
} moet_plan_phase;

/* "decode" / "prefill" / "both". 0 or MOET_EINVAL. */
int moet_plan_phase_parse(const char *s, moet_plan_phase *out);
const char *moet_plan_phase_name(moet_plan_phase ph);

/* score[layer][expert] (malloc'd, [n_layers x n_experts]): the profile's plain counts of the
 * phase (or of both added). MOET_ENOMEM. */
int moet_plan_scores(const moet_profile *p, moet_plan_phase ph, double **out);

#define MOET_PLAN_MAX_BATCHES 32     /* batch sizes of a mix */

/* What the GPUs offer. */
typedef struct moet_plan_budget {
	int n_gpus;                  /* 1 .. MOET_PLACEMENT_MAX_GPUS */
	uint64_t budget_bytes;       /* per GPU */
	uint64_t reserve_bytes;      /* per GPU: KV cache, activations, workspaces */
	int64_t hot_per_layer;       /* experts per MoE layer on GPUs; 0: fill the budget evenly */
	const moet_cost_hw *hw;      /* NULL: no cost model, no prediction */
	int64_t batch;               /* decode batch of the prediction (>= 1 with hw; n_mix 0) */
	bool auto_slots;             /* with hw and no hot_per_layer: counts by the cost model */
	/* A batch mix (with hw; 0: the one batch `batch`, weight 1): --auto minimizes
	 * sum_i mix_weight[i] x (predicted step at mix_batch[i]); `batch` is then ignored. */
	int n_mix;                   /* 0 .. MOET_PLAN_MAX_BATCHES */
	int64_t mix_batch[MOET_PLAN_MAX_BATCHES];  /* >= 1 each (repeats allowed) */
	double mix_weight[MOET_PLAN_MAX_BATCHES];  /* positive and finite each */
} moet_plan_budget;

/* A plan: the arithmetic and the resulting owner table. */
typedef struct moet_plan {
	int64_t n_layers, n_experts;
	int64_t n_moe;               /* MoE layers */
	int n_gpus;
	uint64_t slot_bytes;         /* bytes counted per expert (the largest routed expert) */
	bool equal_sizes;            /* every routed expert has slot_bytes */
	uint64_t dense_bytes;        /* the whole dense part */
	uint64_t dense_share[MOET_PLACEMENT_MAX_GPUS];  /* per GPU (split) */
	uint64_t free_bytes[MOET_PLACEMENT_MAX_GPUS];   /* budget - reserve - dense share */
	int64_t slots[MOET_PLACEMENT_MAX_GPUS];         /* experts that fit per GPU */
	int64_t used[MOET_PLACEMENT_MAX_GPUS];          /* experts placed per GPU */
	double load[MOET_PLACEMENT_MAX_GPUS];           /* score placed per GPU (routings) */
	int64_t even_k;              /* experts per layer before the extras */
	int64_t n_extra;             /* layers given one more (the leftover slots) */
	int64_t *per_layer;          /* [n_layers] experts on GPUs (0 in dense layers) */
	int16_t *owner;              /* [n_layers x n_experts]: GPU or MOET_PLACEMENT_CPU */
	double *layer_hit;           /* [n_layers] hit rate on the scores; -1 without routings */
	double hit_rate;             /* over all MoE layers, on the scores */
	double max_imbalance;        /* max over layers of (largest GPU load / mean GPU load) */
	/* With a cost model (budget hw != NULL): */
	bool has_cost;
	bool auto_slots;             /* the counts came from the cost model */
	bool auto_kept_even;         /* --auto predicted no gain over the even split: kept it */
	moet_cost_in cost;           /* what the predictions were made with (batch: batch[0]) */
	moet_cost_pred pred;         /* this plan's decode step at batch[0] (= mix_pred[0]) */
	moet_cost_pred even_pred;    /* the even split's (the same as pred without auto_slots) */
	double even_hit_rate;        /* the even split's hit rate on the scores */
	/* The batches predicted (one: the budget's batch, weight 1, without a mix): */
	int n_batch;
	int64_t batch[MOET_PLAN_MAX_BATCHES];
	double weight[MOET_PLAN_MAX_BATCHES];
	moet_cost_pred mix_pred[MOET_PLAN_MAX_BATCHES];  /* this plan's step at batch[i] */
	moet_cost_pred mix_even[MOET_PLAN_MAX_BATCHES];  /* the even split's */
	double objective_ms;         /* sum_i weight[i] x mix_pred[i].step_ms (one pass) */
	double even_objective_ms;    /* the same for the even split */
} moet_plan;

/*
 * Plans: slots per GPU from the sizes and budget (MOET_ERANGE when the dense share and the
 * reserve leave no room, or hot_per_layer does not fit, naming the bytes), experts per layer,
 * the top experts per layer by score (ties: lower id first), and their GPUs. `scores` is
 * [n_layers x n_experts] for cf's geometry (sz likewise). Free with moet_plan_free.
 * With hw: predictions at each batch of the mix; MOET_EINVAL for a batch < 1, a weight that
 * is not positive and finite, or n_mix out of 0 .. MOET_PLAN_MAX_BATCHES.
 * Work: O(L x E log E) for the ranking plus O(L x K x n_gpus) for the assignment; with a cost
 * model, per batch of the mix, the expected call times (O(L x E x rows in the window)), and
 * --auto's greedy O(S x L x batches).
 */
int moet_plan_make(const moet_config *cf, const moet_placement_sizes *sz, const double *scores,
		   const moet_plan_budget *b, moet_plan **out);

/* Accepts NULL. */
void moet_plan_free(moet_plan *pl);

/* The plan as a placement with GPUs gpu0..gpuN-1 (budget and reserve as planned, dense
 * split). `label` names it. Errors of moet_placement_create / set_owner. */
int moet_plan_to_placement(const moet_plan *pl, const moet_config *cf, const char *label,
			   const moet_plan_budget *b, moet_placement **out);

/* ---- evaluation --------------------------------------------------------------------------- */

/* Share of all routings in `scores` that are served by experts with mask[l*E+e] != 0, over
 * the layers; -1 when scores are all zero. */
double moet_plan_hit_rate(const double *scores, int64_t n_layers, int64_t n_experts,
			  const uint8_t *mask);

/* mask of the top per_layer[l] experts of each layer by score (ties: lower id). MOET_ENOMEM. */
int moet_plan_top_mask(const double *scores, int64_t n_layers, int64_t n_experts,
		       const int64_t *per_layer, uint8_t *mask);

/* The hit rates of issue 6's comparison, at the plan's per-layer counts. -1: not available. */
typedef struct moet_plan_eval {
	double hit_rate;            /* the plan (from the training profile) on the held-out one */
	double optimal_hit_rate;    /* top experts of the held-out profile itself (hindsight) */
	double first_k_hit_rate;    /* experts 0 .. K-1 of every layer */
	double random_hit_rate;     /* K experts per layer drawn uniformly (one seeded draw) */
	double random_expected;     /* the expectation of that draw: sum K / E weighted by layer */
	double generator_hit_rate;  /* top experts by the generator's expert_share (synthetic) */
	double generator_expected;  /* the share that placement gets under the generator's own
				     * distribution (mean over layers of its expert_share sums) */
	double train_hit_rate;      /* the plan on its own training profile */
} moet_plan_eval;

/*
 * Evaluates `pl` on held-out scores `test` (same geometry). `truth` (NULL: none) adds the
 * generator rows. `seed` draws the random placement. MOET_ENOMEM.
 */
int moet_plan_evaluate(const moet_plan *pl, const double *test, const moet_gen_truth *truth,
		       uint64_t seed, moet_plan_eval *out);

#endif
