/* The prefill attention's row work in 256-bit vectors (AVX2 with FMA): blocks of 8 keys,
 * then what is left in plain C (prefill_attention_ref.h). Every score, maximum, sum and
 * weighted value is the reference's in each lane, in the same order. */
#ifndef LLMPRESS_PREFILL_ATTENTION_AVX2_H
#define LLMPRESS_PREFILL_ATTENTION_AVX2_H

#include "prefill_attention_ref.h"
#if !defined(__AVX2__)
#error "prefill_attention_avx2.h needs AVX2"
#endif

/* Whole blocks of 8 keys; two at a time while both have keys, half the queries at a pass
 * (16 registers: 8 sums, 2 key vectors, a broadcast), so a broadcast feeds two FMAs. */
INLINE void group_scores_avx2(const float *const *qv, const float *kt, int D, int j0, int n,
                              float scale, float *s, int lds) {
    int j = 0;
    for (; j + 8 < n; j += 16) {
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        const float *kd = kc + (int64_t)D * KB; /* the next block */
        __m256 sv = _mm256_set1_ps(scale);
        for (int h = 0; h < QG; h += 4) {
            __m256 a0[4], a1[4];
            for (int q = 0; q < 4; q++) a0[q] = a1[q] = _mm256_setzero_ps();
            for (int d = 0; d < D; d++) {
                __m256 k0 = _mm256_loadu_ps(kc + (int64_t)d * KB);
                __m256 k1 = _mm256_loadu_ps(kd + (int64_t)d * KB);
                for (int q = 0; q < 4; q++) {
                    __m256 qq = _mm256_set1_ps(qv[h + q][d]);
                    a0[q] = _mm256_fmadd_ps(qq, k0, a0[q]);
                    a1[q] = _mm256_fmadd_ps(qq, k1, a1[q]);
                }
            }
            for (int q = 0; q < 4; q++) {
                _mm256_storeu_ps(s + (int64_t)(h + q) * lds + j, _mm256_mul_ps(a0[q], sv));
                _mm256_storeu_ps(s + (int64_t)(h + q) * lds + j + 8, _mm256_mul_ps(a1[q], sv));
            }
        }
    }
    for (; j < n; j += 8) {
        __m256 acc[QG];
        for (int q = 0; q < QG; q++) acc[q] = _mm256_setzero_ps();
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        for (int d = 0; d < D; d++) {
            __m256 k8 = _mm256_loadu_ps(kc + (int64_t)d * KB);
            for (int q = 0; q < QG; q++)
                acc[q] = _mm256_fmadd_ps(_mm256_set1_ps(qv[q][d]), k8, acc[q]);
        }
        for (int q = 0; q < QG; q++)
            _mm256_storeu_ps(s + (int64_t)q * lds + j, _mm256_mul_ps(acc[q], _mm256_set1_ps(scale)));
    }
    group_scores_from(qv, kt, D, j0, j, n, scale, s, lds);
}

/* The largest of sq[i..b) and the lanes of mx, 8 at a time (a maximum is the same in any
 * order). */
INLINE float scores_max8(const float *sq, int i, int b, __m256 mx) {
    for (; i + 8 <= b; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sq + i));
    return scores_max_from(sq, i, b, hmax8(mx));
}

/* Four chains of 8 first: one waited on its own latency. */
INLINE float scores_max_avx2(const float *sq, int i, int b) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    if (b - i >= 32) {
        __m256 m1 = mx, m2 = mx, m3 = mx;
        for (; i + 32 <= b; i += 32) {
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(sq + i));
            m1 = _mm256_max_ps(m1, _mm256_loadu_ps(sq + i + 8));
            m2 = _mm256_max_ps(m2, _mm256_loadu_ps(sq + i + 16));
            m3 = _mm256_max_ps(m3, _mm256_loadu_ps(sq + i + 24));
        }
        mx = _mm256_max_ps(_mm256_max_ps(mx, m1), _mm256_max_ps(m2, m3));
    }
    return scores_max8(sq, i, b, mx);
}

/* sq[i..b) = exp(sq - m), 8 at a time, their sum added to the 8 lanes of ls and then in
 * plain C. */
INLINE float exp_sum8(float *sq, int i, int b, float m, __m256 ls) {
    __m256 mv = _mm256_set1_ps(m);
    for (; i + 8 <= b; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sq + i), mv));
        _mm256_storeu_ps(sq + i, e);
        ls = _mm256_add_ps(ls, e);
    }
    return exp_sum_from(sq, i, b, m, hsum8(ls));
}

INLINE float exp_sum_avx2(float *sq, int i, int b, float m) {
    return exp_sum8(sq, i, b, m, _mm256_setzero_ps());
}

/* A product is the same in any lane (this loop was 10% scalar). */
INLINE void scale_scores_avx2(float *sq, int i, int b, float r) {
    __m256 rv = _mm256_set1_ps(r);
    for (; i + 8 <= b; i += 8) _mm256_storeu_ps(sq + i, _mm256_mul_ps(_mm256_loadu_ps(sq + i), rv));
    scale_scores_from(sq, i, b, r);
}

/* 8 dimensions of every query a pass from d, then the reference. */
INLINE void group_values8(const float *s, int lds, const float *v, int64_t ldv, int j0, int ib,
                          int ie, int d, int D, float *const *out) {
    for (; d + 8 <= D; d += 8) {
        __m256 acc[QG];
        for (int q = 0; q < QG; q++)
            acc[q] = ib ? _mm256_loadu_ps(out[q] + d) : _mm256_setzero_ps();
        for (int i = ib; i < ie; i++) {
            __m256 v8 = _mm256_loadu_ps(v + (int64_t)(j0 + i) * ldv + d);
            for (int q = 0; q < QG; q++)
                acc[q] = _mm256_fmadd_ps(_mm256_set1_ps(s[(int64_t)q * lds + i]), v8, acc[q]);
        }
        for (int q = 0; q < QG; q++) _mm256_storeu_ps(out[q] + d, acc[q]);
    }
    group_values_from(s, lds, v, ldv, j0, ib, ie, d, D, out);
}

/* 16 dimensions of half the queries a pass: a broadcast weight feeds two FMAs (the same
 * sums in the same order). */
INLINE void group_values_avx2(const float *s, int lds, const float *v, int64_t ldv, int j0,
                              int ib, int ie, int D, float *const *out) {
    int d = 0;
    for (; d + 16 <= D; d += 16)
        for (int h = 0; h < QG; h += 4) {
            __m256 a0[4], a1[4];
            for (int q = 0; q < 4; q++) {
                a0[q] = ib ? _mm256_loadu_ps(out[h + q] + d) : _mm256_setzero_ps();
                a1[q] = ib ? _mm256_loadu_ps(out[h + q] + d + 8) : _mm256_setzero_ps();
            }
            for (int i = ib; i < ie; i++) {
                const float *vr = v + (int64_t)(j0 + i) * ldv + d;
                __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
                for (int q = 0; q < 4; q++) {
                    __m256 w = _mm256_set1_ps(s[(int64_t)(h + q) * lds + i]);
                    a0[q] = _mm256_fmadd_ps(w, v0, a0[q]);
                    a1[q] = _mm256_fmadd_ps(w, v1, a1[q]);
                }
            }
            for (int q = 0; q < 4; q++) {
                _mm256_storeu_ps(out[h + q] + d, a0[q]);
                _mm256_storeu_ps(out[h + q] + d + 8, a1[q]);
            }
        }
    group_values8(s, lds, v, ldv, j0, ib, ie, d, D, out);
}

#endif
