/*
 * moet_residency.h: keep the CPU tier's expert bytes resident in host RAM, on the NUMA node
 * whose threads compute them, and notice when the kernel takes them away.
 *
 * The checkpoint's shards are mmap'd read-only and MAP_PRIVATE, whole (moet_ckpt.h); every
 * routed expert is three moet_mat views into such a mapping. The CPU tier is a set of byte
 * ranges in those mappings, each tagged with the node whose workers will read it:
 *
 *   mapping (page-aligned base, whole file)  |hdr|..attn..|e0 gate,up,down|e1 ...|e2 ...|
 *   ranges (any alignment, never overlapping)            [ node 0        ][node 1][node 0]
 *   pages the set works on (rounded outward)            |p|p|p|p|p|p|p|p|p|p|p|p|p|p|p|
 *
 * A page shared by two ranges (ranges need not be page-aligned: tensors are not) belongs to
 * whichever touches it first; it is counted in both ranges' statistics.
 *
 *   moet_res_populate   read every page in (MADV_WILLNEED, then MADV_POPULATE_READ, or a
 *                       one-byte touch per page on kernels older than 5.14), each range from
 *                       a thread bound to its node: page-cache pages are allocated on the node
 *                       of the thread that first faults them in (docs/residency.md).
 *   moet_res_lock       mlock, when RLIMIT_MEMLOCK (or CAP_IPC_LOCK) allows; else a report.
 *   moet_res_check      mincore over every page (or every Nth): resident share per range and
 *                       node; moet_res_evicted lists ranges that lost pages.
 *   moet_res_verify     move_pages in query mode: pages per node per range; moet_res_misplaced
 *                       lists ranges with pages on another node, moet_res_replace re-places one.
 *   moet_res_assign     pure: experts to nodes, balancing load per core within memory.
 *   moet_res_node_cpus  pure: the cpus a node's workers use (one per physical core).
 *
 * A set is not thread-safe: one caller at a time. It borrows the mappings: destroy the set
 * before unmapping them (destroy munlocks what lock locked).
 */
#ifndef MOET_RESIDENCY_H
#define MOET_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#define MOET_RES_MAX_NODES 64 /* node ids 0 .. 63 */
#define MOET_RES_NO_NODE (-1) /* a range whose pages may live anywhere */
#define MOET_RES_LABEL_BYTES 96

typedef struct moet_res moet_res;

/* Returns 0 and an empty set in *out, or MOET_ENOMEM. */
int moet_res_create(moet_res **out);

/* Munlocks the ranges moet_res_lock locked, frees the set. Accepts NULL. */
void moet_res_destroy(moet_res *rs);

/*
 * Registers one mapping: [base, base + n_bytes) must be mapped in this process (checked in
 * /proc/self/maps), by one regular file, readable and not writable. base must be page-aligned
 * (mmap returns such addresses). Errors: MOET_EINVAL (NULL or unaligned base, zero length,
 * writable or anonymous mapping, overlaps a registered mapping), MOET_ERANGE (bytes not
 * mapped, or mapped by more than one file), MOET_EIO (/proc/self/maps unreadable).
 */
int moet_res_add_mapping(moet_res *rs, const void *base, size_t n_bytes);

/*
 * Adds the range [addr, addr + n_bytes) tagged with `node` (a node of this machine, or
 * MOET_RES_NO_NODE), labelled `label` for reports (copied, truncated to
 * MOET_RES_LABEL_BYTES - 1; NULL gives "range ID"). *out_id (may be NULL) gets the range id,
 * 0, 1, ... in order of addition. Errors: MOET_EINVAL (NULL addr, zero length), MOET_ERANGE
 * (not inside one registered mapping, node not present here). Overlaps between ranges are
 * found by the first operation (populate, lock, check, verify), which then fails MOET_EINVAL.
 */
int moet_res_add_range(moet_res *rs, const void *addr, size_t n_bytes, int node,
		       const char *label, int *out_id);

/* Number of ranges. */
size_t moet_res_count(const moet_res *rs);

/* ---- populate -------------------------------------------------------------------------- */

enum {
	MOET_RES_PLACE = 1u << 0, /* one thread per node, bound to that node's cpus, with a
				     preferred-node memory policy, reads that node's ranges */
	MOET_RES_HUGE = 1u << 1,  /* MADV_HUGEPAGE first; skips MADV_WILLNEED (whose order-0
				     readahead would defeat it), so read-around may place up to
				     4 MiB past a range's end on that range's node */
	MOET_RES_TOUCH = 1u << 2, /* force the fallback (WILLNEED + one byte per page) */
};

enum { MOET_RES_BY_POPULATE_READ = 1, MOET_RES_BY_TOUCH = 2 };

typedef struct moet_res_populate_report {
	size_t bytes;                          /* page-rounded bytes read in, all ranges */
	uint64_t ns;                           /* wall time */
	int method;                            /* MOET_RES_BY_*: the last method used */
	int n_threads;                         /* threads that read (one per node used) */
	size_t node_bytes[MOET_RES_MAX_NODES]; /* bytes per node tag (placed runs) */
	uint64_t node_ns[MOET_RES_MAX_NODES];  /* each node thread's time */
	int huge_advised;                      /* MADV_HUGEPAGE accepted on every run */
	size_t pmd_mapped_bytes;               /* FilePmdMapped over the mappings (smaps) */
	char note[512];                        /* huge-page outcome in words, or "" */
} moet_res_populate_report;

/*
 * Makes every page of every range resident; flags MOET_RES_*. With MOET_RES_PLACE, ranges
 * tagged node N are read by a thread bound to node N: call this before anything else reads
 * them, since pages already cached stay where they are (moet_res_verify tells). *out may be
 * NULL. Errors: MOET_EIO (a read failed: I/O error or the file shrank), MOET_EINVAL
 * (overlapping ranges), MOET_ENOMEM.
 */
int moet_res_populate(moet_res *rs, unsigned flags, moet_res_populate_report *out);

/* ---- lock ------------------------------------------------------------------------------ */

typedef struct moet_res_lock_report {
	int locked;          /* 1: every range is mlock'd now */
	size_t bytes;        /* page-rounded bytes of the locked runs */
	size_t n_runs;       /* adjacent ranges merged into runs (each run may split a VMA) */
	uint64_t limit_bytes;/* RLIMIT_MEMLOCK soft limit; UINT64_MAX for unlimited */
	int cap_ipc_lock;    /* CAP_IPC_LOCK in effect: the limit does not apply */
	char note[512];      /* when not locked: why, with the limit and how to raise it */
} moet_res_lock_report;

/*
 * mlocks the ranges (merged into runs of adjacent pages). When RLIMIT_MEMLOCK is too low
 * (and the process lacks CAP_IPC_LOCK), or mlock refuses, nothing stays locked and the
 * report says so with the limit and how to raise it: that is not an error, returns 0.
 * Errors: MOET_EINVAL (overlapping ranges), MOET_ENOMEM. *out may be NULL.
 */
int moet_res_lock(moet_res *rs, moet_res_lock_report *out);

/* munlocks what moet_res_lock locked. Returns 0. */
int moet_res_unlock(moet_res *rs);

/* ---- residency check ------------------------------------------------------------------- */

typedef struct moet_res_check_report {
	size_t stride_pages;                      /* 1: every page; N: every Nth page */
	size_t pages_checked;                     /* over all ranges */
	size_t pages_resident;
	size_t n_lost;                            /* ranges with a checked page not resident */
	size_t node_checked[MOET_RES_MAX_NODES + 1];  /* [0]: untagged, [n + 1]: node n */
	size_t node_resident[MOET_RES_MAX_NODES + 1];
	uint64_t ns;
} moet_res_check_report;

/*
 * mincore() over the ranges' pages: every page when stride_pages is 1, else every
 * stride_pages-th page of each range, starting at a phase that advances by one each call so
 * that stride_pages calls cover every page. The result per range is kept for
 * moet_res_evicted / moet_res_range_get. *out may be NULL. Errors: MOET_EINVAL (stride 0,
 * overlapping ranges), MOET_ERANGE (a mapping is gone).
 */
int moet_res_check(moet_res *rs, size_t stride_pages, moet_res_check_report *out);

/*
 * The ids of ranges that the last check found missing pages, in id order: up to cap of them
 * into out_ids (may be NULL when cap is 0), and their total count in *out_n.
 */
int moet_res_evicted(const moet_res *rs, int *out_ids, size_t cap, size_t *out_n);

/* ---- NUMA placement -------------------------------------------------------------------- */

typedef struct moet_res_verify_report {
	size_t pages;                             /* pages queried (every stride-th) */
	size_t on_node;                           /* on the node the range is tagged with */
	size_t elsewhere;                         /* on another node */
	size_t absent;                            /* not mapped in this process (-ENOENT) */
	size_t untagged;                          /* pages of MOET_RES_NO_NODE ranges */
	size_t node_pages[MOET_RES_MAX_NODES];    /* where the pages are, all ranges */
	size_t n_misplaced;                       /* ranges with a page elsewhere */
	uint64_t ns;
} moet_res_verify_report;

/*
 * move_pages(0, n, pages, NULL, status, 0) over every stride_pages-th page of each range:
 * the node each page is on, kept per range (moet_res_range_get) and summed in *out (may be
 * NULL). On a kernel without NUMA support every present page counts as node 0. Errors:
 * MOET_EINVAL (stride 0, overlapping ranges), MOET_EIO (move_pages failed).
 */
int moet_res_verify(moet_res *rs, size_t stride_pages, moet_res_verify_report *out);

/*
 * The ids of ranges that the last verify found with at least one page on another node than
 * their tag, in id order (as moet_res_evicted).
 */
int moet_res_misplaced(const moet_res *rs, int *out_ids, size_t cap, size_t *out_n);

/*
 * Re-places range `id` (see docs/residency.md): drops this process's page-table entries for
 * the range's interior pages (MADV_DONTNEED: the mapping is a clean private file mapping, so
 * later reads refault the file's bytes), drops those pages from the page cache
 * (posix_fadvise DONTNEED on the file range: it cannot drop pages that another process maps,
 * or that are locked or dirty), then reads them again from a thread bound to the range's
 * node, and verifies. Pages the range shares with a neighbour are left alone.
 * *out_on_node_share (may be NULL) gets the share of its pages now on its node. Errors:
 * MOET_ERANGE (bad id), MOET_EINVAL (the set is locked: unlock first; untagged range),
 * MOET_EIO (the file cannot be reopened, or is not the mapped one).
 */
int moet_res_replace(moet_res *rs, int id, double *out_on_node_share);

/* ---- per range ------------------------------------------------------------------------- */

typedef struct moet_res_range_info {
	const char *label;       /* borrowed from the set */
	const void *addr;
	size_t n_bytes;
	int node;                /* tag, or MOET_RES_NO_NODE */
	size_t span_bytes;       /* page-rounded */
	size_t checked_pages;    /* last check (0: never checked) */
	size_t resident_pages;
	size_t stride_pages;     /* of the last check */
	size_t verified_pages;   /* last verify */
	size_t absent_pages;     /* last verify: not mapped here */
	const size_t *node_pages;/* last verify: [n_node_slots] pages per node, or NULL */
	int n_node_slots;        /* highest node of this machine + 1 */
} moet_res_range_info;

/* Facts about range id. Errors: MOET_ERANGE (bad id). */
int moet_res_range_get(const moet_res *rs, int id, moet_res_range_info *out);

/*
 * One line about range id from the last check and verify, for the engine's warnings, e.g.
 *   "model.layers.3.mlp.experts.17: 25.0% evicted (96 of 384 pages checked, every page)"
 *   "model.layers.3.mlp.experts.17: 100.0% of pages on node 1, tagged node 0"
 * (both facts when both apply, "resident" when neither). Always NUL-terminates buf (cap > 0).
 */
void moet_res_describe(const moet_res *rs, int id, char *buf, size_t cap);

/* ---- pure assignment logic (no NUMA needed; deterministic) ----------------------------- */

typedef struct moet_res_node {
	int node;            /* OS node id, only copied to the result's labels */
	int n_cores;         /* cores its expert workers use (> 0) */
	size_t mem_bytes;    /* bytes it may hold for the CPU tier */
} moet_res_node;

typedef struct moet_res_expert {
	size_t n_bytes;      /* weight bytes read per use */
	double load;         /* expected routed tokens per step (any unit; >= 0, finite) */
} moet_res_expert;

/*
 * Assigns every expert to a node: experts by load, heaviest first (ties: more bytes, then
 * lower index), each to the node where (load so far + its load) / n_cores is lowest among
 * nodes with room for its bytes (ties: lower share of memory used after, then lower index).
 * out_node[n_experts] gets node indices (into nodes[], not OS ids). Bound, when memory does
 * not bind: max per-core load <= total load / total cores + n_nodes x max load / total
 * cores. Errors: MOET_EINVAL (no nodes, n_cores <= 0, negative or non-finite load),
 * MOET_ERANGE (an expert fits on no node: names it, its bytes, the largest room left),
 * MOET_ENOMEM.
 */
int moet_res_assign(const moet_res_node *nodes, int n_nodes, const moet_res_expert *experts,
		    size_t n_experts, int *out_node);

typedef struct moet_res_pu {
	int cpu;             /* OS cpu id */
	int core;            /* physical core, unique over the machine (e.g. its first cpu) */
	int node;            /* NUMA node */
} moet_res_pu;

/*
 * The cpus the workers of `node` use: one per physical core of that node (its lowest cpu
 * id), cores not holding a cpu listed in reserved[n_reserved] (e.g. the engine's thread), in
 * ascending cpu order, at most max_workers (0: all). With smt set, every cpu of those cores.
 * Writes up to cap cpus to out_cpus and the count to *out_n. Errors: MOET_ENOTFOUND (no cpu
 * on that node is left), MOET_ERANGE (cap too small), MOET_EINVAL (negative counts).
 */
int moet_res_node_cpus(const moet_res_pu *pus, int n_pus, int node, const int *reserved,
		       int n_reserved, int max_workers, int smt, int *out_cpus, int cap,
		       int *out_n);

#endif
