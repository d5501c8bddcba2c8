// The one selection of a decode step of the select policy: what
// DecodePolicy runs when a layer re-selects, what `longctx-bench kernels`
// times and what the tests check. Score the layer's context blocks with the
// query (cpu::score_blocks), restrict them to the layer's preselected blocks
// when there are some, keep `blocks` of them (choose_blocks: SHARED sum over
// kv heads, SEPARATE per head, Ada-KV when budget.policy is adaptive) and
// build the token spans (cpu::build_selection: initial tokens, the chosen
// blocks, the partial last block, the local window when include_local).
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

struct SelectSpec {
  int64_t blocks = 0;  // context blocks kept per kv head (second_select_num)
  HeadSelectMode mode = HeadSelectMode::kShared;
  BudgetConfig budget;  // SEPARATE: uniform top-k or Ada-KV
  cpu::ScoreParams score;
  bool include_local = true;  // attend the local window here (false when the GPU does)

  // The spec of `config`'s select policy.
  static SelectSpec from_config(const LongContextConfig& config, bool include_local);
};

// Blocks a layer may still choose from after SnapKV preselection: one list
// (shared by every kv head) or one per kv head, of at most `count`
// (preselect_block_count) absolute block indices.
struct Preselected {
  std::vector<std::vector<int64_t>> blocks;
  int64_t count = 0;
};

// The selection of `layer` for decode query q (f32 [n_q_heads, head_dim]).
// Without `preselected`: when spec.blocks covers every context block, all of
// them without scoring; otherwise score, choose, build. With it: the
// preselected set as is (no scoring) when spec.blocks >= preselected->count,
// else choose among the preselected blocks only. Throws
// Error(kInvalidArgument) naming the argument for a bad layer or q, or
// spec.blocks < 0.
cpu::Selection select_blocks(const kvstore::KVStore& store, int layer, const TensorView& q, const SelectSpec& spec,
                             const Preselected* preselected = nullptr);

}  // namespace longctx::policy
