/*
 * main.c: the moet-hybrid binary. Dispatches to one subcommand per file (cli_*.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "moet_err.h"

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} commands[] = {
	{ "serve", moet_cli_serve, "OpenAI-compatible HTTP server (no --model: the demo)" },
	{ "generate", moet_cli_generate, "token ids in, greedy continuation ids out" },
	{ "logits", moet_cli_logits, "token ids in, float32 logits [T, vocab] out (.npy)" },
	{ "verify", moet_cli_verify, "a placement must not change a bit: logits with and without" },
	{ "inspect", moet_cli_inspect, "summarize and validate a checkpoint" },
	{ "gen-checkpoint", moet_cli_gen_checkpoint,
	  "write a synthetic checkpoint in the published layout" },
	{ "bench", moet_cli_bench, "benchmarks against measured ceilings (bench --help)" },
	{ "profile", moet_cli_profile, "routing counts per (phase, layer, expert) of prompts" },
	{ "plan", moet_cli_plan, "a placement file from a profile under GPU budgets" },
	{ "heatmap", moet_cli_heatmap, "SVG picture of a profile and a placement" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid <command> [options]   (moet-hybrid <command> --help)\n\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].summary);
}

int moet_cli_fail(const char *cmd, int code)
{
	const char *msg = moet_errmsg();
	fprintf(stderr, "moet-hybrid %s: %s\n", cmd, msg[0] ? msg : moet_strerror(code));
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("moet-hybrid 0.1.0\n");
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "moet-hybrid: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
