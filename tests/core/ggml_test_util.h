// Helpers for tests of GGML block types (core/ggml_types.h) and of the
// kernels that read them: reference f16/bf16 and block decoders written from
// the definitions and layouts, random well-formed blocks of every
// dequantizable type.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "error_message.h"
#include "longctx/core/error.h"
#include "longctx/core/ggml_types.h"

namespace longctx::testing {

// IEEE binary16 to double, from the definition (sign, 5-bit exponent with
// bias 15, 10-bit fraction; exponent 0 subnormal, 31 inf/NaN).
inline double ref_f16(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 10) & 31, fraction = bits & 1023;
  double magnitude;
  if (exponent == 0) magnitude = std::ldexp(fraction, -24);
  else if (exponent == 31) magnitude = fraction ? NAN : INFINITY;
  else magnitude = std::ldexp(1024 + fraction, exponent - 25);
  return sign ? -magnitude : magnitude;
}

// bfloat16 is the top half of an f32.
inline double ref_bf16(uint16_t bits) {
  const uint32_t f32_bits = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &f32_bits, 4);
  return value;
}

inline uint16_t read_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// ---- reference decoders, written from the block layouts: value of element
// i (0 <= i < block_elems) of the block at b, in double (exact: products of
// small integers and f16 numbers) ----

inline double nibble(uint8_t byte, bool high) { return high ? byte >> 4 : byte & 15; }

// Q4_0 / Q4_1 / Q5_0 / Q5_1: element i < 16 is the low nibble of qs[i], i >= 16
// the high nibble of qs[i - 16]; Q5 adds bit i of the 32-bit qh as bit 4.
inline double ref_q4_0(const uint8_t* b, int i) { return (nibble(b[2 + i % 16], i >= 16) - 8) * ref_f16(read_u16(b)); }
inline double ref_q4_1(const uint8_t* b, int i) {
  return nibble(b[4 + i % 16], i >= 16) * ref_f16(read_u16(b)) + ref_f16(read_u16(b + 2));
}
inline double ref_q5(const uint8_t* b, int i, bool has_min) {
  const uint8_t* qh = b + (has_min ? 4 : 2);
  const uint8_t* qs = qh + 4;
  const int high_bit = (qh[i / 8] >> (i % 8)) & 1;
  const double q = nibble(qs[i % 16], i >= 16) + 16 * high_bit;
  const double d = ref_f16(read_u16(b));
  return has_min ? q * d + ref_f16(read_u16(b + 2)) : (q - 16) * d;
}
inline double ref_q8_0(const uint8_t* b, int i) { return static_cast<int8_t>(b[2 + i]) * ref_f16(read_u16(b)); }

// Q2_K: scales[16], qs[64], d, dmin. Element i is in sub-block i / 16, whose
// byte scales[i / 16] holds the scale (low nibble) and min (high nibble); its
// 2-bit code is in qs[32 (i / 128) + i % 32] at bit 2 ((i % 128) / 32).
// Value d * scale * q - dmin * min.
inline int ref_crumb(const uint8_t* qs, int i) { return (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3; }
inline double ref_q2_k(const uint8_t* b, int i) {
  const int scale = b[i / 16] % 16, min = b[i / 16] / 16;
  return ref_f16(read_u16(b + 80)) * scale * ref_crumb(b + 16, i) - ref_f16(read_u16(b + 82)) * min;
}

// Q3_K: hmask[32], qs[64], scales[12], d. The low 2 bits of element i's
// code as Q2_K's; bit 2 is bit (i / 32) of hmask[i % 32]. Scale s (stored
// + 32, 6 bits): low 4 bits in the low (s < 8) or high nibble of
// scales[s % 8], high 2 bits at bit 2 (s / 4) of scales[8 + s % 4]. Value
// d * (scale - 32) * (q - 4).
inline int ref_q3_k_scale(const uint8_t* scales, int s) {
  const int low = s < 8 ? scales[s] % 16 : scales[s - 8] / 16;
  return low + 16 * ((scales[8 + s % 4] >> (2 * (s / 4))) % 4);
}
inline double ref_q3_k(const uint8_t* b, int i) {
  const int q = ref_crumb(b + 32, i) + 4 * ((b[i % 32] >> (i / 32)) & 1);
  return ref_f16(read_u16(b + 108)) * (ref_q3_k_scale(b + 96, i / 16) - 32) * (q - 4);
}

// Q4_K / Q5_K scales: sub-block s of 8; 6-bit scale and min of s: for s < 4
// the low 6 bits of scales[s] and scales[s + 4]; for s >= 4 the nibbles of
// scales[s + 4] (low: scale, high: min) with the top 2 bits of scales[s - 4]
// (scale) and scales[s] (min) above them.
inline void ref_k_scale_min(const uint8_t* scales, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = scales[s] % 64;
    *min = scales[s + 4] % 64;
  } else {
    *scale = scales[s + 4] % 16 + 16 * (scales[s - 4] / 64);
    *min = scales[s + 4] / 16 + 16 * (scales[s] / 64);
  }
}

// Q4_K: d, dmin, 12 bytes of scales, 128 of quants. Element i is in
// sub-block s = i / 32; 64-element chunk c = i / 64 uses qs[32c .. 32c + 31],
// low nibbles for its first 32 elements. Value d * scale * q - dmin * min.
inline double ref_q4_k(const uint8_t* b, int i) {
  int scale, min;
  ref_k_scale_min(b + 4, i / 32, &scale, &min);
  const double q = nibble(b[16 + 32 * (i / 64) + i % 32], (i / 32) % 2 == 1);
  return ref_f16(read_u16(b)) * scale * q - ref_f16(read_u16(b + 2)) * min;
}

// Q5_K: d, dmin, 12 bytes of scales as Q4_K, qh[32], qs[128]. The low 4 bits
// of element i sit in qs as Q4_K's nibbles; bit 4 is bit s = i / 32 of
// qh[i % 32].
inline double ref_q5_k(const uint8_t* b, int i) {
  int scale, min;
  ref_k_scale_min(b + 4, i / 32, &scale, &min);
  const int high_bit = (b[16 + i % 32] >> (i / 32)) & 1;
  const double q = nibble(b[48 + 32 * (i / 64) + i % 32], (i / 32) % 2 == 1) + 16 * high_bit;
  return ref_f16(read_u16(b)) * scale * q - ref_f16(read_u16(b + 2)) * min;
}

// Q6_K: 128-element halves; in a half, element r = 32k + l takes its low 4
// bits from ql[64*half + l + 32*(k % 2)] (high nibble when k >= 2) and its
// high 2 bits from bits 2k, 2k+1 of qh[32*half + l]; the scale of element i is
// scales[i / 16] (int8); value d * scale * (q - 32).
inline double ref_q6_k(const uint8_t* b, int i) {
  const int half = i / 128, r = i % 128, k = r / 32, l = r % 32;
  const double low = nibble(b[64 * half + l + 32 * (k % 2)], k >= 2);
  const int high = (b[128 + 32 * half + l] >> (2 * k)) & 3;
  const double q = low + 16 * high - 32;
  return ref_f16(read_u16(b + 208)) * static_cast<int8_t>(b[192 + i / 16]) * q;
}

inline double ref_plain(GgmlType type, const uint8_t* b) {
  if (type == GgmlType::kF16) return ref_f16(read_u16(b));
  if (type == GgmlType::kBF16) return ref_bf16(read_u16(b));
  float v;
  std::memcpy(&v, b, 4);
  return v;
}

inline double ref_element(GgmlType type, const uint8_t* block, int i) {
  switch (type) {
    case GgmlType::kQ4_0: return ref_q4_0(block, i);
    case GgmlType::kQ4_1: return ref_q4_1(block, i);
    case GgmlType::kQ5_0: return ref_q5(block, i, false);
    case GgmlType::kQ5_1: return ref_q5(block, i, true);
    case GgmlType::kQ8_0: return ref_q8_0(block, i);
    case GgmlType::kQ2_K: return ref_q2_k(block, i);
    case GgmlType::kQ3_K: return ref_q3_k(block, i);
    case GgmlType::kQ4_K: return ref_q4_k(block, i);
    case GgmlType::kQ5_K: return ref_q5_k(block, i);
    case GgmlType::kQ6_K: return ref_q6_k(block, i);
    default: return ref_plain(type, block);
  }
}

// A random finite f16 bit pattern of magnitude in [2^-8, 2^2) (scales).
inline uint16_t random_f16_scale(std::mt19937& rng) {
  const uint16_t sign = rng() % 2 ? 0x8000 : 0;
  const uint16_t exponent = static_cast<uint16_t>(7 + rng() % 10);  // 2^-8 .. 2^1
  return static_cast<uint16_t>(sign | (exponent << 10) | (rng() & 1023));
}

// Byte offsets of the f16 scale fields inside one block of `type`.
inline std::vector<size_t> f16_fields(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ8_0: return {0};
    case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ4_K: case GgmlType::kQ5_K: return {0, 2};
    case GgmlType::kQ2_K: return {80, 82};
    case GgmlType::kQ3_K: return {108};
    case GgmlType::kQ6_K: return {208};
    default: return {};
  }
}

// n_blocks random blocks of `type` whose f16 scales are finite; for F16/BF16/F32
// random finite values.
inline std::vector<uint8_t> random_blocks(GgmlType type, size_t n_blocks, std::mt19937& rng) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  std::vector<uint8_t> bytes(n_blocks * static_cast<size_t>(info.block_bytes));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  if (type == GgmlType::kF32) {
    std::normal_distribution<float> normal;
    for (size_t i = 0; i < n_blocks; ++i) {
      const float v = normal(rng);
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  } else if (type == GgmlType::kF16 || type == GgmlType::kBF16) {
    for (size_t i = 0; i < n_blocks; ++i) {
      uint16_t v = random_f16_scale(rng);
      if (type == GgmlType::kBF16) v = static_cast<uint16_t>((rng() & 0x8000) | ((120 + rng() % 12) << 7) | (rng() & 127));
      std::memcpy(bytes.data() + 2 * i, &v, 2);
    }
  } else {
    for (size_t blk = 0; blk < n_blocks; ++blk)
      for (size_t field : f16_fields(type)) {
        const uint16_t v = random_f16_scale(rng);
        std::memcpy(bytes.data() + blk * static_cast<size_t>(info.block_bytes) + field, &v, 2);
      }
  }
  return bytes;
}

// The dequantizable types, in id order.
inline std::vector<GgmlType> dequantizable_types() {
  return {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
          GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
          GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kBF16};
}

}  // namespace longctx::testing
