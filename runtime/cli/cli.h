/*
 * cli.h: the subcommands of the moet-hybrid binary. Each takes the arguments after its name
 * (argv[0] is the subcommand name, for getopt) and returns the process exit status; only
 * main() exits. Errors print one line "moet-hybrid <cmd>: <detail>" to stderr.
 */
#ifndef MOET_CLI_H
#define MOET_CLI_H

#include <stdint.h>
#include <stdio.h>

int moet_cli_inspect(int argc, char **argv);
int moet_cli_gen_checkpoint(int argc, char **argv);
int moet_cli_logits(int argc, char **argv);
int moet_cli_generate(int argc, char **argv);
int moet_cli_verify(int argc, char **argv);
int moet_cli_bench(int argc, char **argv);
int moet_cli_bench_e2e(int argc, char **argv);
int moet_cli_bench_load(int argc, char **argv);
int moet_cli_profile(int argc, char **argv);
int moet_cli_plan(int argc, char **argv);
int moet_cli_heatmap(int argc, char **argv);
int moet_cli_serve(int argc, char **argv);
int moet_cli_bench_serve(int argc, char **argv);

/* The --help lines of the options generate and logits share (model, device, placement, NVMe
 * tier): a format string fragment (%% escaped). */
#define MOET_CLI_MODEL_HELP \
	"  --model DIR     checkpoint directory (config.json + safetensors shards)\n" \
	"  --device D      cpu (the reference backend, default) or cuda\n" \
	"  --placement F   expert placement file (docs/placement.md); on --device cpu\n" \
	"                  its GPUs are simulated devices, on --device cuda CUDA\n" \
	"                  devices 0.. beside the CPU tier (results do not change)\n" \
	"  --sim-devices N simulated devices (default: the placement's GPU count)\n" \
	"  --ram-budget-gb G  keep the CPU tier's experts on disk behind G GiB of RAM\n" \
	"                  slots (or G%% of the tier), read by io_uring; results do\n" \
	"                  not change (docs/io-uring.md)\n" \
	"  --ram-profile F routing profile for the tier's admission and eviction\n"

/* Prints "moet-hybrid <cmd>: <moet_errmsg() or code name>" to stderr; returns 1. */
int moet_cli_fail(const char *cmd, int code);

/* Parses "1,2,3" into a malloc'd array of *out_n token ids. Returns 0 or MOET_EINVAL. */
int moet_cli_parse_tokens(const char *s, int64_t **out, int64_t *out_n);

/* The option `opt`'s list "1,2,3" into *out (malloc'd; a previous *out is freed), each value
 * in [lo, hi]; one-line MOET_EINVAL naming the option otherwise. */
int moet_cli_parse_list(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t **out,
			int *out_n);

typedef struct moet_model moet_model;

/* Opens the model in dir on device for a command given placement FILE (NULL: none): with
 * MOET_TP unset or empty, a placement whose dense part is `split` over two or more GPUs
 * opens it split over them (moet_model_open_tp: the placement's GPUs 0..n-1 are the ranks);
 * otherwise as moet_model_open_on. The placement is read here only for that (checked again
 * when it is applied). */
int moet_cli_open(const char *dir, const char *device, const char *place, moet_model **out);

/* Loads placement FILE against the model (sizes from its checkpoint) and sets it, with the
 * file's GPUs as devices (simulated on the CPU backend); sim_devices >= 0 asks for that many
 * (at least the file's count), -1 takes the file's. Returns 0 or the error code. */
int moet_cli_apply_placement(moet_model *m, const char *path, int sim_devices,
			     int *out_n_devices);

/* Loads placement FILE against the model in dir (opened on the CPU: no upload) and copies its
 * owner table [layers x experts] (-1 the CPU tier, g GPU g) into *out (malloc'd), its GPU
 * count into *out_n. Returns 0 or the error code (the detail names the file). */
int moet_cli_load_owner(const char *dir, const char *path, int16_t **out, int *out_n);

/* The owner table of `plan --hot-per-layer k` on one GPU from the decode routings of profile
 * FILE (checked against the model in dir), with no memory budget: the k most routed experts
 * of every MoE layer on GPU 0, the rest on the CPU tier. *out malloc'd. 0 or the error code. */
int moet_cli_hot_owner(const char *dir, const char *profile_path, int64_t k, int16_t **out);

/* --ram-budget-gb VALUE [--ram-profile FILE]: puts the CPU tier behind the NVMe expert tier
 * (runtime/moet_xtier.h) with VALUE GiB (2^30 bytes) of slots, or VALUE% of the slots the
 * whole CPU tier needs; call after the placement. Prints the tier's geometry to stderr.
 * Returns 0 or the error code. */
int moet_cli_apply_ram_budget(moet_model *m, const char *value, const char *profile_path);

/* One stderr-style line of the tier's counters to f (nothing without a tier). */
void moet_cli_ram_report(const moet_model *m, FILE *f);

#endif
