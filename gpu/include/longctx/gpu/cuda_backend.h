// The CUDA backend: the Backend interface (core/backend.h) on one NVIDIA GPU,
// and its DeviceAttention. GEMMs go through cuBLAS (weights stored bf16 or
// f16, activations f32 converted on the fly, fp32 accumulation); RMSNorm,
// RoPE, SwiGLU, add and embedding are CUDA kernels; everything is queued on
// one compute stream, device->host copies of prefill K/V on a copy stream
// into pinned buffers, ordered by events. Device memory and pinned host
// memory come from budgeted pools: asking for more than the budget throws
// Error(kOutOfMemory) and leaves the backend as it was.
//
// This header has no CUDA include; in a build without CUDA make_cuda_backend
// throws Error(kUnsupported) saying so.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "longctx/core/backend.h"

namespace longctx::gpu {

struct CudaBackendOptions {
  int device = 0;                        // CUDA device index
  DType weight_dtype = DType::kBF16;     // kBF16 or kF16 (kF32: fp32 GEMMs, for tests)
  uint64_t device_budget_bytes = 0;      // 0 = 90% of the device's free memory at creation
  uint64_t pinned_budget_bytes = 256ull << 20;  // pinned host staging (counted like DRAM)
  // A decode step's CPU part runs while the device attends the local window.
  // false: DeviceAttention::decode_local returns only after the window's
  // attention too (the serial baseline that longctx-bench gpu compares with).
  bool overlap_decode = true;
};

// Throws Error(kUnsupported) without CUDA or without a device ("no CUDA
// device: <reason>"), Error(kInvalidArgument) for a bad option.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

// Working with another CUDA library's tensors and streams (longctx.torch
// drives DeviceAttention with PyTorch's): `backend` must be one that
// make_cuda_backend made (else Error(kInvalidArgument) naming it).
//
// Device memory the caller owns, on the backend's device, as a tensor of the
// backend: row-major `shape` of `dtype` at `data`, not copied and not freed.
// Error(kInvalidArgument) naming `what` for host memory, another device's, or
// a null pointer. The caller keeps the memory alive until the backend's work
// on it is done, in stream order: join_stream.
std::unique_ptr<BackendTensor> wrap_device_memory(Backend& backend, void* data, std::vector<int64_t> shape,
                                                  DType dtype, const char* what);
// Stream hand-off without blocking the host; `stream` is a cudaStream_t as an
// integer (0: the legacy default stream). wait_for_stream: the backend's work
// queued from now on runs after what `stream` has queued so far. join_stream:
// the work `stream` queues from now on runs after everything the backend has
// queued so far (its compute and copy streams).
void wait_for_stream(Backend& backend, uintptr_t stream);
void join_stream(Backend& backend, uintptr_t stream);

}  // namespace longctx::gpu
