/*
 * cli_generate.c: `moet-hybrid generate`: token ids in, greedy continuation ids out.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "moet_err.h"
#include "moet_model.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid generate --model DIR --tokens ID,ID,... [--max-new N] "
		   "[--ignore-eos] [--device cpu|cuda]\n"
		   "       [--placement FILE [--sim-devices N]] [--ram-budget-gb G "
		   "[--ram-profile FILE]]\n"
		   "       [--temperature T] [--top-k K] [--top-p P] [--seed S]\n\n"
		   "Runs the prompt through the model and prints the continuation (greedy: argmax,\n"
		   "ties to the lowest id; or sampled) as comma-separated token ids on one line.\n\n"
		   MOET_CLI_MODEL_HELP
		   "  --tokens IDS    prompt token ids, comma-separated\n"
		   "  --max-new N     tokens to generate (default 16)\n"
		   "  --ignore-eos    do not stop at the model's eos_token_id\n"
		   "  --temperature T sample with temperature T (default 0: greedy)\n"
		   "  --top-k K       sample among the K most likely tokens (default 0: all)\n"
		   "  --top-p P       nucleus sampling: the smallest set of mass >= P (default 1)\n"
		   "  --seed S        seed of the draws (default 0); a draw depends only on the\n"
		   "                  seed and the token's position: reproducible\n");
}

int moet_cli_generate(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "device", required_argument, NULL, 'd' },
		{ "placement", required_argument, NULL, 'P' },
		{ "sim-devices", required_argument, NULL, 'N' },
		{ "tokens", required_argument, NULL, 't' },
		{ "max-new", required_argument, NULL, 'n' },
		{ "ignore-eos", no_argument, NULL, 'e' },
		{ "temperature", required_argument, NULL, 'T' },
		{ "top-k", required_argument, NULL, 'k' },
		{ "top-p", required_argument, NULL, 'p' },
		{ "seed", required_argument, NULL, 's' },
		{ "ram-budget-gb", required_argument, NULL, 'B' },
		{ "ram-profile", required_argument, NULL, 'Q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *model_dir = NULL, *tokens = NULL, *device = "cpu", *place = NULL;
	const char *ram = NULL, *ram_prof = NULL;
	int sim = -1, simbad = 0;
	char *simend;
	long long max_new = 16;
	int stop_at_eos = 1, c, bad = 0;
	char *end;
	moet_sample_params sp = { .temperature = 0, .top_k = 0, .top_p = 1, .seed = 0 };
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model_dir = optarg; break;
		case 'd': device = optarg; break;
		case 'P': place = optarg; break;
		case 'N': sim = (int)strtol(optarg, &simend, 10); simbad |= *simend || sim < 0; break;
		case 't': tokens = optarg; break;
		case 'n': {
			max_new = strtoll(optarg, &end, 10);
			if (*end || max_new < 1 || max_new > 1000000)
				return moet_cli_fail("generate", moet_err(MOET_EINVAL, "--max-new '%s' "
						     "must be an integer in [1, 1000000]", optarg));
			break;
		}
		case 'e': stop_at_eos = 0; break;
		case 'T': sp.temperature = strtod(optarg, &end); bad |= *end != 0; break;
		case 'k': sp.top_k = strtoll(optarg, &end, 10); bad |= *end != 0; break;
		case 'p': sp.top_p = strtod(optarg, &end); bad |= *end != 0; break;
		case 's': sp.seed = strtoull(optarg, &end, 10); bad |= *end != 0; break;
		case 'B': ram = optarg; break;
		case 'Q': ram_prof = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (bad)
		return moet_cli_fail("generate", moet_err(MOET_EINVAL, "--temperature, --top-k, "
							  "--top-p and --seed take numbers"));
	if (simbad)
		return moet_cli_fail(argv[0], moet_err(MOET_EINVAL, "--sim-devices takes a "
							"non-negative integer"));
	if (!model_dir || !tokens) {
		usage(stderr);
		return 2;
	}
	if (moet_sample_check(&sp))
		return moet_cli_fail("generate", MOET_EINVAL);
	int64_t *prompt = NULL, n_prompt = 0, *out = NULL, n_out = 0;
	moet_model *m = NULL;
	int rc = moet_cli_parse_tokens(tokens, &prompt, &n_prompt);
	if (!rc)
		rc = moet_cli_open(model_dir, device, place, &m);
	if (!rc && place)
		rc = moet_cli_apply_placement(m, place, sim, NULL);
	if (!rc && ram)
		rc = moet_cli_apply_ram_budget(m, ram, ram_prof);
	if (!rc && !(out = malloc((size_t)max_new * sizeof(*out))))
		rc = moet_err(MOET_ENOMEM, "output ids");
	if (!rc)
		rc = moet_model_generate_sampled(m, prompt, n_prompt, max_new, stop_at_eos, &sp,
						  out, &n_out);
	if (!rc) {
		for (int64_t i = 0; i < n_out; i++)
			printf("%s%lld", i ? "," : "", (long long)out[i]);
		printf("\n");
		moet_cli_ram_report(m, stderr);
	}
	free(out);
	free(prompt);
	moet_model_close(m);
	return rc ? moet_cli_fail("generate", rc) : 0;
}
