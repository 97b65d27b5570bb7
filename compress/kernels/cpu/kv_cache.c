/* Writing to the KV cache (llmpress.h's KVC) and reading a quantized one back. */
#include "kv_cache.h"

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

void kv_write(const KVC *c, int layer, int64_t slot, int64_t pos, int head,
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

/* Positions 0..n-1 of (layer, slot, head) of a quantized cache as kv_cache.py reads them:
 * whole groups dequantized (code * scale, then + minimum: two roundings, as torch computes
 * them, never one fused multiply-add), the rest from the fp32 residual; k/v [n, D]. */
__attribute__((optimize("fp-contract=off")))
void kv_dequant(const KVC *c, int layer, int64_t slot, int head, int64_t n, float *k,
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
