// Storage dtypes of longctx: f32, f16 (IEEE binary16) and bf16 (bfloat16),
// the element types of tensors; and q8_0, a block type the KV store alone
// keeps (int8 codes with one f16 scale per 32 values, kvstore/kv_store.h),
// which has no element size and no conversion here.
// Conversions from f32 round to nearest, ties to even; NaN stays NaN (quiet),
// infinities and signed zeros are kept, f16 subnormals are exact.
// Accumulation is always fp32 whatever the storage dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace longctx {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3 };

// Bytes of one element; Error(kInvalidArgument) for q8_0, which has none.
size_t dtype_size(DType dtype);
// "f32", "f16", "bf16", "q8_0".
const char* dtype_name(DType dtype);
// Accepts f32/f16/bf16, fp32/fp16/bf16, float32/float16/bfloat16 and q8_0, any case.
std::optional<DType> parse_dtype(std::string_view text);

// Scalar conversions (bit patterns of the 16-bit types).
uint16_t f32_to_f16_bits(float value);
float f16_bits_to_f32(uint16_t bits);
uint16_t f32_to_bf16_bits(float value);
float bf16_bits_to_f32(uint16_t bits);

// Converts n contiguous elements from src (src_dtype) to dst (dst_dtype), with
// the same rounding as the scalar functions; vectorized where the CPU allows.
// src and dst must not overlap unless they are the same pointer and dtype.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

// The index of the first of n contiguous values of `dtype` (f32, f16, bf16)
// whose bit pattern, sign cleared, exceeds `limit`, or -1: magnitudes order
// as those patterns do, NaN above Inf above every finite value, so a limit
// is "the largest magnitude allowed". data need not be aligned. Vectorized
// (magnitude_hwy.cpp).
int64_t first_magnitude_above(const void* data, DType dtype, size_t n, uint32_t limit);
// The index of the first NaN or infinite one of n values, or -1.
int64_t first_non_finite(const void* data, DType dtype, size_t n);
// The index of the first NaN of n values (infinities pass), or -1.
int64_t first_nan(const void* data, DType dtype, size_t n);

// Reads element i of a buffer of `dtype` as float (for references and tests).
float load_as_f32(const void* data, DType dtype, size_t i);
// Writes value (rounded) as element i of a buffer of `dtype`.
void store_from_f32(void* data, DType dtype, size_t i, float value);

}  // namespace longctx
