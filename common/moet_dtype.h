/*
 * moet_dtype.h: tensor element types of safetensors files, and exact decoders to binary32.
 *
 * The decoders are the dec() of the numerics contract (docs/numerics.md): every F8_E4M3 code
 * except the two NaN codes (0x7F, 0xFF), every BF16 and every F32 value maps to exactly one
 * binary32 value, with no rounding. They are written once here for host and device.
 *
 *   e4m3fn byte:  s eeee mmm      e == 0: (-1)^s * m * 2^-9          (subnormal, exact)
 *                                 e  > 0: (-1)^s * (1 + m/8) * 2^(e-7)
 *                                 0x7F / 0xFF: NaN (a checkpoint defect; never computed on)
 */
#ifndef MOET_DTYPE_H
#define MOET_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "moet_hd.h"

typedef enum moet_dtype {
	MOET_DT_INVALID = 0,
	MOET_DT_BOOL,
	MOET_DT_U8,
	MOET_DT_I8,
	MOET_DT_F8_E4M3,
	MOET_DT_F8_E5M2,
	MOET_DT_I16,
	MOET_DT_U16,
	MOET_DT_F16,
	MOET_DT_BF16,
	MOET_DT_I32,
	MOET_DT_U32,
	MOET_DT_F32,
	MOET_DT_I64,
	MOET_DT_U64,
	MOET_DT_F64,
	MOET_DT_COUNT_
} moet_dtype;

#ifdef __cplusplus
extern "C" {
#endif
/* Bytes per element (0 for MOET_DT_INVALID). */
size_t moet_dtype_size(moet_dtype dt);
/* safetensors spelling ("F8_E4M3"), or "INVALID". */
const char *moet_dtype_name(moet_dtype dt);
/* Parses a safetensors dtype string; MOET_DT_INVALID if unknown. */
moet_dtype moet_dtype_parse(const char *s);
#ifdef __cplusplus
}
#endif

/* Exact e4m3fn decode. NaN codes decode to a quiet NaN (callers validate before use). */
MOET_HD float moet_dec_e4m3(uint8_t c)
{
	uint32_t s = (uint32_t)(c & 0x80u) << 24;
	uint32_t e = (c >> 3) & 0xFu;
	uint32_t m = c & 0x7u;
	if ((c & 0x7Fu) == 0x7Fu)
		return moet_bits_f32(0x7FC00000u | s);
	if (e == 0) {
		float v = (float)m * 0x1p-9f; /* exact: m <= 7 */
		return s ? -v : v;
	}
	return moet_bits_f32(s | ((e + 120u) << 23) | (m << 20));
}

/* Exact bf16 widening. */
MOET_HD float moet_dec_bf16(uint16_t b)
{
	return moet_bits_f32((uint32_t)b << 16);
}

/* binary32 -> bf16, round to nearest even (NaN stays NaN). For writers and tests. */
MOET_HD uint16_t moet_enc_bf16(float f)
{
	uint32_t u = moet_f32_bits(f);
	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7FFFu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

/* binary32 -> e4m3fn, round to nearest even, saturating to +-448 (as torch's
 * float8_e4m3fn cast does for finite inputs); NaN -> 0x7F. For writers and tests. */
#ifdef __cplusplus
extern "C" {
#endif
uint8_t moet_enc_e4m3(float f);

/* IEEE half -> binary32 (exact). */
float moet_dec_f16(uint16_t h);
#ifdef __cplusplus
}
#endif

#endif
