/*
 * cli_verify.c: `moet-hybrid verify`: a placement must not change a bit. Runs prompts with
 * the placement and without it (every expert on the backend), compares the logits with
 * memcmp at several batch sizes, prints the share of routings each tier served and the first
 * differing position if any; exit 1 on a difference.
 *
 * On the CPU backend the placement's GPUs are simulated devices (the test double: each holds
 * a private copy of its experts' bytes); with --device cuda the reference run has every
 * expert on the GPU and the placement's GPU 0 is that GPU, the rest of the experts computed
 * by the hybrid engine's CPU tier (one GPU so far).
 *
 * With --ram-budget-gb the run under test also keeps the CPU tier behind the NVMe expert tier
 * (io_uring reads into RAM slots, runtime/moet_xtier.h); the reference has no budget. The
 * placement is then optional (without it the CPU tier is every expert, CPU backend).
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_placement.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid verify --model DIR --placement FILE [--device cpu|cuda] "
		   "[--sim-devices N]\n"
		   "                          [--prompts N] [--len N] [--steps N] [--seed S] [--batches LIST]\n"
		   "                          [--ram-budget-gb G [--ram-profile FILE]] [--shadow RATE]\n\n"
		   "Runs N synthetic prompts (token ids from the seed) through prefill and decode\n"
		   "steps with the placement and without it, at batch size 1 (one call per\n"
		   "sequence) and N (all sequences in one call), and compares every logit bit for\n"
		   "bit. Prints the share of routings each tier served; exits 1 on a difference.\n\n"
		   "  --placement FILE  placement file (docs/placement.md)\n"
		   "  --device cpu      the CPU backend; the placement's GPUs are simulated devices\n"
		   "  --device cuda     the GPU: every expert resident for the reference run, the\n"
		   "                    placement's GPU 0 with the CPU tier beside it for the other\n"
		   "  --sim-devices N   how many simulated devices (default: the file's GPU count;\n"
		   "                    must be at least that)\n"
		   "  --prompts N       sequences (default 4)   --len N  prompt length (default 12)\n"
		   "  --steps N         decode steps (default 4) --seed S  token seed (default 1)\n"
		   "  --batches LIST    sequences per call, each size compared on its own (default\n"
		   "                    1 and N; each at most N)\n"
		   "  --shadow RATE     no reference run: with probability RATE per MoE layer call,\n"
		   "                    one CPU-tier expert is computed again by the backend (its\n"
		   "                    bytes staged there) and compared bit for bit; for models\n"
		   "                    whose experts do not all fit; exit 1 on a mismatch\n"
		   "  --ram-budget-gb G the run under test keeps the CPU tier on disk behind G GiB\n"
		   "                    of RAM slots (or G%% of the tier; docs/io-uring.md); with\n"
		   "                    it --placement is optional\n"
		   "  --ram-profile F   routing profile for the tier's admission and eviction\n");
}

typedef struct vopts {
	int prompts, len, steps;
	uint64_t seed;
	int batches[8];  /* sequences per call, each run compared on its own */
	int n_batches;
} vopts;

/* All logits of the run (prefill last rows and decode steps), sequence-major per call. */
/* The run in calls of `batch` sequences each (the last call takes the rest). */
static int run_all(moet_model *m, const vopts *o, int batch, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	moet_kv **kv = calloc((size_t)o->prompts, sizeof(*kv));
	int64_t *tok = malloc((size_t)(o->prompts * (o->len + o->steps)) * sizeof(*tok));
	moet_seq_step *st = malloc((size_t)o->prompts * sizeof(*st));
	int rc = (!kv || !tok || !st) ? moet_err(MOET_ENOMEM, "verify buffers") : 0;
	uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 1;
	const int W = o->len + o->steps;
	for (int i = 0; !rc && i < o->prompts * W; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		tok[i] = (int64_t)(x % (uint64_t)V);
	}
	for (int s = 0; !rc && s < o->prompts; s++)
		rc = moet_kv_create(m, W, &kv[s]);
	size_t at = 0;
	for (int step = 0; !rc && step <= o->steps; step++) {
		for (int s = 0; s < o->prompts; s++) {
			/* ragged prompts: sequence s uses len - s % 3 tokens */
			int64_t plen = o->len - s % 3 > 0 ? o->len - s % 3 : 1;
			int64_t from = step == 0 ? 0 : plen + step - 1, cnt = step == 0 ? plen : 1;
			st[s] = (moet_seq_step){ .kv = kv[s], .tokens = tok + s * W + from,
						 .n_tok = cnt, .out_logits = out + at, .last_only = 1 };
			at += (size_t)V;
		}
		for (int s = 0; !rc && s < o->prompts; s += batch)
			rc = moet_model_forward_batch(m, &st[s], s + batch <= o->prompts ? batch
										: o->prompts - s);
	}
	for (int s = 0; kv && s < o->prompts; s++)
		moet_kv_destroy(kv[s]);
	free(kv);
	free(tok);
	free(st);
	return rc;
}

/* --shadow RATE: no reference run (the experts need not fit anywhere but where the placement
 * puts them); the placement's CPU-tier calls checked against the backend online. */
static int shadow_verify(const char *dir, const char *place, const char *device, int sim,
			 double rate, const vopts *o)
{
	moet_model *m = NULL;
	float *got = NULL;
	int n_dev = 0;
	int rc = place ? moet_cli_open(dir, device, place, &m)
		       : moet_err(MOET_EINVAL, "--shadow needs --placement FILE");
	if (!rc)
		rc = moet_cli_apply_placement(m, place, sim, &n_dev);
	if (!rc)
		rc = moet_model_set_shadow(m, rate);
	const int64_t V = rc ? 0 : moet_model_config(m)->vocab_size;
	const size_t n_log = (size_t)(o->prompts * (o->steps + 1)) * (size_t)V;
	if (!rc && !(got = malloc(n_log * sizeof(float))))
		rc = moet_err(MOET_ENOMEM, "logits");
	for (int b = 0; !rc && b < o->n_batches; b++)
		rc = run_all(m, o, o->batches[b], got);
	moet_shadow_stats st;
	if (!rc) {
		moet_model_shadow_stats(m, &st);
		uint64_t cnt[65] = { 0 }, total = 0;
		moet_model_tier_counts(m, cnt, 1 + n_dev);
		for (int t = 0; t <= n_dev; t++)
			total += cnt[t];
		printf("shadow %g: %llu CPU-tier expert calls recomputed on the %s backend (%llu "
		       "routing pairs), %llu mismatches, %llu errors; routings: CPU %.1f%% of %llu\n",
		       rate, (unsigned long long)st.checks, device, (unsigned long long)st.pairs,
		       (unsigned long long)st.mismatches, (unsigned long long)st.errors,
		       total ? 100.0 * (double)cnt[0] / (double)total : 0,
		       (unsigned long long)total);
		if (st.mismatches)
			printf("MISMATCH: last at layer %lld expert %lld\n", (long long)st.last_layer,
			       (long long)st.last_expert);
	}
	free(got);
	moet_model_close(m);
	if (rc)
		return moet_cli_fail("verify", rc);
	return st.mismatches || st.errors ? 1 : 0;
}

int moet_cli_verify(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "placement", required_argument, NULL, 'p' },
		{ "device", required_argument, NULL, 'd' },
		{ "sim-devices", required_argument, NULL, 'n' },
		{ "prompts", required_argument, NULL, 'P' },
		{ "len", required_argument, NULL, 'L' },
		{ "steps", required_argument, NULL, 'S' },
		{ "seed", required_argument, NULL, 's' },
		{ "ram-budget-gb", required_argument, NULL, 'B' },
		{ "ram-profile", required_argument, NULL, 'Q' },
		{ "shadow", required_argument, NULL, 'W' },
		{ "batches", required_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *model_dir = NULL, *place = NULL, *device = "cpu", *ram = NULL, *ram_prof = NULL;
	vopts o = { 4, 12, 4, 1, { 0 }, 0 };
	const char *batches = NULL;
	int sim = -1, c, bad = 0;
	double shadow = -1;
	char *end;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model_dir = optarg; break;
		case 'p': place = optarg; break;
		case 'd': device = optarg; break;
		case 'n': sim = (int)strtol(optarg, &end, 10); bad |= *end || sim < 0; break;
		case 'P': o.prompts = (int)strtol(optarg, &end, 10); bad |= *end; break;
		case 'L': o.len = (int)strtol(optarg, &end, 10); bad |= *end; break;
		case 'S': o.steps = (int)strtol(optarg, &end, 10); bad |= *end; break;
		case 's': o.seed = strtoull(optarg, &end, 10); bad |= *end != 0; break;
		case 'B': ram = optarg; break;
		case 'Q': ram_prof = optarg; break;
		case 'b': batches = optarg; break;
		case 'W': shadow = strtod(optarg, &end);
			bad |= *end || !(shadow > 0 && shadow <= 1);
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!model_dir || (!place && !ram)) {
		usage(stderr);
		return 2;
	}
	if (bad || o.prompts < 1 || o.prompts > 256 || o.len < 1 || o.len > 4096 || o.steps < 0 ||
	    o.steps > 4096)
		return moet_cli_fail("verify", moet_err(MOET_EINVAL, "--prompts (1..256), --len "
							"(1..4096), --steps (0..4096), --sim-devices "
							"(>= 0) take integers in range, --shadow a "
							"rate in (0, 1]"));
	if (batches) {
		int64_t *list = NULL;
		int n = 0;
		int rc = moet_cli_parse_list("--batches", batches, 1, o.prompts, &list, &n);
		for (int i = 0; !rc && i < n; i++)
			if (n > 8)
				rc = moet_err(MOET_EINVAL, "--batches: at most 8 sizes");
			else
				o.batches[o.n_batches++] = (int)list[i];
		free(list);
		if (rc)
			return moet_cli_fail("verify", rc);
	} else { /* one sequence per call, then all in one */
		o.batches[o.n_batches++] = 1;
		if (o.prompts > 1)
			o.batches[o.n_batches++] = o.prompts;
	}
	if (shadow > 0)
		return shadow_verify(model_dir, place, device, sim, shadow, &o);
	moet_model *m = NULL;
	moet_placement_sizes *sz = NULL;
	moet_placement *pl = NULL;
	float *ref = NULL, *got = NULL;
	int rc = moet_cli_open(model_dir, device, place, &m), differ = 0;
	if (!rc)
		rc = moet_placement_sizes_from_ckpt(moet_model_config(m), moet_model_ckpt(m), &sz);
	if (!rc && place)
		rc = moet_placement_load(place, moet_model_config(m), sz, &pl);
	int n_dev = rc || !pl ? 0 : moet_placement_n_gpus(pl);
	if (!rc && sim >= 0 && sim < n_dev)
		rc = moet_err(MOET_EINVAL, "--sim-devices %d: the placement names %d GPUs", sim,
			      n_dev);
	if (!rc && sim > n_dev)
		n_dev = sim;
	const int64_t V = rc ? 0 : moet_model_config(m)->vocab_size;
	const size_t n_log = (size_t)(o.prompts * (o.steps + 1)) * (size_t)V;
	if (!rc && (!(ref = malloc(n_log * sizeof(float))) || !(got = malloc(n_log * sizeof(float)))))
		rc = moet_err(MOET_ENOMEM, "logits");
	const int tp = rc ? 1 : moet_model_tp_ranks(m, NULL);
	if (tp > 1) /* the placement's `dense: split` (or MOET_TP): both runs split */
		printf("dense part split over %d %s (tensor-parallel) in both runs\n", tp,
		       strcmp(device, "cuda") ? "simulated ranks" : "GPUs");
	for (int bi = 0; !rc && bi < o.n_batches; bi++) {
		const int batch = o.batches[bi];
		if ((rc = moet_model_set_ram_budget(m, 0, NULL)) ||
		    (rc = moet_model_set_placement(m, NULL, 0)) || (rc = run_all(m, &o, batch, ref)) ||
		    (pl && (rc = moet_model_set_placement(m, moet_placement_owners(pl), n_dev))) ||
		    (ram && (rc = moet_cli_apply_ram_budget(m, ram, ram_prof))) ||
		    (rc = run_all(m, &o, batch, got)))
			break;
		size_t first = n_log;
		for (size_t i = 0; i < n_log; i++)
			if (memcmp(&ref[i], &got[i], sizeof(float))) {
				first = i;
				break;
			}
		uint64_t cnt[65] = { 0 }, total = 0;
		moet_model_tier_counts(m, cnt, 1 + n_dev);
		for (int t = 0; t <= n_dev; t++)
			total += cnt[t];
		printf("batch %d: %s", batch,
		       first == n_log ? "logits bit-identical" : "LOGITS DIFFER");
		if (first != n_log) {
			size_t row = first / (size_t)V;
			printf(" (first at sequence %zu, call %zu, token %zu: %a vs %a)",
			       row % (size_t)o.prompts, row / (size_t)o.prompts, first % (size_t)V,
			       ref[first], got[first]);
			differ = 1;
		}
		moet_hybrid_stats hs;
		moet_model_hybrid_stats(m, &hs, 0);
		printf("; routings: CPU %.1f%%", total ? 100.0 * (double)cnt[0] / (double)total : 0);
		if (hs.staged_pairs) /* cold experts the GPU computed from their staged bytes */
			printf(" (%.1f%% staged to GPU 0)",
			       100.0 * (double)hs.staged_pairs / (double)total);
		for (int g = 0; g < n_dev; g++)
			printf(", %s %.1f%%", g < moet_placement_n_gpus(pl) ?
			       moet_placement_gpu_at(pl, g)->name : "sim",
			       total ? 100.0 * (double)cnt[1 + g] / (double)total : 0);
		printf(" of %llu\n", (unsigned long long)total);
		moet_cli_ram_report(m, stdout);
	}
	free(ref);
	free(got);
	moet_placement_free(pl);
	moet_placement_sizes_free(sz);
	moet_model_close(m);
	if (rc)
		return moet_cli_fail("verify", rc);
	return differ ? 1 : 0;
}
