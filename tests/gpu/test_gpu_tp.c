/*
 * test_gpu_tp.c: MOET_TP=2 over two CUDA devices, the exchanges through NCCL (runtime/tp.c,
 * gpu/nccl.cu), against the unsplit CPU reference bit for bit (tests/tp_check.h: ragged
 * batches, one sequence per call, a placement over {CPU, GPU 0, GPU 1} in two micro-batches),
 * in both MLA forms (the expanded form's attention split by heads); also with
 * NCCL_P2P_DISABLE=1 (no peer-to-peer, as on GeForce cards), with MOET_GPU_STREAM=own (rank
 * 0's work on the backend's own stream), MOET_TP_ATTN=rank0 (the attention whole on rank 0),
 * and under MOET_CUDA_GRAPH=1 (a split pass is not captured: no graph, the same bits); the
 * tiny-tp preset, whose heads are whole blocks, with each rank computing its heads' q and kvb
 * (both MLA forms; the absorbed form's latent attention split by heads too).
 * MOET_TP beyond the devices present fails the open naming the missing device.
 * Skips (77) with fewer than two CUDA devices, or without NCCL (libnccl.so.2).
 */
#include "../tp_check.h"

#include "moet_gpu.h"

int main(void)
{
	const char *why = NULL;
	const int n_gpu = moet_gpu_count(&why);
	if (n_gpu < 2) {
		printf("test_gpu_tp: skipped (%d CUDA devices: %s)\n", n_gpu,
		       why ? why : "two needed");
		return MOET_TEST_SKIP;
	}
	tp_ctx x;
	if (tp_prepare("gpu-tp", MOET_GEN_TINY, 43, &x))
		return moet_test_done("test_gpu_tp");
	moet_model *m = NULL;
	moet_test_env("MOET_TP", "2");
	int rc = moet_model_open_on(x.dir, "cuda", &m);
	moet_test_env("MOET_TP", NULL);
	moet_model_close(m);
	if (rc == MOET_EUNSUP && strstr(moet_errmsg(), "NCCL")) {
		printf("test_gpu_tp: skipped (%s)\n", moet_errmsg());
		tp_ctx_free(&x);
		return MOET_TEST_SKIP;
	}
	CHECK(rc == 0, "open with MOET_TP=2: %s", moet_errmsg());
	for (int absorbed = 0; !rc && absorbed < 2; absorbed++) {
		rc = tp_reference(x.dir, absorbed, x.ref, x.n_log);
		CHECK(rc == 0, "reference: %s", moet_errmsg());
		if (rc)
			break;
		tp_case(x.dir, "cuda", 2, absorbed, x.own, 2, x.ref, x.got, x.n_log, "nccl");
		if (absorbed)
			continue;
		moet_test_env("NCCL_P2P_DISABLE", "1");
		tp_case(x.dir, "cuda", 2, 0, x.own, 2, x.ref, x.got, x.n_log, "NCCL_P2P_DISABLE=1");
		moet_test_env("NCCL_P2P_DISABLE", NULL);
		moet_test_env("MOET_GPU_STREAM", "own");
		tp_case(x.dir, "cuda", 2, 0, x.own, 2, x.ref, x.got, x.n_log, "MOET_GPU_STREAM=own");
		moet_test_env("MOET_GPU_STREAM", NULL);
		moet_test_env("MOET_TP_ATTN", "rank0");
		tp_case(x.dir, "cuda", 2, 0, x.own, 2, x.ref, x.got, x.n_log, "MOET_TP_ATTN=rank0");
		moet_test_env("MOET_TP_ATTN", NULL);
		/* graphs asked for: a split pass runs directly */
		moet_test_env("MOET_CUDA_GRAPH", "1");
		moet_test_env("MOET_TP", "2");
		m = NULL;
		rc = moet_model_open_on(x.dir, "cuda", &m);
		moet_test_env("MOET_TP", NULL);
		CHECK(rc == 0, "MOET_CUDA_GRAPH=1: open: %s", moet_errmsg());
		for (int i = 0; !rc && i < 2; i++) {
			memset(x.got, 0xCD, x.n_log * sizeof(float));
			rc = moet_test_ragged_run(m, TP_SEQS, TP_STEPS, 1, x.got);
			CHECK(rc == 0 && !memcmp(x.got, x.ref, x.n_log * sizeof(float)),
			      "MOET_CUDA_GRAPH=1, run %d: logits differ (%s)", i,
			      rc ? moet_errmsg() : "bits");
		}
		moet_graph_stats gs;
		if (m) {
			moet_graph_stats_get(m, &gs, 0);
			CHECK(gs.captured == 0 && gs.replayed == 0, "MOET_CUDA_GRAPH=1 with MOET_TP=2: "
			      "%llu captured, %llu replayed (want none)",
			      (unsigned long long)gs.captured, (unsigned long long)gs.replayed);
		}
		moet_model_close(m);
		moet_test_env("MOET_CUDA_GRAPH", NULL);
	}
	/* tiny-tp: each rank computes its heads' q and kvb (the split at head boundaries) */
	tp_ctx y;
	if (!tp_prepare("gpu-tp-heads", MOET_GEN_TINY_TP, 45, &y)) {
		for (int absorbed = 0; absorbed < 2; absorbed++)
			if (!tp_reference(y.dir, absorbed, y.ref, y.n_log))
				tp_case_attn(y.dir, "cuda", 2, absorbed, y.own, 2, y.ref, y.got,
					     y.n_log, "tiny-tp", 2);
		tp_ctx_free(&y);
	}
	/* more ranks than devices */
	if (n_gpu + 1 <= 8) {
		char v[16], want[48];
		snprintf(v, sizeof(v), "%d", n_gpu + 1);
		snprintf(want, sizeof(want), "no CUDA device %d", n_gpu);
		moet_test_env("MOET_TP", v);
		m = NULL;
		rc = moet_model_open_on(x.dir, "cuda", &m);
		moet_test_env("MOET_TP", NULL);
		CHECK(rc != 0 && strstr(moet_errmsg(), want) && strstr(moet_errmsg(), "MOET_TP"),
		      "MOET_TP=%s on %d devices: rc %d (%s)", v, n_gpu, rc, moet_errmsg());
		moet_model_close(m);
	}
	tp_ctx_free(&x);
	return moet_test_done("test_gpu_tp");
}
