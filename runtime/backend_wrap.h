/*
 * backend_wrap.h: a backend that forwards every op to an inner one with a hook before and after
 * each op a pass queues (runtime/backend_wrap.c): what the op times (backend_timed.c) and the
 * timeline (backend_trace.c) are built on. Private to runtime/.
 */
#ifndef MOET_BACKEND_WRAP_H
#define MOET_BACKEND_WRAP_H

#include <stdint.h>

#include "moet_backend.h"

typedef struct moet_wrap_hooks {
	/* Before an op (key: its name; linear, ffn and gate_up with their shapes): a token that
	 * the op's post gets. */
	int64_t (*pre)(void *ctx, const char *key);
	/* After it, with the op's result rc: the op's result as the caller sees it. */
	int (*post)(void *ctx, const char *key, int64_t token, int rc);
	/* Optional: the driving thread's wait for a fence (fence_wait, not work on a stream)
	 * between host clock readings t0 and t1 (moet_now_ns); without it fence_wait is hooked
	 * as the ops are. */
	void (*host_wait)(void *ctx, const char *key, uint64_t t0, uint64_t t1);
	/* Optional: the stream the following ops go on (stream_select's slot, -1: the pass's). */
	void (*selected)(void *ctx, int slot);
	/* Optional: at the wrapper's destroy, before the inner backend's (which it may use). */
	void (*destroy)(void *ctx);
} moet_wrap_hooks;

/* *out forwards to inner (which it owns from now on) with h's hooks around each op. queued: also
 * offer the inner backend's queued copies, fences, idle marks and streams (0: the callers use
 * plain copies and one stream). Never CUDA graphs nor trace points. */
int moet_backend_wrap(moet_backend *inner, const moet_wrap_hooks *h, void *ctx, int queued,
		      moet_backend **out);

/* The ctx of a wrapper made with h, or NULL (not a wrapper, or other hooks). */
void *moet_backend_wrap_ctx(moet_backend *be, const moet_wrap_hooks *h);

/* The backend a wrapper forwards to, or NULL. */
moet_backend *moet_backend_wrap_inner(moet_backend *be);

#endif
