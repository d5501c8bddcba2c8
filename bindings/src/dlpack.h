// Zero-copy tensor exchange with PyTorch, NumPy and any other producer of the
// DLPack protocol (__dlpack__ / __dlpack_device__).
//
// The structs below follow the public DLPack C ABI (github.com/dmlc/dlpack,
// include/dlpack/dlpack.h, the unversioned DLManagedTensor of DLPack <= 0.8,
// exchanged in a PyCapsule named "dltensor" and renamed "used_dltensor" by the
// consumer). They are declared here from the specification so that the
// bindings need no extra dependency; torch 1.13 and numpy 1.24 speak exactly
// this version.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace longctx::bindings {

// ---- the DLPack ABI -------------------------------------------------------

enum DLDeviceTypeCode : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10, kDLROCMHost = 11 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };

struct DLDevice {
  int32_t device_type;  // DLDeviceTypeCode
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;    // [ndim]
  int64_t* strides;  // [ndim] in elements; null = compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// ---- longctx's side ---------------------------------------------------------

// "f32", "bf16", "i64", "u8", "bool", "c64"; "float24" style for the unknown.
std::string dtype_name(DLDataType dtype);
// "cpu", "cuda:0", "cuda_host:0", "device_type_7:0".
std::string device_name(DLDevice device);

// A tensor taken from a DLPack producer: it owns the DLManagedTensor (the
// producer's memory stays alive until this is destroyed) and calls its
// deleter, with the GIL held, on destruction.
class ImportedTensor {
 public:
  // Imports `obj` (anything with __dlpack__). `what` names the argument in
  // errors. Not a tensor -> TypeError; a device other than the host when
  // !any_device -> longctx::Error "q: expected a CPU tensor, got cuda:0",
  // asked from __dlpack_device__ before the export when the object has it.
  static std::shared_ptr<ImportedTensor> import(pybind11::handle obj, const std::string& what,
                                                bool any_device = false);
  ~ImportedTensor();
  ImportedTensor(const ImportedTensor&) = delete;
  ImportedTensor& operator=(const ImportedTensor&) = delete;

  // First element (data + byte_offset).
  void* data() const { return data_; }
  DLDataType dtype() const { return managed_->dl_tensor.dtype; }
  DLDevice device() const { return managed_->dl_tensor.device; }
  bool on_host() const;
  int ndim() const { return int(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }  // elements
  int64_t numel() const;
  // "[3, 4, 64] f32"
  std::string describe() const;
  // Bytes of one element (bits * lanes / 8, rounded up).
  size_t element_bytes() const;

 private:
  explicit ImportedTensor(DLManagedTensor* managed) : managed_(managed) {}
  DLManagedTensor* managed_ = nullptr;
  void* data_ = nullptr;
  std::vector<int64_t> shape_, strides_;
};

// A new "dltensor" capsule describing `tensor`'s memory; the consumer's
// deleter call (or the capsule's destruction when unconsumed) drops the
// reference to `keep_alive`, which must keep `tensor` alive.
pybind11::capsule export_dlpack(const ImportedTensor& tensor, pybind11::object keep_alive);

// Registers longctx.Tensor and longctx.from_dlpack.
void bind_tensor(pybind11::module_& m);

}  // namespace longctx::bindings
