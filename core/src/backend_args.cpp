#include "longctx/core/backend_args.h"

#include <cmath>
#include <optional>
#include <string>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"

namespace longctx {

void fail_foreign_tensor(const BackendTensor& t, const char* backend, const char* op, const char* arg) {
  fail(ErrorCode::kInvalidArgument, op, ": ", arg, " ", t.describe(), " is not a ", backend, " tensor");
}

namespace {

// The element count of `shape`; nullopt for a negative extent or a count past int64_t.
std::optional<int64_t> checked_numel(std::span<const int64_t> shape) {
  int64_t numel = 1;
  for (int64_t extent : shape)
    if (extent < 0 || __builtin_mul_overflow(numel, extent, &numel)) return std::nullopt;
  return numel;
}

}  // namespace

size_t backend_tensor_bytes(std::span<const int64_t> shape, DType dtype, const char* backend, const char* op) {
  const size_t elem = dtype_size(dtype);  // rejects an invalid dtype value
  const std::optional<int64_t> numel = checked_numel(shape);
  if (!numel) fail(ErrorCode::kInvalidArgument, backend, "::", op, ": invalid shape ", format_shape(shape));
  size_t bytes = 0;
  if (__builtin_mul_overflow(size_t(*numel), elem, &bytes))
    fail(ErrorCode::kOutOfMemory, backend, "::", op, ": ", *numel, " elements overflow the address space");
  return bytes;
}

int64_t backend_row_length(const BackendTensor& t) {
  int64_t count = 1;
  for (size_t d = 1; d < t.shape().size(); ++d) count *= t.shape()[d];
  return count;
}

void check_backend_dtype(const BackendTensor& t, DType dtype, const char* op, const char* arg) {
  if (t.type() != ggml_type_of(dtype))
    fail(ErrorCode::kInvalidArgument, op, ": ", arg, " must be ", dtype_name(dtype), ", got ", t.describe());
}

void check_upload_args(const TensorView& src, const BackendTensor& dst) {
  check_host_view(src, "upload", "src");
  if (ggml_type_of(src.dtype) != dst.type() || src.numel() != dst.numel())
    fail(ErrorCode::kInvalidArgument, "upload: src ", src.describe(), " does not match dst ", dst.describe(),
         " (dtype and element count must be equal)");
}

void check_download_args(const BackendTensor& src, const MutableTensorView& dst) {
  check_host_view(as_const(dst), "download", "dst");
  if (ggml_type_of(dst.dtype) != src.type() || dst.numel() != src.numel())
    fail(ErrorCode::kInvalidArgument, "download: src ", src.describe(), " does not match dst ", dst.describe(),
         " (dtype and element count must be equal)");
}

std::string describe_matmul_args(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias,
                                 const BackendTensor& y) {
  return str_cat("x ", x.describe(), ", w ", w.describe(), ", y ", y.describe(),
                 bias != nullptr ? ", bias " + bias->describe() : std::string());
}

MatmulDims check_matmul_args(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias,
                             const BackendTensor& y) {
  check_backend_dtype(x, DType::kF32, "matmul", "x");
  check_backend_dtype(y, DType::kF32, "matmul", "y");
  const auto shapes = [&] { return describe_matmul_args(x, w, bias, y); };
  if (x.shape().size() < 2 || y.shape().size() < 2 || w.shape().size() != 2)
    fail(ErrorCode::kInvalidArgument, "matmul: need x [n, in...], w [out, in], y [n, out...]; got ", shapes());
  const MatmulDims dims{x.shape()[0], backend_row_length(x), backend_row_length(y)};
  if (y.shape()[0] != dims.n || w.shape()[1] != dims.in || w.shape()[0] != dims.out)
    fail(ErrorCode::kInvalidArgument, "matmul: shapes do not match (y[n, out] = x[n, in] w[out, in]^T): ", shapes());
  if (bias != nullptr && (bias->shape().size() != 1 || bias->shape()[0] != dims.out))
    fail(ErrorCode::kInvalidArgument, "matmul: bias must be [", dims.out, "]: ", shapes());
  if (y.data() == x.data() && y.numel() > 0) fail(ErrorCode::kInvalidArgument, "matmul: y aliases x: ", shapes());
  return dims;
}

void check_rms_norm_args(const BackendTensor& x, const BackendTensor& weight, float eps, const BackendTensor& y) {
  check_backend_dtype(x, DType::kF32, "rms_norm", "x");
  check_backend_dtype(y, DType::kF32, "rms_norm", "y");
  if (x.shape().empty() || x.shape() != y.shape() || weight.shape().size() != 1 ||
      weight.shape()[0] != x.shape().back())
    fail(ErrorCode::kInvalidArgument, "rms_norm: need x [..., d], weight [d], y like x; got x ", x.describe(),
         ", weight ", weight.describe(), ", y ", y.describe());
  if (!std::isfinite(eps) || eps < 0.f) fail(ErrorCode::kInvalidArgument, "rms_norm: eps must be >= 0, got ", eps);
}

void check_rope_args(const BackendTensor& x, int64_t first_pos, const RopeParams& params) {
  check_backend_dtype(x, DType::kF32, "rope", "x");
  if (x.shape().size() != 3)
    fail(ErrorCode::kInvalidArgument, "rope: x must be [n, n_heads, head_dim], got ", x.describe());
  if (params.n_rot > x.shape()[2])
    fail(ErrorCode::kInvalidArgument, "rope: n_rot ", params.n_rot, " exceeds head_dim of x ", x.describe());
  int64_t last = 0;
  if (first_pos < 0 || __builtin_add_overflow(first_pos, x.shape()[0], &last))
    fail(ErrorCode::kInvalidArgument, "rope: invalid first position ", first_pos, " for x ", x.describe());
}

void check_elementwise_args(const char* op, const char* const (&names)[3], const BackendTensor& a,
                            const BackendTensor& b, const BackendTensor& out) {
  for (const BackendTensor* t : {&a, &b, &out})
    if (t->dtype() != DType::kF32 || t->shape() != a.shape())
      fail(ErrorCode::kInvalidArgument, op, ": ", names[0], ", ", names[1], " and ", names[2],
           " must be f32 of one shape; got ", names[0], " ", a.describe(), ", ", names[1], " ", b.describe(), ", ",
           names[2], " ", out.describe());
}

namespace {

// Byte offsets of the f16 scale fields in one block of a quantized type
// (the GGUF block layouts of core/ggml_types.h).
std::span<const int> scale_fields(GgmlType type) {
  static constexpr int kD[] = {0}, kDM[] = {0, 2}, kQ2K[] = {80, 82}, kQ3K[] = {108}, kQ6K[] = {208};
  switch (type) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ8_0: return kD;
    case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ4_K: case GgmlType::kQ5_K: return kDM;
    case GgmlType::kQ2_K: return kQ2K;
    case GgmlType::kQ3_K: return kQ3K;
    case GgmlType::kQ6_K: return kQ6K;
    default: return {};
  }
}

}  // namespace

void check_host_weight(const HostWeight& w) {
  const GgmlTypeInfo& info = ggml_type_info(w.type);
  const auto shape = [&] { return info.name + format_shape(w.shape); };
  const std::optional<int64_t> numel = checked_numel(w.shape);
  if (!numel) fail(ErrorCode::kInvalidArgument, "weight '", w.name, "': invalid shape ", shape());
  if (w.shape.empty() || w.shape.back() % info.block_elems != 0)
    fail(ErrorCode::kInvalidArgument, "weight '", w.name, "': ", shape(), ": ", info.name,
         " rows must be whole blocks of ", info.block_elems, " values");
  const std::optional<uint64_t> bytes = ggml_bytes(w.type, *numel);
  if (!bytes || *bytes != w.bytes.size())
    fail(ErrorCode::kInvalidArgument, "weight '", w.name, "': ", shape(), " needs ", bytes ? *bytes : 0,
         " bytes, got ", w.bytes.size());
  const std::span<const int> fields = scale_fields(w.type);
  const size_t block_bytes = size_t(info.block_bytes);
  for (size_t b = 0; !fields.empty() && b < w.bytes.size() / block_bytes; ++b)
    for (int field : fields) {
      const uint8_t* p = w.bytes.data() + b * block_bytes + field;
      if (!std::isfinite(f16_bits_to_f32(uint16_t(p[0] | (p[1] << 8)))))
        fail(ErrorCode::kInvalidArgument, "weight '", w.name, "': ", shape(), ": block ", b, " (byte ",
             b * block_bytes + size_t(field), ") has a NaN or infinite scale");
    }
  // A float weight's values likewise: one NaN or Inf (a norm's, an
  // embedding row's) makes every logit NaN, found only at the sampler.
  const std::optional<DType> float_type = w.type == GgmlType::kF32    ? std::optional(DType::kF32)
                                          : w.type == GgmlType::kF16  ? std::optional(DType::kF16)
                                          : w.type == GgmlType::kBF16 ? std::optional(DType::kBF16)
                                                                      : std::nullopt;
  const int64_t bad = float_type ? first_non_finite(w.bytes.data(), *float_type, size_t(*numel)) : -1;
  if (bad >= 0)
    fail(ErrorCode::kInvalidArgument, "weight '", w.name, "': ", shape(), ": value ", bad, " (byte ",
         bad * info.block_bytes, ") is NaN or infinite");
}

void check_embed_args(const BackendTensor& table, std::span<const int32_t> tokens, const BackendTensor& out) {
  check_backend_dtype(out, DType::kF32, "embed", "out");
  if (table.shape().size() != 2 || out.shape().size() != 2 || out.shape()[0] != int64_t(tokens.size()) ||
      out.shape()[1] != table.shape()[1])
    fail(ErrorCode::kInvalidArgument, "embed: need table [n_vocab, d], out [", tokens.size(), ", d]; got table ",
         table.describe(), ", out ", out.describe());
  const int64_t n_vocab = table.shape()[0];
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      fail(ErrorCode::kInvalidArgument, "embed: token ", tokens[i], " at index ", i, " is outside the vocabulary [0, ",
           n_vocab, ")");
}

}  // namespace longctx
