/*
 * test_safetensors.c: moet_safetensors_parse on valid images written by st_build.h, on one
 * broken image per validation rule (each must fail with MOET_EFORMAT and a one-line message
 * naming the file and the tensor), and on a few thousand random mutations of a valid image
 * (no crash, no leak, no out-of-bounds read under ASan; anything accepted is consistent).
 */
#include <string.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_test.h"
#include "st_build.h"

#define FILE_LABEL "dir/model-00001-of-00002.safetensors"

static int one_line(const char *s)
{
	return s[0] && !strchr(s, '\n') && !strchr(s, '\r');
}

/* Parses an image (copied into an exact-size allocation so ASan sees any over-read) and
 * expects failure with `code` and a message holding each of the NULL-terminated needles. */
static void expect_fail(const char *what, const uint8_t *img, size_t n, int code, ...)
{
	uint8_t *buf = malloc(n ? n : 1);
	if (n)
		memcpy(buf, img, n);
	moet_tensor *t = (moet_tensor *)1;
	size_t cnt = 99;
	moet_err_clear();
	int rc = moet_safetensors_parse(FILE_LABEL, buf, n, &t, &cnt);
	const char *msg = moet_errmsg();
	if (getenv("MOET_TEST_VERBOSE"))
		printf("%-28s -> %s\n", what, msg);
	CHECK(rc == code, "%s: rc %d (%s), want %d; msg: %s", what, rc, moet_strerror(rc), code,
	      msg);
	CHECK(t == NULL && cnt == 0, "%s: outputs not cleared on failure", what);
	CHECK(one_line(msg), "%s: message is not one line: [%s]", what, msg);
	CHECK(strstr(msg, FILE_LABEL) == msg, "%s: message does not start with the file: %s",
	      what, msg);
	va_list ap;
	va_start(ap, code);
	for (const char *needle; (needle = va_arg(ap, const char *));)
		CHECK(strstr(msg, needle), "%s: message lacks \"%s\": %s", what, needle, msg);
	va_end(ap);
	if (rc == 0)
		moet_safetensors_free(t, cnt);
	free(buf);
}

static void expect_fail_header(const char *what, const char *header, size_t n_data, int code,
			       const char *needle1, const char *needle2)
{
	uint8_t *data = calloc(n_data + 1, 1);
	size_t n;
	uint8_t *img = stb_raw(header, data, n_data, &n);
	expect_fail(what, img, n, code, needle1, needle2, (const char *)NULL);
	free(img);
	free(data);
}

static void test_valid(void)
{
	float f[6] = { 1, -2, 3.5f, 0, 1e-3f, 7 };
	stb_tensor t[] = {
		{ .name = "b.f32", .dtype = "F32", .ndim = 2, .shape = { 2, 3 }, .data = f },
		{ .name = "a.bf16", .dtype = "BF16", .ndim = 1, .shape = { 4 } },
		{ .name = "c.f8", .dtype = "F8_E4M3", .ndim = 2, .shape = { 3, 5 } },
		{ .name = "s.scalar", .dtype = "F32", .ndim = 0 },
		{ .name = "z.empty", .dtype = "BF16", .ndim = 2, .shape = { 0, 4 } },
		{ .name = "i.i64", .dtype = "I64", .ndim = 1, .shape = { 3 } },
	};
	size_t nt = sizeof(t) / sizeof(t[0]), n;
	uint8_t *img = stb_build(t, nt, "{\"format\":\"pt\"}", &n);
	moet_tensor *out = NULL;
	size_t cnt = 0;
	int rc = moet_safetensors_parse(FILE_LABEL, img, n, &out, &cnt);
	CHECK(rc == 0, "valid file rejected: %s", moet_errmsg());
	CHECK(cnt == nt, "count %zu, want %zu", cnt, nt);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | img[i];
	const uint8_t *data = img + 8 + hlen;
	static const int64_t numel[] = { 6, 4, 15, 1, 0, 3 };
	static const moet_dtype dt[] = { MOET_DT_F32, MOET_DT_BF16, MOET_DT_F8_E4M3, MOET_DT_F32,
					 MOET_DT_BF16, MOET_DT_I64 };
	for (size_t i = 0; rc == 0 && i < cnt; i++) {
		if (i > 0)
			CHECK(strcmp(out[i - 1].name, out[i].name) < 0, "not sorted at %zu", i);
		size_t k = 0;
		while (k < nt && strcmp(t[k].name, out[i].name))
			k++;
		CHECK(k < nt, "unexpected tensor %s", out[i].name);
		if (k == nt)
			continue;
		CHECK(out[i].dtype == dt[k], "%s: dtype %d", out[i].name, out[i].dtype);
		CHECK(out[i].ndim == t[k].ndim, "%s: ndim %d", out[i].name, out[i].ndim);
		for (int d = 0; d < t[k].ndim; d++)
			CHECK(out[i].shape[d] == t[k].shape[d], "%s: shape[%d]", out[i].name, d);
		CHECK(out[i].numel == numel[k], "%s: numel %" PRId64, out[i].name, out[i].numel);
		CHECK(out[i].n_bytes == t[k].n_bytes, "%s: n_bytes %zu", out[i].name,
		      out[i].n_bytes);
		CHECK((const uint8_t *)out[i].data == data + t[k].offset, "%s: data pointer",
		      out[i].name);
		if (t[k].data)
			CHECK(!memcmp(out[i].data, t[k].data, t[k].n_bytes), "%s: data",
			      out[i].name);
	}
	const moet_tensor *tf = NULL;
	for (size_t i = 0; i < cnt; i++)
		if (!strcmp(out[i].name, "b.f32"))
			tf = &out[i];
	CHECK(tf && ((const float *)tf->data)[2] == 3.5f, "F32 payload not readable in place");
	moet_safetensors_free(out, cnt);
	free(img);

	/* empty header, empty data: zero tensors */
	img = stb_raw("{}", NULL, 0, &n);
	rc = moet_safetensors_parse(FILE_LABEL, img, n, &out, &cnt);
	CHECK(rc == 0 && cnt == 0, "empty file rejected: %s", moet_errmsg());
	moet_safetensors_free(out, cnt);
	free(img);
	/* unpadded header (any N is legal when the data stays aligned: U8 only) */
	img = stb_raw_pad("{\"u\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", "abc",
			  3, 1, &n);
	rc = moet_safetensors_parse(FILE_LABEL, img, n, &out, &cnt);
	CHECK(rc == 0 && cnt == 1 && !memcmp(out[0].data, "abc", 3), "U8 file: %s",
	      moet_errmsg());
	moet_safetensors_free(out, cnt);
	free(img);
}

static void test_framing(void)
{
	uint8_t small[5] = { 1, 0, 0, 0, 0 };
	expect_fail("shorter than 8 bytes", small, sizeof(small), MOET_EFORMAT, "shorter",
		    (const char *)NULL);
	expect_fail("empty file", small, 0, MOET_EFORMAT, "shorter", (const char *)NULL);

	size_t n;
	uint8_t *img = stb_raw("{}", NULL, 0, &n);
	img[0] = 0xE8;
	img[1] = 0x03; /* N = 1000, file 16 bytes */
	expect_fail("header length past end", img, n, MOET_EFORMAT, "header length 1000",
		    "past the end", (const char *)NULL);
	uint64_t big = (100u << 20) + 1;
	for (int i = 0; i < 8; i++)
		img[i] = (uint8_t)(big >> (8 * i));
	expect_fail("header length over limit", img, n, MOET_EFORMAT, "exceeds the limit",
		    (const char *)NULL);
	memset(img, 0xFF, 8);
	expect_fail("header length 2^64-1", img, n, MOET_EFORMAT, "exceeds the limit",
		    (const char *)NULL);
	free(img);

	expect_fail_header("malformed JSON", "{\"a\": {\"dtype\": ", 0, MOET_EFORMAT,
			   "not valid JSON", NULL);
	expect_fail_header("header not an object", "[1, 2, 3]", 0, MOET_EFORMAT,
			   "header is a JSON array, not an object", NULL);
	expect_fail_header("duplicate key",
			   "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			   "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2,
			   MOET_EFORMAT, "not valid JSON", "duplicate");
	expect_fail_header("metadata not an object", "{\"__metadata__\": [1]}", 0, MOET_EFORMAT,
			   "__metadata__", NULL);
	expect_fail_header("metadata value not a string", "{\"__metadata__\": {\"k\": 3}}", 0,
			   MOET_EFORMAT, "__metadata__ key k", NULL);
	expect_fail_header("control chars in a name",
			   "{\"a\\nb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
			   MOET_EFORMAT, "tensor \"a?b\"", "control characters");
	expect_fail_header("no tensors but data", "{}", 8, MOET_EFORMAT, "no tensors", NULL);
}

static void test_entries(void)
{
	const int E = MOET_EFORMAT;
#define ENT(name, body) "{\"" name "\":" body "}"
	expect_fail_header("entry not an object", ENT("w", "[1]"), 0, E, "tensor w:",
			   "not an object");
	expect_fail_header("dtype missing", ENT("w", "{\"shape\":[1],\"data_offsets\":[0,1]}"), 1,
			   E, "tensor w:", "dtype is missing");
	expect_fail_header("dtype not a string",
			   ENT("w", "{\"dtype\":1,\"shape\":[1],\"data_offsets\":[0,1]}"), 1, E,
			   "tensor w:", "dtype is a JSON integer");
	expect_fail_header("unknown dtype",
			   ENT("w", "{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,1]}"), 1,
			   E, "tensor w:", "unknown dtype \"F12\"");
	expect_fail_header("shape missing", ENT("w", "{\"dtype\":\"U8\",\"data_offsets\":[0,1]}"),
			   1, E, "tensor w:", "shape is missing");
	expect_fail_header("shape not an array",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":\"1\",\"data_offsets\":[0,1]}"), 1,
			   E, "tensor w:", "shape is a JSON string");
	expect_fail_header("negative shape",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,1]}"),
			   1, E, "tensor w:", "shape[1] is negative");
	expect_fail_header("non-integer shape",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,1]}"), 1,
			   E, "tensor w:", "shape[0] is a JSON number");
	expect_fail_header("boolean shape",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":[true],\"data_offsets\":[0,1]}"),
			   1, E, "tensor w:", "shape[0] is a JSON boolean");
	expect_fail_header("too many dims",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
			       "\"data_offsets\":[0,1]}"), 1, E, "tensor w:", "9 dimensions");
	expect_fail_header("shape overflow",
			   ENT("w", "{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296],"
			       "\"data_offsets\":[0,2]}"), 2, E, "tensor w:", "overflows");
	expect_fail_header("bytes overflow",
			   ENT("w", "{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
			       "\"data_offsets\":[0,8]}"), 8, E, "tensor w:", "overflows");
	expect_fail_header("offsets missing", ENT("w", "{\"dtype\":\"U8\",\"shape\":[1]}"), 1, E,
			   "tensor w:", "data_offsets is missing");
	expect_fail_header("offsets malformed",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}"), 1, E,
			   "tensor w:", "two integers");
	expect_fail_header("offsets reversed",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}"), 4,
			   E, "tensor w:", "[4, 2]");
	expect_fail_header("offsets negative",
			   ENT("w", "{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-1,-1]}"), 0,
			   E, "tensor w:", "non-negative");
	expect_fail_header("out-of-range offsets",
			   ENT("w", "{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}"), 8,
			   E, "tensor w:", "run past the end of the 8-byte data buffer");
	expect_fail_header("size != numel*dtype",
			   ENT("model.layers.0.mlp.gate.weight",
			       "{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,100]}"),
			       100,
			   E, FILE_LABEL ": tensor model.layers.0.mlp.gate.weight: data_offsets "
			   "[0, 100] but shape [4, 8] of BF16 needs 64 bytes", NULL);
	expect_fail_header("misaligned F32",
			   "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}", 5, E,
			   "tensor b:", "not aligned to the 4-byte size of F32");
	/* Header of odd length: data start is misaligned for BF16 even at offset 0. */
	uint8_t data[2] = { 0, 0 };
	char hdr[128];
	snprintf(hdr, sizeof(hdr), "%s", ENT("h", "{\"dtype\":\"BF16\",\"shape\":[1],"
					    "\"data_offsets\":[0,2]}"));
	if (strlen(hdr) % 2 == 0)
		strcat(hdr, " ");
	size_t n;
	uint8_t *img = stb_raw_pad(hdr, data, 2, 1, &n);
	expect_fail("misaligned header end", img, n, E, "tensor h:", "not aligned",
		    (const char *)NULL);
	free(img);
	expect_fail_header("overlap",
			   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
			   E,
			   "tensor b:", "overlap tensor a");
	expect_fail_header("same offsets",
			   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, E,
			   "overlap tensor", NULL);
	expect_fail_header("gap",
			   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
			   E,
			   "tensor b:", "gap of 4 unused bytes");
	expect_fail_header("leading gap",
			   ENT("w", "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}"), 8,
			   E, "tensor w:", "gap of 4");
	expect_fail_header("trailing bytes",
			   ENT("w", "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"), 12,
			   E, "tensor w:", "4 unused bytes in the data buffer after");
#undef ENT
}

static void test_truncated(void)
{
	stb_tensor t[] = {
		{ .name = "first", .dtype = "F32", .ndim = 1, .shape = { 8 } },
		{ .name = "last", .dtype = "F32", .ndim = 2, .shape = { 4, 4 } },
	};
	size_t n;
	uint8_t *img = stb_build(t, 2, NULL, &n);
	expect_fail("truncated shard", img, n - 4, MOET_EFORMAT, "tensor last:",
		    "run past the end", "truncated", (const char *)NULL);
	expect_fail("truncated into the header", img, 20, MOET_EFORMAT, "past the end",
		    (const char *)NULL);
	free(img);
}

/* xorshift64*: deterministic, seeded per run */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static void test_mutations(void)
{
	stb_tensor t[] = {
		{ .name = "model.embed_tokens.weight", .dtype = "BF16", .ndim = 2, .shape = { 6,
						      4 } },
		{ .name = "model.layers.0.mlp.gate.e_score_correction_bias", .dtype = "F32",
		  .ndim = 1, .shape = { 4 } },
		{ .name = "model.layers.0.mlp.experts.0.up_proj.weight", .dtype = "F8_E4M3",
		  .ndim = 2, .shape = { 3, 4 } },
		{ .name = "s", .dtype = "I64", .ndim = 0 },
		{ .name = "z", .dtype = "F16", .ndim = 1, .shape = { 0 } },
	};
	size_t n0;
	uint8_t *base = stb_build(t, 5, "{\"format\":\"pt\"}", &n0);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | base[i];
	int accepted = 0, rejected = 0;
	static const char tokens[] = "{}[]\",:0123456789-.e ";
	for (int it = 0; it < 4000; it++) {
		size_t n = n0;
		uint8_t *m = malloc(n0 + 64);
		memcpy(m, base, n0);
		int k = 1 + (int)(rnd() % 4);
		for (int j = 0; j < k; j++) {
			uint64_t r = rnd();
			switch (r % 6) {
			case 0: /* flip a bit anywhere */
				m[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
				break;
			case 1: /* a JSON-ish character inside the header */
				m[8 + rnd() % hlen] = (uint8_t)tokens[rnd() % (sizeof(tokens) - 1)];
				break;
			case 2: /* truncate */
				n = (size_t)(rnd() % (n + 1));
				break;
			case 3: /* random byte in the length field */
				m[rnd() % 8] = (uint8_t)rnd();
				break;
			case 4: /* grow with junk */
				if (n + 8 <= n0 + 64) {
					for (int q = 0; q < 8; q++)
						m[n + (size_t)q] = (uint8_t)rnd();
					n += 8;
				}
				break;
			default: /* a digit inside the header, often an offset or shape */
				m[8 + rnd() % hlen] = (uint8_t)('0' + rnd() % 10);
				break;
			}
			if (n == 0)
				break;
		}
		uint8_t *exact = malloc(n ? n : 1);
		memcpy(exact, m, n);
		free(m);
		moet_tensor *out = NULL;
		size_t cnt = 0;
		int rc = moet_safetensors_parse("fuzz.safetensors", exact, n, &out, &cnt);
		if (rc == 0) {
			accepted++;
			for (size_t i = 0; i < cnt; i++) {
				const uint8_t *p = out[i].data;
				CHECK(p >= exact + 8 && p + out[i].n_bytes <= exact + n,
				      "iteration %d: accepted tensor %s outside the buffer", it,
				      out[i].name);
				CHECK((uint64_t)out[i].numel * moet_dtype_size(out[i].dtype) ==
				      out[i].n_bytes, "iteration %d: n_bytes", it);
			}
			moet_safetensors_free(out, cnt);
		} else {
			rejected++;
			CHECK(rc == MOET_EFORMAT || rc == MOET_ENOMEM, "iteration %d: rc %d", it,
			      rc);
			CHECK(one_line(moet_errmsg()) &&
			      strstr(moet_errmsg(), "fuzz.safetensors") == moet_errmsg(),
			      "iteration %d: message [%s]", it, moet_errmsg());
			CHECK(out == NULL && cnt == 0, "iteration %d: outputs not cleared", it);
		}
		free(exact);
	}
	printf("mutations: %d accepted, %d rejected\n", accepted, rejected);
	CHECK(rejected > 1000, "too few mutations rejected (%d): the loop is not mutating",
	      rejected);
	free(base);
}

int main(void)
{
	test_valid();
	test_framing();
	test_entries();
	test_truncated();
	test_mutations();
	return moet_test_done("test_safetensors");
}
