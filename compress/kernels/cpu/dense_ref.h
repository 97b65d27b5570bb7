/* The dense GEMV's tiles in plain C: what a build without AVX2 runs, and where the vector
 * forms leave off (dense_avx2.h, dense_avx512.h). */
#ifndef LLMPRESS_DENSE_REF_H
#define LLMPRESS_DENSE_REF_H

#include "internal.h"

/* A tile is MT activation rows by NT weight rows (outputs): its rows share each read of a
 * weight row, its outputs each read of an activation row. Each instruction set has its
 * own sizes, at most DENSE_MAX each. */
#define DENSE_MAX 8
#define DENSE_MT_REF 4
#define DENSE_NT_REF 4

/* Weight k of row wr as fp32 (kind 0: fp32, 1: bf16, 2: fp16). */
static inline float weight_at(const void *wr, int64_t k, int kind) {
    return kind ? widen16(((const uint16_t *)wr)[k], kind) : ((const float *)wr)[k];
}

/* Weight row n of a dense weight whose rows are `width` bytes apart. */
INLINE const void *weight_row(const void *w, int64_t width, int n) {
    return (const char *)w + n * width;
}

/* acc[m][n] += the products of weights k..K of row n with activation row m. */
INLINE void dense_tile_from(int MT, int NT, const float *x, int K, const void *w,
                            int64_t width, int kind, int k, float acc[DENSE_MAX][DENSE_MAX]) {
    for (; k < K; k++) {
        for (int n = 0; n < NT; n++) {
            float wk = weight_at(weight_row(w, width, n), k, kind);
            for (int m = 0; m < MT; m++) acc[m][n] += wk * x[(int64_t)m * K + k];
        }
    }
}

/* y[m * N + n] = weight row n . activation row m, for an MT x NT tile. */
INLINE void dense_tile_ref(int MT, int NT, const float *x, int K, const void *w, int64_t width,
                           int kind, const void *next, float *y, int N) {
    (void)next; /* the vector tiles prefetch the next tiles' weights; plain C leaves it */
    float acc[DENSE_MAX][DENSE_MAX] = {{0.f}};
    dense_tile_from(MT, NT, x, K, w, width, kind, 0, acc);
    for (int m = 0; m < MT; m++)
        for (int n = 0; n < NT; n++) y[(int64_t)m * N + n] = acc[m][n];
}

#endif
