/*
 * bench_cpu.c: `moet-hybrid bench cpu-experts`: the CPU expert tier against its own ceilings,
 * all measured in one process on the same executor threads (docs/benchmarks.md).
 *
 *   1. read_GBps   every worker streams a disjoint part of a buffer of max(4 x L3, 256 MB)
 *                  (first-touched by the same worker, so its pages sit on the worker's node)
 *   2. fma_GFLOPs  every worker runs register-only FMA chains (moet_bench_fma)
 *   3. expert      one expert per batch, T tokens, through moet_cpuexec, experts rotated over
 *                  a pool of >= 4 x L3 so that every batch streams its weights from DRAM
 *   4. decode-8x1  a batch of 8 experts with 1 token each (one MoE layer of decode), back to
 *                  back, rotating through the same pool
 *
 * Each row's ceiling is the roofline bound it runs into: bytes / read_GBps against
 * flops / fma_GFLOPs, whichever takes longer; ratio = achieved rate / that ceiling.
 * With --fast, each expert row is followed by expert-fast: the same batches through fast mode
 * (moet_fast.h, oneDNN bf16 on an OpenMP team of as many threads, not pinned), whose peer is
 * the exact row just measured: ceiling "expert", ratio = exact median / fast median.
 *
 * Pool layout (one expert, 64-byte aligned parts, stride rounded to 4 KiB):
 *   [gate I x H e4m3][up I x H e4m3][down H x I e4m3][gate scales][up scales][down scales]
 * Weight bytes are random e4m3 codes with the lowest bit cleared (no 0x7F/0xFF NaN codes);
 * scales are random in [2^-12, 2^-8]; activations random in [-1, 1].
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "moet_bench.h"
#include "moet_cpu.h"
#include "moet_cpuexec.h"
#include "moet_err.h"
#include "moet_fast.h"

#define MB (1024.0 * 1024.0)

typedef struct bench {
	const moet_bench_cpu_opts *o;
	moet_cpuexec *ex;
	moet_fast *fast; /* --fast only */
	int n_thr, reps, warm;
	int64_t H, I;
	size_t off[6], stride, expert_bytes; /* part offsets in an expert; bytes it reads */
	int E;
	uint8_t *pool;
	size_t pool_bytes;
	float *x, *y;
	uint8_t *rbuf;
	size_t rbuf_bytes;
	uint64_t sink[1024];
	int64_t fma_iters;
	double read_Bps, fma_flops;
	double *samples;
	int next_e;
} bench;

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

static void *big_alloc(size_t bytes)
{
	size_t n = (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
	void *p = aligned_alloc((size_t)2 << 20, n);
	if (p)
		madvise(p, n, MADV_HUGEPAGE); /* a hint: fewer TLB misses when streaming */
	return p;
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Worker w fills its share of the expert pool (first touch) with random non-NaN codes. */
static void fill_pool(void *arg, int w, int nw)
{
	bench *b = arg;
	size_t lo, hi;
	moet_bench_share(b->pool_bytes, w, nw, &lo, &hi);
	uint64_t s = 0x9E3779B97F4A7C15ull ^ ((uint64_t)w << 32);
	for (size_t i = lo; i + 8 <= hi; i += 8) {
		uint64_t v = xorshift(&s) & 0xFEFEFEFEFEFEFEFEull; /* no e4m3 NaN codes */
		memcpy(b->pool + i, &v, 8);
	}
}

static void fma_part(void *arg, int w, int nw)
{
	bench *b = arg;
	(void)nw;
	b->sink[w % 1024] += (uint64_t)moet_bench_fma(b->fma_iters);
}

static moet_mat expert_mat(const bench *b, int e, int which)
{
	const uint8_t *base = b->pool + (size_t)e * b->stride;
	const int64_t rows = which == 2 ? b->H : b->I, cols = which == 2 ? b->I : b->H;
	return (moet_mat){ .dtype = MOET_DT_F8_E4M3, .rows = rows, .cols = cols,
			   .data = base + b->off[which],
			   .scale_inv = (const float *)(base + b->off[3 + which]) };
}

/* Times n_rep runs of fn (after b->warm warm-ups); fills st. */
static int time_runs(bench *b, int (*fn)(bench *, void *), void *arg, moet_bench_stats *st)
{
	int rc = 0;
	for (int i = 0; i < b->warm && !rc; i++)
		rc = fn(b, arg);
	double start = moet_bench_now_s();
	int n = 0;
	const double budget = b->o->max_row_s > 0 ? b->o->max_row_s : 30.0;
	while (!rc && n < b->reps) {
		double t0 = moet_bench_now_s();
		rc = fn(b, arg);
		b->samples[n++] = moet_bench_now_s() - t0;
		if (n >= 3 && moet_bench_now_s() - start > budget)
			break;
	}
	if (!rc)
		moet_bench_stats_of(b->samples, n, st);
	return rc;
}

static int run_read(bench *b, void *arg)
{
	(void)arg;
	return moet_bench_read_par(b->ex, b->rbuf, b->rbuf_bytes);
}

static int run_fma(bench *b, void *arg)
{
	(void)arg;
	return moet_cpuexec_run(b->ex, fma_part, b);
}

/* One batch: n_exp experts (rotating), T tokens each. */
static int run_experts(bench *b, void *arg)
{
	const int64_t *spec = arg; /* { n_exp, T } */
	moet_cpuexec_job jobs[8];
	for (int j = 0; j < spec[0]; j++) {
		int e = b->next_e;
		b->next_e = (b->next_e + 1) % b->E;
		jobs[j] = (moet_cpuexec_job){ .gate = expert_mat(b, e, 0), .up = expert_mat(b, e, 1),
					      .down = expert_mat(b, e, 2),
					      .x = b->x + (size_t)(j * spec[1] * b->H),
					      .y = b->y + (size_t)(j * spec[1] * b->H),
					      .n_tok = spec[1] };
	}
	uint64_t tk;
	int rc = moet_cpuexec_submit(b->ex, jobs, (int)spec[0], &tk);
	return rc ? rc : moet_cpuexec_wait(b->ex, tk);
}

/* One fast-mode call: one expert (rotating), T tokens. */
static int run_fast(bench *b, void *arg)
{
	const int64_t T = *(const int64_t *)arg;
	const int e = b->next_e;
	b->next_e = (b->next_e + 1) % b->E;
	moet_mat g = expert_mat(b, e, 0), u = expert_mat(b, e, 1), d = expert_mat(b, e, 2);
	return moet_fast_expert_ffn(b->fast, &g, &u, &d, b->x, T, b->y);
}

static int ceilings(bench *b, json_t *rec, FILE *log)
{
	moet_bench_stats st;
	int rc;
	fprintf(log, "cpu-experts: read bandwidth over %.0f MB ...\n", (double)b->rbuf_bytes / MB);
	if ((rc = moet_bench_touch_par(b->ex, b->rbuf, b->rbuf_bytes)) ||
	    (rc = time_runs(b, run_read, NULL, &st)))
		return rc;
	b->read_Bps = (double)b->rbuf_bytes / st.median_s;
	/* FMA: size the run to about 50 ms (20 ms with --quick) from a short probe */
	b->fma_iters = 1 << 14;
	double t0 = moet_bench_now_s();
	if ((rc = moet_cpuexec_run(b->ex, fma_part, b)))
		return rc;
	double probe = moet_bench_now_s() - t0;
	double want = b->o->quick ? 0.02 : 0.05;
	b->fma_iters = (int64_t)((double)b->fma_iters * want / (probe > 1e-6 ? probe : 1e-6));
	if (b->fma_iters < (1 << 14))
		b->fma_iters = 1 << 14;
	fprintf(log, "cpu-experts: FMA peak ...\n");
	if ((rc = time_runs(b, run_fma, NULL, &st)))
		return rc;
	double per_iter = moet_bench_fma(1); /* flops of one iteration, one worker */
	b->fma_flops = per_iter * (double)b->fma_iters * b->n_thr / st.median_s;
	if ((rc = moet_bench_add_ceiling(rec, "read_GBps", b->read_Bps / 1e9, "GB/s")) ||
	    (rc = moet_bench_add_ceiling(rec, "fma_GFLOPs", b->fma_flops / 1e9, "GFLOP/s")))
		return rc;
	json_t *c = json_object_get(rec, "ceilings");
	json_object_set_new(json_object_get(c, "read_GBps"), "buffer_bytes",
			    json_integer((json_int_t)b->rbuf_bytes));
	json_object_set_new(json_object_get(c, "read_GBps"), "isa",
			    json_string(moet_bench_ceil_isa()));
	json_object_set_new(json_object_get(c, "fma_GFLOPs"), "isa",
			    json_string(moet_bench_ceil_isa()));
	return 0;
}

typedef struct row_out {
	char name[32];
	moet_bench_row r;
} row_out;

/* Measures one row (n_exp experts of T tokens per batch) and adds it to rec. */
static int expert_row(bench *b, const char *name, int64_t n_exp, int64_t T, json_t *rec,
		      FILE *log, row_out *out)
{
	int64_t spec[2] = { n_exp, T };
	moet_bench_stats st;
	fprintf(log, "cpu-experts: %s, %lld token(s) per expert ...\n", name, (long long)T);
	int rc = time_runs(b, run_experts, spec, &st);
	if (rc)
		return rc;
	const double bytes = (double)n_exp * (double)b->expert_bytes;
	const double flops = (double)n_exp * 2.0 * 3.0 * (double)b->H * (double)b->I * (double)T;
	const int bw_bound = bytes / b->read_Bps >= flops / b->fma_flops;
	snprintf(out->name, sizeof(out->name), "%s", name);
	out->r = (moet_bench_row){ .name = out->name, .tokens = T, .st = st, .bytes = bytes,
				   .flops = flops, .ceiling = bw_bound ? "read_GBps" : "fma_GFLOPs",
				   .ratio = bw_bound ? bytes / st.median_s / b->read_Bps
						     : flops / st.median_s / b->fma_flops };
	return moet_bench_add_row(rec, &out->r);
}

/* The fast-mode row for T tokens, against the exact row `exact` of the same run. */
static int fast_row(bench *b, int64_t T, const row_out *exact, json_t *rec, FILE *log,
		    row_out *out)
{
	moet_bench_stats st;
	fprintf(log, "cpu-experts: expert-fast, %lld token(s) per expert ...\n", (long long)T);
	int rc = time_runs(b, run_fast, &T, &st);
	if (rc)
		return rc;
	snprintf(out->name, sizeof(out->name), "expert-fast");
	out->r = (moet_bench_row){ .name = out->name, .tokens = T, .st = st,
				   .bytes = exact->r.bytes, .flops = exact->r.flops,
				   .ceiling = "expert",
				   .ratio = exact->r.st.median_s / st.median_s };
	return moet_bench_add_row(rec, &out->r);
}

static void print_table(const bench *b, const row_out *rows, int n, FILE *f)
{
	fprintf(f, "\ncpu-experts: kernel %s, %d threads, split %s, expert %lldx%lld F8_E4M3 "
		"(%.1f MB), %d experts rotated (%.0f MB)%s\n",
		moet_cpuexec_kernels(b->ex)->isa, b->n_thr,
		b->o->split == MOET_CPUEXEC_SPLIT_EXPERTS ? "experts" : "rows", (long long)b->H,
		(long long)b->I, (double)b->expert_bytes / 1e6, b->E,
		(double)b->E * (double)b->expert_bytes / 1e6, b->o->quick ? ", --quick" : "");
	fprintf(f, "ceilings: read %.2f GB/s (%s loads, %.0f MB), FMA %.1f GFLOP/s (%s)\n",
		b->read_Bps / 1e9, moet_bench_ceil_isa(), (double)b->rbuf_bytes / MB,
		b->fma_flops / 1e9, moet_bench_ceil_isa());
	if (b->fast)
		fprintf(f, "expert-fast: oneDNN bf16 (%s), ratio = exact median / fast median\n",
			moet_fast_isa());
	fprintf(f, "%-12s %7s %11s %11s %11s %9s %10s %-11s %6s\n", "name", "tokens", "median_ms",
		"min_ms", "max_ms", "GB/s", "GFLOP/s", "ceiling", "ratio");
	for (int i = 0; i < n; i++) {
		const moet_bench_row *r = &rows[i].r;
		fprintf(f, "%-12s %7lld %11.3f %11.3f %11.3f %9.2f %10.2f %-11s %6.3f\n", r->name,
			(long long)r->tokens, 1e3 * r->st.median_s, 1e3 * r->st.min_s,
			1e3 * r->st.max_s, r->bytes / r->st.median_s / 1e9,
			r->flops / r->st.median_s / 1e9, r->ceiling, r->ratio);
	}
}

static int setup(bench *b, const moet_bench_cpu_opts *o, int64_t t_max)
{
	b->o = o;
	b->H = o->hidden ? o->hidden : 7168;
	b->I = o->inter ? o->inter : 2048;
	b->reps = o->reps ? o->reps : (o->quick ? 3 : 10);
	b->warm = o->quick ? 1 : 2;
	if (b->H < 1 || b->I < 1 || b->reps < 1 || b->H > (1 << 20) || b->I > (1 << 20))
		return moet_err(MOET_EINVAL, "cpu-experts: geometry %lldx%lld or %d reps out of "
				"range", (long long)b->H, (long long)b->I, b->reps);
	if (!(b->samples = calloc((size_t)b->reps, sizeof(double))))
		return moet_err(MOET_ENOMEM, "samples");
	moet_cpuexec_opts eo = { .node = o->node, .n_threads = o->n_threads,
				 .max_tok = t_max > 8 ? t_max : 8, .max_inter = b->I, .max_jobs = 8,
				 .split = o->split };
	int rc = moet_cpuexec_create(&eo, &b->ex);
	if (rc)
		return rc;
	b->n_thr = moet_cpuexec_n_threads(b->ex);
	if (o->fast && (rc = moet_fast_create(&(moet_fast_opts){ .max_tok = eo.max_tok,
					     .max_hidden = b->H, .max_inter = b->I,
					     .n_threads = b->n_thr }, &b->fast)))
		return rc;
	const size_t w = (size_t)(b->H * b->I);
	const size_t sc = (size_t)(((b->I + 127) / 128) * ((b->H + 127) / 128)) * sizeof(float);
	b->off[0] = 0;
	b->off[1] = up64(w);
	b->off[2] = b->off[1] + up64(w);
	b->off[3] = b->off[2] + up64(w);
	b->off[4] = b->off[3] + up64(sc);
	b->off[5] = b->off[4] + up64(sc);
	b->stride = (b->off[5] + up64(sc) + 4095) & ~(size_t)4095;
	b->expert_bytes = 3 * (w + sc);
	/* rotation: >= 4 x L3 and >= 16 experts (8 with --quick), within a quarter of RAM.
	 * NOTE: 4 x, not 2 x: Intel's L3 replacement is not LRU, and the 16-core host's 300 MB
	 * L3 can keep part of a 600 MB stream, for the ceiling and the rows alike; at 4 x its
	 * hits are negligible. (The run-to-run spread seen there, 100-155 GB/s, stayed at 4 x:
	 * it is the host's other load, so compare medians of runs side by side.) */
	const uint64_t l3 = moet_topo_l3_bytes(moet_cpuexec_topo(b->ex));
	const uint64_t ram = moet_topo_mem_bytes(moet_cpuexec_topo(b->ex));
	b->E = o->rotate;
	if (!b->E) {
		uint64_t need = (4 * l3 + b->stride - 1) / b->stride;
		b->E = o->quick ? 8 : (int)(need > 16 ? (need < 4096 ? need : 4096) : 16);
		while (ram && b->E > 8 && (uint64_t)b->E * b->stride > ram / 4)
			b->E--;
	}
	b->pool_bytes = (size_t)b->E * b->stride;
	b->rbuf_bytes = (size_t)(4 * l3 > (256u << 20) ? 4 * l3 : (256u << 20));
	size_t xn = (size_t)(eo.max_tok * b->H);
	b->pool = big_alloc(b->pool_bytes);
	b->rbuf = big_alloc(b->rbuf_bytes);
	b->x = malloc(xn * sizeof(float));
	b->y = malloc(xn * sizeof(float));
	if (!b->pool || !b->rbuf || !b->x || !b->y)
		return moet_err(MOET_ENOMEM, "cpu-experts: %d experts (%.0f MB) and a %.0f MB read "
				"buffer", b->E, (double)b->pool_bytes / MB,
				(double)b->rbuf_bytes / MB);
	if ((rc = moet_cpuexec_run(b->ex, fill_pool, b)))
		return rc;
	uint64_t s = 12345;
	for (int e = 0; e < b->E; e++)
		for (int k = 3; k < 6; k++) {
			float *scale = (float *)(b->pool + (size_t)e * b->stride + b->off[k]);
			for (size_t i = 0; i < sc / sizeof(float); i++)
				scale[i] = ldexpf(1.0f + (float)(xorshift(&s) >> 41) * 0x1p-23f,
						  -12 + (int)(xorshift(&s) % 4));
		}
	for (size_t i = 0; i < xn; i++)
		b->x[i] = (float)((int64_t)(xorshift(&s) >> 40) - (1 << 23)) * 0x1p-23f;
	return 0;
}

static void teardown(bench *b)
{
	moet_cpuexec_destroy(b->ex);
	moet_fast_destroy(b->fast);
	free(b->pool);
	free(b->rbuf);
	free(b->x);
	free(b->y);
	free(b->samples);
}

int moet_bench_cpu_experts(const moet_bench_cpu_opts *o, json_t *rec, FILE *log, FILE *table)
{
	static const int64_t full[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024 };
	static const int64_t quick[] = { 1, 8, 64, 256 };
	const int64_t *tok = o->tokens ? o->tokens : o->quick ? quick : full;
	const int n_tok = o->tokens ? o->n_tokens : o->quick ? 4 : 10;
	int64_t t_max = 1;
	for (int i = 0; i < n_tok; i++) {
		if (tok[i] < 1)
			return moet_err(MOET_EINVAL, "cpu-experts: token count %lld (want >= 1)",
					(long long)tok[i]);
		t_max = tok[i] > t_max ? tok[i] : t_max;
	}
	bench b;
	memset(&b, 0, sizeof(b));
	row_out *rows = calloc(2 * (size_t)n_tok + 1, sizeof(row_out));
	int rc = rows ? setup(&b, o, t_max) : moet_err(MOET_ENOMEM, "rows");
	if (!rc)
		rc = ceilings(&b, rec, log);
	int n_rows = 0;
	double last_s = 0;
	int64_t last_t = 0;
	for (int i = 0; !rc && i < n_tok; i++) {
		/* NOTE: --quick must end within a minute whatever the kernel (the scalar ref is
		 * ~100x slower): a row predicted to need more than 10 s (its warm-up and 3 reps,
		 * time linear in tokens from the previous row) is skipped and said so. */
		double pred = last_t ? last_s * (double)tok[i] / (double)last_t * (b.warm + 3) : 0;
		if (o->quick && pred > 10.0) {
			fprintf(log, "cpu-experts: --quick skips %lld tokens per expert (about %.0f s "
				"with kernel %s)\n", (long long)tok[i], pred,
				moet_cpuexec_kernels(b.ex)->isa);
			continue;
		}
		rc = expert_row(&b, "expert", 1, tok[i], rec, log, &rows[n_rows]);
		if (!rc) {
			last_s = rows[n_rows].r.st.median_s;
			last_t = tok[i];
			n_rows++;
		}
		if (!rc && b.fast) {
			rc = fast_row(&b, tok[i], &rows[n_rows - 1], rec, log, &rows[n_rows]);
			n_rows += !rc;
		}
	}
	if (!rc)
		rc = expert_row(&b, "decode-8x1", 8, 1, rec, log, &rows[n_rows++]);
	if (!rc) {
		json_t *cores = json_array();
		for (int w = 0; w < b.n_thr; w++)
			json_array_append_new(cores, json_integer(moet_topo_core_pu(
				moet_cpuexec_topo(b.ex), moet_cpuexec_worker_core(b.ex, w))));
		const char *isa = moet_cpuexec_kernels(b.ex)->isa;
		json_object_set_new(json_object_get(rec, "machine"), "kernel_variant",
				    json_string(isa));
		json_object_set_new(rec, "numerics", json_string(b.fast ? "exact, fast" : "exact"));
		if (b.fast)
			json_object_set_new(rec, "fast_isa", json_string(moet_fast_isa()));
		json_object_set_new(rec, "quick", json_boolean(o->quick));
		json_object_set_new(rec, "geometry", json_pack(
			"{s:I, s:I, s:s, s:i, s:I, s:i, s:I}", "hidden", (json_int_t)b.H,
			"moe_intermediate", (json_int_t)b.I, "dtype", "F8_E4M3", "block", 128,
			"expert_bytes", (json_int_t)b.expert_bytes, "experts_rotated", b.E,
			"rotated_bytes", (json_int_t)((size_t)b.E * b.expert_bytes)));
		json_object_set_new(rec, "executor", json_pack(
			"{s:i, s:i, s:s, s:o, s:s}", "threads", b.n_thr, "node", o->node, "split",
			o->split == MOET_CPUEXEC_SPLIT_EXPERTS ? "experts" : "rows", "worker_pus",
			cores, "kernel_variant", isa));
		print_table(&b, rows, n_rows, table);
	}
	teardown(&b);
	free(rows);
	return rc;
}
