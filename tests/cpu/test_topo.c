/*
 * test_topo.c: the NUMA/core mapping of cpu/topo.c on synthetic hwloc topologies (one node;
 * two packages of two nodes; uneven nodes after a PU restriction), whose expected mapping is
 * written out by hand here from the description; bad input; binding on this machine.
 */
#include <sched.h>
#include <string.h>

#include "moet_err.h"
#include "moet_test.h"
#include "moet_topo.h"

/* Checks that selecting (node, n) gives workers on exactly the PUs `want_pus`. */
static void check_select(const moet_topo *t, int node, int n, const int *want_pus, int n_want)
{
	int cores[64], got = -1;
	int rc = moet_topo_select_cores(t, node, n, cores, 64, &got);
	CHECK(rc == 0, "select(node %d, %d): rc %d (%s)", node, n, rc, moet_errmsg());
	CHECK(got == n_want, "select(node %d, %d): %d workers, want %d", node, n, got, n_want);
	for (int i = 0; !rc && i < got && i < n_want; i++)
		CHECK(moet_topo_core_pu(t, cores[i]) == want_pus[i],
		      "select(node %d, %d): worker %d on PU %d, want %d", node, n, i,
		      moet_topo_core_pu(t, cores[i]), want_pus[i]);
}

static void one_node(void)
{
	moet_topo *t = NULL;
	int rc = moet_topo_load_synthetic("core:4 pu:2", NULL, &t);
	CHECK(rc == 0 && t, "load: %s", moet_errmsg());
	if (!t)
		return;
	CHECK(moet_topo_is_synthetic(t) == 1, "synthetic flag");
	CHECK(moet_topo_n_nodes(t) == 1, "nodes %d", moet_topo_n_nodes(t));
	CHECK(moet_topo_n_cores(t) == 4, "cores %d", moet_topo_n_cores(t));
	CHECK(moet_topo_node_n_cores(t, 0) == 4, "node 0 cores");
	for (int c = 0; c < 4; c++) {
		CHECK(moet_topo_core_pu(t, c) == 2 * c, "core %d PU %d (one PU per core: the first)",
		      c, moet_topo_core_pu(t, c));
		CHECK(moet_topo_core_node(t, c) == 0, "core %d node", c);
		CHECK(moet_topo_node_core(t, 0, c) == c, "node 0 core %d", c);
	}
	CHECK(moet_topo_node_core(t, 0, 4) == -1 && moet_topo_node_core(t, 1, 0) == -1 &&
	      moet_topo_core_pu(t, 4) == -1 && moet_topo_core_node(t, -1) == -1, "out of range");
	check_select(t, 0, 0, (int[]){ 0, 2, 4, 6 }, 4);
	check_select(t, 0, 2, (int[]){ 0, 2 }, 2);
	check_select(t, 0, 6, (int[]){ 0, 2, 4, 6, 0, 2 }, 6); /* wraps around */
	check_select(t, MOET_TOPO_ALL_NODES, 0, (int[]){ 0, 2, 4, 6 }, 4);
	CHECK(moet_topo_bind_core(t, 3) == 0, "binding on a synthetic topology is a no-op");
	CHECK(moet_topo_bind_core(t, 4) == MOET_EINVAL, "binding to a core out of range");
	int cores[8], n = -1;
	CHECK(moet_topo_select_cores(t, 1, 0, cores, 8, &n) == MOET_EINVAL && n == 0,
	      "node 1 of 1");
	CHECK(moet_topo_select_cores(t, -2, 0, cores, 8, &n) == MOET_EINVAL, "node -2");
	CHECK(moet_topo_select_cores(t, 0, -1, cores, 8, &n) == MOET_EINVAL, "-1 threads");
	CHECK(moet_topo_select_cores(t, 0, 9, cores, 8, &n) == MOET_ERANGE, "9 threads, cap 8");
	moet_topo_destroy(t);
}

static void two_packages(void)
{
	moet_topo *t = NULL;
	int rc = moet_topo_load_synthetic("pack:2 numa:2 core:4 pu:2", NULL, &t);
	CHECK(rc == 0 && t, "load: %s", moet_errmsg());
	if (!t)
		return;
	CHECK(moet_topo_n_nodes(t) == 4 && moet_topo_n_cores(t) == 16, "%d nodes, %d cores",
	      moet_topo_n_nodes(t), moet_topo_n_cores(t));
	for (int n = 0; n < 4; n++) {
		CHECK(moet_topo_node_os_index(t, n) == n, "node %d os %d", n,
		      moet_topo_node_os_index(t, n));
		CHECK(moet_topo_node_n_cores(t, n) == 4, "node %d: %d cores", n,
		      moet_topo_node_n_cores(t, n));
		for (int i = 0; i < 4; i++) {
			int c = moet_topo_node_core(t, n, i);
			CHECK(c == 4 * n + i, "node %d core %d is %d", n, i, c);
			CHECK(moet_topo_core_node(t, c) == n, "core %d node", c);
			CHECK(moet_topo_core_pu(t, c) == 2 * c, "core %d PU", c);
		}
	}
	check_select(t, 2, 0, (int[]){ 16, 18, 20, 22 }, 4);
	check_select(t, 3, 3, (int[]){ 24, 26, 28 }, 3);
	/* all nodes: round-robin across nodes first */
	check_select(t, MOET_TOPO_ALL_NODES, 6, (int[]){ 0, 8, 16, 24, 2, 10 }, 6);
	check_select(t, MOET_TOPO_ALL_NODES, 0,
		     (int[]){ 0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30 }, 16);
	check_select(t, MOET_TOPO_ALL_NODES, 18,
		     (int[]){ 0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30, 0, 8 },
		     18);
	moet_topo_destroy(t);
}

static void uneven(void)
{
	/* PUs 0-5: cores 0-2 of node 0; 8,9: core 4 of node 1; node 2 loses all; 24-31: node 3 */
	moet_topo *t = NULL;
	int rc = moet_topo_load_synthetic("pack:2 numa:2 core:4 pu:2", "0-5,8-9,24-31", &t);
	CHECK(rc == 0 && t, "load: %s", moet_errmsg());
	if (!t)
		return;
	CHECK(moet_topo_n_cores(t) == 8, "cores %d", moet_topo_n_cores(t));
	int by_os[4] = { -1, -1, -1, -1 }, os_seen = 0;
	for (int n = 0; n < moet_topo_n_nodes(t); n++) {
		int os = moet_topo_node_os_index(t, n);
		CHECK(os >= 0 && os < 4, "node %d os %d", n, os);
		if (os >= 0 && os < 4) {
			by_os[os] = n;
			os_seen++;
		}
	}
	CHECK(by_os[0] >= 0 && by_os[1] >= 0 && by_os[3] >= 0, "nodes 0, 1, 3 present");
	if (by_os[0] < 0 || by_os[1] < 0 || by_os[3] < 0) {
		moet_topo_destroy(t);
		return;
	}
	CHECK(moet_topo_node_n_cores(t, by_os[0]) == 3, "os node 0: %d cores",
	      moet_topo_node_n_cores(t, by_os[0]));
	CHECK(moet_topo_node_n_cores(t, by_os[1]) == 1, "os node 1 cores");
	CHECK(moet_topo_node_n_cores(t, by_os[3]) == 4, "os node 3 cores");
	if (by_os[2] >= 0) { /* kept as a memory-only node */
		int cores[8], n;
		CHECK(moet_topo_node_n_cores(t, by_os[2]) == 0, "os node 2 has no cores left");
		CHECK(moet_topo_select_cores(t, by_os[2], 0, cores, 8, &n) == MOET_EINVAL,
		      "selecting a node without cores");
	}
	check_select(t, by_os[0], 0, (int[]){ 0, 2, 4 }, 3);
	check_select(t, by_os[0], 4, (int[]){ 0, 2, 4, 0 }, 4);
	check_select(t, by_os[1], 0, (int[]){ 8 }, 1);
	check_select(t, MOET_TOPO_ALL_NODES, 0, (int[]){ 0, 8, 24, 2, 26, 4, 28, 30 }, 8);
	check_select(t, MOET_TOPO_ALL_NODES, 3, (int[]){ 0, 8, 24 }, 3);
	moet_topo_destroy(t);
}

static void bad_input(void)
{
	moet_topo *t = (moet_topo *)1;
	CHECK(moet_topo_load_synthetic("pack:x core:2", NULL, &t) == MOET_EINVAL && !t,
	      "bad description");
	CHECK(strstr(moet_errmsg(), "pack:x core:2") != NULL, "detail quotes it: %s",
	      moet_errmsg());
	CHECK(moet_topo_load_synthetic(NULL, NULL, &t) == MOET_EINVAL && !t, "no description");
	CHECK(moet_topo_load_synthetic("core:4", "zz", &t) == MOET_EINVAL && !t, "bad PU list");
	CHECK(moet_topo_load_synthetic("core:4", "100-101", &t) == MOET_EINVAL && !t,
	      "PU list outside the machine");
	moet_topo_destroy(NULL);
}

static void this_machine(void)
{
	moet_topo *t = NULL;
	int rc = moet_topo_load(&t);
	CHECK(rc == 0 && t, "load this machine: %s", moet_errmsg());
	if (!t)
		return;
	CHECK(!moet_topo_is_synthetic(t), "not synthetic");
	CHECK(moet_topo_n_nodes(t) >= 1 && moet_topo_n_cores(t) >= 1, "%d nodes, %d cores",
	      moet_topo_n_nodes(t), moet_topo_n_cores(t));
	int total = 0;
	for (int n = 0; n < moet_topo_n_nodes(t); n++)
		total += moet_topo_node_n_cores(t, n);
	CHECK(total == moet_topo_n_cores(t), "every core in one node (%d of %d)", total,
	      moet_topo_n_cores(t));
	int last = moet_topo_n_cores(t) - 1;
	rc = moet_topo_bind_core(t, last);
	CHECK(rc == 0, "bind to core %d: %s", last, moet_errmsg());
	if (!rc)
		CHECK(sched_getcpu() == moet_topo_core_pu(t, last), "running on CPU %d, want %d",
		      sched_getcpu(), moet_topo_core_pu(t, last));
	printf("this machine: %d NUMA node(s), %d cores, L3 %llu bytes, memory %llu bytes\n",
	       moet_topo_n_nodes(t), moet_topo_n_cores(t),
	       (unsigned long long)moet_topo_l3_bytes(t), (unsigned long long)moet_topo_mem_bytes(t));
	moet_topo_destroy(t);
}

int main(void)
{
	one_node();
	two_packages();
	uneven();
	bad_input();
	this_machine();
	return moet_test_done("test_topo");
}
