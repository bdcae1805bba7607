/*
 * test_serve_load.c: a bounded load test of `moet-hybrid serve` on the embedded demo: 16
 * concurrent streaming requests x 32 tokens (ignore_eos), each must end with
 * finish_reason "length" and `data: [DONE]`; zero errors; the tokens/s is printed. Then
 * /metrics must show every slot free and the generated-token counter grown by 16 x 32.
 */
#include <pthread.h>
#include <string.h>

#include "serve_test.h"

enum { STREAMS = 16, TOKENS = 32 };

static int PORT;

typedef struct job {
	int i, ok, events;
} job;

static void *run(void *arg)
{
	job *j = arg;
	char body[256];
	snprintf(body, sizeof(body), "{\"prompt\":\"Load test stream %d: tell me a story\","
		 "\"max_tokens\":%d,\"ignore_eos\":true,\"stream\":true,\"seed\":%d,"
		 "\"temperature\":0.7}", j->i, TOKENS, j->i);
	st_resp r;
	if (st_http(PORT, "POST", "/v1/completions", NULL, body, &r))
		return NULL;
	for (const char *p = r.body; (p = strstr(p, "data: ")); p += 6)
		j->events++;
	j->ok = r.status == 200 && strstr(r.body, "\"finish_reason\":\"length\"") &&
		strstr(r.body, "data: [DONE]\n\n");
	st_resp_free(&r);
	return NULL;
}

int main(void)
{
	char xdg[4096];
	snprintf(xdg, sizeof(xdg), "%s/serve-xdg", moet_test_tmp_dir());
	st_server sv;
	int rc = st_start(&sv, xdg, "--max-requests 32 --kv-tokens 4096");
	CHECK(rc == 0, "server did not start (log %s)", sv.log);
	if (rc)
		return moet_test_done("test_serve_load");
	PORT = sv.port;
	double gen0 = st_get_metric(PORT, "moet_generated_tokens_total");
	job jobs[STREAMS];
	pthread_t th[STREAMS];
	double t0 = st_now();
	for (int i = 0; i < STREAMS; i++) {
		jobs[i] = (job){ .i = i };
		pthread_create(&th[i], NULL, run, &jobs[i]);
	}
	int errors = 0;
	for (int i = 0; i < STREAMS; i++) {
		pthread_join(th[i], NULL);
		errors += !jobs[i].ok;
	}
	double dt = st_now() - t0;
	double gen = st_get_metric(PORT, "moet_generated_tokens_total") - gen0;
	printf("load: %d streams x %d tokens in %.2f s: %.0f tokens/s, %d errors\n", STREAMS,
	       TOKENS, dt, gen / dt, errors);
	CHECK(errors == 0, "%d streams failed", errors);
	CHECK(gen == STREAMS * TOKENS, "generated %g tokens, want %d", gen, STREAMS * TOKENS);
	CHECK(st_get_metric(PORT, "moet_kv_slots_in_use") == 0 &&
	      st_get_metric(PORT, "moet_requests_running") == 0, "slots still held");
	CHECK(dt < 60, "load test took %.1f s", dt);
	int st = st_stop(&sv);
	CHECK(st == 0, "server exit status %d (log %s)", st, sv.log);
	return moet_test_done("test_serve_load");
}
