// Quantized-weight matmul (cpu/quant_matmul.h) on every ISA this CPU has,
// against fp64 products of the dequantized weights (core's dequantize(),
// tested against its own reference decoders):
// - with the quantized activations (d_a * q_a): only fp32 rounding differs;
// - with the original f32 activations: within the activation rounding bound
//   sum_b (d_a,b / 2) sum_{i in b} |w_i| on top of that.
// Q4_0, Q8_0 and Q2_K..Q6_K also in groups of 8 and 16 rows
// (QuantLayout::kRows8, kRows16).
// ISAs the CPU lacks are skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/ggml_test_util.h"
#include "hwy/targets.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/dtype.h"
#include "longctx/cpu/quant_matmul.h"
#include "hwy_target.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

using longctx::testing::ForcedHighwayTarget;
using longctx::testing::random_blocks;

constexpr GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                               GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
constexpr QuantIsa kIsas[] = {QuantIsa::kGeneric, QuantIsa::kAvx2, QuantIsa::kAvxVnni, QuantIsa::kAvx512Vnni};
constexpr double kUnit = 1.0 / (1 << 24);  // f32 unit roundoff

float f16_field(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_bits_to_f32(bits);
}

// A bound on |scale part| + |offset part| of any value of the block at b
// (value = scale part + offset part, each computed exactly by the kernel in
// integers before its fp32 products): the largest code times the largest
// scale, plus the largest offset.
double block_magnitude(GgmlType type, const uint8_t* b) {
  const double d = std::fabs(f16_field(b));
  switch (type) {
    case GgmlType::kQ4_0: return 23 * d;
    case GgmlType::kQ4_1: return 15 * d + std::fabs(f16_field(b + 2));
    case GgmlType::kQ5_0: return 47 * d;
    case GgmlType::kQ5_1: return 31 * d + std::fabs(f16_field(b + 2));
    case GgmlType::kQ8_0: return 128 * d;
    case GgmlType::kQ2_K: return 3 * 15 * std::fabs(f16_field(b + 80)) + 15 * std::fabs(f16_field(b + 82));
    case GgmlType::kQ3_K: return 4 * 32 * std::fabs(f16_field(b + 108));
    case GgmlType::kQ4_K: return 15 * 63 * d + 63 * std::fabs(f16_field(b + 2));
    case GgmlType::kQ5_K: return 31 * 63 * d + 63 * std::fabs(f16_field(b + 2));
    case GgmlType::kQ6_K: return 95 * 128 * std::fabs(f16_field(b + 208));
    default: return 0;
  }
}

std::string isa_unsupported_reason(QuantIsa isa) {
  for (QuantIsa supported : supported_quant_isas())
    if (supported == isa) return "";
  return std::string(quant_isa_name(isa)) + ": this CPU lacks it (" + describe_cpu_features(cpu_features()) + ")";
}

// Activations that exercise the quantizer: normal values, a zero row, a
// constant row, rows with one large outlier.
std::vector<float> random_acts(int64_t rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t(rows * k));
  for (auto& v : x) v = normal(rng);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * k;
    switch (r % 5) {
      case 1: std::fill(row, row + k, 0.f); break;
      case 2: std::fill(row, row + k, -0.75f); break;
      case 3: row[rng() % k] = 300.f; break;
      default: break;
    }
  }
  return x;
}

// y from quant_matmul_tile against fp64 of the dequantized weights (wf, from
// the GGML-layout bytes w) and the quantized activations, inside the tile
// rows [r0, r1) x outputs [o0, o1); 12345 outside it.
void expect_tile_matches_fp64(GgmlType type, QuantIsa isa, const std::vector<uint8_t>& w, const std::vector<float>& wf,
                              const std::vector<float>& x, const QuantizedActs& acts, int64_t r0, int64_t r1,
                              int64_t o0, int64_t o1, const std::vector<float>& y, int64_t ldy,
                              const std::string& what) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  const int64_t m = acts.rows, k = acts.k, block = acts.block;
  const int64_t row_bytes = int64_t(*ggml_bytes(type, k));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t o = 0; o < ldy; ++o) {
      const float got = y[size_t(r * ldy + o)];
      if (r < r0 || r >= r1 || o < o0 || o >= o1) {
        ASSERT_EQ(got, 12345.f) << what << ": wrote outside the tile at row " << r << ", output " << o;
        continue;
      }
      double exact = 0, original = 0, magnitude = 0, act_rounding = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t ab = i / block;
        const double da = acts.d[size_t(r * (k / block) + ab)];
        const double a = da * acts.q[size_t(r * k + i)];
        const double wi = wf[size_t(o * k + i)];
        exact += wi * a;
        original += wi * double(x[size_t(r * k + i)]);
        const uint8_t* wb = w.data() + o * row_bytes + (i / info.block_elems) * info.block_bytes;
        magnitude += block_magnitude(type, wb) * std::fabs(a);
        act_rounding += std::fabs(wi) * da / 2;
      }
      // fp32: one product and one addition per block into one of eight lanes, the
      // final sum of lanes, and dequantize()'s own rounding of the reference.
      const double nb = double(k / info.block_elems);
      const double tol = (nb + 16) * 2 * kUnit * magnitude + 1e-30;
      const std::string where = what + ": " + info.name + " on " + quant_isa_name(isa) + ", k " + std::to_string(k) +
                                ", row " + std::to_string(r) + ", output " + std::to_string(o);
      ASSERT_NEAR(got, exact, tol) << where;
      ASSERT_NEAR(got, original, tol + act_rounding * (1 + 1e-6)) << where << " (vs f32 activations)";
    }
  }
}

class QuantMatmulTest : public ::testing::TestWithParam<std::tuple<GgmlType, QuantIsa>> {};

TEST_P(QuantMatmulTest, MatchesFp64ProductOfDequantizedWeights) {
  const auto [type, isa] = GetParam();
  const std::string why = isa_unsupported_reason(isa);
  if (!why.empty()) GTEST_SKIP() << why;
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (!info.dequantizable) GTEST_SKIP() << info.name << ": core cannot dequantize it, so there is no reference";
  std::mt19937 rng(test_seed(1234 + static_cast<int>(type) * 10 + static_cast<int>(isa)));
  const int64_t block = quant_act_block(type);
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t k = info.block_elems * (1 + int64_t(rng() % (block == 256 ? 6 : 40)));
    const int64_t n = 1 + int64_t(rng() % 19);
    // Partial runs of four and eight rows (the group kernels take eight at
    // once on AVX-512): the first two trials take 19 and 12 rows whole.
    const int64_t m = trial == 0 ? 19 : trial == 1 ? 12 : 1 + int64_t(rng() % 19);
    const std::vector<uint8_t> w = random_blocks(type, size_t(n * k / info.block_elems), rng);
    std::vector<float> wf(size_t(n * k));
    dequantize(type, w, wf);
    const std::vector<float> x = random_acts(m, k, rng);
    QuantizedActs acts;
    quantize_acts(x.data(), m, k, k, block, acts);

    // A sub-tile of rows and outputs, inside a y with a larger stride; the
    // entries outside must stay untouched.
    const int64_t r0 = trial < 2 ? 0 : int64_t(rng() % m), r1 = trial < 2 ? m : r0 + 1 + int64_t(rng() % (m - r0));
    const int64_t o0 = int64_t(rng() % n), o1 = o0 + 1 + int64_t(rng() % (n - o0));
    const int64_t ldy = n + 3;
    std::vector<float> y(size_t(m * ldy), 12345.f);
    quant_matmul_tile(isa, type, QuantLayout::kRows, w.data(), acts, r0, r1, o0, o1, y.data(), ldy);
    expect_tile_matches_fp64(type, isa, w, wf, x, acts, r0, r1, o0, o1, y, ldy, "rows");
    if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1) continue;

    // The same weights in groups of 8 and of 16 rows (n rounded up with more
    // random rows), a tile of whole groups; every ISA runs both (those
    // without kernels for a group size unpack the groups first).
    for (QuantLayout layout : {QuantLayout::kRows8, QuantLayout::kRows16}) {
      const int64_t g = quant_group_rows(layout), ng = (n + g - 1) / g * g;
      std::vector<uint8_t> wg = w;
      const std::vector<uint8_t> extra = random_blocks(type, size_t((ng - n) * k / info.block_elems), rng);
      wg.insert(wg.end(), extra.begin(), extra.end());
      std::vector<float> wfg(size_t(ng * k));
      dequantize(type, wg, wfg);
      std::vector<uint8_t> packed(wg.size());
      pack_groups(type, layout, wg.data(), ng, k, packed.data());
      const int64_t g0 = int64_t(rng() % (ng / g)), g1 = g0 + 1 + int64_t(rng() % (ng / g - g0));
      const int64_t ldyg = ng + 5;
      std::vector<float> yg(size_t(m * ldyg), 12345.f);
      quant_matmul_tile(isa, type, layout, packed.data(), acts, r0, r1, g * g0, g * g1, yg.data(), ldyg);
      expect_tile_matches_fp64(type, isa, wg, wfg, x, acts, r0, r1, g * g0, g * g1, yg, ldyg,
                               g == 8 ? "rows8" : "rows16");
    }
  }
}

// pack_groups puts each field of row r's block b where quant_matmul.h says
// (unit i of a field of `unit`-byte units at field_start + G unit i + unit r
// of the block b of row r's group of G rows), and unpack_group_row gives
// every row back byte for byte.
TEST(QuantMatmul, GroupsPackAsDocumentedAndUnpackEveryRow) {
  struct Field {
    int64_t unit, bytes;
  };
  const std::vector<std::pair<GgmlType, std::vector<Field>>> layouts = {
      {GgmlType::kQ4_0, {{2, 2}, {4, 16}}},
      {GgmlType::kQ8_0, {{2, 2}, {4, 32}}},
      {GgmlType::kQ4_K, {{2, 2}, {2, 2}, {4, 12}, {4, 128}}},
      {GgmlType::kQ5_K, {{2, 2}, {2, 2}, {4, 12}, {4, 32}, {4, 128}}},
      {GgmlType::kQ6_K, {{4, 128}, {4, 64}, {4, 16}, {2, 2}}},
      {GgmlType::kQ3_K, {{4, 32}, {4, 64}, {4, 12}, {2, 2}}},
      {GgmlType::kQ2_K, {{4, 16}, {4, 64}, {2, 2}, {2, 2}}},
  };
  std::mt19937 rng(test_seed(21));
  for (const auto& [type, fields] : layouts) {
    for (QuantLayout layout : {QuantLayout::kRows8, QuantLayout::kRows16}) {
      const GgmlTypeInfo& info = ggml_type_info(type);
      const int64_t g = quant_group_rows(layout), n = 3 * g, nb = 3, k = nb * info.block_elems;
      const int64_t block_bytes = info.block_bytes, row_bytes = nb * block_bytes;
      const std::vector<uint8_t> w = random_blocks(type, size_t(n * nb), rng);
      std::vector<uint8_t> packed(w.size());
      pack_groups(type, layout, w.data(), n, k, packed.data());
      for (int64_t o = 0; o < n; ++o) {
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* block = w.data() + o * row_bytes + b * block_bytes;
          const uint8_t* group_block = packed.data() + (o / g) * g * row_bytes + b * g * block_bytes;
          int64_t at_row = 0, at_group = 0;
          for (const Field& f : fields) {
            for (int64_t i = 0; i < f.bytes; ++i)
              ASSERT_EQ(group_block[at_group + g * f.unit * (i / f.unit) + f.unit * (o % g) + i % f.unit],
                        block[at_row + i])
                  << info.name << " groups of " << g << ", row " << o << ", block " << b << ", byte " << at_row + i;
            at_row += f.bytes;
            at_group += g * f.bytes;
          }
          ASSERT_EQ(at_row, block_bytes) << info.name;
        }
        std::vector<uint8_t> plain(static_cast<size_t>(row_bytes));
        unpack_group_row(type, layout, packed.data(), k, o, plain.data());
        ASSERT_EQ(std::memcmp(plain.data(), w.data() + o * row_bytes, size_t(row_bytes)), 0)
            << info.name << " groups of " << g << ", row " << o;
      }
    }
  }
}

TEST_P(QuantMatmulTest, NonFiniteActivationsGiveNaN) {
  const auto [type, isa] = GetParam();
  const std::string why = isa_unsupported_reason(isa);
  if (!why.empty()) GTEST_SKIP() << why;
  const GgmlTypeInfo& info = ggml_type_info(type);
  std::mt19937 rng(test_seed(7));
  const int64_t k = 2 * info.block_elems;
  const std::vector<uint8_t> w = random_blocks(type, 2, rng);
  std::vector<float> x(size_t(2 * k), 0.5f);
  x[3] = INFINITY;
  x[size_t(k + 5)] = NAN;
  QuantizedActs acts;
  quantize_acts(x.data(), 2, k, k, quant_act_block(type), acts);
  float y[2] = {0.f, 0.f};
  quant_matmul_tile(isa, type, QuantLayout::kRows, w.data(), acts, 0, 2, 0, 1, y, 1);
  EXPECT_TRUE(std::isnan(y[0])) << y[0];
  EXPECT_TRUE(std::isnan(y[1])) << y[1];
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<GgmlType, QuantIsa>>& info) {
  std::string name = std::string(ggml_type_info(std::get<0>(info.param)).name) + "_" +
                     quant_isa_name(std::get<1>(info.param));
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(TypesAndIsas, QuantMatmulTest,
                         ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::ValuesIn(kIsas)), case_name);

TEST(QuantMatmul, IsasAreListedBestFirstWithGenericLast) {
  const std::vector<QuantIsa> isas = supported_quant_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.back(), QuantIsa::kGeneric);
  EXPECT_EQ(best_quant_isa(), isas.front());
  const CpuFeatures& f = cpu_features();
  if (f.avx2 && f.fma && f.f16c) {
    EXPECT_NE(std::find(isas.begin(), isas.end(), QuantIsa::kAvx2), isas.end());
  }
}

// The quantizer is vectorized: on every Highway target, products exactly
// halfway between two codes (ties go to even) and their f32 neighbours
// (0.5 - 2^-25 among them), zero, subnormal and non-finite blocks must give the
// scalar rule's codes and scales bit for bit.
TEST(QuantMatmul, QuantizesHardBlocksAsTheScalarRuleOnEveryHighwayTarget) {
  std::mt19937 rng(test_seed(11));
  for (int64_t block : {32, 256}) {
    const int64_t n_blocks = 24, k = block * n_blocks;
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t b = 0; b < n_blocks; ++b) {
      float* row = x.data() + b * block;
      // The block's largest |x| is 127, so 127 / absmax = 1 and x * 1 = x.
      for (int64_t i = 0; i < block; ++i) {
        const float tie = float(int(rng() % 254) - 127) + 0.5f;
        switch (rng() % 4) {
          case 0: row[i] = tie; break;
          case 1: row[i] = std::nextafter(tie, 1e9f); break;
          case 2: row[i] = std::nextafter(tie, -1e9f); break;
          default: row[i] = (rng() % 2 ? 1.f : -1.f) * std::nextafter(0.5f, 0.f); break;
        }
      }
      row[rng() % block] = (rng() % 2 ? 127.f : -127.f);
      if (b == 1) std::fill(row, row + block, 0.f);
      if (b == 2) row[rng() % block] = NAN;
      if (b == 3) row[rng() % block] = -INFINITY;
      if (b == 4) {  // tiny values: an absmax (127e-30) far from 127
        for (int64_t i = 0; i < block; ++i) row[i] *= 1e-30f;
      }
      if (b == 5) {  // a subnormal absmax: 127 / absmax is Inf, the codes 0
        std::fill(row, row + block, 0.f);
        row[rng() % block] = -0x1p-140f;
      }
    }
    for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + ", block " + std::to_string(block));
      const ForcedHighwayTarget forced(target);
      QuantizedActs acts;
      quantize_acts(x.data(), 1, k, k, block, acts);
      for (int64_t b = 0; b < n_blocks; ++b) {
        const float* row = x.data() + b * block;
        float amax = 0.f;
        bool finite = true;
        for (int64_t i = 0; i < block; ++i) {
          finite &= std::isfinite(row[i]);
          amax = std::max(amax, std::fabs(row[i]));
        }
        const float d = acts.d[size_t(b)];
        if (!finite) {
          ASSERT_TRUE(std::isnan(d)) << "block " << b;
          for (int64_t i = 0; i < block; ++i) ASSERT_EQ(acts.q[size_t(b * block + i)], 0) << "block " << b;
          continue;
        }
        ASSERT_EQ(d, amax / 127.f) << "block " << b;
        const float inverse = amax >= std::numeric_limits<float>::min() ? 127.f / amax : 0.f;
        for (int64_t i = 0; i < block; ++i) {
          const float product = row[i] * inverse;
          ASSERT_EQ(acts.q[size_t(b * block + i)], std::lrint(product))
              << "block " << b << ", value " << i << " = " << row[i];
        }
      }
    }
  }
}

TEST(QuantMatmul, QuantizedActivationsHoldScalesAndSums) {
  std::mt19937 rng(test_seed(3));
  const std::vector<float> x = random_acts(3, 512, rng);
  for (int64_t block : {32, 256}) {
    QuantizedActs acts;
    quantize_acts(x.data(), 3, 512, 512, block, acts);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t b = 0; b < 512 / block; ++b) {
        float amax = 0;
        int sum = 0;
        for (int64_t i = b * block; i < (b + 1) * block; ++i) {
          amax = std::max(amax, std::fabs(x[size_t(r * 512 + i)]));
          const int q = acts.q[size_t(r * 512 + i)];
          ASSERT_LE(std::abs(q), 127);
          sum += q;
          ASSERT_NEAR(q * double(acts.d[size_t(r * (512 / block) + b)]), x[size_t(r * 512 + i)],
                      acts.d[size_t(r * (512 / block) + b)] * 0.5 * (1 + 1e-6));
        }
        ASSERT_FLOAT_EQ(acts.d[size_t(r * (512 / block) + b)], amax / 127.f);
        if (block == 32) {
          // One rounding of d times the exact sum, even where the two halves' sums nearly cancel.
          ASSERT_EQ(acts.dsum[size_t(r * 16 + b)], acts.d[size_t(r * 16 + b)] * float(sum))
              << "row " << r << ", block " << b;
        }
      }
      for (int64_t i = 0; block == 32 && i < 512 / 4; ++i) {
        int sum = 0;
        for (int64_t t = 4 * i; t < 4 * i + 4; ++t) sum += acts.q[size_t(r * 512 + t)];
        ASSERT_EQ(acts.minus_sum4[size_t(r * 128 + i)], -sum);
      }
      for (int64_t b = 0; b < 512 / 32; ++b) {
        int sum = 0;
        for (int64_t i = 32 * b; i < 32 * b + 32; ++i) sum += acts.q[size_t(r * 512 + i)];
        ASSERT_EQ(acts.minus_sum32[size_t(r * 16 + b)], -sum) << "block " << block;
      }
      for (int64_t g = 0; block == 256 && g < 32; ++g) {
        int sum = 0;
        for (int64_t i = 16 * g; i < 16 * g + 16; ++i) sum += acts.q[size_t(r * 512 + i)];
        ASSERT_EQ(acts.sum16[size_t(r * 32 + g)], sum);
      }
      // block 256: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7) as int16 pairs.
      for (int64_t b = 0; block == 256 && b < 2; ++b) {
        const int pairs[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
        for (int w = 0; w < 4; ++w) {
          const int32_t word = acts.minus_sum32_pairs[size_t((r * 2 + b) * 4 + w)];
          ASSERT_EQ(int16_t(word & 0xFFFF), acts.minus_sum32[size_t(r * 16 + 8 * b + pairs[w][0])]) << w;
          ASSERT_EQ(int16_t(uint32_t(word) >> 16), acts.minus_sum32[size_t(r * 16 + 8 * b + pairs[w][1])]) << w;
        }
      }
    }
  }
}

TEST(QuantMatmul, RejectsRowsOffTheBlock) {
  std::vector<float> x(300, 1.f);
  QuantizedActs acts;
  expect_error([&] { quantize_acts(x.data(), 1, 48, 48, 32, acts); }, ErrorCode::kInvalidArgument, {"48", "32"});
  expect_error([&] { quantize_acts(x.data(), 1, 64, 64, 64, acts); }, ErrorCode::kInvalidArgument, {"64"});
  expect_error([&] { quantize_acts(x.data(), 1, 288, 288, 256, acts); }, ErrorCode::kInvalidArgument, {"288", "256"});
  EXPECT_FALSE(is_quant_matmul_type(GgmlType::kF16));
  EXPECT_FALSE(is_quant_matmul_type(GgmlType::kQ8_K));
  for (GgmlType type : kTypes) EXPECT_TRUE(is_quant_matmul_type(type)) << ggml_type_info(type).name;
}

}  // namespace
}  // namespace longctx::cpu
