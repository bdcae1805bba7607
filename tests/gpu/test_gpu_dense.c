/*
 * test_gpu_dense.c: the CUDA dense-path ops (gpu/rmsnorm.cu .. combine.cu) against the CPU
 * reference backend's functions, on random data of the tiny and the Kimi-K2 geometry (the
 * linear layers are test_gpu_linear's; their bad arguments are checked here).
 *
 *   bit for bit (memcmp; NaN outputs are canonical on both sides where the op canonicalizes,
 *   compared as "any NaN" where it does not):  router ids and weights
 *   (moet_router_select_ref after the CPU's sigmoid), combine (the forward pass's loop), embed,
 *   residual add, kv write (the forward pass's cache layout), attention (moet_attend_ref:
 *   the GPU repeats its binary64 sums in index order); the absorbed form is
 *   test_gpu_latent's, greedy draws are test_gpu_sample's;
 *   within a stated tolerance: rmsnorm (2 ulp of moet_rmsnorm_ref; exact matches counted; and
 *   bit for bit the documented device order written out on the host),
 *   rope (1 binary32 ulp of each table entry's effect; exact matches counted, >= 99.9%).
 *   Attention batch invariance: every row of a ragged batch (several sequences, prefill chunks
 *   and decode rows at different positions) equals the same row run alone, bit for bit.
 *   Every op runs twice; the two outputs must be identical. Bad arguments give MOET_EINVAL.
 *
 * Large checks sample rows (always the first and last) so that the scalar reference stays
 * within a few seconds on the reference threads. Skips (77) without a CUDA device.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_cpu.h"
#include "moet_err.h"
#include "moet_expc.h"
#include "moet_gpu.h"
#include "moet_test.h"

#include "gpu_check.h"

static int64_t ordered(float f) /* monotone integer image of a float (+0 == -0) */
{
	int32_t i = (int32_t)moet_f32_bits(f);
	return i < 0 ? -(int64_t)(i & 0x7FFFFFFF) : (int64_t)i;
}

/* Within max_ulp; *exact counts bit-equal elements. */
static int within_ulp(const char *what, const float *g, const float *c, size_t n, int max_ulp,
		      size_t *exact)
{
	for (size_t i = 0; i < n; i++) {
		if (!memcmp(&g[i], &c[i], 4)) {
			(*exact)++;
			continue;
		}
		int64_t d = ordered(g[i]) - ordered(c[i]);
		if (nan_f(g[i]) || nan_f(c[i]) || d > max_ulp || d < -max_ulp) {
			CHECK(0, "%s: element %zu: gpu %08x (%.9g), cpu %08x (%.9g), %lld ulp", what,
			      i, moet_f32_bits(g[i]), (double)g[i], moet_f32_bits(c[i]),
			      (double)c[i], (long long)d);
			return 0;
		}
	}
	return 1;
}

/* ---- rmsnorm ---------------------------------------------------------------------------- */

/* The device's documented order (docs/gpu.md "rmsnorm"), written out on the host: thread j of
 * 256 sums x[j]^2, x[j + 256]^2, ... in binary64 in that order, a halving tree adds the 256
 * partials (s[j] += s[j + h], h = 128 .. 1), then the CPU's arithmetic. */
static void rmsnorm_device_order(const float *x, const float *w, int64_t n, double eps,
				 float *out)
{
	double s[256];
	for (int j = 0; j < 256; j++) {
		s[j] = 0.0;
		for (int64_t i = j; i < n; i += 256)
			s[j] = s[j] + (double)x[i] * (double)x[i];
	}
	for (int h = 128; h > 0; h >>= 1)
		for (int j = 0; j < h; j++)
			s[j] = s[j] + s[j + h];
	const float inv = (float)(1.0 / sqrt(s[0] / (double)n + eps));
	for (int64_t i = 0; i < n; i++)
		out[i] = w[i] * (x[i] * inv);
}

static void test_rmsnorm(void)
{
	static const int64_t ns[] = { 1, 7, 64, 96, 129, 256, 512, 1536, 7168, 2048 * 2 + 100 };
	size_t exact = 0, total = 0;
	for (int i = 0; i < 10; i++) {
		const int64_t n = ns[i], rows = 1 + (int64_t)(rnd() % 40), st = n + (i % 3);
		float *x = malloc((size_t)(rows * st) * sizeof(float));
		float *w = malloc((size_t)n * sizeof(float));
		float *g = malloc((size_t)(rows * st) * sizeof(float));
		float *c = malloc((size_t)(rows * st) * sizeof(float));
		float *g2 = malloc((size_t)(rows * st) * sizeof(float));
		if (!x || !w || !g || !c || !g2) {
			CHECK(0, "host memory");
			return;
		}
		for (int64_t k = 0; k < rows * st; k++)
			x[k] = rnd_unit() * ldexpf(1.0f, (int)(rnd() % 20) - 10);
		for (int64_t k = 0; k < n; k++)
			w[k] = 1.0f + rnd_unit() * 0.5f;
		memcpy(c, x, (size_t)(rows * st) * sizeof(float));
		for (int64_t r = 0; r < rows; r++)
			moet_rmsnorm_ref(x + r * st, w, n, 1e-6, c + r * st);
		float *dx = up(x, (size_t)(rows * st) * sizeof(float));
		float *dw = up(w, (size_t)n * sizeof(float));
		float *dy = up(x, (size_t)(rows * st) * sizeof(float));
		if (dx && dw && dy &&
		    !dev_fail(moet_gpu_rmsnorm(dx, st, dw, n, rows, 1e-6, dy, st, NULL), "rmsnorm") &&
		    !down(g, dy, (size_t)(rows * st) * sizeof(float)) &&
		    /* in place, twice: the same bits as out of place */
		    !dev_fail(moet_gpu_rmsnorm(dx, st, dw, n, rows, 1e-6, dx, st, NULL), "rmsnorm") &&
		    !down(g2, dx, (size_t)(rows * st) * sizeof(float))) {
			within_ulp("rmsnorm", g, c, (size_t)(rows * st), 2, &exact);
			total += (size_t)(rows * st);
			/* and bit for bit the documented device order */
			for (int64_t r = 0; r < rows; r++)
				rmsnorm_device_order(x + r * st, w, n, 1e-6, c + r * st);
			size_t bad = 0;
			for (int64_t r = 0; r < rows; r++)
				bad += memcmp(g + r * st, c + r * st, (size_t)n * sizeof(float)) != 0;
			CHECK(bad == 0, "rmsnorm n %lld: %zu of %lld rows differ from the documented "
			      "device order", (long long)n, bad, (long long)rows);
			CHECK(!memcmp(g, g2, (size_t)(rows * st) * sizeof(float)),
			      "rmsnorm n %lld: in place differs", (long long)n);
		}
		moet_gpu_free(dx);
		moet_gpu_free(dw);
		moet_gpu_free(dy);
		free(x);
		free(w);
		free(g);
		free(c);
		free(g2);
	}
	printf("rmsnorm: %zu values within 2 ulp of moet_rmsnorm_ref, %zu (%.4f%%) bit-equal\n",
	       total, exact, total ? 100.0 * (double)exact / (double)total : 0.0);
}

/* ---- rope ------------------------------------------------------------------------------- */

/* moet_rope_tables_ref's arithmetic (cpu/dense_ref.c; runtime/rope.c before it). */
static void rope_tables(const float *inv_freq, int64_t n_freq, float att, int64_t pos,
			float *ct, float *st)
{
	for (int64_t i = 0; i < n_freq; i++) {
		float ang = (float)pos * inv_freq[i];
		ct[i] = (float)cos((double)ang) * att;
		st[i] = (float)sin((double)ang) * att;
	}
}

static void test_rope(void)
{
	/* (heads, head stride, offset, row stride, n_freq): q and k_pe of tiny and Kimi-K2. */
	static const int64_t shapes[][5] = { { 4, 48, 32, 4 * 48, 8 }, { 1, 16, 64, 80, 8 },
					     { 64, 192, 128, 64 * 192, 32 },
					     { 1, 64, 512, 576, 32 }, { 3, 10, 0, 31, 5 } };
	size_t exact = 0, total = 0;
	for (int si = 0; si < 5; si++)
		for (int il = 0; il < 2; il++) {
			const int64_t nh = shapes[si][0], hs = shapes[si][1], off = shapes[si][2];
			const int64_t rs = shapes[si][3], nf = shapes[si][4], rows = 37;
			const float att = il ? 1.0f + 0.1f * logf(32.0f) : 1.0f;
			float inv[256], ct[256], st[256];
			for (int64_t i = 0; i < nf; i++)
				inv[i] = 1.0f / powf(50000.0f, (float)(2 * i) / (float)(2 * nf)) *
					 (i % 3 ? 1.0f : 0.03125f);
			int32_t pos[37];
			for (int r = 0; r < rows; r++)
				pos[r] = r < 3 ? r : (int32_t)(rnd() % 163840);
			const size_t nfl = (size_t)(rows * rs);
			float *x = malloc(nfl * sizeof(float)), *c = malloc(nfl * sizeof(float));
			float *g = malloc(nfl * sizeof(float)), *g2 = malloc(nfl * sizeof(float));
			if (!x || !c || !g || !g2) {
				CHECK(0, "host memory");
				return;
			}
			for (size_t i = 0; i < nfl; i++)
				x[i] = rnd_unit() * 4.0f;
			memcpy(c, x, nfl * sizeof(float));
			for (int r = 0; r < rows; r++) {
				rope_tables(inv, nf, att, pos[r], ct, st);
				for (int64_t h = 0; h < nh; h++)
					moet_rope_ref(c + r * rs + off + h * hs, nf, ct, st, il);
			}
			float *dx = up(x, nfl * sizeof(float));
			int32_t *dp = up(pos, sizeof(pos));
			float *di = up(inv, (size_t)nf * sizeof(float));
			int ok = dx && dp && di &&
				 !dev_fail(moet_gpu_rope(dx + off, rows, rs, nh, hs, nf, dp, di, att,
							 il, NULL), "rope") &&
				 !down(g, dx, nfl * sizeof(float)) &&
				 !dev_fail(moet_gpu_copy_h2d(dx, x, nfl * sizeof(float)), "h2d") &&
				 !dev_fail(moet_gpu_rope(dx + off, rows, rs, nh, hs, nf, dp, di, att,
							 il, NULL), "rope") &&
				 !down(g2, dx, nfl * sizeof(float));
			if (ok) {
				CHECK(!memcmp(g, g2, nfl * sizeof(float)), "rope: repeat differs");
				/* Tolerance: one binary32 ulp of a table entry times the inputs, plus
				 * one ulp of the output. Values outside the rope parts are untouched. */
				int bad = 0;
				for (int r = 0; r < rows && !bad; r++)
					for (int64_t i = 0; i < rs && !bad; i++) {
						const size_t k = (size_t)(r * rs + i);
						const int64_t hi = (i - off) / hs, e = (i - off) % hs;
						const int rope = i >= off && hi < nh && e < 2 * nf;
						if (!memcmp(&g[k], &c[k], 4)) {
							exact += (size_t)rope;
							total += (size_t)rope;
							continue;
						}
						const float *xv = x + r * rs + off + hi * hs;
						const int64_t f = e % nf;
						const float a = il ? xv[2 * f] : xv[f];
						const float b = il ? xv[2 * f + 1] : xv[f + nf];
						double tol = (fabs(a) + fabs(b)) * att * 0x1p-23 +
							     fabs(c[k]) * 0x1p-23;
						bad = !rope || !(fabs((double)g[k] - (double)c[k]) <= tol);
						CHECK(!bad, "rope shape %d il %d row %d elem %lld: "
						      "gpu %.9g cpu %.9g", si, il, r, (long long)i,
						      (double)g[k], (double)c[k]);
						total++;
					}
			}
			moet_gpu_free(dx);
			moet_gpu_free(dp);
			moet_gpu_free(di);
			free(x);
			free(c);
			free(g);
			free(g2);
		}
	CHECK(total > 0 && (double)exact >= 0.999 * (double)total, "rope: only %zu of %zu exact",
	      exact, total);
	printf("rope: %zu values within tolerance, %zu (%.4f%%) bit-equal to moet_rope_ref\n",
	       total, exact, total ? 100.0 * (double)exact / (double)total : 0.0);
}

/* ---- kv write + attention --------------------------------------------------------------- */

typedef struct {
	int64_t heads, nope, rope, dv;
} attn_dims;

typedef struct {
	int seq;
	int32_t pos;
} attn_row;

static void attention_case(const char *name, attn_dims a, int n_seq, const int32_t *seq_len,
			   const attn_row *rows, int n_rows)
{
	const int64_t qk = a.nope + a.rope, ks = a.heads * qk, vs = a.heads * a.dv;
	const int64_t kvbs = a.heads * (a.nope + a.dv);
	float *hk[8] = { 0 }, *hv[8] = { 0 }, *dk[8] = { 0 }, *dv[8] = { 0 };
	float *q = malloc((size_t)(n_rows * ks) * sizeof(float));
	float *kvb = malloc((size_t)(n_rows * kvbs) * sizeof(float));
	float *kpe = malloc((size_t)(n_rows * (a.rope + 3)) * sizeof(float));
	float *ref = malloc((size_t)(n_rows * vs) * sizeof(float));
	float *got = malloc((size_t)(n_rows * vs) * sizeof(float));
	float *got2 = malloc((size_t)(n_rows * vs) * sizeof(float));
	float *one = malloc((size_t)vs * sizeof(float));
	float *scr = malloc(65536 * sizeof(float)), *hcache = NULL;
	float **kb = malloc((size_t)n_rows * sizeof(float *));
	float **vb = malloc((size_t)n_rows * sizeof(float *));
	int32_t *pos = malloc((size_t)n_rows * sizeof(int32_t));
	void *dq = NULL, *dkvb = NULL, *dkpe = NULL, *dout = NULL, *dkb = NULL, *dvb = NULL;
	void *dpos = NULL;
	if (!q || !kvb || !kpe || !ref || !got || !got2 || !one || !scr || !kb || !vb || !pos) {
		CHECK(0, "host memory");
		goto out;
	}
	/* Caches: random history, then the batch's rows written by kv_write. */
	for (int s = 0; s < n_seq; s++) {
		const size_t kn = (size_t)(seq_len[s] * ks), vn = (size_t)(seq_len[s] * vs);
		hk[s] = malloc(kn * sizeof(float));
		hv[s] = malloc(vn * sizeof(float));
		if (!hk[s] || !hv[s]) {
			CHECK(0, "host memory");
			goto out;
		}
		for (size_t i = 0; i < kn; i++)
			hk[s][i] = rnd_unit();
		for (size_t i = 0; i < vn; i++)
			hv[s][i] = rnd_unit();
		dk[s] = up(hk[s], kn * sizeof(float));
		dv[s] = up(hv[s], vn * sizeof(float));
		if (!dk[s] || !dv[s])
			goto out;
	}
	for (int64_t i = 0; i < n_rows * ks; i++)
		q[i] = rnd_unit() * 3.0f;
	for (int64_t i = 0; i < n_rows * kvbs; i++)
		kvb[i] = rnd_unit();
	for (int64_t i = 0; i < n_rows * (a.rope + 3); i++)
		kpe[i] = rnd_unit();
	for (int t = 0; t < n_rows; t++) {
		const int s = rows[t].seq;
		kb[t] = dk[s];
		vb[t] = dv[s];
		pos[t] = rows[t].pos;
		/* runtime/forward.c's layout, on the host copy */
		float *kr = hk[s] + (size_t)pos[t] * (size_t)ks;
		float *vr = hv[s] + (size_t)pos[t] * (size_t)vs;
		for (int64_t h = 0; h < a.heads; h++) {
			const float *src = kvb + t * kvbs + h * (a.nope + a.dv);
			memcpy(kr + h * qk, src, (size_t)a.nope * sizeof(float));
			memcpy(kr + h * qk + a.nope, kpe + t * (a.rope + 3),
			       (size_t)a.rope * sizeof(float));
			memcpy(vr + h * a.dv, src + a.nope, (size_t)a.dv * sizeof(float));
		}
	}
	dq = up(q, (size_t)(n_rows * ks) * sizeof(float));
	dkvb = up(kvb, (size_t)(n_rows * kvbs) * sizeof(float));
	dkpe = up(kpe, (size_t)(n_rows * (a.rope + 3)) * sizeof(float));
	dout = up(NULL, (size_t)(n_rows * vs) * sizeof(float));
	dkb = up(kb, (size_t)n_rows * sizeof(float *));
	dvb = up(vb, (size_t)n_rows * sizeof(float *));
	dpos = up(pos, (size_t)n_rows * sizeof(int32_t));
	if (!dq || !dkvb || !dkpe || !dout || !dkb || !dvb || !dpos)
		goto out;
	if (dev_fail(moet_gpu_kv_write(dkvb, kvbs, dkpe, a.rope + 3, n_rows, a.heads, a.nope,
				       a.rope, a.dv, dkb, dvb, ks, vs, dpos, NULL, NULL),
		     "kv_write"))
		goto out;
	/* The caches after kv_write equal the host's, bit for bit. */
	for (int s = 0; s < n_seq; s++) {
		const size_t kn = (size_t)(seq_len[s] * ks), vn = (size_t)(seq_len[s] * vs);
		hcache = malloc((kn > vn ? kn : vn) * sizeof(float));
		if (!hcache || down(hcache, dk[s], kn * sizeof(float)))
			goto out;
		same_bits("kv_write K cache", hcache, hk[s], kn, 0);
		if (down(hcache, dv[s], vn * sizeof(float)))
			goto out;
		same_bits("kv_write V cache", hcache, hv[s], vn, 0);
		free(hcache);
		hcache = NULL;
	}
	const float scale = 1.0f / sqrtf((float)qk) * 1.3f;
	/* the longest run of rows of one sequence: the hint that picks the grouped kernel */
	int64_t run = 0;
	for (int t = 0, r = 0; t < n_rows; t++) {
		r = t > 0 && rows[t].seq == rows[t - 1].seq ? r + 1 : 1;
		run = r > run ? r : run;
	}
	for (int t = 0; t < n_rows; t++) {
		const int s = rows[t].seq;
		for (int64_t h = 0; h < a.heads; h++)
			moet_attend_ref(q + t * ks + h * qk, hk[s] + h * qk, ks, hv[s] + h * a.dv, vs,
					NULL, 0, pos[t] + 1, qk, a.dv, scale, scr,
					ref + t * vs + h * a.dv);
	}
	/* the default (grouped where runs of 8+ rows allow) and the per-row kernel, each twice */
	for (int v = 0; v < 2; v++) {
		char what[96];
		snprintf(what, sizeof(what), "%s (MOET_GPU_ATTN=%s, run %lld)", name,
			 v ? "ref" : "default", (long long)run);
		if (v)
			setenv("MOET_GPU_ATTN", "ref", 1);
		const int bad =
			dev_fail(moet_gpu_attention(dq, ks, n_rows, a.heads, qk, a.dv, dkb, dvb, ks,
						    vs, dpos, NULL, run, scale, dout, vs, NULL),
				 what) ||
			down(got, dout, (size_t)(n_rows * vs) * sizeof(float)) ||
			dev_fail(moet_gpu_attention(dq, ks, n_rows, a.heads, qk, a.dv, dkb, dvb, ks,
						    vs, dpos, NULL, run, scale, dout, vs, NULL),
				 what) ||
			down(got2, dout, (size_t)(n_rows * vs) * sizeof(float));
		unsetenv("MOET_GPU_ATTN");
		if (bad)
			goto out;
		CHECK(!memcmp(got, got2, (size_t)(n_rows * vs) * sizeof(float)),
		      "%s: repeat differs", what);
		same_bits(what, got, ref, (size_t)(n_rows * vs), 1);
	}
	/* Batch invariance: each row alone (its own pointers, n_rows = 1) gives its batch bits. */
	for (int t = 0; t < n_rows; t++) {
		if (dev_fail(moet_gpu_attention((float *)dq + t * ks, ks, 1, a.heads, qk, a.dv,
						(float **)dkb + t, (float **)dvb + t, ks, vs,
						(int32_t *)dpos + t, NULL, 1, scale, dout, vs, NULL),
			     name) ||
		    down(one, dout, (size_t)vs * sizeof(float)))
			goto out;
		CHECK(!memcmp(one, got + t * vs, (size_t)vs * sizeof(float)),
		      "%s: row %d (seq %d, pos %d) alone differs from the batch", name, t,
		      rows[t].seq, rows[t].pos);
	}
	printf("attention %s: %d rows x %lld heads bit-equal to moet_attend_ref; each row alone = "
	       "batch\n", name, n_rows, (long long)a.heads);
out:
	for (int s = 0; s < 8; s++) {
		free(hk[s]);
		free(hv[s]);
		moet_gpu_free(dk[s]);
		moet_gpu_free(dv[s]);
	}
	moet_gpu_free(dq);
	moet_gpu_free(dkvb);
	moet_gpu_free(dkpe);
	moet_gpu_free(dout);
	moet_gpu_free(dkb);
	moet_gpu_free(dvb);
	moet_gpu_free(dpos);
	free(q);
	free(kvb);
	free(kpe);
	free(ref);
	free(got);
	free(got2);
	free(one);
	free(scr);
	free(hcache);
	free(kb);
	free(vb);
	free(pos);
}

static void test_attention(void)
{
	/* Ragged batch: a prefill chunk of seq 0 (positions 60..71, across a tile edge), decode
	 * rows of seq 1 (pos 300), seq 2 (pos 0), seq 3 (pos 1000, many tiles), and the first
	 * prompt of seq 4 (positions 0..4). */
	attn_row rows[21];
	int n = 0;
	for (int p = 60; p < 72; p++)
		rows[n++] = (attn_row){ 0, p };
	rows[n++] = (attn_row){ 1, 300 };
	rows[n++] = (attn_row){ 2, 0 };
	rows[n++] = (attn_row){ 3, 1000 };
	for (int p = 0; p < 5; p++)
		rows[n++] = (attn_row){ 4, p };
	const int32_t len[5] = { 72, 301, 1, 1001, 5 };
	attention_case("tiny", (attn_dims){ 4, 32, 16, 32 }, 5, len, rows, n);
	attention_case("kimi-k2", (attn_dims){ 64, 128, 64, 128 }, 5, len, rows, n);
	const attn_row deep[2] = { { 0, 4095 }, { 1, 63 } };
	const int32_t dlen[2] = { 4096, 64 };
	attention_case("kimi-k2-4k", (attn_dims){ 64, 128, 64, 128 }, 2, dlen, deep, 2);
	/* a decode batch (runs of one row: the decode kernel by default): contexts of 1, 64, 65
	 * (a tile edge), 1024 (every score kept in shared memory) and 1025, 1500 (scores
	 * recomputed per tile) positions */
	const attn_row dec[6] = { { 0, 1023 }, { 1, 0 }, { 2, 1024 }, { 3, 63 }, { 4, 64 },
				  { 5, 1499 } };
	const int32_t declen[6] = { 1024, 1, 1025, 64, 65, 1500 };
	attention_case("kimi-k2-decode", (attn_dims){ 64, 128, 64, 128 }, 6, declen, dec, 6);
	attention_case("tiny-decode", (attn_dims){ 4, 32, 16, 32 }, 6, declen, dec, 6);
	/* prefill chunks: 40 rows of seq 0 (positions 100..139: runs across three 16-row groups
	 * and three 64-position tiles), a decode row of seq 1, 19 rows of seq 2 (0..18) */
	attn_row pre[60];
	int np = 0;
	for (int p = 100; p < 140; p++)
		pre[np++] = (attn_row){ 0, p };
	pre[np++] = (attn_row){ 1, 700 };
	for (int p = 0; p < 19; p++)
		pre[np++] = (attn_row){ 2, p };
	const int32_t plen[3] = { 140, 701, 19 };
	attention_case("kimi-k2-prefill", (attn_dims){ 64, 128, 64, 128 }, 3, plen, pre, np);
	attention_case("tiny-prefill", (attn_dims){ 4, 32, 16, 32 }, 3, plen, pre, np);
}

/* ---- router ----------------------------------------------------------------------------- */

static void router_case(const char *name, int64_t E, int64_t G, int64_t TG, int64_t K, int norm,
			float rsf, int64_t n_tok, int ties)
{
	const size_t nl = (size_t)(n_tok * E);
	float *lg = malloc(nl * sizeof(float)), *bias = malloc((size_t)E * sizeof(float));
	float *score = malloc((size_t)E * sizeof(float));
	float *scr = malloc((size_t)(E + G + 1) * sizeof(float));
	int32_t *ids = malloc((size_t)(n_tok * K) * sizeof(int32_t));
	int32_t *gids = malloc((size_t)(n_tok * K) * sizeof(int32_t));
	float *w = malloc((size_t)(n_tok * K) * sizeof(float));
	float *gw = malloc((size_t)(n_tok * K) * sizeof(float));
	void *dl = NULL, *db = NULL, *di = NULL, *dw = NULL;
	if (!lg || !bias || !score || !scr || !ids || !gids || !w || !gw) {
		CHECK(0, "host memory");
		goto out;
	}
	for (size_t i = 0; i < nl; i++) /* ties: logits on a coarse grid repeat often */
		lg[i] = ties ? (float)((int)(rnd() % 9) - 4) * 0.5f : rnd_unit() * 6.0f;
	for (int64_t e = 0; e < E; e++)
		bias[e] = ties ? (float)(rnd() % 3) * 0.25f : rnd_unit() * 0.1f;
	if (n_tok > 1) /* a NaN logit never wins */
		lg[E + 1] = moet_bits_f32(0x7FC00000u);
	for (int64_t t = 0; t < n_tok; t++) {
		for (int64_t e = 0; e < E; e++)
			score[e] = 1.0f / (1.0f + moet_exp_c(-lg[t * E + e]));
		moet_router_select_ref(score, bias, E, G, TG, K, norm, rsf, scr, ids + t * K,
				       w + t * K);
	}
	dl = up(lg, nl * sizeof(float));
	db = up(bias, (size_t)E * sizeof(float));
	di = up(NULL, (size_t)(n_tok * K) * sizeof(int32_t));
	dw = up(NULL, (size_t)(n_tok * K) * sizeof(float));
	if (!dl || !db || !di || !dw)
		goto out;
	for (int rep = 0; rep < 2; rep++) {
		if (dev_fail(moet_gpu_router(dl, n_tok, E, db, G, TG, K, norm, rsf, di, dw, NULL),
			     name) ||
		    down(gids, di, (size_t)(n_tok * K) * sizeof(int32_t)) ||
		    down(gw, dw, (size_t)(n_tok * K) * sizeof(float)))
			goto out;
		CHECK(!memcmp(gids, ids, (size_t)(n_tok * K) * sizeof(int32_t)), "%s: ids differ",
		      name);
		same_bits(name, gw, w, (size_t)(n_tok * K), 0);
	}
	printf("router %s: %lld tokens, ids and weights bit-equal\n", name, (long long)n_tok);
out:
	moet_gpu_free(dl);
	moet_gpu_free(db);
	moet_gpu_free(di);
	moet_gpu_free(dw);
	free(lg);
	free(bias);
	free(score);
	free(scr);
	free(ids);
	free(gids);
	free(w);
	free(gw);
}

static void test_router(void)
{
	router_case("tiny", 32, 4, 2, 4, 1, 2.5f, 300, 0);
	router_case("tiny-ties", 32, 4, 2, 4, 1, 2.5f, 300, 1);
	router_case("groups-of-one", 8, 8, 3, 2, 0, 1.0f, 100, 1);
	router_case("deepseek-v3", 256, 8, 4, 8, 1, 2.5f, 512, 0);
	router_case("deepseek-v3-ties", 256, 8, 4, 8, 1, 2.5f, 200, 1);
	router_case("kimi-k2", 384, 1, 1, 8, 1, 2.827f, 512, 0);
	router_case("kimi-k2-ties", 384, 1, 1, 8, 1, 2.827f, 200, 1);
	router_case("many", 4096, 64, 7, 16, 1, 1.5f, 16, 0);
}

/* ---- embed, add, combine -------------------------------------------------------------- */

static void test_embed(void)
{
	const moet_dtype dts[3] = { MOET_DT_BF16, MOET_DT_F16, MOET_DT_F32 };
	const int64_t V = 1000, H = 7168, n = 70;
	for (int d = 0; d < 3; d++) {
		const size_t esz = dts[d] == MOET_DT_F32 ? 4 : 2;
		void *tab = malloc((size_t)(V * H) * esz);
		float *c = malloc((size_t)(n * H) * sizeof(float));
		float *g = malloc((size_t)(n * H) * sizeof(float));
		int32_t tok[70];
		if (!tab || !c || !g) {
			CHECK(0, "host memory");
			return;
		}
		for (int64_t i = 0; i < V * H; i++) {
			uint32_t r = (uint32_t)rnd();
			if (esz == 4)
				((uint32_t *)tab)[i] = (r & 0x7F800000u) == 0x7F800000u ? r & 0xBFFFFFFFu
											 : r;
			else if (dts[d] == MOET_DT_BF16)
				((uint16_t *)tab)[i] = (r & 0x7F80u) == 0x7F80u ? (uint16_t)(r & 0xBFFF)
										: (uint16_t)r;
			else /* F16: every code but NaN (infinities stay) */
				((uint16_t *)tab)[i] = (r & 0x7C00u) == 0x7C00u ? (uint16_t)(r & 0xFC00)
										: (uint16_t)r;
		}
		for (int t = 0; t < n; t++) {
			tok[t] = t == 5 ? -1 : t == 6 ? (int32_t)V : (int32_t)(rnd() % V);
			for (int64_t i = 0; i < H; i++) {
				const size_t k = (size_t)tok[t] * (size_t)H + (size_t)i;
				float v = 0.0f;
				if (tok[t] >= 0 && tok[t] < V)
					v = dts[d] == MOET_DT_BF16 ? moet_dec_bf16(((uint16_t *)tab)[k])
					    : dts[d] == MOET_DT_F16 ? moet_dec_f16(((uint16_t *)tab)[k])
								    : ((float *)tab)[k];
				c[t * H + i] = v;
			}
		}
		void *dtab = up(tab, (size_t)(V * H) * esz), *dt = up(tok, sizeof(tok));
		void *dx = up(NULL, (size_t)(n * H) * sizeof(float));
		moet_mat m = { dts[d], V, H, dtab, NULL };
		if (dtab && dt && dx && !dev_fail(moet_gpu_embed(&m, dt, n, dx, NULL), "embed") &&
		    !down(g, dx, (size_t)(n * H) * sizeof(float)))
			same_bits("embed", g, c, (size_t)(n * H), 0);
		moet_gpu_free(dtab);
		moet_gpu_free(dt);
		moet_gpu_free(dx);
		free(tab);
		free(c);
		free(g);
	}
	printf("embed: BF16, F16, F32 tables bit-equal (out-of-range tokens give +0)\n");
}

static void test_add_combine(void)
{
	const int64_t H = 7168, n_tok = 40, K = 8, n_y = n_tok * K + 5;
	float *y = malloc((size_t)(n_y * H) * sizeof(float));
	float *sh = malloc((size_t)(n_tok * H) * sizeof(float));
	float *c = malloc((size_t)(n_tok * H) * sizeof(float));
	float *g = malloc((size_t)(n_tok * H) * sizeof(float));
	float *w = malloc((size_t)(n_tok * K) * sizeof(float));
	int32_t *slot = malloc((size_t)(n_tok * K) * sizeof(int32_t));
	void *dy = NULL, *dsh = NULL, *dw = NULL, *ds = NULL, *dout = NULL;
	if (!y || !sh || !c || !g || !w || !slot) {
		CHECK(0, "host memory");
		goto out;
	}
	for (int64_t i = 0; i < n_y * H; i++)
		y[i] = rnd() % 1000 == 0 ? moet_bits_f32(0x7FA00001u) : rnd_unit() * 3.0f;
	for (int64_t i = 0; i < n_tok * H; i++)
		sh[i] = rnd() % 50 == 0 ? -0.0f : rnd_unit();
	for (int64_t i = 0; i < n_tok * K; i++) {
		w[i] = rnd_unit() * 2.0f;
		slot[i] = (int32_t)(rnd() % n_y);
	}
	slot[3] = -1; /* reads +0 */
	slot[K + 1] = (int32_t)n_y;
	dy = up(y, (size_t)(n_y * H) * sizeof(float));
	dsh = up(sh, (size_t)(n_tok * H) * sizeof(float));
	dw = up(w, (size_t)(n_tok * K) * sizeof(float));
	ds = up(slot, (size_t)(n_tok * K) * sizeof(int32_t));
	dout = up(NULL, (size_t)(n_tok * H) * sizeof(float));
	if (!dy || !dsh || !dw || !ds || !dout)
		goto out;
	for (int with_shared = 0; with_shared < 2; with_shared++) {
		for (int64_t t = 0; t < n_tok; t++)
			for (int64_t j = 0; j < H; j++) {
				float routed = 0.0f;
				for (int64_t i = 0; i < K; i++) {
					int32_t s = slot[t * K + i];
					float v = s >= 0 && s < n_y ? y[s * H + j] : 0.0f;
					routed = MOET_FMA(w[t * K + i], v, routed);
				}
				c[t * H + j] = moet_canon_nan(with_shared ? routed + sh[t * H + j]
									  : routed);
			}
		if (dev_fail(moet_gpu_combine(dy, n_y, ds, dw, K, with_shared ? dsh : NULL, n_tok, H,
					      dout, NULL), "combine") ||
		    down(g, dout, (size_t)(n_tok * H) * sizeof(float)))
			goto out;
		same_bits("combine", g, c, (size_t)(n_tok * H), 0);
	}
	/* out == shared (in place) */
	if (!dev_fail(moet_gpu_combine(dy, n_y, ds, dw, K, dsh, n_tok, H, dsh, NULL), "combine") &&
	    !down(g, dsh, (size_t)(n_tok * H) * sizeof(float)))
		same_bits("combine in place", g, c, (size_t)(n_tok * H), 0);
	/* Residual add (no NaN inputs: payloads are not part of the add's promise). */
	for (int64_t i = 0; i < n_tok * H; i++) {
		sh[i] = rnd_unit();
		c[i] = rnd_unit() * 1e-3f;
	}
	if (!dev_fail(moet_gpu_copy_h2d(dsh, sh, (size_t)(n_tok * H) * sizeof(float)), "h2d") &&
	    !dev_fail(moet_gpu_copy_h2d(dout, c, (size_t)(n_tok * H) * sizeof(float)), "h2d") &&
	    !dev_fail(moet_gpu_add(dsh, dout, n_tok * H, NULL), "add") &&
	    !down(g, dsh, (size_t)(n_tok * H) * sizeof(float))) {
		for (int64_t i = 0; i < n_tok * H; i++)
			sh[i] = sh[i] + c[i];
		same_bits("add", g, sh, (size_t)(n_tok * H), 0);
	}
	printf("combine (with/without shared, in place, NaN, out-of-range slots) and add "
	       "bit-equal\n");
out:
	moet_gpu_free(dy);
	moet_gpu_free(dsh);
	moet_gpu_free(dw);
	moet_gpu_free(ds);
	moet_gpu_free(dout);
	free(y);
	free(sh);
	free(c);
	free(g);
	free(w);
	free(slot);
}

/* ---- bad arguments ---------------------------------------------------------------------- */

static void test_bad_input(void)
{
	float *d = up(NULL, 4096);
	int32_t *di = up(NULL, 4096);
	if (!d || !di)
		return;
	moet_mat m = { MOET_DT_F8_E4M3, 16, 16, d, NULL };
	moet_mat bad = { MOET_DT_F16, 16, 16, d, NULL };
	CHECK(moet_gpu_linear(NULL, d, 16, 1, d, 16, NULL) == MOET_EINVAL, "linear NULL");
	CHECK(moet_gpu_linear(&bad, d, 16, 1, d, 16, NULL) == MOET_EUNSUP, "linear F16");
	CHECK(moet_gpu_linear(&m, d, 8, 1, d, 16, NULL) == MOET_EINVAL, "linear x stride");
	setenv("MOET_GPU_LINEAR", "sideways", 1);
	CHECK(moet_gpu_linear(&m, d, 16, 1, d, 16, NULL) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "MOET_GPU_LINEAR"), "linear: a bad MOET_GPU_LINEAR refused: %s",
	      moet_errmsg());
	unsetenv("MOET_GPU_LINEAR");
	CHECK(moet_gpu_linear(&m, NULL, 16, 1, d, 16, NULL) == MOET_EINVAL, "linear x NULL");
	CHECK(moet_gpu_linear(&m, d, 16, -1, d, 16, NULL) == MOET_EINVAL, "linear n_tok");
	CHECK(moet_gpu_linear(&m, d, 16, 0, d, 16, NULL) == 0, "linear no tokens");
	CHECK(moet_gpu_rmsnorm(d, 8, d, 16, 1, 1e-6, d, 16, NULL) == MOET_EINVAL, "rmsnorm stride");
	CHECK(moet_gpu_rmsnorm(d, 16, NULL, 16, 1, 1e-6, d, 16, NULL) == MOET_EINVAL, "rmsnorm w");
	CHECK(moet_gpu_rope(d, 1, 64, 1, 64, 300, di, d, 1.0f, 1, NULL) == MOET_EINVAL,
	      "rope n_freq");
	CHECK(moet_gpu_rope(d, 2, 16, 2, 16, 8, di, d, 1.0f, 1, NULL) == MOET_EINVAL,
	      "rope overlapping rows");
	CHECK(moet_gpu_attention(d, 64, 1, 1, 300, 8, (float **)di, (float **)di, 300, 8, di,
				 NULL, 1, 1.0f, d, 8, NULL) == MOET_EINVAL, "attention d_qk");
	CHECK(moet_gpu_attention(d, 64, 1, 1, 64, 8, NULL, (float **)di, 64, 8, di, NULL, 1, 1.0f,
				 d, 8, NULL) == MOET_EINVAL, "attention NULL");
	setenv("MOET_GPU_ATTN", "fast", 1);
	CHECK(moet_gpu_attention(d, 64, 1, 1, 64, 8, (float **)di, (float **)di, 64, 8, di, NULL,
				 16, 1.0f, d, 8, NULL) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "MOET_GPU_ATTN"), "MOET_GPU_ATTN=fast refused by name: %s",
	      moet_errmsg());
	unsetenv("MOET_GPU_ATTN");
	CHECK(moet_gpu_kv_write(d, 4, d, 4, 1, 1, 4, 4, 4, (float **)di, (float **)di, 8, 4, di,
				NULL, NULL) == MOET_EINVAL, "kv_write kvb stride");
	CHECK(moet_gpu_router(d, 1, 10, d, 3, 1, 2, 1, 1.0f, di, d, NULL) == MOET_EINVAL,
	      "router groups");
	CHECK(moet_gpu_router(d, 1, 10, d, 1, 1, 11, 1, 1.0f, di, d, NULL) == MOET_EINVAL,
	      "router top_k");
	CHECK(moet_gpu_embed(&m, di, 1, d, NULL) == MOET_EINVAL, "embed F8");
	CHECK(moet_gpu_add(NULL, d, 4, NULL) == MOET_EINVAL, "add NULL");
	CHECK(moet_gpu_combine(d, 1, NULL, d, 2, NULL, 1, 4, d, NULL) == MOET_EINVAL,
	      "combine slot");
	moet_gpu_free(d);
	moet_gpu_free(di);
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	test_bad_input();
	test_embed();
	test_add_combine();
	test_router();
	test_rmsnorm();
	test_rope();
	test_attention();
	return moet_test_done("test_gpu_dense");
}
