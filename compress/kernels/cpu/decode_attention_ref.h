/* The decode attention's row work in plain C: what a build without AVX2 runs. The `_from`
 * forms start at the index given: they finish what an instruction set's vectors leave. */
#ifndef LLMPRESS_DECODE_ATTENTION_REF_H
#define LLMPRESS_DECODE_ATTENTION_REF_H

#include "decode_attention.h"

/* s[i..n) += add; returns the largest of them and bm. */
INLINE float add_max_from(float *s, int i, int n, float add, float bm) {
    for (; i < n; i++) s[i] += add, bm = fmaxf(bm, s[i]);
    return bm;
}

/* s[i..n) = exp(s - m). */
INLINE void exp_shift_from(float *s, int i, int n, float m) {
    for (; i < n; i++) s[i] = expf(s[i] - m);
}

/* w[i] = p[i] * vs[i] for i..n; their sum of p added to *lsum, of p * vm to *msum. */
INLINE void weigh_codes_from(const float *p, const float *vs, const float *vm, int i, int n,
                             float *w, float *lsum, float *msum) {
    for (; i < n; i++) *lsum += p[i], *msum += p[i] * vm[i], w[i] = p[i] * vs[i];
}

/* scores[t] = scale * q . rows[t] for rows t..n of D floats. */
INLINE void row_scores_from(const float *q, const float *rows, int t, int n, int D, float scale,
                            float *scores) {
    for (; t < n; t++) scores[t] = dot_f32(q, rows + (int64_t)t * D, D) * scale;
}

/* out[d..D) += sum_t w[t] * rows[t]. */
INLINE void weighted_rows_from(const float *w, const float *rows, int n, int d, int D,
                               float *out) {
    for (; d < D; d++)
        for (int t = 0; t < n; t++) out[d] += w[t] * rows[(int64_t)t * D + d];
}

/* The whole rows, as each instruction set's forms take them. */
INLINE float add_max_ref(float *s, int n, float add) { return add_max_from(s, 0, n, add, -INFINITY); }

INLINE void exp_shift_ref(float *s, int n, float m) { exp_shift_from(s, 0, n, m); }

INLINE void weigh_codes_ref(const float *p, const float *vs, const float *vm, int n, float *w,
                            float *lsum, float *msum) {
    *lsum = *msum = 0.f;
    weigh_codes_from(p, vs, vm, 0, n, w, lsum, msum);
}

INLINE void row_scores_ref(const float *q, const float *rows, int n, int D, float scale,
                           float *scores) {
    row_scores_from(q, rows, 0, n, D, scale, scores);
}

INLINE void weighted_rows_ref(const float *w, const float *rows, int n, int D, float *out) {
    weighted_rows_from(w, rows, n, 0, D, out);
}

/* Scores and weighted values straight from a chunk's codes: none in plain C (the caller
 * widens the codes to floats and uses row_scores and weighted_rows). */
INLINE int scores_from_codes_ref(float (*qs)[HEAD_MAX], int rep, const uint8_t *kc, int bits, int n,
                                 int D, float scale, float (*s)[CHUNK_T]) {
    (void)qs, (void)rep, (void)kc, (void)bits, (void)n, (void)D, (void)scale, (void)s;
    return 0;
}

INLINE int values_from_codes_ref(float (*w)[CHUNK_T], int rep, const uint8_t *vc, int bits,
                                 int n, int D, float *out) {
    (void)w, (void)rep, (void)vc, (void)bits, (void)n, (void)D, (void)out;
    return 0;
}

#endif
