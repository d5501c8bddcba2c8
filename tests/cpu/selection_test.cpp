// top_k, build_selection, select_blocks, select_all and the token-budget
// helper, each against a plain reference: a stable sort for top_k, a
// per-token boolean mask for the spans, fp64 block scores for select_blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/selection.h"
#include "reference.h"
#include "store_fixture.h"

namespace longctx::cpu {
namespace {

using kvstore::Partition;
using testing::expect_invalid_argument;
using testing::spans_of;
using testing::StoreCase;
using testing::TestStore;
using RT = RepresentativeType;

constexpr double kEps32 = 0x1p-23;

// ------------------------------------------------------------------ top_k

// Reference: indices stably sorted by decreasing score, NaN last.
std::vector<int64_t> reference_top_k(const std::vector<float>& scores, int64_t k) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const float x = scores[size_t(a)], y = scores[size_t(b)];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return x > y;
  });
  order.resize(size_t(std::clamp<int64_t>(k, 0, int64_t(scores.size()))));
  return order;
}

TEST(TopK, MatchesStableSortWithTiesNaNAndInfinities) {
  std::mt19937 rng(11);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {nan, -nan, inf, -inf, 0.f, -0.f, 1e-45f, -1e-45f, 3.5f, -3.5f};
  int checked = 0;
  for (const int64_t n : {0, 1, 2, 3, 7, 64, 100, 1000, 4099}) {
    for (int trial = 0; trial < 6; ++trial) {
      // trial 0-1: few distinct values (many ties); 2-3: specials; 4-5: continuous.
      std::vector<float> scores(static_cast<size_t>(n));
      std::uniform_int_distribution<int> small(-3, 3);
      std::normal_distribution<float> normal;
      for (float& s : scores) {
        if (trial < 2) s = float(small(rng));
        else if (trial < 4) s = specials[rng() % specials.size()];
        else s = normal(rng);
      }
      for (const int64_t k : {int64_t{-2}, int64_t{0}, int64_t{1}, n / 3, n - 1, n, n + 5}) {
        SCOPED_TRACE(str_cat("n=", n, " trial=", trial, " k=", k));
        EXPECT_EQ(top_k(scores.data(), n, k), reference_top_k(scores, k));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 9 * 6 * 7);
  EXPECT_TRUE(top_k(nullptr, 0, 3).empty());
  expect_invalid_argument([] { top_k(nullptr, 5, 2); }, "null scores");
  expect_invalid_argument([] { top_k(nullptr, -1, 2); }, "negative n");
}

// ------------------------------------------------------------------ build_selection

// The partition kv_store.h defines, computed independently.
Partition reference_partition(int64_t n_tokens, int64_t initial_len, int64_t local_len, int block_size) {
  Partition p;
  p.n_tokens = n_tokens;
  p.initial_end = std::min(initial_len, n_tokens);
  p.local_begin = std::max(p.initial_end, n_tokens - local_len);
  p.first_context_block = p.initial_end / block_size;
  p.end_context_block =
      p.local_begin > p.initial_end ? (p.local_begin + block_size - 1) / block_size : p.first_context_block;
  return p;
}

// Tokens a head attends, one flag per token: initial, the context tokens of
// chosen blocks and of the partial last block, the local window.
std::vector<bool> reference_mask(const Partition& p, int block_size, const std::vector<int64_t>& chosen,
                                 bool include_local) {
  std::vector<bool> mask(size_t(p.n_tokens), false);
  const auto in_context = [&p](int64_t t) { return t >= p.initial_end && t < p.local_begin; };
  for (int64_t t = 0; t < p.initial_end; ++t) mask[size_t(t)] = true;
  std::vector<int64_t> blocks = chosen;
  if (p.n_tokens % block_size != 0) blocks.push_back(p.n_tokens / block_size);
  for (const int64_t b : blocks)
    for (int64_t t = b * block_size; t < std::min(p.n_tokens, (b + 1) * block_size); ++t)
      if (in_context(t)) mask[size_t(t)] = true;
  if (include_local)
    for (int64_t t = p.local_begin; t < p.n_tokens; ++t) mask[size_t(t)] = true;
  return mask;
}

// Sorted, non-empty, non-overlapping, adjacent spans merged, inside [0, n_tokens).
void expect_span_invariants(const std::vector<TokenSpan>& spans, int64_t n_tokens) {
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_LT(spans[i].begin, spans[i].end);
    EXPECT_GE(spans[i].begin, 0);
    EXPECT_LE(spans[i].end, n_tokens);
    if (i > 0) {
      EXPECT_GT(spans[i].begin, spans[i - 1].end) << "span " << i << " touches the previous one";
    }
  }
}

TEST(BuildSelection, MatchesPerTokenMaskOverRandomPartitions) {
  std::mt19937 rng(12);
  int nonempty_context = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int block_size = 1 + int(rng() % 40);
    const int64_t n_tokens = rng() % 8 == 0 ? int64_t(rng() % 3) : int64_t(rng() % 700);
    const int64_t initial_len = rng() % 4 == 0 ? 0 : int64_t(rng() % (n_tokens + 50));
    const int64_t local_len = rng() % 4 == 0 ? 0 : int64_t(rng() % (n_tokens + 50));
    const Partition p = reference_partition(n_tokens, initial_len, local_len, block_size);
    const int n_kv_heads = 1 + int(rng() % 3);
    const bool shared = rng() % 2 == 0;
    const bool include_local = rng() % 3 != 0;
    const int64_t n_context = p.end_context_block - p.first_context_block;
    nonempty_context += n_context > 0;

    std::vector<std::vector<int64_t>> chosen(shared ? 1 : size_t(n_kv_heads));
    for (auto& list : chosen) {
      const int64_t count = n_context == 0 ? 0 : int64_t(rng() % (n_context + 3));  // duplicates when > n_context
      for (int64_t i = 0; i < count; ++i) list.push_back(p.first_context_block + int64_t(rng() % n_context));
    }
    SCOPED_TRACE(str_cat("trial ", trial, ": n_tokens=", n_tokens, " block=", block_size, " initial=", initial_len,
                         " local=", local_len, " heads=", n_kv_heads, " shared=", shared,
                         " include_local=", include_local));
    const Selection selection = build_selection(p, block_size, n_kv_heads, chosen, include_local);
    ASSERT_EQ(selection.spans.size(), size_t(n_kv_heads));
    for (int h = 0; h < n_kv_heads; ++h) {
      const std::vector<bool> mask = reference_mask(p, block_size, chosen[shared ? 0 : size_t(h)], include_local);
      const std::vector<TokenSpan>& spans = selection.spans[size_t(h)];
      ASSERT_EQ(spans, spans_of(mask)) << "kv head " << h;
      expect_span_invariants(spans, n_tokens);
      EXPECT_EQ(selection.tokens(h), std::count(mask.begin(), mask.end(), true));
    }
  }
  EXPECT_GT(nonempty_context, 1000);
}

TEST(BuildSelection, RejectsBadArguments) {
  const Partition p = reference_partition(1000, 64, 256, 32);  // context blocks [2, 24)
  const std::vector<std::vector<int64_t>> one = {{2, 23}};
  expect_invalid_argument([&] { build_selection(p, 32, 2, {{1}}, true); }, "block before the context");
  expect_invalid_argument([&] { build_selection(p, 32, 2, {{24}}, true); }, "block after the context");
  expect_invalid_argument([&] { build_selection(p, 32, 2, {{-1}}, true); }, "negative block");
  expect_invalid_argument([&] { build_selection(p, 32, 2, {{2}, {3}, {4}}, true); }, "3 lists for 2 heads");
  expect_invalid_argument([&] { build_selection(p, 32, 2, {}, true); }, "no list");
  expect_invalid_argument([&] { build_selection(p, 32, 0, one, true); }, "no kv head");
  expect_invalid_argument([&] { build_selection(p, 0, 2, one, true); }, "block_size 0");
  Partition broken = p;
  broken.local_begin = 2000;
  expect_invalid_argument([&] { build_selection(broken, 32, 2, one, true); }, "local_begin > n_tokens");
  EXPECT_NO_THROW(build_selection(p, 32, 2, one, true));
}

TEST(Selection, TokensSumsSpansAndChecksTheHead) {
  Selection s;
  s.spans = {{{0, 4}, {10, 15}}, {}};
  EXPECT_EQ(s.tokens(0), 9);
  EXPECT_EQ(s.tokens(1), 0);
  expect_invalid_argument([&] { (void)s.tokens(2); }, "head 2 of 2");
  expect_invalid_argument([&] { (void)s.tokens(-1); }, "head -1");
}

TEST(BlocksForTokenBudget, FloorsToWholeBlocks) {
  EXPECT_EQ(blocks_for_token_budget(4096, 128), 32);
  EXPECT_EQ(blocks_for_token_budget(4095, 128), 31);
  EXPECT_EQ(blocks_for_token_budget(127, 128), 0);
  EXPECT_EQ(blocks_for_token_budget(0, 16), 0);
  EXPECT_EQ(blocks_for_token_budget(7, 1), 7);
  EXPECT_EQ(blocks_for_token_budget(int64_t{1} << 40, 64), int64_t{1} << 34);
  expect_invalid_argument([] { blocks_for_token_budget(-1, 128); }, "negative budget");
  expect_invalid_argument([] { blocks_for_token_budget(100, 0); }, "block_size 0");
}

// ------------------------------------------------------------------ select_blocks / select_all

std::vector<float> random_query(int n_q_heads, int head_dim, std::mt19937& rng, std::vector<std::vector<double>>* rows) {
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(n_q_heads) * size_t(head_dim));
  for (float& x : q) x = normal(rng);
  rows->assign(size_t(n_q_heads), std::vector<double>(size_t(head_dim)));
  for (size_t i = 0; i < q.size(); ++i) (*rows)[i / size_t(head_dim)][i % size_t(head_dim)] = q[i];
  return q;
}

// Context blocks whose context tokens all appear in `spans`.
std::vector<int64_t> covered_blocks(const Partition& p, int block_size, const std::vector<TokenSpan>& spans) {
  std::vector<int64_t> blocks;
  for (int64_t b = p.first_context_block; b < p.end_context_block; ++b) {
    const int64_t begin = p.context_begin_of(b, block_size), end = p.context_end_of(b, block_size);
    for (const TokenSpan& s : spans)
      if (s.begin <= begin && end <= s.end) blocks.push_back(b);
  }
  return blocks;
}

// select_blocks keeps the k blocks of highest fp64 reference score (summed
// over kv heads in SHARED mode): blocks clearly above the k-th score are
// selected, blocks clearly below are not (only the partial last block is
// added), and the spans hold nothing else than initial, those blocks and the
// local window. "Clearly": beyond the fp32 error bound of the scores (see
// score_test.cpp).
TEST(SelectBlocks, KeepsTheBlocksOfHighestReferenceScore) {
  std::mt19937 rng(13);
  int decided = 0;
  for (const RT type : {RT::kMax, RT::kQuest, RT::kFix, RT::kDynamic}) {
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      StoreCase c;
      c.type = type;
      c.kv_type = dtype;
      c.n_kv_heads = 1 + int(rng() % 3);
      c.head_dim = 64;
      c.block_size = 16;
      c.rep_num = 3;
      c.initial_len = int(rng() % 40);
      c.local_windows_len = rng() % 2 == 0 ? 0 : int(rng() % 60);
      c.n_tokens = 400 + rng() % 300;
      SCOPED_TRACE(c.describe());
      const TestStore ts(c, rng);
      const kvstore::KVStore& store = ts.store();
      const Partition p = store.partition(TestStore::kLayer);
      const int64_t n_context = p.end_context_block - p.first_context_block;
      const int group = 1 << (rng() % 3);
      std::vector<std::vector<double>> q_rows;
      const std::vector<float> q = random_query(c.n_kv_heads * group, c.head_dim, rng, &q_rows);
      const TensorView q_view = make_view(q.data(), DType::kF32, {c.n_kv_heads * group, c.head_dim});

      // Reference scores and error bounds [head][block - first].
      std::vector<std::vector<double>> score(size_t(c.n_kv_heads)), bound(size_t(c.n_kv_heads));
      const int slot_len = type == RT::kQuest ? 2 * c.head_dim : c.head_dim;
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const std::vector<std::vector<double>> q_group(q_rows.begin() + h * group, q_rows.begin() + (h + 1) * group);
        for (int64_t b = p.first_context_block; b < p.end_context_block; ++b) {
          const auto reps = score_ref::representatives(
              type, score_ref::stored_block_keys(store, TestStore::kLayer, h, b), c.block_size, c.rep_num,
              ts.block_importance(h, b));
          const auto s = score_ref::block_score(type, reps, q_group, Reduce::kSum, Reduce::kMax);
          score[size_t(h)].push_back(s.score);
          bound[size_t(h)].push_back(double(slot_len + group + c.rep_num + 4) * kEps32 * s.magnitude);
        }
      }
      const int64_t partial = p.n_tokens % c.block_size != 0 &&
                                      p.n_tokens / c.block_size >= p.first_context_block &&
                                      p.n_tokens / c.block_size < p.end_context_block
                                  ? p.n_tokens / c.block_size
                                  : -1;

      for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
        for (const int64_t k : {int64_t{0}, int64_t{1}, n_context / 4, n_context - 1}) {
          const bool include_local = rng() % 2 == 0;
          SCOPED_TRACE(str_cat(head_select_mode_name(mode), " k=", k, " include_local=", include_local));
          SelectParams params;
          params.blocks = k;
          params.mode = mode;
          params.include_local = include_local;
          const Selection selection = select_blocks(store, TestStore::kLayer, q_view, params);
          ASSERT_EQ(selection.spans.size(), size_t(c.n_kv_heads));
          for (int h = 0; h < c.n_kv_heads; ++h) {
            // The ranking this head's blocks follow.
            std::vector<double> ranked(size_t(n_context), 0.0), tolerance(size_t(n_context), 0.0);
            for (int r = 0; r < c.n_kv_heads; ++r) {
              if (mode == HeadSelectMode::kSeparate && r != h) continue;
              for (int64_t i = 0; i < n_context; ++i) {
                ranked[size_t(i)] += score[size_t(r)][size_t(i)];
                tolerance[size_t(i)] += bound[size_t(r)][size_t(i)] +
                                        double(c.n_kv_heads) * kEps32 * std::abs(score[size_t(r)][size_t(i)]);
              }
            }
            const std::vector<int64_t> covered = covered_blocks(p, c.block_size, selection.spans[size_t(h)]);
            const bool has_partial = std::count(covered.begin(), covered.end(), partial) > 0;
            EXPECT_EQ(partial >= 0, has_partial) << "the partial last block is always attended";
            EXPECT_TRUE(int64_t(covered.size()) == k || (has_partial && int64_t(covered.size()) == k + 1))
                << covered.size() << " blocks selected";
            if (k > 0) {
              std::vector<double> sorted = ranked;
              std::sort(sorted.begin(), sorted.end(), std::greater<>());
              const double kth = sorted[size_t(k - 1)];
              const double kth_tolerance = *std::max_element(tolerance.begin(), tolerance.end());
              for (int64_t i = 0; i < n_context; ++i) {
                const int64_t b = p.first_context_block + i;
                const bool selected = std::count(covered.begin(), covered.end(), b) > 0;
                const double margin = tolerance[size_t(i)] + kth_tolerance;
                if (ranked[size_t(i)] > kth + margin) {
                  EXPECT_TRUE(selected) << "block " << b << " scores above the k-th";
                  ++decided;
                } else if (ranked[size_t(i)] < kth - margin && b != partial) {
                  EXPECT_FALSE(selected) << "block " << b << " scores below the k-th";
                  ++decided;
                }
              }
            }
            // Nothing else than initial + covered blocks + local.
            const std::vector<bool> mask = reference_mask(p, c.block_size, covered, include_local);
            EXPECT_EQ(selection.spans[size_t(h)], spans_of(mask)) << "kv head " << h;
          }
          if (mode == HeadSelectMode::kShared) {
            for (int h = 1; h < c.n_kv_heads; ++h) EXPECT_EQ(selection.spans[size_t(h)], selection.spans[0]);
          }
        }
      }
    }
  }
  EXPECT_GT(decided, 2000);
}

// With a zero query every score is exactly 0 (every type, every reduction):
// ties go to the lowest block indices, in both modes.
TEST(SelectBlocks, TiesPickTheLowestBlocks) {
  std::mt19937 rng(14);
  for (const RT type : {RT::kMax, RT::kMean, RT::kQuest, RT::kFix, RT::kDynamic}) {
    StoreCase c;
    c.type = type;
    c.rep_num = 2;
    c.n_tokens = 16 * 20 + 3;
    c.initial_len = 5;
    c.local_windows_len = 40;
    const TestStore ts(c, rng);
    const Partition p = ts.store().partition(TestStore::kLayer);
    const std::vector<float> q(size_t(4 * c.n_kv_heads * c.head_dim), 0.f);
    const TensorView q_view = make_view(q.data(), DType::kF32, {4 * c.n_kv_heads, c.head_dim});
    for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
      for (const Reduce gqa : {Reduce::kSum, Reduce::kMax}) {
        SelectParams params;
        params.blocks = 4;
        params.mode = mode;
        params.score.gqa_reduce = gqa;
        std::vector<int64_t> first_four(4);
        std::iota(first_four.begin(), first_four.end(), p.first_context_block);
        EXPECT_EQ(select_blocks(ts.store(), TestStore::kLayer, q_view, params).spans,
                  build_selection(p, c.block_size, c.n_kv_heads, {first_four}, true).spans)
            << representative_type_name(type) << " " << head_select_mode_name(mode) << " " << reduce_name(gqa);
      }
    }
  }
}

// A budget of every context block (or more) selects everything: select_all.
TEST(SelectBlocks, FullBudgetEqualsSelectAll) {
  std::mt19937 rng(15);
  for (int trial = 0; trial < 12; ++trial) {
    StoreCase c;
    c.type = trial % 2 == 0 ? RT::kQuest : RT::kFix;
    c.block_size = 8 + int(rng() % 24);
    c.initial_len = int(rng() % 30);
    c.local_windows_len = int(rng() % 50);
    c.n_tokens = 1 + int64_t(rng() % 300);
    SCOPED_TRACE(c.describe());
    const TestStore ts(c, rng);
    const Partition p = ts.store().partition(TestStore::kLayer);
    const int64_t n_context = p.end_context_block - p.first_context_block;
    std::vector<std::vector<double>> rows;
    const std::vector<float> q = random_query(2 * c.n_kv_heads, c.head_dim, rng, &rows);
    const TensorView q_view = make_view(q.data(), DType::kF32, {2 * c.n_kv_heads, c.head_dim});
    for (const bool include_local : {true, false}) {
      for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
        for (const int64_t k : {n_context, n_context + 7}) {
          SelectParams params;
          params.blocks = k;
          params.mode = mode;
          params.include_local = include_local;
          const Selection all = select_all(ts.store(), TestStore::kLayer, include_local);
          EXPECT_EQ(select_blocks(ts.store(), TestStore::kLayer, q_view, params).spans, all.spans);
          // select_all: [0, n_tokens) or [0, local_begin), one span per head.
          const int64_t end = include_local ? p.n_tokens : p.local_begin;
          const std::vector<TokenSpan> expected = end > 0 ? std::vector<TokenSpan>{{0, end}} : std::vector<TokenSpan>{};
          for (const auto& spans : all.spans) EXPECT_EQ(spans, expected);
        }
      }
    }
  }
}

TEST(SelectAll, EmptyLayerHasEmptySpansPerHead) {
  std::mt19937 rng(16);
  StoreCase c;
  c.n_kv_heads = 3;
  c.n_tokens = 10;
  const TestStore ts(c, rng);
  const Selection s = select_all(ts.store(), 0, true);  // layer 0 holds 5 tokens
  ASSERT_EQ(s.spans.size(), 3u);
  EXPECT_EQ(s.spans[2], (std::vector<TokenSpan>{{0, 5}}));
  expect_invalid_argument([&] { select_all(ts.store(), 2, true); }, "layer 2 of 2");
}

TEST(SelectBlocks, RejectsBadArguments) {
  std::mt19937 rng(17);
  StoreCase c;
  c.n_tokens = 300;
  const TestStore ts(c, rng);
  std::vector<std::vector<double>> rows;
  const std::vector<float> q = random_query(c.n_kv_heads, c.head_dim, rng, &rows);
  SelectParams params;
  params.blocks = 3;
  expect_invalid_argument([&] { select_blocks(ts.store(), TestStore::kLayer, make_view(q.data(), DType::kF32, {1, c.head_dim}), params); },
                          "1 query head for 2 kv heads");
  expect_invalid_argument([&] { select_blocks(ts.store(), 5, make_view(q.data(), DType::kF32, {2, c.head_dim}), params); },
                          "layer 5");
  params.blocks = -1;
  expect_invalid_argument([&] { select_blocks(ts.store(), TestStore::kLayer, make_view(q.data(), DType::kF32, {2, c.head_dim}), params); },
                          "negative budget");
}

}  // namespace
}  // namespace longctx::cpu
