/*
 * test_kv_pool.c: paged KV caches (runtime/kv_pool.c) on the CPU backend, in both MLA forms
 * (expanded, absorbed), on a synthetic tiny checkpoint.
 *   - three sequences of ragged lengths grow in interleaved batches through one shared pool
 *     (blocks of different sequences interleave in memory: checked on the block tables) with
 *     blocks of 1, 16 and 64 positions: every call's logits equal, by memcmp, those of the
 *     same calls on contiguous per-sequence caches (moet_kv_create, the layout of before);
 *   - the cached rows themselves: each position's K (and V) in the pool, at the row its block
 *     table names, equals the contiguous cache's row at that position, layer by layer;
 *   - reset returns every block (free count back to the total);
 *   - exhausting the pool: a batch that needs more blocks than are free fails with MOET_ERANGE
 *     naming the budget and changes nothing (lengths, blocks, free count); the other
 *     sequences' next logits still equal the contiguous reference; after a reset the freed
 *     blocks serve a new sequence;
 *   - moet_kv_token_bytes from config.json's dimensions;
 *   - bad arguments: block sizes that are not powers of two, a budget below one block, a
 *     cache larger than its pool, a cache of one MLA form given to a model of the other; a
 *     pool destroyed before its caches stays alive until they go (ASan in CI);
 *   - MOET_MLA: empty is the expanded form; any other spelling (a capital, a trailing space)
 *     is refused at the open with MOET_EINVAL naming the variable and the value.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"
#include "moet_topo.h"

#define SEQS 3
#define STEPS 10
#define MAXLEN 48

/* Tokens per sequence per call: ragged, prefill-like and decode-like calls interleaved, so
 * the sequences take their blocks in turns. Final lengths 41, 41, 35. */
static const int sched_tok[STEPS][SEQS] = {
	{ 5, 3, 0 }, { 0, 2, 7 }, { 9, 1, 1 }, { 1, 12, 1 }, { 8, 1, 1 },
	{ 1, 1, 17 }, { 10, 1, 1 }, { 1, 14, 1 }, { 1, 1, 1 }, { 5, 5, 5 },
};

static int64_t tok_of(int s, int64_t i, int64_t V)
{
	return (int64_t)((uint64_t)(s * 257 + i * 31 + 11) % (uint64_t)V);
}

/* The schedule on caches kv[]: every call's logits (all rows) appended to out. */
static int run_sched(moet_model *m, moet_kv **kv, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	int64_t tok[SEQS][MAXLEN];
	int64_t len[SEQS] = { 0 };
	size_t at = 0;
	for (int s = 0; s < SEQS; s++)
		for (int64_t i = 0; i < MAXLEN; i++)
			tok[s][i] = tok_of(s, i, V);
	for (int step = 0; step < STEPS; step++) {
		moet_seq_step st[SEQS];
		int n = 0;
		for (int s = 0; s < SEQS; s++) {
			if (!sched_tok[step][s])
				continue;
			st[n++] = (moet_seq_step){ .kv = kv[s], .tokens = tok[s] + len[s],
						   .n_tok = sched_tok[step][s],
						   .out_logits = out + at };
			at += (size_t)(sched_tok[step][s] * V);
			len[s] += sched_tok[step][s];
		}
		int rc = moet_model_forward_batch(m, st, n);
		if (rc)
			return rc;
	}
	return 0;
}

static uint32_t bits(const float *x, size_t i, size_t n)
{
	uint32_t u = 0;
	if (i < n)
		memcpy(&u, &x[i], sizeof(u));
	return u;
}

static size_t sched_rows(void)
{
	size_t n = 0;
	for (int step = 0; step < STEPS; step++)
		for (int s = 0; s < SEQS; s++)
			n += (size_t)sched_tok[step][s];
	return n;
}

/* Position p of cache kv, layer l: its K (or V) row in its pool's memory (host: CPU). */
static const float *row_of(const moet_kv *kv, int64_t l, int64_t p, int want_v)
{
	const moet_kv_pool *pl = kv->pool;
	const int64_t r = moet_kv_row(kv->blocks, pl->shift, p);
	if (want_v)
		return pl->v + l * pl->rows * pl->v_row + r * pl->v_row;
	return pl->k + l * pl->rows * pl->k_row + r * pl->k_row;
}

/* Every cached row of `got` equals the contiguous cache's, layer by layer. */
static void same_rows(const moet_kv *got, const moet_kv *ref, const char *what)
{
	CHECK(got->len == ref->len, "%s: length %lld, want %lld", what, (long long)got->len,
	      (long long)ref->len);
	for (int64_t l = 0; l < got->n_layers; l++)
		for (int64_t p = 0; p < got->len && p < ref->len; p++)
			for (int v = 0; v < (got->v_row ? 2 : 1); v++) {
				const size_t bytes = (size_t)(v ? got->v_row : got->k_row) * 4;
				if (memcmp(row_of(got, l, p, v), row_of(ref, l, p, v), bytes)) {
					CHECK(0, "%s: layer %lld position %lld: %s row differs",
					      what, (long long)l, (long long)p, v ? "V" : "K");
					return;
				}
			}
}

/* Blocks of a cache that do not follow the one before: > 0 when the sequence's blocks are
 * spread over the pool. */
static int breaks(const moet_kv *kv)
{
	int n = 0;
	for (int64_t i = 1; i < kv->n_blocks; i++)
		n += kv->blocks[i] != kv->blocks[i - 1] + 1;
	return n;
}

static void test_shared_pool(moet_model *m, const char *form)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	const size_t n_rows = sched_rows(), n = n_rows * (size_t)V;
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
	moet_kv *ref[SEQS] = { 0 };
	CHECK(want && got, "memory");
	if (!want || !got)
		goto out;
	for (int s = 0; s < SEQS; s++)
		CHECK(moet_kv_create(m, MAXLEN, &ref[s]) == 0, "contiguous cache: %s",
		      moet_errmsg());
	CHECK(run_sched(m, ref, want) == 0, "%s: contiguous run: %s", form, moet_errmsg());
	const int64_t bsz[3] = { 1, 16, 64 };
	for (int b = 0; b < 3; b++) {
		moet_kv_pool *pool = NULL;
		moet_kv *kv[SEQS] = { 0 };
		CHECK(moet_kv_pool_create(m, 3 * 64, bsz[b], &pool) == 0, "pool: %s",
		      moet_errmsg());
		if (!pool)
			continue;
		const int64_t total = moet_kv_pool_blocks(pool);
		CHECK(total == 3 * 64 / bsz[b] && moet_kv_pool_block_tokens(pool) == bsz[b] &&
		      moet_kv_pool_free_blocks(pool) == total, "pool of %lld blocks",
		      (long long)total);
		for (int s = 0; s < SEQS; s++)
			CHECK(moet_kv_create_in(pool, MAXLEN, &kv[s]) == 0, "cache: %s",
			      moet_errmsg());
		memset(got, 0xAB, n * sizeof(float));
		CHECK(run_sched(m, kv, got) == 0, "%s block %lld: %s", form, (long long)bsz[b],
		      moet_errmsg());
		size_t first = n;
		for (size_t i = 0; i < n && first == n; i++)
			if (memcmp(&got[i], &want[i], sizeof(float)))
				first = i;
		CHECK(first == n, "%s, blocks of %lld: logits differ from the contiguous caches at "
		      "row %zu column %zu (%08x vs %08x)", form, (long long)bsz[b],
		      first / (size_t)V, first % (size_t)V,
		      bits(got, first, n), bits(want, first, n));
		int64_t held = 0;
		int spread = 0;
		for (int s = 0; s < SEQS; s++) {
			char what[64];
			snprintf(what, sizeof(what), "%s blocks of %lld seq %d", form,
				 (long long)bsz[b], s);
			same_rows(kv[s], ref[s], what);
			held += moet_kv_blocks(kv[s]);
			CHECK(moet_kv_blocks(kv[s]) == (moet_kv_len(kv[s]) + bsz[b] - 1) / bsz[b],
			      "%s: %lld blocks for %lld positions", what,
			      (long long)moet_kv_blocks(kv[s]), (long long)moet_kv_len(kv[s]));
			spread += breaks(kv[s]);
		}
		CHECK(bsz[b] == 64 || spread > 0, "%s blocks of %lld: no sequence's blocks are "
		      "interleaved with another's", form, (long long)bsz[b]);
		CHECK(moet_kv_pool_free_blocks(pool) == total - held, "free %lld, want %lld",
		      (long long)moet_kv_pool_free_blocks(pool), (long long)(total - held));
		for (int s = 0; s < SEQS; s++) {
			moet_kv_reset(kv[s]);
			CHECK(moet_kv_len(kv[s]) == 0 && moet_kv_blocks(kv[s]) == 0, "reset");
		}
		CHECK(moet_kv_pool_free_blocks(pool) == total, "%s: after reset %lld of %lld free",
		      form, (long long)moet_kv_pool_free_blocks(pool), (long long)total);
		/* the pool's handle goes first: the caches keep it alive (ASan) */
		moet_kv_pool_destroy(pool);
		memset(got, 0, n * sizeof(float));
		CHECK(run_sched(m, kv, got) == 0 && !memcmp(got, want, n * sizeof(float)),
		      "%s blocks of %lld: after reset the same logits again", form,
		      (long long)bsz[b]);
		for (int s = 0; s < SEQS; s++)
			moet_kv_destroy(kv[s]);
	}
out:
	for (int s = 0; s < SEQS; s++)
		moet_kv_destroy(ref[s]);
	free(want);
	free(got);
}

/* n tokens of sequence s from position `from` on cache kv; logits of the last into out. */
static int feed(moet_model *m, moet_kv *kv, int s, int64_t from, int64_t n, float *out)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	int64_t tok[64];
	float *all = malloc((size_t)(n * V) * sizeof(float));
	if (!all)
		return MOET_ENOMEM;
	for (int64_t i = 0; i < n; i++)
		tok[i] = tok_of(s, from + i, V);
	int rc = moet_model_forward(m, kv, tok, n, all);
	if (!rc && out)
		memcpy(out, all + (n - 1) * V, (size_t)V * sizeof(float));
	free(all);
	return rc;
}

static void test_exhaustion(moet_model *m, const char *form)
{
	const int64_t V = moet_model_config(m)->vocab_size;
	float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
	moet_kv_pool *pool = NULL;
	moet_kv *kv[3] = { 0 }, *ref[3] = { 0 };
	int64_t tok[32];
	CHECK(a && b && moet_kv_pool_create(m, 64, 16, &pool) == 0, "pool: %s", moet_errmsg());
	if (!a || !b || !pool)
		goto out;
	for (int s = 0; s < 3; s++)
		CHECK(moet_kv_create_in(pool, 0, &kv[s]) == 0 &&
		      moet_kv_create(m, 64, &ref[s]) == 0, "caches");
	/* A: 20 positions (2 blocks), B: 16 (1 block): one block left */
	CHECK(feed(m, kv[0], 0, 0, 20, NULL) == 0 && feed(m, kv[1], 1, 0, 16, NULL) == 0 &&
	      feed(m, ref[0], 0, 0, 20, NULL) == 0 && feed(m, ref[1], 1, 0, 16, NULL) == 0,
	      "history: %s", moet_errmsg());
	CHECK(moet_kv_pool_free_blocks(pool) == 1, "free %lld",
	      (long long)moet_kv_pool_free_blocks(pool));
	/* A + 13 (a third block) and C + 5 (its first): 2 blocks wanted, 1 free */
	for (int i = 0; i < 13; i++)
		tok[i] = tok_of(0, 20 + i, V);
	for (int i = 0; i < 5; i++)
		tok[13 + i] = tok_of(2, i, V);
	moet_seq_step st[2] = { { .kv = kv[0], .tokens = tok, .n_tok = 13 },
				{ .kv = kv[2], .tokens = tok + 13, .n_tok = 5 } };
	int rc = moet_model_forward_batch(m, st, 2);
	CHECK(rc == MOET_ERANGE, "%s: batch past the pool: %d", form, rc);
	CHECK(strstr(moet_errmsg(), "KV pool full") && strstr(moet_errmsg(), "budget 64") &&
	      !strchr(moet_errmsg(), '\n'), "message: %s", moet_errmsg());
	CHECK(moet_kv_len(kv[0]) == 20 && moet_kv_blocks(kv[0]) == 2 && moet_kv_len(kv[2]) == 0 &&
	      moet_kv_blocks(kv[2]) == 0 && moet_kv_pool_free_blocks(pool) == 1,
	      "the failed batch changed the caches: A %lld/%lld C %lld/%lld free %lld",
	      (long long)moet_kv_len(kv[0]), (long long)moet_kv_blocks(kv[0]),
	      (long long)moet_kv_len(kv[2]), (long long)moet_kv_blocks(kv[2]),
	      (long long)moet_kv_pool_free_blocks(pool));
	/* one sequence alone: C + 17 needs 2 blocks */
	CHECK(feed(m, kv[2], 2, 0, 17, NULL) == MOET_ERANGE && moet_kv_blocks(kv[2]) == 0 &&
	      moet_kv_pool_free_blocks(pool) == 1, "C past the pool");
	/* the others go on as if nothing happened: A + 1 (no new block), B + 1 (the last) */
	CHECK(feed(m, kv[0], 0, 20, 1, a) == 0 && feed(m, ref[0], 0, 20, 1, b) == 0 &&
	      !memcmp(a, b, (size_t)V * sizeof(float)), "%s: A after the failure differs", form);
	CHECK(feed(m, kv[1], 1, 16, 1, a) == 0 && feed(m, ref[1], 1, 16, 1, b) == 0 &&
	      !memcmp(a, b, (size_t)V * sizeof(float)), "%s: B after the failure differs", form);
	CHECK(moet_kv_pool_free_blocks(pool) == 0, "pool not empty");
	CHECK(feed(m, kv[2], 2, 0, 1, NULL) == MOET_ERANGE, "C with no block free");
	/* B's blocks back: C runs in them */
	moet_kv_reset(kv[1]);
	CHECK(moet_kv_pool_free_blocks(pool) == 2, "B's reset: free %lld",
	      (long long)moet_kv_pool_free_blocks(pool));
	CHECK(feed(m, kv[2], 2, 0, 5, a) == 0 && feed(m, ref[2], 2, 0, 5, b) == 0 &&
	      !memcmp(a, b, (size_t)V * sizeof(float)), "%s: C in B's old block differs", form);
	CHECK(feed(m, kv[0], 0, 21, 1, a) == 0 && feed(m, ref[0], 0, 21, 1, b) == 0 &&
	      !memcmp(a, b, (size_t)V * sizeof(float)), "%s: A at the end differs", form);
	for (int s = 0; s < 3; s++)
		moet_kv_reset(kv[s]);
	CHECK(moet_kv_pool_free_blocks(pool) == moet_kv_pool_blocks(pool), "every block back");
out:
	for (int s = 0; s < 3; s++) {
		moet_kv_destroy(kv[s]);
		moet_kv_destroy(ref[s]);
	}
	moet_kv_pool_destroy(pool);
	free(a);
	free(b);
}

static void test_bad_args(moet_model *m, moet_model *other)
{
	moet_kv_pool *p = NULL;
	moet_kv *kv = NULL;
	CHECK(moet_kv_pool_create(m, 100, 3, &p) == MOET_EINVAL && strstr(moet_errmsg(), "power"),
	      "block 3: %s", moet_errmsg());
	CHECK(moet_kv_pool_create(m, 100, 1 << 17, &p) == MOET_EINVAL, "block 2^17");
	CHECK(moet_kv_pool_create(m, 100, -4, &p) == MOET_EINVAL, "block -4");
	CHECK(moet_kv_pool_create(m, 10, 16, &p) == MOET_EINVAL && strstr(moet_errmsg(), "budget"),
	      "budget below a block: %s", moet_errmsg());
	CHECK(moet_kv_pool_create(m, 100, 0, &p) == 0 && moet_kv_pool_blocks(p) == 1 &&
	      moet_kv_pool_block_tokens(p) == MOET_KV_BLOCK_TOKENS, "default block");
	if (!p)
		return;
	CHECK(moet_kv_create_in(p, 65, &kv) == MOET_EINVAL, "a cache larger than its pool");
	CHECK(moet_kv_create_in(p, -1, &kv) == MOET_EINVAL, "negative size");
	CHECK(moet_kv_create(m, 0, &kv) == MOET_EINVAL, "empty contiguous cache");
	CHECK(moet_kv_create_in(p, 0, &kv) == 0, "a cache of the whole pool");
	if (kv) {
		int64_t t[2] = { 1, 2 };
		int rc = moet_model_forward(other, kv, t, 2, NULL);
		CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "MLA form"),
		      "a cache of the other form: %d %s", rc, moet_errmsg());
		CHECK(moet_kv_len(kv) == 0 && moet_kv_blocks(kv) == 0, "refused, untouched");
	}
	moet_kv_destroy(kv);
	moet_kv_pool_destroy(p);
	moet_kv_pool_destroy(NULL);
	moet_kv_destroy(NULL);
}

/* The default budget's arithmetic against the host's MemAvailable read here (the CPU backend
 * sizes by it): capped, uncapped within 2% (the figure moves between the two reads), and a
 * floor above what fits gives MOET_ENOMEM naming the bytes per position. */
static void test_fit(moet_model *m, const char *form)
{
	int64_t n = 0;
	size_t free_b = 0;
	CHECK(moet_kv_fit_tokens(m, 0.9, 1000, 2, &n, &free_b) == 0 && n == 1000,
	      "%s: capped fit %lld: %s", form, (long long)n, moet_errmsg());
	const double want = 0.9 * (double)moet_topo_mem_available() /
			    (double)moet_kv_token_bytes(m);
	CHECK(moet_kv_fit_tokens(m, 0.9, INT64_C(1) << 50, 2, &n, &free_b) == 0 &&
		      fabs((double)n - want) <= 0.02 * want,
	      "%s: uncapped fit %lld, want about %.0f", form, (long long)n, want);
	CHECK(free_b > 0, "%s: free bytes reported", form);
	int rc = moet_kv_fit_tokens(m, 0.9, INT64_C(1) << 50, INT64_C(1) << 49, &n, NULL);
	CHECK(rc == MOET_ENOMEM && strstr(moet_errmsg(), "bytes per position") &&
		      strstr(moet_errmsg(), form),
	      "%s: too small a fit: %d, %s", form, rc, moet_errmsg());
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 5;
	char *dir = moet_test_gen("kv-pool", &gp);
	if (!dir)
		return moet_test_done("test_kv_pool");
	moet_model *m[2] = { 0 };
	const char *forms[2] = { "expanded", "absorbed" };
	for (int f = 0; f < 2; f++) {
		setenv("MOET_MLA", forms[f], 1);
		CHECK(moet_model_open(dir, &m[f]) == 0, "open %s: %s", forms[f], moet_errmsg());
	}
	/* the empty value is the default; any other spelling is refused at the open, naming it */
	setenv("MOET_MLA", "", 1);
	moet_model *e = NULL;
	CHECK(moet_model_open(dir, &e) == 0 && e && m[0] &&
		      moet_kv_token_bytes(e) == moet_kv_token_bytes(m[0]),
	      "MOET_MLA='': the expanded form (%s)", moet_errmsg());
	moet_model_close(e);
	static const char *const bad[] = { "Absorbed", "latent", "1", "expanded " };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("MOET_MLA", bad[i], 1);
		e = NULL;
		char want[64];
		snprintf(want, sizeof(want), "MOET_MLA='%s'", bad[i]);
		int rc = moet_model_open(dir, &e);
		CHECK(rc == MOET_EINVAL && !e && strstr(moet_errmsg(), want) &&
			      strstr(moet_errmsg(), "expanded or absorbed"),
		      "MOET_MLA=%s: rc %d (%s)", bad[i], rc, moet_errmsg());
		moet_model_close(e);
	}
	unsetenv("MOET_MLA");
	for (int f = 0; f < 2 && m[0] && m[1]; f++) {
		const moet_config *c = moet_model_config(m[f]);
		const int64_t per = f ? c->kv_lora_rank + c->qk_rope_head_dim
				      : c->num_attention_heads * (c->qk_nope_head_dim +
								  c->qk_rope_head_dim + c->v_head_dim);
		CHECK(moet_kv_token_bytes(m[f]) == (size_t)(c->num_hidden_layers * per) * 4,
		      "%s: %zu bytes per position", forms[f], moet_kv_token_bytes(m[f]));
		test_shared_pool(m[f], forms[f]);
		test_exhaustion(m[f], forms[f]);
		test_fit(m[f], forms[f]);
	}
	if (m[0] && m[1])
		test_bad_args(m[0], m[1]);
	moet_model_close(m[0]);
	moet_model_close(m[1]);
	free(dir);
	return moet_test_done("test_kv_pool");
}
