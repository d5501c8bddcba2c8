// q8_0 decode attention's scores on AVX2 (attention_kernel.h), compiled for
// AVX2/FMA/F16C and reached from the AVX2 and AVX-512 instantiations of
// attend_piece where the CPU has no AVX512-VNNI.
//
// A q8_0 page keeps the K codes in quads of channels, [head_dim / 4][block_size][4]
// (kv_store.h), so one 32-byte load gives 8 tokens' four codes, a token to a
// 32-bit lane. vpmaddubsw multiplies unsigned by signed bytes and adds pairs
// into 16 bits: the keys go in as |k| and the query codes as q * sign(k)
// (vpsignb), so each pair is k * q, at most 2 * 127 * 127 in magnitude (both
// quantizers give codes in [-127, 127]) and never saturates; vpmaddwd
// against ones then adds the two pairs of a lane. Per group of 32 channels the
// sums are exact integers, then times the tokens' scales times q's, in the
// order and with the roundings of the AVX512-VNNI kernel and of the
// Highway code's f32 path: all three give the same scores, bit for bit.
//
// Like every ISA file, it shares no inline code with other files (the
// prefetch walk and for_head_groups of attention_kernel.h have internal
// linkage): a copy compiled with these flags might be the one the linker keeps.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention_kernel.h"

namespace longctx::cpu::detail {
namespace {

constexpr int kGroup = kQ8VnniGroup;
constexpr int kQuad = kQ8VnniQuad;
constexpr int kLanes = 8;     // 32-bit lanes of a ymm register: tokens of a tile

// Scores of G heads from h0 for the `count` <= 8 tokens of one tile (kFull:
// 8); k points at the tile's first token in the first quad of channels,
// scales at its scale of group 0. A partial tile loads only its tokens' lanes.
template <int G, bool kFull>
void score_tile(const PieceArgs& a, int h0, const int8_t* k, const uint16_t* scales, int count, float* out,
                int score_stride, LinePrefetch& prefetch) {
  const int dim = a.head_dim;
  const int groups = dim / kGroup;
  const size_t quad_row = size_t(a.block_size) * kQuad;  // bytes from one quad of channels to the next
  const size_t tile_bytes = kQuad * size_t(count);
  const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* q_codes[G];
  for (int i = 0; i < G; ++i) q_codes[i] = a.q_codes + size_t(h0 + i) * dim;
  __m256 acc[G];
  for (auto& v : acc) v = _mm256_setzero_ps();
  const int8_t* row = k;
  for (int grp = 0; grp < groups; ++grp) {
    __m256i dot[G];
    for (auto& v : dot) v = _mm256_setzero_si256();
    for (int c = grp * kGroup; c < (grp + 1) * kGroup; c += kQuad, row += quad_row) {
      prefetch_step(prefetch, tile_bytes);
      const __m256i codes = kFull ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row))
                                  : _mm256_maskload_epi32(reinterpret_cast<const int*>(row), lanes);
      const __m256i magnitude = _mm256_abs_epi8(codes);
      for (int i = 0; i < G; ++i) {
        int32_t quad;
        std::memcpy(&quad, q_codes[i] + c, kQuad);
        const __m256i q = _mm256_sign_epi8(_mm256_set1_epi32(quad), codes);
        dot[i] = _mm256_add_epi32(dot[i], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, q), ones));
      }
    }
    const uint16_t* scale_row = scales + size_t(grp) * size_t(a.block_size);
    prefetch_step(prefetch, sizeof(uint16_t) * size_t(count));
    __m128i halfs;
    if constexpr (kFull) {
      halfs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_row));
    } else {
      alignas(16) uint16_t part[kLanes] = {};
      std::memcpy(part, scale_row, sizeof(uint16_t) * size_t(count));
      halfs = _mm_load_si128(reinterpret_cast<const __m128i*>(part));
    }
    const __m256 scale = _mm256_cvtph_ps(halfs);
    for (int i = 0; i < G; ++i) {
      const __m256 q_scale = _mm256_set1_ps(a.q_scales[size_t(h0 + i) * groups + grp]);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]), _mm256_mul_ps(scale, q_scale), acc[i]);
    }
  }
  for (int i = 0; i < G; ++i) {
    float* dst = out + size_t(i) * score_stride;
    if constexpr (kFull) {
      _mm256_storeu_ps(dst, acc[i]);
    } else {
      alignas(32) float all[kLanes];
      _mm256_store_ps(all, acc[i]);
      std::memcpy(dst, all, sizeof(float) * size_t(count));
    }
  }
}

}  // namespace

void score_q8_avx2(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                   int score_stride, LinePrefetch& prefetch) {
  for (int j = 0; j < n; j += kLanes) {
    const int count = n - j < kLanes ? n - j : kLanes;
    for_head_groups(args.g, [&](auto heads, int h0) {
      constexpr int G = decltype(heads)::value;
      const auto tile = count == kLanes ? score_tile<G, true> : score_tile<G, false>;
      tile(args, h0, k_t + size_t(j) * kQuad, k_scales + j, count, scores + size_t(h0) * score_stride + j,
           score_stride, prefetch);
    });
  }
}

}  // namespace longctx::cpu::detail
