/*
 * dtype.c: safetensors dtype names and sizes; the e4m3 and f16 conversions that are not
 * needed on the device.
 */
#include "moet_dtype.h"

#include <string.h>

static const struct {
	const char *name;
	size_t size;
} dtype_info[MOET_DT_COUNT_] = {
	[MOET_DT_INVALID] = { "INVALID", 0 },
	[MOET_DT_BOOL] = { "BOOL", 1 },
	[MOET_DT_U8] = { "U8", 1 },
	[MOET_DT_I8] = { "I8", 1 },
	[MOET_DT_F8_E4M3] = { "F8_E4M3", 1 },
	[MOET_DT_F8_E5M2] = { "F8_E5M2", 1 },
	[MOET_DT_I16] = { "I16", 2 },
	[MOET_DT_U16] = { "U16", 2 },
	[MOET_DT_F16] = { "F16", 2 },
	[MOET_DT_BF16] = { "BF16", 2 },
	[MOET_DT_I32] = { "I32", 4 },
	[MOET_DT_U32] = { "U32", 4 },
	[MOET_DT_F32] = { "F32", 4 },
	[MOET_DT_I64] = { "I64", 8 },
	[MOET_DT_U64] = { "U64", 8 },
	[MOET_DT_F64] = { "F64", 8 },
};

size_t moet_dtype_size(moet_dtype dt)
{
	return (dt > MOET_DT_INVALID && dt < MOET_DT_COUNT_) ? dtype_info[dt].size : 0;
}

const char *moet_dtype_name(moet_dtype dt)
{
	return (dt > MOET_DT_INVALID && dt < MOET_DT_COUNT_) ? dtype_info[dt].name : "INVALID";
}

moet_dtype moet_dtype_parse(const char *s)
{
	for (int i = 1; i < MOET_DT_COUNT_; i++)
		if (strcmp(s, dtype_info[i].name) == 0)
			return (moet_dtype)i;
	return MOET_DT_INVALID;
}

uint8_t moet_enc_e4m3(float f)
{
	uint32_t u = moet_f32_bits(f);
	uint8_t s = (uint8_t)((u >> 24) & 0x80u);
	float a = f < 0 ? -f : f;
	if (f != f)
		return 0x7F;
	if (a >= 464.0f) /* halfway between 448 and the (absent) 480 rounds to 448 too */
		return (uint8_t)(s | 0x7E);
	/* Search the 127 non-negative finite codes: nearest, ties to the even code. Writers call
	 * this per weight; 7 comparisons of a binary search keep it cheap. */
	int lo = 0, hi = 0x7E;
	while (hi - lo > 1) {
		int mid = (lo + hi) / 2;
		if (moet_dec_e4m3((uint8_t)mid) <= a)
			lo = mid;
		else
			hi = mid;
	}
	float dl = a - moet_dec_e4m3((uint8_t)lo);
	float dh = moet_dec_e4m3((uint8_t)hi) - a;
	int c = (dl < dh) ? lo : (dh < dl) ? hi : ((lo & 1) ? hi : lo);
	return (uint8_t)(s | c);
}

float moet_dec_f16(uint16_t h)
{
	uint32_t s = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1Fu;
	uint32_t m = h & 0x3FFu;
	if (e == 0) {
		float v = (float)m * 0x1p-24f;
		return s ? -v : v;
	}
	if (e == 31)
		return moet_bits_f32(s | 0x7F800000u | (m << 13));
	return moet_bits_f32(s | ((e + 112u) << 23) | (m << 13));
}
