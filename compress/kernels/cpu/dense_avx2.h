/* The dense GEMV's dot products in 256-bit vectors: 16 weights a step, two sums a row,
 * a 16-bit weight widened in registers; then the rest in plain C (dense_ref.h). */
#ifndef LLMPRESS_DENSE_AVX2_H
#define LLMPRESS_DENSE_AVX2_H

#include "dense_ref.h"
#if !defined(__AVX2__)
#error "dense_avx2.h needs AVX2"
#endif

INLINE __m256 load16(const uint16_t *p, int kind) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
#if defined(__F16C__)
    if (kind == 2) return _mm256_cvtph_ps(h);
#endif
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 weights of row wr from k as fp32. */
INLINE __m256 weights8(const void *wr, int64_t k, int kind) {
    return kind ? load16((const uint16_t *)wr + k, kind) : _mm256_loadu_ps((const float *)wr + k);
}

/* fp16 weights need F16C to widen in registers; without it they take the plain-C loop. */
INLINE void dense_dots_avx2(int MT, const float *x, int K, const void *wr, int kind, float *out) {
    int k = 0;
    int vec = kind != 2;
#if defined(__F16C__)
    vec = 1;
#endif
    __m256 a0[DENSE_MT], a1[DENSE_MT];
    for (int m = 0; m < MT; m++) a0[m] = a1[m] = _mm256_setzero_ps();
    for (; vec && k + 16 <= K; k += 16) {
        __m256 w0 = weights8(wr, k, kind), w1 = weights8(wr, k + 8, kind);
        for (int m = 0; m < MT; m++) {
            a0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (int64_t)m * K + k), a0[m]);
            a1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (int64_t)m * K + k + 8), a1[m]);
        }
    }
    for (int m = 0; m < MT; m++) out[m] = hsum8(_mm256_add_ps(a0[m], a1[m]));
    dense_dots_from(MT, x, K, wr, kind, k, out);
}

#endif
