/*
 * cli_util.c: helpers shared by the subcommands.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_placement.h"

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
