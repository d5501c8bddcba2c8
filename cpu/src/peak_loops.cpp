// The multiply-add peak loops of peak_loops.h. The FMA loop runs on
// Highway's best target; the vdpbf16ps loop carries its ISA as a target
// attribute and runs only where cpu_features() says the CPU has it.

#include "longctx/cpu/peak_loops.h"

#include <algorithm>
#include <chrono>

#include "longctx/core/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/peak_loops.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kChains = 12;

double FmaLoop(int64_t iters) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V a = hn::Set(d, 0.999f), b = hn::Set(d, 0.001f);
  V acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = hn::Set(d, float(j));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = hn::MulAdd(acc[j], a, b);
  V total = acc[0];
  for (int j = 1; j < kChains; ++j) total = hn::Add(total, acc[j]);
  volatile float keep = hn::GetLane(total);  // the chains are not dead code
  (void)keep;
  return double(iters) * kChains * 2 * double(hn::Lanes(d));
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::cpu {
namespace {

#if defined(__x86_64__)
constexpr int kBf16Chains = 12;

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_loop(int64_t iters) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0 in bf16
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3c00);  // 2^-7: sums stay exact and finite
  __m512 acc[kBf16Chains];
  for (int j = 0; j < kBf16Chains; ++j) acc[j] = _mm512_set1_ps(float(j));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kBf16Chains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  __m512 total = acc[0];
  for (int j = 1; j < kBf16Chains; ++j) total = _mm512_add_ps(total, acc[j]);
  volatile float keep = _mm512_cvtss_f32(total);  // the chains are not dead code
  (void)keep;
  return double(iters) * kBf16Chains * 32 * 2;
}
#endif

}  // namespace

HWY_EXPORT(FmaLoop);

double fma_peak_loop(int64_t iters) { return HWY_DYNAMIC_DISPATCH(FmaLoop)(iters); }

double vdpbf16ps_peak_loop(int64_t iters) {
#if defined(__x86_64__)
  if (cpu_features().avx512bf16) return dpbf16_loop(iters);
#endif
  (void)iters;
  return 0;
}

namespace {
// Floating-point operations per second of one peak loop on this thread.
double peak_rate(double (*loop)(int64_t), int64_t iters) {
  const auto start = std::chrono::steady_clock::now();
  const double flops = loop(iters);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  return seconds.count() > 0 ? flops / seconds.count() : 0;
}
}  // namespace

double vdpbf16ps_over_fma() {
  static const double ratio = [] {
    if (!cpu_features().avx512bf16) return 0.0;
    // The best of 5 interleaved rounds of each (0.1-0.3 ms a round): a
    // preempted round or the cores' slow start on 512-bit vectors only
    // lowers a round that the others outrun.
    constexpr int64_t kIters = int64_t(1) << 15;
    double fma = 0, bf16 = 0;
    for (int round = 0; round < 5; ++round) {
      fma = std::max(fma, peak_rate(fma_peak_loop, kIters));
      bf16 = std::max(bf16, peak_rate(vdpbf16ps_peak_loop, kIters));
    }
    return fma > 0 ? bf16 / fma : 0.0;
  }();
  return ratio;
}

bool bf16_outruns_fma() { return cpu_features().amx_bf16 || vdpbf16ps_over_fma() >= kBf16MinOverFma; }

}  // namespace longctx::cpu
#endif  // HWY_ONCE
