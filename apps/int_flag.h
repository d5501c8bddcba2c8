// An integer command-line value, checked: what every app's flag parser uses.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "longctx/core/error.h"

namespace longctx::apps {

// `text` as an integer in [lo, hi]; Error(kInvalidArgument) naming `flag` otherwise.
inline int64_t parse_int_flag(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < lo || value > hi)
    fail(ErrorCode::kInvalidArgument, flag, ": expected an integer in [", lo, ", ", hi, "], got '", text, "'");
  return value;
}

}  // namespace longctx::apps
