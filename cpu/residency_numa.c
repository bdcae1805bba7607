/*
 * residency_numa.c: populate (with first-touch placement), move_pages verification, and
 * re-placement of a range.
 *
 *   populate:  runs grouped by node tag -> one thread per group
 *              thread for node N: sched_setaffinity(cpus of N), set_mempolicy(PREFERRED, N)
 *                for each run: MADV_WILLNEED (exact readahead of the run, allocated now, by
 *                this thread) then MADV_POPULATE_READ (map every page; waits for the reads)
 *
 * NOTE: a page-cache page is allocated by the task that first brings it into the cache, with
 * that task's memory policy (default: the node of the cpu it runs on). mbind() on the mapping
 * does not apply: VMA policies govern anonymous memory, not the page cache. So the binding
 * and the task policy of the reading thread are what place the pages.
 *
 * NOTE: MADV_WILLNEED on a file mapping is readahead of exactly the advised file range.
 * Faulting alone (POPULATE_READ) would read around each fault (up to the readahead window)
 * and could put the first pages of the next range, tagged another node, on this one.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <fcntl.h>
#include <unistd.h>

#include <numa.h>
#include <numaif.h>

#include "moet_err.h"
#include "residency_int.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif
#define VERIFY_CHUNK_PAGES 4096

int res_node_check(const moet_res *rs, int node)
{
	if (node < 0 || node >= MOET_RES_MAX_NODES)
		return moet_err(MOET_ERANGE, "node %d is out of range (0..%d)", node,
				MOET_RES_MAX_NODES - 1);
	if (!rs->numa_ok)
		return node == 0 ? 0 : moet_err(MOET_ERANGE, "node %d does not exist here: the "
						"kernel reports no NUMA (node 0 only)", node);
	if (node > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, node))
		return moet_err(MOET_ERANGE, "node %d does not exist here or has no memory this "
				"process may use (nodes 0..%d)", node, numa_max_node());
	struct bitmask *cpus = numa_allocate_cpumask();
	if (!cpus)
		return moet_err(MOET_ENOMEM, "out of memory");
	int ok = numa_node_to_cpus(node, cpus) == 0 && numa_bitmask_weight(cpus) > 0;
	numa_free_cpumask(cpus);
	return ok ? 0 : moet_err(MOET_ERANGE, "node %d has no cpus to compute on", node);
}

/* Binds the calling thread to node's cpus and prefers node for its allocations. */
static int bind_to_node(int node)
{
	struct bitmask *cpus = numa_allocate_cpumask();
	if (!cpus)
		return moet_err(MOET_ENOMEM, "out of memory");
	int rc = 0;
	if (numa_node_to_cpus(node, cpus) || numa_sched_setaffinity(0, cpus))
		rc = moet_err(MOET_EIO, "cannot bind a thread to the cpus of node %d: %s", node,
			      strerror(errno));
	numa_free_cpumask(cpus);
	if (rc)
		return rc;
	/* NOTE: preferred, not bind: a full node falls back to another rather than failing
	 * the read; verify reports where the pages went. */
	unsigned long mask[2] = {0};
	mask[node / 64] |= 1ul << (node % 64);
	set_mempolicy(MPOL_PREFERRED, mask, sizeof(mask) * 8);
	return 0;
}

int res_read_runs(const res_run *runs, size_t n, unsigned flags, int *out_method,
		  int *out_huge_ok)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	int method = MOET_RES_BY_POPULATE_READ, huge_ok = 1;
	for (size_t i = 0; i < n; i++) {
		void *p = (void *)runs[i].p0;
		size_t len = runs[i].p1 - runs[i].p0;
		if (flags & MOET_RES_HUGE) {
			if (madvise(p, len, MADV_HUGEPAGE))
				huge_ok = 0;
		} else {
			madvise(p, len, MADV_WILLNEED); /* advice: failure only costs speed */
		}
		int touch = (flags & MOET_RES_TOUCH) != 0;
		while (!touch && madvise(p, len, MADV_POPULATE_READ)) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			if (errno == EINVAL) { /* kernel before 5.14 */
				touch = 1;
				break;
			}
			return moet_err(errno == ENOMEM ? MOET_ERANGE : MOET_EIO,
					"reading %zu bytes at %p failed: %s%s", len, p,
					strerror(errno), errno == EFAULT ?
					" (I/O error, or the file is shorter than its mapping)"
							  : "");
		}
		if (touch) {
			method = MOET_RES_BY_TOUCH;
			const volatile unsigned char *b = p;
			unsigned sink = 0;
			for (size_t k = 0; k < len; k += page)
				sink += b[k];
			(void)sink;
		}
	}
	*out_method = method;
	*out_huge_ok = huge_ok;
	return 0;
}

/* ---- populate -------------------------------------------------------------------------- */

typedef struct pop_job {
	const res_run *runs;
	size_t n_runs;
	int node;          /* bind to it, or -1 */
	unsigned flags;
	size_t bytes;
	uint64_t ns;
	int method, huge_ok;
	int rc;
	char err[256];
} pop_job;

static void *pop_worker(void *arg)
{
	pop_job *j = arg;
	uint64_t t0 = res_now_ns();
	j->rc = j->node >= 0 ? bind_to_node(j->node) : 0;
	if (!j->rc)
		j->rc = res_read_runs(j->runs, j->n_runs, j->flags, &j->method, &j->huge_ok);
	if (j->rc)
		snprintf(j->err, sizeof(j->err), "%s", moet_errmsg());
	for (size_t i = 0; i < j->n_runs; i++)
		j->bytes += j->runs[i].p1 - j->runs[i].p0;
	j->ns = res_now_ns() - t0;
	return NULL;
}

static int by_node_then_addr(const void *x, const void *y)
{
	const res_run *a = x, *b = y;
	if (a->node != b->node)
		return a->node < b->node ? -1 : 1;
	return a->p0 < b->p0 ? -1 : a->p0 > b->p0;
}

/* FilePmdMapped summed over the VMAs inside the registered mappings. */
static size_t pmd_mapped_bytes(const moet_res *rs)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	if (!f)
		return 0;
	char buf[512];
	size_t total = 0;
	int inside = 0;
	while (fgets(buf, sizeof(buf), f)) {
		unsigned long s, e, kb;
		if ((buf[0] >= '0' && buf[0] <= '9') || (buf[0] >= 'a' && buf[0] <= 'f')) {
			inside = 0;
			if (sscanf(buf, "%lx-%lx", &s, &e) == 2)
				for (int i = 0; i < rs->n_maps; i++)
					inside |= s < rs->maps[i].end && rs->maps[i].start < e;
		} else if (inside && sscanf(buf, "FilePmdMapped: %lu kB", &kb) == 1) {
			total += kb * 1024;
		}
	}
	fclose(f);
	return total;
}

static void huge_note(const moet_res *rs, moet_res_populate_report *rep)
{
	rep->pmd_mapped_bytes = pmd_mapped_bytes(rs);
	if (!rep->huge_advised)
		snprintf(rep->note, sizeof(rep->note), "MADV_HUGEPAGE refused (a kernel without "
			 "transparent huge pages): 4 KiB pages");
	else if (rep->pmd_mapped_bytes == 0)
		snprintf(rep->note, sizeof(rep->note), "MADV_HUGEPAGE accepted, but the page "
			 "cache gave no PMD-mapped huge pages (FilePmdMapped 0 kB): this "
			 "filesystem or kernel keeps small folios for file data (needs large-folio "
			 "support, as XFS and recent ext4 have; tmpfs only when mounted huge=)");
	else
		snprintf(rep->note, sizeof(rep->note), "huge pages: %zu of %zu bytes PMD-mapped",
			 rep->pmd_mapped_bytes, rep->bytes);
}

int moet_res_populate(moet_res *rs, unsigned flags, moet_res_populate_report *out)
{
	moet_res_populate_report rep = { .huge_advised = 1 };
	res_run *runs = NULL;
	size_t n_runs = 0, n_jobs = 0;
	pop_job *jobs = NULL;
	pthread_t *tids = NULL;
	int rc = res_finalize(rs);
	if (rc)
		return rc;
	int place = (flags & MOET_RES_PLACE) && rs->numa_ok;
	rc = res_runs(rs, place, &runs, &n_runs);
	if (rc)
		return rc;
	if (!place)
		for (size_t i = 0; i < n_runs; i++)
			runs[i].node = -1;
	qsort(runs, n_runs, sizeof(*runs), by_node_then_addr);
	jobs = calloc(n_runs ? n_runs : 1, sizeof(*jobs));
	tids = calloc(n_runs ? n_runs : 1, sizeof(*tids));
	if (!jobs || !tids) {
		rc = moet_err(MOET_ENOMEM, "residency: out of memory");
		goto fail;
	}
	for (size_t i = 0; i < n_runs; i++) {
		if (!n_jobs || jobs[n_jobs - 1].node != runs[i].node)
			jobs[n_jobs++] = (pop_job){ .runs = &runs[i], .node = runs[i].node,
						    .flags = flags };
		jobs[n_jobs - 1].n_runs++;
	}
	uint64_t t0 = res_now_ns();
	size_t started = 0;
	for (; started < n_jobs; started++)
		if (pthread_create(&tids[started], NULL, pop_worker, &jobs[started])) {
			rc = moet_err(MOET_ENOMEM, "residency: cannot start a populate thread");
			break;
		}
	for (size_t i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	rep.ns = res_now_ns() - t0;
	rep.n_threads = (int)started;
	for (size_t i = 0; i < started; i++) {
		if (jobs[i].rc && !rc)
			rc = moet_err(jobs[i].rc, "residency: %s", jobs[i].err);
		rep.bytes += jobs[i].bytes;
		if (jobs[i].node >= 0) {
			rep.node_bytes[jobs[i].node] += jobs[i].bytes;
			rep.node_ns[jobs[i].node] = jobs[i].ns;
		}
		if (jobs[i].method)
			rep.method = jobs[i].method;
		rep.huge_advised &= jobs[i].huge_ok;
	}
	if (rc)
		goto fail;
	if (flags & MOET_RES_HUGE)
		huge_note(rs, &rep);
	else
		rep.huge_advised = 0;
	if (out)
		*out = rep;
fail:
	free(tids);
	free(jobs);
	free(runs);
	return rc;
}

/* ---- verify ---------------------------------------------------------------------------- */

static int verify_range(moet_res *rs, size_t id, size_t stride, void **pages, int *status,
			size_t chunk, unsigned char *vec)
{
	res_range *r = &rs->ranges[id];
	size_t *h = rs->hist + id * rs->n_slots;
	size_t npages = (r->p1 - r->p0) / rs->page;
	memset(h, 0, (size_t)rs->n_slots * sizeof(*h));
	r->verified = r->absent = r->elsewhere = 0;
	for (size_t k = 0; k < npages;) {
		size_t cnt = 0;
		for (; k < npages && cnt < chunk; k += stride)
			pages[cnt++] = (void *)(r->p0 + k * rs->page);
		long got = rs->numa_ok ? move_pages(0, cnt, pages, NULL, status, 0) : -1;
		if (got < 0 && rs->numa_ok && errno != ENOSYS)
			return moet_err(MOET_EIO, "residency: %s: move_pages query failed: %s",
					r->label, strerror(errno));
		if (got < 0) { /* no NUMA: a page present is on node 0 */
			for (size_t j = 0; j < cnt; j++)
				status[j] = mincore(pages[j], rs->page, vec) == 0 && (vec[0] & 1)
						    ? 0 : -ENOENT;
		}
		for (size_t j = 0; j < cnt; j++) {
			if (status[j] >= 0 && status[j] < rs->n_slots)
				h[status[j]]++;
			else
				r->absent++;
		}
		r->verified += cnt;
	}
	if (r->node >= 0)
		r->elsewhere = r->verified - r->absent - (r->node < rs->n_slots ? h[r->node] : 0);
	return 0;
}

/* Sizes hist for every range; new rows are zero (never verified). */
static int grow_hist(moet_res *rs)
{
	if (rs->hist_n >= rs->n)
		return 0;
	size_t row = (size_t)rs->n_slots;
	size_t *nh = realloc(rs->hist, rs->n * row * sizeof(*nh));
	if (!nh)
		return moet_err(MOET_ENOMEM, "residency: out of memory");
	memset(nh + rs->hist_n * row, 0, (rs->n - rs->hist_n) * row * sizeof(*nh));
	rs->hist = nh;
	rs->hist_n = rs->n;
	return 0;
}

int moet_res_verify(moet_res *rs, size_t stride_pages, moet_res_verify_report *out)
{
	if (stride_pages == 0)
		return moet_err(MOET_EINVAL, "residency: verify stride is 0 pages");
	int rc = res_finalize(rs);
	if (rc)
		return rc;
	rc = grow_hist(rs);
	if (rc)
		return rc;
	void **pages = malloc(VERIFY_CHUNK_PAGES * sizeof(*pages));
	int *status = malloc(VERIFY_CHUNK_PAGES * sizeof(*status));
	unsigned char vec[1];
	if (!pages || !status) {
		rc = moet_err(MOET_ENOMEM, "residency: out of memory");
		goto done;
	}
	moet_res_verify_report rep = {0};
	uint64_t t0 = res_now_ns();
	for (size_t i = 0; i < rs->n; i++) {
		rc = verify_range(rs, i, stride_pages, pages, status, VERIFY_CHUNK_PAGES, vec);
		if (rc)
			goto done;
		const res_range *r = &rs->ranges[i];
		const size_t *h = rs->hist + i * rs->n_slots;
		rep.pages += r->verified;
		rep.absent += r->absent;
		for (int k = 0; k < rs->n_slots; k++)
			rep.node_pages[k] += h[k];
		if (r->node < 0) {
			rep.untagged += r->verified - r->absent;
		} else {
			rep.elsewhere += r->elsewhere;
			rep.on_node += r->verified - r->absent - r->elsewhere;
			rep.n_misplaced += r->elsewhere > 0;
		}
	}
	rs->verified = 1;
	rep.ns = res_now_ns() - t0;
	if (out)
		*out = rep;
done:
	free(pages);
	free(status);
	return rc;
}

int moet_res_misplaced(const moet_res *rs, int *out_ids, size_t cap, size_t *out_n)
{
	size_t n = 0;
	for (size_t i = 0; rs->verified && i < rs->n; i++)
		if (rs->ranges[i].node >= 0 && rs->ranges[i].elsewhere) {
			if (n < cap)
				out_ids[n] = (int)i;
			n++;
		}
	*out_n = n;
	return 0;
}

/* ---- replace --------------------------------------------------------------------------- */

int moet_res_replace(moet_res *rs, int id, double *out_on_node_share)
{
	if (id < 0 || (size_t)id >= rs->n)
		return moet_err(MOET_ERANGE, "residency: no range %d (%zu ranges)", id, rs->n);
	res_range *r = &rs->ranges[id];
	if (rs->n_locked)
		return moet_err(MOET_EINVAL, "residency: %s: the set is locked; unlock before "
				"re-placing (locked pages cannot be dropped)", r->label);
	if (r->node < 0)
		return moet_err(MOET_EINVAL, "residency: %s has no node to be placed on",
				r->label);
	int rc = res_finalize(rs);
	if (rc)
		return rc;
	const res_mapping *m = &rs->maps[r->mapping];
	/* interior pages: those no neighbour shares */
	uintptr_t i0 = r->addr % rs->page ? r->p0 + rs->page : r->p0;
	uintptr_t e = r->addr + r->n_bytes;
	uintptr_t i1 = e - e % rs->page;
	if (i1 > i0) {
		int fd = open(m->path, O_RDONLY | O_CLOEXEC);
		struct stat st;
		if (fd < 0)
			return moet_err(MOET_EIO, "residency: %s: cannot reopen %s: %s", r->label,
					m->path, strerror(errno));
		if (fstat(fd, &st) || st.st_ino != m->ino || major(st.st_dev) != m->dev_major ||
		    minor(st.st_dev) != m->dev_minor) {
			close(fd);
			return moet_err(MOET_EIO, "residency: %s: %s is no longer the mapped file",
					r->label, m->path);
		}
		/* NOTE: MADV_DONTNEED first: the page cache keeps pages that are mapped */
		int bad = madvise((void *)i0, i1 - i0, MADV_DONTNEED) ||
			  posix_fadvise(fd, (off_t)(m->file_off + (i0 - m->start)),
					(off_t)(i1 - i0), POSIX_FADV_DONTNEED);
		close(fd);
		if (bad)
			return moet_err(MOET_EIO, "residency: %s: dropping its pages failed: %s",
					r->label, strerror(errno));
	}
	res_run run = { .p0 = r->p0, .p1 = r->p1, .node = r->node };
	pop_job job = { .runs = &run, .n_runs = 1, .node = rs->numa_ok ? r->node : -1 };
	pthread_t tid;
	if (pthread_create(&tid, NULL, pop_worker, &job))
		return moet_err(MOET_ENOMEM, "residency: cannot start a populate thread");
	pthread_join(tid, NULL);
	if (job.rc)
		return moet_err(job.rc, "residency: %s", job.err);
	void *pages[VERIFY_CHUNK_PAGES / 64];
	int status[VERIFY_CHUNK_PAGES / 64];
	unsigned char vec[1];
	rc = grow_hist(rs);
	if (!rc)
		rc = verify_range(rs, (size_t)id, 1, pages, status, VERIFY_CHUNK_PAGES / 64, vec);
	if (rc)
		return rc;
	rs->verified = 1;
	if (out_on_node_share)
		*out_on_node_share = r->verified ? (double)(r->verified - r->absent -
							    r->elsewhere) / (double)r->verified
						 : 0.0;
	return 0;
}
