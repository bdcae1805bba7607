/*
 * test_exec.c: the CPU expert executor (cpu/exec.c) against moet_expert_ffn with the scalar
 * reference table, single-threaded: random FP8 (with block scales) and BF16 experts, partial
 * 128-blocks, batches of 1..16 experts with 1..64 tokens, 1, 2 and 3 workers, both splits,
 * outputs memcmp-equal. Also: batches in flight at once, two submitting threads, workers bound
 * where the topology says, rounds of batches in flight with randomly delayed items (no
 * barriers between phases or batches: cpu/exec.c), error paths (shapes, limits, tickets,
 * FTZ/DAZ at create and a kernel that changes MXCSR), create/destroy in a loop (leaks
 * show under MOET_SANITIZE), and the done word (moet_cpuexec_set_done_word: reached in ticket
 * order, each batch's outputs there once it says so).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "moet_clock.h"
#include "moet_cpu.h"
#include "moet_cpuexec.h"
#include "moet_dtype.h"
#include "moet_err.h"
#include "moet_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_u64(void)
{
	return moet_test_xorshift64(&rng);
}

static float uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)((next_u64() >> 40) * 0x1p-24);
}

typedef struct expert {
	moet_mat gate, up, down;
	void *buf[6];
} expert;

static moet_mat make_mat(moet_dtype dt, int64_t rows, int64_t cols, void **data, void **scale)
{
	moet_mat m = { .dtype = dt, .rows = rows, .cols = cols };
	size_t n = (size_t)(rows * cols);
	if (dt == MOET_DT_F8_E4M3) {
		uint8_t *d = malloc(n);
		for (size_t i = 0; i < n; i++) {
			uint8_t c = (uint8_t)next_u64();
			d[i] = (c & 0x7F) == 0x7F ? (uint8_t)(c ^ 0x01) : c; /* no NaN codes */
		}
		size_t ns = (size_t)(((rows + 127) / 128) * ((cols + 127) / 128));
		float *s = malloc(ns * sizeof(float));
		for (size_t i = 0; i < ns; i++)
			s[i] = uniform(0x1p-12f, 0x1p-8f);
		m.data = d;
		m.scale_inv = s;
		*data = d;
		*scale = s;
	} else {
		uint16_t *d = malloc(n * sizeof(uint16_t));
		for (size_t i = 0; i < n; i++)
			d[i] = moet_enc_bf16(uniform(-0.08f, 0.08f));
		m.data = d;
		*data = d;
		*scale = NULL;
	}
	return m;
}

static void make_expert(expert *e, moet_dtype dt, int64_t H, int64_t I)
{
	e->gate = make_mat(dt, I, H, &e->buf[0], &e->buf[1]);
	e->up = make_mat(dt, I, H, &e->buf[2], &e->buf[3]);
	e->down = make_mat(dt, H, I, &e->buf[4], &e->buf[5]);
}

static void free_expert(expert *e)
{
	for (int i = 0; i < 6; i++)
		free(e->buf[i]);
}

typedef struct batch {
	int n;
	expert ex[16];
	moet_cpuexec_job jobs[16];
	float *x[16], *y[16], *want[16];
} batch;

/* A batch of n experts of dtype dt at H x I, token counts in [1, max_tok_each]. */
static void make_batch(batch *b, int n, moet_dtype dt, int64_t H, int64_t I, int max_tok_each)
{
	b->n = n;
	for (int j = 0; j < n; j++) {
		int64_t T = 1 + (int64_t)(next_u64() % (uint64_t)max_tok_each);
		make_expert(&b->ex[j], dt, H, I);
		b->x[j] = malloc((size_t)(T * H) * sizeof(float));
		b->y[j] = malloc((size_t)(T * H) * sizeof(float));
		b->want[j] = malloc((size_t)(T * H) * sizeof(float));
		for (int64_t i = 0; i < T * H; i++)
			b->x[j][i] = uniform(-2.0f, 2.0f);
		if (j == 1)
			b->x[j][0] = moet_bits_f32(0x7FC01234u); /* token 0 of job 1 gives NaN out */
		float *scratch = malloc((size_t)(T * I) * sizeof(float));
		int rc = moet_expert_ffn(&moet_cpu_kernels_ref, &b->ex[j].gate, &b->ex[j].up,
					 &b->ex[j].down, b->x[j], T, scratch, b->want[j]);
		CHECK(rc == 0, "reference FFN: %s", moet_errmsg());
		free(scratch);
		b->jobs[j] = (moet_cpuexec_job){ .gate = b->ex[j].gate, .up = b->ex[j].up,
						 .down = b->ex[j].down, .x = b->x[j], .y = b->y[j],
						 .n_tok = T };
	}
}

static void clear_outputs(batch *b)
{
	for (int j = 0; j < b->n; j++)
		memset(b->y[j], 0xAB, (size_t)(b->jobs[j].n_tok * b->ex[j].gate.cols) * sizeof(float));
}

static int check_outputs(const batch *b, const char *what)
{
	for (int j = 0; j < b->n; j++) {
		size_t n = (size_t)(b->jobs[j].n_tok * b->ex[j].gate.cols);
		if (!memcmp(b->y[j], b->want[j], n * sizeof(float)))
			continue;
		for (size_t i = 0; i < n; i++)
			if (moet_f32_bits(b->y[j][i]) != moet_f32_bits(b->want[j][i])) {
				CHECK(0, "%s: job %d element %zu: 0x%08x, reference 0x%08x", what, j,
				      i, moet_f32_bits(b->y[j][i]), moet_f32_bits(b->want[j][i]));
				return 1;
			}
	}
	return 0;
}

static void free_batch(batch *b)
{
	for (int j = 0; j < b->n; j++) {
		free_expert(&b->ex[j]);
		free(b->x[j]);
		free(b->y[j]);
		free(b->want[j]);
	}
}

static moet_cpuexec *make_exec(int n_threads, int split, const moet_cpu_kernels *k)
{
	moet_cpuexec *ex = NULL;
	moet_cpuexec_opts o = { .n_threads = n_threads, .max_tok = 1024, .max_inter = 384,
				.max_jobs = 16, .max_pending = 4, .split = split, .kernels = k };
	int rc = moet_cpuexec_create(&o, &ex);
	CHECK(rc == 0 && ex, "create (%d threads): %s", n_threads, moet_errmsg());
	return ex;
}

static void run_and_check(moet_cpuexec *ex, batch *b, const char *what)
{
	uint64_t tk = 0;
	clear_outputs(b);
	int rc = moet_cpuexec_submit(ex, b->jobs, b->n, &tk);
	CHECK(rc == 0 && tk, "%s: submit: %s", what, moet_errmsg());
	rc = rc ? rc : moet_cpuexec_wait(ex, tk);
	CHECK(rc == 0, "%s: wait: %s", what, moet_errmsg());
	check_outputs(b, what);
}

/* bit identity over shapes, dtypes, batch sizes, thread counts and splits */
static void identity(void)
{
	static const struct {
		moet_dtype dt;
		int64_t H, I;
		int n_exp, max_tok;
	} cases[] = {
		{ MOET_DT_F8_E4M3, 256, 128, 1, 1 },  { MOET_DT_F8_E4M3, 200, 72, 8, 1 },
		{ MOET_DT_F8_E4M3, 300, 160, 16, 4 }, { MOET_DT_F8_E4M3, 136, 384, 3, 64 },
		{ MOET_DT_BF16, 192, 96, 4, 8 },      { MOET_DT_BF16, 130, 50, 16, 2 },
		{ MOET_DT_BF16, 64, 300, 2, 64 },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		batch b;
		make_batch(&b, cases[c].n_exp, cases[c].dt, cases[c].H, cases[c].I,
			   cases[c].max_tok);
		for (int thr = 1; thr <= 3; thr++)
			for (int split = MOET_CPUEXEC_SPLIT_ROWS; split <= MOET_CPUEXEC_SPLIT_EXPERTS;
			     split++) {
				moet_cpuexec *ex = make_exec(thr, split, &moet_cpu_kernels_ref);
				if (!ex)
					continue;
				char what[160];
				snprintf(what, sizeof(what), "case %zu (%s %lldx%lld, %d experts), %d "
					 "threads, split %d", c, moet_dtype_name(cases[c].dt),
					 (long long)cases[c].H, (long long)cases[c].I,
					 cases[c].n_exp, thr, split);
				run_and_check(ex, &b, what);
				moet_cpuexec_destroy(ex);
			}
		free_batch(&b);
	}
}

/* several batches in flight; waited for out of order; a job with no tokens */
static void in_flight(void)
{
	batch b[3];
	for (int i = 0; i < 3; i++)
		make_batch(&b[i], 2 + i, MOET_DT_F8_E4M3, 160, 96, 5);
	b[2].jobs[0].n_tok = 0; /* still valid: nothing to compute */
	moet_cpuexec *ex = make_exec(2, MOET_CPUEXEC_SPLIT_AUTO, NULL);
	if (!ex)
		goto out;
	uint64_t tk[3];
	for (int i = 0; i < 3; i++) {
		clear_outputs(&b[i]);
		CHECK(moet_cpuexec_submit(ex, b[i].jobs, b[i].n, &tk[i]) == 0, "submit %d", i);
	}
	CHECK(tk[0] < tk[1] && tk[1] < tk[2], "tickets increase");
	/* moet_cpuexec_done: each batch reads done in time (10 s at most), and then its outputs
	 * are all there (the done mark is set after the last worker's writes) */
	for (int i = 0; i < 2; i++) {
		const uint64_t t0 = moet_now_ns();
		while (!moet_cpuexec_done(ex, tk[i]) && moet_now_ns() - t0 < 10000000000ull)
			sched_yield();
		CHECK(moet_cpuexec_done(ex, tk[i]), "batch %d never done", i);
		check_outputs(&b[i], i ? "done 1" : "done 0");
	}
	CHECK(moet_cpuexec_done(ex, 12345), "an unknown ticket reads done");
	for (int i = 2; i >= 0; i--)
		CHECK(moet_cpuexec_wait(ex, tk[i]) == 0, "wait %d: %s", i, moet_errmsg());
	CHECK(moet_cpuexec_done(ex, tk[0]), "a ticket waited for reads done");
	check_outputs(&b[0], "in flight 0");
	check_outputs(&b[1], "in flight 1");
	for (int j = 1; j < b[2].n; j++) { /* job 0 had no tokens */
		size_t n = (size_t)(b[2].jobs[j].n_tok * 160);
		CHECK(!memcmp(b[2].y[j], b[2].want[j], n * sizeof(float)), "in flight 2 job %d", j);
	}
	CHECK(moet_cpuexec_wait(ex, tk[1]) == MOET_EINVAL, "a ticket waited for twice");
	CHECK(moet_cpuexec_wait(ex, 12345) == MOET_EINVAL, "an unknown ticket");
	moet_cpuexec_destroy(ex);
out:
	for (int i = 0; i < 3; i++)
		free_batch(&b[i]);
}

typedef struct submitter {
	moet_cpuexec *ex;
	batch *b;
	int fails;
} submitter;

static void *submit_loop(void *arg)
{
	submitter *s = arg;
	for (int it = 0; it < 15; it++) {
		uint64_t tk;
		clear_outputs(s->b);
		if (moet_cpuexec_submit(s->ex, s->b->jobs, s->b->n, &tk) ||
		    moet_cpuexec_wait(s->ex, tk))
			s->fails++;
		for (int j = 0; j < s->b->n; j++)
			s->fails += !!memcmp(s->b->y[j], s->b->want[j],
					     (size_t)(s->b->jobs[j].n_tok * 128) * sizeof(float));
	}
	return NULL;
}

static void two_submitters(void)
{
	batch b[2];
	make_batch(&b[0], 3, MOET_DT_F8_E4M3, 128, 64, 3);
	make_batch(&b[1], 5, MOET_DT_BF16, 128, 96, 2);
	moet_cpuexec *ex = make_exec(3, MOET_CPUEXEC_SPLIT_ROWS, NULL);
	if (ex) {
		submitter s[2] = { { ex, &b[0], 0 }, { ex, &b[1], 0 } };
		pthread_t t[2];
		for (int i = 0; i < 2; i++)
			pthread_create(&t[i], NULL, submit_loop, &s[i]);
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		CHECK(s[0].fails == 0 && s[1].fails == 0, "concurrent submits: %d and %d failures",
		      s[0].fails, s[1].fails);
	}
	moet_cpuexec_destroy(ex);
	free_batch(&b[0]);
	free_batch(&b[1]);
}

typedef struct where {
	int cpu[8];
	int n_workers;
} where;

static void record_cpu(void *arg, int w, int n)
{
	where *p = arg;
	p->cpu[w] = sched_getcpu();
	if (w == 0)
		p->n_workers = n;
}

/* workers run on the cores the topology mapping names (3 workers: the third shares) */
static void binding(void)
{
	moet_cpuexec *ex = make_exec(3, 0, NULL);
	if (!ex)
		return;
	where p = { { 0 }, 0 };
	CHECK(moet_cpuexec_run(ex, record_cpu, &p) == 0, "run: %s", moet_errmsg());
	CHECK(p.n_workers == 3 && moet_cpuexec_n_threads(ex) == 3, "3 workers");
	const moet_topo *t = moet_cpuexec_topo(ex);
	for (int w = 0; w < 3; w++)
		CHECK(p.cpu[w] == moet_topo_core_pu(t, moet_cpuexec_worker_core(ex, w)),
		      "worker %d on CPU %d, bound to PU %d", w, p.cpu[w],
		      moet_topo_core_pu(t, moet_cpuexec_worker_core(ex, w)));
	CHECK(moet_cpuexec_worker_core(ex, 3) == -1, "worker out of range");
	CHECK(moet_cpuexec_run(ex, NULL, NULL) == MOET_EINVAL, "run without a function");
	moet_cpuexec_destroy(ex);

	/* a synthetic two-package machine: the mapping, without real binding */
	moet_topo *syn = NULL;
	CHECK(moet_topo_load_synthetic("pack:2 numa:2 core:4 pu:1", NULL, &syn) == 0, "synthetic");
	moet_cpuexec_opts o = { .topo = syn, .node = MOET_TOPO_ALL_NODES, .n_threads = 5 };
	if (syn && moet_cpuexec_create(&o, &ex) == 0) {
		static const int want[5] = { 0, 4, 8, 12, 1 };
		for (int w = 0; w < 5; w++)
			CHECK(moet_cpuexec_worker_core(ex, w) == want[w], "synthetic worker %d: core "
			      "%d", w, moet_cpuexec_worker_core(ex, w));
		batch b;
		make_batch(&b, 4, MOET_DT_F8_E4M3, 128, 128, 3);
		run_and_check(ex, &b, "synthetic topology, 5 workers");
		free_batch(&b);
		moet_cpuexec_destroy(ex);
	} else {
		CHECK(0, "create on a synthetic topology: %s", moet_errmsg());
	}
	o.node = 2;
	o.n_threads = 0;
	if (syn && moet_cpuexec_create(&o, &ex) == 0) {
		CHECK(moet_cpuexec_n_threads(ex) == 4 && moet_cpuexec_worker_core(ex, 0) == 8,
		      "node 2: 4 workers from core 8");
		moet_cpuexec_destroy(ex);
	}
	o.node = 4;
	CHECK(moet_cpuexec_create(&o, &ex) == MOET_EINVAL && !ex, "node 4 of 4");
	moet_topo_destroy(syn);
}

static void errors(void)
{
	batch b;
	make_batch(&b, 3, MOET_DT_F8_E4M3, 128, 64, 4);
	moet_cpuexec *ex = NULL;
	moet_cpuexec_opts o = { .n_threads = 2, .max_tok = 8, .max_inter = 64, .max_jobs = 3,
				.max_pending = 2 };
	CHECK(moet_cpuexec_create(&o, &ex) == 0, "create: %s", moet_errmsg());
	if (!ex) {
		free_batch(&b);
		return;
	}
	uint64_t tk = 99;
	moet_cpuexec_job bad[3];
	memcpy(bad, b.jobs, sizeof(bad));
	bad[1].down.cols = 65;
	CHECK(moet_cpuexec_submit(ex, bad, 3, &tk) == MOET_ESHAPE && tk == 0, "down cols 65");
	CHECK(strstr(moet_errmsg(), "job 1") != NULL, "detail names the job: %s", moet_errmsg());
	memcpy(bad, b.jobs, sizeof(bad));
	bad[2].up.rows = 63;
	CHECK(moet_cpuexec_submit(ex, bad, 3, &tk) == MOET_ESHAPE, "up rows 63");
	memcpy(bad, b.jobs, sizeof(bad));
	bad[0].gate.dtype = MOET_DT_F16;
	CHECK(moet_cpuexec_submit(ex, bad, 3, &tk) == MOET_ESHAPE, "F16 weights");
	memcpy(bad, b.jobs, sizeof(bad));
	bad[0].up.data = NULL;
	CHECK(moet_cpuexec_submit(ex, bad, 3, &tk) == MOET_ESHAPE, "no weight data");
	memcpy(bad, b.jobs, sizeof(bad));
	bad[0].x = NULL;
	CHECK(moet_cpuexec_submit(ex, bad, 3, &tk) == MOET_EINVAL, "x NULL");
	memcpy(bad, b.jobs, sizeof(bad));
	bad[0].n_tok = -1;
	CHECK(moet_cpuexec_submit(ex, bad, 3, &tk) == MOET_EINVAL, "n_tok -1");
	memcpy(bad, b.jobs, sizeof(bad));
	bad[0].n_tok = 3, bad[1].n_tok = 3, bad[2].n_tok = 3;
	CHECK(moet_cpuexec_submit(ex, bad, 3, &tk) == MOET_ERANGE, "9 tokens, max_tok 8");
	CHECK(strstr(moet_errmsg(), "max_tok") != NULL, "detail: %s", moet_errmsg());
	CHECK(moet_cpuexec_submit(ex, b.jobs, 4, &tk) == MOET_ERANGE, "4 jobs, max_jobs 3");
	CHECK(moet_cpuexec_submit(ex, NULL, 1, &tk) == MOET_EINVAL, "jobs NULL");
	CHECK(moet_cpuexec_submit(ex, b.jobs, -1, &tk) == MOET_EINVAL, "-1 jobs");
	batch wide;
	make_batch(&wide, 1, MOET_DT_BF16, 64, 80, 1);
	CHECK(moet_cpuexec_submit(ex, wide.jobs, 1, &tk) == MOET_ERANGE, "I 80 > max_inter 64");
	/* max_pending 2: a third outstanding batch is refused, then accepted after a wait */
	uint64_t t1, t2, t3;
	CHECK(moet_cpuexec_submit(ex, b.jobs, 1, &t1) == 0, "first: %s", moet_errmsg());
	CHECK(moet_cpuexec_submit(ex, b.jobs + 1, 1, &t2) == 0, "second: %s", moet_errmsg());
	CHECK(moet_cpuexec_submit(ex, b.jobs + 2, 1, &t3) == MOET_ERANGE && t3 == 0, "third");
	CHECK(moet_cpuexec_wait(ex, t1) == 0, "wait first");
	CHECK(moet_cpuexec_submit(ex, b.jobs + 2, 1, &t3) == 0, "third after a wait");
	CHECK(moet_cpuexec_submit(ex, NULL, 0, &tk) == MOET_ERANGE, "an empty batch, queue full");
	CHECK(moet_cpuexec_wait(ex, t2) == 0 && moet_cpuexec_wait(ex, t3) == 0, "wait");
	CHECK(moet_cpuexec_submit(ex, NULL, 0, &tk) == 0 && moet_cpuexec_wait(ex, tk) == 0,
	      "an empty batch");
	check_outputs(&b, "one job per batch");
	moet_cpuexec_destroy(ex);
	free_batch(&wide);
	free_batch(&b);

	o = (moet_cpuexec_opts){ .n_threads = -1 };
	CHECK(moet_cpuexec_create(&o, &ex) == MOET_EINVAL && !ex, "-1 threads");
	o = (moet_cpuexec_opts){ .split = 7 };
	CHECK(moet_cpuexec_create(&o, &ex) == MOET_EINVAL && !ex, "split 7");
	o = (moet_cpuexec_opts){ .max_tok = (int64_t)1 << 40, .max_inter = 4096 };
	CHECK(moet_cpuexec_create(&o, &ex) == MOET_ERANGE && !ex, "huge scratch");
	o = (moet_cpuexec_opts){ .node = 5 };
	CHECK(moet_cpuexec_create(&o, &ex) == MOET_EINVAL && !ex, "node 5");
}

/* The reference gate_up and rows with a random delay of up to ~0.3 ms on some calls: workers
 * finish their items at very different times, as on a loaded machine. */
static atomic_uint delay_rng = 1;
static void random_delay(void)
{
	unsigned r = atomic_fetch_add(&delay_rng, 0x9E3779B9u) * 2654435761u;
	if ((r >> 28) < 5) {
		struct timespec ts = { 0, (long)((r >> 8) % 300000) };
		nanosleep(&ts, NULL);
	}
}
static void gate_up_slow(const moet_mat *g, const moet_mat *u, int64_t r0, int64_t r1,
			 const float *x, int64_t xs, int64_t n, float *h, int64_t hs)
{
	random_delay();
	moet_cpu_kernels_ref.gate_up(g, u, r0, r1, x, xs, n, h, hs);
}
static void rows_slow(const moet_mat *w, int64_t r0, int64_t r1, const float *x, int64_t xs,
		      int64_t n, float *y, int64_t ys)
{
	random_delay();
	moet_cpu_kernels_ref.rows(w, r0, r1, x, xs, n, y, ys);
}

/*
 * No barrier between the phases nor at a batch's end (cpu/exec.c): a phase 2 item waits for
 * its job's phase 1 only, and the batches in flight share the h scratch. Rounds of 4 batches
 * submitted at once (several experts each, so phase 2 items of early jobs run while later
 * jobs' phase 1 does), 4 workers, items delayed at random: every output equals the
 * reference's.
 */
/* The reference kernels with each item delayed at random. */
static moet_cpu_kernels slow_kernels(void)
{
	moet_cpu_kernels k = moet_cpu_kernels_ref;
	k.isa = "ref-slow";
	k.gate_up = gate_up_slow;
	k.rows = rows_slow;
	return k;
}

static void pipelined(void)
{
	const moet_cpu_kernels k = slow_kernels();
	batch b[4];
	for (int i = 0; i < 4; i++)
		make_batch(&b[i], 3 + i, i % 2 ? MOET_DT_BF16 : MOET_DT_F8_E4M3, 144, 200, 3);
	moet_cpuexec *ex = make_exec(4, MOET_CPUEXEC_SPLIT_ROWS, &k);
	for (int round = 0; ex && round < 12; round++) {
		uint64_t tk[4];
		for (int i = 0; i < 4; i++) {
			clear_outputs(&b[i]);
			CHECK(moet_cpuexec_submit(ex, b[i].jobs, b[i].n, &tk[i]) == 0, "submit %d: %s",
			      i, moet_errmsg());
		}
		for (int i = 0; i < 4; i++)
			CHECK(moet_cpuexec_wait(ex, tk[(i + round) % 4]) == 0, "wait: %s",
			      moet_errmsg());
		char what[64];
		for (int i = 0; i < 4; i++) {
			snprintf(what, sizeof(what), "pipelined round %d batch %d", round, i);
			if (check_outputs(&b[i], what))
				round = 1000;
		}
	}
	moet_cpuexec_destroy(ex);
	for (int i = 0; i < 4; i++)
		free_batch(&b[i]);
}

#if defined(__x86_64__)
/* Creation with FTZ or DAZ on in the creating thread (inherited by the workers) fails. */
/* moet_cpuexec_set_done_word: with items delayed at random and four batches in flight, the
 * word reaches each batch's ticket in order, and once it has, the batch's outputs are all
 * there (read before any wait for it); with NULL set again the word stays as it was. */
static void done_word(void)
{
	const moet_cpu_kernels k = slow_kernels();
	batch b[4];
	for (int i = 0; i < 4; i++)
		make_batch(&b[i], 2 + i, MOET_DT_F8_E4M3, 144, 200, 3);
	moet_cpuexec *ex = make_exec(3, MOET_CPUEXEC_SPLIT_ROWS, &k);
	static uint32_t word;
	word = 0;
	moet_cpuexec_set_done_word(ex, &word);
	for (int round = 0; ex && round < 3; round++) {
		uint64_t tk[4];
		for (int i = 0; i < 4; i++) {
			clear_outputs(&b[i]);
			CHECK(moet_cpuexec_submit(ex, b[i].jobs, b[i].n, &tk[i]) == 0, "submit: %s",
			      moet_errmsg());
		}
		uint32_t seen = 0;
		for (int i = 0; i < 4; i++) {
			const uint64_t t0 = moet_now_ns();
			uint32_t w;
			while ((int32_t)((w = __atomic_load_n(&word, __ATOMIC_ACQUIRE)) -
					 (uint32_t)tk[i]) < 0 &&
			       moet_now_ns() - t0 < 10000000000ull) {
				CHECK((int32_t)(w - seen) >= 0, "the word went back: %u after %u", w,
				      seen);
				seen = w;
			}
			CHECK((int32_t)(w - (uint32_t)tk[i]) >= 0, "round %d: the word %u never "
			      "reached ticket %llu", round, w, (unsigned long long)tk[i]);
			char what[64];
			snprintf(what, sizeof(what), "done word round %d batch %d", round, i);
			check_outputs(&b[i], what);
		}
		for (int i = 0; i < 4; i++)
			CHECK(moet_cpuexec_wait(ex, tk[i]) == 0, "wait: %s", moet_errmsg());
		CHECK(word == (uint32_t)tk[3], "round %d: word %u, last ticket %llu", round, word,
		      (unsigned long long)tk[3]);
	}
	moet_cpuexec_set_done_word(ex, NULL);
	const uint32_t before = word;
	uint64_t tk = 0;
	CHECK(ex && moet_cpuexec_submit(ex, b[0].jobs, b[0].n, &tk) == 0 &&
	      moet_cpuexec_wait(ex, tk) == 0 && word == before, "unset: the word %u -> %u",
	      before, word);
	moet_cpuexec_destroy(ex);
	for (int i = 0; i < 4; i++)
		free_batch(&b[i]);
}

static void fp_environment(void)
{
	const unsigned csr = _mm_getcsr();
	static const struct {
		unsigned bits;
		const char *word;
	} bad[] = { { 0x8000u, "flush-to-zero" }, { 0x0040u, "denormals-are-zero" },
		    { 0x6000u, "round-to-nearest" } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		moet_cpuexec *ex = NULL;
		moet_cpuexec_opts o = { .n_threads = 2 };
		_mm_setcsr(csr | bad[i].bits);
		int rc = moet_cpuexec_create(&o, &ex);
		_mm_setcsr(csr);
		CHECK(rc == MOET_EINVAL && !ex, "MXCSR |= 0x%x: create gave %d", bad[i].bits, rc);
		CHECK(strstr(moet_errmsg(), bad[i].word) && strstr(moet_errmsg(), "worker"),
		      "detail: %s", moet_errmsg());
		moet_cpuexec_destroy(ex);
	}
}

static void gate_up_sets_ftz(const moet_mat *gate, const moet_mat *up, int64_t r0, int64_t r1,
			     const float *x, int64_t x_stride, int64_t n_tok, float *h,
			     int64_t h_stride)
{
	moet_cpu_kernels_ref.gate_up(gate, up, r0, r1, x, x_stride, n_tok, h, h_stride);
	_mm_setcsr(_mm_getcsr() | 0x8000u);
}

/* A kernel variant that leaves FTZ on fails its batch (wait's error code). */
static void kernel_breaks_mxcsr(void)
{
	moet_cpu_kernels k = moet_cpu_kernels_ref;
	k.isa = "ftz-test";
	k.gate_up = gate_up_sets_ftz;
	moet_cpuexec *ex = make_exec(2, MOET_CPUEXEC_SPLIT_ROWS, &k);
	if (!ex)
		return;
	CHECK(moet_cpuexec_kernels(ex) == &k, "kernel table in use");
	batch b;
	make_batch(&b, 2, MOET_DT_F8_E4M3, 128, 128, 2);
	uint64_t tk;
	CHECK(moet_cpuexec_submit(ex, b.jobs, 2, &tk) == 0, "submit");
	int rc = moet_cpuexec_wait(ex, tk);
	CHECK(rc == MOET_EINVAL, "wait gave %d", rc);
	CHECK(strstr(moet_errmsg(), "flush-to-zero") != NULL, "detail: %s", moet_errmsg());
	moet_cpuexec_destroy(ex);
	free_batch(&b);
}
#endif

static void create_destroy_loop(void)
{
	batch b;
	make_batch(&b, 2, MOET_DT_BF16, 128, 64, 2);
	for (int i = 0; i < 25; i++) {
		moet_cpuexec *ex = make_exec(1 + i % 3, 0, NULL);
		if (!ex)
			break;
		if (i % 5 == 0) {
			uint64_t tk;
			CHECK(moet_cpuexec_submit(ex, b.jobs, 2, &tk) == 0, "submit");
			/* destroy finishes the batch nobody waits for */
		}
		moet_cpuexec_destroy(ex);
	}
	moet_cpuexec_destroy(NULL);
	free_batch(&b);
}


/* MOET_CPU_SPIN / MOET_CPU_WAIT_SPIN: bad values refused naming the variable; with spins
 * off (sleep at once) and long, the bits are the reference's; moet_cpuexec_wait_span's span
 * lies between the submit and the wait's return. */
static void spins_and_span(void)
{
	const char *bad[] = { "x", "-1", "12a", "2000000000" };
	const char *var[] = { "MOET_CPU_SPIN", "MOET_CPU_WAIT_SPIN", "MOET_CPU_PREWAKE" };
	for (int v = 0; v < 3; v++)
		for (int i = 0; i < 4; i++) {
			setenv(var[v], bad[i], 1);
			moet_cpuexec *ex = NULL;
			moet_cpuexec_opts o = { .n_threads = 2 };
			CHECK(moet_cpuexec_create(&o, &ex) == MOET_EINVAL && !ex, "%s='%s' accepted",
			      var[v], bad[i]);
			CHECK(strstr(moet_errmsg(), var[v]) != NULL, "detail: %s", moet_errmsg());
			unsetenv(var[v]);
		}
	const char *spin[][2] = { { "0", "0" }, { "1000000", "1000000" }, { "", "" } };
	for (int c = 0; c < 3; c++) {
		setenv("MOET_CPU_SPIN", spin[c][0], 1);
		setenv("MOET_CPU_WAIT_SPIN", spin[c][1], 1);
		moet_cpuexec *ex = make_exec(3, MOET_CPUEXEC_SPLIT_ROWS, NULL);
		unsetenv("MOET_CPU_SPIN");
		unsetenv("MOET_CPU_WAIT_SPIN");
		if (!ex)
			continue;
		batch b;
		make_batch(&b, 3, MOET_DT_F8_E4M3, 96, 160, 3);
		for (int round = 0; round < 3; round++) {
			clear_outputs(&b);
			uint64_t tk = 0, f = 0, l = 0, t0 = moet_now_ns();
			CHECK(moet_cpuexec_submit(ex, b.jobs, b.n, &tk) == 0, "submit: %s",
			      moet_errmsg());
			CHECK(moet_cpuexec_wait_span(ex, tk, &f, &l) == 0, "wait: %s", moet_errmsg());
			uint64_t t1 = moet_now_ns();
			CHECK(t0 <= f && f <= l && l <= t1,
			      "spins %s/%s: span [%llu, %llu] outside [%llu, %llu]", spin[c][0],
			      spin[c][1], (unsigned long long)f, (unsigned long long)l,
			      (unsigned long long)t0, (unsigned long long)t1);
			check_outputs(&b, "spins");
		}
		free_batch(&b);
		moet_cpuexec_destroy(ex);
	}
}

/* MOET_CPU_ITEMS: items per worker and phase of a rows split; bad values refused naming the
 * variable; at every value (one item per worker to sixteen) the bits are the reference's, for
 * batches whose rows make items of 16 rows (the floor) up to whole matrices. */
static void items_per_worker(void)
{
	const char *bad[] = { "0", "3", "32", "four" };
	for (int i = 0; i < 4; i++) {
		setenv("MOET_CPU_ITEMS", bad[i], 1);
		moet_cpuexec *ex = NULL;
		moet_cpuexec_opts o = { .n_threads = 2 };
		CHECK(moet_cpuexec_create(&o, &ex) == MOET_EINVAL && !ex, "MOET_CPU_ITEMS='%s' "
		      "accepted", bad[i]);
		CHECK(strstr(moet_errmsg(), "MOET_CPU_ITEMS='") != NULL, "detail: %s",
		      moet_errmsg());
		unsetenv("MOET_CPU_ITEMS");
	}
	const char *good[] = { "1", "2", "4", "8", "16", "" };
	for (int g = 0; g < 6; g++) {
		setenv("MOET_CPU_ITEMS", good[g], 1);
		moet_cpuexec *ex = make_exec(3, MOET_CPUEXEC_SPLIT_ROWS, NULL);
		unsetenv("MOET_CPU_ITEMS");
		if (!ex)
			continue;
		for (int d = 0; d < 2; d++) {
			batch b;
			make_batch(&b, 1 + g % 3 + d, d ? MOET_DT_BF16 : MOET_DT_F8_E4M3, 256, 384,
				   1 + 2 * d);
			clear_outputs(&b);
			uint64_t tk = 0;
			CHECK(moet_cpuexec_submit(ex, b.jobs, b.n, &tk) == 0 &&
			      moet_cpuexec_wait(ex, tk) == 0, "MOET_CPU_ITEMS=%s: %s", good[g],
			      moet_errmsg());
			check_outputs(&b, "MOET_CPU_ITEMS");
			free_batch(&b);
		}
		moet_cpuexec_destroy(ex);
	}
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* MOET_CPU_PREWAKE: with workers that sleep at once (MOET_CPU_SPIN=0), moet_cpuexec_prewake
 * wakes every one of them (counted), a batch submitted after it gives the reference's bits,
 * one that never comes leaves them asleep again, and the team stops cleanly while they spin;
 * with the default (0) the call wakes nobody. */
static void prewake(void)
{
	for (int on = 0; on < 2; on++) {
		setenv("MOET_CPU_SPIN", "0", 1);
		if (on)
			setenv("MOET_CPU_PREWAKE", "100000000", 1);
		moet_cpuexec *ex = make_exec(3, MOET_CPUEXEC_SPLIT_ROWS, NULL);
		unsetenv("MOET_CPU_SPIN");
		unsetenv("MOET_CPU_PREWAKE");
		if (!ex)
			continue;
		batch b;
		make_batch(&b, 3, MOET_DT_F8_E4M3, 96, 160, 3);
		for (int round = 0; round < 3; round++) {
			sleep_ms(20); /* the workers asleep */
			const uint64_t w0 = moet_cpuexec_prewoken(ex);
			moet_cpuexec_prewake(ex);
			uint64_t w = w0;
			for (int i = 0; i < 200 && w < w0 + 3 * on; i++) {
				sleep_ms(5);
				w = moet_cpuexec_prewoken(ex);
			}
			CHECK(on ? w >= w0 + 3 : w == w0, "prewake %s: %llu workers woke, want %s",
			      on ? "on" : "off", (unsigned long long)(w - w0), on ? ">= 3" : "0");
			clear_outputs(&b);
			uint64_t tk = 0;
			CHECK(moet_cpuexec_submit(ex, b.jobs, b.n, &tk) == 0 &&
			      moet_cpuexec_wait(ex, tk) == 0, "prewake: %s", moet_errmsg());
			check_outputs(&b, "prewake");
		}
		moet_cpuexec_prewake(ex); /* no batch follows: stopped while spinning */
		free_batch(&b);
		moet_cpuexec_destroy(ex);
	}
	moet_cpuexec_prewake(NULL);
	CHECK(moet_cpuexec_prewoken(NULL) == 0, "NULL executor");
}

int main(void)
{
	identity();
	in_flight();
	pipelined();
	done_word();
	two_submitters();
	binding();
	errors();
#if defined(__x86_64__)
	fp_environment();
	kernel_breaks_mxcsr();
#endif
	create_destroy_loop();
	spins_and_span();
	items_per_worker();
	prewake();
	return moet_test_done("test_exec");
}
