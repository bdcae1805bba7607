/*
 * moet_trace.h: a timeline of the engine's passes (MOET_TRACE=FILE at model open), written as
 * Chrome trace events (JSON: {"traceEvents": [...]}, one complete event per span; chrome://tracing
 * and Perfetto read it). Lanes: the device's streams (the pass's, the two micro-batches'), the
 * CPU tier's call slots, the driving thread's waits, and the passes themselves. Spans are
 * written as they come (runtime/backend_trace.c after each pass, hybrid.c, dispatch.c,
 * forward.c); times in microseconds from the trace's start, on moet_now_ns's clock.
 */
#ifndef MOET_TRACE_H
#define MOET_TRACE_H

#include <stdint.h>

enum {
	MOET_TRACE_STREAM = 0,  /* + 1 + slot: the micro-batch streams (stream_select) */
	MOET_TRACE_CPU = 10,    /* + slot: the CPU tier's team span of a call */
	MOET_TRACE_DRIVER = 20, /* the driving thread's waits */
	MOET_TRACE_PASS = 30,   /* the passes */
};

typedef struct moet_trace moet_trace;

/* A timeline for FILE, made at the first span (with the header and the lanes' names): FILE, or
 * FILE.n for the n-th timeline of the process after the first that writes to the same FILE
 * (the last name kept). MOET_EIO naming the file when its directory cannot be written now. At
 * most max_spans spans are written (0: no limit); those past it are counted and dropped. */
int moet_trace_open(const char *path, int64_t max_spans, moet_trace **out);

/* A span [t0_ns, t1_ns] (moet_now_ns) on a lane; name is copied. NULL t: nothing. A write error
 * is kept and returned by moet_trace_close (and moet_trace_error). */
void moet_trace_span(moet_trace *t, int lane, const char *name, uint64_t t0_ns, uint64_t t1_ns);

/* The first write error so far (0: none), naming the file. */
int moet_trace_error(const moet_trace *t);

/* Spans written and dropped so far. */
void moet_trace_counts(const moet_trace *t, int64_t *written, int64_t *dropped);

/* Ends the JSON and closes the file; returns the first error (MOET_EIO naming the file). NULL:
 * nothing. */
int moet_trace_close(moet_trace *t);

#endif
