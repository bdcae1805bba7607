/*
 * moet_group.h: the grouping of a MoE layer's routing pairs (runtime/group_ref.c), the host
 * specification of moet_gpu_group_pairs (gpu/group.cu): the same outputs, in the same
 * moet_gpu_group_bufs layout, here in host memory.
 *
 * The order it specifies is runtime/dispatch.c's (staging off): moet_expert_pairs_sort, then
 * for each tier (device 0 .. n_dev-1, then the CPU tier) the sorted pairs whose expert it owns;
 * slot[pair] = the pair's position in that list. Written as that walk (sort, then one pass per
 * tier), not as the device's counting sort, so that the two are independent.
 */
#ifndef MOET_GROUP_H
#define MOET_GROUP_H

#include <stdint.h>

#include "moet_gpu.h"

/*
 * moet_gpu_group_pairs's outputs on the host: ids [n_pairs] and owner [n_exp] (NULL: every
 * expert on device 0, n_dev >= 1) are host arrays, out's pointers host arrays of the sizes
 * moet_gpu.h gives. Bad ids and owners are handled as there (slot -1, in no tier, err says
 * so) and are not an error of this function; moet_group_check turns err into one.
 * Returns 0, MOET_EINVAL (counts outside moet_gpu.h's limits, NULL pointers; the detail says
 * which) or MOET_ENOMEM (a temporary array of n_pairs pairs). Thread-safe.
 */
int moet_group_ref(const int32_t *ids, int64_t n_pairs, int64_t n_exp, const int16_t *owner,
		   int n_dev, const moet_gpu_group_bufs *out);

/*
 * err[3] (a grouping's report, downloaded) as a return code: 0 when clean, else MOET_ERANGE
 * with a one-line detail naming layer `layer`, the first bad pair and its id (ids: the host
 * copy of the grouped call's ids, or NULL) or the first expert with a bad owner.
 */
int moet_group_check(const int32_t *err, int64_t layer, const int32_t *ids, int64_t n_exp,
		     int n_dev);

#endif
