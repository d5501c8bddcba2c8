// Helpers shared by the GGUF tests: byte patching and error expectations
// (reference decoders and random blocks come from core/ggml_test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/ggml_test_util.h"
#include "longctx/core/error.h"
#include "longctx/core/ggml_types.h"

namespace longctx::model::testing {

using namespace longctx::testing;

// The offset of the only occurrence of `needle` in `bytes` (fails the test
// when it occurs zero or several times).
inline size_t find_unique(const std::vector<uint8_t>& bytes, std::string_view needle) {
  size_t found = std::string::npos;
  int count = 0;
  for (size_t i = 0; i + needle.size() <= bytes.size(); ++i) {
    if (std::memcmp(bytes.data() + i, needle.data(), needle.size()) == 0) {
      found = i;
      ++count;
    }
  }
  EXPECT_EQ(count, 1) << "'" << needle << "' occurs " << count << " times";
  return found;
}

template <typename T>
void patch(std::vector<uint8_t>& bytes, size_t at, T value) {
  ASSERT_LE(at + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

template <typename T>
T peek(const std::vector<uint8_t>& bytes, size_t at) {
  T value{};
  EXPECT_LE(at + sizeof(T), bytes.size());
  if (at + sizeof(T) <= bytes.size()) std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

}  // namespace longctx::model::testing
