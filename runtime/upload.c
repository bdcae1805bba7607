/*
 * upload.c: many host byte ranges (the checkpoint's mapped bytes) to device memory at the
 * link's speed: the hot experts' upload at start (issue 5: >= 80% of min(source read
 * bandwidth, host-to-device bandwidth)).
 *
 *   ranges -> chunks of at most a buffer's bytes (a range may span several chunks, a chunk
 *             several ranges)
 *   chunk i: its T slices are filled into pinned buffer i % NBUF by T threads (one thread
 *            reads ~10-15 GB/s, the link takes ~55), then async copies of the buffer to the
 *            device on a copy stream (one per run of pieces contiguous on both sides) and an
 *            event; before buffer b is filled again its event has been waited for
 *
 * So the fills of the next chunks overlap the transfer of chunk i, and no host copy outlives
 * the call (the pinned buffers are freed at the end). A plain cudaMemcpy from the mapped pages
 * instead stages through the driver's small pinned buffer on one thread (~5 GB/s measured).
 *
 * NOTE: the worker threads are made per call and live for it (threads per chunk would cost
 * too much). The whole plan (every chunk's pieces) is made before they start; each takes the
 * next (chunk, slice) unit from a counter and fills it once the chunk's buffer is free, so a
 * thread done with its slice goes on to the next chunk instead of waiting for the slowest one
 * (while the caller waits for chunk c, chunks up to c + NBUF - 2 are being filled). The
 * caller waits for each chunk's last slice, queues its copies, and frees buffers by waiting
 * for the events of the copies before the last. NOTE (measured, H200, docs/hybrid.md): the
 * team before, one chunk at a time with every thread waiting for the slowest slice, filled at
 * ~40-45 GB/s during the upload and held it at 38-41 GB/s; this one leaves the link waiting.
 *
 * With non-temporal stores the host's DRAM moves three bytes per uploaded byte: the source
 * read, the staging write, the DMA's read of the staging. Plain stores into buffers that fit
 * the last-level cache (MOET_UPLOAD_STORE=cached, MOET_UPLOAD_CHUNK_MB=8: the defaults;
 * staged_opts says why) are meant to save the last two.
 * NOTE (what was tried): DMA from the mapped pages page-locked in place (cudaHostRegister,
 * MOET_UPLOAD=register) measured 1.0-1.4 GB/s serial, and its threaded version hung on the
 * H200 machine; removed (docs/hybrid.md). Both pinned a private mapping, which Linux copies
 * page by page (the shards are mapped shared since: 5-10 GB/s measured, no copy).
 *
 * The source (MOET_UPLOAD_READ): map copies from the items' host bytes (the checkpoint's
 * mapping: the first touch of each page is a page fault taken by the filling thread); pread
 * reads an item that has a file (moet_upload_opts.from) from it at its offset straight into
 * the staging buffer (the kernel copies from the page cache: no fault, no page table). A
 * thread's slice is read piece by piece: short reads continued, EINTR retried; a failed
 * read stops the upload after the chunk (nothing later is copied) with the file, offset and
 * errno named.
 *
 * Host destinations (moet_upload_opts.host_dst, fill_only) run the same pipeline on the CPU:
 * staging from aligned_alloc, each chunk memcpy'd out (or not at all) instead of the async
 * copies: the tests' and bench load's fill rows' form.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "moet_env.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"
#include "moet_topo.h"
#include "moet_upload.h"

#define CHUNK_MB 8 /* default staging buffer (MOET_UPLOAD_CHUNK_MB) */
#define NBUF 4

typedef struct piece {
	const char *src;
	char *dst_dev;
	size_t bytes, at; /* at: offset in the chunk's buffer */
	const moet_upload_file *file; /* read from here at off (pread source), else NULL */
	uint64_t off;
} piece;

/* A thread's failed read (the first of its slice). */
typedef struct rd_err {
	int failed;
	int err;          /* errno; 0: the file ended first */
	const moet_upload_file *file;
	uint64_t off;
	size_t bytes;     /* left to read */
} rd_err;

typedef struct team {
	pthread_mutex_t mu;
	pthread_cond_t freed_cv;  /* the caller freed a buffer or opened a chunk, or quit */
	pthread_cond_t filled_cv; /* a chunk's last slice was filled */
	pthread_cond_t job_cv;    /* a job began, or quit */
	pthread_cond_t idle_cv;   /* every worker is between jobs */
	int n_threads, slices;    /* slices per chunk: max(1, n_threads) */
	int quit;                 /* under mu: the workers end */
	int abort;                /* under mu: the job ends early (a failure) */
	unsigned job;             /* under mu: bumped per job (moet_uploader_run) */
	int idle;                 /* under mu: workers between jobs */
	/* the plan: every chunk's pieces, made before the threads start */
	const piece *pc;
	const int64_t *chunk_first; /* [n_chunks + 1]: chunk c's pieces pc[first[c] .. first[c+1]) */
	const size_t *chunk_bytes;  /* [n_chunks] */
	int64_t n_chunks;
	char *const *bufs;          /* [NBUF]: chunk c fills bufs[c % NBUF] */
	int64_t next_unit;          /* atomic: the next (chunk, slice) unit to take */
	int *filled;                /* [n_chunks], atomic: slices of the chunk filled */
	int64_t freed;              /* under mu: chunks whose buffer may be refilled (their copy
				       out is done) */
	int cached;        /* plain stores (MOET_UPLOAD_STORE=cached), else non-temporal */
	int pread;         /* MOET_UPLOAD_READ=pread: pieces with a file are read from it */
	/* test-only faults (MOET_UPLOAD_READ_FAULT, staged_opts) */
	size_t fault_cap;  /* each pread asks at most this many bytes (0: no cap) */
	long fault_at;     /* the fault_at-th pread of the call fails with EIO (0: none) */
	long n_reads;      /* preads so far (atomic) */
	rd_err self;       /* the caller's, when there is no team */
} team;

typedef struct worker {
	team *t;
	int id;
	rd_err e;
} worker;

/* memcpy with non-temporal stores: the staging buffer is written without being read first
 * (a plain memcpy's stores fetch each destination line: one more pass over DRAM, which the
 * upload shares with the transfer itself). */
static void nt_copy(char *dst, const char *src, size_t n)
{
#if defined(__SSE2__)
	size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
	if (head > n)
		head = n;
	memcpy(dst, src, head);
	dst += head, src += head, n -= head;
	size_t i = 0;
	for (; i + 64 <= n; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(src + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
		_mm_stream_si128((__m128i *)(dst + i), a);
		_mm_stream_si128((__m128i *)(dst + i + 16), b);
		_mm_stream_si128((__m128i *)(dst + i + 32), c);
		_mm_stream_si128((__m128i *)(dst + i + 48), d);
	}
	memcpy(dst + i, src + i, n - i);
	_mm_sfence();
#else
	memcpy(dst, src, n);
#endif
}

/* n bytes of file at off into dst: short reads continued, EINTR retried. 0, or -1 with *e
 * filled (errno, or 0 when the file ends first). */
static int read_full(team *t, const moet_upload_file *f, char *dst, size_t n, uint64_t off,
		     rd_err *e)
{
	while (n) {
		/* NOTE: Linux moves at most 0x7ffff000 bytes per call */
		size_t want = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
		if (t->fault_cap && want > t->fault_cap)
			want = t->fault_cap;
		ssize_t r;
		if (t->fault_at && __atomic_add_fetch(&t->n_reads, 1, __ATOMIC_RELAXED) ==
		    t->fault_at) {
			r = -1;
			errno = EIO;
		} else {
			r = pread(f->fd, dst, want, (off_t)off);
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			/* NOTE: failed last, released: the caller may read it while this thread
			 * is still at work (read_failure) */
			e->err = r < 0 ? errno : 0;
			e->file = f;
			e->off = off;
			e->bytes = n;
			__atomic_store_n(&e->failed, 1, __ATOMIC_RELEASE);
			return -1;
		}
		dst += r;
		off += (uint64_t)r;
		n -= (size_t)r;
	}
	return 0;
}

/* Slice s of chunk c's bytes into its buffer, piece by piece; nothing after a failed read
 * (*e: the first one is kept). */
static void fill_unit(team *t, int64_t c, int s, rd_err *e)
{
	if (e->failed)
		return;
	const size_t cb = t->chunk_bytes[c];
	size_t per = (cb + (size_t)t->slices - 1) / (size_t)t->slices;
	per = (per + 4095) & ~(size_t)4095;
	size_t lo = per * (size_t)s, hi = lo + per < cb ? lo + per : cb;
	char *const buf = t->bufs[c % NBUF];
	for (int64_t i = t->chunk_first[c]; i < t->chunk_first[c + 1] && lo < hi; i++) {
		const piece *p = &t->pc[i];
		size_t a = p->at > lo ? p->at : lo, b = p->at + p->bytes < hi ? p->at + p->bytes : hi;
		if (a >= b)
			continue;
		if (t->pread && p->file) {
			if (read_full(t, p->file, buf + a, b - a, p->off + (a - p->at), e))
				return;
		} else if (t->cached) {
			memcpy(buf + a, p->src + (a - p->at), b - a);
		} else {
			nt_copy(buf + a, p->src + (a - p->at), b - a);
		}
	}
}

/* Waits until chunk c may be filled (its buffer's previous copy out done); 0, or -1 when the
 * job ended early. */
static int wait_fillable(team *t, int64_t c)
{
	pthread_mutex_lock(&t->mu);
	while (!t->abort && t->freed < c - NBUF + 1)
		pthread_cond_wait(&t->freed_cv, &t->mu);
	const int ab = t->abort;
	pthread_mutex_unlock(&t->mu);
	return ab ? -1 : 0;
}

static void mark_filled(team *t, int64_t c)
{
	if (__atomic_add_fetch(&t->filled[c], 1, __ATOMIC_ACQ_REL) == t->slices) {
		pthread_mutex_lock(&t->mu);
		pthread_cond_broadcast(&t->filled_cv);
		pthread_mutex_unlock(&t->mu);
	}
}

/* A worker lives for the uploader: between jobs it waits for the next; in a job it takes the
 * units (chunk, slice) in order, as far ahead as the buffers allow, so no thread waits for the
 * slowest of a chunk before it starts on the next. */
static void *worker_main(void *arg)
{
	worker *w = arg;
	team *t = w->t;
	unsigned seen = 0;
	pthread_mutex_lock(&t->mu);
	for (;;) {
		if (++t->idle == t->n_threads)
			pthread_cond_broadcast(&t->idle_cv);
		while (t->job == seen && !t->quit)
			pthread_cond_wait(&t->job_cv, &t->mu);
		if (t->quit)
			break;
		seen = t->job;
		t->idle--;
		pthread_mutex_unlock(&t->mu);
		const int64_t n_units = t->n_chunks * t->slices;
		for (;;) {
			const int64_t u = __atomic_fetch_add(&t->next_unit, 1, __ATOMIC_RELAXED);
			if (u >= n_units)
				break;
			const int64_t c = u / t->slices;
			if (wait_fillable(t, c))
				break;
			fill_unit(t, c, (int)(u % t->slices), &w->e);
			mark_filled(t, c);
		}
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

/* The caller's wait for chunk c's slices (filled by the caller when there is no team). */
static void wait_filled(team *t, int64_t c)
{
	if (t->n_threads == 0) {
		for (int s = 0; s < t->slices; s++)
			fill_unit(t, c, s, &t->self);
		return;
	}
	pthread_mutex_lock(&t->mu);
	while (__atomic_load_n(&t->filled[c], __ATOMIC_ACQUIRE) < t->slices)
		pthread_cond_wait(&t->filled_cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
}

/* The caller: the buffers of chunks [0, freed) may be filled again. */
static void publish(team *t, int64_t freed)
{
	pthread_mutex_lock(&t->mu);
	if (freed > t->freed)
		t->freed = freed;
	pthread_cond_broadcast(&t->freed_cv);
	pthread_mutex_unlock(&t->mu);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int moet_upload_read_mode(int *out)
{
	/* NOTE: in the order of MOET_UPLOAD_READ_MAP, _PREAD */
	static const char *const names[] = { "map", "pread" };
	return moet_env_choice("MOET_UPLOAD_READ", names, 2, out);
}

/*
 * The staging buffers' size, the copy's stores and the source, from the environment:
 *   MOET_UPLOAD_CHUNK_MB  1..1024 (default 8): each of the NBUF pinned buffers
 *   MOET_UPLOAD_STORE     cached (default): plain stores; nt: non-temporal stores, the
 *                         buffers' lines written to DRAM and read from it again by the DMA
 *                         (3 bytes of DRAM traffic per byte uploaded: source read, buffer
 *                         write, DMA read). NOTE (why a switch): with buffers that fit
 *                         the host's last-level cache together (e.g. 4 x 8 MiB against the
 *                         H200 host's 300 MB L3), the lines stay there between the fill and
 *                         the DMA (device reads are snooped), so the DRAM moves the source
 *                         read alone; with larger buffers the plain stores' reads for
 *                         ownership add a pass instead. On the H200 machine cached 8 MiB
 *                         was ahead of nt 64 MiB in every A/B (docs/hybrid.md): the
 *                         default since c6c6fd5's run; the bytes on the device are the same.
 *                         (The pread source's stores are the kernel's copy: cached.)
 *   MOET_UPLOAD_READ      map (default) or pread (moet_upload_read_mode)
 *   MOET_UPLOAD_READ_FAULT  tests only: short (each pread asks at most 1000 bytes, so
 *                         every piece takes many reads) or eio:K (the K-th pread, K >= 1,
 *                         fails with EIO)
 * MOET_EINVAL naming the variable for anything else.
 */
static int staged_opts(size_t *out_chunk, team *t, int force_read)
{
	const char *v = getenv("MOET_UPLOAD_CHUNK_MB");
	long mb = CHUNK_MB;
	if (v && *v) {
		char *end;
		mb = strtol(v, &end, 10);
		if (*end || mb < 1 || mb > 1024)
			return moet_err(MOET_EINVAL, "MOET_UPLOAD_CHUNK_MB='%.40s' (want 1..1024)",
					v);
	}
	*out_chunk = (size_t)mb << 20;
	static const char *const stores[] = { "cached", "nt" };
	int nt = 0, rc_s = moet_env_choice("MOET_UPLOAD_STORE", stores, 2, &nt);
	if (rc_s)
		return rc_s;
	t->cached = !nt;
	int read = force_read - 1, rc = force_read ? 0 : moet_upload_read_mode(&read);
	if (rc)
		return rc;
	t->pread = read == MOET_UPLOAD_READ_PREAD;
	v = getenv("MOET_UPLOAD_READ_FAULT");
	if (v && *v) {
		char *end = NULL;
		if (!strcmp(v, "short"))
			t->fault_cap = 1000;
		else if (!strncmp(v, "eio:", 4) && (t->fault_at = strtol(v + 4, &end, 10)) > 0 &&
			 !*end)
			;
		else
			return moet_err(MOET_EINVAL, "MOET_UPLOAD_READ_FAULT='%.40s' (want short or "
					"eio:K, K >= 1)", v);
	}
	return 0;
}

/* A call's options: o's read mode checked, then staged_opts. */
static int call_opts(const moet_upload_opts *o, size_t *out_chunk, team *t)
{
	if (o && (o->read < 0 || o->read > MOET_UPLOAD_READ_PREAD + 1))
		return moet_err(MOET_EINVAL, "upload: read mode %d", o->read);
	return staged_opts(out_chunk, t, o ? o->read : 0);
}

/* The first failed read among the team's (and the caller's) slices: its MOET_EIO, else 0. */
static int read_failure(const team *t, const worker *wk)
{
	const rd_err *e = t->self.failed ? &t->self : NULL;
	for (int i = 0; !e && i < t->n_threads; i++)
		if (__atomic_load_n(&wk[i].e.failed, __ATOMIC_ACQUIRE))
			e = &wk[i].e;
	if (!e)
		return 0;
	return moet_err(MOET_EIO, "upload: %s: read of %zu bytes at offset %llu failed: %s",
			e->file->path, e->bytes, (unsigned long long)e->off,
			e->err ? strerror(e->err) : "end of file");
}

int moet_upload_many(const moet_upload_item *items, int64_t n, int n_threads,
		     moet_upload_stats *stats)
{
	return moet_upload_many_opts(items, n, n_threads, NULL, stats);
}

struct moet_uploader {
	team t;
	pthread_t *th;
	worker *wk;
	char *buf[NBUF];
	void *ev[NBUF], *stream;
	int host, copy_out;  /* no CUDA call; the chunks copied out (not fill_only) */
	int one_block;       /* moet_upload_opts.one_block */
	size_t chunk_cap;
	int sync_made;       /* the team's mutex and conditions exist */
};

void moet_uploader_destroy(moet_uploader *u)
{
	if (!u)
		return;
	team *t = &u->t;
	if (u->sync_made) {
		pthread_mutex_lock(&t->mu);
		t->quit = 1;
		pthread_cond_broadcast(&t->job_cv);
		pthread_mutex_unlock(&t->mu);
		for (int i = 0; i < t->n_threads; i++)
			pthread_join(u->th[i], NULL);
		pthread_cond_destroy(&t->job_cv);
		pthread_cond_destroy(&t->idle_cv);
		pthread_cond_destroy(&t->freed_cv);
		pthread_cond_destroy(&t->filled_cv);
		pthread_mutex_destroy(&t->mu);
	}
	for (int b = 0; b < NBUF; b++) {
		if (u->host) {
			free(u->buf[b]);
			continue;
		}
		moet_gpu_host_free(u->buf[b]);
		moet_gpu_event_destroy(u->ev[b]);
	}
	moet_gpu_stream_destroy(u->stream);
	free(u->th);
	free(u->wk);
	free(u);
}

int moet_uploader_create(int n_threads, const moet_upload_opts *o, moet_uploader **out)
{
	const int want = n_threads < 1 ? 1 : n_threads > 64 ? 64 : n_threads;
	moet_uploader *u = calloc(1, sizeof(*u));
	if (!u)
		return moet_err(MOET_ENOMEM, "uploader");
	team *t = &u->t;
	/* host: no CUDA call (host destinations, or none) */
	u->host = o && (o->host_dst || o->fill_only);
	u->copy_out = o ? !o->fill_only : 1;
	u->one_block = o && o->one_block;
	int rc = call_opts(o, &u->chunk_cap, t);
	if (!rc && (!(u->th = calloc((size_t)want, sizeof(*u->th))) ||
		    !(u->wk = calloc((size_t)want, sizeof(*u->wk)))))
		rc = moet_err(MOET_ENOMEM, "upload tables");
	for (int b = 0; b < NBUF && !rc; b++) {
		if (u->host) {
			/* NOTE: touched here, as pinned memory is: the fill does not fault them */
			if (!(u->buf[b] = aligned_alloc(4096, u->chunk_cap)))
				rc = moet_err(MOET_ENOMEM, "upload: %d staging buffers of %zu bytes",
					      NBUF, u->chunk_cap);
			else
				memset(u->buf[b], 0, u->chunk_cap);
			continue;
		}
		rc = moet_gpu_host_alloc(u->chunk_cap, (void **)&u->buf[b]);
		if (!rc)
			rc = moet_gpu_event_create(&u->ev[b]);
	}
	if (!rc && !u->host)
		rc = moet_gpu_stream_create(&u->stream);
	if (rc) {
		moet_uploader_destroy(u);
		return rc;
	}
	t->bufs = u->buf;
	t->slices = want;
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->freed_cv, NULL);
	pthread_cond_init(&t->filled_cv, NULL);
	pthread_cond_init(&t->job_cv, NULL);
	pthread_cond_init(&t->idle_cv, NULL);
	u->sync_made = 1;
	/* NOTE: a thread that cannot be made is no error: fewer threads fill (or the caller).
	 * Made under the mutex, so that n_threads is final before any of them counts itself. */
	pthread_mutex_lock(&t->mu);
	for (int i = 0; i < want; i++) {
		u->wk[i] = (worker){ t, i, { 0 } };
		if (pthread_create(&u->th[i], NULL, worker_main, &u->wk[i]))
			break;
		t->n_threads++;
	}
	pthread_mutex_unlock(&t->mu);
	*out = u;
	return 0;
}

int moet_uploader_run(moet_uploader *u, const moet_upload_item *items, int64_t n,
		      const moet_upload_from *from, moet_upload_stats *stats)
{
	team *t = &u->t;
	piece *pc = NULL;
	int64_t *first = NULL;
	size_t *cbytes = NULL;
	int *filled = NULL;
	const size_t chunk_cap = u->chunk_cap;
	char *const *buf = u->buf;
	void *const *ev = u->ev, *stream = u->stream;
	const int host = u->host, copy_out = u->copy_out;
	double t0 = now_s(), t1 = t0, fill_s = 0, wait_s = 0;
	size_t total = 0;
	int rc = 0, started = 0;
	for (int64_t i = 0; i < n; i++)
		total += items[i].bytes;
	if (total == 0)
		goto out;
	/* the plan: chunks of at most chunk_cap bytes, their pieces */
	const int64_t n_chunks = (int64_t)((total + chunk_cap - 1) / chunk_cap);
	const size_t max_pieces = (size_t)n + (size_t)n_chunks + 1;
	if (!(pc = malloc(max_pieces * sizeof(*pc))) ||
	    !(first = malloc((size_t)(n_chunks + 1) * sizeof(*first))) ||
	    !(cbytes = malloc((size_t)n_chunks * sizeof(*cbytes))) ||
	    !(filled = calloc((size_t)n_chunks, sizeof(*filled)))) {
		rc = moet_err(MOET_ENOMEM, "upload tables");
		goto out;
	}
	{
		int64_t it = 0, np = 0;
		size_t off = 0; /* in items[it] */
		for (int64_t c = 0; c < n_chunks; c++) {
			size_t fill = 0;
			first[c] = np;
			while (it < n && fill < chunk_cap) {
				const moet_upload_item *x = &items[it];
				const moet_upload_file *fx = from ? from[it].file : NULL;
				size_t take = x->bytes - off;
				if (take > chunk_cap - fill)
					take = chunk_cap - fill;
				if (take)
					pc[np++] = (piece){ (const char *)x->src + off,
							    (char *)x->dst + off, take, fill, fx,
							    fx ? from[it].off + off : 0 };
				fill += take;
				off += take;
				if (off == x->bytes) {
					it++;
					off = 0;
				}
			}
			cbytes[c] = fill;
		}
		first[n_chunks] = np;
	}
	/* the job: the workers are idle (the last run waited for them), so it is set unraced */
	t->pc = pc;
	t->chunk_first = first;
	t->chunk_bytes = cbytes;
	t->n_chunks = n_chunks;
	t->filled = filled;
	t->next_unit = 0;
	t->freed = 0;
	t->abort = 0;
	t->self = (rd_err){ 0 };
	for (int i = 0; i < t->n_threads; i++)
		u->wk[i].e = (rd_err){ 0 };
	t1 = now_s();
	pthread_mutex_lock(&t->mu);
	t->job++;
	pthread_cond_broadcast(&t->job_cv);
	pthread_mutex_unlock(&t->mu);
	started = 1;
	for (int64_t c = 0; c < n_chunks && !rc; c++) {
		const int b = (int)(c % NBUF);
		/* the buffers of the chunks before the last one out are free again (their copies
		 * are done by now unless the link holds the upload) */
		if (!host && c >= 2) {
			const double tw = now_s();
			for (int64_t d = t->freed; d < c - 1 && !rc; d++)
				rc = moet_gpu_event_sync(ev[d % NBUF]);
			wait_s += now_s() - tw;
			if (rc)
				break;
			publish(t, c - 1);
		}
		const double tf = now_s();
		wait_filled(t, c);
		fill_s += now_s() - tf;
		if ((rc = read_failure(t, u->wk)))
			break;
		const piece *p = pc + first[c];
		const int64_t np = first[c + 1] - first[c];
		if (host) {
			for (int64_t i = 0; i < np && copy_out; i++)
				memcpy(p[i].dst_dev, buf[b] + p[i].at, p[i].bytes);
			publish(t, c + 1);
			continue;
		}
		/* one async copy per run of pieces contiguous on both sides where the destinations
		 * are one allocation (one bind's), else one per piece */
		for (int64_t i = 0; i < np && !rc;) {
			int64_t j = i + 1;
			size_t bytes = p[i].bytes;
			while (u->one_block && j < np && p[j].at == p[i].at + bytes &&
			       p[j].dst_dev == p[i].dst_dev + bytes)
				bytes += p[j++].bytes;
			rc = moet_gpu_copy_h2d_async(p[i].dst_dev, buf[b] + p[i].at, bytes, stream);
			i = j;
		}
		if (!rc)
			rc = moet_gpu_event_record(ev[b], stream);
	}
out:
	if (started) {
		/* every worker back between jobs before the plan is freed (a failure ends the job
		 * early: the workers waiting for a buffer give up) */
		pthread_mutex_lock(&t->mu);
		if (rc)
			t->abort = 1;
		pthread_cond_broadcast(&t->freed_cv);
		while (t->idle < t->n_threads)
			pthread_cond_wait(&t->idle_cv, &t->mu);
		pthread_mutex_unlock(&t->mu);
	}
	/* NOTE: after a failure too: the copies in flight read the buffers, which the next run
	 * refills */
	if (stream && started) {
		const double tw = now_s();
		int e = moet_gpu_sync(stream);
		wait_s += now_s() - tw;
		if (!rc)
			rc = e;
	}
	const double t2 = now_s();
	free(pc);
	free(first);
	free(cbytes);
	free(filled);
	t->pc = NULL;
	t->filled = NULL;
	if (stats)
		*stats = (moet_upload_stats){ .bytes = total, .seconds = now_s() - t0,
					      .copy_seconds = t1 > t0 ? t2 - t1 : 0,
					      .fill_seconds = fill_s, .link_wait_seconds = wait_s,
					      .buffer_bytes = chunk_cap, .cached = t->cached };
	return rc;
}

int moet_upload_many_opts(const moet_upload_item *items, int64_t n, int n_threads,
			  const moet_upload_opts *o, moet_upload_stats *stats)
{
	size_t total = 0;
	for (int64_t i = 0; i < n; i++)
		total += items[i].bytes;
	int rc;
	if (total == 0) {
		/* NOTE: nothing to copy, nothing allocated (no CUDA call); the options are still
		 * checked, as moet_uploader_create does before it allocates */
		size_t chunk = 0;
		team probe = { 0 };
		rc = call_opts(o, &chunk, &probe);
		if (stats)
			*stats = (moet_upload_stats){ .buffer_bytes = chunk, .cached = probe.cached };
		return rc;
	}
	const double t0 = now_s();
	moet_uploader *u = NULL;
	if ((rc = moet_uploader_create(n_threads, o, &u)))
		return rc;
	rc = moet_uploader_run(u, items, n, o ? o->from : NULL, stats);
	moet_uploader_destroy(u);
	if (stats)
		stats->seconds = now_s() - t0;
	return rc;
}

int moet_upload_default_threads(void)
{
	const char *env = getenv("MOET_UPLOAD_THREADS");
	if (env && atoi(env) > 0)
		return atoi(env) > 64 ? 64 : atoi(env);
	int n = moet_topo_cores_but_one();
	return n == 0 ? 4 : n > 64 ? 64 : n;
}
