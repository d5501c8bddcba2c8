// GGUF reader: parses and validates the header, metadata and tensor infos of
// an untrusted file. Every read goes through Cursor, which checks the bytes
// left first; every count is checked against the bytes left before anything
// is allocated for it.
#include "longctx/model/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "longctx/core/error.h"
#include "longctx/core/file.h"

namespace longctx::model {
namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kMaxKeyBytes = 65535;  // the spec's limit on key length
// Smallest possible encodings, used to bound counts by the bytes left:
// key length + 1 key byte + type + a 1-byte value; name length + 1 name byte
// + n_dims + one dim + type + offset.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorBytes = 8 + 1 + 4 + 8 + 4 + 8;

// What is being read, formatted into a message only on failure:
// "key 'general.name'", "tensor 'blk.0.attn_q.weight' dims", "key #3".
struct What {
  const char* kind;           // "key", "tensor", "header"
  std::string_view name;      // empty while the name itself is being read
  uint64_t index = 0;         // used when name is empty
  const char* field = nullptr;
};

std::string describe_what(const What& what) {
  std::string out = what.kind;
  // Names come from the file: long ones are cut.
  if (what.name.size() > 80) out += str_cat(" '", what.name.substr(0, 80), "...' (", what.name.size(), " bytes)");
  else if (!what.name.empty()) out += str_cat(" '", what.name, "'");
  else if (std::strcmp(what.kind, "header") != 0) out += str_cat(" #", what.index);
  if (what.field != nullptr) out += str_cat(" ", what.field);
  return out;
}

// The first control byte of a key or tensor name, as "byte 3 is the control
// byte 0x1b"; ""
// when none. Names go into messages and reports as they are: a NUL cut a
// message short, an escape sequence drove the terminal. No GGUF name has one.
std::string control_byte(std::string_view name) {
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7F)
      return str_cat("byte ", i, " is the control byte 0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
  }
  return "";
}

uint64_t byteswap32(uint32_t v) {
  return ((v & 0xFFu) << 24) | ((v & 0xFF00u) << 8) | ((v >> 8) & 0xFF00u) | (v >> 24);
}

// Bounds-checked little-endian reads over the file's bytes.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& file, uint64_t pos = 0)
      : bytes_(bytes), file_(file), pos_(pos) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }

  void need(uint64_t n, const What& what) const {
    if (n > left())
      fail(ErrorCode::kCorrupt, file_, ": ", describe_what(what), ": needs ", n, " bytes at offset ", pos_,
           " but the file has only ", left(), " left (truncated?)");
  }
  template <typename T>
  T read(const What& what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  void skip(uint64_t n, const What& what) {
    need(n, what);
    pos_ += n;
  }
  // A GGUF string: u64 length, then that many bytes.
  std::string_view string(const What& what) {
    const uint64_t at = pos_;
    const uint64_t len = read<uint64_t>(what);
    if (len > left())
      fail(ErrorCode::kCorrupt, file_, ": ", describe_what(what), ": string length ", len, " at offset ", at,
           " exceeds the ", left(), " bytes left in the file");
    std::string_view out(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return out;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& file_;
  uint64_t pos_;
};

bool valid_value_type(uint32_t id) { return id <= static_cast<uint32_t>(GgufType::kF64); }

// Bytes of one scalar of a fixed-size type (0 for string and array).
uint64_t scalar_bytes(GgufType type) {
  switch (type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

bool is_unsigned(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64;
}
bool is_signed(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

// Reads a scalar of a fixed-size type into the matching payload of `value`.
void read_scalar(Cursor& c, GgufType type, const What& what, const std::string& file, GgufValue& value) {
  switch (type) {
    case GgufType::kU8: value.u = c.read<uint8_t>(what); break;
    case GgufType::kI8: value.i = c.read<int8_t>(what); break;
    case GgufType::kU16: value.u = c.read<uint16_t>(what); break;
    case GgufType::kI16: value.i = c.read<int16_t>(what); break;
    case GgufType::kU32: value.u = c.read<uint32_t>(what); break;
    case GgufType::kI32: value.i = c.read<int32_t>(what); break;
    case GgufType::kU64: value.u = c.read<uint64_t>(what); break;
    case GgufType::kI64: value.i = c.read<int64_t>(what); break;
    case GgufType::kF32: value.f = c.read<float>(what); break;
    case GgufType::kF64: value.f = c.read<double>(what); break;
    case GgufType::kBool: {
      const uint64_t at = c.pos();
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) fail(ErrorCode::kCorrupt, file, ": ", describe_what(what), ": bool value ", int{b}, " at offset ", at,
                      " is neither 0 nor 1");
      value.b = b != 0;
      break;
    }
    case GgufType::kString: case GgufType::kArray: break;
  }
}

// Ids of ggml types that exist (i-quants, ternary, mxfp4) but longctx cannot
// size: a file using them is valid but unsupported.
bool known_unsupported_ggml_type(uint32_t id) {
  return (id >= 16 && id <= 23) || id == 29 || id == 34 || id == 35 || id == 39;
}

}  // namespace

const char* gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "unknown";
}

std::string GgufTensorInfo::describe() const {
  std::string out = str_cat(ggml_type_info(type).name, "[");
  for (size_t i = 0; i < dims.size(); ++i) out += str_cat(i ? ", " : "", dims[i]);
  return out + "]";
}

struct GgufFile::Impl {
  std::optional<MappedFile> mapping;
  std::span<const uint8_t> bytes;
  std::string name;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_start = 0;  // file offset of the data section
  uint64_t data_size = 0;   // bytes from data_start to the end of the file
  std::vector<GgufKeyValue> metadata;
  std::vector<GgufTensorInfo> tensors;
  // Keys and names are views into the file bytes, which outlive the maps.
  std::unordered_map<std::string_view, size_t> key_index;
  std::unordered_map<std::string_view, size_t> tensor_index;

  void parse();
  void parse_value(Cursor& c, uint32_t type_id, const What& what, GgufValue& value);
  void parse_tensor_info(Cursor& c, uint64_t index);
  void check_tensor_placement();
  [[noreturn]] void corrupt_at(uint64_t offset, const What& what, const std::string& problem) const {
    fail(ErrorCode::kCorrupt, name, ": ", describe_what(what), ": ", problem, " at offset ", offset);
  }
};

void GgufFile::Impl::parse() {
  const What header{"header", {}};
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kMagic, 4) != 0) {
    std::string found = "the file is shorter than 4 bytes";
    if (bytes.size() >= 4)
      found = str_cat("found bytes 0x", std::hex, int{bytes[0]}, " 0x", int{bytes[1]}, " 0x", int{bytes[2]}, " 0x",
                      int{bytes[3]});
    fail(ErrorCode::kCorrupt, name, ": not a GGUF file: bad magic at offset 0 (", found, ")");
  }
  Cursor c(bytes, name, 4);
  version = c.read<uint32_t>({"header", {}, 0, "version"});
  if (version == 1) fail(ErrorCode::kUnsupported, name, ": GGUF version 1 is not supported (only 2 and 3) at offset 4");
  if (version != 2 && version != 3) {
    const uint64_t swapped = byteswap32(version);
    if (swapped >= 1 && swapped <= 3)
      fail(ErrorCode::kUnsupported, name, ": big-endian GGUF (version bytes ", version, ") is not supported at offset 4");
    fail(ErrorCode::kCorrupt, name, ": unknown GGUF version ", version, " at offset 4 (expected 2 or 3)");
  }
  const uint64_t tensor_count = c.read<uint64_t>({"header", {}, 0, "tensor count"});
  const uint64_t kv_count = c.read<uint64_t>({"header", {}, 0, "metadata count"});
  if (kv_count > c.left() / kMinKvBytes)
    corrupt_at(16, header, str_cat("metadata count ", kv_count, " cannot fit in the ", c.left(), " bytes left"));
  if (tensor_count > (c.left() - kv_count * kMinKvBytes) / kMinTensorBytes)
    corrupt_at(8, header, str_cat("tensor count ", tensor_count, " cannot fit in the ", c.left(), " bytes left"));

  metadata.reserve(kv_count);
  key_index.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t at = c.pos();
    const std::string_view key = c.string({"key", {}, i});
    const What what{"key", key, i};
    if (const std::string bad = control_byte(key); !bad.empty())
      corrupt_at(at, What{"key", {}, i}, str_cat("the name's ", bad));
    if (key.empty()) corrupt_at(at, what, "empty key");
    if (key.size() > kMaxKeyBytes) corrupt_at(at, what, str_cat("key of ", key.size(), " bytes (the limit is 65535)"));
    if (key_index.count(key)) corrupt_at(at, what, "duplicate key");
    const uint32_t type_id = c.read<uint32_t>({"key", key, i, "type"});
    GgufValue value;
    parse_value(c, type_id, what, value);
    key_index.emplace(key, metadata.size());
    metadata.push_back({std::string(key), value});
  }

  if (auto it = key_index.find("general.alignment"); it != key_index.end()) {
    const GgufValue& v = metadata[it->second].value;
    const What what{"key", "general.alignment"};
    if (v.type != GgufType::kU32)
      corrupt_at(v.file_offset, what, str_cat("type ", gguf_type_name(v.type), " (expected u32)"));
    if (v.u == 0 || !std::has_single_bit(v.u))
      corrupt_at(v.file_offset, what, str_cat("alignment ", v.u, " is not a power of two"));
    alignment = v.u;
  }

  tensors.reserve(tensor_count);
  tensor_index.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) parse_tensor_info(c, i);

  // The data section starts at the next multiple of the alignment. A file
  // without tensors may end before it.
  data_start = (c.pos() + alignment - 1) / alignment * alignment;
  data_size = data_start <= bytes.size() ? bytes.size() - data_start : 0;
  check_tensor_placement();
}

void GgufFile::Impl::parse_value(Cursor& c, uint32_t type_id, const What& what, GgufValue& value) {
  if (!valid_value_type(type_id)) corrupt_at(c.pos() - 4, what, str_cat("unknown value type id ", type_id));
  value.type = static_cast<GgufType>(type_id);
  value.file_offset = c.pos();
  if (value.type == GgufType::kString) {
    value.str = c.string(what);
    return;
  }
  if (value.type != GgufType::kArray) {
    read_scalar(c, value.type, what, name, value);
    return;
  }
  const uint64_t elem_at = c.pos();
  const uint32_t elem_id = c.read<uint32_t>({what.kind, what.name, what.index, "array element type"});
  if (!valid_value_type(elem_id)) corrupt_at(elem_at, what, str_cat("unknown array element type id ", elem_id));
  const auto elem = static_cast<GgufType>(elem_id);
  if (elem == GgufType::kArray)
    fail(ErrorCode::kUnsupported, name, ": ", describe_what(what), ": arrays of arrays are not supported at offset ",
         elem_at);
  const uint64_t count_at = c.pos();
  const uint64_t count = c.read<uint64_t>({what.kind, what.name, what.index, "array count"});
  const uint64_t elem_min = elem == GgufType::kString ? 8 : scalar_bytes(elem);
  if (count > c.left() / elem_min)
    corrupt_at(count_at, what, str_cat("array of ", count, " ", gguf_type_name(elem), " cannot fit in the ", c.left(),
                                       " bytes left"));
  value.array_type = elem;
  value.array_count = count;
  value.file_offset = c.pos();
  if (elem == GgufType::kString) {
    for (uint64_t k = 0; k < count; ++k) c.string(what);
  } else if (elem == GgufType::kBool) {
    GgufValue scratch;
    for (uint64_t k = 0; k < count; ++k) read_scalar(c, elem, what, name, scratch);
  } else {
    c.skip(count * elem_min, what);  // count * elem_min <= left, checked above
  }
}

void GgufFile::Impl::parse_tensor_info(Cursor& c, uint64_t index) {
  const uint64_t at = c.pos();
  const std::string_view tname = c.string({"tensor", {}, index, "name"});
  What what{"tensor", tname, index};
  if (const std::string bad = control_byte(tname); !bad.empty())
    corrupt_at(at, What{"tensor", {}, index}, str_cat("the name's ", bad));
  if (tname.empty()) corrupt_at(at, what, "empty tensor name");
  if (tensor_index.count(tname)) corrupt_at(at, what, "duplicate tensor name");

  GgufTensorInfo info;
  info.name = std::string(tname);
  what.field = "n_dims";
  const uint64_t dims_at = c.pos();
  const uint32_t n_dims = c.read<uint32_t>(what);
  if (n_dims < 1 || n_dims > kMaxDims) corrupt_at(dims_at, what, str_cat(n_dims, " dimensions (expected 1 to 4)"));
  what.field = "dims";
  int64_t n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t dim_at = c.pos();
    const uint64_t dim = c.read<uint64_t>(what);
    if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      corrupt_at(dim_at, what, str_cat("dimension ", d, " = ", dim, " is out of range"));
    if (__builtin_mul_overflow(n_elements, static_cast<int64_t>(dim), &n_elements))
      corrupt_at(dim_at, what, "element count overflows int64");
    info.dims.push_back(static_cast<int64_t>(dim));
  }
  what.field = "type";
  const uint64_t type_at = c.pos();
  const uint32_t type_id = c.read<uint32_t>(what);
  const auto type = ggml_type_from_id(type_id);
  if (!type) {
    if (known_unsupported_ggml_type(type_id))
      fail(ErrorCode::kUnsupported, name, ": tensor '", tname, "': ggml type id ", type_id,
           " (an i-quant or other type longctx does not read) is not supported at offset ", type_at);
    corrupt_at(type_at, what, str_cat("unknown ggml type id ", type_id));
  }
  const GgmlTypeInfo& tinfo = ggml_type_info(*type);
  if (info.dims[0] % tinfo.block_elems != 0)
    corrupt_at(dims_at, what, str_cat("row length ", info.dims[0], " is not a multiple of the ", tinfo.name,
                                      " block size ", tinfo.block_elems));
  const auto n_bytes = ggml_bytes(*type, n_elements);
  if (!n_bytes) corrupt_at(dims_at, what, str_cat("byte size of ", n_elements, " ", tinfo.name, " overflows"));
  what.field = "offset";
  const uint64_t offset_at = c.pos();
  const uint64_t offset = c.read<uint64_t>(what);
  if (offset % alignment != 0)
    corrupt_at(offset_at, what, str_cat("data offset ", offset, " is not a multiple of the alignment ", alignment));

  info.type = *type;
  info.offset = offset;
  info.n_bytes = *n_bytes;
  info.n_elements = n_elements;
  tensor_index.emplace(tname, tensors.size());
  tensors.push_back(std::move(info));
}

void GgufFile::Impl::check_tensor_placement() {
  for (const GgufTensorInfo& t : tensors) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      fail(ErrorCode::kCorrupt, name, ": tensor '", t.name, "' (", t.describe(), ", ", t.n_bytes,
           " bytes at data offset ", t.offset, ") ends past the end of the file: the data section has ", data_size,
           " bytes from offset ", data_start);
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = tensors[order[k - 1]];
    const GgufTensorInfo& cur = tensors[order[k]];
    if (prev.offset + prev.n_bytes > cur.offset)  // no overflow: both inside the file
      fail(ErrorCode::kCorrupt, name, ": tensors '", prev.name, "' (data offset ", prev.offset, ", ", prev.n_bytes,
           " bytes) and '", cur.name, "' (data offset ", cur.offset, ") overlap at offset ", data_start + cur.offset);
  }
}

// ---- GgufFile ------------------------------------------------------------------

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->mapping.emplace(path);
  impl->bytes = {reinterpret_cast<const uint8_t*>(impl->mapping->data()), impl->mapping->size()};
  impl->name = path;
  impl->parse();
  return GgufFile(std::move(impl));
}

GgufFile GgufFile::from_bytes(std::span<const uint8_t> bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->bytes = bytes;
  impl->name = std::move(name);
  impl->parse();
  return GgufFile(std::move(impl));
}

const std::string& GgufFile::name() const { return impl_->name; }
uint32_t GgufFile::version() const { return impl_->version; }
uint64_t GgufFile::alignment() const { return impl_->alignment; }
uint64_t GgufFile::file_size() const { return impl_->bytes.size(); }
const std::vector<GgufKeyValue>& GgufFile::metadata() const { return impl_->metadata; }
const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return impl_->tensors; }

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? nullptr : &impl_->metadata[it->second].value;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

std::span<const uint8_t> GgufFile::tensor_data(const GgufTensorInfo& tensor) const {
  // The info may come from elsewhere: check it against this file again.
  if (tensor.offset > impl_->data_size || tensor.n_bytes > impl_->data_size - tensor.offset)
    fail(ErrorCode::kInvalidArgument, impl_->name, ": tensor '", tensor.name, "' is not inside this file's data");
  return impl_->bytes.subspan(impl_->data_start + tensor.offset, tensor.n_bytes);
}

void GgufFile::release_tensor_pages(const GgufTensorInfo& tensor) const {
  if (!impl_->mapping) return;
  const std::span<const uint8_t> data = tensor_data(tensor);
  impl_->mapping->drop_pages(size_t(data.data() - impl_->bytes.data()), data.size());
}

std::vector<float> GgufFile::tensor_f32(const GgufTensorInfo& tensor) const {
  const auto data = tensor_data(tensor);
  std::vector<float> out(static_cast<size_t>(tensor.n_elements));
  try {
    dequantize(tensor.type, data, out);
  } catch (const Error& e) {
    fail(e.code(), impl_->name, ": tensor '", tensor.name, "': ", e.what());
  }
  return out;
}

// ---- typed getters -------------------------------------------------------------

namespace {

[[noreturn]] void wrong_type(const std::string& file, std::string_view key, const GgufValue& v, const char* expected) {
  std::string actual = gguf_type_name(v.type);
  if (v.type == GgufType::kArray) actual = str_cat("array of ", gguf_type_name(v.array_type));
  fail(ErrorCode::kCorrupt, file, ": key '", key, "' has type ", actual, ", expected ", expected, " (value at offset ",
       v.file_offset, ")");
}

const GgufValue& require(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.find(key);
  if (v == nullptr) fail(ErrorCode::kCorrupt, file.name(), ": missing key '", key, "'");
  return *v;
}

}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::kString) wrong_type(impl_->name, key, v, "string");
  return std::string(v.str);
}

uint64_t GgufFile::get_uint(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (is_unsigned(v.type)) return v.u;
  if (is_signed(v.type)) {
    if (v.i < 0)
      fail(ErrorCode::kCorrupt, impl_->name, ": key '", key, "' = ", v.i, " is negative, expected an unsigned value");
    return static_cast<uint64_t>(v.i);
  }
  wrong_type(impl_->name, key, v, "an integer");
}

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (is_signed(v.type)) return v.i;
  if (is_unsigned(v.type)) {
    if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(ErrorCode::kCorrupt, impl_->name, ": key '", key, "' = ", v.u, " does not fit int64");
    return static_cast<int64_t>(v.u);
  }
  wrong_type(impl_->name, key, v, "an integer");
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::kF32 && v.type != GgufType::kF64) wrong_type(impl_->name, key, v, "f32 or f64");
  return v.f;
}

bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::kBool) wrong_type(impl_->name, key, v, "bool");
  return v.b;
}

std::string GgufFile::get_string_or(std::string_view key, std::string fallback) const {
  return has(key) ? get_string(key) : fallback;
}
uint64_t GgufFile::get_uint_or(std::string_view key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : fallback;
}
double GgufFile::get_float_or(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool_or(std::string_view key, bool fallback) const { return has(key) ? get_bool(key) : fallback; }

std::vector<std::string_view> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::kArray || v.array_type != GgufType::kString) wrong_type(impl_->name, key, v, "array of string");
  Cursor c(impl_->bytes, impl_->name, v.file_offset);
  std::vector<std::string_view> out;
  out.reserve(v.array_count);  // bounded by the file size at open()
  for (uint64_t k = 0; k < v.array_count; ++k) out.push_back(c.string({"key", key, 0, "element"}));
  return out;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::kArray || v.array_type != GgufType::kF32) wrong_type(impl_->name, key, v, "array of f32");
  Cursor c(impl_->bytes, impl_->name, v.file_offset);
  std::vector<float> out(v.array_count);
  for (float& x : out) x = c.read<float>({"key", key, 0, "element"});
  return out;
}

std::vector<int32_t> GgufFile::get_i32_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  const GgufType t = v.array_type;
  if (v.type != GgufType::kArray || !(is_signed(t) || is_unsigned(t)))
    wrong_type(impl_->name, key, v, "array of integers");
  Cursor c(impl_->bytes, impl_->name, v.file_offset);
  std::vector<int32_t> out(v.array_count);
  const What what{"key", key, 0, "element"};
  for (uint64_t k = 0; k < v.array_count; ++k) {
    GgufValue e;
    read_scalar(c, t, what, impl_->name, e);
    const bool fits = is_signed(t) ? (e.i >= std::numeric_limits<int32_t>::min() &&
                                      e.i <= std::numeric_limits<int32_t>::max())
                                   : e.u <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    if (!fits)
      fail(ErrorCode::kCorrupt, impl_->name, ": key '", key, "' element ", k, " = ",
           is_signed(t) ? std::to_string(e.i) : std::to_string(e.u), " does not fit int32");
    out[k] = is_signed(t) ? static_cast<int32_t>(e.i) : static_cast<int32_t>(e.u);
  }
  return out;
}

}  // namespace longctx::model
