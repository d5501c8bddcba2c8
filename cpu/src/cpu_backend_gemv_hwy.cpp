// Highway kernel for matmuls of a few rows (decode): y[r, o] = dot(x[r], w[o])
// reading each weight row once for up to four rows of x, f32 accumulation,
// f16 / bf16 weights widened in registers. Memory-bound, so it runs at the speed
// the weights stream in; oneDNN's brgemm would repack the transposed weights
// on every call for these shapes (measured 2-3x slower at m = 1).
#include <algorithm>

#include "cpu_backend_internal.h"
#include "quant_dot.h"

// foreach_target.h re-includes this file once per target; the path is looked
// up through the include directories (cpu/include/../src is this folder).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/cpu_backend_gemv_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "longctx/core/widen_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::cpu::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using longctx::HWY_NAMESPACE::LoadWidened;

using DF32 = hn::ScalableTag<float>;
using VF32 = hn::Vec<DF32>;

// out[q * ldy] = dot(x + q * k, row) for kQ rows of x; two accumulators each
// so that the FMA latency does not bind.
template <DType kT, int kQ>
HWY_INLINE void Dots(const float* x, const void* row, size_t k, float* out, size_t ldy) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  VF32 even[kQ], odd[kQ];
  for (int q = 0; q < kQ; ++q) even[q] = odd[q] = hn::Zero(df);
  size_t i = 0;
  const auto* bytes = static_cast<const char*>(row);
  const size_t step_bytes = 2 * lanes * dtype_size(kT);
  for (; i + 2 * lanes <= k; i += 2 * lanes) {
    // Ahead of the reads, as the quantized kernels do (quant_dot.h): the
    // hardware prefetchers alone left f16 rows at 0.65-0.75 of the read bandwidth.
    for (size_t line = 0; line < step_bytes; line += 64) {
      hwy::Prefetch(bytes + i * dtype_size(kT) + kWeightPrefetchAhead + line);
    }
    const VF32 w0 = LoadWidened<kT>(df, row, i);
    const VF32 w1 = LoadWidened<kT>(df, row, i + lanes);
#pragma GCC unroll 4
    for (int q = 0; q < kQ; ++q) {
      even[q] = hn::MulAdd(hn::LoadU(df, x + q * k + i), w0, even[q]);
      odd[q] = hn::MulAdd(hn::LoadU(df, x + q * k + i + lanes), w1, odd[q]);
    }
  }
  float sums[kQ];
  for (int q = 0; q < kQ; ++q) sums[q] = hn::GetLane(hn::SumOfLanes(df, hn::Add(even[q], odd[q])));
  for (; i < k; ++i) {
    const float w = load_as_f32(row, kT, i);
    for (int q = 0; q < kQ; ++q) sums[q] += x[q * k + i] * w;
  }
  for (int q = 0; q < kQ; ++q) out[q * ldy] = sums[q];
}

template <DType kT>
void GemvOf(const GemvRun& run) {
  const size_t k = size_t(run.k);
  const size_t row_bytes = k * dtype_size(kT);
  for (int64_t r0 = 0; r0 < run.m; r0 += kGemvMaxRows) {
    const float* x = run.x + size_t(r0) * k;
    float* y = run.y + size_t(r0 * run.ldy);
    const int pass = int(std::min<int64_t>(kGemvMaxRows, run.m - r0));
    for (int64_t o = run.o_begin; o < run.o_end; ++o) {
      const void* row = static_cast<const std::byte*>(run.w) + size_t(o) * row_bytes;
      switch (pass) {
        case 1:
          Dots<kT, 1>(x, row, k, y + o, size_t(run.ldy));
          break;
        case 2:
          Dots<kT, 2>(x, row, k, y + o, size_t(run.ldy));
          break;
        case 3:
          Dots<kT, 3>(x, row, k, y + o, size_t(run.ldy));
          break;
        default:
          Dots<kT, 4>(x, row, k, y + o, size_t(run.ldy));
          break;
      }
    }
  }
}

void Gemv(const GemvRun& run) {
  if (run.w_dtype == DType::kF32) return GemvOf<DType::kF32>(run);
  if (run.w_dtype == DType::kF16) return GemvOf<DType::kF16>(run);
  return GemvOf<DType::kBF16>(run);
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::cpu::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::cpu::detail {
HWY_EXPORT(Gemv);
void gemv(const GemvRun& run) { HWY_DYNAMIC_DISPATCH(Gemv)(run); }
}  // namespace longctx::cpu::detail
#endif  // HWY_ONCE
