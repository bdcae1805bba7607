/*
 * test_devgroup_switch.c: the MOET_GPU_DEVGROUP switch (runtime/devgroup.c) on every build:
 *   - moet_devgroup_switch: unset, empty and 0 give off, 1 on; any other value is MOET_EINVAL
 *     with a message naming the variable and the value, at every call; a value it accepts is
 *     kept until moet_devgroup_env_reset (a later change unseen before it, a bad one refused
 *     at the first call after it);
 *   - the engine refuses a bad value at its first MoE layer, naming it, on the CPU backend too
 *     (a typo is not silently today's path), and the failed pass leaves the caches as they
 *     were: the same run afterwards with the switch unset gives the reference's logits;
 *   - on the CPU backend MOET_GPU_DEVGROUP=1 changes nothing (no device: today's path; no
 *     device-grouped call counted), without and with a placement over simulated devices.
 * And MOET_GPU_STREAM (the CUDA backend's own stream, runtime/backend_cuda.c): legacy, own and
 * unset parse; anything else is refused naming it, by the parse and by opening a model on
 * --device cuda (before any device is looked for, so also here without a GPU).
 * And MOET_CUDA_GRAPH (runtime/graph.c): the parse, what =1 implies for the two switches above,
 * and the CPU backend (no capture: the same logits). The captures themselves are
 * tests/gpu/test_gpu_graph.c's.
 * The device path itself is tests/gpu/test_gpu_hybrid.c's (CUDA backend).
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_backend.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define SEQS 3
#define STEPS 2

static void switch_values(void)
{
	static const struct {
		const char *v;
		int rc, on;
	} cases[] = { { NULL, 0, 0 }, { "", 0, 0 }, { "0", 0, 0 }, { "1", 0, 1 },
		      { "2", MOET_EINVAL, 0 }, { "yes", MOET_EINVAL, 0 }, { "on", MOET_EINVAL, 0 },
		      { "10", MOET_EINVAL, 0 }, { " 1", MOET_EINVAL, 0 }, { "-1", MOET_EINVAL, 0 } };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		moet_test_env("MOET_GPU_DEVGROUP", cases[i].v);
		moet_devgroup_env_reset();
		int on = -1, rc = moet_devgroup_switch(&on);
		CHECK(rc == cases[i].rc, "MOET_GPU_DEVGROUP=%s: rc %d, want %d", cases[i].v ?
		      cases[i].v : "(unset)", rc, cases[i].rc);
		if (!rc) {
			CHECK(on == cases[i].on, "MOET_GPU_DEVGROUP=%s: on %d", cases[i].v ?
			      cases[i].v : "(unset)", on);
			continue;
		}
		char want[64];
		snprintf(want, sizeof(want), "MOET_GPU_DEVGROUP='%s'", cases[i].v);
		CHECK(strstr(moet_errmsg(), want) != NULL, "message '%s' does not name %s",
		      moet_errmsg(), want);
		/* a refused value is not kept: the next call refuses it again */
		rc = moet_devgroup_switch(&on);
		CHECK(rc == cases[i].rc && strstr(moet_errmsg(), want), "MOET_GPU_DEVGROUP=%s, "
		      "second call: rc %d (%s)", cases[i].v, rc, moet_errmsg());
	}
	/* read once and kept until the reset: a later change is not seen before it */
	setenv("MOET_GPU_DEVGROUP", "1", 1);
	moet_devgroup_env_reset();
	int on = -1, rc = moet_devgroup_switch(&on);
	CHECK(rc == 0 && on == 1, "MOET_GPU_DEVGROUP=1: rc %d on %d", rc, on);
	setenv("MOET_GPU_DEVGROUP", "0", 1);
	rc = moet_devgroup_switch(&on);
	CHECK(rc == 0 && on == 1, "=1 kept: rc %d on %d", rc, on);
	setenv("MOET_GPU_DEVGROUP", "bogus", 1);
	rc = moet_devgroup_switch(&on);
	CHECK(rc == 0 && on == 1, "=1 kept over a bad value until the reset: rc %d on %d", rc, on);
	moet_devgroup_env_reset();
	rc = moet_devgroup_switch(&on);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "MOET_GPU_DEVGROUP='bogus'"),
	      "=bogus after the reset: rc %d (%s)", rc, moet_errmsg());
	unsetenv("MOET_GPU_DEVGROUP");
	moet_devgroup_env_reset();
	rc = moet_devgroup_switch(&on);
	CHECK(rc == 0 && on == 0, "unset after the reset: rc %d on %d", rc, on);
}

static void stream_values(const char *dir)
{
	static const struct {
		const char *v;
		int rc, own;
	} cases[] = { { NULL, 0, 0 }, { "", 0, 0 }, { "legacy", 0, 0 }, { "own", 0, 1 },
		      { "Own", MOET_EINVAL, 0 }, { "1", MOET_EINVAL, 0 }, { "own ", MOET_EINVAL, 0 } };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		moet_test_env("MOET_GPU_STREAM", cases[i].v);
		int own = -1, rc = moet_backend_cuda_stream_switch(&own);
		CHECK(rc == cases[i].rc && (rc || own == cases[i].own), "MOET_GPU_STREAM=%s: rc %d "
		      "own %d", cases[i].v ? cases[i].v : "(unset)", rc, own);
		if (rc)
			CHECK(strstr(moet_errmsg(), "MOET_GPU_STREAM='") && strstr(moet_errmsg(),
			      cases[i].v), "message names it: %s", moet_errmsg());
	}
	setenv("MOET_GPU_STREAM", "sideways", 1);
	moet_model *m = NULL;
	int rc = moet_model_open_on(dir, "cuda", &m);
	CHECK(rc == MOET_EINVAL && !m && strstr(moet_errmsg(), "MOET_GPU_STREAM='sideways'"),
	      "open on cuda with a bad MOET_GPU_STREAM: rc %d (%s)", rc, moet_errmsg());
	moet_model_close(m);
	unsetenv("MOET_GPU_STREAM");
}

/* MOET_CUDA_GRAPH: 0/1/unset parse, anything else refused naming it; =1 turns the own stream
 * and the device grouping on where they are unset and refuses them explicitly off; on the CPU
 * backend (no capture) =1 leaves the logits as they are and a bad value fails the pass. */
static void graph_values(moet_model *m, const float *ref, float *got, size_t n_log)
{
	static const char *const bad[] = { "2", "yes", "on", " 1" };
	int on = -1;
	unsetenv("MOET_CUDA_GRAPH");
	CHECK(moet_graph_switch(&on) == 0 && on == 0, "MOET_CUDA_GRAPH unset: off");
	setenv("MOET_CUDA_GRAPH", "1", 1);
	CHECK(moet_graph_switch(&on) == 0 && on == 1, "MOET_CUDA_GRAPH=1: on");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("MOET_CUDA_GRAPH", bad[i], 1);
		char want[64];
		snprintf(want, sizeof(want), "MOET_CUDA_GRAPH='%s'", bad[i]);
		CHECK(moet_graph_switch(&on) == MOET_EINVAL && strstr(moet_errmsg(), want),
		      "MOET_CUDA_GRAPH=%s refused naming it: %s", bad[i], moet_errmsg());
	}
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, got) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "MOET_CUDA_GRAPH"), "a pass with a bad MOET_CUDA_GRAPH: %s",
	      moet_errmsg());
	setenv("MOET_CUDA_GRAPH", "1", 1);
	int own = -1, rc = moet_backend_cuda_stream_switch(&own);
	CHECK(rc == 0 && own == 1, "MOET_CUDA_GRAPH=1, MOET_GPU_STREAM unset: own (rc %d own %d)",
	      rc, own);
	setenv("MOET_GPU_STREAM", "legacy", 1);
	rc = moet_backend_cuda_stream_switch(&own);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "MOET_GPU_STREAM=own"),
	      "MOET_CUDA_GRAPH=1 with MOET_GPU_STREAM=legacy refused: %s", moet_errmsg());
	unsetenv("MOET_GPU_STREAM");
	moet_devgroup_env_reset();
	rc = moet_devgroup_switch(&on);
	CHECK(rc == 0 && on == 1, "MOET_CUDA_GRAPH=1, MOET_GPU_DEVGROUP unset: on (rc %d)", rc);
	setenv("MOET_GPU_DEVGROUP", "0", 1);
	moet_devgroup_env_reset();
	rc = moet_devgroup_switch(&on);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "MOET_GPU_DEVGROUP=1"),
	      "MOET_CUDA_GRAPH=1 with MOET_GPU_DEVGROUP=0 refused: %s", moet_errmsg());
	unsetenv("MOET_GPU_DEVGROUP");
	moet_devgroup_env_reset();
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, got) == 0 &&
	      memcmp(ref, got, n_log * sizeof(float)) == 0,
	      "MOET_CUDA_GRAPH=1 on the CPU backend: the reference's logits (%s)", moet_errmsg());
	moet_graph_stats st;
	moet_graph_stats_get(m, &st, 1);
	CHECK(st.captured == 0 && st.replayed == 0, "the CPU backend captures nothing");
	unsetenv("MOET_CUDA_GRAPH");
	moet_devgroup_env_reset();
}

int main(void)
{
	switch_values();
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 23;
	gp.n_layers = 3;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("devgroup-switch", &gp, &dir);
	if (!m) {
		free(dir);
		return moet_test_done("test_devgroup_switch");
	}
	const moet_config *c = moet_model_config(m);
	const int64_t V = c->vocab_size, LE = c->num_hidden_layers * c->n_routed_experts;
	const size_t n_log = (size_t)(SEQS * (STEPS + 1) * V);
	float *ref = malloc(n_log * sizeof(float)), *got = malloc(n_log * sizeof(float));
	int16_t *own = malloc((size_t)LE * sizeof(*own));
	CHECK(ref && got && own, "host memory");
	if (!ref || !got || !own)
		goto out;
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, ref) == 0, "reference: %s", moet_errmsg());
	stream_values(dir);
	graph_values(m, ref, got, n_log);

	/* a bad value: refused at the first MoE layer after the reset, naming it (the reference
	 * run above read and kept "unset") */
	setenv("MOET_GPU_DEVGROUP", "yes", 1);
	moet_devgroup_env_reset();
	int rc = moet_test_ragged_run(m, SEQS, STEPS, 1, got);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "MOET_GPU_DEVGROUP='yes'"),
	      "MOET_GPU_DEVGROUP=yes: rc %d (%s)", rc, moet_errmsg());
	unsetenv("MOET_GPU_DEVGROUP");
	moet_devgroup_env_reset();
	memset(got, 0xCD, n_log * sizeof(float));
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, got) == 0 &&
	      memcmp(ref, got, n_log * sizeof(float)) == 0, "after the refused value: %s",
	      moet_errmsg());

	/* =1 on the CPU backend: today's path, the same bits, nothing counted */
	for (int pl = 0; pl < 2; pl++) {
		for (int64_t i = 0; i < LE; i++)
			own[i] = (int16_t)(i % 3 == 0 ? -1 : i % 2);
		CHECK(moet_model_set_placement(m, pl ? own : NULL, pl ? 2 : 0) == 0, "placement: %s",
		      moet_errmsg());
		for (int batched = 0; batched < 2; batched++) {
			setenv("MOET_GPU_DEVGROUP", "1", 1);
			moet_devgroup_env_reset();
			memset(got, 0xCD, n_log * sizeof(float));
			CHECK(moet_test_ragged_run(m, SEQS, STEPS, batched, got) == 0,
			      "=1 (placement %d): %s", pl, moet_errmsg());
			unsetenv("MOET_GPU_DEVGROUP");
			moet_devgroup_env_reset();
			CHECK(memcmp(ref, got, n_log * sizeof(float)) == 0,
			      "=1 on the CPU backend (placement %d, batched %d): logits differ", pl,
			      batched);
		}
		moet_hybrid_stats hs;
		moet_model_hybrid_stats(m, &hs, 1);
		CHECK(hs.devgroup_calls == 0, "CPU backend: %llu device-grouped calls",
		      (unsigned long long)hs.devgroup_calls);
	}
out:
	moet_model_close(m);
	free(ref);
	free(got);
	free(own);
	free(dir);
	return moet_test_done("test_devgroup_switch");
}
