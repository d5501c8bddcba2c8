// The q8_0 score kernel of decode attention on 256-bit vectors, for the ISA
// files that include it (attention_q8_avx2.cpp, attention_q8_avx_vnni.cpp),
// each compiled for its own instructions: see attention_kernel.h for the
// contract, the AVX512-VNNI kernel's (attention_q8_vnni.cpp). A q8_0 page
// keeps the K codes in quads of channels, [head_dim / 4][block_size][4]
// (kv_store.h), so one 32-byte load gives 8
// tokens' four codes, a token to a 32-bit lane; `Dot` sums, per lane, the
// four products of those codes with a query head's four codes:
//   static constexpr int kKeyVectors;           loads of 8 tokens a tile takes
//   static __m256i keys(__m256i codes);         the keys' operand, once per load
//   static __m256i start(int32_t q_code_sum);   a group's sum before its products
//   static void add(__m256i& sum, __m256i keys, __m256i codes, __m256i q);
// where q holds the head's quad in every lane. Per group of 32 channels the
// sums are exact integers, then times the tokens' scales times q's, in the
// order and with the roundings of the AVX512-VNNI kernel and of the Highway
// code's f32 path.
//
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

// The first `count` of 8 int32 lanes set (none for count <= 0).
inline __m256i first_lanes(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Scores of G heads from h0 for the `count` <= kTile tokens of one tile
// (kFull: kTile), Dot::kKeyVectors vectors of 8 tokens, so that each
// broadcast of q serves them all; k points at the tile's first token in the
// first quad of channels, scales at its scale of group 0. A partial tile
// loads only its tokens' lanes.
template <class Dot, int G, bool kFull>
void score_tile(const PieceArgs& a, int h0, const int8_t* k, const uint16_t* scales, int count, float* out,
                int score_stride, LinePrefetch& prefetch) {
  const int dim = a.head_dim;
  const int groups = dim / kGroup;
  const size_t quad_row = size_t(a.block_size) * kQuad;  // bytes from one quad of channels to the next
  const size_t tile_bytes = kQuad * size_t(count);
  constexpr int kVectors = Dot::kKeyVectors, kTile = kVectors * kQ8Lanes;
  __m256i lanes[kVectors];
  for (int v = 0; v < kVectors; ++v) lanes[v] = first_lanes(count - kQ8Lanes * v);
  const int8_t* q_codes[G];
  const int32_t* q_sums[G];
  for (int i = 0; i < G; ++i) {
    q_codes[i] = a.q_codes + size_t(h0 + i) * dim;
    q_sums[i] = a.q_code_sums + size_t(h0 + i) * groups;
  }
  // The f32 sums wait in memory between groups: in registers they would
  // crowd out the integer ones.
  alignas(32) float acc[G][kTile];  // zeroed by vector stores: `= {}` became rep stos, slow to start
  for (int i = 0; i < G; ++i)
    for (int v = 0; v < kVectors; ++v) _mm256_store_ps(&acc[i][kQ8Lanes * v], _mm256_setzero_ps());
  const int8_t* row = k;
  LinePrefetch walk = prefetch;  // in registers: through the reference it was a store and a load per step
  for (int grp = 0; grp < groups; ++grp) {
    __m256i dot[G][kVectors];
    for (int i = 0; i < G; ++i)
      for (auto& d : dot[i]) d = Dot::start(q_sums[i][grp]);
    // The group's step of the prefetch walk at once, so that the loop below
    // unrolls (the AVX512-VNNI kernel's scores took 20% less time so).
    prefetch_step(walk, tile_bytes * (kGroup / kQuad));
#pragma GCC unroll 8
    for (int c = grp * kGroup; c < (grp + 1) * kGroup; c += kQuad, row += quad_row) {
      __m256i codes[kVectors], keys[kVectors];
      for (int v = 0; v < kVectors; ++v) {
        const auto* at = reinterpret_cast<const int*>(row + kQuad * kQ8Lanes * v);
        codes[v] = kFull ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))
                         : _mm256_maskload_epi32(at, lanes[v]);
        keys[v] = Dot::keys(codes[v]);
      }
      for (int i = 0; i < G; ++i) {
        int32_t quad;
        std::memcpy(&quad, q_codes[i] + c, kQuad);
        const __m256i q = _mm256_set1_epi32(quad);
        for (int v = 0; v < kVectors; ++v) Dot::add(dot[i][v], keys[v], codes[v], q);
      }
    }
    const uint16_t* scale_row = scales + size_t(grp) * size_t(a.block_size);
    prefetch_step(walk, sizeof(uint16_t) * size_t(count));
    const uint16_t* halfs = scale_row;
    alignas(32) uint16_t part[kTile];
    if constexpr (!kFull) {  // a partial tile reads only its tokens' scales
      std::memset(part, 0, sizeof(part));
      std::memcpy(part, scale_row, sizeof(uint16_t) * size_t(count));
      halfs = part;
    }
    __m256 scale[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      scale[v] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(halfs + kQ8Lanes * v)));
    }
    for (int i = 0; i < G; ++i) {
      const __m256 q_scale = _mm256_set1_ps(a.q_scales[size_t(h0 + i) * groups + grp]);
      for (int v = 0; v < kVectors; ++v) {
        float* sum = &acc[i][kQ8Lanes * v];
        _mm256_store_ps(sum, _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][v]), _mm256_mul_ps(scale[v], q_scale),
                                             _mm256_load_ps(sum)));
      }
    }
  }
  prefetch = walk;
  // A full tile's copies have a size known here: moves, not calls to memcpy.
  const size_t bytes = sizeof(float) * size_t(kFull ? kTile : count);
  for (int i = 0; i < G; ++i) std::memcpy(out + size_t(i) * score_stride, acc[i], bytes);
}

template <class Dot>
void score_q8_x86(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                  int score_stride, LinePrefetch& prefetch) {
  constexpr int kTile = Dot::kKeyVectors * kQ8Lanes;
  for (int j = 0; j < n; j += kTile) {
    const int count = n - j < kTile ? n - j : kTile;
    for_head_groups(args.g, [&](auto heads, int h0) {
      constexpr int G = decltype(heads)::value;
      const auto tile = count == kTile ? score_tile<Dot, G, true> : score_tile<Dot, G, false>;
      tile(args, h0, k_t + size_t(j) * kQuad, k_scales + j, count, scores + size_t(h0) * score_stride + j,
           score_stride, prefetch);
    });
  }
}

}  // namespace
}  // namespace longctx::cpu::detail
