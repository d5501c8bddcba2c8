// The arithmetic of one kv head's estimated tail (policy/tail.h), private to
// policy/src: tail_hwy.cpp, one Highway kernel dispatched at run time.
#pragma once

#include <cstddef>

namespace longctx::policy::detail {

struct TailHeadArgs {
  const float* const* sums = nullptr;  // [n] the blocks' tail sums: ksum, vsum, ksq ([3][d] each)
  const float* inv_filled = nullptr;   // [n] 1 / the block's n_filled
  const float* log_n = nullptr;        // [n] log of its tokens inside the context range
  size_t n = 0;                        // blocks, >= 1
  const float* q = nullptr;            // [group][d]
  const float* q_sq = nullptr;         // [group][d], q squared per channel
  int group = 0;
  int d = 0;                           // a multiple of 8
  float scale = 0.f;
  float* logits = nullptr;             // scratch [group][n]
  float* out = nullptr;                // [group][d]: the tail's output
  float* lse = nullptr;                // [group]
};

// l_b = scale (q·ksum_b) / n_b + log n_b + scale² (q²·ksq_b - q²·ksum_b² / n_b) / (2 n_b)
// (the variance term at least 0); out = Σ_b exp(l_b - m) vsum_b / n_b / Σ_b exp(l_b - m),
// lse = m + log Σ_b exp(l_b - m), m = max_b l_b.
void tail_head(const TailHeadArgs& args);

}  // namespace longctx::policy::detail
