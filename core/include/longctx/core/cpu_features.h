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
  bool avx512dq = false;  // vreduceps and the other AVX512DQ instructions
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool avx512fp16 = false;
  bool avx512vnni = false;  // vpdpbusd on zmm and (with avx512vl) ymm
  bool avx_vnni = false;    // the VEX-encoded vpdpbusd (Alder Lake, Sapphire Rapids, Zen 5)
  // AMX tiles with bf16 and int8 dot products: the CPU has them, the OS saves
  // the tile state, and Linux granted this process the tile data permission
  // (arch_prctl(ARCH_REQ_XCOMP_PERM), requested once by cpu_features()).
  bool amx_bf16 = false;
  bool amx_int8 = false;
  std::string brand;  // e.g. "AMD EPYC 7B13"
};

// Features usable by user code: the CPU has them and the OS saves their
// registers. Detected once; the first call also asks Linux for AMX permission.
const CpuFeatures& cpu_features();

// Why AMX is not usable here ("the CPU has no AMX", "Linux refused the tile
// data permission: ..."), or "" when it is.
const std::string& amx_unusable_reason();

// "avx2 fma f16c" style list of the flags that are present.
std::string describe_cpu_features(const CpuFeatures& features);

// Name of the best Highway target compiled in and supported here, e.g. "AVX2", "AVX3".
std::string highway_target_name();

}  // namespace longctx
