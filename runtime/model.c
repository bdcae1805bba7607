/*
 * model.c: opening a model: config.json, the checkpoint, and the binding of every tensor the
 * graph needs, each checked against the shape config.json implies.
 *
 * Names follow the published DeepSeek-V3 checkpoints (model.layers.L.self_attn.q_a_proj,
 * model.layers.L.mlp.experts.E.gate_proj, ...). A linear weight stored as F8_E4M3 needs its
 * weight_scale_inv [ceil(rows/128)][ceil(cols/128)] (F32); BF16 or F32 weights need none.
 * Layers L >= num_hidden_layers (DeepSeek-V3's multi-token-prediction layer 61) are never
 * looked up, so they are accepted and skipped.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_int.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_trace.h"
#include "moet_upload.h"

#define NAME_BYTES 256
#define PREFIX_BYTES 96 /* "model.layers.L.self_attn": leaves room for any suffix */

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* Is t's shape the 2-D grid g, or g with its extent-1 dimensions dropped? */
static int is_squeezed_grid(const moet_tensor *t, const int64_t g[2])
{
	int64_t sq[2];
	int n = 0;
	for (int i = 0; i < 2; i++)
		if (g[i] != 1)
			sq[n++] = g[i];
	if (t->ndim == 2)
		return t->shape[0] == g[0] && t->shape[1] == g[1];
	if (t->ndim != n)
		return 0;
	for (int i = 0; i < n; i++)
		if (t->shape[i] != sq[i])
			return 0;
	return 1;
}

/* Binds `prefix`.weight [rows x cols] (and its scale) as a moet_mat on the backend. */
/* The host view of `prefix`.weight [rows x cols] (and its scale): the checkpoint's bytes. */
static int host_linear(const moet_model *m, const char *prefix, int64_t rows, int64_t cols,
		       moet_mat *out)
{
	const moet_ckpt *ck = m->ck;
	moet_mat host;
	char name[NAME_BYTES];
	const moet_tensor *t, *s;
	int64_t shape[2] = { rows, cols };
	int rc;
	snprintf(name, sizeof(name), "%s.weight", prefix);
	rc = moet_ckpt_find(ck, name, MOET_DT_INVALID, 2, shape, &t);
	if (rc)
		return rc;
	if (t->dtype != MOET_DT_F8_E4M3 && t->dtype != MOET_DT_BF16 && t->dtype != MOET_DT_F32)
		return moet_err(MOET_EUNSUP, "%s: tensor %s has dtype %s; linear weights must be "
				"F8_E4M3, BF16 or F32", moet_ckpt_shard_path(ck, t->shard), name,
				moet_dtype_name(t->dtype));
	host = (moet_mat){ .dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data };
	if (t->dtype != MOET_DT_F8_E4M3) {
		*out = host;
		return 0;
	}
	int64_t sshape[2] = { cdiv(rows, MOET_BLOCK), cdiv(cols, MOET_BLOCK) };
	snprintf(name, sizeof(name), "%s.weight_scale_inv", prefix);
	s = moet_ckpt_get(ck, name);
	/* NOTE: transformers' FP8 save path (5.x) writes per-expert scales squeezed: shape []
	 * for a [1, 1] block grid, [2] for [1, 2]. The bytes are the same row-major grid, so a
	 * shape equal to the grid with its extent-1 dimensions dropped is accepted too. */
	if (!(s && s->dtype == MOET_DT_F32 && is_squeezed_grid(s, sshape)) &&
	    (rc = moet_ckpt_find(ck, name, MOET_DT_F32, 2, sshape, &s)))
		return rc;
	host.scale_inv = s->data;
	*out = host;
	return 0;
}

/*
 * Binds a dense matrix on the backend: at once, or while a device backend's open runs, by the
 * bulk upload at its end (bind_dense_flush): *out holds the host view until then.
 */
static int bind_dense(moet_model *m, const moet_mat *host, moet_mat *out)
{
	if (!m->defer_dense)
		return m->be->ops->bind_mat(m->be, host, out);
	if (m->n_dense == m->dense_cap) {
		const int64_t cap = m->dense_cap ? 2 * m->dense_cap : 64;
		moet_mat *h = realloc(m->dense_host, (size_t)cap * sizeof(*h));
		if (h)
			m->dense_host = h;
		moet_mat **o = realloc(m->dense_out, (size_t)cap * sizeof(*o));
		if (o)
			m->dense_out = o;
		if (!h || !o)
			return moet_err(MOET_ENOMEM, "dense matrix list");
		m->dense_cap = cap;
	}
	m->dense_host[m->n_dense] = *host;
	m->dense_out[m->n_dense++] = out;
	*out = *host;
	return 0;
}

/* Binds `prefix`.weight [rows x cols] (and its scale) as a moet_mat on the backend. */
static int bind_linear(moet_model *m, const char *prefix, int64_t rows, int64_t cols,
		       moet_mat *out)
{
	moet_mat host;
	int rc = host_linear(m, prefix, rows, cols, &host);
	return rc ? rc : bind_dense(m, &host, out);
}

/* A dense matrix the tensor-parallel ranks split (MOET_TP, tp.c): rank 0's part bound like any
 * dense matrix, the others' at moet_tp_flush; *unsplit stays empty (forward.c takes tm).
 * head_rows > 0: the rows of one attention head (q_b, kv_b: split at the heads' ranks where
 * the block scales allow). */
static int bind_split(moet_model *m, const char *prefix, int64_t rows, int64_t cols,
		      int64_t head_rows, moet_tp_mat *tm, moet_mat *unsplit)
{
	if (!m->tp)
		return bind_linear(m, prefix, rows, cols, unsplit);
	moet_mat host, part0;
	int rc = host_linear(m, prefix, rows, cols, &host);
	if (!rc)
		rc = head_rows ? moet_tp_split_heads(m->tp, &host, head_rows, tm, &part0)
			       : moet_tp_split(m->tp, &host, tm, &part0);
	return rc ? rc : bind_dense(m, &part0, &tm->part[0]);
}

/* Keeps a decoded host vector for the model's lifetime and binds it on the backend. */
static int keep_vector(moet_model *m, float *v, int64_t n, const float **out)
{
	float **nv = realloc(m->host_vecs, (size_t)(m->n_host_vecs + 1) * sizeof(*nv));
	if (!nv) {
		free(v);
		return moet_err(MOET_ENOMEM, "vector list");
	}
	m->host_vecs = nv;
	m->host_vecs[m->n_host_vecs++] = v;
	return m->be->ops->bind_vec(m->be, v, n, out);
}

/* Decodes a 1-D vector tensor of n values (BF16, F16 or F32) and binds it. */
static int load_vector(moet_model *m, const char *name, int64_t n, const float **out)
{
	const moet_ckpt *ck = m->ck;
	const moet_tensor *t;
	int64_t shape[1] = { n };
	int rc = moet_ckpt_find(ck, name, MOET_DT_INVALID, 1, shape, &t);
	if (rc)
		return rc;
	float *v = malloc((size_t)n * sizeof(float));
	if (!v)
		return moet_err(MOET_ENOMEM, "%s: %lld floats", name, (long long)n);
	for (int64_t i = 0; i < n; i++) {
		switch (t->dtype) {
		case MOET_DT_BF16: v[i] = moet_dec_bf16(((const uint16_t *)t->data)[i]); break;
		case MOET_DT_F16: v[i] = moet_dec_f16(((const uint16_t *)t->data)[i]); break;
		case MOET_DT_F32: v[i] = ((const float *)t->data)[i]; break;
		default:
			free(v);
			return moet_err(MOET_EUNSUP, "%s: tensor %s has dtype %s; expected BF16, "
					"F16 or F32", moet_ckpt_shard_path(ck, t->shard), name,
					moet_dtype_name(t->dtype));
		}
	}
	return keep_vector(m, v, n, out);
}

/* The host views of an FFN's three matrices. */
static int host_ffn(const moet_model *m, const char *prefix, int64_t inter, int64_t hidden,
		    moet_ffn_w *out)
{
	char name[NAME_BYTES];
	int rc;
	snprintf(name, sizeof(name), "%.200s.gate_proj", prefix);
	if ((rc = host_linear(m, name, inter, hidden, &out->gate)))
		return rc;
	snprintf(name, sizeof(name), "%.200s.up_proj", prefix);
	if ((rc = host_linear(m, name, inter, hidden, &out->up)))
		return rc;
	snprintf(name, sizeof(name), "%.200s.down_proj", prefix);
	return host_linear(m, name, hidden, inter, &out->down);
}

/* The bound views of an FFN (dense MLP, shared experts, one routed expert); *host_out, when
 * not NULL, gets the host views too. */
static int bind_ffn(moet_model *m, const char *prefix, int64_t inter, int64_t hidden,
		    moet_ffn_w *out, moet_ffn_w *host_out)
{
	moet_ffn_w h;
	int rc = host_ffn(m, prefix, inter, hidden, &h);
	if (!rc && host_out)
		*host_out = h;
	if (!rc)
		rc = bind_dense(m, &h.gate, &out->gate);
	if (!rc)
		rc = bind_dense(m, &h.up, &out->up);
	if (!rc)
		rc = bind_dense(m, &h.down, &out->down);
	return rc;
}

/* The dense MLP or shared experts of layer l: split over the MOET_TP ranks where they split
 * FFNs (tp.c), else bind_ffn. */
static int bind_ffn_split(moet_model *m, int64_t l, const char *prefix, int64_t inter,
			  int64_t hidden, moet_ffn_w *out)
{
	if (!moet_tp_splits_ffn(m->tp))
		return bind_ffn(m, prefix, inter, hidden, out, NULL);
	moet_ffn_w h;
	moet_mat part0;
	int rc = host_ffn(m, prefix, inter, hidden, &h);
	const moet_mat *src[3] = { &h.gate, &h.up, &h.down };
	static const int which[3] = { MOET_TP_GATE, MOET_TP_UP, MOET_TP_DOWN };
	for (int i = 0; i < 3 && !rc; i++) {
		moet_tp_mat *tm = moet_tp_layer_mat(m->tp, l, which[i]);
		if (!(rc = moet_tp_split(m->tp, src[i], tm, &part0)))
			rc = bind_dense(m, &part0, &tm->part[0]);
	}
	return rc;
}

/* Bytes of a matrix with its block scales. */
static size_t mat_bytes(const moet_mat *w)
{
	return moet_mat_data_bytes(w) + moet_mat_scale_bytes(w);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* MOET_UPLOAD=uring: one backend block for the n matrices, its bytes read from the shard
 * files (runtime/upload_uring.c); the model owns the block (freed at close). On failure the
 * block is freed and out[] untouched. */
static int bind_uring(moet_model *m, const moet_mat *host, int64_t n, moet_mat *out)
{
	void *block = NULL;
	void **nb = realloc(m->dev_blocks, (size_t)(m->n_dev_blocks + 1) * sizeof(*nb));
	if (!nb)
		return moet_err(MOET_ENOMEM, "upload block list");
	m->dev_blocks = nb;
	moet_upload_uring_opts o = { .host_dst = m->be->ops->host_memory };
	int rc = m->be->ops->alloc(m->be, moet_upload_block_bytes(host, n), &block);
	if (!rc)
		rc = moet_upload_mats_uring(m->ck, host, n, block, &o, out, NULL);
	if (rc) {
		if (block)
			m->be->ops->free(m->be, block);
		return rc;
	}
	m->dev_blocks[m->n_dev_blocks++] = block;
	return 0;
}

static size_t up_256(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

/*
 * The staged source (runtime/upload.c): backend memory for all matrices, data and scales, the bytes
 * through the upload's staging by moet_upload_default_threads() threads. NOTE: built here
 * rather than by the backend, which has no checkpoint: with MOET_UPLOAD_READ=pread each item
 * carries its shard file and offset (moet_upload_files_locate; an item outside the mapping is
 * copied from it). For the home GPU (bind_bulk) and GPUs 1.. (remote.c) alike.
 */
int moet_bind_staged(moet_backend *be, const moet_ckpt *ck, const moet_mat *host, int64_t n,
		     moet_mat *out, void ***blocks, int *n_blocks, moet_upload_stats *stats)
{
	const moet_backend_ops *op = be->ops;
	moet_upload_item *items = NULL;
	moet_upload_from *from = NULL;
	moet_upload_files *files = NULL;
	void *blk = NULL;
	int64_t k = 0;
	int read = 0, rc = moet_upload_read_mode(&read);
	if (rc)
		return rc;
	void **nb = realloc(*blocks, (size_t)(*n_blocks + 1) * sizeof(*nb));
	if (!nb)
		return moet_err(MOET_ENOMEM, "upload block list");
	*blocks = nb;
	if (!(items = malloc((size_t)(2 * n + 1) * sizeof(*items))) ||
	    !(from = calloc((size_t)(2 * n + 1), sizeof(*from))))
		rc = moet_err(MOET_ENOMEM, "upload list of %lld matrices", (long long)n);
	/* NOTE: one backend allocation for all (each piece 256-byte aligned, as the allocator's
	 * own): thousands of cudaMalloc calls cost ~0.1-0.2 s at a Kimi-K2 start */
	size_t total = 0;
	for (int64_t i = 0; i < n && !rc; i++)
		total += up_256(moet_mat_data_bytes(&host[i])) +
			 up_256(moet_mat_scale_bytes(&host[i]));
	if (!rc)
		rc = op->alloc(be, total ? total : 256, &blk);
	if (!rc && read == MOET_UPLOAD_READ_PREAD && ck)
		rc = moet_upload_files_open(ck, &files);
	size_t at = 0;
	for (int64_t i = 0; i < n && !rc; i++) {
		const moet_mat *h = &host[i];
		const void *src[2] = { h->data, h->scale_inv };
		const size_t b[2] = { moet_mat_data_bytes(h), moet_mat_scale_bytes(h) };
		out[i] = *h;
		for (int t = 0; t < 2; t++) {
			if (t && !b[1])
				continue;
			void *d = (char *)blk + at;
			at += up_256(b[t]);
			if (t)
				out[i].scale_inv = d;
			else
				out[i].data = d;
			items[k] = (moet_upload_item){ src[t], d, b[t] };
			if (files)
				(void)moet_upload_files_locate(files, src[t], b[t], &from[k], NULL);
			k++;
		}
	}
	moet_upload_opts uo = { .host_dst = op->host_memory, .from = from, .one_block = 1 };
	if (!rc)
		rc = moet_upload_many_opts(items, k, moet_upload_default_threads(), &uo, stats);
	if (rc && blk)
		op->free(be, blk);
	else if (!rc)
		(*blocks)[(*n_blocks)++] = blk;
	moet_upload_files_close(files);
	free(items);
	free(from);
	return rc;
}

/*
 * Binds n matrices on the backend by the source MOET_UPLOAD names: plain, one bind_mat per
 * matrix (the driver's pageable path, the reference); staged, the staging (moet_bind_staged);
 * uring, from the shard files (bind_uring); unset, staged from 256 MiB, else plain.
 */
static int bind_bulk(moet_model *m, const moet_mat *host, int64_t n, moet_mat *dev)
{
	const moet_backend_ops *op = m->be->ops;
	int src = 0, rc = moet_upload_source(&src);
	if (rc)
		return rc;
	/* NOTE: below 256 MiB the staging's fixed cost (its pinned buffers, its threads: ~0.17 s
	 * on the H200 machine for a 9 MB model) exceeds what it saves: the plain path, unless
	 * MOET_UPLOAD=staged asks for it */
	size_t total = 0;
	for (int64_t i = 0; i < n; i++)
		total += mat_bytes(&host[i]);
	const int staged = src ? src == MOET_UPLOAD_STAGED : total >= ((size_t)256 << 20);
	if (src == MOET_UPLOAD_URING)
		return bind_uring(m, host, n, dev);
	if (!op->host_memory && staged)
		return moet_bind_staged(m->be, m->ck, host, n, dev, &m->dev_blocks,
					&m->n_dev_blocks, &m->staged_last);
	for (int64_t i = 0; i < n && !rc; i++)
		rc = op->bind_mat(m->be, &host[i], &dev[i]);
	return rc;
}

/* The dense matrices deferred by bind_dense, bound in one bulk upload (the hot experts'
 * source: staged, uring or plain); their views then replace the host ones. */
static int bind_dense_flush(moet_model *m)
{
	m->defer_dense = 0;
	if (m->n_dense == 0)
		return 0;
	moet_mat *dev = malloc((size_t)m->n_dense * sizeof(*dev));
	if (!dev)
		return moet_err(MOET_ENOMEM, "dense upload list");
	const double t0 = now_s();
	int rc = bind_bulk(m, m->dense_host, m->n_dense, dev);
	if (rc) {
		rc = moet_err_prefix(rc, "%lld dense matrices to the %s backend",
				     (long long)m->n_dense, m->be->ops->name);
	} else {
		for (int64_t i = 0; i < m->n_dense; i++) {
			*m->dense_out[i] = dev[i];
			m->dense_upload_bytes += mat_bytes(&m->dense_host[i]);
		}
		m->dense_upload_s = now_s() - t0;
	}
	free(dev);
	free(m->dense_host);
	free(m->dense_out);
	m->dense_host = NULL;
	m->dense_out = NULL;
	m->n_dense = m->dense_cap = 0;
	return rc;
}

int moet_model_bind_experts(moet_model *m, const int16_t *owner)
{
	const moet_config *c = &m->cfg;
	const int64_t E = c->n_routed_experts;
	const moet_backend_ops *op = m->be->ops;
	moet_mat *host = NULL, *dev = NULL;
	moet_ffn_w **dst = NULL;
	int64_t n = 0;
	int rc = 0;
	if (!m->experts_unbound)
		return 0;
	const int64_t cap = c->num_hidden_layers * E;
	if (!(host = malloc((size_t)(3 * cap) * sizeof(*host))) ||
	    !(dev = malloc((size_t)(3 * cap) * sizeof(*dev))) ||
	    !(dst = malloc((size_t)cap * sizeof(*dst)))) {
		rc = moet_err(MOET_ENOMEM, "expert upload list");
		goto out;
	}
	for (int64_t l = 0; l < c->num_hidden_layers; l++) {
		moet_layer_w *lw = &m->layers[l];
		if (!lw->is_moe)
			continue;
		for (int64_t e = 0; e < E; e++) {
			if (lw->experts[e].gate.data || (owner && owner[l * E + e] != 0))
				continue;
			const moet_ffn_w *h = &lw->experts_host[e];
			dst[n] = &lw->experts[e];
			host[3 * n] = h->gate;
			host[3 * n + 1] = h->up;
			host[3 * n + 2] = h->down;
			n++;
		}
	}
	double t0 = now_s();
	m->staged_last = (moet_upload_stats){ 0 };
	rc = bind_bulk(m, host, 3 * n, dev);
	if (rc) {
		rc = moet_err_prefix(rc, "%lld routed experts to the %s backend", (long long)n,
				     op->name);
		goto out;
	}
	for (int64_t i = 0; i < n; i++) {
		*dst[i] = (moet_ffn_w){ dev[3 * i], dev[3 * i + 1], dev[3 * i + 2] };
		for (int k = 0; k < 3; k++)
			m->upload_bytes += mat_bytes(&host[3 * i + k]);
	}
	m->upload_s += now_s() - t0;
	m->upload_fill_s += m->staged_last.fill_seconds;
	m->upload_wait_s += m->staged_last.link_wait_seconds;
	if (!owner)
		m->experts_unbound = 0;
out:
	free(host);
	free(dev);
	free(dst);
	return rc;
}

int moet_model_op_times(moet_model *m, double per, FILE *f, int reset)
{
	return moet_backend_timed_report(m->be, per, f, reset);
}

void moet_model_upload_stats(const moet_model *m, double *out_bytes, double *out_seconds)
{
	*out_bytes = (double)m->upload_bytes;
	*out_seconds = m->upload_s;
	for (int g = 1; m->remote && g < m->n_devices; g++)
		moet_remote_upload_stats(m->remote[g], out_bytes, out_seconds);
}

void moet_model_upload_split(const moet_model *m, double *out_fill_s, double *out_wait_s)
{
	*out_fill_s = m->upload_fill_s;
	*out_wait_s = m->upload_wait_s;
}

void moet_model_dense_upload_stats(const moet_model *m, double *out_bytes, double *out_seconds)
{
	*out_bytes = (double)m->dense_upload_bytes;
	*out_seconds = m->dense_upload_s;
}

static int bind_attention(moet_model *m, int64_t l, moet_layer_w *lw)
{
	const moet_config *c = &m->cfg;
	const int64_t H = c->hidden_size, nh = c->num_attention_heads;
	char p[PREFIX_BYTES], name[NAME_BYTES];
	int rc;
	snprintf(p, sizeof(p), "model.layers.%lld.self_attn", (long long)l);
	moet_tp_mat *tq = m->tp ? moet_tp_layer_mat(m->tp, l, MOET_TP_Q) : NULL;
	moet_tp_mat *tkvb = m->tp ? moet_tp_layer_mat(m->tp, l, MOET_TP_KVB) : NULL;
	moet_tp_mat *to = m->tp ? moet_tp_layer_mat(m->tp, l, MOET_TP_O) : NULL;
	if (c->q_lora_rank > 0) {
		snprintf(name, sizeof(name), "%s.q_a_proj", p);
		if ((rc = bind_linear(m, name, c->q_lora_rank, H, &lw->q_a)))
			return rc;
		snprintf(name, sizeof(name), "%s.q_a_layernorm.weight", p);
		if ((rc = load_vector(m, name, c->q_lora_rank, &lw->q_a_norm)))
			return rc;
		snprintf(name, sizeof(name), "%s.q_b_proj", p);
		if ((rc = bind_split(m, name, nh * moet_config_qk_head_dim(c), c->q_lora_rank,
				     moet_config_qk_head_dim(c), tq, &lw->q_b)))
			return rc;
	} else {
		snprintf(name, sizeof(name), "%s.q_proj", p);
		if ((rc = bind_split(m, name, nh * moet_config_qk_head_dim(c), H,
				     moet_config_qk_head_dim(c), tq, &lw->q_proj)))
			return rc;
	}
	snprintf(name, sizeof(name), "%s.kv_a_proj_with_mqa", p);
	if ((rc = bind_linear(m, name, c->kv_lora_rank + c->qk_rope_head_dim, H, &lw->kv_a)))
		return rc;
	snprintf(name, sizeof(name), "%s.kv_a_layernorm.weight", p);
	if ((rc = load_vector(m, name, c->kv_lora_rank, &lw->kv_a_norm)))
		return rc;
	snprintf(name, sizeof(name), "%s.kv_b_proj", p);
	/* NOTE: the absorbed form's attention reads kv_b whole, unless MOET_TP splits it by heads */
	int64_t h0, heads;
	if ((rc = m->mla_absorbed && !moet_tp_heads(m->tp, 0, &h0, &heads)
			  ? bind_linear(m, name, nh * (c->qk_nope_head_dim + c->v_head_dim),
					c->kv_lora_rank, &lw->kv_b)
			  : bind_split(m, name, nh * (c->qk_nope_head_dim + c->v_head_dim),
				       c->kv_lora_rank, c->qk_nope_head_dim + c->v_head_dim, tkvb,
				       &lw->kv_b)))
		return rc;
	snprintf(name, sizeof(name), "%s.o_proj", p);
	return bind_split(m, name, H, nh * c->v_head_dim, 0, to, &lw->o);
}

static int bind_moe(moet_model *m, int64_t l, moet_layer_w *lw)
{
	const moet_config *c = &m->cfg;
	const int64_t H = c->hidden_size, E = c->n_routed_experts;
	char p[PREFIX_BYTES], name[NAME_BYTES];
	int rc;
	snprintf(p, sizeof(p), "model.layers.%lld.mlp", (long long)l);
	snprintf(name, sizeof(name), "%s.gate", p);
	if ((rc = bind_linear(m, name, E, H, &lw->router)))
		return rc;
	snprintf(name, sizeof(name), "%s.gate.e_score_correction_bias", p);
	if (moet_ckpt_get(m->ck, name)) {
		if ((rc = load_vector(m, name, E, &lw->router_bias)))
			return rc;
	} else {
		/* NOTE: noaux_tc checkpoints carry the bias; without it selection is unbiased. */
		float *zeros = calloc((size_t)E, sizeof(float));
		if (!zeros)
			return moet_err(MOET_ENOMEM, "router bias");
		if ((rc = keep_vector(m, zeros, E, &lw->router_bias)))
			return rc;
	}
	lw->experts = calloc((size_t)E, sizeof(*lw->experts));
	lw->experts_host = calloc((size_t)E, sizeof(*lw->experts_host));
	if (!lw->experts || !lw->experts_host)
		return moet_err(MOET_ENOMEM, "%lld expert views", (long long)E);
	/* NOTE: a GPU backend binds (uploads) routed experts later: only those a placement puts
	 * on it, or all of them at the first pass without one (moet_model_bind_experts). */
	for (int64_t e = 0; e < E; e++) {
		snprintf(name, sizeof(name), "%s.experts.%lld", p, (long long)e);
		if (!m->be->ops->host_memory) {
			if ((rc = host_ffn(m, name, c->moe_intermediate_size, H,
					   &lw->experts_host[e])))
				return rc;
			m->experts_unbound = 1;
		} else if ((rc = bind_ffn(m, name, c->moe_intermediate_size, H, &lw->experts[e],
					  &lw->experts_host[e]))) {
			return rc;
		}
	}
	if (c->n_shared_experts > 0) {
		lw->has_shared = 1;
		snprintf(name, sizeof(name), "%s.shared_experts", p);
		return bind_ffn_split(m, l, name, c->n_shared_experts * c->moe_intermediate_size,
				      H, &lw->mlp);
	}
	return 0;
}

static int bind_layer(moet_model *m, int64_t l, moet_layer_w *lw)
{
	const moet_config *c = &m->cfg;
	char name[NAME_BYTES];
	int rc;
	snprintf(name, sizeof(name), "model.layers.%lld.input_layernorm.weight", (long long)l);
	if ((rc = load_vector(m, name, c->hidden_size, &lw->in_norm)))
		return rc;
	snprintf(name, sizeof(name), "model.layers.%lld.post_attention_layernorm.weight",
		 (long long)l);
	if ((rc = load_vector(m, name, c->hidden_size, &lw->post_norm)))
		return rc;
	if ((rc = bind_attention(m, l, lw)))
		return rc;
	lw->is_moe = moet_config_is_moe_layer(c, l);
	if (lw->is_moe)
		return bind_moe(m, l, lw);
	snprintf(name, sizeof(name), "model.layers.%lld.mlp", (long long)l);
	return bind_ffn_split(m, l, name, c->intermediate_size, c->hidden_size, &lw->mlp);
}

static int check_config(const moet_config *c, const char *dir)
{
	if (c->qk_rope_head_dim % 2 || c->qk_rope_head_dim > 512)
		return moet_err(MOET_EUNSUP, "%s/config.json: field qk_rope_head_dim %lld: must be "
				"even and at most 512", dir, (long long)c->qk_rope_head_dim);
	if (c->num_key_value_heads != c->num_attention_heads)
		return moet_err(MOET_EUNSUP, "%s/config.json: field num_key_value_heads %lld: MLA "
				"needs num_attention_heads (%lld)", dir,
				(long long)c->num_key_value_heads, (long long)c->num_attention_heads);
	if (c->n_routed_experts > MOET_MODEL_MAX_EXPERTS)
		return moet_err(MOET_EUNSUP, "%s/config.json: field n_routed_experts %lld: at most "
				"%d are supported", dir, (long long)c->n_routed_experts,
				MOET_MODEL_MAX_EXPERTS);
	if (c->num_experts_per_tok > MOET_MODEL_MAX_TOPK)
		return moet_err(MOET_EUNSUP, "%s/config.json: field num_experts_per_tok %lld: at "
				"most %d are supported", dir, (long long)c->num_experts_per_tok,
				MOET_MODEL_MAX_TOPK);
	if (c->fp8 && (c->fp8_block_rows != MOET_BLOCK || c->fp8_block_cols != MOET_BLOCK))
		return moet_err(MOET_EUNSUP, "%s/config.json: field quantization_config."
				"weight_block_size [%lld, %lld]: only [128, 128] is supported", dir,
				(long long)c->fp8_block_rows, (long long)c->fp8_block_cols);
	return 0;
}

int moet_model_open_on(const char *dir, const char *device, moet_model **out)
{
	return moet_model_open_tp(dir, device, 0, out);
}

/* MOET_TRACE=FILE (unset or empty: off): the timeline of the model's passes (moet_trace.h),
 * the backend wrapped (backend_trace.c); the file is made at the first pass (a model that runs
 * none, as bench e2e's placement reader, writes nothing), FILE.1, FILE.2, ... for the later
 * models of the process with the same FILE. MOET_TRACE_MAX: the most spans written (default
 * 1000000; 0: no limit). Not with MOET_OP_TIMES (whose waits would be the timeline). */
static int trace_open(moet_model *m, int timed)
{
	const char *path = getenv("MOET_TRACE"), *mx = getenv("MOET_TRACE_MAX");
	if (!path || !*path)
		return 0;
	if (timed)
		return moet_err(MOET_EINVAL, "MOET_TRACE and MOET_OP_TIMES=1 together: the op "
				"times wait for every op, choose one");
	long long max = 1000000;
	if (mx && *mx) {
		char *end;
		errno = 0;
		max = strtoll(mx, &end, 10);
		if (*end || errno || max < 0)
			return moet_err(MOET_EINVAL, "MOET_TRACE_MAX='%s': want a count of spans >= 0 "
					"(0: no limit)", mx);
	}
	moet_backend *traced = NULL;
	int rc = moet_trace_open(path, max, &m->trace);
	if (!rc && !(rc = moet_backend_trace_create(m->be, m->trace, &traced)))
		m->be = traced;
	return rc;
}

int moet_model_trace_end(moet_model *m)
{
	if (!m || !m->trace)
		return 0;
	if (m->be)
		moet_backend_trace_set(m->be, NULL); /* later passes write nothing */
	if (m->hy)
		moet_hybrid_set_trace(m->hy, NULL);
	int rc = moet_trace_close(m->trace);
	m->trace = NULL;
	return rc;
}

int moet_model_open_tp(const char *dir, const char *device, int tp, moet_model **out)
{
	if (tp < 0 || tp > MOET_TP_MAX)
		return moet_err(MOET_EINVAL, "tensor-parallel ranks %d: 1 to %d", tp, MOET_TP_MAX);
	moet_model *m = calloc(1, sizeof(*m));
	char path[4096];
	const moet_tensor *emb;
	int rc;
	if (!m)
		return moet_err(MOET_ENOMEM, "model");
	snprintf(path, sizeof(path), "%s/config.json", dir);
	if ((rc = moet_config_load(path, &m->cfg)))
		goto fail;
	if ((rc = check_config(&m->cfg, dir)))
		goto fail;
	if ((rc = moet_ckpt_open(dir, &m->ck)))
		goto fail;
	if ((rc = moet_backend_create(device, &m->cfg, &m->be)))
		goto fail;
	const char *ot = getenv("MOET_OP_TIMES");
	if (ot && !strcmp(ot, "1")) {
		moet_backend *timed = NULL;
		if ((rc = moet_backend_timed_create(m->be, &timed)))
			goto fail;
		m->be = timed;
	}
	if ((rc = trace_open(m, ot && !strcmp(ot, "1"))))
		goto fail;
	/* NOTE: the expanded form (K and V per head cached) is the reference; the absorbed form
	 * caches the 576-float latent of a Kimi-K2 position instead of 20480 floats.
	 * MOET_MLA=absorbed selects it where the backend has it. */
	static const char *const mla_forms[] = { "expanded", "absorbed" };
	if ((rc = moet_env_choice("MOET_MLA", mla_forms, 2, &m->mla_absorbed)))
		goto fail;
	if (m->mla_absorbed && (!m->be->ops->attend_latent || !m->be->ops->kv_store_latent)) {
		rc = moet_err(MOET_EUNSUP, "MOET_MLA=absorbed: the %s backend has no "
			      "absorbed-form attention yet", m->be->ops->name);
		goto fail;
	}
	const moet_config *c = &m->cfg;
	/* MOET_TP: the inputs of the split matrices are rows of h, attn, qa or kva */
	int tp_n = tp;
	int64_t wide = c->hidden_size;
	const int64_t widths[] = { c->num_attention_heads * c->v_head_dim, c->q_lora_rank,
				   c->kv_lora_rank + c->qk_rope_head_dim };
	for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++)
		wide = widths[i] > wide ? widths[i] : wide;
	if ((!tp && (rc = moet_tp_switch(&tp_n))) || (rc = moet_tp_create(m, tp_n, wide, &m->tp)))
		goto fail;
	int64_t eshape[2] = { c->vocab_size, c->hidden_size };
	if ((rc = moet_ckpt_find(m->ck, "model.embed_tokens.weight", MOET_DT_INVALID, 2, eshape,
				 &emb)))
		goto fail;
	if (emb->dtype != MOET_DT_BF16 && emb->dtype != MOET_DT_F32 && emb->dtype != MOET_DT_F16) {
		rc = moet_err(MOET_EUNSUP, "%s: tensor model.embed_tokens.weight has dtype %s; "
			      "expected BF16, F16 or F32", moet_ckpt_shard_path(m->ck, emb->shard),
			      moet_dtype_name(emb->dtype));
		goto fail;
	}
	moet_mat emb_host = { .dtype = emb->dtype, .rows = c->vocab_size, .cols = c->hidden_size,
			      .data = emb->data };
	/* NOTE: a device backend's dense matrices go up in one bulk upload at the end of the
	 * open (the hot experts' source and speed) instead of one pageable copy each */
	m->defer_dense = !m->be->ops->host_memory;
	if ((rc = bind_dense(m, &emb_host, &m->embed)))
		goto fail;
	if ((rc = bind_split(m, c->tie_word_embeddings ? "model.embed_tokens" : "lm_head",
			     c->vocab_size, c->hidden_size, 0, m->tp ? moet_tp_lm_head(m->tp) : NULL,
			     &m->lm_head)))
		goto fail;
	if ((rc = load_vector(m, "model.norm.weight", c->hidden_size, &m->final_norm)))
		goto fail;
	m->layers = calloc((size_t)c->num_hidden_layers, sizeof(*m->layers));
	if (!m->layers) {
		rc = moet_err(MOET_ENOMEM, "layers");
		goto fail;
	}
	for (int64_t l = 0; l < c->num_hidden_layers; l++)
		if ((rc = bind_layer(m, l, &m->layers[l])))
			goto fail;
	if ((rc = bind_dense_flush(m)) || (m->tp && (rc = moet_tp_flush(m->tp, m->ck))))
		goto fail;
	if ((rc = moet_rope_init(m)))
		goto fail;
	if ((rc = m->be->ops->bind_vec(m->be, m->inv_freq, c->qk_rope_head_dim / 2,
				       &m->inv_freq_b)) ||
	    (rc = moet_tp_bind_freq(m->tp, m->inv_freq, c->qk_rope_head_dim / 2)))
		goto fail;
	*out = m;
	return 0;
fail:
	moet_model_close(m);
	return rc;
}

int moet_model_open(const char *dir, moet_model **out)
{
	return moet_model_open_on(dir, "cpu", out);
}

void moet_model_close(moet_model *m)
{
	if (!m)
		return;
	moet_xtier_destroy(m->xtier);
	if (m->layers) {
		for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) {
			free(m->layers[l].experts);
			free(m->layers[l].experts_host);
		}
		free(m->layers);
	}
	moet_model_free_bufs(m);
	moet_model_set_placement(m, NULL, 0);
	moet_model_set_shadow(m, 0);
	moet_model_free_dispatch(m);
	moet_tp_destroy(m->tp);
	for (int i = 0; i < m->n_dev_blocks; i++)
		m->be->ops->free(m->be, m->dev_blocks[i]);
	free(m->dev_blocks);
	free(m->dense_host);
	free(m->dense_out);
	for (int i = 0; i < m->n_host_vecs; i++)
		free(m->host_vecs[i]);
	free(m->host_vecs);
	free(m->inv_freq);
	(void)moet_model_trace_end(m); /* a caller that wants its errors ends it first */
	moet_backend_destroy(m->be);
	moet_ckpt_close(m->ck);
	free(m);
}

const moet_config *moet_model_config(const moet_model *m)
{
	return &m->cfg;
}

void moet_model_set_route_observer(moet_model *m, moet_route_fn fn, void *ctx)
{
	m->route_fn = fn;
	m->route_ctx = ctx;
}

const moet_ckpt *moet_model_ckpt(const moet_model *m)
{
	return m->ck;
}
