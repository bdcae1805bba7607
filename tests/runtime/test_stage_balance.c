/*
 * test_stage_balance.c: decode staging by balance (MOET_STAGE_BALANCE=1, runtime/hybrid.c),
 * on the CPU backend with simulated devices (the test double: a staged expert's copy is a
 * memcpy into a slot of host memory, its kernel the backend's own).
 *
 * 1. The pick (moet_hybrid_stage_pick) against brute force: for random calls of up to 10 cold
 *    experts (rows 1..40, and calls of equal rows, as a decode batch's) and a random floor
 *    (the GPU's own work of the layer), the pick's split is never longer than staging none,
 *    it stages nothing where the floor is the longer anyway, it stages a prefix of the
 *    experts ordered by rows, no prefix is shorter, and with equal rows no subset at all is
 *    shorter; none as short stages fewer (moet_hybrid_stage_split_ms prices each).
 * 2. The model: a prompt and batch-4 decode steps under two placements (all-CPU; CPU + one
 *    device) with the balance on and three hardware files: a CPU far slower than the link
 *    (every cold expert staged), far faster (none staged), and about even (some of each):
 *    logits memcmp-equal to the run without a placement, and the counters: staged and CPU-tier
 *    pairs add up to the cold pairs the route observer saw; the ranges to page-lock
 *    (stage_lock.c) against the placement: every CPU-side expert's bytes in them, a GPU
 *    expert's only on shared boundary pages, whole pages of one shard each, less than the
 *    shards; with MOET_STAGE_REGISTER=all every shard whole; none left once the NVMe tier
 *    is attached (a RAM budget).
 * 3. MOET_STAGE_BALANCE=2 and MOET_STAGE_REGISTER=yes are refused, naming the variable.
 * Part 2 runs again on GPU 0 where one is present (tests/gpu/run.sh runs this program too),
 * with MOET_STAGE_REGISTER=0 (copies from the pageable mapping) and with the default, where
 * the ranges must be page-locked with the placement and unlocked with it.
 */
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_int.h"
#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define NB 4     /* sequences */
#define NP 12    /* prompt tokens of each */
#define ND 3     /* decode steps */
#define MAX_E 64

/* Where the test is, for the watchdog: its first GPU run was killed by run.sh's timeout with
 * nothing printed (2026-12-01; the next, with these steps, stopped at the first page-locked
 * placement: the shards were mapped private then, test_ckpt now checks they are shared), so
 * a run that hangs says where, with the main thread's frames. */
static char where[160] = "start";
static unsigned watch_s = 120; /* MOET_TEST_WATCHDOG_S */

static void watchdog(int sig)
{
	(void)sig;
	static const char pre[] = "test_stage_balance: no progress, stuck at: ";
	void *frames[48];
	(void)!write(2, pre, sizeof(pre) - 1);
	(void)!write(2, where, strnlen(where, sizeof(where)));
	(void)!write(2, "\n", 1);
	backtrace_symbols_fd(frames, backtrace(frames, 48), 2); /* the main thread's */
	_exit(1);
}

/* A new step: printed (line-buffered), and the watchdog rearmed. */
static void step(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(where, sizeof(where), fmt, ap);
	va_end(ap);
	printf("... %s\n", where);
	alarm(watch_s);
}

typedef struct cold {
	const int16_t *own;
	int64_t E;
	uint64_t pairs; /* routed pairs whose expert is on the CPU side */
} cold;

static void observe(void *ctx, const moet_route_event *ev)
{
	cold *c = ctx;
	for (int64_t i = 0; c->own && i < ev->top_k; i++)
		c->pairs += c->own[ev->layer * c->E + ev->ids[i]] < 0;
}

/* NB prompts of NP tokens (one batch), then ND decode steps of the batch: every step's last
 * logits into out (NB x V each). */
static void run(moet_model *m, float *out, int64_t V)
{
	moet_kv *kv[NB];
	int64_t tok[NB][NP + ND];
	moet_seq_step st[NB];
	for (int s = 0; s < NB; s++) {
		CHECK(moet_kv_create(m, NP + ND + 1, &kv[s]) == 0, "kv");
		for (int i = 0; i < NP + ND; i++)
			tok[s][i] = (i * 31 + s * 7 + 3) % V;
	}
	for (int d = 0; d <= ND; d++) {
		for (int s = 0; s < NB; s++)
			st[s] = (moet_seq_step){ .kv = kv[s], .tokens = d ? &tok[s][NP + d - 1]
									  : tok[s],
						 .n_tok = d ? 1 : NP,
						 .out_logits = out + ((int64_t)d * NB + s) * V,
						 .last_only = 1 };
		CHECK(moet_model_forward_batch(m, st, NB) == 0, "step %d: %s", d, moet_errmsg());
	}
	for (int s = 0; s < NB; s++)
		moet_kv_destroy(kv[s]);
}

static uint64_t xs(uint64_t *x)
{
	return moet_test_xorshift64(x);
}

/* The experts staged by the pick over a fixed sequence of calls (no floor), one count per
 * call into cnt (PRICE_CALLS). */
#define PRICE_CALLS 200
static void pick_counts(moet_hybrid *hy, int *cnt)
{
	uint64_t rng = 0x9E3779B97F4A7C15ull;
	int64_t rows[10], scratch[20];
	uint8_t pick[10];
	for (int it = 0; it < PRICE_CALLS; it++) {
		const int n = 1 + (int)(xs(&rng) % 10);
		for (int i = 0; i < n; i++)
			rows[i] = 1 + (int64_t)(xs(&rng) % 40);
		moet_hybrid_stage_pick(hy, rows, n, 0, scratch, pick);
		cnt[it] = 0;
		for (int i = 0; i < n; i++)
			cnt[it] += pick[i];
	}
}

/* Part 1: the pick against brute force, on the engine of a placement set with the default
 * (H200) figures. */
static void pick_checks(moet_hybrid *hy)
{
	uint64_t rng = 0x2545F4914F6CDD1Dull;
	int64_t rows[10], scratch[20];
	uint8_t pick[10], sub[10];
	int staged_some = 0, staged_none = 0, floored = 0;
	for (int it = 0; it < 600; it++) {
		const int n = 1 + (int)(xs(&rng) % 10), equal = it % 2;
		const int64_t r0 = 1 + (int64_t)(xs(&rng) % 40);
		for (int i = 0; i < n; i++)
			rows[i] = equal ? r0 : 1 + (int64_t)(xs(&rng) % 40);
		/* the GPU's own work: none, or some share of the CPU tier's whole call */
		memset(sub, 0, sizeof(sub));
		const double none = moet_hybrid_stage_split_ms(hy, rows, n, sub, 0);
		const double floor_ms = it % 3 == 0 ? 0 : none * (double)(xs(&rng) % 120) / 100;
		moet_hybrid_stage_pick(hy, rows, n, floor_ms, scratch, pick);
		const double got = moet_hybrid_stage_split_ms(hy, rows, n, pick, floor_ms);
		CHECK(got <= (none > floor_ms ? none : floor_ms),
		      "call %d: the pick's split %.6f ms is longer than staging none (%.6f)", it, got,
		      none);
		int n_pick = 0;
		for (int i = 0; i < n; i++)
			n_pick += pick[i];
		staged_some += n_pick > 0;
		staged_none += n_pick == 0;
		/* nothing staged where the GPU's own work is the longer anyway */
		if (none <= floor_ms) {
			CHECK(n_pick == 0, "call %d: %d staged under a floor of %.6f ms (CPU %.6f)", it,
			      n_pick, floor_ms, none);
			floored++;
		}
		/* a prefix by rows: every staged expert has at least the rows of every CPU one */
		for (int i = 0; i < n; i++)
			for (int j = 0; j < n; j++)
				CHECK(!(pick[i] && !pick[j] && rows[i] < rows[j]),
				      "call %d: expert %d (%lld rows) staged, %d (%lld rows) not", it, i,
				      (long long)rows[i], j, (long long)rows[j]);
		/* brute force: every prefix (equal rows: every subset) is no shorter, and one as
		 * short stages no fewer experts (none on a tie) */
		for (uint32_t mask = 0; mask < (1u << n); mask++) {
			int pref = 1, cnt = 0;
			for (int i = 0; i < n; i++)
				cnt += sub[i] = (uint8_t)((mask >> i) & 1u);
			for (int i = 0; i < n && pref; i++)
				for (int j = 0; j < n && pref; j++)
					pref = !(sub[i] && !sub[j] && rows[i] < rows[j]);
			if (!pref && !equal)
				continue;
			const double t = moet_hybrid_stage_split_ms(hy, rows, n, sub, floor_ms);
			CHECK(t >= got * (1 - 1e-9), "call %d (%d experts%s): split %#x takes %.6f "
			      "ms, the pick %.6f", it, n, equal ? ", equal rows" : "", mask, t, got);
			CHECK(!(t <= got * (1 + 1e-9) && t >= got * (1 - 1e-9) && cnt < n_pick &&
				(pref || equal)),
			      "call %d: split %#x as short as the pick with fewer staged (%d < %d)", it,
			      mask, cnt, n_pick);
		}
	}
	CHECK(staged_some > 0 && staged_none > 0 && floored > 0,
	      "calls with and without staging: %d, %d; %d under the floor", staged_some,
	      staged_none, floored);
	printf("pick: 600 calls, %d staged some, %d none (%d under the GPU's floor); none "
	       "shorter by brute force\n", staged_some, staged_none, floored);
}

/* Bytes of [p, p + n) inside the locked ranges (disjoint). */
static size_t covered(const moet_model *m, uintptr_t p, size_t n)
{
	size_t got = 0;
	for (int i = 0; i < m->n_stage_lock; i++) {
		const uintptr_t lo = (uintptr_t)m->stage_lock[i].p, hi = lo + m->stage_lock[i].bytes;
		const uintptr_t a = p > lo ? p : lo, b = p + n < hi ? p + n : hi;
		got += b > a ? b - a : 0;
	}
	return got;
}

/* What the balance page-locked (stage_lock.c) against the placement, read here from the
 * experts' views and the shards: with MOET_STAGE_REGISTER=cold (reg) every CPU-side expert's
 * bytes (weights and block scales) lie in the ranges, a GPU expert's only on the pages it
 * shares with them; the ranges page-aligned, disjoint, each inside one shard's mapping;
 * locked on CUDA only; none with MOET_STAGE_REGISTER=0. *locked / *all: the bytes locked and
 * the shards' bytes. */
static void lock_checks(const moet_model *m, const int16_t *own, int cuda, int reg,
			const char *what, size_t *locked, size_t *all)
{
	const int64_t L = m->cfg.num_hidden_layers, E = m->cfg.n_routed_experts;
	const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	CHECK(m->n_stage_locked == (cuda && reg ? m->n_stage_lock : 0), "%s: %d of %d ranges "
	      "locked", what, m->n_stage_locked, m->n_stage_lock);
	CHECK(reg ? m->n_stage_lock > 0 : m->n_stage_lock == 0, "%s: %d ranges", what,
	      m->n_stage_lock);
	*locked = *all = 0;
	for (int s = 0; s < moet_ckpt_shard_count(m->ck); s++)
		*all += moet_ckpt_shard_bytes(m->ck, s);
	for (int i = 0; i < m->n_stage_lock; i++) {
		const uintptr_t p = (uintptr_t)m->stage_lock[i].p;
		const size_t n = m->stage_lock[i].bytes;
		int in = 0;
		for (int s = 0; s < moet_ckpt_shard_count(m->ck); s++) {
			const uintptr_t b = (uintptr_t)moet_ckpt_shard_base(m->ck, s);
			const size_t sb = (moet_ckpt_shard_bytes(m->ck, s) + pg - 1) & ~(pg - 1);
			in += b && p >= b && p + n <= b + sb;
		}
		CHECK(p % pg == 0 && n % pg == 0 && n > 0 && in == 1, "%s: range %d (%#lx, %zu "
		      "bytes) not whole pages of one shard", what, i, (unsigned long)p, n);
		for (int j = 0; j < i; j++) {
			const uintptr_t q = (uintptr_t)m->stage_lock[j].p;
			CHECK(q + m->stage_lock[j].bytes <= p || p + n <= q, "%s: ranges %d and %d "
			      "overlap", what, j, i);
		}
		*locked += n;
	}
	for (int64_t e = 0; reg && e < L * E; e++) {
		if (!m->layers[e / E].is_moe)
			continue;
		const moet_ffn_w *w = &m->layers[e / E].experts_host[e % E];
		const moet_mat *x[3] = { &w->gate, &w->up, &w->down };
		for (int t = 0; t < 6; t++) {
			const moet_mat *a = x[t / 2];
			const uintptr_t p = (uintptr_t)(t % 2 ? (const void *)a->scale_inv : a->data);
			const size_t n = t % 2 ? moet_mat_scale_bytes(a) : moet_mat_data_bytes(a);
			const size_t c = p && n ? covered(m, p, n) : 0;
			CHECK(own[e] < 0 ? c == n : c <= 2 * pg, "%s: layer %lld expert %lld (%s) "
			      "tensor %d: %zu of %zu bytes locked", what, (long long)(e / E),
			      (long long)(e % E), own[e] < 0 ? "CPU" : "GPU", t, c, n);
		}
	}
}

/* Part 2 on one backend: "cpu" (the simulated devices) or "cuda" (GPU 0: the cold experts'
 * pages locked, the copies DMA from them, each kernel waiting on the device). */
static void model_checks(const char *device, int reg)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 5;
	char *dir = NULL;
	step("%s: open", device);
	moet_model *m = moet_test_gen_open_on("stage-balance", &gp, device, &dir);
	if (!m) {
		free(dir);
		return;
	}
	const moet_config *c = moet_model_config(m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	CHECK(E <= MAX_E, "tiny geometry");
	const size_t n_out = (size_t)((ND + 1) * NB * V);
	float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	step("%s: the reference run", device);
	run(m, ref, V);
	const int cuda = strcmp(device, "cuda") == 0;
	if (!reg)
		setenv("MOET_STAGE_REGISTER", "0", 1); /* the copies from the pageable mapping */
	/* hardware: a CPU far slower than the link, far faster, and about even (the link's
	 * share of its rate beside the CPU tier, hybrid.c, is 0.82) */
	const char *hw_text[3] = {
		"name: slow-cpu\ncpu_read_gbps: 0.001\npcie_gbps: 1000\npcie_latency_us: 0\n",
		"name: fast-cpu\ncpu_read_gbps: 100000\npcie_gbps: 1\npcie_latency_us: 100\n",
		"name: even\ncpu_read_gbps: 1\npcie_gbps: 1.2\npcie_latency_us: 0\n" };
	const char *hw_name[3] = { "slow CPU", "fast CPU", "even" };
	char hw[3][512];
	for (int i = 0; i < 3; i++) {
		snprintf(hw[i], sizeof(hw[i]), "%s/hw%d.yaml", dir, i);
		CHECK(moet_test_write_file(hw[i], hw_text[i], strlen(hw_text[i])) == 0, "hw file");
	}
	uint64_t rng = 0x9E3779B97F4A7C15ull;
	for (int pl = 0; pl < 2; pl++) {
		for (int64_t i = 0; i < L * E; i++)
			own[i] = (int16_t)(pl == 0 || xs(&rng) % 2 ? -1 : 0);
		for (int h = 0; h < 3; h++) {
			step("%s%s placement %d, %s: set", device, reg ? "" : " (not page-locked)", pl,
			     hw_name[h]);
			setenv("MOET_STAGE_BALANCE", "1", 1);
			setenv("MOET_HARDWARE", hw[h], 1);
			int rc = moet_model_set_placement(m, own, pl);
			unsetenv("MOET_STAGE_BALANCE");
			unsetenv("MOET_HARDWARE");
			CHECK(rc == 0, "%s placement %d, %s: %s", device, pl, hw_name[h],
			      moet_errmsg());
			if (rc)
				continue;
			char what[96];
			snprintf(what, sizeof(what), "%s%s placement %d", device,
				 reg ? "" : " (not page-locked)", pl);
			size_t locked = 0, all = 0;
			lock_checks(m, own, cuda, reg, what, &locked, &all);
			CHECK(!reg || locked < all, "%s: %zu of %zu bytes locked: the dense part "
			      "too", what, locked, all);
			if (h == 0)
				printf("%s: %d ranges, %zu of the shards' %zu bytes page-locked\n",
				       what, m->n_stage_lock, locked, all);
			cold cd = { .own = own, .E = E };
			moet_model_set_route_observer(m, observe, &cd);
			moet_hybrid_stats hs;
			moet_model_hybrid_stats(m, &hs, 1);
			memset(got, 0xAB, n_out * sizeof(float));
			step("%s%s placement %d, %s: run", device, reg ? "" : " (not page-locked)", pl,
			     hw_name[h]);
			run(m, got, V);
			moet_model_set_route_observer(m, NULL, NULL);
			moet_model_hybrid_stats(m, &hs, 1);
			CHECK(memcmp(ref, got, n_out * sizeof(float)) == 0,
			      "%s placement %d, MOET_STAGE_BALANCE=1, %s: logits differ from the "
			      "run without placement", device, pl, hw_name[h]);
			CHECK(hs.staged_pairs + hs.cpu_pairs == cd.pairs,
			      "placement %d, %s: staged %llu + CPU %llu pairs, %llu cold routed", pl,
			      hw_name[h], (unsigned long long)hs.staged_pairs,
			      (unsigned long long)hs.cpu_pairs, (unsigned long long)cd.pairs);
			CHECK(cd.pairs > 0, "cold pairs routed");
			if (h == 0)
				CHECK(hs.cpu_pairs == 0, "%s: %llu pairs left on the CPU", hw_name[h],
				      (unsigned long long)hs.cpu_pairs);
			if (h == 1)
				CHECK(hs.staged_pairs == 0, "%s: %llu pairs staged", hw_name[h],
				      (unsigned long long)hs.staged_pairs);
			if (h == 2)
				CHECK(hs.staged_pairs > 0 && hs.cpu_pairs > 0,
				      "%s: staged %llu, CPU %llu pairs", hw_name[h],
				      (unsigned long long)hs.staged_pairs,
				      (unsigned long long)hs.cpu_pairs);
			/* the staged copies' own time (ns_stage_link): wherever something was
			 * staged, at a rate a link can have on a GPU (its copy stream's marks: a
			 * mark misplaced gives ~0 and a rate past any PCIe link), within the
			 * driving thread's staging on the CPU backend (host copies) */
			const double gbps = hs.ns_stage_link ? (double)hs.bytes_staged /
								       (double)hs.ns_stage_link
							     : 0;
			CHECK(hs.staged_experts
				      ? hs.ns_stage_link > 0 &&
						(cuda ? gbps < 200 : hs.ns_stage_link <= hs.ns_stage)
				      : hs.ns_stage_link == 0,
			      "%s placement %d, %s: %llu experts staged, %llu bytes, link time %llu "
			      "ns (%.1f GB/s), staging %llu ns", device, pl, hw_name[h],
			      (unsigned long long)hs.staged_experts,
			      (unsigned long long)hs.bytes_staged,
			      (unsigned long long)hs.ns_stage_link, gbps,
			      (unsigned long long)hs.ns_stage);
			printf("%-4s placement %d, %-8s: logits equal; %llu cold pairs: %llu staged "
			       "(%llu experts, %.2f GB/s over the link), %llu on the CPU tier\n",
			       device, pl, hw_name[h], (unsigned long long)cd.pairs,
			       (unsigned long long)hs.staged_pairs,
			       (unsigned long long)hs.staged_experts, gbps,
			       (unsigned long long)hs.cpu_pairs);
		}
	}
	/* MOET_STAGE_REGISTER=all: every shard whole, as first measured */
	setenv("MOET_STAGE_BALANCE", "1", 1);
	setenv("MOET_STAGE_REGISTER", "all", 1);
	CHECK(moet_model_set_placement(m, own, 1) == 0, "%s", moet_errmsg());
	unsetenv("MOET_STAGE_REGISTER");
	int whole = m->n_stage_lock == moet_ckpt_shard_count(m->ck) &&
		    m->n_stage_locked == (cuda ? m->n_stage_lock : 0);
	for (int i = 0; whole && i < m->n_stage_lock; i++)
		whole = m->stage_lock[i].p == moet_ckpt_shard_base(m->ck, i) &&
			m->stage_lock[i].bytes == moet_ckpt_shard_bytes(m->ck, i);
	CHECK(whole, "%s, MOET_STAGE_REGISTER=all: %d ranges (%d locked) for %d shards", device,
	      m->n_stage_lock, m->n_stage_locked, moet_ckpt_shard_count(m->ck));
	/* the NVMe tier attached: its slots replace the locked pages, unlocked */
	CHECK(moet_model_set_ram_budget(m, (size_t)64 << 20, NULL) == 0, "%s, RAM budget: %s",
	      device, moet_errmsg());
	CHECK(m->n_stage_lock == 0 && m->n_stage_locked == 0, "%s, NVMe tier attached: %d ranges "
	      "(%d locked) left", device, m->n_stage_lock, m->n_stage_locked);
	CHECK(moet_model_set_ram_budget(m, 0, NULL) == 0, "%s", moet_errmsg());
	setenv("MOET_STAGE_BALANCE", "2", 1);
	int rc = moet_model_set_placement(m, own, 1);
	unsetenv("MOET_STAGE_BALANCE");
	CHECK(rc < 0 && strstr(moet_errmsg(), "MOET_STAGE_BALANCE='2'"), "rc %d, '%s'", rc,
	      moet_errmsg());
	setenv("MOET_STAGE_BALANCE", "1", 1);
	setenv("MOET_STAGE_REGISTER", "yes", 1);
	rc = moet_model_set_placement(m, own, 1);
	unsetenv("MOET_STAGE_BALANCE");
	unsetenv("MOET_STAGE_REGISTER");
	CHECK(rc < 0 && strstr(moet_errmsg(), "MOET_STAGE_REGISTER='yes'"), "rc %d, '%s'", rc,
	      moet_errmsg());
	unsetenv("MOET_STAGE_REGISTER");
	step("%s: placement removed", device);
	CHECK(moet_model_set_placement(m, NULL, 0) == 0, "placement removed");
	CHECK(m->n_stage_lock == 0 && m->n_stage_locked == 0, "unlocked with the placement");
	moet_model_close(m);
	free(ref);
	free(got);
	free(own);
	free(dir);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *ws = getenv("MOET_TEST_WATCHDOG_S");
	if (ws && atoi(ws) > 0)
		watch_s = (unsigned)atoi(ws);
	signal(SIGALRM, watchdog);
	step("pick checks");
	/* part 1 on the engine of an all-CPU placement with the default (H200) figures */
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 5;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("stage-balance-pick", &gp, &dir);
	if (m) {
		const moet_config *c = moet_model_config(m);
		const int64_t LE = c->num_hidden_layers * c->n_routed_experts;
		int16_t *own = malloc((size_t)LE * sizeof(*own));
		for (int64_t i = 0; i < LE; i++)
			own[i] = -1;
		setenv("MOET_STAGE_BALANCE", "1", 1);
		CHECK(moet_model_set_placement(m, own, 0) == 0, "%s", moet_errmsg());
		pick_checks(m->hy);
		/* MOET_STAGE_LINK_PRICE: a dearer link stages no more in any call, fewer in some;
		 * the brute force holds at its price too; a value off the list is refused */
		int c1[PRICE_CALLS], c4[PRICE_CALLS], more = 0, fewer = 0;
		pick_counts(m->hy, c1);
		setenv("MOET_STAGE_LINK_PRICE", "4", 1);
		CHECK(moet_model_set_placement(m, own, 0) == 0, "%s", moet_errmsg());
		pick_counts(m->hy, c4);
		pick_checks(m->hy);
		for (int i = 0; i < PRICE_CALLS; i++)
			more += c4[i] > c1[i], fewer += c4[i] < c1[i];
		CHECK(more == 0 && fewer > 0, "link price 4 against 1: %d calls stage more, %d fewer",
		      more, fewer);
		setenv("MOET_STAGE_LINK_PRICE", "2.5", 1);
		CHECK(moet_model_set_placement(m, own, 0) != 0 &&
			      strstr(moet_errmsg(), "MOET_STAGE_LINK_PRICE"),
		      "MOET_STAGE_LINK_PRICE=2.5 accepted or not named: %s", moet_errmsg());
		unsetenv("MOET_STAGE_LINK_PRICE");
		unsetenv("MOET_STAGE_BALANCE");
		moet_model_close(m);
		free(own);
	}
	free(dir);
	model_checks("cpu", 1);
	const char *why = NULL;
	if (moet_gpu_count(&why) > 0) {
		model_checks("cuda", 0); /* first without page-locking: its first run hung */
		model_checks("cuda", 1);
	} else {
		printf("cuda part skipped: %s\n", why ? why : "no CUDA device");
	}
	alarm(0);
	return moet_test_done("test_stage_balance");
}
