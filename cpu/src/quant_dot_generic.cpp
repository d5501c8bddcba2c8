// Portable kernels of quant_matmul.h: the same integer sums and fp32 scale
// products as the SIMD kernels, written one value at a time. They run where
// no SIMD path exists and pin down what every ISA computes.
#include <cstring>

#include "longctx/core/dtype.h"
#include "quant_dot.h"

namespace longctx::cpu::detail {
namespace {

const int8_t* row_q(const ActRows& a, int64_t r) { return a.q + r * a.k; }
const float* row_d(const ActRows& a, int64_t r) { return a.d + r * (a.k / a.block); }
const float* row_dsum(const ActRows& a, int64_t r) { return a.dsum + r * (a.k / 32); }
const int16_t* row_sum16(const ActRows& a, int64_t r) { return a.sum16 + r * (a.k / 16); }

float f16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_bits_to_f32(bits);
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block: bytes
// 0..3 hold scales 0..3, bytes 4..7 mins 0..3 in their low 6 bits; for
// j >= 4 the low 4 bits come from byte j + 4 (scale: low nibble, min: high
// nibble) and the top 2 bits from the top bits of bytes j - 4 and j.
void k_scale_min(const uint8_t* sc, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = sc[j] & 63;
    *min = sc[j + 4] & 63;
  } else {
    *scale = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
    *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
}

// Element i (0..31) of a 32-value block: low nibbles hold 0..15, high 16..31.
int nibble(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 0x0F : qs[i - 16] >> 4; }

// The types of 32-value blocks: code q_i (unsigned, or signed for Q8_0) with
// value d * (q_i - offset) + m.
struct Block32 {
  float d, m;
  int offset;
  int q[32];
};

Block32 decode_q4_0(const uint8_t* b) {
  Block32 out{f16_at(b), 0.f, 8, {}};
  for (int i = 0; i < 32; ++i) out.q[i] = nibble(b + 2, i);
  return out;
}
Block32 decode_q4_1(const uint8_t* b) {
  Block32 out{f16_at(b), f16_at(b + 2), 0, {}};
  for (int i = 0; i < 32; ++i) out.q[i] = nibble(b + 4, i);
  return out;
}
Block32 decode_q5(const uint8_t* b, bool has_min) {
  const uint8_t* qh = b + (has_min ? 4 : 2);
  uint32_t high;
  std::memcpy(&high, qh, 4);
  Block32 out{f16_at(b), has_min ? f16_at(b + 2) : 0.f, has_min ? 0 : 16, {}};
  for (int i = 0; i < 32; ++i) out.q[i] = nibble(qh + 4, i) | static_cast<int>(((high >> i) & 1u) << 4);
  return out;
}
Block32 decode_q5_0(const uint8_t* b) { return decode_q5(b, false); }
Block32 decode_q5_1(const uint8_t* b) { return decode_q5(b, true); }
Block32 decode_q8_0(const uint8_t* b) {
  Block32 out{f16_at(b), 0.f, 0, {}};
  for (int i = 0; i < 32; ++i) out.q[i] = static_cast<int8_t>(b[2 + i]);
  return out;
}

template <Block32 (*kDecode)(const uint8_t*), int64_t kBlockBytes>
void rows_block32(const uint8_t* w, const ActRows& acts, int64_t r0, int n_rows, float* y, int64_t ldy) {
  const int64_t nb = acts.k / 32;
  for (int j = 0; j < n_rows; ++j) {
    const int8_t* a = row_q(acts, r0 + j);
    const float* da = row_d(acts, r0 + j);
    const float* dsum = row_dsum(acts, r0 + j);
    float sum = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const Block32 blk = kDecode(w + b * kBlockBytes);
      int32_t dot = 0;
      for (int i = 0; i < 32; ++i) dot += blk.q[i] * a[32 * b + i];
      sum += blk.d * da[b] * static_cast<float>(dot) + (blk.m - blk.d * static_cast<float>(blk.offset)) * dsum[b];
    }
    y[j * ldy] = sum;
  }
}

// Q2_K: 16 bytes of scales (scale | min << 4 per sub-block of 16 values),
// qs[64], d, dmin (f16); value d * scale * q - dmin * min. Q3_K
// (kThreeBit): hmask[32], qs[64], 12 bytes of 6-bit scales, d (f16); value
// d * (scale - 32) * (q - 4), scale s of 16 values with its low 4 bits in
// the low (s < 8) or high nibble of byte s % 8 and its top 2 bits at bit 2
// (s / 4) of byte 8 + s % 4. Both: bits 2j, 2j + 1 of qs[32 h + l] are the
// code of value 32 j + l of half h; Q3_K adds bit i / 32 of hmask[i % 32] as
// bit 2 of value i's.
int crumb(const uint8_t* qs, int i) { return (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3; }

template <bool kThreeBit>
void rows_q2_3_k(const uint8_t* w, const ActRows& acts, int64_t r0, int n_rows, float* y, int64_t ldy) {
  constexpr int64_t kBlockBytes = kThreeBit ? 110 : 84;
  const int64_t nb = acts.k / 256;
  for (int j = 0; j < n_rows; ++j) {
    const int8_t* a = row_q(acts, r0 + j);
    const float* da = row_d(acts, r0 + j);
    const int16_t* sum16 = row_sum16(acts, r0 + j);
    float sum = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * kBlockBytes;
      const uint8_t* qs = blk + (kThreeBit ? 32 : 16);
      int32_t scaled = 0, mins = 0;
      for (int s = 0; s < 16; ++s) {
        int32_t dot = 0;
        for (int i = 16 * s; i < 16 * s + 16; ++i) {
          int q = crumb(qs, i);
          if constexpr (kThreeBit) q |= ((blk[i % 32] >> (i / 32)) & 1) << 2;
          dot += q * a[256 * b + i];
        }
        if constexpr (kThreeBit) {
          const uint8_t* sc = blk + 96;
          const int scale = ((s < 8 ? sc[s] : sc[s - 8] >> 4) & 0x0F) | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4);
          scaled += (scale - 32) * (dot - 4 * sum16[16 * b + s]);
        } else {
          scaled += (blk[s] & 0x0F) * dot;
          mins += (blk[s] >> 4) * sum16[16 * b + s];
        }
      }
      if constexpr (kThreeBit) {
        sum += da[b] * f16_at(blk + 108) * static_cast<float>(scaled);
      } else {
        sum += da[b] * (f16_at(blk + 80) * static_cast<float>(scaled) - f16_at(blk + 82) * static_cast<float>(mins));
      }
    }
    y[j * ldy] = sum;
  }
}

// Q4_K / Q5_K: d, dmin (f16), 12 bytes of scales and mins, [Q5_K: qh[32]],
// qs[128]. Sub-blocks 2p and 2p + 1 share qs[32p .. 32p + 31] (low, high
// nibbles); Q5_K's fifth bit of element l of sub-block j is bit j of qh[l].
template <bool kFiveBit>
void rows_qk_4_5(const uint8_t* w, const ActRows& acts, int64_t r0, int n_rows, float* y, int64_t ldy) {
  constexpr int64_t kBlockBytes = kFiveBit ? 176 : 144;
  const int64_t nb = acts.k / 256;
  for (int j = 0; j < n_rows; ++j) {
    const int8_t* a = row_q(acts, r0 + j);
    const float* da = row_d(acts, r0 + j);
    const int16_t* sum16 = row_sum16(acts, r0 + j);
    float sum = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * kBlockBytes;
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + (kFiveBit ? 48 : 16);
      int32_t scaled = 0, mins = 0;
      for (int sub = 0; sub < 8; ++sub) {
        int scale, min;
        k_scale_min(blk + 4, sub, &scale, &min);
        int32_t dot = 0;
        for (int l = 0; l < 32; ++l) {
          const uint8_t byte = qs[32 * (sub / 2) + l];
          int q = sub % 2 == 0 ? byte & 0x0F : byte >> 4;
          if (kFiveBit) q |= ((qh[l] >> sub) & 1) << 4;
          dot += q * a[256 * b + 32 * sub + l];
        }
        scaled += scale * dot;
        mins += min * (sum16[16 * b + 2 * sub] + sum16[16 * b + 2 * sub + 1]);
      }
      sum += da[b] * (f16_at(blk) * static_cast<float>(scaled) - f16_at(blk + 2) * static_cast<float>(mins));
    }
    y[j * ldy] = sum;
  }
}

// Q6_K: ql[128], qh[64], 16 int8 scales (one per 16 values), d (f16). Each
// half of 128 values uses 64 bytes of ql and 32 of qh: value 32k + l (k < 4)
// takes its low bits from ql[l + 32 (k & 1)] (low nibble for k < 2) and its
// high two bits from bits 2k, 2k + 1 of qh[l]; code q - 32.
void rows_q6_k(const uint8_t* w, const ActRows& acts, int64_t r0, int n_rows, float* y, int64_t ldy) {
  const int64_t nb = acts.k / 256;
  for (int j = 0; j < n_rows; ++j) {
    const int8_t* a = row_q(acts, r0 + j);
    const float* da = row_d(acts, r0 + j);
    const int16_t* sum16 = row_sum16(acts, r0 + j);
    float sum = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * 210;
      const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
      int32_t total = 0;
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = blk + 64 * half;
        const uint8_t* qh = blk + 128 + 32 * half;
        for (int k = 0; k < 4; ++k) {
          for (int g = 0; g < 2; ++g) {
            int32_t dot = 0;
            for (int l = 16 * g; l < 16 * g + 16; ++l) {
              const uint8_t low_byte = ql[l + 32 * (k & 1)];
              const int q = (k < 2 ? low_byte & 0x0F : low_byte >> 4) | (((qh[l] >> (2 * k)) & 3) << 4);
              dot += q * a[256 * b + 128 * half + 32 * k + l];
            }
            const int group = 8 * half + 2 * k + g;
            total += scales[group] * (dot - 32 * sum16[16 * b + group]);
          }
        }
      }
      sum += da[b] * f16_at(blk + 208) * static_cast<float>(total);
    }
    y[j * ldy] = sum;
  }
}

}  // namespace

QuantRowsFn quant_rows_generic(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return rows_block32<decode_q4_0, 18>;
    case GgmlType::kQ4_1: return rows_block32<decode_q4_1, 20>;
    case GgmlType::kQ5_0: return rows_block32<decode_q5_0, 22>;
    case GgmlType::kQ5_1: return rows_block32<decode_q5_1, 24>;
    case GgmlType::kQ8_0: return rows_block32<decode_q8_0, 34>;
    case GgmlType::kQ2_K: return rows_q2_3_k<false>;
    case GgmlType::kQ3_K: return rows_q2_3_k<true>;
    case GgmlType::kQ4_K: return rows_qk_4_5<false>;
    case GgmlType::kQ5_K: return rows_qk_4_5<true>;
    case GgmlType::kQ6_K: return rows_q6_k;
    default: return nullptr;
  }
}

}  // namespace longctx::cpu::detail
