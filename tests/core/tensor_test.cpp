#include "longctx/core/tensor.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "error_message.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx {
namespace {

TEST(Tensor, CheckNameJoinsTextAndIntegersAndCutsLongNames) {
  EXPECT_STREQ(CheckName("KV store append (layer ", 3, "): ", "k").c_str(), "KV store append (layer 3): k");
  EXPECT_STREQ(CheckName(int64_t{-9000000000}, " and ", size_t{0}).c_str(), "-9000000000 and 0");
  EXPECT_STREQ(CheckName().c_str(), "");
  const std::string long_text(200, 'x');
  const CheckName cut(long_text.c_str(), 12);
  EXPECT_EQ(std::string(cut.c_str()), std::string(127, 'x'));  // the integer past the cut is dropped too
  // What check_* reports with it.
  std::vector<float> data(6);
  const TensorView view = make_view(data.data(), DType::kF32, {2, 3});
  expect_error([&] { check_shape(view, CheckName("layer ", 7, ": k").c_str(), {2, 4}); }, ErrorCode::kInvalidArgument,
               {"layer 7: k: expected shape"});
}

TEST(Tensor, MakeViewIsRowMajorAndContiguous) {
  std::vector<uint16_t> storage(4096 * 8 * 128);
  const TensorView view = make_view(storage.data(), DType::kF16, {4096, 8, 128});
  EXPECT_EQ(view.rank, 3);
  EXPECT_EQ(view.data, storage.data());
  EXPECT_EQ(view.dtype, DType::kF16);
  EXPECT_EQ(view.shape[0], 4096);
  EXPECT_EQ(view.shape[2], 128);
  EXPECT_EQ(view.strides[0], 8 * 128);
  EXPECT_EQ(view.strides[1], 128);
  EXPECT_EQ(view.strides[2], 1);
  EXPECT_EQ(view.numel(), 4096 * 8 * 128);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_EQ(view.describe(), "f16[4096, 8, 128]");
}

TEST(Tensor, RanksZeroToFourAndTooLarge) {
  float value = 0;
  const TensorView scalar = make_view(&value, DType::kF32, {});
  EXPECT_EQ(scalar.rank, 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.is_contiguous());
  EXPECT_EQ(scalar.describe(), "f32[]");
  EXPECT_EQ(scalar.element({}), &value);

  std::vector<float> storage(2 * 3 * 4 * 5);
  const MutableTensorView rank4 = make_mutable_view(storage.data(), DType::kF32, {2, 3, 4, 5});
  EXPECT_EQ(rank4.numel(), 120);
  EXPECT_EQ(rank4.describe(), "f32[2, 3, 4, 5]");

  const std::string message = error_message(
      [&] { make_view(storage.data(), DType::kF32, {2, 3, 4, 5, 1}); });
  EXPECT_NE(message.find("rank 5"), std::string::npos) << message;
  error_message([&] { make_view(storage.data(), DType::kF32, {2, -3}); });
  error_message([&] { make_view(storage.data(), DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}); });
}

TEST(Tensor, EmptyViews) {
  const TensorView empty = make_view(nullptr, DType::kBF16, {0, 8, 128});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.is_contiguous());
  EXPECT_EQ(empty.describe(), "bf16[0, 8, 128]");
  EXPECT_EQ(empty.strides[0], 8 * 128);
}

// element() against an independent offset computation, over random shapes
// and random (possibly non-contiguous, padded) strides.
TEST(Tensor, ElementAddressesMatchStrides) {
  std::mt19937 rng(test_seed(7));
  for (int trial = 0; trial < 200; ++trial) {
    const DType dtype = static_cast<DType>(trial % 3);
    const int rank = 1 + trial % 4;
    MutableTensorView view;
    view.dtype = dtype;
    view.rank = rank;
    int64_t stride = 1 + static_cast<int64_t>(rng() % 3);  // an innermost stride > 1 is allowed
    for (int d = rank - 1; d >= 0; --d) {
      view.shape[d] = 1 + static_cast<int64_t>(rng() % 5);
      view.strides[d] = stride;
      stride = stride * view.shape[d] + static_cast<int64_t>(rng() % 3);  // padding between rows
    }
    std::vector<std::byte> storage(static_cast<size_t>(stride) * dtype_size(dtype));
    view.data = storage.data();

    int64_t i[4] = {0, 0, 0, 0};
    for (int t = 0; t < 20; ++t) {
      int64_t offset = 0;
      for (int d = 0; d < rank; ++d) {
        i[d] = static_cast<int64_t>(rng() % static_cast<uint32_t>(view.shape[d]));
        offset += i[d] * view.strides[d];
      }
      std::byte* expected = storage.data() + offset * static_cast<int64_t>(dtype_size(dtype));
      std::byte* got = nullptr;
      switch (rank) {
        case 1: got = static_cast<std::byte*>(view.element({i[0]})); break;
        case 2: got = static_cast<std::byte*>(view.element({i[0], i[1]})); break;
        case 3: got = static_cast<std::byte*>(view.element({i[0], i[1], i[2]})); break;
        default: got = static_cast<std::byte*>(view.element({i[0], i[1], i[2], i[3]})); break;
      }
      ASSERT_EQ(got, expected) << view.describe();
      const TensorView read_only = as_const(view);
      if (rank == 2) {
        ASSERT_EQ(read_only.element({i[0], i[1]}), expected);
      }
    }
  }
}

TEST(Tensor, ElementRejectsBadIndices) {
  std::vector<float> storage(12);
  const TensorView view = make_view(storage.data(), DType::kF32, {3, 4});
  EXPECT_EQ(view.element({2, 3}), storage.data() + 11);
  std::string message = error_message([&] { view.element({3, 0}); });
  EXPECT_NE(message.find("[3, 0]"), std::string::npos) << message;
  EXPECT_NE(message.find("f32[3, 4]"), std::string::npos) << message;
  error_message([&] { view.element({0, -1}); });
  message = error_message([&] { view.element({1}); });
  EXPECT_NE(message.find("1 entries"), std::string::npos) << message;
}

TEST(Tensor, ContiguityAndDescribeWithStrides) {
  std::vector<uint16_t> storage(4096 * 2048);
  // Every other kv head of a [4096, 16, 128] cache: strides [2048, 256, 1].
  TensorView view = make_view(storage.data(), DType::kF16, {4096, 8, 128});
  view.strides = {2048, 256, 1, 0};
  EXPECT_FALSE(view.is_contiguous());
  EXPECT_EQ(view.describe(), "f16[4096, 8, 128] strides [2048, 256, 1]");

  // Extent-1 dimensions may have any stride.
  TensorView one_head = make_view(storage.data(), DType::kF16, {4096, 1, 128});
  one_head.strides[1] = 999;
  EXPECT_TRUE(one_head.is_contiguous());
  EXPECT_EQ(one_head.describe(), "f16[4096, 1, 128]");

  TensorView transposed = make_view(storage.data(), DType::kF32, {4, 8});
  transposed.strides = {1, 4, 0, 0};
  EXPECT_FALSE(transposed.is_contiguous());
}

TEST(Tensor, AsConstKeepsEverything) {
  std::vector<float> storage(24);
  MutableTensorView mutable_view = make_mutable_view(storage.data(), DType::kF32, {2, 3, 4});
  mutable_view.strides[0] = 13;
  const TensorView view = as_const(mutable_view);
  EXPECT_EQ(view.data, storage.data());
  EXPECT_EQ(view.dtype, DType::kF32);
  EXPECT_EQ(view.rank, 3);
  EXPECT_EQ(view.shape, mutable_view.shape);
  EXPECT_EQ(view.strides, mutable_view.strides);
}

TEST(Tensor, CheckShapeAndDtypeMessages) {
  std::vector<uint16_t> storage(4096 * 8 * 64);
  const TensorView k = make_view(storage.data(), DType::kF16, {4096, 8, 64});
  check_shape(k, "k", {4096, 8, 64});
  check_shape(k, "k", {-1, 8, -1});
  check_dtype(k, "k", DType::kF16);

  EXPECT_EQ(error_message([&] { check_shape(k, "k", {-1, 8, 128}); }),
            "k: expected shape [*, 8, 128], got f16[4096, 8, 64]");
  EXPECT_EQ(error_message([&] { check_shape(k, "k", {4096, 8}); }),
            "k: expected shape [4096, 8], got f16[4096, 8, 64]");
  EXPECT_EQ(error_message([&] { check_shape(k, "k", {4096, 8, 64, 1}); }),
            "k: expected shape [4096, 8, 64, 1], got f16[4096, 8, 64]");
  EXPECT_EQ(error_message([&] { check_dtype(k, "k", DType::kF32); }),
            "k: expected dtype f32, got f16");
}

// The first NaN or Inf of a view, in row-major order, named by its index;
// rows apart in memory, every dtype that has elements.
TEST(Tensor, CheckFiniteNamesTheFirstBadElement) {
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<float> values(3 * 2 * 12, 1.5f);  // [3][2][12], of which a [3, 2, 10] view is taken
    std::vector<uint32_t> storage(values.size());
    const auto view_of = [&] {
      convert(values.data(), DType::kF32, storage.data(), dtype, values.size());
      TensorView v = make_view(storage.data(), dtype, {3, 2, 10});
      v.strides = {24, 12, 1, 0};
      return v;
    };
    check_finite(view_of(), "k");
    values[10] = std::numeric_limits<float>::quiet_NaN();  // [0, 0, 10]: outside the view
    check_finite(view_of(), "k");
    values[(2 * 2 + 1) * 12 + 7] = -std::numeric_limits<float>::infinity();
    values[(2 * 2 + 1) * 12 + 9] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(error_message([&] { check_finite(view_of(), "k"); }),
              "k: element [2, 1, 7] is -inf; it must be finite");
  }
  check_finite(make_view(nullptr, DType::kF32, {0, 4}), "empty");
}

TEST(Tensor, CheckInnerContiguous) {
  std::vector<float> storage(64);
  TensorView q = make_view(storage.data(), DType::kF32, {4, 8});
  check_inner_contiguous(q, "q");
  q.strides[0] = 16;  // padded rows are fine
  check_inner_contiguous(q, "q");

  q.strides[1] = 2;
  std::string message = error_message([&] { check_inner_contiguous(q, "q"); });
  EXPECT_NE(message.find("q:"), std::string::npos) << message;
  EXPECT_NE(message.find("strides [16, 2]"), std::string::npos) << message;

  const TensorView null_view = make_view(nullptr, DType::kF32, {4, 8});
  message = error_message([&] { check_inner_contiguous(null_view, "v"); });
  EXPECT_NE(message.find("v:"), std::string::npos) << message;
  EXPECT_NE(message.find("null"), std::string::npos) << message;
}

}  // namespace
}  // namespace longctx
