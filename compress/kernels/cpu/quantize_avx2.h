/* One block of 32 activations as int8 in 256-bit vectors: quantize_ref.h's codes, scale
 * and sum. */
#ifndef LLMPRESS_QUANTIZE_AVX2_H
#define LLMPRESS_QUANTIZE_AVX2_H

#include "internal.h"
#if !defined(__AVX2__)
#error "quantize_avx2.h needs AVX2"
#endif

INLINE void quantize_block_avx2(const float *xb, int8_t *qr, float *dr, float *bs) {
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
    _mm256_storeu_si256((__m256i *)qr, p8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    *dr = d;
    *bs = d * (float)_mm_cvtsi128_si32(s4);
}

#endif
