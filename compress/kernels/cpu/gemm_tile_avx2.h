/* 256-bit GEMM tiles (AVX2, with or without VNNI): one tile of 8 columns, or without VNNI
 * two tiles a pass (quad_pair_q4), computing exactly what gemm_tile_ref.h computes. */
#ifndef LLMPRESS_GEMM_TILE_AVX2_H
#define LLMPRESS_GEMM_TILE_AVX2_H

#include "gemm_tile.h"
#if !defined(__AVX2__)
#error "gemm_tile_avx2.h needs AVX2"
#endif

INLINE __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The dot products of 4 unsigned by 4 signed bytes in each of 8 lanes, the one step that
 * differs between 256-bit instruction sets. With VNNI one dpbusd adds them to int32 lanes.
 * Plain AVX2 multiplies pairs into int16 sums (maddubs), adds those as int16 and widens
 * them to int32 once a block (dot_widen): a block's int4 sums stay far inside int16, and
 * an int8 product is widened at once (dot_u8s8). Either way the integers are the same. */
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
INLINE __m256i dot_acc(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_dpbusd_epi32(acc, u, s);
#endif
}
/* acc + u0.s0 + u1.s1 */
INLINE __m256i dot_acc2(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return dot_acc(dot_acc(acc, u0, s0), u1, s1);
}
INLINE __m256i dot_widen(__m256i acc) { return acc; }
INLINE __m256i dot_merge(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
INLINE __m256i dot_u8s8(__m256i u, __m256i s) { return dot_acc(_mm256_setzero_si256(), u, s); }
#else
INLINE __m256i dot_acc(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
}
INLINE __m256i dot_acc2(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(u0, s0),
                                                  _mm256_maddubs_epi16(u1, s1)));
}
INLINE __m256i dot_widen(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
INLINE __m256i dot_merge(__m256i a, __m256i b) { return dot_widen(_mm256_add_epi16(a, b)); }
INLINE __m256i dot_u8s8(__m256i u, __m256i s) { return dot_widen(_mm256_maddubs_epi16(u, s)); }
#endif

/* y[m, 0..cols) for MT activation rows against one tile of 8 columns. */
INLINE void panel_tile_avx2(int MT, int bits, const uint8_t *wt, const float *sc,
                            const float *zs, int ng, int bpg, const int8_t *x8,
                            const float *dx, const float *bs, int K, int nb, float *y,
                            int64_t ys, int cols) {
    __m256 acc[MT_MAX];
    for (int m = 0; m < MT; m++) acc[m] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256 offset = _mm256_set1_ps(bits == 4 ? 8.f : 0.f);
    for (int g = 0, b = 0; g < ng; g++) {
        __m256 gacc[MT_MAX];
        float bz[MT_MAX];
        for (int m = 0; m < MT; m++) gacc[m] = _mm256_setzero_ps(), bz[m] = 0.f;
        for (int j = 0; j < bpg; j++, b++) {
            __m256i ai[MT_MAX];
            for (int m = 0; m < MT; m++) ai[m] = _mm256_setzero_si256();
            if (bits == 4) {
                const uint8_t *wb = wt + (int64_t)b * 128;
                PREFETCH2(wb + PF_DIST);
#pragma GCC unroll 1 /* unrolled, gcc computes all 32 products before adding: spills */
                for (int v = 0; v < 4; v++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(wb + 32 * v));
                    __m256i lo = _mm256_and_si256(raw, low);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                    for (int m = 0; m < MT; m++) {
                        const int8_t *xq = x8 + (int64_t)m * K + b * 32 + 4 * v;
                        __m256i xa = bcast4(xq), xb = bcast4(xq + 16);
                        ai[m] = dot_acc2(ai[m], lo, xa, hi, xb);
                    }
                }
                for (int m = 0; m < MT; m++) ai[m] = dot_widen(ai[m]);
            } else {
                const uint8_t *wb = wt + (int64_t)b * 256;
                PREFETCH2(wb + PF_DIST);
                PREFETCH2(wb + PF_DIST + 128);
#pragma GCC unroll 1
                for (int q = 0; q < 8; q++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * q));
                    __m256i u = _mm256_abs_epi8(w); /* |w| as u8, the sign moved onto x */
                    for (int m = 0; m < MT; m++) {
                        __m256i xa = bcast4(x8 + (int64_t)m * K + b * 32 + 4 * q);
                        ai[m] = _mm256_add_epi32(ai[m], dot_u8s8(u, _mm256_sign_epi8(xa, w)));
                    }
                }
            }
            for (int m = 0; m < MT; m++) {
                __m256 d = _mm256_set1_ps(dx[(int64_t)m * nb + b]);
                gacc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[m]), d, gacc[m]);
                bz[m] += bs[(int64_t)m * nb + b];
            }
        }
        __m256 s = _mm256_loadu_ps(sc + g * TW);
        if (zs) {
            __m256 z = _mm256_loadu_ps(zs + g * TW);
            for (int m = 0; m < MT; m++) {
                acc[m] = _mm256_fmadd_ps(gacc[m], s, acc[m]);
                acc[m] = _mm256_fnmadd_ps(z, _mm256_set1_ps(bz[m]), acc[m]);
            }
        } else { /* symmetric: zs = offset * scale, folded into the group sum */
            for (int m = 0; m < MT; m++)
                acc[m] = _mm256_fmadd_ps(
                    _mm256_fnmadd_ps(_mm256_set1_ps(bz[m]), offset, gacc[m]), s, acc[m]);
        }
    }
    for (int m = 0; m < MT; m++) {
        if (cols == TW) {
            _mm256_storeu_ps(y + m * ys, acc[m]);
        } else {
            float t[TW];
            _mm256_storeu_ps(t, acc[m]);
            memcpy(y + m * ys, t, (size_t)cols * sizeof(float));
        }
    }
}

/* One activation row (batch-1 decode) against one int4 tile: panel_tile's arithmetic with
 * its loops unrolled, which panel_tile cannot afford at four rows (spills). Interleaved in
 * one process on an AVX2 EPYC: 3-7% faster from memory, 35-45% from cache. */
INLINE void row_tile_q4_avx2(const uint8_t *wt, const float *sc, const float *zs, int ng,
                             int bpg, const int8_t *x8, const float *dx, const float *bs,
                             float *y, int cols) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int g = 0, b = 0; g < ng; g++) {
        __m256 gacc = _mm256_setzero_ps();
        float bz = 0.f;
        for (int j = 0; j < bpg; j++, b++) {
            const uint8_t *wb = wt + (int64_t)b * 128;
            /* two sums (low and high nibbles): two dependency chains of 4 instead of one of
             * 8, so the block's products are not a chain of latencies (integer: exact) */
            __m256i al = _mm256_setzero_si256(), ah = _mm256_setzero_si256();
            PREFETCH2(wb + PF_DIST);
            for (int v = 0; v < 4; v++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(wb + 32 * v));
                __m256i lo = _mm256_and_si256(raw, low);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                __m256i xa = bcast4(x8 + b * 32 + 4 * v), xb = bcast4(x8 + b * 32 + 16 + 4 * v);
                al = dot_acc(al, lo, xa);
                ah = dot_acc(ah, hi, xb);
            }
            __m256i ai = dot_merge(al, ah);
            gacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), _mm256_set1_ps(dx[b]), gacc);
            bz += bs[b];
        }
        __m256 s = _mm256_loadu_ps(sc + g * TW);
        if (zs) {
            acc = _mm256_fmadd_ps(gacc, s, acc);
            acc = _mm256_fnmadd_ps(_mm256_loadu_ps(zs + g * TW), _mm256_set1_ps(bz), acc);
        } else {
            acc = _mm256_fmadd_ps(_mm256_fnmadd_ps(_mm256_set1_ps(bz), _mm256_set1_ps(8.f), gacc), s, acc);
        }
    }
    float t[TW];
    _mm256_storeu_ps(t, acc);
    memcpy(y, t, (size_t)cols * sizeof(float));
}

#define Q4_DOT(S, W, X, FIRST)                                                                \
    S = FIRST ? _mm256_maddubs_epi16(W, X) : _mm256_add_epi16(S, _mm256_maddubs_epi16(W, X))
/* Four activation rows against two adjacent int4 tiles (16 columns) on AVX2 without VNNI:
 * panel_tile's arithmetic in its order (the same bits), each broadcast quad of
 * activations serving both tiles. Per 32 products a block costs a multiply, an add, half
 * a broadcast and a share of the nibble masks, and the broadcasts and masks take vector
 * pipes the multiplies need: 4 x 16 reads each broadcast twice where panel_tile's 4 x 8
 * reads it once. Its eight integer sums fill the registers with the two weight vectors
 * of one half-step, so a group's float sums and the row's wait in L1, read once a block
 * and once a group. Interleaved on a Zen 3 EPYC (2 threads, benchmarks/kernel_ab.py):
 * 1.06-1.13x at 16 to 256 rows. */
INLINE void quad_pair_q4(const uint8_t *w0, const uint8_t *w1, const float *sc0,
                         const float *sc1, const float *zs0, const float *zs1, int ng, int bpg,
                         const int8_t *x8, const float *dx, const float *bs, int K, int nb,
                         float *y, int64_t ys, int cols) {
    __m256 gacc[4][2], acc[4][2];
    for (int m = 0; m < 4; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int8_t *x0 = x8, *x1 = x8 + K, *x2 = x8 + 2 * (int64_t)K, *x3 = x8 + 3 * (int64_t)K;
    for (int g = 0, b = 0; g < ng; g++) {
        for (int m = 0; m < 4; m++) gacc[m][0] = gacc[m][1] = _mm256_setzero_ps();
        for (int j = 0; j < bpg; j++, b++) {
            const uint8_t *a = w0 + (int64_t)b * 128, *c = w1 + (int64_t)b * 128;
            const int o = b * 32;
            __m256i s00, s01, s10, s11, s20, s21, s30, s31;
            PREFETCH2(a + PF_DIST);
            PREFETCH2(c + PF_DIST);
#define Q4_ROW(S0, S1, W0, W1, X, FIRST)                                                     \
    {                                                                                         \
        __m256i xq = bcast4(X);                                                               \
        Q4_DOT(S0, W0, xq, FIRST);                                                            \
        Q4_DOT(S1, W1, xq, FIRST);                                                            \
        __asm__("" : "+x"(S0), "+x"(S1));                                                     \
    }
/* the low nibbles of both tiles, then the high ones (reloaded): two weight vectors live */
#define Q4_STEP(v, FIRST)                                                                     \
    {                                                                                         \
        __m256i l0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(a + 32 * (v))), low); \
        __m256i l1 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(c + 32 * (v))), low); \
        Q4_ROW(s00, s01, l0, l1, x0 + o + 4 * (v), FIRST)                                     \
        Q4_ROW(s10, s11, l0, l1, x1 + o + 4 * (v), FIRST)                                     \
        Q4_ROW(s20, s21, l0, l1, x2 + o + 4 * (v), FIRST)                                     \
        Q4_ROW(s30, s31, l0, l1, x3 + o + 4 * (v), FIRST)                                     \
        __m256i h0 = _mm256_and_si256(                                                        \
            _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(a + 32 * (v))), 4), low);  \
        __m256i h1 = _mm256_and_si256(                                                        \
            _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(c + 32 * (v))), 4), low);  \
        Q4_ROW(s00, s01, h0, h1, x0 + o + 16 + 4 * (v), 0)                                    \
        Q4_ROW(s10, s11, h0, h1, x1 + o + 16 + 4 * (v), 0)                                    \
        Q4_ROW(s20, s21, h0, h1, x2 + o + 16 + 4 * (v), 0)                                    \
        Q4_ROW(s30, s31, h0, h1, x3 + o + 16 + 4 * (v), 0)                                    \
    }
            Q4_STEP(0, 1) Q4_STEP(1, 0) Q4_STEP(2, 0) Q4_STEP(3, 0)
#undef Q4_STEP
#undef Q4_ROW
#define Q4_SUM(S) _mm256_cvtepi32_ps(_mm256_madd_epi16(S, ones))
#define Q4_BLOCK(m, S0, S1)                                                                   \
    {                                                                                         \
        __m256 d = _mm256_set1_ps(dx[(int64_t)(m) * nb + b]);                                 \
        gacc[m][0] = _mm256_fmadd_ps(Q4_SUM(S0), d, gacc[m][0]);                              \
        gacc[m][1] = _mm256_fmadd_ps(Q4_SUM(S1), d, gacc[m][1]);                              \
    }
            Q4_BLOCK(0, s00, s01) Q4_BLOCK(1, s10, s11) Q4_BLOCK(2, s20, s21) Q4_BLOCK(3, s30, s31)
#undef Q4_BLOCK
#undef Q4_SUM
        }
        __m256 s0 = _mm256_loadu_ps(sc0 + g * TW), s1 = _mm256_loadu_ps(sc1 + g * TW);
        for (int m = 0; m < 4; m++) {
            const float *br = bs + (int64_t)m * nb + g * bpg;
            float bz = 0.f;
            for (int j = 0; j < bpg; j++) bz += br[j];
            __m256 z = _mm256_set1_ps(bz);
            if (zs0) {
                acc[m][0] = _mm256_fnmadd_ps(_mm256_loadu_ps(zs0 + g * TW), z,
                                             _mm256_fmadd_ps(gacc[m][0], s0, acc[m][0]));
                acc[m][1] = _mm256_fnmadd_ps(_mm256_loadu_ps(zs1 + g * TW), z,
                                             _mm256_fmadd_ps(gacc[m][1], s1, acc[m][1]));
            } else {
                const __m256 eight = _mm256_set1_ps(8.f);
                acc[m][0] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z, eight, gacc[m][0]), s0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z, eight, gacc[m][1]), s1, acc[m][1]);
            }
        }
    }
    for (int m = 0; m < 4; m++) {
        float t[2 * TW];
        _mm256_storeu_ps(t, acc[m][0]);
        _mm256_storeu_ps(t + TW, acc[m][1]);
        memcpy(y + m * ys, t, (size_t)cols * sizeof(float));
    }
}
#undef Q4_DOT

#endif
