/* The GEMM tiles in plain C: the reference every instruction set's tiles compute exactly
 * (the same integer sums, the same float steps in the same order), and what a build
 * without AVX2 runs. */
#ifndef LLMPRESS_GEMM_TILE_REF_H
#define LLMPRESS_GEMM_TILE_REF_H

#include "gemm_tile.h"

/* y[m, 0..cols) for MT activation rows against one tile of 8 columns. */
INLINE void panel_tile_ref(int MT, int bits, const uint8_t *wt, const float *sc, const float *zs,
                           int ng, int bpg, const int8_t *x8, const float *dx, const float *bs,
                           int K, int nb, float *y, int64_t ys, int cols) {
    const float off = bits == 4 ? 8.f : 0.f;
    for (int m = 0; m < MT; m++) {
        const int8_t *xr = x8 + (int64_t)m * K;
        const float *dr = dx + (int64_t)m * nb, *br = bs + (int64_t)m * nb;
        float total[TW] = {0};
        for (int g = 0, b = 0; g < ng; g++) {
            float ga[TW] = {0}, bz = 0.f;
            for (int j = 0; j < bpg; j++, b++) {
                int si[TW] = {0};
                for (int q = 0; q < 8; q++)
                    for (int c = 0; c < TW; c++)
                        for (int kk = 0; kk < 4; kk++) {
                            int w;
                            if (bits == 4) {
                                uint8_t byte = wt[(int64_t)b * 128 + (q & 3) * 32 + c * 4 + kk];
                                w = q < 4 ? (byte & 0x0F) : (byte >> 4);
                            } else {
                                w = (int8_t)wt[(int64_t)b * 256 + q * 32 + c * 4 + kk];
                            }
                            si[c] += w * xr[b * 32 + q * 4 + kk];
                        }
                for (int c = 0; c < TW; c++) ga[c] += si[c] * dr[b];
                bz += br[b];
            }
            for (int c = 0; c < TW; c++) total[c] += ga[c] * sc[g * TW + c] - (zs ? zs[g * TW + c] : off * sc[g * TW + c]) * bz;
        }
        memcpy(y + m * ys, total, (size_t)cols * sizeof(float));
    }
}

/* One activation row against one int4 tile. */
INLINE void row_tile_q4_ref(const uint8_t *wt, const float *sc, const float *zs, int ng, int bpg,
                            const int8_t *x8, const float *dx, const float *bs, float *y, int cols) {
    panel_tile_ref(1, 4, wt, sc, zs, ng, bpg, x8, dx, bs, 0, 0, y, 0, cols);
}

#endif
