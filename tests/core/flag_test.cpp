// Command-line values (core/flag.h): the whole text or an error naming the
// flag, the range and the text.
#include "longctx/core/flag.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "error_message.h"

namespace longctx {
namespace {

std::string int_error(const std::string& text, int64_t lo, int64_t hi) {
  return error_message([&] { parse_int_flag("--n", text, lo, hi); });
}

std::string number_error(const std::string& text, double lo, double hi) {
  return error_message([&] { parse_number_flag("--x", text, lo, hi); });
}

TEST(Flag, IntegersInRangeAreTakenWhole) {
  EXPECT_EQ(parse_int_flag("--n", "0", 0, 10), 0);
  EXPECT_EQ(parse_int_flag("--n", "10", 0, 10), 10);
  EXPECT_EQ(parse_int_flag("--n", "-3", -5, 5), -3);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(parse_int_flag("--n", "9223372036854775807", 0, kMax), kMax);
}

TEST(Flag, BadIntegersNameTheFlagTheRangeAndTheText) {
  EXPECT_EQ(int_error("abc", 1, 100), "--n: expected an integer in [1, 100], got 'abc'");
  EXPECT_EQ(int_error("", 1, 100), "--n: expected an integer in [1, 100], got ''");
  EXPECT_EQ(int_error("12x", 1, 100), "--n: expected an integer in [1, 100], got '12x'");
  EXPECT_EQ(int_error(" 12", 1, 100), "--n: expected an integer in [1, 100], got ' 12'");
  EXPECT_EQ(int_error("+12", 1, 100), "--n: expected an integer in [1, 100], got '+12'");
  EXPECT_EQ(int_error("1.5", 1, 100), "--n: expected an integer in [1, 100], got '1.5'");
  EXPECT_EQ(int_error("0", 1, 100), "--n: expected an integer in [1, 100], got '0'");
  EXPECT_EQ(int_error("101", 1, 100), "--n: expected an integer in [1, 100], got '101'");
  // Past int64: out of range, not wrapped.
  EXPECT_EQ(int_error("99999999999999999999", 1, 100),
            "--n: expected an integer in [1, 100], got '99999999999999999999'");
  // No upper bound: only the lower one is named.
  EXPECT_EQ(int_error("-1", 0, std::numeric_limits<int64_t>::max()), "--n: expected an integer >= 0, got '-1'");
}

TEST(Flag, NumbersInRangeAreTakenWhole) {
  EXPECT_EQ(parse_number_flag("--x", "0.25", 0, 1), 0.25);
  EXPECT_EQ(parse_number_flag("--x", "1", 0, 1), 1.0);
  EXPECT_EQ(parse_number_flag("--x", "1e3", 0, 1e4), 1000.0);
  EXPECT_EQ(parse_number_flag("--x", "-2", -2, 0), -2.0);
}

TEST(Flag, BadNumbersNameTheFlagTheRangeAndTheText) {
  EXPECT_EQ(number_error("abc", 0, 1), "--x: expected a number in [0, 1], got 'abc'");
  EXPECT_EQ(number_error("", 0, 1), "--x: expected a number in [0, 1], got ''");
  EXPECT_EQ(number_error("0.5x", 0, 1), "--x: expected a number in [0, 1], got '0.5x'");
  EXPECT_EQ(number_error(" 0.5", 0, 1), "--x: expected a number in [0, 1], got ' 0.5'");
  EXPECT_EQ(number_error("1.01", 0, 1), "--x: expected a number in [0, 1], got '1.01'");
  EXPECT_EQ(number_error("nan", 0, 1), "--x: expected a number in [0, 1], got 'nan'");
  EXPECT_EQ(number_error("inf", 0, 1), "--x: expected a number in [0, 1], got 'inf'");
  EXPECT_EQ(number_error("-1", 0, INFINITY), "--x: expected a number >= 0, got '-1'");
  EXPECT_EQ(number_error("nan", 0, INFINITY), "--x: expected a number >= 0, got 'nan'");
}

}  // namespace
}  // namespace longctx
