// CPU feature detection (cpuid + the OS's xgetbv state), for dispatch reports
// and `longctx-info`. Kernels dispatch through Highway; this tells the user
// what the machine offers and which path Highway will take.
#pragma once

#include <string>

namespace longctx {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool avx512fp16 = false;
  std::string brand;  // e.g. "AMD EPYC 7B13"
};

// Features usable by user code: the CPU has them and the OS saves their registers.
const CpuFeatures& cpu_features();

// "avx2 fma f16c" style list of the flags that are present.
std::string describe_cpu_features(const CpuFeatures& features);

// Name of the best Highway target compiled in and supported here, e.g. "AVX2", "AVX3".
std::string highway_target_name();

}  // namespace longctx
