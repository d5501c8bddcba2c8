// attention_q8_x86.h's q8_0 scores on AVX-VNNI (the VEX-encoded vpdpbusd:
// Alder Lake and later Intel client CPUs, Sapphire Rapids, Zen 5), which sums
// a lane's four products of unsigned by signed bytes into int32 in one
// instruction. As in the AVX512-VNNI kernel, the key codes go in with their
// sign bit flipped (k + 128), the query codes as they are, and each group's
// sum starts at -128 * (sum of the query codes), so it ends at the exact
// integer sum of q * k.
//
// P.V as in the AVX512-VNNI kernel: each quad's four 16-bit weights go in as
// their low bytes in one sum and their high bytes in another, unsigned, the V
// codes as they are; high * 256 + low is the exact integer sum.
#include "attention_q8_x86.h"

namespace longctx::cpu::detail {
namespace {

struct AvxVnniDot {
  static __m256i keys(__m256i codes) { return _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80))); }
  static __m256i start(int32_t q_code_sum) { return _mm256_set1_epi32(-128 * q_code_sum); }
  // In asm because GCC 12 copies the sum of every _mm256_dpbusd_avx_epi32 in
  // and out of a spare register (two moves per product). {vex}: the EVEX
  // form would need AVX512-VL, which the CPUs this kernel is for lack.
  static void dot(__m256i& sum, __m256i unsigned_bytes, __m256i signed_bytes) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(sum) : "x"(unsigned_bytes), "x"(signed_bytes));
  }
  static void add(__m256i& sum, __m256i keys, __m256i, __m256i q) { dot(sum, keys, q); }

  struct Values {
    __m256i codes;  // 8 channels' codes of four tokens, a channel to a lane
  };
  struct Sums {
    __m256i high, low;
  };
  static Values values(const int8_t* row, Values&) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row))};
  }
  static void weigh(Sums& sums, const Values& v, const uint8_t* quad) {
    int32_t low, high;
    std::memcpy(&low, quad, sizeof(low));
    std::memcpy(&high, quad + sizeof(low), sizeof(high));
    dot(sums.high, _mm256_set1_epi32(high), v.codes);
    dot(sums.low, _mm256_set1_epi32(low), v.codes);
  }
  static __m256i total(const Sums& sums, const Values&) {
    return _mm256_add_epi32(_mm256_slli_epi32(sums.high, 8), sums.low);
  }
  static __m128i pack(__m256i codes) {
    // Per 128-bit lane (a quad's 32-bit codes): bytes 0, 4, 8, 12, then 1, 5, 9, 13.
    const __m256i split = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                           0, 4, 8, 12, 1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(codes, split), 0x08));
  }
};

}  // namespace

void score_q8_avx_vnni(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                       int score_stride, LinePrefetch& prefetch) {
  score_q8_x86<AvxVnniDot>(args, k_t, k_scales, n, scores, score_stride, prefetch);
}

void accumulate_q8_avx_vnni(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                            const uint16_t* v_scales, float* acc, LinePrefetch& prefetch) {
  accumulate_q8_x86<AvxVnniDot>(args, p, p_stride, n, lead, v, v_scales, acc, prefetch);
}

}  // namespace longctx::cpu::detail
