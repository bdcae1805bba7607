/*
 * cli_logits.c: `moet-hybrid logits`: token ids in, float32 logits [T, vocab] out as .npy.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_npy.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid logits --model DIR --tokens ID,ID,... --out FILE.npy\n"
		   "       [--device cpu|cuda] [--placement FILE [--sim-devices N]]\n"
		   "       [--ram-budget-gb G [--ram-profile FILE]]\n\n"
		   "Runs the tokens as one sequence (positions 0..T-1) and writes the logits of\n"
		   "every position as a float32 NumPy array of shape [T, vocab_size].\n\n"
		   MOET_CLI_MODEL_HELP
		   "  --tokens IDS    token ids, comma-separated\n"
		   "  --out FILE      output .npy file\n");
}

int moet_cli_logits(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "device", required_argument, NULL, 'd' },
		{ "placement", required_argument, NULL, 'P' },
		{ "sim-devices", required_argument, NULL, 'N' },
		{ "tokens", required_argument, NULL, 't' },
		{ "out", required_argument, NULL, 'o' },
		{ "ram-budget-gb", required_argument, NULL, 'B' },
		{ "ram-profile", required_argument, NULL, 'Q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *model_dir = NULL, *tokens = NULL, *out_path = NULL, *device = "cpu";
	const char *place = NULL, *ram = NULL, *ram_prof = NULL;
	int sim = -1, simbad = 0;
	char *simend;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model_dir = optarg; break;
		case 'd': device = optarg; break;
		case 'P': place = optarg; break;
		case 'N': sim = (int)strtol(optarg, &simend, 10); simbad |= *simend || sim < 0; break;
		case 't': tokens = optarg; break;
		case 'o': out_path = optarg; break;
		case 'B': ram = optarg; break;
		case 'Q': ram_prof = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (simbad)
		return moet_cli_fail(argv[0], moet_err(MOET_EINVAL, "--sim-devices takes a "
							"non-negative integer"));
	if (!model_dir || !tokens || !out_path) {
		usage(stderr);
		return 2;
	}
	int64_t *ids = NULL, n = 0;
	moet_model *m = NULL;
	moet_kv *kv = NULL;
	float *logits = NULL;
	int rc = moet_cli_parse_tokens(tokens, &ids, &n);
	if (!rc)
		rc = moet_cli_open(model_dir, device, place, &m);
	if (!rc && place)
		rc = moet_cli_apply_placement(m, place, sim, NULL);
	if (!rc && ram)
		rc = moet_cli_apply_ram_budget(m, ram, ram_prof);
	if (!rc)
		rc = moet_kv_create(m, n, &kv);
	const int64_t V = rc ? 0 : moet_model_config(m)->vocab_size;
	if (!rc && !(logits = malloc((size_t)(n * V) * sizeof(float))))
		rc = moet_err(MOET_ENOMEM, "logits [%lld, %lld]", (long long)n, (long long)V);
	if (!rc)
		rc = moet_model_forward(m, kv, ids, n, logits);
	if (!rc) {
		int64_t shape[2] = { n, V };
		rc = moet_npy_write(out_path, MOET_DT_F32, 2, shape, logits);
		moet_cli_ram_report(m, stderr);
	}
	free(logits);
	free(ids);
	moet_kv_destroy(kv);
	moet_model_close(m);
	return rc ? moet_cli_fail("logits", rc) : 0;
}
