// The activation quantizer of quant_matmul.h (and its 16-bit twin, which
// block scoring of q8_0 stores codes its query with), vectorized with Highway and
// dispatched at run time to the best target of this CPU. Every target gives
// the bits of the scalar rule: d = absmax / 127, q = the nearest integer (ties
// to even, as lrint in the default rounding mode) of x * (127 / absmax), 0
// where absmax is below the smallest normal f32.
// Scalar, a call to lrint per value cost ~5 ns: about 2% of a decode step,
// whose every matmul quantizes its activation row.
#include <cfloat>
#include <cmath>
#include <limits>

#include "quant_dot.h"

// foreach_target.h re-includes this file once per target; the path is looked
// up through the include directories (cpu/include/../src is this folder).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/quant_acts_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::cpu::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 32 lanes, so that a vector lies in one block (32 or 256 values).
using DF = hn::CappedTag<float, 32>;

// The rule for codes of type Code (max code 127 or 32767).
template <typename Code>
void QuantizeBlocks(const float* x, int64_t n_blocks, int64_t block, Code* q, float* d) {
  constexpr float kMaxCode = float(std::numeric_limits<Code>::max());
  const DF df;
  const hn::Rebind<Code, DF> dq;
  const size_t lanes = hn::Lanes(df);
  const auto limit = hn::Set(df, HUGE_VALF);
  for (int64_t b = 0; b < n_blocks; ++b, x += block, q += block) {
    auto top = hn::Zero(df);
    auto finite = hn::Lt(top, limit);  // all true
    for (size_t i = 0; i < size_t(block); i += lanes) {
      const auto a = hn::Abs(hn::LoadU(df, x + i));
      finite = hn::And(finite, hn::Lt(a, limit));  // NaN compares false
      top = hn::Max(top, a);
    }
    if (!hn::AllTrue(df, finite)) {  // d = NaN, so the products that read the block are NaN
      for (int64_t i = 0; i < block; ++i) q[i] = 0;
      d[b] = NAN;
      continue;
    }
    const float amax = hn::GetLane(hn::MaxOfLanes(df, top));
    d[b] = amax / kMaxCode;
    // Below the smallest normal f32, kMaxCode / amax can overflow to Inf (and
    // a zero times Inf gave code -128): such a block, like a zero one, gets 0.
    const auto inverse = hn::Set(df, amax >= FLT_MIN ? kMaxCode / amax : 0.f);
    for (size_t i = 0; i < size_t(block); i += lanes) {
      // |x * inverse| <= kMaxCode (1 + 2^-23): the demotion never saturates.
      hn::StoreU(hn::DemoteTo(dq, hn::NearestInt(hn::Mul(hn::LoadU(df, x + i), inverse))), dq, q + i);
    }
  }
}

void QuantizeActBlocks(const float* x, int64_t n_blocks, int64_t block, int8_t* q, float* d) {
  QuantizeBlocks(x, n_blocks, block, q, d);
}

void QuantizeActBlocks16(const float* x, int64_t n_blocks, int64_t block, int16_t* q, float* d) {
  QuantizeBlocks(x, n_blocks, block, q, d);
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::cpu::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::cpu::detail {

HWY_EXPORT(QuantizeActBlocks);
HWY_EXPORT(QuantizeActBlocks16);

void quantize_act_blocks(const float* x, int64_t n_blocks, int64_t block, int8_t* q, float* d) {
  HWY_DYNAMIC_DISPATCH(QuantizeActBlocks)(x, n_blocks, block, q, d);
}

void quantize_act_blocks(const float* x, int64_t n_blocks, int64_t block, int16_t* q, float* d) {
  HWY_DYNAMIC_DISPATCH(QuantizeActBlocks16)(x, n_blocks, block, q, d);
}

}  // namespace longctx::cpu::detail
#endif  // HWY_ONCE
