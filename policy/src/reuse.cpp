// Reuse schedule of selections across decode steps and layers (policy/reuse.h).
#include "longctx/policy/reuse.h"

#include <algorithm>
#include <utility>

#include "longctx/core/error.h"

namespace longctx::policy {

using cpu::Selection;
using cpu::TokenSpan;

ReuseSchedule::ReuseSchedule(const LongContextConfig& config)
    : ReuseSchedule(config.dense_layer_num, config.layer_step, config.token_step) {}

ReuseSchedule::ReuseSchedule(int dense_layer_num, int layer_step, int token_step)
    : dense_layer_num_(dense_layer_num), layer_step_(layer_step), token_step_(token_step) {
  if (dense_layer_num < 0 || layer_step < 1 || token_step < 1) {
    fail(ErrorCode::kInvalidArgument, "ReuseSchedule: need dense_layer_num >= 0, layer_step >= 1, token_step >= 1; got ",
         dense_layer_num, ", ", layer_step, ", ", token_step);
  }
}

bool ReuseSchedule::is_leader(int layer) const {
  return !is_dense(layer) && layer % layer_step_ == dense_layer_num_ % layer_step_;
}

bool ReuseSchedule::reselects(int layer, int64_t token_idx) const {
  return is_leader(layer) && token_idx % token_step_ == 0;
}

int ReuseSchedule::group_of(int layer) const {
  if (is_dense(layer)) {
    fail(ErrorCode::kInvalidArgument, "ReuseSchedule::group_of: layer ", layer,
         " is dense (dense_layer_num = ", dense_layer_num_, ") and belongs to no selection group");
  }
  return dense_layer_num_ + (layer - dense_layer_num_) / layer_step_ * layer_step_;
}

SelectionCache::SelectionCache(int n_layers) : saved_(size_t(std::max(n_layers, 0))) {}

const SavedSelection* SelectionCache::get(int group) const {
  if (group < 0 || group >= n_layers()) {
    fail(ErrorCode::kInvalidArgument, "SelectionCache::get: layer ", group, " outside 0..", n_layers() - 1);
  }
  const auto& slot = saved_[size_t(group)];
  return slot ? &*slot : nullptr;
}

void SelectionCache::put(int group, SavedSelection saved) {
  if (group < 0 || group >= n_layers()) {
    fail(ErrorCode::kInvalidArgument, "SelectionCache::put: layer ", group, " outside 0..", n_layers() - 1);
  }
  saved_[size_t(group)] = std::move(saved);
}

void SelectionCache::clear() {
  for (auto& slot : saved_) slot.reset();
}

ReuseAction decide(const ReuseSchedule& schedule, const SelectionCache& cache, int layer, int64_t token_idx) {
  if (schedule.is_dense(layer)) return ReuseAction::kDense;
  if (schedule.reselects(layer, token_idx)) return ReuseAction::kSelect;
  return cache.get(schedule.group_of(layer)) == nullptr ? ReuseAction::kSelect : ReuseAction::kReuse;
}

Selection extend_with_new_tokens(const Selection& selection, int64_t old_end, int64_t new_end) {
  if (old_end > new_end) {
    fail(ErrorCode::kInvalidArgument, "extend_with_new_tokens: old_end ", old_end, " > new_end ", new_end);
  }
  Selection out;
  out.spans.reserve(selection.spans.size());
  for (const std::vector<TokenSpan>& head : selection.spans) {
    std::vector<TokenSpan> spans = head;
    if (old_end < new_end) {
      const TokenSpan added{old_end, new_end};
      spans.insert(std::upper_bound(spans.begin(), spans.end(), added,
                                    [](const TokenSpan& a, const TokenSpan& b) { return a.begin < b.begin; }),
                   added);
    }
    // Merge overlapping or adjacent spans (the input is sorted by begin).
    std::vector<TokenSpan> merged;
    for (const TokenSpan& span : spans) {
      if (!merged.empty() && span.begin <= merged.back().end) {
        merged.back().end = std::max(merged.back().end, span.end);
      } else {
        merged.push_back(span);
      }
    }
    out.spans.push_back(std::move(merged));
  }
  return out;
}

Selection reused_selection(const SavedSelection& saved, const kvstore::Partition& now) {
  if (now.n_tokens < saved.partition.n_tokens) {
    fail(ErrorCode::kInvalidArgument, "reused_selection: the layer holds ", now.n_tokens,
         " tokens, fewer than the ", saved.partition.n_tokens, " the saved selection was made on");
  }
  const auto cpu_end = [&](const kvstore::Partition& p) { return saved.include_local ? p.n_tokens : p.local_begin; };
  return extend_with_new_tokens(saved.selection, cpu_end(saved.partition), cpu_end(now));
}

}  // namespace longctx::policy
