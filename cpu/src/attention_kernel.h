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
