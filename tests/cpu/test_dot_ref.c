/*
 * test_dot_ref.c: the scalar contract kernels against independent references.
 *   - dec(): all 256 e4m3 codes against the format's definition computed with ldexp;
 *     the encoders against a brute-force nearest search.
 *   - D(): exactly predictable cases that pin the contract's order (the halving tree, the
 *     per-block scale fma), and random shapes (partial blocks) against a binary64 dot
 *     within a rounding-error bound.
 *   - the expert FFN against a binary64 evaluation of the same formula.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moet_cpu.h"
#include "moet_dtype.h"
#include "moet_expc.h"
#include "moet_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void)
{
	return moet_test_xorshift64(&rng);
}
static double unif(void) { return (double)(next_u64() >> 11) * 0x1p-53; }
static float gauss(void)
{
	double u = unif() + 1e-300, v = unif();
	return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}

static void test_decoders(void)
{
	for (int c = 0; c < 256; c++) {
		int s = c >> 7, e = (c >> 3) & 15, mnt = c & 7;
		float got = moet_dec_e4m3((uint8_t)c);
		if ((c & 0x7F) == 0x7F) {
			CHECK(isnan(got), "code %02x should be NaN", c);
			continue;
		}
		double want = e ? ldexp(1.0 + mnt / 8.0, e - 7) : ldexp(mnt, -9);
		if (s)
			want = -want;
		CHECK((double)got == want && (signbit(got) != 0) == (s != 0), "e4m3 %02x: %a want %a", c,
		      got, want);
	}
	CHECK(moet_dec_e4m3(0x7E) == 448.0f, "max e4m3");
	/* encoder: nearest code, ties to even mantissa, saturating */
	for (int i = 0; i < 200000; i++) {
		float f = (float)(gauss() * ldexp(1.0, (int)(next_u64() % 24) - 12));
		uint8_t c = moet_enc_e4m3(f);
		double best = INFINITY;
		for (int k = 0; k < 256; k++) {
			if ((k & 0x7F) == 0x7F)
				continue;
			double d = fabs((double)moet_dec_e4m3((uint8_t)k) - f);
			if (d < best)
				best = d;
		}
		double got = fabs((double)moet_dec_e4m3(c) - f);
		CHECK(got == best || fabs(f) > 448.0f, "enc_e4m3(%a) -> %02x not nearest", f, c);
		if (got != best)
			break;
	}
	CHECK(moet_enc_e4m3(1000.0f) == 0x7E && moet_enc_e4m3(-1000.0f) == 0xFE, "saturation");
	CHECK(moet_enc_e4m3(NAN) == 0x7F, "NaN");
	/* bf16: round-to-nearest-even of the upper half */
	for (int i = 0; i < 200000; i++) {
		float f = moet_bits_f32((uint32_t)next_u64());
		if (!isfinite(f))
			continue;
		uint16_t b = moet_enc_bf16(f);
		uint32_t u = moet_f32_bits(f);
		uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
		double dl = fabs((double)moet_dec_bf16(lo) - f), dh = fabs((double)moet_dec_bf16(hi) - f);
		uint16_t want = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
		if (isinf(moet_dec_bf16(hi)) && dh >= dl)
			want = lo;
		CHECK(b == want || isinf(moet_dec_bf16(b)), "enc_bf16(%a) = %04x want %04x", f, b,
		      want);
		if (b != want)
			break;
	}
}

/* D pins the halving tree: lanes 0, 4, 8, 12 hold 2^24, 1, 1, 1. The tree adds lane 4 to
 * lane 12 first (q[4] = 2), then 2^24 + 2 is exact; any left-to-right order loses the ones. */
static void test_dot_order(void)
{
	uint8_t w[16];
	float v[16] = { 0 };
	memset(w, 0x38, sizeof(w)); /* 1.0 */
	v[0] = 0x1p24f;
	v[4] = v[8] = v[12] = 1.0f;
	moet_mat m = { .dtype = MOET_DT_F8_E4M3, .rows = 1, .cols = 16, .data = w };
	float d = moet_dot_ref(&m, 0, v);
	CHECK(d == 0x1p24f + 2.0f, "halving tree order: got %a want %a", d, 0x1p24f + 2.0f);

	/* the scale multiplies each block's partial once: 3 blocks of exact small sums */
	enum { K = 300 };
	uint8_t w3[K];
	float v3[K], s3[3] = { 0.5f, 4.0f, 0.125f };
	memset(w3, 0x40, sizeof(w3)); /* 2.0 */
	for (int k = 0; k < K; k++)
		v3[k] = (float)(k % 3);
	double want = 0;
	for (int k = 0; k < K; k++)
		want += 2.0 * v3[k] * s3[k / 128];
	moet_mat m3 = { .dtype = MOET_DT_F8_E4M3, .rows = 1, .cols = K, .data = w3,
			.scale_inv = s3 };
	CHECK(moet_dot_ref(&m3, 0, v3) == (float)want, "block scales: %a want %a",
	      moet_dot_ref(&m3, 0, v3), want);

	/* an all-zero row of negative zeros gives +0 (accumulators start at +0) */
	float vz[16];
	for (int k = 0; k < 16; k++)
		vz[k] = -0.0f;
	float dz = moet_dot_ref(&m, 0, vz);
	CHECK(dz == 0.0f && !signbit(dz), "signed zero: %a", dz);
}

static void test_dot_random(void)
{
	const int64_t shapes[][2] = { { 1, 1 },    { 3, 15 },   { 2, 16 },   { 5, 17 },
				      { 7, 127 },  { 9, 128 },  { 130, 129 }, { 129, 200 },
				      { 17, 300 }, { 4, 1000 }, { 2, 7168 } };
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const int64_t R = shapes[si][0], K = shapes[si][1];
		const int64_t br = (R + 127) / 128, bc = (K + 127) / 128;
		uint8_t *w8 = malloc((size_t)(R * K));
		uint16_t *wb = malloc((size_t)(R * K) * 2);
		float *sc = malloc((size_t)(br * bc) * sizeof(float));
		float *v = malloc((size_t)K * sizeof(float));
		for (int64_t i = 0; i < R * K; i++) {
			do
				w8[i] = (uint8_t)next_u64();
			while ((w8[i] & 0x7F) == 0x7F);
			wb[i] = moet_enc_bf16(gauss());
		}
		for (int64_t i = 0; i < br * bc; i++)
			sc[i] = (float)ldexp(1.0 + unif(), (int)(next_u64() % 9) - 4);
		for (int64_t k = 0; k < K; k++)
			v[k] = gauss() * (float)ldexp(1.0, (int)(next_u64() % 11) - 5);
		moet_mat m8 = { MOET_DT_F8_E4M3, R, K, w8, sc };
		moet_mat mb = { MOET_DT_BF16, R, K, wb, NULL };
		for (int64_t r = 0; r < R; r++) {
			double ref8 = 0, abs8 = 0, refb = 0, absb = 0;
			for (int64_t k = 0; k < K; k++) {
				double t8 = (double)moet_dec_e4m3(w8[r * K + k]) * v[k] *
					    sc[(r / 128) * bc + k / 128];
				double tb = (double)moet_dec_bf16(wb[r * K + k]) * v[k];
				ref8 += t8;
				abs8 += fabs(t8);
				refb += tb;
				absb += fabs(tb);
			}
			/* error bound of a float sum of K terms: ~K u sum|t| (loose, but proves
			 * the right terms with the right scales) */
			double tol8 = (double)(K + 16) * 0x1p-24 * abs8 + 1e-30;
			double tolb = (double)(K + 16) * 0x1p-24 * absb + 1e-30;
			float d8 = moet_dot_ref(&m8, r, v), db = moet_dot_ref(&mb, r, v);
			CHECK(fabs(d8 - ref8) <= tol8, "F8 %lldx%lld row %lld: %a vs %a", (long long)R,
			      (long long)K, (long long)r, d8, ref8);
			CHECK(fabs(db - refb) <= tolb, "BF16 %lldx%lld row %lld: %a vs %a",
			      (long long)R, (long long)K, (long long)r, db, refb);
		}
		free(w8);
		free(wb);
		free(sc);
		free(v);
	}
}

static void test_expert(void)
{
	enum { H = 200, I = 72, T = 3 };
	uint8_t *g = malloc(I * H), *u = malloc(I * H), *d = malloc(H * I);
	float sg[2 * 2], su[2 * 2], sd[2 * 2];
	float x[T * H], y[T * H], scratch[I];
	for (int i = 0; i < I * H; i++) {
		g[i] = moet_enc_e4m3(gauss());
		u[i] = moet_enc_e4m3(gauss());
		d[i] = moet_enc_e4m3(gauss());
	}
	for (int i = 0; i < 4; i++) {
		sg[i] = 0.05f * (float)(1 + i);
		su[i] = 0.07f;
		sd[i] = 0.09f / (float)(1 + i);
	}
	for (int i = 0; i < T * H; i++)
		x[i] = gauss();
	moet_mat mg = { MOET_DT_F8_E4M3, I, H, g, sg }, mu = { MOET_DT_F8_E4M3, I, H, u, su };
	moet_mat md = { MOET_DT_F8_E4M3, H, I, d, sd };
	CHECK(moet_expert_ffn_ref(&mg, &mu, &md, x, T, scratch, y) == 0, "expert ffn");
	for (int t = 0; t < T; t++) {
		double h[I];
		for (int i = 0; i < I; i++) {
			double a = 0, b = 0;
			for (int k = 0; k < H; k++) {
				a += (double)moet_dec_e4m3(g[i * H + k]) * sg[(i / 128) * 2 + k / 128] *
				     x[t * H + k];
				b += (double)moet_dec_e4m3(u[i * H + k]) * su[(i / 128) * 2 + k / 128] *
				     x[t * H + k];
			}
			h[i] = a / (1.0 + exp(-a)) * b;
		}
		for (int j = 0; j < H; j++) {
			double acc = 0, mag = 0;
			for (int i = 0; i < I; i++) {
				double term = (double)moet_dec_e4m3(d[j * I + i]) *
					      sd[(j / 128) * 1 + i / 128] /* down: [2][1] blocks */ * h[i];
				acc += term;
				mag += fabs(term);
			}
			CHECK(fabs(y[t * H + j] - acc) <= 1e-5 * mag + 1e-6, "expert y[%d][%d] %g vs %g",
			      t, j, y[t * H + j], acc);
		}
	}
	moet_mat bad = md;
	bad.cols = I + 1;
	CHECK(moet_expert_ffn_ref(&mg, &mu, &bad, x, 1, scratch, y) < 0, "shape check");
	free(g);
	free(u);
	free(d);
}

int main(void)
{
	test_decoders();
	test_dot_order();
	test_dot_random();
	test_expert();
	return moet_test_done("test_dot_ref");
}
