/*
 * upload_uring.c: the uring upload source (moet_upload.h): matrices' bytes from the shard
 * files to device memory through io_uring reads into registered pinned staging buffers.
 *
 *   items     every tensor's (shard, file offset, bytes) and its place in the block
 *             (moet_uring_locate on the mapped pointers: the mapping is never read)
 *   segments  items sorted by (shard, offset), merged when at most MERGE_GAP apart: one
 *             expert's six tensors, usually a whole shard's experts, are one segment
 *   fills     a segment cut into pieces that fit a staging buffer; fill k uses buffer
 *             k % n_bufs:
 *
 *     staging buffer (4096-aligned, buf_bytes)
 *     [piece 0 aligned cover ......][piece 1 cover ...]..[unused]
 *      ^ + file offset % 4096: the exact bytes; a copy per (piece x item) overlap:
 *        block + item.dst + (a - item.off) <- buffer + piece.pos + head + (a - piece.off)
 *
 *   a piece is cut where its end is 4096-aligned in the file (head + len = room left), so
 *   the next piece starts with head 0 and a staging buffer wastes no more than one page.
 *
 * Pipeline (one thread): while the next fill's buffer is not being read, wait for its last
 * copies (its event), plan the fill, submit its reads; then poll the reader. When a fill's
 * last read completes (the reader's callback) its copies are queued on one copy stream and an
 * event recorded: so n_bufs - 1 buffers are being read while one is copied, and the disk,
 * the link and this thread wait on each other only as much as the slowest needs. With
 * host_dst (the CPU backend) the copies are memcpy, done in the callback.
 *
 * NOTE: out[] is written only after every copy has completed, so a failed read leaves the
 * caller's views untouched (nothing half-bound); the reader is destroyed (it waits for reads
 * in flight) and the copy stream synchronised before the staging buffers are freed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"
#include "moet_upload.h"
#include "moet_uring.h"

#define DEFAULT_BUF ((size_t)64 << 20)
#define MIN_BUF ((size_t)8 << 10)
#define MAX_BUF ((size_t)1 << 30) /* the kernel's limit per registered buffer */
#define DEFAULT_NBUF 4
#define MAX_NBUF 16
#define MERGE_GAP ((uint64_t)64 << 10)

enum { F_IDLE = 0, F_READING, F_COPYING };

typedef struct item {
	int file;                 /* shard (= reader file id) */
	uint64_t off;             /* file offset */
	size_t bytes;
	size_t dst;               /* offset in the block */
} item;

typedef struct seg {
	int file;
	uint64_t off, end;        /* file bytes [off, end) */
	int64_t first, last;      /* its items [first, last) */
} seg;

typedef struct cpy {
	size_t dst, src, bytes;   /* block offset, buffer offset */
} cpy;

typedef struct fill {
	char *buf;
	void *ev;
	int state;                /* F_* */
	int reads_left, failed;
	moet_uring_range *rd;
	int n_rd, cap_rd;
	cpy *cp;
	int n_cp, cap_cp;
} fill;

typedef struct up {
	const item *it;
	const seg *sg;
	int64_t n_sg;
	int64_t s, i_first;       /* planning cursor: segment, first item not yet passed */
	uint64_t cur;             /* and file offset */
	size_t buf_bytes;
	char *block;
	int host;
	void *stream;
	fill *f;
	int rc;
	char err[600];
	uint64_t done, total, copies;
	int bar;
	double t0, last;
} up;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bar_show(up *u, int final)
{
	if (!u->bar)
		return;
	const int tty = isatty(STDERR_FILENO);
	double now = now_s(), el = now - u->t0;
	if (!final && now - u->last < (tty ? 0.1 : 2.0))
		return;
	u->last = now;
	double rate = el > 0 ? (double)u->done / el : 0;
	double eta = rate > 0 ? (double)(u->total - u->done) / rate : 0;
	char line[31];
	int w = 30, n = u->total ? (int)((double)w * (double)u->done / (double)u->total) : w;
	for (int i = 0; i < w; i++)
		line[i] = i < n ? '#' : '.';
	line[w] = 0;
	fprintf(stderr, "%supload (io_uring) [%s] %.2f / %.2f GB, %.2f GB/s, ETA %.1f s%s",
		tty ? "\r" : "", line, (double)u->done / 1e9, (double)u->total / 1e9, rate / 1e9,
		eta, tty && !final ? "" : "\n");
}

static int cmp_item(const void *a, const void *b)
{
	const item *p = a, *q = b;
	if (p->file != q->file)
		return p->file < q->file ? -1 : 1;
	return p->off < q->off ? -1 : p->off > q->off;
}

static int grow(void **arr, int *cap, int need, size_t elem)
{
	if (need <= *cap)
		return 0;
	int nc = *cap ? 2 * *cap : 16;
	while (nc < need)
		nc *= 2;
	void *p = realloc(*arr, (size_t)nc * elem);
	if (!p)
		return moet_err(MOET_ENOMEM, "upload: staging plan");
	*arr = p;
	*cap = nc;
	return 0;
}

/* Plans the next fill into f (reads and copies); 0 with f->n_rd == 0 when nothing is left. */
static int plan_fill(up *u, fill *f, int fi)
{
	size_t p = 0;
	f->n_rd = f->n_cp = 0;
	while (u->s < u->n_sg) {
		const seg *sg = &u->sg[u->s];
		size_t head = (size_t)(u->cur % MOET_URING_ALIGN);
		if (u->buf_bytes - p <= head)
			break;
		uint64_t len = u->buf_bytes - p - head;
		if (len > sg->end - u->cur)
			len = sg->end - u->cur;
		const uint64_t a0 = u->cur, b0 = u->cur + len;
		if (grow((void **)&f->rd, &f->cap_rd, f->n_rd + 1, sizeof(*f->rd)))
			return MOET_ENOMEM;
		f->rd[f->n_rd++] = (moet_uring_range){ .file = sg->file, .offset = a0,
						       .n_bytes = (size_t)len, .buf = f->buf + p,
						       .user = (void *)(intptr_t)fi };
		for (int64_t j = u->i_first; j < sg->last && u->it[j].off < b0; j++) {
			const item *x = &u->it[j];
			uint64_t a = x->off > a0 ? x->off : a0;
			uint64_t b = x->off + x->bytes < b0 ? x->off + x->bytes : b0;
			if (a >= b)
				continue;
			if (grow((void **)&f->cp, &f->cap_cp, f->n_cp + 1, sizeof(*f->cp)))
				return MOET_ENOMEM;
			f->cp[f->n_cp++] = (cpy){ x->dst + (size_t)(a - x->off),
						  p + head + (size_t)(a - a0), (size_t)(b - a) };
		}
		while (u->i_first < sg->last && u->it[u->i_first].off + u->it[u->i_first].bytes <= b0)
			u->i_first++;
		p += moet_uring_span(a0, (size_t)len);
		u->cur = b0;
		if (u->cur >= sg->end && ++u->s < u->n_sg) {
			u->i_first = u->sg[u->s].first;
			u->cur = u->sg[u->s].off;
		}
	}
	return 0;
}

/* A fill's reads are all in: its copies (or nothing, after a failure). */
static void fill_done(up *u, fill *f)
{
	f->state = F_IDLE;
	if (f->failed || u->rc)
		return;
	int rc = 0;
	for (int i = 0; i < f->n_cp && !rc; i++) {
		const cpy *c = &f->cp[i];
		if (u->host)
			memcpy(u->block + c->dst, f->buf + c->src, c->bytes);
		else
			rc = moet_gpu_copy_h2d_async(u->block + c->dst, f->buf + c->src, c->bytes,
						     u->stream);
		u->done += c->bytes;
	}
	u->copies += (uint64_t)f->n_cp;
	if (!rc && !u->host && !(rc = moet_gpu_event_record(f->ev, u->stream)))
		f->state = F_COPYING;
	if (rc) {
		u->rc = rc;
		snprintf(u->err, sizeof(u->err), "host-to-device copy: %s", moet_errmsg());
	}
	bar_show(u, 0);
}

static void on_read(void *ctx, const moet_uring_done *d)
{
	up *u = ctx;
	fill *f = &u->f[(intptr_t)d->range->user];
	if (d->rc) {
		f->failed = 1;
		if (!u->rc) {
			u->rc = d->rc;
			snprintf(u->err, sizeof(u->err), "%s", d->error);
		}
	}
	if (--f->reads_left == 0)
		fill_done(u, f);
}

size_t moet_upload_block_bytes(const moet_mat *host, int64_t n)
{
	size_t at = 0;
	const size_t A = MOET_UPLOAD_ALIGN;
	for (int64_t i = 0; i < n; i++) {
		at += (moet_mat_data_bytes(&host[i]) + A - 1) / A * A;
		if (host[i].scale_inv)
			at += (moet_mat_scale_bytes(&host[i]) + A - 1) / A * A;
	}
	return at;
}

int moet_upload_source(int *out)
{
	/* NOTE: the default (auto: staged from 256 MiB, else plain) has no name of its own */
	static const char *const names[] = { NULL, "staged", "plain", "uring" };
	static const int source[] = { MOET_UPLOAD_AUTO, MOET_UPLOAD_STAGED, MOET_UPLOAD_PLAIN,
				      MOET_UPLOAD_URING };
	int i = 0, rc = moet_env_choice("MOET_UPLOAD", names, 4, &i);
	*out = source[i];
	return rc;
}

/* The items of the n matrices (data, then scales) with their block positions. */
static int make_items(const moet_ckpt *ck, const moet_mat *host, int64_t n, item *it,
		      int64_t *out_n, uint64_t *out_total)
{
	const int n_sh = moet_ckpt_shard_count(ck);
	moet_uring_shard_map *maps = calloc((size_t)(n_sh ? n_sh : 1), sizeof(*maps));
	if (!maps)
		return moet_err(MOET_ENOMEM, "upload: shard table");
	int rc = moet_uring_shard_maps(ck, maps);
	int64_t k = 0;
	size_t at = 0;
	const size_t A = MOET_UPLOAD_ALIGN;
	uint64_t total = 0;
	for (int64_t i = 0; i < n && !rc; i++) {
		const void *p[2] = { host[i].data, host[i].scale_inv };
		size_t b[2] = { moet_mat_data_bytes(&host[i]), moet_mat_scale_bytes(&host[i]) };
		for (int t = 0; t < 2 && !rc; t++) {
			if (!p[t])
				continue;
			if (b[t] && (rc = moet_uring_locate(maps, n_sh, p[t], b[t], &it[k].file,
							    &it[k].off)))
				rc = moet_err(rc, "upload: matrix %lld (%lld x %lld) %s: %s",
					      (long long)i, (long long)host[i].rows,
					      (long long)host[i].cols, t ? "scales" : "data",
					      moet_errmsg());
			it[k].bytes = b[t];
			it[k].dst = at;
			at += (b[t] + A - 1) / A * A;
			total += b[t];
			k++;
		}
	}
	free(maps);
	*out_n = k;
	*out_total = total;
	return rc;
}

/* Sorted copies of the non-empty items and their segments. */
static int make_segments(const item *it, int64_t n, item **out_it, seg **out_sg, int64_t *out_n)
{
	item *s = malloc((size_t)(n ? n : 1) * sizeof(*s));
	seg *g = malloc((size_t)(n ? n : 1) * sizeof(*g));
	if (!s || !g) {
		free(s);
		free(g);
		return moet_err(MOET_ENOMEM, "upload: %lld tensors", (long long)n);
	}
	int64_t m = 0, k = 0;
	for (int64_t i = 0; i < n; i++)
		if (it[i].bytes)
			s[m++] = it[i];
	qsort(s, (size_t)m, sizeof(*s), cmp_item);
	for (int64_t i = 0; i < m; i++) {
		uint64_t end = s[i].off + s[i].bytes;
		seg *last = k ? &g[k - 1] : NULL;
		if (last && last->file == s[i].file && s[i].off <= last->end + MERGE_GAP) {
			if (end > last->end)
				last->end = end;
			last->last = i + 1;
		} else {
			g[k++] = (seg){ s[i].file, s[i].off, end, i, i + 1 };
		}
	}
	*out_it = s;
	*out_sg = g;
	*out_n = k;
	return 0;
}

/* 0 if an O_DIRECT read of path into buf fails with EFAULT (memory the kernel cannot pin
 * for direct I/O), else 1 (other failures are the reader's to report). */
static int direct_into(const char *path, void *buf)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
	if (fd < 0)
		return 1;
	ssize_t r = pread(fd, buf, MOET_URING_ALIGN, 0);
	int e = errno;
	close(fd);
	return !(r < 0 && e == EFAULT);
}

static size_t env_buf_bytes(void)
{
	const char *s = getenv("MOET_UPLOAD_BUF_KB");
	long long kb = s ? atoll(s) : 0;
	return kb > 0 ? (size_t)kb << 10 : DEFAULT_BUF;
}

int moet_upload_mats_uring(const moet_ckpt *ck, const moet_mat *host, int64_t n, void *block,
			   const moet_upload_uring_opts *o, moet_mat *out,
			   moet_upload_stats *stats)
{
	moet_upload_uring_opts d = { 0 };
	if (o)
		d = *o;
	const double t0 = now_s();
	const int nb = d.n_bufs ? d.n_bufs : DEFAULT_NBUF;
	size_t bb = d.buf_bytes ? d.buf_bytes : env_buf_bytes();
	bb = (bb + MOET_URING_ALIGN - 1) / MOET_URING_ALIGN * MOET_URING_ALIGN;
	if (nb < 2 || nb > MAX_NBUF || bb < MIN_BUF || bb > MAX_BUF || n < 0 ||
	    (n && (!block || (uintptr_t)block % MOET_UPLOAD_ALIGN)))
		return moet_err(MOET_EINVAL, "upload: %d staging buffers (2..%d) of %zu bytes "
				"(8 KiB .. 1 GiB), %lld matrices, block %p (%u-byte aligned)", nb,
				MAX_NBUF, bb, (long long)n, block, MOET_UPLOAD_ALIGN);
	item *it = malloc((size_t)(2 * n + 1) * sizeof(*it)), *sorted = NULL;
	seg *sg = NULL;
	fill f[MAX_NBUF] = { 0 };
	char *staging = NULL, *pinned = NULL;
	moet_uring *ur = NULL;
	up u = { .buf_bytes = bb, .block = block, .host = d.host_dst, .f = f };
	int64_t n_it = 0;
	moet_uring_stats us = { 0 };
	int direct = 1, registered = 0;
	int rc = it ? 0 : moet_err(MOET_ENOMEM, "upload: %lld matrices", (long long)n);
	if (!rc)
		rc = make_items(ck, host, n, it, &n_it, &u.total);
	if (!rc)
		rc = make_segments(it, n_it, &sorted, &sg, &u.n_sg);
	u.it = sorted;
	u.sg = sg;
	if (rc || u.n_sg == 0)
		goto done;
	if (u.host) {
		if (!(staging = aligned_alloc(MOET_URING_ALIGN, (size_t)nb * bb)))
			rc = moet_err(MOET_ENOMEM, "upload: %d staging buffers of %zu bytes", nb, bb);
	} else if (!(rc = moet_gpu_host_alloc((size_t)nb * bb + MOET_URING_ALIGN,
					      (void **)&pinned))) {
		/* NOTE: cudaHostAlloc promises no page alignment (2048 seen on the H200 host);
		 * O_DIRECT reads need it */
		staging = pinned + (MOET_URING_ALIGN - (uintptr_t)pinned % MOET_URING_ALIGN) %
					   MOET_URING_ALIGN;
		rc = moet_gpu_stream_create(&u.stream);
		/* NOTE: should the kernel refuse to register the driver's pinned memory, an
		 * unregistered O_DIRECT read into it could fail (EFAULT): buffered reads then */
		if (!rc && d.direct != MOET_URING_DIRECT_OFF &&
		    !direct_into(moet_ckpt_shard_path(ck, u.sg[0].file), staging))
			d.direct = MOET_URING_DIRECT_OFF;
	}
	moet_uring_opts uo = { .queue_depth = d.queue_depth, .direct = d.direct };
	if (!rc)
		rc = moet_uring_create(&uo, &ur);
	for (int i = 0; i < moet_ckpt_shard_count(ck) && !rc; i++) {
		int id;
		rc = moet_uring_open(ur, moet_ckpt_shard_path(ck, i), &id);
		direct &= !rc && moet_uring_file_direct(ur, id);
	}
	void *bufs[MAX_NBUF];
	size_t bytes[MAX_NBUF];
	for (int i = 0; i < nb && !rc; i++) {
		f[i].buf = staging + (size_t)i * bb;
		bufs[i] = f[i].buf;
		bytes[i] = bb;
		if (!u.host)
			rc = moet_gpu_event_create(&f[i].ev);
	}
	if (!rc)
		rc = moet_uring_register(ur, bufs, bytes, nb);
	if (rc)
		goto done;
	registered = moet_uring_registered(ur);
	u.bar = d.progress > 0 || (d.progress == 0 && (isatty(STDERR_FILENO) ||
			(getenv("MOET_UPLOAD_PROGRESS") && !strcmp(getenv("MOET_UPLOAD_PROGRESS"), "1"))));
	u.t0 = u.last = now_s();
	u.i_first = sg[0].first;
	u.cur = sg[0].off;
	for (int64_t next = 0;;) {
		while (!u.rc && u.s < u.n_sg) {
			fill *x = &f[next % nb];
			if (x->state == F_READING)
				break;
			if (x->state == F_COPYING) {
				if ((rc = moet_gpu_event_sync(x->ev)))
					goto done;
				x->state = F_IDLE;
			}
			if ((rc = plan_fill(&u, x, (int)(next % nb))))
				goto done;
			if (!x->n_rd)
				break;
			x->reads_left = x->n_rd;
			x->failed = 0;
			x->state = F_READING;
			if ((rc = moet_uring_submit(ur, x->rd, (size_t)x->n_rd, on_read, &u)))
				goto done;
			next++;
		}
		if (!moet_uring_pending(ur))
			break;
		int got = moet_uring_poll(ur, 1);
		if (got < 0) {
			rc = got;
			goto done;
		}
	}
	bar_show(&u, 1);
done:
	if (ur)
		moet_uring_stats_get(ur, &us);
	moet_uring_destroy(ur); /* waits for reads in flight into the staging buffers */
	if (u.stream) {
		int e = moet_gpu_sync(u.stream);
		if (!rc && !u.rc)
			rc = e;
	}
	if (!rc && u.rc)
		rc = moet_err(u.rc, "upload: %s", u.err);
	if (!rc)
		for (int64_t i = 0, k = 0; i < n; i++) {
			out[i] = host[i];
			out[i].data = u.block + it[k++].dst;
			if (host[i].scale_inv)
				out[i].scale_inv = (const float *)(u.block + it[k++].dst);
		}
	if (stats)
		*stats = (moet_upload_stats){ .bytes = u.total, .seconds = now_s() - t0,
					      .read_bytes = us.bytes_read, .reads = us.ranges,
					      .copies = u.copies, .direct = ur && direct,
					      .registered = registered };
	for (int i = 0; i < nb; i++) {
		moet_gpu_event_destroy(f[i].ev);
		free(f[i].rd);
		free(f[i].cp);
	}
	moet_gpu_stream_destroy(u.stream);
	if (u.host)
		free(staging);
	else
		moet_gpu_host_free(pinned);
	free(it);
	free(sorted);
	free(sg);
	return rc;
}
