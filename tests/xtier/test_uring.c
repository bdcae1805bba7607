/*
 * test_uring.c: the io_uring reader (runtime/moet_uring.h) against plain pread.
 *
 * On the shards of a generated checkpoint (several shards): 400 random ranges (lengths 1 B ..
 * 300 KB, at file starts and ends, unaligned and aligned), read with O_DIRECT and buffered,
 * with small chunks (ranges split into many requests), queue depths 1 and 16, into malloc'd
 * and registered buffers: every callback's bytes equal pread's, at buf + offset % 4096, and
 * every range gets exactly one callback. A file on /dev/shm (tmpfs) in auto mode: O_DIRECT or
 * buffered with a note, same bytes. Faults: a short read is retried for the remainder (same
 * bytes); EIO and ENOSPC fail the range with a message naming the file, offset and errno text,
 * hand out nothing, leave the other ranges intact, and the reader works on the next call; the
 * MOET_URING_FAULT hook; bad ranges and bad hook values are one-line errors.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_test.h"
#include "moet_uring.h"

#define N_RANGES 400
#define A MOET_URING_ALIGN

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void)
{
	return moet_test_xorshift64(&rng);
}

typedef struct check_ctx {
	int *fds;          /* pread reference per file */
	int *seen;         /* callbacks per range */
	int n_ok, n_fail;
	int bad;           /* data mismatches */
	char last_err[512];
} check_ctx;

static void on_done(void *p, const moet_uring_done *d)
{
	check_ctx *c = p;
	c->seen[d->index]++;
	if (d->rc) {
		c->n_fail++;
		snprintf(c->last_err, sizeof(c->last_err), "%s", d->error);
		if (d->data)
			c->bad++;
		return;
	}
	c->n_ok++;
	const moet_uring_range *r = d->range;
	if (d->data != (const char *)r->buf + r->offset % A) {
		c->bad++;
		return;
	}
	char *want = malloc(r->n_bytes);
	ssize_t got = want ? pread(c->fds[r->file], want, r->n_bytes, (off_t)r->offset) : -1;
	if (got != (ssize_t)r->n_bytes || memcmp(want, d->data, r->n_bytes)) {
		if (!c->bad)
			fprintf(stderr, "mismatch: file %d offset %llu bytes %zu\n", r->file,
				(unsigned long long)r->offset, r->n_bytes);
		c->bad++;
	}
	free(want);
}

/* n random ranges over files (sizes[]), buffers carved from arena (or malloc'd when NULL). */
static void make_ranges(moet_uring_range *r, int n, const uint64_t *sizes, int n_files,
			uint8_t *arena, size_t arena_bytes)
{
	size_t at = 0;
	for (int i = 0; i < n; i++) {
		int f = (int)(next() % (uint64_t)n_files);
		uint64_t sz = sizes[f];
		size_t len = 1 + (size_t)(next() % (i % 4 == 0 ? 300000 : 5000));
		if (len > sz)
			len = (size_t)sz;
		uint64_t off = next() % (sz - len + 1);
		if (i % 10 == 1)
			off = 0;                      /* file start */
		if (i % 10 == 2)
			off = sz - len;               /* file end (O_DIRECT cover past EOF) */
		if (i % 10 == 3)
			off = off / A * A;            /* aligned start */
		size_t span = moet_uring_span(off, len);
		void *buf;
		if (arena) {
			buf = arena + at;
			at += span;
			if (at > arena_bytes)
				abort();
		} else {
			buf = aligned_alloc(A, span);
		}
		r[i] = (moet_uring_range){ .file = f, .offset = off, .n_bytes = len, .buf = buf };
	}
}

static void free_ranges(moet_uring_range *r, int n)
{
	for (int i = 0; i < n; i++)
		free(r[i].buf);
}

static int open_all(moet_uring *u, char **paths, int n)
{
	for (int i = 0; i < n; i++) {
		int id;
		int rc = moet_uring_open(u, paths[i], &id);
		if (rc)
			return rc;
	}
	return 0;
}

static void random_reads(char **paths, int *fds, const uint64_t *sizes, int n_files, int direct,
			 unsigned qd, int registered)
{
	moet_uring_opts o = { .queue_depth = qd, .direct = direct, .chunk_bytes = 3 * A };
	moet_uring *u = NULL;
	int rc = moet_uring_create(&o, &u);
	CHECK(rc == 0, "create: %s", moet_errmsg());
	if (rc)
		return;
	rc = open_all(u, paths, n_files);
	if (rc == MOET_EUNSUP && direct == MOET_URING_DIRECT_ON) {
		printf("O_DIRECT refused here (%s): direct path not tested\n", moet_errmsg());
		moet_uring_destroy(u);
		return;
	}
	CHECK(rc == 0, "open: %s", moet_errmsg());
	moet_uring_range *r = calloc(N_RANGES, sizeof(*r));
	int seen[N_RANGES] = { 0 };
	uint8_t *arena = NULL;
	size_t arena_bytes = (size_t)N_RANGES * (300000 / A + 3) * A; /* a multiple of A */
	if (registered) {
		arena = aligned_alloc(A, arena_bytes);
		void *b[2] = { arena, arena + arena_bytes / 2 };
		size_t bb[2] = { arena_bytes / 2, arena_bytes / 2 };
		/* registered 2: a sparse table filled place by place */
		if (registered == 2)
			CHECK(moet_uring_register_sparse(u, 2) == 0 &&
			      moet_uring_register_one(u, 1, b[1], bb[1]) == 0 &&
			      moet_uring_register_one(u, 0, b[0], bb[0]) == 0 &&
			      moet_uring_register_one(u, 2, b[0], bb[0]) == MOET_EINVAL,
			      "sparse register: %s", moet_errmsg());
		else
			CHECK(moet_uring_register(u, b, bb, 2) == 0, "register: %s",
			      moet_errmsg());
		if (!moet_uring_registered(u))
			printf("buffers not registered: %s\n", moet_uring_note(u));
	}
	make_ranges(r, N_RANGES, sizes, n_files, arena, arena_bytes);
	check_ctx c = { .fds = fds, .seen = seen };
	rc = moet_uring_read(u, r, N_RANGES, on_done, &c);
	CHECK(rc == 0, "read: %s", moet_errmsg());
	CHECK(c.n_ok == N_RANGES && c.bad == 0, "direct %d qd %u reg %d: %d ok, %d bad", direct,
	      qd, registered, c.n_ok, c.bad);
	for (int i = 0; i < N_RANGES; i++)
		CHECK(seen[i] == 1, "range %d: %d callbacks", i, seen[i]);
	moet_uring_stats st;
	moet_uring_stats_get(u, &st);
	CHECK(st.ranges == N_RANGES && st.failed == 0 && st.requests > N_RANGES &&
	      st.max_in_flight <= qd, "stats: %llu ranges, %llu requests, max in flight %u",
	      (unsigned long long)st.ranges, (unsigned long long)st.requests, st.max_in_flight);
	printf("direct=%d (file 0: %s) qd=%u registered=%d: %d ranges in %llu requests, %llu "
	       "bytes read for %llu wanted, max in flight %u\n", direct,
	       moet_uring_file_direct(u, 0) ? "O_DIRECT" : "buffered", qd,
	       moet_uring_registered(u), N_RANGES, (unsigned long long)st.requests,
	       (unsigned long long)st.bytes_read, (unsigned long long)st.bytes_wanted,
	       st.max_in_flight);
	moet_uring_destroy(u);
	if (!registered)
		free_ranges(r, N_RANGES);
	free(arena);
	free(r);
}

/* One reader, three ranges of 64 KiB + odd bytes; a fault on request `nth`. */
static void fault_case(char **paths, int *fds, const uint64_t *sizes, int direct, int kind,
		       uint64_t nth, const char *errno_text)
{
	moet_uring_opts o = { .queue_depth = 4, .direct = direct, .chunk_bytes = 1 << 20 };
	moet_uring *u = NULL;
	int rc = moet_uring_create(&o, &u);
	if (!rc)
		rc = open_all(u, paths, 1);
	if (rc) {
		CHECK(direct == MOET_URING_DIRECT_ON, "fault setup: %s", moet_errmsg());
		moet_uring_destroy(u);
		return;
	}
	moet_uring_range r[3];
	int seen[3] = { 0 };
	for (int i = 0; i < 3; i++) {
		uint64_t off = 1000 + (uint64_t)i * 70000;
		if (off + 65536 + 77 > sizes[0])
			off = 0;
		r[i] = (moet_uring_range){ .file = 0, .offset = off, .n_bytes = 65536 + 77,
					   .buf = aligned_alloc(A, moet_uring_span(off, 65613)) };
		memset(r[i].buf, 0x5A, moet_uring_span(off, 65613));
	}
	CHECK(moet_uring_fault(u, nth, kind) == 0, "fault");
	check_ctx c = { .fds = fds, .seen = seen };
	moet_err_clear();
	rc = moet_uring_read(u, r, 3, on_done, &c);
	moet_uring_stats st;
	moet_uring_stats_get(u, &st);
	if (kind == MOET_URING_FAULT_SHORT) {
		CHECK(rc == 0 && c.n_ok == 3 && c.bad == 0 && st.retries >= 1,
		      "short read retried: rc %d, %d ok, %d bad, %llu retries", rc, c.n_ok, c.bad,
		      (unsigned long long)st.retries);
	} else {
		const char *msg = moet_errmsg();
		char off[64];
		snprintf(off, sizeof(off), "offset %llu", (unsigned long long)r[nth - 1].offset);
		CHECK(rc == MOET_EIO && c.n_fail == 1 && c.n_ok == 2 && c.bad == 0,
		      "%s: rc %d, %d failed, %d ok, %d bad", errno_text, rc, c.n_fail, c.n_ok,
		      c.bad);
		CHECK(strstr(msg, paths[0]) && strstr(msg, off) && strstr(msg, errno_text),
		      "message names file, %s and '%s': %s", off, errno_text, msg);
		CHECK(!strcmp(c.last_err, msg), "callback saw the same line: %s", c.last_err);
		printf("fault %s: %s\n", errno_text, msg);
		/* the reader keeps working */
		memset(seen, 0, sizeof(seen));
		check_ctx c2 = { .fds = fds, .seen = seen };
		rc = moet_uring_read(u, r, 3, on_done, &c2);
		CHECK(rc == 0 && c2.n_ok == 3 && c2.bad == 0, "after the fault: rc %d (%s)", rc,
		      moet_errmsg());
	}
	moet_uring_destroy(u);
	for (int i = 0; i < 3; i++)
		free(r[i].buf);
}

static void bad_inputs(char **paths, const uint64_t *sizes)
{
	moet_uring *u = NULL;
	CHECK(moet_uring_create(NULL, &u) == 0 && open_all(u, paths, 1) == 0, "create");
	void *buf = aligned_alloc(A, 3 * A);
	moet_uring_range r = { .file = 0, .offset = sizes[0] - 10, .n_bytes = 20, .buf = buf };
	CHECK(moet_uring_submit(u, &r, 1, NULL, NULL) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "past the end"), "past EOF: %s", moet_errmsg());
	r = (moet_uring_range){ .file = 0, .offset = 0, .n_bytes = 20, .buf = (char *)buf + 8 };
	CHECK(moet_uring_submit(u, &r, 1, NULL, NULL) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "aligned"), "unaligned buf: %s", moet_errmsg());
	r = (moet_uring_range){ .file = 3, .offset = 0, .n_bytes = 20, .buf = buf };
	CHECK(moet_uring_submit(u, &r, 1, NULL, NULL) == MOET_EINVAL, "unknown file");
	int id;
	CHECK(moet_uring_open(u, "/nonexistent/x.safetensors", &id) == MOET_ENOTFOUND &&
	      strstr(moet_errmsg(), "/nonexistent/x.safetensors"), "missing file: %s",
	      moet_errmsg());
	CHECK(moet_uring_pending(u) == 0, "nothing queued by refused submits");
	moet_uring_destroy(u);
	free(buf);
	setenv("MOET_URING_FAULT", "eio@0", 1);
	CHECK(moet_uring_create(NULL, &u) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "MOET_URING_FAULT"), "bad hook: %s", moet_errmsg());
	setenv("MOET_URING_FAULT", "bogus@1", 1);
	CHECK(moet_uring_create(NULL, &u) == MOET_EINVAL, "bad hook kind");
	unsetenv("MOET_URING_FAULT");
}

/* The environment hook: eio on the 2nd request of a fresh reader. */
static void env_hook(char **paths, int *fds)
{
	setenv("MOET_URING_FAULT", "eio@2", 1);
	moet_uring *u = NULL;
	int rc = moet_uring_create(NULL, &u);
	unsetenv("MOET_URING_FAULT");
	CHECK(rc == 0 && open_all(u, paths, 1) == 0, "hook create: %s", moet_errmsg());
	moet_uring_range r[2];
	int seen[2] = { 0 };
	for (int i = 0; i < 2; i++)
		r[i] = (moet_uring_range){ .file = 0, .offset = (uint64_t)i * 5000, .n_bytes = 4000,
					   .buf = aligned_alloc(A, 2 * A) };
	check_ctx c = { .fds = fds, .seen = seen };
	rc = moet_uring_read(u, r, 2, on_done, &c);
	CHECK(rc == MOET_EIO && c.n_ok == 1 && c.n_fail == 1 && seen[1] == 1, "hook: rc %d", rc);
	moet_uring_destroy(u);
	free(r[0].buf);
	free(r[1].buf);
}

/* A file on tmpfs in auto mode. */
static void tmpfs_file(void)
{
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/moet-uring-%d", (int)getpid());
	size_t n = 3 * 1024 * 1024 + 123;
	uint8_t *data = malloc(n);
	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)(next() >> 24);
	if (moet_test_write_file(path, data, n)) {
		printf("no /dev/shm: tmpfs case skipped\n");
		free(data);
		return;
	}
	char *paths[1] = { path };
	int fds[1] = { open(path, O_RDONLY) };
	uint64_t sizes[1] = { n };
	moet_uring *u = NULL;
	CHECK(moet_uring_create(NULL, &u) == 0 && open_all(u, paths, 1) == 0, "tmpfs: %s",
	      moet_errmsg());
	printf("tmpfs auto mode: %s%s%s\n", moet_uring_file_direct(u, 0) ? "O_DIRECT" : "buffered",
	       moet_uring_note(u)[0] ? "; note: " : "", moet_uring_note(u));
	CHECK(moet_uring_file_direct(u, 0) || strstr(moet_uring_note(u), path),
	      "buffered fallback names the file");
	moet_uring_range r[50];
	int seen[50] = { 0 };
	make_ranges(r, 50, sizes, 1, NULL, 0);
	check_ctx c = { .fds = fds, .seen = seen };
	CHECK(moet_uring_read(u, r, 50, on_done, &c) == 0 && c.n_ok == 50 && c.bad == 0,
	      "tmpfs reads: %d ok %d bad", c.n_ok, c.bad);
	moet_uring_destroy(u);
	free_ranges(r, 50);
	close(fds[0]);
	unlink(path);
	free(data);
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 11;
	gp.shard_mb = 1;
	char *dir = moet_test_gen("uring", &gp);
	moet_ckpt *ck = NULL;
	CHECK(dir && moet_ckpt_open(dir, &ck) == 0, "open: %s", moet_errmsg());
	if (!ck)
		return moet_test_done("test_uring");
	int n = moet_ckpt_shard_count(ck);
	char **paths = calloc((size_t)n, sizeof(*paths));
	int *fds = calloc((size_t)n, sizeof(*fds));
	uint64_t *sizes = calloc((size_t)n, sizeof(*sizes));
	for (int i = 0; i < n; i++) {
		paths[i] = (char *)moet_ckpt_shard_path(ck, i);
		fds[i] = open(paths[i], O_RDONLY);
		sizes[i] = moet_ckpt_shard_bytes(ck, i);
	}
	printf("%d shards\n", n);
	CHECK(n >= 3, "several shards (%d)", n);
	const int modes[2] = { MOET_URING_DIRECT_ON, MOET_URING_DIRECT_OFF };
	for (int mi = 0; mi < 2; mi++) {
		random_reads(paths, fds, sizes, n, modes[mi], 1, 0);
		random_reads(paths, fds, sizes, n, modes[mi], 16, 0);
		random_reads(paths, fds, sizes, n, modes[mi], 16, 1);
		random_reads(paths, fds, sizes, n, modes[mi], 16, 2);
		fault_case(paths, fds, sizes, modes[mi], MOET_URING_FAULT_SHORT, 2, "short");
		fault_case(paths, fds, sizes, modes[mi], MOET_URING_FAULT_EIO, 1,
			   "Input/output error");
		fault_case(paths, fds, sizes, modes[mi], MOET_URING_FAULT_ENOSPC, 2,
			   "No space left on device");
	}
	bad_inputs(paths, sizes);
	env_hook(paths, fds);
	tmpfs_file();
	for (int i = 0; i < n; i++)
		close(fds[i]);
	free(paths);
	free(fds);
	free(sizes);
	moet_ckpt_close(ck);
	free(dir);
	return moet_test_done("test_uring");
}
