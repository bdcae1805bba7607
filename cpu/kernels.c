/*
 * kernels.c: the table of kernel variants and the choice among them.
 *
 *   variants[] = { ref, avx512 (when built) }    each with a "runs here?" check
 *   moet_cpu_kernels_get(): MOET_KERNEL_EXPERT if set and runnable, else the last runnable
 *   entry (the most specialized), chosen once (pthread_once) before any worker uses it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "moet_cpu.h"
#include "moet_env.h"
#include "moet_err.h"
#include "moet_expc.h"

static void rows_ref(const moet_mat *w, int64_t r0, int64_t r1, const float *x, int64_t x_stride,
		     int64_t n_tok, float *y, int64_t y_stride)
{
	for (int64_t t = 0; t < n_tok; t++)
		for (int64_t r = r0; r < r1; r++)
			y[t * y_stride + (r - r0)] = moet_dot_ref(w, r, x + t * x_stride);
}

static void gate_up_ref(const moet_mat *gate, const moet_mat *up, int64_t r0, int64_t r1,
			const float *x, int64_t x_stride, int64_t n_tok, float *h, int64_t h_stride)
{
	for (int64_t t = 0; t < n_tok; t++)
		for (int64_t i = r0; i < r1; i++) {
			float g = moet_dot_ref(gate, i, x + t * x_stride);
			float u = moet_dot_ref(up, i, x + t * x_stride);
			h[t * h_stride + (i - r0)] = moet_silu_c(g) * u;
		}
}

static void exp_c_ref(const float *in, float *out, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		out[i] = moet_exp_c(in[i]);
}

static void silu_c_ref(const float *in, float *out, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		out[i] = moet_silu_c(in[i]);
}

const moet_cpu_kernels moet_cpu_kernels_ref = {
	.isa = "ref",
	.rows = rows_ref,
	.gate_up = gate_up_ref,
	.exp_c = exp_c_ref,
	.silu_c = silu_c_ref,
};

#ifdef MOET_HAVE_AVX512_KERNELS
extern const moet_cpu_kernels moet_cpu_kernels_avx512;
int moet_cpu_avx512_supported(void);
#endif

static const struct {
	const moet_cpu_kernels *k;
	int (*runs_here)(void);
} variants[] = {
	{ &moet_cpu_kernels_ref, NULL },
#ifdef MOET_HAVE_AVX512_KERNELS
	{ &moet_cpu_kernels_avx512, moet_cpu_avx512_supported },
#endif
};

static const moet_cpu_kernels *chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

const moet_cpu_kernels *moet_cpu_kernels_named(const char *isa)
{
	for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++)
		if (!strcmp(variants[i].k->isa, isa))
			return (!variants[i].runs_here || variants[i].runs_here()) ? variants[i].k
										  : NULL;
	return NULL;
}

static void choose(void)
{
	const char *want = getenv("MOET_KERNEL_EXPERT");
	chosen = &moet_cpu_kernels_ref;
	if (want && want[0]) {
		const moet_cpu_kernels *k = moet_cpu_kernels_named(want);
		if (k)
			chosen = k;
		return;
	}
	for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++)
		if (!variants[i].runs_here || variants[i].runs_here())
			chosen = variants[i].k;
}

const moet_cpu_kernels *moet_cpu_kernels_get(void)
{
	pthread_once(&chosen_once, choose);
	return chosen;
}

int moet_cpu_attend_choose(moet_attend_fn *out)
{
	/* NOTE: in the order of the choice's index: unset and empty select names[0] */
	static const char *const names[] = { NULL, "avx512", "ref" };
	int v = 0, rc = moet_env_choice("MOET_CPU_ATTN", names, 3, &v);
	*out = moet_attend_ref;
	if (rc || v == 2)
		return rc;
#ifdef MOET_HAVE_AVX512_KERNELS
	if (moet_cpu_avx512_supported()) {
		*out = moet_attend_avx512;
		return 0;
	}
#endif
	return v == 1 ? moet_err(MOET_EINVAL, "MOET_CPU_ATTN=avx512: not built, or this CPU has "
				 "no AVX-512") : 0;
}

int moet_expert_ffn(const moet_cpu_kernels *k, const moet_mat *gate, const moet_mat *up,
		    const moet_mat *down, const float *x, int64_t n_tok, float *scratch, float *y)
{
	const int64_t I = gate->rows, H = gate->cols;
	if (up->rows != I || up->cols != H || down->cols != I)
		return moet_err(MOET_ESHAPE, "expert matrices do not chain: gate %lldx%lld, up "
				"%lldx%lld, down %lldx%lld", (long long)gate->rows,
				(long long)gate->cols, (long long)up->rows, (long long)up->cols,
				(long long)down->rows, (long long)down->cols);
	k->gate_up(gate, up, 0, I, x, H, n_tok, scratch, I);
	k->rows(down, 0, down->rows, scratch, I, n_tok, y, down->rows);
	for (int64_t i = 0; i < n_tok * down->rows; i++)
		y[i] = moet_canon_nan(y[i]);
	return 0;
}
