// CpuBackend with GGUF-typed weights: what load_weight keeps or converts for
// each WeightStorage, the refusals of check_host_weight (naming the weight),
// matmul on quantized weights through the backend (decode and prefill row
// counts, bias) against the kernels' own contract, and embed from a
// quantized table. The kernels themselves are tested in quant_matmul_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/ggml_test_util.h"
#include "longctx/core/backend.h"
#include "longctx/core/cpu_features.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/cpu/peak_loops.h"
#include "longctx/cpu/quant_matmul.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

using longctx::testing::random_blocks;

std::vector<float> download(Backend& backend, const BackendTensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  backend.download(tensor, make_mutable_view(values.data(), DType::kF32, {int64_t(values.size())}));
  return values;
}

std::vector<float> dequantized(GgmlType type, const std::vector<uint8_t>& bytes, int64_t numel) {
  std::vector<float> out(static_cast<size_t>(numel));
  dequantize(type, bytes, out);
  return out;
}

// got[r n + o] against fp64 of sum_i x[r k + i] w[o k + i] within f32
// accumulation's gamma_k sum |x w|, for every row r < m and every o_step-th o
// < n; `round` is applied to both factors first (the identity, or bf16).
void expect_near_fp64(const std::vector<float>& got, const std::vector<float>& x, const std::vector<float>& w,
                      int64_t m, int64_t n, int64_t k, int64_t o_step, double (*round)(double),
                      const std::string& what) {
  const double gamma = double(k) * std::ldexp(1.0, -24) / (1 - double(k) * std::ldexp(1.0, -24));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < n; o += o_step) {
      double want = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double term = round(x[size_t(r * k + i)]) * round(w[size_t(o * k + i)]);
        want += term;
        mag += std::fabs(term);
      }
      ASSERT_NEAR(got[size_t(r * n + o)], want, gamma * mag) << what << " row " << r << " output " << o;
    }
}

double exact(double v) { return v; }

// y [m, n] = x [m, k] w^T through the backend, w loaded there as [n, k].
std::vector<float> matmul_of(CpuBackend& backend, const BackendTensor& w, const std::vector<float>& x, int64_t m,
                             int64_t n, int64_t k) {
  auto xt = backend.alloc({m, k});
  backend.upload(make_view(x.data(), DType::kF32, {m, k}), *xt);
  auto yt = backend.alloc({m, n});
  backend.matmul(*xt, w, nullptr, *yt);
  return download(backend, *yt);
}
double to_bf16(double v) { return double(bf16_bits_to_f32(f32_to_bf16_bits(float(v)))); }

TEST(CpuBackendQuant, StorageKeepsOrConvertsEachType) {
  std::mt19937 rng(test_seed(1));
  const int64_t rows = 3, k = 256;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                        GgmlType::kQ6_K, GgmlType::kF16}) {
    const std::vector<uint8_t> bytes = random_blocks(type, size_t(rows * k / ggml_type_info(type).block_elems), rng);
    const HostWeight host(type, {rows, k}, bytes, "blk.0.attn_q.weight");
    const std::vector<float> values = dequantized(type, bytes, rows * k);
    {
      CpuBackend backend;  // native
      auto w = backend.load_weight(host);
      EXPECT_EQ(w->type(), type);
      EXPECT_EQ(w->quantized(), !dtype_of(type).has_value());
      EXPECT_EQ(std::memcmp(w->data(), bytes.data(), bytes.size()), 0);
      EXPECT_EQ(backend.bytes_in_use(), bytes.size());
      // Vectors (norms, biases) are stored as f32 whatever the file holds.
      const std::vector<uint8_t> vec_bytes(bytes.begin(), bytes.begin() + int64_t(*ggml_bytes(type, k)));
      auto v = backend.load_weight(HostWeight(type, {k}, vec_bytes, "blk.0.attn_norm.weight"));
      EXPECT_EQ(v->type(), GgmlType::kF32);
      EXPECT_EQ(download(backend, *v), std::vector<float>(values.begin(), values.begin() + k));
    }
    for (WeightStorage storage : {WeightStorage::kF32, WeightStorage::kBF16}) {
      CpuBackend backend({.weights = storage});
      auto w = backend.load_weight(host);
      const DType dtype = storage == WeightStorage::kF32 ? DType::kF32 : DType::kBF16;
      EXPECT_EQ(w->dtype(), dtype);
      for (int64_t i = 0; i < rows * k; ++i) {
        const float value = values[size_t(i)];
        const float want = dtype == DType::kF32 ? value : bf16_bits_to_f32(f32_to_bf16_bits(value));
        ASSERT_EQ(load_as_f32(w->data(), dtype, size_t(i)), want) << ggml_type_info(type).name << " element " << i;
      }
    }
  }
}

TEST(CpuBackendQuant, LoadWeightRefusesBadBlocksNamingTheWeight) {
  std::mt19937 rng(test_seed(2));
  CpuBackend backend;
  std::vector<uint8_t> bytes = random_blocks(GgmlType::kQ4_K, 2, rng);
  // Rows of 384 are not whole blocks of 256.
  expect_error([&] { backend.load_weight(HostWeight(GgmlType::kQ4_K, {1, 384}, bytes, "blk.1.ffn_up.weight")); },
               ErrorCode::kInvalidArgument, {"blk.1.ffn_up.weight", "q4_k", "256"});
  // A byte count that does not match the shape.
  expect_error([&] {
    backend.load_weight(HostWeight(GgmlType::kQ4_K, {1, 256}, bytes, "output.weight"));
  }, ErrorCode::kInvalidArgument, {"output.weight", "144", "288"});
  // A NaN scale in the second block (dmin of a Q4_K block: bytes 2..3).
  const uint16_t nan_bits = 0x7E00;
  std::memcpy(bytes.data() + 144 + 2, &nan_bits, 2);
  expect_error([&] { backend.load_weight(HostWeight(GgmlType::kQ4_K, {2, 256}, bytes, "token_embd.weight")); },
               ErrorCode::kInvalidArgument, {"token_embd.weight", "block 1", "NaN or infinite scale"});
  // An infinite Q8_0 scale.
  std::vector<uint8_t> q8 = random_blocks(GgmlType::kQ8_0, 1, rng);
  const uint16_t inf_bits = 0x7C00;
  std::memcpy(q8.data(), &inf_bits, 2);
  expect_error([&] { backend.load_weight(HostWeight(GgmlType::kQ8_0, {1, 32}, q8, "w")); },
               ErrorCode::kInvalidArgument, {"'w'", "block 0"});
  // Q2_K's dmin (bytes 82..83) and Q3_K's d (bytes 108..109), the fields after their codes.
  std::vector<uint8_t> q2k = random_blocks(GgmlType::kQ2_K, 2, rng);
  std::memcpy(q2k.data() + 84 + 82, &nan_bits, 2);
  expect_error([&] { backend.load_weight(HostWeight(GgmlType::kQ2_K, {1, 512}, q2k, "blk.0.ffn_gate.weight")); },
               ErrorCode::kInvalidArgument, {"blk.0.ffn_gate.weight", "block 1", "NaN or infinite scale"});
  std::vector<uint8_t> q3k = random_blocks(GgmlType::kQ3_K, 1, rng);
  std::memcpy(q3k.data() + 108, &inf_bits, 2);
  expect_error([&] { backend.load_weight(HostWeight(GgmlType::kQ3_K, {1, 256}, q3k, "blk.0.attn_k.weight")); },
               ErrorCode::kInvalidArgument, {"blk.0.attn_k.weight", "block 0", "NaN or infinite scale"});
  // A NaN or Inf value of a float weight, past the first 4096-value chunk of the scan, named by index and byte.
  for (const auto& [type, bad_bits, size] : {std::tuple{GgmlType::kF32, uint32_t{0x7FC00000}, 4},
                                             std::tuple{GgmlType::kF32, uint32_t{0xFF800000}, 4},
                                             std::tuple{GgmlType::kF16, uint32_t{0x7C00}, 2},
                                             std::tuple{GgmlType::kF16, uint32_t{0xFE00}, 2},
                                             std::tuple{GgmlType::kBF16, uint32_t{0x7FC0}, 2},
                                             std::tuple{GgmlType::kBF16, uint32_t{0xFF80}, 2}}) {
    SCOPED_TRACE(ggml_type_info(type).name);
    std::vector<uint8_t> values(size_t(size) * 3 * 4096);  // zeros: finite
    // The largest finite value just before it: all exponent bits but the lowest.
    const uint32_t largest = type == GgmlType::kF32 ? 0x7F7FFFFF : type == GgmlType::kF16 ? 0x7BFF : 0x7F7F;
    std::memcpy(values.data() + size_t(size) * 5000, &largest, size_t(size));
    EXPECT_NO_THROW(backend.load_weight(HostWeight(type, {3, 4096}, values, "ok")));
    std::memcpy(values.data() + size_t(size) * 5001, &bad_bits, size_t(size));
    expect_error([&] { backend.load_weight(HostWeight(type, {3, 4096}, values, "output_norm.weight")); },
                 ErrorCode::kInvalidArgument,
                 {"output_norm.weight", str_cat("value 5001 (byte ", 5001 * size, ")"), "NaN or infinite"});
  }
  // A type the backend does not compute with.
  const std::vector<uint8_t> q8k(292);
  expect_error([&] { backend.load_weight(HostWeight(GgmlType::kQ8_K, {1, 256}, q8k, "odd")); },
               ErrorCode::kUnsupported, {"odd", "q8_k"});
  EXPECT_EQ(backend.bytes_in_use(), 0u);
}

// matmul through the backend on the int8 path (forced: QuantPrefill::kAuto
// sends prefill rows to bf16 or f32 tiles on AVX512-BF16 CPUs) equals the
// kernel's tile on the same quantized activations (every row count, a bias
// added after), so the threading and the panels change nothing;
// quant_matmul_test.cpp ties the kernel to fp64.
TEST(CpuBackendQuant, MatmulEqualsTheKernelForEveryRowCount) {
  std::mt19937 rng(test_seed(3));
  CpuBackend backend(CpuBackendOptions{.quant_prefill = QuantPrefill::kInt8});
  EXPECT_EQ(backend.quant_prefill(), QuantPrefill::kInt8);
  const int64_t k = 512;
  // Q4_0, Q8_0 and Q4_K go in groups where the CPU's kernels read those:
  // 304 rows in groups of 16 on AVX-512 VNNI, else of 8; 296 rows in groups
  // of 8; 300 keeps GGML's layout. Q2_K, Q3_K, Q5_K and Q6_K go only in
  // groups of 16. Q5_1 never.
  using P = std::pair<GgmlType, int64_t>;
  for (auto [type, n] : {P{GgmlType::kQ4_0, 300}, P{GgmlType::kQ4_0, 296}, P{GgmlType::kQ4_0, 304},
                         P{GgmlType::kQ8_0, 296}, P{GgmlType::kQ8_0, 304}, P{GgmlType::kQ5_1, 300},
                         P{GgmlType::kQ4_K, 296}, P{GgmlType::kQ4_K, 304}, P{GgmlType::kQ5_K, 296},
                         P{GgmlType::kQ5_K, 304}, P{GgmlType::kQ6_K, 296}, P{GgmlType::kQ6_K, 304},
                         P{GgmlType::kQ3_K, 296}, P{GgmlType::kQ3_K, 304}, P{GgmlType::kQ2_K, 296},
                         P{GgmlType::kQ2_K, 304}}) {
    const std::vector<uint8_t> bytes = random_blocks(type, size_t(n * k / ggml_type_info(type).block_elems), rng);
    auto w = backend.load_weight(HostWeight(type, {n, k}, bytes, "w"));
    const QuantLayout layout = preferred_quant_layout(type, n);
    const bool groups8 = type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0 || type == GgmlType::kQ4_K;
    const bool groups16 = groups8 || type == GgmlType::kQ2_K || type == GgmlType::kQ3_K || type == GgmlType::kQ5_K ||
                          type == GgmlType::kQ6_K;
    const QuantIsa isa = best_quant_isa();
    if (groups16 && n % 16 == 0 && isa == QuantIsa::kAvx512Vnni) EXPECT_EQ(layout, QuantLayout::kRows16);
    else if (groups8 && n % 8 == 0 && isa != QuantIsa::kGeneric) EXPECT_EQ(layout, QuantLayout::kRows8);
    else EXPECT_EQ(layout, QuantLayout::kRows);
    std::vector<uint8_t> laid_out = bytes;
    if (layout != QuantLayout::kRows) pack_groups(type, layout, bytes.data(), n, k, laid_out.data());
    EXPECT_EQ(std::memcmp(w->data(), laid_out.data(), bytes.size()), 0) << ggml_type_info(type).name << " n " << n;
    std::normal_distribution<float> normal;
    std::vector<float> bias(static_cast<size_t>(n));
    for (float& b : bias) b = normal(rng);
    auto b = backend.load_weight(make_view(bias.data(), DType::kF32, {n}));
    for (int64_t m : {1, 2, 3, 4, 5, 9, 70}) {
      std::vector<float> x(static_cast<size_t>(m * k));
      for (float& v : x) v = normal(rng);
      auto xt = backend.alloc({m, k});
      backend.upload(make_view(x.data(), DType::kF32, {m, k}), *xt);
      auto yt = backend.alloc({m, n});
      backend.matmul(*xt, *w, b.get(), *yt);
      const std::vector<float> got = download(backend, *yt);

      QuantizedActs acts;
      quantize_acts(x.data(), m, k, k, quant_act_block(type), acts);
      std::vector<float> want(static_cast<size_t>(m * n));
      quant_matmul_tile(best_quant_isa(), type, layout, laid_out.data(), acts, 0, m, 0, n, want.data(), n);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t o = 0; o < n; ++o) {
          const size_t at = size_t(r * n + o);
          ASSERT_EQ(got[at], want[at] + bias[size_t(o)])
              << ggml_type_info(type).name << " n " << n << " m " << m << " row " << r << " output " << o;
        }
    }
  }
}

// weight_groups = false keeps every quantized matrix in GGML's rows, byte for
// byte, where the same backend would otherwise pack it in groups, and matmul
// runs the row kernels on them.
TEST(CpuBackendQuant, WithoutWeightGroupsMatricesKeepGgmlRows) {
  std::mt19937 rng(test_seed(4));
  CpuBackend grouped(CpuBackendOptions{.quant_prefill = QuantPrefill::kInt8});
  CpuBackend rows(CpuBackendOptions{.quant_prefill = QuantPrefill::kInt8, .weight_groups = false});
  const int64_t k = 512, n = 32;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                        GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const char* name = ggml_type_info(type).name;
    const std::vector<uint8_t> bytes = random_blocks(type, size_t(n * k / ggml_type_info(type).block_elems), rng);
    auto w = rows.load_weight(HostWeight(type, {n, k}, bytes, "w"));
    EXPECT_EQ(std::memcmp(w->data(), bytes.data(), bytes.size()), 0) << name;
    if (preferred_quant_layout(type, n) != QuantLayout::kRows) {  // the option is what kept them
      auto packed = grouped.load_weight(HostWeight(type, {n, k}, bytes, "w"));
      EXPECT_NE(std::memcmp(packed->data(), bytes.data(), bytes.size()), 0) << name;
    }
    std::normal_distribution<float> normal;
    for (int64_t m : {1, 3, 9}) {
      std::vector<float> x(static_cast<size_t>(m * k));
      for (float& v : x) v = normal(rng);
      auto xt = rows.alloc({m, k});
      rows.upload(make_view(x.data(), DType::kF32, {m, k}), *xt);
      auto yt = rows.alloc({m, n});
      rows.matmul(*xt, *w, nullptr, *yt);
      const std::vector<float> got = download(rows, *yt);
      QuantizedActs acts;
      quantize_acts(x.data(), m, k, k, quant_act_block(type), acts);
      std::vector<float> want(static_cast<size_t>(m * n));
      quant_matmul_tile(best_quant_isa(), type, QuantLayout::kRows, bytes.data(), acts, 0, m, 0, n, want.data(), n);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << name << " m " << m << " at " << i;
    }
  }
}

// f16 weights stay f16 (native): the decode kernel widens them in registers,
// larger row counts widen tiles to f32 for oneDNN; both exact in the weights,
// so only f32 accumulation differs from fp64: gamma_k sum |x w|.
TEST(CpuBackendQuant, F16WeightsMatchFp64) {
  std::mt19937 rng(test_seed(5));
  CpuBackend backend;
  const int64_t k = 200, n = 37;
  std::normal_distribution<float> normal;
  std::vector<uint16_t> half(static_cast<size_t>(n * k));
  for (uint16_t& h : half) h = f32_to_f16_bits(normal(rng) * 0.1f);
  auto w = backend.load_weight(make_view(half.data(), DType::kF16, {n, k}));
  EXPECT_EQ(w->dtype(), DType::kF16);
  std::vector<float> widened(half.size());
  for (size_t i = 0; i < half.size(); ++i) widened[i] = f16_bits_to_f32(half[i]);
  for (int64_t m : {1, 4, 17}) {
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = normal(rng);
    expect_near_fp64(matmul_of(backend, *w, x, m, n, k), x, widened, m, n, k, 1, exact, str_cat("m ", m));
  }
}

// kAuto takes bf16 tiles exactly where oneDNN has a bf16 kernel here and
// bf16 products outrun f32 ones (AMX tiles, or vdpbf16ps at kBf16MinOverFma
// times the FMA rate: Zen 4), else f32 tiles where the CPU has AVX512-BF16
// (a Xeon whose VM hides AMX), else the int8 kernels; bf16 weights multiply
// natively on the same condition as bf16 tiles. Weights in groups of rows
// keep their int8 kernels except on AMX; a forced path applies to both.
TEST(CpuBackendQuant, AutoPicksThePrefillPathByTheCpusProducts) {
  bool tiles_available = true;
  try {
    CpuBackend forced(CpuBackendOptions{.quant_prefill = QuantPrefill::kBf16Tiles});
  } catch (const Error&) {
    tiles_available = false;
  }
  const bool fast_bf16 = tiles_available && bf16_outruns_fma();
  const QuantPrefill want =
      fast_bf16 ? QuantPrefill::kBf16Tiles : cpu_features().avx512bf16 ? QuantPrefill::kF32Tiles : QuantPrefill::kInt8;
  const CpuBackend backend;
  EXPECT_EQ(backend.quant_prefill(), want) << quant_prefill_name(backend.quant_prefill()) << "; "
                                           << describe_cpu_features(cpu_features()) << "; vdpbf16ps at "
                                           << vdpbf16ps_over_fma() << "x the FMA rate";
  EXPECT_EQ(backend.bf16_native(), fast_bf16);
  // Weights in groups: their int8 kernels, unless bf16 runs on AMX tiles.
  const QuantPrefill want_groups =
      fast_bf16 && cpu_features().amx_bf16 ? QuantPrefill::kBf16Tiles : QuantPrefill::kInt8;
  for (QuantLayout layout : {QuantLayout::kRows8, QuantLayout::kRows16})
    EXPECT_EQ(backend.quant_prefill(layout), want_groups) << describe_cpu_features(cpu_features());
  for (QuantPrefill forced : {QuantPrefill::kInt8, QuantPrefill::kF32Tiles}) {
    const CpuBackend forced_backend(CpuBackendOptions{.quant_prefill = forced});
    EXPECT_EQ(forced_backend.quant_prefill(QuantLayout::kRows16), forced);
  }
  if (want != QuantPrefill::kInt8) {
    EXPECT_NE(backend.name().find(str_cat("prefill: ", quant_prefill_name(want))), std::string::npos) << backend.name();
  }
}

// The prefill path of AVX512-BF16 machines whose bf16 products are slow
// (QuantPrefill::kF32Tiles, forced here on every CPU): w dequantized to f32 (exact), f32 x, f32 accumulation:
// gamma_k sum |x w| against fp64 of the same values, over more than one tile
// of 256 weight rows.
TEST(CpuBackendQuant, F32TilesMatchFp64OfTheDequantizedWeights) {
  CpuBackend backend(CpuBackendOptions{.quant_prefill = QuantPrefill::kF32Tiles});
  EXPECT_EQ(backend.quant_prefill(), QuantPrefill::kF32Tiles);
  std::mt19937 rng(test_seed(8));
  std::normal_distribution<float> normal;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
                        GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const int64_t k = 512, n = 600, m = 7;  // n: two whole tiles and a partial one
    const std::vector<uint8_t> bytes = random_blocks(type, size_t(n * k / ggml_type_info(type).block_elems), rng);
    const std::vector<float> values = dequantized(type, bytes, n * k);
    auto w = backend.load_weight(HostWeight(type, {n, k}, bytes, "w"));
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = normal(rng);
    expect_near_fp64(matmul_of(backend, *w, x, m, n, k), x, values, m, n, k, 7, exact, ggml_type_info(type).name);
  }
}

// The prefill path of AMX / AVX512-BF16 machines (QuantPrefill::kBf16Tiles, forced here
// where oneDNN has any optimized bf16 kernel): w dequantized and rounded to
// bf16, x rounded to bf16, products exact in f32, f32 accumulation:
// gamma_k sum |x w| against fp64 of the rounded values.
TEST(CpuBackendQuant, Bf16TilesMatchFp64OfTheRoundedValues) {
  std::unique_ptr<CpuBackend> backend;
  try {
    backend = std::make_unique<CpuBackend>(CpuBackendOptions{.quant_prefill = QuantPrefill::kBf16Tiles});
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_EQ(backend->quant_prefill(), QuantPrefill::kBf16Tiles);
  std::mt19937 rng(test_seed(6));
  std::normal_distribution<float> normal;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const int64_t k = 512, n = 1104, m = 9;  // n > one tile of 1024 rows; groups of 8 for Q4_0
    const std::vector<uint8_t> bytes = random_blocks(type, size_t(n * k / ggml_type_info(type).block_elems), rng);
    const std::vector<float> values = dequantized(type, bytes, n * k);
    auto w = backend->load_weight(HostWeight(type, {n, k}, bytes, "w"));
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = normal(rng);
    expect_near_fp64(matmul_of(*backend, *w, x, m, n, k), x, values, m, n, k, 37, to_bf16, ggml_type_info(type).name);
  }
}

// Tables of 16 rows: Q4_0, Q8_0 and Q4_K in groups of 8 or 16, Q5_K and Q6_K
// in groups of 16, where the CPU's kernels read those (a tied output weight is
// the same tensor); 7 rows stay as given.
TEST(CpuBackendQuant, EmbedDequantizesRows) {
  std::mt19937 rng(test_seed(4));
  CpuBackend backend;
  const int64_t d = 256;
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                        GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF16}) {
    for (int64_t vocab : {7, 16}) {
      const std::vector<uint8_t> bytes = random_blocks(type, size_t(vocab * d / ggml_type_info(type).block_elems), rng);
      auto table = backend.load_weight(HostWeight(type, {vocab, d}, bytes, "token_embd.weight"));
      const std::vector<float> values = dequantized(type, bytes, vocab * d);
      const std::vector<int32_t> tokens = {6, 0, 3, 3, int32_t(vocab - 1)};
      auto out = backend.alloc({int64_t(tokens.size()), d});
      backend.embed(*table, tokens, *out);
      const std::vector<float> got = download(backend, *out);
      for (size_t t = 0; t < tokens.size(); ++t)
        for (int64_t i = 0; i < d; ++i)
          ASSERT_EQ(got[t * size_t(d) + size_t(i)], values[size_t(tokens[t] * d + i)])
              << ggml_type_info(type).name << ", " << vocab << " rows, token " << tokens[t];
    }
  }
}

}  // namespace
}  // namespace longctx::cpu
