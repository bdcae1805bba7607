/*
 * moet_upload.h: the hot experts' upload at start, two sources:
 *   staged  host byte ranges (the checkpoint's mapped expert bytes) copied by several threads
 *           into pinned staging buffers, transfers overlapped with the copies (upload.c)
 *   uring   the matrices' bytes read from the shard files with io_uring (O_DIRECT where the
 *           filesystem takes it) straight into registered pinned staging buffers, each filled
 *           buffer copied to the device while the next reads are in flight (upload_uring.c)
 * MOET_UPLOAD=plain|staged|uring picks one at moet_model_bind_experts (docs/hybrid.md).
 */
#ifndef MOET_UPLOAD_H
#define MOET_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "moet_mat.h"

struct moet_ckpt;

typedef struct moet_upload_item {
	const void *src; /* host bytes (any memory: mapped files included) */
	void *dst;       /* device memory */
	size_t bytes;
} moet_upload_item;

typedef struct moet_upload_stats {
	size_t bytes;
	double seconds;  /* wall time of the call */
	/* the uring source only (0 for staged) */
	uint64_t read_bytes;   /* bytes read from the shards (aligned covers, merge gaps) */
	uint64_t reads;        /* io_uring ranges */
	uint64_t copies;       /* host-to-device copies */
	int direct;            /* 1: every shard read with O_DIRECT */
	int registered;        /* 1: the staging buffers were registered io_uring buffers */
} moet_upload_stats;

/* Copies every item; returns when all bytes are on the device. n_threads: the threads that
 * read the host bytes (1..64; fewer are used if threads cannot be made). Returns 0,
 * MOET_ENOMEM, MOET_EDEVICE (a CUDA call; detail names it) or MOET_EUNSUP without CUDA.
 * stats (optional) gets the bytes and the wall time. */
int moet_upload_many(const moet_upload_item *items, int64_t n, int n_threads,
		     moet_upload_stats *stats);

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
