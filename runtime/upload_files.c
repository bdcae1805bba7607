/*
 * upload_files.c: a checkpoint's shard files as the staged upload's source (moet_upload.h,
 * MOET_UPLOAD_READ=pread): one descriptor per shard, and the map from a mapped tensor
 * pointer back to (shard, file offset).
 *
 * NOTE: the map is the uring source's (moet_uring_shard_maps / moet_uring_locate in
 * uring.c: the header length read from each file's first 8 bytes, never from the mapping),
 * so both sources agree on where a tensor's bytes are.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_upload.h"
#include "moet_uring.h"

struct moet_upload_files {
	int n;                       /* shards */
	moet_upload_file *file;      /* [n]: fd -1 where not opened */
	moet_uring_shard_map *map;   /* [n] */
};

void moet_upload_files_close(moet_upload_files *f)
{
	if (!f)
		return;
	for (int i = 0; i < f->n && f->file; i++)
		if (f->file[i].fd >= 0)
			close(f->file[i].fd);
	free(f->file);
	free(f->map);
	free(f);
}

int moet_upload_files_open(const moet_ckpt *ck, moet_upload_files **out)
{
	const int n = moet_ckpt_shard_count(ck);
	moet_upload_files *f = calloc(1, sizeof(*f));
	int rc = 0;
	if (!f || !(f->file = calloc((size_t)(n ? n : 1), sizeof(*f->file))) ||
	    !(f->map = calloc((size_t)(n ? n : 1), sizeof(*f->map)))) {
		rc = moet_err(MOET_ENOMEM, "upload: table of %d shard files", n);
		goto fail;
	}
	f->n = n;
	for (int i = 0; i < n; i++)
		f->file[i] = (moet_upload_file){ -1, moet_ckpt_shard_path(ck, i) };
	for (int i = 0; i < n; i++) {
		if ((f->file[i].fd = open(f->file[i].path, O_RDONLY | O_CLOEXEC)) < 0) {
			rc = moet_err(MOET_EIO, "upload: %s: open: %s", f->file[i].path,
				      strerror(errno));
			goto fail;
		}
	}
	if ((rc = moet_uring_shard_maps(ck, f->map)))
		goto fail;
	*out = f;
	return 0;
fail:
	moet_upload_files_close(f);
	return rc;
}

int moet_upload_files_locate(const moet_upload_files *f, const void *src, size_t bytes,
			     moet_upload_from *out, int *out_shard)
{
	int shard = -1;
	uint64_t off = 0;
	int rc = moet_uring_locate(f->map, f->n, src, bytes, &shard, &off);
	if (rc)
		return rc;
	*out = (moet_upload_from){ &f->file[shard], off };
	if (out_shard)
		*out_shard = shard;
	return 0;
}

const moet_upload_file *moet_upload_files_at(const moet_upload_files *f, int i)
{
	return i >= 0 && i < f->n ? &f->file[i] : NULL;
}
