/*
 * moet_npy.h: NumPy .npy files, the exchange format of reference logits (tests/oracle) and of
 * logits dumped by the CLI.
 *
 *   offset 0   "\x93NUMPY" major minor        6 + 2 bytes
 *          8   header length HLEN             u16 LE (version 1.0) or u32 LE (2.0, 3.0)
 *   10 or 12   header: a Python dict literal, ASCII, padded with spaces, ending in '\n'
 *                {'descr': '<f8', 'fortran_order': False, 'shape': (48, 384), }
 *   aligned    data: numel x itemsize bytes, C order, nothing after it
 *
 * Writing: version 1.0, the header padded so that the data starts at a multiple of 64 bytes
 * (as numpy itself writes), dtypes '<f4', '<f8' and '<i8'.
 * Reading: versions 1.0, 2.0 and 3.0; dtypes '<f4', '<f8', '<i8' (little-endian), C order.
 * Everything else -- fortran_order True, another dtype, a malformed or oversized header, a
 * data section of the wrong length -- is refused with a one-line error naming the file.
 *
 * NOTE: the header is parsed as the small grammar numpy writes (a dict of exactly the three
 * keys, string / bool / tuple-of-int values, optional trailing commas), not as Python: no
 * eval, no escapes, no nested structures.
 */
#ifndef MOET_NPY_H
#define MOET_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "moet_dtype.h"

#define MOET_NPY_MAX_DIMS 16
#define MOET_NPY_MAX_HEADER_BYTES (1u << 20)

typedef struct moet_npy {
	moet_dtype dtype;                 /* MOET_DT_F32, MOET_DT_F64 or MOET_DT_I64 */
	int ndim;                         /* 0 for a scalar */
	int64_t shape[MOET_NPY_MAX_DIMS];
	int64_t numel;                    /* product of shape (1 for a scalar) */
	size_t n_bytes;                   /* numel x element size */
	void *data;                       /* owned (malloc); C order, host byte order */
} moet_npy;

/*
 * Writes `data` (numel x element size bytes, C order) as PATH. dtype: MOET_DT_F32, F64 or I64;
 * 0 <= ndim <= MOET_NPY_MAX_DIMS; shape entries >= 0. Returns 0, or MOET_EINVAL (arguments),
 * MOET_EIO (create/write failed; a partial file is removed) with the detail naming PATH.
 */
int moet_npy_write(const char *path, moet_dtype dtype, int ndim, const int64_t *shape,
		   const void *data);

/*
 * Reads PATH into *out (which the caller releases with moet_npy_free). Returns 0, or
 * MOET_EIO (open/read), MOET_EFORMAT (not a valid .npy: magic, version, header syntax, data
 * length), MOET_EUNSUP (valid but unsupported: fortran_order, dtype), MOET_ENOMEM; the
 * detail names PATH and the problem. On error *out is left empty (data NULL).
 */
int moet_npy_read(const char *path, moet_npy *out);

/*
 * Like moet_npy_read over a file image already in memory (n bytes at buf); `label` names it
 * in errors. The data is copied into *out. For tests and fuzzing.
 */
int moet_npy_parse(const char *label, const void *buf, size_t n, moet_npy *out);

/* Frees out->data and empties *a. Accepts NULL and an empty struct. */
void moet_npy_free(moet_npy *a);

#endif
