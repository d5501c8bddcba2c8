// Loops of independent multiply-add chains that keep one core's vector units
// at their peak. longctx-bench quotes its kernels against them, and the auto
// choices between bf16 and f32 products (prefill attention, matmuls) compare
// two of them on the core they run on.
#pragma once

#include <cstdint>

namespace longctx::cpu {

// `iters` rounds of 12 chains of f32 FMAs on Highway's best target (enough
// chains to cover the latency of two FMA pipes); returns the floating-point
// operations done, 2 per multiply-add.
double fma_peak_loop(int64_t iters);

// `iters` rounds of 12 chains of AVX512-BF16's vdpbf16ps on 512-bit vectors
// (16 lanes, each adding two bf16 products to an f32 sum); returns the
// floating-point operations done, 2 per product, or 0 where the CPU lacks
// AVX512-BF16.
double vdpbf16ps_peak_loop(int64_t iters);

// vdpbf16ps' multiply-add rate over the f32 FMA's, measured once per process
// on the calling thread (about 2 ms); 0 where the CPU lacks AVX512-BF16.
double vdpbf16ps_over_fma();

// vdpbf16ps adds twice an FMA's products per instruction, but not every CPU
// issues it as often: a Zen 4 ran it at 1.9x the FMA's rate, a Xeon (Emerald
// Rapids) whose VM hides AMX at 0.5x. Below this ratio the auto choices keep
// f32 products, which are then about as fast or faster, and exact to f32.
constexpr double kBf16MinOverFma = 1.25;

// Whether bf16 products outrun f32 ones here: AMX bf16 tiles are usable, or
// vdpbf16ps_over_fma() >= kBf16MinOverFma.
bool bf16_outruns_fma();

}  // namespace longctx::cpu
