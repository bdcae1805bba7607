/*
 * serve_api.c: OpenAI's request and response shapes (serve_int.h), on jansson.
 *
 * Requests: every field we read is type-checked and range-checked, and a bad one is answered
 * 400 with the field named in "param" and the message; JSON null counts as absent (OpenAI's
 * SDKs send nulls). Fields we do not implement are refused when they would change the result
 * (n > 1, echo, best_of > 1, suffix, tools); other unknown fields are ignored, as OpenAI does.
 *
 *   /v1/completions        prompt: string | [token ids] | [one string]; BOS prepended to text
 *                          (DeepSeek-V3's add_bos_token); logprobs: int 0..20 (top N)
 *   /v1/chat/completions   messages -> moet_chat_encode (BOS from the template);
 *                          content: string | [{"type": "text", "text": ...}];
 *                          logprobs: bool, top_logprobs: int 0..20
 *   both                   model, max_tokens (max_completion_tokens), temperature [0, 2],
 *                          top_p (0, 1], top_k >= 0, seed, stop (string | <= 4 strings),
 *                          stream, stream_options.include_usage; vLLM's extensions
 *                          ignore_eos and return_tokens_as_token_ids
 *
 * Defaults: max_tokens 16 (completions, as OpenAI) or min(256, room left) (chat);
 * temperature 1, top_p 1, top_k 0; a request without a seed gets a fresh one.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moet_chat.h"
#include "moet_err.h"
#include "moet_json.h"
#include "serve_int.h"

int serve_fail(serve_error *e, int status, const char *type, const char *code,
	       const char *param, const char *fmt, ...)
{
	e->status = status;
	e->type = type;
	e->code = code;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -1;
}

int serve_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
	if (*len + n + 1 > *cap) {
		size_t c = *cap ? *cap : 256;
		while (c < *len + n + 1)
			c *= 2;
		char *b = realloc(*buf, c);
		if (!b)
			return -1;
		*buf = b;
		*cap = c;
	}
	memcpy(*buf + *len, s, n);
	*len += n;
	(*buf)[*len] = 0;
	return 0;
}

#define BAD(e, param, ...) serve_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

json_t *serve_json_text(const char *s, size_t n)
{
	size_t ok = moet_utf8_valid_prefix(s, n);
	if (ok == n)
		return json_stringn(s, n);
	char *b = malloc(3 * n + 1);
	if (!b)
		return NULL;
	size_t o = 0, i = 0;
	while (i < n) {
		size_t v = moet_utf8_valid_prefix(s + i, n - i);
		memcpy(b + o, s + i, v);
		o += v;
		i += v;
		if (i < n) {
			memcpy(b + o, "\xef\xbf\xbd", 3); /* U+FFFD for one bad byte */
			o += 3;
			i++;
		}
	}
	json_t *j = json_stringn(b, o);
	free(b);
	return j;
}

char *serve_error_body(const serve_error *e)
{
	json_t *j = json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message",
			      serve_json_text(e->message, strlen(e->message)), "type", e->type,
			      "param", e->param[0] ? json_string(e->param) : json_null(),
			      "code", e->code ? json_string(e->code) : json_null());
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return s;
}

/* ---- typed fields (null = absent) ---------------------------------------------------------- */

static const json_t *field(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);
	return v && !json_is_null(v) ? v : NULL;
}

static int get_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out,
		   serve_error *e)
{
	const json_t *v = field(o, k);
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return BAD(e, k, "'%s' must be an integer in [%lld, %lld], not %s", k,
			   (long long)lo, (long long)hi,
			   json_is_integer(v) ? "that value" : moet_json_kind(v));
	*out = json_integer_value(v);
	return 1;
}

static int get_num(const json_t *o, const char *k, double lo, double hi, int lo_open,
		   double *out, serve_error *e)
{
	const json_t *v = field(o, k);
	if (!v)
		return 0;
	double x = json_is_number(v) ? json_number_value(v) : 0;
	if (!json_is_number(v) || !(lo_open ? x > lo : x >= lo) || !(x <= hi))
		return BAD(e, k, "'%s' must be a number in %s%g, %g], not %s", k,
			   lo_open ? "(" : "[", lo, hi,
			   json_is_number(v) ? "that value" : moet_json_kind(v));
	*out = x;
	return 1;
}

static int get_bool(const json_t *o, const char *k, int *out, serve_error *e)
{
	const json_t *v = field(o, k);
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return BAD(e, k, "'%s' must be a boolean, not %s", k, moet_json_kind(v));
	*out = json_is_true(v);
	return 1;
}

/* ---- prompts ------------------------------------------------------------------------------ */

static int encode_text(const serve_info *si, const char *s, size_t n, serve_req *r,
		       serve_error *e)
{
	if (!si->tok)
		return BAD(e, "prompt", "this model has no tokenizer.json: send the prompt as a "
			   "list of token ids");
	int32_t *ids = NULL;
	size_t m = 0;
	if (moet_tokenizer_encode(si->tok, s, n, &ids, &m))
		return BAD(e, "prompt", "'prompt': %s", moet_errmsg());
	int bos = si->bos_id >= 0 && !(m && ids[0] == si->bos_id);
	r->prompt = malloc((m + (size_t)bos + 1) * sizeof(int64_t));
	if (!r->prompt) {
		free(ids);
		return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	}
	if (bos)
		r->prompt[0] = si->bos_id;
	for (size_t i = 0; i < m; i++)
		r->prompt[(size_t)bos + i] = ids[i];
	r->p.n_prompt = (int64_t)(m + (size_t)bos);
	free(ids);
	return 0;
}

static int parse_prompt(const serve_info *si, const json_t *root, serve_req *r, serve_error *e)
{
	const json_t *p = field(root, "prompt");
	if (!p)
		return BAD(e, "prompt", "'prompt' is required");
	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	if (json_is_string(p))
		return encode_text(si, json_string_value(p), json_string_length(p), r, e);
	if (!json_is_array(p))
		return BAD(e, "prompt", "'prompt' must be a string or a list of token ids, not %s",
			   moet_json_kind(p));
	size_t n = json_array_size(p);
	if (n == 0)
		return BAD(e, "prompt", "'prompt' is empty");
	if (!(r->prompt = malloc(n * sizeof(int64_t))))
		return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const json_t *v = json_array_get(p, i);
		if (json_is_string(v))
			return BAD(e, "prompt", "'prompt': one prompt per request (a list of %zu "
				   "strings was sent)", n);
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= si->vocab)
			return BAD(e, "prompt", "'prompt[%zu]' must be a token id in [0, %lld)", i,
				   (long long)si->vocab);
		r->prompt[i] = json_integer_value(v);
	}
	r->p.n_prompt = (int64_t)n;
	return 0;
}

/* content: a string, or a list of {"type": "text", "text": ...} parts joined. */
static int content_text(const json_t *c, size_t i, char **out, serve_error *e)
{
	char param[48];
	snprintf(param, sizeof(param), "messages[%zu].content", i);
	if (json_is_string(c)) {
		if (strlen(json_string_value(c)) != json_string_length(c))
			return BAD(e, param, "'%s' contains a NUL character", param);
		*out = strdup(json_string_value(c));
		return *out ? 0 : serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	}
	if (!json_is_array(c))
		return BAD(e, param, "'%s' must be a string or a list of text parts, not %s", param,
			   moet_json_kind(c));
	size_t len = 0;
	for (size_t k = 0; k < json_array_size(c); k++) {
		const json_t *part = json_array_get(c, k), *t = json_object_get(part, "text");
		const char *ty = json_string_value(json_object_get(part, "type"));
		if (!ty || strcmp(ty, "text") || !json_is_string(t) ||
		    strlen(json_string_value(t)) != json_string_length(t))
			return BAD(e, param, "'%s[%zu]' must be {\"type\": \"text\", \"text\": "
				   "string} (only text parts are supported)", param, k);
		len += json_string_length(t);
	}
	if (!(*out = malloc(len + 1)))
		return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	len = 0;
	for (size_t k = 0; k < json_array_size(c); k++) {
		const json_t *t = json_object_get(json_array_get(c, k), "text");
		memcpy(*out + len, json_string_value(t), json_string_length(t));
		len += json_string_length(t);
	}
	(*out)[len] = 0;
	return 0;
}

static int parse_messages(const serve_info *si, const json_t *root, serve_req *r,
			  serve_error *e)
{
	const json_t *ms = field(root, "messages");
	if (!ms)
		return BAD(e, "messages", "'messages' is required");
	if (!json_is_array(ms) || json_array_size(ms) == 0)
		return BAD(e, "messages", "'messages' must be a non-empty list, not %s",
			   json_is_array(ms) ? "an empty one" : moet_json_kind(ms));
	if (!si->tok)
		return BAD(e, "messages", "this model has no tokenizer.json: chat is not "
			   "available (use /v1/completions with token ids)");
	size_t n = json_array_size(ms);
	moet_chat_msg *cm = calloc(n, sizeof(*cm));
	char **texts = calloc(n, sizeof(*texts));
	int rc = 0;
	if (!cm || !texts)
		rc = serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	for (size_t i = 0; !rc && i < n; i++) {
		const json_t *m = json_array_get(ms, i), *role = json_object_get(m, "role");
		char param[48];
		snprintf(param, sizeof(param), "messages[%zu].role", i);
		if (!json_is_object(m))
			rc = BAD(e, "messages", "'messages[%zu]' must be an object, not %s", i,
				 moet_json_kind(m));
		else if (!json_is_string(role))
			rc = BAD(e, param, "'%s' must be a string", param);
		else {
			cm[i].role = json_string_value(role);
			const json_t *c = field(m, "content");
			if (c)
				rc = content_text(c, i, &texts[i], e);
			cm[i].content = texts[i];
		}
	}
	int32_t *ids = NULL;
	size_t m = 0;
	if (!rc && moet_chat_encode(si->tok, cm, n, 1, &ids, &m))
		rc = BAD(e, "messages", "'messages': %s", moet_errmsg());
	if (!rc && !(r->prompt = malloc((m ? m : 1) * sizeof(int64_t))))
		rc = serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	for (size_t i = 0; !rc && i < m; i++)
		r->prompt[i] = ids[i];
	r->p.n_prompt = (int64_t)m;
	free(ids);
	for (size_t i = 0; texts && i < n; i++)
		free(texts[i]);
	free(texts);
	free(cm);
	return rc;
}

static int parse_stop(const json_t *root, serve_req *r, serve_error *e)
{
	const json_t *s = field(root, "stop");
	if (!s)
		return 0;
	if (json_is_string(s)) {
		if (!(r->stop[0] = strdup(json_string_value(s))))
			return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
		r->p.n_stop = 1;
	} else if (json_is_array(s) && json_array_size(s) <= MOET_SCHED_MAX_STOP) {
		for (size_t i = 0; i < json_array_size(s); i++) {
			const json_t *v = json_array_get(s, i);
			if (!json_is_string(v))
				return BAD(e, "stop", "'stop[%zu]' must be a string, not %s", i,
					   moet_json_kind(v));
			if (!(r->stop[i] = strdup(json_string_value(v))))
				return serve_fail(e, 500, "server_error", NULL, NULL, "no memory");
			r->p.n_stop++;
		}
	} else {
		return BAD(e, "stop", "'stop' must be a string or a list of at most %d strings",
			   MOET_SCHED_MAX_STOP);
	}
	for (int i = 0; i < r->p.n_stop; i++) {
		size_t n = strlen(r->stop[i]);
		if (n == 0 || n > MOET_SCHED_MAX_STOP_LEN)
			return BAD(e, "stop", "'stop' strings must have 1 to %d bytes",
				   MOET_SCHED_MAX_STOP_LEN);
	}
	r->p.stop = (const char *const *)r->stop;
	return 0;
}

/* n, echo, best_of, suffix, tools: refused when they would change the answer. */
static int refuse_unsupported(const json_t *root, serve_error *e)
{
	int64_t v = 1;
	int b = 0;
	if (get_int(root, "n", 1, 1, &v, e) < 0)
		return BAD(e, "n", "'n' must be 1 (one choice per request is supported)");
	if (get_int(root, "best_of", 1, 1, &v, e) < 0)
		return BAD(e, "best_of", "'best_of' must be 1 (not supported)");
	if (get_bool(root, "echo", &b, e) < 0 || b)
		return BAD(e, "echo", "'echo' is not supported");
	if (field(root, "suffix"))
		return BAD(e, "suffix", "'suffix' is not supported");
	if (field(root, "tools") && json_array_size(field(root, "tools")))
		return BAD(e, "tools", "'tools' (tool calls) are not supported");
	return 0;
}

int serve_parse(const serve_info *si, const char *body, size_t n, int chat, serve_req *r,
		serve_error *e)
{
	memset(r, 0, sizeof(*r));
	r->chat = chat;
	r->created = (int64_t)time(NULL);
	snprintf(r->id, sizeof(r->id), "%s-%016llx", chat ? "chatcmpl" : "cmpl",
		 (unsigned long long)si->serial);
	r->p.sp = (moet_sample_params){ .temperature = 1.0, .top_k = 0, .top_p = 1.0,
					.seed = si->default_seed };
	r->p.top_logprobs = -1;
	json_error_t je;
	json_t *root = json_loadb(body, n, JSON_REJECT_DUPLICATES, &je);
	int rc = 0;
	if (!root)
		return BAD(e, NULL, "request body is not valid JSON: %s (line %d, column %d)",
			   je.text, je.line, je.column);
	if (!json_is_object(root)) {
		rc = BAD(e, NULL, "request body must be a JSON object, not %s",
			 moet_json_kind(root));
		goto out;
	}
	const json_t *model = field(root, "model");
	if (model && !json_is_string(model)) {
		rc = BAD(e, "model", "'model' must be a string, not %s", moet_json_kind(model));
		goto out;
	}
	if (model && strcmp(json_string_value(model), si->model_id)) {
		rc = serve_fail(e, 404, "invalid_request_error", "model_not_found", "model",
				"The model '%.100s' does not exist (this server has '%s')",
				json_string_value(model), si->model_id);
		goto out;
	}
	if ((rc = refuse_unsupported(root, e)) < 0)
		goto out;
	int64_t mt = -1, v = 0;
	int lp_bool = 0;
	if ((rc = get_int(root, "max_tokens", 1, INT32_MAX, &mt, e)) < 0 ||
	    (rc = get_int(root, "max_completion_tokens", 1, INT32_MAX, &mt, e)) < 0 ||
	    (rc = get_num(root, "temperature", 0, 2, 0, &r->p.sp.temperature, e)) < 0 ||
	    (rc = get_num(root, "top_p", 0, 1, 1, &r->p.sp.top_p, e)) < 0 ||
	    (rc = get_int(root, "top_k", 0, INT32_MAX, &r->p.sp.top_k, e)) < 0 ||
	    (rc = get_bool(root, "stream", &r->stream, e)) < 0 ||
	    (rc = get_bool(root, "ignore_eos", &r->p.ignore_eos, e)) < 0 ||
	    (rc = get_bool(root, "return_tokens_as_token_ids", &r->tokens_as_ids, e)) < 0 ||
	    (rc = parse_stop(root, r, e)) < 0)
		goto out;
	if ((rc = get_int(root, "seed", INT64_MIN, INT64_MAX, &v, e)) < 0)
		goto out;
	if (rc == 1)
		r->p.sp.seed = (uint64_t)v;
	rc = 0;
	const json_t *so = field(root, "stream_options");
	if (so && !json_is_object(so)) {
		rc = BAD(e, "stream_options", "'stream_options' must be an object");
		goto out;
	}
	if (so && (rc = get_bool(so, "include_usage", &r->include_usage, e)) < 0)
		goto out;
	if (chat) {
		if ((rc = get_bool(root, "logprobs", &lp_bool, e)) < 0)
			goto out;
		v = 0;
		if ((rc = get_int(root, "top_logprobs", 0, MOET_SCHED_MAX_TOP, &v, e)) < 0)
			goto out;
		if (rc == 1 && !lp_bool) {
			rc = BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
			goto out;
		}
		r->logprobs = lp_bool;
		r->p.top_logprobs = lp_bool ? (int)v : -1;
		rc = parse_messages(si, root, r, e);
	} else {
		if ((rc = get_int(root, "logprobs", 0, MOET_SCHED_MAX_TOP, &v, e)) < 0)
			goto out;
		r->logprobs = rc == 1;
		r->p.top_logprobs = rc == 1 ? (int)v : -1;
		rc = parse_prompt(si, root, r, e);
	}
	if (rc < 0)
		goto out;
	if (r->p.n_prompt < 1) {
		rc = BAD(e, chat ? "messages" : "prompt", "the prompt is empty");
		goto out;
	}
	if (r->p.n_prompt > si->max_prompt_tokens) {
		rc = serve_fail(e, 413, "invalid_request_error", "prompt_too_long",
				chat ? "messages" : "prompt", "the prompt has %lld tokens; "
				"the limit is %lld", (long long)r->p.n_prompt,
				(long long)si->max_prompt_tokens);
		goto out;
	}
	int64_t room = si->context - r->p.n_prompt;
	if (mt < 0)
		mt = chat ? (room < 256 ? room : 256) : 16;
	if (mt < 1 || r->p.n_prompt + mt > si->context) {
		rc = BAD(e, "max_tokens", "this model's context is %lld tokens; the prompt has "
			 "%lld and max_tokens asks for %lld more", (long long)si->context,
			 (long long)r->p.n_prompt, (long long)(mt < 1 ? 1 : mt));
		e->code = "context_length_exceeded";
		goto out;
	}
	r->p.max_tokens = mt;
	r->p.prompt = r->prompt;
out:
	json_decref(root);
	if (rc < 0)
		serve_req_free(r);
	return rc < 0 ? -1 : 0;
}

void serve_req_free(serve_req *r)
{
	free(r->prompt);
	r->prompt = NULL;
	for (int i = 0; i < MOET_SCHED_MAX_STOP; i++) {
		free(r->stop[i]);
		r->stop[i] = NULL;
	}
}

/* ---- responses ---------------------------------------------------------------------------- */

static json_t *token_str(const serve_info *si, const serve_req *r, int32_t id)
{
	const char *b = NULL;
	size_t n = 0;
	if (!r->tokens_as_ids && si->tok && moet_tokenizer_token_bytes(si->tok, id, &b, &n) == 0)
		return serve_json_text(b, n);
	char buf[32];
	snprintf(buf, sizeof(buf), "token_id:%d", (int)id);
	return json_string(buf);
}

static json_t *token_bytes(const serve_info *si, int32_t id)
{
	const char *b = NULL;
	size_t n = 0;
	json_t *a = json_array();
	if (a && si->tok && moet_tokenizer_token_bytes(si->tok, id, &b, &n) == 0)
		for (size_t i = 0; i < n; i++)
			json_array_append_new(a, json_integer((unsigned char)b[i]));
	return a;
}

/* Completions: {tokens, token_logprobs, top_logprobs, text_offset}; chat: {content: [...]}.
 * NOTE: completions' text_offset counts bytes of the token texts, from o->text_offset. */
static json_t *logprobs_json(const serve_info *si, const serve_req *r, const serve_out *o)
{
	if (!r->chat) {
		json_t *t = json_array(), *lp = json_array(), *top = json_array();
		json_t *off = json_array();
		size_t at = o->text_offset;
		for (size_t i = 0; i < o->n_toks; i++) {
			const moet_sched_token *k = &o->toks[i];
			json_array_append_new(t, token_str(si, r, k->id));
			json_array_append_new(lp, json_real(k->logprob));
			json_t *d = json_object();
			for (int q = 0; q < k->n_top; q++) {
				json_t *ks = token_str(si, r, k->top_id[q]);
				json_object_set_new(d, json_string_value(ks),
						    json_real(k->top_logprob[q]));
				json_decref(ks);
			}
			json_array_append_new(top, d);
			json_array_append_new(off, json_integer((json_int_t)at));
			const char *b;
			size_t nb = 0;
			if (si->tok && !moet_tokenizer_is_special(si->tok, k->id) &&
			    !moet_tokenizer_token_bytes(si->tok, k->id, &b, &nb))
				at += nb;
		}
		return json_pack("{s:o, s:o, s:o, s:o}", "tokens", t, "token_logprobs", lp,
				 "top_logprobs", top, "text_offset", off);
	}
	json_t *content = json_array();
	for (size_t i = 0; i < o->n_toks; i++) {
		const moet_sched_token *k = &o->toks[i];
		json_t *top = json_array();
		for (int q = 0; q < k->n_top; q++)
			json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
					      token_str(si, r, k->top_id[q]), "logprob",
					      k->top_logprob[q], "bytes",
					      token_bytes(si, k->top_id[q])));
		json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token",
				      token_str(si, r, k->id), "logprob", k->logprob, "bytes",
				      token_bytes(si, k->id), "top_logprobs", top));
	}
	return json_pack("{s:o}", "content", content);
}

static json_t *finish_json(int finish)
{
	if (finish == MOET_SCHED_FINISH_LENGTH)
		return json_string("length");
	if (finish == MOET_SCHED_FINISH_STOP)
		return json_string("stop");
	return json_null();
}

static json_t *usage_json(int64_t n_prompt, int64_t n_gen)
{
	return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)n_prompt,
			 "completion_tokens", (json_int_t)n_gen, "total_tokens",
			 (json_int_t)(n_prompt + n_gen));
}

static char *dump(json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return s;
}

char *serve_response(const serve_info *si, const serve_req *r, const serve_out *o)
{
	json_t *lp = r->logprobs ? logprobs_json(si, r, o) : json_null();
	json_t *choice;
	if (r->chat)
		choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:o}", "index", 0, "message", "role",
				   "assistant", "content", serve_json_text(o->text, o->n_text),
				   "logprobs", lp, "finish_reason", finish_json(o->finish));
	else
		choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "text",
				   serve_json_text(o->text, o->n_text), "logprobs", lp,
				   "finish_reason", finish_json(o->finish));
	return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", r->id, "object",
			      r->chat ? "chat.completion" : "text_completion", "created",
			      (json_int_t)r->created, "model", si->model_id, "choices", choice,
			      "usage", usage_json(o->n_prompt, o->n_generated)));
}

static char *sse(json_t *j)
{
	char *s = dump(j);
	if (!s)
		return NULL;
	size_t n = strlen(s);
	char *e = malloc(n + 9);
	if (e) {
		memcpy(e, "data: ", 6);
		memcpy(e + 6, s, n);
		memcpy(e + 6 + n, "\n\n", 3);
	}
	free(s);
	return e;
}

char *serve_chunk(const serve_info *si, const serve_req *r, const serve_out *o, int first)
{
	json_t *lp = r->logprobs && o->n_toks ? logprobs_json(si, r, o) : json_null();
	json_t *choice;
	if (r->chat) {
		json_t *delta = json_object();
		if (first)
			json_object_set_new(delta, "role", json_string("assistant"));
		if (o->n_text || first)
			json_object_set_new(delta, "content", serve_json_text(o->text, o->n_text));
		choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta,
				   "logprobs", lp, "finish_reason", finish_json(o->finish));
	} else {
		choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "text",
				   serve_json_text(o->text, o->n_text), "logprobs", lp,
				   "finish_reason", finish_json(o->finish));
	}
	return sse(json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object",
			     r->chat ? "chat.completion.chunk" : "text_completion", "created",
			     (json_int_t)r->created, "model", si->model_id, "choices", choice));
}

char *serve_usage_chunk(const serve_info *si, const serve_req *r, int64_t n_prompt,
			int64_t n_generated)
{
	return sse(json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object",
			     r->chat ? "chat.completion.chunk" : "text_completion", "created",
			     (json_int_t)r->created, "model", si->model_id, "choices", "usage",
			     usage_json(n_prompt, n_generated)));
}

char *serve_models_body(const serve_info *si, const char *note, int64_t created)
{
	json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", si->model_id, "object", "model",
			      "created", (json_int_t)created, "owned_by", "moet-hybrid");
	if (m && note)
		json_object_set_new(m, "description", json_string(note));
	if (m)
		json_object_set_new(m, "max_model_len", json_integer((json_int_t)si->context));
	return dump(json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}
