/* Packed int4 / int8 weights times int8 activations: the GEMM over the panel layout
 * (llmpress.h), per instruction set, and grouped passes over several weights. */
#include "internal.h"

#define MT_MAX 4
/* Software prefetch of every line of a block, PF_DIST bytes ahead: the hardware prefetcher
 * alone left a thread's loads waiting on DRAM between blocks (on a Zen 3 EPYC one thread
 * streamed 7.4 GB/s against a plain sum's 10-11; prefetching both lines of each int4
 * block 2 KB ahead: 11.1). One line of each block, or 256 bytes ahead, did not help. */
#define PF_DIST 2048
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define PREFETCH2(p) (PREFETCH(p), PREFETCH((const char *)(p) + 64))

#if defined(__AVX2__)
INLINE __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
#endif

#if defined(__AVX2__)
/* Sum of u8 x s8 products of 32 lanes, as 8 int32 lanes. */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

/* y[m, 0..cols) for MT activation rows against one tile of 8 columns. */
INLINE void panel_tile(int MT, int bits, const uint8_t *wt, const float *sc, const float *zs,
                       int ng, int bpg, const int8_t *x8, const float *dx, const float *bs,
                       int K, int nb, float *y, int64_t ys, int cols) {
#if defined(__AVX2__)
    __m256 acc[MT_MAX];
    for (int m = 0; m < MT; m++) acc[m] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256 offset = _mm256_set1_ps(bits == 4 ? 8.f : 0.f);
#if !(defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    const __m256i ones = _mm256_set1_epi16(1);
#endif
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
#if defined(__AVXVNNI__)
                        ai[m] = _mm256_dpbusd_avx_epi32(ai[m], lo, xa);
                        ai[m] = _mm256_dpbusd_avx_epi32(ai[m], hi, xb);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
                        ai[m] = _mm256_dpbusd_epi32(ai[m], lo, xa);
                        ai[m] = _mm256_dpbusd_epi32(ai[m], hi, xb);
#else
                        ai[m] = _mm256_add_epi16(ai[m], _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb)));
#endif
                    }
                }
#if !(defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
                for (int m = 0; m < MT; m++) ai[m] = _mm256_madd_epi16(ai[m], ones);
#endif
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
#else
    const float off = bits == 4 ? 8.f : 0.f;
    for (int m = 0; m < MT; m++) {
        const int8_t *xr = x8 + (int64_t)m * K;
        const float *dr = dx + (int64_t)m * nb, *br = bs + (int64_t)m * nb;
        float total[TW] = {0};
        for (int g = 0, b = 0; g < ng; g++) {
            float ga[TW] = {0}, bz = 0.f;
            for (int j = 0; j < bpg; j++, b++) {
                int si[TW] = {0};
                for (int q = 0; q < 8; q++)
                    for (int c = 0; c < TW; c++)
                        for (int kk = 0; kk < 4; kk++) {
                            int w;
                            if (bits == 4) {
                                uint8_t byte = wt[(int64_t)b * 128 + (q & 3) * 32 + c * 4 + kk];
                                w = q < 4 ? (byte & 0x0F) : (byte >> 4);
                            } else {
                                w = (int8_t)wt[(int64_t)b * 256 + q * 32 + c * 4 + kk];
                            }
                            si[c] += w * xr[b * 32 + q * 4 + kk];
                        }
                for (int c = 0; c < TW; c++) ga[c] += si[c] * dr[b];
                bz += br[b];
            }
            for (int c = 0; c < TW; c++) total[c] += ga[c] * sc[g * TW + c] - (zs ? zs[g * TW + c] : off * sc[g * TW + c]) * bz;
        }
        memcpy(y + m * ys, total, (size_t)cols * sizeof(float));
    }
#endif
}

/* One activation row (batch-1 decode) against one int4 tile: panel_tile's arithmetic with
 * its loops unrolled, which panel_tile cannot afford at four rows (spills). Interleaved in
 * one process on an AVX2 EPYC: 3-7% faster from memory, 35-45% from cache. */
INLINE void row_tile_q4(const uint8_t *wt, const float *sc, const float *zs, int ng, int bpg,
                        const int8_t *x8, const float *dx, const float *bs, float *y, int cols) {
#if defined(__AVX2__)
    const __m256i low = _mm256_set1_epi8(0x0F);
#if !(defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    const __m256i ones = _mm256_set1_epi16(1);
#endif
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
#if defined(__AVXVNNI__)
                al = _mm256_dpbusd_avx_epi32(al, lo, xa);
                ah = _mm256_dpbusd_avx_epi32(ah, hi, xb);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
                al = _mm256_dpbusd_epi32(al, lo, xa);
                ah = _mm256_dpbusd_epi32(ah, hi, xb);
#else
                al = _mm256_add_epi16(al, _mm256_maddubs_epi16(lo, xa));
                ah = _mm256_add_epi16(ah, _mm256_maddubs_epi16(hi, xb));
#endif
            }
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
            __m256i ai = _mm256_add_epi32(al, ah);
#else
            __m256i ai = _mm256_madd_epi16(_mm256_add_epi16(al, ah), ones);
#endif
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
#else
    panel_tile(1, 4, wt, sc, zs, ng, bpg, x8, dx, bs, 0, 0, y, 0, cols);
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PAIR_ZMM 1
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

#if defined(__AVX2__) && !defined(PAIR_ZMM) && !defined(__AVXVNNI__)
#define QUAD_PAIR 1
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

/* One tile against every activation row, MT_MAX rows at a time. */
INLINE void tile_rows(int bits, const uint8_t *wt, const float *sc, const float *zs, int ng,
                      int bpg, const int8_t *x8, const float *dx, const float *bs, int M,
                      int K, int nb, float *y, int64_t ys, int cols) {
    if (bits == 4 && M == 1) {
        row_tile_q4(wt, sc, zs, ng, bpg, x8, dx, bs, y, cols);
        return;
    }
    int m = 0;
#define TILE(MT) panel_tile(MT, bits, wt, sc, zs, ng, bpg, x8 + (int64_t)m * K, dx + (int64_t)m * nb, \
                            bs + (int64_t)m * nb, K, nb, y + (int64_t)m * ys, ys, cols)
    for (; m + 4 <= M; m += 4) TILE(4);
    switch (M - m) {
    case 3: TILE(3); break;
    case 2: TILE(2); break;
    case 1: TILE(1); break;
    default: break;
    }
#undef TILE
}

#if defined(QUAD_PAIR)
/* int4 rows against two adjacent tiles: four rows at a time through quad_pair_q4, the
 * rest tile by tile. */
INLINE void quad_pair_rows(int bits, const uint8_t *w0, const uint8_t *w1, const float *sc0,
                           const float *sc1, const float *zs0, const float *zs1, int ng,
                           int bpg, const int8_t *x8, const float *dx, const float *bs,
                           const int32_t *xs, int M, int K, int nb, float *y, int64_t ys,
                           int cols) {
    (void)xs;
    int m = 0;
    for (; m + 4 <= M; m += 4)
        quad_pair_q4(w0, w1, sc0, sc1, zs0, zs1, ng, bpg, x8 + (int64_t)m * K,
                     dx + (int64_t)m * nb, bs + (int64_t)m * nb, K, nb, y + (int64_t)m * ys, ys,
                     cols);
    if (m < M) {
        const int8_t *xr = x8 + (int64_t)m * K;
        const float *dr = dx + (int64_t)m * nb, *br = bs + (int64_t)m * nb;
        float *yr = y + (int64_t)m * ys;
        tile_rows(bits, w0, sc0, zs0, ng, bpg, xr, dr, br, M - m, K, nb, yr, ys, TW);
        tile_rows(bits, w1, sc1, zs1, ng, bpg, xr, dr, br, M - m, K, nb, yr + TW, ys, cols - TW);
    }
}
#endif

/* Threads take chunks of CHUNK_TILES tiles (16 columns); each chunk runs its rows in
 * blocks of ROW_BLOCK, so that the block's activations and the chunk's weights both stay
 * in L1 (8 rows x 1536 inputs + 16 columns x 1536 int4 weights: 24 KB). */
#define CHUNK_TILES 2 /* the 16 columns of one pair (512-bit, or AVX2's quad_pair_q4) */
#if defined(PAIR_ZMM)
#define PAIRED(BITS, M) ((M) > 1 || (BITS) == 8) /* one int4 row (decode): row_tile_q4 */
#define PAIR_ROWS pair_rows
#elif defined(QUAD_PAIR)
/* From 8 rows: at 4, a wide weight streamed from memory read 0.85-0.95x as fast as two
 * streams (benchmarks/kernel_ab.py, 9728 x 896 and 2048 x 1024) */
#define PAIRED(BITS, M) ((BITS) == 4 && (M) >= 8)
#define PAIR_ROWS quad_pair_rows
#else
#define PAIRED(BITS, M) 0
#define PAIR_ROWS(...) (void)0
#endif

#define ROW_BLOCK 8
#if defined(PAIR_ZMM) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
/* ---- AMX: the pair path's integer sums from tile instructions -----------------------
 * One tile multiply gives the int32 sums of 16 activation rows x 16 columns over one block
 * of 32 inputs (8192 products) where the 512-bit path needs 8 dot instructions per row.
 * The sums are exact either way, and the float steps after them are pair_tile's in its
 * order, so every result is bit-identical to the pair path: a row computes the same at any
 * batch, on either path (speculative decoding's check relies on it). The weights of up to
 * AMX_PAIRS pairs of tiles are unpacked once per call into the tile operand layout, 8
 * quads x 64 bytes a block, and serve every 16 rows. Tiles: 0-3 = sums (16 x 16 int32, one
 * per pair), 4 = activations (16 rows x 32 codes), 5-7 = weights. The per-block scaling of
 * the sums in vector registers is most of the time left (without it: 1.4-2.5x faster;
 * 1.7-2.0x at 192 rows). Tried on a 2-core AMX Xeon VM, same bits, and all slower
 * (benchmarks/kernel_ab.py, 192 rows, the default model's widths): storing a block's sums
 * two blocks before reading them; scaling two blocks a pass with the group sums in
 * registers (accumulator loads and stores halved: 0.95x with four pairs, 0.65-0.70x with
 * three); each 16 rows' block of activations packed as one contiguous 512-byte operand
 * (0.87-0.96x). Without the scaling a block still takes about 95 ns where the same tile
 * loads, products and stores from L1 take 41 ns, half of it the stores. The OS grants the
 * tile state per process (llmp_amx_enable); every call configures its threads' tiles,
 * since other libraries in the process may use AMX with their own configuration, and
 * releases them after. */
#define AMX_MIN_ROWS 16 /* fewer rows: the 512-bit path is as fast (8 rows: 25% faster) */
static int amx_on;

int llmp_amx_enable(int on) {
    amx_on = on && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return amx_on;
}

int llmp_amx_state(void) { return amx_on; }

static void amx_config(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } __attribute__((packed, aligned(64))) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16; /* sums */
    cfg.colsb[4] = 32, cfg.rows[4] = 16;                              /* activations */
    for (int t = 5; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 8;  /* weights */
    _tile_loadconfig(&cfg);
}

/* Tiles w0, w1 (nb blocks each) as tile operands: row r of a block holds quad r of the 16
 * columns, as pair_tile's vectors hold them. */
static void amx_unpack(int bits, const uint8_t *w0, const uint8_t *w1, int nb, uint8_t *out) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int b = 0; b < nb; b++, out += 512) {
        if (bits == 4) {
            const uint8_t *b0 = w0 + (int64_t)b * 128, *b1 = w1 + (int64_t)b * 128;
            for (int v = 0; v < 4; v++) {
                __m512i raw = load_pair_i(b0 + 32 * v, b1 + 32 * v);
                _mm512_store_si512(out + 64 * v, _mm512_and_si512(raw, low));
                _mm512_store_si512(out + 64 * (v + 4),
                                   _mm512_and_si512(_mm512_srli_epi16(raw, 4), low));
            }
        } else {
            const uint8_t *b0 = w0 + (int64_t)b * 256, *b1 = w1 + (int64_t)b * 256;
            for (int q = 0; q < 8; q++)
                _mm512_store_si512(out + 64 * q, load_pair_i(b0 + 32 * q, b1 + 32 * q));
        }
    }
}

#define AMX_PAIRS 4 /* pairs of tiles (16 columns each) per work item: one sums tile each */
typedef struct {
    __m512 acc[AMX_PAIRS][16], gacc[AMX_PAIRS][16];
    int32_t sums[2][AMX_PAIRS][256];
    float bz[16];
} AmxAcc;

/* Block b's sums (slot b & 1) into the group sums; the group's into acc at its end. */
INLINE void amx_epilogue(AmxAcc *a, int b, int bpg, int np, int bits, const float *sc,
                         const float *zs, int ng, const float *dx, const float *bs, int rows,
                         int nb) {
    int g = b / bpg, first = b % bpg == 0;
    for (int m = 0; m < rows; m++) {
        float d = dx[(int64_t)m * nb + b];
        for (int c = 0; c < np; c++) {
            __m512i ai = _mm512_load_si512(a->sums[b & 1][c] + 16 * m);
            a->gacc[c][m] = pair_block(first ? _mm512_setzero_ps() : a->gacc[c][m], ai, d);
        }
        a->bz[m] = (first ? 0.f : a->bz[m]) + bs[(int64_t)m * nb + b];
    }
    if ((b + 1) % bpg) return;
    const __m512 offset = _mm512_set1_ps(bits == 4 ? 8.f : 0.f);
    for (int c = 0; c < np; c++) {
        const float *s0 = sc + (int64_t)2 * c * ng * TW;
        const float *z0 = zs ? zs + (int64_t)2 * c * ng * TW : NULL;
        __m512 s = load_pair(s0 + g * TW, s0 + (ng + g) * TW);
        __m512 z = z0 ? load_pair(z0 + g * TW, z0 + (ng + g) * TW) : _mm512_setzero_ps();
        for (int m = 0; m < rows; m++)
            a->acc[c][m] = pair_group(a->acc[c][m], a->gacc[c][m], s, zs != NULL, z, a->bz[m],
                                      offset);
    }
}

#define AMX_DP(C, B)                                                                          \
    do {                                                                                      \
        if (bits == 4)                                                                        \
            _tile_dpbsud(C, 4, B);                                                            \
        else                                                                                  \
            _tile_dpbssd(C, 4, B);                                                            \
    } while (0)
/* pair_tile for `rows` <= 16 rows (x8 holds 16 readable rows) against np <= AMX_PAIRS
 * unpacked pairs (wb: [np][nb][512]; their scales at sc + 2c * ng * TW). Block b's
 * products run on the tile unit while the vector unit scales block b - 1's sums. */
static void amx_rows(int bits, const uint8_t *wb, int np, const float *sc, const float *zs,
                     int ng, int bpg, const int8_t *x8, const float *dx, const float *bs,
                     int rows, int K, int nb, float *y, int64_t ys, int cols) {
    AmxAcc a __attribute__((aligned(64)));
    for (int c = 0; c < np; c++)
        for (int m = 0; m < rows; m++) a.acc[c][m] = _mm512_setzero_ps();
    const int64_t pb = (int64_t)nb * 512;
    for (int b = 0; b < nb; b++) {
        const uint8_t *w = wb + (int64_t)b * 512;
        _tile_loadd(4, x8 + b * 32, K);
        _tile_zero(0);
        _tile_loadd(5, w, 64);
        AMX_DP(0, 5);
        if (np > 1) {
            _tile_zero(1);
            _tile_loadd(6, w + pb, 64);
            AMX_DP(1, 6);
        }
        if (np > 2) {
            _tile_zero(2);
            _tile_loadd(7, w + 2 * pb, 64);
            AMX_DP(2, 7);
        }
        if (np > 3) {
            _tile_zero(3);
            _tile_loadd(5, w + 3 * pb, 64);
            AMX_DP(3, 5);
        }
        if (b > 0) amx_epilogue(&a, b - 1, bpg, np, bits, sc, zs, ng, dx, bs, rows, nb);
        int32_t(*out)[256] = a.sums[b & 1];
        _tile_stored(0, out[0], 64);
        if (np > 1) _tile_stored(1, out[1], 64);
        if (np > 2) _tile_stored(2, out[2], 64);
        if (np > 3) _tile_stored(3, out[3], 64);
    }
    amx_epilogue(&a, nb - 1, bpg, np, bits, sc, zs, ng, dx, bs, rows, nb);
    for (int c = 0; c < np; c++) {
        int left = cols - 16 * c;
        __mmask16 keep = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        for (int m = 0; m < rows; m++) _mm512_mask_storeu_ps(y + m * ys + 16 * c, keep, a.acc[c][m]);
    }
}

/* llmp_gemm_q* on AMX: each thread takes pairs of tiles, unpacks them and runs every row
 * through them, 16 at a time. Returns -1 (nothing written) when it cannot allocate. */
static int amx_gemm(int bits, const int8_t *x8, const float *dx, const float *bsum, int M,
                    int K, int G, const uint8_t *w, const float *scale, const float *zs,
                    int N, float *y) {
    int nb = K / 32, ng = K / G, bpg = G / 32, tiles = (N + TW - 1) / TW, pairs = tiles / 2;
    int64_t tb = (int64_t)nb * 32 * bits, mp = (M + 15) / 16 * 16;
    int threads = omp_threads();
    /* pairs per work item: the most, up to AMX_PAIRS, that shares them evenly */
    int per = AMX_PAIRS, items = (pairs + per - 1) / per;
    while (per > 1 && items % threads) per--, items = (pairs + per - 1) / per;
    if (items % threads) per = AMX_PAIRS, items = (pairs + per - 1) / per;
    uint8_t *wbuf = aligned_alloc(64, (size_t)threads * AMX_PAIRS * nb * 512);
    int8_t *pad = mp == M ? NULL : calloc((size_t)mp * K, 1);
    if (wbuf == NULL || (mp != M && pad == NULL)) {
        free(wbuf), free(pad);
        return -1;
    }
    if (pad) memcpy(pad, x8, (size_t)M * K);
    const int8_t *xa = pad ? pad : x8;
    #pragma omp parallel
    {
        uint8_t *wb = wbuf + (int64_t)omp_thread() * AMX_PAIRS * nb * 512;
        amx_config();
        #pragma omp for schedule(static)
        for (int it = 0; it < items; it++) {
            int p0 = it * per, np = pairs - p0 < per ? pairs - p0 : per, t = 2 * p0;
            int cols = N - t * TW < 2 * TW * np ? N - t * TW : 2 * TW * np;
            for (int c = 0; c < np; c++)
                amx_unpack(bits, w + (t + 2 * c) * tb, w + (t + 2 * c + 1) * tb, nb,
                           wb + (int64_t)c * nb * 512);
            for (int m0 = 0; m0 < M; m0 += 16)
                amx_rows(bits, wb, np, scale + (int64_t)t * ng * TW,
                         zs ? zs + (int64_t)t * ng * TW : NULL, ng, bpg, xa + (int64_t)m0 * K,
                         dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb,
                         M - m0 < 16 ? M - m0 : 16, K, nb, y + (int64_t)m0 * N + t * TW, N,
                         cols);
        }
        _tile_release();
    }
    if (tiles % 2) { /* the last 8 columns: the tile path, as the pair path leaves them */
        int t = tiles - 1, cols = N - t * TW;
        for (int m0 = 0; m0 < M; m0 += ROW_BLOCK)
            tile_rows(bits, w + t * tb, scale + (int64_t)t * ng * TW,
                      zs ? zs + (int64_t)t * ng * TW : NULL, ng, bpg, x8 + (int64_t)m0 * K,
                      dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb,
                      M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK, K, nb, y + (int64_t)m0 * N + t * TW,
                      N, cols);
    }
    free(wbuf), free(pad);
    return 0;
}
#else
int llmp_amx_enable(int on) {
    (void)on;
    return 0;
}

int llmp_amx_state(void) { return 0; }
#endif

/* Each row's sum of its int8 codes per block of 32 (the 8-bit pair path's correction);
 * NULL when it cannot allocate (the tile path then runs). */
static int32_t *block_sums(const int8_t *x8, int M, int K) {
    int nb = K / 32;
    int32_t *xs = malloc(sizeof(int32_t) * ((size_t)M * nb + 1));
    if (xs == NULL) return NULL;
    for (int64_t i = 0; i < (int64_t)M * nb; i++) {
        int sum = 0;
        for (int k = 0; k < 32; k++) sum += x8[i * 32 + k];
        xs[i] = sum;
    }
    return xs;
}
#if defined(HAVE_AMX)
#define AMX_ROWS(M) (amx_on && (M) >= AMX_MIN_ROWS)
#else
#define AMX_ROWS(M) 0
#define amx_gemm(...) -1
#endif
/* One chunk of llmp_gemm_q*: CHUNK_TILES tiles of columns for every row. */
#define GEMM_CHUNK(BITS, c)                                                                   \
    for (int m0 = 0; m0 < M; m0 += ROW_BLOCK) {                                               \
        int rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;                                   \
        if (paired && (c) * CHUNK_TILES + 1 < tiles) {                                        \
            int t = (c) * CHUNK_TILES, cols = N - t * TW < 2 * TW ? N - t * TW : 2 * TW;      \
            const float *s0 = scale + (int64_t)t * ng * TW;                                   \
            const float *z0 = zs ? zs + (int64_t)t * ng * TW : NULL;                          \
            (void)s0, (void)z0, (void)cols;                                                   \
            PAIR_ROWS(BITS, w + t * tb, w + (t + 1) * tb, s0, s0 + ng * TW, z0,               \
                      z0 ? z0 + ng * TW : NULL, ng, bpg, x8 + (int64_t)m0 * K,                \
                      dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb,                         \
                      xs ? xs + (int64_t)m0 * nb : NULL, rows, K, nb,                         \
                      y + (int64_t)m0 * N + t * TW, N, cols);                                 \
            continue;                                                                         \
        }                                                                                     \
        for (int t = (c) * CHUNK_TILES; t < tiles && t < ((c) + 1) * CHUNK_TILES; t++) {      \
            int cols = N - t * TW < TW ? N - t * TW : TW;                                     \
            tile_rows(BITS, w + t * tb, scale + (int64_t)t * ng * TW,                         \
                      zs ? zs + (int64_t)t * ng * TW : NULL, ng, bpg, x8 + (int64_t)m0 * K,   \
                      dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb, rows, K, nb,            \
                      y + (int64_t)m0 * N + t * TW, N, cols);                                 \
        }                                                                                     \
    }
/* Prefill-sized GEMMs (M >= dynamic_rows) hand out their chunks as threads come for them:
 * a thread the OS takes off its core (a server's request handlers, its clients, another
 * process) no longer holds back a fixed half of the columns while the other waits at the
 * barrier. Decode batches keep fixed halves: chunks handed out cost batch-8 steps 14-23%
 * (batch 32: 0-5%; benchmarks/gemm_schedule.py measures both). */
static int dynamic_rows = 64;
int llmp_gemm_dynamic_rows(int rows) {
    int old = dynamic_rows;
    if (rows > 0) dynamic_rows = rows;
    return old;
}
#define DEFINE_GEMM(BITS)                                                                     \
void llmp_gemm_q##BITS(const int8_t *x8, const float *dx, const float *bsum, int M, int K,   \
                       int G, const uint8_t *w, const float *scale, const float *zs, int N,  \
                       float *y) {                                                            \
    int nb = K / 32, ng = K / G, bpg = G / 32, tiles = (N + TW - 1) / TW;                     \
    int64_t tb = (int64_t)nb * 32 * BITS; /* bytes per tile: 8 columns x K x BITS/8 */        \
    int chunks = (tiles + CHUNK_TILES - 1) / CHUNK_TILES;                                     \
    if (AMX_ROWS(M) && amx_gemm(BITS, x8, dx, bsum, M, K, G, w, scale, zs, N, y) == 0) return; \
    int32_t *xs = PAIRED(BITS, M) && (BITS) == 8 ? block_sums(x8, M, K) : NULL;               \
    int paired = PAIRED(BITS, M) && ((BITS) == 4 || xs != NULL);                              \
    if (M >= dynamic_rows) {                                                                  \
        _Pragma("omp parallel for schedule(dynamic)")                                         \
        for (int c = 0; c < chunks; c++) GEMM_CHUNK(BITS, c)                                  \
    } else {                                                                                  \
        _Pragma("omp parallel for schedule(static)")                                          \
        for (int c = 0; c < chunks; c++) GEMM_CHUNK(BITS, c)                                  \
    }                                                                                         \
    free(xs);                                                                                 \
}

DEFINE_GEMM(4)
DEFINE_GEMM(8)

/* y [M, N] = x @ W.T for 8-bit weights with two-term int8 activations: each row as its
 * codes x8 (given) plus the residual x - x8 * dx quantized again, both run as one batch of
 * twice the rows, so the weights are read once per SPLIT_ROWS rows and the activations
 * carry about 15 bits. 8-bit weights err so little that single int8 activations doubled
 * their drift (KL 0.0036 -> 0.0062 on the default model); the second term removes that.
 * xf: the fp32 rows (stride ld, kx valid columns, zero past them), x8/dx/bs: their codes
 * at width K. Scratch is bounded by SPLIT_ROWS rows (a 152k-word head's doubled output
 * for a 512-token window would be 0.6 GB). Returns -1 when it cannot allocate. */
#define SPLIT_ROWS 64
int llmp_gemm_q8_split(const int8_t *x8, const float *dx, const float *bs, const float *xf,
                       int ld, int kx, int M, int K, int G, const uint8_t *w,
                       const float *scale, const float *zs, int N, float *y) {
    int nb = K / 32, R = M < SPLIT_ROWS ? M : SPLIT_ROWS;
    if (M == 0) return 0;
    int8_t *x2 = (int8_t *)malloc((size_t)2 * R * K);
    float *d2 = (float *)malloc((size_t)4 * R * nb * sizeof(float));
    float *y2 = (float *)malloc((size_t)2 * R * N * sizeof(float));
    float *r = (float *)malloc((size_t)R * K * sizeof(float));
    if (!x2 || !d2 || !y2 || !r) {
        free(x2), free(d2), free(y2), free(r);
        return -1;
    }
    float *b2 = d2 + (int64_t)2 * R * nb;
    for (int m0 = 0; m0 < M; m0 += R) {
        int rows = M - m0 < R ? M - m0 : R;
        memcpy(x2, x8 + (int64_t)m0 * K, (size_t)rows * K);
        memcpy(d2, dx + (int64_t)m0 * nb, (size_t)rows * nb * sizeof(float));
        memcpy(b2, bs + (int64_t)m0 * nb, (size_t)rows * nb * sizeof(float));
        #pragma omp parallel for schedule(static) if (rows > 4)
        for (int m = 0; m < rows; m++) {
            float *rr = r + (int64_t)m * K;
            const float *xr = xf + (int64_t)(m0 + m) * ld;
            const int8_t *q = x2 + (int64_t)m * K;
            const float *d = d2 + (int64_t)m * nb;
            for (int k = 0; k < K; k++) rr[k] = (k < kx ? xr[k] : 0.f) - q[k] * d[k / 32];
            quantize_row(rr, K, x2 + (int64_t)(rows + m) * K, d2 + (int64_t)(rows + m) * nb,
                         b2 + (int64_t)(rows + m) * nb);
        }
        llmp_gemm_q8(x2, d2, b2, 2 * rows, K, G, w, scale, zs, N, y2);
        float *yo = y + (int64_t)m0 * N;
        for (int64_t i = 0; i < (int64_t)rows * N; i++) yo[i] = y2[i] + y2[(int64_t)rows * N + i];
    }
    free(x2), free(d2), free(y2), free(r);
    return 0;
}

/* Several GEMMs in one parallel pass over all their column chunks. The experts a step
 * chose are small matrices (a batch-1 step of 8 experts top-2 runs four of 0.6-1.2 MB a
 * layer); one pass over them has one fork and one tail where a pass each has four, and
 * the cores stream them as one longer GEMV. Every column is computed exactly as
 * llmp_gemm_q* computes it. Linears with outlier columns or two-term activations run one
 * by one through qlin, and so does a step with an expert of more than GROUP_ROWS rows (a
 * prefill step's): llmp_gemm_q*'s paired row tiles are faster there (a 192-row step of
 * qwen2_moe's shape ran 0.91x the per-op path's speed through this pass), while no decode
 * step of up to 32 sequences has one. Returns -1 when qlin cannot allocate. */
#define GROUP_ROWS 32
int gemm_jobs(const GemmJob *jobs, int n) {
    int64_t first[n + 1];
    first[0] = 0;
    int grouped = 1;
    for (int j = 0; j < n; j++) {
        const QLin *l = jobs[j].l;
        grouped &= l->n_out == 0 && !l->split && jobs[j].M <= GROUP_ROWS;
        int tiles = (l->n + TW - 1) / TW;
        first[j + 1] = first[j] + (tiles + CHUNK_TILES - 1) / CHUNK_TILES;
    }
    if (!grouped) {
        for (int j = 0; j < n; j++) {
            const GemmJob *J = jobs + j;
            if (qlin(J->l, (int8_t *)J->x8, (float *)J->dx, (float *)J->bs, J->M, J->y, J->xf,
                     J->l->k))
                return -1;
        }
        return 0;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < first[n]; c++) {
        int j = 0;
        while (c >= first[j + 1]) j++;
        const GemmJob *J = jobs + j;
        const QLin *l = J->l;
        int K = l->k, N = l->n, M = J->M, nb = K / 32, ng = K / l->g, bpg = l->g / 32;
        int tiles = (N + TW - 1) / TW;
        int64_t tb = (int64_t)nb * 32 * l->bits, t0 = (c - first[j]) * CHUNK_TILES;
        const uint8_t *w = (const uint8_t *)l->w;
        for (int m0 = 0; m0 < M; m0 += ROW_BLOCK) {
            int rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
            for (int64_t t = t0; t < tiles && t < t0 + CHUNK_TILES; t++) {
                int cols = N - t * TW < TW ? N - (int)t * TW : TW;
                const float *sc = l->scale + t * ng * TW, *zs = l->zs ? l->zs + t * ng * TW : NULL;
                const int8_t *x8 = J->x8 + (int64_t)m0 * K;
                const float *dx = J->dx + (int64_t)m0 * nb, *bs = J->bs + (int64_t)m0 * nb;
                float *y = J->y + (int64_t)m0 * N + t * TW;
                if (l->bits == 4) /* two call sites: each inlined for its constant width */
                    tile_rows(4, w + t * tb, sc, zs, ng, bpg, x8, dx, bs, rows, K, nb, y, N, cols);
                else
                    tile_rows(8, w + t * tb, sc, zs, ng, bpg, x8, dx, bs, rows, K, nb, y, N, cols);
            }
        }
    }
    for (int j = 0; j < n; j++) {
        const GemmJob *J = jobs + j;
        if (J->l->bias)
            for (int m = 0; m < J->M; m++)
                for (int c = 0; c < J->l->n; c++) J->y[(int64_t)m * J->l->n + c] += J->l->bias[c];
    }
    return 0;
}
