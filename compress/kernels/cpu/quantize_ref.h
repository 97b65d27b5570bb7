/* One block of 32 activations as int8 in plain C: what a build without AVX2 runs, and the
 * reference the vector form (quantize_avx2.h) computes to the bit. */
#ifndef LLMPRESS_QUANTIZE_REF_H
#define LLMPRESS_QUANTIZE_REF_H

#include "internal.h"

/* codes round(x * 127 / absmax) into q; the block's scale into *dr and the scale times the
 * codes' sum into *bs. */
INLINE void quantize_block_ref(const float *xb, int8_t *q, float *dr, float *bs) {
    float amax = 0.f;
    for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(xb[k]));
    float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int k = 0; k < 32; k++) {
        int v = (int)lrintf(xb[k] * inv);
        q[k] = (int8_t)v;
        sum += v;
    }
    *dr = d;
    *bs = d * (float)sum;
}

#endif
