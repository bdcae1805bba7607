/*
 * topo.c: the hwloc wrapper of moet_topo.h.
 *
 * Load flattens hwloc's tree once into two tables, so that every query afterwards is an
 * array lookup and the executor never walks hwloc objects:
 *
 *   core[c]   = { pu: OS index of the core's first PU, node: logical NUMA node or -1 }
 *   node[n]   = { os: OS index, first: offset into node_cores[], n: its core count }
 *   node_cores[node[n].first .. + node[n].n) = core indices, ascending
 *
 * NOTE: a core belongs to the first NUMA node whose cpuset intersects its own. hwloc 2 hangs
 * NUMA nodes off the object whose CPUs are local to them (package, die, group), so the cpuset
 * test is the direct one. Machines where hwloc finds no Core objects (some virtual machines)
 * get one core per PU.
 */
#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_topo.h"

struct moet_topo {
	hwloc_topology_t hw;
	int synthetic;
	int n_cores, n_nodes;
	int *core_pu, *core_node;       /* [n_cores] */
	int *node_os, *node_first, *node_n; /* [n_nodes] */
	int *node_cores;                /* [n_cores]: cores grouped by node */
	uint64_t l3_bytes, mem_bytes;
};

static int flatten(moet_topo *t)
{
	hwloc_obj_type_t core_type = HWLOC_OBJ_CORE;
	int nc = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_CORE);
	if (nc <= 0) {
		core_type = HWLOC_OBJ_PU;
		nc = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_PU);
	}
	int nn = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_NUMANODE);
	if (nc <= 0 || nn < 0)
		return moet_err(MOET_EIO, "hwloc: topology has %d cores and %d NUMA nodes", nc, nn);
	t->n_cores = nc;
	t->n_nodes = nn;
	t->core_pu = calloc((size_t)nc, sizeof(int));
	t->core_node = calloc((size_t)nc, sizeof(int));
	t->node_cores = calloc((size_t)nc, sizeof(int));
	t->node_os = calloc((size_t)nn + 1, sizeof(int));
	t->node_first = calloc((size_t)nn + 1, sizeof(int));
	t->node_n = calloc((size_t)nn + 1, sizeof(int));
	if (!t->core_pu || !t->core_node || !t->node_cores || !t->node_os || !t->node_first ||
	    !t->node_n)
		return moet_err(MOET_ENOMEM, "topology tables for %d cores, %d nodes", nc, nn);
	for (int c = 0; c < nc; c++) {
		hwloc_obj_t o = hwloc_get_obj_by_type(t->hw, core_type, (unsigned)c);
		t->core_pu[c] = o && o->cpuset ? hwloc_bitmap_first(o->cpuset) : -1;
		t->core_node[c] = -1;
		for (int n = 0; o && o->cpuset && n < nn; n++) {
			hwloc_obj_t no = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_NUMANODE, (unsigned)n);
			if (no && no->cpuset && hwloc_bitmap_intersects(o->cpuset, no->cpuset)) {
				t->core_node[c] = n;
				break;
			}
		}
	}
	int k = 0;
	for (int n = 0; n < nn; n++) {
		hwloc_obj_t no = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_NUMANODE, (unsigned)n);
		t->node_os[n] = no ? (int)no->os_index : -1;
		t->node_first[n] = k;
		for (int c = 0; c < nc; c++)
			if (t->core_node[c] == n)
				t->node_cores[k++] = c;
		t->node_n[n] = k - t->node_first[n];
	}
	for (hwloc_obj_t o = NULL;
	     (o = hwloc_get_next_obj_by_type(t->hw, HWLOC_OBJ_L3CACHE, o)) != NULL;)
		t->l3_bytes += o->attr ? o->attr->cache.size : 0;
	hwloc_obj_t root = hwloc_get_root_obj(t->hw);
	t->mem_bytes = root ? root->total_memory : 0;
	return 0;
}

static int load(const char *desc, const char *allowed_pus, moet_topo **out)
{
	*out = NULL;
	moet_topo *t = calloc(1, sizeof(*t));
	hwloc_bitmap_t set = NULL;
	int rc;
	if (!t)
		return moet_err(MOET_ENOMEM, "topology");
	if (hwloc_topology_init(&t->hw) < 0) {
		t->hw = NULL;
		rc = moet_err(MOET_EIO, "hwloc_topology_init: %s", strerror(errno));
		goto fail;
	}
	t->synthetic = desc != NULL;
	if (desc && hwloc_topology_set_synthetic(t->hw, desc) < 0) {
		rc = moet_err(MOET_EINVAL, "synthetic topology '%s': hwloc rejects it", desc);
		goto fail;
	}
	if (hwloc_topology_load(t->hw) < 0) {
		rc = moet_err(MOET_EIO, "hwloc_topology_load: %s", strerror(errno));
		goto fail;
	}
	if (allowed_pus) {
		if (!(set = hwloc_bitmap_alloc())) {
			rc = moet_err(MOET_ENOMEM, "cpuset");
			goto fail;
		}
		if (hwloc_bitmap_list_sscanf(set, allowed_pus) < 0 || hwloc_bitmap_iszero(set)) {
			rc = moet_err(MOET_EINVAL, "allowed PUs '%s': not a non-empty PU list",
				      allowed_pus);
			goto fail;
		}
		if (hwloc_topology_restrict(t->hw, set, 0) < 0) {
			rc = moet_err(MOET_EINVAL, "allowed PUs '%s': hwloc cannot restrict the "
				      "topology to them (%s)", allowed_pus, strerror(errno));
			goto fail;
		}
	}
	if ((rc = flatten(t)))
		goto fail;
	hwloc_bitmap_free(set);
	*out = t;
	return 0;
fail:
	hwloc_bitmap_free(set);
	moet_topo_destroy(t);
	return rc;
}

int moet_topo_load(moet_topo **out)
{
	return load(NULL, NULL, out);
}

int moet_topo_load_synthetic(const char *desc, const char *allowed_pus, moet_topo **out)
{
	if (!desc) {
		*out = NULL;
		return moet_err(MOET_EINVAL, "synthetic topology: no description");
	}
	return load(desc, allowed_pus, out);
}

void moet_topo_destroy(moet_topo *t)
{
	if (!t)
		return;
	if (t->hw)
		hwloc_topology_destroy(t->hw);
	free(t->core_pu);
	free(t->core_node);
	free(t->node_cores);
	free(t->node_os);
	free(t->node_first);
	free(t->node_n);
	free(t);
}

int moet_topo_is_synthetic(const moet_topo *t) { return t->synthetic; }
int moet_topo_n_nodes(const moet_topo *t) { return t->n_nodes; }
int moet_topo_n_cores(const moet_topo *t) { return t->n_cores; }
uint64_t moet_topo_l3_bytes(const moet_topo *t) { return t->l3_bytes; }
uint64_t moet_topo_mem_bytes(const moet_topo *t) { return t->mem_bytes; }

int moet_topo_node_os_index(const moet_topo *t, int node)
{
	return (node >= 0 && node < t->n_nodes) ? t->node_os[node] : -1;
}

int moet_topo_node_n_cores(const moet_topo *t, int node)
{
	return (node >= 0 && node < t->n_nodes) ? t->node_n[node] : 0;
}

int moet_topo_node_core(const moet_topo *t, int node, int i)
{
	if (node < 0 || node >= t->n_nodes || i < 0 || i >= t->node_n[node])
		return -1;
	return t->node_cores[t->node_first[node] + i];
}

int moet_topo_core_node(const moet_topo *t, int core)
{
	return (core >= 0 && core < t->n_cores) ? t->core_node[core] : -1;
}

int moet_topo_core_pu(const moet_topo *t, int core)
{
	return (core >= 0 && core < t->n_cores) ? t->core_pu[core] : -1;
}

int moet_topo_select_cores(const moet_topo *t, int node, int n_threads, int *out_cores,
			   int cap, int *out_n)
{
	*out_n = 0;
	if (node != MOET_TOPO_ALL_NODES && (node < 0 || node >= t->n_nodes))
		return moet_err(MOET_EINVAL, "NUMA node %d: the machine has nodes 0..%d", node,
				t->n_nodes - 1);
	if (n_threads < 0)
		return moet_err(MOET_EINVAL, "thread count %d is negative", n_threads);
	int avail = 0;
	if (node == MOET_TOPO_ALL_NODES) {
		for (int n = 0; n < t->n_nodes; n++)
			avail += t->node_n[n];
	} else {
		avail = t->node_n[node];
	}
	if (avail == 0)
		return moet_err(MOET_EINVAL, "NUMA node %d has no cores this process may use", node);
	int want = n_threads ? n_threads : avail;
	if (want > cap)
		return moet_err(MOET_ERANGE, "%d workers: at most %d", want, cap);
	if (node != MOET_TOPO_ALL_NODES) {
		for (int i = 0; i < want; i++)
			out_cores[i] = t->node_cores[t->node_first[node] + i % avail];
	} else {
		/* NOTE: round-robin over nodes, round i taking each node's i-th core if it has
		 * one; workers past the last core wrap around to the first of that order. */
		int k = 0;
		for (int round = 0; k < avail; round++)
			for (int n = 0; n < t->n_nodes && k < avail; n++)
				if (round < t->node_n[n]) {
					int c = t->node_cores[t->node_first[n] + round];
					if (k < want)
						out_cores[k] = c;
					k++;
				}
		for (int i = avail; i < want; i++)
			out_cores[i] = out_cores[i - avail];
	}
	*out_n = want;
	return 0;
}

int moet_topo_bind_core(const moet_topo *t, int core)
{
	if (core < 0 || core >= t->n_cores || t->core_pu[core] < 0)
		return moet_err(MOET_EINVAL, "core %d: the topology has cores 0..%d", core,
				t->n_cores - 1);
	if (t->synthetic)
		return 0;
	hwloc_bitmap_t set = hwloc_bitmap_alloc();
	if (!set)
		return moet_err(MOET_ENOMEM, "cpuset");
	hwloc_bitmap_only(set, (unsigned)t->core_pu[core]);
	int rc = 0;
	if (hwloc_set_cpubind(t->hw, set, HWLOC_CPUBIND_THREAD) < 0)
		rc = moet_err(MOET_EIO, "binding a thread to core %d (PU %d): %s", core,
			      t->core_pu[core], strerror(errno));
	hwloc_bitmap_free(set);
	return rc;
}

int moet_topo_cores_but_one(void)
{
	moet_topo *t = NULL;
	if (moet_topo_load(&t))
		return 0;
	int n = moet_topo_n_cores(t);
	moet_topo_destroy(t);
	return n > 2 ? n - 1 : n;
}

size_t moet_topo_mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return (size_t)kb * 1024;
}
