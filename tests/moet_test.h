/*
 * moet_test.h: the few helpers every test program shares. A test is a standalone program:
 * exit 0 pass, 1 fail, 77 skip (no GPU, no ../shared, ...).
 */
#ifndef MOET_TEST_H
#define MOET_TEST_H

#include <stdint.h>
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
/* The folder of the moet-hybrid binary (where the build's other programs are) into
 * out[cap]: moet_test_bin() up to its last '/', or "." for a bare name. */
void moet_test_build_dir(char *out, size_t cap);

/* A fresh empty directory under the scratch folder, named after `tag` and the pid; the
 * returned path is malloc'd. NULL on failure. */
char *moet_test_mkdtemp(const char *tag);

/* A monotonic clock in milliseconds (for the tests' coarse time limits). */
double moet_test_now_ms(void);

/* The Kimi-K2 preset's geometry (gen-checkpoint's, no checkpoint written) with n_layers layers
 * and n_experts routed experts per layer (0: the preset's), and its placement sizes
 * (*out_sizes the caller's: moet_placement_sizes_free). Returns 0 or the failing call's code. */
struct moet_config;
struct moet_placement_sizes;
int moet_test_kimi(int64_t n_layers, int64_t n_experts, struct moet_config *out_cf,
		   struct moet_placement_sizes **out_sizes);

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

/* dir/hw-even.yaml, its path into path[n]: hardware figures (MOET_HARDWARE) with a CPU about
 * as fast as the link, so that decode staging by balance stages some of a call's cold experts
 * and leaves the others. CHECKs the write. */
void moet_test_hw_even(const char *dir, char *path, size_t n);

/* The whole file at path, malloc'd with one NUL byte after its *out_n bytes (so text files
 * read as strings); NULL when it cannot be opened, is not a regular file, or cannot be fully
 * read (*out_n then 0). out_n may be NULL. */
void *moet_test_read_file(const char *path, size_t *out_n);

/* One step of xorshift64 (13, 7, 17) on *state, which must not be 0; returns the new state.
 * The tests' reproducible random numbers: each test keeps its own seeded state. */
uint64_t moet_test_xorshift64(uint64_t *state);

/* Environment variable `name` set to v, or unset for v NULL (the switch tests' cases). */
void moet_test_env(const char *name, const char *v);

/* Routing ids for n tokens x top_k over E experts, from *state (xorshift64, % the range):
 * mode 0 distinct per token over all E; 1 distinct per token over top_k + 2 experts from a
 * random offset (heavy ties); 2 anything (repeats within a token too) over 3 experts. */
void moet_test_routing_ids(int32_t *ids, int64_t n, int64_t k, int64_t E, int mode,
			   uint64_t *state);

typedef struct moet_model moet_model;
typedef struct moet_gen_params moet_gen_params;

/*
 * The "tiny checkpoint" preamble of many tests: a fresh directory moet_test_mkdtemp(tag),
 * moet_gen_checkpoint(dir, gp) into it, each step CHECKed with the error text
 * ("TAG: gen: ..."). Returns the malloc'd directory (the caller frees it), or NULL with the
 * failure counted.
 */
char *moet_test_gen(const char *tag, const moet_gen_params *gp);

/*
 * moet_test_gen, then the checkpoint opened with moet_model_open_on(dir, device) (device NULL:
 * moet_model_open, the CPU backend), CHECKed ("TAG: open DEVICE: ..."). Returns the model, or
 * NULL with the failure counted. *out_dir gets the directory whenever it was generated (also
 * when the open failed), else NULL; the caller frees it and closes the model.
 */
moet_model *moet_test_gen_open_on(const char *tag, const moet_gen_params *gp, const char *device,
				  char **out_dir);

/* moet_test_gen_open_on on the CPU backend. */
moet_model *moet_test_gen_open(const char *tag, const moet_gen_params *gp, char **out_dir);

/* Sequences 0..seqs-1 with prompts of 2 (seqs - s) + 1 tokens (fixed ids), prefilled together
 * (batched) or one per call, then `steps` decode steps; out gets the last row's logits of
 * every sequence and call, [steps + 1][seqs][vocab]. Returns 0 or the first error. */
int moet_test_ragged_run(moet_model *m, int seqs, int steps, int batched, float *out);
/* The same, batched, with after(step, ctx) called after each step's call (step 0: the
 * prompts). */
int moet_test_ragged_run_hook(moet_model *m, int seqs, int steps, float *out,
			      void (*after)(int step, void *ctx), void *ctx);

/* A MOET_TRACE file (runtime/moet_trace.h) read back with jansson: its complete events counted
 * by lane (passes; ops on the pass's stream and the two micro-batch streams; CPU-tier spans;
 * the driver's waits); bad: no name, a negative start or duration, or an unknown lane; outside:
 * op spans inside no pass span (0.5 us of rounding allowed). CHECKs that the file is JSON with
 * a traceEvents array; returns 0, or -1 when it is not. */
typedef struct moet_test_trace_counts {
	int64_t passes, ops[3], cpu, waits, bad, outside, spans;
} moet_test_trace_counts;
int moet_test_trace_read(const char *path, moet_test_trace_counts *k);

#endif
