/* The dense GEMV's tiles in 512-bit vectors: 16 weights a step, one sum per (row, output)
 * of a 4 x 4 tile (16 sums, 4 weight and 1 activation registers of the 32), a 16-bit weight
 * widened in registers; then the rest in plain C (dense_ref.h). */
#ifndef LLMPRESS_DENSE_AVX512_H
#define LLMPRESS_DENSE_AVX512_H

#include "dense_ref.h"
#if !defined(__AVX512F__)
#error "dense_avx512.h needs AVX-512"
#endif

#define DENSE_MT_AVX512 4
#define DENSE_NT_AVX512 4

/* 16 weights of row wr from k as fp32. */
INLINE __m512 weights16(const void *wr, int64_t k, int kind) {
    if (kind == 0) return _mm512_loadu_ps((const float *)wr + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)wr + k));
    if (kind == 2) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE void dense_tile_avx512(int MT, int NT, const float *x, int K, const void *w,
                              int64_t width, int kind, const void *next, float *y, int N) {
    int esize = kind ? 2 : 4;
    int k = 0;
    __m512 a[DENSE_MT_AVX512][DENSE_NT_AVX512];
    for (int m = 0; m < MT; m++)
        for (int n = 0; n < NT; n++) a[m][n] = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) {
        __m512 wv[DENSE_NT_AVX512];
        for (int n = 0; n < NT; n++) {
            wv[n] = weights16(weight_row(w, width, n), k, kind);
            _mm_prefetch((const char *)weight_row(next, width, n) + (int64_t)k * esize, _MM_HINT_T1);
        }
        for (int m = 0; m < MT; m++) {
            __m512 xv = _mm512_loadu_ps(x + (int64_t)m * K + k);
            for (int n = 0; n < NT; n++) a[m][n] = _mm512_fmadd_ps(wv[n], xv, a[m][n]);
        }
    }
    float acc[DENSE_MAX][DENSE_MAX];
    for (int m = 0; m < MT; m++)
        for (int n = 0; n < NT; n++) acc[m][n] = _mm512_reduce_add_ps(a[m][n]);
    dense_tile_from(MT, NT, x, K, w, width, kind, k, acc);
    for (int m = 0; m < MT; m++)
        for (int n = 0; n < NT; n++) y[(int64_t)m * N + n] = acc[m][n];
}

#endif
