/*
 * stage_lock.c: what MOET_STAGE_BALANCE page-locks at the placement, so that a staged cold
 * expert's copy is one DMA from the checkpoint's own pages (dispatch.c, hybrid.c).
 *
 *   MOET_STAGE_REGISTER=cold (default; unset or empty): the byte ranges of the CPU side's
 *       experts (weights and block scales of gate, up and down), page-aligned and merged
 *       within each shard: the hot experts' pages (on the GPU already) and the dense part's
 *       stay evictable
 *   MOET_STAGE_REGISTER=all: every shard whole (the first measured form, session 20)
 *   MOET_STAGE_REGISTER=0: nothing (the copies from the pageable mapping: the reference)
 *
 * The ranges are computed on every backend (the tests read them on the CPU one); only a GPU
 * backend locks them (cudaHostRegister, read-only: the shards are mapped shared, ckpt.c says
 * why). By default (the balance on because MOET_STAGE_BALANCE is unset) at most half the
 * host's memory is locked: more, and the placement runs without the balance (dispatch.c).
 * Behind the NVMe tier nothing is locked (attaching one unlocks what was): its cold experts
 * come from RAM slots, and its checkpoint may not fit the host's memory.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_int.h"
#include "moet_ckpt.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_gpu_host.h"

/* (shard, start, end) of one tensor's bytes, ends page-rounded */
typedef struct span {
	int shard;
	uintptr_t lo, hi;
} span;

static int span_cmp(const void *a, const void *b)
{
	const span *x = a, *y = b;
	if (x->shard != y->shard)
		return x->shard < y->shard ? -1 : 1;
	return (x->lo > y->lo) - (x->lo < y->lo);
}

/* The shard whose mapping holds p, or -1 (a view outside the checkpoint's mappings). */
static int shard_of(const moet_ckpt *ck, const void *p)
{
	for (int i = 0; i < moet_ckpt_shard_count(ck); i++) {
		const uintptr_t b = (uintptr_t)moet_ckpt_shard_base(ck, i);
		if (b && (uintptr_t)p >= b && (uintptr_t)p < b + moet_ckpt_shard_bytes(ck, i))
			return i;
	}
	return -1;
}

/* The cold experts' spans, merged per shard, into m->stage_lock. */
static int cold_ranges(moet_model *m, const int16_t *owner)
{
	const moet_config *c = &m->cfg;
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts;
	const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	int64_t n = 0;
	for (int64_t i = 0; i < L * E; i++)
		n += m->layers[i / E].is_moe && owner[i] < 0;
	span *sp = malloc((size_t)(n ? 6 * n : 1) * sizeof(*sp));
	if (!sp)
		return moet_err(MOET_ENOMEM, "page-locking: %lld cold experts' ranges",
				(long long)n);
	int64_t k = 0;
	for (int64_t i = 0; i < L * E; i++) {
		if (!m->layers[i / E].is_moe || owner[i] >= 0)
			continue;
		const moet_ffn_w *w = &m->layers[i / E].experts_host[i % E];
		const moet_mat *x[3] = { &w->gate, &w->up, &w->down };
		for (int t = 0; t < 6; t++) {
			const moet_mat *a = x[t / 2];
			const void *p = t % 2 ? (const void *)a->scale_inv : a->data;
			const size_t b = t % 2 ? moet_mat_scale_bytes(a) : moet_mat_data_bytes(a);
			const int s = p && b ? shard_of(m->ck, p) : -1;
			if (s < 0)
				continue; /* none, or not the checkpoint's bytes: nothing to lock */
			sp[k++] = (span){ s, (uintptr_t)p & ~(pg - 1),
					  ((uintptr_t)p + b + pg - 1) & ~(pg - 1) };
		}
	}
	qsort(sp, (size_t)k, sizeof(*sp), span_cmp);
	int64_t r = 0; /* merged in place: overlapping or touching spans of one shard */
	for (int64_t i = 0; i < k; i++) {
		if (r && sp[r - 1].shard == sp[i].shard && sp[i].lo <= sp[r - 1].hi) {
			if (sp[i].hi > sp[r - 1].hi)
				sp[r - 1].hi = sp[i].hi;
		} else {
			sp[r++] = sp[i];
		}
	}
	m->stage_lock = malloc((size_t)(r ? r : 1) * sizeof(*m->stage_lock));
	if (!m->stage_lock) {
		free(sp);
		return moet_err(MOET_ENOMEM, "page-locking: %lld ranges", (long long)r);
	}
	for (int64_t i = 0; i < r; i++)
		m->stage_lock[i] = (moet_lock_range){ (const void *)sp[i].lo, sp[i].hi - sp[i].lo };
	m->n_stage_lock = (int)r;
	free(sp);
	return 0;
}

static int whole_shards(moet_model *m)
{
	const int n = moet_ckpt_shard_count(m->ck);
	m->stage_lock = malloc((size_t)(n ? n : 1) * sizeof(*m->stage_lock));
	if (!m->stage_lock)
		return moet_err(MOET_ENOMEM, "page-locking: %d shards", n);
	m->n_stage_lock = 0;
	for (int i = 0; i < n; i++)
		if (moet_ckpt_shard_base(m->ck, i) && moet_ckpt_shard_bytes(m->ck, i))
			m->stage_lock[m->n_stage_lock++] = (moet_lock_range){
				moet_ckpt_shard_base(m->ck, i), moet_ckpt_shard_bytes(m->ck, i) };
	return 0;
}

/* The host's memory in bytes: MOET_STAGE_TEST_RAM (a test's stand-in) or the physical
 * pages'. */
static int host_ram(uint64_t *out)
{
	const char *v = getenv("MOET_STAGE_TEST_RAM");
	if (v && *v) {
		char *end = NULL;
		const unsigned long long b = strtoull(v, &end, 10);
		if (*end || !b || v[0] == '-')
			return moet_err(MOET_EINVAL, "MOET_STAGE_TEST_RAM='%s': expected bytes "
					"above 0", v);
		*out = b;
		return 0;
	}
	*out = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	return 0;
}

/* NOTE: by default (MOET_STAGE_BALANCE unset) the lock takes at most half the host's memory:
 * more, and the host is left too little to run in (a checkpoint near the host's size is the
 * NVMe tier's case, whose tier is attached after the placement) */
static int default_fits(const moet_model *m, uint64_t ram)
{
	uint64_t bytes = 0;
	for (int i = 0; i < m->n_stage_lock; i++)
		bytes += m->stage_lock[i].bytes;
	if (bytes > ram / 2)
		return moet_err(MOET_ENOMEM, "MOET_STAGE_BALANCE unset: the CPU side's experts "
				"(%.2f GB) are more than half the host's memory (%.2f GB) and stay "
				"pageable; MOET_STAGE_BALANCE=auto page-locks them anyway",
				(double)bytes / 1e9, (double)ram / 1e9);
	return 0;
}

int moet_stage_lock(moet_model *m, const int16_t *owner, int host)
{
	static const char *const modes[] = { "cold", "all", "0" };
	int mode = 0, rc = moet_env_choice("MOET_STAGE_REGISTER", modes, 3, &mode);
	if (rc)
		return rc;
	uint64_t ram = 0;
	if ((rc = host_ram(&ram)))
		return rc;
	if (mode == 2 || !m->ck || m->xtier)
		return 0;
	if ((rc = mode == 1 ? whole_shards(m) : cold_ranges(m, owner)))
		return rc;
	if (!host && moet_hybrid_stage_balance_by_default(m->hy) && (rc = default_fits(m, ram)))
		return rc;
	for (int i = 0; !host && i < m->n_stage_lock; i++) {
		const moet_lock_range *g = &m->stage_lock[i];
		if ((rc = moet_gpu_host_register_ro(g->p, g->bytes)))
			return moet_err_prefix(rc, "MOET_STAGE_BALANCE: page-locking %zu bytes of %s",
					       g->bytes, moet_ckpt_shard_path(m->ck,
									      shard_of(m->ck, g->p)));
		m->n_stage_locked = i + 1;
	}
	return 0;
}

void moet_stage_unlock(moet_model *m)
{
	for (int i = 0; i < m->n_stage_locked; i++)
		moet_gpu_host_unregister(m->stage_lock[i].p);
	free(m->stage_lock);
	m->stage_lock = NULL;
	m->n_stage_lock = m->n_stage_locked = 0;
}
