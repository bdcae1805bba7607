/*
 * err.c: the per-thread error detail behind moet_err.h.
 */
#include "moet_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MOET_ERR_DETAIL_BYTES 1024

static _Thread_local char err_detail[MOET_ERR_DETAIL_BYTES];

const char *moet_strerror(int code)
{
	switch (code) {
	case MOET_OK: return "OK";
	case MOET_EINVAL: return "EINVAL";
	case MOET_ENOMEM: return "ENOMEM";
	case MOET_EIO: return "EIO";
	case MOET_ENOTFOUND: return "ENOTFOUND";
	case MOET_EFORMAT: return "EFORMAT";
	case MOET_ESHAPE: return "ESHAPE";
	case MOET_EUNSUP: return "EUNSUP";
	case MOET_EDEVICE: return "EDEVICE";
	case MOET_ERANGE: return "ERANGE";
	default: return "EUNKNOWN";
	}
}

int moet_err(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err_detail, sizeof(err_detail), fmt, ap);
	va_end(ap);
	return code;
}

int moet_err_prefix(int code, const char *fmt, ...)
{
	char prefix[512];
	char old[MOET_ERR_DETAIL_BYTES];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, err_detail, sizeof(old));
	/* NOTE: built piecewise: a long prefix may truncate the detail, which is fine. */
	size_t n = strlen(prefix);
	if (n > sizeof(err_detail) - 3)
		n = sizeof(err_detail) - 3;
	memcpy(err_detail, prefix, n);
	memcpy(err_detail + n, ": ", 3);
	const char *rest = old[0] ? old : moet_strerror(code);
	size_t room = sizeof(err_detail) - n - 3;
	size_t m = strlen(rest);
	if (m > room)
		m = room;
	memcpy(err_detail + n + 2, rest, m);
	err_detail[n + 2 + m] = '\0';
	return code;
}

const char *moet_errmsg(void)
{
	return err_detail;
}

void moet_err_clear(void)
{
	err_detail[0] = '\0';
}
