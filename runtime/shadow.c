/*
 * shadow.c: online checking of the CPU tier against the backend (issue 5: `verify --shadow`
 * for models whose experts do not all fit on the GPUs, and `serve --shadow`).
 *
 *   dispatch (a MoE layer with CPU-tier pairs): with probability `rate` one of the CPU tier's
 *             experts of this layer is picked (a counter-based draw: the same calls are
 *             checked in every run); its pairs and the rows they fill are noted
 *   finish    after the CPU tier's rows have reached y: the expert's bytes are copied into a
 *             staging slot of the backend (stage.c, the mechanism the prefill staging uses
 *             too: device memory on a GPU, one expert's worth, allocated once), the backend's
 *             own kernel computes the same pairs into a scratch, and both results come back
 *             to the host and are compared bit for bit
 *
 * Under the contract the two are equal; a mismatch (counted, its layer and expert in the
 * detail) means a broken kernel, a corrupted copy or a floating-point environment gone wrong.
 * The check costs one expert upload (44 MB at Kimi-K2 size) and one kernel call per sample.
 * MOET_SHADOW_FAULT=1 (tests only) flips a bit of the CPU tier's copy before the compare, so
 * that a test can see a mismatch counted.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_err.h"

struct moet_shadow {
	double rate;
	uint64_t draws;               /* calls considered so far (the draw's counter) */
	moet_stage *ring;             /* one staging slot (stage.c), made at the first check */
	moet_stage_counts staged;     /* what the slot received (not reported) */
	float *y_b;                   /* backend [cap][H]: the backend's rows */
	float *y_h, *y_c;             /* host [cap][H]: both results */
	int64_t cap;
	/* the pick of the call in flight, per micro-batch slot */
	struct {
		int64_t layer, expert, row, cnt, n;
		const float *h;
		float *y;
		moet_expert_pair *pairs;
		int64_t cap_pairs;
	} pick[MOET_HYBRID_SLOTS];
	moet_shadow_stats st;
};

static uint64_t mix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

void moet_shadow_destroy(moet_shadow *s, moet_backend *be)
{
	if (!s)
		return;
	moet_stage_destroy(s->ring, be);
	if (s->y_b)
		be->ops->free(be, s->y_b);
	for (int i = 0; i < MOET_HYBRID_SLOTS; i++)
		free(s->pick[i].pairs);
	free(s->y_h);
	free(s->y_c);
	free(s);
}

int moet_model_set_shadow(moet_model *m, double rate)
{
	if (!(rate >= 0 && rate <= 1))
		return moet_err(MOET_EINVAL, "shadow rate %g: expected 0 .. 1", rate);
	moet_shadow_destroy(m->shadow, m->be);
	m->shadow = NULL;
	if (rate == 0)
		return 0;
	moet_shadow *s = calloc(1, sizeof(*s));
	if (!s)
		return moet_err(MOET_ENOMEM, "shadow checker");
	s->rate = rate;
	m->shadow = s;
	return 0;
}

void moet_model_shadow_stats(const moet_model *m, moet_shadow_stats *out)
{
	if (m->shadow)
		*out = m->shadow->st;
	else
		memset(out, 0, sizeof(*out));
}

void moet_shadow_pick(moet_shadow *s, int slot, int64_t l, const moet_expert_pair *cpu,
		      int64_t cnt, int64_t cpu_row, const float *h, int64_t n, float *y)
{
	s->pick[slot].cnt = 0;
	if (cnt <= 0)
		return;
	uint64_t r = mix(s->draws++ ^ 0x5AD0ull);
	if ((double)(r >> 11) * 0x1p-53 >= s->rate)
		return;
	/* the expert of a pair drawn uniformly: busier experts are checked more often */
	int64_t q0 = (int64_t)(mix(r) % (uint64_t)cnt), a = q0, b = q0 + 1;
	while (a > 0 && cpu[a - 1].expert == cpu[q0].expert)
		a--;
	while (b < cnt && cpu[b].expert == cpu[q0].expert)
		b++;
	if (b - a > s->pick[slot].cap_pairs) {
		moet_expert_pair *np = realloc(s->pick[slot].pairs, (size_t)(b - a) * sizeof(*np));
		if (!np) {
			s->st.errors++;
			return;
		}
		s->pick[slot].pairs = np;
		s->pick[slot].cap_pairs = b - a;
	}
	memcpy(s->pick[slot].pairs, cpu + a, (size_t)(b - a) * sizeof(*cpu));
	s->pick[slot].layer = l;
	s->pick[slot].expert = cpu[q0].expert;
	s->pick[slot].row = cpu_row + a;
	s->pick[slot].cnt = b - a;
	s->pick[slot].h = h;
	s->pick[slot].n = n;
	s->pick[slot].y = y;
}

int moet_shadow_check(moet_model *m, int slot)
{
	moet_shadow *s = m->shadow;
	moet_backend *be = m->be;
	const int64_t H = m->cfg.hidden_size, k = m->cfg.num_experts_per_tok;
	if (!s || !s->pick[slot].cnt)
		return 0;
	const int64_t cnt = s->pick[slot].cnt, e = s->pick[slot].expert, l = s->pick[slot].layer;
	const size_t bytes = (size_t)(cnt * H) * sizeof(float);
	int rc = 0;
	s->pick[slot].cnt = 0;
	if (cnt > s->cap) {
		if (s->y_b)
			be->ops->free(be, s->y_b);
		s->y_b = NULL;
		free(s->y_h);
		free(s->y_c);
		s->y_h = malloc(bytes);
		s->y_c = malloc(bytes);
		s->cap = 0;
		if (!s->y_h || !s->y_c)
			rc = moet_err(MOET_ENOMEM, "shadow rows");
		if (!rc && !(rc = be->ops->alloc(be, bytes, (void **)&s->y_b)))
			s->cap = cnt;
	}
	int pinned = 0;
	if (!rc && !s->ring && !(rc = moet_stage_copy_pinned(!be->ops->host_memory, &pinned)))
		rc = moet_stage_create(be, 1, pinned, m->cfg.n_routed_experts, &s->ring);
	if (!rc)
		rc = moet_stage_run(s->ring, be, m->layers[l].experts_host, s->pick[slot].pairs,
				    cnt, k, s->pick[slot].h, s->pick[slot].n, s->y_b, H,
				    &s->staged);
	if (!rc)
		rc = be->ops->download(be, s->y_h, s->y_b, bytes);
	if (!rc)
		rc = be->ops->download(be, s->y_c, s->pick[slot].y + s->pick[slot].row * H, bytes);
	if (rc) {
		s->st.errors++;
		return moet_err_prefix(rc, "shadow check of layer %lld expert %lld", (long long)l,
				       (long long)e);
	}
	const char *fault = getenv("MOET_SHADOW_FAULT"); /* tests: a corrupted CPU row */
	if (fault && !strcmp(fault, "1")) {
		uint32_t bits;
		memcpy(&bits, s->y_c, sizeof(bits));
		bits ^= 1u;
		memcpy(s->y_c, &bits, sizeof(bits));
	}
	s->st.checks++;
	s->st.pairs += (uint64_t)cnt;
	if (memcmp(s->y_h, s->y_c, bytes)) {
		s->st.mismatches++;
		s->st.last_layer = l;
		s->st.last_expert = e;
	}
	return 0;
}
