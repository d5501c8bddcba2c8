// Pieces of the CUDA backend shared by its source files (private to gpu/src):
// the tensor type, the streams and pools every part uses, host-side copies of
// strided views, and the DeviceAttention factory.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda_pool.h"
#include "longctx/core/backend.h"
#include "longctx/core/tensor.h"

namespace longctx::gpu::detail {

// A backend tensor: device memory from the backend's device pool, or memory
// another library owns on the backend's device (wrap_device_memory).
class CudaTensor final : public BackendTensor {
 public:
  static constexpr const char* kBackendName = "CudaBackend";  // backend_tensor_cast's errors
  CudaTensor(DType dtype, std::vector<int64_t> shape, PoolBlock block)
      : BackendTensor(dtype, std::move(shape)), block_(std::move(block)), data_(block_.get()) {}
  CudaTensor(DType dtype, std::vector<int64_t> shape, void* foreign)
      : BackendTensor(dtype, std::move(shape)), data_(foreign) {}
  void* data() override { return data_; }
  const void* data() const override { return data_; }

 private:
  PoolBlock block_;  // empty for foreign memory
  void* data_;
};

// What the backend and its DeviceAttention share. Streams are non-blocking;
// `compute` runs every op in order, `copy` the D2H copies of prefill K/V.
struct CudaContext {
  int device = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  std::shared_ptr<MemoryPool> device_pool;
  std::shared_ptr<MemoryPool> pinned_pool;
  bool overlap_decode = true;  // CudaBackendOptions::overlap_decode
};

// Makes the context's device current for this thread.
void activate(const CudaContext& context);

// Enqueues a host-to-device copy on `stream`; returns when src may be reused
// (waits for the copy when src is pinned). `what` names it in errors.
void copy_host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, const char* what);

// The DeviceAttention of a backend (cuda_device_attention.cpp); unconfigured.
std::unique_ptr<DeviceAttention> make_device_attention(const CudaContext& context);

}  // namespace longctx::gpu::detail
