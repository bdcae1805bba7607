/*
 * nocuda.c: the GPU entry points in a build without the CUDA toolkit.
 */
#include "moet_gpu.h"

#include "moet_err.h"

int moet_gpu_count(const char **out_why)
{
	if (out_why)
		*out_why = "built without CUDA";
	return 0;
}

void moet_gpu_set_thread_stream(void *stream)
{
	(void)stream;
}

void *moet_gpu_thread_stream(void)
{
	return NULL;
}

int moet_gpu_exp_c(const float *in, float *out, long long n)
{
	(void)in;
	(void)out;
	(void)n;
	return moet_err(MOET_EUNSUP, "exp_c on the GPU: this build has no CUDA");
}

static int no_cuda(const char *what)
{
	return moet_err(MOET_EUNSUP, "%s: this build has no CUDA", what);
}

uint64_t moet_gpu_mem_epoch(void)
{
	return 0;
}

int moet_gpu_capture_begin(void *stream)
{
	(void)stream;
	return no_cuda("moet_gpu_capture_begin");
}

int moet_gpu_capture_end(void *stream, void **out_exec)
{
	(void)stream;
	*out_exec = NULL;
	return no_cuda("moet_gpu_capture_end");
}

int moet_gpu_graph_launch(void *exec, void *stream)
{
	(void)exec;
	(void)stream;
	return no_cuda("moet_gpu_graph_launch");
}

void moet_gpu_graph_destroy(void *exec)
{
	(void)exec;
}

int moet_gpu_alloc(size_t bytes, void **out_ptr)
{
	(void)bytes;
	if (out_ptr)
		*out_ptr = NULL;
	return no_cuda("moet_gpu_alloc");
}

void moet_gpu_free(void *ptr)
{
	(void)ptr;
}

int moet_gpu_copy_h2d(void *dst, const void *src, size_t bytes)
{
	(void)dst;
	(void)src;
	(void)bytes;
	return no_cuda("moet_gpu_copy_h2d");
}

int moet_gpu_copy_d2h(void *dst, const void *src, size_t bytes)
{
	(void)dst;
	(void)src;
	(void)bytes;
	return no_cuda("moet_gpu_copy_d2h");
}

int moet_gpu_copy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
	(void)dst;
	(void)src;
	(void)bytes;
	(void)stream;
	return no_cuda("moet_gpu_copy_d2d");
}

int moet_gpu_sync(void *stream)
{
	(void)stream;
	return no_cuda("moet_gpu_sync");
}

size_t moet_gpu_expert_scratch_bytes(int64_t n_pairs, int64_t inter)
{
	if (n_pairs <= 0 || inter <= 0)
		return 0;
	return (size_t)n_pairs * (size_t)((inter + 3) / 4 * 4) * sizeof(float);
}

int moet_gpu_expert_ffn(const moet_gpu_expert *exps, int64_t n_exp, const float *x, int64_t n_x,
			const int32_t *tok, void *scratch, size_t scratch_bytes, float *y,
			void *stream)
{
	(void)exps;
	(void)n_exp;
	(void)x;
	(void)n_x;
	(void)tok;
	(void)scratch;
	(void)scratch_bytes;
	(void)y;
	(void)stream;
	return no_cuda("moet_gpu_expert_ffn");
}

int moet_gpu_gate_up(const moet_mat *gate, const moet_mat *up, const float *x, int64_t x_stride,
		     int64_t n, const int32_t *tok, float *h, int64_t h_stride, void *stream)
{
	(void)gate, (void)up, (void)x, (void)x_stride, (void)n, (void)tok, (void)h, (void)h_stride,
		(void)stream;
	return no_cuda("moet_gpu_gate_up");
}

/* ---- The dense path: every op answers MOET_EUNSUP. ---- */

int moet_gpu_linear(const moet_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
		    int64_t y_stride, void *stream)
{
	(void)w, (void)x, (void)x_stride, (void)n_tok, (void)y, (void)y_stride, (void)stream;
	return no_cuda("moet_gpu_linear");
}

uint64_t moet_gpu_linear_ks_calls(void)
{
	return 0;
}

uint64_t moet_gpu_linear_tall_calls(void)
{
	return 0;
}

int moet_gpu_ffn_ks(const moet_mat *gate, const moet_mat *up, const moet_mat *down,
		    const float *x, int64_t x_stride, int64_t n_tok, float *scratch,
		    size_t scratch_bytes, float *out, int64_t out_stride, void *stream,
		    int *out_taken)
{
	(void)gate, (void)up, (void)down, (void)x, (void)x_stride, (void)n_tok, (void)scratch;
	(void)scratch_bytes, (void)out, (void)out_stride, (void)stream;
	*out_taken = 0;
	return no_cuda("moet_gpu_ffn_ks");
}

int moet_gpu_rmsnorm(const float *x, int64_t x_stride, const float *w, int64_t n, int64_t n_rows,
		     double eps, float *out, int64_t out_stride, void *stream)
{
	(void)x, (void)x_stride, (void)w, (void)n, (void)n_rows, (void)eps, (void)out;
	(void)out_stride, (void)stream;
	return no_cuda("moet_gpu_rmsnorm");
}

int moet_gpu_rope(float *x, int64_t n_rows, int64_t row_stride, int64_t n_heads,
		  int64_t head_stride, int64_t n_freq, const int32_t *pos, const float *inv_freq,
		  float attn_factor, int interleave, void *stream)
{
	(void)x, (void)n_rows, (void)row_stride, (void)n_heads, (void)head_stride, (void)n_freq;
	(void)pos, (void)inv_freq, (void)attn_factor, (void)interleave, (void)stream;
	return no_cuda("moet_gpu_rope");
}

int moet_gpu_kv_write(const float *kvb, int64_t kvb_stride, const float *k_pe,
		      int64_t k_pe_stride, int64_t n_rows, int64_t n_heads, int64_t d_nope,
		      int64_t d_rope, int64_t d_v, float *const *k_base, float *const *v_base,
		      int64_t k_pos_stride, int64_t v_pos_stride, const int32_t *pos,
		      const moet_gpu_pages *pages, void *stream)
{
	(void)kvb, (void)kvb_stride, (void)k_pe, (void)k_pe_stride, (void)n_rows, (void)n_heads;
	(void)d_nope, (void)d_rope, (void)d_v, (void)k_base, (void)v_base, (void)k_pos_stride;
	(void)v_pos_stride, (void)pos, (void)pages, (void)stream;
	return no_cuda("moet_gpu_kv_write");
}

int moet_gpu_attention(const float *q, int64_t q_stride, int64_t n_rows, int64_t n_heads,
		       int64_t d_qk, int64_t d_v, float *const *k_base, float *const *v_base,
		       int64_t k_pos_stride, int64_t v_pos_stride, const int32_t *pos,
		       const moet_gpu_pages *pages, int64_t run, float scale, float *out,
		       int64_t out_stride, void *stream)
{
	(void)q, (void)q_stride, (void)n_rows, (void)n_heads, (void)d_qk, (void)d_v, (void)run;
	(void)k_base, (void)v_base, (void)k_pos_stride, (void)v_pos_stride, (void)pos, (void)pages;
	(void)scale, (void)out, (void)out_stride, (void)stream;
	return no_cuda("moet_gpu_attention");
}

int moet_gpu_router(const float *logits, int64_t n_tok, int64_t n_exp, const float *bias,
		    int64_t n_group, int64_t topk_group, int64_t top_k, int norm_topk_prob,
		    float routed_scaling_factor, int32_t *out_ids, float *out_w, void *stream)
{
	(void)logits, (void)n_tok, (void)n_exp, (void)bias, (void)n_group, (void)topk_group;
	(void)top_k, (void)norm_topk_prob, (void)routed_scaling_factor, (void)out_ids;
	(void)out_w, (void)stream;
	return no_cuda("moet_gpu_router");
}

int moet_gpu_embed(const moet_mat *table, const int32_t *tok, int64_t n_tok, float *x,
		   void *stream)
{
	(void)table, (void)tok, (void)n_tok, (void)x, (void)stream;
	return no_cuda("moet_gpu_embed");
}

int moet_gpu_add(float *x, const float *y, int64_t n, void *stream)
{
	(void)x, (void)y, (void)n, (void)stream;
	return no_cuda("moet_gpu_add");
}

int moet_gpu_combine(const float *y, int64_t n_y, const int32_t *slot, const float *w,
		     int64_t top_k, const float *shared, int64_t n_tok, int64_t H, float *out,
		     void *stream)
{
	(void)y, (void)n_y, (void)slot, (void)w, (void)top_k, (void)shared, (void)n_tok, (void)H;
	(void)out, (void)stream;
	return no_cuda("moet_gpu_combine");
}

/* ---- Benchmark support: MOET_EUNSUP (moet_gpu_count says why there is no device). ---- */

int moet_gpu_info_get(moet_gpu_info *out)
{
	(void)out;
	return no_cuda("moet_gpu_info_get");
}

int moet_gpu_bench_copy(size_t bytes, int reps, double *samples_s)
{
	(void)bytes, (void)reps, (void)samples_s;
	return no_cuda("moet_gpu_bench_copy");
}

int moet_gpu_bench_sgemm(int64_t m, int64_t n, int64_t k, int reps, double *samples_s)
{
	(void)m, (void)n, (void)k, (void)reps, (void)samples_s;
	return no_cuda("moet_gpu_bench_sgemm");
}

int moet_gpu_bench_fill_bytes(void *dst, size_t bytes, uint64_t seed, uint8_t mask,
			      void *stream)
{
	(void)dst, (void)bytes, (void)seed, (void)mask, (void)stream;
	return no_cuda("moet_gpu_bench_fill_bytes");
}

int moet_gpu_bench_fill_f32(float *dst, size_t n, uint64_t seed, float lo, float hi,
			    void *stream)
{
	(void)dst, (void)n, (void)seed, (void)lo, (void)hi, (void)stream;
	return no_cuda("moet_gpu_bench_fill_f32");
}

int moet_gpu_timer_create(moet_gpu_timer **out)
{
	if (out)
		*out = NULL;
	return no_cuda("moet_gpu_timer_create");
}

void moet_gpu_timer_destroy(moet_gpu_timer *t)
{
	(void)t;
}

int moet_gpu_timer_start(moet_gpu_timer *t, void *stream)
{
	(void)t, (void)stream;
	return no_cuda("moet_gpu_timer_start");
}

int moet_gpu_timer_stop(moet_gpu_timer *t, void *stream, double *out_s)
{
	(void)t, (void)stream, (void)out_s;
	return no_cuda("moet_gpu_timer_stop");
}

int moet_gpu_kv_write_latent(const float *kva, long long kva_stride, long long width,
			     long long n_rows, float *const *c_base, long long c_stride,
			     const int32_t *pos, const moet_gpu_pages *pages, void *stream)
{
	(void)kva, (void)kva_stride, (void)width, (void)n_rows, (void)c_base, (void)c_stride;
	(void)pos, (void)pages, (void)stream;
	return moet_err(MOET_EUNSUP, "kv_write_latent: this build has no CUDA");
}

int moet_gpu_attention_latent(const float *q, long long q_stride, long long n_rows,
			      long long n_heads, long long nope, long long rope, long long v_dim,
			      const moet_mat *kv_b, float *const *c_base, long long c_stride,
			      const int32_t *pos, const moet_gpu_pages *pages, float scale,
			      float *out, long long out_stride, void *stream)
{
	(void)q, (void)q_stride, (void)n_rows, (void)n_heads, (void)nope, (void)rope, (void)v_dim;
	(void)kv_b, (void)c_base, (void)c_stride, (void)pos, (void)pages, (void)scale, (void)out;
	(void)out_stride, (void)stream;
	return moet_err(MOET_EUNSUP, "attention_latent: this build has no CUDA");
}

/* ---- Device sampling, grouping and fast expert mode: MOET_EUNSUP. ---- */

int moet_gpu_sample_scratch_bytes(int64_t n_rows, int64_t n_cols, size_t *out_bytes)
{
	(void)n_rows, (void)n_cols;
	if (out_bytes)
		*out_bytes = 0;
	return no_cuda("moet_gpu_sample_scratch_bytes");
}

int moet_gpu_sample(const float *logits, int64_t n_rows, int64_t n_cols, int64_t stride,
		    const moet_gpu_sample_row *rows, void *scratch, size_t scratch_bytes,
		    int32_t *out_ids, double *out_mass, void *stream)
{
	(void)logits, (void)n_rows, (void)n_cols, (void)stride, (void)rows, (void)scratch;
	(void)scratch_bytes, (void)out_ids, (void)out_mass, (void)stream;
	return no_cuda("moet_gpu_sample");
}

int moet_gpu_group_scratch_bytes(int64_t n_pairs, int64_t n_exp, size_t *out_bytes)
{
	(void)n_pairs, (void)n_exp;
	if (out_bytes)
		*out_bytes = 0;
	return no_cuda("moet_gpu_group_scratch_bytes");
}

int moet_gpu_group_pairs(const int32_t *ids, int64_t n_pairs, int64_t n_exp,
			 const int16_t *owner, int n_dev, void *scratch, size_t scratch_bytes,
			 const moet_gpu_group_bufs *out, void *stream)
{
	(void)ids, (void)n_pairs, (void)n_exp, (void)owner, (void)n_dev, (void)scratch;
	(void)scratch_bytes, (void)out, (void)stream;
	return no_cuda("moet_gpu_group_pairs");
}

int moet_gpu_fast_create(moet_gpu_fast **out)
{
	if (out)
		*out = NULL;
	return no_cuda("moet_gpu_fast_create");
}

void moet_gpu_fast_destroy(moet_gpu_fast *f)
{
	(void)f;
}

int moet_gpu_expert_mode(int *out_fast)
{
	if (out_fast)
		*out_fast = 0;
	return 0;
}

int moet_gpu_fast_min_tok(int64_t *out_min_tok)
{
	if (out_min_tok)
		*out_min_tok = 16;
	return 0;
}

size_t moet_gpu_expert_fast_scratch_bytes(int64_t n_pairs, int64_t inter, int64_t hidden)
{
	(void)n_pairs, (void)inter, (void)hidden;
	return 0;
}

int moet_gpu_expert_ffn_fast(moet_gpu_fast *f, const moet_gpu_expert *exps, int64_t n_exp,
			     const float *x, int64_t n_x, const int32_t *tok, int64_t min_tok,
			     void *scratch, size_t scratch_bytes, float *y, void *stream)
{
	(void)f, (void)exps, (void)n_exp, (void)x, (void)n_x, (void)tok, (void)min_tok;
	(void)scratch, (void)scratch_bytes, (void)y, (void)stream;
	return no_cuda("moet_gpu_expert_ffn_fast");
}

int moet_gpu_expert_table(const moet_gpu_expert *exps, int64_t n_exp,
			  moet_gpu_expert_ptrs *out_table, moet_gpu_expert_geom *out_geom)
{
	(void)exps, (void)n_exp, (void)out_table, (void)out_geom;
	return no_cuda("moet_gpu_expert_table");
}

int moet_gpu_experts_devgroup(const moet_gpu_expert_geom *geom,
			      const moet_gpu_expert_ptrs *table, const moet_gpu_group_bufs *grp,
			      int64_t n_pairs, int64_t top_k, int64_t max_tok, const float *x,
			      int64_t n_x, void *scratch, size_t scratch_bytes, float *y,
			      int32_t *err, void *stream)
{
	(void)geom, (void)table, (void)grp, (void)n_pairs, (void)top_k, (void)max_tok, (void)x;
	(void)n_x, (void)scratch, (void)scratch_bytes, (void)y, (void)err, (void)stream;
	return no_cuda("moet_gpu_experts_devgroup");
}

int moet_gpu_tier_rows_out(const moet_gpu_group_bufs *g, int n_dev, int64_t max_pairs,
			   int64_t top_k, const float *h, int64_t H, moet_gpu_pair *host_pairs,
			   int32_t *host_count, float *host_rows, int32_t *keep, void *stream)
{
	(void)g, (void)n_dev, (void)max_pairs, (void)top_k, (void)h, (void)H, (void)host_pairs;
	(void)host_count, (void)host_rows, (void)keep, (void)stream;
	return no_cuda("moet_gpu_tier_rows_out");
}

int moet_gpu_tier_rows_in(const int32_t *keep, int64_t max_pairs, const float *host_rows,
			  int64_t H, float *y, void *stream)
{
	(void)keep, (void)max_pairs, (void)host_rows, (void)H, (void)y, (void)stream;
	return no_cuda("moet_gpu_tier_rows_in");
}

int moet_gpu_wait_word(const uint32_t *word, uint32_t value, void *stream)
{
	(void)word, (void)value, (void)stream;
	return no_cuda("moet_gpu_wait_word");
}

int moet_gpu_host_fn(void (*fn)(void *), void *arg, void *stream)
{
	(void)fn, (void)arg, (void)stream;
	return no_cuda("moet_gpu_host_fn");
}
