// Command-line values, checked: what the flag parsers of the apps, the tools
// and longctx-bench use. Each takes the whole of `text`, or throws
// Error(kInvalidArgument) naming `flag` ("--port", "kernels: --reps"), the
// range and the text.
#pragma once

#include <cstdint>
#include <string>

namespace longctx {

// A decimal integer in [lo, hi].
int64_t parse_int_flag(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);

// A number in [lo, hi] (strtod's syntax, no leading space); NaN never is.
double parse_number_flag(const std::string& flag, const std::string& text, double lo, double hi);

}  // namespace longctx
