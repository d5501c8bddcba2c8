// attention_q8_x86.h's q8_0 scores on AVX-VNNI (the VEX-encoded vpdpbusd:
// Alder Lake and later Intel client CPUs, Sapphire Rapids, Zen 5), which sums
// a lane's four products of unsigned by signed bytes into int32 in one
// instruction. As in the AVX512-VNNI kernel, the key codes go in with their
// sign bit flipped (k + 128), the query codes as they are, and each group's
// sum starts at -128 * (sum of the query codes), so it ends at the exact
// integer sum of q * k.
//
// And q8_0 P.V, as the AVX512-VNNI kernel computes it, bit for bit
// (attention_kernel.h): the weights as 16-bit codes, each quad's four going
// in as their low bytes in one sum and their high bytes in another, the V
// codes as they are. Without VNNI, P.V stays on the Highway code's f32 FMAs:
// vpmaddwd and an add do the 16 products of two FMAs, so an integer P.V on
// AVX2 measured no faster.
#include "attention_q8_x86.h"

namespace longctx::cpu::detail {
namespace {

struct AvxVnniDot {
  // 16 tokens a tile: each broadcast of q serves two loads.
  static constexpr int kKeyVectors = 2;
  static __m256i keys(__m256i codes) { return _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80))); }
  static __m256i start(int32_t q_code_sum) { return _mm256_set1_epi32(-128 * q_code_sum); }
  // In asm because GCC 12 copies the sum of every _mm256_dpbusd_avx_epi32 in
  // and out of a spare register (two moves per product). {vex}: the EVEX
  // form would need AVX512-VL, which the CPUs this kernel is for lack.
  static void dot(__m256i& sum, __m256i unsigned_bytes, __m256i signed_bytes) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(sum) : "x"(unsigned_bytes), "x"(signed_bytes));
  }
  static void add(__m256i& sum, __m256i keys, __m256i, __m256i q) { dot(sum, keys, q); }
};

constexpr int kMaxDim = 512;  // the largest head_dim a KVStore takes

// Token slots of a chunk's weights: the lead of its first quad of tokens
// (< 4), its n <= kQ8VnniChunk tokens, zeros to a whole vector after them.
constexpr int kWeightSlots = kQ8VnniChunk + 2 * kQ8Lanes;
constexpr int kWeightBytes = kWeightSlots / kQuad * 8;  // a head's packed weights: 8 bytes per quad

// The weights of P.V for G heads and one group of channels as 16-bit codes:
// slot lead + j holds token j's w[i][j] = p[i][j] * scale[j] ~ code *
// unit[i], the other slots 0 (attention_kernel.h). Per quad of slots q,
// bytes[i][8 q ..] holds the four codes' low bytes, then their high bytes
// (what vpdpbusd broadcasts per quad). scale holds whole vectors, 0 past n.
// The weights stay at token offsets in memory (a vector stored is loaded back
// whole) and move to their slots in registers.
template <int G>
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
  // Per 128-bit lane (a quad's 32-bit codes): bytes 0, 4, 8, 12, then 1, 5, 9, 13.
  const __m256i split = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                         0, 4, 8, 12, 1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1);
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
      const __m256i quads = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(code, split), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(&bytes[i][k * 2 * 8]), _mm256_castsi256_si128(quads));
    }
  }
}

// acc rows (G heads, channels [c0, c0 + 32)) += P.V over the chunk's tokens:
// quads of tokens from the one that holds the first. Per quad, a load gives
// 8 channels' four codes, a channel to a lane, and vpdpbusd sums them times
// the quad's high bytes of the weights in one sum, times the low bytes in
// another: high * 256 + low is the exact integer sum of code * v
// (|sum| <= 33 quads * 4 * 65535 * 127 < 2^31).
template <int G>
void accumulate_group(const PieceArgs& a, int h0, const float* p, int p_stride, int n, int lead, const int8_t* v,
                      const float* scale, int c0, float* acc, LinePrefetch& prefetch) {
  alignas(32) uint8_t bytes[G][kWeightBytes];
  float unit[G];
  weight_codes<G>(p + size_t(h0) * p_stride, p_stride, scale, n, lead, bytes, unit);
  const int dim = a.head_dim;
  const int quads = (lead + n + kQuad - 1) / kQuad;
  for (int c = c0; c < c0 + kGroup; c += kQ8Lanes) {
    __m256i high[G], low[G];
    for (int i = 0; i < G; ++i) high[i] = low[i] = _mm256_setzero_si256();
    // The tile's reads at once: a step per quad costs more than it computes.
    prefetch_step(prefetch, size_t(quads) * kQuad * kQ8Lanes);
    for (int q = 0; q < quads; ++q) {
      const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + (size_t(q) * dim + c) * kQuad));
      for (int i = 0; i < G; ++i) {
        int32_t low_bytes, high_bytes;
        std::memcpy(&low_bytes, &bytes[i][8 * q], sizeof(low_bytes));
        std::memcpy(&high_bytes, &bytes[i][8 * q + sizeof(low_bytes)], sizeof(high_bytes));
        AvxVnniDot::dot(high[i], _mm256_set1_epi32(high_bytes), codes);
        AvxVnniDot::dot(low[i], _mm256_set1_epi32(low_bytes), codes);
      }
    }
    for (int i = 0; i < G; ++i) {
      float* out = acc + size_t(h0 + i) * dim + c;
      const __m256i total = _mm256_add_epi32(_mm256_slli_epi32(high[i], 8), low[i]);
      _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(unit[i]), _mm256_loadu_ps(out)));
    }
  }
}

void accumulate_q8(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
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
      accumulate_group<decltype(heads)::value>(args, h0, p, p_stride, n, lead, v, scale, grp * kGroup, acc, prefetch);
    });
  }
}

}  // namespace

void score_q8_avx_vnni(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                       int score_stride, LinePrefetch& prefetch) {
  score_q8_x86<AvxVnniDot>(args, k_t, k_scales, n, scores, score_stride, prefetch);
}

void accumulate_q8_avx_vnni(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                            const uint16_t* v_scales, float* acc, LinePrefetch& prefetch) {
  accumulate_q8(args, p, p_stride, n, lead, v, v_scales, acc, prefetch);
}

}  // namespace longctx::cpu::detail
