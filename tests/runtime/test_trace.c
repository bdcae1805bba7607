/*
 * test_trace.c: the timeline of MOET_TRACE (runtime/trace.c, backend_trace.c) on the CPU
 * backend with a placement over a simulated device and the CPU tier:
 *   - the traced model's logits equal the untraced one's, bit for bit (two micro-batches on the
 *     CPU backend's two-stream test double, and one pass);
 *   - the file is JSON of Chrome trace events (jansson reads it back): one pass span per
 *     forward call; op spans on the pass's stream and on both micro-batch streams, CPU-tier
 *     spans, the driver's waits; every span's start and duration >= 0 and every op span inside
 *     a pass span (the CPU backend's points are the clock's readings around each op);
 *   - MOET_TRACE_MAX caps the spans written; a second model with the same FILE writes FILE.1;
 *   - refused, naming the problem: a file that cannot be created, MOET_TRACE_MAX not a count,
 *     MOET_TRACE with MOET_OP_TIMES=1; a model without MOET_TRACE has nothing to end.
 */
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define SEQS 3
#define STEPS 3

static size_t run(moet_model *m, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, out) == 0, "run: %s", moet_errmsg());
	return (size_t)((STEPS + 1) * SEQS * V);
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 9;
	char *dir = NULL;
	moet_model *ref_m = moet_test_gen_open("trace", &gp, &dir);
	if (!ref_m)
		return moet_test_done("test_trace");
	char *tmp = moet_test_mkdtemp("trace-out");
	char path[4000], path1[4096];
	snprintf(path, sizeof(path), "%s/t.json", tmp);
	snprintf(path1, sizeof(path1), "%s/t.json.1", tmp);
	const moet_config *c = moet_model_config(ref_m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n_log = (size_t)((STEPS + 1) * SEQS * V);
	float *ref = malloc(n_log * sizeof(float)), *got = malloc(n_log * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	for (int64_t i = 0; i < L * E; i++) /* half on the simulated device, half on the CPU tier */
		own[i] = (int16_t)(i % 2 ? 0 : -1);
	CHECK(moet_model_trace_end(ref_m) == 0, "no trace: nothing to end");
	CHECK(moet_model_set_placement(ref_m, own, 1) == 0, "placement: %s", moet_errmsg());

	for (int form = 0; form < 2; form++) { /* two micro-batches, then one pass */
		setenv("MOET_MICROBATCH", form ? "0" : "1", 1);
		run(ref_m, ref);
		setenv("MOET_TRACE", path, 1);
		moet_model *m = NULL;
		CHECK(moet_model_open(dir, &m) == 0, "traced open: %s", moet_errmsg());
		unsetenv("MOET_TRACE");
		CHECK(m && moet_model_set_placement(m, own, 1) == 0, "traced placement: %s",
		      moet_errmsg());
		memset(got, 0xAB, n_log * sizeof(float));
		if (m)
			run(m, got);
		CHECK(memcmp(ref, got, n_log * sizeof(float)) == 0, "form %d: traced logits differ "
		      "from the untraced model's", form);
		CHECK(moet_model_trace_end(m) == 0, "trace end: %s", moet_errmsg());
		moet_model_close(m);
		unsetenv("MOET_MICROBATCH");
		moet_test_trace_counts k; /* the second model with the same FILE wrote FILE.1 */
		if (moet_test_trace_read(form ? path1 : path, &k))
			continue;
		/* the prefill and STEPS decode steps, each one call */
		CHECK(k.passes == STEPS + 1, "form %d: %lld pass spans, want %d", form,
		      (long long)k.passes, STEPS + 1);
		CHECK(k.bad == 0 && k.outside == 0, "form %d: %lld bad spans, %lld ops outside every "
		      "pass", form, (long long)k.bad, (long long)k.outside);
		CHECK(k.ops[0] > 0 && (form ? k.ops[1] == 0 && k.ops[2] == 0
					    : k.ops[1] > 0 && k.ops[2] > 0),
		      "form %d: op spans on the streams %lld / %lld / %lld", form,
		      (long long)k.ops[0], (long long)k.ops[1], (long long)k.ops[2]);
		CHECK(k.cpu > 0 && k.waits > 0, "form %d: %lld CPU-tier spans, %lld waits", form,
		      (long long)k.cpu, (long long)k.waits);
		printf("form %d: %lld spans (%lld passes, ops %lld / %lld / %lld, CPU tier %lld, "
		       "waits %lld): logits equal the untraced run\n", form, (long long)k.spans,
		       (long long)k.passes, (long long)k.ops[0], (long long)k.ops[1],
		       (long long)k.ops[2], (long long)k.cpu, (long long)k.waits);
		/* the text summary of a trace (tests/gpu/trace_table.py) finds the passes and lanes */
		char cmd[8400], *text = NULL;
		snprintf(cmd, sizeof(cmd), "python3 %s/tests/gpu/trace_table.py %s 2",
			 moet_test_source_dir(), form ? path1 : path);
		if (system("command -v python3 >/dev/null 2>&1")) {
			printf("trace_table.py: skipped (no python3)\n");
		} else {
			const char *want = form ? "decode 3 rows, one pass:"
						: "decode 3 rows, two micro-batches:";
			CHECK(moet_test_run(cmd, &text) == 0 && text && strstr(text, want) &&
			      strstr(text, form ? "gpu pass stream" : "gpu stream 1") &&
			      strstr(text, "cpu tier busy") && strstr(text, "neither") &&
			      strstr(text, "while the CPU tier ran no call"),
			      "trace_table.py on form %d: %s", form,
			      text ? text : "(no output)");
		}
		free(text);
		if (form == 0) { /* the first model wrote FILE alone */
			FILE *f = fopen(path1, "r");
			CHECK(f == NULL, "%s before the second traced open", path1);
			if (f)
				fclose(f);
		}
	}

	/* a cap on the spans */
	setenv("MOET_TRACE", path, 1);
	setenv("MOET_TRACE_MAX", "7", 1);
	moet_model *m = NULL;
	CHECK(moet_model_open(dir, &m) == 0, "capped open: %s", moet_errmsg());
	unsetenv("MOET_TRACE_MAX");
	unsetenv("MOET_TRACE");
	if (m)
		run(m, got);
	CHECK(moet_model_trace_end(m) == 0, "capped end: %s", moet_errmsg());
	moet_model_close(m);
	char capped[4100];
	snprintf(capped, sizeof(capped), "%s.2", path);
	moet_test_trace_counts k;
	if (!moet_test_trace_read(capped, &k))
		CHECK(k.spans == 7, "MOET_TRACE_MAX=7: %lld spans written", (long long)k.spans);

	/* refusals, each naming its cause */
	struct {
		const char *trace, *max, *op_times, *want;
	} bad[] = {
		{ "/nonexistent-dir/t.json", NULL, NULL, "/nonexistent-dir/t.json" },
		{ path, "many", NULL, "MOET_TRACE_MAX" },
		{ path, "-1", NULL, "MOET_TRACE_MAX" },
		{ path, NULL, "1", "MOET_OP_TIMES" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("MOET_TRACE", bad[i].trace, 1);
		if (bad[i].max)
			setenv("MOET_TRACE_MAX", bad[i].max, 1);
		if (bad[i].op_times)
			setenv("MOET_OP_TIMES", bad[i].op_times, 1);
		m = NULL;
		int rc = moet_model_open(dir, &m);
		CHECK(rc != 0 && m == NULL && strstr(moet_errmsg(), bad[i].want), "refusal %zu: rc "
		      "%d, '%s' (want it to name %s)", i, rc, moet_errmsg(), bad[i].want);
		moet_model_close(m);
		unsetenv("MOET_TRACE");
		unsetenv("MOET_TRACE_MAX");
		unsetenv("MOET_OP_TIMES");
	}
	moet_model_close(ref_m);
	free(ref);
	free(got);
	free(own);
	free(tmp);
	free(dir);
	return moet_test_done("test_trace");
}
