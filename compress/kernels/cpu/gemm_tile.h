/* What every instruction set's GEMM tiles share: how many rows a tile takes at once and
 * the software prefetch of the weight stream. The tiles themselves: gemm_tile_ref.h
 * (plain C, the reference), gemm_tile_avx2.h (256-bit, with or without VNNI),
 * gemm_tile_avx512.h (512-bit VNNI pairs of tiles), gemm_amx.h (AMX tiles); gemm.c
 * picks among them once, by the instruction sets the build targets. */
#ifndef LLMPRESS_GEMM_TILE_H
#define LLMPRESS_GEMM_TILE_H

#include "internal.h"

#define MT_MAX 4
/* Software prefetch of every line of a block, PF_DIST bytes ahead: the hardware prefetcher
 * alone left a thread's loads waiting on DRAM between blocks (on a Zen 3 EPYC one thread
 * streamed 7.4 GB/s against a plain sum's 10-11; prefetching both lines of each int4
 * block 2 KB ahead: 11.1). One line of each block, or 256 bytes ahead, did not help. */
#define PF_DIST 2048
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define PREFETCH2(p) (PREFETCH(p), PREFETCH((const char *)(p) + 64))

#endif
