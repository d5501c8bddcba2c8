// Loops of independent multiply-add chains that keep one core's vector units
// at their peak. longctx-bench quotes its kernels against them, and the
// prefill kernel choice compares two of them on the core it runs on
// (vdpbf16ps_over_fma in prefill_attention.h).
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

}  // namespace longctx::cpu
