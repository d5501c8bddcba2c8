// SnapKV preselection (policy/preselect.h): observation-window votes, pooling,
// block sums, the preselected block sets and the restriction of later
// selections to them.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/head_mask.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/node_executor.h"
#include "longctx/policy/adakv.h"
#include "longctx/policy/preselect.h"
#include "token_scores.h"

namespace longctx::policy {

using cpu::top_k;

namespace {

using kvstore::KVStore;
using kvstore::Partition;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Shapes of one snapkv_token_votes call.
struct WindowShape {
  int n_kv_heads = 0;
  int g = 0;         // query heads per kv head
  int head_dim = 0;
  int block_size = 0;
  int64_t w = 0;     // window queries
  int64_t n_tokens = 0;
  int64_t n_blocks = 0;
  int64_t queries_per_head() const { return int64_t(g) * w; }  // (query head in group, window index)
};

void check_params(const SnapKVParams& p) {
  if (p.pool_kernel < 1 || p.pool_kernel % 2 == 0)
    fail(ErrorCode::kInvalidArgument, "snapkv_token_votes: pool_kernel is ", p.pool_kernel,
         ", must be odd and >= 1 (padding kernel/2 keeps the length)");
  if (p.pool != Reduce::kMax && p.pool != Reduce::kMean)
    fail(ErrorCode::kInvalidArgument, "snapkv_token_votes: pool is ", reduce_name(p.pool), ", must be max or mean");
  if (p.gqa_reduce != Reduce::kSum && p.gqa_reduce != Reduce::kMax)
    fail(ErrorCode::kInvalidArgument, "snapkv_token_votes: gqa_reduce is ", reduce_name(p.gqa_reduce),
         ", must be sum or max");
  if (!(p.scale >= 0.f) || std::isinf(p.scale))
    fail(ErrorCode::kInvalidArgument, "snapkv_token_votes: scale is ", p.scale, ", must be finite and >= 0");
}

// Keys of one block widened to f32, [head_dim][ld] (the page's K^T layout;
// ld >= block_size, as the token-score kernel reads it).
void widen_keys(const KVStore& store, const kvstore::BlockView& view, size_t ld, std::vector<float>& keys) {
  const auto& layout = store.layout();
  keys.resize(size_t(layout.shape.head_dim) * ld);
  kvstore::read_keys_t(layout, view, 0, layout.block_size, keys.data(), ld);
}

// 1-D pooling of one row, stride 1, padding kernel/2 (see preselect.h).
void pool_row(const float* in, float* out, int64_t n, int kernel, Reduce pool) {
  const int64_t r = kernel / 2;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t lo = std::max<int64_t>(0, j - r), hi = std::min<int64_t>(n, j + r + 1);
    float acc = pool == Reduce::kMax ? in[lo] : 0.f;
    for (int64_t t = lo; t < hi; ++t) acc = pool == Reduce::kMax ? std::max(acc, in[t]) : acc + in[t];
    out[j] = pool == Reduce::kMax ? acc : acc / float(kernel);
  }
}

}  // namespace

std::vector<float> snapkv_token_votes(const KVStore& store, int layer, const TensorView& window_q,
                                      const SnapKVParams& params) {
  const auto& layout = store.layout();
  if (layer < 0 || layer >= layout.shape.n_layers)
    fail(ErrorCode::kInvalidArgument, "snapkv_token_votes: layer ", layer, " out of range [0, ",
         layout.shape.n_layers, ")");
  check_params(params);
  check_dtype(window_q, "snapkv_token_votes: window_q", DType::kF32);
  check_shape(window_q, "snapkv_token_votes: window_q", {-1, -1, layout.shape.head_dim});
  check_inner_contiguous(window_q, "snapkv_token_votes: window_q");

  WindowShape s;
  s.n_kv_heads = layout.shape.n_kv_heads;
  s.head_dim = layout.shape.head_dim;
  s.block_size = layout.block_size;
  s.w = window_q.shape[0];
  s.n_tokens = store.n_tokens(layer);
  s.n_blocks = store.n_blocks(layer);
  const int64_t n_q_heads = window_q.shape[1];
  if (n_q_heads < 1 || n_q_heads % s.n_kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, "snapkv_token_votes: window_q has ", n_q_heads,
         " query heads, must be a positive multiple of the store's ", s.n_kv_heads, " kv heads");
  s.g = int(n_q_heads / s.n_kv_heads);
  if (s.w < 1 || s.w > s.n_tokens)
    fail(ErrorCode::kInvalidArgument, "snapkv_token_votes: window of ", s.w, " queries for layer ", layer, " with ",
         s.n_tokens, " tokens, must be in [1, n_tokens]");
  const float scale = params.scale > 0.f ? params.scale : 1.f / std::sqrt(float(s.head_dim));
  const int64_t first_query_pos = s.n_tokens - s.w;
  const int64_t nq = s.queries_per_head();  // query index qi = j * w + i (j: head in group, i: window index)

  // The window queries, gathered contiguous: [n_q_heads][w][head_dim].
  std::vector<float> queries(size_t(n_q_heads) * size_t(s.w) * size_t(s.head_dim));
  for (int64_t i = 0; i < s.w; ++i)
    for (int64_t hq = 0; hq < n_q_heads; ++hq) {
      const auto* src = static_cast<const float*>(window_q.element({i, hq, 0}));
      std::copy(src, src + s.head_dim, queries.begin() + ((hq * s.w + i) * s.head_dim));
    }
  const auto query = [&](int h, int64_t qi) { return queries.data() + size_t((int64_t(h) * nq + qi) * s.head_dim); };
  // Keys of a block that window query i sees: those at positions <= its own.
  const auto visible = [&](int64_t block, const kvstore::BlockView& view, int64_t i) {
    return int(std::clamp<int64_t>(first_query_pos + i + 1 - block * s.block_size, 0, view.n_filled));
  };
  const int64_t n_tasks = int64_t(s.n_kv_heads) * s.n_blocks;
  // Both passes walk the same (kv head, block) tasks, on the threads of the
  // node holding the head: widen the block's keys once, then for each window
  // query that sees some of them call visit(task, h, b, qi, logits, n).
  tbb::enumerable_thread_specific<std::pair<std::vector<float>, std::vector<float>>> scratch;  // keys, logits
  const size_t ld = size_t(detail::padded_tokens(s.block_size));  // a block's tokens in whole vectors
  const auto for_each_visible = [&](const auto& visit) {
    kvstore::parallel_for_heads(
        store, n_tasks, [&](int64_t task) { return int(task / s.n_blocks); },
        [&](int64_t task) {
          auto& [keys, logits] = scratch.local();
          const int h = int(task / s.n_blocks);
          const int64_t b = task % s.n_blocks;
          const kvstore::BlockView view = store.block(layer, h, b);
          widen_keys(store, view, ld, keys);
          // Every query of the head against every filled key at once: [nq][ld].
          logits.resize(size_t(nq) * ld);
          detail::row_scores_t(query(h, 0), int(nq), s.head_dim, keys.data(), ld, view.n_filled, scale,
                               logits.data());
          for (int64_t qi = 0; qi < nq; ++qi) {
            const int n = visible(b, view, qi % s.w);
            if (n > 0) visit(task, h, b, qi, logits.data() + size_t(qi) * ld, n);
          }
        });
  };

  // Pass 1: per (kv head, block, query) the max logit and sum of exp(logit - max).
  std::vector<float> block_max(size_t(n_tasks * nq), kNegInf), block_sum(size_t(n_tasks * nq), 0.f);
  for_each_visible([&](int64_t task, int, int64_t, int64_t qi, const float* logits, int n) {
    const float m = *std::max_element(logits, logits + n);
    block_max[size_t(task * nq + qi)] = m;
    block_sum[size_t(task * nq + qi)] = float(detail::sum_exp(logits, n, 1.f, m));
  });

  // Per (kv head, query): the global max and normalizer, blocks combined in order.
  std::vector<float> row_max(size_t(s.n_kv_heads * nq), kNegInf), row_sum(size_t(s.n_kv_heads * nq), 0.f);
  for (int h = 0; h < s.n_kv_heads; ++h)
    for (int64_t qi = 0; qi < nq; ++qi) {
      float m = kNegInf;
      for (int64_t b = 0; b < s.n_blocks; ++b) m = std::max(m, block_max[size_t((h * s.n_blocks + b) * nq + qi)]);
      float sum = 0.f;
      for (int64_t b = 0; b < s.n_blocks; ++b) {
        const size_t at = size_t((h * s.n_blocks + b) * nq + qi);
        if (block_sum[at] > 0.f) sum += block_sum[at] * std::exp(block_max[at] - m);
      }
      row_max[size_t(h * nq + qi)] = m;
      row_sum[size_t(h * nq + qi)] = sum;  // >= 1: the max term is exp(0)
    }

  // Pass 2: column sums of the probabilities over the window, per query head:
  // [n_q_heads][n_tokens]. A block's columns belong to its task alone.
  std::vector<float> columns(size_t(n_q_heads * s.n_tokens), 0.f);
  for_each_visible([&](int64_t, int h, int64_t b, int64_t qi, const float* logits, int n) {
    const float m = row_max[size_t(h * nq + qi)];
    const float inv_sum = 1.f / row_sum[size_t(h * nq + qi)];
    const int64_t hq = int64_t(h) * s.g + qi / s.w;
    detail::add_exp(logits, n, m, inv_sum, columns.data() + size_t(hq * s.n_tokens + b * s.block_size));
  });

  // Pooling per query head, then the group reduction per kv head.
  const auto zero_window = [&](float* row) { std::fill(row + first_query_pos, row + s.n_tokens, 0.f); };
  std::vector<float> pooled(columns.size());
  tbb::parallel_for(int64_t{0}, n_q_heads, [&](int64_t hq) {
    float* in = columns.data() + size_t(hq * s.n_tokens);
    float* out = pooled.data() + size_t(hq * s.n_tokens);
    if (params.prefix_only) zero_window(in);
    pool_row(in, out, s.n_tokens, params.pool_kernel, params.pool);
    if (params.prefix_only) zero_window(out);
  });
  std::vector<float> votes(size_t(s.n_kv_heads * s.n_tokens));
  for (int h = 0; h < s.n_kv_heads; ++h) {
    float* out = votes.data() + size_t(h * s.n_tokens);
    std::copy_n(pooled.data() + size_t(int64_t(h) * s.g * s.n_tokens), s.n_tokens, out);
    for (int j = 1; j < s.g; ++j) {
      const float* in = pooled.data() + size_t((int64_t(h) * s.g + j) * s.n_tokens);
      for (int64_t t = 0; t < s.n_tokens; ++t)
        out[t] = params.gqa_reduce == Reduce::kSum ? out[t] + in[t] : std::max(out[t], in[t]);
    }
  }
  return votes;
}

std::vector<float> block_votes(const std::vector<float>& token_votes, int n_kv_heads, const Partition& partition,
                               int block_size) {
  if (n_kv_heads < 1) fail(ErrorCode::kInvalidArgument, "block_votes: n_kv_heads is ", n_kv_heads, ", must be >= 1");
  if (block_size < 1) fail(ErrorCode::kInvalidArgument, "block_votes: block_size is ", block_size, ", must be >= 1");
  if (token_votes.size() != size_t(n_kv_heads) * size_t(partition.n_tokens))
    fail(ErrorCode::kInvalidArgument, "block_votes: ", token_votes.size(), " token votes for ", n_kv_heads,
         " kv heads x ", partition.n_tokens, " tokens");
  const int64_t n_context = partition.end_context_block - partition.first_context_block;
  std::vector<float> out(size_t(n_kv_heads) * size_t(n_context));
  for (int h = 0; h < n_kv_heads; ++h)
    for (int64_t i = 0; i < n_context; ++i) {
      const int64_t b = partition.first_context_block + i;
      double sum = 0.0;
      for (int64_t t = partition.context_begin_of(b, block_size); t < partition.context_end_of(b, block_size); ++t)
        sum += token_votes[size_t(h * partition.n_tokens + t)];
      out[size_t(h * n_context + i)] = float(sum);
    }
  return out;
}

namespace {

// Indices into the ranked part of a row of context-block scores (`row`
// starts at Partition::first_ranked_block) -> absolute blocks, -inf
// (excluded) dropped, sorted.
std::vector<int64_t> to_blocks(const std::vector<int64_t>& indices, const float* row, const Partition& partition) {
  std::vector<int64_t> blocks;
  for (const int64_t i : indices)
    if (!(std::isinf(row[i]) && row[i] < 0.f)) blocks.push_back(partition.first_ranked_block + i);
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

}  // namespace

std::vector<std::vector<int64_t>> choose_blocks(const std::vector<float>& scores, int n_kv_heads,
                                                const Partition& partition, int64_t count, HeadSelectMode mode,
                                                const BudgetConfig& budget) {
  if (n_kv_heads < 1) fail(ErrorCode::kInvalidArgument, "choose_blocks: n_kv_heads is ", n_kv_heads, ", must be >= 1");
  if (count < 0) fail(ErrorCode::kInvalidArgument, "choose_blocks: count is ", count, ", must be >= 0");
  const int64_t n_context = partition.end_context_block - partition.first_context_block;
  if (n_context < 0 || scores.size() != size_t(n_kv_heads) * size_t(n_context))
    fail(ErrorCode::kInvalidArgument, "choose_blocks: ", scores.size(), " scores for ", n_kv_heads, " kv heads x ",
         n_context, " context blocks");
  // Only the ranked blocks compete (Partition::first_ranked_block), columns [lo, lo + n_ranked).
  const int64_t lo = partition.first_ranked_block - partition.first_context_block;
  const int64_t n_ranked = partition.end_ranked_block - partition.first_ranked_block;
  std::vector<std::vector<int64_t>> chosen;
  if (mode == HeadSelectMode::kShared) {
    std::vector<float> total(scores.begin() + lo, scores.begin() + lo + n_ranked);
    for (int h = 1; h < n_kv_heads; ++h)
      for (int64_t i = 0; i < n_ranked; ++i) total[size_t(i)] += scores[size_t(h * n_context + lo + i)];
    chosen.push_back(to_blocks(top_k(total.data(), n_ranked, count), total.data(), partition));
  } else if (budget.policy == BudgetConfig::Policy::kAdaptive) {
    std::vector<float> ranked(size_t(n_kv_heads) * size_t(n_ranked));
    for (int h = 0; h < n_kv_heads; ++h)
      std::copy_n(scores.begin() + h * n_context + lo, n_ranked, ranked.begin() + h * n_ranked);
    const auto picked = adakv_select(ranked.data(), n_kv_heads, n_ranked, count, budget.alpha);
    for (int h = 0; h < n_kv_heads; ++h)
      chosen.push_back(to_blocks(picked[size_t(h)], ranked.data() + h * n_ranked, partition));
  } else {
    // One top-k per head, the heads in parallel: a decode step waits for them.
    chosen.resize(size_t(n_kv_heads));
    tbb::parallel_for(0, n_kv_heads, [&](int h) {
      chosen[size_t(h)] = choose_head_blocks(scores.data() + size_t(h) * size_t(n_context), partition, count);
    });
  }
  return chosen;
}

std::vector<int64_t> choose_head_blocks(const float* row, const Partition& partition, int64_t count) {
  const float* ranked = row + (partition.first_ranked_block - partition.first_context_block);
  return to_blocks(top_k(ranked, partition.end_ranked_block - partition.first_ranked_block, count), ranked, partition);
}

std::vector<std::vector<int64_t>> preselect_blocks(const std::vector<float>& block_votes, int n_kv_heads,
                                                   const Partition& partition, int64_t count, HeadSelectMode mode,
                                                   const BudgetConfig& budget) {
  return choose_blocks(block_votes, n_kv_heads, partition, count, mode, budget);
}

bool keeps_preselected(const Preselected& preselected, const Partition& partition, int64_t count) {
  return count >= preselected.count && partition.end_ranked_block <= preselected.first_unranked_block;
}

void restrict_scores_to(const Preselected& preselected, int n_kv_heads, const Partition& partition,
                        std::vector<float>& scores) {
  const int64_t n_context = partition.end_context_block - partition.first_context_block;
  if (n_kv_heads < 1 || n_context < 0 || scores.size() != size_t(n_kv_heads) * size_t(n_context))
    fail(ErrorCode::kInvalidArgument, "restrict_scores_to: ", scores.size(), " scores for ", n_kv_heads,
         " kv heads x ", n_context, " context blocks");
  const auto& lists = preselected.blocks;
  if (lists.size() != 1 && lists.size() != size_t(n_kv_heads))
    fail(ErrorCode::kInvalidArgument, "restrict_scores_to: ", lists.size(), " preselected lists for ",
         n_kv_heads, " kv heads (need 1, shared, or one per head)");
  std::vector<char> allowed(static_cast<size_t>(n_context));
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int64_t i = 0; i < n_context; ++i)
      allowed[size_t(i)] = partition.first_context_block + i >= preselected.first_unranked_block;
    for (const int64_t b : lists[lists.size() == 1 ? 0 : size_t(h)])
      if (b >= partition.first_context_block && b < partition.end_context_block)
        allowed[size_t(b - partition.first_context_block)] = 1;
    for (int64_t i = 0; i < n_context; ++i)
      if (!allowed[size_t(i)]) scores[size_t(h * n_context + i)] = kNegInf;
  }
}

std::vector<std::vector<int64_t>> reselect_blocks(const Preselected& preselected, std::vector<float> scores,
                                                  int n_kv_heads, const Partition& partition, int64_t count,
                                                  HeadSelectMode mode, const BudgetConfig& budget) {
  if (keeps_preselected(preselected, partition, count)) return preselected.blocks;
  restrict_scores_to(preselected, n_kv_heads, partition, scores);
  return choose_blocks(scores, n_kv_heads, partition, count, mode, budget);
}

std::vector<int> choosing_head_list(const std::vector<uint8_t>& choosing, int n_kv_heads) {
  check_head_mask(choosing, n_kv_heads, "choosing_head_list", "choosing");
  std::vector<int> heads;
  for (int h = 0; h < n_kv_heads; ++h)
    if (head_in_mask(choosing, h)) heads.push_back(h);
  return heads;
}

std::vector<std::vector<int64_t>> for_every_head(std::vector<std::vector<int64_t>> chosen,
                                                 const std::vector<int>& heads, int n_kv_heads, HeadSelectMode mode) {
  if (mode == HeadSelectMode::kShared) return chosen;
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n_kv_heads));
  for (size_t i = 0; i < heads.size(); ++i) out[size_t(heads[i])] = std::move(chosen[i]);
  return out;
}

void feed_dynamic(KVStore& store, int layer, const std::vector<float>& token_votes) {
  const int n_kv_heads = store.layout().shape.n_kv_heads;
  if (layer < 0 || layer >= store.layout().shape.n_layers)
    fail(ErrorCode::kInvalidArgument, "feed_dynamic: layer ", layer, " out of range [0, ",
         store.layout().shape.n_layers, ")");
  const int64_t n_tokens = store.n_tokens(layer);
  if (token_votes.size() != size_t(n_kv_heads) * size_t(n_tokens))
    fail(ErrorCode::kInvalidArgument, "feed_dynamic: ", token_votes.size(), " votes for layer ", layer, " with ",
         n_kv_heads, " kv heads x ", n_tokens, " tokens");
  if (n_tokens == 0) return;
  std::vector<float> importance(token_votes.size());  // [n_tokens][n_kv_heads]
  for (int h = 0; h < n_kv_heads; ++h)
    for (int64_t t = 0; t < n_tokens; ++t)
      importance[size_t(t * n_kv_heads + h)] = token_votes[size_t(h * n_tokens + t)];
  store.add_importance(layer, 0, make_view(importance.data(), DType::kF32, {n_tokens, n_kv_heads}));
}

}  // namespace longctx::policy
