/* 512-bit VNNI GEMM tiles: two adjacent tiles (16 columns) per weight vector. */
#ifndef LLMPRESS_GEMM_TILE_AVX512_H
#define LLMPRESS_GEMM_TILE_AVX512_H

#include "gemm_tile.h"
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__))
#error "gemm_tile_avx512.h needs AVX-512 VNNI, BW and VL"
#endif

#define PAIR_MT 4
/* Several rows against two adjacent tiles (16 columns) in 512-bit vectors: one load of
 * each weight vector serves MT rows, and each row keeps two independent dpbusd sums so
 * that 2 * MT chains hide the instruction's latency. panel_tile's one chain a row at 8
 * columns left the multiply units mostly waiting on it. int8 codes enter dpbusd's
 * unsigned operand as w + 128 (a flipped sign bit), and 128 times the block's sum of
 * activation codes (xs) comes off the integer sum, which is then exactly panel_tile's.
 * Every column's arithmetic is panel_tile's, in the same order, so a row's result does
 * not depend on which path computed it. */
INLINE __m512 load_pair(const float *a, const float *b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}

INLINE __m512i load_pair_i(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* The pair path's float steps, which the AMX path shares so that both round alike: a
 * block's integer sums into its group's (d: the block's activation scale), and a group's
 * into the row's accumulator, with zero offsets z (zp) or the symmetric offset. */
INLINE __m512 pair_block(__m512 gacc, __m512i ai, float d) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_set1_ps(d), gacc);
}

INLINE __m512 pair_group(__m512 acc, __m512 gacc, __m512 s, int zp, __m512 z, float bz,
                         __m512 offset) {
    if (zp) return _mm512_fnmadd_ps(z, _mm512_set1_ps(bz), _mm512_fmadd_ps(gacc, s, acc));
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(_mm512_set1_ps(bz), offset, gacc), s, acc);
}

INLINE void pair_tile(int MT, int bits, const uint8_t *w0, const uint8_t *w1, const float *sc0,
                      const float *sc1, const float *zs0, const float *zs1, int ng, int bpg,
                      const int8_t *x8, const float *dx, const float *bs, const int32_t *xs,
                      int K, int nb, float *y, int64_t ys, int cols) {
    __m512 acc[PAIR_MT];
    for (int m = 0; m < MT; m++) acc[m] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    for (int g = 0, b = 0; g < ng; g++) {
        __m512 gacc[PAIR_MT];
        float bz[PAIR_MT];
        for (int m = 0; m < MT; m++) gacc[m] = _mm512_setzero_ps(), bz[m] = 0.f;
        for (int j = 0; j < bpg; j++, b++) {
            __m512i al[PAIR_MT], ah[PAIR_MT];
            for (int m = 0; m < MT; m++) al[m] = ah[m] = _mm512_setzero_si512();
            if (bits == 4) {
                const uint8_t *b0 = w0 + (int64_t)b * 128, *b1 = w1 + (int64_t)b * 128;
                for (int v = 0; v < 4; v++) {
                    __m512i raw = load_pair_i(b0 + 32 * v, b1 + 32 * v);
                    __m512i lo = _mm512_and_si512(raw, low);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
                    for (int m = 0; m < MT; m++) {
                        const int8_t *xq = x8 + (int64_t)m * K + b * 32 + 4 * v;
                        int32_t xa, xb;
                        memcpy(&xa, xq, 4);
                        memcpy(&xb, xq + 16, 4);
                        al[m] = _mm512_dpbusd_epi32(al[m], lo, _mm512_set1_epi32(xa));
                        ah[m] = _mm512_dpbusd_epi32(ah[m], hi, _mm512_set1_epi32(xb));
                    }
                }
            } else {
                const uint8_t *b0 = w0 + (int64_t)b * 256, *b1 = w1 + (int64_t)b * 256;
                for (int q = 0; q < 8; q += 2) {
                    __m512i u0 = _mm512_xor_si512(load_pair_i(b0 + 32 * q, b1 + 32 * q), flip);
                    __m512i u1 = _mm512_xor_si512(
                        load_pair_i(b0 + 32 * q + 32, b1 + 32 * q + 32), flip);
                    for (int m = 0; m < MT; m++) {
                        const int8_t *xq = x8 + (int64_t)m * K + b * 32 + 4 * q;
                        int32_t xa, xb;
                        memcpy(&xa, xq, 4);
                        memcpy(&xb, xq + 4, 4);
                        al[m] = _mm512_dpbusd_epi32(al[m], u0, _mm512_set1_epi32(xa));
                        ah[m] = _mm512_dpbusd_epi32(ah[m], u1, _mm512_set1_epi32(xb));
                    }
                }
            }
            for (int m = 0; m < MT; m++) {
                __m512i ai = _mm512_add_epi32(al[m], ah[m]);
                if (bits == 8) /* the codes entered as w + 128 */
                    ai = _mm512_sub_epi32(ai, _mm512_set1_epi32(128 * xs[(int64_t)m * nb + b]));
                gacc[m] = pair_block(gacc[m], ai, dx[(int64_t)m * nb + b]);
                bz[m] += bs[(int64_t)m * nb + b];
            }
        }
        __m512 s = load_pair(sc0 + g * TW, sc1 + g * TW);
        __m512 z = zs0 ? load_pair(zs0 + g * TW, zs1 + g * TW) : _mm512_setzero_ps();
        const __m512 offset = _mm512_set1_ps(bits == 4 ? 8.f : 0.f);
        for (int m = 0; m < MT; m++)
            acc[m] = pair_group(acc[m], gacc[m], s, zs0 != NULL, z, bz[m], offset);
    }
    __mmask16 keep = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + m * ys, keep, acc[m]);
}

/* Two tiles against every activation row, PAIR_MT rows at a time. */
INLINE void pair_rows(int bits, const uint8_t *w0, const uint8_t *w1, const float *sc0,
                      const float *sc1, const float *zs0, const float *zs1, int ng, int bpg,
                      const int8_t *x8, const float *dx, const float *bs, const int32_t *xs,
                      int M, int K, int nb, float *y, int64_t ys, int cols) {
    int m = 0;
#define PAIR(MT) pair_tile(MT, bits, w0, w1, sc0, sc1, zs0, zs1, ng, bpg, x8 + (int64_t)m * K,  \
                           dx + (int64_t)m * nb, bs + (int64_t)m * nb,                         \
                           xs ? xs + (int64_t)m * nb : NULL, K, nb, y + (int64_t)m * ys, ys,   \
                           cols)
    for (; m + PAIR_MT <= M; m += PAIR_MT) PAIR(PAIR_MT);
    switch (M - m) {
    case 3: PAIR(3); break;
    case 2: PAIR(2); break;
    case 1: PAIR(1); break;
    default: break;
    }
#undef PAIR
}

#endif
