/* Dense weights at decode batches: y [M, N] = x [M, K] @ w [N, K].T for a few rows, a
 * dense weight (a tied embedding read as the head, a head kept as stored, a router)
 * streamed once for all rows. torch's fp32 matrix-vector product reads about 10 GB/s here;
 * this one streams at memory speed. A 16-bit weight (bf16, fp16) is widened to fp32 as it
 * streams: a stored 16-bit head or embedding is read at 2 bytes a weight, never upcast
 * into a copy twice its size that every step would then read. */
#include "dense_ref.h"
#if defined(__AVX2__)
#include "dense_avx2.h"
#define dense_dots dense_dots_avx2
#else
#define dense_dots dense_dots_ref
#endif

/* Rows n0..n1 of a dense weight against MT activation rows; `kind` is a constant at each
 * call (gemv_kind), so each kind compiles to its own loop. */
INLINE void dense_rows(int MT, const float *x, int K, const void *w, int kind, int n0, int n1,
                       int N, float *y) {
    int64_t width = (int64_t)K * (kind ? 2 : 4);
    for (int n = n0; n < n1; n++) {
        float out[DENSE_MT];
        dense_dots(MT, x, K, (const char *)w + n * width, kind, out);
        for (int m = 0; m < MT; m++) y[(int64_t)m * N + n] = out[m];
    }
}

/* kind 0: fp32 weights; 1: bf16; 2: fp16. Threads take 16 output rows at a time; up to
 * DENSE_MT activation rows share one read of the weights (a verified speculative step's
 * rows, a small batch), more rows take further passes. */
static void gemv_kind(const float *x, int M, int K, const void *w, int kind, int N, float *y) {
    int chunks = (N + 15) / 16;
    #pragma omp parallel for schedule(static) if ((int64_t)N * K > 65536)
    for (int c = 0; c < chunks; c++) {
        int n0 = c * 16, n1 = n0 + 16 < N ? n0 + 16 : N;
        for (int m0 = 0; m0 < M; m0 += DENSE_MT) {
            const float *xm = x + (int64_t)m0 * K;
            float *ym = y + (int64_t)m0 * N;
            int mt = M - m0 < DENSE_MT ? M - m0 : DENSE_MT;
#define KINDS(MT) (kind == 0   ? dense_rows(MT, xm, K, w, 0, n0, n1, N, ym) \
                   : kind == 1 ? dense_rows(MT, xm, K, w, 1, n0, n1, N, ym) \
                               : dense_rows(MT, xm, K, w, 2, n0, n1, N, ym))
            switch (mt) {
            case 1: KINDS(1); break;
            case 2: KINDS(2); break;
            case 3: KINDS(3); break;
            case 4: KINDS(4); break;
            case 5: KINDS(5); break;
            case 6: KINDS(6); break;
            case 7: KINDS(7); break;
            default: KINDS(8); break;
            }
#undef KINDS
        }
    }
}

void llmp_gemv_f32(const float *x, int M, int K, const float *w, int N, float *y) {
    gemv_kind(x, M, K, w, 0, N, y);
}

void llmp_gemv_16(const float *x, int M, int K, const uint16_t *w, int kind, int N, float *y) {
    gemv_kind(x, M, K, w, kind, N, y);
}
