/* Dense weights at decode batches: y [M, N] = x [M, K] @ w [N, K].T for a few rows, a
 * dense weight (a tied embedding read as the head, a head kept as stored, a router)
 * streamed once for all rows. torch's fp32 matrix-vector product reads about 10 GB/s here;
 * this one streams at memory speed. A 16-bit weight (bf16, fp16) is widened to fp32 as it
 * streams: a stored 16-bit head or embedding is read at 2 bytes a weight, never upcast
 * into a copy twice its size that every step would then read. */
#include "dense_ref.h"
#if defined(__AVX512F__)
#include "dense_avx512.h"
#define DENSE_ISA 2
#define dense_tile dense_tile_avx512
#define MT_ISA DENSE_MT_AVX512
#define NT_ISA DENSE_NT_AVX512
#elif defined(__AVX2__)
#include "dense_avx2.h"
#define DENSE_ISA 1
#define dense_tile dense_tile_avx2
#define MT_ISA DENSE_MT_AVX2
#define NT_ISA DENSE_NT_AVX2
#else
#define DENSE_ISA 0
#define dense_tile dense_tile_ref
#define MT_ISA DENSE_MT_REF
#define NT_ISA DENSE_NT_REF
#endif

/* Every tile size up to MT_ISA x NT_ISA, each its own case (dense_tiles' switch). */
#define TILE(MT, NT) \
    case MT * 16 + NT: dense_tile(MT, NT, xm, K, wn, width, kind, next, ym, N); break;
#define T2(MT) TILE(MT, 1) TILE(MT, 2)
#define T4(MT) T2(MT) TILE(MT, 3) TILE(MT, 4)
#define T8(MT) T4(MT) TILE(MT, 5) TILE(MT, 6) TILE(MT, 7) TILE(MT, 8)
#if NT_ISA == 8
#define OUTPUTS T8
#elif NT_ISA == 4
#define OUTPUTS T4
#else
#define OUTPUTS T2
#endif
#if MT_ISA == 4
#define TILES OUTPUTS(1) OUTPUTS(2) OUTPUTS(3) OUTPUTS(4)
#else
#define TILES OUTPUTS(1) OUTPUTS(2)
#endif

/* Outputs n0..n1 of a dense weight (rows `width` bytes apart) for all M activation rows, a
 * tile of NT_ISA outputs by MT_ISA rows at a time: a tile's weight rows are read from
 * memory once and from cache for the tiles of the other activation rows. `kind` is a
 * constant at each call (gemv_kind), and so are a tile's sizes (the switch), so every
 * (kind, rows, outputs) compiles to its own unrolled loop. */
INLINE void dense_tiles(const float *x, int M, int K, const void *w, int64_t width, int kind,
                        int n0, int n1, int N, float *y) {
    for (int n = n0; n < n1; n += NT_ISA) {
        int nt = n1 - n < NT_ISA ? n1 - n : NT_ISA;
        const void *wn = weight_row(w, width, n);
        const void *next = weight_row(w, width, n + 2 * NT_ISA < N ? n + 2 * NT_ISA : n);
        for (int m0 = 0; m0 < M; m0 += MT_ISA) {
            int mt = M - m0 < MT_ISA ? M - m0 : MT_ISA;
            const float *xm = x + (int64_t)m0 * K;
            float *ym = y + (int64_t)m0 * N + n;
            switch (mt * 16 + nt) { TILES }
        }
    }
}

/* kind 0: fp32 weights; 1: bf16; 2: fp16. Threads take 16 outputs at a time, each read
 * from memory once for all M rows (a verified speculative step's rows, a batch, the rows
 * of a self-generated calibration step). */
static void gemv_kind(const float *x, int M, int K, const void *w, int kind, int N, float *y) {
    int chunks = (N + 15) / 16;
    int64_t width = (int64_t)K * (kind ? 2 : 4);
    #pragma omp parallel for schedule(static) if ((int64_t)N * K > 65536)
    for (int c = 0; c < chunks; c++) {
        int n0 = c * 16, n1 = n0 + 16 < N ? n0 + 16 : N;
        if (kind == 0) dense_tiles(x, M, K, w, width, 0, n0, n1, N, y);
        else if (kind == 1) dense_tiles(x, M, K, w, width, 1, n0, n1, N, y);
        else dense_tiles(x, M, K, w, width, 2, n0, n1, N, y);
    }
}

int llmp_dense_isa(void) { return DENSE_ISA; }

void llmp_gemv_f32(const float *x, int M, int K, const float *w, int N, float *y) {
    gemv_kind(x, M, K, w, 0, N, y);
}

void llmp_gemv_16(const float *x, int M, int K, const uint16_t *w, int kind, int N, float *y) {
    gemv_kind(x, M, K, w, kind, N, y);
}
