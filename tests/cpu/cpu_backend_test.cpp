// CpuBackend: every op against an fp64 reference written here, on random
// shapes (odd sizes, several head dims), with error bounds derived from the
// rounding of each step; plus budgets, bad tokens and shape errors.
#include "longctx/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "error_message.h"
#include "longctx/core/backend.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

const double kU = std::ldexp(1.0, -24);                                      // f32 unit roundoff
const double kUbf = std::ldexp(1.0, -8);                                     // bf16 unit roundoff
double gamma_n(int64_t n) { return double(n) * kU / (1.0 - double(n) * kU); }  // Higham's gamma_n

std::vector<float> random_values(std::mt19937& rng, int64_t count, float stddev = 1.f) {
  std::normal_distribution<float> normal(0.f, stddev);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = normal(rng);
  return values;
}

// The value a bf16 weight holds (rounded by core's conversion, which core's tests check).
std::vector<float> round_bf16(const std::vector<float>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = bf16_bits_to_f32(f32_to_bf16_bits(values[i]));
  return out;
}

std::unique_ptr<BackendTensor> upload(Backend& backend, const std::vector<float>& values, std::vector<int64_t> shape) {
  auto tensor = backend.alloc(shape);
  backend.upload(make_view(values.data(), DType::kF32, {int64_t(values.size())}), *tensor);
  return tensor;
}

std::unique_ptr<BackendTensor> weight(Backend& backend, const std::vector<float>& values,
                                      std::initializer_list<int64_t> shape) {
  return backend.load_weight(make_view(values.data(), DType::kF32, shape));
}

std::vector<float> download(Backend& backend, const BackendTensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  backend.download(tensor, make_mutable_view(values.data(), DType::kF32, {int64_t(values.size())}));
  return values;
}

// Expects |got - want| <= bound elementwise, reporting the first failure.
void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(double(got[i]) - want[i]) <= bound[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << want[i] << ", bound "
                    << bound[i];
      return;
    }
  }
}

// ---------------------------------------------------------------- matmul

struct MatmulCase {
  int64_t m, k, n;
  bool bias;
};

// y[m, n] = x · w^T + bias in fp64 with the same (already rounded) inputs, and
// sum |x w| (+|b|), the scale of the rounding error.
void reference_matmul(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* bias,
                      const MatmulCase& c, std::vector<double>& y, std::vector<double>& abs_sum) {
  y.assign(size_t(c.m * c.n), 0.0);
  abs_sum.assign(size_t(c.m * c.n), 0.0);
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t o = 0; o < c.n; ++o) {
      double sum = bias != nullptr ? (*bias)[size_t(o)] : 0.0;
      double mag = bias != nullptr ? std::abs((*bias)[size_t(o)]) : 0.0;
      for (int64_t i = 0; i < c.k; ++i) {
        const double p = double(x[size_t(r * c.k + i)]) * double(w[size_t(o * c.k + i)]);
        sum += p;
        mag += std::abs(p);
      }
      y[size_t(r * c.n + o)] = sum;
      abs_sum[size_t(r * c.n + o)] = mag;
    }
}

// Bound: f32 accumulation of k products plus the bias is within
// gamma_{k+1} sum|x w| (+|b|) in any order (Higham, ch. 3). With native bf16
// compute, x is rounded to bf16 first: each product moves by at most u_bf16
// of its magnitude, adding u_bf16 sum|x w|. (bf16 products are exact in f32.)
void check_matmul(const CpuBackendOptions& options, const MatmulCase& c, std::mt19937& rng) {
  CpuBackend backend(options);
  const bool bf16 = options.weights == WeightStorage::kBF16;
  std::vector<float> x = random_values(rng, c.m * c.k);
  std::vector<float> w = random_values(rng, c.n * c.k, 0.05f);
  std::vector<float> b = random_values(rng, c.n);
  auto xt = upload(backend, x, {c.m, c.k});
  auto wt = weight(backend, w, {c.n, c.k});
  auto bt = weight(backend, b, {c.n});
  auto yt = backend.alloc({c.m, c.n});
  backend.matmul(*xt, *wt, c.bias ? bt.get() : nullptr, *yt);
  if (bf16) {
    w = round_bf16(w);
    b = round_bf16(b);
  }
  std::vector<double> want, mag;
  reference_matmul(x, w, c.bias ? &b : nullptr, c, want, mag);
  const double rel = gamma_n(c.k + 1) + (bf16 && backend.bf16_native() ? kUbf * (1.0 + gamma_n(c.k + 1)) : 0.0);
  std::vector<double> bound(mag.size());
  for (size_t i = 0; i < mag.size(); ++i) bound[i] = rel * mag[i];
  expect_within(download(backend, *yt), want, bound,
                "matmul m=" + std::to_string(c.m) + " k=" + std::to_string(c.k) + " n=" + std::to_string(c.n) +
                    (bf16 ? " bf16" : " f32") + (c.bias ? " bias" : ""));
}

TEST(CpuBackendMatmul, MatchesFp64ReferenceF32AndBf16) {
  std::mt19937 rng(test_seed(1));
  const std::vector<MatmulCase> cases = {{1, 1, 1, false},     {1, 17, 113, true},   {17, 113, 1, true},
                                         {3, 64, 96, false},   {113, 128, 17, true}, {1, 4096 / 8, 257, true},
                                         {33, 255, 130, false}};
  for (WeightStorage storage : {WeightStorage::kF32, WeightStorage::kBF16})
    for (const MatmulCase& c : cases) check_matmul({.weights = storage}, c, rng);
}

TEST(CpuBackendMatmul, RandomShapes) {
  std::mt19937 rng(test_seed(11));
  const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 16, 17, 64, 113, 128, 200};
  for (int trial = 0; trial < 24; ++trial) {
    const MatmulCase c{sizes[rng() % 12], sizes[rng() % 12], sizes[rng() % 12], rng() % 2 == 0};
    check_matmul({.weights = trial % 2 ? WeightStorage::kBF16 : WeightStorage::kF32}, c, rng);
  }
}

// y may have more dims than [n, out] (q as [n, n_heads, head_dim]); x too.
TEST(CpuBackendMatmul, FlattensDimsAfterTheFirst) {
  std::mt19937 rng(test_seed(12));
  CpuBackend backend;
  const int64_t n = 5, heads = 3, dim = 8, in = 12;
  const std::vector<float> x = random_values(rng, n * in), w = random_values(rng, heads * dim * in);
  auto xt = upload(backend, x, {n, 3, 4});
  auto wt = weight(backend, w, {heads * dim, in});
  auto yt = backend.alloc({n, heads, dim});
  backend.matmul(*xt, *wt, nullptr, *yt);
  std::vector<double> want, mag;
  reference_matmul(x, w, nullptr, {n, in, heads * dim, false}, want, mag);
  std::vector<double> bound(mag.size());
  for (size_t i = 0; i < mag.size(); ++i) bound[i] = gamma_n(in) * mag[i];
  expect_within(download(backend, *yt), want, bound, "matmul into [n, heads, dim]");
}

TEST(CpuBackendMatmul, EmptyReductionGivesBias) {
  CpuBackend backend;
  auto xt = backend.alloc({3, 0});
  auto wt = backend.alloc({4, 0});
  const std::vector<float> b = {1.f, -2.f, 3.f, 0.5f};
  auto bt = upload(backend, b, {4});
  auto yt = upload(backend, std::vector<float>(12, 7.f), {3, 4});
  backend.matmul(*xt, *wt, bt.get(), *yt);
  const std::vector<float> got = download(backend, *yt);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], b[i % 4]);
}

TEST(CpuBackendMatmul, Bf16DequantizePathMatchesReference) {
  std::mt19937 rng(test_seed(2));
  const CpuBackendOptions options{.weights = WeightStorage::kBF16, .bf16_matmul = Bf16Matmul::kDequantize};
  EXPECT_FALSE(CpuBackend(options).bf16_native());
  for (const MatmulCase& c :
       {MatmulCase{1, 17, 113, true}, MatmulCase{19, 300, 77, false}, MatmulCase{40, 70, 300, true}})
    check_matmul(options, c, rng);
}

// ---------------------------------------------------------------- rms_norm, swiglu, add, embed

TEST(CpuBackendElementwise, RmsNormMatchesFp64) {
  std::mt19937 rng(test_seed(3));
  for (WeightStorage storage : {WeightStorage::kF32, WeightStorage::kBF16})
    for (auto [rows, d] : {std::pair<int64_t, int64_t>{1, 1}, {17, 64}, {5, 113}, {3, 4096}}) {
      CpuBackend backend({.weights = storage});
      std::vector<float> x = random_values(rng, rows * d, 3.f);
      for (int64_t i = 0; i < d; ++i) x[size_t(i)] *= 1e-3f;  // a row where eps matters
      std::vector<float> w = random_values(rng, d);
      // Normalized over the last dim whatever the rank (per-head norms).
      auto xt = d % 2 ? upload(backend, x, {rows, d}) : upload(backend, x, {1, rows, d});
      auto wt = weight(backend, w, {d});
      if (storage == WeightStorage::kBF16) w = round_bf16(w);
      const float eps = 1e-5f;
      backend.rms_norm(*xt, *wt, eps, *xt);  // in place
      // Sum of squares: relative gamma_d; mean, +eps, sqrt (halves it), 1/, two
      // products: about 6 more roundings.
      std::vector<double> want(x.size()), bound(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += double(x[size_t(r * d + i)]) * x[size_t(r * d + i)];
        const double scale = 1.0 / std::sqrt(ss / double(d) + double(eps));
        for (int64_t i = 0; i < d; ++i) {
          const size_t at = size_t(r * d + i);
          want[at] = double(x[at]) * scale * double(w[size_t(i)]);
          bound[at] = (gamma_n(d) / 2 + 8 * kU) * std::abs(want[at]);
        }
      }
      expect_within(download(backend, *xt), want, bound, "rms_norm d=" + std::to_string(d));
    }
}

TEST(CpuBackendElementwise, SwigluAndAddMatchFp64) {
  std::mt19937 rng(test_seed(4));
  for (int64_t count : {1, 17, 113, 70001}) {
    CpuBackend backend;
    std::vector<float> g = random_values(rng, count, 4.f);
    std::vector<float> u = random_values(rng, count);
    if (count > 4) g[0] = -100.f, g[1] = 100.f, g[2] = -1e4f, g[3] = 0.f;  // exp overflow, saturation
    auto gt = upload(backend, g, {1, count});
    auto ut = upload(backend, u, {1, count});
    auto sum = backend.alloc({1, count});
    backend.add(*gt, *ut, *sum);
    backend.swiglu(*gt, *ut, *gt);  // out aliases gate
    std::vector<double> want_s(g.size()), bound_s(g.size()), want_a(g.size()), bound_a(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      want_a[i] = double(g[i]) + u[i];
      bound_a[i] = kU * std::abs(want_a[i]);
      want_s[i] = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
      // expf (<= 2 ulp), 1+e, the division and the product; plus the smallest
      // normal for results that underflow (g/inf = -0).
      bound_s[i] = 8 * kU * std::abs(want_s[i]) + 1.2e-38;
    }
    expect_within(download(backend, *sum), want_a, bound_a, "add");
    expect_within(download(backend, *gt), want_s, bound_s, "swiglu");
  }
}

TEST(CpuBackendElementwise, EmbedCopiesRowsExactly) {
  std::mt19937 rng(test_seed(5));
  for (WeightStorage storage : {WeightStorage::kF32, WeightStorage::kBF16}) {
    CpuBackend backend({.weights = storage});
    const int64_t vocab = 113, d = 65;
    std::vector<float> table = random_values(rng, vocab * d);
    auto tt = weight(backend, table, {vocab, d});
    if (storage == WeightStorage::kBF16) table = round_bf16(table);
    const std::vector<int32_t> tokens = {0, 112, 5, 5, 17};
    auto out = backend.alloc({int64_t(tokens.size()), d});
    backend.embed(*tt, tokens, *out);
    std::vector<double> want, zero(tokens.size() * size_t(d), 0.0);
    for (int32_t t : tokens)
      for (int64_t i = 0; i < d; ++i) want.push_back(table[size_t(t * d + i)]);
    expect_within(download(backend, *out), want, zero, "embed");
  }
}

// ---------------------------------------------------------------- rope

// The frequencies written from the formulas, in fp64: theta^(-2i/n_rot);
// linear divides by factor; llama3 (as in Hugging Face's
// _compute_llama3_parameters): low-frequency band (wavelength above
// context/low) divided by factor, high band kept, between a blend of the two;
// yarn (as its _compute_yarn_parameters): dimension index d of a frequency
// that turns r times over the original context L solves L / (2 pi theta^(d /
// n_rot)) = r; frequencies below the floor of d(beta_fast) are kept, those
// above the ceiling of d(beta_slow) divided by factor, a linear ramp in the
// pair index between.
std::vector<double> reference_inv_freq(const RopeParams& p) {
  std::vector<double> out;
  const auto yarn_dim = [&](double turns) {
    return p.n_rot * std::log(double(p.original_context) / (2 * std::numbers::pi * turns)) /
           (2 * std::log(double(p.theta)));
  };
  for (int i = 0; i < p.n_rot / 2; ++i) {
    const double base = 1.0 / std::pow(double(p.theta), double(2 * i) / p.n_rot);
    double f = base;
    if (p.scaling == RopeScaling::kLinear) f = base / p.factor;
    if (p.scaling == RopeScaling::kLlama3) {
      const double wavelen = 2 * std::numbers::pi / base;
      const double low_wavelen = double(p.original_context) / p.low_freq_factor;
      const double high_wavelen = double(p.original_context) / p.high_freq_factor;
      const double scaled = wavelen > low_wavelen ? base / p.factor : base;
      const double smooth =
          (double(p.original_context) / wavelen - p.low_freq_factor) / (double(p.high_freq_factor) - p.low_freq_factor);
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? (1 - smooth) * scaled / p.factor + smooth * scaled : scaled;
    }
    if (p.scaling == RopeScaling::kYarn) {
      const double low = std::max(0.0, std::floor(yarn_dim(p.beta_fast)));
      const double high = std::min(double(p.n_rot - 1), std::ceil(yarn_dim(p.beta_slow)));
      const double ramp = std::clamp((i - low) / std::max(high - low, 0.001), 0.0, 1.0);
      const double extrapolation = 1 - ramp;  // the share of the original frequency
      f = base / p.factor * (1 - extrapolation) + base * extrapolation;
    }
    if (!p.freq_factors.empty()) f /= p.freq_factors[size_t(i)];
    out.push_back(f);
  }
  return out;
}

std::vector<RopeParams> rope_param_cases(int n_rot, RopeStyle style, std::mt19937& rng) {
  std::vector<RopeParams> cases;
  RopeParams p;
  p.n_rot = n_rot;
  p.style = style;
  p.theta = 10000.f;
  cases.push_back(p);
  p.theta = 500000.f;
  p.scaling = RopeScaling::kLinear;
  p.factor = 4.f;
  p.attn_factor = 1.25f;  // multiplies any scaling's pairs, as llama.cpp's rope.scaling.attn_factor
  cases.push_back(p);
  p.attn_factor = 1.f;
  p.scaling = RopeScaling::kLlama3;  // Llama-3.1's values
  p.factor = 8.f;
  p.low_freq_factor = 1.f;
  p.high_freq_factor = 4.f;
  p.original_context = 8192;
  cases.push_back(p);
  p.scaling = RopeScaling::kYarn;  // Qwen2.5's 128K setting, and an attn_factor
  p.theta = 1000000.f;
  p.factor = 4.f;
  p.original_context = 32768;
  p.attn_factor = 0.8f;
  cases.push_back(p);
  p.scaling = RopeScaling::kNone;
  p.attn_factor = 1.f;
  p.theta = 1000000.f;
  std::uniform_real_distribution<float> uni(1.f, 8.f);
  for (int i = 0; i < n_rot / 2; ++i) p.freq_factors.push_back(uni(rng));
  cases.push_back(p);
  return cases;
}

TEST(CpuBackendRope, InvFreqMatchesFormulas) {
  std::mt19937 rng(test_seed(6));
  for (int n_rot : {2, 64, 128, 96})
    for (const RopeParams& p : rope_param_cases(n_rot, RopeStyle::kNormal, rng)) {
      const std::vector<float> got = rope_inv_freq(p);
      const std::vector<double> want = reference_inv_freq(p);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)  // computed in fp64, rounded once
        EXPECT_NEAR(got[i], want[i], 1.01 * kU * want[i]) << "n_rot " << n_rot << " i " << i;
    }
  // Llama-3.1 sends some frequencies through each of the three bands.
  RopeParams p = rope_param_cases(128, RopeStyle::kNormal, rng)[2];
  const std::vector<float> got = rope_inv_freq(p);
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -i / 64.0);
    const double ratio = base / got[size_t(i)];
    kept += std::abs(ratio - 1) < 1e-6;
    divided += std::abs(ratio - 8) < 1e-5;
    blended += ratio > 1 + 1e-6 && ratio < 8 - 1e-5;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

// YaRN for Qwen2.5 (theta 1e6, 128 channels, x4 from 32768): pair 23.6
// turns 32 times over 32768 tokens and pair 39.6 once, so pairs up to 23
// (the floor) keep their frequency, pairs from 40 (the ceiling) are divided
// by 4, those between blend; the magnitude is 1 + 0.1 ln 4.
TEST(CpuBackendRope, YarnKeepsFastPairsAndInterpolatesSlowOnes) {
  RopeParams p;
  p.n_rot = 128;
  p.theta = 1000000.f;
  p.scaling = RopeScaling::kYarn;
  p.factor = 4.f;
  p.original_context = 32768;
  const std::vector<float> got = rope_inv_freq(p);
  for (int i = 0; i < 64; ++i) {
    const double ratio = std::pow(1e6, -i / 64.0) / got[size_t(i)];
    if (i <= 23) EXPECT_NEAR(ratio, 1.0, 1e-6) << i;
    else if (i >= 40) EXPECT_NEAR(ratio, 4.0, 4e-6) << i;
    else EXPECT_TRUE(ratio > 1 + 1e-6 && ratio < 4 - 4e-6) << i << " " << ratio;
  }
  EXPECT_FLOAT_EQ(rope_magnitude(p), float(1 + 0.1 * std::log(4.0)));
  p.attn_factor = 0.5f;
  EXPECT_FLOAT_EQ(rope_magnitude(p), float(0.5 * (1 + 0.1 * std::log(4.0))));
  p.scaling = RopeScaling::kLinear;  // the temperature is YaRN's alone, attn_factor anyone's
  EXPECT_EQ(rope_magnitude(p), 0.5f);
  p.attn_factor = 1.f;
  EXPECT_EQ(rope_magnitude(p), 1.0f);
}

// Rotation in fp64 of the angles position * inv_freq (the float frequencies
// every backend shares). The kernel rounds cos and sin to f32 (u each) and
// forms a*c - b*s in f32: error <= 4u (|a| + |b|).
TEST(CpuBackendRope, BothStylesAllScalingsMatchFp64) {
  std::mt19937 rng(test_seed(7));
  for (int64_t head_dim : {64, 128, 256})
    for (int n_rot : {int(head_dim), int(head_dim / 2), 2})
      for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox})
        for (const RopeParams& p : rope_param_cases(n_rot, style, rng)) {
          CpuBackend backend;
          const int64_t n = 1 + int64_t(rng() % 17), n_heads = 1 + int64_t(rng() % 3);
          const int64_t first_pos = rng() % 2 ? 0 : int64_t(rng() % 200000);
          const std::vector<float> x = random_values(rng, n * n_heads * head_dim);
          auto xt = upload(backend, x, {n, n_heads, head_dim});
          backend.rope(*xt, first_pos, p);
          const std::vector<float> inv = rope_inv_freq(p);
          // The magnitude of every rotated pair: attn_factor, times YaRN's 0.1 ln factor + 1.
          const double m = p.attn_factor * (p.scaling == RopeScaling::kYarn ? 0.1 * std::log(p.factor) + 1 : 1.0);
          std::vector<double> want(x.begin(), x.end()), bound(x.size(), 0.0);
          const int half = n_rot / 2;
          for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < n_heads; ++h)
              for (int i = 0; i < half; ++i) {
                const size_t row = size_t((t * n_heads + h) * head_dim);
                const size_t i0 = row + size_t(style == RopeStyle::kNormal ? 2 * i : i);
                const size_t i1 = row + size_t(style == RopeStyle::kNormal ? 2 * i + 1 : i + half);
                const double angle = double(first_pos + t) * double(inv[size_t(i)]);
                const double a = x[i0], b = x[i1];
                want[i0] = m * (a * std::cos(angle) - b * std::sin(angle));
                want[i1] = m * (a * std::sin(angle) + b * std::cos(angle));
                bound[i0] = bound[i1] = 4 * kU * m * (std::abs(a) + std::abs(b));
              }
          expect_within(download(backend, *xt), want, bound,
                        "rope head_dim " + std::to_string(head_dim) + " n_rot " + std::to_string(n_rot) +
                            (style == RopeStyle::kNeox ? " neox" : " normal") + " scaling " +
                            std::to_string(int(p.scaling)) + " first_pos " + std::to_string(first_pos));
        }
}

// ---------------------------------------------------------------- memory, copies, errors

TEST(CpuBackendMemory, BudgetExhaustionLeavesNothingAllocated) {
  CpuBackend backend({.weights = WeightStorage::kBF16, .memory_budget_bytes = 1000});
  EXPECT_EQ(backend.memory_budget_bytes(), 1000u);
  auto a = backend.alloc({100, 2});  // 800 bytes
  EXPECT_EQ(backend.bytes_in_use(), 800u);
  expect_error([&] { backend.alloc({51}); }, ErrorCode::kOutOfMemory, {"alloc", "f32[51]", "204 B", "800 B", "1000 B"});
  EXPECT_EQ(backend.bytes_in_use(), 800u);
  const std::vector<float> host(101, 1.f);  // 202 bytes as bf16
  expect_error([&] { weight(backend, host, {101}); }, ErrorCode::kOutOfMemory, {"load_weight", "bf16[101]"});
  EXPECT_EQ(backend.bytes_in_use(), 800u);
  auto w = weight(backend, std::vector<float>(100, 1.f), {100});  // exactly fills the budget
  EXPECT_EQ(backend.bytes_in_use(), 1000u);
  expect_error([&] { backend.alloc({1}, DType::kBF16); }, ErrorCode::kOutOfMemory, {"alloc"});
  a.reset();
  EXPECT_EQ(backend.bytes_in_use(), 200u);
  auto b = backend.alloc({200});
  EXPECT_EQ(backend.bytes_in_use(), 1000u);
  // A huge request fails cleanly whether the budget or the system refuses it.
  CpuBackend unlimited;
  expect_error([&] { unlimited.alloc({int64_t(1) << 40, int64_t(1) << 20}); }, ErrorCode::kOutOfMemory, {"alloc"});
  EXPECT_EQ(unlimited.bytes_in_use(), 0u);
}

TEST(CpuBackendMemory, TensorsMayOutliveTheBackend) {
  std::unique_ptr<BackendTensor> t;
  {
    CpuBackend backend;
    t = backend.alloc({17, 3});
  }
  EXPECT_EQ(t->describe(), "f32[17, 3]");
  EXPECT_EQ(t->numel(), 51);
  t.reset();  // ASan checks the account it returns bytes to is still alive
}

TEST(CpuBackendMemory, AllocRejectsBadShapes) {
  CpuBackend backend;
  expect_error([&] { backend.alloc({3, -1}); }, ErrorCode::kInvalidArgument, {"alloc", "[3, -1]"});
  expect_error([&] { backend.alloc({int64_t(1) << 62, 8}); }, ErrorCode::kInvalidArgument, {"alloc"});
  auto empty = backend.alloc({0, 5});
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_TRUE(backend.host_memory());
  EXPECT_NE(backend.name().find("cpu"), std::string::npos);
  expect_error([] { CpuBackend({.weights = static_cast<WeightStorage>(7)}); }, ErrorCode::kInvalidArgument,
               {"weight storage", "7"});
}

TEST(CpuBackendCopies, StridedUploadDownloadAndWeightConversion) {
  CpuBackend backend({.weights = WeightStorage::kBF16});
  // A [3, 4] view of every other column of a [3, 8] buffer.
  std::vector<float> host(24);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i) + 0.25f;
  TensorView strided = make_view(host.data(), DType::kF32, {3, 4});
  strided.strides = {8, 2};
  auto t = backend.alloc({12});
  backend.upload(strided, *t);
  const std::vector<float> got = download(backend, *t);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(got[size_t(r * 4 + c)], host[size_t(r * 8 + 2 * c)]);
  // Download into a transposed view.
  std::vector<float> back(12, -1.f);
  MutableTensorView transposed = make_mutable_view(back.data(), DType::kF32, {3, 4});
  transposed.strides = {1, 3};
  backend.download(*t, transposed);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(back[size_t(c * 3 + r)], got[size_t(r * 4 + c)]);
  // f16 host weights become bf16 weights by value.
  std::vector<uint16_t> half;
  for (float v : {1.5f, -2.f, 65504.f, 0.1f}) half.push_back(f32_to_f16_bits(v));
  auto w = backend.load_weight(make_view(half.data(), DType::kF16, {2, 2}));
  EXPECT_EQ(w->dtype(), DType::kBF16);
  EXPECT_EQ(w->shape(), (std::vector<int64_t>{2, 2}));
  std::vector<uint16_t> stored(4);
  backend.download(*w, make_mutable_view(stored.data(), DType::kBF16, {4}));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(stored[i], f32_to_bf16_bits(f16_bits_to_f32(half[i])));
  // Mismatched dtype or size.
  expect_error([&] { backend.upload(make_view(half.data(), DType::kF16, {4}), *t); }, ErrorCode::kInvalidArgument,
               {"upload", "f16[4]", "f32[12]"});
  expect_error([&] { backend.download(*t, make_mutable_view(back.data(), DType::kF32, {11})); },
               ErrorCode::kInvalidArgument, {"download", "f32[11]", "f32[12]"});
}

TEST(CpuBackendErrors, EmbedRejectsBadTokensWithoutWriting) {
  CpuBackend backend;
  auto table = weight(backend, std::vector<float>(10 * 4, 1.f), {10, 4});
  auto out = upload(backend, std::vector<float>(3 * 4, -7.f), {3, 4});
  for (int32_t bad : {-1, 10, 1 << 30}) {
    const std::vector<int32_t> tokens = {1, 2, bad};
    expect_error([&] { backend.embed(*table, tokens, *out); }, ErrorCode::kInvalidArgument,
                 {"embed", "token " + std::to_string(bad), "index 2", "[0, 10)"});
    for (float v : download(backend, *out)) EXPECT_EQ(v, -7.f);  // nothing written
  }
  const std::vector<int32_t> two = {1, 2};
  expect_error([&] { backend.embed(*table, two, *out); }, ErrorCode::kInvalidArgument, {"embed", "f32[3, 4]"});
}

// A tensor of another backend.
class ForeignTensor final : public BackendTensor {
 public:
  ForeignTensor() : BackendTensor(DType::kF32, {1, 4}) {}
  void* data() override { return values_; }
  const void* data() const override { return values_; }

 private:
  float values_[4] = {};
};

TEST(CpuBackendErrors, EveryOpChecksShapesAndDtypes) {
  CpuBackend backend;
  auto x = backend.alloc({5, 8});
  auto w = backend.alloc({6, 8});
  auto y = backend.alloc({5, 6});
  auto y_bad = backend.alloc({5, 7});
  auto b_bad = backend.alloc({7});
  auto x_bf16 = backend.alloc({5, 8}, DType::kBF16);
  auto vec = backend.alloc({8});
  auto vec7 = backend.alloc({7});
  ForeignTensor foreign;
  const auto inv = ErrorCode::kInvalidArgument;
  expect_error([&] { backend.matmul(*x, *w, nullptr, *y_bad); }, inv,
               {"matmul", "f32[5, 8]", "f32[6, 8]", "f32[5, 7]"});
  expect_error([&] { backend.matmul(*x, *y, nullptr, *y); }, inv, {"matmul", "w f32[5, 6]"});
  expect_error([&] { backend.matmul(*x, *w, b_bad.get(), *y); }, inv, {"matmul", "bias f32[7]"});
  expect_error([&] { backend.matmul(*x_bf16, *w, nullptr, *y); }, inv, {"matmul", "x must be f32", "bf16[5, 8]"});
  expect_error([&] { backend.matmul(*x, *x_bf16, nullptr, *y); }, inv, {"matmul", "w", "bf16[5, 8]"});
  expect_error([&] { backend.matmul(*vec, *w, nullptr, *y); }, inv, {"matmul", "x f32[8]"});
  auto square = backend.alloc({8, 8});
  expect_error([&] { backend.matmul(*x, *square, nullptr, *x); }, inv, {"matmul", "aliases"});
  expect_error([&] { backend.matmul(foreign, *w, nullptr, *y); }, inv, {"matmul", "not a CpuBackend tensor"});
  expect_error([&] { backend.rms_norm(*x, *vec7, 1e-5f, *x); }, inv, {"rms_norm", "f32[5, 8]", "f32[7]"});
  expect_error([&] { backend.rms_norm(*x, *vec, 1e-5f, *y); }, inv, {"rms_norm", "y f32[5, 6]"});
  expect_error([&] { backend.rms_norm(*x, *vec, -1.f, *x); }, inv, {"rms_norm", "eps"});
  RopeParams rope;
  rope.n_rot = 8;
  expect_error([&] { backend.rope(*x, 0, rope); }, inv, {"rope", "f32[5, 8]"});
  auto q = backend.alloc({5, 2, 4});
  expect_error([&] { backend.rope(*q, 0, rope); }, inv, {"rope", "n_rot 8", "f32[5, 2, 4]"});
  rope.n_rot = 4;
  expect_error([&] { backend.rope(*q, -1, rope); }, inv, {"rope", "-1"});
  rope.n_rot = 3;
  expect_error([&] { backend.rope(*q, 0, rope); }, inv, {"rope", "n_rot"});
  expect_error([&] { backend.swiglu(*x, *y, *x); }, inv, {"swiglu", "f32[5, 8]", "f32[5, 6]"});
  expect_error([&] { backend.swiglu(*x, *x, *x_bf16); }, inv, {"swiglu", "bf16[5, 8]"});
  expect_error([&] { backend.add(*y, *y_bad, *y); }, inv, {"add", "f32[5, 6]", "f32[5, 7]"});
  expect_error([&] { backend.add(foreign, foreign, foreign); }, inv, {"add", "not a CpuBackend tensor"});
}

TEST(CpuBackendRope, InvFreqRejectsInvalidParameters) {
  const auto inv = ErrorCode::kInvalidArgument;
  RopeParams p;
  p.n_rot = 0;
  expect_error([&] { rope_inv_freq(p); }, inv, {"n_rot"});
  p.n_rot = 64;
  p.theta = 0.f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"theta"});
  p.theta = 10000.f;
  p.scaling = RopeScaling::kLinear;
  p.factor = 0.f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"factor"});
  p.scaling = RopeScaling::kLlama3;
  p.factor = 8.f;
  p.low_freq_factor = 4.f;
  p.high_freq_factor = 4.f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"low_freq_factor"});
  p.high_freq_factor = 8.f;
  p.original_context = 0;
  expect_error([&] { rope_inv_freq(p); }, inv, {"original_context"});
  p.original_context = 8192;
  p.freq_factors.assign(32, 1.f);
  expect_error([&] { rope_inv_freq(p); }, inv, {"freq_factors"});
  p.freq_factors.clear();
  p.scaling = RopeScaling::kYarn;
  p.factor = 0.5f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"yarn factor"});
  expect_error([&] { rope_magnitude(p); }, inv, {"yarn factor"});
  p.factor = 4.f;
  p.original_context = 0;
  expect_error([&] { rope_inv_freq(p); }, inv, {"yarn original_context"});
  p.original_context = 32768;
  p.beta_slow = 32.f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"beta_slow"});
  p.beta_slow = 1.f;
  p.attn_factor = 0.f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"attn_factor"});
  p.attn_factor = 1.f;
  p.theta = 1.f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"theta > 1"});
  p.theta = 10000.f;
  EXPECT_EQ(rope_inv_freq(p).size(), 32u);
  p.scaling = RopeScaling::kLlama3;
  p.freq_factors.assign(32, 1.f);
  expect_error([&] { rope_inv_freq(p); }, inv, {"freq_factors"});
  p.scaling = RopeScaling::kNone;
  p.freq_factors.assign(31, 1.f);
  expect_error([&] { rope_inv_freq(p); }, inv, {"freq_factors", "31"});
  p.freq_factors.assign(32, 1.f);
  p.freq_factors[5] = -1.f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"freq_factors[5]"});
  p.freq_factors[5] = 2.f;
  EXPECT_EQ(rope_inv_freq(p).size(), 32u);
  // Each value valid, the frequency past f32: a denormal divisor.
  p.freq_factors[5] = 1.4e-45f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"inverse frequency of pair 5", "frequency factor 1.4"});
  p.freq_factors.clear();
  p.scaling = RopeScaling::kLinear;
  p.factor = 1.4e-45f;
  expect_error([&] { rope_inv_freq(p); }, inv, {"inverse frequency of pair 0", "scaling factor 1.4"});
}

}  // namespace
}  // namespace longctx::cpu
