/*
 * remote.c: the expert tiers of the GPUs beyond the backend's own (placement devices g >= 1,
 * CUDA device g). Each holds only the experts the placement gives it, uploaded at placement
 * time, and computes them with the same contract kernel, so the bits equal every other tier's.
 *
 *   begin   h (home GPU, n rows) -> this GPU (a peer copy: direct over NVLink/PCIe P2P where
 *           the devices have it, else staged through the host by the driver, as on GeForce
 *           cards); the grouped expert kernel queued there, then the call's event; returns at
 *           once
 *   finish  waits for the call's event; its y rows -> the home GPU's y (peer copy)
 *
 * One call in flight per micro-batch slot (forward.c's two micro-batches), each with its own
 * rows, outputs and event, so slot 1's call can be queued before slot 0's is collected. The
 * dense part and the combine stay on the home GPU (device 0).
 *
 * NOTE: the CUDA runtime's current device is per thread; every entry here selects this
 * tier's device and gives the home device back before returning.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_int.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"

typedef struct rcall {
	float *h, *y;         /* be memory: [cap_rows][H], [cap_pairs][H] */
	int64_t cap_rows, cap_pairs;
	float *y_dst;         /* home y rows of the call in flight */
	int64_t pending;
	void *ev;             /* after its kernel, on this device */
} rcall;

struct moet_remote {
	int device;
	moet_backend *be;     /* the CUDA backend of this device */
	moet_ffn_w *table;    /* [layers x E]: bound on be for the experts owned here */
	rcall call[MOET_HYBRID_SLOTS];
	void **blocks;        /* be memory of the owned experts (moet_bind_staged) */
	int n_blocks;
	int64_t H;
	double upload_bytes, upload_s;
};

void moet_remote_destroy(moet_remote *r)
{
	if (!r)
		return;
	if (r->be) {
		moet_gpu_set_device(r->device);
		for (int s = 0; s < MOET_HYBRID_SLOTS; s++) {
			r->be->ops->free(r->be, r->call[s].h);
			r->be->ops->free(r->be, r->call[s].y);
			moet_gpu_event_destroy(r->call[s].ev);
		}
		for (int i = 0; i < r->n_blocks; i++)
			r->be->ops->free(r->be, r->blocks[i]);
		moet_backend_destroy(r->be);
		moet_gpu_set_device(0);
	}
	free(r->blocks);
	free(r->table);
	free(r);
}

/* Binds the experts of device g on r->be (current device: g). */
static int bind_owned(moet_remote *r, const moet_model *m, int g, const int16_t *owner)
{
	const moet_config *c = &m->cfg;
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts;
	int64_t n = 0;
	for (int64_t i = 0; i < L * E; i++)
		n += owner[i] == g && m->layers[i / E].is_moe;
	moet_mat *host = malloc((size_t)(3 * n + 1) * sizeof(*host));
	moet_mat *dev = malloc((size_t)(3 * n + 1) * sizeof(*dev));
	int rc = (!host || !dev) ? moet_err(MOET_ENOMEM, "GPU %d: upload list", g) : 0;
	int64_t k = 0;
	for (int64_t i = 0; !rc && i < L * E; i++) {
		if (owner[i] != g || !m->layers[i / E].is_moe)
			continue;
		const moet_ffn_w *h = &m->layers[i / E].experts_host[i % E];
		host[k++] = h->gate;
		host[k++] = h->up;
		host[k++] = h->down;
	}
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!rc && n)
		rc = moet_bind_staged(r->be, m->ck, host, 3 * n, dev, &r->blocks, &r->n_blocks,
				      NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	r->upload_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
	k = 0;
	for (int64_t i = 0; !rc && i < L * E; i++) {
		if (owner[i] != g || !m->layers[i / E].is_moe)
			continue;
		r->table[i] = (moet_ffn_w){ dev[k], dev[k + 1], dev[k + 2] };
		for (int j = 0; j < 3; j++, k++)
			r->upload_bytes += (double)moet_mat_data_bytes(&host[k]);
	}
	free(host);
	free(dev);
	return rc;
}

int moet_remote_create(const moet_model *m, int g, const int16_t *owner, moet_remote **out)
{
	const moet_config *c = &m->cfg;
	moet_remote *r = calloc(1, sizeof(*r));
	if (!r)
		return moet_err(MOET_ENOMEM, "GPU %d tier", g);
	r->device = g;
	r->H = c->hidden_size;
	int rc = 0;
	if (!(r->table = calloc((size_t)(c->num_hidden_layers * c->n_routed_experts),
				sizeof(*r->table)))) {
		rc = moet_err(MOET_ENOMEM, "GPU %d expert table", g);
		goto fail;
	}
	if ((rc = moet_gpu_set_device(g)) || (rc = moet_backend_cuda_create(g, &r->be)))
		goto fail;
	for (int s = 0; s < MOET_HYBRID_SLOTS; s++)
		if ((rc = moet_gpu_event_create(&r->call[s].ev)))
			goto fail;
	if ((rc = bind_owned(r, m, g, owner)))
		goto fail;
	moet_gpu_set_device(0);
	*out = r;
	return 0;
fail:
	rc = moet_err_prefix(rc, "placement device %d (CUDA device %d)", g, g);
	moet_remote_destroy(r);
	moet_gpu_set_device(0);
	return rc;
}

const moet_ffn_w *moet_remote_table(const moet_remote *r)
{
	return r->table;
}

/* The call's buffers grown to rows and pairs (be memory, kept). */
static int grow(moet_remote *r, rcall *c, int64_t rows, int64_t pairs)
{
	const size_t row = (size_t)r->H * sizeof(float);
	int rc;
	if (rows > c->cap_rows) {
		r->be->ops->free(r->be, c->h);
		c->h = NULL;
		c->cap_rows = 0;
		if ((rc = r->be->ops->alloc(r->be, (size_t)rows * row, (void **)&c->h)))
			return rc;
		c->cap_rows = rows;
	}
	if (pairs > c->cap_pairs) {
		r->be->ops->free(r->be, c->y);
		c->y = NULL;
		c->cap_pairs = 0;
		if ((rc = r->be->ops->alloc(r->be, (size_t)pairs * row, (void **)&c->y)))
			return rc;
		c->cap_pairs = pairs;
	}
	return 0;
}

int moet_remote_begin(moet_remote *r, int slot, int64_t l, int64_t E,
		      const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
		      int64_t n, float *y_dst)
{
	const size_t row = (size_t)r->H * sizeof(float);
	int rc;
	if (slot < 0 || slot >= MOET_HYBRID_SLOTS)
		return moet_err(MOET_EINVAL, "GPU %d tier: slot %d", r->device, slot);
	rcall *c = &r->call[slot];
	if (c->pending)
		return moet_err(MOET_EINVAL, "GPU %d tier: begin with a call in flight", r->device);
	if (cnt <= 0)
		return 0;
	if ((rc = moet_gpu_set_device(r->device)))
		return rc;
	if (!(rc = grow(r, c, n, cnt)) &&
	    !(rc = moet_gpu_copy_peer_async(c->h, r->device, h, 0, (size_t)n * row, NULL)) &&
	    !(rc = r->be->ops->experts_grouped(r->be, r->table + l * E, pairs, cnt, top_k, c->h,
					       n, c->y)))
		rc = moet_gpu_event_record(c->ev, NULL);
	int r0 = moet_gpu_set_device(0);
	if (rc || (rc = r0))
		return moet_err_prefix(rc, "GPU %d tier", r->device);
	c->y_dst = y_dst;
	c->pending = cnt;
	return 0;
}

int moet_remote_finish(moet_remote *r, int slot)
{
	if (!r || slot < 0 || slot >= MOET_HYBRID_SLOTS || !r->call[slot].pending)
		return 0;
	rcall *c = &r->call[slot];
	const size_t bytes = (size_t)c->pending * (size_t)r->H * sizeof(float);
	int rc = moet_gpu_event_sync(c->ev);
	if (!rc)
		rc = moet_gpu_copy_peer_async(c->y_dst, 0, c->y, r->device, bytes, NULL);
	c->pending = 0;
	return rc ? moet_err_prefix(rc, "GPU %d tier", r->device) : 0;
}

void moet_remote_upload_stats(const moet_remote *r, double *bytes, double *seconds)
{
	*bytes += r->upload_bytes;
	*seconds += r->upload_s;
}
