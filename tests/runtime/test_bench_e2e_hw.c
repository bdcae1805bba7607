/*
 * test_bench_e2e_hw.c: `moet-hybrid bench e2e --hardware-out FILE` on the CPU backend (device
 * 0 simulated) with a tiny generated checkpoint: the hardware file of the run's own figures.
 *
 * - The file loads (moet_cost_hw_load) and `plan --predict --hardware FILE` takes it.
 * - cpu_read_gbps is the record's ceiling cpu_source_read_GBps bit for bit, read with the CPU
 *   tier's team (MOET_CPU_THREADS, else every core on the CPU backend: the record's cores),
 *   when the run did not time the tier alone (--no-overlap-check); with the overlap check it
 *   is the tier's own rate: the step of most weight bytes at <= 1.25 rows per call, its
 *   bytes = its calls x one expert's bytes summed here from the checkpoint, / its Tc.
 * - gpu_dense_ms: each point is the record's gpu-mode dense_ms bit for bit, and that is the
 *   step less the GPU expert time recomputed here, independently of the code under test:
 *   at batch 1 in closed form (a touched expert has one row: every MoE layer costs top_k x
 *   t(1), t(1) = max(bytes / read, F / (frac x peak)) with the built-in H200 figures, the
 *   expert bytes summed here from the checkpoint's tensors), at batch 3 on a bandwidth-only
 *   --hardware file from the routing profile of the same run (sum over experts of
 *   (1 - (1 - p)^3) x bytes / read).
 * - What --device cpu does not measure is absent (pcie_gbps and the keys bench e2e never
 *   measures), each with a comment; the loaded file keeps the defaults there.
 * - The curve the reader takes from noisy points: a record with a falling and a negative
 *   dense point gives a file without them and a comment naming each.
 * - A bad --hardware-out gives a one-line error naming --hardware-out before the run.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_bench_e2e.h"
#include "moet_ckpt.h"
#include "moet_cost.h"
#include "moet_err.h"
#include "moet_profile.h"
#include "moet_test.h"

/* The comments' text with the wraps undone ("\n# " read as a space), for phrases. */
static char *flat(const char *t)
{
	char *f = t ? malloc(strlen(t) + 1) : NULL, *o = f;
	for (const char *s = t; f && *s; s++) {
		if (!strncmp(s, "\n# ", 3) && s > t && s[-1] != '\n' && s[3] != '\n') {
			*o++ = ' ';
			s += 2;
		} else {
			*o++ = *s;
		}
	}
	if (o)
		*o = 0;
	return f;
}

static double num(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

/* The gpu-mode step of batch B in the record, or NULL. */
static const json_t *gpu_step(const json_t *rec, int64_t B)
{
	size_t i;
	const json_t *st;
	json_array_foreach(json_object_get(rec, "steps"), i, st)
		if (!strcmp(json_string_value(json_object_get(st, "mode")), "gpu") &&
		    json_integer_value(json_object_get(st, "batch")) == B)
			return st;
	return NULL;
}

/* The curve's value at batch B, or -1 when it has no such point. */
static double point(const moet_cost_curve *c, int64_t B)
{
	for (int i = 0; i < c->n; i++)
		if (c->tokens[i] == (double)B)
			return c->frac[i];
	return -1;
}

/* Bytes of every routed expert [L x E] from the checkpoint's tensor names. */
static uint64_t *expert_bytes(const char *model, int64_t L, int64_t E)
{
	moet_ckpt *ck = NULL;
	uint64_t *b = calloc((size_t)(L * E), sizeof(*b));
	if (!b || moet_ckpt_open(model, &ck)) {
		free(b);
		return NULL;
	}
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		int l, e, k = 0;
		if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%n", &l, &e, &k) == 2 && k &&
		    l < L && e < E)
			b[l * E + e] += t->n_bytes;
	}
	moet_ckpt_close(ck);
	return b;
}

/* A synthetic record's noisy dense points: the file keeps the ones the reader takes. */
static void test_noisy_points(const char *dir)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/noisy.yaml", dir);
	json_t *rec = json_pack("{s:s, s:{s:s, s:b}, s:s, s:{s:{s:f, s:s}}, s:[{s:s, s:I, s:f, "
				"s:f, s:f}, {s:s, s:I, s:f, s:f, s:f}, {s:s, s:I, s:f, s:f, s:f}, "
				"{s:s, s:I, s:f, s:f, s:f}, {s:s, s:I, s:f, s:f, s:f}]}",
				"date", "2026-01-02T03:04:05Z", "git", "commit", "abcdef0123456789",
				"dirty", 0, "command", "moet-hybrid bench e2e (synthetic)",
				"ceilings", "h2d_GBps", "value", 55.5, "unit", "GB/s", "steps",
				"mode", "gpu", "batch", (json_int_t)4, "step_s", 0.003,
				"gpu_expert_ms", 1.0, "dense_ms", 2.0,
				"mode", "gpu", "batch", (json_int_t)1, "step_s", 0.0015,
				"gpu_expert_ms", 0.5, "dense_ms", 1.0,
				"mode", "gpu", "batch", (json_int_t)2, "step_s", 0.001,
				"gpu_expert_ms", 1.5, "dense_ms", -0.5,
				"mode", "gpu", "batch", (json_int_t)8, "step_s", 0.002,
				"gpu_expert_ms", 0.5, "dense_ms", 1.5,
				"mode", "gpu", "batch", (json_int_t)16, "step_s", 0.004,
				"gpu_expert_ms", 1.0, "dense_ms", 3.0);
	CHECK(rec != NULL, "synthetic record");
	int rc = rec ? moet_bench_e2e_hw_save(rec, NULL, path) : -1;
	moet_cost_hw hw, def;
	moet_cost_hw_defaults(&def);
	CHECK(rc == 0 && moet_cost_hw_load(path, &hw) == 0, "noisy: %s", moet_errmsg());
	const moet_cost_curve *c = &hw.gpu_dense_ms;
	CHECK(c->n == 3 && point(c, 1) == 1.0 && point(c, 4) == 2.0 && point(c, 16) == 3.0,
	      "kept 1, 4, 16 of 1, 2, 4, 8, 16: %d points", c->n);
	CHECK(hw.pcie_gbps == 55.5 && hw.cpu_read_gbps == def.cpu_read_gbps, "pcie %g cpu %g",
	      hw.pcie_gbps, hw.cpu_read_gbps);
	char *t = moet_test_read_file(path, NULL);
	char *ft = flat(t);
	CHECK(ft && strstr(ft, "Left out: batch 2, -0.5000 ms: not above 0") &&
	      strstr(ft, "Left out: batch 8, 1.5000 ms: below a smaller batch's") &&
	      strstr(ft, "# cpu_read_gbps: not measured") && !strstr(ft, "\ncpu_read_gbps:") &&
	      strstr(ft, "commit abcdef0123456789 (clean)"), "noisy file:\n%s", ft ? ft : "");
	free(ft);
	free(t);
	json_decref(rec);
}

int main(void)
{
	char *dir = moet_test_mkdtemp("bench-e2e-hw");
	char model[512], place[512], js[600], hwp[600], prof[600], base[600], js2[600], hw2[600];
	snprintf(model, sizeof(model), "%s/model", dir);
	snprintf(place, sizeof(place), "%s/place.yaml", dir);
	snprintf(js, sizeof(js), "%s/e2e.json", dir);
	snprintf(hwp, sizeof(hwp), "%s/hw.yaml", dir);
	snprintf(prof, sizeof(prof), "%s/b3-profile.json", dir);
	snprintf(base, sizeof(base), "%s/bw-only.yaml", dir);
	snprintf(js2, sizeof(js2), "%s/e2e-b3.json", dir);
	snprintf(hw2, sizeof(hw2), "%s/hw-b3.yaml", dir);
	const char *yaml = "version: 1\ngpus:\n  - {name: gpu0, budget: 1GiB, reserve: 0GiB}\n"
			   "default: {gpu0: \"0-3\"}\n";
	CHECK(moet_test_write_file(place, yaml, strlen(yaml)) == 0, "placement file");
	/* a bandwidth-only GPU: no compute term, so the expected expert time is a sum of
	 * touch probabilities */
	const char *bw = "name: bw-only\ngpu_read_gbps: 1000\ngpu_sgemm_frac: {}\n";
	CHECK(moet_test_write_file(base, bw, strlen(bw)) == 0, "base hardware file");
	CHECK(moet_test_cli(NULL, "gen-checkpoint --preset tiny --seed 3 --out %s --quiet",
			    model) == 0, "gen-checkpoint");
	char cfgp[600];
	snprintf(cfgp, sizeof(cfgp), "%s/config.json", model);
	json_t *cfg = json_load_file(cfgp, 0, NULL);
	const int64_t H = json_integer_value(json_object_get(cfg, "hidden_size"));
	const int64_t I = json_integer_value(json_object_get(cfg, "moe_intermediate_size"));
	const int64_t K = json_integer_value(json_object_get(cfg, "num_experts_per_tok"));
	const int64_t L = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
	const int64_t E = json_integer_value(json_object_get(cfg, "n_routed_experts"));
	const int64_t L0 = json_integer_value(json_object_get(cfg, "first_k_dense_replace"));
	json_decref(cfg);
	CHECK(H > 0 && I > 0 && K > 0 && L > L0 && E > 0, "config.json geometry");
	uint64_t *eb = expert_bytes(model, L, E);
	CHECK(eb != NULL, "expert bytes");
	uint64_t bytes = eb ? eb[L0 * E] : 0;
	for (int64_t l = L0; eb && l < L; l++)
		for (int64_t e = 0; e < E; e++)
			CHECK(eb[l * E + e] == bytes && bytes > 0, "expert %lld/%lld: %llu bytes",
			      (long long)l, (long long)e, (unsigned long long)eb[l * E + e]);

	/* 1. gpu and hybrid modes, batches 1 and 3, the built-in figures price the experts */
	char *out = NULL;
	int rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --placement %s --modes "
			       "gpu,hybrid --batches 1,3 --prefill 4 --ctx 4 --steps 2 "
			       "--no-overlap-check --json %s --hardware-out %s", model, place, js,
			       hwp);
	CHECK(rc == 0 && out && strstr(out, "hardware file: "), "bench e2e: exit %d\n%s", rc,
	      out ? out : "");
	free(out);
	json_t *rec = json_load_file(js, 0, NULL);
	moet_cost_hw hw, def;
	moet_cost_hw_defaults(&def);
	rc = moet_cost_hw_load(hwp, &hw);
	CHECK(rec && rc == 0 && hw.from_file, "the file loads: %d %s", rc, moet_errmsg());
	const json_t *cs = json_object_get(json_object_get(rec, "ceilings"),
					   "cpu_source_read_GBps");
	const char *env = getenv("MOET_CPU_THREADS");
	const int64_t want_thr = env && atoi(env) >= 1 ? atoi(env) :
				 json_integer_value(json_object_get(json_object_get(rec, "machine"),
								    "cores"));
	CHECK(cs && num(cs, "value") > 0 && hw.cpu_read_gbps == num(cs, "value") &&
	      json_integer_value(json_object_get(cs, "threads")) == want_thr,
	      "cpu_read_gbps %g, the record's %g at %lld threads (want %lld)", hw.cpu_read_gbps,
	      num(cs, "value"), (long long)json_integer_value(json_object_get(cs, "threads")),
	      (long long)want_thr);
	/* batch 1 in closed form: each MoE layer's touched experts add up to top_k */
	const double t1 = fmax((double)bytes / (def.gpu_read_gbps * 1e6),
			       6.0 * (double)H * (double)I /
			       (def.gpu_sgemm_frac.frac[0] * def.gpu_sgemm_gflops * 1e6));
	const double x1 = (double)(L - L0) * (double)K * t1;
	for (int64_t B = 1; rec && B <= 3; B += 2) {
		const json_t *st = gpu_step(rec, B);
		const double step_ms = 1e3 * num(st, "step_s"), dense = num(st, "dense_ms");
		CHECK(st && fabs(dense - (step_ms - num(st, "gpu_expert_ms"))) <= 1e-12 * step_ms,
		      "batch %lld: dense = step - experts in the record", (long long)B);
		if (B == 1)
			CHECK(fabs(num(st, "gpu_expert_ms") - x1) <= 1e-9 * x1 &&
			      fabs(dense - (step_ms - x1)) <= 1e-9 * step_ms,
			      "batch 1: GPU expert time %.9g ms, closed form %.9g ms "
			      "(%lld layers x %lld x %.9g)", num(st, "gpu_expert_ms"), x1,
			      (long long)(L - L0), (long long)K, t1);
		/* written bit for bit, or said to be left out (a noisy fall) */
		char left[64];
		snprintf(left, sizeof(left), "Left out: batch %lld,", (long long)B);
		char *t = moet_test_read_file(hwp, NULL);
		CHECK(point(&hw.gpu_dense_ms, B) == dense || (t && strstr(t, left)),
		      "batch %lld: file %g, record %g", (long long)B, point(&hw.gpu_dense_ms, B),
		      dense);
		free(t);
	}
	CHECK(hw.gpu_dense_ms.n >= 1, "gpu_dense_ms has points");
	/* the rest: not measured on --device cpu, or never by bench e2e */
	char *t = moet_test_read_file(hwp, NULL);
	static const char *absent[] = { "pcie_gbps", "gpu_read_gbps", "pcie_latency_us",
					 "stage_copy_gbps", "stage_pinned_gbps", "cpu_overhead_us",
					 "gpu_overhead_us",
					 "act_bytes", "cpu_fma_gflops", "cpu_fma_frac",
					 "gpu_sgemm_gflops", "gpu_sgemm_frac" };
	for (size_t i = 0; t && i < sizeof(absent) / sizeof(absent[0]); i++) {
		char key[64], note[64];
		snprintf(key, sizeof(key), "\n%s:", absent[i]);
		snprintf(note, sizeof(note), "\n# %s", absent[i]);
		CHECK(!strstr(t, key) && strstr(t, note), "%s: left out, with a comment",
		      absent[i]);
	}
	char *ft = flat(t);
	CHECK(ft && strstr(ft, "pcie_gbps: not measured") && strstr(ft, "--hardware-out") &&
	      strstr(ft, " command: ") && strstr(ft, " date: ") && strstr(ft, "record: ") &&
	      strstr(ft, "priced with the built-in figures"), "header and notes:\n%s",
	      ft ? ft : "");
	free(ft);
	CHECK(hw.pcie_gbps == def.pcie_gbps && hw.gpu_read_gbps == def.gpu_read_gbps &&
	      hw.cpu_overhead_us == def.cpu_overhead_us, "defaults where left out");
	free(t);
	json_decref(rec);

	/* 1b. hybrid with the overlap check: the CPU tier's own rate becomes cpu_read_gbps */
	char js1b[600], hw1b[600];
	snprintf(js1b, sizeof(js1b), "%s/e2e-tier.json", dir);
	snprintf(hw1b, sizeof(hw1b), "%s/hw-tier.yaml", dir);
	rc = moet_test_cli(NULL, "bench e2e --model %s --device cpu --placement %s --modes hybrid "
			   "--batches 1,3 --prefill 4 --ctx 4 --steps 2 --json %s --hardware-out %s",
			   model, place, js1b, hw1b);
	json_t *rec1b = json_load_file(js1b, 0, NULL);
	moet_cost_hw hw1;
	CHECK(rc == 0 && rec1b && moet_cost_hw_load(hw1b, &hw1) == 0, "hybrid run: %d %s", rc,
	      moet_errmsg());
	const json_t *pick = NULL;
	double pick_bytes = 0;
	size_t si;
	const json_t *sst;
	json_array_foreach(json_object_get(rec1b, "steps"), si, sst) {
		/* every call reads one expert's bytes, summed here from the checkpoint */
		const double calls = num(sst, "cpu_calls"), tcalls = num(sst, "tc_cpu_calls");
		const double tpairs = num(sst, "tc_cpu_pairs"), tb = num(sst, "tc_cpu_weight_bytes");
		const int64_t B = json_integer_value(json_object_get(sst, "batch"));
		CHECK(fabs(num(sst, "cpu_weight_bytes") - calls * (double)bytes) <=
			      1e-12 * calls * (double)bytes &&
		      fabs(tb - tcalls * (double)bytes) <= 1e-12 * tcalls * (double)bytes,
		      "batch %lld: weight bytes %g / %g for %g / %g calls of %llu bytes",
		      (long long)B, num(sst, "cpu_weight_bytes"), tb, calls, tcalls,
		      (unsigned long long)bytes);
		/* a call takes one expert's rows: at least one each, one each at batch 1 */
		CHECK(tcalls <= tpairs && (B != 1 || tcalls == tpairs) &&
		      tpairs <= (double)(B * K * (L - L0)), "batch %lld: %g calls, %g pairs",
		      (long long)B, tcalls, tpairs);
		if (tcalls > 0)
			CHECK(fabs(num(sst, "tc_read_GBps") - tb / num(sst, "tc_s") / 1e9) <=
				      1e-12 * num(sst, "tc_read_GBps"),
			      "batch %lld: rate = bytes / tc", (long long)B);
		/* each MoE layer call has a routing pair on the CPU tier or not */
		const double lc = num(sst, "tc_cpu_layer_calls");
		CHECK(lc <= (double)(L - L0) && lc <= tpairs && (tcalls == 0) == (lc == 0),
		      "batch %lld: %g layer calls", (long long)B, lc);
		if (tcalls > 0 && tpairs / tcalls <= 1.25 && tb > pick_bytes) {
			pick = sst;
			pick_bytes = tb;
		}
	}
	CHECK(pick != NULL, "a step with the tier alone at <= 1.25 rows per call");
	/* the read term: what the model does not price apart (per MoE layer call) */
	const double want_r = pick ? pick_bytes / (num(pick, "tc_s") - num(pick, "tc_cpu_layer_calls") *
						   def.cpu_overhead_us * 1e-6) / 1e9 : -1;
	char *raw1b = moet_test_read_file(hw1b, NULL), *t1b = flat(raw1b);
	free(raw1b);
	CHECK(pick && fabs(hw1.cpu_read_gbps - want_r) <= 1e-12 * want_r && t1b &&
	      strstr(t1b, "CPU tier: its own decode rate"),
	      "cpu_read_gbps %g, the step's %g:\n%s", hw1.cpu_read_gbps, want_r, t1b ? t1b : "");
	free(t1b);
	json_decref(rec1b);

	/* 2. batch 3 alone on a bandwidth-only GPU, with the routing of the same steps */
	rc = moet_test_cli(NULL, "bench e2e --model %s --device cpu --modes gpu --batches 3 "
			   "--prefill 4 --ctx 4 --steps 2 --hardware %s --profile-out %s --json %s "
			   "--hardware-out %s", model, base, prof, js2, hw2);
	moet_profile *pf = NULL;
	json_t *rec2 = json_load_file(js2, 0, NULL);
	CHECK(rc == 0 && rec2 && moet_profile_load(prof, &pf) == 0, "batch 3 run: %d %s", rc,
	      moet_errmsg());
	double x3 = 0;
	for (int64_t l = 0; pf && eb && l < pf->n_layers; l++) {
		const uint64_t *c = pf->counts + moet_profile_at(pf, MOET_PROFILE_DECODE, l);
		double tot = 0;
		for (int64_t e = 0; e < E; e++)
			tot += (double)c[e];
		for (int64_t e = 0; tot > 0 && e < E; e++) {
			const double p = (double)c[e] * (double)K / tot;
			x3 += (1 - pow(1 - p, 3)) * (double)eb[l * E + e] / (1000.0 * 1e6);
		}
	}
	const json_t *st3 = rec2 ? gpu_step(rec2, 3) : NULL;
	moet_cost_hw hw3;
	CHECK(st3 && x3 > 0 && fabs(num(st3, "gpu_expert_ms") - x3) <= 1e-9 * x3,
	      "batch 3: GPU expert time %.9g ms, from the profile %.9g ms",
	      st3 ? num(st3, "gpu_expert_ms") : -1, x3);
	CHECK(moet_cost_hw_load(hw2, &hw3) == 0, "batch 3 file loads: %s", moet_errmsg());
	const double d3 = st3 ? num(st3, "dense_ms") : -1;
	CHECK(st3 && hw3.gpu_dense_ms.n == 1 && hw3.gpu_dense_ms.frac[0] == d3 &&
	      fabs(d3 - (1e3 * num(st3, "step_s") - x3)) <= 1e-9 * 1e3 * num(st3, "step_s"),
	      "batch 3 point %g: step %g ms - %g ms", d3, st3 ? 1e3 * num(st3, "step_s") : -1,
	      x3);
	t = moet_test_read_file(hw2, NULL);
	CHECK(t && strstr(t, base) && hw3.gpu_read_gbps == def.gpu_read_gbps,
	      "names the hardware that priced the experts, copies none of it:\n%s", t ? t : "");
	free(t);
	json_decref(rec2);
	/* plan --predict takes both files */
	for (int k = 0; k < 2; k++) {
		out = NULL;
		rc = moet_test_cli(&out, "plan --predict --model %s --placement %s --profile %s "
				   "--batch 1,3 --hardware %s", model, place, prof, k ? hw2 : hwp);
		CHECK(rc == 0, "plan --predict --hardware %s: exit %d\n%s", k ? hw2 : hwp, rc,
		      out ? out : "");
		free(out);
	}
	moet_profile_free(pf);
	free(eb);

	test_noisy_points(dir);

	/* refusals, before the run */
	char args[1024];
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --modes gpu "
		 "--hardware-out /nonexistent-dir/hw.yaml", model);
	moet_test_cli_expect(args, 1, "--hardware-out /nonexistent-dir/hw.yaml: cannot create");
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --modes gpu "
		 "--hardware-out %s", model, dir);
	moet_test_cli_expect(args, 1, "--hardware-out");
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --modes gpu "
		 "--hardware %s/none.yaml --hardware-out %s/x.yaml", model, dir, dir);
	moet_test_cli_expect(args, 1, "--hardware");
	free(dir);
	return moet_test_done("test_bench_e2e_hw");
}
