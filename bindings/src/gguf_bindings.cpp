// GGUF files for Python code: the tensors dequantized to NumPy f32 and the
// metadata as a dict (e.g. to load a GGUF model into a PyTorch reference).
#include <pybind11/stl.h>

#include <cstring>

#include "common.h"
#include "longctx/core/error.h"
#include "longctx/core/file.h"
#include "longctx/model/gguf.h"

namespace longctx::bindings {
namespace {

using model::GgufFile;
using model::GgufType;

std::string path_of(py::handle path) { return py::str(py::module_::import("os").attr("fspath")(path)); }

size_t scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

template <typename T>
T read_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // GGUF is little-endian, like every machine longctx runs on
  return v;
}

py::object scalar_at(GgufType t, const std::byte* p) {
  switch (t) {
    case GgufType::kU8: return py::int_(read_le<uint8_t>(p));
    case GgufType::kI8: return py::int_(read_le<int8_t>(p));
    case GgufType::kU16: return py::int_(read_le<uint16_t>(p));
    case GgufType::kI16: return py::int_(read_le<int16_t>(p));
    case GgufType::kU32: return py::int_(read_le<uint32_t>(p));
    case GgufType::kI32: return py::int_(read_le<int32_t>(p));
    case GgufType::kU64: return py::int_(read_le<uint64_t>(p));
    case GgufType::kI64: return py::int_(read_le<int64_t>(p));
    case GgufType::kF32: return py::float_(read_le<float>(p));
    case GgufType::kF64: return py::float_(read_le<double>(p));
    case GgufType::kBool: return py::bool_(read_le<uint8_t>(p) != 0);
    default: return py::none();
  }
}

py::object value_of(const GgufFile& f, const MappedFile& bytes, const model::GgufKeyValue& kv) {
  const model::GgufValue& v = kv.value;
  switch (v.type) {
    case GgufType::kString: return utf8(std::string(v.str));
    case GgufType::kArray: break;
    case GgufType::kF32: case GgufType::kF64: return py::float_(v.f);
    case GgufType::kBool: return py::bool_(v.b);
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64: return py::int_(v.u);
    default: return py::int_(v.i);
  }
  py::list out;
  if (v.array_type == GgufType::kString) {
    for (std::string_view s : f.get_string_array(kv.key)) out.append(utf8(std::string(s)));
    return out;
  }
  const size_t es = scalar_bytes(v.array_type);
  if (es == 0) return py::none();  // arrays of arrays: not used by any model key
  // open() checked that the array lies inside the file; check again against this mapping.
  if (v.array_count > (bytes.size() - std::min<uint64_t>(bytes.size(), v.file_offset)) / es)
    fail(ErrorCode::kCorrupt, f.name(), ": key '", kv.key, "': array outside the file (it changed since it was opened?)");
  for (uint64_t i = 0; i < v.array_count; ++i) out.append(scalar_at(v.array_type, bytes.data() + v.file_offset + i * es));
  return out;
}

py::dict read_metadata(py::handle path) {
  const std::string p = path_of(path);
  std::optional<GgufFile> f;
  std::optional<MappedFile> bytes;
  {
    py::gil_scoped_release nogil;
    f.emplace(GgufFile::open(p));
    bytes.emplace(p);
  }
  if (bytes->size() != f->file_size()) fail(ErrorCode::kIo, p, ": the file changed while it was read");
  py::dict d;
  for (const model::GgufKeyValue& kv : f->metadata()) d[utf8(kv.key)] = value_of(*f, *bytes, kv);
  return d;
}

py::dict read_tensors(py::handle path, py::handle names) {
  const std::string p = path_of(path);
  std::optional<GgufFile> f;
  {
    py::gil_scoped_release nogil;
    f.emplace(GgufFile::open(p));
  }
  std::vector<const model::GgufTensorInfo*> wanted;
  if (names.is_none()) {
    for (const model::GgufTensorInfo& t : f->tensors()) wanted.push_back(&t);
  } else {
    for (const std::string& name : names.cast<std::vector<std::string>>()) {
      const model::GgufTensorInfo* t = f->find_tensor(name);
      if (t == nullptr) fail(ErrorCode::kInvalidArgument, p, ": no tensor '", name, "'");
      wanted.push_back(t);
    }
  }
  py::dict d;
  for (const model::GgufTensorInfo* t : wanted) {
    // GGUF lists dims innermost first; PyTorch weights are [rows, cols]: reversed.
    std::vector<int64_t> shape(t->dims.rbegin(), t->dims.rend());
    py::array_t<float> a = new_f32(shape);
    float* out = a.mutable_data();
    {
      py::gil_scoped_release nogil;
      const std::vector<float> values = f->tensor_f32(*t);
      std::copy(values.begin(), values.end(), out);
    }
    d[utf8(t->name)] = std::move(a);
  }
  return d;
}

}  // namespace

void bind_gguf(py::module_& m) {
  m.def("read_gguf_tensors", &read_tensors, py::arg("path"), py::arg("names") = py::none(),
        "The tensors of a GGUF file (all, or `names`) as f32 NumPy arrays, dequantized, shaped as the GGUF dims "
        "reversed (row-major [rows, cols], like PyTorch weights).");
  m.def("read_gguf_metadata", &read_metadata, py::arg("path"),
        "The metadata of a GGUF file as a dict (arrays as lists).");
}

}  // namespace longctx::bindings
