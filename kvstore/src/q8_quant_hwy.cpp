// q8_0 quantization of appended keys and values, and the keys read back
// (block_page.h), vectorized with Highway and dispatched at run time to the
// best target of this CPU.
// Every target gives the bits of the rule in kv_store.h: the division x / s
// and round-to-nearest-even (Round, as nearbyint in the default rounding
// mode) are those of the scalar code, and the scale goes through the same
// scalar f16 conversion, once per group. Scalar, a call to nearbyintf per
// value made a q8_0 store append 12x slower than an f16 one.
#include <bit>
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

// A lane's byte k is channel c + k only in little-endian order (x86, the machines longctx runs on).
static_assert(std::endian::native == std::endian::little, "DequantizeQ8KeysT reads four int8 codes as one int32");

void DequantizeQ8KeysT(const int8_t* codes, const float* scales, int block_size, int t, int n, int c0, float* dst,
                       size_t ld) {
  const hn::ScalableTag<int32_t> di;
  const hn::Rebind<float, decltype(di)> df;
  const size_t lanes = hn::Lanes(di);
  for (int c = c0; c < c0 + kQ8Group; c += kQ8KeyQuad) {
    // Token t's four codes of channels c..c+3 are one int32 lane; byte k is channel c + k.
    const int8_t* quad = codes + q8_key_code_offset(block_size, c, t);
    float* out = dst + size_t(c) * ld;
    int i = 0;
    for (; i + int(lanes) <= n; i += int(lanes)) {
      // LoadU reads bytes (an unaligned vector load, or a copy on HWY_SCALAR), not an int32 lvalue.
      const auto four = hn::LoadU(di, reinterpret_cast<const int32_t*>(quad) + i);
      const auto s = hn::LoadU(df, scales + i);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<24>(four))), s), df, out + i);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<16>(four))), s), df, out + ld + i);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<8>(four))), s), df, out + 2 * ld + i);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(four)), s), df, out + 3 * ld + i);
    }
    for (; i < n; ++i)
      for (int k = 0; k < kQ8KeyQuad; ++k) out[size_t(k) * ld + size_t(i)] = float(quad[4 * i + k]) * scales[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::kvstore::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::kvstore::detail {

HWY_EXPORT(QuantizeQ8Groups);
HWY_EXPORT(Q8RowStorable);
HWY_EXPORT(DequantizeQ8KeysT);

void quantize_q8_groups(const float* x, size_t n_groups, int8_t* codes, uint16_t* scales, float* deq) {
  HWY_DYNAMIC_DISPATCH(QuantizeQ8Groups)(x, n_groups, codes, scales, deq);
}

bool q8_row_storable(const float* row, int head_dim) { return HWY_DYNAMIC_DISPATCH(Q8RowStorable)(row, head_dim); }

void dequantize_q8_keys_t(const int8_t* codes, const float* scales, int block_size, int t, int n, int c0, float* dst,
                          size_t ld) {
  HWY_DYNAMIC_DISPATCH(DequantizeQ8KeysT)(codes, scales, block_size, t, n, c0, dst, ld);
}

}  // namespace longctx::kvstore::detail
#endif  // HWY_ONCE
