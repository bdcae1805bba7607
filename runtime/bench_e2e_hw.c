/*
 * bench_e2e_hw.c: `bench e2e --hardware-out FILE`: the hardware file of the cost model
 * (placement/moet_cost.h) that one finished run measured, read from the run's own record, so
 * that every figure in the file is one of the record's and says which:
 *
 *   cpu_read_gbps   the CPU tier's own decode rate where the run measured it: of the hybrid
 *                   or cpu-mode steps whose tier ran alone (the overlap check's serial run,
 *                   its time Tc), the one with the most bytes among those of at most
 *                   TIER_MAX_ROWS rows per call (read bound: what the model's read term
 *                   stands for): the weights its expert calls read / (Tc - its MoE layer
 *                   calls x the model's cpu_overhead_us, priced apart by the model); else
 *                   ceilings.cpu_source_read_GBps, the CPU tier's team (its thread count)
 *                   reading the routed experts of a fresh mapping.
 *                   NOTE (why the kernel's rate first): on the GPU machine's host the
 *                   decode kernel streams experts faster than that plain read (issue 3's
 *                   records: 1.04-1.16 of it; the H200 run of 78c2919: about 117 GB/s,
 *                   inferred from its Tc, against a ceiling of 77-105 GB/s), and the
 *                   plain read moves from run to run.
 *   pcie_gbps       ceilings.h2d_GBps: pinned host-to-device copies (a GPU run only)
 *   gpu_dense_ms    per gpu-mode batch, steps[].dense_ms: the median step less the cost
 *                   model's GPU expert time for that batch's own routing (steps[].
 *                   gpu_expert_ms), as configs/hardware-h200-host.yaml was made by hand
 *
 * Everything else (the GPU kernel's read rate, the compute curves and peaks, the latencies
 * and per-layer overheads, the staging copy) is not measured by bench e2e: those keys are
 * left out with a comment saying why, and the reader's built-in default applies to them.
 * NOTE: not even a figure copied from the --hardware file that priced the experts: the file
 * says which hardware that was, and that the dense figures hold beside its GPU figures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_bench_e2e.h"
#include "moet_cost.h"
#include "moet_err.h"

#define HW_NOTE_BYTES 4096

typedef struct dense_pt {
	int64_t batch;
	double dense_ms, step_ms, expert_ms;
} dense_pt;

static const char *str_of(const json_t *o, const char *k, const char *dflt)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : dflt;
}

/* The measured ceiling `name`'s value, or 0 when the record has none. */
static double ceiling_of(const json_t *rec, const char *name, int *out_threads)
{
	const json_t *c = json_object_get(json_object_get(rec, "ceilings"), name);
	if (out_threads)
		*out_threads = (int)json_integer_value(json_object_get(c, "threads"));
	return json_number_value(json_object_get(c, "value"));
}

/* The gpu-mode steps with a dense figure, sorted by batch (stable), at most n_max. */
static int dense_points(const json_t *rec, dense_pt *pts, int n_max)
{
	size_t i;
	const json_t *st;
	int n = 0;
	json_array_foreach(json_object_get(rec, "steps"), i, st) {
		const json_t *d = json_object_get(st, "dense_ms");
		if (strcmp(str_of(st, "mode", ""), "gpu") || !json_is_number(d) || n == n_max)
			continue;
		dense_pt p = { json_integer_value(json_object_get(st, "batch")),
			       json_number_value(d),
			       1e3 * json_number_value(json_object_get(st, "step_s")),
			       json_number_value(json_object_get(st, "gpu_expert_ms")) };
		int k = n++;
		for (; k > 0 && pts[k - 1].batch > p.batch; k--)
			pts[k] = pts[k - 1];
		pts[k] = p;
	}
	return n;
}

/* Rows per expert call up to which the CPU tier's measured rate stands for its read term. */
#define TIER_MAX_ROWS 1.25

/* The CPU tier's measured decode rate (GB/s) and the step it comes from, or 0: its weight
 * bytes over its time alone less ovh_us per MoE layer call. */
static double tier_rate(const json_t *rec, double ovh_us, const json_t **out_step)
{
	size_t i;
	const json_t *st;
	double best = 0, best_bytes = 0;
	*out_step = NULL;
	json_array_foreach(json_object_get(rec, "steps"), i, st) {
		const double by = json_number_value(json_object_get(st, "tc_cpu_weight_bytes"));
		const double calls = json_number_value(json_object_get(st, "tc_cpu_calls"));
		const double pairs = json_number_value(json_object_get(st, "tc_cpu_pairs"));
		const double lc = json_number_value(json_object_get(st, "tc_cpu_layer_calls"));
		const double t = json_number_value(json_object_get(st, "tc_s")) - lc * ovh_us * 1e-6;
		const double r = t > 0 ? by / t / 1e9 : 0;
		if (!(r > 0 && r < 1e6) || !(calls > 0) || pairs / calls > TIER_MAX_ROWS ||
		    by <= best_bytes)
			continue;
		best = r;
		best_bytes = by;
		*out_step = st;
	}
	return best;
}

/* gpu_dense_ms from the points: a curve the reader accepts (batches increasing, > 0, never
 * falling, at most MOET_COST_MAX_POINTS); what it leaves out is said in *note. */
static void dense_curve(const dense_pt *pts, int n, moet_cost_curve *c, char *note, size_t cap)
{
	size_t len = strlen(note);
	c->n = 0;
	for (int i = 0; i < n; i++) {
		const dense_pt *p = &pts[i];
		const char *why = NULL;
		if (c->n && p->batch == (int64_t)c->tokens[c->n - 1])
			why = "a second measurement of that batch (the first is kept)";
		else if (p->batch < 1 || p->batch > 1000000)
			why = "a batch the reader does not take";
		else if (!(p->dense_ms > 0 && p->dense_ms <= 1e6))
			why = "not above 0: the expert time priced on that hardware is the whole "
			      "step or more";
		else if (c->n && p->dense_ms < c->frac[c->n - 1])
			why = "below a smaller batch's (the reader wants a curve that never falls)";
		else if (c->n == MOET_COST_MAX_POINTS)
			why = "more points than the reader takes";
		if (why) {
			if (len < cap)
				len += (size_t)snprintf(note + len, cap - len,
							"\nLeft out: batch %lld, %.4f ms: %s.",
							(long long)p->batch, p->dense_ms, why);
			continue;
		}
		c->tokens[c->n] = (double)p->batch;
		c->frac[c->n] = p->dense_ms;
		c->n++;
	}
}

/* Keys bench e2e never measures, and why. */
static const struct {
	const char *key;
	const char *why;
} not_measured[] = {
	{ "gpu_read_gbps", "the GPU expert kernel's read rate at 1 token (bench gpu-experts "
	  "measures it)" },
	{ "pcie_latency_us", "the latency of one small copy is not timed alone" },
	{ "stage_copy_gbps", "no staging copy is timed alone (prefills[].stage_s is the driving "
	  "thread's whole staging time: copies, waits and launches)" },
	{ "stage_pinned_gbps", "no pinned staging copy is timed alone (prefills[].stage_copy_s "
	  "is the driving thread's time in the uploader's runs, the CPU tier at work beside)" },
	{ "cpu_overhead_us", "the CPU tier's busy time (steps[].cpu_busy_s) includes its expert "
	  "reads: the team's submit and wait are not timed alone" },
	{ "gpu_overhead_us", "the launches of one layer's expert kernel are not timed alone" },
	{ "act_bytes", "a property of the engine (binary32 activations), not a measurement" },
	{ "cpu_fma_gflops", "the CPU's FMA peak (bench cpu-experts measures it)" },
	{ "cpu_fma_frac", "the CPU expert kernel's share of that peak by tokens per expert "
	  "(bench cpu-experts)" },
	{ "gpu_sgemm_gflops", "the GPU's SGEMM peak (bench gpu-experts measures it)" },
	{ "gpu_sgemm_frac", "the GPU expert kernel's share of that peak by tokens per expert "
	  "(bench gpu-experts)" },
};
#define N_NOT_MEASURED ((int)(sizeof(not_measured) / sizeof(not_measured[0])))

/* The comments of the file, one per figure. */
typedef struct hw_notes {
	char head[HW_NOTE_BYTES], run[160], cpu[HW_NOTE_BYTES], pcie[HW_NOTE_BYTES];
	char dense[HW_NOTE_BYTES], left[HW_NOTE_BYTES];
} hw_notes;

int moet_bench_e2e_hw_save(const json_t *rec, const char *rec_path, const char *path)
{
	moet_cost_hw hw;
	moet_cost_hw_entry e[8 + N_NOT_MEASURED];
	dense_pt pts[64];
	hw_notes *nt = malloc(sizeof(*nt));
	int n = 0;
	if (!nt)
		return moet_err(MOET_ENOMEM, "%s: hardware file", path);
	char *head = nt->head, *run = nt->run, *n_cpu = nt->cpu, *n_pcie = nt->pcie;
	char *n_dense = nt->dense, *n_left = nt->left;
	const char *date = str_of(rec, "date", "unknown date");
	const json_t *git = json_object_get(rec, "git");
	const char *commit = str_of(git, "commit", "unknown");
	const json_t *dirty = json_object_get(git, "dirty");
	const json_t *mach = json_object_get(rec, "machine");
	moet_cost_hw_defaults(&hw);
	/* the run, once in the header; each figure names it again in short */
	snprintf(run, sizeof(nt->run), "bench e2e of %.64s, commit %.12s%s", date, commit,
		 json_is_true(dirty) ? " (dirty tree)" : "");
	snprintf(head, HW_NOTE_BYTES,
		 "Hardware description for the planner's cost model (plan --auto / --predict "
		 "--hardware FILE; placement/moet_cost.h, docs/profile-and-plan.md), written by "
		 "moet-hybrid bench e2e --hardware-out from its own run:\n"
		 "command: %s\ndate: %s, commit %s%s\nmachine: %s, %lld cores\nrecord: %s\n"
		 "Only what this run measured is here, each figure under a comment naming the row "
		 "of the record it comes from; every key left out keeps the loader's built-in "
		 "default (the H200 machine of configs/hardware-h200-host.yaml).",
		 str_of(rec, "command", "unknown"), date, commit,
		 json_is_true(dirty) ? " (dirty tree)" : json_is_false(dirty) ? " (clean)" : "",
		 str_of(mach, "cpu_model", "unknown CPU"),
		 (long long)json_integer_value(json_object_get(mach, "cores")),
		 rec_path ? rec_path : "not written (no --json)");
	snprintf(hw.name, sizeof(hw.name), "bench-e2e %.10s %.8s", date, commit);
	e[n++] = (moet_cost_hw_entry){ "name", NULL };

	int threads = 0;
	const double cpu = ceiling_of(rec, "cpu_source_read_GBps", &threads);
	const json_t *ts;
	const double ovh = hw.cpu_overhead_us; /* not measured: the default, priced apart */
	const double tier = tier_rate(rec, ovh, &ts);
	if (tier > 0) {
		hw.cpu_read_gbps = tier;
		const double calls = json_number_value(json_object_get(ts, "tc_cpu_calls"));
		snprintf(n_cpu, HW_NOTE_BYTES, "CPU tier: its own decode rate, record steps[] "
			 "mode %s batch %lld (%.3f GB/s): the weights its expert calls read per step "
			 "(tc_cpu_weight_bytes %.0f, %.2f calls of %.2f rows) / (its time running "
			 "alone, tc_s %.6f s, less %.2f MoE layer calls x cpu_overhead_us %g, which "
			 "the model prices apart), %s. The plain read ceiling of the same run, "
			 "cpu_source_read_GBps: %.3f GB/s%s.", str_of(ts, "mode", "?"),
			 (long long)json_integer_value(json_object_get(ts, "batch")), tier,
			 json_number_value(json_object_get(ts, "tc_cpu_weight_bytes")), calls,
			 json_number_value(json_object_get(ts, "tc_cpu_pairs")) / calls,
			 json_number_value(json_object_get(ts, "tc_s")),
			 json_number_value(json_object_get(ts, "tc_cpu_layer_calls")), ovh, run, cpu,
			 cpu > 0 ? "" : " (not measured)");
		e[n++] = (moet_cost_hw_entry){ "cpu_read_gbps", n_cpu };
	} else if (cpu > 0) {
		hw.cpu_read_gbps = cpu;
		snprintf(n_cpu, HW_NOTE_BYTES, "CPU tier: the record's ceiling "
			 "cpu_source_read_GBps (%.3f GB/s): %d threads, the CPU tier's team, "
			 "reading the routed experts of a fresh mapping of %s (page faults "
			 "included), %s.", cpu, threads, str_of(rec, "model_dir", "the checkpoint"),
			 run);
		e[n++] = (moet_cost_hw_entry){ "cpu_read_gbps", n_cpu };
	} else {
		snprintf(n_cpu, HW_NOTE_BYTES, "cpu_read_gbps: not measured by this run (no "
			 "ceiling cpu_source_read_GBps in the record): the default applies.");
		e[n++] = (moet_cost_hw_entry){ NULL, n_cpu };
	}
	const double h2d = ceiling_of(rec, "h2d_GBps", NULL);
	if (h2d > 0) {
		hw.pcie_gbps = h2d;
		snprintf(n_pcie, HW_NOTE_BYTES, "Pinned host-to-device copies of 256 MiB, "
			 "median of 5: the record's ceiling h2d_GBps (%.3f GB/s), %s. The "
			 "device-to-host direction is taken to be the same.", h2d, run);
		e[n++] = (moet_cost_hw_entry){ "pcie_gbps", n_pcie };
	} else {
		snprintf(n_pcie, HW_NOTE_BYTES, "pcie_gbps: not measured by this run (no "
			 "ceiling h2d_GBps in the record: --device %s copies nothing over PCIe): "
			 "the default applies.", str_of(rec, "device", "?"));
		e[n++] = (moet_cost_hw_entry){ NULL, n_pcie };
	}

	const int np = dense_points(rec, pts, 64);
	const json_t *dh = json_object_get(rec, "dense_hardware");
	const char *dh_file = str_of(dh, "file", NULL);
	size_t len = 0;
	if (np) {
		len = (size_t)snprintf(n_dense, HW_NOTE_BYTES, "The dense part of a decode step on "
				       "the GPU by batch (attention, dense MLPs, shared experts, "
				       "norms, router, lm_head, sampling, launches, copies): the "
				       "gpu mode's median step (steps[].step_s, rows decode-gpu) "
				       "less the cost model's GPU expert time for that batch's own "
				       "routing, its timed steps (steps[].gpu_expert_ms; every "
				       "routed expert on GPU 0), %s. The expert time was priced "
				       "with %s%s: use this file beside the same GPU figures "
				       "(gpu_read_gbps, gpu_sgemm_gflops, gpu_sgemm_frac), which "
				       "this run did not measure. The model adds gpu_overhead_us "
				       "per MoE layer on top.", run,
				       dh_file ? "the hardware file " : "the built-in figures",
				       dh_file ? dh_file : "");
		for (int i = 0; i < np && len < HW_NOTE_BYTES; i++)
			len += (size_t)snprintf(n_dense + len, HW_NOTE_BYTES - len,
						"%sbatch %lld: %.4f - %.4f = %.4f ms",
						i ? "; " : "\n", (long long)pts[i].batch,
						pts[i].step_ms, pts[i].expert_ms,
						pts[i].dense_ms);
		dense_curve(pts, np, &hw.gpu_dense_ms, n_dense, HW_NOTE_BYTES);
	}
	if (np && hw.gpu_dense_ms.n) {
		e[n++] = (moet_cost_hw_entry){ "gpu_dense_ms", n_dense };
	} else if (np) {
		if (len < HW_NOTE_BYTES)
			snprintf(n_dense + len, HW_NOTE_BYTES - len, "\ngpu_dense_ms: no point "
				 "the reader takes: left out, the default (dense bytes / "
				 "gpu_read_gbps) applies.");
		e[n++] = (moet_cost_hw_entry){ NULL, n_dense };
	} else {
		snprintf(n_dense, HW_NOTE_BYTES, "gpu_dense_ms: not measured by this run (no gpu "
			 "mode steps with dense_ms: run --modes gpu): the default (dense bytes / "
			 "gpu_read_gbps) applies.");
		e[n++] = (moet_cost_hw_entry){ NULL, n_dense };
	}
	len = (size_t)snprintf(n_left, HW_NOTE_BYTES, "Not measured by bench e2e, left out (the "
			       "defaults apply):");
	for (int i = 0; i < N_NOT_MEASURED && len < HW_NOTE_BYTES; i++)
		len += (size_t)snprintf(n_left + len, HW_NOTE_BYTES - len, "\n%s: %s.",
					not_measured[i].key, not_measured[i].why);
	e[n++] = (moet_cost_hw_entry){ NULL, n_left };
	int rc = moet_cost_hw_save(path, &hw, head, e, n);
	free(nt);
	return rc;
}
