// Which prefill attention kernel runs where: every Highway target this CPU
// runs is tested; bf16 exactly where the CPU has AVX512-BF16, amx where AMX
// is usable, onednn where oneDNN has a bf16 matmul of its own, each refused
// with the reason
// elsewhere; the default (auto) order; and the onednn kernel giving the
// caller its OpenMP thread count back. Their results are checked against the
// fp64 reference in prefill_attention_test.cpp, over every kernel listed here.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/error.h"
#include "longctx/cpu/peak_loops.h"
#include "longctx/cpu/prefill_attention.h"
#include "prefill_fixture.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

using namespace prefill_testing;

// What the bf16 kernel needs (its file's compile flags), and the amx kernel
// beside AMX bf16 tiles: the amx kernel runs the bf16 file's softmax step.
bool has_bf16_kernel_isa(const CpuFeatures& f) {
  return f.avx512bf16 && f.avx512dq && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

// Running `kernel` on a small case throws Error(kUnsupported) mentioning `needle`.
void expect_refused(PrefillKernel kernel, const std::string& needle) {
  PrefillCase c;
  std::mt19937 rng(test_seed(9));
  auto t = make_store(c, c.n_tokens());
  fill_random(*t->store, c.n_tokens(), rng);
  Buffers b(c, rng);
  try {
    run_prefill(*t->store, 0, b, 0.f, kernel);
    ADD_FAILURE() << "the " << prefill_kernel_name(kernel) << " kernel ran where it is unsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PrefillAttention, TestsRunEveryTargetThisCpuSupports) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  auto has = [&](int64_t t) { return std::find(targets.begin(), targets.end(), t) != targets.end(); };
  EXPECT_TRUE(has(HWY_SCALAR) || has(HWY_EMU128));
  for (int64_t t : {HWY_SSE4, HWY_AVX2, HWY_AVX3}) {
    if (hwy::SupportedTargets() & t) {
      EXPECT_TRUE(has(t)) << hwy::TargetName(t);
    }
  }
}

// bf16 runs exactly where the CPU has AVX512-BF16, and is then the default
// unless AMX is usable (then our AMX kernel is) or vdpbf16ps is too slow here
// (AutoTakesBf16OnlyWhereVdpbf16psOutrunsTheFma).
TEST(PrefillAttention, Bf16KernelRunsWhereTheCpuHasAvx512Bf16) {
  const CpuFeatures& f = cpu_features();
  const bool expected = has_bf16_kernel_isa(f);
  const std::vector<PrefillKernel> kernels = supported_prefill_kernels();
  const bool amx = !kernels.empty() && kernels.front() == PrefillKernel::kAmx;
  EXPECT_EQ(amx, (f.amx_bf16 || amx_tiles_emulated()) && has_bf16_kernel_isa(f)) << describe_cpu_features(f);
  EXPECT_EQ(kernels.back(), PrefillKernel::kF32);
  EXPECT_EQ(expected, std::find(kernels.begin(), kernels.end(), PrefillKernel::kBf16) != kernels.end());
  EXPECT_EQ(expected && !amx, kernels.front() == PrefillKernel::kBf16) << describe_cpu_features(f);
  if (kernels.front() != PrefillKernel::kBf16) {
    EXPECT_EQ(best_prefill_kernel(), kernels.front());
  }
  if (!expected) {
    expect_refused(PrefillKernel::kBf16, "AVX512-BF16");
    GTEST_SKIP() << prefill_kernel_unsupported_reason(PrefillKernel::kBf16);
  }
}

// The peak loops report the operations they do: 12 chains of one vector
// each per round, 2 per multiply-add (an FMA lane does one, a vdpbf16ps lane
// two); vdpbf16ps' loop does nothing where the CPU lacks AVX512-BF16.
TEST(PrefillAttention, PeakLoopsCountTheirOperations) {
  const double lanes = fma_peak_loop(3) / (3 * 12 * 2);  // f32 lanes of Highway's target: SSE4 to AVX-512
  EXPECT_TRUE(lanes == 4 || lanes == 8 || lanes == 16) << lanes;
  EXPECT_EQ(fma_peak_loop(7), 7 * 12 * 2 * lanes);
  EXPECT_EQ(fma_peak_loop(0), 0.0);
  EXPECT_EQ(vdpbf16ps_peak_loop(3), cpu_features().avx512bf16 ? 3.0 * 12 * 16 * 2 * 2 : 0.0);
}

// Without AMX, auto takes the bf16 kernel only where this core runs
// vdpbf16ps at 1.25x the FMA's rate or more (a Zen 4: 1.9x; a Xeon whose AMX
// its VM hides: 0.46x, where the bf16 kernel took 1.6x the f32 time).
TEST(PrefillAttention, AutoTakesBf16OnlyWhereVdpbf16psOutrunsTheFma) {
  const double ratio = vdpbf16ps_over_fma();
  EXPECT_EQ(vdpbf16ps_over_fma(), ratio) << "measured once";
  EXPECT_EQ(bf16_outruns_fma(), cpu_features().amx_bf16 || ratio >= kBf16MinOverFma);
  if (!cpu_features().avx512bf16) {
    EXPECT_EQ(ratio, 0.0);
    EXPECT_NE(best_prefill_kernel(), PrefillKernel::kBf16);
    GTEST_SKIP() << "the CPU (" << cpu_features().brand << ") has no AVX512-BF16: no vdpbf16ps to measure";
  }
  // One instruction adds 2x an FMA's products; no core issues it 4x as often or 1/20.
  EXPECT_GT(ratio, 0.1);
  EXPECT_LT(ratio, 8.0);
  const std::vector<PrefillKernel> kernels = supported_prefill_kernels();
  if (kernels.front() == PrefillKernel::kBf16) {
    EXPECT_EQ(best_prefill_kernel(), ratio >= kBf16MinOverFma ? PrefillKernel::kBf16 : PrefillKernel::kF32) << ratio;
  } else {
    EXPECT_EQ(best_prefill_kernel(), kernels.front());
  }
  EXPECT_EQ(prefill_kernel_for(PrefillKernelChoice::kAuto), best_prefill_kernel());
  std::printf("vdpbf16ps at %.2fx the FMA rate on this core (%s); auto = %s\n", ratio, cpu_features().brand.c_str(),
              prefill_kernel_name(best_prefill_kernel()));
}

// amx runs exactly where AMX bf16 tiles are usable (the CPU has them and
// Linux granted the tile permission) beside AVX512-BF16, and is then the
// default; every test that runs supported_prefill_kernels() then checks it
// against the bf16 reference.
TEST(PrefillAttention, AmxKernelRunsWhereAmxIsUsable) {
  const CpuFeatures& f = cpu_features();
  const std::vector<PrefillKernel> kernels = supported_prefill_kernels();
  const bool listed = std::find(kernels.begin(), kernels.end(), PrefillKernel::kAmx) != kernels.end();
  EXPECT_EQ(listed, (f.amx_bf16 || amx_tiles_emulated()) && has_bf16_kernel_isa(f)) << describe_cpu_features(f);
  EXPECT_EQ(listed, prefill_kernel_unsupported_reason(PrefillKernel::kAmx).empty());
  if (listed) {
    EXPECT_EQ(kernels.front(), PrefillKernel::kAmx);
    EXPECT_EQ(prefill_kernel_for(PrefillKernelChoice::kAmx), PrefillKernel::kAmx);
    return;
  }
  expect_refused(PrefillKernel::kAmx, "AMX");
  try {
    prefill_kernel_for(PrefillKernelChoice::kAmx);
    ADD_FAILURE() << "prefill_kernel: amx accepted where AMX is not usable";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig);
    EXPECT_NE(std::string(e.what()).find("prefill_kernel: amx"), std::string::npos) << e.what();
  }
  GTEST_SKIP() << prefill_kernel_unsupported_reason(PrefillKernel::kAmx);
}

// onednn runs where oneDNN has a bf16 matmul of its own (AVX-512 bf16 or AMX),
// and comes right after amx where AMX is usable; every test that runs
// supported_prefill_kernels() then checks it against the bf16 reference.
TEST(PrefillAttention, OnednnKernelRunsWhereOnednnHasBf16) {
  const std::vector<PrefillKernel> kernels = supported_prefill_kernels();
  const bool listed = std::find(kernels.begin(), kernels.end(), PrefillKernel::kOnednn) != kernels.end();
  const std::string why = prefill_kernel_unsupported_reason(PrefillKernel::kOnednn);
  EXPECT_EQ(listed, why.empty()) << why;
  const bool amx = cpu_features().amx_bf16 && has_bf16_kernel_isa(cpu_features());
  if (amx && why.empty()) {
    ASSERT_GT(kernels.size(), 1u);
    EXPECT_EQ(kernels[1], PrefillKernel::kOnednn);
  } else {
    EXPECT_NE(kernels.front(), PrefillKernel::kOnednn);
  }
  if (listed) {
    EXPECT_NE(prefill_kernel_engine(PrefillKernel::kOnednn).find("oneDNN "), std::string::npos);
    EXPECT_EQ(prefill_kernel_engine(PrefillKernel::kOnednn).find("ref"), std::string::npos);
    return;
  }
  expect_refused(PrefillKernel::kOnednn, "bf16 matmul");
  GTEST_SKIP() << why;
}

// The onednn kernel runs each oneDNN call on one OpenMP thread, and gives the
// calling thread its OpenMP thread count back: the CPU backend's matmuls,
// called later from the same thread, run on every core.
TEST(PrefillAttention, OnednnKernelLeavesTheCallersOpenMpThreadCount) {
  const std::string why = prefill_kernel_unsupported_reason(PrefillKernel::kOnednn);
  if (!why.empty()) GTEST_SKIP() << why;
  const int before = omp_get_max_threads();
  omp_set_num_threads(before + 3);
  PrefillCase c;
  std::mt19937 rng(test_seed(11));
  auto t = make_store(c, c.n_tokens());
  fill_random(*t->store, c.n_tokens(), rng);
  Buffers b(c, rng);
  run_prefill(*t->store, c.history, b, 0.f, PrefillKernel::kOnednn);
  EXPECT_EQ(omp_get_max_threads(), before + 3);
  omp_set_num_threads(before);
}

}  // namespace
}  // namespace longctx::cpu
