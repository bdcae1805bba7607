/*
 * draw.c: the next tokens from rows of logits that live in backend memory (moet_backend.h,
 * moet_backend_draw): on the backend when it can sample (the CUDA backend: gpu/sample.cu,
 * the same tokens as moet_sample, only ids cross PCIe), otherwise on the host.
 *
 * MOET_SAMPLE_DEVICE=0 forces the host path (the reference: download each row, moet_sample);
 * 1, or none, lets a backend with a sample op use it; any other value is refused (MOET_EINVAL
 * naming it, on every backend). Both paths give the same ids (tests/gpu/test_gpu_sample.c
 * compares them).
 */
#include <stdlib.h>

#include "moet_backend.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_sample.h"

int moet_backend_draw(moet_backend *be, const float *logits, int64_t V, const moet_draw *d,
		      int64_t n)
{
	if (n <= 0)
		return 0;
	if (V < 1 || !logits || !d)
		return moet_err(MOET_EINVAL, "draw: %lld rows of %lld logits", (long long)n,
				(long long)V);
	static const char *const names[] = { "1", "0" };
	int host = 0, rc = moet_env_choice("MOET_SAMPLE_DEVICE", names, 2, &host);
	if (rc)
		return rc;
	if (be->ops->sample && !host)
		return be->ops->sample(be, logits, V, d, n);
	float *row = malloc((size_t)V * sizeof(*row));
	int64_t *scratch = malloc((size_t)V * sizeof(*scratch));
	if (!row || !scratch)
		rc = moet_err(MOET_ENOMEM, "draw: a row of %lld logits", (long long)V);
	for (int64_t r = 0; r < n && !rc; r++) {
		rc = be->ops->download(be, row, logits + d[r].row * V, (size_t)V * sizeof(*row));
		if (!rc)
			rc = moet_sample(row, V, d[r].p, d[r].pos, scratch, d[r].out_id);
	}
	free(row);
	free(scratch);
	return rc;
}
