// GGML types: the size table against the spec's field lists, ggml_bytes
// edge cases, dequantize() against per-element reference decoders written
// here from the block layouts (plus "pack logical values, decode, compare"
// checks for the k-quants), and quantize() error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/ggml_test_util.h"
#include "longctx/core/dtype.h"
#include "longctx/core/ggml_types.h"

namespace longctx {
namespace {

using namespace longctx::testing;

// ---- reference decoders: value of element i (0 <= i < block_elems) of the block at b ----

double nibble(uint8_t byte, bool high) { return high ? byte >> 4 : byte & 15; }

// Q4_0 / Q4_1 / Q5_0 / Q5_1: element i < 16 is the low nibble of qs[i], i >= 16
// the high nibble of qs[i - 16]; Q5 adds bit i of the 32-bit qh as bit 4.
double ref_q4_0(const uint8_t* b, int i) { return (nibble(b[2 + i % 16], i >= 16) - 8) * ref_f16(read_u16(b)); }
double ref_q4_1(const uint8_t* b, int i) {
  return nibble(b[4 + i % 16], i >= 16) * ref_f16(read_u16(b)) + ref_f16(read_u16(b + 2));
}
double ref_q5(const uint8_t* b, int i, bool has_min) {
  const uint8_t* qh = b + (has_min ? 4 : 2);
  const uint8_t* qs = qh + 4;
  const int high_bit = (qh[i / 8] >> (i % 8)) & 1;
  const double q = nibble(qs[i % 16], i >= 16) + 16 * high_bit;
  const double d = ref_f16(read_u16(b));
  return has_min ? q * d + ref_f16(read_u16(b + 2)) : (q - 16) * d;
}
double ref_q5_0(const uint8_t* b, int i) { return ref_q5(b, i, false); }
double ref_q5_1(const uint8_t* b, int i) { return ref_q5(b, i, true); }
double ref_q8_0(const uint8_t* b, int i) { return static_cast<int8_t>(b[2 + i]) * ref_f16(read_u16(b)); }

// Q4_K: sub-block s = i / 32 of 8; 6-bit scale and min of s: for s < 4 the
// low 6 bits of scales[s] and scales[s + 4]; for s >= 4 the nibbles of
// scales[s + 4] (low: scale, high: min) with the top 2 bits of scales[s - 4]
// (scale) and scales[s] (min) above them. Quants: 64-element chunk c = i / 64
// uses qs[32c .. 32c + 31], low nibbles for its first 32 elements.
double ref_q4_k(const uint8_t* b, int i) {
  const uint8_t* scales = b + 4;
  const int s = i / 32;
  int scale, min;
  if (s < 4) {
    scale = scales[s] % 64;
    min = scales[s + 4] % 64;
  } else {
    scale = scales[s + 4] % 16 + 16 * (scales[s - 4] / 64);
    min = scales[s + 4] / 16 + 16 * (scales[s] / 64);
  }
  const double q = nibble(b[16 + 32 * (i / 64) + i % 32], (i / 32) % 2 == 1);
  return ref_f16(read_u16(b)) * scale * q - ref_f16(read_u16(b + 2)) * min;
}

// Q6_K: 128-element halves; in a half, element r = 32k + l takes its low 4
// bits from ql[64*half + l + 32*(k % 2)] (high nibble when k >= 2) and its
// high 2 bits from bits 2k, 2k+1 of qh[32*half + l]; the scale of element i is
// scales[i / 16] (int8); value d * scale * (q - 32).
double ref_q6_k(const uint8_t* b, int i) {
  const int half = i / 128, r = i % 128, k = r / 32, l = r % 32;
  const double low = nibble(b[64 * half + l + 32 * (k % 2)], k >= 2);
  const int high = (b[128 + 32 * half + l] >> (2 * k)) & 3;
  const double q = low + 16 * high - 32;
  return ref_f16(read_u16(b + 208)) * static_cast<int8_t>(b[192 + i / 16]) * q;
}

double ref_plain(GgmlType type, const uint8_t* b) {
  if (type == GgmlType::kF16) return ref_f16(read_u16(b));
  if (type == GgmlType::kBF16) return ref_bf16(read_u16(b));
  float v;
  std::memcpy(&v, b, 4);
  return v;
}

double ref_element(GgmlType type, const uint8_t* block, int i) {
  switch (type) {
    case GgmlType::kQ4_0: return ref_q4_0(block, i);
    case GgmlType::kQ4_1: return ref_q4_1(block, i);
    case GgmlType::kQ5_0: return ref_q5_0(block, i);
    case GgmlType::kQ5_1: return ref_q5_1(block, i);
    case GgmlType::kQ8_0: return ref_q8_0(block, i);
    case GgmlType::kQ4_K: return ref_q4_k(block, i);
    case GgmlType::kQ6_K: return ref_q6_k(block, i);
    default: return ref_plain(type, block);
  }
}

TEST(GgmlTypes, SizesFromTheSpec) {
  // Field sizes of each block as listed in the GGUF spec / ggml-common.h.
  struct Row {
    GgmlType type;
    const char* name;
    int64_t elems, bytes;
  } rows[] = {
      {GgmlType::kF32, "f32", 1, 4},         {GgmlType::kF16, "f16", 1, 2},
      {GgmlType::kQ4_0, "q4_0", 32, 2 + 16}, {GgmlType::kQ4_1, "q4_1", 32, 4 + 16},
      {GgmlType::kQ5_0, "q5_0", 32, 22},     {GgmlType::kQ5_1, "q5_1", 32, 24},
      {GgmlType::kQ8_0, "q8_0", 32, 34},     {GgmlType::kQ8_1, "q8_1", 32, 36},
      {GgmlType::kQ2_K, "q2_k", 256, 84},    {GgmlType::kQ3_K, "q3_k", 256, 110},
      {GgmlType::kQ4_K, "q4_k", 256, 144},   {GgmlType::kQ5_K, "q5_k", 256, 176},
      {GgmlType::kQ6_K, "q6_k", 256, 210},   {GgmlType::kQ8_K, "q8_k", 256, 292},
      {GgmlType::kI8, "i8", 1, 1},           {GgmlType::kI16, "i16", 1, 2},
      {GgmlType::kI32, "i32", 1, 4},         {GgmlType::kI64, "i64", 1, 8},
      {GgmlType::kF64, "f64", 1, 8},         {GgmlType::kBF16, "bf16", 1, 2},
  };
  for (const Row& row : rows) {
    const GgmlTypeInfo& info = ggml_type_info(row.type);
    EXPECT_STREQ(info.name, row.name);
    EXPECT_EQ(info.block_elems, row.elems) << row.name;
    EXPECT_EQ(info.block_bytes, row.bytes) << row.name;
    EXPECT_EQ(ggml_type_from_id(static_cast<uint32_t>(row.type)), row.type);
  }
  for (uint32_t unknown : {4u, 5u, 16u, 31u, 40u, 1000u, 0xFFFFFFFFu}) EXPECT_FALSE(ggml_type_from_id(unknown));
  int dequantizable = 0;
  for (const Row& row : rows) dequantizable += ggml_type_info(row.type).dequantizable;
  EXPECT_EQ(dequantizable, int(dequantizable_types().size()));
}

TEST(GgmlTypes, Bytes) {
  EXPECT_EQ(ggml_bytes(GgmlType::kF32, 0), 0u);
  EXPECT_EQ(ggml_bytes(GgmlType::kF16, 3), 6u);
  EXPECT_EQ(ggml_bytes(GgmlType::kQ8_0, 64), 68u);
  EXPECT_EQ(ggml_bytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_FALSE(ggml_bytes(GgmlType::kQ8_0, 33));
  EXPECT_FALSE(ggml_bytes(GgmlType::kQ6_K, 128));
  EXPECT_FALSE(ggml_bytes(GgmlType::kF32, -4));
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ggml_bytes(GgmlType::kI8, max), uint64_t(max));
  EXPECT_EQ(ggml_bytes(GgmlType::kF16, max), uint64_t(max) * 2);  // fits u64
  EXPECT_FALSE(ggml_bytes(GgmlType::kF32, max));                  // 4 * (2^63 - 1) does not
  EXPECT_FALSE(ggml_bytes(GgmlType::kF32, int64_t(1) << 62));     // exactly 2^64
  EXPECT_EQ(ggml_bytes(GgmlType::kF32, (int64_t(1) << 62) - 1), (uint64_t(1) << 62) * 4 - 4);
}

TEST(GgmlTypes, DequantizeMatchesReferenceOnRandomBlocks) {
  std::mt19937 rng(7);
  for (GgmlType type : dequantizable_types()) {
    const GgmlTypeInfo& info = ggml_type_info(type);
    SCOPED_TRACE(info.name);
    for (size_t n_blocks : {size_t(1), size_t(5)}) {
      const size_t blocks = info.block_elems == 1 ? n_blocks * 37 : n_blocks;
      const auto bytes = random_blocks(type, blocks, rng);
      std::vector<float> out(blocks * size_t(info.block_elems), NAN);
      dequantize(type, bytes, out);
      for (size_t blk = 0; blk < blocks; ++blk) {
        for (int i = 0; i < info.block_elems; ++i) {
          const double expected = ref_element(type, bytes.data() + blk * size_t(info.block_bytes), i);
          const float got = out[blk * size_t(info.block_elems) + size_t(i)];
          // Products of exact small integers and f16 scales: the f32 result is
          // the exact value rounded once or twice (scale*q, minus a min).
          EXPECT_NEAR(got, expected, 4e-7 * (std::fabs(expected) + 1.0)) << "block " << blk << " element " << i;
        }
      }
    }
  }
}

TEST(GgmlTypes, DequantizeF16AndBf16SpecialValues) {
  const std::vector<uint16_t> f16 = {0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF, 0x7C00, 0xFC00};
  std::vector<uint8_t> bytes(f16.size() * 2);
  std::memcpy(bytes.data(), f16.data(), bytes.size());
  std::vector<float> out(f16.size());
  dequantize(GgmlType::kF16, bytes, out);
  for (size_t i = 0; i < f16.size(); ++i) EXPECT_EQ(double(out[i]), ref_f16(f16[i])) << i;
  EXPECT_TRUE(std::signbit(out[1]));
  const uint16_t nan_bits = 0x7E00;
  std::memcpy(bytes.data(), &nan_bits, 2);
  dequantize(GgmlType::kF16, std::span(bytes).first(2), std::span(out).first(1));
  EXPECT_TRUE(std::isnan(out[0]));
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x7F80, 0x0001, 0x8000};
  std::memcpy(bytes.data(), bf16.data(), 10);
  dequantize(GgmlType::kBF16, std::span(bytes).first(10), std::span(out).first(5));
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(double(out[i]), ref_bf16(bf16[i])) << i;
}

// Packs logical Q4_K values (8 six-bit scales and mins, 256 nibbles) the way
// the spec describes and checks that decoding gives d*scale*q - dmin*min.
TEST(GgmlTypes, Q4KFromLogicalValues) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    int scale[8], min[8], q[256];
    for (int s = 0; s < 8; ++s) {
      scale[s] = int(rng() % 64);
      min[s] = int(rng() % 64);
    }
    if (trial == 0) std::fill(scale, scale + 8, 63), std::fill(min, min + 8, 63);
    for (int& v : q) v = int(rng() % 16);
    std::vector<uint8_t> block(144, 0);
    const uint16_t d = random_f16_scale(rng), dmin = random_f16_scale(rng);
    std::memcpy(block.data(), &d, 2);
    std::memcpy(block.data() + 2, &dmin, 2);
    uint8_t* sc = block.data() + 4;
    for (int s = 0; s < 4; ++s) {
      sc[s] = uint8_t(scale[s] | ((scale[s + 4] >> 4) << 6));
      sc[s + 4] = uint8_t(min[s] | ((min[s + 4] >> 4) << 6));
      sc[s + 8] = uint8_t((scale[s + 4] & 15) | ((min[s + 4] & 15) << 4));
    }
    for (int i = 0; i < 256; ++i) block[16 + 32 * (i / 64) + i % 32] |= uint8_t(q[i] << (((i / 32) % 2) * 4));
    std::vector<float> out(256);
    dequantize(GgmlType::kQ4_K, block, out);
    for (int i = 0; i < 256; ++i) {
      const double expected = ref_f16(d) * scale[i / 32] * q[i] - ref_f16(dmin) * min[i / 32];
      ASSERT_NEAR(out[size_t(i)], expected, 4e-7 * (std::fabs(expected) + 1.0)) << "element " << i;
    }
  }
}

// Same for Q6_K: 16 int8 scales, 256 six-bit quants.
TEST(GgmlTypes, Q6KFromLogicalValues) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 20; ++trial) {
    int scale[16], q[256];
    for (int& s : scale) s = int(rng() % 256) - 128;
    for (int& v : q) v = int(rng() % 64);
    std::vector<uint8_t> block(210, 0);
    for (int i = 0; i < 256; ++i) {
      const int half = i / 128, k = (i % 128) / 32, l = i % 32;
      block[size_t(64 * half + l + 32 * (k % 2))] |= uint8_t((q[i] & 15) << (k >= 2 ? 4 : 0));
      block[size_t(128 + 32 * half + l)] |= uint8_t((q[i] >> 4) << (2 * k));
    }
    for (int s = 0; s < 16; ++s) block[size_t(192 + s)] = uint8_t(int8_t(scale[s]));
    const uint16_t d = random_f16_scale(rng);
    std::memcpy(block.data() + 208, &d, 2);
    std::vector<float> out(256);
    dequantize(GgmlType::kQ6_K, block, out);
    for (int i = 0; i < 256; ++i) {
      const double expected = ref_f16(d) * scale[i / 16] * (q[i] - 32);
      ASSERT_NEAR(out[size_t(i)], expected, 4e-7 * (std::fabs(expected) + 1.0)) << "element " << i;
    }
  }
}

std::vector<float> random_values(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

TEST(GgmlTypes, QuantizeQ8_0ErrorWithinHalfScale) {
  std::mt19937 rng(11);
  for (float scale : {2e-2f, 1.f, 300.f}) {
    auto x = random_values(rng, 32 * 64, scale);
    std::fill(x.begin() + 64, x.begin() + 96, 0.f);  // an all-zero block
    x[200] = -x[200] * 50;                           // an outlier
    const auto bytes = quantize(GgmlType::kQ8_0, x);
    ASSERT_EQ(bytes.size(), 64u * 34);
    std::vector<float> y(x.size());
    dequantize(GgmlType::kQ8_0, bytes, y);
    for (size_t blk = 0; blk < 64; ++blk) {
      const uint8_t* b = bytes.data() + 34 * blk;
      const double d = ref_f16(read_u16(b));
      double amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, double(std::fabs(x[32 * blk + i])));
      // d is amax / 127 rounded to f16.
      EXPECT_NEAR(d, amax / 127, amax / 127 * std::ldexp(1.0, -11)) << "block " << blk;
      for (int i = 0; i < 32; ++i) {
        const size_t k = 32 * blk + size_t(i);
        EXPECT_LE(std::fabs(double(y[k]) - x[k]), d / 2 * (1 + 1e-6) + 1e-30) << "element " << k;
        EXPECT_LE(std::abs(int(int8_t(b[2 + i]))), 127);
      }
    }
    for (int i = 64; i < 96; ++i) EXPECT_EQ(y[size_t(i)], 0.f);
  }
}

TEST(GgmlTypes, QuantizeQ4_0ErrorBound) {
  std::mt19937 rng(12);
  auto x = random_values(rng, 32 * 40, 2.f);
  const auto bytes = quantize(GgmlType::kQ4_0, x);
  std::vector<float> y(x.size());
  dequantize(GgmlType::kQ4_0, bytes, y);
  for (size_t blk = 0; blk < 40; ++blk) {
    const double d = std::fabs(ref_f16(read_u16(bytes.data() + 18 * blk)));
    int idx_max = 0;
    for (int i = 0; i < 32; ++i)
      if (std::fabs(x[32 * blk + i]) > std::fabs(x[32 * blk + idx_max])) idx_max = i;
    const double max = x[32 * blk + idx_max];
    EXPECT_NEAR(d, std::fabs(max) / 8, std::fabs(max) / 8 * std::ldexp(1.0, -11));
    // The largest magnitude maps to q = 0 (exact up to d's rounding); the
    // others are within d/2, except values near -max, clamped to q = 15 (error <= d).
    EXPECT_NEAR(y[32 * blk + idx_max], max, 8 * d * std::ldexp(1.0, -11) + 1e-6);
    for (int i = 0; i < 32; ++i) {
      const size_t k = 32 * blk + size_t(i);
      const bool clamped = x[k] * max < 0 && std::fabs(x[k]) > 7.5 * d;
      EXPECT_LE(std::fabs(double(y[k]) - x[k]), (clamped ? d : d / 2) * (1 + 1e-5)) << "element " << k;
    }
  }
}

TEST(GgmlTypes, QuantizePlainTypesMatchDtypeConversions) {
  std::mt19937 rng(13);
  const auto x = random_values(rng, 100, 10.f);
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

TEST(GgmlTypes, ArgumentErrors) {
  std::vector<float> out(32);
  std::vector<uint8_t> bytes(34);
  expect_error([&] { dequantize(GgmlType::kQ8_0, std::span(bytes).first(33), out); }, ErrorCode::kInvalidArgument,
               {"q8_0", "34", "33"});
  expect_error([&] { dequantize(GgmlType::kQ8_0, bytes, std::span(out).first(31)); }, ErrorCode::kInvalidArgument,
               {"q8_0"});
  expect_error([&] { dequantize(GgmlType::kQ8_K, bytes, out); }, ErrorCode::kUnsupported, {"q8_k"});
  expect_error([&] { dequantize(GgmlType::kI32, bytes, out); }, ErrorCode::kUnsupported, {"i32"});
  expect_error([&] { quantize(GgmlType::kQ4_K, std::vector<float>(256)); }, ErrorCode::kUnsupported, {"q4_k"});
  expect_error([&] { quantize(GgmlType::kQ8_0, std::vector<float>(31)); }, ErrorCode::kInvalidArgument, {"q8_0"});
  std::vector<float> bad(32, 1.f);
  bad[5] = NAN;
  expect_error([&] { quantize(GgmlType::kQ8_0, bad); }, ErrorCode::kInvalidArgument, {"element 5"});
  bad[5] = 1e30f;
  expect_error([&] { quantize(GgmlType::kQ4_0, bad); }, ErrorCode::kInvalidArgument, {"element 5"});
  expect_error([&] { ggml_type_info(static_cast<GgmlType>(4)); }, ErrorCode::kInvalidArgument, {"4"});
  // Empty inputs are fine.
  dequantize(GgmlType::kQ4_0, {}, {});
  EXPECT_TRUE(quantize(GgmlType::kQ8_0, {}).empty());
}

}  // namespace
}  // namespace longctx
