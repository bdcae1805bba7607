/*
 * residency_assign.c: which node computes which expert, and which cpus a node's workers use.
 * Pure functions of their inputs (no NUMA calls), so they are tested on synthetic machines
 * (2 and 4 nodes, uneven cores, memory limits) on a one-node development box.
 *
 * Assignment is greedy "heaviest first, to the node that ends least loaded per core"
 * (LPT scheduling on machines of different speeds, a node's speed being its core count):
 *
 *   experts sorted by load desc (then bytes desc, then index)
 *   for each: among nodes with room for its bytes, pick min (load_n + load_e) / cores_n
 *             (ties: lower memory share after, then lower node index)
 *
 * NOTE (the bound the tests check): when memory does not bind, the node that ends with the
 * highest per-core load T got its last expert e when (L_n + l_e)/c_n was the minimum over
 * nodes, so every node k then held L_k >= T c_k - l_e; summing, total load >= T C - n l_e,
 * i.e. T <= total/C + n_nodes * l_max / C. With many small experts (256 per layer) that is
 * within a few percent of the perfect split total/C.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_residency.h"

typedef struct assign_ctx {
	const moet_res_expert *experts;
} assign_ctx;

static int heaviest_first(const void *x, const void *y, void *ctx)
{
	const moet_res_expert *e = ((const assign_ctx *)ctx)->experts;
	size_t a = *(const size_t *)x, b = *(const size_t *)y;
	if (e[a].load != e[b].load)
		return e[a].load > e[b].load ? -1 : 1;
	if (e[a].n_bytes != e[b].n_bytes)
		return e[a].n_bytes > e[b].n_bytes ? -1 : 1;
	return a < b ? -1 : 1;
}

int moet_res_assign(const moet_res_node *nodes, int n_nodes, const moet_res_expert *experts,
		    size_t n_experts, int *out_node)
{
	if (n_nodes <= 0 || !nodes)
		return moet_err(MOET_EINVAL, "assign: no nodes");
	for (int i = 0; i < n_nodes; i++)
		if (nodes[i].n_cores <= 0)
			return moet_err(MOET_EINVAL, "assign: node %d has %d cores", nodes[i].node,
					nodes[i].n_cores);
	for (size_t j = 0; j < n_experts; j++)
		if (!isfinite(experts[j].load) || experts[j].load < 0)
			return moet_err(MOET_EINVAL, "assign: expert %zu has load %g", j,
					experts[j].load);
	int rc = 0;
	size_t *order = malloc((n_experts ? n_experts : 1) * sizeof(*order));
	double *load = calloc((size_t)n_nodes, sizeof(*load));
	size_t *used = calloc((size_t)n_nodes, sizeof(*used));
	if (!order || !load || !used) {
		rc = moet_err(MOET_ENOMEM, "assign: out of memory");
		goto fail;
	}
	for (size_t j = 0; j < n_experts; j++)
		order[j] = j;
	assign_ctx ctx = { experts };
	qsort_r(order, n_experts, sizeof(*order), heaviest_first, &ctx);
	for (size_t k = 0; k < n_experts; k++) {
		const moet_res_expert *e = &experts[order[k]];
		int best = -1;
		double best_t = 0, best_m = 0;
		size_t most_room = 0;
		for (int i = 0; i < n_nodes; i++) {
			size_t room = nodes[i].mem_bytes - used[i];
			if (room > most_room)
				most_room = room;
			if (room < e->n_bytes)
				continue;
			double t = (load[i] + e->load) / nodes[i].n_cores;
			double m = nodes[i].mem_bytes ? (double)(used[i] + e->n_bytes) /
							(double)nodes[i].mem_bytes : 0.0;
			if (best < 0 || t < best_t || (t == best_t && m < best_m)) {
				best = i;
				best_t = t;
				best_m = m;
			}
		}
		if (best < 0) {
			rc = moet_err(MOET_ERANGE, "assign: expert %zu (%zu bytes) fits on no node "
				      "(the most room left is %zu bytes)", order[k], e->n_bytes,
				      most_room);
			goto fail;
		}
		load[best] += e->load;
		used[best] += e->n_bytes;
		out_node[order[k]] = best;
	}
fail:
	free(order);
	free(load);
	free(used);
	return rc;
}

static int listed(const int *v, int n, int x)
{
	for (int i = 0; i < n; i++)
		if (v[i] == x)
			return 1;
	return 0;
}

static int by_int(const void *x, const void *y)
{
	int a = *(const int *)x, b = *(const int *)y;
	return (a > b) - (a < b);
}

int moet_res_node_cpus(const moet_res_pu *pus, int n_pus, int node, const int *reserved,
		       int n_reserved, int max_workers, int smt, int *out_cpus, int cap,
		       int *out_n)
{
	if (n_pus < 0 || n_reserved < 0 || max_workers < 0 || cap < 0)
		return moet_err(MOET_EINVAL, "node cpus: negative count");
	int rc = 0, n = 0, n_cores = 0;
	int *cores = malloc((size_t)(n_pus ? n_pus : 1) * sizeof(*cores));
	int *bad = malloc((size_t)(n_pus ? n_pus : 1) * sizeof(*bad));
	int n_bad = 0;
	if (!cores || !bad) {
		rc = moet_err(MOET_ENOMEM, "node cpus: out of memory");
		goto fail;
	}
	/* cores of this node, minus those holding a reserved cpu */
	for (int i = 0; i < n_pus; i++)
		if (pus[i].node == node && listed(reserved, n_reserved, pus[i].cpu) &&
		    !listed(bad, n_bad, pus[i].core))
			bad[n_bad++] = pus[i].core;
	for (int i = 0; i < n_pus; i++)
		if (pus[i].node == node && !listed(bad, n_bad, pus[i].core) &&
		    !listed(cores, n_cores, pus[i].core))
			cores[n_cores++] = pus[i].core;
	/* each kept core's lowest cpu first, in ascending cpu order; then (smt) the rest */
	int *firsts = bad; /* reuse: the bad list is no longer needed */
	int n_first = 0;
	for (int c = 0; c < n_cores; c++) {
		int lo = -1;
		for (int i = 0; i < n_pus; i++)
			if (pus[i].node == node && pus[i].core == cores[c] &&
			    (lo < 0 || pus[i].cpu < lo))
				lo = pus[i].cpu;
		firsts[n_first++] = lo;
	}
	qsort(firsts, (size_t)n_first, sizeof(*firsts), by_int);
	if (max_workers && n_first > max_workers)
		n_first = max_workers;
	for (int i = 0; i < n_first; i++) {
		if (n == cap) {
			rc = moet_err(MOET_ERANGE, "node cpus: room for %d cpus, node %d needs "
				      "more", cap, node);
			goto fail;
		}
		out_cpus[n++] = firsts[i];
	}
	if (smt) {
		int base = n;
		for (int f = 0; f < base; f++) {
			int core = -1;
			for (int i = 0; i < n_pus; i++)
				if (pus[i].node == node && pus[i].cpu == out_cpus[f])
					core = pus[i].core;
			for (int i = 0; i < n_pus; i++) {
				if (pus[i].node != node || pus[i].core != core ||
				    listed(out_cpus, n, pus[i].cpu))
					continue;
				if (n == cap) {
					rc = moet_err(MOET_ERANGE, "node cpus: room for %d "
						      "cpus, node %d needs more", cap, node);
					goto fail;
				}
				out_cpus[n++] = pus[i].cpu;
			}
		}
		qsort(out_cpus, (size_t)n, sizeof(*out_cpus), by_int);
	}
	if (n == 0)
		rc = moet_err(MOET_ENOTFOUND, "node cpus: node %d has no cpu left for workers",
			      node);
fail:
	free(cores);
	free(bad);
	if (!rc)
		*out_n = n;
	return rc;
}
