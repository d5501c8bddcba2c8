// quant_dot_x86.h for AVX-VNNI: the VEX-encoded vpdpbusd sums four byte
// products into int32 in one instruction.
#include <immintrin.h>

namespace longctx::cpu::detail {
namespace {
inline __m256i add_dot_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
constexpr bool kExactByteDots = true;
}  // namespace
}  // namespace longctx::cpu::detail

#define LONGCTX_QDOT_ENTRY quant_rows_avx_vnni
#define LONGCTX_QDOT8_ENTRY quant_rows8_avx_vnni
#include "quant_dot_x86.h"
