/*
 * moet_env.h: the MOET_* switches that name one of a few values, read the same way everywhere.
 */
#ifndef MOET_ENV_H
#define MOET_ENV_H

/*
 * *out = i where getenv(var) equals names[i] (i < n); unset or empty: *out = 0 (names[0] is
 * the default; names[0] may be NULL for a default with no name, which only unset or empty
 * select). Anything else: MOET_EINVAL, "VAR='value': expected a, b or c" (the names that are
 * not NULL; the value cut at 40 characters), *out = 0.
 */
int moet_env_choice(const char *var, const char *const *names, int n, int *out);

#endif
