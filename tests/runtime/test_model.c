/*
 * test_model.c: the CPU reference model on a synthetic tiny checkpoint.
 *   - batch invariance: the prompt in one call, token by token, and in uneven chunks give
 *     bit-identical logits (memcmp); a second run gives the same bits (determinism);
 *   - generate's first token is the argmax of the forward pass's last row;
 *   - bad input: token out of range, KV cache full;
 *   - config.json disagreeing with the tensors: a shape mismatch names the shard and tensor,
 *     a tensor the config implies but the checkpoint lacks is named as missing;
 *   - layers past num_hidden_layers (DeepSeek-V3's MTP layer) are accepted and skipped;
 *   - the CPU backend's thread team: 1 thread and 3 threads give the same bits;
 *   - real batching: three sequences with ragged lengths at different positions in one
 *     moet_model_forward_batch give each sequence's solo logits bit for bit; last_only gives
 *     the last row; two entries sharing a cache are refused.
 * (Agreement with transformers is tests/oracle's job.)
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define T 12

/* A copy of `src` whose config.json has `key` set to `value`; shards are symlinked. */
static char *variant(const char *src, const char *tag, const char *key, json_int_t value)
{
	char *dir = moet_test_mkdtemp(tag);
	char path[4096], target[4096];
	const char *files[] = { "model.safetensors.index.json" };
	if (!dir)
		return NULL;
	snprintf(path, sizeof(path), "%s/config.json", src);
	json_t *cfg = json_load_file(path, 0, NULL);
	if (!cfg)
		return NULL;
	json_object_set_new(cfg, key, json_integer(value));
	snprintf(path, sizeof(path), "%s/config.json", dir);
	json_dump_file(cfg, path, JSON_INDENT(2));
	json_decref(cfg);
	for (size_t i = 0; i < 1; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		snprintf(target, sizeof(target), "%s/%s", src, files[i]);
		if (symlink(target, path))
			return NULL;
	}
	for (int s = 1; s < 100; s++) {
		for (int n = 1; n < 100; n++) {
			snprintf(target, sizeof(target), "%s/model-%05d-of-%05d.safetensors", src, s, n);
			if (access(target, F_OK) == 0) {
				snprintf(path, sizeof(path), "%s/model-%05d-of-%05d.safetensors", dir, s, n);
				if (symlink(target, path))
					return NULL;
			}
		}
	}
	return dir;
}

static void logits_of(moet_model *m, const int64_t *tok, const int *chunks, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	moet_kv *kv = NULL;
	CHECK(moet_kv_create(m, T, &kv) == 0, "kv: %s", moet_errmsg());
	for (int i = 0, at = 0; at < T; at += chunks[i], i++)
		CHECK(moet_model_forward(m, kv, tok + at, chunks[i], out + at * V) == 0,
		      "forward: %s", moet_errmsg());
	moet_kv_destroy(kv);
}

typedef struct route_count {
	int events, prefill, bad;
	int64_t layers_seen;
	const moet_config *cfg;
} route_count;

static void on_route(void *ctx, const moet_route_event *ev)
{
	route_count *rc = ctx;
	const moet_config *c = rc->cfg;
	double sum = 0;
	rc->events++;
	rc->prefill += ev->is_prefill;
	rc->layers_seen |= (int64_t)1 << ev->layer;
	for (int i = 0; i < ev->top_k; i++) {
		sum += ev->weights[i];
		for (int j = 0; j < i; j++)
			rc->bad += ev->ids[i] == ev->ids[j];
		rc->bad += ev->ids[i] < 0 || ev->ids[i] >= c->n_routed_experts;
	}
	rc->bad += ev->top_k != c->num_experts_per_tok;
	if (c->norm_topk_prob)
		rc->bad += fabs(sum - c->routed_scaling_factor) > 1e-5 * c->routed_scaling_factor;
}

/* The route observer sees every (MoE layer, token) decision exactly once. */
static void test_route_observer(moet_model *m, const int64_t *tok)
{
	const moet_config *c = moet_model_config(m);
	route_count rc = { .cfg = c };
	int64_t moe_layers = 0, moe_mask = 0;
	for (int64_t l = 0; l < c->num_hidden_layers; l++)
		if (moet_config_is_moe_layer(c, l)) {
			moe_layers++;
			moe_mask |= (int64_t)1 << l;
		}
	moet_kv *kv = NULL;
	CHECK(moet_kv_create(m, T, &kv) == 0, "kv");
	moet_model_set_route_observer(m, on_route, &rc);
	CHECK(moet_model_forward(m, kv, tok, 4, NULL) == 0, "prefill");
	CHECK(moet_model_forward(m, kv, tok + 4, 1, NULL) == 0, "decode");
	moet_model_set_route_observer(m, NULL, NULL);
	CHECK(moet_model_forward(m, kv, tok + 5, 1, NULL) == 0, "unobserved");
	CHECK(rc.events == 5 * moe_layers, "events %d, want %lld", rc.events,
	      (long long)(5 * moe_layers));
	CHECK(rc.prefill == 4 * moe_layers, "prefill events %d", rc.prefill);
	CHECK(rc.layers_seen == moe_mask, "layers seen %llx want %llx",
	      (unsigned long long)rc.layers_seen, (unsigned long long)moe_mask);
	CHECK(rc.bad == 0, "%d malformed routing events", rc.bad);
	moet_kv_destroy(kv);
}

/* The same batch on backends with 1 and 3 worker threads: identical logits. */
static void test_threads(const char *dir, const int64_t *tok)
{
	moet_model *m1 = NULL, *m3 = NULL;
	setenv("MOET_CPU_THREADS", "1", 1);
	CHECK(moet_model_open(dir, &m1) == 0, "open 1 thread: %s", moet_errmsg());
	setenv("MOET_CPU_THREADS", "3", 1);
	CHECK(moet_model_open(dir, &m3) == 0, "open 3 threads: %s", moet_errmsg());
	unsetenv("MOET_CPU_THREADS");
	if (m1 && m3) {
		const int64_t V = moet_model_config(m1)->vocab_size;
		float *a = malloc((size_t)(T * V) * sizeof(float));
		float *b = malloc((size_t)(T * V) * sizeof(float));
		const int all[] = { T };
		logits_of(m1, tok, all, a);
		logits_of(m3, tok, all, b);
		CHECK(memcmp(a, b, (size_t)(T * V) * sizeof(float)) == 0,
		      "1 vs 3 threads: logits differ");
		free(a);
		free(b);
	}
	moet_model_close(m1);
	moet_model_close(m3);
}

/* Sequence s: a history of hist[s] tokens run alone first, then new[s] tokens. */
static void test_batch(moet_model *m, const int64_t *tok)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	const int64_t hist[3] = { 5, 0, 2 }, nnew[3] = { 3, 7, 1 };
	moet_kv *solo[3], *bat[3];
	float *want[3], *got[3], *last[3];
	moet_seq_step steps[3];
	for (int s = 0; s < 3; s++) {
		const int64_t *h = tok + s, *nw = tok + s + hist[s];
		want[s] = malloc((size_t)(nnew[s] * V) * sizeof(float));
		got[s] = malloc((size_t)(nnew[s] * V) * sizeof(float));
		last[s] = malloc((size_t)V * sizeof(float));
		CHECK(moet_kv_create(m, T, &solo[s]) == 0 && moet_kv_create(m, T, &bat[s]) == 0,
		      "kv");
		if (hist[s]) {
			CHECK(moet_model_forward(m, solo[s], h, hist[s], NULL) == 0, "history");
			CHECK(moet_model_forward(m, bat[s], h, hist[s], NULL) == 0, "history");
		}
		CHECK(moet_model_forward(m, solo[s], nw, nnew[s], want[s]) == 0, "solo: %s",
		      moet_errmsg());
		steps[s] = (moet_seq_step){ .kv = bat[s], .tokens = nw, .n_tok = nnew[s],
					    .out_logits = got[s] };
	}
	CHECK(moet_model_forward_batch(m, steps, 3) == 0, "batch: %s", moet_errmsg());
	for (int s = 0; s < 3; s++) {
		CHECK(memcmp(want[s], got[s], (size_t)(nnew[s] * V) * sizeof(float)) == 0,
		      "sequence %d: batched logits differ from its solo run", s);
		CHECK(moet_kv_len(bat[s]) == hist[s] + nnew[s], "cache length");
	}
	/* last_only: one more token for sequences 0 and 2 */
	moet_seq_step two[2] = {
		{ .kv = bat[0], .tokens = tok, .n_tok = 1, .out_logits = last[0], .last_only = 1 },
		{ .kv = bat[2], .tokens = tok + 1, .n_tok = 1, .out_logits = last[2], .last_only = 1 },
	};
	CHECK(moet_model_forward_batch(m, two, 2) == 0, "last_only batch");
	CHECK(moet_model_forward(m, solo[0], tok, 1, want[0]) == 0, "solo step");
	CHECK(memcmp(want[0], last[0], (size_t)V * sizeof(float)) == 0, "last_only row");
	moet_seq_step dup[2] = { { .kv = bat[1], .tokens = tok, .n_tok = 1 },
				 { .kv = bat[1], .tokens = tok, .n_tok = 1 } };
	CHECK(moet_model_forward_batch(m, dup, 2) == MOET_EINVAL, "shared cache refused");
	for (int s = 0; s < 3; s++) {
		moet_kv_destroy(solo[s]);
		moet_kv_destroy(bat[s]);
		free(want[s]);
		free(got[s]);
		free(last[s]);
	}
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 7;
	gp.shard_mb = 1; /* several shards */
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("model-tiny", &gp, &dir);
	if (!m)
		return moet_test_done("test_model");
	const int64_t V = moet_model_config(m)->vocab_size;
	int64_t tok[T];
	for (int i = 0; i < T; i++)
		tok[i] = (i * 131 + 7) % V;
	float *a = malloc((size_t)(T * V) * sizeof(float));
	float *b = malloc((size_t)(T * V) * sizeof(float));
	float *c = malloc((size_t)(T * V) * sizeof(float));
	float *d = malloc((size_t)(T * V) * sizeof(float));
	const int all[] = { T }, ones[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	const int uneven[] = { 5, 4, 3 };
	logits_of(m, tok, all, a);
	logits_of(m, tok, ones, b);
	logits_of(m, tok, uneven, c);
	logits_of(m, tok, all, d);
	CHECK(memcmp(a, b, (size_t)(T * V) * sizeof(float)) == 0, "one call vs token by token");
	CHECK(memcmp(a, c, (size_t)(T * V) * sizeof(float)) == 0, "one call vs chunks 5,4,3");
	CHECK(memcmp(a, d, (size_t)(T * V) * sizeof(float)) == 0, "repeat run differs");
	int finite = 1;
	float mx = 0;
	for (int64_t i = 0; i < T * V; i++) {
		finite &= (a[i] == a[i]) && a[i] - a[i] == 0;
		mx = a[i] > mx ? a[i] : mx;
	}
	CHECK(finite && mx > 0, "logits finite and not all zero (max %g)", mx);

	int64_t out[4], n_out = 0, best = 0;
	const float *last = a + (T - 1) * V;
	for (int64_t v = 1; v < V; v++)
		if (last[v] > last[best])
			best = v;
	CHECK(moet_model_generate(m, tok, T, 4, 0, out, &n_out) == 0 && n_out == 4, "generate");
	CHECK(out[0] == best, "generate's first token %lld, argmax %lld", (long long)out[0],
	      (long long)best);
	/* seeded sampling: reproducible; temperature 0 is greedy */
	int64_t s1[6], s2[6], s3[6], n1 = 0, n2 = 0, n3 = 0;
	moet_sample_params sp = { .temperature = 1.0, .top_k = 0, .top_p = 0.95, .seed = 11 };
	CHECK(moet_model_generate_sampled(m, tok, T, 6, 0, &sp, s1, &n1) == 0 &&
	      moet_model_generate_sampled(m, tok, T, 6, 0, &sp, s2, &n2) == 0 && n1 == 6 &&
	      n2 == 6 && memcmp(s1, s2, sizeof(s1)) == 0, "seeded sampling is reproducible");
	sp.temperature = 0;
	CHECK(moet_model_generate_sampled(m, tok, T, 4, 0, &sp, s3, &n3) == 0 && n3 == 4 &&
	      memcmp(s3, out, 4 * sizeof(*out)) == 0, "temperature 0 = greedy");

	test_batch(m, tok);
	test_route_observer(m, tok);
	test_threads(dir, tok);

	moet_kv *kv = NULL;
	int64_t badtok = V;
	CHECK(moet_kv_create(m, 2, &kv) == 0, "kv");
	CHECK(moet_model_forward(m, kv, &badtok, 1, NULL) == MOET_ERANGE, "token out of range");
	CHECK(strstr(moet_errmsg(), "vocabulary") != NULL, "message: %s", moet_errmsg());
	CHECK(moet_model_forward(m, kv, tok, 3, NULL) == MOET_ERANGE, "cache full");
	moet_kv_destroy(kv);
	moet_model_close(m);

	/* config.json that disagrees with the tensors */
	const moet_config *cfg0 = NULL;
	moet_model *m0 = NULL;
	CHECK(moet_model_open(dir, &m0) == 0, "reopen");
	cfg0 = moet_model_config(m0);
	char *vs = variant(dir, "model-shape", "moe_intermediate_size",
			   cfg0->moe_intermediate_size * 2);
	char *vm = variant(dir, "model-missing", "first_k_dense_replace", 0);
	char *vt = variant(dir, "model-mtp", "num_hidden_layers", cfg0->num_hidden_layers - 1);
	moet_model_close(m0);
	moet_model *mx2 = NULL;
	int rc = moet_model_open(vs, &mx2);
	CHECK(rc == MOET_ESHAPE, "shape mismatch: rc %d (%s)", rc, moet_errmsg());
	CHECK(strstr(moet_errmsg(), "experts.0.gate_proj.weight") &&
	      strstr(moet_errmsg(), ".safetensors"), "shape message: %s", moet_errmsg());
	moet_model_close(mx2);
	mx2 = NULL;
	rc = moet_model_open(vm, &mx2);
	CHECK(rc == MOET_ENOTFOUND, "missing tensor: rc %d (%s)", rc, moet_errmsg());
	CHECK(strstr(moet_errmsg(), "model.layers.0.mlp.gate.weight") &&
	      strstr(moet_errmsg(), "missing"), "missing message: %s", moet_errmsg());
	moet_model_close(mx2);
	mx2 = NULL;
	/* the last layer's tensors stay in the shards but are past num_hidden_layers */
	rc = moet_model_open(vt, &mx2);
	CHECK(rc == 0, "extra layers past num_hidden_layers: %s", moet_errmsg());
	if (mx2) {
		moet_kv *kv2 = NULL;
		CHECK(moet_kv_create(mx2, T, &kv2) == 0 &&
		      moet_model_forward(mx2, kv2, tok, T, a) == 0, "forward with skipped layer");
		moet_kv_destroy(kv2);
	}
	moet_model_close(mx2);
	free(vs);
	free(vm);
	free(vt);
	free(a);
	free(b);
	free(c);
	free(d);
	free(dir);
	return moet_test_done("test_model");
}
