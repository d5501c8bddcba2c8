// GGUF writer (v3 by default): builds valid files for the test model
// generators (tools/), the fuzz seed corpus and tests. Keys and tensors keep
// the order they were added; duplicates throw Error(kInvalidArgument).
// Tensor data may be produced while the file is written (add_tensor_stream),
// so a model larger than memory is written tensor by tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/file.h"
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
  // Writes a tensor's data, exactly ggml_bytes(type, n_elements) bytes in as
  // many calls as it likes. Called once each time the file is written.
  using TensorData = std::function<void(FileSink& sink)>;
  // A tensor whose data `produce` writes when the file is written; a
  // different size throws Error(kInvalidArgument) naming the tensor.
  void add_tensor_stream(std::string name, std::vector<int64_t> dims, GgmlType type, TensorData produce);

  // The whole file. version 2 or 3; alignment a power of two (written as
  // general.alignment when it is not 32). A general.alignment the caller set
  // as u32 must equal `alignment`; one set with set_raw is written as is.
  std::vector<uint8_t> to_bytes(uint32_t version = 3, uint32_t alignment = 32) const;
  // The same bytes written atomically (write_file_atomically): header first,
  // then each tensor as it is produced. Errors in the header throw before
  // the file is created; an error while producing leaves no file behind.
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
    uint64_t n_bytes;
    TensorData produce;
  };
  void add_entry(Entry entry);
  // Validates a new tensor's name, dims and type; its data size.
  uint64_t check_tensor(const std::string& name, const std::vector<int64_t>& dims, GgmlType type) const;
  // Header, metadata and tensor infos, padded to where the data starts.
  std::vector<uint8_t> header(uint32_t version, uint32_t alignment) const;
  // Every tensor's data, each padded to `alignment`.
  void write_data(FileSink& sink, uint32_t alignment) const;
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
};

}  // namespace longctx::model
