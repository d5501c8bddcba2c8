#include "longctx/core/cpu_features.h"

#include <cstring>
#include <utility>

#include "hwy/targets.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace longctx {
namespace {

struct Detected {
  CpuFeatures features;
  std::string amx_why;
};

#if defined(__x86_64__) || defined(__i386__)

struct CpuidResult {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

// Zeros when the leaf is beyond the CPU's maximum.
CpuidResult cpuid(uint32_t leaf, uint32_t subleaf) {
  CpuidResult r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return CpuidResult{};
  return r;
}

bool bit(uint32_t reg, int index) { return ((reg >> index) & 1) != 0; }

// XCR0: which register states the OS saves on context switch. Only valid
// when CPUID reports OSXSAVE.
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

std::string brand_string() {
  uint32_t max_extended = 0, unused = 0;
  __cpuid(0x80000000, max_extended, unused, unused, unused);
  if (max_extended < 0x80000004) return "";
  char text[49] = {};
  for (uint32_t i = 0; i < 3; ++i) {
    const CpuidResult r = cpuid(0x80000002 + i, 0);
    const uint32_t regs[4] = {r.eax, r.ebx, r.ecx, r.edx};
    std::memcpy(text + 16 * i, regs, 16);
  }
  std::string brand(text);  // stops at the first NUL
  const size_t first = brand.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return brand.substr(first, brand.find_last_not_of(' ') - first + 1);
}

// Linux hands out the AMX tile data state (XFEATURE 18) only on request.
bool request_amx_permission(std::string* why) {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return true;
  *why = std::string("Linux refused the AMX tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM): ") +
         std::strerror(errno);
  return false;
#else
  *why = "AMX needs Linux on x86-64";
  return false;
#endif
}

Detected detect() {
  Detected out;
  CpuFeatures& f = out.features;
  f.brand = brand_string();
  const CpuidResult leaf1 = cpuid(1, 0);
  const bool osxsave = bit(leaf1.ecx, 27);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_saves_ymm = (xcr0 & 0x6) == 0x6;     // SSE + AVX state
  const bool os_saves_zmm = (xcr0 & 0xE6) == 0xE6;   // + opmask, ZMM0-15 upper, ZMM16-31
  const bool os_saves_tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  const bool avx = bit(leaf1.ecx, 28) && os_saves_ymm;
  out.amx_why = "the CPU has no AMX";
  if (!avx) return out;  // every flag below needs the YMM state

  const CpuidResult leaf7 = cpuid(7, 0);
  const CpuidResult leaf7_1 = leaf7.eax >= 1 ? cpuid(7, 1) : CpuidResult{};
  f.fma = bit(leaf1.ecx, 12);
  f.f16c = bit(leaf1.ecx, 29);
  f.avx2 = bit(leaf7.ebx, 5);
  f.avx_vnni = bit(leaf7_1.eax, 4);
  const bool amx_tile = bit(leaf7.edx, 24);
  if (amx_tile) {
    if (!os_saves_tiles) out.amx_why = "the OS does not enable the AMX tile state (XCR0)";
    else if (request_amx_permission(&out.amx_why)) out.amx_why.clear();
  }
  if (out.amx_why.empty()) {
    f.amx_bf16 = bit(leaf7.edx, 22);
    f.amx_int8 = bit(leaf7.edx, 25);
  }
  f.avx512f = bit(leaf7.ebx, 16) && os_saves_zmm;
  if (!f.avx512f) return out;
  f.avx512dq = bit(leaf7.ebx, 17);
  f.avx512bw = bit(leaf7.ebx, 30);
  f.avx512vl = bit(leaf7.ebx, 31);
  f.avx512vnni = bit(leaf7.ecx, 11);
  f.avx512fp16 = bit(leaf7.edx, 23);
  f.avx512bf16 = bit(leaf7_1.eax, 5);
  return out;
}

#else  // not x86: none of these flags exist

Detected detect() { return {CpuFeatures{}, "AMX needs an x86-64 CPU"}; }

#endif

const Detected& detected() {
  static const Detected once = detect();
  return once;
}

}  // namespace

const CpuFeatures& cpu_features() { return detected().features; }
const std::string& amx_unusable_reason() { return detected().amx_why; }

std::string describe_cpu_features(const CpuFeatures& features) {
  const std::pair<bool, const char*> flags[] = {
      {features.avx2, "avx2"},           {features.fma, "fma"},
      {features.f16c, "f16c"},           {features.avx512f, "avx512f"},
      {features.avx512dq, "avx512dq"},   {features.avx512bw, "avx512bw"},   {features.avx512vl, "avx512vl"},
      {features.avx512bf16, "avx512bf16"}, {features.avx512fp16, "avx512fp16"},
      {features.avx512vnni, "avx512vnni"}, {features.avx_vnni, "avx_vnni"},
      {features.amx_bf16, "amx_bf16"},     {features.amx_int8, "amx_int8"},
  };
  std::string text;
  for (const auto& [present, name] : flags) {
    if (!present) continue;
    if (!text.empty()) text += ' ';
    text += name;
  }
  return text.empty() ? "(none)" : text;
}

// The lowest set bit of a Highway target mask is the best target.
std::string highway_target_name() {
  const int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(usable & -usable);
}

}  // namespace longctx
