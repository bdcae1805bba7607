/*
 * test_serve.c: `moet-hybrid serve` over real HTTP on loopback, on the embedded demo
 * (made on first use under the test's own XDG_CACHE_HOME).
 *
 *   - /health, /v1/models (says synthetic, untrained), /metrics (Prometheus names);
 *   - a greedy completion's token ids (return_tokens_as_token_ids) equal `moet-hybrid
 *     generate` on the same checkpoint and prompt, and its text equals the tokenizer's decode
 *     of those ids; the same request streamed gives the same text, well-formed SSE chunks,
 *     a finish_reason and `data: [DONE]`;
 *   - chat, streamed and not: the same text, the role chunk first, usage chunk on request;
 *   - a seeded sampled request twice: identical;
 *   - 6 concurrent streams equal their sequential answers;
 *   - every error case with its status and OpenAI-style body: 400 (JSON, types, ranges,
 *     fields), 401, 404 (model, path), 405, 413 (body, prompt), 429;
 *   - a client that hangs up mid-stream: its slot is freed (/metrics), the server serves on;
 *   - SIGTERM stops the server with exit 0 (under ASan: no leak);
 *   - --placement over 3 simulated devices: the same greedy ids, pairs per tier and the GPU
 *     hit rate in /metrics add up; --shadow 1 checks CPU-tier calls with no mismatch.
 */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "moet_tokenizer.h"
#include "serve_test.h"

static int PORT;
static char XDG[4096], DEMO[4200];

/* The text and token ids of a response: whole (non-streamed) or SSE (streamed). */
typedef struct answer {
	int status;
	char text[16384];
	size_t n_text;
	long long ids[1024];
	int n_ids;
	char finish[32];
	int n_events, done, role_first, bad_events;
	long long usage_completion;
} answer;

static void add_ids(answer *a, const json_t *lp, int chat)
{
	if (!json_is_object(lp))
		return;
	const json_t *toks = chat ? json_object_get(lp, "content") : json_object_get(lp, "tokens");
	for (size_t i = 0; i < json_array_size(toks) && a->n_ids < 1024; i++) {
		const json_t *t = json_array_get(toks, i);
		const char *s = json_string_value(chat ? json_object_get(t, "token") : t);
		if (s && !strncmp(s, "token_id:", 9))
			a->ids[a->n_ids++] = atoll(s + 9);
	}
}

static void add_text(answer *a, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	if (n && a->n_text + n < sizeof(a->text)) {
		memcpy(a->text + a->n_text, s, n);
		a->n_text += n;
		a->text[a->n_text] = 0;
	}
}

static void take_choice(answer *a, const json_t *ch, int chat, int stream)
{
	const json_t *msg = json_object_get(ch, chat ? (stream ? "delta" : "message") : NULL);
	add_text(a, json_string_value(chat ? json_object_get(msg, "content")
					   : json_object_get(ch, "text")));
	add_ids(a, json_object_get(ch, "logprobs"), chat);
	const char *f = json_string_value(json_object_get(ch, "finish_reason"));
	if (f)
		snprintf(a->finish, sizeof(a->finish), "%s", f);
}

static int ask(const char *path, const char *body, answer *a)
{
	memset(a, 0, sizeof(*a));
	int chat = strstr(path, "chat") != NULL;
	st_resp r;
	if (st_http(PORT, "POST", path, ST_AUTH, body, &r))
		return -1;
	a->status = r.status;
	if (strstr(r.head, "text/event-stream")) {
		char *p = r.body;
		while (p && *p) {
			char *end = strstr(p, "\n\n");
			if (end)
				*end = 0;
			a->n_events++;
			if (strncmp(p, "data: ", 6))
				a->bad_events++;
			else if (!strcmp(p + 6, "[DONE]"))
				a->done = 1;
			else {
				json_t *j = json_loads(p + 6, 0, NULL);
				const json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
				if (!j || a->done)
					a->bad_events++;
				if (a->n_events == 1 && chat)
					a->role_first = json_object_get(json_object_get(ch, "delta"),
									"role") != NULL;
				if (ch)
					take_choice(a, ch, chat, 1);
				const json_t *u = json_object_get(j, "usage");
				if (json_is_object(u))
					a->usage_completion = json_integer_value(
						json_object_get(u, "completion_tokens"));
				json_decref(j);
			}
			p = end ? end + 2 : NULL;
		}
	} else {
		json_t *j = json_loads(r.body, 0, NULL);
		const json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
		if (ch)
			take_choice(a, ch, chat, 0);
		a->usage_completion = json_integer_value(
			json_object_get(json_object_get(j, "usage"), "completion_tokens"));
		json_decref(j);
	}
	st_resp_free(&r);
	return 0;
}

/* An error response: status and the body's error.message / param / type. */
static void expect_error(const char *method, const char *path, const char *extra,
			 const char *body, int want_status, const char *want_in_message,
			 const char *want_param)
{
	st_resp r;
	CHECK(st_http(PORT, method, path, extra, body, &r) == 0, "%s %s: no answer", method, path);
	CHECK(r.status == want_status, "%s %s %.60s: status %d, want %d (%s)", method, path,
	      body ? body : "", r.status, want_status, r.body ? r.body : "");
	json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
	const json_t *e = json_object_get(j, "error");
	const char *msg = json_string_value(json_object_get(e, "message"));
	CHECK(msg && json_string_value(json_object_get(e, "type")) && json_object_get(e, "code"),
	      "%s %s: not an OpenAI error body: %s", method, path, r.body ? r.body : "");
	CHECK(msg && strstr(msg, want_in_message), "%s %s: message '%s' lacks '%s'", method,
	      path, msg ? msg : "", want_in_message);
	if (want_param)
		CHECK(!strcmp(json_string_value(json_object_get(e, "param")) ?
			      json_string_value(json_object_get(e, "param")) : "", want_param),
		      "%s %s: param is not '%s': %s", method, path, want_param, r.body);
	json_decref(j);
	st_resp_free(&r);
}

static void test_info(void)
{
	st_resp r;
	CHECK(st_http(PORT, "GET", "/health", NULL, NULL, &r) == 0 && r.status == 200 &&
	      strstr(r.body, "ok"), "/health");
	st_resp_free(&r);
	CHECK(st_http(PORT, "GET", "/v1/models", ST_AUTH, NULL, &r) == 0 && r.status == 200 &&
	      strstr(r.body, "\"moet-demo-tiny\"") && strstr(r.body, "synthetic") &&
	      strstr(r.body, "untrained"), "/v1/models: %s", r.body ? r.body : "");
	st_resp_free(&r);
	CHECK(st_http(PORT, "GET", "/metrics", NULL, NULL, &r) == 0 && r.status == 200, "metrics");
	const char *names[] = { "moet_tokens_per_second", "moet_queue_depth",
				"moet_batch_sequences", "moet_gpu_hit_rate", "moet_kv_slots_in_use",
				"moet_requests_running" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		CHECK(st_metric(r.body, names[i]) >= 0, "metric %s missing", names[i]);
	CHECK(strstr(r.body, "moet_expert_pairs_total{tier=\"cpu\"}") &&
	      strstr(r.body, "moet_pcie_bytes_total{direction=\"d2h\"}") &&
	      strstr(r.body, "# TYPE moet_generated_tokens_total counter"), "metric families");
	st_resp_free(&r);
}

static void test_greedy_equals_generate(void)
{
	const char *ids = "0,50,60,70,80,90";
	answer a, s;
	char body[512];
	snprintf(body, sizeof(body), "{\"model\":\"moet-demo-tiny\",\"prompt\":[%s],"
		 "\"max_tokens\":12,\"temperature\":0,\"logprobs\":0,"
		 "\"return_tokens_as_token_ids\":true}", ids);
	CHECK(ask("/v1/completions", body, &a) == 0 && a.status == 200, "greedy: %d", a.status);
	char *out = NULL;
	int rc = moet_test_cli(&out, "generate --model '%s' --tokens %s --max-new 12", DEMO, ids);
	CHECK(rc == 0 && out, "generate: %s", out ? out : "");
	long long want[64];
	int n_want = 0;
	for (char *p = out; p && *p && n_want < 64;) {
		char *end;
		long long v = strtoll(p, &end, 10);
		if (end == p)
			break;
		want[n_want++] = v;
		p = *end == ',' ? end + 1 : end;
	}
	free(out);
	CHECK(a.n_ids == n_want && n_want > 0, "server %d ids, generate %d", a.n_ids, n_want);
	for (int i = 0; i < a.n_ids && i < n_want; i++)
		CHECK(a.ids[i] == want[i], "token %d: server %lld, generate %lld", i, a.ids[i],
		      want[i]);
	CHECK(!strcmp(a.finish, n_want < 12 ? "stop" : "length"), "finish %s", a.finish);
	/* the text is the tokenizer's decode of those ids (specials skipped) */
	char path[4300];
	snprintf(path, sizeof(path), "%s/tokenizer.json", DEMO);
	moet_tokenizer *tok = NULL;
	CHECK(moet_tokenizer_load(path, &tok) == 0, "tokenizer");
	int32_t ids32[64];
	for (int i = 0; i < n_want; i++)
		ids32[i] = (int32_t)want[i];
	char *txt = NULL;
	size_t nt = 0;
	if (tok && moet_tokenizer_decode(tok, ids32, (size_t)n_want, 1, &txt, &nt) == 0 &&
	    moet_utf8_valid_prefix(txt, nt) == nt)
		CHECK(nt == a.n_text && !memcmp(txt, a.text, nt), "text is not the decode: '%s' "
		      "vs '%s'", a.text, txt);
	free(txt);
	moet_tokenizer_destroy(tok);
	/* streamed: same tokens and text, well-formed */
	snprintf(body, sizeof(body), "{\"prompt\":[%s],\"max_tokens\":12,\"temperature\":0,"
		 "\"stream\":true,\"logprobs\":1,\"return_tokens_as_token_ids\":true}", ids);
	CHECK(ask("/v1/completions", body, &s) == 0 && s.status == 200, "stream %d", s.status);
	CHECK(s.done && !s.bad_events && s.n_events >= 3, "SSE: done %d bad %d events %d",
	      s.done, s.bad_events, s.n_events);
	CHECK(s.n_text == a.n_text && !memcmp(s.text, a.text, a.n_text), "stream text differs");
	CHECK(s.n_ids == a.n_ids && !memcmp(s.ids, a.ids, sizeof(long long) * (size_t)a.n_ids),
	      "stream ids differ");
	CHECK(!strcmp(s.finish, a.finish), "stream finish %s vs %s", s.finish, a.finish);
}

static void test_chat_and_seed(void)
{
	const char *msgs = "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
			   "{\"role\":\"user\",\"content\":\"Tell me a story.\"}]";
	char body[1024];
	answer a, s, b;
	snprintf(body, sizeof(body), "{%s,\"max_tokens\":10,\"temperature\":0}", msgs);
	CHECK(ask("/v1/chat/completions", body, &a) == 0 && a.status == 200, "chat %d", a.status);
	snprintf(body, sizeof(body), "{%s,\"max_tokens\":10,\"temperature\":0,\"stream\":true,"
		 "\"stream_options\":{\"include_usage\":true}}", msgs);
	CHECK(ask("/v1/chat/completions", body, &s) == 0 && s.status == 200, "chat stream");
	CHECK(s.role_first && s.done && !s.bad_events, "chat SSE: role %d done %d bad %d",
	      s.role_first, s.done, s.bad_events);
	CHECK(s.n_text == a.n_text && !memcmp(s.text, a.text, a.n_text), "chat stream text");
	CHECK(s.usage_completion == a.usage_completion && a.usage_completion > 0,
	      "usage %lld vs %lld", s.usage_completion, a.usage_completion);
	snprintf(body, sizeof(body), "{%s,\"max_tokens\":16,\"temperature\":0.9,\"top_p\":0.9,"
		 "\"top_k\":40,\"seed\":1234,\"logprobs\":true,\"top_logprobs\":2,"
		 "\"return_tokens_as_token_ids\":true}", msgs);
	CHECK(ask("/v1/chat/completions", body, &a) == 0 && a.status == 200, "seeded 1");
	CHECK(ask("/v1/chat/completions", body, &b) == 0 && b.status == 200, "seeded 2");
	CHECK(a.n_ids > 0 && a.n_ids == b.n_ids &&
	      !memcmp(a.ids, b.ids, sizeof(long long) * (size_t)a.n_ids) &&
	      a.n_text == b.n_text && !memcmp(a.text, b.text, a.n_text),
	      "seeded requests differ");
}

typedef struct job {
	char body[512];
	answer a;
} job;

static void *run_job(void *arg)
{
	job *j = arg;
	ask("/v1/completions", j->body, &j->a);
	return NULL;
}

static void test_concurrent(void)
{
	enum { N = 6 };
	static job jobs[N];
	static answer solo[N];
	for (int i = 0; i < N; i++) {
		snprintf(jobs[i].body, sizeof(jobs[i].body),
			 "{\"prompt\":\"Request %d: the robot painted\",\"max_tokens\":%d,"
			 "\"temperature\":%s,\"seed\":%d,\"stream\":%s,\"ignore_eos\":true}", i,
			 8 + 3 * i, i % 2 ? "0.8" : "0", i, i % 3 ? "true" : "false");
		CHECK(ask("/v1/completions", jobs[i].body, &solo[i]) == 0, "solo %d", i);
	}
	pthread_t th[N];
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, run_job, &jobs[i]);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < N; i++) {
		CHECK(jobs[i].a.status == 200 && !strcmp(jobs[i].a.finish, "length"),
		      "concurrent %d: %d %s", i, jobs[i].a.status, jobs[i].a.finish);
		CHECK(jobs[i].a.n_text == solo[i].n_text &&
		      !memcmp(jobs[i].a.text, solo[i].text, solo[i].n_text),
		      "concurrent %d: text differs from its sequential answer", i);
	}
}

static void test_errors(void)
{
	const char *c = "/v1/completions", *ch = "/v1/chat/completions";
	expect_error("POST", c, ST_AUTH, "{\"prompt\": [1, 2", 400, "not valid JSON", NULL);
	expect_error("POST", c, ST_AUTH, "[1, 2]", 400, "JSON object", NULL);
	expect_error("POST", c, ST_AUTH, "{\"max_tokens\": 4}", 400, "'prompt' is required",
		     "prompt");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"max_tokens\": \"4\"}", 400,
		     "'max_tokens' must be an integer", "max_tokens");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"max_tokens\": 0}", 400,
		     "'max_tokens'", "max_tokens");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"temperature\": 3}", 400,
		     "'temperature'", "temperature");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"top_p\": 0}", 400, "'top_p'",
		     "top_p");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"stream\": 1}", 400,
		     "'stream' must be a boolean", "stream");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"stop\": [1]}", 400, "'stop[0]'",
		     "stop");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"stop\": [\"a\",\"b\",\"c\",\"d\","
		     "\"e\"]}", 400, "at most 4", "stop");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": [1, 99999]}", 400, "'prompt[1]'",
		     "prompt");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": [\"a\", \"b\"]}", 400, "one prompt",
		     "prompt");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"n\": 2}", 400, "'n'", "n");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"logprobs\": 50}", 400,
		     "'logprobs'", "logprobs");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"model\": 7}", 400,
		     "'model' must be a string", "model");
	expect_error("POST", c, ST_AUTH, "{\"prompt\": \"a\", \"model\": \"gpt-4o\"}", 404,
		     "does not exist", "model");
	expect_error("POST", ch, ST_AUTH, "{\"prompt\": \"a\"}", 400, "'messages' is required",
		     "messages");
	expect_error("POST", ch, ST_AUTH, "{\"messages\": [{\"role\": \"wizard\", \"content\": "
		     "\"x\"}]}", 400, "wizard", "messages");
	expect_error("POST", ch, ST_AUTH, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
		     400, "messages[0].content", "messages[0].content");
	expect_error("POST", ch, ST_AUTH, "{\"messages\": [{\"role\": \"user\", \"content\": \"x"
		     "\"}], \"top_logprobs\": 3}", 400, "needs 'logprobs'", "top_logprobs");
	/* context: 4096 positions (the demo's max_position_embeddings) */
	expect_error("POST", c, ST_AUTH, "{\"prompt\": [1, 2, 3], \"max_tokens\": 5000}", 400,
		     "context", "max_tokens");
	/* prompt limit 200 tokens: 413 */
	char big[4096];
	int k = snprintf(big, sizeof(big), "{\"prompt\": [");
	for (int i = 0; i < 250; i++)
		k += snprintf(big + k, sizeof(big) - (size_t)k, "%s%d", i ? "," : "", 5 + i);
	snprintf(big + k, sizeof(big) - (size_t)k, "]}");
	expect_error("POST", c, ST_AUTH, big, 413, "250 tokens", "prompt");
	/* body limit 65536 bytes: 413 */
	size_t nb = 100000;
	char *huge = malloc(nb + 64);
	snprintf(huge, nb + 64, "{\"prompt\": \"%0*d\"}", (int)nb, 0);
	expect_error("POST", c, ST_AUTH, huge, 413, "larger than the limit", NULL);
	free(huge);
	/* auth */
	expect_error("POST", c, NULL, "{\"prompt\": \"a\"}", 401, "API key", NULL);
	expect_error("GET", "/v1/models", "Authorization: Bearer wrong\r\n", NULL, 401, "API key",
		     NULL);
	/* paths and methods */
	expect_error("GET", "/v2/nothing", ST_AUTH, NULL, 404, "no such endpoint", NULL);
	expect_error("GET", c, ST_AUTH, NULL, 405, "not allowed", NULL);
}

/* Opens a stream and reads its response headers; returns the socket (or -1). */
static int open_stream(int max_tokens)
{
	char body[256];
	snprintf(body, sizeof(body), "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d,"
		 "\"ignore_eos\":true,\"stream\":true}", max_tokens);
	int fd = st_connect(PORT);
	if (fd < 0 || st_send(fd, "POST", "/v1/completions", ST_AUTH, body, strlen(body))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	char buf[8192];
	size_t n = 0;
	while (n < sizeof(buf) - 1) {
		ssize_t k = recv(fd, buf + n, sizeof(buf) - 1 - n, 0);
		if (k <= 0)
			break;
		n += (size_t)k;
		buf[n] = 0;
		if (strstr(buf, "\r\n\r\n"))
			return fd;
	}
	close(fd);
	return -1;
}

static int wait_metric(const char *name, double want, double timeout_s)
{
	double t0 = st_now();
	while (st_now() - t0 < timeout_s) {
		if (st_get_metric(PORT, name) == want)
			return 1;
		usleep(20000);
	}
	return 0;
}

static void test_disconnect_and_429(void)
{
	/* the server has --max-requests 8: 8 long streams fill it, the 9th gets 429 */
	int fds[8];
	int n_open = 0;
	for (int i = 0; i < 8; i++)
		if ((fds[i] = open_stream(2000)) >= 0)
			n_open++;
	CHECK(n_open == 8, "opened %d of 8 streams", n_open);
	expect_error("POST", "/v1/completions", ST_AUTH, "{\"prompt\": \"a\"}", 429, "busy",
		     NULL);
	double cancelled0 = -1;
	{
		st_resp r;
		if (!st_http(PORT, "GET", "/metrics", NULL, NULL, &r)) {
			cancelled0 = st_metric(r.body, "moet_requests_total{result=\"cancelled\"}");
			st_resp_free(&r);
		}
	}
	for (int i = 0; i < 8; i++)
		if (fds[i] >= 0)
			close(fds[i]); /* hang up mid-stream */
	/* NOTE: on a loaded machine some of the 8 may still be queued at the hang-up (running 0
	 * then says nothing): each is cancelled when it starts, so wait for the queue too */
	CHECK(wait_metric("moet_queue_depth", 0, 20), "queue not empty after hang-up");
	CHECK(wait_metric("moet_requests_running", 0, 20), "requests still running after hang-up");
	CHECK(wait_metric("moet_kv_slots_in_use", 0, 5), "KV slots leaked");
	CHECK(st_get_metric(PORT, "moet_queue_depth") == 0, "queue not empty");
	st_resp r = { 0 };
	double cancelled = -1;
	for (double t0 = st_now(); st_now() - t0 < 20; usleep(20000)) {
		st_resp_free(&r);
		if (st_http(PORT, "GET", "/metrics", NULL, NULL, &r))
			continue;
		cancelled = st_metric(r.body, "moet_requests_total{result=\"cancelled\"}");
		if (cancelled - cancelled0 == 8)
			break;
	}
	CHECK(r.body != NULL, "metrics");
	CHECK(cancelled - cancelled0 == 8, "cancelled %g -> %g", cancelled0, cancelled);
	CHECK(st_metric(r.body, "moet_kv_tokens_reserved") == 0, "KV still reserved");
	CHECK(st_metric(r.body, "moet_kv_blocks{state=\"used\"}") == 0 &&
	      st_metric(r.body, "moet_kv_blocks{state=\"free\"}") > 0, "KV blocks not all back");
	st_resp_free(&r);
	answer a;
	CHECK(ask("/v1/completions", "{\"prompt\":\"still there?\",\"max_tokens\":3,"
		  "\"ignore_eos\":true}", &a) == 0 && a.status == 200 &&
	      !strcmp(a.finish, "length"), "serves after the hang-ups: %d", a.status);
}

/* --placement with simulated devices: the same greedy answer, routing pairs on the devices. */
static void test_placement(const answer *want, const char *want_body)
{
	char place[4300], args[4600];
	snprintf(place, sizeof(place), "%s/serve-placement.yaml", moet_test_tmp_dir());
	const char *yaml = "gpus:\n  - {name: gpu0, budget: 1GB}\n  - {name: gpu1, budget: 1GB}\n"
			   "default:\n  gpu0: \"0-9\"\n  gpu1: \"20-25\"\n";
	CHECK(moet_test_write_file(place, yaml, strlen(yaml)) == 0, "write placement");
	snprintf(args, sizeof(args), "--placement '%s' --sim-devices 3 --device cpu --shadow 1",
		 place);
	st_server sv;
	CHECK(st_start(&sv, XDG, args) == 0, "server with a placement (log %s)", sv.log);
	if (!sv.pid)
		return;
	PORT = sv.port;
	answer a;
	CHECK(ask("/v1/completions", want_body, &a) == 0 && a.status == 200, "placement ask");
	CHECK(a.n_ids == want->n_ids && !memcmp(a.ids, want->ids, sizeof(long long) *
						 (size_t)a.n_ids), "a placement changed the ids");
	st_resp r;
	CHECK(st_http(PORT, "GET", "/metrics", NULL, NULL, &r) == 0, "metrics");
	double g0 = st_metric(r.body, "moet_expert_pairs_total{tier=\"gpu0\"}");
	double g1 = st_metric(r.body, "moet_expert_pairs_total{tier=\"gpu1\"}");
	double g2 = st_metric(r.body, "moet_expert_pairs_total{tier=\"gpu2\"}");
	double cpu = st_metric(r.body, "moet_expert_pairs_total{tier=\"cpu\"}");
	double hit = st_metric(r.body, "moet_gpu_hit_rate");
	CHECK(g0 > 0 && g1 > 0 && g2 == 0 && cpu > 0, "pairs per tier: cpu %g gpu0 %g gpu1 %g "
	      "gpu2 %g", cpu, g0, g1, g2);
	CHECK(hit > 0 && hit < 1 && fabs(hit - (g0 + g1) / (cpu + g0 + g1)) < 1e-5,
	      "hit rate %g", hit);
	/* --shadow 1: every CPU-tier call also computed by the backend, bits equal */
	double sc = st_metric(r.body, "moet_shadow_checks_total");
	double sm = st_metric(r.body, "moet_shadow_mismatches_total");
	CHECK(sc > 0 && sm == 0, "shadow: %g checks, %g mismatches", sc, sm);
	/* MOET_CPU_RESIDENT's populate at the bind: the CPU tier's bytes, all in memory */
	double rb = st_metric(r.body, "moet_cpu_tier_resident_bytes");
	double rs = st_metric(r.body, "moet_cpu_tier_resident_share");
	double ev = st_metric(r.body, "moet_cpu_tier_evicted_tensors");
	double lk = st_metric(r.body, "moet_cpu_tier_locked");
	CHECK(rb > 0 && rs == 1 && ev == 0 && lk == 0, "resident: %g bytes, share %g, %g evicted, "
	      "locked %g", rb, rs, ev, lk);
	st_resp_free(&r);
	CHECK(st_stop(&sv) == 0, "placement server exit");
}

int main(void)
{
	snprintf(XDG, sizeof(XDG), "%s/serve-xdg", moet_test_tmp_dir());
	snprintf(DEMO, sizeof(DEMO), "%s/moet-hybrid/demo-tiny", XDG);
	st_server sv;
	int rc = st_start(&sv, XDG, "--api-key test-key --max-requests 8 --kv-tokens 16384 "
			  "--max-prompt-tokens 200 --max-body-bytes 65536 --max-batch-tokens 64");
	CHECK(rc == 0, "server did not start (log %s)", sv.log);
	if (rc)
		return moet_test_done("test_serve");
	PORT = sv.port;
	test_info();
	test_greedy_equals_generate();
	test_chat_and_seed();
	test_concurrent();
	test_errors();
	test_disconnect_and_429();
	int st = st_stop(&sv);
	CHECK(st == 0, "server exit status %d (log %s)", st, sv.log);
	answer want;
	const char *body = "{\"prompt\":[0,50,60,70],\"max_tokens\":8,\"temperature\":0,"
			   "\"logprobs\":0,\"return_tokens_as_token_ids\":true}";
	CHECK(st_start(&sv, XDG, "") == 0, "plain server");
	PORT = sv.port;
	CHECK(ask("/v1/completions", body, &want) == 0 && want.n_ids > 0, "plain ask");
	CHECK(st_stop(&sv) == 0, "plain server exit");
	test_placement(&want, body);
	if (moet_test_failures) {
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", sv.log);
		moet_test_run(cmd, NULL);
	}
	return moet_test_done("test_serve");
}
