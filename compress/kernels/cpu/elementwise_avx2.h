/* The activation times up, and the activation of an MLP without a gate, in 256-bit
 * vectors (exp8: relative error ~2e-7), then the rest in plain C (elementwise_ref.h). */
#ifndef LLMPRESS_ELEMENTWISE_AVX2_H
#define LLMPRESS_ELEMENTWISE_AVX2_H

#include "elementwise_ref.h"
#if !defined(__AVX2__)
#error "elementwise_avx2.h needs AVX2"
#endif

/* The exact gelu of 8 values: 0.5 g erfc(x) for g < 0, 0.5 g (2 - erfc(x)) else, x = |g| /
 * sqrt 2, with erfc's Chebyshev fit t exp(-x^2 + P(t)), t = 1 / (1 + x/2) (Numerical
 * Recipes' erfcc: relative error < 1.2e-7 for every x >= 0). */
static inline __attribute__((always_inline)) __m256 gelu8(__m256 g) {
    static const float c[10] = {0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f,
                                0.27886807f, -0.18628806f, 0.09678418f, 0.37409196f,
                                1.00002368f, -1.26551223f};
    const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
    __m256 x = _mm256_mul_ps(_mm256_andnot_ps(sign, g), _mm256_set1_ps(0.70710678118f));
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.5f), x, one));
    __m256 p = _mm256_set1_ps(c[0]);
    for (int k = 1; k < 10; k++) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c[k]));
    __m256 erfc = _mm256_mul_ps(t, exp8(_mm256_fnmadd_ps(x, x, p)));
    /* past x = 9.3 erfc is below fp32's smallest normal, where exp8 stops at its clamp */
    erfc = _mm256_and_ps(erfc, _mm256_cmp_ps(x, _mm256_set1_ps(9.3f), _CMP_LT_OQ));
    __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 f = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.f), erfc), erfc, neg);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), f);
}

INLINE void act_mul_avx2(const float *g, const float *u, int I, int act, float *o) {
    int i = 0;
    for (; act == ACT_GELU && i + 8 <= I; i += 8)
        _mm256_storeu_ps(o + i, _mm256_mul_ps(gelu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    for (; (act == ACT_SILU || act == ACT_GELU_TANH) && i + 8 <= I; i += 8) { /* the rest: C */
        __m256 gv = _mm256_loadu_ps(g + i), sv;
        if (act == ACT_SILU) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        } else { /* 0.5 g (1 + tanh z) = g / (1 + exp(-2z)) */
            __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
            __m256 z = _mm256_mul_ps(_mm256_set1_ps(0.7978845608f),
                                     _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, gv));
            __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.f), z));
            sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        }
        _mm256_storeu_ps(o + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
    }
    act_mul_from(g, u, i, I, act, o);
}

/* o = act(u) of an MLP without a gate: relu², gelu and xIELU in 256-bit vectors, the rest in
 * plain C. xIELU's negative side is (expm1(x) - u) alpha_n + beta u with x = min(u, eps):
 * where |x| < 1/2 expm1(x) - x is its series to x^8 (relative error < 1e-7), since
 * exp(x) - 1 - x would lose the digits that cancel there; below, exp8(x) - 1 - x. */
INLINE void act_avx2(const float *u, int I, int act, const float *p, float *o) {
    int i = 0;
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f);
    if (act == ACT_GELU)
        for (; i + 8 <= I; i += 8) _mm256_storeu_ps(o + i, gelu8(_mm256_loadu_ps(u + i)));
    if (act == ACT_RELU2)
        for (; i + 8 <= I; i += 8) {
            __m256 r = _mm256_max_ps(_mm256_loadu_ps(u + i), zero);
            _mm256_storeu_ps(o + i, _mm256_mul_ps(r, r));
        }
    if (act == ACT_XIELU) {
        const __m256 ap = _mm256_set1_ps(p[0]), an = _mm256_set1_ps(p[1]);
        const __m256 beta = _mm256_set1_ps(p[2]), eps = _mm256_set1_ps(p[3]);
        const __m256 half = _mm256_set1_ps(0.5f), sign = _mm256_set1_ps(-0.f);
        static const float taylor[7] = {1.f / 40320, 1.f / 5040, 1.f / 720, 1.f / 120,
                                        1.f / 24,    1.f / 6,    1.f / 2};
        for (; i + 8 <= I; i += 8) {
            __m256 g = _mm256_loadu_ps(u + i), bg = _mm256_mul_ps(beta, g);
            __m256 pos = _mm256_fmadd_ps(_mm256_mul_ps(ap, g), g, bg);
            __m256 x = _mm256_min_ps(g, eps);
            __m256 s = _mm256_set1_ps(taylor[0]);
            for (int k = 1; k < 7; k++) s = _mm256_fmadd_ps(s, x, _mm256_set1_ps(taylor[k]));
            __m256 series = _mm256_mul_ps(_mm256_mul_ps(x, x), s);
            __m256 direct = _mm256_sub_ps(_mm256_sub_ps(exp8(x), one), x);
            __m256 small = _mm256_cmp_ps(_mm256_andnot_ps(sign, x), half, _CMP_LT_OQ);
            __m256 em = _mm256_blendv_ps(direct, series, small); /* expm1(x) - x */
            em = _mm256_add_ps(em, _mm256_sub_ps(x, g)); /* - u: x is eps where u > eps */
            __m256 neg = _mm256_fmadd_ps(em, an, bg);
            _mm256_storeu_ps(o + i, _mm256_blendv_ps(neg, pos, _mm256_cmp_ps(g, zero, _CMP_GT_OQ)));
        }
    }
    act_from(u, i, I, act, p, o);
}

#endif
