/*
 * bench_load.c: `moet-hybrid bench load` (moet_bench_load.h).
 *
 *   disk ceiling   the shards read front to back with O_DIRECT (where the filesystem takes
 *                  it) through one io_uring reader: 8 MiB requests, 16 in flight, into a ring
 *                  of aligned buffers, up to disk_bytes: bytes / time
 *   h2d ceiling    (CUDA build with a GPU) 256 MiB from pinned memory, median of 5
 *   load           the NVMe tier's warm fill: every expert of the CPU tier (or what the
 *                  budget holds) read into registered RAM slots, queue_depth in flight;
 *                  time to ready vs bytes / disk ceiling (the target: <= 1.2x);
 *                  then where the slots' pages are (the tier's NUMA policy, verified with
 *                  move_pages: slots per node), outside the timed part
 *
 * NOTE: both reads bypass the page cache with O_DIRECT, so their order does not favour one;
 * on a filesystem without O_DIRECT both go through the page cache and the record says so
 * (direct: false): then the figures are the page cache's, not the disk's.
 *   start          (--device) a fresh open on the device, the placement's hot experts
 *                  uploaded (MOET_UPLOAD: uring streams shards -> pinned staging -> device),
 *                  the CPU tier made resident (warm fill); time to ready against
 *                  max(bytes read / disk ceiling, bytes uploaded / h2d ceiling)
 *                  (--cold: the shards' pages evicted from the page cache first, so
 *                  that the start reads the disk, as after a reboot)
 *   fill           the staged upload's fill of its staging alone, three sources
 *                  (bench_load_fill.c), against the read ceiling
 */
#include "moet_bench_load.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_topo.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"
#include "moet_model.h"
#include "moet_upload.h"
#include "moet_uring.h"
#include "moet_xtier.h"

#define SEQ_CHUNK ((size_t)8 << 20)
#define SEQ_QD 16

typedef struct bar {
	FILE *log;
	int on, tty;
	double t0, last;
	const char *what;
} bar;

static void bar_show(bar *b, uint64_t done, uint64_t total, int final)
{
	if (!b->on)
		return;
	double now = moet_bench_now_s(), el = now - b->t0;
	if (!final && now - b->last < (b->tty ? 0.1 : 2.0))
		return;
	b->last = now;
	double rate = el > 0 ? (double)done / el : 0;
	double eta = rate > 0 ? (double)(total - done) / rate : 0;
	int w = 30, fill = total ? (int)((double)w * (double)done / (double)total) : w;
	char line[64];
	for (int i = 0; i < w; i++)
		line[i] = i < fill ? '#' : '.';
	line[w] = 0;
	fprintf(b->log, "%s%s [%s] %.2f / %.2f GB, %.2f GB/s, ETA %.1f s%s", b->tty ? "\r" : "",
		b->what, line, (double)done / 1e9, (double)total / 1e9, rate / 1e9, eta,
		b->tty && !final ? "" : "\n");
	fflush(b->log);
}

typedef struct seq_state {
	int free_bufs[SEQ_QD];
	int n_free;
	uint64_t done;
} seq_state;

static void seq_done(void *ctx, const moet_uring_done *d)
{
	seq_state *s = ctx;
	s->free_bufs[s->n_free++] = (int)(intptr_t)d->range->user;
	if (!d->rc)
		s->done += d->range->n_bytes;
}

/* Sequential read of the shards (up to limit bytes): *out_bytes in *out_s; *out_direct. */
static int disk_ceiling(const moet_ckpt *ck, const moet_bench_load_opts *o, bar *b,
			uint64_t *out_bytes, double *out_s, int *out_direct)
{
	/* NOTE: 8 MiB ranges in 1 MiB requests, as many in flight as the load uses: the ceiling
	 * of this disk at that depth, not of one stream */
	moet_uring_opts uo = { .queue_depth = o->queue_depth ? o->queue_depth : 64,
			       .direct = o->direct, .chunk_bytes = (size_t)1 << 20 };
	moet_uring *u = NULL;
	uint8_t *mem = NULL;
	seq_state s = { .n_free = SEQ_QD };
	int rc = moet_uring_create(&uo, &u), n = moet_ckpt_shard_count(ck);
	uint64_t limit = o->disk_bytes ? o->disk_bytes : (uint64_t)8 << 30, total = 0;
	*out_direct = 1;
	for (int i = 0; !rc && i < n; i++) {
		int id;
		rc = moet_uring_open(u, moet_ckpt_shard_path(ck, i), &id);
		*out_direct &= !rc && moet_uring_file_direct(u, id);
		total += moet_ckpt_shard_bytes(ck, i);
	}
	if (total > limit)
		total = limit;
	if (!rc && !(mem = aligned_alloc(MOET_URING_ALIGN, SEQ_QD * SEQ_CHUNK)))
		rc = moet_err(MOET_ENOMEM, "bench load: read buffers");
	if (!rc) {
		void *bufs[1] = { mem };
		size_t bytes[1] = { SEQ_QD * SEQ_CHUNK };
		rc = moet_uring_register(u, bufs, bytes, 1);
	}
	for (int i = 0; i < SEQ_QD; i++)
		s.free_bufs[i] = i;
	b->what = "disk read ";
	b->t0 = b->last = moet_bench_now_s();
	double t0 = moet_bench_now_s();
	uint64_t issued = 0;
	int file = 0;
	uint64_t off = 0;
	while (!rc && (issued < total || moet_uring_pending(u))) {
		while (s.n_free && issued < total && file < n) {
			uint64_t fsz = moet_ckpt_shard_bytes(ck, file);
			if (off >= fsz) {
				file++;
				off = 0;
				continue;
			}
			size_t len = SEQ_CHUNK;
			if (len > fsz - off)
				len = (size_t)(fsz - off);
			if (len > total - issued)
				len = (size_t)(total - issued);
			int bi = s.free_bufs[--s.n_free];
			moet_uring_range r = { .file = file, .offset = off, .n_bytes = len,
					       .buf = mem + (size_t)bi * SEQ_CHUNK,
					       .user = (void *)(intptr_t)bi };
			if ((rc = moet_uring_submit(u, &r, 1, seq_done, &s)))
				break;
			off += len;
			issued += len;
		}
		if (file >= n && !moet_uring_pending(u))
			break;
		int got = moet_uring_poll(u, 1);
		if (got < 0)
			rc = got;
		bar_show(b, s.done, total, 0);
	}
	if (!rc)
		rc = moet_uring_drain(u);
	*out_s = moet_bench_now_s() - t0;
	*out_bytes = s.done;
	bar_show(b, s.done, total, 1);
	moet_uring_destroy(u);
	free(mem);
	return rc;
}

/* Checkpoint bytes by part: dense (everything but routed experts and MTP layers), routed
 * experts on a device (hot) and in the CPU tier, for placement own (NULL: all on device 0). */
static void start_bytes(const moet_model *m, const int16_t *own, double *dense, double *hot,
			double *tier)
{
	const moet_ckpt *ck = moet_model_ckpt(m);
	const int64_t L = moet_model_config(m)->num_hidden_layers;
	const int64_t E = moet_model_config(m)->n_routed_experts;
	*dense = *hot = *tier = 0;
	for (size_t i = 0; i < moet_ckpt_count(ck); i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		int64_t l, e;
		moet_part p = moet_tensor_part(t->name, L, &l, &e);
		if (p == MOET_PART_MTP)
			continue;
		if (p != MOET_PART_EXPERT)
			*dense += (double)t->n_bytes;
		else if (!own || own[l * E + e] >= 0)
			*hot += (double)t->n_bytes;
		else
			*tier += (double)t->n_bytes;
	}
}

/* The slots' NUMA placement as the kernel reports it (move_pages over every slot page, after
 * the warm fill): an object for the record and a line for the table. A failed query is
 * recorded (verify_error), not fatal: placement is a fact to report. */
static json_t *numa_report(moet_xtier *x, char *txt, size_t cap, const char *row)
{
	static const char *const modes[] = { "auto", "off", "bind", "interleave" };
	moet_xtier_stats st;
	int rc = moet_xtier_numa_verify(x, 1);
	moet_xtier_stats_get(x, &st);
	json_t *nodes = json_array(), *pages = json_object(), *slots = json_object();
	char line[512], key[16];
	size_t at = 0;
	line[0] = 0;
	for (int k = 0; k < MOET_XTIER_MAX_NODES; k++) {
		snprintf(key, sizeof(key), "%d", k);
		if (st.numa_node_mask >> k & 1)
			json_array_append_new(nodes, json_integer(k));
		if (st.numa_node_pages[k])
			json_object_set_new(pages, key,
					    json_integer((json_int_t)st.numa_node_pages[k]));
		if (st.numa_node_slots[k]) {
			json_object_set_new(slots, key,
					    json_integer((json_int_t)st.numa_node_slots[k]));
			if (at < sizeof(line))
				at += (size_t)snprintf(line + at, sizeof(line) - at, "%s%d:%lld",
						       at ? " " : "", k,
						       (long long)st.numa_node_slots[k]);
		}
	}
	const int mode = st.numa_mode >= 0 && st.numa_mode < 4 ? st.numa_mode : 0;
	json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:f}", "mode",
			      modes[mode], "note", st.numa_note, "nodes", nodes, "pages_per_node",
			      pages, "slots_per_node", slots, "slots_spread",
			      (json_int_t)st.numa_spread_slots, "slots_empty",
			      (json_int_t)st.numa_empty_slots, "pages", (json_int_t)st.numa_pages,
			      "pages_absent", (json_int_t)st.numa_absent, "pages_off_policy",
			      (json_int_t)st.numa_off_policy, "verify_s",
			      (double)st.numa_verify_ns * 1e-9);
	if (rc && o)
		json_object_set_new(o, "verify_error", json_string(moet_errmsg()));
	if (rc)
		snprintf(txt, cap, "%-15s verify failed: %s\n", row, moet_errmsg());
	else
		snprintf(txt, cap, "%-15s slots per node %s, spread %lld, empty %lld; %s %s (%s); "
			"%llu pages in %.3f s\n", row, at ? line : "-",
			(long long)st.numa_spread_slots, (long long)st.numa_empty_slots,
			"policy", modes[mode], st.numa_note, (unsigned long long)st.numa_pages,
			(double)st.numa_verify_ns * 1e-9);
	return o;
}

/* The share of the shards' pages in the page cache: mincore over a mapping of our own (its
 * page tables untouched: what it reports is the page cache's, not this process's). */
static int cache_share(const moet_ckpt *ck, double *out)
{
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE), win = (size_t)1 << 30;
	unsigned char *vec = malloc(win / pg);
	uint64_t in = 0, all = 0;
	if (!vec)
		return moet_err(MOET_ENOMEM, "page cache query");
	int rc = 0;
	for (int i = 0; !rc && i < moet_ckpt_shard_count(ck); i++) {
		const char *path = moet_ckpt_shard_path(ck, i);
		struct stat sb;
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &sb)) {
			rc = moet_err(MOET_EIO, "%s: %s", path, strerror(errno));
			if (fd >= 0)
				close(fd);
			break;
		}
		const size_t len = (size_t)sb.st_size;
		void *p = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
		close(fd);
		if (p == MAP_FAILED) {
			rc = moet_err(MOET_EIO, "mapping %s: %s", path, strerror(errno));
			break;
		}
		for (size_t at = 0; at < len && !rc; at += win) {
			const size_t n = len - at < win ? len - at : win, np = (n + pg - 1) / pg;
			if (mincore((char *)p + at, n, vec)) {
				rc = moet_err(MOET_EIO, "mincore %s: %s", path,
					      strerror(errno));
				break;
			}
			for (size_t k = 0; k < np; k++)
				in += vec[k] & 1;
			all += np;
		}
		if (p)
			munmap(p, len);
	}
	free(vec);
	*out = all ? (double)in / (double)all : 0;
	return rc;
}

/* --cold: the shards' pages dropped from the page cache, so that the start reads the disk.
 * Dirty pages are written first (fdatasync: they cannot be dropped), then POSIX_FADV_DONTNEED,
 * which needs no root (unlike /proc/sys/vm/drop_caches); pages some process has mapped stay,
 * and on tmpfs nothing can go (the record's cache_after says what stayed). */
static int cache_drop(const moet_bench_load_opts *o, json_t *rec, FILE *out)
{
	moet_ckpt *ck = NULL;
	double before = 0, after = 0;
	int rc = moet_ckpt_open(o->model_dir, &ck);
	if (!rc)
		rc = cache_share(ck, &before);
	for (int i = 0; !rc && i < moet_ckpt_shard_count(ck); i++) {
		const char *path = moet_ckpt_shard_path(ck, i);
		int fd = open(path, O_RDONLY | O_CLOEXEC), e = fd < 0 ? errno : 0;
		if (!e && fdatasync(fd) && errno != EINVAL && errno != EROFS)
			e = errno;
		if (!e)
			e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		if (fd >= 0)
			close(fd);
		if (e)
			rc = moet_err(MOET_EIO, "%s: %s", path, strerror(e));
	}
	if (!rc)
		rc = cache_share(ck, &after);
	moet_ckpt_close(ck);
	if (rc)
		return moet_err_prefix(rc, "--cold");
	json_object_set_new(rec, "cold", json_pack("{s:f, s:f}", "cache_before", before,
						   "cache_after", after));
	fprintf(out, "%-15s %10s %10s %9s the shards' pages in the page cache: %.1f%% before, "
		"%.1f%% after dropping them%s\n", "start-cold", "-", "-", "-", 100 * before,
		100 * after, after > 0.05 ? " (some stayed: tmpfs, or mapped by a process)" : "");
	return 0;
}

/* The start: open on the device (the dense part bound), the placement's hot experts
 * uploaded through the chosen source, the CPU tier made resident (the NVMe tier's warm fill
 * of the whole tier, at most cap bytes); time to ready against the bounds of this run. */
static int start_bench(const moet_bench_load_opts *o, double disk_GBps, double h2d_GBps,
		       size_t cap, json_t *rec, FILE *log, FILE *out)
{
	moet_model *m = NULL;
	int16_t *zeros = NULL;
	const int cuda = !strcmp(o->device, "cuda");
	if (o->upload && setenv("MOET_UPLOAD", o->upload, 1))
		return moet_err(MOET_ENOMEM, "bench load: MOET_UPLOAD");
	/* NOTE: indexed by MOET_UPLOAD_AUTO, _PLAIN, _STAGED, _URING */
	static const char *const src_name[] = { "(default)", "plain", "staged", "uring" };
	int src = 0, read = 0;
	if (moet_upload_source(&src) || moet_upload_read_mode(&read))
		return moet_err_prefix(MOET_EINVAL, "bench load");
	const char *rd = read == MOET_UPLOAD_READ_PREAD ? "pread" : "map";
	fprintf(log, "bench load: start on %s, hot experts through MOET_UPLOAD=%s "
		"MOET_UPLOAD_READ=%s\n", o->device, src_name[src], rd);
	json_t *cold = json_object();
	int rc = cold ? 0 : moet_err(MOET_ENOMEM, "record");
	if (!rc && o->cold)
		rc = cache_drop(o, cold, out);
	const double t0 = moet_bench_now_s();
	if (!rc)
		rc = moet_model_open_on(o->model_dir, o->device, &m);
	const double t1 = moet_bench_now_s();
	double dense_up_b = 0, dense_up_s = 0;
	if (!rc)
		moet_model_dense_upload_stats(m, &dense_up_b, &dense_up_s);
	const moet_config *c = rc ? NULL : moet_model_config(m);
	const int64_t LE = c ? c->num_hidden_layers * c->n_routed_experts : 0;
	if (!rc && !o->owner && !(zeros = calloc((size_t)(LE ? LE : 1), sizeof(*zeros))))
		rc = moet_err(MOET_ENOMEM, "bench load: owner table");
	const int16_t *own = o->owner ? o->owner : zeros;
	if (!rc)
		rc = moet_model_set_placement(m, own, o->n_devices > 0 ? o->n_devices : 1);
	const double t2 = moet_bench_now_s();
	double dense = 0, hot = 0, tier = 0, fill_s = 0, wait_s = 0;
	if (!rc)
		moet_model_upload_split(m, &fill_s, &wait_s);
	if (!rc)
		start_bytes(m, own, &dense, &hot, &tier);
	moet_xtier_stats st = { 0 };
	if (!rc && tier > 0) {
		moet_xtier_stats plan;
		rc = moet_xtier_plan(m, &plan);
		size_t whole = (size_t)plan.tier_experts * plan.slot_bytes;
		moet_xtier_opts xo = { .ram_budget_bytes = whole < cap || !cap ? whole : cap,
				       .queue_depth = o->queue_depth, .direct = o->direct,
				       .no_prefetch = 1, .no_register = o->no_register };
		if (!rc)
			rc = moet_model_set_xtier(m, &xo);
		if (!rc)
			moet_xtier_stats_get(moet_model_xtier(m), &st);
	}
	const double t3 = moet_bench_now_s();
	char numa_txt[768] = "";
	json_t *numa = !rc && moet_model_xtier(m) ? numa_report(moet_model_xtier(m), numa_txt,
								 sizeof(numa_txt), "start-numa")
						  : NULL;
	moet_model_close(m);
	free(zeros);
	if (rc) {
		json_decref(numa);
		json_decref(cold);
		return moet_err_prefix(rc, "bench load: start on %s", o->device);
	}
	/* NOTE: the tier holds what the budget allows; its bytes are what was read */
	const double read_b = dense + hot + (double)st.bytes_read, up_b = cuda ? dense + hot : 0;
	const double ready = t3 - t0, b_disk = disk_GBps > 0 ? read_b / (disk_GBps * 1e9) : 0;
	const double b_h2d = h2d_GBps > 0 ? up_b / (h2d_GBps * 1e9) : 0;
	const double bound = b_disk > b_h2d ? b_disk : b_h2d;
	moet_bench_row r = { .name = "start", .tokens = -1, .st = { ready, ready, ready, 1 },
			     .bytes = read_b, .ceiling = b_h2d > b_disk ? "h2d_GBps" :
			     "disk_read_GBps", .ratio = ready > 0 ? bound / ready : 0 };
	rc = moet_bench_add_row(rec, &r);
	json_object_set_new(rec, "start", json_pack(
		"{s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
		"device", o->device, "upload", src ? src_name[src] : "default", "open_s", t1 - t0,
		"upload_s", t2 - t1, "tier_s", t3 - t2, "time_to_ready_s", ready, "dense_bytes",
		dense, "hot_bytes", hot, "tier_bytes", (double)st.bytes_read, "read_bytes", read_b,
		"h2d_bytes", up_b, "disk_bound_s", b_disk, "h2d_bound_s", b_h2d,
		"ready_over_bound", bound > 0 ? ready / bound : 0));
	if (numa)
		json_object_set_new(json_object_get(rec, "start"), "numa", numa);
	/* the staged source's read (MOET_UPLOAD_READ) */
	json_object_set_new(json_object_get(rec, "start"), "read", json_string(rd));
	/* the dense part's bulk upload inside the open (device backends) */
	json_object_set_new(json_object_get(rec, "start"), "dense_upload_s",
			    json_real(dense_up_s));
	json_object_set_new(json_object_get(rec, "start"), "dense_upload_GBps",
			    json_real(dense_up_s > 0 ? dense_up_b / dense_up_s / 1e9 : 0));
	/* the hot experts' staged upload: waiting for the fills vs for the link */
	json_object_set_new(json_object_get(rec, "start"), "hot_fill_wait_s", json_real(fill_s));
	json_object_set_new(json_object_get(rec, "start"), "hot_link_wait_s", json_real(wait_s));
	/* --cold: the page cache's share of the shards before and after the drop */
	if (o->cold)
		json_object_set(json_object_get(rec, "start"), "cold", json_object_get(cold, "cold"));
	json_decref(cold);
	fprintf(out, "%-15s %10.3f %10.3f %9.2f open %.3f s (dense %.3f GB up in %.3f s) + hot "
		"experts %.3f s + tier %.3f s; bound %.3f s (%s); ready/bound %.2f\n", "start",
		read_b / 1e9, ready, ready > 0 ? read_b / ready / 1e9 : 0, t1 - t0,
		dense_up_b / 1e9, dense_up_s, t2 - t1, t3 - t2, bound,
		b_h2d > b_disk ? "h2d" : "disk", bound > 0 ? ready / bound : 0);
	if (fill_s + wait_s > 0)
		fprintf(out, "%-15s %10s %10.3f %9s the hot experts' staged upload: %.3f s waiting "
			"for the threads' fills, %.3f s for the link\n", "start-split", "-",
			fill_s + wait_s, "-", fill_s, wait_s);
	fputs(numa_txt, out);
	return rc;
}

static void load_progress(void *ctx, uint64_t done, uint64_t total)
{
	bar_show(ctx, done, total, 0);
}

int moet_bench_load(const moet_bench_load_opts *o, json_t *rec, FILE *log, FILE *out)
{
	bar b = { .log = log, .on = o->progress, .tty = isatty(fileno(log)) };
	moet_model *m = NULL;
	double t0 = moet_bench_now_s();
	int rc = moet_model_open(o->model_dir, &m);
	double open_s = moet_bench_now_s() - t0;
	uint64_t disk_b = 0;
	double disk_s = 0, h2d = 0;
	int direct = 0;
	if (!rc) {
		fprintf(log, "bench load: %s opened in %.3f s; sequential read of the shards\n",
			o->model_dir, open_s);
		rc = disk_ceiling(moet_model_ckpt(m), o, &b, &disk_b, &disk_s, &direct);
	}
	const double disk_GBps = disk_s > 0 ? (double)disk_b / disk_s / 1e9 : 0;
	const char *why = "";
	if (!rc && !o->no_gpu && moet_gpu_count(&why) > 0) {
		if ((rc = moet_bench_h2d_GBps(&h2d)))
			return moet_err_prefix(rc, "bench load: host-to-device ceiling");
	}
	moet_xtier_stats plan = { 0 }, st = { 0 };
	if (!rc)
		rc = moet_xtier_plan(m, &plan);
	size_t budget = o->ram_budget_bytes, whole = (size_t)plan.tier_experts * plan.slot_bytes;
	const size_t cap = moet_topo_mem_available() / 10 * 8;
	if (!budget)
		budget = whole < cap || !cap ? whole : cap;
	if (!rc) {
		fprintf(log, "bench load: %lld experts (%.2f GB), slots for %.1f%% of them\n",
			(long long)plan.tier_experts, (double)plan.tier_bytes / 1e9,
			whole ? 100.0 * (double)(budget < whole ? budget : whole) / (double)whole : 0);
		b.what = "load tier ";
		b.t0 = b.last = moet_bench_now_s();
		moet_xtier_opts xo = { .ram_budget_bytes = budget, .queue_depth = o->queue_depth,
				       .direct = o->direct, .no_prefetch = 1,
				       .no_register = o->no_register,
				       .progress = load_progress, .progress_ctx = &b };
		rc = moet_model_set_xtier(m, &xo);
	}
	if (!rc) {
		moet_xtier_stats_get(moet_model_xtier(m), &st);
		bar_show(&b, st.bytes_read, st.bytes_read, 1);
	}
	const double read_s = (double)st.warm_ns * 1e-9, alloc_s = (double)st.alloc_ns * 1e-9;
	const double load_s = read_s + alloc_s; /* time to ready: slots, then their reads */
	const double bound_s = disk_GBps > 0 ? (double)st.bytes_read / (disk_GBps * 1e9) : 0;
	if (!rc) {
		moet_bench_add_ceiling(rec, "disk_read_GBps", disk_GBps, "GB/s");
		if (h2d > 0)
			moet_bench_add_ceiling(rec, "h2d_GBps", h2d, "GB/s");
		moet_bench_row r1 = { .name = "disk-seq-read", .tokens = -1,
				      .st = { disk_s, disk_s, disk_s, 1 }, .bytes = (double)disk_b,
				      .ceiling = "disk_read_GBps", .ratio = 1.0 };
		moet_bench_row r2 = { .name = "load-tier", .tokens = -1,
				      .st = { load_s, load_s, load_s, 1 },
				      .bytes = (double)st.bytes_read, .ceiling = "disk_read_GBps",
				      .ratio = load_s > 0 ? bound_s / load_s : 0 };
		moet_bench_add_row(rec, &r1);
		moet_bench_add_row(rec, &r2);
		json_object_set_new(rec, "load", json_pack(
			"{s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:b, s:I, s:f, s:s}",
			"experts", (json_int_t)st.warm_reads, "tier_experts",
			(json_int_t)st.tier_experts, "slot_bytes", (json_int_t)st.slot_bytes,
			"bytes", (double)st.bytes_read, "open_s", open_s, "slots_s", alloc_s,
			"read_s", read_s, "time_to_ready_s", load_s,
			"disk_bound_s", bound_s, "ready_over_bound", bound_s > 0 ? load_s / bound_s : 0,
			"direct", st.direct && direct, "registered", st.registered, "queue_depth",
			(json_int_t)(o->queue_depth ? o->queue_depth : 64), "h2d_GBps", h2d, "gpu",
			h2d > 0 ? "measured" : why));
		fprintf(out, "%-15s %10s %10s %9s %s\n", "what", "GB", "seconds", "GB/s", "note");
		fprintf(out, "%-15s %10.3f %10.3f %9.2f %s\n", "disk-seq-read", (double)disk_b / 1e9,
			disk_s, disk_GBps, direct ? "O_DIRECT" : "buffered (page cache)");
		fprintf(out, "%-15s %10.3f %10.3f %9.2f %lld experts, %s; slots %.3f s + reads "
			"%.3f s; ready/bound %.2f\n", "load-tier", (double)st.bytes_read / 1e9,
			load_s, load_s > 0 ? (double)st.bytes_read / load_s / 1e9 : 0,
			(long long)st.warm_reads, st.registered ? "registered" : "unregistered",
			alloc_s, read_s, bound_s > 0 ? load_s / bound_s : 0);
		if (h2d > 0)
			fprintf(out, "%-15s %10.3f %10s %9.2f pinned, median of 5\n", "h2d", 0.256,
				"-", h2d);
		else
			fprintf(out, "h2d: not measured (%s)\n", o->no_gpu ? "--no-gpu" : why);
		/* NOTE: after the timed part: the query is not part of the time to ready */
		char numa_txt[768] = "";
		json_t *numa = numa_report(moet_model_xtier(m), numa_txt, sizeof(numa_txt), "numa");
		fputs(numa_txt, out);
		if (numa)
			json_object_set_new(json_object_get(rec, "load"), "numa", numa);
	}
	if (!rc)
		rc = moet_bench_load_fill(o, m, disk_GBps, rec, log, out);
	moet_model_close(m);
	m = NULL;
	if (!rc && o->device)
		rc = start_bench(o, disk_GBps, h2d, cap, rec, log, out);
	moet_model_close(m);
	return rc;
}
