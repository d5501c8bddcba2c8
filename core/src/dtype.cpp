// Scalar dtype conversions and dtype names. The bulk convert() lives in
// dtype_convert_hwy.cpp and must give the same bits as the functions here.
#include "longctx/core/dtype.h"

#include <bit>
#include <cctype>
#include <cstring>
#include <string>

#include "longctx/core/error.h"

namespace longctx {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kQ8_0:
      fail(ErrorCode::kInvalidArgument, "q8_0 is the KV store's block type (int8 codes, an f16 scale per 32 values), "
                                        "not an element type");
  }
  fail(ErrorCode::kInvalidArgument, "invalid dtype value ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
  }
  return "invalid-dtype";
}

std::optional<DType> parse_dtype(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "f32" || lower == "fp32" || lower == "float32") return DType::kF32;
  if (lower == "f16" || lower == "fp16" || lower == "float16") return DType::kF16;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  if (lower == "q8_0") return DType::kQ8_0;
  return std::nullopt;
}

// f16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
// f32: 1 sign bit, 8 exponent bits (bias 127), 23 mantissa bits.
uint16_t f32_to_f16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;

  if (magnitude > 0x7F800000) {
    // NaN: keep the top 10 payload bits and set the quiet bit, so the result
    // is a NaN even when those bits are zero (as F16C's vcvtps2ph does).
    return static_cast<uint16_t>(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF));
  }
  if (magnitude >= 0x477FF000) {
    // >= 65520 = 65504 + half an ulp: the tie goes to the even neighbour 65536,
    // which overflows. Infinity lands here too.
    return static_cast<uint16_t>(sign | 0x7C00);
  }
  if (magnitude >= 0x38800000) {
    // Normal f16 (>= 2^-14). Round the 13 dropped mantissa bits to nearest
    // even by adding just under half an ulp plus the kept lowest bit; a carry
    // into the exponent is the correct result. Then rebias 127 -> 15.
    const uint32_t round_bias = 0xFFF + ((magnitude >> 13) & 1);
    return static_cast<uint16_t>(sign | ((magnitude + round_bias - (112u << 23)) >> 13));
  }
  if (magnitude <= 0x33000000) {
    // <= 2^-25, half of the smallest subnormal: rounds to zero (a tie goes to even 0).
    return sign;
  }
  // Subnormal f16: the result counts units of 2^-24. The f32 value is
  // mantissa * 2^(exponent - 150), i.e. mantissa >> (126 - exponent) units.
  const uint32_t exponent = magnitude >> 23;  // 102..112
  const uint32_t mantissa = (magnitude & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - exponent;      // 14..24
  uint32_t units = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (units & 1) != 0)) ++units;  // may become 2^-14
  return static_cast<uint16_t>(sign | units);
}

float f16_bits_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1F;
  const uint32_t mantissa = bits & 0x3FF;

  if (exponent == 0x1F) {
    // Inf, or NaN made quiet (as F16C's vcvtph2ps does).
    const uint32_t quiet = mantissa != 0 ? 0x400000 : 0;
    return std::bit_cast<float>(sign | 0x7F800000 | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// bf16 is the top half of an f32.
uint16_t f32_to_bf16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040);  // NaN: keep sign and top payload, quiet
  }
  // Round to nearest even on the 16 dropped bits; overflow carries into Inf.
  const uint32_t round_bias = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + round_bias) >> 16);
}

float bf16_bits_to_f32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

float load_as_f32(const void* data, DType dtype, size_t i) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case DType::kF32: {
      float value;
      std::memcpy(&value, bytes + 4 * i, 4);
      return value;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      return dtype == DType::kF16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
    }
    case DType::kQ8_0: break;
  }
  fail(ErrorCode::kInvalidArgument, "load_as_f32: invalid dtype value ", static_cast<int>(dtype));
}

void store_from_f32(void* data, DType dtype, size_t i, float value) {
  auto* bytes = static_cast<unsigned char*>(data);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(bytes + 4 * i, &value, 4);
      return;
    case DType::kF16:
    case DType::kBF16: {
      const uint16_t bits = dtype == DType::kF16 ? f32_to_f16_bits(value) : f32_to_bf16_bits(value);
      std::memcpy(bytes + 2 * i, &bits, 2);
      return;
    }
    case DType::kQ8_0: break;
  }
  fail(ErrorCode::kInvalidArgument, "store_from_f32: invalid dtype value ", static_cast<int>(dtype));
}

}  // namespace longctx
