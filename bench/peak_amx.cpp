// The AMX bf16 peak of this CPU: chains of tdpbf16ps on tiles that stay in
// the tile registers (four 16 x 16 f32 accumulators, each instruction 16 x 16
// x 32 bf16 products), the unit the amx prefill kernel runs its products on.
// The function carries its ISA as a target attribute and runs only where
// cpu_features() says AMX bf16 is usable (the tile permission granted).

#include <cstdint>
#include <vector>

#include "bench_util.h"
#include "longctx/core/cpu_features.h"
#include "longctx/cpu/prefill_attention_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace longctx::bench {
namespace {

#if defined(__x86_64__)
// Multiply-adds done: 16 x 16 x 32 per instruction, four accumulators.
__attribute__((target("amx-tile,amx-bf16"))) double tdpbf16_loop(int64_t iters, float* sink) {
  alignas(64) static const uint16_t zeros[16 * 32] = {};  // the sums stay 0
  alignas(64) float out[16 * 16];
  cpu::detail::amx_configure_tiles();  // 16 x 64 bytes each
  _tile_zero(0);  // tile numbers are immediates
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  asm volatile("" ::: "memory");
  cpu::detail::amx_release_tiles();
  *sink = out[0];
  return double(iters) * 4 * 16 * 16 * 32;
}
#endif

}  // namespace

double measure_amx_bf16_gflops(int threads) {
#if defined(__x86_64__)
  if (!cpu_features().amx_bf16) return 0;
  std::vector<float> sinks(static_cast<size_t>(threads));
  // 2 FLOP (multiply, add) per bf16 product.
  return measure_parallel_rate(threads, [&](int t) { return 2 * tdpbf16_loop(int64_t(1) << 20, &sinks[size_t(t)]); });
#else
  (void)threads;
  return 0;
#endif
}

}  // namespace longctx::bench
