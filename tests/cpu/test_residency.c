/*
 * test_residency.c: the residency set on a real 8 MiB file mapped like a checkpoint shard
 * (read-only, MAP_SHARED, whole), checked against the kernel's own accounts read
 * independently here: mincore() written out in the test, /proc/self/numa_maps, VmLck in
 * /proc/self/status. Then the pure assignment logic on synthetic 2- and 4-node machines, and
 * bad input.
 *
 *   file pages   0 ............ 256 ........... 768 ......... 1280 .. 1536 ....... 2047
 *   ranges       [r0 node 0   ][r1 node 0      ][r2 node 0    ]  gap   [r3 untagged  ]
 *                (unaligned ends: r0/r1 and r1/r2 share a page)
 *
 * Kernel behaviour that a filesystem may not give (posix_fadvise DONTNEED dropping clean
 * pages) is probed first; assertions that need it are skipped with a message otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moet_err.h"
#include "moet_residency.h"
#include "moet_test.h"

#define FILE_PAGES 2048

static size_t PG;
static unsigned char *base;  /* the mapping */
static size_t map_bytes;
static int fd = -1;

/* The test's own mincore: resident pages among [p, p + n_pages). */
static size_t resident_pages(const void *p, size_t n_pages)
{
	unsigned char *vec = malloc(n_pages);
	size_t n = 0;
	if (vec && mincore((void *)p, n_pages * PG, vec) == 0)
		for (size_t i = 0; i < n_pages; i++)
			n += vec[i] & 1;
	free(vec);
	return n;
}

/* Drop pages [first, first + n) of the file from this process and the page cache. */
static void drop_pages(size_t first, size_t n)
{
	madvise(base + first * PG, n * PG, MADV_DONTNEED);
	posix_fadvise(fd, (off_t)(first * PG), (off_t)(n * PG), POSIX_FADV_DONTNEED);
}

/* Sum of N<node>= over the numa_maps lines of VMAs inside the mapping; -1 if unreadable. */
static long numa_maps_pages(int node)
{
	FILE *f = fopen("/proc/self/numa_maps", "r");
	if (!f)
		return -1;
	char line[4096], key[16];
	long total = 0;
	snprintf(key, sizeof(key), " N%d=", node);
	while (fgets(line, sizeof(line), f)) {
		unsigned long start = strtoul(line, NULL, 16);
		if (start < (uintptr_t)base || start >= (uintptr_t)base + map_bytes)
			continue;
		char *p = strstr(line, key);
		if (p)
			total += strtol(p + strlen(key), NULL, 10);
	}
	fclose(f);
	return total;
}

static long vmlck_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char buf[256];
	long kb = -1;
	while (f && fgets(buf, sizeof(buf), f))
		if (sscanf(buf, "VmLck: %ld kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

typedef struct { size_t off, len; int node; const char *label; } spec;

/* r0..r2 touch each other inside shared pages; r3 is untagged; pages 1280..1535 are in none. */
static const spec SPECS[] = {
	{ 100, (256u << 12) - 100 + 100, 0, "model.layers.3.mlp.experts.0" },
	{ (256u << 12) + 100, (512u << 12) - 93, 0, "model.layers.3.mlp.experts.1" },
	{ (768u << 12) + 7, (512u << 12) - 7, 0, "model.layers.3.mlp.experts.2" },
	{ 1536u << 12, 512u << 12, MOET_RES_NO_NODE, "model.layers.3.mlp.experts.3" },
};
#define N_SPECS 4

static size_t span_pages(const spec *s)
{
	size_t p0 = s->off / PG, p1 = (s->off + s->len + PG - 1) / PG;
	return p1 - p0;
}

/* Pages in the union of the specs' spans (the test's reference). */
static size_t union_pages(void)
{
	unsigned char in[FILE_PAGES] = {0};
	size_t n = 0;
	for (int i = 0; i < N_SPECS; i++)
		for (size_t p = SPECS[i].off / PG; p < (SPECS[i].off + SPECS[i].len + PG - 1) / PG;
		     p++)
			in[p] = 1;
	for (size_t p = 0; p < FILE_PAGES; p++)
		n += in[p];
	return n;
}

static int make_file(const char *path)
{
	unsigned char *buf = malloc(FILE_PAGES * PG);
	if (!buf)
		return -1;
	for (size_t i = 0; i < FILE_PAGES * PG; i++)
		buf[i] = (unsigned char)(i * 2654435761u >> 24);
	int rc = moet_test_write_file(path, buf, FILE_PAGES * PG);
	free(buf);
	if (rc)
		return -1;
	fd = open(path, O_RDONLY);
	if (fd < 0 || fsync(fd))
		return -1;
	map_bytes = FILE_PAGES * PG;
	base = mmap(NULL, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
	return base == MAP_FAILED ? -1 : 0;
}

static moet_res *make_set(void)
{
	moet_res *rs = NULL;
	CHECK(moet_res_create(&rs) == 0, "create: %s", moet_errmsg());
	CHECK(moet_res_add_mapping(rs, base, map_bytes) == 0, "add_mapping: %s", moet_errmsg());
	for (int i = 0; i < N_SPECS; i++) {
		int id = -1;
		CHECK(moet_res_add_range(rs, base + SPECS[i].off, SPECS[i].len, SPECS[i].node,
					 SPECS[i].label, &id) == 0, "add_range %d: %s", i,
		      moet_errmsg());
		CHECK(id == i, "range id %d for the %dth range", id, i);
	}
	return rs;
}

/* ---- populate, check, evict, verify, replace --------------------------------------------- */

static void test_residency(int dontneed_works)
{
	moet_res *rs = make_set();
	size_t sum_spans = 0;
	for (int i = 0; i < N_SPECS; i++)
		sum_spans += span_pages(&SPECS[i]);

	moet_res_check_report cr;
	CHECK(moet_res_check(rs, 1, &cr) == 0, "cold check: %s", moet_errmsg());
	CHECK(cr.pages_checked == sum_spans, "checked %zu pages, spans hold %zu",
	      cr.pages_checked, sum_spans);
	if (dontneed_works)
		CHECK(cr.pages_resident == 0 && cr.n_lost == N_SPECS,
		      "cold file: %zu pages resident, %zu ranges lost", cr.pages_resident,
		      cr.n_lost);

	moet_res_populate_report pr;
	CHECK(moet_res_populate(rs, MOET_RES_PLACE, &pr) == 0, "populate: %s", moet_errmsg());
	CHECK(pr.bytes == union_pages() * PG, "populated %zu bytes, the ranges' pages are %zu",
	      pr.bytes, union_pages() * PG);
	CHECK(pr.method == MOET_RES_BY_POPULATE_READ || pr.method == MOET_RES_BY_TOUCH,
	      "method %d", pr.method);
	CHECK(pr.n_threads >= 1 && pr.n_threads <= 2, "%d populate threads", pr.n_threads);
	printf("populate: %zu bytes in %.3f ms by %s, %d threads\n", pr.bytes, pr.ns / 1e6,
	       pr.method == MOET_RES_BY_POPULATE_READ ? "MADV_POPULATE_READ" : "touch",
	       pr.n_threads);

	/* every page of every range resident; by the test's own mincore too */
	CHECK(moet_res_check(rs, 1, &cr) == 0, "check: %s", moet_errmsg());
	CHECK(cr.pages_resident == cr.pages_checked && cr.n_lost == 0,
	      "after populate %zu of %zu resident", cr.pages_resident, cr.pages_checked);
	CHECK(cr.node_checked[1] == cr.pages_checked - span_pages(&SPECS[3]),
	      "node 0 pages %zu", cr.node_checked[1]);
	for (int i = 0; i < N_SPECS; i++)
		CHECK(resident_pages(base + SPECS[i].off / PG * PG, span_pages(&SPECS[i])) ==
		      span_pages(&SPECS[i]), "range %d not resident by mincore", i);
	if (dontneed_works)
		CHECK(resident_pages(base + 1281 * PG, 254) == 0, "readahead spilled into the "
		      "gap between ranges: %zu pages", resident_pages(base + 1281 * PG, 254));

	/* placement: all on node 0, by move_pages (code under test) and numa_maps (kernel) */
	moet_res_verify_report vr;
	CHECK(moet_res_verify(rs, 1, &vr) == 0, "verify: %s", moet_errmsg());
	CHECK(vr.pages == sum_spans && vr.absent == 0 && vr.elsewhere == 0 &&
	      vr.n_misplaced == 0, "verify: %zu pages, %zu absent, %zu elsewhere", vr.pages,
	      vr.absent, vr.elsewhere);
	CHECK(vr.node_pages[0] == sum_spans, "node 0 holds %zu of %zu", vr.node_pages[0],
	      sum_spans);
	CHECK(vr.on_node + vr.untagged == sum_spans, "on node %zu + untagged %zu", vr.on_node,
	      vr.untagged);
	/* NOTE: fault-around also maps cached neighbours of a faulting page: on a file that was
	 * wholly cached (tmpfs) pages beyond the ranges get mapped too */
	long nm = numa_maps_pages(0);
	CHECK(nm < 0 || (dontneed_works ? (size_t)nm == union_pages() : (size_t)nm >=
	      union_pages()), "numa_maps N0=%ld, mapped pages %zu", nm, union_pages());
	moet_res_range_info ri;
	CHECK(moet_res_range_get(rs, 2, &ri) == 0 && ri.node_pages &&
	      ri.node_pages[0] == span_pages(&SPECS[2]), "range 2 histogram");
	size_t n_bad = 9;
	moet_res_misplaced(rs, NULL, 0, &n_bad);
	CHECK(n_bad == 0, "%zu misplaced ranges on a one-node machine", n_bad);

	/* evict pages 300..363 (inside r1): exactly they are reported */
	if (dontneed_works) {
		drop_pages(300, 64);
		if (resident_pages(base + 300 * PG, 64) != 0) {
			printf("SKIP eviction assertions: this filesystem kept pages after "
			       "POSIX_FADV_DONTNEED\n");
		} else {
			CHECK(moet_res_check(rs, 1, &cr) == 0, "check: %s", moet_errmsg());
			CHECK(cr.pages_checked - cr.pages_resident == 64 && cr.n_lost == 1,
			      "evicted %zu pages in %zu ranges, dropped 64 in 1",
			      cr.pages_checked - cr.pages_resident, cr.n_lost);
			int ids[4];
			size_t n = 0;
			moet_res_evicted(rs, ids, 4, &n);
			CHECK(n == 1 && ids[0] == 1, "evicted ranges: %zu, first %d", n, ids[0]);
			char line[256], want[64];
			moet_res_describe(rs, 1, line, sizeof(line));
			snprintf(want, sizeof(want), "%.1f%% evicted",
				 100.0 * 64 / (double)span_pages(&SPECS[1]));
			CHECK(strstr(line, SPECS[1].label) && strstr(line, want), "line: %s", line);
			printf("eviction line: %s\n", line);
			char tiny[8];
			moet_res_describe(rs, 1, tiny, sizeof(tiny));
			CHECK(strlen(tiny) == 7 && strncmp(tiny, SPECS[1].label, 7) == 0,
			      "truncated line: %s", tiny);
			moet_res_describe(rs, 99, line, sizeof(line));
			CHECK(strcmp(line, "no range 99") == 0, "bad id line: %s", line);
			/* sampled: 4 calls of 1-in-4 see each page once, so the 64 again */
			size_t missed = 0, seen = 0;
			for (int k = 0; k < 4; k++) {
				CHECK(moet_res_check(rs, 4, &cr) == 0, "sampled: %s",
				      moet_errmsg());
				missed += cr.pages_checked - cr.pages_resident;
				seen += cr.pages_checked;
			}
			CHECK(missed == 64 && seen == sum_spans, "sampled: %zu missed of %zu seen",
			      missed, seen);
			/* move_pages: the dropped pages are not mapped here any more */
			CHECK(moet_res_verify(rs, 1, &vr) == 0 && vr.absent == 64,
			      "absent after eviction %zu", vr.absent);
			/* replace r1: dropped, re-read from node 0's thread, all back */
			double share = -1;
			CHECK(moet_res_replace(rs, 1, &share) == 0, "replace: %s", moet_errmsg());
			CHECK(share == 1.0, "share on node after replace %.3f", share);
			CHECK(moet_res_check(rs, 1, &cr) == 0 && cr.n_lost == 0,
			      "after replace %zu lost", cr.n_lost);
			moet_res_describe(rs, 1, line, sizeof(line));
			CHECK(strstr(line, "resident") != NULL, "line after replace: %s", line);
		}
	}

	/* lock: either locked (VmLck grows by exactly the runs) or a report of the limit */
	moet_res_lock_report lr;
	long before = vmlck_bytes();
	CHECK(moet_res_lock(rs, &lr) == 0, "lock: %s", moet_errmsg());
	CHECK(lr.bytes == union_pages() * PG && lr.n_runs == 2, "lock: %zu bytes, %zu runs",
	      lr.bytes, lr.n_runs);
	if (lr.locked) {
		CHECK(vmlck_bytes() - before == (long)lr.bytes, "VmLck grew by %ld, locked %zu",
		      vmlck_bytes() - before, lr.bytes);
		double share;
		CHECK(moet_res_replace(rs, 1, &share) == MOET_EINVAL, "replace while locked");
		moet_res_unlock(rs);
		CHECK(vmlck_bytes() == before, "VmLck %ld after unlock", vmlck_bytes());
	} else {
		CHECK(strstr(lr.note, "ulimit -l") != NULL, "lock note: %s", lr.note);
		printf("lock: %s\n", lr.note);
	}
	printf("lock: %s (limit %s, CAP_IPC_LOCK %d)\n", lr.locked ? "locked" : "not locked",
	       lr.limit_bytes == UINT64_MAX ? "unlimited" : "set", lr.cap_ipc_lock);
	moet_res_destroy(rs);
}

/* In a child without CAP_IPC_LOCK and with a 64 KiB limit: lock reports, does not fail. */
static void test_lock_limit(void)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		moet_test_failures = 0;
		struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
		struct __user_cap_data_struct d[2];
		if (syscall(SYS_capget, &h, d) == 0) {
			d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
			syscall(SYS_capset, &h, d);
		}
		FILE *f = fopen("/proc/self/status", "r");
		char buf[256];
		unsigned long long eff = 0;
		while (f && fgets(buf, sizeof(buf), f))
			sscanf(buf, "CapEff: %llx", &eff);
		if (f)
			fclose(f);
		if (eff & (1ull << CAP_IPC_LOCK))
			_exit(MOET_TEST_SKIP);
		struct rlimit rl = { 65536, 65536 };
		if (setrlimit(RLIMIT_MEMLOCK, &rl))
			_exit(3);
		moet_res *rs = make_set();
		moet_res_lock_report lr;
		int rc = moet_res_lock(rs, &lr);
		int ok = rc == 0 && !lr.locked && lr.limit_bytes == 65536 && !lr.cap_ipc_lock &&
			 strstr(lr.note, "RLIMIT_MEMLOCK 64 KiB") && strstr(lr.note, "ulimit -l") &&
			 vmlck_bytes() == 0;
		if (!ok)
			fprintf(stderr, "child: rc %d locked %d limit %llu cap %d note %s\n", rc,
				lr.locked, (unsigned long long)lr.limit_bytes, lr.cap_ipc_lock,
				lr.note);
		else
			printf("lock over the limit: %s\n", lr.note);
		moet_res_destroy(rs);
		fflush(stdout);
		fflush(stderr);
		_exit(ok && !moet_test_failures ? 0 : 1);
	}
	int st = 0;
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st), "lock-limit child died");
	if (WIFEXITED(st) && WEXITSTATUS(st) == MOET_TEST_SKIP)
		printf("SKIP lock-limit: this process cannot drop CAP_IPC_LOCK\n");
	else
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "lock-limit child failed (%d)", st);
}

/* MOET_RES_TOUCH and MOET_RES_HUGE paths: all resident again; huge pages reported. */
static void test_other_paths(int dontneed_works)
{
	moet_res *rs = make_set();
	moet_res_populate_report pr;
	moet_res_check_report cr;
	if (dontneed_works)
		drop_pages(0, FILE_PAGES);
	CHECK(moet_res_populate(rs, MOET_RES_PLACE | MOET_RES_TOUCH, &pr) == 0, "touch: %s",
	      moet_errmsg());
	CHECK(pr.method == MOET_RES_BY_TOUCH, "method %d", pr.method);
	CHECK(moet_res_check(rs, 1, &cr) == 0 && cr.pages_resident == cr.pages_checked,
	      "after touch %zu of %zu", cr.pages_resident, cr.pages_checked);
	if (dontneed_works)
		drop_pages(0, FILE_PAGES);
	CHECK(moet_res_populate(rs, MOET_RES_HUGE, &pr) == 0, "huge: %s", moet_errmsg());
	CHECK(pr.note[0] != '\0' && pr.pmd_mapped_bytes <= map_bytes, "huge note empty");
	printf("MOET_RES_HUGE: %s\n", pr.note);
	CHECK(moet_res_check(rs, 1, &cr) == 0 && cr.pages_resident == cr.pages_checked,
	      "after huge populate %zu of %zu", cr.pages_resident, cr.pages_checked);
	moet_res_destroy(rs);
}

/* ---- bad input ----------------------------------------------------------------------- */

#define EXPECT(call, code, word)                                                          \
	do {                                                                              \
		int rc_ = (call);                                                         \
		CHECK(rc_ == (code) && strstr(moet_errmsg(), (word)), "%s -> %d (%s)",   \
		      #call, rc_, moet_errmsg());                                         \
	} while (0)

static void test_bad_input(const char *path)
{
	moet_res *rs = NULL;
	CHECK(moet_res_create(&rs) == 0, "create");
	EXPECT(moet_res_add_mapping(rs, NULL, PG), MOET_EINVAL, "NULL");
	EXPECT(moet_res_add_mapping(rs, base + 1, PG), MOET_EINVAL, "page-aligned");
	EXPECT(moet_res_add_mapping(rs, base, 0), MOET_EINVAL, "zero length");
	void *anon = mmap(NULL, PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	EXPECT(moet_res_add_mapping(rs, anon, PG), MOET_EINVAL, "anonymous");
	munmap(anon, PG);
	int wfd = open(path, O_RDWR);
	void *wmap = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, wfd, 0);
	EXPECT(moet_res_add_mapping(rs, wmap, PG), MOET_EINVAL, "read-only");
	munmap(wmap, PG);
	close(wfd);
	/* a file mapping followed by a hole */
	unsigned char *res = mmap(NULL, 3 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *fm = mmap(res, 2 * PG, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
	munmap(res + 2 * PG, PG);
	CHECK(fm == res, "fixed map");
	EXPECT(moet_res_add_mapping(rs, res, 3 * PG), MOET_ERANGE, "not all mapped");
	munmap(res, 2 * PG);

	CHECK(moet_res_add_mapping(rs, base, map_bytes) == 0, "add: %s", moet_errmsg());
	EXPECT(moet_res_add_mapping(rs, base + PG, PG), MOET_EINVAL, "overlaps");
	EXPECT(moet_res_add_range(rs, NULL, 10, 0, "x", NULL), MOET_EINVAL, "NULL");
	EXPECT(moet_res_add_range(rs, base + 10, 0, 0, "x", NULL), MOET_EINVAL, "zero-length");
	EXPECT(moet_res_add_range(rs, base + map_bytes - 10, 20, 0, "tail", NULL), MOET_ERANGE,
	       "tail: bytes");
	EXPECT(moet_res_add_range(rs, base - PG, 20, 0, "before", NULL), MOET_ERANGE,
	       "not inside");
	EXPECT(moet_res_add_range(rs, base, 20, 64, "n64", NULL), MOET_ERANGE, "node 64");
	EXPECT(moet_res_add_range(rs, base, 20, -2, "neg", NULL), MOET_ERANGE, "node -2");
	EXPECT(moet_res_add_range(rs, base, 20, 63, "n63", NULL), MOET_ERANGE,
	       "does not exist here");
	EXPECT(moet_res_check(rs, 0, NULL), MOET_EINVAL, "stride");
	EXPECT(moet_res_verify(rs, 0, NULL), MOET_EINVAL, "stride");
	moet_res_range_info ri;
	EXPECT(moet_res_range_get(rs, 0, &ri), MOET_ERANGE, "no range 0");
	EXPECT(moet_res_replace(rs, -1, NULL), MOET_ERANGE, "no range -1");
	/* overlapping ranges: found by the first operation */
	CHECK(moet_res_add_range(rs, base + 100, 5000, 0, "a", NULL) == 0, "a");
	CHECK(moet_res_add_range(rs, base + 5000, 100, 0, "b", NULL) == 0, "b");
	EXPECT(moet_res_populate(rs, 0, NULL), MOET_EINVAL, "ranges a and b overlap");
	EXPECT(moet_res_check(rs, 1, NULL), MOET_EINVAL, "overlap");
	moet_res_lock_report lr;
	EXPECT(moet_res_lock(rs, &lr), MOET_EINVAL, "overlap");
	EXPECT(moet_res_replace(rs, 0, NULL), MOET_EINVAL, "overlap");
	CHECK(moet_res_add_range(rs, base + 6000, 100, MOET_RES_NO_NODE, NULL, NULL) == 0, "c");
	CHECK(moet_res_range_get(rs, 2, &ri) == 0 && strcmp(ri.label, "range 2") == 0,
	      "default label %s", ri.label);
	moet_res_destroy(rs);
	moet_res_destroy(NULL);
}

/* ---- assignment ------------------------------------------------------------------------ */

static uint64_t rng = 42;
static double uniform(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rng >> 11) / 9007199254740992.0;
}

/* Checks one assignment: memory never exceeded; returns max per-core load. */
static double judge(const moet_res_node *nodes, int n_nodes, const moet_res_expert *ex,
		    size_t n, const int *where)
{
	double load[8] = {0}, worst = 0;
	size_t used[8] = {0};
	for (size_t j = 0; j < n; j++) {
		CHECK(where[j] >= 0 && where[j] < n_nodes, "expert %zu on node %d", j, where[j]);
		if (where[j] < 0 || where[j] >= n_nodes)
			return INFINITY;
		load[where[j]] += ex[j].load;
		used[where[j]] += ex[j].n_bytes;
	}
	for (int i = 0; i < n_nodes; i++) {
		CHECK(used[i] <= nodes[i].mem_bytes, "node %d holds %zu bytes, has %zu", i, used[i],
		      nodes[i].mem_bytes);
		if (load[i] / nodes[i].n_cores > worst)
			worst = load[i] / nodes[i].n_cores;
	}
	return worst;
}

/* Unconstrained memory: within the proven bound and within tol of the perfect split. */
static void balanced(const moet_res_node *nodes, int n_nodes, size_t n, double tol,
		     const char *what)
{
	moet_res_expert ex[512];
	int where[512], again[512];
	double total = 0, lmax = 0;
	int cores = 0;
	for (size_t j = 0; j < n; j++) {
		ex[j] = (moet_res_expert){ 44u << 20, 0.2 + uniform() * uniform() * 3.0 };
		total += ex[j].load;
		lmax = ex[j].load > lmax ? ex[j].load : lmax;
	}
	for (int i = 0; i < n_nodes; i++)
		cores += nodes[i].n_cores;
	CHECK(moet_res_assign(nodes, n_nodes, ex, n, where) == 0, "%s: %s", what, moet_errmsg());
	double worst = judge(nodes, n_nodes, ex, n, where), ideal = total / cores;
	CHECK(worst <= ideal + n_nodes * lmax / cores, "%s: %.4f over the bound", what, worst);
	CHECK(worst <= ideal * (1 + tol), "%s: worst per-core load %.4f, ideal %.4f (+%.1f%%)",
	      what, worst, ideal, 100 * tol);
	printf("assign %s: worst per-core load %.4f, ideal %.4f (+%.2f%%)\n", what, worst, ideal,
	       100 * (worst / ideal - 1));
	CHECK(moet_res_assign(nodes, n_nodes, ex, n, again) == 0 &&
	      memcmp(where, again, n * sizeof(int)) == 0, "%s: not deterministic", what);
}

static void test_assign(void)
{
	const size_t GB = 1ull << 30;
	moet_res_node two[2] = { { 0, 16, 64 * GB }, { 1, 8, 64 * GB } };
	balanced(two, 2, 256, 0.02, "2 nodes 16+8 cores");
	moet_res_node four[4] = { { 0, 12, 64 * GB }, { 1, 4, 64 * GB }, { 2, 8, 64 * GB },
				  { 3, 6, 64 * GB } };
	balanced(four, 4, 384, 0.03, "4 nodes 12+4+8+6 cores");

	/* memory binds: node 0 has most cores but room for 40 experts only */
	moet_res_expert ex[256];
	int where[256];
	size_t eb = 44u << 20;
	for (int j = 0; j < 256; j++)
		ex[j] = (moet_res_expert){ eb, 1.0 + (j % 7) };
	moet_res_node tight[4] = { { 0, 32, 40 * eb }, { 1, 8, 80 * eb }, { 2, 8, 80 * eb },
				   { 3, 8, 80 * eb } };
	CHECK(moet_res_assign(tight, 4, ex, 256, where) == 0, "tight: %s", moet_errmsg());
	judge(tight, 4, ex, 256, where);
	int on0 = 0;
	for (int j = 0; j < 256; j++)
		on0 += where[j] == 0;
	CHECK(on0 == 40, "the big node filled to its memory: %d experts", on0);
	/* does not fit */
	moet_res_node small[2] = { { 0, 8, 100 * eb }, { 1, 8, 100 * eb + eb - 1 } };
	EXPECT(moet_res_assign(small, 2, ex, 256, where), MOET_ERANGE, "fits on no node");
	/* no load at all: memory share decides, so an even split */
	for (int j = 0; j < 256; j++)
		ex[j].load = 0;
	CHECK(moet_res_assign(two, 2, ex, 256, where) == 0, "zero load");
	int n1 = 0;
	for (int j = 0; j < 256; j++)
		n1 += where[j];
	CHECK(n1 == 128, "zero load split %d/%d", 256 - n1, n1);
	/* bad input */
	moet_res_node nocore[1] = { { 0, 0, GB } };
	EXPECT(moet_res_assign(nocore, 1, ex, 4, where), MOET_EINVAL, "0 cores");
	EXPECT(moet_res_assign(two, 0, ex, 4, where), MOET_EINVAL, "no nodes");
	ex[2].load = -1;
	EXPECT(moet_res_assign(two, 2, ex, 4, where), MOET_EINVAL, "expert 2");
	ex[2].load = NAN;
	EXPECT(moet_res_assign(two, 2, ex, 4, where), MOET_EINVAL, "expert 2");
}

static void test_node_cpus(void)
{
	/* 2 packages x 8 cores x 2 threads: cpu c and c + 16 are siblings, node = (c % 16) / 8 */
	moet_res_pu pus[32];
	for (int c = 0; c < 32; c++)
		pus[c] = (moet_res_pu){ c, c % 16, (c % 16) / 8 };
	int out[32], n = 0;
	CHECK(moet_res_node_cpus(pus, 32, 1, NULL, 0, 0, 0, out, 32, &n) == 0 && n == 8 &&
	      out[0] == 8 && out[7] == 15, "node 1 cores: n %d first %d", n, out[0]);
	int reserved[1] = { 25 }; /* the sibling of cpu 9 */
	CHECK(moet_res_node_cpus(pus, 32, 1, reserved, 1, 0, 0, out, 32, &n) == 0 && n == 7 &&
	      out[0] == 8 && out[1] == 10, "reserved core: n %d, %d %d", n, out[0], out[1]);
	CHECK(moet_res_node_cpus(pus, 32, 1, reserved, 1, 0, 1, out, 32, &n) == 0 && n == 14 &&
	      out[7] == 24 && out[8] == 26, "smt: n %d", n);
	CHECK(moet_res_node_cpus(pus, 32, 0, NULL, 0, 3, 0, out, 32, &n) == 0 && n == 3 &&
	      out[2] == 2, "max 3 workers: n %d", n);
	EXPECT(moet_res_node_cpus(pus, 32, 2, NULL, 0, 0, 0, out, 32, &n), MOET_ENOTFOUND,
	       "node 2");
	EXPECT(moet_res_node_cpus(pus, 32, 0, NULL, 0, 0, 0, out, 4, &n), MOET_ERANGE,
	       "room for 4");
	EXPECT(moet_res_node_cpus(pus, -1, 0, NULL, 0, 0, 0, out, 4, &n), MOET_EINVAL,
	       "negative");
}

int main(void)
{
	PG = (size_t)sysconf(_SC_PAGESIZE);
	if (PG != 4096) {
		printf("SKIP: the layout in this test assumes 4 KiB pages (have %zu)\n", PG);
		return MOET_TEST_SKIP;
	}
	char *dir = moet_test_mkdtemp("residency");
	char path[4096];
	snprintf(path, sizeof(path), "%s/shard.safetensors", dir ? dir : "/tmp");
	if (!dir || make_file(path)) {
		fprintf(stderr, "cannot make the test file %s\n", path);
		return 1;
	}
	/* does this filesystem drop clean, unmapped pages on request? */
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	int dontneed_works = resident_pages(base, FILE_PAGES) == 0;
	if (!dontneed_works)
		printf("SKIP cold-cache and eviction assertions: POSIX_FADV_DONTNEED left %zu of "
		       "%d pages cached on this filesystem\n", resident_pages(base, FILE_PAGES),
		       FILE_PAGES);
	test_residency(dontneed_works);
	test_lock_limit();
	test_other_paths(dontneed_works);
	test_bad_input(path);
	test_assign();
	test_node_cpus();
	munmap(base, map_bytes);
	close(fd);
	unlink(path);
	rmdir(dir);
	free(dir);
	return moet_test_done("test_residency");
}
