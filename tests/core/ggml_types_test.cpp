// GGML types: the size table against the spec's field lists, ggml_bytes
// edge cases, dequantize() against the per-element reference decoders of
// ggml_test_util.h (plus "pack logical values, decode, compare" checks for
// the k-quants). quantize(): ggml_quantize_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <tuple>

#include "core/ggml_test_util.h"
#include "longctx/core/dtype.h"
#include "longctx/core/ggml_types.h"
#include "test_seed.h"

namespace longctx {
namespace {

using namespace longctx::testing;

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
  std::mt19937 rng(test_seed(7));
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

// Packs logical Q4_K / Q5_K values (8 six-bit scales and mins, 256 four- or
// five-bit quants) the way the spec describes and checks that decoding gives
// d*scale*q - dmin*min.
TEST(GgmlTypes, Q4KAndQ5KFromLogicalValues) {
  std::mt19937 rng(test_seed(3));
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ5_K}) {
    SCOPED_TRACE(ggml_type_info(type).name);
    const bool five = type == GgmlType::kQ5_K;
    for (int trial = 0; trial < 20; ++trial) {
      int scale[8], min[8], q[256];
      for (int s = 0; s < 8; ++s) {
        scale[s] = int(rng() % 64);
        min[s] = int(rng() % 64);
      }
      if (trial == 0) std::fill(scale, scale + 8, 63), std::fill(min, min + 8, 63);
      for (int& v : q) v = int(rng() % (five ? 32 : 16));
      std::vector<uint8_t> block(size_t(ggml_type_info(type).block_bytes), 0);
      const uint16_t d = random_f16_scale(rng), dmin = random_f16_scale(rng);
      std::memcpy(block.data(), &d, 2);
      std::memcpy(block.data() + 2, &dmin, 2);
      uint8_t* sc = block.data() + 4;
      for (int s = 0; s < 4; ++s) {
        sc[s] = uint8_t(scale[s] | ((scale[s + 4] >> 4) << 6));
        sc[s + 4] = uint8_t(min[s] | ((min[s + 4] >> 4) << 6));
        sc[s + 8] = uint8_t((scale[s + 4] & 15) | ((min[s + 4] & 15) << 4));
      }
      uint8_t* qh = block.data() + 16;  // Q5_K only
      uint8_t* qs = block.data() + (five ? 48 : 16);
      for (int i = 0; i < 256; ++i) {
        qs[32 * (i / 64) + i % 32] |= uint8_t((q[i] & 15) << (((i / 32) % 2) * 4));
        if (five) qh[i % 32] |= uint8_t((q[i] >> 4) << (i / 32));
      }
      std::vector<float> out(256);
      dequantize(type, block, out);
      for (int i = 0; i < 256; ++i) {
        const double expected = ref_f16(d) * scale[i / 32] * q[i] - ref_f16(dmin) * min[i / 32];
        ASSERT_NEAR(out[size_t(i)], expected, 4e-7 * (std::fabs(expected) + 1.0)) << "element " << i;
      }
    }
  }
}

// Same for Q6_K: 16 int8 scales, 256 six-bit quants.
TEST(GgmlTypes, Q6KFromLogicalValues) {
  std::mt19937 rng(test_seed(4));
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

// A Q2_K and a Q3_K block written by llama.cpp b4747 (quantize_row_q2_K_ref,
// quantize_row_q3_K_ref of 256 values x_i = (i * 37 % 101 - 45) / 4 / (1 + i
// / 16 % 5)) and the values its dequantize_row_q2_K / _q3_K read from them:
// the layouts as ggml writes them, not as this project's decoders and
// reference read them.
constexpr uint8_t kQ2KBytes[] = {
    0xee, 0x77, 0x44, 0x34, 0x33, 0xee, 0x88, 0x45, 0x44, 0x22, 0xee, 0x87, 0x54, 0x44, 0x23, 0xff,
    0x1c, 0xb1, 0xc6, 0x6c, 0xb1, 0x1b, 0x6c, 0x86, 0x1b, 0x61, 0xc6, 0x5c, 0xb1, 0xdb, 0x6c, 0xb2,
    0x17, 0x6d, 0x86, 0x1b, 0x71, 0xc6, 0x28, 0xb1, 0xd7, 0x68, 0xb2, 0x1b, 0x6d, 0x86, 0x1b, 0x71,
    0x1b, 0x7d, 0x86, 0x2b, 0x71, 0x96, 0x2c, 0xb1, 0xdb, 0x7d, 0x86, 0x1b, 0x71, 0x86, 0x28, 0x71,
    0xdb, 0x6c, 0xb6, 0x1b, 0x6c, 0x86, 0x1b, 0x61, 0xc7, 0x6c, 0xb1, 0xdb, 0x6c, 0xb6, 0x1b, 0x6c,
    0xd6, 0x37, 0x54, 0x39,
};
constexpr float kQ2KValues[] = {
    -9.32421875f, -2.46777344f, 4.38867188f, -9.32421875f, -2.46777344f, 11.2451172f, -9.32421875f, 4.38867188f,
    11.2451172f, -2.46777344f, 4.38867188f, -9.32421875f, -2.46777344f, 11.2451172f, -9.32421875f, 4.38867188f,
    5.62255859f, -1.23388672f, 2.19433594f, 5.62255859f, -1.23388672f, 2.19433594f, -4.66210938f, -1.23388672f,
    5.62255859f, -4.66210938f, 2.19433594f, 5.62255859f, -1.23388672f, 2.19433594f, 5.62255859f, -1.23388672f,
    3.21289062f, -2.6640625f, -0.705078125f, 3.21289062f, -2.6640625f, 1.25390625f, 3.21289062f, -0.705078125f,
    1.25390625f, -2.6640625f, -0.705078125f, 3.21289062f, -2.6640625f, 1.25390625f, 3.21289062f, -2.6640625f,
    -0.0390625f, 3.87890625f, -0.0390625f, 1.91992188f, -1.99804688f, -0.0390625f, 1.91992188f, -1.99804688f,
    -0.0390625f, 1.91992188f, -1.99804688f, 1.91992188f, 3.87890625f, -0.0390625f, 1.91992188f, -1.99804688f,
    -0.528808594f, 2.40966797f, -1.99804688f, 0.940429688f, 2.40966797f, -0.528808594f, 0.940429688f, -1.99804688f,
    -0.528808594f, 0.940429688f, -1.99804688f, -0.528808594f, 2.40966797f, -0.528808594f, 0.940429688f, 2.40966797f,
    -2.46777344f, 4.38867188f, -9.32421875f, -2.46777344f, 11.2451172f, -9.32421875f, 4.38867188f, 11.2451172f,
    -2.46777344f, 4.38867188f, 11.2451172f, -2.46777344f, 4.38867188f, -9.32421875f, -2.46777344f, 11.2451172f,
    -5.328125f, 2.5078125f, 6.42578125f, -1.41015625f, 2.5078125f, -5.328125f, -1.41015625f, 2.5078125f,
    -5.328125f, -1.41015625f, 6.42578125f, -1.41015625f, 2.5078125f, 6.42578125f, -1.41015625f, 2.5078125f,
    -2.6640625f, -0.215332031f, 2.23339844f, -2.6640625f, -0.215332031f, 4.68212891f, -2.6640625f, 2.23339844f,
    4.68212891f, -0.215332031f, 2.23339844f, -2.6640625f, -0.215332031f, 2.23339844f, -2.6640625f, -0.215332031f,
    3.21289062f, -0.705078125f, 1.25390625f, 3.21289062f, -0.705078125f, 1.25390625f, -2.6640625f, -0.705078125f,
    3.21289062f, -0.705078125f, 1.25390625f, 3.21289062f, -0.705078125f, 1.25390625f, -2.6640625f, -0.705078125f,
    1.60644531f, -1.33203125f, 0.626953125f, 1.60644531f, -1.33203125f, 0.626953125f, 1.60644531f, -0.352539062f,
    1.60644531f, -1.33203125f, -0.352539062f, 1.60644531f, -1.33203125f, 0.626953125f, 1.60644531f, -1.33203125f,
    4.38867188f, 11.2451172f, -2.46777344f, 4.38867188f, -9.32421875f, -2.46777344f, 11.2451172f, -9.32421875f,
    4.38867188f, 11.2451172f, -2.46777344f, 4.38867188f, -9.32421875f, -2.46777344f, 4.38867188f, -9.32421875f,
    1.52832031f, 4.95654297f, -1.89990234f, 1.52832031f, 4.95654297f, -1.89990234f, 1.52832031f, -5.328125f,
    -1.89990234f, 4.95654297f, -5.328125f, 1.52832031f, 4.95654297f, -1.89990234f, 1.52832031f, 4.95654297f,
    -1.37109375f, 2.546875f, -3.33007812f, 0.587890625f, 2.546875f, -1.37109375f, 0.587890625f, 2.546875f,
    -1.37109375f, 2.546875f, -3.33007812f, -1.37109375f, 2.546875f, -3.33007812f, 0.587890625f, 2.546875f,
    -0.705078125f, 1.25390625f, 3.21289062f, -0.705078125f, 1.25390625f, -2.6640625f, -0.705078125f, 1.25390625f,
    -2.6640625f, 1.25390625f, 3.21289062f, -0.705078125f, 1.25390625f, 3.21289062f, -0.705078125f, 1.25390625f,
    -1.33203125f, 0.137207031f, 1.60644531f, -1.33203125f, 0.137207031f, 1.60644531f, -1.33203125f, 1.60644531f,
    3.07568359f, 0.137207031f, 1.60644531f, -1.33203125f, 0.137207031f, 1.60644531f, -1.33203125f, 0.137207031f,
    12.0483398f, -2.64404297f, 4.70214844f, -9.99023438f, -2.64404297f, 4.70214844f, -9.99023438f, -2.64404297f,
    12.0483398f, -2.64404297f, 4.70214844f, 12.0483398f, -2.64404297f, 4.70214844f, -9.99023438f, -2.64404297f,
};
constexpr uint8_t kQ3KBytes[] = {
    0xcd, 0x93, 0x66, 0xc9, 0x33, 0x6c, 0x99, 0x36, 0x4c, 0x9b, 0x66, 0xcd, 0xb3, 0x66, 0xd9, 0x33,
    0x6c, 0x99, 0x36, 0xcc, 0x9b, 0x66, 0xcd, 0xb3, 0x64, 0xd9, 0x32, 0x6c, 0x99, 0x26, 0xcc, 0x93,
    0x8b, 0xdd, 0x22, 0x77, 0xc8, 0xdd, 0x62, 0xb7, 0xd8, 0x2d, 0x72, 0x8b, 0xdc, 0x22, 0x76, 0x88,
    0xdd, 0x22, 0xb7, 0x88, 0x2d, 0x62, 0x8b, 0xd8, 0x2d, 0x76, 0x87, 0xdd, 0x21, 0x77, 0x88, 0xdd,
    0xdd, 0x21, 0x77, 0x88, 0xdd, 0x22, 0x77, 0xc8, 0x1d, 0x76, 0xb7, 0xdc, 0x2d, 0x76, 0x8b, 0xd8,
    0x22, 0x77, 0x88, 0xdd, 0x22, 0xb7, 0xc8, 0x2d, 0x62, 0x8b, 0xd8, 0x21, 0x76, 0x8b, 0xdd, 0x22,
    0x82, 0xa0, 0x06, 0x08, 0x6a, 0x81, 0xa1, 0x26, 0x54, 0x51, 0x45, 0x15, 0xd5, 0x2e,
};
constexpr float kQ3KValues[] = {
    -9.60754395f, -3.20251465f, 6.4050293f, -9.60754395f, 0.f, 9.60754395f, -6.4050293f, 3.20251465f,
    12.8100586f, -3.20251465f, 6.4050293f, -9.60754395f, 0.f, 6.4050293f, -6.4050293f, 0.f,
    5.12402344f, -3.41601562f, 1.70800781f, 6.83203125f, -1.70800781f, 3.41601562f, -5.12402344f, 0.f,
    5.12402344f, -3.41601562f, 1.70800781f, 5.12402344f, -1.70800781f, 1.70800781f, 6.83203125f, -1.70800781f,
    2.13500977f, -3.20251465f, 0.f, 3.20251465f, -2.13500977f, 1.06750488f, 4.27001953f, -1.06750488f,
    2.13500977f, -3.20251465f, 0.f, 2.13500977f, -3.20251465f, 0.f, 3.20251465f, -2.13500977f,
    0.854003906f, 3.41601562f, -0.854003906f, 1.70800781f, -2.56201172f, 0.f, 1.70800781f, -1.70800781f,
    0.854003906f, 2.56201172f, -0.854003906f, 0.854003906f, 3.41601562f, -0.854003906f, 1.70800781f, -2.56201172f,
    0.f, 1.92150879f, -1.28100586f, 0.64050293f, 2.56201172f, -0.64050293f, 1.28100586f, -1.92150879f,
    -0.64050293f, 1.28100586f, -1.92150879f, 0.f, 1.92150879f, -1.28100586f, 0.64050293f, 2.56201172f,
    -3.30926514f, 6.61853027f, -9.92779541f, 0.f, 6.61853027f, -6.61853027f, 0.f, 9.92779541f,
    -6.61853027f, 3.30926514f, 13.2370605f, -3.30926514f, 6.61853027f, -9.92779541f, 0.f, 9.92779541f,
    -3.20251465f, 1.60125732f, 6.4050293f, -1.60125732f, 1.60125732f, -4.80377197f, -1.60125732f, 3.20251465f,
    -4.80377197f, 0.f, 4.80377197f, -3.20251465f, 1.60125732f, 6.4050293f, -1.60125732f, 3.20251465f,
    -3.20251465f, 0.f, 2.13500977f, -2.13500977f, 0.f, 3.20251465f, -2.13500977f, 1.06750488f,
    4.27001953f, -1.06750488f, 2.13500977f, -3.20251465f, 0.f, 3.20251465f, -2.13500977f, 1.06750488f,
    2.56201172f, -0.854003906f, 0.854003906f, 3.41601562f, -0.854003906f, 1.70800781f, -2.56201172f, 0.f,
    2.56201172f, -1.70800781f, 0.854003906f, 3.41601562f, -0.854003906f, 1.70800781f, -2.56201172f, 0.f,
    1.28100586f, -1.92150879f, 0.f, 1.92150879f, -1.28100586f, 0.64050293f, 2.56201172f, -0.64050293f,
    1.28100586f, -1.92150879f, 0.f, 1.92150879f, -1.28100586f, 0.64050293f, 1.92150879f, -1.28100586f,
    3.41601562f, 13.6640625f, -3.41601562f, 6.83203125f, -10.2480469f, 0.f, 10.2480469f, -6.83203125f,
    3.41601562f, 10.2480469f, -3.41601562f, 3.41601562f, -10.2480469f, -3.41601562f, 6.83203125f, -6.83203125f,
    0.f, 5.12402344f, -3.41601562f, 1.70800781f, 6.83203125f, -1.70800781f, 3.41601562f, -5.12402344f,
    0.f, 3.41601562f, -3.41601562f, 0.f, 5.12402344f, -3.41601562f, 1.70800781f, 6.83203125f,
    -1.06750488f, 2.13500977f, -3.20251465f, 0.f, 3.20251465f, -2.13500977f, 1.06750488f, 4.27001953f,
    -1.06750488f, 1.06750488f, -3.20251465f, -1.06750488f, 2.13500977f, -3.20251465f, 0.f, 3.20251465f,
    -1.70800781f, 0.854003906f, 3.41601562f, -0.854003906f, 1.70800781f, -2.56201172f, 0.f, 1.70800781f,
    -1.70800781f, 0.f, 2.56201172f, -1.70800781f, 0.854003906f, 3.41601562f, -0.854003906f, 1.70800781f,
    -1.92150879f, 0.f, 1.92150879f, -1.28100586f, 0.64050293f, 2.56201172f, -0.64050293f, 0.64050293f,
    2.56201172f, -0.64050293f, 1.28100586f, -1.92150879f, 0.f, 1.92150879f, -1.28100586f, 0.64050293f,
    12.8100586f, -3.20251465f, 6.4050293f, -9.60754395f, 0.f, 6.4050293f, -9.60754395f, 0.f,
    9.60754395f, -6.4050293f, 3.20251465f, 12.8100586f, -3.20251465f, 6.4050293f, -9.60754395f, 0.f,
};

TEST(GgmlTypes, Q2KAndQ3KReadAsLlamaCppReadsThem) {
  using Golden = std::tuple<GgmlType, std::span<const uint8_t>, const float*>;
  for (const auto& [type, bytes, values] :
       {Golden{GgmlType::kQ2_K, kQ2KBytes, kQ2KValues}, Golden{GgmlType::kQ3_K, kQ3KBytes, kQ3KValues}}) {
    SCOPED_TRACE(ggml_type_info(type).name);
    std::vector<float> out(256);
    dequantize(type, bytes, out);
    int nonzero = 0;
    for (int i = 0; i < 256; ++i) {
      // ggml may fuse d * scale * q - dmin * min into an FMA: one rounding apart.
      EXPECT_NEAR(out[size_t(i)], values[i], 2e-7 * std::fabs(values[i])) << "element " << i;
      EXPECT_EQ(out[size_t(i)], static_cast<float>(ref_element(type, bytes.data(), i))) << "element " << i;
      nonzero += values[i] != 0;
    }
    EXPECT_GT(nonzero, 200);
  }
}

TEST(GgmlTypes, DequantizeArgumentErrors) {
  std::vector<float> out(32);
  std::vector<uint8_t> bytes(34);
  expect_error([&] { dequantize(GgmlType::kQ8_0, std::span(bytes).first(33), out); }, ErrorCode::kInvalidArgument,
               {"q8_0", "34", "33"});
  expect_error([&] { dequantize(GgmlType::kQ8_0, bytes, std::span(out).first(31)); }, ErrorCode::kInvalidArgument,
               {"q8_0"});
  expect_error([&] { dequantize(GgmlType::kQ8_K, bytes, out); }, ErrorCode::kUnsupported, {"q8_k"});
  expect_error([&] { dequantize(GgmlType::kI32, bytes, out); }, ErrorCode::kUnsupported, {"i32"});
  expect_error([&] { ggml_type_info(static_cast<GgmlType>(4)); }, ErrorCode::kInvalidArgument, {"4"});
  dequantize(GgmlType::kQ4_0, {}, {});  // empty input is fine
}

}  // namespace
}  // namespace longctx
