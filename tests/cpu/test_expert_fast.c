/*
 * test_expert_fast.c: fast mode (cpu/expert_onednn.c) against exact mode (moet_expert_ffn with
 * the best kernel table) on random experts: FP8 with 128x128 block scales (partial blocks in
 * both directions), BF16, a mix, and several slices of gate/up rows; 1, 7, 64 and 256
 * tokens. Every output must lie within two
 * bounds computed in binary64 from the exact weights and activations:
 *
 * - worst case (rigorous to first order): every rounding of fast mode at its maximum. bf16
 *   keeps 8 significant bits, unit roundoff u = 2^-8; a dequantized weight is rounded twice
 *   (f32 product, then bf16): u_w = 2^-8 + 2^-24. A dot of K terms t_k = w_k v_k then errs by
 *   at most e_dot = (u_w + u + K 2^-24) sum_k |t_k| (K 2^-24: f32 accumulation, in either
 *   mode). Through h = silu(g) u (|silu'| <= 1.1, bf16 rounding of h) into the down dot.
 * - statistical (tight): roundings as independent errors of standard deviation <= u/sqrt(3)
 *   relative, so a dot errs with variance (u^2/3) (sum t_k^2) per rounded operand; propagated
 *   through silu's derivative and the down dot. Bound: Z = 8 standard deviations. Observed
 *   maxima are printed (about 3-4 sigma over ~10^5 outputs); a Gaussian tail beyond 8 sigma
 *   has probability ~1e-15 per output.
 *
 * The worst-case bound is too loose to see a small systematic error on long rows (it grows
 * with K, real errors with sqrt(K)); the statistical one is not: the test proves it by feeding
 * fast mode deliberately mis-scaled blocks (a block scale x2, x1.25, and two blocks' scales
 * swapped, the kind of bug an indexing slip makes) and requiring violations.
 *
 * All of that also on a handle with small slices and K chunks on 3 threads (many slices,
 * partial ones, matmuls adding into their output); and the packer's vector paths against its
 * scalar path bit for bit (check_pack).
 *
 * Also: NaN codes give canonical NaNs where exact mode gives them, the mode switch
 * (MOET_EXPERT_MODE, moet_expert_mode_parse) and argument errors. Skips (77) without oneDNN.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fast_int.h"
#include "moet_cpu.h"
#include "moet_dtype.h"
#include "moet_err.h"
#include "moet_fast.h"
#include "moet_test.h"

#define U_BF16 0x1p-8
#define U_F32 0x1p-24
#define Z_STAT 8.0

static uint64_t rng = 0x243F6A8885A308D3ull;

static double uni(void) /* [0, 1) */
{
	return (double)(moet_test_xorshift64(&rng) >> 11) * 0x1p-53;
}

static double gauss(void)
{
	double a = uni() + 0x1p-60, b = uni();
	return sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b);
}

typedef struct wmat {
	moet_mat m;
	uint8_t *q;     /* F8 codes or BF16 bits */
	float *scale;   /* F8 only */
	double *w;      /* the exact dequantized weights [rows][cols] */
} wmat;

/* Weights like a real checkpoint: Gaussian of std sd (each 128x128 block its own spread in
 * [0.5, 2] x sd), FP8 with scale amax/448 per block, or BF16. */
static void wmat_make(wmat *a, moet_dtype dt, int64_t rows, int64_t cols, double sd)
{
	const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
	memset(a, 0, sizeof(*a));
	a->m = (moet_mat){ .dtype = dt, .rows = rows, .cols = cols };
	a->w = malloc(sizeof(double) * rows * cols);
	a->q = malloc((size_t)(rows * cols) * (dt == MOET_DT_BF16 ? 2 : 1));
	if (dt == MOET_DT_F8_E4M3)
		a->scale = malloc(sizeof(float) * br * bc);
	for (int64_t bi = 0; bi < br; bi++)
		for (int64_t bj = 0; bj < bc; bj++) {
			double bsd = sd * (0.5 + 1.5 * uni()), amax = 0;
			int64_t r1 = (bi + 1) * 128 < rows ? (bi + 1) * 128 : rows;
			int64_t c1 = (bj + 1) * 128 < cols ? (bj + 1) * 128 : cols;
			for (int64_t r = bi * 128; r < r1; r++)
				for (int64_t c = bj * 128; c < c1; c++) {
					a->w[r * cols + c] = gauss() * bsd;
					amax = fmax(amax, fabs(a->w[r * cols + c]));
				}
			float s = (float)(amax / 448.0);
			if (a->scale)
				a->scale[bi * bc + bj] = s;
			for (int64_t r = bi * 128; r < r1; r++)
				for (int64_t c = bj * 128; c < c1; c++) {
					double *w = &a->w[r * cols + c];
					if (dt == MOET_DT_BF16) {
						uint16_t b = moet_enc_bf16((float)*w);
						memcpy(a->q + 2 * (r * cols + c), &b, 2);
						*w = moet_dec_bf16(b);
					} else {
						uint8_t code = moet_enc_e4m3((float)(*w / s));
						a->q[r * cols + c] = code;
						*w = (double)moet_dec_e4m3(code) * s;
					}
				}
		}
	a->m.data = a->q;
	a->m.scale_inv = a->scale;
}

static void wmat_free(wmat *a)
{
	free(a->q);
	free(a->scale);
	free(a->w);
}

typedef struct bounds {
	double *worst, *sdev; /* [n_tok][H] */
} bounds;

/* Both bounds for every output (see the note at the top), from the exact weights in double. */
static void make_bounds(const wmat *g, const wmat *u, const wmat *d, const float *x,
			int64_t n_tok, bounds *b)
{
	const int64_t I = g->m.rows, H = g->m.cols;
	const double uw = U_BF16 + U_F32, s3 = U_BF16 * U_BF16 / 3.0;
	const double eh = uw + U_BF16 + H * U_F32, ei = uw + U_BF16 + I * U_F32;
	double *dh_w = malloc(sizeof(double) * I), *dh_v = malloc(sizeof(double) * I);
	double *h = malloc(sizeof(double) * I);
	b->worst = malloc(sizeof(double) * n_tok * H);
	b->sdev = malloc(sizeof(double) * n_tok * H);
	for (int64_t t = 0; t < n_tok; t++) {
		const float *xt = x + t * H;
		for (int64_t i = 0; i < I; i++) {
			double gv = 0, ga = 0, g2 = 0, uv = 0, ua = 0, u2 = 0;
			for (int64_t k = 0; k < H; k++) {
				double tg = g->w[i * H + k] * xt[k], tu = u->w[i * H + k] * xt[k];
				gv += tg, ga += fabs(tg), g2 += tg * tg;
				uv += tu, ua += fabs(tu), u2 += tu * tu;
			}
			double sig = 1.0 / (1.0 + exp(-gv)), silu = gv * sig;
			double dsilu = sig * (1.0 + gv * (1.0 - sig));
			double eg = eh * ga, eu = eh * ua;
			h[i] = silu * uv;
			/* |d(silu(g) u)| <= 1.1 |dg| (|u| + |du|) + |silu(g)| |du|, then h's own
			 * roundings: f32 product (both modes) and bf16 */
			double dh = 1.1 * eg * (fabs(uv) + eu) + fabs(silu) * eu;
			dh_w[i] = dh + (2 * U_F32 + U_BF16) * (fabs(h[i]) + dh);
			double vg = 2 * s3 * g2 + H * U_F32 * U_F32 * g2;
			double vu = 2 * s3 * u2 + H * U_F32 * U_F32 * u2;
			dh_v[i] = dsilu * dsilu * uv * uv * vg + silu * silu * vu +
				  s3 * h[i] * h[i];
		}
		for (int64_t j = 0; j < H; j++) {
			double wsum = 0, var = 0;
			for (int64_t i = 0; i < I; i++) {
				double w = d->w[j * I + i], th = w * h[i];
				wsum += fabs(w) * dh_w[i] + ei * (fabs(th) + fabs(w) * dh_w[i]);
				var += w * w * dh_v[i] + (s3 + I * U_F32 * U_F32) * th * th;
			}
			b->worst[t * H + j] = wsum;
			b->sdev[t * H + j] = sqrt(var);
		}
	}
	free(dh_w);
	free(dh_v);
	free(h);
}

typedef struct verdict {
	int64_t over_worst, over_stat, n;
	double max_worst, max_sigma; /* largest |err| / worst bound, |err| / sdev */
} verdict;

static verdict compare(const float *yf, const float *ye, const bounds *b, int64_t n)
{
	verdict v = { 0 };
	v.n = n;
	for (int64_t i = 0; i < n; i++) {
		double e = fabs((double)yf[i] - ye[i]);
		if (!(e <= b->worst[i]))
			v.over_worst++;
		if (!(e <= Z_STAT * b->sdev[i]))
			v.over_stat++;
		v.max_worst = fmax(v.max_worst, e / b->worst[i]);
		v.max_sigma = fmax(v.max_sigma, e / b->sdev[i]);
	}
	return v;
}

static float *random_x(int64_t n_tok, int64_t H)
{
	float *x = malloc(sizeof(float) * n_tok * H);
	for (int64_t i = 0; i < n_tok * H; i++)
		x[i] = (float)gauss();
	return x;
}

static int exact_ffn(const wmat *g, const wmat *u, const wmat *d, const float *x, int64_t n_tok,
		     float *y)
{
	float *scratch = malloc(sizeof(float) * n_tok * g->m.rows);
	int rc = moet_expert_ffn(moet_cpu_kernels_get(), &g->m, &u->m, &d->m, x, n_tok, scratch,
				 y);
	free(scratch);
	return rc;
}

/* One shape: fast vs exact within both bounds for each token count. */
static void check_shape(moet_fast *f, const char *name, moet_dtype dg, moet_dtype du,
			moet_dtype dd, int64_t H, int64_t I)
{
	static const int64_t toks[] = { 1, 7, 64, 256 };
	wmat g, u, d;
	wmat_make(&g, dg, I, H, 2.0 / sqrt((double)H));
	wmat_make(&u, du, I, H, 1.0 / sqrt((double)H));
	wmat_make(&d, dd, H, I, 1.0 / sqrt((double)I));
	for (size_t c = 0; c < sizeof(toks) / sizeof(toks[0]); c++) {
		const int64_t n = toks[c];
		float *x = random_x(n, H), *yf = malloc(sizeof(float) * n * H);
		float *ye = malloc(sizeof(float) * n * H);
		bounds b;
		CHECK(exact_ffn(&g, &u, &d, x, n, ye) == 0, "%s exact: %s", name, moet_errmsg());
		int rc = moet_fast_expert_ffn(f, &g.m, &u.m, &d.m, x, n, yf);
		CHECK(rc == 0, "%s fast: %s", name, moet_errmsg());
		make_bounds(&g, &u, &d, x, n, &b);
		verdict v = compare(yf, ye, &b, n * H);
		printf("%-22s H %5lld I %4lld tok %3lld: max err/worst %.3f, max err/sigma %.2f\n",
		       name, (long long)H, (long long)I, (long long)n, v.max_worst, v.max_sigma);
		CHECK(v.over_worst == 0 && v.over_stat == 0, "%s tok %lld: %lld of %lld outputs "
		      "over the worst-case bound, %lld over %g sigma", name, (long long)n,
		      (long long)v.over_worst, (long long)v.n, (long long)v.over_stat, Z_STAT);
		CHECK(v.max_sigma > 0.0, "%s: fast mode equals exact mode bit for bit?", name);
		free(b.worst);
		free(b.sdev);
		free(x);
		free(yf);
		free(ye);
	}
	wmat_free(&g);
	wmat_free(&u);
	wmat_free(&d);
}

/* A bug planted in fast mode's input (scales it sees differ from exact mode's) must show. */
static void check_detects_misscale(moet_fast *f)
{
	const int64_t H = 1096, I = 424, n = 64;
	wmat g, u, d;
	wmat_make(&g, MOET_DT_F8_E4M3, I, H, 2.0 / sqrt((double)H));
	wmat_make(&u, MOET_DT_F8_E4M3, I, H, 1.0 / sqrt((double)H));
	wmat_make(&d, MOET_DT_F8_E4M3, H, I, 1.0 / sqrt((double)I));
	float *x = random_x(n, H), *yf = malloc(sizeof(float) * n * H);
	float *ye = malloc(sizeof(float) * n * H);
	bounds b;
	CHECK(exact_ffn(&g, &u, &d, x, n, ye) == 0, "exact: %s", moet_errmsg());
	make_bounds(&g, &u, &d, x, n, &b);
	const int64_t bc_h = (H + 127) / 128, bc_i = (I + 127) / 128;
	static const char *what[] = { "gate block (1,3) scale x2", "up block (2,8) scale x1.25",
				      "down blocks (4,2)/(4,3) swapped (partial block)" };
	for (int bug = 0; bug < 3; bug++) {
		wmat *w = bug == 0 ? &g : bug == 1 ? &u : &d;
		int64_t nb = (w->m.rows + 127) / 128, bc = bug == 2 ? bc_i : bc_h;
		float *s = malloc(sizeof(float) * nb * bc);
		memcpy(s, w->scale, sizeof(float) * nb * bc);
		if (bug == 0)
			s[1 * bc + 3] *= 2.0f;
		else if (bug == 1)
			s[2 * bc + 8] *= 1.25f;
		else {
			float tmp = s[4 * bc + 2];
			s[4 * bc + 2] = s[4 * bc + 3];
			s[4 * bc + 3] = tmp;
		}
		moet_mat bad = w->m;
		bad.scale_inv = s;
		int rc = moet_fast_expert_ffn(f, bug == 0 ? &bad : &g.m, bug == 1 ? &bad : &u.m,
					      bug == 2 ? &bad : &d.m, x, n, yf);
		CHECK(rc == 0, "fast: %s", moet_errmsg());
		verdict v = compare(yf, ye, &b, n * H);
		printf("planted bug: %-46s %6lld / %lld outputs over %g sigma (max %.0f), "
		       "%lld over worst case\n", what[bug], (long long)v.over_stat,
		       (long long)v.n, Z_STAT, v.max_sigma, (long long)v.over_worst);
		CHECK(v.over_stat > 0, "planted bug '%s' not detected", what[bug]);
		free(s);
	}
	free(b.worst);
	free(b.sdev);
	free(x);
	free(yf);
	free(ye);
	wmat_free(&g);
	wmat_free(&u);
	wmat_free(&d);
}

/* NaN codes: outputs NaN exactly where exact mode's are, all 0x7FC00000. */
static void check_nan(moet_fast *f)
{
	const int64_t H = 200, I = 136, n = 7;
	wmat g, u, d;
	wmat_make(&g, MOET_DT_F8_E4M3, I, H, 0.1);
	wmat_make(&u, MOET_DT_F8_E4M3, I, H, 0.1);
	wmat_make(&d, MOET_DT_F8_E4M3, H, I, 0.1);
	d.q[5 * I + 17] = 0xFF;  /* row 5 of down: output column 5 is NaN for every token */
	d.q[150 * I + 130] = 0x7F;
	float *x = random_x(n, H), *yf = malloc(sizeof(float) * n * H);
	float *ye = malloc(sizeof(float) * n * H);
	CHECK(exact_ffn(&g, &u, &d, x, n, ye) == 0, "exact: %s", moet_errmsg());
	CHECK(moet_fast_expert_ffn(f, &g.m, &u.m, &d.m, x, n, yf) == 0, "fast: %s", moet_errmsg());
	int64_t bad = 0, nans = 0;
	for (int64_t i = 0; i < n * H; i++) {
		uint32_t bf, be;
		memcpy(&bf, &yf[i], 4);
		memcpy(&be, &ye[i], 4);
		nans += be == 0x7FC00000u;
		bad += (be == 0x7FC00000u) != (bf == 0x7FC00000u);
	}
	CHECK(nans == 2 * n && bad == 0, "NaN outputs: exact %lld, %lld positions differ",
	      (long long)nans, (long long)bad);
	free(x);
	free(yf);
	free(ye);
	wmat_free(&g);
	wmat_free(&u);
	wmat_free(&d);
}

static void check_errors(moet_fast *f)
{
	wmat g, u, d;
	wmat_make(&g, MOET_DT_F8_E4M3, 136, 200, 0.1);
	wmat_make(&u, MOET_DT_F8_E4M3, 136, 200, 0.1);
	wmat_make(&d, MOET_DT_F8_E4M3, 200, 136, 0.1);
	float *x = random_x(2, 200), y[400];
	moet_mat bad = u.m;
	bad.rows = 128;
	CHECK(moet_fast_expert_ffn(f, &g.m, &bad, &d.m, x, 2, y) == MOET_ESHAPE, "chain");
	bad = g.m;
	bad.scale_inv = NULL;
	CHECK(moet_fast_expert_ffn(f, &bad, &u.m, &d.m, x, 2, y) == MOET_ESHAPE, "no scales");
	CHECK(strstr(moet_errmsg(), "gate") != NULL, "detail names the matrix: %s", moet_errmsg());
	bad.dtype = MOET_DT_F32;
	CHECK(moet_fast_expert_ffn(f, &g.m, &u.m, &bad, x, 2, y) == MOET_ESHAPE, "F32 weights");
	CHECK(moet_fast_expert_ffn(f, &g.m, &u.m, &d.m, x, 1 << 20, y) == MOET_ERANGE, "n_tok");
	CHECK(moet_fast_expert_ffn(f, &g.m, &u.m, &d.m, x, -1, y) == MOET_EINVAL, "negative");
	CHECK(moet_fast_expert_ffn(f, &g.m, &u.m, &d.m, NULL, 2, y) == MOET_EINVAL, "NULL x");
	CHECK(moet_fast_expert_ffn(f, &g.m, &u.m, &d.m, x, 0, y) == 0, "zero tokens");
	moet_fast *f2 = NULL;
	CHECK(moet_fast_create(&(moet_fast_opts){ .max_tok = -1 }, &f2) == MOET_EINVAL && !f2,
	      "negative option");
	free(x);
	wmat_free(&g);
	wmat_free(&u);
	wmat_free(&d);
}

/* oneDNN's BA16a<nb>b2a over pk x pn (fast_int.h), or a plain n-major layout (nb 0). */
static void layout_make(moet_fast_layout *lay, int64_t pk, int64_t pn, int nb)
{
	int32_t *ok = malloc(sizeof(int32_t) * pk), *on = malloc(sizeof(int32_t) * pn);
	for (int64_t k = 0; k < pk; k++)
		ok[k] = nb ? (int32_t)((k / 32) * 32 * nb + (k % 32) / 2 * 2 * nb + k % 2)
			   : (int32_t)k;
	for (int64_t n = 0; n < pn; n++)
		on[n] = nb ? (int32_t)((n / nb) * pk * nb + (n % nb) * 2) : (int32_t)(n * pk);
	*lay = (moet_fast_layout){ .pk = pk, .pn = pn, .off_k = ok, .off_n = on, .nb = nb };
}

/*
 * The packer's AVX-512 paths (16 x 32 transposed tiles for BA16a<nb>b2a, column segments
 * otherwise) give the scalar path's bits, memcmp over the whole panel, for FP8 (with NaN,
 * subnormal and zero codes) and BF16 rows, two sources, chunk offsets k0 on and off 32 and
 * 128, partial last chunks and padding. Also: the layout check accepts exactly these.
 */
static void check_pack(void)
{
	wmat g, u;
	wmat_make(&g, MOET_DT_F8_E4M3, 300, 700, 0.05);
	wmat_make(&u, MOET_DT_BF16, 300, 700, 0.05);
	for (int i = 0; i < 700; i += 37) /* NaN, -NaN, subnormal, -0 codes */
		g.q[i * 3 % (300 * 700)] = (uint8_t[]){ 0x7F, 0xFF, 0x03, 0x80 }[i % 4];
	static const struct { int nb; int64_t k0, kn, na, nbr, r0; } cs[] = {
		{ 64, 0, 256, 64, 64, 0 },   { 64, 128, 200, 50, 30, 17 }, { 32, 32, 96, 32, 32, 128 },
		{ 16, 384, 316, 16, 0, 283 }, { 64, 96, 100, 3, 70, 200 },  { 0, 0, 160, 40, 24, 5 },
		{ 0, 40, 77, 20, 9, 250 },   { 64, 40, 77, 20, 9, 250 },
		{ 64, 0, 700, 64, 0, 0 },    { 32, 160, 540, 48, 16, 120 }, { 64, 32, 668, 128, 0, 144 },
	};
	for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
		const int nb = cs[c].nb;
		const int64_t pk = (cs[c].kn + 31) / 32 * 32, nn = cs[c].na + cs[c].nbr;
		const int64_t pn = nb ? (nn + nb - 1) / nb * nb : nn + 5;
		moet_fast_layout lay;
		layout_make(&lay, pk, pn, nb);
		CHECK(moet_fast_layout_nb(pk, pn, lay.off_k, lay.off_n) == nb,
		      "case %zu: layout check says %d, not %d", c,
		      moet_fast_layout_nb(pk, pn, lay.off_k, lay.off_n), nb);
		const size_t n_el = (size_t)(pk * pn);
		uint16_t *p0 = malloc(n_el * 2), *p1 = malloc(n_el * 2);
		moet_fast_rows a = { &g.m, cs[c].r0, cs[c].na };
		moet_fast_rows b = { &u.m, 300 - cs[c].nbr - (int64_t)c, cs[c].nbr };
		memset(p0, 0xAB, n_el * 2);
		moet_fast_pack(&lay, a, b, cs[c].k0, cs[c].kn, p0, 0);
		for (int vec = 1; vec <= 2; vec++) { /* with and without the FP8 tables */
			memset(p1, 0xCD, n_el * 2);
			moet_fast_pack(&lay, a, b, cs[c].k0, cs[c].kn, p1, vec);
			size_t bad = 0;
			while (bad < n_el && p0[bad] == p1[bad])
				bad++;
			CHECK(bad == n_el, "case %zu (nb %d, vec %d): element %zu scalar %04x "
			      "vector %04x", c, nb, vec, bad, bad < n_el ? p0[bad] : 0,
			      bad < n_el ? p1[bad] : 0);
		}
		/* the scalar path against the values themselves, at a few places */
		const int64_t n = cs[c].na - 1, k = cs[c].kn - 1;
		uint16_t want = moet_enc_bf16((float)g.w[(cs[c].r0 + n) * 700 + cs[c].k0 + k]);
		uint16_t got = p0[lay.off_k[k] + lay.off_n[n]];
		CHECK(got == want || (got == 0x7FC0 && (want & 0x7FFF) > 0x7F80), "case %zu: "
		      "element (%lld, %lld) %04x, want %04x", c, (long long)k, (long long)n, got,
		      want);
		CHECK(p0[lay.off_k[pk - 1] + lay.off_n[pn - 1]] == 0 || pk == cs[c].kn,
		      "case %zu: padding not zero", c);
		free(p0);
		free(p1);
		free((void *)lay.off_k);
		free((void *)lay.off_n);
	}
	wmat_free(&g);
	wmat_free(&u);
}

static void check_mode(void)
{
	moet_expert_mode_t m = MOET_EXPERT_MODE_FAST;
	CHECK(moet_expert_mode_parse("exact", &m) == 0 && m == MOET_EXPERT_MODE_EXACT, "exact");
	CHECK(moet_expert_mode_parse("fast", &m) == 0 && m == MOET_EXPERT_MODE_FAST, "fast");
	CHECK(moet_expert_mode_parse("Fast", &m) == MOET_EINVAL, "case");
	CHECK(moet_expert_mode_parse(NULL, &m) == MOET_EINVAL, "NULL");
	unsetenv("MOET_EXPERT_MODE");
	CHECK(moet_expert_mode() == MOET_EXPERT_MODE_EXACT, "default");
	setenv("MOET_EXPERT_MODE", "fast", 1);
	CHECK(moet_expert_mode() == MOET_EXPERT_MODE_FAST, "env fast");
	setenv("MOET_EXPERT_MODE", "fsat", 1);
	CHECK(moet_expert_mode() == MOET_EXPERT_MODE_EXACT, "typo stays exact");
	unsetenv("MOET_EXPERT_MODE");
}

int main(void)
{
	check_mode();
	check_pack();
	moet_fast *f = NULL;
	int rc = moet_fast_create(&(moet_fast_opts){ .max_tok = 256, .max_hidden = 1096,
						     .max_inter = 600 }, &f);
	if (rc == MOET_EUNSUP || !moet_fast_available()) {
		printf("skip: %s\n", moet_errmsg());
		return MOET_TEST_SKIP;
	}
	CHECK(rc == 0, "create: %s", moet_errmsg());
	if (rc)
		return moet_test_done("test_expert_fast");
	printf("oneDNN ISA: %s, exact kernels: %s\n", moet_fast_isa(), moet_cpu_kernels_get()->isa);
	check_shape(f, "fp8 partial blocks", MOET_DT_F8_E4M3, MOET_DT_F8_E4M3, MOET_DT_F8_E4M3,
		    1096, 424);
	check_shape(f, "bf16", MOET_DT_BF16, MOET_DT_BF16, MOET_DT_BF16, 512, 256);
	check_shape(f, "mixed fp8/bf16", MOET_DT_F8_E4M3, MOET_DT_BF16, MOET_DT_F8_E4M3, 200, 136);
	/* I above the 512-row panel: two gate/up panels, the second partial */
	check_shape(f, "fp8 two panels", MOET_DT_F8_E4M3, MOET_DT_F8_E4M3, MOET_DT_F8_E4M3, 264,
		    600);
	check_detects_misscale(f);
	check_nan(f);
	check_errors(f);
	moet_fast_destroy(f);
	/* small slices and K chunks, 3 threads: many slices per phase, partial slices and
	 * chunks, matmuls that add into their output (oneDNN's sum post-op) */
	CHECK(moet_fast_create(&(moet_fast_opts){ .max_tok = 256, .max_hidden = 1096,
						  .max_inter = 600, .n_threads = 3,
						  .slice_rows = 16, .slice_rows_down = 40,
						  .k_chunk = 200 }, &f) == 0, "create: %s",
	      moet_errmsg());
	if (f) {
		check_shape(f, "fp8 chunked, 3 thr", MOET_DT_F8_E4M3, MOET_DT_F8_E4M3,
			    MOET_DT_F8_E4M3, 1096, 424);
		check_shape(f, "mixed chunked, 3 thr", MOET_DT_BF16, MOET_DT_F8_E4M3,
			    MOET_DT_BF16, 264, 600);
		check_detects_misscale(f);
		check_nan(f);
	}
	moet_fast_destroy(f);
	return moet_test_done("test_expert_fast");
}
