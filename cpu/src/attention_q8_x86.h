// The q8_0 score kernel of decode attention on 256-bit vectors, for the ISA
// files that include it (attention_q8_avx2.cpp, attention_q8_avx_vnni.cpp),
// each compiled for its own instructions: see attention_kernel.h for the
// contract. A q8_0 page keeps the K codes in quads of channels,
// [head_dim / 4][block_size][4] (kv_store.h), so one 32-byte load gives 8
// tokens' four codes, a token to a 32-bit lane; `Dot` sums, per lane, the
// four products of those codes with a query head's four codes:
//   static __m256i keys(__m256i codes);         the keys' operand, once per load
//   static __m256i start(int32_t q_code_sum);   a group's sum before its products
//   static void add(__m256i& sum, __m256i keys, __m256i codes, __m256i q);
// where q holds the head's quad in every lane. Per group of 32 channels the
// sums are exact integers, then times the tokens' scales times q's, in the
// order and with the roundings of the AVX512-VNNI kernel and of the Highway
// code's f32 path: all of them give the same scores, bit for bit.
// Internal linkage only: a copy compiled with other flags must never be the
// one the linker keeps.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "attention_kernel.h"

namespace longctx::cpu::detail {
namespace {

constexpr int kGroup = kQ8VnniGroup;  // channels per q8_0 scale
constexpr int kQuad = kQ8VnniQuad;    // codes per 32-bit lane
constexpr int kQ8Lanes = 8;           // 32-bit lanes of a ymm register: tokens of a tile

// Scores of G heads from h0 for the `count` <= 8 tokens of one tile (kFull:
// 8); k points at the tile's first token in the first quad of channels,
// scales at its scale of group 0. A partial tile loads only its tokens' lanes.
template <class Dot, int G, bool kFull>
void score_tile(const PieceArgs& a, int h0, const int8_t* k, const uint16_t* scales, int count, float* out,
                int score_stride, LinePrefetch& prefetch) {
  const int dim = a.head_dim;
  const int groups = dim / kGroup;
  const size_t quad_row = size_t(a.block_size) * kQuad;  // bytes from one quad of channels to the next
  const size_t tile_bytes = kQuad * size_t(count);
  const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const int8_t* q_codes[G];
  const int32_t* q_sums[G];
  for (int i = 0; i < G; ++i) {
    q_codes[i] = a.q_codes + size_t(h0 + i) * dim;
    q_sums[i] = a.q_code_sums + size_t(h0 + i) * groups;
  }
  __m256 acc[G];
  for (auto& v : acc) v = _mm256_setzero_ps();
  const int8_t* row = k;
  for (int grp = 0; grp < groups; ++grp) {
    __m256i dot[G];
    for (int i = 0; i < G; ++i) dot[i] = Dot::start(q_sums[i][grp]);
    for (int c = grp * kGroup; c < (grp + 1) * kGroup; c += kQuad, row += quad_row) {
      prefetch_step(prefetch, tile_bytes);
      const __m256i codes = kFull ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row))
                                  : _mm256_maskload_epi32(reinterpret_cast<const int*>(row), lanes);
      const __m256i keys = Dot::keys(codes);
      for (int i = 0; i < G; ++i) {
        int32_t quad;
        std::memcpy(&quad, q_codes[i] + c, kQuad);
        Dot::add(dot[i], keys, codes, _mm256_set1_epi32(quad));
      }
    }
    const uint16_t* scale_row = scales + size_t(grp) * size_t(a.block_size);
    prefetch_step(prefetch, sizeof(uint16_t) * size_t(count));
    __m128i halfs;
    if constexpr (kFull) {
      halfs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_row));
    } else {
      alignas(16) uint16_t part[kQ8Lanes] = {};
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
      alignas(32) float all[kQ8Lanes];
      _mm256_store_ps(all, acc[i]);
      std::memcpy(dst, all, sizeof(float) * size_t(count));
    }
  }
}

template <class Dot>
void score_q8_x86(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                  int score_stride, LinePrefetch& prefetch) {
  for (int j = 0; j < n; j += kQ8Lanes) {
    const int count = n - j < kQ8Lanes ? n - j : kQ8Lanes;
    for_head_groups(args.g, [&](auto heads, int h0) {
      constexpr int G = decltype(heads)::value;
      const auto tile = count == kQ8Lanes ? score_tile<Dot, G, true> : score_tile<Dot, G, false>;
      tile(args, h0, k_t + size_t(j) * kQuad, k_scales + j, count, scores + size_t(h0) * score_stride + j,
           score_stride, prefetch);
    });
  }
}

}  // namespace
}  // namespace longctx::cpu::detail
