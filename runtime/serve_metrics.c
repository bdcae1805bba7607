/*
 * serve_metrics.c: /metrics in Prometheus' text format (version 0.0.4).
 *
 * Gauges of the moment (queue, running, batch, KV) and counters since start (tokens,
 * requests, steps, seconds, routing pairs per tier, the hybrid engine's CPU-tier time and
 * copies). NOTE: the device tiers' expert time is not reported by the engine yet: that
 * counter is exported and stays 0, and its HELP says so, so dashboards need no change later.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "serve_int.h"

typedef struct out {
	char *buf;
	size_t len, cap;
	int bad;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->bad = 1;
			return;
		}
		if ((size_t)n < o->cap - o->len) {
			o->len += (size_t)n;
			return;
		}
		char *b = realloc(o->buf, 2 * o->cap);
		if (!b) {
			o->bad = 1;
			return;
		}
		o->buf = b;
		o->cap *= 2;
	}
}

static void metric(out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *serve_metrics_text(const moet_sched_stats *st, uint64_t http_requests,
			 uint64_t http_errors)
{
	out o = { .buf = malloc(4096), .cap = 4096 };
	if (!o.buf)
		return NULL;
	o.buf[0] = 0;
	metric(&o, "moet_tokens_per_second", "gauge",
	       "Generated tokens per second over the last few seconds (all requests).");
	put(&o, "moet_tokens_per_second %.3f\n", st->tokens_per_s);
	metric(&o, "moet_generated_tokens_total", "counter", "Tokens generated.");
	put(&o, "moet_generated_tokens_total %llu\n", (unsigned long long)st->tokens_generated);
	metric(&o, "moet_prompt_tokens_total", "counter", "Prompt tokens run through the model.");
	put(&o, "moet_prompt_tokens_total %llu\n", (unsigned long long)st->tokens_prefilled);
	metric(&o, "moet_queue_depth", "gauge", "Requests waiting for admission (KV budget).");
	put(&o, "moet_queue_depth %d\n", st->queued);
	metric(&o, "moet_requests_running", "gauge", "Requests admitted and running.");
	put(&o, "moet_requests_running %d\n", st->running);
	metric(&o, "moet_batch_sequences", "gauge", "Sequences in the last forward step.");
	put(&o, "moet_batch_sequences %d\n", st->last_batch_seqs);
	metric(&o, "moet_batch_tokens", "gauge",
	       "Tokens in the last forward step (decodes + prefill chunks).");
	put(&o, "moet_batch_tokens %lld\n", (long long)st->last_batch_tokens);
	metric(&o, "moet_kv_tokens_budget", "gauge",
	       "KV positions for all sequences (--kv-tokens, whole blocks).");
	put(&o, "moet_kv_tokens_budget %lld\n", (long long)st->kv_tokens);
	metric(&o, "moet_kv_tokens_reserved", "gauge",
	       "KV positions reserved by running requests (prompt + max_tokens each, in blocks).");
	put(&o, "moet_kv_tokens_reserved %lld\n", (long long)st->kv_reserved);
	metric(&o, "moet_kv_slots_in_use", "gauge",
	       "KV caches held by running requests (equals moet_requests_running).");
	put(&o, "moet_kv_slots_in_use %d\n", st->kv_in_use);
	metric(&o, "moet_kv_blocks", "gauge", "KV blocks of the pool (used + free = all).");
	put(&o, "moet_kv_blocks{state=\"used\"} %lld\n", (long long)st->kv_blocks_used);
	put(&o, "moet_kv_blocks{state=\"free\"} %lld\n", (long long)st->kv_blocks_free);
	metric(&o, "moet_kv_blocks_reserved", "gauge",
	       "KV blocks running requests may take (used ones included).");
	put(&o, "moet_kv_blocks_reserved %lld\n", (long long)st->kv_blocks_reserved);
	metric(&o, "moet_kv_block_tokens", "gauge", "Positions per KV block.");
	put(&o, "moet_kv_block_tokens %lld\n", (long long)st->kv_block);
	metric(&o, "moet_requests_total", "counter", "Finished requests by result.");
	put(&o, "moet_requests_total{result=\"completed\"} %llu\n",
	    (unsigned long long)st->requests_done);
	put(&o, "moet_requests_total{result=\"cancelled\"} %llu\n",
	    (unsigned long long)st->requests_cancelled);
	put(&o, "moet_requests_total{result=\"failed\"} %llu\n",
	    (unsigned long long)st->requests_failed);
	metric(&o, "moet_http_requests_total", "counter", "HTTP requests answered.");
	put(&o, "moet_http_requests_total %llu\n", (unsigned long long)http_requests);
	metric(&o, "moet_http_errors_total", "counter", "HTTP requests answered 4xx or 5xx.");
	put(&o, "moet_http_errors_total %llu\n", (unsigned long long)http_errors);
	metric(&o, "moet_steps_total", "counter", "Engine steps (one forward call each).");
	put(&o, "moet_steps_total %llu\n", (unsigned long long)st->steps);
	metric(&o, "moet_step_seconds_total", "counter",
	       "Engine seconds in steps: forward + scheduling + sampling + detokenization.");
	put(&o, "moet_step_seconds_total %.6f\n", st->step_s);
	metric(&o, "moet_forward_seconds_total", "counter",
	       "Engine seconds inside the model's forward pass.");
	put(&o, "moet_forward_seconds_total %.6f\n", st->forward_s);
	metric(&o, "moet_expert_pairs_total", "counter",
	       "Routing pairs (token, expert) served per tier since the placement was set "
	       "(tier cpu, or gpuN: device N of the placement).");
	uint64_t all = 0, gpu = 0;
	for (int t = 0; t < st->n_tiers; t++) {
		all += st->tier_pairs[t];
		gpu += t ? st->tier_pairs[t] : 0;
		if (t == 0)
			put(&o, "moet_expert_pairs_total{tier=\"cpu\"} %llu\n",
			    (unsigned long long)st->tier_pairs[0]);
		else
			put(&o, "moet_expert_pairs_total{tier=\"gpu%d\"} %llu\n", t - 1,
			    (unsigned long long)st->tier_pairs[t]);
	}
	metric(&o, "moet_gpu_hit_rate", "gauge",
	       "Share of routing pairs served by GPU tiers (0 without a placement).");
	put(&o, "moet_gpu_hit_rate %.6f\n", all ? (double)gpu / (double)all : 0.0);
	metric(&o, "moet_expert_seconds_total", "counter",
	       "Expert time per tier: cpu from the hybrid engine's CPU tier (submit to done); "
	       "the gpu tier stays 0 until the hybrid engine reports device expert time.");
	put(&o, "moet_expert_seconds_total{tier=\"cpu\"} %.6f\n",
	    (double)st->hybrid.ns_cpu * 1e-9);
	put(&o, "moet_expert_seconds_total{tier=\"gpu\"} 0\n");
	metric(&o, "moet_pcie_bytes_total", "counter",
	       "Bytes copied between device and host for the CPU tier (hidden rows d2h, expert "
	       "outputs h2d), as the hybrid engine reports them; 0 until it does (CPU backend: "
	       "host copies).");
	put(&o, "moet_pcie_bytes_total{direction=\"d2h\"} %llu\n",
	    (unsigned long long)st->hybrid.bytes_d2h);
	put(&o, "moet_pcie_bytes_total{direction=\"h2d\"} %llu\n",
	    (unsigned long long)st->hybrid.bytes_h2d);
	const moet_resident_report *rr = &st->resident;
	metric(&o, "moet_cpu_tier_resident_bytes", "gauge",
	       "CPU-tier expert bytes read in and mapped at the placement's bind "
	       "(MOET_CPU_RESIDENT; 0 with off or without a CPU tier).");
	put(&o, "moet_cpu_tier_resident_bytes %llu\n", (unsigned long long)rr->populated_bytes);
	metric(&o, "moet_cpu_tier_locked", "gauge",
	       "1 when the CPU tier's experts are mlock'd (MOET_CPU_RESIDENT=lock), else 0.");
	put(&o, "moet_cpu_tier_locked %d\n", rr->locked);
	metric(&o, "moet_cpu_tier_resident_share", "gauge",
	       "Share of the CPU tier's pages in memory at the last check (a sample: one page in "
	       "4096 of each tensor, at least one, every 60 s; 1 before the first check or without "
	       "a resident set).");
	put(&o, "moet_cpu_tier_resident_share %.6f\n",
	    rr->pages_checked ? (double)rr->pages_resident / (double)rr->pages_checked : 1.0);
	metric(&o, "moet_cpu_tier_evicted_tensors", "gauge",
	       "CPU-tier expert tensors with a checked page not in memory at the last check.");
	put(&o, "moet_cpu_tier_evicted_tensors %llu\n", (unsigned long long)rr->evicted_ranges);
	metric(&o, "moet_shadow_checks_total", "counter",
	       "CPU-tier expert calls recomputed by the backend and compared (serve --shadow).");
	put(&o, "moet_shadow_checks_total %llu\n", (unsigned long long)st->shadow.checks);
	metric(&o, "moet_shadow_mismatches_total", "counter",
	       "Shadow checks whose bits differed from the CPU tier's (0 under the contract).");
	put(&o, "moet_shadow_mismatches_total %llu\n", (unsigned long long)st->shadow.mismatches);
	if (o.bad) {
		free(o.buf);
		return NULL;
	}
	return o.buf;
}
