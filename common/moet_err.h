/*
 * moet_err.h: error codes and the per-thread error detail.
 *
 * Every library function returns int: 0 on success or a negative MOET_E* code. The code says
 * what kind of failure it was; the detail string says where (file, tensor, field, line) and
 * why, in one line, ready to print after "moet-hybrid: ".
 *
 * NOTE: the detail lives in thread-local storage, like errno and dlerror(): passing an error
 * buffer through every call would burden every signature for the one caller (main, or a
 * request handler) that prints it. The thread that got the error code reads the detail before
 * it makes another library call. This is the one piece of mutable state outside handles.
 */
#ifndef MOET_ERR_H
#define MOET_ERR_H

#include <stddef.h>

enum {
	MOET_OK = 0,
	MOET_EINVAL = -1,   /* bad argument or malformed input (file content, config field) */
	MOET_ENOMEM = -2,   /* allocation failed */
	MOET_EIO = -3,      /* open/read/write/mmap/stat failed */
	MOET_ENOTFOUND = -4,/* a tensor, file or field that must exist does not */
	MOET_EFORMAT = -5,  /* a file violates its format (safetensors, JSON, npy) */
	MOET_ESHAPE = -6,   /* a tensor's shape or dtype disagrees with config.json */
	MOET_EUNSUP = -7,   /* valid input that this build does not support */
	MOET_EDEVICE = -8,  /* a GPU or CUDA failure */
	MOET_ERANGE = -9,   /* a value out of its allowed range */
};

/* Short name of a code ("EINVAL", ...). Never NULL. */
const char *moet_strerror(int code);

/* Record the detail for the calling thread (printf format) and return `code`, so that a
 * failing path reads `return moet_err(MOET_EFORMAT, "%s: header length %llu ...", ...);`. */
int moet_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the calling thread's current detail with "prefix: " (e.g. the file name) and return
 * `code`. Used when a callee knows the problem but not the context. */
int moet_err_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last detail ("" if none). Valid until the next moet_err* call on
 * the same thread. */
const char *moet_errmsg(void);

/* Forget the calling thread's detail. */
void moet_err_clear(void);

#endif
