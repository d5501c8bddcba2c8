// Highway kernels of the token scores (token_scores.h): q.k of a block's
// tokens, a vector of tokens at a time, and sums of exponentials.
#include <algorithm>
#include <cmath>

#include "token_scores.h"

#include "longctx/core/error.h"

// foreach_target.h re-includes this file once per target; the path is looked
// up through the include directories (policy/include/../src is this folder).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/token_scores_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "longctx/core/widen_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::policy::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using longctx::HWY_NAMESPACE::LoadWidened;

// One row's dot products with the tokens [i, i + 2 * lanes): two independent
// sums over the channels, so that consecutive multiply-adds do not wait on each other.
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

// One row's dot products with the tokens [i, i + lanes).
HWY_INLINE VF RowDot(const float* row, int d, const float* kt, size_t ld, size_t i) {
  const DF df;
  VF a = hn::Zero(df);
  for (int c = 0; c < d; ++c) a = hn::MulAdd(hn::Set(df, row[c]), hn::LoadU(df, kt + size_t(c) * ld + i), a);
  return a;
}

void ScoreTokensT(const float* rows, int n_rows, int d, const float* kt, size_t ld, int n, float scale, float* out) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const VF s = hn::Set(df, scale);
  const size_t end = size_t(padded_tokens(n));  // <= ld, a multiple of lanes: every load is whole
  for (size_t i = 0; i < size_t(n); i += 2 * lanes) {
    if (i + lanes >= end) {  // one vector left
      VF best = hn::Set(df, -HUGE_VALF);
      for (int r = 0; r < n_rows; ++r) best = hn::Max(best, RowDot(rows + size_t(r) * size_t(d), d, kt, ld, i));
      hn::StoreU(hn::Mul(best, s), df, out + i);
      break;
    }
    VF best_a = hn::Set(df, -HUGE_VALF), best_b = best_a;
    for (int r = 0; r < n_rows; ++r) {
      VF a, b;
      RowScores2(rows + size_t(r) * size_t(d), d, kt, ld, i, a, b);
      best_a = hn::Max(best_a, a);
      best_b = hn::Max(best_b, b);
    }
    hn::StoreU(hn::Mul(best_a, s), df, out + i);
    hn::StoreU(hn::Mul(best_b, s), df, out + i + lanes);
  }
}

// A page's keys as f32 vectors: Load(df, c, i) is channel c of the tokens
// [i, i + lanes), widened exactly as read_keys_t widens them.
template <DType kT>  // f32, f16, bf16: K^T rows of ld elements
struct PageKeys {
  const void* k_t;
  size_t ld;
  HWY_INLINE VF Load(DF df, int c, size_t i) const { return LoadWidened<kT>(df, k_t, size_t(c) * ld + i); }
};

// q8_0: code times its group's scale in f32, an exact product, as
// read_keys_t dequantizes. Token i's codes of channels c - c % 4 .. are one
// int32 lane; byte c % 4 is channel c's.
struct Q8PageKeys {
  const int8_t* codes;
  const uint16_t* scales;
  int block_size;
  HWY_INLINE VF Load(DF df, int c, size_t i) const {
    const hn::RebindToSigned<DF> di;
    const int quad = c % kvstore::kQ8KeyQuad;
    const auto* lanes = reinterpret_cast<const int32_t*>(codes + kvstore::q8_key_code_offset(block_size, c - quad, 0));
    const auto code = hn::ShiftRightSame(hn::ShiftLeftSame(hn::LoadU(di, lanes + i), 24 - 8 * quad), 24);
    const VF scale = LoadWidened<DType::kF16>(df, scales, size_t(c / kvstore::kQ8Group) * size_t(block_size) + i);
    return hn::Mul(hn::ConvertTo(df, code), scale);
  }
};

// The largest over the rows of their dot products with V vectors of tokens
// from `first`: V independent sums per row, so that consecutive
// multiply-adds do not wait on each other, each over the channels in order.
template <class Keys, int V>
HWY_INLINE void PageMaxScores(const float* rows, int n_rows, int d, const Keys& keys, size_t first, float* out) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF best[V];
  for (VF& b : best) b = hn::Set(df, -HUGE_VALF);
  for (int r = 0; r < n_rows; ++r) {
    const float* row = rows + size_t(r) * size_t(d);
    VF acc[V];
    for (VF& a : acc) a = hn::Zero(df);
    for (int c = 0; c < d; ++c) {
      const VF qc = hn::Set(df, row[c]);
      for (int v = 0; v < V; ++v) acc[v] = hn::MulAdd(qc, keys.Load(df, c, first + size_t(v) * lanes), acc[v]);
    }
    for (int v = 0; v < V; ++v) best[v] = hn::Max(best[v], acc[v]);
  }
  for (int v = 0; v < V; ++v) hn::StoreU(best[v], df, out + size_t(v) * lanes);
}

// 128 tokens at a time where there are (eight vectors of 16 lanes, sixteen
// of 8): a block's channel rows are then read whole and in order. Half as
// many, two passes down the rows, took 1.45x the time with the keys in DRAM
// on 16 lanes and 1.3-1.4x on 8 (the 128K window at 32/8 x 128, f16, Zen 4,
// its AVX-512 and AVX2 code); sixteen accumulators on AVX2's 16 registers
// spill, and still ran faster.
template <class Keys>
void PageTokens(const float* rows, int n_rows, int d, const Keys& keys, int first, int n, float* out) {
  const size_t lanes = hn::Lanes(DF());
  size_t i = 0;
  if (lanes <= 8)
    for (; i + 16 * lanes <= size_t(n); i += 16 * lanes)
      PageMaxScores<Keys, 16>(rows, n_rows, d, keys, size_t(first) + i, out + i);
  for (; i + 8 * lanes <= size_t(n); i += 8 * lanes)
    PageMaxScores<Keys, 8>(rows, n_rows, d, keys, size_t(first) + i, out + i);
  for (; i + 4 * lanes <= size_t(n); i += 4 * lanes)
    PageMaxScores<Keys, 4>(rows, n_rows, d, keys, size_t(first) + i, out + i);
  for (; i < size_t(n); i += lanes) PageMaxScores<Keys, 1>(rows, n_rows, d, keys, size_t(first) + i, out + i);
}

void ScorePageTokens(const float* rows, int n_rows, int d, const kvstore::BlockView& page, DType type, int block_size,
                     int first, int n, float* out) {
  const size_t ld = size_t(block_size);
  switch (type) {
    case DType::kF32: return PageTokens(rows, n_rows, d, PageKeys<DType::kF32>{page.k_t, ld}, first, n, out);
    case DType::kF16: return PageTokens(rows, n_rows, d, PageKeys<DType::kF16>{page.k_t, ld}, first, n, out);
    case DType::kBF16: return PageTokens(rows, n_rows, d, PageKeys<DType::kBF16>{page.k_t, ld}, first, n, out);
    case DType::kQ8_0: {
      const Q8PageKeys keys{reinterpret_cast<const int8_t*>(page.k_t), page.k_scales, block_size};
      return PageTokens(rows, n_rows, d, keys, first, n, out);
    }
  }
}

void RowScoresT(const float* rows, int n_rows, int d, const float* kt, size_t ld, int n, float scale, float* out) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const VF s = hn::Set(df, scale);
  const size_t end = size_t(padded_tokens(n));  // <= ld, a multiple of lanes
  int r = 0;
  // Four rows at a time: four independent sums share each load of the keys.
  for (; r + 4 <= n_rows; r += 4) {
    const float* q = rows + size_t(r) * size_t(d);
    for (size_t i = 0; i < end; i += lanes) {
      VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
      for (int c = 0; c < d; ++c) {
        const VF k = hn::LoadU(df, kt + size_t(c) * ld + i);
        a0 = hn::MulAdd(hn::Set(df, q[c]), k, a0);
        a1 = hn::MulAdd(hn::Set(df, q[d + c]), k, a1);
        a2 = hn::MulAdd(hn::Set(df, q[2 * d + c]), k, a2);
        a3 = hn::MulAdd(hn::Set(df, q[3 * d + c]), k, a3);
      }
      float* to = out + size_t(r) * ld + i;
      hn::StoreU(hn::Mul(a0, s), df, to);
      hn::StoreU(hn::Mul(a1, s), df, to + ld);
      hn::StoreU(hn::Mul(a2, s), df, to + 2 * ld);
      hn::StoreU(hn::Mul(a3, s), df, to + 3 * ld);
    }
  }
  for (; r < n_rows; ++r)
    for (size_t i = 0; i < end; i += lanes)
      hn::StoreU(hn::Mul(RowDot(rows + size_t(r) * size_t(d), d, kt, ld, i), s), df, out + size_t(r) * ld + i);
}

// exp(x), NaN for NaN as std::exp gives: Highway's Exp gives 0 for NaN (it
// zeroes what lies below -104), which would hide a NaN score.
HWY_INLINE VF ExpKeepingNaN(VF x) {
  const DF df;
  return hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(df, x));
}

double SumExp(const float* x, int64_t n, float factor, float shift) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const VF f = hn::Set(df, factor), s = hn::Set(df, shift);
  double sum = 0.0;
  int64_t i = 0;
  for (; i + int64_t(lanes) <= n; i += int64_t(lanes))
    sum += double(hn::GetLane(hn::SumOfLanes(df, ExpKeepingNaN(hn::MulSub(hn::LoadU(df, x + i), f, s)))));
  for (; i < n; ++i) sum += std::exp(double(std::fma(x[i], factor, -shift)));
  return sum;
}

void AddExp(const float* x, int64_t n, float shift, float factor, float* acc) {
  const DF df;
  const int64_t lanes = int64_t(hn::Lanes(df));
  const VF f = hn::Set(df, factor), s = hn::Set(df, shift);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::MulAdd(ExpKeepingNaN(hn::Sub(hn::LoadU(df, x + i), s)), f, hn::LoadU(df, acc + i)), df, acc + i);
  for (; i < n; ++i) acc[i] += std::exp(x[i] - shift) * factor;
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::policy::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::policy::detail {

HWY_EXPORT(ScoreTokensT);
HWY_EXPORT(RowScoresT);
HWY_EXPORT(ScorePageTokens);
HWY_EXPORT(SumExp);
HWY_EXPORT(AddExp);

void score_tokens_t(const float* rows, int n_rows, int d, const float* kt, size_t ld, int n, float scale, float* out) {
  HWY_DYNAMIC_DISPATCH(ScoreTokensT)(rows, n_rows, d, kt, ld, n, scale, out);
}

void score_page_tokens(const float* rows, int n_rows, int d, const kvstore::BlockView& page, DType type, int block_size,
                       int first, int n, float* out) {
  if (n % kTokenPad != 0)
    fail(ErrorCode::kInternal, "score_page_tokens: ", n, " tokens, not a multiple of ", kTokenPad);
  HWY_DYNAMIC_DISPATCH(ScorePageTokens)(rows, n_rows, d, page, type, block_size, first, n, out);
}

void row_scores_t(const float* rows, int n_rows, int d, const float* kt, size_t ld, int n, float scale, float* out) {
  HWY_DYNAMIC_DISPATCH(RowScoresT)(rows, n_rows, d, kt, ld, n, scale, out);
}

void add_exp(const float* x, int64_t n, float shift, float factor, float* acc) {
  HWY_DYNAMIC_DISPATCH(AddExp)(x, n, shift, factor, acc);
}

double sum_exp(const float* x, int64_t n, float factor, float shift) {
  return HWY_DYNAMIC_DISPATCH(SumExp)(x, n, factor, shift);
}

}  // namespace longctx::policy::detail
#endif  // HWY_ONCE
