// The int8 dot-product peak of this CPU, measured in the same run as the
// quantized matmuls it bounds: chains of the instructions their kernels are
// built on (cpu/quant_dot_x86.h), vpmaddubsw + vpmaddwd on AVX2 and vpdpbusd
// where the CPU has VNNI, on 256-bit vectors like the kernels, and on
// 512-bit ones with AVX-512 VNNI, as its groups of 16 rows (512-bit
// vpdpbusd did 1.7-2.3x the products per second of 256-bit ones on a Xeon
// EMR; Zen 4 splits it in two halves, so there it measures about the same). Functions
// carry their ISA as a target attribute and run only where cpu_features()
// says the CPU has it.

#include <vector>

#include "bench_util.h"
#include "longctx/core/cpu_features.h"
#include "longctx/cpu/quant_matmul.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace longctx::bench {
namespace {

constexpr int kChains = 10;  // independent accumulators: cover the latency of two multiply pipes

#if defined(__x86_64__)
// Multiply-adds done: 32 byte products per instruction pair and chain.
__attribute__((target("avx2"))) double maddubs_loop(int64_t iters, int* sink) {
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  __m256i acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_epi32(j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
  __m256i total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm256_add_epi32(total, acc[j]);
  *sink = _mm256_extract_epi32(total, 0);
  return double(iters) * kChains * 32;
}

__attribute__((target("avx2,avxvnni"))) double dpbusd_avx_loop(int64_t iters, int* sink) {
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
  __m256i acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_epi32(j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_dpbusd_avx_epi32(acc[j], u, s);
  __m256i total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm256_add_epi32(total, acc[j]);
  *sink = _mm256_extract_epi32(total, 0);
  return double(iters) * kChains * 32;
}

__attribute__((target("avx2,avx512f,avx512bw,avx512vnni"))) double dpbusd_zmm_loop(int64_t iters, int* sink) {
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  __m512i acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_epi32(j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], u, s);
  __m512i total = acc[0];
  for (int j = 1; j < kChains; ++j) total = _mm512_add_epi32(total, acc[j]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, total);
  *sink = lanes[0];
  return double(iters) * kChains * 64;
}
#endif

}  // namespace

double measure_int8_gops(int threads) {
#if defined(__x86_64__)
  using Loop = double (*)(int64_t, int*);
  Loop loop = nullptr;
  switch (cpu::best_quant_isa()) {
    case cpu::QuantIsa::kAvx512Vnni: loop = dpbusd_zmm_loop; break;
    case cpu::QuantIsa::kAvxVnni: loop = dpbusd_avx_loop; break;
    case cpu::QuantIsa::kAvx2: loop = maddubs_loop; break;
    case cpu::QuantIsa::kGeneric: return 0;
  }
  std::vector<int> sinks(static_cast<size_t>(threads));
  // 2 operations (multiply, add) per byte product.
  return measure_parallel_rate(threads, [&](int t) { return 2 * loop(int64_t(10) << 20, &sinks[size_t(t)]); });
#else
  (void)threads;
  return 0;
#endif
}

}  // namespace longctx::bench
