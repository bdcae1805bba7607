/*
 * cost_int.h: internals of the decode step cost model shared by cost_model.c (one pass) and
 * cost_mb.c (two micro-batches). moet_cost.h has the model.
 */
#ifndef MOET_COST_INT_H
#define MOET_COST_INT_H

#include "moet_cost.h"

/* The copies of a layer whose CPU tier works with chance a_cpu, for `batch` rows (ms). */
double cost_transfer_ms(const moet_cost_in *in, int64_t batch, double a_cpu);

/* The dense part of a step of `batch` sequences (ms): the measured curve, else bytes / read. */
double cost_dense_ms(const moet_cost_in *in, int64_t batch);

/* The two-micro-batch form of the step (moet_cost.h's design note) into *out; in->n_gpus must
 * be 1 and in->batch >= 2, owners already checked. 0 or MOET_ENOMEM. */
int cost_mb_predict(const moet_cost_in *in, const double *scores, int64_t n_layers,
		    int64_t n_experts, const int16_t *owner, moet_cost_mb *out);

#endif
