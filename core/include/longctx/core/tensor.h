// Tensor views: a pointer, a dtype, a shape and strides (in elements), owning
// nothing. Used at every API boundary of longctx (kernels, KV store, bindings).
// Shapes are outermost-first: a [n_tokens, n_kv_heads, head_dim] view has
// shape {n_tokens, n_kv_heads, head_dim}; a contiguous one has strides
// {n_kv_heads*head_dim, head_dim, 1}.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "longctx/core/dtype.h"

namespace longctx {

constexpr int kMaxTensorRank = 4;

// Ptr is void* (MutableTensorView) or const void* (TensorView).
template <typename Ptr>
struct BasicTensorView {
  Ptr data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, kMaxTensorRank> shape{};
  std::array<int64_t, kMaxTensorRank> strides{};  // in elements

  int64_t numel() const;
  bool is_contiguous() const;
  // Byte address of the element at `index` (rank entries).
  Ptr element(std::initializer_list<int64_t> index) const;
  // "f16[4096, 8, 128]" or "f16[4096, 8, 128] strides [2048, 256, 1]" when not contiguous.
  std::string describe() const;
};

using TensorView = BasicTensorView<const void*>;
using MutableTensorView = BasicTensorView<void*>;

// Contiguous (row-major) views.
TensorView make_view(const void* data, DType dtype, std::initializer_list<int64_t> shape);
MutableTensorView make_mutable_view(void* data, DType dtype, std::initializer_list<int64_t> shape);
// A mutable view seen as read-only.
TensorView as_const(const MutableTensorView& view);

// Throws Error(kInvalidArgument) naming `what` when `view` does not have
// exactly this shape (-1 matches any extent) and dtype, e.g.
// "k: expected shape [*, 8, 128], got f16[4096, 8, 64]".
void check_shape(const TensorView& view, const char* what, std::initializer_list<int64_t> shape);
void check_dtype(const TensorView& view, const char* what, DType dtype);
// Throws unless the innermost dimension is contiguous (stride 1) and data is non-null.
void check_inner_contiguous(const TensorView& view, const char* what);
// Throws Error(kInvalidArgument) naming `what`, the index and the value when
// an element of an f32, f16 or bf16 view with a contiguous innermost
// dimension is NaN or infinite (first_non_finite, row by row).
void check_finite(const TensorView& view, const char* what);

// Host copies between strided views and contiguous row-major buffers, shared
// by the backends' upload/download. check_host_view: rank, extents, dtype
// value and a null pointer, Error(kInvalidArgument) naming op and arg.
void check_host_view(const TensorView& view, const char* op, const char* arg);
// Copies (and converts) a strided view into contiguous dst of dst_dtype.
void gather_view(const TensorView& src, void* dst, DType dst_dtype);
// Copies contiguous src (of dst's dtype) into a strided view.
void scatter_view(const void* src, const MutableTensorView& dst);

}  // namespace longctx
