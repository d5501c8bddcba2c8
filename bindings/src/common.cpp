#include "common.h"

#include <algorithm>
#include <optional>

#include "longctx/core/error.h"

namespace longctx::bindings {
namespace {

std::optional<DType> longctx_dtype(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
  if (t.code == kDLFloat && t.bits == 16) return DType::kF16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
  return std::nullopt;
}

std::string expected_text(const std::vector<Dim>& dims, const std::vector<DType>& dtypes) {
  std::string s = "[";
  size_t i = 0;
  for (const Dim& d : dims) s += str_cat(i++ ? ", " : "", d.name != nullptr ? std::string(d.name) : std::to_string(d.size));
  s += "] ";
  i = 0;
  for (DType t : dtypes) s += str_cat(i++ ? "/" : "", dtype_name(t));
  return s;
}

// Stands in for the null data pointer some producers give empty tensors.
alignas(64) std::byte g_empty[64];

}  // namespace

Arg tensor_arg(py::handle obj, const std::string& what, const std::vector<Dim>& dims,
               const std::vector<DType>& dtypes, bool contiguous) {
  return check_arg(ImportedTensor::import(obj, what), what, dims, dtypes, contiguous);
}

Arg check_arg(std::shared_ptr<ImportedTensor> tensor, const std::string& what, const std::vector<Dim>& dims,
              const std::vector<DType>& dtypes, bool contiguous) {
  Arg arg;
  arg.tensor = std::move(tensor);
  const ImportedTensor& t = *arg.tensor;
  const std::optional<DType> dtype = longctx_dtype(t.dtype());
  bool ok = dtype && std::find(dtypes.begin(), dtypes.end(), *dtype) != dtypes.end() &&
            t.ndim() == int(dims.size());
  for (int d = 0; ok && d < t.ndim(); ++d) {
    const int64_t want = dims[size_t(d)].size;
    ok = want < 0 || t.shape()[size_t(d)] == want;
  }
  if (!ok) fail(ErrorCode::kInvalidArgument, what, ": expected ", expected_text(dims, dtypes), ", got ", t.describe());
  MutableTensorView& v = arg.view;
  v.dtype = *dtype;
  v.rank = t.ndim();
  for (int d = 0; d < v.rank; ++d) {
    v.shape[size_t(d)] = t.shape()[size_t(d)];
    v.strides[size_t(d)] = t.strides()[size_t(d)];
  }
  for (int d = 0; d < v.rank; ++d)
    if (v.strides[size_t(d)] < 0)
      fail(ErrorCode::kInvalidArgument, what, ": negative strides are not supported (", v.describe(), ")");
  v.data = t.numel() == 0 ? static_cast<void*>(g_empty) : t.data();
  if (contiguous && !v.is_contiguous())
    fail(ErrorCode::kInvalidArgument, what, ": expected a contiguous tensor, got ", v.describe());
  if (t.numel() > 0 && v.rank > 0 && v.shape[size_t(v.rank - 1)] > 1 && v.strides[size_t(v.rank - 1)] != 1)
    fail(ErrorCode::kInvalidArgument, what, ": the innermost dimension must be contiguous (stride 1), got ",
         v.describe());
  if (v.rank > 0) v.strides[size_t(v.rank - 1)] = 1;  // an extent of 1 may come with any stride
  return arg;
}

py::array_t<float> new_f32(const std::vector<int64_t>& shape) {
  std::vector<py::ssize_t> s(shape.begin(), shape.end());
  return py::array_t<float>(s);
}

MutableTensorView view_of(py::array_t<float>& array) {
  MutableTensorView v;
  v.dtype = DType::kF32;
  v.rank = int(array.ndim());
  if (v.rank > kMaxTensorRank) fail(ErrorCode::kInternal, "view_of: rank ", v.rank);
  for (int d = 0; d < v.rank; ++d) {
    v.shape[size_t(d)] = array.shape(d);
    v.strides[size_t(d)] = array.strides(d) / py::ssize_t(sizeof(float));
  }
  v.data = array.size() == 0 ? static_cast<void*>(g_empty) : array.mutable_data();
  return v;
}

py::str utf8(const std::string& text) {
  PyObject* s = PyUnicode_DecodeUTF8(text.data(), py::ssize_t(text.size()), "replace");
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

}  // namespace longctx::bindings
