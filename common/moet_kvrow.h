/*
 * moet_kvrow.h: where a position of a paged KV cache lives, one definition for host C (the
 * CPU reference, runtime/) and CUDA device code (gpu/).
 *
 * A pool (runtime/kv_pool.c) holds per layer [rows][row floats]; its rows are cut into blocks
 * of 2^shift positions. A sequence's block table names the pool block of each of its blocks:
 *
 *   position p  ->  pool row  blocks[p >> shift] << shift  |  p & (2^shift - 1)
 *
 *   table [5, 2, 9], shift 2:   positions 0..3 -> rows 20..23, 4..7 -> 8..11, 8..11 -> 36..39
 *
 * blocks NULL: the identity (row p), a contiguous cache.
 */
#ifndef MOET_KVROW_H
#define MOET_KVROW_H

#include "moet_hd.h"

MOET_HD int64_t moet_kv_row(const int32_t *blocks, int shift, int64_t p)
{
	if (!blocks)
		return p;
	return ((int64_t)blocks[p >> shift] << shift) | (p & (((int64_t)1 << shift) - 1));
}

#endif
