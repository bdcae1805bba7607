/*
 * expert_fast.cu: fast mode of the grouped expert FFN (docs/fast-mode.md, "GPU"): tensor-core
 * GEMMs through cuBLAS, bf16 inputs and binary32 accumulation. NOT the exact-numerics
 * contract; tests/gpu/test_gpu_expert_fast.c bounds its distance from the exact kernel.
 *
 * Per expert with n >= min_tok tokens (pairs P .. P+n-1), all queued on the caller's stream:
 *
 *   xb [n_pairs][H] bf16   = bf16(x[tok[p]])                once per call, for every pair
 *   wb [gate I x H | up I x H | down H x I] bf16
 *                          = bf16(dec(code) * scale[r/128][c/128])   (F8_E4M3: the product in
 *                            binary32, rounded once to bf16; BF16 weights are used in place)
 *   gu [n_pairs][2I] f32:  gu[p][0..I)  = xb[p] . gate^T     cublasGemmEx, CUBLAS_COMPUTE_32F
 *                          gu[p][I..2I) = xb[p] . up^T      (one GEMM over [gate; up] for F8)
 *   hb [n_pairs][I] bf16   = bf16(silu_c(g) * u)             (binary32 multiply, then rounded)
 *   y  [n_pairs][H] f32    = hb[p] . down^T, then every NaN made 0x7FC00000
 *
 * Experts with fewer tokens go to the exact kernel (moet_gpu_expert_ffn) in runs of
 * consecutive experts: at a few tokens per expert dequantizing the weights costs more than
 * the exact kernel's whole pass (it reads the FP8 bytes once; fast mode reads them, writes
 * twice as many bf16 bytes, and reads those again).
 *
 * NOTE (the GEMM layout): cuBLAS is column-major. A row-major [rows][cols] matrix is a
 * column-major [cols][rows] one with ld = cols, so with W row-major [m][k] and xb row-major
 * [n][k]: C_colmajor[m][n] = op_T(W) . xb, i.e. cublasGemmEx(OP_T, OP_N, m, n, k, W, lda k,
 * xb, ldb k, C, ldc) writes row-major C[n][m] with row stride ldc. Both operands are K-major
 * (the layout tensor cores read best); gate and up write the two halves of gu's rows
 * (ldc 2I), down writes y directly (ldc H).
 *
 * The dequantized weights of one expert live in one scratch region reused by the next expert:
 * stream order makes that safe (the next dequantization starts after this expert's GEMMs).
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "moet_dtype.h"
#include "moet_expc.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EW_THREADS 256
#define EW_BLOCKS 2048              /* grid-stride element-wise kernels */
#define WORKSPACE_BYTES ((size_t)32 << 20)
#define DEFAULT_MIN_TOK 32 /* measured crossover on an H200: 16 tokens 0.70x, 64 2.65x */

struct moet_gpu_fast {
	cublasHandle_t h;
	void *ws; /* cuBLAS workspace, WORKSPACE_BYTES */
};

#define CUBLAS_RC(call)                                                                      \
	do {                                                                                 \
		cublasStatus_t s_ = (call);                                                  \
		if (s_ != CUBLAS_STATUS_SUCCESS)                                             \
			return moet_err(MOET_EDEVICE, "%s:%d: %s: cuBLAS status %d (%s)",   \
					__FILE__, __LINE__, #call, (int)s_,                  \
					cublasGetStatusString(s_));                          \
	} while (0)

/* ---- kernels ------------------------------------------------------------------------------- */

/* xb[p][k] = bf16(x[tok[p]][k]); a token outside [0, n_x) gives a row of +0. */
static __global__ void gather_bf16_kernel(const float *x, long long x_stride, int n_x,
					  const int32_t *tok, long long n_pairs, int H,
					  uint16_t *xb)
{
	const long long n = n_pairs * H;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		const long long p = i / H, k = i % H;
		const int t = tok[p];
		xb[i] = (t >= 0 && t < n_x) ? moet_enc_bf16(x[t * x_stride + k]) : (uint16_t)0;
	}
}

/* out[r][c] = bf16(dec(w[r][c]) * s[r/128][c/128]) for a rows x cols F8_E4M3 matrix (s NULL:
 * 1.0f). vec: cols % 16 == 0 and w 16-byte aligned: 16 codes per step, which never straddle
 * a 128-column block. */
static __global__ void dequant_f8_kernel(const uint8_t *w, const float *s, int rows, int cols,
					 int vec, uint16_t *out)
{
	const int nbc = (cols + 127) / 128;
	const long long n = (long long)rows * cols;
	const long long stride = (long long)gridDim.x * blockDim.x;
	long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (vec) {
		for (; i < n / 16; i += stride) {
			const long long e0 = i * 16;
			const int r = (int)(e0 / cols), c = (int)(e0 % cols);
			const float sc = s ? s[(size_t)(r / 128) * nbc + c / 128] : 1.0f;
			const uint4 v = *(const uint4 *)(w + e0);
			const uint32_t in[4] = { v.x, v.y, v.z, v.w };
			uint32_t o[8];
#pragma unroll
			for (int q = 0; q < 8; q++) {
				const uint32_t word = in[q / 2] >> (16 * (q % 2));
				const float lo = moet_dec_e4m3((uint8_t)(word & 0xFFu)) * sc;
				const float hi = moet_dec_e4m3((uint8_t)((word >> 8) & 0xFFu)) * sc;
				o[q] = (uint32_t)moet_enc_bf16(lo) | ((uint32_t)moet_enc_bf16(hi) << 16);
			}
			*(uint4 *)(out + e0) = make_uint4(o[0], o[1], o[2], o[3]);
			*(uint4 *)(out + e0 + 8) = make_uint4(o[4], o[5], o[6], o[7]);
		}
	} else {
		for (; i < n; i += stride) {
			const int r = (int)(i / cols), c = (int)(i % cols);
			const float sc = s ? s[(size_t)(r / 128) * nbc + c / 128] : 1.0f;
			out[i] = moet_enc_bf16(moet_dec_e4m3(w[i]) * sc);
		}
	}
}

/* hb[p][i] = bf16(silu_c(gu[p][i]) * gu[p][I + i]) for p < n, i < I. */
static __global__ void silu_bf16_kernel(const float *gu, long long n, int I, uint16_t *hb)
{
	const long long total = n * I;
	for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < total;
	     j += (long long)gridDim.x * blockDim.x) {
		const long long p = j / I, i = j % I;
		const float g = gu[p * 2 * I + i], u = gu[p * 2 * I + I + i];
		hb[j] = moet_enc_bf16(moet_silu_c(g) * u);
	}
}

static __global__ void canon_kernel(float *y, long long n)
{
	for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n;
	     j += (long long)gridDim.x * blockDim.x)
		y[j] = moet_canon_nan(y[j]);
}

static unsigned blocks_for(long long n)
{
	long long b = (n + EW_THREADS - 1) / EW_THREADS;
	return (unsigned)(b < 1 ? 1 : b > EW_BLOCKS ? EW_BLOCKS : b);
}

/* ---- handle, switches, scratch ---------------------------------------------------------- */

extern "C" int moet_gpu_fast_create(moet_gpu_fast **out)
{
	if (!out)
		return moet_err(MOET_EINVAL, "fast expert mode: out is NULL");
	*out = NULL;
	moet_gpu_fast *f = (moet_gpu_fast *)calloc(1, sizeof(*f));
	if (!f)
		return moet_err(MOET_ENOMEM, "fast expert mode handle");
	int rc = moet_gpu_alloc(WORKSPACE_BYTES, &f->ws);
	if (!rc) {
		cublasStatus_t s = cublasCreate(&f->h);
		if (s != CUBLAS_STATUS_SUCCESS) {
			f->h = NULL;
			rc = moet_err(MOET_EDEVICE, "fast expert mode: cublasCreate: cuBLAS status "
				      "%d (%s)", (int)s, cublasGetStatusString(s));
		}
	}
	if (rc) {
		moet_gpu_fast_destroy(f);
		return rc;
	}
	*out = f;
	return 0;
}

extern "C" void moet_gpu_fast_destroy(moet_gpu_fast *f)
{
	if (!f)
		return;
	if (f->h)
		cublasDestroy(f->h);
	moet_gpu_free(f->ws);
	free(f);
}

extern "C" int moet_gpu_expert_mode(int *out_fast)
{
	const char *v = getenv("MOET_GPU_EXPERT_MODE");
	if (!v || !*v || !strcmp(v, "exact"))
		*out_fast = 0;
	else if (!strcmp(v, "fast"))
		*out_fast = 1;
	else
		return moet_err(MOET_EINVAL, "MOET_GPU_EXPERT_MODE=%.40s (want exact or fast)", v);
	return 0;
}

extern "C" int moet_gpu_fast_min_tok(int64_t *out_min_tok)
{
	const char *v = getenv("MOET_GPU_FAST_MIN_TOK");
	if (!v || !*v) {
		*out_min_tok = DEFAULT_MIN_TOK;
		return 0;
	}
	char *end = NULL;
	long long n = strtoll(v, &end, 10);
	if (*end || n < 1 || n > INT_MAX)
		return moet_err(MOET_EINVAL, "MOET_GPU_FAST_MIN_TOK=%.40s (want an integer >= 1)",
				v);
	*out_min_tok = n;
	return 0;
}

/* The scratch regions, each 256-byte aligned. */
struct fast_layout {
	size_t wb, xb, gu, hb, exact, total, exact_bytes;
};

static size_t up256(size_t b)
{
	return (b + 255) & ~(size_t)255;
}

static fast_layout layout_of(int64_t n_pairs, int64_t I, int64_t H)
{
	fast_layout o;
	const size_t np = (size_t)n_pairs, i = (size_t)I, h = (size_t)H;
	o.wb = 0;
	o.xb = o.wb + up256(3 * i * h * 2);
	o.gu = o.xb + up256(np * h * 2);
	o.hb = o.gu + up256(np * 2 * i * 4);
	o.exact = o.hb + up256(np * i * 2);
	o.exact_bytes = moet_gpu_expert_scratch_bytes(n_pairs, I);
	o.total = o.exact + up256(o.exact_bytes);
	return o;
}

extern "C" size_t moet_gpu_expert_fast_scratch_bytes(int64_t n_pairs, int64_t inter,
						     int64_t hidden)
{
	if (n_pairs <= 0 || inter <= 0 || hidden <= 0)
		return 0;
	return layout_of(n_pairs, inter, hidden).total;
}

/* ---- the call ----------------------------------------------------------------------------- */

/* bf16 weights of matrix m (rows x cols) of an expert: dequantized into dst (F8) or in place. */
static int weights_bf16(const moet_mat *m, uint16_t *dst, cudaStream_t st, const uint16_t **out)
{
	if (m->dtype == MOET_DT_BF16) {
		*out = (const uint16_t *)m->data;
		return 0;
	}
	const long long n = m->rows * m->cols;
	const int vec = m->cols % 16 == 0 && ((uintptr_t)m->data & 15u) == 0;
	dequant_f8_kernel<<<blocks_for(vec ? n / 16 : n), EW_THREADS, 0, st>>>(
		(const uint8_t *)m->data, m->scale_inv, (int)m->rows, (int)m->cols, vec, dst);
	MOET_CUDA_TRY(cudaGetLastError());
	*out = dst;
	return 0;
}

/* C row-major [n][m] (row stride ldc) = B row-major [n][k] . A^T, A row-major [m][k]. */
static int gemm_bf16(moet_gpu_fast *f, const uint16_t *A, const uint16_t *B, float *C, int m,
		     int n, int k, int ldc)
{
	const float one = 1.0f, zero = 0.0f;
	CUBLAS_RC(cublasGemmEx(f->h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, k,
			       B, CUDA_R_16BF, k, &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
			       CUBLAS_GEMM_DEFAULT));
	return 0;
}

static int fast_expert(moet_gpu_fast *f, const moet_gpu_expert *ex, int64_t P, const fast_layout *lo,
		       char *base, float *y, cudaStream_t st)
{
	const int I = (int)ex->gate.rows, H = (int)ex->gate.cols, n = (int)ex->n_tok;
	uint16_t *wb = (uint16_t *)(base + lo->wb);
	const uint16_t *xb = (const uint16_t *)(base + lo->xb) + (size_t)P * H;
	float *gu = (float *)(base + lo->gu) + (size_t)P * 2 * I;
	uint16_t *hb = (uint16_t *)(base + lo->hb) + (size_t)P * I;
	float *yp = y + (size_t)P * H;
	const uint16_t *g = NULL, *u = NULL, *d = NULL;
	int rc;
	if ((rc = weights_bf16(&ex->gate, wb, st, &g)) ||
	    (rc = weights_bf16(&ex->up, wb + (size_t)I * H, st, &u)) ||
	    (rc = weights_bf16(&ex->down, wb + 2 * (size_t)I * H, st, &d)))
		return rc;
	/* NOTE: dequantized gate and up are one [2I x H] matrix (up right after gate): one GEMM
	 * of twice the rows, more tiles for the SMs at few tokens; BF16 weights: two */
	if (u == g + (size_t)I * H)
		rc = gemm_bf16(f, g, xb, gu, 2 * I, n, H, 2 * I);
	else if (!(rc = gemm_bf16(f, g, xb, gu, I, n, H, 2 * I)))
		rc = gemm_bf16(f, u, xb, gu + I, I, n, H, 2 * I);
	if (rc)
		return rc;
	silu_bf16_kernel<<<blocks_for((long long)n * I), EW_THREADS, 0, st>>>(gu, n, I, hb);
	MOET_CUDA_TRY(cudaGetLastError());
	if ((rc = gemm_bf16(f, d, hb, yp, H, n, I, H)))
		return rc;
	canon_kernel<<<blocks_for((long long)n * H), EW_THREADS, 0, st>>>(yp, (long long)n * H);
	MOET_CUDA_TRY(cudaGetLastError());
	return 0;
}

static bool same_shape(const moet_mat *m, moet_dtype dt, int64_t rows, int64_t cols)
{
	return m->dtype == dt && m->rows == rows && m->cols == cols;
}

extern "C" int moet_gpu_expert_ffn_fast(moet_gpu_fast *f, const moet_gpu_expert *exps,
					int64_t n_exp, const float *x, int64_t n_x,
					const int32_t *tok, int64_t min_tok, void *scratch,
					size_t scratch_bytes, float *y, void *stream)
{
	if (!f || n_exp < 0 || (n_exp > 0 && !exps))
		return moet_err(MOET_EINVAL, "fast expert ffn: handle %p, %lld experts at %p",
				(void *)f, (long long)n_exp, (const void *)exps);
	if (n_exp == 0)
		return 0;
	const moet_dtype dt = exps[0].gate.dtype;
	const int64_t I = exps[0].gate.rows, H = exps[0].gate.cols;
	if (dt != MOET_DT_F8_E4M3 && dt != MOET_DT_BF16)
		return moet_err(MOET_EUNSUP, "fast expert ffn: weight dtype %d (F8_E4M3 or BF16 "
				"only)", (int)dt);
	/* NOTE: 3 I H fits in int for cuBLAS's leading dimensions and the kernels' indices */
	if (I < 1 || H < 1 || I > INT_MAX / 3 || H > INT_MAX / 3 || I * H > INT_MAX / 3)
		return moet_err(MOET_ESHAPE, "fast expert ffn: gate is %lldx%lld", (long long)I,
				(long long)H);
	int64_t n_pairs = 0, n_fast = 0;
	for (int64_t e = 0; e < n_exp; e++) {
		const moet_gpu_expert *ex = &exps[e];
		if (!same_shape(&ex->gate, dt, I, H) || !same_shape(&ex->up, dt, I, H) ||
		    !same_shape(&ex->down, dt, H, I))
			return moet_err(MOET_ESHAPE, "fast expert ffn: expert %lld: shapes or dtypes "
					"differ from expert 0 (gate/up %lldx%lld, down %lldx%lld)",
					(long long)e, (long long)I, (long long)H, (long long)H,
					(long long)I);
		const moet_mat *ms[3] = { &ex->gate, &ex->up, &ex->down };
		for (int m = 0; m < 3; m++)
			if (!ms[m]->data || (dt == MOET_DT_BF16 && ((uintptr_t)ms[m]->data & 1u)) ||
			    ((uintptr_t)ms[m]->scale_inv & 3u))
				return moet_err(MOET_EINVAL, "fast expert ffn: expert %lld: matrix "
						"%d: data %p, scale_inv %p (NULL or misaligned)",
						(long long)e, m, ms[m]->data,
						(const void *)ms[m]->scale_inv);
		if (ex->n_tok < 0 || ex->n_tok > INT_MAX - n_pairs)
			return moet_err(MOET_EINVAL, "fast expert ffn: expert %lld: n_tok %lld (total "
					"pairs must stay below 2^31)", (long long)e,
					(long long)ex->n_tok);
		n_pairs += ex->n_tok;
		n_fast += ex->n_tok > 0 && ex->n_tok >= min_tok;
	}
	if (n_pairs == 0)
		return 0;
	if (!x || !tok || !y || !scratch || n_x < 1 || n_x > INT_MAX ||
	    ((uintptr_t)x & 3u) || ((uintptr_t)y & 3u) || ((uintptr_t)scratch & 255u))
		return moet_err(MOET_EINVAL, "fast expert ffn: x %p (%lld rows), tok %p, y %p, "
				"scratch %p: NULL, misaligned or no rows", (const void *)x,
				(long long)n_x, (const void *)tok, (void *)y, scratch);
	const fast_layout lo = layout_of(n_pairs, I, H);
	if (scratch_bytes < lo.total)
		return moet_err(MOET_EINVAL, "fast expert ffn: scratch of %zu bytes, %zu needed",
				scratch_bytes, lo.total);
	cudaStream_t st = moet_stream(stream);
	char *base = (char *)scratch;
	int rc;
	if (n_fast > 0) {
		/* NOTE: cublasSetStream resets the workspace to cuBLAS's own pool: set it after */
		CUBLAS_RC(cublasSetStream(f->h, st));
		CUBLAS_RC(cublasSetWorkspace(f->h, f->ws, WORKSPACE_BYTES));
		gather_bf16_kernel<<<blocks_for(n_pairs * H), EW_THREADS, 0, st>>>(
			x, H, (int)n_x, tok, n_pairs, (int)H, (uint16_t *)(base + lo.xb));
		MOET_CUDA_TRY(cudaGetLastError());
	}
	/* experts in order; consecutive small ones in one exact call */
	int64_t P = 0, run0 = -1, runP = 0;
	for (int64_t e = 0; e <= n_exp; e++) {
		const bool small = e < n_exp && exps[e].n_tok < min_tok;
		if (small && run0 < 0) {
			run0 = e;
			runP = P;
		}
		if (!small && run0 >= 0) {
			rc = moet_gpu_expert_ffn(exps + run0, e - run0, x, n_x, tok + runP,
						 base + lo.exact, lo.exact_bytes, y + runP * H, stream);
			if (rc)
				return rc;
			run0 = -1;
		}
		if (e == n_exp)
			break;
		if (!small && exps[e].n_tok > 0 &&
		    (rc = fast_expert(f, &exps[e], P, &lo, base, y, st)))
			return rc;
		P += exps[e].n_tok;
	}
	return 0;
}
