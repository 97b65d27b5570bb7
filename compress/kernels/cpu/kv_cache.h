/* Where a token of the KV cache (llmpress.h's KVC) lives, and its codes as floats: read by
 * the decode and prefill attention and by kv_cache.c. */
#ifndef LLMPRESS_KV_CACHE_H
#define LLMPRESS_KV_CACHE_H

#include "internal.h"

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

/* Codes of channels d..D of one token as floats, in plain C: the reference, and what the
 * vectors leave. */
static inline void codes_f32_from(const uint8_t *p, int bits, int d, int D, float *out) {
    for (; d < D; d++) out[d] = bits == 8 ? p[d] : (p[d / 2] >> (4 * (d & 1))) & 0x0F;
}

/* Codes of one token's D channels as floats. */
#if defined(__AVX2__)
static inline void codes_f32(const uint8_t *p, int bits, int D, float *out) {
    int d = 0;
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
    codes_f32_from(p, bits, d, D, out);
}
#else
static inline void codes_f32(const uint8_t *p, int bits, int D, float *out) {
    codes_f32_from(p, bits, 0, D, out);
}
#endif

#endif
