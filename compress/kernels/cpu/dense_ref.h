/* The dense GEMV's dot products in plain C: what a build without AVX2 runs, and where the
 * vector form leaves off (dense_avx2.h). */
#ifndef LLMPRESS_DENSE_REF_H
#define LLMPRESS_DENSE_REF_H

#include "internal.h"

#define DENSE_MT 8 /* rows the dense GEMV reads its weights once for */

/* Weight k of row wr as fp32 (kind 0: fp32, 1: bf16, 2: fp16). */
static inline float weight_at(const void *wr, int64_t k, int kind) {
    return kind ? widen16(((const uint16_t *)wr)[k], kind) : ((const float *)wr)[k];
}

/* out[m] += the products of weights k..K of row wr with activation row m, m < MT. */
INLINE void dense_dots_from(int MT, const float *x, int K, const void *wr, int kind, int k,
                            float *out) {
    for (; k < K; k++) {
        float wk = weight_at(wr, k, kind);
        for (int m = 0; m < MT; m++) out[m] += wk * x[(int64_t)m * K + k];
    }
}

/* out[m] = row wr . activation row m, m < MT. */
INLINE void dense_dots_ref(int MT, const float *x, int K, const void *wr, int kind, float *out) {
    for (int m = 0; m < MT; m++) out[m] = 0.f;
    dense_dots_from(MT, x, K, wr, kind, 0, out);
}

#endif
