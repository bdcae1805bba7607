/*
 * moet_json.h: small helpers over jansson shared by the readers of JSON files.
 */
#ifndef MOET_JSON_H
#define MOET_JSON_H

#include <jansson.h>

/* "object", "array", "string", "integer", "number", "boolean" or "null": for messages. */
const char *moet_json_kind(const json_t *v);

#endif
