/*
 * expert_onednn.c: fast mode of the CPU expert FFN through oneDNN bf16 matmul (moet_fast.h,
 * docs/fast-mode.md). Outside the exact-numerics contract by design.
 *
 * Scratch of a handle (sizes from the options; P = PANEL rows):
 *
 *   xb    bf16 [max_tok][max_hidden]      the call's activations, rounded once
 *   hb    bf16 [max_tok][max_inter]       silu_c(g) * u, rounded once
 *   gu    f32  [max_tok][2P]              one panel's g (cols 0..p) and u (cols p..2p), or
 *                                         one down panel's output before it is copied to y
 *   sil   f32  [max_tok][P]               silu_c(g) before the multiply
 *   panel bf16 [2P][max(H, I)] + padding  dequantized rows (P gate + P up, or P down) in the
 *                                         blocked layout the primitive chose (e.g.
 *                                         BA16a64b2a); grown only when a new primitive
 *                                         needs more
 *   pad   oneDNN's scratchpad (user mode), grown likewise
 *
 * Matmul shapes: [n_tok x H] . [H x 2p] (gate|up panel) and [n_tok x I] . [I x p] (down
 * panel), weights in format "any" (see layout_offsets). Primitives are cached per
 * (M, K, N, ldc), least recently used evicted.
 *
 * NOTE: OpenMP. Debian's oneDNN runs its primitives on the calling thread's OpenMP team;
 * the dequantization and silu loops here use the same team (same libgomp pool), so the two
 * never oversubscribe the cores. Only this file is compiled with -fopenmp.
 *
 * NOTE: AMX. Debian's oneDNN 2.6.3 dispatches to AMX by default where the CPU has it (and
 * asks Linux for the tile state itself): measured on the GPU machine's Sapphire Rapids host
 * with ONEDNN_MAX_CPU_ISA=ALL, the matmuls ran as brg:avx512_core_amx_bf16, so nothing here
 * opts in. ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 turns AMX off (for comparisons).
 *
 * NOTE: PANEL 512 measured best of 256/512/1024 on that host (16 threads, 64-1024 tokens).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_fast.h"

int moet_expert_mode_parse(const char *s, moet_expert_mode_t *out_mode)
{
	if (s && !strcmp(s, "exact")) {
		*out_mode = MOET_EXPERT_MODE_EXACT;
		return 0;
	}
	if (s && !strcmp(s, "fast")) {
		*out_mode = MOET_EXPERT_MODE_FAST;
		return 0;
	}
	return moet_err(MOET_EINVAL, "expert mode '%s': expected exact or fast", s ? s : "(null)");
}

moet_expert_mode_t moet_expert_mode(void)
{
	const char *s = getenv("MOET_EXPERT_MODE");
	return (s && !strcmp(s, "fast")) ? MOET_EXPERT_MODE_FAST : MOET_EXPERT_MODE_EXACT;
}

#if !MOET_HAVE_ONEDNN

int moet_fast_available(void) { return 0; }
const char *moet_fast_isa(void) { return "none"; }
void moet_fast_destroy(moet_fast *f) { (void)f; }

int moet_fast_create(const moet_fast_opts *opts, moet_fast **out)
{
	*out = NULL;
	return moet_err(MOET_EUNSUP, "fast expert mode: built without oneDNN (libdnnl-dev)");
}

int moet_fast_expert_ffn(moet_fast *f, const moet_mat *gate, const moet_mat *up,
			 const moet_mat *down, const float *x, int64_t n_tok, float *y)
{
	return moet_err(MOET_EUNSUP, "fast expert mode: built without oneDNN (libdnnl-dev)");
}

#else

#include <immintrin.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "moet_cpu.h"

#ifndef MOET_FAST_PANEL
#define MOET_FAST_PANEL 512 /* weight rows dequantized per matmul (gate and up: P each) */
#endif
#define PANEL MOET_FAST_PANEL
#define CACHE_CAP 128 /* primitives; each n_tok uses up to 4 (full and last panel, 2 kinds) */

/* ---- conversions: scalar, and AVX-512 F/BW/VL where the CPU has it ------------------------ */

static int use_avx512; /* chosen once in fast_init, before any worker runs */

/* bf16 bits of v, round to nearest even, every NaN as 0x7FC0 (vector: one lane per int). */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static __m256i bf16_rne16(__m512 v)
{
	__m512i u = _mm512_castps_si512(v);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
	u = _mm512_srli_epi32(u, 16);
	__mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
	u = _mm512_mask_mov_epi32(u, nan, _mm512_set1_epi32(0x7FC0));
	return _mm512_cvtepi32_epi16(u);
}

__attribute__((target("avx512f,avx512bw,avx512vl")))
static void to_bf16_avx512(const float *in, uint16_t *out, int64_t n)
{
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
		__m512 v = _mm512_maskz_loadu_ps(m, in + i);
		_mm256_mask_storeu_epi16(out + i, m, bf16_rne16(v));
	}
}

/*
 * e4m3fn codes -> binary32 without a table: for e > 0 the 7 magnitude bits shifted to f32
 * bits 20..26 plus 120 in the exponent field are the value; e == 0 (subnormal m 2^-9) goes
 * through int -> float, exact. NOTE: no f32 subnormal is ever formed: x86 multiplies them
 * through a microcode assist (~100 cycles), which made this loop 10x slower. 0x7F: NaN.
 */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void deq_e4m3_avx512(const uint8_t *q, float s, uint16_t *out, int64_t n)
{
	const __m512 vs = _mm512_set1_ps(s), sub = _mm512_set1_ps(0x1p-9f);
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
		__m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, q + i));
		__m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
		__m512i sgn = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
		__m512i nrm = _mm512_add_epi32(_mm512_slli_epi32(mag, 20),
					       _mm512_set1_epi32(120 << 23));
		__mmask16 is_sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
		__m512 v = _mm512_castsi512_ps(nrm);
		v = _mm512_mask_mul_ps(v, is_sub, _mm512_cvtepi32_ps(mag), sub);
		v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sgn));
		__mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
		v = _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
		_mm256_mask_storeu_epi16(out + i, m, bf16_rne16(_mm512_mul_ps(v, vs)));
	}
}

static void to_bf16(const float *in, uint16_t *out, int64_t n)
{
	if (use_avx512) {
		to_bf16_avx512(in, out, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		out[i] = moet_enc_bf16(in[i]);
}

/* Columns k0 .. k0+nk-1 of row r of w as bf16, inside one 128-column scale block: FP8 code x
 * the block's scale rounded once, or the BF16 bits as is. */
static void deq_seg(const moet_mat *w, int64_t r, int64_t k0, int64_t nk, uint16_t *out)
{
	const int64_t K = w->cols;
	if (w->dtype == MOET_DT_BF16) {
		memcpy(out, (const uint16_t *)w->data + r * K + k0, (size_t)nk * 2);
		return;
	}
	const uint8_t *q = (const uint8_t *)w->data + r * K + k0;
	const int64_t bc = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const float s = w->scale_inv[(r / MOET_BLOCK) * bc + k0 / MOET_BLOCK];
	if (use_avx512) {
		deq_e4m3_avx512(q, s, out, nk);
		return;
	}
	for (int64_t k = 0; k < nk; k++) {
		float v = moet_dec_e4m3(q[k]) * s;
		out[k] = v != v ? 0x7FC0 : moet_enc_bf16(v);
	}
}

typedef struct prim {
	int64_t m, k, n, ldc; /* the key; m == 0: empty slot */
	uint64_t used;        /* LRU clock */
	dnnl_primitive_t p;
	dnnl_memory_t src, wei, dst, pad;
	int64_t pk, pn;          /* the weights' padded K and N */
	int32_t *off_k, *off_n;  /* element (k, n) of the weights is at off_k[k] + off_n[n] */
	int pairs;               /* k pairs (2j, 2j+1) adjacent, 4-byte aligned (VNNI) */
	size_t wei_bytes;
} prim;

struct moet_fast {
	dnnl_engine_t eng;
	dnnl_stream_t strm;
	int n_threads;
	int64_t max_tok, max_hidden, max_inter;
	uint16_t *xb, *hb;
	uint16_t *panel;          /* in the layout the matmul primitive chose */
	size_t panel_bytes;
	float *gu, *sil;
	void *pad;
	size_t pad_bytes;
	uint64_t clock;
	prim cache[CACHE_CAP];
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void fast_init(void)
{
	use_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		     __builtin_cpu_supports("avx512vl");
}

int moet_fast_available(void) { return 1; }

const char *moet_fast_isa(void)
{
	pthread_once(&init_once, fast_init);
	switch (dnnl_get_effective_cpu_isa()) {
	case dnnl_cpu_isa_avx512_core_amx: return "amx";
	case dnnl_cpu_isa_avx512_core_bf16: return "avx512_bf16";
	case dnnl_cpu_isa_avx512_core_vnni: return "avx512_vnni";
	case dnnl_cpu_isa_avx512_core: return "avx512";
	case dnnl_cpu_isa_avx2: case dnnl_cpu_isa_avx2_vnni: return "avx2";
	default: return "other";
	}
}

static int dnnl_fail(dnnl_status_t st, const char *what)
{
	int code = st == dnnl_out_of_memory ? MOET_ENOMEM : MOET_EUNSUP;
	return moet_err(code, "fast expert mode: oneDNN %s failed: %s", what,
			dnnl_status2str(st));
}

#define DNNL_TRY(call, what)                                                                \
	do {                                                                                \
		dnnl_status_t st_ = (call);                                                 \
		if (st_ != dnnl_success) {                                                  \
			rc = dnnl_fail(st_, what);                                          \
			goto fail;                                                          \
		}                                                                           \
	} while (0)

static void prim_clear(prim *e)
{
	dnnl_primitive_destroy(e->p);
	dnnl_memory_destroy(e->src);
	dnnl_memory_destroy(e->wei);
	dnnl_memory_destroy(e->dst);
	dnnl_memory_destroy(e->pad);
	free(e->off_k);
	free(e->off_n);
	memset(e, 0, sizeof(*e));
}

void moet_fast_destroy(moet_fast *f)
{
	if (!f)
		return;
	for (int i = 0; i < CACHE_CAP; i++)
		prim_clear(&f->cache[i]);
	if (f->strm)
		dnnl_stream_destroy(f->strm);
	if (f->eng)
		dnnl_engine_destroy(f->eng);
	free(f->xb);
	free(f->hb);
	free(f->panel);
	free(f->gu);
	free(f->sil);
	free(f->pad);
	free(f);
}

static void *alloc64(size_t bytes)
{
	return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

int moet_fast_create(const moet_fast_opts *opts, moet_fast **out)
{
	moet_fast_opts o = opts ? *opts : (moet_fast_opts){ 0 };
	moet_fast *f = NULL;
	int rc;
	*out = NULL;
	if (o.max_tok < 0 || o.max_hidden < 0 || o.max_inter < 0 || o.n_threads < 0)
		return moet_err(MOET_EINVAL, "fast expert mode: negative option");
	pthread_once(&init_once, fast_init);
	f = calloc(1, sizeof(*f));
	if (!f)
		return moet_err(MOET_ENOMEM, "fast expert mode: handle");
	f->max_tok = o.max_tok ? o.max_tok : 1024;
	f->max_hidden = o.max_hidden ? o.max_hidden : 7168;
	f->max_inter = o.max_inter ? o.max_inter : 2048;
	f->n_threads = o.n_threads ? o.n_threads : omp_get_max_threads();
	f->xb = alloc64((size_t)f->max_tok * f->max_hidden * 2);
	f->hb = alloc64((size_t)f->max_tok * f->max_inter * 2);

	f->gu = alloc64((size_t)f->max_tok * 2 * PANEL * 4);
	f->sil = alloc64((size_t)f->max_tok * PANEL * 4);
	if (!f->xb || !f->hb || !f->gu || !f->sil) {
		rc = moet_err(MOET_ENOMEM, "fast expert mode: scratch for %lld tokens",
			      (long long)f->max_tok);
		goto fail;
	}
	DNNL_TRY(dnnl_engine_create(&f->eng, dnnl_cpu, 0), "engine creation");
	DNNL_TRY(dnnl_stream_create(&f->strm, f->eng, dnnl_stream_default_flags),
		 "stream creation");
	*out = f;
	return 0;
fail:
	moet_fast_destroy(f);
	return rc;
}

/*
 * Where element (k, n) of a blocked weights layout lives: oneDNN's blocking descriptor is
 * outer strides per dimension plus nested inner blocks, so the offset splits into a part
 * for k and a part for n. NOTE: writing the dequantized panel straight into the layout the
 * primitive wants (format "any", e.g. BA16a64b2a: VNNI pairs of k) spares oneDNN its own copy
 * of plain weights, which every thread did again for its rows of the output.
 */
static int layout_offsets(const dnnl_memory_desc_t *md, prim *e)
{
	if (md->format_kind != dnnl_blocked)
		return moet_err(MOET_EUNSUP, "fast expert mode: oneDNN weights layout not blocked");
	const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
	e->pk = md->padded_dims[0];
	e->pn = md->padded_dims[1];
	e->off_k = malloc(sizeof(int32_t) * e->pk);
	e->off_n = malloc(sizeof(int32_t) * e->pn);
	if (!e->off_k || !e->off_n)
		return moet_err(MOET_ENOMEM, "fast expert mode: layout tables");
	for (int d = 0; d < 2; d++) {
		int64_t tb = 1;
		for (int i = 0; i < b->inner_nblks; i++)
			if (b->inner_idxs[i] == d)
				tb *= b->inner_blks[i];
		for (int64_t idx = 0; idx < md->padded_dims[d]; idx++) {
			int64_t off = (idx / tb) * b->strides[d] + (d == 0 ? md->offset0 : 0);
			int64_t mul = 1, div = 1;
			for (int i = b->inner_nblks - 1; i >= 0; i--) {
				if (b->inner_idxs[i] == d) {
					off += (idx / div) % b->inner_blks[i] * mul;
					div *= b->inner_blks[i];
				}
				mul *= b->inner_blks[i];
			}
			(d == 0 ? e->off_k : e->off_n)[idx] = (int32_t)off;
		}
	}
	e->pairs = e->pk % 2 == 0;
	for (int64_t j = 0; j + 1 < e->pk && e->pairs; j += 2)
		e->pairs = e->off_k[j] % 2 == 0 && e->off_k[j + 1] == e->off_k[j] + 1;
	for (int64_t n = 0; n < e->pn && e->pairs; n++)
		e->pairs = e->off_n[n] % 2 == 0;
	e->wei_bytes = dnnl_memory_desc_get_size(md);
	return 0;
}

/* The cached primitive for dst[M x N] (row stride ldc) = src[M x K] . wei[K x N] (wei stored
 * as N rows of K), created on a miss (evicting the least recently used). */
static int get_prim(moet_fast *f, int64_t m, int64_t k, int64_t n, int64_t ldc, prim **out)
{
	prim *e = NULL, *victim = &f->cache[0];
	dnnl_primitive_attr_t attr = NULL;
	dnnl_primitive_desc_t pd = NULL;
	int rc = 0;
	for (int i = 0; i < CACHE_CAP; i++) {
		prim *c = &f->cache[i];
		if (c->m == m && c->k == k && c->n == n && c->ldc == ldc) {
			e = c;
			break;
		}
		if (c->used < victim->used)
			victim = c;
	}
	if (!e) {
		e = victim;
		prim_clear(e);
		dnnl_memory_desc_t smd, wmd, dmd;
		dnnl_matmul_desc_t desc;
		DNNL_TRY(dnnl_memory_desc_init_by_strides(&smd, 2, (dnnl_dims_t){ m, k },
							  dnnl_bf16, (dnnl_dims_t){ k, 1 }),
			 "src descriptor");
		DNNL_TRY(dnnl_memory_desc_init_by_tag(&wmd, 2, (dnnl_dims_t){ k, n }, dnnl_bf16,
						      dnnl_format_tag_any),
			 "weights descriptor");
		DNNL_TRY(dnnl_memory_desc_init_by_strides(&dmd, 2, (dnnl_dims_t){ m, n },
							  dnnl_f32, (dnnl_dims_t){ ldc, 1 }),
			 "dst descriptor");
		DNNL_TRY(dnnl_matmul_desc_init(&desc, &smd, &wmd, NULL, &dmd), "matmul descriptor");
		DNNL_TRY(dnnl_primitive_attr_create(&attr), "attr");
		DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
			 "scratchpad mode");
		DNNL_TRY(dnnl_primitive_desc_create(&pd, &desc, attr, f->eng, NULL),
			 "matmul primitive descriptor");
		const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(
			pd, dnnl_query_scratchpad_md, 0);
		size_t pad_bytes = pmd ? dnnl_memory_desc_get_size(pmd) : 0;
		if (pad_bytes > f->pad_bytes) {
			free(f->pad);
			f->pad_bytes = 0;
			f->pad = alloc64(pad_bytes);
			if (!f->pad) {
				rc = moet_err(MOET_ENOMEM, "fast expert mode: scratchpad %zu bytes",
					      pad_bytes);
				goto fail;
			}
			f->pad_bytes = pad_bytes;
		}
		wmd = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
		rc = layout_offsets(&wmd, e);
		if (rc)
			goto fail;
		if (e->wei_bytes > f->panel_bytes) {
			free(f->panel);
			f->panel_bytes = 0;
			f->panel = alloc64(e->wei_bytes);
			if (!f->panel) {
				rc = moet_err(MOET_ENOMEM, "fast expert mode: panel %zu bytes",
					      e->wei_bytes);
				goto fail;
			}
			f->panel_bytes = e->wei_bytes;
		}
		DNNL_TRY(dnnl_primitive_create(&e->p, pd), "matmul primitive");
		DNNL_TRY(dnnl_memory_create(&e->src, &smd, f->eng, DNNL_MEMORY_NONE), "memory");
		DNNL_TRY(dnnl_memory_create(&e->wei, &wmd, f->eng, DNNL_MEMORY_NONE), "memory");
		DNNL_TRY(dnnl_memory_create(&e->dst, &dmd, f->eng, DNNL_MEMORY_NONE), "memory");
		if (pmd && pad_bytes)
			DNNL_TRY(dnnl_memory_create(&e->pad, pmd, f->eng, DNNL_MEMORY_NONE),
				 "memory");
		e->m = m, e->k = k, e->n = n, e->ldc = ldc;
	}
	e->used = ++f->clock;
	*out = e;
fail:
	if (rc)
		prim_clear(e);
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_attr_destroy(attr);
	return rc;
}

/* dst = src . panel through primitive e (see get_prim). */
static int matmul(moet_fast *f, prim *e, const uint16_t *src, float *dst)
{
	int rc = 0;
	const uint16_t *wei = f->panel;
	dnnl_exec_arg_t args[4] = {
		{ DNNL_ARG_SRC, e->src }, { DNNL_ARG_WEIGHTS, e->wei }, { DNNL_ARG_DST, e->dst },
		{ DNNL_ARG_SCRATCHPAD, e->pad },
	};
	DNNL_TRY(dnnl_memory_set_data_handle(e->src, (void *)src), "set handle");
	DNNL_TRY(dnnl_memory_set_data_handle(e->wei, (void *)wei), "set handle");
	DNNL_TRY(dnnl_memory_set_data_handle(e->dst, dst), "set handle");
	if (e->pad)
		DNNL_TRY(dnnl_memory_set_data_handle(e->pad, f->pad), "set handle");
	DNNL_TRY(dnnl_primitive_execute(e->p, f->strm, e->pad ? 4 : 3, args), "matmul");
	DNNL_TRY(dnnl_stream_wait(f->strm), "stream wait");
fail:
	return rc;
}

static int check_mat(const moet_mat *w, const char *name)
{
	if (w->dtype == MOET_DT_BF16 || (w->dtype == MOET_DT_F8_E4M3 && w->scale_inv))
		return 0;
	return moet_err(MOET_ESHAPE, "fast expert mode: %s is %s%s; expected F8_E4M3 with "
			"scales or BF16", name, moet_dtype_name(w->dtype),
			w->dtype == MOET_DT_F8_E4M3 ? " without scales" : "");
}

/*
 * Dequantizes the weights of primitive e into f->panel, on the team: weights column n < p is
 * row r0 + n of w1, p <= n < 2p row r0 + n - p of w2 (when w2 is not NULL); padding (k >= K,
 * n beyond the rows) is written as zeros, as oneDNN requires.
 * NOTE: tiles of TILE_N rows x 128 columns (one scale block): a tile's part of the blocked
 * layout is a few KB that stays in L1 while its rows scatter into it; row by row over the
 * whole K, every store missed L1 (measured 2x slower than oneDNN's own copy).
 */
#define TILE_N 64
static void deq_panel(moet_fast *f, const prim *e, const moet_mat *w1, const moet_mat *w2,
		      int64_t r0, int64_t p, int nthr)
{
	const int64_t K = w1->cols, rows = w2 ? 2 * p : p;
	const int64_t tiles_n = (e->pn + TILE_N - 1) / TILE_N;
	const int64_t tiles_k = (e->pk + MOET_BLOCK - 1) / MOET_BLOCK;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthr)
	for (int64_t tn = 0; tn < tiles_n; tn++)
		for (int64_t tk = 0; tk < tiles_k; tk++) {
			uint16_t tmp[MOET_BLOCK] __attribute__((aligned(64)));
			const int64_t k0 = tk * MOET_BLOCK;
			const int64_t kn = e->pk - k0 < MOET_BLOCK ? e->pk - k0 : MOET_BLOCK;
			const int64_t kv = K - k0 < kn ? K - k0 : kn; /* columns with data */
			const int32_t *ok = e->off_k + k0;
			const int64_t n1 = (tn + 1) * TILE_N < e->pn ? (tn + 1) * TILE_N : e->pn;
			for (int64_t n = tn * TILE_N; n < n1; n++) {
				int64_t have = n < rows ? kv : 0;
				if (have > 0)
					deq_seg(n < p ? w1 : w2, r0 + (n < p ? n : n - p), k0, have,
						tmp);
				else
					have = 0;
				memset(tmp + have, 0, (size_t)(kn - have) * 2);
				uint16_t *dst = f->panel + e->off_n[n];
				if (e->pairs) {
					uint32_t *d32 = (uint32_t *)dst;
					const uint32_t *s32 = (const uint32_t *)tmp;
					for (int64_t j = 0; j < kn / 2; j++)
						d32[ok[2 * j] / 2] = s32[j];
				} else {
					for (int64_t k = 0; k < kn; k++)
						dst[ok[k]] = tmp[k];
				}
			}
		}
}

int moet_fast_expert_ffn(moet_fast *f, const moet_mat *gate, const moet_mat *up,
			 const moet_mat *down, const float *x, int64_t n_tok, float *y)
{
	if (!f || !gate || !up || !down || !x || !y || n_tok < 0)
		return moet_err(MOET_EINVAL, "fast expert mode: NULL or negative argument");
	const int64_t I = gate->rows, H = gate->cols;
	if (up->rows != I || up->cols != H || down->cols != I || down->rows != H)
		return moet_err(MOET_ESHAPE, "fast expert mode: matrices do not chain: gate "
				"%lldx%lld, up %lldx%lld, down %lldx%lld", (long long)I,
				(long long)H, (long long)up->rows, (long long)up->cols,
				(long long)down->rows, (long long)down->cols);
	int rc = check_mat(gate, "gate");
	if (!rc)
		rc = check_mat(up, "up");
	if (!rc)
		rc = check_mat(down, "down");
	if (rc)
		return rc;
	if (n_tok > f->max_tok || H > f->max_hidden || I > f->max_inter)
		return moet_err(MOET_ERANGE, "fast expert mode: %lld tokens, H %lld, I %lld above "
				"the handle's %lld, %lld, %lld", (long long)n_tok, (long long)H,
				(long long)I, (long long)f->max_tok, (long long)f->max_hidden,
				(long long)f->max_inter);
	if (n_tok == 0 || H == 0)
		return 0;
	if (I == 0) { /* D over no columns is +0 */
		memset(y, 0, (size_t)n_tok * H * sizeof(float));
		return 0;
	}
	const int nthr = f->n_threads;
	const int saved = omp_get_max_threads();
	const moet_cpu_kernels *k = moet_cpu_kernels_get();
	omp_set_num_threads(nthr); /* oneDNN sizes its team from the caller's setting */

#pragma omp parallel for schedule(static) num_threads(nthr)
	for (int64_t t = 0; t < n_tok; t++)
		to_bf16(x + t * H, f->xb + t * H, H);

	for (int64_t i0 = 0; i0 < I && !rc; i0 += PANEL) {
		const int64_t p = I - i0 < PANEL ? I - i0 : PANEL;
		prim *e;
		rc = get_prim(f, n_tok, H, 2 * p, 2 * p, &e);
		if (rc)
			break;
		deq_panel(f, e, gate, up, i0, p, nthr);
		rc = matmul(f, e, f->xb, f->gu);
		if (rc)
			break;
#pragma omp parallel for schedule(static) num_threads(nthr)
		for (int64_t t = 0; t < n_tok; t++) {
			const float *g = f->gu + t * 2 * p, *u = g + p;
			float *s = f->sil + t * PANEL;
			k->silu_c(g, s, p);
			for (int64_t i = 0; i < p; i++)
				s[i] = s[i] * u[i];
			to_bf16(s, f->hb + t * I + i0, p);
		}
	}
	for (int64_t j0 = 0; j0 < H && !rc; j0 += PANEL) {
		const int64_t p = H - j0 < PANEL ? H - j0 : PANEL;
		/* NOTE: a dense dst, copied out: with dst stride H instead of p, oneDNN 2.6
		 * falls back from brgemm to its plain jit gemm (measured 8x slower here) */
		prim *e;
		rc = get_prim(f, n_tok, I, p, p, &e);
		if (rc)
			break;
		deq_panel(f, e, down, NULL, j0, p, nthr);
		rc = matmul(f, e, f->hb, f->gu);
		if (rc)
			break;
#pragma omp parallel for schedule(static) num_threads(nthr)
		for (int64_t t = 0; t < n_tok; t++)
			for (int64_t j = 0; j < p; j++)
				y[t * H + j0 + j] = moet_canon_nan(f->gu[t * p + j]);
	}
	omp_set_num_threads(saved);
	return rc;
}

#endif
