/* eval's divergence sums in plain C: what a build without AVX2 runs, and where the vector
 * forms (divergence_avx2.h) leave off (the `_from` forms start at the index given). */
#ifndef LLMPRESS_DIVERGENCE_REF_H
#define LLMPRESS_DIVERGENCE_REF_H

#include "internal.h"

/* s + sum from index i of exp(c - m). */
INLINE double exp_sum_from(const float *c, int64_t i, int64_t n, float m, double s) {
    for (; i < n; i++) s += expf(c[i] - m);
    return s;
}

/* s + sum from index i of exp(p) (p - (c - lse)), over the tokens with p > -87. */
INLINE double kl_sum_from(const float *p, const float *c, int64_t i, int64_t n, float lse,
                          double s) {
    for (; i < n; i++)
        if (p[i] > -87.f) s += (double)(expf(p[i]) * (p[i] - (c[i] - lse)));
    return s;
}

INLINE double exp_sum_ref(const float *c, int64_t n, float m) {
    return exp_sum_from(c, 0, n, m, 0.0);
}

INLINE double kl_sum_ref(const float *p, const float *c, int64_t n, float lse) {
    return kl_sum_from(p, c, 0, n, lse, 0.0);
}

#endif
