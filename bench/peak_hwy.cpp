// Peak arithmetic of this CPU measured in the same run as the kernels it
// bounds: fp32 FMA throughput (Highway, the best vector target), so GEMM
// rates can be quoted as a share of what the cores can do.

#include <vector>

#include "bench_util.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "peak_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// `iters` rounds of 12 independent FMA chains (enough to cover the latency
// of two FMA pipes); returns the flops done.
double FmaLoop(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V a = hn::Set(d, 0.999f), b = hn::Set(d, 0.001f);
  V acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = hn::Set(d, float(j));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) acc[j] = hn::MulAdd(acc[j], a, b);
  V total = acc[0];
  for (int j = 1; j < 12; ++j) total = hn::Add(total, acc[j]);
  *sink = hn::GetLane(total);
  return double(iters) * 12 * 2 * double(hn::Lanes(d));
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::bench {
HWY_EXPORT(FmaLoop);

double measure_fma_gflops(int threads) {
  std::vector<float> sinks(static_cast<size_t>(threads));
  return measure_parallel_rate(
      threads, [&](int t) { return HWY_DYNAMIC_DISPATCH(FmaLoop)(int64_t(20) << 20, &sinks[size_t(t)]); });
}

}  // namespace longctx::bench
#endif
