/*
 * early_rows.c: early rows (MOET_EARLY_ROWS, docs/hybrid.md "Early rows").
 *
 * In one pass a MoE layer's finish waits for its CPU tier, and in the layers whose CPU tier
 * outlasts the GPU's experts the device then has nothing queued (at batch 16 on the H200 2-4
 * layers a step wait 0.1-1.4 ms: docs/staging.md). But only the rows with a pair on the CPU
 * tier need its results: every other row's output is complete once the device's experts are.
 * So before the finish the driver queues the next layer's attention block (norm, attention,
 * residual add, post-attention norm) on a second buffer set for all rows, from this layer's
 * output combined for the complete rows; after the finish it runs the same block again for the
 * rows with CPU-tier pairs alone and copies those rows over the early ones. Measured on the H200
 * (docs/hybrid.md "Early rows"): that late call of 1-4 rows costs about what the early one
 * fills, so the switch stays opt-in.
 *
 * NOTE (why the bits are the reference's). Every op of the block is per row (the contract's
 * batch invariance, docs/numerics.md): a row's result is the same in a call of n rows and in
 * one of |C|. The early call also computes the rows with CPU-tier pairs, from this layer's
 * input plus nothing (their combine is not run early): those rows' results, and their key and
 * value entries of the next layer (the cache row of the current position), are overwritten by
 * the late call before anything reads them (a decode row attends only to its own sequence, and
 * writes its cache row before it reads it). The combine of the complete rows runs on contiguous
 * runs of them, so nothing reads the expert outputs the CPU tier is still writing.
 */
#include "model_int.h"
#include "moet_err.h"

#include <stdlib.h>
#include <string.h>

/* MOET_EARLY_ROWS: unset, empty or 0: off; K in 1 .. MAX_K: a MoE layer's next attention
 * block goes early when its CPU tier computes at least K experts (staged ones not counted)
 * and the rows with CPU-tier pairs are at most half the batch (above that the late call
 * costs as much as the early one saves). */
#define MAX_K 1024

static int parse(int *out)
{
	const char *v = getenv("MOET_EARLY_ROWS");
	*out = 0;
	if (!v || !*v)
		return 0;
	char *end = NULL;
	const long k = strtol(v, &end, 10);
	if (*end || k < 0 || k > MAX_K)
		return moet_err(MOET_EINVAL, "MOET_EARLY_ROWS='%.40s': want 0 (off) or the CPU-tier "
				"experts a layer needs, 1 .. %d", v, MAX_K);
	*out = (int)k;
	return 0;
}

int moet_early_switch(moet_model *m, int n_mb, int decode)
{
	int k = 0, dg = 0, rc = parse(&k);
	if (!rc && k)
		rc = moet_devgroup_switch(&dg);
	const moet_backend_ops *op = m->be->ops;
	/* NOTE: not with the CPU tier alone (moet_model_set_hybrid_overlap 0: bench e2e's
	 * serial run, whose step less Tc is the overlap bound's Tg): there is no wait to fill,
	 * and the late calls' cost would enter Tg, raising the bound by the very work added */
	m->early_min = !rc && k && decode && n_mb == 1 && m->owner && m->cpu_tier &&
				       moet_hybrid_overlapped(m->hy) && m->n_devices <= 1 && !m->tp &&
				       !m->xtier && !m->shadow && !dg && op->copy && op->combine
			       ? k
			       : 0;
	return rc;
}

void moet_early_free(moet_model *m)
{
	free(m->early_rows);
	free(m->early_mask);
	m->early_rows = NULL;
	m->early_mask = NULL;
	m->early_cap = m->early_n = 0;
}

static int grow(moet_model *m, int64_t n)
{
	if (n <= m->early_cap)
		return 0;
	int64_t *r = realloc(m->early_rows, (size_t)n * sizeof(*r));
	if (r)
		m->early_rows = r;
	uint8_t *k = r ? realloc(m->early_mask, (size_t)n) : NULL;
	if (!k)
		return moet_err(MOET_ENOMEM, "early rows of %lld rows", (long long)n);
	m->early_mask = k;
	m->early_cap = n;
	return 0;
}

int moet_early_note(moet_model *m, int64_t n, int64_t cnt, int experts)
{
	const int64_t k = m->cfg.num_experts_per_tok;
	m->early_n = 0;
	if (experts < m->early_min)
		return 0;
	int rc = grow(m, n);
	if (rc)
		return rc;
	memset(m->early_mask, 0, (size_t)n);
	for (int64_t i = 0; i < cnt; i++)
		m->early_mask[m->tier_list[i].pair / k] = 1;
	int64_t c = 0;
	for (int64_t t = 0; t < n; t++)
		if (m->early_mask[t])
			m->early_rows[c++] = t;
	m->early_n = 2 * c <= n ? c : 0;
	return 0;
}

/* The early block on m->bufs[1]: x copied, the complete rows' combine and residual add (runs
 * of consecutive rows), then layer l + 1's attention block for all n rows. */
static int early_block(moet_model *m, moet_fwd_bufs *b, int64_t n, const moet_rows *rows,
		       int64_t l)
{
	const moet_config *c = &m->cfg;
	const moet_backend_ops *op = m->be->ops;
	moet_backend *be = m->be;
	const int64_t H = c->hidden_size, k = c->num_experts_per_tok;
	moet_fwd_bufs *e = &m->bufs[1];
	const int shared = m->layers[l].has_shared;
	int rc = op->copy(be, e->x, b->x, (size_t)(n * H) * sizeof(float));
	for (int64_t t = 0; t < n && !rc;) {
		if (m->early_mask[t]) {
			t++;
			continue;
		}
		int64_t len = 1;
		while (t + len < n && !m->early_mask[t + len])
			len++;
		rc = op->combine(be, b->y, n * k, b->slot + t * k, b->rw + t * k, k,
				 shared ? b->shared + t * H : NULL, len, H, e->out + t * H);
		if (!rc)
			rc = op->add(be, e->x + t * H, e->out + t * H, len * H);
		t += len;
	}
	m->cur = e;
	if (!rc)
		rc = moet_fwd_attn_block(m, l + 1, n, rows);
	m->cur = b;
	return rc;
}

int moet_early_begin(moet_model *m, moet_fwd_bufs *b, int64_t n, const moet_rows *rows,
		     int64_t l, int *out_did)
{
	*out_did = 0;
	if (!m->layers[l].is_moe || n < 2)
		return 0;
	const int64_t nc = m->early_n;
	int rc = 0;
	if (nc == 0)
		return 0;
	/* the late call's row table (slot 1: free in a pass of one micro-batch) */
	if ((rc = moet_fwd_ensure_bufs(m, &m->bufs[1], n)) || (rc = moet_fwd_ensure_host(m, 1, nc)))
		return rc;
	for (int64_t i = 0; i < nc; i++) {
		m->host[1].rows[i] = m->host[0].rows[m->early_rows[i]];
		m->host[1].tok[i] = m->host[0].tok[m->early_rows[i]];
	}
	if ((rc = m->be->ops->prepare_rows(m->be, 1, m->host[1].rows, m->host[1].tok, nc,
					   m->cfg.num_hidden_layers, &m->early_tab)) ||
	    (rc = early_block(m, b, n, rows, l)))
		return rc;
	m->early_layers++;
	*out_did = 1;
	return 0;
}

int moet_early_end(moet_model *m, moet_fwd_bufs *b, int64_t n, int64_t l)
{
	const moet_backend_ops *op = m->be->ops;
	moet_backend *be = m->be;
	const int64_t H = m->cfg.hidden_size, nc = m->early_n;
	const size_t row = (size_t)H * sizeof(float);
	moet_fwd_bufs *e = &m->bufs[1];
	int rc = 0;
	/* the rows with CPU-tier pairs to the front of b (ascending: a row never lands on one
	 * still to be moved), their block, and back over the early results */
	for (int64_t i = 0; i < nc && !rc; i++)
		if (m->early_rows[i] != i)
			rc = op->copy(be, b->x + i * H, b->x + m->early_rows[i] * H, row);
	if (!rc)
		rc = moet_fwd_attn_block(m, l + 1, nc, m->early_tab);
	for (int64_t i = 0; i < nc && !rc; i++) {
		rc = op->copy(be, e->x + m->early_rows[i] * H, b->x + i * H, row);
		if (!rc)
			rc = op->copy(be, e->h + m->early_rows[i] * H, b->h + i * H, row);
	}
	if (!rc)
		rc = op->copy(be, b->x, e->x, (size_t)n * row);
	if (!rc)
		rc = op->copy(be, b->h, e->h, (size_t)n * row);
	return rc;
}
