/*
 * bench_e2e.c: `moet-hybrid bench e2e`: the whole model, end to end, under expert placements
 * (issue 5): decode tokens/s at several batch sizes, prefill tokens/s, the time split of a
 * hybrid step and the time to ready.
 *
 *   per mode     gpu (every routed expert on the GPU), hybrid (the placement file's), cpu
 *                (every routed expert on the CPU tier; the dense part stays on the device):
 *                the model is opened afresh and the placement set: that time is the time to
 *                ready (the hot experts' upload included), with the bytes uploaded
 *   decode B     B sequences prefilled with `ctx` random tokens in one call, one warm-up
 *                step, then `steps` timed steps of B x 1 token, each sequence's next token
 *                drawn greedily where the logits are (on CUDA only the ids come back);
 *                the CPU tier's counters over the timed steps give the split: CPU busy
 *                (submit to done), driver blocked on the CPU, PCIe copies (staging down and
 *                up, wall time of the synchronous copies), the rest (GPU and host work)
 *   overlap      for hybrid modes the same steps again in one pass (MOET_MICROBATCH=0), once
 *                overlapped and once serial (the CPU tier alone: Tc = its busy time per step,
 *                Tg = serial step - Tc, the GPU part with the copies); the default step (two
 *                micro-batches) is compared with max(Tc, Tg) + 0.15 x min(Tc, Tg) (the
 *                issue's bound)
 *   prefill P    one sequence of P random tokens in one call, last logits to the host
 *
 * Rows: decode-<mode> (tokens = B, median step), prefill-<mode> (tokens = P); the split and
 * the overlap figures go to a "steps" array of the record, each prefill's staged cold experts
 * (MOET_PREFILL_STAGE) and hidden rows moved to a "prefills" array. With RAM budgets
 * (apply_ram: the NVMe tier) decode-<mode>-ram<label> rows and a "ram" array (the tier's slots
 * and its counters over the timed steps); ram_only runs those rows alone. --op-times
 * (MOET_OP_TIMES) adds a
 * table per decode batch of where the step's time goes op by op; every op is then waited for,
 * so that run's step times are not the engine's (run it on its own).
 *
 * For a hardware file (--hardware-out, bench_e2e_hw.c): the source read once more with the
 * CPU tier's own team (cpu_read), and per gpu-mode batch the routing of its timed steps
 * priced by the cost model (dense_hw): the step less that GPU expert time is the dense part.
 */
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <unistd.h>

#include "moet_bench_e2e.h"
#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"
#include "moet_model.h"
#include "moet_placement.h"
#include "moet_profile.h"
#include "moet_topo.h"
#include "moet_upload.h"
#include "moet_xtier.h"

static uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
	return *s;
}

/* Routing decisions of the timed decode steps into a profile (--profile-out). */
typedef struct route_rec {
	moet_profile *p;      /* --profile-out: every batch of the first mode, or NULL */
	moet_profile *batch;  /* this batch's alone (dense_hw), or NULL */
	int rc;
} route_rec;

static void on_route(void *ctx, const moet_route_event *ev)
{
	route_rec *r = ctx;
	if (!r->rc && r->p)
		r->rc = moet_profile_record(r->p, MOET_PROFILE_DECODE, ev->layer, ev->ids,
					    ev->weights, ev->top_k);
	if (!r->rc && r->batch)
		r->rc = moet_profile_record(r->batch, MOET_PROFILE_DECODE, ev->layer, ev->ids,
					    ev->weights, ev->top_k);
}

typedef struct step_split {
	double step_s, cpu_s, wait_s, pcie_s;
	double mean_s;                /* the mean step (step_s is the median) */
	double cpu_run_s, cpu_start_s, cpu_wake_s; /* per step: moet_hybrid_stats' ns_cpu_* */
	double cpu_pairs, pcie_bytes; /* per step */
	double cpu_calls, cpu_bytes;  /* per step: the CPU tier's expert calls, their weights */
	double staged_experts, staged_pairs; /* per step: cold experts staged (MOET_STAGE_BALANCE) */
	double stage_bytes, stage_link_s; /* per step: their bytes, the copies' own time */
	double cpu_layers;            /* per step: MoE layer calls with work for the CPU tier */
	double gpu_idle_s;            /* per step: moet_hybrid_stats' ns_gpu_idle */
	double gpu_idle_route_s;      /* of which at the routing's waits (ns_gpu_idle_route) */
	double split_share;           /* timed passes run as two micro-batches / all */
	double stream_share;          /* of all: split on two streams (MOET_MB_STREAMS) */
	double polled_share;          /* of all: split with the driver polling (MOET_MB_POLL) */
	double merged_calls;          /* per step: GPU expert calls of both halves (MOET_MB_MERGE) */
	double price_share[3];        /* of all: at each link price (MOET_STAGE_BALANCE=auto) */
	double queued_share;          /* of the CPU tier's calls: finished on the backend's queue
				       * (MOET_TIER_FINISH=queued) */
	double early_layers;          /* per step: layers whose next attention went early
				       * (MOET_EARLY_ROWS) */
	int warmup;                   /* untimed steps before them */
} step_split;

/* The link price arm of each timed step (MOET_STAGE_BALANCE=auto; -1: none): recorded from the
 * row's run, played back (moet_model_force_price) in the overlap check's serial run. */
typedef struct price_tape {
	int8_t *arm; /* [steps] */
	int play;
} price_tape;

/* B sequences: prefill ctx tokens, `warmup` untimed steps, `steps` timed steps; the timed
 * steps' price arms recorded into or played from pt (NULL: neither). */
static int decode_run(moet_model *m, int64_t B, int ctx, int warmup, int steps, double *samples,
		      step_split *split, route_rec *rr, const price_tape *pt)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	moet_kv **kv = calloc((size_t)B, sizeof(*kv));
	moet_seq_step *st = calloc((size_t)B, sizeof(*st));
	int64_t *tok = malloc((size_t)(B * ctx) * sizeof(*tok));
	int64_t *next = calloc((size_t)B, sizeof(*next));
	int rc = (!kv || !st || !tok || !next) ? moet_err(MOET_ENOMEM, "decode buffers") : 0;
	uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)B;
	for (int64_t i = 0; !rc && i < B * ctx; i++)
		tok[i] = (int64_t)(xs(&s) % (uint64_t)V);
	for (int64_t b = 0; !rc && b < B; b++)
		rc = moet_kv_create(m, ctx + warmup + steps + 1, &kv[b]);
	/* each step's next tokens drawn where the logits are (greedy; on CUDA only the ids
	 * cross PCIe, as in serving), fed back as the next step's tokens */
	static const moet_sample_params greedy = { .temperature = 0, .top_k = 0, .top_p = 1 };
	for (int64_t b = 0; !rc && b < B; b++)
		st[b] = (moet_seq_step){ .kv = kv[b], .tokens = tok + b * ctx, .n_tok = ctx,
					 .sample = &greedy, .out_token = &next[b] };
	if (!rc)
		rc = moet_model_forward_batch(m, st, (int)B);
	for (int it = -warmup; !rc && it < steps; it++) {
		if (it == 0) {
			moet_hybrid_stats z;
			moet_model_hybrid_stats(m, &z, 1);
			moet_model_op_times(m, 1, NULL, 1); /* MOET_EINVAL when not timed: fine */
			if (moet_model_xtier(m)) /* the tier's counters: the timed steps alone */
				moet_xtier_stats_reset(moet_model_xtier(m));
			if (rr)
				moet_model_set_route_observer(m, on_route, rr);
		}
		for (int64_t b = 0; b < B; b++) {
			tok[b * ctx] = next[b];
			st[b].tokens = tok + b * ctx;
			st[b].n_tok = 1;
		}
		if (pt && pt->play && it >= 0 && (rc = moet_model_force_price(m, pt->arm[it])))
			break;
		double t0 = moet_bench_now_s();
		rc = moet_model_forward_batch(m, st, (int)B);
		if (it >= 0)
			samples[it] = moet_bench_now_s() - t0;
		if (pt && !pt->play && it >= 0)
			pt->arm[it] = (int8_t)moet_model_last_price(m);
	}
	if (pt && pt->play) { /* the choice again, whatever happened */
		int r = moet_model_force_price(m, -1);
		rc = rc ? rc : r;
	}
	if (rr) {
		moet_model_set_route_observer(m, NULL, NULL);
		rc = rc ? rc : rr->rc;
	}
	if (!rc) {
		moet_hybrid_stats hs;
		moet_model_hybrid_stats(m, &hs, 1);
		split->cpu_s = (double)hs.ns_cpu / 1e9 / steps;
		split->wait_s = (double)hs.ns_wait / 1e9 / steps;
		split->cpu_run_s = (double)hs.ns_cpu_run / 1e9 / steps;
		split->cpu_start_s = (double)hs.ns_cpu_start / 1e9 / steps;
		split->cpu_wake_s = (double)hs.ns_cpu_wake / 1e9 / steps;
		split->pcie_s = (double)(hs.ns_d2h + hs.ns_h2d) / 1e9 / steps;
		split->gpu_idle_s = (double)hs.ns_gpu_idle / 1e9 / steps;
		split->gpu_idle_route_s = (double)hs.ns_gpu_idle_route / 1e9 / steps;
		split->cpu_pairs = (double)hs.cpu_pairs / steps;
		split->cpu_calls = (double)hs.cpu_calls / steps;
		split->cpu_bytes = (double)hs.cpu_weight_bytes / steps;
		split->staged_experts = (double)hs.staged_experts / steps;
		split->staged_pairs = (double)hs.staged_pairs / steps;
		split->stage_bytes = (double)hs.bytes_staged / steps;
		split->stage_link_s = (double)hs.ns_stage_link / 1e9 / steps;
		split->cpu_layers = (double)hs.calls / steps;
		split->pcie_bytes = (double)(hs.bytes_d2h + hs.bytes_h2d) / steps;
		split->split_share = (double)hs.split_passes / steps;
		split->stream_share = (double)hs.stream_passes / steps;
		split->polled_share = (double)hs.polled_passes / steps;
		split->merged_calls = (double)hs.merged_calls / steps;
		for (int a = 0; a < 3; a++)
			split->price_share[a] = (double)hs.price_passes[a] / steps;
		split->queued_share = hs.calls ? (double)hs.queued_finishes / (double)hs.calls : 0;
		split->early_layers = (double)hs.early_layers / steps;
	}
	for (int64_t b = 0; kv && b < B; b++)
		moet_kv_destroy(kv[b]);
	free(kv);
	free(st);
	free(tok);
	free(next);
	return rc;
}

static int prefill_run(moet_model *m, int64_t P, double *out_s)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	int64_t *tok = malloc((size_t)P * sizeof(*tok));
	float *logits = malloc((size_t)V * sizeof(float));
	moet_kv *kv = NULL;
	int rc = (!tok || !logits) ? moet_err(MOET_ENOMEM, "prefill buffers") : 0;
	uint64_t s = 0x2545F4914F6CDD1Dull ^ (uint64_t)P;
	for (int64_t i = 0; !rc && i < P; i++)
		tok[i] = (int64_t)(xs(&s) % (uint64_t)V);
	if (!rc)
		rc = moet_kv_create(m, P + 1, &kv);
	if (!rc) {
		moet_seq_step st = { .kv = kv, .tokens = tok, .n_tok = P, .out_logits = logits,
				     .last_only = 1 };
		double t0 = moet_bench_now_s();
		rc = moet_model_forward_batch(m, &st, 1);
		*out_s = moet_bench_now_s() - t0;
	}
	moet_kv_destroy(kv);
	free(tok);
	free(logits);
	return rc;
}

/* Opens the model and sets the mode's placement; *ready_s the wall time of both. */
static int open_mode(const moet_bench_e2e_opts *o, int mode, moet_model **out, double *ready_s)
{
	double t0 = moet_bench_now_s();
	moet_model *m = NULL;
	if (o->op_times)
		setenv("MOET_OP_TIMES", "1", 1);
	int rc = moet_model_open_on(o->model_dir, o->device, &m);
	if (o->op_times)
		unsetenv("MOET_OP_TIMES");
	if (rc)
		return rc;
	/* the steps' split: the device's idle time around the driver's waits (not with
	 * --op-times, whose backend waits for every op) */
	if (!o->op_times && (rc = moet_model_set_gpu_idle(m, 1))) {
		moet_model_close(m);
		return rc;
	}
	const moet_config *c = moet_model_config(m);
	const int64_t LE = c->num_hidden_layers * c->n_routed_experts;
	int16_t *own = malloc((size_t)LE * sizeof(*own));
	if (!own) {
		moet_model_close(m);
		return moet_err(MOET_ENOMEM, "owner table");
	}
	for (int64_t i = 0; i < LE; i++)
		own[i] = mode == MOET_E2E_GPU ? 0 : mode == MOET_E2E_CPU ? -1 : o->owner[i];
	rc = moet_model_set_placement(m, own, mode == MOET_E2E_HYBRID && o->n_devices > 1
						   ? o->n_devices : 1);
	free(own);
	if (rc) {
		moet_model_close(m);
		return rc;
	}
	*ready_s = moet_bench_now_s() - t0;
	*out = m;
	return 0;
}

typedef struct read_job {
	const moet_ckpt *ck;
	size_t first, step, limit; /* tensors first, first + step, ... */
	size_t bytes;
	uint64_t sink;
} read_job;

static void *read_main(void *arg)
{
	read_job *j = arg;
	for (size_t i = j->first; i < moet_ckpt_count(j->ck) && j->bytes < j->limit; i += j->step) {
		const moet_tensor *t = moet_ckpt_at(j->ck, i);
		if (!strstr(t->name, ".experts."))
			continue;
		uintptr_t a = ((uintptr_t)t->data + 63) & ~(uintptr_t)63;
		uintptr_t b = ((uintptr_t)t->data + t->n_bytes) & ~(uintptr_t)63;
		if (b > a) {
			j->sink ^= moet_bench_read((const void *)a, (size_t)(b - a));
			j->bytes += (size_t)(b - a);
		}
	}
	return NULL;
}

/* The source's read bandwidth as the upload meets it: n_threads read routed-expert bytes of
 * a fresh mapping of the checkpoint (page faults included), up to `limit` bytes in all. */
static int source_ceiling(const char *dir, int n_threads, size_t limit, double *out_GBps)
{
	moet_ckpt *ck = NULL;
	int rc = moet_ckpt_open(dir, &ck);
	if (rc)
		return rc;
	pthread_t th[64];
	read_job jb[64];
	int made = 0;
	double t0 = moet_bench_now_s();
	for (int i = 0; i < n_threads && i < 64; i++) {
		jb[i] = (read_job){ ck, (size_t)i, (size_t)n_threads, limit / (size_t)n_threads, 0, 0 };
		if (pthread_create(&th[i], NULL, read_main, &jb[i]))
			break;
		made++;
	}
	size_t bytes = 0;
	for (int i = 0; i < made; i++) {
		pthread_join(th[i], NULL);
		bytes += jb[i].bytes;
	}
	double s = moet_bench_now_s() - t0;
	moet_ckpt_close(ck);
	if (!made || !bytes)
		return moet_err(MOET_EIO, "source read ceiling: nothing read (%d threads)", made);
	*out_GBps = (double)bytes / s / 1e9;
	return 0;
}

int moet_bench_e2e_tier_threads(const char *device)
{
	const char *env = getenv("MOET_CPU_THREADS");
	int n = env && env[0] ? atoi(env) : 0;
	if (n >= 1)
		return n;
	moet_topo *t = NULL;
	if (moet_topo_load(&t)) {
		long k = sysconf(_SC_NPROCESSORS_ONLN);
		n = k > 0 ? (int)k : 1;
	} else {
		n = moet_topo_n_cores(t);
		moet_topo_destroy(t);
	}
	if (strcmp(device, "cpu") && n > 2)
		n--; /* beside a GPU: every core but the driving thread's */
	return n;
}

/* The cost model's GPU expert time (ms) of one gpu-mode batch: every routed expert on GPU 0,
 * the routing of that batch's timed steps, hardware dense_hw. */
static int batch_expert_ms(const moet_bench_e2e_opts *o, moet_model *m, const moet_profile *p,
			   int64_t B, double *out_ms)
{
	const moet_config *c = moet_model_config(m);
	const int64_t LE = c->num_hidden_layers * c->n_routed_experts;
	moet_placement_sizes *sz = NULL;
	int16_t *own = calloc((size_t)(LE ? LE : 1), sizeof(*own));
	int rc = own ? moet_placement_sizes_from_ckpt(c, moet_model_ckpt(m), &sz)
		     : moet_err(MOET_ENOMEM, "owner table");
	moet_cost_pred pr;
	if (!rc && !(rc = moet_cost_predict_owners(c, sz, own, 1, p, MOET_PROFILE_DECODE,
						   o->dense_hw, B, &pr)))
		*out_ms = pr.gpu_expert_ms;
	moet_placement_sizes_free(sz);
	free(own);
	return rc;
}

static const char *mode_name[] = { "gpu", "hybrid", "cpu" };

/* The hindsight and disk bounds of one RAM-budget row (docs/io-uring.md). Rates over the
 * traced lookups (all of them unless the trace was cut). all_s: the all-in-RAM step at this
 * batch in this process (the decode-<mode> row), or 0: no bound step then. */
typedef struct ram_bound {
	int valid;                   /* the tier's bounds were computed */
	double trace_hit_rate, opt, opt_any, stat; /* measured, MIN, MIN any start, static */
	double misses_per_step;      /* the tier's demand misses */
	double opt_misses_per_step;  /* MIN's, at the tier's lookups per step */
	double read_GBps;            /* the tier's bytes read / its wait for reads */
	double io_s, opt_io_s;       /* misses per step x slot bytes / read_GBps */
	double all_s, bound_s, opt_bound_s, over_bound; /* all + io; step bound / tier step */
} ram_bound;

static void ram_bound_of(const moet_xtier_stats *t, int steps, double all_s, double step_s,
			 ram_bound *b)
{
	const double tl = t->trace_len ? (double)t->trace_len : 1;
	*b = (ram_bound){ .valid = t->bounds_valid, .all_s = all_s };
	b->trace_hit_rate = (double)t->trace_hits / tl;
	b->opt = (double)t->opt_hits / tl;
	b->opt_any = (double)t->opt_any_hits / tl;
	b->stat = (double)t->static_hits / tl;
	b->misses_per_step = (double)t->misses / steps;
	b->opt_misses_per_step = (1.0 - b->opt) * (double)t->lookups / steps;
	b->read_GBps = t->wait_ns ? (double)t->bytes_read / (double)t->wait_ns : 0;
	if (b->read_GBps > 0) {
		b->io_s = b->misses_per_step * (double)t->slot_bytes / (b->read_GBps * 1e9);
		b->opt_io_s = b->opt_misses_per_step * (double)t->slot_bytes / (b->read_GBps * 1e9);
	}
	if (all_s > 0) {
		b->bound_s = all_s + b->io_s;
		b->opt_bound_s = all_s + b->opt_io_s;
		b->over_bound = b->bound_s / step_s;
	}
}

/* One RAM-budget row's tier: its RAM (slots), its counters over the timed steps, the bounds. */
static json_t *ram_json(const moet_xtier_stats *tp, const ram_bound *rb, const char *mode,
			const char *budget, int64_t B, double step_s, double mean_s)
{
	const moet_xtier_stats t = *tp;
	const double look = t.lookups ? (double)t.lookups : 1, act = t.actual ? (double)t.actual
									 : 1;
	json_t *j = json_pack("{s:s, s:s, s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			      " s:I, s:f, s:f, s:I, s:f, s:b, s:b}", "mode", mode, "budget", budget,
			      "batch", (json_int_t)B, "step_s", step_s, "tokens_per_s",
			      (double)B / step_s, "slots", (json_int_t)t.n_slots, "slot_bytes",
			      (json_int_t)t.slot_bytes, "resident_bytes",
			      (json_int_t)((size_t)t.n_slots * t.slot_bytes), "tier_experts",
			      (json_int_t)t.tier_experts, "tier_bytes", (json_int_t)t.tier_bytes,
			      "lookups", (json_int_t)t.lookups, "hits", (json_int_t)t.hits,
			      "late_hits", (json_int_t)t.late_hits, "misses", (json_int_t)t.misses,
			      "hit_rate", (double)(t.hits + t.late_hits) / look, "recall",
			      (double)t.predicted_hits / act, "bytes_read",
			      (json_int_t)t.bytes_read, "wait_s", (double)t.wait_ns * 1e-9,
			      "direct", t.direct, "registered", t.registered);
	/* the mean step: the throughput (a few steps wait for reads; the median hides them) */
	if (j && (json_object_set_new(j, "mean_step_s", json_real(mean_s)) ||
		  json_object_set_new(j, "mean_tokens_per_s", json_real((double)B / mean_s)))) {
		json_decref(j);
		return NULL;
	}
	/* the prefetch and its budget's inputs (moet_xtier.h) */
	json_t *pf = j ? json_pack("{s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "mode",
				   t.prefetch_mode == MOET_XTIER_PF_ALL ? "all" : "budget", "reads",
				   (json_int_t)t.prefetch_reads, "used", (json_int_t)t.prefetch_used,
				   "declined", (json_int_t)t.prefetch_declined, "disk_GBps",
				   t.pf_rate_Bps * 1e-9, "window_ms", t.pf_window_ns * 1e-6,
				   "precision", t.pf_precision, "misses_per_acquire",
				   t.pf_miss_avg)
		       : NULL;
	if (j && (!pf || json_object_set_new(j, "prefetch", pf))) {
		json_decref(j);
		return NULL;
	}
	if (!j || !rb->valid)
		return j;
	/* the hindsight bounds over the traced lookups (docs/io-uring.md) */
	json_t *b = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f,"
			      " s:f, s:f, s:f, s:f, s:f}", "trace_lookups",
			      (json_int_t)t.trace_len, "trace_cut", (json_int_t)t.trace_cut,
			      "trace_hits", (json_int_t)t.trace_hits, "trace_fetches",
			      (json_int_t)t.trace_fetches, "trace_start_resident",
			      (json_int_t)t.trace_start_resident, "opt_hits",
			      (json_int_t)t.opt_hits, "opt_any_start_hits",
			      (json_int_t)t.opt_any_hits, "static_hits", (json_int_t)t.static_hits,
			      "trace_hit_rate", rb->trace_hit_rate, "opt_hit_rate", rb->opt,
			      "opt_any_start_hit_rate", rb->opt_any,
			      "static_hit_rate", rb->stat, "misses_per_step", rb->misses_per_step,
			      "opt_misses_per_step", rb->opt_misses_per_step, "read_GBps",
			      rb->read_GBps, "read_s_per_step", rb->io_s, "opt_read_s_per_step",
			      rb->opt_io_s);
	if (!b || json_object_update(j, b)) {
		json_decref(b);
		json_decref(j);
		return NULL;
	}
	json_decref(b);
	if (rb->all_s > 0 && (json_object_set_new(j, "all_in_ram_step_s", json_real(rb->all_s)) ||
			      json_object_set_new(j, "disk_bound_step_s", json_real(rb->bound_s)) ||
			      json_object_set_new(j, "opt_disk_bound_step_s",
						  json_real(rb->opt_bound_s)) ||
			      json_object_set_new(j, "tier_over_disk_bound",
						  json_real(rb->over_bound)))) {
		json_decref(j);
		return NULL;
	}
	return j;
}

/* The bounds' two lines under a RAM-budget row (tests/gpu/ram_budget.sh reads them). */
static void ram_bound_print(FILE *out, const moet_xtier_stats *t, const ram_bound *b,
			    double step_s)
{
	if (!b->valid) {
		fprintf(out, "NVMe tier: hindsight bounds not computed: %s\n", moet_errmsg());
		return;
	}
	fprintf(out, "NVMe tier: hindsight over %llu lookups%s: hit rate %.3f measured, %.3f "
		"Belady/MIN from the tier's start, %.3f MIN from any warm start, %.3f best static "
		"set of %lld slots; %llu reads (demand and prefetch) >= MIN's %llu misses\n",
		(unsigned long long)t->trace_len, t->trace_cut ? " (trace cut: later lookups not "
		"traced)" : "", b->trace_hit_rate, b->opt, b->opt_any, b->stat,
		(long long)t->n_slots, (unsigned long long)t->trace_fetches,
		(unsigned long long)(t->trace_len - t->opt_hits));
	fprintf(out, "NVMe tier: disk bound: %.3f misses/step x %zu B at %.3f GB/s (bytes read / "
		"wait) = %.3f ms/step of reads; at MIN's %.3f misses/step %.3f ms",
		b->misses_per_step, t->slot_bytes, b->read_GBps, 1e3 * b->io_s,
		b->opt_misses_per_step, 1e3 * b->opt_io_s);
	if (b->all_s > 0)
		fprintf(out, "; all in RAM %.3f ms + reads = bound %.3f ms (MIN %.3f ms): tier "
			"step %.3f ms, %.3f of the bound's tokens/s", 1e3 * b->all_s,
			1e3 * b->bound_s, 1e3 * b->opt_bound_s, 1e3 * step_s, b->over_bound);
	fputc('\n', out);
}

static json_t *split_json(const char *mode, int64_t B, const step_split *sp)
{
	json_t *j =
		json_pack("{s:s, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
			 "s:f, s:f, s:f, s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:[f, f, f]}",
			 "mode",
			 mode, "batch", (json_int_t)B, "step_s", sp->step_s, "tokens_per_s",
			 (double)B / sp->step_s, "cpu_busy_s", sp->cpu_s, "cpu_wait_s", sp->wait_s,
			 "cpu_run_s", sp->cpu_run_s, "cpu_start_lag_s", sp->cpu_start_s,
			 "cpu_wake_lag_s", sp->cpu_wake_s,
			 "pcie_s", sp->pcie_s, "cpu_pairs", sp->cpu_pairs, "cpu_calls",
			 sp->cpu_calls, "cpu_weight_bytes", sp->cpu_bytes, "pcie_bytes",
			 sp->pcie_bytes, "split_share", sp->split_share, "stream_share",
			 sp->stream_share, "polled_share", sp->polled_share, "merged_calls",
			 sp->merged_calls, "warmup_steps", sp->warmup, "gpu_idle_s", sp->gpu_idle_s,
			 "gpu_idle_route_s", sp->gpu_idle_route_s, "gpu_busy_s",
			 sp->mean_s - sp->gpu_idle_s, "staged_experts", sp->staged_experts,
			 "staged_pairs", sp->staged_pairs, "price_share", sp->price_share[0],
			 sp->price_share[1], sp->price_share[2]);
	if (j) { /* the staged copies: their bytes and own time a step (their rate) */
		json_object_set_new(j, "stage_bytes", json_real(sp->stage_bytes));
		json_object_set_new(j, "stage_link_s", json_real(sp->stage_link_s));
		json_object_set_new(j, "queued_share", json_real(sp->queued_share));
		json_object_set_new(j, "early_layers", json_real(sp->early_layers));
	}
	return j;
}

/* --graph: what MOET_CUDA_GRAPH=1 needs, set where unset (bits of what was set), and undone. */
static int graph_env_set(void)
{
	int set = 0;
	if (!getenv("MOET_GPU_STREAM") || !*getenv("MOET_GPU_STREAM"))
		set |= 1, setenv("MOET_GPU_STREAM", "own", 1);
	if (!getenv("MOET_GPU_DEVGROUP") || !*getenv("MOET_GPU_DEVGROUP"))
		set |= 2, setenv("MOET_GPU_DEVGROUP", "1", 1);
	moet_devgroup_env_reset();
	return set;
}

static void graph_env_undo(int set)
{
	if (set & 1)
		unsetenv("MOET_GPU_STREAM");
	if (set & 2)
		unsetenv("MOET_GPU_DEVGROUP");
	moet_devgroup_env_reset();
}

/* --graph: the gpu or hybrid mode's decode batch B again with CUDA graphs (at least 3 untimed
 * steps: a direct one, the capture, a replay; hybrid in one pass, MOET_MICROBATCH=0: two
 * micro-batches are never captured), row decode-<mode>-graph. */
static int graph_row(const moet_bench_e2e_opts *o, moet_model *m, int mode, int64_t B,
		     double *samples, json_t *rec, json_t *steps_arr, FILE *out)
{
	moet_graph_stats gs;
	step_split sp = { 0 };
	const int one_pass = mode == MOET_E2E_HYBRID && !getenv("MOET_MICROBATCH");
	setenv("MOET_CUDA_GRAPH", "1", 1);
	if (one_pass)
		setenv("MOET_MICROBATCH", "0", 1);
	moet_graph_stats_get(m, &gs, 1);
	int rc = decode_run(m, B, o->ctx, o->warmup > 3 ? o->warmup : 3, o->steps, samples, &sp,
			    NULL, NULL);
	moet_graph_stats_get(m, &gs, 1);
	unsetenv("MOET_CUDA_GRAPH");
	if (one_pass)
		unsetenv("MOET_MICROBATCH");
	if (rc)
		return rc;
	char name[32], tag[32];
	snprintf(name, sizeof(name), "decode-%s-graph", mode_name[mode]);
	snprintf(tag, sizeof(tag), "%s-graph", mode_name[mode]);
	moet_bench_row r = { .tokens = B, .ceiling = "", .name = name };
	r.mean_s = moet_bench_mean(samples, o->steps);
	moet_bench_stats_of(samples, o->steps, &r.st);
	sp.step_s = r.st.median_s;
	sp.mean_s = r.mean_s;
	json_t *sj = split_json(tag, B, &sp);
	json_object_set_new(sj, "graphs_captured", json_integer((json_int_t)gs.captured));
	json_object_set_new(sj, "graphs_replayed", json_integer((json_int_t)gs.replayed));
	json_object_set_new(sj, "graphs_failed", json_integer((json_int_t)gs.failed));
	if (gs.failed)
		json_object_set_new(sj, "graph_error", json_string(gs.last_error));
	json_array_append_new(steps_arr, sj);
	if ((rc = moet_bench_add_row(rec, &r)))
		return rc;
	fprintf(out, "%-7s %-9s %6lld %11.3f %10.1f   mean step %.3f ms = %.1f tok/s; graphs: "
		"%llu captured, %llu replayed, %llu failed%s%s\n", mode_name[mode], "decode-g",
		(long long)B,
		1e3 * sp.step_s, (double)B / sp.step_s, 1e3 * r.mean_s, (double)B / r.mean_s,
		(unsigned long long)gs.captured, (unsigned long long)gs.replayed,
		(unsigned long long)gs.failed, gs.failed ? ": " : "", gs.failed ? gs.last_error : "");
	fflush(out);
	return 0;
}

int moet_bench_e2e(const moet_bench_e2e_opts *o, json_t *rec, FILE *log, FILE *out)
{
	json_t *steps_arr = json_array(), *ready = json_object();
	double *samples = malloc((size_t)o->steps * sizeof(double));
	/* the decode-<mode> step per batch, for the RAM rows' disk bound */
	double *all_s = calloc((size_t)(o->n_batches > 0 ? o->n_batches : 1), sizeof(double));
	price_tape tape = { malloc((size_t)o->steps), 0 };
	int rc = (!steps_arr || !ready || !samples || !all_s || !tape.arm)
			 ? moet_err(MOET_ENOMEM, "bench e2e")
			 : 0;
	if (!rc) {
		json_object_set_new(rec, "steps", steps_arr);
		json_object_set_new(rec, "decode_warmup_steps", json_integer(o->warmup));
		json_object_set_new(rec, "ready", ready);
	}
	if (!rc && strcmp(o->device, "cpu")) {
		/* NOTE: the read ceiling first, on bytes the upload will read again: the second
		 * reader finds the pages in the page cache either way (a RAM-backed checkpoint) */
		double h2d = 0, src = 0;
		int threads = moet_upload_default_threads();
		if (!(rc = moet_bench_h2d_GBps(&h2d)) &&
		    !(rc = source_ceiling(o->model_dir, threads, (size_t)16 << 30, &src))) {
			moet_bench_add_ceiling(rec, "h2d_GBps", h2d, "GB/s");
			moet_bench_add_ceiling(rec, "source_read_GBps", src, "GB/s");
			fprintf(out, "ceilings: host-to-device %.1f GB/s (pinned), source read %.1f GB/s "
				"(%d threads)\n", h2d, src, threads);
		}
	}
	if (!rc && o->cpu_read) {
		/* the cost model's cpu_read_gbps: the same read with the CPU tier's team */
		double src = 0;
		const int threads = moet_bench_e2e_tier_threads(o->device);
		if (!(rc = source_ceiling(o->model_dir, threads, (size_t)16 << 30, &src)) &&
		    !(rc = moet_bench_add_ceiling(rec, "cpu_source_read_GBps", src, "GB/s"))) {
			json_t *cj = json_object_get(json_object_get(rec, "ceilings"),
						     "cpu_source_read_GBps");
			json_object_set_new(cj, "threads", json_integer(threads));
			fprintf(out, "ceilings: source read with the CPU tier's %d threads "
				"%.1f GB/s\n", threads, src);
		}
	}
	if (!rc && o->dense_hw)
		json_object_set_new(rec, "dense_hardware",
				    json_pack("{s:s, s:o}", "name", o->dense_hw->name, "file",
					      o->dense_hw_file ? json_string(o->dense_hw_file)
							       : json_null()));
	fprintf(out, "%-7s %-9s %6s %11s %10s %10s %10s %10s %10s\n", "mode", "what", "tokens",
		"median_ms", "tok/s", "cpu_ms", "wait_ms", "pcie_ms", "bound_ms");
	route_rec rrec = { 0 };
	int profiled = 0; /* routing does not depend on the placement: the first mode's steps */
	int gset = 0;     /* --graph: the switches set for the gpu mode (graph_env_set) */
	for (int mode = 0; !rc && mode < 3; mode++) {
		if (!(o->modes & (1 << mode)))
			continue;
		moet_model *m = NULL;
		double ready_s = 0;
		fprintf(log, "bench e2e: %s: opening %s and placing the experts\n", mode_name[mode],
			o->model_dir);
		graph_env_undo(gset);
		gset = mode != MOET_E2E_CPU && o->graph ? graph_env_set() : 0;
		if ((rc = open_mode(o, mode, &m, &ready_s)))
			break;
		double up_b = 0, up_s = 0;
		moet_model_upload_stats(m, &up_b, &up_s);
		memset(all_s, 0, (size_t)(o->n_batches > 0 ? o->n_batches : 1) * sizeof(double));
		route_rec *rr = NULL;
		if (o->profile_out && !profiled) {
			if ((rc = moet_profile_create(moet_model_config(m), &rrec.p))) {
				moet_model_close(m);
				break;
			}
			rr = &rrec;
		}
		/* tp_ranks, tp_attention: MOET_TP's split of the dense part (moet_model.h) */
		/* the CPU tier made resident at the bind (MOET_CPU_RESIDENT), inside ready_s */
		moet_resident_report res;
		moet_model_resident_report(m, &res);
		json_object_set_new(ready, mode_name[mode],
				    json_pack("{s:f, s:f, s:f, s:f, s:i, s:i, s:f, s:f, s:i}",
					      "ready_s", ready_s, "upload_bytes", up_b, "upload_s",
					      up_s, "upload_GBps", up_s > 0 ? up_b / up_s / 1e9 : 0.0,
					      "tp_ranks", moet_model_tp_ranks(m, NULL), "tp_attention",
					      moet_model_tp_attention(m), "cpu_resident_bytes",
					      (double)res.populated_bytes, "cpu_resident_s",
					      (double)res.populate_ns / 1e9, "cpu_locked", res.locked));
		fprintf(out, "%-7s %-9s %6s %11.1f   upload %.2f GB in %.2f s = %.1f GB/s",
			mode_name[mode], "ready", "-", 1e3 * ready_s, up_b / 1e9, up_s,
			up_s > 0 ? up_b / up_s / 1e9 : 0.0);
		if (res.populated_bytes)
			fprintf(out, "; CPU tier resident %.2f GB in %.2f s%s", res.populated_bytes / 1e9,
				(double)res.populate_ns / 1e9, res.locked ? ", locked" : "");
		fputc('\n', out);
		for (int bi = 0; !rc && !o->ram_only && bi < o->n_batches; bi++) {
			const int64_t B = o->batches[bi];
			step_split sp = { 0 };
			route_rec brec = { rr ? rr->p : NULL, NULL, 0 };
			if (mode == MOET_E2E_GPU && o->dense_hw &&
			    (rc = moet_profile_create(moet_model_config(m), &brec.batch)))
				break;
			/* NOTE: under MOET_MICROBATCH=auto (unset) a hybrid or cpu mode's first
			 * passes of a batch size try both forms (and under MOET_STAGE_BALANCE=auto
			 * three link prices in each: moet_model_trial_passes); the step reported
			 * is the engine's choice, so they are warm-up (timed, they were a quarter of 8
			 * steps: record 2026-11-30-e2e-deep-h200-63334dc.txt) */
			const char *mbv = getenv("MOET_MICROBATCH");
			const int trials = mode != MOET_E2E_GPU ? moet_model_trial_passes(m) : 0;
			const int warm = o->warmup < trials ? trials : o->warmup;
			tape.play = 0;
			rc = decode_run(m, B, o->ctx, warm, o->steps, samples, &sp,
					brec.p || brec.batch ? &brec : NULL, &tape);
			sp.warmup = warm;
			double expert_ms = 0;
			if (!rc && brec.batch)
				rc = batch_expert_ms(o, m, brec.batch, B, &expert_ms);
			moet_profile_free(brec.batch);
			if (rc)
				break;
			if (o->op_times) {
				fprintf(out, "op times, %s decode at batch %lld, per step (each op waited "
					"for: serialized):\n", mode_name[mode], (long long)B);
				moet_model_op_times(m, o->steps, out, 1);
			}
			moet_bench_row r = { .tokens = B, .ceiling = "" };
			char name[32];
			snprintf(name, sizeof(name), "decode-%s", mode_name[mode]);
			r.name = name;
			r.mean_s = moet_bench_mean(samples, o->steps);
			moet_bench_stats_of(samples, o->steps, &r.st);
			sp.step_s = r.st.median_s;
			sp.mean_s = r.mean_s;
			all_s[bi] = sp.step_s;
			double bound = 0;
			json_t *sj = split_json(mode_name[mode], B, &sp);
			if (mode == MOET_E2E_GPU && o->dense_hw) {
				json_object_set_new(sj, "gpu_expert_ms", json_real(expert_ms));
				json_object_set_new(sj, "dense_ms", json_real(1e3 * sp.step_s -
									      expert_ms));
			}
			if (mode != MOET_E2E_GPU && o->overlap_check && sp.cpu_pairs > 0) {
				/* the serial reference run, one pass (no micro-batches): Tc alone, Tg =
				 * the rest; then overlapped in one pass, to show what the
				 * micro-batches add. NOTE: both after the row's own untimed steps
				 * (warm), so that they time the same decode positions, whose tokens
				 * (greedy from the same prompts) route alike: with --warmup's 1 against
				 * the row's 6 trial passes the CPU tier had other experts to compute
				 * (H200, 2026-12-01: 16.9 CPU pairs per step in Tc against 19.3 in the
				 * row it bounds) */
				double *ser = malloc((size_t)o->steps * sizeof(double));
				step_split ss = { 0 }, s1 = { 0 };
				/* the caller's MOET_MICROBATCH, put back for the next batch (a
				 * value this long is refused by the engine whole or cut) */
				char mb_user[64];
				const int had_mb = mbv != NULL;
				snprintf(mb_user, sizeof(mb_user), "%s", mbv ? mbv : "");
				setenv("MOET_MICROBATCH", "0", 1);
				rc = ser ? decode_run(m, B, o->ctx, warm, o->steps, ser, &s1, NULL,
						      NULL)
					 : moet_err(MOET_ENOMEM, "samples");
				if (!rc) {
					moet_bench_stats one;
					moet_bench_stats_of(ser, o->steps, &one);
					json_t *op = json_pack(
						"{s:f, s:f, s:f, s:f, s:f}", "one_pass_step_s",
						one.median_s, "one_pass_cpu_wait_s", s1.wait_s,
						"one_pass_cpu_run_s", s1.cpu_run_s,
						"one_pass_cpu_start_lag_s", s1.cpu_start_s,
						"one_pass_cpu_wake_lag_s", s1.cpu_wake_s);
					json_object_update(sj, op);
					json_decref(op);
					rc = moet_model_set_hybrid_overlap(m, 0);
				}
				/* NOTE: at the row's price arm step by step (under
				 * MOET_STAGE_BALANCE=auto): the arms split the cold experts
				 * between the CPU tier and the link, and the row's running means
				 * mix them (on the H200, 2026-12-02: a row's steps at prices 1
				 * and 2, 4.8 pairs a step staged, its serial run at 2 alone, 2.1
				 * staged: Tc and Tg of another split) */
				tape.play = 1;
				if (!rc)
					rc = decode_run(m, B, o->ctx, warm, o->steps, ser, &ss, NULL,
							&tape);
				if (had_mb)
					setenv("MOET_MICROBATCH", mb_user, 1);
				else
					unsetenv("MOET_MICROBATCH");
				int r2 = moet_model_set_hybrid_overlap(m, 1);
				if (!rc)
					rc = r2;
				moet_bench_stats st;
				if (!rc && ss.cpu_pairs) {
					moet_bench_stats_of(ser, o->steps, &st);
					double tc = ss.cpu_s, tg = st.median_s - ss.cpu_s;
					double hi = tc > tg ? tc : tg, lo = tc > tg ? tg : tc;
					bound = hi + 0.15 * lo;
					json_object_set_new(sj, "serial_step_s", json_real(st.median_s));
					json_object_set_new(sj, "tc_s", json_real(tc));
					json_object_set_new(sj, "tg_s", json_real(tg));
					json_object_set_new(sj, "tc_tg_ratio", json_real(tg > 0 ? tc / tg : 0));
					/* the tier alone: its calls, their weights, and the rate at
					 * which it went through them (hardware-out's cpu_read_gbps) */
					json_object_set_new(sj, "tc_cpu_run_s", json_real(ss.cpu_run_s));
					json_object_set_new(sj, "tc_cpu_calls", json_real(ss.cpu_calls));
					json_object_set_new(sj, "tc_cpu_pairs", json_real(ss.cpu_pairs));
					json_object_set_new(sj, "tc_staged_pairs",
							    json_real(ss.staged_pairs));
					json_object_set_new(sj, "tc_stage_bytes",
							    json_real(ss.stage_bytes));
					json_object_set_new(sj, "tc_stage_link_s",
							    json_real(ss.stage_link_s));
					json_object_set_new(sj, "tc_price_share",
							    json_pack("[f, f, f]", ss.price_share[0],
								      ss.price_share[1],
								      ss.price_share[2]));
					json_object_set_new(sj, "tc_cpu_layer_calls",
							    json_real(ss.cpu_layers));
					json_object_set_new(sj, "tc_cpu_weight_bytes",
							    json_real(ss.cpu_bytes));
					json_object_set_new(sj, "tc_read_GBps",
							    json_real(tc > 0 ? ss.cpu_bytes / tc / 1e9
									     : 0));
					json_object_set_new(sj, "overlap_bound_s", json_real(bound));
					json_object_set_new(sj, "step_over_bound",
							    json_real(sp.step_s / bound));
				}
				free(ser);
			}
			json_array_append_new(steps_arr, sj);
			if (!rc)
				rc = moet_bench_add_row(rec, &r);
			fprintf(out, "%-7s %-9s %6lld %11.3f %10.1f %10.3f %10.3f %10.3f", mode_name[mode],
				"decode", (long long)B, 1e3 * sp.step_s, (double)B / sp.step_s,
				1e3 * sp.cpu_s, 1e3 * sp.wait_s, 1e3 * sp.pcie_s);
			if (bound > 0)
				fprintf(out, " %10.3f", 1e3 * bound);
			/* the device's idle time per step, then the throughput's step (the mean),
			 * last: tests/gpu/ram_budget.sh reads it */
			fprintf(out, "   GPU idle %.3f ms (routing %.3f)   mean step %.3f ms = %.1f "
				"tok/s\n", 1e3 * sp.gpu_idle_s, 1e3 * sp.gpu_idle_route_s,
				1e3 * r.mean_s, (double)B / r.mean_s);
			fflush(out);
			if (!rc && mode != MOET_E2E_CPU && o->graph)
				rc = graph_row(o, m, mode, B, samples, rec, steps_arr, out);
		}
		/* the NVMe tier under RAM budgets (CPU-tier experts read from disk into slots) */
		for (int ri = 0; mode != MOET_E2E_GPU && !rc && ri < o->n_ram; ri++) {
			if ((rc = o->apply_ram(m, o->ram_budgets[ri])))
				break;
			for (int bi = 0; !rc && bi < o->n_batches; bi++) {
				const int64_t B = o->batches[bi];
				step_split sp = { 0 };
				if ((rc = decode_run(m, B, o->ctx, o->warmup, o->steps, samples,
						     &sp, NULL, NULL)))
					break;
				char name[48];
				snprintf(name, sizeof(name), "decode-%s-ram%s", mode_name[mode],
					 o->ram_budgets[ri]);
				moet_bench_row r = { .name = name, .tokens = B, .ceiling = "" };
				r.mean_s = moet_bench_mean(samples, o->steps);
				moet_bench_stats_of(samples, o->steps, &r.st);
				rc = moet_bench_add_row(rec, &r);
				moet_xtier_stats ts;
				ram_bound rb;
				/* NOTE: a refused bound (ENOMEM) leaves the bounds out, not the
				 * run */
				moet_xtier_stats_bounds(moet_model_xtier(m), &ts);
				ram_bound_of(&ts, o->steps, all_s[bi], r.st.median_s, &rb);
				json_t *ra = json_object_get(rec, "ram");
				if (!rc && !ra && (ra = json_array()))
					json_object_set_new(rec, "ram", ra);
				if (!rc && (!ra || json_array_append_new(ra, ram_json(
						&ts, &rb, mode_name[mode], o->ram_budgets[ri], B,
						r.st.median_s, r.mean_s))))
					rc = moet_err(MOET_ENOMEM, "bench e2e: RAM-budget record");
				/* NOTE: the mean too: a slow disk makes a few steps wait long,
				 * which the median hides and the throughput does not */
				fprintf(out, "%-7s %-9s %6lld %11.3f %10.1f   RAM budget %s; mean step "
					"%.3f ms = %.1f tok/s\n", mode_name[mode], "decode",
					(long long)B, 1e3 * r.st.median_s, (double)B / r.st.median_s,
					o->ram_budgets[ri], 1e3 * r.mean_s, (double)B / r.mean_s);
				if (o->report_ram)
					o->report_ram(m, out);
				ram_bound_print(out, &ts, &rb, r.st.median_s);
			}
			int r0 = moet_model_set_ram_budget(m, 0, NULL);
			if (!rc)
				rc = r0;
		}
		for (int pi = 0; !rc && pi < o->n_prefills; pi++) {
			const int64_t P = o->prefills[pi];
			double t = 0;
			moet_hybrid_stats z;
			moet_model_hybrid_stats(m, &z, 1);
			if (o->op_times)
				moet_model_op_times(m, 1, NULL, 1);
			if ((rc = prefill_run(m, P, &t)))
				break;
			if (o->op_times) {
				fprintf(out, "op times, %s prefill of %lld tokens (each op waited for: "
					"serialized):\n", mode_name[mode], (long long)P);
				moet_model_op_times(m, 1, out, 1);
			}
			moet_hybrid_stats hs;
			moet_model_hybrid_stats(m, &hs, 1);
			char name[32];
			snprintf(name, sizeof(name), "prefill-%s", mode_name[mode]);
			moet_bench_row r = { .name = name, .tokens = P, .ceiling = "" };
			r.st = (moet_bench_stats){ t, t, t, 1 };
			rc = moet_bench_add_row(rec, &r);
			fprintf(out, "%-7s %-9s %6lld %11.3f %10.1f %10.3f %10.3f %10.3f   staged %llu "
				"experts (%llu pairs, %.1f MB, %.3f ms: copies %.3f, GPU waits %.3f), rows "
				"down %.1f MB\n",
				mode_name[mode], "prefill", (long long)P, 1e3 * t, (double)P / t,
				(double)hs.ns_cpu / 1e6, (double)hs.ns_wait / 1e6,
				(double)(hs.ns_d2h + hs.ns_h2d) / 1e6,
				(unsigned long long)hs.staged_experts,
				(unsigned long long)hs.staged_pairs, (double)hs.bytes_staged / 1e6,
				(double)hs.ns_stage / 1e6, (double)hs.ns_stage_copy / 1e6,
				(double)hs.ns_stage_wait / 1e6, (double)hs.bytes_d2h / 1e6);
			/* the staging of cold experts (MOET_PREFILL_STAGE) and the rows moved */
			json_t *pf = json_object_get(rec, "prefills");
			if (!pf && (pf = json_array()))
				json_object_set_new(rec, "prefills", pf);
			json_t *pj = json_pack("{s:s, s:I, s:f, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:I}",
					       "mode", mode_name[mode], "tokens", (json_int_t)P,
					       "prefill_s", t, "cpu_pairs", (json_int_t)hs.cpu_pairs,
					       "staged_experts", (json_int_t)hs.staged_experts,
					       "staged_pairs", (json_int_t)hs.staged_pairs,
					       "staged_bytes", (json_int_t)hs.bytes_staged,
					       "stage_s", (double)hs.ns_stage / 1e9,
					       "stage_copy_s", (double)hs.ns_stage_copy / 1e9,
					       "stage_wait_s", (double)hs.ns_stage_wait / 1e9,
					       "d2h_bytes", (json_int_t)hs.bytes_d2h,
					       "d2h_copies", (json_int_t)hs.d2h_copies);
			if (!pf)
				json_decref(pj);
			if ((!pf || !pj || json_array_append_new(pf, pj)) && !rc)
				rc = moet_err(MOET_ENOMEM, "bench e2e: prefill record");
			fflush(out);
		}
		if (rr && !rc) {
			char line[160];
			snprintf(line, sizeof(line), "bench e2e decode steps (%s mode): %d per batch, "
				 "ctx %d", mode_name[mode], o->steps, o->ctx);
			if (!(rc = moet_profile_add_run(rrec.p, line)))
				rc = moet_profile_save(rrec.p, o->profile_out);
			profiled = 1;
		}
		moet_model_close(m);
	}
	graph_env_undo(gset);
	moet_profile_free(rrec.p);
	free(samples);
	free(all_s);
	free(tape.arm);
	return rc;
}
