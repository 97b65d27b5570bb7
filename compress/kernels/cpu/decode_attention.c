/* Decode attention over the KV cache (llmpress.h's KVC), fp32 or KIVI-quantized.
 * A query head never dequantizes a key: per group, qs = q * ks and c = q . km, so a score is
 * qs . code + c; values accumulate p * vs * code, and p * vm once per token. The query heads
 * that share a KV head are done together (each code is converted once), keys in chunks of
 * up to 32 within one block, with one softmax rescale per chunk; threads take (sequence,
 * KV head) pairs. */
#include "decode_attention_ref.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) /* 8-bit codes; the rest as AVX2 */
#include "decode_attention_avx512.h"
#define add_max add_max_avx2
#define exp_shift exp_shift_avx2
#define weigh_codes weigh_codes_avx2
#define isa_row_scores row_scores_avx2
#define isa_weighted_rows weighted_rows_avx2
#define scores_from_codes scores_from_codes_avx512
#define values_from_codes values_from_codes_avx512
#elif defined(__AVX2__)
#include "decode_attention_avx2.h"
#define add_max add_max_avx2
#define exp_shift exp_shift_avx2
#define weigh_codes weigh_codes_avx2
#define isa_row_scores row_scores_avx2
#define isa_weighted_rows weighted_rows_avx2
#define scores_from_codes scores_from_codes_avx2
#define values_from_codes values_from_codes_avx2
#else
#define add_max add_max_ref
#define exp_shift exp_shift_ref
#define weigh_codes weigh_codes_ref
#define isa_row_scores row_scores_ref
#define isa_weighted_rows weighted_rows_ref
#define scores_from_codes scores_from_codes_ref
#define values_from_codes values_from_codes_ref
#endif

/* Online softmax over one chunk of n scores of one head: s[i] += add (then capped, with
 * `cap`), the running max m raised (l, vmin_acc and out[0..D) rescaled once), then
 * s[i] = exp(s[i] - m). */
static void softmax_chunk(float *s, int n, float add, float cap, float *m, float *l,
                          float *vmin_acc, float *out, int D) {
    float bm = add_max(s, n, add);
    if (cap > 0.f) {
        cap_scores(s, n, cap);
        bm = add_max(s, n, 0.f);
    }
    if (bm > *m) {
        float f = expf(*m - bm);
        *l *= f, *vmin_acc *= f;
        for (int d = 0; d < D; d++) out[d] *= f;
        *m = bm;
    }
    exp_shift(s, n, *m);
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
    float lsum, msum;
    weigh_codes(p, vs, vm, n, w, &lsum, &msum);
    *l += lsum;
    return msum;
}

/* scores[t] = scale * q . rows[t] for n rows of D floats. */
static void row_scores(const float *q, const float *rows, int n, int D, float scale, float *scores) {
    isa_row_scores(q, rows, n, D, scale, scores);
}

/* out[0..D) += sum_t w[t] * rows[t]. */
static void weighted_rows(const float *w, const float *rows, int n, int D, float *out) {
    isa_weighted_rows(w, rows, n, D, out);
}

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
 * r's m and sum of exp(score - m): one span's share, for merge_spans. Scores are capped at
 * `cap` (0: not). */
static void attend_head(const KVC *c, int layer, int64_t slot, int head, int lo, int hi, int L,
                        int pf, int rep, float scale, float cap, const float *sink,
                        const float *q, float *out, float *ml) {
    int D = c->d;
    float m[REP_MAX], l[REP_MAX], vmin_acc[REP_MAX], s[REP_MAX][CHUNK_T], wr[REP_MAX][CHUNK_T];
    float qs[REP_MAX][HEAD_MAX], qc[REP_MAX], kbuf[CHUNK_T * HEAD_MAX], vbuf[CHUNK_T * HEAD_MAX];
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
            /* straight from the codes where the instruction set can, else widened */
            if (!scores_from_codes(qs, rep, kc, c->bits, n, D, scale, s)) {
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
            softmax_chunk(s[r], n, qc[r], cap, &m[r], &l[r], &vmin_acc[r], out + r * D, D);
            vmin_acc[r] += weigh_values(s[r], vsp, vmp, n, &l[r], wr[r]);
        }
        if (!quant) {
            for (int r = 0; r < rep; r++) weighted_rows(s[r], vrows, n, D, out + r * D);
        } else {
            const uint8_t *vc = c->vq + kv_blk(c, layer, blk, head, (int64_t)BS * bytes) + off * bytes;
            if (!values_from_codes(wr, rep, vc, c->bits, n, D, out)) {
                for (int t = 0; t < n; t++) codes_f32(vc + (int64_t)t * bytes, c->bits, D, vbuf + t * D);
                for (int r = 0; r < rep; r++) weighted_rows(wr[r], vbuf, n, D, out + r * D);
            }
        }
        t0 = t1;
    }
    for (int r = 0; r < rep; r++) {
        if (ml) ml[2 * r] = m[r], ml[2 * r + 1] = l[r];
        else if (sink) l[r] += expf(sink[r] - m[r]); /* the sink's share of the softmax */
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
static void merge_spans(const float *part, int64_t per, int n, int rep, int D, const float *sink,
                        float *out) {
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
        if (sink) den += expf(sink[r] - M);
        for (int d = 0; d < D; d++) o[d] /= den;
    }
}

/* One decode step of one layer: each sequence's new k/v [B, kv_heads, D] is stored at its
 * position, then its query heads q [B, heads, D] attend over position-window+1..position
 * (window 0: from 0), scores times `scale`, then capped at `softcap` (0: not), each head's
 * softmax denominator plus exp(sinks[h]) where `sinks` [H] is given (gpt-oss's and
 * granite_swa's learned sink: a score no value stands behind). out [B, heads, D]. 0, or -1
 * out of memory. */
int llmp_decode_attention(const KVC *c, int layer, const float *q, const float *knew,
                           const float *vnew, const int64_t *slots, const int64_t *positions,
                           int B, int H, float scale, int window, float softcap, float *out,
                           const float *sinks) {
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
                    const float *sk = sinks ? sinks + g * rep + r0 : NULL;
                    attend_head(c, layer, slots[b], g, lo, L, L, L, nr, scale, softcap, sk, q + h * D,
                                out + h * D, NULL);
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
                attend_head(c, layer, slots[b], g, a, z, L, run_end, nr, scale, softcap, NULL,
                            q + h * D, share + r0 * D, share + (int64_t)rep * D + 2 * r0);
            }
        }
        /* the last run of a (sequence, KV head) to finish merges its spans */
        if (np == 1 || __atomic_sub_fetch(&left[b * KVH + g], 1, __ATOMIC_ACQ_REL) == 0)
            merge_spans(shares, per, n, rep, D, sinks ? sinks + g * rep : NULL,
                        out + ((int64_t)b * H + (int64_t)g * rep) * D);
    }
    return 0;
}
