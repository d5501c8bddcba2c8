// Helpers shared by the binding files: tensor arguments (DLPack in, checked,
// seen as longctx views), NumPy results, config arguments, and the
// registration function of each topic.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlpack.h"
#include "longctx/core/config.h"
#include "longctx/core/tensor.h"

namespace longctx::bindings {

namespace py = pybind11;

// One expected dimension of a tensor argument: a fixed extent, or any extent
// shown by its name ("n") in messages.
struct Dim {
  Dim(int64_t extent) : size(extent) {}  // NOLINT: implicit on purpose, {8, 64}
  Dim(const char* any) : size(-1), name(any) {}  // NOLINT
  int64_t size;
  const char* name = nullptr;
};

// A tensor argument, imported and checked. `tensor` keeps the producer's
// memory alive: keep the Arg until the computation on `view` is over.
struct Arg {
  std::shared_ptr<ImportedTensor> tensor;
  MutableTensorView view;  // writable only for out= arguments
  TensorView cview() const { return as_const(view); }
};

// Imports `obj` and checks it: a host tensor, one of `dtypes`, exactly these
// dims, no negative stride, innermost dimension contiguous (or fully
// contiguous when `contiguous`). Not a tensor: TypeError; anything else:
// longctx::Error "q: expected [n, 8, 64] f32, got [3, 4, 64] f32".
Arg tensor_arg(py::handle obj, const std::string& what, const std::vector<Dim>& dims,
               const std::vector<DType>& dtypes, bool contiguous = false);
// The same checks on a tensor already imported.
Arg check_arg(std::shared_ptr<ImportedTensor> tensor, const std::string& what, const std::vector<Dim>& dims,
              const std::vector<DType>& dtypes, bool contiguous = false);
inline const std::vector<DType> kF32Only{DType::kF32};
inline const std::vector<DType> kKVTypes{DType::kF32, DType::kF16, DType::kBF16};

// A new C-contiguous f32 NumPy array that owns its memory, and a view of it.
py::array_t<float> new_f32(const std::vector<int64_t>& shape);
MutableTensorView view_of(py::array_t<float>& array);

// Text from C++ (token pieces, file names) as str; invalid UTF-8 is replaced.
py::str utf8(const std::string& text);

// longctx.Config: a validated LongContextConfig.
struct PyConfig {
  LongContextConfig config;
};

// A config argument: None = defaults, a longctx.Config, a path (str or
// os.PathLike) to a YAML file, or a dict (as Config.from_dict).
LongContextConfig config_arg(py::handle obj);

// One registration function per topic (module.cpp calls them in this order).
void bind_config(py::module_& m);
void bind_store(py::module_& m);
void bind_attention(py::module_& m);
void bind_model(py::module_& m);
void bind_tokenizer(py::module_& m);
void bind_gguf(py::module_& m);

}  // namespace longctx::bindings
