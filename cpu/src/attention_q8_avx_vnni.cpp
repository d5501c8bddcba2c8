// attention_q8_x86.h's q8_0 scores on AVX-VNNI (the VEX-encoded vpdpbusd:
// Alder Lake and later Intel client CPUs, Sapphire Rapids, Zen 5), which sums
// a lane's four products of unsigned by signed bytes into int32 in one
// instruction. As in the AVX512-VNNI kernel, the key codes go in with their
// sign bit flipped (k + 128), the query codes as they are, and each group's
// sum starts at -128 * (sum of the query codes), so it ends at the exact
// integer sum of q * k.
#include "attention_q8_x86.h"

namespace longctx::cpu::detail {
namespace {

struct AvxVnniDot {
  static __m256i keys(__m256i codes) { return _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80))); }
  static __m256i start(int32_t q_code_sum) { return _mm256_set1_epi32(-128 * q_code_sum); }
  // In asm because GCC 12 copies the sum of every _mm256_dpbusd_avx_epi32 in
  // and out of a spare register (two moves per product). {vex}: the EVEX
  // form would need AVX512-VL, which the CPUs this kernel is for lack.
  static void add(__m256i& sum, __m256i keys, __m256i, __m256i q) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(sum) : "x"(keys), "x"(q));
  }
};

}  // namespace

void score_q8_avx_vnni(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                       int score_stride, LinePrefetch& prefetch) {
  score_q8_x86<AvxVnniDot>(args, k_t, k_scales, n, scores, score_stride, prefetch);
}

}  // namespace longctx::cpu::detail
