// Reference quantizers of the GGML block types (for the test model
// generator) and quantize(). Written from the block layouts; ggml's
// quantizers guided the choice of grids. Unlike ggml, every quantizer
// divides by the scale as stored (f16, 6-bit or int8 sub-block scales), and
// the ones with a minimum round their f16 fields outwards, so that the error
// bounds of ggml_types.h hold for the bytes written. No heap allocation: the
// generator quantizes billions of elements.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ggml_blocks.h"
#include "longctx/core/error.h"
#include "longctx/core/ggml_types.h"

namespace longctx {
namespace {

using detail::kQKK;
using detail::store_f16;

// Every block type stores f16 scales (Q4_1/Q5_1 the minimum itself): inputs
// beyond the f16 range are refused.
constexpr float kF16Max = 65504.0f;

float stored_f16(float value) { return f16_bits_to_f32(f32_to_f16_bits(value)); }

// The least f16 >= value, for |value| <= 65504.
float f16_at_least(float value) {
  uint16_t bits = f32_to_f16_bits(value);
  if (f16_bits_to_f32(bits) >= value) return f16_bits_to_f32(bits);
  if ((bits & 0x7FFF) == 0) bits = 0x0001;  // +-0: the least positive subnormal
  else if (bits & 0x8000) --bits;           // negative: one step towards zero
  else ++bits;
  return f16_bits_to_f32(bits);
}
float f16_at_most(float value) { return -f16_at_least(-value); }

// round(v) clamped to the levels 0..top (halves round up).
int level(float v, int top) { return static_cast<int>(std::clamp(v + 0.5f, 0.0f, static_cast<float>(top) + 0.5f)); }

void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Q4_0 .. Q5_1 keep element j < 16 in the low nibble of qs[j] and element
// j + 16 in its high nibble; Q5 types put bit 4 of element j in bit j of qh.
void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
}
uint32_t fifth_bits(const uint8_t* q) {
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  return qh;
}

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

// Q4_0 / Q5_0 as ggml: the element of largest magnitude (with its sign) maps
// to level 0, so d = max / -half and q = round(x / d) + half, clamped to
// 0..2*half-1 (values near -max clamp, within d). Returns d as stored.
float symmetric_levels(const float* x, int half, uint8_t* q) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = stored_f16(max / static_cast<float>(-half));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(level(x[j] * id + static_cast<float>(half), 2 * half - 1));
  return d;
}

void quant_q4_0(const float* x, uint8_t* b) {
  uint8_t q[32];
  store_f16(b, symmetric_levels(x, 8, q));
  pack_nibbles(q, b + 2);
}

void quant_q5_0(const float* x, uint8_t* b) {
  uint8_t q[32];
  store_f16(b, symmetric_levels(x, 16, q));
  store_u32(b + 2, fifth_bits(q));
  pack_nibbles(q, b + 6);
}

// Q4_1 / Q5_1: levels m + q * d, q in 0..top. m is the minimum rounded down
// to f16 and d = (max - m) / top rounded up, so the levels span the block and
// every element lies within d/2 of one (ggml rounds both to nearest, which
// can leave the extremes, or all of a near-constant block, outside).
void affine_levels(const float* x, int top, float* d_out, float* m_out, uint8_t* q) {
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float m = f16_at_most(min);
  const float d = f16_at_least((max - m) / static_cast<float>(top));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(level((x[j] - m) * id, top));
  *d_out = d;
  *m_out = m;
}

void quant_q4_1(const float* x, uint8_t* b) {
  uint8_t q[32];
  float d, m;
  affine_levels(x, 15, &d, &m, q);
  store_f16(b, d);
  store_f16(b + 2, m);
  pack_nibbles(q, b + 4);
}

void quant_q5_1(const float* x, uint8_t* b) {
  uint8_t q[32];
  float d, m;
  affine_levels(x, 31, &d, &m, q);
  store_f16(b, d);
  store_f16(b + 2, m);
  store_u32(b + 4, fifth_bits(q));
  pack_nibbles(q, b + 8);
}

// ---- k-quants ----

// Squared error of x[0..n) (n a multiple of 8) on the levels step * q -
// offset, q in 0..top. Branch-free with 8 partial sums in a fixed order, so
// the compiler vectorizes it and the result does not depend on how.
float grid_error(const float* x, int n, float step, float offset, int top) {
  const float inv = step != 0.0f ? 1.0f / step : 0.0f;
  const float hi = static_cast<float>(top) + 0.5f;
  float partial[8] = {};
  for (int i = 0; i < n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      float v = (x[i + j] + offset) * inv + 0.5f;
      v = v < 0.0f ? 0.0f : v;
      v = v > hi ? hi : v;
      const float e = step * static_cast<float>(static_cast<int>(v)) - offset - x[i + j];
      partial[j] += e * e;
    }
  }
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

void fill_levels(const float* x, int n, float step, float offset, int top, uint8_t* q) {
  const float inv = step != 0.0f ? 1.0f / step : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(level((x[i] + offset) * inv, top));
}

// Covering needs carry this relative margin so that float rounding never
// turns a covering grid into one that misses an extreme by an ulp.
constexpr float kMargin = 1.0f + 1e-4f;

// Q2_K, Q4_K and Q5_K: element of sub-block s = d * sc[s] * q - dmin *
// mn[s], sc and mn in 0..st (Q2_K: st 15, 16 sub-blocks of 16 elements;
// Q4_K, Q5_K: st 63, 8 sub-blocks of 32), q in 0..top (3, 15 or 31). The
// offset dmin * mn is never negative, so the lowest level is <= 0: a grid
// covers the sub-block (every element within step/2 of a level) when its
// lowest level is at most lo + step/2 and its highest at least hi - step/2,
// for lo = min(0, min x) and hi = max x. Any step >= need = max((hi - lo +
// dmin) / (top + 1), hi / (top + 0.5)) has covering offsets: they form a
// window at least dmin wide that reaches 0, so it holds a multiple of dmin.
// With dmin = max(-lo) / st and d = max(need) / st, both rounded up to f16,
// every sub-block reaches its need with sc <= st and its offset with mn <=
// st. The search tries sc = ceil(need / d) and the next scale that has a
// covering offset, each with the (up to 3) covering offsets nearest the
// window's middle, and keeps the least squared error: the step is below
// need + 2d.
struct AffineGrid {
  int sub;        // elements per sub-block
  int top;        // highest code
  int scale_top;  // highest scale and min
};
constexpr AffineGrid kQ2KGrid{16, 3, 15}, kQ4KGrid{32, 15, 63}, kQ5KGrid{32, 31, 63};

struct KQuant {
  float d = 0.0f, dmin = 0.0f;
  uint8_t sc[16] = {}, mn[16] = {};
  uint8_t q[kQKK] = {};
};

void search_affine_sub(const float* x, const AffineGrid& g, float lo, float hi, float need, float d, float dmin,
                       uint8_t* sc_out, uint8_t* mn_out) {
  const int st = g.scale_top;
  float best = INFINITY;
  int best_sc = st, best_mn = dmin > 0.0f ? std::min(st, static_cast<int>(std::ceil(-lo / dmin))) : 0;
  int tried = 0;
  const int first = d > 0.0f ? std::min(st, static_cast<int>(std::ceil(need / d))) : 0;
  for (int sc = first; sc <= st && tried < 2; ++sc) {
    const float step = d * static_cast<float>(sc);
    // Offsets (dmin * mn) whose levels cover [lo, hi]: [a, b].
    const float a = -lo - step / 2, b = (static_cast<float>(g.top) + 0.5f) * step - hi;
    int k_lo = 0, k_hi = -1, mid = 0;
    if (dmin > 0.0f) {
      k_lo = static_cast<int>(std::ceil(std::clamp(a / dmin, 0.0f, static_cast<float>(st + 1))));
      k_hi = static_cast<int>(std::floor(std::clamp(b / dmin, -1.0f, static_cast<float>(st))));
      mid = static_cast<int>(std::lround(std::clamp((a + b) / 2 / dmin, -1.0f, static_cast<float>(st + 1))));
    } else if (a <= 0.0f && b >= 0.0f) {
      k_hi = 0;
    }
    if (k_lo > k_hi) continue;  // no covering offset at this scale
    ++tried;
    mid = std::clamp(mid, k_lo, k_hi);
    for (int k = std::max(k_lo, mid - 1); k <= std::min(k_hi, mid + 1); ++k) {
      const float err = grid_error(x, g.sub, step, dmin * static_cast<float>(k), g.top);
      if (err < best) {
        best = err;
        best_sc = sc;
        best_mn = k;
      }
    }
  }
  *sc_out = static_cast<uint8_t>(best_sc);  // tried == 0 only if rounding defeated kMargin: nearest grid
  *mn_out = static_cast<uint8_t>(best_mn);
}

void quant_affine_k(const float* x, const AffineGrid& g, KQuant& k) {
  const int n_sub = kQKK / g.sub;
  float lo[16], hi[16], need[16];
  float max_off = 0.0f, max_need = 0.0f;
  for (int s = 0; s < n_sub; ++s) {
    const float* xs = x + g.sub * s;
    lo[s] = std::min(0.0f, xs[0]);
    hi[s] = xs[0];
    for (int i = 1; i < g.sub; ++i) {
      lo[s] = std::min(lo[s], xs[i]);
      hi[s] = std::max(hi[s], xs[i]);
    }
    max_off = std::max(max_off, -lo[s]);
  }
  const float scale_top = static_cast<float>(g.scale_top);
  k.dmin = f16_at_least(max_off / scale_top);
  const float levels = static_cast<float>(g.top);
  for (int s = 0; s < n_sub; ++s) {
    need[s] = std::max((hi[s] - lo[s] + k.dmin) / (levels + 1.0f), hi[s] / (levels + 0.5f)) * kMargin;
    max_need = std::max(max_need, need[s]);
  }
  k.d = f16_at_least(max_need / scale_top);
  for (int s = 0; s < n_sub; ++s) {
    search_affine_sub(x + g.sub * s, g, lo[s], hi[s], need[s], k.d, k.dmin, &k.sc[s], &k.mn[s]);
    fill_levels(x + g.sub * s, g.sub, k.d * static_cast<float>(k.sc[s]), k.dmin * static_cast<float>(k.mn[s]), g.top,
                k.q + g.sub * s);
  }
}

// Q2_K and Q3_K keep element 32 j + l of half h (j < 4, l < 32) in bits
// 2j, 2j + 1 of qs[32 h + l].
void pack_k_crumbs(const uint8_t* q, uint8_t* qs) {
  std::memset(qs, 0, 64);
  for (int i = 0; i < kQKK; ++i) {
    const int h = i / 128, j = (i % 128) / 32, l = i % 32;
    qs[32 * h + l] = static_cast<uint8_t>(qs[32 * h + l] | ((q[i] & 3) << (2 * j)));
  }
}

// Q2_K: scales (byte s: scale | min << 4), codes, d, dmin.
void quant_q2_k(const float* x, uint8_t* b) {
  KQuant k;
  quant_affine_k(x, kQ2KGrid, k);
  for (int s = 0; s < 16; ++s) b[s] = static_cast<uint8_t>(k.sc[s] | (k.mn[s] << 4));
  pack_k_crumbs(k.q, b + 16);
  store_f16(b + 80, k.d);
  store_f16(b + 82, k.dmin);
}

// The 12 bytes of scales and mins (layout: k_scale_min in ggml_blocks.h).
void pack_k_scales(const KQuant& k, uint8_t* out) {
  for (int s = 0; s < 4; ++s) {
    out[s] = static_cast<uint8_t>(k.sc[s] | ((k.sc[s + 4] >> 4) << 6));
    out[s + 4] = static_cast<uint8_t>(k.mn[s] | ((k.mn[s + 4] >> 4) << 6));
    out[s + 8] = static_cast<uint8_t>((k.sc[s + 4] & 0x0F) | ((k.mn[s + 4] & 0x0F) << 4));
  }
}

// Nibbles of 64 elements per 32 bytes: sub-block 2p low, 2p + 1 high.
void pack_k_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      qs[32 * p + l] = static_cast<uint8_t>((q[64 * p + l] & 0x0F) | ((q[64 * p + 32 + l] & 0x0F) << 4));
}

void quant_q4_k(const float* x, uint8_t* b) {
  KQuant k;
  quant_affine_k(x, kQ4KGrid, k);
  store_f16(b, k.d);
  store_f16(b + 2, k.dmin);
  pack_k_scales(k, b + 4);
  pack_k_nibbles(k.q, b + 16);
}

// Q5_K: as Q4_K, plus bit 4 of element l of sub-block s in bit s of qh[l].
void quant_q5_k(const float* x, uint8_t* b) {
  KQuant k;
  quant_affine_k(x, kQ5KGrid, k);
  store_f16(b, k.d);
  store_f16(b + 2, k.dmin);
  pack_k_scales(k, b + 4);
  uint8_t* qh = b + 16;
  std::memset(qh, 0, 32);
  for (int i = 0; i < kQKK; ++i) qh[i % 32] = static_cast<uint8_t>(qh[i % 32] | ((k.q[i] >> 4) << (i / 32)));
  pack_k_nibbles(k.q, b + 48);
}

// Q3_K and Q6_K: element of sub-block s (16 elements) = d * sc[s] * (q -
// half), sc signed with |sc| <= sm (Q3_K: half 4, sm 31, as its 6-bit
// scales hold -32..31; Q6_K: half 32, sm 127), q in 0..2 half - 1: the
// levels span -half..half - 1 steps for sc > 0 and -(half - 1)..half for sc
// < 0. A grid covers the sub-block (every element within step/2 of a level)
// when |step| >= max(neg / (half + 0.5), pos / (half - 0.5)) for sc > 0 and
// max(pos / (half + 0.5), neg / (half - 0.5)) for sc < 0, pos = max(0, max
// x), neg = max(0, -min x). d = max over sub-blocks of the smaller need /
// sm, rounded up to f16; the search tries both signs with |sc| = ceil(need /
// d) and the next (<= sm) and keeps the least squared error: |step| is
// below the larger need + 2d, itself at most absmax / (half - 0.5) + 2d.
// Returns d as stored.
float quant_signed_k(const float* x, int half, int sm, int8_t* sc, uint8_t* q) {
  const float wide = static_cast<float>(half) + 0.5f, narrow = static_cast<float>(half) - 0.5f;
  float need_pos[16], need_neg[16];  // for sc > 0 and sc < 0
  float max_need = 0.0f;
  for (int s = 0; s < 16; ++s) {
    float pos = 0.0f, neg = 0.0f;
    for (int i = 0; i < 16; ++i) {
      pos = std::max(pos, x[16 * s + i]);
      neg = std::max(neg, -x[16 * s + i]);
    }
    need_pos[s] = std::max(neg / wide, pos / narrow) * kMargin;
    need_neg[s] = std::max(pos / wide, neg / narrow) * kMargin;
    max_need = std::max(max_need, std::min(need_pos[s], need_neg[s]));
  }
  const float d = f16_at_least(max_need / static_cast<float>(sm));
  const int top = 2 * half - 1;
  for (int s = 0; s < 16; ++s) {
    const float* xs = x + 16 * s;
    float best = INFINITY;
    int best_sc = 0;
    for (const int sign : {1, -1}) {
      const float need = sign > 0 ? need_pos[s] : need_neg[s];
      const float first = d > 0.0f ? std::ceil(need / d) : 0.0f;
      if (first > static_cast<float>(sm)) continue;  // this sign needs a larger step than d allows
      for (int m = static_cast<int>(first); m <= std::min(sm, static_cast<int>(first) + 1); ++m) {
        const float step = d * static_cast<float>(sign * m);
        const float err = grid_error(xs, 16, step, static_cast<float>(half) * step, top);
        if (err < best) {
          best = err;
          best_sc = sign * m;
        }
      }
    }
    sc[s] = static_cast<int8_t>(best_sc);
    const float step = d * static_cast<float>(best_sc);
    fill_levels(xs, 16, step, static_cast<float>(half) * step, top, q + 16 * s);
  }
  return d;
}

// Q3_K: the third bit of element 32 j + l of half h in bit 4 h + j of
// hmask[l], two-bit codes as Q2_K's, scales + 32 (q3_k_scale), d.
void quant_q3_k(const float* x, uint8_t* b) {
  int8_t sc[16];
  uint8_t q[kQKK];
  const float d = quant_signed_k(x, 4, 31, sc, q);
  uint8_t* hmask = b;
  std::memset(hmask, 0, 32);
  for (int i = 0; i < kQKK; ++i) {
    const int h = i / 128, j = (i % 128) / 32, l = i % 32;
    hmask[l] = static_cast<uint8_t>(hmask[l] | ((q[i] >> 2) << (4 * h + j)));
  }
  pack_k_crumbs(q, b + 32);
  uint8_t* scales = b + 96;
  std::memset(scales, 0, 12);
  for (int s = 0; s < 16; ++s) {
    const int u = sc[s] + 32;  // 1..63
    scales[s % 8] = static_cast<uint8_t>(scales[s % 8] | ((u & 0x0F) << (s < 8 ? 0 : 4)));
    scales[8 + s % 4] = static_cast<uint8_t>(scales[8 + s % 4] | ((u >> 4) << (2 * (s / 4))));
  }
  store_f16(b + 108, d);
}

void quant_q6_k(const float* x, uint8_t* b) {
  int8_t sc[16];
  uint8_t q[kQKK];
  const float d = quant_signed_k(x, 32, 127, sc, q);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  std::memset(b, 0, 192);
  for (int i = 0; i < kQKK; ++i) {
    const int half = i / 128, k = (i % 128) / 32, l = i % 32;
    uint8_t& low = ql[64 * half + l + 32 * (k & 1)];
    low = static_cast<uint8_t>(low | ((q[i] & 0x0F) << (k < 2 ? 0 : 4)));
    qh[32 * half + l] = static_cast<uint8_t>(qh[32 * half + l] | ((q[i] >> 4) << (2 * k)));
  }
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(sc[s]);
  store_f16(b + 208, d);
}

using EncodeFn = void (*)(const float*, uint8_t*);

EncodeFn block_encoder(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return quant_q4_0;
    case GgmlType::kQ4_1: return quant_q4_1;
    case GgmlType::kQ5_0: return quant_q5_0;
    case GgmlType::kQ5_1: return quant_q5_1;
    case GgmlType::kQ8_0: return quant_q8_0;
    case GgmlType::kQ2_K: return quant_q2_k;
    case GgmlType::kQ3_K: return quant_q3_k;
    case GgmlType::kQ4_K: return quant_q4_k;
    case GgmlType::kQ5_K: return quant_q5_k;
    case GgmlType::kQ6_K: return quant_q6_k;
    default: return nullptr;
  }
}

}  // namespace

void quantize(GgmlType type, std::span<const float> src, std::span<uint8_t> dst) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  const bool plain = type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
  const EncodeFn encode = block_encoder(type);
  if (!plain && encode == nullptr) fail(ErrorCode::kUnsupported, "cannot quantize f32 to ggml type ", info.name);
  const auto bytes = ggml_bytes(type, static_cast<int64_t>(src.size()));
  if (!bytes)
    fail(ErrorCode::kInvalidArgument, "quantize ", info.name, ": ", src.size(),
         " elements is not a multiple of the block size ", info.block_elems);
  if (*bytes != dst.size())
    fail(ErrorCode::kInvalidArgument, "quantize ", info.name, ": ", src.size(), " elements need ", *bytes,
         " bytes, got ", dst.size());
  const size_t n = src.size();
  if (n == 0) return;
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst.data(), src.data(), n * 4); return;
    case GgmlType::kF16: convert(src.data(), DType::kF32, dst.data(), DType::kF16, n); return;
    case GgmlType::kBF16: convert(src.data(), DType::kF32, dst.data(), DType::kBF16, n); return;
    default: break;
  }
  for (size_t i = 0; i < n; ++i)
    if (!(std::fabs(src[i]) <= kF16Max))  // also NaN
      fail(ErrorCode::kInvalidArgument, "quantize ", info.name, ": element ", i, " (", src[i],
           ") is not finite or outside the f16 range of block scales");
  const size_t elems = static_cast<size_t>(info.block_elems), block_bytes = static_cast<size_t>(info.block_bytes);
  for (size_t blk = 0; blk < n / elems; ++blk) encode(src.data() + blk * elems, dst.data() + blk * block_bytes);
}

std::vector<uint8_t> quantize(GgmlType type, std::span<const float> src) {
  const auto bytes = ggml_bytes(type, static_cast<int64_t>(src.size()));
  std::vector<uint8_t> out(bytes.value_or(0));
  quantize(type, src, out);
  return out;
}

}  // namespace longctx
