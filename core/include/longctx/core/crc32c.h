// CRC32C (Castagnoli), as used by iSCSI/ext4: hardware SSE4.2 when present,
// table-driven otherwise. crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace longctx {

// Extends `crc` (0 for a fresh checksum) with n bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

namespace detail {
// The two implementations behind crc32c(), exposed so tests can compare them.
uint32_t crc32c_table(const void* data, size_t n, uint32_t crc);
bool crc32c_sse42_available();
// Only call when crc32c_sse42_available().
uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc);
}  // namespace detail

}  // namespace longctx
