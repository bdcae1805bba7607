/*
 * serve_test.h: what the HTTP tests of tests/serve/ share (header-only: each test_*.c is its
 * own program): the server binary spawned with --port 0 (the port read from its log line),
 * and a small HTTP/1.1 client on loopback sockets (Connection: close; chunked bodies decoded;
 * SSE events split).
 */
#ifndef MOET_SERVE_TEST_H
#define MOET_SERVE_TEST_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moet_test.h"

typedef struct st_server {
	pid_t pid;
	int port;
	char log[4096];
} st_server;

static double st_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Starts `moet-hybrid serve --port 0 ARGS` with XDG_CACHE_HOME=xdg (NULL: unchanged), its
 * output in a log file; waits up to 120 s for "listening on http://...:PORT". 0 or -1. */
static int st_start(st_server *s, const char *xdg, const char *args)
{
	static int n;
	snprintf(s->log, sizeof(s->log), "%s/serve-%d-%d.log", moet_test_tmp_dir(), (int)getpid(),
		 n++);
	char cmd[8192];
	snprintf(cmd, sizeof(cmd), "exec %s serve --port 0 %s > '%s' 2>&1", moet_test_bin(), args,
		 s->log);
	s->pid = fork();
	if (s->pid < 0)
		return -1;
	if (s->pid == 0) {
		if (xdg)
			setenv("XDG_CACHE_HOME", xdg, 1);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	double t0 = st_now();
	while (st_now() - t0 < 120) {
		FILE *f = fopen(s->log, "r");
		char line[1024];
		while (f && fgets(line, sizeof(line), f)) {
			const char *p = strstr(line, "listening on http://");
			const char *colon = p ? strrchr(p, ':') : NULL;
			if (colon && (s->port = atoi(colon + 1)) > 0) {
				fclose(f);
				return 0;
			}
		}
		if (f)
			fclose(f);
		int status;
		if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
			s->pid = 0;
			return -1;
		}
		usleep(20000);
	}
	return -1;
}

/* SIGTERM, then the exit status (0: clean stop; under ASan also no leak), or -1. */
static int st_stop(st_server *s)
{
	if (s->pid <= 0)
		return -1;
	kill(s->pid, SIGTERM);
	int status = 0;
	double t0 = st_now();
	while (waitpid(s->pid, &status, WNOHANG) == 0) {
		if (st_now() - t0 > 30) {
			kill(s->pid, SIGKILL);
			waitpid(s->pid, &status, 0);
			return -1;
		}
		usleep(10000);
	}
	s->pid = 0;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int st_connect(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	struct timeval tv = { .tv_sec = 60 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static int st_send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Sends one request (body may be NULL; extra: more header lines, each ending in \r\n). */
static int st_send(int fd, const char *method, const char *path, const char *extra,
		   const char *body, size_t n_body)
{
	char head[2048];
	int k = snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
			 "Connection: close\r\n%s", method, path, extra ? extra : "");
	if (body)
		k += snprintf(head + k, sizeof(head) - (size_t)k, "Content-Type: application/json"
			      "\r\nContent-Length: %zu\r\n", n_body);
	k += snprintf(head + k, sizeof(head) - (size_t)k, "\r\n");
	if (st_send_all(fd, head, (size_t)k))
		return -1;
	return body ? st_send_all(fd, body, n_body) : 0;
}

typedef struct st_resp {
	int status;
	char *head;   /* status line and headers */
	char *body;   /* decoded (chunked bodies joined), NUL-terminated */
	size_t n_body;
} st_resp;

static void st_resp_free(st_resp *r)
{
	free(r->head);
	free(r->body);
	memset(r, 0, sizeof(*r));
}

/* Reads to EOF and splits the response. 0 or -1. */
static int st_read(int fd, st_resp *r)
{
	size_t cap = 65536, n = 0;
	char *raw = malloc(cap);
	for (;;) {
		if (n + 4096 > cap)
			raw = realloc(raw, cap *= 2);
		ssize_t k = recv(fd, raw + n, cap - n - 1, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	raw[n] = 0;
	memset(r, 0, sizeof(*r));
	char *sep = strstr(raw, "\r\n\r\n");
	if (!sep || sscanf(raw, "HTTP/1.%*d %d", &r->status) != 1) {
		free(raw);
		return -1;
	}
	r->head = strndup(raw, (size_t)(sep - raw) + 2);
	char *b = sep + 4;
	size_t nb = n - (size_t)(b - raw);
	r->body = malloc(nb + 1);
	if (strcasestr(r->head, "transfer-encoding: chunked")) {
		size_t o = 0;
		char *p = b;
		while (p < b + nb) {
			unsigned long len = strtoul(p, &p, 16);
			p = strstr(p, "\r\n");
			if (!p || len == 0)
				break;
			p += 2;
			memcpy(r->body + o, p, len);
			o += len;
			p += len + 2;
		}
		r->n_body = o;
	} else {
		memcpy(r->body, b, nb);
		r->n_body = nb;
	}
	r->body[r->n_body] = 0;
	free(raw);
	return 0;
}

#define ST_AUTH "Authorization: Bearer test-key\r\n"

/* One whole exchange. 0 or -1. */
static int st_http(int port, const char *method, const char *path, const char *extra,
		   const char *body, st_resp *r)
{
	int fd = st_connect(port);
	if (fd < 0)
		return -1;
	int rc = st_send(fd, method, path, extra, body, body ? strlen(body) : 0);
	if (!rc)
		rc = st_read(fd, r);
	close(fd);
	return rc;
}

/* The value of a metric line "name value" (first match) in /metrics text, or -1. */
static double st_metric(const char *text, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (!strncmp(p, name, n) && p[n] == ' ')
			return atof(p + n + 1);
	return -1;
}

static double st_get_metric(int port, const char *name)
{
	st_resp r;
	if (st_http(port, "GET", "/metrics", NULL, NULL, &r))
		return -1;
	double v = st_metric(r.body, name);
	st_resp_free(&r);
	return v;
}

#endif
