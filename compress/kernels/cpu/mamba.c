/* A Mamba-2 layer's mixing over T tokens of one sequence (runtime/mamba.py), from in_proj's
 * rows [z, x·B·C, dt] to what out_proj reads: the causal depthwise convolution of x, B and C
 * over the slot's tail (its bias) and SiLU; dt = softplus(dt + dt_bias); per head the state
 * [P, N] decayed by exp(dt·A) and written dt·x ⊗ B of its group, read with C, plus D·x;
 * then y·SiLU(z) RMS-normed over each group's heads, times the norm's weight. Every row is
 * computed alike whatever rows beside it, so a prompt prefilled whole, in chunks or token
 * by token gives the same bits. Three phases, each spread over the threads: channels (the
 * convolution carries each channel's tail), heads (the state carries each head's [P, N]),
 * tokens (the gated norm). */
#include "internal.h"

int llmp_mamba2(const float *proj, int64_t ld, const float *conv, const float *conv_bias,
                int kernel, float *tail, float *state, const float *decay, const float *dt_bias,
                const float *d, const float *norm, float eps, int T, int H, int P, int N, int G,
                float *out) {
    const int width = H * P, bc = G * N, channels = width + 2 * bc, per = H / G, gw = width / G;
    float *rows = malloc(sizeof(float) * ((size_t)T * channels + (size_t)T * H));
    if (rows == NULL) return -1;
    float *dt = rows + (int64_t)T * channels;
    #pragma omp parallel for schedule(static) if ((int64_t)T * channels > 65536)
    for (int c = 0; c < channels; c++) { /* the convolution, each channel over its tail */
        const float *w = conv + (int64_t)c * kernel;
        float *past = tail + (int64_t)c * (kernel - 1);
        for (int t = 0; t < T; t++) {
            const float y = conv_step(w, past, kernel, proj[t * ld + width + c], conv_bias[c]);
            rows[(int64_t)t * channels + c] = silu(y);
        }
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            dt[(int64_t)t * H + h] = softplus(proj[t * ld + width + channels + h] + dt_bias[h]);
    #pragma omp parallel for schedule(static) if ((int64_t)T * H * P * N > 65536)
    for (int h = 0; h < H; h++) {
        float *s = state + (int64_t)h * P * N;
        const int g = h / per;
        for (int t = 0; t < T; t++) {
            const float *r = rows + (int64_t)t * channels;
            const float *x = r + (int64_t)h * P, *B = r + width + (int64_t)g * N;
            const float *C = r + width + bc + (int64_t)g * N;
            const float step = dt[(int64_t)t * H + h], a = expf(step * decay[h]);
            float *o = out + (int64_t)t * width + (int64_t)h * P;
            for (int p = 0; p < P; p++) {
                float *row = s + (int64_t)p * N, acc = 0.0f;
                const float xp = step * x[p];
                for (int n = 0; n < N; n++) {
                    row[n] = row[n] * a + xp * B[n];
                    acc += row[n] * C[n];
                }
                o[p] = acc + d[h] * x[p];
            }
        }
    }
    #pragma omp parallel for schedule(static) if ((int64_t)T * width > 65536)
    for (int t = 0; t < T; t++) { /* y times SiLU(z), normed over each group */
        for (int g = 0; g < G; g++) {
            float *o = out + (int64_t)t * width + (int64_t)g * gw, sq = 0.0f;
            const float *z = proj + t * ld + (int64_t)g * gw;
            for (int j = 0; j < gw; j++) {
                o[j] *= silu(z[j]);
                sq += o[j] * o[j];
            }
            const float inv = 1.0f / sqrtf(sq / (float)gw + eps);
            for (int j = 0; j < gw; j++) o[j] = o[j] * inv * norm[(int64_t)g * gw + j];
        }
    }
    free(rows);
    return 0;
}

/* A Mamba (selective scan) layer's mixing over T tokens of one sequence, Jamba's
 * (runtime/mamba.py's Mamba1): from in_proj's rows [x, z] to what out_proj reads. The
 * convolution of x over the slot's tail (its bias) and SiLU; per token x_proj's dt [R], B
 * and C [N], each RMS-normed by its weight, and dt = softplus(dt_proj · dt + dt_bias) per
 * channel (tokens over the threads: none depends on another); then per channel its state
 * [N] decayed by exp(dt · A) and written dt · x · B, read with C, plus D · x, times SiLU(z)
 * (channels over the threads). Every row is computed alike whatever rows beside it. */
static void rms_weighted(float *v, int n, const float *w, float eps) {
    float sq = 0.0f;
    for (int i = 0; i < n; i++) sq += v[i] * v[i];
    const float inv = 1.0f / sqrtf(sq / (float)n + eps);
    for (int i = 0; i < n; i++) v[i] = v[i] * inv * w[i];
}

int llmp_mamba1(const float *proj, int64_t ld, const float *conv, const float *conv_bias,
                int kernel, float *tail, float *state, const float *x_proj, const float *dt_proj,
                const float *dt_bias, const float *decay, const float *d, const float *dt_norm,
                const float *b_norm, const float *c_norm, float eps, int T, int W, int N, int R,
                float *out) {
    const int xd = R + 2 * N;
    float *xs = malloc(sizeof(float) * ((size_t)T * W * 2 + (size_t)T * xd));
    if (xs == NULL) return -1;
    float *dt = xs + (int64_t)T * W, *dbc = dt + (int64_t)T * W;
    #pragma omp parallel for schedule(static) if ((int64_t)T * W > 65536)
    for (int c = 0; c < W; c++) { /* the convolution, each channel over its tail */
        const float *w = conv + (int64_t)c * kernel;
        float *past = tail + (int64_t)c * (kernel - 1);
        for (int t = 0; t < T; t++) {
            xs[(int64_t)t * W + c] = silu(conv_step(w, past, kernel, proj[t * ld + c], conv_bias[c]));
        }
    }
    /* x_proj, its three norms, dt_proj: each product over (token, output) pairs, so that
     * a decode step's one row spreads over the threads too */
    #pragma omp parallel for collapse(2) schedule(static) if ((int64_t)T * W * xd > 32768)
    for (int t = 0; t < T; t++)
        for (int o = 0; o < xd; o++) {
            const float *row = x_proj + (int64_t)o * W, *x = xs + (int64_t)t * W;
            float acc = 0.0f;
            for (int i = 0; i < W; i++) acc += row[i] * x[i];
            dbc[(int64_t)t * xd + o] = acc;
        }
    for (int t = 0; t < T; t++) {
        float *v = dbc + (int64_t)t * xd;
        rms_weighted(v, R, dt_norm, eps);
        rms_weighted(v + R, N, b_norm, eps);
        rms_weighted(v + R + N, N, c_norm, eps);
    }
    #pragma omp parallel for collapse(2) schedule(static) if ((int64_t)T * W * R > 32768)
    for (int t = 0; t < T; t++)
        for (int c = 0; c < W; c++) {
            const float *row = dt_proj + (int64_t)c * R, *v = dbc + (int64_t)t * xd;
            float acc = dt_bias[c];
            for (int j = 0; j < R; j++) acc += row[j] * v[j];
            dt[(int64_t)t * W + c] = softplus(acc);
        }
    #pragma omp parallel for schedule(static) if ((int64_t)T * W * N > 8192)
    for (int c = 0; c < W; c++) { /* each channel's state through the tokens */
        float *s = state + (int64_t)c * N;
        const float *a = decay + (int64_t)c * N;
        for (int t = 0; t < T; t++) {
            const float step = dt[(int64_t)t * W + c], x = xs[(int64_t)t * W + c];
            const float *B = dbc + (int64_t)t * xd + R, *C = B + N;
            float acc = 0.0f;
            for (int n = 0; n < N; n++) {
                s[n] = s[n] * expf(step * a[n]) + step * x * B[n];
                acc += s[n] * C[n];
            }
            out[(int64_t)t * W + c] = (acc + d[c] * x) * silu(proj[t * ld + W + c]);
        }
    }
    free(xs);
    return 0;
}
