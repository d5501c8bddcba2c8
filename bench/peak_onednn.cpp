// The bf16 matmul rate of oneDNN as the onednn prefill kernel uses it: each
// thread multiplies its own 512 x 1024 by 1024 x 512 bf16 matrices into f32
// through gemm_bf16_onednn (one OpenMP thread per call, oneTBB's threads side
// by side). Where the CPU has AMX that is oneDNN's AMX tile kernel (the AMX
// tiles' own peak is peak_amx.cpp's); elsewhere its AVX512-BF16 kernel. 0
// where oneDNN has no bf16 matmul.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
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

std::vector<Record> onednn_tile_pieces(int threads) {
  std::vector<Record> rows;
  if (!cpu::prefill_kernel_unsupported_reason(cpu::PrefillKernel::kOnednn).empty()) return rows;
  constexpr size_t kCalls = 64;
  // One piece: per thread, kCalls calls of `call` on its own buffers; flops per call (0: not a product).
  auto piece = [&](const std::string& name, size_t m, size_t n, size_t k, double flops,
                   const std::function<void(std::vector<uint16_t>&, std::vector<uint16_t>&, std::vector<float>&)>& call) {
    std::vector<std::vector<uint16_t>> a(size_t(threads), std::vector<uint16_t>(m * std::max(n, k), 0x3c00));
    std::vector<std::vector<uint16_t>> b(size_t(threads), std::vector<uint16_t>(k * n, 0x3c00));
    std::vector<std::vector<float>> c(size_t(threads), std::vector<float>(m * std::max(n, k), 0.5f));
    const double calls_per_ns = measure_parallel_rate(threads, [&](int t) {
      for (size_t i = 0; i < kCalls; ++i) call(a[size_t(t)], b[size_t(t)], c[size_t(t)]);
      return double(kCalls);
    });
    const double us = double(threads) / (calls_per_ns * 1e9) * 1e6;  // one thread's call, all threads busy
    Record r;
    r.set("bench", "kernels").set("kernel", "onednn_tile").set("piece", name).set("m", int64_t(m));
    r.set("n", int64_t(n)).set("k", int64_t(k)).set("threads", threads).set("us_per_call", us);
    if (flops > 0) r.set("gflops_per_thread", flops / us / 1e3);
    rows.push_back(r);
  };
  for (const auto& [m, n, k] : {std::tuple<size_t, size_t, size_t>{512, 128, 128}, {512, 512, 128}, {512, 128, 512},
                                {256, 128, 128}, {1024, 128, 128}})
    piece("matmul", m, n, k, 2.0 * double(m * n * k), [m = m, n = n, k = k](auto& a, auto& b, auto& c) {
      cpu::detail::gemm_bf16_onednn(m, n, k, a.data(), k, b.data(), n, c.data(), n);
    });
  // The softmax step and P's rounding of one 512 x 128 tile, as the onednn kernel runs them.
  std::vector<int> valid(512, 128);
  piece("softmax_step", 512, 128, 0, 0, [&valid](auto&, auto&, auto& c) {
    thread_local std::vector<float> m(512, 0.f), l(512, 1.f), o(512 * 128, 0.f);
    cpu::detail::softmax_step(512, 128, valid.data(), c.data(), 128, m.data(), l.data(), o.data(), 128, 128);
  });
  piece("round_bf16", 512, 128, 0, 0, [](auto& a, auto&, auto& c) {
    cpu::detail::round_rows_bf16(512, 128, c.data(), 128, a.data(), 128);
  });
  return rows;
}

}  // namespace longctx::bench
