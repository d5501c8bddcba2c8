// lse_merge (core/lse_merge.h), the merge rule of every partial attention
// result on the CPU and the GPU, against fp64 over n parts: empty parts
// anywhere, equal maxima, differences from 0 to beyond f32's exp range.
#include "longctx/core/lse_merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "test_seed.h"

namespace longctx {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

// fp64: max, W = sum exp(l - max), lse = max + log(W); W = 0 when all empty.
struct Reference {
  double max_lse = -INFINITY, weight_sum = 0, lse = -INFINITY;
};
Reference reference(const std::vector<float>& lse) {
  Reference r;
  for (float l : lse) r.max_lse = std::max(r.max_lse, double(l));
  if (r.max_lse == -INFINITY) return r;
  for (float l : lse) r.weight_sum += l == -kInf ? 0.0 : std::exp(double(l) - r.max_lse);
  r.lse = r.max_lse + std::log(r.weight_sum);
  return r;
}

float random_lse(std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  switch (rng() % 7) {
    case 0: return -kInf;
    case 1: return 1e4f * uni(rng);
    case 2: return 120.f * uni(rng);  // weights below f32's smallest normal
    case 3: return 1e-6f * uni(rng);  // nearly equal
    default: return 5.f * uni(rng);
  }
}

TEST(LseMerge, MatchesFp64OverManyParts) {
  std::mt19937 rng(test_seed(3));
  for (int trial = 0; trial < 5000; ++trial) {
    const int n = 1 + int(rng() % 9);
    std::vector<float> lse(static_cast<size_t>(n));
    for (float& l : lse) l = random_lse(rng);
    if (trial % 5 == 0) lse[rng() % size_t(n)] = lse[0];  // an equal maximum, often
    const Reference ref = reference(lse);
    const LseMerge got = lse_merge(lse.data(), n);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " n " << n);
    EXPECT_EQ(got.max_lse, float(ref.max_lse));
    if (ref.max_lse == -INFINITY) {
      EXPECT_EQ(got.weight_sum, 0.f);
      EXPECT_EQ(got.lse, -kInf);
      continue;
    }
    // Each weight within 3u (exp of an exact difference plus its rounding,
    // |l - m| u w <= u/e), the sum adds n u: W within (n + 3) u W.
    EXPECT_NEAR(got.weight_sum, ref.weight_sum, double(n + 3) * kU * ref.weight_sum);
    // lse = m + log1p(W - 1): log1p's relative error on W - 1 becomes an
    // absolute one below (n + 4) u, plus the rounding of the sum with m.
    EXPECT_NEAR(got.lse, ref.lse, double(n + 4) * kU + 2 * kU * std::abs(ref.lse));
  }
}

TEST(LseMerge, EmptyPartsWeighNothingAndEqualMaximaCountOnce) {
  const float parts[] = {-kInf, 2.f, -kInf, 2.f, 2.f};
  const LseMerge m = lse_merge(parts, 5);
  EXPECT_EQ(m.max_lse, 2.f);
  EXPECT_EQ(m.weight_sum, 3.f);
  EXPECT_FLOAT_EQ(m.lse, 2.f + std::log(3.f));
  EXPECT_EQ(lse_weight(-kInf, 2.f), 0.f);
  EXPECT_EQ(lse_weight(-kInf, -kInf), 0.f);  // every part empty: no NaN
  const float one[] = {7.f, -kInf};
  EXPECT_EQ(lse_merge(one, 2).lse, 7.f);  // one part: exactly its own lse
  const float none[] = {-kInf, -kInf, -kInf};
  EXPECT_EQ(lse_merge(none, 3).lse, -kInf);
  EXPECT_EQ(lse_merge(none, 0).lse, -kInf);
  // A strided view: the split layout of the GPU kernel, [split][head].
  const float split_major[] = {1.f, 5.f, -kInf, 5.f, 1.f, -kInf};  // 3 splits x 2 heads: {1, -inf, 1}, {5, 5, -inf}
  EXPECT_FLOAT_EQ(lse_merge(split_major + 1, 3, 2).lse, 5.f + std::log(2.f));
  EXPECT_FLOAT_EQ(lse_merge(split_major, 3, 2).lse, 1.f + std::log(2.f));  // head 0: {1, -inf, 1}
}

// A part far below the largest is not lost: log1p keeps its share, where
// m + log(1 + w) rounds 1 + w to 1 once w < u.
TEST(LseMerge, SmallPartsKeepTheirShareOfTheLse) {
  const float parts[] = {0.f, -20.f};  // w = 2.06e-9 < u
  const LseMerge m = lse_merge(parts, 2);
  EXPECT_GT(m.lse, 0.f);
  EXPECT_NEAR(m.lse, std::exp(-20.0), 1e-15);
}

}  // namespace
}  // namespace longctx
