/* The prefill attention's row work in plain C: what a build without AVX2 runs. Each score
 * is a dot product in dimension order, each weighted value a sum in key order, as the
 * vector forms compute them lane by lane. The `_from` forms start at the index given:
 * they finish what an instruction set's vectors leave. */
#ifndef LLMPRESS_PREFILL_ATTENTION_REF_H
#define LLMPRESS_PREFILL_ATTENTION_REF_H

#include "prefill_attention.h"

/* s[q][j] = scale * qv[q] . key(j0 + j) for j = j..n-1 and the QG queries of a group. */
INLINE void group_scores_from(const float *const *qv, const float *kt, int D, int j0, int j,
                              int n, float scale, float *s, int lds) {
    for (; j < n; j++)
        for (int q = 0; q < QG; q++) {
            float a = 0.f;
            for (int d = 0; d < D; d++) a = fmaf(qv[q][d], KT_AT(kt, D, j0 + j, d), a);
            s[(int64_t)q * lds + j] = a * scale;
        }
}

/* The largest of sq[i..b) and m. */
INLINE float scores_max_from(const float *sq, int i, int b, float m) {
    for (; i < b; i++) m = sq[i] > m ? sq[i] : m;
    return m;
}

/* sq[i..b) = exp(sq - m); returns l plus their sum. */
INLINE float exp_sum_from(float *sq, int i, int b, float m, float l) {
    for (; i < b; i++) sq[i] = expf(sq[i] - m), l += sq[i];
    return l;
}

/* sq[i..b) *= r. */
INLINE void scale_scores_from(float *sq, int i, int b, float r) {
    for (; i < b; i++) sq[i] *= r;
}

/* out[q][d..D) = the sum over keys ib..ie-1 in order of weight * value, added to what out
 * holds when ib > 0. */
INLINE void group_values_from(const float *s, int lds, const float *v, int64_t ldv, int j0,
                              int ib, int ie, int d, int D, float *const *out) {
    for (; d < D; d++)
        for (int q = 0; q < QG; q++) {
            float a = ib ? out[q][d] : 0.f;
            for (int i = ib; i < ie; i++)
                a = fmaf(s[(int64_t)q * lds + i], v[(int64_t)(j0 + i) * ldv + d], a);
            out[q][d] = a;
        }
}

/* The whole rows, as each instruction set's forms take them. */
INLINE void group_scores_ref(const float *const *qv, const float *kt, int D, int j0, int n,
                             float scale, float *s, int lds) {
    group_scores_from(qv, kt, D, j0, 0, n, scale, s, lds);
}

INLINE float scores_max_ref(const float *sq, int i, int b) {
    return scores_max_from(sq, i, b, -INFINITY);
}

INLINE float exp_sum_ref(float *sq, int i, int b, float m) { return exp_sum_from(sq, i, b, m, 0.f); }

INLINE void scale_scores_ref(float *sq, int i, int b, float r) { scale_scores_from(sq, i, b, r); }

INLINE void group_values_ref(const float *s, int lds, const float *v, int64_t ldv, int j0,
                             int ib, int ie, int D, float *const *out) {
    group_values_from(s, lds, v, ldv, j0, ib, ie, 0, D, out);
}

#endif
