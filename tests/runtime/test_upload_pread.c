/*
 * test_upload_pread.c: the staged upload's pread source (MOET_UPLOAD_READ=pread,
 * runtime/upload.c) against the map source and the file's bytes, without a GPU (host
 * destinations: the pipeline's fill logic on the CPU).
 *
 *   bytes     a temp file of random bytes, random items (unaligned offsets and lengths,
 *             empty ones, items larger than a 1 MiB staging buffer, many buffers' turns):
 *             the destinations equal the file's bytes (read independently) for map and
 *             pread, nt and cached stores, 1, 3 and 7 threads (the threads running ahead
 *             over many buffers' turns), every item or half of them with a file (the rest
 *             copied), reads capped at 1000 bytes (short reads continued);
 *             bytes between the destinations are untouched
 *   failures  a file truncated after the items were planned (end of file), a closed
 *             descriptor (EBADF), a directory (EISDIR), an injected EIO: MOET_EIO in one line
 *             naming the file, the offset and the errno text
 *   reuse     one uploader (moet_uploader_*) for several runs (halves, the whole): bytes
 *             right each time; one with an injected EIO: the failure named, the next run
 *             whole and right
 *   refusals  bad MOET_UPLOAD_READ / MOET_UPLOAD_READ_FAULT values named before anything is
 *             allocated (a device upload then fails with EINVAL, not a CUDA error)
 *   ckpt      every tensor of a several-shard generated checkpoint located in its shard
 *             (moet_upload_files) and read by pread equals its mapped bytes; a pointer
 *             outside the mapping is refused (MOET_ERANGE)
 * The model's staged upload with pread (runtime/model.c, CUDA only: the CPU backend's
 * simulated devices are filled by runtime/dispatch.c) is tests/gpu/test_gpu_upload_pread.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_test.h"
#include "moet_upload.h"

#define FILE_BYTES ((size_t)(9 << 20) + 12345)
#define N_ITEMS 64

typedef struct fixture {
	char *dir, path[512];
	int fd;
	const uint8_t *map;      /* the file mapped */
	uint8_t *ref;            /* the file's bytes, read with moet_test_read_file */
	moet_upload_file file;
	moet_upload_item it[N_ITEMS];
	moet_upload_from from[N_ITEMS];
	uint8_t *dst;            /* every item's destination, with gaps */
	size_t dst_bytes;
} fixture;

static void expect(int rc, int want, const char *needle, const char *what)
{
	CHECK(rc == want && strstr(moet_errmsg(), needle) && !strchr(moet_errmsg(), '\n'),
	      "%s: rc %d (want %d), '%s' (want '%s')", what, rc, want, moet_errmsg(), needle);
}

static int setup(fixture *f)
{
	uint64_t r = 77;
	f->dir = moet_test_mkdtemp("upload-pread");
	CHECK(f->dir != NULL, "scratch directory");
	if (!f->dir)
		return -1;
	snprintf(f->path, sizeof(f->path), "%s/bytes.bin", f->dir);
	uint8_t *b = malloc(FILE_BYTES);
	if (!b)
		return -1;
	for (size_t i = 0; i < FILE_BYTES; i++)
		b[i] = (uint8_t)(moet_test_xorshift64(&r) >> 29);
	int rc = moet_test_write_file(f->path, b, FILE_BYTES);
	free(b);
	size_t n = 0;
	f->ref = rc ? NULL : moet_test_read_file(f->path, &n);
	f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
	void *p = f->fd >= 0 ? mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, f->fd, 0) : MAP_FAILED;
	CHECK(f->ref && n == FILE_BYTES && p != MAP_FAILED, "test file %s", f->path);
	if (!f->ref || p == MAP_FAILED)
		return -1;
	f->map = p;
	f->file = (moet_upload_file){ f->fd, f->path };
	/* items: random unaligned ranges; every 9th empty, every 13th larger than a buffer */
	size_t at = 0, big = 0;
	for (int i = 0; i < N_ITEMS; i++) {
		size_t len = (size_t)(moet_test_xorshift64(&r) % 300000) + 1;
		if (i % 9 == 4)
			len = 0;
		if (i % 13 == 6)
			len = ((size_t)1 << 20) + (size_t)(moet_test_xorshift64(&r) % 900000);
		size_t off = (size_t)(moet_test_xorshift64(&r) % (FILE_BYTES - len));
		big += len > ((size_t)1 << 20);
		at += (size_t)(moet_test_xorshift64(&r) % 97); /* a gap, odd alignment */
		f->it[i] = (moet_upload_item){ f->map + off, (void *)at, len };
		f->from[i] = (moet_upload_from){ &f->file, off };
		at += len;
	}
	f->dst_bytes = at + 64;
	CHECK(big >= 3 && at > ((size_t)6 << 20), "%zu items above a buffer, %zu bytes in all "
	      "(many turns of 4 x 1 MiB)", big, at);
	if (!(f->dst = malloc(f->dst_bytes)))
		return -1;
	for (int i = 0; i < N_ITEMS; i++)
		f->it[i].dst = f->dst + (uintptr_t)f->it[i].dst;
	return 0;
}

/* 1 if every item's destination holds the file's bytes and the gaps still hold 0xA5. */
static int check_dst(const fixture *f, const char *what)
{
	size_t prev = 0;
	for (int i = 0; i < N_ITEMS; i++) {
		const uint8_t *d = f->it[i].dst, *want = f->ref + f->from[i].off;
		const size_t at = (size_t)(d - f->dst);
		for (size_t k = prev; k < at; k++)
			if (f->dst[k] != 0xA5) {
				fprintf(stderr, "%s: gap byte %zu before item %d written\n", what, k, i);
				return 0;
			}
		if (memcmp(d, want, f->it[i].bytes)) {
			size_t k = 0;
			while (d[k] == want[k])
				k++;
			fprintf(stderr, "%s: item %d (%zu bytes at file offset %llu): first "
				"mismatch at byte %zu: %02x, want %02x\n", what, i, f->it[i].bytes,
				(unsigned long long)f->from[i].off, k, d[k], want[k]);
			return 0;
		}
		prev = at + f->it[i].bytes;
	}
	return 1;
}

static void bytes_cases(fixture *f)
{
	setenv("MOET_UPLOAD_CHUNK_MB", "1", 1);
	moet_upload_from half[N_ITEMS];
	for (int i = 0; i < N_ITEMS; i++)
		half[i] = i % 2 ? f->from[i] : (moet_upload_from){ NULL, 0 };
	for (int v = 0; v < 48; v++) {
		const char *read = v % 3 == 0 ? "map" : "pread", *store = v & 8 ? "cached" : "nt";
		const int threads = v & 4 ? (v & 32 ? 7 : 3) : 1, mixed = v % 3 == 2;
		const int shortr = (v & 16) != 0;
		char what[200];
		snprintf(what, sizeof(what), "read %s%s, %s stores, %d threads%s", read,
			 mixed ? " (half the items with a file)" : "", store, threads,
			 shortr ? ", reads of at most 1000 bytes" : "");
		setenv("MOET_UPLOAD_READ", read, 1);
		setenv("MOET_UPLOAD_STORE", store, 1);
		if (shortr)
			setenv("MOET_UPLOAD_READ_FAULT", "short", 1);
		memset(f->dst, 0xA5, f->dst_bytes);
		moet_upload_opts o = { .host_dst = 1, .from = mixed ? half : f->from };
		moet_upload_stats st = { 0 };
		int rc = moet_upload_many_opts(f->it, N_ITEMS, threads, &o, &st);
		unsetenv("MOET_UPLOAD_READ_FAULT");
		CHECK(rc == 0, "%s: %s", what, moet_errmsg());
		CHECK(rc == 0 && check_dst(f, what), "%s: destinations equal the file's bytes", what);
		CHECK(st.copy_seconds > 0 && st.copy_seconds <= st.seconds, "%s: times %g of %g s",
		      what, st.copy_seconds, st.seconds);
		/* the split of the copy phase: fills measured, no link on host destinations */
		CHECK(st.fill_seconds > 0 && st.fill_seconds <= st.copy_seconds &&
		      st.link_wait_seconds == 0, "%s: fill %g s, link wait %g s of %g s", what,
		      st.fill_seconds, st.link_wait_seconds, st.copy_seconds);
	}
	unsetenv("MOET_UPLOAD_STORE");
	/* the fill alone: nothing is copied out, the destinations (NULL here) are not touched */
	moet_upload_item it[N_ITEMS];
	for (int i = 0; i < N_ITEMS; i++)
		it[i] = (moet_upload_item){ f->it[i].src, NULL, f->it[i].bytes };
	for (int m = 0; m < 2; m++) {
		moet_upload_opts o = { .fill_only = 1, .from = f->from, .read = 1 + m };
		moet_upload_stats st = { 0 };
		CHECK(moet_upload_many_opts(it, N_ITEMS, 2, &o, &st) == 0 && st.bytes > 0,
		      "fill only (%s): %s", m ? "pread" : "map", moet_errmsg());
	}
	unsetenv("MOET_UPLOAD_READ");
}

/* A failed read: MOET_EIO, one line naming path and offset, with want (errno text). */
static void expect_read_failure(fixture *f, const moet_upload_from *from, const char *path,
				const char *want, const char *what)
{
	memset(f->dst, 0xA5, f->dst_bytes);
	moet_upload_opts o = { .host_dst = 1, .from = from };
	int rc = moet_upload_many_opts(f->it, N_ITEMS, 3, &o, NULL);
	const char *msg = moet_errmsg();
	CHECK(rc == MOET_EIO && strstr(msg, path) && strstr(msg, "at offset") &&
	      strstr(msg, want) && !strchr(msg, '\n'), "%s: rc %d '%s' (want '%s', '%s')", what,
	      rc, msg, path, want);
	printf("%s: %s\n", what, msg);
}

static void failure_cases(fixture *f)
{
	setenv("MOET_UPLOAD_CHUNK_MB", "1", 1);
	setenv("MOET_UPLOAD_READ", "pread", 1);
	moet_upload_from from[N_ITEMS];
	/* a copy of the file, truncated to a third after the items were planned */
	char cut[600];
	snprintf(cut, sizeof(cut), "%s/cut.bin", f->dir);
	CHECK(moet_test_write_file(cut, f->ref, FILE_BYTES) == 0, "copy %s", cut);
	int fd = open(cut, O_RDWR | O_CLOEXEC);
	moet_upload_file fc = { fd, cut };
	for (int i = 0; i < N_ITEMS; i++)
		from[i] = (moet_upload_from){ &fc, f->from[i].off };
	CHECK(fd >= 0 && ftruncate(fd, FILE_BYTES / 3) == 0, "truncate %s", cut);
	expect_read_failure(f, from, cut, "end of file", "truncated file");
	/* the same descriptor closed */
	close(fd);
	expect_read_failure(f, from, cut, strerror(EBADF), "closed descriptor");
	/* a directory */
	fc.fd = open(f->dir, O_RDONLY | O_CLOEXEC);
	fc.path = f->dir;
	expect_read_failure(f, from, f->dir, strerror(EISDIR), "a directory");
	close(fc.fd);
	/* an injected EIO on the 5th read */
	setenv("MOET_UPLOAD_READ_FAULT", "eio:5", 1);
	expect_read_failure(f, f->from, f->path, strerror(EIO), "injected EIO");
	/* with the map source the files are not read: no failure */
	setenv("MOET_UPLOAD_READ", "map", 1);
	moet_upload_opts o = { .host_dst = 1, .from = f->from };
	memset(f->dst, 0xA5, f->dst_bytes);
	CHECK(moet_upload_many_opts(f->it, N_ITEMS, 3, &o, NULL) == 0 && check_dst(f, "map"),
	      "map ignores the files (and the read fault): %s", moet_errmsg());
	unsetenv("MOET_UPLOAD_READ_FAULT");
	unsetenv("MOET_UPLOAD_READ");
	unsetenv("MOET_UPLOAD_CHUNK_MB");
}

static void refusal_cases(fixture *f)
{
	const char *bad[][2] = { { "MOET_UPLOAD_READ", "mmap" }, { "MOET_UPLOAD_READ", "PREAD" },
				 { "MOET_UPLOAD_READ", "pread " },
				 { "MOET_UPLOAD_READ_FAULT", "eio:0" },
				 { "MOET_UPLOAD_READ_FAULT", "eio:3x" },
				 { "MOET_UPLOAD_READ_FAULT", "slow" } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char needle[64];
		snprintf(needle, sizeof(needle), "%s='%s'", bad[i][0], bad[i][1]);
		setenv(bad[i][0], bad[i][1], 1);
		/* device destinations: a refusal after any allocation would be a CUDA error */
		moet_upload_opts o = { .from = f->from };
		expect(moet_upload_many_opts(f->it, N_ITEMS, 2, &o, NULL), MOET_EINVAL, needle,
		       needle);
		if (!strcmp(bad[i][0], "MOET_UPLOAD_READ")) {
			int mode = -1;
			expect(moet_upload_read_mode(&mode), MOET_EINVAL, needle, needle);
			CHECK(strstr(moet_errmsg(), "map or pread"), "accepted values listed: %s",
			      moet_errmsg());
		}
		unsetenv(bad[i][0]);
	}
	const struct {
		const char *v;
		int want;
	} ok[] = { { "map", MOET_UPLOAD_READ_MAP }, { "pread", MOET_UPLOAD_READ_PREAD },
		   { "", MOET_UPLOAD_READ_MAP } };
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		int mode = -1;
		setenv("MOET_UPLOAD_READ", ok[i].v, 1);
		CHECK(moet_upload_read_mode(&mode) == 0 && mode == ok[i].want, "'%s': %d",
		      ok[i].v, mode);
	}
	unsetenv("MOET_UPLOAD_READ");
	int mode = -1;
	CHECK(moet_upload_read_mode(&mode) == 0 && mode == MOET_UPLOAD_READ_MAP, "unset: map");
	moet_upload_opts o = { .host_dst = 1, .read = 7 };
	CHECK(moet_upload_many_opts(f->it, 1, 1, &o, NULL) == MOET_EINVAL, "read mode 7 refused");
}

/* Every tensor of the checkpoint: located, read by pread, equal to its mapped bytes. */
static void ckpt_cases(const char *dir)
{
	moet_ckpt *ck = NULL;
	moet_upload_files *files = NULL;
	CHECK(moet_ckpt_open(dir, &ck) == 0, "ckpt: %s", moet_errmsg());
	if (!ck)
		return;
	CHECK(moet_ckpt_shard_count(ck) > 1, "%d shards", moet_ckpt_shard_count(ck));
	CHECK(moet_upload_files_open(ck, &files) == 0, "files: %s", moet_errmsg());
	const size_t n = moet_ckpt_count(ck);
	moet_upload_item *it = calloc(n, sizeof(*it));
	moet_upload_from *from = calloc(n, sizeof(*from));
	size_t total = 0, unaligned = 0;
	for (size_t i = 0; i < n; i++)
		total += moet_ckpt_at(ck, i)->n_bytes;
	uint8_t *dst = malloc(total + 1);
	if (!files || !it || !from || !dst)
		goto out;
	size_t at = 0;
	int located = 1;
	for (size_t i = 0; i < n; i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		int shard = -1;
		it[i] = (moet_upload_item){ t->data, dst + at, t->n_bytes };
		located &= moet_upload_files_locate(files, t->data, t->n_bytes, &from[i],
						    &shard) == 0 && shard == t->shard &&
			   from[i].file == moet_upload_files_at(files, shard);
		unaligned += from[i].off % 4096 != 0;
		at += t->n_bytes;
	}
	CHECK(located && unaligned > 0, "every tensor located in its shard (%zu off a page)",
	      unaligned);
	setenv("MOET_UPLOAD_READ", "pread", 1);
	setenv("MOET_UPLOAD_CHUNK_MB", "1", 1);
	moet_upload_opts o = { .host_dst = 1, .from = from };
	memset(dst, 0, total);
	CHECK(moet_upload_many_opts(it, (int64_t)n, 2, &o, NULL) == 0, "%s", moet_errmsg());
	int same = 1;
	for (size_t i = 0; i < n; i++)
		same &= memcmp(it[i].dst, it[i].src, it[i].bytes) == 0;
	CHECK(same, "pread of every tensor equals its mapped bytes");
	unsetenv("MOET_UPLOAD_READ");
	unsetenv("MOET_UPLOAD_CHUNK_MB");
	moet_upload_from x = { NULL, 0 };
	CHECK(moet_upload_files_locate(files, dst, 16, &x, NULL) == MOET_ERANGE && !x.file,
	      "a pointer outside the mapping refused");
	CHECK(moet_upload_files_at(files, -1) == NULL &&
	      moet_upload_files_at(files, moet_ckpt_shard_count(ck)) == NULL, "shard range");
out:
	free(it);
	free(from);
	free(dst);
	moet_upload_files_close(files);
	moet_ckpt_close(ck);
}

/* One uploader kept for many runs (runtime/stage.c's use): the items in halves (pread, then
 * copied from the mapping), then all of them: each run's destinations equal the file's bytes.
 * Another, made with an injected EIO (the 7th pread of its life): its first run fails with
 * the failure named, its next run (no fault left) is whole and right. */
static void reuse_cases(fixture *f)
{
	setenv("MOET_UPLOAD_CHUNK_MB", "1", 1);
	setenv("MOET_UPLOAD_READ", "pread", 1);
	moet_uploader *u = NULL, *v = NULL;
	moet_upload_opts o = { .host_dst = 1 };
	CHECK(moet_uploader_create(5, &o, &u) == 0, "uploader: %s", moet_errmsg());
	memset(f->dst, 0xA5, f->dst_bytes);
	for (int run = 0; u && run < 3; run++) {
		/* run 0 and 1: the first and second half (the second keeps the first's bytes) */
		const int lo = run == 1 ? N_ITEMS / 2 : 0, hi = run == 0 ? N_ITEMS / 2 : N_ITEMS;
		char what[64];
		snprintf(what, sizeof(what), "uploader run %d", run);
		int rc = moet_uploader_run(u, f->it + lo, hi - lo, run == 1 ? NULL : f->from + lo,
					   NULL);
		CHECK(rc == 0, "%s: %s", what, moet_errmsg());
		if (run >= 1)
			CHECK(rc == 0 && check_dst(f, what), "%s: destinations equal the file's bytes",
			      what);
	}
	setenv("MOET_UPLOAD_READ_FAULT", "eio:7", 1);
	CHECK(moet_uploader_create(3, &o, &v) == 0, "uploader with a fault: %s", moet_errmsg());
	unsetenv("MOET_UPLOAD_READ_FAULT");
	if (v) {
		expect(moet_uploader_run(v, f->it, N_ITEMS, f->from, NULL), MOET_EIO,
		       "Input/output error", "uploader run with EIO");
		memset(f->dst, 0xA5, f->dst_bytes);
		CHECK(moet_uploader_run(v, f->it, N_ITEMS, f->from, NULL) == 0 &&
		      check_dst(f, "uploader run after the failure"),
		      "the run after a failed one: %s", moet_errmsg());
	}
	moet_uploader_destroy(u);
	moet_uploader_destroy(v);
	moet_uploader_destroy(NULL);
	unsetenv("MOET_UPLOAD_READ");
	unsetenv("MOET_UPLOAD_CHUNK_MB");
}

int main(void)
{
	fixture f = { .fd = -1 };
	if (setup(&f) == 0) {
		bytes_cases(&f);
		reuse_cases(&f);
		failure_cases(&f);
		refusal_cases(&f);
	}
	if (f.map)
		munmap((void *)f.map, FILE_BYTES);
	if (f.fd >= 0)
		close(f.fd);
	if (f.dir) {
		char p[600];
		snprintf(p, sizeof(p), "%s/cut.bin", f.dir);
		unlink(p);
		unlink(f.path);
		rmdir(f.dir);
	}
	free(f.ref);
	free(f.dst);
	free(f.dir);
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 21;
	gp.shard_mb = 1; /* several shards */
	char *dir = moet_test_gen("upload-pread-ckpt", &gp);
	if (dir) {
		ckpt_cases(dir);
	}
	free(dir);
	return moet_test_done("test_upload_pread");
}
