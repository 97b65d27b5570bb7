/* A Gated DeltaNet layer's mixing over T tokens of one sequence (runtime/deltanet.py), from
 * its projections' rows to what out_proj reads: the causal depthwise convolution over the
 * slot's tail and SiLU, q and k L2-normed per key head (q times K^-0.5), each value head's
 * write rate sigmoid(b) and decay exp(-exp(A_log) softplus(a + dt_bias)) from the input,
 * the delta rule on the slot's state, then the RMS norm of each head's output times the
 * norm's weight and SiLU(z). Every row is computed alike whatever rows beside it, so a
 * prompt prefilled whole, in chunks or token by token gives the same bits. Three phases,
 * each spread over the threads: channels (the convolution carries each channel's tail),
 * tokens (norms and gates), value heads (the state carries each head's [K, V]). */
#include "internal.h"

/* `scratch`: H * V floats, a head's V each. */
static void delta_heads(float *state, const float *q, const float *k, const float *v,
                        const float *g, const float *beta, float *out, int T, int H, int K,
                        int V, int64_t ldqk, int64_t ldv, int group, int64_t ldo,
                        float *scratch) {
    #pragma omp parallel for schedule(static) if ((int64_t)T * H * K * V > 65536)
    for (int h = 0; h < H; h++) {
        float *s = state + (int64_t)h * K * V, *d = scratch + (int64_t)h * V;
        for (int t = 0; t < T; t++) {
            const float *qt = q + t * ldqk + (int64_t)(h / group) * K;
            const float *kt = k + t * ldqk + (int64_t)(h / group) * K;
            const float *vt = v + t * ldv + (int64_t)h * V;
            const float decay = expf(g[(int64_t)t * H + h]), b = beta[(int64_t)t * H + h];
            float *o = out + t * ldo + (int64_t)h * V;
            for (int j = 0; j < V; j++) d[j] = 0.0f;
            for (int i = 0; i < K; i++) { /* decay the state; what it holds for k */
                float *row = s + (int64_t)i * V;
                const float ki = kt[i];
                for (int j = 0; j < V; j++) {
                    row[j] *= decay;
                    d[j] += ki * row[j];
                }
            }
            for (int j = 0; j < V; j++) {
                d[j] = b * (vt[j] - d[j]);
                o[j] = 0.0f;
            }
            for (int i = 0; i < K; i++) { /* write k (x) d, then read the state with q */
                float *row = s + (int64_t)i * V;
                const float ki = kt[i], qi = qt[i];
                for (int j = 0; j < V; j++) {
                    row[j] += ki * d[j];
                    o[j] += qi * row[j];
                }
            }
        }
    }
}

int llmp_deltanet(const float *mixed, int64_t ld_mixed, const float *z, int64_t ld_z,
                   const float *x, int64_t ld_x, int hidden, const float *ba, const float *conv,
                   int kernel, float *tail, float *state, const float *decay,
                   const float *dt_bias, const float *norm, float eps, int T, int KH, int H,
                   int K, int V, float *out) {
    const int keys = KH * K, channels = 2 * keys + H * V, width = H * V;
    /* the convolution's rows, then g, beta and the delta rule's scratch */
    float *rows = malloc(sizeof(float) * ((size_t)T * channels + 2 * (size_t)T * H + (size_t)H * V));
    if (rows == NULL) return -1;
    float *g = rows + (int64_t)T * channels, *beta = g + (int64_t)T * H, *scratch = beta + (int64_t)T * H;
    #pragma omp parallel for schedule(static) if ((int64_t)T * channels > 65536)
    for (int c = 0; c < channels; c++) { /* the convolution, each channel over its tail */
        const float *w = conv + (int64_t)c * kernel;
        float *past = tail + (int64_t)c * (kernel - 1);
        for (int t = 0; t < T; t++) {
            const float y = conv_step(w, past, kernel, mixed[t * ld_mixed + c], 0.0f);
            rows[(int64_t)t * channels + c] = silu(y);
        }
    }
    const float qscale = 1.0f / sqrtf((float)K);
    #pragma omp parallel for schedule(static) if ((int64_t)T * hidden * H > 65536)
    for (int t = 0; t < T; t++) { /* q and k normed per key head; each value head's gates */
        float *r = rows + (int64_t)t * channels;
        for (int part = 0; part < 2; part++) {
            for (int kh = 0; kh < KH; kh++) {
                float *u = r + (int64_t)part * keys + (int64_t)kh * K, sq = 0.0f;
                for (int i = 0; i < K; i++) sq += u[i] * u[i];
                const float inv = 1.0f / sqrtf(sq + 1e-6f) * (part == 0 ? qscale : 1.0f);
                for (int i = 0; i < K; i++) u[i] *= inv;
            }
        }
        const float *xt = x + t * ld_x;
        for (int h = 0; h < 2 * H; h++) { /* ba's rows: b's, then a's */
            const float *w = ba + (int64_t)h * hidden;
            float dot = 0.0f;
            for (int i = 0; i < hidden; i++) dot += w[i] * xt[i];
            if (h < H) beta[(int64_t)t * H + h] = 1.0f / (1.0f + expf(-dot));
            else g[(int64_t)t * H + h - H] = decay[h - H] * softplus(dot + dt_bias[h - H]);
        }
    }
    delta_heads(state, rows, rows + keys, rows + 2 * keys, g, beta, out, T, H, K, V, channels,
                channels, H / KH, width, scratch);
    #pragma omp parallel for schedule(static) if ((int64_t)T * width > 65536)
    for (int t = 0; t < T; t++) { /* each head's output normed, times SiLU(z) */
        for (int h = 0; h < H; h++) {
            float *o = out + (int64_t)t * width + (int64_t)h * V, sq = 0.0f;
            const float *zt = z + t * ld_z + (int64_t)h * V;
            for (int j = 0; j < V; j++) sq += o[j] * o[j];
            const float inv = 1.0f / sqrtf(sq / (float)V + eps);
            for (int j = 0; j < V; j++) o[j] = o[j] * inv * norm[j] * silu(zt[j]);
        }
    }
    free(rows);
    return 0;
}
