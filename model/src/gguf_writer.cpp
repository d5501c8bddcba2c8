// GGUF writer: little-endian encoding of the header, metadata and tensor
// infos, then the data section with every tensor aligned.
#include "longctx/model/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "longctx/core/error.h"
#include "longctx/core/file.h"

namespace longctx::model {
namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  static_assert(std::endian::native == std::endian::little, "the writer assumes a little-endian host");
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint32_t id(GgufType t) { return static_cast<uint32_t>(t); }

template <typename T>
std::vector<uint8_t> scalar_payload(T value) {
  std::vector<uint8_t> out;
  put(out, value);
  return out;
}

template <typename T>
std::vector<uint8_t> array_payload(GgufType elem, const std::vector<T>& values) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, id(elem));
  put<uint64_t>(out, values.size());
  for (const T& v : values) put(out, v);
  return out;
}

uint64_t align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

}  // namespace

void GgufWriter::add_entry(Entry entry) {
  if (entry.key.empty()) fail(ErrorCode::kInvalidArgument, "GgufWriter: empty metadata key");
  for (const Entry& e : entries_)
    if (e.key == entry.key) fail(ErrorCode::kInvalidArgument, "GgufWriter: duplicate metadata key '", entry.key, "'");
  entries_.push_back(std::move(entry));
}

void GgufWriter::set_string(std::string key, std::string value) {
  std::vector<uint8_t> payload;
  put_string(payload, value);
  add_entry({std::move(key), id(GgufType::kString), 0, std::move(payload)});
}
void GgufWriter::set_u8(std::string key, uint8_t value) {
  add_entry({std::move(key), id(GgufType::kU8), 0, scalar_payload(value)});
}
void GgufWriter::set_i8(std::string key, int8_t value) {
  add_entry({std::move(key), id(GgufType::kI8), 0, scalar_payload(value)});
}
void GgufWriter::set_u16(std::string key, uint16_t value) {
  add_entry({std::move(key), id(GgufType::kU16), 0, scalar_payload(value)});
}
void GgufWriter::set_i16(std::string key, int16_t value) {
  add_entry({std::move(key), id(GgufType::kI16), 0, scalar_payload(value)});
}
void GgufWriter::set_u32(std::string key, uint32_t value) {
  add_entry({std::move(key), id(GgufType::kU32), 0, scalar_payload(value)});
}
void GgufWriter::set_i32(std::string key, int32_t value) {
  add_entry({std::move(key), id(GgufType::kI32), 0, scalar_payload(value)});
}
void GgufWriter::set_u64(std::string key, uint64_t value) {
  add_entry({std::move(key), id(GgufType::kU64), 0, scalar_payload(value)});
}
void GgufWriter::set_i64(std::string key, int64_t value) {
  add_entry({std::move(key), id(GgufType::kI64), 0, scalar_payload(value)});
}
void GgufWriter::set_f32(std::string key, float value) {
  add_entry({std::move(key), id(GgufType::kF32), 0, scalar_payload(value)});
}
void GgufWriter::set_f64(std::string key, double value) {
  add_entry({std::move(key), id(GgufType::kF64), 0, scalar_payload(value)});
}
void GgufWriter::set_bool(std::string key, bool value) {
  add_entry({std::move(key), id(GgufType::kBool), 0, scalar_payload<uint8_t>(value ? 1 : 0)});
}

void GgufWriter::set_string_array(std::string key, std::vector<std::string> values) {
  std::vector<uint8_t> payload;
  put<uint32_t>(payload, id(GgufType::kString));
  put<uint64_t>(payload, values.size());
  for (const auto& v : values) put_string(payload, v);
  add_entry({std::move(key), id(GgufType::kArray), id(GgufType::kString), std::move(payload)});
}
void GgufWriter::set_f32_array(std::string key, std::vector<float> values) {
  add_entry({std::move(key), id(GgufType::kArray), id(GgufType::kF32), array_payload(GgufType::kF32, values)});
}
void GgufWriter::set_i32_array(std::string key, std::vector<int32_t> values) {
  add_entry({std::move(key), id(GgufType::kArray), id(GgufType::kI32), array_payload(GgufType::kI32, values)});
}

void GgufWriter::set_raw(std::string key, uint32_t type_id, std::vector<uint8_t> payload) {
  uint32_t array_type = 0;
  if (type_id == id(GgufType::kArray) && payload.size() >= 4) std::memcpy(&array_type, payload.data(), 4);
  add_entry({std::move(key), type_id, array_type, std::move(payload)});
}

uint64_t GgufWriter::check_tensor(const std::string& name, const std::vector<int64_t>& dims, GgmlType type) const {
  if (name.empty()) fail(ErrorCode::kInvalidArgument, "GgufWriter: empty tensor name");
  for (const Tensor& t : tensors_)
    if (t.name == name) fail(ErrorCode::kInvalidArgument, "GgufWriter: duplicate tensor name '", name, "'");
  if (dims.empty() || dims.size() > 4)
    fail(ErrorCode::kInvalidArgument, "GgufWriter: tensor '", name, "' has ", dims.size(), " dimensions (1 to 4)");
  int64_t n = 1;
  for (int64_t d : dims)
    if (d <= 0 || __builtin_mul_overflow(n, d, &n))
      fail(ErrorCode::kInvalidArgument, "GgufWriter: tensor '", name, "' has an invalid dimension ", d);
  const GgmlTypeInfo& info = ggml_type_info(type);
  const auto bytes = ggml_bytes(type, n);
  if (dims[0] % info.block_elems != 0 || !bytes)
    fail(ErrorCode::kInvalidArgument, "GgufWriter: tensor '", name, "': row length ", dims[0],
         " is not a multiple of the ", info.name, " block size ", info.block_elems);
  return *bytes;
}

void GgufWriter::add_tensor_stream(std::string name, std::vector<int64_t> dims, GgmlType type, TensorData produce) {
  const uint64_t bytes = check_tensor(name, dims, type);
  tensors_.push_back({std::move(name), std::move(dims), type, bytes, std::move(produce)});
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> dims, GgmlType type, std::vector<uint8_t> data) {
  const uint64_t bytes = check_tensor(name, dims, type);
  if (bytes != data.size())
    fail(ErrorCode::kInvalidArgument, "GgufWriter: tensor '", name, "' needs ", bytes, " bytes of ",
         ggml_type_info(type).name, ", got ", data.size());
  auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(data));  // TensorData must be copyable
  tensors_.push_back({std::move(name), std::move(dims), type, bytes,
                      [shared](FileSink& sink) { sink.write(shared->data(), shared->size()); }});
}

void GgufWriter::add_tensor_f32(std::string name, std::vector<int64_t> dims, GgmlType type,
                                std::span<const float> values) {
  add_tensor(std::move(name), std::move(dims), type, quantize(type, values));
}

std::vector<uint8_t> GgufWriter::header(uint32_t version, uint32_t alignment) const {
  if (version != 2 && version != 3)
    fail(ErrorCode::kInvalidArgument, "GgufWriter: version ", version, " (only 2 and 3 are written)");
  if (!std::has_single_bit(alignment))
    fail(ErrorCode::kInvalidArgument, "GgufWriter: alignment ", alignment, " is not a power of two");
  bool add_alignment = alignment != 32;
  for (const Entry& e : entries_) {
    if (e.key != "general.alignment") continue;
    add_alignment = false;
    uint32_t set = 0;
    if (e.type == id(GgufType::kU32)) std::memcpy(&set, e.payload.data(), 4);
    if (e.type == id(GgufType::kU32) && set != alignment)
      fail(ErrorCode::kInvalidArgument, "GgufWriter: general.alignment is ", set, " but the file is written with ",
           alignment);
  }

  std::vector<uint8_t> out{'G', 'G', 'U', 'F'};
  put<uint32_t>(out, version);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, entries_.size() + (add_alignment ? 1 : 0));
  if (add_alignment) {
    put_string(out, "general.alignment");
    put<uint32_t>(out, id(GgufType::kU32));
    put<uint32_t>(out, alignment);
  }
  for (const Entry& e : entries_) {
    put_string(out, e.key);
    put<uint32_t>(out, e.type);
    out.insert(out.end(), e.payload.begin(), e.payload.end());
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset = align_up(offset + t.n_bytes, alignment);
  }
  if (!tensors_.empty()) out.resize(align_up(out.size(), alignment), 0);
  return out;
}

namespace {

// Passes bytes on and counts them, refusing more than `limit`.
class CountingSink : public FileSink {
 public:
  CountingSink(FileSink& out, const std::string& name, uint64_t limit) : out_(out), name_(name), limit_(limit) {}
  void write(const void* data, size_t n) override {
    if (n > limit_ - count_)
      fail(ErrorCode::kInvalidArgument, "GgufWriter: tensor '", name_, "' produced more than its ", limit_, " bytes");
    out_.write(data, n);
    count_ += n;
  }
  uint64_t count() const { return count_; }

 private:
  FileSink& out_;
  const std::string& name_;
  uint64_t limit_, count_ = 0;
};

class VectorSink : public FileSink {
 public:
  explicit VectorSink(std::vector<uint8_t>& out) : out_(out) {}
  void write(const void* data, size_t n) override {
    const auto* bytes = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), bytes, bytes + n);
  }

 private:
  std::vector<uint8_t>& out_;
};

}  // namespace

void GgufWriter::write_data(FileSink& sink, uint32_t alignment) const {
  static const uint8_t kZeros[64] = {};
  for (const Tensor& t : tensors_) {
    CountingSink counted(sink, t.name, t.n_bytes);
    t.produce(counted);
    if (counted.count() != t.n_bytes)
      fail(ErrorCode::kInvalidArgument, "GgufWriter: tensor '", t.name, "' produced ", counted.count(), " of its ",
           t.n_bytes, " bytes");
    for (uint64_t pad = align_up(t.n_bytes, alignment) - t.n_bytes; pad > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(kZeros)));
      sink.write(kZeros, n);
      pad -= n;
    }
  }
}

std::vector<uint8_t> GgufWriter::to_bytes(uint32_t version, uint32_t alignment) const {
  std::vector<uint8_t> out = header(version, alignment);
  VectorSink sink(out);
  write_data(sink, alignment);
  return out;
}

void GgufWriter::write(const std::string& path, uint32_t version, uint32_t alignment) const {
  const std::vector<uint8_t> head = header(version, alignment);  // fails before any file is created
  write_file_atomically(path, [&](FileSink& sink) {
    sink.write(head.data(), head.size());
    write_data(sink, alignment);
  });
}

}  // namespace longctx::model
