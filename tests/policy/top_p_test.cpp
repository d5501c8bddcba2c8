// Attention-mass budgets (policy/top_p.h): choose_by_mass against an fp64
// reading of its definition on random logits, its edge rules (p = 0 and 1,
// the clamps, excluded blocks, nothing to weigh), SHARED and Ada-KV; the fixed
// part's log-sum against exact keys; select_blocks in top_p mode on random
// stores (p = 1 attends everything, the reported mass matches).
#include "longctx/policy/top_p.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/reference.h"
#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "longctx/policy/select.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using cpu::testing::StoreCase;
using cpu::testing::TestStore;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

BudgetConfig top_p(double p, int64_t min_blocks = 0, int64_t max_blocks = 0) {
  BudgetConfig b;
  b.mode = BudgetConfig::Mode::kTopP;
  b.p = p;
  b.min_blocks = min_blocks;
  b.max_blocks = max_blocks;
  return b;
}

// fp64 reading of the definition for one head: weights from log-weights
// (log n_b + e_b) normalised with the fixed part; order by weight (ties:
// lower index); the fewest reaching p; clamped.
struct RefHead {
  std::vector<int64_t> kept;
  double mass = 0.0;
};

RefHead reference_head(const std::vector<float>& logits, const std::vector<int64_t>& tokens, double fixed,
                       const BudgetConfig& b) {
  std::vector<double> logw;
  for (size_t i = 0; i < logits.size(); ++i)
    logw.push_back(std::isinf(logits[i]) || tokens[i] == 0 ? -INFINITY : std::log(double(tokens[i])) + logits[i]);
  double m = fixed;
  for (double x : logw) m = std::max(m, x);
  RefHead r;
  if (std::isinf(m)) return r;
  double total = std::exp(fixed - m);
  for (double x : logw) total += std::exp(x - m);
  std::vector<double> u;
  for (double x : logw) u.push_back(std::exp(x - m) / total);
  const double f = std::exp(fixed - m) / total;
  std::vector<int64_t> order;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!(std::isinf(logits[i]) && logits[i] < 0)) order.push_back(int64_t(i));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return u[size_t(a)] > u[size_t(c)]; });
  // p = 1 is every eligible block (blocks whose weight underflows too).
  double reached = f;
  size_t k = b.p >= 1.0 ? order.size() : 0;
  while (k < order.size() && reached < b.p) reached += u[size_t(order[k++])];
  k = std::max<size_t>(k, size_t(b.min_blocks));
  if (b.max_blocks > 0) k = std::min<size_t>(k, size_t(b.max_blocks));
  k = std::min(k, order.size());
  r.kept.assign(order.begin(), order.begin() + ptrdiff_t(k));
  std::sort(r.kept.begin(), r.kept.end());
  r.mass = f;
  for (int64_t i : r.kept) r.mass += u[size_t(i)];
  return r;
}

TEST(TopP, RandomLogitsMatchTheFp64Reading) {
  std::mt19937 rng(test_seed(1));
  for (int trial = 0; trial < 400; ++trial) {
    const int heads = 1 + int(rng() % 4);
    const int64_t n = int64_t(rng() % 60);
    std::normal_distribution<float> normal(0.f, 1.f + float(rng() % 8));  // flat to peaked
    std::vector<float> logits(size_t(heads) * size_t(n));
    for (float& x : logits) x = rng() % 13 == 0 ? kNegInf : normal(rng);
    std::vector<int64_t> tokens(static_cast<size_t>(n), 16);
    if (n > 0) tokens.front() = 1 + int64_t(rng() % 16), tokens.back() = 1 + int64_t(rng() % 16);  // partial ends
    std::vector<double> fixed(static_cast<size_t>(heads));
    for (double& f : fixed) f = rng() % 5 == 0 ? -INFINITY : double(normal(rng)) + 3.0;
    const double p = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const BudgetConfig b = top_p(trial % 7 == 0 ? 1.0 : p, rng() % 3, rng() % 4 == 0 ? 3 : 0);
    const MassChoice got = choose_by_mass(logits, heads, n, tokens, fixed, HeadSelectMode::kSeparate, b);
    ASSERT_EQ(got.chosen.size(), size_t(heads));
    for (int h = 0; h < heads; ++h) {
      const std::vector<float> row(logits.begin() + h * n, logits.begin() + (h + 1) * n);
      const RefHead ref = reference_head(row, tokens, fixed[size_t(h)], b);
      EXPECT_EQ(got.chosen[size_t(h)], ref.kept) << "trial " << trial << " head " << h << " p " << b.p;
      EXPECT_NEAR(got.mass[size_t(h)], std::min(1.0, ref.mass), 1e-9) << "trial " << trial;
    }
  }
}

TEST(TopP, EdgeRules) {
  const std::vector<float> logits = {0.f, 5.f, kNegInf, 1.f, 5.f};
  const std::vector<int64_t> tokens = {16, 16, 16, 16, 16};
  const std::vector<double> none = {-INFINITY};
  auto kept = [&](const BudgetConfig& b, std::vector<double> fixed = {-INFINITY}) {
    return choose_by_mass(logits, 1, 5, tokens, fixed, HeadSelectMode::kSeparate, b).chosen[0];
  };
  // p = 1: every eligible block (never the excluded one); mass 1.
  EXPECT_EQ(kept(top_p(1.0)), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_DOUBLE_EQ(choose_by_mass(logits, 1, 5, tokens, none, HeadSelectMode::kSeparate, top_p(1.0)).mass[0], 1.0);
  // p = 0: min_blocks only, the best first (tie 1 vs 4: lower index).
  EXPECT_EQ(kept(top_p(0.0, 0)), (std::vector<int64_t>{}));
  EXPECT_EQ(kept(top_p(0.0, 1)), (std::vector<int64_t>{1}));
  EXPECT_EQ(kept(top_p(0.0, 9)), (std::vector<int64_t>{0, 1, 3, 4}));  // clamped to the eligible
  // Two equal peaks hold ~98% of the mass: p = 0.9 keeps both, max_blocks 1 one.
  EXPECT_EQ(kept(top_p(0.9)), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(kept(top_p(0.9, 0, 1)), (std::vector<int64_t>{1}));
  // A fixed part holding nearly all the mass: nothing more is needed.
  EXPECT_EQ(kept(top_p(0.9, 0), {40.0}), (std::vector<int64_t>{}));
  // Nothing to weigh at all: empty, mass 0.
  const MassChoice empty = choose_by_mass({}, 2, 0, {}, {-INFINITY, -INFINITY}, HeadSelectMode::kSeparate, top_p(0.5, 2));
  EXPECT_EQ(empty.chosen, (std::vector<std::vector<int64_t>>{{}, {}}));
  EXPECT_EQ(empty.mass, (std::vector<double>{0.0, 0.0}));
}

TEST(TopP, SharedAndAdaptive) {
  std::mt19937 rng(test_seed(2));
  std::normal_distribution<float> normal(0.f, 3.f);
  const int heads = 4;
  const int64_t n = 50;
  std::vector<float> logits(size_t(heads) * size_t(n));
  for (float& x : logits) x = normal(rng);
  const std::vector<int64_t> tokens(static_cast<size_t>(n), 8);
  const std::vector<double> fixed(static_cast<size_t>(heads), 2.0);
  // SHARED with one head is SEPARATE.
  const std::vector<float> one(logits.begin(), logits.begin() + n);
  EXPECT_EQ(choose_by_mass(one, 1, n, tokens, {2.0}, HeadSelectMode::kShared, top_p(0.8)).chosen,
            choose_by_mass(one, 1, n, tokens, {2.0}, HeadSelectMode::kSeparate, top_p(0.8)).chosen);
  // SHARED: one list; its mean mass reaches p.
  const MassChoice shared = choose_by_mass(logits, heads, n, tokens, fixed, HeadSelectMode::kShared, top_p(0.8));
  ASSERT_EQ(shared.chosen.size(), 1u);
  EXPECT_GE(std::accumulate(shared.mass.begin(), shared.mass.end(), 0.0) / heads, 0.8 - 1e-9);
  // Ada-KV: the per-head counts' total, each head >= floor(alpha * the mean),
  // so that the floors' sum stays within the total.
  BudgetConfig adaptive = top_p(0.8);
  adaptive.policy = BudgetConfig::Policy::kAdaptive;
  adaptive.alpha = 0.5;
  const MassChoice separate = choose_by_mass(logits, heads, n, tokens, fixed, HeadSelectMode::kSeparate, top_p(0.8));
  const MassChoice ada = choose_by_mass(logits, heads, n, tokens, fixed, HeadSelectMode::kSeparate, adaptive);
  int64_t sep_total = 0, ada_total = 0;
  for (int h = 0; h < heads; ++h) sep_total += int64_t(separate.chosen[size_t(h)].size());
  for (int h = 0; h < heads; ++h) ada_total += int64_t(ada.chosen[size_t(h)].size());
  const auto floor_h = int64_t(std::floor(0.5 * double(sep_total) / heads));
  EXPECT_EQ(ada_total, sep_total);
  for (int h = 0; h < heads; ++h) EXPECT_GE(int64_t(ada.chosen[size_t(h)].size()), floor_h) << "head " << h;
}

// Counts 4, 1, 1, 1 from the heads' masses: Ada-KV shares 7 blocks, not the
// 8 that 4 heads x ceil(7 / 4) would give.
TEST(TopP, AdaptiveSharesExactlyTheTotalOfTheCounts) {
  const int heads = 4;
  const int64_t n = 8;
  std::vector<float> logits(size_t(heads * n), 0.f);
  for (int h = 1; h < heads; ++h) logits[size_t(h * n + h)] = 10.f;  // heads 1-3: one block holds the mass
  const std::vector<int64_t> tokens(size_t(n), 16);
  const std::vector<double> fixed(heads, -INFINITY);
  BudgetConfig budget = top_p(0.5, 1);
  const MassChoice uniform = choose_by_mass(logits, heads, n, tokens, fixed, HeadSelectMode::kSeparate, budget);
  std::vector<size_t> counts;
  for (const auto& c : uniform.chosen) counts.push_back(c.size());
  ASSERT_EQ(counts, (std::vector<size_t>{4, 1, 1, 1}));
  budget.policy = BudgetConfig::Policy::kAdaptive;
  for (const double alpha : {0.0, 0.2, 0.9, 1.0}) {  // alpha 1: floors of 2 per head would make 8
    SCOPED_TRACE(alpha);
    budget.alpha = alpha;
    const MassChoice ada = choose_by_mass(logits, heads, n, tokens, fixed, HeadSelectMode::kSeparate, budget);
    size_t total = 0;
    for (const auto& c : ada.chosen) total += c.size();
    EXPECT_EQ(total, 7u);
  }
}

TEST(TopP, BadArgumentsAreRefused) {
  const std::vector<int64_t> tokens = {16, 16};
  EXPECT_THROW(choose_by_mass({0.f, NAN}, 1, 2, tokens, {0.0}, HeadSelectMode::kSeparate, top_p(0.5)), Error);
  EXPECT_THROW(choose_by_mass({0.f}, 1, 2, tokens, {0.0}, HeadSelectMode::kSeparate, top_p(0.5)), Error);
  EXPECT_THROW(choose_by_mass({0.f, 1.f}, 1, 2, tokens, {0.0}, HeadSelectMode::kSeparate, top_p(1.5)), Error);
  EXPECT_THROW(choose_by_mass({0.f, 1.f}, 0, 2, tokens, {}, HeadSelectMode::kSeparate, top_p(0.5)), Error);
}

// The fixed part: log sum exp over the sinks and the local window of the
// group's combined exact logits, against fp64 keys read back from the store.
TEST(TopP, FixedPartLogsumsMatchExactKeys) {
  std::mt19937 rng(test_seed(3));
  for (const int group : {1, 4}) {
    for (const Reduce reduce : {Reduce::kSum, Reduce::kMax}) {
      StoreCase c;
      c.kv_type = group == 4 ? DType::kQ8_0 : DType::kF16;
      c.head_dim = 64;
      c.initial_len = 5;
      c.local_windows_len = 21;
      c.n_tokens = 150;
      TestStore ts(c, rng);
      std::normal_distribution<float> normal;
      std::vector<float> q(size_t(c.n_kv_heads * group) * size_t(c.head_dim));
      for (float& x : q) x = 0.2f * normal(rng);
      const double scale = 0.125;
      const std::vector<double> got =
          fixed_part_logsums(ts.store(), TestStore::kLayer, make_view(q.data(), DType::kF32,
                                                                      {c.n_kv_heads * group, c.head_dim}),
                             scale, reduce);
      const kvstore::Partition part = ts.store().partition(TestStore::kLayer);
      for (int h = 0; h < c.n_kv_heads; ++h) {
        std::vector<double> e;
        double worst_terms = 0.0;  // the largest sum_g sum_c |q_gc k_c| of a token
        for (int64_t t = 0; t < part.n_tokens; ++t) {
          const int64_t b = t / c.block_size;
          const bool ranked = b * c.block_size >= part.initial_end && (b + 1) * c.block_size <= part.local_begin;
          if (ranked) continue;  // the fixed part: every token but those of blocks wholly in the context
          const auto keys = cpu::score_ref::stored_block_keys(ts.store(), TestStore::kLayer, h, t / c.block_size);
          double comb = reduce == Reduce::kMax ? -INFINITY : 0.0, terms = 0.0;
          for (int g = 0; g < group; ++g) {
            double dot = 0.0;
            for (int ch = 0; ch < c.head_dim; ++ch) {
              const double p = double(q[size_t((h * group + g) * c.head_dim + ch)]) *
                               keys[size_t(t % c.block_size)][size_t(ch)];
              dot += p;
              terms += std::abs(p);
            }
            comb = reduce == Reduce::kMax ? std::max(comb, dot) : comb + dot / group;
          }
          worst_terms = std::max(worst_terms, terms);
          e.push_back(comb * scale);
        }
        ASSERT_EQ(e.size(), size_t(16 + 22));  // block 0 (the 5 sinks' block), and [128, 150) (window from 129)
        const double m = *std::max_element(e.begin(), e.end());
        double sum = 0.0, spread = 0.0;
        for (double x : e) sum += std::exp(x - m), spread = std::max(spread, m - x);
        // log sum exp moves no more than its largest argument: the f32 dot
        // products (head_dim + group + 2 roundings of sum |q k| at most), and
        // f32 exponentials (a few ulp, and the rounding of arguments down to -spread).
        const double tolerance =
            scale * double(c.head_dim + group + 2) * kU * worst_terms + 8 * kU * (1.0 + spread);
        EXPECT_NEAR(got[size_t(h)], m + std::log(sum), tolerance) << "group " << group << " head " << h;
      }
      // Only the heads asked for: the same sum, NaN for the other.
      const std::vector<double> head_1 =
          fixed_part_logsums(ts.store(), TestStore::kLayer, make_view(q.data(), DType::kF32,
                                                                      {c.n_kv_heads * group, c.head_dim}),
                             scale, reduce, {0, 1});
      EXPECT_TRUE(std::isnan(head_1[0]));
      EXPECT_EQ(head_1[1], got[1]);
      const TensorView qv = make_view(q.data(), DType::kF32, {c.n_kv_heads * group, c.head_dim});
      cpu::testing::expect_invalid([&] { fixed_part_logsums(ts.store(), TestStore::kLayer, qv, scale, Reduce::kMean); },
                                   {"fixed_part_logsums: reduce is", "must be sum or max"});
      cpu::testing::expect_invalid([&] { fixed_part_logsums(ts.store(), TestStore::kLayer, qv, scale, reduce, {1}); },
                                   {"heads has 1 entries"});
    }
  }
}

// select_blocks in top_p mode on random stores: p = 1 attends every block;
// the mass it reports is what choose_by_mass says for the store's scores;
// a small p attends no more than p = 1.
TEST(TopP, SelectBlocksOnRandomStores) {
  std::mt19937 rng(test_seed(4));
  for (const HeadSelectMode mode : {HeadSelectMode::kSeparate, HeadSelectMode::kShared}) {
    StoreCase c;
    c.initial_len = 4;
    c.local_windows_len = 16;
    c.n_tokens = 700;
    TestStore ts(c, rng);
    std::normal_distribution<float> normal;
    std::vector<float> q(size_t(c.n_kv_heads * 2) * size_t(c.head_dim));
    for (float& x : q) x = 0.05f * normal(rng);  // logits of order 1: the mass is spread over many blocks
    const TensorView qv = make_view(q.data(), DType::kF32, {c.n_kv_heads * 2, c.head_dim});
    SelectSpec spec;
    spec.mode = mode;
    spec.budget = top_p(1.0);
    std::vector<double> mass;
    const cpu::Selection all = select_blocks(ts.store(), TestStore::kLayer, qv, spec, nullptr, &mass);
    const cpu::Selection every = cpu::select_all(ts.store(), TestStore::kLayer, true);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_EQ(all.tokens(h), every.tokens(h));
      EXPECT_NEAR(mass[size_t(h)], 1.0, 1e-9);
    }
    spec.budget = top_p(0.5, 1);
    const cpu::Selection some = select_blocks(ts.store(), TestStore::kLayer, qv, spec, nullptr, &mass);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_LT(some.tokens(h), all.tokens(h));
      EXPECT_GE(mass[size_t(h)], mode == HeadSelectMode::kSeparate ? 0.5 - 1e-9 : 0.0);
      EXPECT_LE(mass[size_t(h)], 1.0);
    }
    // The reported mass, from fp64 block scores of the stored keys: the
    // group's mean QUEST bound times 1/sqrt(head_dim), n_b tokens each, and
    // the fixed part; summed over the blocks the selection holds.
    const kvstore::Partition part = ts.store().partition(TestStore::kLayer);
    const double scale = 1.0 / std::sqrt(double(c.head_dim));
    const std::vector<double> fixed =
        fixed_part_logsums(ts.store(), TestStore::kLayer, qv, scale, Reduce::kSum);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      std::vector<std::vector<double>> q_group(2, std::vector<double>(size_t(c.head_dim)));
      for (int g = 0; g < 2; ++g)
        for (int ch = 0; ch < c.head_dim; ++ch) q_group[size_t(g)][size_t(ch)] = q[size_t((h * 2 + g) * c.head_dim + ch)];
      std::vector<double> logw;
      std::vector<int64_t> blocks;
      for (int64_t b = part.first_context_block; b < part.end_context_block; ++b) {
        if (b * c.block_size < part.initial_end || (b + 1) * c.block_size > part.local_begin) continue;  // fixed
        const auto keys = cpu::score_ref::stored_block_keys(ts.store(), TestStore::kLayer, h, b);
        const auto reps = cpu::score_ref::representatives(c.type, keys, c.block_size, c.rep_num, {});
        const double e = cpu::score_ref::block_score(c.type, reps, q_group, Reduce::kSum, Reduce::kMax).score / 2 * scale;
        const int64_t n = part.context_end_of(b, c.block_size) - part.context_begin_of(b, c.block_size);
        logw.push_back(std::log(double(n)) + e);
        blocks.push_back(b);
      }
      double m = fixed[size_t(h)];
      for (double x : logw) m = std::max(m, x);
      double total = std::exp(fixed[size_t(h)] - m), held = total;
      const std::vector<int64_t> attended = cpu::attention_ref::tokens_of(some.spans[size_t(h)]);
      for (size_t i = 0; i < blocks.size(); ++i) {
        total += std::exp(logw[i] - m);
        const int64_t first = part.context_begin_of(blocks[i], c.block_size);
        if (std::binary_search(attended.begin(), attended.end(), first)) held += std::exp(logw[i] - m);
      }
      EXPECT_NEAR(mass[size_t(h)], held / total, 1e-4) << "head " << h;
    }
    // top_k leaves the mass empty.
    spec.budget = BudgetConfig{};
    spec.blocks = 3;
    select_blocks(ts.store(), TestStore::kLayer, qv, spec, nullptr, &mass);
    EXPECT_TRUE(mass.empty());
  }
}

}  // namespace
}  // namespace longctx::policy
