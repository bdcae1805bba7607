/*
 * uring.c: the io_uring reader of shard byte ranges (moet_uring.h).
 *
 *   submit(ranges) -> range pool + issue queue (FIFO of ranges with chunks left to issue)
 *   fill()         -> while a request slot is free: next chunk of the queue's head range,
 *                     read or read_fixed SQE (user_data = request slot), io_uring_submit
 *   reap(cqe)      -> fault hook; res < 0: EAGAIN/EINTR resubmit, else the range fails;
 *                     res == 0 before the needed bytes: unexpected end of file;
 *                     short: resubmit the remainder (O_DIRECT: from the aligned position
 *                     at or below the first missing byte, so the request stays aligned)
 *                     chunk done -> range's chunks_left--; a range with no chunk left to
 *                     issue and none in flight finishes: callback, pool slot freed
 *
 * A request of an O_DIRECT file covers [offset rounded down, end rounded up) of its range in
 * chunk_bytes pieces at aligned file offsets, and lands at buf + (pos - aligned offset): the
 * exact bytes end up at buf + offset % ALIGN. A buffered file reads only the wanted bytes, to
 * the same addresses. NOTE: a failed range still waits for its other chunks in flight before
 * its callback runs (the kernel may be writing into its buffer until then), and issues no
 * more chunks.
 */
#include "moet_uring.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"

#define DEFAULT_QD 64u
#define MAX_QD 4096u
#define DEFAULT_CHUNK (1u << 20)
#define MAX_FAULTS 16
#define MAX_RETRIES 64 /* resubmissions of one request without progress */
#define ERR_BYTES 480

typedef struct ufile {
	int fd;
	int direct;
	uint64_t bytes;
	char *path;
} ufile;

typedef struct urange {
	moet_uring_range r;
	size_t index;
	moet_uring_done_fn fn;
	void *ctx;
	uint64_t lo, hi;       /* file bytes to read: aligned cover (direct) or exact */
	uint64_t cursor;       /* next chunk starts here */
	unsigned in_flight;    /* chunks issued and not finished */
	int rc;
	char err[ERR_BYTES];
	int next;              /* issue queue / free list link, -1 ends */
} urange;

typedef struct ureq {
	int range;             /* pool index */
	uint64_t pos;          /* file offset of the next byte to read */
	uint64_t need_end;     /* bytes before this are needed */
	uint64_t req_end;      /* the request reads up to here */
	uint64_t seq;          /* submission number (faults) */
	unsigned retries;
	int next_free;
} ureq;

typedef struct ubuf {
	uintptr_t lo, hi;
} ubuf;

struct moet_uring {
	struct io_uring ring;
	int ring_ok;
	moet_uring_opts o;
	ufile *files;
	int n_files;
	urange *rg;
	int rg_cap, rg_free;           /* free list head */
	int q_head, q_tail;            /* issue queue */
	size_t pending;                /* ranges not finished */
	ureq *req;
	int req_free;
	unsigned in_flight;
	unsigned to_submit;            /* prepared SQEs not yet submitted */
	ubuf *bufs;
	int n_bufs;
	int n_filled;                  /* places holding a registered buffer */
	int last_buf;                  /* buf_index's last hit */
	uint64_t seq;
	struct { uint64_t seq; int kind; } faults[MAX_FAULTS];
	int n_faults;
	int first_rc;
	char first_err[ERR_BYTES];
	char note[512];
	moet_uring_stats st;
};

static void add_note(moet_uring *u, const char *fmt, const char *a, const char *b)
{
	size_t at = strlen(u->note);
	if (at + 8 >= sizeof(u->note))
		return;
	snprintf(u->note + at, sizeof(u->note) - at, at ? "; " : "");
	at = strlen(u->note);
	snprintf(u->note + at, sizeof(u->note) - at, fmt, a, b);
}

static int parse_faults(moet_uring *u, const char *s)
{
	const char *p = s;
	while (*p) {
		int kind = !strncmp(p, "eio@", 4)      ? MOET_URING_FAULT_EIO
			   : !strncmp(p, "short@", 6)  ? MOET_URING_FAULT_SHORT
			   : !strncmp(p, "enospc@", 7) ? MOET_URING_FAULT_ENOSPC
						       : 0;
		if (!kind)
			return moet_err(MOET_EINVAL, "MOET_URING_FAULT='%s': expected a list of "
					"eio@N, short@N, enospc@N", s);
		p = strchr(p, '@') + 1;
		char *end;
		unsigned long long n = strtoull(p, &end, 10);
		if (end == p || n == 0 || (*end && *end != ','))
			return moet_err(MOET_EINVAL, "MOET_URING_FAULT='%s': request numbers start "
					"at 1", s);
		int rc = moet_uring_fault(u, n, kind);
		if (rc)
			return rc;
		p = end + (*end == ',');
	}
	return 0;
}

int moet_uring_create(const moet_uring_opts *o, moet_uring **out)
{
	moet_uring_opts d = { 0 };
	if (o)
		d = *o;
	if (!d.queue_depth)
		d.queue_depth = DEFAULT_QD;
	if (!d.chunk_bytes)
		d.chunk_bytes = DEFAULT_CHUNK;
	d.chunk_bytes = (d.chunk_bytes + MOET_URING_ALIGN - 1) / MOET_URING_ALIGN * MOET_URING_ALIGN;
	if (d.queue_depth > MAX_QD || d.direct < 0 || d.direct > MOET_URING_DIRECT_ON ||
	    d.chunk_bytes > (1u << 30))
		return moet_err(MOET_EINVAL, "io_uring reader: queue depth %u (1..%u), direct "
				"mode %d, chunk %zu bytes (at most 1 GiB)", d.queue_depth, MAX_QD,
				d.direct, d.chunk_bytes);
	moet_uring *u = calloc(1, sizeof(*u));
	if (!u)
		return moet_err(MOET_ENOMEM, "io_uring reader");
	u->o = d;
	u->rg_free = u->q_head = u->q_tail = -1;
	int rc;
	if (!(u->req = calloc(d.queue_depth, sizeof(*u->req)))) {
		rc = moet_err(MOET_ENOMEM, "io_uring reader: %u requests", d.queue_depth);
		goto fail;
	}
	for (unsigned i = 0; i < d.queue_depth; i++)
		u->req[i].next_free = i + 1 < d.queue_depth ? (int)i + 1 : -1;
	u->req_free = 0;
	int e = io_uring_queue_init(d.queue_depth, &u->ring, 0);
	if (e < 0) {
		rc = moet_err(MOET_EUNSUP, "io_uring_queue_init(%u): %s%s", d.queue_depth,
			      strerror(-e), e == -EPERM ? " (kernel.io_uring_disabled?)" : "");
		goto fail;
	}
	u->ring_ok = 1;
	const char *env = getenv("MOET_URING_FAULT");
	if (env && env[0] && (rc = parse_faults(u, env)))
		goto fail;
	*out = u;
	return 0;
fail:
	moet_uring_destroy(u);
	return rc;
}

void moet_uring_destroy(moet_uring *u)
{
	if (!u)
		return;
	/* NOTE: the kernel may still write into the callers' buffers: wait for every request */
	while (u->ring_ok && u->in_flight) {
		struct io_uring_cqe *cqe;
		if (io_uring_wait_cqe(&u->ring, &cqe) < 0)
			break;
		io_uring_cqe_seen(&u->ring, cqe);
		u->in_flight--;
	}
	if (u->ring_ok)
		io_uring_queue_exit(&u->ring);
	for (int i = 0; i < u->n_files; i++) {
		close(u->files[i].fd);
		free(u->files[i].path);
	}
	free(u->files);
	free(u->rg);
	free(u->req);
	free(u->bufs);
	free(u);
}

/* A probe read at offset 0 into aligned memory: does this fd take O_DIRECT reads? */
static int direct_works(int fd, int *out_errno)
{
	void *b = NULL;
	if (posix_memalign(&b, MOET_URING_ALIGN, MOET_URING_ALIGN))
		return *out_errno = ENOMEM, 0;
	ssize_t r = pread(fd, b, MOET_URING_ALIGN, 0);
	*out_errno = r < 0 ? errno : 0;
	free(b);
	return r >= 0;
}

int moet_uring_open(moet_uring *u, const char *path, int *out_file)
{
	if (u->n_files >= MOET_URING_MAX_FILES)
		return moet_err(MOET_ERANGE, "%s: more than %d files in one reader", path,
				MOET_URING_MAX_FILES);
	ufile f = { .fd = -1 };
	int why = 0;
	if (u->o.direct != MOET_URING_DIRECT_OFF) {
		f.fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
		if (f.fd < 0 && errno != EINVAL)
			return moet_err(errno == ENOENT ? MOET_ENOTFOUND : MOET_EIO, "%s: %s", path,
					strerror(errno));
		why = f.fd < 0 ? EINVAL : 0;
		if (f.fd >= 0 && !direct_works(f.fd, &why)) {
			close(f.fd);
			f.fd = -1;
		}
		if (f.fd < 0 && u->o.direct == MOET_URING_DIRECT_ON)
			return moet_err(MOET_EUNSUP, "%s: O_DIRECT refused (%s)", path,
					strerror(why));
		f.direct = f.fd >= 0;
	}
	if (f.fd < 0) {
		f.fd = open(path, O_RDONLY | O_CLOEXEC);
		if (f.fd < 0)
			return moet_err(errno == ENOENT ? MOET_ENOTFOUND : MOET_EIO, "%s: %s", path,
					strerror(errno));
		if (why)
			add_note(u, "%s: O_DIRECT refused (%s): buffered reads through the page "
				 "cache", path, strerror(why));
	}
	struct stat st;
	ufile *nf = realloc(u->files, (size_t)(u->n_files + 1) * sizeof(*nf));
	if (fstat(f.fd, &st) || !S_ISREG(st.st_mode) || !nf || !(f.path = strdup(path))) {
		int e = errno;
		close(f.fd);
		if (nf)
			u->files = nf;
		return nf ? moet_err(MOET_EIO, "%s: not a regular file (%s)", path, strerror(e))
			  : moet_err(MOET_ENOMEM, "%s: file table", path);
	}
	f.bytes = (uint64_t)st.st_size;
	u->files = nf;
	u->files[u->n_files] = f;
	*out_file = u->n_files++;
	return 0;
}

int moet_uring_file_direct(const moet_uring *u, int file)
{
	return file >= 0 && file < u->n_files && u->files[file].direct;
}

uint64_t moet_uring_file_bytes(const moet_uring *u, int file)
{
	return file >= 0 && file < u->n_files ? u->files[file].bytes : 0;
}

const char *moet_uring_file_path(const moet_uring *u, int file)
{
	return file >= 0 && file < u->n_files ? u->files[file].path : "";
}

int moet_uring_register(moet_uring *u, void *const *bufs, const size_t *bytes, int n)
{
	if (n < 0 || (n && (!bufs || !bytes)))
		return moet_err(MOET_EINVAL, "io_uring register: %d buffers", n);
	if (u->n_bufs)
		io_uring_unregister_buffers(&u->ring);
	free(u->bufs);
	u->bufs = NULL;
	u->n_bufs = u->n_filled = 0;
	if (!n)
		return 0;
	struct iovec *iov = calloc((size_t)n, sizeof(*iov));
	ubuf *ub = calloc((size_t)n, sizeof(*ub));
	if (!iov || !ub) {
		free(iov);
		free(ub);
		return moet_err(MOET_ENOMEM, "io_uring register: %d buffers", n);
	}
	size_t total = 0;
	for (int i = 0; i < n; i++) {
		iov[i] = (struct iovec){ bufs[i], bytes[i] };
		ub[i] = (ubuf){ (uintptr_t)bufs[i], (uintptr_t)bufs[i] + bytes[i] };
		total += bytes[i];
	}
	int e = io_uring_register_buffers(&u->ring, iov, (unsigned)n);
	free(iov);
	if (e < 0) {
		struct rlimit rl = { 0 };
		getrlimit(RLIMIT_MEMLOCK, &rl);
		char what[160];
		snprintf(what, sizeof(what), "%d buffers, %zu bytes", n, total);
		char why[200];
		snprintf(why, sizeof(why), "%s; RLIMIT_MEMLOCK %llu bytes", strerror(-e),
			 (unsigned long long)rl.rlim_cur);
		add_note(u, "registering %s failed (%s): unregistered reads", what, why);
		free(ub);
		return 0;
	}
	u->bufs = ub; /* in registration order: bufs[i] is the kernel's buffer i */
	u->n_bufs = u->n_filled = n;
	return 0;
}

int moet_uring_register_sparse(moet_uring *u, int n)
{
	if (n <= 0)
		return moet_err(MOET_EINVAL, "io_uring register: %d places", n);
	moet_uring_register(u, NULL, NULL, 0);
	if (!(u->bufs = calloc((size_t)n, sizeof(*u->bufs))))
		return moet_err(MOET_ENOMEM, "io_uring register: %d places", n);
	int e = io_uring_register_buffers_sparse(&u->ring, (unsigned)n);
	if (e < 0) {
		char what[64];
		snprintf(what, sizeof(what), "a table of %d buffers", n);
		add_note(u, "registering %s failed (%s): unregistered reads", what, strerror(-e));
		free(u->bufs);
		u->bufs = NULL;
		return 0;
	}
	u->n_bufs = n;
	u->n_filled = 0;
	return 0;
}

int moet_uring_register_one(moet_uring *u, int i, void *buf, size_t bytes)
{
	if (i < 0 || i >= u->n_bufs) {
		if (!u->n_bufs && strstr(u->note, "registering"))
			return 0; /* the table itself was refused (noted) */
		return moet_err(MOET_EINVAL, "io_uring register: place %d of %d", i, u->n_bufs);
	}
	struct iovec iov = { buf, bytes };
	int e = io_uring_register_buffers_update_tag(&u->ring, (unsigned)i, &iov, NULL, 1);
	if (e < 0) {
		struct rlimit rl = { 0 };
		getrlimit(RLIMIT_MEMLOCK, &rl);
		char what[96], why[160];
		snprintf(what, sizeof(what), "buffer %d (%zu bytes)", i, bytes);
		snprintf(why, sizeof(why), "%s; RLIMIT_MEMLOCK %llu bytes", strerror(-e),
			 (unsigned long long)rl.rlim_cur);
		add_note(u, "registering %s failed (%s): unregistered reads into it", what, why);
		return 0;
	}
	u->bufs[i] = (ubuf){ (uintptr_t)buf, (uintptr_t)buf + bytes };
	u->n_filled++;
	return 0;
}

int moet_uring_registered(const moet_uring *u)
{
	return u->n_filled > 0;
}

const char *moet_uring_note(const moet_uring *u)
{
	return u->note;
}

/* Index of the registered buffer holding [p, p + n), or -1. */
static int buf_index(moet_uring *u, const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	/* NOTE: a range's requests are consecutive: the last hit and its successor first */
	for (int k = 0; k < 2; k++) {
		int i = u->last_buf + k;
		if (i < u->n_bufs && a >= u->bufs[i].lo && a + n <= u->bufs[i].hi)
			return u->last_buf = i;
	}
	for (int i = 0; i < u->n_bufs; i++)
		if (a >= u->bufs[i].lo && a + n <= u->bufs[i].hi)
			return u->last_buf = i;
	return -1;
}

int moet_uring_fault(moet_uring *u, uint64_t nth, int kind)
{
	if (nth == 0 || kind < MOET_URING_FAULT_SHORT || kind > MOET_URING_FAULT_ENOSPC)
		return moet_err(MOET_EINVAL, "io_uring fault: request %llu, kind %d",
				(unsigned long long)nth, kind);
	if (u->n_faults >= MAX_FAULTS)
		return moet_err(MOET_ERANGE, "io_uring fault: more than %d pending", MAX_FAULTS);
	u->faults[u->n_faults].seq = u->seq + nth;
	u->faults[u->n_faults++].kind = kind;
	return 0;
}

static int grow_pool(moet_uring *u, size_t need)
{
	size_t have = 0;
	for (int i = u->rg_free; i >= 0; i = u->rg[i].next)
		have++;
	if (have >= need)
		return 0;
	size_t cap = (size_t)u->rg_cap + (need - have);
	if (cap < 2 * (size_t)u->rg_cap)
		cap = 2 * (size_t)u->rg_cap;
	if (cap > (size_t)1 << 30)
		return moet_err(MOET_ENOMEM, "io_uring reader: %zu ranges pending", cap);
	urange *rg = realloc(u->rg, cap * sizeof(*rg));
	if (!rg)
		return moet_err(MOET_ENOMEM, "io_uring reader: %zu ranges pending", cap);
	u->rg = rg;
	for (size_t i = cap; i-- > (size_t)u->rg_cap;) {
		rg[i].next = u->rg_free;
		u->rg_free = (int)i;
	}
	u->rg_cap = (int)cap;
	return 0;
}

int moet_uring_submit(moet_uring *u, const moet_uring_range *r, size_t n, moet_uring_done_fn fn,
		      void *ctx)
{
	for (size_t i = 0; i < n; i++) {
		const moet_uring_range *x = &r[i];
		if (x->file < 0 || x->file >= u->n_files)
			return moet_err(MOET_EINVAL, "io_uring range %zu: file %d not opened", i,
					x->file);
		const ufile *f = &u->files[x->file];
		if (!x->n_bytes || !x->buf || (uintptr_t)x->buf % MOET_URING_ALIGN ||
		    x->offset > f->bytes || x->n_bytes > f->bytes - x->offset)
			return moet_err(MOET_EINVAL, "%s: range %zu (%zu bytes at offset %llu, buf "
					"%p): empty, past the end of the %llu-byte file, or buf not "
					"%u-byte aligned", f->path, i, x->n_bytes,
					(unsigned long long)x->offset, x->buf,
					(unsigned long long)f->bytes, MOET_URING_ALIGN);
	}
	int rc = grow_pool(u, n);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		int k = u->rg_free;
		urange *g = &u->rg[k];
		u->rg_free = g->next;
		const ufile *f = &u->files[r[i].file];
		uint64_t end = r[i].offset + r[i].n_bytes;
		*g = (urange){ .r = r[i], .index = i, .fn = fn, .ctx = ctx, .next = -1 };
		g->lo = f->direct ? r[i].offset / MOET_URING_ALIGN * MOET_URING_ALIGN : r[i].offset;
		g->hi = f->direct ? (end + MOET_URING_ALIGN - 1) / MOET_URING_ALIGN * MOET_URING_ALIGN
				  : end;
		g->cursor = g->lo;
		if (u->q_tail >= 0)
			u->rg[u->q_tail].next = k;
		else
			u->q_head = k;
		u->q_tail = k;
		u->pending++;
	}
	return 0;
}

size_t moet_uring_pending(const moet_uring *u)
{
	return u->pending;
}

/* The destination of file offset pos of range g. */
static char *dst_of(const urange *g, uint64_t pos)
{
	uint64_t base = g->r.offset / MOET_URING_ALIGN * MOET_URING_ALIGN;
	return (char *)g->r.buf + (pos - base);
}

/* Takes range k out of the issue queue (a range is queued iff it has chunks to issue and
 * has not failed). */
static void unqueue(moet_uring *u, int k)
{
	for (int i = u->q_head, prev = -1; i >= 0; prev = i, i = u->rg[i].next) {
		if (i != k)
			continue;
		if (prev >= 0)
			u->rg[prev].next = u->rg[i].next;
		else
			u->q_head = u->rg[i].next;
		if (u->q_tail == k)
			u->q_tail = prev;
		u->rg[i].next = -1;
		return;
	}
}

static void prep(moet_uring *u, int qi)
{
	ureq *q = &u->req[qi];
	urange *g = &u->rg[q->range];
	const ufile *f = &u->files[g->r.file];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	size_t len = (size_t)(q->req_end - q->pos);
	char *dst = dst_of(g, q->pos);
	int bi = buf_index(u, dst, len);
	if (bi >= 0)
		io_uring_prep_read_fixed(sqe, f->fd, dst, (unsigned)len, q->pos, bi);
	else
		io_uring_prep_read(sqe, f->fd, dst, (unsigned)len, q->pos);
	io_uring_sqe_set_data64(sqe, (uint64_t)qi);
	q->seq = ++u->seq;
	u->in_flight++;
	u->to_submit++;
	u->st.requests++;
	if (u->in_flight > u->st.max_in_flight)
		u->st.max_in_flight = u->in_flight;
}

/* Issues chunks while request slots are free; submits. */
static int fill(moet_uring *u)
{
	while (u->req_free >= 0 && u->q_head >= 0) {
		int k = u->q_head;
		urange *g = &u->rg[k];
		int qi = u->req_free;
		ureq *q = &u->req[qi];
		u->req_free = q->next_free;
		uint64_t cend = g->cursor + u->o.chunk_bytes;
		if (cend > g->hi)
			cend = g->hi;
		uint64_t want_end = g->r.offset + g->r.n_bytes;
		*q = (ureq){ .range = k, .pos = g->cursor, .req_end = cend,
			     .need_end = cend < want_end ? cend : want_end, .next_free = -1 };
		g->cursor = cend;
		g->in_flight++;
		if (cend >= g->hi) /* fully issued: leave the queue */
			unqueue(u, k);
		prep(u, qi);
	}
	if (u->to_submit) { /* new chunks and retries prepared by reap */
		u->to_submit = 0;
		int e = io_uring_submit(&u->ring);
		if (e < 0)
			return moet_err(MOET_EIO, "io_uring_submit: %s", strerror(-e));
	}
	return 0;
}

static void fail_range(moet_uring *u, urange *g, const ureq *q, int err, const char *what)
{
	if (g->rc)
		return;
	if (g->cursor < g->hi)
		unqueue(u, (int)(g - u->rg));
	g->rc = MOET_EIO;
	snprintf(g->err, sizeof(g->err), "%s: read of %zu bytes at offset %llu failed: %s "
		 "(request of %llu bytes at offset %llu)", u->files[g->r.file].path, g->r.n_bytes,
		 (unsigned long long)g->r.offset, what ? what : strerror(err),
		 (unsigned long long)(q->req_end - q->pos), (unsigned long long)q->pos);
}

/* The range's last chunk is done: callback, counters, slot back to the free list. */
static void finish_range(moet_uring *u, int k)
{
	urange g = u->rg[k]; /* NOTE: a copy: the callback may submit, which may move the pool */
	u->rg[k].next = u->rg_free;
	u->rg_free = k;
	u->pending--;
	u->st.ranges++;
	if (g.rc) {
		u->st.failed++;
		if (!u->first_rc) {
			u->first_rc = g.rc;
			memcpy(u->first_err, g.err, sizeof(g.err));
		}
	} else {
		u->st.bytes_wanted += g.r.n_bytes;
	}
	if (g.fn) {
		moet_uring_done d = { .range = &g.r, .index = g.index, .rc = g.rc,
				      .error = g.rc ? g.err : "",
				      .data = g.rc ? NULL : (const char *)g.r.buf +
							    g.r.offset % MOET_URING_ALIGN };
		g.fn(g.ctx, &d);
	}
}

static int apply_fault(moet_uring *u, const ureq *q, int res)
{
	for (int i = 0; i < u->n_faults; i++) {
		if (u->faults[i].seq != q->seq)
			continue;
		int kind = u->faults[i].kind;
		u->faults[i] = u->faults[--u->n_faults];
		if (kind == MOET_URING_FAULT_EIO)
			return -EIO;
		if (kind == MOET_URING_FAULT_ENOSPC)
			return -ENOSPC;
		const urange *g = &u->rg[q->range];
		if (u->files[g->r.file].direct) {
			if (res > (int)MOET_URING_ALIGN)
				res = (int)((unsigned)(res / 2) / MOET_URING_ALIGN * MOET_URING_ALIGN);
			if (res < (int)MOET_URING_ALIGN && res > 0)
				res = (int)MOET_URING_ALIGN;
		} else if (res > 1) {
			res /= 2;
		}
		return res;
	}
	return res;
}

/* One completion. Returns 1 when it finished a range. */
static int reap(moet_uring *u, int qi, int res)
{
	ureq *q = &u->req[qi];
	urange *g = &u->rg[q->range];
	const ufile *f = &u->files[g->r.file];
	u->in_flight--;
	res = apply_fault(u, q, res);
	int again = 0;
	if (res == -EAGAIN || res == -EINTR) {
		again = ++q->retries <= MAX_RETRIES;
		if (!again)
			fail_range(u, g, q, -res, NULL);
	} else if (res < 0) {
		fail_range(u, g, q, -res, NULL);
	} else if (res == 0 && q->pos < q->need_end) {
		char what[96];
		snprintf(what, sizeof(what), "unexpected end of file at offset %llu",
			 (unsigned long long)q->pos);
		fail_range(u, g, q, 0, what);
	} else if (res > 0) {
		u->st.bytes_read += (uint64_t)res;
		uint64_t pos = q->pos + (uint64_t)res;
		if (pos < q->need_end) { /* short read: the remainder */
			if (f->direct)
				pos = pos / MOET_URING_ALIGN * MOET_URING_ALIGN;
			if (pos == q->pos)
				again = ++q->retries <= MAX_RETRIES;
			else
				again = 1, q->retries = 0;
			if (!again)
				fail_range(u, g, q, 0, "no progress after repeated short reads");
			q->pos = pos;
		}
	}
	if (again && !g->rc) {
		u->st.retries++;
		prep(u, qi);
		return 0;
	}
	q->next_free = u->req_free;
	u->req_free = qi;
	g->in_flight--;
	if (g->in_flight == 0 && (g->cursor >= g->hi || g->rc)) {
		finish_range(u, q->range);
		return 1;
	}
	return 0;
}

int moet_uring_poll(moet_uring *u, int wait)
{
	int rc = fill(u), done = 0;
	if (rc)
		return rc;
	if (wait && u->in_flight) {
		struct io_uring_cqe *cqe;
		int e = io_uring_wait_cqe(&u->ring, &cqe);
		if (e < 0 && e != -EINTR)
			return moet_err(MOET_EIO, "io_uring_wait_cqe: %s", strerror(-e));
	}
	for (;;) {
		struct io_uring_cqe *cqe;
		if (io_uring_peek_cqe(&u->ring, &cqe) != 0)
			break;
		int qi = (int)io_uring_cqe_get_data64(cqe), res = cqe->res;
		io_uring_cqe_seen(&u->ring, cqe);
		done += reap(u, qi, res);
	}
	rc = fill(u);
	return rc ? rc : done;
}

int moet_uring_drain(moet_uring *u)
{
	while (u->pending) {
		int rc = moet_uring_poll(u, 1);
		if (rc < 0)
			return rc;
	}
	int rc = u->first_rc;
	if (rc)
		moet_err(rc, "%s", u->first_err);
	u->first_rc = 0;
	return rc;
}

int moet_uring_read(moet_uring *u, const moet_uring_range *r, size_t n, moet_uring_done_fn fn,
		    void *ctx)
{
	int rc = moet_uring_submit(u, r, n, fn, ctx);
	return rc ? rc : moet_uring_drain(u);
}

void moet_uring_stats_get(const moet_uring *u, moet_uring_stats *out)
{
	*out = u->st;
}

int moet_uring_shard_maps(const moet_ckpt *ck, moet_uring_shard_map *out)
{
	const int n = moet_ckpt_shard_count(ck);
	memset(out, 0, (size_t)n * sizeof(*out));
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		const uint8_t *p = t->data;
		if (!out[t->shard].base || p < out[t->shard].base)
			out[t->shard].base = p;
	}
	for (int i = 0; i < n; i++) {
		const char *path = moet_ckpt_shard_path(ck, i);
		uint8_t hdr[8];
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t r = fd >= 0 ? pread(fd, hdr, 8, 0) : -1;
		int e = errno;
		if (fd >= 0)
			close(fd);
		if (r != 8)
			return moet_err(MOET_EIO, "%s: reading the header length: %s", path,
					r < 0 ? strerror(e) : "short file");
		uint64_t n_hdr = 0;
		for (int b = 7; b >= 0; b--)
			n_hdr = n_hdr << 8 | hdr[b];
		uint64_t size = moet_ckpt_shard_bytes(ck, i);
		if (8 + n_hdr > size)
			return moet_err(MOET_EIO, "%s: header of %llu bytes past the end of the "
					"%llu-byte file", path, (unsigned long long)n_hdr,
					(unsigned long long)size);
		out[i].data_start = 8 + n_hdr;
		out[i].data_bytes = size - out[i].data_start;
	}
	return 0;
}

int moet_uring_locate(const moet_uring_shard_map *maps, int n_shards, const void *p,
		      size_t n_bytes, int *out_shard, uint64_t *out_offset)
{
	const uintptr_t a = (uintptr_t)p;
	for (int i = 0; i < n_shards; i++) {
		const uintptr_t lo = (uintptr_t)maps[i].base;
		if (!maps[i].base || a < lo || a - lo > maps[i].data_bytes ||
		    n_bytes > maps[i].data_bytes - (a - lo))
			continue;
		*out_shard = i;
		*out_offset = maps[i].data_start + (uint64_t)(a - lo);
		return 0;
	}
	return moet_err(MOET_ERANGE, "%zu bytes at %p are not inside a shard's mapped tensors",
			n_bytes, p);
}
