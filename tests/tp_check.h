/*
 * tp_check.h: the check of MOET_TP (runtime/tp.c) that tests/runtime/test_tp.c (the CPU
 * backend's ranks, the test double) and tests/gpu/test_gpu_tp.c (CUDA devices over NCCL)
 * share. The reference is the CPU backend without a split (MOET_TP unset), per MLA form; a
 * model opened on `device` with MOET_TP=n must give its logits bit for bit:
 *   - ragged batches (prefills of several sequences in one call, then batched decode steps)
 *     and the same sequences one per call;
 *   - with a placement (owner, n_dev devices: simulated on the CPU backend, GPUs on CUDA) and
 *     two micro-batches forced (MOET_MICROBATCH=1);
 * and the ranks' bytes of the split matrices add up to the checkpoint's tensors (q_b or
 * q_proj, kv_b in the expanded form, o_proj, the dense MLP, the shared experts, lm_head),
 * every rank holding some.
 */
#ifndef TP_CHECK_H
#define TP_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_placement.h"
#include "moet_test.h"

#define TP_SEQS 3
#define TP_STEPS 3

/* The checkpoint's bytes (data and scales) of the matrices MOET_TP splits (kv_b unless
 * kvb_whole: the absorbed form with the attention whole on rank 0). */
static uint64_t tp_split_bytes(const moet_model *m, int kvb_whole)
{
	const moet_config *c = moet_model_config(m);
	const moet_ckpt *ck = moet_model_ckpt(m);
	static const char *const mats[] = {
		"self_attn.q_b_proj", "self_attn.q_proj", "self_attn.kv_b_proj", "self_attn.o_proj",
		"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.shared_experts.gate_proj",
		"mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj",
	};
	static const char *const part[] = { "weight", "weight_scale_inv" };
	char name[160];
	uint64_t sum = 0;
	for (int64_t l = 0; l < c->num_hidden_layers; l++)
		for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
			for (int j = 0; j < 2; j++) {
				if (kvb_whole && i == 2)
					continue;
				snprintf(name, sizeof(name), "model.layers.%lld.%s.%s", (long long)l,
					 mats[i], part[j]);
				const moet_tensor *t = moet_ckpt_get(ck, name);
				sum += t ? t->n_bytes : 0;
			}
	const moet_tensor *t = moet_ckpt_get(ck, c->tie_word_embeddings ? "model.embed_tokens.weight"
									 : "lm_head.weight");
	return sum + (t ? t->n_bytes : 0);
}

/* The reference's logits (CPU backend, no split) of both runs: [2][TP_STEPS+1][TP_SEQS][V]. */
static int tp_reference(const char *dir, int absorbed, float *ref, size_t n_log)
{
	moet_model *m = NULL;
	moet_test_env("MOET_TP", NULL);
	moet_test_env("MOET_MLA", absorbed ? "absorbed" : NULL);
	int rc = moet_model_open(dir, &m);
	if (!rc)
		rc = moet_test_ragged_run(m, TP_SEQS, TP_STEPS, 1, ref);
	if (!rc)
		rc = moet_test_ragged_run(m, TP_SEQS, TP_STEPS, 0, ref + n_log);
	moet_model_close(m);
	moet_test_env("MOET_MLA", NULL);
	return rc;
}

/* MOET_TP=ranks on device against ref (tp_reference's, same form); what: the case's name;
 * attn: moet_model_tp_attention's answer wanted (-1: any). */
static void tp_case_attn(const char *dir, const char *device, int ranks, int absorbed,
			 const int16_t *own, int n_dev, const float *ref, float *got, size_t n_log,
			 const char *what, int attn)
{
	char v[16];
	snprintf(v, sizeof(v), "%d", ranks);
	moet_test_env("MOET_TP", v);
	moet_test_env("MOET_MLA", absorbed ? "absorbed" : NULL);
	moet_model *m = NULL;
	int rc = moet_model_open_on(dir, device, &m);
	moet_test_env("MOET_TP", NULL);
	moet_test_env("MOET_MLA", NULL);
	CHECK(rc == 0, "%s: open %s with MOET_TP=%d: %s", what, device, ranks, moet_errmsg());
	if (rc)
		return;
	uint64_t bytes[8] = { 0 }, sum = 0;
	const int n = moet_model_tp_ranks(m, bytes);
	CHECK(n == ranks, "%s: %d ranks, want %d", what, n, ranks);
	CHECK(attn < 0 || moet_model_tp_attention(m) == attn, "%s: attention form %d, want %d",
	      what, moet_model_tp_attention(m), attn);
	for (int r = 0; r < n && r < 8; r++) {
		CHECK(bytes[r] > 0, "%s: rank %d holds no split bytes", what, r);
		sum += bytes[r];
	}
	const char *ta = getenv("MOET_TP_ATTN");
	const int split = !(ta && !strcmp(ta, "rank0")); /* the attention by heads */
	const uint64_t want = tp_split_bytes(m, absorbed && !split);
	CHECK(sum == want, "%s: the ranks hold %llu bytes of the split matrices, the checkpoint "
	      "%llu", what, (unsigned long long)sum, (unsigned long long)want);
	/* the placement's accounting of `dense: split` over `ranks` GPUs (placement/, from the
	 * geometry) counts the bytes each rank holds (the default form: expanded, by heads) */
	moet_placement_sizes *ps = NULL;
	if (!(ta && *ta) &&
	    !moet_placement_sizes_from_ckpt(moet_model_config(m), moet_model_ckpt(m), &ps))
		for (int r = 0; r < n && r < 8; r++)
			CHECK(ps->tp_bytes[ranks][r] == bytes[r], "%s: rank %d holds %llu split "
			      "bytes, the placement's accounting says %llu", what, r,
			      (unsigned long long)bytes[r],
			      (unsigned long long)ps->tp_bytes[ranks][r]);
	moet_placement_sizes_free(ps);
	/* the attention split by heads (expanded form): rank 0's cache holds its heads only */
	const moet_config *c = moet_model_config(m);
	const int64_t per = (c->num_attention_heads + ranks - 1) / ranks;
	const size_t kvb = moet_kv_token_bytes(m), want_kv = (size_t)c->num_hidden_layers *
		(size_t)((split ? per : c->num_attention_heads) *
			 (moet_config_qk_head_dim(c) + c->v_head_dim) * 4);
	CHECK(absorbed || kvb == want_kv, "%s: rank 0's KV bytes per position %zu, want %zu "
	      "(%s)", what, kvb, want_kv, split ? "its heads" : "every head");
	for (int batched = 1; batched >= 0; batched--) {
		memset(got, 0xCD, n_log * sizeof(float));
		rc = moet_test_ragged_run(m, TP_SEQS, TP_STEPS, batched, got);
		CHECK(rc == 0 && !memcmp(got, ref + (batched ? 0 : n_log), n_log * sizeof(float)),
		      "%s, %s: logits differ from the unsplit CPU reference (%s)", what,
		      batched ? "batched" : "one sequence per call", rc ? moet_errmsg() : "bits");
	}
	if (own) {
		rc = moet_model_set_placement(m, own, n_dev);
		CHECK(rc == 0, "%s: placement: %s", what, moet_errmsg());
		moet_test_env("MOET_MICROBATCH", "1");
		memset(got, 0xCD, n_log * sizeof(float));
		if (!rc)
			rc = moet_test_ragged_run(m, TP_SEQS, TP_STEPS, 1, got);
		moet_test_env("MOET_MICROBATCH", NULL);
		CHECK(rc == 0 && !memcmp(got, ref, n_log * sizeof(float)),
		      "%s, placement over %d devices and the CPU, two micro-batches: logits differ "
		      "(%s)", what, n_dev, rc ? moet_errmsg() : "bits");
	}
	printf("%s: MOET_TP=%d on %s, %s MLA, attention form %d: bits equal; rank bytes", what,
	       ranks, device, absorbed ? "absorbed" : "expanded", moet_model_tp_attention(m));
	for (int r = 0; r < n && r < 8; r++)
		printf(" %llu", (unsigned long long)bytes[r]);
	printf("\n");
	moet_model_close(m);
}

/* A tiny checkpoint of 4 layers (seed), its logits' size and buffers, and a placement that
 * cycles the CPU tier, device 0 and device 1 over every (layer, expert). */
typedef struct tp_ctx {
	char *dir;
	size_t n_log;       /* floats of one ragged run's logits */
	float *ref, *got;   /* [2][n_log], [n_log] */
	int16_t *own;       /* [layers][experts] */
} tp_ctx;

static void tp_ctx_free(tp_ctx *x)
{
	free(x->dir);
	free(x->ref);
	free(x->got);
	free(x->own);
}

/* Returns 0, or -1 with the failure counted (x freed). */
static int tp_prepare(const char *tag, moet_gen_preset preset, uint64_t seed, tp_ctx *x)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.preset = preset;
	gp.seed = seed;
	gp.n_layers = 4;
	memset(x, 0, sizeof(*x));
	moet_model *m = NULL;
	if (!(x->dir = moet_test_gen(tag, &gp)))
		return -1;
	int rc = moet_model_open(x->dir, &m);
	CHECK(rc == 0, "%s: open: %s", tag, moet_errmsg());
	if (!rc) {
		const moet_config *c = moet_model_config(m);
		const int64_t n_own = c->num_hidden_layers * c->n_routed_experts;
		x->n_log = (size_t)((TP_STEPS + 1) * TP_SEQS * c->vocab_size);
		x->ref = malloc(2 * x->n_log * sizeof(float));
		x->got = malloc(x->n_log * sizeof(float));
		x->own = malloc((size_t)n_own * sizeof(*x->own));
		for (int64_t i = 0; x->own && i < n_own; i++)
			x->own[i] = (int16_t)(i % 3 - 1);
		CHECK(x->ref && x->got && x->own, "host memory");
		rc = x->ref && x->got && x->own ? 0 : -1;
		CHECK(moet_model_tp_ranks(m, NULL) == 1, "unset MOET_TP: one rank");
	}
	moet_model_close(m);
	if (rc)
		tp_ctx_free(x);
	return rc ? -1 : 0;
}

static void tp_case(const char *dir, const char *device, int ranks, int absorbed,
		    const int16_t *own, int n_dev, const float *ref, float *got, size_t n_log,
		    const char *what)
{
	tp_case_attn(dir, device, ranks, absorbed, own, n_dev, ref, got, n_log, what, -1);
}

#endif
