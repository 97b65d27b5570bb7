/* AMX GEMM tiles: the 512-bit pair path's integer sums from tile instructions. Included
 * by gemm.c after its tile_rows (which takes a last odd tile of columns), where the
 * build targets AMX. */
#ifndef LLMPRESS_GEMM_AMX_H
#define LLMPRESS_GEMM_AMX_H

#include "gemm_tile_avx512.h"
#if !(defined(__AMX_TILE__) && defined(__AMX_INT8__))
#error "gemm_amx.h needs AMX-TILE and AMX-INT8"
#endif
#include <sys/syscall.h>
#include <unistd.h>
/* ---- AMX: the pair path's integer sums from tile instructions -----------------------
 * One tile multiply gives the int32 sums of 16 activation rows x 16 columns over one block
 * of 32 inputs (8192 products) where the 512-bit path needs 8 dot instructions per row.
 * The sums are exact either way, and the float steps after them are pair_tile's in its
 * order, so every result is bit-identical to the pair path: a row computes the same at any
 * batch, on either path (speculative decoding's check relies on it). The weights of up to
 * AMX_PAIRS pairs of tiles are unpacked once per call into the tile operand layout, 8
 * quads x 64 bytes a block, and serve every 16 rows. Tiles: 0-3 = sums (16 x 16 int32, one
 * per pair), 4 = activations (16 rows x 32 codes), 5-7 = weights. The per-block scaling of
 * the sums in vector registers is most of the time left (without it: 1.4-2.5x faster;
 * 1.7-2.0x at 192 rows). Tried on a 2-core AMX Xeon VM, same bits, and all slower
 * (benchmarks/kernel_ab.py, 192 rows, the default model's widths): storing a block's sums
 * two blocks before reading them; scaling two blocks a pass with the group sums in
 * registers (accumulator loads and stores halved: 0.95x with four pairs, 0.65-0.70x with
 * three); each 16 rows' block of activations packed as one contiguous 512-byte operand
 * (0.87-0.96x). Without the scaling a block still takes about 95 ns where the same tile
 * loads, products and stores from L1 take 41 ns, half of it the stores. The OS grants the
 * tile state per process (llmp_amx_enable); every call configures its threads' tiles,
 * since other libraries in the process may use AMX with their own configuration, and
 * releases them after. */
#define AMX_MIN_ROWS 16 /* fewer rows: the 512-bit path is as fast (8 rows: 25% faster) */
static int amx_on;

int llmp_amx_enable(int on) {
    amx_on = on && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return amx_on;
}

int llmp_amx_state(void) { return amx_on; }

static void amx_config(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } __attribute__((packed, aligned(64))) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16; /* sums */
    cfg.colsb[4] = 32, cfg.rows[4] = 16;                              /* activations */
    for (int t = 5; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 8;  /* weights */
    _tile_loadconfig(&cfg);
}

/* Tiles w0, w1 (nb blocks each) as tile operands: row r of a block holds quad r of the 16
 * columns, as pair_tile's vectors hold them. */
static void amx_unpack(int bits, const uint8_t *w0, const uint8_t *w1, int nb, uint8_t *out) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int b = 0; b < nb; b++, out += 512) {
        if (bits == 4) {
            const uint8_t *b0 = w0 + (int64_t)b * 128, *b1 = w1 + (int64_t)b * 128;
            for (int v = 0; v < 4; v++) {
                __m512i raw = load_pair_i(b0 + 32 * v, b1 + 32 * v);
                _mm512_store_si512(out + 64 * v, _mm512_and_si512(raw, low));
                _mm512_store_si512(out + 64 * (v + 4),
                                   _mm512_and_si512(_mm512_srli_epi16(raw, 4), low));
            }
        } else {
            const uint8_t *b0 = w0 + (int64_t)b * 256, *b1 = w1 + (int64_t)b * 256;
            for (int q = 0; q < 8; q++)
                _mm512_store_si512(out + 64 * q, load_pair_i(b0 + 32 * q, b1 + 32 * q));
        }
    }
}

#define AMX_PAIRS 4 /* pairs of tiles (16 columns each) per work item: one sums tile each */
typedef struct {
    __m512 acc[AMX_PAIRS][16], gacc[AMX_PAIRS][16];
    int32_t sums[2][AMX_PAIRS][256];
    float bz[16];
} AmxAcc;

/* Block b's sums (slot b & 1) into the group sums; the group's into acc at its end. */
INLINE void amx_epilogue(AmxAcc *a, int b, int bpg, int np, int bits, const float *sc,
                         const float *zs, int ng, const float *dx, const float *bs, int rows,
                         int nb) {
    int g = b / bpg, first = b % bpg == 0;
    for (int m = 0; m < rows; m++) {
        float d = dx[(int64_t)m * nb + b];
        for (int c = 0; c < np; c++) {
            __m512i ai = _mm512_load_si512(a->sums[b & 1][c] + 16 * m);
            a->gacc[c][m] = pair_block(first ? _mm512_setzero_ps() : a->gacc[c][m], ai, d);
        }
        a->bz[m] = (first ? 0.f : a->bz[m]) + bs[(int64_t)m * nb + b];
    }
    if ((b + 1) % bpg) return;
    const __m512 offset = _mm512_set1_ps(bits == 4 ? 8.f : 0.f);
    for (int c = 0; c < np; c++) {
        const float *s0 = sc + (int64_t)2 * c * ng * TW;
        const float *z0 = zs ? zs + (int64_t)2 * c * ng * TW : NULL;
        __m512 s = load_pair(s0 + g * TW, s0 + (ng + g) * TW);
        __m512 z = z0 ? load_pair(z0 + g * TW, z0 + (ng + g) * TW) : _mm512_setzero_ps();
        for (int m = 0; m < rows; m++)
            a->acc[c][m] = pair_group(a->acc[c][m], a->gacc[c][m], s, zs != NULL, z, a->bz[m],
                                      offset);
    }
}

#define AMX_DP(C, B)                                                                          \
    do {                                                                                      \
        if (bits == 4)                                                                        \
            _tile_dpbsud(C, 4, B);                                                            \
        else                                                                                  \
            _tile_dpbssd(C, 4, B);                                                            \
    } while (0)
/* pair_tile for `rows` <= 16 rows (x8 holds 16 readable rows) against np <= AMX_PAIRS
 * unpacked pairs (wb: [np][nb][512]; their scales at sc + 2c * ng * TW). Block b's
 * products run on the tile unit while the vector unit scales block b - 1's sums. */
static void amx_rows(int bits, const uint8_t *wb, int np, const float *sc, const float *zs,
                     int ng, int bpg, const int8_t *x8, const float *dx, const float *bs,
                     int rows, int K, int nb, float *y, int64_t ys, int cols) {
    AmxAcc a __attribute__((aligned(64)));
    for (int c = 0; c < np; c++)
        for (int m = 0; m < rows; m++) a.acc[c][m] = _mm512_setzero_ps();
    const int64_t pb = (int64_t)nb * 512;
    for (int b = 0; b < nb; b++) {
        const uint8_t *w = wb + (int64_t)b * 512;
        _tile_loadd(4, x8 + b * 32, K);
        _tile_zero(0);
        _tile_loadd(5, w, 64);
        AMX_DP(0, 5);
        if (np > 1) {
            _tile_zero(1);
            _tile_loadd(6, w + pb, 64);
            AMX_DP(1, 6);
        }
        if (np > 2) {
            _tile_zero(2);
            _tile_loadd(7, w + 2 * pb, 64);
            AMX_DP(2, 7);
        }
        if (np > 3) {
            _tile_zero(3);
            _tile_loadd(5, w + 3 * pb, 64);
            AMX_DP(3, 5);
        }
        if (b > 0) amx_epilogue(&a, b - 1, bpg, np, bits, sc, zs, ng, dx, bs, rows, nb);
        int32_t(*out)[256] = a.sums[b & 1];
        _tile_stored(0, out[0], 64);
        if (np > 1) _tile_stored(1, out[1], 64);
        if (np > 2) _tile_stored(2, out[2], 64);
        if (np > 3) _tile_stored(3, out[3], 64);
    }
    amx_epilogue(&a, nb - 1, bpg, np, bits, sc, zs, ng, dx, bs, rows, nb);
    for (int c = 0; c < np; c++) {
        int left = cols - 16 * c;
        __mmask16 keep = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        for (int m = 0; m < rows; m++) _mm512_mask_storeu_ps(y + m * ys + 16 * c, keep, a.acc[c][m]);
    }
}

/* llmp_gemm_q* on AMX: each thread takes pairs of tiles, unpacks them and runs every row
 * through them, 16 at a time. Returns -1 (nothing written) when it cannot allocate. */
static int amx_gemm(int bits, const int8_t *x8, const float *dx, const float *bsum, int M,
                    int K, int G, const uint8_t *w, const float *scale, const float *zs,
                    int N, float *y) {
    int nb = K / 32, ng = K / G, bpg = G / 32, tiles = (N + TW - 1) / TW, pairs = tiles / 2;
    int64_t tb = (int64_t)nb * 32 * bits, mp = (M + 15) / 16 * 16;
    int threads = omp_threads();
    /* pairs per work item: the most, up to AMX_PAIRS, that shares them evenly */
    int per = AMX_PAIRS, items = (pairs + per - 1) / per;
    while (per > 1 && items % threads) per--, items = (pairs + per - 1) / per;
    if (items % threads) per = AMX_PAIRS, items = (pairs + per - 1) / per;
    uint8_t *wbuf = aligned_alloc(64, (size_t)threads * AMX_PAIRS * nb * 512);
    int8_t *pad = mp == M ? NULL : calloc((size_t)mp * K, 1);
    if (wbuf == NULL || (mp != M && pad == NULL)) {
        free(wbuf), free(pad);
        return -1;
    }
    if (pad) memcpy(pad, x8, (size_t)M * K);
    const int8_t *xa = pad ? pad : x8;
    #pragma omp parallel
    {
        uint8_t *wb = wbuf + (int64_t)omp_thread() * AMX_PAIRS * nb * 512;
        amx_config();
        #pragma omp for schedule(static)
        for (int it = 0; it < items; it++) {
            int p0 = it * per, np = pairs - p0 < per ? pairs - p0 : per, t = 2 * p0;
            int cols = N - t * TW < 2 * TW * np ? N - t * TW : 2 * TW * np;
            for (int c = 0; c < np; c++)
                amx_unpack(bits, w + (t + 2 * c) * tb, w + (t + 2 * c + 1) * tb, nb,
                           wb + (int64_t)c * nb * 512);
            for (int m0 = 0; m0 < M; m0 += 16)
                amx_rows(bits, wb, np, scale + (int64_t)t * ng * TW,
                         zs ? zs + (int64_t)t * ng * TW : NULL, ng, bpg, xa + (int64_t)m0 * K,
                         dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb,
                         M - m0 < 16 ? M - m0 : 16, K, nb, y + (int64_t)m0 * N + t * TW, N,
                         cols);
        }
        _tile_release();
    }
    if (tiles % 2) { /* the last 8 columns: the tile path, as the pair path leaves them */
        int t = tiles - 1, cols = N - t * TW;
        for (int m0 = 0; m0 < M; m0 += ROW_BLOCK)
            tile_rows(bits, w + t * tb, scale + (int64_t)t * ng * TW,
                      zs ? zs + (int64_t)t * ng * TW : NULL, ng, bpg, x8 + (int64_t)m0 * K,
                      dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb,
                      M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK, K, nb, y + (int64_t)m0 * N + t * TW,
                      N, cols);
    }
    free(wbuf), free(pad);
    return 0;
}
#endif
