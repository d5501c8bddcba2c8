// select_blocks (policy/select.h): scoring, the preselection restriction, the
// choice and the spans of one re-selection.
#include "longctx/policy/select.h"

#include <utility>

#include "longctx/core/error.h"
#include "longctx/policy/preselect.h"

namespace longctx::policy {

using kvstore::Partition;

SelectSpec SelectSpec::from_config(const LongContextConfig& config, bool include_local) {
  SelectSpec spec;
  spec.blocks = config.second_select_num;
  spec.mode = config.head_select_mode;
  spec.budget = config.budget;
  spec.score = cpu::ScoreParams{config.gqa_reduce, config.dynamic_reduce};
  spec.include_local = include_local;
  return spec;
}

cpu::Selection select_blocks(const kvstore::KVStore& store, int layer, const TensorView& q, const SelectSpec& spec,
                             const Preselected* preselected) {
  cpu::check_decode_query(store, layer, q, "select_blocks");
  if (spec.blocks < 0)
    fail(ErrorCode::kInvalidArgument, "select_blocks: SelectSpec::blocks is ", spec.blocks, ", must be >= 0");
  const int n_kv_heads = store.layout().shape.n_kv_heads;
  const int block_size = store.layout().block_size;
  const Partition partition = store.partition(layer);
  const int64_t n_context = partition.end_context_block - partition.first_context_block;
  const auto build = [&](const std::vector<std::vector<int64_t>>& chosen) {
    return cpu::build_selection(partition, block_size, n_kv_heads, chosen, spec.include_local);
  };

  // Choices that need no scores: the preselected set kept as is, or every block.
  if (preselected != nullptr && spec.blocks >= preselected->count) return build(preselected->blocks);
  if (preselected == nullptr && spec.blocks >= n_context) {
    std::vector<int64_t> all(static_cast<size_t>(n_context));
    for (int64_t i = 0; i < n_context; ++i) all[size_t(i)] = partition.first_context_block + i;
    return build({all});
  }

  std::vector<float> scores(size_t(n_kv_heads) * size_t(n_context));
  cpu::score_blocks(store, layer, q, spec.score, make_mutable_view(scores.data(), DType::kF32, {n_kv_heads, n_context}));
  if (preselected == nullptr) return build(choose_blocks(scores, n_kv_heads, partition, spec.blocks, spec.mode, spec.budget));
  return build(reselect_blocks(preselected->blocks, preselected->count, std::move(scores), n_kv_heads, partition,
                               spec.blocks, spec.mode, spec.budget));
}

}  // namespace longctx::policy
