/*
 * test_gen_layer_share.c: gen-checkpoint --hot-share-by-layer (each MoE layer's hot share
 * given instead of the spread around --hot-share), for plans whose layers differ in
 * concentration (tests/gpu/plan_auto.sh).
 *
 *   - generator.json: each layer's target_share is the value given, in layer order; its
 *     calibrated mc_share within 0.01 of it; hot_share their mean; target_spread 0
 *   - the routing itself: a profile of the model (`profile --synthetic`, the CLI) puts a
 *     larger share of each layer's routings on its hot experts where the target is higher
 *     (the calibration models the router alone, so only the order is asserted, and that the
 *     most concentrated layer is clearly above the flattest)
 *   - refusals: a count that is not the MoE layers' count, a value outside (0, 1), from the
 *     library (MOET_EINVAL / MOET_ERANGE) and the CLI (one line, exit 1)
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_profile.h"
#include "moet_test.h"

int main(void)
{
	char *tmp = moet_test_mkdtemp("genshare");
	if (!tmp)
		return 1;
	char dir[1024], gj[1100], prof[1100], args[2400];
	snprintf(dir, sizeof(dir), "%s/ck", tmp);
	snprintf(gj, sizeof(gj), "%s/generator.json", dir);
	snprintf(prof, sizeof(prof), "%s/p.json", tmp);
	static const double want[3] = { 0.95, 0.4, 0.75 };
	moet_gen_params p;
	moet_gen_params_init(&p);
	p.n_layers = 4; /* layer 0 dense, 3 MoE layers */
	p.layer_hot_share = want;
	p.n_layer_hot_share = 3;
	int rc = moet_gen_checkpoint(dir, &p);
	CHECK(rc == 0, "gen: %s", moet_errmsg());
	json_t *g = rc ? NULL : json_load_file(gj, 0, NULL);
	json_t *layers = json_object_get(g, "layers");
	CHECK(json_is_array(layers) && json_array_size(layers) == 3, "generator.json layers");
	for (size_t k = 0; json_is_array(layers) && k < json_array_size(layers) && k < 3; k++) {
		json_t *l = json_array_get(layers, k);
		const double t = json_number_value(json_object_get(l, "target_share"));
		const double mc = json_number_value(json_object_get(l, "mc_share"));
		CHECK(t == want[k] && fabs(mc - want[k]) < 0.01, "layer %zu: target %g, mc %g, "
		      "want %g", k + 1, t, mc, want[k]);
	}
	const double mean = (want[0] + want[1] + want[2]) / 3;
	CHECK(fabs(json_number_value(json_object_get(g, "hot_share")) - mean) < 1e-12 &&
	      json_number_value(json_object_get(json_object_get(g, "skew_model"),
						"target_spread")) == 0, "hot_share %g (mean %g)",
	      json_number_value(json_object_get(g, "hot_share")), mean);

	/* The routing of the model itself, per layer: share of routings on its hot experts. */
	int st = moet_test_cli(NULL, "profile --model %s --synthetic 24 --seed 3 --max-new 4 "
			       "--quiet --out %s", dir, prof);
	moet_profile *pf = NULL;
	CHECK(st == 0 && moet_profile_load(prof, &pf) == 0, "profile: exit %d %s", st,
	      moet_errmsg());
	double got[3] = { 0 };
	for (size_t k = 0; pf && json_is_array(layers) && k < 3; k++) {
		json_t *l = json_array_get(layers, k);
		const int64_t layer = json_integer_value(json_object_get(l, "layer"));
		json_t *hot = json_object_get(l, "hot_experts");
		double h = 0, all = 0;
		for (int ph = 0; ph < MOET_PROFILE_PHASES; ph++) {
			const uint64_t *c = pf->counts + moet_profile_at(pf, ph, layer);
			for (int64_t e = 0; e < pf->n_experts; e++)
				all += (double)c[e];
			for (size_t i = 0; i < json_array_size(hot); i++)
				h += (double)c[json_integer_value(json_array_get(hot, i))];
		}
		got[k] = all > 0 ? h / all : 0;
		printf("layer %lld: target %.2f, profiled hot share %.3f\n", (long long)layer,
		       want[k], got[k]);
	}
	CHECK(got[0] > got[2] && got[2] > got[1] && got[0] - got[1] > 0.2, "profiled shares "
	      "%.3f %.3f %.3f do not follow the targets 0.95 > 0.75 > 0.4", got[0], got[1], got[2]);
	moet_profile_free(pf);
	json_decref(g);

	/* Refusals. */
	moet_gen_params q = p;
	q.n_layer_hot_share = 2;
	snprintf(dir, sizeof(dir), "%s/bad", tmp);
	CHECK(moet_gen_checkpoint(dir, &q) == MOET_EINVAL && strstr(moet_errmsg(),
	      "2 values for 3 MoE layers"), "count: %s", moet_errmsg());
	static const double out_of[3] = { 0.9, 1.0, 0.5 };
	q = p;
	q.layer_hot_share = out_of;
	CHECK(moet_gen_checkpoint(dir, &q) == MOET_ERANGE && strstr(moet_errmsg(),
	      "value 2 (1) must be in (0, 1)"), "range: %s", moet_errmsg());
	snprintf(args, sizeof(args), "gen-checkpoint --out %s --layers 4 --hot-share-by-layer "
		 "0.9,0.5 --quiet", dir);
	moet_test_cli_expect(args, 1, "--hot-share-by-layer: 2 values for 3 MoE layers");
	snprintf(args, sizeof(args), "gen-checkpoint --out %s --layers 4 --hot-share-by-layer "
		 "0.9,,0.5 --quiet", dir);
	moet_test_cli_expect(args, 1, "--hot-share-by-layer '0.9,,0.5': value 2 is not a number");
	snprintf(args, sizeof(args), "gen-checkpoint --out %s --layers 4 --hot-share-by-layer "
		 "0.9,0.5,0 --quiet", dir);
	moet_test_cli_expect(args, 1, "value 3 is not a number in (0, 1)");
	free(tmp);
	return moet_test_done("test_gen_layer_share");
}
