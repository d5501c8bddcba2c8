// Quality metrics: small cases computed by hand, then random cases against
// plain references (a per-token boolean mask for what a selection attends, a
// stable sort for the top tokens, long double sums for the norms).
#include "longctx/workloads/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::workloads {
namespace {

using cpu::Selection;
using cpu::TokenSpan;
using cpu::testing::expect_invalid_argument;

Selection make_selection(std::vector<std::vector<TokenSpan>> spans) {
  Selection s;
  s.spans = std::move(spans);
  return s;
}

// Random selection: sorted, non-overlapping, non-empty spans per kv head, and
// the mask of the tokens each head attends.
struct RandomSelection {
  Selection selection;
  std::vector<std::vector<bool>> mask;  // [n_kv][n_tokens]
};
RandomSelection random_selection(std::mt19937_64& rng, int n_kv, int64_t n_tokens) {
  RandomSelection r;
  r.selection.spans.resize(size_t(n_kv));
  r.mask.assign(size_t(n_kv), std::vector<bool>(size_t(n_tokens), false));
  for (int h = 0; h < n_kv; ++h) {
    int64_t t = int64_t(rng() % 5);
    while (t < n_tokens) {
      const int64_t length = 1 + int64_t(rng() % 40);
      const int64_t end = std::min(n_tokens, t + length);
      r.selection.spans[size_t(h)].push_back({t, end});
      for (int64_t i = t; i < end; ++i) r.mask[size_t(h)][size_t(i)] = true;
      t = end + 1 + int64_t(rng() % 60);  // a gap of at least one token
    }
  }
  return r;
}

// ------------------------------------------------------------------ norms

TEST(RelativeL2Error, HandComputedAndZeroCases) {
  const float dense[3] = {1.f, 2.f, 0.f};
  const float sparse[3] = {1.f, 2.f, 2.f};
  EXPECT_DOUBLE_EQ(relative_l2_error(sparse, dense, 3), std::sqrt(4.0 / 5.0));
  EXPECT_EQ(relative_l2_error(dense, dense, 3), 0.0);
  const float zero[3] = {0.f, 0.f, 0.f};
  EXPECT_EQ(relative_l2_error(zero, zero, 3), 0.0);
  EXPECT_EQ(relative_l2_error(sparse, zero, 3), std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(relative_l2_error(zero, dense, 3), 1.0);
  EXPECT_EQ(relative_l2_error(sparse, dense, 0), 0.0);
}

TEST(L1Loss, HandComputed) {
  // Two heads of 2 channels: |1-0| + |-2-1| = 4 and |0.5-0.5| + |3-0| = 3; mean 3.5.
  const float sparse[4] = {1.f, -2.f, 0.5f, 3.f};
  const float dense[4] = {0.f, 1.f, 0.5f, 0.f};
  EXPECT_DOUBLE_EQ(l1_loss(sparse, dense, 2, 2), 3.5);
  EXPECT_DOUBLE_EQ(l1_loss(sparse, dense, 1, 4), 7.0);
  expect_invalid_argument([&] { l1_loss(sparse, dense, 0, 2); }, "zero heads");
  expect_invalid_argument([&] { l1_loss(sparse, dense, 2, 0); }, "zero head_dim");
}

TEST(Norms, RandomCasesMatchLongDoubleReference) {
  std::mt19937_64 rng(test_seed(5));
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 200; ++trial) {
    const int heads = 1 + int(rng() % 8), dim = 1 + int(rng() % 256);
    const size_t n = size_t(heads) * size_t(dim);
    std::vector<float> a(n), b(n);
    const float scale = std::ldexp(1.f, int(rng() % 40) - 20);
    for (size_t i = 0; i < n; ++i) a[i] = normal(rng) * scale, b[i] = normal(rng) * scale;
    long double diff = 0, ref = 0, l1 = 0;
    for (size_t i = 0; i < n; ++i) {
      const long double e = (long double)a[i] - (long double)b[i];
      diff += e * e;
      ref += (long double)b[i] * b[i];
      l1 += std::fabs(e);
    }
    // fp64 sums of n non-negative terms: relative error below n * 2^-53.
    const double tolerance = double(n) * 0x1p-52;
    const double expected_l2 = double(std::sqrt(diff / ref));
    EXPECT_NEAR(relative_l2_error(a.data(), b.data(), int64_t(n)), expected_l2, expected_l2 * tolerance);
    const double expected_l1 = double(l1 / heads);
    EXPECT_NEAR(l1_loss(a.data(), b.data(), heads, dim), expected_l1, expected_l1 * tolerance);
  }
}

// ------------------------------------------------------------------ block_recall

TEST(BlockRecall, HandComputed) {
  // 10 tokens in blocks of 4: blocks {0-3}, {4-7}, {8-9}.
  const Selection both = make_selection({{{0, 4}, {8, 10}}, {{0, 2}, {2, 4}, {5, 10}}});
  EXPECT_DOUBLE_EQ(block_recall(both, {0}, 4, 10), 1.0);       // adjacent spans cover it too
  EXPECT_DOUBLE_EQ(block_recall(both, {1}, 4, 10), 0.0);       // head 0 misses it, head 1 misses token 4
  EXPECT_DOUBLE_EQ(block_recall(both, {2}, 4, 10), 1.0);       // partial last block: tokens 8, 9
  EXPECT_DOUBLE_EQ(block_recall(both, {0, 1, 2}, 4, 10), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(block_recall(both, {}, 4, 10), 1.0);
  const Selection none = make_selection({{}, {}});
  EXPECT_DOUBLE_EQ(block_recall(none, {0, 2}, 4, 10), 0.0);
  expect_invalid_argument([&] { block_recall(both, {3}, 4, 10); }, "block past the end");
  expect_invalid_argument([&] { block_recall(both, {-1}, 4, 10); }, "negative block");
  expect_invalid_argument([&] { block_recall(both, {0}, 0, 10); }, "block_size 0");
}

TEST(BlockRecall, RandomSelectionsMatchMaskReference) {
  std::mt19937_64 rng(test_seed(9));
  for (int trial = 0; trial < 300; ++trial) {
    const int n_kv = 1 + int(rng() % 4);
    const int64_t n_tokens = 1 + int64_t(rng() % 2000);
    const int block_size = 1 + int(rng() % 130);
    const RandomSelection r = random_selection(rng, n_kv, n_tokens);
    const int64_t n_blocks = (n_tokens + block_size - 1) / block_size;
    std::vector<int64_t> blocks;
    for (int i = 0; i < 1 + int(rng() % 10); ++i) blocks.push_back(int64_t(rng() % uint64_t(n_blocks)));
    int64_t recalled = 0;
    for (int64_t b : blocks) {
      bool all = true;
      for (int h = 0; h < n_kv; ++h)
        for (int64_t t = b * block_size; t < std::min(n_tokens, (b + 1) * block_size); ++t)
          all = all && r.mask[size_t(h)][size_t(t)];
      recalled += all;
    }
    EXPECT_DOUBLE_EQ(block_recall(r.selection, blocks, block_size, n_tokens), double(recalled) / double(blocks.size()))
        << "trial " << trial;
  }
}

// ------------------------------------------------------------------ topk_token_recall

TEST(TopkTokenRecall, HandComputedWithTiesAndGroups) {
  // 2 query heads on 1 kv head, 6 tokens; the selection attends {1, 2, 5}.
  const Selection sel = make_selection({{{1, 3}, {5, 6}}});
  const std::vector<double> probs = {
      0.1, 0.3, 0.05, 0.25, 0.2, 0.1,  // head 0: top-3 = 1, 3, 4 -> 1 hit
      0.2, 0.2, 0.2,  0.1,  0.1, 0.2,  // head 1: ties, lower index first: 0, 1, 2 -> 2 hits
  };
  EXPECT_DOUBLE_EQ(topk_token_recall(probs, 2, 6, sel, 3), (1.0 / 3 + 2.0 / 3) / 2);
  EXPECT_DOUBLE_EQ(topk_token_recall(probs, 2, 6, sel, 1), (1.0 + 0.0) / 2);
  // k past n_tokens is clamped: every token counts, 3 of 6 attended.
  EXPECT_DOUBLE_EQ(topk_token_recall(probs, 2, 6, sel, 100), 0.5);
  // With 2 kv heads each query head reads its own: head 1 now sees {0, 1, 2, 3, 4, 5}.
  const Selection two = make_selection({{{1, 3}, {5, 6}}, {{0, 6}}});
  EXPECT_DOUBLE_EQ(topk_token_recall(probs, 2, 6, two, 3), (1.0 / 3 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(topk_token_recall({}, 2, 0, two, 10), 1.0);
  expect_invalid_argument([&] { topk_token_recall(probs, 2, 5, sel, 3); }, "probs size");
  expect_invalid_argument([&] { topk_token_recall(probs, 3, 4, two, 3); }, "heads not a multiple");
  expect_invalid_argument([&] { topk_token_recall(probs, 2, 6, sel, 0); }, "k = 0");
}

TEST(TopkTokenRecall, RandomCasesMatchStableSortReference) {
  std::mt19937_64 rng(test_seed(13));
  std::uniform_real_distribution<double> uniform;
  for (int trial = 0; trial < 200; ++trial) {
    const int n_kv = 1 + int(rng() % 3);
    const int n_q = n_kv * (1 + int(rng() % 4));
    const int64_t n_tokens = 1 + int64_t(rng() % 1500);
    const int k = 1 + int(rng() % 20);
    const RandomSelection r = random_selection(rng, n_kv, n_tokens);
    std::vector<double> probs(size_t(n_q) * size_t(n_tokens));
    // Coarse values so that ties happen.
    for (double& p : probs) p = std::floor(uniform(rng) * 16) / 16;
    double expected = 0;
    for (int h = 0; h < n_q; ++h) {
      std::vector<int64_t> order(static_cast<size_t>(n_tokens));
      std::iota(order.begin(), order.end(), int64_t{0});
      const double* p = probs.data() + size_t(h) * size_t(n_tokens);
      std::stable_sort(order.begin(), order.end(), [p](int64_t a, int64_t b) { return p[a] > p[b]; });
      const int64_t top = std::min<int64_t>(k, n_tokens);
      int64_t hits = 0;
      for (int64_t i = 0; i < top; ++i) hits += r.mask[size_t(h / (n_q / n_kv))][size_t(order[size_t(i)])];
      expected += double(hits) / double(top) / n_q;
    }
    EXPECT_NEAR(topk_token_recall(probs, n_q, n_tokens, r.selection, k), expected, 1e-12) << "trial " << trial;
  }
}

// ------------------------------------------------------------------ dense_probabilities

TEST(DenseProbabilities, MatchesDirectSoftmaxAndMapsGqaHeads) {
  std::mt19937_64 rng(test_seed(21));
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 40; ++trial) {
    const int n_kv = 1 + int(rng() % 3), n_q = n_kv * (1 + int(rng() % 4)), d = 8 * (1 + int(rng() % 8));
    const int64_t n = 1 + int64_t(rng() % 300);
    std::vector<float> q(size_t(n_q * d)), k(size_t(n) * size_t(n_kv * d));
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    const double scale = trial % 2 == 0 ? 0.0 : 0.3;
    const std::vector<double> probs = dense_probabilities(q.data(), k.data(), n_q, n_kv, d, n, scale);
    ASSERT_EQ(probs.size(), size_t(n_q) * size_t(n));
    for (int h = 0; h < n_q; ++h) {
      // Direct formula in long double, no max subtraction (logits are small here).
      const int kv = h / (n_q / n_kv);
      const long double s = scale == 0 ? 1.0L / std::sqrt((long double)d) : (long double)scale;
      std::vector<long double> w(static_cast<size_t>(n));
      long double z = 0;
      for (int64_t t = 0; t < n; ++t) {
        long double logit = 0;
        for (int c = 0; c < d; ++c) logit += (long double)q[size_t(h * d + c)] * k[size_t((t * n_kv + kv) * d + c)];
        w[size_t(t)] = std::exp(logit * s);
        z += w[size_t(t)];
      }
      for (int64_t t = 0; t < n; ++t) {
        const double expected = double(w[size_t(t)] / z);
        EXPECT_NEAR(probs[size_t(h) * size_t(n) + size_t(t)], expected, expected * 1e-12 + 1e-300)
            << "trial " << trial << " head " << h << " token " << t;
      }
    }
  }
}

TEST(DenseProbabilities, HugeLogitsStayFiniteAndSumToOne) {
  // Logits near +-1e4: max subtraction keeps every probability finite.
  const int d = 8;
  std::vector<float> q(d, 0.f), k(3 * d, 0.f);
  q[0] = 1.f;
  k[0] = 28284.f;       // logit 1e4
  k[d] = 28284.f - 1.f;
  k[2 * d] = -28284.f;  // logit -1e4
  const std::vector<double> p = dense_probabilities(q.data(), k.data(), 1, 1, d, 3);
  for (double x : p) EXPECT_TRUE(std::isfinite(x));
  EXPECT_NEAR(p[0] + p[1] + p[2], 1.0, 1e-15);
  // Logits of magnitude 1e4 carry an fp64 rounding of ~1e4 * 2^-53 each.
  EXPECT_NEAR(p[0] / p[1], std::exp(1.0 / std::sqrt(8.0)), 2 * 4 * 1e4 * 0x1p-53);
  EXPECT_EQ(p[2], 0.0);
  expect_invalid_argument([&] { dense_probabilities(q.data(), k.data(), 3, 2, d, 3); }, "heads not a multiple");
  expect_invalid_argument([&] { dense_probabilities(q.data(), k.data(), 1, 1, d, 0); }, "no tokens");
}

TEST(DenseProbabilities, WorkloadOverloadUsesItsShapes) {
  SyntheticSpec s;
  s.n_tokens = 700;
  s.n_q_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.n_needles = 1;
  s.recent_tokens = 32;
  const SyntheticWorkload w = make_synthetic(s);
  EXPECT_EQ(dense_probabilities(w), dense_probabilities(w.q.data(), w.k.data(), 4, 2, 64, 700));
}

}  // namespace
}  // namespace longctx::workloads
