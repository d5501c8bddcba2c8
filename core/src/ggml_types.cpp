// The GGML type table: names and block sizes of every type of the GGUF spec.
// Block layouts, decoders and encoders: ggml_dequantize.cpp, ggml_quantize.cpp.
#include "longctx/core/ggml_types.h"

#include <limits>

#include "ggml_blocks.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using detail::kQK;
using detail::kQKK;

struct TypeEntry {
  GgmlType type;
  GgmlTypeInfo info;
};

// Block sizes from the GGUF spec; k-quant sizes spelled out per field.
constexpr TypeEntry kTypes[] = {
    {GgmlType::kF32, {"f32", 1, 4, true}},
    {GgmlType::kF16, {"f16", 1, 2, true}},
    {GgmlType::kQ4_0, {"q4_0", kQK, 2 + kQK / 2, true}},
    {GgmlType::kQ4_1, {"q4_1", kQK, 2 + 2 + kQK / 2, true}},
    {GgmlType::kQ5_0, {"q5_0", kQK, 2 + 4 + kQK / 2, true}},
    {GgmlType::kQ5_1, {"q5_1", kQK, 2 + 2 + 4 + kQK / 2, true}},
    {GgmlType::kQ8_0, {"q8_0", kQK, 2 + kQK, true}},
    {GgmlType::kQ8_1, {"q8_1", kQK, 2 + 2 + kQK, false}},
    {GgmlType::kQ2_K, {"q2_k", kQKK, kQKK / 16 + kQKK / 4 + 2 + 2, true}},
    {GgmlType::kQ3_K, {"q3_k", kQKK, kQKK / 8 + kQKK / 4 + 12 + 2, true}},
    {GgmlType::kQ4_K, {"q4_k", kQKK, 2 + 2 + 12 + kQKK / 2, true}},
    {GgmlType::kQ5_K, {"q5_k", kQKK, 2 + 2 + 12 + kQKK / 8 + kQKK / 2, true}},
    {GgmlType::kQ6_K, {"q6_k", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, true}},
    {GgmlType::kQ8_K, {"q8_k", kQKK, 4 + kQKK + kQKK / 16 * 2, false}},
    {GgmlType::kI8, {"i8", 1, 1, false}},
    {GgmlType::kI16, {"i16", 1, 2, false}},
    {GgmlType::kI32, {"i32", 1, 4, false}},
    {GgmlType::kI64, {"i64", 1, 8, false}},
    {GgmlType::kF64, {"f64", 1, 8, false}},
    {GgmlType::kBF16, {"bf16", 1, 2, true}},
};

}  // namespace

std::optional<GgmlType> ggml_type_from_id(uint32_t id) {
  for (const auto& entry : kTypes)
    if (static_cast<uint32_t>(entry.type) == id) return entry.type;
  return std::nullopt;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  for (const auto& entry : kTypes)
    if (entry.type == type) return entry.info;
  fail(ErrorCode::kInvalidArgument, "unknown ggml type id ", static_cast<uint32_t>(type));
}

std::optional<uint64_t> ggml_bytes(GgmlType type, int64_t n_elements) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (n_elements < 0 || n_elements % info.block_elems != 0) return std::nullopt;
  const uint64_t blocks = static_cast<uint64_t>(n_elements / info.block_elems);
  const uint64_t block_bytes = static_cast<uint64_t>(info.block_bytes);
  if (blocks > std::numeric_limits<uint64_t>::max() / block_bytes) return std::nullopt;
  return blocks * block_bytes;
}

}  // namespace longctx
