/*
 * test_upload_opts.c: the upload's switches, without a GPU (runtime/upload.c,
 * runtime/upload_uring.c).
 *   - MOET_UPLOAD: plain, staged and uring parsed; unset or empty is auto; anything else
 *     (register, whose path was removed, included) refused in one line naming the value and
 *     the accepted ones;
 *   - the staged source's MOET_UPLOAD_CHUNK_MB and MOET_UPLOAD_STORE: bad values refused by
 *     name before anything is allocated; valid ones accepted (an empty upload succeeds
 *     without a CUDA call whatever they say);
 *   - without a device, a non-empty staged upload fails cleanly with a message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_test.h"
#include "moet_upload.h"

static void expect(int rc, int want, const char *needle, const char *what)
{
	CHECK(rc == want && strstr(moet_errmsg(), needle) && !strchr(moet_errmsg(), '\n'),
	      "%s: rc %d (want %d), '%s' (want '%s')", what, rc, want, moet_errmsg(), needle);
}

static void source_cases(void)
{
	const struct {
		const char *v;
		int want;
	} ok[] = { { "plain", MOET_UPLOAD_PLAIN }, { "staged", MOET_UPLOAD_STAGED },
		   { "uring", MOET_UPLOAD_URING }, { "", MOET_UPLOAD_AUTO } };
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		int src = -7;
		setenv("MOET_UPLOAD", ok[i].v, 1);
		CHECK(moet_upload_source(&src) == 0 && src == ok[i].want,
		      "MOET_UPLOAD='%s': %d (want %d) %s", ok[i].v, src, ok[i].want, moet_errmsg());
	}
	unsetenv("MOET_UPLOAD");
	int src = -7;
	CHECK(moet_upload_source(&src) == 0 && src == MOET_UPLOAD_AUTO, "unset: auto (%d)", src);
	const char *bad[] = { "register", "Staged", "uring ", "mmap" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char needle[64];
		snprintf(needle, sizeof(needle), "MOET_UPLOAD='%s'", bad[i]);
		setenv("MOET_UPLOAD", bad[i], 1);
		expect(moet_upload_source(&src), MOET_EINVAL, needle, needle);
		CHECK(strstr(moet_errmsg(), "staged, plain or uring"), "the message lists the "
		      "accepted values: '%s'", moet_errmsg());
	}
	unsetenv("MOET_UPLOAD");
}

static void staged_cases(void)
{
	char buf[64], dst[64];
	moet_upload_item it = { buf, dst, sizeof(buf) };
	const char *bad[][3] = { { "MOET_UPLOAD_CHUNK_MB", "0", "MOET_UPLOAD_CHUNK_MB='0'" },
				 { "MOET_UPLOAD_CHUNK_MB", "2048", "MOET_UPLOAD_CHUNK_MB='2048'" },
				 { "MOET_UPLOAD_CHUNK_MB", "8M", "MOET_UPLOAD_CHUNK_MB='8M'" },
				 { "MOET_UPLOAD_STORE", "stream", "MOET_UPLOAD_STORE='stream'" } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv(bad[i][0], bad[i][1], 1);
		expect(moet_upload_many(&it, 1, 1, NULL), MOET_EINVAL, bad[i][2], bad[i][2]);
		unsetenv(bad[i][0]);
	}
	/* valid values: nothing to copy is no error, and no CUDA call */
	const char *good[][2] = { { "MOET_UPLOAD_CHUNK_MB", "1" }, { "MOET_UPLOAD_CHUNK_MB", "1024" },
				  { "MOET_UPLOAD_STORE", "nt" }, { "MOET_UPLOAD_STORE", "cached" } };
	it.bytes = 0;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		moet_upload_stats st = { .bytes = 99 };
		setenv(good[i][0], good[i][1], 1);
		CHECK(moet_upload_many(&it, 1, 1, &st) == 0 && st.bytes == 0, "%s=%s, empty "
		      "upload: %s", good[i][0], good[i][1], moet_errmsg());
		unsetenv(good[i][0]);
	}
	if (moet_gpu_count(NULL) == 0) {
		/* no device: the first CUDA call fails cleanly, named */
		it.bytes = sizeof(buf);
		int rc = moet_upload_many(&it, 1, 1, NULL);
		CHECK((rc == MOET_EDEVICE || rc == MOET_EUNSUP) && moet_errmsg()[0] &&
		      !strchr(moet_errmsg(), '\n'), "no GPU: rc %d '%s'", rc, moet_errmsg());
	}
}

int main(void)
{
	source_cases();
	staged_cases();
	return moet_test_done("test_upload_opts");
}
