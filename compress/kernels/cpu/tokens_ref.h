/* A step's token choices' row scans in plain C: what a build without AVX2 runs, and where
 * the vector forms (tokens_avx2.h) leave off (the `_from` forms start at the index given). */
#ifndef LLMPRESS_TOKENS_REF_H
#define LLMPRESS_TOKENS_REF_H

#include "internal.h"

#define DRAW_BLOCK 64

/* The largest of m and x[i..n); *nan |= whether any is NaN. */
INLINE float row_max_from(const float *x, int64_t i, int64_t n, float m, int *nan) {
    for (; i < n; i++) {
        *nan |= x[i] != x[i];
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* The first index from i of a NaN (nan) or of m; 0 if none. */
INLINE int64_t first_index_from(const float *x, int64_t i, int64_t n, float m, int nan) {
    for (; i < n; i++)
        if (nan ? x[i] != x[i] : x[i] == m) return i;
    return 0;
}

/* The largest of x[0..n) (-inf for none), and whether any is NaN (then the maximum is
 * not to be used). */
INLINE float row_max_ref(const float *x, int64_t n, int *nan) {
    *nan = 0;
    return row_max_from(x, 0, n, -INFINITY, nan);
}

/* The first index of m in x [n], or of the first NaN when `nan`. */
INLINE int64_t first_index_ref(const float *x, int64_t n, float m, int nan) {
    return first_index_from(x, 0, n, m, nan);
}

/* w[i] = exp((t[i] - m) * it) for a block of DRAW_BLOCK (0 below e^-87); their float64 sum. */
INLINE double block_weights_ref(const float *t, float m, float it, float *w) {
    double sum = 0.0;
    for (int i = 0; i < DRAW_BLOCK; i++) {
        float a = (t[i] - m) * it;
        w[i] = a > -87.f ? expf(a) : 0.f;
        sum += w[i];
    }
    return sum;
}

#endif
