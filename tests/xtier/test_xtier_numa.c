/*
 * test_xtier_numa.c: NUMA placement of the NVMe tier's slots (runtime/xtier_numa.c).
 *
 * 1. The decision, a pure function, on synthetic hwloc topologies (one node; two nodes of 4
 *    cores; two nodes made uneven by a cpuset; four nodes; a cpuset of node 1 only): the
 *    engine's team (moet_topo_select_cores over every node, as hybrid.c and backend_cpu.c
 *    make it) gives OFF on one node, INTERLEAVE over both nodes with their worker counts on
 *    two, BIND to the team's node when the team sits on one (one worker; node 1's cores);
 *    forced modes and nodes; errors name the bad core, node or mode.
 * 2. This machine (one node on CI): AUTO places nothing and the move_pages verification
 *    finds every slot page on node 0 (registered warm fill: none absent); forced BIND and
 *    INTERLEAVE on node 0 are applied with mbind (where the kernel lets us: else the note
 *    says why and the test says so), the O_DIRECT reads into those slots work, the pages are
 *    on node 0, and the logits at 50% and one slot equal those without a tier (memcmp).
 *    MOET_XTIER_NUMA=off|bogus, a node the machine lacks, stride 0, a sampled verify, and
 *    stats_reset keeping the NUMA facts.
 */
#include <numa.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"
#include "moet_topo.h"
#include "moet_xtier.h"

#define SEQS 3
#define STEPS 3

/* The plan for the engine's team of n_threads (0: every core) on topology desc/allowed. */
static int plan_for(const char *desc, const char *allowed, int n_threads, int want,
		    uint64_t nodes, moet_xtier_numa_plan *out)
{
	moet_topo *t = NULL;
	int cores[64], n = 0;
	int rc = moet_topo_load_synthetic(desc, allowed, &t);
	CHECK(rc == 0, "%s: %s", desc, moet_errmsg());
	if (rc)
		return rc;
	rc = moet_topo_select_cores(t, MOET_TOPO_ALL_NODES, n_threads, cores, 64, &n);
	CHECK(rc == 0, "%s: select: %s", desc, moet_errmsg());
	if (!rc)
		rc = moet_xtier_numa_decide(t, cores, n, want, nodes, out);
	moet_topo_destroy(t);
	return rc;
}

static void decide_tests(void)
{
	moet_xtier_numa_plan p;
	/* one node: no policy */
	CHECK(plan_for("numa:1 core:4 pu:1", NULL, 0, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_OFF && p.n_nodes == 0 && p.mask == 0 &&
	      strstr(p.why, "one NUMA node"), "one node: mode %d, %s", p.mode, p.why);
	/* two nodes, the whole machine: interleave over both, 4 workers each */
	CHECK(plan_for("numa:2 core:4 pu:2", NULL, 0, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_INTERLEAVE && p.n_nodes == 2 && p.mask == 3 &&
	      p.nodes[0] == 0 && p.nodes[1] == 1 && p.workers[0] == 4 && p.workers[1] == 4,
	      "two nodes: mode %d, %d nodes, workers %d %d: %s", p.mode, p.n_nodes, p.workers[0],
	      p.workers[1], p.why);
	printf("two nodes: %s\n", p.why);
	/* every core but one (beside a GPU): still both nodes (round robin), 4 + 3 */
	CHECK(plan_for("numa:2 core:4 pu:1", NULL, 7, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_INTERLEAVE && p.workers[0] == 4 && p.workers[1] == 3,
	      "7 workers: %d %d", p.workers[0], p.workers[1]);
	/* a team of one worker: round robin starts on node 0, which computes everything */
	CHECK(plan_for("numa:2 core:4 pu:1", NULL, 1, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_BIND && p.n_nodes == 1 && p.nodes[0] == 0 &&
	      p.mask == 1 && p.workers[0] == 1 && strstr(p.why, "node 0 only"),
	      "one worker: mode %d mask %llx: %s", p.mode, (unsigned long long)p.mask, p.why);
	/* uneven nodes (a cpuset keeps 2 of node 1's 4 cores): interleave, workers 4 and 2 */
	CHECK(plan_for("numa:2 core:4 pu:1", "0-5", 0, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_INTERLEAVE && p.workers[0] == 4 && p.workers[1] == 2,
	      "uneven: mode %d workers %d %d", p.mode, p.workers[0], p.workers[1]);
	/* a cpuset of node 1's cores only: the slots belong on node 1 */
	CHECK(plan_for("numa:2 core:4 pu:1", "4-7", 0, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_BIND && p.nodes[0] == 1 && p.mask == 2 &&
	      p.workers[0] == 4, "node 1 only: mode %d mask %llx: %s", p.mode,
	      (unsigned long long)p.mask, p.why);
	/* four nodes, three workers: the three nodes the round robin reaches */
	CHECK(plan_for("pack:2 numa:2 core:2 pu:1", NULL, 3, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_INTERLEAVE && p.mask == 7 && p.n_nodes == 3,
	      "four nodes, 3 workers: mask %llx", (unsigned long long)p.mask);
	/* not pinned (n_team 0): anywhere, so every node */
	moet_topo *t = NULL;
	CHECK(moet_topo_load_synthetic("numa:2 core:2 pu:1", NULL, &t) == 0, "topo");
	if (!t)
		return;
	CHECK(moet_xtier_numa_decide(t, NULL, 0, MOET_XTIER_NUMA_AUTO, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_INTERLEAVE && p.mask == 3, "unpinned: mode %d", p.mode);
	/* forced modes */
	int all[4] = { 0, 2, 1, 3 }; /* cores 0,1 on node 0; 2,3 on node 1 */
	CHECK(moet_xtier_numa_decide(t, all, 4, MOET_XTIER_NUMA_OFF, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_OFF && p.mask == 0 && strstr(p.why, "asked"), "off");
	CHECK(moet_xtier_numa_decide(t, all, 4, MOET_XTIER_NUMA_BIND, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_BIND && p.mask == 1 && p.workers[0] == 2,
	      "bind: the lowest team node: mask %llx", (unsigned long long)p.mask);
	CHECK(moet_xtier_numa_decide(t, all, 4, MOET_XTIER_NUMA_BIND, 2, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_BIND && p.nodes[0] == 1 && p.n_nodes == 1,
	      "bind node 1: %s", p.why);
	CHECK(moet_xtier_numa_decide(t, all, 2, MOET_XTIER_NUMA_INTERLEAVE, 3, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_INTERLEAVE && p.mask == 3 && p.workers[0] == 1 &&
	      p.workers[1] == 1, "interleave forced: workers %d %d", p.workers[0], p.workers[1]);
	CHECK(moet_xtier_numa_decide(t, all, 1, MOET_XTIER_NUMA_INTERLEAVE, 0, &p) == 0 &&
	      p.mode == MOET_XTIER_NUMA_INTERLEAVE && p.mask == 1, "interleave over the team");
	/* errors */
	int bad[2] = { 0, 9 };
	CHECK(moet_xtier_numa_decide(t, bad, 2, MOET_XTIER_NUMA_AUTO, 0, &p) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "core 9") && strstr(moet_errmsg(), "0..3"), "bad core: %s",
	      moet_errmsg());
	CHECK(moet_xtier_numa_decide(t, all, 4, MOET_XTIER_NUMA_BIND, 1ull << 5, &p) ==
		      MOET_ERANGE && strstr(moet_errmsg(), "node 5 is not a node") &&
	      strstr(moet_errmsg(), "nodes 0,1"), "bad node: %s", moet_errmsg());
	CHECK(moet_xtier_numa_decide(t, all, 4, 7, 0, &p) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "mode 7"), "bad mode: %s", moet_errmsg());
	CHECK(moet_xtier_numa_decide(t, all, -1, 0, 0, &p) == MOET_EINVAL, "negative team");
	CHECK(moet_xtier_numa_decide(NULL, all, 4, 0, 0, &p) == MOET_EINVAL, "no topology");
	moet_topo_destroy(t);
}

/* Sets a tier with policy `numa`; returns its stats after a full verify (zeroed on error). */
static moet_xtier_stats placed(moet_model *m, const char *name, size_t bytes, int numa,
			       int no_register)
{
	moet_xtier_stats st;
	memset(&st, 0, sizeof(st));
	moet_xtier_opts o = { .ram_budget_bytes = bytes, .numa = numa,
			      .no_register = no_register };
	int rc = moet_model_set_xtier(m, &o);
	CHECK(rc == 0, "%s: set: %s", name, moet_errmsg());
	if (rc)
		return st;
	moet_xtier *x = moet_model_xtier(m);
	CHECK(moet_xtier_numa_verify(x, 1) == 0, "%s: verify: %s", name, moet_errmsg());
	moet_xtier_stats_get(x, &st);
	printf("%s: mode %d (%s); %llu pages, %llu absent, node 0: %llu pages, %lld slots of "
	       "%lld; %.3f ms\n", name, st.numa_mode, st.numa_note,
	       (unsigned long long)st.numa_pages, (unsigned long long)st.numa_absent,
	       (unsigned long long)st.numa_node_pages[0], (long long)st.numa_node_slots[0],
	       (long long)st.n_slots, (double)st.numa_verify_ns * 1e-6);
	return st;
}

/* Every present page of the slots on node 0 (the only node here). */
static void on_node0(const char *name, const moet_xtier_stats *st, int none_absent)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	const uint64_t pages = ((uint64_t)st->n_slots * st->slot_bytes + page - 1) / page;
	uint64_t elsewhere = 0;
	for (int k = 1; k < MOET_XTIER_MAX_NODES; k++)
		elsewhere += st->numa_node_pages[k];
	CHECK(st->numa_pages == pages && elsewhere == 0 && st->numa_off_policy == 0 &&
	      st->numa_node_pages[0] + st->numa_absent == pages,
	      "%s: %llu of %llu pages queried, %llu elsewhere", name,
	      (unsigned long long)st->numa_pages, (unsigned long long)pages,
	      (unsigned long long)elsewhere);
	CHECK(st->numa_spread_slots == 0 &&
	      st->numa_node_slots[0] + st->numa_empty_slots == st->n_slots,
	      "%s: slots on node 0 %lld, empty %lld, of %lld", name,
	      (long long)st->numa_node_slots[0], (long long)st->numa_empty_slots,
	      (long long)st->n_slots);
	if (none_absent)
		CHECK(st->numa_absent == 0 && st->numa_node_slots[0] == st->n_slots,
		      "%s: registered slots fully present: %llu absent", name,
		      (unsigned long long)st->numa_absent);
}

int main(void)
{
	decide_tests();

	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 11;
	gp.n_layers = 3;
	gp.shard_mb = 1;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("xtier-numa", &gp, &dir);
	if (!m)
		return moet_test_done("test_xtier_numa");
	const int64_t V = moet_model_config(m)->vocab_size;
	const size_t n = (size_t)((STEPS + 1) * SEQS * V);
	float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, ref) == 0, "reference: %s", moet_errmsg());
	moet_xtier_stats plan;
	CHECK(moet_xtier_plan(m, &plan) == 0, "plan: %s", moet_errmsg());
	const size_t all = (size_t)plan.tier_experts * plan.slot_bytes;
	const int one_node = numa_available() < 0 || numa_max_node() < 1;

	/* AUTO: nothing placed on one node; the verify sees node 0 */
	unsetenv("MOET_XTIER_NUMA");
	moet_xtier_stats st = placed(m, "auto 100%", all, MOET_XTIER_NUMA_AUTO, 0);
	if (one_node) {
		CHECK(st.numa_mode == MOET_XTIER_NUMA_OFF && st.numa_node_mask == 0 &&
		      strstr(st.numa_note, "one NUMA node"), "auto on one node: %s", st.numa_note);
		on_node0("auto 100%", &st, st.registered);
	} else {
		printf("this machine has %d NUMA nodes: auto gave mode %d\n", numa_max_node() + 1,
		       st.numa_mode);
		CHECK(st.numa_mode != MOET_XTIER_NUMA_OFF || strstr(st.numa_note, "refused"),
		      "auto on several nodes placed nothing: %s", st.numa_note);
	}
	/* stats_reset keeps the NUMA facts */
	moet_xtier_stats_reset(moet_model_xtier(m));
	moet_xtier_stats kept;
	moet_xtier_stats_get(moet_model_xtier(m), &kept);
	CHECK(kept.numa_mode == st.numa_mode && kept.numa_pages == st.numa_pages &&
	      kept.numa_node_slots[0] == st.numa_node_slots[0] &&
	      !strcmp(kept.numa_note, st.numa_note) && kept.warm_reads == 0, "reset keeps numa");
	/* sampled: one page in 3 */
	CHECK(moet_xtier_numa_verify(moet_model_xtier(m), 3) == 0, "verify 3: %s",
	      moet_errmsg());
	moet_xtier_stats_get(moet_model_xtier(m), &kept);
	CHECK(kept.numa_pages == (st.numa_pages + 2) / 3, "stride 3: %llu of %llu pages",
	      (unsigned long long)kept.numa_pages, (unsigned long long)st.numa_pages);
	CHECK(moet_xtier_numa_verify(moet_model_xtier(m), 0) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "stride is 0"), "stride 0: %s", moet_errmsg());

	/* forced policies on node 0, reads into the placed slots, logits unchanged */
	static const struct { const char *name; int numa, no_reg, div; } runs[] = {
		{ "bind 50%", MOET_XTIER_NUMA_BIND, 0, 2 },
		{ "interleave 50% unregistered", MOET_XTIER_NUMA_INTERLEAVE, 1, 2 },
		{ "bind one slot unregistered", MOET_XTIER_NUMA_BIND, 1, 0 },
	};
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		size_t bytes = runs[i].div ? all / (size_t)runs[i].div : plan.slot_bytes;
		st = placed(m, runs[i].name, bytes, runs[i].numa, runs[i].no_reg);
		if (st.numa_mode == MOET_XTIER_NUMA_OFF) {
			CHECK(strstr(st.numa_note, "refused") != NULL, "%s: not applied: %s",
			      runs[i].name, st.numa_note);
			printf("%s: the kernel refused the policy here (%s): placement checks "
			       "skipped\n", runs[i].name, st.numa_note);
		} else {
			CHECK(st.numa_mode == runs[i].numa && (st.numa_node_mask & 1),
			      "%s: mode %d mask %llx", runs[i].name, st.numa_mode,
			      (unsigned long long)st.numa_node_mask);
			if (one_node)
				on_node0(runs[i].name, &st, !runs[i].no_reg);
		}
		memset(got, 0xAB, n * sizeof(float));
		CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, got) == 0 &&
		      !memcmp(ref, got, n * sizeof(float)), "%s: logits: %s", runs[i].name,
		      moet_errmsg());
		moet_xtier *x = moet_model_xtier(m);
		CHECK(x && moet_xtier_numa_verify(x, 1) == 0, "%s: verify after the run",
		      runs[i].name);
		moet_xtier_stats after;
		moet_xtier_stats_get(x, &after);
		if (one_node)
			on_node0(runs[i].name, &after, 0);
		CHECK(after.misses > 0 || runs[i].div == 0 || after.hits > 0, "%s: used",
		      runs[i].name);
	}

	/* the environment and bad nodes */
	moet_xtier_opts o = { .ram_budget_bytes = all / 2 };
	setenv("MOET_XTIER_NUMA", "off", 1);
	CHECK(moet_model_set_xtier(m, &o) == 0, "env off: %s", moet_errmsg());
	moet_xtier_stats_get(moet_model_xtier(m), &st);
	CHECK(st.numa_mode == MOET_XTIER_NUMA_OFF && strstr(st.numa_note, "asked"),
	      "env off: %s", st.numa_note);
	setenv("MOET_XTIER_NUMA", "everywhere", 1);
	CHECK(moet_model_set_xtier(m, &o) == MOET_EINVAL && !moet_model_xtier(m) &&
	      strstr(moet_errmsg(), "MOET_XTIER_NUMA='everywhere'"), "env bad: %s",
	      moet_errmsg());
	unsetenv("MOET_XTIER_NUMA");
	o.numa = MOET_XTIER_NUMA_BIND;
	o.numa_nodes = 1ull << 40;
	CHECK(moet_model_set_xtier(m, &o) == MOET_ERANGE && !moet_model_xtier(m) &&
	      strstr(moet_errmsg(), "node 40 is not a node"), "node 40: %s", moet_errmsg());

	moet_model_close(m);
	free(ref);
	free(got);
	free(dir);
	return moet_test_done("test_xtier_numa");
}
