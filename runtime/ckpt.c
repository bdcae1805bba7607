/*
 * ckpt.c: a checkpoint directory (index + shards) mapped read-only and validated at open.
 *
 *   open(DIR)
 *     |- DIR/model.safetensors.index.json present?
 *     |    yes: weight_map {tensor: shard}; the shard set = the distinct values, sorted
 *     |    no:  one shard, DIR/model.safetensors
 *     |- each shard: open, fstat, mmap whole (PROT_READ, MAP_SHARED), moet_safetensors_parse
 *     |- all tensors -> one array sorted by name (adjacent equal names = a tensor in two shards)
 *     '- index <-> shards agree both ways: every weight_map entry exists in the shard it
 *        names, and every tensor of every shard is listed in the weight_map
 *
 * Lookups are a bsearch over the sorted array. Tensor data points into the mappings, which
 * live until close. Every failure unwinds everything mapped or allocated so far.
 */
#include "moet_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moet_err.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define INDEX_MAX_BYTES (256u << 20) /* a 1T-parameter index is a few MiB */

typedef struct shard {
	char *path;         /* DIR/FILE, as given */
	char *file;         /* FILE */
	void *map;          /* NULL when the file is empty */
	size_t map_bytes;
} shard;

struct moet_ckpt {
	char *dir;
	shard *shards;
	int n_shards;
	moet_tensor *tensors;  /* sorted by name; names owned */
	size_t n_tensors;
};

static char *join_path(const char *dir, const char *file)
{
	size_t nd = strlen(dir), nf = strlen(file);
	bool slash = nd > 0 && dir[nd - 1] != '/';
	char *p = malloc(nd + nf + 2);
	if (!p)
		return NULL;
	memcpy(p, dir, nd);
	if (slash)
		p[nd++] = '/';
	memcpy(p + nd, file, nf + 1);
	return p;
}

/* Reads a whole small file. ENOTFOUND if it does not exist (message left to the caller when
 * quiet), EIO otherwise. */
static int read_small_file(const char *path, size_t max_bytes, char **out, size_t *out_n)
{
	int rc = 0;
	char *buf = NULL;
	FILE *f = fopen(path, "rb");
	if (!f)
		return moet_err(errno == ENOENT ? MOET_ENOTFOUND : MOET_EIO, "%s: %s", path,
				strerror(errno));
	struct stat st;
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
		rc = moet_err(MOET_EIO, "%s: not a regular file", path);
		goto fail;
	}
	if ((uint64_t)st.st_size > max_bytes) {
		rc = moet_err(MOET_EFORMAT, "%s: %lld bytes, more than the %zu-byte limit", path,
			      (long long)st.st_size, max_bytes);
		goto fail;
	}
	size_t n = (size_t)st.st_size;
	buf = malloc(n + 1);
	if (!buf) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	if (fread(buf, 1, n, f) != n) {
		rc = moet_err(MOET_EIO, "%s: short read", path);
		goto fail;
	}
	buf[n] = '\0';
	fclose(f);
	*out = buf;
	*out_n = n;
	return 0;
fail:
	free(buf);
	fclose(f);
	return rc;
}

/* Maps sh->path and parses it; on success the shard's tensors are in *out_t / *out_n. */
static int map_shard(shard *sh, moet_tensor **out_t, size_t *out_n)
{
	int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return moet_err(errno == ENOENT ? MOET_ENOTFOUND : MOET_EIO, "%s: %s", sh->path,
				strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return moet_err(MOET_EIO, "%s: not a regular file", sh->path);
	}
	sh->map_bytes = (size_t)st.st_size;
	if (sh->map_bytes > 0) {
		/* NOTE: shared, not private: page-locking (MOET_STAGE_BALANCE's cudaHostRegister)
		 * pins read-only long-term, and Linux unshares every page of a private file
		 * mapping it so pins (a copy into anonymous memory: the checkpoint twice) where a
		 * shared one pins the page cache itself. Read-only, the two read the same bytes. */
		void *m = mmap(NULL, sh->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED) {
			int e = errno;
			close(fd);
			return moet_err(MOET_EIO, "%s: mmap of %zu bytes failed: %s", sh->path,
					sh->map_bytes, strerror(e));
		}
		sh->map = m;
	}
	close(fd);
	static const uint8_t empty[1];
	return moet_safetensors_parse(sh->path, sh->map ? sh->map : empty, sh->map_bytes, out_t,
				      out_n);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const moet_tensor *)a)->name, ((const moet_tensor *)b)->name);
}

static int cmp_key_tensor(const void *key, const void *elem)
{
	return strcmp((const char *)key, ((const moet_tensor *)elem)->name);
}

static bool has_control_chars(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7F)
			return true;
	return false;
}

/* The first weight_map key that names shard `file` (for error messages). */
static const char *first_tensor_of(json_t *wm, const char *file)
{
	const char *key;
	json_t *v;
	json_object_foreach(wm, key, v) {
		if (!strcmp(json_string_value(v), file))
			return key;
	}
	return "?";
}

static bool shard_name_ok(const char *s)
{
	if (!s[0] || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
		return false;
	for (const char *p = s; *p; p++)
		if ((unsigned char)*p < 0x20)
			return false;
	return strstr(s, "..") == NULL;
}

/* Reads the index: the distinct shard file names (sorted) into ck->shards. *out_map keeps
 * the weight_map (a reference into *out_root) for the cross-check after mapping. */
static int read_index(moet_ckpt *ck, const char *ipath, json_t **out_root, json_t **out_map)
{
	int rc = 0;
	char *text = NULL, **names = NULL;
	size_t n_text = 0;
	json_t *root = NULL;
	rc = read_small_file(ipath, INDEX_MAX_BYTES, &text, &n_text);
	if (rc)
		return rc;
	json_error_t jerr;
	root = json_loadb(text, n_text, JSON_REJECT_DUPLICATES, &jerr);
	free(text);
	for (char *c = jerr.text; !root && *c; c++)
		if ((unsigned char)*c < 0x20 || (unsigned char)*c == 0x7F)
			*c = '?';
	if (!root)
		return moet_err(MOET_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", ipath,
				jerr.text, jerr.line, jerr.column);
	json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
	if (!json_is_object(wm) || json_object_size(wm) == 0) {
		rc = moet_err(MOET_EFORMAT, "%s: key weight_map: missing, not an object, or empty",
			      ipath);
		goto fail;
	}
	size_t n = json_object_size(wm), n_names = 0;
	names = calloc(n, sizeof(*names));
	if (!names) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory", ipath);
		goto fail;
	}
	const char *key;
	json_t *v;
	json_object_foreach(wm, key, v) {
		if (!key[0] || has_control_chars(key)) {
			rc = moet_err(MOET_EFORMAT, "%s: key weight_map: a tensor name is empty or "
				      "holds control characters", ipath);
			goto fail;
		}
		if (!json_is_string(v) || !shard_name_ok(json_string_value(v))) {
			rc = moet_err(MOET_EFORMAT, "%s: tensor %s: shard is not a plain file name "
				      "in the directory (a string without '/' or '..')", ipath,
				      key);
			goto fail;
		}
		names[n_names++] = (char *)json_string_value(v);
	}
	qsort(names, n_names, sizeof(*names), cmp_str);
	size_t n_distinct = 0;
	for (size_t i = 0; i < n_names; i++)
		if (i == 0 || strcmp(names[i], names[i - 1]))
			names[n_distinct++] = names[i];
	ck->shards = calloc(n_distinct, sizeof(*ck->shards));
	if (!ck->shards) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory", ipath);
		goto fail;
	}
	for (size_t i = 0; i < n_distinct; i++) {
		shard *sh = &ck->shards[ck->n_shards++];
		sh->file = strdup(names[i]);
		sh->path = join_path(ck->dir, names[i]);
		if (!sh->file || !sh->path) {
			rc = moet_err(MOET_ENOMEM, "%s: out of memory", ipath);
			goto fail;
		}
	}
	free(names);
	*out_root = root;
	*out_map = wm;
	return 0;
fail:
	free(names);
	json_decref(root);
	return rc;
}

static int shard_of_file(const moet_ckpt *ck, const char *file)
{
	for (int i = 0; i < ck->n_shards; i++)
		if (!strcmp(ck->shards[i].file, file))
			return i;
	return -1;
}

/* Index and shards agree both ways. */
static int cross_check(const moet_ckpt *ck, const char *ipath, json_t *wm)
{
	const char *key;
	json_t *v;
	json_object_foreach(wm, key, v) {
		int want = shard_of_file(ck, json_string_value(v));
		const moet_tensor *t = moet_ckpt_get(ck, key);
		if (!t)
			return moet_err(MOET_ENOTFOUND,
					"%s: tensor %s: named by %s but missing from "
					"the shard", ck->shards[want].path, key, ipath);
		if (t->shard != want)
			return moet_err(MOET_EFORMAT, "%s: tensor %s: the index places it in %s",
					ck->shards[t->shard].path, key, ck->shards[want].file);
	}
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const moet_tensor *t = &ck->tensors[i];
		if (!json_object_get(wm, t->name))
			return moet_err(MOET_EFORMAT, "%s: tensor %s: present in the shard but not "
					"listed in %s", ck->shards[t->shard].path, t->name, ipath);
	}
	return 0;
}

int moet_ckpt_open(const char *dir, moet_ckpt **out)
{
	int rc = 0;
	char *ipath = NULL;
	json_t *iroot = NULL, *wm = NULL;
	moet_tensor **per = NULL;
	size_t *per_n = NULL;
	moet_ckpt *ck = calloc(1, sizeof(*ck));
	*out = NULL;
	if (!ck || !(ck->dir = strdup(dir)) || !(ipath = join_path(dir, INDEX_NAME))) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory", dir);
		goto fail;
	}
	struct stat st;
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		rc = moet_err(MOET_ENOTFOUND, "%s: not a directory", dir);
		goto fail;
	}
	if (access(ipath, F_OK) == 0) {
		rc = read_index(ck, ipath, &iroot, &wm);
		if (rc)
			goto fail;
	} else {
		ck->shards = calloc(1, sizeof(*ck->shards));
		if (!ck->shards || !(ck->shards[0].file = strdup(SINGLE_NAME)) ||
		    !(ck->shards[0].path = join_path(dir, SINGLE_NAME))) {
			rc = moet_err(MOET_ENOMEM, "%s: out of memory", dir);
			goto fail;
		}
		ck->n_shards = 1;
		if (access(ck->shards[0].path, F_OK) != 0) {
			rc = moet_err(MOET_ENOTFOUND, "%s: neither %s nor %s exists", dir,
				      INDEX_NAME, SINGLE_NAME);
			goto fail;
		}
	}

	per = calloc((size_t)ck->n_shards, sizeof(*per));
	per_n = calloc((size_t)ck->n_shards, sizeof(*per_n));
	if (!per || !per_n) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory", dir);
		goto fail;
	}
	size_t total = 0;
	for (int i = 0; i < ck->n_shards; i++) {
		rc = map_shard(&ck->shards[i], &per[i], &per_n[i]);
		if (rc) {
			if (wm && rc == MOET_ENOTFOUND)
				rc = moet_err_prefix(rc, "%s: tensor %s: shard %s",
						     ipath, first_tensor_of(wm, ck->shards[i].file),
						     ck->shards[i].file);
			goto fail;
		}
		total += per_n[i];
	}
	ck->tensors = calloc(total ? total : 1, sizeof(*ck->tensors));
	if (!ck->tensors) {
		rc = moet_err(MOET_ENOMEM, "%s: out of memory for %zu tensors", dir, total);
		goto fail;
	}
	/* NOTE: names move from the per-shard arrays to ck->tensors; the per-shard arrays are
	 * then freed without their names. */
	for (int i = 0; i < ck->n_shards; i++) {
		for (size_t j = 0; j < per_n[i]; j++) {
			ck->tensors[ck->n_tensors] = per[i][j];
			ck->tensors[ck->n_tensors++].shard = i;
		}
		free(per[i]);
		per[i] = NULL;
	}
	qsort(ck->tensors, ck->n_tensors, sizeof(*ck->tensors), cmp_tensor);
	for (size_t i = 1; i < ck->n_tensors; i++) {
		const moet_tensor *a = &ck->tensors[i - 1], *b = &ck->tensors[i];
		if (!strcmp(a->name, b->name)) {
			rc = moet_err(MOET_EFORMAT, "%s: tensor %s: also present in %s",
				      ck->shards[b->shard].path, b->name,
				      ck->shards[a->shard].path);
			goto fail;
		}
	}
	if (wm) {
		rc = cross_check(ck, ipath, wm);
		if (rc)
			goto fail;
	}
	free(per);
	free(per_n);
	free(ipath);
	json_decref(iroot);
	*out = ck;
	return 0;
fail:
	if (per)
		for (int i = 0; i < ck->n_shards; i++)
			moet_safetensors_free(per[i], per_n[i]);
	free(per);
	free(per_n);
	free(ipath);
	json_decref(iroot);
	moet_ckpt_close(ck);
	return rc;
}

void moet_ckpt_close(moet_ckpt *ck)
{
	if (!ck)
		return;
	for (size_t i = 0; i < ck->n_tensors; i++)
		free((char *)ck->tensors[i].name);
	free(ck->tensors);
	for (int i = 0; i < ck->n_shards; i++) {
		if (ck->shards[i].map)
			munmap(ck->shards[i].map, ck->shards[i].map_bytes);
		free(ck->shards[i].path);
		free(ck->shards[i].file);
	}
	free(ck->shards);
	free(ck->dir);
	free(ck);
}

const moet_tensor *moet_ckpt_get(const moet_ckpt *ck, const char *name)
{
	return bsearch(name, ck->tensors, ck->n_tensors, sizeof(*ck->tensors), cmp_key_tensor);
}

static void fmt_shape(const int64_t *shape, int ndim, char *buf, size_t n)
{
	size_t len = (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < ndim && len < n; d++)
		len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64, d ? ", " : "", shape[d]);
	if (len < n)
		snprintf(buf + len, n - len, "]");
}

int moet_ckpt_find(const moet_ckpt *ck, const char *name, moet_dtype dtype, int ndim,
		   const int64_t *shape, const moet_tensor **out)
{
	*out = NULL;
	const moet_tensor *t = moet_ckpt_get(ck, name);
	if (!t)
		return moet_err(MOET_ENOTFOUND, "%s: tensor %s is missing", ck->dir, name);
	const char *file = ck->shards[t->shard].path;
	if (dtype != MOET_DT_INVALID && t->dtype != dtype)
		return moet_err(MOET_ESHAPE, "%s: tensor %s has dtype %s, config.json implies %s",
				file, name, moet_dtype_name(t->dtype), moet_dtype_name(dtype));
	bool ok = t->ndim == ndim;
	for (int d = 0; ok && d < ndim; d++)
		ok = shape[d] < 0 || shape[d] == t->shape[d];
	if (!ok) {
		char have[256], want[256];
		fmt_shape(t->shape, t->ndim, have, sizeof(have));
		fmt_shape(shape, ndim > MOET_CKPT_MAX_DIMS ? MOET_CKPT_MAX_DIMS : ndim, want,
			  sizeof(want));
		return moet_err(MOET_ESHAPE, "%s: tensor %s has shape %s, config.json implies %s",
				file, name, have, want);
	}
	*out = t;
	return 0;
}

size_t moet_ckpt_count(const moet_ckpt *ck)
{
	return ck->n_tensors;
}

const moet_tensor *moet_ckpt_at(const moet_ckpt *ck, size_t i)
{
	return i < ck->n_tensors ? &ck->tensors[i] : NULL;
}

int moet_ckpt_shard_count(const moet_ckpt *ck)
{
	return ck->n_shards;
}

const char *moet_ckpt_shard_path(const moet_ckpt *ck, int i)
{
	return (i >= 0 && i < ck->n_shards) ? ck->shards[i].path : NULL;
}

size_t moet_ckpt_shard_bytes(const moet_ckpt *ck, int i)
{
	return (i >= 0 && i < ck->n_shards) ? ck->shards[i].map_bytes : 0;
}

const void *moet_ckpt_shard_base(const moet_ckpt *ck, int i)
{
	return (i >= 0 && i < ck->n_shards) ? ck->shards[i].map : NULL;
}

const char *moet_ckpt_dir(const moet_ckpt *ck)
{
	return ck->dir;
}
