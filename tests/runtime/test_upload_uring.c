/*
 * test_upload_uring.c: the uring upload source (runtime/upload_uring.c) with host
 * destinations (the CPU backend's form: staging from aligned_alloc, copies by memcpy).
 *
 *   bytes     every routed expert's matrices of a several-shard checkpoint, bound through
 *             the upload, are memcmp-equal to the checkpoint's bytes (its read-only mapping
 *             of the files, which the upload never reads): with staging buffers smaller than
 *             one expert (8 KiB) and holding many (4 MiB), 2 and 4 buffers, O_DIRECT and
 *             buffered; some tensors start off a 4096 boundary (checked)
 *   faults    a short read is retried (same bytes); EIO / ENOSPC on a read fail the call with
 *             one line naming the shard path and the offset, and out[] stays untouched
 *   refusals  a matrix outside the mapping (MOET_ERANGE), a bad MOET_UPLOAD value
 *   model     logits with MOET_UPLOAD=uring equal those with MOET_UPLOAD=staged (placement
 *             over two simulated devices and the CPU); an EIO during the placement's upload
 *             fails it with the shard named, and the next placement works
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"
#include "moet_upload.h"
#include "moet_uring.h"

#define SEQS 3
#define STEPS 3

/* The routed experts' weight matrices of the checkpoint, with their scales: host views. */
static int64_t expert_mats(const moet_ckpt *ck, moet_mat *out, int64_t cap, int *n_unaligned)
{
	int64_t n = 0;
	*n_unaligned = 0;
	for (size_t i = 0; i < moet_ckpt_count(ck) && n < cap; i++) {
		const moet_tensor *t = moet_ckpt_at(ck, i);
		size_t len = strlen(t->name);
		if (!strstr(t->name, ".experts.") || len < 7 || strcmp(t->name + len - 7, ".weight"))
			continue;
		char sname[300];
		snprintf(sname, sizeof(sname), "%s_scale_inv", t->name);
		const moet_tensor *s = moet_ckpt_get(ck, sname);
		out[n] = (moet_mat){ .dtype = t->dtype, .rows = t->shape[0], .cols = t->shape[1],
				     .data = t->data, .scale_inv = s ? s->data : NULL };
		/* the mapping starts on a page: this is the file offset's residue */
		*n_unaligned += (uintptr_t)t->data % 4096 != 0;
		n++;
	}
	return n;
}

/* 1 if every out[i] holds host[i]'s bytes (data and scales) and its shape. */
static int same_bytes(const moet_mat *host, const moet_mat *out, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		size_t b = moet_mat_data_bytes(&host[i]), sb = moet_mat_scale_bytes(&host[i]);
		if (out[i].rows != host[i].rows || out[i].cols != host[i].cols ||
		    out[i].dtype != host[i].dtype || out[i].data == host[i].data ||
		    memcmp(out[i].data, host[i].data, b) ||
		    (sb && memcmp(out[i].scale_inv, host[i].scale_inv, sb))) {
			const unsigned char *a = host[i].data, *c = out[i].data;
			size_t k = 0;
			while (k < b && a[k] == c[k])
				k++;
			fprintf(stderr, "matrix %lld: first mismatch at byte %zu of %zu\n",
				(long long)i, k, b);
			return 0;
		}
	}
	return 1;
}

static void upload_variants(const moet_ckpt *ck, const moet_mat *host, int64_t n)
{
	const size_t bytes = moet_upload_block_bytes(host, n);
	void *block = aligned_alloc(4096, bytes);
	moet_mat *out = calloc((size_t)n, sizeof(*out));
	CHECK(block && out, "alloc");
	if (!block || !out)
		return;
	const size_t expert = moet_mat_data_bytes(&host[0]) * 3;
	const size_t bufs[2] = { 8 << 10, 4 << 20 };
	CHECK(bufs[0] < expert && bufs[1] > 4 * expert, "staging sizes: %zu and %zu vs an "
	      "expert of %zu bytes", bufs[0], bufs[1], expert);
	for (int v = 0; v < 8; v++) {
		moet_upload_uring_opts o = { .buf_bytes = bufs[v & 1], .n_bufs = v & 2 ? 2 : 4,
					     .direct = v & 4 ? MOET_URING_DIRECT_OFF : 0,
					     .host_dst = 1, .progress = -1 };
		moet_upload_stats st;
		memset(block, 0xa5, bytes);
		memset(out, 0, (size_t)n * sizeof(*out));
		int rc = moet_upload_mats_uring(ck, host, n, block, &o, out, &st);
		CHECK(rc == 0, "variant %d: %s", v, moet_errmsg());
		CHECK(rc == 0 && same_bytes(host, out, n), "variant %d (buffer %zu bytes, %d "
		      "buffers, %s): bound bytes equal the checkpoint's", v, o.buf_bytes, o.n_bufs,
		      v & 4 ? "buffered" : "direct");
		CHECK(st.read_bytes >= st.bytes && st.copies >= (uint64_t)n, "variant %d: read "
		      "%llu of %zu bytes, %llu copies", v, (unsigned long long)st.read_bytes,
		      st.bytes, (unsigned long long)st.copies);
		if (v == 0)
			printf("upload: %lld matrices, %zu bytes, %llu reads, %llu copies, direct "
			       "%d\n", (long long)n, st.bytes, (unsigned long long)st.reads,
			       (unsigned long long)st.copies, st.direct);
	}
	/* faults: short reads are retried; EIO and ENOSPC fail with the shard and offset */
	const char *faults[3] = { "short@2,short@5", "eio@3", "enospc@1" };
	for (int f = 0; f < 3; f++) {
		setenv("MOET_URING_FAULT", faults[f], 1);
		moet_upload_uring_opts o = { .buf_bytes = 8 << 10, .host_dst = 1, .progress = -1 };
		memset(out, 0, (size_t)n * sizeof(*out));
		int rc = moet_upload_mats_uring(ck, host, n, block, &o, out, NULL);
		unsetenv("MOET_URING_FAULT");
		if (f == 0) {
			CHECK(rc == 0 && same_bytes(host, out, n), "short reads: %s", moet_errmsg());
			continue;
		}
		const char *msg = moet_errmsg();
		CHECK(rc == MOET_EIO, "%s: rc %d", faults[f], rc);
		CHECK(strstr(msg, moet_ckpt_shard_path(ck, 0)) || strstr(msg, ".safetensors"),
		      "%s: the shard is named: %s", faults[f], msg);
		CHECK(strstr(msg, "at offset") && strstr(msg, f == 1 ? "Input/output error" :
							  "No space left"), "%s: %s", faults[f], msg);
		CHECK(!strchr(msg, '\n'), "one line: %s", msg);
		int untouched = 1;
		for (int64_t i = 0; i < n; i++)
			untouched &= out[i].data == NULL;
		CHECK(untouched, "%s: nothing bound", faults[f]);
		printf("%s: %s\n", faults[f], msg);
	}
	/* a matrix that is not the checkpoint's bytes */
	moet_mat bad = host[0];
	bad.data = block;
	CHECK(moet_upload_mats_uring(ck, &bad, 1, block, NULL, out, NULL) == MOET_ERANGE,
	      "matrix outside the mapping refused");
	free(block);
	free(out);
}

static int run(moet_model *m, float *out)
{
	return moet_test_ragged_run(m, SEQS, STEPS, 1, out);
}

static void model_logits(const char *dir)
{
	moet_model *m = NULL;
	CHECK(moet_model_open(dir, &m) == 0, "open: %s", moet_errmsg());
	if (!m)
		return;
	const moet_config *c = moet_model_config(m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n_log = (size_t)((STEPS + 1) * SEQS * V);
	float *ref = malloc(n_log * sizeof(float)), *got = malloc(n_log * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	uint64_t r = 12345;
	for (int64_t i = 0; i < L * E; i++) {
		moet_test_xorshift64(&r);
		own[i] = (int16_t)((int)(r % 3) - 1); /* CPU, device 0, device 1 */
	}
	setenv("MOET_UPLOAD", "staged", 1);
	CHECK(moet_model_set_placement(m, own, 2) == 0, "staged: %s", moet_errmsg());
	CHECK(run(m, ref) == 0, "staged run: %s", moet_errmsg());
	setenv("MOET_UPLOAD", "uring", 1);
	setenv("MOET_UPLOAD_BUF_KB", "16", 1);
	CHECK(moet_model_set_placement(m, own, 2) == 0, "uring: %s", moet_errmsg());
	memset(got, 0, n_log * sizeof(float));
	CHECK(run(m, got) == 0 && memcmp(ref, got, n_log * sizeof(float)) == 0,
	      "MOET_UPLOAD=uring: logits equal MOET_UPLOAD=staged's");
	setenv("MOET_URING_FAULT", "eio@4", 1);
	int rc = moet_model_set_placement(m, own, 2);
	unsetenv("MOET_URING_FAULT");
	CHECK(rc == MOET_EIO && strstr(moet_errmsg(), ".safetensors: read of"),
	      "EIO during the placement's upload: %d %s", rc, moet_errmsg());
	CHECK(moet_model_set_placement(m, own, 2) == 0, "after the fault: %s", moet_errmsg());
	memset(got, 0, n_log * sizeof(float));
	CHECK(run(m, got) == 0 && memcmp(ref, got, n_log * sizeof(float)) == 0,
	      "after the fault: logits equal");
	setenv("MOET_UPLOAD", "fast", 1);
	CHECK(moet_model_set_placement(m, own, 2) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "MOET_UPLOAD='fast'"), "bad MOET_UPLOAD: %s", moet_errmsg());
	unsetenv("MOET_UPLOAD");
	unsetenv("MOET_UPLOAD_BUF_KB");
	moet_model_close(m);
	free(ref);
	free(got);
	free(own);
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 9;
	gp.shard_mb = 1; /* several shards */
	char *dir = moet_test_gen("upload-uring", &gp);
	moet_ckpt *ck = NULL;
	CHECK(dir && moet_ckpt_open(dir, &ck) == 0, "ckpt: %s", moet_errmsg());
	if (!ck)
		return moet_test_done("test_upload_uring");
	CHECK(moet_ckpt_shard_count(ck) > 1, "%d shards", moet_ckpt_shard_count(ck));
	const int64_t cap = (int64_t)moet_ckpt_count(ck);
	moet_mat *host = malloc((size_t)cap * sizeof(*host));
	int unaligned = 0;
	int64_t n = host ? expert_mats(ck, host, cap, &unaligned) : 0;
	CHECK(n > 0 && unaligned > 0, "%lld expert matrices, %d off a 4096 boundary", (long long)n,
	      unaligned);
	if (n > 0)
		upload_variants(ck, host, n);
	moet_ckpt_close(ck);
	free(host);
	model_logits(dir);
	free(dir);
	return moet_test_done("test_upload_uring");
}
