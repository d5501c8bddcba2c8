// select_blocks (policy/select.h): scoring, the preselection restriction, the
// choice and the spans of one re-selection.
#include "longctx/policy/select.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "longctx/core/error.h"
#include "longctx/core/head_mask.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/node_executor.h"
#include "longctx/policy/preselect.h"
#include "longctx/policy/top_p.h"
#include "token_scores.h"

namespace longctx::policy {

using kvstore::Partition;

SelectSpec SelectSpec::from_config(const LongContextConfig& config, bool include_local, float attn_scale) {
  SelectSpec spec;
  spec.blocks = config.second_select_num;
  spec.mode = config.head_select_mode;
  spec.budget = config.budget;
  spec.score = cpu::ScoreParams{config.gqa_reduce, config.dynamic_reduce};
  spec.include_local = include_local;
  spec.attn_scale = attn_scale;
  return spec;
}

std::vector<double> fixed_part_logsums(const kvstore::KVStore& store, int layer, const TensorView& q, double scale,
                                       Reduce reduce, const std::vector<uint8_t>& heads) {
  cpu::check_decode_query(store, layer, q, "fixed_part_logsums");
  if (reduce != Reduce::kSum && reduce != Reduce::kMax)
    fail(ErrorCode::kInvalidArgument, "fixed_part_logsums: reduce is ", reduce_name(reduce), ", must be sum or max");
  const int n_kv_heads = store.layout().shape.n_kv_heads;
  check_head_mask(heads, n_kv_heads, "fixed_part_logsums", "heads");
  const int bs = store.layout().block_size;
  const int group = int(q.shape[0]) / n_kv_heads;
  const Partition part = store.partition(layer);
  // Everything but the ranked blocks: the sinks, the window and the blocks they reach into.
  const std::pair<int64_t, int64_t> ranges[2] = {{0, part.ranked_begin(bs)}, {part.ranked_end(bs), part.n_tokens}};
  // A token's logit: its group score (the sum or max of the g products) to the mean or max, at the scale.
  const float factor = float(reduce == Reduce::kMax ? scale : scale / group);
  std::vector<double> out(size_t(n_kv_heads), -std::numeric_limits<double>::infinity());
  kvstore::parallel_for_heads(store, n_kv_heads, [](int64_t h) { return int(h); }, [&](int64_t item) {
    const int h = int(item);
    if (!head_in_mask(heads, h)) {
      out[size_t(h)] = std::numeric_limits<double>::quiet_NaN();
      return;
    }
    const detail::GroupQuery gq = detail::group_query(q, h, group, reduce);
    std::vector<float> keys, scores;
    for (const auto& [begin, end] : ranges) detail::score_token_range(store, layer, h, gq, begin, end, keys, scores);
    if (scores.empty()) return;
    float m = -std::numeric_limits<float>::infinity();
    for (const float s : scores) m = std::max(m, s * factor);
    out[size_t(h)] = double(m) + std::log(detail::sum_exp(scores.data(), int64_t(scores.size()), factor, m));
  });
  return out;
}

namespace {

double attention_scale(const kvstore::KVStore& store, const SelectSpec& spec) {
  return spec.attn_scale > 0.f ? spec.attn_scale : 1.0 / std::sqrt(double(store.layout().shape.head_dim));
}

// The factor that takes a block score (the group's sum or max of unscaled
// q.k estimates) to the group's logit.
double logit_factor(const kvstore::KVStore& store, const TensorView& q, const SelectSpec& spec) {
  const int group = int(q.shape[0]) / store.layout().shape.n_kv_heads;
  return spec.score.gqa_reduce == Reduce::kMax ? attention_scale(store, spec) : attention_scale(store, spec) / group;
}

// Ada-KV compares the heads' scores with each other (adakv.h), so each head's
// row of block scores becomes the log of its ranked blocks' shares of their
// estimated attention, logit_b - log sum exp (the blocks are whole: equal
// sizes). Logs keep a head's order where the shares would underflow; a shift
// of all its logits (a constant added to its keys) no longer moves budget
// between heads. NaN scores stay NaN (ranked last) and do not count. The
// exponentials are f32 vectors (sum_exp): 8192 blocks per head at 128K.
void to_log_attention_shares(std::vector<float>& scores, int n_kv_heads, const Partition& p, double to_logit) {
  const int64_t n_context = p.end_context_block - p.first_context_block;
  const int64_t lo = p.first_ranked_block - p.first_context_block, hi = p.end_ranked_block - p.first_context_block;
  std::vector<float> counted;  // a row's ranked scores, NaN as -inf (no share)
  for (int h = 0; h < n_kv_heads; ++h) {
    float* row = scores.data() + size_t(h) * size_t(n_context);
    double m = -std::numeric_limits<double>::infinity();
    counted.clear();
    for (int64_t i = lo; i < hi; ++i) {
      counted.push_back(std::isnan(row[i]) ? -std::numeric_limits<float>::infinity() : row[i]);
      m = std::max(m, double(counted.back()) * to_logit);
    }
    if (!std::isfinite(m)) continue;  // no block, or an inf score: ranked as they are
    const float shift = float(m);      // the exponentials are f32 (sum_exp), their sum double
    const double log_total =
        double(shift) + std::log(detail::sum_exp(counted.data(), int64_t(counted.size()), float(to_logit), shift));
    for (int64_t i = lo; i < hi; ++i) row[i] = float(double(row[i]) * to_logit - log_total);
  }
}

}  // namespace

cpu::Selection select_blocks(const kvstore::KVStore& store, int layer, const TensorView& q, const SelectSpec& spec,
                             const Preselected* preselected, std::vector<double>* estimated_mass,
                             const HeadSelected& head_selected) {
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
  check_head_mask(spec.choosing_heads, n_kv_heads, "select_blocks", "SelectSpec::choosing_heads");
  const std::vector<int> choosers = choosing_head_list(spec.choosing_heads, n_kv_heads);
  const int n_choosers = int(choosers.size());
  const bool every_head = n_choosers == n_kv_heads;

  if (estimated_mass != nullptr) estimated_mass->clear();
  if (n_choosers == 0) {  // nothing to choose for: no scoring
    if (estimated_mass != nullptr && spec.budget.mode == BudgetConfig::Mode::kTopP)
      estimated_mass->assign(size_t(n_kv_heads), std::numeric_limits<double>::quiet_NaN());
    return build(std::vector<std::vector<int64_t>>(1));  // one empty list for every head
  }
  if (spec.budget.mode == BudgetConfig::Mode::kTopP) {
    std::vector<float> logits(size_t(n_kv_heads) * size_t(n_context));
    if (n_context > 0)
      cpu::score_blocks(store, layer, q, spec.score,
                        make_mutable_view(logits.data(), DType::kF32, {n_kv_heads, n_context}), {},
                        spec.choosing_heads);
    if (preselected != nullptr) restrict_scores_to(*preselected, n_kv_heads, partition, logits);
    // Blocks that are not ranked are in the fixed part (fixed_part_logsums).
    for (int h = 0; h < n_kv_heads; ++h)
      for (int64_t b = partition.first_context_block; b < partition.end_context_block; ++b)
        if (b < partition.first_ranked_block || b >= partition.end_ranked_block)
          logits[size_t(h * n_context + b - partition.first_context_block)] = -std::numeric_limits<float>::infinity();
    const double to_logit = logit_factor(store, q, spec);
    for (float& x : logits) x = float(double(x) * to_logit);
    std::vector<int64_t> tokens(static_cast<size_t>(n_context));
    for (int64_t i = 0; i < n_context; ++i) {
      const int64_t b = partition.first_context_block + i;
      tokens[size_t(i)] = partition.context_end_of(b, block_size) - partition.context_begin_of(b, block_size);
    }
    std::vector<double> fixed =
        fixed_part_logsums(store, layer, q, attention_scale(store, spec), spec.score.gqa_reduce, spec.choosing_heads);
    if (!every_head) {
      logits = rows_of(logits, n_context, choosers);
      fixed = rows_of(fixed, 1, choosers);
    }
    const MassChoice choice = choose_by_mass(logits, n_choosers, n_context, tokens, fixed, spec.mode, spec.budget);
    std::vector<std::vector<int64_t>> chosen = for_every_head(choice.chosen, choosers, n_kv_heads, spec.mode);
    for (auto& list : chosen)
      for (int64_t& i : list) i += partition.first_context_block;
    if (estimated_mass != nullptr) {
      estimated_mass->assign(size_t(n_kv_heads), std::numeric_limits<double>::quiet_NaN());
      for (int i = 0; i < n_choosers; ++i) (*estimated_mass)[size_t(choosers[size_t(i)])] = choice.mass[size_t(i)];
    }
    return build(chosen);
  }

  // Choices that need no scores: the preselected set kept as is, or every block.
  if (preselected != nullptr && keeps_preselected(*preselected, partition, spec.blocks))
    return build(preselected->blocks);
  const int64_t n_ranked = partition.end_ranked_block - partition.first_ranked_block;
  if (preselected == nullptr && spec.blocks >= n_ranked) {
    std::vector<int64_t> all(static_cast<size_t>(n_ranked));
    for (int64_t i = 0; i < n_ranked; ++i) all[size_t(i)] = partition.first_ranked_block + i;
    return build({all});
  }

  std::vector<float> scores(size_t(n_kv_heads) * size_t(n_context));
  const MutableTensorView scores_view = make_mutable_view(scores.data(), DType::kF32, {n_kv_heads, n_context});
  if (preselected == nullptr && spec.mode == HeadSelectMode::kSeparate &&
      spec.budget.policy == BudgetConfig::Policy::kUniform) {
    // choose_blocks' per-head top-k and the head's spans, each head's in the
    // task that completes its scores: no second parallel pass waits for them all.
    cpu::Selection selection;
    selection.spans.resize(size_t(n_kv_heads));
    const auto select_head = [&](int h, const std::vector<int64_t>& chosen) {
      // The head's spans: build_selection of this head alone.
      selection.spans[size_t(h)] =
          cpu::build_selection(partition, block_size, 1, {chosen}, spec.include_local).spans[0];
      if (head_selected) head_selected(h, selection.spans[size_t(h)]);
    };
    cpu::score_blocks(store, layer, q, spec.score, scores_view, [&](int h) {
      select_head(h, choose_head_blocks(scores.data() + size_t(h) * size_t(n_context), partition, spec.blocks));
    }, spec.choosing_heads);
    // The heads that choose nothing were not scored: no block of theirs.
    for (int h = 0; h < n_kv_heads; ++h)
      if (!head_in_mask(spec.choosing_heads, h)) select_head(h, {});
    return selection;
  }
  cpu::score_blocks(store, layer, q, spec.score, scores_view, {}, spec.choosing_heads);
  if (!every_head) scores = rows_of(scores, n_context, choosers);
  if (spec.mode == HeadSelectMode::kSeparate && spec.budget.policy == BudgetConfig::Policy::kAdaptive)
    to_log_attention_shares(scores, n_choosers, partition, logit_factor(store, q, spec));
  std::vector<std::vector<int64_t>> chosen;
  if (preselected == nullptr) {
    chosen = choose_blocks(scores, n_choosers, partition, spec.blocks, spec.mode, spec.budget);
  } else {
    const bool per_head = !every_head && preselected->blocks.size() == size_t(n_kv_heads);
    const Preselected choosers_preselected{per_head ? rows_of(preselected->blocks, 1, choosers) : preselected->blocks,
                                           preselected->count, preselected->first_unranked_block};
    chosen = reselect_blocks(choosers_preselected, std::move(scores), n_choosers, partition, spec.blocks, spec.mode,
                             spec.budget);
  }
  return build(every_head ? chosen : for_every_head(std::move(chosen), choosers, n_kv_heads, spec.mode));
}

}  // namespace longctx::policy
