/*
 * devgroup.c: a MoE layer's routed experts grouped on the device (MOET_GPU_DEVGROUP=1; step 2
 * of the CUDA-graph plan in docs/cuda-graphs.md wired into the engine; bit-equal on the H200).
 *
 *   router ids (device) -> moet_gpu_group_pairs (owner NULL: every pair on device 0)
 *        -> pairs in (expert, pair) order, slot[pair] straight into the pass's slot buffer,
 *           device 0's experts by token-count class
 *   -> moet_gpu_experts_devgroup with the layer's expert table (device) -> y rows
 *   -> the canonical combine (forward.c, unchanged) through that slot table
 *
 * Today's path (dispatch.c) downloads the ids, sorts the pairs on the host (the same order:
 * moet_expert_pairs_sort's), uploads the tokens and the slot table and calls the grouped
 * kernels with host tables; the device path runs the same kernels' arithmetic on the same
 * y rows, so the bits are the same by construction (tests/gpu/test_gpu_hybrid.c compares).
 *
 * A layer qualifies when every one of its routed experts is on GPU 0 with weights bound
 * there (no placement, or an owner row of zeros: then there is no CPU tier, no other device
 * and nothing to stage, as those take only pairs of experts of owner != 0), and the call has
 * no NVMe tier, no shadow check and the exact expert mode; anything else takes today's path.
 *
 * With a CPU tier (owners 0 and -1 only, one device; every MoE layer of the model so, so that
 * no layer of a pass takes today's path on the same call slot; a call of at most
 * CPU_TIER_MAX_ROWS rows or fewer than prefill staging's n0: no cold expert is staged on this
 * path, its pairs stay on the CPU, the same bits), the grouping takes the layer's owner row
 * (device copy) and the CPU tier runs with no host decision between kernels:
 *
 *   grouping (device 0's pairs, then the CPU tier's)
 *   -> moet_gpu_tier_rows_out: the tier's pairs, count and rows into the hybrid engine's
 *      pinned staging of the slot (a kernel writing host memory)
 *   -> host function moet_hybrid_dev_begin: the executor's jobs started from there
 *   -> device 0's expert call; forward.c queues the shared experts
 *   moet_devgroup_finish (before the combine):
 *   -> host function moet_hybrid_dev_finish: waits for the executor
 *   -> moet_gpu_tier_rows_in: the rows into y at the tier's positions (a kernel reading host
 *      memory)
 *
 * so a CUDA graph of the pass holds the CPU tier's work as host nodes (graph.c). The rows are
 * the executor's contract results in the grouping's tier order, which is the host grouping's
 * (expert, pair) order: the same y rows and slots as today's path, the same bits.
 *
 * The expert tables of all layers are one backend block, built and uploaded at the first
 * device-grouped call after the experts or the placement were bound and freed when the
 * placement changes (moet_devgroup_reset) or the model closes. The grouping's outputs and
 * scratch are one backend block grown with the batch (never shrunk). The device's error words
 * (per micro-batch slot and layer: the grouping's 3, the expert call's 1) are read once per
 * forward pass, after the logits (moet_devgroup_check), never in between.
 *
 * NOTE: both micro-batches of a pass share the grouping's block: they run on the backend's one
 * stream, and each layer's grouping is consumed by its expert call queued right after it
 * (the slot table, read later by the combine, is the micro-batch's own buffer).
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_gpu.h"

#define N_WORDS 4 /* per slot and layer: the grouping's err[3], the expert call's err[1] */
/* A call with a CPU tier goes device-grouped up to this many rows (decode batches: no cold
 * expert is staged there) or below prefill staging's n0; longer ones take today's path, where
 * staging may move cold experts to the GPU */
#define CPU_TIER_MAX_ROWS 256

struct moet_devgroup {
	int built;                   /* tables built for the experts bound now */
	uint8_t *ok;                 /* [L]: layer l qualifies */
	moet_gpu_expert_geom *geom;  /* [L] */
	moet_gpu_expert_ptrs *table; /* backend [L][E] (zeros for layers that do not qualify) */
	int32_t *err;                /* backend [2][L][N_WORDS] */
	int32_t *err_h;              /* host copy */
	int64_t *used;               /* [2][L]: the call's pairs when written in this pass, or 0 */
	void *blk;                   /* backend: grouping outputs but slot and err, scratches */
	int64_t cap_pairs;
	moet_gpu_group_bufs g;       /* into blk */
	void *gscr, *hscr;
	size_t gscr_bytes, hscr_bytes;
	uint64_t calls;              /* device-grouped layer calls (moet_model_hybrid_stats) */
	/* with a CPU tier */
	uint8_t *cpu;                /* [L]: layer l qualifies with a CPU tier */
	int16_t *owner;              /* backend [L][E]: the placement's rows, when any cpu[l] */
	int32_t *keep;               /* backend [2][2]: each slot's CPU tier (first, count) */
	moet_hybrid_dev *dc;         /* [2][L]: the host functions' contexts */
	int grouped[2];              /* per slot: its last dispatch went device-grouped */
	int64_t cpu_layer[2];        /* per slot: 1 + the layer whose CPU tier awaits its finish */
	float *cpu_y[2], *cpu_rows[2];
	int64_t cpu_max[2];
};

/* MOET_GPU_DEVGROUP's index + 1 once read (0: not yet). NOTE: a cache, the one mutable static
 * of this file: the switch is asked at every MoE layer call, a getenv each time otherwise.
 * Racing readers store the same value, accesses are atomic; a refused value is not kept, so the
 * refusal, naming it, comes again at every call until it is fixed. moet_devgroup_env_reset
 * forgets it (tests that change the variable). */
static int env_on_p1;

int moet_devgroup_switch(int *out_on)
{
	static const char *const names[] = { "0", "1" };
	int v = __atomic_load_n(&env_on_p1, __ATOMIC_RELAXED);
	if (v > 0) {
		*out_on = v - 1;
		return 0;
	}
	int rc = moet_env_choice("MOET_GPU_DEVGROUP", names, 2, out_on);
	/* MOET_CUDA_GRAPH=1 captures passes whose experts are grouped on the device */
	if (!rc)
		rc = moet_graph_needs("MOET_GPU_DEVGROUP", "1", out_on);
	if (!rc)
		__atomic_store_n(&env_on_p1, *out_on + 1, __ATOMIC_RELAXED);
	return rc;
}

void moet_devgroup_env_reset(void)
{
	__atomic_store_n(&env_on_p1, 0, __ATOMIC_RELAXED);
}

static void release(moet_model *m, void **p)
{
	if (*p)
		m->be->ops->free(m->be, *p);
	*p = NULL;
}

void moet_devgroup_reset(moet_model *m)
{
	moet_devgroup *d = m->dg;
	if (!d)
		return;
	release(m, (void **)&d->table);
	release(m, (void **)&d->owner);
	free(d->ok);
	free(d->geom);
	free(d->cpu);
	free(d->dc);
	d->ok = NULL;
	d->geom = NULL;
	d->cpu = NULL;
	d->dc = NULL;
	d->built = 0;
}

void moet_devgroup_free(moet_model *m)
{
	moet_devgroup *d = m->dg;
	if (!d)
		return;
	moet_devgroup_reset(m);
	release(m, (void **)&d->err);
	release(m, (void **)&d->keep);
	release(m, &d->blk);
	free(d->err_h);
	free(d->used);
	free(d);
	m->dg = NULL;
}

uint64_t moet_devgroup_calls(const moet_model *m, int reset)
{
	uint64_t n = m->dg ? m->dg->calls : 0;
	if (m->dg && reset)
		m->dg->calls = 0;
	return n;
}

/* Layer l's table into tab[E] if every routed expert is on GPU 0 and bound, or (one device,
 * the hybrid engine there) on the CPU tier; ok[l] says so, cpu[l] whether some are on the CPU;
 * *has_cpu = 1 if the layer has CPU-tier experts, qualifying or not. */
static int build_layer(moet_model *m, int64_t l, moet_gpu_expert *v, moet_gpu_expert_ptrs *tab,
		       int *has_cpu)
{
	const int64_t E = m->cfg.n_routed_experts;
	const moet_layer_w *lw = &m->layers[l];
	moet_devgroup *d = m->dg;
	const int cpu_ok = m->hy && m->n_devices == 1;
	if (!lw->is_moe)
		return 0;
	int cpu = 0;
	for (int64_t e = 0; m->owner && e < E; e++)
		cpu |= m->owner[l * E + e] < 0;
	*has_cpu = cpu;
	if (E > MOET_GPU_GROUP_MAX_EXP || (cpu && !cpu_ok))
		return 0;
	for (int64_t e = 0; e < E; e++) {
		const moet_ffn_w *w = &lw->experts[e];
		const int own = m->owner ? m->owner[l * E + e] : 0;
		if (own < 0) {
			v[e] = (moet_gpu_expert){ 0 }; /* not resident: the CPU tier's */
			continue;
		}
		if (own != 0 || !w->gate.data)
			return 0;
		v[e] = (moet_gpu_expert){ w->gate, w->up, w->down, 0 };
	}
	int rc = moet_gpu_expert_table(v, E, tab, &d->geom[l]);
	if (rc == MOET_EUNSUP || rc == MOET_EINVAL || rc == MOET_ESHAPE)
		return 0; /* a form the device-grouped kernels lack (or no expert on GPU 0) */
	d->ok[l] = !rc;
	d->cpu[l] = (uint8_t)(!rc && cpu);
	return rc;
}

/* The tables of every layer: built on the host, uploaded once. */
static int build(moet_model *m)
{
	const int64_t L = m->cfg.num_hidden_layers, E = m->cfg.n_routed_experts;
	moet_devgroup *d = m->dg;
	moet_gpu_expert *v = malloc((size_t)E * sizeof(*v));
	moet_gpu_expert_ptrs *tab = calloc((size_t)(L * E), sizeof(*tab));
	d->ok = calloc((size_t)L, sizeof(*d->ok));
	d->geom = calloc((size_t)L, sizeof(*d->geom));
	d->cpu = calloc((size_t)L, sizeof(*d->cpu));
	int rc = (!v || !tab || !d->ok || !d->geom || !d->cpu)
			 ? moet_err(MOET_ENOMEM, "device grouping tables") : 0;
	int mixed = 0, any_cpu = 0; /* a layer with a CPU tier that does not qualify */
	for (int64_t l = 0; l < L && !rc; l++) {
		int has_cpu = 0;
		rc = build_layer(m, l, v, tab + l * E, &has_cpu);
		mixed |= has_cpu && !d->ok[l];
		any_cpu |= d->cpu[l];
	}
	/* NOTE: a layer on today's path would use the hybrid engine's call slot from the driving
	 * thread while a host function of another layer may still hold it: all or none */
	for (int64_t l = 0; l < L && mixed; l++)
		if (d->cpu[l])
			d->ok[l] = d->cpu[l] = 0;
	any_cpu &= !mixed;
	const size_t bytes = (size_t)(L * E) * sizeof(*tab);
	if (!rc && !(rc = m->be->ops->alloc(m->be, bytes, (void **)&d->table)))
		rc = m->be->ops->upload(m->be, d->table, tab, bytes);
	if (!rc && any_cpu) {
		const size_t ob = (size_t)(L * E) * sizeof(*m->owner);
		if (!(rc = m->be->ops->alloc(m->be, ob, (void **)&d->owner)))
			rc = m->be->ops->upload(m->be, d->owner, m->owner, ob);
		if (!rc && !d->keep)
			rc = m->be->ops->alloc(m->be, 4 * sizeof(*d->keep), (void **)&d->keep);
		if (!rc && !(d->dc = calloc((size_t)(2 * L), sizeof(*d->dc))))
			rc = moet_err(MOET_ENOMEM, "device grouping: CPU tier contexts");
		for (int64_t i = 0; !rc && i < 2 * L; i++)
			d->dc[i] = (moet_hybrid_dev){ .hy = m->hy, .slot = (int)(i / L),
						      .table = m->layers[i % L].experts_host };
	}
	free(v);
	free(tab);
	if (rc)
		moet_devgroup_reset(m);
	d->built = !rc;
	return rc;
}

static size_t up256(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

/* The grouping's outputs (but slot and err) and both scratches for P pairs, one block. */
static int ensure_blk(moet_model *m, int64_t P)
{
	moet_devgroup *d = m->dg;
	const int64_t E = m->cfg.n_routed_experts, I = m->cfg.moe_intermediate_size;
	if (P <= d->cap_pairs)
		return 0;
	size_t gs = 0;
	int rc = moet_gpu_group_scratch_bytes(P, E, &gs);
	if (rc)
		return rc;
	const size_t hs = moet_gpu_expert_scratch_bytes(P, I), X = (size_t)E;
	const size_t len[10] = { (size_t)P * sizeof(moet_gpu_pair), 8, 8,
				 X * sizeof(moet_gpu_group_exp), X * sizeof(moet_gpu_group_exp),
				 MOET_GPU_GROUP_N_CLASS * 4, MOET_GPU_GROUP_N_CLASS * 4, 4, gs, hs };
	size_t off[10], at = 0;
	for (int i = 0; i < 10; i++) {
		off[i] = at;
		at += up256(len[i]);
	}
	release(m, &d->blk);
	d->cap_pairs = 0;
	if ((rc = m->be->ops->alloc(m->be, at, &d->blk)))
		return rc;
	char *b = d->blk;
	d->g = (moet_gpu_group_bufs){ .pairs = (moet_gpu_pair *)(b + off[0]),
		.tier_first = (int32_t *)(b + off[1]), .tier_count = (int32_t *)(b + off[2]),
		.dev0 = (moet_gpu_group_exp *)(b + off[3]),
		.dev0_class = (moet_gpu_group_exp *)(b + off[4]),
		.class_first = (int32_t *)(b + off[5]), .class_count = (int32_t *)(b + off[6]),
		.n_dev0 = (int32_t *)(b + off[7]) };
	d->gscr = b + off[8];
	d->gscr_bytes = gs;
	d->hscr = b + off[9];
	d->hscr_bytes = hs;
	d->cap_pairs = P;
	return 0;
}

/* The state and the error words, once per model. */
static int ensure_state(moet_model *m)
{
	const int64_t L = m->cfg.num_hidden_layers;
	if (m->dg)
		return 0;
	moet_devgroup *d = calloc(1, sizeof(*d));
	if (!d)
		return moet_err(MOET_ENOMEM, "device grouping state");
	m->dg = d;
	const size_t words = (size_t)(2 * L * N_WORDS);
	d->err_h = malloc(words * sizeof(*d->err_h));
	d->used = calloc((size_t)(2 * L), sizeof(*d->used));
	if (!d->err_h || !d->used)
		return moet_err(MOET_ENOMEM, "device grouping state");
	return m->be->ops->alloc(m->be, words * sizeof(*d->err), (void **)&d->err);
}

int moet_devgroup_dispatch(moet_model *m, int64_t l, const int32_t *ids, int64_t n,
			   const float *h, float *y, int32_t *slot, int *out_done)
{
	const moet_config *c = &m->cfg;
	const int64_t k = c->num_experts_per_tok, P = n * k, L = c->num_hidden_layers;
	int on = 0, fast = 0;
	int rc = moet_devgroup_switch(&on);
	*out_done = 0;
	if (rc || !on || m->be->ops->host_memory || m->xtier || m->shadow || P < 1 ||
	    P > MOET_GPU_GROUP_MAX_PAIRS || (rc = moet_gpu_expert_mode(&fast)) || fast)
		return rc;
	if ((rc = ensure_state(m)) || (!m->dg->built && (rc = build(m))))
		return rc;
	moet_devgroup *d = m->dg;
	if (!d->ok[l])
		return 0;
	const int64_t st_min = d->cpu[l] ? moet_hybrid_stage_min(m->hy) : 0;
	if (st_min && n >= st_min && n > CPU_TIER_MAX_ROWS)
		return 0; /* a long call: today's path, whose staging may take cold experts */
	if ((rc = ensure_blk(m, P)))
		return rc;
	const int sl = m->mb_slot;
	moet_expert_pair *hp = NULL;
	int32_t *hc = NULL;
	float *hr = NULL;
	if (d->cpu[l] && (rc = moet_hybrid_dev_prepare(m->hy, sl, m->be, P, &hp, &hc, &hr)))
		return rc;
	/* NOTE: tests only (as MOET_SHADOW_FAULT): a bound below the batch's experts' pairs, so
	 * the expert call reports OVER_MAX and the pass fails with the layer named */
	const char *fault = getenv("MOET_GPU_DEVGROUP_FAULT");
	const int64_t max_tok = fault && !strcmp(fault, "1") ? 1 : n;
	const int64_t at = (int64_t)m->mb_slot * L + l;
	int32_t *err = d->err + at * N_WORDS;
	moet_gpu_group_bufs g = d->g;
	g.slot = slot;
	g.err = err;
	if ((rc = moet_gpu_group_pairs(ids, P, c->n_routed_experts,
				       d->cpu[l] ? d->owner + l * c->n_routed_experts : NULL, 1,
				       d->gscr, d->gscr_bytes, &g, NULL)))
		return rc;
	/* NOTE: moet_gpu_pair has moet_expert_pair's layout (moet_gpu.h) */
	if (d->cpu[l] &&
	    ((rc = moet_gpu_tier_rows_out(&g, 1, P, k, h, c->hidden_size, (moet_gpu_pair *)hp,
					  hc, hr, d->keep + 2 * sl, NULL)) ||
	     (rc = moet_gpu_host_fn(moet_hybrid_dev_begin, &d->dc[sl * L + l], NULL))))
		return rc;
	/* from here on the finish must be queued, whatever fails (a failed pass calls
	 * moet_moe_dispatch_finish) */
	d->grouped[sl] = 1;
	if (m->tier_pairs) /* device 0's, as run_tier counts them; the CPU tier's moved to */
		m->tier_pairs[1] += (uint64_t)P; /* tier_pairs[0] at moet_devgroup_check */
	if (d->cpu[l]) {
		d->cpu_layer[sl] = l + 1;
		d->cpu_y[sl] = y;
		d->cpu_rows[sl] = hr;
		d->cpu_max[sl] = P;
	}
	d->used[at] = max_tok;
	if ((rc = moet_gpu_experts_devgroup(&d->geom[l], d->table + l * c->n_routed_experts, &g,
					    P, k, max_tok, h, n, d->hscr, d->hscr_bytes, y,
					    err + 3, NULL)))
		return rc;
	d->calls++;
	*out_done = 1;
	return 0;
}

int moet_devgroup_finish(moet_model *m, int *out_grouped)
{
	moet_devgroup *d = m->dg;
	const int sl = m->mb_slot;
	*out_grouped = 0;
	if (!d || !d->grouped[sl])
		return 0;
	*out_grouped = 1;
	d->grouped[sl] = 0;
	if (!d->cpu_layer[sl])
		return 0;
	const int64_t l = d->cpu_layer[sl] - 1, L = m->cfg.num_hidden_layers;
	d->cpu_layer[sl] = 0;
	int rc = moet_gpu_host_fn(moet_hybrid_dev_finish, &d->dc[sl * L + l], NULL);
	return rc ? rc : moet_gpu_tier_rows_in(d->keep + 2 * sl, d->cpu_max[sl], d->cpu_rows[sl],
					       m->cfg.hidden_size, d->cpu_y[sl], NULL);
}

/* The first fault in the words of one slot and layer, as a MOET_EDEVICE message. */
static int report(const moet_model *m, int64_t l, const int32_t *w, int64_t max_tok)
{
	const long long E = (long long)m->cfg.n_routed_experts;
	if (w[0] & MOET_GPU_GROUP_BAD_ID)
		return moet_err(MOET_EDEVICE, "MOET_GPU_DEVGROUP=1: layer %lld: routed expert id "
				"outside [0, %lld) at pair %d (device grouping)", (long long)l, E,
				w[1]);
	if (w[0])
		return moet_err(MOET_EDEVICE, "MOET_GPU_DEVGROUP=1: layer %lld: device grouping "
				"error flags %d (expert %d)", (long long)l, w[0], w[2]);
	if (w[3] & MOET_GPU_DEVGROUP_OVER_MAX)
		return moet_err(MOET_EDEVICE, "MOET_GPU_DEVGROUP=1: layer %lld: an expert had more "
				"than %lld pairs, its rows not computed (device-grouped experts)",
				(long long)l, (long long)max_tok);
	if (w[3] & MOET_GPU_DEVGROUP_ABSENT)
		return moet_err(MOET_EDEVICE, "MOET_GPU_DEVGROUP=1: layer %lld: a routed expert "
				"with no weights on GPU 0 (device-grouped experts)", (long long)l);
	return moet_err(MOET_EDEVICE, "MOET_GPU_DEVGROUP=1: layer %lld: device-grouped experts "
			"error flags %d", (long long)l, w[3]);
}

int moet_devgroup_check(moet_model *m, int discard)
{
	moet_devgroup *d = m->dg;
	const int64_t L = m->cfg.num_hidden_layers;
	int any = 0, rc = 0;
	for (int64_t i = 0; d && i < 2 * L; i++)
		any |= d->used[i] != 0;
	if (!any)
		return 0;
	/* NOTE: the download waits for the stream, the CPU tier's host functions included, before
	 * their contexts are read (also when discarding) */
	if (!discard || d->dc)
		rc = m->be->ops->download(m->be, d->err_h, d->err,
					  (size_t)(2 * L * N_WORDS) * sizeof(*d->err_h));
	for (int64_t i = 0; i < 2 * L; i++) {
		const int32_t *w = d->err_h + i * N_WORDS;
		moet_hybrid_dev *dc = d->dc ? &d->dc[i] : NULL;
		if (!rc && !discard && d->used[i] && (w[0] || w[3]))
			rc = report(m, i % L, w, d->used[i]);
		if (dc && dc->rc && !rc && !discard)
			rc = moet_err(dc->rc, "layer %lld: the CPU tier of a device-grouped layer: "
				      "%s", (long long)(i % L), dc->msg);
		if (dc) {
			dc->rc = 0;
			if (m->tier_pairs) { /* the CPU tier's pairs were counted as device 0's */
				m->tier_pairs[0] += dc->st.cpu_pairs;
				m->tier_pairs[1] -= dc->st.cpu_pairs;
			}
			moet_hybrid_dev_collect(dc);
		}
		d->used[i] = 0;
	}
	return rc;
}

int moet_devgroup_pass_all(const moet_model *m)
{
	const moet_devgroup *d = m->dg;
	const int64_t L = m->cfg.num_hidden_layers;
	int any = 0;
	for (int64_t l = 0; d && d->built && l < L; l++) {
		if (!m->layers[l].is_moe)
			continue;
		if (!d->used[l]) /* slot 0's record of layer l */
			return 0;
		any = 1;
	}
	return any;
}

void moet_devgroup_pass_save(const moet_model *m, int64_t *used, uint64_t *out_calls,
			     uint64_t *out_pairs)
{
	const moet_devgroup *d = m->dg;
	if (used && d)
		memcpy(used, d->used, (size_t)(2 * m->cfg.num_hidden_layers) * sizeof(*used));
	*out_calls = d ? d->calls : 0;
	*out_pairs = m->tier_pairs ? m->tier_pairs[1] : 0;
}

void moet_devgroup_pass_restore(moet_model *m, const int64_t *used, uint64_t calls,
				uint64_t pairs)
{
	moet_devgroup *d = m->dg;
	if (used && d)
		memcpy(d->used, used, (size_t)(2 * m->cfg.num_hidden_layers) * sizeof(*used));
	if (d)
		d->calls = calls;
	if (m->tier_pairs)
		m->tier_pairs[1] = pairs;
}
