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
constexpr int kMaxGroups = kMaxDim / kGroup;

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
// (< 4), its n <= kQ8VnniChunk tokens, zeros to a whole pair of vectors
// after them.
constexpr int kSlotVectors = (kQ8VnniChunk + kQuad - 1 + 15) / 16;  // at most 9 vectors of 16 slots
constexpr int kSlotPairs = (kSlotVectors + 1) / 2;
// Bytes of one head's weight codes for one group of channels: 8 per quad of
// slots, 64 per pair of slot vectors (weight_byte).
constexpr int kWeightBytes = kSlotPairs * 64;

// Where the codes of quad q of slots start among a group's weight bytes: the
// four codes' low bytes, then their high bytes (what vpdpbusd broadcasts per
// quad). Pair k of slot vectors (quads 8k .. 8k + 7) is stored as one vector:
// its 128-bit lane l holds quad 8k + l, then quad 8k + 4 + l (weight_codes).
inline int weight_byte(int q) { return 64 * (q >> 3) + 16 * (q & 3) + 8 * ((q >> 2) & 1); }

// The weights of P.V for G heads and every group of channels as 16-bit
// unsigned codes, bytes[i][grp] (weight_byte): slot lead + j holds
// token j's w = p[i][j] * scale_t[grp][j] ~ code * unit[i][grp], the slots
// before lead and past lead + n hold 0. scale_t[grp][j] is token j's scale of
// group grp, 0 from n to the end of its vector (transpose_scales). p is read
// once per head for all its groups.
template <int G>
void weight_codes(const float* p, int p_stride, const float* scale_t, int groups, int n, int lead,
                  uint8_t (*bytes)[kMaxGroups][kWeightBytes], float (*unit)[kMaxGroups]) {
  const int vectors = (n + 15) / 16;                          // of tokens
  const int pairs = ((lead + n + 15) / 16 + 1) / 2;           // of slot vectors
  // Per 128-bit lane of a pack of two code vectors (4 + 4 16-bit codes):
  // the first four's low bytes, their high bytes, then the same of the next four.
  const __m512i split = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
  // Slot lane l of vector k is token 16k + l - lead: of token vector k - 1
  // (the permute's first source) for l < lead, else of k (its second).
  const __m512i from = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(16 - lead));
  for (int i = 0; i < G; ++i) {
    const float* row = p + size_t(i) * p_stride;
    __m512 p_v[kQ8VnniChunk / 16];
    for (int v = 0; v < vectors; ++v) p_v[v] = _mm512_maskz_loadu_ps(first_lanes(n - 16 * v), row + 16 * v);
    for (int grp = 0; grp < groups; ++grp) {
      // The weights at token offsets, zero past n, then to their slots.
      __m512 w[2 * kSlotPairs + 1];
      w[0] = _mm512_setzero_ps();  // before token 0
      __m512 top = _mm512_setzero_ps();
      const float* scale = scale_t + size_t(grp) * kQ8VnniChunk;
      for (int v = 0; v < vectors; ++v) {
        w[v + 1] = _mm512_mul_ps(p_v[v], _mm512_load_ps(scale + 16 * v));
        top = _mm512_max_ps(top, w[v + 1]);
      }
      for (int v = vectors + 1; v <= 2 * pairs; ++v) w[v] = _mm512_setzero_ps();
      const float max = _mm512_reduce_max_ps(top);  // weights are >= 0
      unit[i][grp] = max / 65535.f;
      const __m512 inverse = _mm512_set1_ps(max > 0.f ? 65535.f / max : 0.f);
      uint8_t* out = bytes[i][grp];
      for (int k = 0; k < pairs; ++k) {
        __m512i code[2];
        for (int h = 0; h < 2; ++h) {
          const int slot_vector = 2 * k + h;
          const __m512 slots = lead == 0 ? w[slot_vector + 1]
                                         : _mm512_permutex2var_ps(w[slot_vector], from, w[slot_vector + 1]);
          // Nearest, ties to even; w * (65535 / max) may pass 65535 by an
          // ulp, and the pack saturates it to 65535.
          code[h] = _mm512_cvtps_epu32(_mm512_mul_ps(slots, inverse));
        }
        _mm512_store_si512(out + 64 * k, _mm512_shuffle_epi8(_mm512_packus_epi32(code[0], code[1]), split));
      }
    }
  }
}

// acc rows (G heads, channels [c, c + 32)) += P.V over the chunk's tokens:
// quads of tokens from the one that holds the first (lead tokens before it).
// Per quad, two loads give the 32 channels' four codes each, a channel to a
// lane, and vpdpbusd sums them times the quad's high bytes of the weights in
// one sum, times the low bytes in another: sum_hi * 256 + sum_lo is the exact
// integer sum of code * v (|sum| <= 33 quads * 4 * 65535 * 127 < 2^31).
// bytes[i] and unit[i] are head h0 + i's codes and unit of this group.
template <int G>
void accumulate_group(const PieceArgs& a, int h0, int n, int lead, const int8_t* v, const uint8_t* const* bytes,
                      const float* unit, int c, float* acc, LinePrefetch& prefetch) {
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
    const int at = weight_byte(q);
    for (int i = 0; i < G; ++i) {
      int32_t w_lo, w_hi;
      std::memcpy(&w_lo, bytes[i] + at, kQuad);
      std::memcpy(&w_hi, bytes[i] + at + kQuad, kQuad);
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

// scale_t[grp][j] (rows kQ8VnniChunk apart) = token j's f16 scale of group
// grp, v_scales[j * groups + grp], as f32; 0 for j from n to the chunk's end.
// When groups is a power of two the chunk's scales, padded with zeros to
// kQ8VnniChunk tokens, are one sequence whose element j * groups + grp must
// move to grp * kQ8VnniChunk + j: each unzip (the even elements, then the odd
// ones) rotates the bits of the index right by one, so log2(groups) unzips of
// 16-bit lanes do it. Other group counts (head_dim 96, 160, ...) gather.
void transpose_scales(const uint16_t* v_scales, int n, int groups, float* scale_t) {
  const int count = n * groups;
  if ((groups & (groups - 1)) == 0) {
    constexpr int kMaxVectors = kQ8VnniChunk * kMaxGroups / 32;  // of 32 scales
    const int vectors = kQ8VnniChunk * groups / 32;                // even: groups >= 1
    __m512i seq[2][kMaxVectors];
    for (int k = 0; k < vectors; ++k) {
      const int left = count - 32 * k;
      const __mmask32 lanes = left >= 32 ? ~__mmask32{0} : left > 0 ? (__mmask32{1} << left) - 1 : __mmask32{0};
      seq[0][k] = _mm512_maskz_loadu_epi16(lanes, v_scales + 32 * k);
    }
    const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                                          24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
    int at = 0;
    for (int unzips = __builtin_ctz(unsigned(groups)); unzips > 0; --unzips, at ^= 1) {
      for (int k = 0; k < vectors / 2; ++k) {
        seq[at ^ 1][k] = _mm512_permutex2var_epi16(seq[at][2 * k], even, seq[at][2 * k + 1]);
        seq[at ^ 1][vectors / 2 + k] = _mm512_permutex2var_epi16(seq[at][2 * k], odd, seq[at][2 * k + 1]);
      }
    }
    for (int k = 0; k < vectors; ++k) {
      _mm512_store_ps(scale_t + 32 * k, _mm512_cvtph_ps(_mm512_castsi512_si256(seq[at][k])));
      _mm512_store_ps(scale_t + 32 * k + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(seq[at][k], 1)));
    }
    return;
  }
  alignas(64) float widened[kQ8VnniChunk * kMaxGroups];  // [j][grp], zero from n
  for (int i = 0; i < kQ8VnniChunk * groups; i += 16) {
    _mm512_store_ps(widened + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first_lanes(count - i), v_scales + i)));
  }
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(groups));
  for (int grp = 0; grp < groups; ++grp) {
    for (int j = 0; j < kQ8VnniChunk; j += 16) {
      _mm512_store_ps(scale_t + grp * kQ8VnniChunk + j, _mm512_i32gather_ps(rows, widened + j * groups + grp, 4));
    }
  }
}

// P.V of the chunk for the G heads from h0 (accumulate_q8_avx512_vnni):
// their weight codes for every group, then each group's sums.
template <int G>
void accumulate_heads(const PieceArgs& a, int h0, const float* p, int p_stride, int n, int lead, const int8_t* v,
                      const float* scale_t, float* acc, LinePrefetch& prefetch) {
  const int groups = a.head_dim / kGroup;
  alignas(64) uint8_t bytes[G][kMaxGroups][kWeightBytes];
  float unit[G][kMaxGroups];
  weight_codes<G>(p + size_t(h0) * p_stride, p_stride, scale_t, groups, n, lead, bytes, unit);
  for (int grp = 0; grp < groups; ++grp) {
    const uint8_t* group_bytes[G];
    float group_unit[G];
    for (int i = 0; i < G; ++i) group_bytes[i] = bytes[i][grp], group_unit[i] = unit[i][grp];
    accumulate_group<G>(a, h0, n, lead, v, group_bytes, group_unit, grp * kGroup, acc, prefetch);
  }
}

}  // namespace

void accumulate_q8_avx512_vnni(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                               const uint16_t* v_scales, float* acc, LinePrefetch& prefetch) {
  const int groups = args.head_dim / kGroup;
  alignas(64) float scale_t[kMaxGroups * kQ8VnniChunk];
  prefetch_step(prefetch, sizeof(uint16_t) * size_t(n) * size_t(groups));
  transpose_scales(v_scales, n, groups, scale_t);
  for_head_groups(args.g, [&](auto heads, int h0) {
    accumulate_heads<decltype(heads)::value>(args, h0, p, p_stride, n, lead, v, scale_t, acc, prefetch);
  });
}

void score_q8_avx512_vnni(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n,
                          float* scores, int score_stride, LinePrefetch& prefetch) {
  for_head_groups(args.g, [&](auto heads, int h0) {
    score_heads<decltype(heads)::value>(args, h0, k_t, k_scales, n, scores + size_t(h0) * score_stride, score_stride,
                                        prefetch);
  });
}

}  // namespace longctx::cpu::detail
