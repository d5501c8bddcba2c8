#include "longctx/core/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_seed.h"

namespace longctx {
namespace {

// CRC32C bit by bit, straight from the definition (reflected polynomial
// 0x82F63B78, initial value and final xor 0xFFFFFFFF).
uint32_t reference_crc32c(const unsigned char* data, size_t n) {
  uint32_t crc = 0xFFFFFFFF;
  for (size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) != 0 ? (crc >> 1) ^ 0x82F63B78 : crc >> 1;
  }
  return crc ^ 0xFFFFFFFF;
}

using Crc32cFunction = uint32_t (*)(const void*, size_t, uint32_t);

struct Implementation {
  const char* name;
  Crc32cFunction function;
};

std::vector<Implementation> implementations() {
  std::vector<Implementation> list = {{"crc32c", [](const void* d, size_t n, uint32_t c) { return crc32c(d, n, c); }},
                                      {"table", detail::crc32c_table}};
  if (detail::crc32c_sse42_available()) list.push_back({"sse4.2", detail::crc32c_sse42});
  return list;
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the classic check value.
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<unsigned char>(i);
    descending[i] = static_cast<unsigned char>(31 - i);
  }
  for (const Implementation& impl : implementations()) {
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.function("", 0, 0), 0u);
    EXPECT_EQ(impl.function("123456789", 9, 0), 0xE3069283u);
    EXPECT_EQ(impl.function(zeros.data(), 32, 0), 0x8A9136AAu);
    EXPECT_EQ(impl.function(ones.data(), 32, 0), 0x62A8AB43u);
    EXPECT_EQ(impl.function(ascending.data(), 32, 0), 0x46DD794Eu);
    EXPECT_EQ(impl.function(descending.data(), 32, 0), 0x113FDB5Cu);
  }
}

TEST(Crc32c, ThisMachineHasSse42) {
  if (!__builtin_cpu_supports("sse4.2")) GTEST_SKIP() << "no SSE4.2 on this CPU";
  EXPECT_TRUE(detail::crc32c_sse42_available());
}

// Random buffers of random lengths at every alignment: every implementation
// equals the bitwise reference, and extending a CRC piece by piece equals
// the one-shot CRC.
TEST(Crc32c, RandomBuffersAllImplementationsAgree) {
  std::mt19937 rng(test_seed(2024));
  std::vector<unsigned char> storage(5000 + 16);
  for (auto& b : storage) b = static_cast<unsigned char>(rng());
  const std::vector<Implementation> impls = implementations();
  for (int trial = 0; trial < 600; ++trial) {
    const size_t offset = static_cast<size_t>(trial % 16);
    const size_t n = trial < 100 ? static_cast<size_t>(trial) : rng() % 5000;
    const unsigned char* data = storage.data() + offset;
    const uint32_t expected = reference_crc32c(data, n);
    const size_t split1 = n == 0 ? 0 : rng() % (n + 1);
    const size_t split2 = split1 + (n == split1 ? 0 : rng() % (n - split1 + 1));
    for (const Implementation& impl : impls) {
      ASSERT_EQ(impl.function(data, n, 0), expected) << impl.name << " n=" << n << " offset=" << offset;
      uint32_t crc = impl.function(data, split1, 0);
      crc = impl.function(data + split1, split2 - split1, crc);
      crc = impl.function(data + split2, n - split2, crc);
      ASSERT_EQ(crc, expected) << impl.name << " incremental at " << split1 << ", " << split2 << " of " << n;
    }
  }
}

TEST(Crc32c, DetectsSingleBitFlips) {
  std::vector<unsigned char> data(257);
  std::mt19937 rng(test_seed(3));
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const uint32_t original = crc32c(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; bit += 7) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(crc32c(data.data(), data.size()), original) << "bit " << bit;
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace longctx
