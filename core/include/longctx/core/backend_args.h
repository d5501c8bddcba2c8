// Argument checks of the Backend ops (backend.h), shared by every backend so
// that a wrong call fails with the same message on each: ranks, shapes,
// dtypes and ranges, Error(kInvalidArgument) naming the op and the argument.
// A backend first checks that the tensors are its own (backend_tensor_cast),
// then calls these, then adds limits of its own (cuBLAS's 32-bit sizes, say).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "longctx/core/backend.h"
#include "longctx/core/tensor.h"

namespace longctx {

// `t` as one backend's own tensor type, Tensor (derived from BackendTensor,
// Tensor::kBackendName naming the backend), or Error(kInvalidArgument)
// "matmul: x f32[2, 3] is not a CpuBackend tensor".
[[noreturn]] void fail_foreign_tensor(const BackendTensor& t, const char* backend, const char* op, const char* arg);
template <class Tensor>
const Tensor& backend_tensor_cast(const BackendTensor& t, const char* op, const char* arg) {
  const auto* own = dynamic_cast<const Tensor*>(&t);
  if (own == nullptr) fail_foreign_tensor(t, Tensor::kBackendName, op, arg);
  return *own;
}
template <class Tensor>
Tensor& backend_tensor_cast(BackendTensor& t, const char* op, const char* arg) {
  return const_cast<Tensor&>(backend_tensor_cast<Tensor>(std::as_const(t), op, arg));
}

// The bytes of a new tensor of `shape` and `dtype` (alloc, or a weight a
// backend converts): Error(kInvalidArgument) "CpuBackend::alloc: invalid
// shape [3, -1]" for a negative extent or an element count past int64_t,
// Error(kOutOfMemory) when the bytes overflow size_t; `backend` and `op`
// name the call.
size_t backend_tensor_bytes(std::span<const int64_t> shape, DType dtype, const char* backend, const char* op);

// Product of the extents after the first (the row length of an [n, ...] tensor).
int64_t backend_row_length(const BackendTensor& t);
// "op: arg must be f32, got bf16[2, 3]".
void check_backend_dtype(const BackendTensor& t, DType dtype, const char* op, const char* arg);

// upload / download: a valid host view of the tensor's dtype and element count.
void check_upload_args(const TensorView& src, const BackendTensor& dst);
void check_download_args(const BackendTensor& src, const MutableTensorView& dst);

struct MatmulDims {
  int64_t n = 0, in = 0, out = 0;
};
// "x f32[2, 8], w bf16[5, 8], y f32[2, 5], bias f32[5]" (no bias when null):
// the matmul arguments as its errors list them.
std::string describe_matmul_args(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias,
                                 const BackendTensor& y);
// y[n, out] = x[n, in] w[out, in]^T (+ bias[out]): f32 x and y, y not
// aliasing x (the weight's type is each backend's to check).
MatmulDims check_matmul_args(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias,
                             const BackendTensor& y);
// load_weight: a shape without overflow whose rows are whole blocks of the
// type, exactly ggml_bytes(type, numel) bytes, and finite block scales.
void check_host_weight(const HostWeight& w);
// f32 x [..., d], weight [d], y like x; finite eps >= 0.
void check_rms_norm_args(const BackendTensor& x, const BackendTensor& weight, float eps, const BackendTensor& y);
// f32 x [n, n_heads, head_dim], n_rot <= head_dim, first_pos >= 0 and
// first_pos + n representable (the RoPE params themselves: rope_inv_freq).
void check_rope_args(const BackendTensor& x, int64_t first_pos, const RopeParams& params);
// Elementwise ops (swiglu: gate, up, out; add: a, b, out): three f32 tensors of one shape.
void check_elementwise_args(const char* op, const char* const (&names)[3], const BackendTensor& a,
                            const BackendTensor& b, const BackendTensor& out);
// table [n_vocab, d], f32 out [tokens, d], every token in [0, n_vocab).
void check_embed_args(const BackendTensor& table, std::span<const int32_t> tokens, const BackendTensor& out);

}  // namespace longctx
