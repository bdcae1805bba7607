/*
 * test_gpu_sample.c: seeded sampling on the device (gpu/sample.cu) draws exactly the tokens
 * moet_sample (runtime/sample.c) draws on the host, and the wiring uses it.
 *
 *   1. moet_exp64 (common/moet_exp64.h, the exp both sides use) within 2 ulp of libm's exp on
 *      random inputs over the whole range, and its special cases (runs without a GPU too);
 *   2. for vocabularies 1 .. 163840 (both sides of the one-block limit of 2048), rows of
 *      logits of many kinds (ordinary, many ties, NaNs with -inf and signed zeros, all equal,
 *      all NaN, all -inf, +inf, near-ties, huge magnitudes, fewer finite values than top_k),
 *      and parameter sets over temperature (0, tiny, ordinary, huge), top_k (0, 1, .., the
 *      2048/2049 edge, n-1, n, > n) and top_p (1 .. 1e-6) with random seeds and positions:
 *      every device id equals moet_sample's, and the device's binary64 prefix total (the
 *      number the uniform is scaled by) equals a host recomputation of moet_sample's sums bit
 *      for bit; one call per vocabulary carries every draw (mixed paths), a repeat call gives
 *      the same ids, and single draws alone give their batch ids (batch invariance);
 *   3. bad arguments: MOET_EINVAL;
 *   4. moet_backend_draw on the CUDA backend (its sample op) and with MOET_SAMPLE_DEVICE=0
 *      (download + moet_sample): the same ids as moet_sample;
 *   5. with the oracle fixtures: moet_model_generate_sampled on CUDA (device sampling), on
 *      CUDA with MOET_SAMPLE_DEVICE=0 and on the CPU backend give the same tokens.
 * Skips (77) without a CUDA device (after part 1).
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_backend.h"
#include "moet_err.h"
#include "moet_exp64.h"
#include "moet_gpu.h"
#include "moet_model.h"
#include "moet_sample.h"
#include "moet_test.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
	return moet_test_xorshift64(&rng);
}
static double unit(void) /* [0, 1) */
{
	return (double)(rnd() >> 11) * 0x1p-53;
}

/* ---- 1. moet_exp64 against libm -------------------------------------------------------- */

static double ulps(double a, double b)
{
	if (a == b)
		return 0;
	double u = nextafter(fabs(b), INFINITY) - fabs(b);
	return fabs(a - b) / u;
}

static void exp64_vs_libm(void)
{
	double worst = 0, at = 0;
	for (int i = 0; i < 2000000; i++) {
		double x = (i & 1) ? -unit() * 40.0 : -745.0 + unit() * (709.7 + 745.0);
		double d = ulps(moet_exp64(x), exp(x));
		if (d > worst) {
			worst = d;
			at = x;
		}
	}
	CHECK(worst <= 2.0, "moet_exp64: %.2f ulp from exp at %a", worst, at);
	const double sp[] = { 0.0, -0.0, 709.78, 709.8, -745.1, -745.2, -746.5, -1e-300, 1e-300 };
	for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]); i++)
		CHECK(ulps(moet_exp64(sp[i]), exp(sp[i])) <= 2.0, "moet_exp64(%a) = %a, exp %a",
		      sp[i], moet_exp64(sp[i]), exp(sp[i]));
	CHECK(moet_exp64(-INFINITY) == 0 && isinf(moet_exp64(INFINITY)) && isnan(moet_exp64(NAN)),
	      "moet_exp64 specials");
	printf("moet_exp64: within %.2f ulp of libm over 2M inputs\n", worst);
}

/* ---- 2. rows of logits ----------------------------------------------------------------- */

enum { K_NORMAL, K_TIES, K_NAN, K_EQUAL, K_ALLNAN, K_ALLNEGINF, K_POSINF, K_NEAR, K_HUGE,
       K_FEWFINITE, K_FEWNAN, N_KINDS };

static void fill_row(float *l, int64_t n, int kind)
{
	for (int64_t i = 0; i < n; i++) {
		double g = (unit() + unit() + unit() - 1.5) * 4.0;
		float v = (float)g;
		switch (kind) {
		case K_TIES: v = (float)floor(g * 2.0) * 0.5f; break;
		case K_NAN: {
			uint64_t r = rnd() % 100;
			v = r < 5 ? NAN : r < 10 ? -INFINITY : r < 15 ? ((rnd() & 1) ? -0.0f : 0.0f)
								: v;
			break;
		}
		case K_EQUAL: v = 1.25f; break;
		case K_ALLNAN: v = NAN; break;
		case K_ALLNEGINF: v = -INFINITY; break;
		case K_POSINF: v = (rnd() % 50 == 0) ? INFINITY : v; break;
		case K_NEAR: v = 3.0f + (float)(rnd() % 8) * 0x1p-22f; break;
		case K_HUGE: v = (float)(g * 1e37); break;
		case K_FEWFINITE: v = (rnd() % 64 == 0) ? v : -INFINITY; break;
		case K_FEWNAN: v = (rnd() % 64 == 0) ? v : NAN; break;
		default: break;
		}
		l[i] = v;
	}
	if (kind == K_POSINF && n > 2)
		l[n / 2] = INFINITY;
	if (kind == K_NAN && n > 1)
		l[0] = NAN; /* moet_argmax must look past it */
}

static const float *sort_vals;
static int by_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	float vx = sort_vals[x], vy = sort_vals[y];
	int nx = isnan(vx), ny = isnan(vy);
	if (nx != ny)
		return nx - ny;
	if (!nx && vx != vy)
		return vx > vy ? -1 : 1;
	return (x > y) - (x < y);
}

/* moet_sample's binary64 prefix total for these arguments (0 for greedy), from its loops. */
static double host_prefix(const float *l, int64_t n, const moet_sample_params *p, int64_t *idx)
{
	if (p->temperature == 0)
		return 0.0;
	for (int64_t i = 0; i < n; i++)
		idx[i] = i;
	sort_vals = l;
	qsort(idx, (size_t)n, sizeof(*idx), by_desc);
	int64_t keep = (p->top_k > 0 && p->top_k < n) ? p->top_k : n;
	while (keep > 1 && isnan(l[idx[keep - 1]]))
		keep--;
	const double inv_t = 1.0 / p->temperature, top = (double)l[idx[0]];
	double total = 0.0, mass = 0.0, prefix = 0.0;
	for (int64_t i = 0; i < keep; i++)
		total += moet_exp64(((double)l[idx[i]] - top) * inv_t);
	int64_t cut = keep;
	for (int64_t i = 0; i < keep; i++) {
		mass += moet_exp64(((double)l[idx[i]] - top) * inv_t);
		if (mass >= p->top_p * total) {
			cut = i + 1;
			break;
		}
	}
	for (int64_t i = 0; i < cut; i++)
		prefix += moet_exp64(((double)l[idx[i]] - top) * inv_t);
	return prefix;
}

static int same_bits(double a, double b)
{
	return memcmp(&a, &b, sizeof(a)) == 0 || (isnan(a) && isnan(b));
}

typedef struct draw_case {
	moet_sample_params p;
	int64_t pos, row;
} draw_case;

static void case_params(int64_t n, int it, int ik, int ip, moet_sample_params *p)
{
	static const double temps[] = { 0.0, 1e-300, 0.05, 0.7, 1.0, 2.5, 1e300 };
	static const double tops[] = { 1.0, 0.9, 0.5, 1e-6 };
	const int64_t ks[] = { 0, 1, 2, 40, 2048, 2049, n - 1, n, n + 3 };
	p->temperature = temps[it];
	p->top_k = ks[ik];
	p->top_p = tops[ip];
	p->seed = rnd();
}

#define N_T 7
#define N_K 9
#define N_P 4

/* Every draw of vocabulary n in one device call, then the checks. */
static void vocab_cases(int64_t n, int all_combos)
{
	float *h = malloc((size_t)(N_KINDS * n) * sizeof(float));
	int64_t *idx = malloc((size_t)n * sizeof(int64_t));
	const int max_draws = N_KINDS * N_T * N_K * N_P;
	draw_case *dc = malloc((size_t)max_draws * sizeof(*dc));
	moet_gpu_sample_row *rows = malloc((size_t)max_draws * sizeof(*rows));
	int32_t *got = malloc((size_t)max_draws * sizeof(int32_t)), *got2 = malloc(
		(size_t)max_draws * sizeof(int32_t));
	double *mass = malloc((size_t)max_draws * sizeof(double));
	float *d_l = NULL;
	int32_t *d_ids = NULL;
	double *d_mass = NULL;
	void *scratch = NULL;
	size_t sb = 0;
	int nd = 0;
	for (int k = 0; k < N_KINDS; k++)
		fill_row(h + (size_t)k * (size_t)n, n, k);
	for (int k = 0; k < N_KINDS; k++)
		for (int it = 0; it < N_T; it++)
			for (int ik = 0; ik < N_K; ik++)
				for (int ip = 0; ip < N_P; ip++) {
					if (!all_combos && rnd() % 16)
						continue;
					draw_case *c = &dc[nd++];
					case_params(n, it, ik, ip, &c->p);
					c->pos = (int64_t)(rnd() % 100000) - 10;
					c->row = k;
				}
	for (int i = 0; i < nd; i++)
		rows[i] = (moet_gpu_sample_row){ .temperature = dc[i].p.temperature,
			.top_p = dc[i].p.top_p, .top_k = dc[i].p.top_k, .seed = dc[i].p.seed,
			.pos = dc[i].pos, .row = dc[i].row };
	int rc = moet_gpu_sample_scratch_bytes(nd, n, &sb);
	CHECK(rc == 0, "scratch bytes: %s", moet_errmsg());
	if (rc || moet_gpu_alloc((size_t)(N_KINDS * n) * sizeof(float), (void **)&d_l) ||
	    moet_gpu_alloc((size_t)nd * sizeof(int32_t), (void **)&d_ids) ||
	    moet_gpu_alloc((size_t)nd * sizeof(double), (void **)&d_mass) ||
	    moet_gpu_alloc(sb, &scratch) ||
	    moet_gpu_copy_h2d(d_l, h, (size_t)(N_KINDS * n) * sizeof(float))) {
		CHECK(0, "n %lld: device setup: %s", (long long)n, moet_errmsg());
		goto out;
	}
	rc = moet_gpu_sample(d_l, nd, n, n, rows, scratch, sb, d_ids, d_mass, NULL);
	CHECK(rc == 0, "n %lld: sample: %s", (long long)n, moet_errmsg());
	if (rc || moet_gpu_sync(NULL) ||
	    moet_gpu_copy_d2h(got, d_ids, (size_t)nd * sizeof(int32_t)) ||
	    moet_gpu_copy_d2h(mass, d_mass, (size_t)nd * sizeof(double))) {
		CHECK(0, "n %lld: %s", (long long)n, moet_errmsg());
		goto out;
	}
	int bad = 0, bad_mass = 0;
	for (int i = 0; i < nd; i++) {
		const float *l = h + (size_t)dc[i].row * (size_t)n;
		int64_t want = -1;
		CHECK(moet_sample(l, n, &dc[i].p, dc[i].pos, idx, &want) == 0, "host sample");
		const double pm = host_prefix(l, n, &dc[i].p, idx);
		if (got[i] != want && bad++ < 8)
			CHECK(0, "n %lld kind %lld T %g k %lld p %g seed %llx pos %lld: device %d, "
			      "host %lld", (long long)n, (long long)dc[i].row, dc[i].p.temperature,
			      (long long)dc[i].p.top_k, dc[i].p.top_p,
			      (unsigned long long)dc[i].p.seed, (long long)dc[i].pos, got[i],
			      (long long)want);
		if (!same_bits(mass[i], pm) && bad_mass++ < 8)
			CHECK(0, "n %lld kind %lld T %g k %lld p %g: prefix total device %a, host %a",
			      (long long)n, (long long)dc[i].row, dc[i].p.temperature,
			      (long long)dc[i].p.top_k, dc[i].p.top_p, mass[i], pm);
	}
	CHECK(bad == 0 && bad_mass == 0, "n %lld: %d ids and %d totals of %d differ", (long long)n,
	      bad, bad_mass, nd);
	/* repeat: the same ids */
	if (!moet_gpu_sample(d_l, nd, n, n, rows, scratch, sb, d_ids, NULL, NULL) &&
	    !moet_gpu_copy_d2h(got2, d_ids, (size_t)nd * sizeof(int32_t)))
		CHECK(memcmp(got, got2, (size_t)nd * sizeof(int32_t)) == 0, "n %lld: repeat differs",
		      (long long)n);
	else
		CHECK(0, "repeat: %s", moet_errmsg());
	/* batch invariance: a few draws alone */
	for (int t = 0; t < 6 && nd > 0; t++) {
		int i = (int)(rnd() % (uint64_t)nd);
		int32_t one = -1;
		CHECK(moet_gpu_sample(d_l, 1, n, n, &rows[i], scratch, sb, d_ids, NULL, NULL) == 0 &&
		      moet_gpu_copy_d2h(&one, d_ids, sizeof(one)) == 0 && one == got[i],
		      "n %lld draw %d alone: %d, in the batch %d", (long long)n, i, one, got[i]);
	}
	printf("n %6lld: %4d draws, device ids and prefix totals equal the host's: %s\n",
	       (long long)n, nd, bad || bad_mass ? "NO" : "yes");
out:
	moet_gpu_free(d_l);
	moet_gpu_free(d_ids);
	moet_gpu_free(d_mass);
	moet_gpu_free(scratch);
	free(h);
	free(idx);
	free(dc);
	free(rows);
	free(got);
	free(got2);
	free(mass);
}

/* ---- 3. bad arguments ---------------------------------------------------------------------- */

static void bad_args(void)
{
	const int64_t n = 100;
	float *d_l = NULL;
	int32_t *d_ids = NULL;
	void *scratch = NULL;
	size_t sb = 0;
	if (moet_gpu_sample_scratch_bytes(1, n, &sb) || moet_gpu_alloc(n * 4, (void **)&d_l) ||
	    moet_gpu_alloc(64, (void **)&d_ids) || moet_gpu_alloc(sb, &scratch)) {
		CHECK(0, "bad_args setup: %s", moet_errmsg());
		goto out;
	}
	const moet_gpu_sample_row ok = { .temperature = 1, .top_p = 1, .top_k = 0 };
	moet_gpu_sample_row r[6] = { ok, ok, ok, ok, ok, ok };
	r[0].temperature = -1;
	r[1].temperature = NAN;
	r[2].temperature = INFINITY;
	r[3].top_k = -1;
	r[4].top_p = 0;
	r[5].top_p = 1.5;
	for (int i = 0; i < 6; i++)
		CHECK(moet_gpu_sample(d_l, 1, n, n, &r[i], scratch, sb, d_ids, NULL, NULL) ==
		      MOET_EINVAL, "bad row %d accepted", i);
	CHECK(moet_gpu_sample(d_l, 1, 0, n, &ok, scratch, sb, d_ids, NULL, NULL) == MOET_EINVAL,
	      "n 0");
	CHECK(moet_gpu_sample(d_l, 1, n, n - 1, &ok, scratch, sb, d_ids, NULL, NULL) ==
	      MOET_EINVAL, "stride < n");
	CHECK(moet_gpu_sample(d_l, 1, n, n, &ok, scratch, sb - 1, d_ids, NULL, NULL) ==
	      MOET_EINVAL, "small scratch");
	CHECK(moet_gpu_sample(NULL, 1, n, n, &ok, scratch, sb, d_ids, NULL, NULL) == MOET_EINVAL,
	      "NULL logits");
	CHECK(moet_gpu_sample(d_l, 1, n, n, NULL, scratch, sb, d_ids, NULL, NULL) == MOET_EINVAL,
	      "NULL rows");
	CHECK(moet_gpu_sample(d_l, 0, n, n, NULL, NULL, 0, NULL, NULL, NULL) == 0, "0 rows");
	CHECK(moet_gpu_sample_scratch_bytes(-1, n, &sb) == MOET_EINVAL, "negative rows");
out:
	moet_gpu_free(d_l);
	moet_gpu_free(d_ids);
	moet_gpu_free(scratch);
}

/* ---- 4. moet_backend_draw ------------------------------------------------------------------ */

static void backend_draw(void)
{
	const int64_t V = 5000, R = 4, N = 24;
	moet_backend *be = NULL;
	float *h = malloc((size_t)(R * V) * sizeof(float)), *d = NULL;
	int64_t *idx = malloc((size_t)V * sizeof(int64_t));
	moet_sample_params p[24];
	moet_draw dr[24];
	int64_t dev[24], host[24];
	for (int64_t r = 0; r < R; r++)
		fill_row(h + r * V, V, (int)r % 3);
	if (moet_backend_cuda_create(0, &be) || be->ops->alloc(be, (size_t)(R * V) * 4,
							       (void **)&d) ||
	    be->ops->upload(be, d, h, (size_t)(R * V) * 4)) {
		CHECK(0, "backend: %s", moet_errmsg());
		goto out;
	}
	CHECK(be->ops->sample != NULL, "the CUDA backend has a sample op");
	for (int i = 0; i < N; i++) {
		p[i] = (moet_sample_params){ .temperature = i % 4 ? 0.8 : 0, .top_k = i % 3 ? 0 : 30,
					     .top_p = i % 2 ? 0.9 : 1.0, .seed = rnd() };
		dr[i] = (moet_draw){ &p[i], i % R, 7 + i, &dev[i] };
	}
	unsetenv("MOET_SAMPLE_DEVICE");
	CHECK(moet_backend_draw(be, d, V, dr, N) == 0, "draw: %s", moet_errmsg());
	setenv("MOET_SAMPLE_DEVICE", "0", 1);
	for (int i = 0; i < N; i++)
		dr[i].out_id = &host[i];
	CHECK(moet_backend_draw(be, d, V, dr, N) == 0, "draw on the host: %s", moet_errmsg());
	unsetenv("MOET_SAMPLE_DEVICE");
	int bad = 0;
	for (int i = 0; i < N; i++) {
		int64_t want = -1;
		moet_sample(h + dr[i].row * V, V, &p[i], dr[i].pos, idx, &want);
		bad += dev[i] != want || host[i] != want;
	}
	CHECK(bad == 0, "moet_backend_draw: %d of %lld draws differ from moet_sample", bad,
	      (long long)N);
out:
	if (be && d)
		be->ops->free(be, d);
	moet_backend_destroy(be);
	free(h);
	free(idx);
}

/* ---- 5. generation on the fixtures --------------------------------------------------------- */

static void generation(void)
{
	char root[2048], dir[4096];
	snprintf(root, sizeof(root), "%s/tests/oracle/fixtures", moet_test_source_dir());
	DIR *dd = opendir(root);
	if (!dd) {
		printf("generation: no fixtures at %s (skipped)\n", root);
		return;
	}
	const moet_sample_params ps[4] = {
		{ .temperature = 0, .top_k = 0, .top_p = 1, .seed = 1 },
		{ .temperature = 0.8, .top_k = 0, .top_p = 0.9, .seed = 42 },
		{ .temperature = 1.3, .top_k = 5, .top_p = 1, .seed = 7 },
		{ .temperature = 1.0, .top_k = 0, .top_p = 1, .seed = 99 },
	};
	const int64_t prompt[5] = { 1, 5, 9, 2, 7 };
	struct dirent *de;
	int n_fix = 0;
	while ((de = readdir(dd)) && n_fix < 2) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", root, de->d_name);
		moet_model *cpu = NULL, *gpu = NULL;
		if (moet_model_open_on(dir, "cpu", &cpu) || moet_model_open_on(dir, "cuda", &gpu)) {
			CHECK(0, "%s: %s", de->d_name, moet_errmsg());
		} else {
			for (int i = 0; i < 4; i++) {
				int64_t a[12], b[12], c[12], na = 0, nb = 0, nc = 0;
				unsetenv("MOET_SAMPLE_DEVICE");
				int r1 = moet_model_generate_sampled(gpu, prompt, 5, 12, 0, &ps[i], a,
								    &na);
				setenv("MOET_SAMPLE_DEVICE", "0", 1);
				int r2 = moet_model_generate_sampled(gpu, prompt, 5, 12, 0, &ps[i], b,
								    &nb);
				unsetenv("MOET_SAMPLE_DEVICE");
				int r3 = moet_model_generate_sampled(cpu, prompt, 5, 12, 0, &ps[i], c,
								    &nc);
				CHECK(!r1 && !r2 && !r3 && na == 12 && nb == 12 && nc == 12 &&
				      !memcmp(a, b, sizeof(a)) && !memcmp(a, c, sizeof(a)),
				      "%s params %d: device / host-sampled / CPU tokens differ (%s)",
				      de->d_name, i, moet_errmsg());
			}
			printf("generation %s: device sampling = host sampling = CPU backend\n",
			       de->d_name);
		}
		moet_model_close(cpu);
		moet_model_close(gpu);
		n_fix++;
	}
	closedir(dd);
}

int main(void)
{
	exp64_vs_libm();
	const char *why = NULL;
	if (moet_gpu_count(&why) < 1) {
		printf("skip: no CUDA device (%s)\n", why ? why : "none");
		return moet_test_failures ? 1 : MOET_TEST_SKIP;
	}
	static const int64_t vocab[] = { 1, 2, 3, 17, 256, 2048, 2049, 4099 };
	for (size_t i = 0; i < sizeof(vocab) / sizeof(vocab[0]); i++)
		vocab_cases(vocab[i], 1);
	vocab_cases(163840, 0);
	vocab_cases(129280, 0);
	bad_args();
	backend_draw();
	generation();
	return moet_test_done("test_gpu_sample");
}
