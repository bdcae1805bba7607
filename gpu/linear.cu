/*
 * linear.cu: a dense linear layer on the device, y[t][r] = D(W, r, x_t) for every row r of W
 * and every token t: the contract dot product, bit for bit what moet_dot_ref (cpu/expert_ref.c)
 * returns. It is one group of the contract row machinery (rows.cu: the mapping onto threads
 * and why it is exact), so the linear layers, the router logits and the LM head share the
 * expert kernel's arithmetic and never a second dot. Calls of a few tokens may go to
 * gpu/linear_ks.cu (K over the warps of a block: matrices of few rows) or gpu/linear_tall.cu
 * (a warp per 8 rows: many rows) instead (MOET_GPU_LINEAR, below): the same bits.
 *
 * NOTE: a NaN output's payload may differ from the host's (the device's operations on a NaN
 * give the canonical 0x7FFFFFFF, x86 keeps the input's payload); non-NaN outputs are identical.
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "rows_int.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct linear_ctx {
	const moet_mat *w;
	int64_t n_tok;
};

static void get_one(const void *ctx, int64_t i, moet_rows_group *g)
{
	const linear_ctx *c = (const linear_ctx *)ctx;
	(void)i;
	*g = moet_rows_group{ { c->w->data, NULL }, { c->w->scale_inv, NULL }, c->n_tok };
}

static bool aligned16(const void *p)
{
	return ((uintptr_t)p & 15u) == 0;
}

/* MOET_GPU_LINEAR: "auto" (unset or empty: the default), "rows" (the row machinery for every
 * call: the reference), "ksplit" (gpu/linear_ks.cu for every call it can take) or "tall"
 * (gpu/linear_tall.cu for every call it can take). */
enum { LIN_ROWS, LIN_KSPLIT, LIN_AUTO, LIN_TALL };
static int linear_variant(int *out_v)
{
	const char *v = getenv("MOET_GPU_LINEAR");
	*out_v = LIN_AUTO;
	if (!v || !*v || !strcmp(v, "auto"))
		return 0;
	if (!strcmp(v, "rows")) {
		*out_v = LIN_ROWS;
		return 0;
	}
	if (!strcmp(v, "ksplit")) {
		*out_v = LIN_KSPLIT;
		return 0;
	}
	if (!strcmp(v, "tall")) {
		*out_v = LIN_TALL;
		return 0;
	}
	return moet_err(MOET_EINVAL, "MOET_GPU_LINEAR=%.40s (want auto, rows, ksplit or tall)", v);
}

/* MOET_GPU_LINEAR=auto sends a call that linear_ks can take there when its matrix has at most
 * MOET_GPU_KS_AUTO_ROWS_PER_SM rows per SM of the current device (docs/gpu.md "The dense path":
 * below that the row machinery's 32- to 128-row tiles leave most SMs idle, above it they fill
 * the GPU and linear_ks's 8-row blocks measured slower). */
#define MOET_GPU_KS_AUTO_ROWS_PER_SM 16
#define MOET_GPU_KS_FFN_AUTO_MAX_TOK 4
/* MOET_GPU_LINEAR=auto sends a call on a matrix of more rows (linear_ks's rule above) that
 * linear_tall can take there when it has at most 2 tokens, or at most 4 and the matrix at most
 * MOET_GPU_TALL_AUTO_ROWS_PER_SM rows per SM (the row machinery's 128-row tiles of 3-4 tokens
 * then leave SMs idle). Measured on the H200 (docs/gpu.md "The dense path": Nsight Compute,
 * Kimi-K2 shapes): at one token o_proj 28.4 against 39.6 us, q_b 12.1 against 15.3, kv_b 7.9
 * against 8.9, a dense MLP 173 against 193; at four o_proj 65.2 against 84.5, q_b and kv_b
 * even, while the LM head (163840 rows) and a dense MLP (18432) took longer. */
#define MOET_GPU_TALL_AUTO_MAX_TOK 4
#define MOET_GPU_TALL_AUTO_ROWS_PER_SM 128

/* Whether gpu/linear_ks.cu and gpu/linear_tall.cu take W x (x_stride) for n_tok tokens: a
 * supported dtype, the row machinery's vec conditions, whole 128-column blocks and at least
 * one token; linear_ks also at most MOET_GPU_KS_MAX_TOK tokens and MOET_GPU_KS_MAX_BYTES of
 * weight reads over its token tiles, linear_tall at most MOET_GPU_TALL_MAX_TOK tokens. */
static bool split_fits(const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok)
{
	const moet_dtype dt = w->dtype;
	if (dt != MOET_DT_F8_E4M3 && dt != MOET_DT_BF16 && dt != MOET_DT_F32)
		return false;
	const int64_t K = w->cols, esz = (int64_t)moet_dtype_size(dt);
	return (K * esz) % 16 == 0 && K % 128 == 0 && x_stride % 4 == 0 && aligned16(w->data) &&
	       aligned16(x) && ((uintptr_t)w->scale_inv & 3u) == 0 && n_tok >= 1 &&
	       w->rows >= 1 && w->rows <= INT_MAX / 2 && K <= INT_MAX / 2;
}

static bool ks_fits(const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok)
{
	const int64_t esz = (int64_t)moet_dtype_size(w->dtype);
	return split_fits(w, x, x_stride, n_tok) && n_tok <= MOET_GPU_KS_MAX_TOK &&
	       w->rows * w->cols * esz * moet_gpu_ks_tiles(moet_rows_dt(w->dtype), n_tok) <=
		       MOET_GPU_KS_MAX_BYTES;
}

static bool tall_fits(const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok)
{
	return split_fits(w, x, x_stride, n_tok) && n_tok <= MOET_GPU_TALL_MAX_TOK;
}

/* The kernel that variant v sends W x (x_stride) of n_tok tokens to. */
enum { KER_ROWS, KER_KS, KER_TALL };
static int kernel_of(int v, const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok,
		     int *out)
{
	int sms = 0, rc = 0;
	*out = KER_ROWS;
	if (v == LIN_KSPLIT && ks_fits(w, x, x_stride, n_tok))
		*out = KER_KS;
	else if (v == LIN_TALL && tall_fits(w, x, x_stride, n_tok))
		*out = KER_TALL;
	else if (v == LIN_AUTO && !(rc = moet_rows_sm_count(&sms))) {
		const int64_t R = w->rows;
		if (R <= (int64_t)sms * MOET_GPU_KS_AUTO_ROWS_PER_SM)
			*out = ks_fits(w, x, x_stride, n_tok) ? KER_KS : KER_ROWS;
		else if (tall_fits(w, x, x_stride, n_tok) &&
			 (n_tok <= 2 || (n_tok <= MOET_GPU_TALL_AUTO_MAX_TOK &&
					  R <= (int64_t)sms * MOET_GPU_TALL_AUTO_ROWS_PER_SM)))
			*out = KER_TALL;
	}
	return rc;
}

/* W x through the row machinery (the caller checked the arguments); canon: NaN outputs made
 * canonical (an expert's down pass). */
static int rows_linear(const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok,
		       float *y, int64_t y_stride, int canon, void *stream)
{
	const int64_t K = w->cols, esz = (int64_t)moet_dtype_size(w->dtype);
	const int vec = (K * esz) % 16 == 0 && K % 4 == 0 && x_stride % 4 == 0 &&
			aligned16(w->data) && aligned16(x);
	int wide = 0, rc = moet_rows_variant(&wide);
	if (rc)
		return rc;
	moet_rows_job j = moet_rows_job_of(moet_rows_dt(w->dtype), 1, w->rows, K, x, x_stride,
					   NULL, n_tok, y, y_stride, vec, canon, wide);
	linear_ctx c = { w, n_tok };
	return moet_rows_run(&j, get_one, &c, 1, moet_stream(stream));
}

/* W x through kernel ker with epilogue epi (MOET_KS_*; never MOET_KS_SILU_MUL with the row
 * machinery; g its gate outputs). */
static int run_on(int ker, const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok,
		  float *y, int64_t y_stride, int epi, const float *g, void *stream)
{
	if (ker == KER_ROWS)
		return rows_linear(w, x, x_stride, n_tok, y, y_stride, epi == MOET_KS_CANON,
				   stream);
	const moet_gpu_ks_args a = { moet_rows_dt(w->dtype), epi, g, w->data, w->scale_inv,
				     w->rows, w->cols, x, x_stride, n_tok, y, y_stride };
	return ker == KER_KS ? moet_gpu_linear_ks(&a, stream) : moet_gpu_linear_tall(&a, stream);
}

/* Whether the FFN path of variant v can take matrix w: every matrix must fit a kernel the
 * variant may send it to (auto: either). */
static bool ffn_fits(int v, const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok)
{
	return v == LIN_TALL     ? tall_fits(w, x, x_stride, n_tok)
	       : v == LIN_KSPLIT ? ks_fits(w, x, x_stride, n_tok)
				 : ks_fits(w, x, x_stride, n_tok) || tall_fits(w, x, x_stride, n_tok);
}

extern "C" int moet_gpu_ffn_ks(const moet_mat *gate, const moet_mat *up, const moet_mat *down,
			       const float *x, int64_t x_stride, int64_t n_tok, float *scratch,
			       size_t scratch_bytes, float *out, int64_t out_stride, void *stream,
			       int *out_taken)
{
	int v = 0, rc = linear_variant(&v);
	*out_taken = 0;
	if (rc || v == LIN_ROWS)
		return rc;
	const int64_t I = gate->rows, H = gate->cols;
	if (!gate->data || !up->data || !down->data || up->rows != I || up->cols != H ||
	    down->rows != H || down->cols != I || !x || !scratch || !out || x_stride < H ||
	    out_stride < H || ((uintptr_t)out & 3u) ||
	    (size_t)n_tok * (size_t)I * sizeof(float) > scratch_bytes ||
	    !ffn_fits(v, gate, x, x_stride, n_tok) || !ffn_fits(v, up, x, x_stride, n_tok) ||
	    !ffn_fits(v, down, scratch, I, n_tok))
		return 0;
	/* NOTE: auto takes the FFN only up to MOET_GPU_KS_FFN_AUTO_MAX_TOK tokens: a Kimi-K2
	 * shared expert's gate and up through linear_ks, down through the row machinery, made the
	 * H200's decode steps faster at batches 1 and 4 (4.03-4.08 against 4.13-4.14 ms, 7.85
	 * against 7.93-7.95) but slower than the row kernel's one gate_up pass at 8 (10.67-10.70
	 * against 10.52-10.54) and 16 (16.75-16.78 against 15.91-16.01; record
	 * 2026-12-01-linear-ks-h200-892564f.txt) */
	if (v == LIN_AUTO && n_tok > MOET_GPU_KS_FFN_AUTO_MAX_TOK)
		return 0;
	int ker[3] = {};
	if ((rc = kernel_of(v, gate, x, x_stride, n_tok, &ker[0])) ||
	    (rc = kernel_of(v, up, x, x_stride, n_tok, &ker[1])) ||
	    (rc = kernel_of(v, down, scratch, I, n_tok, &ker[2])) || ker[0] == KER_ROWS ||
	    ker[1] == KER_ROWS)
		return rc;
	/* g into scratch, then h = silu_c(g) * u over it, then the down pass (where sent, else
	 * the row machinery: a shared expert's 7168-row down matrix), NaN made canonical: E(x)
	 * of docs/numerics.md, as the rows kernel's two passes compute it */
	if ((rc = run_on(ker[0], gate, x, x_stride, n_tok, scratch, I, MOET_KS_PLAIN, NULL,
			 stream)) ||
	    (rc = run_on(ker[1], up, x, x_stride, n_tok, scratch, I, MOET_KS_SILU_MUL, scratch,
			 stream)) ||
	    (rc = run_on(ker[2], down, scratch, I, n_tok, out, out_stride, MOET_KS_CANON, NULL,
			 stream)))
		return rc;
	*out_taken = 1;
	return 0;
}

extern "C" int moet_gpu_linear(const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok,
			       float *y, int64_t y_stride, void *stream)
{
	if (!w || !w->data)
		return moet_err(MOET_EINVAL, "linear: no matrix or no data");
	const moet_dtype dt = w->dtype;
	if (dt != MOET_DT_F8_E4M3 && dt != MOET_DT_BF16 && dt != MOET_DT_F32)
		return moet_err(MOET_EUNSUP, "linear: weight dtype %d (F8_E4M3, BF16 or F32)",
				(int)dt);
	const int64_t R = w->rows, K = w->cols;
	const size_t esz = moet_dtype_size(dt);
	if (R < 1 || K < 1 || R > INT_MAX / 2 || K > INT_MAX / 2)
		return moet_err(MOET_ESHAPE, "linear: matrix is %lldx%lld", (long long)R,
				(long long)K);
	if (((uintptr_t)w->data & (esz - 1)) || ((uintptr_t)w->scale_inv & 3u))
		return moet_err(MOET_EINVAL, "linear: data %p / scale_inv %p misaligned", w->data,
				(const void *)w->scale_inv);
	if (n_tok < 0 || n_tok > INT_MAX)
		return moet_err(MOET_EINVAL, "linear: n_tok %lld", (long long)n_tok);
	if (n_tok == 0)
		return 0;
	if (!x || !y || ((uintptr_t)x & 3u) || ((uintptr_t)y & 3u) || x_stride < K ||
	    y_stride < R)
		return moet_err(MOET_EINVAL, "linear: x %p (stride %lld), y %p (stride %lld) for a "
				"%lldx%lld matrix: NULL, misaligned or strides too small",
				(const void *)x, (long long)x_stride, (void *)y, (long long)y_stride,
				(long long)R, (long long)K);
	int v = 0, ker = KER_ROWS, rc = linear_variant(&v);
	if (!rc)
		rc = kernel_of(v, w, x, x_stride, n_tok, &ker);
	return rc ? rc : run_on(ker, w, x, x_stride, n_tok, y, y_stride, MOET_KS_PLAIN, NULL, stream);
}
