// CudaBackend (gpu/cuda_backend.h): every op against an fp64 reference written
// here and against CpuBackend (f32 weights) on random shapes with odd sizes,
// for f32, bf16 and f16 weights, with bounds derived from the rounding of
// each step; plus embed token errors, budgets, upload/download checks.
// Skips with the reason when there is no CUDA device; the availability test
// runs everywhere.
#include "longctx/gpu/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "longctx/cpu/cpu_backend.h"
#include "test_seed.h"

namespace longctx::gpu {
namespace {

using namespace longctx::gpu::testing;

const DType kWeightDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CudaBackendAvailability, MakeThrowsUnsupportedNamingTheReasonWithoutDevice) {
  std::string why;
  if (list_devices(&why).empty()) {
    std::string message;
    EXPECT_EQ(error_code_of([] { make_cuda_backend(); }, &message), ErrorCode::kUnsupported);
    EXPECT_NE(message.find(why), std::string::npos) << message << " does not name the reason: " << why;
    if (!built_with_cuda()) {
      EXPECT_NE(message.find("built without CUDA"), std::string::npos) << message;
    } else if (!std::filesystem::exists("/proc/driver/nvidia/version")) {
      // No driver loaded: say so, not the runtime's "driver version is insufficient".
      EXPECT_EQ(why, "no NVIDIA driver/GPU found");
    }
    return;
  }
  auto backend = make_cuda_backend();
  EXPECT_FALSE(backend->host_memory());
  EXPECT_NE(backend->name().find("bf16 weights"), std::string::npos) << backend->name();
  EXPECT_NE(backend->device_attention(), nullptr);
  EXPECT_NE(backend->name().find("cuda"), std::string::npos);
  CudaBackendOptions bad;
  bad.device = 1 << 20;
  EXPECT_EQ(error_code_of([&] { make_cuda_backend(bad); }), ErrorCode::kInvalidArgument);
  bad = {};
  bad.weight_dtype = static_cast<DType>(9);
  EXPECT_EQ(error_code_of([&] { make_cuda_backend(bad); }), ErrorCode::kInvalidArgument);
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { LONGCTX_SKIP_WITHOUT_CUDA_DEVICE(); }
  Backend& gpu(DType weight_dtype) {
    auto& slot = backends_[int(weight_dtype)];
    if (!slot) slot = make_backend(weight_dtype);
    return *slot;
  }
  cpu::CpuBackend cpu_;  // f32 weights: the engine the GPU results are compared with

 private:
  std::unique_ptr<Backend> backends_[3];
};

// ---------------------------------------------------------------- matmul

struct MatmulCase {
  int64_t n, in, out;
};

// Bound: x (and w) rounded to the weight dtype, then f32 accumulation of `in`
// products and the bias within gamma_{in+1} sum|x w| (+|b|) in any order
// (Higham, ch. 3). Against the CPU (exact x, f32 accumulation) the rounding
// of x adds u_w sum|x w|.
TEST_F(CudaBackendTest, MatmulMatchesFp64ReferenceAndCpuForEachWeightDtype) {
  std::mt19937 rng(test_seed(1));
  const MatmulCase cases[] = {{1, 1, 1}, {1, 17, 113}, {17, 113, 1}, {3, 64, 96}, {113, 128, 17}, {5, 1000, 33},
                              {64, 257, 130}, {2, 0, 5}};
  for (DType wdt : kWeightDtypes) {
    Backend& backend = gpu(wdt);
    for (const MatmulCase& c : cases) {
      for (bool with_bias : {false, true}) {
        const std::string what = str_cat("matmul ", dtype_name(wdt), " n=", c.n, " in=", c.in, " out=", c.out,
                                         with_bias ? " bias" : "");
        const std::vector<float> x = random_values(rng, c.n * c.in);
        const std::vector<float> w = random_values(rng, c.out * c.in, 0.1f);
        const std::vector<float> b = random_values(rng, c.out);
        auto xt = upload(backend, x, {c.n, c.in});
        auto wt = weight(backend, w, {c.out, c.in});
        auto bt = weight(backend, b, {c.out});
        auto yt = backend.alloc({c.n, c.out});
        backend.matmul(*xt, *wt, with_bias ? bt.get() : nullptr, *yt);
        const std::vector<float> got = download(backend, *yt);

        const std::vector<float> xr = rounded(x, wdt), wr = rounded(w, wdt), br = rounded(b, wdt);
        std::vector<double> want(size_t(c.n * c.out)), mag(want.size()), mag_exact_x(want.size());
        for (int64_t r = 0; r < c.n; ++r)
          for (int64_t o = 0; o < c.out; ++o) {
            double sum = with_bias ? br[size_t(o)] : 0.0, abs_sum = with_bias ? std::abs(br[size_t(o)]) : 0.0;
            double abs_exact = abs_sum;
            for (int64_t i = 0; i < c.in; ++i) {
              const double p = double(xr[size_t(r * c.in + i)]) * wr[size_t(o * c.in + i)];
              sum += p;
              abs_sum += std::abs(p);
              abs_exact += std::abs(double(x[size_t(r * c.in + i)]) * wr[size_t(o * c.in + i)]);
            }
            want[size_t(r * c.out + o)] = sum;
            mag[size_t(r * c.out + o)] = abs_sum;
            mag_exact_x[size_t(r * c.out + o)] = abs_exact;
          }
        std::vector<double> bound(want.size());
        for (size_t i = 0; i < bound.size(); ++i) bound[i] = gamma_n(double(c.in + 2)) * mag[i];
        expect_within(got, want, bound, what + " vs fp64");

        // The CPU backend with the same (rounded) weights and the exact x.
        auto cx = upload(cpu_, x, {c.n, c.in});
        auto cw = weight(cpu_, wr, {c.out, c.in});
        auto cb = weight(cpu_, br, {c.out});
        auto cy = cpu_.alloc({c.n, c.out});
        cpu_.matmul(*cx, *cw, with_bias ? cb.get() : nullptr, *cy);
        const std::vector<float> cpu_y = download(cpu_, *cy);
        const double ux = wdt == DType::kF32 ? 0.0 : unit_roundoff(wdt);
        for (size_t i = 0; i < bound.size(); ++i)
          bound[i] = (ux + 2.0 * gamma_n(double(c.in + 2))) * std::max(mag[i], mag_exact_x[i]);
        expect_within(got, std::vector<double>(cpu_y.begin(), cpu_y.end()), bound, what + " vs CpuBackend");
      }
    }
  }
}

// f16 holds |x| <= 65504: a GEMM on f16 weights scales activations beyond
// 2^15 by a power of two before rounding them to f16 and scales the product
// back, so they give finite, accurate results instead of inf.
TEST_F(CudaBackendTest, F16MatmulTakesActivationsBeyondTheF16Range) {
  Backend& backend = gpu(DType::kF16);
  std::mt19937 rng(test_seed(7));
  const int64_t n = 5, in = 96, out = 40;
  std::vector<float> x = random_values(rng, n * in);
  x[3] = 3.0e5f, x[size_t(in) + 7] = -7.0e4f, x[size_t(2 * in) + 1] = 1.0e5f;
  const std::vector<float> w = random_values(rng, out * in, 0.1f);
  auto xt = upload(backend, x, {n, in});
  auto wt = weight(backend, w, {out, in});
  auto yt = backend.alloc({n, out});
  backend.matmul(*xt, *wt, nullptr, *yt);
  const std::vector<float> got = download(backend, *yt);

  // max |x| = 3e5 = 9.16 * 2^15: x is divided by 2^4 (exact), rounded to f16.
  std::vector<float> scaled(x.size());
  for (size_t i = 0; i < x.size(); ++i) scaled[i] = x[i] / 16.f;
  std::vector<float> xr = rounded(scaled, DType::kF16);
  for (float& v : xr) v *= 16.f;
  const std::vector<float> wr = rounded(w, DType::kF16);
  std::vector<double> want(size_t(n * out)), bound(want.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0, mag = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        const double p = double(xr[size_t(r * in + i)]) * wr[size_t(o * in + i)];
        sum += p, mag += std::abs(p);
      }
      want[size_t(r * out + o)] = sum;
      bound[size_t(r * out + o)] = gamma_n(double(in + 2)) * mag;
    }
  expect_within(got, want, bound, "f16 matmul with activations up to 3e5");
}

TEST_F(CudaBackendTest, MatmulRejectsBadShapesAndDtypes) {
  Backend& backend = gpu(DType::kBF16);
  auto x = backend.alloc({3, 8});
  auto w = backend.load_weight(make_view(std::vector<float>(40).data(), DType::kF32, {5, 8}));
  auto y = backend.alloc({3, 5});
  auto y_bad = backend.alloc({3, 6});
  auto f32_w = backend.alloc({5, 8});
  auto bias_bad = backend.alloc({6});
  EXPECT_EQ(error_code_of([&] { backend.matmul(*x, *w, nullptr, *y_bad); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { backend.matmul(*x, *f32_w, nullptr, *y); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { backend.matmul(*x, *w, bias_bad.get(), *y); }), ErrorCode::kInvalidArgument);
  auto cpu_x = cpu_.alloc({3, 8});
  EXPECT_EQ(error_code_of([&] { backend.matmul(*cpu_x, *w, nullptr, *y); }), ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------- rms_norm

// Bound: the f32 sum of squares (any order) is within gamma_d of the exact
// one; 1/sqrt and the two products add a few u. Relative to |y|.
TEST_F(CudaBackendTest, RmsNormMatchesFp64ReferenceAndCpu) {
  std::mt19937 rng(test_seed(2));
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 37}, {5, 4099}, {2, 256}, {17, 130}};
  for (DType wdt : kWeightDtypes) {
    Backend& backend = gpu(wdt);
    for (auto [rows, d] : shapes) {
      for (bool in_place : {false, true}) {
        const std::string what = str_cat("rms_norm ", dtype_name(wdt), " [", rows, ", ", d, "]",
                                         in_place ? " in place" : "");
        const std::vector<float> x = random_values(rng, rows * d, 3.f);
        const std::vector<float> w = random_values(rng, d);
        const float eps = 1e-5f;
        auto xt = upload(backend, x, {rows, d});
        auto wt = weight(backend, w, {d});
        auto yt = in_place ? nullptr : backend.alloc({rows, d});
        backend.rms_norm(*xt, *wt, eps, in_place ? *xt : *yt);
        const std::vector<float> got = download(backend, in_place ? *xt : *yt);

        const std::vector<float> wr = rounded(w, wdt);
        std::vector<double> want(x.size()), bound(x.size());
        for (int64_t r = 0; r < rows; ++r) {
          double sum = 0.0;
          for (int64_t i = 0; i < d; ++i) sum += double(x[size_t(r * d + i)]) * x[size_t(r * d + i)];
          const double scale = 1.0 / std::sqrt(sum / double(d) + eps);
          for (int64_t i = 0; i < d; ++i) {
            const size_t k = size_t(r * d + i);
            want[k] = x[k] * scale * wr[size_t(i)];
            bound[k] = (gamma_n(double(d)) + 8 * kU) * std::abs(want[k]);
          }
        }
        expect_within(got, want, bound, what + " vs fp64");

        auto cx = upload(cpu_, x, {rows, d});
        auto cw = weight(cpu_, wr, {d});
        auto cy = cpu_.alloc({rows, d});
        cpu_.rms_norm(*cx, *cw, eps, *cy);
        const std::vector<float> cpu_y = download(cpu_, *cy);
        for (double& b : bound) b *= 2.0;
        expect_within(got, std::vector<double>(cpu_y.begin(), cpu_y.end()), bound, what + " vs CpuBackend");
      }
    }
  }
}

// ---------------------------------------------------------------- rope

struct RopeCase {
  int64_t n, n_heads, head_dim;
  int n_rot;
  RopeStyle style;
  RopeScaling scaling;
  bool freq_factors;
  int64_t first_pos;
  float theta;
};

// Bound: the angle and its sine/cosine come from fp64 and are rounded once
// (u each); the f32 rotation a*c - b*s adds 2u: 4u (|a| + |b|).
TEST_F(CudaBackendTest, RopeMatchesFp64ReferenceAndCpuForBothStylesAndScalings) {
  std::mt19937 rng(test_seed(3));
  const RopeCase cases[] = {
      {1, 1, 64, 64, RopeStyle::kNormal, RopeScaling::kNone, false, 0, 10000.f},
      {7, 3, 64, 64, RopeStyle::kNeox, RopeScaling::kNone, false, 5, 10000.f},
      {5, 4, 128, 96, RopeStyle::kNormal, RopeScaling::kLinear, false, 1000, 10000.f},
      {9, 2, 128, 128, RopeStyle::kNeox, RopeScaling::kLlama3, false, 100003, 500000.f},
      {3, 5, 37, 20, RopeStyle::kNormal, RopeScaling::kNone, true, 70000, 500000.f},
      {4, 2, 64, 64, RopeStyle::kNeox, RopeScaling::kNone, true, 1 << 20, 1000000.f},
      {33, 1, 256, 256, RopeStyle::kNormal, RopeScaling::kLlama3, false, 8191, 500000.f},
      {6, 4, 128, 128, RopeStyle::kNeox, RopeScaling::kYarn, false, 131000, 1000000.f},  // Qwen2.5 at 128K
      {5, 2, 64, 32, RopeStyle::kNormal, RopeScaling::kYarn, false, 40000, 10000.f},
  };
  Backend& backend = gpu(DType::kBF16);  // rope does not read weights
  for (const RopeCase& c : cases) {
    RopeParams p;
    p.n_rot = c.n_rot;
    p.theta = c.theta;
    p.style = c.style;
    p.scaling = c.scaling;
    p.factor = c.scaling == RopeScaling::kLinear || c.scaling == RopeScaling::kYarn ? 4.f : 8.f;
    if (c.scaling == RopeScaling::kLinear) p.attn_factor = 1.25f;
    if (c.scaling == RopeScaling::kYarn) p.original_context = 32768, p.attn_factor = 0.9f;
    if (c.freq_factors) {
      std::uniform_real_distribution<float> f(1.f, 8.f);
      for (int i = 0; i < c.n_rot / 2; ++i) p.freq_factors.push_back(f(rng));
    }
    const std::string what = str_cat("rope n=", c.n, " heads=", c.n_heads, " d=", c.head_dim, " n_rot=", c.n_rot,
                                     c.style == RopeStyle::kNeox ? " neox" : " normal", " scaling ", int(c.scaling),
                                     c.freq_factors ? " freq_factors" : "", " pos ", c.first_pos);
    const std::vector<float> x = random_values(rng, c.n * c.n_heads * c.head_dim);
    auto xt = upload(backend, x, {c.n, c.n_heads, c.head_dim});
    backend.rope(*xt, c.first_pos, p);
    const std::vector<float> got = download(backend, *xt);

    const std::vector<float> inv = rope_inv_freq(p);
    // The magnitude of every rotated pair: attn_factor, times YaRN's 0.1 ln factor + 1.
    const double m = p.attn_factor * (c.scaling == RopeScaling::kYarn ? 0.1 * std::log(p.factor) + 1 : 1.0);
    const int64_t half = c.n_rot / 2;
    std::vector<double> want(x.begin(), x.end()), bound(x.size(), 0.0);
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t h = 0; h < c.n_heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = double(c.first_pos + t) * double(inv[size_t(i)]);
          const size_t base = size_t((t * c.n_heads + h) * c.head_dim);
          const size_t lo = base + size_t(c.style == RopeStyle::kNeox ? i : 2 * i);
          const size_t hi = base + size_t(c.style == RopeStyle::kNeox ? i + half : 2 * i + 1);
          const double a = x[lo], b = x[hi];
          want[lo] = m * (a * std::cos(angle) - b * std::sin(angle));
          want[hi] = m * (a * std::sin(angle) + b * std::cos(angle));
          bound[lo] = bound[hi] = 4 * kU * m * (std::abs(a) + std::abs(b));
        }
    expect_within(got, want, bound, what + " vs fp64");  // channels >= n_rot: bound 0, unchanged

    auto cx = upload(cpu_, x, {c.n, c.n_heads, c.head_dim});
    cpu_.rope(*cx, c.first_pos, p);
    const std::vector<float> cpu_x = download(cpu_, *cx);
    for (double& b : bound) b *= 2.0;
    expect_within(got, std::vector<double>(cpu_x.begin(), cpu_x.end()), bound, what + " vs CpuBackend");
  }
  auto x = backend.alloc({2, 2, 16});
  RopeParams too_wide;
  too_wide.n_rot = 32;
  EXPECT_EQ(error_code_of([&] { backend.rope(*x, 0, too_wide); }), ErrorCode::kInvalidArgument);
  RopeParams ok;
  ok.n_rot = 16;
  EXPECT_EQ(error_code_of([&] { backend.rope(*x, -1, ok); }), ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------- swiglu, add

TEST_F(CudaBackendTest, SwigluAndAddMatchFp64ReferenceWithAliasing) {
  std::mt19937 rng(test_seed(4));
  Backend& backend = gpu(DType::kBF16);
  for (int64_t count : {1, 7, 1000, 65537}) {
    std::vector<float> g = random_values(rng, count, 4.f), u = random_values(rng, count);
    if (count > 2) g[0] = 120.f, g[1] = -120.f, g[2] = 0.f;  // exp overflow and underflow, the zero
    for (bool in_place : {false, true}) {
      const std::string what = str_cat("count ", count, in_place ? " in place" : "");
      auto gt = upload(backend, g, {count});
      auto ut = upload(backend, u, {count});
      auto out = in_place ? nullptr : backend.alloc({count});
      backend.swiglu(*gt, *ut, in_place ? *gt : *out);
      const std::vector<float> got = download(backend, in_place ? *gt : *out);
      std::vector<double> want(static_cast<size_t>(count)), bound(static_cast<size_t>(count));
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
        bound[i] = 8 * kU * std::abs(want[i]) + 1e-37;  // expf within 2 ulp, 1 +, /, *
      }
      expect_within(got, want, bound, "swiglu " + what);

      auto at = upload(backend, g, {count});
      auto bt = upload(backend, u, {count});
      backend.add(*at, *bt, in_place ? *bt : *at);  // out aliases b, then a
      const std::vector<float> sum = download(backend, in_place ? *bt : *at);
      for (size_t i = 0; i < want.size(); ++i) want[i] = double(g[i] + u[i]), bound[i] = 0.0;  // exact f32 sum
      expect_within(sum, want, bound, "add " + what);
    }
  }
  auto a = backend.alloc({4});
  auto b = backend.alloc({5});
  EXPECT_EQ(error_code_of([&] { backend.add(*a, *b, *a); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { backend.swiglu(*a, *b, *a); }), ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------- embed

TEST_F(CudaBackendTest, EmbedCopiesRowsExactlyAndChecksEveryTokenFirst) {
  std::mt19937 rng(test_seed(5));
  const int64_t n_vocab = 50, d = 33;
  const std::vector<float> table = random_values(rng, n_vocab * d);
  const std::vector<int32_t> tokens = {0, 49, 7, 7, 13};
  for (DType wdt : kWeightDtypes) {
    Backend& backend = gpu(wdt);
    auto tt = weight(backend, table, {n_vocab, d});
    auto out = backend.alloc({int64_t(tokens.size()), d});
    backend.embed(*tt, tokens, *out);
    const std::vector<float> got = download(backend, *out);
    const std::vector<float> tr = rounded(table, wdt);
    std::vector<double> want(got.size());
    for (size_t t = 0; t < tokens.size(); ++t)
      for (int64_t i = 0; i < d; ++i) want[t * size_t(d) + size_t(i)] = tr[size_t(tokens[t] * d + i)];
    expect_within(got, want, std::vector<double>(want.size(), 0.0), str_cat("embed ", dtype_name(wdt)));

    // A bad token anywhere: nothing written, the message names its index.
    const std::vector<float> sentinel(got.size(), 42.f);
    backend.upload(make_view(sentinel.data(), DType::kF32, {int64_t(tokens.size()), d}), *out);
    for (const std::vector<int32_t>& bad :
         {std::vector<int32_t>{1, 2, 3, 4, 50}, std::vector<int32_t>{1, -1, 3, 4, 5}}) {
      std::string message;
      EXPECT_EQ(error_code_of([&] { backend.embed(*tt, bad, *out); }, &message), ErrorCode::kInvalidArgument);
      const size_t index = bad[4] == 50 ? 4 : 1;
      EXPECT_NE(message.find(str_cat("index ", index)), std::string::npos) << message;
    }
    EXPECT_EQ(download(backend, *out), sentinel);
    const std::vector<int32_t> two = {1, 2};
    EXPECT_EQ(error_code_of([&] { backend.embed(*tt, two, *out); }), ErrorCode::kInvalidArgument);  // rows
  }
  // The CPU backend gives the same rows (f32 table).
  auto cpu_t = weight(cpu_, table, {n_vocab, d});
  auto cpu_out = cpu_.alloc({int64_t(tokens.size()), d});
  cpu_.embed(*cpu_t, tokens, *cpu_out);
  Backend& backend = gpu(DType::kF32);
  auto tt = weight(backend, table, {n_vocab, d});
  auto out = backend.alloc({int64_t(tokens.size()), d});
  backend.embed(*tt, tokens, *out);
  EXPECT_EQ(download(backend, *out), download(cpu_, *cpu_out));
}

// ---------------------------------------------------------------- copies, budgets

TEST_F(CudaBackendTest, UploadDownloadRoundTripStridedViewsAndRejectMismatches) {
  Backend& backend = gpu(DType::kBF16);
  std::mt19937 rng(test_seed(6));
  // A strided source: every other column of a [4, 6] matrix.
  const std::vector<float> wide = random_values(rng, 24);
  TensorView strided = make_view(wide.data(), DType::kF32, {4, 3});
  strided.strides = {6, 2, 0, 0};
  auto t = backend.alloc({4, 3});
  backend.upload(strided, *t);
  std::vector<float> back(24, -1.f);
  MutableTensorView strided_out = make_mutable_view(back.data(), DType::kF32, {4, 3});
  strided_out.strides = {6, 2, 0, 0};
  backend.download(*t, strided_out);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c)
      EXPECT_EQ(back[size_t(r * 6 + c)], c % 2 == 0 ? wide[size_t(r * 6 + c)] : -1.f) << r << ", " << c;

  // 16-bit tensors keep their bits.
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> bits(37);
    for (auto& b : bits) b = uint16_t(rng() & 0x7bff);  // finite f16 and bf16 values
    auto h = backend.alloc({37}, dtype);
    backend.upload(make_view(bits.data(), dtype, {37}), *h);
    std::vector<uint16_t> got(37);
    backend.download(*h, make_mutable_view(got.data(), dtype, {37}));
    EXPECT_EQ(got, bits) << dtype_name(dtype);
  }

  std::vector<float> five(5);
  std::string message;
  EXPECT_EQ(error_code_of([&] { backend.upload(make_view(five.data(), DType::kF32, {5}), *t); }, &message),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("f32[4, 3]"), std::string::npos) << message;
  std::vector<uint16_t> twelve(12);
  EXPECT_EQ(error_code_of([&] { backend.upload(make_view(twelve.data(), DType::kBF16, {12}), *t); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { backend.download(*t, make_mutable_view(five.data(), DType::kF32, {5})); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { backend.upload(make_view(nullptr, DType::kF32, {4, 3}), *t); }),
            ErrorCode::kInvalidArgument);
  auto cpu_t = cpu_.alloc({4, 3});
  std::vector<float> twelve_f(12);
  EXPECT_EQ(error_code_of([&] { backend.upload(make_view(twelve_f.data(), DType::kF32, {4, 3}), *cpu_t); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { backend.alloc({-1, 3}); }), ErrorCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, BudgetExhaustionThrowsOutOfMemoryAndLeavesTheBackendUsable) {
  const uint64_t budget = 1 << 20;
  auto backend = make_backend(DType::kBF16, budget);
  std::mt19937 rng(test_seed(7));
  const std::vector<float> values = random_values(rng, 128 << 10);  // 512 KiB
  auto first = upload(*backend, values, {128 << 10});
  std::string message;
  EXPECT_EQ(error_code_of([&] { backend->alloc({192 << 10}); }, &message), ErrorCode::kOutOfMemory);
  EXPECT_NE(message.find(std::to_string(768 << 10)), std::string::npos) << message;  // bytes asked
  EXPECT_NE(message.find("available"), std::string::npos) << message;
  EXPECT_EQ(error_code_of([&] { weight(*backend, std::vector<float>(400 << 10), {400 << 10}); }),
            ErrorCode::kOutOfMemory);  // 800 KiB of bf16
  EXPECT_EQ(error_code_of([&] { backend->alloc({int64_t(1) << 40}); }), ErrorCode::kOutOfMemory);
  // What was there still works, and what fits still fits.
  EXPECT_EQ(download(*backend, *first), values);
  auto second = backend->alloc({100 << 10});
  backend->add(*first, *first, *first);
  std::vector<float> doubled = download(*backend, *first);
  for (size_t i = 0; i < values.size(); i += 997) EXPECT_EQ(doubled[i], 2.f * values[i]);
  first.reset();
  second.reset();
  auto big = backend->alloc({230 << 10});  // 920 KiB: needs the freed blocks back
  EXPECT_EQ(big->numel(), 230 << 10);
}

}  // namespace
}  // namespace longctx::gpu
