/*
 * test_cli_inspect.c: `moet-hybrid inspect` on a tiny FP8 checkpoint in the published
 * DeepSeek-V3 layout (2 layers: one dense, one MoE, plus one MTP layer, in two shards),
 * written here with st_build.h. The byte figures it prints are compared with values computed
 * in this file from the geometry by formula (not from the files), then --validate is run on
 * a clean and on a poisoned copy, and inspect on broken checkpoints must exit 1 with one line.
 */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "moet_test.h"
#include "st_build.h"

/* geometry */
enum { V = 32, H = 16, I = 24, M = 8, NL = 2, NH = 2, QL = 12, KL = 8, NOPE = 4, ROPE = 2,
       VH = 4, E = 4, NS = 1, SCALE = 4 /* one F32 [1, 1] block scale */ };

static const char *config_text =
	"{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\","
	" \"vocab_size\": 32, \"hidden_size\": 16, \"intermediate_size\": 24,"
	" \"moe_intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
	" \"num_key_value_heads\": 2, \"q_lora_rank\": 12, \"kv_lora_rank\": 8,"
	" \"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 2, \"v_head_dim\": 4,"
	" \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"n_group\": 2, \"topk_group\": 1,"
	" \"n_shared_experts\": 1, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1,"
	" \"num_nextn_predict_layers\": 1, \"routed_scaling_factor\": 2.5,"
	" \"rope_theta\": 10000, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40,"
	" \"original_max_position_embeddings\": 4096, \"mscale\": 1.0, \"mscale_all_dim\": 1.0},"
	" \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\","
	" \"weight_block_size\": [128, 128]}}";

/* Expected bytes, by formula from the geometry. */
#define X_EMBED ((uint64_t)V * H * 2)
#define X_ATTN_LAYER ((uint64_t)QL * H + NH * (NOPE + ROPE) * QL + (KL + ROPE) * H + \
		      NH * (NOPE + VH) * KL + H * NH * VH + 5 * SCALE)
#define X_NORM_LAYER ((uint64_t)2 * H * 2 + QL * 2 + KL * 2)
#define X_DENSE ((uint64_t)3 * I * H + 3 * SCALE)
#define X_ROUTER ((uint64_t)E * H * 2 + E * 4)
#define X_SHARED ((uint64_t)3 * M * NS * H + 3 * SCALE)
#define X_EXPERT ((uint64_t)3 * M * H + 3 * SCALE)
#define X_MTP (X_ATTN_LAYER + X_NORM_LAYER + X_ROUTER + X_SHARED + E * X_EXPERT + \
	       (uint64_t)2 * H * 2 + (uint64_t)H * 2 * H * 2 + H * 2)

#define MAX_T 128
typedef struct list {
	stb_tensor t[MAX_T];
	char names[MAX_T][128];
	int n;
} list;

static stb_tensor *add(list *l, const char *dtype, int64_t r, int64_t c, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static stb_tensor *add(list *l, const char *dtype, int64_t r, int64_t c, const char *fmt, ...)
{
	if (l->n >= MAX_T) {
		fprintf(stderr, "too many tensors\n");
		exit(1);
	}
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->names[l->n], sizeof(l->names[0]), fmt, ap);
	va_end(ap);
	stb_tensor *t = &l->t[l->n];
	memset(t, 0, sizeof(*t));
	t->name = l->names[l->n++];
	t->dtype = dtype;
	t->ndim = c ? 2 : 1;
	t->shape[0] = r;
	t->shape[1] = c;
	return t;
}

/* An FP8 weight [r, c] and its [1, 1] block scale (r, c <= 128). */
static void add_fp8(list *l, int64_t r, int64_t c, const char *name)
{
	add(l, "F8_E4M3", r, c, "%s.weight", name);
	add(l, "F32", 1, 1, "%s.weight_scale_inv", name);
}

static void add_layer(list *l, int L, int moe)
{
	char p[32];
	snprintf(p, sizeof(p), "model.layers.%d.", L);
	add(l, "BF16", H, 0, "%sinput_layernorm.weight", p);
	add(l, "BF16", H, 0, "%spost_attention_layernorm.weight", p);
	char q[96];
	snprintf(q, sizeof(q), "%sself_attn.q_a_proj", p);
	add_fp8(l, QL, H, q);
	add(l, "BF16", QL, 0, "%sself_attn.q_a_layernorm.weight", p);
	snprintf(q, sizeof(q), "%sself_attn.q_b_proj", p);
	add_fp8(l, NH * (NOPE + ROPE), QL, q);
	snprintf(q, sizeof(q), "%sself_attn.kv_a_proj_with_mqa", p);
	add_fp8(l, KL + ROPE, H, q);
	add(l, "BF16", KL, 0, "%sself_attn.kv_a_layernorm.weight", p);
	snprintf(q, sizeof(q), "%sself_attn.kv_b_proj", p);
	add_fp8(l, NH * (NOPE + VH), KL, q);
	snprintf(q, sizeof(q), "%sself_attn.o_proj", p);
	add_fp8(l, H, NH * VH, q);
	if (!moe) {
		static const char *const proj[] = { "gate_proj", "up_proj", "down_proj" };
		for (int k = 0; k < 3; k++) {
			snprintf(q, sizeof(q), "%smlp.%s", p, proj[k]);
			add_fp8(l, k < 2 ? I : H, k < 2 ? H : I, q);
		}
		return;
	}
	add(l, "BF16", E, H, "%smlp.gate.weight", p);
	add(l, "F32", E, 0, "%smlp.gate.e_score_correction_bias", p);
	for (int e = -1; e < E; e++) {
		char base[64];
		if (e < 0)
			snprintf(base, sizeof(base), "%smlp.shared_experts", p);
		else
			snprintf(base, sizeof(base), "%smlp.experts.%d", p, e);
		snprintf(q, sizeof(q), "%s.gate_proj", base);
		add_fp8(l, M, H, q);
		snprintf(q, sizeof(q), "%s.up_proj", base);
		add_fp8(l, M, H, q);
		snprintf(q, sizeof(q), "%s.down_proj", base);
		add_fp8(l, H, M, q);
	}
}

static void write_checkpoint(const char *dir, int poison)
{
	static uint8_t f8_bad[M * H];
	static uint16_t norm_bad[H];
	list *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	add(a, "BF16", V, H, "model.embed_tokens.weight");
	stb_tensor *norm = add(a, "BF16", H, 0, "model.norm.weight");
	add(a, "BF16", V, H, "lm_head.weight");
	add_layer(a, 0, 0);
	add_layer(b, 1, 1);
	add_layer(b, 2, 1); /* MTP */
	add(b, "BF16", H, 0, "model.layers.2.enorm.weight");
	add(b, "BF16", H, 0, "model.layers.2.hnorm.weight");
	add(b, "BF16", H, 2 * H, "model.layers.2.eh_proj.weight");
	add(b, "BF16", H, 0, "model.layers.2.shared_head.norm.weight");
	if (poison) {
		for (int i = 0; i < M * H; i++)
			f8_bad[i] = 0x38; /* 1.0 */
		f8_bad[5] = 0x7F;
		f8_bad[9] = 0xFF;
		for (int i = 0; i < H; i++)
			norm_bad[i] = 0x3F80;
		norm_bad[3] = 0x7F80; /* +Inf */
		norm->data = norm_bad;
		for (int i = 0; i < b->n; i++)
			if (!strcmp(b->t[i].name, "model.layers.1.mlp.experts.2.up_proj.weight"))
				b->t[i].data = f8_bad;
	}
	const char *files[2] = { "model-00001-of-00002.safetensors",
				 "model-00002-of-00002.safetensors" };
	list *ls[2] = { a, b };
	size_t len = 0, cap = 1024;
	char *idx = malloc(cap);
	idx[0] = '\0';
	stb_cat(&idx, &len, &cap, "{\"metadata\": {}, \"weight_map\": {");
	for (int s = 0; s < 2; s++) {
		size_t n;
		uint8_t *img = stb_build(ls[s]->t, (size_t)ls[s]->n, NULL, &n);
		CHECK(stb_write(dir, files[s], img, n) == 0, "write shard");
		free(img);
		for (int i = 0; i < ls[s]->n; i++)
			stb_cat(&idx, &len, &cap, "%s\"%s\": \"%s\"", (s || i) ? ", " : "",
				ls[s]->t[i].name, files[s]);
	}
	stb_cat(&idx, &len, &cap, "}}");
	stb_write_text(dir, "model.safetensors.index.json", idx);
	stb_write_text(dir, "config.json", config_text);
	free(idx);
	free(a);
	free(b);
}

static uint64_t file_bytes(const char *dir, const char *f)
{
	char p[4096];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, f);
	return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static int run(const char *args, char **out)
{
	char cmd[8192];
	snprintf(cmd, sizeof(cmd), "'%s' inspect %s", moet_test_bin(), args);
	return moet_test_run(cmd, out);
}

static uint64_t jget(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_integer(v) ? (uint64_t)json_integer_value(v) : UINT64_MAX;
}

static void test_summary(const char *dir)
{
	char args[4608], *out = NULL;
	snprintf(args, sizeof(args), "--model '%s' --json", dir);
	int st = run(args, &out);
	CHECK(st == 0, "inspect --json exit %d: %s", st, out ? out : "");
	json_error_t je;
	json_t *j = out ? json_loads(out, 0, &je) : NULL;
	CHECK(j != NULL, "--json output is not JSON: %s", out ? out : "");
	if (j) {
		json_t *parts = json_object_get(j, "parts");
		uint64_t x_norms = NL * X_NORM_LAYER + H * 2;
		CHECK(jget(j, "shards") == 2, "shards");
		CHECK(jget(j, "shard_bytes") ==
		      file_bytes(dir, "model-00001-of-00002.safetensors") +
		      file_bytes(dir, "model-00002-of-00002.safetensors"), "shard_bytes");
		CHECK(jget(parts, "embedding") == X_EMBED, "embedding %" PRIu64,
		      jget(parts, "embedding"));
		CHECK(jget(parts, "lm_head") == X_EMBED, "lm_head");
		CHECK(jget(parts, "attention") == NL * X_ATTN_LAYER, "attention %" PRIu64 " want %"
		      PRIu64, jget(parts, "attention"), (uint64_t)(NL * X_ATTN_LAYER));
		CHECK(jget(parts, "norms") == x_norms, "norms %" PRIu64 " want %" PRIu64,
		      jget(parts, "norms"), x_norms);
		CHECK(jget(parts, "dense_mlp") == X_DENSE, "dense_mlp");
		CHECK(jget(parts, "router") == X_ROUTER, "router");
		CHECK(jget(parts, "shared_experts") == X_SHARED, "shared_experts");
		CHECK(jget(parts, "routed_experts") == E * X_EXPERT, "routed_experts %" PRIu64,
		      jget(parts, "routed_experts"));
		CHECK(jget(parts, "mtp") == X_MTP, "mtp %" PRIu64 " want %" PRIu64,
		      jget(parts, "mtp"), (uint64_t)X_MTP);
		CHECK(jget(parts, "other") == 0, "other");
		uint64_t total = 2 * X_EMBED + NL * X_ATTN_LAYER + x_norms + X_DENSE + X_ROUTER +
				 X_SHARED + E * X_EXPERT + X_MTP;
		CHECK(jget(j, "data_bytes") == total, "data_bytes %" PRIu64 " want %" PRIu64,
		      jget(j, "data_bytes"), total);
		CHECK(jget(j, "routed_expert_bytes_min") == X_EXPERT &&
		      jget(j, "routed_expert_bytes_max") == X_EXPERT, "routed expert bytes");
		json_t *l0 = json_array_get(json_object_get(j, "layers"), 0);
		json_t *l1 = json_array_get(json_object_get(j, "layers"), 1);
		CHECK(json_array_size(json_object_get(j, "layers")) == NL, "layer count");
		CHECK(l0 && !strcmp(json_string_value(json_object_get(l0, "kind")), "dense") &&
		      jget(l0, "attention_bytes") == X_ATTN_LAYER &&
		      jget(l0, "norm_bytes") == X_NORM_LAYER && jget(l0, "mlp_bytes") == X_DENSE &&
		      jget(l0, "routed_experts") == 0, "layer 0");
		CHECK(l1 && !strcmp(json_string_value(json_object_get(l1, "kind")), "moe") &&
		      jget(l1, "mlp_bytes") == X_ROUTER + X_SHARED + E * X_EXPERT &&
		      jget(l1, "routed_experts") == E && jget(l1, "expert_bytes_min") == X_EXPERT,
		      "layer 1");
		json_t *mtp = json_object_get(j, "mtp_layers");
		CHECK(json_array_size(mtp) == 1 && jget(json_array_get(mtp, 0), "layer") == 2 &&
		      jget(json_array_get(mtp, 0), "bytes") == X_MTP, "mtp_layers");
		json_decref(j);
	}
	free(out);

	/* text form: the same figures */
	snprintf(args, sizeof(args), "--model '%s'", dir);
	st = run(args, &out);
	CHECK(st == 0, "inspect exit %d: %s", st, out ? out : "");
	if (getenv("MOET_TEST_VERBOSE"))
		printf("%s", out ? out : "");
	char want[128];
	snprintf(want, sizeof(want), "routed_expert_bytes: %" PRIu64 " ", (uint64_t)X_EXPERT);
	CHECK(out && strstr(out, want), "text lacks \"%s\": %s", want, out ? out : "");
	const char *line = out ? strstr(out, "\n  routed_experts ") : NULL;
	unsigned long long v = 0;
	CHECK(line && sscanf(line, "\n  routed_experts %llu", &v) == 1 && v == E * X_EXPERT,
	      "routed_experts line: %llu", v);
	CHECK(out && strstr(out, "mtp_layers (skipped): 1") && strstr(out, "  layer 2: "),
	      "mtp in text");
	CHECK(out && strstr(out, "shards: 2\n"), "shards in text");
	free(out);
}

static void test_validate(const char *clean, const char *bad)
{
	char args[4608], *out = NULL;
	snprintf(args, sizeof(args), "--model '%s' --validate", clean);
	int st = run(args, &out);
	CHECK(st == 0 && out && strstr(out, "with NaN/Inf") && strstr(out, " 0 with NaN/Inf"),
	      "validate clean: exit %d: %s", st, out ? out : "");
	free(out);

	snprintf(args, sizeof(args), "--model '%s' --validate 2>/dev/null", bad);
	st = run(args, &out);
	CHECK(st == 1, "validate poisoned: exit %d", st);
	CHECK(out && strstr(out, "invalid: tensor model.layers.1.mlp.experts.2.up_proj.weight: "
				 "element 5: NaN code 0x7F\n"), "f8 NaN not reported: %s", out);
	CHECK(out && strstr(out, "invalid: tensor model.norm.weight: element 3: non-finite"),
	      "bf16 Inf not reported: %s", out);
	CHECK(out && strstr(out, "2 with NaN/Inf"), "count: %s", out);
	free(out);
	snprintf(args, sizeof(args), "--model '%s' --validate 2>&1 >/dev/null", bad);
	st = run(args, &out);
	CHECK(st == 1 && out && strstr(out, "moet-hybrid inspect: ") == out &&
	      strchr(out, '\n') == out + strlen(out) - 1 && strstr(out, "2 tensors hold NaN/Inf"),
	      "validate stderr: %s", out ? out : "");
	free(out);
	snprintf(args, sizeof(args), "--model '%s' --validate --json 2>/dev/null", bad);
	st = run(args, &out);
	json_t *j = out ? json_loads(out, 0, NULL) : NULL;
	json_t *badv = json_object_get(json_object_get(j, "validate"), "bad");
	CHECK(st == 1 && json_array_size(badv) == 2, "validate --json: %s", out ? out : "");
	json_decref(j);
	free(out);
}

/* Expects exit 1 with exactly one line on stderr holding `needle`, nothing on stdout. */
static void expect_one_line(const char *what, const char *args, const char *needle)
{
	char cmd[4700], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s 2>&1 >/dev/null", args);
	int st = run(cmd, &out);
	if (getenv("MOET_TEST_VERBOSE"))
		printf("%-24s -> %s", what, out ? out : "");
	CHECK(st == 1, "%s: exit %d", what, st);
	CHECK(out && strstr(out, "moet-hybrid inspect: ") == out &&
	      strchr(out, '\n') == out + strlen(out) - 1, "%s: not one line: %s", what,
	      out ? out : "");
	CHECK(out && strstr(out, needle), "%s: lacks \"%s\": %s", what, needle, out ? out : "");
	free(out);
	snprintf(cmd, sizeof(cmd), "%s 2>/dev/null", args);
	run(cmd, &out);
	CHECK(out && !out[0], "%s: printed to stdout: %s", what, out ? out : "");
	free(out);
}

static void test_broken(const char *dir)
{
	char args[4608], p[4200];
	snprintf(p, sizeof(p), "%s/model-00002-of-00002.safetensors", dir);
	CHECK(truncate(p, (off_t)file_bytes(dir, "model-00002-of-00002.safetensors") - 1) == 0,
	      "truncate");
	snprintf(args, sizeof(args), "--model '%s'", dir);
	expect_one_line("truncated shard", args, p);
	stb_write_text(dir, "config.json", "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 2}");
	snprintf(p, sizeof(p), "%s/config.json: field hidden_size: missing", dir);
	expect_one_line("config field missing", args, p);
	expect_one_line("no --model", "", "--model DIR is required");
	expect_one_line("unknown option", "--bogus", "unknown option --bogus");
	expect_one_line("missing directory", "--model /nonexistent/moet", "/nonexistent/moet");

	char *out = NULL;
	int st = run("--help", &out);
	CHECK(st == 0 && out && strstr(out, "usage: moet-hybrid inspect --model DIR"),
	      "--help: %d %s", st, out ? out : "");
	free(out);
}

int main(void)
{
	/* NOTE: in a sanitizer build a leak exits 1 by default, which inspect's own error exit
	 * would hide; make it distinct for the children. Harmless without sanitizers. */
	char asan[512];
	const char *old = getenv("ASAN_OPTIONS");
	snprintf(asan, sizeof(asan), "%s%sexitcode=66", old ? old : "", old && old[0] ? ":" : "");
	setenv("ASAN_OPTIONS", asan, 1);
	char *clean = moet_test_mkdtemp("inspect-clean"), *bad = moet_test_mkdtemp("inspect-bad");
	if (!clean || !bad) {
		fprintf(stderr, "cannot make scratch directories\n");
		return 1;
	}
	write_checkpoint(clean, 0);
	write_checkpoint(bad, 1);
	test_summary(clean);
	test_validate(clean, bad);
	test_broken(clean);
	stb_rmdir(clean);
	stb_rmdir(bad);
	return moet_test_done("test_cli_inspect");
}
