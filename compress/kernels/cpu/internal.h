/* What the kernels' files share and Python does not see: SIMD helpers, the thread count,
 * and the functions one file calls in another (hidden from the library's exports). The
 * interface itself is llmpress.h. */
#ifndef LLMPRESS_INTERNAL_H
#define LLMPRESS_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "llmpress.h"

#define INLINE static inline __attribute__((always_inline))
#define HIDDEN __attribute__((visibility("hidden")))

#define TW 8 /* output columns of a panel tile (llmpress.h's weight layout) */

INLINE float silu(float x) { return x / (1.0f + expf(-x)); }
INLINE float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch's */

/* One step of a channel of a causal depthwise convolution (the recurrent layers': DeltaNet,
 * Mamba, short convolution): bias + w · [past, now], then `now` joins the last kernel - 1
 * inputs `past`, shifted in place. */
INLINE float conv_step(const float *w, float *past, int kernel, float now, float bias) {
    float y = bias + w[kernel - 1] * now;
    for (int j = 0; j < kernel - 1; j++) y += w[j] * past[j];
    for (int j = 0; j + 1 < kernel - 1; j++) past[j] = past[j + 1];
    if (kernel > 1) past[kernel - 2] = now;
    return y;
}

/* Rows of a step's elementwise work from which it is spread over the threads: a prefill
 * step's hundreds of rows, not a decode step's few (a fork costs more than they do). Each
 * row is computed the same either way. */
#define PAR_ROWS 64

#ifdef _OPENMP
static inline int omp_threads(void) { return omp_get_max_threads(); }
static inline int omp_thread(void) { return omp_get_thread_num(); }
#else
static inline int omp_threads(void) { return 1; }
static inline int omp_thread(void) { return 0; }
#endif

#if defined(__AVX2__)
static inline __attribute__((always_inline)) float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif

#if defined(__AVX2__)
static inline __attribute__((always_inline)) float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) in lanes of V (intrinsics prefix P): 2^n * p(r) with r = x - n ln2 in
 * [-ln2/2, ln2/2] and p the degree-5 minimax polynomial of Cephes' expf (relative error
 * ~2e-7). NaN stays NaN. One definition for every width, so each lane's bits are the
 * same whatever the width that computes it. */
#define DEFINE_EXP(NAME, V, VI, P, ROUND, CAST)                                              \
    static inline __attribute__((always_inline)) V NAME(V x) {                               \
        x = P##_max_ps(P##_set1_ps(-87.3f), P##_min_ps(P##_set1_ps(88.3f), x));              \
        V n = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504089f)),                               \
                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                           \
        V r = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                 \
        r = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), r);                                \
        V p = P##_set1_ps(1.9875691500e-4f);                                                  \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.3981999507e-3f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(8.3334519073e-3f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(4.1665795894e-2f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.6666665459e-1f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(5.0000001201e-1f));                                \
        p = P##_fmadd_ps(p, P##_mul_ps(r, r), P##_add_ps(r, P##_set1_ps(1.f)));               \
        VI e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23);    \
        return P##_mul_ps(p, CAST(e));                                                        \
    }
DEFINE_EXP(exp8, __m256, __m256i, _mm256, _mm256_round_ps, _mm256_castsi256_ps)
#if defined(__AVX512F__)
DEFINE_EXP(exp16, __m512, __m512i, _mm512, _mm512_roundscale_ps, _mm512_castsi512_ps)
#endif
#endif

/* Attention logit softcapping (gemma2): s[0..n) = cap * tanh(s / cap), tanh(y) as
 * 1 - 2 / (exp(2y) + 1) with exp8 in vectors (tanhf in plain C). Every score, the last
 * vector's too (through a padded copy), takes the same lane code, so a score's bits do not
 * depend on where it sits in the run. */
#if defined(__AVX2__)
INLINE __m256 softcap8(__m256 x, __m256 cap) {
    const __m256 one = _mm256_set1_ps(1.f), two = _mm256_set1_ps(2.f);
    __m256 e = exp8(_mm256_mul_ps(two, _mm256_div_ps(x, cap)));
    return _mm256_mul_ps(cap, _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one))));
}

static inline void cap_scores(float *s, int n, float cap) {
    __m256 c = _mm256_set1_ps(cap);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, softcap8(_mm256_loadu_ps(s + i), c));
    if (i < n) {
        float last[8] = {0};
        memcpy(last, s + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(last, softcap8(_mm256_loadu_ps(last), c));
        memcpy(s + i, last, (size_t)(n - i) * sizeof(float));
    }
}
#else
static inline void cap_scores(float *s, int n, float cap) {
    for (int i = 0; i < n; i++) s[i] = cap * tanhf(s[i] / cap);
}
#endif

/* A 16-bit weight (kind 1: bf16, 2: fp16) as fp32. */
static inline float widen16(uint16_t v, int kind) {
    if (kind == 1) {
        uint32_t u = (uint32_t)v << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t sign = (uint32_t)(v & 0x8000) << 16, exp = (v >> 10) & 0x1F, man = v & 0x3FF, u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* a . b over d..D added to s, in plain C: the reference, and what the vectors leave. */
static inline float dot_f32_from(const float *a, const float *b, int d, int D, float s) {
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

#if defined(__AVX2__)
static inline float dot_f32(const float *a, const float *b, int D) {
    int d = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    return dot_f32_from(a, b, d, D, hsum8(acc));
}
#else
static inline float dot_f32(const float *a, const float *b, int D) { return dot_f32_from(a, b, 0, D, 0.f); }
#endif

/* quantize.c: one row as int8 blocks of 32 (codes round(x * 127 / absmax), the block's
 * scale and the scale times the codes' sum). */
HIDDEN void quantize_row(const float *xr, int K, int8_t *qr, float *dr, float *bs);

/* elementwise.c */
HIDDEN void rms_rows(float *x, int64_t rows, int D, const float *w, int wrows, float eps, int center, int par);
HIDDEN void quantize_rows_padded(const float *x, int M, int K, int ld, int Kp, float *pad,
                                 int8_t *x8, float *dx, float *bs);
HIDDEN void add_rows(float *h, float *x, int64_t n, float s, int par);
HIDDEN void gate_rows(float *att, int64_t rows, int width, const float *gate, int64_t ld, int par);

/* linear.c: y [M, n] = x @ W.T; x both quantized (x8/dx/bs) and in fp32 (xf, row stride
 * ld) for the outlier columns. */
HIDDEN int qlin(const QLin *l, int8_t *x8, float *dx, float *bs, int M, float *y,
                const float *xf, int ld);

/* gemm.c: one GEMM of a grouped pass, y [M, l->n] = x @ W.T, and the pass. */
typedef struct {
    const QLin *l;
    const int8_t *x8;
    const float *dx, *bs, *xf; /* xf: the fp32 rows (stride l->k), for outlier columns */
    int M;
    float *y;
} GemmJob;
HIDDEN int gemm_jobs(const GemmJob *jobs, int n);

/* kv_cache.c: store one token's k/v of (layer, slot, head) at pos (a quantized cache
 * quantizes a group as it completes); read positions 0..n-1 of a quantized cache back. */
HIDDEN void kv_write(const KVC *c, int layer, int64_t slot, int64_t pos, int head,
                     const float *k, const float *v);
HIDDEN void kv_dequant(const KVC *c, int layer, int64_t slot, int head, int64_t n, float *k,
                       float *v);

/* moe.c */
HIDDEN int64_t moe_workspace(int B, int hidden, int E, int K, int I);
HIDDEN int moe_mlp(const QMoe *M, int B, int hidden, int act, const float *xf,
                   const int8_t *x8, const float *dx, const float *bs, float *out, float *w);

#endif
