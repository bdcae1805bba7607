/*
 * tp.c: the dense part split over several devices (MOET_TP=N; issue 5 item 3; docs/hybrid.md
 * "Tensor-parallel dense matrices").
 *
 * Exactness decides the split: a matrix is split by its output rows, so that each output
 * element is one device's whole contract dot, and the devices exchange finished values only
 * (copies, no reductions): the logits equal the single-device ones bit for bit. Split (when
 * MOET_TP is 2 or more): q_b (or q_proj), kv_b, o_proj, the dense MLP and the shared experts
 * (gate_up per rank, h gathered, down split), lm_head; and the attention by heads
 * (MOET_TP_ATTN=heads, the default): each rank its heads' K/V cache (the expanded form) or the
 * whole latent cache (the absorbed form) and its heads' attention. Everything else (norms,
 * q_a, kv_a, router, the routed experts' tiers, combine, sampling) stays on rank 0, the
 * model's own backend.
 *
 *   per split matrix W (rows [r0[r], r0[r+1]) on rank r; rank 0's slice through the model's
 *   bind, so its part is in the same bulk upload as the other dense matrices):
 *     x (rank 0, [n][K])  -- broadcast -->  xin[r]                    (every rank r >= 1)
 *     rank 0:  y[:, r0[0] .. r0[1])  = W_0 x      (written in place, y's stride)
 *     rank r:  yout[r] = W_r xin[r]               ([n][rows_r], contiguous)
 *     yout[r]  -- gather -->  rbuf[r] (rank 0)  -- strided copy -->  y[:, r0[r] .. r0[r+1])
 *   the attention (moet_tp_attention where q_b and kv_b split at the ranks' heads: each rank
 *   computes its heads' q and kvb from q's input and [c | k_pe] broadcast; else
 *   moet_tp_attend: q, kvb and [c | k_pe] broadcast from rank 0): each rank stores its K/V
 *   and attends its heads, the outputs gathered into rank 0's attention rows.
 *
 * Row boundaries: common/moet_tpsplit.h (the placement's accounting uses the same rule).
 *
 * Ranks: with --device cuda, CUDA devices 0..N-1 (rank 0 the model's backend), the exchanges
 * through NCCL (gpu/nccl.cu), each rank's work on a stream of its device: the host never
 * waits. With the CPU backend, N-1 more CPU backends and memcpy exchanges: a test double that
 * runs the same slicing, placing and exchange order in CI (bits equal by construction there;
 * the plumbing is what it tests).
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"
#include "moet_tpsplit.h"

typedef struct pend {
	moet_mat host;
	moet_mat *out;
} pend;

struct moet_tp {
	int n;
	int cuda;                      /* ranks are CUDA devices 0..n-1, else CPU backends */
	moet_backend *be[MOET_TP_MAX]; /* [0]: the model's (borrowed) */
	moet_nccl *nccl;
	void *st[MOET_TP_MAX];         /* CUDA ranks >= 1: the stream of their work */
	void *st0;                     /* rank 0's (the thread's stream) while in a rank */
	pend *pend[MOET_TP_MAX];       /* ranks >= 1: slices to bind at moet_tp_flush */
	int64_t n_pend[MOET_TP_MAX], cap_pend[MOET_TP_MAX];
	void **blocks[MOET_TP_MAX];    /* ranks >= 1: their bulk binds (CUDA) */
	int n_blocks[MOET_TP_MAX];
	moet_tp_mat *mats;             /* [layers][MOET_TP_PER_LAYER] */
	moet_tp_mat lm_head;
	int64_t max_k;                 /* the widest input of a split matrix */
	int64_t chunk;                 /* MOET_TP_ROWS: the most rows of one exchange, or 0 */
	int64_t max_rows[MOET_TP_MAX]; /* the most rows of a rank's slice */
	int64_t cap_rows;              /* rows the scratch holds: a product of more rows runs in
					  chunks of these (moet_tp_reserve) */
	float *xin[MOET_TP_MAX];       /* ranks >= 1: [cap][max_k] */
	float *yout[MOET_TP_MAX];      /* ranks >= 1: [cap][max_rows[r]] */
	float *rbuf[MOET_TP_MAX];      /* on rank 0: [cap][max_rows[r]] of rank r */
	float *act;                    /* on rank 0: [cap][max_k], a split FFN's h */
	uint64_t bytes[MOET_TP_MAX];   /* split weights' bytes per rank */
	/* the attention split by heads (MOET_TP_ATTN=heads, the default) */
	int head_split;
	int absorbed;                  /* MLA's absorbed form: every rank the whole latent cache */
	int64_t h0[MOET_TP_MAX + 1];   /* rank r's heads [h0[r], h0[r+1]) */
	int64_t nh, qk, kvb_w, kva_w, v_dim;
	int64_t cap_attn;              /* rows of the attention buffers (a pass's, grow-only) */
	float *qin[MOET_TP_MAX], *kvbin[MOET_TP_MAX], *kvain[MOET_TP_MAX]; /* ranks >= 1 */
	float *aout[MOET_TP_MAX];      /* ranks >= 1: their heads' attention [cap][nh_r x v] */
	float *abuf[MOET_TP_MAX];      /* on rank 0: rank r's aout received */
	int local;                     /* q and kvb computed per rank (head-aligned splits) */
	int ffn_split;                 /* every rank's backend has gate_up (moet_tp_splits_ffn) */
	float *ain[MOET_TP_MAX];       /* ranks >= 1: q's input (qa or h) [cap][max_qx] */
	int64_t max_qx;
	const float *freq[MOET_TP_MAX];/* ranks >= 1: RoPE's inverse frequencies (bound) */
	moet_rowinfo *hrows;           /* host: a rank's row table being made */
	int64_t cap_hrows;
	const moet_rows *rows[2][MOET_TP_MAX]; /* ranks >= 1: per micro-batch slot */
};

int moet_tp_switch(int *out_n)
{
	const char *v = getenv("MOET_TP");
	*out_n = 1;
	if (!v || !*v)
		return 0;
	char *end = NULL;
	long n = strtol(v, &end, 10);
	if (*end || n < 1 || n > MOET_TP_MAX)
		return moet_err(MOET_EINVAL, "MOET_TP='%s': expected a rank count from 1 to %d", v,
				MOET_TP_MAX);
	*out_n = (int)n;
	return 0;
}

/* Rank r's device current with its stream as the thread's (CUDA ranks), and back to rank 0
 * with its stream. */
static int enter(moet_tp *tp, int r)
{
	if (!tp->cuda || !r)
		return 0;
	tp->st0 = moet_gpu_thread_stream();
	int rc = moet_gpu_set_device(r);
	if (!rc)
		moet_gpu_set_thread_stream(tp->st[r]);
	return rc;
}

static int leave(moet_tp *tp, int r, int rc)
{
	if (!tp->cuda || !r)
		return rc;
	int r0 = moet_gpu_set_device(0);
	moet_gpu_set_thread_stream(tp->st0);
	return rc ? rc : r0;
}

static void free_scratch(moet_tp *tp)
{
	for (int r = 1; r < tp->n; r++) {
		if (!tp->be[r])
			continue;
		(void)enter(tp, r);
		tp->be[r]->ops->free(tp->be[r], tp->xin[r]);
		tp->be[r]->ops->free(tp->be[r], tp->yout[r]);
		(void)leave(tp, r, 0);
		tp->be[0]->ops->free(tp->be[0], tp->rbuf[r]);
		tp->xin[r] = tp->yout[r] = tp->rbuf[r] = NULL;
	}
	tp->be[0]->ops->free(tp->be[0], tp->act);
	tp->act = NULL;
	tp->cap_rows = 0;
}

static void free_attn(moet_tp *tp)
{
	for (int r = 1; r < tp->n; r++) {
		float **b[5] = { &tp->qin[r], &tp->kvbin[r], &tp->kvain[r], &tp->aout[r],
				 &tp->ain[r] };
		for (int i = 0; i < 5; i++) {
			moet_tp_rank_free(tp, r, *b[i]);
			*b[i] = NULL;
		}
		tp->be[0]->ops->free(tp->be[0], tp->abuf[r]);
		tp->abuf[r] = NULL;
	}
	tp->cap_attn = 0;
}

void moet_tp_destroy(moet_tp *tp)
{
	if (!tp)
		return;
	free_scratch(tp);
	free_attn(tp);
	free(tp->hrows);
	for (int r = 1; r < tp->n; r++) {
		if (!tp->be[r])
			continue;
		(void)enter(tp, r);
		for (int i = 0; i < tp->n_blocks[r]; i++)
			tp->be[r]->ops->free(tp->be[r], tp->blocks[r][i]);
		moet_backend_destroy(tp->be[r]);
		moet_gpu_set_thread_stream(NULL);
		moet_gpu_stream_destroy(tp->st[r]);
		(void)leave(tp, r, 0);
		free(tp->blocks[r]);
		free(tp->pend[r]);
	}
	moet_nccl_destroy(tp->nccl);
	free(tp->mats);
	free(tp);
}

int moet_tp_create(moet_model *m, int n, int64_t wide, moet_tp **out)
{
	const moet_config *c = &m->cfg;
	*out = NULL;
	if (n < 2)
		return 0;
	const char *name = m->be->ops->name;
	const int cuda = !strcmp(name, "cuda");
	if (!cuda && !m->be->ops->host_memory)
		return moet_err(MOET_EUNSUP, "MOET_TP=%d: the %s backend cannot split the dense "
				"part (cpu or cuda only)", n, name);
	moet_tp *tp = calloc(1, sizeof(*tp));
	if (!tp)
		return moet_err(MOET_ENOMEM, "tensor-parallel state");
	tp->n = n;
	tp->cuda = cuda;
	tp->be[0] = m->be;
	tp->max_k = wide;
	int rc = 0;
	static const char *const attn[] = { "heads", "rank0" };
	int a = 0;
	rc = moet_env_choice("MOET_TP_ATTN", attn, 2, &a);
	tp->head_split = !rc && a == 0;
	tp->absorbed = m->mla_absorbed;
	tp->nh = c->num_attention_heads;
	tp->qk = moet_config_qk_head_dim(c);
	tp->v_dim = c->v_head_dim;
	tp->kvb_w = tp->nh * (c->qk_nope_head_dim + c->v_head_dim);
	tp->kva_w = c->kv_lora_rank + c->qk_rope_head_dim;
	tp->local = tp->head_split;
	tp->max_qx = c->q_lora_rank > 0 ? c->q_lora_rank : c->hidden_size;
	const int64_t per = (tp->nh + n - 1) / n;
	for (int r = 0; r <= n; r++)
		tp->h0[r] = per * r < tp->nh ? per * r : tp->nh;
	const char *ch = getenv("MOET_TP_ROWS");
	if (ch && *ch) {
		char *end = NULL;
		long v = strtol(ch, &end, 10);
		if (!rc && (*end || v < 1 || v > (1L << 30)))
			rc = moet_err(MOET_EINVAL, "MOET_TP_ROWS='%s': expected rows from 1 to 2^30",
				      ch);
		tp->chunk = v;
	}
	const char *why = NULL;
	const int n_gpu = cuda ? moet_gpu_count(&why) : 0;
	if (!rc && cuda && n_gpu < n)
		rc = moet_err(MOET_EDEVICE, "no CUDA device %d (%d devices%s%s)", n_gpu, n_gpu,
			      why ? ": " : "", why ? why : "");
	if (!rc && !(tp->mats = calloc((size_t)c->num_hidden_layers * MOET_TP_PER_LAYER,
				sizeof(*tp->mats))))
		rc = moet_err(MOET_ENOMEM, "tensor-parallel matrices");
	for (int r = 1; r < n && !rc; r++) {
		if (cuda) {
			if (!(rc = enter(tp, r)) && !(rc = moet_backend_cuda_create(r, &tp->be[r])))
				rc = moet_gpu_stream_create_blocking(&tp->st[r]);
			rc = leave(tp, r, rc);
		} else {
			/* NOTE: one thread per simulated rank: the test double needs no executor */
			rc = moet_backend_cpu_create(1, 1, &tp->be[r]);
		}
	}
	if (!rc && cuda)
		rc = moet_nccl_create(n, &tp->nccl);
	tp->ffn_split = 1;
	for (int r = 0; !rc && r < n; r++)
		tp->ffn_split = tp->ffn_split && tp->be[r]->ops->gate_up;
	if (rc) {
		moet_tp_destroy(tp);
		return moet_err_prefix(rc, "MOET_TP=%d", n);
	}
	*out = tp;
	return 0;
}

int moet_tp_ranks(const moet_tp *tp)
{
	return tp ? tp->n : 1;
}

moet_tp_mat *moet_tp_layer_mat(moet_tp *tp, int64_t l, int which)
{
	return &tp->mats[l * MOET_TP_PER_LAYER + which];
}

moet_tp_mat *moet_tp_lm_head(moet_tp *tp)
{
	return &tp->lm_head;
}

uint64_t moet_tp_rank_bytes(const moet_tp *tp, int r)
{
	return tp && r < tp->n ? tp->bytes[r] : 0;
}

int moet_model_tp_attention(const moet_model *m)
{
	return !m->tp || !m->tp->head_split ? 0 : m->tp->local ? 2 : 1;
}

int moet_model_tp_ranks(const moet_model *m, uint64_t *bytes)
{
	const int n = moet_tp_ranks(m->tp);
	for (int r = 0; bytes && r < n; r++)
		bytes[r] = moet_tp_rank_bytes(m->tp, r);
	return n;
}

static int push_pend(moet_tp *tp, int r, const moet_mat *host, moet_mat *out)
{
	if (tp->n_pend[r] == tp->cap_pend[r]) {
		int64_t cap = tp->cap_pend[r] ? 2 * tp->cap_pend[r] : 64;
		pend *p = realloc(tp->pend[r], (size_t)cap * sizeof(*p));
		if (!p)
			return moet_err(MOET_ENOMEM, "rank %d's matrix list", r);
		tp->pend[r] = p;
		tp->cap_pend[r] = cap;
	}
	tp->pend[r][tp->n_pend[r]++] = (pend){ *host, out };
	return 0;
}

/* host's rows split at r0[0..n] (multiples of 128 where it has block scales) into out. */
static int split_at(moet_tp *tp, const moet_mat *host, const int64_t *r0, moet_tp_mat *out,
		    moet_mat *rank0_host)
{
	const int64_t K = host->cols;
	const int64_t sblocks = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const size_t esz = moet_dtype_size(host->dtype);
	memset(out, 0, sizeof(*out));
	memcpy(out->r0, r0, (size_t)(tp->n + 1) * sizeof(*r0));
	for (int r = 0; r < tp->n; r++) {
		moet_mat p = *host;
		p.rows = out->r0[r + 1] - out->r0[r];
		p.data = (const uint8_t *)host->data + (size_t)out->r0[r] * (size_t)K * esz;
		if (host->scale_inv)
			p.scale_inv = host->scale_inv + out->r0[r] / MOET_BLOCK * sblocks;
		tp->bytes[r] += moet_mat_data_bytes(&p) + moet_mat_scale_bytes(&p);
		if (p.rows > tp->max_rows[r])
			tp->max_rows[r] = p.rows;
		out->part[r] = p;
		if (r == 0) {
			*rank0_host = p;
		} else if (p.rows > 0) {
			int rc = push_pend(tp, r, &p, &out->part[r]);
			if (rc)
				return rc;
		}
	}
	if (K > tp->max_k)
		tp->max_k = K;
	return 0;
}

int moet_tp_split(moet_tp *tp, const moet_mat *host, moet_tp_mat *out, moet_mat *rank0_host)
{
	int64_t r0[MOET_TP_MAX + 1];
	(void)moet_tp_row_split(host->rows, host->scale_inv != NULL, tp->n, 0, 0, r0);
	return split_at(tp, host, r0, out, rank0_host);
}

int moet_tp_split_heads(moet_tp *tp, const moet_mat *host, int64_t head_rows, moet_tp_mat *out,
			moet_mat *rank0_host)
{
	int64_t r0[MOET_TP_MAX + 1];
	/* NOTE: not at heads, the ranks get q and kvb from rank 0 (no local attention) */
	if (!moet_tp_row_split(host->rows, host->scale_inv != NULL, tp->n,
			       tp->head_split ? tp->nh : 0, head_rows, r0))
		tp->local = 0;
	return split_at(tp, host, r0, out, rank0_host);
}

int moet_tp_local(const moet_tp *tp)
{
	return tp && tp->head_split && tp->local;
}

int moet_tp_bind_freq(moet_tp *tp, const float *host, int64_t n)
{
	int rc = 0;
	for (int r = 1; tp && r < tp->n && !rc; r++) {
		if (!(rc = enter(tp, r)))
			rc = tp->be[r]->ops->bind_vec(tp->be[r], host, n, &tp->freq[r]);
		rc = leave(tp, r, rc);
	}
	return rc;
}

int moet_tp_flush(moet_tp *tp, const moet_ckpt *ck)
{
	int rc = 0;
	for (int r = 1; r < tp->n && !rc; r++) {
		const int64_t n = tp->n_pend[r];
		moet_backend *be = tp->be[r];
		moet_mat *host = malloc((size_t)(n + 1) * sizeof(*host));
		moet_mat *dev = malloc((size_t)(n + 1) * sizeof(*dev));
		if (!host || !dev)
			rc = moet_err(MOET_ENOMEM, "rank %d's upload list", r);
		for (int64_t i = 0; !rc && i < n; i++)
			host[i] = tp->pend[r][i].host;
		if (!rc && (rc = enter(tp, r)) == 0) {
			if (tp->cuda && n)
				rc = moet_bind_staged(be, ck, host, n, dev, &tp->blocks[r],
						      &tp->n_blocks[r], NULL);
			for (int64_t i = 0; !tp->cuda && !rc && i < n; i++)
				rc = be->ops->bind_mat(be, &host[i], &dev[i]);
			rc = leave(tp, r, rc);
		}
		for (int64_t i = 0; !rc && i < n; i++)
			*tp->pend[r][i].out = dev[i];
		free(host);
		free(dev);
		free(tp->pend[r]);
		tp->pend[r] = NULL;
		tp->n_pend[r] = tp->cap_pend[r] = 0;
		if (rc)
			rc = moet_err_prefix(rc, "rank %d's slices of the dense matrices", r);
	}
	return rc;
}

/* The attention's buffers for `rows` rows (a whole pass: its K/V stores precede every
 * attention, so it is not chunked). */
static int reserve_attn(moet_tp *tp, int64_t rows)
{
	if (!tp->head_split || rows <= tp->cap_attn)
		return 0;
	free_attn(tp);
	int rc = 0;
	for (int r = 1; r < tp->n && !rc; r++) {
		const int64_t ar = (tp->h0[r + 1] - tp->h0[r]) * tp->v_dim;
		const int64_t w[5] = { tp->nh * tp->qk, tp->kvb_w, tp->kva_w, ar > 0 ? ar : 1,
				       tp->local ? tp->max_qx : 1 };
		float **b[5] = { &tp->qin[r], &tp->kvbin[r], &tp->kvain[r], &tp->aout[r],
				 &tp->ain[r] };
		for (int i = 0; i < 5 && !rc; i++)
			rc = moet_tp_rank_alloc(tp, r, (size_t)(rows * w[i]) * sizeof(float),
						(void **)b[i]);
		if (!rc)
			rc = tp->be[0]->ops->alloc(tp->be[0], (size_t)(rows * w[3]) * sizeof(float),
						   (void **)&tp->abuf[r]);
	}
	if (rc) {
		free_attn(tp);
		return moet_err_prefix(rc, "tensor-parallel attention buffers for %lld rows",
				       (long long)rows);
	}
	tp->cap_attn = rows;
	return 0;
}

/* The most floats one exchange buffer holds (256 MiB): a long prefill's products run in row
 * chunks instead of buffers of the whole call (lm_head's slice of a rank is 81920 floats a row
 * at Kimi-K2 size over two ranks: 8192 rows would take 2.7 GB on each side). */
#define TP_BUF_FLOATS ((int64_t)64 << 20)

int moet_tp_reserve(moet_tp *tp, int64_t rows)
{
	if (!tp)
		return 0;
	int rc0 = reserve_attn(tp, rows);
	if (rc0)
		return rc0;
	int64_t widest = tp->max_k;
	for (int r = 1; r < tp->n; r++)
		widest = tp->max_rows[r] > widest ? tp->max_rows[r] : widest;
	const int64_t most = TP_BUF_FLOATS / (widest > 0 ? widest : 1);
	if (rows > most)
		rows = most > 16 ? most : 16;
	if (tp->chunk && rows > tp->chunk)
		rows = tp->chunk;
	if (rows <= tp->cap_rows)
		return 0;
	free_scratch(tp);
	int rc = 0;
	for (int r = 1; r < tp->n && !rc; r++) {
		const size_t in = (size_t)(rows * tp->max_k) * sizeof(float);
		const size_t o = (size_t)(rows * tp->max_rows[r]) * sizeof(float);
		moet_backend *be = tp->be[r];
		if (!(rc = enter(tp, r)) && !(rc = be->ops->alloc(be, in, (void **)&tp->xin[r])))
			rc = be->ops->alloc(be, o ? o : sizeof(float), (void **)&tp->yout[r]);
		rc = leave(tp, r, rc);
		if (!rc)
			rc = tp->be[0]->ops->alloc(tp->be[0], o ? o : sizeof(float),
						   (void **)&tp->rbuf[r]);
	}
	if (!rc && moet_tp_splits_ffn(tp))
		rc = tp->be[0]->ops->alloc(tp->be[0], (size_t)(rows * tp->max_k) * sizeof(float),
					   (void **)&tp->act);
	if (rc) {
		free_scratch(tp);
		return moet_err_prefix(rc, "tensor-parallel buffers for %lld rows", (long long)rows);
	}
	tp->cap_rows = rows;
	return 0;
}

/* src (rank 0, count floats) to dst[r] of every rank r >= 1. */
static int bcast_to(moet_tp *tp, const float *src, float *const dst[], size_t count)
{
	if (!tp->cuda) {
		for (int r = 1; r < tp->n; r++)
			memcpy(dst[r], src, count * sizeof(float));
		return 0;
	}
	void *buf[MOET_TP_MAX] = { (void *)src }, *st[MOET_TP_MAX] = { moet_gpu_thread_stream() };
	for (int r = 1; r < tp->n; r++) {
		buf[r] = dst[r];
		st[r] = tp->st[r];
	}
	return moet_nccl_bcast(tp->nccl, buf, count, st);
}

/* src[r] (count[r] floats, rank r >= 1) to dst[r] on rank 0. */
static int gather_to(moet_tp *tp, float *const src[], float *const dst[], const size_t count[])
{
	if (!tp->cuda) {
		for (int r = 1; r < tp->n; r++)
			memcpy(dst[r], src[r], count[r] * sizeof(float));
		return 0;
	}
	void *snd[MOET_TP_MAX] = { 0 }, *rcv[MOET_TP_MAX] = { 0 };
	void *st[MOET_TP_MAX] = { moet_gpu_thread_stream() };
	for (int r = 1; r < tp->n; r++) {
		snd[r] = src[r];
		rcv[r] = dst[r];
		st[r] = tp->st[r];
	}
	return moet_nccl_gather(tp->nccl, snd, rcv, count, st);
}

/* rows x width floats of src (contiguous) into dst (rows dst_stride apart), on rank 0. */
static int place(moet_tp *tp, float *dst, int64_t dst_stride, const float *src, int64_t width,
		 int64_t rows)
{
	if (!tp->cuda) {
		for (int64_t t = 0; t < rows; t++)
			memcpy(dst + t * dst_stride, src + t * width, (size_t)width * sizeof(float));
		return 0;
	}
	return moet_gpu_copy2d_async(dst, (size_t)dst_stride * sizeof(float), src,
				     (size_t)width * sizeof(float), (size_t)width * sizeof(float),
				     (size_t)rows, NULL);
}

int moet_tp_heads(const moet_tp *tp, int r, int64_t *h0, int64_t *nh)
{
	if (!tp || !tp->head_split || r < 0 || r >= tp->n)
		return 0;
	*h0 = tp->h0[r];
	*nh = tp->h0[r + 1] - tp->h0[r];
	return 1;
}

int moet_tp_rank_alloc(moet_tp *tp, int r, size_t bytes, void **out)
{
	int rc = enter(tp, r);
	if (!rc)
		rc = tp->be[r]->ops->alloc(tp->be[r], bytes, out);
	return leave(tp, r, rc);
}

void moet_tp_rank_free(moet_tp *tp, int r, void *p)
{
	if (!p)
		return;
	(void)enter(tp, r);
	tp->be[r]->ops->free(tp->be[r], p);
	(void)leave(tp, r, 0);
}

int moet_tp_rows(moet_tp *tp, int slot, const moet_seq_step *steps, int n_steps,
		 const int64_t *tok, int64_t n, int64_t n_layers)
{
	if (!tp || !tp->head_split)
		return 0;
	if (n > tp->cap_hrows) {
		moet_rowinfo *h = realloc(tp->hrows, (size_t)n * sizeof(*h));
		if (!h)
			return moet_err(MOET_ENOMEM, "tensor-parallel row table of %lld rows",
					(long long)n);
		tp->hrows = h;
		tp->cap_hrows = n;
	}
	int rc = 0;
	for (int r = 1; r < tp->n && !rc; r++) {
		if (tp->h0[r + 1] == tp->h0[r])
			continue;
		for (int s = 0, t = 0; s < n_steps; s++)
			for (int64_t i = 0; i < steps[s].n_tok; i++, t++)
				moet_kv_rowinfo_rank(steps[s].kv, steps[s].kv->len + i, r,
						     &tp->hrows[t]);
		if (!(rc = enter(tp, r)))
			rc = tp->be[r]->ops->prepare_rows(tp->be[r], slot, tp->hrows, tok, n,
							  n_layers, &tp->rows[slot][r]);
		rc = leave(tp, r, rc);
	}
	return rc ? moet_err_prefix(rc, "tensor-parallel row tables") : 0;
}

/* The ranks' attention rows (aout, count[r] floats) gathered into their heads' columns of out
 * (rank 0, n rows of heads x v). */
static int gather_attn(moet_tp *tp, const size_t count[], int64_t n, float *out)
{
	const int64_t os = tp->nh * tp->v_dim;
	int rc = gather_to(tp, tp->aout, tp->abuf, count);
	if (rc)
		return moet_err_prefix(rc, "tensor-parallel attention gather");
	for (int r = 1; r < tp->n && !rc; r++)
		if (count[r])
			rc = place(tp, out + tp->h0[r] * tp->v_dim, os, tp->abuf[r],
				   (tp->h0[r + 1] - tp->h0[r]) * tp->v_dim, n);
	return rc;
}

/* The absorbed form on rank r (its device current): the rows' latent [c | k_pe] into its
 * (whole) latent cache, then its heads' attention with its kv_b rows. */
static int attend_latent(moet_tp *tp, int r, const moet_attn_dims *dr, int64_t l,
			 const float *kva, const float *q, int64_t q_stride, int64_t n,
			 const moet_rows *rw, float *o, int64_t o_stride)
{
	moet_backend *be = tp->be[r];
	const moet_tp_mat *wkvb = moet_tp_layer_mat(tp, l, MOET_TP_KVB);
	int rc = be->ops->kv_store_latent(be, l, kva, tp->kva_w, tp->kva_w, n, rw);
	return rc ? rc : be->ops->attend_latent(be, dr, &wkvb->part[r], l, q, q_stride, n, rw, o,
						 o_stride);
}

int moet_tp_attend(moet_tp *tp, int slot, const moet_attn_dims *d, int64_t l, const float *q,
		   const float *kvb, const float *k_pe, int64_t kpe_stride, int64_t n,
		   const moet_rows *rows, float *out)
{
	const int64_t qs = tp->nh * tp->qk, os = tp->nh * tp->v_dim;
	const int64_t kvb_hw = tp->kvb_w / tp->nh, kpe_off = tp->kva_w - d->rope;
	size_t count[MOET_TP_MAX] = { 0 };
	int rc;
	if (n <= 0)
		return 0;
	if (n > tp->cap_attn || kpe_stride != tp->kva_w)
		return moet_err(MOET_EINVAL, "tensor-parallel attention of %lld rows (buffers "
				"%lld), k_pe rows %lld floats apart (want %lld)", (long long)n,
				(long long)tp->cap_attn, (long long)kpe_stride,
				(long long)tp->kva_w);
	/* every rank gets q, kvb (the expanded form) and the rows of [c | k_pe] (k_pe at its
	 * offset) */
	const float *kva = k_pe - kpe_off;
	if ((rc = bcast_to(tp, q, tp->qin, (size_t)(n * qs))) ||
	    (!tp->absorbed && (rc = bcast_to(tp, kvb, tp->kvbin, (size_t)(n * tp->kvb_w)))) ||
	    (rc = bcast_to(tp, kva, tp->kvain, (size_t)(n * tp->kva_w))))
		return moet_err_prefix(rc, "tensor-parallel attention broadcast");
	for (int r = 0; r < tp->n; r++) {
		const int64_t h0 = tp->h0[r], hn = tp->h0[r + 1] - h0;
		if (hn == 0)
			continue;
		moet_attn_dims dr = *d;
		dr.n_heads = hn;
		moet_backend *be = tp->be[r];
		const moet_rows *rw = r ? tp->rows[slot][r] : rows;
		const float *qr = (r ? tp->qin[r] : q) + h0 * tp->qk;
		const float *kper = r ? tp->kvain[r] + kpe_off : k_pe;
		float *o = r ? tp->aout[r] : out + h0 * tp->v_dim;
		const int64_t o_s = r ? hn * tp->v_dim : os;
		if ((rc = enter(tp, r)) == 0 && tp->absorbed)
			rc = attend_latent(tp, r, &dr, l, kper - kpe_off, qr, qs, n, rw, o, o_s);
		else if (rc == 0 &&
			 (rc = be->ops->kv_store(be, &dr, l, (r ? tp->kvbin[r] : kvb) + h0 * kvb_hw,
						 tp->kvb_w, kper, tp->kva_w, n, rw)) == 0)
			rc = be->ops->attend(be, &dr, l, qr, qs, n, rw, o, o_s);
		if ((rc = leave(tp, r, rc)))
			return moet_err_prefix(rc, "tensor-parallel attention, rank %d", r);
		count[r] = (size_t)(n * hn * tp->v_dim);
	}
	return gather_attn(tp, count, n, out);
}

int moet_tp_attention(moet_tp *tp, int slot, const moet_attn_dims *d, int64_t l,
		      const float *qx, int64_t qx_stride, const float *kva, int64_t kva_stride,
		      int64_t n, const moet_rows *rows, const moet_tp_rope *rope, float *q,
		      float *kvb, float *out)
{
	const moet_tp_mat *wq = moet_tp_layer_mat(tp, l, MOET_TP_Q);
	const moet_tp_mat *wkvb = moet_tp_layer_mat(tp, l, MOET_TP_KVB);
	const int64_t qs = tp->nh * tp->qk, os = tp->nh * tp->v_dim, kvb_hw = tp->kvb_w / tp->nh;
	const int64_t kv_lora = tp->kva_w - d->rope;
	size_t count[MOET_TP_MAX] = { 0 };
	int rc;
	if (n <= 0)
		return 0;
	if (!moet_tp_local(tp) || n > tp->cap_attn || kva_stride != tp->kva_w ||
	    qx_stride > tp->max_qx)
		return moet_err(MOET_EINVAL, "tensor-parallel attention of %lld rows (buffers "
				"%lld), rows of %lld and %lld floats", (long long)n,
				(long long)tp->cap_attn, (long long)qx_stride, (long long)kva_stride);
	if ((rc = bcast_to(tp, qx, tp->ain, (size_t)((n - 1) * qx_stride + wq->part[0].cols))) ||
	    (rc = bcast_to(tp, kva, tp->kvain, (size_t)(n * tp->kva_w))))
		return moet_err_prefix(rc, "tensor-parallel attention broadcast");
	for (int r = 0; r < tp->n; r++) {
		const int64_t hn = tp->h0[r + 1] - tp->h0[r];
		if (hn == 0)
			continue;
		moet_attn_dims dr = *d;
		dr.n_heads = hn;
		moet_backend *be = tp->be[r];
		const moet_rows *rw = r ? tp->rows[slot][r] : rows;
		float *qr = r ? tp->qin[r] : q, *kvbr = r ? tp->kvbin[r] : kvb;
		float *o = r ? tp->aout[r] : out;
		const float *kvar = r ? tp->kvain[r] : kva;
		const int64_t qrs = r ? hn * tp->qk : qs, kvbs = r ? hn * kvb_hw : tp->kvb_w;
		const int64_t o_s = r ? hn * tp->v_dim : os;
		if ((rc = enter(tp, r)) == 0 &&
		    (rc = be->ops->linear(be, &wq->part[r], r ? tp->ain[r] : qx, qx_stride, n, qr,
					  qrs)) == 0 &&
		    (rc = be->ops->rope(be, qr + d->nope, qrs, tp->qk, hn, n, rw,
					r ? tp->freq[r] : rope->inv_freq, rope->n_freq,
					rope->attn_factor, rope->interleave)) == 0) {
			if (tp->absorbed) /* kv_b's head rows inside the latent attention */
				rc = attend_latent(tp, r, &dr, l, kvar, qr, qrs, n, rw, o, o_s);
			else if ((rc = be->ops->linear(be, &wkvb->part[r], kvar, tp->kva_w, n, kvbr,
						       kvbs)) == 0 &&
				 (rc = be->ops->kv_store(be, &dr, l, kvbr, kvbs, kvar + kv_lora,
							 tp->kva_w, n, rw)) == 0)
				rc = be->ops->attend(be, &dr, l, qr, qrs, n, rw, o, o_s);
		}
		if ((rc = leave(tp, r, rc)))
			return moet_err_prefix(rc, "tensor-parallel attention, rank %d", r);
		count[r] = (size_t)(n * hn * tp->v_dim);
	}
	return gather_attn(tp, count, n, out);
}

int moet_tp_splits_ffn(const moet_tp *tp)
{
	return tp && tp->ffn_split;
}

/*
 * The split product of w (with up: gate_up of w and up, which share their rows): x (rank 0,
 * rows x_stride apart) to every rank, each rank's rows, gathered and placed into y's columns
 * on rank 0.
 */
static int split_run(moet_tp *tp, const moet_tp_mat *w, const moet_tp_mat *up, const float *x,
		     int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
	const int64_t K = w->part[0].cols;
	size_t count[MOET_TP_MAX] = { 0 };
	int rc;
	if (n <= 0)
		return 0;
	if (tp->cap_rows < 1 || x_stride < K || x_stride > tp->max_k)
		return moet_err(MOET_EINVAL, "tensor-parallel product of rows of %lld floats: "
				"buffers of %lld rows of %lld", (long long)x_stride,
				(long long)tp->cap_rows, (long long)tp->max_k);
	if (n > tp->cap_rows) { /* in chunks of rows, in order */
		for (int64_t t0 = 0; t0 < n; t0 += tp->cap_rows) {
			const int64_t nn = n - t0 < tp->cap_rows ? n - t0 : tp->cap_rows;
			if ((rc = split_run(tp, w, up, x + t0 * x_stride, x_stride, nn,
					    y + t0 * y_stride, y_stride)))
				return rc;
		}
		return 0;
	}
	/* NOTE: the rows are sent whole (x_stride apart), the last one up to K */
	if ((rc = bcast_to(tp, x, tp->xin, (size_t)((n - 1) * x_stride + K))))
		return moet_err_prefix(rc, "tensor-parallel broadcast");
	for (int r = 0; r < tp->n; r++) {
		const int64_t rows = w->part[r].rows;
		moet_backend *be = tp->be[r];
		if (rows == 0)
			continue;
		const float *xr = r ? tp->xin[r] : x;
		float *yr = r ? tp->yout[r] : y;
		const int64_t ys = r ? rows : y_stride;
		if ((rc = enter(tp, r)) == 0)
			rc = up ? be->ops->gate_up(be, &w->part[r], &up->part[r], xr, x_stride, n, yr,
						   ys)
				: be->ops->linear(be, &w->part[r], xr, x_stride, n, yr, ys);
		if ((rc = leave(tp, r, rc)))
			return moet_err_prefix(rc, "tensor-parallel rank %d", r);
		count[r] = (size_t)(n * rows);
	}
	if ((rc = gather_to(tp, tp->yout, tp->rbuf, count)))
		return moet_err_prefix(rc, "tensor-parallel gather");
	for (int r = 1; r < tp->n && !rc; r++)
		if (w->part[r].rows > 0)
			rc = place(tp, y + w->r0[r], y_stride, tp->rbuf[r], w->part[r].rows, n);
	return rc;
}

int moet_tp_linear(moet_tp *tp, const moet_tp_mat *w, const float *x, int64_t x_stride,
		   int64_t n, float *y, int64_t y_stride)
{
	return split_run(tp, w, NULL, x, x_stride, n, y, y_stride);
}

int moet_tp_ffn(moet_tp *tp, const moet_tp_mat *gate, const moet_tp_mat *up,
		const moet_tp_mat *down, const float *x, int64_t n, float *out)
{
	const int64_t H = gate->part[0].cols, I = down->part[0].cols;
	int rc = 0;
	if (tp->cap_rows < 1)
		return moet_err(MOET_EINVAL, "tensor-parallel FFN: no buffers reserved");
	/* NOTE: act holds cap_rows rows of h: a longer call in chunks of rows */
	for (int64_t t0 = 0; t0 < n && !rc; t0 += tp->cap_rows) {
		const int64_t nn = n - t0 < tp->cap_rows ? n - t0 : tp->cap_rows;
		if (!(rc = split_run(tp, gate, up, x + t0 * H, H, nn, tp->act, I)))
			rc = split_run(tp, down, NULL, tp->act, I, nn, out + t0 * H, H);
	}
	return rc;
}
