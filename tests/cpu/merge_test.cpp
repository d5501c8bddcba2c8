// merge_attention against the contract's formula in fp64 (reference.h),
// empty parts on either side, aliasing, extreme lse values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "reference.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

struct Parts {
  int n_heads = 0, dim = 0;
  std::vector<float> out_a, lse_a, out_b, lse_b;
};

// lse values from several regimes: close together, far apart, huge, empty.
float random_lse(std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  switch (rng() % 8) {
    case 0: return -kInf;
    case 1: return 1e4f * uni(rng);
    case 2: return 80.f * uni(rng);
    case 3: return 3e38f * uni(rng);
    default: return 5.f * uni(rng);
  }
}

Parts random_parts(std::mt19937& rng, int n_heads, int dim) {
  std::normal_distribution<float> normal;
  Parts p;
  p.n_heads = n_heads;
  p.dim = dim;
  for (auto* out : {&p.out_a, &p.out_b})
    for (int i = 0; i < n_heads * dim; ++i) out->push_back(normal(rng));
  for (int h = 0; h < n_heads; ++h) {
    p.lse_a.push_back(random_lse(rng));
    p.lse_b.push_back(random_lse(rng));
    // An empty part's out is 0 by contract; garbage there must not leak either.
    for (auto [out, lse] : {std::pair{&p.out_a, p.lse_a.back()}, std::pair{&p.out_b, p.lse_b.back()}})
      if (lse == -kInf)
        for (int c = 0; c < dim; ++c) (*out)[size_t(h * dim + c)] = rng() % 2 ? 0.f : kNaN;
  }
  return p;
}

// Compares a merge result with the fp64 formula. Error bound: the weights
// exp(l_i - m) are within 2u (exp) plus u |l_i - m| w_i <= u/e (the rounded
// difference) of their value, so each coefficient w_i / (w_a + w_b) is within
// about 6u relative; two products and a sum add 3u: |d out| <= 10u (|o_a| + |o_b|).
// lse = m + log1p(w): |d lse| <= 2u |lse| + 4u.
void expect_merge_matches(const Parts& p, const std::vector<float>& out, const std::vector<float>& lse) {
  for (int h = 0; h < p.n_heads; ++h) {
    SCOPED_TRACE(::testing::Message() << "head " << h << " lse_a " << p.lse_a[h] << " lse_b " << p.lse_b[h]);
    const size_t row = size_t(h) * p.dim;
    std::vector<double> ref_out(p.out_a.begin() + row, p.out_a.begin() + row + p.dim);
    std::vector<double> out_b(p.out_b.begin() + row, p.out_b.begin() + row + p.dim);
    double ref_lse = p.lse_a[h];
    attention_ref::merge(ref_out, ref_lse, out_b, p.lse_b[h]);

    if (p.lse_a[h] == -kInf || p.lse_b[h] == -kInf) {
      // Exactly the non-empty part (or zeros), bit for bit.
      EXPECT_EQ(lse[h], float(ref_lse));
      for (int c = 0; c < p.dim; ++c) {
        const float expected = p.lse_b[h] == -kInf ? (p.lse_a[h] == -kInf ? 0.f : p.out_a[row + c]) : p.out_b[row + c];
        ASSERT_EQ(std::memcmp(&out[row + c], &expected, 4), 0) << "channel " << c << ": " << out[row + c];
      }
      continue;
    }
    ASSERT_TRUE(std::isfinite(lse[h]));
    EXPECT_NEAR(lse[h], ref_lse, 2 * kU * std::abs(ref_lse) + 4 * kU);
    for (int c = 0; c < p.dim; ++c) {
      const double bound = 10 * kU * (std::abs(p.out_a[row + c]) + std::abs(p.out_b[row + c]));
      ASSERT_NEAR(out[row + c], ref_out[size_t(c)], bound) << "channel " << c;
    }
  }
}

TEST(MergeAttention, MatchesTheFormulaAndKeepsEmptyPartsExact) {
  std::mt19937 rng(test_seed(7));
  for (int trial = 0; trial < 200; ++trial) {
    const int n_heads = 1 + int(rng() % 9);
    const int dim = 1 + int(rng() % 160);
    const Parts p = random_parts(rng, n_heads, dim);
    std::vector<float> out(size_t(n_heads) * dim, 123.f), lse(size_t(n_heads), 123.f);
    merge_attention(p.out_a.data(), p.lse_a.data(), p.out_b.data(), p.lse_b.data(), out.data(), lse.data(), n_heads,
                    dim);
    expect_merge_matches(p, out, lse);
  }
}

TEST(MergeAttention, EmptyPartsNeverMakeNaN) {
  const int dim = 5;
  const std::vector<float> finite = {1.f, -2.f, 3.f, 0.5f, 0.f};
  const std::vector<float> zeros(dim, 0.f);
  const std::vector<float> garbage(dim, kNaN);
  struct Case {
    float lse_a, lse_b;
    const std::vector<float>*a, *b;
    float lse;
    const std::vector<float>* out;
  };
  const Case cases[] = {
      {-kInf, 2.5f, &garbage, &finite, 2.5f, &finite},   // a empty
      {2.5f, -kInf, &finite, &garbage, 2.5f, &finite},   // b empty
      {-kInf, -kInf, &zeros, &zeros, -kInf, &zeros},     // both empty
      {-kInf, -kInf, &garbage, &garbage, -kInf, &zeros}, // both empty, garbage outs
      {-1e4f, -kInf, &finite, &zeros, -1e4f, &finite},   // very small but not empty
  };
  for (const Case& c : cases) {
    std::vector<float> out(dim, 7.f);
    float lse = 7.f;
    merge_attention(c.a->data(), &c.lse_a, c.b->data(), &c.lse_b, out.data(), &lse, 1, dim);
    EXPECT_EQ(lse, c.lse);
    for (int i = 0; i < dim; ++i) EXPECT_EQ(out[i], (*c.out)[i]) << "lse_a " << c.lse_a << " lse_b " << c.lse_b;
  }
}

TEST(MergeAttention, OutputMayAliasEitherInput) {
  std::mt19937 rng(test_seed(11));
  for (int trial = 0; trial < 50; ++trial) {
    const int n_heads = 1 + int(rng() % 6), dim = 1 + int(rng() % 70);
    const Parts p = random_parts(rng, n_heads, dim);
    std::vector<float> out(p.out_a.size()), lse(p.lse_a.size());
    merge_attention(p.out_a.data(), p.lse_a.data(), p.out_b.data(), p.lse_b.data(), out.data(), lse.data(), n_heads,
                    dim);
    Parts into_a = p, into_b = p;
    merge_attention(into_a.out_a.data(), into_a.lse_a.data(), into_a.out_b.data(), into_a.lse_b.data(),
                    into_a.out_a.data(), into_a.lse_a.data(), n_heads, dim);
    merge_attention(into_b.out_a.data(), into_b.lse_a.data(), into_b.out_b.data(), into_b.lse_b.data(),
                    into_b.out_b.data(), into_b.lse_b.data(), n_heads, dim);
    EXPECT_EQ(std::memcmp(into_a.out_a.data(), out.data(), out.size() * 4), 0);
    EXPECT_EQ(std::memcmp(into_a.lse_a.data(), lse.data(), lse.size() * 4), 0);
    EXPECT_EQ(std::memcmp(into_b.out_b.data(), out.data(), out.size() * 4), 0);
    EXPECT_EQ(std::memcmp(into_b.lse_b.data(), lse.data(), lse.size() * 4), 0);
  }
}

TEST(MergeAttention, ExtremeLseStaysFinite) {
  const float pairs[][2] = {{1e4f, -1e4f}, {-1e4f, -1e4f + 1}, {-1e4f, -1e4f}, {88.f, -88.f},
                            {3e38f, 3e38f}, {-3e38f, 3e38f}, {0.f, 1e-30f}, {104.f, 104.f}};
  for (const auto& pair : pairs) {
    Parts p;
    p.n_heads = 1;
    p.dim = 3;
    p.out_a = {1e30f, -1.f, 0.25f};
    p.out_b = {-1e30f, 2.f, 0.75f};
    p.lse_a = {pair[0]};
    p.lse_b = {pair[1]};
    std::vector<float> out(3), lse(1);
    merge_attention(p.out_a.data(), p.lse_a.data(), p.out_b.data(), p.lse_b.data(), out.data(), lse.data(), 1, 3);
    for (float x : out) EXPECT_TRUE(std::isfinite(x)) << pair[0] << " " << pair[1];
    expect_merge_matches(p, out, lse);
  }
}

// Attention over a token list equals the merge of the attentions over two
// halves of it: the property the flash-decoding split relies on. The parts are
// fp64 results rounded to f32, so the bound adds their rounding (u relative on
// each out and on each lse, i.e. u |lse| absolute in the exponents).
TEST(MergeAttention, MergingHalvesGivesTheWhole) {
  std::mt19937 rng(test_seed(3));
  std::normal_distribution<float> normal;
  const int dim = 32;
  attention_ref::HeadKV kv;
  kv.head_dim = dim;
  const int n = 300;
  for (int i = 0; i < n * dim; ++i) {
    kv.k.push_back(2 * normal(rng));
    kv.v.push_back(normal(rng));
  }
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<float> q(dim);
    for (float& x : q) x = normal(rng);
    std::vector<int64_t> all(n), first, second;
    for (int t = 0; t < n; ++t) (rng() % 3 == 0 ? first : second).push_back(t), all[size_t(t)] = t;
    const auto whole = attention_ref::attend(q.data(), 0.3, kv, all);
    const auto a = attention_ref::attend(q.data(), 0.3, kv, first);
    const auto b = attention_ref::attend(q.data(), 0.3, kv, second);
    std::vector<float> out_a(a.out.begin(), a.out.end()), out_b(b.out.begin(), b.out.end()), out(dim);
    const float lse_a = float(a.lse), lse_b = float(b.lse);
    float lse = 0;
    merge_attention(out_a.data(), &lse_a, out_b.data(), &lse_b, out.data(), &lse, 1, dim);
    const double lse_error = kU * (std::abs(a.lse) + std::abs(b.lse));
    EXPECT_NEAR(lse, whole.lse, 2 * kU * std::abs(whole.lse) + 4 * kU + lse_error);
    for (int c = 0; c < dim; ++c)
      EXPECT_NEAR(out[c], whole.out[size_t(c)], (12 * kU + 2 * lse_error) * 2 * whole.max_abs_value);
  }
}

// A part's lse is finite or -inf: NaN or +inf is refused naming the part and
// head, before anything is written (the merged result would be NaN).
TEST(MergeAttention, RejectsNaNAndPlusInfLse) {
  const float good[2] = {0.5f, -INFINITY}, out_a[4] = {1, 2, 3, 4}, out_b[4] = {5, 6, 7, 8};
  for (const float bad : {NAN, INFINITY}) {
    for (const bool in_b : {false, true}) {
      float lse_a[2] = {good[0], good[1]}, lse_b[2] = {good[0], good[1]};
      (in_b ? lse_b : lse_a)[1] = bad;
      float out[4] = {9, 9, 9, 9}, lse[2] = {9, 9};
      try {
        merge_attention(out_a, lse_a, out_b, lse_b, out, lse, 2, 2);
        ADD_FAILURE() << "no error for " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(str_cat(in_b ? "lse_b" : "lse_a", "[1] is ")), std::string::npos)
            << e.what();
      }
      EXPECT_TRUE(std::all_of(out, out + 4, [](float x) { return x == 9.f; }) && lse[0] == 9.f && lse[1] == 9.f);
    }
  }
}

TEST(MergeAttention, RejectsNegativeSizesAndAcceptsZero) {
  float x = 0;
  merge_attention(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 16);
  float la = 0.f, lb = 0.f, l = 7.f;  // head_dim 0: the lse still merge
  merge_attention(&x, &la, &x, &lb, &x, &l, 1, 0);
  EXPECT_FLOAT_EQ(l, std::log(2.f));
  for (auto [n, d] : {std::pair{-1, 4}, std::pair{2, -3}}) {
    try {
      merge_attention(&x, &x, &x, &x, &x, &x, n, d);
      ADD_FAILURE() << "no error for n_heads " << n << " head_dim " << d;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("merge_attention"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace longctx::cpu
