/*
 * residency_int.h: internals of the residency set shared by residency.c (set, mappings,
 * check, lock, reports) and residency_numa.c (populate, verify, replace). Not public.
 *
 *   moet_res
 *     maps[n_maps]      registered mappings, with their file identity from /proc/self/maps
 *     ranges[n]         in order of addition (ids); order[n] sorts them by address once an
 *                       operation needs it (res_finalize), which also rejects overlaps
 *     hist[n][n_slots]  pages per node from the last verify (n_slots = highest node + 1)
 *     locked runs       what moet_res_lock mlock'd, for unlock and destroy
 */
#ifndef MOET_RESIDENCY_INT_H
#define MOET_RESIDENCY_INT_H

#include <stdint.h>
#include <time.h>

#include "moet_residency.h"

typedef struct res_mapping {
	uintptr_t start, end;    /* registered bytes [start, end) */
	uint64_t file_off;       /* file offset of start */
	unsigned dev_major, dev_minor;
	uint64_t ino;
	char *path;              /* owned; as /proc/self/maps shows it */
} res_mapping;

typedef struct res_range {
	uintptr_t addr;
	size_t n_bytes;
	uintptr_t p0, p1;        /* page-rounded span [p0, p1) */
	int node;                /* tag, or MOET_RES_NO_NODE */
	int mapping;             /* index into maps */
	char label[MOET_RES_LABEL_BYTES];
	size_t checked, resident, stride;   /* last check */
	size_t verified, absent, elsewhere; /* last verify */
} res_range;

typedef struct res_run {
	uintptr_t p0, p1;        /* page-aligned */
	int node;                /* the node of its ranges (runs never mix nodes when by_node) */
} res_run;

struct moet_res {
	size_t page;             /* bytes per base page */
	res_mapping *maps;
	int n_maps, cap_maps;
	res_range *ranges;
	size_t n, cap;
	size_t *order;           /* ids by address, valid for the first sorted_n additions */
	size_t sorted_n;
	size_t phase;            /* sampled check: the next starting page within the stride */
	int numa_ok;             /* libnuma says the kernel has NUMA */
	int n_slots;             /* highest node + 1 */
	size_t *hist;            /* [hist_n][n_slots] */
	size_t hist_n;
	int verified;            /* a verify ran since the last range was added */
	res_run *locked;         /* runs mlock'd by moet_res_lock */
	size_t n_locked;
};

/* Sorts the ranges by address and rejects overlaps (MOET_EINVAL naming both). */
int res_finalize(moet_res *rs);

/*
 * Merges the address-sorted ranges into runs of touching page spans within one mapping;
 * with by_node, only ranges of the same tag merge. *out is malloc'd.
 */
int res_runs(const moet_res *rs, int by_node, res_run **out, size_t *out_n);

/* Reads runs[0..n) in from the calling thread (the populate step proper). */
int res_read_runs(const res_run *runs, size_t n, unsigned flags, int *out_method,
		  int *out_huge_ok);

/* Whether node exists here with memory and cpus (MOET_ERANGE with the detail if not). */
int res_node_check(const moet_res *rs, int node);

static inline uint64_t res_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
