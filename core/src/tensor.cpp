#include "longctx/core/tensor.h"

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "longctx/core/error.h"

namespace longctx {
namespace {

// "[4096, 8, 128]"; -1 extents print as "*".
std::string format_extents(const int64_t* extents, int rank) {
  std::string text = "[";
  for (int d = 0; d < rank; ++d) {
    if (d > 0) text += ", ";
    text += extents[d] == -1 ? std::string("*") : std::to_string(extents[d]);
  }
  return text + "]";
}

template <typename Ptr>
BasicTensorView<Ptr> make_contiguous(Ptr data, DType dtype, std::initializer_list<int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxTensorRank)) {
    fail(ErrorCode::kInvalidArgument, "make_view: rank ", shape.size(), " ",
         format_extents(shape.begin(), static_cast<int>(shape.size())), " exceeds the maximum rank ",
         kMaxTensorRank);
  }
  dtype_size(dtype);  // rejects an invalid dtype value
  BasicTensorView<Ptr> view;
  view.data = data;
  view.dtype = dtype;
  view.rank = static_cast<int>(shape.size());
  int64_t numel = 1;
  for (int d = 0; d < view.rank; ++d) {
    const int64_t extent = shape.begin()[d];
    if (extent < 0) {
      fail(ErrorCode::kInvalidArgument, "make_view: negative extent in shape ",
           format_extents(shape.begin(), view.rank));
    }
    if (__builtin_mul_overflow(numel, extent, &numel)) {
      fail(ErrorCode::kInvalidArgument, "make_view: shape ", format_extents(shape.begin(), view.rank),
           " has more than 2^63 elements");
    }
    view.shape[d] = extent;
  }
  int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.strides[d] = stride;
    stride *= view.shape[d] > 0 ? view.shape[d] : 1;  // cannot overflow: bounded by numel
  }
  return view;
}

}  // namespace

template <typename Ptr>
int64_t BasicTensorView<Ptr>::numel() const {
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) count *= shape[d];
  return count;
}

// Dimensions of extent 1 may have any stride, and an empty view is contiguous
// (no element addresses differ), as in PyTorch.
template <typename Ptr>
bool BasicTensorView<Ptr>::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

template <typename Ptr>
Ptr BasicTensorView<Ptr>::element(std::initializer_list<int64_t> index) const {
  if (static_cast<int>(index.size()) != rank) {
    fail(ErrorCode::kInvalidArgument, "element: index ", format_extents(index.begin(), static_cast<int>(index.size())),
         " has ", index.size(), " entries for ", describe());
  }
  int64_t offset = 0;
  for (int d = 0; d < rank; ++d) {
    const int64_t i = index.begin()[d];
    if (i < 0 || i >= shape[d]) {
      fail(ErrorCode::kInvalidArgument, "element: index ", format_extents(index.begin(), rank),
           " is out of bounds of ", describe());
    }
    offset += i * strides[d];
  }
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Ptr>>, const std::byte, std::byte>;
  return static_cast<Byte*>(data) + offset * static_cast<int64_t>(dtype_size(dtype));
}

template <typename Ptr>
std::string BasicTensorView<Ptr>::describe() const {
  std::string text = dtype_name(dtype) + format_extents(shape.data(), rank);
  if (!is_contiguous()) text += " strides " + format_extents(strides.data(), rank);
  return text;
}

template struct BasicTensorView<const void*>;
template struct BasicTensorView<void*>;

TensorView make_view(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return make_contiguous<const void*>(data, dtype, shape);
}

MutableTensorView make_mutable_view(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return make_contiguous<void*>(data, dtype, shape);
}

TensorView as_const(const MutableTensorView& view) {
  TensorView result;
  result.data = view.data;
  result.dtype = view.dtype;
  result.rank = view.rank;
  result.shape = view.shape;
  result.strides = view.strides;
  return result;
}

void check_shape(const TensorView& view, const char* what, std::initializer_list<int64_t> shape) {
  bool matches = view.rank == static_cast<int>(shape.size());
  for (int d = 0; matches && d < view.rank; ++d) {
    const int64_t expected = shape.begin()[d];
    matches = expected == -1 || expected == view.shape[d];
  }
  if (!matches) {
    fail(ErrorCode::kInvalidArgument, what, ": expected shape ",
         format_extents(shape.begin(), static_cast<int>(shape.size())), ", got ", view.describe());
  }
}

void check_dtype(const TensorView& view, const char* what, DType dtype) {
  if (view.dtype != dtype) {
    fail(ErrorCode::kInvalidArgument, what, ": expected dtype ", dtype_name(dtype), ", got ",
         dtype_name(view.dtype));
  }
}

void check_inner_contiguous(const TensorView& view, const char* what) {
  if (view.data == nullptr) {
    fail(ErrorCode::kInvalidArgument, what, ": data pointer is null (", view.describe(), ")");
  }
  const int inner = view.rank - 1;
  if (inner >= 0 && view.shape[inner] > 1 && view.strides[inner] != 1) {
    fail(ErrorCode::kInvalidArgument, what, ": innermost dimension must have stride 1, got ",
         view.describe());
  }
}

void check_finite(const TensorView& view, const char* what) {
  if (view.numel() == 0) return;
  const int inner = view.rank - 1;
  const int64_t row_len = inner >= 0 ? view.shape[inner] : 1;
  const size_t elem = dtype_size(view.dtype);
  std::array<int64_t, kMaxTensorRank> index{};  // of the row's first element, the inner entry 0
  for (int64_t row = 0; row < view.numel() / row_len; ++row) {
    int64_t offset = 0, rest = row;
    for (int dim = inner - 1; dim >= 0; --dim) {
      index[size_t(dim)] = rest % view.shape[dim];
      rest /= view.shape[dim];
      offset += index[size_t(dim)] * view.strides[dim];
    }
    const auto* first = static_cast<const std::byte*>(view.data) + offset * int64_t(elem);
    const int64_t at = first_non_finite(first, view.dtype, size_t(row_len));
    if (at < 0) continue;
    if (inner >= 0) index[size_t(inner)] = at;
    std::string where;
    for (int dim = 0; dim < view.rank; ++dim) where += str_cat(dim ? ", " : "", index[size_t(dim)]);
    fail(ErrorCode::kInvalidArgument, what, ": element [", where, "] is ", load_as_f32(first, view.dtype, size_t(at)),
         "; it must be finite");
  }
}

void check_host_view(const TensorView& view, const char* op, const char* arg) {
  if (view.rank < 0 || view.rank > kMaxTensorRank)
    fail(ErrorCode::kInvalidArgument, op, ": ", arg, " has rank ", view.rank);
  dtype_size(view.dtype);  // rejects an invalid dtype value
  for (int d = 0; d < view.rank; ++d) {
    if (view.shape[d] < 0)
      fail(ErrorCode::kInvalidArgument, op, ": ", arg, " has a negative extent: ", view.describe());
  }
  if (view.numel() > 0 && view.data == nullptr)
    fail(ErrorCode::kInvalidArgument, op, ": ", arg, " ", view.describe(), " has a null data pointer");
}

namespace {

// Calls fn(row, element_offset) for every innermost row of a strided view.
template <typename View, typename Fn>
void for_each_row(const View& view, Fn fn) {
  const int inner = view.rank - 1;
  const int64_t row_len = view.rank == 0 ? 1 : view.shape[inner];
  if (view.numel() == 0) return;
  const int64_t rows = view.numel() / row_len;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rest = r, offset = 0;
    for (int d = inner - 1; d >= 0; --d) {
      offset += (rest % view.shape[d]) * view.strides[d];
      rest /= view.shape[d];
    }
    fn(r, offset);
  }
}

}  // namespace

void gather_view(const TensorView& src, void* dst, DType dst_dtype) {
  const int64_t numel = src.numel();
  if (src.is_contiguous()) {
    convert(src.data, src.dtype, dst, dst_dtype, static_cast<size_t>(numel));
    return;
  }
  const int64_t row_len = src.shape[src.rank - 1];
  const int64_t inner_stride = src.strides[src.rank - 1];
  const size_t src_size = dtype_size(src.dtype), dst_size = dtype_size(dst_dtype);
  for_each_row(src, [&](int64_t r, int64_t offset) {
    const auto* from = static_cast<const std::byte*>(src.data) + offset * int64_t(src_size);
    auto* to = static_cast<std::byte*>(dst) + r * row_len * int64_t(dst_size);
    if (inner_stride == 1) {
      convert(from, src.dtype, to, dst_dtype, static_cast<size_t>(row_len));
    } else {
      for (int64_t i = 0; i < row_len; ++i)
        store_from_f32(to, dst_dtype, size_t(i), load_as_f32(from, src.dtype, size_t(i * inner_stride)));
    }
  });
}

void scatter_view(const void* src, const MutableTensorView& dst) {
  const size_t size = dtype_size(dst.dtype);
  if (dst.is_contiguous()) {
    if (dst.numel() > 0) std::memcpy(dst.data, src, size_t(dst.numel()) * size);
    return;
  }
  const int64_t row_len = dst.shape[dst.rank - 1];
  const int64_t inner_stride = dst.strides[dst.rank - 1];
  for_each_row(dst, [&](int64_t r, int64_t offset) {
    const auto* from = static_cast<const std::byte*>(src) + r * row_len * int64_t(size);
    auto* to = static_cast<std::byte*>(dst.data) + offset * int64_t(size);
    for (int64_t i = 0; i < row_len; ++i)
      std::memcpy(to + i * inner_stride * int64_t(size), from + i * int64_t(size), size);
  });
}

}  // namespace longctx
