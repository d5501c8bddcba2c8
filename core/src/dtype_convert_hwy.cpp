// Bulk dtype conversion (convert() of dtype.h), vectorized with Highway and
// dispatched at run time to the best target of this CPU. Every target gives
// the same bits as the scalar functions of dtype.cpp:
// - f16 on AVX2/AVX-512 uses the hardware (vcvtph2ps / vcvtps2ph with
//   round-to-nearest-even), which quiets NaNs exactly as the scalar code does;
// - f16 on other targets and bf16 everywhere use integer lane operations,
//   because Highway 1.0.3's emulated f16 and its bf16 DemoteTo truncate.
#include <cstring>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"

// foreach_target.h re-includes this file once per target. The path is looked
// up through the include directories; core/include/../src is this folder.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/dtype_convert_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF32 = hn::ScalableTag<float>;
using DU32 = hn::RebindToUnsigned<DF32>;
using DI32 = hn::RebindToSigned<DF32>;
using DU16 = hn::Rebind<uint16_t, DF32>;  // as many 16-bit lanes as a vector has f32 lanes
using VF32 = hn::Vec<DF32>;
using VU32 = hn::Vec<DU32>;
using VU16 = hn::Vec<DU16>;

// Signed compare of u32 lanes that hold values below 2^31.
HWY_INLINE hn::Mask<DU32> Below(VU32 a, uint32_t b) {
  const DU32 du;
  const DI32 di;
  return hn::RebindMask(du, hn::Lt(hn::BitCast(di, a), hn::Set(di, static_cast<int32_t>(b))));
}

// u32 lanes holding values < 2^16 -> u16 lanes.
HWY_INLINE VU16 NarrowToU16(VU32 v) {
  return hn::DemoteTo(DU16(), hn::BitCast(DI32(), v));
}

HWY_INLINE VF32 F16ToF32(VU16 half) {
  const DF32 df;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return hn::PromoteTo(df, hn::BitCast(hn::Rebind<hwy::float16_t, DF32>(), half));
#else
  const DU32 du;
  const VU32 bits = hn::PromoteTo(du, half);
  const VU32 sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000)));
  // Exponent and mantissa moved to their f32 positions, exponent still biased by 15.
  const VU32 shifted = hn::ShiftLeft<13>(hn::And(bits, hn::Set(du, 0x7FFF)));
  const VU32 normal = hn::Add(shifted, hn::Set(du, 112u << 23));
  const VU32 nan_quiet_bit =
      hn::IfThenElseZero(hn::Not(Below(shifted, 0x0F800001)), hn::Set(du, 0x400000));
  const VU32 inf_nan = hn::Or(hn::Or(shifted, hn::Set(du, 0x7F800000)), nan_quiet_bit);
  // Subnormal or zero: mantissa * 2^-24, exact in f32.
  const VF32 subnormal = hn::Mul(hn::ConvertTo(df, hn::BitCast(DI32(), hn::ShiftRight<13>(shifted))),
                                 hn::Set(df, 0x1p-24f));
  VU32 magnitude = hn::IfThenElse(Below(shifted, 0x00800000), hn::BitCast(du, subnormal), normal);
  magnitude = hn::IfThenElse(Below(shifted, 0x0F800000), magnitude, inf_nan);
  return hn::BitCast(df, hn::Or(sign, magnitude));
#endif
}

HWY_INLINE VU16 F32ToF16(VF32 v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return hn::BitCast(DU16(), hn::DemoteTo(hn::Rebind<hwy::float16_t, DF32>(), v));
#else
  const DF32 df;
  const DU32 du;
  const VU32 bits = hn::BitCast(du, v);
  const VU32 sign = hn::ShiftRight<16>(hn::And(bits, hn::Set(du, 0x80000000u)));
  const VU32 magnitude = hn::And(bits, hn::Set(du, 0x7FFFFFFF));
  // Normal: round the 13 dropped bits to nearest even, rebias 127 -> 15.
  const VU32 round_bias = hn::Add(hn::Set(du, 0xFFF), hn::And(hn::ShiftRight<13>(magnitude), hn::Set(du, 1)));
  const VU32 normal = hn::ShiftRight<13>(hn::Sub(hn::Add(magnitude, round_bias), hn::Set(du, 112u << 23)));
  // Subnormal: adding 0.5 (ulp 2^-24) makes the FPU round to a multiple of 2^-24.
  const VF32 shifted_half = hn::Add(hn::BitCast(df, magnitude), hn::Set(df, 0.5f));
  const VU32 subnormal = hn::Sub(hn::BitCast(du, shifted_half), hn::Set(du, 0x3F000000));
  const VU32 nan = hn::Or(hn::Set(du, 0x7E00), hn::And(hn::ShiftRight<13>(magnitude), hn::Set(du, 0x3FF)));

  VU32 result = hn::IfThenElse(Below(magnitude, 0x38800000), subnormal, normal);
  result = hn::IfThenElse(Below(magnitude, 0x477FF000), result, hn::Set(du, 0x7C00));  // >= 65520: Inf
  result = hn::IfThenElse(Below(magnitude, 0x7F800001), result, nan);
  return NarrowToU16(hn::Or(sign, result));
#endif
}

HWY_INLINE VF32 BF16ToF32(VU16 half) {
  const DU32 du;
  return hn::BitCast(DF32(), hn::ShiftLeft<16>(hn::PromoteTo(du, half)));
}

HWY_INLINE VU16 F32ToBF16(VF32 v) {
  const DU32 du;
  const VU32 bits = hn::BitCast(du, v);
  const VU32 round_bias = hn::Add(hn::Set(du, 0x7FFF), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1)));
  const VU32 rounded = hn::ShiftRight<16>(hn::Add(bits, round_bias));
  const VU32 nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x0040));
  const VU32 magnitude = hn::And(bits, hn::Set(du, 0x7FFFFFFF));
  return NarrowToU16(hn::IfThenElse(Below(magnitude, 0x7F800001), rounded, nan));
}

template <DType kSrc>
HWY_INLINE VF32 LoadAsF32(const void* src, size_t i) {
  if constexpr (kSrc == DType::kF32) {
    return hn::LoadU(DF32(), static_cast<const float*>(src) + i);
  } else {
    const VU16 half = hn::LoadU(DU16(), static_cast<const uint16_t*>(src) + i);
    return kSrc == DType::kF16 ? F16ToF32(half) : BF16ToF32(half);
  }
}

template <DType kDst>
HWY_INLINE void StoreFromF32(VF32 v, void* dst, size_t i) {
  if constexpr (kDst == DType::kF32) {
    hn::StoreU(v, DF32(), static_cast<float*>(dst) + i);
  } else {
    const VU16 half = kDst == DType::kF16 ? F32ToF16(v) : F32ToBF16(v);
    hn::StoreU(half, DU16(), static_cast<uint16_t*>(dst) + i);
  }
}

template <DType kSrc, DType kDst>
void ConvertLoop(const void* src, void* dst, size_t n) {
  const size_t lanes = hn::Lanes(DF32());
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) StoreFromF32<kDst>(LoadAsF32<kSrc>(src, i), dst, i);
  for (; i < n; ++i) store_from_f32(dst, kDst, i, load_as_f32(src, kSrc, i));  // the tail
}

// Conversions between two different dtypes.
void ConvertBetween(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  using enum DType;
  if (src_dtype == kF32 && dst_dtype == kF16) return ConvertLoop<kF32, kF16>(src, dst, n);
  if (src_dtype == kF32 && dst_dtype == kBF16) return ConvertLoop<kF32, kBF16>(src, dst, n);
  if (src_dtype == kF16 && dst_dtype == kF32) return ConvertLoop<kF16, kF32>(src, dst, n);
  if (src_dtype == kF16 && dst_dtype == kBF16) return ConvertLoop<kF16, kBF16>(src, dst, n);
  if (src_dtype == kBF16 && dst_dtype == kF32) return ConvertLoop<kBF16, kF32>(src, dst, n);
  if (src_dtype == kBF16 && dst_dtype == kF16) return ConvertLoop<kBF16, kF16>(src, dst, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx {

HWY_EXPORT(ConvertBetween);

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  const size_t src_bytes = n * dtype_size(src_dtype);  // dtype_size rejects invalid dtypes
  const size_t dst_bytes = n * dtype_size(dst_dtype);
  if (n == 0) return;
  if (src == nullptr || dst == nullptr) {
    fail(ErrorCode::kInvalidArgument, "convert: null ", src == nullptr ? "source" : "destination",
         " pointer for ", n, " elements");
  }
  if (src == dst && src_dtype == dst_dtype) return;
  const auto src_begin = reinterpret_cast<uintptr_t>(src);
  const auto dst_begin = reinterpret_cast<uintptr_t>(dst);
  if (src_begin < dst_begin + dst_bytes && dst_begin < src_begin + src_bytes) {
    fail(ErrorCode::kInvalidArgument, "convert: source (", dtype_name(src_dtype), ", ", n,
         " elements) and destination (", dtype_name(dst_dtype), ") overlap");
  }
  // The same dtype is a copy of the bits (NaN payloads included).
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, src_bytes);
    return;
  }
  HWY_DYNAMIC_DISPATCH(ConvertBetween)(src, src_dtype, dst, dst_dtype, n);
}

}  // namespace longctx
#endif  // HWY_ONCE
