/*
 * moet_upload.h: the hot experts' upload at start, two sources:
 *   staged  host byte ranges (the checkpoint's mapped expert bytes) copied by several threads
 *           into pinned staging buffers, transfers overlapped with the copies (upload.c)
 *   uring   the matrices' bytes read from the shard files with io_uring (O_DIRECT where the
 *           filesystem takes it) straight into registered pinned staging buffers, each filled
 *           buffer copied to the device while the next reads are in flight (upload_uring.c)
 *   register the mapped pages themselves page-locked (cudaHostRegister) chunk by chunk and
 *           DMA'd from in place: one pass over the host's DRAM per byte instead of the
 *           staging's three (upload_reg.c); not yet measured on the GPU machine
 * MOET_UPLOAD=plain|staged|uring|register picks one at moet_model_bind_experts
 * (docs/hybrid.md); moet_upload_many takes staged or register.
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
	/* the register source only (0 otherwise) */
	uint64_t reg_chunks;   /* chunks page-locked (cudaHostRegister calls that succeeded) */
	uint64_t reg_bytes;    /* bytes page-locked: whole pages around the items */
	double reg_seconds;    /* cudaHostRegister calls, summed over the registering threads */
	double unreg_seconds;  /* cudaHostUnregister calls, summed */
	double reg_wait_seconds; /* the issuing thread's waits for a chunk's registration */
	int reg_read_only;     /* 1: registered with cudaHostRegisterReadOnly */
	int reg_fallback;      /* 1: a registration failed: the rest went through staging */
	uint64_t fallback_bytes; /* bytes that went through staging after that */
} moet_upload_stats;

/* Copies every item; returns when all bytes are on the device. MOET_UPLOAD=register:
 * moet_upload_many_register (defaults from the environment), anything else valid: the
 * staged copy (moet_upload_many_staged). n_threads: the threads that read the host bytes
 * into staging (1..64; fewer are used if threads cannot be made). Returns 0, MOET_EINVAL (a
 * bad MOET_UPLOAD or MOET_UPLOAD_REG_* value, named), MOET_ENOMEM, MOET_EDEVICE (a CUDA
 * call; detail names it) or MOET_EUNSUP without CUDA. stats (optional) gets the bytes and
 * the wall time (and the register source's figures). */
int moet_upload_many(const moet_upload_item *items, int64_t n, int n_threads,
		     moet_upload_stats *stats);

/* The staged copy whatever MOET_UPLOAD says: pinned staging buffers filled by n_threads
 * threads, overlapped with the transfers (upload.c). Returns as moet_upload_many. */
int moet_upload_many_staged(const moet_upload_item *items, int64_t n, int n_threads,
			    moet_upload_stats *stats);

/* ---- the register source (upload_reg.c) ------------------------------------------------ */

/* One chunk of a plan: whole pages, page-locked by one cudaHostRegister call. */
typedef struct moet_upload_chunk {
	const char *base;  /* page-aligned */
	size_t bytes;      /* a multiple of the page, at most the plan's chunk bytes */
	int64_t piece0;    /* its pieces: pieces[piece0 .. piece0 + n_pieces - 1] */
	int64_t n_pieces;
} moet_upload_chunk;

/* The items cut into chunks of whole pages and into pieces (one per item and chunk). */
typedef struct moet_upload_plan {
	moet_upload_chunk *chunks; /* by address, disjoint */
	int64_t n_chunks;
	moet_upload_item *pieces;  /* grouped by chunk, each inside its chunk; together exactly
				      the items' bytes, each at its item's dst + its offset */
	int64_t n_pieces;
	size_t bytes;              /* the items' bytes */
	size_t locked_bytes;       /* the chunks' bytes */
} moet_upload_plan;

/*
 * The register source's plan: items sorted by source address; each item's source rounded
 * out to page boundaries; ranges whose pages overlap or touch merged into one region (a gap
 * of pages that hold no item's byte is never page-locked: moet_upload_many knows no mapping's
 * extent, and every page that holds an item's byte is mapped); each region cut into chunks of
 * at most chunk_bytes (rounded up to a page multiple). Items of 0 bytes are skipped; items may
 * overlap. page_bytes: a power of two (the host page, sysconf). *out is filled (free with
 * moet_upload_plan_free; zeroed on failure). Returns 0, MOET_EINVAL ("upload item I: ..."
 * for a NULL source or destination, a bad page or chunk size), MOET_ERANGE (an item whose
 * pages wrap the address space) or MOET_ENOMEM.
 */
int moet_upload_plan_make(const moet_upload_item *items, int64_t n, size_t page_bytes,
			  size_t chunk_bytes, moet_upload_plan *out);
/* Frees a plan's arrays; NULL and zeroed plans are accepted. */
void moet_upload_plan_free(moet_upload_plan *p);

typedef struct moet_upload_reg_opts {
	size_t chunk_bytes;  /* page-locked per cudaHostRegister call; 0: MOET_UPLOAD_REG_KB,
				else 256 MiB (why: docs/hybrid.md) */
	int max_chunks;      /* K: chunks page-locked at once, 2..64; 0: MOET_UPLOAD_REG_CHUNKS,
				else 4 */
	int n_threads;       /* registering threads, 1..K; 0: MOET_UPLOAD_REG_THREADS, else 1 */
	int staged_threads;  /* the staging's threads if a registration fails; 0: default */
	int quiet;           /* 1: no summary line on stderr */
} moet_upload_reg_opts;

/*
 * Copies every item by DMA straight from its host pages: the plan's chunks are page-locked
 * in place by n_threads registering threads (cudaHostRegister, read-only where the device
 * takes it) ahead of the calling thread, which queues each chunk's pieces on a copy stream
 * (one async copy per piece), then an event; a chunk is unregistered once its event has
 * passed, and at most K chunks are page-locked at once. If a registration fails, nothing of
 * it or after it has been queued: the copies queued so far finish, every chunk is
 * unregistered, and the remaining pieces go through moet_upload_many_staged (one line on
 * stderr says why; stats->reg_fallback). Destinations: device memory of the calling thread's
 * current device. One summary line on stderr unless o->quiet. o may be NULL. Returns as
 * moet_upload_many (MOET_EINVAL: a bad option or MOET_UPLOAD_REG_* value, named).
 */
int moet_upload_many_register(const moet_upload_item *items, int64_t n,
			      const moet_upload_reg_opts *o, moet_upload_stats *stats);

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

/* MOET_UPLOAD: MOET_UPLOAD_AUTO (unset), _PLAIN, _STAGED, _URING or _REGISTER; MOET_EINVAL
 * naming the value otherwise. */
enum {
	MOET_UPLOAD_AUTO = 0,
	MOET_UPLOAD_PLAIN,
	MOET_UPLOAD_STAGED,
	MOET_UPLOAD_URING,
	MOET_UPLOAD_REGISTER
};
int moet_upload_source(int *out);

#endif
