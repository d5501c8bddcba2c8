// quantize(), for every block type, on inputs chosen to be hard (constant
// blocks, zeros, single outliers, negative-only and positive-only blocks,
// narrow bands far from zero, f16-subnormal and f16-range values,
// sub-blocks of very different magnitudes): each element within the error
// the format allows (half the step of its block or sub-block as stored, or
// for Q8_0/Q4_0/Q5_0 the distance to the end level), each step within a bound from
// the block's values (range / levels plus the granularity of the stored
// scales), and the reference decoders of ggml_test_util.h reading the bytes
// exactly as dequantize() does. Plain types against the dtype conversions;
// argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/ggml_test_util.h"
#include "longctx/core/dtype.h"
#include "longctx/core/ggml_types.h"
#include "test_seed.h"

namespace longctx {
namespace {

using namespace longctx::testing;

const GgmlType kBlockTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                                GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

constexpr double kF16Ulp = 0x1p-10;      // relative spacing of f16 numbers (at most)
constexpr double kF16Tiny = 0x1p-24;     // spacing of f16 subnormals
constexpr double kSearchMargin = 2e-4;   // the quantizer's covering margin (1e-4), doubled

// Blocks of n values (n = block size: 32 or 256) that stress a quantizer.
std::vector<float> hard_inputs(int n, std::mt19937& rng) {
  std::vector<float> x;
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  const auto block = [&](auto value_of) {
    for (int i = 0; i < n; ++i) x.push_back(value_of(i));
  };
  for (float scale : {2e-2f, 1.f, 300.f}) block([&](int) { return scale * normal(rng); });
  block([](int) { return 0.f; });
  block([](int) { return 5.001f; });  // constant, not an f16 number
  block([](int) { return -3.3f; });
  block([&](int i) { return i == 7 ? -60.f : normal(rng); });  // one outlier
  block([&](int i) { return i == n - 1 ? 45.f : normal(rng); });
  block([&](int) { return -1.f - std::fabs(normal(rng)); });  // negative only
  block([&](int) { return 2.f + std::fabs(normal(rng)); });   // positive only, away from 0
  block([&](int) { return 10.f + 1e-2f * normal(rng); });     // narrow band far from 0
  block([&](int) { return -10.f + 1e-3f * normal(rng); });
  block([&](int) { return 1e-6f * normal(rng); });  // scales among the f16 subnormals
  block([&](int i) { return i == 0 ? 65504.f : i == 1 ? -65504.f : 60000.f * uniform(rng); });
  block([&](int i) { return i == 0 ? -65504.f : 65504.f * std::fabs(uniform(rng)) - 1.f; });
  block([&](int i) { return std::ldexp(normal(rng), (i / 32) * 3 - 10); });  // sub-blocks from 2^-10 to 2^11
  block([&](int i) { return i < 32 ? 0.f : normal(rng); });                   // a zero sub-block
  block([&](int i) { return i % 16 == 3 ? 1.f : 0.f; });                      // sparse
  return x;
}

// The distance between adjacent levels of element i of the block at b.
double level_step(GgmlType type, const uint8_t* b, int i) {
  int scale, min;
  switch (type) {
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      ref_k_scale_min(b + 4, i / 32, &scale, &min);
      return ref_f16(read_u16(b)) * scale;
    case GgmlType::kQ2_K: return ref_f16(read_u16(b + 80)) * (b[i / 16] % 16);
    case GgmlType::kQ3_K: return std::fabs(ref_f16(read_u16(b + 108)) * (ref_q3_k_scale(b + 96, i / 16) - 32));
    case GgmlType::kQ6_K: return std::fabs(ref_f16(read_u16(b + 208)) * static_cast<int8_t>(b[192 + i / 16]));
    default: return std::fabs(ref_f16(read_u16(b)));
  }
}

struct Range {
  double min = INFINITY, max = -INFINITY, amax = 0, signed_max = 0;  // signed_max: the value of largest magnitude
};
Range range_of(const float* x, int n) {
  Range r;
  for (int i = 0; i < n; ++i) {
    r.min = std::min(r.min, double(x[i]));
    r.max = std::max(r.max, double(x[i]));
    if (std::fabs(x[i]) > r.amax) r.amax = std::fabs(x[i]), r.signed_max = x[i];
  }
  return r;
}

// Checks every step of one block against the format's bound from the
// block's values x[0..block_elems).
void check_steps(GgmlType type, const float* x, const uint8_t* b) {
  const size_t d_at = type == GgmlType::kQ6_K ? 208 : type == GgmlType::kQ3_K ? 108 : type == GgmlType::kQ2_K ? 80 : 0;
  const double d = ref_f16(read_u16(b + d_at));
  const Range r = range_of(x, int(ggml_type_info(type).block_elems));
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0: {  // |d| = absmax / 127, / 8 or / 16 rounded to nearest
      const int half = type == GgmlType::kQ8_0 ? 127 : type == GgmlType::kQ4_0 ? 8 : 16;
      EXPECT_NEAR(std::fabs(d), r.amax / half, r.amax / half * kF16Ulp / 2 + kF16Tiny / 2);
      if (type != GgmlType::kQ8_0) {
        EXPECT_TRUE(d * r.signed_max <= 0) << "the largest magnitude maps to level 0";
      }
      return;
    }
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: {  // m = min rounded down, d = (max - m) / top rounded up
      const int top = type == GgmlType::kQ4_1 ? 15 : 31;
      const double m = ref_f16(read_u16(b + 2));
      EXPECT_LE(m, r.min);
      EXPECT_GE(m, r.min - std::fabs(r.min) * kF16Ulp - kF16Tiny);
      EXPECT_LE(d, (r.max - m) / top * (1 + kF16Ulp) + kF16Tiny);
      return;
    }
    case GgmlType::kQ2_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      // The step that covers a sub-block whose lowest level (<= 0) lies on
      // the dmin grid: (max - min(0, lo)) / top + dmin / (top + 1); sc adds up to
      // two units of d, the 6-bit scales' granularity.
      // Q2_K: 4-bit scales and mins over sub-blocks of 16.
      const bool q2 = type == GgmlType::kQ2_K;
      const int top = q2 ? 3 : type == GgmlType::kQ4_K ? 15 : 31, sub = q2 ? 16 : 32, scale_top = q2 ? 15 : 63;
      const double dmin = ref_f16(read_u16(b + (q2 ? 82 : 2)));
      double max_ideal = 0, max_off = 0;
      for (int s = 0; s < 256 / sub; ++s) {
        const Range rs = range_of(x + sub * s, sub);
        const double lo = std::min(0.0, rs.min);
        const double ideal = (rs.max - lo) / top + dmin / (top + 1);
        max_ideal = std::max(max_ideal, ideal);
        max_off = std::max(max_off, -lo);
        EXPECT_LE(level_step(type, b, sub * s), ideal * (1 + kSearchMargin) + 2 * d) << "sub-block " << s;
      }
      EXPECT_LE(d, max_ideal / scale_top * (1 + kSearchMargin) * (1 + kF16Ulp) + kF16Tiny);
      EXPECT_LE(dmin, max_off / scale_top * (1 + kF16Ulp) + kF16Tiny);
      return;
    }
    case GgmlType::kQ3_K:
    case GgmlType::kQ6_K: {
      // A signed scale puts the extra level on the side of the largest
      // magnitude: the covering step is at most absmax / 31.5 (Q3_K: /
      // 3.5); the int8 (6-bit) scales add up to two units of d.
      const bool q3 = type == GgmlType::kQ3_K;
      double max_ideal = 0;
      for (int s = 0; s < 16; ++s) {
        const double ideal = range_of(x + 16 * s, 16).amax / (q3 ? 3.5 : 31.5);
        max_ideal = std::max(max_ideal, ideal);
        EXPECT_LE(level_step(type, b, 16 * s), ideal * (1 + kSearchMargin) + 2 * d) << "sub-block " << s;
      }
      EXPECT_LE(d, max_ideal / (q3 ? 31 : 127) * (1 + kSearchMargin) * (1 + kF16Ulp) + kF16Tiny);
      return;
    }
    default: FAIL() << "not a block type";
  }
}

TEST(GgmlQuantize, ErrorWithinTheFormatsBoundOnHardInputs) {
  std::mt19937 rng(test_seed(11));
  for (GgmlType type : kBlockTypes) {
    const GgmlTypeInfo& info = ggml_type_info(type);
    SCOPED_TRACE(info.name);
    const int n = int(info.block_elems);
    const std::vector<float> x = hard_inputs(n, rng);
    const std::vector<uint8_t> bytes = quantize(type, x);
    ASSERT_EQ(bytes.size(), x.size() / size_t(n) * size_t(info.block_bytes));
    std::vector<float> y(x.size());
    dequantize(type, bytes, y);
    for (size_t blk = 0; blk < x.size() / size_t(n); ++blk) {
      SCOPED_TRACE("block " + std::to_string(blk));
      const uint8_t* b = bytes.data() + blk * size_t(info.block_bytes);
      const float* xb = x.data() + blk * size_t(n);
      check_steps(type, xb, b);
      const Range r = range_of(xb, n);
      int worse = 0;
      for (int i = 0; i < n; ++i) {
        const size_t k = blk * size_t(n) + size_t(i);
        const double step = level_step(type, b, i);
        // Q8_0, Q4_0 and Q5_0 round d to nearest (as ggml): a value beyond the
        // end level (127 d; 8 d or 16 d on the side of the largest magnitude,
        // one step less on the other) is as far as it is from that level.
        double allowed = step / 2;
        if (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ5_0) {
          const int half = type == GgmlType::kQ8_0 ? 127 : type == GgmlType::kQ4_0 ? 8 : 16;
          const int end = type != GgmlType::kQ8_0 && x[k] * r.signed_max < 0 ? half - 1 : half;
          allowed = std::max(allowed, std::fabs(x[k]) - end * step);
        }
        allowed = allowed * (1 + 1e-5) + 1e-6 * std::fabs(x[k]);
        const double err = std::fabs(double(y[k]) - x[k]);
        if (err > allowed && ++worse <= 3)
          ADD_FAILURE() << "element " << i << ": x " << x[k] << " -> " << y[k] << ", error " << err << " > " << allowed
                        << " (step " << step << ")";
        // The reference decoder reads the bytes as dequantize() does: one rounding of an exact value.
        EXPECT_EQ(y[k], static_cast<float>(ref_element(type, b, i))) << "element " << i;
      }
      if (r.amax == 0) {
        for (int i = 0; i < n; ++i) EXPECT_EQ(y[blk * size_t(n) + size_t(i)], 0.f);
      }
    }
  }
}

// On Gaussian weights, the search keeps the error at or below that of a
// uniform quantizer with the same steps (RMS step / sqrt(12)), and quantizing
// the rows separately gives the bytes of the whole.
TEST(GgmlQuantize, GaussianRowsAccuracyAndRowIndependence) {
  std::mt19937 rng(test_seed(12));
  std::normal_distribution<float> normal;
  std::vector<float> x(256 * 64);
  for (float& v : x) v = normal(rng);
  for (GgmlType type : kBlockTypes) {
    const GgmlTypeInfo& info = ggml_type_info(type);
    SCOPED_TRACE(info.name);
    const std::vector<uint8_t> bytes = quantize(type, x);
    std::vector<float> y(x.size());
    dequantize(type, bytes, y);
    double err2 = 0, step2 = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      const size_t blk = k / size_t(info.block_elems);
      const double step = level_step(type, bytes.data() + blk * size_t(info.block_bytes), int(k % size_t(info.block_elems)));
      err2 += (double(y[k]) - x[k]) * (double(y[k]) - x[k]);
      step2 += step * step;
    }
    EXPECT_LE(std::sqrt(err2 / step2 * 12), 1.02) << "RMS error / (RMS step / sqrt(12))";
    const size_t row = x.size() / 4;
    std::vector<uint8_t> rows;
    for (size_t r = 0; r < 4; ++r) {
      const auto part = quantize(type, std::span(x).subspan(r * row, row));
      rows.insert(rows.end(), part.begin(), part.end());
    }
    EXPECT_EQ(rows, bytes);
  }
}

TEST(GgmlQuantize, PlainTypesMatchDtypeConversions) {
  std::mt19937 rng(test_seed(13));
  std::normal_distribution<float> normal(0.f, 10.f);
  std::vector<float> x(100);
  for (float& v : x) v = normal(rng);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    const auto bytes = quantize(type, x);
    std::vector<float> y(x.size());
    dequantize(type, bytes, y);
    for (size_t i = 0; i < x.size(); ++i) {
      const float expected = type == GgmlType::kF32   ? x[i]
                             : type == GgmlType::kF16 ? f16_bits_to_f32(f32_to_f16_bits(x[i]))
                                                      : bf16_bits_to_f32(f32_to_bf16_bits(x[i]));
      EXPECT_EQ(y[i], expected) << ggml_type_info(type).name << " " << i;
    }
  }
}

TEST(GgmlQuantize, ArgumentErrors) {
  for (GgmlType type : {GgmlType::kQ8_1, GgmlType::kQ8_K, GgmlType::kI32})
    expect_error([&] { quantize(type, std::vector<float>(256)); }, ErrorCode::kUnsupported,
                 {ggml_type_info(type).name});
  expect_error([&] { quantize(GgmlType::kQ8_0, std::vector<float>(31)); }, ErrorCode::kInvalidArgument,
               {"q8_0", "31"});
  expect_error([&] { quantize(GgmlType::kQ5_K, std::vector<float>(128)); }, ErrorCode::kInvalidArgument,
               {"q5_k", "128", "256"});
  std::vector<uint8_t> out(143);
  expect_error([&] { quantize(GgmlType::kQ4_K, std::vector<float>(256), out); }, ErrorCode::kInvalidArgument,
               {"q4_k", "144", "143"});
  for (GgmlType type : kBlockTypes) {
    for (float bad : {NAN, INFINITY, -INFINITY, 1e30f, 65505.f, -65536.f}) {
      std::vector<float> x(512, 1.f);
      x[300] = bad;
      expect_error([&] { quantize(type, x); }, ErrorCode::kInvalidArgument,
                   {ggml_type_info(type).name, "element 300"});
    }
  }
  EXPECT_TRUE(quantize(GgmlType::kQ8_0, {}).empty());
}

}  // namespace
}  // namespace longctx
