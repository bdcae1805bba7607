/*
 * test_gpu_latent.c: MLA attention in the absorbed form on the device (gpu/attention_latent.cu)
 * against the CPU's moet_attend_latent_ref, bit for bit: both kernels (MOET_GPU_LATENT=ref,
 * fast) and the default, F8 with block scales and BF16 kv_b, tiny and Kimi-K2 heads, 1, 65,
 * 1500 and 2049 positions (one and several of the fast kernel's 1024-position score tiles),
 * every row of a batch equal to the same row alone; a bad MOET_GPU_LATENT is refused.
 * Skips (77) without a CUDA device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_cpu.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_test.h"

#include "gpu_check.h"

typedef struct {
	int64_t heads, nope, rope, dv;
} attn_dims;

/* ---- attention, absorbed form ----------------------------------------------------------- */

/* Every row has a cache of its own: n_pos[t] positions of [c | kpe | pad], random. Both
 * kernels (MOET_GPU_LATENT=ref, fast) and the default against moet_attend_latent_ref, bit for
 * bit, a repeat identical, and (fast) each row alone = its batch bits. */
static void latent_case(const char *name, moet_dtype dt, attn_dims a, int64_t L,
			const int32_t *n_pos, int n_rows)
{
	const size_t esz = dt == MOET_DT_F8_E4M3 ? 1 : dt == MOET_DT_BF16 ? 2 : 4;
	const int64_t R = a.heads * (a.nope + a.dv), cs = L + a.rope + 2;
	const int64_t qs = a.heads * (a.nope + a.rope), os = a.heads * a.dv;
	const int64_t nb = ((R + 127) / 128) * ((L + 127) / 128);
	void *w = malloc((size_t)(R * L) * esz);
	float *sc = dt == MOET_DT_F8_E4M3 ? malloc((size_t)nb * sizeof(float)) : NULL;
	float *q = malloc((size_t)(n_rows * qs) * sizeof(float));
	float *ref = malloc((size_t)(n_rows * os) * sizeof(float));
	float *got = malloc((size_t)(n_rows * os) * sizeof(float));
	float *one = malloc((size_t)os * sizeof(float));
	float *hc[8] = { 0 }, *dc[8] = { 0 }, *scr = NULL;
	int32_t pos[8];
	void *dw = NULL, *ds = NULL, *dq = NULL, *dout = NULL, *dcb = NULL, *dpos = NULL;
	int64_t max_pos = 0;
	for (int t = 0; t < n_rows; t++)
		max_pos = n_pos[t] > max_pos ? n_pos[t] : max_pos;
	scr = malloc((size_t)(2 * L + max_pos) * sizeof(float));
	if (n_rows > 8 || !w || (esz == 1 && !sc) || !q || !ref || !got || !one || !scr) {
		CHECK(0, "%s: host memory", name);
		goto out;
	}
	fill_weights(dt, w, (size_t)(R * L), 0);
	for (int64_t b = 0; sc && b < nb; b++)
		sc[b] = ldexpf(1.0f + rnd_unit() * 0.5f, -4 - (int)(rnd() % 4));
	for (int64_t i = 0; i < n_rows * qs; i++)
		q[i] = rnd_unit() * 2.0f;
	for (int t = 0; t < n_rows; t++) {
		const size_t n = (size_t)(n_pos[t] * cs);
		if (!(hc[t] = malloc(n * sizeof(float)))) {
			CHECK(0, "%s: host memory", name);
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			hc[t][i] = rnd_unit();
		if (!(dc[t] = up(hc[t], n * sizeof(float))))
			goto out;
		pos[t] = n_pos[t] - 1;
	}
	dw = up(w, (size_t)(R * L) * esz);
	ds = sc ? up(sc, (size_t)nb * sizeof(float)) : NULL;
	dq = up(q, (size_t)(n_rows * qs) * sizeof(float));
	dout = up(NULL, (size_t)(n_rows * os) * sizeof(float));
	dcb = up(dc, (size_t)n_rows * sizeof(float *));
	dpos = up(pos, (size_t)n_rows * sizeof(int32_t));
	if (!dw || (sc && !ds) || !dq || !dout || !dcb || !dpos)
		goto out;
	const moet_mat hm = { dt, R, L, w, sc }, dm = { dt, R, L, dw, ds };
	const float scale = 0.07f;
	for (int t = 0; t < n_rows; t++)
		for (int64_t h = 0; h < a.heads; h++) {
			const float *qh = q + t * qs + h * (a.nope + a.rope);
			moet_attend_latent_ref(qh, qh + a.nope, &hm, h, a.nope, a.dv, a.rope, hc[t],
					       cs, NULL, 0, n_pos[t], scale, scr,
					       ref + t * os + h * a.dv);
		}
	static const char *const var[4] = { "ref", "fast", "", "fast" };
	for (int v = 0; v < 4; v++) {
		setenv("MOET_GPU_LATENT", var[v], 1);
		for (int64_t i = 0; i < n_rows * os; i++)
			got[i] = moet_bits_f32(0x7fc00bad); /* a NaN no kernel writes */
		if (dev_fail(moet_gpu_copy_h2d(dout, got, (size_t)(n_rows * os) * 4), "poison") ||
		    dev_fail(moet_gpu_attention_latent(dq, qs, n_rows, a.heads, a.nope, a.rope,
						       a.dv, &dm, dcb, cs, dpos, NULL, scale, dout,
						       os, NULL), name) ||
		    down(got, dout, (size_t)(n_rows * os) * sizeof(float)))
			goto out;
		char what[96];
		snprintf(what, sizeof(what), "latent %s (MOET_GPU_LATENT=%s)", name, var[v]);
		same_bits(what, got, ref, (size_t)(n_rows * os), 0);
	}
	/* the fast kernel: each row alone gives its batch bits */
	for (int t = 0; t < n_rows; t++) {
		if (dev_fail(moet_gpu_attention_latent((float *)dq + t * qs, qs, 1, a.heads, a.nope,
						       a.rope, a.dv, &dm, (float **)dcb + t, cs,
						       (int32_t *)dpos + t, NULL, scale, dout, os,
						       NULL), name) ||
		    down(one, dout, (size_t)os * sizeof(float)))
			goto out;
		CHECK(!memcmp(one, got + t * os, (size_t)os * sizeof(float)),
		      "latent %s: row %d (%d positions) alone differs from the batch", name, t,
		      n_pos[t]);
	}
	unsetenv("MOET_GPU_LATENT");
	printf("attention_latent %s: %d rows x %lld heads, both kernels bit-equal to "
	       "moet_attend_latent_ref; each row alone = batch\n", name, n_rows,
	       (long long)a.heads);
out:
	unsetenv("MOET_GPU_LATENT");
	for (int t = 0; t < 8; t++) {
		free(hc[t]);
		moet_gpu_free(dc[t]);
	}
	moet_gpu_free(dw);
	moet_gpu_free(ds);
	moet_gpu_free(dq);
	moet_gpu_free(dout);
	moet_gpu_free(dcb);
	moet_gpu_free(dpos);
	free(w);
	free(sc);
	free(q);
	free(ref);
	free(got);
	free(one);
	free(scr);
}

static void test_attention_latent(void)
{
	/* 1 position, a short decode context, one across a 1024-position score tile, two */
	const int32_t n_pos[4] = { 1, 65, 1500, 2049 };
	latent_case("tiny f8", MOET_DT_F8_E4M3, (attn_dims){ 4, 16, 8, 16 }, 32, n_pos, 4);
	latent_case("tiny bf16", MOET_DT_BF16, (attn_dims){ 3, 24, 8, 20 }, 200, n_pos, 3);
	latent_case("kimi-k2 f8", MOET_DT_F8_E4M3, (attn_dims){ 64, 128, 64, 128 }, 512, n_pos,
		    4);
	setenv("MOET_GPU_LATENT", "bogus", 1);
	float *d = up(NULL, 4096);
	CHECK(moet_gpu_attention_latent(d, 64, 1, 1, 8, 8, 8,
					&(moet_mat){ MOET_DT_F32, 16, 16, d, NULL }, (float **)d,
					24, (int32_t *)d, NULL, 1.0f, d, 8, NULL) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "MOET_GPU_LATENT"), "MOET_GPU_LATENT=bogus: %s",
	      moet_errmsg());
	unsetenv("MOET_GPU_LATENT");
	moet_gpu_free(d);
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("test_gpu_latent: SKIP (%s)\n", why ? why : "no CUDA device");
		return MOET_TEST_SKIP;
	}
	test_attention_latent();
	return moet_test_done("test_gpu_latent");
}
