/*
 * moet_cost.h: the decode step cost model of `plan --auto` (docs/profile-and-plan.md).
 *
 * What a decode step of B sequences costs in the MoE layers, predicted from a routing profile
 * and a hardware description. Decode at small B is bound by reading expert bytes, so each
 * tier's time is the bytes of the distinct experts it touches over its read bandwidth:
 *
 *   p_e      = c_e x k / sum_e' c_e'      probability that one token routes to expert e
 *                                         (c: the profile's counts of the layer; a token picks
 *                                         k distinct experts, so sum_e p_e = k)
 *   P_e      = 1 - (1 - p_e)^B            probability that a step of B tokens touches e
 *                                         (tokens routed independently)
 *   D_tier   = sum over the tier's experts of P_e        expected distinct experts touched
 *   A_tier   = 1 - prod over them of (1 - P_e)           probability the tier works at all
 *
 *   t_cpu    = A_cpu x cpu_overhead + D_cpu x bytes / cpu_read
 *   t_gpu    = max over GPUs g of (A_g x gpu_overhead + D_g x bytes / gpu_read)
 *   transfer = A_cpu x (2 x pcie_latency + 2 x B x d_model x act_bytes / pcie)
 *                                         (hidden states to the host and results back)
 *   t_layer  = max(t_cpu, t_gpu) + transfer
 *   step     = sum over MoE layers of t_layer + dense
 *   dense    = (dense bytes - embedding bytes) / gpu_read    (the same for every placement)
 *
 * The max: the engine runs the CPU tier and the GPU tiers of a layer at the same time and the
 * layer ends with the slower one; the copies are not overlapped. Simplifications, said so:
 * expectations are taken per tier before the max (E[max] >= max E, so the model is
 * optimistic when the tiers are close; they seldom are: the CPU reads ~30x slower); the
 * experts of a step are touched independently; compute is ignored (true at small B; at
 * B >= ~16 the GPU kernel is compute bound, see docs/benchmarks/). Time in milliseconds,
 * bandwidths in GB/s (10^9 bytes).
 */
#ifndef MOET_COST_H
#define MOET_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOET_COST_NAME_BYTES 64

/* The hardware the model is priced on (configs/hardware-*.yaml, or the defaults). */
typedef struct moet_cost_hw {
	char name[MOET_COST_NAME_BYTES];
	double cpu_read_gbps;        /* all cores streaming expert weights, GB/s */
	double gpu_read_gbps;        /* one GPU's expert kernel at decode, GB/s */
	double pcie_gbps;            /* pinned host <-> device, one direction, GB/s */
	double pcie_latency_us;      /* per copy */
	double cpu_overhead_us;      /* per MoE layer and step when the CPU tier works */
	double gpu_overhead_us;      /* per MoE layer and step per GPU that works */
	double act_bytes;            /* bytes per activation element copied (4: binary32) */
	bool from_file;              /* false: the built-in defaults */
} moet_cost_hw;

/* The built-in defaults: the H200 machine of docs/benchmarks (as in
 * configs/hardware-h200-host.yaml). */
void moet_cost_hw_defaults(moet_cost_hw *out);

/*
 * Reads a hardware file: a YAML mapping of the keys above (name, cpu_read_gbps, ...; any key
 * left out keeps its default). Errors, one line "PATH:LINE: fault": MOET_EIO (cannot read),
 * MOET_EFORMAT (malformed YAML, not a mapping, an unknown or repeated key, a value that is
 * not a number), MOET_ERANGE (a bandwidth <= 0, an overhead or latency < 0, act_bytes not
 * in 1..8).
 */
int moet_cost_hw_load(const char *path, moet_cost_hw *out);

/* Like moet_cost_hw_load from text in memory; `label` stands for the path in errors. */
int moet_cost_hw_parse(const char *label, const char *text, size_t n_bytes, moet_cost_hw *out);

/* What the prediction needs besides the profile. */
typedef struct moet_cost_in {
	moet_cost_hw hw;
	int64_t batch;               /* B: sequences per decode step, >= 1 */
	int64_t top_k;               /* num_experts_per_tok */
	int64_t d_model;             /* hidden_size */
	uint64_t expert_bytes;       /* bytes of one routed expert */
	uint64_t dense_bytes;        /* dense part without the embedding (read every step) */
	int n_gpus;
} moet_cost_in;

/* P[i] = 1 - (1 - p_i)^B for one layer's scores s[0..n-1] (p_i = s_i x k / sum s, at most
 * 1). All 0 when the scores sum to 0. */
void moet_cost_touch(const double *s, int64_t n, int64_t top_k, int64_t batch, double *P);

/* The layer time (ms) for tiers described by their D and A: the CPU's, and each GPU's
 * (d_gpu[g], a_gpu[g], g < n_gpus). */
double moet_cost_layer_ms(const moet_cost_in *in, double d_cpu, double a_cpu,
			  const double *d_gpu, const double *a_gpu);

/* A prediction for a whole placement. */
typedef struct moet_cost_pred {
	double step_ms;              /* experts_ms + dense_ms */
	double experts_ms;           /* sum over MoE layers of t_layer */
	double dense_ms;
	double cpu_ms, gpu_ms;       /* sums over layers of t_cpu and t_gpu */
	double transfer_ms;          /* sum over layers of the copies */
	double cpu_distinct;         /* expected distinct experts per step on the CPU, all layers */
	double gpu_distinct;         /* the same on the GPUs */
} moet_cost_pred;

/*
 * Predicts the decode step of the placement owner[L x E] (GPU index or -1 for the CPU) from
 * the scores [L x E] (layers without routings cost nothing). MOET_EINVAL for a batch < 1 or
 * an owner out of 0 .. n_gpus-1 / -1; MOET_ENOMEM.
 */
int moet_cost_predict(const moet_cost_in *in, const double *scores, int64_t n_layers,
		      int64_t n_experts, const int16_t *owner, moet_cost_pred *out);

#endif
