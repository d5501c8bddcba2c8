// GGML tensor types as stored in GGUF files, their block layouts, and
// conversion to f32 (dequantization) and back (reference quantizers, for the
// test model generator). Layouts follow the GGUF spec (ggml-org/ggml docs/gguf.md):
// a row of n elements is n / block_elems blocks of block_bytes each.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace longctx {

// Values are the on-disk ids of the GGUF spec.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  const char* name;     // "q8_0"
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
  bool dequantizable;   // longctx can convert it to f32
};

// The type with this on-disk id, or nullopt for an id longctx does not know.
std::optional<GgmlType> ggml_type_from_id(uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType type);
// Bytes of n_elements of `type`; nullopt when n_elements is not a multiple of
// the block size or the result overflows.
std::optional<uint64_t> ggml_bytes(GgmlType type, int64_t n_elements);

// dst[i] for n = dst.size() elements (a multiple of block_elems) read from
// src (exactly ggml_bytes(type, n) bytes). Throws Error(kUnsupported) for a
// type that is not dequantizable, Error(kInvalidArgument) on size mismatch.
void dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst);

// `src` stored as `type` into dst (exactly ggml_bytes(type, src.size())
// bytes), for every dequantizable type. Values are divided by the stored
// (f16-rounded) scales; the error of an element is at most
//   Q8_0        d/2, d = absmax / 127;
//   Q4_0, Q5_0  d/2, d = max / -8 or / -16 (ggml's rule: the largest magnitude
//               maps to the lowest level), d for values near -max (clamped);
//   Q4_1, Q5_1  d/2, the minimum rounded down to f16 and d = range / 15 or
//               / 31 rounded up, so that the levels cover the block;
//   Q2_K .. Q6_K  half the step d * scale of the element's sub-block: a
//               search over the 4-bit (Q2_K), 6-bit (Q3_K, Q4_K, Q5_K) or
//               int8 (Q6_K) scales and mins keeps the grid of least squared
//               error among those that cover the sub-block, whose step is
//               within two scale units of range / 3, absmax / 3.5, range /
//               15, range / 31 or absmax / 31.5.
// Blocks are independent: quantizing a matrix row by row gives the same
// bytes. Throws Error(kUnsupported) for other types, Error(kInvalidArgument)
// for a size mismatch or, naming the element, for a value that is not finite
// or outside the f16 range (+-65504, where block scales and minimums live).
void quantize(GgmlType type, std::span<const float> src, std::span<uint8_t> dst);
// The same into a new vector.
std::vector<uint8_t> quantize(GgmlType type, std::span<const float> src);

}  // namespace longctx
