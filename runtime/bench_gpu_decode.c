/*
 * bench_gpu_decode.c: the decode part of `bench gpu-experts` (and the row table): the decode
 * step time of a whole model on one backend, at batch 1, 16 and 64 (docs/benchmarks.md).
 *
 *   checkpoint  --model-dir DIR; when DIR is missing or empty, a Kimi-K2-geometry checkpoint
 *               of 2 layers (layer 0 dense, layer 1 MoE with 384 experts) is generated there
 *               first (moet_gen_checkpoint: ~22 GB)
 *   per batch   B sequences, each prefilled with its own prompt of random ids in one batch,
 *               one warm-up step, then the timed steps: one moet_model_forward_batch of B
 *               sequences x 1 token with the last token's logits to the host (so lm_head is
 *               in), host wall time (the call returns when the logits are on the host);
 *               then one more step with the route observer on, to count the distinct
 *               experts a step of this batch reads (not timed: the observer downloads ids)
 *
 * A row's bytes are the weights one step reads: every tensor of the model except the routed
 * experts and the embedding table (attention, dense MLP, shared experts, routers, norms,
 * lm_head), plus the B embedding rows, plus the distinct routed experts of the observed step
 * (codes and scales). The KV cache reads are left out (a few % at these lengths), so the
 * ratio against copy_GBps is a lower bound of the achieved share of the bandwidth.
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu_int.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"

void moet_bench_gpu_print_rows(const moet_bench_row_out *rows, int n, FILE *f)
{
	int w = 6;
	for (int i = 0; i < n; i++)
		w = (int)strlen(rows[i].name) > w ? (int)strlen(rows[i].name) : w;
	fprintf(f, "%-*s %7s %11s %11s %11s %9s %10s %-12s %6s\n", w, "name", "tokens",
		"median_ms", "min_ms", "max_ms", "GB/s", "GFLOP/s", "ceiling", "ratio");
	for (int i = 0; i < n; i++) {
		const moet_bench_row *r = &rows[i].r;
		fprintf(f, "%-*s %7lld %11.3f %11.3f %11.3f %9.1f %10.1f %-12s %6.3f\n", w, r->name,
			(long long)r->tokens, 1e3 * r->st.median_s, 1e3 * r->st.min_s,
			1e3 * r->st.max_s, r->bytes / r->st.median_s / 1e9,
			r->flops / r->st.median_s / 1e9, r->ceiling, r->ratio);
	}
}

/* 1: dir missing or empty, 0: has entries, < 0: error. */
static int dir_empty(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 1 : moet_err(MOET_EIO, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	int empty = 1;
	while (empty && (e = readdir(d)))
		empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
	closedir(d);
	return empty;
}

typedef struct gen_log {
	FILE *log;
	int last_pct;
	double t0;
} gen_log;

static void gen_progress(void *ctx, const moet_gen_progress *p)
{
	gen_log *g = ctx;
	int pct = p->total_bytes ? (int)(100.0 * (double)p->done_bytes / (double)p->total_bytes) : 0;
	if (pct / 10 != g->last_pct / 10 || p->done_bytes == p->total_bytes) {
		fprintf(g->log, "gpu-experts: checkpoint %d%% (%.1f of %.1f GB, %.0f s)\n", pct,
			(double)p->done_bytes / 1e9, (double)p->total_bytes / 1e9,
			moet_bench_now_s() - g->t0);
		g->last_pct = pct;
	}
}

/* Weight bytes per step that do not depend on the routing; per-layer routed expert bytes. */
static void weight_bytes(const moet_model *m, double *fixed, double *embed_row,
			 double *expert_bytes /* [n_layers] */)
{
	const moet_config *c = moet_model_config(m);
	const moet_ckpt *ck = moet_model_ckpt(m);
	*fixed = 0;
	*embed_row = 0;
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		long long l = -1;
		int at = 0;
		if (sscanf(t->name, "model.layers.%lld.%n", &l, &at) == 1 && at > 0) {
			if (l < 0 || l >= c->num_hidden_layers)
				continue; /* MTP layers: not run */
			const char *ex = strstr(t->name, ".mlp.experts.");
			if (ex) {
				if (!strncmp(ex + strlen(".mlp.experts."), "0.", 2))
					expert_bytes[l] += (double)t->n_bytes;
				continue;
			}
		} else if (!strncmp(t->name, "model.embed_tokens.", 19)) {
			*embed_row = t->shape[0] ? (double)t->n_bytes / (double)t->shape[0] : 0;
			if (!c->tie_word_embeddings)
				continue; /* tied: lm_head reads the whole table */
		}
		*fixed += (double)t->n_bytes;
	}
}

typedef struct route_count {
	int64_t n_layers, n_exp;
	uint8_t *seen;  /* [n_layers][n_exp] */
	int64_t distinct;
	double bytes;
	const double *expert_bytes;
} route_count;

static void on_route(void *ctx, const moet_route_event *ev)
{
	route_count *r = ctx;
	for (int i = 0; i < ev->top_k; i++) {
		int64_t id = ev->ids[i];
		if (ev->layer < 0 || ev->layer >= r->n_layers || id < 0 || id >= r->n_exp)
			continue;
		uint8_t *s = &r->seen[ev->layer * r->n_exp + id];
		if (!*s) {
			*s = 1;
			r->distinct++;
			r->bytes += r->expert_bytes[ev->layer];
		}
	}
}

typedef struct dec {
	const moet_bench_gpu_opts *o;
	moet_model *m;
	int64_t V, prompt, steps, warm;
	double fixed, embed_row, *expert_bytes;
	uint64_t rng;
} dec;

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* One step of B sequences x 1 token (fresh random ids), logits of each to logits[s]. */
static int step(dec *d, moet_kv **kv, int64_t B, int64_t *ids, float *logits,
		moet_seq_step *st)
{
	for (int64_t s = 0; s < B; s++) {
		ids[s] = (int64_t)(xorshift(&d->rng) % (uint64_t)d->V);
		st[s] = (moet_seq_step){ .kv = kv[s], .tokens = ids + s, .n_tok = 1,
					 .out_logits = logits + s * d->V, .last_only = 1 };
	}
	return moet_model_forward_batch(d->m, st, (int)B);
}

static int batch_row(dec *d, const moet_bench_ceil *c, int64_t B, const char *name,
		     json_t *rec, FILE *log, moet_bench_row_out *out)
{
	const moet_config *cf = moet_model_config(d->m);
	moet_kv **kv = calloc((size_t)B, sizeof(*kv));
	int64_t *ids = malloc((size_t)(B * (d->prompt > 1 ? d->prompt : 1)) * sizeof(*ids));
	float *logits = malloc((size_t)(B * d->V) * sizeof(float));
	moet_seq_step *st = calloc((size_t)B, sizeof(*st));
	double *samples = calloc((size_t)d->steps, sizeof(double));
	route_count rcnt = { .n_layers = cf->num_hidden_layers, .n_exp = cf->n_routed_experts,
			     .expert_bytes = d->expert_bytes };
	rcnt.seen = calloc((size_t)(rcnt.n_layers * (rcnt.n_exp > 0 ? rcnt.n_exp : 1)), 1);
	int rc = 0;
	if (!kv || !ids || !logits || !st || !samples || !rcnt.seen) {
		rc = moet_err(MOET_ENOMEM, "decode batch %lld", (long long)B);
		goto fail;
	}
	fprintf(log, "gpu-experts: decode, batch %lld: prefill %lld tokens per sequence ...\n",
		(long long)B, (long long)d->prompt);
	for (int64_t s = 0; s < B && !rc; s++)
		rc = moet_kv_create(d->m, d->prompt + d->warm + d->steps + 2, &kv[s]);
	for (int64_t i = 0; i < B * d->prompt; i++)
		ids[i] = (int64_t)(xorshift(&d->rng) % (uint64_t)d->V);
	for (int64_t s = 0; s < B && !rc; s++)
		st[s] = (moet_seq_step){ .kv = kv[s], .tokens = ids + s * d->prompt,
					 .n_tok = d->prompt };
	if (!rc && d->prompt > 0)
		rc = moet_model_forward_batch(d->m, st, (int)B);
	for (int64_t i = 0; i < d->warm && !rc; i++)
		rc = step(d, kv, B, ids, logits, st);
	for (int64_t i = 0; i < d->steps && !rc; i++) {
		double t0 = moet_bench_now_s();
		rc = step(d, kv, B, ids, logits, st);
		samples[i] = moet_bench_now_s() - t0;
	}
	if (!rc) {
		moet_model_set_route_observer(d->m, on_route, &rcnt);
		rc = step(d, kv, B, ids, logits, st);
		moet_model_set_route_observer(d->m, NULL, NULL);
	}
	if (rc)
		goto fail;
	moet_bench_stats sst;
	moet_bench_stats_of(samples, (int)d->steps, &sst);
	const double bytes = d->fixed + (double)B * d->embed_row + rcnt.bytes;
	snprintf(out->name, sizeof(out->name), "%s", name);
	out->r = (moet_bench_row){ .name = out->name, .tokens = B, .st = sst, .bytes = bytes,
				   .ceiling = c->copy_Bps > 0 ? "copy_GBps" : "none",
				   .ratio = c->copy_Bps > 0 ? bytes / sst.median_s / c->copy_Bps
							    : 0 };
	if ((rc = moet_bench_add_row(rec, &out->r)))
		goto fail;
	json_t *res = json_object_get(rec, "results");
	json_t *row = json_array_get(res, json_array_size(res) - 1);
	json_object_set_new(row, "batch", json_integer(B));
	json_object_set_new(row, "tokens_per_s", json_real((double)B / sst.median_s));
	json_object_set_new(row, "distinct_experts", json_integer(rcnt.distinct));
	json_object_set_new(row, "prompt_len", json_integer(d->prompt));
fail:
	for (int64_t s = 0; kv && s < B; s++)
		moet_kv_destroy(kv[s]);
	free(kv);
	free(ids);
	free(logits);
	free(st);
	free(samples);
	free(rcnt.seen);
	return rc;
}

int moet_bench_gpu_decode(const moet_bench_gpu_opts *o, const moet_bench_ceil *c, json_t *rec,
			  FILE *log, moet_bench_row_out *rows, int *n_rows)
{
	static const int64_t def_b[] = { 1, 16, 64 };
	const char *dev = o->decode_device ? o->decode_device : "cuda";
	const int64_t *bs = o->batches ? o->batches : def_b;
	const int n_b = o->batches ? o->n_batches : 3;
	dec d = { .o = o, .prompt = o->prompt_len ? o->prompt_len : 8,
		  .steps = o->decode_steps ? o->decode_steps : (o->quick ? 3 : 5), .warm = 1,
		  .rng = 0x2545F4914F6CDD1Dull };
	double gen_s = 0, open_s = 0;
	int rc = dir_empty(o->model_dir), generated = rc == 1;
	if (rc < 0)
		return rc;
	if (generated) {
		moet_gen_params p;
		moet_gen_params_init(&p);
		p.preset = MOET_GEN_KIMI_K2;
		p.n_layers = 2;
		p.n_experts = 384;
		gen_log g = { .log = log, .last_pct = -10, .t0 = moet_bench_now_s() };
		p.progress = gen_progress;
		p.progress_ctx = &g;
		fprintf(log, "gpu-experts: generating a 2-layer kimi-k2 checkpoint (384 experts) in "
			"%s ...\n", o->model_dir);
		if ((rc = moet_gen_checkpoint(o->model_dir, &p)))
			return rc;
		gen_s = moet_bench_now_s() - g.t0;
	}
	fprintf(log, "gpu-experts: opening %s on %s ...\n", o->model_dir, dev);
	double t0 = moet_bench_now_s();
	if ((rc = moet_model_open_on(o->model_dir, dev, &d.m)))
		return rc;
	open_s = moet_bench_now_s() - t0;
	const moet_config *cf = moet_model_config(d.m);
	d.V = cf->vocab_size;
	d.expert_bytes = calloc((size_t)cf->num_hidden_layers, sizeof(double));
	if (!d.expert_bytes) {
		rc = moet_err(MOET_ENOMEM, "decode");
		goto fail;
	}
	weight_bytes(d.m, &d.fixed, &d.embed_row, d.expert_bytes);
	int64_t n_moe = 0;
	for (int64_t l = 0; l < cf->num_hidden_layers; l++)
		n_moe += moet_config_is_moe_layer(cf, l);
	char name[96];
	snprintf(name, sizeof(name), "decode-step (%lld MoE + %lld dense layer(s), embed, "
		 "lm_head)", (long long)n_moe, (long long)(cf->num_hidden_layers - n_moe));
	for (int i = 0; i < n_b && !rc; i++) {
		if (bs[i] < 1 || bs[i] > 4096) {
			rc = moet_err(MOET_EINVAL, "decode batch %lld (want 1 .. 4096)",
				      (long long)bs[i]);
			break;
		}
		if (!(rc = batch_row(&d, c, bs[i], name, rec, log, &rows[i])))
			(*n_rows)++;
	}
	if (!rc)
		json_object_set_new(rec, "decode", json_pack(
			"{s:s, s:s, s:b, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			" s:I, s:I, s:I, s:I, s:f, s:s}",
			"model_dir", o->model_dir, "device", dev, "generated", generated,
			"generate_s", gen_s, "open_s", open_s,
			"layers", (json_int_t)cf->num_hidden_layers, "moe_layers", (json_int_t)n_moe,
			"hidden", (json_int_t)cf->hidden_size, "experts",
			(json_int_t)cf->n_routed_experts, "top_k", (json_int_t)cf->num_experts_per_tok,
			"moe_intermediate", (json_int_t)cf->moe_intermediate_size,
			"intermediate", (json_int_t)cf->intermediate_size,
			"vocab", (json_int_t)cf->vocab_size, "heads",
			(json_int_t)cf->num_attention_heads, "q_lora_rank",
			(json_int_t)cf->q_lora_rank, "kv_lora_rank", (json_int_t)cf->kv_lora_rank,
			"qk_nope_head_dim", (json_int_t)cf->qk_nope_head_dim, "qk_rope_head_dim",
			(json_int_t)cf->qk_rope_head_dim, "v_head_dim", (json_int_t)cf->v_head_dim,
			"fixed_weight_bytes", d.fixed, "timing",
			"host wall time of moet_model_forward_batch, logits on the host"));
fail:
	free(d.expert_bytes);
	moet_model_close(d.m);
	return rc;
}
