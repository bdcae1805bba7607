/*
 * test_gpu_linear.c: the CUDA dense linear layer (gpu/linear.cu, gpu/linear_ks.cu,
 * gpu/linear_tall.cu) against the CPU scalar reference moet_dot_ref, bit for bit (NaN payloads
 * aside), on random data of small, tiny-model and Kimi-K2 shapes, every token class, edge
 * values: the row machinery's reference variant (MOET_GPU_LINEAR=rows), the default
 * (MOET_GPU_LINEAR=auto: linear_ks for matrices of at most 16 rows per SM, linear_tall for
 * larger ones at 1-4 tokens by auto_kernel's rule), repeated,
 * MOET_GPU_LINEAR=ksplit and MOET_GPU_LINEAR=tall, with the calls linear_ks and linear_tall
 * took counted against the rule; and the single-expert FFN through them (moet_gpu_ffn_ks)
 * against moet_expert_ffn_ref.
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
#include "moet_gpu.h"
#include "moet_test.h"

#include "gpu_check.h"

/* ---- a parallel loop for the scalar reference ------------------------------------------- */

typedef void (*par_fn)(void *ctx, int64_t i);
typedef struct {
	par_fn fn;
	void *ctx;
	int64_t n, next;
	pthread_mutex_t mu;
} par_job;

static void *par_worker(void *arg)
{
	par_job *j = arg;
	for (;;) {
		pthread_mutex_lock(&j->mu);
		int64_t i = j->next++;
		pthread_mutex_unlock(&j->mu);
		if (i >= j->n)
			return NULL;
		j->fn(j->ctx, i);
	}
}

static void par_for(int64_t n, par_fn fn, void *ctx)
{
	par_job j = { fn, ctx, n, 0, PTHREAD_MUTEX_INITIALIZER };
	long nt = sysconf(_SC_NPROCESSORS_ONLN);
	pthread_t th[32];
	int started = 0;
	nt = nt < 1 ? 1 : nt > 32 ? 32 : nt;
	for (long i = 0; i < nt; i++)
		if (!pthread_create(&th[started], NULL, par_worker, &j))
			started++;
	par_worker(&j);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}

/* ---- linear ----------------------------------------------------------------------------- */

typedef struct {
	const moet_mat *w;
	const float *x, *y;
	int64_t x_stride, y_stride, n_tok;
	const int64_t *rows;
	int bad;            /* first mismatching row index + 1 */
	pthread_mutex_t mu;
} lin_ctx;

static void lin_row(void *ctx, int64_t i)
{
	lin_ctx *c = ctx;
	const int64_t r = c->rows[i];
	for (int64_t t = 0; t < c->n_tok; t++) {
		float ref = moet_dot_ref(c->w, r, c->x + t * c->x_stride);
		float got = c->y[t * c->y_stride + r];
		if (memcmp(&ref, &got, 4) && !(nan_f(ref) && nan_f(got))) {
			pthread_mutex_lock(&c->mu);
			if (!c->bad) {
				c->bad = 1;
				fprintf(stderr, "  row %lld token %lld: gpu %08x (%g), cpu %08x (%g)\n",
					(long long)r, (long long)t, moet_f32_bits(got), (double)got,
					moet_f32_bits(ref), (double)ref);
			}
			pthread_mutex_unlock(&c->mu);
			return;
		}
	}
}

static int64_t n_lin_cases, n_lin_dots;

/* The SM count of device 0 (MOET_GPU_LINEAR=auto's rule is per SM). */
static int gpu_sms(void)
{
	static int n;
	moet_gpu_info info;
	if (!n)
		n = moet_gpu_info_get(&info) == 0 ? info.sm_count : -1;
	CHECK(n > 0, "moet_gpu_info_get: %s", moet_errmsg());
	return n;
}

/* gpu/linear.cu's MOET_GPU_LINEAR=auto rule, written out, for a matrix of R rows and n tokens
 * that linear_ks / linear_tall can take (ks_fits, tall_fits): 0 the row machinery, 1 linear_ks
 * (at most 16 rows per SM), 2 linear_tall (more rows: at most 2 tokens, or at most 4 and at most
 * 128 rows per SM). */
static int auto_kernel(int64_t R, int ks_fits, int tall_fits, int64_t n)
{
	const int64_t sms = gpu_sms();
	if (R <= 16 * sms)
		return ks_fits ? 1 : 0;
	return tall_fits && (n <= 2 || (n <= 4 && R <= 128 * sms)) ? 2 : 0;
}

/* One linear case: R x K of dtype dt, n_tok tokens, strides padded by pad floats; at most
 * budget scalar multiply-adds of reference work (rows sampled beyond it). */
static void linear_case(const char *name, moet_dtype dt, int64_t R, int64_t K, int64_t n_tok,
			int64_t pad, int edge, double budget)
{
	const size_t esz = dt == MOET_DT_F8_E4M3 ? 1 : dt == MOET_DT_BF16 ? 2 : 4;
	const int64_t nb = ((R + 127) / 128) * ((K + 127) / 128);
	const int64_t xs = K + pad, ys = R + pad;
	void *w = malloc((size_t)(R * K) * esz);
	float *s = dt == MOET_DT_F8_E4M3 ? malloc((size_t)nb * sizeof(float)) : NULL;
	float *x = malloc((size_t)(n_tok * xs) * sizeof(float));
	float *y = malloc((size_t)(n_tok * ys) * sizeof(float));
	float *y2 = malloc((size_t)(n_tok * ys) * sizeof(float));
	int64_t *rows = malloc((size_t)R * sizeof(int64_t));
	void *dw = NULL, *ds = NULL, *dx = NULL, *dy = NULL;
	if (!w || (dt == MOET_DT_F8_E4M3 && !s) || !x || !y || !y2 || !rows) {
		CHECK(0, "%s: host memory", name);
		goto out;
	}
	fill_weights(dt, w, (size_t)(R * K), edge);
	for (int64_t b = 0; s && b < nb; b++)
		s[b] = edge && b % 5 == 1 ? 0x1p-140f : ldexpf(1.0f + rnd_unit() * 0.5f,
							       -4 - (int)(rnd() % 6));
	for (int64_t i = 0; i < n_tok * xs; i++)
		x[i] = edge && rnd() % 8 == 0 ? ((rnd() & 1) ? -0.0f : 0x1p-130f) : rnd_unit();
	dw = up(w, (size_t)(R * K) * esz);
	ds = s ? up(s, (size_t)nb * sizeof(float)) : NULL;
	dx = up(x, (size_t)(n_tok * xs) * sizeof(float));
	dy = up(NULL, (size_t)(n_tok * ys) * sizeof(float));
	if (!dw || (s && !ds) || !dx || !dy)
		goto out;
	moet_mat hm = { dt, R, K, w, s }, dm = { dt, R, K, dw, ds };
	/* The reference variant of the row kernels (MOET_GPU_ROWS_KERNEL=ref, MOET_GPU_LINEAR=
	 * rows), the default (wide rows where it applies; MOET_GPU_LINEAR=auto), twice, the
	 * blocks of K over the warps wherever they take the call (MOET_GPU_LINEAR=ksplit,
	 * gpu/linear_ks.cu) and a warp per 8 rows wherever it takes the call (MOET_GPU_LINEAR=
	 * tall, gpu/linear_tall.cu; both counted): all bit-identical, and the first checked
	 * below. */
	static const char *const var[5] = { "ref", "", "", "", "" };
	static const char *const lin[5] = { "rows", "", "", "ksplit", "tall" };
	static const char *const what[5] = { "ref", "default", "repeated default", "ksplit",
					     "tall" };
	/* gpu/linear.cu's conditions, written out: at most 16 tokens, whole 128-column blocks,
	 * aligned rows, and at most 256 MiB of weight reads over the token tiles (8 tokens for F8,
	 * else 4) */
	const int64_t ks_tb = dt == MOET_DT_F8_E4M3 && n_tok > 4 ? 8 : n_tok > 2 ? 4 : n_tok;
	const int ks_fits = K % 128 == 0 && n_tok <= 16 && (K * (int64_t)esz) % 16 == 0 &&
			    xs % 4 == 0 &&
			    R * K * (int64_t)esz * ((n_tok + ks_tb - 1) / ks_tb) <= (256ll << 20);
	/* ... linear_tall the same without the byte bound; the default by auto_kernel */
	const int tall_fits = K % 128 == 0 && n_tok <= 16 && (K * (int64_t)esz) % 16 == 0 &&
			      xs % 4 == 0;
	const int ker_auto = auto_kernel(R, ks_fits, tall_fits, n_tok);
	const int ks_auto = ker_auto == 1, tall_auto = ker_auto == 2;
	for (int v = 0; v < 5; v++) {
		setenv("MOET_GPU_ROWS_KERNEL", var[v], 1);
		setenv("MOET_GPU_LINEAR", lin[v], 1);
		const uint64_t ks0 = moet_gpu_linear_ks_calls();
		const uint64_t tl0 = moet_gpu_linear_tall_calls();
		int bad = dev_fail(moet_gpu_linear(&dm, dx, xs, n_tok, dy, ys, NULL), name) ||
			  down(v ? y2 : y, dy, (size_t)(n_tok * ys) * sizeof(float));
		const uint64_t ks_n = moet_gpu_linear_ks_calls() - ks0;
		const uint64_t tl_n = moet_gpu_linear_tall_calls() - tl0;
		unsetenv("MOET_GPU_ROWS_KERNEL");
		unsetenv("MOET_GPU_LINEAR");
		if (bad)
			goto out;
		CHECK(ks_n == (uint64_t)(v == 3 ? ks_fits : v == 1 || v == 2 ? ks_auto : 0),
		      "%s: %llu calls through linear_ks (variant %s, fits %d, auto %d)", name,
		      (unsigned long long)ks_n, what[v], ks_fits, ks_auto);
		CHECK(tl_n == (uint64_t)(v == 4 ? tall_fits : v == 1 || v == 2 ? tall_auto : 0),
		      "%s: %llu calls through linear_tall (variant %s, fits %d, auto %d)", name,
		      (unsigned long long)tl_n, what[v], tall_fits, tall_auto);
		if (v)
			CHECK(!memcmp(y, y2, (size_t)(n_tok * ys) * sizeof(float)),
			      "%s: %s run differs from the ref variant", name, what[v]);
	}
	/* Rows to check: all within the budget, else a sample with the first and the last. */
	int64_t n_rows = R;
	double per_row = (double)K * (double)n_tok;
	if ((double)R * per_row > budget) {
		n_rows = (int64_t)(budget / per_row);
		n_rows = n_rows < 2 ? 2 : n_rows > R ? R : n_rows;
	}
	for (int64_t i = 0; i < n_rows; i++)
		rows[i] = n_rows == R ? i : i == 0 ? 0 : i == 1 ? R - 1 : (int64_t)(rnd() % R);
	lin_ctx c = { &hm, x, y, xs, ys, n_tok, rows, 0, PTHREAD_MUTEX_INITIALIZER };
	par_for(n_rows, lin_row, &c);
	CHECK(!c.bad, "%s: %s %lldx%lld, %lld tokens: mismatch", name,
	      dt == MOET_DT_F8_E4M3 ? "F8" : dt == MOET_DT_BF16 ? "BF16" : "F32", (long long)R,
	      (long long)K, (long long)n_tok);
	n_lin_cases++;
	n_lin_dots += n_rows * n_tok;
out:
	moet_gpu_free(dw);
	moet_gpu_free(ds);
	moet_gpu_free(dx);
	moet_gpu_free(dy);
	free(w);
	free(s);
	free(x);
	free(y);
	free(y2);
	free(rows);
}

static void test_linear(void)
{
	static const int64_t dims[] = { 1, 13, 16, 127, 128, 129, 200 };
	static const int64_t toks[] = { 1, 2, 3, 5, 9, 17 };
	const moet_dtype dts[3] = { MOET_DT_F8_E4M3, MOET_DT_BF16, MOET_DT_F32 };
	int k = 0;
	for (int a = 0; a < 7; a++)
		for (int b = 0; b < 7; b++, k++)
			linear_case("linear-small", dts[k % 3], dims[a], dims[b], toks[k % 6],
				    k % 4 == 0 ? 3 : 0, k % 5 == 0, 1e9);
	/* Tiny model shapes (q_a 96x256, q_b 192x96, kv_a 80x256, kv_b 256x64, o 256x128, MLP,
	 * router 32x256, lm_head 1024x256) and every token class up to 512. */
	static const int64_t tiny[][2] = { { 96, 256 }, { 192, 96 }, { 80, 256 }, { 256, 64 },
					   { 256, 128 }, { 512, 256 }, { 256, 512 }, { 32, 256 },
					   { 1024, 256 } };
	static const int64_t tt[] = { 1, 4, 8, 64, 512 };
	for (int i = 0; i < 9; i++)
		for (int j = 0; j < 5; j++)
			linear_case("linear-tiny", i == 7 || i == 8 ? MOET_DT_BF16 : MOET_DT_F8_E4M3,
				    tiny[i][0], tiny[i][1], tt[j], 0, 0, 2e8);
	/* Kimi-K2: q_a, q_b, kv_a, kv_b, o, dense MLP, router, lm_head. */
	linear_case("kimi-q_a", MOET_DT_F8_E4M3, 1536, 7168, 1, 0, 0, 3e8);
	linear_case("kimi-q_a", MOET_DT_F8_E4M3, 1536, 7168, 37, 0, 1, 3e8);
	linear_case("kimi-q_b", MOET_DT_F8_E4M3, 64 * 192, 1536, 3, 0, 0, 3e8);
	linear_case("kimi-q_b", MOET_DT_F8_E4M3, 64 * 192, 1536, 512, 0, 0, 3e8);
	linear_case("kimi-kv_a", MOET_DT_F8_E4M3, 576, 7168, 2, 0, 0, 3e8);
	linear_case("kimi-kv_a", MOET_DT_F8_E4M3, 576, 7168, 100, 0, 0, 3e8);
	linear_case("kimi-kv_b", MOET_DT_F8_E4M3, 64 * 256, 512, 8, 0, 0, 3e8);
	linear_case("kimi-kv_b", MOET_DT_F8_E4M3, 64 * 256, 512, 1, 0, 1, 3e8);
	linear_case("kimi-o", MOET_DT_F8_E4M3, 7168, 64 * 128, 4, 0, 0, 3e8);
	linear_case("kimi-shared-down", MOET_DT_F8_E4M3, 7168, 2048, 3, 0, 1, 3e8);
	linear_case("kimi-o", MOET_DT_F8_E4M3, 7168, 64 * 128, 1, 0, 0, 3e8);
	/* 2 tokens on few 256-row tiles: the default runs them as 1-token tiles (split2) */
	linear_case("kimi-o", MOET_DT_F8_E4M3, 7168, 64 * 128, 2, 0, 1, 3e8);
	linear_case("odd-k-two", MOET_DT_F8_E4M3, 300, 1000, 2, 3, 1, 3e8);
	linear_case("kimi-o", MOET_DT_F8_E4M3, 7168, 64 * 128, 256, 0, 0, 3e8);
	linear_case("kimi-mlp-gate", MOET_DT_F8_E4M3, 18432, 7168, 4, 0, 0, 3e8);
	linear_case("kimi-mlp-down", MOET_DT_F8_E4M3, 7168, 18432, 16, 0, 0, 3e8);
	linear_case("kimi-router", MOET_DT_BF16, 384, 7168, 64, 0, 0, 3e8);
	/* small matrices at decode batches */
	linear_case("kimi-kv_a", MOET_DT_F8_E4M3, 576, 7168, 16, 0, 1, 3e8);
	linear_case("kimi-q_a", MOET_DT_F8_E4M3, 1536, 7168, 16, 0, 0, 3e8);
	linear_case("router-128", MOET_DT_BF16, 128, 7168, 16, 0, 0, 3e8);
	linear_case("kimi-kv_a", MOET_DT_F8_E4M3, 576, 7168, 64, 0, 0, 3e8);
	linear_case("kimi-lm_head", MOET_DT_BF16, 163840, 7168, 1, 0, 0, 3e8);
	linear_case("kimi-lm_head", MOET_DT_BF16, 163840, 7168, 512, 0, 0, 3e8);
	linear_case("f32-wide", MOET_DT_F32, 1000, 7168, 9, 0, 1, 3e8);
	/* MOET_GPU_LINEAR=ksplit's edges: rows past a block's 8, a last round of fewer than 8
	 * blocks, one block, every token tile (1, 2, 4, 8; BF16 and F32 at most 4) and two tiles;
	 * for MOET_GPU_LINEAR=tall rows past a warp's 8, fewer blocks than its stages (1, 2) and
	 * more (9, 16, 56), token tiles of 1, 2 and 4 with a partial last one */
	static const int64_t ksc[][3] = { { 13, 1152, 16 }, { 129, 128, 3 }, { 8, 256, 1 },
					  { 200, 1024, 7 }, { 61, 2048, 2 }, { 576, 7168, 12 } };
	for (int i = 0; i < 6; i++)
		for (int d = 0; d < 3; d++)
			linear_case("ksplit-edges", dts[d], ksc[i][0], ksc[i][1], ksc[i][2],
				    i % 2 ? 4 : 0, (i + d) % 2, 3e8);
	/* MOET_GPU_LINEAR=auto's edge: 16 rows per SM take linear_ks, 8 more keep the rows */
	const int64_t edge_rows = 16 * (int64_t)gpu_sms();
	linear_case("auto-edge", MOET_DT_F8_E4M3, edge_rows, 1024, 4, 0, 0, 3e8);
	linear_case("auto-edge", MOET_DT_F8_E4M3, edge_rows + 8, 1024, 4, 0, 0, 3e8);
	/* ... and linear_tall's: 128 rows per SM at 3-4 tokens, 8 more keep the rows there */
	linear_case("auto-edge-tall", MOET_DT_F8_E4M3, 8 * edge_rows, 256, 3, 0, 0, 3e8);
	linear_case("auto-edge-tall", MOET_DT_F8_E4M3, 8 * edge_rows + 8, 256, 4, 0, 0, 3e8);
	linear_case("auto-edge-tall", MOET_DT_F8_E4M3, 8 * edge_rows + 8, 256, 2, 0, 0, 3e8);
	printf("linear: %lld cases, %lld (row, token) dots compared bit for bit\n",
	       (long long)n_lin_cases, (long long)n_lin_dots);
}

/* ---- the expert FFN through gpu/linear_ks.cu (moet_gpu_ffn_ks) ---------------------------- */

/* One case: gate/up [I x H], down [H x I] of dtype dt, n tokens: with MOET_GPU_LINEAR=ksplit
 * and =tall taken where every matrix qualifies (want_taken: both take these cases alike) and
 * then bit-equal to the CPU scalar reference moet_expert_ffn_ref (NaN canonical on both
 * sides); by default (auto) only up to 4 tokens and where auto_kernel sends gate and up to
 * linear_ks or linear_tall (down where it sends it, else the row machinery); never with
 * MOET_GPU_LINEAR=rows. */
static void ffn_ks_case(moet_dtype dt, int64_t I, int64_t H, int64_t n, int edge, int want_taken)
{
	const size_t esz = dt == MOET_DT_F8_E4M3 ? 1 : dt == MOET_DT_BF16 ? 2 : 4;
	const int64_t nsg = ((I + 127) / 128) * ((H + 127) / 128); /* gate/up scales */
	const int64_t nsd = ((H + 127) / 128) * ((I + 127) / 128); /* down's */
	void *w[3];
	float *sc[3] = { NULL, NULL, NULL };
	void *dw[3] = { NULL, NULL, NULL }, *ds[3] = { NULL, NULL, NULL };
	float *x = malloc((size_t)(n * H) * sizeof(float));
	float *ref = malloc((size_t)(n * H) * sizeof(float));
	float *got = malloc((size_t)(n * H) * sizeof(float));
	float *hs = malloc((size_t)I * sizeof(float));
	void *dx = NULL, *dscr = NULL, *dy = NULL;
	int ok = x && ref && got && hs;
	for (int m = 0; m < 3; m++) {
		w[m] = malloc((size_t)(I * H) * esz);
		ok = ok && w[m];
		if (ok)
			fill_weights(dt, w[m], (size_t)(I * H), edge);
		if (ok && dt == MOET_DT_F8_E4M3) {
			const int64_t ns = m < 2 ? nsg : nsd;
			ok = (sc[m] = malloc((size_t)ns * sizeof(float))) != NULL;
			for (int64_t b = 0; ok && b < ns; b++)
				sc[m][b] = ldexpf(1.0f + rnd_unit() * 0.5f, -4 - (int)(rnd() % 6));
		}
	}
	if (!ok) {
		CHECK(0, "ffn_ks: host memory");
		goto out;
	}
	for (int64_t i = 0; i < n * H; i++)
		x[i] = edge && rnd() % 16 == 0 ? 40.0f * rnd_unit() : rnd_unit();
	moet_mat hm[3], dm[3];
	for (int m = 0; m < 3; m++) {
		const int64_t R = m < 2 ? I : H, K = m < 2 ? H : I;
		dw[m] = up(w[m], (size_t)(I * H) * esz);
		ds[m] = sc[m] ? up(sc[m], (size_t)(m < 2 ? nsg : nsd) * sizeof(float)) : NULL;
		hm[m] = (moet_mat){ dt, R, K, w[m], sc[m] };
		dm[m] = (moet_mat){ dt, R, K, dw[m], ds[m] };
	}
	dx = up(x, (size_t)(n * H) * sizeof(float));
	dscr = up(NULL, (size_t)(n * I) * sizeof(float));
	dy = up(NULL, (size_t)(n * H) * sizeof(float));
	if (!dx || !dscr || !dy || !dw[0] || !dw[1] || !dw[2])
		goto out;
	int taken = -1;
	setenv("MOET_GPU_LINEAR", "rows", 1);
	CHECK(moet_gpu_ffn_ks(&dm[0], &dm[1], &dm[2], dx, H, n, dscr, (size_t)(n * I) * 4, dy, H,
			      NULL, &taken) == 0 && taken == 0,
	      "ffn_ks %lldx%lld: taken %d with MOET_GPU_LINEAR=rows", (long long)I, (long long)H,
	      taken);
	/* The reference, then the default (auto: up to 4 tokens, gate and up through
	 * linear_ks where they have at most 16 rows per SM, down too where it has, else the row
	 * machinery) and ksplit (all three), each into an output poisoned first and compared bit
	 * for bit where taken. */
	for (int64_t t = 0; t < n; t++)
		CHECK(moet_expert_ffn_ref(&hm[0], &hm[1], &hm[2], x + t * H, 1, hs, ref + t * H) == 0,
		      "ffn reference");
	const int kg = auto_kernel(I, want_taken, want_taken, n);
	const int kd = auto_kernel(H, want_taken, want_taken, n);
	const int want_auto = want_taken && n <= 4 && kg;
	static const char *const lin[3] = { "", "ksplit", "tall" };
	static const char *const what[3] = { "ffn_ks (auto) against moet_expert_ffn_ref",
					     "ffn_ks (ksplit) against moet_expert_ffn_ref",
					     "ffn_ks (tall) against moet_expert_ffn_ref" };
	for (int v = 0; v < 3; v++) {
		const int want = v ? want_taken : want_auto;
		/* the kernel calls through linear_ks, then through linear_tall */
		const uint64_t want_ks = !want || v == 2 ? 0 : v ? 3 : 2 * (kg == 1) + (kd == 1);
		const uint64_t want_tl = !want || v == 1 ? 0 : v ? 3 : 2 * (kg == 2) + (kd == 2);
		memset(got, 0xFF, (size_t)(n * H) * sizeof(float));
		if (dev_fail(moet_gpu_copy_h2d(dy, got, (size_t)(n * H) * sizeof(float)), "poison"))
			goto out;
		setenv("MOET_GPU_LINEAR", lin[v], 1);
		const uint64_t k0 = moet_gpu_linear_ks_calls(), t0 = moet_gpu_linear_tall_calls();
		int rc = moet_gpu_ffn_ks(&dm[0], &dm[1], &dm[2], dx, H, n, dscr,
					 (size_t)(n * I) * 4, dy, H, NULL, &taken);
		const uint64_t ks = moet_gpu_linear_ks_calls() - k0;
		const uint64_t tl = moet_gpu_linear_tall_calls() - t0;
		unsetenv("MOET_GPU_LINEAR");
		if (dev_fail(rc, "ffn_ks"))
			goto out;
		CHECK(taken == want && ks == want_ks && tl == want_tl,
		      "ffn_ks %s %lldx%lld, %lld tokens, %s: taken %d (want %d), %llu + %llu kernel "
		      "calls (want %llu + %llu)",
		      dt == MOET_DT_F8_E4M3 ? "F8" : dt == MOET_DT_BF16 ? "BF16" : "F32",
		      (long long)I, (long long)H, (long long)n, v ? lin[v] : "auto", taken, want,
		      (unsigned long long)ks, (unsigned long long)tl, (unsigned long long)want_ks,
		      (unsigned long long)want_tl);
		if (!taken || down(got, dy, (size_t)(n * H) * sizeof(float)))
			continue;
		same_bits(what[v], got, ref, (size_t)(n * H), 0);
	}
out:
	for (int m = 0; m < 3; m++) {
		moet_gpu_free(dw[m]);
		moet_gpu_free(ds[m]);
		free(w[m]);
		free(sc[m]);
	}
	moet_gpu_free(dx);
	moet_gpu_free(dscr);
	moet_gpu_free(dy);
	free(x);
	free(ref);
	free(got);
	free(hs);
}

static void test_ffn_ks(void)
{
	ffn_ks_case(MOET_DT_F8_E4M3, 256, 384, 1, 1, 1);
	ffn_ks_case(MOET_DT_F8_E4M3, 256, 1024, 4, 0, 1);   /* the default takes it too */
	ffn_ks_case(MOET_DT_F8_E4M3, 2048, 7168, 3, 0, 1);  /* Kimi-K2's shared expert */
	ffn_ks_case(MOET_DT_F8_E4M3, 2048, 7168, 4, 0, 1);   /* auto's widest */
	ffn_ks_case(MOET_DT_F8_E4M3, 2048, 7168, 8, 0, 1);   /* ksplit only */
	ffn_ks_case(MOET_DT_F8_E4M3, 256, 384, 9, 0, 1);     /* two token tiles: ksplit only */
	ffn_ks_case(MOET_DT_F8_E4M3, 2048, 7168, 16, 1, 1);
	ffn_ks_case(MOET_DT_F8_E4M3, 18432, 7168, 2, 0, 1); /* Kimi-K2's dense MLP */
	ffn_ks_case(MOET_DT_BF16, 384, 256, 5, 1, 1);
	ffn_ks_case(MOET_DT_F32, 128, 128, 2, 0, 1);
	ffn_ks_case(MOET_DT_F8_E4M3, 200, 256, 2, 0, 0);    /* down's K: not whole blocks */
	ffn_ks_case(MOET_DT_F8_E4M3, 256, 256, 17, 0, 0);   /* too many tokens */
	printf("ffn through linear_ks and linear_tall: bit-equal to moet_expert_ffn_ref where "
	       "taken\n");
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	test_linear();
	test_ffn_ks();
	return moet_test_done("test_gpu_linear");
}
