/* A layer's elementwise steps (norms, activation, rotary embedding, residual adds): one
 * call each instead of several torch ops, whose per-op overhead dominates a
 * 135M-parameter model's decode step. */
#include "elementwise_ref.h"
#if defined(__AVX2__)
#include "elementwise_avx2.h"
#define act_mul act_mul_avx2
#define act_only act_avx2
#else
#define act_mul act_mul_ref
#define act_only act_ref
#endif

/* o = x * rsqrt(mean(x^2) + eps) * w over K values; with `center`, x less its mean
 * (LayerNorm without a bias, cohere's: the variance is the centered mean square).
 * o may be x. The uncentered loops are the RMSNorm's as they were before LayerNorms
 * joined: written apart, so the compiler keeps their vectorization (and the last bits of
 * every llama-family model's norms). */
static void norm_row(const float *x, float *o, int K, const float *w, float eps, int center) {
    if (!center) {
        double ss = 0.0;
        for (int k = 0; k < K; k++) ss += (double)x[k] * x[k];
        float r = 1.f / sqrtf((float)(ss / K) + eps);
        for (int k = 0; k < K; k++) o[k] = x[k] * r * w[k];
        return;
    }
    double s = 0.0;
    for (int k = 0; k < K; k++) s += x[k];
    float mean = (float)(s / K);
    double ss = 0.0;
    for (int k = 0; k < K; k++) ss += (double)(x[k] - mean) * (x[k] - mean);
    float r = 1.f / sqrtf((float)(ss / K) + eps);
    for (int k = 0; k < K; k++) o[k] = (x[k] - mean) * r * w[k];
}

/* out[m] = the norm of x[m] (norm_row), written to `out` [M, Kp] (zero padded to Kp) and
 * quantized into x8/dx/bsum. */
void llmp_rmsnorm_quant(const float *x, const float *w, float eps, int center, int M, int K,
                        int Kp, float *out, int8_t *x8, float *dx, float *bsum) {
    #pragma omp parallel for schedule(static) if (M > 4)
    for (int m = 0; m < M; m++) {
        float *o = out + (int64_t)m * Kp;
        norm_row(x + (int64_t)m * K, o, K, w, eps, center);
        for (int k = K; k < Kp; k++) o[k] = 0.f;
        quantize_row(o, Kp, x8 + (int64_t)m * Kp, dx + (int64_t)m * (Kp / 32), bsum + (int64_t)m * (Kp / 32));
    }
}

/* gu [M, 2I] = [gate | up] -> out [M, Ip] = act(gate) * up (zero padded), quantized.
 * act: ACT_SILU, or ACT_GELU_TANH (0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))). */
void llmp_act_mul_quant(const float *gu, int M, int I, int Ip, int act, float *out, int8_t *x8,
                        float *dx, float *bsum) {
    #pragma omp parallel for schedule(static) if (M > 2)
    for (int m = 0; m < M; m++) {
        const float *g = gu + (int64_t)m * 2 * I, *u = g + I;
        float *o = out + (int64_t)m * Ip;
        act_mul(g, u, I, act, o);
        for (int i = I; i < Ip; i++) o[i] = 0.f;
        quantize_row(o, Ip, x8 + (int64_t)m * Ip, dx + (int64_t)m * (Ip / 32), bsum + (int64_t)m * (Ip / 32));
    }
}


/* u [M, I] (the up projection of an MLP without a gate) -> out [M, Ip] = act(u), zero
 * padded, quantized; p: ACT_XIELU's parameters (NULL for the others). */
void llmp_act_quant(const float *u, int M, int I, int Ip, int act, const float *p, float *out,
                    int8_t *x8, float *dx, float *bsum) {
    #pragma omp parallel for schedule(static) if (M > 2)
    for (int m = 0; m < M; m++) {
        const float *x = u + (int64_t)m * I;
        float *o = out + (int64_t)m * Ip;
        act_only(x, I, act, p, o);
        for (int i = I; i < Ip; i++) o[i] = 0.f;
        quantize_row(o, Ip, x8 + (int64_t)m * Ip, dx + (int64_t)m * (Ip / 32), bsum + (int64_t)m * (Ip / 32));
    }
}

/* Rotary embedding in place, rotate-half convention over the first R of each head's D
 * values (partial rotary when R < D): x [T, heads, D] at positions [T]; cos/sin tables
 * [max_len, R/2]. */
void llmp_rope(float *x, const int64_t *positions, const float *cos_t, const float *sin_t,
               int T, int heads, int D, int R) {
    int half = R / 2;
    #pragma omp parallel for schedule(static) if (T >= PAR_ROWS)
    for (int t = 0; t < T; t++) {
        const float *c = cos_t + positions[t] * half, *s = sin_t + positions[t] * half;
        for (int h = 0; h < heads; h++) {
            float *v = x + ((int64_t)t * heads + h) * D;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/* x [rows, D] <- the norm of each row (norm_row; `center`: a LayerNorm), in place; row r
 * takes weight row r % wrows of w [wrows, D] (wrows 1: one weight; a head count: each head
 * its own, cohere's q/k norms); over the threads when `par` (a prefill step's: q/k norms
 * have a row per head, so a decode step's count is no guide). */
void rms_rows(float *x, int64_t rows, int D, const float *w, int wrows, float eps, int center,
              int par) {
    #pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * D, x + r * D, D, w + (r % wrows) * D, eps, center);
}

void llmp_rms_rows(float *x, int64_t rows, int D, const float *w, int wrows, float eps,
                   int center) {
    rms_rows(x, rows, D, w, wrows, eps, center, 0);
}

/* att [rows, width] times sigmoid(gate), gate row r at gate + r * ld: attention's output
 * gate (afmoe). One expf per value, so any split of the rows rounds alike. */
void gate_rows(float *att, int64_t rows, int width, const float *gate, int64_t ld, int par) {
    #pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; r++) {
        float *a = att + r * width;
        const float *g = gate + r * ld;
        for (int i = 0; i < width; i++) a[i] *= 1.f / (1.f + expf(-g[i]));
    }
}

void llmp_gate_rows(float *att, int64_t rows, int width, const float *gate, int64_t ld) {
    gate_rows(att, rows, width, gate, ld, 0);
}


void quantize_rows_padded(const float *x, int M, int K, int ld, int Kp, float *pad,
                          int8_t *x8, float *dx, float *bs) {
    #pragma omp parallel for schedule(static) if (M >= PAR_ROWS)
    for (int m = 0; m < M; m++) {
        float *o = pad + (int64_t)m * Kp;
        memcpy(o, x + (int64_t)m * ld, K * sizeof(float));
        for (int k = K; k < Kp; k++) o[k] = 0.f;
        quantize_row(o, Kp, x8 + (int64_t)m * Kp, dx + (int64_t)m * (Kp / 32), bs + (int64_t)m * (Kp / 32));
    }
}

/* h += x * s over n floats (the residual; s: granite's residual multiplier, else 1), over
 * the threads when `par`. x is scaled in a pass of its own, rounded as torch's h + x * s
 * rounds it (one loop could contract the two into a fused multiply-add). */
void add_rows(float *h, float *x, int64_t n, float s, int par) {
    if (s != 1.f) {
        #pragma omp parallel for schedule(static) if (par)
        for (int64_t i = 0; i < n; i++) x[i] *= s;
    }
    #pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < n; i++) h[i] += x[i];
}
