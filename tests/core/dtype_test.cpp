// Conversions f32 <-> f16 / bf16 against a reference that computes values
// from the bit fields in double and rounds by searching the neighbours.
#include "longctx/core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hwy/targets.h"
#include "hwy_target.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx {
namespace {

// A 16-bit IEEE-style format, described by its field widths only.
struct Format16 {
  const char* name;
  int exponent_bits;  // f16: 5, bf16: 8
  int mantissa_bits;  // f16: 10, bf16: 7
  uint16_t (*narrow)(float);
  float (*widen)(uint16_t);

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int max_exponent_field() const { return (1 << exponent_bits) - 1; }
  // Bits of +Inf; the positive finite codes are 0 .. inf_code() - 1, in increasing value.
  uint16_t inf_code() const { return static_cast<uint16_t>(max_exponent_field() << mantissa_bits); }
  uint16_t quiet_bit() const { return static_cast<uint16_t>(1 << (mantissa_bits - 1)); }
  bool is_nan(uint16_t bits) const { return (bits & 0x7FFF) > inf_code(); }

  // Value of a bit pattern, from sign, exponent and mantissa. An exponent field
  // of all ones with `as_finite` gives 2^(emax+1), the value IEEE rounding
  // treats as the next one after the largest finite number.
  double value(uint16_t bits, bool as_finite = false) const {
    const int exponent = (bits >> mantissa_bits) & max_exponent_field();
    const int mantissa = bits & ((1 << mantissa_bits) - 1);
    double magnitude;
    if (exponent == max_exponent_field() && !as_finite) {
      magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                                : std::numeric_limits<double>::quiet_NaN();
    } else if (exponent == 0) {
      magnitude = std::ldexp(mantissa, 1 - bias() - mantissa_bits);
    } else {
      magnitude = std::ldexp(mantissa + (1 << mantissa_bits), exponent - bias() - mantissa_bits);
    }
    return (bits & 0x8000) != 0 ? -magnitude : magnitude;
  }
};

const Format16 kF16Format{"f16", 5, 10, f32_to_f16_bits, f16_bits_to_f32};
const Format16 kBF16Format{"bf16", 8, 7, f32_to_bf16_bits, bf16_bits_to_f32};

uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }
float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

// Round-to-nearest-even into a Format16, by locating the two representable
// neighbours of |x| in a table of every positive value and comparing x with
// their exact midpoint (exact in double). Not for NaN.
class ReferenceRounder {
 public:
  explicit ReferenceRounder(const Format16& format) : format_(format) {
    for (uint32_t code = 0; code <= format.inf_code(); ++code) {
      values_.push_back(format.value(static_cast<uint16_t>(code), /*as_finite=*/true));
    }
  }

  uint16_t round(double x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double magnitude = std::fabs(x);
    if (magnitude >= values_.back()) return sign | format_.inf_code();
    // values_[low] <= magnitude < values_[low + 1]
    const size_t low = std::upper_bound(values_.begin(), values_.end(), magnitude) - values_.begin() - 1;
    const double midpoint = (values_[low] + values_[low + 1]) / 2;
    size_t code = low;
    if (magnitude > midpoint || (magnitude == midpoint && low % 2 == 1)) code = low + 1;
    return static_cast<uint16_t>(sign | code);
  }

  // Exact value of positive code `code`, inf_code() meaning 2^(emax+1).
  double positive_value(uint16_t code) const { return values_[code]; }

 private:
  const Format16& format_;
  std::vector<double> values_;
};

// Counts mismatches and stops a loop after a few, so that a broken
// conversion does not print 65,536 failures.
class FailureBudget {
 public:
  bool exhausted() const { return failures_ >= 10; }
  void record() { ++failures_; }

 private:
  int failures_ = 0;
};

// --------------------------------------------------------------------------- names

TEST(DtypeNames, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_STREQ(dtype_name(DType::kF32), "f32");
  EXPECT_STREQ(dtype_name(DType::kF16), "f16");
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  try {
    dtype_size(static_cast<DType>(7));
    FAIL() << "invalid dtype accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(DtypeNames, ParseAcceptsEverySpellingInAnyCase) {
  const std::pair<const char*, DType> accepted[] = {
      {"f32", DType::kF32},     {"fp32", DType::kF32},     {"float32", DType::kF32},
      {"F32", DType::kF32},     {"Float32", DType::kF32},  {"FP32", DType::kF32},
      {"f16", DType::kF16},     {"fp16", DType::kF16},     {"float16", DType::kF16},
      {"FP16", DType::kF16},    {"FLOAT16", DType::kF16},  {"bf16", DType::kBF16},
      {"BF16", DType::kBF16},   {"bfloat16", DType::kBF16}, {"BFloat16", DType::kBF16},
  };
  for (const auto& [text, dtype] : accepted) {
    const std::optional<DType> parsed = parse_dtype(text);
    ASSERT_TRUE(parsed.has_value()) << text;
    EXPECT_EQ(*parsed, dtype) << text;
  }
  for (const char* text : {"", "f8", "f64", "float", "half", "bf 16", "f16 ", "bfp16", "fp", "int8"}) {
    EXPECT_FALSE(parse_dtype(text).has_value()) << "'" << text << "'";
  }
}

// --------------------------------------------------------------------------- all patterns

// Widening is exact for all 65,536 patterns, and narrowing the result gives
// the pattern back (a NaN gives a NaN with the same sign and top payload bits).
void check_all_patterns(const Format16& format) {
  FailureBudget budget;
  for (uint32_t i = 0; i <= 0xFFFF && !budget.exhausted(); ++i) {
    const auto bits = static_cast<uint16_t>(i);
    const float wide = format.widen(bits);
    const double expected = format.value(bits);
    const uint16_t back = format.narrow(wide);
    if (format.is_nan(bits)) {
      const bool ok = std::isnan(wide) && std::signbit(wide) == ((bits & 0x8000) != 0) &&
                      back == (bits | format.quiet_bit());
      if (!ok) {
        budget.record();
        ADD_FAILURE() << format.name << " NaN 0x" << std::hex << bits << " widened to 0x"
                      << bits_of(wide) << ", narrowed back to 0x" << back;
      }
      continue;
    }
    const bool ok = static_cast<double>(wide) == expected && std::signbit(wide) == std::signbit(expected) &&
                    back == bits;
    if (!ok) {
      budget.record();
      ADD_FAILURE() << format.name << " 0x" << std::hex << bits << ": widened to " << wide
                    << " (expected " << expected << "), narrowed back to 0x" << back;
    }
  }
}

TEST(DtypeConversion, F16AllPatternsWidenExactlyAndRoundTrip) { check_all_patterns(kF16Format); }
TEST(DtypeConversion, BF16AllPatternsWidenExactlyAndRoundTrip) { check_all_patterns(kBF16Format); }

TEST(DtypeConversion, WidenedNaNs) {
  // f16 NaNs widen to quiet f32 NaNs (like F16C); bf16 widening is a plain shift.
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const auto bits = static_cast<uint16_t>(i);
    if (kF16Format.is_nan(bits)) {
      const uint32_t wide = bits_of(f16_bits_to_f32(bits));
      ASSERT_EQ(wide, (static_cast<uint32_t>(bits & 0x8000) << 16) | 0x7FC00000 | ((bits & 0x3FFu) << 13))
          << std::hex << bits;
    }
    ASSERT_EQ(bits_of(bf16_bits_to_f32(bits)), static_cast<uint32_t>(bits) << 16);
  }
}

// For every pair of consecutive finite values lo < hi of either sign (and the
// largest finite value with 2^(emax+1), where rounding up means Inf): the exact
// midpoint goes to the one with an even mantissa, one f32 ulp below it to lo,
// one above it to hi.
void check_midpoints(const Format16& format) {
  const ReferenceRounder reference(format);
  FailureBudget budget;
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint16_t low = 0; low < format.inf_code() && !budget.exhausted(); ++low) {
      const auto high = static_cast<uint16_t>(low + 1);
      const double midpoint = (reference.positive_value(low) + reference.positive_value(high)) / 2;
      const auto mid = static_cast<float>(sign != 0 ? -midpoint : midpoint);
      ASSERT_EQ(std::fabs(static_cast<double>(mid)), midpoint) << "midpoint not representable in f32";
      const float below = std::nextafter(mid, 0.0f);
      const float above = std::nextafter(mid, std::copysign(std::numeric_limits<float>::infinity(), mid));
      const uint16_t even = low % 2 == 0 ? low : high;
      const struct {
        float input;
        uint16_t expected;
      } cases[] = {{mid, static_cast<uint16_t>(sign | even)},
                   {below, static_cast<uint16_t>(sign | low)},
                   {above, static_cast<uint16_t>(sign | high)}};
      for (const auto& c : cases) {
        const uint16_t got = format.narrow(c.input);
        const uint16_t ref = reference.round(c.input);
        if (got != c.expected || ref != c.expected) {
          budget.record();
          ADD_FAILURE() << format.name << ": f32 0x" << std::hex << bits_of(c.input) << " ("
                        << c.input << ") gave 0x" << got << ", reference 0x" << ref << ", expected 0x"
                        << c.expected;
        }
      }
    }
  }
}

TEST(DtypeConversion, F16MidpointsTieToEvenAndNeighboursRoundToNearest) { check_midpoints(kF16Format); }
TEST(DtypeConversion, BF16MidpointsTieToEvenAndNeighboursRoundToNearest) { check_midpoints(kBF16Format); }

TEST(DtypeConversion, OverflowBoundaries) {
  const float inf = std::numeric_limits<float>::infinity();
  const float max = std::numeric_limits<float>::max();
  // f16: largest finite 65504 (0x7BFF); 65520 is the midpoint to 65536 and overflows.
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(f32_to_f16_bits(65536.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(max), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(-max), 0xFC00);
  EXPECT_EQ(f32_to_f16_bits(inf), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(-inf), 0xFC00);
  // bf16: largest finite 0x7F7F = (2 - 2^-7) * 2^127; the midpoint to 2^128 is f32 0x7F7F8000.
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7F7F0000)), 0x7F7F);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7F7F8000)), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0xFF7F8000)), 0xFF80);
  EXPECT_EQ(f32_to_bf16_bits(max), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(inf), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(-inf), 0xFF80);
}

TEST(DtypeConversion, ZerosSubnormalsAndNaNs) {
  EXPECT_EQ(f32_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(f16_bits_to_f32(0x8000)));
  // f16 subnormals: 2^-24 is the smallest; 2^-25 ties to 0; anything above goes to 2^-24.
  EXPECT_EQ(f32_to_f16_bits(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(0x3p-25f), 0x0002);  // 1.5 units ties to even 2
  EXPECT_EQ(f32_to_f16_bits(0x5p-25f), 0x0002);  // 2.5 units ties to even 2
  EXPECT_EQ(f32_to_f16_bits(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16_bits(0x1.ffcp-15f), 0x0400);  // 1023.5 units round up into the normals
  // f32 subnormals vanish in f16 but not in bf16 (same exponent range as f32).
  EXPECT_EQ(f32_to_f16_bits(float_of(0x00000001)), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(float_of(0x80400000)), 0x8000);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x00400000)), 0x0040);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x00008000)), 0x0000);  // tie to even 0
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x00018000)), 0x0002);  // tie to even 2
  // NaNs stay NaN, become quiet, keep sign and top payload bits; a signalling
  // NaN whose kept bits are all zero must not turn into Inf.
  EXPECT_EQ(f32_to_f16_bits(float_of(0x7F800001)), 0x7E00);
  EXPECT_EQ(f32_to_f16_bits(float_of(0xFF800001)), 0xFE00);
  EXPECT_EQ(f32_to_f16_bits(float_of(0x7FC00000)), 0x7E00);
  EXPECT_EQ(f32_to_f16_bits(float_of(0x7FFFFFFF)), 0x7FFF);
  EXPECT_EQ(f32_to_f16_bits(float_of(0x7F802000)), 0x7E01);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7F800001)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0xFF800001)), 0xFFC0);
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7FFFFFFF)), 0x7FFF);  // rounding must not carry out of a NaN
  EXPECT_EQ(f32_to_bf16_bits(float_of(0x7F810000)), 0x7FC1);
}

// NaN inputs: the result is the quiet NaN with the input's sign and top payload bits.
uint16_t expected_nan(const Format16& format, uint32_t f32_bits) {
  const int dropped = 23 - format.mantissa_bits;
  const uint32_t payload = (f32_bits & 0x7FFFFF) >> dropped;
  return static_cast<uint16_t>(((f32_bits >> 16) & 0x8000) | format.inf_code() | format.quiet_bit() | payload);
}

// A few million f32 patterns: uniform over all bits, and with exponents
// concentrated where the format's values live, against the reference.
void check_random_patterns(const Format16& format, uint32_t seed) {
  const ReferenceRounder reference(format);
  std::mt19937 rng(test_seed(seed));
  std::uniform_int_distribution<uint32_t> any_bits;
  // f32 exponent fields that reach the format's subnormals .. just past its overflow.
  std::uniform_int_distribution<uint32_t> exponent_field(
      static_cast<uint32_t>(std::max(0, 127 - format.bias() - format.mantissa_bits - 2)),
      static_cast<uint32_t>(std::min(254, 127 + format.bias() + 2)));
  FailureBudget budget;
  for (int i = 0; i < 2'000'000 && !budget.exhausted(); ++i) {
    uint32_t bits = any_bits(rng);
    if (i % 2 == 1) bits = (bits & 0x807FFFFF) | (exponent_field(rng) << 23);
    const float input = float_of(bits);
    const uint16_t got = format.narrow(input);
    const uint16_t expected = std::isnan(input) ? expected_nan(format, bits) : reference.round(input);
    if (got != expected) {
      budget.record();
      ADD_FAILURE() << format.name << ": f32 0x" << std::hex << bits << " (" << input << ") gave 0x"
                    << got << ", reference 0x" << expected;
    }
  }
}

TEST(DtypeConversion, F16RandomPatternsMatchReference) { check_random_patterns(kF16Format, 1234); }
TEST(DtypeConversion, BF16RandomPatternsMatchReference) { check_random_patterns(kBF16Format, 5678); }

TEST(DtypeConversion, LoadAndStoreElements) {
  std::vector<unsigned char> buffer(64, 0xAB);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    store_from_f32(buffer.data(), dtype, 3, -1.5f);
    EXPECT_EQ(load_as_f32(buffer.data(), dtype, 3), -1.5f) << dtype_name(dtype);
    store_from_f32(buffer.data(), dtype, 4, 1.0f / 3.0f);  // rounds
    const float third = load_as_f32(buffer.data(), dtype, 4);
    const float expected = dtype == DType::kF32   ? 1.0f / 3.0f
                           : dtype == DType::kF16 ? f16_bits_to_f32(f32_to_f16_bits(1.0f / 3.0f))
                                                  : bf16_bits_to_f32(f32_to_bf16_bits(1.0f / 3.0f));
    EXPECT_EQ(third, expected) << dtype_name(dtype);
  }
  uint16_t element;
  std::memcpy(&element, buffer.data() + 2 * 3, 2);
  EXPECT_EQ(element, f32_to_bf16_bits(-1.5f));  // element 3 of the last (bf16) pass
}

// --------------------------------------------------------------------------- bulk convert

// Runs each Highway target this CPU supports (and Highway's own choice) in
// turn, so every vector path is checked, not only the best one.
using testing::ForcedHighwayTarget;

// f32 inputs that are hard to round: midpoints of consecutive f16 / bf16
// values and their f32 neighbours, values near overflow and underflow, NaN
// payloads, mixed with uniformly random bit patterns.
std::vector<uint32_t> hard_f32_inputs(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<uint32_t> any_bits;
  std::vector<uint32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = any_bits(rng);
    const auto code = static_cast<uint16_t>(r & 0x7FFF);
    const double f16_mid = (kF16Format.value(code, true) + kF16Format.value(static_cast<uint16_t>(code + 1), true)) / 2;
    const double bf16_mid = (kBF16Format.value(code, true) + kBF16Format.value(static_cast<uint16_t>(code + 1), true)) / 2;
    const uint32_t sign = r & 0x80000000u;
    switch (i % 6) {
      case 0: out[i] = r; break;
      case 1: out[i] = sign | (bits_of(static_cast<float>(f16_mid)) + (r >> 16) % 3 - 1); break;
      case 2: out[i] = sign | (bits_of(static_cast<float>(bf16_mid)) + (r >> 16) % 3 - 1); break;
      case 3: out[i] = 0x7F800000 | (r & 0x807FFFFF); break;            // Inf and NaNs
      case 4: out[i] = sign | (0x477FF000 + (r >> 20) % 64 - 32); break;  // around 65520
      default: out[i] = sign | ((r >> 8) & 0x3FFFFFF); break;            // tiny values and subnormals
    }
  }
  return out;
}

std::vector<unsigned char> random_source(DType dtype, size_t n, std::mt19937& rng) {
  std::vector<unsigned char> bytes(n * dtype_size(dtype));
  if (dtype == DType::kF32) {
    const std::vector<uint32_t> values = hard_f32_inputs(n, rng);
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else if (n >= 0x10000) {
    // Every 16-bit pattern once, then random ones.
    for (size_t i = 0; i < n; ++i) {
      const auto bits = static_cast<uint16_t>(i < 0x10000 ? i : rng());
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  } else {
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  }
  return bytes;
}

// convert() of n elements at an odd offset must equal the scalar functions
// element by element (a copy of the bits when the dtypes are equal) and leave
// the bytes around the destination alone.
void check_bulk_convert(DType src_dtype, DType dst_dtype, size_t n, std::mt19937& rng) {
  const size_t dst_size = dtype_size(dst_dtype);
  const std::vector<unsigned char> source = random_source(src_dtype, n + 1, rng);
  const unsigned char* src = source.data() + dtype_size(src_dtype);  // element 1: unaligned

  std::vector<unsigned char> expected(n * dst_size);
  if (src_dtype == dst_dtype) {
    if (n > 0) std::memcpy(expected.data(), src, expected.size());
  } else {
    for (size_t i = 0; i < n; ++i) store_from_f32(expected.data(), dst_dtype, i, load_as_f32(src, src_dtype, i));
  }

  const size_t guard = 3 * dst_size + 1;  // also misaligns the destination
  std::vector<unsigned char> output(n * dst_size + 2 * guard, 0x5A);
  convert(src, src_dtype, output.data() + guard, dst_dtype, n);

  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(output.data() + guard + i * dst_size, expected.data() + i * dst_size, dst_size) != 0) {
      float input = load_as_f32(src, src_dtype, i);
      ADD_FAILURE() << dtype_name(src_dtype) << " -> " << dtype_name(dst_dtype) << ", n = " << n
                    << ": element " << i << " (input f32 0x" << std::hex << bits_of(input)
                    << ") differs from the scalar conversion";
      return;
    }
  }
  for (size_t i = 0; i < guard; ++i) {
    ASSERT_EQ(output[i], 0x5A) << "wrote before the destination";
    ASSERT_EQ(output[guard + n * dst_size + i], 0x5A) << "wrote past the destination";
  }
}

TEST(DtypeConvert, EveryPairEveryTargetMatchesScalar) {
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  targets.push_back(0);  // 0: Highway's own choice
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 67; ++n) lengths.push_back(n);
  for (size_t n : {255, 1001, 0x10000 + 3}) lengths.push_back(n);

  std::mt19937 rng(test_seed(42));
  for (int64_t target : targets) {
    SCOPED_TRACE(target == 0 ? "default dispatch" : hwy::TargetName(target));
    const ForcedHighwayTarget forced(target);
    for (DType src : dtypes) {
      for (DType dst : dtypes) {
        for (size_t n : lengths) check_bulk_convert(src, dst, n, rng);
      }
    }
  }
}

TEST(DtypeConvert, RejectsOverlapNullAndInvalidDtype) {
  std::vector<float> buffer(16, 1.0f);
  // The same buffer and dtype is allowed and leaves it unchanged.
  convert(buffer.data(), DType::kF32, buffer.data(), DType::kF32, buffer.size());
  EXPECT_EQ(buffer[5], 1.0f);
  convert(nullptr, DType::kF16, nullptr, DType::kF32, 0);  // nothing to do

  auto expect_invalid = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << e.what();
    }
  };
  expect_invalid([&] { convert(buffer.data(), DType::kF32, buffer.data(), DType::kF16, 16); }, "in place f32->f16");
  expect_invalid([&] { convert(buffer.data(), DType::kF32, buffer.data() + 4, DType::kF32, 8); }, "overlapping copy");
  expect_invalid([&] { convert(nullptr, DType::kF32, buffer.data(), DType::kF16, 4); }, "null source");
  expect_invalid([&] { convert(buffer.data(), DType::kF32, nullptr, DType::kF16, 4); }, "null destination");
  expect_invalid([&] { convert(buffer.data(), static_cast<DType>(9), buffer.data() + 8, DType::kF32, 1); },
                 "invalid dtype");
}

// Every value past the limit found at every position of a row (whole
// vectors of the widest target and the scalar tail), the first of two
// named, on every Highway target; the sign never counts.
TEST(DtypeMagnitude, FirstAboveTheLimitAtEveryPositionOnEveryTarget) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing::ForcedHighwayTarget forced(target);
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(dtype_name(dtype));
      const size_t n = 75;
      const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> values(n);
      for (size_t i = 0; i < n; ++i) values[i] = (i % 2 ? -1.f : 1.f) * float(i % 7);  // at most 6
      std::vector<uint32_t> bits(n);  // the values in dtype, 2 or 4 bytes each
      const auto in_dtype = [&](const std::vector<float>& x) {
        convert(x.data(), DType::kF32, bits.data(), dtype, n);
        return static_cast<const void*>(bits.data());
      };
      const uint32_t six = dtype == DType::kF32 ? 0x40c00000u : dtype == DType::kF16 ? 0x4600u : 0x40c0u;
      EXPECT_EQ(first_magnitude_above(in_dtype(values), dtype, n, six), -1);
      EXPECT_EQ(first_non_finite(in_dtype(values), dtype, n), -1);
      EXPECT_EQ(first_magnitude_above(in_dtype(values), dtype, n, six - 1), 6);  // the first |x| = 6
      for (size_t at = 0; at < n; ++at) {
        for (const float bad : {nan, inf, -inf}) {
          std::vector<float> x(values);
          x[at] = bad;
          if (at + 3 < n) x[at + 3] = nan;
          ASSERT_EQ(first_non_finite(in_dtype(x), dtype, n), int64_t(at)) << bad;
          const int64_t first_nan_at = std::isnan(bad) ? int64_t(at) : at + 3 < n ? int64_t(at + 3) : -1;
          ASSERT_EQ(first_nan(in_dtype(x), dtype, n), first_nan_at) << bad;  // infinities pass
        }
      }
    }
  }
}

// Values at any byte offset (a snapshot's blocks sit at any offset of its
// file): the same answers as aligned, on every target (a misaligned typed
// load would be undefined behaviour, which the sanitized build reports).
TEST(DtypeMagnitude, ValuesAtAnyByteOffset) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing::ForcedHighwayTarget forced(target);
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(dtype_name(dtype));
      const size_t n = 75, es = dtype_size(dtype);
      std::vector<float> values(n, 1.5f);
      for (size_t at = 0; at < n; at += 7) {
        values[at] = std::numeric_limits<float>::infinity();
        std::vector<uint8_t> packed(n * es);
        convert(values.data(), DType::kF32, packed.data(), dtype, n);
        for (size_t offset = 1; offset < 4; ++offset) {
          std::vector<uint8_t> shifted(offset + packed.size() + 1);
          std::copy(packed.begin(), packed.end(), shifted.begin() + std::ptrdiff_t(offset));
          EXPECT_EQ(first_non_finite(shifted.data() + offset, dtype, n), int64_t(at)) << "offset " << offset;
        }
        values[at] = 1.5f;
      }
    }
  }
}

}  // namespace
}  // namespace longctx
