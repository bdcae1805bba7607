/*
 * trace.c: the timeline file of MOET_TRACE (moet_trace.h). Each span is one Chrome trace
 * "complete" event ({"name", "ph": "X", "ts", "dur", "pid", "tid"}, microseconds), made with
 * jansson and appended as it comes, so a long run needs no memory for its events.
 */
#include "moet_trace.h"

#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "moet_clock.h"
#include "moet_err.h"

struct moet_trace {
	FILE *f;           /* made at the first span (a model that runs no pass writes nothing) */
	char *base;        /* the name asked for */
	char *path;        /* the file's name, once made */
	uint64_t t0;       /* ns: the trace's origin */
	int64_t max, written, dropped;
	int err_no;        /* the first failure's errno (EIO where none was set); 0: none */
	int bad;
};

static void put(moet_trace *t, json_t *ev)
{
	if (!t->f) {
		json_decref(ev);
		return;
	}
	if (!ev) {
		t->bad = 1;
		t->err_no = ENOMEM;
		return;
	}
	errno = 0;
	if (!t->bad && (fputs(",\n", t->f) == EOF || json_dumpf(ev, t->f, JSON_COMPACT))) {
		t->bad = 1;
		t->err_no = errno ? errno : EIO;
	}
	json_decref(ev);
}

static void lane_name(moet_trace *t, int lane, const char *name)
{
	put(t, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M", "pid",
			 0, "tid", lane, "args", "name", name));
	put(t, json_pack("{s:s, s:s, s:i, s:i, s:{s:i}}", "name", "thread_sort_index", "ph", "M",
			 "pid", 0, "tid", lane, "args", "sort_index", lane));
}

int moet_trace_open(const char *path, int64_t max_spans, moet_trace **out)
{
	*out = NULL;
	if (!path || !*path)
		return moet_err(MOET_EINVAL, "MOET_TRACE: no file name");
	/* the file is made at the first span; its directory is checked now */
	char *dir = strdup(path);
	const int ok = dir && access(dirname(dir), W_OK | X_OK) == 0;
	const int e = errno;
	free(dir);
	if (!ok)
		return moet_err(MOET_EIO, "MOET_TRACE: cannot create %s: %s", path, strerror(e));
	moet_trace *t = calloc(1, sizeof(*t));
	char *p = strdup(path);
	if (!t || !p) {
		free(t);
		free(p);
		return moet_err(MOET_ENOMEM, "MOET_TRACE");
	}
	t->base = p;
	t->max = max_spans;
	t->t0 = moet_now_ns();
	*out = t;
	return 0;
}

/* The file, at the first span: FILE, or FILE.n for the n-th timeline of this process that
 * writes to the same FILE after the first (the last name kept: bench e2e's models one after
 * the other). */
static void make_file(moet_trace *t)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static char last[4096];
	static int made;
	pthread_mutex_lock(&mu);
	if (strcmp(last, t->base)) {
		snprintf(last, sizeof(last), "%s", t->base);
		made = 0;
	}
	const int n = made++;
	pthread_mutex_unlock(&mu);
	const size_t len = strlen(t->base) + 16;
	if (!(t->path = malloc(len))) {
		t->bad = 1;
		t->err_no = ENOMEM;
		return;
	}
	if (n > 0)
		snprintf(t->path, len, "%s.%d", t->base, n);
	else
		snprintf(t->path, len, "%s", t->base);
	if (!(t->f = fopen(t->path, "w"))) {
		t->bad = 1;
		t->err_no = errno;
		return;
	}
	/* NOTE: the first element is the process's name, so that every later one follows ",\n" */
	if (fputs("{\"traceEvents\": [\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, "
		  "\"args\": {\"name\": \"moet-hybrid\"}}", t->f) == EOF) {
		t->bad = 1;
		t->err_no = errno ? errno : EIO;
	}
	lane_name(t, MOET_TRACE_STREAM, "backend: pass stream");
	lane_name(t, MOET_TRACE_STREAM + 1, "backend: micro-batch 0 stream");
	lane_name(t, MOET_TRACE_STREAM + 2, "backend: micro-batch 1 stream");
	lane_name(t, MOET_TRACE_CPU, "CPU tier: slot 0");
	lane_name(t, MOET_TRACE_CPU + 1, "CPU tier: slot 1");
	lane_name(t, MOET_TRACE_DRIVER, "driver: waits");
	lane_name(t, MOET_TRACE_PASS, "passes");
}

void moet_trace_span(moet_trace *t, int lane, const char *name, uint64_t t0_ns, uint64_t t1_ns)
{
	if (!t)
		return;
	if (!t->f && !t->bad)
		make_file(t);
	if (t->max > 0 && t->written >= t->max) {
		t->dropped++;
		return;
	}
	const double ts = t0_ns > t->t0 ? 1e-3 * (double)(t0_ns - t->t0) : 0;
	const double dur = t1_ns > t0_ns ? 1e-3 * (double)(t1_ns - t0_ns) : 0;
	put(t, json_pack("{s:s, s:s, s:f, s:f, s:i, s:i}", "name", name, "ph", "X", "ts", ts,
			 "dur", dur, "pid", 0, "tid", lane));
	t->written++;
}

static int write_err(const moet_trace *t)
{
	return moet_err(MOET_EIO, "MOET_TRACE: writing %s: %s", t->path ? t->path : t->base,
			strerror(t->err_no));
}

int moet_trace_error(const moet_trace *t)
{
	return t && t->bad ? write_err(t) : 0;
}

void moet_trace_counts(const moet_trace *t, int64_t *written, int64_t *dropped)
{
	*written = t ? t->written : 0;
	*dropped = t ? t->dropped : 0;
}

int moet_trace_close(moet_trace *t)
{
	if (!t)
		return 0;
	if (t->f && !t->bad && fputs("\n], \"displayTimeUnit\": \"ms\"}\n", t->f) == EOF) {
		t->bad = 1;
		t->err_no = errno ? errno : EIO;
	}
	if (t->f && fclose(t->f) && !t->bad) {
		t->bad = 1;
		t->err_no = errno ? errno : EIO;
	}
	const int rc = t->bad ? write_err(t) : 0;
	free(t->path);
	free(t->base);
	free(t);
	return rc;
}
