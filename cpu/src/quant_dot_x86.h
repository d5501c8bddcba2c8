// x86 SIMD kernels of quant_matmul.h, compiled once per ISA (with that ISA's
// compiler flags): the including file defines LONGCTX_QDOT_ENTRY and
// LONGCTX_QDOT8_ENTRY (the names of its table functions in quant_dot.h, for
// kRows and kRows8 weights, on 256-bit vectors), LONGCTX_QDOT16_ENTRY where
// it has AVX-512 VNNI (kRows16 weights, on 512-bit vectors) and,
// before including this file, in namespace longctx::cpu::detail { namespace {
//   __m256i add_dot_u8s8(__m256i acc, __m256i u, __m256i s): lane i = acc[i] +
//   the sum of u[4i + t] * s[4i + t] (t < 4), for unsigned bytes u and signed
//   bytes s in [-127, 127], exact for u <= 128;
//   constexpr bool kExactByteDots: exact for every u (vpdpbusd; vpmaddubsw's
//   int16 pair sums saturate past 32767).
// The instructions multiply unsigned by signed bytes, so the weight codes go
// in unsigned (the 32-value blocks below say how signed codes get there).
// The kernels have internal linkage, so each compilation keeps its own.
// Everything else is shared: the k-quants multiply their codes (<= 63) with
// the int8 activations by pairs (vpmaddubsw) and apply their sub-block scales
// in int32 by vpmaddwd, so one conversion to fp32 per block is all the
// floating point there is.
//
// Up to kQuantMaxRows activation rows (a group kernel: kQuantGroupMaxRows)
// share each unpacked weight block. The kernels for weights in groups of
// rows are in quant_dot_groups_x86.h, which this file includes at its end.
#include <immintrin.h>

#include <cstring>

#include "quant_dot.h"

namespace longctx::cpu::detail {
namespace {

// The kRows activation rows from r0, located once per weight row: located
// per block, they kept an idiv (a.k / a.block) in the block loops, which held
// the 32-value kernels to ~8 cycles a block whatever the type.
template <int kRows>
struct Rows {
  const int8_t* q[kRows];
  const float* d[kRows];
  const float* dsum[kRows];          // block 32; null for block 256
  const int32_t* minus_sum4[kRows];  // block 32; null for block 256
  const int32_t* minus_sum32[kRows];
  const int16_t* sum16[kRows];       // block 256; null for block 32
  const int32_t* minus_sum32_pairs[kRows];  // block 256; null for block 32
  Rows(const ActRows& a, int64_t r0) {
    for (int j = 0; j < kRows; ++j) {
      const int64_t r = r0 + j;
      q[j] = a.q + r * a.k;
      d[j] = a.d + r * (a.k / a.block);
      dsum[j] = a.block == 32 ? a.dsum + r * (a.k / 32) : nullptr;
      minus_sum4[j] = a.block == 32 ? a.minus_sum4 + r * (a.k / 4) : nullptr;
      minus_sum32[j] = a.minus_sum32 + r * (a.k / 32);
      sum16[j] = a.block == 256 ? a.sum16 + r * (a.k / 16) : nullptr;
      minus_sum32_pairs[j] = a.block == 256 ? a.minus_sum32_pairs + r * (a.k / 256) * 4 : nullptr;
    }
  }
};

inline float f16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The 32 nibbles of 16 bytes as bytes: low nibbles (values 0..15), then high.
// Both halves load the 16 bytes (vbroadcasti128, no shuffle), the high half
// shifted right by 4.
inline __m256i unpack_nibbles16(const uint8_t* p) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

// Byte i = 0x10 where bit i of `bits` is set, else 0.
inline __m256i bits_to_0x10(uint32_t bits) {
  // Byte i takes byte i / 8 of `bits` (within each 128-bit lane, which both hold all four), then tests bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Byte i = 0x10 where (byte i of hb) & mask is set.
inline __m256i mask_to_0x10(__m256i hb, __m256i mask) {
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hb, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// The weight line kWeightPrefetchAhead bytes after p (quant_dot.h).
inline void prefetch_ahead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kWeightPrefetchAhead, _MM_HINT_T0);
}
// The group kernels' weight line kGroupPrefetchAhead bytes after p, into L2 (quant_dot.h).
inline void prefetch_group_ahead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kGroupPrefetchAhead, _MM_HINT_T1);
}

// ---- 32-value blocks ---------------------------------------------------------

// A block's codes go in unsigned, u = q + 2^kOffsetLog2 (Q4_0: q + 8 is the
// nibble itself, Q5_0: q + 16, Q8_0: q + 128 = q ^ 0x80), and the offset comes
// back out in int32: each lane's sum starts at -2^kOffsetLog2 times the sum of
// its four activation codes (ActRows::minus_sum4, shifted), so it ends at the
// exact sum of q * a. Q8_0 where the byte pairs go through vpmaddubsw, whose
// int16 sums (up to 2 * 255 * 127) would saturate, keeps the sign trick
// instead: |q| (<= 128) against the activation with q's sign. Q4_1 and Q5_1
// codes are unsigned already; their m_w * d_a * sum(a) is added per block.
template <GgmlType kType>
constexpr int kOffsetLog2 = kType == GgmlType::kQ4_0   ? 3
                            : kType == GgmlType::kQ5_0 ? 4
                            : kType == GgmlType::kQ8_0 && kExactByteDots ? 7
                                                                         : -1;
template <GgmlType kType>
constexpr bool kSignTrick = kType == GgmlType::kQ8_0 && !kExactByteDots;
template <GgmlType kType>
constexpr bool kHasMin = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;

// The 32 codes of a block in value order: unsigned (u above), or Q8_0's
// signed q under the sign trick.
template <GgmlType kType>
inline __m256i block_codes(const uint8_t* b) {
  if constexpr (kType == GgmlType::kQ4_0) {
    return unpack_nibbles16(b + 2);
  } else if constexpr (kType == GgmlType::kQ4_1) {
    return unpack_nibbles16(b + 4);
  } else if constexpr (kType == GgmlType::kQ5_0 || kType == GgmlType::kQ5_1) {
    constexpr int kHigh = kHasMin<kType> ? 4 : 2;
    uint32_t high;
    std::memcpy(&high, b + kHigh, 4);
    return _mm256_or_si256(unpack_nibbles16(b + kHigh + 4), bits_to_0x10(high));
  } else {
    static_assert(kType == GgmlType::kQ8_0);
    const __m256i q = load256(b + 2);
    return kSignTrick<kType> ? q : _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));
  }
}

template <GgmlType kType, int64_t kBlockBytes, int kRows>
void rows_block32(const uint8_t* w, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  // One row's sum in one register would wait on the FMA's latency block
  // after block: a single row alternates two chains.
  constexpr int kChains = kRows == 1 ? 2 : 1;
  const int64_t nb = acts.k / 32;
  const Rows<kRows> rows(acts, r0);
  __m256 acc[kChains][kRows];
  float mins[kChains][kRows];  // Q4_1, Q5_1: sum over blocks of m_w * d_a * sum(a)
  for (int c = 0; c < kChains; ++c) {
    for (int j = 0; j < kRows; ++j) {
      acc[c][j] = _mm256_setzero_ps();
      mins[c][j] = 0.f;
    }
  }
  // Block b into chain c (a constant: an index known only at run time kept
  // the chains in memory).
  const auto add_block = [&](int64_t b, int c) {
    const uint8_t* blk = w + b * kBlockBytes;
    const __m256i q = block_codes<kType>(blk);
    const __m256i u = kSignTrick<kType> ? _mm256_sign_epi8(q, q) : q;
    uint16_t d_bits;
    std::memcpy(&d_bits, blk, 2);
    const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(d_bits)));
    const float m = kHasMin<kType> ? f16_at(blk + 2) : 0.f;
    for (int j = 0; j < kRows; ++j) {
      __m256i a = load256(rows.q[j] + 32 * b);
      __m256i start = _mm256_setzero_si256();
      if constexpr (kSignTrick<kType>) a = _mm256_sign_epi8(a, q);
      if constexpr (kOffsetLog2<kType> >= 0) {
        start = _mm256_slli_epi32(load256(rows.minus_sum4[j] + 8 * b), kOffsetLog2<kType>);
      }
      const __m256 ds = _mm256_mul_ps(d, _mm256_broadcast_ss(rows.d[j] + b));
      acc[c][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(add_dot_u8s8(start, u, a)), ds, acc[c][j]);
      if constexpr (kHasMin<kType>) mins[c][j] += m * rows.dsum[j][b];
    }
  };
  int64_t b = 0;
  for (; b + kChains <= nb; b += kChains) {
    prefetch_ahead(w + b * kBlockBytes);
    add_block(b, 0);
    if constexpr (kChains == 2) add_block(b + 1, 1);
  }
  if (b < nb) add_block(b, 0);
  for (int j = 0; j < kRows; ++j) {
    __m256 sum = acc[0][j];
    float min_sum = mins[0][j];
    for (int c = 1; c < kChains; ++c) {
      sum = _mm256_add_ps(sum, acc[c][j]);
      min_sum += mins[c][j];
    }
    y[j * ldy] = hsum(sum) + min_sum;
  }
}

// ---- k-quants ------------------------------------------------------------------

// The eight 6-bit scales and mins of a Q4_K / Q5_K block as bytes
// (quant_dot_generic.cpp k_scale_min spells out the packing).
struct KScales {
  uint8_t scale[8];
  uint8_t min[8];
};

inline KScales unpack_k_scales(const uint8_t* sc) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, sc, 4);
  std::memcpy(&w1, sc + 4, 4);
  std::memcpy(&w2, sc + 8, 4);
  const uint32_t scales_lo = w0 & 0x3F3F3F3Fu;
  const uint32_t mins_lo = w1 & 0x3F3F3F3Fu;
  const uint32_t scales_hi = (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4);
  const uint32_t mins_hi = ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4);
  KScales out;
  std::memcpy(out.scale, &scales_lo, 4);
  std::memcpy(out.scale + 4, &scales_hi, 4);
  std::memcpy(out.min, &mins_lo, 4);
  std::memcpy(out.min + 4, &mins_hi, 4);
  return out;
}

// Lane i (int32) = sum of the activation pair sums of 16 values times factor
// of their group: madd of the 16 int16 group sums with 16 int16 factors.
inline __m256i group_sums_times(const int16_t* sum16, __m256i factors16) {
  return _mm256_madd_epi16(load256(sum16), factors16);
}

// The end of a 256-value block of k-quants whose codes went in unsigned, for
// each activation row j (its d_a = rows.d[j][b]):
// with mins (Q4_K, Q5_K, Q2_K): acc += d d_a dots - dmin d_a sum_g min_g sum16_g;
template <int kRows>
inline void add_block_with_mins(__m256 (&acc)[kRows], const __m256i (&dots)[kRows], const Rows<kRows>& rows,
                                int64_t b, __m256i mins16, float d, float dmin) {
  for (int j = 0; j < kRows; ++j) {
    const float da = rows.d[j][b];
    const __m256i mins = group_sums_times(rows.sum16[j] + 16 * b, mins16);
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[j]), _mm256_set1_ps(d * da), acc[j]);
    acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(dmin * da), acc[j]);
  }
}
// with codes q + 2^kOffsetLog2 (Q6_K 32, Q3_K 4) under signed scales:
// acc += d d_a (dots - 2^kOffsetLog2 sum_g scale_g sum16_g).
template <int kOffsetLog2, int kRows>
inline void add_block_with_offset(__m256 (&acc)[kRows], const __m256i (&dots)[kRows], const Rows<kRows>& rows,
                                  int64_t b, __m128i scales8, float d) {
  const __m256i scales16 = _mm256_cvtepi8_epi16(scales8);
  for (int j = 0; j < kRows; ++j) {
    const __m256i offset = group_sums_times(rows.sum16[j] + 16 * b, scales16);
    const __m256i dot = _mm256_sub_epi32(dots[j], _mm256_slli_epi32(offset, kOffsetLog2));
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * rows.d[j][b]), acc[j]);
  }
}

template <bool kFiveBit, int kRows>
void rows_qk_4_5(const uint8_t* w, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlockBytes = kFiveBit ? 176 : 144;
  const int64_t nb = acts.k / 256;
  const Rows<kRows> rows(acts, r0);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[kRows];
  for (int j = 0; j < kRows; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBlockBytes;
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_ahead(blk + line);
    const KScales ks = unpack_k_scales(blk + 4);
    const uint8_t* qs = blk + (kFiveBit ? 48 : 16);
    __m256i hb = _mm256_setzero_si256();
    if constexpr (kFiveBit) hb = load256(blk + 16);
    __m256i dots[kRows];
    for (int j = 0; j < kRows; ++j) dots[j] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i q = load256(qs + 32 * p);
      __m256i u_lo = _mm256_and_si256(q, low4);
      __m256i u_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFiveBit) {
        u_lo = _mm256_or_si256(u_lo, mask_to_0x10(hb, _mm256_set1_epi8(static_cast<char>(1 << (2 * p)))));
        u_hi = _mm256_or_si256(u_hi, mask_to_0x10(hb, _mm256_set1_epi8(static_cast<char>(2 << (2 * p)))));
      }
      const __m256i sc_lo = _mm256_set1_epi16(ks.scale[2 * p]);
      const __m256i sc_hi = _mm256_set1_epi16(ks.scale[2 * p + 1]);
      for (int j = 0; j < kRows; ++j) {
        const int8_t* a = rows.q[j] + 256 * b + 64 * p;
        const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(u_lo, load256(a)), sc_lo);
        const __m256i hi = _mm256_madd_epi16(_mm256_maddubs_epi16(u_hi, load256(a + 32)), sc_hi);
        dots[j] = _mm256_add_epi32(dots[j], _mm256_add_epi32(lo, hi));
      }
    }
    // Each min applies to two groups of 16: duplicate the bytes, widen to int16.
    const __m128i mins8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(ks.min));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins8, mins8));
    add_block_with_mins(acc, dots, rows, b, mins16, f16_at(blk), f16_at(blk + 2));
  }
  for (int j = 0; j < kRows; ++j) y[j * ldy] = hsum(acc[j]);
}

template <int kRows>
void rows_q6_k(const uint8_t* w, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  const int64_t nb = acts.k / 256;
  const Rows<kRows> rows(acts, r0);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  __m256 acc[kRows];
  for (int j = 0; j < kRows; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * 210;
    for (int line = 0; line < 210; line += 64) prefetch_ahead(blk + line);
    const __m128i scales8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    __m256i dots[kRows];
    for (int j = 0; j < kRows; ++j) dots[j] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(blk + 64 * half);
      const __m256i ql1 = load256(blk + 64 * half + 32);
      const __m256i qh = load256(blk + 128 + 32 * half);
      for (int k = 0; k < 4; ++k) {
        const __m256i ql = k & 1 ? ql1 : ql0;
        const __m256i low = _mm256_and_si256(k < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), low2);
        const __m256i u = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
        // Values 0..15 of the run use scale 8 half + 2k, values 16..31 the next.
        const int group = 8 * half + 2 * k;
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(static_cast<int8_t>(blk[192 + group + 1])),
                                            _mm_set1_epi16(static_cast<int8_t>(blk[192 + group])));
        for (int j = 0; j < kRows; ++j) {
          const int8_t* a = rows.q[j] + 256 * b + 128 * half + 32 * k;
          dots[j] = _mm256_add_epi32(dots[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, load256(a)), sc));
        }
      }
    }
    add_block_with_offset<5>(acc, dots, rows, b, scales8, f16_at(blk + 208));  // codes q + 32
  }
  for (int j = 0; j < kRows; ++j) y[j * ldy] = hsum(acc[j]);
}

// Q2_K and Q3_K: 16 sub-blocks of 16 values, each with its own scale. The
// 2-bit codes of values 32 j .. 32 j + 31 of half h are bits 2j, 2j + 1 of
// the 32 bytes at qs + 32 h: one shift and mask gives two sub-blocks (8 h +
// 2 j in the low 128-bit lane, 8 h + 2 j + 1 in the high one), and vpmaddwd
// applies their scales as Q6_K's. Their int16 lanes come from a vector of
// the 16 scale bytes by vpshufb: placed in the high byte of each lane, the
// low one zero, and shifted down 8 (arithmetic), so a signed byte stays signed.
inline __m256i scale_pair16(__m256i scale_bytes, int s) {
  const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(((s + 1) << 8) | 0x80)),
                                        _mm_set1_epi16(static_cast<int16_t>((s << 8) | 0x80)));
  return _mm256_srai_epi16(_mm256_shuffle_epi8(scale_bytes, pick), 8);
}

// Q3_K's 16 six-bit scales (stored + 32; quant_dot_generic.cpp) as signed bytes.
inline __m128i unpack_q3_k_scales(const uint8_t* sc) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, sc, 4);
  std::memcpy(&w1, sc + 4, 4);
  std::memcpy(&w2, sc + 8, 4);
  const uint32_t nib = 0x0F0F0F0Fu, two = 0x03030303u;
  const __m128i stored = _mm_setr_epi32(static_cast<int>((w0 & nib) | ((w2 & two) << 4)),
                                        static_cast<int>((w1 & nib) | (((w2 >> 2) & two) << 4)),
                                        static_cast<int>(((w0 >> 4) & nib) | (((w2 >> 4) & two) << 4)),
                                        static_cast<int>(((w1 >> 4) & nib) | (((w2 >> 6) & two) << 4)));
  return _mm_sub_epi8(stored, _mm_set1_epi8(32));
}

// Q2_K: scales (scale | min << 4 per sub-block), qs[64], d, dmin; value d *
// scale * q - dmin * min. Q3_K (kThreeBit): hmask[32], qs[64], scales[12],
// d; value d * (scale - 32) * (code - 4), the code's bit 2 at bit 4 h + j of
// hmask[l] for value 32 j + l of half h (quant_dot_generic.cpp). Codes go in
// unsigned (Q3_K 0..7); the activations' sums of 16 (sum16) take back out
// Q2_K's mins, or Q3_K's offset -4 times each sub-block's scale.
template <bool kThreeBit, int kRows>
void rows_q2_3_k(const uint8_t* w, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlockBytes = kThreeBit ? 110 : 84;
  const int64_t nb = acts.k / 256;
  const Rows<kRows> rows(acts, r0);
  const __m256i low2 = _mm256_set1_epi8(0x03), bit2 = _mm256_set1_epi8(0x04);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256 acc[kRows];
  for (int j = 0; j < kRows; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBlockBytes;
    prefetch_ahead(blk);
    prefetch_ahead(blk + 64);
    // Q2_K: each byte's scale (low nibble) and min (high).
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
    const __m128i scales8 = kThreeBit ? unpack_q3_k_scales(blk + 96) : _mm_and_si128(packed, low4);
    const __m256i scales = _mm256_broadcastsi128_si256(scales8);
    const __m256i hmask = load256(blk);  // Q3_K
    const uint8_t* qs = blk + (kThreeBit ? 32 : 16);
    __m256i dots[kRows];
    for (int j = 0; j < kRows; ++j) dots[j] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(qs + 32 * h);
      for (int t = 0; t < 4; ++t) {
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * t), low2);
        if constexpr (kThreeBit) {
          const int bit = 4 * h + t;  // of hmask, moved to bit 2
          u = _mm256_or_si256(u, _mm256_and_si256(bit >= 2 ? _mm256_srli_epi16(hmask, bit - 2)
                                                           : _mm256_slli_epi16(hmask, 2 - bit),
                                                  bit2));
        }
        const __m256i sc = scale_pair16(scales, 8 * h + 2 * t);
        for (int j = 0; j < kRows; ++j) {
          const int8_t* a = rows.q[j] + 256 * b + 128 * h + 32 * t;
          dots[j] = _mm256_add_epi32(dots[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, load256(a)), sc));
        }
      }
    }
    if constexpr (kThreeBit) {
      add_block_with_offset<2>(acc, dots, rows, b, scales8, f16_at(blk + 108));  // codes q + 4
    } else {
      const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
      add_block_with_mins(acc, dots, rows, b, mins16, f16_at(blk + 80), f16_at(blk + 82));
    }
  }
  for (int j = 0; j < kRows; ++j) y[j * ldy] = hsum(acc[j]);
}

// ---- the table -------------------------------------------------------------------

template <template <int> class K>
void by_rows(const uint8_t* w, const ActRows& acts, int64_t r0, int n_rows, float* y, int64_t ldy) {
  switch (n_rows) {
    case 1: return K<1>::run(w, acts, r0, y, ldy);
    case 2: return K<2>::run(w, acts, r0, y, ldy);
    case 3: return K<3>::run(w, acts, r0, y, ldy);
    default: return K<4>::run(w, acts, r0, y, ldy);
  }
}

template <GgmlType kType, int64_t kBytes>
struct Block32Kernel {
  template <int kRows>
  struct K {
    static void run(const uint8_t* w, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
      rows_block32<kType, kBytes, kRows>(w, a, r0, y, ldy);
    }
  };
};
template <bool kFiveBit>
struct QK45Kernel {
  template <int kRows>
  struct K {
    static void run(const uint8_t* w, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
      rows_qk_4_5<kFiveBit, kRows>(w, a, r0, y, ldy);
    }
  };
};
template <bool kThreeBit>
struct Q23KKernel {
  template <int kRows>
  struct K {
    static void run(const uint8_t* w, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
      rows_q2_3_k<kThreeBit, kRows>(w, a, r0, y, ldy);
    }
  };
};
template <int kRows>
struct Q6KKernel {
  static void run(const uint8_t* w, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
    rows_q6_k<kRows>(w, a, r0, y, ldy);
  }
};

}  // namespace

QuantRowsFn LONGCTX_QDOT_ENTRY(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return by_rows<Block32Kernel<GgmlType::kQ4_0, 18>::K>;
    case GgmlType::kQ4_1: return by_rows<Block32Kernel<GgmlType::kQ4_1, 20>::K>;
    case GgmlType::kQ5_0: return by_rows<Block32Kernel<GgmlType::kQ5_0, 22>::K>;
    case GgmlType::kQ5_1: return by_rows<Block32Kernel<GgmlType::kQ5_1, 24>::K>;
    case GgmlType::kQ8_0: return by_rows<Block32Kernel<GgmlType::kQ8_0, 34>::K>;
    case GgmlType::kQ2_K: return by_rows<Q23KKernel<false>::K>;
    case GgmlType::kQ3_K: return by_rows<Q23KKernel<true>::K>;
    case GgmlType::kQ4_K: return by_rows<QK45Kernel<false>::K>;
    case GgmlType::kQ5_K: return by_rows<QK45Kernel<true>::K>;
    case GgmlType::kQ6_K: return by_rows<Q6KKernel>;
    default: return nullptr;
  }
}

}  // namespace longctx::cpu::detail

#include "quant_dot_groups_x86.h"
