/*
 * npy.c: NumPy .npy reader and writer (see moet_npy.h for the format and the contract).
 *
 * Reading goes in three steps, each of which can only shrink what the next one trusts:
 *   1. the fixed prefix: magic, version, header length (bounded by MOET_NPY_MAX_HEADER_BYTES
 *      and by the file size);
 *   2. the header dict: a hand-written scanner over the grammar numpy writes (below), giving
 *      dtype, shape and the element count, with every multiplication checked for overflow;
 *   3. the data: exactly numel x itemsize bytes must follow the header.
 *
 *   dict   := '{' ws [ item ws ( ',' ws item ws )* [ ',' ws ] ] '}' ws-to-end
 *   item   := string ws ':' ws value
 *   value  := string | 'True' | 'False' | tuple
 *   tuple  := '(' ws ')' | '(' ws int ws ',' ws ')' | '(' ws int ws ( ',' ws int ws )+ [','] ws ')'
 *   string := "'" chars "'" | '"' chars '"'     (no backslashes, at most 63 chars)
 *
 * NOTE: '(5)' is refused: in Python it is the integer 5, not a tuple, and numpy refuses it
 * too. Data are stored and returned in host byte order, which must be little-endian.
 */
#include "moet_npy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_BYTES 6
#define NPY_ALIGN 64
#define NPY_STR_BYTES 64

/* ---- header scanner ------------------------------------------------------------------- */

typedef struct scan {
	const char *label; /* file name for errors */
	const char *p;     /* cursor */
	const char *end;
} scan;

static void skip_ws(scan *s)
{
	while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
		s->p++;
}

static bool eat(scan *s, char c)
{
	skip_ws(s);
	if (s->p < s->end && *s->p == c) {
		s->p++;
		return true;
	}
	return false;
}

static int bad(const scan *s, const char *what)
{
	return moet_err(MOET_EFORMAT, "%s: npy header: %s", s->label, what);
}

static int scan_string(scan *s, char *out)
{
	skip_ws(s);
	if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
		return bad(s, "expected a quoted string");
	char q = *s->p++;
	size_t n = 0;
	while (s->p < s->end && *s->p != q) {
		unsigned char c = (unsigned char)*s->p;
		if (c == '\\' || c < 0x20 || c > 0x7E)
			return bad(s, "string with an escape or a non-printable character");
		if (n + 1 >= NPY_STR_BYTES)
			return bad(s, "string too long");
		out[n++] = (char)c;
		s->p++;
	}
	if (s->p >= s->end)
		return bad(s, "unterminated string");
	s->p++;
	out[n] = '\0';
	return 0;
}

static int scan_int(scan *s, int64_t *out)
{
	skip_ws(s);
	int64_t v = 0;
	const char *start = s->p;
	while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
		int d = *s->p - '0';
		if (v > (INT64_MAX - d) / 10)
			return bad(s, "shape entry too large");
		v = v * 10 + d;
		s->p++;
	}
	if (s->p == start)
		return bad(s, "shape entry is not a non-negative integer");
	*out = v;
	return 0;
}

static int scan_shape(scan *s, moet_npy *a)
{
	int rc;
	if (!eat(s, '('))
		return bad(s, "shape is not a tuple");
	a->ndim = 0;
	if (eat(s, ')'))
		return 0;
	for (;;) {
		if (a->ndim == MOET_NPY_MAX_DIMS)
			return moet_err(MOET_EUNSUP, "%s: npy header: more than %d dimensions",
					s->label, MOET_NPY_MAX_DIMS);
		if ((rc = scan_int(s, &a->shape[a->ndim])))
			return rc;
		a->ndim++;
		bool comma = eat(s, ',');
		if (eat(s, ')')) {
			if (a->ndim == 1 && !comma)
				return bad(s, "shape '(n)' is an integer, not a tuple (write '(n,)')");
			return 0;
		}
		if (!comma)
			return bad(s, "expected ',' or ')' in shape");
	}
}

static int scan_bool(scan *s, bool *out)
{
	skip_ws(s);
	size_t left = (size_t)(s->end - s->p);
	if (left >= 4 && memcmp(s->p, "True", 4) == 0) {
		s->p += 4;
		*out = true;
		return 0;
	}
	if (left >= 5 && memcmp(s->p, "False", 5) == 0) {
		s->p += 5;
		*out = false;
		return 0;
	}
	return bad(s, "fortran_order is not True or False");
}

/* Parses the header dict text [h, h+n) into a's dtype, ndim, shape, numel and n_bytes. */
static int parse_header(const char *label, const char *h, size_t n, moet_npy *a)
{
	scan s = { .label = label, .p = h, .end = h + n };
	char key[NPY_STR_BYTES], descr[NPY_STR_BYTES] = "";
	bool have_descr = false, have_fortran = false, have_shape = false, fortran = false;
	int rc;

	if (!eat(&s, '{'))
		return bad(&s, "does not start with '{'");
	while (!eat(&s, '}')) {
		if ((rc = scan_string(&s, key)))
			return rc;
		if (!eat(&s, ':'))
			return bad(&s, "expected ':' after a key");
		if (strcmp(key, "descr") == 0 && !have_descr) {
			skip_ws(&s);
			if (s.p < s.end && *s.p == '[')
				return moet_err(MOET_EUNSUP, "%s: npy structured dtype is not supported",
						label);
			if ((rc = scan_string(&s, descr)))
				return rc;
			have_descr = true;
		} else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
			if ((rc = scan_bool(&s, &fortran)))
				return rc;
			have_fortran = true;
		} else if (strcmp(key, "shape") == 0 && !have_shape) {
			if ((rc = scan_shape(&s, a)))
				return rc;
			have_shape = true;
		} else {
			return moet_err(MOET_EFORMAT, "%s: npy header: unexpected or repeated key '%s'",
					label, key);
		}
		if (!eat(&s, ',')) {
			if (!eat(&s, '}'))
				return bad(&s, "expected ',' or '}' after a value");
			break;
		}
	}
	skip_ws(&s);
	if (s.p != s.end)
		return bad(&s, "text after the closing '}'");
	if (!have_descr || !have_fortran || !have_shape)
		return moet_err(MOET_EFORMAT, "%s: npy header lacks key '%s'", label,
				!have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
	if (fortran)
		return moet_err(MOET_EUNSUP, "%s: npy fortran_order True is not supported (C order "
				"only)", label);
	if (strcmp(descr, "<f4") == 0)
		a->dtype = MOET_DT_F32;
	else if (strcmp(descr, "<f8") == 0)
		a->dtype = MOET_DT_F64;
	else if (strcmp(descr, "<i8") == 0)
		a->dtype = MOET_DT_I64;
	else
		return moet_err(MOET_EUNSUP, "%s: npy dtype '%s' is not supported (<f4, <f8, <i8)",
				label, descr);

	size_t isz = moet_dtype_size(a->dtype);
	int64_t numel = 1;
	for (int i = 0; i < a->ndim; i++) {
		int64_t d = a->shape[i];
		if (d != 0 && numel > (int64_t)(SIZE_MAX / isz) / d)
			return moet_err(MOET_EFORMAT, "%s: npy shape overflows the address space",
					label);
		numel *= d;
	}
	a->numel = numel;
	a->n_bytes = (size_t)numel * isz;
	return 0;
}

/*
 * The fixed prefix of the first n bytes of pre: sets *hdr_off (where the header text
 * starts) and *hlen. Needs at most 12 bytes.
 */
static int parse_prefix(const char *label, const unsigned char *pre, size_t n, size_t *hdr_off,
			size_t *hlen)
{
	if (n < 10 || memcmp(pre, NPY_MAGIC, NPY_MAGIC_BYTES) != 0)
		return moet_err(MOET_EFORMAT, "%s: not a .npy file (bad magic or too short)", label);
	unsigned major = pre[6], minor = pre[7];
	if (major == 1 && minor == 0) {
		*hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
		*hdr_off = 10;
	} else if ((major == 2 || major == 3) && minor == 0) {
		if (n < 12)
			return moet_err(MOET_EFORMAT, "%s: npy file truncated in its prefix", label);
		*hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
			(size_t)pre[11] << 24;
		*hdr_off = 12;
	} else {
		return moet_err(MOET_EFORMAT, "%s: npy format version %u.%u is not 1.0, 2.0 or 3.0",
				label, major, minor);
	}
	if (*hlen > MOET_NPY_MAX_HEADER_BYTES)
		return moet_err(MOET_EFORMAT, "%s: npy header length %zu exceeds %u", label, *hlen,
				MOET_NPY_MAX_HEADER_BYTES);
	return 0;
}

/* ---- public ---------------------------------------------------------------------------- */

void moet_npy_free(moet_npy *a)
{
	if (!a)
		return;
	free(a->data);
	memset(a, 0, sizeof(*a));
}

int moet_npy_parse(const char *label, const void *buf, size_t n, moet_npy *out)
{
	const unsigned char *b = buf;
	size_t off, hlen;
	int rc;
	memset(out, 0, sizeof(*out));
	if ((rc = parse_prefix(label, b, n, &off, &hlen)))
		return rc;
	if (hlen > n - off)
		return moet_err(MOET_EFORMAT, "%s: npy header length %zu runs past the end of the "
				"file (%zu bytes)", label, hlen, n);
	moet_npy a = { 0 };
	if ((rc = parse_header(label, (const char *)b + off, hlen, &a)))
		return rc;
	size_t data_bytes = n - off - hlen;
	if (data_bytes != a.n_bytes)
		return moet_err(MOET_EFORMAT, "%s: npy data is %zu bytes, shape and dtype need %zu",
				label, data_bytes, a.n_bytes);
	a.data = malloc(a.n_bytes ? a.n_bytes : 1);
	if (!a.data)
		return moet_err(MOET_ENOMEM, "%s: npy: out of memory for %zu bytes", label,
				a.n_bytes);
	memcpy(a.data, b + off + hlen, a.n_bytes);
	*out = a;
	return 0;
}

int moet_npy_read(const char *path, moet_npy *out)
{
	unsigned char pre[12];
	char *hdr = NULL;
	moet_npy a = { 0 };
	size_t off, hlen;
	int rc;
	memset(out, 0, sizeof(*out));
	FILE *f = fopen(path, "rb");
	if (!f)
		return moet_err(MOET_EIO, "%s: cannot open: %s", path, strerror(errno));
	if (fseeko(f, 0, SEEK_END) != 0) {
		rc = moet_err(MOET_EIO, "%s: cannot seek: %s", path, strerror(errno));
		goto fail;
	}
	off_t fsize = ftello(f);
	if (fsize < 0 || fseeko(f, 0, SEEK_SET) != 0) {
		rc = moet_err(MOET_EIO, "%s: cannot seek: %s", path, strerror(errno));
		goto fail;
	}
	size_t n_pre = fread(pre, 1, sizeof(pre), f);
	if ((rc = parse_prefix(path, pre, n_pre, &off, &hlen)))
		goto fail;
	if ((uint64_t)fsize < off || hlen > (uint64_t)fsize - off) {
		rc = moet_err(MOET_EFORMAT, "%s: npy header length %zu runs past the end of the "
			      "file (%lld bytes)", path, hlen, (long long)fsize);
		goto fail;
	}
	hdr = malloc(hlen ? hlen : 1);
	if (!hdr) {
		rc = moet_err(MOET_ENOMEM, "%s: npy: out of memory", path);
		goto fail;
	}
	if (fseeko(f, (off_t)off, SEEK_SET) != 0 || fread(hdr, 1, hlen, f) != hlen) {
		rc = moet_err(MOET_EIO, "%s: read failed in the npy header", path);
		goto fail;
	}
	if ((rc = parse_header(path, hdr, hlen, &a)))
		goto fail;
	uint64_t data_bytes = (uint64_t)fsize - off - hlen;
	if (data_bytes != a.n_bytes) {
		rc = moet_err(MOET_EFORMAT, "%s: npy data is %llu bytes, shape and dtype need %zu",
			      path, (unsigned long long)data_bytes, a.n_bytes);
		goto fail;
	}
	a.data = malloc(a.n_bytes ? a.n_bytes : 1);
	if (!a.data) {
		rc = moet_err(MOET_ENOMEM, "%s: npy: out of memory for %zu bytes", path, a.n_bytes);
		goto fail;
	}
	if (fread(a.data, 1, a.n_bytes, f) != a.n_bytes) {
		rc = moet_err(MOET_EIO, "%s: read failed in the npy data", path);
		goto fail;
	}
	free(hdr);
	fclose(f);
	*out = a;
	return 0;
fail:
	free(a.data);
	free(hdr);
	fclose(f);
	return rc;
}

int moet_npy_write(const char *path, moet_dtype dtype, int ndim, const int64_t *shape,
		   const void *data)
{
	const char *descr = dtype == MOET_DT_F32 ? "<f4" : dtype == MOET_DT_F64 ? "<f8"
			  : dtype == MOET_DT_I64 ? "<i8" : NULL;
	if (!descr)
		return moet_err(MOET_EINVAL, "%s: npy write: dtype %s is not F32, F64 or I64", path,
				moet_dtype_name(dtype));
	if (ndim < 0 || ndim > MOET_NPY_MAX_DIMS || (ndim > 0 && !shape))
		return moet_err(MOET_EINVAL, "%s: npy write: ndim %d out of [0, %d]", path, ndim,
				MOET_NPY_MAX_DIMS);
	size_t isz = moet_dtype_size(dtype);
	int64_t numel = 1;
	char dims[MOET_NPY_MAX_DIMS * 22 + 4] = "";
	size_t dl = 0;
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0 || (shape[i] && numel > (int64_t)(SIZE_MAX / isz) / shape[i]))
			return moet_err(MOET_EINVAL, "%s: npy write: bad shape entry %lld", path,
					(long long)shape[i]);
		numel *= shape[i];
		dl += (size_t)snprintf(dims + dl, sizeof(dims) - dl, "%s%lld", i ? ", " : "",
				       (long long)shape[i]);
	}
	if (ndim == 1)
		dl += (size_t)snprintf(dims + dl, sizeof(dims) - dl, ",");
	size_t n_bytes = (size_t)numel * isz;
	if (n_bytes && !data)
		return moet_err(MOET_EINVAL, "%s: npy write: data is NULL", path);

	/* 10-byte prefix + dict + spaces + '\n', a multiple of NPY_ALIGN in all. */
	char hdr[sizeof(dims) + 128 + NPY_ALIGN];
	int hl = snprintf(hdr, sizeof(hdr), "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
			  descr, dims);
	size_t total = 10 + (size_t)hl + 1;
	size_t pad = (NPY_ALIGN - total % NPY_ALIGN) % NPY_ALIGN;
	memset(hdr + hl, ' ', pad);
	hdr[(size_t)hl + pad] = '\n';
	size_t hlen = (size_t)hl + pad + 1;
	unsigned char pre[10];
	memcpy(pre, NPY_MAGIC, NPY_MAGIC_BYTES);
	pre[6] = 1;
	pre[7] = 0;
	pre[8] = (unsigned char)(hlen & 0xFF);
	pre[9] = (unsigned char)(hlen >> 8);

	FILE *f = fopen(path, "wb");
	if (!f)
		return moet_err(MOET_EIO, "%s: cannot create: %s", path, strerror(errno));
	bool ok = fwrite(pre, 1, sizeof(pre), f) == sizeof(pre) &&
		  fwrite(hdr, 1, hlen, f) == hlen &&
		  (n_bytes == 0 || fwrite(data, 1, n_bytes, f) == n_bytes);
	int err = errno;
	if (fclose(f) != 0 && ok) {
		ok = false;
		err = errno;
	}
	if (!ok) {
		remove(path);
		return moet_err(MOET_EIO, "%s: write failed: %s", path, strerror(err));
	}
	return 0;
}
