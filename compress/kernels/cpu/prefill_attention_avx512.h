/* The prefill attention's row work in 512-bit vectors: blocks of 16 keys, 32 or 16
 * dimensions of the values a pass, then the 256-bit forms (prefill_attention_avx2.h) for
 * what is left. Every lane computes the reference's sums in the same order. */
#ifndef LLMPRESS_PREFILL_ATTENTION_AVX512_H
#define LLMPRESS_PREFILL_ATTENTION_AVX512_H

#include "prefill_attention_avx2.h"
#if !defined(__AVX512F__)
#error "prefill_attention_avx512.h needs AVX-512"
#endif

/* Whole blocks of 16 keys, two at a time while both have keys: 16 sums in flight hide the
 * FMA latency, and each query broadcast feeds two FMAs (1.3x the one-block loop's rate). */
INLINE void group_scores_avx512(const float *const *qv, const float *kt, int D, int j0, int n,
                                float scale, float *s, int lds) {
    int j = 0;
    for (; j + 16 < n; j += 32) {
        __m512 a0[QG], a1[QG];
        for (int q = 0; q < QG; q++) a0[q] = a1[q] = _mm512_setzero_ps();
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        const float *kd = kc + (int64_t)D * KB; /* the next block */
        for (int d = 0; d < D; d++) {
            __m512 k0 = _mm512_loadu_ps(kc + (int64_t)d * KB);
            __m512 k1 = _mm512_loadu_ps(kd + (int64_t)d * KB);
            for (int q = 0; q < QG; q++) {
                __m512 qq = _mm512_set1_ps(qv[q][d]);
                a0[q] = _mm512_fmadd_ps(qq, k0, a0[q]);
                a1[q] = _mm512_fmadd_ps(qq, k1, a1[q]);
            }
        }
        __m512 sv = _mm512_set1_ps(scale);
        for (int q = 0; q < QG; q++) {
            _mm512_storeu_ps(s + (int64_t)q * lds + j, _mm512_mul_ps(a0[q], sv));
            _mm512_storeu_ps(s + (int64_t)q * lds + j + 16, _mm512_mul_ps(a1[q], sv));
        }
    }
    for (; j < n; j += 16) {
        __m512 acc[QG];
        for (int q = 0; q < QG; q++) acc[q] = _mm512_setzero_ps();
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        for (int d = 0; d < D; d++) {
            __m512 k16 = _mm512_loadu_ps(kc + (int64_t)d * KB);
            for (int q = 0; q < QG; q++)
                acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(qv[q][d]), k16, acc[q]);
        }
        for (int q = 0; q < QG; q++)
            _mm512_storeu_ps(s + (int64_t)q * lds + j, _mm512_mul_ps(acc[q], _mm512_set1_ps(scale)));
    }
    group_scores_from(qv, kt, D, j0, j, n, scale, s, lds);
}

/* Four chains of 16 first (one waited on its own latency: 10% of the call). */
INLINE float scores_max_avx512(const float *sq, int i, int b) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    if (b - i >= 64) {
        __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        for (; i + 64 <= b; i += 64) {
            m0 = _mm512_max_ps(m0, _mm512_loadu_ps(sq + i));
            m1 = _mm512_max_ps(m1, _mm512_loadu_ps(sq + i + 16));
            m2 = _mm512_max_ps(m2, _mm512_loadu_ps(sq + i + 32));
            m3 = _mm512_max_ps(m3, _mm512_loadu_ps(sq + i + 48));
        }
        m0 = _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3));
        mx = _mm256_max_ps(_mm512_castps512_ps256(m0),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m0), 1)));
    }
    return scores_max8(sq, i, b, mx);
}

/* 16 at a time, each half summed in turn: the 8-lane order. */
INLINE float exp_sum_avx512(float *sq, int i, int b, float m) {
    __m256 ls = _mm256_setzero_ps();
    __m512 mw = _mm512_set1_ps(m);
    for (; i + 16 <= b; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sq + i), mw));
        _mm512_storeu_ps(sq + i, e);
        ls = _mm256_add_ps(ls, _mm512_castps512_ps256(e));
        ls = _mm256_add_ps(ls, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    return exp_sum8(sq, i, b, m, ls);
}

/* 32 dimensions of every query a pass (16 sums in flight), then 16, then 8. */
INLINE void group_values_avx512(const float *s, int lds, const float *v, int64_t ldv, int j0,
                                int ib, int ie, int D, float *const *out) {
    int d = 0;
    for (; d + 32 <= D; d += 32) {
        __m512 a0[QG], a1[QG];
        for (int q = 0; q < QG; q++) {
            a0[q] = ib ? _mm512_loadu_ps(out[q] + d) : _mm512_setzero_ps();
            a1[q] = ib ? _mm512_loadu_ps(out[q] + d + 16) : _mm512_setzero_ps();
        }
        for (int i = ib; i < ie; i++) {
            const float *vr = v + (int64_t)(j0 + i) * ldv + d;
            __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16);
            for (int q = 0; q < QG; q++) {
                __m512 w = _mm512_set1_ps(s[(int64_t)q * lds + i]);
                a0[q] = _mm512_fmadd_ps(w, v0, a0[q]);
                a1[q] = _mm512_fmadd_ps(w, v1, a1[q]);
            }
        }
        for (int q = 0; q < QG; q++) {
            _mm512_storeu_ps(out[q] + d, a0[q]);
            _mm512_storeu_ps(out[q] + d + 16, a1[q]);
        }
    }
    for (; d + 16 <= D; d += 16) {
        __m512 acc[QG];
        for (int q = 0; q < QG; q++)
            acc[q] = ib ? _mm512_loadu_ps(out[q] + d) : _mm512_setzero_ps();
        for (int i = ib; i < ie; i++) {
            __m512 v16 = _mm512_loadu_ps(v + (int64_t)(j0 + i) * ldv + d);
            for (int q = 0; q < QG; q++)
                acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(s[(int64_t)q * lds + i]), v16, acc[q]);
        }
        for (int q = 0; q < QG; q++) _mm512_storeu_ps(out[q] + d, acc[q]);
    }
    group_values8(s, lds, v, ldv, j0, ib, ie, d, D, out);
}

#endif
