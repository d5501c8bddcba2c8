// GGUF reader (v2 and v3), memory-mapped. The file is untrusted: open()
// validates everything before returning (magic, version, counts against the
// bytes left, string lengths, duplicate keys and tensor names, value types,
// alignment a power of two, dimensions and element counts without overflow,
// known tensor types, every tensor inside the data section, aligned, and not
// overlapping another). Any failure throws longctx::Error(kCorrupt, or kIo
// for the file system, kUnsupported for a valid but unsupported feature) with
// a message naming the file, the key or tensor, and the byte offset.
// A GgufFile is immutable after open and may be shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/ggml_types.h"

namespace longctx::model {

// Values are the on-disk ids of the GGUF spec.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* gguf_type_name(GgufType type);

// One metadata value. Scalars are decoded; arrays keep their element type and
// count and are decoded on demand by the typed getters of GgufFile.
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType array_type = GgufType::kU8;  // element type when type == kArray
  uint64_t array_count = 0;
  uint64_t file_offset = 0;  // where the value (array: its first element) starts
  // Scalar payloads (the one matching `type` is set).
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string_view str;  // kString: points into the mapping
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the contiguous (row) extent
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t n_bytes = 0;
  int64_t n_elements = 0;
  // "q8_0[4096, 4096]" (GGUF order)
  std::string describe() const;
};

class GgufFile {
 public:
  // Maps and validates `path`.
  static GgufFile open(const std::string& path);
  // Validates bytes already in memory (fuzzing, tests); the bytes must outlive
  // the GgufFile. `name` stands for the file name in error messages.
  static GgufFile from_bytes(std::span<const uint8_t> bytes, std::string name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& name() const;
  uint32_t version() const;
  uint64_t alignment() const;
  uint64_t file_size() const;

  const std::vector<GgufKeyValue>& metadata() const;
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters. A missing key or a wrong type throws Error(kCorrupt) naming
  // the key, its type and the expected one. Integer getters accept every
  // integer type whose value fits; get_float accepts f32 and f64.
  std::string get_string(std::string_view key) const;
  uint64_t get_uint(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  // Same, with a default when the key is absent (a wrong type still throws).
  std::string get_string_or(std::string_view key, std::string fallback) const;
  uint64_t get_uint_or(std::string_view key, uint64_t fallback) const;
  double get_float_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  // Arrays; elements of another type throw Error(kCorrupt).
  std::vector<std::string_view> get_string_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;  // accepts i32 and u32/i8/u8... that fit

  const std::vector<GgufTensorInfo>& tensors() const;
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // The tensor's bytes inside the mapping.
  std::span<const uint8_t> tensor_data(const GgufTensorInfo& tensor) const;
  // The tensor as f32 (dequantized), numel = n_elements.
  std::vector<float> tensor_f32(const GgufTensorInfo& tensor) const;
  // After a loader copied the tensor: its mapped pages leave this process's
  // resident memory (a file opened from_bytes is left as it is).
  void release_tensor_pages(const GgufTensorInfo& tensor) const;

 private:
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx::model
