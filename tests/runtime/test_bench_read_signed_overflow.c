/*
 * test_bench_read_signed_overflow.c: moet_bench_read (runtime/bench_ceil.c) on bytes whose
 * 64-bit lanes sum past INT64_MAX. The AVX-512 path folded its accumulators with
 * _mm512_reduce_add_epi64, a signed addition: undefined on such data, and the ASan+UBSan
 * build stopped `bench e2e --hardware-out` reading a checkpoint. Now both paths fold by xor:
 * the result is the xor of every 64-bit word, checked here against a plain loop, on sizes
 * that use the 8-vector loop, the one-vector tail, or both.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moet_bench.h"
#include "moet_test.h"

int main(void)
{
	const size_t max_bytes = 64 * 1024 + 64 * 7;
	uint64_t *buf = aligned_alloc(64, max_bytes);
	CHECK(buf != NULL, "buffer");
	if (!buf)
		return moet_test_done("test_bench_read_signed_overflow");
	uint64_t s = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; i < max_bytes / 8; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		buf[i] = s | 0x4000000000000000ull; /* large lanes: their sum overflows */
	}
	static const size_t sizes[] = { 64, 64 * 7, 64 * 8, 64 * 9, 64 * 1024, 64 * 1024 + 64 * 7 };
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		uint64_t want = 0;
		for (size_t i = 0; i < sizes[k] / 8; i++)
			want ^= buf[i];
		const uint64_t got = moet_bench_read(buf, sizes[k]);
		CHECK(got == want, "%zu bytes (%s): %016llx, the xor of the words %016llx",
		      sizes[k], moet_bench_ceil_isa(), (unsigned long long)got,
		      (unsigned long long)want);
	}
	free(buf);
	return moet_test_done("test_bench_read_signed_overflow");
}
