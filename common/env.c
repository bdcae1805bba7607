/*
 * env.c: moet_env_choice (moet_env.h).
 */
#include "moet_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"

int moet_env_choice(const char *var, const char *const *names, int n, int *out)
{
	const char *v = getenv(var);
	*out = 0;
	if (!v || !*v)
		return 0;
	for (int i = 0; i < n; i++)
		if (names[i] && !strcmp(v, names[i])) {
			*out = i;
			return 0;
		}
	char list[160] = "";
	const int first = n > 0 && !names[0]; /* NOTE: only names[0] may be NULL */
	for (int i = first; i < n; i++) {
		size_t at = strlen(list);
		snprintf(list + at, sizeof(list) - at, "%s%s", names[i],
			 i + 2 < n ? ", " : i + 1 < n ? " or " : "");
	}
	return moet_err(MOET_EINVAL, "%s='%.40s': expected %s", var, v, list);
}
