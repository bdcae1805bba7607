/*
 * moet_upload.h: host byte ranges (e.g. the checkpoint's mapped expert bytes) to device memory
 * through pinned staging buffers filled by several threads, transfers overlapped with the
 * reads (runtime/upload.c). For the hot experts' upload at start.
 */
#ifndef MOET_UPLOAD_H
#define MOET_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct moet_upload_item {
	const void *src; /* host bytes (any memory: mapped files included) */
	void *dst;       /* device memory */
	size_t bytes;
} moet_upload_item;

typedef struct moet_upload_stats {
	size_t bytes;
	double seconds;  /* wall time of the call */
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

#endif
