// Vectors of f32 from elements stored as f32, f16 or bf16 (exact widening),
// for the Highway kernels that read the KV store's keys, values and q8_0
// scales or a weight row: decode attention, block and token scoring and the
// decode matmul.
//
// Include after hwy/highway.h, outside any namespace, in a file compiled per
// target (foreach_target.h).
#if defined(LONGCTX_CORE_WIDEN_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LONGCTX_CORE_WIDEN_HWY_INL_H_
#undef LONGCTX_CORE_WIDEN_HWY_INL_H_
#else
#define LONGCTX_CORE_WIDEN_HWY_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"
#include "longctx/core/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::HWY_NAMESPACE {

// Elements [i, i + Lanes(d)) of an array of kT (f32, f16 or bf16), widened to f32.
template <DType kT, class D>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<D> LoadWidened(D d, const void* elements, size_t i) {
  namespace hn = hwy::HWY_NAMESPACE;
  static_assert(kT == DType::kF32 || kT == DType::kF16 || kT == DType::kBF16);
  if constexpr (kT == DType::kF32) {
    return hn::LoadU(d, static_cast<const float*>(elements) + i);
  } else if constexpr (kT == DType::kF16) {
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::float16_t*>(elements) + i));
  } else {
    const hn::Rebind<hwy::bfloat16_t, D> db;
    return hn::PromoteTo(d, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(elements) + i));
  }
}

}  // namespace longctx::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LONGCTX_CORE_WIDEN_HWY_INL_H_
