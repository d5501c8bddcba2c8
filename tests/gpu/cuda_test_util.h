// Helpers of the CUDA backend tests: device detection (tests skip with the
// reason when there is none), host <-> backend copies, dtype rounding and
// error-bound checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/gpu/cuda_backend.h"
#include "longctx/gpu/device.h"

namespace longctx::gpu::testing {

// Empty when a CUDA device is usable, else the reason ("built without CUDA ...").
inline std::string why_no_device() {
  std::string why;
  if (!list_devices(&why).empty()) return {};
  return why.empty() ? "unknown reason" : why;
}

#define LONGCTX_SKIP_WITHOUT_CUDA_DEVICE()                                                  \
  do {                                                                                      \
    const std::string why_ = ::longctx::gpu::testing::why_no_device();                      \
    if (!why_.empty()) GTEST_SKIP() << "no CUDA device: " << why_;                          \
  } while (0)

inline const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff
inline double gamma_n(double n) { return n * kU / (1.0 - n * kU); }  // Higham's gamma_n

// Unit roundoff of a storage dtype.
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kF32: return kU;
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
    case DType::kQ8_0: break;  // the device keeps K/V as f16 or bf16 only
  }
  return 1.0;
}

inline std::vector<float> random_values(std::mt19937& rng, int64_t count, float stddev = 1.f) {
  std::normal_distribution<float> normal(0.f, stddev);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = normal(rng);
  return values;
}

// The values a buffer of `dtype` holds (core's rounding, checked by core's tests).
inline std::vector<float> rounded(const std::vector<float>& values, DType dtype) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t slot = 0;
    store_from_f32(&slot, dtype, 0, values[i]);
    out[i] = load_as_f32(&slot, dtype, 0);
  }
  return out;
}

inline std::unique_ptr<BackendTensor> upload(Backend& backend, const std::vector<float>& values,
                                             std::vector<int64_t> shape) {
  auto tensor = backend.alloc(std::move(shape));
  backend.upload(make_view(values.data(), DType::kF32, {int64_t(values.size())}), *tensor);
  return tensor;
}

inline std::unique_ptr<BackendTensor> weight(Backend& backend, const std::vector<float>& values,
                                             std::initializer_list<int64_t> shape) {
  return backend.load_weight(make_view(values.data(), DType::kF32, shape));
}

inline std::vector<float> download(Backend& backend, const BackendTensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  backend.download(tensor, make_mutable_view(values.data(), DType::kF32, {int64_t(values.size())}));
  return values;
}

// Expects |got - want| <= bound elementwise (NaN fails), reporting the first failure.
inline void expect_within(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(double(got[i]) - want[i]) <= bound[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << want[i] << ", bound "
                    << bound[i];
      return;
    }
  }
}

// The ErrorCode fn throws (fails the test when it throws nothing or something else).
inline ErrorCode error_code_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "expected an Error";
  return ErrorCode::kInternal;
}

inline std::unique_ptr<Backend> make_backend(DType weight_dtype, uint64_t device_budget = 0,
                                             uint64_t pinned_budget = 256ull << 20) {
  CudaBackendOptions options;
  options.weight_dtype = weight_dtype;
  options.device_budget_bytes = device_budget;
  options.pinned_budget_bytes = pinned_budget;
  return make_cuda_backend(options);
}

}  // namespace longctx::gpu::testing
