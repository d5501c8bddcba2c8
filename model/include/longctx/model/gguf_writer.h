// GGUF writer (v3 by default): builds valid files for the test model
// generators (tools/), the fuzz seed corpus and tests. Keys and tensors keep
// the order they were added; duplicates throw Error(kInvalidArgument).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/ggml_types.h"
#include "longctx/model/gguf.h"

namespace longctx::model {

class GgufWriter {
 public:
  void set_string(std::string key, std::string value);
  void set_u32(std::string key, uint32_t value);
  void set_i32(std::string key, int32_t value);
  void set_u64(std::string key, uint64_t value);
  void set_f32(std::string key, float value);
  void set_bool(std::string key, bool value);
  void set_string_array(std::string key, std::vector<std::string> values);
  void set_f32_array(std::string key, std::vector<float> values);
  void set_i32_array(std::string key, std::vector<int32_t> values);
  // The remaining scalar types of the spec.
  void set_u8(std::string key, uint8_t value);
  void set_i8(std::string key, int8_t value);
  void set_u16(std::string key, uint16_t value);
  void set_i16(std::string key, int16_t value);
  void set_i64(std::string key, int64_t value);
  void set_f64(std::string key, double value);
  // A value written exactly as given: `payload` is what follows the type id
  // on disk (for an array: element type, count, elements). Not validated, so
  // tests can build invalid files (unknown types, nested arrays, bad bools).
  void set_raw(std::string key, uint32_t type_id, std::vector<uint8_t> payload);

  // dims in GGUF order (dims[0] contiguous); data already encoded as `type`
  // (size checked against ggml_bytes).
  void add_tensor(std::string name, std::vector<int64_t> dims, GgmlType type, std::vector<uint8_t> data);
  // f32 values (row-major, dims[0] fastest) stored as `type` via quantize().
  void add_tensor_f32(std::string name, std::vector<int64_t> dims, GgmlType type, std::span<const float> values);

  // The whole file. version 2 or 3; alignment a power of two (written as
  // general.alignment when it is not 32). A general.alignment the caller set
  // as u32 must equal `alignment`; one set with set_raw is written as is.
  std::vector<uint8_t> to_bytes(uint32_t version = 3, uint32_t alignment = 32) const;
  // to_bytes() written atomically (write_file_atomically).
  void write(const std::string& path, uint32_t version = 3, uint32_t alignment = 32) const;

 private:
  struct Entry {
    std::string key;
    uint32_t type;        // GgufType id
    uint32_t array_type;  // element GgufType id when type is an array
    std::vector<uint8_t> payload;  // encoded value as on disk (after the type id)
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    std::vector<uint8_t> data;
  };
  void add_entry(Entry entry);
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
};

}  // namespace longctx::model
