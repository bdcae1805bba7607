/*
 * moet_test.h: the few helpers every test program shares. A test is a standalone program:
 * exit 0 pass, 1 fail, 77 skip (no GPU, no ../shared, ...).
 */
#ifndef MOET_TEST_H
#define MOET_TEST_H

#include <stdio.h>
#include <stdlib.h>

#define MOET_TEST_SKIP 77

extern int moet_test_failures;

/* CHECK(cond, fmt, ...): on failure print file:line and the message, count it, go on. */
#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                      \
			fputc('\n', stderr);                                               \
			moet_test_failures++;                                              \
		}                                                                          \
	} while (0)

/* Exit status for the end of main(): prints a summary line. */
int moet_test_done(const char *name);

/* The environment that ctest sets (CMakeLists.txt): source tree, binary, ../shared, and a
 * scratch folder. Never NULL: falls back to ".", "moet-hybrid", "../shared", "/tmp". */
const char *moet_test_source_dir(void);
const char *moet_test_bin(void);
const char *moet_test_shared_dir(void);
const char *moet_test_tmp_dir(void);

/* A fresh empty directory under the scratch folder, named after `tag` and the pid; the
 * returned path is malloc'd. NULL on failure. */
char *moet_test_mkdtemp(const char *tag);

/* Runs `cmd` through the shell; returns its exit status (or -1), stdout+stderr captured
 * into a malloc'd *out_text when out_text is not NULL. */
int moet_test_run(const char *cmd, char **out_text);

/* Runs the moet-hybrid binary with the printf-formatted arguments, stdout and stderr captured
 * into a malloc'd *out (when out is not NULL); returns its exit status (or -1). */
int moet_test_cli(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Runs the binary with `args` and CHECKs its exit status and that its output contains
 * want_text. */
void moet_test_cli_expect(const char *args, int want_rc, const char *want_text);

/* Writes n bytes to path. 0 or -1. */
int moet_test_write_file(const char *path, const void *data, size_t n);

typedef struct moet_model moet_model;

/* Sequences 0..seqs-1 with prompts of 2 (seqs - s) + 1 tokens (fixed ids), prefilled together
 * (batched) or one per call, then `steps` decode steps; out gets the last row's logits of
 * every sequence and call, [steps + 1][seqs][vocab]. Returns 0 or the first error. */
int moet_test_ragged_run(moet_model *m, int seqs, int steps, int batched, float *out);

#endif
