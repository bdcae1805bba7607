/*
 * test_gpu_upload_pread.c: the staged upload's pread source on a real GPU (MOET_UPLOAD=staged,
 * MOET_UPLOAD_READ=pread: runtime/model.c builds the items with their shard files,
 * runtime/upload.c reads them into the pinned staging). A generated checkpoint of several
 * shards runs on the CPU backend: the reference. On CUDA, a random placement uploaded with
 * 1 MiB staging buffers (many turns of the ring):
 *   - MOET_UPLOAD_READ=map and =pread give logits equal to the reference bit for bit;
 *   - an injected EIO (MOET_UPLOAD_READ_FAULT=eio:3) fails the placement in one line naming
 *     the shard file, and the next placement works (nothing half-bound);
 *   - a bad MOET_UPLOAD_READ is refused by name.
 * Skips (77) without a CUDA device.
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
#define STEPS 3

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) < 1) {
		printf("test_gpu_upload_pread: skipped (%s)\n", why ? why : "no CUDA device");
		return MOET_TEST_SKIP;
	}
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 17;
	gp.shard_mb = 1; /* several shards */
	char *dir = NULL;
	moet_model *cpu = moet_test_gen_open_on("gpu-upload-pread", &gp, "cpu", &dir), *gpu = NULL;
	CHECK(dir && moet_model_open_on(dir, "cuda", &gpu) == 0, "open cuda: %s", moet_errmsg());
	if (!cpu || !gpu) {
		moet_model_close(cpu);
		moet_model_close(gpu);
		free(dir);
		return moet_test_done("test_gpu_upload_pread");
	}
	const moet_config *c = moet_model_config(cpu);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n_log = (size_t)(SEQS * (STEPS + 1) * V);
	float *ref = calloc(n_log, sizeof(float)), *got = calloc(n_log, sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	uint64_t r = 99;
	for (int64_t i = 0; own && i < L * E; i++)
		own[i] = (int16_t)((moet_test_xorshift64(&r) % 4) ? 0 : -1);
	CHECK(ref && got && own && moet_test_ragged_run(cpu, SEQS, STEPS, 1, ref) == 0,
	      "reference: %s", moet_errmsg());
	setenv("MOET_UPLOAD", "staged", 1);
	setenv("MOET_UPLOAD_CHUNK_MB", "1", 1);
	/* NOTE: a fresh open per variant: a placement binds only the experts not yet bound */
	const char *reads[2] = { "map", "pread" };
	for (int k = 0; k < 2 && own; k++) {
		moet_model_close(gpu);
		gpu = NULL;
		setenv("MOET_UPLOAD_READ", reads[k], 1);
		memset(got, 0, n_log * sizeof(float));
		CHECK(moet_model_open_on(dir, "cuda", &gpu) == 0, "open: %s", moet_errmsg());
		if (!gpu)
			break;
		CHECK(moet_model_set_placement(gpu, own, 1) == 0, "%s: %s", reads[k], moet_errmsg());
		CHECK(moet_test_ragged_run(gpu, SEQS, STEPS, 1, got) == 0 &&
		      memcmp(ref, got, n_log * sizeof(float)) == 0,
		      "MOET_UPLOAD_READ=%s: logits equal the CPU reference", reads[k]);
		double b = 0, s = 0;
		moet_model_upload_stats(gpu, &b, &s);
		CHECK(b > 0, "%s: %.0f bytes uploaded", reads[k], b);
		printf("MOET_UPLOAD_READ=%s: %.1f MB in %.3f s\n", reads[k], b / 1e6, s);
	}
	moet_model_close(gpu);
	gpu = NULL;
	if (own && moet_model_open_on(dir, "cuda", &gpu) == 0) {
		setenv("MOET_UPLOAD_READ_FAULT", "eio:3", 1);
		int rc = moet_model_set_placement(gpu, own, 1);
		unsetenv("MOET_UPLOAD_READ_FAULT");
		CHECK(rc == MOET_EIO && strstr(moet_errmsg(), ".safetensors: read of") &&
		      strstr(moet_errmsg(), "Input/output error") && !strchr(moet_errmsg(), '\n'),
		      "EIO during the upload: %d %s", rc, moet_errmsg());
		printf("injected EIO: %s\n", moet_errmsg());
		memset(got, 0, n_log * sizeof(float));
		CHECK(moet_model_set_placement(gpu, own, 1) == 0, "after the fault: %s",
		      moet_errmsg());
		CHECK(moet_test_ragged_run(gpu, SEQS, STEPS, 1, got) == 0 &&
		      memcmp(ref, got, n_log * sizeof(float)) == 0, "after the fault: logits equal");
	}
	moet_model_close(gpu);
	gpu = NULL;
	if (own && moet_model_open_on(dir, "cuda", &gpu) == 0) {
		setenv("MOET_UPLOAD_READ", "mapped", 1);
		CHECK(moet_model_set_placement(gpu, own, 1) == MOET_EINVAL &&
		      strstr(moet_errmsg(), "MOET_UPLOAD_READ='mapped'"), "bad value: %s",
		      moet_errmsg());
	}
	unsetenv("MOET_UPLOAD");
	unsetenv("MOET_UPLOAD_READ");
	unsetenv("MOET_UPLOAD_CHUNK_MB");
	moet_model_close(gpu);
	moet_model_close(cpu);
	free(ref);
	free(got);
	free(own);
	free(dir);
	return moet_test_done("test_gpu_upload_pread");
}
