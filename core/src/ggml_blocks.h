// Shared by the GGML block decoders (ggml_dequantize.cpp) and encoders
// (ggml_quantize.cpp): little-endian f16 fields and the k-quant block sizes.
#pragma once

#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::detail {

constexpr int kQK = 32;    // elements per block of the Q4_0 .. Q8_1 types
constexpr int kQKK = 256;  // elements per super-block of the k-quants

inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline float load_f16(const uint8_t* p) { return f16_bits_to_f32(load_u16(p)); }
inline void store_f16(uint8_t* p, float value) {
  const uint16_t bits = f32_to_f16_bits(value);
  p[0] = static_cast<uint8_t>(bits);
  p[1] = static_cast<uint8_t>(bits >> 8);
}

// Q4_K and Q5_K keep 8 six-bit scales and 8 six-bit mins in 12 bytes: bytes
// 0..3 hold scale 0..3 in their low 6 bits, bytes 4..7 min 0..3; for s >= 4
// the low 4 bits sit in byte s + 4 (scale: low nibble, min: high nibble) and
// the top 2 bits in the top bits of byte s - 4 (scale) and byte s (min).
inline void k_scale_min(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

// Q3_K keeps 16 six-bit scales (stored as scale + 32) in 12 bytes: the low
// 4 bits of scale s in byte s (s < 8, low nibble) or byte s - 8 (high
// nibble), the top 2 bits in bits 2 (s / 4), 2 (s / 4) + 1 of byte 8 + s % 4.
inline int q3_k_scale(const uint8_t* sc, int s) {
  const int low = s < 8 ? sc[s] & 0x0F : sc[s - 8] >> 4;
  return low | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4);
}

}  // namespace longctx::detail
