/*
 * backend_cuda_sync.c: the CUDA backend's ops that order work rather than compute (the state
 * in backend_cuda_int.h; the compute ops and the ops table in backend_cuda.c): fences, the
 * device's idle marks around the driver's waits, the two micro-batch streams, trace points
 * (MOET_TRACE) and the capture of a pass into a CUDA graph.
 */
#include <stdlib.h>

#include "backend_cuda_int.h"
#include "moet_clock.h"
#include "moet_err.h"

int moet_cu_fence(moet_backend *be, int i)
{
	cuda_be *c = impl(be);
	if (i < 0 || i >= MOET_BACKEND_FENCES)
		return moet_err(MOET_EINVAL, "CUDA backend: fence %d", i);
	int rc = c->fence_ev[i] ? 0 : moet_gpu_event_create(&c->fence_ev[i]);
	return rc ? rc : moet_gpu_event_record(c->fence_ev[i], cur_stream(c));
}

int moet_cu_fence_wait(moet_backend *be, int i)
{
	cuda_be *c = impl(be);
	if (i < 0 || i >= MOET_BACKEND_FENCES || !c->fence_ev[i])
		return moet_err(MOET_EINVAL, "CUDA backend: fence %d never recorded", i);
	return moet_gpu_event_sync(c->fence_ev[i]);
}

int moet_cu_fence_done(moet_backend *be, int i, int *out_done)
{
	cuda_be *c = impl(be);
	if (i < 0 || i >= MOET_BACKEND_FENCES || !c->fence_ev[i])
		return moet_err(MOET_EINVAL, "CUDA backend: fence %d never recorded", i);
	return moet_gpu_event_query(c->fence_ev[i], out_done);
}

/* ---- idle time around the driver's waits (moet_backend_ops.idle_mark) ------------------------ */

int moet_cu_idle_mark(moet_backend *be, int resume, int kind)
{
	cuda_be *c = impl(be);
	if (c->capturing || c->idle_n == CU_IDLE_PAIRS || c->idle_open != !!resume ||
	    (!resume && (kind < 0 || kind >= MOET_IDLE_KINDS)))
		return 0; /* inside a capture, the pairs full, or a mark out of turn: dropped */
	void **ev = &c->idle_ev[!!resume][c->idle_n];
	int rc = *ev ? 0 : moet_gpu_event_create(ev);
	if (!rc)
		rc = moet_gpu_event_record(*ev, cur_stream(c));
	/* two streams: the other micro-batch's stream may still have work (it was made and
	 * joined this pass if it is selected at all: the first mark goes on it too) */
	const int other = c->sel >= 0 && c->mb_stream[!c->sel] && c->joined[!c->sel];
	if (!rc && !resume && other) {
		void **eo = &c->idle_ev_other[c->idle_n];
		if (!(rc = *eo ? 0 : moet_gpu_event_create(eo)))
			rc = moet_gpu_event_record(*eo, c->mb_stream[!c->sel]);
	}
	if (rc)
		return rc;
	if (!resume) {
		c->idle_kind[c->idle_n] = (unsigned char)kind;
		c->idle_other[c->idle_n] = (unsigned char)other;
	}
	c->idle_open = !resume;
	c->idle_n += !!resume;
	return 0;
}

int moet_cu_idle_take(moet_backend *be, double out_s[MOET_IDLE_KINDS])
{
	cuda_be *c = impl(be);
	int rc = 0;
	for (int k = 0; k < MOET_IDLE_KINDS; k++)
		out_s[k] = 0;
	for (int i = 0; i < c->idle_n && !rc; i++) {
		float ms = 0;
		if (!(rc = moet_gpu_event_sync(c->idle_ev[1][i])) &&
		    !(rc = moet_gpu_event_elapsed_ms(c->idle_ev[0][i], c->idle_ev[1][i], &ms))) {
			float mo = ms; /* the device ran dry when the later stream did */
			if (c->idle_other[i] &&
			    !(rc = moet_gpu_event_sync(c->idle_ev_other[i])) &&
			    !(rc = moet_gpu_event_elapsed_ms(c->idle_ev_other[i], c->idle_ev[1][i],
							     &mo)) && mo < ms)
				ms = mo;
			out_s[c->idle_kind[i]] += ms > 0 ? 1e-3 * ms : 0;
		}
	}
	c->idle_n = 0;
	c->idle_open = 0;
	return rc;
}

/* ---- two micro-batch streams (moet_backend_ops.stream_select) ------------------------------ */

/* NOTE: both are blocking streams: work on the legacy stream (synchronous copies) waits for
 * theirs and they for it, so every copy the pass makes on it stays ordered; with the legacy
 * stream as the pass's stream that order is all the join needs, with an own stream events. */
int moet_cu_stream_select(moet_backend *be, int slot)
{
	cuda_be *c = impl(be);
	int rc = 0;
	if (slot < -1 || slot > 1)
		return moet_err(MOET_EINVAL, "CUDA backend: micro-batch stream %d", slot);
	if (c->capturing)
		return moet_err(MOET_EUNSUP, "CUDA backend: micro-batch streams in a capture");
	if (slot < 0) {
		for (int i = 0; i < 2 && !rc; i++) {
			if (!c->joined[i])
				continue;
			c->joined[i] = 0;
			if (c->stream && !(rc = c->mb_ev[i] ? 0 : moet_gpu_event_create(&c->mb_ev[i])) &&
			    !(rc = moet_gpu_event_record(c->mb_ev[i], c->mb_stream[i])))
				rc = moet_gpu_stream_wait_event(c->stream, c->mb_ev[i]);
		}
		c->sel = -1;
		moet_gpu_set_thread_stream(c->stream);
		return rc;
	}
	if (!c->mb_stream[slot] &&
	    (rc = c->prio ? moet_gpu_stream_create_blocking_prio(&c->mb_stream[slot], 1)
			  : moet_gpu_stream_create_blocking(&c->mb_stream[slot])))
		return rc;
	if (!c->joined[slot]) {
		if (c->stream && ((rc = c->base_ev ? 0 : moet_gpu_event_create(&c->base_ev)) ||
				  (rc = moet_gpu_event_record(c->base_ev, c->stream)) ||
				  (rc = moet_gpu_stream_wait_event(c->mb_stream[slot], c->base_ev))))
			return rc;
		c->joined[slot] = 1;
	}
	c->sel = slot;
	moet_gpu_set_thread_stream(c->mb_stream[slot]);
	return 0;
}

/* The selected micro-batch stream waits for the work queued so far on the other, `slot`
 * (moet_backend_ops.stream_wait): an event recorded there. NOTE: the wait takes the event's
 * state at this call, so recording it again at the next wait is safe. */
int moet_cu_stream_wait(moet_backend *be, int slot)
{
	cuda_be *c = impl(be);
	int rc;
	if (c->sel < 0 || slot != !c->sel || !c->mb_stream[slot])
		return moet_err(MOET_EINVAL, "CUDA backend: micro-batch stream %d waits for %d",
				c->sel, slot);
	if (c->capturing)
		return moet_err(MOET_EUNSUP, "CUDA backend: micro-batch streams in a capture");
	if ((rc = c->wait_ev[slot] ? 0 : moet_gpu_event_create(&c->wait_ev[slot])) ||
	    (rc = moet_gpu_event_record(c->wait_ev[slot], c->mb_stream[slot])))
		return rc;
	return moet_gpu_stream_wait_event(c->mb_stream[c->sel], c->wait_ev[slot]);
}

/* ---- trace points (moet_backend_ops.trace_point, MOET_TRACE) ------------------------------- */

int moet_cu_trace_point(moet_backend *be, int64_t *out_id)
{
	cuda_be *c = impl(be);
	if (c->capturing)
		return moet_err(MOET_EUNSUP, "CUDA backend: trace points in a capture");
	if (c->tp_n == c->tp_cap) {
		const int64_t cap = c->tp_cap ? 2 * c->tp_cap : 1024;
		void **n = realloc(c->tp_ev, (size_t)cap * sizeof(*n));
		if (!n)
			return moet_err(MOET_ENOMEM, "CUDA backend: %lld trace points", (long long)cap);
		for (int64_t i = c->tp_cap; i < cap; i++)
			n[i] = NULL;
		c->tp_ev = n;
		c->tp_cap = cap;
	}
	void **ev = &c->tp_ev[c->tp_n];
	int rc = *ev ? 0 : moet_gpu_event_create(ev);
	if (!rc)
		rc = moet_gpu_event_record(*ev, cur_stream(c));
	if (!rc)
		*out_id = c->tp_n++;
	return rc;
}

/* NOTE: the anchor goes on the pass's stream after everything (a trace flush follows the
 * pass's join and its logits' download); its wait returns within microseconds of its being
 * reached, so each point's host time is the anchor's less the events' elapsed time. */
int moet_cu_trace_times(moet_backend *be, int64_t n, uint64_t *out_ns)
{
	cuda_be *c = impl(be);
	const int64_t had = c->tp_n;
	c->tp_n = 0;
	if (n != had)
		return moet_err(MOET_EINVAL, "CUDA backend: %lld trace points asked for, %lld "
				"queued", (long long)n, (long long)had);
	int rc = c->tp_anchor ? 0 : moet_gpu_event_create(&c->tp_anchor);
	if (!rc)
		rc = moet_gpu_event_record(c->tp_anchor, c->stream);
	if (!rc)
		rc = moet_gpu_event_sync(c->tp_anchor);
	const uint64_t t_anchor = moet_now_ns();
	for (int64_t i = 0; i < n && !rc; i++) {
		float ms = 0;
		if (!(rc = moet_gpu_event_sync(c->tp_ev[i])) && /* reached: at once here */
		    !(rc = moet_gpu_event_elapsed_ms(c->tp_ev[i], c->tp_anchor, &ms))) {
			const double back = ms > 0 ? 1e6 * (double)ms : 0;
			out_ns[i] = back < (double)t_anchor ? t_anchor - (uint64_t)back : 0;
		}
	}
	return rc;
}

/* ---- CUDA graphs of a pass (runtime/graph.c) ------------------------------------------------ */

int moet_cu_capture_begin(moet_backend *be)
{
	cuda_be *c = impl(be);
	if (!c->stream)
		return moet_err(MOET_EUNSUP, "CUDA graphs need MOET_GPU_STREAM=own (the legacy "
				"stream cannot be captured)");
	int rc = moet_gpu_capture_begin(c->stream);
	c->capturing = !rc;
	return rc;
}

int moet_cu_capture_end(moet_backend *be, void **out_graph)
{
	impl(be)->capturing = 0;
	return moet_gpu_capture_end(impl(be)->stream, out_graph);
}

int moet_cu_graph_launch(moet_backend *be, void *graph)
{
	return moet_gpu_graph_launch(graph, impl(be)->stream);
}

void moet_cu_graph_free(moet_backend *be, void *graph)
{
	(void)be;
	moet_gpu_graph_destroy(graph);
}

uint64_t moet_cu_mem_epoch(moet_backend *be)
{
	(void)be;
	return moet_gpu_mem_epoch();
}
