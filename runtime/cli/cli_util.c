/*
 * cli_util.c: helpers shared by the subcommands.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_err.h"

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
