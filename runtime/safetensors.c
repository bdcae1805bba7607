/*
 * safetensors.c: parses and validates one safetensors file image in memory.
 *
 *   offset 0        8                8+N                                   n_bytes
 *          +--------+----------------+-------------------------------------+
 *          | N (LE) | JSON header    | data buffer: tensors back to back   |
 *          +--------+----------------+-------------------------------------+
 *                                    ^ data_offsets are relative to here
 *
 * The parser trusts nothing in the file: every length is checked against what is actually
 * there before it is used, every sum and product is overflow-checked, and every failure
 * becomes one line "FILE: [tensor NAME: ]problem" with the code MOET_EFORMAT (MOET_ENOMEM
 * for allocation failures). Names and strings taken from the file are printed with control
 * characters replaced by '?', so that a hostile header cannot break the one-line rule.
 *
 * Coverage rule (as the reference implementation): sorted by (begin, end), each tensor must
 * start exactly where the previous one ended, and the last must end at the end of the
 * buffer. This rejects overlaps and gaps in one pass; zero-byte tensors are allowed.
 *
 * NOTE: the returned array is sorted by name, so that callers can bsearch it and merge
 * shards without another sort of each shard.
 */
#include "moet_ckpt.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_json.h"

#define NAME_SHOW_BYTES 200 /* longest piece of a file-supplied string shown in an error */

typedef struct span {
	uint64_t begin, end; /* bytes, relative to the data buffer */
	size_t idx;          /* into the tensor array */
} span;

/* Copies s into buf (n bytes) with control characters replaced and long strings cut. */
static const char *shown(const char *s, char *buf, size_t n)
{
	size_t i = 0;
	for (; s[i] && i + 4 < n; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[i] = (c < 0x20 || c == 0x7F) ? '?' : (char)c;
	}
	if (s[i]) {
		memcpy(buf + i, "...", 3);
		i += 3;
	}
	buf[i] = '\0';
	return buf;
}

static bool has_control_chars(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7F)
			return true;
	return false;
}

static void format_shape(const int64_t *shape, int ndim, char *buf, size_t n)
{
	size_t len = 0;
	len += (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < ndim && len < n; d++)
		len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64, d ? ", " : "", shape[d]);
	if (len < n)
		snprintf(buf + len, n - len, "]");
}

static int check_metadata(const char *file, const json_t *meta)
{
	const char *key;
	json_t *v;
	char kb[NAME_SHOW_BYTES];
	if (!json_is_object(meta))
		return moet_err(MOET_EFORMAT, "%s: __metadata__ is a JSON %s, not an object of "
			       "strings", file, moet_json_kind(meta));
	json_object_foreach((json_t *)meta, key, v) {
		if (!json_is_string(v))
			return moet_err(MOET_EFORMAT, "%s: __metadata__ key %s is a JSON %s, not a "
				       "string", file, shown(key, kb, sizeof(kb)), moet_json_kind(v));
	}
	return 0;
}

/* Reads one header entry into *t (name not yet set) and its offsets into *sp. */
static int parse_entry(const char *file, const char *name, const json_t *e, const uint8_t *data,
		       uint64_t data_bytes, uint64_t data_pos, moet_tensor *t, span *sp)
{
	char nb[NAME_SHOW_BYTES], sb[256], db[48];
	const char *nm = shown(name, nb, sizeof(nb));
	if (!json_is_object(e))
		return moet_err(MOET_EFORMAT, "%s: tensor %s: entry is a JSON %s, not an object",
			       file, nm, moet_json_kind(e));

	const json_t *jd = json_object_get(e, "dtype");
	if (!jd)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: dtype is missing", file, nm);
	if (!json_is_string(jd))
		return moet_err(MOET_EFORMAT, "%s: tensor %s: dtype is a JSON %s, not a string",
			       file, nm, moet_json_kind(jd));
	t->dtype = moet_dtype_parse(json_string_value(jd));
	if (t->dtype == MOET_DT_INVALID)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: unknown dtype \"%s\"", file, nm,
			       shown(json_string_value(jd), db, sizeof(db)));
	size_t esize = moet_dtype_size(t->dtype);

	const json_t *js = json_object_get(e, "shape");
	if (!js)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: shape is missing", file, nm);
	if (!json_is_array(js))
		return moet_err(MOET_EFORMAT, "%s: tensor %s: shape is a JSON %s, not an array",
			       file, nm, moet_json_kind(js));
	if (json_array_size(js) > MOET_CKPT_MAX_DIMS)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: shape has %zu dimensions, more than "
			       "%d", file, nm, json_array_size(js), MOET_CKPT_MAX_DIMS);
	t->ndim = (int)json_array_size(js);
	int64_t numel = 1;
	bool too_big = false;
	for (int d = 0; d < t->ndim; d++) {
		const json_t *x = json_array_get(js, (size_t)d);
		if (!json_is_integer(x))
			return moet_err(MOET_EFORMAT,
					"%s: tensor %s: shape[%d] is a JSON %s, not an "
				       "integer", file, nm, d, moet_json_kind(x));
		json_int_t v = json_integer_value(x);
		if (v < 0)
			return moet_err(MOET_EFORMAT, "%s: tensor %s: shape[%d] is negative (%lld)",
				       file, nm, d, (long long)v);
		t->shape[d] = (int64_t)v;
		if (__builtin_mul_overflow(numel, t->shape[d], &numel))
			too_big = true;
	}
	format_shape(t->shape, t->ndim, sb, sizeof(sb));
	uint64_t need = 0;
	if (too_big || __builtin_mul_overflow((uint64_t)numel, (uint64_t)esize, &need))
		return moet_err(MOET_EFORMAT, "%s: tensor %s: shape %s of %s overflows 64 bits",
			       file, nm, sb, moet_dtype_name(t->dtype));
	t->numel = numel;

	const json_t *jo = json_object_get(e, "data_offsets");
	if (!jo)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: data_offsets is missing", file, nm);
	if (!json_is_array(jo) || json_array_size(jo) != 2 ||
	    !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
		return moet_err(MOET_EFORMAT, "%s: tensor %s: data_offsets is not an array of two "
			       "integers", file, nm);
	json_int_t b = json_integer_value(json_array_get(jo, 0));
	json_int_t en = json_integer_value(json_array_get(jo, 1));
	if (b < 0 || en < 0 || b > en)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: data_offsets [%lld, %lld] are not "
			       "ordered non-negative offsets", file, nm, (long long)b,
			       (long long)en);
	if ((uint64_t)en > data_bytes)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: data_offsets [%lld, %lld] run past "
			       "the end of the %" PRIu64 "-byte data buffer (file truncated?)",
			       file, nm, (long long)b, (long long)en, data_bytes);
	if ((uint64_t)(en - b) != need)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: data_offsets [%lld, %lld] but shape "
			       "%s of %s needs %" PRIu64 " bytes", file, nm, (long long)b,
			       (long long)en, sb, moet_dtype_name(t->dtype), need);
	t->data = data + b;
	t->n_bytes = (size_t)need;
	if ((uintptr_t)t->data % esize != 0)
		return moet_err(MOET_EFORMAT, "%s: tensor %s: data at file offset %" PRIu64 " is "
			       "not aligned to the %zu-byte size of %s", file, nm,
			       data_pos + (uint64_t)b, esize, moet_dtype_name(t->dtype));
	sp->begin = (uint64_t)b;
	sp->end = (uint64_t)en;
	return 0;
}

static int cmp_span(const void *a, const void *b)
{
	const span *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp(((const moet_tensor *)a)->name, ((const moet_tensor *)b)->name);
}

/* Sorted spans must tile [0, data_bytes) exactly. */
static int check_coverage(const char *file, const moet_tensor *t, span *sp, size_t n,
			  uint64_t data_bytes)
{
	char nb[NAME_SHOW_BYTES], pb[NAME_SHOW_BYTES];
	qsort(sp, n, sizeof(*sp), cmp_span);
	uint64_t cursor = 0;
	for (size_t i = 0; i < n; i++) {
		const char *nm = shown(t[sp[i].idx].name, nb, sizeof(nb));
		if (sp[i].begin < cursor)
			return moet_err(MOET_EFORMAT, "%s: tensor %s: data_offsets [%" PRIu64 ", %"
				       PRIu64 "] overlap tensor %s, which ends at %" PRIu64, file,
				       nm, sp[i].begin, sp[i].end,
				       shown(t[sp[i - 1].idx].name, pb, sizeof(pb)), cursor);
		if (sp[i].begin > cursor)
			return moet_err(MOET_EFORMAT, "%s: tensor %s: gap of %" PRIu64 " unused "
				       "bytes in the data buffer before it (offset %" PRIu64 ")",
				       file, nm, sp[i].begin - cursor, cursor);
		cursor = sp[i].end;
	}
	if (cursor != data_bytes) {
		if (n == 0)
			return moet_err(MOET_EFORMAT, "%s: no tensors, but the data buffer holds %"
				       PRIu64 " bytes", file, data_bytes);
		return moet_err(MOET_EFORMAT, "%s: tensor %s: %" PRIu64 " unused bytes in the data "
			       "buffer after this last tensor", file,
			       shown(t[sp[n - 1].idx].name, nb, sizeof(nb)), data_bytes - cursor);
	}
	return 0;
}

int moet_safetensors_parse(const char *file_name, const uint8_t *buf, size_t n_bytes,
			   moet_tensor **out_tensors, size_t *out_count)
{
	int rc = 0;
	json_t *root = NULL;
	moet_tensor *t = NULL;
	span *sp = NULL;
	size_t count = 0;
	char kb[NAME_SHOW_BYTES];

	*out_tensors = NULL;
	*out_count = 0;
	if (n_bytes < 8)
		return moet_err(MOET_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte "
			       "header length", file_name, n_bytes);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = (hlen << 8) | buf[i];
	if (hlen > MOET_CKPT_MAX_HEADER_BYTES)
		return moet_err(MOET_EFORMAT, "%s: header length %" PRIu64 " exceeds the limit of "
			       "%u bytes", file_name, hlen, MOET_CKPT_MAX_HEADER_BYTES);
	if (hlen > n_bytes - 8)
		return moet_err(MOET_EFORMAT, "%s: header length %" PRIu64 " runs past the end of "
			       "the %zu-byte file", file_name, hlen, n_bytes);
	const uint8_t *data = buf + 8 + hlen;
	uint64_t data_bytes = n_bytes - 8 - hlen;

	json_error_t jerr;
	root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		rc = moet_err(MOET_EFORMAT, "%s: header is not valid JSON: %s (line %d, column %d)",
			      file_name, shown(jerr.text, kb, sizeof(kb)), jerr.line, jerr.column);
		goto fail;
	}
	if (!json_is_object(root)) {
		rc = moet_err(MOET_EFORMAT, "%s: header is a JSON %s, not an object", file_name,
			      moet_json_kind(root));
		goto fail;
	}

	size_t cap = json_object_size(root);
	t = calloc(cap ? cap : 1, sizeof(*t));
	sp = calloc(cap ? cap : 1, sizeof(*sp));
	if (!t || !sp) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory for %zu tensor entries", file_name,
			      cap);
		goto fail;
	}
	const char *key;
	json_t *val;
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__")) {
			rc = check_metadata(file_name, val);
			if (rc)
				goto fail;
			continue;
		}
		if (!key[0] || has_control_chars(key)) {
			rc = moet_err(MOET_EFORMAT, "%s: tensor \"%s\": name is empty or holds "
				      "control characters", file_name, shown(key, kb, sizeof(kb)));
			goto fail;
		}
		rc = parse_entry(file_name, key, val, data, data_bytes, 8 + hlen, &t[count],
				 &sp[count]);
		if (rc)
			goto fail;
		t[count].name = strdup(key);
		if (!t[count].name) {
			rc = moet_err(MOET_ENOMEM, "%s: out of memory", file_name);
			goto fail;
		}
		sp[count].idx = count;
		count++;
	}
	rc = check_coverage(file_name, t, sp, count, data_bytes);
	if (rc)
		goto fail;
	qsort(t, count, sizeof(*t), cmp_tensor_name);
	free(sp);
	json_decref(root);
	*out_tensors = t;
	*out_count = count;
	return 0;
fail:
	moet_safetensors_free(t, count);
	free(sp);
	json_decref(root);
	return rc;
}

void moet_safetensors_free(moet_tensor *tensors, size_t count)
{
	if (!tensors)
		return;
	for (size_t i = 0; i < count; i++)
		free((char *)tensors[i].name);
	free(tensors);
}
