// Block pages (the layout in kv_store.h): a segment of tokens written into a
// page (float kv_types: converted rows and K^T transposes; q8_0: quantized
// codes and scales), and K/V read back out of a page as f32. KVStore
// (kv_store.cpp) decides which page and tokens; this file knows the bytes.
#include "block_page.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "longctx/core/dtype.h"

namespace longctx::kvstore {
namespace {

// ---- the write path: row copies and K^T transposes ----

// keys [count][head_dim] -> k_t [head_dim][count], in 8 x 8 (16-bit) or
// 4 x 4 (32-bit) tiles held in 128-bit vectors: loads and stores are whole
// vectors and the shuffles are SSE2/NEON unpacks (GCC >= 12 and Clang
// vector extensions). head_dim is a multiple of 8; leftover tokens go
// element by element.
using U16x8 = uint16_t __attribute__((vector_size(16)));
using U32x4 = uint32_t __attribute__((vector_size(16)));

template <typename V>
V load_vec(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V>
void store_vec(void* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

void transpose_8x8(const uint16_t* src, size_t src_stride, uint16_t* dst, size_t dst_stride) {
  U16x8 r[8], a[8], b[8];
  for (int i = 0; i < 8; ++i) r[i] = load_vec<U16x8>(src + size_t(i) * src_stride);
  for (int i = 0; i < 8; i += 2) {  // 16-bit interleave of row pairs
    a[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 2, 10, 3, 11);
    a[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 4, 12, 5, 13, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)  // 32-bit interleave: 4 rows x 2 columns per vector
    for (int j = 0; j < 2; ++j) {
      b[i + 2 * j] = __builtin_shufflevector(a[i + j], a[i + j + 2], 0, 1, 8, 9, 2, 3, 10, 11);
      b[i + 2 * j + 1] = __builtin_shufflevector(a[i + j], a[i + j + 2], 4, 5, 12, 13, 6, 7, 14, 15);
    }
  for (int j = 0; j < 4; ++j) {  // 64-bit interleave: rows 0-3 with rows 4-7
    store_vec(dst + size_t(2 * j) * dst_stride, __builtin_shufflevector(b[j], b[j + 4], 0, 1, 2, 3, 8, 9, 10, 11));
    store_vec(dst + size_t(2 * j + 1) * dst_stride, __builtin_shufflevector(b[j], b[j + 4], 4, 5, 6, 7, 12, 13, 14, 15));
  }
}

void transpose_4x4(const uint32_t* src, size_t src_stride, uint32_t* dst, size_t dst_stride) {
  U32x4 r[4];
  for (int i = 0; i < 4; ++i) r[i] = load_vec<U32x4>(src + size_t(i) * src_stride);
  const U32x4 a0 = __builtin_shufflevector(r[0], r[1], 0, 4, 1, 5), a1 = __builtin_shufflevector(r[0], r[1], 2, 6, 3, 7);
  const U32x4 a2 = __builtin_shufflevector(r[2], r[3], 0, 4, 1, 5), a3 = __builtin_shufflevector(r[2], r[3], 2, 6, 3, 7);
  store_vec(dst, __builtin_shufflevector(a0, a2, 0, 1, 4, 5));
  store_vec(dst + dst_stride, __builtin_shufflevector(a0, a2, 2, 3, 6, 7));
  store_vec(dst + 2 * dst_stride, __builtin_shufflevector(a1, a3, 0, 1, 4, 5));
  store_vec(dst + 3 * dst_stride, __builtin_shufflevector(a1, a3, 2, 3, 6, 7));
}

template <typename Elem>
void transpose(const std::byte* keys, int count, int head_dim, std::byte* k_t) {
  constexpr int kTile = sizeof(Elem) == 2 ? 8 : 4;
  const Elem* src = reinterpret_cast<const Elem*>(keys);
  Elem* dst = reinterpret_cast<Elem*>(k_t);
  const size_t d = size_t(head_dim), n = size_t(count);
  size_t t = 0;
  for (; t + kTile <= n; t += kTile)
    for (size_t c = 0; c < d; c += kTile) {
      if constexpr (kTile == 8) transpose_8x8(src + t * d + c, d, dst + c * n + t, n);
      else transpose_4x4(src + t * d + c, d, dst + c * n + t, n);
    }
  for (; t < n; ++t)
    for (size_t c = 0; c < d; ++c) dst[c * n + t] = src[t * d + c];
}

// Segments shorter than this write K^T element by element.
constexpr int kDirectTokens = 8;

// keys [count][head_dim] -> columns [offset, offset + count) of a block's K^T.
template <typename Elem>
void scatter_columns(const std::byte* keys, int count, int head_dim, std::byte* k_t, int block_size, int offset) {
  const Elem* src = reinterpret_cast<const Elem*>(keys);
  Elem* dst = reinterpret_cast<Elem*>(k_t) + offset;
  for (size_t c = 0; c < size_t(head_dim); ++c)
    for (size_t t = 0; t < size_t(count); ++t) dst[c * size_t(block_size) + t] = src[t * size_t(head_dim) + c];
}

// One head's rows are n_kv_heads rows apart in a [n, n_kv_heads, head_dim]
// input, usually a new 4 KiB page per row, where hardware prefetchers stop:
// copy_rows prefetches the rows kPrefetchRows ahead by hand.
constexpr int kPrefetchRows = 6;

// Rows of head_dim elements, `src_stride` bytes apart, into consecutive rows
// of dst in kv_type. The same dtype is a copy of the bits, as in convert(),
// without its per-call checks (this runs once per token and head).
void copy_rows(const std::byte* src, int64_t src_stride, DType src_dtype, std::byte* dst, DType kv_type, int count,
               int head_dim) {
  const size_t row_bytes = size_t(head_dim) * dtype_size(kv_type);
  const size_t src_row_bytes = size_t(head_dim) * dtype_size(src_dtype);
  auto prefetch_row = [&](int i) {
    const std::byte* row = src + i * src_stride;
    for (size_t at = 0; at < src_row_bytes; at += 64) __builtin_prefetch(row + at);
  };
  for (int i = 0; i < std::min(count, kPrefetchRows); ++i) prefetch_row(i);
  for (int i = 0; i < count; ++i) {
    if (i + kPrefetchRows < count) prefetch_row(i + kPrefetchRows);
    const std::byte* row = src + i * src_stride;
    if (src_dtype == kv_type) std::memcpy(dst + size_t(i) * row_bytes, row, row_bytes);
    else convert(row, src_dtype, dst + size_t(i) * row_bytes, kv_type, size_t(head_dim));
  }
}

}  // namespace

namespace detail {  // block_page.h

void write_segment(const StoreLayout& L, const std::byte* k_src, int64_t k_stride, DType k_dtype,
                   const std::byte* v_src, int64_t v_stride, DType v_dtype, std::byte* page, int offset, int count,
                   std::byte* keys, std::byte* k_t_scratch) {
  const DType kv = L.kv_type;
  const size_t es = dtype_size(kv);
  const int bs = L.block_size;
  const int d = L.shape.head_dim;
  const size_t row_bytes = size_t(d) * es;
  copy_rows(k_src, k_stride, k_dtype, keys, kv, count, d);
  copy_rows(v_src, v_stride, v_dtype, page + L.page_v + size_t(offset) * row_bytes, kv, count, d);
  // K^T: transpose in the scratch, then copy out, in one piece when the
  // segment is the whole block (channel rows are then back to back). A few
  // tokens (decode) go straight to the page.
  if (count < kDirectTokens) {
    if (es == 4) scatter_columns<uint32_t>(keys, count, d, page, bs, offset);
    else scatter_columns<uint16_t>(keys, count, d, page, bs, offset);
    return;
  }
  if (es == 4) transpose<uint32_t>(keys, count, d, k_t_scratch);
  else transpose<uint16_t>(keys, count, d, k_t_scratch);
  const size_t run = size_t(count) * es;
  if (count == bs) {
    std::memcpy(page, k_t_scratch, size_t(d) * run);
  } else {
    for (int c = 0; c < d; ++c)
      std::memcpy(page + (size_t(c) * size_t(bs) + size_t(offset)) * es, k_t_scratch + size_t(c) * run, run);
  }
}

void write_q8_segment(const StoreLayout& L, const std::byte* k_src, int64_t k_stride, DType k_dtype,
                      const std::byte* v_src, int64_t v_stride, DType v_dtype, std::byte* page, int offset, int count,
                      float* rows, float* keys) {
  const size_t bs = size_t(L.block_size);
  const int d = L.shape.head_dim;
  const size_t groups = size_t(d / kQ8Group);
  auto* k_codes = reinterpret_cast<int8_t*>(page);
  auto* k_scales = reinterpret_cast<uint16_t*>(page + L.page_k_scales);
  auto* v_codes = reinterpret_cast<int8_t*>(page + L.page_v);
  auto* v_scales = reinterpret_cast<uint16_t*>(page + L.page_v_scales);
  int8_t codes[kMaxHeadDim];
  uint16_t scales[kMaxHeadDim / kQ8Group];
  copy_rows(k_src, k_stride, k_dtype, reinterpret_cast<std::byte*>(rows), DType::kF32, count, d);
  for (size_t i = 0; i < size_t(count); ++i) {
    const int t = offset + int(i);
    quantize_q8_groups(rows + i * size_t(d), groups, codes, scales, keys + i * size_t(d));
    for (size_t g = 0; g < groups; ++g) k_scales[g * bs + size_t(t)] = scales[g];
    for (int c = 0; c < d; c += kQ8KeyQuad)  // a quad's codes lie side by side
      std::memcpy(k_codes + q8_key_code_offset(int(bs), c, t), codes + c, kQ8KeyQuad);
  }
  copy_rows(v_src, v_stride, v_dtype, reinterpret_cast<std::byte*>(rows), DType::kF32, count, d);
  for (size_t i = 0; i < size_t(count); ++i) {
    const int t = offset + int(i);
    quantize_q8_groups(rows + i * size_t(d), groups, codes, v_scales + size_t(t) * groups, nullptr);
    int8_t* out = v_codes + q8_value_code_offset(d, 0, t);  // a token's codes lie a quad apart
    for (int c = 0; c < d; ++c) out[size_t(c) * kQ8ValueQuad] = codes[c];
  }
}

int q8_unstorable_channel(const float* row, int head_dim) {
  if (q8_row_storable(row, head_dim)) return -1;
  for (int c0 = 0; c0 < head_dim; c0 += kQ8Group) {
    float amax = 0.f;
    for (int c = c0; c < c0 + kQ8Group; ++c) {
      if (!std::isfinite(row[c])) return c;
      amax = std::max(amax, std::abs(row[c]));
    }
    if (!q8_scale_fits(amax)) {
      for (int c = c0; c < c0 + kQ8Group; ++c)
        if (std::abs(row[c]) == amax) return c;
    }
  }
  return -1;
}

uint32_t storable_bits(DType source, DType kv_type) {
  if (source == DType::kF32) {
    if (kv_type == DType::kF16) return 0x477fefffu;   // below 65520
    if (kv_type == DType::kBF16) return 0x7f7f7fffu;  // below the tie 0x7f7f8000
    return 0x7f7fffffu;                               // FLT_MAX
  }
  if (source == DType::kBF16 && kv_type == DType::kF16) return 0x477fu;  // 65280; the next, 65536, is past 65520
  return source == DType::kF16 ? 0x7bffu : 0x7f7fu;  // their largest finite values
}

}  // namespace detail

// ---- the page format ---------------------------------------------------------------

size_t kv_vector_bytes(DType kv_type, int head_dim) {
  if (kv_type == DType::kQ8_0) return size_t(head_dim) + size_t(head_dim / kQ8Group) * sizeof(uint16_t);
  return size_t(head_dim) * dtype_size(kv_type);
}

BlockView view_of_page(const StoreLayout& layout, const std::byte* page, int n_filled) {
  BlockView view;
  view.k_t = page;
  view.v = page + layout.page_v;
  if (layout.kv_type == DType::kQ8_0) {
    view.k_scales = reinterpret_cast<const uint16_t*>(page + layout.page_k_scales);
    view.v_scales = reinterpret_cast<const uint16_t*>(page + layout.page_v_scales);
  }
  view.n_filled = n_filled;
  return view;
}

// Tokens whose K scales read_keys_t widens at a time.
constexpr int kScaleTile = 128;

void read_keys_t(const StoreLayout& layout, const BlockView& view, int t0, int n, float* dst, size_t ld) {
  const size_t bs = size_t(layout.block_size);
  if (layout.kv_type == DType::kQ8_0) {
    const auto* codes = reinterpret_cast<const int8_t*>(view.k_t);
    float scale[kScaleTile];
    for (int c0 = 0; c0 < layout.shape.head_dim; c0 += kQ8Group) {
      for (int t = 0; t < n; t += kScaleTile) {
        const int m = std::min(kScaleTile, n - t);
        const uint16_t* s = view.k_scales + size_t(c0 / kQ8Group) * bs + size_t(t0 + t);
        for (int i = 0; i < m; ++i) scale[i] = f16_bits_to_f32(s[i]);
        detail::dequantize_q8_keys_t(codes, scale, int(bs), t0 + t, m, c0, dst + t, ld);
      }
    }
    return;
  }
  const size_t es = dtype_size(layout.kv_type);
  if (t0 == 0 && size_t(n) == bs && ld == bs) {  // the whole page's K^T: one conversion, not one per channel
    convert(view.k_t, layout.kv_type, dst, DType::kF32, size_t(layout.shape.head_dim) * bs);
    return;
  }
  for (size_t c = 0; c < size_t(layout.shape.head_dim); ++c)
    convert(view.k_t + (c * bs + size_t(t0)) * es, layout.kv_type, dst + c * ld, DType::kF32, size_t(n));
}

void read_values(const StoreLayout& layout, const BlockView& view, int t0, int n, float* dst, size_t ld) {
  const size_t d = size_t(layout.shape.head_dim);
  if (layout.kv_type == DType::kQ8_0) {
    const size_t groups = d / kQ8Group;
    for (size_t t = 0; t < size_t(n); ++t) {
      const int8_t* q = reinterpret_cast<const int8_t*>(view.v) + q8_value_code_offset(int(d), 0, t0 + int(t));
      const uint16_t* s = view.v_scales + (size_t(t0) + t) * groups;
      for (size_t g = 0; g < groups; ++g) {
        const float scale = f16_bits_to_f32(s[g]);
        for (size_t c = g * kQ8Group; c < (g + 1) * kQ8Group; ++c) dst[t * ld + c] = float(q[c * kQ8ValueQuad]) * scale;
      }
    }
    return;
  }
  const size_t es = dtype_size(layout.kv_type);
  if (ld == d) {
    convert(view.v + size_t(t0) * d * es, layout.kv_type, dst, DType::kF32, size_t(n) * d);
    return;
  }
  for (size_t t = 0; t < size_t(n); ++t)
    convert(view.v + (size_t(t0) + t) * d * es, layout.kv_type, dst + t * ld, DType::kF32, d);
}

}  // namespace longctx::kvstore
