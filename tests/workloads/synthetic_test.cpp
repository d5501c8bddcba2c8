// The synthetic workload generator: reproducibility, shapes and placement,
// and the structure synthetic.h promises, checked in fp64. Where the promise
// is exact (needle and recency gains, sink keys), the test compares two
// workloads drawn from the same seed that differ in one strength only: the
// random draws do not depend on the strengths, so the difference of the keys
// is exactly the construction's addition. Where it is statistical, the
// tolerance is a multiple of the standard error of the estimate.
// apply_rope is checked against a complex-number rotation in fp64.
#include "longctx/workloads/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/workloads/metrics.h"
#include "tbb/global_control.h"
#include "test_seed.h"

namespace longctx::workloads {
namespace {

constexpr double kEps32 = 0x1p-24;  // unit roundoff of f32

SyntheticSpec small_spec(uint64_t seed) {
  SyntheticSpec s;
  s.n_tokens = 3000;
  s.n_q_heads = 8;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.block_size = 64;
  s.seed = seed;
  return s;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

bool same_workload(const SyntheticWorkload& a, const SyntheticWorkload& b) {
  return same_bytes(a.k, b.k) && same_bytes(a.v, b.v) && same_bytes(a.q, b.q) &&
         a.needle_tokens == b.needle_tokens && a.needle_blocks == b.needle_blocks;
}

const float* key_of(const SyntheticWorkload& w, int64_t t, int kv_head) {
  return w.k.data() + (size_t(t) * size_t(w.spec.n_kv_heads) + size_t(kv_head)) * size_t(w.spec.head_dim);
}

double dot(const float* a, const float* b, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += double(a[i]) * double(b[i]);
  return sum;
}

double abs_dot(const float* a, const float* b, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::fabs(double(a[i]) * double(b[i]));
  return sum;
}

// sigma of the construction: every query head has std(q.k) = logit_std * sqrt(d).
double sigma_of(const SyntheticSpec& s) { return double(s.logit_std) * std::sqrt(double(s.head_dim)); }

// Mean over the query heads of kv head h of q.(k_a - k_b) / sigma, and the
// rounding bound of that difference (each key element rounded to f32 once).
struct Gain {
  double value = 0;
  double bound = 0;
};
Gain mean_gain(const SyntheticWorkload& a, const SyntheticWorkload& b, int64_t t, int kv_head) {
  const SyntheticSpec& s = a.spec;
  const int g = s.n_q_heads / s.n_kv_heads;
  Gain gain;
  for (int j = 0; j < g; ++j) {
    const float* q = a.q.data() + size_t(kv_head * g + j) * size_t(s.head_dim);
    gain.value += (dot(q, key_of(a, t, kv_head), s.head_dim) - dot(q, key_of(b, t, kv_head), s.head_dim)) /
                  (g * sigma_of(s));
    gain.bound += (abs_dot(q, key_of(a, t, kv_head), s.head_dim) + abs_dot(q, key_of(b, t, kv_head), s.head_dim)) *
                  2 * kEps32 / (g * sigma_of(s));
  }
  return gain;
}

TEST(Synthetic, SameSeedSameBytesAnyThreadCountOtherSeedsDiffer) {
  const SyntheticSpec spec = small_spec(7);
  const SyntheticWorkload a = make_synthetic(spec);
  SyntheticWorkload one_thread;
  {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
    one_thread = make_synthetic(spec);
  }
  EXPECT_TRUE(same_workload(a, make_synthetic(spec)));
  EXPECT_TRUE(same_workload(a, one_thread));
  for (uint64_t seed : {8ull, 0ull, ~0ull}) {
    SyntheticSpec other = spec;
    other.seed = seed;
    const SyntheticWorkload b = make_synthetic(other);
    EXPECT_FALSE(same_bytes(a.k, b.k)) << seed;
    EXPECT_FALSE(same_bytes(a.v, b.v)) << seed;
    EXPECT_FALSE(same_bytes(a.q, b.q)) << seed;
  }
}

TEST(Synthetic, ShapesAndNeedlePlacementOverRandomSpecs) {
  std::mt19937 rng(test_seed(3));
  for (int trial = 0; trial < 60; ++trial) {
    SyntheticSpec s;
    s.head_dim = std::vector<int>{8, 16, 64, 128, 256}[rng() % 5];
    s.n_kv_heads = 1 + int(rng() % 3);
    s.n_q_heads = s.n_kv_heads * std::vector<int>{1, 2, 4, 8}[rng() % 4];
    s.block_size = std::vector<int>{1, 7, 16, 128}[rng() % 4];
    s.n_tokens = 1 + int64_t(rng() % 3000);
    s.n_sinks = int(rng() % 6);
    s.recent_tokens = int(rng() % 100);
    if (s.n_sinks > s.n_tokens) s.n_sinks = int(s.n_tokens);
    if (s.recent_tokens > s.n_tokens) s.recent_tokens = int(s.n_tokens);
    s.needle_len = 1 + int(rng() % s.block_size);
    const int64_t free_blocks = [&] {
      int64_t count = 0;
      for (int64_t b = 0; (b + 1) * s.block_size <= s.n_tokens - s.recent_tokens; ++b) count += b * s.block_size >= s.n_sinks;
      return count;
    }();
    s.n_needles = int(std::min<int64_t>(free_blocks, rng() % 6));
    s.seed = rng();
    SCOPED_TRACE(testing::Message() << "trial " << trial << " d " << s.head_dim << " kv " << s.n_kv_heads << " q "
                                    << s.n_q_heads << " n " << s.n_tokens << " block " << s.block_size << " needles "
                                    << s.n_needles << "x" << s.needle_len);
    const SyntheticWorkload w = make_synthetic(s);
    const size_t kv_elems = size_t(s.n_tokens) * size_t(s.n_kv_heads) * size_t(s.head_dim);
    ASSERT_EQ(w.k.size(), kv_elems);
    ASSERT_EQ(w.v.size(), kv_elems);
    ASSERT_EQ(w.q.size(), size_t(s.n_q_heads) * size_t(s.head_dim));
    for (float x : w.k) ASSERT_TRUE(std::isfinite(x));
    for (float x : w.v) ASSERT_TRUE(std::isfinite(x));
    for (float x : w.q) ASSERT_TRUE(std::isfinite(x));
    ASSERT_EQ(w.needle_blocks.size(), size_t(s.n_needles));
    ASSERT_EQ(w.needle_tokens.size(), size_t(s.n_needles) * size_t(s.needle_len));
    EXPECT_TRUE(std::is_sorted(w.needle_tokens.begin(), w.needle_tokens.end()));
    EXPECT_TRUE(std::adjacent_find(w.needle_blocks.begin(), w.needle_blocks.end(),
                                   [](int64_t a, int64_t b) { return a >= b; }) == w.needle_blocks.end());
    // Each block holds exactly one span of needle_len consecutive tokens, and
    // the whole block lies after the sinks and before the recent tokens.
    for (int64_t b : w.needle_blocks) {
      EXPECT_GE(b * s.block_size, s.n_sinks);
      EXPECT_LE((b + 1) * s.block_size, s.n_tokens - s.recent_tokens);
      std::vector<int64_t> in_block;
      for (int64_t t : w.needle_tokens)
        if (t / s.block_size == b) in_block.push_back(t);
      ASSERT_EQ(in_block.size(), size_t(s.needle_len)) << "block " << b;
      EXPECT_EQ(in_block.back() - in_block.front(), s.needle_len - 1) << "block " << b;
    }
    for (int64_t t : w.needle_tokens) {
      EXPECT_TRUE(std::binary_search(w.needle_blocks.begin(), w.needle_blocks.end(), t / s.block_size)) << t;
    }
  }
}

TEST(Synthetic, NeedlesLandInDifferentBlocksAcrossSeeds) {
  std::vector<int64_t> seen;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const SyntheticWorkload w = make_synthetic(small_spec(seed));
    seen.insert(seen.end(), w.needle_blocks.begin(), w.needle_blocks.end());
  }
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  // 80 draws among 44 eligible blocks: a generator stuck on a few blocks would fail this.
  EXPECT_GE(seen.size(), 25u);
}

TEST(Synthetic, RejectsImpossibleSpecsNamingTheField) {
  auto expect_error = [](SyntheticSpec s, const char* field) {
    try {
      make_synthetic(s);
      ADD_FAILURE() << field << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  SyntheticSpec s = small_spec(1);
  auto with = [&](auto change) {
    SyntheticSpec c = s;
    change(c);
    return c;
  };
  expect_error(with([](SyntheticSpec& c) { c.n_tokens = 0; }), "n_tokens");
  expect_error(with([](SyntheticSpec& c) { c.head_dim = 63; }), "head_dim");
  expect_error(with([](SyntheticSpec& c) { c.head_dim = 6; }), "head_dim");
  expect_error(with([](SyntheticSpec& c) { c.n_q_heads = 3; }), "n_q_heads");
  expect_error(with([](SyntheticSpec& c) { c.n_kv_heads = 0; }), "n_kv_heads");
  expect_error(with([](SyntheticSpec& c) { c.block_size = 0; }), "block_size");
  expect_error(with([](SyntheticSpec& c) { c.n_sinks = 3001; }), "n_sinks");
  expect_error(with([](SyntheticSpec& c) { c.recent_tokens = -1; }), "recent_tokens");
  expect_error(with([](SyntheticSpec& c) { c.needle_len = 65; }), "needle_len");
  expect_error(with([](SyntheticSpec& c) { c.n_needles = 45; }), "n_needles");  // 44 free blocks
  expect_error(with([](SyntheticSpec& c) { c.needle_strength = NAN; }), "needle_strength");
  expect_error(with([](SyntheticSpec& c) { c.logit_std = 0; }), "logit_std");
  expect_error(with([](SyntheticSpec& c) { c.rope_theta = 0; }), "rope_theta");
  expect_error(with([](SyntheticSpec& c) { c.head_noise = 1.5f; }), "head_noise");
  SyntheticSpec no_needles = with([](SyntheticSpec& c) { c.n_needles = 0; c.needle_len = 0; });
  EXPECT_NO_THROW(make_synthetic(no_needles));
}

// Ordinary keys: q.k has mean 0 and std logit_std * sqrt(d) for every query head.
TEST(Synthetic, OrdinaryLogitsHaveTheSpecifiedSpread) {
  for (const int head_dim : {64, 128, 256}) {
    SyntheticSpec s = small_spec(11);
    s.head_dim = head_dim;
    s.n_tokens = 8192;
    const SyntheticWorkload w = make_synthetic(s);
    const int g = s.n_q_heads / s.n_kv_heads;
    for (int h = 0; h < s.n_q_heads; ++h) {
      double sum = 0, sum_sq = 0;
      int64_t count = 0;
      for (int64_t t = s.n_sinks; t < s.n_tokens - s.recent_tokens; ++t) {
        if (std::binary_search(w.needle_tokens.begin(), w.needle_tokens.end(), t)) continue;
        const double x = dot(w.q.data() + size_t(h) * size_t(head_dim), key_of(w, t, h / g), head_dim) / sigma_of(s);
        sum += x;
        sum_sq += x * x;
        ++count;
      }
      // i.i.d. N(0, 1) in units of sigma: the mean has standard error 1/sqrt(N),
      // the variance sqrt(2/N); allow 5 standard errors.
      const double mean = sum / double(count);
      const double variance = sum_sq / double(count) - mean * mean;
      EXPECT_NEAR(mean, 0.0, 5 / std::sqrt(double(count))) << "d " << head_dim << " head " << h;
      EXPECT_NEAR(variance, 1.0, 5 * std::sqrt(2 / double(count))) << "d " << head_dim << " head " << h;
    }
  }
}

// The values of ordinary tokens are standard normals: moments and tail
// fractions of ~1M draws match N(0, 1) (5 binomial standard errors).
TEST(Synthetic, OrdinaryValuesAreStandardNormal) {
  SyntheticSpec s = small_spec(5);
  s.n_tokens = 4096;
  s.head_dim = 128;
  s.n_needles = 0;
  const SyntheticWorkload w = make_synthetic(s);
  const size_t row = size_t(s.n_kv_heads) * size_t(s.head_dim);
  std::vector<double> x(w.v.begin() + ptrdiff_t(size_t(s.n_sinks) * row), w.v.end());
  const double n = double(x.size());
  double sum = 0, sum_sq = 0, sum_4 = 0;
  for (double v : x) sum += v, sum_sq += v * v, sum_4 += v * v * v * v;
  EXPECT_NEAR(sum / n, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(sum_sq / n, 1.0, 5 * std::sqrt(2 / n));
  EXPECT_NEAR(sum_4 / n, 3.0, 5 * std::sqrt(96 / n));  // Var(z^4) = 105 - 9
  for (const double cut : {0.5, 1.0, 2.0, 3.0, 3.5, 4.0}) {
    const double p = std::erfc(cut / std::numbers::sqrt2);  // P(|z| > cut)
    const double observed = double(std::count_if(x.begin(), x.end(), [&](double v) { return std::fabs(v) > cut; }));
    EXPECT_NEAR(observed, p * n, 5 * std::sqrt(n * p * (1 - p)) + 1) << "|z| > " << cut;
  }
}

// Needles: mean over the group's heads of q.k / sigma is needle_strength,
// exactly up to f32 rounding; compared across two strengths from one seed.
TEST(Synthetic, NeedleGainIsExactlyTheRequestedStrength) {
  SyntheticSpec s = small_spec(21);
  s.needle_strength = 6.f;
  SyntheticSpec weaker = s;
  weaker.needle_strength = 2.5f;
  const SyntheticWorkload a = make_synthetic(s);
  const SyntheticWorkload b = make_synthetic(weaker);
  ASSERT_EQ(a.needle_tokens, b.needle_tokens);
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    const bool needle = std::binary_search(a.needle_tokens.begin(), a.needle_tokens.end(), t);
    for (int h = 0; h < s.n_kv_heads; ++h) {
      const Gain gain = mean_gain(a, b, t, h);
      EXPECT_NEAR(gain.value, needle ? 3.5 : 0.0, gain.bound + 1e-12) << "token " << t << " kv head " << h;
    }
  }
  // And the level itself: each needle token's mean q.k / sigma is the strength
  // (exact up to rounding), every head of the group close to it.
  const int g = s.n_q_heads / s.n_kv_heads;
  for (int64_t t : a.needle_tokens) {
    for (int h = 0; h < s.n_kv_heads; ++h) {
      double mean = 0;
      for (int j = 0; j < g; ++j) {
        const double x = dot(a.q.data() + size_t(h * g + j) * size_t(s.head_dim), key_of(a, t, h), s.head_dim) / sigma_of(s);
        mean += x / g;
        EXPECT_GT(x, 0.6 * s.needle_strength) << "token " << t << " q head " << h * g + j;
      }
      EXPECT_NEAR(mean, s.needle_strength, 1e-4) << "token " << t;
    }
  }
}

// Recency: the key at distance delta gains recency_bias * (1 - delta / recent_tokens) sigmas.
TEST(Synthetic, RecencyGainDecaysLinearly) {
  SyntheticSpec s = small_spec(4);
  s.recency_bias = 3.f;
  SyntheticSpec none = s;
  none.recency_bias = 0.f;
  const SyntheticWorkload a = make_synthetic(s);
  const SyntheticWorkload b = make_synthetic(none);
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    const int64_t distance = s.n_tokens - 1 - t;
    const double expected = distance < s.recent_tokens ? 3.0 * (1.0 - double(distance) / s.recent_tokens) : 0.0;
    for (int h = 0; h < s.n_kv_heads; ++h) {
      const Gain gain = mean_gain(a, b, t, h);
      EXPECT_NEAR(gain.value, expected, gain.bound + 1e-12) << "token " << t << " kv head " << h;
    }
  }
}

// Sinks: their keys are the ordinary draw plus sink_norm * sqrt(d) along a
// unit direction (the norm of the difference, rotated by RoPE, is exact).
TEST(Synthetic, SinkKeysAddTheRequestedNorm) {
  SyntheticSpec s = small_spec(9);
  SyntheticSpec none = s;
  none.sink_norm = 0.f;
  const SyntheticWorkload a = make_synthetic(s);
  const SyntheticWorkload b = make_synthetic(none);
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    for (int h = 0; h < s.n_kv_heads; ++h) {
      double diff_sq = 0, norm_sq = 0;
      for (int c = 0; c < s.head_dim; ++c) {
        const double diff = double(key_of(a, t, h)[c]) - double(key_of(b, t, h)[c]);
        diff_sq += diff * diff;
        norm_sq += double(key_of(a, t, h)[c]) * key_of(a, t, h)[c];
      }
      const double expected = t < s.n_sinks ? s.sink_norm * std::sqrt(double(s.head_dim)) : 0.0;
      EXPECT_NEAR(std::sqrt(diff_sq), expected, 4 * kEps32 * std::sqrt(norm_sq) + 1e-12) << "token " << t;
    }
  }
}

// What the workload is for: dense attention (fp64) finds the needles and the
// sinks. Each needle token gets far more than an ordinary token (> 20x the
// median: its logit is needle_strength * logit_std = 4 * 1.5 = 6 above the
// ordinary mean, e^6 ~ 400x), and the sinks take a large share of the
// attention, each more than any ordinary token.
TEST(Synthetic, DenseAttentionSeesNeedlesAndSinks) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    SyntheticSpec s;
    s.n_tokens = 8192;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.head_dim = 128;
    s.needle_strength = 4.f;  // a weak needle still stands far above the median token
    s.seed = seed;
    const SyntheticWorkload w = make_synthetic(s);
    const std::vector<double> probs = dense_probabilities(w);
    for (int h = 0; h < s.n_q_heads; ++h) {
      const double* p = probs.data() + size_t(h) * size_t(s.n_tokens);
      std::vector<double> ordinary;
      double sink_mass = 0;
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        const bool needle = std::binary_search(w.needle_tokens.begin(), w.needle_tokens.end(), t);
        if (t < s.n_sinks) {
          sink_mass += p[t];
        } else if (t < s.n_tokens - s.recent_tokens && !needle) {
          ordinary.push_back(p[t]);
        }
      }
      std::nth_element(ordinary.begin(), ordinary.begin() + ptrdiff_t(ordinary.size() / 2), ordinary.end());
      const double median = ordinary[ordinary.size() / 2];
      const double largest_ordinary = *std::max_element(ordinary.begin(), ordinary.end());
      for (int64_t t : w.needle_tokens) EXPECT_GT(p[t], 20 * median) << "seed " << seed << " head " << h << " token " << t;
      // A sink's q.k is about sink_norm sigma, its logit about 8 * 1.5 = 12
      // (at least ~5 sigma, 7.5, with the content noise of the heavy channels),
      // against ~8K ordinary tokens that weigh about 8192 * e^(1.5^2/2) ~ e^10.1.
      EXPECT_GT(sink_mass, 0.3) << "seed " << seed << " head " << h;
      for (int64_t t = 0; t < s.n_sinks; ++t) EXPECT_GT(p[t], largest_ordinary) << "sink " << t;
    }
  }
}

// ------------------------------------------------------------------ RoPE

// Reference: pair (x_i, x_{i+d/2}) as the complex number x_i + i x_{i+d/2},
// multiplied by e^{i position theta^(-2i/d)}.
std::vector<double> reference_rope(const std::vector<float>& x, int64_t position, double theta) {
  const size_t half = x.size() / 2;
  std::vector<double> y(x.size());
  for (size_t i = 0; i < half; ++i) {
    const double frequency = 1.0 / std::pow(theta, double(2 * i) / double(x.size()));
    const std::complex<double> z =
        std::complex<double>(x[i], x[i + half]) * std::polar(1.0, double(position) * frequency);
    y[i] = z.real();
    y[i + half] = z.imag();
  }
  return y;
}

TEST(ApplyRope, MatchesComplexRotation) {
  std::mt19937_64 rng(test_seed(17));
  std::normal_distribution<float> normal;
  for (const int head_dim : {2, 4, 64, 128, 256}) {
    for (const double theta : {10000.0, 500000.0, 1e6}) {
      for (const int64_t position : {int64_t{0}, int64_t{1}, int64_t{-5}, int64_t{127}, int64_t{4097}, int64_t{131071},
                                     int64_t{1} << 20, -(int64_t{1} << 20)}) {
        std::vector<float> x(static_cast<size_t>(head_dim));
        for (float& v : x) v = normal(rng) * 3.f;
        const std::vector<double> expected = reference_rope(x, position, theta);
        std::vector<float> y = x;
        apply_rope(y.data(), head_dim, position, theta);
        for (int i = 0; i < head_dim / 2; ++i) {
          // One f32 rounding of each output (|y| <= the pair's norm r), plus
          // the fp64 rotation of an angle up to ~1e6 rad (~1e-10 relative).
          const double r = std::hypot(double(x[size_t(i)]), double(x[size_t(i + head_dim / 2)]));
          for (const int c : {i, i + head_dim / 2}) {
            EXPECT_NEAR(y[size_t(c)], expected[size_t(c)], r * (kEps32 + 1e-9))
                << "d " << head_dim << " theta " << theta << " pos " << position << " channel " << c;
          }
        }
        if (position == 0) {
          EXPECT_EQ(x, y);  // cos 0 = 1, sin 0 = 0: exact
        }
      }
    }
  }
}

// q(m).k(n) depends only on m - n, and the rotation keeps the norm.
TEST(ApplyRope, DotProductDependsOnlyOnRelativePosition) {
  std::mt19937_64 rng(test_seed(23));
  std::normal_distribution<float> normal;
  for (const int head_dim : {64, 128}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> q(static_cast<size_t>(head_dim)), k(static_cast<size_t>(head_dim));
      for (float& v : q) v = normal(rng);
      for (float& v : k) v = normal(rng);
      const int64_t m = int64_t(rng() % 100000), n = int64_t(rng() % 100000), shift = int64_t(rng() % 50000) - 25000;
      auto rotated_dot = [&](int64_t qm, int64_t kn) {
        std::vector<float> a = q, b = k;
        apply_rope(a.data(), head_dim, qm, 500000.0);
        apply_rope(b.data(), head_dim, kn, 500000.0);
        return dot(a.data(), b.data(), head_dim);
      };
      double q_norm = 0, k_norm = 0;
      for (int c = 0; c < head_dim; ++c) q_norm += double(q[size_t(c)]) * q[size_t(c)], k_norm += double(k[size_t(c)]) * k[size_t(c)];
      q_norm = std::sqrt(q_norm);
      k_norm = std::sqrt(k_norm);
      // Each rotated element carries one f32 rounding (relative ~2^-24 of its
      // pair's norm): the dot of two such vectors moves by < 2 * 2 * 2^-24 |q||k|,
      // twice over for the two dots compared.
      EXPECT_NEAR(rotated_dot(m, n), rotated_dot(m + shift, n + shift), 8 * kEps32 * q_norm * k_norm)
          << "m " << m << " n " << n << " shift " << shift;
      std::vector<float> a = q;
      apply_rope(a.data(), head_dim, m, 500000.0);
      EXPECT_NEAR(std::sqrt(dot(a.data(), a.data(), head_dim)), q_norm, 4 * kEps32 * q_norm);
    }
  }
}

TEST(ApplyRope, RejectsOddHeadDimAndBadTheta) {
  std::vector<float> x(8, 1.f);
  EXPECT_THROW(apply_rope(x.data(), 7, 3, 10000.0), Error);
  EXPECT_THROW(apply_rope(x.data(), 0, 3, 10000.0), Error);
  EXPECT_THROW(apply_rope(x.data(), 8, 3, 0.0), Error);
  EXPECT_THROW(apply_rope(x.data(), 8, 3, -1.0), Error);
}

}  // namespace
}  // namespace longctx::workloads
