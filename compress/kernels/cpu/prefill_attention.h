/* What every instruction set's prefill attention shares: the query group, the blocked
 * layout of the transposed keys and the values' key passes. Each set's row work is in its
 * own file: prefill_attention_ref.h (plain C, the reference and every set's remainder),
 * prefill_attention_avx2.h (256-bit), prefill_attention_avx512.h (512-bit);
 * prefill_attention.c picks among them once, by the instruction sets the build targets. */
#ifndef LLMPRESS_PREFILL_ATTENTION_H
#define LLMPRESS_PREFILL_ATTENTION_H

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

#endif
