// The tail of a select step estimated, not dropped (config tail: estimate;
// ALGORITHMS.md "Estimated tail", after RetroInfer).
//
// For query head h (kv head g = h / (n_q_heads / n_kv_heads)) the tail is
// every context block b of the layer (Partition: [first_context_block,
// end_context_block)) that no span of selection.spans[g] touches. With n_b
// its tokens inside the context range, k̄_b, v̄_b the mean stored key and
// value of the block and σ²_b,c the variance of its keys' channel c (from
// the record's tail sums over the block's n_filled tokens):
//   l_b = scale · q_h·k̄_b + log n_b + scale² Σ_c q_h,c² σ²_b,c / 2,
//   w_b = exp(l_b - max_b l_b),
//   out_tail = Σ_b w_b v̄_b / Σ_b w_b,  lse_tail = max_b l_b + log Σ_b w_b,
// out_tail 0 and lse_tail -inf when the tail is empty. Merged by LSE with
// the exact part (merge_tail), the result is exactly the exact part when
// every block is selected and exactly the estimate when nothing is.
//
// Why the variance term: by Jensen, n_b · exp(q·k̄_b) <= Σ_t exp(q·k_t), so
// the mean alone (RetroInfer's centroid formula, ALGORITHMS.md) undercounts
// every block, the more the more its scores spread. If a block's scores
// q·k_t were normal, Σ_t exp(s q·k_t) ≈ n_b exp(s μ + s² σ² / 2); σ² is taken
// from the per-channel variances (the channels' covariances are not kept).
// On longctx-bench accuracy's multiquery workload at 128K and 1% attended
// this cut the L1 error against dense from 0.51x to 0.03x of QUEST's. Values
// are still weighted by their plain mean. RetroInfer uses k-means centroids;
// longctx's blocks are contiguous spans of tokens, so their statistics are
// coarser. A block that the sinks or the local window clip counts its
// context tokens only, with its whole block's statistics.
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
