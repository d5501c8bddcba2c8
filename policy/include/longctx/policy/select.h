// The one selection of a decode step of the select policy: what
// DecodePolicy runs when a layer re-selects, what `longctx-bench kernels`
// times and what the tests check. Score the layer's context blocks with the
// query (cpu::score_blocks), restrict them to the layer's preselected blocks
// when there are some, keep `blocks` of them (choose_blocks: SHARED sum over
// kv heads, SEPARATE per head, Ada-KV when budget.policy is adaptive) and
// build the token spans (cpu::build_selection: initial tokens, the chosen
// blocks, the blocks that are not ranked, the local window when include_local).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/policy/preselect.h"

namespace longctx::policy {

struct SelectSpec {
  int64_t blocks = 0;  // context blocks kept per kv head (second_select_num; top_k mode)
  HeadSelectMode mode = HeadSelectMode::kShared;
  BudgetConfig budget;  // top_k (uniform or Ada-KV in SEPARATE) or top_p (policy/top_p.h)
  cpu::ScoreParams score;
  bool include_local = true;  // attend the local window here (false when the GPU does)
  float attn_scale = 0.f;     // top_p's logits: the model's scale; 0 = 1/sqrt(head_dim)
  // A mask (core/head_mask.h): nonzero = the head chooses blocks; empty = every head. The others
  // (RazorAttention's non-retrieval heads, which never attend the blocks)
  // choose none, are not scored and do not steer the rest: SHARED sums the
  // choosing heads' scores, Ada-KV shares the choosing heads' budget among them.
  std::vector<uint8_t> choosing_heads;

  // The spec of `config`'s select policy at the model's attention scale.
  static SelectSpec from_config(const LongContextConfig& config, bool include_local, float attn_scale = 0.f);
};

// The selection of `layer` for decode query q (f32 [n_q_heads, head_dim]).
// top_k: without `preselected`, when spec.blocks covers every ranked block
// (Partition::first_ranked_block), all of them without scoring; otherwise score, choose, build. With it: the
// preselected set as is (no scoring) when keeps_preselected, else choose
// among the blocks it leaves (restrict_scores_to). top_p: score (restricted to
// the blocks the preselection leaves when given), then choose_by_mass with the exact
// logits of the sinks, the local window and the blocks that are not ranked as
// the fixed part;
// `estimated_mass`, when given, receives each kv head's estimated attended
// share (empty in top_k mode; NaN for a head that does not choose). With
// spec.choosing_heads and no head choosing, no block is chosen and nothing is
// scored. Throws Error(kInvalidArgument) naming the argument for a bad layer
// or q, spec.blocks < 0, or spec.choosing_heads of another size than the kv heads.
//
// head_selected, when set and where each head's blocks come from its own
// scores alone (SEPARATE with a uniform top_k budget, no preselection; the
// scores are needed), is called once for each kv head with the spans the
// returned selection gives it, from the scoring task that completes the
// head, while other heads are still being scored; calls for different heads
// may run at once. Other choices need every head's scores first and never
// call it. DecodePolicy attends each head there, so its attention needs no
// parallel pass of its own.
using HeadSelected = std::function<void(int kv_head, const std::vector<cpu::TokenSpan>& spans)>;
cpu::Selection select_blocks(const kvstore::KVStore& store, int layer, const TensorView& q, const SelectSpec& spec,
                             const Preselected* preselected = nullptr, std::vector<double>* estimated_mass = nullptr,
                             const HeadSelected& head_selected = {});

// log sum_t exp(e_t) over the always-attended tokens of `layer` (all but the
// ranked blocks': [0, ranked_begin) and [ranked_end, n_tokens)) per kv
// head, with e_t = the group's query heads' q.k_t combined by `reduce` (sum:
// their mean; max) times `scale`; -inf for a head with no such tokens. The
// products and their sums in f32 (vector kernels), the exponentials in f32
// summed in double; the kv heads in parallel. heads, a mask
// (core/head_mask.h: empty = every head), names the heads to sum for; the
// others get NaN. Throws Error(kInvalidArgument) for a bad layer or q, a reduce
// other than sum or max, or heads of another size than the kv heads.
std::vector<double> fixed_part_logsums(const kvstore::KVStore& store, int layer, const TensorView& q, double scale,
                                       Reduce reduce, const std::vector<uint8_t>& heads = {});

}  // namespace longctx::policy
