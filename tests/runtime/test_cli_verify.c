/*
 * test_cli_verify.c: `moet-hybrid verify` end to end on a generated tiny checkpoint with a
 * placement over two simulated devices: bit-identical at batch 1 and 4 with the routings
 * split over the CPU and both devices; a bad placement and too few --sim-devices exit 1 with
 * one line; no arguments exit 2. With decode staging by balance on the simulated devices
 * (MOET_STAGE_BALANCE=1, a slow CPU's hardware file) the same bits and the share of routings
 * computed from staged bytes printed, within the CPU tier's. generate and logits with
 * --placement give the same ids and the same logits bytes as without.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_test.h"

int main(void)
{
	char *dir = moet_test_mkdtemp("cli-verify");
	char model[1024], place[1024], bad[1024], cmd[16384];
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 9;
	snprintf(model, sizeof(model), "%s/m", dir ? dir : "/tmp");
	CHECK(dir && moet_gen_checkpoint(model, &gp) == 0, "gen: %s", moet_errmsg());
	snprintf(place, sizeof(place), "%s/p.yaml", dir);
	snprintf(bad, sizeof(bad), "%s/bad.yaml", dir);
	const char *yaml = "# two simulated GPUs\n"
			   "gpus:\n  - {name: gpu0, budget: 1GB}\n  - {name: gpu1, budget: 1GB}\n"
			   "default:\n  gpu0: \"0-9\"\n  gpu1: \"20-25\"\n"
			   "layers:\n  2: {gpu1: \"0-15, 30\"}\n";
	const char *bad_yaml = "gpus: [{name: gpu0, budget: 1GB}]\n"
			       "layers:\n  1: {gpu0: \"0-40\"}\n";
	CHECK(moet_test_write_file(place, yaml, strlen(yaml)) == 0, "write placement");
	CHECK(moet_test_write_file(bad, bad_yaml, strlen(bad_yaml)) == 0, "write placement");

	char *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s", moet_test_bin(), model,
		 place);
	int rc = moet_test_run(cmd, &out);
	CHECK(rc == 0 && out && strstr(out, "batch 1: logits bit-identical") &&
	      strstr(out, "batch 4: logits bit-identical") && strstr(out, "gpu0") &&
	      strstr(out, "gpu1"), "verify: rc %d, output '%s'", rc, out ? out : "");
	free(out);

	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s", moet_test_bin(), model,
		 bad);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 1 && out && strstr(out, "bad.yaml:3") && strchr(out, '\n') == strrchr(out, '\n'),
	      "bad placement: rc %d, '%s'", rc, out ? out : "");
	free(out);

	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s --sim-devices 1",
		 moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 1 && out && strstr(out, "--sim-devices 1"), "too few devices: rc %d, '%s'", rc,
	      out ? out : "");
	free(out);

	/* --batches: each size its own comparison (ragged groups: 5 sequences in calls of 2) */
	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s --prompts 5 --batches 1,2,5",
		 moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 0 && out && strstr(out, "batch 1: logits bit-identical") &&
	      strstr(out, "batch 2: logits bit-identical") &&
	      strstr(out, "batch 5: logits bit-identical"), "--batches: rc %d, '%s'", rc,
	      out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s --prompts 4 --batches 1,8",
		 moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 1 && out && strstr(out, "--batches: 8 is not in [1, 4]"), "--batches 8 of 4: rc "
	      "%d, '%s'", rc, out ? out : "");
	free(out);

	/* decode staging by balance on the simulated devices (a CPU far slower than the link:
	 * every cold expert staged): the same bits, and the staged share printed within the CPU
	 * tier's; none printed without staging (above) */
	char hw[1100];
	snprintf(hw, sizeof(hw), "%s/hw-slow.yaml", dir);
	static const char slow[] = "name: slow-cpu\ncpu_read_gbps: 0.001\npcie_gbps: 1000\n"
				   "pcie_latency_us: 0\n";
	CHECK(moet_test_write_file(hw, slow, strlen(slow)) == 0, "write hardware file");
	snprintf(cmd, sizeof(cmd), "MOET_STAGE_BALANCE=1 MOET_HARDWARE=%s %s verify --model %s "
		 "--placement %s --batches 4", hw, moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	const char *r = out ? strstr(out, "routings: CPU ") : NULL;
	double cpu_pct = -1, staged_pct = -1;
	CHECK(rc == 0 && r && strstr(out, "batch 4: logits bit-identical") &&
	      sscanf(r, "routings: CPU %lf%% (%lf%% staged to GPU 0)", &cpu_pct,
		     &staged_pct) == 2 && staged_pct > 0 && staged_pct <= cpu_pct,
	      "staged: rc %d, CPU %.1f%%, staged %.1f%%, '%s'", rc, cpu_pct, staged_pct,
	      out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s --batches 4",
		 moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 0 && out && !strstr(out, "staged"), "not staged: rc %d, '%s'", rc,
	      out ? out : "");
	free(out);

	/* --shadow: no reference run, CPU-tier calls recomputed by the backend and compared; a
	 * planted corruption (MOET_SHADOW_FAULT=1) must fail it */
	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s --shadow 1",
		 moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 0 && out && strstr(out, "shadow 1: ") && strstr(out, " 0 mismatches") &&
	      !strstr(out, " 0 CPU-tier expert calls"), "shadow: rc %d, '%s'", rc,
	      out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "MOET_SHADOW_FAULT=1 %s verify --model %s --placement %s "
		 "--shadow 1", moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 1 && out && strstr(out, "MISMATCH: last at layer"), "planted shadow fault: rc "
	      "%d, '%s'", rc, out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "%s verify --model %s --placement %s --shadow 0",
		 moet_test_bin(), model, place);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 1 && out && strstr(out, "--shadow a rate in (0, 1]"), "shadow 0: rc %d, '%s'",
	      rc, out ? out : "");
	free(out);

	/* generate / logits with and without the placement */
	char *a = NULL, *b = NULL;
	snprintf(cmd, sizeof(cmd), "%s generate --model %s --tokens 1,2,3,4 --max-new 8",
		 moet_test_bin(), model);
	int ra = moet_test_run(cmd, &a);
	snprintf(cmd, sizeof(cmd), "%s generate --model %s --tokens 1,2,3,4 --max-new 8 "
		 "--placement %s --sim-devices 3", moet_test_bin(), model, place);
	int rb = moet_test_run(cmd, &b);
	CHECK(ra == 0 && rb == 0 && a && b && strcmp(a, b) == 0, "generate with placement: '%s' "
	      "vs '%s'", a ? a : "", b ? b : "");
	free(a);
	free(b);
	char la[1100], lb[1100];
	snprintf(la, sizeof(la), "%s/a.npy", dir);
	snprintf(lb, sizeof(lb), "%s/b.npy", dir);
	snprintf(cmd, sizeof(cmd), "%s logits --model %s --tokens 5,6,7 --out %s && %s logits "
		 "--model %s --tokens 5,6,7 --out %s --placement %s && cmp %s %s", moet_test_bin(),
		 model, la, moet_test_bin(), model, lb, place, la, lb);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 0, "logits with placement differ: %s", out ? out : "");
	free(out);

	snprintf(cmd, sizeof(cmd), "%s verify", moet_test_bin());
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 2, "no arguments: rc %d", rc);
	free(out);
	free(dir);
	return moet_test_done("test_cli_verify");
}
