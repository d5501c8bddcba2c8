// The tail of a select step estimated, not dropped (config tail: estimate;
// ALGORITHMS.md "Estimated tail", after RetroInfer).
//
// For query head h (kv head g = h / (n_q_heads / n_kv_heads)) the tail is
// every context block b of the layer (Partition: [first_context_block,
// end_context_block)) that no span of selection.spans[g] touches. With n_b
// its tokens inside the context range and k̄_b, v̄_b the mean stored key and
// value of the block (the record's tail sums / the block's n_filled):
//   l_b = scale · q_h·k̄_b + log n_b,   w_b = exp(l_b - max_b l_b),
//   out_tail = Σ_b w_b v̄_b / Σ_b w_b,  lse_tail = max_b l_b + log Σ_b w_b,
// out_tail 0 and lse_tail -inf when the tail is empty. Merged by LSE with
// the exact part (merge_tail), the result is exactly the exact part when
// every block is selected and exactly the estimate when nothing is.
//
// By Jensen, n_b · exp(q·k̄_b) <= Σ_t exp(q·k_t): the estimate undercounts
// a peaked block, which is why the peaked blocks are the ones selected.
// RetroInfer uses k-means centroids; longctx's blocks are contiguous spans of
// tokens, so their means are coarser. A block that the sinks or the local
// window clip counts its context tokens only, with its whole block's means.
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

struct TailEstimate {
  std::vector<float> out;  // [n_q_heads][head_dim]
  std::vector<float> lse;  // [n_q_heads]
  int64_t tail_blocks = 0; // summed over kv heads
};

// q f32 [n_q_heads, head_dim]; scale 0 = 1/sqrt(head_dim). The store must
// keep tail sums (built with tail: estimate), else Error(kInvalidArgument).
TailEstimate estimate_tail(const kvstore::KVStore& store, int layer, const TensorView& q,
                           const cpu::Selection& selection, float scale);

// out/lse (the exact part, [n_q_heads, head_dim] / [n_q_heads], any row
// stride) become the LSE merge of themselves and the tail. Returns, per query
// head, the tail's estimated share of the merged softmax mass, exp(lse_tail -
// lse_merged) (0 for an empty tail).
std::vector<double> merge_tail(const TailEstimate& tail, const MutableTensorView& out, const MutableTensorView& lse);

}  // namespace longctx::policy
