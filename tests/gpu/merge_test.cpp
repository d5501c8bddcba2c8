// GPU LSE merge against an fp64 reference of the numerical contract (docs/architecture.md).
// Skips (with the reason) when this build or machine has no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/gpu/device.h"
#include "longctx/gpu/merge.h"
#include "test_seed.h"

namespace {

using longctx::test_seed;
using longctx::gpu::MergeParams;
constexpr float kInf = std::numeric_limits<float>::infinity();

bool have_gpu(std::string* why) { return !longctx::gpu::list_devices(why).empty(); }

// Reference in fp64, written from the contract.
void reference_merge(const std::vector<float>& oa, const std::vector<float>& la, const std::vector<float>& ob,
                     const std::vector<float>& lb, int n_heads, int d, std::vector<double>& o,
                     std::vector<double>& l) {
  o.assign(size_t(n_heads) * d, 0.0);
  l.assign(n_heads, -std::numeric_limits<double>::infinity());
  for (int h = 0; h < n_heads; ++h) {
    const double l1 = la[h], l2 = lb[h];
    if (std::isinf(l1) && std::isinf(l2)) continue;  // both empty
    if (std::isinf(l1) || std::isinf(l2)) {          // one empty: the other unchanged
      const bool take_b = std::isinf(l1);
      for (int c = 0; c < d; ++c) o[size_t(h) * d + c] = take_b ? ob[size_t(h) * d + c] : oa[size_t(h) * d + c];
      l[h] = take_b ? l2 : l1;
      continue;
    }
    const double m = std::max(l1, l2), w1 = std::exp(l1 - m), w2 = std::exp(l2 - m);
    for (int c = 0; c < d; ++c)
      o[size_t(h) * d + c] = (w1 * oa[size_t(h) * d + c] + w2 * ob[size_t(h) * d + c]) / (w1 + w2);
    l[h] = m + std::log(w1 + w2);
  }
}

TEST(GpuMerge, MatchesReferenceOnRandomAndEdgeCases) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  std::mt19937 rng(test_seed(7));
  for (int d : {64, 128, 256}) {
    const int n_heads = 37;
    std::vector<float> oa(size_t(n_heads) * d), ob(oa.size()), la(n_heads), lb(n_heads);
    std::uniform_real_distribution<float> val(-2.f, 2.f), lse(-30.f, 30.f);
    for (auto& x : oa) x = val(rng);
    for (auto& x : ob) x = val(rng);
    for (int h = 0; h < n_heads; ++h) {
      la[h] = lse(rng), lb[h] = lse(rng);
      switch (h % 6) {  // empty parts, both empty, huge logits, far apart
        case 1: la[h] = -kInf; break;
        case 2: lb[h] = -kInf; break;
        case 3: la[h] = lb[h] = -kInf; break;
        case 4: la[h] = 1e4f, lb[h] = -1e4f; break;
        case 5: la[h] = 1e4f, lb[h] = 1e4f - 1.f; break;
      }
      if (std::isinf(la[h])) std::fill_n(oa.begin() + size_t(h) * d, d, 0.f);
      if (std::isinf(lb[h])) std::fill_n(ob.begin() + size_t(h) * d, d, 0.f);
    }
    std::vector<float> o(oa.size()), l(n_heads);
    MergeParams p{oa.data(), la.data(), ob.data(), lb.data(), o.data(), l.data(), n_heads, d};
    longctx::gpu::merge_attention_states_host(p);
    std::vector<double> ro, rl;
    reference_merge(oa, la, ob, lb, n_heads, d, ro, rl);
    const double eps = std::numeric_limits<float>::epsilon();
    for (int h = 0; h < n_heads; ++h) {
      if (std::isinf(rl[h])) {
        EXPECT_TRUE(std::isinf(l[h]) && l[h] < 0) << "head " << h;
      } else {
        EXPECT_NEAR(l[h], rl[h], 8 * eps * std::max(1.0, std::abs(rl[h]))) << "head " << h;
      }
      for (int c = 0; c < d; ++c) {
        const float got = o[size_t(h) * d + c];
        ASSERT_FALSE(std::isnan(got)) << "head " << h;
        EXPECT_NEAR(got, ro[size_t(h) * d + c], 8 * eps * 2.0) << "head " << h << " channel " << c;
      }
    }
  }
}

TEST(GpuMerge, RejectsBadSizes) {
  MergeParams p;
  p.n_heads = 1;
  p.head_dim = 0;
  try {
    longctx::gpu::merge_attention_states_host(p);
    FAIL() << "expected an error";
  } catch (const longctx::Error& e) {
    // Without CUDA the build refuses as unsupported; with CUDA the sizes are refused.
    EXPECT_TRUE(e.code() == longctx::ErrorCode::kInvalidArgument || e.code() == longctx::ErrorCode::kUnsupported)
        << e.what();
  }
}

TEST(GpuDevices, ReportsDevicesOrWhyNone) {
  std::string why;
  const auto devices = longctx::gpu::list_devices(&why);
  if (devices.empty()) {
    EXPECT_FALSE(why.empty());
  } else {
    for (const auto& d : devices) {
      EXPECT_FALSE(d.name.empty());
      EXPECT_GT(d.memory_bytes, 0u);
    }
  }
}

}  // namespace
