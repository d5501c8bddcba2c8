#include "dlpack.h"

#include <pybind11/stl.h>

#include <limits>

#include "longctx/core/error.h"

namespace py = pybind11;

namespace longctx::bindings {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr int kMaxDims = 64;  // far above any real tensor; bounds what we trust from a producer

std::string type_name_of(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

// (device_type, device_id) from __dlpack_device__; TypeError when it is not that.
DLDevice parse_device(py::handle obj, const std::string& what) {
  py::object dev = obj.attr("__dlpack_device__")();
  if (!py::isinstance<py::tuple>(dev) || py::len(dev) != 2)
    throw py::type_error(what + ": __dlpack_device__() must return a (device_type, device_id) tuple, got " +
                         std::string(py::repr(dev)));
  try {
    py::tuple t = dev.cast<py::tuple>();
    return DLDevice{t[0].cast<int32_t>(), t[1].cast<int32_t>()};
  } catch (const py::cast_error&) {
    throw py::type_error(what + ": __dlpack_device__() returned " + std::string(py::repr(dev)) +
                         ", expected two integers");
  }
}

bool host_device(DLDevice d) {
  return d.device_type == kDLCPU || d.device_type == kDLCUDAHost || d.device_type == kDLROCMHost;
}

// What a consumer frees: the shapes we describe and a reference to the owner.
struct ExportContext {
  py::object keep_alive;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) {
  auto* ctx = static_cast<ExportContext*>(self->manager_ctx);
  // Consumers may free from any thread (torch frees where the tensor dies); a
  // Python reference needs the GIL. At interpreter exit the object is leaked.
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  delete ctx;
}

void capsule_destructor(PyObject* capsule) {
  // Still named "dltensor": nobody consumed it, so the deleter is ours to call.
  if (PyCapsule_IsValid(capsule, kCapsuleName)) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
}

}  // namespace

std::string dtype_name(DLDataType dtype) {
  std::string base;
  switch (dtype.code) {
    case kDLFloat: base = dtype.bits == 32 ? "f32" : dtype.bits == 16 ? "f16" : dtype.bits == 64 ? "f64" : ""; break;
    case kDLBfloat: base = dtype.bits == 16 ? "bf16" : ""; break;
    case kDLInt: base = "i" + std::to_string(dtype.bits); break;
    case kDLUInt: base = "u" + std::to_string(dtype.bits); break;
    case kDLBool: base = "bool"; break;
    case kDLComplex: base = "c" + std::to_string(dtype.bits); break;
    default: break;
  }
  if (base.empty()) base = str_cat("dtype_code_", int(dtype.code), "_bits_", int(dtype.bits));
  if (dtype.lanes != 1) base += str_cat("x", dtype.lanes);
  return base;
}

std::string device_name(DLDevice device) {
  switch (device.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return str_cat("cuda:", device.device_id);
    case kDLCUDAHost: return str_cat("cuda_host:", device.device_id);
    case kDLROCM: return str_cat("rocm:", device.device_id);
    case kDLROCMHost: return str_cat("rocm_host:", device.device_id);
    default: return str_cat("device_type_", device.device_type, ":", device.device_id);
  }
}

std::shared_ptr<ImportedTensor> ImportedTensor::import(py::handle obj, const std::string& what, bool any_device) {
  if (obj.is_none() || !py::hasattr(obj, "__dlpack__"))
    throw py::type_error(what + ": expected a tensor (an object with __dlpack__, such as a torch.Tensor or a "
                                "numpy.ndarray), got " + type_name_of(obj));
  // Ask the device first: a CUDA producer would otherwise sync streams for nothing.
  if (py::hasattr(obj, "__dlpack_device__")) {
    const DLDevice dev = parse_device(obj, what);
    if (!any_device && !host_device(dev))
      fail(ErrorCode::kInvalidArgument, what, ": expected a CPU tensor, got ", device_name(dev));
  }
  py::object capsule = obj.attr("__dlpack__")();
  if (!PyCapsule_IsValid(capsule.ptr(), kCapsuleName))
    throw py::type_error(what + ": __dlpack__() returned " + type_name_of(capsule) +
                         ", not an unused 'dltensor' capsule");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();
  // Renamed, the capsule no longer frees the tensor: from here on it is ours
  // to release (the destructor calls the deleter).
  if (PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName) != 0) throw py::error_already_set();
  std::shared_ptr<ImportedTensor> t(new ImportedTensor(managed));

  const DLTensor& dl = managed->dl_tensor;
  if (dl.ndim < 0 || dl.ndim > kMaxDims || (dl.ndim > 0 && dl.shape == nullptr))
    throw py::value_error(str_cat(what, ": the producer's DLPack tensor has ", dl.ndim, " dimensions",
                                  dl.ndim > 0 && dl.shape == nullptr ? " and no shape" : ""));
  if (!any_device && !host_device(dl.device))
    fail(ErrorCode::kInvalidArgument, what, ": expected a CPU tensor, got ", device_name(dl.device));
  t->shape_.assign(dl.shape, dl.shape + dl.ndim);
  for (int64_t d : t->shape_)
    if (d < 0) throw py::value_error(str_cat(what, ": the producer's DLPack tensor has a negative extent ", d));
  if (dl.strides != nullptr) {
    t->strides_.assign(dl.strides, dl.strides + dl.ndim);
  } else {
    t->strides_.assign(size_t(dl.ndim), 1);
    for (int i = dl.ndim - 2; i >= 0; --i) t->strides_[size_t(i)] = t->strides_[size_t(i) + 1] * t->shape_[size_t(i) + 1];
  }
  t->data_ = static_cast<char*>(dl.data) + dl.byte_offset;
  return t;
}

ImportedTensor::~ImportedTensor() {
  if (managed_ != nullptr && managed_->deleter != nullptr) {
    // NumPy's deleter drops a Python reference.
    py::gil_scoped_acquire gil;
    managed_->deleter(managed_);
  }
}

bool ImportedTensor::on_host() const { return host_device(device()); }

int64_t ImportedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

size_t ImportedTensor::element_bytes() const { return (size_t(dtype().bits) * dtype().lanes + 7) / 8; }

std::string ImportedTensor::describe() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) s += str_cat(i ? ", " : "", shape_[i]);
  return s + "] " + dtype_name(dtype());
}

py::capsule export_dlpack(const ImportedTensor& tensor, py::object keep_alive) {
  auto ctx = std::make_unique<ExportContext>();
  ctx->keep_alive = std::move(keep_alive);
  ctx->shape = tensor.shape();
  ctx->strides = tensor.strides();
  DLTensor& dl = ctx->managed.dl_tensor;
  // byte_offset folded into data: torch 1.13 ignores byte_offset when it imports.
  dl.data = tensor.data();
  dl.device = tensor.device();
  dl.ndim = tensor.ndim();
  dl.dtype = tensor.dtype();
  dl.shape = ctx->shape.empty() ? nullptr : ctx->shape.data();
  dl.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = delete_export;
  PyObject* capsule = PyCapsule_New(&ctx->managed, kCapsuleName, capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  ctx.release();  // owned by the capsule / its consumer now
  return py::reinterpret_steal<py::capsule>(capsule);
}

namespace {

// longctx.Tensor: a view of another library's tensor memory.
struct Tensor {
  std::shared_ptr<ImportedTensor> t;
};

py::tuple to_tuple(const std::vector<int64_t>& v) {
  py::tuple out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = py::int_(v[i]);
  return out;
}

}  // namespace

void bind_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor",
                     "A zero-copy view of a tensor from another library (longctx.from_dlpack); it keeps the "
                     "source's memory alive and exports it again through __dlpack__.")
      .def_property_readonly("shape", [](const Tensor& s) { return to_tuple(s.t->shape()); })
      .def_property_readonly("strides", [](const Tensor& s) { return to_tuple(s.t->strides()); },
                             "Strides in elements.")
      .def_property_readonly("dtype", [](const Tensor& s) { return dtype_name(s.t->dtype()); })
      .def_property_readonly("device", [](const Tensor& s) { return device_name(s.t->device()); })
      .def_property_readonly("ndim", [](const Tensor& s) { return s.t->ndim(); })
      .def("numel", [](const Tensor& s) { return s.t->numel(); })
      .def("data_ptr", [](const Tensor& s) { return reinterpret_cast<uintptr_t>(s.t->data()); },
           "Address of the first element.")
      .def(
          "__dlpack__",
          [](py::object self, py::object /*stream*/) {
            // Our memory is already there: no stream to synchronize with.
            return export_dlpack(*self.cast<const Tensor&>().t, self);
          },
          py::arg("stream") = py::none())
      .def("__dlpack_device__",
           [](const Tensor& s) { return py::make_tuple(s.t->device().device_type, s.t->device().device_id); })
      .def("__repr__", [](const Tensor& s) {
        return str_cat("longctx.Tensor(", s.t->describe(), ", device=", device_name(s.t->device()), ")");
      });
  m.def(
      "from_dlpack", [](py::handle x) { return Tensor{ImportedTensor::import(x, "from_dlpack", /*any_device=*/true)}; },
      py::arg("x"),
      "A longctx.Tensor viewing x's memory (any object with __dlpack__; no copy). Any device is accepted "
      "here; functions that compute require CPU tensors.");
}

}  // namespace longctx::bindings
