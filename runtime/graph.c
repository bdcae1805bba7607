/*
 * graph.c: the forward pass of a decode batch captured into a CUDA graph and replayed
 * (MOET_CUDA_GRAPH=1; step 4 of the CUDA-graph plan in docs/cuda-graphs.md, the all-GPU case).
 *
 * What is captured: one pass's device work from the embedding to the lm_head (forward.c's
 * pass body), after the host has written the pass's row table (tokens, positions, page tables:
 * prepare_rows, never captured) and before the logits' download and the draw (never captured).
 * Every kernel of the body reads its per-step data from that row table or from the previous
 * kernels' outputs, so replaying the graph on the next step's table computes the next step:
 * the same kernels, arguments and launch order as the direct run, hence the same bits.
 *
 * When a pass may be captured: one pass (no micro-batches), a backend that can capture (CUDA
 * with MOET_GPU_STREAM=own), no routing observer, and the direct passes of that shape had every
 * MoE layer's experts grouped on the device (MOET_GPU_DEVGROUP=1 and each layer on GPU 0, or
 * on GPU 0 and the CPU tier, whose work is then queued as host functions: devgroup.c; no other
 * GPU, no NVMe tier, no shadow check, no prefill staging: nothing the host decides inside the
 * pass). The shape (the key) is the batch's entries' token counts and flags; a
 * shape is captured at its second qualifying pass with no allocation in between (the first may
 * grow buffers), and its graph replayed while no device or pinned buffer has been allocated or
 * freed since (moet_gpu_mem_epoch: a grown buffer, a new placement or expert tables end every
 * graph; the shape is then captured again). A capture that fails (a call the capture cannot
 * hold) runs the pass directly and marks the shape so (counted, no retry until the epoch
 * changes).
 *
 * Host bookkeeping of the body that a replay skips is replayed from the capture: the device
 * grouping's per-layer record (which error words to read after the pass) and the pass counters.
 *
 * NOTE: at most MAX_ENT shapes are kept (the least recently used is dropped); keys and records
 * are allocated at capture, never per replay: nothing is allocated per token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_env.h"
#include "moet_err.h"

#define MAX_ENT 16

typedef struct ent {
	int32_t *key;           /* n_key words: n_steps, then per entry n_tok and flags */
	int n_key;
	uint64_t epoch;         /* of the last qualifying direct pass, or of the capture */
	int seen;               /* qualifying direct passes at that epoch */
	int failed;             /* the capture failed at that epoch */
	void *exec;             /* the instance (captured at `epoch`), or NULL */
	int64_t *dg_used;       /* the device grouping's record of the captured pass */
	uint64_t dg_calls, dg_pairs;
	uint64_t last;          /* tick of the last use */
} ent;

struct moet_graphs {
	ent e[MAX_ENT];
	int32_t *key;           /* the current pass's key (grown with n_steps) */
	int cap_key, n_key;
	ent *cur;               /* this pass's entry */
	uint64_t tick;
	moet_graph_stats st;
};

int moet_graph_switch(int *out_on)
{
	static const char *const names[] = { "0", "1" };
	return moet_env_choice("MOET_CUDA_GRAPH", names, 2, out_on);
}

int moet_graph_needs(const char *var, const char *on_name, int *on)
{
	const char *v = getenv(var);
	int graph = 0, rc = moet_graph_switch(&graph);
	if (rc || !graph || *on)
		return rc;
	if (v && *v)
		return moet_err(MOET_EINVAL, "MOET_CUDA_GRAPH=1 needs %s=%s (or unset), not "
				"'%.40s'", var, on_name, v);
	*on = 1;
	return 0;
}

static void drop(moet_model *m, ent *e)
{
	if (e->exec)
		m->be->ops->graph_free(m->be, e->exec);
	free(e->key);
	free(e->dg_used);
	memset(e, 0, sizeof(*e));
}

void moet_graph_free(moet_model *m)
{
	moet_graphs *g = m->graphs;
	if (!g)
		return;
	for (int i = 0; i < MAX_ENT; i++)
		drop(m, &g->e[i]);
	free(g->key);
	free(g);
	m->graphs = NULL;
}

void moet_graph_stats_get(moet_model *m, moet_graph_stats *out, int reset)
{
	moet_graphs *g = m->graphs;
	memset(out, 0, sizeof(*out));
	if (!g)
		return;
	*out = g->st;
	if (reset)
		memset(&g->st, 0, sizeof(g->st));
}

/* The batch's key into g->key. */
static int make_key(moet_graphs *g, const moet_seq_step *steps, int n_steps)
{
	const int n = 1 + 2 * n_steps;
	if (n > g->cap_key) {
		int32_t *k = realloc(g->key, (size_t)n * sizeof(*k));
		if (!k)
			return moet_err(MOET_ENOMEM, "CUDA graph key");
		g->key = k;
		g->cap_key = n;
	}
	g->key[0] = n_steps;
	for (int s = 0; s < n_steps; s++) {
		const moet_seq_step *st = &steps[s];
		g->key[1 + 2 * s] = (int32_t)st->n_tok;
		g->key[2 + 2 * s] = (st->out_logits ? 1 : 0) | (st->last_only ? 2 : 0) |
				    (st->out_token ? 4 : 0);
	}
	g->n_key = n;
	return 0;
}

static ent *find(moet_graphs *g)
{
	for (int i = 0; i < MAX_ENT; i++) {
		ent *e = &g->e[i];
		if (e->key && e->n_key == g->n_key &&
		    !memcmp(e->key, g->key, (size_t)g->n_key * sizeof(*g->key)))
			return e;
	}
	return NULL;
}

/* A free entry, or the least recently used one emptied. */
static ent *take(moet_model *m, moet_graphs *g)
{
	ent *v = &g->e[0];
	for (int i = 0; i < MAX_ENT; i++) {
		if (!g->e[i].key) {
			v = &g->e[i];
			break;
		}
		if (g->e[i].last < v->last)
			v = &g->e[i];
	}
	if (v->key) {
		g->st.dropped += v->exec != NULL;
		drop(m, v);
	}
	v->key = malloc((size_t)g->n_key * sizeof(*v->key));
	if (!v->key)
		return NULL;
	memcpy(v->key, g->key, (size_t)g->n_key * sizeof(*v->key));
	v->n_key = g->n_key;
	return v;
}

int moet_graph_plan(moet_model *m, const moet_seq_step *steps, int n_steps, int n_mb,
		    moet_graph_mode *out)
{
	const moet_backend_ops *op = m->be->ops;
	int on = 0, rc = moet_graph_switch(&on);
	*out = MOET_GRAPH_OFF;
	/* NOTE: a pass over MOET_TP ranks is not captured (its work spans several devices) */
	if (rc || !on || n_mb != 1 || m->route_fn || !op->capture_begin || m->tp)
		return rc;
	if (!m->graphs && !(m->graphs = calloc(1, sizeof(*m->graphs))))
		return moet_err(MOET_ENOMEM, "CUDA graph cache");
	moet_graphs *g = m->graphs;
	if ((rc = make_key(g, steps, n_steps)))
		return rc;
	ent *e = find(g);
	if (!e && !(e = take(m, g)))
		return moet_err(MOET_ENOMEM, "CUDA graph cache entry");
	e->last = ++g->tick;
	g->cur = e;
	const uint64_t now = op->mem_epoch(m->be);
	if (e->epoch != now) { /* buffers changed since: start over at this epoch */
		if (e->exec) {
			op->graph_free(m->be, e->exec);
			e->exec = NULL;
			g->st.dropped++;
		}
		e->epoch = now;
		e->seen = 0;
		e->failed = 0;
	}
	*out = e->exec ? MOET_GRAPH_REPLAY
	       : (e->seen >= 1 && !e->failed) ? MOET_GRAPH_CAPTURE : MOET_GRAPH_DIRECT;
	return 0;
}

void moet_graph_direct_done(moet_model *m)
{
	moet_graphs *g = m->graphs;
	ent *e = g ? g->cur : NULL;
	if (!e)
		return;
	/* qualifies: every MoE layer went device-grouped, and nothing was allocated meanwhile
	 * (a pass that grew a buffer counts from the next one) */
	const uint64_t now = m->be->ops->mem_epoch(m->be);
	e->seen = moet_devgroup_pass_all(m) && e->epoch == now ? e->seen + 1 : 0;
	e->epoch = now;
	g->cur = NULL;
}

int moet_graph_capture_begin(moet_model *m, moet_graph_rec *rec)
{
	moet_graphs *g = m->graphs;
	moet_devgroup_pass_save(m, NULL, &rec->dg_calls, &rec->dg_pairs);
	int rc = m->be->ops->capture_begin(m->be);
	if (rc) {
		snprintf(g->st.last_error, sizeof(g->st.last_error), "%s", moet_errmsg());
		g->cur->failed = 1;
		g->cur = NULL;
		g->st.failed++;
	}
	return rc;
}

int moet_graph_capture_end(moet_model *m, const moet_graph_rec *rec, int body_rc)
{
	moet_graphs *g = m->graphs;
	ent *e = g->cur;
	const int64_t L = m->cfg.num_hidden_layers;
	void *exec = NULL;
	int rc = m->be->ops->capture_end(m->be, &exec);
	uint64_t calls = 0, pairs = 0;
	g->cur = NULL;
	if (rc || body_rc)
		snprintf(g->st.last_error, sizeof(g->st.last_error), "%s", moet_errmsg());
	else if (!moet_devgroup_pass_all(m))
		snprintf(g->st.last_error, sizeof(g->st.last_error), "a MoE layer was not "
			 "grouped on the device");
	if (!rc && !body_rc && moet_devgroup_pass_all(m) &&
	    e->epoch == m->be->ops->mem_epoch(m->be)) {
		if (!e->dg_used)
			e->dg_used = malloc((size_t)(2 * L) * sizeof(*e->dg_used));
		if (e->dg_used) {
			moet_devgroup_pass_save(m, e->dg_used, &calls, &pairs);
			e->dg_calls = calls - rec->dg_calls;
			e->dg_pairs = pairs - rec->dg_pairs;
			e->exec = exec;
			g->st.captured++;
			return m->be->ops->graph_launch(m->be, exec);
		}
	}
	/* failed, or the body did something a replay could not repeat: run it directly */
	if (exec)
		m->be->ops->graph_free(m->be, exec);
	moet_devgroup_pass_restore(m, NULL, rec->dg_calls, rec->dg_pairs);
	e->failed = 1;
	g->st.failed++;
	return 1; /* the caller runs the body again, directly */
}

int moet_graph_replay(moet_model *m)
{
	moet_graphs *g = m->graphs;
	ent *e = g->cur;
	g->cur = NULL;
	uint64_t calls = 0, pairs = 0;
	moet_devgroup_pass_save(m, NULL, &calls, &pairs);
	moet_devgroup_pass_restore(m, e->dg_used, calls + e->dg_calls, pairs + e->dg_pairs);
	g->st.replayed++;
	return m->be->ops->graph_launch(m->be, e->exec);
}
