/*
 * cli_bench_e2e.c: `moet-hybrid bench e2e`: options, the placement file, the record
 * (runtime/moet_bench_e2e.h does the work).
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "moet_bench_e2e.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_cost.h"
#include "moet_placement.h"
#include "moet_profile.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid bench e2e --model DIR [--placement FILE] [--device cuda|cpu]\n"
		   "                             [--modes gpu,hybrid,cpu] [--batches 1,4,16,64]\n"
		   "                             [--prefill 1024,8192] [--ctx N] [--steps N]\n"
		   "                             [--warmup N]\n"
		   "                             [--no-overlap-check] [--op-times] [--graph]\n"
		   "                             [--profile-out FILE]\n"
		   "                             [--ram-budgets 100%%,50%%,25%%] [--ram-only]\n"
		   "                             [--predict-profile P] [--hardware FILE]\n"
		   "                             [--hardware-out FILE] [--json FILE]\n\n"
		   "The whole model per placement mode: gpu (every routed expert on the GPU), hybrid\n"
		   "(the placement file's GPUs and the CPU tier), cpu (every routed expert on the\n"
		   "CPU tier, the dense part on the GPU). Per mode: the time to ready (open and\n"
		   "upload), decode steps at each batch size (B sequences after --ctx tokens, --steps\n"
		   "timed steps: median step, tokens/s, the CPU tier's busy and waited time, PCIe\n"
		   "copies), for hybrid and cpu also the serial run (overlap off: Tc and Tg alone)\n"
		   "and the bound max(Tc, Tg) + 0.15 min(Tc, Tg), and one prefill per length.\n"
		   "Defaults: --device cuda, --modes gpu,hybrid,cpu (hybrid needs --placement),\n"
		   "--batches 1,4,16,64, --prefill 1024,8192, --ctx 64, --steps 8, --warmup 1\n"
		   "(untimed decode steps before the timed ones: caches, the NVMe tier's slots\n"
		   "and the micro-batch choice settle).\n"
		   "--op-times: per decode batch, the time of every backend op per step, and per\n"
		   "prefill the ops' times in it (each op waited for, so that run's step and\n"
		   "prefill times are not the engine's: run it alone).\n"
		   "--graph: in the gpu and hybrid modes, each decode batch again with its passes\n"
		   "captured into CUDA graphs and replayed (MOET_CUDA_GRAPH=1; hybrid in one pass,\n"
		   "the CPU tier as host nodes): rows decode-<mode>-graph beside decode-<mode>;\n"
		   "both on the backend's own stream with the experts grouped on the device\n"
		   "(MOET_GPU_STREAM=own, MOET_GPU_DEVGROUP=1 where unset).\n"
		   "--profile-out FILE: the routing of the first mode's timed decode steps as a\n"
		   "profile (for `plan --predict` on the same workload).\n"
		   "--predict-profile P [--hardware FILE]: the cost model's prediction of each\n"
		   "measured decode step (plan --predict) from profile P (e.g. --profile-out of an\n"
		   "earlier run: the same workload) beside the measurement, and its error.\n"
		   "--hardware-out FILE: after the run, a hardware file for the cost model\n"
		   "(plan --hardware) with what this run measured, each figure under a comment\n"
		   "naming its row: cpu_read_gbps (the CPU tier's own decode rate where the run\n"
		   "timed it alone, else the source read with the CPU tier's threads),\n"
		   "pcie_gbps (pinned host-to-device, GPU runs), gpu_dense_ms (each gpu-mode step\n"
		   "less the cost model's GPU expert time for that batch's routing, priced with\n"
		   "--hardware or the built-in figures); the rest left out (defaults apply).\n"
		   "--ram-budgets LIST: for the hybrid and cpu modes, decode again with the CPU\n"
		   "tier behind the NVMe tier at each RAM budget (GiB or a share of the tier;\n"
		   "docs/io-uring.md): rows decode-<mode>-ram<budget>, hit rate and recall (the\n"
		   "timed steps'; the record's \"ram\" array: slots, resident bytes, counters).\n"
		   "--ram-only: only those rows (no all-in-RAM decode rows; default modes hybrid,\n"
		   "cpu). --prefill none: no prefill rows.\n");
}

static int parse_modes(const char *s, int *out)
{
	char buf[64];
	snprintf(buf, sizeof(buf), "%s", s);
	*out = 0;
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (!strcmp(t, "gpu"))
			*out |= 1 << MOET_E2E_GPU;
		else if (!strcmp(t, "hybrid"))
			*out |= 1 << MOET_E2E_HYBRID;
		else if (!strcmp(t, "cpu"))
			*out |= 1 << MOET_E2E_CPU;
		else
			return moet_err(MOET_EINVAL, "--modes: '%s' (want gpu, hybrid, cpu)", t);
	}
	return *out ? 0 : moet_err(MOET_EINVAL, "--modes: empty");
}

/* "100%,50%,25%" into at most 8 labels of up to 15 characters. */
static int split_budgets(const char *s, char out[8][16], int *n)
{
	*n = 0;
	for (const char *p = s; *p;) {
		size_t len = strcspn(p, ",");
		if (*n == 8 || len == 0 || len > 15)
			return moet_err(MOET_EINVAL, "--ram-budgets '%s': at most 8 budgets such as "
					"50%% or 4.5 (GiB), comma-separated", s);
		memcpy(out[*n], p, len);
		out[(*n)++][len] = 0;
		p += len + (p[len] == ',');
	}
	return *n ? 0 : moet_err(MOET_EINVAL, "--ram-budgets: empty");
}

/* A file the run will write at its end: refused before the run when it cannot be created
 * (a missing or read-only directory, a directory in its place). */
static int check_out_path(const char *opt, const char *path)
{
	struct stat sb;
	char dir[4096];
	if (!*path)
		return moet_err(MOET_EINVAL, "%s: empty path", opt);
	if (!stat(path, &sb)) {
		if (S_ISDIR(sb.st_mode))
			return moet_err(MOET_EINVAL, "%s %s: is a directory", opt, path);
		if (access(path, W_OK))
			return moet_err(MOET_EIO, "%s %s: cannot write: %s", opt, path,
					strerror(errno));
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else
		slash[slash == dir] = 0; /* "/x": the root */
	if (access(dir, W_OK | X_OK))
		return moet_err(MOET_EIO, "%s %s: cannot create: directory %s: %s", opt, path, dir,
				strerror(errno));
	return 0;
}

static int apply_ram(moet_model *m, const char *label)
{
	return moet_cli_apply_ram_budget(m, label, NULL);
}

/* The cost model's step for every measured decode step of the record, in both of the engine's
 * forms (one pass, two micro-batches) and the faster, beside the measurement: the default step
 * (the form the engine chose: "ran", the share of timed passes in two halves) against the
 * chosen prediction, and the one-pass run of the overlap check against the one-pass
 * prediction. Table and the record's "predictions". */
static int predict(const moet_bench_e2e_opts *o, const char *prof_path, const char *hw_path,
		   json_t *rec, FILE *out)
{
	moet_model *m = NULL;
	moet_placement_sizes *sz = NULL;
	moet_profile *prof = NULL;
	moet_cost_hw hw;
	int16_t *own = NULL;
	json_t *preds = json_array();
	int rc = preds ? moet_model_open(o->model_dir, &m) : moet_err(MOET_ENOMEM, "predictions");
	if (!rc)
		rc = moet_placement_sizes_from_ckpt(moet_model_config(m), moet_model_ckpt(m), &sz);
	if (!rc)
		rc = moet_profile_load(prof_path, &prof);
	if (!rc && hw_path)
		rc = moet_cost_hw_load(hw_path, &hw);
	else if (!rc)
		moet_cost_hw_defaults(&hw);
	const moet_config *c = rc ? NULL : moet_model_config(m);
	const int64_t LE = c ? c->num_hidden_layers * c->n_routed_experts : 0;
	if (!rc && !(own = malloc((size_t)(LE ? LE : 1) * sizeof(*own))))
		rc = moet_err(MOET_ENOMEM, "owner table");
	if (!rc)
		fprintf(out, "%-7s %6s %11s %-10s %11s %11s %11s %-10s %8s %8s %11s %9s   (cost "
			"model: %s)\n", "mode", "batch", "measured_ms", "ran", "1pass_meas",
			"pred_1pass", "pred_2halves", "pred_form", "error", "err_1p", "pred_1p_spr",
			"err_1p_sp", hw_path ? hw_path : "built-in");
	moet_cost_hw hw_spread = hw; /* the one-pass form again with --layer-max spread */
	hw_spread.layer_max = MOET_COST_MAX_SPREAD;
	size_t i;
	json_t *st;
	json_array_foreach(rc ? NULL : json_object_get(rec, "steps"), i, st) {
		const char *mode = json_string_value(json_object_get(st, "mode"));
		const int64_t B = json_integer_value(json_object_get(st, "batch"));
		const double meas = json_number_value(json_object_get(st, "step_s"));
		const double split = json_number_value(json_object_get(st, "split_share"));
		json_t *one_j = json_object_get(st, "one_pass_step_s");
		const double one = json_is_number(one_j) ? json_number_value(one_j) : 0;
		int n_gpus = 1;
		for (int64_t k = 0; k < LE; k++)
			own[k] = !strcmp(mode, "gpu") ? 0 : !strcmp(mode, "cpu") ? -1 : o->owner[k];
		if (!strcmp(mode, "hybrid") && o->n_devices > 1)
			n_gpus = o->n_devices;
		moet_cost_pred pr, ps;
		if ((rc = moet_cost_predict_owners(c, sz, own, n_gpus, prof, MOET_PROFILE_DECODE,
						   &hw, B, &pr)) ||
		    (rc = moet_cost_predict_owners(c, sz, own, n_gpus, prof, MOET_PROFILE_DECODE,
						   &hw_spread, B, &ps)))
			break;
		const double err = (pr.chosen_ms / 1e3 - meas) / meas;
		const double err1 = one > 0 ? (pr.step_ms / 1e3 - one) / one : 0;
		const double err1s = one > 0 ? (ps.step_ms / 1e3 - one) / one : 0;
		char ran[16], one_s[16] = "-", two_s[16] = "-", err1_s[16] = "-", err1s_s[16] = "-";
		if (split <= 0)
			snprintf(ran, sizeof(ran), "one pass");
		else if (split >= 1)
			snprintf(ran, sizeof(ran), "two halves");
		else
			snprintf(ran, sizeof(ran), "2h %.0f%%", 100 * split);
		if (one > 0) {
			snprintf(one_s, sizeof(one_s), "%.3f", 1e3 * one);
			snprintf(err1_s, sizeof(err1_s), "%+.1f%%", 100 * err1);
			snprintf(err1s_s, sizeof(err1s_s), "%+.1f%%", 100 * err1s);
		}
		if (pr.two.possible)
			snprintf(two_s, sizeof(two_s), "%.3f", pr.two.step_ms);
		fprintf(out, "%-7s %6lld %11.3f %-10s %11s %11.3f %11s %-10s %+7.1f%% %8s %11.3f "
			"%9s\n", mode, (long long)B, 1e3 * meas, ran, one_s, pr.step_ms, two_s,
			moet_cost_form_name(pr.form), 100 * err, err1_s, ps.step_ms, err1s_s);
		json_t *pj = json_pack("{s:s, s:I, s:f, s:f, s:f, s:f, s:s, s:f, s:f}", "mode",
				       mode, "batch", (json_int_t)B, "measured_step_s", meas,
				       "predicted_step_s", pr.chosen_ms / 1e3, "error", err,
				       "predicted_one_pass_s", pr.step_ms / 1e3, "predicted_form",
				       moet_cost_form_name(pr.form), "measured_split_share", split,
				       "cpu_distinct_one_pass", pr.cpu_distinct);
		if (pj && pr.two.possible) {
			json_object_set_new(pj, "predicted_two_halves_s",
					    json_real(pr.two.step_ms / 1e3));
			json_object_set_new(pj, "cpu_distinct_two_halves",
					    json_real(pr.two.cpu_distinct));
		}
		if (pj)
			json_object_set_new(pj, "predicted_one_pass_spread_s",
					    json_real(ps.step_ms / 1e3));
		if (pj && one > 0) {
			json_object_set_new(pj, "measured_one_pass_s", json_real(one));
			json_object_set_new(pj, "error_one_pass", json_real(err1));
			json_object_set_new(pj, "error_one_pass_spread", json_real(err1s));
		}
		json_array_append_new(preds, pj);
	}
	if (!rc) {
		fprintf(out, "error: the faster form's prediction against the default step (the "
			"engine's measured choice, 'ran'); err_1p: the one-pass prediction against "
			"the one-pass run; pred_1p_spr, err_1p_sp: the same with --layer-max "
			"spread\n");
		json_object_set_new(rec, "predictions", preds);
		json_object_set_new(rec, "predict_profile", json_string(prof_path));
		preds = NULL;
	}
	json_decref(preds);
	free(own);
	moet_profile_free(prof);
	moet_placement_sizes_free(sz);
	moet_model_close(m);
	return rc;
}

int moet_cli_bench_e2e(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "placement", required_argument, NULL, 'p' },
		{ "device", required_argument, NULL, 'd' },
		{ "modes", required_argument, NULL, 'M' },
		{ "batches", required_argument, NULL, 'b' },
		{ "prefill", required_argument, NULL, 'P' },
		{ "ctx", required_argument, NULL, 'c' },
		{ "steps", required_argument, NULL, 's' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "no-overlap-check", no_argument, NULL, 'n' },
		{ "op-times", no_argument, NULL, 'o' },
		{ "graph", no_argument, NULL, 'K' },
		{ "profile-out", required_argument, NULL, 'R' },
		{ "ram-budgets", required_argument, NULL, 'G' },
		{ "ram-only", no_argument, NULL, 'g' },
		{ "predict-profile", required_argument, NULL, 'F' },
		{ "hardware", required_argument, NULL, 'W' },
		{ "hardware-out", required_argument, NULL, 'H' },
		{ "json", required_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const int64_t def_b[] = { 1, 4, 16, 64 }, def_p[] = { 1024, 8192 };
	moet_bench_e2e_opts o = { .device = "cuda", .batches = def_b, .n_batches = 4,
				  .prefills = def_p, .n_prefills = 2, .ctx = 64, .steps = 8, .warmup = 1,
				  .overlap_check = 1, .modes = 7 };
	const char *place = NULL, *json_path = NULL, *pred_prof = NULL, *hw_path = NULL;
	const char *hw_out = NULL;
	moet_cost_hw dense_hw;
	int64_t *batches = NULL, *prefills = NULL;
	int16_t *owner = NULL;
	char ram[8][16];
	const char *ram_p[8];
	int c, rc = 0, modes_given = 0;
	char *end;
	optind = 1;
	while (!rc && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o.model_dir = optarg; break;
		case 'p': place = optarg; break;
		case 'd':
			if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu"))
				rc = moet_err(MOET_EINVAL, "--device: '%s' (want cuda or cpu)", optarg);
			o.device = optarg;
			break;
		case 'M': rc = parse_modes(optarg, &o.modes); modes_given = 1; break;
		case 'b': rc = moet_cli_parse_list("--batches", optarg, 1,
							 4096, &batches, &o.n_batches);
			o.batches = batches;
			break;
		case 'P': if (!strcmp(optarg, "none")) {
				o.n_prefills = 0;
				break;
			}
			rc = moet_cli_parse_list("--prefill", optarg, 1,
							 1 << 17, &prefills, &o.n_prefills);
			o.prefills = prefills;
			break;
		case 'c': o.ctx = (int)strtol(optarg, &end, 10);
			if (*end || o.ctx < 1 || o.ctx > 1 << 16)
				rc = moet_err(MOET_EINVAL, "--ctx: '%s' (1 .. 65536)", optarg);
			break;
		case 's': o.steps = (int)strtol(optarg, &end, 10);
			if (*end || o.steps < 1 || o.steps > 100000)
				rc = moet_err(MOET_EINVAL, "--steps: '%s' (1 .. 100000)", optarg);
			break;
		case 'w': o.warmup = (int)strtol(optarg, &end, 10);
			if (*end || o.warmup < 0 || o.warmup > 100000)
				rc = moet_err(MOET_EINVAL, "--warmup: '%s' (0 .. 100000)", optarg);
			break;
		case 'n': o.overlap_check = 0; break;
		case 'o': o.op_times = 1; break;
		case 'K': o.graph = 1; break;
		case 'R': o.profile_out = optarg; break;
		case 'G': rc = split_budgets(optarg, ram, &o.n_ram); break;
		case 'g': o.ram_only = 1; break;
		case 'F': pred_prof = optarg; break;
		case 'W': hw_path = optarg; break;
		case 'H': hw_out = optarg; break;
		case 'j': json_path = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!rc && !o.model_dir) {
		usage(stderr);
		return 2;
	}
	if (!rc && optind < argc)
		rc = moet_err(MOET_EINVAL, "unexpected argument '%s'", argv[optind]);
	if (!rc && !place && !modes_given)
		o.modes &= ~(1 << MOET_E2E_HYBRID);
	if (!rc && o.ram_only && !o.n_ram)
		rc = moet_err(MOET_EINVAL, "--ram-only needs --ram-budgets LIST");
	if (!rc && o.ram_only && !modes_given)
		o.modes &= ~(1 << MOET_E2E_GPU); /* no tier there: nothing to run */
	if (!rc && o.ram_only && (o.modes & (1 << MOET_E2E_GPU)))
		rc = moet_err(MOET_EINVAL, "--ram-only: the gpu mode has no RAM-budget rows "
			      "(--modes hybrid,cpu)");
	if (!rc && !place && (o.modes & (1 << MOET_E2E_HYBRID)))
		rc = moet_err(MOET_EINVAL, "--modes hybrid needs --placement FILE");
	if (!rc && place)
		rc = moet_cli_load_owner(o.model_dir, place, &owner, &o.n_devices);
	o.owner = owner;
	if (!rc && hw_out && !(rc = check_out_path("--hardware-out", hw_out))) {
		/* the figures to measure; the hardware that prices the dense part's experts */
		o.cpu_read = 1;
		if (!hw_path)
			moet_cost_hw_defaults(&dense_hw);
		else if ((rc = moet_cost_hw_load(hw_path, &dense_hw)))
			rc = moet_err_prefix(rc, "--hardware");
		o.dense_hw = &dense_hw;
		o.dense_hw_file = hw_path;
	}
	for (int i = 0; i < o.n_ram; i++)
		ram_p[i] = ram[i];
	o.ram_budgets = ram_p;
	o.apply_ram = apply_ram;
	o.report_ram = moet_cli_ram_report;
	json_t *rec = NULL;
	if (!rc)
		rc = moet_bench_record_new("e2e", &rec);
	if (!rc) {
		json_object_set_new(rec, "model_dir", json_string(o.model_dir));
		json_object_set_new(rec, "placement", place ? json_string(place) : json_null());
		json_object_set_new(rec, "device", json_string(o.device));
		rc = moet_bench_e2e(&o, rec, stderr, stdout);
	}
	if (!rc && pred_prof)
		rc = predict(&o, pred_prof, hw_path, rec, stdout);
	if (!rc && json_path)
		rc = moet_bench_write(rec, json_path);
	if (!rc && hw_out && (rc = moet_bench_e2e_hw_save(rec, json_path, hw_out)))
		rc = moet_err_prefix(rc, "--hardware-out");
	if (!rc && hw_out)
		printf("hardware file: %s (what this run measured; plan --hardware %s)\n", hw_out,
		       hw_out);
	json_decref(rec);
	free(batches);
	free(prefills);
	free(owner);
	return rc ? moet_cli_fail("bench e2e", rc) : 0;
}
