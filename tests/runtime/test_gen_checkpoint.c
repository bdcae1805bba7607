/*
 * test_gen_checkpoint.c: gen-checkpoint's tiny preset, checked from the outside.
 *
 *   - determinism: same parameters -> byte-identical files (1 and 2 threads); another seed
 *     -> different shards; the CLI writes the same bytes as the library
 *   - layout: the raw shard bytes (parsed here with jansson: header padding, offsets in file
 *     order, no gaps) and the reader (moet_ckpt_open, moet_config_load): every tensor the
 *     published DeepSeek-V3 layout implies, with the right dtype and shape, nothing else;
 *     alignment; index total_size = sum of tensor bytes; several shards with --shard-mb 1
 *   - values: no e4m3 NaN codes; decoded codes mean ~0, std ~1; block scales within
 *     [0.5, 2] / sqrt(fan_in); a dense MLP applied to a normalized embedding gives an output
 *     of sane size
 *   - routing: generator.json's per-layer shares average to --hot-share within 0.01; the
 *     bias tensor carries b_l on the hot set only; an independent simulation of the router
 *     (own sampling, own group-limited top-k, libm sigmoid) finds the hot share near target
 *   - CLI errors: exit 1 with one line
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moet_ckpt.h"
#include "moet_config.h"
#include "moet_dtype.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_test.h"

/* ---- small helpers ---- */

/* Files of dir, sorted, as a NULL-terminated malloc'd array. */
static char **list_dir(const char *dir, int *count)
{
	DIR *d = opendir(dir);
	char **v = calloc(256, sizeof(char *));
	int n = 0;
	struct dirent *de;
	while (d && (de = readdir(d)) && n < 255)
		if (de->d_name[0] != '.')
			v[n++] = strdup(de->d_name);
	if (d)
		closedir(d);
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (strcmp(v[i], v[j]) > 0) {
				char *t = v[i];
				v[i] = v[j];
				v[j] = t;
			}
	*count = n;
	return v;
}

static void free_list(char **v)
{
	for (int i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

/* 1 if both dirs hold the same file names with identical bytes. */
static int same_dirs(const char *a, const char *b)
{
	int na, nb, same = 1;
	char **la = list_dir(a, &na), **lb = list_dir(b, &nb);
	if (na != nb)
		same = 0;
	for (int i = 0; same && i < na; i++) {
		char pa[1024], pb[1024];
		size_t sa = 0, sb = 0;
		if (strcmp(la[i], lb[i])) {
			same = 0;
			break;
		}
		snprintf(pa, sizeof(pa), "%s/%s", a, la[i]);
		snprintf(pb, sizeof(pb), "%s/%s", b, lb[i]);
		uint8_t *x = moet_test_read_file(pa, &sa), *y = moet_test_read_file(pb, &sb);
		if (!x || !y || sa != sb || memcmp(x, y, sa)) {
			fprintf(stderr, "  %s differs\n", la[i]);
			same = 0;
		}
		free(x);
		free(y);
	}
	free_list(la);
	free_list(lb);
	return same;
}

static int gen(const char *dir, uint64_t seed, int threads, int64_t shard_mb)
{
	moet_gen_params p;
	moet_gen_params_init(&p);
	p.seed = seed;
	p.n_threads = threads;
	p.shard_mb = shard_mb;
	int rc = moet_gen_checkpoint(dir, &p);
	if (rc)
		fprintf(stderr, "moet_gen_checkpoint(%s): %s\n", dir, moet_errmsg());
	return rc;
}

/* ---- raw shard check (independent of the reader) ---- */

static void check_raw_shard(const char *path, uint64_t *sum_bytes)
{
	size_t n = 0;
	uint8_t *b = moet_test_read_file(path, &n);
	CHECK(b && n >= 8, "%s: unreadable", path);
	if (!b || n < 8)
		return;
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = (hl << 8) | b[i];
	CHECK((8 + hl) % 8 == 0, "%s: 8 + header length %llu is not a multiple of 8", path,
	      (unsigned long long)hl);
	json_error_t err;
	json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, &err);
	CHECK(h && json_is_object(h), "%s: header is not JSON: %s", path, err.text);
	uint64_t expect = 0;
	size_t last_size = 8;
	const char *key;
	json_t *v;
	json_object_foreach(h, key, v)
	{
		if (!strcmp(key, "__metadata__"))
			continue;
		json_t *off = json_object_get(v, "data_offsets");
		uint64_t o0 = (uint64_t)json_integer_value(json_array_get(off, 0));
		uint64_t o1 = (uint64_t)json_integer_value(json_array_get(off, 1));
		moet_dtype dt = moet_dtype_parse(json_string_value(json_object_get(v, "dtype")));
		size_t es = moet_dtype_size(dt);
		CHECK(o0 == expect, "%s: %s starts at %llu, previous ended at %llu", path, key,
		      (unsigned long long)o0, (unsigned long long)expect);
		CHECK(es > 0 && (8 + hl + o0) % es == 0, "%s: %s misaligned", path, key);
		CHECK(es <= last_size, "%s: %s (%zu-byte elements) after smaller ones", path, key,
		      es);
		last_size = es;
		expect = o1;
	}
	CHECK(8 + hl + expect == n, "%s: data buffer %llu + header != file size %zu", path,
	      (unsigned long long)expect, n);
	*sum_bytes += expect;
	json_decref(h);
	free(b);
}

/* ---- expected layout ---- */

typedef struct want {
	char name[128];
	moet_dtype dt;
	int ndim;
	int64_t shape[2];
} want;

static int n_want;
static want wants[2048];

static void want_t(const char *name, moet_dtype dt, int ndim, int64_t a, int64_t b)
{
	want *w = &wants[n_want++];
	snprintf(w->name, sizeof(w->name), "%.127s", name);
	w->dt = dt;
	w->ndim = ndim;
	w->shape[0] = a;
	w->shape[1] = b;
}

static void want_f8(const char *prefix, int64_t r, int64_t c)
{
	char n[200];
	snprintf(n, sizeof(n), "%s.weight", prefix);
	want_t(n, MOET_DT_F8_E4M3, 2, r, c);
	snprintf(n, sizeof(n), "%s.weight_scale_inv", prefix);
	want_t(n, MOET_DT_F32, 2, (r + 127) / 128, (c + 127) / 128);
}

/* The published DeepSeek-V3 tensor list for the tiny preset's numbers, written out here
 * from the layout description (not from the generator). */
static void build_wants(void)
{
	const int64_t V = 1024, H = 256, I = 512, MI = 128, NH = 4, QL = 96, KVL = 64;
	const int64_t NOPE = 32, ROPE = 16, VD = 32, E = 32;
	char p[128], n[160];
	n_want = 0;
	want_t("model.embed_tokens.weight", MOET_DT_BF16, 2, V, H);
	want_t("lm_head.weight", MOET_DT_BF16, 2, V, H);
	want_t("model.norm.weight", MOET_DT_BF16, 1, H, 0);
	for (int l = 0; l < 3; l++) {
#define N(fmt, ...) (snprintf(n, sizeof(n), "model.layers.%d." fmt, l, ##__VA_ARGS__), n)
		want_t(N("input_layernorm.weight"), MOET_DT_BF16, 1, H, 0);
		want_t(N("post_attention_layernorm.weight"), MOET_DT_BF16, 1, H, 0);
		want_f8(N("self_attn.q_a_proj"), QL, H);
		want_t(N("self_attn.q_a_layernorm.weight"), MOET_DT_BF16, 1, QL, 0);
		want_f8(N("self_attn.q_b_proj"), NH * (NOPE + ROPE), QL);
		want_f8(N("self_attn.kv_a_proj_with_mqa"), KVL + ROPE, H);
		want_t(N("self_attn.kv_a_layernorm.weight"), MOET_DT_BF16, 1, KVL, 0);
		want_f8(N("self_attn.kv_b_proj"), NH * (NOPE + VD), KVL);
		want_f8(N("self_attn.o_proj"), H, NH * VD);
		if (l == 0) {
			want_f8(N("mlp.gate_proj"), I, H);
			want_f8(N("mlp.up_proj"), I, H);
			want_f8(N("mlp.down_proj"), H, I);
			continue;
		}
		want_t(N("mlp.gate.weight"), MOET_DT_BF16, 2, E, H);
		want_t(N("mlp.gate.e_score_correction_bias"), MOET_DT_F32, 1, E, 0);
		for (int e = 0; e < E; e++) {
			snprintf(p, sizeof(p), "model.layers.%d.mlp.experts.%d", l, e);
			snprintf(n, sizeof(n), "%s.gate_proj", p);
			want_f8(n, MI, H);
			snprintf(n, sizeof(n), "%s.up_proj", p);
			want_f8(n, MI, H);
			snprintf(n, sizeof(n), "%s.down_proj", p);
			want_f8(n, H, MI);
		}
		want_f8(N("mlp.shared_experts.gate_proj"), MI, H);
		want_f8(N("mlp.shared_experts.up_proj"), MI, H);
		want_f8(N("mlp.shared_experts.down_proj"), H, MI);
#undef N
	}
}

static float bf16_at(const moet_tensor *t, int64_t i)
{
	const uint8_t *p = (const uint8_t *)t->data + 2 * i;
	return moet_dec_bf16((uint16_t)(p[0] | (p[1] << 8)));
}

static float f32_at(const moet_tensor *t, int64_t i)
{
	float f;
	memcpy(&f, (const uint8_t *)t->data + 4 * i, 4);
	return f;
}

/* Dequantized weight element (r, c): code x scale_inv[r/128][c/128]. */
static float fp8_at(const moet_tensor *w, const moet_tensor *s, int64_t r, int64_t c)
{
	uint8_t code = ((const uint8_t *)w->data)[r * w->shape[1] + c];
	return moet_dec_e4m3(code) * f32_at(s, (r / 128) * s->shape[1] + c / 128);
}

static const moet_tensor *get(const moet_ckpt *ck, const char *fmt, int l)
{
	char n[160];
	snprintf(n, sizeof(n), fmt, l);
	const moet_tensor *t = moet_ckpt_get(ck, n);
	CHECK(t, "tensor %s missing", n);
	return t;
}

/* ---- checks through the reader ---- */

static void check_layout(const char *dir)
{
	moet_ckpt *ck = NULL;
	moet_config cfg;
	int rc = moet_ckpt_open(dir, &ck);
	CHECK(rc == 0, "moet_ckpt_open(%s): %s", dir, moet_errmsg());
	rc = moet_config_load(dir, &cfg);
	CHECK(rc == 0, "moet_config_load(%s): %s", dir, moet_errmsg());
	if (!ck)
		return;
	if (rc == 0) {
		CHECK(!strcmp(cfg.model_type, "deepseek_v3"), "model_type %s", cfg.model_type);
		CHECK(cfg.vocab_size == 1024 && cfg.hidden_size == 256 &&
			      cfg.num_hidden_layers == 3 && cfg.n_routed_experts == 32 &&
			      cfg.n_group == 4 && cfg.topk_group == 2 &&
			      cfg.num_experts_per_tok == 4 && cfg.q_lora_rank == 96 &&
			      cfg.kv_lora_rank == 64 && cfg.first_k_dense_replace == 1,
		      "config geometry differs from the tiny preset");
		CHECK(cfg.rope_type == MOET_ROPE_YARN && cfg.rope_factor == 4.0 &&
			      cfg.rope_original_max_pos == 1024 && cfg.fp8 &&
			      cfg.fp8_block_rows == 128 && cfg.rms_norm_eps == 1e-6 &&
			      !cfg.tie_word_embeddings,
		      "config rope/quantization fields wrong");
	}
	build_wants();
	CHECK(moet_ckpt_count(ck) == (size_t)n_want, "%zu tensors, layout implies %d",
	      moet_ckpt_count(ck), n_want);
	uint64_t sum = 0;
	for (int i = 0; i < n_want; i++) {
		const moet_tensor *t = NULL;
		rc = moet_ckpt_find(ck, wants[i].name, wants[i].dt, wants[i].ndim, wants[i].shape,
				    &t);
		CHECK(rc == 0, "%s: %s", wants[i].name, moet_errmsg());
		if (!t)
			continue;
		CHECK((uintptr_t)t->data % moet_dtype_size(t->dtype) == 0, "%s misaligned",
		      t->name);
		sum += t->n_bytes;
	}
	char path[1024];
	size_t n = 0;
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	uint8_t *ib = moet_test_read_file(path, &n);
	json_t *ij = ib ? json_loads((const char *)ib, 0, NULL) : NULL;
	json_int_t total = json_integer_value(
		json_object_get(json_object_get(ij, "metadata"), "total_size"));
	CHECK(ij && (uint64_t)total == sum, "index total_size %lld, tensors sum to %llu",
	      (long long)total, (unsigned long long)sum);
	CHECK(json_object_size(json_object_get(ij, "weight_map")) == (size_t)n_want,
	      "weight_map has %zu entries", json_object_size(json_object_get(ij, "weight_map")));
	json_decref(ij);
	free(ib);

	/* FP8 codes: no NaN, decoded mean ~0, std ~1; scales within [0.5, 2] / sqrt(fan_in). */
	double s1 = 0, s2 = 0, cnt = 0;
	int nan_codes = 0, bad_scales = 0;
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		if (t->dtype == MOET_DT_F8_E4M3) {
			const uint8_t *c = t->data;
			for (size_t k = 0; k < t->n_bytes; k++) {
				if ((c[k] & 0x7F) == 0x7F) {
					nan_codes++;
					continue;
				}
				double v = moet_dec_e4m3(c[k]);
				s1 += v;
				s2 += v * v;
				cnt++;
			}
		}
		const char *suf = strstr(t->name, ".weight_scale_inv");
		if (suf) {
			char wn[160];
			snprintf(wn, sizeof(wn), "%.*s.weight", (int)(suf - t->name), t->name);
			const moet_tensor *w = moet_ckpt_get(ck, wn);
			double inv = w ? 1.0 / sqrt((double)w->shape[1]) : 0;
			for (int64_t k = 0; k < t->numel; k++) {
				double s = f32_at(t, k);
				if (!(s >= 0.5 * inv * 0.999 && s <= 2.0 * inv * 1.001))
					bad_scales++;
			}
		}
	}
	double mean = s1 / cnt, sd = sqrt(s2 / cnt - mean * mean);
	CHECK(nan_codes == 0, "%d e4m3 NaN codes", nan_codes);
	CHECK(fabs(mean) < 0.01 && fabs(sd - 1.0) < 0.03, "decoded F8 mean %.4f std %.4f", mean,
	      sd);
	CHECK(bad_scales == 0, "%d block scales outside [0.5, 2]/sqrt(fan_in)", bad_scales);
	printf("F8 codes: %.0f values, mean %.4f, std %.4f\n", cnt, mean, sd);

	/* A dense MLP (layer 0) on RMSNorm(embedding of token 5): output of sane size. */
	const moet_tensor *emb = get(ck, "model.embed_tokens.weight", 0);
	const moet_tensor *gw = get(ck, "model.layers.%d.mlp.gate_proj.weight", 0);
	const moet_tensor *gs = get(ck, "model.layers.%d.mlp.gate_proj.weight_scale_inv", 0);
	const moet_tensor *uw = get(ck, "model.layers.%d.mlp.up_proj.weight", 0);
	const moet_tensor *us = get(ck, "model.layers.%d.mlp.up_proj.weight_scale_inv", 0);
	const moet_tensor *dw = get(ck, "model.layers.%d.mlp.down_proj.weight", 0);
	const moet_tensor *ds = get(ck, "model.layers.%d.mlp.down_proj.weight_scale_inv", 0);
	if (emb && gw && gs && uw && us && dw && ds) {
		double x[256], h[512], ss = 0, ys = 0;
		for (int i = 0; i < 256; i++) {
			x[i] = bf16_at(emb, 5 * 256 + i);
			ss += x[i] * x[i];
		}
		for (int i = 0; i < 256; i++)
			x[i] /= sqrt(ss / 256);
		for (int r = 0; r < 512; r++) {
			double a = 0, b = 0;
			for (int c = 0; c < 256; c++) {
				a += fp8_at(gw, gs, r, c) * x[c];
				b += fp8_at(uw, us, r, c) * x[c];
			}
			h[r] = a / (1 + exp(-a)) * b;
		}
		for (int r = 0; r < 256; r++) {
			double a = 0;
			for (int c = 0; c < 512; c++)
				a += fp8_at(dw, ds, r, c) * h[c];
			ys += a * a;
		}
		double rms = sqrt(ys / 256);
		CHECK(rms > 0.05 && rms < 20, "dense MLP output rms %.4f", rms);
		printf("dense MLP output rms %.4f (input rms 1)\n", rms);
	}
	moet_ckpt_close(ck);
}

/* ---- routing ---- */

static uint64_t lcg_state;
static double urand(void)
{
	lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
	return ((lcg_state >> 11) + 0.5) * 0x1p-53;
}
static double nrand(void)
{
	return sqrt(-2 * log(urand())) * cos(2 * M_PI * urand());
}

/* Independent simulation of the router of layer l: share of the hot set. */
static double simulate_share(const moet_ckpt *ck, int l, const uint8_t *is_hot, int use_bias)
{
	const int E = 32, H = 256, G = 4, TG = 2, K = 4, V = 1024, C = 8, N = 3000;
	const moet_tensor *emb = get(ck, "model.embed_tokens.weight", 0);
	const moet_tensor *ln = get(ck, "model.layers.%d.post_attention_layernorm.weight", l);
	const moet_tensor *w = get(ck, "model.layers.%d.mlp.gate.weight", l);
	const moet_tensor *bias = get(ck, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
	if (!emb || !ln || !w || !bias)
		return -1;
	long hot = 0;
	lcg_state = 12345;
	for (int n = 0; n < N; n++) {
		int c = (int)(urand() * C);
		int t = (int)((c + urand()) * V / C);
		double x[256], ss = 0, s[32], b[32];
		for (int i = 0; i < H; i++) {
			x[i] = bf16_at(emb, (int64_t)t * H + i) + 0.5 * nrand();
			ss += x[i] * x[i];
		}
		for (int i = 0; i < H; i++)
			x[i] = x[i] / sqrt(ss / H) * bf16_at(ln, i);
		for (int e = 0; e < E; e++) {
			double z = 0;
			for (int i = 0; i < H; i++)
				z += x[i] * bf16_at(w, (int64_t)e * H + i);
			s[e] = 1 / (1 + exp(-z));
			b[e] = s[e] + (use_bias ? f32_at(bias, e) : 0);
		}
		/* group scores: sum of top two; keep TG groups; top K inside. */
		int keep[4] = { 0 };
		for (int k = 0; k < TG; k++) {
			int best = -1;
			double bs = -1e9;
			for (int g = 0; g < G; g++) {
				if (keep[g])
					continue;
				double m1 = -1e9, m2 = -1e9;
				for (int e = g * 8; e < g * 8 + 8; e++) {
					if (b[e] > m1) {
						m2 = m1;
						m1 = b[e];
					} else if (b[e] > m2) {
						m2 = b[e];
					}
				}
				if (m1 + m2 > bs) {
					bs = m1 + m2;
					best = g;
				}
			}
			keep[best] = 1;
		}
		int used[32] = { 0 };
		for (int k = 0; k < K; k++) {
			int best = -1;
			for (int e = 0; e < E; e++)
				if (keep[e / 8] && !used[e] && (best < 0 || b[e] > b[best]))
					best = e;
			used[best] = 1;
			hot += is_hot[best];
		}
	}
	return (double)hot / (N * K);
}

static void check_routing(const char *dir)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/generator.json", dir);
	json_error_t err;
	json_t *g = json_load_file(path, 0, &err);
	CHECK(g, "generator.json: %s", err.text);
	if (!g)
		return;
	moet_ckpt *ck = NULL;
	if (moet_ckpt_open(dir, &ck) != 0) {
		CHECK(0, "moet_ckpt_open: %s", moet_errmsg());
		json_decref(g);
		return;
	}
	double F = json_real_value(json_object_get(g, "hot_share"));
	json_t *layers = json_object_get(g, "layers");
	CHECK(F == 0.8, "hot_share recorded as %g", F);
	CHECK(json_array_size(layers) == 2, "%zu MoE layers recorded", json_array_size(layers));
	double sum = 0, tmin = 1, tmax = 0;
	size_t i;
	json_t *L;
	json_array_foreach(layers, i, L)
	{
		int l = (int)json_integer_value(json_object_get(L, "layer"));
		double share = json_real_value(json_object_get(L, "mc_share"));
		double target = json_real_value(json_object_get(L, "target_share"));
		double b = json_real_value(json_object_get(L, "bias"));
		json_t *hot = json_object_get(L, "hot_experts");
		uint8_t is_hot[32] = { 0 };
		for (size_t k = 0; k < json_array_size(hot); k++)
			is_hot[json_integer_value(json_array_get(hot, k)) & 31] = 1;
		CHECK(json_array_size(hot) == 10, "layer %d: %zu hot experts, want round(32 x "
		      "120/384) = 10", l, json_array_size(hot));
		CHECK(fabs(share - target) < 0.01, "layer %d: mc share %.4f target %.4f", l, share,
		      target);
		sum += share;
		tmin = fmin(tmin, target);
		tmax = fmax(tmax, target);
		const moet_tensor *bt = get(ck, "model.layers.%d.mlp.gate.e_score_correction_bias",
					    l);
		for (int e = 0; bt && e < 32; e++)
			CHECK(f32_at(bt, e) == (is_hot[e] ? (float)b : 0.0f),
			      "layer %d expert %d: bias %g (hot %d, b_l %g)", l, e, f32_at(bt, e),
			      is_hot[e], b);
		double sim = simulate_share(ck, l, is_hot, 1);
		double sim0 = simulate_share(ck, l, is_hot, 0);
		printf("layer %d: target %.3f, generator MC %.4f, independent simulation %.4f "
		       "(%.4f without bias), b_l %.4f\n", l, target, share, sim, sim0, b);
		CHECK(fabs(sim - target) < 0.04, "layer %d: simulated share %.4f, target %.4f", l,
		      sim, target);
		CHECK(sim0 < target - 0.2, "layer %d: share without bias %.4f: bias does nothing?",
		      l, sim0);
	}
	CHECK(fabs(sum / 2 - F) < 0.01, "mean MC share %.4f, --hot-share %.2f", sum / 2, F);
	CHECK(fabs(tmin - 0.7) < 1e-9 && fabs(tmax - 0.9) < 1e-9,
	      "targets span [%.4f, %.4f], want [0.7, 0.9]", tmin, tmax);
	moet_ckpt_close(ck);
	json_decref(g);
}

/* ---- CLI ---- */

static void cli_fails(const char *args, const char *what)
{
	char cmd[2048];
	char *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s gen-checkpoint %s", moet_test_bin(), args);
	int st = moet_test_run(cmd, &out);
	int lines = 0;
	for (const char *p = out; p && *p; p++)
		lines += *p == '\n';
	CHECK(st == 1, "%s: exit %d, want 1", what, st);
	CHECK(lines == 1 && out && !strncmp(out, "moet-hybrid gen-checkpoint: ", 28),
	      "%s: want one error line, got: %s", what, out ? out : "(null)");
	free(out);
}

int main(void)
{
	char *a = moet_test_mkdtemp("gen-a"), *b = moet_test_mkdtemp("gen-b");
	char *c = moet_test_mkdtemp("gen-c"), *d = moet_test_mkdtemp("gen-d");
	if (!a || !b || !c || !d) {
		fprintf(stderr, "cannot make temp dirs\n");
		return 1;
	}
	/* Determinism: same seed, 2 threads vs 1 thread; several shards (--shard-mb 1). */
	CHECK(gen(a, 7, 2, 1) == 0, "gen a");
	CHECK(gen(b, 7, 1, 1) == 0, "gen b");
	CHECK(same_dirs(a, b), "same seed gave different files");
	CHECK(gen(c, 8, 2, 1) == 0, "gen c");
	{
		/* Every shard of seed 8 differs from the shard of the same name of seed 7. */
		int na_, nc_, diff = 0, pairs = 0;
		char **la = list_dir(a, &na_), **lc = list_dir(c, &nc_);
		for (int i = 0; i < na_ && i < nc_; i++) {
			if (strncmp(la[i], "model-", 6) || strcmp(la[i], lc[i]) ||
			    strstr(la[i], ".json"))
				continue;
			char pa[1024], pc[1024];
			size_t na = 0, nc = 0;
			snprintf(pa, sizeof(pa), "%s/%s", a, la[i]);
			snprintf(pc, sizeof(pc), "%s/%s", c, lc[i]);
			uint8_t *x = moet_test_read_file(pa, &na);
			uint8_t *y = moet_test_read_file(pc, &nc);
			pairs++;
			diff += x && y && (na != nc || memcmp(x, y, na) != 0);
			free(x);
			free(y);
		}
		CHECK(pairs > 1 && diff == pairs, "seed 8 vs 7: %d of %d shards differ", diff,
		      pairs);
		free_list(la);
		free_list(lc);
	}
	int n_files;
	char **files = list_dir(a, &n_files);
	int n_shards = 0;
	uint64_t raw_sum = 0;
	for (int i = 0; i < n_files; i++) {
		if (strstr(files[i], ".safetensors") && !strstr(files[i], ".json")) {
			char p[1024];
			snprintf(p, sizeof(p), "%s/%s", a, files[i]);
			check_raw_shard(p, &raw_sum);
			n_shards++;
		}
	}
	free_list(files);
	CHECK(n_shards > 3, "--shard-mb 1 gave %d shards of a ~8 MB checkpoint", n_shards);
	printf("%d shards, %llu tensor bytes\n", n_shards, (unsigned long long)raw_sum);

	check_layout(a);
	check_routing(a);

	/* --force into a used directory replaces the old shards: one shard remains. */
	{
		moet_gen_params p;
		moet_gen_params_init(&p);
		p.seed = 7;
		CHECK(moet_gen_checkpoint(a, &p) == MOET_EINVAL, "non-empty dir accepted");
		p.force = true;
		CHECK(moet_gen_checkpoint(a, &p) == 0, "--force: %s", moet_errmsg());
		int nf;
		char **fl = list_dir(a, &nf);
		CHECK(nf == 4, "after --force: %d files, want config, generator, index, 1 shard",
		      nf);
		free_list(fl);
	}

	/* The CLI writes what the library writes. */
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "%s gen-checkpoint --out %s/cli --seed 7 --shard-mb 1 --quiet",
		 moet_test_bin(), d);
	char *out = NULL;
	int st = moet_test_run(cmd, &out);
	CHECK(st == 0 && out && !out[0], "CLI run: exit %d, output: %s", st, out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "%s/cli", d);
	CHECK(same_dirs(cmd, b), "CLI output differs from the library's");

	cli_fails("--seed 1", "missing --out");
	snprintf(cmd, sizeof(cmd), "--out %s/x --hot-share 1.5", d);
	cli_fails(cmd, "--hot-share 1.5");
	snprintf(cmd, sizeof(cmd), "--out %s/x --hot-share abc", d);
	cli_fails(cmd, "--hot-share abc");
	snprintf(cmd, sizeof(cmd), "--out %s/x --experts 30", d);
	cli_fails(cmd, "--experts 30 (n_group 4)");
	snprintf(cmd, sizeof(cmd), "--out %s/x --preset huge", d);
	cli_fails(cmd, "--preset huge");
	snprintf(cmd, sizeof(cmd), "--out %s/x --bogus", d);
	cli_fails(cmd, "unknown option");
	snprintf(cmd, sizeof(cmd), "--out %s/x --layers", d);
	cli_fails(cmd, "--layers without value");
	snprintf(cmd, sizeof(cmd), "--out %s --quiet", b);
	cli_fails(cmd, "non-empty --out");
	snprintf(cmd, sizeof(cmd), "%s gen-checkpoint --help", moet_test_bin());
	CHECK(moet_test_run(cmd, NULL) == 0, "--help does not exit 0");

	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s' '%s' '%s'", a, b, c, d);
	if (moet_test_failures == 0)
		moet_test_run(cmd, NULL);
	free(a);
	free(b);
	free(c);
	free(d);
	return moet_test_done("test_gen_checkpoint");
}
