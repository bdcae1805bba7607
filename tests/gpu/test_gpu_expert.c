/*
 * test_gpu_expert.c: the CUDA contract expert FFN (gpu/expert.cu) equals moet_expert_ffn with
 * the scalar reference kernels (cpu/expert_ref.c) bit for bit, and the API rejects bad input.
 *
 * Every case builds random experts on the host (F8_E4M3 codes with F32 block scales, or BF16),
 * uploads the bytes verbatim, runs one grouped call over several experts with uneven token
 * counts, and compares the device's y with the reference's, row by row, by memcmp (outputs are
 * NaN-canonicalized on both sides, so NaN rows compare equal bit for bit); the first mismatch
 * is printed in hex. Each call runs twice: the two outputs must be identical. Shapes: every
 * (I, H) from {1, 7, 16, 17, 127, 128, 129, 200}^2, token-count sweeps up to 1024 per expert,
 * more experts than one launch takes, the wide kernel's partial tiles and chunks, and the
 * Kimi-K2 geometry (H 7168, I 2048). Every case runs each variant of the row kernels
 * (MOET_GPU_ROWS_KERNEL=ref and wide), each with the down pass launched plainly and as a
 * programmatic dependent of the gate_up pass (MOET_GPU_PDL=0 and 1; 1 falls back to plain
 * launches below compute capability 9.0), on the same inputs against one reference; before each
 * of these runs the scratch (h) and the outputs are poisoned with NaN bits, so a down block that
 * read h before gate_up wrote it, or an output left unwritten, shows as a mismatch. Value modes:
 * ordinary; edges (all e4m3 codes but NaN, subnormal to huge scales, subnormal, tiny and large
 * activations, signed zeros); zeros (signed zeros everywhere); NaN codes.
 *
 * `test_gpu_expert --bench` instead prints timings at the Kimi-K2 geometry (no checks).
 * Skips (77) without a CUDA device.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moet_cpu.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_test.h"

enum { MODE_NORMAL, MODE_EDGE, MODE_ZEROS, MODE_NAN, N_MODES };
static const char *mode_name[N_MODES] = { "normal", "edge", "zeros", "nan" };

/* The variants of the row kernels (MOET_GPU_ROWS_KERNEL, gpu/rows_int.h); each case runs all. */
#define N_VARIANTS 2
static const char *const variant[N_VARIANTS] = { "ref", "wide" };
/* Programmatic dependent launch of the down pass (MOET_GPU_PDL, gpu/expert.cu): off, on. */
#define N_PDL 2
static const char *const pdl_mode[N_PDL] = { "0", "1" };

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
	return moet_test_xorshift64(&rng_state);
}
static float rnd_unit(void) /* [-1, 1) */
{
	return (float)((double)(rnd() >> 11) * 0x1p-52 - 1.0);
}

/* Mostly ordinary values; often zeros of either sign, subnormals and tiny values; rarely huge
 * ones (a dot that meets one usually overflows, and a NaN row hides everything else). */
static float edge_float(void)
{
	static const float small[] = { 0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 1e-40f, -3e-39f,
				       0x1p-126f, 1e-30f, -1e-20f, 0x1.fffffep-127f };
	static const float big[] = { 1e20f, -1e30f, 0x1p100f, 3e38f, -0x1.fffffep127f };
	uint64_t r = rnd() % 256;
	if (r < 96)
		return small[rnd() % (sizeof(small) / sizeof(small[0]))];
	if (r < 98)
		return big[rnd() % (sizeof(big) / sizeof(big[0]))];
	return rnd_unit() * ldexpf(1.0f, (int)(rnd() % 40) - 20);
}

static float act(int mode)
{
	switch (mode) {
	case MODE_EDGE: return edge_float();
	case MODE_ZEROS: return (rnd() % 4) ? ((rnd() & 1) ? -0.0f : 0.0f) : rnd_unit() * 0x1p-140f;
	default: return (rnd() % 16) ? rnd_unit() * 2.0f : ((rnd() & 1) ? -0.0f : 0.0f);
	}
}

static float scale(int mode)
{
	switch (mode) {
	case MODE_EDGE: return (rnd() & 1) ? fabsf(edge_float()) : ldexpf(1.0f, -(int)(rnd() % 12));
	case MODE_ZEROS: return (rnd() & 1) ? 0x1p-149f : 1.0f;
	default: return ldexpf(1.0f + rnd_unit() * 0.5f, -4 - (int)(rnd() % 6));
	}
}

/* One weight element's bits: an e4m3 code or a bf16 pattern. */
static uint16_t weight(moet_dtype dt, int mode, size_t i)
{
	if (dt == MOET_DT_F8_E4M3) {
		uint8_t c;
		switch (mode) {
		case MODE_NAN: return (uint8_t)(i * 37 + 11);          /* every code, NaN too */
		case MODE_ZEROS: c = (rnd() % 4) ? ((rnd() & 1) ? 0x80 : 0x00) : (uint8_t)(rnd() % 8);
			return c;
		default: c = (uint8_t)rnd();
			return (c & 0x7F) == 0x7F ? (uint8_t)(c ^ 1) : c; /* all codes but NaN */
		}
	}
	switch (mode) {
	case MODE_NAN: return (uint16_t)((i % 509) == 3 ? 0x7FC1 : moet_enc_bf16(rnd_unit()));
	case MODE_EDGE: { /* any pattern but inf/NaN: subnormals to the largest finite */
		uint16_t u = (uint16_t)rnd();
		return (u & 0x7F80) == 0x7F80 ? (uint16_t)(u & 0x807F) : u;
	}
	case MODE_ZEROS: return (rnd() % 4) ? ((rnd() & 1) ? 0x8000 : 0) : (uint16_t)(rnd() % 128);
	default: return moet_enc_bf16(rnd_unit() * 2.0f);
	}
}

typedef struct {
	void *data[3];    /* host: gate, up, down */
	float *scale[3];  /* host, NULL for BF16 */
	void *ddata[3];   /* device */
	float *dscale[3];
	moet_mat h[3], d[3];
} expert;

static int make_expert(expert *x, moet_dtype dt, int64_t I, int64_t H, int mode)
{
	const int64_t rows[3] = { I, I, H }, cols[3] = { H, H, I };
	const size_t esz = dt == MOET_DT_F8_E4M3 ? 1 : 2;
	memset(x, 0, sizeof(*x));
	for (int m = 0; m < 3; m++) {
		size_t n = (size_t)(rows[m] * cols[m]);
		size_t nb = (size_t)(((rows[m] + 127) / 128) * ((cols[m] + 127) / 128));
		x->data[m] = malloc(n * esz);
		if (!x->data[m])
			return -1;
		for (size_t i = 0; i < n; i++) {
			uint16_t w = weight(dt, mode, i);
			if (esz == 1)
				((uint8_t *)x->data[m])[i] = (uint8_t)w;
			else
				((uint16_t *)x->data[m])[i] = w;
		}
		if (moet_gpu_alloc(n * esz, &x->ddata[m]) ||
		    moet_gpu_copy_h2d(x->ddata[m], x->data[m], n * esz))
			return -1;
		if (dt == MOET_DT_F8_E4M3) {
			x->scale[m] = malloc(nb * sizeof(float));
			if (!x->scale[m])
				return -1;
			for (size_t b = 0; b < nb; b++)
				x->scale[m][b] = scale(mode);
			if (moet_gpu_alloc(nb * sizeof(float), (void **)&x->dscale[m]) ||
			    moet_gpu_copy_h2d(x->dscale[m], x->scale[m], nb * sizeof(float)))
				return -1;
		}
		x->h[m] = (moet_mat){ dt, rows[m], cols[m], x->data[m], x->scale[m] };
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

/* ---- host reference over threads ------------------------------------------------------------ */

typedef struct {
	const expert *ex;
	const int *pair_exp; /* expert of each pair */
	const int32_t *tok;
	const float *x, *zero;
	int64_t n_x, I, H, p0, p1;
	float *y;
	int rc;
} ref_job;

static void *ref_run(void *arg)
{
	ref_job *j = arg;
	float *scratch = malloc((size_t)j->I * sizeof(float));
	if (!scratch) {
		j->rc = -1;
		return NULL;
	}
	for (int64_t p = j->p0; p < j->p1 && !j->rc; p++) {
		const expert *e = &j->ex[j->pair_exp[p]];
		int32_t t = j->tok[p];
		const float *xr = (t >= 0 && t < j->n_x) ? j->x + (size_t)t * (size_t)j->H : j->zero;
		j->rc = moet_expert_ffn(&moet_cpu_kernels_ref, &e->h[0], &e->h[1], &e->h[2], xr, 1,
					scratch, j->y + (size_t)p * (size_t)j->H);
	}
	free(scratch);
	return NULL;
}

static int reference(const expert *ex, const int *pair_exp, const int32_t *tok, const float *x,
		     int64_t n_x, int64_t I, int64_t H, int64_t n_pairs, float *y)
{
	enum { MAXT = 32 };
	long nc = sysconf(_SC_NPROCESSORS_ONLN);
	int nt = nc < 1 ? 1 : nc > MAXT ? MAXT : (int)nc;
	float *zero = calloc((size_t)H, sizeof(float));
	pthread_t th[MAXT];
	ref_job jobs[MAXT];
	int rc = zero ? 0 : -1;
	for (int i = 0; i < nt && !rc; i++) {
		jobs[i] = (ref_job){ ex, pair_exp, tok, x, zero, n_x, I, H, n_pairs * i / nt,
				     n_pairs * (i + 1) / nt, y, 0 };
		pthread_create(&th[i], NULL, ref_run, &jobs[i]);
	}
	for (int i = 0; i < nt && zero; i++) {
		pthread_join(th[i], NULL);
		rc |= jobs[i].rc;
	}
	free(zero);
	return rc;
}

/* ---- one case ------------------------------------------------------------------------------- */

static int n_cases, n_pairs_checked;

/* Runs n_exp experts of shape (I, H), dtype dt, with ntok[e] tokens each, against the
 * reference. bad_tok: make one token index out of range (reads as zeros). */
static void run_case(const char *tag, moet_dtype dt, int64_t I, int64_t H, int n_exp,
		     const int64_t *ntok, int mode, int bad_tok)
{
	expert *ex = calloc((size_t)n_exp, sizeof(expert));
	moet_gpu_expert *ge = calloc((size_t)n_exp, sizeof(moet_gpu_expert));
	int64_t n_pairs = 0;
	for (int e = 0; e < n_exp; e++)
		n_pairs += ntok[e];
	const int64_t n_x = 1 + n_pairs / 2 + (int64_t)(rnd() % 5);
	float *x = malloc((size_t)(n_x * H) * sizeof(float));
	int32_t *tok = malloc((size_t)(n_pairs + 1) * sizeof(int32_t));
	int *pair_exp = malloc((size_t)(n_pairs + 1) * sizeof(int));
	float *yr = malloc((size_t)(n_pairs * H + 1) * sizeof(float));
	float *yd = malloc((size_t)(n_pairs * H + 1) * sizeof(float));
	float *yd2 = malloc((size_t)(n_pairs * H + 1) * sizeof(float));
	size_t scr = moet_gpu_expert_scratch_bytes(n_pairs, I);
	const size_t poison_bytes = (size_t)(n_pairs * H) * sizeof(float) > scr
					    ? (size_t)(n_pairs * H) * sizeof(float) : scr;
	unsigned char *poison = malloc(poison_bytes + 1);
	void *dx = NULL, *dtok = NULL, *dy = NULL, *dy2 = NULL, *dscr = NULL;
	char name[160];
	snprintf(name, sizeof(name), "%s %s I=%lld H=%lld mode=%s", tag,
		 dt == MOET_DT_F8_E4M3 ? "F8_E4M3" : "BF16", (long long)I, (long long)H,
		 mode_name[mode]);
	n_cases++;
	if (!ex || !ge || !x || !tok || !pair_exp || !yr || !yd || !yd2 || !poison) {
		CHECK(0, "%s: out of host memory", name);
		goto out;
	}
	for (int e = 0; e < n_exp; e++) {
		if (make_expert(&ex[e], dt, I, H, mode)) {
			CHECK(0, "%s: expert %d: %s", name, e, moet_errmsg());
			goto out;
		}
		ge[e] = (moet_gpu_expert){ ex[e].d[0], ex[e].d[1], ex[e].d[2], ntok[e] };
	}
	for (int64_t i = 0; i < n_x * H; i++)
		x[i] = act(mode);
	for (int64_t p = 0, e = 0; e < n_exp; e++)
		for (int64_t t = 0; t < ntok[e]; t++, p++) {
			tok[p] = (int32_t)(rnd() % (uint64_t)n_x);
			pair_exp[p] = (int)e;
		}
	if (bad_tok && n_pairs > 0)
		tok[rnd() % (uint64_t)n_pairs] = (rnd() & 1) ? -5 : (int32_t)n_x;
	if (reference(ex, pair_exp, tok, x, n_x, I, H, n_pairs, yr)) {
		CHECK(0, "%s: reference failed: %s", name, moet_errmsg());
		goto out;
	}
	int rc = moet_gpu_alloc((size_t)(n_x * H) * sizeof(float), &dx);
	rc = rc ? rc : moet_gpu_alloc((size_t)n_pairs * sizeof(int32_t) + 4, &dtok);
	rc = rc ? rc : moet_gpu_alloc((size_t)(n_pairs * H) * sizeof(float) + 4, &dy);
	rc = rc ? rc : moet_gpu_alloc((size_t)(n_pairs * H) * sizeof(float) + 4, &dy2);
	rc = rc ? rc : moet_gpu_alloc(scr + 4, &dscr);
	rc = rc ? rc : moet_gpu_copy_h2d(dx, x, (size_t)(n_x * H) * sizeof(float));
	rc = rc ? rc : moet_gpu_copy_h2d(dtok, tok, (size_t)n_pairs * sizeof(int32_t));
	CHECK(rc == 0, "%s: device: %s", name, moet_errmsg());
	if (rc)
		goto out;
	/* Each kernel variant, PDL off and on, on the same inputs against the one reference; h and
	 * y poisoned (0xFF bytes: NaN) before each. */
	memset(poison, 0xFF, poison_bytes);
	for (int vp = 0; vp < N_VARIANTS * N_PDL; vp++) {
		const int v = vp / N_PDL, pd = vp % N_PDL;
		const size_t ybytes = (size_t)(n_pairs * H) * sizeof(float);
		setenv("MOET_GPU_ROWS_KERNEL", variant[v], 1);
		setenv("MOET_GPU_PDL", pdl_mode[pd], 1);
		rc = moet_gpu_copy_h2d(dscr, poison, scr);
		rc = rc ? rc : moet_gpu_copy_h2d(dy, poison, ybytes);
		rc = rc ? rc : moet_gpu_copy_h2d(dy2, poison, ybytes);
		rc = rc ? rc : moet_gpu_expert_ffn(ge, n_exp, dx, n_x, dtok, dscr, scr, dy, NULL);
		/* the second call finds h from the first: poison it again */
		rc = rc ? rc : moet_gpu_sync(NULL);
		rc = rc ? rc : moet_gpu_copy_h2d(dscr, poison, scr);
		rc = rc ? rc : moet_gpu_expert_ffn(ge, n_exp, dx, n_x, dtok, dscr, scr, dy2, NULL);
		rc = rc ? rc : moet_gpu_sync(NULL);
		rc = rc ? rc : moet_gpu_copy_d2h(yd, dy, ybytes);
		rc = rc ? rc : moet_gpu_copy_d2h(yd2, dy2, ybytes);
		unsetenv("MOET_GPU_ROWS_KERNEL");
		unsetenv("MOET_GPU_PDL");
		CHECK(rc == 0, "%s [%s, pdl %s]: device: %s", name, variant[v], pdl_mode[pd],
		      moet_errmsg());
		if (rc)
			goto out;
		for (int64_t p = 0; p < n_pairs; p++) {
			const float *a = yr + p * H, *b = yd + p * H;
			if (memcmp(a, b, (size_t)H * sizeof(float))) {
				int64_t j = 0;
				while (moet_f32_bits(a[j]) == moet_f32_bits(b[j]))
					j++;
				CHECK(0, "%s [%s, pdl %s]: pair %lld (expert %d, token %d) "
				      "y[%lld]: reference %08x device %08x", name, variant[v],
				      pdl_mode[pd], (long long)p, pair_exp[p], tok[p],
				      (long long)j, moet_f32_bits(a[j]), moet_f32_bits(b[j]));
				break;
			}
		}
		CHECK(!memcmp(yd, yd2, ybytes), "%s [%s, pdl %s]: two runs of the same call differ",
		      name, variant[v], pdl_mode[pd]);
	}
	n_pairs_checked += (int)n_pairs;
out:
	for (int e = 0; ex && e < n_exp; e++)
		free_expert(&ex[e]);
	moet_gpu_free(dx);
	moet_gpu_free(dtok);
	moet_gpu_free(dy);
	moet_gpu_free(dy2);
	moet_gpu_free(dscr);
	free(ex);
	free(ge);
	free(x);
	free(tok);
	free(pair_exp);
	free(yr);
	free(yd);
	free(yd2);
	free(poison);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void bad_input(void)
{
	expert ex;
	float *dx = NULL, *dy = NULL, *dscr = NULL;
	int32_t *dtok = NULL;
	int32_t tok0 = 0;
	if (make_expert(&ex, MOET_DT_F8_E4M3, 16, 32, MODE_NORMAL) ||
	    moet_gpu_alloc(32 * sizeof(float), (void **)&dx) ||
	    moet_gpu_alloc(32 * sizeof(float), (void **)&dy) ||
	    moet_gpu_alloc(sizeof(int32_t), (void **)&dtok) ||
	    moet_gpu_copy_h2d(dtok, &tok0, sizeof(tok0)) ||
	    moet_gpu_alloc(moet_gpu_expert_scratch_bytes(1, 16), (void **)&dscr)) {
		CHECK(0, "bad_input setup: %s", moet_errmsg());
		return;
	}
	size_t scr = moet_gpu_expert_scratch_bytes(1, 16);
	moet_gpu_expert g = { ex.d[0], ex.d[1], ex.d[2], 1 }, b;
	int rc = moet_gpu_expert_ffn(&g, 1, dx, 1, dtok, dscr, scr, dy, NULL);
	CHECK(rc == 0, "good call: %s", moet_errmsg());
	CHECK(moet_gpu_expert_ffn(&g, 0, NULL, 0, NULL, NULL, 0, NULL, NULL) == 0, "no experts");
	b = g;
	b.n_tok = 0;
	CHECK(moet_gpu_expert_ffn(&b, 1, NULL, 0, NULL, NULL, 0, NULL, NULL) == 0, "no pairs");
	CHECK(moet_gpu_expert_ffn(NULL, 1, dx, 1, dtok, dscr, scr, dy, NULL) == MOET_EINVAL,
	      "NULL experts");
	b = g;
	b.down.rows = 31;
	rc = moet_gpu_expert_ffn(&b, 1, dx, 1, dtok, dscr, scr, dy, NULL);
	CHECK(rc == MOET_ESHAPE, "down 31x16: %d", rc);
	printf("  shape mismatch: %s\n", moet_errmsg());
	b = g;
	b.up.dtype = MOET_DT_BF16;
	CHECK(moet_gpu_expert_ffn(&b, 1, dx, 1, dtok, dscr, scr, dy, NULL) == MOET_ESHAPE,
	      "up dtype differs");
	b = g;
	b.gate.dtype = b.up.dtype = b.down.dtype = MOET_DT_F32;
	CHECK(moet_gpu_expert_ffn(&b, 1, dx, 1, dtok, dscr, scr, dy, NULL) == MOET_EUNSUP,
	      "F32 weights");
	b = g;
	b.n_tok = -1;
	CHECK(moet_gpu_expert_ffn(&b, 1, dx, 1, dtok, dscr, scr, dy, NULL) == MOET_EINVAL,
	      "negative n_tok");
	b = g;
	b.up.data = NULL;
	CHECK(moet_gpu_expert_ffn(&b, 1, dx, 1, dtok, dscr, scr, dy, NULL) == MOET_EINVAL,
	      "NULL up data");
	CHECK(moet_gpu_expert_ffn(&g, 1, dx, 1, dtok, dscr, scr - 4, dy, NULL) == MOET_EINVAL,
	      "scratch too small");
	printf("  small scratch: %s\n", moet_errmsg());
	CHECK(moet_gpu_expert_ffn(&g, 1, NULL, 1, dtok, dscr, scr, dy, NULL) == MOET_EINVAL,
	      "NULL x");
	CHECK(moet_gpu_expert_ffn(&g, 1, dx, 0, dtok, dscr, scr, dy, NULL) == MOET_EINVAL,
	      "no x rows");
	CHECK(moet_gpu_expert_ffn(&g, 1, (const float *)((char *)dx + 2), 1, dtok, dscr, scr, dy,
				  NULL) == MOET_EINVAL, "misaligned x");
	setenv("MOET_GPU_ROWS_KERNEL", "fastest", 1);
	rc = moet_gpu_expert_ffn(&g, 1, dx, 1, dtok, dscr, scr, dy, NULL);
	unsetenv("MOET_GPU_ROWS_KERNEL");
	CHECK(rc == MOET_EINVAL, "MOET_GPU_ROWS_KERNEL=fastest: %d", rc);
	printf("  unknown variant: %s\n", moet_errmsg());
	static const char *const bad_pdl[] = { "2", "on", "01", " 1" };
	for (int i = 0; i < 4; i++) {
		setenv("MOET_GPU_PDL", bad_pdl[i], 1);
		rc = moet_gpu_expert_ffn(&g, 1, dx, 1, dtok, dscr, scr, dy, NULL);
		unsetenv("MOET_GPU_PDL");
		CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "MOET_GPU_PDL"),
		      "MOET_GPU_PDL='%s': %d (%s)", bad_pdl[i], rc, moet_errmsg());
	}
	printf("  bad PDL switch: %s\n", moet_errmsg());
	setenv("MOET_GPU_PDL", "", 1);
	rc = moet_gpu_expert_ffn(&g, 1, dx, 1, dtok, dscr, scr, dy, NULL);
	unsetenv("MOET_GPU_PDL");
	CHECK(rc == 0, "MOET_GPU_PDL empty (the default): %s", moet_errmsg());
	CHECK(moet_gpu_sync(NULL) == 0, "sync: %s", moet_errmsg());
	CHECK(moet_gpu_alloc(1, NULL) == MOET_EINVAL, "alloc without out_ptr");
	void *huge = NULL;
	rc = moet_gpu_alloc((size_t)1 << 62, &huge);
	CHECK(rc == MOET_EDEVICE && !huge, "alloc of 2^62 bytes: %d", rc);
	printf("  huge alloc: %s\n", moet_errmsg());
	free_expert(&ex);
	moet_gpu_free(dx);
	moet_gpu_free(dy);
	moet_gpu_free(dtok);
	moet_gpu_free(dscr);
}

/* ---- bench (not a test: prints figures) ----------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench(void)
{
	enum { NE = 8 };
	const int64_t H = 7168, I = 2048;
	/* tokens per expert; at 1 token with the PDL switch (MOET_GPU_PDL) off, then on */
	const int64_t counts[] = { 1, 1, 2, 4, 8, 16, 64, 256 };
	const char *const pdl_at[] = { "0", "1", NULL, NULL, NULL, NULL, NULL, NULL };
	expert ex[NE];
	moet_gpu_expert ge[NE];
	void *buf = NULL, *buf2 = NULL, *dx = NULL, *dtok = NULL, *dy = NULL, *dscr = NULL;
	const size_t cbytes = (size_t)1 << 30;
	int rc = moet_gpu_alloc(cbytes, &buf);
	rc = rc ? rc : moet_gpu_alloc(cbytes, &buf2);
	rc = rc ? rc : moet_gpu_copy_d2d(buf2, buf, cbytes, NULL);
	rc = rc ? rc : moet_gpu_sync(NULL);
	double t0 = now_s();
	for (int i = 0; i < 10 && !rc; i++)
		rc = moet_gpu_copy_d2d(buf2, buf, cbytes, NULL);
	rc = rc ? rc : moet_gpu_sync(NULL);
	double tc = (now_s() - t0) / 10;
	if (rc) {
		fprintf(stderr, "bench: %s\n", moet_errmsg());
		return 1;
	}
	printf("device-to-device copy of 1 GiB: %.3f ms, %.0f GB/s read+written (%.0f GB/s read)\n",
	       tc * 1e3, 2.0 * (double)cbytes / tc / 1e9, (double)cbytes / tc / 1e9);
	moet_gpu_free(buf);
	moet_gpu_free(buf2);
	for (int e = 0; e < NE; e++)
		if (make_expert(&ex[e], MOET_DT_F8_E4M3, I, H, MODE_NORMAL)) {
			fprintf(stderr, "bench: %s\n", moet_errmsg());
			return 1;
		}
	const double wbytes = (double)NE * 3.0 * (double)(I * H);
	const int64_t maxp = NE * 256;
	float *x = malloc((size_t)(maxp * H) * sizeof(float));
	int32_t *tok = malloc((size_t)maxp * sizeof(int32_t));
	for (int64_t i = 0; i < maxp * H; i++)
		x[i] = rnd_unit();
	for (int64_t p = 0; p < maxp; p++)
		tok[p] = (int32_t)p;
	size_t scr = moet_gpu_expert_scratch_bytes(maxp, I);
	rc = moet_gpu_alloc((size_t)(maxp * H) * sizeof(float), &dx);
	rc = rc ? rc : moet_gpu_alloc((size_t)maxp * sizeof(int32_t), &dtok);
	rc = rc ? rc : moet_gpu_alloc((size_t)(maxp * H) * sizeof(float), &dy);
	rc = rc ? rc : moet_gpu_alloc(scr, &dscr);
	rc = rc ? rc : moet_gpu_copy_h2d(dx, x, (size_t)(maxp * H) * sizeof(float));
	rc = rc ? rc : moet_gpu_copy_h2d(dtok, tok, (size_t)maxp * sizeof(int32_t));
	printf("expert FFN, %d Kimi-K2 experts (H %lld, I %lld, F8_E4M3), %.0f MB of weights:\n", NE,
	       (long long)H, (long long)I, wbytes / 1e6);
	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && !rc; c++) {
		if (pdl_at[c])
			setenv("MOET_GPU_PDL", pdl_at[c], 1);
		for (int e = 0; e < NE; e++)
			ge[e] = (moet_gpu_expert){ ex[e].d[0], ex[e].d[1], ex[e].d[2], counts[c] };
		int reps = counts[c] <= 8 ? 50 : counts[c] <= 64 ? 10 : 4;
		rc = moet_gpu_expert_ffn(ge, NE, dx, maxp, dtok, dscr, scr, dy, NULL);
		rc = rc ? rc : moet_gpu_sync(NULL);
		t0 = now_s();
		for (int r = 0; r < reps && !rc; r++)
			rc = moet_gpu_expert_ffn(ge, NE, dx, maxp, dtok, dscr, scr, dy, NULL);
		rc = rc ? rc : moet_gpu_sync(NULL);
		double t = (now_s() - t0) / reps;
		double flops = 2.0 * (double)(NE * counts[c]) * 3.0 * (double)(I * H);
		printf("  %4lld tokens/expert: %9.1f us  weights %6.0f GB/s (%3.0f%% of copy read+"
		       "written)  %6.2f TFLOP/s binary32%s\n", (long long)counts[c], t * 1e6,
		       wbytes / t / 1e9, 100.0 * wbytes / t / (2.0 * (double)cbytes / tc),
		       flops / t / 1e12, !pdl_at[c] ? "" : *pdl_at[c] == '1' ? "  PDL on"
								     : "  PDL off");
		if (pdl_at[c])
			unsetenv("MOET_GPU_PDL");
	}
	if (rc)
		fprintf(stderr, "bench: %s\n", moet_errmsg());
	for (int e = 0; e < NE; e++)
		free_expert(&ex[e]);
	moet_gpu_free(dx);
	moet_gpu_free(dtok);
	moet_gpu_free(dy);
	moet_gpu_free(dscr);
	free(x);
	free(tok);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	if (argc > 1 && !strcmp(argv[1], "--bench"))
		return bench();
	moet_gpu_info info;
	if (moet_gpu_info_get(&info) == 0)
		printf("%s, sm_%d%d: MOET_GPU_PDL=1 %s\n", info.name, info.cc_major, info.cc_minor,
		       info.cc_major >= 9 ? "launches the down pass as a programmatic dependent"
					  : "falls back to plain launches (below sm_90)");

	bad_input();

	/* Every (I, H) of the small set, both dtypes, uneven counts, an expert with none. */
	static const int64_t dims[] = { 1, 7, 16, 17, 127, 128, 129, 200 };
	const int nd = (int)(sizeof(dims) / sizeof(dims[0]));
	int k = 0;
	for (int a = 0; a < nd; a++)
		for (int b = 0; b < nd; b++)
			for (int d = 0; d < 2; d++, k++) {
				int64_t nt[4] = { 1, 0, 2 + (int64_t)(rnd() % 3),
						  5 + (int64_t)(rnd() % 12) };
				run_case("shapes", d ? MOET_DT_BF16 : MOET_DT_F8_E4M3, dims[a],
					 dims[b], 4, nt, k % N_MODES, k % 7 == 0);
			}

	/* Token-count sweep 1..1024 in one grouped call, aligned (16-byte staging) and not. */
	static const int64_t sweep[] = { 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 100, 1024 };
	const int ns = (int)(sizeof(sweep) / sizeof(sweep[0]));
	for (int d = 0; d < 2; d++) {
		moet_dtype dt = d ? MOET_DT_BF16 : MOET_DT_F8_E4M3;
		run_case("sweep", dt, 256, 384, ns, sweep, MODE_NORMAL, 0);
		run_case("sweep", dt, 129, 200, ns, sweep, MODE_EDGE, 0);
	}

	/* The wide kernel's edges (>= 9 tokens, 16-byte staging, K % 16 == 0) and the classes
	 * below it: partial row tiles (144 rows: 16-row gate/up tiles, 32-row down tiles) across a
	 * 128-row scale block, partial column chunks (400 = 3 x 128 + 16, 144 = 128 + 16), token
	 * tiles of 16 filled, one over, many. */
	static const int64_t tiled[] = { 5, 8, 9, 16, 17, 31, 32, 33, 64 };
	for (int d = 0; d < 2; d++)
		for (int m = 0; m < N_MODES; m++)
			run_case("wide-edges", d ? MOET_DT_BF16 : MOET_DT_F8_E4M3, 144, 400,
				 (int)(sizeof(tiled) / sizeof(tiled[0])), tiled, m, m == 1);

	/* More experts than one launch takes (64), zero to three tokens each. */
	int64_t many[150];
	for (int e = 0; e < 150; e++)
		many[e] = (int64_t)(rnd() % 4);
	run_case("many-experts", MOET_DT_F8_E4M3, 64, 128, 150, many, MODE_NORMAL, 0);

	/* Kimi-K2 geometry. */
	static const int64_t kimi_f8[] = { 1, 1, 2, 3, 4, 8, 9, 20 };
	static const int64_t kimi_bf16[] = { 1, 2, 5, 9 };
	run_case("kimi-k2", MOET_DT_F8_E4M3, 2048, 7168, 8, kimi_f8, MODE_NORMAL, 0);
	static const int64_t kimi_edge[] = { 1, 3, 9 };
	run_case("kimi-k2", MOET_DT_F8_E4M3, 2048, 7168, 3, kimi_edge, MODE_EDGE, 0);
	run_case("kimi-k2", MOET_DT_BF16, 2048, 7168, 4, kimi_bf16, MODE_NORMAL, 0);
	/* One expert of 2 tokens (a shared expert at batch 2): its down pass has fewer 2-token
	 * tiles than SMs, so the default runs them as 1-token tiles (gpu/rows.cu split2_wanted) */
	static const int64_t kimi_two[] = { 2 };
	run_case("kimi-k2-two", MOET_DT_F8_E4M3, 2048, 7168, 1, kimi_two, MODE_NORMAL, 0);
	/* The decode shape PDL is for: 8 experts of one token, one launch per pass. */
	static const int64_t kimi_decode[] = { 1, 1, 1, 1, 1, 1, 1, 1 };
	run_case("kimi-k2-decode", MOET_DT_F8_E4M3, 2048, 7168, 8, kimi_decode, MODE_NORMAL, 0);

	printf("%d cases, %d (expert, token) pairs compared bit for bit\n", n_cases,
	       n_pairs_checked);
	return moet_test_done("test_gpu_expert");
}
