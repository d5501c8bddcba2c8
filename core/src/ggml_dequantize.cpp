// GGML block decoders (layouts: ggml-org/ggml docs/gguf.md and
// ggml-common.h) and dequantize(). Every multi-byte field is little endian;
// f16 fields are IEEE binary16.
#include <cstring>
#include <string>

#include "ggml_blocks.h"
#include "longctx/core/error.h"
#include "longctx/core/ggml_types.h"

namespace longctx {
namespace {

using detail::k_scale_min;
using detail::load_f16;

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

void dequant_q5_0(const uint8_t* b, float* y) { dequant_q5(b, y, false); }
void dequant_q5_1(const uint8_t* b, float* y) { dequant_q5(b, y, true); }

// Q8_0: d (f16), 32 int8; value q * d.
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: 16 bytes of scales (byte s: scale of sub-block s in the low nibble,
// its min in the high one), 64 bytes of 2-bit codes, d, dmin (f16). Sub-block
// s has 16 elements; element 32 j + l of half h (j < 4, l < 32) is bits 2j,
// 2j + 1 of qs[32 h + l]. Value d * scale[s] * q - dmin * min[s].
void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* qs = b + 16;
  const float d = load_f16(b + 80), dmin = load_f16(b + 82);
  for (int s = 0; s < 16; ++s) {
    const float step = d * static_cast<float>(b[s] & 0x0F), offset = dmin * static_cast<float>(b[s] >> 4);
    const int h = s / 8, j = (s % 8) / 2, l0 = 16 * (s % 2);
    for (int l = l0; l < l0 + 16; ++l)
      y[16 * s + l - l0] = step * static_cast<float>((qs[32 * h + l] >> (2 * j)) & 3) - offset;
  }
}

// Q3_K: hmask (32 bytes), qs (64 bytes of 2-bit codes as Q2_K's), 12 bytes of
// 6-bit scales (q3_k_scale), d (f16). Element 32 j + l of half h takes bit
// 4 h + j of hmask[l] as its third bit: q in 0..7, value d * (scale[s] - 32)
// * (q - 4) for sub-block s of 16 elements.
void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const float d = load_f16(b + 108);
  for (int s = 0; s < 16; ++s) {
    const float step = d * static_cast<float>(detail::q3_k_scale(b + 96, s) - 32);
    const int h = s / 8, j = (s % 8) / 2, l0 = 16 * (s % 2);
    for (int l = l0; l < l0 + 16; ++l) {
      const int q = ((qs[32 * h + l] >> (2 * j)) & 3) | (((hmask[l] >> (4 * h + j)) & 1) << 2);
      y[16 * s + l - l0] = step * static_cast<float>(q - 4);
    }
  }
}

// Q4_K: d, dmin (f16), 12 bytes of scales and mins (k_scale_min), 128 bytes
// of nibbles. Sub-block s (32 elements) has value d * scale[s] * q - dmin *
// min[s]. Each 32 bytes of qs hold two sub-blocks: low nibbles the first,
// high nibbles the second.
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qs = b + 16;
  for (int pair = 0; pair < 4; ++pair) {
    int s0, m0, s1, m1;
    k_scale_min(sc, 2 * pair, &s0, &m0);
    k_scale_min(sc, 2 * pair + 1, &s1, &m1);
    const float d0 = d * static_cast<float>(s0), d1 = d * static_cast<float>(s1);
    const float o0 = dmin * static_cast<float>(m0), o1 = dmin * static_cast<float>(m1);
    const uint8_t* q = qs + 32 * pair;
    for (int l = 0; l < 32; ++l) {
      y[64 * pair + l] = d0 * static_cast<float>(q[l] & 0x0F) - o0;
      y[64 * pair + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - o1;
    }
  }
}

// Q5_K: d, dmin, scales and mins as Q4_K, then qh (32 bytes), qs (128 bytes,
// nibbles as Q4_K). Element l of sub-block s takes bit s of qh[l] as its
// fifth bit: q in 0..31, value d * scale[s] * q - dmin * min[s].
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int pair = 0; pair < 4; ++pair) {
    int s0, m0, s1, m1;
    k_scale_min(sc, 2 * pair, &s0, &m0);
    k_scale_min(sc, 2 * pair + 1, &s1, &m1);
    const float d0 = d * static_cast<float>(s0), d1 = d * static_cast<float>(s1);
    const float o0 = dmin * static_cast<float>(m0), o1 = dmin * static_cast<float>(m1);
    const uint8_t* q = qs + 32 * pair;
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] & 0x0F) | (((qh[l] >> (2 * pair)) & 1) << 4);
      const int hi = (q[l] >> 4) | (((qh[l] >> (2 * pair + 1)) & 1) << 4);
      y[64 * pair + l] = d0 * static_cast<float>(lo) - o0;
      y[64 * pair + 32 + l] = d1 * static_cast<float>(hi) - o1;
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
      // Loop-invariant operands hoisted, so the 32 values vectorize (the
      // same products, in the same order, as d * scale * q per value).
      const uint8_t* low_bytes = l4 + 32 * (k & 1);
      const int low_shift = k < 2 ? 0 : 4;
      for (int sub = 0; sub < 2; ++sub) {
        const float scale = d * static_cast<float>(sc[sub + 2 * k]);
        for (int l = 16 * sub; l < 16 * sub + 16; ++l) {
          const int low = (low_bytes[l] >> low_shift) & 0x0F;
          const int high = (h2[l] >> (2 * k)) & 3;
          out[32 * k + l] = scale * static_cast<float>((low | (high << 4)) - 32);
        }
      }
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return dequant_q4_0;
    case GgmlType::kQ4_1: return dequant_q4_1;
    case GgmlType::kQ5_0: return dequant_q5_0;
    case GgmlType::kQ5_1: return dequant_q5_1;
    case GgmlType::kQ8_0: return dequant_q8_0;
    case GgmlType::kQ2_K: return dequant_q2_k;
    case GgmlType::kQ3_K: return dequant_q3_k;
    case GgmlType::kQ4_K: return dequant_q4_k;
    case GgmlType::kQ5_K: return dequant_q5_k;
    case GgmlType::kQ6_K: return dequant_q6_k;
    default: return nullptr;
  }
}

}  // namespace

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

}  // namespace longctx
