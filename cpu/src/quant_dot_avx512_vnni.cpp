// quant_dot_x86.h for AVX-512 VNNI (with AVX512-VL): the EVEX-encoded vpdpbusd
// on ymm registers (AMD Zen 4/5 have it and no AVX-VNNI), and on zmm
// registers for weights in groups of 16 rows.
//
// GCC 12's _mm512_undefined_*() (x = x), behind the unmasked shifts and
// f16 conversions, trips -Wmaybe-uninitialized once they are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace longctx::cpu::detail {
namespace {
inline __m256i add_dot_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
constexpr bool kExactByteDots = true;
}  // namespace
}  // namespace longctx::cpu::detail

#define LONGCTX_QDOT_ENTRY quant_rows_avx512_vnni
#define LONGCTX_QDOT8_ENTRY quant_rows8_avx512_vnni
#define LONGCTX_QDOT16_ENTRY quant_rows16_avx512_vnni
#include "quant_dot_x86.h"
