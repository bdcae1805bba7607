/*
 * test_bench_gpu_cli.c: `moet-hybrid bench gpu-experts`.
 *
 * Everywhere (no GPU needed):
 *   - bad arguments give one-line errors and non-zero exits;
 *   - the decode part on the CPU backend (--no-kernel --decode-device cpu) over a tiny
 *     generated checkpoint: one row per batch size, whose bytes equal the weights one step
 *     reads as computed here from the checkpoint's tensors (every tensor but the routed
 *     experts and the embedding table, plus B embedding rows, plus the reported distinct
 *     experts), and at batch 1 exactly top_k distinct experts per MoE layer.
 * Without a CUDA device: the bench exits 1 with "no CUDA device ... needs a GPU".
 * With one: `--quick` at the Kimi-K2 geometry plus the decode part on CUDA over the tiny
 * checkpoint; the record's keys, the expert rows' bytes and flops (computed here from the
 * geometry), each row's roofline ceiling and its ratio = rate / ceiling; one expert-pdl row
 * (1 token, MOET_GPU_PDL=1) beside the 1-token expert row: the same bytes, ceiling and ratio
 * rule, "pdl" on from sm_90 (a fallback below), vs_off = the expert row's median / its own.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_gpu.h"
#include "moet_test.h"

static double num(const json_t *obj, const char *key)
{
	return json_number_value(json_object_get(obj, key));
}

static int finite_pos(const json_t *v)
{
	return json_is_number(v) && isfinite(json_number_value(v)) && json_number_value(v) > 0;
}

/* The weights one decode step reads, from the checkpoint: fixed part, embedding row, and one
 * routed expert (the model's MoE layers share the geometry). */
typedef struct step_bytes {
	double fixed, embed_row, expert;
	int64_t top_k, n_moe;
} step_bytes;

static int model_bytes(const char *dir, step_bytes *sb)
{
	moet_ckpt *ck = NULL;
	moet_config c;
	if (moet_config_load(dir, &c) || moet_ckpt_open(dir, &ck))
		return -1;
	memset(sb, 0, sizeof(*sb));
	int64_t first_moe = -1;
	for (int64_t l = c.num_hidden_layers - 1; l >= 0; l--)
		if (moet_config_is_moe_layer(&c, l)) {
			sb->n_moe++;
			first_moe = l;
		}
	char pre[128];
	snprintf(pre, sizeof(pre), "model.layers.%lld.mlp.experts.0.", (long long)first_moe);
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		if (!strncmp(t->name, pre, strlen(pre)))
			sb->expert += (double)t->n_bytes;
		if (strstr(t->name, ".mlp.experts."))
			continue;
		if (!strcmp(t->name, "model.embed_tokens.weight")) {
			sb->embed_row = (double)t->n_bytes / (double)t->shape[0];
			if (!c.tie_word_embeddings)
				continue;
		}
		sb->fixed += (double)t->n_bytes;
	}
	sb->top_k = c.num_experts_per_tok;
	moet_ckpt_close(ck);
	return 0;
}

/* Rows named decode-step*: batch sizes 1, 4 in order; bytes as step_bytes says. */
static void check_decode_rows(const json_t *res, const step_bytes *sb, int on_gpu)
{
	size_t i;
	const json_t *row;
	int n = 0;
	json_array_foreach(res, i, row) {
		const char *name = json_string_value(json_object_get(row, "name"));
		if (!name || strncmp(name, "decode-step", 11))
			continue;
		CHECK(strstr(name, "dense") && strstr(name, "embed") && strstr(name, "lm_head"),
		      "decode row name says what it includes: %s", name);
		int64_t B = json_integer_value(json_object_get(row, "batch"));
		int64_t d = json_integer_value(json_object_get(row, "distinct_experts"));
		CHECK(B == (n == 0 ? 1 : 4), "decode row %d batch %lld", n, (long long)B);
		CHECK(json_integer_value(json_object_get(row, "tokens")) == B, "tokens = batch");
		CHECK(d >= sb->top_k * sb->n_moe && d <= B * sb->top_k * sb->n_moe,
		      "distinct experts %lld", (long long)d);
		if (B == 1)
			CHECK(d == sb->top_k * sb->n_moe, "batch 1: %lld distinct experts, want %lld",
			      (long long)d, (long long)(sb->top_k * sb->n_moe));
		double want = sb->fixed + (double)B * sb->embed_row + (double)d * sb->expert;
		CHECK(num(row, "bytes") == want, "decode bytes %.0f, want %.0f", num(row, "bytes"),
		      want);
		CHECK(finite_pos(json_object_get(row, "median_s")) &&
		      num(row, "min_s") <= num(row, "median_s") &&
		      num(row, "median_s") <= num(row, "max_s"), "decode times");
		CHECK(json_integer_value(json_object_get(row, "reps")) == 2, "2 steps timed");
		const char *cn = json_string_value(json_object_get(row, "ceiling"));
		CHECK(cn && !strcmp(cn, on_gpu ? "copy_GBps" : "none"), "decode ceiling %s",
		      cn ? cn : "-");
		n++;
	}
	CHECK(n == 2, "%d decode rows, want 2", n);
}

static void check_gpu_record(const json_t *r)
{
	const double H = 7168, I = 2048, G = 8;
	const double expert_bytes = 3 * (H * I + 16.0 * 56.0 * 4.0); /* codes + 128x128 scales */
	CHECK(json_integer_value(json_object_get(r, "schema")) == 1, "schema");
	CHECK(!strcmp(json_string_value(json_object_get(r, "bench")), "gpu-experts"), "bench");
	const char *cmd = json_string_value(json_object_get(r, "command"));
	CHECK(cmd && strstr(cmd, "bench gpu-experts --quick"), "command: %s", cmd ? cmd : "-");
	const json_t *git = json_object_get(r, "git");
	CHECK(json_is_string(json_object_get(git, "commit")), "git.commit");
	const json_t *gpu = json_object_get(json_object_get(r, "machine"), "gpu");
	CHECK(json_is_string(json_object_get(gpu, "name")) &&
	      json_integer_value(json_object_get(gpu, "l2_bytes")) > 0 &&
	      json_integer_value(json_object_get(gpu, "driver_version")) > 0, "machine.gpu");
	const json_t *geo = json_object_get(r, "geometry");
	CHECK(num(geo, "hidden") == H && num(geo, "moe_intermediate") == I &&
	      num(geo, "experts_per_call") == G && num(geo, "expert_bytes") == expert_bytes,
	      "geometry");
	CHECK(num(geo, "rotated_bytes") >= 4 * num(gpu, "l2_bytes"), "rotation defeats L2");
	const json_t *ce = json_object_get(r, "ceilings");
	const json_t *cp = json_object_get(ce, "copy_GBps"), *sg = json_object_get(ce,
										   "sgemm_GFLOPs");
	CHECK(finite_pos(json_object_get(cp, "value")) &&
	      !strcmp(json_string_value(json_object_get(cp, "unit")), "GB/s"), "copy_GBps");
	CHECK(finite_pos(json_object_get(sg, "value")) &&
	      !strcmp(json_string_value(json_object_get(sg, "unit")), "GFLOP/s"), "sgemm_GFLOPs");
	CHECK(json_array_size(json_object_get(json_object_get(sg, "detail"), "shapes")) == 2,
	      "two SGEMM shapes");
	const double copy = num(cp, "value") * 1e9, flops_peak = num(sg, "value") * 1e9;
	const json_t *res = json_object_get(r, "results"), *row;
	size_t i;
	int n_exp = 0;
	double med1 = 0;
	const json_t *pdl = NULL;
	int n_pdl = 0;
	json_array_foreach(res, i, row) {
		const char *name = json_string_value(json_object_get(row, "name"));
		if (name && !strcmp(name, "expert-pdl")) {
			pdl = row;
			n_pdl++;
		}
		if (!name || (strcmp(name, "expert") && strcmp(name, "expert-pdl")))
			continue;
		if (!strcmp(name, "expert") && num(row, "tokens") == 1)
			med1 = num(row, "median_s");
		const double T = num(row, "tokens"), med = num(row, "median_s");
		CHECK(finite_pos(json_object_get(row, "median_s")) &&
		      num(row, "min_s") <= med && med <= num(row, "max_s"), "row %zu times", i);
		CHECK(num(row, "bytes") == G * expert_bytes, "row %zu bytes %.0f", i,
		      num(row, "bytes"));
		CHECK(num(row, "flops") == G * 6 * H * I * T, "row %zu flops", i);
		const int bw = num(row, "bytes") / copy >= num(row, "flops") / flops_peak;
		const char *cn = json_string_value(json_object_get(row, "ceiling"));
		CHECK(cn && !strcmp(cn, bw ? "copy_GBps" : "sgemm_GFLOPs"), "row %zu ceiling", i);
		double want = bw ? num(row, "bytes") / med / copy : num(row, "flops") / med /
								     flops_peak;
		CHECK(fabs(num(row, "ratio") - want) <= 1e-9 * want, "row %zu ratio", i);
		n_exp++;
	}
	CHECK(n_exp == 5, "%d expert and expert-pdl rows with --quick, want 4 + 1", n_exp);
	CHECK(n_pdl == 1 && pdl && num(pdl, "tokens") == 1, "%d expert-pdl rows (1 token)", n_pdl);
	if (pdl) {
		const char *cc = json_string_value(json_object_get(gpu, "compute_capability"));
		const char *on = json_string_value(json_object_get(pdl, "pdl"));
		const int sm90 = cc && atoi(cc) >= 9;
		CHECK(on && (sm90 ? !strcmp(on, "on") : !strncmp(on, "fallback", 8)),
		      "expert-pdl: pdl '%s' on compute capability %s", on ? on : "-", cc ? cc : "-");
		const double want = med1 / num(pdl, "median_s");
		CHECK(med1 > 0 && fabs(num(pdl, "vs_off") - want) <= 1e-9 * want,
		      "expert-pdl: vs_off %g, want %g", num(pdl, "vs_off"), want);
	}
}

static json_t *run_json(const char *args, const char *json, char **out_text)
{
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "%s %s --json %s", moet_test_bin(), args, json);
	int rc = moet_test_run(cmd, out_text);
	CHECK(rc == 0, "'%s': exit %d: %s", args, rc, *out_text ? *out_text : "");
	return rc == 0 ? json_load_file(json, 0, NULL) : NULL;
}

int main(void)
{
	char *dir = moet_test_mkdtemp("benchgpu");
	if (!dir) {
		fprintf(stderr, "no scratch directory\n");
		return 1;
	}
	char cmd[2048], json[700], model[700];
	snprintf(json, sizeof(json), "%s/r.json", dir);
	snprintf(model, sizeof(model), "%s/tiny", dir);
	snprintf(cmd, sizeof(cmd), "%s gen-checkpoint --out %s --quiet", moet_test_bin(), model);
	CHECK(moet_test_run(cmd, NULL) == 0, "gen-checkpoint tiny");
	step_bytes sb;
	CHECK(model_bytes(model, &sb) == 0, "tiny checkpoint: %s", model);

	moet_test_cli_expect("bench gpu-experts --tokens 1,0", 1, "--tokens: 0 is not in");
	moet_test_cli_expect("bench gpu-experts --batches 1,x", 1, "--batches: '1,x'");
	moet_test_cli_expect("bench gpu-experts --decode-device tpu", 1, "--decode-device: 'tpu'");
	moet_test_cli_expect("bench gpu-experts --no-kernel", 1, "--no-kernel leaves nothing");
	moet_test_cli_expect("bench gpu-experts --group 65", 1, "--group: '65'");
	moet_test_cli_expect("bench gpu-experts extra", 1, "unexpected argument 'extra'");

	/* the decode part on the CPU backend: no GPU needed */
	char *out = NULL;
	char args[1500];
	snprintf(args, sizeof(args), "bench gpu-experts --no-kernel --decode-device cpu "
		 "--model-dir %s --batches 1,4 --steps 2 --prompt 3", model);
	json_t *r = run_json(args, json, &out);
	if (r) {
		check_decode_rows(json_object_get(r, "results"), &sb, 0);
		const json_t *d = json_object_get(r, "decode");
		CHECK(!strcmp(json_string_value(json_object_get(d, "device")), "cpu") &&
		      json_is_false(json_object_get(d, "generated")), "decode object");
		const char *tail = out ? strrchr(out, '\n') : NULL;
		CHECK(out && strstr(out, "name ") && tail, "table printed");
	}
	json_decref(r);
	free(out);
	out = NULL;

	const char *why = NULL;
	if (moet_gpu_count(&why) < 1) {
		fprintf(stderr, "no CUDA device (%s): checking the refusal only\n", why);
		moet_test_cli_expect("bench gpu-experts --quick", 1, "no CUDA device");
		moet_test_cli_expect("bench gpu-experts --quick", 1, "needs a GPU");
	} else {
		snprintf(args, sizeof(args), "bench gpu-experts --quick --model-dir %s --batches 1,4"
			 " --steps 2 --prompt 3", model);
		r = run_json(args, json, &out);
		if (r) {
			check_gpu_record(r);
			check_decode_rows(json_object_get(r, "results"), &sb, 1);
		}
		if (out)
			fprintf(stderr, "%s", out);
		json_decref(r);
		free(out);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	moet_test_run(cmd, NULL);
	free(dir);
	return moet_test_done("test_bench_gpu_cli");
}
