/*
 * xtier_numa.c: NUMA placement of the NVMe tier's RAM slots (moet_xtier.h): which nodes the
 * slots' pages go to (a pure decision from the topology and the CPU tier's team), the memory
 * policy that puts them there, and the move_pages query that says where they went.
 *
 *   team (cpu/exec.c, node = MOET_TOPO_ALL_NODES: hybrid.c and backend_cpu.c)
 *     worker:  w0   w1   w2   w3   w4   w5  ...   cores round-robin over the nodes
 *     node:    0    1    0    1    0    1
 *   an expert's rows (rows split): chunks claimed dynamically by whichever worker is free
 *     |c0 w3|c1 w0|c2 w5|c3 w1|...   -> every node's cores read every expert
 *   slot pages (MPOL_INTERLEAVE over the team's nodes)
 *     |n0|n1|n0|n1|n0|n1|...           -> every expert's bytes on every node's controller
 *
 * NOTE (the choice): "the node whose cores compute an expert" does not exist for this team:
 * the executor splits each expert's gate/up/down rows into chunks that all workers claim as
 * they come free (cpu/exec.c), so any chunk of any expert is read by any node's cores. A
 * partition of the slots by node (expert e's slot on node k) would then make node k's
 * controller serve every read of e, remote for the other nodes' workers all the same, and a
 * step whose experts happen to sit on one node would load one controller while the others
 * idle. Interleaving every slot's pages over the team's nodes gives each controller 1/N of
 * every expert's bytes, whichever experts a step routes to: the same share of local reads
 * (1/N on N equal nodes) with the load always balanced. A team on one node (MOET_CPU_THREADS
 * below the node count, or a cpuset of one node) reads everything from that node: the slots
 * are preferred there. A partition becomes right when experts get node-local teams (one
 * executor per node, experts assigned by moet_res_assign); the policy is per mapping, so it
 * would be an mbind per slot then.
 *
 * NOTE (the mechanism): the slots are anonymous memory, so a VMA policy (mbind) places their
 * pages whoever faults them first: our thread, io_uring's registration (which pins and so
 * faults every page), or the kernel's io-wq workers when an O_DIRECT read pins an unregistered
 * buffer. First touch from a bound thread would place only the pages that thread faults; the
 * reads are done by kernel workers. So mbind on the whole mapping right after mmap, before any
 * page exists; MPOL_PREFERRED rather than MPOL_BIND for one node, so that a full node spills
 * instead of failing a read (verification counts pages off the policy). A refused mbind
 * (a kernel without NUMA, a seccomp profile without CAP_SYS_NICE, a node outside the cpuset)
 * leaves the pages unplaced and says why in the note: placement is speed, never bits.
 *
 * One node (numa_max_node() == 0, as on CI and the H200 host): no topology load, no mbind,
 * the tier behaves as before; verification reports every present page on node 0.
 */
#include "xtier_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <numa.h>
#include <numaif.h>

#include "moet_env.h"
#include "moet_err.h"
#include "moet_topo.h"

#define VERIFY_CHUNK 4096 /* pages per move_pages call */

/* "0,1,3" of a node mask, into buf. */
static void mask_list(uint64_t mask, char *buf, size_t cap)
{
	size_t at = 0;
	buf[0] = 0;
	for (int n = 0; n < MOET_XTIER_MAX_NODES && at < cap; n++)
		if (mask >> n & 1)
			at += (size_t)snprintf(buf + at, cap - at, "%s%d", at ? "," : "", n);
}

int moet_xtier_numa_decide(const moet_topo *t, const int *team_cores, int n_team, int want,
			   uint64_t want_nodes, moet_xtier_numa_plan *out)
{
	if (!t || !out || n_team < 0 || (n_team > 0 && !team_cores))
		return moet_err(MOET_EINVAL, "NUMA slot policy: no topology, plan or team cores");
	if (want < MOET_XTIER_NUMA_AUTO || want > MOET_XTIER_NUMA_INTERLEAVE)
		return moet_err(MOET_EINVAL, "NUMA slot policy: mode %d is not a MOET_XTIER_NUMA_*",
				want);
	memset(out, 0, sizeof(*out));
	const int n_cores = moet_topo_n_cores(t), n_nodes = moet_topo_n_nodes(t);
	int workers[MOET_XTIER_MAX_NODES] = { 0 };
	uint64_t have = 0, team = 0;
	char list[MOET_XTIER_MAX_NODES * 3 + 1];
	for (int ln = 0; ln < n_nodes; ln++) {
		int os = moet_topo_node_os_index(t, ln);
		if (os >= 0 && os < MOET_XTIER_MAX_NODES)
			have |= 1ull << os;
	}
	/* NOTE: threads that are not pinned (n_team 0) may run on any core */
	const int n = n_team ? n_team : n_cores;
	for (int i = 0; i < n; i++) {
		int c = n_team ? team_cores[i] : i;
		if (c < 0 || c >= n_cores)
			return moet_err(MOET_EINVAL, "NUMA slot policy: team worker %d is on "
					"core %d; the topology has cores 0..%d", i, c,
					n_cores - 1);
		int os = moet_topo_node_os_index(t, moet_topo_core_node(t, c));
		if (os < 0 || os >= MOET_XTIER_MAX_NODES)
			continue; /* a core without a node (or beyond the node limit) */
		workers[os]++;
		team |= 1ull << os;
	}
	uint64_t mask = 0;
	int mode = want;
	if (want == MOET_XTIER_NUMA_OFF) {
		snprintf(out->why, sizeof(out->why), "off (asked): pages where first touched");
	} else if (want == MOET_XTIER_NUMA_AUTO) {
		if (n_nodes <= 1 || !team) {
			mode = MOET_XTIER_NUMA_OFF;
			snprintf(out->why, sizeof(out->why), "%s: no policy, pages where first "
				 "touched", n_nodes <= 1 ? "one NUMA node" :
				 "the CPU team's cores have no NUMA node");
		} else {
			mask = team;
			mode = (team & (team - 1)) ? MOET_XTIER_NUMA_INTERLEAVE
						   : MOET_XTIER_NUMA_BIND;
		}
	} else {
		if (want_nodes & ~have) {
			mask_list(want_nodes & ~have, list, sizeof(list));
			char all[sizeof(list)];
			mask_list(have, all, sizeof(all));
			return moet_err(MOET_ERANGE, "NUMA slot policy: node %s is not a node of "
					"this machine (nodes %s)", list, all);
		}
		mask = want_nodes ? want_nodes : team;
		if (!mask) {
			mode = MOET_XTIER_NUMA_OFF;
			snprintf(out->why, sizeof(out->why), "the CPU team's cores have no NUMA "
				 "node: no policy");
		} else if (want == MOET_XTIER_NUMA_BIND) {
			mask &= ~(mask - 1); /* the lowest */
		}
	}
	if (mode == MOET_XTIER_NUMA_OFF)
		mask = 0;
	for (int os = 0; os < MOET_XTIER_MAX_NODES; os++)
		if (mask >> os & 1) {
			out->nodes[out->n_nodes] = os;
			out->workers[out->n_nodes++] = workers[os];
		}
	out->mode = mode;
	out->mask = mask;
	if (mode == MOET_XTIER_NUMA_OFF)
		return 0;
	size_t at = 0;
	for (int i = 0; i < out->n_nodes && at < sizeof(list); i++)
		at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%d:%d", i ? " " : "",
				       out->nodes[i], out->workers[i]);
	char plain[sizeof(list)];
	mask_list(mask, plain, sizeof(plain));
	if (want != MOET_XTIER_NUMA_AUTO)
		snprintf(out->why, sizeof(out->why), "%s node%s %.48s (asked; team workers "
			 "node:count %.64s)", mode == MOET_XTIER_NUMA_BIND ? "preferred on" :
			 "interleaved over", out->n_nodes > 1 ? "s" : "", plain, list);
	else if (mode == MOET_XTIER_NUMA_BIND)
		snprintf(out->why, sizeof(out->why), "the CPU team is on node %d only (%d "
			 "workers): slots preferred there", out->nodes[0], out->workers[0]);
	else
		snprintf(out->why, sizeof(out->why), "the CPU team spans %d nodes (node:workers "
			 "%.64s), every expert's rows split over all: slots interleaved",
			 out->n_nodes, list);
	return 0;
}

/* The team the engine makes for the CPU tier (hybrid.c, backend_cpu.c): MOET_CPU_THREADS,
 * else every core (CPU backend) or every core but one (beside a GPU); 1 is no team (the
 * calling thread, not pinned: n 0). NOTE: mirrors those two files' rule. */
static int team_cores(const moet_xtier *x, const moet_topo *t, int **out, int *out_n)
{
	const char *env = getenv("MOET_CPU_THREADS");
	const int nc = moet_topo_n_cores(t);
	int n = env && env[0] ? atoi(env) : 0;
	if (n < 0)
		n = 0;
	if (n == 0 && !x->m->be->ops->host_memory)
		n = nc > 2 ? nc - 1 : nc;
	*out = NULL;
	*out_n = 0;
	if (n == 1)
		return 0;
	const int cap = n > nc ? n : nc;
	int *c = malloc((size_t)cap * sizeof(*c));
	if (!c)
		return moet_err(MOET_ENOMEM, "NUMA slot policy: %d team cores", cap);
	int rc = moet_topo_select_cores(t, MOET_TOPO_ALL_NODES, n, c, cap, out_n);
	if (rc) {
		free(c);
		return rc;
	}
	*out = c;
	return 0;
}

static int env_mode(int *mode)
{
	/* NOTE: in the order of MOET_XTIER_NUMA_AUTO (0), _OFF, _BIND, _INTERLEAVE */
	static const char *const names[] = { "auto", "off", "bind", "interleave" };
	return moet_env_choice("MOET_XTIER_NUMA", names, 4, mode);
}

int xt_numa_place(moet_xtier *x, size_t total_bytes)
{
	moet_xtier_numa_plan plan = { .mode = MOET_XTIER_NUMA_OFF };
	moet_topo *t = NULL;
	int *cores = NULL, n_team = 0, want = x->o.numa, rc = 0;
	if (want == MOET_XTIER_NUMA_AUTO && (rc = env_mode(&want)))
		return rc;
	if (want == MOET_XTIER_NUMA_AUTO && (numa_available() < 0 || numa_max_node() < 1)) {
		/* one node: exactly as before, not even a topology load */
		snprintf(plan.why, sizeof(plan.why), "one NUMA node: no policy, pages where first "
			 "touched");
	} else if (want == MOET_XTIER_NUMA_OFF) {
		snprintf(plan.why, sizeof(plan.why), "off (asked): pages where first touched");
	} else {
		rc = moet_topo_load(&t);
		if (!rc)
			rc = team_cores(x, t, &cores, &n_team);
		if (!rc)
			rc = moet_xtier_numa_decide(t, cores, n_team, want, x->o.numa_nodes, &plan);
		free(cores);
		moet_topo_destroy(t);
		if (rc)
			return moet_err_prefix(rc, "NVMe tier");
	}
	if (plan.mode != MOET_XTIER_NUMA_OFF) {
		enum { WB = 8 * sizeof(unsigned long) };
		unsigned long words[128 / WB] = { 0 };
		for (int n = 0; n < MOET_XTIER_MAX_NODES; n++)
			if (plan.mask >> n & 1)
				words[n / WB] |= 1ul << (n % WB);
		const int pol = plan.mode == MOET_XTIER_NUMA_BIND ? MPOL_PREFERRED
								 : MPOL_INTERLEAVE;
		if (mbind(x->mem, total_bytes, pol, words, sizeof(words) * 8, 0)) {
			size_t at = strlen(plan.why);
			snprintf(plan.why + at, sizeof(plan.why) - at, "; mbind refused (%s): no "
				 "policy", strerror(errno));
			plan.mode = MOET_XTIER_NUMA_OFF;
			plan.mask = 0;
		}
	}
	x->st.numa_mode = plan.mode;
	x->st.numa_node_mask = plan.mask;
	snprintf(x->st.numa_note, sizeof(x->st.numa_note), "%s", plan.why);
	return 0;
}

/* The page queried in window w of stride pages: at a position that varies with w. */
static size_t sample_page(size_t w, size_t stride)
{
	if (stride == 1)
		return w;
	uint64_t h = (uint64_t)w * 0x9E3779B97F4A7C15ull;
	return w * stride + (size_t)((h >> 32) % stride);
}

int moet_xtier_numa_verify(moet_xtier *x, size_t stride_pages)
{
	if (!stride_pages)
		return moet_err(MOET_EINVAL, "NVMe tier: NUMA verify stride is 0 pages");
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	const size_t total = (size_t)x->n_slots * x->slot_bytes;
	const size_t n_pages = (total + page - 1) / page;
	const int one_node = numa_available() < 0 || numa_max_node() < 1;
	uint64_t *seen = calloc((size_t)(x->n_slots ? x->n_slots : 1), sizeof(*seen));
	void **pg = malloc(VERIFY_CHUNK * sizeof(*pg));
	int *status = malloc(VERIFY_CHUNK * sizeof(*status));
	size_t *slot_of = malloc(VERIFY_CHUNK * sizeof(*slot_of));
	moet_xtier_stats *st = &x->st;
	int rc = 0;
	if (!seen || !pg || !status || !slot_of) {
		rc = moet_err(MOET_ENOMEM, "NVMe tier: NUMA verify of %zu pages", n_pages);
		goto done;
	}
	uint64_t t0 = moet_now_ns();
	st->numa_pages = st->numa_absent = st->numa_off_policy = 0;
	memset(st->numa_node_pages, 0, sizeof(st->numa_node_pages));
	memset(st->numa_node_slots, 0, sizeof(st->numa_node_slots));
	st->numa_spread_slots = st->numa_empty_slots = 0;
	for (size_t w = 0; x->mem && w * stride_pages < n_pages;) {
		size_t cnt = 0;
		for (; cnt < VERIFY_CHUNK && w * stride_pages < n_pages; w++) {
			size_t i = sample_page(w, stride_pages);
			if (i >= n_pages)
				i = n_pages - 1;
			pg[cnt] = x->mem + i * page;
			slot_of[cnt++] = i * page / x->slot_bytes;
		}
		long got = move_pages(0, (unsigned long)cnt, pg, NULL, status, 0);
		if (got < 0 && !one_node) {
			rc = moet_err(MOET_EIO, "NVMe tier: move_pages query of %zu slot pages "
				      "failed: %s", cnt, strerror(errno));
			goto done;
		}
		if (got < 0) { /* no NUMA here: a present page is on node 0 */
			unsigned char vec[1];
			for (size_t j = 0; j < cnt; j++)
				status[j] = mincore(pg[j], page, vec) == 0 && (vec[0] & 1) ? 0
											  : -ENOENT;
		}
		for (size_t j = 0; j < cnt; j++) {
			st->numa_pages++;
			if (status[j] < 0) {
				st->numa_absent++;
				continue;
			}
			if (status[j] >= MOET_XTIER_MAX_NODES) {
				st->numa_off_policy++;
				continue;
			}
			const uint64_t bit = 1ull << status[j];
			st->numa_node_pages[status[j]]++;
			seen[slot_of[j]] |= bit;
			if (st->numa_mode != MOET_XTIER_NUMA_OFF && !(st->numa_node_mask & bit))
				st->numa_off_policy++;
		}
	}
	for (int64_t s = 0; s < x->n_slots; s++) {
		if (!seen[s])
			st->numa_empty_slots++;
		else if (seen[s] & (seen[s] - 1))
			st->numa_spread_slots++;
		else
			st->numa_node_slots[__builtin_ctzll(seen[s])]++;
	}
	st->numa_verify_ns = moet_now_ns() - t0;
done:
	free(seen);
	free(pg);
	free(status);
	free(slot_of);
	return rc;
}
