// The bf16 dot-product peak of this CPU: chains of AVX512-BF16's vdpbf16ps
// on 512-bit vectors (16 lanes, each adding two bf16 products to an f32
// accumulator), the instruction oneDNN's bf16 matmul runs on CPUs with
// AVX512-BF16 and no AMX (AMD Zen 4/5). The AMX tile peak is not measured
// here. The function carries its ISA as a target attribute and runs only
// where cpu_features() says the CPU has it.

#include <vector>

#include "bench_util.h"
#include "longctx/core/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace longctx::bench {
namespace {

constexpr int kChains = 12;  // independent accumulators: cover the instruction's latency on two pipes

#if defined(__x86_64__)
// Multiply-adds done: 32 bf16 products per instruction and chain.
__attribute__((target("avx512f,avx512bf16"))) double dpbf16_loop(int64_t iters, float* sink) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0 in bf16
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3c00);  // 2^-7: sums stay exact and finite
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(float(j));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  __m512 total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm512_add_ps(total, acc[j]);
  float lanes[16];
  _mm512_storeu_ps(lanes, total);
  *sink = lanes[0];
  return double(iters) * kChains * 32;
}
#endif

}  // namespace

double measure_bf16_gflops(int threads) {
#if defined(__x86_64__)
  if (!cpu_features().avx512bf16) return 0;
  std::vector<float> sinks(static_cast<size_t>(threads));
  // 2 FLOP (multiply, add) per bf16 product.
  return measure_parallel_rate(threads, [&](int t) { return 2 * dpbf16_loop(int64_t(10) << 20, &sinks[size_t(t)]); });
#else
  (void)threads;
  return 0;
#endif
}

}  // namespace longctx::bench
