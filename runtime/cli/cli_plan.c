/*
 * cli_plan.c: `moet-hybrid plan`: a placement file from a routing profile (placement/
 * moet_plan.h), with its arithmetic printed; and `plan --evaluate`: the hit rate of that plan
 * on a held-out profile against first-K, uniform random, the hindsight optimum and (for
 * gen-checkpoint models) the generator's own distribution. With --auto (or --hardware) the
 * decode step time is predicted by placement/moet_cost.h on a hardware file or the built-in
 * defaults, and --auto spreads the slots unevenly over layers to minimize it, or, for a
 * batch mix (--batch 1:2,16:1: sizes with weights), the weighted sum of the steps. And
 * `plan --predict`: the predicted decode step of an existing placement file at one or more
 * batch sizes, split into GPU experts, CPU experts, PCIe, fixed overheads and the dense part
 * (moet_cost_predict_step), as a table or one JSON object.
 *
 * Sizes are the checkpoint's (moet_placement_sizes_from_ckpt): only config.json and the
 * shard headers are read, no weights. The placement is checked against the budgets with
 * moet_placement_check before it is written, so a written plan always loads.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_cost.h"
#include "moet_err.h"
#include "moet_placement.h"
#include "moet_plan.h"
#include "moet_profile.h"

#define GIB(b) ((double)(b) / (double)(1ull << 30))
#define MIB(b) ((double)(b) / (double)(1ull << 20))

static void usage(FILE *f)
{
	fprintf(f,
		"usage: moet-hybrid plan --model DIR --profile P --gpus N --vram-gb G "
		"[--hot-per-layer K | --auto]\n"
		"                        [--hardware FILE.yaml] [--batch B[:W][,B[:W]...]] "
		"[--reserve-gb R]\n"
		"                        [--layer-max means|spread]\n"
		"                        [--phase decode|prefill|both] --out PLACEMENT.yaml\n"
		"       moet-hybrid plan --evaluate --model DIR --profile TRAIN --holdout TEST "
		"--gpus N --vram-gb G\n"
		"                        [--hot-per-layer K] [--reserve-gb R] [--phase P] "
		"[--seed S] [--json] [--out F]\n"
		"       moet-hybrid plan --predict --model DIR --placement FILE --profile P\n"
		"                        [--hardware FILE.yaml] [--batch B[,B...]] [--phase P] "
		"[--json]\n"
		"                        [--layer-max means|spread]\n\n"
		"Per MoE layer, the experts the profile routes to most go to the GPUs, each GPU\n"
		"within its budget: budget - reserve - its share of the split dense part\n"
		"holds whole experts at the checkpoint's real sizes. Experts of a layer are dealt\n"
		"heaviest first to the GPU with the least load in that layer. Prints the\n"
		"arithmetic and the expected hit rate (routings served by GPU-resident experts)\n"
		"per layer and overall, and writes the placement file (docs/placement.md), the\n"
		"per-layer hit rates as comments. Format and method: docs/profile-and-plan.md.\n\n"
		"  --gpus N           GPUs (named gpu0 .. gpuN-1)\n"
		"  --vram-gb G        budget per GPU in GiB (2^30 bytes), or a size with a unit\n"
		"                     (141GB, 139GiB, 32000MiB)\n"
		"  --reserve-gb R     per GPU for KV cache, activations, workspaces, CUDA context\n"
		"                     (GiB or a size with a unit; default 10%% of the budget)\n"
		"  --hot-per-layer K  K experts in every MoE layer (default: as many as fit,\n"
		"                     evenly over layers; leftover slots to the layers whose next\n"
		"                     expert is busiest)\n"
		"  --phase P          routings to plan for: decode (default), prefill, both\n"
		"  --evaluate         compare on --holdout TEST: the plan, the hindsight optimum\n"
		"                     (TEST's own top experts at the same counts per layer),\n"
		"                     first-K, uniform random (--seed, default 1), and for\n"
		"                     gen-checkpoint models the generator's hot experts\n"
		"  --json             --evaluate's figures as one JSON object\n"
		"  --auto             experts per layer chosen by the cost model (uneven): each\n"
		"                     slot goes to the layer whose next expert saves the most\n"
		"                     predicted decode step time; prints and writes the predicted\n"
		"                     step time and the even split's for comparison\n"
		"  --hardware FILE    the cost model's hardware (configs/hardware-*.yaml;\n"
		"                     default: built-in figures of the H200 machine, printed\n"
		"                     as such);\n"
		"                     without --auto, predicts the step time of the even split\n"
		"  --batch B          decode batch (sequences per step) of the prediction\n"
		"                     (default 1); with --predict a list (1,4,16,64): a row\n"
		"                     each; with --auto or --hardware a mix B:W,... (weights\n"
		"                     W > 0, default 1): --auto minimizes sum W x step, and\n"
		"                     each batch's step is printed for both plans\n"
		"  --layer-max M      how the cost model takes a MoE layer's wait for its\n"
		"                     tiers: spread (default), the expected max, the CPU\n"
		"                     tier's time varying with its experts' rows; means, the\n"
		"                     max of their expected times (docs/profile-and-plan.md)\n"
		"  --predict          the predicted decode step of --placement FILE: step time\n"
		"                     and its parts (GPU experts, CPU experts, PCIe, fixed\n"
		"                     overheads, dense part), expected experts and rows per tier;\n"
		"                     --json: one object {\"predictions\": [{\"batch\": B,\n"
		"                     ...}, ...]}\n\n"
		"The picture of a plan: moet-hybrid heatmap (docs/profile-and-plan.md).\n");
}

/* "139" (GiB) or a size with a unit. */
static int parse_gib(const char *opt, const char *s, uint64_t *out)
{
	char *end;
	double g = strtod(s, &end);
	if (end != s && !*end) {
		if (!(g >= 0 && g < 1e9))
			return moet_err(MOET_EINVAL, "%s '%s': out of range", opt, s);
		*out = (uint64_t)(g * (double)(1ull << 30));
		return 0;
	}
	if (moet_placement_parse_bytes(s, out))
		return moet_err(MOET_EINVAL, "%s '%s': not a number of GiB or a size (139GiB, "
				"141GB, 512MiB)", opt, s);
	return 0;
}

#define MAX_BATCHES MOET_PLAN_MAX_BATCHES

typedef struct plopts {
	const char *model, *profile, *holdout, *out, *placement;
	moet_plan_phase phase;
	moet_plan_budget b;
	int reserve_set, evaluate, json, predict;
	uint64_t seed;
	const char *hardware;
	moet_cost_hw hw;
	int n_batch;
	int64_t batch[MAX_BATCHES];
	double weight[MAX_BATCHES];  /* 1 unless given (B:W) */
	int weighted;                /* some item had :W */
	const char *batch_arg;       /* --batch as given (messages) */
} plopts;

/* "FMA 1329 GFLOP/s x 0.198 (2 tokens) .. 0.554 (1024)" or "no compute term". */
static void curve_text(const moet_cost_curve *c, double peak, const char *what, char *buf,
		       size_t n)
{
	if (!c->n)
		snprintf(buf, n, "no compute term");
	else
		snprintf(buf, n, "%s %g GFLOP/s x %g (%g tokens) .. %g (%g)", what, peak,
			 c->frac[0], c->tokens[0], c->frac[c->n - 1], c->tokens[c->n - 1]);
}

static void print_hw(const plopts *o, const moet_cost_hw *h)
{
	char cc[160], gc[160];
	curve_text(&h->cpu_fma_frac, h->cpu_fma_gflops, "FMA", cc, sizeof(cc));
	curve_text(&h->gpu_sgemm_frac, h->gpu_sgemm_gflops, "SGEMM", gc, sizeof(gc));
	printf("cost model: %s%s: cpu read %g GB/s, %s; gpu read %g GB/s, %s; pcie %g GB/s + "
	       "%g us; overheads cpu %g us, gpu %g us per layer%s\n",
	       h->from_file ? "hardware file " : "", h->from_file ? o->hardware : h->name,
	       h->cpu_read_gbps, cc, h->gpu_read_gbps, gc, h->pcie_gbps, h->pcie_latency_us,
	       h->cpu_overhead_us, h->gpu_overhead_us,
	       h->layer_max == MOET_COST_MAX_SPREAD ? "; layer max: spread (the expected max "
						       "of the tiers)"
						     : "; layer max: means (the max of the tiers' "
						       "expected times)");
}

/* The placement header's mention of the layer max (--layer-max). */
static const char *spread_note(const moet_cost_hw *h)
{
	return h->layer_max == MOET_COST_MAX_SPREAD ? "; layer max spread" : "; layer max means";
}

static double pct(double a, double b)
{
	return b > 0 ? 100.0 * (a - b) / b : 0.0;
}

/* " 1:1, 4:1, 16:2" */
static void print_mix(const moet_plan *pl)
{
	for (int i = 0; i < pl->n_batch; i++)
		printf("%s %" PRId64 ":%g", i ? "," : "", pl->batch[i], pl->weight[i]);
}

static void print_pred_row(int64_t batch, double w, const char *what, const moet_cost_pred *p,
			   double hit)
{
	printf("  %6" PRId64 " %8g %-22s %9.3f %9.3f %9.3f %9.3f %8.3f %9.2f %9.2f %8.4f\n",
	       batch, w, what, p->step_ms, p->experts_ms, p->cpu_ms, p->gpu_ms, p->transfer_ms,
	       p->cpu_distinct, p->gpu_distinct, hit);
}

/* A batch mix: a row per batch and plan, each batch's step, then the weighted sums. */
static void print_cost_mix(const plopts *o, const moet_plan *pl)
{
	print_hw(o, &pl->cost.hw);
	printf("decode batch mix (batch:weight):");
	print_mix(pl);
	printf("; %s the weighted sum of the predicted steps\n",
	       pl->auto_slots ? "--auto minimizes" : "objective:");
	printf("  %6s %8s %-22s %9s %9s %9s %9s %8s %9s %9s %8s\n", "batch", "weight",
	       "placement", "step_ms", "moe_ms", "cpu_ms", "gpu_ms", "copy_ms", "cpu_exp",
	       "gpu_exp", "hit");
	for (int i = 0; i < pl->n_batch; i++) {
		print_pred_row(pl->batch[i], pl->weight[i],
			       pl->auto_slots ? "--auto" : "even split (this plan)",
			       &pl->mix_pred[i], pl->hit_rate);
		if (pl->auto_slots)
			print_pred_row(pl->batch[i], pl->weight[i], "even split",
				       &pl->mix_even[i], pl->even_hit_rate);
	}
	printf("  (step_ms includes the dense part; cpu_exp / gpu_exp: expected distinct experts "
	       "per step)\n");
	for (int i = 0; i < pl->n_batch; i++) {
		const double a = pl->mix_pred[i].step_ms, e = pl->mix_even[i].step_ms;
		if (pl->auto_slots)
			printf("predicted decode step at batch %" PRId64 ": %.3f ms with --auto, "
			       "%.3f ms with the even split (%+.2f%%)\n", pl->batch[i], a, e,
			       pct(a, e));
		else
			printf("predicted decode step at batch %" PRId64 ": %.3f ms\n",
			       pl->batch[i], a);
	}
	if (pl->auto_slots)
		printf("predicted decode step, weighted sum over the mix: %.3f ms with --auto, "
		       "%.3f ms with the even split (%+.2f%%)%s\n", pl->objective_ms,
		       pl->even_objective_ms, pct(pl->objective_ms, pl->even_objective_ms),
		       pl->auto_kept_even ? "; no predicted gain: kept the even split" : "");
	else
		printf("predicted decode step, weighted sum over the mix: %.3f ms\n",
		       pl->objective_ms);
}

static void print_cost(const plopts *o, const moet_plan *pl)
{
	const moet_cost_pred *p = &pl->pred, *e = &pl->even_pred;
	if (pl->n_batch > 1) {
		print_cost_mix(o, pl);
		return;
	}
	print_hw(o, &pl->cost.hw);
	printf("decode batch %" PRId64 "\n", pl->cost.batch);
	printf("  %-22s %9s %9s %9s %9s %8s %9s %9s %8s\n", "placement", "step_ms", "moe_ms",
	       "cpu_ms", "gpu_ms", "copy_ms", "cpu_exp", "gpu_exp", "hit");
	printf("  %-22s %9.3f %9.3f %9.3f %9.3f %8.3f %9.2f %9.2f %8.4f\n",
	       pl->auto_slots ? "--auto" : "even split (this plan)", p->step_ms, p->experts_ms,
	       p->cpu_ms, p->gpu_ms, p->transfer_ms, p->cpu_distinct, p->gpu_distinct,
	       pl->hit_rate);
	if (pl->auto_slots)
		printf("  %-22s %9.3f %9.3f %9.3f %9.3f %8.3f %9.2f %9.2f %8.4f\n", "even split",
		       e->step_ms, e->experts_ms, e->cpu_ms, e->gpu_ms, e->transfer_ms,
		       e->cpu_distinct, e->gpu_distinct, pl->even_hit_rate);
	printf("  (dense part %.3f ms of each step; cpu_exp / gpu_exp: expected distinct experts "
	       "per step)\n", p->dense_ms);
	if (pl->auto_slots)
		printf("predicted decode step: %.3f ms with --auto, %.3f ms with the even split "
		       "(%+.2f%%)%s\n", p->step_ms, e->step_ms, pct(p->step_ms, e->step_ms),
		       pl->auto_kept_even ? "; no predicted gain: kept the even split" : "");
	else
		printf("predicted decode step: %.3f ms\n", p->step_ms);
}

static void print_plan(const plopts *o, const moet_plan *pl, const moet_placement *p,
		       const moet_placement_sizes *sz, double plan_ms)
{
	const int n = pl->n_gpus;
	printf("expert bytes: %" PRIu64 " (%.3f MiB, gate+up+down with scales; %s)\n",
	       pl->slot_bytes, MIB(pl->slot_bytes), pl->equal_sizes ?
	       "every routed expert the same" : "the largest: experts differ, each counted so");
	printf("dense part: %" PRIu64 " bytes (%.3f GiB), split over %d GPU%s\n", pl->dense_bytes,
	       GIB(pl->dense_bytes), n, n > 1 ? "s" : "");
	for (int g = 0; g < n; g++)
		printf("gpu%d: budget %" PRIu64 " - reserve %" PRIu64 " - dense %" PRIu64 " = %"
		       PRIu64 " bytes -> %" PRId64 " experts\n", g, o->b.budget_bytes,
		       o->b.reserve_bytes, pl->dense_share[g], pl->free_bytes[g], pl->slots[g]);
	if (pl->auto_slots && !pl->auto_kept_even) {
		int64_t lo = INT64_MAX, hi = 0, tot = 0;
		for (int64_t l = 0; l < pl->n_layers; l++)
			if (pl->per_layer[l]) {
				lo = pl->per_layer[l] < lo ? pl->per_layer[l] : lo;
				hi = pl->per_layer[l] > hi ? pl->per_layer[l] : hi;
				tot += pl->per_layer[l];
			}
		printf("experts per MoE layer (--auto, cost model): %" PRId64 " .. %" PRId64
		       ", %" PRId64 " in all (the even split: %" PRId64 " x %" PRId64
		       " layers + leftovers)\n", lo == INT64_MAX ? 0 : lo, hi, tot, pl->even_k,
		       pl->n_moe);
	} else {
		printf("experts per MoE layer: %" PRId64 " x %" PRId64 " layers", pl->even_k,
		       pl->n_moe);
		if (pl->n_extra)
			printf(" + 1 in %" PRId64 " layer%s (leftover slots)", pl->n_extra,
			       pl->n_extra > 1 ? "s" : "");
		printf(" of %" PRId64 " (%s)\n", pl->n_experts,
		       o->b.hot_per_layer ? "--hot-per-layer" : "filling the budget");
	}
	printf("  layer experts hit_rate  per GPU\n");
	for (int64_t l = 0; l < pl->n_layers; l++) {
		if (!pl->per_layer[l])
			continue;
		int64_t cnt[MOET_PLACEMENT_MAX_GPUS] = { 0 };
		for (int64_t e = 0; e < pl->n_experts; e++)
			if (pl->owner[l * pl->n_experts + e] >= 0)
				cnt[pl->owner[l * pl->n_experts + e]]++;
		printf("  %5" PRId64 " %7" PRId64 " %8.4f ", l, pl->per_layer[l], pl->layer_hit[l]);
		for (int g = 0; g < n; g++)
			printf(" %" PRId64, cnt[g]);
		printf("\n");
	}
	double tot = 0;
	for (int g = 0; g < n; g++)
		tot += pl->load[g];
	printf("  gpu   experts expert_GiB dense_GiB reserve_GiB total_GiB budget_GiB  "
	       "routings_share\n");
	for (int g = 0; g < n; g++) {
		moet_placement_usage u;
		if (moet_placement_usage_of(p, sz, g, &u))
			continue;
		printf("  gpu%-3d %7" PRId64 " %10.3f %9.3f %11.3f %9.3f %10.3f  %13.4f\n", g,
		       u.n_experts, GIB(u.expert_bytes), GIB(u.dense_bytes), GIB(u.reserve_bytes),
		       GIB(u.total_bytes), GIB(u.budget_bytes), tot > 0 ? pl->load[g] / tot : 0);
	}
	printf("largest GPU load in a layer / mean: %.3f\n", pl->max_imbalance);
	printf("expected hit rate (%s routings of the profile): %.4f\n",
	       moet_plan_phase_name(o->phase), pl->hit_rate);
	if (pl->has_cost)
		print_cost(o, pl);
	printf("planned in %.2f ms\n", plan_ms);
}

/* The header's cost lines for a batch mix: the model, a line per batch, the objective. */
static void mix_comment(const plopts *o, const moet_plan *pl, char *buf, size_t n)
{
	const moet_cost_hw *h = &pl->cost.hw;
	size_t at = 0;
#define ADD(...)                                                                           \
	do {                                                                               \
		int k_ = snprintf(buf + at, n - at, __VA_ARGS__);                          \
		at += k_ > 0 && (size_t)k_ < n - at ? (size_t)k_ : 0;                      \
	} while (0)
	ADD("\ncost model: %s (cpu %g GB/s, %g GFLOP/s FMA x %d points; gpu %g GB/s, %g GFLOP/s "
	    "SGEMM x %d points; pcie %g GB/s%s), decode batch mix (batch:weight)",
	    h->from_file ? o->hardware : h->name, h->cpu_read_gbps, h->cpu_fma_gflops,
	    h->cpu_fma_frac.n, h->gpu_read_gbps, h->gpu_sgemm_gflops, h->gpu_sgemm_frac.n,
	    h->pcie_gbps, spread_note(h));
	for (int i = 0; i < pl->n_batch; i++)
		ADD("%s %" PRId64 ":%g", i ? "," : "", pl->batch[i], pl->weight[i]);
	for (int i = 0; i < pl->n_batch; i++) {
		const moet_cost_pred *q = &pl->mix_pred[i];
		ADD("\nbatch %" PRId64 ": predicted decode step %.3f ms (MoE layers %.3f + dense "
		    "%.3f)", pl->batch[i], q->step_ms, q->experts_ms, q->dense_ms);
		if (pl->auto_slots)
			ADD("; the even split %.3f ms", pl->mix_even[i].step_ms);
	}
	ADD("\nweighted objective (sum of weight x predicted step): %.3f ms", pl->objective_ms);
	if (pl->auto_slots)
		ADD("; the even split %.3f ms (hit rate %.4f)", pl->even_objective_ms,
		    pl->even_hit_rate);
#undef ADD
}

static int write_plan(const plopts *o, const moet_plan *pl, const moet_placement *p)
{
	const int64_t L = pl->n_layers;
	char **com = calloc((size_t)L, sizeof(*com));
	char header[8192], pred[6144] = "";
	int rc = com ? 0 : moet_err(MOET_ENOMEM, "comments");
	for (int64_t l = 0; !rc && l < L; l++) {
		if (!pl->per_layer[l])
			continue;
		if (!(com[l] = malloc(128))) {
			rc = moet_err(MOET_ENOMEM, "comments");
			break;
		}
		snprintf(com[l], 128, "layer %" PRId64 ": expected hit rate %.4f (%" PRId64
			 " experts on GPUs)", l, pl->layer_hit[l], pl->per_layer[l]);
	}
	const moet_cost_hw *h = &pl->cost.hw;
	if (pl->has_cost && pl->n_batch > 1)
		mix_comment(o, pl, pred, sizeof(pred));
	else if (pl->has_cost)
		snprintf(pred, sizeof(pred), "\ncost model: %s (cpu %g GB/s, %g GFLOP/s FMA "
			 "x %d points; gpu %g GB/s, %g GFLOP/s SGEMM x %d points; pcie %g GB/s%s), "
			 "decode batch %" PRId64 "\npredicted decode step: %.3f ms (MoE layers "
			 "%.3f + dense %.3f)", h->from_file ? o->hardware : h->name,
			 h->cpu_read_gbps, h->cpu_fma_gflops, h->cpu_fma_frac.n, h->gpu_read_gbps,
			 h->gpu_sgemm_gflops, h->gpu_sgemm_frac.n, h->pcie_gbps, spread_note(h),
			 pl->cost.batch,
			 pl->pred.step_ms, pl->pred.experts_ms, pl->pred.dense_ms);
	char split[160];
	if (pl->auto_slots && !pl->auto_kept_even)
		snprintf(split, sizeof(split), "experts per MoE layer chosen by --auto (uneven, "
			 "see each layer)");
	else
		snprintf(split, sizeof(split), "%" PRId64 " experts per MoE layer, +1 in %" PRId64
			 " of them%s", pl->even_k, pl->n_extra,
			 pl->auto_kept_even ? " (--auto found no gain over this even split)" : "");
	char even[200] = "";
	if (pl->auto_slots && pl->n_batch == 1)
		snprintf(even, sizeof(even), "\nthe even split would predict %.3f ms (hit rate "
			 "%.4f)", pl->even_pred.step_ms, pl->even_hit_rate);
	snprintf(header, sizeof(header), "written by moet-hybrid plan from %s (%s routings)\n"
		 "%d GPUs, budget %" PRIu64 " bytes, reserve %" PRIu64 " bytes each; %s\n"
		 "expected hit rate overall: %.4f%s%s",
		 o->profile, moet_plan_phase_name(o->phase), pl->n_gpus, o->b.budget_bytes,
		 o->b.reserve_bytes, split, pl->hit_rate, pred, even);
	if (!rc)
		rc = moet_placement_save(p, o->out, header, (const char *const *)com);
	for (int64_t l = 0; com && l < L; l++)
		free(com[l]);
	free(com);
	return rc;
}

static void print_eval(const plopts *o, const moet_plan *pl, const moet_plan_eval *ev)
{
	if (o->json) {
		printf("{\"hit_rate\": %.6f, \"optimal_hit_rate\": %.6f, \"first_k_hit_rate\": "
		       "%.6f,"
		       " \"random_hit_rate\": %.6f, \"random_expected_hit_rate\": %.6f",
		       ev->hit_rate, ev->optimal_hit_rate, ev->first_k_hit_rate,
		       ev->random_hit_rate, ev->random_expected);
		if (ev->generator_hit_rate >= 0)
			printf(", \"generator_hit_rate\": %.6f, \"generator_expected_share\": %.6f",
			       ev->generator_hit_rate, ev->generator_expected);
		printf(", \"train_hit_rate\": %.6f, \"ratio_to_optimal\": %.6f, \"phase\": \"%s\", "
		       "\"gpus\": %d, \"experts_per_layer\": [", ev->train_hit_rate,
		       ev->optimal_hit_rate > 0 ? ev->hit_rate / ev->optimal_hit_rate : 0.0,
		       moet_plan_phase_name(o->phase), pl->n_gpus);
		int first = 1;
		for (int64_t l = 0; l < pl->n_layers; l++)
			if (pl->per_layer[l]) {
				printf("%s%" PRId64, first ? "" : ", ", pl->per_layer[l]);
				first = 0;
			}
		printf("]}\n");
		return;
	}
	printf("evaluation on %s (%s routings), plan from %s; %" PRId64 " experts per MoE layer "
	       "(+1 in %" PRId64 ") of %" PRId64 "\n", o->holdout, moet_plan_phase_name(o->phase),
	       o->profile, pl->even_k, pl->n_extra, pl->n_experts);
	printf("  %-44s hit_rate\n", "placement");
	printf("  %-44s %.4f  (on the profile itself %.4f)\n",
	       "frequency, planned from the profile", ev->hit_rate, ev->train_hit_rate);
	printf("  %-44s %.4f\n", "hindsight optimum (the held-out top experts)",
	       ev->optimal_hit_rate);
	if (ev->generator_hit_rate >= 0)
		printf("  %-44s %.4f  (its share under generator.json: %.4f)\n",
		       "the generator's distribution (hot experts)", ev->generator_hit_rate,
		       ev->generator_expected);
	printf("  %-44s %.4f\n", "first-K", ev->first_k_hit_rate);
	printf("  %-44s %.4f  (one draw, seed %" PRIu64 "; expectation %.4f)\n", "uniform random",
	       ev->random_hit_rate, o->seed, ev->random_expected);
	if (ev->optimal_hit_rate > 0)
		printf("frequency / hindsight optimum: %.2f%%\n",
		       100.0 * ev->hit_rate / ev->optimal_hit_rate);
}

static int run_plan(const plopts *o)
{
	moet_config cf;
	moet_ckpt *ck = NULL;
	moet_placement_sizes *sz = NULL;
	moet_profile *train = NULL, *test = NULL;
	moet_gen_truth *truth = NULL;
	moet_plan *pl = NULL;
	moet_placement *p = NULL;
	double *scores = NULL, *tscores = NULL;
	plopts op = *o;
	int rc = moet_config_load(o->model, &cf);
	if (!rc)
		rc = moet_ckpt_open(o->model, &ck);
	if (!rc)
		rc = moet_placement_sizes_from_ckpt(&cf, ck, &sz);
	if (!rc && !(rc = moet_profile_load(o->profile, &train)))
		rc = moet_profile_check(train, &cf, o->profile);
	if (!rc && o->evaluate && !(rc = moet_profile_load(o->holdout, &test)))
		rc = moet_profile_check(test, &cf, o->holdout);
	if (!rc && o->evaluate) {
		rc = moet_gen_truth_load(o->model, &cf, &truth);
		if (rc == MOET_ENOTFOUND)
			rc = 0;
	}
	if (!rc && !o->reserve_set)
		op.b.reserve_bytes = o->b.budget_bytes / 10;
	if (!rc)
		rc = moet_plan_scores(train, o->phase, &scores);
	double seen = 0;
	for (int64_t i = 0; !rc && i < train->n_layers * train->n_experts; i++)
		seen += scores[i];
	if (!rc && seen == 0)
		rc = moet_err(MOET_EINVAL, "%s: no %s routings to plan from (profiled with "
			      "--max-new 0?); try --phase prefill or both", o->profile,
			      moet_plan_phase_name(o->phase));
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!rc)
		rc = moet_plan_make(&cf, sz, scores, &op.b, &pl);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	const double ms = 1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec -
								       t0.tv_nsec);
	if (!rc)
		rc = moet_plan_to_placement(pl, &cf, o->out ? o->out : "plan", &op.b, &p);
	if (!rc)
		rc = moet_placement_check(p, sz);
	if (!rc && !(o->evaluate && o->json)) {
		printf("plan: model %s (sizes from the checkpoint), profile %s\n", o->model,
		       o->profile);
		print_plan(&op, pl, p, sz, ms);
	}
	if (!rc && o->evaluate) {
		moet_plan_eval ev;
		if (!(rc = moet_plan_scores(test, o->phase, &tscores)) &&
		    !(rc = moet_plan_evaluate(pl, tscores, truth, o->seed, &ev)))
			print_eval(&op, pl, &ev);
	}
	if (!rc && o->out) {
		rc = write_plan(&op, pl, p);
		if (!rc && !(o->evaluate && o->json))
			printf("wrote %s\n", o->out);
	}
	free(scores);
	free(tscores);
	moet_placement_free(p);
	moet_plan_free(pl);
	moet_gen_truth_free(truth);
	moet_profile_free(train);
	moet_profile_free(test);
	moet_placement_sizes_free(sz);
	moet_ckpt_close(ck);
	return rc;
}

/* ---- --predict ------------------------------------------------------------------------- */

/* s as a JSON string (quotes and backslashes escaped, control characters as \u00XX). */
static void json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c == '"' || *c == '\\')
			printf("\\%c", *c);
		else if (*c < 0x20)
			printf("\\u%04x", *c);
		else
			putchar(*c);
	}
	putchar('"');
}

static int profile_phase(moet_plan_phase ph)
{
	return ph == MOET_PLAN_PREFILL ? MOET_PROFILE_PREFILL : ph == MOET_PLAN_BOTH ?
	       MOET_COST_PHASE_BOTH : MOET_PROFILE_DECODE;
}

static void print_predict_json(const plopts *o, const moet_placement *p, double hit,
			       const moet_cost_pred *pr)
{
	const moet_cost_hw *h = &o->hw;
	printf("{\"model\": ");
	json_str(o->model);
	printf(", \"placement\": ");
	json_str(o->placement);
	printf(", \"profile\": ");
	json_str(o->profile);
	printf(", \"phase\": \"%s\", \"gpus\": %d, \"hit_rate\": %.6f, \"hardware\": {\"name\": ",
	       moet_plan_phase_name(o->phase), moet_placement_n_gpus(p), hit);
	json_str(h->name);
	printf(", \"file\": ");
	if (h->from_file)
		json_str(o->hardware);
	else
		printf("null");
	printf(", \"cpu_read_gbps\": %g, \"gpu_read_gbps\": %g, \"pcie_gbps\": %g, "
	       "\"cpu_fma_gflops\": %g, \"gpu_sgemm_gflops\": %g, \"cpu_fma_points\": %d, "
	       "\"gpu_sgemm_points\": %d, \"layer_max\": \"%s\"}, \"predictions\": [",
	       h->cpu_read_gbps, h->gpu_read_gbps, h->pcie_gbps, h->cpu_fma_gflops,
	       h->gpu_sgemm_gflops, h->cpu_fma_frac.n, h->gpu_sgemm_frac.n,
	       moet_cost_layer_max_name(h->layer_max));
	for (int i = 0; i < o->n_batch; i++) {
		const moet_cost_pred *q = &pr[i];
		printf("%s\n {\"batch\": %" PRId64 ", \"step_ms\": %.9g, \"gpu_expert_ms\": %.9g, "
		       "\"cpu_expert_ms\": %.9g, \"pcie_ms\": %.9g, \"overhead_ms\": %.9g, "
		       "\"spread_ms\": %.9g, \"dense_ms\": %.9g, \"cpu_busy_ms\": %.9g, "
		       "\"gpu_busy_ms\": %.9g, "
		       "\"cpu_distinct\": %.9g, \"gpu_distinct\": %.9g, \"cpu_rows\": %.9g, "
		       "\"gpu_rows\": %.9g, \"tokens_per_s\": %.9g, \"one_pass_ms\": %.9g, "
		       "\"chosen\": \"%s\", \"chosen_ms\": %.9g, \"two_halves_ms\": ",
		       i ? "," : "", q->batch,
		       q->step_ms, q->gpu_expert_ms, q->cpu_expert_ms, q->transfer_ms,
		       q->overhead_ms, q->spread_ms, q->dense_ms, q->cpu_ms, q->gpu_ms,
		       q->cpu_distinct, q->gpu_distinct, q->cpu_rows, q->gpu_rows,
		       q->step_ms > 0 ? 1e3 * (double)q->batch / q->step_ms : 0.0, q->step_ms,
		       moet_cost_form_name(q->form), q->chosen_ms);
		const moet_cost_mb *t = &q->two;
		if (!t->possible) {
			printf("null, \"two_halves\": null}");
			continue;
		}
		printf("%.9g, \"two_halves\": {\"batch_a\": %" PRId64 ", \"batch_b\": %" PRId64
		       ", \"layers_ms\": %.9g, \"dense_ms\": %.9g, \"dense_in_layers_ms\": %.9g, "
		       "\"cpu_busy_ms\": %.9g, \"gpu_busy_ms\": %.9g, \"pcie_ms\": %.9g, "
		       "\"cpu_distinct\": %.9g, \"cpu_shared\": %.9g}}", t->step_ms, t->batch_a,
		       t->batch_b, t->layers_ms, t->dense_ms, t->dense_in_layers_ms, t->cpu_ms,
		       t->gpu_ms, t->transfer_ms, t->cpu_distinct, t->cpu_shared);
	}
	printf("]}\n");
}

/* The engine's two forms of each step (the table above is the one-pass form). */
static void print_forms(const moet_cost_pred *pr, int n)
{
	printf("forms: one pass, or two micro-batches (halves interleaved layer by layer; only "
	       "with one GPU and batch >= 2); the engine runs the faster\n");
	printf("  %6s %11s %13s %-10s %9s %12s %12s %10s %13s\n", "batch", "one_pass_ms",
	       "two_halves_ms", "chosen", "halves", "cpu_reads_1", "cpu_reads_2", "read_twice",
	       "dense_hid_ms");
	for (int i = 0; i < n; i++) {
		const moet_cost_pred *q = &pr[i];
		const moet_cost_mb *t = &q->two;
		char two[32] = "-", halves[32] = "-", r2[32] = "-", sh[32] = "-", hid[32] = "-";
		if (t->possible) {
			snprintf(two, sizeof(two), "%.3f", t->step_ms);
			snprintf(halves, sizeof(halves), "%" PRId64 "+%" PRId64, t->batch_a,
				 t->batch_b);
			snprintf(r2, sizeof(r2), "%.2f", t->cpu_distinct);
			snprintf(sh, sizeof(sh), "%.2f", t->cpu_shared);
			snprintf(hid, sizeof(hid), "%.3f", t->dense_in_layers_ms);
		}
		printf("  %6" PRId64 " %11.3f %13s %-10s %9s %12.2f %12s %10s %13s\n", q->batch,
		       q->step_ms, two, moet_cost_form_name(q->form), halves, q->cpu_distinct, r2,
		       sh, hid);
	}
	printf("cpu_reads: expected cold-expert reads per step (1: one pass, 2: both halves); "
	       "read_twice: of them, experts both halves read; dense_hid: both halves' dense work "
	       "inside the MoE layers, which the CPU tier can hide\n");
}

static void print_predict(const plopts *o, const moet_placement *p, double hit,
			  const moet_cost_pred *pr)
{
	int64_t on_gpu = 0;
	const int16_t *own = moet_placement_owners(p);
	const int64_t n = moet_placement_n_layers(p) * moet_placement_n_experts(p);
	for (int64_t i = 0; i < n; i++)
		on_gpu += own[i] >= 0;
	printf("predict: model %s, placement %s (%d GPU%s, %" PRId64 " routed experts on them), "
	       "profile %s (%s routings: hit rate %.4f)\n", o->model, o->placement,
	       moet_placement_n_gpus(p), moet_placement_n_gpus(p) == 1 ? "" : "s", on_gpu,
	       o->profile, moet_plan_phase_name(o->phase), hit);
	print_hw(o, &o->hw);
	printf("  %6s %9s %10s %10s %8s %11s %9s %9s %9s %11s %11s %8s %8s\n", "batch",
	       "step_ms", "gpu_exp_ms", "cpu_exp_ms", "pcie_ms", "overhead_ms", "spread_ms",
	       "dense_ms", "tok/s", "cpu_busy_ms", "gpu_busy_ms", "cpu_r/e", "gpu_r/e");
	for (int i = 0; i < o->n_batch; i++) {
		const moet_cost_pred *q = &pr[i];
		printf("  %6" PRId64 " %9.3f %10.3f %10.3f %8.3f %11.3f %9.3f %9.3f %9.1f %11.3f "
		       "%11.3f %8.2f %8.2f\n", q->batch, q->step_ms, q->gpu_expert_ms,
		       q->cpu_expert_ms, q->transfer_ms, q->overhead_ms, q->spread_ms, q->dense_ms,
		       q->step_ms > 0 ? 1e3 * (double)q->batch / q->step_ms : 0.0, q->cpu_ms,
		       q->gpu_ms, q->cpu_distinct > 0 ? q->cpu_rows / q->cpu_distinct : 0.0,
		       q->gpu_distinct > 0 ? q->gpu_rows / q->gpu_distinct : 0.0);
	}
	printf("step = gpu_exp + cpu_exp + pcie + overhead + spread + dense (each MoE layer "
	       "counted on its slower tier; spread: --layer-max spread's expected max over the "
	       "max of the means); *_busy: each tier's own sum over layers; r/e: expected rows "
	       "per touched expert\n");
	print_forms(pr, o->n_batch);
}

static int run_predict(const plopts *o)
{
	moet_config cf;
	moet_ckpt *ck = NULL;
	moet_placement_sizes *sz = NULL;
	moet_profile *prof = NULL;
	moet_placement *p = NULL;
	double *scores = NULL;
	uint8_t *mask = NULL;
	moet_cost_pred pr[MAX_BATCHES];
	int rc = moet_config_load(o->model, &cf);
	if (!rc)
		rc = moet_ckpt_open(o->model, &ck);
	if (!rc)
		rc = moet_placement_sizes_from_ckpt(&cf, ck, &sz);
	if (!rc && !(rc = moet_profile_load(o->profile, &prof)))
		rc = moet_profile_check(prof, &cf, o->profile);
	if (!rc)
		rc = moet_placement_load(o->placement, &cf, sz, &p);
	for (int i = 0; !rc && i < o->n_batch; i++)
		rc = moet_cost_predict_step(&cf, sz, p, prof, profile_phase(o->phase), &o->hw,
					    o->batch[i], &pr[i]);
	const int64_t n = cf.num_hidden_layers * cf.n_routed_experts;
	if (!rc && !(rc = moet_plan_scores(prof, o->phase, &scores)) &&
	    !(mask = malloc((size_t)(n > 0 ? n : 1))))
		rc = moet_err(MOET_ENOMEM, "predict");
	if (!rc) {
		const int16_t *own = moet_placement_owners(p);
		for (int64_t i = 0; i < n; i++)
			mask[i] = own[i] >= 0;
		const double hit = moet_plan_hit_rate(scores, cf.num_hidden_layers,
						      cf.n_routed_experts, mask);
		if (o->json)
			print_predict_json(o, p, hit, pr);
		else
			print_predict(o, p, hit, pr);
	}
	free(scores);
	free(mask);
	moet_placement_free(p);
	moet_profile_free(prof);
	moet_placement_sizes_free(sz);
	moet_ckpt_close(ck);
	return rc;
}

/*
 * "1,4,16" or "1:2,16:1" -> batches and weights (1 where none is given); 0 or MOET_EINVAL
 * with one line naming --batch, the argument, the item and the fault.
 */
static int parse_batches(const char *s, plopts *o)
{
	const char *at = s;
	o->n_batch = 0;
	o->weighted = 0;
	o->batch_arg = s;
	if (!*s)
		return moet_err(MOET_EINVAL, "--batch: empty");
	for (int item = 1;; item++) {
		char *end;
		if (*at == ',' || !*at)
			return moet_err(MOET_EINVAL, "--batch '%s': item %d is empty (want B or B:W, "
					"comma-separated)", s, item);
		if (o->n_batch == MAX_BATCHES)
			return moet_err(MOET_EINVAL, "--batch '%s': more than %d sizes", s,
					MAX_BATCHES);
		long long b = strtoll(at, &end, 10);
		if (end == at || (*end && *end != ',' && *end != ':') || b < 1 || b > 1000000)
			return moet_err(MOET_EINVAL, "--batch '%s': item %d: the batch must be a whole "
					"number from 1 to 1000000", s, item);
		double w = 1;
		if (*end == ':') {
			const char *ws = end + 1;
			if (!*ws || *ws == ',')
				return moet_err(MOET_EINVAL, "--batch '%s': item %d: no weight after "
						"':'", s, item);
			w = strtod(ws, &end);
			if (end == ws || (*end && *end != ','))
				return moet_err(MOET_EINVAL, "--batch '%s': item %d: weight '%.*s' is "
						"not a number", s, item,
						(int)strcspn(ws, ","), ws);
			if (!(w > 0) || !isfinite(w))
				return moet_err(MOET_EINVAL, "--batch '%s': item %d: weight %g must be "
						"positive and finite", s, item, w);
			o->weighted = 1;
		}
		o->batch[o->n_batch] = b;
		o->weight[o->n_batch++] = w;
		if (!*end)
			return 0;
		at = end + 1;
		if (!*at)
			return moet_err(MOET_EINVAL, "--batch '%s': ends with a comma", s);
	}
}

int moet_cli_plan(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "profile", required_argument, NULL, 'p' },
		{ "holdout", required_argument, NULL, 'H' },
		{ "gpus", required_argument, NULL, 'g' },
		{ "vram-gb", required_argument, NULL, 'v' },
		{ "reserve-gb", required_argument, NULL, 'r' },
		{ "hot-per-layer", required_argument, NULL, 'k' },
		{ "phase", required_argument, NULL, 'P' },
		{ "out", required_argument, NULL, 'o' },
		{ "evaluate", no_argument, NULL, 'e' },
		{ "json", no_argument, NULL, 'j' },
		{ "seed", required_argument, NULL, 's' },
		{ "auto", no_argument, NULL, 'A' },
		{ "hardware", required_argument, NULL, 'W' },
		{ "batch", required_argument, NULL, 'B' },
		{ "predict", no_argument, NULL, 'D' },
		{ "placement", required_argument, NULL, 'L' },
		{ "layer-max", required_argument, NULL, 'X' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	plopts o = { .phase = MOET_PLAN_DECODE, .seed = 1, .b.batch = 1, .n_batch = 1,
		     .batch = { 1 }, .weight = { 1 } };
	const char *vram = NULL, *reserve = NULL, *layer_max = NULL;
	int c, bad = 0, rc = 0, lmax = MOET_COST_MAX_SPREAD;
	char *end;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o.model = optarg; break;
		case 'p': o.profile = optarg; break;
		case 'H': o.holdout = optarg; break;
		case 'g': o.b.n_gpus = (int)strtol(optarg, &end, 10); bad |= *end != 0; break;
		case 'v': vram = optarg; break;
		case 'r': reserve = optarg; break;
		case 'k': o.b.hot_per_layer = strtoll(optarg, &end, 10);
			bad |= *end || o.b.hot_per_layer < 1; break;
		case 'P': if (!rc) rc = moet_plan_phase_parse(optarg, &o.phase); break;
		case 'o': o.out = optarg; break;
		case 'e': o.evaluate = 1; break;
		case 'j': o.json = 1; break;
		case 's': o.seed = strtoull(optarg, &end, 10); bad |= *end != 0; break;
		case 'A': o.b.auto_slots = true; break;
		case 'W': o.hardware = optarg; break;
		case 'B': if (!rc) rc = parse_batches(optarg, &o);
			o.b.batch = o.batch[0]; break;
		case 'D': o.predict = 1; break;
		case 'L': o.placement = optarg; break;
		case 'X': layer_max = optarg;
			if (!rc) rc = moet_cost_layer_max_parse(optarg, &lmax);
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (o.predict) {
		/* --predict reads the placement: nothing of planning goes with it. */
		if (optind < argc || !o.model || !o.profile || !o.placement || o.evaluate ||
		    o.b.auto_slots || o.b.n_gpus || vram || reserve || o.b.hot_per_layer || o.out ||
		    o.holdout) {
			usage(stderr);
			return 2;
		}
		if (!rc && bad)
			rc = moet_err(MOET_EINVAL, "--seed takes an integer");
		if (!rc && o.weighted)
			rc = moet_err(MOET_EINVAL, "--batch '%s': weights (B:W) only go with planning "
				      "(--auto, --hardware): --predict prints each batch", o.batch_arg);
		if (!rc && o.hardware)
			rc = moet_cost_hw_load(o.hardware, &o.hw);
		else if (!rc)
			moet_cost_hw_defaults(&o.hw);
		o.hw.layer_max = lmax;
		if (!rc)
			rc = run_predict(&o);
		return rc ? moet_cli_fail("plan", rc) : 0;
	}
	if (optind < argc || !o.model || !o.profile || !o.b.n_gpus || !vram || o.placement ||
	    (!o.evaluate && !o.out) || (o.evaluate && !o.holdout) || (o.json && !o.evaluate)) {
		usage(stderr);
		return 2;
	}
	/* A list or weights need the cost model (--auto or --hardware): without one the batch
	 * changes nothing. */
	if (!rc && o.n_batch != 1 && !o.b.auto_slots && !o.hardware)
		rc = moet_err(MOET_EINVAL, "--batch '%s': a list only with --predict, --auto or "
			      "--hardware (the cost model)", o.batch_arg);
	if (!rc && o.weighted && !o.b.auto_slots && !o.hardware)
		rc = moet_err(MOET_EINVAL, "--batch '%s': weights only with --auto or --hardware "
			      "(the cost model)", o.batch_arg);
	if (!rc && (bad || o.b.n_gpus < 1 || o.b.n_gpus > MOET_PLACEMENT_MAX_GPUS))
		rc = moet_err(MOET_EINVAL, "--gpus (1..%d), --hot-per-layer (>= 1) and --seed take "
			      "integers in range",
			      MOET_PLACEMENT_MAX_GPUS);
	if (!rc && o.b.auto_slots && o.b.hot_per_layer)
		rc = moet_err(MOET_EINVAL, "--auto chooses the experts per layer: it does not "
			      "go with --hot-per-layer");
	if (!rc && layer_max && !o.b.auto_slots && !o.hardware)
		rc = moet_err(MOET_EINVAL, "--layer-max %s: only with --predict, --auto or "
			      "--hardware (the cost model)", layer_max);
	if (!rc && (o.b.auto_slots || o.hardware)) {
		if (o.hardware)
			rc = moet_cost_hw_load(o.hardware, &o.hw);
		else
			moet_cost_hw_defaults(&o.hw);
		o.hw.layer_max = lmax;
		o.b.hw = &o.hw;
		o.b.n_mix = o.n_batch;
		memcpy(o.b.mix_batch, o.batch, sizeof(o.b.mix_batch));
		memcpy(o.b.mix_weight, o.weight, sizeof(o.b.mix_weight));
	}
	if (!rc)
		rc = parse_gib("--vram-gb", vram, &o.b.budget_bytes);
	if (!rc && !o.b.budget_bytes)
		rc = moet_err(MOET_EINVAL, "--vram-gb %s: must be > 0", vram);
	if (!rc && reserve) {
		rc = parse_gib("--reserve-gb", reserve, &o.b.reserve_bytes);
		o.reserve_set = 1;
	}
	if (!rc)
		rc = run_plan(&o);
	return rc ? moet_cli_fail("plan", rc) : 0;
}
