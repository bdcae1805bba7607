/*
 * upload_reg.c: MOET_UPLOAD=register, the hot experts DMA'd straight from the checkpoint's
 * mapped pages (issue 5).
 *
 * Why: the staged copy (upload.c) moves three bytes of host DRAM per uploaded byte (the
 * source read, the staging write, the DMA's read of the staging); at ~29 GB/s uploaded that
 * is ~87 GB/s, about the host's whole read bandwidth on the H200 machine. Page-locking the
 * mapped pages in place leaves one: the DMA's read. The price is the page-locking itself
 * (cudaHostRegister of file pages: pinning each page, mapping it for the device).
 *
 *   items --moet_upload_plan_make--> chunks of whole pages (<= chunk_bytes), pieces
 *
 *   registering threads (R)      chunk i: [wait until chunk i-K is queued] sync event of
 *                                i-K, cudaHostUnregister(i-K), cudaHostRegister(i)
 *   the calling thread           chunk i: [wait until registered] one cudaMemcpyAsync per
 *                                piece on the copy stream, event i % K
 *
 * So chunk i+1.. are page-locked while chunk i crosses the link, at most K chunks are locked
 * at once (chunk i is locked only after chunk i-K was unlocked), and nothing stays locked
 * after the call. Thread r takes chunks r, r+R, ...; any thread may unlock any chunk.
 *
 * NOTE: 256 MiB chunks by default: large enough that a registration's fixed cost (an ioctl,
 * the driver's bookkeeping: tens of microseconds) is nothing against pinning 65536 pages,
 * small enough that the first DMA starts early and 4 chunks hold at most 1 GiB locked.
 *
 * NOTE: a first attempt (commit 408326c, reverted in 84d9132: 1 GiB spans registered on the
 * issuing thread itself) measured 1.0-1.4 GB/s on the H200 machine against 22-24 GB/s
 * staged. Here registration runs on its own threads and is timed (stats->reg_seconds,
 * reg_wait_seconds), so a run says whether page-locking is the bound and whether more
 * registering threads (MOET_UPLOAD_REG_THREADS) help.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"
#include "moet_upload.h"

#define DEFAULT_CHUNK ((size_t)256 << 20)
#define DEFAULT_K 4
#define MAX_K 64

/* ---- the plan ----------------------------------------------------------------------- */

typedef struct span {
	uintptr_t lo, hi; /* the item's source bytes [lo, hi) */
	int64_t item;
} span;

static int by_lo(const void *a, const void *b)
{
	const span *x = a, *y = b;
	if (x->lo != y->lo)
		return x->lo < y->lo ? -1 : 1;
	return (x->item > y->item) - (x->item < y->item);
}

/* The n items' non-empty sources, checked, sorted by address: *out_sp (malloc'd), *out_n. */
static int sorted_spans(const moet_upload_item *items, int64_t n, size_t page, span **out_sp,
			int64_t *out_n)
{
	int64_t m = 0;
	for (int64_t i = 0; i < n; i++) {
		const moet_upload_item *it = &items[i];
		if (!it->bytes)
			continue;
		if (!it->src || !it->dst)
			return moet_err(MOET_EINVAL, "upload item %lld: NULL %s (%zu bytes)",
					(long long)i, it->src ? "destination" : "source", it->bytes);
		/* NOTE: the last byte's page must round up without wrapping */
		const uintptr_t s = (uintptr_t)it->src, d = (uintptr_t)it->dst;
		const uintptr_t top = UINTPTR_MAX - (page - 1);
		if (s > top || it->bytes > top - s || it->bytes > UINTPTR_MAX - d)
			return moet_err(MOET_ERANGE, "upload item %lld: %zu bytes from %p to %p wrap "
					"the address space", (long long)i, it->bytes, it->src,
					it->dst);
		m++;
	}
	span *sp = malloc((size_t)(m ? m : 1) * sizeof(*sp));
	if (!sp)
		return moet_err(MOET_ENOMEM, "upload plan: %lld ranges", (long long)m);
	m = 0;
	for (int64_t i = 0; i < n; i++)
		if (items[i].bytes)
			sp[m++] = (span){ (uintptr_t)items[i].src,
					  (uintptr_t)items[i].src + items[i].bytes, i };
	qsort(sp, (size_t)m, sizeof(*sp), by_lo);
	*out_sp = sp;
	*out_n = m;
	return 0;
}

/* Regions of touching pages cut into chunks; fill 0: only counted. Returns the count. */
static int64_t make_chunks(const span *sp, int64_t m, uintptr_t page, uintptr_t C,
			   moet_upload_chunk *ch, size_t *locked)
{
	int64_t k = 0;
	for (int64_t i = 0; i < m;) {
		uintptr_t a = sp[i].lo & ~(page - 1), b = (sp[i].hi + page - 1) & ~(page - 1);
		for (i++; i < m && (sp[i].lo & ~(page - 1)) <= b; i++) {
			uintptr_t e = (sp[i].hi + page - 1) & ~(page - 1);
			b = e > b ? e : b;
		}
		for (uintptr_t at = a; at < b; at += b - at < C ? b - at : C, k++) {
			if (!ch)
				continue;
			ch[k] = (moet_upload_chunk){ (const char *)at, b - at < C ? b - at : C, 0,
						     0 };
			*locked += ch[k].bytes;
		}
	}
	return k;
}

/* Each span's pieces, chunk by chunk; fill 0: only counted into ch[].n_pieces. */
static void make_pieces(const moet_upload_item *items, const span *sp, int64_t m,
			moet_upload_chunk *ch, moet_upload_item *pieces)
{
	int64_t k = 0;
	for (int64_t i = 0; i < m; i++) {
		const moet_upload_item *it = &items[sp[i].item];
		while ((uintptr_t)ch[k].base + ch[k].bytes <= sp[i].lo)
			k++; /* NOTE: sources are sorted, so the first chunk never moves back */
		for (int64_t j = k; ; j++) {
			uintptr_t end = (uintptr_t)ch[j].base + ch[j].bytes;
			uintptr_t a = sp[i].lo > (uintptr_t)ch[j].base ? sp[i].lo
								      : (uintptr_t)ch[j].base;
			uintptr_t b = sp[i].hi < end ? sp[i].hi : end;
			if (pieces)
				pieces[ch[j].piece0 + ch[j].n_pieces] = (moet_upload_item){
					(const char *)a, (char *)it->dst + (a - sp[i].lo), b - a };
			ch[j].n_pieces++;
			if (b == sp[i].hi)
				break;
		}
	}
}

int moet_upload_plan_make(const moet_upload_item *items, int64_t n, size_t page_bytes,
			  size_t chunk_bytes, moet_upload_plan *out)
{
	span *sp = NULL;
	int64_t m = 0;
	int rc = 0;
	memset(out, 0, sizeof(*out));
	if (n < 0 || (n > 0 && !items))
		return moet_err(MOET_EINVAL, "upload plan: %lld items at %p", (long long)n,
				(const void *)items);
	if (page_bytes == 0 || (page_bytes & (page_bytes - 1)))
		return moet_err(MOET_EINVAL, "upload plan: page size %zu is not a power of two",
				page_bytes);
	if (chunk_bytes == 0 || chunk_bytes > SIZE_MAX / 2)
		return moet_err(MOET_EINVAL, "upload plan: chunk of %zu bytes", chunk_bytes);
	const size_t C = (chunk_bytes + page_bytes - 1) & ~(page_bytes - 1);
	if ((rc = sorted_spans(items, n, page_bytes, &sp, &m)))
		return rc;
	moet_upload_plan p = { 0 };
	for (int64_t i = 0; i < m; i++)
		p.bytes += (size_t)(sp[i].hi - sp[i].lo);
	p.n_chunks = make_chunks(sp, m, page_bytes, C, NULL, NULL);
	if (!(p.chunks = calloc((size_t)(p.n_chunks ? p.n_chunks : 1), sizeof(*p.chunks)))) {
		rc = moet_err(MOET_ENOMEM, "upload plan: %lld chunks", (long long)p.n_chunks);
		goto fail;
	}
	make_chunks(sp, m, page_bytes, C, p.chunks, &p.locked_bytes);
	make_pieces(items, sp, m, p.chunks, NULL);
	for (int64_t k = 0; k < p.n_chunks; k++) {
		p.chunks[k].piece0 = p.n_pieces;
		p.n_pieces += p.chunks[k].n_pieces;
		p.chunks[k].n_pieces = 0; /* counted again as they are placed */
	}
	if (!(p.pieces = malloc((size_t)(p.n_pieces ? p.n_pieces : 1) * sizeof(*p.pieces)))) {
		rc = moet_err(MOET_ENOMEM, "upload plan: %lld pieces", (long long)p.n_pieces);
		goto fail;
	}
	make_pieces(items, sp, m, p.chunks, p.pieces);
	free(sp);
	*out = p;
	return 0;
fail:
	free(sp);
	moet_upload_plan_free(&p);
	return rc;
}

void moet_upload_plan_free(moet_upload_plan *p)
{
	if (!p)
		return;
	free(p->chunks);
	free(p->pieces);
	memset(p, 0, sizeof(*p));
}

/* ---- the run ------------------------------------------------------------------------ */

enum { C_NONE = 0, C_LOCKED, C_QUEUED, C_UNLOCKED, C_FAILED };

typedef struct reg_run {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const moet_upload_plan *pl;
	void **ev;          /* K events: chunk i's is ev[i % K] */
	signed char *state; /* C_* per chunk */
	int K, R, device;
	int read_only;      /* 1 until a registration with the flag is refused */
	int64_t queued;     /* chunks 0 .. queued-1 are queued on the stream */
	int64_t fault_at;   /* tests: this chunk's registration fails (MOET_UPLOAD_REG_FAULT) */
	int stop;           /* the caller stopped (a failure): threads leave */
	int err;            /* a thread's failure other than a registration (sync, unregister) */
	char msg[320];      /* the first failure's detail (moet_err's is per thread) */
	uint64_t n_locked, locked_bytes;
	double reg_s, unreg_s;
} reg_run;

typedef struct reg_worker {
	reg_run *r;
	int id;
} reg_worker;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Records a thread's failure (under r->mu): its code and detail for the caller. */
static void fail_locked(reg_run *r, int rc, int registration)
{
	if (!r->msg[0])
		snprintf(r->msg, sizeof(r->msg), "%s", moet_errmsg());
	if (!registration && !r->err)
		r->err = rc;
	pthread_cond_broadcast(&r->cv);
}

/* Chunk i-K's copies waited for, then unlocked (i >= K). */
static int unlock_prior(reg_run *r, int64_t i)
{
	const moet_upload_chunk *c = &r->pl->chunks[i - r->K];
	int rc = moet_gpu_event_sync(r->ev[(i - r->K) % r->K]);
	double t0 = now_s();
	if (!rc)
		rc = moet_gpu_host_unregister((void *)c->base);
	double dt = now_s() - t0;
	pthread_mutex_lock(&r->mu);
	r->unreg_s += dt;
	if (!rc)
		r->state[i - r->K] = C_UNLOCKED;
	else
		fail_locked(r, rc, 0);
	pthread_mutex_unlock(&r->mu);
	return rc;
}

static void *reg_main(void *arg)
{
	reg_worker *w = arg;
	reg_run *r = w->r;
	if (moet_gpu_set_device(r->device)) {
		pthread_mutex_lock(&r->mu);
		fail_locked(r, MOET_EDEVICE, 0);
		pthread_mutex_unlock(&r->mu);
		return NULL;
	}
	for (int64_t i = w->id; i < r->pl->n_chunks; i += r->R) {
		pthread_mutex_lock(&r->mu);
		while (!r->stop && !r->err && i >= r->K && r->queued <= i - r->K)
			pthread_cond_wait(&r->cv, &r->mu);
		const int leave = r->stop || r->err, ro = r->read_only;
		pthread_mutex_unlock(&r->mu);
		if (leave || (i >= r->K && unlock_prior(r, i)))
			return NULL;
		const moet_upload_chunk *c = &r->pl->chunks[i];
		int took_ro = 0;
		double t0 = now_s();
		int rc = i == r->fault_at
				 ? moet_err(MOET_EDEVICE, "chunk %lld: injected failure "
					    "(MOET_UPLOAD_REG_FAULT)", (long long)i + 1)
				 : moet_gpu_host_register((void *)c->base, c->bytes, ro, &took_ro);
		double dt = now_s() - t0;
		pthread_mutex_lock(&r->mu);
		r->reg_s += dt;
		if (rc) {
			r->state[i] = C_FAILED;
			fail_locked(r, rc, 1);
			pthread_mutex_unlock(&r->mu);
			return NULL;
		}
		if (ro && !took_ro)
			r->read_only = 0; /* the flag was refused: later chunks go without it */
		r->state[i] = C_LOCKED;
		r->n_locked++;
		r->locked_bytes += c->bytes;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
	}
	return NULL;
}

/* A positive integer from the environment variable `name` (unset: *out untouched), at most
 * max; MOET_EINVAL naming the variable and value otherwise. */
static int env_int(const char *name, long long max, long long *out)
{
	const char *s = getenv(name);
	if (!s || !s[0])
		return 0;
	char *end = NULL;
	long long v = strtoll(s, &end, 10);
	if (*end || v < 1 || v > max)
		return moet_err(MOET_EINVAL, "%s='%s': expected an integer in 1..%lld", name, s,
				max);
	*out = v;
	return 0;
}

/* o's zeros resolved from the environment and the defaults; out of range: MOET_EINVAL. */
static int resolve_opts(const moet_upload_reg_opts *o, moet_upload_reg_opts *out)
{
	moet_upload_reg_opts d = o ? *o : (moet_upload_reg_opts){ 0 };
	long long kb = (long long)(DEFAULT_CHUNK >> 10), k = DEFAULT_K, t = 1;
	int rc;
	if (!d.chunk_bytes && (rc = env_int("MOET_UPLOAD_REG_KB", 1ll << 30, &kb)))
		return rc;
	if (!d.chunk_bytes)
		d.chunk_bytes = (size_t)kb << 10;
	if (!d.max_chunks && (rc = env_int("MOET_UPLOAD_REG_CHUNKS", MAX_K, &k)))
		return rc;
	if (!d.max_chunks)
		d.max_chunks = (int)k;
	if (d.max_chunks < 2 || d.max_chunks > MAX_K)
		return moet_err(MOET_EINVAL, "upload: %d chunks locked at once (2..%d)",
				d.max_chunks, MAX_K);
	if (!d.n_threads && (rc = env_int("MOET_UPLOAD_REG_THREADS", MAX_K, &t)))
		return rc;
	if (!d.n_threads)
		d.n_threads = (int)t;
	if (d.n_threads < 1)
		return moet_err(MOET_EINVAL, "upload: %d registering threads", d.n_threads);
	if (d.n_threads > d.max_chunks)
		d.n_threads = d.max_chunks; /* more could only wait */
	if (d.staged_threads < 1)
		d.staged_threads = moet_upload_default_threads();
	*out = d;
	return 0;
}

/* The calling thread's half: chunk after chunk, waits for its registration and queues its
 * pieces. Returns 0 with *out_next = n_chunks, or the first chunk not queued: a failed
 * registration there (0 returned) or a failure (its code). */
static int issue(reg_run *r, void *stream, double *wait_s, int64_t *out_next)
{
	const moet_upload_plan *pl = r->pl;
	int64_t i = 0;
	int rc = 0;
	for (; i < pl->n_chunks; i++) {
		double t0 = now_s();
		pthread_mutex_lock(&r->mu);
		while (r->state[i] == C_NONE && !r->err)
			pthread_cond_wait(&r->cv, &r->mu);
		const int st = r->state[i];
		rc = st == C_LOCKED ? 0 : r->err;
		pthread_mutex_unlock(&r->mu);
		*wait_s += now_s() - t0;
		if (st != C_LOCKED)
			break;
		const moet_upload_chunk *c = &pl->chunks[i];
		for (int64_t p = c->piece0; p < c->piece0 + c->n_pieces && !rc; p++)
			rc = moet_gpu_copy_h2d_async(pl->pieces[p].dst, pl->pieces[p].src,
						     pl->pieces[p].bytes, stream);
		if (!rc)
			rc = moet_gpu_event_record(r->ev[i % r->K], stream);
		pthread_mutex_lock(&r->mu);
		if (!rc) {
			r->state[i] = C_QUEUED;
			r->queued = i + 1;
		}
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		if (rc)
			break;
	}
	*out_next = i;
	return rc;
}

int moet_upload_many_register(const moet_upload_item *items, int64_t n,
			      const moet_upload_reg_opts *o, moet_upload_stats *stats)
{
	moet_upload_plan pl = { 0 };
	moet_upload_reg_opts op = { 0 };
	reg_run r = { 0 };
	pthread_t th[MAX_K];
	reg_worker wk[MAX_K];
	void *ev[MAX_K] = { 0 }, *stream = NULL;
	int n_th = 0, sync_init = 0;
	double t0 = now_s(), wait_s = 0;
	int64_t next = 0;
	moet_upload_stats fb = { 0 };
	long page = sysconf(_SC_PAGESIZE);
	long long fault = 0;
	int rc = resolve_opts(o, &op);
	if (!rc)
		rc = env_int("MOET_UPLOAD_REG_FAULT", INT64_MAX, &fault);
	if (!rc)
		rc = moet_upload_plan_make(items, n, page > 0 ? (size_t)page : 4096, op.chunk_bytes,
					   &pl);
	if (rc || pl.n_chunks == 0)
		goto out;
	r = (reg_run){ .pl = &pl, .ev = ev, .K = op.max_chunks, .R = op.n_threads,
		       .read_only = 1, .fault_at = fault - 1 };
	if (!(r.state = calloc((size_t)pl.n_chunks, 1))) {
		rc = moet_err(MOET_ENOMEM, "upload: %lld chunk states", (long long)pl.n_chunks);
		goto out;
	}
	if ((rc = moet_gpu_get_device(&r.device)) || (rc = moet_gpu_stream_create(&stream)))
		goto out;
	for (int k = 0; k < r.K && !rc; k++)
		rc = moet_gpu_event_create(&ev[k]);
	if (rc)
		goto out;
	pthread_mutex_init(&r.mu, NULL);
	pthread_cond_init(&r.cv, NULL);
	sync_init = 1;
	for (int k = 0; k < r.R; k++) {
		wk[k] = (reg_worker){ &r, k };
		if (pthread_create(&th[k], NULL, reg_main, &wk[k]))
			break;
		n_th++;
	}
	if (n_th < r.R) {
		/* NOTE: chunks are dealt to threads by index: a missing thread's chunks would
		 * never be locked, so stop the others and report it */
		pthread_mutex_lock(&r.mu);
		r.stop = 1;
		pthread_cond_broadcast(&r.cv);
		pthread_mutex_unlock(&r.mu);
		rc = moet_err(MOET_ENOMEM, "upload: %d of %d registering threads made", n_th, r.R);
	} else {
		rc = issue(&r, stream, &wait_s, &next);
	}
	pthread_mutex_lock(&r.mu);
	r.stop = 1;
	pthread_cond_broadcast(&r.cv);
	pthread_mutex_unlock(&r.mu);
	for (int k = 0; k < n_th; k++)
		pthread_join(th[k], NULL);
	if (rc && rc == r.err && r.msg[0])
		rc = moet_err(rc, "upload: %s", r.msg); /* a registering thread's failure */
	int rs = moet_gpu_sync(stream);
	rc = rc ? rc : rs;
	for (int64_t i = 0; i < pl.n_chunks; i++) {
		if (r.state[i] != C_LOCKED && r.state[i] != C_QUEUED)
			continue;
		double u0 = now_s();
		int ru = moet_gpu_host_unregister((void *)pl.chunks[i].base);
		r.unreg_s += now_s() - u0;
		rc = rc ? rc : ru;
	}
	if (!rc && next < pl.n_chunks) {
		/* a registration failed at chunk `next`: its pieces and the rest go staged */
		const int64_t p0 = pl.chunks[next].piece0;
		size_t left = 0;
		for (int64_t p = p0; p < pl.n_pieces; p++)
			left += pl.pieces[p].bytes;
		fprintf(stderr, "moet-hybrid: upload: page-locking chunk %lld of %lld failed (%s): "
			"%.1f MB of %.1f MB go through pinned staging\n", (long long)next + 1,
			(long long)pl.n_chunks, r.msg, (double)left / 1e6, (double)pl.bytes / 1e6);
		rc = moet_upload_many_staged(pl.pieces + p0, pl.n_pieces - p0, op.staged_threads,
					     &fb);
		fb.reg_fallback = 1;
		fb.fallback_bytes = left;
	}
out:
	for (int k = 0; k < MAX_K; k++)
		moet_gpu_event_destroy(ev[k]);
	moet_gpu_stream_destroy(stream);
	if (sync_init) {
		pthread_cond_destroy(&r.cv);
		pthread_mutex_destroy(&r.mu);
	}
	const double secs = now_s() - t0;
	moet_upload_stats st = {
		.bytes = pl.bytes, .seconds = secs, .reg_chunks = r.n_locked,
		.reg_bytes = r.locked_bytes, .reg_seconds = r.reg_s,
		.unreg_seconds = r.unreg_s, .reg_wait_seconds = wait_s,
		.reg_read_only = r.n_locked && r.read_only, .reg_fallback = fb.reg_fallback,
		.fallback_bytes = fb.fallback_bytes
	};
	if (!rc && !op.quiet && pl.n_chunks)
		fprintf(stderr, "moet-hybrid: upload: register: %.2f GB in %.3f s (%.1f GB/s); "
			"%lld chunks of <= %zu KiB, %d locked at once, %s; cudaHostRegister %.3f s "
			"over %d threads, unregister %.3f s, copies waited %.3f s for it%s\n",
			(double)pl.bytes / 1e9, secs, secs > 0 ? (double)pl.bytes / 1e9 / secs : 0,
			(long long)pl.n_chunks, op.chunk_bytes >> 10, op.max_chunks,
			st.reg_read_only ? "read-only" : "default flags", r.reg_s, op.n_threads,
			r.unreg_s, wait_s, fb.reg_fallback ? " (the rest staged)" : "");
	free(r.state);
	moet_upload_plan_free(&pl);
	if (stats)
		*stats = st;
	return rc;
}
