/*
 * sched.c: the engine thread and the queue of the scheduler (moet_sched.h).
 *
 * One lock (s->mu) guards the queue, the running set, every request's fields and the stats;
 * the engine drops it only for the forward pass. A step:
 *
 *   lock: finish released requests (their KV blocks back to the pool)
 *         admit queued requests in order while their blocks fit (reserved + need <= blocks)
 *         plan: every decoding request 1 token, then prefill chunks in admission order
 *               within max_batch_tokens (a chunk that ends its prompt asks for its next
 *               token: drawn by the backend where the logits are, or the logits row to
 *               the host when the request wants logprobs)
 *   unlock: moet_model_forward_batch(all of it)
 *   lock: the drawn token, or a host draw (seeded by position) with logprobs; text, stop,
 *         EOS, max_tokens;
 *         broadcast to the pollers
 *
 * KV: one block pool of the whole budget (moet_kv_pool, allocated at create). A request's
 * cache (moet_kv_create_in) takes blocks as its positions are written and gives them all back
 * when it finishes. Admission reserves ceil((prompt + max_tokens) / block) blocks, first come
 * first served (a request whose blocks are not free waits in the queue); the reservations
 * never pass the pool, so a running request always finds its next block and the forward
 * pass never meets a full pool.
 *   NOTE: reserving the worst case keeps decoding free of preemption (no request has to be
 *   evicted and recomputed); what paging buys today is no per-request allocation and no
 *   fragmentation: any freed block serves any later request.
 * Invariants (stats, in blocks): used + free = blocks, used <= reserved <= blocks, and
 * kv_in_use equals the running count: a lost block or cache would show.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moet_err.h"
#include "sched_int.h"

struct moet_sched {
	moet_model *m;
	const moet_tokenizer *tok;
	moet_sched_opts o;
	int64_t vocab, max_pos;
	pthread_t thread;
	int started, stop;
	pthread_mutex_t mu;
	pthread_cond_t work;         /* the engine waits here */
	pthread_cond_t news;         /* pollers wait here */
	moet_sched_req **queue;      /* [max_requests], FIFO */
	int n_queue;
	moet_sched_req **run;        /* [max_requests], admission order */
	int n_run;
	moet_kv_pool *kvp;           /* every request's KV blocks */
	int64_t block;               /* positions per block */
	moet_sched_stats st;
	double rate_t0;              /* tokens/s window */
	double resident_t0;          /* the last residency check (o.resident_check_s) */
	int resident_failed;         /* a check failed (said once on stderr) */
	uint64_t rate_tok0;
	/* engine-only scratch */
	moet_seq_step *steps;
	moet_sched_req **step_req;
	float *logits;               /* [max_requests][vocab] */
	int64_t *scratch;            /* [vocab] */
};

/* The residency check's sampling: one page in this many of each expert tensor (at least one
 * per tensor: a Kimi-K2 CPU tier's ~95,000 tensors, one mincore call each), the phase
 * advancing per check. */
#define RESIDENT_STRIDE 4096

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *moet_sched_finish_name(int finish)
{
	switch (finish) {
	case MOET_SCHED_FINISH_LENGTH: return "length";
	case MOET_SCHED_FINISH_STOP: return "stop";
	case MOET_SCHED_FINISH_CANCELLED: return "cancelled";
	case MOET_SCHED_FINISH_ERROR: return "error";
	default: return "running";
	}
}

static void req_free(moet_sched_req *r)
{
	free(r->prompt);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->toks);
	free(r->text);
	free(r->pend);
	moet_detok_free(&r->dt);
	free(r);
}

/* Drops one reference (lock held). */
static void req_unref(moet_sched_req *r)
{
	if (--r->refs == 0)
		req_free(r);
}

/* ---- KV blocks (lock held) ------------------------------------------------------------ */

/* The block counts of the stats, from the pool (the engine thread's: only it changes it). */
static void kv_stats(moet_sched *s)
{
	s->st.kv_blocks_free = moet_kv_pool_free_blocks(s->kvp);
	s->st.kv_blocks_used = s->st.kv_blocks - s->st.kv_blocks_free;
	s->st.kv_reserved = s->st.kv_blocks_reserved * s->block;
}

/* A cache for r with `need` positions' blocks reserved; 1 when they are not free yet. */
static int kv_acquire(moet_sched *s, moet_sched_req *r, int64_t need)
{
	const int64_t nb = (need + s->block - 1) / s->block;
	if (s->st.kv_blocks_reserved + nb > s->st.kv_blocks)
		return 1;
	int rc = moet_kv_create_in(s->kvp, need, &r->kv);
	if (rc)
		return rc;
	r->kv_cap = nb * s->block;
	s->st.kv_blocks_reserved += nb;
	s->st.kv_in_use++;
	return 0;
}

/* The request is over: KV back to the pool, out of the running set, pollers told. */
static void finish(moet_sched *s, moet_sched_req *r, int why)
{
	if (r->finish == MOET_SCHED_RUNNING)
		r->finish = why;
	if (r->finish != MOET_SCHED_FINISH_CANCELLED && r->finish != MOET_SCHED_FINISH_ERROR &&
	    sched_text_finish(r, s->tok)) {
		r->finish = MOET_SCHED_FINISH_ERROR;
		snprintf(r->error, sizeof(r->error), "out of memory for the text");
	}
	if (r->kv) {
		s->st.kv_blocks_reserved -= r->kv_cap / s->block;
		s->st.kv_in_use--;
		moet_kv_destroy(r->kv); /* its blocks back to the pool */
		r->kv = NULL;
		kv_stats(s);
	}
	r->state = REQ_DONE;
	if (r->finish == MOET_SCHED_FINISH_CANCELLED)
		s->st.requests_cancelled++;
	else if (r->finish == MOET_SCHED_FINISH_ERROR)
		s->st.requests_failed++;
	else
		s->st.requests_done++;
	pthread_cond_broadcast(&s->news);
	req_unref(r);
}

/* ---- the engine ----------------------------------------------------------------------- */

/* Cancellations, then admissions (lock held). */
static void admit(moet_sched *s)
{
	int o = 0;
	for (int i = 0; i < s->n_run; i++) {
		if (s->run[i]->released)
			finish(s, s->run[i], MOET_SCHED_FINISH_CANCELLED);
		else
			s->run[o++] = s->run[i];
	}
	s->n_run = o;
	o = 0;
	int blocked = 0;
	for (int i = 0; i < s->n_queue; i++) {
		moet_sched_req *r = s->queue[i];
		if (r->released) {
			finish(s, r, MOET_SCHED_FINISH_CANCELLED);
			continue;
		}
		int rc = blocked ? 1 : kv_acquire(s, r, r->n_prompt + r->max_tokens);
		if (rc < 0) {
			snprintf(r->error, sizeof(r->error), "KV cache: %s", moet_errmsg());
			finish(s, r, MOET_SCHED_FINISH_ERROR);
		} else if (rc == 0) {
			r->state = REQ_PREFILL;
			s->run[s->n_run++] = r;
		} else {
			blocked = 1; /* first come, first served: no overtaking */
			s->queue[o++] = r;
		}
	}
	s->n_queue = o;
	s->st.queued = s->n_queue;
	s->st.running = s->n_run;
	kv_stats(s);
}

/* The entry's next token: drawn where the logits are (moet_backend_draw: on CUDA only the id
 * comes back), or, when the request wants logprobs, its logits row to the host. */
static void want_token(moet_sched *s, moet_sched_req *r, moet_seq_step *st, int n)
{
	if (r->top_logprobs >= 0) {
		st->out_logits = s->logits + (size_t)n * s->vocab;
	} else {
		st->sample = &r->sp;
		st->out_token = &r->drawn;
	}
}

/* One forward call's entries (lock held). Returns the number of entries. */
static int plan(moet_sched *s, int64_t *out_tokens)
{
	int n = 0;
	int64_t used = 0;
	for (int i = 0; i < s->n_run; i++) {
		moet_sched_req *r = s->run[i];
		if (r->state != REQ_DECODE)
			continue;
		s->steps[n] = (moet_seq_step){ .kv = r->kv, .tokens = &r->last_tok, .n_tok = 1,
					       .last_only = 1 };
		want_token(s, r, &s->steps[n], n);
		s->step_req[n++] = r;
		used++;
	}
	/* NOTE: prefill always gets at least a quarter of the budget, so that a full house of
	 * decodes cannot starve a new request's prompt. */
	int64_t budget = s->o.max_batch_tokens - used;
	if (budget < s->o.max_batch_tokens / 4 + 1)
		budget = s->o.max_batch_tokens / 4 + 1;
	for (int i = 0; i < s->n_run && budget > 0; i++) {
		moet_sched_req *r = s->run[i];
		if (r->state != REQ_PREFILL)
			continue;
		int64_t chunk = r->n_prompt - r->n_fed;
		chunk = chunk < budget ? chunk : budget;
		int last = r->n_fed + chunk == r->n_prompt;
		s->steps[n] = (moet_seq_step){ .kv = r->kv, .tokens = r->prompt + r->n_fed,
					       .n_tok = chunk, .last_only = 1 };
		if (last)
			want_token(s, r, &s->steps[n], n);
		s->step_req[n++] = r;
		budget -= chunk;
		used += chunk;
	}
	*out_tokens = used;
	return n;
}

static int grow_toks(moet_sched_req *r)
{
	if (r->n_toks < r->cap_toks)
		return 0;
	size_t c = r->cap_toks ? 2 * r->cap_toks : 16;
	moet_sched_token *t = realloc(r->toks, c * sizeof(*t));
	if (!t)
		return MOET_ENOMEM;
	r->toks = t;
	r->cap_toks = c;
	return 0;
}

/* After the forward call: one new token for every entry that asked for logits. */
static void consume(moet_sched *s, int n)
{
	const moet_config *c = moet_model_config(s->m);
	for (int e = 0; e < n; e++) {
		moet_sched_req *r = s->step_req[e];
		const moet_seq_step *st = &s->steps[e];
		if (r->state == REQ_PREFILL) {
			r->n_fed += st->n_tok;
			s->st.tokens_prefilled += (uint64_t)st->n_tok;
			if (!st->out_logits && !st->out_token)
				continue;
			r->state = REQ_DECODE;
		}
		int64_t id = r->drawn;
		int rc = st->out_token ? 0 : moet_sample(st->out_logits, s->vocab, &r->sp,
							 moet_kv_len(r->kv), s->scratch, &id);
		if (!rc)
			rc = grow_toks(r);
		if (rc) {
			snprintf(r->error, sizeof(r->error), "sampling: %s", moet_strerror(rc));
			r->finish = MOET_SCHED_FINISH_ERROR;
			continue;
		}
		moet_sched_token *t = &r->toks[r->n_toks++];
		memset(t, 0, sizeof(*t));
		t->id = (int32_t)id;
		if (r->top_logprobs >= 0)
			sched_logprobs(st->out_logits, s->vocab, t->id, r->top_logprobs, t);
		r->last_tok = id;
		r->n_generated++;
		s->st.tokens_generated++;
		int eos = !r->ignore_eos && id == c->eos_token_id;
		if (!eos && sched_text_push(r, s->tok, t->id)) {
			snprintf(r->error, sizeof(r->error), "out of memory for the text");
			r->finish = MOET_SCHED_FINISH_ERROR;
		}
		if (r->finish == MOET_SCHED_RUNNING && eos)
			r->finish = MOET_SCHED_FINISH_STOP;
		if (r->finish == MOET_SCHED_RUNNING && r->n_generated >= r->max_tokens)
			r->finish = MOET_SCHED_FINISH_LENGTH;
	}
	int o = 0;
	for (int i = 0; i < s->n_run; i++) {
		if (s->run[i]->finish != MOET_SCHED_RUNNING)
			finish(s, s->run[i], s->run[i]->finish);
		else
			s->run[o++] = s->run[i];
	}
	s->n_run = o;
	s->st.running = o;
}

static void fail_batch(moet_sched *s, int n, int rc)
{
	for (int e = 0; e < n; e++) {
		moet_sched_req *r = s->step_req[e];
		snprintf(r->error, sizeof(r->error), "forward pass: %s",
			 moet_errmsg()[0] ? moet_errmsg() : moet_strerror(rc));
		r->finish = MOET_SCHED_FINISH_ERROR;
	}
	consume(s, 0);
}

static void *engine(void *arg)
{
	moet_sched *s = arg;
	pthread_mutex_lock(&s->mu);
	while (!s->stop) {
		admit(s);
		if (!s->n_run) {
			pthread_cond_wait(&s->work, &s->mu);
			continue;
		}
		int64_t n_tok;
		int n = plan(s, &n_tok), n_dec = 0;
		while (n_dec < n && s->step_req[n_dec]->state == REQ_DECODE)
			n_dec++;
		pthread_mutex_unlock(&s->mu);
		double t0 = now_s();
		int rc = moet_model_forward_batch(s->m, s->steps, n);
		double t1 = now_s();
		if (s->o.on_step) {
			const moet_sched_step_info si = { .entries = s->steps, .n = n,
							  .n_decode = n_dec, .n_tokens = n_tok,
							  .t_start_s = t0, .forward_s = t1 - t0,
							  .rc = rc };
			s->o.on_step(s->o.on_step_ctx, &si);
		}
		uint64_t tiers[MOET_SCHED_MAX_TIERS];
		moet_model_tier_counts(s->m, tiers, s->st.n_tiers);
		moet_hybrid_stats hs;
		moet_model_hybrid_stats(s->m, &hs, 0);
		/* the CPU tier still resident? (between steps, on the engine's thread; a failed
		 * check leaves the last report and is said once) */
		moet_resident_report res;
		const int check = s->o.resident_check_s > 0 &&
				  t1 - s->resident_t0 >= s->o.resident_check_s;
		if (check) {
			s->resident_t0 = t1;
			const uint64_t lost0 = s->st.resident.evicted_ranges;
			if (moet_model_resident_check(s->m, RESIDENT_STRIDE) && !s->resident_failed) {
				s->resident_failed = 1;
				fprintf(stderr, "serve: %s\n", moet_errmsg());
			}
			moet_model_resident_report(s->m, &res);
			if (res.evicted_ranges && !lost0)
				fprintf(stderr, "serve: %llu of the CPU tier's expert tensors lost pages "
					"to the kernel since the start (e.g. %s): their next reads come "
					"from the file; MOET_CPU_RESIDENT=lock keeps them (docs/residency.md)"
					"\n", (unsigned long long)res.evicted_ranges, res.evicted_example);
		}
		pthread_mutex_lock(&s->mu);
		if (check)
			s->st.resident = res;
		s->st.hybrid = hs;
		moet_model_shadow_stats(s->m, &s->st.shadow);
		if (rc)
			fail_batch(s, n, rc);
		else
			consume(s, n);
		kv_stats(s);
		memcpy(s->st.tier_pairs, tiers, sizeof(uint64_t) * (size_t)s->st.n_tiers);
		double t2 = now_s();
		s->st.steps++;
		s->st.forward_s += t1 - t0;
		s->st.step_s += t2 - t0;
		s->st.last_batch_seqs = n;
		s->st.last_batch_tokens = n_tok;
		if (t2 - s->rate_t0 >= 2.0) {
			s->st.tokens_per_s = (double)(s->st.tokens_generated - s->rate_tok0) /
					     (t2 - s->rate_t0);
			s->rate_t0 = t2;
			s->rate_tok0 = s->st.tokens_generated;
		}
		pthread_cond_broadcast(&s->news);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* ---- the public side -------------------------------------------------------------------- */

int moet_sched_create(moet_model *m, const moet_tokenizer *tok, const moet_sched_opts *o,
		      moet_sched **out)
{
	moet_sched *s = calloc(1, sizeof(*s));
	if (!s)
		return moet_err(MOET_ENOMEM, "scheduler");
	s->m = m;
	s->tok = tok;
	s->o = *o;
	if (!s->o.max_requests)
		s->o.max_requests = 64;
	if (!s->o.max_batch_tokens)
		s->o.max_batch_tokens = 256;
	int rc = 0, mr = s->o.max_requests;
	/* NOTE: the default budget is what fits beside the model (90% of the backend's free
	 * memory, at most 16384 positions): in the expanded MLA form a DeepSeek-V3-size model
	 * takes about 10 MB per position, so a fixed 16384 would not start on any GPU */
	if (!s->o.kv_tokens &&
	    (rc = moet_kv_fit_tokens(m, 0.9, MOET_SCHED_KV_TOKENS, 2 * (int64_t)mr,
				     &s->o.kv_tokens, NULL)))
		goto fail;
	const moet_config *c = moet_model_config(m);
	s->vocab = c->vocab_size;
	s->max_pos = c->max_position_embeddings;
	s->st.n_tiers = 1 + s->o.n_devices;
	s->rate_t0 = s->resident_t0 = now_s();
	moet_model_resident_report(m, &s->st.resident);
	if (mr < 1 || mr > 4096 || s->o.kv_tokens < 2 || s->o.max_batch_tokens < 1 ||
	    s->o.kv_block < 0 || s->o.n_devices < 0 || s->o.n_devices >= MOET_SCHED_MAX_TIERS) {
		rc = moet_err(MOET_EINVAL, "scheduler: max_requests %d, kv_tokens %lld, kv_block "
			      "%lld, max_batch_tokens %lld or devices %d out of range", mr,
			      (long long)s->o.kv_tokens, (long long)s->o.kv_block,
			      (long long)s->o.max_batch_tokens, s->o.n_devices);
		goto fail;
	}
	/* NOTE: the default block (64 positions) halves while the budget holds fewer blocks
	 * than max_requests, so that a small budget still serves several requests at once */
	if (!s->o.kv_block)
		for (s->o.kv_block = MOET_KV_BLOCK_TOKENS;
		     s->o.kv_block > 1 && s->o.kv_tokens / s->o.kv_block < mr; s->o.kv_block /= 2)
			;
	if ((rc = moet_kv_pool_create(m, s->o.kv_tokens, s->o.kv_block, &s->kvp)))
		goto fail;
	s->block = s->o.kv_block;
	s->st.kv_block = s->block;
	s->st.kv_blocks = moet_kv_pool_blocks(s->kvp);
	s->o.kv_tokens = s->st.kv_blocks * s->block; /* whole blocks: the effective budget */
	s->st.kv_tokens = s->o.kv_tokens;
	kv_stats(s);
	s->queue = calloc((size_t)mr, sizeof(*s->queue));
	s->run = calloc((size_t)mr, sizeof(*s->run));
	s->steps = calloc((size_t)mr, sizeof(*s->steps));
	s->step_req = calloc((size_t)mr, sizeof(*s->step_req));
	s->logits = malloc((size_t)mr * (size_t)s->vocab * sizeof(float));
	s->scratch = malloc((size_t)s->vocab * sizeof(int64_t));
	if (!s->queue || !s->run || !s->steps || !s->step_req || !s->logits || !s->scratch) {
		rc = moet_err(MOET_ENOMEM, "scheduler buffers for %d requests", mr);
		goto fail;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->news, NULL);
	if (pthread_create(&s->thread, NULL, engine, s)) {
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->work);
		pthread_cond_destroy(&s->news);
		rc = moet_err(MOET_ENOMEM, "scheduler: cannot start the engine thread");
		goto fail;
	}
	s->started = 1;
	*out = s;
	return 0;
fail:
	moet_sched_destroy(s);
	return rc;
}

void moet_sched_destroy(moet_sched *s)
{
	if (!s)
		return;
	if (s->started) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		pthread_cond_signal(&s->work);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->thread, NULL);
		/* NOTE: every handle has been released (the contract), so the running and queued
		 * requests left are cancelled ones the engine had not reached yet. */
		for (int i = 0; i < s->n_run; i++)
			finish(s, s->run[i], MOET_SCHED_FINISH_CANCELLED);
		for (int i = 0; i < s->n_queue; i++)
			finish(s, s->queue[i], MOET_SCHED_FINISH_CANCELLED);
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->work);
		pthread_cond_destroy(&s->news);
	}
	moet_kv_pool_destroy(s->kvp);
	free(s->queue);
	free(s->run);
	free(s->steps);
	free(s->step_req);
	free(s->logits);
	free(s->scratch);
	free(s);
}

void moet_sched_get_opts(const moet_sched *s, moet_sched_opts *out)
{
	*out = s->o;
}

static int check_params(const moet_sched *s, const moet_sched_params *p)
{
	if (p->n_prompt < 1)
		return moet_err(MOET_EINVAL, "prompt: empty");
	for (int64_t i = 0; i < p->n_prompt; i++)
		if (p->prompt[i] < 0 || p->prompt[i] >= s->vocab)
			return moet_err(MOET_EINVAL, "prompt[%lld]: token id %lld is outside [0, %lld)",
					(long long)i, (long long)p->prompt[i],
					(long long)s->vocab);
	if (p->max_tokens < 1)
		return moet_err(MOET_EINVAL, "max_tokens: %lld is not >= 1",
				(long long)p->max_tokens);
	int64_t need = p->n_prompt + p->max_tokens;
	if (need > s->o.kv_tokens || need > s->max_pos)
		return moet_err(MOET_EINVAL, "prompt (%lld tokens) + max_tokens (%lld) = %lld is "
				"more than the context of %lld tokens", (long long)p->n_prompt,
				(long long)p->max_tokens, (long long)need,
				(long long)(s->o.kv_tokens < s->max_pos ? s->o.kv_tokens
									: s->max_pos));
	if (p->n_stop < 0 || p->n_stop > MOET_SCHED_MAX_STOP)
		return moet_err(MOET_EINVAL, "stop: at most %d strings", MOET_SCHED_MAX_STOP);
	for (int i = 0; i < p->n_stop; i++) {
		size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
		if (n < 1 || n > MOET_SCHED_MAX_STOP_LEN ||
		    moet_utf8_valid_prefix(p->stop[i], n) != n)
			return moet_err(MOET_EINVAL, "stop[%d]: must be valid UTF-8 of 1 to %d "
					"bytes", i, MOET_SCHED_MAX_STOP_LEN);
	}
	if (p->top_logprobs < -1 || p->top_logprobs > MOET_SCHED_MAX_TOP)
		return moet_err(MOET_EINVAL, "top_logprobs: %d is outside [0, %d]",
				p->top_logprobs, MOET_SCHED_MAX_TOP);
	return moet_sample_check(&p->sp);
}

int moet_sched_submit(moet_sched *s, const moet_sched_params *p, moet_sched_req **out)
{
	int rc = check_params(s, p);
	if (rc)
		return rc;
	moet_sched_req *r = calloc(1, sizeof(*r));
	if (!r)
		return moet_err(MOET_ENOMEM, "request");
	r->s = s;
	r->refs = 2;
	r->n_prompt = p->n_prompt;
	r->max_tokens = p->max_tokens;
	r->sp = p->sp;
	r->top_logprobs = p->top_logprobs;
	r->ignore_eos = p->ignore_eos;
	if (s->tok)
		moet_detok_init(&r->dt, s->tok, 1);
	if (!(r->prompt = malloc((size_t)p->n_prompt * sizeof(int64_t))))
		goto nomem;
	memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof(int64_t));
	for (int i = 0; i < p->n_stop; i++, r->n_stop++) {
		if (!(r->stop[i] = strdup(p->stop[i])))
			goto nomem;
		r->stop_len[i] = strlen(p->stop[i]);
	}
	pthread_mutex_lock(&s->mu);
	if (s->n_queue + s->n_run >= s->o.max_requests) {
		pthread_mutex_unlock(&s->mu);
		req_free(r);
		return moet_err(MOET_ERANGE, "%d requests are running or queued (the limit)",
				s->o.max_requests);
	}
	s->queue[s->n_queue++] = r;
	s->st.queued = s->n_queue;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
	*out = r;
	return 0;
nomem:
	req_free(r);
	return moet_err(MOET_ENOMEM, "request");
}

/* The news of r into u (lock held); 1 when there is none. */
static int take(moet_sched_req *r, moet_sched_update *u)
{
	size_t nt = r->n_toks - r->toks_read, nx = r->n_text - r->text_read;
	int done = r->state == REQ_DONE;
	if (!nt && !nx && !done)
		return 1;
	if (nt && !(u->tokens = malloc(nt * sizeof(*u->tokens))))
		return MOET_ENOMEM;
	if (!(u->text = malloc(nx + 1))) {
		free(u->tokens);
		u->tokens = NULL;
		return MOET_ENOMEM;
	}
	if (nt)
		memcpy(u->tokens, r->toks + r->toks_read, nt * sizeof(*u->tokens));
	if (nx) /* r->text is NULL when no text was made (no tokenizer) */
		memcpy(u->text, r->text + r->text_read, nx);
	u->text[nx] = 0;
	u->n_tokens = nt;
	u->n_text = nx;
	r->toks_read = r->n_toks;
	r->text_read = r->n_text;
	u->finish = done ? r->finish : MOET_SCHED_RUNNING;
	snprintf(u->error, sizeof(u->error), "%s", r->error);
	u->n_prompt = r->n_prompt;
	u->n_generated = r->n_generated;
	return 0;
}

int moet_sched_poll(moet_sched_req *r, int timeout_ms, moet_sched_update *out)
{
	moet_sched *s = r->s;
	memset(out, 0, sizeof(*out));
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	if (timeout_ms > 0) {
		dl.tv_sec += timeout_ms / 1000;
		dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (dl.tv_nsec >= 1000000000L) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&s->mu);
	int rc;
	while ((rc = take(r, out)) == 1 && timeout_ms != 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&s->news, &s->mu);
		else if (pthread_cond_timedwait(&s->news, &s->mu, &dl) == ETIMEDOUT) {
			rc = take(r, out);
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return rc == MOET_ENOMEM ? moet_err(MOET_ENOMEM, "poll") : rc;
}

void moet_sched_update_free(moet_sched_update *u)
{
	free(u->tokens);
	free(u->text);
	u->tokens = NULL;
	u->text = NULL;
}

void moet_sched_release(moet_sched_req *r)
{
	if (!r)
		return;
	moet_sched *s = r->s;
	pthread_mutex_lock(&s->mu);
	r->released = 1;
	if (r->state != REQ_DONE)
		pthread_cond_signal(&s->work);
	req_unref(r);
	pthread_mutex_unlock(&s->mu);
}

void moet_sched_get_stats(moet_sched *s, moet_sched_stats *out)
{
	pthread_mutex_lock(&s->mu);
	*out = s->st;
	double t = now_s();
	/* NOTE: an idle server's rate decays to 0 instead of showing the last busy window */
	if (t - s->rate_t0 >= 2.0)
		out->tokens_per_s = (double)(s->st.tokens_generated - s->rate_tok0) /
				    (t - s->rate_t0);
	pthread_mutex_unlock(&s->mu);
}
