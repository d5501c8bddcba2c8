// q8_0 quantization of appended keys and values (block_page.h), vectorized
// with Highway and dispatched at run time to the best target of this CPU.
// Every target gives the bits of the rule in kv_store.h: the division x / s
// and round-to-nearest-even (Round, as nearbyint in the default rounding
// mode) are those of the scalar code, and the scale goes through the same
// scalar f16 conversion, once per group. Scalar, a call to nearbyintf per
// value made a q8_0 store append 12x slower than an f16 one.
#include <cfloat>

#include "block_page.h"

// foreach_target.h re-includes this file once per target, looked up through
// the include directories: kvstore/include/../src is this folder.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/q8_quant_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::kvstore::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most a group's values per vector, so that a vector lies in one group.
using DF = hn::CappedTag<float, kQ8Group>;

// The largest |x| of n values (n a multiple of the lanes).
HWY_INLINE float AbsMax(const float* x, size_t n) {
  const DF df;
  auto top = hn::Zero(df);
  for (size_t i = 0; i < n; i += hn::Lanes(df)) top = hn::Max(top, hn::Abs(hn::LoadU(df, x + i)));
  return hn::GetLane(hn::MaxOfLanes(df, top));
}

void QuantizeQ8Groups(const float* x, size_t n_groups, int8_t* codes, uint16_t* scales, float* deq) {
  const DF df;
  const hn::Rebind<int32_t, DF> di32;
  const hn::Rebind<int8_t, DF> di8;
  const size_t lanes = hn::Lanes(df);
  const auto lo = hn::Set(df, -127.f), hi = hn::Set(df, 127.f);
  for (size_t g = 0; g < n_groups; ++g, x += kQ8Group, codes += kQ8Group) {
    const uint16_t bits = q8_scale_bits(AbsMax(x, kQ8Group));
    scales[g] = bits;
    const float s = f16_bits_to_f32(bits);
    for (size_t i = 0; i < kQ8Group; i += lanes) {
      const auto q = s > 0.f ? hn::Min(hn::Max(hn::Round(hn::Div(hn::LoadU(df, x + i), hn::Set(df, s))), lo), hi)
                             : hn::Zero(df);
      const auto q32 = hn::ConvertTo(di32, q);
      hn::StoreU(hn::DemoteTo(di8, q32), di8, codes + i);
      // as read back: an int8 has no -0
      if (deq != nullptr) hn::StoreU(hn::Mul(hn::ConvertTo(df, q32), hn::Set(df, s)), df, deq + i);
    }
    if (deq != nullptr) deq += kQ8Group;
  }
}

bool Q8RowStorable(const float* row, int head_dim) {
  const DF df;
  const auto limit = hn::Set(df, FLT_MAX);
  auto top = hn::Zero(df);
  auto finite = hn::Le(top, limit);  // all true
  for (size_t i = 0; i < size_t(head_dim); i += hn::Lanes(df)) {
    const auto a = hn::Abs(hn::LoadU(df, row + i));
    finite = hn::And(finite, hn::Le(a, limit));  // NaN compares false
    top = hn::Max(top, a);
  }
  if (!hn::AllTrue(df, finite)) return false;
  // Every group's scale is finite when the row's largest one is.
  return q8_scale_fits(hn::GetLane(hn::MaxOfLanes(df, top)));
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::kvstore::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::kvstore::detail {

HWY_EXPORT(QuantizeQ8Groups);
HWY_EXPORT(Q8RowStorable);

void quantize_q8_groups(const float* x, size_t n_groups, int8_t* codes, uint16_t* scales, float* deq) {
  HWY_DYNAMIC_DISPATCH(QuantizeQ8Groups)(x, n_groups, codes, scales, deq);
}

bool q8_row_storable(const float* row, int head_dim) { return HWY_DYNAMIC_DISPATCH(Q8RowStorable)(row, head_dim); }

}  // namespace longctx::kvstore::detail
#endif  // HWY_ONCE
