/*
 * xtier.c: the NVMe expert tier's layout and life cycle (moet_xtier.h): where each expert's
 * bytes are in the shards, how they sit in a slot, the slots themselves, the warm fill, and
 * the read of one expert into one slot. The cache policy and the prefetch are in xtier_run.c.
 *
 * File offsets: moet_uring_shard_maps (the tensor's pointer minus its shard's data-buffer
 * start, plus 8 + the header length). NOTE: computed from pointers only: the expert bytes of
 * the mapping are never touched, so they never enter the page cache through it.
 *
 * Slot layout of one expert (segments: its tensors merged when they lie within
 * XT_MERGE_GAP of each other in one shard, typically one segment per expert):
 *
 *   slot:  [seg 0 span (aligned cover) ........][seg 1 span ...]...[unused up to slot_bytes]
 *          ^ slot_off 0   ^ + off % 4096: the segment's exact bytes, tensors at tpos[t]
 *
 * A tensor thus sits at the same address residue modulo 4096 as in the mapping, so the
 * kernels see the same alignment, and the views differ from experts_host only in pointers.
 *
 * The lookup trace and its hindsight bounds (moet_xtier_stats_bounds, issue 9) are here too:
 * acquire appends each lookup's key (xt_trace_add); MIN runs over the trace with a lazy
 * max-heap of (next use, key) entries: a hit pushes the key's new next use and leaves the old
 * entry stale (a stale entry is one whose next use is not the key's current one, or whose key
 * is no longer resident), so an eviction pops until it meets a live entry.
 */
#include "xtier_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "moet_env.h"
#include "moet_err.h"
#include "moet_profile.h"

#define REG_GROUP_BYTES (1ull << 30) /* the kernel's limit per registered buffer */
#define REG_STEP_BYTES (64ull << 20) /* a group registered while earlier ones are read */
#define REG_MAX_GROUPS 8192          /* the kernel's table holds 16384 */

static const char *const tensor_suffix[XT_TENSORS] = {
	"gate_proj.weight", "gate_proj.weight_scale_inv", "up_proj.weight",
	"up_proj.weight_scale_inv", "down_proj.weight", "down_proj.weight_scale_inv",
};

/* Fills x->info[l * E + e] for one expert: its tensors, segments and slot layout. */
static int expert_layout(moet_xtier *x, const moet_uring_shard_map *sp, int64_t l, int64_t e)
{
	const moet_ckpt *ck = x->m->ck;
	const moet_ffn_w *hv = &x->m->layers[l].experts_host[e];
	const moet_mat *mats[3] = { &hv->gate, &hv->up, &hv->down };
	xt_info *in = &x->info[l * x->E + e];
	struct { int file; uint64_t off; size_t bytes; int t; } tv[XT_TENSORS];
	int n = 0;
	char name[256];
	for (int t = 0; t < XT_TENSORS; t++) {
		const moet_mat *mm = mats[t / 2];
		const void *want = t % 2 ? (const void *)mm->scale_inv : mm->data;
		if (!want)
			continue; /* a weight without block scales */
		snprintf(name, sizeof(name), "model.layers.%lld.mlp.experts.%lld.%s", (long long)l,
			 (long long)e, tensor_suffix[t]);
		const moet_tensor *tt = moet_ckpt_get(ck, name);
		if (!tt || tt->data != want || !sp[tt->shard].base)
			return moet_err(MOET_EINVAL, "%s: tensor %s is not the one the model reads",
					moet_ckpt_dir(ck), name);
		uint64_t off = sp[tt->shard].data_start +
			       (uint64_t)((const uint8_t *)tt->data - sp[tt->shard].base);
		tv[n].file = tt->shard;
		tv[n].off = off;
		tv[n].bytes = tt->n_bytes;
		tv[n++].t = t;
		in->bytes += tt->n_bytes;
	}
	/* sort by (file, offset): insertion sort of at most six */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && (tv[j - 1].file > tv[j].file ||
					  (tv[j - 1].file == tv[j].file && tv[j - 1].off > tv[j].off));
		     j--) {
			__typeof__(tv[0]) tmp = tv[j];
			tv[j] = tv[j - 1];
			tv[j - 1] = tmp;
		}
	int seg_of[XT_TENSORS];
	in->n_seg = 0;
	for (int i = 0; i < n; i++) {
		xt_seg *last = in->n_seg ? &in->seg[in->n_seg - 1] : NULL;
		if (last && last->file == tv[i].file && tv[i].off >= last->off &&
		    tv[i].off <= last->off + last->bytes + XT_MERGE_GAP) {
			uint64_t end = tv[i].off + tv[i].bytes;
			if (end > last->off + last->bytes)
				last->bytes = (size_t)(end - last->off);
		} else {
			in->seg[in->n_seg++] = (xt_seg){ tv[i].file, tv[i].off, tv[i].bytes, 0 };
		}
		seg_of[i] = in->n_seg - 1;
	}
	size_t at = 0;
	for (int s = 0; s < in->n_seg; s++) {
		in->seg[s].slot_off = at;
		at += moet_uring_span(in->seg[s].off, in->seg[s].bytes);
	}
	in->slot_need = at;
	for (int i = 0; i < n; i++) {
		const xt_seg *sg = &in->seg[seg_of[i]];
		in->tpos[tv[i].t] = sg->slot_off + sg->off % MOET_URING_ALIGN +
				    (size_t)(tv[i].off - sg->off);
	}
	return 0;
}

/* Decodes a 1-D BF16/F16/F32 tensor of n values (NULL name or missing: fill). */
static int load_vec(const moet_ckpt *ck, const char *name, int64_t n, float fill, float **out)
{
	float *v = malloc((size_t)n * sizeof(float));
	if (!v)
		return moet_err(MOET_ENOMEM, "%s: %lld floats", name, (long long)n);
	const moet_tensor *t = moet_ckpt_get(ck, name);
	for (int64_t i = 0; i < n; i++) {
		if (!t || t->numel != n)
			v[i] = fill;
		else if (t->dtype == MOET_DT_BF16)
			v[i] = moet_dec_bf16(((const uint16_t *)t->data)[i]);
		else if (t->dtype == MOET_DT_F16)
			v[i] = moet_dec_f16(((const uint16_t *)t->data)[i]);
		else if (t->dtype == MOET_DT_F32)
			v[i] = ((const float *)t->data)[i];
		else
			v[i] = fill;
	}
	*out = v;
	return 0;
}

/* The predictor's host copies for MoE layer l: router view, bias, post-attention norm. */
static int predictor_layer(moet_xtier *x, int64_t l)
{
	const moet_ckpt *ck = x->m->ck;
	char name[160];
	snprintf(name, sizeof(name), "model.layers.%lld.mlp.gate.weight", (long long)l);
	const moet_tensor *t = moet_ckpt_get(ck, name);
	if (!t || t->ndim != 2 || t->shape[0] != x->E || t->shape[1] != x->H)
		return moet_err(MOET_ENOTFOUND, "%s: router %s", moet_ckpt_dir(ck), name);
	x->router[l] = (moet_mat){ .dtype = t->dtype, .rows = x->E, .cols = x->H,
				   .data = t->data };
	snprintf(name, sizeof(name), "model.layers.%lld.mlp.gate.weight_scale_inv", (long long)l);
	const moet_tensor *s = moet_ckpt_get(ck, name);
	if (t->dtype == MOET_DT_F8_E4M3)
		x->router[l].scale_inv = s ? s->data : NULL;
	int rc;
	snprintf(name, sizeof(name), "model.layers.%lld.mlp.gate.e_score_correction_bias",
		 (long long)l);
	if ((rc = load_vec(ck, name, x->E, 0.0f, &x->router_bias[l])))
		return rc;
	snprintf(name, sizeof(name), "model.layers.%lld.post_attention_layernorm.weight",
		 (long long)l);
	return load_vec(ck, name, x->H, 1.0f, &x->post_norm[l]);
}

static void on_read(void *ctx, const moet_uring_done *d)
{
	moet_xtier *x = ctx;
	xt_slot *sl = &x->slots[(intptr_t)d->range->user];
	if (d->rc) {
		sl->failed = 1;
		snprintf(x->err, sizeof(x->err), "%s", d->error);
	}
	if (--sl->segs_left)
		return;
	const int64_t l = sl->layer, e = sl->expert;
	/* the disk's busy time and delivered bytes (the prefetch budget's rate) */
	const size_t got_bytes = x->info[l * x->E + e].bytes;
	x->loading_bytes -= got_bytes;
	if (!sl->failed)
		x->io_bytes += got_bytes;
	if (--x->n_loading == 0)
		x->io_busy_ns += moet_now_ns() - x->io_busy_t0;
	if (sl->failed) {
		/* nothing of a failed read is handed out: the slot is free again */
		x->where[l * x->E + e] = -1;
		sl->state = XT_FREE;
		sl->layer = sl->expert = -1;
		sl->prefetched = 0;
		x->st.read_errors++;
		return;
	}
	const xt_info *in = &x->info[l * x->E + e];
	const uint8_t *base = x->mem + (size_t)(sl - x->slots) * x->slot_bytes;
	moet_ffn_w v = x->m->layers[l].experts_host[e];
	moet_mat *mats[3] = { &v.gate, &v.up, &v.down };
	for (int i = 0; i < 3; i++) {
		mats[i]->data = base + in->tpos[2 * i];
		if (mats[i]->scale_inv)
			mats[i]->scale_inv = (const float *)(base + in->tpos[2 * i + 1]);
	}
	sl->views = v;
	sl->state = XT_READY;
	x->st.bytes_read += in->bytes;
}

int xt_load(moet_xtier *x, int64_t s, int64_t l, int64_t e, int demand)
{
	if (x->tr_cap > 0 && !x->st.trace_cut)
		x->st.trace_fetches++;
	const xt_info *in = &x->info[l * x->E + e];
	xt_slot *sl = &x->slots[s];
	moet_uring_range r[XT_TENSORS];
	uint8_t *base = x->mem + (size_t)s * x->slot_bytes;
	for (int i = 0; i < in->n_seg; i++)
		r[i] = (moet_uring_range){ .file = in->seg[i].file, .offset = in->seg[i].off,
					   .n_bytes = in->seg[i].bytes,
					   .buf = base + in->seg[i].slot_off,
					   .user = (void *)(intptr_t)s };
	int rc = moet_uring_submit(x->u, r, (size_t)in->n_seg, on_read, x);
	if (rc)
		return rc;
	if (sl->state == XT_READY)
		x->where[sl->layer * x->E + sl->expert] = -1;
	if (x->n_loading++ == 0)
		x->io_busy_t0 = moet_now_ns();
	x->loading_bytes += in->bytes;
	*sl = (xt_slot){ .layer = l, .expert = e, .state = XT_LOADING, .demand = demand,
			 .prefetched = !demand, .segs_left = (unsigned)in->n_seg,
			 .last_use = sl->last_use, .pins = sl->pins, .round = sl->round };
	x->where[l * x->E + e] = (int32_t)s;
	return 0;
}

typedef struct warm_item {
	double value;
	int64_t l, e;
} warm_item;

static int cmp_warm(const void *a, const void *b)
{
	const warm_item *p = a, *q = b;
	if (p->value != q->value)
		return p->value > q->value ? -1 : 1;
	return p->l != q->l ? (p->l < q->l ? -1 : 1) : (p->e < q->e ? -1 : p->e > q->e);
}

/* Registers the next slot group (sparse registration of a warm fill). */
static int register_next(moet_xtier *x)
{
	int g = x->reg_done++;
	int rc = moet_uring_register_one(x->u, g, x->reg_buf[g], x->reg_bytes[g]);
	x->st.registered = moet_uring_registered(x->u);
	return rc;
}

/* Reads the hottest tier experts (by the prior) into the slots, all of them in flight. */
static int warm_fill(moet_xtier *x)
{
	warm_item *w = malloc((size_t)(x->L * x->E) * sizeof(*w));
	if (!w)
		return moet_err(MOET_ENOMEM, "warm fill list");
	int64_t n = 0;
	uint64_t total = 0, done_bytes = 0;
	for (int64_t l = 0; l < x->L; l++)
		for (int64_t e = 0; x->m->layers[l].is_moe && e < x->E; e++)
			if (xt_is_cpu(x, l, e))
				w[n++] = (warm_item){ xt_value(x, l, e, 0), l, e };
	qsort(w, (size_t)n, sizeof(*w), cmp_warm);
	if (n > x->n_slots)
		n = x->n_slots;
	for (int64_t i = 0; i < n; i++)
		total += x->info[w[i].l * x->E + w[i].e].bytes;
	uint64_t t0 = moet_now_ns();
	int rc = 0;
	for (int64_t i = 0; i < n && !rc; i++) {
		/* NOTE: the reads queued so far go to the kernel before the next group is pinned */
		if (x->reg_done < x->n_reg && i == (int64_t)x->reg_done * x->reg_per) {
			int got = moet_uring_poll(x->u, 0);
			rc = got < 0 ? got : register_next(x);
		}
		if (!rc)
			rc = xt_load(x, i, w[i].l, w[i].e, 0);
	}
	while (!rc && x->reg_done < x->n_reg) /* slots beyond the warm set */
		rc = register_next(x);
	while (!rc && moet_uring_pending(x->u)) {
		int got = moet_uring_poll(x->u, 1);
		if (got < 0)
			rc = got;
		if (x->o.progress && got > 0) {
			done_bytes = x->st.bytes_read;
			x->o.progress(x->o.progress_ctx, done_bytes, total);
		}
	}
	if (!rc && moet_uring_drain(x->u))
		rc = moet_err(MOET_EIO, "warm fill: %s", x->err);
	for (int64_t i = 0; i < n; i++)
		x->slots[i].prefetched = 0;
	x->st.warm_reads = (uint64_t)n;
	x->st.warm_ns = moet_now_ns() - t0;
	free(w);
	return rc;
}

static int alloc_slots(moet_xtier *x)
{
	size_t total = (size_t)x->n_slots * x->slot_bytes;
	void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return moet_err(MOET_ENOMEM, "expert slots: %lld x %zu bytes: %s",
				(long long)x->n_slots, x->slot_bytes, strerror(errno));
	x->mem = p;
	/* NOTE: the policy goes on before anything (huge-page advice, registration, reads)
	 * can fault a page in */
	int rc = xt_numa_place(x, total);
	if (rc)
		return rc;
	madvise(p, total, MADV_HUGEPAGE); /* advice only: may be refused */
	x->slots = calloc((size_t)x->n_slots, sizeof(*x->slots));
	x->pinned = calloc((size_t)x->n_slots, sizeof(*x->pinned));
	x->pinned_e = calloc((size_t)x->n_slots + 1, sizeof(*x->pinned_e));
	if (!x->slots || !x->pinned || !x->pinned_e)
		return moet_err(MOET_ENOMEM, "%lld expert slots", (long long)x->n_slots);
	for (int64_t s = 0; s < x->n_slots; s++)
		x->slots[s].layer = x->slots[s].expert = -1;
	if (x->o.no_register)
		return 0;
	/* registered in groups of whole slots: up to 1 GiB (the kernel's limit) when all are
	 * registered at once; before a warm fill REG_STEP_BYTES, each registered just before its
	 * slots' reads start (warm_fill), so that pinning (every page faulted in: 2.5-23 s for
	 * 5.6 GB on the development VM) overlaps with the reads of the groups before it */
	const int overlap = !x->o.no_warm;
	const uint64_t step = overlap ? REG_STEP_BYTES : REG_GROUP_BYTES;
	int64_t per = x->slot_bytes >= step ? 1 : (int64_t)(step / x->slot_bytes);
	if (overlap && (x->n_slots + per - 1) / per > REG_MAX_GROUPS)
		per = (x->n_slots + REG_MAX_GROUPS - 1) / REG_MAX_GROUPS;
	const int n = (int)((x->n_slots + per - 1) / per);
	x->reg_buf = malloc((size_t)n * sizeof(*x->reg_buf));
	x->reg_bytes = malloc((size_t)n * sizeof(*x->reg_bytes));
	if (!x->reg_buf || !x->reg_bytes)
		return moet_err(MOET_ENOMEM, "slot registration");
	for (int i = 0; i < n; i++) {
		int64_t first = i * per, cnt = x->n_slots - first < per ? x->n_slots - first : per;
		x->reg_buf[i] = x->mem + (size_t)first * x->slot_bytes;
		x->reg_bytes[i] = (size_t)cnt * x->slot_bytes;
	}
	x->n_reg = n;
	x->reg_per = per;
	rc = overlap ? moet_uring_register_sparse(x->u, n)
		     : moet_uring_register(x->u, x->reg_buf, x->reg_bytes, n);
	x->reg_done = overlap ? 0 : n;
	x->st.registered = moet_uring_registered(x->u);
	return rc;
}

/* Layout of every MoE layer's experts, the predictor's copies, the prior. */
static int build(moet_xtier *x)
{
	const int64_t L = x->L, E = x->E;
	const int n_sh = moet_ckpt_shard_count(x->m->ck);
	moet_uring_shard_map *sp = calloc((size_t)(n_sh ? n_sh : 1), sizeof(*sp));
	x->info = calloc((size_t)(L * E), sizeof(*x->info));
	x->where = malloc((size_t)(L * E) * sizeof(*x->where));
	x->prior = calloc((size_t)(L * E), sizeof(*x->prior));
	x->prior_tot = calloc((size_t)L, sizeof(*x->prior_tot));
	x->obs = calloc((size_t)(L * E), sizeof(*x->obs));
	x->obs_tot = calloc((size_t)L, sizeof(*x->obs_tot));
	x->next_moe = malloc((size_t)L * sizeof(*x->next_moe));
	x->router = calloc((size_t)L, sizeof(*x->router));
	x->router_bias = calloc((size_t)L, sizeof(*x->router_bias));
	x->post_norm = calloc((size_t)L, sizeof(*x->post_norm));
	x->pred = calloc((size_t)E, sizeof(*x->pred));
	x->table = calloc((size_t)E, sizeof(*x->table));
	int rc = 0;
	if (!sp || !x->info || !x->where || !x->prior || !x->prior_tot || !x->obs ||
	    !x->obs_tot || !x->next_moe || !x->router || !x->router_bias || !x->post_norm ||
	    !x->pred || !x->table) {
		rc = moet_err(MOET_ENOMEM, "NVMe tier tables");
		goto out;
	}
	for (int64_t i = 0; i < L * E; i++)
		x->where[i] = -1;
	if ((rc = moet_uring_shard_maps(x->m->ck, sp)))
		goto out;
	for (int i = 0; i < n_sh; i++) {
		int id;
		if ((rc = moet_uring_open(x->u, moet_ckpt_shard_path(x->m->ck, i), &id)))
			goto out;
	}
	x->st.direct = 1;
	for (int i = 0; i < n_sh; i++)
		x->st.direct &= moet_uring_file_direct(x->u, i);
	int64_t next = -1;
	for (int64_t l = L - 1; l >= 0; l--) {
		x->next_moe[l] = next;
		if (!x->m->layers[l].is_moe)
			continue;
		next = l;
		x->n_moe++;
		if ((rc = predictor_layer(x, l)))
			goto out;
		for (int64_t e = 0; e < E; e++) {
			if ((rc = expert_layout(x, sp, l, e)))
				goto out;
			const xt_info *in = &x->info[l * E + e];
			if (in->slot_need > x->slot_bytes)
				x->slot_bytes = in->slot_need;
			if (xt_is_cpu(x, l, e)) {
				x->st.tier_experts++;
				x->st.tier_bytes += in->bytes;
			}
		}
	}
	x->slot_bytes = (x->slot_bytes + MOET_URING_ALIGN - 1) / MOET_URING_ALIGN *
			MOET_URING_ALIGN;
out:
	free(sp);
	return rc;
}

static int use_profile(moet_xtier *x, const moet_profile *p)
{
	int rc = moet_profile_check(p, &x->m->cfg, "RAM budget profile");
	if (rc)
		return rc;
	for (int ph = 0; ph < MOET_PROFILE_PHASES; ph++)
		for (int64_t l = 0; l < x->L; l++)
			for (int64_t e = 0; e < x->E; e++) {
				double c = (double)p->counts[moet_profile_at(p, ph, l) + e];
				x->prior[l * x->E + e] += c;
				x->prior_tot[l] += c;
			}
	return 0;
}

/* A tier with its layout and reader, no slots yet. */
static int init(moet_model *m, const moet_xtier_opts *o, moet_xtier **out)
{
	if (!m->owner && strcmp(m->be->ops->name, "cpu"))
		return moet_err(MOET_EUNSUP, "RAM budget on the %s backend without a placement: "
				"every expert is on the device, there is no CPU tier",
				m->be->ops->name);
	moet_xtier *x = calloc(1, sizeof(*x));
	if (!x)
		return moet_err(MOET_ENOMEM, "NVMe tier");
	x->m = m;
	x->o = *o;
	x->o.profile = NULL;
	x->L = m->cfg.num_hidden_layers;
	x->E = m->cfg.n_routed_experts;
	x->H = m->cfg.hidden_size;
	x->k = m->cfg.num_experts_per_tok;
	x->pred_layer = -1;
	x->pf_miss_avg = 1.0; /* until acquires say otherwise: every demand read waits */
	x->pf_mode = o->prefetch_mode;
	if (x->pf_mode == MOET_XTIER_PF_ENV) {
		static const char *const names[] = { "budget", "all" };
		int i = 0, rc = moet_env_choice("MOET_XTIER_PREFETCH", names, 2, &i);
		if (rc) {
			free(x);
			return rc;
		}
		x->pf_mode = i ? MOET_XTIER_PF_ALL : MOET_XTIER_PF_BUDGET;
	} else if (x->pf_mode != MOET_XTIER_PF_BUDGET && x->pf_mode != MOET_XTIER_PF_ALL) {
		int bad = x->pf_mode;
		free(x);
		return moet_err(MOET_EINVAL, "NVMe tier: prefetch mode %d", bad);
	}
	moet_uring_opts uo = { .queue_depth = o->queue_depth, .direct = o->direct };
	int rc = moet_uring_create(&uo, &x->u);
	if (!rc)
		rc = build(x);
	if (!rc && o->profile)
		rc = use_profile(x, o->profile);
	if (!rc && x->n_moe == 0)
		rc = moet_err(MOET_EINVAL, "RAM budget: the model has no MoE layer");
	x->st.slot_bytes = x->slot_bytes;
	if (rc) {
		moet_xtier_destroy(x);
		return rc;
	}
	*out = x;
	return 0;
}

/* Restarts the trace: empty, its start contents the slots holding or reading an expert. */
static void trace_start(moet_xtier *x)
{
	x->tr_n = 0;
	x->st.trace_len = x->st.trace_cut = x->st.trace_hits = x->st.trace_fetches = 0;
	x->st.trace_start_resident = 0;
	for (int64_t s = 0; x->tr_init && s < x->n_slots; s++)
		if (x->slots[s].state != XT_FREE)
			x->tr_init[x->st.trace_start_resident++] =
				(int32_t)(x->slots[s].layer * x->E + x->slots[s].expert);
}

void xt_trace_add(moet_xtier *x, int64_t l, int64_t e)
{
	if (!x->st.trace_cut && x->tr_n == x->tr_alloc && x->tr_n < x->tr_cap) {
		/* NOTE: grown by doubling up to the cap; a refused growth cuts the trace there
		 * (the lookup itself must not fail for it) */
		int64_t want = x->tr_alloc ? 2 * x->tr_alloc : 4096;
		want = want < x->tr_cap ? want : x->tr_cap;
		int32_t *p = realloc(x->tr, (size_t)want * sizeof(*p));
		if (p) {
			x->tr = p;
			x->tr_alloc = want;
		}
	}
	if (x->st.trace_cut || x->tr_n >= x->tr_alloc) {
		x->st.trace_cut++;
		return;
	}
	x->tr[x->tr_n++] = (int32_t)(l * x->E + e);
	x->st.trace_len = (uint64_t)x->tr_n;
	x->st.trace_hits = x->st.hits + x->st.late_hits; /* this lookup's outcome included */
}

const int32_t *moet_xtier_trace(const moet_xtier *x, int64_t *out_n)
{
	*out_n = x->tr_n;
	return x->tr;
}

int moet_xtier_stats_bounds(const moet_xtier *x, moet_xtier_stats *out)
{
	moet_xtier_stats_get(x, out);
	const int64_t nk = x->L * x->E, n = x->tr_n;
	uint64_t m_opt = 0, m_any = 0, sh = 0;
	int rc = moet_xtier_min_misses(x->tr, n, nk, x->n_slots, x->tr_init,
				       x->st.trace_start_resident, &m_opt);
	if (!rc)
		rc = moet_xtier_min_misses_any_start(x->tr, n, nk, x->n_slots, &m_any);
	if (!rc)
		rc = moet_xtier_static_hits(x->tr, n, nk, x->n_slots, &sh);
	if (rc)
		return rc;
	out->opt_hits = (uint64_t)n - m_opt;
	out->opt_any_hits = (uint64_t)n - m_any;
	out->static_hits = sh;
	out->bounds_valid = 1;
	return 0;
}

int moet_xtier_plan(moet_model *m, moet_xtier_stats *out)
{
	moet_xtier_opts o = { 0 };
	moet_xtier *x = NULL;
	int rc = init(m, &o, &x);
	if (!rc)
		*out = x->st;
	moet_xtier_destroy(x);
	return rc;
}

int moet_model_set_xtier(moet_model *m, const moet_xtier_opts *o)
{
	moet_xtier_destroy(m->xtier);
	m->xtier = NULL;
	if (!o || !o->ram_budget_bytes)
		return 0;
	moet_xtier *x = NULL;
	int rc = init(m, o, &x);
	if (rc)
		return rc;
	x->n_slots = (int64_t)(o->ram_budget_bytes / x->slot_bytes);
	if (x->n_slots < 1) {
		rc = moet_err(MOET_EINVAL, "RAM budget of %zu bytes is below one expert slot "
			      "(%zu bytes)", o->ram_budget_bytes, x->slot_bytes);
		goto fail;
	}
	if (x->n_slots > x->n_moe * x->E)
		x->n_slots = x->n_moe * x->E;
	x->st.slot_bytes = x->slot_bytes;
	x->st.n_slots = x->n_slots;
	uint64_t t0 = moet_now_ns();
	if ((rc = alloc_slots(x)))
		goto fail;
	x->st.alloc_ns = moet_now_ns() - t0;
	x->tr_cap = o->trace_cap ? o->trace_cap : MOET_XTIER_TRACE_CAP;
	x->tr_init = malloc((size_t)x->n_slots * sizeof(*x->tr_init));
	if (!x->tr_init) {
		rc = moet_err(MOET_ENOMEM, "NVMe tier: trace start of %lld slots",
			      (long long)x->n_slots);
		goto fail;
	}
	if (!o->no_warm && (rc = warm_fill(x)))
		goto fail;
	trace_start(x);
	m->xtier = x;
	moet_stage_unlock(m); /* the balance's pages: unused behind the tier (dispatch.c) */
	return 0;
fail:
	moet_xtier_destroy(x);
	return rc;
}

int moet_model_set_ram_budget(moet_model *m, size_t bytes, const struct moet_profile *profile)
{
	moet_xtier_opts o = { .ram_budget_bytes = bytes, .profile = profile };
	return moet_model_set_xtier(m, &o);
}

moet_xtier *moet_model_xtier(const moet_model *m)
{
	return m->xtier;
}

moet_uring *moet_xtier_reader(moet_xtier *x)
{
	return x->u;
}

/* The disk's rate while busy (bytes per ns), counting a busy period still open; 0 before any
 * read completed. */
double xt_io_rate(const moet_xtier *x)
{
	uint64_t busy = x->io_busy_ns;
	if (x->n_loading > 0)
		busy += moet_now_ns() - x->io_busy_t0;
	return x->io_bytes && busy ? (double)x->io_bytes / (double)busy : 0;
}

void moet_xtier_stats_get(const moet_xtier *x, moet_xtier_stats *out)
{
	*out = x->st;
	out->prefetch_mode = x->pf_mode;
	out->pf_rate_Bps = 1e9 * xt_io_rate(x);
	out->pf_window_ns = x->pf_window_ns;
	out->pf_precision = ((double)x->pred_hit_tot + 1.0) / ((double)x->pred_tot + 2.0);
	out->pf_miss_avg = x->pf_miss_avg;
}

void moet_xtier_stats_reset(moet_xtier *x)
{
	moet_xtier_stats keep = x->st;
	memset(&x->st, 0, sizeof(x->st));
	x->st.slot_bytes = keep.slot_bytes;
	x->st.n_slots = keep.n_slots;
	x->st.tier_experts = keep.tier_experts;
	x->st.tier_bytes = keep.tier_bytes;
	x->st.direct = keep.direct;
	x->st.registered = keep.registered;
	/* the NUMA facts: the policy and the last verify (copied as one block of fields) */
	memcpy((char *)&x->st + offsetof(moet_xtier_stats, numa_mode),
	       (const char *)&keep + offsetof(moet_xtier_stats, numa_mode),
	       sizeof(keep) - offsetof(moet_xtier_stats, numa_mode));
	trace_start(x);
}

void moet_xtier_destroy(moet_xtier *x)
{
	if (!x)
		return;
	moet_uring_destroy(x->u); /* waits for reads into the slots first */
	if (x->mem)
		munmap(x->mem, (size_t)x->n_slots * x->slot_bytes);
	for (int64_t l = 0; l < x->L && x->router_bias && x->post_norm; l++) {
		free(x->router_bias[l]);
		free(x->post_norm[l]);
	}
	free(x->info);
	free(x->where);
	free(x->prior);
	free(x->prior_tot);
	free(x->obs);
	free(x->obs_tot);
	free(x->next_moe);
	free(x->router);
	free(x->router_bias);
	free(x->post_norm);
	free(x->pred);
	free(x->table);
	free(x->slots);
	free(x->pinned);
	free(x->pinned_e);
	free(x->reg_buf);
	free(x->reg_bytes);
	free(x->scr);
	free(x->tr);
	free(x->tr_init);
	free(x);
}
