/* The grid of group scales that scale_search.py tries (compress/quantizers/scale_search.py)
 * for CPU tensors.
 *
 * Why: in torch each clip factor is eight passes over the whole slice of weights (divide,
 * round, clamp, multiply, subtract, square, weigh, sum), 53 factors a slice: at a 1B
 * model's MLP a weight's search took 1.2-1.7 s, the largest part of GPTQ's rounding there.
 * Here each (row, group) is read once and every candidate's error is summed in registers.
 *
 * Per element the arithmetic is torch's, step for step in float32 (w / s rounded half to
 * even, plus the zero point, clamped, minus it; w - q * s; squared, times the importance),
 * with contraction into fused multiply-adds off. Only the order of a group's sum differs
 * (torch's reduction is its own), so a near-tie between two candidates may go the other
 * way.
 */
#if defined(__clang__)
#pragma clang fp contract(off) reassociate(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-associative-math")
#endif
#include <math.h>
#include <stdint.h>

#include "llmpress.h"

#define MAX_CANDIDATES 128
/* Adding and subtracting 1.5 * 2^23 rounds a float of magnitude below 2^22 to an integer,
 * half to even, as torch.round does: the codes are clamped to +-256 first (past any code's
 * range, so the clamp after it gives what torch's gives). nearbyintf, rintf and fminf kept
 * GCC 12 from vectorizing the loop over candidates; these comparisons and additions do not
 * (and reassociation, off for this file, would fold them away). */
#define ROUND_MAGIC 12582912.0f

static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

static inline float code_of(float x, float s) {
    float v = clampf(x / s, -256.0f, 256.0f);
    return (v + ROUND_MAGIC) - ROUND_MAGIC;
}

/* For rows × groups of `group` weights:
 *   w      float [rows, cols] (rows contiguous), cols = groups * group
 *   d      float [cols]: each input's importance (>= 0)
 *   s, z   float [rows, groups, n]: each candidate's scale and zero point (z NULL: none)
 *   err    float [rows, groups]: the least error found
 *   best   int32 [rows, groups]: its candidate, the first of equal ones (n <= 128)
 */
void llmp_scale_search(const float *w, int rows, int cols, int group, const float *d,
                       const float *s, const float *z, int n, float qmin, float qmax,
                       float *err, int32_t *best) {
    int groups = cols / group;
    int64_t pairs = (int64_t)rows * groups;
    #pragma omp parallel for schedule(static) if (pairs * group * n > 262144)
    for (int64_t p = 0; p < pairs; p++) {
        int64_t r = p / groups, g = p % groups;
        const float *wg = w + r * cols + g * group, *dg = d + g * group;
        const float *restrict sp = s + p * n;
        const float *restrict zp = z ? z + p * n : 0;
        float acc[MAX_CANDIDATES];
        acc[0] = 0.0f; /* n >= 1 (scale_grid.py); and without candidates: error 0, the first */
        for (int c = 1; c < n; c++) acc[c] = 0.0f;
        for (int i = 0; i < group; i++) {
            float x = wg[i], di = dg[i];
            if (zp) {
                for (int c = 0; c < n; c++) {
                    float q = clampf(code_of(x, sp[c]) + zp[c], qmin, qmax) - zp[c];
                    float e = x - q * sp[c];
                    acc[c] += e * e * di;
                }
            } else {
                for (int c = 0; c < n; c++) {
                    float q = clampf(code_of(x, sp[c]), qmin, qmax);
                    float e = x - q * sp[c];
                    acc[c] += e * e * di;
                }
            }
        }
        int k = 0;
        for (int c = 1; c < n; c++)
            if (acc[c] < acc[k]) k = c;
        err[p] = acc[k];
        best[p] = k;
    }
}
