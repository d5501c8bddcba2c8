// Helpers for tests of GGML block types (core/ggml_types.h) and of the
// kernels that read them: reference f16/bf16 decoders written from the
// definitions, random well-formed blocks of every dequantizable type, and
// expect_error for calls that must throw.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/ggml_types.h"

namespace longctx::testing {

// Runs `call`, which must throw Error(code) whose message contains every
// string of `parts`. Returns the message.
template <typename F>
std::string expect_error(F&& call, ErrorCode code, std::vector<std::string> parts) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << error_code_name(e.code()) << ": " << e.what();
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message '" << e.what() << "' lacks '" << part << "'";
    return e.what();
  }
  ADD_FAILURE() << "no error thrown (expected " << error_code_name(code) << ")";
  return {};
}

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
    case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ4_K: return {0, 2};
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
          GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kBF16};
}

}  // namespace longctx::testing
