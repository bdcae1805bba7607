/*
 * cli_heatmap.c: `moet-hybrid heatmap`: the SVG picture of a routing profile and, with
 * --placement, of which experts are GPU-resident (placement/moet_heatmap.h).
 *
 * Only config.json is read from the model (the geometry against which the profile and the
 * placement are checked); no weights, no shard headers. The hit rate in the title is the
 * placement's share of the profile's routings of the phase (moet_plan_hit_rate).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_config.h"
#include "moet_err.h"
#include "moet_heatmap.h"
#include "moet_placement.h"
#include "moet_plan.h"
#include "moet_profile.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: moet-hybrid heatmap --model DIR --profile P [--placement F.yaml]\n"
		"                           [--phase decode|prefill|both] --out PICTURE.svg\n\n"
		"Draws MoE layers x routed experts; a cell's color is the expert's routings in\n"
		"the phase (default decode) over the layer's busiest expert (square root, pale\n"
		"to dark red). With --placement, a bar in the GPU's color under each GPU-resident\n"
		"expert, and the placement's hit rate on the profile in the title. Only\n"
		"config.json is read from DIR. Format: docs/profile-and-plan.md.\n");
}

static int run_heatmap(const char *model, const char *profile, const char *placement,
		       moet_plan_phase ph, const char *out)
{
	moet_config cf;
	moet_profile *p = NULL;
	moet_placement *pl = NULL;
	double *scores = NULL;
	uint8_t *mask = NULL;
	const char **names = NULL;
	int rc = moet_config_load(model, &cf);
	if (!rc && !(rc = moet_profile_load(profile, &p)))
		rc = moet_profile_check(p, &cf, profile);
	if (!rc && placement)
		rc = moet_placement_load(placement, &cf, NULL, &pl);
	if (!rc)
		rc = moet_plan_scores(p, ph, &scores);
	const int64_t L = cf.num_hidden_layers, E = cf.n_routed_experts;
	moet_heatmap_in in = { .model = model, .profile = profile,
			       .phase = moet_plan_phase_name(ph), .placement = placement,
			       .n_layers = L, .n_experts = E, .scores = scores,
			       .hit_rate = -1 };
	if (!rc)
		in.is_moe = p->is_moe;
	if (!rc && pl) {
		const int n = moet_placement_n_gpus(pl);
		names = calloc((size_t)n, sizeof(*names));
		mask = malloc((size_t)(L * E));
		if (!names || !mask) {
			rc = moet_err(MOET_ENOMEM, "heatmap");
		} else {
			for (int g = 0; g < n; g++)
				names[g] = moet_placement_gpu_at(pl, g)->name;
			const int16_t *own = moet_placement_owners(pl);
			for (int64_t i = 0; i < L * E; i++)
				mask[i] = own[i] >= 0;
			in.owner = own;
			in.n_gpus = n;
			in.gpu_names = names;
			in.hit_rate = moet_plan_hit_rate(scores, L, E, mask);
		}
	}
	if (!rc)
		rc = moet_heatmap_save(&in, out);
	if (!rc) {
		printf("wrote %s (%s routings", out, moet_plan_phase_name(ph));
		if (in.hit_rate >= 0)
			printf("; placement hit rate %.4f", in.hit_rate);
		printf(")\n");
	}
	free(names);
	free(mask);
	free(scores);
	moet_placement_free(pl);
	moet_profile_free(p);
	return rc;
}

int moet_cli_heatmap(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "profile", required_argument, NULL, 'p' },
		{ "placement", required_argument, NULL, 'l' },
		{ "phase", required_argument, NULL, 'P' },
		{ "out", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *model = NULL, *profile = NULL, *placement = NULL, *out = NULL;
	moet_plan_phase ph = MOET_PLAN_DECODE;
	int c, rc = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'p': profile = optarg; break;
		case 'l': placement = optarg; break;
		case 'P': if (!rc) rc = moet_plan_phase_parse(optarg, &ph); break;
		case 'o': out = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || !model || !profile || !out) {
		usage(stderr);
		return 2;
	}
	if (!rc)
		rc = run_heatmap(model, profile, placement, ph, out);
	return rc ? moet_cli_fail("heatmap", rc) : 0;
}
