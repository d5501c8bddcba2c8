// The sampler against a plain fp64 reference of temperature + top-k + top-p,
// and its draws against that distribution.
#include "longctx/model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::model {
namespace {

// Reference: probabilities of every token (0 where truncated), written from the
// definition: sort by (logit desc, id asc), softmax at temperature T, keep the
// first top_k, renormalize, keep the shortest prefix reaching top_p, renormalize.
std::vector<double> reference(const std::vector<float>& logits, double t, int top_k, double top_p) {
  const size_t n = logits.size();
  std::vector<size_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = i;
  std::sort(ids.begin(), ids.end(), [&](size_t a, size_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  const size_t k = top_k > 0 ? std::min(n, size_t(top_k)) : n;
  std::vector<double> p(n, 0.0);
  double sum = 0.0;
  for (size_t r = 0; r < k; ++r) sum += std::exp(double(logits[ids[r]]) / t);
  double cum = 0.0;
  size_t keep = 0;
  for (size_t r = 0; r < k; ++r) {
    cum += std::exp(double(logits[ids[r]]) / t) / sum;
    keep = r + 1;
    if (cum >= top_p) break;
  }
  for (size_t r = 0; r < keep; ++r) p[ids[r]] = std::exp(double(logits[ids[r]]) / t) / sum / cum;
  return p;
}

std::vector<float> random_logits(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(Sampler, GreedyIsArgmax) {
  std::mt19937_64 rng(test_seed(1));
  for (int trial = 0; trial < 50; ++trial) {
    const auto logits = random_logits(rng, 1 + rng() % 300, 3.0f);
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    Sampler s(SamplerParams{0.0, 5, 0.5, rng()});
    EXPECT_EQ(s.sample(logits), int32_t(best));
    EXPECT_EQ(argmax(logits), int32_t(best));
  }
  // Ties: the lowest index; -inf rows still give a token.
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(argmax(std::vector<float>{-inf, -inf}), 0);
}

TEST(Sampler, DistributionMatchesReference) {
  std::mt19937_64 rng(test_seed(2));
  const double temps[] = {0.3, 1.0, 2.5};
  const int ks[] = {0, 1, 3, 17, 1000};
  const double ps[] = {0.0, 0.3, 0.9, 0.999, 1.0};
  for (int trial = 0; trial < 60; ++trial) {
    const auto logits = random_logits(rng, 1 + rng() % 200, 2.0f);
    for (double t : temps)
      for (int k : ks)
        for (double p : ps) {
          const auto expect = reference(logits, t, k, p);
          const auto got = sampling_distribution(logits, SamplerParams{t, k, p, 0});
          std::vector<double> dense(logits.size(), 0.0);
          double sum = 0.0;
          for (size_t i = 0; i < got.size(); ++i) {
            dense[size_t(got[i].first)] = got[i].second;
            sum += got[i].second;
            if (i > 0) {
              EXPECT_GE(got[i - 1].second, got[i].second);  // most probable first
            }
          }
          EXPECT_NEAR(sum, 1.0, 1e-12);
          for (size_t i = 0; i < logits.size(); ++i)
            ASSERT_NEAR(dense[i], expect[i], 1e-12) << "token " << i << " t=" << t << " k=" << k << " p=" << p;
          // Truncation sizes: top_k bounds it; top_p = 0 keeps one token.
          if (k > 0) {
            EXPECT_LE(got.size(), size_t(k));
          }
          if (p == 0.0 || k == 1) {
            EXPECT_EQ(got.size(), 1u);
          }
        }
  }
}

TEST(Sampler, DrawsFollowTheDistribution) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  const SamplerParams params{0.8, 4, 0.95, 123};
  const auto expect = reference(logits, params.temperature, params.top_k, params.top_p);
  Sampler s(params);
  const int n = 40000;
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++count[size_t(s.sample(logits))];
  for (size_t i = 0; i < logits.size(); ++i) {
    if (expect[i] == 0.0) {
      EXPECT_EQ(count[i], 0) << "token " << i << " was truncated";
      continue;
    }
    // 5 standard deviations of a binomial count.
    const double sd = std::sqrt(n * expect[i] * (1 - expect[i]));
    EXPECT_NEAR(count[i], n * expect[i], 5 * sd + 1) << "token " << i;
  }
}

TEST(Sampler, SameSeedSameTokens) {
  std::mt19937_64 rng(test_seed(3));
  const auto logits = random_logits(rng, 500, 1.5f);
  const auto draw = [&](uint64_t seed) {
    Sampler s(SamplerParams{1.0, 0, 1.0, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, NeverDrawsMinusInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {-inf, 0.0f, -inf, 0.0f};
  Sampler s(SamplerParams{1.0, 0, 1.0, 5});
  for (int i = 0; i < 1000; ++i) {
    const int32_t t = s.sample(logits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, RejectsBadInput) {
  const auto code = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;  // no error: not kInvalidArgument
  };
  EXPECT_EQ(code([] { Sampler(SamplerParams{-1.0, 0, 1.0, 0}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code([] { Sampler(SamplerParams{1.0, -2, 1.0, 0}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code([] { Sampler(SamplerParams{1.0, 0, 1.5, 0}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code([] { Sampler(SamplerParams{NAN, 0, 1.0, 0}); }), ErrorCode::kInvalidArgument);
  Sampler s(SamplerParams{1.0, 0, 1.0, 0});
  EXPECT_EQ(code([&] { s.sample(std::vector<float>{}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code([&] { s.sample(std::vector<float>{0.0f, NAN}); }), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace longctx::model
