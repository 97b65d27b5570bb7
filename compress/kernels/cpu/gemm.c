/* Packed int4 / int8 weights times int8 activations: the GEMM over the panel layout
 * (llmpress.h) and grouped passes over several weights. The tiles each instruction set
 * computes are in gemm_tile_*.h and gemm_amx.h; this file picks them, once, by what the
 * build targets, and spreads their work over the threads. */
#include "gemm_tile_ref.h"

#if defined(__AVX2__)
#include "gemm_tile_avx2.h"
#define panel_tile panel_tile_avx2
#define row_tile_q4 row_tile_q4_avx2
#else
#define panel_tile panel_tile_ref
#define row_tile_q4 row_tile_q4_ref
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "gemm_tile_avx512.h"
#define PAIR_ZMM 1
#elif defined(__AVX2__) && !defined(__AVXVNNI__)
#define QUAD_PAIR 1
#endif

/* One tile against every activation row, MT_MAX rows at a time. */
INLINE void tile_rows(int bits, const uint8_t *wt, const float *sc, const float *zs, int ng,
                      int bpg, const int8_t *x8, const float *dx, const float *bs, int M,
                      int K, int nb, float *y, int64_t ys, int cols) {
    if (bits == 4 && M == 1) {
        row_tile_q4(wt, sc, zs, ng, bpg, x8, dx, bs, y, cols);
        return;
    }
    int m = 0;
#define TILE(MT) panel_tile(MT, bits, wt, sc, zs, ng, bpg, x8 + (int64_t)m * K, dx + (int64_t)m * nb, \
                            bs + (int64_t)m * nb, K, nb, y + (int64_t)m * ys, ys, cols)
    for (; m + 4 <= M; m += 4) TILE(4);
    switch (M - m) {
    case 3: TILE(3); break;
    case 2: TILE(2); break;
    case 1: TILE(1); break;
    default: break;
    }
#undef TILE
}

#if defined(QUAD_PAIR)
/* int4 rows against two adjacent tiles: four rows at a time through quad_pair_q4, the
 * rest tile by tile. */
INLINE void quad_pair_rows(int bits, const uint8_t *w0, const uint8_t *w1, const float *sc0,
                           const float *sc1, const float *zs0, const float *zs1, int ng,
                           int bpg, const int8_t *x8, const float *dx, const float *bs,
                           const int32_t *xs, int M, int K, int nb, float *y, int64_t ys,
                           int cols) {
    (void)xs;
    int m = 0;
    for (; m + 4 <= M; m += 4)
        quad_pair_q4(w0, w1, sc0, sc1, zs0, zs1, ng, bpg, x8 + (int64_t)m * K,
                     dx + (int64_t)m * nb, bs + (int64_t)m * nb, K, nb, y + (int64_t)m * ys, ys,
                     cols);
    if (m < M) {
        const int8_t *xr = x8 + (int64_t)m * K;
        const float *dr = dx + (int64_t)m * nb, *br = bs + (int64_t)m * nb;
        float *yr = y + (int64_t)m * ys;
        tile_rows(bits, w0, sc0, zs0, ng, bpg, xr, dr, br, M - m, K, nb, yr, ys, TW);
        tile_rows(bits, w1, sc1, zs1, ng, bpg, xr, dr, br, M - m, K, nb, yr + TW, ys, cols - TW);
    }
}
#endif

/* Threads take chunks of CHUNK_TILES tiles (16 columns); each chunk runs its rows in
 * blocks of ROW_BLOCK, so that the block's activations and the chunk's weights both stay
 * in L1 (8 rows x 1536 inputs + 16 columns x 1536 int4 weights: 24 KB). */
#define CHUNK_TILES 2 /* the 16 columns of one pair (512-bit, or AVX2's quad_pair_q4) */
#if defined(PAIR_ZMM)
#define PAIRED(BITS, M) ((M) > 1 || (BITS) == 8) /* one int4 row (decode): row_tile_q4 */
#define PAIR_ROWS pair_rows
#elif defined(QUAD_PAIR)
/* From 8 rows: at 4, a wide weight streamed from memory read 0.85-0.95x as fast as two
 * streams (benchmarks/kernel_ab.py, 9728 x 896 and 2048 x 1024) */
#define PAIRED(BITS, M) ((BITS) == 4 && (M) >= 8)
#define PAIR_ROWS quad_pair_rows
#else
#define PAIRED(BITS, M) 0
#define PAIR_ROWS(...) (void)0
#endif

#define ROW_BLOCK 8
#if defined(PAIR_ZMM) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define HAVE_AMX 1
#include "gemm_amx.h"
#else
int llmp_amx_enable(int on) {
    (void)on;
    return 0;
}

int llmp_amx_state(void) { return 0; }
#endif

/* Each row's sum of its int8 codes per block of 32 (the 8-bit pair path's correction);
 * NULL when it cannot allocate (the tile path then runs). */
static int32_t *block_sums(const int8_t *x8, int M, int K) {
    int nb = K / 32;
    int32_t *xs = malloc(sizeof(int32_t) * ((size_t)M * nb + 1));
    if (xs == NULL) return NULL;
    for (int64_t i = 0; i < (int64_t)M * nb; i++) {
        int sum = 0;
        for (int k = 0; k < 32; k++) sum += x8[i * 32 + k];
        xs[i] = sum;
    }
    return xs;
}
#if defined(HAVE_AMX)
#define AMX_ROWS(M) (amx_on && (M) >= AMX_MIN_ROWS)
#else
#define AMX_ROWS(M) 0
#define amx_gemm(...) -1
#endif
/* One chunk of llmp_gemm_q*: CHUNK_TILES tiles of columns for every row. */
#define GEMM_CHUNK(BITS, c)                                                                   \
    for (int m0 = 0; m0 < M; m0 += ROW_BLOCK) {                                               \
        int rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;                                   \
        if (paired && (c) * CHUNK_TILES + 1 < tiles) {                                        \
            int t = (c) * CHUNK_TILES, cols = N - t * TW < 2 * TW ? N - t * TW : 2 * TW;      \
            const float *s0 = scale + (int64_t)t * ng * TW;                                   \
            const float *z0 = zs ? zs + (int64_t)t * ng * TW : NULL;                          \
            (void)s0, (void)z0, (void)cols;                                                   \
            PAIR_ROWS(BITS, w + t * tb, w + (t + 1) * tb, s0, s0 + ng * TW, z0,               \
                      z0 ? z0 + ng * TW : NULL, ng, bpg, x8 + (int64_t)m0 * K,                \
                      dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb,                         \
                      xs ? xs + (int64_t)m0 * nb : NULL, rows, K, nb,                         \
                      y + (int64_t)m0 * N + t * TW, N, cols);                                 \
            continue;                                                                         \
        }                                                                                     \
        for (int t = (c) * CHUNK_TILES; t < tiles && t < ((c) + 1) * CHUNK_TILES; t++) {      \
            int cols = N - t * TW < TW ? N - t * TW : TW;                                     \
            tile_rows(BITS, w + t * tb, scale + (int64_t)t * ng * TW,                         \
                      zs ? zs + (int64_t)t * ng * TW : NULL, ng, bpg, x8 + (int64_t)m0 * K,   \
                      dx + (int64_t)m0 * nb, bsum + (int64_t)m0 * nb, rows, K, nb,            \
                      y + (int64_t)m0 * N + t * TW, N, cols);                                 \
        }                                                                                     \
    }
/* Prefill-sized GEMMs (M >= dynamic_rows) hand out their chunks as threads come for them:
 * a thread the OS takes off its core (a server's request handlers, its clients, another
 * process) no longer holds back a fixed half of the columns while the other waits at the
 * barrier. Decode batches keep fixed halves: chunks handed out cost batch-8 steps 14-23%
 * (batch 32: 0-5%; benchmarks/gemm_schedule.py measures both). */
static int dynamic_rows = 64;
int llmp_gemm_dynamic_rows(int rows) {
    int old = dynamic_rows;
    if (rows > 0) dynamic_rows = rows;
    return old;
}
#define DEFINE_GEMM(BITS)                                                                     \
void llmp_gemm_q##BITS(const int8_t *x8, const float *dx, const float *bsum, int M, int K,   \
                       int G, const uint8_t *w, const float *scale, const float *zs, int N,  \
                       float *y) {                                                            \
    int nb = K / 32, ng = K / G, bpg = G / 32, tiles = (N + TW - 1) / TW;                     \
    int64_t tb = (int64_t)nb * 32 * BITS; /* bytes per tile: 8 columns x K x BITS/8 */        \
    int chunks = (tiles + CHUNK_TILES - 1) / CHUNK_TILES;                                     \
    if (AMX_ROWS(M) && amx_gemm(BITS, x8, dx, bsum, M, K, G, w, scale, zs, N, y) == 0) return; \
    int32_t *xs = PAIRED(BITS, M) && (BITS) == 8 ? block_sums(x8, M, K) : NULL;               \
    int paired = PAIRED(BITS, M) && ((BITS) == 4 || xs != NULL);                              \
    if (M >= dynamic_rows) {                                                                  \
        _Pragma("omp parallel for schedule(dynamic)")                                         \
        for (int c = 0; c < chunks; c++) GEMM_CHUNK(BITS, c)                                  \
    } else {                                                                                  \
        _Pragma("omp parallel for schedule(static)")                                          \
        for (int c = 0; c < chunks; c++) GEMM_CHUNK(BITS, c)                                  \
    }                                                                                         \
    free(xs);                                                                                 \
}

DEFINE_GEMM(4)
DEFINE_GEMM(8)

/* y [M, N] = x @ W.T for 8-bit weights with two-term int8 activations: each row as its
 * codes x8 (given) plus the residual x - x8 * dx quantized again, both run as one batch of
 * twice the rows, so the weights are read once per SPLIT_ROWS rows and the activations
 * carry about 15 bits. 8-bit weights err so little that single int8 activations doubled
 * their drift (KL 0.0036 -> 0.0062 on the default model); the second term removes that.
 * xf: the fp32 rows (stride ld, kx valid columns, zero past them), x8/dx/bs: their codes
 * at width K. Scratch is bounded by SPLIT_ROWS rows (a 152k-word head's doubled output
 * for a 512-token window would be 0.6 GB). Returns -1 when it cannot allocate. */
#define SPLIT_ROWS 64
int llmp_gemm_q8_split(const int8_t *x8, const float *dx, const float *bs, const float *xf,
                       int ld, int kx, int M, int K, int G, const uint8_t *w,
                       const float *scale, const float *zs, int N, float *y) {
    int nb = K / 32, R = M < SPLIT_ROWS ? M : SPLIT_ROWS;
    if (M == 0) return 0;
    int8_t *x2 = (int8_t *)malloc((size_t)2 * R * K);
    float *d2 = (float *)malloc((size_t)4 * R * nb * sizeof(float));
    float *y2 = (float *)malloc((size_t)2 * R * N * sizeof(float));
    float *r = (float *)malloc((size_t)R * K * sizeof(float));
    if (!x2 || !d2 || !y2 || !r) {
        free(x2), free(d2), free(y2), free(r);
        return -1;
    }
    float *b2 = d2 + (int64_t)2 * R * nb;
    for (int m0 = 0; m0 < M; m0 += R) {
        int rows = M - m0 < R ? M - m0 : R;
        memcpy(x2, x8 + (int64_t)m0 * K, (size_t)rows * K);
        memcpy(d2, dx + (int64_t)m0 * nb, (size_t)rows * nb * sizeof(float));
        memcpy(b2, bs + (int64_t)m0 * nb, (size_t)rows * nb * sizeof(float));
        #pragma omp parallel for schedule(static) if (rows > 4)
        for (int m = 0; m < rows; m++) {
            float *rr = r + (int64_t)m * K;
            const float *xr = xf + (int64_t)(m0 + m) * ld;
            const int8_t *q = x2 + (int64_t)m * K;
            const float *d = d2 + (int64_t)m * nb;
            for (int k = 0; k < K; k++) rr[k] = (k < kx ? xr[k] : 0.f) - q[k] * d[k / 32];
            quantize_row(rr, K, x2 + (int64_t)(rows + m) * K, d2 + (int64_t)(rows + m) * nb,
                         b2 + (int64_t)(rows + m) * nb);
        }
        llmp_gemm_q8(x2, d2, b2, 2 * rows, K, G, w, scale, zs, N, y2);
        float *yo = y + (int64_t)m0 * N;
        for (int64_t i = 0; i < (int64_t)rows * N; i++) yo[i] = y2[i] + y2[(int64_t)rows * N + i];
    }
    free(x2), free(d2), free(y2), free(r);
    return 0;
}

/* Several GEMMs in one parallel pass over all their column chunks. The experts a step
 * chose are small matrices (a batch-1 step of 8 experts top-2 runs four of 0.6-1.2 MB a
 * layer); one pass over them has one fork and one tail where a pass each has four, and
 * the cores stream them as one longer GEMV. Every column is computed exactly as
 * llmp_gemm_q* computes it. Linears with outlier columns or two-term activations run one
 * by one through qlin, and so does a step with an expert of more than GROUP_ROWS rows (a
 * prefill step's): llmp_gemm_q*'s paired row tiles are faster there (a 192-row step of
 * qwen2_moe's shape ran 0.91x the per-op path's speed through this pass), while no decode
 * step of up to 32 sequences has one. Returns -1 when qlin cannot allocate. */
#define GROUP_ROWS 32
int gemm_jobs(const GemmJob *jobs, int n) {
    int64_t first[n + 1];
    first[0] = 0;
    int grouped = 1;
    for (int j = 0; j < n; j++) {
        const QLin *l = jobs[j].l;
        grouped &= l->n_out == 0 && !l->split && jobs[j].M <= GROUP_ROWS;
        int tiles = (l->n + TW - 1) / TW;
        first[j + 1] = first[j] + (tiles + CHUNK_TILES - 1) / CHUNK_TILES;
    }
    if (!grouped) {
        for (int j = 0; j < n; j++) {
            const GemmJob *J = jobs + j;
            if (qlin(J->l, (int8_t *)J->x8, (float *)J->dx, (float *)J->bs, J->M, J->y, J->xf,
                     J->l->k))
                return -1;
        }
        return 0;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < first[n]; c++) {
        int j = 0;
        while (c >= first[j + 1]) j++;
        const GemmJob *J = jobs + j;
        const QLin *l = J->l;
        int K = l->k, N = l->n, M = J->M, nb = K / 32, ng = K / l->g, bpg = l->g / 32;
        int tiles = (N + TW - 1) / TW;
        int64_t tb = (int64_t)nb * 32 * l->bits, t0 = (c - first[j]) * CHUNK_TILES;
        const uint8_t *w = (const uint8_t *)l->w;
        for (int m0 = 0; m0 < M; m0 += ROW_BLOCK) {
            int rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
            for (int64_t t = t0; t < tiles && t < t0 + CHUNK_TILES; t++) {
                int cols = N - t * TW < TW ? N - (int)t * TW : TW;
                const float *sc = l->scale + t * ng * TW, *zs = l->zs ? l->zs + t * ng * TW : NULL;
                const int8_t *x8 = J->x8 + (int64_t)m0 * K;
                const float *dx = J->dx + (int64_t)m0 * nb, *bs = J->bs + (int64_t)m0 * nb;
                float *y = J->y + (int64_t)m0 * N + t * TW;
                if (l->bits == 4) /* two call sites: each inlined for its constant width */
                    tile_rows(4, w + t * tb, sc, zs, ng, bpg, x8, dx, bs, rows, K, nb, y, N, cols);
                else
                    tile_rows(8, w + t * tb, sc, zs, ng, bpg, x8, dx, bs, rows, K, nb, y, N, cols);
            }
        }
    }
    for (int j = 0; j < n; j++) {
        const GemmJob *J = jobs + j;
        if (J->l->bias)
            for (int m = 0; m < J->M; m++)
                for (int c = 0; c < J->l->n; c++) J->y[(int64_t)m * J->l->n + c] += J->l->bias[c];
    }
    return 0;
}

