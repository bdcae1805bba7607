/*
 * test_bench_e2e_ram.c: `moet-hybrid bench e2e --ram-budgets ... --ram-only --prefill none`,
 * the quick run of the NVMe tier alone that tests/gpu/ram_budget.sh makes (issue 9), on the CPU
 * backend (device 0 simulated) with a tiny checkpoint and a placement of experts 0-3 of every
 * MoE layer on the device. Checked against what the placement and the checkpoint say, not
 * against the bench's own figures:
 *   - the record has exactly one decode-hybrid-ram<budget> row per (budget, batch): no
 *     all-in-RAM decode rows, no prefill rows, an empty "steps" split;
 *   - its "ram" array: one entry per row; the tier holds the (E - 4) x MoE-layers experts off
 *     the device; slots = floor(share x those) (at least 1); resident bytes = slots x slot
 *     bytes, a slot at least one expert's six tensors (summed from the checkpoint);
 *     step_s = the row's median, tokens/s = batch / step;
 *   - counters over the timed steps only: hits + late + misses = lookups, lookups at most
 *     steps x MoE layers x batch x top-k; at 100% every lookup a hit and no byte read (the
 *     warm fill's reads are before the reset);
 *   - --prefill none alone drops only the prefill rows; the refusals are one-line errors.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_test.h"

static double num(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static int64_t inum(const json_t *o, const char *k)
{
	return (int64_t)json_integer_value(json_object_get(o, k));
}

/* Bytes of the largest expert (its six tensors) in the checkpoint. */
static size_t max_expert_bytes(const char *dir, int64_t L, int64_t E)
{
	moet_ckpt *ck = NULL;
	if (moet_ckpt_open(dir, &ck))
		return 0;
	size_t best = 0;
	for (int64_t l = 0; l < L; l++)
		for (int64_t e = 0; e < E; e++) {
			char pre[96];
			size_t sum = 0, n = (size_t)snprintf(pre, sizeof(pre),
							     "model.layers.%lld.mlp.experts.%lld.",
							     (long long)l, (long long)e);
			for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
				const moet_tensor *t = moet_ckpt_at(ck, i);
				if (!strncmp(t->name, pre, n))
					sum += t->n_bytes;
			}
			best = sum > best ? sum : best;
		}
	moet_ckpt_close(ck);
	return best;
}

int main(void)
{
	char *dir = moet_test_mkdtemp("bench-e2e-ram");
	char model[512], place[512], js[512], cfgp[600];
	snprintf(model, sizeof(model), "%s/model", dir);
	snprintf(place, sizeof(place), "%s/place.yaml", dir);
	snprintf(js, sizeof(js), "%s/e2e.json", dir);
	snprintf(cfgp, sizeof(cfgp), "%s/config.json", model);
	const char *yaml = "version: 1\ngpus:\n  - {name: gpu0, budget: 1GiB, reserve: 0GiB}\n"
			   "default: {gpu0: \"0-3\"}\n";
	CHECK(moet_test_write_file(place, yaml, strlen(yaml)) == 0, "placement file");
	CHECK(moet_test_cli(NULL, "gen-checkpoint --preset tiny --seed 5 --out %s --quiet",
			    model) == 0, "gen-checkpoint");
	json_t *cfg = json_load_file(cfgp, 0, NULL);
	const int64_t L = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
	const int64_t E = json_integer_value(json_object_get(cfg, "n_routed_experts"));
	const int64_t TOPK = json_integer_value(json_object_get(cfg, "num_experts_per_tok"));
	const int64_t MOE = L - json_integer_value(json_object_get(cfg, "first_k_dense_replace"));
	json_decref(cfg);
	CHECK(E > 4 && TOPK > 0 && MOE > 0, "config.json geometry");
	const int64_t tier = (E - 4) * MOE;
	const size_t ebytes = max_expert_bytes(model, L, E);
	CHECK(ebytes > 0, "expert bytes from the checkpoint");

	const int steps = 3;
	const int64_t batches[2] = { 1, 3 };
	const char *budgets[3] = { "100%", "50%", "25%" };
	const double share[3] = { 1.0, 0.5, 0.25 };
	char *out = NULL;
	int rc = moet_test_cli(&out, "bench e2e --model %s --device cpu --placement %s --modes "
			       "hybrid --batches 1,3 --prefill none --ctx 4 --steps %d --ram-budgets "
			       "100%%,50%%,25%% --ram-only --json %s", model, place, steps, js);
	CHECK(rc == 0 && out && strstr(out, "RAM budget 25%") && !strstr(out, "prefill "),
	      "ram-only run: exit %d\n%s", rc, out ? out : "");
	free(out);
	json_t *r = json_load_file(js, 0, NULL);
	CHECK(r != NULL, "record %s", js);
	const json_t *rows = json_object_get(r, "results"), *ram = json_object_get(r, "ram");
	CHECK(json_array_size(rows) == 6 && json_array_size(ram) == 6,
	      "3 budgets x 2 batches: %zu rows, %zu ram entries", json_array_size(rows),
	      json_array_size(ram));
	CHECK(json_array_size(json_object_get(r, "steps")) == 0, "no all-in-RAM split");
	for (size_t i = 0; i < json_array_size(rows) && i < json_array_size(ram); i++) {
		const json_t *row = json_array_get(rows, i), *t = json_array_get(ram, i);
		const int k = (int)(i / 2);
		const int64_t B = batches[i % 2];
		char want[48];
		snprintf(want, sizeof(want), "decode-hybrid-ram%s", budgets[k]);
		const char *name = json_string_value(json_object_get(row, "name"));
		CHECK(name && !strcmp(name, want), "row %zu: %s, want %s", i, name ? name : "-",
		      want);
		const char *bud = json_string_value(json_object_get(t, "budget"));
		const char *md = json_string_value(json_object_get(t, "mode"));
		CHECK(bud && !strcmp(bud, budgets[k]) && md && !strcmp(md, "hybrid") &&
		      inum(t, "batch") == B, "ram %zu: budget %s mode %s batch %lld", i,
		      bud ? bud : "-", md ? md : "-", (long long)inum(t, "batch"));
		int64_t slots = (int64_t)(share[k] * (double)tier);
		slots = slots < 1 ? 1 : slots;
		const int64_t sb = inum(t, "slot_bytes");
		CHECK(inum(t, "tier_experts") == tier && inum(t, "slots") == slots,
		      "%s: tier %lld (want %lld), slots %lld (want %lld)", want,
		      (long long)inum(t, "tier_experts"), (long long)tier,
		      (long long)inum(t, "slots"), (long long)slots);
		CHECK(sb >= (int64_t)ebytes && inum(t, "resident_bytes") == slots * sb,
		      "%s: slot %lld bytes (expert %zu), resident %lld", want, (long long)sb, ebytes,
		      (long long)inum(t, "resident_bytes"));
		const double med = num(row, "median_s"), st = num(t, "step_s");
		CHECK(med > 0 && st == med && fabs(num(t, "tokens_per_s") - (double)B / st) <=
		      1e-9 * (double)B / st, "%s: step %g median %g tok/s %g", want, st, med,
		      num(t, "tokens_per_s"));
		const int64_t look = inum(t, "lookups");
		CHECK(look >= 1 && look <= steps * MOE * B * TOPK &&
		      inum(t, "hits") + inum(t, "late_hits") + inum(t, "misses") == look,
		      "%s batch %lld: %lld lookups = %lld hits + %lld late + %lld misses", want,
		      (long long)B, (long long)look, (long long)inum(t, "hits"),
		      (long long)inum(t, "late_hits"), (long long)inum(t, "misses"));
		const double hr = num(t, "hit_rate");
		CHECK(fabs(hr - (double)(inum(t, "hits") + inum(t, "late_hits")) / (double)look) <
		      1e-12, "%s: hit rate %g", want, hr);
		if (k == 0)
			CHECK(inum(t, "hits") == look && inum(t, "bytes_read") == 0 &&
			      inum(t, "misses") == 0, "100%% batch %lld: every lookup a hit, nothing "
			      "read in the timed steps (%lld bytes)", (long long)B,
			      (long long)inum(t, "bytes_read"));
	}
	json_decref(r);

	/* --prefill none alone: the decode rows stay, the prefill rows go */
	rc = moet_test_cli(NULL, "bench e2e --model %s --device cpu --modes cpu --batches 2 "
			   "--prefill none --ctx 4 --steps 2 --no-overlap-check --json %s", model, js);
	r = json_load_file(js, 0, NULL);
	rows = json_object_get(r, "results");
	const char *n0 = json_string_value(json_object_get(json_array_get(rows, 0), "name"));
	CHECK(rc == 0 && json_array_size(rows) == 1 && n0 && !strcmp(n0, "decode-cpu") &&
	      !json_object_get(r, "prefills") && !json_object_get(r, "ram"),
	      "--prefill none: exit %d, %zu rows, first %s", rc, json_array_size(rows),
	      n0 ? n0 : "-");
	json_decref(r);

	char args[2048];
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --modes cpu --ram-only",
		 model);
	moet_test_cli_expect(args, 1, "--ram-only needs --ram-budgets");
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --placement %s --modes "
		 "gpu,hybrid --ram-budgets 50%% --ram-only", model, place);
	moet_test_cli_expect(args, 1, "the gpu mode has no RAM-budget rows");
	snprintf(args, sizeof(args), "bench e2e --model %s --device cpu --prefill nonee", model);
	moet_test_cli_expect(args, 1, "--prefill: 'nonee'");
	free(dir);
	return moet_test_done("test_bench_e2e_ram");
}
