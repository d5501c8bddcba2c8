// attention_q8_x86.h's q8_0 scores on AVX2 (+ FMA, F16C), for CPUs without
// AVX-VNNI or AVX512-VNNI. vpmaddubsw multiplies unsigned by signed bytes
// and adds pairs into 16 bits: the keys go in as |k| and the query codes as
// q * sign(k) (vpsignb), so each pair is k * q, at most 2 * 127 * 127 in
// magnitude (both quantizers give codes in [-127, 127]) and never
// saturates; vpmaddwd against ones then adds the two pairs of a lane.
//
// P.V on vpmaddwd: a load's codes are sign-extended to 16 bits, four channels
// to a vector, and each pair of tokens' codes is multiplied by the pair's
// weights, which go in as signed 16 bits, less 32768; the sums of the codes,
// kept across the loads, times 32768 put that back, so the total is the exact
// integer sum of weight * code. The pairs of each channel (tokens 0-1 and 2-3
// of every quad) are added only at the end.
#include "attention_q8_x86.h"

namespace longctx::cpu::detail {
namespace {

struct Avx2Dot {
  static __m256i keys(__m256i codes) { return _mm256_abs_epi8(codes); }
  static __m256i start(int32_t) { return _mm256_setzero_si256(); }
  static void add(__m256i& sum, __m256i keys, __m256i codes, __m256i q) {
    const __m256i pairs = _mm256_maddubs_epi16(keys, _mm256_sign_epi8(q, codes));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }

  // Channels 0-3 and 4-7 of a load: two int32 lanes per channel, the sums
  // of its tokens 0-1 and 2-3. Values: the codes as 16 bits; their totals:
  // the codes' sums, in the same lanes.
  struct Values {
    __m256i low, high;
  };
  struct Sums {
    __m256i low, high;
  };
  static Values values(const int8_t* row, Values& totals) {
    const auto* halves = reinterpret_cast<const __m128i*>(row);
    const Values v{_mm256_cvtepi8_epi16(_mm_loadu_si128(halves)), _mm256_cvtepi8_epi16(_mm_loadu_si128(halves + 1))};
    const __m256i ones = _mm256_set1_epi16(1);
    totals.low = _mm256_add_epi32(totals.low, _mm256_madd_epi16(v.low, ones));
    totals.high = _mm256_add_epi32(totals.high, _mm256_madd_epi16(v.high, ones));
    return v;
  }
  static void weigh(Sums& sums, const Values& v, const uint8_t* quad) {
    int64_t packed;
    std::memcpy(&packed, quad, sizeof(packed));
    const __m256i weights = _mm256_set1_epi64x(packed);
    sums.low = _mm256_add_epi32(sums.low, _mm256_madd_epi16(v.low, weights));
    sums.high = _mm256_add_epi32(sums.high, _mm256_madd_epi16(v.high, weights));
  }
  static __m256i total(const Sums& sums, const Values& totals) {
    const __m256i low = _mm256_add_epi32(sums.low, _mm256_slli_epi32(totals.low, 15));
    const __m256i high = _mm256_add_epi32(sums.high, _mm256_slli_epi32(totals.high, 15));
    // hadd gives channels 0 1 4 5 | 2 3 6 7; the permute puts them in order.
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(low, high), 0xD8);
  }
  static __m128i pack(__m256i codes) {
    // code - 32768 fits int16, so the saturating pack is exact; each 128-bit
    // lane's low 8 bytes are its quad's four weights.
    const __m256i shifted = _mm256_sub_epi32(codes, _mm256_set1_epi32(32768));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(shifted, shifted), 0x08));
  }
};

}  // namespace

void score_q8_avx2(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                   int score_stride, LinePrefetch& prefetch) {
  score_q8_x86<Avx2Dot>(args, k_t, k_scales, n, scores, score_stride, prefetch);
}

void accumulate_q8_avx2(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                        const uint16_t* v_scales, float* acc, LinePrefetch& prefetch) {
  accumulate_q8_x86<Avx2Dot>(args, p, p_stride, n, lead, v, v_scales, acc, prefetch);
}

}  // namespace longctx::cpu::detail
