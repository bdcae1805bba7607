/*
 * test_gpu_multi.c: the hybrid engine over two GPUs (issue 5 item 3) and the per-GPU memory
 * cap. A generated checkpoint (tiny preset, 4 layers) on the CPU backend without a placement
 * is the reference; on CUDA with placements over {CPU, GPU 0, GPU 1} (random thirds, all on
 * GPU 1, GPU 1 and the CPU only), ragged batches and one-sequence calls give logits equal to
 * the reference bit for bit, batches also in two micro-batches (MOET_MICROBATCH=1: each GPU
 * beyond the first with a call per micro-batch slot in flight) and in one pass (=0), and every
 * tier serves routings. MOET_GPU_MEM_CAP: a cap below
 * what the model needs fails the open with a one-line error naming the cap (a child process:
 * the cap is read once per process); a malformed cap is refused.
 * Skips (77) with fewer than two CUDA devices (the cap part needs one).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_gpu.h"
#include "moet_model.h"
#include "moet_test.h"

#define SEQS 3
#define STEPS 4

static uint64_t rng = 0x13198A2E03707344ull;
static uint64_t next(void)
{
	return moet_test_xorshift64(&rng);
}

static int run(moet_model *m, int batched, float *out)
{
	return moet_test_ragged_run(m, SEQS, STEPS, batched, out);
}

int main(void)
{
	const char *why = NULL;
	int n_gpu = moet_gpu_count(&why);
	if (n_gpu < 1) {
		printf("test_gpu_multi: skipped (%s)\n", why ? why : "no CUDA device");
		return MOET_TEST_SKIP;
	}
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 21;
	gp.n_layers = 4;
	char *dir = moet_test_gen("gpu-multi", &gp);
	if (!dir)
		return moet_test_done("test_gpu_multi");

	/* the memory cap, in child processes */
	char args[1024];
	snprintf(args, sizeof(args), "generate --model %s --device cuda --tokens 1,2,3 --max-new 2",
		 dir);
	char cmd[1200];
	char *out = NULL;
	snprintf(cmd, sizeof(cmd), "MOET_GPU_MEM_CAP=64MiB %s %s 2>&1", moet_test_bin(), args);
	int rc = moet_test_run(cmd, &out);
	CHECK(rc == 1 && out && strstr(out, "MOET_GPU_MEM_CAP=64MiB"),
	      "a 64 MiB cap (below the CUDA context alone) fails the run: exit %d: %s", rc,
	      out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "MOET_GPU_MEM_CAP=lots %s %s 2>&1", moet_test_bin(), args);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 1 && out && strstr(out, "MOET_GPU_MEM_CAP='lots'"), "malformed cap: %s",
	      out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "MOET_GPU_MEM_CAP=64GiB %s %s 2>&1", moet_test_bin(), args);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 0, "a 64 GiB cap leaves room: %s", out ? out : "");
	free(out);
	if (n_gpu < 2) {
		printf("test_gpu_multi: two-GPU part skipped (%d CUDA device)\n", n_gpu);
		free(dir);
		return moet_test_done("test_gpu_multi");
	}

	moet_model *cpu = NULL, *gpu = NULL;
	CHECK(moet_model_open_on(dir, "cpu", &cpu) == 0, "open cpu: %s", moet_errmsg());
	CHECK(moet_model_open_on(dir, "cuda", &gpu) == 0, "open cuda: %s", moet_errmsg());
	if (!cpu || !gpu)
		return moet_test_done("test_gpu_multi");
	const moet_config *c = moet_model_config(cpu);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n_log = (size_t)(SEQS * (STEPS + 1) * V);
	float *ref = malloc(n_log * sizeof(float)), *got = malloc(n_log * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	CHECK(run(cpu, 1, ref) == 0, "reference: %s", moet_errmsg());
	const char *names[] = { "random thirds", "all on GPU 1", "GPU 1 + CPU" };
	for (int pl = 0; pl < 3; pl++) {
		for (int64_t i = 0; i < L * E; i++)
			own[i] = pl == 0 ? (int16_t)((int)(next() % 3) - 1) : pl == 1 ? 1
				: (int16_t)((next() % 2) ? 1 : -1);
		CHECK(moet_model_set_placement(gpu, own, 2) == 0, "%s: %s", names[pl],
		      moet_errmsg());
		/* solo calls, then batches in the engine's choice, two micro-batches, one pass */
		static const char *const mb[4] = { NULL, NULL, "1", "0" };
		for (int form = 0; form < 4; form++) {
			moet_hybrid_stats hs;
			moet_model_hybrid_stats(gpu, &hs, 1);
			if (mb[form])
				setenv("MOET_MICROBATCH", mb[form], 1);
			memset(got, 0xCD, n_log * sizeof(float));
			CHECK(run(gpu, form > 0, got) == 0, "%s: %s", names[pl], moet_errmsg());
			unsetenv("MOET_MICROBATCH");
			moet_model_hybrid_stats(gpu, &hs, 1);
			CHECK(memcmp(ref, got, n_log * sizeof(float)) == 0,
			      "%s (%s): logits differ from the CPU reference", names[pl],
			      form == 0 ? "solo" : form == 1 ? "batched" : form == 2 ?
			      "two micro-batches" : "one pass");
			CHECK(form != 2 || hs.split_passes > 0, "%s: MOET_MICROBATCH=1 split no pass",
			      names[pl]);
			CHECK(form != 3 || hs.split_passes == 0, "%s: MOET_MICROBATCH=0 split %llu "
			      "passes", names[pl], (unsigned long long)hs.split_passes);
		}
		uint64_t cnt[3];
		moet_model_tier_counts(gpu, cnt, 3);
		if (pl == 0)
			CHECK(cnt[0] && cnt[1] && cnt[2], "random thirds: every tier used");
		if (pl == 1)
			CHECK(!cnt[0] && !cnt[1] && cnt[2], "all on GPU 1");
		printf("%-14s CPU %llu, GPU0 %llu, GPU1 %llu routings: logits equal the CPU "
		       "reference\n", names[pl], (unsigned long long)cnt[0],
		       (unsigned long long)cnt[1], (unsigned long long)cnt[2]);
	}
	CHECK(moet_model_set_placement(gpu, own, n_gpu + 1) == MOET_EDEVICE,
	      "more devices than the machine has");
	moet_model_close(gpu);
	moet_model_close(cpu);
	free(ref);
	free(got);
	free(own);
	free(dir);
	return moet_test_done("test_gpu_multi");
}
