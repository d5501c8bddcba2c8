// Highway kernel of the estimated tail (tail_kernel.h): the three dot
// products per (block, query head), a vector exp over the logits, and the
// weighted sum of the blocks' value sums.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tail_kernel.h"

// foreach_target.h re-includes this file once per target; the path is looked
// up through the include directories (policy/include/../src is this folder).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/tail_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::policy::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 8 lanes: head_dim is a multiple of 8, so every row is whole vectors.
using DF = hn::CappedTag<float, 8>;
using VF = hn::Vec<DF>;

// The three sums of one (block, query head) logit: q·ksum, q²·ksq, q²·ksum².
HWY_INLINE void Dots3(const float* q, const float* q2, const float* ksum, const float* ksq, int d, float& qk,
                      float& q2ksq, float& q2k2) {
  const DF df;
  VF a = hn::Zero(df), b = hn::Zero(df), c = hn::Zero(df);
  for (int i = 0; i < d; i += int(hn::Lanes(df))) {
    const VF k = hn::LoadU(df, ksum + i);
    const VF w = hn::LoadU(df, q2 + i);
    a = hn::MulAdd(hn::LoadU(df, q + i), k, a);
    b = hn::MulAdd(w, hn::LoadU(df, ksq + i), b);
    c = hn::MulAdd(hn::Mul(w, k), k, c);
  }
  qk = hn::GetLane(hn::SumOfLanes(df, a));
  q2ksq = hn::GetLane(hn::SumOfLanes(df, b));
  q2k2 = hn::GetLane(hn::SumOfLanes(df, c));
}

void TailHead(const TailHeadArgs& t) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const float half_s2 = 0.5f * t.scale * t.scale;
  for (size_t i = 0; i < t.n; ++i) {
    const float* ksum = t.sums[i];
    const float* ksq = ksum + 2 * t.d;
    for (int j = 0; j < t.group; ++j) {
      float qk, q2ksq, q2k2;
      Dots3(t.q + size_t(j) * t.d, t.q_sq + size_t(j) * t.d, ksum, ksq, t.d, qk, q2ksq, q2k2);
      const float var = std::max(0.f, (q2ksq - q2k2 * t.inv_filled[i]) * t.inv_filled[i]);
      t.logits[size_t(j) * t.n + i] = t.scale * qk * t.inv_filled[i] + t.log_n[i] + half_s2 * var;
    }
  }
  std::vector<double> w_sums(static_cast<size_t>(t.group));
  for (int j = 0; j < t.group; ++j) {
    float* l = t.logits + size_t(j) * t.n;
    const float m = *std::max_element(l, l + t.n);
    // Weights w = exp(l - m) in place, with their sum (exp of the lanes past n is never stored).
    double w_sum = 0.0;
    size_t i = 0;
    for (; i + lanes <= t.n; i += lanes) {
      const VF w = hn::Exp(df, hn::Sub(hn::LoadU(df, l + i), hn::Set(df, m)));
      hn::StoreU(w, df, l + i);
      w_sum += double(hn::GetLane(hn::SumOfLanes(df, w)));
    }
    for (; i < t.n; ++i) {
      l[i] = std::exp(l[i] - m);
      w_sum += double(l[i]);
    }
    t.lse[j] = m + float(std::log(w_sum));
    w_sums[size_t(j)] = w_sum;
  }
  for (int j = 0; j < t.group; ++j) std::fill_n(t.out + size_t(j) * t.d, t.d, 0.f);
  for (size_t i = 0; i < t.n; ++i) {
    const float* vsum = t.sums[i] + t.d;
    for (int j = 0; j < t.group; ++j) {
      const VF a = hn::Set(df, t.logits[size_t(j) * t.n + i] * t.inv_filled[i]);  // w_b / n_b
      float* out = t.out + size_t(j) * t.d;
      for (int c = 0; c < t.d; c += int(lanes))
        hn::StoreU(hn::MulAdd(a, hn::LoadU(df, vsum + c), hn::LoadU(df, out + c)), df, out + c);
    }
  }
  for (int j = 0; j < t.group; ++j) {
    const VF inv = hn::Set(df, float(1.0 / w_sums[size_t(j)]));
    float* out = t.out + size_t(j) * t.d;
    for (int c = 0; c < t.d; c += int(lanes)) hn::StoreU(hn::Mul(inv, hn::LoadU(df, out + c)), df, out + c);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::policy::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::policy::detail {

HWY_EXPORT(TailHead);

void tail_head(const TailHeadArgs& args) { HWY_DYNAMIC_DISPATCH(TailHead)(args); }

}  // namespace longctx::policy::detail
#endif  // HWY_ONCE
