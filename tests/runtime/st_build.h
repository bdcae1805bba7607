/*
 * st_build.h: a tiny safetensors writer for the runtime tests (header-only, static).
 *
 * It is written from the format description, independently of runtime/safetensors.c, so that
 * the reader is checked against files it did not produce:
 *
 *   [u64 LE N][N bytes of JSON, space-padded to a multiple of 8][tensors back to back]
 *
 * stb_build lays tensors out in order of decreasing element size (so every tensor starts
 * aligned), fills data from the caller or with a per-tensor byte pattern, and returns the
 * file image. stb_raw wraps a hand-written header (for broken files).
 */
#ifndef ST_BUILD_H
#define ST_BUILD_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <unistd.h>

#define STB_FN static __attribute__((unused))

typedef struct stb_tensor {
	const char *name;
	const char *dtype;     /* safetensors spelling */
	int ndim;
	int64_t shape[8];
	const void *data;      /* NULL: filled with a pattern (see stb_pattern) */
	/* filled by stb_build: */
	size_t n_bytes;
	size_t offset;         /* in the data buffer */
} stb_tensor;

STB_FN size_t stb_dtype_bytes(const char *dt)
{
	static const struct { const char *n; size_t s; } t[] = {
		{ "BOOL", 1 }, { "U8", 1 }, { "I8", 1 }, { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
		{ "I16", 2 }, { "U16", 2 }, { "F16", 2 }, { "BF16", 2 }, { "I32", 4 },
		{ "U32", 4 }, { "F32", 4 }, { "I64", 8 }, { "U64", 8 }, { "F64", 8 },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (!strcmp(dt, t[i].n))
			return t[i].s;
	return 1;
}

/* A finite, non-NaN fill byte for tensor i (0x00..0x3F: small e4m3 codes, tiny bf16/f32). */
STB_FN uint8_t stb_pattern(size_t i, size_t k)
{
	return (uint8_t)((i * 13 + k * 7) & 0x3F);
}

/* Appends printf output to a growing buffer. */
STB_FN void stb_cat(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
STB_FN void stb_cat(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
		va_end(ap);
		if ((size_t)n < *cap - *len) {
			*len += (size_t)n;
			return;
		}
		*cap = (*cap + (size_t)n) * 2;
		*buf = realloc(*buf, *cap);
		if (!*buf) {
			fprintf(stderr, "st_build: out of memory\n");
			exit(1);
		}
	}
}

/* [N][header][data]; header padded with spaces to a multiple of `pad` (1: none). */
STB_FN uint8_t *stb_raw_pad(const char *header, const void *data, size_t n_data, size_t pad,
			    size_t *out_n)
{
	size_t h = strlen(header);
	size_t hp = (h + pad - 1) / pad * pad;
	uint8_t *img = malloc(8 + hp + n_data + 1);
	if (!img)
		exit(1);
	for (int i = 0; i < 8; i++)
		img[i] = (uint8_t)((uint64_t)hp >> (8 * i));
	memcpy(img + 8, header, h);
	memset(img + 8 + h, ' ', hp - h);
	if (n_data)
		memcpy(img + 8 + hp, data, n_data);
	*out_n = 8 + hp + n_data;
	return img;
}

STB_FN uint8_t *stb_raw(const char *header, const void *data, size_t n_data, size_t *out_n)
{
	return stb_raw_pad(header, data, n_data, 8, out_n);
}

/* Builds a valid file from t[0..n); `metadata` is a JSON object text or NULL. Fills
 * t[i].n_bytes and t[i].offset. */
STB_FN uint8_t *stb_build(stb_tensor *t, size_t n, const char *metadata, size_t *out_n)
{
	size_t *order = malloc((n + 1) * sizeof(*order));
	size_t no = 0, total = 0;
	for (size_t s = 8; s >= 1; s /= 2)
		for (size_t i = 0; i < n; i++)
			if (stb_dtype_bytes(t[i].dtype) == s)
				order[no++] = i;
	for (size_t k = 0; k < no; k++) {
		stb_tensor *x = &t[order[k]];
		size_t numel = 1;
		for (int d = 0; d < x->ndim; d++)
			numel *= (size_t)x->shape[d];
		x->n_bytes = numel * stb_dtype_bytes(x->dtype);
		x->offset = total;
		total += x->n_bytes;
	}
	size_t len = 0, cap = 256;
	char *h = malloc(cap);
	h[0] = '\0';
	stb_cat(&h, &len, &cap, "{");
	if (metadata)
		stb_cat(&h, &len, &cap, "\"__metadata__\":%s", metadata);
	for (size_t i = 0; i < n; i++) {
		stb_cat(&h, &len, &cap, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
			(i || metadata) ? "," : "", t[i].name, t[i].dtype);
		for (int d = 0; d < t[i].ndim; d++)
			stb_cat(&h, &len, &cap, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
		stb_cat(&h, &len, &cap, "],\"data_offsets\":[%zu,%zu]}", t[i].offset,
			t[i].offset + t[i].n_bytes);
	}
	stb_cat(&h, &len, &cap, "}");
	uint8_t *data = malloc(total + 1);
	for (size_t i = 0; i < n; i++) {
		if (t[i].data)
			memcpy(data + t[i].offset, t[i].data, t[i].n_bytes);
		else
			for (size_t k = 0; k < t[i].n_bytes; k++)
				data[t[i].offset + k] = stb_pattern(i, k);
	}
	uint8_t *img = stb_raw(h, data, total, out_n);
	free(h);
	free(data);
	free(order);
	return img;
}

/* Writes an image to DIR/FILE. 0 or -1. */
STB_FN int stb_write(const char *dir, const char *file, const void *img, size_t n)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = n ? fwrite(img, 1, n, f) : 0;
	return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* Writes text to DIR/FILE. */
STB_FN int stb_write_text(const char *dir, const char *file, const char *text)
{
	return stb_write(dir, file, text, strlen(text));
}

/* Removes a flat scratch directory (its files, then itself) and frees the path. */
STB_FN void stb_rmdir(char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4096];
	while (d && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(dir);
	free(dir);
}

#endif
