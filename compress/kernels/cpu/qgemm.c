/* Packed int4 / int8 matrix multiply, fused elementwise steps and decode attention for the
 * CPU runtime.
 *
 * Why: torch's packed CPU kernels reach 2-6 GB/s on AVX2 machines, far below memory
 * bandwidth, and its per-op overhead dominates a small model's decode step. Here
 * activations are quantized per block of 32 to int8 (one scale each), and the dot products
 * with the weights are done in integer SIMD (u8 x s8 -> s32), then scaled in float.
 * Weights stay packed, in a panel layout made for batched decode (see "Panel layout").
 *
 * Layouts (K is padded to a multiple of 32 by the caller, padding holds zero activations):
 *   weights      panels of 8 output columns (below); w = code * scale - zs, zs = (zero
 *                point + offset) * scale; int4 codes unsigned 0..15, int8 codes signed.
 *   activations  x8 int8 [M, K], dx float [M, K/32], bsum float [M, K/32] (each block's sum
 *                of its quantized values, for the zero-point term: the product is then
 *                exactly sum(w * x_quantized), so the offset in code * scale adds no error).
 * G is a multiple of 32. Instruction paths: AVX-VNNI or AVX512-VNNI (dpbusd), AVX2
 * (maddubs + madd), and portable C; the build picks by -march=native and tests build all.
 * With AVX-512 VNNI, batches (int4: more than one row; int8: any) run pairs of tiles in
 * 512-bit vectors (pair_tile), column for column the same arithmetic.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX2__)
static inline __attribute__((always_inline)) float hsum8(__m256 v) {
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

#if defined(__AVX2__)
static inline __attribute__((always_inline)) float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) in lanes of V (intrinsics prefix P): 2^n * p(r) with r = x - n ln2 in
 * [-ln2/2, ln2/2] and p the degree-5 minimax polynomial of Cephes' expf (relative error
 * ~2e-7). NaN stays NaN. One definition for every width, so each lane's bits are the
 * same whatever the width that computes it. */
#define DEFINE_EXP(NAME, V, VI, P, ROUND, CAST)                                              \
    static inline __attribute__((always_inline)) V NAME(V x) {                               \
        x = P##_max_ps(P##_set1_ps(-87.3f), P##_min_ps(P##_set1_ps(88.3f), x));              \
        V n = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504089f)),                               \
                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                           \
        V r = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                 \
        r = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), r);                                \
        V p = P##_set1_ps(1.9875691500e-4f);                                                  \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.3981999507e-3f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(8.3334519073e-3f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(4.1665795894e-2f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.6666665459e-1f));                                \
        p = P##_fmadd_ps(p, r, P##_set1_ps(5.0000001201e-1f));                                \
        p = P##_fmadd_ps(p, P##_mul_ps(r, r), P##_add_ps(r, P##_set1_ps(1.f)));               \
        VI e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23);    \
        return P##_mul_ps(p, CAST(e));                                                        \
    }
DEFINE_EXP(exp8, __m256, __m256i, _mm256, _mm256_round_ps, _mm256_castsi256_ps)
#if defined(__AVX512F__)
DEFINE_EXP(exp16, __m512, __m512i, _mm512, _mm512_roundscale_ps, _mm512_castsi512_ps)
#endif
#endif

/* Row-major codes q [n, k] (plus offset; int4 codes unsigned 0..15 after it) into the
 * kernels' panel layout: tiles of 8 output rows, each block of 32 inputs as quads of 4
 * inputs for each of the 8 rows; int4 holds the block's inputs i and i + 16 in one byte's
 * low and high nibbles. Inputs past k are code 0 (plus offset), rows past n zero bytes,
 * as cpu.to_panels lays them out. Loading a model's linears this way instead of through
 * torch's pads and permutes took a third of a Mixture-of-Experts artifact's load. */
void llmp_to_panels(const int8_t *q, int64_t n, int k, int kp, int bits, int offset, void *out) {
    int64_t tiles = (n + 7) / 8;
    int nb = kp / 32;
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        for (int b = 0; b < nb; b++) {
            for (int c = 0; c < 8; c++) {
                int64_t row = t * 8 + c;
                int8_t v[32];
                for (int i = 0; i < 32; i++) {
                    int idx = b * 32 + i;
                    v[i] = row < n ? (int8_t)((idx < k ? q[row * k + idx] : 0) + offset) : 0;
                }
                if (bits == 4) {
                    uint8_t *o = (uint8_t *)out + (t * nb + b) * 128;
                    for (int j = 0; j < 4; j++)
                        for (int kk = 0; kk < 4; kk++)
                            o[(j * 8 + c) * 4 + kk] =
                                (uint8_t)((v[j * 4 + kk] & 15) | (v[16 + j * 4 + kk] << 4));
                } else {
                    int8_t *o = (int8_t *)out + (t * nb + b) * 256;
                    for (int j = 0; j < 8; j++)
                        for (int kk = 0; kk < 4; kk++) o[(j * 8 + c) * 4 + kk] = v[j * 4 + kk];
                }
            }
        }
    }
}

/* The largest of x[0..n) (-inf for none), and whether any is NaN (then the maximum is
 * not to be used). */
static float row_max(const float *x, int64_t n, int *nan) {
    int64_t i = 0;
    float m = -INFINITY;
    *nan = 0;
#if defined(__AVX2__)
    if (n >= 8) {
        __m256 mx = _mm256_set1_ps(-INFINITY), un = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            mx = _mm256_max_ps(mx, v);
        }
        *nan = _mm256_movemask_ps(un) != 0;
        m = hmax8(mx);
    }
#endif
    for (; i < n; i++) {
        *nan |= x[i] != x[i];
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* The index of the largest of x [n], the first on ties and the first NaN if any, as
 * torch.argmax: greedy decoding's choice, which torch takes 70-90 us for over a 49k-word
 * vocabulary on two cores (a thread team woken for one reduction). Vectorized: the
 * maximum (and whether any NaN) in one pass, then its first index, eight at a time
 * (compared one by one: 25 us of a 49k-word row here, now 8). */
int64_t llmp_argmax(const float *x, int64_t n) {
    int nan;
    float m = row_max(x, n, &nan);
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256 mv = _mm256_set1_ps(m); /* its first index, eight at a time */
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        int hit = _mm256_movemask_ps(nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q)
                                         : _mm256_cmp_ps(v, mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz(hit);
    }
#endif
    for (; i < n; i++)
        if (nan ? x[i] != x[i] : x[i] == m) return i;
    return 0;
}


/* ---- A step's token choices in one call ---------------------------------------------
 * Per row: greedy (it[r] == 0) is llmp_argmax; sampled is the first token whose running
 * total of exp((x - max) * it) exceeds u[r] times the row's total (it: 1 / temperature;
 * u uniform in [0, 1)), so a token of weight 0 is never drawn. Per row and token this is
 * compress/draw.py's inverse cumulative over the tempered exponentials, with the
 * exponentials in float32 (exp8: relative error ~2e-7) where torch took float64: a
 * sampled batch-32 step spent a fifth of its time in 32 rows' tensor operations. Weights
 * are summed in blocks of 64 in a fixed order, block totals in float64. out[r] = -1: no
 * token can be drawn (NaN, +inf, or all -inf). */
#define DRAW_BLOCK 64

/* Weights of one block (64 logits from x, `n` <= 64 real) into w, and their float64 sum. */
static double draw_block(const float *x, int n, float m, float it, float *w) {
    float pad[DRAW_BLOCK]; /* the last block: -inf (weight 0) past the vocabulary */
    const float *t = x;
    if (n < DRAW_BLOCK) {
        for (int i = 0; i < DRAW_BLOCK; i++) pad[i] = i < n ? x[i] : -INFINITY;
        t = pad;
    }
#if defined(__AVX2__)
    const __m256 mv = _mm256_set1_ps(m), iv = _mm256_set1_ps(it), lo = _mm256_set1_ps(-87.f);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (int i = 0; i < DRAW_BLOCK; i += 8) {
        __m256 a = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(t + i), mv), iv);
        /* below e^-87 (and -inf): weight 0, not exp8's clamped e^-87.3 */
        __m256 e = _mm256_and_ps(exp8(a), _mm256_cmp_ps(a, lo, _CMP_GT_OQ));
        _mm256_storeu_ps(w + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double l[4];
    _mm256_storeu_pd(l, _mm256_add_pd(s0, s1));
    return (l[0] + l[2]) + (l[1] + l[3]);
#else
    double sum = 0.0;
    for (int i = 0; i < DRAW_BLOCK; i++) {
        float a = (t[i] - m) * it;
        w[i] = a > -87.f ? expf(a) : 0.f;
        sum += w[i];
    }
    return sum;
#endif
}

/* The k-th largest of x[0..n) (k <= n, no NaN): a min-heap of the k largest so far, most
 * values turned away by one comparison with its top. */
static float kth_largest(const float *x, int64_t n, int64_t k, float *heap) {
    int64_t size = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (size == k) {
            if (v <= heap[0]) continue;
            int64_t j = 0; /* replace the top, sift down */
            for (;;) {
                int64_t c = 2 * j + 1;
                if (c >= k) break;
                if (c + 1 < k && heap[c + 1] < heap[c]) c++;
                if (heap[c] >= v) break;
                heap[j] = heap[c], j = c;
            }
            heap[j] = v;
        } else {
            int64_t j = size++; /* append, sift up */
            while (j > 0 && heap[(j - 1) / 2] > v) heap[j] = heap[(j - 1) / 2], j = (j - 1) / 2;
            heap[j] = v;
        }
    }
    return heap[0];
}

static int desc_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

#define NUCLEUS_BUCKETS 4096 /* by a positive float's top 12 bits: 1/16 of an octave each */

/* top-p's cut: the weights w[0..n) (>= 0) sorted from the largest, the fewest whose sum
 * reaches p * total are kept (sampling.probabilities: a token is kept while the mass
 * before it is under p). Returns the smallest kept weight; *ties: how many tokens of
 * exactly that weight are kept (the first by index); *kept: the kept weights' sum. Found
 * from a histogram of the weights' mass and a sort of the one bucket the cut falls in,
 * not a sort of the vocabulary (torch's sort was 4 ms a 49k row). */
static float nucleus(const float *w, int64_t n, double p, double total, int64_t *ties,
                     double *kept, double *mass, int64_t *count, float *pool) {
    memset(mass, 0, sizeof(double) * NUCLEUS_BUCKETS);
    memset(count, 0, sizeof(int64_t) * NUCLEUS_BUCKETS);
    for (int64_t i = 0; i < n; i++) {
        if (w[i] <= 0.f) continue;
        uint32_t bits;
        memcpy(&bits, w + i, 4);
        mass[bits >> 20] += w[i], count[bits >> 20]++;
    }
    double goal = p * total, before = 0.0;
    int b = -1, last = -1;
    for (int c = NUCLEUS_BUCKETS - 1; c >= 0; c--) {
        if (!count[c]) continue;
        last = c;
        if (before + mass[c] >= goal) {
            b = c;
            break;
        }
        before += mass[c];
    }
    if (b < 0) b = last, before -= mass[last]; /* rounding kept the goal out of reach */
    int64_t m = 0; /* the bucket's weights, from the largest */
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, w + i, 4);
        if (w[i] > 0.f && (int)(bits >> 20) == b) pool[m++] = w[i];
    }
    qsort(pool, (size_t)m, sizeof(float), desc_float);
    int64_t j = 0;
    double run = before;
    for (; j < m; j++) { /* kept while the mass before it is under the goal */
        if (run >= goal && j > 0) break;
        run += pool[j];
    }
    float cut = pool[j - 1];
    int64_t t = 0;
    for (int64_t i = 0; i < j; i++) t += pool[i] == cut;
    *ties = t, *kept = run;
    return cut;
}

/* A sampled row: sampling.probabilities' distribution (top-k where k > 0, top-p where
 * p < 1) drawn by the inverse cumulative in index order. Without a top-p cut every
 * weighted token is kept, and the draw skips whole blocks by their totals. scratch: the
 * weights (whole blocks of 64), k or a bucket's weights (vocab), the histogram; totals:
 * a float64 a block. */
static int64_t draw_row(const float *x, int64_t vocab, float it, int64_t k, double p,
                        double u, float *scratch, double *totals) {
    int bad;
    float m = row_max(x, vocab, &bad);
    if (bad || m == INFINITY || m == -INFINITY) return -1;
    int64_t nb = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK;
    float *w = scratch, *pool = scratch + nb * DRAW_BLOCK;
    float floor = k > 0 && k < vocab ? kth_largest(x, vocab, k, pool) : -INFINITY;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) { /* the tempered weights, less those under the k-th */
        int n = vocab - b * DRAW_BLOCK < DRAW_BLOCK ? (int)(vocab - b * DRAW_BLOCK) : DRAW_BLOCK;
        float *wb = w + b * DRAW_BLOCK;
        totals[b] = draw_block(x + b * DRAW_BLOCK, n, m, it, wb);
        if (floor > -INFINITY) {
            totals[b] = 0.0;
            for (int i = 0; i < n; i++)
                totals[b] += wb[i] = x[b * DRAW_BLOCK + i] >= floor ? wb[i] : 0.f;
        }
        total += totals[b];
    }
    float cut = 0.f;
    int64_t ties = 0, limited = p < 1.0; /* then only the first `ties` tokens of weight `cut` */
    if (limited) {
        double *mass = (double *)(pool + (vocab + 1) / 2 * 2); /* 8-byte aligned */
        int64_t *count = (int64_t *)(mass + NUCLEUS_BUCKETS);
        cut = nucleus(w, vocab, p, total, &ties, &total, mass, count, pool);
    }
    double target = u * total;
    if (target >= total) target = nextafter(total, 0.0);
    double run = 0.0;
    int64_t start = 0;
    if (!limited) { /* the block the target falls in (a rounding miss: the last weighted) */
        int64_t b = 0, last = 0;
        for (; b < nb; b++) {
            if (totals[b] > 0) last = b;
            if (run + totals[b] > target) break;
            run += totals[b];
        }
        if (b == nb) b = last, run = total - totals[last];
        start = b * DRAW_BLOCK;
    }
    int64_t pick = -1;
    for (int64_t i = start; i < vocab; i++) {
        float v = w[i];
        if (v <= 0.f || v < cut) continue;
        if (limited && v == cut) {
            if (ties == 0) continue;
            ties--;
        }
        pick = i;
        run += v;
        if (run > target) break;
    }
    return pick;
}

void llmp_choose_tokens(const float *logits, int64_t rows, int64_t vocab, const float *it,
                        const int64_t *top_k, const double *top_p, const double *u,
                        int64_t *out) {
    int64_t nb = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK;
    int sampled = 0;
    for (int64_t r = 0; r < rows; r++) sampled |= it[r] != 0.f;
    #pragma omp parallel if (rows > 1)
    {
        /* weights, the k largest or a bucket's weights, and the histogram (8-byte aligned) */
        size_t room = (size_t)(nb * DRAW_BLOCK + vocab) + 4 * NUCLEUS_BUCKETS + 2;
        float *scratch = sampled ? malloc(sizeof(float) * room) : NULL;
        double *totals = sampled ? malloc(sizeof(double) * (size_t)nb) : NULL;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *x = logits + r * vocab;
            if (it[r] == 0.f)
                out[r] = llmp_argmax(x, vocab);
            else
                out[r] = scratch && totals
                             ? draw_row(x, vocab, it[r], top_k[r], top_p[r], u[r], scratch, totals)
                             : -2;
        }
        free(scratch), free(totals);
    }
}

/* One row as int8 blocks of 32: codes round(x * 127 / absmax), the block's scale and the
 * scale times the codes' sum. */
static void quantize_row(const float *xr, int K, int8_t *qr, float *dr, float *bs) {
    for (int b = 0; b < K / 32; b++) {
        const float *xb = xr + b * 32;
#if defined(__AVX2__)
        const __m256 sign = _mm256_set1_ps(-0.f);
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        float amax = hmax8(mx);
        float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        __m256 s = _mm256_set1_ps(inv);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[i] = _mm256_cvtps_epi32(r);
            sum = _mm256_add_epi32(sum, q[i]);
        }
        /* packs interleave 128-bit lanes; the permute puts the 32 codes back in order */
        __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qr + b * 32), p8);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        dr[b] = d;
        bs[b] = d * (float)_mm_cvtsi128_si32(s4);
#else
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
#endif
    }
}

void llmp_quantize_rows(const float *x, int M, int K, int8_t *x8, float *dx, float *bsum) {
    int nb = K / 32;
    #pragma omp parallel for schedule(static) if (M > 4)
    for (int m = 0; m < M; m++)
        quantize_row(x + (int64_t)m * K, K, x8 + (int64_t)m * K, dx + (int64_t)m * nb, bsum + (int64_t)m * nb);
}

#define INLINE static inline __attribute__((always_inline))

/* ---- Panel layout and the GEMM over it ---------------------------------------------
 * Weights are repacked once at load into tiles of 8 output columns. Within a tile, each
 * block of 32 inputs is stored as quads (4 consecutive inputs) of all 8 columns: 32 bytes
 * [col 0: k0..k3 | col 1: k0..k3 | ... | col 7: k0..k3], the operand layout of a u8 x s8
 * dot product that sums 4 products into one 32-bit lane per column. A quad of one row's
 * activations is then a single 32-bit broadcast: each weight vector, unpacked once, serves
 * every activation row of the tile with no shuffles, and each output column stays in its
 * own lane (no horizontal sums).
 *   int4: 128 bytes per (tile, block): vector j (0..3) holds quad j in its low nibbles and
 *         quad j+4 in its high nibbles; codes unsigned 0..15.
 *   int8: 256 bytes per (tile, block): vector q holds quad q; codes signed.
 *   scale, zs: float [tiles, K/G, 8]; columns past N are zero. zs may be NULL: symmetric
 *         codes, zs = offset * scale (8 for int4, 0 for int8), 4 bytes per group not read.
 * int4 without VNNI: u8 x s8 pair sums (|.| <= 2*15*127) add up in int16 over a whole
 * block (8 pairs: <= 30480, no saturation), then one madd per block widens them.
 */
#define TW 8
#define MT_MAX 4
#define DENSE_MT 8 /* rows the dense GEMV reads its weights once for */
/* Software prefetch of every line of a block, PF_DIST bytes ahead: the hardware prefetcher
 * alone left a thread's loads waiting on DRAM between blocks (on a Zen 3 EPYC one thread
 * streamed 7.4 GB/s against a plain sum's 10-11; prefetching both lines of each int4
 * block 2 KB ahead: 11.1). One line of each block, or 256 bytes ahead, did not help. */
#define PF_DIST 2048
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define PREFETCH2(p) (PREFETCH(p), PREFETCH((const char *)(p) + 64))

#if defined(__AVX2__)
INLINE __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
#endif

/* y[m, 0..cols) for MT activation rows against one tile of 8 columns. */
INLINE void panel_tile(int MT, int bits, const uint8_t *wt, const float *sc, const float *zs,
                       int ng, int bpg, const int8_t *x8, const float *dx, const float *bs,
                       int K, int nb, float *y, int64_t ys, int cols) {
#if defined(__AVX2__)
    __m256 acc[MT_MAX];
    for (int m = 0; m < MT; m++) acc[m] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256 offset = _mm256_set1_ps(bits == 4 ? 8.f : 0.f);
#if !(defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int g = 0, b = 0; g < ng; g++) {
        __m256 gacc[MT_MAX];
        float bz[MT_MAX];
        for (int m = 0; m < MT; m++) gacc[m] = _mm256_setzero_ps(), bz[m] = 0.f;
        for (int j = 0; j < bpg; j++, b++) {
            __m256i ai[MT_MAX];
            for (int m = 0; m < MT; m++) ai[m] = _mm256_setzero_si256();
            if (bits == 4) {
                const uint8_t *wb = wt + (int64_t)b * 128;
                PREFETCH2(wb + PF_DIST);
#pragma GCC unroll 1 /* unrolled, gcc computes all 32 products before adding: spills */
                for (int v = 0; v < 4; v++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(wb + 32 * v));
                    __m256i lo = _mm256_and_si256(raw, low);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                    for (int m = 0; m < MT; m++) {
                        const int8_t *xq = x8 + (int64_t)m * K + b * 32 + 4 * v;
                        __m256i xa = bcast4(xq), xb = bcast4(xq + 16);
#if defined(__AVXVNNI__)
                        ai[m] = _mm256_dpbusd_avx_epi32(ai[m], lo, xa);
                        ai[m] = _mm256_dpbusd_avx_epi32(ai[m], hi, xb);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
                        ai[m] = _mm256_dpbusd_epi32(ai[m], lo, xa);
                        ai[m] = _mm256_dpbusd_epi32(ai[m], hi, xb);
#else
                        ai[m] = _mm256_add_epi16(ai[m], _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb)));
#endif
                    }
                }
#if !(defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
                for (int m = 0; m < MT; m++) ai[m] = _mm256_madd_epi16(ai[m], ones);
#endif
            } else {
                const uint8_t *wb = wt + (int64_t)b * 256;
                PREFETCH2(wb + PF_DIST);
                PREFETCH2(wb + PF_DIST + 128);
#pragma GCC unroll 1
                for (int q = 0; q < 8; q++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * q));
                    __m256i u = _mm256_abs_epi8(w); /* |w| as u8, the sign moved onto x */
                    for (int m = 0; m < MT; m++) {
                        __m256i xa = bcast4(x8 + (int64_t)m * K + b * 32 + 4 * q);
                        ai[m] = _mm256_add_epi32(ai[m], dot_u8s8(u, _mm256_sign_epi8(xa, w)));
                    }
                }
            }
            for (int m = 0; m < MT; m++) {
                __m256 d = _mm256_set1_ps(dx[(int64_t)m * nb + b]);
                gacc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[m]), d, gacc[m]);
                bz[m] += bs[(int64_t)m * nb + b];
            }
        }
        __m256 s = _mm256_loadu_ps(sc + g * TW);
        if (zs) {
            __m256 z = _mm256_loadu_ps(zs + g * TW);
            for (int m = 0; m < MT; m++) {
                acc[m] = _mm256_fmadd_ps(gacc[m], s, acc[m]);
                acc[m] = _mm256_fnmadd_ps(z, _mm256_set1_ps(bz[m]), acc[m]);
            }
        } else { /* symmetric: zs = offset * scale, folded into the group sum */
            for (int m = 0; m < MT; m++)
                acc[m] = _mm256_fmadd_ps(
                    _mm256_fnmadd_ps(_mm256_set1_ps(bz[m]), offset, gacc[m]), s, acc[m]);
        }
    }
    for (int m = 0; m < MT; m++) {
        if (cols == TW) {
            _mm256_storeu_ps(y + m * ys, acc[m]);
        } else {
            float t[TW];
            _mm256_storeu_ps(t, acc[m]);
            memcpy(y + m * ys, t, (size_t)cols * sizeof(float));
        }
    }
#else
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
#endif
}

/* One activation row (batch-1 decode) against one int4 tile: panel_tile's arithmetic with
 * its loops unrolled, which panel_tile cannot afford at four rows (spills). Interleaved in
 * one process on an AVX2 EPYC: 3-7% faster from memory, 35-45% from cache. */
INLINE void row_tile_q4(const uint8_t *wt, const float *sc, const float *zs, int ng, int bpg,
                        const int8_t *x8, const float *dx, const float *bs, float *y, int cols) {
#if defined(__AVX2__)
    const __m256i low = _mm256_set1_epi8(0x0F);
#if !(defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    __m256 acc = _mm256_setzero_ps();
    for (int g = 0, b = 0; g < ng; g++) {
        __m256 gacc = _mm256_setzero_ps();
        float bz = 0.f;
        for (int j = 0; j < bpg; j++, b++) {
            const uint8_t *wb = wt + (int64_t)b * 128;
            /* two sums (low and high nibbles): two dependency chains of 4 instead of one of
             * 8, so the block's products are not a chain of latencies (integer: exact) */
            __m256i al = _mm256_setzero_si256(), ah = _mm256_setzero_si256();
            PREFETCH2(wb + PF_DIST);
            for (int v = 0; v < 4; v++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(wb + 32 * v));
                __m256i lo = _mm256_and_si256(raw, low);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                __m256i xa = bcast4(x8 + b * 32 + 4 * v), xb = bcast4(x8 + b * 32 + 16 + 4 * v);
#if defined(__AVXVNNI__)
                al = _mm256_dpbusd_avx_epi32(al, lo, xa);
                ah = _mm256_dpbusd_avx_epi32(ah, hi, xb);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
                al = _mm256_dpbusd_epi32(al, lo, xa);
                ah = _mm256_dpbusd_epi32(ah, hi, xb);
#else
                al = _mm256_add_epi16(al, _mm256_maddubs_epi16(lo, xa));
                ah = _mm256_add_epi16(ah, _mm256_maddubs_epi16(hi, xb));
#endif
            }
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
            __m256i ai = _mm256_add_epi32(al, ah);
#else
            __m256i ai = _mm256_madd_epi16(_mm256_add_epi16(al, ah), ones);
#endif
            gacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), _mm256_set1_ps(dx[b]), gacc);
            bz += bs[b];
        }
        __m256 s = _mm256_loadu_ps(sc + g * TW);
        if (zs) {
            acc = _mm256_fmadd_ps(gacc, s, acc);
            acc = _mm256_fnmadd_ps(_mm256_loadu_ps(zs + g * TW), _mm256_set1_ps(bz), acc);
        } else {
            acc = _mm256_fmadd_ps(_mm256_fnmadd_ps(_mm256_set1_ps(bz), _mm256_set1_ps(8.f), gacc), s, acc);
        }
    }
    float t[TW];
    _mm256_storeu_ps(t, acc);
    memcpy(y, t, (size_t)cols * sizeof(float));
#else
    panel_tile(1, 4, wt, sc, zs, ng, bpg, x8, dx, bs, 0, 0, y, 0, cols);
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PAIR_ZMM 1
#define PAIR_MT 4
/* Several rows against two adjacent tiles (16 columns) in 512-bit vectors: one load of
 * each weight vector serves MT rows, and each row keeps two independent dpbusd sums so
 * that 2 * MT chains hide the instruction's latency. panel_tile's one chain a row at 8
 * columns left the multiply units mostly waiting on it. int8 codes enter dpbusd's
 * unsigned operand as w + 128 (a flipped sign bit), and 128 times the block's sum of
 * activation codes (xs) comes off the integer sum, which is then exactly panel_tile's.
 * Every column's arithmetic is panel_tile's, in the same order, so a row's result does
 * not depend on which path computed it. */
INLINE __m512 load_pair(const float *a, const float *b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}

INLINE __m512i load_pair_i(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* The pair path's float steps, which the AMX path shares so that both round alike: a
 * block's integer sums into its group's (d: the block's activation scale), and a group's
 * into the row's accumulator, with zero offsets z (zp) or the symmetric offset. */
INLINE __m512 pair_block(__m512 gacc, __m512i ai, float d) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_set1_ps(d), gacc);
}

INLINE __m512 pair_group(__m512 acc, __m512 gacc, __m512 s, int zp, __m512 z, float bz,
                         __m512 offset) {
    if (zp) return _mm512_fnmadd_ps(z, _mm512_set1_ps(bz), _mm512_fmadd_ps(gacc, s, acc));
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(_mm512_set1_ps(bz), offset, gacc), s, acc);
}

INLINE void pair_tile(int MT, int bits, const uint8_t *w0, const uint8_t *w1, const float *sc0,
                      const float *sc1, const float *zs0, const float *zs1, int ng, int bpg,
                      const int8_t *x8, const float *dx, const float *bs, const int32_t *xs,
                      int K, int nb, float *y, int64_t ys, int cols) {
    __m512 acc[PAIR_MT];
    for (int m = 0; m < MT; m++) acc[m] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    for (int g = 0, b = 0; g < ng; g++) {
        __m512 gacc[PAIR_MT];
        float bz[PAIR_MT];
        for (int m = 0; m < MT; m++) gacc[m] = _mm512_setzero_ps(), bz[m] = 0.f;
        for (int j = 0; j < bpg; j++, b++) {
            __m512i al[PAIR_MT], ah[PAIR_MT];
            for (int m = 0; m < MT; m++) al[m] = ah[m] = _mm512_setzero_si512();
            if (bits == 4) {
                const uint8_t *b0 = w0 + (int64_t)b * 128, *b1 = w1 + (int64_t)b * 128;
                for (int v = 0; v < 4; v++) {
                    __m512i raw = load_pair_i(b0 + 32 * v, b1 + 32 * v);
                    __m512i lo = _mm512_and_si512(raw, low);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
                    for (int m = 0; m < MT; m++) {
                        const int8_t *xq = x8 + (int64_t)m * K + b * 32 + 4 * v;
                        int32_t xa, xb;
                        memcpy(&xa, xq, 4);
                        memcpy(&xb, xq + 16, 4);
                        al[m] = _mm512_dpbusd_epi32(al[m], lo, _mm512_set1_epi32(xa));
                        ah[m] = _mm512_dpbusd_epi32(ah[m], hi, _mm512_set1_epi32(xb));
                    }
                }
            } else {
                const uint8_t *b0 = w0 + (int64_t)b * 256, *b1 = w1 + (int64_t)b * 256;
                for (int q = 0; q < 8; q += 2) {
                    __m512i u0 = _mm512_xor_si512(load_pair_i(b0 + 32 * q, b1 + 32 * q), flip);
                    __m512i u1 = _mm512_xor_si512(
                        load_pair_i(b0 + 32 * q + 32, b1 + 32 * q + 32), flip);
                    for (int m = 0; m < MT; m++) {
                        const int8_t *xq = x8 + (int64_t)m * K + b * 32 + 4 * q;
                        int32_t xa, xb;
                        memcpy(&xa, xq, 4);
                        memcpy(&xb, xq + 4, 4);
                        al[m] = _mm512_dpbusd_epi32(al[m], u0, _mm512_set1_epi32(xa));
                        ah[m] = _mm512_dpbusd_epi32(ah[m], u1, _mm512_set1_epi32(xb));
                    }
                }
            }
            for (int m = 0; m < MT; m++) {
                __m512i ai = _mm512_add_epi32(al[m], ah[m]);
                if (bits == 8) /* the codes entered as w + 128 */
                    ai = _mm512_sub_epi32(ai, _mm512_set1_epi32(128 * xs[(int64_t)m * nb + b]));
                gacc[m] = pair_block(gacc[m], ai, dx[(int64_t)m * nb + b]);
                bz[m] += bs[(int64_t)m * nb + b];
            }
        }
        __m512 s = load_pair(sc0 + g * TW, sc1 + g * TW);
        __m512 z = zs0 ? load_pair(zs0 + g * TW, zs1 + g * TW) : _mm512_setzero_ps();
        const __m512 offset = _mm512_set1_ps(bits == 4 ? 8.f : 0.f);
        for (int m = 0; m < MT; m++)
            acc[m] = pair_group(acc[m], gacc[m], s, zs0 != NULL, z, bz[m], offset);
    }
    __mmask16 keep = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + m * ys, keep, acc[m]);
}

/* Two tiles against every activation row, PAIR_MT rows at a time. */
INLINE void pair_rows(int bits, const uint8_t *w0, const uint8_t *w1, const float *sc0,
                      const float *sc1, const float *zs0, const float *zs1, int ng, int bpg,
                      const int8_t *x8, const float *dx, const float *bs, const int32_t *xs,
                      int M, int K, int nb, float *y, int64_t ys, int cols) {
    int m = 0;
#define PAIR(MT) pair_tile(MT, bits, w0, w1, sc0, sc1, zs0, zs1, ng, bpg, x8 + (int64_t)m * K,  \
                           dx + (int64_t)m * nb, bs + (int64_t)m * nb,                         \
                           xs ? xs + (int64_t)m * nb : NULL, K, nb, y + (int64_t)m * ys, ys,   \
                           cols)
    for (; m + PAIR_MT <= M; m += PAIR_MT) PAIR(PAIR_MT);
    switch (M - m) {
    case 3: PAIR(3); break;
    case 2: PAIR(2); break;
    case 1: PAIR(1); break;
    default: break;
    }
#undef PAIR
}
#endif

#if defined(__AVX2__) && !defined(PAIR_ZMM) && !defined(__AVXVNNI__)
#define QUAD_PAIR 1
#define Q4_DOT(S, W, X, FIRST)                                                                \
    S = FIRST ? _mm256_maddubs_epi16(W, X) : _mm256_add_epi16(S, _mm256_maddubs_epi16(W, X))
/* Four activation rows against two adjacent int4 tiles (16 columns) on AVX2 without VNNI:
 * panel_tile's arithmetic in its order (the same bits), each broadcast quad of
 * activations serving both tiles. Per 32 products a block costs a multiply, an add, half
 * a broadcast and a share of the nibble masks, and the broadcasts and masks take vector
 * pipes the multiplies need: 4 x 16 reads each broadcast twice where panel_tile's 4 x 8
 * reads it once. Its eight integer sums fill the registers with the two weight vectors
 * of one half-step, so a group's float sums and the row's wait in L1, read once a block
 * and once a group. Interleaved on a Zen 3 EPYC (2 threads, benchmarks/kernel_ab.py):
 * 1.06-1.13x at 16 to 256 rows. */
INLINE void quad_pair_q4(const uint8_t *w0, const uint8_t *w1, const float *sc0,
                         const float *sc1, const float *zs0, const float *zs1, int ng, int bpg,
                         const int8_t *x8, const float *dx, const float *bs, int K, int nb,
                         float *y, int64_t ys, int cols) {
    __m256 gacc[4][2], acc[4][2];
    for (int m = 0; m < 4; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int8_t *x0 = x8, *x1 = x8 + K, *x2 = x8 + 2 * (int64_t)K, *x3 = x8 + 3 * (int64_t)K;
    for (int g = 0, b = 0; g < ng; g++) {
        for (int m = 0; m < 4; m++) gacc[m][0] = gacc[m][1] = _mm256_setzero_ps();
        for (int j = 0; j < bpg; j++, b++) {
            const uint8_t *a = w0 + (int64_t)b * 128, *c = w1 + (int64_t)b * 128;
            const int o = b * 32;
            __m256i s00, s01, s10, s11, s20, s21, s30, s31;
            PREFETCH2(a + PF_DIST);
            PREFETCH2(c + PF_DIST);
#define Q4_ROW(S0, S1, W0, W1, X, FIRST)                                                     \
    {                                                                                         \
        __m256i xq = bcast4(X);                                                               \
        Q4_DOT(S0, W0, xq, FIRST);                                                            \
        Q4_DOT(S1, W1, xq, FIRST);                                                            \
        __asm__("" : "+x"(S0), "+x"(S1));                                                     \
    }
/* the low nibbles of both tiles, then the high ones (reloaded): two weight vectors live */
#define Q4_STEP(v, FIRST)                                                                     \
    {                                                                                         \
        __m256i l0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(a + 32 * (v))), low); \
        __m256i l1 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(c + 32 * (v))), low); \
        Q4_ROW(s00, s01, l0, l1, x0 + o + 4 * (v), FIRST)                                     \
        Q4_ROW(s10, s11, l0, l1, x1 + o + 4 * (v), FIRST)                                     \
        Q4_ROW(s20, s21, l0, l1, x2 + o + 4 * (v), FIRST)                                     \
        Q4_ROW(s30, s31, l0, l1, x3 + o + 4 * (v), FIRST)                                     \
        __m256i h0 = _mm256_and_si256(                                                        \
            _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(a + 32 * (v))), 4), low);  \
        __m256i h1 = _mm256_and_si256(                                                        \
            _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(c + 32 * (v))), 4), low);  \
        Q4_ROW(s00, s01, h0, h1, x0 + o + 16 + 4 * (v), 0)                                    \
        Q4_ROW(s10, s11, h0, h1, x1 + o + 16 + 4 * (v), 0)                                    \
        Q4_ROW(s20, s21, h0, h1, x2 + o + 16 + 4 * (v), 0)                                    \
        Q4_ROW(s30, s31, h0, h1, x3 + o + 16 + 4 * (v), 0)                                    \
    }
            Q4_STEP(0, 1) Q4_STEP(1, 0) Q4_STEP(2, 0) Q4_STEP(3, 0)
#undef Q4_STEP
#undef Q4_ROW
#define Q4_SUM(S) _mm256_cvtepi32_ps(_mm256_madd_epi16(S, ones))
#define Q4_BLOCK(m, S0, S1)                                                                   \
    {                                                                                         \
        __m256 d = _mm256_set1_ps(dx[(int64_t)(m) * nb + b]);                                 \
        gacc[m][0] = _mm256_fmadd_ps(Q4_SUM(S0), d, gacc[m][0]);                              \
        gacc[m][1] = _mm256_fmadd_ps(Q4_SUM(S1), d, gacc[m][1]);                              \
    }
            Q4_BLOCK(0, s00, s01) Q4_BLOCK(1, s10, s11) Q4_BLOCK(2, s20, s21) Q4_BLOCK(3, s30, s31)
#undef Q4_BLOCK
#undef Q4_SUM
        }
        __m256 s0 = _mm256_loadu_ps(sc0 + g * TW), s1 = _mm256_loadu_ps(sc1 + g * TW);
        for (int m = 0; m < 4; m++) {
            const float *br = bs + (int64_t)m * nb + g * bpg;
            float bz = 0.f;
            for (int j = 0; j < bpg; j++) bz += br[j];
            __m256 z = _mm256_set1_ps(bz);
            if (zs0) {
                acc[m][0] = _mm256_fnmadd_ps(_mm256_loadu_ps(zs0 + g * TW), z,
                                             _mm256_fmadd_ps(gacc[m][0], s0, acc[m][0]));
                acc[m][1] = _mm256_fnmadd_ps(_mm256_loadu_ps(zs1 + g * TW), z,
                                             _mm256_fmadd_ps(gacc[m][1], s1, acc[m][1]));
            } else {
                const __m256 eight = _mm256_set1_ps(8.f);
                acc[m][0] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z, eight, gacc[m][0]), s0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z, eight, gacc[m][1]), s1, acc[m][1]);
            }
        }
    }
    for (int m = 0; m < 4; m++) {
        float t[2 * TW];
        _mm256_storeu_ps(t, acc[m][0]);
        _mm256_storeu_ps(t + TW, acc[m][1]);
        memcpy(y + m * ys, t, (size_t)cols * sizeof(float));
    }
}
#undef Q4_DOT
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

#ifdef _OPENMP
#include <omp.h>
static int omp_threads(void) { return omp_get_max_threads(); }
static int omp_thread(void) { return omp_get_thread_num(); }
#else
static int omp_threads(void) { return 1; }
static int omp_thread(void) { return 0; }
#endif
#define ROW_BLOCK 8
#if defined(PAIR_ZMM) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define HAVE_AMX 1
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

/* ---- dense weights at decode batches ------------------------------------------------
 * y [M, N] = x [M, K] @ w [N, K].T for M <= 4 rows: a dense weight (a tied embedding read as
 * the head, a head kept as stored, a router) streamed once for all rows. torch's fp32
 * matrix-vector product reads about 10 GB/s here; this one streams at memory speed. A
 * 16-bit weight (bf16, fp16) is widened to fp32 as it streams: a stored 16-bit head or
 * embedding is read at 2 bytes a weight, never upcast into a copy twice its size that
 * every step would then read. */
#if defined(__AVX2__)
INLINE __m256 load16(const uint16_t *p, int kind) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
#if defined(__F16C__)
    if (kind == 2) return _mm256_cvtph_ps(h);
#endif
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

static inline float widen16(uint16_t v, int kind) {
    if (kind == 1) {
        uint32_t u = (uint32_t)v << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t sign = (uint32_t)(v & 0x8000) << 16, exp = (v >> 10) & 0x1F, man = v & 0x3FF, u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Weight k of row wr as fp32 (kind 0: fp32, 1: bf16, 2: fp16); 8 of them from k. */
static inline float weight_at(const void *wr, int64_t k, int kind) {
    return kind ? widen16(((const uint16_t *)wr)[k], kind) : ((const float *)wr)[k];
}

#if defined(__AVX2__)
INLINE __m256 weights8(const void *wr, int64_t k, int kind) {
    return kind ? load16((const uint16_t *)wr + k, kind) : _mm256_loadu_ps((const float *)wr + k);
}
#endif

/* Rows n0..n1 of a dense weight against MT activation rows; `kind` is a constant at each
 * call (gemv_kind), so each kind compiles to its own loop. */
INLINE void dense_rows(int MT, const float *x, int K, const void *w, int kind, int n0, int n1,
                       int N, float *y) {
    int64_t width = (int64_t)K * (kind ? 2 : 4);
    for (int n = n0; n < n1; n++) {
        const void *wr = (const char *)w + n * width;
        float out[DENSE_MT];
        int k = 0;
#if defined(__AVX2__)
        int vec = kind != 2;
#if defined(__F16C__)
        vec = 1;
#endif
        __m256 a0[DENSE_MT], a1[DENSE_MT];
        for (int m = 0; m < MT; m++) a0[m] = a1[m] = _mm256_setzero_ps();
        for (; vec && k + 16 <= K; k += 16) {
            __m256 w0 = weights8(wr, k, kind), w1 = weights8(wr, k + 8, kind);
            for (int m = 0; m < MT; m++) {
                a0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (int64_t)m * K + k), a0[m]);
                a1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (int64_t)m * K + k + 8), a1[m]);
            }
        }
        for (int m = 0; m < MT; m++) out[m] = hsum8(_mm256_add_ps(a0[m], a1[m]));
#else
        for (int m = 0; m < MT; m++) out[m] = 0.f;
#endif
        for (; k < K; k++) {
            float wk = weight_at(wr, k, kind);
            for (int m = 0; m < MT; m++) out[m] += wk * x[(int64_t)m * K + k];
        }
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

/* The dense fp32 weight [N, K] from the panel layout, for the exact (large-batch) path. */
static void dequant_panel(int bits, const uint8_t *w, const float *scale, const float *zs,
                          int N, int K, int G, float *out) {
    int nb = K / 32, ng = K / G, tiles = (N + TW - 1) / TW;
    int64_t tb = (int64_t)nb * 32 * bits;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++)
        for (int b = 0; b < nb; b++) {
            int g = b * 32 / G;
            for (int q = 0; q < 8; q++)
                for (int c = 0; c < TW && t * TW + c < N; c++) {
                    int64_t i = ((int64_t)t * ng + g) * TW + c;
                    float s = scale[i], z = zs ? zs[i] : (bits == 4 ? 8.f : 0.f) * s;
                    float *o = out + (int64_t)(t * TW + c) * K + b * 32 + q * 4;
                    for (int kk = 0; kk < 4; kk++) {
                        int v;
                        if (bits == 4) {
                            uint8_t byte = w[t * tb + b * 128 + (q & 3) * 32 + c * 4 + kk];
                            v = q < 4 ? (byte & 0x0F) : (byte >> 4);
                        } else {
                            v = (int8_t)w[t * tb + b * 256 + q * 32 + c * 4 + kk];
                        }
                        o[kk] = v * s - z;
                    }
                }
        }
}

void llmp_dequant_q4(const uint8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out) {
    dequant_panel(4, w, scale, zs, N, K, G, out);
}

void llmp_dequant_q8(const int8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out) {
    dequant_panel(8, (const uint8_t *)w, scale, zs, N, K, G, out);
}

void llmp_set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    (void)n;
}

int llmp_get_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* The calling thread's idle OpenMP workers exit. libgomp counts every team's threads in
 * the process; once they outnumber the CPUs, its workers sleep at every barrier instead of
 * spinning, and a decode step has hundreds of barriers: a server whose main thread loaded
 * the weights (a team of its own) and whose engine thread decodes (another) ran batch-1
 * steps 25-30% slower than `bench`, which loads and decodes on one thread. */
void llmp_release_threads(void) {
#if defined(_OPENMP) && (_OPENMP >= 201811 || (!defined(__clang__) && __GNUC__ >= 9))
    omp_pause_resource_all(omp_pause_soft);
#endif
}

/* Fused elementwise steps of a decode layer: one call each instead of several torch ops,
 * whose per-op overhead dominates a 135M-parameter model's decode step. */

/* out[m] = x[m] * rsqrt(mean(x[m]^2) + eps) * w, written to `out` [M, Kp] (zero padded to
 * Kp) and quantized into x8/dx/bsum. */
void llmp_rmsnorm_quant(const float *x, const float *w, float eps, int M, int K, int Kp,
                        float *out, int8_t *x8, float *dx, float *bsum) {
    #pragma omp parallel for schedule(static) if (M > 4)
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

/* gu [M, 2I] = [gate | up] -> out [M, Ip] = act(gate) * up (zero padded), quantized.
 * act: ACT_SILU, or ACT_GELU_TANH (0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))). */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

static inline float gelu_tanh(float g) {
    return 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
}

void llmp_act_mul_quant(const float *gu, int M, int I, int Ip, int act, float *out, int8_t *x8,
                        float *dx, float *bsum) {
    #pragma omp parallel for schedule(static) if (M > 2)
    for (int m = 0; m < M; m++) {
        const float *g = gu + (int64_t)m * 2 * I, *u = g + I;
        float *o = out + (int64_t)m * Ip;
        int i = 0;
#if defined(__AVX2__)
        for (; i + 8 <= I; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i), sv;
            if (act == ACT_SILU) {
                __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
                sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
            } else { /* 0.5 g (1 + tanh z) = g / (1 + exp(-2z)) */
                __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
                __m256 z = _mm256_mul_ps(_mm256_set1_ps(0.7978845608f),
                                         _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, gv));
                __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.f), z));
                sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
            }
            _mm256_storeu_ps(o + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; i++)
            o[i] = (act == ACT_SILU ? g[i] / (1.f + expf(-g[i])) : gelu_tanh(g[i])) * u[i];
        for (int i = I; i < Ip; i++) o[i] = 0.f;
        quantize_row(o, Ip, x8 + (int64_t)m * Ip, dx + (int64_t)m * (Ip / 32), bsum + (int64_t)m * (Ip / 32));
    }
}

/* Rows of a step's elementwise work from which it is spread over the threads: a prefill
 * step's hundreds of rows, not a decode step's few (a fork costs more than they do). Each
 * row is computed the same either way. */
#define PAR_ROWS 64

/* Rotary embedding in place, rotate-half convention over the first R of each head's D
 * values (partial rotary when R < D): x [T, heads, D] at positions [T]; cos/sin tables
 * [max_len, R/2]. */
void llmp_rope(float *x, const int64_t *positions, const float *cos_t, const float *sin_t,
               int T, int heads, int D, int R) {
    int half = R / 2;
    #pragma omp parallel for schedule(static) if (T >= PAR_ROWS)
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

/* ---- Decode attention over the KV cache, fp32 or KIVI-quantized ---------------------
 * The cache as compress/runtime/kv_cache.py allocates it: a pool of blocks of `block`
 * tokens, every pooled array [layers, kv_heads, n_blocks, ...], contiguous; position p of a
 * slot lives in pool block table[slot * max_blocks + p / block], at row p % block:
 *   fp32: k, v [.., block, D].
 *   KIVI (bits 8 or 4): codes kq, vq [.., block, D*bits/8] (int4: channel 2j in byte j's
 *   low nibble, 2j+1 in its high one); keys per channel over groups of `group` tokens:
 *   ks, km [.., block/group, D]; values per token: vs, vm [.., block]; the newest tokens of
 *   an unfinished group in fp32, per slot (not pooled): kr, vr [layers, slots, kv_heads,
 *   group, D]. value = code * scale + min.
 * A query head never dequantizes a key: per group, qs = q * ks and c = q . km, so a score is
 * qs . code + c; values accumulate p * vs * code, and p * vm once per token. The query heads
 * that share a KV head are done together (each code is converted once), keys in chunks of
 * up to 32 within one block, with one softmax rescale per chunk; threads take (sequence,
 * KV head) pairs. */
typedef struct {
    int bits, block, group, slots, kv_heads, d, max_blocks, n_blocks;
    const int32_t *table;
    float *k, *v;
    uint8_t *kq, *vq;
    float *ks, *km, *vs, *vm, *kr, *vr;
} KVC;

#define CHUNK_T 32
#define REP_MAX 16

/* Element offset of (layer, slot, head) in a per-slot array (the KIVI residual) with `per`
 * elements per head. */
static inline int64_t kv_at(const KVC *c, int layer, int64_t slot, int head, int64_t per) {
    return (((int64_t)layer * c->slots + slot) * c->kv_heads + head) * per;
}

/* The pool block that holds position pos of slot. */
static inline int64_t kv_block(const KVC *c, int64_t slot, int64_t pos) {
    return c->table[slot * c->max_blocks + pos / c->block];
}

/* Element offset of (layer, pool block, head) in a pooled array with `per` elements per
 * block (a head's blocks side by side: a sequence's blocks taken in a row are one run). */
static inline int64_t kv_blk(const KVC *c, int layer, int64_t blk, int head, int64_t per) {
    return (((int64_t)layer * c->kv_heads + head) * c->n_blocks + blk) * per;
}

/* Codes of one token's D channels as floats. */
static inline void codes_f32(const uint8_t *p, int bits, int D, float *out) {
    int d = 0;
#if defined(__AVX2__)
    if (bits == 8)
        for (; d + 8 <= D; d += 8) {
            __m128i b = _mm_loadl_epi64((const __m128i *)(p + d));
            _mm256_storeu_ps(out + d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)));
        }
    else {
        const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        for (; d + 8 <= D; d += 8) {
            int32_t w;
            memcpy(&w, p + d / 2, 4);
            __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(w), shifts);
            v = _mm256_and_si256(v, _mm256_set1_epi32(0x0F));
            _mm256_storeu_ps(out + d, _mm256_cvtepi32_ps(v));
        }
    }
#endif
    for (; d < D; d++) out[d] = bits == 8 ? p[d] : (p[d / 2] >> (4 * (d & 1))) & 0x0F;
}

static inline float dot_f32(const float *a, const float *b, int D) {
    int d = 0;
    float s = 0.f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    s = hsum8(acc);
#endif
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* Online softmax over one chunk of n scores of one head: s[i] += add, the running max m
 * raised (l, vmin_acc and out[0..D) rescaled once), then s[i] = exp(s[i] - m). */
static void softmax_chunk(float *s, int n, float add, float *m, float *l, float *vmin_acc,
                          float *out, int D) {
    float bm = -INFINITY;
    int i = 0;
#if defined(__AVX2__)
    __m256 a = _mm256_set1_ps(add), mx = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_add_ps(_mm256_loadu_ps(s + i), a);
        _mm256_storeu_ps(s + i, x);
        mx = _mm256_max_ps(mx, x);
    }
    bm = hmax8(mx);
#endif
    for (; i < n; i++) s[i] += add, bm = fmaxf(bm, s[i]);
    if (bm > *m) {
        float f = expf(*m - bm);
        *l *= f, *vmin_acc *= f;
        for (int d = 0; d < D; d++) out[d] *= f;
        *m = bm;
    }
    i = 0;
#if defined(__AVX2__)
    __m256 mv = _mm256_set1_ps(*m);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv)));
#endif
    for (; i < n; i++) s[i] = expf(s[i] - *m);
}

/* The chunk's softmax weights p[i] as value-code weights w[i] = p[i] * vs[i]; adds sum p to
 * *l and returns sum p[i] * vm[i] (the values' minimums, applied once at the end). */
static float weigh_values(const float *p, const float *vs, const float *vm, int n, float *l,
                          float *w) {
    if (vs == NULL) { /* fp32 rows: the weights are p itself */
        float sum = 0.f;
        for (int i = 0; i < n; i++) sum += p[i];
        *l += sum;
        return 0.f;
    }
    float lsum = 0.f, msum = 0.f;
    int i = 0;
#if defined(__AVX2__)
    __m256 ls = _mm256_setzero_ps(), ms = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(p + i);
        ls = _mm256_add_ps(ls, x);
        ms = _mm256_fmadd_ps(x, _mm256_loadu_ps(vm + i), ms);
        _mm256_storeu_ps(w + i, _mm256_mul_ps(x, _mm256_loadu_ps(vs + i)));
    }
    lsum = hsum8(ls), msum = hsum8(ms);
#endif
    for (; i < n; i++) lsum += p[i], msum += p[i] * vm[i], w[i] = p[i] * vs[i];
    *l += lsum;
    return msum;
}

/* Min-max codes (asymmetric, round half to even as torch.round), as kv_cache._quantize:
 * n values at stride `step`. */
static void minmax_codes(const float *x, int n, int64_t step, int bits, uint8_t *codes,
                         float *scale, float *lo_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = fminf(lo, x[i * step]), hi = fmaxf(hi, x[i * step]);
    float qmax = (float)((1 << bits) - 1), sc = fmaxf((hi - lo) / qmax, 1e-8f);
    for (int i = 0; i < n; i++) {
        float q = nearbyintf((x[i * step] - lo) / sc);
        codes[i] = (uint8_t)fminf(fmaxf(q, 0.f), qmax);
    }
    *scale = sc, *lo_out = lo;
}

/* The residual of (layer, slot, head) is full: quantize it as token group `gi`. */
static void kv_flush(const KVC *c, int layer, int64_t slot, int head, int64_t gi) {
    int D = c->d, G = c->group, BS = c->block, bits = c->bits, bytes = D * bits / 8;
    int64_t blk = kv_block(c, slot, gi * G), off = gi * G % BS;
    const float *kr = c->kr + kv_at(c, layer, slot, head, (int64_t)G * D);
    const float *vr = c->vr + kv_at(c, layer, slot, head, (int64_t)G * D);
    uint8_t *kq = c->kq + kv_blk(c, layer, blk, head, (int64_t)BS * bytes) + off * bytes;
    uint8_t *vq = c->vq + kv_blk(c, layer, blk, head, (int64_t)BS * bytes) + off * bytes;
    float *ks = c->ks + kv_blk(c, layer, blk, head, (int64_t)(BS / G) * D) + off / G * D;
    float *km = c->km + kv_blk(c, layer, blk, head, (int64_t)(BS / G) * D) + off / G * D;
    float *vs = c->vs + kv_blk(c, layer, blk, head, BS) + off;
    float *vm = c->vm + kv_blk(c, layer, blk, head, BS) + off;
    uint8_t col[1024], row[1024];
    if (bits == 4) memset(kq, 0, (size_t)G * bytes), memset(vq, 0, (size_t)G * bytes);
    for (int d = 0; d < D; d++) { /* keys: per channel over the group's tokens */
        minmax_codes(kr + d, G, D, bits, col, ks + d, km + d);
        for (int t = 0; t < G; t++) {
            if (bits == 8) kq[t * bytes + d] = col[t];
            else kq[t * bytes + d / 2] |= (uint8_t)(col[t] << (4 * (d & 1)));
        }
    }
    for (int t = 0; t < G; t++) { /* values: per token over the channels */
        minmax_codes(vr + (int64_t)t * D, D, 1, bits, row, vs + t, vm + t);
        for (int d = 0; d < D; d++) {
            if (bits == 8) vq[t * bytes + d] = row[d];
            else vq[t * bytes + d / 2] |= (uint8_t)(row[d] << (4 * (d & 1)));
        }
    }
}

static void kv_write(const KVC *c, int layer, int64_t slot, int64_t pos, int head,
                     const float *k, const float *v) {
    int D = c->d;
    if (c->bits == 0) {
        int64_t at = kv_blk(c, layer, kv_block(c, slot, pos), head, (int64_t)c->block * D)
                     + pos % c->block * D;
        memcpy(c->k + at, k, D * sizeof(float));
        memcpy(c->v + at, v, D * sizeof(float));
        return;
    }
    int64_t off = pos % c->group, at = kv_at(c, layer, slot, head, (int64_t)c->group * D) + off * D;
    memcpy(c->kr + at, k, D * sizeof(float));
    memcpy(c->vr + at, v, D * sizeof(float));
    if (off == c->group - 1) kv_flush(c, layer, slot, head, pos / c->group);
}

/* scores[t] = scale * q . rows[t] for n rows of D floats. AVX2: eight rows at a time, their
 * eight partial vectors reduced together (one transpose-add instead of eight horizontal
 * sums). */
static void row_scores(const float *q, const float *rows, int n, int D, float scale, float *scores) {
    int t = 0;
#if defined(__AVX2__)
    if (D % 8 == 0)
        for (; t + 8 <= n; t += 8) {
            __m256 a[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
            for (int d = 0; d < D; d += 8) {
                __m256 qv = _mm256_loadu_ps(q + d);
                for (int i = 0; i < 8; i++)
                    a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + (int64_t)(t + i) * D + d), a[i]);
            }
            __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
            __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
            __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
            /* lanes: [r0 r1 r2 r3 | r0 r1 r2 r3] halves of rows 0-3 and of rows 4-7 */
            __m256 lo = _mm256_permute2f128_ps(h0123, h4567, 0x20);
            __m256 hi = _mm256_permute2f128_ps(h0123, h4567, 0x31);
            _mm256_storeu_ps(scores + t, _mm256_mul_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale)));
        }
#endif
    for (; t < n; t++) scores[t] = dot_f32(q, rows + (int64_t)t * D, D) * scale;
}

/* out[0..D) += sum_t w[t] * rows[t], the accumulator kept in registers over the rows. */
static void weighted_rows(const float *w, const float *rows, int n, int D, float *out) {
    int d = 0;
#if defined(__AVX2__)
    for (; d + 64 <= D; d += 64) { /* eight accumulators, eight independent FMA chains
                                     * (four left the loop waiting on the FMA's latency:
                                     * benchmarks/attention_ab.py, fp32 attention 8-21%) */
        __m256 o[8];
        for (int j = 0; j < 8; j++) o[j] = _mm256_loadu_ps(out + d + 8 * j);
        for (int t = 0; t < n; t++) {
            const float *r = rows + (int64_t)t * D + d;
            __m256 p = _mm256_set1_ps(w[t]);
            for (int j = 0; j < 8; j++) o[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 8 * j), o[j]);
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + d + 8 * j, o[j]);
    }
    for (; d + 32 <= D; d += 32) {
        __m256 o0 = _mm256_loadu_ps(out + d), o1 = _mm256_loadu_ps(out + d + 8);
        __m256 o2 = _mm256_loadu_ps(out + d + 16), o3 = _mm256_loadu_ps(out + d + 24);
        for (int t = 0; t < n; t++) {
            const float *r = rows + (int64_t)t * D + d;
            __m256 p = _mm256_set1_ps(w[t]);
            o0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r), o0);
            o1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 8), o1);
            o2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 16), o2);
            o3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(r + 24), o3);
        }
        _mm256_storeu_ps(out + d, o0), _mm256_storeu_ps(out + d + 8, o1);
        _mm256_storeu_ps(out + d + 16, o2), _mm256_storeu_ps(out + d + 24, o3);
    }
#endif
    for (; d < D; d++)
        for (int t = 0; t < n; t++) out[d] += w[t] * rows[(int64_t)t * D + d];
}

#if defined(__AVX2__)
/* Codes of channels d..d+7 of one token, as floats. */
INLINE __m256 codes8(const uint8_t *p, int bits, int d) {
    if (bits == 8)
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + d))));
    int32_t w;
    memcpy(&w, p + d / 2, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x0F)));
}

/* The four lanes-sums of a0..a3 as one vector [sum a0, sum a1, sum a2, sum a3]. */
static inline __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* s[r][t] = scale * qs[r] . keys(t) for nr <= 3 heads and n tokens of codes: each code
 * vector is converted in registers once and used by every head, four tokens at a time
 * (twelve independent FMA chains). D % 8 == 0. */
INLINE void code_scores(float (*qs)[256], int nr, const uint8_t *codes, int bytes, int bits,
                        int n, int D, float scale, float (*s)[CHUNK_T]) {
    const float *q0 = qs[0], *q1 = qs[nr > 1 ? 1 : 0], *q2 = qs[nr > 2 ? 2 : 0];
    __m256 sc = _mm256_set1_ps(scale);
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        __m256 a[3][4];
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < 4; i++) a[h][i] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d), x2 = _mm256_loadu_ps(q2 + d);
            for (int i = 0; i < 4; i++) {
                __m256 k = codes8(codes + (int64_t)(t + i) * bytes, bits, d);
                a[0][i] = _mm256_fmadd_ps(x0, k, a[0][i]);
                a[1][i] = _mm256_fmadd_ps(x1, k, a[1][i]);
                a[2][i] = _mm256_fmadd_ps(x2, k, a[2][i]);
            }
        }
        for (int h = 0; h < nr; h++)
            _mm_storeu_ps(s[h] + t, _mm_mul_ps(hsum4x8(a[h][0], a[h][1], a[h][2], a[h][3]),
                                               _mm256_castps256_ps128(sc)));
    }
    for (; t < n; t++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0;
        for (int d = 0; d < D; d += 8) {
            __m256 k = codes8(codes + (int64_t)t * bytes, bits, d);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), k, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), k, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), k, a2);
        }
        s[0][t] = hsum8(a0) * scale;
        if (nr > 1) s[1][t] = hsum8(a1) * scale;
        if (nr > 2) s[2][t] = hsum8(a2) * scale;
    }
}

/* out[r] += sum_t w[r][t] * values(t) for nr <= 3 heads, the value codes converted in
 * registers once for every head; 32 channels at a time (twelve accumulators). D % 32 == 0. */
INLINE void code_values(float (*w)[CHUNK_T], int nr, const uint8_t *codes, int bytes, int bits,
                        int n, int D, float *out) {
    for (int d = 0; d < D; d += 32) {
        __m256 o[3][4];
        for (int h = 0; h < 3; h++)
            for (int j = 0; j < 4; j++) o[h][j] = h < nr ? _mm256_loadu_ps(out + h * D + d + 8 * j) : _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const uint8_t *p = codes + (int64_t)t * bytes;
            __m256 v0 = codes8(p, bits, d), v1 = codes8(p, bits, d + 8);
            __m256 v2 = codes8(p, bits, d + 16), v3 = codes8(p, bits, d + 24);
            for (int h = 0; h < 3; h++) {
                __m256 p_ = _mm256_set1_ps(w[h < nr ? h : 0][t]);
                o[h][0] = _mm256_fmadd_ps(p_, v0, o[h][0]);
                o[h][1] = _mm256_fmadd_ps(p_, v1, o[h][1]);
                o[h][2] = _mm256_fmadd_ps(p_, v2, o[h][2]);
                o[h][3] = _mm256_fmadd_ps(p_, v3, o[h][3]);
            }
        }
        for (int h = 0; h < nr; h++)
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(out + h * D + d + 8 * j, o[h][j]);
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* AVX-512 forms of code_scores and code_values for 8-bit codes and head sizes that are
 * multiples of 64: sixteen codes a conversion, half the conversions and FMAs of the
 * eight-lane loops. 4-bit codes keep the eight-lane loops: sixteen lanes (each code's float
 * from a 16-entry table by a permute) were 0.91-0.95x at batch 1 below 400 tokens and no
 * faster past them (benchmarks/attention_ab.py, AVX-512 Xeon). */

/* 8-bit codes of channels d..d+15 of one token, as floats. */
INLINE __m512 codes16(const uint8_t *p, int d) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + d))));
}

/* The four lane-sums of a0..a3 as [sum a0, sum a1, sum a2, sum a3]. */
static inline __m128 hsum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define HALVES(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    return hsum4x8(HALVES(a0), HALVES(a1), HALVES(a2), HALVES(a3));
#undef HALVES
}

/* code_scores, sixteen channels a step. D % 16 == 0. */
INLINE void code_scores16(float (*qs)[256], int nr, const uint8_t *codes, int bytes, int n,
                          int D, float scale, float (*s)[CHUNK_T]) {
    const float *q0 = qs[0], *q1 = qs[nr > 1 ? 1 : 0], *q2 = qs[nr > 2 ? 2 : 0];
    __m128 sc = _mm_set1_ps(scale);
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        __m512 a[3][4];
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < 4; i++) a[h][i] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            __m512 x0 = _mm512_loadu_ps(q0 + d), x1 = _mm512_loadu_ps(q1 + d), x2 = _mm512_loadu_ps(q2 + d);
            for (int i = 0; i < 4; i++) {
                __m512 k = codes16(codes + (int64_t)(t + i) * bytes, d);
                a[0][i] = _mm512_fmadd_ps(x0, k, a[0][i]);
                a[1][i] = _mm512_fmadd_ps(x1, k, a[1][i]);
                a[2][i] = _mm512_fmadd_ps(x2, k, a[2][i]);
            }
        }
        for (int h = 0; h < nr; h++)
            _mm_storeu_ps(s[h] + t, _mm_mul_ps(hsum4x16(a[h][0], a[h][1], a[h][2], a[h][3]), sc));
    }
    for (; t < n; t++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0;
        for (int d = 0; d < D; d += 16) {
            __m512 k = codes16(codes + (int64_t)t * bytes, d);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + d), k, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + d), k, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + d), k, a2);
        }
        s[0][t] = _mm512_reduce_add_ps(a0) * scale;
        if (nr > 1) s[1][t] = _mm512_reduce_add_ps(a1) * scale;
        if (nr > 2) s[2][t] = _mm512_reduce_add_ps(a2) * scale;
    }
}

/* code_values, 64 channels at a time (twelve accumulators). D % 64 == 0. */
INLINE void code_values16(float (*w)[CHUNK_T], int nr, const uint8_t *codes, int bytes, int n,
                          int D, float *out) {
    for (int d = 0; d < D; d += 64) {
        __m512 o[3][4];
        for (int h = 0; h < 3; h++)
            for (int j = 0; j < 4; j++) o[h][j] = h < nr ? _mm512_loadu_ps(out + h * D + d + 16 * j) : _mm512_setzero_ps();
        for (int t = 0; t < n; t++) {
            const uint8_t *p = codes + (int64_t)t * bytes;
            __m512 v0 = codes16(p, d), v1 = codes16(p, d + 16);
            __m512 v2 = codes16(p, d + 32), v3 = codes16(p, d + 48);
            for (int h = 0; h < 3; h++) {
                __m512 p_ = _mm512_set1_ps(w[h < nr ? h : 0][t]);
                o[h][0] = _mm512_fmadd_ps(p_, v0, o[h][0]);
                o[h][1] = _mm512_fmadd_ps(p_, v1, o[h][1]);
                o[h][2] = _mm512_fmadd_ps(p_, v2, o[h][2]);
                o[h][3] = _mm512_fmadd_ps(p_, v3, o[h][3]);
            }
        }
        for (int h = 0; h < nr; h++)
            for (int j = 0; j < 4; j++) _mm512_storeu_ps(out + h * D + d + 16 * j, o[h][j]);
    }
}
#endif

#if defined(__AVX2__)
/* CALL compiled for constant BITS (8 or 4) and, for the common head sizes 64 and 128, a
 * constant head size HD (BYTES = HD * BITS / 8): the inner loops then unroll fully and
 * lose their branches (int8 attention 5-10% faster than with run-time sizes). */
#define SPECIALIZED(bits_, d_, CALL)                                                          \
    do {                                                                                      \
        if ((bits_) == 8 && (d_) == 64) { enum { BITS = 8, HD = 64, BYTES = 64 }; CALL; }      \
        else if ((bits_) == 8 && (d_) == 128) { enum { BITS = 8, HD = 128, BYTES = 128 }; CALL; } \
        else if ((bits_) == 4 && (d_) == 64) { enum { BITS = 4, HD = 64, BYTES = 32 }; CALL; } \
        else if ((bits_) == 4 && (d_) == 128) { enum { BITS = 4, HD = 128, BYTES = 64 }; CALL; } \
        else if ((bits_) == 8) { const int BITS = 8, HD = (d_), BYTES = HD; CALL; }            \
        else { const int BITS = 4, HD = (d_), BYTES = HD / 2; CALL; }                          \
    } while (0)
#endif

/* A quantized cache's next chunk (codes, value scales and minimums, the key group's scales)
 * is prefetched while this one is computed: the hardware prefetchers alone left each chunk
 * starting on loads from DRAM (benchmarks/attention_ab.py, AVX-512 Xeon, 2,000 tokens,
 * the prefetch alone: int8 1.10-1.26x, int4 1.07-1.19x). An fp32 cache's rows, four times
 * the bytes, were bandwidth-bound already: prefetching them was 0.90-0.99x there. */
#define KV_AHEAD(p, n)                                                                        \
    do {                                                                                      \
        const char *a_ = (const char *)(p);                                                   \
        for (int64_t i_ = 0; i_ < (n); i_ += 64) __builtin_prefetch(a_ + i_);                 \
    } while (0)

/* Attention of `rep` query heads q [rep, D] over positions lo..hi-1 of one (slot, KV head)
 * whose sequence holds L positions, prefetching up to position pf (where the caller goes
 * on next: the next span); out [rep, D]. Keys and values are read in chunks of up
 * to CHUNK_T rows that lie within one key group (or within fp32 rows); the query heads that
 * share the KV head are done together, so each code is read and converted once. With `ml`,
 * out is left unnormalized (sum of exp(score - m) * value) and ml[2r], ml[2r + 1] get head
 * r's m and sum of exp(score - m): one span's share, for merge_spans. */
static void attend_head(const KVC *c, int layer, int64_t slot, int head, int lo, int hi, int L,
                        int pf, int rep, float scale, const float *q, float *out, float *ml) {
    int D = c->d;
    float m[REP_MAX], l[REP_MAX], vmin_acc[REP_MAX], s[REP_MAX][CHUNK_T], wr[REP_MAX][CHUNK_T];
    float qs[REP_MAX][256], qc[REP_MAX], kbuf[CHUNK_T * 256], vbuf[CHUNK_T * 256];
    for (int r = 0; r < rep; r++) {
        m[r] = -INFINITY, l[r] = 0.f, vmin_acc[r] = 0.f, qc[r] = 0.f;
        for (int d = 0; d < D; d++) out[r * D + d] = 0.f;
    }
    int G = c->group, BS = c->block, bytes = c->bits ? D * c->bits / 8 : 0;
    int done = c->bits ? L / G * G : L; /* in blocks; the rest is the fp32 residual */
    const float *kres = NULL, *vres = NULL;
    if (c->bits) {
        kres = c->kr + kv_at(c, layer, slot, head, (int64_t)G * D);
        vres = c->vr + kv_at(c, layer, slot, head, (int64_t)G * D);
    }
    int ahead = pf < done ? pf : done; /* the last position worth prefetching */
    for (int t0 = lo; t0 < hi;) {
        int t1 = t0 + CHUNK_T < hi ? t0 + CHUNK_T : hi;
        int inblock = t0 < done, quant = inblock && c->bits;
        if (inblock && t1 > (t0 / BS + 1) * BS) t1 = (t0 / BS + 1) * BS;
        if (quant && t1 > (t0 / G + 1) * G) t1 = (t0 / G + 1) * G;
        int n = t1 - t0;
        int64_t blk = inblock ? kv_block(c, slot, t0) : 0, off = t0 % BS;
        const float *vrows = NULL, *vsp = NULL, *vmp = NULL;
        if (quant && t1 < ahead) { /* the next chunk's codes and scales, see KV_AHEAD */
            int64_t nb = kv_block(c, slot, t1), noff = t1 % BS, nn = ahead - t1 < CHUNK_T ? ahead - t1 : CHUNK_T;
            int64_t cat = kv_blk(c, layer, nb, head, (int64_t)BS * bytes) + noff * bytes;
            int64_t sat = kv_blk(c, layer, nb, head, BS) + noff;
            int64_t gat = kv_blk(c, layer, nb, head, (int64_t)(BS / G) * D) + noff / G * D;
            KV_AHEAD(c->kq + cat, nn * bytes); KV_AHEAD(c->vq + cat, nn * bytes);
            KV_AHEAD(c->vs + sat, nn * 4); KV_AHEAD(c->vm + sat, nn * 4);
            KV_AHEAD(c->ks + gat, D * 4); KV_AHEAD(c->km + gat, D * 4);
        }
        if (quant) {
            int64_t gat = kv_blk(c, layer, blk, head, (int64_t)(BS / G) * D) + off / G * D;
            const float *gs = c->ks + gat, *gm = c->km + gat;
            for (int r = 0; r < rep; r++) {
                for (int d = 0; d < D; d++) qs[r][d] = q[r * D + d] * gs[d];
                qc[r] = dot_f32(q + r * D, gm, D) * scale;
            }
            const uint8_t *kc = c->kq + kv_blk(c, layer, blk, head, (int64_t)BS * bytes) + off * bytes;
            vsp = c->vs + kv_blk(c, layer, blk, head, BS) + off;
            vmp = c->vm + kv_blk(c, layer, blk, head, BS) + off;
#if defined(__AVX2__)
#if defined(__AVX512F__) && defined(__AVX512BW__)
            if (c->bits == 8 && D % 64 == 0) /* sixteen lanes */
                for (int r0 = 0; r0 < rep; r0 += 3)
                    SPECIALIZED(8, D, ((void)BITS, code_scores16(qs + r0, rep - r0 < 3 ? rep - r0 : 3, kc, BYTES, n, HD, scale, s + r0)));
            else
#endif
            if (D % 32 == 0) /* codes converted in registers, heads three at a time */
                for (int r0 = 0; r0 < rep; r0 += 3)
                    SPECIALIZED(c->bits, D, code_scores(qs + r0, rep - r0 < 3 ? rep - r0 : 3, kc, BYTES, BITS, n, HD, scale, s + r0));
            else
#endif
            {
                for (int t = 0; t < n; t++) codes_f32(kc + (int64_t)t * bytes, c->bits, D, kbuf + t * D);
                for (int r = 0; r < rep; r++) row_scores(qs[r], kbuf, n, D, scale, s[r]);
            }
        } else {
            const float *krows;
            if (inblock) { /* an fp32 cache's block */
                int64_t at = kv_blk(c, layer, blk, head, (int64_t)BS * D) + off * D;
                krows = c->k + at, vrows = c->v + at;
            } else {
                krows = kres + (int64_t)(t0 - done) * D, vrows = vres + (int64_t)(t0 - done) * D;
            }
            for (int r = 0; r < rep; r++) row_scores(q + r * D, krows, n, D, scale, s[r]), qc[r] = 0.f;
        }
        for (int r = 0; r < rep; r++) {
            softmax_chunk(s[r], n, qc[r], &m[r], &l[r], &vmin_acc[r], out + r * D, D);
            vmin_acc[r] += weigh_values(s[r], vsp, vmp, n, &l[r], wr[r]);
        }
        if (!quant) {
            for (int r = 0; r < rep; r++) weighted_rows(s[r], vrows, n, D, out + r * D);
        } else {
            const uint8_t *vc = c->vq + kv_blk(c, layer, blk, head, (int64_t)BS * bytes) + off * bytes;
#if defined(__AVX2__)
            if (D % 32 == 0) { /* value codes converted in registers, heads three at a time */
                for (int r0 = 0; r0 < rep; r0 += 3)
#if defined(__AVX512F__) && defined(__AVX512BW__)
                    if (c->bits == 8 && D % 64 == 0)
                        SPECIALIZED(8, D, ((void)BITS, code_values16(wr + r0, rep - r0 < 3 ? rep - r0 : 3, vc, BYTES, n, HD, out + r0 * D)));
                    else
#endif
                    SPECIALIZED(c->bits, D, code_values(wr + r0, rep - r0 < 3 ? rep - r0 : 3, vc, BYTES, BITS, n, HD, out + r0 * D));
                t0 = t1;
                continue;
            }
#endif
            for (int t = 0; t < n; t++) codes_f32(vc + (int64_t)t * bytes, c->bits, D, vbuf + t * D);
            for (int r = 0; r < rep; r++) weighted_rows(wr[r], vbuf, n, D, out + r * D);
        }
        t0 = t1;
    }
    for (int r = 0; r < rep; r++) {
        if (ml) ml[2 * r] = m[r], ml[2 * r + 1] = l[r];
        for (int d = 0; d < D; d++)
            out[r * D + d] = ml ? out[r * D + d] + vmin_acc[r] : (out[r * D + d] + vmin_acc[r]) / l[r];
    }
}

/* A decode row's positions past SPAN_T are cut at its multiples, each span's softmax
 * computed from scratch and the spans merged in order (merge_spans). The cut depends on the
 * positions alone, never on the batch or the threads, so a row computes the same bits in a
 * decode step, a verify pass and a mixed step. What does depend on them is who computes
 * which spans: a (sequence, KV head) is one task over all its spans, one after another,
 * unless there are fewer of them than twice the threads; then each is split into runs of
 * spans so that every thread has work (a lone sequence's 3 KV heads over 2 threads left one
 * idle a third of the time). benchmarks/attention_ab.py, AVX-512 Xeon, 2 threads: batch 1,
 * 3 KV heads, 1.16-1.21x at 1,000-2,000 tokens; batch 8 0.95-1.03x. Spans of 256 cost
 * 4-7% at batch 8, as did keeping the shares in one buffer for all threads. */
#define SPAN_T 512

static int spans_of(int lo, int L) { return (L - 1) / SPAN_T - lo / SPAN_T + 1; }

/* out [rep, D] = the normalized attention of n spans' shares part[s] (rep * D floats, then
 * rep (m, l) pairs, `per` floats apart), in span order. One span gives attend_head's own
 * bits: its share times exp(0) = 1, over its l times 1. */
static void merge_spans(const float *part, int64_t per, int n, int rep, int D, float *out) {
    for (int r = 0; r < rep; r++) {
        float M = -INFINITY, den = 0.f, *o = out + r * D;
        for (int s = 0; s < n; s++) M = fmaxf(M, part[s * per + (int64_t)rep * D + 2 * r]);
        for (int d = 0; d < D; d++) o[d] = 0.f;
        for (int s = 0; s < n; s++) {
            const float *ml = part + s * per + (int64_t)rep * D + 2 * r, *x = part + s * per + r * D;
            float w = expf(ml[0] - M);
            den += ml[1] * w;
            for (int d = 0; d < D; d++) o[d] += x[d] * w;
        }
        for (int d = 0; d < D; d++) o[d] /= den;
    }
}

/* One decode step of one layer: each sequence's new k/v [B, kv_heads, D] is stored at its
 * position, then its query heads q [B, heads, D] attend over position-window+1..position
 * (window 0: from 0), scores times `scale`. out [B, heads, D]. 0, or -1 out of memory. */
int llmp_decode_attention(const KVC *c, int layer, const float *q, const float *knew,
                           const float *vnew, const int64_t *slots, const int64_t *positions,
                           int B, int H, float scale, int window, float *out) {
    int KVH = c->kv_heads, D = c->d, rep = H / KVH;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < KVH; g++)
            kv_write(c, layer, slots[b], positions[b], g, knew + ((int64_t)b * KVH + g) * D,
                     vnew + ((int64_t)b * KVH + g) * D);
    int64_t units = 0; /* (sequence, span) pairs */
    for (int b = 0; b < B; b++) {
        int L = (int)positions[b] + 1, lo = window > 0 && L > window ? L - window : 0;
        units += spans_of(lo, L);
    }
    if (units == B) { /* one span each: every (sequence, KV head) normalized in place */
        #pragma omp parallel for schedule(dynamic) collapse(2) if (B * KVH > 1)
        for (int b = 0; b < B; b++)
            for (int g = 0; g < KVH; g++)
                for (int r0 = 0; r0 < rep; r0 += REP_MAX) {
                    int nr = rep - r0 < REP_MAX ? rep - r0 : REP_MAX;
                    int64_t h = (int64_t)b * H + (int64_t)g * rep + r0;
                    int L = (int)positions[b] + 1, lo = window > 0 && L > window ? L - window : 0;
                    attend_head(c, layer, slots[b], g, lo, L, L, L, nr, scale, q + h * D, out + h * D, NULL);
                }
        return 0;
    }
    int64_t per = ((int64_t)rep * D + 2 * rep + 15) / 16 * 16; /* one span's share of a KV head's
                                                              * query heads, in whole lines */
    int pieces = B * KVH >= 2 * omp_threads() ? 1 : (2 * omp_threads() + B * KVH - 1) / (B * KVH);
    /* The calling thread's scratch, kept between calls: freshly mapped every layer call
     * (glibc maps blocks this size), it cost a tenth of an fp32 cache's batch-8 attention. */
    static __thread char *scratch = NULL;
    static __thread size_t room = 0;
    size_t need = units * KVH * per * sizeof(float) + 2 * (B + 1) * sizeof(int64_t) + (size_t)B * KVH * sizeof(int);
    if (need > room) {
        free(scratch);
        room = 0, scratch = aligned_alloc(64, (need + need / 2 + 63) / 64 * 64);
        if (scratch == NULL) return -1;
        room = need + need / 2;
    }
    float *part = (float *)scratch;
    int64_t *first = (int64_t *)(scratch + units * KVH * per * sizeof(float)), *task = first + B + 1;
    int *left = (int *)(task + B + 1); /* a (sequence, KV head)'s runs to go */
    first[0] = task[0] = 0; /* sequence b's spans from first[b], its tasks from task[b] */
    for (int b = 0; b < B; b++) {
        int L = (int)positions[b] + 1, lo = window > 0 && L > window ? L - window : 0, n = spans_of(lo, L);
        first[b + 1] = first[b] + n;
        task[b + 1] = task[b] + (int64_t)KVH * (n < pieces ? n : pieces);
        for (int g = 0; g < KVH; g++) left[b * KVH + g] = n < pieces ? n : pieces;
    }
    #pragma omp parallel for schedule(dynamic) if (task[B] > 1)
    for (int64_t i = 0; i < task[B]; i++) {
        int b = 0;
        while (task[b + 1] <= i) b++;
        int n = (int)(first[b + 1] - first[b]), np = n < pieces ? n : pieces;
        int g = (int)((i - task[b]) / np), k = (int)((i - task[b]) % np);
        int L = (int)positions[b] + 1, lo = window > 0 && L > window ? L - window : 0;
        float *shares = part + (first[b] * KVH + (int64_t)g * n) * per;
        if (np == 1) { /* a whole run: its shares in this thread's own buffer, which stays in
                        * its caches between calls (the shared one came back from memory) */
            static __thread float *mine = NULL;
            static __thread int64_t mine_room = 0;
            if (n * per > mine_room) {
                free(mine);
                mine_room = 0, mine = aligned_alloc(64, (size_t)(n * per * 3 / 2 + 15) / 16 * 64);
                if (mine) mine_room = (n * per * 3 / 2 + 15) / 16 * 16;
            }
            if (mine) shares = mine;
        }
        int run_end = (lo / SPAN_T + (k + 1) * n / np) * SPAN_T;
        if (run_end > L) run_end = L;
        for (int sp = k * n / np; sp < (k + 1) * n / np; sp++) {
            int s0 = (lo / SPAN_T + sp) * SPAN_T, a = s0 > lo ? s0 : lo, z = s0 + SPAN_T < L ? s0 + SPAN_T : L;
            float *share = shares + sp * per;
            for (int r0 = 0; r0 < rep; r0 += REP_MAX) {
                int nr = rep - r0 < REP_MAX ? rep - r0 : REP_MAX;
                int64_t h = (int64_t)b * H + (int64_t)g * rep + r0;
                attend_head(c, layer, slots[b], g, a, z, L, run_end, nr, scale, q + h * D,
                            share + r0 * D, share + (int64_t)rep * D + 2 * r0);
            }
        }
        /* the last run of a (sequence, KV head) to finish merges its spans */
        if (np == 1 || __atomic_sub_fetch(&left[b * KVH + g], 1, __ATOMIC_ACQ_REL) == 0)
            merge_spans(shares, per, n, rep, D, out + ((int64_t)b * H + (int64_t)g * rep) * D);
    }
    return 0;
}


/* ---- The whole decode step of a layer stack in one call ------------------------------
 * For models whose block linears are all packed (outlier columns and biases allowed):
 * Python's per-operation overhead is then paid once per step instead of some forty times
 * per layer. A packed head (and the final norm) runs in the same call, logits out. Same
 * arithmetic as the per-op path. What differs between families arrives as data
 * (compress/model/spec.py's BlockSpec, read by compress/runtime/backends.py): norm
 * weights already in their effective form (gemma's 1 + w), optional q/k and sandwich norms
 * (NULL when absent), biases, each layer's rope tables and sliding window, the attention
 * scale and the activation. */

typedef struct {
    const uint8_t *w;
    const float *scale, *zs;
    int n, k, g, bits;  /* k: padded input width the codes were packed for */
    const int32_t *oidx; /* LLM.int8()-style outlier input columns (their codes are zero) */
    const float *ow;     /* and their weights [n, n_out], kept in full precision */
    int n_out;
    const float *bias;   /* [n] or NULL */
    int split;           /* 8-bit: two-term activations (llmp_gemm_q8_split) */
} QLin;

/* A Mixture-of-Experts MLP: an fp32 router [E, hidden], softmax over its logits, top_k,
 * optional renormalization of the chosen weights; then the rows routed to each chosen
 * expert gathered and run through its gate_up and down, so an expert's weights are read
 * once per step and an unchosen one not at all. */
typedef struct {
    const float *router;
    const QLin *experts; /* [2E]: gate_up of expert e at 2e, its down at 2e + 1 */
    int n_experts, top_k, renorm, inter;
    int64_t *reads;      /* [E]: steps that read each expert (the runtime's MBU) */
    const QLin *shared;  /* [2]: a shared expert's gate_up and down (qwen2_moe); or NULL */
    const float *shared_gate; /* [hidden]: its output is times sigmoid(shared_gate . x) */
    int shared_inter;
} QMoe;

typedef struct {
    const float *attn_norm, *mlp_norm;
    QLin qkv, o, gate_up, down; /* gate_up and down unused where moe is set */
    const float *q_norm, *k_norm;               /* [D], per head before rope; or NULL */
    const float *post_attn_norm, *post_mlp_norm; /* [hidden], on branch outputs; or NULL */
    const float *cos, *sin;                     /* this layer's rope tables [max_len, R/2] */
    int window;                                 /* sliding window; 0: every key */
    const QMoe *moe;                            /* experts in place of the dense MLP; or NULL */
} QLayer;

/* gate [B] = sigmoid(w . x_b) for rows xf [B, ld]: the shared expert's gate, the same dot
 * product in the one-call decoder and the per-op path. */
void llmp_sigmoid_gate(const float *xf, int B, int ld, const float *w, int hidden, float *gate) {
    for (int b = 0; b < B; b++)
        gate[b] = 1.f / (1.f + expf(-dot_f32(xf + (int64_t)b * ld, w, hidden)));
}

/* x [rows, D] <- rmsnorm(x) * w, row by row, in place; over the threads when `par` (a
 * prefill step's: q/k norms have a row per head, so a decode step's count is no guide). */
static void rms_rows(float *x, int64_t rows, int D, const float *w, float eps, int par) {
    #pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; r++) {
        float *v = x + r * D;
        double ss = 0.0;
        for (int d = 0; d < D; d++) ss += (double)v[d] * v[d];
        float inv = 1.f / sqrtf((float)(ss / D) + eps);
        for (int d = 0; d < D; d++) v[d] = v[d] * inv * w[d];
    }
}

void llmp_rms_rows(float *x, int64_t rows, int D, const float *w, float eps) {
    rms_rows(x, rows, D, w, eps, 0);
}

/* Routing of B rows xf [B, ld] by an fp32 router [E, hidden]: softmax over the logits,
 * the top K (ties: the lower index), their weights renormalized to sum to 1 when asked.
 * logits [B, E] is scratch; choice and weight [B, K] the result. */
void llmp_route(const float *xf, int B, int ld, const float *router, int E, int hidden, int K,
                int renorm, float *logits, int32_t *choice, float *weight) {
    #pragma omp parallel for schedule(static) if ((int64_t)B * E * hidden > 65536)
    for (int64_t i = 0; i < (int64_t)B * E; i++)
        logits[i] = dot_f32(xf + (i / E) * ld, router + (i % E) * hidden, hidden);
    for (int b = 0; b < B; b++) {
        float *p = logits + (int64_t)b * E, mx = p[0], sum = 0.f, chosen = 0.f;
        int32_t *c = choice + (int64_t)b * K;
        float *cw = weight + (int64_t)b * K;
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int k = 0; k < K; k++) { /* top K by repeated arg max */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= c[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            c[k] = best;
            chosen += (cw[k] = p[best] / sum);
        }
        if (renorm)
            for (int k = 0; k < K; k++) cw[k] /= chosen;
    }
}

/* y [M, n] = x @ W.T; x both quantized (x8/dx/bs) and in fp32 (xf, row stride ld) for the
 * outlier columns. */
static int qlin(const QLin *l, int8_t *x8, float *dx, float *bs, int M, float *y,
                const float *xf, int ld) {
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

static void quantize_rows_padded(const float *x, int M, int K, int ld, int Kp, float *pad,
                                 int8_t *x8, float *dx, float *bs) {
    #pragma omp parallel for schedule(static) if (M >= PAR_ROWS)
    for (int m = 0; m < M; m++) {
        float *o = pad + (int64_t)m * Kp;
        memcpy(o, x + (int64_t)m * ld, K * sizeof(float));
        for (int k = K; k < Kp; k++) o[k] = 0.f;
        quantize_row(o, Kp, x8 + (int64_t)m * Kp, dx + (int64_t)m * (Kp / 32), bs + (int64_t)m * (Kp / 32));
    }
}

static int widest_row(int hidden, int heads, int D, int inter) {
    int hp = (hidden + 31) / 32 * 32, ap = (heads * D + 31) / 32 * 32, ip = (inter + 31) / 32 * 32;
    int widest = hp > ap ? hp : ap;
    return widest > ip ? widest : ip;
}

static int64_t dense_workspace(int B, int hidden, int heads, int kv_heads, int D, int inter) {
    int widest = widest_row(hidden, heads, D, inter), nqkv = (heads + 2 * kv_heads) * D;
    return (int64_t)B * (widest + 2 * (widest / 32) + 2 * nqkv + heads * D + 2 * inter + hidden)
           + (int64_t)B * widest / 4 + 16;
}

/* Floats the experts' scratch takes at batch B (none without experts): router logits and
 * choices, then for every (row, chosen expert) pair, B * K rows: its gathered input (fp32,
 * int8 and block scales), gate/up, activation and output. I: the wider of an expert and a
 * shared expert. */
static int64_t moe_workspace(int B, int hidden, int E, int K, int I) {
    if (E == 0) return 0;
    int64_t R = (int64_t)B * K, hp = (hidden + 31) / 32 * 32, ip = (I + 31) / 32 * 32;
    return (int64_t)B * E + 2 * (int64_t)B * K + 2 * R
           + R * (hp + hp / 16 + 2 * (int64_t)I + ip + ip / 16 + hidden) + R * (hp + ip) / 4 + 16;
}

/* Floats of the step workspace llmp_decode_layers needs at batch B: fp32 rows, block
 * scales and sums, projections, int8 codes, and the experts' scratch (E experts, top K,
 * width I; E = 0 without experts). The caller owns it (allocated once per batch size, not
 * once per step: a fresh megabyte each step is an mmap and its page faults). */
int64_t llmp_decode_workspace(int B, int hidden, int heads, int kv_heads, int D, int inter,
                              int E, int K, int I) {
    return dense_workspace(B, hidden, heads, kv_heads, D, inter) + moe_workspace(B, hidden, E, K, I);
}

/* One GEMM of a grouped pass: y [M, l->n] = x @ W.T. */
typedef struct {
    const QLin *l;
    const int8_t *x8;
    const float *dx, *bs, *xf; /* xf: the fp32 rows (stride l->k), for outlier columns */
    int M;
    float *y;
} GemmJob;

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
static int gemm_jobs(const GemmJob *jobs, int n) {
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

/* out [B, hidden] = the experts' MLP of the normed rows xf [B, hp] (quantized: x8/dx/bs).
 * The rows routed to each chosen expert are gathered side by side; every chosen expert's
 * gate_up runs in one grouped pass, the activation over all their rows at once, then every
 * down in one pass. Experts add their weighted rows in index order, as the per-op path
 * does. */
static int moe_mlp(const QMoe *M, int B, int hidden, int act, const float *xf,
                   const int8_t *x8, const float *dx, const float *bs, float *out, float *w) {
    int E = M->n_experts, K = M->top_k, I = M->inter, S = M->shared ? M->shared_inter : 0;
    int W = I > S ? I : S; /* the scratch holds the wider of an expert and the shared one */
    int hp = (hidden + 31) / 32 * 32, ip = (I + 31) / 32 * 32, sp = (S + 31) / 32 * 32;
    int wp = (W + 31) / 32 * 32, nbh = hp / 32, nbi = wp / 32;
    int64_t R = (int64_t)B * K;
    float *logits = w, *cw = logits + (int64_t)B * E, *rw = cw + R;
    int32_t *choice = (int32_t *)(rw + R), *rows = choice + R;
    float *gpad = (float *)(rows + R), *gdx = gpad + R * hp, *gbs = gdx + R * nbh;
    float *gu = gbs + R * nbh, *apad = gu + R * 2 * W;
    float *adx = apad + R * wp, *abs_ = adx + R * nbi;
    float *y = abs_ + R * nbi;
    int8_t *gx8 = (int8_t *)(y + R * hidden), *ax8 = gx8 + R * hp;
    llmp_route(xf, B, hp, M->router, E, hidden, K, M->renorm, logits, choice, cw);
    int starts[E + 1], used[E], n_used = 0, n = 0;
    GemmJob jobs[E];
    for (int e = 0; e < E; e++) { /* gather: expert e's rows at starts[e].. */
        starts[e] = n;
        for (int b = 0; b < B; b++)
            for (int k = 0; k < K; k++)
                if (choice[(int64_t)b * K + k] == e) rows[n] = b, rw[n++] = cw[(int64_t)b * K + k];
        if (n > starts[e]) used[n_used++] = e;
    }
    starts[E] = n;
    for (int i = 0; i < n; i++) {
        memcpy(gx8 + (int64_t)i * hp, x8 + (int64_t)rows[i] * hp, hp);
        memcpy(gpad + (int64_t)i * hp, xf + (int64_t)rows[i] * hp, hp * sizeof(float));
        memcpy(gdx + (int64_t)i * nbh, dx + (int64_t)rows[i] * nbh, nbh * sizeof(float));
        memcpy(gbs + (int64_t)i * nbh, bs + (int64_t)rows[i] * nbh, nbh * sizeof(float));
    }
    for (int u = 0; u < n_used; u++) {
        int e = used[u], a = starts[e];
        if (M->reads) M->reads[e]++;
        jobs[u] = (GemmJob){M->experts + 2 * e, gx8 + (int64_t)a * hp, gdx + (int64_t)a * nbh,
                            gbs + (int64_t)a * nbh, gpad + (int64_t)a * hp, starts[e + 1] - a,
                            gu + (int64_t)a * 2 * I};
    }
    if (gemm_jobs(jobs, n_used)) return -1;
    llmp_act_mul_quant(gu, n, I, ip, act, apad, ax8, adx, abs_);
    for (int u = 0; u < n_used; u++) {
        int e = used[u], a = starts[e];
        jobs[u] = (GemmJob){M->experts + 2 * e + 1, ax8 + (int64_t)a * ip, adx + (int64_t)a * (ip / 32),
                            abs_ + (int64_t)a * (ip / 32), apad + (int64_t)a * ip,
                            starts[e + 1] - a, y + (int64_t)a * hidden};
    }
    if (gemm_jobs(jobs, n_used)) return -1;
    memset(out, 0, (size_t)B * hidden * sizeof(float));
    for (int i = 0; i < n; i++) { /* weighted, then added: no fused multiply-add, as torch */
        float *o = out + (int64_t)rows[i] * hidden, *yr = y + (int64_t)i * hidden;
        for (int d = 0; d < hidden; d++) yr[d] *= rw[i];
        for (int d = 0; d < hidden; d++) o[d] += yr[d];
    }
    if (S == 0) return 0;
    /* the shared expert, every row: gate * shared(x), rounded, then added (as torch) */
    float *gate = logits; /* routing is done: its B * E floats are free */
    llmp_sigmoid_gate(xf, B, hp, M->shared_gate, hidden, gate);
    memcpy(gx8, x8, (size_t)B * hp); /* qlin may requantize its input in place */
    memcpy(gpad, xf, (size_t)B * hp * sizeof(float));
    memcpy(gdx, dx, (size_t)B * nbh * sizeof(float));
    memcpy(gbs, bs, (size_t)B * nbh * sizeof(float));
    if (qlin(M->shared, gx8, gdx, gbs, B, gu, gpad, hp)) return -1;
    llmp_act_mul_quant(gu, B, S, sp, act, apad, ax8, adx, abs_);
    if (qlin(M->shared + 1, ax8, adx, abs_, B, y, apad, sp)) return -1;
    for (int64_t i = 0; i < (int64_t)B * hidden; i++) y[i] *= gate[i / hidden];
    for (int64_t i = 0; i < (int64_t)B * hidden; i++) out[i] += y[i];
    return 0;
}

/* h += x over n floats (the residual), over the threads when `par`. */
static void add_rows(float *h, const float *x, int64_t n, int par) {
    #pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < n; i++) h[i] += x[i];
}

/* A prefill step's chunks for run_layers (NULL for a decode step): chunk i is T[i] rows
 * of the sequence in slot[i] at positions start[i].., rows row0[i].. of the step; full[i],
 * when not 0, the address of its prompt's k/v in full precision, [2, layers, kv_heads,
 * start + T, D] fp32, positions 0..start - 1 filled (a quantized cache's chunked prompt
 * attends as one prefilled whole would). The step's last nd rows, after every chunk's, are
 * decode rows of the sequences in dslot: each attends through the cache as a decode step's
 * row does, so the weights are read once for a step's prefill and decoding alike. */
typedef struct {
    int nc, layers;
    const int64_t *slot, *start, *T, *row0, *full;
    int nd;
    const int64_t *dslot;
} Spans;

static int prefill_attend(const KVC *c, int layer, const float *q, const float *kn,
                          const float *vn, const Spans *sp, int heads, int D, float scale,
                          int window, float *att);

/* Every block over h [B, hidden] (then, with `head`, the final norm and logits): B decode
 * rows (sp NULL: each at its own slot and position, attending through the cache), or a
 * prefill step's chunks (sp: each causal within itself, over its cached prefix).
 * Everything but attention is the same code, so prefill and decode rows round alike. */
static int run_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden,
                      int heads, int kv_heads, int D, int inter, float eps, int R, float scale,
                      int act, const KVC *cache, const int64_t *slots,
                      const int64_t *positions, float *work, float *moe_work,
                      const float *final_norm, const QLin *head, float *logits,
                      const Spans *sp) {
    int hp = (hidden + 31) / 32 * 32, ap = (heads * D + 31) / 32 * 32, ip = (inter + 31) / 32 * 32;
    int widest = widest_row(hidden, heads, D, inter);
    int nqkv = (heads + 2 * kv_heads) * D;
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
    int l = 0;
    for (; l < n_layers; l++) {
        const QLayer *L = layers + l;
        llmp_rmsnorm_quant(h, L->attn_norm, eps, B, hidden, hp, pad, x8, dx, bs);
        if (qlin(&L->qkv, x8, dx, bs, B, qkv, pad, hp)) break;
        #pragma omp parallel for schedule(static) if (B >= PAR_ROWS)
        for (int b = 0; b < B; b++) {
            const float *row = qkv + (int64_t)b * nqkv;
            memcpy(q + (int64_t)b * heads * D, row, heads * D * sizeof(float));
            memcpy(kn + (int64_t)b * kv_heads * D, row + heads * D, kv_heads * D * sizeof(float));
            memcpy(vn + (int64_t)b * kv_heads * D, row + (heads + kv_heads) * D, kv_heads * D * sizeof(float));
        }
        if (L->q_norm) rms_rows(q, (int64_t)B * heads, D, L->q_norm, eps, B >= PAR_ROWS);
        if (L->k_norm) rms_rows(kn, (int64_t)B * kv_heads, D, L->k_norm, eps, B >= PAR_ROWS);
        llmp_rope(q, positions, L->cos, L->sin, B, heads, D, R);
        llmp_rope(kn, positions, L->cos, L->sin, B, kv_heads, D, R);
        if (sp == NULL) {
            if (llmp_decode_attention(cache, l, q, kn, vn, slots, positions, B, heads, scale, L->window, att))
                break;
        } else {
            int64_t P = B - sp->nd; /* the chunks' rows; the decode rows follow them */
            if (sp->nc && prefill_attend(cache, l, q, kn, vn, sp, heads, D, scale, L->window, att))
                break;
            if (sp->nd && llmp_decode_attention(cache, l, q + P * heads * D, kn + P * kv_heads * D,
                                                vn + P * kv_heads * D, sp->dslot, positions + P,
                                                sp->nd, heads, scale, L->window, att + P * heads * D))
                break;
        }
        quantize_rows_padded(att, B, heads * D, heads * D, ap, pad, x8, dx, bs);
        if (qlin(&L->o, x8, dx, bs, B, tmp, pad, ap)) break;
        if (L->post_attn_norm) rms_rows(tmp, B, hidden, L->post_attn_norm, eps, B >= PAR_ROWS);
        add_rows(h, tmp, (int64_t)B * hidden, B >= PAR_ROWS);
        llmp_rmsnorm_quant(h, L->mlp_norm, eps, B, hidden, hp, pad, x8, dx, bs);
        if (L->moe) {
            if (moe_mlp(L->moe, B, hidden, act, pad, x8, dx, bs, tmp, moe_work)) break;
        } else {
            if (qlin(&L->gate_up, x8, dx, bs, B, gu, pad, hp)) break;
            llmp_act_mul_quant(gu, B, inter, ip, act, pad, x8, dx, bs);
            if (qlin(&L->down, x8, dx, bs, B, tmp, pad, ip)) break;
        }
        if (L->post_mlp_norm) rms_rows(tmp, B, hidden, L->post_mlp_norm, eps, B >= PAR_ROWS);
        add_rows(h, tmp, (int64_t)B * hidden, B >= PAR_ROWS);
    }
    if (l < n_layers) return -1;
    if (head == NULL) return 0;
    /* the final norm and a packed head: h stays the last block's output */
    llmp_rmsnorm_quant(h, final_norm, eps, B, hidden, hp, pad, x8, dx, bs);
    return qlin(head, x8, dx, bs, B, logits, pad, hp);
}

int llmp_decode_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden,
                        int heads, int kv_heads, int D, int inter, float eps, int R,
                        float scale, int act, const KVC *cache, const int64_t *slots,
                        const int64_t *positions, float *work, float *moe_work,
                        const float *final_norm, const QLin *head, float *logits) {
    return run_layers(layers, n_layers, h, B, hidden, heads, kv_heads, D, inter, eps, R, scale,
                      act, cache, slots, positions, work, moe_work, final_norm, head, logits,
                      NULL);
}

/* A decode step from token ids: what the one-call decoder needs besides the tokens, fixed
 * at load. The embedding is fp32 (kind 0), bf16 (1) or fp16 (2), rows times embed_scale. */
typedef struct {
    const QLayer *layers;
    int n_layers, hidden, heads, kv_heads, D, inter;
    float eps;
    int R;
    float scale;
    int act;
    const float *final_norm;
    const QLin *head;
    const void *embed;
    int embed_kind;
    float embed_scale;
} DecodeCtx;

/* logits [B, vocab] for the next token of the sequences in `slots`, whose last tokens are
 * `tokens`: each at position lengths[slot], whose k/v it stores; lengths[slot] then grows
 * by one. h [B, hidden] and positions [B] are scratch. One call where Python otherwise
 * makes a dozen torch operations, each slow after the step has streamed the weights
 * through the caches (cold code and data: 50-150 us each). */
int llmp_decode_tokens(const DecodeCtx *c, const KVC *cache, const int64_t *tokens,
                       const int64_t *slots, int B, int64_t *lengths, float *h,
                       int64_t *positions, float *work, float *moe_work, float *logits) {
    int H = c->hidden;
    for (int b = 0; b < B; b++) {
        positions[b] = lengths[slots[b]];
        float *row = h + (int64_t)b * H;
        if (c->embed_kind == 0) {
            const float *e = (const float *)c->embed + tokens[b] * H;
            for (int d = 0; d < H; d++) row[d] = e[d] * c->embed_scale;
        } else {
            const uint16_t *e = (const uint16_t *)c->embed + tokens[b] * H;
            for (int d = 0; d < H; d++) row[d] = widen16(e[d], c->embed_kind) * c->embed_scale;
        }
    }
    if (llmp_decode_layers(c->layers, c->n_layers, h, B, H, c->heads, c->kv_heads, c->D,
                           c->inter, c->eps, c->R, c->scale, c->act, cache, slots, positions,
                           work, moe_work, c->final_norm, c->head, logits))
        return -1;
    for (int b = 0; b < B; b++) lengths[slots[b]]++;
    return 0;
}

/* ---- Causal prefill attention of one chunk ------------------------------------------
 * q [T, heads, D] (row stride qs floats) at positions start..start+T-1 against keys and
 * values [kv_heads, L, D] (L = start + T, contiguous); row r of head h sees keys lo..p,
 * p = start + r, lo = max(0, p - window + 1) with a sliding window (window 0: none); out
 * [T, heads * D] (row stride os). One call a layer for every chunk of a step (torch took
 * ten small ops a chunk: 0.2 ms each, 18% of a 32-prompt step).
 *
 * A row's result depends on nothing but its own query and the keys it sees: each score is
 * a dot product summed in dimension order, the softmax sums run from lo in a fixed order,
 * and the weighted values add keys in position order, the keys a query may not see
 * weighing exactly 0. So a prompt's rows come out the same bits whether it was prefilled
 * whole, in chunks, beside other prompts, or after a cached prefix.
 *
 * Scores vectorize over a vector of keys at a time from the keys transposed in blocks (no
 * horizontal sums), for up to QG query vectors of one KV head at once (consecutive rows'
 * heads that share it), so each key is loaded once per group. */
#define QG 8
#if defined(__AVX512F__)
#define KB 16 /* keys per block of the transposed keys: one vector */
#else
#define KB 8
#endif
/* Keys transposed in blocks of KB: block b holds keys b*KB.. as [D][KB], so a block's
 * scores read 4*KB*D contiguous bytes (transposed whole, [D][L], each of a block's D
 * loads was a line of its own, 4 KB apart at L = 1024). Whole blocks plus one of zero
 * keys past L: every vector of keys is whole. */
#define KT_LEN(L) ((((L) + KB - 1) / KB + 1) * KB)
#define KT_AT(kt, D, j, d) ((kt)[((int64_t)(j) / KB) * (D) * KB + (int64_t)(d) * KB + (j) % KB])
#define KT_PAD (2 * KB) /* scores' scratch past L */
/* Keys a pass of the weighted values covers before the next dimensions: their rows stay in
 * L1 for every dimension block (the accumulators wait in `out`, the same sums in order). */
#define PV_KEYS 64

/* Compiled as written (no reassociation, no auto-vectorization): which loop computes a
 * key's term must not depend on where the group starts or how its buffers are aligned.
 * A function compiled with other options inlines no plain `inline` helper, so exp8 and the
 * horizontal sums are always_inline, and the maximum is vectorized by hand: called, and
 * fmaxf from libm per score, they took 30% of a 512-token layer's attention. */
__attribute__((optimize("no-associative-math", "no-tree-vectorize")))
static void attend_group(const float *const *qv, const int *lo, const int *hi,
                         const float *kt, const float *v, int64_t ldv, int D,
                         float scale, float *s, int lds, float *const *out) {
    int j0 = lo[0], j1 = hi[QG - 1]; /* keys any query of the group sees: j0..j1 */
    for (int q = 1; q < QG; q++) j0 = lo[q] < j0 ? lo[q] : j0;
    j0 -= j0 % KB; /* from a whole block: the keys before lo weigh exactly 0, as past hi */
    int n = j1 - j0 + 1;
    int j = 0;
#if defined(__AVX512F__) /* whole blocks of 16 keys, two at a time while both have keys:
    * 16 sums in flight hide the FMA latency, and each query broadcast feeds two FMAs
    * (1.3x the one-block loop's rate); every score is the same sum in the same order */
    for (; j + 16 < n; j += 32) {
        __m512 a0[QG], a1[QG];
        for (int q = 0; q < QG; q++) a0[q] = a1[q] = _mm512_setzero_ps();
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        const float *kd = kc + (int64_t)D * KB; /* the next block */
        for (int d = 0; d < D; d++) {
            __m512 k0 = _mm512_loadu_ps(kc + (int64_t)d * KB);
            __m512 k1 = _mm512_loadu_ps(kd + (int64_t)d * KB);
            for (int q = 0; q < QG; q++) {
                __m512 qq = _mm512_set1_ps(qv[q][d]);
                a0[q] = _mm512_fmadd_ps(qq, k0, a0[q]);
                a1[q] = _mm512_fmadd_ps(qq, k1, a1[q]);
            }
        }
        __m512 sv = _mm512_set1_ps(scale);
        for (int q = 0; q < QG; q++) {
            _mm512_storeu_ps(s + (int64_t)q * lds + j, _mm512_mul_ps(a0[q], sv));
            _mm512_storeu_ps(s + (int64_t)q * lds + j + 16, _mm512_mul_ps(a1[q], sv));
        }
    }
    for (; j < n; j += 16) {
        __m512 acc[QG];
        for (int q = 0; q < QG; q++) acc[q] = _mm512_setzero_ps();
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        for (int d = 0; d < D; d++) {
            __m512 k16 = _mm512_loadu_ps(kc + (int64_t)d * KB);
            for (int q = 0; q < QG; q++)
                acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(qv[q][d]), k16, acc[q]);
        }
        for (int q = 0; q < QG; q++)
            _mm512_storeu_ps(s + (int64_t)q * lds + j, _mm512_mul_ps(acc[q], _mm512_set1_ps(scale)));
    }
#elif defined(__AVX2__) /* whole blocks of 8 keys; two at a time while both have keys,
    * half the queries at a pass (16 registers: 8 sums, 2 key vectors, a broadcast), so a
    * broadcast feeds two FMAs; every score is the same sum in the same order */
    for (; j + 8 < n; j += 16) {
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        const float *kd = kc + (int64_t)D * KB; /* the next block */
        __m256 sv = _mm256_set1_ps(scale);
        for (int h = 0; h < QG; h += 4) {
            __m256 a0[4], a1[4];
            for (int q = 0; q < 4; q++) a0[q] = a1[q] = _mm256_setzero_ps();
            for (int d = 0; d < D; d++) {
                __m256 k0 = _mm256_loadu_ps(kc + (int64_t)d * KB);
                __m256 k1 = _mm256_loadu_ps(kd + (int64_t)d * KB);
                for (int q = 0; q < 4; q++) {
                    __m256 qq = _mm256_set1_ps(qv[h + q][d]);
                    a0[q] = _mm256_fmadd_ps(qq, k0, a0[q]);
                    a1[q] = _mm256_fmadd_ps(qq, k1, a1[q]);
                }
            }
            for (int q = 0; q < 4; q++) {
                _mm256_storeu_ps(s + (int64_t)(h + q) * lds + j, _mm256_mul_ps(a0[q], sv));
                _mm256_storeu_ps(s + (int64_t)(h + q) * lds + j + 8, _mm256_mul_ps(a1[q], sv));
            }
        }
    }
    for (; j < n; j += 8) {
        __m256 acc[QG];
        for (int q = 0; q < QG; q++) acc[q] = _mm256_setzero_ps();
        const float *kc = &KT_AT(kt, D, j0 + j, 0);
        for (int d = 0; d < D; d++) {
            __m256 k8 = _mm256_loadu_ps(kc + (int64_t)d * KB);
            for (int q = 0; q < QG; q++)
                acc[q] = _mm256_fmadd_ps(_mm256_set1_ps(qv[q][d]), k8, acc[q]);
        }
        for (int q = 0; q < QG; q++)
            _mm256_storeu_ps(s + (int64_t)q * lds + j, _mm256_mul_ps(acc[q], _mm256_set1_ps(scale)));
    }
#endif
    for (; j < n; j++)
        for (int q = 0; q < QG; q++) {
            float a = 0.f;
            for (int d = 0; d < D; d++) a = fmaf(qv[q][d], KT_AT(kt, D, j0 + j, d), a);
            s[(int64_t)q * lds + j] = a * scale;
        }
    /* softmax over each query's own keys; the others weigh exactly 0 */
    for (int q = 0; q < QG; q++) {
        float *sq = s + (int64_t)q * lds;
        int a = lo[q] - j0, b = hi[q] - j0 + 1;
        float m = -INFINITY, l = 0.f;
        int i = a;
#if defined(__AVX2__) /* a maximum is the same in any order */
        __m256 mx = _mm256_set1_ps(-INFINITY);
#if defined(__AVX512F__) /* four chains: one waited on its own latency (10% of the call) */
        if (b - i >= 64) {
            __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
            for (; i + 64 <= b; i += 64) {
                m0 = _mm512_max_ps(m0, _mm512_loadu_ps(sq + i));
                m1 = _mm512_max_ps(m1, _mm512_loadu_ps(sq + i + 16));
                m2 = _mm512_max_ps(m2, _mm512_loadu_ps(sq + i + 32));
                m3 = _mm512_max_ps(m3, _mm512_loadu_ps(sq + i + 48));
            }
            m0 = _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3));
            mx = _mm256_max_ps(_mm512_castps512_ps256(m0),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m0), 1)));
        }
#else
        if (b - i >= 32) {
            __m256 m1 = mx, m2 = mx, m3 = mx;
            for (; i + 32 <= b; i += 32) {
                mx = _mm256_max_ps(mx, _mm256_loadu_ps(sq + i));
                m1 = _mm256_max_ps(m1, _mm256_loadu_ps(sq + i + 8));
                m2 = _mm256_max_ps(m2, _mm256_loadu_ps(sq + i + 16));
                m3 = _mm256_max_ps(m3, _mm256_loadu_ps(sq + i + 24));
            }
            mx = _mm256_max_ps(_mm256_max_ps(mx, m1), _mm256_max_ps(m2, m3));
        }
#endif
        for (; i + 8 <= b; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sq + i));
        m = hmax8(mx);
#endif
        for (; i < b; i++) m = sq[i] > m ? sq[i] : m;
        i = a;
#if defined(__AVX2__)
        __m256 mv = _mm256_set1_ps(m), ls = _mm256_setzero_ps();
#if defined(__AVX512F__) /* 16 at a time, each half summed in turn: the 8-lane order */
        __m512 mw = _mm512_set1_ps(m);
        for (; i + 16 <= b; i += 16) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sq + i), mw));
            _mm512_storeu_ps(sq + i, e);
            ls = _mm256_add_ps(ls, _mm512_castps512_ps256(e));
            ls = _mm256_add_ps(ls, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
        }
#endif
        for (; i + 8 <= b; i += 8) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sq + i), mv));
            _mm256_storeu_ps(sq + i, e);
            ls = _mm256_add_ps(ls, e);
        }
        l = hsum8(ls);
#endif
        for (; i < b; i++) sq[i] = expf(sq[i] - m), l += sq[i];
        float r = 1.f / l;
        for (i = 0; i < a; i++) sq[i] = 0.f;
        i = a;
#if defined(__AVX2__) /* a product is the same in any lane (this loop was 10% scalar) */
        __m256 rv = _mm256_set1_ps(r);
        for (; i + 8 <= b; i += 8) _mm256_storeu_ps(sq + i, _mm256_mul_ps(_mm256_loadu_ps(sq + i), rv));
#endif
        for (; i < b; i++) sq[i] *= r;
        for (i = b; i < n; i++) sq[i] = 0.f;
    }
    /* out = sum over keys in position order of weight * value, 8 dimensions at a time */
    for (int ib = 0; ib < n; ib += PV_KEYS) {
        int ie = n - ib < PV_KEYS ? n : ib + PV_KEYS;
        int d = 0;
#if defined(__AVX512F__)
        for (; d + 32 <= D; d += 32) { /* 32 dimensions a pass: 16 sums in flight */
            __m512 a0[QG], a1[QG];
            for (int q = 0; q < QG; q++) {
                a0[q] = ib ? _mm512_loadu_ps(out[q] + d) : _mm512_setzero_ps();
                a1[q] = ib ? _mm512_loadu_ps(out[q] + d + 16) : _mm512_setzero_ps();
            }
            for (int i = ib; i < ie; i++) {
                const float *vr = v + (int64_t)(j0 + i) * ldv + d;
                __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16);
                for (int q = 0; q < QG; q++) {
                    __m512 w = _mm512_set1_ps(s[(int64_t)q * lds + i]);
                    a0[q] = _mm512_fmadd_ps(w, v0, a0[q]);
                    a1[q] = _mm512_fmadd_ps(w, v1, a1[q]);
                }
            }
            for (int q = 0; q < QG; q++) {
                _mm512_storeu_ps(out[q] + d, a0[q]);
                _mm512_storeu_ps(out[q] + d + 16, a1[q]);
            }
        }
        for (; d + 16 <= D; d += 16) {
            __m512 acc[QG];
            for (int q = 0; q < QG; q++)
                acc[q] = ib ? _mm512_loadu_ps(out[q] + d) : _mm512_setzero_ps();
            for (int i = ib; i < ie; i++) {
                __m512 v16 = _mm512_loadu_ps(v + (int64_t)(j0 + i) * ldv + d);
                for (int q = 0; q < QG; q++)
                    acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(s[(int64_t)q * lds + i]), v16, acc[q]);
            }
            for (int q = 0; q < QG; q++) _mm512_storeu_ps(out[q] + d, acc[q]);
        }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__) /* 16 dimensions of half the queries a pass:
        * a broadcast weight feeds two FMAs (the same sums in the same order) */
        for (; d + 16 <= D; d += 16)
            for (int h = 0; h < QG; h += 4) {
                __m256 a0[4], a1[4];
                for (int q = 0; q < 4; q++) {
                    a0[q] = ib ? _mm256_loadu_ps(out[h + q] + d) : _mm256_setzero_ps();
                    a1[q] = ib ? _mm256_loadu_ps(out[h + q] + d + 8) : _mm256_setzero_ps();
                }
                for (int i = ib; i < ie; i++) {
                    const float *vr = v + (int64_t)(j0 + i) * ldv + d;
                    __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
                    for (int q = 0; q < 4; q++) {
                        __m256 w = _mm256_set1_ps(s[(int64_t)(h + q) * lds + i]);
                        a0[q] = _mm256_fmadd_ps(w, v0, a0[q]);
                        a1[q] = _mm256_fmadd_ps(w, v1, a1[q]);
                    }
                }
                for (int q = 0; q < 4; q++) {
                    _mm256_storeu_ps(out[h + q] + d, a0[q]);
                    _mm256_storeu_ps(out[h + q] + d + 8, a1[q]);
                }
            }
#endif
#if defined(__AVX2__)
        for (; d + 8 <= D; d += 8) {
            __m256 acc[QG];
            for (int q = 0; q < QG; q++)
                acc[q] = ib ? _mm256_loadu_ps(out[q] + d) : _mm256_setzero_ps();
            for (int i = ib; i < ie; i++) {
                __m256 v8 = _mm256_loadu_ps(v + (int64_t)(j0 + i) * ldv + d);
                for (int q = 0; q < QG; q++)
                    acc[q] = _mm256_fmadd_ps(_mm256_set1_ps(s[(int64_t)q * lds + i]), v8, acc[q]);
            }
            for (int q = 0; q < QG; q++) _mm256_storeu_ps(out[q] + d, acc[q]);
        }
#endif
        for (; d < D; d++)
            for (int q = 0; q < QG; q++) {
                float a = ib ? out[q][d] : 0.f;
                for (int i = ib; i < ie; i++)
                    a = fmaf(s[(int64_t)q * lds + i], v[(int64_t)(j0 + i) * ldv + d], a);
                out[q][d] = a;
            }
    }
}

/* One chunk: q rows (stride qs), its keys/values (element (g, j, d) at g * kg + j * kj +
 * d, positions 0..start + T - 1), out rows (stride os). */
typedef struct {
    const float *q, *k, *v;
    float *out;
    int64_t qs, os, kg, kj, vg, vj;
    int T, start;
} PChunk;

/* Every chunk of a step in one call, its (chunk, KV head, query group) tasks spread over
 * the threads. Returns -1 when it cannot allocate its scratch. */
int llmp_prefill_attention(const PChunk *c, int nc, int heads, int kv_heads, int D,
                           float scale, int window) {
    int rep = heads / kv_heads, failed = 0;
    int64_t *kto = malloc(sizeof(int64_t) * (nc + 1)); /* chunk i's keys as [kvh, D, L] */
    int *first = malloc(sizeof(int) * (nc + 1));       /* its first task */
    if (kto == NULL || first == NULL) {
        free(kto), free(first);
        return -1;
    }
    kto[0] = 0, first[0] = 0;
    int64_t work = 0;
    for (int i = 0; i < nc; i++) {
        int L = c[i].start + c[i].T;
        kto[i + 1] = kto[i] + (int64_t)kv_heads * D * KT_LEN(L);
        first[i + 1] = first[i] + kv_heads * ((rep * c[i].T + QG - 1) / QG);
        work += (int64_t)rep * c[i].T * kv_heads * L * D;
    }
    float *kt = malloc(sizeof(float) * (size_t)(kto[nc] > 0 ? kto[nc] : 1));
    if (kt == NULL) {
        free(kto), free(first);
        return -1;
    }
    int tasks = first[nc];
    #pragma omp parallel if (work > 100000)
    {
        #pragma omp for schedule(dynamic, 4)
        for (int t = 0; t < nc * kv_heads; t++) {
            const PChunk *ch = c + t / kv_heads;
            int g = t % kv_heads, L = ch->start + ch->T;
            float *dst = kt + kto[t / kv_heads] + (int64_t)g * D * KT_LEN(L);
            for (int j = 0; j < L; j++) {
                const float *kr = ch->k + g * ch->kg + j * ch->kj;
                for (int d = 0; d < D; d++) KT_AT(dst, D, j, d) = kr[d];
            }
            for (int j = L; j < KT_LEN(L); j++)
                for (int d = 0; d < D; d++) KT_AT(dst, D, j, d) = 0.f;
        }
        int Lmax = 0;
        for (int i = 0; i < nc; i++) Lmax = c[i].start + c[i].T > Lmax ? c[i].start + c[i].T : Lmax;
        float *s = malloc(sizeof(float) * ((size_t)QG * (Lmax + 2 * KT_PAD) + D));
        if (s == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tasks; t++) {
            if (s == NULL) continue;
            int i = 0;
            while (first[i + 1] <= t) i++;
            const PChunk *ch = c + i;
            int per = rep * ch->T, groups = (per + QG - 1) / QG, u0 = t - first[i];
            int g = u0 % kv_heads, grp = groups - 1 - u0 / kv_heads; /* longest rows first */
            int L = ch->start + ch->T;
            const float *qv[QG];
            float *ov[QG];
            int lo[QG], hi[QG], nq = 0;
            for (int u = grp * QG; u < per && u < (grp + 1) * QG; u++, nq++) {
                int r = u / rep, h = g * rep + u % rep, p = ch->start + r;
                qv[nq] = ch->q + (int64_t)r * ch->qs + (int64_t)h * D;
                ov[nq] = ch->out + (int64_t)r * ch->os + (int64_t)h * D;
                hi[nq] = p;
                lo[nq] = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            }
            for (; nq < QG; nq++) { /* a short group: its last query again, into scratch */
                qv[nq] = qv[nq - 1], lo[nq] = lo[nq - 1], hi[nq] = hi[nq - 1];
                ov[nq] = s + (int64_t)QG * (Lmax + 2 * KT_PAD);
            }
            attend_group(qv, lo, hi, kt + kto[i] + (int64_t)g * D * KT_LEN(L),
                         ch->v + g * ch->vg, ch->vj, D, scale, s, Lmax + 2 * KT_PAD, ov);
        }
        free(s);
    }
    free(kt), free(kto), free(first);
    return failed ? -1 : 0;
}

/* Positions 0..n-1 of (layer, slot, head) of a quantized cache as kv_cache.py reads them:
 * whole groups dequantized (code * scale, then + minimum: two roundings, as torch computes
 * them, never one fused multiply-add), the rest from the fp32 residual; k/v [n, D]. */
__attribute__((optimize("fp-contract=off")))
static void kv_dequant(const KVC *c, int layer, int64_t slot, int head, int64_t n, float *k,
                       float *v) {
    int D = c->d, G = c->group, BS = c->block, bytes = D * c->bits / 8;
    int64_t done = n / G * G;
    float codes[1024];
    for (int64_t p = 0; p < done; p++) {
        int64_t blk = kv_block(c, slot, p), off = p % BS;
        const float *ks = c->ks + kv_blk(c, layer, blk, head, (int64_t)(BS / G) * D) + off / G * D;
        const float *km = c->km + kv_blk(c, layer, blk, head, (int64_t)(BS / G) * D) + off / G * D;
        float vs = c->vs[kv_blk(c, layer, blk, head, BS) + off];
        float vm = c->vm[kv_blk(c, layer, blk, head, BS) + off];
        codes_f32(c->kq + kv_blk(c, layer, blk, head, (int64_t)BS * bytes) + off * bytes, c->bits, D, codes);
        float *kr = k + p * D, *vr = v + p * D;
        for (int d = 0; d < D; d++) {
            float t = codes[d] * ks[d];
            kr[d] = t + km[d];
        }
        codes_f32(c->vq + kv_blk(c, layer, blk, head, (int64_t)BS * bytes) + off * bytes, c->bits, D, codes);
        for (int d = 0; d < D; d++) {
            float t = codes[d] * vs;
            vr[d] = t + vm;
        }
    }
    int64_t at = kv_at(c, layer, slot, head, (int64_t)G * D);
    memcpy(k + done * D, c->kr + at, (n - done) * D * sizeof(float));
    memcpy(v + done * D, c->vr + at, (n - done) * D * sizeof(float));
}

/* A prefill step's attention: each chunk attends to positions 0..start + T - 1 of its
 * sequence as the per-op path (runtime/model.py) does, and its rows are then stored in the
 * cache (a quantized cache quantizes each token group as it completes):
 * - with its prompt's k/v in full precision (Spans.full): its rows join them there, and it
 *   attends to them in place;
 * - else without a cached prefix: to its own rows in place;
 * - else to its prefix read back from the cache (an fp32 cache's blocks copied, a quantized
 *   one's dequantized) followed by its own rows, gathered into one buffer.
 * All chunks attend in one llmp_prefill_attention call: the same bits. -1: out of memory. */
static int prefill_attend(const KVC *c, int layer, const float *q, const float *kn,
                          const float *vn, const Spans *sp, int heads, int D, float scale,
                          int window, float *att) {
    int kvh = c->kv_heads, bsz = c->block, L_all = sp->layers;
    int64_t row = (int64_t)bsz * D, head = (int64_t)c->n_blocks * row;
    float *k0 = c->bits ? NULL : c->k + (int64_t)layer * kvh * head;
    float *v0 = c->bits ? NULL : c->v + (int64_t)layer * kvh * head;
    int64_t total = 0, qs = (int64_t)heads * D, rows = 0;
    for (int i = 0; i < sp->nc; i++) rows += sp->T[i];
    for (int i = 0; i < sp->nc; i++)
        if (sp->start[i] && !sp->full[i]) total += 2 * (int64_t)kvh * (sp->start[i] + sp->T[i]) * D;
    float *buf = malloc(sizeof(float) * (size_t)(total > 0 ? total : 1));
    PChunk *pc = malloc(sizeof(PChunk) * (size_t)(sp->nc > 0 ? sp->nc : 1));
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(sp->nc + 1));
    if (buf == NULL || pc == NULL || off == NULL) {
        free(buf), free(pc), free(off);
        return -1;
    }
    off[0] = 0;
    for (int i = 0; i < sp->nc; i++) {
        int64_t start = sp->start[i], T = sp->T[i], L = start + T, r0 = sp->row0[i];
        const float *qi = q + r0 * qs;
        float *ai = att + r0 * qs;
        off[i + 1] = off[i] + (start && !sp->full[i] ? 2 * (int64_t)kvh * L * D : 0);
        if (sp->full[i]) {
            float *fk = (float *)(intptr_t)sp->full[i] + (int64_t)layer * kvh * L * D;
            float *fv = fk + (int64_t)L_all * kvh * L * D;
            pc[i] = (PChunk){qi, fk, fv, ai, qs, qs, L * D, D, L * D, D, (int)T, (int)start};
        } else if (start == 0) { /* its own rows as they are, [T, kv_heads, D] */
            pc[i] = (PChunk){qi, kn + r0 * kvh * D, vn + r0 * kvh * D, ai, qs, qs, D,
                             (int64_t)kvh * D, D, (int64_t)kvh * D, (int)T, 0};
        } else {
            float *ks = buf + off[i], *vs = ks + (int64_t)kvh * L * D;
            pc[i] = (PChunk){qi, ks, vs, ai, qs, qs, L * D, D, L * D, D, (int)T, (int)start};
        }
    }
    /* per (chunk, KV head): read its prefix back, place its rows, store them in the cache,
     * in that order (storing may quantize a group the prefix read from the residual) */
    int tasks = sp->nc * kvh;
    #pragma omp parallel for schedule(dynamic, 1) if (tasks > 1 && total + 2 * rows * kvh * D > 65536)
    for (int t = 0; t < tasks; t++) {
        int i = t / kvh, g = t % kvh;
        int64_t start = sp->start[i], T = sp->T[i], L = start + T, r0 = sp->row0[i];
        const int32_t *table = c->table + sp->slot[i] * c->max_blocks;
        float *dk = NULL, *dv = NULL; /* where this chunk attends to its rows, if a copy */
        if (sp->full[i]) {
            dk = (float *)pc[i].k + g * L * D, dv = (float *)pc[i].v + g * L * D;
        } else if (start) {
            dk = buf + off[i] + g * L * D, dv = dk + (int64_t)kvh * L * D;
            if (c->bits)
                kv_dequant(c, layer, sp->slot[i], g, start, dk, dv);
            else
                for (int64_t p = 0; p < start; p += bsz) { /* a block's run at a time */
                    int64_t n = start - p < bsz ? start - p : bsz, from = g * head + table[p / bsz] * row;
                    memcpy(dk + p * D, k0 + from, n * D * sizeof(float));
                    memcpy(dv + p * D, v0 + from, n * D * sizeof(float));
                }
        }
        for (int64_t r = 0; r < T; r++) {
            const float *kr = kn + ((r0 + r) * kvh + g) * D, *vr = vn + ((r0 + r) * kvh + g) * D;
            if (dk) {
                memcpy(dk + (start + r) * D, kr, D * sizeof(float));
                memcpy(dv + (start + r) * D, vr, D * sizeof(float));
            }
            kv_write(c, layer, sp->slot[i], start + r, g, kr, vr);
        }
    }
    int rc = llmp_prefill_attention(pc, sp->nc, heads, kvh, D, scale, window);
    free(buf), free(pc), free(off);
    return rc;
}

/* Every block of a prefill step in one C call (llmp_decode_layers' code, with the causal
 * prefill attention): h [B, hidden] holds the step's rows, chunk by chunk (chunk i: T[i]
 * rows of the sequence in slot[i] at positions start[i]..., their blocks prepared; full[i]:
 * see Spans), then nd decode rows of the sequences in dslot (each at its position, its
 * block prepared), and is left holding the last block's output; positions [B] are the
 * rows' own. Any cache kind; -1: out of memory. */
int llmp_prefill_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden,
                        int heads, int kv_heads, int D, int inter, float eps, int R,
                        float scale, int act, const KVC *cache, int nc, const int64_t *slot,
                        const int64_t *start, const int64_t *T, const int64_t *row0,
                        const int64_t *full, int nd, const int64_t *dslot,
                        const int64_t *positions, float *work, float *moe_work) {
    Spans sp = {nc, n_layers, slot, start, T, row0, full, nd, dslot};
    return run_layers(layers, n_layers, h, B, hidden, heads, kv_heads, D, inter, eps, R, scale,
                      act, cache, NULL, positions, work, moe_work, NULL, NULL, NULL, &sp);
}
