// attention_q8_x86.h's q8_0 scores on AVX2 (+ FMA, F16C), for CPUs without
// AVX-VNNI or AVX512-VNNI. vpmaddubsw multiplies unsigned by signed bytes
// and adds pairs into 16 bits: the keys go in as |k| and the query codes as
// q * sign(k) (vpsignb), so each pair is k * q, at most 2 * 127 * 127 in
// magnitude (both quantizers give codes in [-127, 127]) and never
// saturates; vpmaddwd against ones then adds the two pairs of a lane.
#include "attention_q8_x86.h"

namespace longctx::cpu::detail {
namespace {

struct Avx2Dot {
  // 16 tokens a tile, so that each broadcast of a head's quad serves two
  // loads of keys (the signs stay one per load and head). 4 heads' 8 sums,
  // the keys and their codes need more than the 16 registers, and GCC keeps
  // half the sums on the stack; even so the scores took 25% less time than
  // with 8 tokens a tile, and q8_0 decode over 16K hot tokens (g 4, d 128)
  // 7% less (Zen 3).
  static constexpr int kKeyVectors = 2;
  static __m256i keys(__m256i codes) { return _mm256_abs_epi8(codes); }
  static __m256i start(int32_t) { return _mm256_setzero_si256(); }
  static void add(__m256i& sum, __m256i keys, __m256i codes, __m256i q) {
    const __m256i pairs = _mm256_maddubs_epi16(keys, _mm256_sign_epi8(q, codes));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
};

}  // namespace

void score_q8_avx2(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                   int score_stride, LinePrefetch& prefetch) {
  score_q8_x86<Avx2Dot>(args, k_t, k_scales, n, scores, score_stride, prefetch);
}

}  // namespace longctx::cpu::detail
