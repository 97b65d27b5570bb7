/* GPTQ's column loop (compress/quantizers/gptq.py) for CPU tensors.
 *
 * Why: the loop visits one column at a time and each visit is a dozen small tensor ops,
 * so in torch it costs ~15 ops of Python and dispatch per column, whatever the number of
 * calibration samples: most of GPTQ's rounding time on the default model. Rows
 * are independent given the inverse Hessian's factor, so here each thread takes whole
 * rows and runs every column of the range for them, the row's block of weights in L1.
 *
 * The arithmetic is torch's, step for step and in float32 (x / s rounded half to even,
 * plus the zero point, clamped; the error (x - (q - z) * s) / h_jj; each later column
 * minus e * h_jk rounded before the subtraction), so the integers and errors are
 * bit-identical to the torch loop, which the GPU runs. That is why contraction into
 * fused multiply-adds and reassociation are off for this file.
 */
#if defined(__clang__)
#pragma clang fp contract(off) reassociate(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-associative-math")
#endif
#include <math.h>
#include <stdint.h>

#include "llmpress.h"

/* Columns [j0, j1) of a block of `nb` columns, for `rows` rows.
 *   wb     float [rows, ldw]: the block's weights, updated in place (every column after j)
 *   hinv   float [nb, ldh]: the block's part of the upper factor of H^-1
 *   scale  float, element (r, j) at scale[r * lds + j * scs] (scs 0: one per row)
 *   zero   same layout, or NULL (symmetric)
 *   q      int8 [rows, ldq]: the integers of column j at q[r * ldq + j]
 *   err    float [rows, lde]: the scaled errors, for the update of the later blocks
 */
void llmp_gptq_columns(float *wb, int rows, int ldw, int j0, int j1, int nb, const float *hinv,
                       int ldh, const float *scale, const float *zero, int lds, int scs,
                       float qmin, float qmax, int8_t *q, int ldq, float *err, int lde) {
    #pragma omp parallel for schedule(static) if ((int64_t)rows * (j1 - j0) * nb > 262144)
    for (int r = 0; r < rows; r++) {
        float *w = wb + (int64_t)r * ldw;
        const float *sr = scale + (int64_t)r * lds;
        const float *zr = zero ? zero + (int64_t)r * lds : 0;
        for (int j = j0; j < j1; j++) {
            float s = sr[(int64_t)j * scs], x = w[j];
            float qc = nearbyintf(x / s);
            float z = 0.0f;
            if (zr) {
                z = zr[(int64_t)j * scs];
                qc = qc + z;
            }
            qc = fminf(fmaxf(qc, qmin), qmax);
            q[(int64_t)r * ldq + j] = (int8_t)qc;
            float deq = (qc - z) * s;
            float e = (x - deq) / hinv[(int64_t)j * ldh + j];
            err[(int64_t)r * lde + j] = e;
            const float *h = hinv + (int64_t)j * ldh;
            for (int k = j + 1; k < nb; k++) {
                float t = e * h[k];
                w[k] = w[k] - t;
            }
        }
    }
}
