/* Packed int4 / int8 matrix multiply for the CPU decode path.
 *
 * Why: torch's packed CPU kernels reach 2-6 GB/s on AVX2 machines, far below memory
 * bandwidth. Here activations are quantized per block of 32 to int8 (one scale each), and
 * each block's dot product with the weights is done in integer SIMD (u8 x s8 -> s32), then
 * scaled in float. Weights stay packed; nothing is dequantized whole per step.
 *
 * Layouts (K is padded to a multiple of 32 by the caller, padding holds zero activations):
 *   int4 weight  uint8 [N, K/2]: per block of 32 inputs, 16 bytes; byte j holds input j in
 *                its low nibble and input 16+j in its high nibble; values unsigned 0..15.
 *   int8 weight  int8  [N, K]   signed.
 *   scale, zs    float [N, K/G]: w = q * scale - zs  (zs = zero_point * scale).
 *   activations  x8 int8 [M, K], dx float [M, K/32], bsum float [M, K/32] (each block's sum
 *                of its quantized values, for the zero-point term: the product is then
 *                exactly sum(w * x_quantized), so the offset in q * scale adds no error).
 * G is a multiple of 32.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX2__)
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Sum of u8 x s8 products of 32 lanes, as 8 int32 lanes. */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

int llmp_has_avx2(void) {
#if defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

static void quantize_row(const float *xr, int K, int8_t *qr, float *dr, float *bs) {
    for (int b = 0; b < K / 32; b++) {
        const float *xb = xr + b * 32;
        float amax = 0.f;
        for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(xb[k]));
        float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int sum = 0;
        for (int k = 0; k < 32; k++) {
            int v = (int)lrintf(xb[k] * inv);
            qr[b * 32 + k] = (int8_t)v;
            sum += v;
        }
        dr[b] = d;
        bs[b] = d * (float)sum;
    }
}

void llmp_quantize_rows(const float *x, int M, int K, int8_t *x8, float *dx, float *bsum) {
    int nb = K / 32;
    #pragma omp parallel for schedule(static) if (M > 4)
    for (int m = 0; m < M; m++)
        quantize_row(x + (int64_t)m * K, K, x8 + (int64_t)m * K, dx + (int64_t)m * nb, bsum + (int64_t)m * nb);
}

/* R weight rows at a time share each activation block load; R and BITS are constants
 * after inlining, so the accumulators stay in registers. */
#define INLINE static inline __attribute__((always_inline))

#if defined(__AVX2__)
INLINE __m256i block_codes(const uint8_t *p, int bits) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)p);
    __m128i q = _mm_loadu_si128((const __m128i *)p);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
INLINE __m256i block_dot(const uint8_t *p, __m256i a, int bits) {
    __m256i q = block_codes(p, bits);
    if (bits == 4) return dot_u8s8(q, a);
    /* int8: |w| as u8 (|-128| = 128 fits), the sign moved onto the activation */
    return dot_u8s8(_mm256_abs_epi8(q), _mm256_sign_epi8(a, q));
}
#endif

/* out[m * os + r] for R weight rows × MT activation rows: weights are decoded once per
 * block and used for every activation row of the tile. */
INLINE void tile_dot(int R, int MT, int bits, const uint8_t *w, int64_t rb, const float *sc,
                     const float *zs, int ng, int bpg, const int8_t *x8, const float *dx,
                     const float *bs, int K, int nb, float *out, int64_t os) {
    const int bb = bits * 4; /* bytes per block of 32 */
#if defined(__AVX2__)
    __m256 acc[4][4];
    float zt[4][4];
    for (int r = 0; r < R; r++)
        for (int m = 0; m < MT; m++) acc[r][m] = _mm256_setzero_ps(), zt[r][m] = 0.f;
    for (int g = 0, b = 0; g < ng; g++) {
        __m256 gacc[4][4];
        float bz[4] = {0.f, 0.f, 0.f, 0.f};
        for (int r = 0; r < R; r++)
            for (int m = 0; m < MT; m++) gacc[r][m] = _mm256_setzero_ps();
        if (bits == 4 && bpg % 2 == 0) {
            /* Two blocks per step: one 32-byte load holds blocks b and b+1; its low nibbles
             * are inputs 0-15 of each block, its high nibbles inputs 16-31, so the
             * activations are regrouped the same way (two lane permutes) and one convert +
             * FMA serves both blocks (lanes 0-3: block b, lanes 4-7: block b+1). */
            const __m256i low = _mm256_set1_epi8(0x0F);
            for (int j = 0; j < bpg; j += 2, b += 2) {
                __m256i ql[4], qh[4];
                for (int r = 0; r < R; r++) {
                    const uint8_t *wp = w + r * rb + (int64_t)b * 16;
                    _mm_prefetch((const char *)(wp + 512), _MM_HINT_T0);
                    __m256i q = _mm256_loadu_si256((const __m256i *)wp);
                    ql[r] = _mm256_and_si256(q, low);
                    qh[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                }
                for (int m = 0; m < MT; m++) {
                    const int8_t *xm = x8 + (int64_t)m * K + b * 32;
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)xm);
                    __m256i x1 = _mm256_loadu_si256((const __m256i *)(xm + 32));
                    __m256i lo_x = _mm256_permute2x128_si256(x0, x1, 0x20);
                    __m256i hi_x = _mm256_permute2x128_si256(x0, x1, 0x31);
                    const float *dm = dx + (int64_t)m * nb + b;
                    __m256 d = _mm256_setr_m128(_mm_set1_ps(dm[0]), _mm_set1_ps(dm[1]));
                    bz[m] += bs[(int64_t)m * nb + b] + bs[(int64_t)m * nb + b + 1];
                    for (int r = 0; r < R; r++) {
                        __m256i p = _mm256_add_epi32(dot_u8s8(ql[r], lo_x), dot_u8s8(qh[r], hi_x));
                        gacc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, gacc[r][m]);
                    }
                }
            }
        } else {
            for (int j = 0; j < bpg; j++, b++)
                for (int m = 0; m < MT; m++) {
                    __m256i a = _mm256_loadu_si256((const __m256i *)(x8 + (int64_t)m * K + b * 32));
                    __m256 d = _mm256_set1_ps(dx[(int64_t)m * nb + b]);
                    bz[m] += bs[(int64_t)m * nb + b];
                    for (int r = 0; r < R; r++) {
                        __m256i p = block_dot(w + r * rb + (int64_t)b * bb, a, bits);
                        gacc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, gacc[r][m]);
                    }
                }
        }
        for (int r = 0; r < R; r++) {
            __m256 sg = _mm256_set1_ps(sc[r * ng + g]);
            for (int m = 0; m < MT; m++) {
                acc[r][m] = _mm256_fmadd_ps(gacc[r][m], sg, acc[r][m]);
                zt[r][m] += zs[r * ng + g] * bz[m];
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int m = 0; m < MT; m++) out[m * os + r] = hsum8(acc[r][m]) - zt[r][m];
#else
    for (int m = 0; m < MT; m++)
        for (int r = 0; r < R; r++) {
            const int8_t *xr = x8 + (int64_t)m * K;
            const float *dr = dx + (int64_t)m * nb, *br = bs + (int64_t)m * nb;
            float total = 0.f;
            for (int g = 0, b = 0; g < ng; g++) {
                float ga = 0.f, bz = 0.f;
                for (int j = 0; j < bpg; j++, b++) {
                    const uint8_t *p = w + r * rb + (int64_t)b * bb;
                    const int8_t *x = xr + b * 32;
                    int s = 0;
                    if (bits == 4)
                        for (int i = 0; i < 16; i++) s += (p[i] & 0x0F) * x[i] + (p[i] >> 4) * x[16 + i];
                    else
                        for (int i = 0; i < 32; i++) s += (int8_t)p[i] * x[i];
                    ga += s * dr[b];
                    bz += br[b];
                }
                total += ga * sc[r * ng + g] - zs[r * ng + g] * bz;
            }
            out[m * os + r] = total;
        }
#endif
}

/* One chunk of weight rows against every activation row: tiles of 4 rows at batch 1, of
 * 2 rows × 4 activation rows above (weights decoded once per 4 inputs). */
INLINE void chunk_dot(int bits, const uint8_t *w, int64_t rb, const float *sc, const float *zs,
                      int ng, int bpg, int rows, const int8_t *x8, const float *dx,
                      const float *bs, int M, int K, int nb, float *y, int64_t ys) {
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        const int8_t *xm = x8 + (int64_t)m * K;
        const float *dm = dx + (int64_t)m * nb, *bm = bs + (int64_t)m * nb;
        int r = 0;
        for (; r + 2 <= rows; r += 2)
            tile_dot(2, 4, bits, w + r * rb, rb, sc + r * ng, zs + r * ng, ng, bpg, xm, dm, bm,
                     K, nb, y + (int64_t)m * ys + r, ys);
        for (; r < rows; r++)
            tile_dot(1, 4, bits, w + r * rb, rb, sc + r * ng, zs + r * ng, ng, bpg, xm, dm, bm,
                     K, nb, y + (int64_t)m * ys + r, ys);
    }
    for (; m < M; m++) {
        const int8_t *xm = x8 + (int64_t)m * K;
        const float *dm = dx + (int64_t)m * nb, *bm = bs + (int64_t)m * nb;
        int r = 0;
        for (; r + 4 <= rows; r += 4)
            tile_dot(4, 1, bits, w + r * rb, rb, sc + r * ng, zs + r * ng, ng, bpg, xm, dm, bm,
                     K, nb, y + (int64_t)m * ys + r, ys);
        for (; r < rows; r++)
            tile_dot(1, 1, bits, w + r * rb, rb, sc + r * ng, zs + r * ng, ng, bpg, xm, dm, bm,
                     K, nb, y + (int64_t)m * ys + r, ys);
    }
}

/* Rows are split into chunks of CHUNK per thread task; each chunk runs all M inputs. */
#define CHUNK 16
#define DEFINE_GEMM(BITS)                                                                     \
void llmp_gemm_q##BITS(const int8_t *x8, const float *dx, const float *bsum, int M, int K,   \
                       int G, const uint8_t *w, const float *scale, const float *zs, int N,  \
                       float *y) {                                                            \
    int nb = K / 32, ng = K / G, bpg = G / 32;                                                \
    int64_t rb = (int64_t)K * BITS / 8;                                                       \
    int chunks = (N + CHUNK - 1) / CHUNK;                                                     \
    _Pragma("omp parallel for schedule(static)")                                              \
    for (int c = 0; c < chunks; c++) {                                                        \
        int n0 = c * CHUNK, rows = N - n0 < CHUNK ? N - n0 : CHUNK;                           \
        chunk_dot(BITS, w + n0 * rb, rb, scale + (int64_t)n0 * ng, zs + (int64_t)n0 * ng,     \
                  ng, bpg, rows, x8, dx, bsum, M, K, nb, y + n0, N);                          \
    }                                                                                         \
}

DEFINE_GEMM(4)
DEFINE_GEMM(8)

/* The dense fp32 weight, for the exact (large-batch) path. */
void llmp_dequant_q4(const uint8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out) {
    int ng = K / G;  /* G is a multiple of 32: one group per block */
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t *wr = w + (int64_t)n * (K / 2);
        float *o = out + (int64_t)n * K;
        for (int b = 0; b < K / 32; b++) {
            int64_t g = (int64_t)n * ng + b * 32 / G;
            float s = scale[g], z = zs[g];
            for (int j = 0; j < 16; j++) {
                uint8_t byte = wr[b * 16 + j];
                o[b * 32 + j] = (byte & 0x0F) * s - z;
                o[b * 32 + 16 + j] = (byte >> 4) * s - z;
            }
        }
    }
}

void llmp_dequant_q8(const int8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out) {
    int ng = K / G;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int b = 0; b < K / 32; b++) {
            int64_t g = (int64_t)n * ng + b * 32 / G;
            for (int j = 0; j < 32; j++) {
                int64_t k = (int64_t)n * K + b * 32 + j;
                out[k] = w[k] * scale[g] - zs[g];
            }
        }
}

#ifdef _OPENMP
#include <omp.h>
#endif
void llmp_set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    (void)n;
}

/* Fused elementwise steps of a decode layer: one call each instead of several torch ops,
 * whose per-op overhead dominates a 135M-parameter model's decode step. */

/* out[m] = x[m] * rsqrt(mean(x[m]^2) + eps) * w, written to `out` [M, Kp] (zero padded to
 * Kp) and quantized into x8/dx/bsum. */
void llmp_rmsnorm_quant(const float *x, const float *w, float eps, int M, int K, int Kp,
                        float *out, int8_t *x8, float *dx, float *bsum) {
    for (int m = 0; m < M; m++) {
        const float *xr = x + (int64_t)m * K;
        float *o = out + (int64_t)m * Kp;
        double ss = 0.0;
        for (int k = 0; k < K; k++) ss += (double)xr[k] * xr[k];
        float r = 1.f / sqrtf((float)(ss / K) + eps);
        for (int k = 0; k < K; k++) o[k] = xr[k] * r * w[k];
        for (int k = K; k < Kp; k++) o[k] = 0.f;
        quantize_row(o, Kp, x8 + (int64_t)m * Kp, dx + (int64_t)m * (Kp / 32), bsum + (int64_t)m * (Kp / 32));
    }
}

/* gu [M, 2I] = [gate | up] -> out [M, Ip] = silu(gate) * up (zero padded), quantized. */
void llmp_silu_mul_quant(const float *gu, int M, int I, int Ip, float *out, int8_t *x8,
                         float *dx, float *bsum) {
    for (int m = 0; m < M; m++) {
        const float *g = gu + (int64_t)m * 2 * I, *u = g + I;
        float *o = out + (int64_t)m * Ip;
        for (int i = 0; i < I; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
        for (int i = I; i < Ip; i++) o[i] = 0.f;
        quantize_row(o, Ip, x8 + (int64_t)m * Ip, dx + (int64_t)m * (Ip / 32), bsum + (int64_t)m * (Ip / 32));
    }
}

/* Rotary embedding in place, rotate-half convention: x [T, heads, D] at positions [T];
 * cos/sin tables [max_len, D/2]. */
void llmp_rope(float *x, const int64_t *positions, const float *cos_t, const float *sin_t,
               int T, int heads, int D) {
    int half = D / 2;
    for (int t = 0; t < T; t++) {
        const float *c = cos_t + positions[t] * half, *s = sin_t + positions[t] * half;
        for (int h = 0; h < heads; h++) {
            float *v = x + ((int64_t)t * heads + h) * D;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/* One decode step of attention over an fp32 cache [slots, kv_heads, cap, D] (one layer):
 * writes each sequence's new k/v [B, kv_heads, D] at its position, then attends its query
 * heads q [B, heads, D] over positions 0..position. out [B, heads, D]. */
void llmp_decode_attention_f32(const float *q, const float *knew, const float *vnew,
                               float *kc, float *vc, int cap, const int64_t *slots,
                               const int64_t *positions, int B, int H, int KVH, int D,
                               float *out) {
    int rep = H / KVH;
    float scale = 1.f / sqrtf((float)D);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < KVH; g++) {
            int64_t base = (slots[b] * KVH + g) * (int64_t)cap * D;
            memcpy(kc + base + positions[b] * D, knew + ((int64_t)b * KVH + g) * D, D * sizeof(float));
            memcpy(vc + base + positions[b] * D, vnew + ((int64_t)b * KVH + g) * D, D * sizeof(float));
        }
    #pragma omp parallel for schedule(static) collapse(2) if (B * H > 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / rep, L = (int)positions[b] + 1;
            int64_t base = (slots[b] * KVH + g) * (int64_t)cap * D;
            const float *qh = q + ((int64_t)b * H + h) * D;
            float *o = out + ((int64_t)b * H + h) * D;
            float m = -INFINITY, l = 0.f;
            for (int d = 0; d < D; d++) o[d] = 0.f;
            for (int t = 0; t < L; t++) {
                const float *kt = kc + base + (int64_t)t * D, *vt = vc + base + (int64_t)t * D;
                float s = 0.f;
                for (int d = 0; d < D; d++) s += qh[d] * kt[d];
                s *= scale;
                if (s > m) {  /* rescale what was accumulated under the old maximum */
                    float a = expf(m - s);
                    l *= a;
                    for (int d = 0; d < D; d++) o[d] *= a;
                    m = s;
                }
                float p = expf(s - m);
                l += p;
                for (int d = 0; d < D; d++) o[d] += p * vt[d];
            }
            for (int d = 0; d < D; d++) o[d] /= l;
        }
}

/* ---- The whole decode step of a layer stack in one call ------------------------------
 * For models whose block linears are all packed (no outlier columns, no biases) and whose
 * KV cache is fp32: Python's per-operation overhead is then paid once per step instead of
 * some forty times per layer. Same arithmetic as the per-op path. */

typedef struct {
    const uint8_t *w;
    const float *scale, *zs;
    int n, k, g, bits;  /* k: padded input width the codes were packed for */
    const int32_t *oidx; /* LLM.int8()-style outlier input columns (their codes are zero) */
    const float *ow;     /* and their weights [n, n_out], kept in full precision */
    int n_out;
} QLin;

typedef struct {
    const float *attn_norm, *mlp_norm;
    QLin qkv, o, gate_up, down;
} QLayer;

/* y [M, n] = x @ W.T; x both quantized (x8/dx/bs) and in fp32 (xf, row stride ld) for the
 * outlier columns. */
static void qlin(const QLin *l, int8_t *x8, float *dx, float *bs, int M, float *y,
                 const float *xf, int ld) {
    if (l->n_out > 0) {  /* requantize without the outlier columns: they would set the
                            activation scales of their blocks and crush the other values */
        float *row = (float *)malloc((size_t)l->k * sizeof(float));
        for (int m = 0; m < M; m++) {
            memcpy(row, xf + (int64_t)m * ld, (size_t)l->k * sizeof(float));
            for (int j = 0; j < l->n_out; j++) row[l->oidx[j]] = 0.f;
            quantize_row(row, l->k, x8 + (int64_t)m * l->k, dx + (int64_t)m * (l->k / 32),
                         bs + (int64_t)m * (l->k / 32));
        }
        free(row);
    }
    if (l->bits == 4)
        llmp_gemm_q4(x8, dx, bs, M, l->k, l->g, l->w, l->scale, l->zs, l->n, y);
    else
        llmp_gemm_q8(x8, dx, bs, M, l->k, l->g, (const uint8_t *)l->w, l->scale, l->zs, l->n, y);
    if (l->n_out == 0) return;
    for (int m = 0; m < M; m++) {
        const float *xr = xf + (int64_t)m * ld;
        float *yr = y + (int64_t)m * l->n;
        #pragma omp parallel for schedule(static) if (l->n > 256)
        for (int n = 0; n < l->n; n++) {
            const float *w = l->ow + (int64_t)n * l->n_out;
            float acc = 0.f;
            for (int j = 0; j < l->n_out; j++) acc += xr[l->oidx[j]] * w[j];
            yr[n] += acc;
        }
    }
}

static void quantize_rows_padded(const float *x, int M, int K, int ld, int Kp, float *pad,
                                 int8_t *x8, float *dx, float *bs) {
    for (int m = 0; m < M; m++) {
        float *o = pad + (int64_t)m * Kp;
        memcpy(o, x + (int64_t)m * ld, K * sizeof(float));
        for (int k = K; k < Kp; k++) o[k] = 0.f;
        quantize_row(o, Kp, x8 + (int64_t)m * Kp, dx + (int64_t)m * (Kp / 32), bs + (int64_t)m * (Kp / 32));
    }
}

void llmp_decode_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden,
                        int heads, int kv_heads, int D, int inter, float eps,
                        const float *cos_t, const float *sin_t, float *kc, float *vc, int cap,
                        int64_t layer_stride, const int64_t *slots, const int64_t *positions) {
    int hp = (hidden + 31) / 32 * 32, ap = (heads * D + 31) / 32 * 32, ip = (inter + 31) / 32 * 32;
    int widest = hp > ap ? hp : ap;
    widest = widest > ip ? widest : ip;
    int nqkv = (heads + 2 * kv_heads) * D;
    /* one workspace for the step: fp32 rows, block scales and sums, projections, int8 codes */
    int64_t floats = (int64_t)B * (widest + 2 * (widest / 32) + 2 * nqkv + heads * D + 2 * inter + hidden)
                     + (int64_t)B * widest / 4 + 16;
    float *work = (float *)malloc((size_t)floats * sizeof(float));
    if (work == NULL) return;
    float *pad = work;
    float *dx = pad + (int64_t)B * widest;
    float *bs = dx + (int64_t)B * (widest / 32);
    float *qkv = bs + (int64_t)B * (widest / 32);
    float *att = qkv + (int64_t)B * nqkv;
    float *gu = att + (int64_t)B * heads * D;
    float *tmp = gu + (int64_t)B * 2 * inter;
    int8_t *x8 = (int8_t *)(tmp + (int64_t)B * hidden);
    float *q = (float *)(x8 + (int64_t)B * widest);  /* contiguous q, k, v for attention */
    float *kn = q + (int64_t)B * heads * D;
    float *vn = kn + (int64_t)B * kv_heads * D;
    for (int l = 0; l < n_layers; l++) {
        const QLayer *L = layers + l;
        llmp_rmsnorm_quant(h, L->attn_norm, eps, B, hidden, hp, pad, x8, dx, bs);
        qlin(&L->qkv, x8, dx, bs, B, qkv, pad, hp);
        for (int b = 0; b < B; b++) {
            const float *row = qkv + (int64_t)b * nqkv;
            memcpy(q + (int64_t)b * heads * D, row, heads * D * sizeof(float));
            memcpy(kn + (int64_t)b * kv_heads * D, row + heads * D, kv_heads * D * sizeof(float));
            memcpy(vn + (int64_t)b * kv_heads * D, row + (heads + kv_heads) * D, kv_heads * D * sizeof(float));
        }
        llmp_rope(q, positions, cos_t, sin_t, B, heads, D);
        llmp_rope(kn, positions, cos_t, sin_t, B, kv_heads, D);
        llmp_decode_attention_f32(q, kn, vn, kc + l * layer_stride, vc + l * layer_stride, cap,
                                  slots, positions, B, heads, kv_heads, D, att);
        quantize_rows_padded(att, B, heads * D, heads * D, ap, pad, x8, dx, bs);
        qlin(&L->o, x8, dx, bs, B, tmp, pad, ap);
        for (int64_t i = 0; i < (int64_t)B * hidden; i++) h[i] += tmp[i];
        llmp_rmsnorm_quant(h, L->mlp_norm, eps, B, hidden, hp, pad, x8, dx, bs);
        qlin(&L->gate_up, x8, dx, bs, B, gu, pad, hp);
        llmp_silu_mul_quant(gu, B, inter, ip, pad, x8, dx, bs);
        qlin(&L->down, x8, dx, bs, B, tmp, pad, ip);
        for (int64_t i = 0; i < (int64_t)B * hidden; i++) h[i] += tmp[i];
    }
    free(work);
}
