/* One packed linear as a layer runs it: outlier columns, two-term activations, bias. */
#include "internal.h"

/* y [M, n] = x @ W.T; x both quantized (x8/dx/bs) and in fp32 (xf, row stride ld) for the
 * outlier columns. */
int qlin(const QLin *l, int8_t *x8, float *dx, float *bs, int M, float *y, const float *xf,
         int ld) {
    if (l->n_out > 0) {  /* requantize without the outlier columns: they would set the
                            activation scales of their blocks and crush the other values */
        float *row = (float *)malloc((size_t)l->k * sizeof(float));
        if (row == NULL) return -1;
        for (int m = 0; m < M; m++) {
            memcpy(row, xf + (int64_t)m * ld, (size_t)l->k * sizeof(float));
            for (int j = 0; j < l->n_out; j++) row[l->oidx[j]] = 0.f;
            quantize_row(row, l->k, x8 + (int64_t)m * l->k, dx + (int64_t)m * (l->k / 32),
                         bs + (int64_t)m * (l->k / 32));
        }
        free(row);
    }
    if (l->bits == 4) {
        llmp_gemm_q4(x8, dx, bs, M, l->k, l->g, l->w, l->scale, l->zs, l->n, y);
    } else if (l->split) {
        float *reg = NULL; /* the residual is of the input the codes came from */
        if (l->n_out > 0) {
            reg = (float *)malloc((size_t)M * l->k * sizeof(float));
            if (reg == NULL) return -1;
            for (int m = 0; m < M; m++) {
                memcpy(reg + (int64_t)m * l->k, xf + (int64_t)m * ld, (size_t)l->k * sizeof(float));
                for (int j = 0; j < l->n_out; j++) reg[(int64_t)m * l->k + l->oidx[j]] = 0.f;
            }
        }
        int rc = llmp_gemm_q8_split(x8, dx, bs, reg ? reg : xf, reg ? l->k : ld, l->k, M, l->k,
                                    l->g, (const uint8_t *)l->w, l->scale, l->zs, l->n, y);
        free(reg);
        if (rc) return -1;
    } else {
        llmp_gemm_q8(x8, dx, bs, M, l->k, l->g, (const uint8_t *)l->w, l->scale, l->zs, l->n, y);
    }
    for (int m = 0; m < M && l->n_out > 0; m++) { /* outlier columns, then the bias: */
        const float *xr = xf + (int64_t)m * ld;  /* the per-op path's order of sums */
        float *yr = y + (int64_t)m * l->n;
        #pragma omp parallel for schedule(static) if (l->n > 256)
        for (int n = 0; n < l->n; n++) {
            const float *w = l->ow + (int64_t)n * l->n_out;
            float acc = 0.f;
            for (int j = 0; j < l->n_out; j++) acc += xr[l->oidx[j]] * w[j];
            yr[n] += acc;
        }
    }
    if (l->bias)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < l->n; n++) y[(int64_t)m * l->n + n] += l->bias[n];
    return 0;
}
