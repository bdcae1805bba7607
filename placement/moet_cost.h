/*
 * moet_cost.h: the decode step cost model of `plan --auto` and `plan --predict`
 * (docs/profile-and-plan.md).
 *
 * What a decode step of B sequences costs in the MoE layers, predicted from a routing profile
 * and a hardware description. Each tier (the CPU, each GPU) runs its experts one call after
 * another; a call of one expert on r rows (tokens routed to it) is priced by a roofline:
 *
 *   t(r)     = max(bytes / read, r x F / (frac(r) x peak))    r >= 1; t(0) = 0
 *              F = 6 x hidden x moe_intermediate flops per row (gate, up, down);
 *              frac(r): the tier's kernel's measured fraction of the tier's peak (FMA on the
 *              CPU, SGEMM on a GPU) at r tokens per expert, from `bench` records, interpolated
 *              (see moet_cost_curve); no curve: bandwidth only
 *   p_e      = c_e x k / sum_e' c_e'      probability that one token routes to expert e
 *                                         (c: the profile's counts of the layer; a token picks
 *                                         k distinct experts, so sum_e p_e = k)
 *   R_e      ~ Binomial(B, p_e)           rows of e in a step (tokens routed independently)
 *   P_e      = 1 - (1 - p_e)^B            probability that a step touches e (R_e >= 1)
 *   T_e      = E[t(R_e)]                  expected call time on the tier that holds e
 *   D_tier   = sum over the tier's experts of P_e        expected distinct experts touched
 *   A_tier   = 1 - prod over them of (1 - P_e)           probability the tier works at all
 *
 *   t_cpu    = A_cpu x cpu_overhead + sum over CPU experts of T_e (CPU t)
 *   t_gpu    = max over GPUs g of (A_g x gpu_overhead + sum over g's experts of T_e (GPU t))
 *   transfer = A_cpu x (2 x pcie_latency + 2 x B x d_model x act_bytes / pcie)
 *                                         (hidden states to the host and results back)
 *   t_layer  = max(t_cpu, t_gpu) + transfer
 *   step     = sum over MoE layers of t_layer + dense
 *   dense    = (dense bytes - embedding bytes) / gpu_read    (the same for every placement)
 *
 * Without compute (no curves) T_e = P_e x bytes / read, and the tier's expert time is
 * D_tier x bytes / read: the bandwidth-only model. At B = 1 every touched expert has one row,
 * so the two agree exactly whenever F / (frac(1) x peak) <= bytes / read (true of the H200
 * figures, with a margin of 1.4x on the CPU and 1.7x on the GPU).
 *
 * The max: the engine runs the CPU tier and the GPU tiers of a layer at the same time and the
 * layer ends with the slower one; the copies are not overlapped. Simplifications, said so:
 * expectations are taken per tier before the max (E[max] >= max E, so the model is
 * optimistic when the tiers are close; they seldom are: the CPU reads ~30x slower); the
 * experts of a step are touched independently; the dense part is priced by its bytes only
 * (its compute at large B is not modelled). Time in milliseconds, bandwidths in GB/s (10^9
 * bytes), compute in GFLOP/s.
 *
 * Two micro-batches (the engine's other form, runtime/forward.c: halves of B_a = max(1,
 * floor(B / 2)) and B_b = B - B_a sequences interleaved layer by layer). Each half h is priced
 * as a step of its own at B_h: its CPU tier reads the cold experts its own tokens route to
 * (P_e,h = 1 - (1 - p_e)^B_h; a cold expert both halves route to is read twice: expected
 * sum of P_e,a x P_e,b more reads than one pass), with C_h, G_h and Y_h its CPU tier, GPU tier
 * and copies as above and N_h = dense(B_h) x s / (MoE layers) its share of the dense work in
 * one MoE layer (s = dense_moe_share: attention, router and shared experts of the MoE layers
 * over the dense part). The GPU runs one half's dense work while the CPU tier works on the
 * other's experts, so a layer takes the period of a two-job, two-machine cycle:
 *
 *   t_layer2 = max(C_a + C_b,                              the CPU tier's load
 *                  sum_h (N_h + G_h + Y_h),                the GPU's and the copies' load
 *                  N_h + max(C_h, G_h) + Y_h for each h)   one half's own chain
 *   step2    = sum over MoE layers of t_layer2 + sum_h dense(B_h) x (1 - s)
 *
 * (one half, h = the whole batch, gives the one-pass step exactly). The engine measures both
 * forms and keeps the faster; the prediction of its choice is the smaller step. Only with one
 * GPU and B >= 2 (the engine does not split otherwise). Not modelled: the pipeline's fill and
 * drain (optimistic by about one half-layer), the dense part beyond the MoE layers
 * overlapping anything.
 */
#ifndef MOET_COST_H
#define MOET_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moet_config.h"
#include "moet_placement.h"
#include "moet_profile.h"

#define MOET_COST_NAME_BYTES 64
#define MOET_COST_MAX_POINTS 16      /* points of a compute curve */

/*
 * A kernel's measured compute rate as a fraction of its tier's peak, by tokens per expert.
 * Points (tokens[i], frac[i]), tokens strictly increasing, fractions in (0, 1], and the
 * compute time per row-of-flops tokens / frac never falling (more tokens never take less
 * time). Between points the compute time r / frac(r) is interpolated linearly in r; below the
 * first point and above the last the nearest point's fraction holds. n = 0: no compute term.
 */
typedef struct moet_cost_curve {
	int n;
	double tokens[MOET_COST_MAX_POINTS];     /* tokens per expert, >= 1 */
	double frac[MOET_COST_MAX_POINTS];       /* fraction of the peak at tokens[i] */
} moet_cost_curve;

/* The hardware the model is priced on (configs/hardware-*.yaml, or the defaults). */
typedef struct moet_cost_hw {
	char name[MOET_COST_NAME_BYTES];
	double cpu_read_gbps;        /* all cores streaming expert weights, GB/s */
	double gpu_read_gbps;        /* one GPU's expert kernel at decode, GB/s */
	double pcie_gbps;            /* pinned host <-> device, one direction, GB/s */
	double pcie_latency_us;      /* per copy */
	double stage_copy_gbps;      /* a cold expert's bytes from the mapped checkpoint to a
				      * device slot (pageable: the driver stages them), GB/s */
	double stage_pinned_gbps;    /* the same through the pinned uploader's waves
				      * (MOET_STAGE_COPY=pinned, the default on a GPU), GB/s */
	double cpu_overhead_us;      /* per MoE layer and step when the CPU tier works */
	double gpu_overhead_us;      /* per MoE layer and step per GPU that works */
	double act_bytes;            /* bytes per activation element copied (4: binary32) */
	bool from_file;              /* false: the built-in defaults */
	/* Compute (added for batches above 1; the bandwidth terms above are unchanged): */
	double cpu_fma_gflops;       /* all cores' FMA peak (bench cpu-experts fma_GFLOPs) */
	double gpu_sgemm_gflops;     /* one GPU's SGEMM, no TF32 (bench gpu-experts sgemm_GFLOPs) */
	moet_cost_curve cpu_fma_frac;    /* the exact CPU expert kernel's share of the FMA peak */
	moet_cost_curve gpu_sgemm_frac;  /* the GPU expert kernel's share of the SGEMM peak */
	/* The dense part of a decode step on the GPU (attention, dense MLPs, norms, router,
	 * lm_head, sampling, launches and copies), measured: batch -> ms (bench e2e: the gpu
	 * mode's step minus its routed experts); empty: dense bytes / gpu_read_gbps. Linear
	 * between points, the first point's below it, the last two points' line above. */
	moet_cost_curve gpu_dense_ms;
	/* Not a figure of the file (the reader leaves it at the default, the writer never
	 * writes it): how a layer's max of its tiers is taken, MOET_COST_MAX_MEANS (0, the
	 * library's default) or MOET_COST_MAX_SPREAD; set by the caller (plan --layer-max,
	 * whose default is the spread; bench e2e prices both). */
	int layer_max;
} moet_cost_hw;

/*
 * A layer waits for the slower of its tiers. MOET_COST_MAX_MEANS: the max of the tiers'
 * expected times, max(E[C], E[G]) (optimistic when they are close: the CPU tier's time C
 * varies from step to step with its experts' rows). MOET_COST_MAX_SPREAD: the expected max
 * E[max(C, G)] with C normal, of the mean E[C] and the variance sum_e Var t(R_e) of its
 * calls (R_e ~ Binomial(B, p_e), independent), and G at its mean (a GPU call is ~30x
 * shorter, so its spread is small beside the CPU's):
 *
 *   E[max(C, G)] = G + sd x (phi(d) + d x Phi(d)),   d = (E[C] - G) / sd
 *
 * used where the layer has both a CPU tier and a GPU tier with work (else the means). The
 * one-pass form only; the two-micro-batch form (cost_mb.c) keeps the means.
 */
#define MOET_COST_MAX_MEANS 0
#define MOET_COST_MAX_SPREAD 1

/* "means" / "spread" -> MOET_COST_MAX_*; MOET_EINVAL naming the value otherwise. */
int moet_cost_layer_max_parse(const char *s, int *out);
const char *moet_cost_layer_max_name(int layer_max);

/* The built-in defaults: the H200 machine of docs/benchmarks (as in
 * configs/hardware-h200-host.yaml). */
void moet_cost_hw_defaults(moet_cost_hw *out);

/*
 * Reads a hardware file: a YAML mapping of the keys above (name, cpu_read_gbps, ...; any key
 * left out keeps its default). The curves are mappings of tokens: fraction ("cpu_fma_frac:
 * {2: 0.198, 4: 0.324}"; {} turns the tier's compute term off). Errors, one line
 * "PATH:LINE: fault" naming the key: MOET_EIO (cannot read), MOET_EFORMAT (malformed YAML,
 * not a mapping, an unknown or repeated key, a value that is not a number, a curve that is
 * not a mapping of whole token counts), MOET_ERANGE (a bandwidth or peak <= 0, an overhead or
 * latency < 0, act_bytes not in 1..8, a fraction not in (0, 1], tokens not increasing, a
 * point where more tokens would take less time, more than MOET_COST_MAX_POINTS points).
 */
int moet_cost_hw_load(const char *path, moet_cost_hw *out);

/* Like moet_cost_hw_load from text in memory; `label` stands for the path in errors. */
int moet_cost_hw_parse(const char *label, const char *text, size_t n_bytes, moet_cost_hw *out);

/* One item of a hardware file to write: a key's figure under its comment, or a comment. */
typedef struct moet_cost_hw_entry {
	const char *key;     /* a key moet_cost_hw_load reads (name, cpu_read_gbps, ...), or
				NULL: the comment alone (e.g. why a figure is left out) */
	const char *comment; /* '# ' lines above the key: '\n' breaks a line, long lines wrap;
				NULL: none */
} moet_cost_hw_entry;

/*
 * Writes a hardware file: `header` (comment lines, may be NULL), then each entry in order, a
 * blank line between them, each key with its figure from hw (numbers in the fewest digits
 * that read back to the same double; curves in block style, {} when empty). Keys not among
 * the entries are left out, so the reader's defaults apply to them. The text is parsed back
 * (moet_cost_hw_parse) before the file is created: it always loads, every written figure bit
 * for bit. Errors: MOET_EINVAL (an unknown or repeated key, a name with quotes or control
 * characters, a figure the reader refuses, naming it: nothing is written), MOET_EIO ("PATH:
 * cannot create: ..." or a write error), MOET_ENOMEM. hw and entries are only read.
 */
int moet_cost_hw_save(const char *path, const moet_cost_hw *hw, const char *header,
		      const moet_cost_hw_entry *entries, int n_entries);

/* What the prediction needs besides the profile. */
typedef struct moet_cost_in {
	moet_cost_hw hw;
	int64_t batch;               /* B: sequences per decode step, >= 1 */
	int64_t top_k;               /* num_experts_per_tok */
	int64_t d_model;             /* hidden_size */
	uint64_t expert_bytes;       /* bytes of one routed expert */
	uint64_t dense_bytes;        /* dense part without the embedding (read every step) */
	int n_gpus;                  /* 1 .. 64; 0 (moet_cost_predict only): no GPU, all on
				      * the host: no copies, the dense part read by the CPU */
	int64_t moe_inter;           /* moe_intermediate_size; 0: no compute term */
	double dense_moe_share;      /* 0..1: the dense part's share inside the MoE layers, which
				      * two micro-batches overlap (moet_cost_dense_moe_share);
				      * 0: none overlapped */
} moet_cost_in;

/* The share of the dense part (without the embedding) that lies in the MoE layers, by bytes:
 * their attention (attn_bytes x MoE layers / layers), routers and shared experts, over
 * dense_bytes - embed_bytes; 0 when that is 0. */
double moet_cost_dense_moe_share(const moet_config *cf, const moet_placement_sizes *sz);

/* P[i] = 1 - (1 - p_i)^B for one layer's scores s[0..n-1] (p_i = s_i x k / sum s, at most
 * 1). All 0 when the scores sum to 0. */
void moet_cost_touch(const double *s, int64_t n, int64_t top_k, int64_t batch, double *P);

/* The time (ms) of one expert call with `rows` rows (>= 0, fractional rows interpolate) on
 * the GPU (gpu true) or the CPU: t(r) above; t(0) = 0. Non-decreasing in rows for any curve
 * the reader accepts. */
double moet_cost_call_ms(const moet_cost_in *in, bool gpu, double rows);

/*
 * One layer's experts: P[i] as moet_cost_touch, and the expected call times
 * t_cpu[i] = E[CPU t(R_i)] and t_gpu[i] = E[GPU t(R_i)] with R_i ~ Binomial(B, p_i) (ms).
 * Exact sums over the binomial's mass within 12 standard deviations of its mean; for a wide
 * distribution (more than 1024 terms: sd > ~42 rows, mean > ~1760 rows) the call time at the
 * mean rows given a touch, P x t(B p / P), which is exact when t is linear over the window
 * (beyond the curve's last point: 1024 tokens in the H200 figures). Non-decreasing in p and
 * in B. t_cpu / t_gpu may be NULL.
 */
void moet_cost_expert_ms(const moet_cost_in *in, const double *s, int64_t n, double *P,
			 double *t_cpu, double *t_gpu);

/* The same, and v_cpu[i] = Var[CPU t(R_i)] (ms^2; the same window, or for a wide
 * distribution P x (1 - P) x t(mean rows given a touch)^2, the touch's own spread alone).
 * Any of t_cpu, t_gpu, v_cpu may be NULL. */
void moet_cost_expert_var_ms(const moet_cost_in *in, const double *s, int64_t n, double *P,
			     double *t_cpu, double *t_gpu, double *v_cpu);

/* The layer time (ms) for tiers described by their expected expert times x and busy
 * chances A: the CPU's, and each GPU's (x_gpu[g], a_gpu[g], g < n_gpus). */
double moet_cost_layer_time_ms(const moet_cost_in *in, double x_cpu, double a_cpu,
			       const double *x_gpu, const double *a_gpu);

/* The same with v_cpu, the variance of the CPU tier's expert time (ms^2): with
 * hw.layer_max MOET_COST_MAX_SPREAD the expected max above; else (or v_cpu 0) the means. */
double moet_cost_layer_spread_ms(const moet_cost_in *in, double x_cpu, double v_cpu,
				 double a_cpu, const double *x_gpu, const double *a_gpu);

/* The bandwidth-only layer time: moet_cost_layer_time_ms with x = D x bytes / read (D: the
 * tier's expected distinct experts). */
double moet_cost_layer_ms(const moet_cost_in *in, double d_cpu, double a_cpu,
			  const double *d_gpu, const double *a_gpu);

/* The engine's two forms of a step: one pass, or two micro-batches. */
#define MOET_COST_ONE_PASS 0
#define MOET_COST_TWO_HALVES 1

/* The two-micro-batch form of a step (see the design note); all 0 when not possible. */
typedef struct moet_cost_mb {
	bool possible;               /* B >= 2 and n_gpus == 1: the engine can split */
	int64_t batch_a, batch_b;    /* the halves' sequences */
	double step_ms;              /* layers_ms + dense_ms */
	double layers_ms;            /* sum over MoE layers of t_layer2 (overlapped dense in it) */
	double dense_ms;             /* the dense part outside the MoE layers, both halves */
	double dense_in_layers_ms;   /* both halves' dense work inside the MoE layers */
	double cpu_ms;               /* sum over layers of C_a + C_b */
	double gpu_ms;               /* sum over layers of the GPU's load (N + G + Y, both) */
	double transfer_ms;          /* sum over layers of Y_a + Y_b */
	double cpu_distinct;         /* expected CPU expert reads per step, both halves */
	double cpu_shared;           /* of them, expected experts read by both halves */
} moet_cost_mb;

/* A prediction for a whole placement. */
typedef struct moet_cost_pred {
	double step_ms;              /* experts_ms + dense_ms */
	double experts_ms;           /* sum over MoE layers of t_layer */
	double dense_ms;
	double cpu_ms, gpu_ms;       /* sums over layers of t_cpu and t_gpu */
	double transfer_ms;          /* sum over layers of the copies */
	double cpu_distinct;         /* expected distinct experts per step on the CPU, all layers */
	double gpu_distinct;         /* the same on the GPUs */
	/* The step as parts that add up to step_ms, each layer's max taken by the slower tier: */
	double cpu_expert_ms;        /* expert calls of the CPU in the layers where it is slower */
	double gpu_expert_ms;        /* expert calls of the slowest GPU in the other layers */
	double overhead_ms;          /* the fixed per-layer costs of those tiers */
	double spread_ms;            /* with MOET_COST_MAX_SPREAD: sum over layers of the
				      * expected max over the max of the means; else 0 */
	/* (transfer_ms: the PCIe part; dense_ms: the dense part) */
	double cpu_rows, gpu_rows;   /* expected rows (token-expert pairs) per step, all layers */
	int64_t batch;               /* B of the prediction */
	/* (the fields above: the one-pass form) */
	moet_cost_mb two;            /* the two-micro-batch form */
	int form;                    /* the engine's choice: MOET_COST_ONE_PASS or _TWO_HALVES */
	double chosen_ms;            /* the chosen form's step: min(step_ms, two.step_ms) */
} moet_cost_pred;

/* "one pass" / "two halves". */
const char *moet_cost_form_name(int form);

/*
 * Predicts the decode step of the placement owner[L x E] (GPU index or -1 for the CPU) from
 * the scores [L x E] (layers without routings cost nothing), in both forms (step_ms and its
 * parts: one pass; `two`: two micro-batches; form, chosen_ms: the faster). MOET_EINVAL for a
 * batch < 1 or an owner out of 0 .. n_gpus-1 / -1; MOET_ENOMEM. Work: O(L x E x rows in the
 * window), three times over with one GPU and B >= 2 (the whole batch and each half).
 */
int moet_cost_predict(const moet_cost_in *in, const double *scores, int64_t n_layers,
		      int64_t n_experts, const int16_t *owner, moet_cost_pred *out);

/* Which routings of a profile a prediction reads. */
#define MOET_COST_PHASE_BOTH MOET_PROFILE_PHASES /* besides MOET_PROFILE_DECODE / _PREFILL */

/*
 * The decode step of a model under a placement: moet_cost_predict with the geometry of `cf`
 * (top-k, hidden size, moe_intermediate_size), the expert and dense bytes of `sz` (NULL:
 * computed from cf's geometry, moet_placement_sizes_from_config), the owner table of `pl`
 * (its GPUs are the GPU tiers), the counts of `prof` in `phase` (MOET_PROFILE_DECODE,
 * MOET_PROFILE_PREFILL or MOET_COST_PHASE_BOTH) and the hardware `hw`, at `batch` sequences.
 * The parts of *out add up: step_ms = gpu_expert_ms + cpu_expert_ms + transfer_ms (PCIe) +
 * overhead_ms + spread_ms + dense_ms. Errors: MOET_EINVAL (geometries that disagree, naming
 * which; a profile without routings in the phase; batch < 1), MOET_ENOMEM. All inputs are
 * only read.
 */
int moet_cost_predict_step(const moet_config *cf, const moet_placement_sizes *sz,
			   const moet_placement *pl, const moet_profile *prof, int phase,
			   const moet_cost_hw *hw, int64_t batch, moet_cost_pred *out);

/* The same for an owner table [layers x experts] (-1 CPU, g GPU g) of n_gpus GPUs instead of
 * a placement file (bench e2e's gpu and cpu modes). */
int moet_cost_predict_owners(const moet_config *cf, const moet_placement_sizes *sz,
			     const int16_t *owner, int n_gpus, const moet_profile *prof,
			     int phase, const moet_cost_hw *hw, int64_t batch, moet_cost_pred *out);

/*
 * Prefill staging (runtime/hybrid.c, docs/staging.md): a cold (CPU-owned) expert with `rows`
 * tokens in one MoE layer call may instead be copied to a staging slot of GPU 0 and computed
 * there by the same contract kernel. What that costs, and the CPU tier's call it replaces:
 *
 *   t_stage(r) = pcie_latency + expert_bytes / pcie + GPU t(r)       (r >= 1; 0 at r = 0)
 *   t_cpu(r)   = CPU t(r)                                            (moet_cost_call_ms)
 *
 * Simplifications, said so: the copy of one slot overlaps the previous expert's compute in
 * the engine, which the sum ignores (pessimistic for staging by up to min(copy, GPU t)); the
 * copy is priced at stage_copy_gbps (the engine copies from the mapped checkpoint: pageable,
 * the driver stages it; about 5 GB/s measured, a tenth of the pinned link; the engine puts
 * stage_pinned_gbps there for its pinned copies, runtime/hybrid.c); the CPU tier's
 * own overlap with the GPU's other work is not counted (the CPU's call is what staging frees).
 */
double moet_cost_stage_ms(const moet_cost_in *in, double rows);

#define MOET_COST_STAGE_MAX_ROWS 65536 /* the scan's upper end, tokens per expert */

/* The crossover: the smallest r in 1 .. max_rows such that t_stage(r') < t_cpu(r') for every
 * r' in r .. max_rows (whole tokens), or 0 when staging does not win at max_rows (never
 * stage). So "stage when n >= the crossover" is monotonic in n. Work: O(max_rows). */
int64_t moet_cost_stage_min_rows(const moet_cost_in *in, int64_t max_rows);

#endif
