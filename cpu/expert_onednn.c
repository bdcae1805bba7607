/*
 * expert_onednn.c: fast mode of the CPU expert FFN through oneDNN bf16 matmul (moet_fast.h,
 * docs/fast-mode.md). Outside the exact-numerics contract by design.
 *
 * Work split: every thread of the OpenMP team owns whole slices of weight rows and runs
 * single-threaded oneDNN primitives on them, so that the dequantized panel is written and
 * read in the thread's own L2 and never goes to memory:
 *
 *   phase 0  xb = bf16(x), in K chunks           [chunk][n_tok][kc]      (split over tokens)
 *   phase 1  slice j: s gate rows + s up rows    for each K chunk c of H:
 *              pack rows x chunk c -> panel (bf16, blocked, ~0.5 MB, in L2)
 *              acc[n_tok][2s] (+)= xb_c . panel                          (1-thread matmul)
 *            hb[.., rows of j] = bf16(silu_c(g) * u)                     (chunked like xb)
 *   phase 2  slice j: s2 down rows               for each K chunk c of I:
 *              pack, acc[n_tok][s2] (+)= hb_c . panel
 *            y[:, rows of j] = canon_nan(acc)
 *
 * Slices per phase are a multiple of the thread count where the rows allow (their size
 * rounded to 16), so every thread gets the same work. K chunks are a multiple of 128 (whole
 * scale blocks) and at most k_chunk; the matmul of chunk c > 0 adds into acc (oneDNN's sum
 * post-op). Activations are stored chunk-major because oneDNN 2.6's brgemm matmul takes dense
 * operands only (with a row stride above K it falls back to a much slower kernel).
 *
 * Per worker (thread): a oneDNN stream, a cache of primitives keyed by (M, K, N, sum) with
 * their weights layouts, and scratch (panel, oneDNN scratchpad, acc), all allocated by the
 * worker itself on first need (first touch on its core) and grown only for a larger shape.
 *
 * NOTE: OpenMP. Debian's oneDNN runs on OpenMP; inside a parallel region its primitives run
 * on the calling thread alone (omp_in_parallel). Each worker also sets its own OpenMP thread
 * count to 1 before creating primitives, so that oneDNN plans them for one thread. Only this
 * file is compiled with -fopenmp.
 *
 * NOTE: AMX. Debian's oneDNN 2.6.3 dispatches to AMX by default where the CPU has it (and
 * asks Linux for the tile state itself): on the GPU machine's Sapphire Rapids host the
 * matmuls ran as brg:avx512_core_amx_bf16. ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 turns AMX off.
 */
#include <stdio.h>
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


#include <omp.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "fast_int.h"
#include "moet_cpu.h"

#define WCAP 32 /* primitives cached per worker; one n_tok uses 2 to 8 */
#define DEF_SLICE 64
#define DEF_SLICE_DOWN 128
#define DEF_K_CHUNK 2048

typedef struct prim {
	int64_t m, k, n;       /* the key (with sum); m == 0: empty slot */
	int sum;               /* adds into dst */
	uint64_t used;         /* LRU clock */
	dnnl_primitive_t p;
	dnnl_memory_t src, wei, dst, pad;
	moet_fast_layout lay;  /* the weights layout (off_k, off_n owned here) */
	size_t wei_bytes, pad_bytes;
} prim;

typedef struct worker {
	dnnl_stream_t strm;
	uint16_t *panel;
	size_t panel_bytes;
	void *pad;
	size_t pad_bytes;
	float *acc;            /* [max_tok][max slice width] */
	float *sil;            /* [max slice width] */
	uint64_t clock;
	int rc;                /* first error of this worker in the current call */
	char msg[240];         /* its detail (moet_errmsg is per thread) */
	prim cache[WCAP];
} worker;

struct moet_fast {
	dnnl_engine_t eng;
	int n_threads;
	int64_t max_tok, max_hidden, max_inter;
	int64_t slice, slice_down, k_chunk;
	int64_t acc_cols;      /* widest slice: max(2 slice, slice_down) rounded to 16 */
	uint16_t *xb, *hb;     /* chunk-major activations (see the note at the top) */
	worker *w;             /* [n_threads] */
};

int moet_fast_available(void) { return 1; }

const char *moet_fast_isa(void)
{
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
	free((void *)e->lay.off_k);
	free((void *)e->lay.off_n);
	memset(e, 0, sizeof(*e));
}

void moet_fast_destroy(moet_fast *f)
{
	if (!f)
		return;
	for (int t = 0; f->w && t < f->n_threads; t++) {
		worker *w = &f->w[t];
		for (int i = 0; i < WCAP; i++)
			prim_clear(&w->cache[i]);
		if (w->strm)
			dnnl_stream_destroy(w->strm);
		free(w->panel);
		free(w->pad);
		free(w->acc);
		free(w->sil);
	}
	free(f->w);
	if (f->eng)
		dnnl_engine_destroy(f->eng);
	free(f->xb);
	free(f->hb);
	free(f);
}

static void *alloc64(size_t bytes)
{
	return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

static int64_t up16(int64_t v) { return (v + 15) / 16 * 16; }

int moet_fast_create(const moet_fast_opts *opts, moet_fast **out)
{
	moet_fast_opts o = opts ? *opts : (moet_fast_opts){ 0 };
	moet_fast *f = NULL;
	int rc;
	*out = NULL;
	if (o.max_tok < 0 || o.max_hidden < 0 || o.max_inter < 0 || o.n_threads < 0 ||
	    o.slice_rows < 0 || o.slice_rows_down < 0 || o.k_chunk < 0)
		return moet_err(MOET_EINVAL, "fast expert mode: negative option");
	f = calloc(1, sizeof(*f));
	if (!f)
		return moet_err(MOET_ENOMEM, "fast expert mode: handle");
	f->max_tok = o.max_tok ? o.max_tok : 1024;
	f->max_hidden = o.max_hidden ? o.max_hidden : 7168;
	f->max_inter = o.max_inter ? o.max_inter : 2048;
	f->n_threads = o.n_threads ? o.n_threads : omp_get_max_threads();
	f->slice = up16(o.slice_rows ? o.slice_rows : DEF_SLICE);
	f->slice_down = up16(o.slice_rows_down ? o.slice_rows_down : DEF_SLICE_DOWN);
	f->k_chunk = ((o.k_chunk ? o.k_chunk : DEF_K_CHUNK) + 127) / 128 * 128;
	if (f->k_chunk < 128)
		f->k_chunk = 128;
	/* slice_count never makes a slice wider than its target */
	f->acc_cols = 2 * f->slice > f->slice_down ? 2 * f->slice : f->slice_down;
	f->xb = alloc64((size_t)f->max_tok * f->max_hidden * 2);
	f->hb = alloc64((size_t)f->max_tok * f->max_inter * 2);
	f->w = calloc((size_t)f->n_threads, sizeof(worker));
	if (!f->xb || !f->hb || !f->w) {
		rc = moet_err(MOET_ENOMEM, "fast expert mode: scratch for %lld tokens",
			      (long long)f->max_tok);
		goto fail;
	}
	DNNL_TRY(dnnl_engine_create(&f->eng, dnnl_cpu, 0), "engine creation");
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
 * of plain weights, which it would redo for every block of output rows.
 */
static int layout_offsets(const dnnl_memory_desc_t *md, prim *e)
{
	if (md->format_kind != dnnl_blocked)
		return moet_err(MOET_EUNSUP, "fast expert mode: oneDNN weights layout not blocked");
	const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
	int32_t *off[2];
	e->lay.pk = md->padded_dims[0];
	e->lay.pn = md->padded_dims[1];
	e->lay.off_k = off[0] = malloc(sizeof(int32_t) * e->lay.pk);
	e->lay.off_n = off[1] = malloc(sizeof(int32_t) * e->lay.pn);
	if (!off[0] || !off[1])
		return moet_err(MOET_ENOMEM, "fast expert mode: layout tables");
	for (int d = 0; d < 2; d++) {
		int64_t tb = 1;
		for (int i = 0; i < b->inner_nblks; i++)
			if (b->inner_idxs[i] == d)
				tb *= b->inner_blks[i];
		for (int64_t idx = 0; idx < md->padded_dims[d]; idx++) {
			int64_t o = (idx / tb) * b->strides[d] + (d == 0 ? md->offset0 : 0);
			int64_t mul = 1, div = 1;
			for (int i = b->inner_nblks - 1; i >= 0; i--) {
				if (b->inner_idxs[i] == d) {
					o += (idx / div) % b->inner_blks[i] * mul;
					div *= b->inner_blks[i];
				}
				mul *= b->inner_blks[i];
			}
			off[d][idx] = (int32_t)o;
		}
	}
	e->lay.nb = moet_fast_layout_nb(e->lay.pk, e->lay.pn, off[0], off[1]);
	e->wei_bytes = dnnl_memory_desc_get_size(md);
	return 0;
}

/* Grows *buf to bytes (contents dropped). */
static int grow(void **buf, size_t *have, size_t bytes, const char *what)
{
	if (bytes <= *have)
		return 0;
	free(*buf);
	*have = 0;
	if (!(*buf = alloc64(bytes)))
		return moet_err(MOET_ENOMEM, "fast expert mode: %s of %zu bytes", what, bytes);
	*have = bytes;
	return 0;
}

/*
 * The worker's primitive for dst[M x N] (dense; sum: dst += ...) = src[M x K] (dense) .
 * wei[K x N] (wei: weight rows as the N columns), created on a miss (evicting the least
 * recently used); the worker's panel and scratchpad grown to fit it. Runs on the worker.
 */
static int get_prim(moet_fast *f, worker *w, int64_t m, int64_t k, int64_t n, int sum,
		    prim **out)
{
	prim *e = NULL, *victim = &w->cache[0];
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	int rc = 0;
	for (int i = 0; i < WCAP; i++) {
		prim *c = &w->cache[i];
		if (c->m == m && c->k == k && c->n == n && c->sum == sum) {
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
		DNNL_TRY(dnnl_memory_desc_init_by_tag(&smd, 2, (dnnl_dims_t){ m, k }, dnnl_bf16,
						      dnnl_ab), "src descriptor");
		DNNL_TRY(dnnl_memory_desc_init_by_tag(&wmd, 2, (dnnl_dims_t){ k, n }, dnnl_bf16,
						      dnnl_format_tag_any), "weights descriptor");
		DNNL_TRY(dnnl_memory_desc_init_by_tag(&dmd, 2, (dnnl_dims_t){ m, n }, dnnl_f32,
						      dnnl_ab), "dst descriptor");
		DNNL_TRY(dnnl_matmul_desc_init(&desc, &smd, &wmd, NULL, &dmd), "matmul descriptor");
		DNNL_TRY(dnnl_primitive_attr_create(&attr), "attr");
		DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
			 "scratchpad mode");
		if (sum) {
			DNNL_TRY(dnnl_post_ops_create(&po), "post-ops");
			DNNL_TRY(dnnl_post_ops_append_sum(po, 1.0f), "sum post-op");
			DNNL_TRY(dnnl_primitive_attr_set_post_ops(attr, po), "post-ops");
		}
		DNNL_TRY(dnnl_primitive_desc_create(&pd, &desc, attr, f->eng, NULL),
			 "matmul primitive descriptor");
		const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(
			pd, dnnl_query_scratchpad_md, 0);
		e->pad_bytes = pmd ? dnnl_memory_desc_get_size(pmd) : 0;
		wmd = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
		if ((rc = layout_offsets(&wmd, e)) ||
		    (rc = grow((void **)&w->panel, &w->panel_bytes, e->wei_bytes, "panel")) ||
		    (rc = grow(&w->pad, &w->pad_bytes, e->pad_bytes, "scratchpad")))
			goto fail;
		DNNL_TRY(dnnl_primitive_create(&e->p, pd), "matmul primitive");
		DNNL_TRY(dnnl_memory_create(&e->src, &smd, f->eng, DNNL_MEMORY_NONE), "memory");
		DNNL_TRY(dnnl_memory_create(&e->wei, &wmd, f->eng, DNNL_MEMORY_NONE), "memory");
		DNNL_TRY(dnnl_memory_create(&e->dst, &dmd, f->eng, DNNL_MEMORY_NONE), "memory");
		if (pmd && e->pad_bytes)
			DNNL_TRY(dnnl_memory_create(&e->pad, pmd, f->eng, DNNL_MEMORY_NONE),
				 "memory");
		e->m = m, e->k = k, e->n = n, e->sum = sum;
	}
	e->used = ++w->clock;
	*out = e;
fail:
	if (rc)
		prim_clear(e);
	dnnl_primitive_desc_destroy(pd);
	dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
	return rc;
}

/* dst (+)= src . w->panel through primitive e, on the worker's stream. */
static int matmul(worker *w, prim *e, const uint16_t *src, float *dst)
{
	int rc = 0;
	dnnl_exec_arg_t args[4] = {
		{ DNNL_ARG_SRC, e->src }, { DNNL_ARG_WEIGHTS, e->wei }, { DNNL_ARG_DST, e->dst },
		{ DNNL_ARG_SCRATCHPAD, e->pad },
	};
	DNNL_TRY(dnnl_memory_set_data_handle(e->src, (void *)src), "set handle");
	DNNL_TRY(dnnl_memory_set_data_handle(e->wei, w->panel), "set handle");
	DNNL_TRY(dnnl_memory_set_data_handle(e->dst, dst), "set handle");
	if (e->pad)
		DNNL_TRY(dnnl_memory_set_data_handle(e->pad, w->pad), "set handle");
	DNNL_TRY(dnnl_primitive_execute(e->p, w->strm, e->pad ? 4 : 3, args), "matmul");
	DNNL_TRY(dnnl_stream_wait(w->strm), "stream wait");
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

/* K split into chunks: nc chunks of kc columns (a multiple of 128), the last one shorter. */
typedef struct chunks {
	int64_t K, kc, nc, m; /* m: rows (tokens) of the chunk-major activations */
} chunks;

static chunks make_chunks(int64_t K, int64_t k_chunk, int64_t m)
{
	int64_t nc = (K + k_chunk - 1) / k_chunk;
	int64_t kc = ((K + nc - 1) / nc + 127) / 128 * 128;
	return (chunks){ .K = K, .kc = kc, .nc = (K + kc - 1) / kc, .m = m };
}

static int64_t chunk_len(const chunks *c, int64_t i)
{
	return c->K - i * c->kc < c->kc ? c->K - i * c->kc : c->kc;
}

/* Element (t, k) of chunk-major activations: chunk k / kc, row t, its row length. */
static int64_t chunk_at(const chunks *c, int64_t t, int64_t k)
{
	const int64_t i = k / c->kc;
	return i * c->kc * c->m + t * chunk_len(c, i) + (k - i * c->kc);
}

/* Rows split into slices: ns slices of s rows (a multiple of 16), the last one shorter;
 * ns a multiple of nthr where the rows allow (whole slices per thread). */
static void slice_count(int64_t rows, int64_t target, int nthr, int64_t *ns, int64_t *s)
{
	int64_t n = (rows + target - 1) / target, most = (rows + 15) / 16;
	n = (n + nthr - 1) / nthr * nthr;
	if (n > most)
		n = most;
	*s = up16((rows + n - 1) / n);
	*ns = (rows + *s - 1) / *s;
}

/* acc[n_tok][cols] (+)= act . (rows a, b)^T over all K chunks (see the note at the top). */
static int slice_matmul(moet_fast *f, worker *w, const chunks *ch, const uint16_t *act,
			moet_fast_rows a, moet_fast_rows b, int64_t n_tok)
{
	const int64_t cols = a.n + b.n;
	for (int64_t c = 0; c < ch->nc; c++) {
		const int64_t kn = chunk_len(ch, c);
		prim *e;
		int rc = get_prim(f, w, n_tok, kn, cols, c > 0, &e);
		if (rc)
			return rc;
		moet_fast_pack(&e->lay, a, b, c * ch->kc, kn, w->panel, 1);
		if ((rc = matmul(w, e, act + c * ch->kc * n_tok, w->acc)))
			return rc;
	}
	return 0;
}

/* Phase 1 for rows i0 .. i0+p-1: g, u into acc, then h into hb. */
static int slice_gate_up(moet_fast *f, worker *w, const moet_mat *gate, const moet_mat *up,
			 const chunks *cx, const chunks *ch, int64_t i0, int64_t p, int64_t n_tok)
{
	int rc = slice_matmul(f, w, cx, f->xb, (moet_fast_rows){ gate, i0, p },
			      (moet_fast_rows){ up, i0, p }, n_tok);
	if (rc)
		return rc;
	const moet_cpu_kernels *k = moet_cpu_kernels_get();
	for (int64_t t = 0; t < n_tok; t++) {
		const float *g = w->acc + t * 2 * p, *u = g + p;
		k->silu_c(g, w->sil, p);
		for (int64_t i = 0; i < p; i++)
			w->sil[i] = w->sil[i] * u[i];
		for (int64_t i = 0; i < p;) { /* segments inside one K chunk of phase 2 */
			int64_t seg = ch->kc - (i0 + i) % ch->kc;
			seg = seg < p - i ? seg : p - i;
			moet_fast_to_bf16(w->sil + i, f->hb + chunk_at(ch, t, i0 + i), seg);
			i += seg;
		}
	}
	return 0;
}

/* Phase 2 for down rows j0 .. j0+p-1: y[:, j0 .. j0+p-1]. */
static int slice_down(moet_fast *f, worker *w, const moet_mat *down, const chunks *ch,
		      int64_t H, int64_t j0, int64_t p, int64_t n_tok, float *y)
{
	int rc = slice_matmul(f, w, ch, f->hb, (moet_fast_rows){ down, j0, p },
			      (moet_fast_rows){ NULL, 0, 0 }, n_tok);
	if (rc)
		return rc;
	for (int64_t t = 0; t < n_tok; t++)
		for (int64_t j = 0; j < p; j++)
			y[t * H + j0 + j] = moet_canon_nan(w->acc[t * p + j]);
	return 0;
}

/* First use of a worker on its own thread: stream and per-slice scratch. */
static int worker_init(moet_fast *f, worker *w)
{
	int rc = 0;
	if (!w->strm)
		DNNL_TRY(dnnl_stream_create(&w->strm, f->eng, dnnl_stream_default_flags),
			 "stream creation");
	if (!w->acc) {
		w->acc = alloc64((size_t)f->max_tok * f->acc_cols * sizeof(float));
		w->sil = alloc64((size_t)f->acc_cols * sizeof(float));
		if (!w->acc || !w->sil)
			rc = moet_err(MOET_ENOMEM, "fast expert mode: worker scratch");
	}
fail:
	return rc;
}

static void worker_fail(worker *w, int rc)
{
	if (rc && !w->rc) {
		w->rc = rc;
		snprintf(w->msg, sizeof(w->msg), "%s", moet_errmsg());
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
	const chunks cx = make_chunks(H, f->k_chunk, n_tok), ch = make_chunks(I, f->k_chunk, n_tok);
	int64_t ns1, s1, ns2, s2;
	slice_count(I, f->slice, nthr, &ns1, &s1);
	slice_count(H, f->slice_down, nthr, &ns2, &s2);
	if (2 * s1 > f->acc_cols || s2 > f->acc_cols)
		return moet_err(MOET_EINVAL, "fast expert mode: slices of %lld/%lld rows above "
				"the scratch's %lld", (long long)s1, (long long)s2,
				(long long)f->acc_cols);
	for (int t = 0; t < nthr; t++)
		f->w[t].rc = 0;

#pragma omp parallel num_threads(nthr)
	{
		worker *w = &f->w[omp_get_thread_num()];
		omp_set_num_threads(1); /* this thread's nested setting: oneDNN plans for one */
		worker_fail(w, worker_init(f, w));
#pragma omp for schedule(static)
		for (int64_t t = 0; t < n_tok; t++)
			for (int64_t c = 0; c < cx.nc; c++)
				moet_fast_to_bf16(x + t * H + c * cx.kc, f->xb + chunk_at(&cx, t,
						  c * cx.kc), chunk_len(&cx, c));
#pragma omp for schedule(static)
		for (int64_t j = 0; j < ns1; j++)
			if (!w->rc)
				worker_fail(w, slice_gate_up(f, w, gate, up, &cx, &ch, j * s1,
							     I - j * s1 < s1 ? I - j * s1 : s1,
							     n_tok));
#pragma omp for schedule(static)
		for (int64_t j = 0; j < ns2; j++)
			if (!w->rc)
				worker_fail(w, slice_down(f, w, down, &ch, H, j * s2,
							  H - j * s2 < s2 ? H - j * s2 : s2, n_tok,
							  y));
	}
	for (int t = 0; t < nthr; t++)
		if (f->w[t].rc)
			return moet_err(f->w[t].rc, "%s", f->w[t].msg);
	return 0;
}

#endif
