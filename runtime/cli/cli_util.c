/*
 * cli_util.c: helpers shared by the subcommands.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_placement.h"
#include "moet_plan.h"
#include "moet_profile.h"
#include "moet_uring.h"
#include "moet_xtier.h"

int moet_cli_parse_tokens(const char *s, int64_t **out, int64_t *out_n)
{
	int64_t n = 1, i = 0;
	for (const char *p = s; *p; p++)
		n += (*p == ',');
	int64_t *ids = malloc((size_t)n * sizeof(*ids));
	if (!ids)
		return moet_err(MOET_ENOMEM, "--tokens: %lld ids", (long long)n);
	const char *p = s;
	while (i < n) {
		char *end;
		errno = 0;
		long long v = strtoll(p, &end, 10);
		if (end == p || errno || v < 0 || (*end != ',' && *end != '\0')) {
			free(ids);
			return moet_err(MOET_EINVAL, "--tokens: '%s' is not a comma-separated list of "
					"non-negative integers (at item %lld)", s, (long long)i + 1);
		}
		ids[i++] = v;
		p = end + (*end == ',');
	}
	*out = ids;
	*out_n = n;
	return 0;
}

int moet_cli_open(const char *dir, const char *device, const char *place, moet_model **out)
{
	const char *env = getenv("MOET_TP");
	*out = NULL;
	if (!place || (env && *env))
		return moet_model_open_on(dir, device, out);
	char path[4096];
	moet_config cf;
	moet_placement *pl = NULL;
	snprintf(path, sizeof(path), "%s/config.json", dir);
	/* NOTE: no sizes (the checkpoint is not opened twice): the budgets are checked when the
	 * placement is applied */
	int rc = moet_config_load(path, &cf);
	if (!rc)
		rc = moet_placement_load(place, &cf, NULL, &pl);
	const int n = rc ? 0 : moet_placement_n_gpus(pl);
	const int split = !rc && n >= 2 && moet_placement_dense_gpu(pl) == MOET_PLACEMENT_DENSE_SPLIT;
	moet_placement_free(pl);
	if (split && n > 8)
		return moet_err(MOET_EUNSUP, "%s: dense: split over %d GPUs: at most 8 (or name one "
				"GPU for the dense part)", place, n);
	/* NOTE: a placement that does not load opens unsplit; applying it reports the error */
	return moet_model_open_tp(dir, device, split ? n : 1, out);
}

int moet_cli_apply_placement(moet_model *m, const char *path, int sim_devices,
			     int *out_n_devices)
{
	moet_placement_sizes *sz = NULL;
	moet_placement *pl = NULL;
	int rc = moet_placement_sizes_from_ckpt(moet_model_config(m), moet_model_ckpt(m), &sz);
	if (!rc)
		rc = moet_placement_load(path, moet_model_config(m), sz, &pl);
	int n_dev = rc ? 0 : moet_placement_n_gpus(pl);
	if (!rc && sim_devices >= 0 && sim_devices < n_dev)
		rc = moet_err(MOET_EINVAL, "--sim-devices %d: the placement names %d GPUs",
			      sim_devices, n_dev);
	if (!rc && sim_devices > n_dev)
		n_dev = sim_devices;
	if (!rc)
		rc = moet_model_set_placement(m, moet_placement_owners(pl), n_dev);
	if (!rc && out_n_devices)
		*out_n_devices = n_dev;
	moet_placement_free(pl);
	moet_placement_sizes_free(sz);
	return rc;
}

int moet_cli_apply_ram_budget(moet_model *m, const char *value, const char *profile_path)
{
	char *end;
	errno = 0;
	double v = strtod(value, &end);
	int pct = *end == '%';
	if (end == value || errno || (*end && !pct) || (pct && end[1]) || !(v > 0) ||
	    (pct && v > 100) || v > 1e9)
		return moet_err(MOET_EINVAL, "--ram-budget-gb '%s': a size in GiB (2^30 bytes) "
				"above 0, or a share of the CPU tier such as 50%%", value);
	moet_xtier_stats plan;
	moet_profile *prof = NULL;
	int rc = moet_xtier_plan(m, &plan);
	if (!rc && profile_path)
		rc = moet_profile_load(profile_path, &prof);
	size_t bytes = pct ? (size_t)(v / 100.0 * (double)plan.tier_experts) * plan.slot_bytes
			   : (size_t)(v * (double)(1ull << 30));
	if (!rc && pct && bytes < plan.slot_bytes)
		bytes = plan.slot_bytes;
	if (!rc)
		rc = moet_model_set_ram_budget(m, bytes, prof);
	moet_profile_free(prof);
	if (rc)
		return rc;
	moet_xtier *x = moet_model_xtier(m);
	moet_xtier_stats st;
	moet_xtier_stats_get(x, &st);
	const char *note = moet_uring_note(moet_xtier_reader(x));
	fprintf(stderr, "NVMe tier: %.3f GiB: %lld slots of %zu bytes for %lld CPU-tier experts "
		"(%.1f%%, %.3f GiB on disk), %s reads, %s slots, warm fill %llu experts in %.3f s"
		"%s%s\n", (double)bytes / (double)(1ull << 30), (long long)st.n_slots,
		st.slot_bytes, (long long)st.tier_experts,
		st.tier_experts ? 100.0 * (double)st.n_slots / (double)st.tier_experts : 0.0,
		(double)st.tier_bytes / (double)(1ull << 30), st.direct ? "O_DIRECT" : "buffered",
		st.registered ? "registered" : "unregistered", (unsigned long long)st.warm_reads,
		(double)st.warm_ns * 1e-9, note[0] ? "; " : "", note);
	return 0;
}

void moet_cli_ram_report(const moet_model *m, FILE *f)
{
	moet_xtier *x = moet_model_xtier(m);
	if (!x)
		return;
	moet_xtier_stats st;
	moet_xtier_stats_get(x, &st);
	double look = st.lookups ? (double)st.lookups : 1, act = st.actual ? (double)st.actual : 1;
	fprintf(f, "NVMe tier: hit rate %.3f (%llu hits, %llu late, %llu misses of %llu), "
		"predictor recall %.3f (chance %.3f, %llu predicted), %llu prefetched (%llu used), "
		"%.1f MB read, %.3f s waiting, %llu read errors\n",
		(double)(st.hits + st.late_hits) / look, (unsigned long long)st.hits,
		(unsigned long long)st.late_hits, (unsigned long long)st.misses,
		(unsigned long long)st.lookups, (double)st.predicted_hits / act,
		(double)st.chance_hits_x1e6 / 1e6 / act, (unsigned long long)st.predicted,
		(unsigned long long)st.prefetch_reads, (unsigned long long)st.prefetch_used,
		(double)st.bytes_read * 1e-6, (double)st.wait_ns * 1e-9,
		(unsigned long long)st.read_errors);
	fprintf(f, "NVMe tier: prefetch %s: %llu candidates declined; disk %.3f GB/s while busy, "
		"prediction to use %.3f ms, precision %.3f, misses per acquire %.2f\n",
		st.prefetch_mode == MOET_XTIER_PF_ALL ? "all" : "budget",
		(unsigned long long)st.prefetch_declined, st.pf_rate_Bps * 1e-9,
		st.pf_window_ns * 1e-6, st.pf_precision, st.pf_miss_avg);
}

int moet_cli_parse_list(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t **out,
			int *out_n)
{
	int64_t n = 0;
	free(*out);
	*out = NULL;
	*out_n = 0;
	int rc = moet_cli_parse_tokens(s, out, &n);
	if (rc)
		return rc == MOET_EINVAL ? moet_err(MOET_EINVAL, "%s: '%s' is not a list of "
							  "integers", opt, s) : rc;
	for (int64_t i = 0; i < n; i++)
		if ((*out)[i] < lo || (*out)[i] > hi)
			return moet_err(MOET_EINVAL, "%s: %lld is not in [%lld, %lld]", opt,
					(long long)(*out)[i], (long long)lo, (long long)hi);
	*out_n = (int)n;
	return 0;
}

int moet_cli_load_owner(const char *dir, const char *path, int16_t **out, int *out_n)
{
	moet_model *m = NULL;
	moet_placement_sizes *sz = NULL;
	moet_placement *pl = NULL;
	int rc = moet_model_open(dir, &m);
	if (!rc)
		rc = moet_placement_sizes_from_ckpt(moet_model_config(m), moet_model_ckpt(m), &sz);
	if (!rc)
		rc = moet_placement_load(path, moet_model_config(m), sz, &pl);
	if (!rc)
		*out_n = moet_placement_n_gpus(pl);
	if (!rc) {
		const moet_config *c = moet_model_config(m);
		size_t n = (size_t)(c->num_hidden_layers * c->n_routed_experts);
		if (!(*out = malloc((n ? n : 1) * sizeof(int16_t))))
			rc = moet_err(MOET_ENOMEM, "owner table");
		else
			memcpy(*out, moet_placement_owners(pl), n * sizeof(int16_t));
	}
	moet_placement_free(pl);
	moet_placement_sizes_free(sz);
	moet_model_close(m);
	return rc;
}

int moet_cli_hot_owner(const char *dir, const char *profile_path, int64_t k, int16_t **out)
{
	moet_model *m = NULL;
	moet_placement_sizes *sz = NULL;
	moet_profile *prof = NULL;
	moet_plan *pl = NULL;
	double *scores = NULL;
	/* NOTE: no memory budget: K per layer is what was asked for; a GPU without room for
	 * them fails when the placement is set, naming the bytes */
	const moet_plan_budget b = { .n_gpus = 1, .budget_bytes = (uint64_t)1 << 60,
				     .hot_per_layer = k };
	int rc = moet_model_open(dir, &m);
	const moet_config *c = rc ? NULL : moet_model_config(m);
	if (!rc)
		rc = moet_placement_sizes_from_ckpt(c, moet_model_ckpt(m), &sz);
	if (!rc && !(rc = moet_profile_load(profile_path, &prof)))
		rc = moet_profile_check(prof, c, profile_path);
	if (!rc)
		rc = moet_plan_scores(prof, MOET_PLAN_DECODE, &scores);
	if (!rc)
		rc = moet_plan_make(c, sz, scores, &b, &pl);
	if (!rc) {
		size_t n = (size_t)(c->num_hidden_layers * c->n_routed_experts);
		if (!(*out = malloc((n ? n : 1) * sizeof(int16_t))))
			rc = moet_err(MOET_ENOMEM, "owner table");
		else
			memcpy(*out, pl->owner, n * sizeof(int16_t));
	}
	moet_plan_free(pl);
	free(scores);
	moet_profile_free(prof);
	moet_placement_sizes_free(sz);
	moet_model_close(m);
	return rc;
}
