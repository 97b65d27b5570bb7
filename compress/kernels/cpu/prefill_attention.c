/* Causal prefill attention of a step's chunks: q [T, heads, D] (row stride qs floats) at
 * positions start..start+T-1 against keys and values [kv_heads, L, D] (L = start + T,
 * contiguous); row r of head h sees keys lo..p, p = start + r, lo = max(0, p - window + 1)
 * with a sliding window (window 0: none), scores capped at softcap (0: not), each head's
 * softmax denominator plus exp(sinks[h]) where sinks is given; out
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
 * heads that share it), so each key is loaded once per group. The row work each
 * instruction set does is in prefill_attention_{ref,avx2,avx512}.h. */
#include "prefill_attention_ref.h"

#if defined(__AVX512F__)
#include "prefill_attention_avx512.h"
#define group_scores group_scores_avx512
#define scores_max scores_max_avx512
#define exp_sum exp_sum_avx512
#define scale_scores scale_scores_avx2
#define group_values group_values_avx512
#elif defined(__AVX2__)
#include "prefill_attention_avx2.h"
#define group_scores group_scores_avx2
#define scores_max scores_max_avx2
#define exp_sum exp_sum_avx2
#define scale_scores scale_scores_avx2
#define group_values group_values_avx2
#else
#define group_scores group_scores_ref
#define scores_max scores_max_ref
#define exp_sum exp_sum_ref
#define scale_scores scale_scores_ref
#define group_values group_values_ref
#endif

/* Compiled as written (no reassociation, no auto-vectorization): which loop computes a
 * key's term must not depend on where the group starts or how its buffers are aligned.
 * A function compiled with other options inlines no plain `inline` helper, so the row
 * work, exp8 and the horizontal sums are always_inline, and the maximum is vectorized by
 * hand: called, and fmaxf from libm per score, they took 30% of a 512-token layer's
 * attention. */
__attribute__((optimize("no-associative-math", "no-tree-vectorize")))
static void attend_group(const float *const *qv, const int *lo, const int *hi,
                         const float *kt, const float *v, int64_t ldv, int D,
                         float scale, float cap, const float *sink, float *s, int lds,
                         float *const *out) {
    int j0 = lo[0], j1 = hi[QG - 1]; /* keys any query of the group sees: j0..j1 */
    for (int q = 1; q < QG; q++) j0 = lo[q] < j0 ? lo[q] : j0;
    j0 -= j0 % KB; /* from a whole block: the keys before lo weigh exactly 0, as past hi */
    int n = j1 - j0 + 1;
    group_scores(qv, kt, D, j0, n, scale, s, lds);
    if (cap > 0.f) /* gemma2: every score capped before the mask and softmax */
        for (int q = 0; q < QG; q++) cap_scores(s + (int64_t)q * lds, n, cap);
    /* softmax over each query's own keys; the others weigh exactly 0 */
    for (int q = 0; q < QG; q++) {
        float *sq = s + (int64_t)q * lds;
        int a = lo[q] - j0, b = hi[q] - j0 + 1;
        float m = scores_max(sq, a, b);
        float den = exp_sum(sq, a, b, m);
        if (sink) den += expf(sink[q] - m); /* the sink's share (see llmp_decode_attention) */
        float r = 1.f / den;
        for (int i = 0; i < a; i++) sq[i] = 0.f;
        scale_scores(sq, a, b, r);
        for (int i = b; i < n; i++) sq[i] = 0.f;
    }
    /* out = sum over keys in position order of weight * value */
    for (int ib = 0; ib < n; ib += PV_KEYS) {
        int ie = n - ib < PV_KEYS ? n : ib + PV_KEYS;
        group_values(s, lds, v, ldv, j0, ib, ie, D, out);
    }
}

/* Every chunk of a step in one call, its (chunk, KV head, query group) tasks spread over
 * the threads. Returns -1 when it cannot allocate its scratch. */
int llmp_prefill_attention(const PChunk *c, int nc, int heads, int kv_heads, int D,
                           float scale, int window, float softcap, const float *sinks) {
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
            float sk[QG];
            for (int u = grp * QG; u < per && u < (grp + 1) * QG; u++, nq++) {
                int r = u / rep, h = g * rep + u % rep, p = ch->start + r;
                sk[nq] = sinks ? sinks[h] : 0.f;
                qv[nq] = ch->q + (int64_t)r * ch->qs + (int64_t)h * D;
                ov[nq] = ch->out + (int64_t)r * ch->os + (int64_t)h * D;
                hi[nq] = p;
                lo[nq] = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            }
            for (; nq < QG; nq++) { /* a short group: its last query again, into scratch */
                qv[nq] = qv[nq - 1], lo[nq] = lo[nq - 1], hi[nq] = hi[nq - 1], sk[nq] = sk[nq - 1];
                ov[nq] = s + (int64_t)QG * (Lmax + 2 * KT_PAD);
            }
            attend_group(qv, lo, hi, kt + kto[i] + (int64_t)g * D * KT_LEN(L),
                         ch->v + g * ch->vg, ch->vj, D, scale, softcap, sinks ? sk : NULL, s,
                         Lmax + 2 * KT_PAD, ov);
        }
        free(s);
    }
    free(kt), free(kto), free(first);
    return failed ? -1 : 0;
}
