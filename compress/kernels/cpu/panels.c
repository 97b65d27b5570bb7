/* The panel layout (llmpress.h): codes into it at load, and back out as fp32 for the exact path. */
#include "internal.h"

/* Row-major codes q [n, k] (plus offset; int4 codes unsigned 0..15 after it) into the
 * kernels' panel layout: tiles of 8 output rows, each block of 32 inputs as quads of 4
 * inputs for each of the 8 rows; int4 holds the block's inputs i and i + 16 in one byte's
 * low and high nibbles. Inputs past k are code 0 (plus offset), rows past n zero bytes,
 * as cpu.to_panels lays them out. Loading a model's linears this way instead of through
 * torch's pads and permutes took a third of a Mixture-of-Experts artifact's load. */
void llmp_to_panels(const int8_t *q, int64_t n, int k, int kp, int bits, int offset, void *out) {
    int64_t tiles = (n + 7) / 8;
    int nb = kp / 32;
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        for (int b = 0; b < nb; b++) {
            for (int c = 0; c < 8; c++) {
                int64_t row = t * 8 + c;
                int8_t v[32];
                for (int i = 0; i < 32; i++) {
                    int idx = b * 32 + i;
                    v[i] = row < n ? (int8_t)((idx < k ? q[row * k + idx] : 0) + offset) : 0;
                }
                if (bits == 4) {
                    uint8_t *o = (uint8_t *)out + (t * nb + b) * 128;
                    for (int j = 0; j < 4; j++)
                        for (int kk = 0; kk < 4; kk++)
                            o[(j * 8 + c) * 4 + kk] =
                                (uint8_t)((v[j * 4 + kk] & 15) | (v[16 + j * 4 + kk] << 4));
                } else {
                    int8_t *o = (int8_t *)out + (t * nb + b) * 256;
                    for (int j = 0; j < 8; j++)
                        for (int kk = 0; kk < 4; kk++) o[(j * 8 + c) * 4 + kk] = v[j * 4 + kk];
                }
            }
        }
    }
}

/* The dense fp32 weight [N, K] from the panel layout, for the exact (large-batch) path. */
static void dequant_panel(int bits, const uint8_t *w, const float *scale, const float *zs,
                          int N, int K, int G, float *out) {
    int nb = K / 32, ng = K / G, tiles = (N + TW - 1) / TW;
    int64_t tb = (int64_t)nb * 32 * bits;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++)
        for (int b = 0; b < nb; b++) {
            int g = b * 32 / G;
            for (int q = 0; q < 8; q++)
                for (int c = 0; c < TW && t * TW + c < N; c++) {
                    int64_t i = ((int64_t)t * ng + g) * TW + c;
                    float s = scale[i], z = zs ? zs[i] : (bits == 4 ? 8.f : 0.f) * s;
                    float *o = out + (int64_t)(t * TW + c) * K + b * 32 + q * 4;
                    for (int kk = 0; kk < 4; kk++) {
                        int v;
                        if (bits == 4) {
                            uint8_t byte = w[t * tb + b * 128 + (q & 3) * 32 + c * 4 + kk];
                            v = q < 4 ? (byte & 0x0F) : (byte >> 4);
                        } else {
                            v = (int8_t)w[t * tb + b * 256 + q * 32 + c * 4 + kk];
                        }
                        o[kk] = v * s - z;
                    }
                }
        }
}

void llmp_dequant_q4(const uint8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out) {
    dequant_panel(4, w, scale, zs, N, K, G, out);
}

void llmp_dequant_q8(const int8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out) {
    dequant_panel(8, (const uint8_t *)w, scale, zs, N, K, G, out);
}
