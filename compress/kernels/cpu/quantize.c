/* Activations as int8 blocks of 32 (llmpress.h's activation layout). */
#include "quantize_ref.h"
#if defined(__AVX2__)
#include "quantize_avx2.h"
#define quantize_block quantize_block_avx2
#else
#define quantize_block quantize_block_ref
#endif

/* One row as int8 blocks of 32: codes round(x * 127 / absmax), the block's scale and the
 * scale times the codes' sum. */
void quantize_row(const float *xr, int K, int8_t *qr, float *dr, float *bs) {
    for (int b = 0; b < K / 32; b++) quantize_block(xr + b * 32, qr + b * 32, dr + b, bs + b);
}

void llmp_quantize_rows(const float *x, int M, int K, int8_t *x8, float *dx, float *bsum) {
    int nb = K / 32;
    #pragma omp parallel for schedule(static) if (M > 4)
    for (int m = 0; m < M; m++)
        quantize_row(x + (int64_t)m * K, K, x8 + (int64_t)m * K, dx + (int64_t)m * nb, bsum + (int64_t)m * nb);
}
