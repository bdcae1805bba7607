/*
 * moet_upload.h: the hot experts' upload at start, two sources:
 *   staged  host byte ranges (the checkpoint's mapped expert bytes) copied by several threads
 *           into pinned staging buffers, transfers overlapped with the copies (upload.c)
 *   uring   the matrices' bytes read from the shard files with io_uring (O_DIRECT where the
 *           filesystem takes it) straight into registered pinned staging buffers, each filled
 *           buffer copied to the device while the next reads are in flight (upload_uring.c)
 * MOET_UPLOAD=plain|staged|uring picks one at moet_model_bind_experts (docs/hybrid.md);
 * MOET_UPLOAD_READ=map|pread the staged source's read (from the mapping, or pread from the
 * shard files into the staging).
 */
#ifndef MOET_UPLOAD_H
#define MOET_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "moet_mat.h"

struct moet_ckpt;

/* A file that holds items' source bytes, for MOET_UPLOAD_READ=pread (borrowed: open for the
 * call). */
typedef struct moet_upload_file {
	int fd;               /* open for reading */
	const char *path;     /* named in a failed read's message */
} moet_upload_file;

typedef struct moet_upload_item {
	const void *src; /* host bytes (any memory: mapped files included) */
	void *dst;       /* device memory (host memory with moet_upload_opts.host_dst) */
	size_t bytes;
} moet_upload_item;

/* Where an item's bytes lie in a file: with MOET_UPLOAD_READ=pread they are read from there
 * (pread) instead of copied from src. file NULL: copied from src whatever MOET_UPLOAD_READ
 * says. NOTE: beside the items (moet_upload_opts.from) rather than in them, so the items'
 * existing initialisers { src, dst, bytes } stay complete. */
typedef struct moet_upload_from {
	const moet_upload_file *file;
	uint64_t off;    /* file offset of the item's first byte */
} moet_upload_from;

typedef struct moet_upload_stats {
	size_t bytes;
	double seconds;  /* wall time of the call */
	double copy_seconds; /* staged: from the first fill to the last byte copied (the setup:
				buffers, threads, excluded); 0 for uring */
	double fill_seconds; /* staged: the caller's wait for the threads' fills of the chunks */
	double link_wait_seconds; /* staged: its waits for a buffer's copy to end before the
				     buffer is filled again, and for the last copies */
	size_t buffer_bytes;   /* staged: each staging buffer's size (MOET_UPLOAD_CHUNK_MB) */
	int cached;            /* staged: 1 plain stores, 0 non-temporal (MOET_UPLOAD_STORE) */
	/* the uring source only (0 for staged) */
	uint64_t read_bytes;   /* bytes read from the shards (aligned covers, merge gaps) */
	uint64_t reads;        /* io_uring ranges */
	uint64_t copies;       /* host-to-device copies */
	int direct;            /* 1: every shard read with O_DIRECT */
	int registered;        /* 1: the staging buffers were registered io_uring buffers */
} moet_upload_stats;

/* Copies every item; returns when all bytes are on the device. n_threads: the threads that
 * read the host bytes (1..64; fewer are used if threads cannot be made). Returns 0,
 * MOET_ENOMEM, MOET_EDEVICE (a CUDA call; detail names it) or MOET_EUNSUP without CUDA,
 * MOET_EINVAL naming a bad MOET_UPLOAD_CHUNK_MB / _STORE / _READ (before anything is
 * allocated), MOET_EIO "upload: PATH: read of N bytes at offset O failed: errno text" (a
 * pread source's failed read: nothing later is copied; the destinations are the caller's to
 * drop). stats (optional) gets the bytes and the wall time. = moet_upload_many_opts(.., NULL,
 * ..). */
int moet_upload_many(const moet_upload_item *items, int64_t n, int n_threads,
		     moet_upload_stats *stats);

typedef struct moet_upload_opts {
	int host_dst;   /* 1: destinations are host memory (the CPU backend, tests): staging from
			   aligned_alloc, copies by memcpy; no CUDA call. 0: device memory */
	int fill_only;  /* 1: the staging buffers are filled and nothing is copied out (dst is
			   not read: bench load's fill rows); no CUDA call */
	const moet_upload_from *from; /* [n] (borrowed) or NULL: the items' files */
	int read;       /* 0: MOET_UPLOAD_READ says; else MOET_UPLOAD_READ_MAP + 1 or
			   MOET_UPLOAD_READ_PREAD + 1 (bench load's fill rows) */
	int one_block;  /* 1: every destination lies in one device allocation, so pieces
			   contiguous on both sides may go in one copy (a copy may not span two
			   allocations, however adjacent) */
} moet_upload_opts;

/* moet_upload_many with options (o NULL: device destinations). */
int moet_upload_many_opts(const moet_upload_item *items, int64_t n, int n_threads,
			  const moet_upload_opts *o, moet_upload_stats *stats);

/*
 * An uploader: the staged upload's pinned buffers (or, with host_dst / fill_only, host ones),
 * copy stream, events and threads, made once and kept for many uploads (prefill staging
 * copies one expert per call: runtime/stage.c). The options are read at create (the
 * environment's MOET_UPLOAD_CHUNK_MB, _STORE, _READ and o's modes; MOET_EINVAL naming a bad
 * one, before anything is allocated); moet_uploader_run(items, n, from, stats) then works as
 * moet_upload_many_opts and returns when every byte is at its destination (the copies done;
 * the same errors). One run at a time per uploader. moet_upload_many_opts is create, run,
 * destroy. destroy accepts NULL.
 */
typedef struct moet_uploader moet_uploader;
int moet_uploader_create(int n_threads, const moet_upload_opts *o, moet_uploader **out);
int moet_uploader_run(moet_uploader *u, const moet_upload_item *items, int64_t n,
		      const moet_upload_from *from, moet_upload_stats *stats);
void moet_uploader_destroy(moet_uploader *u);

/* MOET_UPLOAD_READ: the staged source's read of items that have a file. map (unset, empty):
 * copied from the mapping (src); pread: read from the file into the staging buffer (no page
 * fault on the mapping, whose pages the upload never touches). MOET_EINVAL naming the value
 * otherwise. */
enum { MOET_UPLOAD_READ_MAP = 0, MOET_UPLOAD_READ_PREAD };
int moet_upload_read_mode(int *out);

/* ---- a checkpoint's shard files as upload sources (upload_files.c) ------------------------ */

typedef struct moet_upload_files moet_upload_files;

/* Every shard of ck opened for reading, with where its mapped tensors lie in the file
 * (moet_uring_shard_maps). ck is borrowed and must outlive *out. Returns 0, MOET_EIO naming
 * the shard (open or header), MOET_ENOMEM. */
int moet_upload_files_open(const struct moet_ckpt *ck, moet_upload_files **out);

/* *out (the shard's file and the offset of src there) when [src, src + bytes) lies in one
 * shard's mapped tensors, and *out_shard (optional) the shard; returns 0. MOET_ERANGE (*out
 * unchanged) otherwise. */
int moet_upload_files_locate(const moet_upload_files *f, const void *src, size_t bytes,
			     moet_upload_from *out, int *out_shard);

/* Shard i's file (0 <= i < moet_ckpt_shard_count), NULL outside. */
const moet_upload_file *moet_upload_files_at(const moet_upload_files *f, int i);

/* Closes the files; accepts NULL. */
void moet_upload_files_close(moet_upload_files *f);

/* MOET_UPLOAD_THREADS (1..64), else every core of the machine but one (the driving
 * thread's), at most 64. */
int moet_upload_default_threads(void);

/* ---- the uring source (upload_uring.c) ------------------------------------------------- */

#define MOET_UPLOAD_ALIGN 256u /* each matrix's data and scales start at this alignment */

typedef struct moet_upload_uring_opts {
	size_t buf_bytes;      /* one staging buffer; 0: MOET_UPLOAD_BUF_MB, else 64 MiB; rounded
				  up to 4096, at least 8 KiB */
	int n_bufs;            /* staging buffers, 2..16; 0: 4 */
	unsigned queue_depth;  /* io_uring requests in flight; 0: 64 */
	int direct;            /* MOET_URING_DIRECT_* (moet_uring.h); 0: O_DIRECT where taken */
	int host_dst;          /* 1: destinations are host memory (the CPU backend's simulated
				  devices, tests): staging from aligned_alloc, copies by memcpy.
				  0: device memory of the current CUDA device: pinned staging
				  (cudaHostAlloc), async host-to-device copies */
	int progress;          /* bar (bytes, rate, ETA) on stderr: 1 on, -1 off, 0: when stderr is
				  a tty or MOET_UPLOAD_PROGRESS=1 */
} moet_upload_uring_opts;

/* Bytes of a block that holds the n matrices' data and scales, each at a MOET_UPLOAD_ALIGN
 * position, in the order of moet_upload_mats_uring. */
size_t moet_upload_block_bytes(const moet_mat *host, int64_t n);

/*
 * out[i] = host[i] with data (and scale_inv) moved into `block` (moet_upload_block_bytes
 * bytes, MOET_UPLOAD_ALIGN-aligned; device memory, or host memory with o->host_dst), whose
 * bytes are read from ck's shard files (host[i]'s pointers must lie in ck's mapping; the
 * mapping itself is never read) and copied there verbatim. Reads of the next staging buffers
 * are in flight while a filled one is copied. o may be NULL (defaults). Returns 0, or:
 * MOET_EIO "upload: PATH: read of N bytes at offset O failed: errno text (...)" (the first
 * failed read; nothing later is copied and out[] is left untouched, so the caller frees the
 * block and nothing is half-bound), MOET_ERANGE (a matrix not in the mapping), MOET_EINVAL,
 * MOET_ENOMEM, MOET_EDEVICE (a CUDA call), MOET_EUNSUP (io_uring unavailable, or no CUDA
 * without host_dst). stats (optional) gets bytes, time and the reader's figures.
 */
int moet_upload_mats_uring(const struct moet_ckpt *ck, const moet_mat *host, int64_t n,
			   void *block, const moet_upload_uring_opts *o, moet_mat *out,
			   moet_upload_stats *stats);

/* MOET_UPLOAD: MOET_UPLOAD_AUTO (unset), _PLAIN, _STAGED or _URING; MOET_EINVAL naming the
 * value otherwise. */
enum { MOET_UPLOAD_AUTO = 0, MOET_UPLOAD_PLAIN, MOET_UPLOAD_STAGED, MOET_UPLOAD_URING };
int moet_upload_source(int *out);

#endif
