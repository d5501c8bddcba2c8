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
// share each unpacked weight block.
#include <immintrin.h>

#include <algorithm>
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

// ---- groups of rows (quant_matmul.h: kRows8, kRows16) ----------------------------

// The vector a group kernel works on: lane r (int32 or float) is row r of
// the group, so a group has as many rows as a vector has lanes. V256 is 8
// rows on every x86 ISA here; V512 is 16 rows on AVX-512 VNNI.
//
// Runs of up to eight 4-value dots of nibble codes (<= 15) by int8
// activations go into one vector, lane i adding its four products each time
// (nibble_dot). With vpdpbusd a run sums in int32. vpmaddubsw's pair sums
// (<= 2 x 15 x 127) instead add up in int16, exact over a run (8 x 3810 <
// 2^15), and widen once at its end (runs_sum, run_times): a vpmaddwd and an
// add fewer per dot.
struct V256 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kLanes = 8;
  static I load(const void* p) { return load256(p); }
  static I zero() { return _mm256_setzero_si256(); }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I set1_8(int8_t v) { return _mm256_set1_epi8(v); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I xor_(I a, I b) { return _mm256_xor_si256(a, b); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I srli16(I a, int n) { return _mm256_srli_epi16(a, n); }
  static I srli32(I a, int n) { return _mm256_srli_epi32(a, n); }
  static I slli32(I a, int n) { return _mm256_slli_epi32(a, n); }
  static I sign(I a, I b) { return _mm256_sign_epi8(a, b); }
  static I dot(I acc, I u, I s) { return add_dot_u8s8(acc, u, s); }
  static I nibble_dot(I run, I u, I s) {
    if constexpr (kExactByteDots) return add_dot_u8s8(run, u, s);
    else return _mm256_add_epi16(run, _mm256_maddubs_epi16(u, s));
  }
  static I runs_sum(I a, I b) {
    if constexpr (kExactByteDots) return _mm256_add_epi32(a, b);
    else return _mm256_madd_epi16(_mm256_add_epi16(a, b), _mm256_set1_epi16(1));
  }
  // A run's int32 sums times `scale` (int32 lanes below 2^15).
  static I run_times(I run, I scale) {
    if constexpr (kExactByteDots) return _mm256_mullo_epi32(run, scale);
    else return _mm256_madd_epi16(run, _mm256_or_si256(scale, _mm256_slli_epi32(scale, 16)));
  }
  // acc + the products of the int16 pairs of a and b, summed per lane.
  static I pair_dot(I acc, I a, I b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
  static F f16s(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F zero_ps() { return _mm256_setzero_ps(); }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add_ps(F a, F b) { return _mm256_add_ps(a, b); }
  static void store(float* p, F a) { _mm256_storeu_ps(p, a); }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
struct V512 {
  using I = __m512i;
  using F = __m512;
  static constexpr int kLanes = 16;
  static I load(const void* p) { return _mm512_loadu_si512(p); }
  static I zero() { return _mm512_setzero_si512(); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I set1_8(int8_t v) { return _mm512_set1_epi8(v); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I srli16(I a, int n) { return _mm512_srli_epi16(a, unsigned(n)); }
  static I slli16(I a, int n) { return _mm512_slli_epi16(a, unsigned(n)); }
  static I srli32(I a, int n) { return _mm512_srli_epi32(a, unsigned(n)); }
  static I slli32(I a, int n) { return _mm512_slli_epi32(a, unsigned(n)); }
  static I srai32(I a, int n) { return _mm512_srai_epi32(a, unsigned(n)); }
  // a | (b & c) in one vpternlogd.
  static I or_and(I a, I b, I c) { return _mm512_ternarylogic_epi32(a, b, c, 0xF8); }
  // codes + 0x10 in the bytes where bits & mask is not 0 (a fifth code bit).
  static I add_0x10_where(I codes, I bits, I mask) {
    return _mm512_mask_add_epi8(codes, _mm512_test_epi8_mask(bits, mask), codes, _mm512_set1_epi8(0x10));
  }
  static I dot(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static I nibble_dot(I run, I u, I s) { return _mm512_dpbusd_epi32(run, u, s); }
  static I runs_sum(I a, I b) { return _mm512_add_epi32(a, b); }
  static I run_times(I run, I scale) { return _mm512_mullo_epi32(run, scale); }
  static I pair_dot(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
  static F f16s(const uint8_t* p) { return _mm512_cvtph_ps(load256(p)); }
  static F zero_ps() { return _mm512_setzero_ps(); }
  static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add_ps(F a, F b) { return _mm512_add_ps(a, b); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
};
#endif

// A group of V::kLanes weight rows of Q4_0 or Q8_0 (G rows below) against
// kRows activation rows. A block's codes are 8 chunks of four values (Q4_0:
// chunk c's low nibbles are values 4c..4c+3, its high nibbles 16 + 4c on;
// Q8_0: chunk c is values 4c..4c+3), each multiplied with the same four
// activation codes broadcast to every lane; they go in unsigned as above,
// the offset times the block's activation sum (minus_sum32) added back after
// the dots, or under the sign trick (V256 without VNNI only). Then one
// product applies the G rows' scales.
template <class V, GgmlType kType, int kRows>
void group_block32(const uint8_t* group, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  static_assert(kType == GgmlType::kQ4_0 || kType == GgmlType::kQ8_0);
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kG = V::kLanes;
  constexpr int kChunks = kType == GgmlType::kQ4_0 ? 4 : 8;  // vector loads of codes per block
  constexpr int64_t kBlockBytes = kG * (2 + 4 * kChunks);    // G scales, then the codes
  constexpr int kChains = kRows == 1 ? 2 : 1;
  const int64_t nb = acts.k / 32;
  const Rows<kRows> rows(acts, r0);
  F acc[kChains][kRows];
  for (int c = 0; c < kChains; ++c)
    for (int j = 0; j < kRows; ++j) acc[c][j] = V::zero_ps();
  const auto add_block = [&](int64_t b, int c) {
    const uint8_t* blk = group + b * kBlockBytes;
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_ahead(blk + line);
    const uint8_t* code_bytes = blk + 2 * kG;
    I codes[8];  // chunk t: values 4t..4t+3 of the G rows
    if constexpr (kType == GgmlType::kQ4_0) {
      const I low4 = V::set1_8(0x0F);
      for (int t = 0; t < 4; ++t) {
        const I both = V::load(code_bytes + 4 * kG * t);
        codes[t] = V::and_(both, low4);
        codes[t + 4] = V::and_(V::srli16(both, 4), low4);
      }
    } else {
      for (int t = 0; t < 8; ++t) {
        const I q = V::load(code_bytes + 4 * kG * t);
        codes[t] = kSignTrick<kType> ? q : V::xor_(q, V::set1_8(static_cast<int8_t>(0x80)));
      }
    }
    const F d_w = V::f16s(blk);
    for (int j = 0; j < kRows; ++j) {
      const int8_t* a = rows.q[j] + 32 * b;
      // Two chains: eight dependent dot products would wait on each other.
      I dot[2] = {V::zero(), V::zero()};
      for (int t = 0; t < 8; ++t) {
        int32_t four;
        std::memcpy(&four, a + 4 * t, 4);
        const I s = V::set1(four);
        if constexpr (kSignTrick<kType>) {
          dot[t & 1] = V::dot(dot[t & 1], V::sign(codes[t], codes[t]), V::sign(s, codes[t]));
        } else if constexpr (kType == GgmlType::kQ4_0) {
          dot[t & 1] = V::nibble_dot(dot[t & 1], codes[t], s);
        } else {
          dot[t & 1] = V::dot(dot[t & 1], codes[t], s);
        }
      }
      I sum = kType == GgmlType::kQ4_0 ? V::runs_sum(dot[0], dot[1]) : V::add(dot[0], dot[1]);
      if constexpr (kOffsetLog2<kType> >= 0) sum = V::add(sum, V::set1(rows.minus_sum32[j][b] << kOffsetLog2<kType>));
      acc[c][j] = V::fma(V::cvt(sum), V::mul(d_w, V::bcast(rows.d[j] + b)), acc[c][j]);
    }
  };
  int64_t b = 0;
  for (; b + kChains <= nb; b += kChains) {
    add_block(b, 0);
    if constexpr (kChains == 2) add_block(b + 1, 1);
  }
  if (b < nb) add_block(b, 0);
  for (int j = 0; j < kRows; ++j) {
    F sum = acc[0][j];
    for (int c = 1; c < kChains; ++c) sum = V::add_ps(sum, acc[c][j]);
    V::store(y + j * ldy, sum);
  }
}

// Q4_K or Q5_K (kFiveBit; V512 only) in a group of G = V::kLanes rows. A
// group's block: d and dmin of the G rows (f16), the three 4-byte words of
// their 6-bit scales and mins (word i of row r in lane r), Q5_K's fifth bits
// (word t holds, in bit s of each byte, those of values 4 t.. of sub-block
// s), then the codes: chunk 8 p + t holds, as low nibbles, values 64 p + 4
// t.. of sub-block 2 p and, as high nibbles, values 64 p + 32 + 4 t.. of
// sub-block 2 p + 1. Per sub-block the eight dots leave row r's sum in lane
// r, and one multiply by the lane's scale (run_times) adds it to the
// block's int32 sum; the mins multiply the activation sub-block sums
// (minus_sum32_pairs) two sub-blocks at a time.
template <class V, bool kFiveBit, int kRows>
void group_qk_4_5(const uint8_t* group, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kG = V::kLanes;
  // Five-bit codes would overflow the int16 runs of V256's nibble_dot on AVX2.
  static_assert(!kFiveBit || V::kLanes == 16);
  constexpr int64_t kBlockBytes = kG * (kFiveBit ? 176 : 144);
  constexpr int kPairs = kRows == 1 ? 4 : kRows == 2 ? 2 : 1;
  // Past four activation rows, a pass takes one sub-block of a pair: the
  // runs of both for every row would not fit in the 32 registers.
  constexpr int kNibs = kRows > 4 ? 1 : 2;
  const int64_t nb = acts.k / 256;
  const Rows<kRows> rows(acts, r0);
  const I low4 = V::set1_8(0x0F);
  F acc[kRows];
  for (int j = 0; j < kRows; ++j) acc[j] = V::zero_ps();
  // Byte i of each lane as an int32 lane.
  const auto byte_of = [](I v, int i) { return V::and_(V::srli32(v, 8 * i), V::set1(0xFF)); };
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_ahead(blk + line);
    // unpack_k_scales on G rows at once.
    const I w0 = V::load(blk + 4 * kG), w2 = V::load(blk + 12 * kG);
    const I six = V::set1_8(0x3F), two = V::set1_8(0x03);
    const I scales_lo = V::and_(w0, six);
    const I scales_hi = V::or_(V::and_(w2, low4), V::slli32(V::and_(V::srli32(w0, 6), two), 4));
    I sum[kRows];
    for (int j = 0; j < kRows; ++j) sum[j] = V::zero();
    const uint8_t* high_bits = blk + 16 * kG;  // Q5_K
    const uint8_t* codes = blk + (kFiveBit ? 48 : 16) * kG;
    // kPairs pairs of sub-blocks at once: with one activation row, a pair's
    // two chains of eight dependent dots would wait on their latency.
    for (int p0 = 0; p0 < 4; p0 += kPairs) {
#pragma GCC unroll 2  // GCC left these two loops rolled once the passes split: 0.93x on four rows
      for (int n0 = 0; n0 < 2; n0 += kNibs) {
        I dot[kPairs][kNibs][kRows];
        for (int i = 0; i < kPairs; ++i)
          for (int n = 0; n < kNibs; ++n)
            for (int j = 0; j < kRows; ++j) dot[i][n][j] = V::zero();
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
          for (int i = 0; i < kPairs; ++i) {
            const int p = p0 + i;
            const I q = V::load(codes + 4 * kG * (8 * p + t));
            for (int n = 0; n < kNibs; ++n) {
              const int nib = n0 + n;  // 0: sub-block 2 p (low nibbles), 1: 2 p + 1
              I u = V::and_(nib == 0 ? q : V::srli16(q, 4), low4);
              if constexpr (kFiveBit)
                u = V::add_0x10_where(u, V::load(high_bits + 4 * kG * t),
                                      V::set1_8(static_cast<int8_t>((1 + nib) << (2 * p))));
              for (int j = 0; j < kRows; ++j) {
                int32_t four;
                std::memcpy(&four, rows.q[j] + 256 * b + 64 * p + 32 * nib + 4 * t, 4);
                dot[i][n][j] = V::nibble_dot(dot[i][n][j], u, V::set1(four));
              }
            }
          }
        }
        for (int i = 0; i < kPairs; ++i) {
          const int p = p0 + i;
          const I scales = p < 2 ? scales_lo : scales_hi;
          for (int n = 0; n < kNibs; ++n) {
            const I sc = byte_of(scales, 2 * (p % 2) + n0 + n);
            for (int j = 0; j < kRows; ++j) sum[j] = V::add(sum[j], V::run_times(dot[i][n][j], sc));
          }
        }
      }
    }
    const F d = V::f16s(blk);
    for (int j = 0; j < kRows; ++j) acc[j] = V::fma(V::cvt(sum[j]), V::mul(d, V::bcast(rows.d[j] + b)), acc[j]);
    // The mins of sub-blocks 0 and 2, 1 and 3, 4 and 6, 5 and 7 as int16
    // pairs against the activations' (minus_sum32_pairs): a vpmaddwd per two
    // sub-blocks, where a vpmulld took one each.
    const I w1 = V::load(blk + 8 * kG);
    const I mins_lo = V::and_(w1, six);
    const I mins_hi = V::or_(V::and_(V::srli32(w2, 4), low4), V::slli32(V::and_(V::srli32(w1, 6), two), 4));
    const I low_bytes = V::set1(0x00FF00FF);
    const I min_pairs[4] = {V::and_(mins_lo, low_bytes), V::srli16(mins_lo, 8), V::and_(mins_hi, low_bytes),
                            V::srli16(mins_hi, 8)};
    const F dmin = V::f16s(blk + 2 * kG);
    for (int j = 0; j < kRows; ++j) {
      I mins = V::zero();
      for (int w = 0; w < 4; ++w)
        mins = V::pair_dot(mins, min_pairs[w], V::set1(rows.minus_sum32_pairs[j][4 * b + w]));
      acc[j] = V::fma(V::cvt(mins), V::mul(dmin, V::bcast(rows.d[j] + b)), acc[j]);
    }
  }
  for (int j = 0; j < kRows; ++j) V::store(y + j * ldy, acc[j]);
}

// Q6_K in a group of G = V::kLanes rows (V512 only). A group's block: the
// low nibbles (word u of row r in lane r: row bytes 4 u..), the high bit
// pairs, the 16 int8 scales (word w: scales 4 w..), then d (f16). Half h
// of the block takes words 16 h + t and 16 h + 8 + t of the nibbles and 8 h
// + t of the bit pairs (t < 8) for values 128 h + 32 c + 4 t.. (c < 4),
// whose scale is 8 h + 2 c + t / 4, so a run of four chunks t covers one
// scale's 16 values for each c. The codes are q + 32: each run's sum starts
// at -32 times the activation run's sum (sum16), then goes into the block's
// fp32 sum times d and the lane's scale: a conversion and an FMA, which
// share the ports with the dots less than a vpmulld does (1.07-1.11x with
// eight activation rows, hot, Xeon EMR).
template <class V, int kRows>
void group_q6_k(const uint8_t* group, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kG = V::kLanes;
  constexpr int64_t kBlockBytes = kG * 210;
  // Runs of both halves of a scale's chunks at once for one or two
  // activation rows: four chains of four dependent dots would wait on their latency.
  constexpr int kRuns = kRows <= 2 ? 2 : 1;
  // Past four activation rows, a pass takes the runs of one chunk position
  // c: the runs of all four for every row would not fit in the 32 registers.
  constexpr int kCs = kRows > 4 ? 1 : 4;
  const int64_t nb = acts.k / 256;
  const Rows<kRows> rows(acts, r0);
  const I low4 = V::set1_8(0x0F), bits45 = V::set1_8(0x30);
  // The codes of chunk position c: a nibble of q0 (c 0, 2) or q1 (1, 3) and a bit pair of hb.
  const auto codes_of = [&](I q0, I q1, I hb, int c) {
    switch (c) {
      case 0: return V::or_and(V::and_(q0, low4), V::slli16(hb, 4), bits45);
      case 1: return V::or_and(V::and_(q1, low4), V::slli16(hb, 2), bits45);
      case 2: return V::or_and(V::and_(V::srli16(q0, 4), low4), hb, bits45);
      default: return V::or_and(V::and_(V::srli16(q1, 4), low4), V::srli16(hb, 2), bits45);
    }
  };
  F acc[kRows];
  for (int j = 0; j < kRows; ++j) acc[j] = V::zero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_ahead(blk + line);
    const uint8_t* nibbles = blk;
    const uint8_t* pairs = blk + 128 * kG;
    const uint8_t* scales = blk + 192 * kG;
    const F d = V::f16s(blk + 208 * kG);
    F block_sum[kRows];
    for (int j = 0; j < kRows; ++j) block_sum[j] = V::zero_ps();
    for (int h = 0; h < 2; ++h) {
      for (int run0 = 0; run0 < 2; run0 += kRuns) {
#pragma GCC unroll 4  // the runs of each chunk position c in registers, not on the stack
        for (int c0 = 0; c0 < 4; c0 += kCs) {
          I dot[kRuns][kCs][kRows];
          for (int i = 0; i < kRuns; ++i)
            for (int c = 0; c < kCs; ++c)
              for (int j = 0; j < kRows; ++j)
                dot[i][c][j] = V::set1(-32 * rows.sum16[j][16 * b + 8 * h + 2 * (c0 + c) + run0 + i]);
          for (int t4 = 0; t4 < 4; ++t4) {
            for (int i = 0; i < kRuns; ++i) {
              const int t = 4 * (run0 + i) + t4;
              const I q0 = V::load(nibbles + 4 * kG * (16 * h + t));
              const I q1 = V::load(nibbles + 4 * kG * (16 * h + 8 + t));
              const I hb = V::load(pairs + 4 * kG * (8 * h + t));
              for (int c = 0; c < kCs; ++c) {
                const I u = codes_of(q0, q1, hb, c0 + c);
                for (int j = 0; j < kRows; ++j) {
                  int32_t four;
                  std::memcpy(&four, rows.q[j] + 256 * b + 128 * h + 32 * (c0 + c) + 4 * t, 4);
                  dot[i][c][j] = V::dot(dot[i][c][j], u, V::set1(four));
                }
              }
            }
          }
          for (int i = 0; i < kRuns; ++i) {
            for (int c = 0; c < kCs; ++c) {
              const int g = 8 * h + 2 * (c0 + c) + run0 + i;  // the scale of the run
              const I scale = V::srai32(V::slli32(V::load(scales + 4 * kG * (g / 4)), 24 - 8 * (g % 4)), 24);
              const F d_scale = V::mul(d, V::cvt(scale));
              for (int j = 0; j < kRows; ++j) block_sum[j] = V::fma(V::cvt(dot[i][c][j]), d_scale, block_sum[j]);
            }
          }
        }
      }
    }
    for (int j = 0; j < kRows; ++j) acc[j] = V::fma(block_sum[j], V::bcast(rows.d[j] + b), acc[j]);
  }
  for (int j = 0; j < kRows; ++j) V::store(y + j * ldy, acc[j]);
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
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    for (int j = 0; j < kRows; ++j) {
      const float da = rows.d[j][b];
      const __m256i mins = group_sums_times(rows.sum16[j] + 16 * b, mins16);
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[j]), _mm256_set1_ps(d * da), acc[j]);
      acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(dmin * da), acc[j]);
    }
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
    // The codes are q + 32: subtract 32 * scale_g * (sum of group g).
    const __m256i scales16 = _mm256_cvtepi8_epi16(scales8);
    const float d = f16_at(blk + 208);
    for (int j = 0; j < kRows; ++j) {
      const __m256i offset = group_sums_times(rows.sum16[j] + 16 * b, scales16);
      const __m256i dot = _mm256_sub_epi32(dots[j], _mm256_slli_epi32(offset, 5));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * rows.d[j][b]), acc[j]);
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

// A group kernel taking up to kMaxRows activation rows at once (4 or
// kQuantGroupMaxRows), n_rows of them in calls of that many and the rest.
template <template <int> class K, int kMaxRows>
void by_group_rows(const uint8_t* group, const ActRows& acts, int64_t r0, int n_rows, float* y, int64_t ldy) {
  static_assert(kMaxRows == kQuantMaxRows || kMaxRows == kQuantGroupMaxRows);
  if constexpr (kMaxRows == kQuantGroupMaxRows) {
    if (n_rows == kQuantGroupMaxRows) return K<kQuantGroupMaxRows>::run(group, acts, r0, y, ldy);
  }
  for (int j = 0; j < n_rows; j += kQuantMaxRows)
    by_rows<K>(group, acts, r0 + j, std::min(kQuantMaxRows, n_rows - j), y + j * ldy, ldy);
}

// The k-quant group kernels take eight activation rows at once on 512-bit
// vectors, whose 32 registers hold their runs: one unpacking of the codes
// then serves twice the dots (one thread, hot, Xeon EMR: Q4_K 1.09x, Q5_K
// 1.23-1.29x, Q6_K 1.15-1.21x four rows). On 256-bit vectors (AVX2: 16 registers),
// and for Q4_0 and Q8_0, whose per-row scale work is as large as the
// unpacking (0.9-1.0x), four.
template <class V>
constexpr int kKQuantRowsAtOnce = V::kLanes == 16 ? kQuantGroupMaxRows : kQuantMaxRows;

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
template <class V, GgmlType kType>
struct GroupBlock32Kernel {
  template <int kRows>
  struct K {
    static void run(const uint8_t* group, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
      group_block32<V, kType, kRows>(group, a, r0, y, ldy);
    }
  };
};
template <class V, bool kFiveBit>
struct GroupQK45Kernel {
  template <int kRows>
  struct K {
    static void run(const uint8_t* group, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
      group_qk_4_5<V, kFiveBit, kRows>(group, a, r0, y, ldy);
    }
  };
};
template <class V>
struct GroupQ6KKernel {
  template <int kRows>
  struct K {
    static void run(const uint8_t* group, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
      group_q6_k<V, kRows>(group, a, r0, y, ldy);
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
    case GgmlType::kQ4_K: return by_rows<QK45Kernel<false>::K>;
    case GgmlType::kQ5_K: return by_rows<QK45Kernel<true>::K>;
    case GgmlType::kQ6_K: return by_rows<Q6KKernel>;
    default: return nullptr;
  }
}

// Q5_K and Q6_K only in groups of 16: in groups of 8 on 256-bit vectors
// their 512-row products did not outrun oneDNN's f32 tiles (Xeon EMR), and
// on AVX2 alone their codes (up to 63) overflow the int16 runs of nibble_dot.
template <class V>
QuantGroupFn group_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return by_group_rows<GroupBlock32Kernel<V, GgmlType::kQ4_0>::template K, kQuantMaxRows>;
    case GgmlType::kQ8_0: return by_group_rows<GroupBlock32Kernel<V, GgmlType::kQ8_0>::template K, kQuantMaxRows>;
    case GgmlType::kQ4_K: return by_group_rows<GroupQK45Kernel<V, false>::template K, kKQuantRowsAtOnce<V>>;
    default: break;
  }
  if constexpr (V::kLanes == 16) {
    if (type == GgmlType::kQ5_K) return by_group_rows<GroupQK45Kernel<V, true>::template K, kKQuantRowsAtOnce<V>>;
    if (type == GgmlType::kQ6_K) return by_group_rows<GroupQ6KKernel<V>::template K, kKQuantRowsAtOnce<V>>;
  }
  return nullptr;
}

QuantGroupFn LONGCTX_QDOT8_ENTRY(GgmlType type) { return group_kernel<V256>(type); }
#ifdef LONGCTX_QDOT16_ENTRY
QuantGroupFn LONGCTX_QDOT16_ENTRY(GgmlType type) { return group_kernel<V512>(type); }
#endif

}  // namespace longctx::cpu::detail
