/* A step's token choices' row scans in 256-bit vectors, then the rest in plain C
 * (tokens_ref.h). */
#ifndef LLMPRESS_TOKENS_AVX2_H
#define LLMPRESS_TOKENS_AVX2_H

#include "tokens_ref.h"
#if !defined(__AVX2__)
#error "tokens_avx2.h needs AVX2"
#endif

INLINE float row_max_avx2(const float *x, int64_t n, int *nan) {
    int64_t i = 0;
    float m = -INFINITY;
    *nan = 0;
    if (n >= 8) {
        __m256 mx = _mm256_set1_ps(-INFINITY), un = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            mx = _mm256_max_ps(mx, v);
        }
        *nan = _mm256_movemask_ps(un) != 0;
        m = hmax8(mx);
    }
    return row_max_from(x, i, n, m, nan);
}

/* Eight at a time (compared one by one: 25 us of a 49k-word row here, now 8). */
INLINE int64_t first_index_avx2(const float *x, int64_t n, float m, int nan) {
    int64_t i = 0;
    const __m256 mv = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        int hit = _mm256_movemask_ps(nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q)
                                         : _mm256_cmp_ps(v, mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz(hit);
    }
    return first_index_from(x, i, n, m, nan);
}

/* exp8 (relative error ~2e-7); the sum in float64 lanes, added in a fixed order. */
INLINE double block_weights_avx2(const float *t, float m, float it, float *w) {
    const __m256 mv = _mm256_set1_ps(m), iv = _mm256_set1_ps(it), lo = _mm256_set1_ps(-87.f);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (int i = 0; i < DRAW_BLOCK; i += 8) {
        __m256 a = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(t + i), mv), iv);
        /* below e^-87 (and -inf): weight 0, not exp8's clamped e^-87.3 */
        __m256 e = _mm256_and_ps(exp8(a), _mm256_cmp_ps(a, lo, _CMP_GT_OQ));
        _mm256_storeu_ps(w + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double l[4];
    _mm256_storeu_pd(l, _mm256_add_pd(s0, s1));
    return (l[0] + l[2]) + (l[1] + l[3]);
}

#endif
