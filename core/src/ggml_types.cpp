// GGML block layouts (ggml-org/ggml docs and ggml-common.h), dequantization
// to f32 and the reference quantizers used by the test model generator.
// Every multi-byte field is little endian; f16 fields are IEEE binary16.
#include "longctx/core/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

constexpr int64_t kQK = 32;    // elements per block of the Q4_0 .. Q8_1 types
constexpr int64_t kQKK = 256;  // elements per super-block of the k-quants

struct TypeEntry {
  GgmlType type;
  GgmlTypeInfo info;
};

// Block sizes from the GGUF spec; k-quant sizes spelled out per field.
constexpr TypeEntry kTypes[] = {
    {GgmlType::kF32, {"f32", 1, 4, true}},
    {GgmlType::kF16, {"f16", 1, 2, true}},
    {GgmlType::kQ4_0, {"q4_0", kQK, 2 + kQK / 2, true}},
    {GgmlType::kQ4_1, {"q4_1", kQK, 2 + 2 + kQK / 2, true}},
    {GgmlType::kQ5_0, {"q5_0", kQK, 2 + 4 + kQK / 2, true}},
    {GgmlType::kQ5_1, {"q5_1", kQK, 2 + 2 + 4 + kQK / 2, true}},
    {GgmlType::kQ8_0, {"q8_0", kQK, 2 + kQK, true}},
    {GgmlType::kQ8_1, {"q8_1", kQK, 2 + 2 + kQK, false}},
    {GgmlType::kQ2_K, {"q2_k", kQKK, kQKK / 16 + kQKK / 4 + 2 + 2, false}},
    {GgmlType::kQ3_K, {"q3_k", kQKK, kQKK / 8 + kQKK / 4 + 12 + 2, false}},
    {GgmlType::kQ4_K, {"q4_k", kQKK, 2 + 2 + 12 + kQKK / 2, true}},
    {GgmlType::kQ5_K, {"q5_k", kQKK, 2 + 2 + 12 + kQKK / 8 + kQKK / 2, false}},
    {GgmlType::kQ6_K, {"q6_k", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, true}},
    {GgmlType::kQ8_K, {"q8_k", kQKK, 4 + kQKK + kQKK / 16 * 2, false}},
    {GgmlType::kI8, {"i8", 1, 1, false}},
    {GgmlType::kI16, {"i16", 1, 2, false}},
    {GgmlType::kI32, {"i32", 1, 4, false}},
    {GgmlType::kI64, {"i64", 1, 8, false}},
    {GgmlType::kF64, {"f64", 1, 8, false}},
    {GgmlType::kBF16, {"bf16", 1, 2, true}},
};

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
float load_f16(const uint8_t* p) { return f16_bits_to_f32(load_u16(p)); }
void store_f16(uint8_t* p, float value) {
  const uint16_t bits = f32_to_f16_bits(value);
  p[0] = static_cast<uint8_t>(bits);
  p[1] = static_cast<uint8_t>(bits >> 8);
}

// Q4_0: d (f16), 16 bytes of nibbles; element j is the low nibble of byte j,
// element j + 16 the high nibble; value (q - 8) * d.
void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: d, m (f16), nibbles as Q4_0; value q * d + m.
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: d [, m], 32 high bits (u32, bit i is the fifth bit of element
// i), then nibbles as Q4_0. Q5_0 values (q - 16) * d, Q5_1 q * d + m.
void dequant_q5(const uint8_t* b, float* y, bool has_min) {
  const float d = load_f16(b);
  const float m = has_min ? load_f16(b + 2) : 0.0f;
  const uint8_t* qh_bytes = b + (has_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const uint8_t* qs = qh_bytes + 4;
  const int offset = has_min ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - offset) * d + m;
    y[j + 16] = static_cast<float>(hi - offset) * d + m;
  }
}

// Q8_0: d (f16), 32 int8; value q * d.
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q4_K: d, dmin (f16), 12 bytes holding 8 six-bit scales and 8 six-bit mins,
// 128 bytes of nibbles. Sub-block s (32 elements) has value
// d * scale[s] * q - dmin * min[s]. Bytes 0..3 keep scale 0..3 in their low 6
// bits, bytes 4..7 min 0..3; for s >= 4 the low 4 bits come from byte s + 4
// (scale: low nibble, min: high nibble) and the top 2 bits from the top bits
// of byte s - 4 (scale) and byte s (min). Each 32 bytes of qs hold two
// sub-blocks: low nibbles the first, high nibbles the second.
void q4k_scale_min(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qs = b + 16;
  for (int pair = 0; pair < 4; ++pair) {
    int s0, m0, s1, m1;
    q4k_scale_min(sc, 2 * pair, &s0, &m0);
    q4k_scale_min(sc, 2 * pair + 1, &s1, &m1);
    const float d0 = d * static_cast<float>(s0), d1 = d * static_cast<float>(s1);
    const float o0 = dmin * static_cast<float>(m0), o1 = dmin * static_cast<float>(m1);
    const uint8_t* q = qs + 32 * pair;
    for (int l = 0; l < 32; ++l) {
      y[64 * pair + l] = d0 * static_cast<float>(q[l] & 0x0F) - o0;
      y[64 * pair + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - o1;
    }
  }
}

// Q6_K: ql (128 bytes, low 4 bits), qh (64 bytes, high 2 bits), 16 int8 scales
// (one per 16 elements), d (f16); value d * scale * (q - 32). Each half of 128
// elements uses 64 bytes of ql and 32 of qh: element 32*k + l (k = 0..3) takes
// its low bits from ql[l + 32*(k&1)] (low nibble for k < 2, high otherwise) and
// its high bits from bits 2k..2k+1 of qh[l].
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* l4 = ql + 64 * half;
    const uint8_t* h2 = qh + 32 * half;
    const int8_t* sc = scales + 8 * half;
    float* out = y + 128 * half;
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t low_byte = l4[l + 32 * (k & 1)];
        const int low = k < 2 ? (low_byte & 0x0F) : (low_byte >> 4);
        const int high = (h2[l] >> (2 * k)) & 3;
        const int q = (low | (high << 4)) - 32;
        out[32 * k + l] = d * static_cast<float>(sc[l / 16 + 2 * k]) * static_cast<float>(q);
      }
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

void dequant_q5_0(const uint8_t* b, float* y) { dequant_q5(b, y, false); }
void dequant_q5_1(const uint8_t* b, float* y) { dequant_q5(b, y, true); }

BlockFn block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return dequant_q4_0;
    case GgmlType::kQ4_1: return dequant_q4_1;
    case GgmlType::kQ5_0: return dequant_q5_0;
    case GgmlType::kQ5_1: return dequant_q5_1;
    case GgmlType::kQ8_0: return dequant_q8_0;
    case GgmlType::kQ4_K: return dequant_q4_k;
    case GgmlType::kQ6_K: return dequant_q6_k;
    default: return nullptr;
  }
}

// The scale rounded to f16 as stored. Unlike ggml, which divides by the
// unrounded scale, the quantizers divide by the stored one, so that each
// element of a Q8_0 block lands within d/2 of its value.
float stored_f16(float value) { return f16_bits_to_f32(f32_to_f16_bits(value)); }

void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = stored_f16(amax / 127.0f);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, d);
  for (int j = 0; j < 32; ++j) {
    const float q = std::clamp(std::round(x[j] * id), -127.0f, 127.0f);
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

// Q4_0 as ggml: the element of largest magnitude (with its sign) maps to -8,
// so d = max / -8 and q = floor(x / d + 8.5) clamped to 0..15.
void quant_q4_0(const float* x, uint8_t* b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = stored_f16(max / -8.0f);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(b, d);
  auto nibble = [&](float v) { return static_cast<uint8_t>(std::clamp(std::floor(v * id + 8.5f), 0.0f, 15.0f)); };
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(nibble(x[j]) | (nibble(x[j + 16]) << 4));
}

}  // namespace

std::optional<GgmlType> ggml_type_from_id(uint32_t id) {
  for (const auto& entry : kTypes)
    if (static_cast<uint32_t>(entry.type) == id) return entry.type;
  return std::nullopt;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  for (const auto& entry : kTypes)
    if (entry.type == type) return entry.info;
  fail(ErrorCode::kInvalidArgument, "unknown ggml type id ", static_cast<uint32_t>(type));
}

std::optional<uint64_t> ggml_bytes(GgmlType type, int64_t n_elements) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (n_elements < 0 || n_elements % info.block_elems != 0) return std::nullopt;
  const uint64_t blocks = static_cast<uint64_t>(n_elements / info.block_elems);
  const uint64_t block_bytes = static_cast<uint64_t>(info.block_bytes);
  if (blocks > std::numeric_limits<uint64_t>::max() / block_bytes) return std::nullopt;
  return blocks * block_bytes;
}

void dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (!info.dequantizable) fail(ErrorCode::kUnsupported, "cannot convert ggml type ", info.name, " to f32");
  const auto bytes = ggml_bytes(type, static_cast<int64_t>(dst.size()));
  if (!bytes || *bytes != src.size())
    fail(ErrorCode::kInvalidArgument, "dequantize ", info.name, ": ", dst.size(), " elements need ",
         bytes ? std::to_string(*bytes) : std::string("a multiple of the block size and"), " bytes, got ",
         src.size());
  const size_t n = dst.size();
  if (n == 0) return;
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst.data(), src.data(), n * 4); return;
    case GgmlType::kF16: convert(src.data(), DType::kF16, dst.data(), DType::kF32, n); return;
    case GgmlType::kBF16: convert(src.data(), DType::kBF16, dst.data(), DType::kF32, n); return;
    default: break;
  }
  const BlockFn decode = block_decoder(type);
  if (decode == nullptr) fail(ErrorCode::kInternal, "no decoder for dequantizable type ", info.name);
  const size_t n_blocks = n / static_cast<size_t>(info.block_elems);
  for (size_t blk = 0; blk < n_blocks; ++blk)
    decode(src.data() + blk * static_cast<size_t>(info.block_bytes), dst.data() + blk * static_cast<size_t>(info.block_elems));
}

std::vector<uint8_t> quantize(GgmlType type, std::span<const float> src) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  const auto bytes = ggml_bytes(type, static_cast<int64_t>(src.size()));
  if (!bytes) fail(ErrorCode::kInvalidArgument, "quantize ", info.name, ": ", src.size(),
                   " elements is not a multiple of the block size ", info.block_elems);
  std::vector<uint8_t> out(*bytes);
  const size_t n = src.size();
  if (n == 0) return out;
  if (info.block_elems > 1) {
    // Block scales must be finite f16 numbers.
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(src[i]) || std::fabs(src[i]) > 65504.0f * 7.0f)
        fail(ErrorCode::kInvalidArgument, "quantize ", info.name, ": element ", i, " (", src[i],
             ") is not finite or too large for an f16 block scale");
  }
  switch (type) {
    case GgmlType::kF32: std::memcpy(out.data(), src.data(), n * 4); return out;
    case GgmlType::kF16: convert(src.data(), DType::kF32, out.data(), DType::kF16, n); return out;
    case GgmlType::kBF16: convert(src.data(), DType::kF32, out.data(), DType::kBF16, n); return out;
    case GgmlType::kQ8_0:
      for (size_t blk = 0; blk < n / 32; ++blk) quant_q8_0(src.data() + 32 * blk, out.data() + 34 * blk);
      return out;
    case GgmlType::kQ4_0:
      for (size_t blk = 0; blk < n / 32; ++blk) quant_q4_0(src.data() + 32 * blk, out.data() + 18 * blk);
      return out;
    default: fail(ErrorCode::kUnsupported, "cannot quantize f32 to ggml type ", info.name);
  }
}

}  // namespace longctx
