// SnapKV preselection (policy/preselect.h): token votes against an fp64
// reference (explicit causal softmax, column sums, pooling, GQA reduction) with
// error bounds derived from f32 rounding; block sums; preselected sets against
// brute force in SHARED / SEPARATE / adaptive mode; the "use as is" rule and
// restricted re-selection; DYNAMIC representatives fed by the votes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/store_fixture.h"
#include "error_message.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/adakv.h"
#include "longctx/policy/preselect.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using cpu::testing::topology;

const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct VoteCase {
  DType kv_type = DType::kF32;
  int block_size = 4;
  int n_kv_heads = 2;
  int g = 1;
  int head_dim = 64;
  int64_t n_tokens = 10;
  int64_t w = 1;
  RepresentativeType rep = RepresentativeType::kQuest;
  int rep_num = 2;
  int initial_len = 0;
  int local_windows_len = 0;
  SnapKVParams params;
  std::string describe() const {
    return str_cat(dtype_name(kv_type), " block=", block_size, " kv_heads=", n_kv_heads, " g=", g, " tokens=",
                   n_tokens, " w=", w, " kernel=", params.pool_kernel, " pool=", reduce_name(params.pool),
                   " gqa=", reduce_name(params.gqa_reduce), " prefix_only=", params.prefix_only);
  }
};

// A one-layer store with random keys (some of large norm, so attention is
// peaked) appended in random chunks, and random window queries.
struct VoteFixture {
  VoteCase c;
  kvstore::MemoryBudget memory{uint64_t{1} << 30};
  std::unique_ptr<kvstore::KVStore> store;
  std::vector<float> q;  // [w][n_q_heads][head_dim]

  VoteFixture(const VoteCase& vc, std::mt19937& rng) : c(vc) {
    LongContextConfig config;
    config.block_size = c.block_size;
    config.initial_len = c.initial_len;
    config.local_windows_len = c.local_windows_len;
    config.kv_type = c.kv_type;
    config.representative_type = c.rep;
    config.representative_num = c.rep_num;
    config.max_seq_len = c.n_tokens;
    store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{1, c.n_kv_heads, c.head_dim}, config, memory,
                                               topology());
    std::normal_distribution<float> normal;
    const int64_t row = int64_t(c.n_kv_heads) * c.head_dim;
    for (int64_t t = 0; t < c.n_tokens;) {
      const int64_t n = std::min<int64_t>(c.n_tokens - t, std::uniform_int_distribution<int64_t>(1, 40)(rng));
      std::vector<float> k(size_t(n * row)), v(size_t(n * row));
      for (int64_t i = 0; i < n; ++i) {
        const float scale = rng() % 8 == 0 ? 4.f : 1.f;
        for (int64_t j = 0; j < row; ++j) k[size_t(i * row + j)] = scale * normal(rng);
      }
      for (float& x : v) x = normal(rng);
      store->append(0, make_view(k.data(), DType::kF32, {n, c.n_kv_heads, c.head_dim}),
                    make_view(v.data(), DType::kF32, {n, c.n_kv_heads, c.head_dim}));
      t += n;
    }
    q.resize(size_t(c.w) * size_t(n_q_heads()) * size_t(c.head_dim));
    for (float& x : q) x = normal(rng);
  }
  int n_q_heads() const { return c.g * c.n_kv_heads; }
  TensorView window_q() const { return make_view(q.data(), DType::kF32, {c.w, n_q_heads(), c.head_dim}); }
  double key(int h, int64_t t, int ch) const {  // as stored
    const kvstore::BlockView view = store->block(0, h, t / c.block_size);
    return load_as_f32(view.k_t, c.kv_type, size_t(ch) * c.block_size + size_t(t % c.block_size));
  }
};

struct Votes {
  std::vector<double> value, tol;  // [n_kv_heads][n_tokens]
};

// fp64 votes from their definition, with a bound of the f32 kernel's error
// at each entry: a logit's error is at most gamma_d * scale * sum_c |q_c k_c|
// (+ the scale product); a probability's relative error at most twice the
// largest logit error of its row plus the rounding of the subtraction
// (u |s - m|), of exp and of the normalizer (n + 10 terms of u); sums add u
// per term, pooling and GQA max keep the largest bound, mean/sum add them.
Votes reference_votes(const VoteFixture& f) {
  const VoteCase& c = f.c;
  const int64_t n = c.n_tokens;
  const double scale = double(1.f / std::sqrt(float(c.head_dim)));
  const double gamma_d = c.head_dim * kU / (1 - c.head_dim * kU);
  std::vector<double> cols(size_t(f.n_q_heads() * n), 0.0), col_tol(cols.size(), 0.0);
  for (int hq = 0; hq < f.n_q_heads(); ++hq) {
    const int h = hq / c.g;
    for (int64_t i = 0; i < c.w; ++i) {
      const int64_t pos = n - c.w + i;
      const float* q = f.q.data() + size_t((i * f.n_q_heads() + hq) * c.head_dim);
      std::vector<double> s(size_t(pos + 1));
      double max_err = 0, m = -INFINITY;
      for (int64_t t = 0; t <= pos; ++t) {
        double dot = 0, abs_dot = 0;
        for (int ch = 0; ch < c.head_dim; ++ch) {
          dot += q[ch] * f.key(h, t, ch);
          abs_dot += std::abs(q[ch] * f.key(h, t, ch));
        }
        s[size_t(t)] = dot * scale;
        max_err = std::max(max_err, (gamma_d + kU) * abs_dot * scale);
        m = std::max(m, s[size_t(t)]);
      }
      double l = 0, spread = 0;
      for (const double x : s) l += std::exp(x - m), spread = std::max(spread, m - x);
      const double rel = 4 * max_err + 2 * kU * spread + double(pos + 1 + 10) * kU + 2 * c.w * kU;
      for (int64_t t = 0; t <= pos; ++t) {
        const double p = std::exp(s[size_t(t)] - m) / l;
        cols[size_t(hq * n + t)] += p;
        col_tol[size_t(hq * n + t)] += p * rel + std::ldexp(1.0, -126);  // + f32 underflow
      }
    }
  }
  const int64_t first_window = n - c.w;
  if (c.params.prefix_only)
    for (int hq = 0; hq < f.n_q_heads(); ++hq)
      for (int64_t t = first_window; t < n; ++t) cols[size_t(hq * n + t)] = col_tol[size_t(hq * n + t)] = 0;
  std::vector<double> pooled(cols.size()), pooled_tol(cols.size());
  const int r = c.params.pool_kernel / 2;
  for (int hq = 0; hq < f.n_q_heads(); ++hq)
    for (int64_t j = 0; j < n; ++j) {
      double acc = c.params.pool == Reduce::kMax ? -INFINITY : 0, tol = 0;
      for (int64_t t = j - r; t <= j + r; ++t) {
        const double x = t >= 0 && t < n ? cols[size_t(hq * n + t)] : (c.params.pool == Reduce::kMax ? -INFINITY : 0);
        const double e = t >= 0 && t < n ? col_tol[size_t(hq * n + t)] : 0;
        if (c.params.pool == Reduce::kMax) {
          acc = std::max(acc, x), tol = std::max(tol, e);
        } else {
          acc += x / c.params.pool_kernel, tol += e / c.params.pool_kernel;
        }
      }
      if (c.params.pool == Reduce::kMean) tol += (c.params.pool_kernel + 1) * kU * acc;
      const bool zeroed = c.params.prefix_only && j >= first_window;
      pooled[size_t(hq * n + j)] = zeroed ? 0 : acc;
      pooled_tol[size_t(hq * n + j)] = zeroed ? 0 : tol;
    }
  Votes out;
  out.value.assign(size_t(c.n_kv_heads * n), 0.0);
  out.tol.assign(out.value.size(), 0.0);
  for (int h = 0; h < c.n_kv_heads; ++h)
    for (int64_t t = 0; t < n; ++t) {
      double& v = out.value[size_t(h * n + t)];
      double& e = out.tol[size_t(h * n + t)];
      for (int j = 0; j < c.g; ++j) {
        const size_t at = size_t((h * c.g + j) * n + t);
        if (c.params.gqa_reduce == Reduce::kSum) {
          v += pooled[at], e += pooled_tol[at] + c.g * kU * pooled[at];
        } else {
          v = std::max(v, pooled[at]), e = std::max(e, pooled_tol[at]);
        }
      }
    }
  return out;
}

TEST(SnapKVTest, TokenVotesMatchFp64Reference) {
  std::mt19937 rng(test_seed(2024));
  const int block_sizes[] = {1, 4, 16};
  const int groups[] = {1, 2, 4};
  const int64_t windows[] = {1, 3, 32};
  const int kernels[] = {1, 3, 7};
  for (int trial = 0; trial < 36; ++trial) {
    VoteCase c;
    c.block_size = block_sizes[trial % 3];
    c.g = groups[(trial / 3) % 3];
    c.w = windows[(trial / 9) % 3];
    c.kv_type = trial % 2 == 0 ? DType::kF32 : DType::kF16;
    c.n_kv_heads = 1 + int(rng() % 2);
    c.params.pool_kernel = kernels[rng() % 3];
    c.params.pool = rng() % 2 == 0 ? Reduce::kMax : Reduce::kMean;
    c.params.gqa_reduce = rng() % 2 == 0 ? Reduce::kSum : Reduce::kMax;
    c.params.prefix_only = rng() % 4 == 0;
    c.n_tokens = c.w + std::uniform_int_distribution<int64_t>(0, 150)(rng);
    SCOPED_TRACE(c.describe());
    const VoteFixture f(c, rng);
    const std::vector<float> votes = snapkv_token_votes(*f.store, 0, f.window_q(), c.params);
    const Votes ref = reference_votes(f);
    ASSERT_EQ(votes.size(), ref.value.size());
    double total = 0;
    for (size_t i = 0; i < votes.size(); ++i) {
      ASSERT_NEAR(votes[i], ref.value[i], ref.tol[i]) << "kv head " << i / size_t(c.n_tokens) << " token "
                                                     << i % size_t(c.n_tokens);
      total += votes[i];
    }
    // prefix_only with no token before the window: every vote is 0, rightly.
    if (c.params.prefix_only && c.n_tokens == c.w) EXPECT_EQ(total, 0.0);
    else EXPECT_GT(total, 0.0);
  }
}

TEST(SnapKVTest, RejectsBadArguments) {
  std::mt19937 rng(test_seed(5));
  VoteCase c;
  c.n_tokens = 12;
  c.w = 3;
  const VoteFixture f(c, rng);
  const auto expect_invalid = [&](const TensorView& q, const SnapKVParams& p, int layer = 0) {
    try {
      snapkv_token_votes(*f.store, layer, q, p);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  };
  SnapKVParams even;
  even.pool_kernel = 4;
  expect_invalid(f.window_q(), even);
  SnapKVParams sum_pool;
  sum_pool.pool = Reduce::kSum;
  expect_invalid(f.window_q(), sum_pool);
  expect_invalid(f.window_q(), {}, 1);
  std::vector<float> big(13 * 2 * 64);
  expect_invalid(make_view(big.data(), DType::kF32, {13, 2, 64}), {});  // w > n_tokens
  expect_invalid(make_view(big.data(), DType::kF32, {3, 3, 64}), {});   // 3 heads over 2 kv heads
  expect_invalid(make_view(big.data(), DType::kF32, {3, 2, 32}), {});   // head_dim
  expect_invalid(make_view(big.data(), DType::kF32, {0, 2, 64}), {});
}

// ---- block sums --------------------------------------------------------------------

TEST(PreselectTest, BlockVotesSumContextTokens) {
  std::mt19937 rng(test_seed(11));
  for (int trial = 0; trial < 40; ++trial) {
    VoteCase c;
    c.block_size = 1 + int(rng() % 9);
    c.n_kv_heads = 1 + int(rng() % 3);
    c.n_tokens = 1 + int64_t(rng() % 120);
    c.initial_len = int(rng() % 20);
    c.local_windows_len = int(rng() % 30);
    const VoteFixture f(c, rng);
    const kvstore::Partition part = f.store->partition(0);
    std::vector<float> votes(size_t(c.n_kv_heads * c.n_tokens));
    for (float& x : votes) x = std::uniform_real_distribution<float>(0, 3)(rng);
    const std::vector<float> sums = block_votes(votes, c.n_kv_heads, part, c.block_size);
    const int64_t n_context = part.end_context_block - part.first_context_block;
    ASSERT_EQ(sums.size(), size_t(c.n_kv_heads * n_context));
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int64_t i = 0; i < n_context; ++i) {
        const int64_t b = part.first_context_block + i;
        double ref = 0;
        for (int64_t t = b * c.block_size; t < (b + 1) * c.block_size; ++t)
          if (t >= part.initial_end && t < part.local_begin) ref += votes[size_t(h * c.n_tokens + t)];
        EXPECT_NEAR(sums[size_t(h * n_context + i)], ref, kU * ref + 1e-12 * ref) << "head " << h << " block " << b;
      }
  }
  EXPECT_THROW(block_votes(std::vector<float>(5), 2, kvstore::Partition{3, 0, 3, 0, 1}, 4), Error);
}

// ---- preselected sets --------------------------------------------------------------

// Top `count` of a row by (score desc, index asc), as absolute blocks, sorted;
// -inf entries dropped.
std::vector<int64_t> brute_top(const std::vector<float>& row, int64_t count, int64_t first_block) {
  std::vector<int64_t> idx(row.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return row[size_t(a)] > row[size_t(b)]; });
  std::vector<int64_t> out;
  for (int64_t j = 0; j < std::min<int64_t>(count, int64_t(row.size())); ++j)
    if (row[size_t(idx[size_t(j)])] != kNegInf) out.push_back(first_block + idx[size_t(j)]);
  std::sort(out.begin(), out.end());
  return out;
}

// n_context whole context blocks from first_block on: every one is ranked.
kvstore::Partition make_partition(int64_t first_block, int64_t n_context, int block_size) {
  const int64_t local_begin = (first_block + n_context) * block_size;
  return kvstore::Partition::of(local_begin + 5, first_block * block_size, local_begin, block_size);
}

TEST(PreselectTest, PreselectedSetsMatchBruteForce) {
  std::mt19937 rng(test_seed(31));
  for (int trial = 0; trial < 300; ++trial) {
    const int n_heads = 1 + int(rng() % 4);
    const int64_t n_context = int64_t(rng() % 30);
    const int64_t first = int64_t(rng() % 3);
    const int64_t count = int64_t(rng() % 35);
    const kvstore::Partition part = make_partition(first, n_context, 8);
    std::vector<float> scores(size_t(n_heads * n_context));
    for (float& x : scores) x = float(rng() % 6);  // ties
    BudgetConfig budget;
    budget.alpha = double(rng() % 11) / 10;

    // SHARED: sum over heads in head order (f32, exact here: small integers).
    std::vector<float> total(size_t(n_context), 0.f);
    for (int h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < n_context; ++i) total[size_t(i)] += scores[size_t(h * n_context + i)];
    const auto shared = preselect_blocks(scores, n_heads, part, count, HeadSelectMode::kShared, budget);
    ASSERT_EQ(shared.size(), size_t(1));
    EXPECT_EQ(shared[0], brute_top(total, count, first));

    const auto separate = preselect_blocks(scores, n_heads, part, count, HeadSelectMode::kSeparate, budget);
    ASSERT_EQ(separate.size(), size_t(n_heads));
    for (int h = 0; h < n_heads; ++h) {
      const std::vector<float> row(scores.begin() + h * n_context, scores.begin() + (h + 1) * n_context);
      EXPECT_EQ(separate[size_t(h)], brute_top(row, count, first)) << "head " << h;
    }

    budget.policy = BudgetConfig::Policy::kAdaptive;
    const auto adaptive = preselect_blocks(scores, n_heads, part, count, HeadSelectMode::kSeparate, budget);
    auto expected = adakv_select(scores.data(), n_heads, n_context, count, budget.alpha);
    int64_t sum = 0;
    for (auto& list : expected) {
      for (int64_t& b : list) b += first;
      sum += int64_t(list.size());
    }
    EXPECT_EQ(adaptive, expected);
    EXPECT_EQ(sum, n_heads * std::min(count, n_context));
  }
}

TEST(PreselectTest, RestrictedReselection) {
  std::mt19937 rng(test_seed(77));
  for (int trial = 0; trial < 200; ++trial) {
    const int n_heads = 1 + int(rng() % 4);
    const int64_t n_context = 1 + int64_t(rng() % 30);
    const int64_t first = int64_t(rng() % 3);
    const kvstore::Partition part = make_partition(first, n_context, 4);
    const int64_t pre_count = 1 + int64_t(rng() % n_context);
    const HeadSelectMode mode = rng() % 2 == 0 ? HeadSelectMode::kShared : HeadSelectMode::kSeparate;
    BudgetConfig budget;
    if (rng() % 2 == 0) budget.policy = BudgetConfig::Policy::kAdaptive;
    std::vector<float> votes(size_t(n_heads * n_context)), scores(votes.size());
    for (float& x : votes) x = float(rng() % 50);
    for (float& x : scores) x = float(int(rng() % 9) - 4);
    const Preselected pre{preselect_blocks(votes, n_heads, part, pre_count, mode, budget), pre_count,
                          part.end_ranked_block};

    // count >= preselect count: the preselected set itself.
    const int64_t big = pre_count + int64_t(rng() % 3);
    EXPECT_EQ(reselect_blocks(pre, scores, n_heads, part, big, mode, budget), pre.blocks);

    // count < preselect count: the brute-force choice among preselected blocks only.
    const int64_t count = int64_t(rng() % pre_count);
    const auto got = reselect_blocks(pre, scores, n_heads, part, count, mode, budget);
    std::vector<float> masked = scores;
    for (int h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < n_context; ++i) {
        const auto& list = pre.blocks[pre.blocks.size() == 1 ? 0 : size_t(h)];
        if (!std::binary_search(list.begin(), list.end(), first + i)) masked[size_t(h * n_context + i)] = kNegInf;
      }
    std::vector<float> restricted = scores;
    restrict_scores_to(pre, n_heads, part, restricted);
    EXPECT_EQ(std::memcmp(restricted.data(), masked.data(), masked.size() * sizeof(float)), 0);
    if (mode == HeadSelectMode::kShared) {
      std::vector<float> total(size_t(n_context), 0.f);
      for (int h = 0; h < n_heads; ++h)
        for (int64_t i = 0; i < n_context; ++i) total[size_t(i)] += masked[size_t(h * n_context + i)];
      ASSERT_EQ(got.size(), size_t(1));
      EXPECT_EQ(got[0], brute_top(total, count, first));
    } else if (budget.policy == BudgetConfig::Policy::kUniform) {
      for (int h = 0; h < n_heads; ++h) {
        const std::vector<float> row(masked.begin() + h * n_context, masked.begin() + (h + 1) * n_context);
        EXPECT_EQ(got[size_t(h)], brute_top(row, count, first));
      }
    } else {
      int64_t sum = 0, available = 0;
      for (int h = 0; h < n_heads; ++h) {
        for (const int64_t b : got[size_t(h)])
          EXPECT_TRUE(std::binary_search(pre.blocks[size_t(h)].begin(), pre.blocks[size_t(h)].end(), b))
              << "block " << b;
        sum += int64_t(got[size_t(h)].size());
        available += int64_t(pre.blocks[size_t(h)].size());
      }
      EXPECT_EQ(sum, std::min(n_heads * count, available));
    }
  }
}

// Blocks that became ranked after the preselection (they were partial, in the
// local window or not yet written) were never offered to it: later
// selections rank them on their scores with the preselected ones.
TEST(PreselectTest, BlocksRankedSincePreselectionCompete) {
  const int bs = 4;
  const kvstore::Partition then = kvstore::Partition::of(22, 0, 22, bs);  // ranked blocks [0, 5), 5 partial
  const kvstore::Partition now = kvstore::Partition::of(40, 0, 40, bs);   // ranked blocks [0, 10)
  const Preselected pre{{{1, 3}}, 2, then.end_ranked_block};
  EXPECT_TRUE(keeps_preselected(pre, then, 2));
  EXPECT_FALSE(keeps_preselected(pre, now, 2));
  EXPECT_FALSE(keeps_preselected(pre, then, 1));

  const std::vector<float> scores = {9, 1, 9, 7.5f, 9, 3, 8, 7, 6, 5};  // blocks 0..9
  std::vector<float> restricted = scores;
  restrict_scores_to(pre, 1, now, restricted);
  EXPECT_EQ(restricted, (std::vector<float>{kNegInf, 1, kNegInf, 7.5f, kNegInf, 3, 8, 7, 6, 5}));
  const BudgetConfig budget;
  for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
    EXPECT_EQ(reselect_blocks(pre, scores, 1, now, 2, mode, budget), (std::vector<std::vector<int64_t>>{{3, 6}}));
    EXPECT_EQ(reselect_blocks(pre, scores, 1, now, 4, mode, budget),
              (std::vector<std::vector<int64_t>>{{3, 6, 7, 8}}));
    EXPECT_EQ(reselect_blocks(pre, scores, 1, then, 2, mode, budget), pre.blocks);  // nothing new: no scores needed
  }
}

// ---- DYNAMIC representatives -------------------------------------------------------

TEST(PreselectTest, FeedDynamicPicksTopVotedTokens) {
  std::mt19937 rng(test_seed(3));
  for (int trial = 0; trial < 12; ++trial) {
    VoteCase c;
    c.rep = RepresentativeType::kDynamic;
    c.block_size = 4 << (trial % 3);
    c.rep_num = 1 + int(rng() % c.block_size);
    c.n_kv_heads = 2;
    c.g = 2;
    c.n_tokens = 40 + int64_t(rng() % 80);
    c.w = 8;
    c.kv_type = trial % 2 == 0 ? DType::kF16 : DType::kF32;
    SCOPED_TRACE(c.describe());
    VoteFixture f(c, rng);
    const std::vector<float> votes = snapkv_token_votes(*f.store, 0, f.window_q(), c.params);
    feed_dynamic(*f.store, 0, votes);
    const auto& layout = f.store->layout();
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int64_t b = 0; b < f.store->n_blocks(0); ++b) {
        const int64_t begin = b * c.block_size, end = std::min<int64_t>(c.n_tokens, begin + c.block_size);
        std::vector<int> order;
        for (int t = 0; t < end - begin; ++t) order.push_back(t);
        std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
          return votes[size_t(h * c.n_tokens + begin + x)] > votes[size_t(h * c.n_tokens + begin + y)];
        });
        const int valid = f.store->valid_rep_slots(0, h, b);
        ASSERT_EQ(valid, std::min<int>(c.rep_num, int(end - begin)));
        int32_t offsets[512];
        std::memcpy(offsets, f.store->rep_record(0, h, b) + layout.record_offsets_offset,
                    sizeof(int32_t) * size_t(c.rep_num));
        for (int j = 0; j < valid; ++j) EXPECT_EQ(offsets[j], order[size_t(j)]) << "head " << h << " block " << b;
      }
  }
  // Wrong sizes and non-DYNAMIC stores are rejected.
  VoteCase c;
  VoteFixture quest(c, rng);
  EXPECT_THROW(feed_dynamic(*quest.store, 0, std::vector<float>(size_t(c.n_kv_heads * c.n_tokens), 1.f)), Error);
  c.rep = RepresentativeType::kDynamic;
  VoteFixture dynamic(c, rng);
  EXPECT_THROW(feed_dynamic(*dynamic.store, 0, std::vector<float>(3, 1.f)), Error);
}

// The choosing heads' part of a choice and back: the list of heads, their
// rows, and their lists spread to every kv head (SHARED's one list as is).
TEST(ChoosingHeads, ListRowsAndSpread) {
  EXPECT_EQ(choosing_head_list({}, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(choosing_head_list({0, 1, 0, 1}, 4), (std::vector<int>{1, 3}));
  EXPECT_TRUE(choosing_head_list({0, 0}, 2).empty());
  expect_error([] { choosing_head_list({1}, 64); }, ErrorCode::kInvalidArgument,
               {"choosing has 1 entries", "64 kv heads"});
  const std::vector<float> rows = {0.f, 1.f, 10.f, 11.f, 20.f, 21.f, 30.f, 31.f};  // [4 heads][2]
  EXPECT_EQ(rows_of(rows, 2, {1, 3}), (std::vector<float>{10.f, 11.f, 30.f, 31.f}));
  const std::vector<std::vector<int64_t>> chosen = {{5}, {6, 7}};
  EXPECT_EQ(for_every_head(chosen, {1, 3}, 4, HeadSelectMode::kSeparate),
            (std::vector<std::vector<int64_t>>{{}, {5}, {}, {6, 7}}));
  EXPECT_EQ(for_every_head({{5, 6}}, {1, 3}, 4, HeadSelectMode::kShared), (std::vector<std::vector<int64_t>>{{5, 6}}));
}

}  // namespace
}  // namespace longctx::policy
