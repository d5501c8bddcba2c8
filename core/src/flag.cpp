#include "longctx/core/flag.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "longctx/core/error.h"

namespace longctx {

int64_t parse_int_flag(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (!text.empty() && error == std::errc() && stop == end && value >= lo && value <= hi) return value;
  if (hi == std::numeric_limits<int64_t>::max())
    fail(ErrorCode::kInvalidArgument, flag, ": expected an integer >= ", lo, ", got '", text, "'");
  fail(ErrorCode::kInvalidArgument, flag, ": expected an integer in [", lo, ", ", hi, "], got '", text, "'");
}

double parse_number_flag(const std::string& flag, const std::string& text, double lo, double hi) {
  char* stop = nullptr;
  const double value = std::strtod(text.c_str(), &stop);
  const bool whole = !text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) &&
                     stop == text.c_str() + text.size();
  if (whole && value >= lo && value <= hi) return value;  // NaN fails the comparisons
  if (std::isinf(hi)) fail(ErrorCode::kInvalidArgument, flag, ": expected a number >= ", lo, ", got '", text, "'");
  fail(ErrorCode::kInvalidArgument, flag, ": expected a number in [", lo, ", ", hi, "], got '", text, "'");
}

}  // namespace longctx
