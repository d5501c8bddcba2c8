#include "longctx/core/cpu_features.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace longctx {
namespace {

// The first processor's "flags" from /proc/cpuinfo (Linux fills them from
// the same cpuid leaves, masked by what the kernel enables).
struct ProcCpuInfo {
  bool found = false;
  std::set<std::string> flags;
};

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

ProcCpuInfo read_proc_cpuinfo() {
  ProcCpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "flags" && !info.found) {
      info.found = true;
      std::istringstream words(value);
      for (std::string flag; words >> flag;) info.flags.insert(flag);
    }
  }
  return info;
}

TEST(CpuFeatures, SelfConsistent) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(&f, &cpu_features()) << "detected once";
  if (f.avx512dq || f.avx512bw || f.avx512vl || f.avx512bf16 || f.avx512fp16) {
    EXPECT_TRUE(f.avx512f) << describe_cpu_features(f);
  }
}

TEST(CpuFeatures, AgreesWithProcCpuInfo) {
  const ProcCpuInfo info = read_proc_cpuinfo();
  if (!info.found) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  const CpuFeatures& f = cpu_features();
  const std::pair<bool, const char*> flags[] = {
      {f.avx2, "avx2"},         {f.fma, "fma"},           {f.f16c, "f16c"},
      {f.avx512f, "avx512f"},   {f.avx512dq, "avx512dq"}, {f.avx512bw, "avx512bw"}, {f.avx512vl, "avx512vl"},
      {f.avx512bf16, "avx512_bf16"}, {f.avx512fp16, "avx512_fp16"},
      {f.avx512vnni, "avx512_vnni"}, {f.avx_vnni, "avx_vnni"},
      {f.amx_bf16, "amx_bf16"},       {f.amx_int8, "amx_int8"},
  };
  // Linux lists a flag only when the CPU has it and the kernel enabled its
  // register state, which is exactly what cpu_features() reports.
  for (const auto& [present, name] : flags) {
    EXPECT_EQ(present, info.flags.count(name) == 1) << name;
  }
  // The brand string is not compared: a hypervisor may show /proc/cpuinfo a
  // model name ("AMD EPYC") other than the CPUID brand string.
}

TEST(CpuFeatures, AmxUsableExactlyWhenNoReason) {
  const CpuFeatures& f = cpu_features();
  const std::string& why = amx_unusable_reason();
  EXPECT_EQ(why.empty(), f.amx_bf16 || f.amx_int8) << why;
}

TEST(CpuFeatures, ThisMachineHasAvx2FmaF16c) {
  const ProcCpuInfo info = read_proc_cpuinfo();
  if (info.flags.count("avx2") == 0) GTEST_SKIP() << "/proc/cpuinfo lists no avx2";
  const CpuFeatures& f = cpu_features();
  EXPECT_TRUE(f.avx2);
  EXPECT_TRUE(f.fma);
  EXPECT_TRUE(f.f16c);
  const std::string description = describe_cpu_features(f);
  EXPECT_EQ(description.rfind("avx2 fma f16c", 0), 0u) << description;
}

TEST(CpuFeatures, DescribeListsPresentFlags) {
  CpuFeatures f;
  EXPECT_EQ(describe_cpu_features(f), "(none)");
  f.avx2 = f.fma = f.f16c = true;
  EXPECT_EQ(describe_cpu_features(f), "avx2 fma f16c");
  f.avx512f = f.avx512dq = f.avx512bw = f.avx512vl = f.avx512bf16 = f.avx512fp16 = true;
  EXPECT_EQ(describe_cpu_features(f), "avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512bf16 avx512fp16");
  CpuFeatures only_bf16;
  only_bf16.avx512bf16 = true;
  EXPECT_EQ(describe_cpu_features(only_bf16), "avx512bf16");
}

TEST(CpuFeatures, HighwayTargetIsKnown) {
  const std::string name = highway_target_name();
  const std::set<std::string> known = {"AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "EMU128", "SCALAR"};
  EXPECT_EQ(known.count(name), 1u) << name;
  const CpuFeatures& f = cpu_features();
  // Highway's AVX3 needs AVX-512 F/VL/DQ/BW; its AVX2 needs AVX2, FMA and F16C (and BMI2).
  if (name == "AVX3" || name == "AVX3_DL") {
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl);
  }
  if (name == "AVX2") {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
}

}  // namespace
}  // namespace longctx
