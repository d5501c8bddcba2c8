// top_k, build_selection, select_all and the token-budget helper, each
// against a plain reference: a stable sort for top_k, a per-token boolean
// mask for the spans (policy::select_blocks: tests/policy/select_test.cpp).
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
#include "test_seed.h"

namespace longctx::cpu {
namespace {

using kvstore::Partition;
using testing::expect_invalid_argument;
using testing::reference_mask;
using testing::spans_of;
using testing::StoreCase;
using testing::TestStore;
using RT = RepresentativeType;

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
  std::mt19937 rng(test_seed(11));
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
      // Up to k = n / 8 (chunks of 8 keys or more) top_k ranks only the keys
      // at or better than the worst chunk best; n / 8 + 1 ranks them all.
      for (const int64_t k : {int64_t{-2}, int64_t{0}, int64_t{1}, n / 200 + 2, n / 64, n / 8, n / 8 + 1, n / 3,
                              n - 1, n, n + 5}) {
        SCOPED_TRACE(str_cat("n=", n, " trial=", trial, " k=", k));
        EXPECT_EQ(top_k(scores.data(), n, k), reference_top_k(scores, k));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 9 * 6 * 11);
  EXPECT_TRUE(top_k(nullptr, 0, 3).empty());
  expect_invalid_argument([] { top_k(nullptr, 5, 2); }, "null scores");
  expect_invalid_argument([] { top_k(nullptr, -1, 2); }, "negative n");
}

// ------------------------------------------------------------------ build_selection

// The partition kv_store.h defines, computed independently: the ranked
// blocks are the context blocks wholly inside the context range.
Partition reference_partition(int64_t n_tokens, int64_t initial_len, int64_t local_len, int block_size) {
  Partition p;
  p.n_tokens = n_tokens;
  p.initial_end = std::min(initial_len, n_tokens);
  p.local_begin = std::max(p.initial_end, n_tokens - local_len);
  p.first_context_block = p.initial_end / block_size;
  p.end_context_block =
      p.local_begin > p.initial_end ? (p.local_begin + block_size - 1) / block_size : p.first_context_block;
  p.first_ranked_block = p.end_ranked_block = p.end_context_block;
  for (int64_t b = p.end_context_block - 1; b >= p.first_context_block; --b) {
    if (b * block_size < p.initial_end || (b + 1) * block_size > p.local_begin) continue;
    if (p.first_ranked_block == p.end_ranked_block) p.end_ranked_block = b + 1;
    p.first_ranked_block = b;
  }
  return p;
}

TEST(Partition, RankedBlocksAreTheContextBlocksWhollyInsideTheContext) {
  std::mt19937 rng(test_seed(13));
  for (int trial = 0; trial < 3000; ++trial) {
    const int block_size = 1 + int(rng() % 40);
    const int64_t n_tokens = int64_t(rng() % 700);
    const int64_t initial_len = rng() % 4 == 0 ? 0 : int64_t(rng() % (n_tokens + 50));
    const int64_t local_len = rng() % 4 == 0 ? 0 : int64_t(rng() % (n_tokens + 50));
    const Partition want = reference_partition(n_tokens, initial_len, local_len, block_size);
    const Partition got = Partition::of(n_tokens, want.initial_end, want.local_begin, block_size);
    SCOPED_TRACE(str_cat("n_tokens=", n_tokens, " block=", block_size, " initial=", initial_len, " local=", local_len));
    EXPECT_EQ(got.first_context_block, want.first_context_block);
    EXPECT_EQ(got.end_context_block, want.end_context_block);
    const bool none = want.first_ranked_block == want.end_ranked_block;
    EXPECT_EQ(got.first_ranked_block == got.end_ranked_block, none);
    if (!none) {
      EXPECT_EQ(got.first_ranked_block, want.first_ranked_block);
      EXPECT_EQ(got.end_ranked_block, want.end_ranked_block);
    }
    EXPECT_LE(got.first_context_block, got.first_ranked_block);
    EXPECT_LE(got.end_ranked_block, got.end_context_block);
    EXPECT_EQ(got.ranked_begin(block_size), none ? n_tokens : want.first_ranked_block * block_size);
    EXPECT_EQ(got.ranked_end(block_size), none ? n_tokens : want.end_ranked_block * block_size);
  }
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
  std::mt19937 rng(test_seed(12));
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
  broken = p;
  broken.first_ranked_block = 1;
  expect_invalid_argument([&] { build_selection(broken, 32, 2, one, true); }, "ranked block before the context");
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

// ------------------------------------------------------------------ select_all

TEST(SelectAll, EmptyLayerHasEmptySpansPerHead) {
  std::mt19937 rng(test_seed(16));
  StoreCase c;
  c.n_kv_heads = 3;
  c.n_tokens = 10;
  const TestStore ts(c, rng);
  const Selection s = select_all(ts.store(), 0, true);  // layer 0 holds 5 tokens
  ASSERT_EQ(s.spans.size(), 3u);
  EXPECT_EQ(s.spans[2], (std::vector<TokenSpan>{{0, 5}}));
  expect_invalid_argument([&] { select_all(ts.store(), 2, true); }, "layer 2 of 2");
}

}  // namespace
}  // namespace longctx::cpu
