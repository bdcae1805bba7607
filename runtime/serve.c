/*
 * serve.c: the HTTP side of `serve` (moet_serve.h) on libmicrohttpd.
 *
 * One thread per connection (MHD_USE_THREAD_PER_CONNECTION): a handler may block, so a
 * non-streaming completion simply waits for its request, and a stream's content reader waits
 * for the next tokens. The access handler is called (1) with the headers, (2) once per body
 * piece, (3) with no data: then the body is whole and the request is routed.
 *
 *   body > max_body_bytes           -> read and dropped, then 413 (no reset before the reply)
 *   /v1/... without the Bearer key  -> 401
 *   parse errors (serve_api.c)      -> 400 / 404 / 413
 *   scheduler full                  -> 429
 *   stream: 200 text/event-stream, "data: {chunk}\n\n" ..., "data: [DONE]\n\n"
 *
 * Disconnects: while it waits (100 ms at a time) a handler polls its socket for a hang-up
 * (POLLRDHUP); a gone client, or a failed write (MHD then frees the response), releases the
 * request, which the scheduler cancels at its next step: the KV slot never leaks.
 */
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "moet_chat.h"
#include "moet_err.h"
#include "serve_int.h"

#define WAIT_MS 100

struct moet_serve {
	struct MHD_Daemon *d;
	moet_sched *sched;
	serve_info base;
	char *model_id, *note, *api_key;
	size_t max_body;
	int port;
	int64_t created;
	atomic_int stopping;
	atomic_ullong serial, http_requests, http_errors;
};

/* Per connection: the body being received. */
typedef struct conn {
	char *body;
	size_t n, cap;
	int too_big;
} conn;

/* A streamed completion: the content reader's state. */
typedef struct stream {
	moet_serve *sv;
	serve_info si;
	serve_req req;
	moet_sched_req *sr;
	int fd;
	char *buf;             /* SSE bytes not yet handed to MHD */
	size_t len, off;
	int first, finished, done;
	size_t text_sent;
} stream;

static int client_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static int conn_fd(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	return ci ? (int)ci->connect_fd : -1;
}

static enum MHD_Result respond(moet_serve *sv, struct MHD_Connection *c, int status,
			       const char *ctype, char *body)
{
	if (!body)
		return MHD_NO;
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body,
								 MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", ctype);
	if (status == 401)
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	atomic_fetch_add(&sv->http_requests, 1);
	if (status >= 400)
		atomic_fetch_add(&sv->http_errors, 1);
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result respond_json(moet_serve *sv, struct MHD_Connection *c, int status,
				    char *body)
{
	return respond(sv, c, status, "application/json", body);
}

static enum MHD_Result respond_error(moet_serve *sv, struct MHD_Connection *c,
				     const serve_error *e)
{
	return respond_json(sv, c, e->status, serve_error_body(e));
}

static enum MHD_Result fail(moet_serve *sv, struct MHD_Connection *c, int status,
			    const char *type, const char *code, const char *fmt, const char *arg)
{
	serve_error e;
	serve_fail(&e, status, type, code, NULL, fmt, arg);
	return respond_error(sv, c, &e);
}

/* ---- completions ---------------------------------------------------------------------------- */

static int buf_add(stream *st, char *s)
{
	if (!s)
		return -1;
	size_t n = strlen(s);
	if (st->off == st->len)
		st->off = st->len = 0;
	char *b = realloc(st->buf, st->len + n + 1);
	if (!b) {
		free(s);
		return -1;
	}
	memcpy(b + st->len, s, n + 1);
	st->buf = b;
	st->len += n;
	free(s);
	return 0;
}

/* One update into SSE events. */
static int stream_update(stream *st, const moet_sched_update *u)
{
	serve_out o = { .text = u->text, .n_text = u->n_text, .toks = u->tokens,
			.n_toks = u->n_tokens, .text_offset = st->text_sent,
			.finish = MOET_SCHED_RUNNING };
	if (u->n_text || (st->req.logprobs && u->n_tokens) || st->first) {
		if (buf_add(st, serve_chunk(&st->si, &st->req, &o, st->first)))
			return -1;
		st->first = 0;
		st->text_sent += u->n_text;
	}
	if (u->finish == MOET_SCHED_RUNNING)
		return 0;
	st->finished = 1;
	if (u->finish == MOET_SCHED_FINISH_ERROR || u->finish == MOET_SCHED_FINISH_CANCELLED) {
		serve_error e;
		serve_fail(&e, 500, "server_error", NULL, NULL, "%s",
			   u->error[0] ? u->error : "request cancelled");
		char *body = serve_error_body(&e), *ev = body ? malloc(strlen(body) + 9) : NULL;
		if (ev)
			sprintf(ev, "data: %s\n\n", body);
		free(body);
		if (buf_add(st, ev))
			return -1;
	} else {
		o = (serve_out){ .text = "", .finish = u->finish };
		if (buf_add(st, serve_chunk(&st->si, &st->req, &o, 0)))
			return -1;
		if (st->req.include_usage &&
		    buf_add(st, serve_usage_chunk(&st->si, &st->req, u->n_prompt, u->n_generated)))
			return -1;
	}
	return buf_add(st, strdup("data: [DONE]\n\n"));
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
	stream *st = cls;
	for (;;) {
		if (st->off < st->len) {
			size_t n = st->len - st->off < max ? st->len - st->off : max;
			memcpy(out, st->buf + st->off, n);
			st->off += n;
			return (ssize_t)n;
		}
		if (st->finished)
			return MHD_CONTENT_READER_END_OF_STREAM;
		moet_sched_update u;
		int rc = moet_sched_poll(st->sr, WAIT_MS, &u);
		if (rc < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (rc == 1) {
			if (client_gone(st->fd) || atomic_load(&st->sv->stopping))
				return MHD_CONTENT_READER_END_WITH_ERROR;
			continue;
		}
		rc = stream_update(st, &u);
		moet_sched_update_free(&u);
		if (rc)
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
}

static void stream_free(void *cls)
{
	stream *st = cls;
	moet_sched_release(st->sr); /* cancels it if the client left early */
	serve_req_free(&st->req);
	free(st->buf);
	free(st);
}

/* The whole answer in one body: waits, watching for a hang-up. */
static enum MHD_Result complete(moet_serve *sv, struct MHD_Connection *c, const serve_info *si,
				serve_req *req, moet_sched_req *sr)
{
	char *text = NULL;
	size_t n_text = 0, cap_text = 0, n_toks = 0;
	moet_sched_token *toks = NULL;
	moet_sched_update u = { 0 };
	int fd = conn_fd(c), bad = 0;
	for (;;) {
		int rc = moet_sched_poll(sr, WAIT_MS, &u);
		if (rc < 0 || (rc == 1 && (client_gone(fd) || atomic_load(&sv->stopping)))) {
			bad = 1;
			break;
		}
		if (rc == 1)
			continue;
		if (u.n_text && !bad)
			bad = serve_buf_add(&text, &n_text, &cap_text, u.text, u.n_text) != 0;
		if (u.n_tokens && req->logprobs && !bad) {
			moet_sched_token *t = realloc(toks, (n_toks + u.n_tokens) * sizeof(*t));
			if (t) {
				memcpy(t + n_toks, u.tokens, u.n_tokens * sizeof(*t));
				toks = t;
				n_toks += u.n_tokens;
			}
			bad |= !t;
		}
		if (u.finish)
			break;
		moet_sched_update_free(&u);
	}
	enum MHD_Result ret = MHD_NO;
	if (!bad && u.finish == MOET_SCHED_FINISH_ERROR) {
		ret = fail(sv, c, 500, "server_error", NULL, "%s", u.error);
	} else if (!bad && u.finish != MOET_SCHED_FINISH_CANCELLED) {
		serve_out o = { .text = text ? text : "", .n_text = n_text, .toks = toks,
				.n_toks = n_toks, .finish = u.finish, .n_prompt = u.n_prompt,
				.n_generated = u.n_generated };
		ret = respond_json(sv, c, 200, serve_response(si, req, &o));
	}
	moet_sched_update_free(&u);
	moet_sched_release(sr);
	free(text);
	free(toks);
	return ret; /* MHD_NO closes the connection: the client is gone anyway */
}

static enum MHD_Result completion(moet_serve *sv, struct MHD_Connection *c, conn *cx, int chat)
{
	serve_info si = sv->base;
	si.serial = atomic_fetch_add(&sv->serial, 1) + 1;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	si.default_seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
			  (si.serial << 40);
	serve_req req;
	serve_error e;
	if (serve_parse(&si, cx->body ? cx->body : "", cx->n, chat, &req, &e))
		return respond_error(sv, c, &e);
	moet_sched_req *sr = NULL;
	int rc = moet_sched_submit(sv->sched, &req.p, &sr);
	if (rc) {
		if (rc == MOET_ERANGE)
			serve_fail(&e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
				   "the server is busy: %s; retry later", moet_errmsg());
		else if (rc == MOET_EINVAL)
			serve_fail(&e, 400, "invalid_request_error", NULL, NULL, "%s",
				   moet_errmsg());
		else
			serve_fail(&e, 500, "server_error", NULL, NULL, "%s", moet_errmsg());
		serve_req_free(&req);
		return respond_error(sv, c, &e);
	}
	if (!req.stream) {
		enum MHD_Result ret = complete(sv, c, &si, &req, sr);
		serve_req_free(&req);
		return ret;
	}
	stream *st = calloc(1, sizeof(*st));
	if (!st) {
		moet_sched_release(sr);
		serve_req_free(&req);
		return MHD_NO;
	}
	*st = (stream){ .sv = sv, .si = si, .req = req, .sr = sr, .fd = conn_fd(c), .first = 1 };
	st->req.p.prompt = st->req.prompt;
	st->req.p.stop = (const char *const *)st->req.stop;
	if (!st->req.chat)
		st->first = 0; /* completions have no opening role chunk */
	struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
								   stream_read, st, stream_free);
	if (!r) {
		stream_free(st);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	atomic_fetch_add(&sv->http_requests, 1);
	enum MHD_Result ret = MHD_queue_response(c, 200, r);
	MHD_destroy_response(r);
	return ret;
}

/* ---- routing ---------------------------------------------------------------------------- */

static int authorized(moet_serve *sv, struct MHD_Connection *c)
{
	if (!sv->api_key)
		return 1;
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, sv->api_key);
}

static enum MHD_Result route(moet_serve *sv, struct MHD_Connection *c, const char *url,
			     const char *method, conn *cx)
{
	int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
	if (cx->too_big) {
		char lim[32];
		snprintf(lim, sizeof(lim), "%zu", sv->max_body);
		return fail(sv, c, 413, "invalid_request_error", "request_too_large",
			    "the request body is larger than the limit of %s bytes", lim);
	}
	if (!strcmp(url, "/health") && get)
		return respond_json(sv, c, 200, strdup("{\"status\":\"ok\"}"));
	if (!strcmp(url, "/metrics") && get) {
		moet_sched_stats st;
		moet_sched_get_stats(sv->sched, &st);
		return respond(sv, c, 200, "text/plain; version=0.0.4",
			       serve_metrics_text(&st, atomic_load(&sv->http_requests),
						  atomic_load(&sv->http_errors)));
	}
	int v1 = !strncmp(url, "/v1/", 4);
	if (v1 && !authorized(sv, c))
		return fail(sv, c, 401, "authentication_error", "invalid_api_key",
			    "%s", "missing or wrong API key: send 'Authorization: Bearer KEY'");
	int is_models = !strcmp(url, "/v1/models"), is_cmpl = !strcmp(url, "/v1/completions");
	int is_chat = !strcmp(url, "/v1/chat/completions");
	if (is_models && get)
		return respond_json(sv, c, 200, serve_models_body(&sv->base, sv->note,
								  sv->created));
	if ((is_cmpl || is_chat) && post)
		return completion(sv, c, cx, is_chat);
	if (is_models || is_cmpl || is_chat || !strcmp(url, "/health") ||
	    !strcmp(url, "/metrics"))
		return fail(sv, c, 405, "invalid_request_error", "method_not_allowed",
			    "method %s is not allowed here", method);
	return fail(sv, c, 404, "invalid_request_error", "not_found", "no such endpoint: %s",
		    url);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
			       const char *method, const char *version, const char *data,
			       size_t *data_size, void **con_cls)
{
	moet_serve *sv = cls;
	conn *cx = *con_cls;
	if (!cx) {
		if (!(cx = calloc(1, sizeof(*cx))))
			return MHD_NO;
		*con_cls = cx;
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (cl && strtoull(cl, NULL, 10) > sv->max_body)
			cx->too_big = 1;
		return MHD_YES;
	}
	if (*data_size) {
		if (!cx->too_big && cx->n + *data_size > sv->max_body) {
			cx->too_big = 1;
			free(cx->body);
			cx->body = NULL;
		}
		if (!cx->too_big && serve_buf_add(&cx->body, &cx->n, &cx->cap, data, *data_size))
			return MHD_NO;
		*data_size = 0;
		return MHD_YES;
	}
	return route(sv, c, url, method, cx);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	conn *cx = *con_cls;
	if (cx) {
		free(cx->body);
		free(cx);
		*con_cls = NULL;
	}
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int moet_serve_start(moet_model *m, const moet_tokenizer *tok, const moet_serve_opts *o,
		     moet_serve **out)
{
	moet_serve *sv = calloc(1, sizeof(*sv));
	struct addrinfo *ai = NULL;
	int rc = 0;
	if (!sv)
		return moet_err(MOET_ENOMEM, "server");
	const char *host = o->host ? o->host : "127.0.0.1";
	sv->model_id = strdup(o->model_id ? o->model_id : "moet");
	sv->note = o->model_note ? strdup(o->model_note) : NULL;
	sv->api_key = o->api_key ? strdup(o->api_key) : NULL;
	if (!sv->model_id || (o->model_note && !sv->note) || (o->api_key && !sv->api_key)) {
		rc = moet_err(MOET_ENOMEM, "server");
		goto fail;
	}
	sv->max_body = o->max_body_bytes ? o->max_body_bytes : (1u << 20);
	sv->created = (int64_t)time(NULL);
	if ((rc = moet_sched_create(m, tok, &o->sched, &sv->sched)))
		goto fail;
	moet_sched_opts so;
	moet_sched_get_opts(sv->sched, &so);
	const moet_config *cfg = moet_model_config(m);
	int32_t bos = -1;
	if (tok && moet_tokenizer_find(tok, MOET_CHAT_BOS, &bos))
		bos = -1;
	int64_t ctx = so.kv_tokens < cfg->max_position_embeddings ? so.kv_tokens
								    : cfg->max_position_embeddings;
	sv->base = (serve_info){ .tok = tok, .model_id = sv->model_id, .vocab = cfg->vocab_size,
				 .context = ctx, .bos_id = bos,
				 .max_prompt_tokens = o->max_prompt_tokens > 0 &&
						      o->max_prompt_tokens < ctx
						      ? o->max_prompt_tokens : ctx - 1 };
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
	char port[16];
	snprintf(port, sizeof(port), "%d", o->port);
	if (o->port < 0 || o->port > 65535 || getaddrinfo(host, port, &hints, &ai) || !ai) {
		rc = moet_err(MOET_EINVAL, "--host '%s' --port %d: not an address to listen on",
			      host, o->port);
		goto fail;
	}
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
			 MHD_USE_POLL | MHD_USE_ITC;
	if (ai->ai_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	unsigned limit = (unsigned)so.max_requests * 2 + 32;
	sv->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, sv,
				 MHD_OPTION_SOCK_ADDR, ai->ai_addr,
				 MHD_OPTION_NOTIFY_COMPLETED, completed, sv,
				 MHD_OPTION_CONNECTION_LIMIT, limit,
				 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
				 MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
				 MHD_OPTION_END);
	if (!sv->d) {
		rc = moet_err(MOET_EIO, "cannot listen on %s:%d (in use, or not an address here)",
			      host, o->port);
		goto fail;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(sv->d, MHD_DAEMON_INFO_BIND_PORT);
	sv->port = di ? di->port : o->port;
	freeaddrinfo(ai);
	*out = sv;
	return 0;
fail:
	if (ai)
		freeaddrinfo(ai);
	moet_serve_stop(sv);
	return rc;
}

int moet_serve_port(const moet_serve *s)
{
	return s->port;
}

moet_sched *moet_serve_sched(moet_serve *s)
{
	return s->sched;
}

void moet_serve_stop(moet_serve *s)
{
	if (!s)
		return;
	atomic_store(&s->stopping, 1);
	if (s->d)
		MHD_stop_daemon(s->d); /* joins every connection thread: all requests released */
	moet_sched_destroy(s->sched);
	free(s->model_id);
	free(s->note);
	free(s->api_key);
	free(s);
}
