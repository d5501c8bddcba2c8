// The group kernels of quant_dot_x86.h (quant_matmul.h: kRows8, kRows16):
// included at its end, in the same compilation, so they share its helpers
// (Rows, load256, prefetch_group_ahead, kOffsetLog2, by_rows) and define the
// entries LONGCTX_QDOT8_ENTRY and, where the ISA has AVX-512 VNNI,
// LONGCTX_QDOT16_ENTRY.
#pragma once

#include <algorithm>

namespace longctx::cpu::detail {
namespace {

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
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
  static F add_ps(F a, F b) { return _mm512_add_ps(a, b); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
};
#endif

// A group of V::kLanes weight rows of Q4_0 or Q8_0 (G rows below) against
// kRows activation rows. A block's codes are 8 chunks of four values (Q4_0:
// chunk c's low nibbles are values 4c..4c+3, its high nibbles 16 + 4c on;
// Q8_0: chunk c is values 4c..4c+3), each multiplied with the same four
// activation codes broadcast to every lane; they go in unsigned as above,
// the offset times the block's activation sum (minus_sum32) taken back out
// (as the start of the dots' sums where those are int32), or under the sign
// trick (V256 without VNNI only). Then one product applies the G rows' scales.
template <class V, GgmlType kType, int kRows>
void group_block32(const uint8_t* group, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  static_assert(kType == GgmlType::kQ4_0 || kType == GgmlType::kQ8_0);
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kG = V::kLanes;
  constexpr int kChunks = kType == GgmlType::kQ4_0 ? 4 : 8;  // vector loads of codes per block
  constexpr int64_t kBlockBytes = kG * (2 + 4 * kChunks);    // G scales, then the codes
  constexpr int kChains = kRows == 1 ? 2 : 1;
  // Up to four rows each sum a block in two chains (eight dependent products
  // would wait on each other); eight rows' chains interleave, and two each
  // would not fit the registers beside the codes and sums.
  constexpr int kDotChains = kRows > 4 ? 1 : 2;
  // A dot chain may start at the offset's correction where its lanes are
  // int32 sums (exact byte dots), not int16 runs.
  constexpr bool kStartAtOffset = kOffsetLog2<kType> >= 0 && (kType != GgmlType::kQ4_0 || kExactByteDots);
  static_assert(kDotChains == 2 || kExactByteDots, "one chain of int16 runs would overflow");
  const int64_t nb = acts.k / 32;
  const Rows<kRows> rows(acts, r0);
  F acc[kChains][kRows];
  for (int c = 0; c < kChains; ++c)
    for (int j = 0; j < kRows; ++j) acc[c][j] = V::zero_ps();
  const auto add_block = [&](int64_t b, int c) {
    const uint8_t* blk = group + b * kBlockBytes;
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_group_ahead(blk + line);
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
    I dot[kRows][kDotChains];
    // Row j's values at base + j * stride: one base register per array, not a pointer per row.
    const int8_t* a_codes = rows.q[0] + 32 * b;
    const int32_t* a_minus = rows.minus_sum32[0] + b;
    const float* a_d = rows.d[0] + b;
    for (int j = 0; j < kRows; ++j) {
      dot[j][0] = kStartAtOffset ? V::set1(a_minus[j * nb] << kOffsetLog2<kType>) : V::zero();
      if constexpr (kDotChains == 2) dot[j][1] = V::zero();
    }
    for (int t = 0; t < 8; ++t)
      for (int j = 0; j < kRows; ++j) {  // the rows' products of a chunk do not wait on each other
        int32_t four;
        std::memcpy(&four, a_codes + j * acts.k + 4 * t, 4);
        const I s = V::set1(four);
        I& d = dot[j][t % kDotChains];
        if constexpr (kSignTrick<kType>) {
          d = V::dot(d, V::sign(codes[t], codes[t]), V::sign(s, codes[t]));
        } else if constexpr (kType == GgmlType::kQ4_0) {
          d = V::nibble_dot(d, codes[t], s);
        } else {
          d = V::dot(d, codes[t], s);
        }
      }
    for (int j = 0; j < kRows; ++j) {
      I sum = dot[j][0];
      if constexpr (kDotChains == 2)
        sum = kType == GgmlType::kQ4_0 ? V::runs_sum(sum, dot[j][1]) : V::add(sum, dot[j][1]);
      if constexpr (kOffsetLog2<kType> >= 0 && !kStartAtOffset)
        sum = V::add(sum, V::set1(a_minus[j * nb] << kOffsetLog2<kType>));
      acc[c][j] = V::fma(V::cvt(sum), V::mul(d_w, V::bcast(a_d + j * nb)), acc[c][j]);
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
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_group_ahead(blk + line);
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
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_group_ahead(blk + line);
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

// Q2_K or Q3_K (kThreeBit) in a group of G = V::kLanes rows (V512 only). A
// group's block:
//   Q2_K  the scale bytes (word w of row r in lane r: sub-blocks 4 w.., scale
//         in the low nibble, min in the high one), the 2-bit codes (word u:
//         qs bytes 4 u..), d, dmin (f16);
//   Q3_K  hmask (word v: row bytes 4 v..), the 2-bit codes, the three words
//         of the 6-bit scales (stored + 32), d.
// Sub-block s = 8 h + 2 j + c (values 128 h + 32 j + 16 c ..) takes, for
// chunk t < 4, bits 2j, 2j + 1 of qs word 8 h + 4 c + t, and for Q3_K bit 4
// h + j of hmask word 4 c + t as bit 2: unsigned codes 0..3 or 0..7. Each
// sub-block's dots (Q3_K: started at -4 times the activations' sum of 16,
// sum16) go into the block's fp32 sum times d and the lane's scale. Q2_K's
// mins multiply the sums of 16 two sub-blocks at a time: lane r holds the
// mins of sub-blocks s - 1 and s as an int16 pair, and one vpdpwssd adds
// their products with the pair of sums.
template <class V, bool kThreeBit, int kRows>
void group_q2_3_k(const uint8_t* group, const ActRows& acts, int64_t r0, float* y, int64_t ldy) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kG = V::kLanes;
  constexpr int64_t kBlockBytes = kG * (kThreeBit ? 110 : 84);
  const int64_t nb = acts.k / 256;
  const Rows<kRows> rows(acts, r0);
  const I low2 = V::set1_8(0x03), bit2 = V::set1_8(0x04), low4 = V::set1(0x0F);
  F acc[kRows];
  for (int j = 0; j < kRows; ++j) acc[j] = V::zero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    for (int64_t line = 0; line < kBlockBytes; line += 64) prefetch_group_ahead(blk + line);
    const uint8_t* hmask = blk;  // Q3_K
    const uint8_t* qs = blk + (kThreeBit ? 32 : 16) * kG;
    const uint8_t* sc = kThreeBit ? blk + 96 * kG : blk;
    I sc_words[4];  // Q3_K: three
    for (int w = 0; w < (kThreeBit ? 3 : 4); ++w) sc_words[w] = V::load(sc + 4 * kG * w);
    const F d = V::f16s(blk + (kThreeBit ? 108 : 80) * kG);
    const F dmin = kThreeBit ? V::zero_ps() : V::f16s(blk + 82 * kG);  // Q2_K
    F block_sum[kRows];
    I mins[kRows];  // Q2_K
    for (int j = 0; j < kRows; ++j) {
      block_sum[j] = V::zero_ps();
      mins[j] = V::zero();
    }
#pragma GCC unroll 16  // shift counts become constants
    for (int s = 0; s < 16; ++s) {
      const int h = s / 8, jj = (s % 8) / 2, c = s % 2;
      I scale;
      if constexpr (kThreeBit) {
        // Low 4 bits in byte s % 4 of word (s / 4) % 2 (the low nibble for s < 8), top 2 bits at bit 2 (s / 4) of
        // byte s % 4 of the third word.
        const I low = V::and_(V::srli32(sc_words[(s / 4) % 2], 8 * (s % 4) + 4 * (s / 8)), low4);
        const I top = V::and_(V::srli32(sc_words[2], 8 * (s % 4) + 2 * (s / 4)), V::set1(0x03));
        scale = V::add(V::or_(low, V::slli32(top, 4)), V::set1(-32));
      } else {
        scale = V::and_(V::srli32(sc_words[s / 4], 8 * (s % 4)), low4);
      }
      const F d_scale = V::mul(d, V::cvt(scale));
      I dot[kRows];
      for (int j = 0; j < kRows; ++j) dot[j] = kThreeBit ? V::set1(-4 * rows.sum16[j][16 * b + s]) : V::zero();
      const int bit = 4 * h + jj;  // Q3_K: of the hmask bytes, moved to bit 2
      for (int t = 0; t < 4; ++t) {
        I u = V::and_(V::srli16(V::load(qs + 4 * kG * (8 * h + 4 * c + t)), 2 * jj), low2);
        if constexpr (kThreeBit) {
          const I hm = V::load(hmask + 4 * kG * (4 * c + t));
          u = V::or_and(u, bit >= 2 ? V::srli16(hm, bit - 2) : V::slli16(hm, 2 - bit), bit2);
        }
        for (int j = 0; j < kRows; ++j) {
          int32_t four;
          std::memcpy(&four, rows.q[j] + 256 * b + 16 * s + 4 * t, 4);
          dot[j] = V::dot(dot[j], u, V::set1(four));
        }
      }
      for (int j = 0; j < kRows; ++j) block_sum[j] = V::fma(V::cvt(dot[j]), d_scale, block_sum[j]);
      if (!kThreeBit && s % 2 == 1) {
        // The mins of sub-blocks s - 1 and s (the high nibbles of bytes (s - 1) % 4 and s % 4 of the word) as an
        // int16 pair: bits 0..3 and 16..19.
        const I word = sc_words[s / 4];
        const I lo = V::and_(V::srli32(word, 8 * ((s - 1) % 4) + 4), low4);
        const I hi = V::and_(s % 4 == 1 ? V::slli32(word, 4) : V::srli32(word, 12), V::set1(0x000F0000));
        const I min_pair = V::or_(lo, hi);
        for (int j = 0; j < kRows; ++j) {
          int32_t sums;
          std::memcpy(&sums, rows.sum16[j] + 16 * b + s - 1, 4);
          mins[j] = V::pair_dot(mins[j], min_pair, V::set1(sums));
        }
      }
    }
    for (int j = 0; j < kRows; ++j) {
      const F da = V::bcast(rows.d[j] + b);
      acc[j] = V::fma(block_sum[j], da, acc[j]);
      if constexpr (!kThreeBit) acc[j] = V::fnma(V::cvt(mins[j]), V::mul(dmin, da), acc[j]);
    }
  }
  for (int j = 0; j < kRows; ++j) V::store(y + j * ldy, acc[j]);
}

// ---- the group table ---------------------------------------------------------------

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

// The group kernels of Q4_0 and the k-quants take eight activation rows at
// once on 512-bit vectors, whose 32 registers hold their runs: one unpacking
// of the codes then serves twice the dots (one thread, hot, Xeon EMR, against
// four rows: Q4_K 1.18x, Q5_K 1.29x, Q6_K 1.28x, Q4_0 1.08-1.10x). On 256-bit
// vectors (AVX2: 16 registers) four, and for Q8_0, whose eight code vectors a
// block beside eight rows' sums made GCC spill (0.95x).
template <class V>
constexpr int kRowsAtOnce = V::kLanes == 16 ? kQuantGroupMaxRows : kQuantMaxRows;

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
template <class V, bool kThreeBit>
struct GroupQ23KKernel {
  template <int kRows>
  struct K {
    static void run(const uint8_t* group, const ActRows& a, int64_t r0, float* y, int64_t ldy) {
      group_q2_3_k<V, kThreeBit, kRows>(group, a, r0, y, ldy);
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
}  // namespace

// Q5_K and Q6_K only in groups of 16: in groups of 8 on 256-bit vectors
// their 512-row products did not outrun oneDNN's f32 tiles (Xeon EMR), and
// on AVX2 alone their codes (up to 63) overflow the int16 runs of nibble_dot.
// Q2_K's and Q3_K's kernels were written for 512-bit vectors only (Q3_K's
// takes AVX-512's ternary logic), the one width where a group kernel outran
// its row kernel and f32 tiles for the other k-quants.
template <class V>
QuantGroupFn group_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return by_group_rows<GroupBlock32Kernel<V, GgmlType::kQ4_0>::template K, kRowsAtOnce<V>>;
    case GgmlType::kQ8_0: return by_group_rows<GroupBlock32Kernel<V, GgmlType::kQ8_0>::template K, kQuantMaxRows>;
    case GgmlType::kQ4_K: return by_group_rows<GroupQK45Kernel<V, false>::template K, kRowsAtOnce<V>>;
    default: break;
  }
  if constexpr (V::kLanes == 16) {
    if (type == GgmlType::kQ5_K) return by_group_rows<GroupQK45Kernel<V, true>::template K, kRowsAtOnce<V>>;
    if (type == GgmlType::kQ6_K) return by_group_rows<GroupQ6KKernel<V>::template K, kRowsAtOnce<V>>;
    if (type == GgmlType::kQ2_K) return by_group_rows<GroupQ23KKernel<V, false>::template K, kRowsAtOnce<V>>;
    if (type == GgmlType::kQ3_K) return by_group_rows<GroupQ23KKernel<V, true>::template K, kRowsAtOnce<V>>;
  }
  return nullptr;
}

QuantGroupFn LONGCTX_QDOT8_ENTRY(GgmlType type) { return group_kernel<V256>(type); }
#ifdef LONGCTX_QDOT16_ENTRY
QuantGroupFn LONGCTX_QDOT16_ENTRY(GgmlType type) { return group_kernel<V512>(type); }
#endif

}  // namespace longctx::cpu::detail
