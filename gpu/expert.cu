/*
 * expert.cu: the contract expert FFN on the device, grouped over experts and tokens,
 * bit-identical to moet_expert_ffn with the scalar reference (cpu/expert_ref.c).
 *
 * Two passes of the contract row machinery (rows.cu, where the mapping onto threads and why it
 * is exact are written down), each a few launches:
 *   gate_up  (nmat 2): h[p][i] = silu_c(D(gate, i, x[tok[p]])) * D(up, i, x[tok[p]])
 *   down     (nmat 1): y[p][j] = canon(D(down, j, h[p]))
 * This file validates the experts and chains the passes through the caller's scratch (h).
 *
 * Kernel variant, read at every call from MOET_GPU_ROWS_KERNEL (moet_rows_variant): `ref`
 * (rows_kernel for every token count) or `wide` (rows_wide.cu for experts of >= 5 tokens under
 * 16-byte staging). Both give the reference's bits (tests/gpu/test_gpu_expert.c runs each);
 * only the speed differs (docs/gpu.md).
 *
 * Overlap, read at every call from MOET_GPU_PDL (moet_rows_pdl; default 1): with 1, on devices
 * of compute capability >= 9.0, the down pass's first launch is a programmatic dependent of the
 * gate_up pass's last one (rows_int.h, MOET_ROWS_PDL_*). NOTE (why): at 1 token per expert the
 * work is streaming weights, and the down pass's weights do not depend on gate_up, only h does;
 * without it the down pass starts after gate_up's last block ends and the launch gap, leaving
 * SMs idle. Its blocks now start as gate_up's last wave drains, prefetch their first weight
 * chunks, and wait for h. Nothing else is chained (the call's first launch follows the
 * caller's work in plain stream order). Same bits either way (the test runs both).
 */
#include "moet_gpu.h"

#include "gpu_int.h"
#include "rows_int.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

static bool aligned16(const void *p)
{
	return ((uintptr_t)p & 15u) == 0;
}

/* Groups of the two passes: an expert's gate and up, or its down. */
static void get_gate_up(const void *ctx, int64_t i, moet_rows_group *g)
{
	const moet_gpu_expert *x = (const moet_gpu_expert *)ctx + i;
	*g = moet_rows_group{ { x->gate.data, x->up.data }, { x->gate.scale_inv, x->up.scale_inv },
			      x->n_tok };
}

static void get_down(const void *ctx, int64_t i, moet_rows_group *g)
{
	const moet_gpu_expert *x = (const moet_gpu_expert *)ctx + i;
	*g = moet_rows_group{ { x->down.data, NULL }, { x->down.scale_inv, NULL }, x->n_tok };
}

extern "C" size_t moet_gpu_expert_scratch_bytes(int64_t n_pairs, int64_t inter)
{
	if (n_pairs <= 0 || inter <= 0)
		return 0;
	return (size_t)n_pairs * (size_t)((inter + 3) / 4 * 4) * sizeof(float);
}

static bool same_shape(const moet_mat *m, moet_dtype dt, int64_t rows, int64_t cols)
{
	return m->dtype == dt && m->rows == rows && m->cols == cols;
}

/* The weight dtype and gate shape every expert of a call shares. */
static int check_geom(moet_dtype dt, int64_t I, int64_t H)
{
	if (dt != MOET_DT_F8_E4M3 && dt != MOET_DT_BF16)
		return moet_err(MOET_EUNSUP, "expert ffn: weight dtype %d (F8_E4M3 or BF16 only)",
				(int)dt);
	if (I < 1 || H < 1 || I > INT_MAX / 2 || H > INT_MAX / 2)
		return moet_err(MOET_ESHAPE, "expert ffn: gate is %lldx%lld", (long long)I,
				(long long)H);
	return 0;
}

/* Expert e's three views against the call's dtype and shape; clears *vec_up (*vec_down) when
 * its gate or up (down) data is not 16-byte aligned. */
static int check_expert(const moet_gpu_expert *ex, int64_t e, moet_dtype dt, int64_t I,
			int64_t H, bool *vec_up, bool *vec_down)
{
	const size_t esz = moet_dtype_size(dt);
	if (!same_shape(&ex->gate, dt, I, H) || !same_shape(&ex->up, dt, I, H) ||
	    !same_shape(&ex->down, dt, H, I))
		return moet_err(MOET_ESHAPE, "expert ffn: expert %lld: gate %lldx%lld, up %lldx%lld, "
				"down %lldx%lld (dtypes %d %d %d); expected gate and up %lldx%lld, "
				"down %lldx%lld, dtype %d", (long long)e, (long long)ex->gate.rows,
				(long long)ex->gate.cols, (long long)ex->up.rows,
				(long long)ex->up.cols, (long long)ex->down.rows,
				(long long)ex->down.cols, (int)ex->gate.dtype, (int)ex->up.dtype,
				(int)ex->down.dtype, (long long)I, (long long)H, (long long)H,
				(long long)I, (int)dt);
	const moet_mat *ms[3] = { &ex->gate, &ex->up, &ex->down };
	for (int m = 0; m < 3; m++) {
		if (!ms[m]->data || ((uintptr_t)ms[m]->data & (esz - 1)) ||
		    ((uintptr_t)ms[m]->scale_inv & 3u))
			return moet_err(MOET_EINVAL, "expert ffn: expert %lld: matrix %d: data %p, "
					"scale_inv %p (NULL or misaligned)", (long long)e, m,
					ms[m]->data, (const void *)ms[m]->scale_inv);
		if (!aligned16(ms[m]->data))
			*(m < 2 ? vec_up : vec_down) = false;
	}
	return 0;
}

extern "C" int moet_gpu_expert_ffn(const moet_gpu_expert *exps, int64_t n_exp, const float *x,
				   int64_t n_x, const int32_t *tok, void *scratch,
				   size_t scratch_bytes, float *y, void *stream)
{
	if (n_exp < 0 || (n_exp > 0 && !exps))
		return moet_err(MOET_EINVAL, "expert ffn: %lld experts at %p", (long long)n_exp,
				(const void *)exps);
	if (n_exp == 0)
		return 0;
	const moet_dtype dt = exps[0].gate.dtype;
	const int64_t I = exps[0].gate.rows, H = exps[0].gate.cols;
	int rc = check_geom(dt, I, H);
	if (rc)
		return rc;
	const size_t esz = moet_dtype_size(dt);
	bool vec_up = (H * (int64_t)esz) % 16 == 0, vec_down = (I * (int64_t)esz) % 16 == 0;
	int64_t n_pairs = 0;
	for (int64_t e = 0; e < n_exp; e++) {
		const moet_gpu_expert *ex = &exps[e];
		if ((rc = check_expert(ex, e, dt, I, H, &vec_up, &vec_down)))
			return rc;
		if (ex->n_tok < 0 || ex->n_tok > INT_MAX - n_pairs)
			return moet_err(MOET_EINVAL, "expert ffn: expert %lld: n_tok %lld (total "
					"pairs must stay below 2^31)", (long long)e,
					(long long)ex->n_tok);
		n_pairs += ex->n_tok;
	}
	if (n_pairs == 0)
		return 0;
	if (!x || !tok || !y || !scratch || n_x < 1 || n_x > INT_MAX ||
	    ((uintptr_t)x & 3u) || ((uintptr_t)y & 3u) || ((uintptr_t)scratch & 3u))
		return moet_err(MOET_EINVAL, "expert ffn: x %p (%lld rows), tok %p, y %p, scratch "
				"%p: NULL, misaligned or no rows", (const void *)x, (long long)n_x,
				(const void *)tok, (void *)y, scratch);
	if (scratch_bytes < moet_gpu_expert_scratch_bytes(n_pairs, I))
		return moet_err(MOET_EINVAL, "expert ffn: scratch of %zu bytes, %zu needed",
				scratch_bytes, moet_gpu_expert_scratch_bytes(n_pairs, I));

	int wide = 0, pdl = 0;
	if ((rc = moet_rows_variant(&wide)) || (rc = moet_rows_pdl(&pdl)))
		return rc;
	const int idt = moet_rows_dt(dt);
	const int64_t hs = (I + 3) / 4 * 4; /* h row stride: 16-byte rows for the down pass */
	moet_rows_job g = moet_rows_job_of(idt, 2, I, H, x, H, tok, n_x, (float *)scratch, hs,
					   vec_up && H % 4 == 0 && aligned16(x), 0, wide);
	g.pdl = pdl ? MOET_ROWS_PDL_TRIGGER : 0;
	rc = moet_rows_run(&g, get_gate_up, exps, n_exp, moet_stream(stream));
	if (rc)
		return rc;
	moet_rows_job d = moet_rows_job_of(idt, 1, H, I, (const float *)scratch, hs, NULL, n_pairs,
					   y, H, vec_down && aligned16(scratch), 1, wide);
	d.pdl = pdl ? MOET_ROWS_PDL_WAIT : 0;
	return moet_rows_run(&d, get_down, exps, n_exp, moet_stream(stream));
}

extern "C" int moet_gpu_gate_up(const moet_mat *gate, const moet_mat *up, const float *x,
				int64_t x_stride, int64_t n, const int32_t *tok, float *h,
				int64_t h_stride, void *stream)
{
	if (n <= 0 || gate->rows == 0)
		return 0;
	const moet_dtype dt = gate->dtype;
	const int64_t I = gate->rows, H = gate->cols;
	int rc = check_geom(dt, I, H);
	if (rc)
		return rc;
	if (!same_shape(up, dt, I, H))
		return moet_err(MOET_ESHAPE, "gate_up: gate %lldx%lld, up %lldx%lld (dtypes %d %d)",
				(long long)I, (long long)H, (long long)up->rows,
				(long long)up->cols, (int)dt, (int)up->dtype);
	const size_t esz = moet_dtype_size(dt);
	const moet_mat *ms[2] = { gate, up };
	bool vec = (H * (int64_t)esz) % 16 == 0 && H % 4 == 0 && x_stride % 4 == 0 && aligned16(x);
	for (int m = 0; m < 2; m++) {
		if (!ms[m]->data || ((uintptr_t)ms[m]->data & (esz - 1)) ||
		    ((uintptr_t)ms[m]->scale_inv & 3u))
			return moet_err(MOET_EINVAL, "gate_up: matrix %d: data %p, scale_inv %p (NULL "
					"or misaligned)", m, ms[m]->data,
					(const void *)ms[m]->scale_inv);
		vec = vec && aligned16(ms[m]->data);
	}
	if (!x || !tok || !h || n > INT_MAX || x_stride < H || h_stride < I ||
	    ((uintptr_t)x & 3u) || ((uintptr_t)h & 3u))
		return moet_err(MOET_EINVAL, "gate_up: x %p (stride %lld), tok %p, h %p (stride "
				"%lld), %lld rows", (const void *)x, (long long)x_stride,
				(const void *)tok, (void *)h, (long long)h_stride, (long long)n);
	int wide = 0;
	if ((rc = moet_rows_variant(&wide)))
		return rc;
	moet_gpu_expert e = {};
	e.gate = *gate;
	e.up = *up;
	e.n_tok = n;
	moet_rows_job g = moet_rows_job_of(moet_rows_dt(dt), 2, I, H, x, x_stride, tok, n, h,
					   h_stride, vec, 0, wide);
	return moet_rows_run(&g, get_gate_up, &e, 1, moet_stream(stream));
}

extern "C" int moet_gpu_expert_table(const moet_gpu_expert *exps, int64_t n_exp,
				     moet_gpu_expert_ptrs *out_table,
				     moet_gpu_expert_geom *out_geom)
{
	if (!exps || !out_table || !out_geom || n_exp < 1 || n_exp > MOET_GPU_GROUP_MAX_EXP)
		return moet_err(MOET_EINVAL, "expert table: %lld experts (1 .. %d) at %p, outputs "
				"%p %p", (long long)n_exp, MOET_GPU_GROUP_MAX_EXP,
				(const void *)exps, (void *)out_table, (void *)out_geom);
	int64_t first = 0;
	while (first < n_exp && !exps[first].gate.data)
		first++;
	if (first == n_exp)
		return moet_err(MOET_EINVAL, "expert table: none of the %lld experts is resident",
				(long long)n_exp);
	const moet_dtype dt = exps[first].gate.dtype;
	const int64_t I = exps[first].gate.rows, H = exps[first].gate.cols;
	int rc = check_geom(dt, I, H);
	if (rc)
		return rc;
	const size_t esz = moet_dtype_size(dt);
	bool up16 = (H * (int64_t)esz) % 16 == 0, down16 = (I * (int64_t)esz) % 16 == 0;
	for (int64_t e = 0; e < n_exp; e++) {
		const moet_gpu_expert *ex = &exps[e];
		moet_gpu_expert_ptrs *t = &out_table[e];
		*t = moet_gpu_expert_ptrs{};
		if (!ex->gate.data)
			continue;
		if ((rc = check_expert(ex, e, dt, I, H, &up16, &down16)))
			return rc;
		*t = moet_gpu_expert_ptrs{ { ex->gate.data, ex->up.data, ex->down.data },
					   { ex->gate.scale_inv, ex->up.scale_inv,
					     ex->down.scale_inv } };
	}
	*out_geom = moet_gpu_expert_geom{ n_exp, I, H, (int)dt, up16, down16 };
	return 0;
}
