/*
 * moet_uring.h: reads byte ranges of checkpoint shards with io_uring, many requests in flight,
 * straight into buffers the caller owns (pinned host memory, so that a GPU upload can later
 * read from them), with a callback per completed range.
 *
 *   file (O_DIRECT)      |....A....|....A....|....A....|....A....|   A = MOET_URING_ALIGN
 *   wanted range                [offset ............ +n_bytes)
 *   read (aligned cover)      [.......................................)
 *   caller's buf              [head|exact bytes .......... |tail]   head = offset % A
 *                             ^ buf (A-aligned)    data = buf + head
 *
 * The exact bytes always land at buf + offset % A, whether the file is read with O_DIRECT
 * (the aligned covering range is read, in requests of at most chunk_bytes) or buffered (only
 * the wanted bytes are read): a caller lays out its buffers once, whatever the mode. A file
 * is opened with O_DIRECT when the filesystem allows it (a probe read checks), else buffered
 * with the reason in moet_uring_note (tmpfs, some network filesystems). Short reads are
 * retried for the remainder; a failed range reports the file, offset and errno text, and its
 * buffer must not be used (its callback gets data NULL).
 *
 * A reader is a single-threaded handle: submit, poll and read from one thread at a time.
 * Callbacks run on that thread, inside poll/read/drain.
 */
#ifndef MOET_URING_H
#define MOET_URING_H

#include <stddef.h>
#include <stdint.h>

#define MOET_URING_ALIGN 4096u /* offsets, lengths and addresses of O_DIRECT requests */
#define MOET_URING_MAX_FILES 4096

enum {
	MOET_URING_DIRECT_AUTO = 0, /* O_DIRECT where the filesystem takes it, else buffered */
	MOET_URING_DIRECT_OFF = 1,  /* buffered reads (page cache) */
	MOET_URING_DIRECT_ON = 2,   /* O_DIRECT or fail (MOET_EUNSUP) */
};

typedef struct moet_uring moet_uring;

typedef struct moet_uring_opts {
	unsigned queue_depth;  /* requests in flight; 0: 64 (at most 4096) */
	int direct;            /* MOET_URING_DIRECT_* */
	size_t chunk_bytes;    /* largest request; 0: 1 MiB; rounded up to MOET_URING_ALIGN */
} moet_uring_opts;

/* One range to read: bytes [offset, offset + n_bytes) of file into buf + offset % ALIGN. */
typedef struct moet_uring_range {
	int file;              /* from moet_uring_open */
	uint64_t offset;
	size_t n_bytes;        /* > 0 */
	void *buf;             /* MOET_URING_ALIGN-aligned, moet_uring_span(offset, n_bytes)
				  bytes; registered memory is used as such */
	void *user;            /* for the callback */
} moet_uring_range;

/* What a callback sees for one finished range. */
typedef struct moet_uring_done {
	const moet_uring_range *range; /* the reader's copy, valid during the callback */
	size_t index;                  /* position in the submitted array */
	const void *data;              /* buf + offset % ALIGN; NULL when the read failed */
	int rc;                        /* 0 or a negative MOET_E* code */
	const char *error;             /* one line when rc != 0, else "" */
} moet_uring_done;

typedef void (*moet_uring_done_fn)(void *ctx, const moet_uring_done *d);

/* Buffer bytes a range needs: the aligned span that covers it. */
static inline size_t moet_uring_span(uint64_t offset, size_t n_bytes)
{
	uint64_t head = offset % MOET_URING_ALIGN;
	return (size_t)((head + n_bytes + MOET_URING_ALIGN - 1) / MOET_URING_ALIGN *
			MOET_URING_ALIGN);
}

/*
 * A reader with its own ring (o may be NULL: defaults). The environment variable
 * MOET_URING_FAULT (tests) injects faults as moet_uring_fault does: "eio@N,short@M,enospc@K"
 * for the Nth, Mth, Kth request (1-based) submitted by this reader. Errors: MOET_EINVAL (bad
 * option or MOET_URING_FAULT), MOET_EUNSUP (io_uring unavailable: the detail says why, e.g.
 * kernel.io_uring_disabled), MOET_ENOMEM.
 */
int moet_uring_create(const moet_uring_opts *o, moet_uring **out);

/* Waits for requests in flight (their callbacks do not run), closes the files, frees.
 * Accepts NULL. */
void moet_uring_destroy(moet_uring *u);

/* Opens path for reading (O_DIRECT per the reader's mode, checked by a probe read).
 * *out_file gets its id. Errors: MOET_EIO / MOET_ENOTFOUND naming the path, MOET_EUNSUP
 * (DIRECT_ON and the filesystem refuses O_DIRECT), MOET_ERANGE (too many files). */
int moet_uring_open(moet_uring *u, const char *path, int *out_file);

/* 1 if file is read with O_DIRECT, 0 if buffered. */
int moet_uring_file_direct(const moet_uring *u, int file);
/* Size of the file in bytes (at open). */
uint64_t moet_uring_file_bytes(const moet_uring *u, int file);
/* Path of the file as given to open. Borrowed. */
const char *moet_uring_file_path(const moet_uring *u, int file);

/*
 * Registers n buffers [bufs[i], bufs[i] + bytes[i]) with the ring (fixed buffers: the kernel
 * pins them once instead of per request). Replaces an earlier registration; wait for requests
 * in flight first (moet_uring_drain). When the kernel refuses (RLIMIT_MEMLOCK for a user
 * without CAP_IPC_LOCK, a buffer over 1 GiB, too many), reads go unregistered and the reason
 * is in moet_uring_note: that is not an error. Errors: MOET_EINVAL, MOET_ENOMEM.
 */
int moet_uring_register(moet_uring *u, void *const *bufs, const size_t *bytes, int n);

/*
 * A table of n registered-buffer places, all empty, each filled later by
 * moet_uring_register_one: so that pinning a buffer (every page faulted in) overlaps with
 * reads into buffers already registered. Replaces an earlier registration (wait for requests
 * in flight first). A refusal of the kernel is noted, not an error: reads go unregistered.
 * Errors: MOET_EINVAL, MOET_ENOMEM.
 */
int moet_uring_register_sparse(moet_uring *u, int n);

/* Fills place i (< n of moet_uring_register_sparse) with [buf, buf + bytes). A refusal is
 * noted and reads into it go unregistered. Errors: MOET_EINVAL (no such place). */
int moet_uring_register_one(moet_uring *u, int i, void *buf, size_t bytes);

/* 1 when buffers are registered. */
int moet_uring_registered(const moet_uring *u);

/* Why a file is read buffered or buffers are not registered, in words; "" if neither. */
const char *moet_uring_note(const moet_uring *u);

/*
 * Queues n ranges and submits what the queue depth allows; returns at once. fn(ctx, done) is
 * called once per range when it completes or fails, from a later poll/drain/read (fn may be
 * NULL). The ranges array is copied. Errors (nothing queued): MOET_EINVAL naming the bad
 * range (unknown file, zero length, unaligned buf, past the end of the file), MOET_ENOMEM.
 */
int moet_uring_submit(moet_uring *u, const moet_uring_range *r, size_t n,
		      moet_uring_done_fn fn, void *ctx);

/*
 * Reaps completions, retries short reads, submits queued requests, runs callbacks. wait != 0
 * blocks until at least one range finishes (when any is pending). Returns the number of
 * ranges finished by this call (>= 0), or a negative code when the ring itself failed.
 */
int moet_uring_poll(moet_uring *u, int wait);

/* Ranges submitted and not finished. */
size_t moet_uring_pending(const moet_uring *u);

/*
 * Polls until nothing is pending. Returns 0, or the code of the first range that failed since
 * the last drain/read (detail: "PATH: read of N bytes at offset O failed: errno text").
 */
int moet_uring_drain(moet_uring *u);

/* submit + drain: reads the ranges, fn called per range as it completes. Returns 0 or the
 * first failure's code and detail (ranges that did complete have had their callbacks). */
int moet_uring_read(moet_uring *u, const moet_uring_range *r, size_t n, moet_uring_done_fn fn,
		    void *ctx);

/* ---- where a checkpoint's mapped bytes are in its files -------------------------------- */

struct moet_ckpt;

/* One shard: its data buffer in the mapping and in the file. */
typedef struct moet_uring_shard_map {
	const uint8_t *base;   /* mapping address of the data buffer's first byte (the shard's
				  lowest tensor pointer); NULL: a shard without tensors */
	uint64_t data_start;   /* that byte's file offset: 8 + the header length */
	uint64_t data_bytes;   /* bytes of the data buffer */
} moet_uring_shard_map;

/*
 * out[moet_ckpt_shard_count(ck)] for every shard of ck: the header length is read from the
 * file's first 8 bytes (the mapping is never touched, so tensor bytes do not enter the page
 * cache through it). Errors: MOET_EIO naming the shard.
 */
int moet_uring_shard_maps(const struct moet_ckpt *ck, moet_uring_shard_map *out);

/* The shard and file offset of the mapped bytes [p, p + n_bytes). Returns 0, or MOET_ERANGE
 * when they are not inside one shard's data buffer (not the checkpoint's bytes). */
int moet_uring_locate(const moet_uring_shard_map *maps, int n_shards, const void *p,
		      size_t n_bytes, int *out_shard, uint64_t *out_offset);

/* ---- faults (tests) ---------------------------------------------------------------------- */

enum {
	MOET_URING_FAULT_SHORT = 1,  /* the request returns about half its bytes (then retried) */
	MOET_URING_FAULT_EIO = 2,    /* the request fails with EIO */
	MOET_URING_FAULT_ENOSPC = 3, /* the request fails with ENOSPC */
};

/* Makes the nth request submitted from now on (1 = the next) complete with fault `kind`
 * (the real read still runs; its result is replaced). Up to 16 pending faults. Errors:
 * MOET_EINVAL, MOET_ERANGE (too many). */
int moet_uring_fault(moet_uring *u, uint64_t nth, int kind);

/* ---- counters ---------------------------------------------------------------------------- */

typedef struct moet_uring_stats {
	uint64_t ranges;       /* finished ranges (ok or failed) */
	uint64_t failed;       /* ranges that failed */
	uint64_t requests;     /* requests submitted (retries included) */
	uint64_t retries;      /* resubmissions after a short read or EAGAIN/EINTR */
	uint64_t bytes_read;   /* bytes the kernel returned (aligned covers included) */
	uint64_t bytes_wanted; /* exact bytes of the ranges that completed */
	unsigned max_in_flight;
} moet_uring_stats;

void moet_uring_stats_get(const moet_uring *u, moet_uring_stats *out);

#endif
