/* LFM2's gated short convolution over T tokens of one sequence (runtime/short_conv.py),
 * from in_proj's rows [B, C, x] to what out_proj reads: C times the causal depthwise
 * convolution of B·x over the slot's tail. Every row is computed alike whatever rows beside
 * it; the channels are spread over the threads (each carries its own tail). */
#include "internal.h"

void llmp_short_conv(const float *proj, int64_t ld, const float *conv, int kernel, float *tail,
                     int T, int W, float *out) {
    #pragma omp parallel for schedule(static) if ((int64_t)T * W > 65536)
    for (int c = 0; c < W; c++) {
        const float *w = conv + (int64_t)c * kernel;
        float *past = tail + (int64_t)c * (kernel - 1);
        for (int t = 0; t < T; t++) {
            const float *r = proj + t * ld;
            out[(int64_t)t * W + c] = r[W + c] * conv_step(w, past, kernel, r[c] * r[2 * W + c], 0.0f);
        }
    }
}
