// q8_0 decode attention's dot products on AVX512-VNNI (attention_kernel.h),
// compiled for AVX512-BW/VNNI and reached only from the AVX-512 instantiation
// of attend_piece on CPUs that have it.
//
// Scores, vpdpbusd: a q8_0 page keeps the K codes in quads of channels,
// [head_dim / 4][block_size][4] (kv_store.h), and vpdpbusd adds, per 32-bit
// lane, the products of 4 consecutive bytes: one load of a quad's row gives
// 16 tokens' four channels, a token to a lane, in token order, as the
// tokens' scales and the scores are. vpdpbusd multiplies unsigned by signed
// bytes: the key codes go in with their sign bit flipped (k + 128), the query
// codes as they are, and each sum starts at -128 * (sum of the query codes),
// so it ends at the exact integer sum of q * k.
//
// P.V, vpdpbusd: a q8_0 page keeps the V codes in quads of tokens,
// [ceil(block_size / 4)][head_dim][4] (kv_store.h), so one load gives 16 channels'
// codes of four tokens, a channel to a lane, and the weights of those four
// tokens are 16-bit unsigned codes, summed by their high and their low bytes.
//
// Like every ISA file, it shares no inline code with other files (the
// prefetch walk and for_head_groups of attention_kernel.h have internal
// linkage): a copy compiled with these flags might be the one the linker keeps.
//
// GCC 12's _mm512_undefined_ps() (x = x), behind the shuffles and
// conversions, trips -Wuninitialized once they are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention_kernel.h"

namespace longctx::cpu::detail {
namespace {

constexpr int kGroup = kQ8VnniGroup;
constexpr int kQuad = kQ8VnniQuad;
constexpr int kMaxDim = 512;  // the largest head_dim a KVStore takes

// acc += a . b per 32-bit lane, the 4 unsigned bytes of a times the 4 signed
// bytes of b (vpdpbusd). In asm because GCC 12 copies the sum of every
// _mm512_dpbusd_epi32 in and out of a spare register, and here spilled some.
inline void dot_bytes(__m512i& acc, __m512i a, __m512i b) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b)); }

// The first `count` of 16 lanes (none for count <= 0, all for count >= 16).
inline __mmask16 first_lanes(int count) {
  return count >= 16 ? __mmask16(0xFFFF) : count > 0 ? __mmask16((1u << count) - 1) : __mmask16(0);
}

template <int G>
void score_heads(const PieceArgs& a, int h0, const int8_t* k_quads, const uint16_t* k_scales, int n, float* scores,
                 int score_stride, LinePrefetch& prefetch) {
  const int dim = a.head_dim;
  const int groups = dim / kGroup;
  const size_t quad_row = size_t(a.block_size) * kQuad;  // bytes from one quad of channels to the next
  // Vector l holds tokens 16l .. 16l + 15, a token's four codes to a lane.
  __mmask16 lanes[4];
  __mmask64 bytes[4];
  for (int l = 0; l < 4; ++l) {
    const int count = n - 16 * l;
    lanes[l] = first_lanes(count);
    bytes[l] = count >= 16 ? ~__mmask64{0} : count > 0 ? (__mmask64{1} << (kQuad * count)) - 1 : __mmask64{0};
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[G][4];
  for (auto& head : acc)
    for (auto& v : head) v = _mm512_setzero_ps();

  LinePrefetch walk = prefetch;  // in registers: through the reference it was a store and a load per step
  for (int grp = 0; grp < groups; ++grp) {
    __m512i dot[G][4];
    for (int i = 0; i < G; ++i) {
      const __m512i start = _mm512_set1_epi32(-128 * a.q_code_sums[size_t(h0 + i) * groups + grp]);
      for (auto& v : dot[i]) v = start;
    }
    // The group's step of the prefetch walk at once: with none inside it,
    // the loop below unrolls, and its integer sums stay in their registers
    // (a loop kept them moving between registers and to the stack; the
    // scores took 20% less time unrolled).
    prefetch_step(walk, kGroup * size_t(n));
#pragma GCC unroll 8
    for (int c = grp * kGroup; c < (grp + 1) * kGroup; c += kQuad) {
      const int8_t* k = k_quads + size_t(c / kQuad) * quad_row;
      __m512i x[4];
      for (int v = 0; v < 4; ++v) x[v] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes[v], k + 64 * v), flip);
      for (int i = 0; i < G; ++i) {
        int32_t quad;
        std::memcpy(&quad, a.q_codes + size_t(h0 + i) * dim + c, kQuad);
        const __m512i q = _mm512_set1_epi32(quad);
        for (int v = 0; v < 4; ++v) dot_bytes(dot[i][v], x[v], q);
      }
    }
    const uint16_t* scale_row = k_scales + size_t(grp) * size_t(a.block_size);
    prefetch_step(walk, sizeof(uint16_t) * size_t(n));
    __m512 scale[4];
    for (int v = 0; v < 4; ++v) scale[v] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes[v], scale_row + 16 * v));
    for (int i = 0; i < G; ++i) {
      const __m512 q_scale = _mm512_set1_ps(a.q_scales[size_t(h0 + i) * groups + grp]);
      for (int v = 0; v < 4; ++v) {
        acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][v]), _mm512_mul_ps(scale[v], q_scale), acc[i][v]);
      }
    }
  }
  prefetch = walk;
  for (int i = 0; i < G; ++i) {
    float* out = scores + size_t(i) * score_stride;
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(out + 16 * v, lanes[v], acc[i][v]);
  }
}

// Token slots of a chunk's weights: the lead of its first quad of tokens
// (< 4), its n <= kQ8VnniChunk tokens, zeros to a whole vector after them.
constexpr int kWeightSlots = kQ8VnniChunk + 2 * 16;
// Bytes of a head's weight codes: 16 per quad of slots (WeightBytes).
constexpr int kWeightBytes = kWeightSlots / kQuad * 16;

// The weights of P.V for G heads and one group of channels as 16-bit unsigned
// codes: slot lead + j holds token j's w[i][j] = p[i][j] * scale[j] ~ code *
// unit[i], the slots before lead and past lead + n hold 0. Per quad of slots
// q, bytes[i][16 q ..] holds the four codes' low bytes, then their high bytes
// (what vpdpbusd broadcasts per quad), then 8 bytes unused.
template <int G>
void weight_codes(const float* p, int p_stride, const float* scale, int n, int lead, uint8_t (*bytes)[kWeightBytes],
                  float* unit) {
  const int vectors = (n + 15) / 16;             // of tokens
  const int slot_vectors = (lead + n + 15) / 16;  // at most vectors + 1
  // Within each 128-bit lane (one quad of 32-bit codes): bytes 0, 4, 8, 12, then 1, 5, 9, 13.
  const __m512i split = _mm512_set4_epi32(0, 0, 0x0D090501, 0x0C080400);
  // Slot lane l of vector k is token 16k + l - lead: of token vector k - 1
  // (the permute's first source) for l < lead, else of k (its second).
  const __m512i from = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(16 - lead));
  // The weights stay at token offsets in memory (a vector stored is loaded
  // back whole) and move to their slots in registers.
  alignas(64) float w[kQ8VnniChunk / 16 + 1][16];
  for (int i = 0; i < G; ++i) {
    const float* row = p + size_t(i) * p_stride;
    __m512 top = _mm512_setzero_ps();
    for (int v = 0; v < vectors; ++v) {
      const __mmask16 m = first_lanes(n - 16 * v);
      const __m512 p_v = _mm512_maskz_loadu_ps(m, row + 16 * v);
      const __m512 w_v = _mm512_mul_ps(p_v, _mm512_maskz_loadu_ps(m, scale + 16 * v));
      _mm512_store_ps(w[v], w_v);
      top = _mm512_max_ps(top, w_v);
    }
    _mm512_store_ps(w[vectors], _mm512_setzero_ps());
    const float max = _mm512_reduce_max_ps(top);  // weights are >= 0
    unit[i] = max / 65535.f;
    const __m512 inverse = _mm512_set1_ps(max > 0.f ? 65535.f / max : 0.f);
    __m512 before = _mm512_setzero_ps();
    for (int k = 0; k < slot_vectors; ++k) {
      const __m512 here = _mm512_load_ps(w[k]);
      const __m512 slots = _mm512_permutex2var_ps(before, from, here);
      before = here;
      // Nearest, ties to even; w * (65535 / max) may pass 65535 by an ulp.
      const __m512i code = _mm512_min_epu32(_mm512_cvtps_epu32(_mm512_mul_ps(slots, inverse)),
                                            _mm512_set1_epi32(65535));
      _mm512_storeu_si512(&bytes[i][16 * 4 * k], _mm512_shuffle_epi8(code, split));
    }
  }
}

// acc rows (G heads, channels [c, c + 32)) += P.V over the chunk's tokens:
// quads of tokens from the one that holds the first (lead tokens before it).
// Per quad, two loads give the 32 channels' four codes each, a channel to a
// lane, and vpdpbusd sums them times the quad's high bytes of the weights in
// one sum, times the low bytes in another: sum_hi * 256 + sum_lo is the exact
// integer sum of code * v (|sum| <= 33 quads * 4 * 65535 * 127 < 2^31).
template <int G>
void accumulate_group(const PieceArgs& a, int h0, const float* p, int p_stride, int n, int lead, const int8_t* v,
                      const float* scale, int c, float* acc, LinePrefetch& prefetch) {
  alignas(64) uint8_t bytes[G][kWeightBytes];
  float unit[G];
  weight_codes<G>(p + size_t(h0) * p_stride, p_stride, scale, n, lead, bytes, unit);
  const int dim = a.head_dim;
  __m512i sum_hi[G][2], sum_lo[G][2];
  for (int i = 0; i < G; ++i)
    for (int half = 0; half < 2; ++half) sum_hi[i][half] = sum_lo[i][half] = _mm512_setzero_si512();
  const int quads = (lead + n + kQuad - 1) / kQuad;
  LinePrefetch walk = prefetch;  // in registers (score_heads)
  for (int q = 0; q < quads; ++q) {
    const int8_t* row = v + (size_t(q) * dim + size_t(c)) * kQuad;
    prefetch_step(walk, kQuad * kGroup);
    const __m512i codes[2] = {_mm512_loadu_si512(row), _mm512_loadu_si512(row + 64)};
    for (int i = 0; i < G; ++i) {
      int32_t w_lo, w_hi;
      std::memcpy(&w_lo, &bytes[i][16 * q], kQuad);
      std::memcpy(&w_hi, &bytes[i][16 * q + kQuad], kQuad);
      const __m512i weights_lo = _mm512_set1_epi32(w_lo), weights_hi = _mm512_set1_epi32(w_hi);
      for (int half = 0; half < 2; ++half) {
        dot_bytes(sum_hi[i][half], weights_hi, codes[half]);
        dot_bytes(sum_lo[i][half], weights_lo, codes[half]);
      }
    }
  }
  prefetch = walk;
  for (int i = 0; i < G; ++i) {
    const __m512 u = _mm512_set1_ps(unit[i]);
    float* out = acc + size_t(h0 + i) * dim + c;
    for (int half = 0; half < 2; ++half) {
      const __m512i total = _mm512_add_epi32(_mm512_slli_epi32(sum_hi[i][half], 8), sum_lo[i][half]);
      float* out_half = out + 16 * half;
      _mm512_storeu_ps(out_half, _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), u, _mm512_loadu_ps(out_half)));
    }
  }
}

// The 16 scales of group g from 16 tokens' rows of `groups` f32 (rows
// contiguous): a tree of two-source permutes when groups is a power of two
// (head_dim 32 to 512), each level doubling the tokens gathered, else a gather.
inline __m512 group_column(const float* rows, int groups, int g) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  if ((groups & (groups - 1)) != 0) {
    return _mm512_i32gather_ps(_mm512_mullo_epi32(lane, _mm512_set1_epi32(groups)), rows + g, 4);
  }
  if (groups == 1) return _mm512_load_ps(rows);
  __m512 part[8];  // level 0: pairs of vectors, 2 * (16 / groups) tokens each
  const int per_vector = 16 / groups;
  {
    // lane k < 2 * per_vector: token k of the pair, from vector k / per_vector
    const __m512i token = _mm512_and_si512(lane, _mm512_set1_epi32(per_vector - 1));
    const __m512i from_second = _mm512_slli_epi32(_mm512_srli_epi32(lane, __builtin_ctz(per_vector)), 4);
    const __m512i index = _mm512_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(token, _mm512_set1_epi32(groups)),
                                                            _mm512_set1_epi32(g)), from_second);
    for (int i = 0; i < groups / 2; ++i) {
      part[i] = _mm512_permutex2var_ps(_mm512_load_ps(rows + 32 * i), index, _mm512_load_ps(rows + 32 * i + 16));
    }
  }
  for (int have = 2 * per_vector, n = groups / 2; n > 1; have *= 2, n /= 2) {  // `have` tokens in each part
    const __m512i index = _mm512_add_epi32(_mm512_and_si512(lane, _mm512_set1_epi32(have - 1)),
                                           _mm512_slli_epi32(_mm512_srli_epi32(lane, __builtin_ctz(have)), 4));
    for (int i = 0; i < n / 2; ++i) part[i] = _mm512_permutex2var_ps(part[2 * i], index, part[2 * i + 1]);
  }
  return part[0];
}

}  // namespace

void accumulate_q8_avx512_vnni(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                               const uint16_t* v_scales, float* acc, LinePrefetch& prefetch) {
  const int groups = args.head_dim / kGroup;
  // The chunk's scales [n][groups] widened to f32 (whole vectors of 16
  // tokens, zero past n), then one group's over the tokens.
  alignas(64) float widened[kQ8VnniChunk * (kMaxDim / kGroup)];
  alignas(64) float scale[kQ8VnniChunk];
  const int count = n * groups;
  const int vectors = (n + 15) / 16;  // of 16 tokens
  prefetch_step(prefetch, sizeof(uint16_t) * size_t(count));
  for (int i = 0; i < vectors * 16 * groups; i += 16) {
    _mm512_store_ps(widened + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first_lanes(count - i), v_scales + i)));
  }
  for (int grp = 0; grp < groups; ++grp) {
    for (int j = 0; j < vectors; ++j) {
      _mm512_store_ps(scale + 16 * j, group_column(widened + 16 * j * groups, groups, grp));
    }
    for_head_groups(args.g, [&](auto heads, int h0) {
      accumulate_group<decltype(heads)::value>(args, h0, p, p_stride, n, lead, v, scale, grp * kGroup, acc, prefetch);
    });
  }
}

void score_q8_avx512_vnni(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n,
                          float* scores, int score_stride, LinePrefetch& prefetch) {
  for_head_groups(args.g, [&](auto heads, int h0) {
    score_heads<decltype(heads)::value>(args, h0, k_t, k_scales, n, scores + size_t(h0) * score_stride, score_stride,
                                        prefetch);
  });
}

}  // namespace longctx::cpu::detail
