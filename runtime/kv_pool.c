/*
 * kv_pool.c: paged KV caches (moet_model.h): a pool of fixed budget in one backend
 * allocation, cut into blocks; a sequence's cache is a block table into it.
 *
 *   pool memory (backend):  K [layers][rows][k_row]  |  V [layers][rows][v_row]
 *                           rows = n_blocks << shift (a private pool: exactly max_tokens)
 *
 *   seq A: table [0, 3]     positions 0..B-1 -> block 0, B..2B-1 -> block 3
 *   seq B: table [1, 2, 4]  (blocks taken as each sequence grew: they interleave in memory)
 *
 * A position's row inside a layer is moet_kv_row(table, shift, p) (common/moet_kvrow.h); the
 * backend ops (kv_store, attend and their latent forms) address K/V only through it, so the
 * values computed per position, and the logits, are those of a contiguous cache bit for bit.
 *
 * Free blocks are a stack of ids (taken from the top, given back on top): no search, and the
 * same order of blocks for the same order of calls. A pass takes its blocks before it writes
 * anything (moet_kv_grow_batch, all or nothing) and gives them back if it fails.
 *
 * NOTE: moet_kv_create keeps today's contiguous cache: a private pool of one block of 2^shift
 * >= max_tokens positions of which only max_tokens rows exist (the block table [0] maps
 * position p to row p; kv->max_tokens keeps every position below max_tokens).
 *
 * Lifetime: a pool counts its holders (its creator and each cache); the memory goes with the
 * last. Not thread-safe: pools and caches belong to the thread running the model's passes.
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_err.h"
#include "moet_gpu_host.h"
#include "moet_topo.h"

#define KV_MAX_SHIFT_BLOCK 16       /* block_tokens <= 65536 */
#define KV_MAX_TOKENS (INT64_C(1) << 30) /* positions of one cache or pool (int32 on the GPU) */

/* Floats per position per layer of m's MLA form (struct moet_kv's k_row, v_row) on rank r:
 * with the attention split by heads (MOET_TP) only that rank's heads. */
static void kv_geometry_rank(const moet_model *m, int r, int64_t *k_row, int64_t *v_row)
{
	const moet_config *c = &m->cfg;
	int64_t h0 = 0, heads = c->num_attention_heads;
	if (m->mla_absorbed) {
		*k_row = c->kv_lora_rank + c->qk_rope_head_dim;
		*v_row = 0;
		return;
	}
	(void)moet_tp_heads(m->tp, r, &h0, &heads);
	*k_row = heads * moet_config_qk_head_dim(c);
	*v_row = heads * c->v_head_dim;
}

static void kv_geometry(const moet_model *m, int64_t *k_row, int64_t *v_row)
{
	kv_geometry_rank(m, 0, k_row, v_row);
}

size_t moet_kv_token_bytes(const moet_model *m)
{
	int64_t k_row, v_row;
	kv_geometry(m, &k_row, &v_row);
	return (size_t)m->cfg.num_hidden_layers * (size_t)(k_row + v_row) * sizeof(float);
}

int moet_kv_fit_tokens(const moet_model *m, double share, int64_t cap, int64_t min_tokens,
		       int64_t *out_tokens, size_t *out_free)
{
	size_t free_b = 0, total_b = 0;
	if (m->be->ops->host_memory)
		free_b = moet_topo_mem_available();
	else if (moet_gpu_mem_info(&free_b, &total_b))
		return moet_err_prefix(MOET_EDEVICE, "KV budget: the device's free memory");
	if (out_free)
		*out_free = free_b;
	if (!free_b)
		return moet_err(MOET_EDEVICE, "KV budget: the %s backend's free memory is unknown",
				m->be->ops->name);
	const size_t tb = moet_kv_token_bytes(m);
	const double fit = share * (double)free_b / (double)(tb ? tb : 1);
	const int64_t n = fit >= (double)cap ? cap : (int64_t)fit;
	if (n < min_tokens)
		return moet_err(MOET_ENOMEM, "KV budget: %zu bytes per position (MLA %s form), %.2f "
				"GiB free on the %s backend: %lld positions fit, %lld needed (set "
				"MOET_MLA=absorbed for the latent cache, or a smaller budget)", tb,
				m->mla_absorbed ? "absorbed" : "expanded",
				(double)free_b / (1024.0 * 1024 * 1024), m->be->ops->name,
				(long long)n, (long long)min_tokens);
	*out_tokens = n;
	return 0;
}

static void pool_unref(moet_kv_pool *p)
{
	if (--p->refs > 0)
		return;
	if (p->k)
		p->be->ops->free(p->be, p->k);
	for (int r = 1; r < MOET_TP_MAX; r++)
		if (p->rk[r])
			moet_tp_rank_free(p->tp, r, p->rk[r]);
	free(p->free_ids);
	free(p);
}

/* A pool of n_blocks blocks of 2^shift positions, `rows` positions per layer in memory. */
static int pool_make(const moet_model *m, int64_t n_blocks, int shift, int64_t rows,
		     int64_t budget, moet_kv_pool **out)
{
	moet_kv_pool *p = calloc(1, sizeof(*p));
	int rc = 0;
	if (!p || !(p->free_ids = malloc((size_t)n_blocks * sizeof(int32_t)))) {
		rc = moet_err(MOET_ENOMEM, "KV pool of %lld blocks", (long long)n_blocks);
		goto fail;
	}
	p->be = m->be;
	p->n_layers = m->cfg.num_hidden_layers;
	kv_geometry(m, &p->k_row, &p->v_row);
	p->shift = shift;
	p->n_blocks = n_blocks;
	p->rows = rows;
	p->budget_tokens = budget;
	p->refs = 1;
	size_t per_row = (size_t)(p->k_row + p->v_row) * sizeof(float), bytes;
	if (__builtin_mul_overflow((size_t)p->n_layers * (size_t)rows, per_row, &bytes)) {
		rc = moet_err(MOET_ENOMEM, "KV pool of %lld positions: size overflows",
			      (long long)rows);
		goto fail;
	}
	if ((rc = p->be->ops->alloc(p->be, bytes, (void **)&p->k))) {
		p->k = NULL;
		rc = moet_err_prefix(rc, "KV pool of %lld positions (%.3f GiB)", (long long)budget,
				     (double)bytes / (1024.0 * 1024.0 * 1024.0));
		goto fail;
	}
	p->v = p->v_row ? p->k + p->n_layers * rows * p->k_row : NULL;
	/* the attention split by heads: each rank r >= 1 its heads' part on its device */
	int64_t h0, heads;
	for (int r = 1; moet_tp_heads(m->tp, r, &h0, &heads) && heads; r++) {
		p->tp = m->tp;
		kv_geometry_rank(m, r, &p->rk_row[r], &p->rv_row[r]);
		const size_t b = (size_t)p->n_layers * (size_t)rows *
				 (size_t)(p->rk_row[r] + p->rv_row[r]) * sizeof(float);
		if ((rc = moet_tp_rank_alloc(m->tp, r, b, (void **)&p->rk[r]))) {
			p->rk[r] = NULL;
			rc = moet_err_prefix(rc, "KV pool of %lld positions: rank %d's heads (%.3f "
					     "GiB)", (long long)budget, r,
					     (double)b / (1024.0 * 1024.0 * 1024.0));
			goto fail;
		}
		p->rv[r] = p->rv_row[r] ? p->rk[r] + p->n_layers * rows * p->rk_row[r] : NULL;
	}
	/* the stack pops block 0 first, then 1, 2, ... */
	for (int64_t i = 0; i < n_blocks; i++)
		p->free_ids[i] = (int32_t)(n_blocks - 1 - i);
	p->n_free = n_blocks;
	*out = p;
	return 0;
fail:
	if (p)
		pool_unref(p);
	return rc;
}

int moet_kv_pool_create(const moet_model *m, int64_t budget_tokens, int64_t block_tokens,
			moet_kv_pool **out)
{
	if (!block_tokens)
		block_tokens = MOET_KV_BLOCK_TOKENS;
	int shift = 0;
	while (shift < KV_MAX_SHIFT_BLOCK && ((int64_t)1 << shift) < block_tokens)
		shift++;
	if (block_tokens < 1 || ((int64_t)1 << shift) != block_tokens)
		return moet_err(MOET_EINVAL, "KV pool: block of %lld positions is not a power of "
				"two in 1 .. %d", (long long)block_tokens, 1 << KV_MAX_SHIFT_BLOCK);
	if (budget_tokens < block_tokens || budget_tokens > KV_MAX_TOKENS)
		return moet_err(MOET_EINVAL, "KV pool: a budget of %lld positions is not within "
				"one block (%lld) .. %lld", (long long)budget_tokens,
				(long long)block_tokens, (long long)KV_MAX_TOKENS);
	const int64_t n_blocks = budget_tokens >> shift;
	return pool_make(m, n_blocks, shift, n_blocks << shift, budget_tokens, out);
}

void moet_kv_pool_destroy(moet_kv_pool *p)
{
	if (p)
		pool_unref(p);
}

int64_t moet_kv_pool_blocks(const moet_kv_pool *p)
{
	return p->n_blocks;
}

int64_t moet_kv_pool_free_blocks(const moet_kv_pool *p)
{
	return p->n_free;
}

int64_t moet_kv_pool_block_tokens(const moet_kv_pool *p)
{
	return (int64_t)1 << p->shift;
}

int moet_kv_create_in(moet_kv_pool *pool, int64_t max_tokens, moet_kv **out)
{
	const int64_t cap = pool->n_blocks << pool->shift;
	if (!max_tokens)
		max_tokens = cap;
	if (max_tokens < 1 || max_tokens > cap)
		return moet_err(MOET_EINVAL, "KV cache of %lld positions in a pool of %lld",
				(long long)max_tokens, (long long)cap);
	moet_kv *kv = calloc(1, sizeof(*kv));
	const int64_t max_blocks = (max_tokens + ((int64_t)1 << pool->shift) - 1) >> pool->shift;
	if (!kv || !(kv->blocks = malloc((size_t)max_blocks * sizeof(int32_t)))) {
		free(kv);
		return moet_err(MOET_ENOMEM, "KV cache of %lld positions", (long long)max_tokens);
	}
	kv->max_tokens = max_tokens;
	kv->n_layers = pool->n_layers;
	kv->k_row = pool->k_row;
	kv->v_row = pool->v_row;
	kv->pool = pool;
	kv->max_blocks = max_blocks;
	pool->refs++;
	*out = kv;
	return 0;
}

int moet_kv_create(const moet_model *m, int64_t max_tokens, moet_kv **out)
{
	if (max_tokens <= 0 || max_tokens > KV_MAX_TOKENS)
		return moet_err(MOET_EINVAL, "KV cache of %lld tokens", (long long)max_tokens);
	int shift = 0;
	while (((int64_t)1 << shift) < max_tokens)
		shift++;
	moet_kv_pool *p = NULL;
	int rc = pool_make(m, 1, shift, max_tokens, max_tokens, &p);
	if (rc)
		return rc;
	rc = moet_kv_create_in(p, max_tokens, out);
	pool_unref(p); /* the cache holds it now (or nobody does) */
	return rc;
}

/* Gives back the blocks above `keep`, last first (the stack as it was before they went). */
static void give_back(moet_kv *kv, int64_t keep)
{
	moet_kv_pool *p = kv->pool;
	while (kv->n_blocks > keep)
		p->free_ids[p->n_free++] = kv->blocks[--kv->n_blocks];
}

void moet_kv_destroy(moet_kv *kv)
{
	if (!kv)
		return;
	give_back(kv, 0);
	pool_unref(kv->pool);
	free(kv->blocks);
	free(kv);
}

int64_t moet_kv_len(const moet_kv *kv)
{
	return kv->len;
}

int64_t moet_kv_blocks(const moet_kv *kv)
{
	return kv->n_blocks;
}

void moet_kv_reset(moet_kv *kv)
{
	give_back(kv, 0);
	kv->len = 0;
}

/* Blocks a cache needs to hold n_pos positions. */
static int64_t blocks_for(const moet_kv *kv, int64_t n_pos)
{
	return (n_pos + ((int64_t)1 << kv->pool->shift) - 1) >> kv->pool->shift;
}

int moet_kv_grow_batch(const moet_seq_step *steps, int n_steps)
{
	for (int s = 0; s < n_steps; s++) {
		steps[s].kv->mark = steps[s].kv->n_blocks;
		steps[s].kv->pool->want = 0;
	}
	/* NOTE: every pool's demand is summed before anything is taken, so a batch whose
	 * entries draw on one pool fails as a whole, not after the first entries grew. */
	for (int s = 0; s < n_steps; s++) {
		moet_kv *kv = steps[s].kv;
		int64_t need = blocks_for(kv, kv->len + steps[s].n_tok) - kv->n_blocks;
		kv->pool->want += need > 0 ? need : 0;
	}
	for (int s = 0; s < n_steps; s++) {
		const moet_kv_pool *p = steps[s].kv->pool;
		if (p->want > p->n_free)
			return moet_err(MOET_ERANGE, "KV pool full: batch entry %d needs blocks; "
					"the pass wants %lld blocks of %lld positions, %lld of %lld "
					"are free (budget %lld positions)", s, (long long)p->want,
					(long long)1 << p->shift, (long long)p->n_free,
					(long long)p->n_blocks, (long long)p->budget_tokens);
	}
	for (int s = 0; s < n_steps; s++) {
		moet_kv *kv = steps[s].kv;
		moet_kv_pool *p = kv->pool;
		const int64_t to = blocks_for(kv, kv->len + steps[s].n_tok);
		while (kv->n_blocks < to)
			kv->blocks[kv->n_blocks++] = p->free_ids[--p->n_free];
	}
	return 0;
}

void moet_kv_undo_batch(const moet_seq_step *steps, int n_steps)
{
	for (int s = n_steps - 1; s >= 0; s--)
		give_back(steps[s].kv, steps[s].kv->mark);
}

void moet_kv_rowinfo_rank(const moet_kv *kv, int64_t pos, int r, moet_rowinfo *out)
{
	const moet_kv_pool *p = kv->pool;
	moet_kv_rowinfo(kv, pos, out);
	if (r > 0) {
		out->k = p->rk[r];
		out->v = p->rv[r];
		out->k_layer = p->rows * p->rk_row[r];
		out->v_layer = p->rows * p->rv_row[r];
	}
}

void moet_kv_rowinfo(const moet_kv *kv, int64_t pos, moet_rowinfo *out)
{
	const moet_kv_pool *p = kv->pool;
	*out = (moet_rowinfo){ .k = p->k, .v = p->v, .k_layer = p->rows * p->k_row,
			       .v_layer = p->rows * p->v_row, .blocks = kv->blocks,
			       .n_blocks = kv->n_blocks, .block_shift = p->shift, .pos = pos };
}

int moet_kv_check(const moet_model *m, const moet_kv *kv, int entry)
{
	int64_t k_row, v_row;
	kv_geometry(m, &k_row, &v_row);
	if (kv->pool->be != m->be || kv->n_layers != m->cfg.num_hidden_layers ||
	    kv->k_row != k_row || kv->v_row != v_row)
		return moet_err(MOET_EINVAL, "batch entry %d: its KV cache was made for another "
				"model or MLA form (%lld floats per position and layer, want %lld)",
				entry, (long long)(kv->k_row + kv->v_row),
				(long long)(k_row + v_row));
	return 0;
}
