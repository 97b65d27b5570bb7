/* What every instruction set's decode attention shares: the chunk of keys a softmax
 * rescale covers, the most query heads of one KV head done together, the widest head. Each set's row
 * work is in its own file: decode_attention_ref.h (plain C, the reference and every set's
 * remainder), decode_attention_avx2.h (256-bit), decode_attention_avx512.h (512-bit forms
 * for 8-bit codes); decode_attention.c picks among them once, by the instruction sets the
 * build targets. */
#ifndef LLMPRESS_DECODE_ATTENTION_H
#define LLMPRESS_DECODE_ATTENTION_H

#include "kv_cache.h"

#define CHUNK_T 32
#define REP_MAX 16
#define HEAD_MAX 576 /* the widest head: latent attention's one cached head (512 + 64) */

#endif
