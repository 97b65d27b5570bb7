/* eval's divergence sums in 256-bit vectors (exp8: relative error ~2e-7), added in a fixed
 * order; the rest in plain C (divergence_ref.h). */
#ifndef LLMPRESS_DIVERGENCE_AVX2_H
#define LLMPRESS_DIVERGENCE_AVX2_H

#include "divergence_ref.h"
#if !defined(__AVX2__)
#error "divergence_avx2.h needs AVX2"
#endif

/* float32 lanes over blocks of DIVERGENCE_BLOCK values, each block's lanes then added to
 * float64 ones: converting every vector cost as much as the exponentials. */
#define DIVERGENCE_BLOCK 256

INLINE __m256d lanes_add(__m256d acc, __m256 v) {
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

INLINE double lanes_total(__m256d v) {
    double l[4];
    _mm256_storeu_pd(l, v);
    return (l[0] + l[2]) + (l[1] + l[3]);
}

INLINE double exp_sum_avx2(const float *c, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256d acc = _mm256_setzero_pd();
    int64_t i = 0;
    while (i + 8 <= n) {
        __m256 b = _mm256_setzero_ps();
        int64_t end = i + DIVERGENCE_BLOCK < n ? i + DIVERGENCE_BLOCK : n;
        for (; i + 8 <= end; i += 8) b = _mm256_add_ps(b, exp8(_mm256_sub_ps(_mm256_loadu_ps(c + i), mv)));
        acc = lanes_add(acc, b);
    }
    return exp_sum_from(c, i, n, m, lanes_total(acc));
}

INLINE double kl_sum_avx2(const float *p, const float *c, int64_t n, float lse) {
    const __m256 lv = _mm256_set1_ps(lse), lo = _mm256_set1_ps(-87.f);
    __m256d acc = _mm256_setzero_pd();
    int64_t i = 0;
    while (i + 8 <= n) {
        __m256 b = _mm256_setzero_ps();
        int64_t end = i + DIVERGENCE_BLOCK < n ? i + DIVERGENCE_BLOCK : n;
        for (; i + 8 <= end; i += 8) {
            __m256 pv = _mm256_loadu_ps(p + i);
            __m256 lp = _mm256_sub_ps(_mm256_loadu_ps(c + i), lv); /* the candidate's log-prob */
            __m256 t = _mm256_mul_ps(exp8(pv), _mm256_sub_ps(pv, lp));
            /* weight 0 at or below e^-87 (and -inf, where the product would be NaN) */
            b = _mm256_add_ps(b, _mm256_and_ps(t, _mm256_cmp_ps(pv, lo, _CMP_GT_OQ)));
        }
        acc = lanes_add(acc, b);
    }
    return kl_sum_from(p, c, i, n, lse, lanes_total(acc));
}

#endif
