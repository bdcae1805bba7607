/*
 * bench_gpu.c: `moet-hybrid bench gpu-experts`: the CUDA contract expert kernel against the
 * device's own ceilings, all measured in one process (docs/benchmarks.md):
 *
 *   1. copy_GBps     cudaMemcpy device-to-device of 1 GiB, bytes read + written per second
 *   2. sgemm_GFLOPs  cuBLAS SGEMM, CUBLAS_PEDANTIC_MATH (TF32 off), m 7168 x k 2048 x n for
 *                    n = 256 and 4096; the ceiling is the faster of the two (both recorded)
 *   3. expert        one grouped call of moet_gpu_expert_ffn: 8 experts at the Kimi-K2
 *                    geometry, T tokens each (each pair its own token), for T in 1 .. 1024;
 *                    calls rotate over a pool of experts far larger than L2, each call timed
 *                    alone with CUDA events
 *   4. expert-fast   after each expert row: the same calls in fast mode (bf16 tensor cores,
 *                    moet_gpu_expert_ffn_fast with min_tok 1, so every expert takes the
 *                    tensor-core path; docs/fast-mode.md); its ceiling is "expert", the exact
 *                    row just measured, and ratio = exact median / fast median
 *   5. expert-pdl    after the 1-token expert row: the same calls with the down pass launched
 *                    as a programmatic dependent of the gate_up pass (MOET_GPU_PDL=1; docs/
 *                    gpu.md); the 1-token expert row is then measured with MOET_GPU_PDL=0,
 *                    whatever the environment says (other rows follow it); both rows on a
 *                    non-blocking stream of their own (the others: the legacy default stream,
 *                    as before). Same ceiling and ratio as an expert row; "pdl" says whether
 *                    the device took it (sm_90+) or fell back, "vs_off" = the expert row's
 *                    median / this row's median
 *   6. decode-step   with --model-dir: the whole model's decode step at batch 1, 16, 64
 *                    (bench_gpu_decode.c)
 *
 * Each expert row's ceiling is its roofline bound: bytes (weight codes + scales of the call's
 * experts) / copy_GBps against flops (2 x 3 x H x I per token per expert) / sgemm_GFLOPs,
 * whichever takes longer; ratio = achieved rate / that ceiling.
 *
 * Pool layout: [codes of expert 0 .. E-1: gate I x H | up I x H | down H x I, each 256-byte
 * aligned][scales of expert 0 .. E-1: gate | up | down, F32 128x128 blocks]. Codes are random
 * bytes with the lowest bit cleared (no e4m3 NaN codes), scales random in [2^-12, 2^-8],
 * activations random in [-1, 1).
 */
#include <stdlib.h>
#include <string.h>

#include "bench_gpu_int.h"
#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_gpu_host.h"

#define COPY_BYTES ((size_t)1 << 30)

typedef struct gbench {
	const moet_bench_gpu_opts *o;
	int reps, warm, G, E;
	int64_t H, I, t_max;
	size_t codes_bytes, sc_floats, expert_bytes; /* per expert */
	size_t off[3], sc_off[3];                    /* within an expert's codes / scales */
	uint8_t *codes;                              /* device [E][codes_bytes] */
	float *scales;                               /* device [E][sc_floats] */
	float *x, *y;                                /* device [G t_max][H] */
	int32_t *tok;                                /* device [G t_max]: 0, 1, 2, ... */
	void *scratch;
	size_t scratch_bytes;
	moet_gpu_fast *fast;                         /* fast mode: cuBLAS handle */
	void *fscratch;                              /* fast mode's scratch */
	size_t fscratch_bytes;
	moet_gpu_timer *timer;
	void *stream;                                /* the calls' stream: NULL (legacy default)
						      * or pdl_rows' own */
	double *samples;
	int next_e;
	moet_gpu_info info;
} gbench;

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

static int ceilings(gbench *b, moet_bench_ceil *c, json_t *rec, FILE *log)
{
	static const int64_t sg_n[2] = { 256, 4096 };
	const int64_t sg_m = 7168, sg_k = 2048;
	moet_bench_stats st, sg[2];
	int rc;
	fprintf(log, "gpu-experts: device copy of %.0f MiB ...\n", (double)COPY_BYTES / (1 << 20));
	if ((rc = moet_gpu_bench_copy(COPY_BYTES, b->reps, b->samples)))
		return rc;
	moet_bench_stats_of(b->samples, b->reps, &st);
	c->copy_Bps = 2.0 * (double)COPY_BYTES / st.median_s;
	c->sgemm_flops = 0;
	for (int i = 0; i < 2; i++) {
		fprintf(log, "gpu-experts: cuBLAS SGEMM %lld x %lld x %lld (TF32 off) ...\n",
			(long long)sg_m, (long long)sg_k, (long long)sg_n[i]);
		if ((rc = moet_gpu_bench_sgemm(sg_m, sg_n[i], sg_k, b->reps, b->samples)))
			return rc;
		moet_bench_stats_of(b->samples, b->reps, &sg[i]);
		double f = 2.0 * (double)(sg_m * sg_n[i] * sg_k) / sg[i].median_s;
		c->sgemm_n[i] = sg_n[i];
		c->sgemm_at[i] = f;
		if (f > c->sgemm_flops)
			c->sgemm_flops = f;
	}
	if ((rc = moet_bench_add_ceiling(rec, "copy_GBps", c->copy_Bps / 1e9, "GB/s")) ||
	    (rc = moet_bench_add_ceiling(rec, "sgemm_GFLOPs", c->sgemm_flops / 1e9, "GFLOP/s")))
		return rc;
	json_t *cj = json_object_get(rec, "ceilings");
	json_object_set_new(json_object_get(cj, "copy_GBps"), "detail", json_pack(
		"{s:s, s:I, s:f, s:f, s:f, s:i}", "what", "cudaMemcpy device-to-device, bytes "
		"read + written", "bytes", (json_int_t)COPY_BYTES, "median_s", st.median_s,
		"min_s", st.min_s, "max_s", st.max_s, "reps", st.reps));
	json_t *shapes = json_array();
	for (int i = 0; i < 2; i++)
		json_array_append_new(shapes, json_pack("{s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "m",
			(json_int_t)sg_m, "k", (json_int_t)sg_k, "n", (json_int_t)sg_n[i],
			"GFLOPs", c->sgemm_at[i] / 1e9, "median_s", sg[i].median_s, "min_s",
			sg[i].min_s, "max_s", sg[i].max_s));
	json_object_set_new(json_object_get(cj, "sgemm_GFLOPs"), "detail", json_pack(
		"{s:s, s:s, s:o}", "what", "cublasSgemm, the faster of the shapes",
		"math_mode", "CUBLAS_PEDANTIC_MATH (no TF32)", "shapes", shapes));
	return 0;
}

static moet_mat mat_of(const gbench *b, int e, int which)
{
	const int64_t rows = which == 2 ? b->H : b->I, cols = which == 2 ? b->I : b->H;
	return (moet_mat){ .dtype = MOET_DT_F8_E4M3, .rows = rows, .cols = cols,
			   .data = b->codes + (size_t)e * b->codes_bytes + b->off[which],
			   .scale_inv = b->scales + (size_t)e * b->sc_floats + b->sc_off[which] };
}

/* One grouped call of G experts (next in the rotation), T tokens each; exact or fast mode. */
static int run_call(gbench *b, int64_t T, int fast)
{
	moet_gpu_expert ex[64];
	for (int j = 0; j < b->G; j++) {
		int e = b->next_e;
		b->next_e = (b->next_e + 1) % b->E;
		ex[j] = (moet_gpu_expert){ .gate = mat_of(b, e, 0), .up = mat_of(b, e, 1),
					   .down = mat_of(b, e, 2), .n_tok = T };
	}
	const int64_t n = (int64_t)b->G * T;
	if (fast)
		return moet_gpu_expert_ffn_fast(b->fast, ex, b->G, b->x, n, b->tok, 1, b->fscratch,
						b->fscratch_bytes, b->y, NULL);
	return moet_gpu_expert_ffn(ex, b->G, b->x, n, b->tok, b->scratch, b->scratch_bytes, b->y,
				   b->stream);
}

/* Times reps calls (after warm-up ones), each alone with CUDA events. */
static int time_calls(gbench *b, int64_t T, int fast, moet_bench_stats *st)
{
	int rc = 0;
	for (int i = 0; i < b->warm && !rc; i++)
		rc = run_call(b, T, fast);
	if (!rc)
		rc = moet_gpu_sync(b->stream);
	for (int i = 0; i < b->reps && !rc; i++) {
		if (!(rc = moet_gpu_timer_start(b->timer, b->stream)) &&
		    !(rc = run_call(b, T, fast)))
			rc = moet_gpu_timer_stop(b->timer, b->stream, &b->samples[i]);
	}
	if (!rc)
		moet_bench_stats_of(b->samples, b->reps, st);
	return rc;
}

/* The fast-mode row for T tokens, against the exact row `exact` of the same run. */
static int fast_row(gbench *b, int64_t T, const moet_bench_row_out *exact, json_t *rec,
		    FILE *log, moet_bench_row_out *out)
{
	moet_bench_stats st;
	fprintf(log, "gpu-experts: expert-fast, %d experts x %lld token(s) ...\n", b->G,
		(long long)T);
	int rc = time_calls(b, T, 1, &st);
	if (rc)
		return rc;
	snprintf(out->name, sizeof(out->name), "expert-fast");
	out->r = (moet_bench_row){ .name = out->name, .tokens = T, .st = st,
				   .bytes = exact->r.bytes, .flops = exact->r.flops,
				   .ceiling = "expert", .ratio = exact->r.st.median_s / st.median_s };
	return moet_bench_add_row(rec, &out->r);
}

static int expert_row(gbench *b, const moet_bench_ceil *c, int64_t T, const char *name,
		      json_t *rec, FILE *log, moet_bench_row_out *out)
{
	moet_bench_stats st;
	fprintf(log, "gpu-experts: %s, %d experts x %lld token(s) ...\n", name, b->G,
		(long long)T);
	int rc = time_calls(b, T, 0, &st);
	if (rc)
		return rc;
	const double bytes = (double)b->G * (double)b->expert_bytes;
	const double flops = (double)b->G * 6.0 * (double)b->H * (double)b->I * (double)T;
	const int bw = bytes / c->copy_Bps >= flops / c->sgemm_flops;
	snprintf(out->name, sizeof(out->name), "%s", name);
	out->r = (moet_bench_row){ .name = out->name, .tokens = T, .st = st, .bytes = bytes,
				   .flops = flops, .ceiling = bw ? "copy_GBps" : "sgemm_GFLOPs",
				   .ratio = bw ? bytes / st.median_s / c->copy_Bps
					       : flops / st.median_s / c->sgemm_flops };
	return moet_bench_add_row(rec, &out->r);
}

/*
 * The 1-token rows: "expert" with MOET_GPU_PDL=0, then "expert-pdl" with MOET_GPU_PDL=1, the
 * caller's value put back afterwards; both on a stream of their own (non-blocking), as the
 * engine's calls are, not on the legacy default stream. NOTE: setenv is safe here: the kernel
 * part runs on this thread alone, and the expert call reads the switch at every call.
 */
static int pdl_rows(gbench *b, const moet_bench_ceil *c, json_t *rec, FILE *log,
		    moet_bench_row_out *out, int *n_rows)
{
	const char *env = getenv("MOET_GPU_PDL");
	char *saved = env ? strdup(env) : NULL;
	if (env && !saved)
		return moet_err(MOET_ENOMEM, "MOET_GPU_PDL");
	int rc = moet_gpu_stream_create(&b->stream);
	if (rc) {
		free(saved);
		return rc;
	}
	setenv("MOET_GPU_PDL", "0", 1);
	rc = expert_row(b, c, 1, "expert", rec, log, &out[0]);
	if (!rc)
		(*n_rows)++;
	setenv("MOET_GPU_PDL", "1", 1);
	if (!rc && !(rc = expert_row(b, c, 1, "expert-pdl", rec, log, &out[1]))) {
		(*n_rows)++;
		json_t *res = json_object_get(rec, "results");
		json_t *row = json_array_get(res, json_array_size(res) - 1);
		json_object_set_new(row, "pdl", json_string(b->info.cc_major >= 9 ? "on"
						: "fallback (below sm_90: plain launches)"));
		json_object_set_new(row, "vs_off", json_real(out[0].r.st.median_s /
							     out[1].r.st.median_s));
	}
	if (saved)
		setenv("MOET_GPU_PDL", saved, 1);
	else
		unsetenv("MOET_GPU_PDL");
	free(saved);
	int rs = moet_gpu_sync(b->stream);
	moet_gpu_stream_destroy(b->stream);
	b->stream = NULL;
	return rc ? rc : rs;
}

static int setup(gbench *b, const moet_bench_gpu_opts *o, int64_t t_max)
{
	int rc;
	b->o = o;
	b->H = o->hidden ? o->hidden : 7168;
	b->I = o->inter ? o->inter : 2048;
	b->G = o->group ? o->group : 8;
	b->reps = o->reps ? o->reps : (o->quick ? 3 : 10);
	b->warm = o->quick ? 1 : 2;
	b->t_max = t_max;
	if (b->H < 1 || b->I < 1 || b->H > (1 << 20) || b->I > (1 << 20) || b->G < 1 ||
	    b->G > 64)
		return moet_err(MOET_EINVAL, "gpu-experts: geometry %lldx%lld or %d experts per "
				"call out of range", (long long)b->H, (long long)b->I, b->G);
	if (!(b->samples = calloc((size_t)b->reps, sizeof(double))))
		return moet_err(MOET_ENOMEM, "samples");
	if ((rc = moet_gpu_info_get(&b->info)) || (rc = moet_gpu_timer_create(&b->timer)))
		return rc;
	const size_t w = (size_t)(b->H * b->I);
	const size_t sc = (size_t)(((b->I + 127) / 128) * ((b->H + 127) / 128));
	b->off[0] = 0;
	b->off[1] = up256(w);
	b->off[2] = 2 * up256(w);
	b->codes_bytes = 3 * up256(w);
	b->sc_off[0] = 0;
	b->sc_off[1] = up256(sc * 4) / 4;
	b->sc_off[2] = 2 * up256(sc * 4) / 4;
	b->sc_floats = 3 * up256(sc * 4) / 4;
	b->expert_bytes = 3 * (w + sc * sizeof(float));
	/* rotation: a call reads G experts; consecutive calls must not find the previous ones
	 * in L2, so the pool holds >= 4 x L2 besides the call's own and >= 64 experts (16 with
	 * --quick), within a quarter of the device's memory */
	b->E = o->rotate;
	if (!b->E) {
		size_t need = 4 * b->info.l2_bytes / b->expert_bytes + (size_t)b->G;
		size_t floor_e = o->quick ? 16 : 64;
		b->E = (int)(need > floor_e ? (need < 65536 ? need : 65536) : floor_e);
		while (b->E > b->G && (size_t)b->E * (b->codes_bytes + 4 * b->sc_floats) >
					       b->info.mem_bytes / 4)
			b->E--;
	}
	const size_t n_x = (size_t)b->G * (size_t)t_max;
	b->scratch_bytes = moet_gpu_expert_scratch_bytes((int64_t)n_x, b->I);
	b->fscratch_bytes = moet_gpu_expert_fast_scratch_bytes((int64_t)n_x, b->I, b->H);
	int32_t *iota = malloc(n_x * sizeof(int32_t));
	if (!iota)
		return moet_err(MOET_ENOMEM, "token indices");
	for (size_t i = 0; i < n_x; i++)
		iota[i] = (int32_t)i;
	if ((rc = moet_gpu_alloc((size_t)b->E * b->codes_bytes, (void **)&b->codes)) ||
	    (rc = moet_gpu_alloc((size_t)b->E * b->sc_floats * 4, (void **)&b->scales)) ||
	    (rc = moet_gpu_alloc(n_x * (size_t)b->H * 4, (void **)&b->x)) ||
	    (rc = moet_gpu_alloc(n_x * (size_t)b->H * 4, (void **)&b->y)) ||
	    (rc = moet_gpu_alloc(n_x * 4, (void **)&b->tok)) ||
	    (rc = moet_gpu_alloc(b->scratch_bytes, &b->scratch)) ||
	    (rc = moet_gpu_alloc(b->fscratch_bytes, &b->fscratch)) ||
	    (rc = moet_gpu_fast_create(&b->fast)) ||
	    (rc = moet_gpu_bench_fill_bytes(b->codes, (size_t)b->E * b->codes_bytes, 11, 0xFE,
					    NULL)) ||
	    (rc = moet_gpu_bench_fill_f32(b->scales, (size_t)b->E * b->sc_floats, 12, 0x1p-12f,
					  0x1p-8f, NULL)) ||
	    (rc = moet_gpu_bench_fill_f32(b->x, n_x * (size_t)b->H, 13, -1.0f, 1.0f, NULL)) ||
	    (rc = moet_gpu_copy_h2d(b->tok, iota, n_x * 4)) || (rc = moet_gpu_sync(NULL)))
		rc = moet_err_prefix(rc, "gpu-experts: a pool of %d experts (%.0f MB) and %zu "
				     "token rows", b->E, (double)b->E * b->expert_bytes / 1e6,
				     n_x);
	free(iota);
	return rc;
}

static void teardown(gbench *b)
{
	moet_gpu_free(b->codes);
	moet_gpu_free(b->scales);
	moet_gpu_free(b->x);
	moet_gpu_free(b->y);
	moet_gpu_free(b->tok);
	moet_gpu_free(b->scratch);
	moet_gpu_free(b->fscratch);
	moet_gpu_fast_destroy(b->fast);
	moet_gpu_timer_destroy(b->timer);
	free(b->samples);
}

static void print_table(const gbench *b, const moet_bench_ceil *c, const moet_bench_row_out *rows,
			int n, FILE *f)
{
	if (!c->no_kernel) {
		fprintf(f, "\ngpu-experts: %s (sm_%d%d, %d SMs, %.0f MB L2), %d experts of %lldx%lld "
			"F8_E4M3 (%.1f MB) per call, %d experts rotated (%.0f MB)%s\n",
			b->info.name, b->info.cc_major, b->info.cc_minor, b->info.sm_count,
			(double)b->info.l2_bytes / 1e6, b->G, (long long)b->H, (long long)b->I,
			(double)b->expert_bytes / 1e6, b->E, (double)b->E * b->expert_bytes / 1e6,
			b->o->quick ? ", --quick" : "");
		fprintf(f, "ceilings: copy %.0f GB/s (read + written), SGEMM (TF32 off) %.0f GFLOP/s "
			"(n=%lld: %.0f, n=%lld: %.0f)\n", c->copy_Bps / 1e9, c->sgemm_flops / 1e9,
			(long long)c->sgemm_n[0], c->sgemm_at[0] / 1e9, (long long)c->sgemm_n[1],
			c->sgemm_at[1] / 1e9);
		fprintf(f, "expert-fast: bf16 tensor cores (cuBLAS, fp32 accumulation; not "
			"bit-identical), ratio = exact median / fast median\n");
		fprintf(f, "expert-pdl: 1 token, the down pass a programmatic dependent of gate_up "
			"(MOET_GPU_PDL=1%s); the 1-token expert row: MOET_GPU_PDL=0\n",
			b->info.cc_major >= 9 ? "" : "; below sm_90: plain launches");
	}
	moet_bench_gpu_print_rows(rows, n, f);
}

int moet_bench_gpu_experts(const moet_bench_gpu_opts *o, json_t *rec, FILE *log, FILE *table)
{
	static const int64_t full[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024 };
	static const int64_t quick[] = { 1, 8, 64, 256 };
	const int64_t *tok = o->tokens ? o->tokens : o->quick ? quick : full;
	const int n_tok = o->no_kernel ? 0 : o->tokens ? o->n_tokens : o->quick ? 4 : 10;
	const char *dev = o->decode_device ? o->decode_device : "cuda";
	const char *why = NULL;
	int64_t t_max = 1;
	for (int i = 0; i < n_tok; i++) {
		if (tok[i] < 1 || tok[i] > (1 << 20))
			return moet_err(MOET_EINVAL, "gpu-experts: token count %lld (want 1 .. "
					"1048576)", (long long)tok[i]);
		t_max = tok[i] > t_max ? tok[i] : t_max;
	}
	if ((!o->no_kernel || (o->model_dir && !strcmp(dev, "cuda"))) && moet_gpu_count(&why) < 1)
		return moet_err(MOET_EUNSUP, "no CUDA device (%s): this bench needs a GPU",
				why ? why : "none found");
	gbench b;
	moet_bench_ceil c;
	memset(&b, 0, sizeof(b));
	memset(&c, 0, sizeof(c));
	c.no_kernel = o->no_kernel;
	const int n_dec = o->model_dir ? (o->batches ? o->n_batches : 3) : 0;
	moet_bench_row_out *rows = calloc((size_t)(3 * n_tok + n_dec) + 1, sizeof(*rows));
	int rc = rows ? 0 : moet_err(MOET_ENOMEM, "rows"), n_rows = 0;
	if (!rc && !o->no_kernel && !(rc = setup(&b, o, t_max)))
		rc = ceilings(&b, &c, rec, log);
	for (int i = 0; !rc && i < n_tok; i++) {
		const int ex = n_rows; /* the expert row, fast_row's reference */
		if (tok[i] == 1)
			rc = pdl_rows(&b, &c, rec, log, &rows[n_rows], &n_rows);
		else if (!(rc = expert_row(&b, &c, tok[i], "expert", rec, log, &rows[n_rows])))
			n_rows++;
		if (!rc && !(rc = fast_row(&b, tok[i], &rows[ex], rec, log, &rows[n_rows])))
			n_rows++;
	}
	if (!rc && !o->no_kernel) {
		char cc[32];
		snprintf(cc, sizeof(cc), "%d.%d", b.info.cc_major, b.info.cc_minor);
		json_object_set_new(json_object_get(rec, "machine"), "gpu", json_pack(
			"{s:s, s:s, s:i, s:I, s:I, s:i, s:i, s:i}", "name", b.info.name,
			"compute_capability", cc, "sm_count", b.info.sm_count, "mem_bytes",
			(json_int_t)b.info.mem_bytes, "l2_bytes", (json_int_t)b.info.l2_bytes,
			"driver_version", b.info.driver_version, "cuda_runtime_version", b.info.runtime_version,
			"cublas_version", b.info.cublas_version));
		json_object_set_new(rec, "geometry", json_pack(
			"{s:I, s:I, s:s, s:i, s:I, s:i, s:i, s:I, s:s}", "hidden", (json_int_t)b.H,
			"moe_intermediate", (json_int_t)b.I, "dtype", "F8_E4M3", "block", 128,
			"expert_bytes", (json_int_t)b.expert_bytes, "experts_per_call", b.G,
			"experts_rotated", b.E, "rotated_bytes",
			(json_int_t)((size_t)b.E * b.expert_bytes), "timing",
			"CUDA events around each grouped call"));
	}
	teardown(&b);
	if (!rc && o->model_dir)
		rc = moet_bench_gpu_decode(o, &c, rec, log, rows + n_rows, &n_rows);
	if (!rc) {
		json_object_set_new(rec, "numerics", json_string(o->no_kernel ? "exact"
									   : "exact, fast"));
		json_object_set_new(rec, "quick", json_boolean(o->quick));
		print_table(&b, &c, rows, n_rows, table);
	}
	free(rows);
	return rc;
}
