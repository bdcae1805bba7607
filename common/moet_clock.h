/*
 * moet_clock.h: the monotonic clock in nanoseconds the counters of the engine, the executor and
 * the backends read.
 */
#ifndef MOET_CLOCK_H
#define MOET_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t moet_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
