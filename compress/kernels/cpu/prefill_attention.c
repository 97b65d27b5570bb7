/* Causal prefill attention of a step's chunks: q [T, heads, D] (row stride qs floats) at
 * positions start..start+T-1 against keys and values [kv_heads, L, D] (L = start + T,
 * contiguous); row r of head h sees keys lo..p, p = start + r, lo = max(0, p - window + 1)
 * with a sliding window (window 0: none); out [T, heads * D] (row stride os). One call a layer for every chunk of a step (torch took
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
#include "internal.h"

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
