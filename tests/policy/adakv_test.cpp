// Ada-KV budgets (policy/adakv.h) against a brute-force reference of the
// kvpress form, and the point of Ada-KV: at equal total, adaptive budgets lose
// less attention output (L1) than uniform ones when heads differ in how
// concentrated their attention is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/config.h"
#include "error_message.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/adakv.h"
#include "longctx/policy/adakv.h"
#include "longctx/workloads/metrics.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using workloads::dense_probabilities;
using workloads::l1_loss;
using cpu::testing::topology;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The kvpress form written out plainly: sort each head's eligible entries
// (score descending, stable on index), take the floor, then sort everything
// left (stable on head, index) and take the rest of the total.
std::vector<std::vector<int64_t>> reference_adakv(const std::vector<float>& scores, int n_heads, int64_t n,
                                                  int64_t per_head_budget, double alpha) {
  struct E { double score; int head; int64_t index; };
  // Larger first, NaN after every number, -0 == +0 (0.0 > -0.0 is false).
  const auto by_score = [](const E& a, const E& b) {
    if (std::isnan(a.score) != std::isnan(b.score)) return std::isnan(b.score);
    return !std::isnan(a.score) && a.score > b.score;
  };
  const int64_t budget = std::min(per_head_budget, n);
  const auto floor_budget = int64_t(std::floor(alpha * double(budget)));
  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(n_heads));
  std::vector<E> rest;
  int64_t eligible = 0, taken = 0;
  for (int h = 0; h < n_heads; ++h) {
    std::vector<E> head;
    for (int64_t i = 0; i < n; ++i)
      if (scores[size_t(h * n + i)] != kNegInf) head.push_back({scores[size_t(h * n + i)], h, i});
    eligible += int64_t(head.size());
    std::stable_sort(head.begin(), head.end(), by_score);
    for (size_t j = 0; j < head.size(); ++j) {
      if (int64_t(j) < floor_budget) {
        chosen[size_t(h)].push_back(head[j].index);
        ++taken;
      } else {
        rest.push_back(head[j]);
      }
    }
  }
  std::sort(rest.begin(), rest.end(), [](const E& a, const E& b) {
    return a.head != b.head ? a.head < b.head : a.index < b.index;
  });
  std::stable_sort(rest.begin(), rest.end(), by_score);
  const int64_t total = std::min(int64_t(n_heads) * budget, eligible);
  for (int64_t j = 0; j < total - taken; ++j) chosen[size_t(rest[size_t(j)].head)].push_back(rest[size_t(j)].index);
  for (auto& c : chosen) std::sort(c.begin(), c.end());
  return chosen;
}

// Small integers, so that ties are frequent; -inf entries when `exclusions`.
std::vector<float> random_scores(int n_heads, int64_t n, bool exclusions, std::mt19937& rng) {
  std::uniform_int_distribution<int> value(-3, 3), coin(0, 5);
  std::vector<float> s(size_t(n_heads) * size_t(n));
  for (float& x : s) x = exclusions && coin(rng) == 0 ? kNegInf : float(value(rng));
  return s;
}

TEST(AdakvTest, MatchesBruteForceWithExactSumAndFloor) {
  std::mt19937 rng(test_seed(1234));
  const double alphas[] = {0.0, 0.2, 0.5, 1.0};
  for (int trial = 0; trial < 600; ++trial) {
    const int n_heads = std::uniform_int_distribution<int>(1, 6)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 20)(rng);
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 25)(rng);  // often >= n
    const double alpha = trial % 5 == 4 ? std::uniform_real_distribution<double>(0, 1)(rng) : alphas[trial % 4];
    const std::vector<float> scores = random_scores(n_heads, n, false, rng);
    SCOPED_TRACE(::testing::Message() << "H=" << n_heads << " n=" << n << " B=" << budget << " alpha=" << alpha);

    const auto chosen = adakv_select(scores.data(), n_heads, n, budget, alpha);
    EXPECT_EQ(chosen, reference_adakv(scores, n_heads, n, budget, alpha));
    const auto counts = adakv_budgets(scores.data(), n_heads, n, budget, alpha);
    ASSERT_EQ(counts.size(), size_t(n_heads));
    int64_t total = 0;
    for (int h = 0; h < n_heads; ++h) {
      EXPECT_EQ(counts[size_t(h)], int64_t(chosen[size_t(h)].size()));
      EXPECT_GE(counts[size_t(h)], std::min(int64_t(std::floor(alpha * double(budget))), n)) << "head " << h;
      EXPECT_TRUE(std::is_sorted(chosen[size_t(h)].begin(), chosen[size_t(h)].end()));
      total += counts[size_t(h)];
    }
    EXPECT_EQ(total, std::min(int64_t(n_heads) * budget, int64_t(n_heads) * n));
  }
}

TEST(AdakvTest, ExcludedEntriesAreNeverChosen) {
  std::mt19937 rng(test_seed(99));
  for (int trial = 0; trial < 300; ++trial) {
    const int n_heads = std::uniform_int_distribution<int>(1, 5)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 16)(rng);
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 18)(rng);
    const double alpha = std::uniform_real_distribution<double>(0, 1)(rng);
    const std::vector<float> scores = random_scores(n_heads, n, true, rng);
    const auto chosen = adakv_select(scores.data(), n_heads, n, budget, alpha);
    EXPECT_EQ(chosen, reference_adakv(scores, n_heads, n, budget, alpha));
    for (int h = 0; h < n_heads; ++h)
      for (const int64_t i : chosen[size_t(h)]) EXPECT_NE(scores[size_t(h * n + i)], kNegInf);
  }
}

// The rank order at the edges of the floats: NaN last, -0 == +0 (ties by
// head, then index), infinities, subnormals and the largest magnitudes.
TEST(AdakvTest, RanksSpecialValuesAsDocumented) {
  const float specials[] = {std::nanf(""), -0.f, 0.f, std::numeric_limits<float>::infinity(), 1e-40f, -1e-40f,
                            3.4e38f, -3.4e38f, 1.f, -1.f, kNegInf};
  std::mt19937 rng(test_seed(5));
  std::uniform_int_distribution<size_t> pick(0, std::size(specials) - 1);
  for (int trial = 0; trial < 400; ++trial) {
    const int n_heads = std::uniform_int_distribution<int>(1, 5)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 16)(rng);
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 18)(rng);
    const double alpha = std::uniform_real_distribution<double>(0, 1)(rng);
    std::vector<float> scores(size_t(n_heads) * size_t(n));
    for (float& x : scores) x = specials[pick(rng)];
    SCOPED_TRACE(::testing::Message() << "H=" << n_heads << " n=" << n << " B=" << budget << " alpha=" << alpha);
    EXPECT_EQ(adakv_select(scores.data(), n_heads, n, budget, alpha),
              reference_adakv(scores, n_heads, n, budget, alpha));
  }
}

// An entry's place must fit the 32 bits of its rank key: more entries are
// refused before any score is read.
TEST(AdakvTest, RefusesMoreEntriesThanItsKeysHold) {
  const float one = 1.f;
  expect_error([&] { adakv_select(&one, 2, int64_t{1} << 31, 1, 0.5); }, ErrorCode::kInvalidArgument,
               {"2 x 2147483648 entries", "2^32"});
}

TEST(AdakvTest, AlphaOneIsUniformTopB) {
  std::mt19937 rng(test_seed(7));
  for (int trial = 0; trial < 200; ++trial) {
    const int n_heads = std::uniform_int_distribution<int>(1, 6)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 30)(rng);
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 32)(rng);
    const std::vector<float> scores = random_scores(n_heads, n, false, rng);
    const auto chosen = adakv_select(scores.data(), n_heads, n, budget, 1.0);
    for (int h = 0; h < n_heads; ++h) {
      std::vector<int64_t> top = top_k(scores.data() + h * n, n, budget);
      std::sort(top.begin(), top.end());
      EXPECT_EQ(chosen[size_t(h)], top) << "head " << h;
    }
  }
}

TEST(AdakvTest, RejectsBadArguments) {
  const std::vector<float> s(8, 1.f);
  for (const double alpha : {-0.01, 1.01, std::nan("")}) {
    try {
      adakv_select(s.data(), 2, 4, 2, alpha);
      ADD_FAILURE() << "alpha " << alpha << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("alpha"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(adakv_select(s.data(), 0, 4, 2, 0.2), Error);
  EXPECT_THROW(adakv_select(s.data(), 2, -1, 2, 0.2), Error);
  EXPECT_THROW(adakv_select(s.data(), 2, 4, -1, 0.2), Error);
  EXPECT_THROW(adakv_select(nullptr, 2, 4, 2, 0.2), Error);
  EXPECT_EQ(adakv_select(nullptr, 2, 0, 2, 0.2), (std::vector<std::vector<int64_t>>(2)));
}

// ---- adaptive vs uniform at equal total -------------------------------------------

// Four kv heads (g = 1): heads 0 and 1 put almost all attention on 3 needle
// blocks; heads 2 and 3 attend almost uniformly. Block scores are each head's
// exact (fp64) attention mass per block.
TEST(AdakvTest, LowerL1LossThanUniformOnMixedConcentration) {
  constexpr int kHeads = 4, kDim = 64, kBlock = 16;
  constexpr int64_t kTokens = 2048, kBlocks = kTokens / kBlock, kBudget = 8;
  for (const unsigned seed : {1u, 2u, 3u}) {
    std::mt19937 rng(test_seed(seed));
    std::normal_distribution<float> normal;
    std::vector<float> q(size_t(kHeads) * kDim);
    for (float& x : q) x = normal(rng);
    std::vector<float> k(size_t(kTokens) * kHeads * kDim), v(k.size());
    for (float& x : v) x = normal(rng);
    for (int64_t t = 0; t < kTokens; ++t)
      for (int h = 0; h < kHeads; ++h)
        for (int c = 0; c < kDim; ++c) k[size_t((t * kHeads + h) * kDim + c)] = 0.3f * normal(rng);
    std::vector<int64_t> needle_blocks(static_cast<size_t>(kBlocks));
    std::iota(needle_blocks.begin(), needle_blocks.end(), 0);
    std::shuffle(needle_blocks.begin(), needle_blocks.end(), rng);
    for (int h = 0; h < 2; ++h) {
      double qnorm = 0;
      for (int c = 0; c < kDim; ++c) qnorm += double(q[size_t(h * kDim + c)]) * q[size_t(h * kDim + c)];
      for (int j = 0; j < 3; ++j)
        for (int64_t t = needle_blocks[size_t(j + 3 * h)] * kBlock; t < (needle_blocks[size_t(j + 3 * h)] + 1) * kBlock; ++t)
          for (int c = 0; c < kDim; ++c)  // logit gain ~7 * sqrt(d) / |q| * |q| / sqrt(d) = 7
            k[size_t((t * kHeads + h) * kDim + c)] += float(7.0 * 8.0 / std::sqrt(qnorm)) * q[size_t(h * kDim + c)];
    }

    LongContextConfig config;
    config.block_size = kBlock;
    config.initial_len = 0;
    config.local_windows_len = 0;
    config.kv_type = DType::kF32;
    config.max_seq_len = kTokens;
    kvstore::MemoryBudget memory(uint64_t{1} << 30);
    kvstore::KVStore store({1, kHeads, kDim}, config, memory, topology());
    store.append(0, make_view(k.data(), DType::kF32, {kTokens, kHeads, kDim}),
                 make_view(v.data(), DType::kF32, {kTokens, kHeads, kDim}));

    // fp64 attention mass per (head, block).
    const std::vector<double> probs = dense_probabilities(q.data(), k.data(), kHeads, kHeads, kDim, kTokens);
    std::vector<float> mass(size_t(kHeads) * kBlocks, 0.f);
    std::vector<double> mass64(mass.size(), 0.0);
    for (int h = 0; h < kHeads; ++h)
      for (int64_t t = 0; t < kTokens; ++t) mass64[size_t(h * kBlocks + t / kBlock)] += probs[size_t(h * kTokens + t)];
    for (size_t i = 0; i < mass.size(); ++i) mass[i] = float(mass64[i]);

    std::vector<std::vector<int64_t>> uniform, adaptive = adakv_select(mass.data(), kHeads, kBlocks, kBudget, 0.2);
    for (int h = 0; h < kHeads; ++h) {
      uniform.push_back(top_k(mass.data() + h * kBlocks, kBlocks, kBudget));
      ASSERT_GE(adaptive[size_t(h)].size(), size_t(1)) << "floor(0.2 * 8) = 1";
    }
    size_t adaptive_total = 0;
    for (const auto& a : adaptive) adaptive_total += a.size();
    ASSERT_EQ(adaptive_total, size_t(kHeads * kBudget));
    // Which flat head receives more depends on the draw (the spread of its
    // logits); together they receive what the peaked heads give away.
    EXPECT_LT(adaptive[0].size(), size_t(kBudget)) << "peaked heads give budget away";
    EXPECT_LT(adaptive[1].size(), size_t(kBudget)) << "peaked heads give budget away";
    EXPECT_GT(adaptive[2].size() + adaptive[3].size(), size_t(2 * kBudget)) << "flat heads receive it";

    const kvstore::Partition part = store.partition(0);
    const auto kept_mass = [&](const std::vector<std::vector<int64_t>>& chosen) {
      double total = 0;
      for (int h = 0; h < kHeads; ++h)
        for (const int64_t b : chosen[size_t(h)]) total += mass64[size_t(h * kBlocks + b)];
      return total;
    };
    const auto l1_of = [&](const std::vector<std::vector<int64_t>>& chosen) {
      const Selection sel = build_selection(part, kBlock, kHeads, chosen, true);
      std::vector<float> out(q.size()), dense(q.size()), lse(kHeads), dense_lse(kHeads);
      const TensorView qv = make_view(q.data(), DType::kF32, {kHeads, kDim});
      decode_attention(store, 0, qv, sel, {}, make_mutable_view(out.data(), DType::kF32, {kHeads, kDim}),
                       make_mutable_view(lse.data(), DType::kF32, {kHeads}));
      dense_decode_attention(store, 0, qv, {}, make_mutable_view(dense.data(), DType::kF32, {kHeads, kDim}),
                             make_mutable_view(dense_lse.data(), DType::kF32, {kHeads}));
      return l1_loss(out.data(), dense.data(), kHeads, kDim);
    };
    const double l1_uniform = l1_of(uniform), l1_adaptive = l1_of(adaptive);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ": L1 uniform " << l1_uniform << ", adaptive "
                                      << l1_adaptive << "; mass uniform " << kept_mass(uniform) << ", adaptive "
                                      << kept_mass(adaptive));
    EXPECT_GT(kept_mass(adaptive), kept_mass(uniform));
    EXPECT_LT(l1_adaptive, l1_uniform);
  }
}

}  // namespace
}  // namespace longctx::policy
