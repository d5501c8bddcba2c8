#include "longctx/core/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace longctx {
namespace detail {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // Castagnoli, bit-reversed

// kTables[0][b] is the CRC of the single byte b (reflected, no pre/post
// inversion); kTables[k][b] is the same byte followed by k zero bytes, so
// eight bytes can be folded in with eight independent lookups ("slicing by 8").
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) != 0 ? kPolynomial : 0);
    tables[0][b] = crc;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t previous = tables[k - 1][b];
      tables[k][b] = (previous >> 8) ^ tables[0][previous & 0xFF];
    }
  }
  return tables;
}

constexpr Tables kTables = make_tables();

}  // namespace

// Both implementations invert the CRC before and after, so that
// crc32c(b, n2, crc32c(a, n1)) is the CRC of a followed by b.
uint32_t crc32c_table(const void* data, size_t n, uint32_t crc) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  if constexpr (std::endian::native == std::endian::little) {
    for (; n >= 8; n -= 8, bytes += 8) {
      uint64_t word;
      std::memcpy(&word, bytes, 8);
      word ^= crc;
      crc = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^ kTables[5][(word >> 16) & 0xFF] ^
            kTables[4][(word >> 24) & 0xFF] ^ kTables[3][(word >> 32) & 0xFF] ^
            kTables[2][(word >> 40) & 0xFF] ^ kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
    }
  }
  for (; n > 0; --n, ++bytes) crc = kTables[0][(crc ^ *bytes) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)

bool crc32c_sse42_available() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t state = ~crc;
  for (; n >= 8; n -= 8, bytes += 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);  // any alignment
    state = _mm_crc32_u64(state, word);
  }
  auto state32 = static_cast<uint32_t>(state);
  for (; n > 0; --n, ++bytes) state32 = _mm_crc32_u8(state32, *bytes);
  return ~state32;
}

#else  // no SSE4.2 on this architecture: the table does the work

bool crc32c_sse42_available() { return false; }

uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc) { return crc32c_table(data, n, crc); }

#endif

}  // namespace detail

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  if (detail::crc32c_sse42_available()) return detail::crc32c_sse42(data, n, crc);
  return detail::crc32c_table(data, n, crc);
}

}  // namespace longctx
