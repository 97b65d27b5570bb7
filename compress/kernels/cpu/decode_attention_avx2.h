/* The decode attention's row work in 256-bit vectors (AVX2 with FMA), then what is left in
 * plain C (decode_attention_ref.h); scores and weighted values straight from 8- or 4-bit
 * codes, each converted in registers once for up to three query heads. */
#ifndef LLMPRESS_DECODE_ATTENTION_AVX2_H
#define LLMPRESS_DECODE_ATTENTION_AVX2_H

#include "decode_attention_ref.h"
#if !defined(__AVX2__)
#error "decode_attention_avx2.h needs AVX2"
#endif

/* s[0..n) += add, 8 at a time; returns their largest. */
INLINE float add_max_avx2(float *s, int n, float add) {
    int i = 0;
    __m256 a = _mm256_set1_ps(add), mx = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_add_ps(_mm256_loadu_ps(s + i), a);
        _mm256_storeu_ps(s + i, x);
        mx = _mm256_max_ps(mx, x);
    }
    return add_max_from(s, i, n, add, hmax8(mx));
}

INLINE void exp_shift_avx2(float *s, int n, float m) {
    int i = 0;
    __m256 mv = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv)));
    exp_shift_from(s, i, n, m);
}

INLINE void weigh_codes_avx2(const float *p, const float *vs, const float *vm, int n, float *w,
                             float *lsum, float *msum) {
    int i = 0;
    __m256 ls = _mm256_setzero_ps(), ms = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(p + i);
        ls = _mm256_add_ps(ls, x);
        ms = _mm256_fmadd_ps(x, _mm256_loadu_ps(vm + i), ms);
        _mm256_storeu_ps(w + i, _mm256_mul_ps(x, _mm256_loadu_ps(vs + i)));
    }
    *lsum = hsum8(ls), *msum = hsum8(ms);
    weigh_codes_from(p, vs, vm, i, n, w, lsum, msum);
}

/* Eight rows at a time, their eight partial vectors reduced together (one transpose-add
 * instead of eight horizontal sums). */
INLINE void row_scores_avx2(const float *q, const float *rows, int n, int D, float scale,
                            float *scores) {
    int t = 0;
    if (D % 8 == 0)
        for (; t + 8 <= n; t += 8) {
            __m256 a[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
            for (int d = 0; d < D; d += 8) {
                __m256 qv = _mm256_loadu_ps(q + d);
                for (int i = 0; i < 8; i++)
                    a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + (int64_t)(t + i) * D + d), a[i]);
            }
            __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
            __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
            __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
            /* lanes: [r0 r1 r2 r3 | r0 r1 r2 r3] halves of rows 0-3 and of rows 4-7 */
            __m256 lo = _mm256_permute2f128_ps(h0123, h4567, 0x20);
            __m256 hi = _mm256_permute2f128_ps(h0123, h4567, 0x31);
            _mm256_storeu_ps(scores + t, _mm256_mul_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale)));
        }
    row_scores_from(q, rows, t, n, D, scale, scores);
}

/* The accumulator kept in registers over the rows. */
INLINE void weighted_rows_avx2(const float *w, const float *rows, int n, int D, float *out) {
    int d = 0;
    for (; d + 64 <= D; d += 64) { /* eight accumulators, eight independent FMA chains
                                     * (four left the loop waiting on the FMA's latency:
                                     * benchmarks/attention_ab.py, fp32 attention 8-21%) */
        __m256 o[8];
        for (int j = 0; j < 8; j++) o[j] = _mm256_loadu_ps(out + d + 8 * j);
        for (int t = 0; t < n; t++) {
            const float *r = rows + (int64_t)t * D + d;
            __m256 p = _mm256_set1_ps(w[t]);
            for (int j = 0; j < 8; j++) o[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 8 * j), o[j]);
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + d + 8 * j, o[j]);
    }
    for (; d + 32 <= D; d += 32) {
        __m256 o0 = _mm256_loadu_ps(out + d), o1 = _mm256_loadu_ps(out + d + 8);
        __m256 o2 = _mm256_loadu_ps(out + d + 16), o3 = _mm256_loadu_ps(out + d + 24);
        for (int t = 0; t < n; t++) {
            const float *r = rows + (int64_t)t * D + d;
            __m256 p = _mm256_set1_ps(w[t]);
            o0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r), o0);
            o1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 8), o1);
            o2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 16), o2);
            o3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 24), o3);
        }
        _mm256_storeu_ps(out + d, o0), _mm256_storeu_ps(out + d + 8, o1);
        _mm256_storeu_ps(out + d + 16, o2), _mm256_storeu_ps(out + d + 24, o3);
    }
    weighted_rows_from(w, rows, n, d, D, out);
}

/* Codes of channels d..d+7 of one token, as floats. */
INLINE __m256 codes8(const uint8_t *p, int bits, int d) {
    if (bits == 8)
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + d))));
    int32_t w;
    memcpy(&w, p + d / 2, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x0F)));
}

/* The four lanes-sums of a0..a3 as one vector [sum a0, sum a1, sum a2, sum a3]. */
static inline __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* s[r][t] = scale * qs[r] . keys(t) for nr <= 3 heads and n tokens of codes: each code
 * vector is converted in registers once and used by every head, four tokens at a time
 * (twelve independent FMA chains). D % 8 == 0. */
INLINE void code_scores(float (*qs)[HEAD_MAX], int nr, const uint8_t *codes, int bytes, int bits,
                        int n, int D, float scale, float (*s)[CHUNK_T]) {
    const float *q0 = qs[0], *q1 = qs[nr > 1 ? 1 : 0], *q2 = qs[nr > 2 ? 2 : 0];
    __m256 sc = _mm256_set1_ps(scale);
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        __m256 a[3][4];
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < 4; i++) a[h][i] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d), x2 = _mm256_loadu_ps(q2 + d);
            for (int i = 0; i < 4; i++) {
                __m256 k = codes8(codes + (int64_t)(t + i) * bytes, bits, d);
                a[0][i] = _mm256_fmadd_ps(x0, k, a[0][i]);
                a[1][i] = _mm256_fmadd_ps(x1, k, a[1][i]);
                a[2][i] = _mm256_fmadd_ps(x2, k, a[2][i]);
            }
        }
        for (int h = 0; h < nr; h++)
            _mm_storeu_ps(s[h] + t, _mm_mul_ps(hsum4x8(a[h][0], a[h][1], a[h][2], a[h][3]),
                                               _mm256_castps256_ps128(sc)));
    }
    for (; t < n; t++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0;
        for (int d = 0; d < D; d += 8) {
            __m256 k = codes8(codes + (int64_t)t * bytes, bits, d);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), k, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), k, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), k, a2);
        }
        s[0][t] = hsum8(a0) * scale;
        if (nr > 1) s[1][t] = hsum8(a1) * scale;
        if (nr > 2) s[2][t] = hsum8(a2) * scale;
    }
}

/* out[r] += sum_t w[r][t] * values(t) for nr <= 3 heads, the value codes converted in
 * registers once for every head; 32 channels at a time (twelve accumulators). D % 32 == 0. */
INLINE void code_values(float (*w)[CHUNK_T], int nr, const uint8_t *codes, int bytes, int bits,
                        int n, int D, float *out) {
    for (int d = 0; d < D; d += 32) {
        __m256 o[3][4];
        for (int h = 0; h < 3; h++)
            for (int j = 0; j < 4; j++) o[h][j] = h < nr ? _mm256_loadu_ps(out + h * D + d + 8 * j) : _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const uint8_t *p = codes + (int64_t)t * bytes;
            __m256 v0 = codes8(p, bits, d), v1 = codes8(p, bits, d + 8);
            __m256 v2 = codes8(p, bits, d + 16), v3 = codes8(p, bits, d + 24);
            for (int h = 0; h < 3; h++) {
                __m256 p_ = _mm256_set1_ps(w[h < nr ? h : 0][t]);
                o[h][0] = _mm256_fmadd_ps(p_, v0, o[h][0]);
                o[h][1] = _mm256_fmadd_ps(p_, v1, o[h][1]);
                o[h][2] = _mm256_fmadd_ps(p_, v2, o[h][2]);
                o[h][3] = _mm256_fmadd_ps(p_, v3, o[h][3]);
            }
        }
        for (int h = 0; h < nr; h++)
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(out + h * D + d + 8 * j, o[h][j]);
    }
}
/* CALL compiled for constant BITS (8 or 4) and, for the common head sizes 64 and 128, a
 * constant head size HD (BYTES = HD * BITS / 8): the inner loops then unroll fully and
 * lose their branches (int8 attention 5-10% faster than with run-time sizes). */
#define SPECIALIZED(bits_, d_, CALL)                                                          \
    do {                                                                                      \
        if ((bits_) == 8 && (d_) == 64) { enum { BITS = 8, HD = 64, BYTES = 64 }; CALL; }      \
        else if ((bits_) == 8 && (d_) == 128) { enum { BITS = 8, HD = 128, BYTES = 128 }; CALL; } \
        else if ((bits_) == 4 && (d_) == 64) { enum { BITS = 4, HD = 64, BYTES = 32 }; CALL; } \
        else if ((bits_) == 4 && (d_) == 128) { enum { BITS = 4, HD = 128, BYTES = 64 }; CALL; } \
        else if ((bits_) == 8) { const int BITS = 8, HD = (d_), BYTES = HD; CALL; }            \
        else { const int BITS = 4, HD = (d_), BYTES = HD / 2; CALL; }                          \
    } while (0)

/* Scores of `rep` heads straight from a chunk's codes, heads three at a time; 1 if done
 * (head sizes that are multiples of 32), else 0. */
INLINE int scores_from_codes_avx2(float (*qs)[HEAD_MAX], int rep, const uint8_t *kc, int bits, int n,
                                  int D, float scale, float (*s)[CHUNK_T]) {
    if (D % 32) return 0;
    for (int r0 = 0; r0 < rep; r0 += 3)
        SPECIALIZED(bits, D, code_scores(qs + r0, rep - r0 < 3 ? rep - r0 : 3, kc, BYTES, BITS, n, HD, scale, s + r0));
    return 1;
}

/* Weighted values of `rep` heads straight from a chunk's codes, heads three at a time. */
INLINE int values_from_codes_avx2(float (*w)[CHUNK_T], int rep, const uint8_t *vc, int bits,
                                  int n, int D, float *out) {
    if (D % 32) return 0;
    for (int r0 = 0; r0 < rep; r0 += 3)
        SPECIALIZED(bits, D, code_values(w + r0, rep - r0 < 3 ? rep - r0 : 3, vc, BYTES, BITS, n, HD, out + r0 * D));
    return 1;
}

#endif
