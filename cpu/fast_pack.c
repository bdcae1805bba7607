/*
 * fast_pack.c: dequantized weight panels for the fast expert mode (fast_int.h; layouts drawn
 * there). Outside the exact-numerics contract like the rest of fast mode, but the scalar and
 * AVX-512 paths here give the same bits, and tests/cpu/test_expert_fast.c checks that.
 *
 * Value of one element: F8_E4M3 code c in scale block s: bf16(f32(dec(c) * s)), to nearest
 * even, any NaN as 0x7FC0; BF16: the bits as they are.
 *
 * NOTE: e4m3fn -> binary32 without a table: for e > 0 the 7 magnitude bits shifted to f32
 * bits 20..26 plus 120 in the exponent field are the value; e == 0 (subnormal m 2^-9) goes
 * through int -> float, exact. No f32 subnormal is ever formed there: x86 multiplies them
 * through a microcode assist (~100 cycles), which made an earlier loop 10x slower. 0x7F: NaN.
 *
 * NOTE: the tile path exists because writing a 4 KB VNNI block element by element (or one
 * k pair per store) cost more than oneDNN's matmul itself on the AMX host; 16 rows x 32
 * columns per step make every store a full 64-byte line.
 */
#include <string.h>

#include <immintrin.h>

#include "fast_int.h"
#include "moet_dtype.h"

/* ---- scalar reference ------------------------------------------------------------------- */

static uint16_t elem_ref(const moet_mat *w, int64_t r, int64_t k)
{
	const int64_t K = w->cols;
	if (w->dtype == MOET_DT_BF16)
		return ((const uint16_t *)w->data)[r * K + k];
	const int64_t bc = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const float s = w->scale_inv[(r / MOET_BLOCK) * bc + k / MOET_BLOCK];
	const float v = moet_dec_e4m3(((const uint8_t *)w->data)[r * K + k]) * s;
	return v != v ? 0x7FC0 : moet_enc_bf16(v);
}

/* Row of panel column n (its matrix in *w, its row in *r), or 0 for a padding column. */
static int col_row(const moet_fast_rows *a, const moet_fast_rows *b, int64_t n,
		   const moet_mat **w, int64_t *r)
{
	if (n < a->n) {
		*w = a->w, *r = a->r0 + n;
		return 1;
	}
	if (n - a->n < b->n) {
		*w = b->w, *r = b->r0 + n - a->n;
		return 1;
	}
	return 0;
}

static void pack_ref(const moet_fast_layout *lay, const moet_fast_rows *a,
		     const moet_fast_rows *b, int64_t k0, int64_t kn, uint16_t *panel)
{
	for (int64_t n = 0; n < lay->pn; n++) {
		const moet_mat *w = NULL;
		int64_t r = 0;
		const int have = col_row(a, b, n, &w, &r);
		uint16_t *col = panel + lay->off_n[n];
		for (int64_t k = 0; k < lay->pk; k++)
			col[lay->off_k[k]] = have && k < kn ? elem_ref(w, r, k0 + k) : 0;
	}
}

/* ---- AVX-512 ---------------------------------------------------------------------------- */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* 16 e4m3 codes -> binary32, exactly (see the note at the top). */
AVX512 static __m512 dec16(__m128i codes)
{
	const __m512i c = _mm512_cvtepu8_epi32(codes);
	const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
	const __m512i sgn = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
	const __m512i nrm = _mm512_add_epi32(_mm512_slli_epi32(mag, 20),
					     _mm512_set1_epi32(120 << 23));
	const __mmask16 sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
	__m512 v = _mm512_castsi512_ps(nrm);
	v = _mm512_mask_mul_ps(v, sub, _mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f));
	v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sgn));
	const __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
	return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
}

/* v rounded to bf16 (nearest even, NaN as 0x7FC0) in the high 16 bits of each lane. */
AVX512 static __m512i rne_hi(__m512 v)
{
	__m512i u = _mm512_castps_si512(v);
	const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
	const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
	return _mm512_mask_mov_epi32(u, nan, _mm512_set1_epi32(0x7FC00000));
}

/* bf16 of lo (words 0..15) and hi (16..31): the high halves of rne_hi's lanes. */
AVX512 static __m512i pack32(__m512 lo, __m512 hi)
{
	const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39,
					     37, 35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13,
					     11, 9, 7, 5, 3, 1);
	return _mm512_permutex2var_epi16(rne_hi(lo), odd, rne_hi(hi));
}

/* Columns k .. k+nv-1 (nv <= 32, inside one scale block) of row r as 32 bf16, zeros after. */
AVX512 static __m512i row32(const moet_mat *w, int64_t r, int64_t k, int64_t nv)
{
	const int64_t K = w->cols;
	const __mmask32 m = nv >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << nv) - 1);
	if (w->dtype == MOET_DT_BF16)
		return _mm512_maskz_loadu_epi16(m, (const uint16_t *)w->data + r * K + k);
	const int64_t bc = (K + MOET_BLOCK - 1) / MOET_BLOCK;
	const __m512 s = _mm512_set1_ps(w->scale_inv[(r / MOET_BLOCK) * bc + k / MOET_BLOCK]);
	const __m256i c = _mm256_maskz_loadu_epi8(m, (const uint8_t *)w->data + r * K + k);
	/* masked: zeros past the data, whatever the scale (0 x inf would be NaN) */
	return _mm512_maskz_mov_epi16(m, pack32(_mm512_mul_ps(dec16(_mm256_castsi256_si128(c)),
							      s),
						_mm512_mul_ps(dec16(_mm256_extracti128_si256(c, 1)),
							      s)));
}

/* In place: r[i] word j <-> r[j] word i (16 x 16 32-bit words). */
AVX512 static void transpose16(__m512i r[16])
{
	__m512i t[16];
	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
	}
	for (int i = 0; i < 4; i++) { /* r[4i + j]: word j of each 128-bit lane, rows 4i.. */
		r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
		r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
		r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
		r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
	}
	for (int j = 0; j < 4; j++) {
		__m512i u0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
		__m512i u1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
		__m512i u2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
		__m512i u3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
		t[j] = _mm512_shuffle_i32x4(u0, u2, 0x88);
		t[4 + j] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
		t[8 + j] = _mm512_shuffle_i32x4(u1, u3, 0x88);
		t[12 + j] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
	}
	for (int i = 0; i < 16; i++)
		r[i] = t[i];
}

/*
 * Table path (AVX-512 VBMI): with the scale fixed, an element depends on its code alone, so
 * for one 128 x 128 scale block the 128 magnitudes' bf16 values are computed once (by
 * pack32, the same bits) and split into a low-byte and a high-byte table of 128 entries
 * each; vpermi2b then looks up 64 codes per instruction. The sign bit is or'ed in, except
 * for NaN (magnitude 0x7F), which stays 0x7FC0 like the scalar path.
 * NOTE: this made dequantization several times cheaper than decoding each code through
 * binary32 (about 25 vector operations per 16 codes), which was most of fast mode's fixed
 * cost per call at 256 tokens on the AMX host.
 */
typedef struct lut {
	__m512i lo0, lo1, hi0, hi1; /* bytes of bf16(dec(m) * s) for m < 64, 64 <= m < 128 */
} lut;

#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))

VBMI static void lut_make(float s, lut *t)
{
	uint16_t v[128] __attribute__((aligned(64)));
	const __m512 vs = _mm512_set1_ps(s);
	for (int i = 0; i < 128; i += 32) {
		__m128i c0 = _mm_add_epi8(_mm_set1_epi8((char)i), _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6,
						7, 8, 9, 10, 11, 12, 13, 14, 15));
		__m128i c1 = _mm_add_epi8(c0, _mm_set1_epi8(16));
		_mm512_store_si512(v + i, pack32(_mm512_mul_ps(dec16(c0), vs),
						 _mm512_mul_ps(dec16(c1), vs)));
	}
	__m512i even = _mm512_set_epi8(126, 124, 122, 120, 118, 116, 114, 112, 110, 108, 106, 104,
				       102, 100, 98, 96, 94, 92, 90, 88, 86, 84, 82, 80, 78, 76,
				       74, 72, 70, 68, 66, 64, 62, 60, 58, 56, 54, 52, 50, 48, 46,
				       44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24, 22, 20, 18, 16,
				       14, 12, 10, 8, 6, 4, 2, 0);
	__m512i odd = _mm512_add_epi8(even, _mm512_set1_epi8(1));
	__m512i z0 = _mm512_load_si512(v), z1 = _mm512_load_si512(v + 32);
	__m512i z2 = _mm512_load_si512(v + 64), z3 = _mm512_load_si512(v + 96);
	t->lo0 = _mm512_permutex2var_epi8(z0, even, z1);
	t->hi0 = _mm512_permutex2var_epi8(z0, odd, z1);
	t->lo1 = _mm512_permutex2var_epi8(z2, even, z3);
	t->hi1 = _mm512_permutex2var_epi8(z2, odd, z3);
}

/* 32 codes of row a (bytes 0..31 of c) and of row b (32..63) through table t: 32 bf16 each. */
VBMI static void lut_rows(const lut *t, __m512i c, __m512i *ra, __m512i *rb)
{
	const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi8(0x7F));
	const __m512i lo = _mm512_permutex2var_epi8(t->lo0, mag, t->lo1);
	__m512i hi = _mm512_permutex2var_epi8(t->hi0, mag, t->hi1);
	const __mmask64 num = _mm512_cmpneq_epi8_mask(mag, _mm512_set1_epi8(0x7F));
	hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_maskz_mov_epi8(num, c),
						  _mm512_set1_epi8((char)0x80)));
	const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
	*ra = _mm512_permutex2var_epi64(w0, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), w1);
	*rb = _mm512_permutex2var_epi64(w0, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), w1);
}

/* pack_tiles for a group of 16 full F8 rows of one matrix and one 128-row scale block,
 * columns k0 .. k0+kn-1; tabs: one table per scale block of those columns (cb0 first). */
VBMI static void tiles_lut(const moet_fast_layout *lay, const moet_mat *w, int64_t r0,
			   int64_t n0, int64_t k0, int64_t kn, const lut *tabs, int64_t cb0,
			   uint16_t *panel)
{
	const int64_t K = w->cols, nb2 = 2 * lay->nb;
	const uint8_t *q = (const uint8_t *)w->data + r0 * K + k0;
	for (int64_t kk = 0; kk < lay->pk; kk += 32) {
		const int64_t nv = kn - kk < 32 ? (kn - kk > 0 ? kn - kk : 0) : 32;
		const __mmask32 m = nv >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << nv) - 1);
		const lut *t = &tabs[(k0 + kk) / MOET_BLOCK - cb0];
		__m512i v[16];
		for (int i = 0; i < 16; i += 2) {
			__m512i c = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(m, q + i * K + kk));
			c = _mm512_inserti64x4(c, _mm256_maskz_loadu_epi8(m, q + (i + 1) * K + kk), 1);
			lut_rows(t, c, &v[i], &v[i + 1]);
			if (nv < 32) { /* zeros past the data, whatever the scale */
				v[i] = _mm512_maskz_mov_epi16(m, v[i]);
				v[i + 1] = _mm512_maskz_mov_epi16(m, v[i + 1]);
			}
		}
		transpose16(v);
		uint16_t *dst = panel + lay->off_k[kk] + lay->off_n[n0];
		for (int j = 0; j < 16; j++)
			_mm512_storeu_si512(dst + j * nb2, v[j]);
	}
}

/* BA16a<nb>b2a, k0 % 32 == 0: 16 columns x 32 k per step (see fast_int.h). */
#define MAX_CB 32 /* scale blocks of columns per panel with tables (chunks up to 4096) */

AVX512 static void pack_tiles(const moet_fast_layout *lay, const moet_fast_rows *a,
			      const moet_fast_rows *b, int64_t k0, int64_t kn, uint16_t *panel,
			      int vbmi)
{
	const int64_t nb2 = 2 * lay->nb;
	const int64_t cb0 = k0 / MOET_BLOCK, ncb = (k0 + lay->pk - 1) / MOET_BLOCK - cb0 + 1;
	lut tabs[MAX_CB];
	const moet_mat *tab_w = NULL;
	int64_t tab_rb = -1;
	for (int64_t n0 = 0; n0 < lay->pn; n0 += 16) {
		const moet_mat *w[16];
		int64_t r[16];
		int have[16];
		int same = vbmi; /* 16 F8 rows of one matrix and scale block, in order */
		for (int i = 0; i < 16; i++) {
			have[i] = col_row(a, b, n0 + i, &w[i], &r[i]);
			same = same && have[i] && w[i] == w[0] && r[i] == r[0] + i &&
			       r[i] / MOET_BLOCK == r[0] / MOET_BLOCK;
		}
		if (same && w[0]->dtype == MOET_DT_F8_E4M3 && ncb <= MAX_CB) {
			const int64_t rb = r[0] / MOET_BLOCK;
			if (w[0] != tab_w || rb != tab_rb) {
				const int64_t bc = (w[0]->cols + MOET_BLOCK - 1) / MOET_BLOCK;
				for (int64_t cb = cb0; cb < cb0 + ncb; cb++)
					lut_make(w[0]->scale_inv[rb * bc + (cb < bc ? cb : bc - 1)],
						 &tabs[cb - cb0]);
				tab_w = w[0], tab_rb = rb;
			}
			tiles_lut(lay, w[0], r[0], n0, k0, kn, tabs, cb0, panel);
			continue;
		}
		for (int64_t kk = 0; kk < lay->pk; kk += 32) {
			const int64_t nv = kn - kk < 32 ? (kn - kk > 0 ? kn - kk : 0) : 32;
			__m512i v[16];
			for (int i = 0; i < 16; i++)
				v[i] = have[i] && nv ? row32(w[i], r[i], k0 + kk, nv)
						     : _mm512_setzero_si512();
			transpose16(v);
			uint16_t *dst = panel + lay->off_k[kk] + lay->off_n[n0];
			for (int j = 0; j < 16; j++)
				_mm512_storeu_si512(dst + j * nb2, v[j]);
		}
	}
}

/* Any layout: each column's segments (inside one scale block) dequantized, then scattered. */
AVX512 static void pack_cols(const moet_fast_layout *lay, const moet_fast_rows *a,
			     const moet_fast_rows *b, int64_t k0, int64_t kn, uint16_t *panel)
{
	uint16_t tmp[32] __attribute__((aligned(64)));
	for (int64_t n = 0; n < lay->pn; n++) {
		const moet_mat *w = NULL;
		int64_t r = 0;
		const int have = col_row(a, b, n, &w, &r);
		uint16_t *col = panel + lay->off_n[n];
		for (int64_t kk = 0; kk < lay->pk;) {
			int64_t seg = 32 - (k0 + kk) % 32; /* 32 | 128: never crosses a block */
			if (seg > lay->pk - kk)
				seg = lay->pk - kk;
			const int64_t nv = kn - kk < seg ? (kn - kk > 0 ? kn - kk : 0) : seg;
			_mm512_store_si512(tmp, have && nv ? row32(w, r, k0 + kk, nv)
							   : _mm512_setzero_si512());
			for (int64_t j = 0; j < seg; j++)
				col[lay->off_k[kk + j]] = tmp[j];
			kk += seg;
		}
	}
}

AVX512 static void to_bf16_avx512(const float *in, uint16_t *out, int64_t n)
{
	int64_t i = 0;
	for (; i + 32 <= n; i += 32)
		_mm512_storeu_si512(out + i, pack32(_mm512_loadu_ps(in + i),
						    _mm512_loadu_ps(in + i + 16)));
	for (; i < n; i += 16) {
		const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
		__m512i w = _mm512_srli_epi32(rne_hi(_mm512_maskz_loadu_ps(m, in + i)), 16);
		_mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(w));
	}
}

/* ---- entry points ----------------------------------------------------------------------- */

static int have_avx512(void)
{
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl");
}

int moet_fast_layout_nb(int64_t pk, int64_t pn, const int32_t *off_k, const int32_t *off_n)
{
	for (int nb = 64; nb >= 16; nb /= 2) {
		int ok = pk % 32 == 0 && pn % nb == 0;
		for (int64_t k = 0; k < pk && ok; k++)
			ok = off_k[k] - off_k[0] == (k / 32) * 32 * nb + (k % 32) / 2 * 2 * nb + k % 2;
		for (int64_t n = 0; n < pn && ok; n++)
			ok = off_n[n] - off_n[0] == (n / nb) * pk * nb + (n % nb) * 2;
		if (ok && off_k[0] + off_n[0] == 0)
			return nb;
	}
	return 0;
}

void moet_fast_pack(const moet_fast_layout *lay, moet_fast_rows a, moet_fast_rows b, int64_t k0,
		    int64_t kn, uint16_t *panel, int vec)
{
	if (!b.w)
		b.n = 0;
	if (!vec || !have_avx512())
		pack_ref(lay, &a, &b, k0, kn, panel);
	else if (lay->nb && k0 % 32 == 0)
		pack_tiles(lay, &a, &b, k0, kn, panel,
			   vec == 1 && __builtin_cpu_supports("avx512vbmi"));
	else
		pack_cols(lay, &a, &b, k0, kn, panel);
}

void moet_fast_to_bf16(const float *in, uint16_t *out, int64_t n)
{
	if (have_avx512()) {
		to_bf16_avx512(in, out, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		out[i] = in[i] != in[i] ? 0x7FC0 : moet_enc_bf16(in[i]);
}
