// Highway kernels of the token scores (token_scores.h): q.k of a block's
// tokens, a vector of tokens at a time, and the sum of exponentials.
#include <algorithm>
#include <cmath>

#include "token_scores.h"

// foreach_target.h re-includes this file once per target; the path is looked
// up through the include directories (policy/include/../src is this folder).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/token_scores_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::policy::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// One row's scores of the tokens [i, i + 2 * lanes): two independent sums
// over the channels, so that consecutive multiply-adds do not wait on each other.
HWY_INLINE void RowScores2(const float* row, int d, const float* kt, size_t ld, size_t i, VF& a, VF& b) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  a = hn::Zero(df);
  b = hn::Zero(df);
  for (int c = 0; c < d; ++c) {
    const VF qc = hn::Set(df, row[c]);
    const float* k = kt + size_t(c) * ld + i;
    a = hn::MulAdd(qc, hn::LoadU(df, k), a);
    b = hn::MulAdd(qc, hn::LoadU(df, k + lanes), b);
  }
}

void ScoreTokensT(const GroupQuery& q, const float* kt, int n, float* out) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const size_t ld = size_t(padded_tokens(n));  // a multiple of lanes: every load is whole
  for (size_t i = 0; i < size_t(n); i += 2 * lanes) {
    if (i + lanes >= ld) {  // one vector left
      VF best = hn::Set(df, -HUGE_VALF);
      for (int r = 0; r < q.n_rows; ++r) {
        const float* row = q.rows.data() + size_t(r) * size_t(q.d);
        VF a = hn::Zero(df);
        for (int c = 0; c < q.d; ++c) a = hn::MulAdd(hn::Set(df, row[c]), hn::LoadU(df, kt + size_t(c) * ld + i), a);
        best = hn::Max(best, a);
      }
      hn::StoreU(best, df, out + i);
      break;
    }
    VF best_a = hn::Set(df, -HUGE_VALF), best_b = best_a;
    for (int r = 0; r < q.n_rows; ++r) {
      VF a, b;
      RowScores2(q.rows.data() + size_t(r) * size_t(q.d), q.d, kt, ld, i, a, b);
      best_a = hn::Max(best_a, a);
      best_b = hn::Max(best_b, b);
    }
    hn::StoreU(best_a, df, out + i);
    hn::StoreU(best_b, df, out + i + lanes);
  }
}

double SumExp(const float* x, int64_t n, float factor, float shift) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const VF f = hn::Set(df, factor), s = hn::Set(df, shift);
  double sum = 0.0;
  int64_t i = 0;
  for (; i + int64_t(lanes) <= n; i += int64_t(lanes))
    sum += double(hn::GetLane(hn::SumOfLanes(df, hn::Exp(df, hn::MulSub(hn::LoadU(df, x + i), f, s)))));
  for (; i < n; ++i) sum += std::exp(double(std::fma(x[i], factor, -shift)));
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::policy::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::policy::detail {

HWY_EXPORT(ScoreTokensT);
HWY_EXPORT(SumExp);

void score_tokens_t(const GroupQuery& q, const float* kt, int n, float* out) {
  HWY_DYNAMIC_DISPATCH(ScoreTokensT)(q, kt, n, out);
}

double sum_exp(const float* x, int64_t n, float factor, float shift) {
  return HWY_DYNAMIC_DISPATCH(SumExp)(x, n, factor, shift);
}

}  // namespace longctx::policy::detail
#endif  // HWY_ONCE
