// The bf16 matmul rate of oneDNN as the onednn prefill kernel uses it: each
// thread multiplies its own 512 x 1024 by 1024 x 512 bf16 matrices into f32
// through gemm_bf16_onednn (one OpenMP thread per call, oneTBB's threads side
// by side). Where the CPU has AMX that is oneDNN's AMX tile kernel, the
// roofline the issue asks the AMX prefill path to reach 25% of; elsewhere
// its AVX512-BF16 kernel. 0 where oneDNN has no bf16 matmul.
#include <cstdint>
#include <vector>

#include "bench_util.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/cpu/prefill_attention_kernels.h"

namespace longctx::bench {

double measure_onednn_bf16_gflops(int threads) {
  if (!cpu::prefill_kernel_unsupported_reason(cpu::PrefillKernel::kOnednn).empty()) return 0;
  constexpr size_t kM = 512, kK = 1024, kN = 512, kCalls = 16;
  struct Operands {
    std::vector<uint16_t> a = std::vector<uint16_t>(kM * kK, 0x3c00);  // 2^-7 in bf16: sums stay finite
    std::vector<uint16_t> b = std::vector<uint16_t>(kK * kN, 0x3c00);
    std::vector<float> c = std::vector<float>(kM * kN);
  };
  std::vector<Operands> operands(static_cast<size_t>(threads));
  return measure_parallel_rate(threads, [&](int t) {
    Operands& o = operands[size_t(t)];
    for (size_t i = 0; i < kCalls; ++i)
      cpu::detail::gemm_bf16_onednn(kM, kN, kK, o.a.data(), kK, o.b.data(), kN, o.c.data(), kN);
    return 2.0 * double(kM) * double(kN) * double(kK) * double(kCalls);
  });
}

}  // namespace longctx::bench
