/*
 * test_npy.c: the .npy reader and writer (runtime/moet_npy.h).
 *
 *   1. round trips of every supported dtype and of scalar, 1-D, empty and 4-D shapes, with
 *      the file's own bytes checked against the format (magic, version 1.0, data offset a
 *      multiple of 64, header ending in '\n');
 *   2. malformed and unsupported files: each is refused with the right code and a one-line
 *      message naming the file, never a crash (run under the sanitizer build too);
 *   3. interoperability with numpy's own implementation, when python3 with numpy is present
 *      (else that part is skipped and says so): numpy reads our files, we read numpy's.
 */
#include <stdint.h>
#include <string.h>

#include "moet_err.h"
#include "moet_npy.h"
#include "moet_test.h"

static char *g_dir;

static void path_of(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", g_dir, name);
}

static void round_trip(const char *name, moet_dtype dt, int ndim, const int64_t *shape)
{
	char path[1024];
	path_of(path, sizeof(path), name);
	size_t isz = moet_dtype_size(dt);
	int64_t numel = 1;
	for (int i = 0; i < ndim; i++)
		numel *= shape[i];
	unsigned char *src = malloc((size_t)numel * isz + 1);
	/* Values that are exact in every dtype and distinguish every element and byte. */
	for (int64_t i = 0; i < numel; i++) {
		if (dt == MOET_DT_F32) {
			float v = (float)i * 0.5f - 3.25f;
			memcpy(src + i * 4, &v, 4);
		} else if (dt == MOET_DT_F64) {
			double v = (double)i * 0.1 - 1e300 * (i % 3 == 2);
			memcpy(src + i * 8, &v, 8);
		} else {
			int64_t v = (i * 0x9E3779B97F4A7C15ll) ^ -i;
			memcpy(src + i * 8, &v, 8);
		}
	}
	int rc = moet_npy_write(path, dt, ndim, shape, src);
	CHECK(rc == 0, "%s: write: %s", name, moet_errmsg());

	size_t n = 0;
	unsigned char *b = moet_test_read_file(path, &n);
	CHECK(b != NULL, "%s: cannot read back", name);
	if (b) {
		CHECK(n >= 10 && memcmp(b, "\x93NUMPY\x01\x00", 8) == 0, "%s: magic/version", name);
		size_t hlen = (size_t)b[8] | (size_t)b[9] << 8;
		CHECK((10 + hlen) % 64 == 0, "%s: data offset %zu not a multiple of 64", name,
		      10 + hlen);
		CHECK(b[10 + hlen - 1] == '\n', "%s: header does not end in a newline", name);
		CHECK(n == 10 + hlen + (size_t)numel * isz, "%s: file size %zu", name, n);
		CHECK(memcmp(b + 10 + hlen, src, (size_t)numel * isz) == 0, "%s: data bytes", name);
	}
	free(b);

	moet_npy a;
	rc = moet_npy_read(path, &a);
	CHECK(rc == 0, "%s: read: %s", name, moet_errmsg());
	if (rc == 0) {
		CHECK(a.dtype == dt && a.ndim == ndim && a.numel == numel, "%s: header fields", name);
		for (int i = 0; i < ndim && i < a.ndim; i++)
			CHECK(a.shape[i] == shape[i], "%s: shape[%d]", name, i);
		CHECK(a.n_bytes == (size_t)numel * isz, "%s: n_bytes", name);
		CHECK(memcmp(a.data, src, a.n_bytes) == 0, "%s: data differ", name);
	}
	moet_npy_free(&a);
	free(src);
}

/* Writes a file of: prefix (version 1.0) + header (padded to 64) + n_data bytes of 0x3F. */
static void write_raw(const char *path, const char *header, size_t n_data)
{
	size_t hl = strlen(header);
	size_t hlen = hl + 1 + (64 - (10 + hl + 1) % 64) % 64;
	size_t n = 10 + hlen + n_data;
	unsigned char *b = malloc(n);
	memcpy(b, "\x93NUMPY\x01\x00", 8);
	b[8] = (unsigned char)(hlen & 0xFF);
	b[9] = (unsigned char)(hlen >> 8);
	memcpy(b + 10, header, hl);
	memset(b + 10 + hl, ' ', hlen - hl - 1);
	b[10 + hlen - 1] = '\n';
	memset(b + 10 + hlen, 0x3F, n_data);
	moet_test_write_file(path, b, n);
	free(b);
}

/* The file must be refused with `code`, a one-line message naming it, containing `frag`. */
static void expect_refused(const char *name, int code, const char *frag)
{
	char path[1024];
	path_of(path, sizeof(path), name);
	moet_npy a;
	moet_err_clear();
	int rc = moet_npy_read(path, &a);
	const char *msg = moet_errmsg();
	CHECK(rc == code, "%s: code %d (%s), expected %s: %s", name, rc, moet_strerror(rc),
	      moet_strerror(code), msg);
	CHECK(strstr(msg, path) != NULL, "%s: message does not name the file: %s", name, msg);
	CHECK(strchr(msg, '\n') == NULL, "%s: message is not one line: %s", name, msg);
	CHECK(!frag || strstr(msg, frag), "%s: message lacks '%s': %s", name, frag, msg);
	CHECK(a.data == NULL && rc != 0, "%s: output not left empty", name);
	moet_npy_free(&a);

	/* The in-memory parser must agree. */
	size_t n = 0;
	unsigned char *b = moet_test_read_file(path, &n);
	if (b) {
		int rc2 = moet_npy_parse(path, b, n, &a);
		CHECK(rc2 == rc, "%s: parse gives %d, read gave %d", name, rc2, rc);
		moet_npy_free(&a);
		free(b);
	}
}

static void bad_header(const char *name, const char *header, size_t n_data, int code,
		       const char *frag)
{
	char path[1024];
	path_of(path, sizeof(path), name);
	write_raw(path, header, n_data);
	expect_refused(name, code, frag);
}

static void malformed(void)
{
	char path[1024];
	/* A correct raw file first, so that the cases below differ from it in one thing. */
	moet_npy a;
	path_of(path, sizeof(path), "ok.npy");
	write_raw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
	CHECK(moet_npy_read(path, &a) == 0 && a.numel == 6, "raw ok.npy: %s", moet_errmsg());
	moet_npy_free(&a);

	const char *h = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
	bad_header("short-data.npy", h, 15, MOET_EFORMAT, "data is 15 bytes");
	bad_header("long-data.npy", h, 17, MOET_EFORMAT, "data is 17 bytes");
	bad_header("fortran.npy", "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2), }", 32,
		   MOET_EUNSUP, "fortran_order");
	bad_header("dtype-i4.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8,
		   MOET_EUNSUP, "'<i4'");
	bad_header("dtype-be.npy", "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", 16,
		   MOET_EUNSUP, "'>f8'");
	bad_header("struct.npy", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
		   8, MOET_EUNSUP, "structured");
	bad_header("no-shape.npy", "{'descr': '<f8', 'fortran_order': False, }", 8, MOET_EFORMAT,
		   "'shape'");
	bad_header("extra-key.npy",
		   "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), 'x': 1, }", 8,
		   MOET_EFORMAT, "'x'");
	bad_header("dup-key.npy",
		   "{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", 8,
		   MOET_EFORMAT, "repeated");
	bad_header("neg-shape.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (-1,), }", 8,
		   MOET_EFORMAT, "shape");
	bad_header("int-shape.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2), }", 16,
		   MOET_EFORMAT, "tuple");
	bad_header("float-shape.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2.0,), }",
		   16, MOET_EFORMAT, "shape");
	bad_header("huge-shape.npy", "{'descr': '<f8', 'fortran_order': False, "
		   "'shape': (4294967296, 4294967296), }", 0, MOET_EFORMAT, "overflow");
	bad_header("big-int.npy", "{'descr': '<f8', 'fortran_order': False, "
		   "'shape': (99999999999999999999,), }", 0, MOET_EFORMAT, "too large");
	bad_header("not-dict.npy", "['descr', '<f8']", 8, MOET_EFORMAT, "'{'");
	bad_header("unterminated.npy", "{'descr': '<f8, 'fortran_order': False, 'shape': (1,)}", 8,
		   MOET_EFORMAT, NULL);
	bad_header("no-close.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), ", 8,
		   MOET_EFORMAT, NULL);
	bad_header("trailing.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)} x", 8,
		   MOET_EFORMAT, "after");
	bad_header("bool.npy", "{'descr': '<f8', 'fortran_order': 0, 'shape': (1,)}", 8,
		   MOET_EFORMAT, "True or False");
	bad_header("escape.npy", "{'descr': '<f\\8', 'fortran_order': False, 'shape': (1,)}", 8,
		   MOET_EFORMAT, "escape");

	/* Prefix defects. */
	unsigned char b[64];
	memcpy(b, "\x93NUMPX\x01\x00\x10\x00", 10);
	path_of(path, sizeof(path), "magic.npy");
	moet_test_write_file(path, b, 10);
	expect_refused("magic.npy", MOET_EFORMAT, "magic");
	path_of(path, sizeof(path), "tiny.npy");
	moet_test_write_file(path, "\x93NUM", 4);
	expect_refused("tiny.npy", MOET_EFORMAT, "too short");
	path_of(path, sizeof(path), "empty.npy");
	moet_test_write_file(path, "", 0);
	expect_refused("empty.npy", MOET_EFORMAT, NULL);
	memcpy(b, "\x93NUMPY\x04\x00\x10\x00", 10);
	path_of(path, sizeof(path), "version.npy");
	moet_test_write_file(path, b, 10);
	expect_refused("version.npy", MOET_EFORMAT, "version 4.0");
	memcpy(b, "\x93NUMPY\x01\x00\xF0\x00", 10);
	memset(b + 10, ' ', 20);
	path_of(path, sizeof(path), "hlen.npy");
	moet_test_write_file(path, b, 30);
	expect_refused("hlen.npy", MOET_EFORMAT, "past the end");
	memcpy(b, "\x93NUMPY\x02\x00\xFF\xFF\xFF\x7F", 12);
	path_of(path, sizeof(path), "hlen2.npy");
	moet_test_write_file(path, b, 12);
	expect_refused("hlen2.npy", MOET_EFORMAT, "exceeds");
	path_of(path, sizeof(path), "absent.npy");
	expect_refused("absent.npy", MOET_EIO, "cannot open");

	/* Every truncation of a valid file is refused cleanly. */
	int64_t shape[2] = { 3, 5 };
	float v[15] = { 0 };
	path_of(path, sizeof(path), "whole.npy");
	CHECK(moet_npy_write(path, MOET_DT_F32, 2, shape, v) == 0, "%s", moet_errmsg());
	size_t n = 0;
	unsigned char *whole = moet_test_read_file(path, &n);
	for (size_t cut = 0; whole && cut < n; cut++) {
		moet_npy t;
		int rc = moet_npy_parse("cut.npy", whole, cut, &t);
		CHECK(rc == MOET_EFORMAT && t.data == NULL, "truncated at %zu: rc %d", cut, rc);
		moet_npy_free(&t);
	}
	free(whole);

	/* Writer argument checks. */
	path_of(path, sizeof(path), "w.npy");
	CHECK(moet_npy_write(path, MOET_DT_BF16, 1, shape, v) == MOET_EINVAL, "bf16 accepted");
	CHECK(moet_npy_write(path, MOET_DT_F32, MOET_NPY_MAX_DIMS + 1, shape, v) == MOET_EINVAL,
	      "too many dims accepted");
	int64_t neg[1] = { -2 };
	CHECK(moet_npy_write(path, MOET_DT_F32, 1, neg, v) == MOET_EINVAL, "negative dim accepted");
	CHECK(moet_npy_write("/nonexistent-dir/x.npy", MOET_DT_F32, 1, shape, v) == MOET_EIO,
	      "write to a missing folder succeeded");
}

/* numpy's own implementation, when present. */
static void with_numpy(void)
{
	char cmd[4096], path[1024], *out = NULL;
	if (moet_test_run("python3 -c 'import numpy'", NULL) != 0) {
		printf("test_npy: python3 with numpy not available: numpy interoperability skipped\n");
		return;
	}
	/* numpy reads ours: exact values, dtype, shape. */
	int64_t shape[3] = { 2, 3, 4 };
	double d[24];
	for (int i = 0; i < 24; i++)
		d[i] = (double)i / 7.0 - 1.0;
	path_of(path, sizeof(path), "ours.npy");
	CHECK(moet_npy_write(path, MOET_DT_F64, 3, shape, d) == 0, "%s", moet_errmsg());
	snprintf(cmd, sizeof(cmd),
		 "python3 -c \"import numpy as np; a = np.load('%s'); "
		 "e = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7.0 - 1.0; "
		 "print('OK' if a.dtype == np.float64 and a.shape == (2, 3, 4) and a.flags.c_contiguous "
		 "and (a == e).all() else 'BAD', a.dtype, a.shape)\"", path);
	int rc = moet_test_run(cmd, &out);
	CHECK(rc == 0 && out && strncmp(out, "OK", 2) == 0, "numpy reading ours: %s",
	      out ? out : "");
	free(out);
	out = NULL;

	/* We read numpy's: f4, f8, i8, scalar, 1-D, and a format 2.0 file. */
	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && python3 -c \"import numpy as np; from numpy.lib import format as f; "
		 "np.save('np_f4.npy', (np.arange(12, dtype=np.float32) * 0.25).reshape(3, 4)); "
		 "np.save('np_f8.npy', np.arange(5, dtype=np.float64) / 3.0); "
		 "np.save('np_i8.npy', np.arange(6, dtype=np.int64).reshape(2, 3) * -7); "
		 "np.save('np_scalar.npy', np.float64(2.5)); "
		 "np.save('np_fortran.npy', np.asfortranarray(np.ones((2, 3)))); "
		 "fh = open('np_v2.npy', 'wb'); f.write_array(fh, np.arange(4.0), version=(2, 0)); "
		 "fh.close()\"", g_dir);
	rc = moet_test_run(cmd, &out);
	CHECK(rc == 0, "numpy could not write its files: %s", out ? out : "");
	free(out);

	moet_npy a;
	path_of(path, sizeof(path), "np_f4.npy");
	CHECK(moet_npy_read(path, &a) == 0, "%s", moet_errmsg());
	CHECK(a.dtype == MOET_DT_F32 && a.ndim == 2 && a.shape[0] == 3 && a.shape[1] == 4,
	      "np_f4 header");
	for (int i = 0; a.data && i < 12; i++)
		CHECK(((float *)a.data)[i] == (float)i * 0.25f, "np_f4[%d]", i);
	moet_npy_free(&a);

	path_of(path, sizeof(path), "np_f8.npy");
	CHECK(moet_npy_read(path, &a) == 0, "%s", moet_errmsg());
	CHECK(a.dtype == MOET_DT_F64 && a.ndim == 1 && a.shape[0] == 5, "np_f8 header");
	for (int i = 0; a.data && i < 5; i++)
		CHECK(((double *)a.data)[i] == (double)i / 3.0, "np_f8[%d]", i);
	moet_npy_free(&a);

	path_of(path, sizeof(path), "np_i8.npy");
	CHECK(moet_npy_read(path, &a) == 0, "%s", moet_errmsg());
	CHECK(a.dtype == MOET_DT_I64 && a.ndim == 2 && a.numel == 6, "np_i8 header");
	for (int i = 0; a.data && i < 6; i++)
		CHECK(((int64_t *)a.data)[i] == (int64_t)i * -7, "np_i8[%d]", i);
	moet_npy_free(&a);

	path_of(path, sizeof(path), "np_scalar.npy");
	CHECK(moet_npy_read(path, &a) == 0, "%s", moet_errmsg());
	CHECK(a.ndim == 0 && a.numel == 1 && a.data && *(double *)a.data == 2.5, "np_scalar");
	moet_npy_free(&a);

	path_of(path, sizeof(path), "np_v2.npy");
	CHECK(moet_npy_read(path, &a) == 0, "%s", moet_errmsg());
	CHECK(a.ndim == 1 && a.numel == 4 && a.data && ((double *)a.data)[3] == 3.0, "np_v2");
	moet_npy_free(&a);

	expect_refused("np_fortran.npy", MOET_EUNSUP, "fortran_order");
	printf("test_npy: numpy interoperability checked\n");
}

int main(void)
{
	g_dir = moet_test_mkdtemp("npy");
	if (!g_dir) {
		fprintf(stderr, "test_npy: cannot make a scratch folder\n");
		return 1;
	}
	int64_t s0[1] = { 0 };
	int64_t s1[1] = { 7 };
	int64_t s2[2] = { 48, 384 };
	int64_t s4[4] = { 2, 3, 1, 5 };
	int64_t se[2] = { 0, 4 };
	round_trip("f32-4d.npy", MOET_DT_F32, 4, s4);
	round_trip("f64-2d.npy", MOET_DT_F64, 2, s2);
	round_trip("i64-1d.npy", MOET_DT_I64, 1, s1);
	round_trip("f64-scalar.npy", MOET_DT_F64, 0, s0);
	round_trip("f32-empty.npy", MOET_DT_F32, 2, se);
	round_trip("f32-zero-1d.npy", MOET_DT_F32, 1, s0);
	malformed();
	with_numpy();
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	moet_test_run(cmd, NULL);
	free(g_dir);
	return moet_test_done("test_npy");
}
