/*
 * residency.c: the residency set (mappings and ranges), the mincore check, mlock, and the
 * per-range reports. Populate, NUMA verification and re-placement are in residency_numa.c;
 * the pure assignment logic in residency_assign.c.
 *
 * NOTE: mappings are validated against /proc/self/maps rather than trusted: a range that
 * is not backed by a read-only file mapping would make mlock copy pages (a writable private
 * mapping is locked by faulting it for write) and make the page-cache story of
 * docs/residency.md false. The same line gives the file identity (device, inode, offset)
 * that moet_res_replace needs to drop the file's pages.
 *
 * NOTE: lock works on runs (touching ranges merged), not ranges: each mlock'd region is a
 * VMA of its own, and a Kimi-K2 CPU tier has ~70,000 expert tensors against a default
 * vm.max_map_count of 65,530.
 *
 * NOTE: mlock and munlock are called through syscall(): the sanitizers' runtimes replace
 * the libc functions with no-ops that return success (locking their shadow memory would be
 * ruinous), and the report must say what the kernel did, in every build.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <numa.h>

#include "moet_err.h"
#include "residency_int.h"

#define CHECK_CHUNK_PAGES 65536 /* mincore vector per call: 64 KiB */

int moet_res_create(moet_res **out)
{
	moet_res *rs = calloc(1, sizeof(*rs));
	if (!rs)
		return moet_err(MOET_ENOMEM, "residency: out of memory");
	long pg = sysconf(_SC_PAGESIZE);
	rs->page = pg > 0 ? (size_t)pg : 4096;
	rs->numa_ok = numa_available() >= 0;
	rs->n_slots = rs->numa_ok ? numa_max_node() + 1 : 1;
	if (rs->n_slots < 1)
		rs->n_slots = 1;
	if (rs->n_slots > MOET_RES_MAX_NODES)
		rs->n_slots = MOET_RES_MAX_NODES;
	*out = rs;
	return 0;
}

void moet_res_destroy(moet_res *rs)
{
	if (!rs)
		return;
	moet_res_unlock(rs);
	for (int i = 0; i < rs->n_maps; i++)
		free(rs->maps[i].path);
	free(rs->maps);
	free(rs->ranges);
	free(rs->order);
	free(rs->hist);
	free(rs);
}

/* ---- mappings ------------------------------------------------------------------------- */

typedef struct maps_line {
	uintptr_t start, end;
	char perms[5];
	uint64_t off;
	unsigned maj, min;
	uint64_t ino;
	const char *path; /* points into the line buffer */
} maps_line;

static int parse_maps_line(char *line, maps_line *ml)
{
	unsigned long s, e;
	unsigned long long off, ino;
	int pos = 0;
	if (sscanf(line, "%lx-%lx %4s %llx %x:%x %llu %n", &s, &e, ml->perms, &off, &ml->maj,
		   &ml->min, &ino, &pos) < 7)
		return -1;
	ml->start = s;
	ml->end = e;
	ml->off = off;
	ml->ino = ino;
	char *p = line + pos;
	size_t len = strlen(p);
	while (len && (p[len - 1] == '\n' || p[len - 1] == ' '))
		p[--len] = '\0';
	ml->path = p;
	return 0;
}

int moet_res_add_mapping(moet_res *rs, const void *base, size_t n_bytes)
{
	uintptr_t b = (uintptr_t)base, e = b + n_bytes;
	if (!base)
		return moet_err(MOET_EINVAL, "residency: mapping base is NULL");
	if (b % rs->page)
		return moet_err(MOET_EINVAL, "residency: mapping base %p is not page-aligned (%zu)",
				base, rs->page);
	if (n_bytes == 0)
		return moet_err(MOET_EINVAL, "residency: mapping at %p has zero length", base);
	if (e < b)
		return moet_err(MOET_ERANGE, "residency: mapping at %p wraps the address space",
				base);
	for (int i = 0; i < rs->n_maps; i++)
		if (b < rs->maps[i].end && rs->maps[i].start < e)
			return moet_err(MOET_EINVAL, "residency: mapping at %p overlaps the one at "
					"%p (%s)", base, (void *)rs->maps[i].start,
					rs->maps[i].path);

	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return moet_err(MOET_EIO, "residency: /proc/self/maps: %s", strerror(errno));
	char *line = NULL;
	size_t line_cap = 0;
	int rc = 0, found = 0;
	uintptr_t cursor = b; /* next byte that a VMA must cover */
	res_mapping m = {0};
	while (cursor < e && getline(&line, &line_cap, f) > 0) {
		maps_line ml;
		if (parse_maps_line(line, &ml) || ml.end <= cursor)
			continue;
		if (ml.start > cursor)
			break; /* a hole */
		if (ml.ino == 0 || ml.path[0] != '/') {
			rc = moet_err(MOET_EINVAL, "residency: %p is in an anonymous mapping, "
				      "not a file's", (void *)cursor);
			goto fail;
		}
		if (ml.perms[0] != 'r' || ml.perms[1] == 'w') {
			rc = moet_err(MOET_EINVAL, "residency: %s is mapped %s at %p: a read-only "
				      "mapping is required", ml.path, ml.perms, (void *)cursor);
			goto fail;
		}
		uint64_t off_here = ml.off + (cursor - ml.start);
		if (!found) {
			m.start = b;
			m.end = e;
			m.file_off = off_here;
			m.dev_major = ml.maj;
			m.dev_minor = ml.min;
			m.ino = ml.ino;
			m.path = strdup(ml.path);
			if (!m.path) {
				rc = moet_err(MOET_ENOMEM, "residency: out of memory");
				goto fail;
			}
			found = 1;
		} else if (ml.ino != m.ino || ml.maj != m.dev_major || ml.min != m.dev_minor ||
			   off_here != m.file_off + (cursor - b)) {
			rc = moet_err(MOET_ERANGE, "residency: bytes %p..%p are mapped from more "
				      "than one file or file range (%s, %s)", base, (void *)e,
				      m.path, ml.path);
			goto fail;
		}
		cursor = ml.end;
	}
	if (cursor < e) {
		rc = moet_err(MOET_ERANGE, "residency: bytes %p..%p are not all mapped (hole at "
			      "%p)", base, (void *)e, (void *)cursor);
		goto fail;
	}
	if (rs->n_maps == rs->cap_maps) {
		int nc = rs->cap_maps ? 2 * rs->cap_maps : 8;
		res_mapping *nm = realloc(rs->maps, (size_t)nc * sizeof(*nm));
		if (!nm) {
			rc = moet_err(MOET_ENOMEM, "residency: out of memory");
			goto fail;
		}
		rs->maps = nm;
		rs->cap_maps = nc;
	}
	rs->maps[rs->n_maps++] = m;
	free(line);
	fclose(f);
	return 0;
fail:
	free(m.path);
	free(line);
	fclose(f);
	return rc;
}

/* ---- ranges ---------------------------------------------------------------------------- */

int moet_res_add_range(moet_res *rs, const void *addr, size_t n_bytes, int node,
		       const char *label, int *out_id)
{
	uintptr_t a = (uintptr_t)addr, e = a + n_bytes;
	const char *what = label ? label : "range";
	if (!addr)
		return moet_err(MOET_EINVAL, "residency: %s: address is NULL", what);
	if (n_bytes == 0)
		return moet_err(MOET_EINVAL, "residency: %s: zero-length range at %p", what, addr);
	int mi = -1;
	for (int i = 0; i < rs->n_maps && mi < 0; i++)
		if (a >= rs->maps[i].start && e <= rs->maps[i].end && e > a)
			mi = i;
	if (mi < 0)
		return moet_err(MOET_ERANGE, "residency: %s: bytes %p..%p are not inside one "
				"registered mapping", what, addr, (void *)e);
	if (node != MOET_RES_NO_NODE) {
		int rc = res_node_check(rs, node);
		if (rc)
			return moet_err_prefix(rc, "residency: %s", what);
	}
	if (rs->n > (size_t)INT32_MAX)
		return moet_err(MOET_ERANGE, "residency: too many ranges");
	if (rs->n == rs->cap) {
		size_t nc = rs->cap ? 2 * rs->cap : 64;
		res_range *nr = realloc(rs->ranges, nc * sizeof(*nr));
		if (!nr)
			return moet_err(MOET_ENOMEM, "residency: out of memory");
		rs->ranges = nr;
		rs->cap = nc;
	}
	res_range *r = &rs->ranges[rs->n];
	memset(r, 0, sizeof(*r));
	r->addr = a;
	r->n_bytes = n_bytes;
	r->p0 = a - a % rs->page;
	r->p1 = e % rs->page ? e + (rs->page - e % rs->page) : e;
	r->node = node;
	r->mapping = mi;
	if (label)
		snprintf(r->label, sizeof(r->label), "%s", label);
	else
		snprintf(r->label, sizeof(r->label), "range %zu", rs->n);
	if (out_id)
		*out_id = (int)rs->n;
	rs->n++;
	rs->verified = 0;
	return 0;
}

size_t moet_res_count(const moet_res *rs) { return rs->n; }

static int by_addr(const void *x, const void *y, void *ctx)
{
	const moet_res *rs = ctx;
	const res_range *a = &rs->ranges[*(const size_t *)x];
	const res_range *b = &rs->ranges[*(const size_t *)y];
	if (a->addr != b->addr)
		return a->addr < b->addr ? -1 : 1;
	return *(const size_t *)x < *(const size_t *)y ? -1 : 1;
}

int res_finalize(moet_res *rs)
{
	if (rs->sorted_n == rs->n && rs->order)
		return 0;
	size_t *o = realloc(rs->order, (rs->n ? rs->n : 1) * sizeof(*o));
	if (!o)
		return moet_err(MOET_ENOMEM, "residency: out of memory");
	rs->order = o;
	for (size_t i = 0; i < rs->n; i++)
		o[i] = i;
	qsort_r(o, rs->n, sizeof(*o), by_addr, rs);
	rs->sorted_n = 0;
	for (size_t i = 1; i < rs->n; i++) {
		const res_range *a = &rs->ranges[o[i - 1]], *b = &rs->ranges[o[i]];
		if (a->addr + a->n_bytes > b->addr)
			return moet_err(MOET_EINVAL, "residency: ranges %s and %s overlap",
					a->label, b->label);
	}
	rs->sorted_n = rs->n;
	return 0;
}

int res_runs(const moet_res *rs, int by_node, res_run **out, size_t *out_n)
{
	res_run *runs = malloc((rs->n ? rs->n : 1) * sizeof(*runs));
	if (!runs)
		return moet_err(MOET_ENOMEM, "residency: out of memory");
	size_t n = 0;
	for (size_t i = 0; i < rs->n; i++) {
		const res_range *r = &rs->ranges[rs->order[i]];
		if (n && runs[n - 1].p1 >= r->p0 && (!by_node || runs[n - 1].node == r->node) &&
		    rs->ranges[rs->order[i - 1]].mapping == r->mapping) {
			if (r->p1 > runs[n - 1].p1)
				runs[n - 1].p1 = r->p1;
			continue;
		}
		runs[n++] = (res_run){ .p0 = r->p0, .p1 = r->p1, .node = r->node };
	}
	*out = runs;
	*out_n = n;
	return 0;
}

/* ---- residency check ------------------------------------------------------------------- */

static int check_range(moet_res *rs, res_range *r, size_t stride, unsigned char *vec)
{
	size_t npages = (r->p1 - r->p0) / rs->page;
	r->checked = r->resident = 0;
	r->stride = stride;
	if (stride == 1) {
		for (size_t k = 0; k < npages; k += CHECK_CHUNK_PAGES) {
			size_t cnt = npages - k;
			if (cnt > CHECK_CHUNK_PAGES)
				cnt = CHECK_CHUNK_PAGES;
			if (mincore((void *)(r->p0 + k * rs->page), cnt * rs->page, vec))
				goto gone;
			for (size_t j = 0; j < cnt; j++)
				r->resident += vec[j] & 1;
			r->checked += cnt;
		}
		return 0;
	}
	size_t k = rs->phase % stride;
	if (k >= npages)
		k = rs->phase % npages;
	for (; k < npages; k += stride) {
		if (mincore((void *)(r->p0 + k * rs->page), rs->page, vec))
			goto gone;
		r->resident += vec[0] & 1;
		r->checked++;
	}
	return 0;
gone:
	return moet_err(MOET_ERANGE, "residency: %s: mincore failed (%s): is the mapping gone?",
			r->label, strerror(errno));
}

int moet_res_check(moet_res *rs, size_t stride_pages, moet_res_check_report *out)
{
	if (stride_pages == 0)
		return moet_err(MOET_EINVAL, "residency: check stride is 0 pages");
	int rc = res_finalize(rs);
	if (rc)
		return rc;
	unsigned char *vec = malloc(CHECK_CHUNK_PAGES);
	if (!vec)
		return moet_err(MOET_ENOMEM, "residency: out of memory");
	moet_res_check_report rep = { .stride_pages = stride_pages };
	uint64_t t0 = res_now_ns();
	for (size_t i = 0; i < rs->n; i++) {
		res_range *r = &rs->ranges[i];
		rc = check_range(rs, r, stride_pages, vec);
		if (rc)
			goto done;
		int slot = r->node + 1;
		rep.pages_checked += r->checked;
		rep.pages_resident += r->resident;
		rep.node_checked[slot] += r->checked;
		rep.node_resident[slot] += r->resident;
		rep.n_lost += r->resident < r->checked;
	}
	if (stride_pages > 1)
		rs->phase++;
	rep.ns = res_now_ns() - t0;
	if (out)
		*out = rep;
done:
	free(vec);
	return rc;
}

int moet_res_evicted(const moet_res *rs, int *out_ids, size_t cap, size_t *out_n)
{
	size_t n = 0;
	for (size_t i = 0; i < rs->n; i++)
		if (rs->ranges[i].resident < rs->ranges[i].checked) {
			if (n < cap)
				out_ids[n] = (int)i;
			n++;
		}
	*out_n = n;
	return 0;
}

/* ---- lock ------------------------------------------------------------------------------ */

static int sys_mlock(uintptr_t p, size_t len) { return (int)syscall(SYS_mlock, p, len); }
static int sys_munlock(uintptr_t p, size_t len) { return (int)syscall(SYS_munlock, p, len); }

/* CAP_IPC_LOCK (bit 14) in CapEff of /proc/self/status; VmLck in bytes. */
static void read_status(int *out_cap, uint64_t *out_vmlck)
{
	*out_cap = 0;
	*out_vmlck = 0;
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return;
	char buf[256];
	while (fgets(buf, sizeof(buf), f)) {
		unsigned long long v;
		if (sscanf(buf, "CapEff: %llx", &v) == 1)
			*out_cap = (int)((v >> 14) & 1);
		else if (sscanf(buf, "VmLck: %llu kB", &v) == 1)
			*out_vmlck = v * 1024;
	}
	fclose(f);
}

static void limit_note(char *note, size_t cap, const char *why, size_t bytes, uint64_t limit)
{
	char lim[32];
	if (limit == UINT64_MAX)
		snprintf(lim, sizeof(lim), "unlimited");
	else
		snprintf(lim, sizeof(lim), "%" PRIu64 " KiB", limit / 1024);
	snprintf(note, cap, "not locked: %s (need %zu KiB, RLIMIT_MEMLOCK %s); raise it with "
		 "`ulimit -l unlimited` in the launching shell, `memlock` in "
		 "/etc/security/limits.conf, LimitMEMLOCK=infinity (systemd) or "
		 "--ulimit memlock=-1 (docker), or grant CAP_IPC_LOCK", why, bytes / 1024, lim);
}

int moet_res_lock(moet_res *rs, moet_res_lock_report *out)
{
	moet_res_lock_report rep = {0};
	res_run *runs = NULL;
	size_t n_runs = 0;
	int rc = res_finalize(rs);
	if (rc)
		return rc;
	moet_res_unlock(rs);
	rc = res_runs(rs, 0, &runs, &n_runs);
	if (rc)
		return rc;
	rep.n_runs = n_runs;
	for (size_t i = 0; i < n_runs; i++)
		rep.bytes += runs[i].p1 - runs[i].p0;
	struct rlimit rl;
	rep.limit_bytes = UINT64_MAX;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		rep.limit_bytes = (uint64_t)rl.rlim_cur;
	uint64_t vmlck;
	read_status(&rep.cap_ipc_lock, &vmlck);
	if (!rep.cap_ipc_lock && rep.limit_bytes != UINT64_MAX &&
	    vmlck + rep.bytes > rep.limit_bytes) {
		limit_note(rep.note, sizeof(rep.note), "the limit is too low", rep.bytes,
			   rep.limit_bytes);
		goto done;
	}
	for (size_t i = 0; i < n_runs; i++) {
		if (sys_mlock(runs[i].p0, runs[i].p1 - runs[i].p0) == 0)
			continue;
		int e = errno;
		for (size_t j = 0; j < i; j++)
			sys_munlock(runs[j].p0, runs[j].p1 - runs[j].p0);
		if (e == ENOMEM || e == EPERM)
			limit_note(rep.note, sizeof(rep.note), e == ENOMEM ?
				   "mlock: ENOMEM (the limit, or vm.max_map_count for many runs)" :
				   "mlock: EPERM", rep.bytes, rep.limit_bytes);
		else
			snprintf(rep.note, sizeof(rep.note), "not locked: mlock failed: %s",
				 strerror(e));
		goto done;
	}
	rep.locked = 1;
	rs->locked = runs;
	rs->n_locked = n_runs;
	runs = NULL;
done:
	free(runs);
	if (out)
		*out = rep;
	return 0;
}

int moet_res_unlock(moet_res *rs)
{
	for (size_t i = 0; i < rs->n_locked; i++)
		sys_munlock(rs->locked[i].p0, rs->locked[i].p1 - rs->locked[i].p0);
	free(rs->locked);
	rs->locked = NULL;
	rs->n_locked = 0;
	return 0;
}

/* ---- per range ------------------------------------------------------------------------- */

int moet_res_range_get(const moet_res *rs, int id, moet_res_range_info *out)
{
	if (id < 0 || (size_t)id >= rs->n)
		return moet_err(MOET_ERANGE, "residency: no range %d (%zu ranges)", id, rs->n);
	const res_range *r = &rs->ranges[id];
	*out = (moet_res_range_info){
		.label = r->label, .addr = (const void *)r->addr, .n_bytes = r->n_bytes,
		.node = r->node, .span_bytes = r->p1 - r->p0, .checked_pages = r->checked,
		.resident_pages = r->resident, .stride_pages = r->stride,
		.verified_pages = r->verified, .absent_pages = r->absent,
		.node_pages = rs->verified && rs->hist ? rs->hist + (size_t)id * rs->n_slots
						       : NULL,
		.n_node_slots = rs->n_slots,
	};
	return 0;
}

/* snprintf at buf[*len], keeping *len within cap - 1 (the output is truncated, not overrun) */
__attribute__((format(printf, 4, 5)))
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
	va_end(ap);
	if (n > 0)
		*len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

void moet_res_describe(const moet_res *rs, int id, char *buf, size_t cap)
{
	if (!cap)
		return;
	buf[0] = '\0';
	size_t len = 0;
	if (id < 0 || (size_t)id >= rs->n) {
		append(buf, cap, &len, "no range %d", id);
		return;
	}
	const res_range *r = &rs->ranges[id];
	append(buf, cap, &len, "%s:", r->label);
	int said = 0;
	if (r->resident < r->checked) {
		char every[48];
		if (r->stride == 1)
			snprintf(every, sizeof(every), "every page");
		else
			snprintf(every, sizeof(every), "1 page in %zu", r->stride);
		append(buf, cap, &len, " %.1f%% evicted (%zu of %zu pages checked, %s)",
		       100.0 * (double)(r->checked - r->resident) / (double)r->checked,
		       r->checked - r->resident, r->checked, every);
		said = 1;
	}
	if (rs->verified && rs->hist && r->node >= 0 && r->elsewhere) {
		const size_t *h = rs->hist + (size_t)id * rs->n_slots;
		int top = -1;
		for (int k = 0; k < rs->n_slots; k++)
			if (k != r->node && (top < 0 || h[k] > h[top]))
				top = k;
		append(buf, cap, &len, "%s %.1f%% of pages on node %d (%zu of %zu queried), "
		       "tagged node %d", said ? ";" : "",
		       100.0 * (double)r->elsewhere / (double)r->verified, top, r->elsewhere,
		       r->verified, r->node);
		said = 1;
	}
	if (!said)
		append(buf, cap, &len, "%s", r->checked || r->verified ? " resident"
								 : " not checked");
}
