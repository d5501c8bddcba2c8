// The per-piece decode attention kernel shared by attention.cpp (planning,
// threads, merge) and attention_hwy.cpp (the Highway code). Private to cpu/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::cpu::detail {

// Consecutive tokens [begin, end) of one block page (offsets inside the block,
// end <= the block's n_filled).
struct BlockSlice {
  const std::byte* k_t = nullptr;  // the page's K^T [head_dim][block_size]
  const std::byte* v = nullptr;    // the page's V [block_size][head_dim]
  int begin = 0;
  int end = 0;
  const uint16_t* k_scales = nullptr;  // q8_0: f16 [head_dim / 32][block_size]
  const uint16_t* v_scales = nullptr;  // q8_0: f16 [block_size][head_dim / 32]
};

// Software prefetch of a byte range into L2, in address order, paced by the
// kernel's own reads: prefetch_step(p, bytes) after reading `bytes` of the
// current slice requests as many bytes of the next one. The kernel walks a
// block page down its rows (K^T rows for a score tile, V rows for a channel
// tile), a pattern that DRAM and the hardware prefetchers serve at about half
// the bandwidth of a sequential read; requested in order while this slice
// computes, the next slice's lines then come from L2. Small steps: a burst of
// hundreds of prefetches stalls the loads behind it.
struct LinePrefetch {
  const char* at = nullptr;
  const char* end = nullptr;
  size_t credit = 0;
};

namespace {  // internal linkage: each file compiled for its own ISA keeps its own copy

inline void prefetch_step(LinePrefetch& p, size_t bytes) {
  constexpr size_t kLineBytes = 64;
  p.credit += bytes;
  for (; p.credit >= kLineBytes && p.at < p.end; p.credit -= kLineBytes, p.at += kLineBytes) {
    __builtin_prefetch(p.at, 0, 2);
  }
}

}  // namespace

// One piece of flash-decoding work: the g query heads of one kv head over the
// tokens of `slices`, in order.
struct PieceArgs {
  const float* q = nullptr;  // [g][head_dim], already multiplied by the scale
  int g = 0;
  int head_dim = 0;
  int block_size = 0;
  DType kv_type = DType::kF16;
  const BlockSlice* slices = nullptr;
  size_t n_slices = 0;
  float* out = nullptr;  // [g][head_dim]: normalized output (0 when no token)
  float* lse = nullptr;  // [g]: log-sum-exp of the scores (-inf when no token)
};

// Runs one piece on the best Highway target of this CPU (online softmax over
// the slices' tokens, fp32 accumulation). Inputs must be finite.
void attend_piece(const PieceArgs& args);

}  // namespace longctx::cpu::detail
