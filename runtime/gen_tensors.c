/*
 * gen_tensors.c: the tensor list of a synthetic checkpoint (published DeepSeek-V3 names,
 * dtypes and shapes) and the generator of each tensor's bytes, row by row.
 *
 * Cost model. A Kimi-K2 layer is ~17 GB of FP8 codes, so the per-byte work must be a table
 * lookup: one 64-bit xoshiro256++ word yields four 16-bit indices into a 65536-entry table
 * whose entry i is the e4m3 code of the normal quantile at (i + 0.5) / 65536 (clipped to
 * |v| <= 8). The table is built symmetric (entry 65535 - i is the negation of entry i), so the
 * decoded codes have mean exactly 0 over the table and standard deviation ~1. BF16 tensors use
 * a float table of the same quantiles.
 *
 *   F8 weight [R, C]          row r: codes from stream (key(name), r)
 *   weight_scale_inv [R', C'] R' = ceil(R/128), C' = ceil(C/128); row r' from its own stream:
 *                             (1/sqrt(C)) x 2^u, u uniform in [-1, 1): factors in [0.5, 2)
 *
 * NOTE: the table is built once per run from the C library's erfc (bisection to the last
 * bit of a double). A different libm could move a quantile lying within an ulp of an e4m3
 * rounding boundary; on one machine the output is always byte-identical.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen_int.h"
#include "moet_err.h"
#include "moet_expc.h"

#define GEN_GOLDEN 0x9E3779B97F4A7C15ull

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

uint64_t gen_key(uint64_t seed, const char *label)
{
	uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a 64 */
	for (const unsigned char *p = (const unsigned char *)label; *p; p++)
		h = (h ^ *p) * 0x100000001B3ull;
	return mix64(h + mix64(seed + GEN_GOLDEN));
}

void gen_rng_seed(gen_rng *r, uint64_t key, uint64_t stream)
{
	uint64_t x = key ^ mix64((stream + 1) * GEN_GOLDEN);
	for (int i = 0; i < 4; i++) {
		x += GEN_GOLDEN;
		r->s[i] = mix64(x);
	}
	if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3]))
		r->s[0] = 1; /* xoshiro's one forbidden state */
}

/* The x with Phi(x) = p, 0 < p < 0.5, by bisection on [-9, 0] to adjacent doubles. */
static double norm_quantile_low(double p)
{
	double lo = -9.0, hi = 0.0;
	for (int i = 0; i < 200; i++) {
		double mid = 0.5 * (lo + hi);
		if (mid <= lo || mid >= hi)
			break;
		if (0.5 * erfc(-mid / sqrt(2.0)) < p)
			lo = mid;
		else
			hi = mid;
	}
	return 0.5 * (lo + hi);
}

int gen_tables_init(gen_ctx *g)
{
	g->e4m3_table = malloc(65536);
	g->gauss_table = malloc(65536 * sizeof(float));
	if (!g->e4m3_table || !g->gauss_table)
		return moet_err(MOET_ENOMEM, "out of memory for the value tables");
	for (int i = 0; i < 32768; i++) {
		double v = norm_quantile_low(((double)i + 0.5) / 65536.0);
		if (v < -8.0)
			v = -8.0;
		float f = (float)v;
		g->gauss_table[i] = f;
		g->gauss_table[65535 - i] = -f;
		g->e4m3_table[i] = moet_enc_e4m3(f);
		g->e4m3_table[65535 - i] = moet_enc_e4m3(-f);
	}
	/* Class directions u_c: Gaussian, scaled to norm sqrt(H) (in double, then rounded). */
	const int64_t H = g->cfg.hidden_size;
	g->class_dir = malloc((size_t)g->n_classes * (size_t)H * sizeof(float));
	if (!g->class_dir)
		return moet_err(MOET_ENOMEM, "out of memory (class directions)");
	for (int c = 0; c < g->n_classes; c++) {
		float *u = g->class_dir + (int64_t)c * H;
		gen_rng r;
		gen_rng_seed(&r, gen_key(g->par.seed, "moet.gen.class_dir"), (uint64_t)c);
		double ss = 0;
		for (int64_t i = 0; i < H; i++) {
			u[i] = g->gauss_table[gen_rng_next(&r) & 0xFFFF];
			ss += (double)u[i] * u[i];
		}
		double k = sqrt((double)H / ss);
		for (int64_t i = 0; i < H; i++)
			u[i] = (float)(u[i] * k);
	}
	return 0;
}

/* ---- the tensor list ---- */

static int add(gen_ctx *g, size_t *cap, const char *name, moet_dtype dt, int ndim, int64_t s0,
	       int64_t s1, gen_kind kind, int64_t layer, int64_t fan_in, int group)
{
	if (g->n_tensors == *cap) {
		size_t nc = *cap ? *cap * 2 : 256;
		gen_tensor *nt = realloc(g->tensors, nc * sizeof(*nt));
		if (!nt)
			return moet_err(MOET_ENOMEM, "out of memory (tensor list)");
		g->tensors = nt;
		*cap = nc;
	}
	gen_tensor *t = &g->tensors[g->n_tensors++];
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->dtype = dt;
	t->ndim = ndim;
	t->shape[0] = s0;
	t->shape[1] = ndim == 2 ? s1 : 0;
	t->rows = ndim == 2 ? s0 : 1;
	t->row_bytes = (size_t)(ndim == 2 ? s1 : s0) * moet_dtype_size(dt);
	t->n_bytes = (size_t)t->rows * t->row_bytes;
	t->kind = kind;
	t->layer = layer;
	t->fan_in = fan_in;
	t->group = group;
	t->key = gen_key(g->par.seed, name);
	return 0;
}

/* An FP8 linear weight [r, c] and its block scales. */
static int add_f8(gen_ctx *g, size_t *cap, const char *prefix, int64_t r, int64_t c,
		  int64_t layer, int group)
{
	char name[128];
	const int64_t b = GEN_FP8_BLOCK;
	snprintf(name, sizeof(name), "%s.weight", prefix);
	int rc = add(g, cap, name, MOET_DT_F8_E4M3, 2, r, c, GEN_F8, layer, 0, group);
	if (rc)
		return rc;
	snprintf(name, sizeof(name), "%s.weight_scale_inv", prefix);
	return add(g, cap, name, MOET_DT_F32, 2, (r + b - 1) / b, (c + b - 1) / b, GEN_SCALE,
		   layer, c, group);
}

static int add_layer(gen_ctx *g, size_t *cap, int64_t l)
{
	const moet_config *c = &g->cfg;
	const int64_t H = c->hidden_size, nh = c->num_attention_heads;
	const int grp = (int)l + 1;
	char p[40], q[96];
	int rc = 0;
#define TRY(x)                \
	do {                  \
		rc = (x);     \
		if (rc)       \
			return rc; \
	} while (0)
	snprintf(p, sizeof(p), "model.layers.%lld.", (long long)l);
	snprintf(q, sizeof(q), "%sinput_layernorm.weight", p);
	TRY(add(g, cap, q, MOET_DT_BF16, 1, H, 0, GEN_NORM, l, 0, grp));
	snprintf(q, sizeof(q), "%sself_attn.q_a_proj", p);
	TRY(add_f8(g, cap, q, c->q_lora_rank, H, l, grp));
	snprintf(q, sizeof(q), "%sself_attn.q_a_layernorm.weight", p);
	TRY(add(g, cap, q, MOET_DT_BF16, 1, c->q_lora_rank, 0, GEN_NORM, l, 0, grp));
	snprintf(q, sizeof(q), "%sself_attn.q_b_proj", p);
	TRY(add_f8(g, cap, q, nh * moet_config_qk_head_dim(c), c->q_lora_rank, l, grp));
	snprintf(q, sizeof(q), "%sself_attn.kv_a_proj_with_mqa", p);
	TRY(add_f8(g, cap, q, c->kv_lora_rank + c->qk_rope_head_dim, H, l, grp));
	snprintf(q, sizeof(q), "%sself_attn.kv_a_layernorm.weight", p);
	TRY(add(g, cap, q, MOET_DT_BF16, 1, c->kv_lora_rank, 0, GEN_NORM, l, 0, grp));
	snprintf(q, sizeof(q), "%sself_attn.kv_b_proj", p);
	TRY(add_f8(g, cap, q, nh * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, l,
		   grp));
	snprintf(q, sizeof(q), "%sself_attn.o_proj", p);
	TRY(add_f8(g, cap, q, H, nh * c->v_head_dim, l, grp));
	snprintf(q, sizeof(q), "%spost_attention_layernorm.weight", p);
	TRY(add(g, cap, q, MOET_DT_BF16, 1, H, 0, GEN_NORM, l, 0, grp));

	if (!moet_config_is_moe_layer(c, l)) {
		const int64_t I = c->intermediate_size;
		snprintf(q, sizeof(q), "%smlp.gate_proj", p);
		TRY(add_f8(g, cap, q, I, H, l, grp));
		snprintf(q, sizeof(q), "%smlp.up_proj", p);
		TRY(add_f8(g, cap, q, I, H, l, grp));
		snprintf(q, sizeof(q), "%smlp.down_proj", p);
		return add_f8(g, cap, q, H, I, l, grp);
	}
	const int64_t E = c->n_routed_experts, I = c->moe_intermediate_size;
	const int64_t S = c->n_shared_experts * I;
	snprintf(q, sizeof(q), "%smlp.gate.weight", p);
	TRY(add(g, cap, q, MOET_DT_BF16, 2, E, H, GEN_ROUTER, l, 0, grp));
	snprintf(q, sizeof(q), "%smlp.gate.e_score_correction_bias", p);
	TRY(add(g, cap, q, MOET_DT_F32, 1, E, 0, GEN_BIAS, l, 0, grp));
	for (int64_t e = 0; e < E; e++) {
		snprintf(q, sizeof(q), "%smlp.experts.%lld.gate_proj", p, (long long)e);
		TRY(add_f8(g, cap, q, I, H, l, grp));
		snprintf(q, sizeof(q), "%smlp.experts.%lld.up_proj", p, (long long)e);
		TRY(add_f8(g, cap, q, I, H, l, grp));
		snprintf(q, sizeof(q), "%smlp.experts.%lld.down_proj", p, (long long)e);
		TRY(add_f8(g, cap, q, H, I, l, grp));
	}
	if (S > 0) {
		snprintf(q, sizeof(q), "%smlp.shared_experts.gate_proj", p);
		TRY(add_f8(g, cap, q, S, H, l, grp));
		snprintf(q, sizeof(q), "%smlp.shared_experts.up_proj", p);
		TRY(add_f8(g, cap, q, S, H, l, grp));
		snprintf(q, sizeof(q), "%smlp.shared_experts.down_proj", p);
		TRY(add_f8(g, cap, q, H, S, l, grp));
	}
#undef TRY
	return 0;
}

int gen_tensors_build(gen_ctx *g)
{
	const moet_config *c = &g->cfg;
	const int64_t V = c->vocab_size, H = c->hidden_size, L = c->num_hidden_layers;
	size_t cap = 0;
	int rc = add(g, &cap, "model.embed_tokens.weight", MOET_DT_BF16, 2, V, H, GEN_EMBED, -1,
		     0, 0);
	for (int64_t l = 0; !rc && l < L; l++)
		rc = add_layer(g, &cap, l);
	if (!rc)
		rc = add(g, &cap, "model.norm.weight", MOET_DT_BF16, 1, H, 0, GEN_NORM, -1, 0,
			 (int)L + 1);
	if (!rc)
		rc = add(g, &cap, "lm_head.weight", MOET_DT_BF16, 2, V, H, GEN_LM_HEAD, -1, 0,
			 (int)L + 1);
	return rc;
}

const gen_tensor *gen_find(const gen_ctx *g, const char *name)
{
	for (size_t i = 0; i < g->n_tensors; i++)
		if (!strcmp(g->tensors[i].name, name))
			return &g->tensors[i];
	return NULL;
}

/* ---- values ---- */

static void put_bf16(uint8_t *o, float v)
{
	uint16_t b = moet_enc_bf16(v);
	o[0] = (uint8_t)b;
	o[1] = (uint8_t)(b >> 8);
}

static void put_f32(uint8_t *o, float v)
{
	uint32_t u = moet_f32_bits(v);
	for (int i = 0; i < 4; i++)
		o[i] = (uint8_t)(u >> (8 * i));
}

static void fill_f8_row(const gen_ctx *g, gen_rng *r, uint8_t *o, size_t n)
{
	const uint8_t *tab = g->e4m3_table;
	size_t i = 0;
	for (; i + 4 <= n; i += 4) {
		uint64_t w = gen_rng_next(r);
		o[i] = tab[w & 0xFFFF];
		o[i + 1] = tab[(w >> 16) & 0xFFFF];
		o[i + 2] = tab[(w >> 32) & 0xFFFF];
		o[i + 3] = tab[w >> 48];
	}
	if (i < n) {
		uint64_t w = gen_rng_next(r);
		for (; i < n; i++, w >>= 16)
			o[i] = tab[w & 0xFFFF];
	}
}

/*
 * A BF16 row of n values a x N(0,1) + b x dir[j] (dir may be NULL) + c, N from the table,
 * four values per random word.
 */
static void fill_bf16_row(const gen_ctx *g, gen_rng *r, uint8_t *o, int64_t n, float a,
			  float b, const float *dir, float c)
{
	const float *tab = g->gauss_table;
	uint64_t w = 0;
	for (int64_t j = 0; j < n; j++) {
		if ((j & 3) == 0)
			w = gen_rng_next(r);
		float v = a * tab[w & 0xFFFF];
		w >>= 16;
		if (dir)
			v = v + b * dir[j];
		put_bf16(o + 2 * j, v + c);
	}
}

int gen_fill_rows(void *ctx, size_t ti, int64_t r0, int64_t r1, uint8_t *out)
{
	const gen_ctx *g = ctx;
	const gen_tensor *t = &g->tensors[ti];
	const int64_t H = g->cfg.hidden_size, C = g->n_classes, V = g->cfg.vocab_size;
	const int64_t n = t->ndim == 2 ? t->shape[1] : t->shape[0];
	const gen_route *rt = NULL;
	if (t->layer >= 0 && g->route_of_layer && g->route_of_layer[t->layer] >= 0)
		rt = &g->routes[g->route_of_layer[t->layer]];
	for (int64_t row = r0; row < r1; row++) {
		uint8_t *o = out + (size_t)(row - r0) * t->row_bytes;
		gen_rng r;
		gen_rng_seed(&r, t->key, (uint64_t)row);
		switch (t->kind) {
		case GEN_F8:
			fill_f8_row(g, &r, o, t->row_bytes);
			break;
		case GEN_EMBED:
			fill_bf16_row(g, &r, o, n, 1.0f, GEN_ALPHA,
				      g->class_dir + (row * C / V) * H, 0.0f);
			break;
		case GEN_LM_HEAD:
			fill_bf16_row(g, &r, o, n, 1.0f / sqrtf((float)H), 0, NULL, 0.0f);
			break;
		case GEN_NORM:
			fill_bf16_row(g, &r, o, n, 0.1f, 0, NULL, 1.0f);
			break;
		case GEN_ROUTER:
			fill_bf16_row(g, &r, o, n, GEN_SIGMA / sqrtf((float)H),
				      GEN_BETA / (float)H,
				      g->class_dir + (int64_t)rt->expert_class[row] * H, 0.0f);
			break;
		case GEN_SCALE: {
			const float inv = 1.0f / sqrtf((float)t->fan_in);
			for (int64_t j = 0; j < n; j++) {
				float u = gen_rng_sym(&r);
				put_f32(o + 4 * j, inv * moet_exp_c(u * 0x1.62e430p-1f));
			}
			break;
		}
		case GEN_BIAS:
			for (int64_t j = 0; j < n; j++)
				put_f32(o + 4 * j, rt->is_hot[j] ? rt->bias : 0.0f);
			break;
		}
	}
	return 0;
}
