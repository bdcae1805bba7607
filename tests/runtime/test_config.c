/*
 * test_config.c: moet_config_parse / moet_config_load on the published DeepSeek-V3 and
 * Kimi-K2-Instruct config.json (values checked against the published files), on a minimal
 * config (every default of docs/config.md), on the newer rope_parameters form, and on broken
 * configs: each must fail with its code and a one-line "LABEL: field NAME: problem".
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "moet_config.h"
#include "moet_err.h"
#include "moet_test.h"
#include "st_build.h"

#define LABEL "ckpt/config.json"

/* deepseek-ai/DeepSeek-V3 config.json (auto_map left out) */
static const char *deepseek_v3 =
	"{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false,"
	" \"attention_dropout\": 0.0, \"aux_loss_alpha\": 0.001, \"bos_token_id\": 0,"
	" \"eos_token_id\": 1, \"ep_size\": 1, \"first_k_dense_replace\": 3,"
	" \"hidden_act\": \"silu\", \"hidden_size\": 7168, \"initializer_range\": 0.02,"
	" \"intermediate_size\": 18432, \"kv_lora_rank\": 512,"
	" \"max_position_embeddings\": 163840, \"model_type\": \"deepseek_v3\","
	" \"moe_intermediate_size\": 2048, \"moe_layer_freq\": 1, \"n_group\": 8,"
	" \"n_routed_experts\": 256, \"n_shared_experts\": 1, \"norm_topk_prob\": true,"
	" \"num_attention_heads\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 61,"
	" \"num_key_value_heads\": 128, \"num_nextn_predict_layers\": 1, \"pretraining_tp\": 1,"
	" \"q_lora_rank\": 1536, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
	" \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\","
	" \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]},"
	" \"rms_norm_eps\": 1e-06, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1,"
	" \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
	" \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
	" \"rope_theta\": 10000, \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\","
	" \"seq_aux\": true, \"tie_word_embeddings\": false, \"topk_group\": 4,"
	" \"topk_method\": \"noaux_tc\", \"torch_dtype\": \"bfloat16\","
	" \"transformers_version\": \"4.33.1\", \"use_cache\": true, \"v_head_dim\": 128,"
	" \"vocab_size\": 129280}";

/* moonshotai/Kimi-K2-Instruct config.json (auto_map left out) */
static const char *kimi_k2 =
	"{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false,"
	" \"attention_dropout\": 0.0, \"aux_loss_alpha\": 0.001, \"bos_token_id\": 163584,"
	" \"eos_token_id\": 163585, \"first_k_dense_replace\": 1, \"hidden_act\": \"silu\","
	" \"hidden_size\": 7168, \"initializer_range\": 0.02, \"intermediate_size\": 18432,"
	" \"kv_lora_rank\": 512, \"max_position_embeddings\": 131072, \"model_type\": \"kimi_k2\","
	" \"moe_intermediate_size\": 2048, \"moe_layer_freq\": 1, \"n_group\": 1,"
	" \"n_routed_experts\": 384, \"n_shared_experts\": 1, \"norm_topk_prob\": true,"
	" \"num_attention_heads\": 64, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 61,"
	" \"num_key_value_heads\": 64, \"num_nextn_predict_layers\": 0, \"pretraining_tp\": 1,"
	" \"q_lora_rank\": 1536, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
	" \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\","
	" \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]},"
	" \"rms_norm_eps\": 1e-06, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0,"
	" \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
	" \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
	" \"rope_theta\": 50000.0, \"routed_scaling_factor\": 2.827, \"scoring_func\": \"sigmoid\","
	" \"seq_aux\": true, \"tie_word_embeddings\": false, \"topk_group\": 1,"
	" \"topk_method\": \"noaux_tc\", \"torch_dtype\": \"bfloat16\","
	" \"transformers_version\": \"4.48.3\", \"use_cache\": true, \"v_head_dim\": 128,"
	" \"vocab_size\": 163840}";

/* Only model_type and the required geometry. */
static const char *minimal =
	"{\"model_type\": \"deepseek_v3\", \"vocab_size\": 32, \"hidden_size\": 16,"
	" \"intermediate_size\": 24, \"moe_intermediate_size\": 8, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 2, \"n_routed_experts\": 4, \"num_experts_per_tok\": 1,"
	" \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 2,"
	" \"v_head_dim\": 4}";

static const char *const required[] = {
	"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
	"num_hidden_layers", "num_attention_heads", "n_routed_experts", "num_experts_per_tok",
	"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
};

static int parse_text(const char *text, moet_config *c)
{
	return moet_config_parse(LABEL, text, strlen(text), c);
}

static void test_published(void)
{
	moet_config c;
	int rc = parse_text(deepseek_v3, &c);
	CHECK(rc == 0, "DeepSeek-V3: %s", moet_errmsg());
	if (rc == 0) {
		CHECK(!strcmp(c.model_type, "deepseek_v3"), "model_type");
		CHECK(c.vocab_size == 129280 && c.hidden_size == 7168 &&
		      c.intermediate_size == 18432 && c.moe_intermediate_size == 2048 &&
		      c.num_hidden_layers == 61 && c.num_attention_heads == 128 &&
		      c.num_key_value_heads == 128, "V3 geometry");
		CHECK(c.n_shared_experts == 1 && c.n_routed_experts == 256 &&
		      c.num_experts_per_tok == 8 && c.n_group == 8 && c.topk_group == 4 &&
		      c.first_k_dense_replace == 3 && c.moe_layer_freq == 1 &&
		      c.num_nextn_predict_layers == 1, "V3 experts");
		CHECK(c.routed_scaling_factor == 2.5 && c.norm_topk_prob &&
		      !strcmp(c.scoring_func, "sigmoid") && !strcmp(c.topk_method, "noaux_tc"),
		      "V3 routing");
		CHECK(c.q_lora_rank == 1536 && c.kv_lora_rank == 512 && c.qk_nope_head_dim == 128 &&
		      c.qk_rope_head_dim == 64 && c.v_head_dim == 128 &&
		      moet_config_qk_head_dim(&c) == 192, "V3 MLA");
		CHECK(c.rope_interleave && !c.attention_bias && c.rms_norm_eps == 1e-6 &&
		      c.max_position_embeddings == 163840 && !c.tie_word_embeddings &&
		      !strcmp(c.hidden_act, "silu") && c.bos_token_id == 0 && c.eos_token_id == 1,
		      "V3 misc");
		CHECK(c.rope_type == MOET_ROPE_YARN && c.rope_theta == 10000.0 &&
		      c.rope_factor == 40.0 && c.rope_original_max_pos == 4096 &&
		      c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0 && c.rope_mscale == 1.0 &&
		      c.rope_mscale_all_dim == 1.0 && c.rope_truncate &&
		      !c.rope_has_attention_factor, "V3 rope");
		CHECK(c.fp8 && c.fp8_block_rows == 128 && c.fp8_block_cols == 128, "V3 fp8");
		CHECK(!moet_config_is_moe_layer(&c, 2) && moet_config_is_moe_layer(&c, 3) &&
		      moet_config_is_moe_layer(&c, 60), "V3 layer kinds");
	}
	rc = parse_text(kimi_k2, &c);
	CHECK(rc == 0, "Kimi-K2: %s", moet_errmsg());
	if (rc == 0) {
		CHECK(!strcmp(c.model_type, "kimi_k2"), "model_type");
		CHECK(c.vocab_size == 163840 && c.n_routed_experts == 384 && c.n_group == 1 &&
		      c.topk_group == 1 && c.num_attention_heads == 64 &&
		      c.first_k_dense_replace == 1 && c.num_nextn_predict_layers == 0 &&
		      c.routed_scaling_factor == 2.827, "K2 geometry");
		CHECK(c.rope_theta == 50000.0 && c.rope_factor == 32.0 && c.rope_beta_fast == 1.0 &&
		      c.bos_token_id == 163584 && c.eos_token_id == 163585 && c.fp8, "K2 rope/ids");
	}
}

static void test_defaults(void)
{
	moet_config c;
	int rc = parse_text(minimal, &c);
	CHECK(rc == 0, "minimal: %s", moet_errmsg());
	if (rc)
		return;
	CHECK(c.num_key_value_heads == 2, "num_key_value_heads default = heads");
	CHECK(c.n_shared_experts == 1 && c.n_group == 1 && c.topk_group == 1 &&
	      c.first_k_dense_replace == 0 && c.moe_layer_freq == 1 &&
	      c.num_nextn_predict_layers == 0, "expert defaults");
	CHECK(c.routed_scaling_factor == 1.0 && c.norm_topk_prob &&
	      !strcmp(c.scoring_func, "sigmoid") && !strcmp(c.topk_method, "noaux_tc"),
	      "routing defaults");
	CHECK(c.q_lora_rank == 0 && c.rope_interleave && !c.attention_bias &&
	      c.rms_norm_eps == 1e-6 && c.max_position_embeddings == 4096 &&
	      !c.tie_word_embeddings && !strcmp(c.hidden_act, "silu") && c.bos_token_id == -1 &&
	      c.eos_token_id == -1, "misc defaults");
	CHECK(c.rope_type == MOET_ROPE_DEFAULT && c.rope_theta == 10000.0 && !c.fp8,
	      "rope/quant defaults");
}

/* minimal + a JSON patch applied with jansson ("null" value deletes a key when del). */
static int parse_patched(const char *base, const char *patch, const char *del, moet_config *c)
{
	json_t *b = json_loads(base, 0, NULL), *p = patch ? json_loads(patch, 0, NULL) : NULL;
	if (!b || (patch && !p)) {
		fprintf(stderr, "bad test JSON: %s\n", patch ? patch : base);
		exit(1);
	}
	if (p)
		json_object_update(b, p);
	if (del)
		json_object_del(b, del);
	char *text = json_dumps(b, 0);
	int rc = parse_text(text, c);
	free(text);
	json_decref(b);
	json_decref(p);
	return rc;
}

static void expect(const char *what, const char *patch, const char *del, int code,
		   const char *needle)
{
	moet_config c;
	moet_err_clear();
	int rc = parse_patched(minimal, patch, del, &c);
	const char *msg = moet_errmsg();
	if (getenv("MOET_TEST_VERBOSE"))
		printf("%-36s -> %s\n", what, msg);
	CHECK(rc == code, "%s: rc %d (%s), want %d: %s", what, rc, moet_strerror(rc), code, msg);
	if (code == 0)
		return;
	CHECK(msg[0] && !strchr(msg, '\n'), "%s: not one line: %s", what, msg);
	CHECK(strstr(msg, LABEL ": ") == msg, "%s: does not start with the label: %s", what, msg);
	CHECK(strstr(msg, needle), "%s: lacks \"%s\": %s", what, needle, msg);
}

static void test_forms(void)
{
	moet_config c;
	int rc = parse_patched(minimal, "{\"rope_parameters\": {\"rope_type\": \"yarn\","
			       " \"rope_theta\": 50000.0, \"factor\": 32, \"beta_fast\": 8,"
			       " \"original_max_position_embeddings\": 4096, \"truncate\": false,"
			       " \"attention_factor\": 1.5}}", NULL, &c);
	CHECK(rc == 0 && c.rope_type == MOET_ROPE_YARN && c.rope_theta == 50000.0 &&
	      c.rope_factor == 32.0 && c.rope_beta_fast == 8.0 && c.rope_beta_slow == 1.0 &&
	      c.rope_mscale == 0.0 && c.rope_mscale_all_dim == 0.0 && !c.rope_truncate &&
	      c.rope_has_attention_factor && c.rope_attention_factor == 1.5,
	      "rope_parameters yarn: %s", moet_errmsg());
	rc = parse_patched(minimal, "{\"rope_parameters\": {\"rope_type\": \"default\","
			   " \"rope_theta\": 123.0}}", NULL, &c);
	CHECK(rc == 0 && c.rope_type == MOET_ROPE_DEFAULT && c.rope_theta == 123.0,
	      "rope_parameters default: %s", moet_errmsg());
	rc = parse_patched(minimal, "{\"rope_scaling\": null, \"rope_theta\": 5e4}", NULL, &c);
	CHECK(rc == 0 && c.rope_type == MOET_ROPE_DEFAULT && c.rope_theta == 50000.0,
	      "rope_scaling null: %s", moet_errmsg());
	rc = parse_patched(minimal, "{\"eos_token_id\": [7, 9], \"bos_token_id\": null,"
			   " \"q_lora_rank\": null, \"num_key_value_heads\": null}", NULL, &c);
	CHECK(rc == 0 && c.eos_token_id == 7 && c.bos_token_id == -1 && c.q_lora_rank == 0 &&
	      c.num_key_value_heads == 2, "eos list / nulls: %s", moet_errmsg());
	rc = parse_patched(minimal, "{\"model_type\": \"my_finetune\", \"architectures\":"
			   " [\"Other\", \"DeepseekV3ForCausalLM\"]}", NULL, &c);
	CHECK(rc == 0 && !strcmp(c.model_type, "my_finetune"), "architectures: %s",
	      moet_errmsg());
	rc = parse_patched(minimal, "{\"quantization_config\": {\"quant_method\": \"fp8\","
			   " \"weight_block_size\": [64, 32]}}", NULL, &c);
	CHECK(rc == 0 && c.fp8 && c.fp8_block_rows == 64 && c.fp8_block_cols == 32,
	      "fp8 without fmt: %s", moet_errmsg());
}

static void test_errors(void)
{
	char what[96];
	for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
		snprintf(what, sizeof(what), "missing %s", required[i]);
		char needle[96];
		snprintf(needle, sizeof(needle), "field %s: missing", required[i]);
		expect(what, NULL, required[i], MOET_ENOTFOUND, needle);
	}
	expect("missing model_type", NULL, "model_type", MOET_ENOTFOUND,
	       "field model_type: missing");
	expect("null required field", "{\"hidden_size\": null}", NULL, MOET_ENOTFOUND,
	       "field hidden_size: missing");
	expect("hidden_size a string", "{\"hidden_size\": \"16\"}", NULL, MOET_EINVAL,
	       "field hidden_size: is a JSON string, expected an integer");
	expect("hidden_size a float", "{\"hidden_size\": 16.0}", NULL, MOET_EINVAL,
	       "field hidden_size: is a JSON number");
	expect("norm_topk_prob an int", "{\"norm_topk_prob\": 1}", NULL, MOET_EINVAL,
	       "field norm_topk_prob: is a JSON integer, expected true or false");
	expect("rms_norm_eps a string", "{\"rms_norm_eps\": \"1e-6\"}", NULL, MOET_EINVAL,
	       "field rms_norm_eps:");
	expect("eos a string", "{\"eos_token_id\": \"</s>\"}", NULL, MOET_EINVAL,
	       "field eos_token_id:");
	expect("architectures a string", "{\"architectures\": \"DeepseekV3ForCausalLM\"}", NULL,
	       MOET_EINVAL, "field architectures:");
	expect("rope_scaling a list", "{\"rope_scaling\": [1]}", NULL, MOET_EINVAL,
	       "field rope_scaling:");
	expect("yarn factor a string", "{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": "
	       "\"4\"}}",
	       NULL, MOET_EINVAL, "field rope_scaling.factor:");
	expect("yarn factor missing", "{\"rope_scaling\": {\"type\": \"yarn\"}}", NULL,
	       MOET_ENOTFOUND, "field rope_scaling.factor: missing");
	expect("rope type linear", "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}",
	       NULL, MOET_EUNSUP, "field rope_scaling.type: \"linear\" is not supported");
	expect("rope_parameters llama3", "{\"rope_parameters\": {\"rope_type\": \"llama3\"}}",
	       NULL, MOET_EUNSUP, "field rope_parameters.rope_type: \"llama3\"");
	expect("rope type and rope_type disagree",
	       "{\"rope_scaling\": {\"type\": \"yarn\", \"rope_type\": \"default\"}}", NULL,
	       MOET_EINVAL, "disagrees");
	expect("unsupported model_type", "{\"model_type\": \"llama\"}", NULL, MOET_EUNSUP,
	       "field model_type: \"llama\" is not supported");
	expect("unsupported arch", "{\"model_type\": \"qwen3_moe\", \"architectures\":"
	       " [\"Qwen3MoeForCausalLM\"]}", NULL, MOET_EUNSUP, "field model_type:");
	expect("n_group does not divide experts",
	       "{\"n_routed_experts\": 384, \"n_group\": 7, \"num_experts_per_tok\": 2}", NULL,
	       MOET_EINVAL, "field n_routed_experts: 384 is not a multiple of n_group 7");
	expect("topk_group > n_group", "{\"n_group\": 2, \"topk_group\": 3}", NULL, MOET_EINVAL,
	       "field topk_group: 3 exceeds n_group 2");
	expect("top_k > experts", "{\"num_experts_per_tok\": 5}", NULL, MOET_EINVAL,
	       "field num_experts_per_tok: 5 exceeds n_routed_experts 4");
	expect("top_k > reachable", "{\"n_group\": 2, \"topk_group\": 1, \"num_experts_per_tok\": "
	       "3}",
	       NULL, MOET_EINVAL, "field num_experts_per_tok: 3 exceeds the 2 experts");
	expect("zero hidden_size", "{\"hidden_size\": 0}", NULL, MOET_ERANGE,
	       "field hidden_size: 0 is out of range");
	expect("negative layers", "{\"num_hidden_layers\": -3}", NULL, MOET_ERANGE,
	       "field num_hidden_layers:");
	expect("huge vocab", "{\"vocab_size\": 9223372036854775807}", NULL, MOET_ERANGE,
	       "field vocab_size:");
	expect("odd rope dim", "{\"qk_rope_head_dim\": 3}", NULL, MOET_EINVAL,
	       "field qk_rope_head_dim: 3 is odd");
	expect("negative eps", "{\"rms_norm_eps\": -1e-6}", NULL, MOET_ERANGE,
	       "field rms_norm_eps:");
	expect("scoring softmax", "{\"scoring_func\": \"softmax\"}", NULL, MOET_EUNSUP,
	       "field scoring_func: \"softmax\"");
	expect("topk greedy", "{\"topk_method\": \"greedy\"}", NULL, MOET_EUNSUP,
	       "field topk_method:");
	expect("hidden_act gelu", "{\"hidden_act\": \"gelu\"}", NULL, MOET_EUNSUP,
	       "field hidden_act: \"gelu\"");
	expect("attention_bias", "{\"attention_bias\": true}", NULL, MOET_EUNSUP,
	       "field attention_bias:");
	expect("quant compressed-tensors",
	       "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\"}}", NULL,
	       MOET_EUNSUP, "field quantization_config.quant_method: \"compressed-tensors\"");
	expect("quant e5m2", "{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\":"
	       " \"e5m2\"}}", NULL, MOET_EUNSUP, "field quantization_config.fmt:");
	expect("quant block size", "{\"quantization_config\": {\"quant_method\": \"fp8\","
	       " \"weight_block_size\": [128]}}", NULL, MOET_EINVAL,
	       "field quantization_config.weight_block_size:");
	expect("quant_method missing", "{\"quantization_config\": {}}", NULL, MOET_ENOTFOUND,
	       "field quantization_config.quant_method: missing");
	expect("long model_type", "{\"model_type\": "
	       "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	       "xxxxxxxxxxxxxxxxxxxxxxx\"}", NULL, MOET_ERANGE, "field model_type: longer");

	moet_config c;
	int rc = moet_config_parse(LABEL, "{\"a\": 1,", 8, &c);
	CHECK(rc == MOET_EFORMAT && strstr(moet_errmsg(), LABEL ": not valid JSON"),
	      "malformed: %s", moet_errmsg());
	rc = moet_config_parse(LABEL, "[1]", 3, &c);
	CHECK(rc == MOET_EFORMAT && strstr(moet_errmsg(), "not an object"), "array: %s",
	      moet_errmsg());
	rc = moet_config_parse(LABEL, "{\"a\": 1, \"a\": 2}", 16, &c);
	CHECK(rc == MOET_EFORMAT && strstr(moet_errmsg(), "duplicate"), "duplicate: %s",
	      moet_errmsg());
}

static void test_load(void)
{
	char *dir = moet_test_mkdtemp("config");
	CHECK(dir != NULL, "mkdtemp");
	if (!dir)
		return;
	stb_write_text(dir, "config.json", kimi_k2);
	stb_write_text(dir, "other.json", deepseek_v3);
	moet_config c;
	int rc = moet_config_load(dir, &c);
	CHECK(rc == 0 && !strcmp(c.model_type, "kimi_k2"), "load DIR: %s", moet_errmsg());
	char path[4096];
	snprintf(path, sizeof(path), "%s/other.json", dir);
	rc = moet_config_load(path, &c);
	CHECK(rc == 0 && !strcmp(c.model_type, "deepseek_v3"), "load file: %s", moet_errmsg());
	stb_write_text(dir, "config.json", "{\"model_type\": \"deepseek_v3\"}");
	rc = moet_config_load(dir, &c);
	snprintf(path, sizeof(path), "%s/config.json: field ", dir);
	CHECK(rc == MOET_ENOTFOUND && strstr(moet_errmsg(), path) == moet_errmsg(),
	      "load broken: %s", moet_errmsg());
	snprintf(path, sizeof(path), "%s/absent.json", dir);
	rc = moet_config_load(path, &c);
	CHECK(rc == MOET_ENOTFOUND && strstr(moet_errmsg(), path), "load absent: %s",
	      moet_errmsg());
	stb_rmdir(dir);
}

/* Random byte edits of the published config: never a crash; every error one line. */
static void test_mutations(void)
{
	uint64_t x = 0x2545F4914F6CDD1Dull;
	size_t n0 = strlen(deepseek_v3);
	int rejected = 0;
	static const char tokens[] = "{}[]\",:0123456789-.etrufnl ";
	for (int it = 0; it < 3000; it++) {
		char *m = malloc(n0 + 1);
		memcpy(m, deepseek_v3, n0 + 1);
		size_t n = n0;
		for (int k = 0; k < 1 + it % 3; k++) {
			moet_test_xorshift64(&x);
			if (x % 5 == 0)
				n = (size_t)(x >> 8) % (n + 1);
			else
				m[(x >> 8) % n] = tokens[(x >> 32) % (sizeof(tokens) - 1)];
			if (n == 0)
				break;
		}
		char *exact = malloc(n ? n : 1);
		memcpy(exact, m, n);
		moet_config c;
		int rc = moet_config_parse(LABEL, exact, n, &c);
		if (rc) {
			rejected++;
			CHECK(moet_errmsg()[0] && !strchr(moet_errmsg(), '\n') &&
			      strstr(moet_errmsg(), LABEL ": ") == moet_errmsg(),
			      "mutation %d: message [%s]", it, moet_errmsg());
		}
		free(exact);
		free(m);
	}
	printf("config mutations: %d of 3000 rejected\n", rejected);
	CHECK(rejected > 1000, "too few rejected: %d", rejected);
}

int main(void)
{
	test_published();
	test_defaults();
	test_forms();
	test_errors();
	test_load();
	test_mutations();
	return moet_test_done("test_config");
}
