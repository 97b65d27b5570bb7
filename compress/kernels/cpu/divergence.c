/* eval's per-token figures of a candidate's logits against the original's log-probs, a
 * row (token) at a time while it is in cache: what torch's log_softmax, KL sum and argmax
 * took three passes over whole windows and two [rows, vocab] temporaries for. */
/* Each log-prob as one float subtraction, c - lse, wherever it is formed (in place, or
 * inside a KL term), so that a model against itself measures exactly 0: reassociating
 * p - (c - lse) into (p - c) + lse would not. */
#pragma GCC optimize("no-associative-math")
#include "divergence_ref.h"
#include "tokens_ref.h"
#if defined(__AVX2__)
#include "divergence_avx2.h"
#include "tokens_avx2.h"
#define exp_sum exp_sum_avx2
#define kl_sum kl_sum_avx2
#define row_max row_max_avx2
#define first_index first_index_avx2
#else
#define exp_sum exp_sum_ref
#define kl_sum kl_sum_ref
#define row_max row_max_ref
#define first_index first_index_ref
#endif

/* The row's log-sum-exp (NaN for a row with a NaN or no finite maximum); *top, unless
 * NULL: the first index of its maximum, or of its first NaN. */
static double row_lse(const float *c, int64_t vocab, int64_t *top) {
    int nan;
    float m = row_max(c, vocab, &nan);
    if (top) *top = first_index(c, vocab, m, nan);
    if (nan || m == INFINITY || m == -INFINITY) return NAN;
    return (double)m + log(exp_sum(c, vocab, m));
}

/* Each row of x [rows, vocab] less its log-sum-exp, in place: the log-probs eval compares,
 * the original's and a candidate's normalized by the same arithmetic (torch's own
 * log_softmax was up to 1.7e-5 off the float64 log-sum-exp on the default model's
 * logits, and a model against itself then measured a KL of 8e-6). */
void llmp_log_softmax_rows(float *x, int64_t rows, int64_t vocab) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        float *c = x + r * vocab;
        float lse = (float)row_lse(c, vocab, NULL);
        for (int64_t i = 0; i < vocab; i++) c[i] -= lse;
    }
}

/* Per row r of ref (the original's log-probs p) and cand (the candidate's logits c), both
 * [rows, vocab]:
 *   lse[r] = log sum_v exp(c_v)                       the candidate's log-partition
 *   kl[r]  = sum_v exp(p_v) (p_v - (c_v - lse[r]))     KL(original || candidate), nats,
 *            with c_v - lse[r] in float as llmp_log_softmax_rows computes it
 *   top[r] = the first index of c's maximum (or of its first NaN), as torch.argmax
 * Three passes over a row (its maximum; lse; the KL terms, summed in float64 by blocks),
 * the row in cache after the first: each KL term is the difference of two log-probs, as
 * log_softmax then the sum computed it, so two close models' small KL is not the
 * difference of two large sums. Tokens whose original log-prob is -87 or less (weight
 * below 1e-38, -inf included) add nothing, where exp(-inf) * (-inf - c) would be NaN. A
 * row of c with a NaN, or no finite maximum, has NaN figures. */
void llmp_divergence_rows(const float *ref, const float *cand, int64_t rows, int64_t vocab,
                          double *kl, double *lse, int64_t *top) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *p = ref + r * vocab, *c = cand + r * vocab;
        lse[r] = row_lse(c, vocab, top + r);
        kl[r] = lse[r] == lse[r] ? kl_sum(p, c, vocab, (float)lse[r]) : NAN;
    }
}
