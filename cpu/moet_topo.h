/*
 * moet_topo.h: the machine's NUMA nodes and cores, as the CPU executor needs them (a thin
 * wrapper over hwloc).
 *
 *   nodes  0 .. n_nodes-1     logical NUMA node indices (hwloc's order), each with its cores
 *   cores  0 .. n_cores-1     logical core indices over the whole machine; a core's worker is
 *                             bound to the core's first PU (one worker per core, SMT siblings
 *                             left alone: the expert kernels stream memory and fill the FMA
 *                             ports, so a second hyperthread adds contention, not bandwidth)
 *
 * A topology is either this machine's (moet_topo_load: restricted to the PUs this process may
 * run on, as hwloc does by default) or a synthetic one for tests (moet_topo_load_synthetic:
 * hwloc's synthetic description, optionally restricted to a PU list to model uneven nodes).
 * Binding on a synthetic topology is a successful no-op. A loaded topology is immutable:
 * every query is thread-safe.
 */
#ifndef MOET_TOPO_H
#define MOET_TOPO_H

#include <stddef.h>

#include <stdint.h>

typedef struct moet_topo moet_topo;

#define MOET_TOPO_ALL_NODES (-1) /* moet_topo_select_cores: cores of every node */

/* This machine's topology. Returns 0, MOET_ENOMEM or MOET_EIO (hwloc failed; detail says
 * which call). *out is owned by the caller (moet_topo_destroy). */
int moet_topo_load(moet_topo **out);

/*
 * A synthetic topology, e.g. "pack:2 numa:2 core:4 pu:2" (hwloc_topology_set_synthetic).
 * allowed_pus (optional, NULL for all) restricts it to a PU list in hwloc's list syntax
 * ("0-5,8,9", OS indices), the way a cgroup or taskset would: cores whose PUs are all removed
 * disappear, so nodes can end up with different core counts. Returns 0, MOET_EINVAL (bad
 * description or list, detail quotes it) or MOET_ENOMEM.
 */
int moet_topo_load_synthetic(const char *desc, const char *allowed_pus, moet_topo **out);

/* Frees t; NULL is fine. */
void moet_topo_destroy(moet_topo *t);

/* 1 for a synthetic topology (binding does nothing), 0 for this machine's. */
int moet_topo_is_synthetic(const moet_topo *t);

int moet_topo_n_nodes(const moet_topo *t);
int moet_topo_n_cores(const moet_topo *t);

/* The OS index of NUMA node `node` (what numa_maps and mbind call it); -1 if out of range. */
int moet_topo_node_os_index(const moet_topo *t, int node);

/* Cores of NUMA node `node` (0 if out of range), and the i-th of them as a core index
 * (-1 if out of range). Cores come in hwloc's logical order. */
int moet_topo_node_n_cores(const moet_topo *t, int node);
int moet_topo_node_core(const moet_topo *t, int node, int i);

/* The NUMA node of core `core` (-1: none, or out of range) and the OS index of its first PU,
 * the CPU its worker is bound to (-1 if out of range). */
int moet_topo_core_node(const moet_topo *t, int core);
int moet_topo_core_pu(const moet_topo *t, int core);

/* Total L3 cache of the machine in bytes (sum over L3 objects; 0 if hwloc reports none) and
 * total memory in bytes (hwloc's count; 0 if unknown). */
uint64_t moet_topo_l3_bytes(const moet_topo *t);
uint64_t moet_topo_mem_bytes(const moet_topo *t);

/*
 * The worker-to-core mapping: out_cores[i] = the core of worker i, for i < n_threads.
 *   node >= 0: the cores of that node in order; MOET_TOPO_ALL_NODES: the cores of every node
 *   taken round-robin across nodes (node 0's first core, node 1's first core, ...), so that a
 *   team smaller than the machine still reads from every node's memory controller.
 *   n_threads == 0 means one worker per selected core; more workers than cores wrap around
 *   (cores shared: useful only for tests on small machines).
 * *out_n gets the worker count; out_cores must hold it (at most `cap`). Returns 0,
 * MOET_EINVAL (node out of range, or a node without cores, or n_threads < 0) or MOET_ERANGE
 * (more than cap workers).
 */
int moet_topo_select_cores(const moet_topo *t, int node, int n_threads, int *out_cores,
			   int cap, int *out_n);

/* Binds the calling thread to core `core`'s first PU. Returns 0 (also on a synthetic
 * topology, where it does nothing), MOET_EINVAL (core out of range) or MOET_EIO (the OS
 * refused; detail has errno's text). */
int moet_topo_bind_core(const moet_topo *t, int core);

/* This machine's cores less one (the thread that drives a GPU wants a core of its own; all of
 * them on 2 cores or fewer), for teams working beside a GPU (the hybrid engine's CPU tier, the
 * upload); 0 when the topology cannot be read. */
int moet_topo_cores_but_one(void);

/* Host memory the kernel says is available for new allocations (/proc/meminfo MemAvailable),
 * in bytes; 0 when it cannot be read. */
size_t moet_topo_mem_available(void);

#endif
