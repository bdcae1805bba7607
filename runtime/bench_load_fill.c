/*
 * bench_load_fill.c: bench load's fill rows (moet_bench_load.h): where the staged upload's
 * host side stands, without a GPU and without the transfer.
 *
 *   items     the hot experts' tensors (placement owner >= 0, or every routed expert), in
 *             layer, expert, name order (the upload's order, near enough), until the cap
 *   fill-map-fresh  the shards mapped anew (PROT_READ, MAP_SHARED, as the checkpoint maps
 *             them): untouched page tables even with the page cache warm, so every page the
 *             fill reads is a page fault, as in the upload at start
 *   fill-map-warm   the same mapping again: its pages are mapped now (no faults)
 *   fill-pread      the bytes read from the shard files (pread) into the staging
 *
 * Each is one moet_upload_many_opts call with fill_only (the upload's threads, buffers and
 * stores: MOET_UPLOAD_THREADS, MOET_UPLOAD_CHUNK_MB, MOET_UPLOAD_STORE apply), timed by its
 * copy_seconds (the staging's allocation and the threads' start excluded).
 * NOTE: the rows run in this order, so the page cache holds the bytes for the second and
 * third (a cold page cache would make the first a disk read: not what this measures).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "moet_bench_load.h"
#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_upload.h"

#define FILL_DEFAULT ((size_t)8 << 30)

typedef struct sel {
	int64_t layer, expert;
	const moet_tensor *t;
} sel;

static int cmp_sel(const void *a, const void *b)
{
	const sel *p = a, *q = b;
	if (p->layer != q->layer)
		return p->layer < q->layer ? -1 : 1;
	if (p->expert != q->expert)
		return p->expert < q->expert ? -1 : 1;
	return strcmp(p->t->name, q->t->name);
}

/* One fill: items copied from src, or pread from their files; its time into *out_s, the
 * staging it used into *st. */
static int fill_once(const moet_upload_item *items, const moet_upload_from *from, int64_t n,
		     int pread, int threads, double *out_s, moet_upload_stats *st)
{
	moet_upload_opts uo = { .fill_only = 1, .from = pread ? from : NULL,
				.read = 1 + (pread ? MOET_UPLOAD_READ_PREAD : MOET_UPLOAD_READ_MAP) };
	int rc = moet_upload_many_opts(items, n, threads, &uo, st);
	*out_s = st->copy_seconds;
	return rc;
}

int moet_bench_load_fill(const moet_bench_load_opts *o, const moet_model *m, double read_GBps,
			 json_t *rec, FILE *log, FILE *out)
{
	const moet_ckpt *ck = moet_model_ckpt(m);
	const int64_t L = moet_model_config(m)->num_hidden_layers;
	const int64_t E = moet_model_config(m)->n_routed_experts;
	const int n_sh = moet_ckpt_shard_count(ck), threads = moet_upload_default_threads();
	const size_t cap = o->fill_bytes ? o->fill_bytes : FILL_DEFAULT;
	const size_t nt = moet_ckpt_count(ck);
	sel *s = malloc((nt ? nt : 1) * sizeof(*s));
	moet_upload_item *items = malloc((nt ? nt : 1) * sizeof(*items));
	moet_upload_from *from = malloc((nt ? nt : 1) * sizeof(*from));
	int *shard = malloc((nt ? nt : 1) * sizeof(*shard));
	const uint8_t **map = calloc((size_t)(n_sh ? n_sh : 1), sizeof(*map));
	moet_upload_files *files = NULL;
	int64_t n = 0, n_sel = 0;
	size_t total = 0;
	double sec[3] = { 0 };
	int rc = 0;
	if (!s || !items || !from || !shard || !map) {
		rc = moet_err(MOET_ENOMEM, "bench load: fill list of %zu tensors", nt);
		goto out;
	}
	for (size_t i = 0; i < nt; i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		int64_t l, e;
		if (moet_tensor_part(t->name, L, &l, &e) == MOET_PART_EXPERT && t->n_bytes &&
		    (!o->owner || o->owner[l * E + e] >= 0))
			s[n_sel++] = (sel){ l, e, t };
	}
	qsort(s, (size_t)n_sel, sizeof(*s), cmp_sel);
	if ((rc = moet_upload_files_open(ck, &files)))
		goto out;
	for (int64_t i = 0; i < n_sel && (n == 0 || total + s[i].t->n_bytes <= cap); i++) {
		const moet_tensor *t = s[i].t;
		if ((rc = moet_upload_files_locate(files, t->data, t->n_bytes, &from[n], &shard[n])))
			goto out;
		items[n] = (moet_upload_item){ NULL, NULL, t->n_bytes };
		total += t->n_bytes;
		n++;
	}
	if (n == 0) {
		fprintf(out, "%-15s no routed expert to fill\n", "fill");
		goto out;
	}
	fprintf(log, "bench load: fill of %.2f GB (%lld tensors) by %d threads: fresh mapping, "
		"again, pread\n", (double)total / 1e9, (long long)n, threads);
	/* NOTE: a mapping of our own, not the checkpoint's: its page tables are untouched */
	for (int i = 0; i < n_sh; i++) {
		size_t len = moet_ckpt_shard_bytes(ck, i);
		void *p = len ? mmap(NULL, len, PROT_READ, MAP_SHARED,
				     moet_upload_files_at(files, i)->fd, 0) : NULL;
		if (p == MAP_FAILED) {
			rc = moet_err(MOET_EIO, "bench load: mapping %s", moet_ckpt_shard_path(ck, i));
			goto out;
		}
		map[i] = p;
	}
	for (int64_t i = 0; i < n; i++)
		items[i].src = map[shard[i]] + from[i].off;
	moet_upload_stats ust = { 0 };
	if ((rc = fill_once(items, from, n, 0, threads, &sec[0], &ust)) ||
	    (rc = fill_once(items, from, n, 0, threads, &sec[1], &ust)) ||
	    (rc = fill_once(items, from, n, 1, threads, &sec[2], &ust)))
		goto out;
	static const char *const names[3] = { "fill-map-fresh", "fill-map-warm", "fill-pread" };
	static const char *const notes[3] = { "copied from a fresh mapping (page faults)",
					      "copied from the same mapping again",
					      "pread from the shard files" };
	/* NOTE: the staging the upload used (its defaults or the environment's) */
	const int chunk_mb = (int)(ust.buffer_bytes >> 20);
	const char *store = ust.cached ? "cached" : "nt";
	json_t *fo = json_pack("{s:f, s:I, s:i, s:i, s:i, s:s, s:s}", "bytes", (double)total,
			       "tensors", (json_int_t)n, "threads", threads, "buffers", 4,
			       "buffer_mb", chunk_mb, "store", store,
			       "experts", o->owner ? "placement" : "all");
	for (int k = 0; k < 3; k++) {
		const double GBps = sec[k] > 0 ? (double)total / sec[k] / 1e9 : 0;
		moet_bench_row r = { .name = names[k], .tokens = -1,
				     .st = { .median_s = sec[k], .min_s = sec[k],
					    .max_s = sec[k], .reps = 1 }, .bytes = (double)total,
				     .ceiling = "disk_read_GBps",
				     .ratio = read_GBps > 0 ? GBps / read_GBps : 0 };
		if ((rc = moet_bench_add_row(rec, &r)))
			break;
		char key[32];
		snprintf(key, sizeof(key), "%s_GBps", names[k] + 5);
		for (char *c = key; *c; c++)
			*c = *c == '-' ? '_' : *c;
		if (fo)
			json_object_set_new(fo, key, json_real(GBps));
		fprintf(out, "%-15s %10.3f %10.3f %9.2f %s, %d threads into 4 x %d MiB; "
			"%.2f of the read ceiling\n", names[k], (double)total / 1e9, sec[k], GBps,
			notes[k], threads, chunk_mb, read_GBps > 0 ? GBps / read_GBps : 0);
	}
	if (fo)
		json_object_set_new(rec, "fill", fo);
out:
	for (int i = 0; map && i < n_sh; i++)
		if (map[i])
			munmap((void *)map[i], moet_ckpt_shard_bytes(ck, i));
	moet_upload_files_close(files);
	free(s);
	free(items);
	free(from);
	free(shard);
	free(map);
	return rc ? moet_err_prefix(rc, "bench load: fill") : 0;
}
