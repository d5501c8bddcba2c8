// Peaks of this CPU measured in the same run as the kernels they bound: fp32
// FMA and bf16 vdpbf16ps throughput (the loops of cpu/peak_loops.h), so GEMM
// rates can be quoted as a share of what the cores can do, and read
// bandwidth on Highway's best vector target, so memory-bound kernels can be
// quoted as a share of what DRAM delivers.

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include "bench_util.h"
#include "longctx/core/huge_pages.h"
#include "longctx/cpu/peak_loops.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "peak_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of words [0, n) (n a multiple of 4 vectors) in full-width vector loads:
// narrower loads cannot keep enough lines in flight (a 2-core Xeon read 11 GB/s
// with 8-byte loads, 20 with 64-byte ones).
uint64_t SumWords(const uint64_t* words, size_t n) {
  const hn::ScalableTag<uint64_t> d;
  const size_t lanes = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;  // independent chains
  for (size_t i = 0; i < n; i += 4 * lanes) {
    a0 = hn::Add(a0, hn::LoadU(d, words + i));
    a1 = hn::Add(a1, hn::LoadU(d, words + i + lanes));
    a2 = hn::Add(a2, hn::LoadU(d, words + i + 2 * lanes));
    a3 = hn::Add(a3, hn::LoadU(d, words + i + 3 * lanes));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::bench {
HWY_EXPORT(SumWords);

double measure_fma_gflops(int threads) {
  return measure_parallel_rate(threads, [](int) { return cpu::fma_peak_loop(int64_t(20) << 20); });
}

double measure_bf16_gflops(int threads) {
  return measure_parallel_rate(threads, [](int) { return cpu::vdpbf16ps_peak_loop(int64_t(10) << 20); });
}

double measure_read_gbps(size_t bytes, int threads, int reps) {
  constexpr size_t kSliceAlign = 64;  // words: whole vectors of every target, 4 at a time
  const size_t words = bytes / sizeof(uint64_t) / kSliceAlign * kSliceAlign;
  // On huge pages, as the KV blocks, representatives and weights it bounds
  // are (BlockPool, CpuBackend): a 2-core Zen 5 read 48 GB/s through 4 KiB
  // pages and 70 through 2 MiB ones, so a probe on 4 KiB pages put dense
  // decode at 1.25x "the bandwidth".
  void* memory = allocate_on_huge_pages(words * sizeof(uint64_t));
  if (memory == nullptr) throw std::bad_alloc();
  const std::unique_ptr<void, void (*)(void*)> owned(memory, std::free);
  auto* data = static_cast<uint64_t*>(memory);
  for (size_t i = 0; i < words; ++i) data[i] = i;
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
  const size_t slice = (words / kSliceAlign + threads - 1) / threads * kSliceAlign;
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  auto read = [&] {
    tbb::parallel_for(0, threads, [&](int t) {
      const size_t begin = std::min(words, size_t(t) * slice), end = std::min(words, begin + slice);
      sums[size_t(t)] = HWY_DYNAMIC_DISPATCH(SumWords)(data + begin, end - begin);
    });
  };
  read();
  const double seconds = median(time_runs(reps, read));
  volatile uint64_t sink = sums[0];  // keep the sums alive
  (void)sink;
  return double(words * sizeof(uint64_t)) / seconds / 1e9;
}

}  // namespace longctx::bench
#endif
