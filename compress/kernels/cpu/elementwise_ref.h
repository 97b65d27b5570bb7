/* The activation times up in plain C: what a build without AVX2 runs, and what the vector
 * form (elementwise_avx2.h) leaves. */
#ifndef LLMPRESS_ELEMENTWISE_REF_H
#define LLMPRESS_ELEMENTWISE_REF_H

#include "internal.h"

static inline float gelu_tanh(float g) {
    return 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
}

/* 0.5 g (1 + erf(g / sqrt 2)) as 0.5 g erfc(-g / sqrt 2): no 1 + erf to cancel where g is
 * negative. */
static inline float gelu_erf(float g) { return 0.5f * g * erfcf(-g * 0.70710678118f); }

/* act(g); p: ACT_XIELU's parameters (llmpress.h), else unread. */
static inline float act_value(float g, int act, const float *p) {
    if (act == ACT_SILU) return g / (1.f + expf(-g));
    if (act == ACT_GELU_TANH) return gelu_tanh(g);
    if (act == ACT_GELU) return gelu_erf(g);
    if (act == ACT_XIELU)
        return g > 0.f ? p[0] * g * g + p[2] * g
                       : (expm1f(g < p[3] ? g : p[3]) - g) * p[1] + p[2] * g;
    float r = g > 0.f ? g : 0.f; /* ACT_RELU2 */
    return r * r;
}

/* o[i] = act(g[i]) * u[i] for i..I. */
INLINE void act_mul_from(const float *g, const float *u, int i, int I, int act, float *o) {
    for (; i < I; i++) o[i] = act_value(g[i], act, NULL) * u[i];
}

INLINE void act_mul_ref(const float *g, const float *u, int I, int act, float *o) {
    act_mul_from(g, u, 0, I, act, o);
}

/* o[i] = act(u[i]) for i..I (an MLP without a gate); p: ACT_XIELU's parameters. */
INLINE void act_from(const float *u, int i, int I, int act, const float *p, float *o) {
    for (; i < I; i++) o[i] = act_value(u[i], act, p);
}

INLINE void act_ref(const float *u, int I, int act, const float *p, float *o) {
    act_from(u, 0, I, act, p, o);
}

#endif
