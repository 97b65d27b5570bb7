/* Decode attention over the KV cache (llmpress.h's KVC), fp32 or KIVI-quantized.
 * A query head never dequantizes a key: per group, qs = q * ks and c = q . km, so a score is
 * qs . code + c; values accumulate p * vs * code, and p * vm once per token. The query heads
 * that share a KV head are done together (each code is converted once), keys in chunks of
 * up to 32 within one block, with one softmax rescale per chunk; threads take (sequence,
 * KV head) pairs. */
#include "kv_cache.h"

#define CHUNK_T 32
#define REP_MAX 16

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
