/* The compute ceiling of the packed GEMM (compress/runtime/bench.py's MFU): the rate of the
 * integer dot products its row tiles run, u8 x s8 summed into int32 lanes, on operands held
 * in registers, with as many independent sums as hide the instruction's latency. The same
 * instructions as gemm.c on each instruction set: 512-bit dpbusd with AVX-512 VNNI, 256-bit
 * dpbusd with AVX-VNNI, maddubs with int16 sums on AVX2, scalar products in portable C.
 * AMX tiles are not measured here. */
#include "internal.h"

#define SUMS 12 /* independent accumulators: latency 4-5 cycles x 2-3 ports */

static volatile int32_t sink; /* keeps the sums from being optimized away */

/* Each instruction set's loop: reps rounds of SUMS dot instructions on this thread, the
 * sums into *out; returns the products one instruction computes. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
static int64_t dot_loop(int64_t reps, int32_t *out) {
    __m512i acc[SUMS], u = _mm512_set1_epi8(1), s = _mm512_set1_epi8((char)(omp_thread() + 1));
    for (int j = 0; j < SUMS; j++) acc[j] = _mm512_set1_epi32(j);
    for (int64_t r = 0; r < reps; r++) {
#pragma GCC unroll 12
        for (int j = 0; j < SUMS; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], u, s);
        __asm__ volatile("" : "+v"(u)); /* u may have changed: no loop folding */
    }
    for (int j = 0; j < SUMS; j++) *out += _mm512_reduce_add_epi32(acc[j]);
    return 64;
}
#elif defined(__AVX2__)
#include "gemm_tile_avx2.h" /* dot_acc: the tiles' own product, dpbusd or maddubs */

static int64_t dot_loop(int64_t reps, int32_t *out) {
    __m256i acc[SUMS], u = _mm256_set1_epi8(1), s = _mm256_set1_epi8((char)(omp_thread() + 1));
    for (int j = 0; j < SUMS; j++) acc[j] = _mm256_set1_epi32(j);
    for (int64_t r = 0; r < reps; r++) {
#pragma GCC unroll 12
        for (int j = 0; j < SUMS; j++) acc[j] = dot_acc(acc[j], u, s);
        __asm__ volatile("" : "+x"(u));
    }
    for (int j = 0; j < SUMS; j++) {
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, acc[j]);
        for (int i = 0; i < 8; i++) *out += lanes[i];
    }
    return 32;
}
#else
static int64_t dot_loop(int64_t reps, int32_t *out) {
    int32_t acc[SUMS];
    uint8_t u = 1;
    int8_t s = (int8_t)(omp_thread() + 1);
    for (int j = 0; j < SUMS; j++) acc[j] = j;
    for (int64_t r = 0; r < reps; r++) {
        for (int j = 0; j < SUMS; j++) acc[j] += u * s;
        __asm__ volatile("" : "+r"(u));
    }
    for (int j = 0; j < SUMS; j++) *out += acc[j];
    return 1;
}
#endif

int64_t llmp_dot_peak(int64_t reps) {
    int64_t total = 0;
    #pragma omp parallel reduction(+ : total)
    {
        int32_t out = 0;
        int64_t per = dot_loop(reps, &out);
        sink = out;
        total += reps * SUMS * per;
    }
    return total;
}
