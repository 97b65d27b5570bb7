/* The dense GEMV's tiles in 256-bit vectors: 8 weights a step, one sum per (row, output)
 * of the tile, a 16-bit weight widened in registers; then the rest in plain C
 * (dense_ref.h). The tile is 2 rows by 4 outputs here: 8 sums, 4 weight and 1 activation
 * registers of the 16. */
#ifndef LLMPRESS_DENSE_AVX2_H
#define LLMPRESS_DENSE_AVX2_H

#include "dense_ref.h"
#if !defined(__AVX2__)
#error "dense_avx2.h needs AVX2"
#endif

#define DENSE_MT_AVX2 2
#define DENSE_NT_AVX2 4

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
INLINE void dense_tile_avx2(int MT, int NT, const float *x, int K, const void *w, int64_t width,
                            int kind, const void *next, float *y, int N) {
    int k = 0;
    int vec = kind != 2, esize = kind ? 2 : 4;
#if defined(__F16C__)
    vec = 1;
#endif
    __m256 a[DENSE_MT_AVX2][DENSE_NT_AVX2];
    for (int m = 0; m < MT; m++)
        for (int n = 0; n < NT; n++) a[m][n] = _mm256_setzero_ps();
    for (; vec && k + 8 <= K; k += 8) {
        __m256 wv[DENSE_NT_AVX2];
        for (int n = 0; n < NT; n++) {
            wv[n] = weights8(weight_row(w, width, n), k, kind);
            _mm_prefetch((const char *)weight_row(next, width, n) + (int64_t)k * esize, _MM_HINT_T1);
        }
        for (int m = 0; m < MT; m++) {
            __m256 xv = _mm256_loadu_ps(x + (int64_t)m * K + k);
            for (int n = 0; n < NT; n++) a[m][n] = _mm256_fmadd_ps(wv[n], xv, a[m][n]);
        }
    }
    float acc[DENSE_MAX][DENSE_MAX] = {{0.f}};
    for (int m = 0; m < MT; m++)
        for (int n = 0; n < NT; n++) acc[m][n] = hsum8(a[m][n]);
    dense_tile_from(MT, NT, x, K, w, width, kind, k, acc);
    for (int m = 0; m < MT; m++)
        for (int n = 0; n < NT; n++) y[(int64_t)m * N + n] = acc[m][n];
}

#endif
