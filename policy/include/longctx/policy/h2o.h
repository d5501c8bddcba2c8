// H2O baseline (Zhang et al., 2023): heavy hitters + recent tokens, with
// permanent eviction. One H2OState per layer.
//
// Per kv head h the state keeps a set of token positions, at most `budget`,
// and for each kept token j its accumulated attention
//   acc[h][j] = sum over the queries seen so far (prefill window, then one per
//               decode step) and over the g query heads of group h of
//               p(query head, j),
// where p is the softmax of q.k * scale (fp32) over the tokens that query
// attended: the causal prefix for a prefill query, the kept set for a decode
// query. acc is summed in fp64 over the decode steps (state, not a kernel:
// the extra bits keep rankings stable over long runs); the prefill window's
// share is SnapKV's unpooled votes (snapkv_token_votes: f32, vector kernels),
// and a step's probabilities come from the token-score kernels.
// Eviction keeps the last n_recent tokens of the layer and, among the other
// kept tokens, evicts the lowest acc first (ties: the older token first)
// until the set fits the budget. An evicted token never comes back: a later
// question about it cannot be answered, which is what makes H2O fail
// multi-query workloads.
// New tokens enter with acc 0 when a step first sees them; a layer whose
// state skipped init_from_prefill starts with every prompt token at acc 0.
// The engine initializes from the last preselect.window prompt queries
// (configs/h2o.yaml); the whole prompt reproduces the paper exactly.
// The kept set includes the recent window: step() attends all of it on the
// CPU (a device-side local window would have to be subtracted by the caller).
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

struct H2OParams {
  int64_t budget = 0;    // kept tokens per kv head (heavy + recent), >= 1
  int64_t n_recent = 0;  // the last n_recent tokens are never evicted; <= budget
  float scale = 0.f;     // 0 = 1/sqrt(head_dim)

  // budget = h2o_budget_tokens(config); heavy = floor(h2o.heavy_ratio * budget);
  // n_recent = budget - heavy.
  static H2OParams from_config(const LongContextConfig& config);
};

class H2OState {
 public:
  // Throws Error(kInvalidArgument) unless n_kv_heads >= 1, budget >= 1 and
  // 0 <= n_recent <= budget.
  H2OState(int n_kv_heads, const H2OParams& params);

  // At the end of prefill, before any step: every token of `layer` enters the
  // kept set, acc gets the probabilities of window_q's queries (f32 [w,
  // n_q_heads, head_dim], inner dimension contiguous: the queries of the last
  // w prompt tokens, positions n-w..n-1, each attending causally [0, its
  // position]; w = n_tokens gives H2O's "all prompt queries"), then the set
  // is evicted down to the budget. Throws Error(kInvalidArgument) on a shape
  // mismatch, w > n_tokens, or a state that has already seen tokens.
  void init_from_prefill(const kvstore::KVStore& store, int layer, const TensorView& window_q);

  // One decode step of `layer` (its new token(s) already appended): admits
  // the tokens the state has not seen, attends q (f32 [n_q_heads, head_dim])
  // over the kept set with decode_attention (out f32 [n_q_heads, head_dim],
  // lse f32 [n_q_heads]), accumulates the step's probabilities, evicts.
  void step(const kvstore::KVStore& store, int layer, const TensorView& q, const MutableTensorView& out,
            const MutableTensorView& lse);

  // The kept tokens as spans (sorted, merged), per kv head.
  cpu::Selection selection() const;
  // Kept positions of a head, ascending, and their acc (same order).
  const std::vector<int64_t>& kept(int kv_head) const { return heads_.at(size_t(kv_head)).positions; }
  const std::vector<double>& accumulated(int kv_head) const { return heads_.at(size_t(kv_head)).acc; }
  int64_t n_seen() const { return n_seen_; }  // tokens of the layer the state has admitted
  const H2OParams& params() const { return params_; }

 private:
  struct Head {
    std::vector<int64_t> positions;  // ascending
    std::vector<double> acc;
  };
  void admit(int64_t n_tokens);
  void evict(int64_t n_tokens);
  float scale_for(const kvstore::KVStore& store) const;

  H2OParams params_;
  std::vector<Head> heads_;  // [n_kv_heads]
  int64_t n_seen_ = 0;
};

}  // namespace longctx::policy
