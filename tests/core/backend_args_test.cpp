// The Backend argument checks every backend shares (core/backend_args.h):
// each accepts a valid call and rejects each kind of mistake with
// Error(kInvalidArgument) whose message names the op and the argument.
#include "longctx/core/backend_args.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "error_message.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

// A shape-only tensor: the checks never read data, except to compare pointers.
class ShapeTensor final : public BackendTensor {
 public:
  static constexpr const char* kBackendName = "ShapeBackend";  // backend_tensor_cast's errors
  ShapeTensor(DType dtype, std::vector<int64_t> shape, void* data = nullptr)
      : BackendTensor(dtype, std::move(shape)), data_(data) {}
  void* data() override { return data_; }
  const void* data() const override { return data_; }

 private:
  void* data_;
};

ShapeTensor f32(std::vector<int64_t> shape) { return ShapeTensor(DType::kF32, std::move(shape)); }

// A tensor of another backend.
class ForeignTensor final : public BackendTensor {
 public:
  ForeignTensor() : BackendTensor(DType::kF32, {2, 3}) {}
  void* data() override { return nullptr; }
  const void* data() const override { return nullptr; }
};

TEST(BackendArgs, MatmulAcceptsMatchingShapesAndNamesEachMistake) {
  float x_data[24], y_data[15];  // distinct buffers: x and y are compared for aliasing
  const ShapeTensor x(DType::kF32, {3, 8}, x_data), w(DType::kBF16, {5, 8}), y(DType::kF32, {3, 5}, y_data),
      bias = f32({5});
  const MatmulDims d = check_matmul_args(x, w, &bias, y);
  EXPECT_EQ(d.n, 3);
  EXPECT_EQ(d.in, 8);
  EXPECT_EQ(d.out, 5);
  EXPECT_EQ(describe_matmul_args(x, w, &bias, y), "x f32[3, 8], w bf16[5, 8], y f32[3, 5], bias f32[5]");
  EXPECT_EQ(describe_matmul_args(x, w, nullptr, y), "x f32[3, 8], w bf16[5, 8], y f32[3, 5]");
  const ShapeTensor y_narrow(DType::kF32, {3, 4}, y_data), y_flat(DType::kF32, {5}, y_data);
  EXPECT_NE(error_message([&] { check_matmul_args(x, w, nullptr, y_narrow); }).find("shapes do not match"),
            std::string::npos);
  EXPECT_NE(error_message([&] { check_matmul_args(x, w, nullptr, y_flat); }).find("need x [n, in...]"),
            std::string::npos);
  const ShapeTensor short_bias = f32({4});
  EXPECT_NE(error_message([&] { check_matmul_args(x, w, &short_bias, y); }).find("bias must be [5]"),
            std::string::npos);
  float buffer[24];
  const ShapeTensor xa(DType::kF32, {3, 8}, buffer), ya(DType::kF32, {3, 8}, buffer), wa(DType::kBF16, {8, 8});
  EXPECT_NE(error_message([&] { check_matmul_args(xa, wa, nullptr, ya); }).find("y aliases x"),
            std::string::npos);
}

TEST(BackendArgs, NormRopeElementwiseEmbed) {
  const ShapeTensor x = f32({2, 4, 64}), weight = f32({64});
  EXPECT_NO_THROW(check_rms_norm_args(x, weight, 1e-5f, x));
  EXPECT_NE(error_message([&] { check_rms_norm_args(x, f32({32}), 1e-5f, x); }).find("rms_norm: need x [..., d]"),
            std::string::npos);
  EXPECT_NE(error_message([&] { check_rms_norm_args(x, weight, std::numeric_limits<float>::quiet_NaN(), x); })
                .find("eps must be >= 0"),
            std::string::npos);

  RopeParams rope;
  rope.n_rot = 64;
  EXPECT_NO_THROW(check_rope_args(x, 7, rope));
  EXPECT_NE(error_message([&] { check_rope_args(f32({2, 256}), 0, rope); })
                .find("rope: x must be [n, n_heads, head_dim]"),
            std::string::npos);
  rope.n_rot = 128;
  EXPECT_NE(error_message([&] { check_rope_args(x, 0, rope); }).find("n_rot 128 exceeds head_dim"), std::string::npos);
  rope.n_rot = 64;
  EXPECT_NE(error_message([&] { check_rope_args(x, -1, rope); }).find("invalid first position -1"), std::string::npos);
  EXPECT_NE(error_message([&] { check_rope_args(x, std::numeric_limits<int64_t>::max(), rope); })
                .find("invalid first position"),
            std::string::npos);

  const ShapeTensor a = f32({3, 5}), other = f32({5, 3}), half(DType::kF16, {3, 5});
  EXPECT_NO_THROW(check_elementwise_args("add", {"a", "b", "out"}, a, a, a));
  EXPECT_EQ(error_message([&] { check_elementwise_args("swiglu", {"gate", "up", "out"}, a, other, a); }),
            "swiglu: gate, up and out must be f32 of one shape; got gate f32[3, 5], up f32[5, 3], out f32[3, 5]");
  EXPECT_NE(error_message([&] { check_elementwise_args("add", {"a", "b", "out"}, a, a, half); })
                .find("add: a, b and out"),
            std::string::npos);

  const ShapeTensor table(DType::kBF16, {10, 6}), out = f32({3, 6});
  const std::vector<int32_t> tokens{0, 9, 4}, bad{0, 10, 4};
  EXPECT_NO_THROW(check_embed_args(table, tokens, out));
  EXPECT_EQ(error_message([&] { check_embed_args(table, bad, out); }),
            "embed: token 10 at index 1 is outside the vocabulary [0, 10)");
  EXPECT_NE(error_message([&] { check_embed_args(table, std::vector<int32_t>{1, 2}, out); }).find("out [2, d]"),
            std::string::npos);
}

TEST(BackendArgs, CopiesNeedTheTensorsDtypeAndElementCount) {
  float host[15] = {};
  const ShapeTensor t = f32({3, 5});
  EXPECT_NO_THROW(check_upload_args(make_view(host, DType::kF32, {15}), t));
  EXPECT_NE(error_message([&] { check_upload_args(make_view(host, DType::kF32, {14}), t); })
                .find("upload: src f32[14]"),
            std::string::npos);
  EXPECT_NE(error_message([&] { check_download_args(t, make_mutable_view(host, DType::kF16, {15})); })
                .find("download: src f32[3, 5] does not match dst"),
            std::string::npos);
  EXPECT_NE(error_message([&] { check_download_args(t, make_mutable_view(nullptr, DType::kF32, {15})); })
                .find("null data pointer"),
            std::string::npos);
  EXPECT_EQ(backend_row_length(f32({4, 3, 2})), 6);
}

TEST(BackendArgs, TensorCastKeepsOwnTensorsAndNamesAForeignOne) {
  ShapeTensor own = f32({2, 3});
  EXPECT_EQ(&backend_tensor_cast<ShapeTensor>(static_cast<const BackendTensor&>(own), "add", "a"), &own);
  ShapeTensor& writable = backend_tensor_cast<ShapeTensor>(static_cast<BackendTensor&>(own), "add", "out");
  EXPECT_EQ(&writable, &own);
  ForeignTensor foreign;
  EXPECT_EQ(error_message([&] { backend_tensor_cast<ShapeTensor>(foreign, "matmul", "x"); }),
            "matmul: x f32[2, 3] is not a ShapeBackend tensor");
  const ForeignTensor& read_only = foreign;
  EXPECT_EQ(error_message([&] { backend_tensor_cast<ShapeTensor>(read_only, "embed", "table"); }),
            "embed: table f32[2, 3] is not a ShapeBackend tensor");
}

TEST(BackendArgs, TensorBytesNamesTheCallOfABadShape) {
  EXPECT_EQ(backend_tensor_bytes(std::vector<int64_t>{3, 5}, DType::kBF16, "CpuBackend", "alloc"), 30u);
  EXPECT_EQ(backend_tensor_bytes({}, DType::kF32, "CpuBackend", "alloc"), 4u);  // a scalar
  EXPECT_EQ(backend_tensor_bytes(std::vector<int64_t>{4, 0}, DType::kF32, "CpuBackend", "alloc"), 0u);
  EXPECT_EQ(error_message([] {
              backend_tensor_bytes(std::vector<int64_t>{3, -1}, DType::kF32, "CpuBackend", "alloc");
            }),
            "CpuBackend::alloc: invalid shape [3, -1]");
  EXPECT_EQ(error_message([] {
              backend_tensor_bytes(std::vector<int64_t>{int64_t(1) << 62, 8}, DType::kF32, "CudaBackend", "load_weight");
            }),
            "CudaBackend::load_weight: invalid shape [4611686018427387904, 8]");
  // 2^62 elements fit int64_t, their bytes do not fit size_t.
  try {
    backend_tensor_bytes(std::vector<int64_t>{int64_t(1) << 62}, DType::kF32, "CpuBackend", "alloc");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_STREQ(e.what(), "CpuBackend::alloc: 4611686018427387904 elements overflow the address space");
  }
}

TEST(BackendArgs, FormatShapeListsTheExtents) {
  EXPECT_EQ(format_shape(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(format_shape(std::vector<int64_t>{4096, 8, -1}), "[4096, 8, -1]");
  EXPECT_EQ(f32({17, 4096}).describe(), "f32[17, 4096]");
}

}  // namespace
}  // namespace longctx
