/*
 * stage.c: cold experts computed by the backend from staging slots: one expert's bytes (gate,
 * up, down codes and their scales) copied from the host views (the checkpoint's mapping) into
 * a slot of backend memory, then the backend's own grouped kernel on them. The one mechanism
 * behind the shadow check (shadow.c: one slot) and the prefill staging of cold experts
 * (hybrid.c: a ring of slots).
 *
 *   expert j:   wait copied[j % S]; experts_grouped on slot j % S; mark used[j % S]
 *   expert j+1: wait used[(j+1) % S] (the kernel of expert j+1-S); copy into slot (j+1) % S
 *               (in flight while expert j computes); mark copied[(j+1) % S]
 *
 * On a GPU backend the copies go on a copy stream of their own and the marks are CUDA events
 * (copied: on the copy stream; used: on the legacy default stream, the backend's), so the copy
 * of the next expert overlaps the current one's kernel; the host waits only at the marks. On
 * the CPU backend (the simulated devices) a copy is a memcpy and the marks are no-ops. The
 * bytes computed on are the checkpoint's, verbatim, by the contract kernel: the rows equal the
 * CPU tier's bit for bit (tests/runtime/test_hybrid_stage.c, test_gpu_hybrid).
 *
 * Slots grow to the largest expert seen and are kept (every expert of a model has one size:
 * allocated once). The copy's source is the mapped checkpoint (pageable memory). On a GPU,
 * by default (MOET_STAGE_COPY=driver, the reference path), a cudaMemcpyAsync per part on the
 * copy stream: the driver stages pageable memory through its own pinned buffer (6.6 GB/s
 * measured on the H200, docs/hybrid.md). MOET_STAGE_COPY=pinned sends it through an uploader
 * instead (runtime/upload.c: pinned buffers filled by several threads, made at the first
 * staged expert and kept) that returns once the bytes are on the device. Same bytes either
 * way. NOTE: pinned is opt-in until test_gpu_hybrid has passed with it on a GPU (at 6eaec04
 * its copies failed where two slot parts were adjacent allocations; fixed in cd7e557, not
 * yet run there).
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_gpu_host.h"
#include "moet_upload.h"

#define STAGE_PARTS 6 /* gate, up, down: codes and scales */

typedef struct stage_slot {
	void *mem[STAGE_PARTS];         /* backend memory */
	size_t cap[STAGE_PARTS];        /* bytes */
	void *ev_copied, *ev_used;      /* CUDA events (GPU backends), else NULL */
	int copied, used;               /* a mark is pending on the event */
} stage_slot;

struct moet_stage {
	int n_slots;
	int cuda;                       /* 1: the backend's memory is a GPU's */
	int pinned;                     /* MOET_STAGE_COPY=pinned (CUDA; else the driver's) */
	void *stream;                   /* the copy stream (CUDA, driver copies) */
	moet_uploader *up;              /* the pinned copies (CUDA), made at the first */
	moet_ffn_w *table;              /* [E]: the staged experts' slot views */
	int64_t n_experts;
	stage_slot slot[MOET_STAGE_MAX_SLOTS];
};

void moet_stage_destroy(moet_stage *s, moet_backend *be)
{
	if (!s)
		return;
	for (int i = 0; i < s->n_slots; i++) {
		stage_slot *sl = &s->slot[i];
		if (sl->copied)
			moet_gpu_event_sync(sl->ev_copied);
		if (sl->used)
			moet_gpu_event_sync(sl->ev_used);
		for (int j = 0; j < STAGE_PARTS; j++)
			if (sl->mem[j])
				be->ops->free(be, sl->mem[j]);
		moet_gpu_event_destroy(sl->ev_copied);
		moet_gpu_event_destroy(sl->ev_used);
	}
	moet_gpu_stream_destroy(s->stream);
	moet_uploader_destroy(s->up);
	free(s->table);
	free(s);
}

int moet_stage_copy_pinned(int *out_pinned)
{
	static const char *const copies[] = { "driver", "pinned" };
	return moet_env_choice("MOET_STAGE_COPY", copies, 2, out_pinned);
}

int moet_stage_create(moet_backend *be, int n_slots, int64_t n_experts, moet_stage **out)
{
	if (n_slots < 1 || n_slots > MOET_STAGE_MAX_SLOTS || n_experts < 1)
		return moet_err(MOET_EINVAL, "staging: %d slots (1 .. %d), %lld experts", n_slots,
				MOET_STAGE_MAX_SLOTS, (long long)n_experts);
	moet_stage *s = calloc(1, sizeof(*s));
	int rc = 0;
	if (!s || !(s->table = calloc((size_t)n_experts, sizeof(*s->table)))) {
		free(s);
		return moet_err(MOET_ENOMEM, "staging slots");
	}
	s->n_slots = n_slots;
	s->n_experts = n_experts;
	s->cuda = !be->ops->host_memory;
	if ((rc = moet_stage_copy_pinned(&s->pinned)))
		goto fail;
	if (s->cuda && (rc = moet_gpu_stream_create(&s->stream)))
		goto fail;
	for (int i = 0; s->cuda && i < n_slots; i++)
		if ((rc = moet_gpu_event_create(&s->slot[i].ev_copied)) ||
		    (rc = moet_gpu_event_create(&s->slot[i].ev_used)))
			goto fail;
	*out = s;
	return 0;
fail:
	moet_stage_destroy(s, be);
	return moet_err_prefix(rc, "staging slots");
}

/* Waits for a slot's pending mark (CUDA). */
static int wait_mark(void *ev, int *pending)
{
	if (!*pending)
		return 0;
	*pending = 0;
	return moet_gpu_event_sync(ev);
}

/* Expert src's bytes into slot i (after the slot's last kernel is done); view: the copies. */
static int put(moet_stage *s, moet_backend *be, int i, const moet_ffn_w *src, moet_ffn_w *view,
	       uint64_t *bytes_out)
{
	stage_slot *sl = &s->slot[i];
	const moet_mat *in[3] = { &src->gate, &src->up, &src->down };
	moet_mat *o[3] = { &view->gate, &view->up, &view->down };
	moet_upload_item items[STAGE_PARTS];
	int n_items = 0;
	const int pinned = s->cuda && s->pinned;
	int rc = wait_mark(sl->ev_used, &sl->used);
	/* NOTE: half the cores fill: the CPU tier's team may be at work meanwhile */
	if (!rc && pinned && !s->up)
		rc = moet_uploader_create((moet_upload_default_threads() + 1) / 2, NULL, &s->up);
	for (int m = 0; m < 3 && !rc; m++) {
		size_t bytes[2] = { moet_mat_data_bytes(in[m]), moet_mat_scale_bytes(in[m]) };
		const void *from[2] = { in[m]->data, in[m]->scale_inv };
		*o[m] = *in[m];
		for (int j = 0; j < 2 && !rc; j++) {
			const int p = 2 * m + j;
			if (!bytes[j] || !from[j])
				continue;
			if (bytes[j] > sl->cap[p]) {
				if (sl->mem[p])
					be->ops->free(be, sl->mem[p]);
				sl->mem[p] = NULL;
				sl->cap[p] = 0;
				if ((rc = be->ops->alloc(be, bytes[j], &sl->mem[p])))
					break;
				sl->cap[p] = bytes[j];
			}
			if (pinned)
				items[n_items++] = (moet_upload_item){ from[j], sl->mem[p], bytes[j] };
			else
				rc = s->cuda ? moet_gpu_copy_h2d_async(sl->mem[p], from[j], bytes[j],
								       s->stream)
					     : be->ops->upload(be, sl->mem[p], from[j], bytes[j]);
			*bytes_out += bytes[j];
		}
		o[m]->data = sl->mem[2 * m];
		o[m]->scale_inv = in[m]->scale_inv ? sl->mem[2 * m + 1] : NULL;
	}
	/* the pinned copies are done when the run returns: no mark to wait for */
	if (!rc && pinned)
		rc = moet_uploader_run(s->up, items, n_items, NULL, NULL);
	else if (!rc && s->cuda && !(rc = moet_gpu_event_record(sl->ev_copied, s->stream)))
		sl->copied = 1;
	return rc;
}

int moet_stage_run(moet_stage *s, moet_backend *be, const moet_ffn_w *host,
		   const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
		   int64_t n, float *y, int64_t H, uint64_t *out_bytes, uint64_t *out_experts)
{
	int rc = 0, next = 0;
	for (int64_t q = 0; q < cnt; q++)
		if (pairs[q].expert < 0 || pairs[q].expert >= s->n_experts)
			return moet_err(MOET_EINVAL, "staging: expert %d of %lld", pairs[q].expert,
					(long long)s->n_experts);
	if (cnt > 0)
		rc = put(s, be, next, &host[pairs[0].expert], &s->table[pairs[0].expert],
			 out_bytes);
	for (int64_t q = 0; q < cnt && !rc;) {
		const int cur = next;
		const int32_t e = pairs[q].expert;
		int64_t k = 1;
		while (q + k < cnt && pairs[q + k].expert == e)
			k++;
		if ((rc = wait_mark(s->slot[cur].ev_copied, &s->slot[cur].copied)))
			break;
		rc = be->ops->experts_grouped(be, s->table, pairs + q, k, top_k, h, n, y + q * H);
		if (!rc && s->cuda && !(rc = moet_gpu_event_record(s->slot[cur].ev_used, NULL)))
			s->slot[cur].used = 1;
		++*out_experts;
		q += k;
		/* the next expert's copy, in flight while this one computes */
		next = (cur + 1) % s->n_slots;
		if (!rc && q < cnt) {
			/* NOTE: one slot (the shadow check): the view is rewritten by the put, so
			 * this expert's kernel must be done first; put waits its used mark */
			rc = put(s, be, next, &host[pairs[q].expert], &s->table[pairs[q].expert],
				 out_bytes);
		}
	}
	if (rc) { /* nothing of this call may still read the slots */
		for (int i = 0; i < s->n_slots; i++) {
			wait_mark(s->slot[i].ev_copied, &s->slot[i].copied);
			wait_mark(s->slot[i].ev_used, &s->slot[i].used);
		}
	}
	return rc;
}
