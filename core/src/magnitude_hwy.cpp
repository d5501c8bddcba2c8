// first_magnitude_above (dtype.h), vectorized with Highway and dispatched at
// run time: it reads the values once as bit patterns, with no conversion
// (the KV store's append checks every appended value with it; a per-row
// conversion to f32 made an f16 store append 3.5x slower).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "longctx/core/dtype.h"

// foreach_target.h re-includes this file once per target, looked up through
// the include directories: core/include/../src is this folder.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/magnitude_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The first of n values at x whose bits, the sign cleared, exceed `limit`,
// or -1. With the sign cleared the patterns are non-negative as signed
// integers, and they order as the magnitudes do (NaN above Inf above every
// finite value). x need not be aligned (a snapshot's blocks sit at any
// offset of the file): vectors load unaligned, single values by memcpy.
template <class Bits>
int64_t FirstAbove(const std::byte* x, size_t n, Bits limit) {
  const hn::ScalableTag<Bits> d;
  const size_t lanes = hn::Lanes(d);
  const Bits magnitude = std::numeric_limits<Bits>::max();  // all bits but the sign
  const auto mask = hn::Set(d, magnitude), top = hn::Set(d, limit);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto bits = hn::LoadU(d, reinterpret_cast<const Bits*>(x + i * sizeof(Bits)));  // unaligned is fine
    if (!hn::AllFalse(d, hn::Gt(hn::And(bits, mask), top))) break;
  }
  for (; i < n; ++i) {  // the vector that has one, or the tail
    Bits bits;
    std::memcpy(&bits, x + i * sizeof(Bits), sizeof bits);
    if (Bits(bits & magnitude) > limit) return int64_t(i);
  }
  return -1;
}

int64_t FirstMagnitudeAbove(const void* x, DType dtype, size_t n, uint32_t limit) {
  const auto* bytes = static_cast<const std::byte*>(x);
  if (dtype == DType::kF32) return FirstAbove(bytes, n, int32_t(limit));
  return FirstAbove(bytes, n, int16_t(limit));  // f16, bf16
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx {

HWY_EXPORT(FirstMagnitudeAbove);

int64_t first_magnitude_above(const void* data, DType dtype, size_t n, uint32_t limit) {
  dtype_size(dtype);  // refuses q8_0, which has no elements
  return HWY_DYNAMIC_DISPATCH(FirstMagnitudeAbove)(data, dtype, n, limit);
}

namespace {
uint32_t largest_finite_bits(DType dtype) {
  return dtype == DType::kF32 ? 0x7f7fffffu : dtype == DType::kF16 ? 0x7bffu : 0x7f7fu;
}
}  // namespace

int64_t first_non_finite(const void* data, DType dtype, size_t n) {
  return first_magnitude_above(data, dtype, n, largest_finite_bits(dtype));
}

int64_t first_nan(const void* data, DType dtype, size_t n) {
  return first_magnitude_above(data, dtype, n, largest_finite_bits(dtype) + 1);  // above Inf
}

}  // namespace longctx
#endif  // HWY_ONCE
