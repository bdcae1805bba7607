/*
 * place_int.h: the placement handle's layout, shared by placement.c (table, accounting,
 * writer), place_yaml.c (reader) and place_sizes.c (byte sizes).
 */
#ifndef MOET_PLACE_INT_H
#define MOET_PLACE_INT_H

#include "moet_placement.h"

struct moet_placement {
	char *label;                  /* path or caller's label, for errors */
	int n_gpus;
	moet_placement_gpu *gpus;     /* [n_gpus] */
	int dense_gpu;                /* GPU index or MOET_PLACEMENT_DENSE_SPLIT */
	int dense_line;               /* line of `dense:`, 0 if absent */
	int64_t n_layers;
	int64_t n_experts;
	uint8_t *is_moe;              /* [n_layers] */
	int16_t *owner;               /* [n_layers x n_experts] */
};

/* An empty placement (all experts on the CPU, no GPU yet) for the geometry of `cf`. */
int place_alloc(const char *label, const moet_config *cf, moet_placement **out);

/* Checks a GPU name: [A-Za-z0-9_.-]{1,31}, not "cpu". 0 or -1. */
int place_name_ok(const char *s);

#endif
