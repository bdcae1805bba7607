/*
 * moet_test.c: shared test helpers (see moet_test.h).
 */
#include "moet_test.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_placement.h"
#include "moet_model.h"

int moet_test_failures;

int moet_test_done(const char *name)
{
	if (moet_test_failures) {
		printf("%s: %d check(s) failed\n", name, moet_test_failures);
		return 1;
	}
	printf("%s: ok\n", name);
	return 0;
}

static const char *env_or(const char *name, const char *dflt)
{
	const char *v = getenv(name);
	return (v && v[0]) ? v : dflt;
}

const char *moet_test_source_dir(void) { return env_or("MOET_SOURCE_DIR", "."); }
const char *moet_test_bin(void) { return env_or("MOET_BIN", "moet-hybrid"); }
const char *moet_test_shared_dir(void) { return env_or("MOET_SHARED_DIR", "../shared"); }
const char *moet_test_tmp_dir(void) { return env_or("MOET_TMP", "/tmp"); }

void moet_test_build_dir(char *out, size_t cap)
{
	snprintf(out, cap, "%s", moet_test_bin());
	char *slash = strrchr(out, '/');
	if (slash)
		*slash = 0;
	else
		snprintf(out, cap, ".");
}

char *moet_test_mkdtemp(const char *tag)
{
	size_t n = strlen(moet_test_tmp_dir()) + strlen(tag) + 64;
	char *p = malloc(n);
	if (!p)
		return NULL;
	snprintf(p, n, "%s/%s-%ld-XXXXXX", moet_test_tmp_dir(), tag, (long)getpid());
	if (!mkdtemp(p)) {
		free(p);
		return NULL;
	}
	return p;
}

int moet_test_run(const char *cmd, char **out_text)
{
	size_t n = strlen(cmd) + 16;
	char *full = malloc(n);
	if (!full)
		return -1;
	snprintf(full, n, "(%s) 2>&1", cmd);
	FILE *p = popen(full, "r");
	free(full);
	if (!p)
		return -1;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	size_t got;
	while (buf && (got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
		len += got;
		if (cap - len < 2) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	if (buf)
		buf[len] = '\0';
	int st = pclose(p);
	if (out_text)
		*out_text = buf;
	else
		free(buf);
	return (st >= 0 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
}

int moet_test_write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = fwrite(data, 1, n, f);
	return (fclose(f) == 0 && w == n) ? 0 : -1;
}

void moet_test_hw_even(const char *dir, char *path, size_t n)
{
	static const char even[] = "name: even\ncpu_read_gbps: 1\npcie_gbps: 1.2\n"
				   "pcie_latency_us: 0\n";
	snprintf(path, n, "%s/hw-even.yaml", dir);
	CHECK(moet_test_write_file(path, even, strlen(even)) == 0, "write %s", path);
}

void *moet_test_read_file(const char *path, size_t *out_n)
{
	size_t dummy;
	if (!out_n)
		out_n = &dummy;
	*out_n = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	/* NOTE: fstat, not fseek/ftell: a directory opens, and its "size" is no byte count */
	struct stat st;
	size_t len = 0;
	unsigned char *b = NULL;
	if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
		len = (size_t)st.st_size;
		b = malloc(len + 1);
	}
	if (b && fread(b, 1, len, f) != len) {
		free(b);
		b = NULL;
	}
	fclose(f);
	if (b) {
		b[len] = 0;
		*out_n = len;
	}
	return b;
}

void moet_test_env(const char *name, const char *v)
{
	if (v)
		setenv(name, v, 1);
	else
		unsetenv(name);
}

uint64_t moet_test_xorshift64(uint64_t *state)
{
	uint64_t x = *state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *state = x;
}

char *moet_test_gen(const char *tag, const moet_gen_params *gp)
{
	char *dir = moet_test_mkdtemp(tag);
	CHECK(dir, "%s: no scratch directory under %s", tag, moet_test_tmp_dir());
	if (!dir)
		return NULL;
	int rc = moet_gen_checkpoint(dir, gp);
	CHECK(rc == 0, "%s: gen: %s", tag, moet_errmsg());
	if (rc) {
		free(dir);
		return NULL;
	}
	return dir;
}

moet_model *moet_test_gen_open_on(const char *tag, const moet_gen_params *gp, const char *device,
				  char **out_dir)
{
	moet_model *m = NULL;
	char *dir = moet_test_gen(tag, gp);
	*out_dir = dir;
	if (!dir)
		return NULL;
	int rc = device ? moet_model_open_on(dir, device, &m) : moet_model_open(dir, &m);
	CHECK(rc == 0, "%s: open%s%s: %s", tag, device ? " " : "", device ? device : "",
	      moet_errmsg());
	return rc ? NULL : m;
}

moet_model *moet_test_gen_open(const char *tag, const moet_gen_params *gp, char **out_dir)
{
	return moet_test_gen_open_on(tag, gp, NULL, out_dir);
}

int moet_test_cli(char **out, const char *fmt, ...)
{
	char args[4096], cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "%s %s", moet_test_bin(), args);
	return moet_test_run(cmd, out); /* moet_test_run adds 2>&1 */
}

void moet_test_cli_expect(const char *args, int want_rc, const char *want_text)
{
	char *out = NULL;
	int rc = moet_test_cli(&out, "%s", args);
	CHECK(rc == want_rc, "'%s': exit %d, want %d", args, rc, want_rc);
	CHECK(out && strstr(out, want_text), "'%s': output lacks '%s': %s", args, want_text,
	      out ? out : "");
	free(out);
}

static int ragged(moet_model *m, int seqs, int steps, int batched, float *out,
		  void (*after)(int step, void *ctx), void *ctx)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	const int64_t max_prompt = 2 * (int64_t)seqs + 1, width = max_prompt + steps;
	moet_kv **kv = calloc((size_t)seqs, sizeof(*kv));
	int64_t *tok = malloc((size_t)(seqs * width) * sizeof(*tok));
	moet_seq_step *st = malloc((size_t)seqs * sizeof(*st));
	int rc = (!kv || !tok || !st) ? MOET_ENOMEM : 0;
	for (int s = 0; !rc && s < seqs; s++)
		for (int64_t i = 0; i < width; i++)
			tok[s * width + i] = (int64_t)((uint64_t)(s * 131 + i * 17 + 3) % (uint64_t)V);
	for (int s = 0; s < seqs && !rc; s++)
		rc = moet_kv_create(m, width + 1, &kv[s]);
	size_t at = 0;
	for (int step = 0; step <= steps && !rc; step++) {
		for (int s = 0; s < seqs; s++) {
			int64_t plen = 2 * (int64_t)(seqs - s) + 1;
			st[s] = (moet_seq_step){ .kv = kv[s],
						 .tokens = tok + s * width + (step ? plen + step - 1 : 0),
						 .n_tok = step ? 1 : plen, .out_logits = out + at,
						 .last_only = 1 };
			at += (size_t)V;
		}
		if (batched)
			rc = moet_model_forward_batch(m, st, seqs);
		for (int s = 0; s < seqs && !batched && !rc; s++)
			rc = moet_model_forward_batch(m, &st[s], 1);
		if (!rc && after)
			after(step, ctx);
	}
	for (int s = 0; kv && s < seqs; s++)
		moet_kv_destroy(kv[s]);
	free(kv);
	free(tok);
	free(st);
	return rc;
}

int moet_test_ragged_run(moet_model *m, int seqs, int steps, int batched, float *out)
{
	return ragged(m, seqs, steps, batched, out, NULL, NULL);
}

int moet_test_ragged_run_hook(moet_model *m, int seqs, int steps, float *out,
			      void (*after)(int step, void *ctx), void *ctx)
{
	return ragged(m, seqs, steps, 1, out, after, ctx);
}

double moet_test_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

int moet_test_kimi(int64_t n_layers, int64_t n_experts, moet_config *out_cf,
		   moet_placement_sizes **out_sizes)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.preset = MOET_GEN_KIMI_K2;
	if (n_layers > 0)
		gp.n_layers = n_layers;
	if (n_experts > 0)
		gp.n_experts = n_experts;
	int rc = moet_gen_config(&gp, out_cf);
	return rc ? rc : moet_placement_sizes_from_config(out_cf, out_sizes);
}

void moet_test_routing_ids(int32_t *ids, int64_t n, int64_t k, int64_t E, int mode,
			   uint64_t *state)
{
	const int64_t pool = mode == 0 ? E : mode == 1 ? (k + 2 < E ? k + 2 : E) : 3;
	const int64_t off =
		mode == 0 ? 0 : (int64_t)(moet_test_xorshift64(state) % (uint32_t)(E - pool + 1));
	for (int64_t t = 0; t < n; t++)
		for (int64_t i = 0; i < k; i++) {
			int32_t e;
			int again;
			do {
				e = (int32_t)(off + (int64_t)(moet_test_xorshift64(state) %
							      (uint32_t)pool));
				again = 0;
				for (int64_t j = 0; mode < 2 && j < i; j++)
					again |= ids[t * k + j] == e;
			} while (again);
			ids[t * k + i] = e;
		}
}

int moet_test_trace_read(const char *path, moet_test_trace_counts *k)
{
	memset(k, 0, sizeof(*k));
	json_error_t je;
	json_t *root = json_load_file(path, 0, &je);
	CHECK(root != NULL, "%s: not JSON: %s (line %d)", path, je.text, je.line);
	json_t *ev = root ? json_object_get(root, "traceEvents") : NULL;
	CHECK(json_is_array(ev), "%s: no traceEvents array", path);
	if (!json_is_array(ev)) {
		json_decref(root);
		return -1;
	}
	size_t i;
	json_t *e;
	double pass_ts[64], pass_end[64];
	int n_pass = 0;
	json_array_foreach(ev, i, e) { /* the passes first: the ops are checked against them */
		const char *ph = json_string_value(json_object_get(e, "ph"));
		if (ph && !strcmp(ph, "X") && json_integer_value(json_object_get(e, "tid")) == 30 &&
		    n_pass < 64) {
			pass_ts[n_pass] = json_number_value(json_object_get(e, "ts"));
			pass_end[n_pass] = pass_ts[n_pass] + json_number_value(json_object_get(e, "dur"));
			n_pass++;
		}
	}
	json_array_foreach(ev, i, e) {
		const char *ph = json_string_value(json_object_get(e, "ph"));
		if (!ph || strcmp(ph, "X"))
			continue;
		const int64_t tid = json_integer_value(json_object_get(e, "tid"));
		const double ts = json_number_value(json_object_get(e, "ts"));
		const double dur = json_number_value(json_object_get(e, "dur"));
		k->spans++;
		if (!json_is_string(json_object_get(e, "name")) || !(ts >= 0) || !(dur >= 0))
			k->bad++;
		if (tid == 30)
			k->passes++;
		else if (tid >= 0 && tid <= 2)
			k->ops[tid]++;
		else if (tid == 10 || tid == 11)
			k->cpu++;
		else if (tid == 20)
			k->waits++;
		else
			k->bad++;
		if (tid <= 2) { /* an op: inside a pass (0.5 us: the JSON's rounding) */
			int in = 0;
			for (int p = 0; p < n_pass && !in; p++)
				in = ts >= pass_ts[p] - 0.5 && ts + dur <= pass_end[p] + 0.5;
			k->outside += !in;
		}
	}
	json_decref(root);
	return 0;
}
