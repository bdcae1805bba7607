/*
 * test_draw_switch.c: MOET_SAMPLE_DEVICE (runtime/draw.c, moet_backend_draw) without a GPU.
 *   - on the CPU backend (no sample op) unset, empty, 0 and 1 all give the greedy ids of an
 *     argmax written here (the host path);
 *   - on a test double of a backend with a sample op (the CPU backend's ops, a stub op that
 *     writes a marker id): unset, empty and 1 use the op, 0 takes the host path (the argmax);
 *   - any other value is refused on both, MOET_EINVAL in one line naming the variable and the
 *     value, before anything is drawn (the out ids untouched, the op not called).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_err.h"
#include "moet_sample.h"
#include "moet_test.h"

#define V 37
#define ROWS 3
#define MARK 1000 /* the stub op's id: no logits row has it */

static int stub_calls;

static int stub_sample(moet_backend *be, const float *logits, int64_t n_vocab, const moet_draw *d,
		       int64_t n)
{
	(void)be;
	(void)logits;
	(void)n_vocab;
	stub_calls++;
	for (int64_t r = 0; r < n; r++)
		*d[r].out_id = MARK + r;
	return 0;
}

/* The index of the largest of x[0..n), ties to the lowest (the rows here have none). */
static int64_t argmax_here(const float *x, int64_t n)
{
	int64_t at = 0;
	for (int64_t i = 1; i < n; i++)
		if (x[i] > x[at])
			at = i;
	return at;
}

/* One draw of every row with MOET_SAMPLE_DEVICE=v (NULL: unset); want_op: the op expected. */
static void draw_with(moet_backend *be, const float *dev, const float *host, const char *v,
		      int has_op, int want_op)
{
	const moet_sample_params greedy = { .temperature = 0, .top_k = 0, .top_p = 1, .seed = 1 };
	int64_t ids[ROWS];
	moet_draw d[ROWS];
	for (int r = 0; r < ROWS; r++) {
		ids[r] = -5;
		d[r] = (moet_draw){ &greedy, ROWS - 1 - r, r, &ids[r] };
	}
	moet_test_env("MOET_SAMPLE_DEVICE", v);
	stub_calls = 0;
	int rc = moet_backend_draw(be, dev, V, d, ROWS);
	const char *name = v ? v : "(unset)";
	CHECK(rc == 0, "MOET_SAMPLE_DEVICE=%s (op %d): rc %d (%s)", name, has_op, rc,
	      moet_errmsg());
	CHECK(stub_calls == want_op, "MOET_SAMPLE_DEVICE=%s (op %d): the op called %d times",
	      name, has_op, stub_calls);
	for (int r = 0; r < ROWS && !rc; r++) {
		int64_t want = want_op ? MARK + r : argmax_here(host + (ROWS - 1 - r) * V, V);
		CHECK(ids[r] == want, "MOET_SAMPLE_DEVICE=%s (op %d): row %d id %lld, want %lld",
		      name, has_op, r, (long long)ids[r], (long long)want);
	}
	unsetenv("MOET_SAMPLE_DEVICE");
}

static void refused(moet_backend *be, const float *dev, const char *v, int has_op)
{
	const moet_sample_params greedy = { .temperature = 0, .top_k = 0, .top_p = 1, .seed = 1 };
	int64_t id = -5;
	moet_draw d = { &greedy, 0, 0, &id };
	setenv("MOET_SAMPLE_DEVICE", v, 1);
	stub_calls = 0;
	int rc = moet_backend_draw(be, dev, V, &d, 1);
	unsetenv("MOET_SAMPLE_DEVICE");
	char want[64];
	snprintf(want, sizeof(want), "MOET_SAMPLE_DEVICE='%s'", v);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), want) && !strchr(moet_errmsg(), '\n'),
	      "MOET_SAMPLE_DEVICE=%s (op %d): rc %d, '%s'", v, has_op, rc, moet_errmsg());
	CHECK(id == -5 && stub_calls == 0, "MOET_SAMPLE_DEVICE=%s (op %d): drew (id %lld, op "
	      "%d)", v, has_op, (long long)id, stub_calls);
}

int main(void)
{
	moet_backend *be = NULL;
	float host[ROWS * V];
	void *dev = NULL;
	uint64_t s = 0x9E3779B97F4A7C15ull;
	for (int i = 0; i < ROWS * V; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		host[i] = (float)(s >> 40) / (float)(1u << 24) - 0.5f; /* distinct, no ties */
	}
	int rc = moet_backend_cpu_create(1, 0, &be);
	CHECK(rc == 0, "CPU backend: %s", moet_errmsg());
	if (rc)
		return moet_test_done("test_draw_switch");
	CHECK(!be->ops->sample, "the CPU backend has no sample op");
	rc = be->ops->alloc(be, sizeof(host), &dev);
	if (!rc)
		rc = be->ops->upload(be, dev, host, sizeof(host));
	CHECK(rc == 0, "logits: %s", moet_errmsg());
	if (rc)
		goto out;
	moet_backend_ops with_op = *be->ops;
	with_op.sample = stub_sample;
	const moet_backend_ops *plain = be->ops;
	const char *bad[] = { "2", "yes", "host", " 0", "0 ", "01" };
	for (int has_op = 0; has_op < 2; has_op++) {
		be->ops = has_op ? &with_op : plain;
		draw_with(be, dev, host, NULL, has_op, has_op);
		draw_with(be, dev, host, "", has_op, has_op);
		draw_with(be, dev, host, "1", has_op, has_op);
		draw_with(be, dev, host, "0", has_op, 0);
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
			refused(be, dev, bad[i], has_op);
	}
	be->ops = plain;
	printf("MOET_SAMPLE_DEVICE: unset, empty, 1 and 0 draw as documented; %zu bad values "
	       "refused naming it, with and without a sample op\n", sizeof(bad) / sizeof(bad[0]));
out:
	if (dev)
		be->ops->free(be, dev);
	be->ops->destroy(be);
	return moet_test_done("test_draw_switch");
}
