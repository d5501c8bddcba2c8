// The q8_0 kernels of decode attention on 256-bit vectors, for the ISA files
// that include them (attention_q8_avx2.cpp, attention_q8_avx_vnni.cpp), each
// compiled for its own instructions: see attention_kernel.h for the
// contracts, the AVX512-VNNI kernels' (attention_q8_vnni.cpp); all of them
// give the same scores and the same P.V, bit for bit.
//
// Scores: a q8_0 page keeps the K codes in quads of channels,
// [head_dim / 4][block_size][4] (kv_store.h), so one 32-byte load gives 8
// tokens' four codes, a token to a 32-bit lane; `Dot` sums, per lane, the
// four products of those codes with a query head's four codes:
//   static __m256i keys(__m256i codes);         the keys' operand, once per load
//   static __m256i start(int32_t q_code_sum);   a group's sum before its products
//   static void add(__m256i& sum, __m256i keys, __m256i codes, __m256i q);
// where q holds the head's quad in every lane. Per group of 32 channels the
// sums are exact integers, then times the tokens' scales times q's, in the
// order and with the roundings of the AVX512-VNNI kernel and of the Highway
// code's f32 path.
//
// P.V: the V codes are in quads of tokens, [ceil(block_size / 4)][head_dim][4],
// so one 32-byte load gives 8 channels' codes of four tokens, a channel to a
// lane. The weights are 16-bit unsigned codes per token (weight_codes), and
// `Dot` sums, exactly in int32, the codes times the weights of a quad:
//   struct Values;  struct Sums;                   what a load gives; a head's sums
//   static Values values(const int8_t* row, Values& totals);  (totals: what
//                                                  total() needs across the loads)
//   static void weigh(Sums& sums, const Values& v, const uint8_t* quad);
//   static __m256i total(const Sums& sums, const Values& totals);  8 channels' sums
//   static __m128i pack(__m256i codes);  8 slots' 16-bit codes (in int32 lanes)
//                                        as 16 bytes, 8 per quad, for weigh()
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
constexpr int kMaxDim = 512;          // the largest head_dim a KVStore takes

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


// The first `count` of 8 int32 lanes set (none for count <= 0).
inline __m256i first_lanes(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Token slots of a chunk's weights: the lead of its first quad of tokens
// (< 4), its n <= kQ8VnniChunk tokens, zeros to a whole vector after them.
constexpr int kWeightSlots = kQ8VnniChunk + 2 * kQ8Lanes;
constexpr int kWeightBytes = kWeightSlots / kQuad * 8;  // a head's packed weights: 8 bytes per quad

// The weights of P.V for G heads and one group of channels as 16-bit codes,
// packed by Dot: slot lead + j holds token j's w[i][j] = p[i][j] * scale[j]
// ~ code * unit[i], the other slots 0 (attention_kernel.h). scale holds
// whole vectors, 0 past n. The weights stay at token offsets in memory (a
// vector stored is loaded back whole) and move to their slots in registers.
template <class Dot, int G>
void weight_codes(const float* p, int p_stride, const float* scale, int n, int lead, uint8_t (*bytes)[kWeightBytes],
                  float* unit) {
  const int vectors = (n + kQ8Lanes - 1) / kQ8Lanes;             // of tokens
  const int slot_vectors = (lead + n + kQ8Lanes - 1) / kQ8Lanes;  // at most vectors + 1
  // Slot lane l of vector k is token 8k + l - lead: lane (l - lead) % 8 of
  // token vector k, or of k - 1 for l < lead.
  const __m256i from = _mm256_and_si256(_mm256_sub_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                         _mm256_set1_epi32(lead)),
                                        _mm256_set1_epi32(kQ8Lanes - 1));
  const __m256 earlier = _mm256_castsi256_ps(first_lanes(lead));
  alignas(32) float w[kQ8VnniChunk / kQ8Lanes + 1][kQ8Lanes];
  for (int i = 0; i < G; ++i) {
    const float* row = p + size_t(i) * p_stride;
    __m256 top = _mm256_setzero_ps();
    for (int v = 0; v < vectors; ++v) {
      const __m256 p_v = _mm256_maskload_ps(row + kQ8Lanes * v, first_lanes(n - kQ8Lanes * v));
      const __m256 w_v = _mm256_mul_ps(p_v, _mm256_load_ps(scale + kQ8Lanes * v));
      _mm256_store_ps(w[v], w_v);
      top = _mm256_max_ps(top, w_v);
    }
    _mm256_store_ps(w[vectors], _mm256_setzero_ps());
    top = _mm256_max_ps(top, _mm256_permute2f128_ps(top, top, 1));
    top = _mm256_max_ps(top, _mm256_permute_ps(top, 0x4E));
    top = _mm256_max_ps(top, _mm256_permute_ps(top, 0xB1));
    const float max = _mm256_cvtss_f32(top);  // weights are >= 0
    unit[i] = max / 65535.f;
    const __m256 inverse = _mm256_set1_ps(max > 0.f ? 65535.f / max : 0.f);
    __m256 before = _mm256_setzero_ps();
    for (int k = 0; k < slot_vectors; ++k) {
      const __m256 here = _mm256_load_ps(w[k]);
      const __m256 slots =
          _mm256_blendv_ps(_mm256_permutevar8x32_ps(here, from), _mm256_permutevar8x32_ps(before, from), earlier);
      before = here;
      // Nearest, ties to even; w * (65535 / max) may pass 65535 by an ulp.
      const __m256i code = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(slots, inverse)),
                                            _mm256_set1_epi32(65535));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(&bytes[i][k * 2 * 8]), Dot::pack(code));
    }
  }
}

// acc rows (G heads, channels [c0, c0 + 32)) += P.V over the chunk's tokens:
// quads of tokens from the one that holds the first, 8 channels at a time.
template <class Dot, int G>
void accumulate_group(const PieceArgs& a, int h0, const float* p, int p_stride, int n, int lead, const int8_t* v,
                      const float* scale, int c0, float* acc, LinePrefetch& prefetch) {
  alignas(32) uint8_t bytes[G][kWeightBytes];
  float unit[G];
  weight_codes<Dot, G>(p + size_t(h0) * p_stride, p_stride, scale, n, lead, bytes, unit);
  const int dim = a.head_dim;
  const int quads = (lead + n + kQuad - 1) / kQuad;
  for (int c = c0; c < c0 + kGroup; c += kQ8Lanes) {
    typename Dot::Sums sums[G] = {};
    typename Dot::Values totals = {};
    for (int q = 0; q < quads; ++q) {
      prefetch_step(prefetch, kQuad * kQ8Lanes);
      const typename Dot::Values values = Dot::values(v + (size_t(q) * dim + size_t(c)) * kQuad, totals);
      for (int i = 0; i < G; ++i) Dot::weigh(sums[i], values, &bytes[i][8 * q]);
    }
    for (int i = 0; i < G; ++i) {
      float* out = acc + size_t(h0 + i) * dim + c;
      const __m256 total = _mm256_cvtepi32_ps(Dot::total(sums[i], totals));
      _mm256_storeu_ps(out, _mm256_fmadd_ps(total, _mm256_set1_ps(unit[i]), _mm256_loadu_ps(out)));
    }
  }
}

template <class Dot>
void accumulate_q8_x86(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                       const uint16_t* v_scales, float* acc, LinePrefetch& prefetch) {
  const int groups = args.head_dim / kGroup;
  // The chunk's scales [n][groups] widened to f32, then one group's over the
  // tokens (whole vectors, 0 past n).
  alignas(32) float widened[kQ8VnniChunk * (kMaxDim / kGroup)];
  alignas(32) float scale[kQ8VnniChunk];
  const int count = n * groups;
  prefetch_step(prefetch, sizeof(uint16_t) * size_t(count));
  int i = 0;
  for (; i + kQ8Lanes <= count; i += kQ8Lanes) {
    _mm256_store_ps(widened + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v_scales + i))));
  }
  for (; i < count; ++i) widened[i] = _cvtsh_ss(v_scales[i]);
  const int vectors = (n + kQ8Lanes - 1) / kQ8Lanes;
  const __m256i rows = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(groups));
  for (int grp = 0; grp < groups; ++grp) {
    for (int t = 0; t < vectors; ++t) {
      const __m256 tokens = _mm256_castsi256_ps(first_lanes(n - kQ8Lanes * t));
      _mm256_store_ps(scale + kQ8Lanes * t, _mm256_mask_i32gather_ps(_mm256_setzero_ps(),
                                                                     widened + kQ8Lanes * t * groups + grp, rows,
                                                                     tokens, sizeof(float)));
    }
    for_head_groups(args.g, [&](auto heads, int h0) {
      accumulate_group<Dot, decltype(heads)::value>(args, h0, p, p_stride, n, lead, v, scale, grp * kGroup, acc,
                                                    prefetch);
    });
  }
}

}  // namespace
}  // namespace longctx::cpu::detail
