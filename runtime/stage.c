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
 * allocated once). The copy's source is the mapped checkpoint (pageable memory). Two ways to
 * copy (MOET_STAGE_COPY):
 *   driver  (the reference path) a cudaMemcpyAsync per part on the copy stream: the driver
 *           stages pageable memory through its own pinned buffer (6.6 GB/s measured on the
 *           H200, docs/staging.md); the ring above, one expert at a time;
 *   pinned  (the default on a GPU) an uploader (runtime/upload.c: pinned buffers filled by
 *           several threads, made at the first staged expert and kept), which returns once
 *           the bytes are on the device. With a ring of 2W slots the experts go in waves of
 *           W, one uploader run per wave into one half of the ring while the kernels of the
 *           wave before compute from the other half:
 *             run(wave 0 -> half 0); for w: kernels of wave w (half w % 2), marks used;
 *             run(wave w + 1 -> half (w + 1) % 2) after the used marks of wave w - 1
 *           (one run per expert kept the uploader's pipeline short: filled, then drained, every
 *           44 MB). On the CPU backend the uploader copies host to host (the simulated
 *           devices' test double of the same waves: tests/runtime/test_hybrid_stage.c).
 * Same bytes either way. The copies' own time goes to ns_link: a driver copy on a GPU is
 * bracketed by two marks on the copy stream (read when the slot is next filled, or by
 * moet_stage_take_link), so that it is the link's time whatever the host did meanwhile.
 * With moet_stage_set_dev_wait (the decode balance, hybrid.c) a
 * driver copy's kernel waits for its copied mark on the device (the stream waits for the
 * event) instead of on the host, so the driving thread queues on while the bytes cross
 * (NOTE: the CUDA backend's next grouped call still waits on the host for this call's token
 * upload, queued behind that wait: only the last expert of a run is left in flight).
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
	void *ev_start;                 /* driver copies: the mark before the slot's last copy */
	int copied, used;               /* a mark is pending on the event */
	int timed;                      /* ev_start .. ev_copied not read into ns_link yet */
} stage_slot;

struct moet_stage {
	int n_slots;
	int cuda;                       /* 1: the backend's memory is a GPU's */
	int pinned;                     /* MOET_STAGE_COPY=pinned: waves through the uploader */
	int dev_wait;                   /* a kernel waits for its copy on the device, not here */
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
		moet_gpu_event_destroy(sl->ev_start);
	}
	moet_gpu_stream_destroy(s->stream);
	moet_uploader_destroy(s->up);
	free(s->table);
	free(s);
}

int moet_stage_copy_pinned(int on_gpu, int *out_pinned)
{
	static const char *const copies[] = { NULL, "driver", "pinned" };
	int i = 0, rc = moet_env_choice("MOET_STAGE_COPY", copies, 3, &i);
	*out_pinned = i == 2 || (i == 0 && on_gpu);
	return rc;
}

int moet_stage_create(moet_backend *be, int n_slots, int pinned, int64_t n_experts,
		      moet_stage **out)
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
	s->pinned = pinned;
	if (s->cuda && !s->pinned && (rc = moet_gpu_stream_create(&s->stream)))
		goto fail;
	for (int i = 0; s->cuda && i < n_slots; i++)
		if ((rc = moet_gpu_event_create(&s->slot[i].ev_copied)) ||
		    (rc = moet_gpu_event_create(&s->slot[i].ev_used)) ||
		    (rc = moet_gpu_event_create(&s->slot[i].ev_start)))
			goto fail;
	*out = s;
	return 0;
fail:
	moet_stage_destroy(s, be);
	return moet_err_prefix(rc, "staging slots");
}

void moet_stage_set_dev_wait(moet_stage *s, int on)
{
	s->dev_wait = on != 0;
}

/* Waits for a slot's pending mark (CUDA); the time to ct->ns_wait. */
static int wait_mark(void *ev, int *pending, moet_stage_counts *ct)
{
	if (!*pending)
		return 0;
	*pending = 0;
	const uint64_t t0 = moet_now_ns();
	int rc = moet_gpu_event_sync(ev);
	ct->ns_wait += moet_now_ns() - t0;
	return rc;
}

/* The device's time in slot sl's last driver copy into ct->ns_link, once (waits for it). */
static int take_link(stage_slot *sl, moet_stage_counts *ct)
{
	if (!sl->timed)
		return 0;
	sl->timed = 0;
	float ms = 0;
	int rc = moet_gpu_event_sync(sl->ev_copied);
	if (!rc && !(rc = moet_gpu_event_elapsed_ms(sl->ev_start, sl->ev_copied, &ms)) && ms > 0)
		ct->ns_link += (uint64_t)((double)ms * 1e6);
	return rc;
}

int moet_stage_take_link(moet_stage *s, moet_stage_counts *ct)
{
	int rc = 0;
	for (int i = 0; s && i < s->n_slots; i++) {
		int r = take_link(&s->slot[i], ct);
		rc = rc ? rc : r;
	}
	return rc;
}

/*
 * Expert src's parts into slot i (after the slot's last kernel is done; its memory grown to
 * them); view: the slot's copies. driver: the copies queued on the copy stream, then the
 * slot's copied mark; pinned: the copies appended to items[*n_items] for the caller's
 * uploader run (no mark: the run returns once they are done).
 */
static int put(moet_stage *s, moet_backend *be, int i, const moet_ffn_w *src, moet_ffn_w *view,
	       moet_upload_item *items, int *n_items, moet_stage_counts *ct)
{
	stage_slot *sl = &s->slot[i];
	const moet_mat *in[3] = { &src->gate, &src->up, &src->down };
	moet_mat *o[3] = { &view->gate, &view->up, &view->down };
	int rc = wait_mark(sl->ev_used, &sl->used, ct);
	const int dev = s->cuda && !s->pinned; /* timed on the copy stream */
	if (!rc && dev && !(rc = take_link(sl, ct)))
		rc = moet_gpu_event_record(sl->ev_start, s->stream);
	const uint64_t t0 = moet_now_ns();
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
			if (s->pinned)
				items[(*n_items)++] = (moet_upload_item){ from[j], sl->mem[p], bytes[j] };
			else
				rc = s->cuda ? moet_gpu_copy_h2d_async(sl->mem[p], from[j], bytes[j],
								       s->stream)
					     : be->ops->upload(be, sl->mem[p], from[j], bytes[j]);
			ct->bytes += bytes[j];
		}
		o[m]->data = sl->mem[2 * m];
		o[m]->scale_inv = in[m]->scale_inv ? sl->mem[2 * m + 1] : NULL;
	}
	if (!rc && dev && !(rc = moet_gpu_event_record(sl->ev_copied, s->stream)))
		sl->copied = sl->timed = 1;
	const uint64_t t1 = moet_now_ns();
	ct->ns_copy += t1 - t0;
	if (!s->cuda && !s->pinned) /* host copies: done on return */
		ct->ns_link += t1 - t0;
	return rc;
}

/* The pinned copies of items[n]: returns once they are all done. */
static int up_run(moet_stage *s, const moet_upload_item *items, int n, moet_stage_counts *ct)
{
	const uint64_t t0 = moet_now_ns();
	int rc = 0;
	if (!s->up) {
		/* NOTE: half the cores fill: the CPU tier's team may be at work meanwhile */
		const moet_upload_opts o = { .host_dst = !s->cuda };
		rc = moet_uploader_create((moet_upload_default_threads() + 1) / 2, &o, &s->up);
	}
	if (!rc && n > 0)
		rc = moet_uploader_run(s->up, items, n, NULL, NULL);
	const uint64_t dt = moet_now_ns() - t0;
	ct->ns_copy += dt;
	ct->ns_link += dt; /* done on return */
	return rc;
}

/* The pairs of the expert at pairs[q]: how many follow in a run (pairs sorted by expert). */
static int64_t run_of(const moet_expert_pair *pairs, int64_t q, int64_t cnt)
{
	int64_t k = 1;
	while (q + k < cnt && pairs[q + k].expert == pairs[q].expert)
		k++;
	return k;
}

/* The kernel of the expert at pairs[q .. q + k) from slot i (copied), then the slot's used
 * mark. */
static int compute(moet_stage *s, moet_backend *be, int i, const moet_expert_pair *pairs,
		   int64_t q, int64_t k, int64_t top_k, const float *h, int64_t n, float *y,
		   int64_t H, moet_stage_counts *ct)
{
	stage_slot *sl = &s->slot[i];
	int rc;
	if (s->dev_wait && sl->copied) { /* the stream waits: the driving thread goes on */
		rc = moet_gpu_stream_wait_event(NULL, sl->ev_copied);
		sl->copied = 0;
	} else {
		rc = wait_mark(sl->ev_copied, &sl->copied, ct);
	}
	if (!rc)
		rc = be->ops->experts_grouped(be, s->table, pairs + q, k, top_k, h, n, y + q * H);
	if (!rc && s->cuda && !(rc = moet_gpu_event_record(sl->ev_used, NULL)))
		sl->used = 1;
	ct->experts++;
	return rc;
}

/* The ring, one expert at a time: the next expert's copy queued while this one computes. */
static int run_ring(moet_stage *s, moet_backend *be, const moet_ffn_w *host,
		    const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
		    int64_t n, float *y, int64_t H, moet_stage_counts *ct)
{
	moet_upload_item items[STAGE_PARTS];
	int n_items = 0, next = 0;
	int rc = put(s, be, 0, &host[pairs[0].expert], &s->table[pairs[0].expert], items,
		     &n_items, ct);
	if (!rc && s->pinned)
		rc = up_run(s, items, n_items, ct);
	for (int64_t q = 0; q < cnt && !rc;) {
		const int cur = next;
		const int64_t k = run_of(pairs, q, cnt);
		rc = compute(s, be, cur, pairs, q, k, top_k, h, n, y, H, ct);
		q += k;
		next = (cur + 1) % s->n_slots;
		if (!rc && q < cnt) {
			/* NOTE: one slot (the shadow check): the view is rewritten by the put, so
			 * this expert's kernel must be done first; put waits its used mark */
			n_items = 0;
			rc = put(s, be, next, &host[pairs[q].expert], &s->table[pairs[q].expert],
				 items, &n_items, ct);
			if (!rc && s->pinned)
				rc = up_run(s, items, n_items, ct);
		}
	}
	return rc;
}

/* The next wave, up to W experts from pairs[*q_up], into slots s0 .. s0 + W - 1: one uploader
 * run; its experts' pair runs (start, count) into wq, wk, their number into *wn. */
static int upload_wave(moet_stage *s, moet_backend *be, const moet_ffn_w *host,
		       const moet_expert_pair *pairs, int64_t cnt, int64_t *q_up, int s0, int W,
		       int64_t *wq, int64_t *wk, int *wn, moet_stage_counts *ct)
{
	moet_upload_item items[MOET_STAGE_MAX_SLOTS / 2 * STAGE_PARTS];
	int n_items = 0, rc = 0;
	for (*wn = 0; !rc && *wn < W && *q_up < cnt; ++*wn) {
		const int64_t k = run_of(pairs, *q_up, cnt);
		const int32_t e = pairs[*q_up].expert;
		rc = put(s, be, s0 + *wn, &host[e], &s->table[e], items, &n_items, ct);
		wq[*wn] = *q_up, wk[*wn] = k;
		*q_up += k;
	}
	return rc ? rc : up_run(s, items, n_items, ct);
}

/* The pinned copies in waves of W = n_slots / 2 experts (the top of this file). */
static int run_waves(moet_stage *s, moet_backend *be, const moet_ffn_w *host,
		     const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
		     int64_t n, float *y, int64_t H, moet_stage_counts *ct)
{
	enum { WMAX = MOET_STAGE_MAX_SLOTS / 2 };
	const int W = s->n_slots / 2;
	int64_t wq[2][WMAX], wk[2][WMAX]; /* each half's wave: its experts' pair runs */
	int wn[2] = { 0, 0 };
	int64_t q_up = 0; /* the first pair not yet uploaded */
	int rc = upload_wave(s, be, host, pairs, cnt, &q_up, 0, W, wq[0], wk[0], &wn[0], ct);
	for (int half = 0; !rc && wn[half] > 0; half ^= 1) {
		/* the kernels of this half's wave, then the next wave into the other half */
		for (int i = 0; !rc && i < wn[half]; i++)
			rc = compute(s, be, half * W + i, pairs, wq[half][i], wk[half][i], top_k, h,
				     n, y, H, ct);
		wn[half] = 0;
		const int other = half ^ 1;
		if (!rc)
			rc = upload_wave(s, be, host, pairs, cnt, &q_up, other * W, W, wq[other],
					 wk[other], &wn[other], ct);
	}
	return rc;
}

int moet_stage_run(moet_stage *s, moet_backend *be, const moet_ffn_w *host,
		   const moet_expert_pair *pairs, int64_t cnt, int64_t top_k, const float *h,
		   int64_t n, float *y, int64_t H, moet_stage_counts *ct)
{
	for (int64_t q = 0; q < cnt; q++)
		if (pairs[q].expert < 0 || pairs[q].expert >= s->n_experts)
			return moet_err(MOET_EINVAL, "staging: expert %d of %lld", pairs[q].expert,
					(long long)s->n_experts);
	if (cnt <= 0)
		return 0;
	int rc = s->pinned && s->n_slots >= 2
			 ? run_waves(s, be, host, pairs, cnt, top_k, h, n, y, H, ct)
			 : run_ring(s, be, host, pairs, cnt, top_k, h, n, y, H, ct);
	if (rc) { /* nothing of this call may still read the slots */
		for (int i = 0; i < s->n_slots; i++) {
			wait_mark(s->slot[i].ev_copied, &s->slot[i].copied, ct);
			wait_mark(s->slot[i].ev_used, &s->slot[i].used, ct);
		}
	}
	return rc;
}
