/* The decode attention's 512-bit forms: scores and weighted values straight from 8-bit
 * codes at head sizes that are multiples of 64, sixteen codes a conversion (half the
 * conversions and FMAs of the eight-lane loops); everything else is
 * decode_attention_avx2.h's. 4-bit codes keep the eight-lane loops: sixteen lanes (each
 * code's float from a 16-entry table by a permute) were 0.91-0.95x at batch 1 below 400
 * tokens and no faster past them (benchmarks/attention_ab.py, AVX-512 Xeon). */
#ifndef LLMPRESS_DECODE_ATTENTION_AVX512_H
#define LLMPRESS_DECODE_ATTENTION_AVX512_H

#include "decode_attention_avx2.h"
#if !(defined(__AVX512F__) && defined(__AVX512BW__))
#error "decode_attention_avx512.h needs AVX-512 F and BW"
#endif

/* 8-bit codes of channels d..d+15 of one token, as floats. */
INLINE __m512 codes16(const uint8_t *p, int d) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + d))));
}

/* The four lane-sums of a0..a3 as [sum a0, sum a1, sum a2, sum a3]. */
static inline __m128 hsum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define HALVES(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    return hsum4x8(HALVES(a0), HALVES(a1), HALVES(a2), HALVES(a3));
#undef HALVES
}

/* code_scores, sixteen channels a step. D % 16 == 0. */
INLINE void code_scores16(float (*qs)[HEAD_MAX], int nr, const uint8_t *codes, int bytes, int n,
                          int D, float scale, float (*s)[CHUNK_T]) {
    const float *q0 = qs[0], *q1 = qs[nr > 1 ? 1 : 0], *q2 = qs[nr > 2 ? 2 : 0];
    __m128 sc = _mm_set1_ps(scale);
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        __m512 a[3][4];
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < 4; i++) a[h][i] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            __m512 x0 = _mm512_loadu_ps(q0 + d), x1 = _mm512_loadu_ps(q1 + d), x2 = _mm512_loadu_ps(q2 + d);
            for (int i = 0; i < 4; i++) {
                __m512 k = codes16(codes + (int64_t)(t + i) * bytes, d);
                a[0][i] = _mm512_fmadd_ps(x0, k, a[0][i]);
                a[1][i] = _mm512_fmadd_ps(x1, k, a[1][i]);
                a[2][i] = _mm512_fmadd_ps(x2, k, a[2][i]);
            }
        }
        for (int h = 0; h < nr; h++)
            _mm_storeu_ps(s[h] + t, _mm_mul_ps(hsum4x16(a[h][0], a[h][1], a[h][2], a[h][3]), sc));
    }
    for (; t < n; t++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0;
        for (int d = 0; d < D; d += 16) {
            __m512 k = codes16(codes + (int64_t)t * bytes, d);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + d), k, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + d), k, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + d), k, a2);
        }
        s[0][t] = _mm512_reduce_add_ps(a0) * scale;
        if (nr > 1) s[1][t] = _mm512_reduce_add_ps(a1) * scale;
        if (nr > 2) s[2][t] = _mm512_reduce_add_ps(a2) * scale;
    }
}

/* code_values, 64 channels at a time (twelve accumulators). D % 64 == 0. */
INLINE void code_values16(float (*w)[CHUNK_T], int nr, const uint8_t *codes, int bytes, int n,
                          int D, float *out) {
    for (int d = 0; d < D; d += 64) {
        __m512 o[3][4];
        for (int h = 0; h < 3; h++)
            for (int j = 0; j < 4; j++) o[h][j] = h < nr ? _mm512_loadu_ps(out + h * D + d + 16 * j) : _mm512_setzero_ps();
        for (int t = 0; t < n; t++) {
            const uint8_t *p = codes + (int64_t)t * bytes;
            __m512 v0 = codes16(p, d), v1 = codes16(p, d + 16);
            __m512 v2 = codes16(p, d + 32), v3 = codes16(p, d + 48);
            for (int h = 0; h < 3; h++) {
                __m512 p_ = _mm512_set1_ps(w[h < nr ? h : 0][t]);
                o[h][0] = _mm512_fmadd_ps(p_, v0, o[h][0]);
                o[h][1] = _mm512_fmadd_ps(p_, v1, o[h][1]);
                o[h][2] = _mm512_fmadd_ps(p_, v2, o[h][2]);
                o[h][3] = _mm512_fmadd_ps(p_, v3, o[h][3]);
            }
        }
        for (int h = 0; h < nr; h++)
            for (int j = 0; j < 4; j++) _mm512_storeu_ps(out + h * D + d + 16 * j, o[h][j]);
    }
}
INLINE int scores_from_codes_avx512(float (*qs)[HEAD_MAX], int rep, const uint8_t *kc, int bits,
                                    int n, int D, float scale, float (*s)[CHUNK_T]) {
    if (bits != 8 || D % 64)
        return scores_from_codes_avx2(qs, rep, kc, bits, n, D, scale, s);
    for (int r0 = 0; r0 < rep; r0 += 3)
        SPECIALIZED(8, D, ((void)BITS, code_scores16(qs + r0, rep - r0 < 3 ? rep - r0 : 3, kc, BYTES, n, HD, scale, s + r0)));
    return 1;
}

INLINE int values_from_codes_avx512(float (*w)[CHUNK_T], int rep, const uint8_t *vc, int bits,
                                    int n, int D, float *out) {
    if (bits != 8 || D % 64) return values_from_codes_avx2(w, rep, vc, bits, n, D, out);
    for (int r0 = 0; r0 < rep; r0 += 3)
        SPECIALIZED(8, D, ((void)BITS, code_values16(w + r0, rep - r0 < 3 ? rep - r0 : 3, vc, BYTES, n, HD, out + r0 * D)));
    return 1;
}

#endif
