// quant_dot_x86.h for AVX2 (+ FMA, F16C): pairs by vpmaddubsw, then vpmaddwd
// against ones for the sums of four.
#include <immintrin.h>

namespace longctx::cpu::detail {
namespace {
inline __m256i add_dot_u8s8(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
constexpr bool kExactByteDots = false;
}  // namespace
}  // namespace longctx::cpu::detail

#define LONGCTX_QDOT_ENTRY quant_rows_avx2
#define LONGCTX_QDOT8_ENTRY quant_rows8_avx2
#include "quant_dot_x86.h"
