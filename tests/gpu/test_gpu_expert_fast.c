/*
 * test_gpu_expert_fast.c: fast mode of the grouped expert FFN (gpu/expert_fast.cu: bf16
 * tensor-core GEMMs) against the exact kernel (gpu/expert.cu, itself bit-equal to the CPU
 * reference: test_gpu_expert), within a bound made for bf16, and a proof that the bound
 * catches a wrong scale.
 *
 * The bound (docs/fast-mode.md, "GPU"): fast mode rounds x, the dequantized weights and h to
 * bf16 (unit roundoff u = 2^-8); each rounding is modelled as an independent relative error
 * of standard deviation u/sqrt(3). Computed in binary64 on the host from the exact weights
 * (code x scale) and activations, per output y_j of a pair:
 *   var(g_k) = 2 (u^2/3) sum_m (Wg_km x_m)^2          (weight and x roundings); u_k likewise
 *   var(h_k) = silu'(g_k)^2 u_k^2 var(g_k) + silu(g_k)^2 var(u_k)
 *   var(y_j) = 2 (u^2/3) sum_k (Wd_jk h_k)^2 + sum_k Wd_jk^2 var(h_k)   (Wd and h roundings)
 * and every output must satisfy |y_fast - y_exact| <= 8 sigma_j + 1e-5 rms_j + 1e-30, where
 * rms_j = sqrt(sum_k (Wd_jk h_k)^2) (the floor covers both sides' binary32 accumulation,
 * far below bf16's). The planted bugs (one gate block scale x2, one down block scale x1.25,
 * applied to the weights the fast call reads) must each violate it many times.
 *
 * Also: with min_tok above every expert's count the fast call equals the exact kernel bit for
 * bit; with min_tok in between, the small experts' rows are bit-equal and the large ones within
 * the bound (the run splitting); a NaN activation gives canonical NaN rows like exact mode; an
 * out-of-range token reads zeros; MOET_GPU_EXPERT_MODE and MOET_GPU_FAST_MIN_TOK parsing; bad
 * arguments. Shapes: partial blocks and odd sizes (element-wise dequantization), multiples of
 * 16, and the Kimi-K2 geometry (H 7168, I 2048; sampled pairs), F8_E4M3 + scales and BF16.
 * Skips (77) without a CUDA device.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_dtype.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_test.h"

#define U_BF16 0x1p-8
#define SIGMAS 8.0

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
	return moet_test_xorshift64(&rng);
}
static double unit(void) /* [-1, 1) */
{
	return (double)(rnd() >> 11) * 0x1p-52 - 1.0;
}
static double gauss(void)
{
	return (unit() + unit() + unit()) * 1.0;
}

typedef struct expert {
	void *data[3];   /* host gate, up, down */
	float *scale[3]; /* host, NULL for BF16 */
	void *ddata[3];
	float *dscale[3];
	moet_mat d[3];   /* device views */
} expert;

static const char *dt_name(moet_dtype dt)
{
	return dt == MOET_DT_F8_E4M3 ? "F8_E4M3" : "BF16";
}

static int make_expert(expert *x, moet_dtype dt, int64_t I, int64_t H)
{
	const int64_t rows[3] = { I, I, H }, cols[3] = { H, H, I };
	const size_t esz = dt == MOET_DT_F8_E4M3 ? 1 : 2;
	memset(x, 0, sizeof(*x));
	for (int m = 0; m < 3; m++) {
		const size_t n = (size_t)(rows[m] * cols[m]);
		const size_t nb = (size_t)(((rows[m] + 127) / 128) * ((cols[m] + 127) / 128));
		if (!(x->data[m] = malloc(n * esz)))
			return -1;
		for (size_t i = 0; i < n; i++) {
			if (esz == 1)
				((uint8_t *)x->data[m])[i] = moet_enc_e4m3((float)(gauss() * 96.0));
			else
				((uint16_t *)x->data[m])[i] = moet_enc_bf16((float)(gauss() * 0.05));
		}
		if (moet_gpu_alloc(n * esz, &x->ddata[m]) ||
		    moet_gpu_copy_h2d(x->ddata[m], x->data[m], n * esz))
			return -1;
		if (dt == MOET_DT_F8_E4M3) {
			if (!(x->scale[m] = malloc(nb * sizeof(float))))
				return -1;
			for (size_t b = 0; b < nb; b++)
				x->scale[m][b] = ldexpf(1.0f + 0.5f * (float)unit(), -9 - (int)(rnd() % 4));
			if (moet_gpu_alloc(nb * sizeof(float), (void **)&x->dscale[m]) ||
			    moet_gpu_copy_h2d(x->dscale[m], x->scale[m], nb * sizeof(float)))
				return -1;
		}
		x->d[m] = (moet_mat){ dt, rows[m], cols[m], x->ddata[m], x->dscale[m] };
	}
	return 0;
}

static void free_expert(expert *x)
{
	for (int m = 0; m < 3; m++) {
		free(x->data[m]);
		free(x->scale[m]);
		moet_gpu_free(x->ddata[m]);
		moet_gpu_free(x->dscale[m]);
	}
}

/* Exact value of weight (r, c) of matrix m: dec(code) * scale, or the bf16 value. */
static double wval(const expert *x, int m, int64_t cols, int64_t r, int64_t c)
{
	const size_t i = (size_t)(r * cols + c);
	if (!x->scale[m])
		return (double)moet_dec_bf16(((const uint16_t *)x->data[m])[i]);
	const int64_t nbc = (cols + 127) / 128;
	return (double)moet_dec_e4m3(((const uint8_t *)x->data[m])[i]) *
	       (double)x->scale[m][(r / 128) * nbc + c / 128];
}

/* sigma_j and the floor for every output of one pair (token row xr, NULL: zeros). */
static void bound(const expert *ex, int64_t I, int64_t H, const float *xr, double *sig,
		  double *floor_, double *gw, double *hv)
{
	const double v1 = U_BF16 * U_BF16 / 3.0;
	for (int64_t k = 0; k < I; k++) {
		double g = 0, sg = 0, u = 0, su = 0;
		for (int64_t m = 0; m < H && xr; m++) {
			const double tg = wval(ex, 0, H, k, m) * (double)xr[m];
			const double tu = wval(ex, 1, H, k, m) * (double)xr[m];
			g += tg;
			sg += tg * tg;
			u += tu;
			su += tu * tu;
		}
		const double s = 1.0 / (1.0 + exp(-g)), silu = g * s, dsilu = s * (1.0 + g * (1.0 - s));
		hv[k] = silu * u;
		gw[k] = dsilu * dsilu * u * u * 2.0 * v1 * sg + silu * silu * 2.0 * v1 * su;
	}
	for (int64_t j = 0; j < H; j++) {
		double t2 = 0, prop = 0;
		for (int64_t k = 0; k < I; k++) {
			const double w = wval(ex, 2, I, j, k), t = w * hv[k];
			t2 += t * t;
			prop += w * w * gw[k];
		}
		sig[j] = sqrt(2.0 * v1 * t2 + prop);
		floor_[j] = 1e-5 * sqrt(t2) + 1e-30;
	}
}

typedef struct fcase {
	moet_dtype dt;
	int64_t I, H;
	int n_exp;
	const int64_t *ntok;
	int max_check; /* pairs checked per expert (sampled); 0: all */
} fcase;

typedef struct state {
	expert *ex;
	moet_gpu_expert *ge;
	int64_t n_pairs, n_x;
	float *x;
	int32_t *tok;
	int *pair_exp;
	float *dx, *dy;
	int32_t *dtok;
	void *scr_exact, *scr_fast;
	size_t sb_exact, sb_fast;
} state;

static int setup(state *s, const fcase *c)
{
	memset(s, 0, sizeof(*s));
	s->ex = calloc((size_t)c->n_exp, sizeof(expert));
	s->ge = calloc((size_t)c->n_exp, sizeof(moet_gpu_expert));
	for (int e = 0; e < c->n_exp; e++)
		s->n_pairs += c->ntok[e];
	s->n_x = 1 + s->n_pairs / 2;
	s->x = malloc((size_t)(s->n_x * c->H) * sizeof(float));
	s->tok = malloc((size_t)(s->n_pairs + 1) * sizeof(int32_t));
	s->pair_exp = malloc((size_t)(s->n_pairs + 1) * sizeof(int));
	if (!s->ex || !s->ge || !s->x || !s->tok || !s->pair_exp)
		return -1;
	for (int e = 0; e < c->n_exp; e++) {
		if (make_expert(&s->ex[e], c->dt, c->I, c->H))
			return -1;
		s->ge[e] = (moet_gpu_expert){ s->ex[e].d[0], s->ex[e].d[1], s->ex[e].d[2], c->ntok[e] };
	}
	for (int64_t i = 0; i < s->n_x * c->H; i++)
		s->x[i] = (float)unit();
	for (int64_t p = 0, e = 0, q = 0; p < s->n_pairs; p++, q++) {
		while (q >= c->ntok[e]) {
			e++;
			q = 0;
		}
		s->pair_exp[p] = (int)e;
		s->tok[p] = (int32_t)(rnd() % (uint64_t)s->n_x);
	}
	if (s->n_pairs > 2)
		s->tok[s->n_pairs / 2] = (int32_t)(s->n_x + 3); /* out of range: zeros */
	s->sb_exact = moet_gpu_expert_scratch_bytes(s->n_pairs, c->I);
	s->sb_fast = moet_gpu_expert_fast_scratch_bytes(s->n_pairs, c->I, c->H);
	if (moet_gpu_alloc((size_t)(s->n_x * c->H) * 4, (void **)&s->dx) ||
	    moet_gpu_alloc((size_t)(s->n_pairs * c->H) * 4, (void **)&s->dy) ||
	    moet_gpu_alloc((size_t)s->n_pairs * 4, (void **)&s->dtok) ||
	    moet_gpu_alloc(s->sb_exact, &s->scr_exact) || moet_gpu_alloc(s->sb_fast, &s->scr_fast) ||
	    moet_gpu_copy_h2d(s->dx, s->x, (size_t)(s->n_x * c->H) * 4) ||
	    moet_gpu_copy_h2d(s->dtok, s->tok, (size_t)s->n_pairs * 4))
		return -1;
	return 0;
}

static void teardown(state *s, const fcase *c)
{
	for (int e = 0; s->ex && e < c->n_exp; e++)
		free_expert(&s->ex[e]);
	free(s->ex);
	free(s->ge);
	free(s->x);
	free(s->tok);
	free(s->pair_exp);
	moet_gpu_free(s->dx);
	moet_gpu_free(s->dy);
	moet_gpu_free(s->dtok);
	moet_gpu_free(s->scr_exact);
	moet_gpu_free(s->scr_fast);
}

/* y on the host: exact kernel (fast NULL) or fast mode with min_tok. */
static int run(state *s, const fcase *c, moet_gpu_fast *fast, int64_t min_tok, float *y)
{
	int rc = fast ? moet_gpu_expert_ffn_fast(fast, s->ge, c->n_exp, s->dx, s->n_x, s->dtok,
						min_tok, s->scr_fast, s->sb_fast, s->dy, NULL)
		      : moet_gpu_expert_ffn(s->ge, c->n_exp, s->dx, s->n_x, s->dtok, s->scr_exact,
					    s->sb_exact, s->dy, NULL);
	if (!rc)
		rc = moet_gpu_sync(NULL);
	if (!rc)
		rc = moet_gpu_copy_d2h(y, s->dy, (size_t)(s->n_pairs * c->H) * 4);
	return rc;
}

/* Pairs checked: every pair, or max_check per expert (the first, the last, others). */
static int checked(const fcase *c, const state *s, int64_t p, const int64_t *first_of)
{
	if (!c->max_check)
		return 1;
	const int e = s->pair_exp[p];
	const int64_t q = p - first_of[e], n = c->ntok[e];
	return q == 0 || q == n - 1 || (uint64_t)(q * 2654435761u % (uint64_t)n) < (uint64_t)
	       (c->max_check > 2 ? c->max_check - 2 : 0);
}

/* sigma and floor of every output of the checked pairs, computed once per case. */
typedef struct bounds {
	int64_t n;      /* checked pairs */
	int64_t *pair;  /* [n] */
	double *sig;    /* [n][H] */
	double *fl;     /* [n][H] */
} bounds;

static int bounds_make(const fcase *c, const state *s, bounds *b)
{
	int64_t *first_of = calloc((size_t)c->n_exp + 1, sizeof(int64_t));
	double *gw = malloc((size_t)c->I * sizeof(double)), *hv = malloc((size_t)c->I *
									sizeof(double));
	memset(b, 0, sizeof(*b));
	b->pair = malloc((size_t)(s->n_pairs + 1) * sizeof(int64_t));
	int rc = (first_of && gw && hv && b->pair) ? 0 : -1;
	for (int e = 1; e <= c->n_exp && !rc; e++)
		first_of[e] = first_of[e - 1] + c->ntok[e - 1];
	for (int64_t p = 0; p < s->n_pairs && !rc; p++)
		if (checked(c, s, p, first_of))
			b->pair[b->n++] = p;
	b->sig = malloc((size_t)(b->n * c->H + 1) * sizeof(double));
	b->fl = malloc((size_t)(b->n * c->H + 1) * sizeof(double));
	if (!b->sig || !b->fl)
		rc = -1;
	for (int64_t i = 0; i < b->n && !rc; i++) {
		const int64_t p = b->pair[i];
		const int32_t t = s->tok[p];
		const float *xr = (t >= 0 && t < s->n_x) ? s->x + (size_t)t * (size_t)c->H : NULL;
		bound(&s->ex[s->pair_exp[p]], c->I, c->H, xr, b->sig + i * c->H, b->fl + i * c->H,
		      gw, hv);
	}
	free(first_of);
	free(gw);
	free(hv);
	return rc;
}

static void bounds_free(bounds *b)
{
	free(b->pair);
	free(b->sig);
	free(b->fl);
}

/* Outputs of the checked pairs with |a - b| > SIGMAS sigma + floor; *worst: the largest
 * |a - b| / sigma; *n_out: outputs checked. */
static int64_t violations(const fcase *c, const bounds *bd, const float *a, const float *b,
			  double *worst, int64_t *n_out)
{
	int64_t v = 0;
	*worst = 0;
	*n_out = 0;
	for (int64_t i = 0; i < bd->n; i++) {
		const int64_t p = bd->pair[i];
		const double *sig = bd->sig + i * c->H, *fl = bd->fl + i * c->H;
		for (int64_t j = 0; j < c->H; j++) {
			const double d = fabs((double)a[p * c->H + j] - (double)b[p * c->H + j]);
			if (!(d <= SIGMAS * sig[j] + fl[j]))
				v++;
			if (sig[j] > 0 && d / sig[j] > *worst)
				*worst = d / sig[j];
			(*n_out)++;
		}
	}
	return v;
}

static void run_case(moet_gpu_fast *fast, const fcase *c)
{
	state s;
	bounds bd = { 0 };
	float *ye = NULL, *yf = NULL, *yb = NULL;
	char name[128];
	snprintf(name, sizeof(name), "%s I=%lld H=%lld, %d experts", dt_name(c->dt),
		 (long long)c->I, (long long)c->H, c->n_exp);
	if (setup(&s, c)) {
		CHECK(0, "%s: setup: %s", name, moet_errmsg());
		goto out;
	}
	const size_t ny = (size_t)(s.n_pairs * c->H);
	ye = malloc(ny * 4);
	yf = malloc(ny * 4);
	yb = malloc(ny * 4);
	if (!ye || !yf || !yb || run(&s, c, NULL, 0, ye) || run(&s, c, fast, 1, yf)) {
		CHECK(0, "%s: run: %s", name, moet_errmsg());
		goto out;
	}
	if (bounds_make(c, &s, &bd)) {
		CHECK(0, "%s: out of host memory (bounds)", name);
		goto out;
	}
	double worst = 0;
	int64_t n_out = 0, v = violations(c, &bd, yf, ye, &worst, &n_out);
	CHECK(v == 0, "%s: %lld of %lld fast outputs outside %.0f sigma of exact (worst %.2f)",
	      name, (long long)v, (long long)n_out, SIGMAS, worst);
	printf("%s: fast vs exact over %lld outputs: worst %.2f sigma (bound %.0f)\n", name,
	       (long long)n_out, worst, SIGMAS);

	/* min_tok above every count: all exact, bit for bit */
	CHECK(run(&s, c, fast, (int64_t)1 << 40, yb) == 0 && memcmp(yb, ye, ny * 4) == 0,
	      "%s: min_tok above every count is not the exact kernel's bits", name);
	/* min_tok in between: small experts bit-equal, the rest within the bound */
	int64_t mid = 0;
	for (int e = 0; e < c->n_exp; e++)
		mid = c->ntok[e] > mid ? c->ntok[e] : mid;
	mid = mid / 2 + 1;
	if (run(&s, c, fast, mid, yb) == 0) {
		int64_t p = 0, bad = 0;
		for (int e = 0; e < c->n_exp; e++)
			for (int64_t q = 0; q < c->ntok[e]; q++, p++)
				if (c->ntok[e] < mid)
					bad += memcmp(yb + p * c->H, ye + p * c->H, (size_t)c->H * 4) != 0;
		CHECK(bad == 0, "%s: min_tok %lld: %lld small-expert rows differ from exact", name,
		      (long long)mid, (long long)bad);
		v = violations(c, &bd, yb, ye, &worst, &n_out);
		CHECK(v == 0, "%s: min_tok %lld: %lld outputs outside the bound", name,
		      (long long)mid, (long long)v);
	} else {
		CHECK(0, "%s: min_tok %lld: %s", name, (long long)mid, moet_errmsg());
	}

	/* planted bugs, F8 only: a gate block scale x2, a down block scale x1.25 (device copy) */
	for (int bug = 0; bug < 2 && c->dt == MOET_DT_F8_E4M3; bug++) {
		const int m = bug ? 2 : 0;
		const float f = bug ? 1.25f : 2.0f, s0 = s.ex[0].scale[m][0], sb = s0 * f;
		moet_gpu_copy_h2d(s.ex[0].dscale[m], &sb, sizeof(sb));
		int rc = run(&s, c, fast, 1, yb);
		moet_gpu_copy_h2d(s.ex[0].dscale[m], &s0, sizeof(s0));
		if (rc) {
			CHECK(0, "%s: planted bug %d: %s", name, bug, moet_errmsg());
			continue;
		}
		v = violations(c, &bd, yb, ye, &worst, &n_out);
		CHECK(v >= 10, "%s: planted bug (%s block scale x%.2f) not caught: %lld violations",
		      name, bug ? "down" : "gate", (double)f, (long long)v);
		printf("%s: planted bug (%s block scale x%.2f): %lld violations, worst %.0f sigma\n",
		       name, bug ? "down" : "gate", (double)f, (long long)v, worst);
	}
out:
	free(ye);
	free(yf);
	free(yb);
	bounds_free(&bd);
	teardown(&s, c);
}

/* A NaN activation: the pairs of that token are canonical NaN rows in both modes. */
static void nan_case(moet_gpu_fast *fast)
{
	static const int64_t nt[2] = { 5, 9 };
	const fcase c = { MOET_DT_F8_E4M3, 128, 256, 2, nt, 0 };
	state s;
	float *ye = NULL, *yf = NULL;
	if (setup(&s, &c)) {
		CHECK(0, "nan case setup: %s", moet_errmsg());
		goto out;
	}
	const size_t ny = (size_t)(s.n_pairs * c.H);
	const int32_t t = s.tok[0];
	s.x[(size_t)t * (size_t)c.H + 7] = NAN;
	ye = malloc(ny * 4);
	yf = malloc(ny * 4);
	if (!ye || !yf || moet_gpu_copy_h2d(s.dx, s.x, (size_t)(s.n_x * c.H) * 4) ||
	    run(&s, &c, NULL, 0, ye) || run(&s, &c, fast, 1, yf)) {
		CHECK(0, "nan case: %s", moet_errmsg());
		goto out;
	}
	int64_t bad = 0, nan_rows = 0;
	for (int64_t p = 0; p < s.n_pairs; p++) {
		if (s.tok[p] != t)
			continue;
		nan_rows++;
		for (int64_t j = 0; j < c.H; j++) {
			uint32_t a, b;
			memcpy(&a, &ye[p * c.H + j], 4);
			memcpy(&b, &yf[p * c.H + j], 4);
			bad += a != 0x7FC00000u || b != 0x7FC00000u;
		}
	}
	CHECK(nan_rows > 0 && bad == 0, "NaN activation: %lld outputs of %lld rows not canonical "
	      "NaN in both modes", (long long)bad, (long long)nan_rows);
out:
	free(ye);
	free(yf);
	teardown(&s, &c);
}

static void switches(void)
{
	int f = -1;
	int64_t mt = 0;
	unsetenv("MOET_GPU_EXPERT_MODE");
	CHECK(moet_gpu_expert_mode(&f) == 0 && f == 0, "unset: exact");
	setenv("MOET_GPU_EXPERT_MODE", "fast", 1);
	CHECK(moet_gpu_expert_mode(&f) == 0 && f == 1, "fast");
	setenv("MOET_GPU_EXPERT_MODE", "exact", 1);
	CHECK(moet_gpu_expert_mode(&f) == 0 && f == 0, "exact");
	setenv("MOET_GPU_EXPERT_MODE", "fats", 1);
	CHECK(moet_gpu_expert_mode(&f) == MOET_EINVAL, "a typo is refused");
	unsetenv("MOET_GPU_EXPERT_MODE");
	unsetenv("MOET_GPU_FAST_MIN_TOK");
	CHECK(moet_gpu_fast_min_tok(&mt) == 0 && mt == 32, "min_tok default 32");
	setenv("MOET_GPU_FAST_MIN_TOK", "64", 1);
	CHECK(moet_gpu_fast_min_tok(&mt) == 0 && mt == 64, "min_tok 64");
	setenv("MOET_GPU_FAST_MIN_TOK", "0", 1);
	CHECK(moet_gpu_fast_min_tok(&mt) == MOET_EINVAL, "min_tok 0 refused");
	setenv("MOET_GPU_FAST_MIN_TOK", "12x", 1);
	CHECK(moet_gpu_fast_min_tok(&mt) == MOET_EINVAL, "min_tok 12x refused");
	unsetenv("MOET_GPU_FAST_MIN_TOK");
}

static void bad_args(moet_gpu_fast *fast)
{
	static const int64_t nt[1] = { 4 };
	const fcase c = { MOET_DT_BF16, 16, 32, 1, nt, 0 };
	state s;
	if (setup(&s, &c)) {
		CHECK(0, "bad args setup: %s", moet_errmsg());
		goto out;
	}
	CHECK(moet_gpu_expert_ffn_fast(NULL, s.ge, 1, s.dx, s.n_x, s.dtok, 1, s.scr_fast,
				       s.sb_fast, s.dy, NULL) == MOET_EINVAL, "NULL handle");
	CHECK(moet_gpu_expert_ffn_fast(fast, s.ge, 1, s.dx, s.n_x, s.dtok, 1, s.scr_fast,
				       s.sb_fast - 1, s.dy, NULL) == MOET_EINVAL, "small scratch");
	CHECK(moet_gpu_expert_ffn_fast(fast, s.ge, 1, NULL, s.n_x, s.dtok, 1, s.scr_fast,
				       s.sb_fast, s.dy, NULL) == MOET_EINVAL, "NULL x");
	moet_gpu_expert g = s.ge[0];
	g.down.rows++;
	CHECK(moet_gpu_expert_ffn_fast(fast, &g, 1, s.dx, s.n_x, s.dtok, 1, s.scr_fast, s.sb_fast,
				       s.dy, NULL) == MOET_ESHAPE, "down does not chain");
	g = s.ge[0];
	g.gate.dtype = g.up.dtype = g.down.dtype = MOET_DT_F32;
	CHECK(moet_gpu_expert_ffn_fast(fast, &g, 1, s.dx, s.n_x, s.dtok, 1, s.scr_fast, s.sb_fast,
				       s.dy, NULL) == MOET_EUNSUP, "F32 weights");
	g = s.ge[0];
	g.n_tok = -1;
	CHECK(moet_gpu_expert_ffn_fast(fast, &g, 1, s.dx, s.n_x, s.dtok, 1, s.scr_fast, s.sb_fast,
				       s.dy, NULL) == MOET_EINVAL, "negative n_tok");
out:
	teardown(&s, &c);
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) < 1) {
		printf("skip: no CUDA device (%s)\n", why ? why : "none");
		return MOET_TEST_SKIP;
	}
	switches();
	moet_gpu_fast *fast = NULL;
	if (moet_gpu_fast_create(&fast)) {
		CHECK(0, "moet_gpu_fast_create: %s", moet_errmsg());
		return moet_test_done("test_gpu_expert_fast");
	}
	static const int64_t t_odd[4] = { 1, 3, 0, 17 }, t_mid[3] = { 64, 5, 33 };
	static const int64_t t_big[2] = { 200, 40 }, t_kimi[2] = { 3, 40 };
	const fcase cases[] = {
		{ MOET_DT_F8_E4M3, 200, 129, 4, t_odd, 0 },  /* partial blocks, odd H */
		{ MOET_DT_BF16, 200, 129, 4, t_odd, 0 },
		{ MOET_DT_F8_E4M3, 256, 512, 3, t_mid, 0 },  /* vectorized dequantization */
		{ MOET_DT_BF16, 256, 512, 3, t_mid, 0 },
		{ MOET_DT_F8_E4M3, 384, 1024, 2, t_big, 6 },
		{ MOET_DT_F8_E4M3, 2048, 7168, 2, t_kimi, 4 }, /* Kimi-K2, sampled pairs */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(fast, &cases[i]);
	nan_case(fast);
	bad_args(fast);
	moet_gpu_fast_destroy(fast);
	return moet_test_done("test_gpu_expert_fast");
}
