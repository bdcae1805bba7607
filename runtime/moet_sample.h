/*
 * moet_sample.h: choosing the next token from a row of logits: greedy, or seeded sampling
 * with temperature, top-k and top-p.
 *
 * Reproducible: a draw depends only on (logits, parameters, seed, position), never on the
 * batch or the backend. The uniform number of a draw is a counter-based function of the seed
 * and the position (splitmix64), so a request with a seed gives the same tokens whatever else
 * runs beside it; and since the backends' logits are bit-identical, so are the draws.
 */
#ifndef MOET_SAMPLE_H
#define MOET_SAMPLE_H

#include <stdint.h>

typedef struct moet_sample_params {
	double temperature; /* 0: greedy (argmax, ties to the lowest id) */
	int64_t top_k;      /* 0: no limit */
	double top_p;       /* in (0, 1]; 1: no limit */
	uint64_t seed;
} moet_sample_params;

/* Greedy decoding: the index of the largest value, ties to the lowest index, NaN never wins
 * (0 if every value is NaN). */
int64_t moet_argmax(const float *logits, int64_t n);

/*
 * The token for position `pos` of a sequence sampled with p from logits[n]:
 *   temperature 0 -> moet_argmax;
 *   otherwise z = logits / temperature; candidates sorted by z descending (ties: lower id);
 *   the first top_k (if > 0); then the shortest prefix whose probabilities (softmax over the
 *   kept candidates, binary64) sum to >= top_p; u = the draw's uniform in [0, 1) times the
 *   prefix's total; the first candidate whose running sum exceeds u.
 * scratch: n int64 (borrowed). Returns 0 and *out_id, or MOET_EINVAL (temperature < 0, top_p
 * outside (0, 1], top_k < 0, n < 1).
 */
int moet_sample(const float *logits, int64_t n, const moet_sample_params *p, int64_t pos,
		int64_t *scratch, int64_t *out_id);

/* 0, or MOET_EINVAL naming the parameter out of range. */
int moet_sample_check(const moet_sample_params *p);

/* The uniform in [0, 1) of the draw for (seed, pos) (53 bits). */
double moet_sample_uniform(uint64_t seed, int64_t pos);

#endif
