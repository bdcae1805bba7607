/*
 * test_kernels_avx512.c: the AVX-512 contract kernels against the scalar reference, bit for
 * bit (docs/numerics.md: an implementation is correct iff it returns the reference's bits).
 *
 *   1. decode: all 256 e4m3 codes (subnormals, +-0, the NaN codes), one per row, through
 *      rows() at 1 token (streaming path) and 9 tokens (tiled path); and every code at every
 *      column of full blocks (a pair and a single) at 1 token;
 *   2. rows: random F8_E4M3 / BF16 / F32 matrices of every shape in use (K in {1, 7, 16, 17,
 *      127, 128, 129, 200, 273, 389, 512, 7168} x rows in {1, 3, 17, 129, 2048}) at 1..9,
 *      16, 33, 64, 128 tokens, row sub-ranges and padded strides; half the shapes with
 *      benign data (then no NaN may appear: the compare is a memcmp), half with extreme data
 *      (block scales 2^-126 .. 2^127, subnormal / huge / signed-zero activations, all 256
 *      codes, results that underflow and overflow: a NaN then equals any NaN);
 *   3. gate_up and the whole expert FFN (moet_expert_ffn with the avx512 table vs
 *      moet_expert_ffn_ref; outputs are canonicalized, so a plain memcmp);
 *   4. MOET_KERNEL_EXPERT: this program re-run with =ref, =avx512 and unset reports the table
 *      moet_cpu_kernels_get() returned;
 *   5. the CPU reference model's logits on tests/oracle/fixtures/groups, computed in two runs
 *      of this program (MOET_KERNEL_EXPERT=ref and =avx512), are byte-identical.
 * Large shapes compare a sample of rows (the reference is slow); every row of the others.
 * The first mismatch prints in hex with its shape, row and token. Skips (77) without AVX-512.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <xmmintrin.h>

#include "moet_cpu.h"
#include "moet_dtype.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_test.h"

static const moet_cpu_kernels *K512;
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static int reported; /* mismatches printed so far (the first few of the run) */

static uint64_t next_u64(void)
{
	return moet_test_xorshift64(&rng);
}
static int rnd(int n) { return (int)(next_u64() % (uint64_t)n); }
static double unif(void) { return (double)(next_u64() >> 11) * 0x1p-53; }
static float gauss(void)
{
	double u = unif() + 1e-300, v = unif();
	return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}
static uint32_t bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}
static int is_nan(float f) { return f != f; }

/* A float for an activation or F32 weight. extreme: subnormals, +-0, huge, tiny normals. */
static float value(int extreme)
{
	if (!extreme)
		return gauss() * (float)ldexp(1.0, rnd(17) - 8);
	switch (rnd(10)) {
	case 0: /* subnormal */
		return moet_bits_f32((uint32_t)(next_u64() & 0x807FFFFFu));
	case 1:
		return rnd(2) ? -0.0f : 0.0f;
	case 2: /* huge */
		return gauss() * (float)ldexp(1.0, 60 + rnd(67));
	case 3: /* tiny normal */
		return gauss() * (float)ldexp(1.0, -125 + rnd(30));
	default:
		return gauss() * (float)ldexp(1.0, rnd(41) - 20);
	}
}

typedef struct mat {
	moet_mat m;
	void *data;
	float *scale;
} mat;

static void mat_free(mat *a)
{
	free(a->data);
	free(a->scale);
}

/* Random R x K matrix of dtype dt; extreme: all codes incl. NaN, scales 2^-126 .. 2^127. */
static void mat_make(mat *a, moet_dtype dt, int64_t R, int64_t K, int extreme)
{
	const size_t n = (size_t)(R * K);
	const int64_t nb = ((R + 127) / 128) * ((K + 127) / 128);
	a->data = malloc(n * moet_dtype_size(dt));
	a->scale = NULL;
	if (dt == MOET_DT_F8_E4M3) {
		uint8_t *w = a->data;
		for (size_t i = 0; i < n; i++) {
			w[i] = (uint8_t)next_u64();
			if ((w[i] & 0x7F) == 0x7F && (!extreme || rnd(64)))
				w[i] ^= 1; /* NaN codes rare (extreme) or absent */
		}
		a->scale = malloc((size_t)nb * sizeof(float));
		for (int64_t i = 0; i < nb; i++)
			a->scale[i] = (float)ldexp(1.0 + unif(), extreme ? rnd(254) - 126 : rnd(9) - 4);
	} else if (dt == MOET_DT_BF16) {
		uint16_t *w = a->data;
		for (size_t i = 0; i < n; i++)
			w[i] = moet_enc_bf16(value(extreme));
	} else {
		float *w = a->data;
		for (size_t i = 0; i < n; i++)
			w[i] = value(extreme);
	}
	a->m = (moet_mat){ dt, R, K, a->data, a->scale };
}

/* Bits equal, or (nan_ok) both NaN. Prints the first few mismatches. */
static int agree(float got, float want, int nan_ok, const char *what, const moet_mat *m,
		 int64_t ntok, int64_t row, int64_t tok)
{
	if (bits(got) == bits(want) || (nan_ok && is_nan(got) && is_nan(want)))
		return 1;
	if (reported++ < 5)
		fprintf(stderr, "%s %s R=%lld K=%lld tokens=%lld: row %lld token %lld: got %08x "
			"want %08x\n", what, moet_dtype_name(m->dtype), (long long)m->rows,
			(long long)m->cols, (long long)ntok, (long long)row, (long long)tok,
			bits(got), bits(want));
	return 0;
}

/* rows() over [r0, r1) for T tokens vs moet_dot_ref on the checked rows. */
static void check_rows(const mat *a, int64_t T, int extreme, int variant)
{
	const moet_mat *m = &a->m;
	const int64_t R = m->rows, K = m->cols;
	const int64_t r0 = (variant & 1) && R > 3 ? 1 : 0, r1 = (variant & 1) && R > 3 ? R - 1 : R;
	const int64_t xs = K + ((variant & 2) ? 3 : 0), ys = (r1 - r0) + ((variant & 2) ? 5 : 0);
	float *x = malloc((size_t)(T * xs) * sizeof(float));
	float *y = malloc((size_t)(T * ys) * sizeof(float));
	for (int64_t i = 0; i < T * xs; i++)
		x[i] = value(extreme);
	K512->rows(m, r0, r1, x, xs, T, y, ys);
	int64_t bad = 0, nans = 0;
	for (int64_t r = r0; r < r1; r++) {
		if (R > 200 && r > 140 && r < R - 3 && rnd(64))
			continue; /* large: rows 0..140, the last 3, and 1 in 64 of the rest */
		for (int64_t t = 0; t < T; t++) {
			float want = moet_dot_ref(m, r, x + t * xs);
			float got = y[t * ys + (r - r0)];
			nans += is_nan(want);
			bad += !agree(got, want, extreme, "rows", m, T, r, t);
		}
	}
	CHECK(bad == 0, "rows %s R=%lld K=%lld T=%lld (%s): %lld mismatches",
	      moet_dtype_name(m->dtype), (long long)R, (long long)K, (long long)T,
	      extreme ? "extreme" : "benign", (long long)bad);
	CHECK(extreme || nans == 0, "benign data gave %lld NaNs", (long long)nans);
	free(x);
	free(y);
}

/* Every e4m3 code: row c holds code c in column c % 16 and +0 elsewhere (K = 16); scale 1
 * for rows 0..127, 2^-3 for 128..255; activations 1. Each row's D is dec(c) * scale. */
static void test_all_codes(void)
{
	enum { T = 9 };
	uint8_t w[256 * 16] = { 0 };
	float sc[2] = { 1.0f, 0.125f }, x[T * 16], y1[256], yt[T * 256];
	for (int c = 0; c < 256; c++)
		w[c * 16 + c % 16] = (uint8_t)c;
	for (int i = 0; i < T * 16; i++)
		x[i] = 1.0f;
	moet_mat m = { MOET_DT_F8_E4M3, 256, 16, w, sc };
	K512->rows(&m, 0, 256, x, 16, 1, y1, 256);
	K512->rows(&m, 0, 256, x, 16, T, yt, 256);
	int bad = 0;
	for (int c = 0; c < 256; c++) {
		float want = moet_dot_ref(&m, c, x);
		float dec = moet_dec_e4m3((uint8_t)c) * sc[c / 128];
		CHECK(want == dec || (is_nan(want) && is_nan(dec)), "reference of code %02x: %a", c,
		      want);
		CHECK(((c & 0x7F) == 0x7F) == is_nan(y1[c]), "code %02x NaN-ness", c);
		bad += !agree(y1[c], want, 1, "code 1tok", &m, 1, c, 0);
		for (int t = 0; t < T; t++)
			bad += !agree(yt[t * 256 + c], want, 1, "code tiled", &m, T, c, t);
	}
	CHECK(bad == 0, "e4m3 codes: %d mismatches", bad);
}

/*
 * Every e4m3 code at every column of full blocks through the one-token path (whose decode
 * arranges a block's codes across registers before looking them up): K = 384 (a block pair,
 * then a single full block); for each column j, row c (0..255) holds code c at column j and
 * +0 elsewhere, rows 128..255 scaled by 2^-3; activations distinct (x[k] = 1 + k / 512), so
 * a code decoded into the wrong column multiplies the wrong x. Each row's D is one product.
 */
static void test_all_codes_columns(void)
{
	enum { K = 384 };
	uint8_t *w = calloc(256 * K, 1);
	float sc[2 * 3] = { 1.0f, 1.0f, 1.0f, 0.125f, 0.125f, 0.125f }, x[K], y[256];
	for (int k = 0; k < K; k++)
		x[k] = 1.0f + (float)k / 512.0f;
	moet_mat m = { MOET_DT_F8_E4M3, 256, K, w, sc };
	int bad = 0, checked = 0;
	for (int j = 0; j < K; j++) {
		for (int c = 0; c < 256; c++) {
			w[c * K + (j + K - 1) % K] = 0;
			w[c * K + j] = (uint8_t)c;
		}
		K512->rows(&m, 0, 256, x, K, 1, y, 256);
		for (int c = 0; c < 256; c++) {
			float want = moet_dot_ref(&m, c, x);
			float prod = moet_dec_e4m3((uint8_t)c) * x[j];
			CHECK(want == prod * sc[3 * (c / 128)] || is_nan(want) || prod == 0.0f,
			      "reference of code %02x at column %d: %a", c, j, want);
			bad += !agree(y[c], want, (c & 0x7F) == 0x7F, "code column", &m, 1, c, j);
			checked++;
		}
	}
	CHECK(bad == 0 && checked == 256 * K, "e4m3 codes at every column: %d mismatches", bad);
	free(w);
}

static void test_rows(void)
{
	/* 273, 389, 512: 2 and 3 full blocks with a tail, 4 without (the one-token path takes
	 * full blocks in pairs, then a single one, then the tail) */
	static const int64_t Ks[] = { 1, 7, 16, 17, 127, 128, 129, 200, 273, 389, 512, 7168 };
	static const int64_t Rs[] = { 1, 3, 17, 129, 2048 };
	static const int64_t Ts[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64, 128 };
	static const moet_dtype dts[] = { MOET_DT_F8_E4M3, MOET_DT_BF16, MOET_DT_F32 };
	int variant = 0;
	for (size_t ki = 0; ki < sizeof(Ks) / sizeof(Ks[0]); ki++)
		for (size_t ri = 0; ri < sizeof(Rs) / sizeof(Rs[0]); ri++)
			for (size_t di = 0; di < 3; di++) {
				const int64_t K = Ks[ki], R = Rs[ri];
				const int extreme = (int)((ki + ri + di) & 1);
				const int big = K * R > 200000;
				if (big && dts[di] != MOET_DT_F8_E4M3 && R > 129)
					continue; /* 7168 x 2048 only in FP8, the real format */
				mat a;
				mat_make(&a, dts[di], R, K, extreme);
				for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
					/* the largest shapes: a subset of token counts */
					if (big && !(Ts[ti] <= 2 || Ts[ti] == 9 || Ts[ti] >= 33))
						continue;
					check_rows(&a, Ts[ti], extreme, variant++);
				}
				mat_free(&a);
			}
}

static void test_gate_up_ffn(void)
{
	static const int64_t HI[][2] = { { 1, 1 },     { 7, 3 },     { 17, 16 }, { 129, 17 },
					 { 200, 129 }, { 300, 200 }, { 7168, 2048 } };
	static const int64_t Ts[] = { 1, 2, 3, 8, 9, 33, 64 };
	static const moet_dtype dts[] = { MOET_DT_F8_E4M3, MOET_DT_BF16, MOET_DT_F32 };
	for (size_t s = 0; s < sizeof(HI) / sizeof(HI[0]); s++)
		for (int di = 0; di < 3; di++) {
			const int64_t H = HI[s][0], I = HI[s][1];
			const int big = H * I > 1000000, extreme = (int)((s + (size_t)di) & 1);
			if (big && di)
				continue;
			mat g, u, d;
			mat_make(&g, dts[di], I, H, extreme);
			mat_make(&u, dts[di], I, H, extreme);
			mat_make(&d, dts[di], H, I, extreme);
			for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
				const int64_t T = Ts[ti];
				if (big && T > 2)
					break;
				float *x = malloc((size_t)(T * H) * sizeof(float));
				float *h = malloc((size_t)(T * I) * sizeof(float));
				float *hr = malloc((size_t)(T * I) * sizeof(float));
				float *y = malloc((size_t)(T * H) * sizeof(float));
				float *yr = malloc((size_t)(T * H) * sizeof(float));
				for (int64_t i = 0; i < T * H; i++)
					x[i] = value(extreme);
				K512->gate_up(&g.m, &u.m, 0, I, x, H, T, h, I);
				moet_cpu_kernels_ref.gate_up(&g.m, &u.m, 0, I, x, H, T, hr, I);
				int64_t bad = 0;
				for (int64_t t = 0; t < T; t++)
					for (int64_t i = 0; i < I; i++)
						bad += !agree(h[t * I + i], hr[t * I + i], extreme,
							      "gate_up", &g.m, T, i, t);
				CHECK(bad == 0, "gate_up H=%lld I=%lld T=%lld: %lld mismatches",
				      (long long)H, (long long)I, (long long)T, (long long)bad);
				CHECK(moet_expert_ffn(K512, &g.m, &u.m, &d.m, x, T, h, y) == 0, "ffn");
				CHECK(moet_expert_ffn_ref(&g.m, &u.m, &d.m, x, T, hr, yr) == 0, "ffn");
				CHECK(memcmp(y, yr, (size_t)(T * H) * sizeof(float)) == 0,
				      "expert ffn %s H=%lld I=%lld T=%lld differs from the reference",
				      moet_dtype_name(dts[di]), (long long)H, (long long)I,
				      (long long)T);
				for (int64_t i = 0; i < T * H && reported < 8; i++)
					agree(y[i], yr[i], 0, "ffn", &d.m, T, i % H, i / H);
				free(x);
				free(h);
				free(hr);
				free(y);
				free(yr);
			}
			mat_free(&g);
			mat_free(&u);
			mat_free(&d);
		}
}

/* ---- the table choice and the model, through child runs of this program ---------------- */

static int child_isa(void)
{
	printf("isa=%s\n", moet_cpu_kernels_get()->isa);
	return 0;
}

/* Logits of a fixed prompt on the groups fixture, written raw to path. */
static int child_logits(const char *path)
{
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/tests/oracle/fixtures/groups", moet_test_source_dir());
	moet_model *m = NULL;
	moet_kv *kv = NULL;
	float *lg = NULL;
	int rc = 1;
	if (moet_model_open(dir, &m)) {
		fprintf(stderr, "open %s: %s\n", dir, moet_errmsg());
		goto fail;
	}
	const int64_t V = moet_model_config(m)->vocab_size, T = 12;
	int64_t tok[12];
	for (int64_t i = 0; i < T; i++)
		tok[i] = (i * 37 + 11) % V;
	lg = malloc((size_t)(T * V) * sizeof(float));
	if (!lg || moet_kv_create(m, T, &kv) || moet_model_forward(m, kv, tok, T, lg)) {
		fprintf(stderr, "forward: %s\n", moet_errmsg());
		goto fail;
	}
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(lg, sizeof(float), (size_t)(T * V), f) != (size_t)(T * V)) {
		if (f)
			fclose(f);
		goto fail;
	}
	rc = fclose(f) ? 1 : 0;
	printf("isa=%s\n", moet_cpu_kernels_get()->isa);
fail:
	free(lg);
	moet_kv_destroy(kv);
	moet_model_close(m);
	return rc;
}

static void test_env_and_model(void)
{
	char self[4096], cmd[9000], *out = NULL;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(n > 0, "readlink /proc/self/exe");
	if (n <= 0)
		return;
	self[n] = 0;
	static const char *envs[][2] = { { "MOET_KERNEL_EXPERT=ref", "isa=ref" },
					 { "MOET_KERNEL_EXPERT=avx512", "isa=avx512" },
					 { "MOET_KERNEL_EXPERT=nonsense", "isa=ref" },
					 { "-u MOET_KERNEL_EXPERT", "isa=avx512" } };
	for (int i = 0; i < 4; i++) {
		snprintf(cmd, sizeof(cmd), "env %s '%s' --isa", envs[i][0], self);
		int rc = moet_test_run(cmd, &out);
		CHECK(rc == 0 && out && strstr(out, envs[i][1]), "%s: rc %d, output %s", cmd, rc,
		      out ? out : "(none)");
		free(out);
		out = NULL;
	}
	char *dir = moet_test_mkdtemp("kern512");
	CHECK(dir != NULL, "mkdtemp");
	if (!dir)
		return;
	char pr[4200], pa[4200];
	snprintf(pr, sizeof(pr), "%s/ref.bin", dir);
	snprintf(pa, sizeof(pa), "%s/avx512.bin", dir);
	const char *isas[2] = { "ref", "avx512" }, *paths[2] = { pr, pa };
	for (int i = 0; i < 2; i++) {
		snprintf(cmd, sizeof(cmd), "env MOET_KERNEL_EXPERT=%s '%s' --logits '%s'", isas[i],
			 self, paths[i]);
		int rc = moet_test_run(cmd, &out);
		char want[32];
		snprintf(want, sizeof(want), "isa=%s", isas[i]);
		CHECK(rc == 0 && out && strstr(out, want), "%s: rc %d, output %s", cmd, rc,
		      out ? out : "(none)");
		free(out);
		out = NULL;
	}
	size_t nr = 0, na = 0;
	char *br = moet_test_read_file(pr, &nr), *ba = moet_test_read_file(pa, &na);
	CHECK(br && ba && nr > 0 && nr == na && !memcmp(br, ba, nr),
	      "groups fixture logits differ between the ref and avx512 tables (%zu vs %zu bytes)",
	      nr, na);
	free(br);
	free(ba);
	unlink(pr);
	unlink(pa);
	rmdir(dir);
	free(dir);
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--isa"))
		return child_isa();
	if (argc == 3 && !strcmp(argv[1], "--logits"))
		return child_logits(argv[2]);
	K512 = moet_cpu_kernels_named("avx512");
	if (!K512) {
		printf("test_kernels_avx512: SKIP (no AVX-512 variant on this machine)\n");
		return MOET_TEST_SKIP;
	}
	unsigned csr = _mm_getcsr();
	CHECK(!(csr & 0x8040u), "MXCSR %#x has FTZ or DAZ set: the contract forbids both", csr);
	test_all_codes();
	test_all_codes_columns();
	test_rows();
	test_gate_up_ffn();
	test_env_and_model();
	return moet_test_done("test_kernels_avx512");
}
