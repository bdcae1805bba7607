/*
 * test_hybrid_stage.c: prefill staging of cold experts (MOET_PREFILL_STAGE) and the CPU tier
 * moving only the hidden rows its pairs use, on the CPU backend with simulated devices.
 *
 * For several placements (all-CPU, CPU + one device, CPU + two devices) a 64-token prompt and a
 * two-sequence batch in two micro-batches give logits memcmp-equal to the run without a
 * placement with staging never (0), always (1), auto with a threshold the test picks from the
 * routing so that some cold experts reach it and some do not, and auto on the cost model's own
 * crossover. The routing seen by the route observer gives the expected counters: experts and
 * pairs staged, pairs left to the CPU tier, weight bytes staged (the checkpoint's tensor
 * sizes), and the hidden rows copied down (only the rows of the CPU tier's pairs: with a
 * hardware file of zero copy latency exactly those rows in maximal runs, with the default
 * figures each layer's span in one copy). Malformed switches (MOET_PREFILL_STAGE, _MIN,
 * MOET_HARDWARE, MOET_HYBRID_OVERLAP) are refused with a message naming them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define NP 64          /* prompt tokens */
#define MAX_L 8
#define MAX_E 64

typedef struct routes {
	int64_t top_k;
	int32_t ids[MAX_L][NP][8]; /* [layer][token][slot] of the one-sequence prefill */
	int seen[MAX_L];
} routes;

static void observe(void *ctx, const moet_route_event *ev)
{
	routes *r = ctx;
	if (ev->seq != 0 || ev->pos >= NP || ev->layer >= MAX_L)
		return;
	memcpy(r->ids[ev->layer][ev->pos], ev->ids, (size_t)ev->top_k * sizeof(int32_t));
	r->seen[ev->layer] = 1;
}

static int64_t toks[NP];

/* The prompt in one call (all logits), then two sequences in one batch (last logits). */
static void run(moet_model *m, float *out, int64_t V)
{
	moet_kv *kv = NULL, *k2[2] = { NULL, NULL };
	CHECK(moet_kv_create(m, NP + 4, &kv) == 0, "kv");
	CHECK(moet_model_forward(m, kv, toks, NP, out) == 0, "prefill: %s", moet_errmsg());
	moet_kv_destroy(kv);
	moet_seq_step st[2];
	for (int s = 0; s < 2; s++) {
		CHECK(moet_kv_create(m, NP, &k2[s]) == 0, "kv");
		st[s] = (moet_seq_step){ .kv = k2[s], .tokens = toks + 7 * s, .n_tok = 40 - 8 * s,
					 .out_logits = out + (NP + s) * V, .last_only = 1 };
	}
	setenv("MOET_MICROBATCH", "1", 1);
	CHECK(moet_model_forward_batch(m, st, 2) == 0, "batch: %s", moet_errmsg());
	unsetenv("MOET_MICROBATCH");
	for (int s = 0; s < 2; s++)
		moet_kv_destroy(k2[s]);
}

/* Only the prompt, for the counters (one pass of NP rows per MoE layer). */
static void prefill(moet_model *m)
{
	moet_kv *kv = NULL;
	CHECK(moet_kv_create(m, NP, &kv) == 0, "kv");
	CHECK(moet_model_forward(m, kv, toks, NP, NULL) == 0, "prefill: %s", moet_errmsg());
	moet_kv_destroy(kv);
}

/* What the counters of one prefill must be, from the routing: cold experts with at least
 * `min` tokens (0: none) staged, the rest on the CPU tier; rows: gap rows may be merged. */
typedef struct expect {
	uint64_t staged_experts, staged_pairs, cpu_pairs, rows, copies;
} expect;

static expect expected(const routes *r, const moet_config *c, const int16_t *own, int64_t min,
		       int64_t gap)
{
	const int64_t E = c->n_routed_experts, k = c->num_experts_per_tok;
	expect x = { 0 };
	for (int64_t l = 0; l < c->num_hidden_layers; l++) {
		if (!r->seen[l])
			continue;
		int64_t cnt[MAX_E] = { 0 };
		for (int t = 0; t < NP; t++)
			for (int64_t i = 0; i < k; i++)
				cnt[r->ids[l][t][i]]++;
		int used[NP] = { 0 };
		for (int64_t e = 0; e < E; e++) {
			if (own[l * E + e] >= 0 || !cnt[e])
				continue;
			if (min && cnt[e] >= min) {
				x.staged_experts++;
				x.staged_pairs += (uint64_t)cnt[e];
				continue;
			}
			x.cpu_pairs += (uint64_t)cnt[e];
			for (int t = 0; t < NP; t++)
				for (int64_t i = 0; i < k; i++)
					used[t] |= r->ids[l][t][i] == e;
		}
		/* maximal runs of used rows, two runs joined when at most `gap` rows lie between */
		int last = -1;
		for (int t = 0; t < NP; t++) {
			if (!used[t])
				continue;
			if (last < 0 || t - last - 1 > gap) {
				x.copies++;
				x.rows++;
			} else {
				x.rows += (uint64_t)(t - last);
			}
			last = t;
		}
	}
	return x;
}

int main(void)
{
	/* the dispatch's own row copies (the subject here), not the queued copies of every row
	 * that a decode pass on one device makes by default (MOET_MB_QUEUE) */
	setenv("MOET_MB_QUEUE", "0", 1);
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 11;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("hybrid-stage", &gp, &dir);
	if (!m)
		return moet_test_done("test_hybrid_stage");
	const moet_config *c = moet_model_config(m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const int64_t H = c->hidden_size;
	CHECK(L <= MAX_L && E <= MAX_E && c->num_experts_per_tok <= 8, "tiny geometry");
	for (int i = 0; i < NP; i++)
		toks[i] = (i * 97 + 13) % V;
	/* one expert's bytes from the checkpoint's own tensors (codes and scales) */
	uint64_t expert_bytes = 0;
	const char *part[3] = { "gate_proj", "up_proj", "down_proj" };
	int64_t l_moe = 0;
	while (l_moe < L && !moet_config_is_moe_layer(c, l_moe))
		l_moe++;
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 2; j++) {
			char name[128];
			snprintf(name, sizeof(name), "model.layers.%lld.mlp.experts.0.%s.%s",
				 (long long)l_moe, part[i], j ? "weight_scale_inv" : "weight");
			const moet_tensor *t = moet_ckpt_get(moet_model_ckpt(m), name);
			CHECK(t || j, "tensor %s", name);
			expert_bytes += t ? t->n_bytes : 0;
		}
	const size_t n_out = (size_t)((NP + 2) * V);
	float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	routes *rt = calloc(1, sizeof(*rt));
	moet_model_set_route_observer(m, observe, rt);
	run(m, ref, V);
	moet_model_set_route_observer(m, NULL, NULL);

	/* a hardware file of zero copy latency: no gap is worth copying */
	char hw0[512];
	snprintf(hw0, sizeof(hw0), "%s/hw0.yaml", dir);
	const char *hw0_text = "name: no-latency\npcie_latency_us: 0\n";
	CHECK(moet_test_write_file(hw0, hw0_text, strlen(hw0_text)) == 0, "hw file");

	uint64_t rng = 0x9E3779B97F4A7C15ull;
	const char *pl_name[3] = { "all-cpu", "cpu+1", "cpu+2" };
	uint64_t staged_auto = 0, cpu_auto = 0;
	for (int pl = 0; pl < 3; pl++) {
		const int n_dev = pl;
		for (int64_t i = 0; i < L * E; i++) {
			moet_test_xorshift64(&rng);
			own[i] = (int16_t)(pl == 0 || rng % 2 ? -1 : (int)((rng >> 8) % n_dev));
		}
		/* the threshold: the median of the cold experts' positive token counts, so that
		 * auto stages some and leaves others */
		expect all = expected(rt, c, own, 1, 0);
		int64_t min_t = 0;
		for (int64_t t = 1; t <= NP; t++) {
			expect x = expected(rt, c, own, t, 0);
			if (2 * x.staged_experts <= all.staged_experts) {
				min_t = t;
				break;
			}
		}
		char min_s[32];
		snprintf(min_s, sizeof(min_s), "%lld", (long long)min_t);
		/* modes: 0, 1, auto with min_t, auto on the cost model, unset (the default on the CPU
		 * backend: never; on a GPU auto, tests/gpu/test_gpu_hybrid.c)
		 * with the default gap; then 1 and auto with min_t through the pinned copies' waves
		 * (MOET_STAGE_COPY=pinned: on the CPU backend an uploader copying host to host) */
		const char *mode[7] = { "0", "1", "auto", "auto", NULL, "1", "auto" };
		for (int md = 0; md < 7; md++) {
			if (mode[md])
				setenv("MOET_PREFILL_STAGE", mode[md], 1);
			if (md == 2 || md == 6)
				setenv("MOET_PREFILL_STAGE_MIN", min_s, 1);
			if (md >= 5)
				setenv("MOET_STAGE_COPY", "pinned", 1);
			if (md != 4)
				setenv("MOET_HARDWARE", hw0, 1);
			CHECK(moet_model_set_placement(m, own, n_dev) == 0, "%s mode %d: %s",
			      pl_name[pl], md, moet_errmsg());
			unsetenv("MOET_PREFILL_STAGE");
			unsetenv("MOET_PREFILL_STAGE_MIN");
			unsetenv("MOET_HARDWARE");
			unsetenv("MOET_STAGE_COPY");
			memset(got, 0xAB, n_out * sizeof(float));
			run(m, got, V);
			CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0,
			      "%s, MOET_PREFILL_STAGE=%s%s: logits differ from the run without "
			      "placement", pl_name[pl], mode[md] ? mode[md] : "(unset)",
			      md >= 5 ? ", MOET_STAGE_COPY=pinned" : "");
			if (md == 3) /* the cost model's crossover: the bits only */
				continue;
			moet_hybrid_stats hs;
			moet_model_hybrid_stats(m, &hs, 1);
			prefill(m);
			moet_model_hybrid_stats(m, &hs, 1);
			const int64_t min = md == 0 || md == 4 ? 0 : md == 1 || md == 5 ? 1 : min_t;
			/* default figures: 10 us x 55 GB/s of gap */
			const int64_t gap = md == 4 ? (int64_t)(550000 / (H * 4)) : 0;
			expect x = expected(rt, c, own, min, gap);
			const uint64_t rb = (uint64_t)H * sizeof(float);
			CHECK(hs.staged_experts == x.staged_experts && hs.staged_pairs == x.staged_pairs,
			      "%s mode %d: staged %llu experts %llu pairs, want %llu %llu", pl_name[pl],
			      md, (unsigned long long)hs.staged_experts,
			      (unsigned long long)hs.staged_pairs,
			      (unsigned long long)x.staged_experts, (unsigned long long)x.staged_pairs);
			CHECK(hs.bytes_staged == x.staged_experts * expert_bytes,
			      "%s mode %d: %llu bytes staged, want %llu x %llu", pl_name[pl], md,
			      (unsigned long long)hs.bytes_staged,
			      (unsigned long long)x.staged_experts, (unsigned long long)expert_bytes);
			CHECK(hs.cpu_pairs == x.cpu_pairs && hs.bytes_h2d == x.cpu_pairs * rb,
			      "%s mode %d: CPU tier %llu pairs, want %llu", pl_name[pl], md,
			      (unsigned long long)hs.cpu_pairs, (unsigned long long)x.cpu_pairs);
			CHECK(hs.bytes_d2h == x.rows * rb && hs.d2h_copies == x.copies,
			      "%s mode %d: rows down %llu in %llu copies, want %llu in %llu",
			      pl_name[pl], md, (unsigned long long)(hs.bytes_d2h / rb),
			      (unsigned long long)hs.d2h_copies, (unsigned long long)x.rows,
			      (unsigned long long)x.copies);
			if (md == 0)
				CHECK(x.rows < (uint64_t)(NP * (L - 1)) || pl == 0,
				      "%s: fewer rows than the layers' all (%llu)", pl_name[pl],
				      (unsigned long long)x.rows);
			if (md == 1 || md == 5)
				CHECK(hs.cpu_pairs == 0 && hs.bytes_d2h == 0 && hs.staged_experts > 0,
				      "%s: always: nothing left to the CPU tier", pl_name[pl]);
			if (md == 6)
				CHECK(hs.staged_experts > 0 && hs.cpu_pairs > 0, "%s: pinned auto",
				      pl_name[pl]);
			if (md == 2) {
				CHECK(hs.staged_experts > 0 && hs.cpu_pairs > 0,
				      "%s: auto at %lld tokens: staged %llu, CPU pairs %llu",
				      pl_name[pl], (long long)min_t,
				      (unsigned long long)hs.staged_experts,
				      (unsigned long long)hs.cpu_pairs);
				staged_auto += hs.staged_experts;
				cpu_auto += hs.cpu_pairs;
			}
			uint64_t cnt[3] = { 0 };
			moet_model_tier_counts(m, cnt, 3);
			CHECK(cnt[0] >= hs.cpu_pairs + hs.staged_pairs, "cold pairs counted");
		}
		printf("%-8s threshold %lld: logits equal with staging 0, 1, auto@%lld, auto, and 1, "
		       "auto@%lld in pinned waves; counters as routed\n", pl_name[pl],
		       (long long)min_t, (long long)min_t, (long long)min_t);
	}
	printf("auto@threshold: %llu experts staged, %llu pairs left to the CPU tier\n",
	       (unsigned long long)staged_auto, (unsigned long long)cpu_auto);

	/* malformed switches: refused, naming the variable */
	const char *bad[][3] = { { "MOET_PREFILL_STAGE", "2", "MOET_PREFILL_STAGE='2'" },
				 { "MOET_PREFILL_STAGE_MIN", "0", "MOET_PREFILL_STAGE_MIN='0'" },
				 { "MOET_PREFILL_STAGE_MIN", "4x", "MOET_PREFILL_STAGE_MIN='4x'" },
				 { "MOET_HARDWARE", "/nonexistent/hw.yaml", "MOET_HARDWARE" },
				 { "MOET_PREFILL_STAGE", "Auto", "MOET_PREFILL_STAGE='Auto'" },
				 { "MOET_HYBRID_OVERLAP", "2", "MOET_HYBRID_OVERLAP='2'" },
				 { "MOET_HYBRID_OVERLAP", "off", "MOET_HYBRID_OVERLAP='off'" },
				 { "MOET_STAGE_COPY", "dma", "MOET_STAGE_COPY='dma'" } };
	for (int i = 0; i < 8; i++) {
		setenv(bad[i][0], bad[i][1], 1);
		int rc = moet_model_set_placement(m, own, 2);
		unsetenv(bad[i][0]);
		CHECK(rc < 0 && strstr(moet_errmsg(), bad[i][2]), "%s=%s: rc %d, '%s'", bad[i][0],
		      bad[i][1], rc, moet_errmsg());
	}
	CHECK(moet_model_set_placement(m, NULL, 0) == 0, "placement removed");
	moet_model_close(m);
	free(rt);
	free(ref);
	free(got);
	free(own);
	free(dir);
	return moet_test_done("test_hybrid_stage");
}
