#include "representatives.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "block_page.h"
#include "longctx/core/dtype.h"

namespace longctx::kvstore::detail {

namespace {

using RT = RepresentativeType;

// Slot j of a record of a float kv_type (q8_0 slots: write_slot).
std::byte* slot(const StoreLayout& layout, std::byte* record, int j) {
  return record + size_t(j) * size_t(layout.shape.head_dim) * dtype_size(layout.kv_type);
}

// How a slot rounds to a q8_0 record (kv_store.h): the extremes outward.
enum class Rounding { kNearest, kUp, kDown };

// One group x[0, 32) of a MAX / QUEST slot on q8_0: the smallest f16 scale s
// with 127 s >= max |x|, codes the nearest q s on the `up` (or down) side of
// each x. Products of a 7-bit code and an f16 are exact in double, so each
// code is checked against its x exactly.
uint16_t quantize_q8_bound(const float* x, int8_t* codes, bool up) {
  float amax = 0.f;
  for (int i = 0; i < kQ8Group; ++i) amax = std::max(amax, std::abs(x[i]));
  uint16_t bits = q8_scale_bits(amax);
  while (double(f16_bits_to_f32(bits)) * 127.0 < double(amax) && bits < 0x7BFF) ++bits;  // the next f16 up
  while (bits > 0 && double(f16_bits_to_f32(uint16_t(bits - 1))) * 127.0 >= double(amax)) --bits;
  const double s = f16_bits_to_f32(bits);
  for (int i = 0; i < kQ8Group; ++i) {
    double q = 0.0;
    if (s > 0.0) {
      const double x_i = x[i];
      q = up ? std::ceil(x_i / s) : std::floor(x_i / s);
      if (up && q * s < x_i) q += 1.0;
      if (!up && q * s > x_i) q -= 1.0;
    }
    codes[i] = int8_t(std::clamp(q, -127.0, 127.0));
  }
  return bits;
}

// Slot j of a record from x [head_dim] f32 (or, for a float kv_type, in
// x_dtype): rounded to nearest, q8_0 as `rounding` says.
void write_slot(const StoreLayout& layout, std::byte* record, int j, const std::byte* x, DType x_dtype,
                Rounding rounding) {
  const int d = layout.shape.head_dim;
  if (layout.kv_type != DType::kQ8_0) {
    convert(x, x_dtype, slot(layout, record, j), layout.kv_type, size_t(d));
    return;
  }
  const auto* values = reinterpret_cast<const float*>(x);  // q8_0 stores hand their keys over in f32
  auto* codes = reinterpret_cast<int8_t*>(record) + size_t(j) * size_t(d);
  std::byte* scales = record + size_t(layout.rep_slots) * size_t(d) + size_t(j) * size_t(d / kQ8Group) * 2;
  for (int g = 0; g < d / kQ8Group; ++g) {
    const float* group = values + g * kQ8Group;
    int8_t* group_codes = codes + g * kQ8Group;
    uint16_t bits;
    if (rounding == Rounding::kNearest) quantize_q8_groups(group, 1, group_codes, &bits, nullptr);
    else bits = quantize_q8_bound(group, group_codes, rounding == Rounding::kUp);
    std::memcpy(scales + size_t(g) * 2, &bits, 2);
  }
}

void write_slot_f32(const StoreLayout& layout, std::byte* record, int j, const float* x, Rounding rounding) {
  write_slot(layout, record, j, reinterpret_cast<const std::byte*>(x), DType::kF32, rounding);
}

int32_t* record_offsets(const StoreLayout& layout, std::byte* record) {
  return reinterpret_cast<int32_t*>(record + layout.record_offsets_offset);
}

// 4 floats as one value (GCC/Clang vector extension, one SSE2/NEON
// register): element-wise operators compile to vector instructions.
using F32x4 = float __attribute__((vector_size(16)));
F32x4 load_f32x4(const float* p) {
  F32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store_f32x4(float* p, F32x4 v) { std::memcpy(p, &v, sizeof v); }

constexpr int kTileTokens = 32;  // keys widened to f32 at a time (stays in L1)

// Runs f(keys_f32, t0, n) over the segment's keys widened to f32, in tiles
// of kTileTokens tokens, in token order.
template <typename F>
void for_each_f32_tile(const StoreLayout& layout, const Segment& seg, RepScratch& s, F&& f) {
  const size_t d = size_t(layout.shape.head_dim);
  const size_t row_bytes = d * dtype_size(seg.keys_dtype);
  for (int t0 = 0; t0 < seg.count; t0 += kTileTokens) {
    const int n = std::min(kTileTokens, seg.count - t0);
    convert(seg.keys + size_t(t0) * row_bytes, seg.keys_dtype, s.keys_f32.data(), DType::kF32, size_t(n) * d);
    f(s.keys_f32.data(), t0, n);
  }
}

// The channel-wise max and min of a block's first n keys, read from its page.
void page_extremes(const StoreLayout& layout, const std::byte* page, int n, float* mx, float* mn, RepScratch& s) {
  const size_t d = size_t(layout.shape.head_dim);
  s.block_keys.resize(d * size_t(n));
  read_keys_t(layout, view_of_page(layout, page, n), 0, n, s.block_keys.data(), size_t(n));
  for (size_t c = 0; c < d; ++c) {
    const float* row = s.block_keys.data() + c * size_t(n);
    mx[c] = *std::max_element(row, row + n);
    mn[c] = *std::min_element(row, row + n);
  }
}

// MAX (and QUEST's min in a second accumulator): start from the record, or
// from the segment's first token when the block is new; the extremes of
// stored values are stored values, so the round trip through a float kv_type
// is exact. q8_0 rounds a record's extremes outward, so reading them back and
// rounding them outward again at every append would let them drift away from
// the keys: there the extremes so far are taken from the page instead (fewer
// than block_size keys, once per append to a partial block).
template <bool kWithMin>
void update_extremes(const StoreLayout& layout, std::byte* record, const std::byte* page, const Segment& seg,
                     RepScratch& s) {
  const size_t d = size_t(layout.shape.head_dim);
  float* mx = s.acc0.data();
  float* mn = s.acc1.data();
  const bool fresh = seg.offset == 0;
  if (!fresh && layout.kv_type == DType::kQ8_0) {
    page_extremes(layout, page, seg.offset, mx, mn, s);
  } else if (!fresh) {
    convert(slot(layout, record, 0), layout.kv_type, mx, DType::kF32, d);
    if constexpr (kWithMin) convert(slot(layout, record, 1), layout.kv_type, mn, DType::kF32, d);
  }
  for_each_f32_tile(layout, seg, s, [&](const float* keys, int t0, int n) {
    int first = 0;
    if (fresh && t0 == 0) {
      std::copy_n(keys, d, mx);
      if constexpr (kWithMin) std::copy_n(keys, d, mn);
      first = 1;
    }
    // Channels in groups of 8 (head_dim is a multiple of 8) so the running
    // extremes stay in registers while the tile's tokens stream by.
    for (size_t c0 = 0; c0 < d; c0 += 8) {
      F32x4 hi0 = load_f32x4(mx + c0), hi1 = load_f32x4(mx + c0 + 4);
      F32x4 lo0 = load_f32x4(mn + c0), lo1 = load_f32x4(mn + c0 + 4);
      for (int t = first; t < n; ++t) {
        const F32x4 k0 = load_f32x4(keys + size_t(t) * d + c0), k1 = load_f32x4(keys + size_t(t) * d + c0 + 4);
        hi0 = k0 > hi0 ? k0 : hi0;
        hi1 = k1 > hi1 ? k1 : hi1;
        if constexpr (kWithMin) {
          lo0 = k0 < lo0 ? k0 : lo0;
          lo1 = k1 < lo1 ? k1 : lo1;
        }
      }
      store_f32x4(mx + c0, hi0);
      store_f32x4(mx + c0 + 4, hi1);
      if constexpr (kWithMin) {
        store_f32x4(mn + c0, lo0);
        store_f32x4(mn + c0 + 4, lo1);
      }
    }
  });
  write_slot_f32(layout, record, 0, mx, Rounding::kUp);
  if constexpr (kWithMin) write_slot_f32(layout, record, 1, mn, Rounding::kDown);
}

// MEAN: the fp32 sum lives in the record and grows token by token in token
// order, so chunked and whole appends give the same bits.
// sum[c] += rows[t][c] (kSquares: rows[t][c]^2) for t < n, one add per
// token in token order; channels in groups of 8 (head_dim is a multiple of 8)
// so the running sums stay in registers while the rows stream by.
template <bool kSquares = false>
void add_rows(float* sum, const float* rows, int n, size_t d) {
  for (size_t c0 = 0; c0 < d; c0 += 8) {
    F32x4 acc0 = load_f32x4(sum + c0), acc1 = load_f32x4(sum + c0 + 4);
    for (int t = 0; t < n; ++t) {
      const F32x4 x0 = load_f32x4(rows + size_t(t) * d + c0), x1 = load_f32x4(rows + size_t(t) * d + c0 + 4);
      acc0 += kSquares ? x0 * x0 : x0;
      acc1 += kSquares ? x1 * x1 : x1;
    }
    store_f32x4(sum + c0, acc0);
    store_f32x4(sum + c0 + 4, acc1);
  }
}

void update_mean(const StoreLayout& layout, std::byte* record, const Segment& seg, RepScratch& s) {
  const size_t d = size_t(layout.shape.head_dim);
  float* sum = reinterpret_cast<float*>(record + layout.record_sum_offset);
  if (seg.offset == 0) std::fill_n(sum, d, 0.f);
  for_each_f32_tile(layout, seg, s, [&](const float* keys, int, int n) { add_rows(sum, keys, n, d); });
  const float n_filled = float(seg.offset + seg.count);
  float* mean = s.acc0.data();
  for (size_t c = 0; c < d; ++c) mean[c] = sum[c] / n_filled;
  write_slot_f32(layout, record, 0, mean, Rounding::kNearest);
}

// Tail sums: the keys', the values' and the squared keys' fp32 sums, token by
// token in token order (like MEAN's), so chunked and whole appends give the
// same bits.
void update_tail_sums(const StoreLayout& layout, std::byte* record, const std::byte* page, const Segment& seg,
                      RepScratch& s) {
  const size_t d = size_t(layout.shape.head_dim);
  float* key_sum = reinterpret_cast<float*>(record + layout.record_tail_offset);
  float* value_sum = key_sum + d;
  float* key_sq = key_sum + 2 * d;
  if (seg.offset == 0) std::fill_n(key_sum, 3 * d, 0.f);
  for_each_f32_tile(layout, seg, s, [&](const float* keys, int, int n) {
    add_rows(key_sum, keys, n, d);
    add_rows</*kSquares=*/true>(key_sq, keys, n, d);
  });
  const BlockView view = view_of_page(layout, page, seg.offset + seg.count);
  for (int t0 = 0; t0 < seg.count; t0 += kTileTokens) {  // the values as stored, read back from the page
    const int n = std::min(kTileTokens, seg.count - t0);
    read_values(layout, view, seg.offset + t0, n, s.keys_f32.data(), d);
    add_rows(value_sum, s.keys_f32.data(), n, d);
  }
}

void update_fix(const StoreLayout& layout, std::byte* record, const Segment& seg) {
  const int bs = layout.block_size;
  const int r = layout.rep_num;
  int32_t* offsets = record_offsets(layout, record);
  if (seg.offset == 0)
    for (int j = 0; j < r; ++j) offsets[j] = fix_offset(j, bs, r);
  const size_t d = size_t(layout.shape.head_dim);
  const size_t row_bytes = d * dtype_size(seg.keys_dtype);
  for (int j = 0; j < r; ++j) {
    const int at = fix_offset(j, bs, r) - seg.offset;
    if (at >= 0 && at < seg.count)
      write_slot(layout, record, j, seg.keys + size_t(at) * row_bytes, seg.keys_dtype, Rounding::kNearest);
  }
}

}  // namespace

int valid_slots(const StoreLayout& layout, int n_filled) {
  switch (layout.rep_type) {
    case RT::kMax:
    case RT::kMean:
    case RT::kQuest:
      return n_filled > 0 ? layout.rep_slots : 0;
    case RT::kFix: {
      int valid = 0;
      while (valid < layout.rep_num && fix_offset(valid, layout.block_size, layout.rep_num) < n_filled) ++valid;
      return valid;
    }
    case RT::kDynamic:
      return std::min(n_filled, layout.rep_num);
  }
  return 0;
}

void repick_dynamic(const StoreLayout& layout, std::byte* record, const std::byte* page, int n_filled,
                    RepScratch& s) {
  const float* importance = record_importance(layout, record);
  const int picked = std::min(n_filled, layout.rep_num);
  std::vector<int>& order = s.order;
  order.resize(size_t(n_filled));
  for (int t = 0; t < n_filled; ++t) order[size_t(t)] = t;
  // Highest importance first, ties to the lower offset: a strict total order,
  // so the pick depends on the importances only.
  std::partial_sort(order.begin(), order.begin() + picked, order.end(), [importance](int a, int b) {
    return importance[a] > importance[b] || (importance[a] == importance[b] && a < b);
  });
  int32_t* offsets = record_offsets(layout, record);
  if (s.acc0.size() < size_t(layout.shape.head_dim)) s.acc0.resize(size_t(layout.shape.head_dim));
  for (int j = 0; j < layout.rep_num; ++j) {
    if (j >= picked) {
      offsets[j] = -1;
      std::fill(s.acc0.begin(), s.acc0.end(), 0.f);  // an unused slot: zeros (q8_0: zero codes and scales)
    } else {
      offsets[j] = order[size_t(j)];
      // The key of that token out of the page's K^T (one value per channel row).
      read_keys_t(layout, view_of_page(layout, page, n_filled), order[size_t(j)], 1, s.acc0.data(), 1);
    }
    write_slot_f32(layout, record, j, s.acc0.data(), Rounding::kNearest);
  }
}

void update_record(const StoreLayout& layout, std::byte* record, const std::byte* page, const Segment& seg,
                   RepScratch& scratch) {
  const size_t d = size_t(layout.shape.head_dim);
  if (scratch.acc0.size() < d) {
    scratch.acc0.resize(d);
    scratch.acc1.resize(d);
    scratch.keys_f32.resize(size_t(kTileTokens) * d);
  }
  switch (layout.rep_type) {
    case RT::kMax:
      update_extremes</*kWithMin=*/false>(layout, record, page, seg, scratch);
      break;
    case RT::kQuest:
      update_extremes</*kWithMin=*/true>(layout, record, page, seg, scratch);
      break;
    case RT::kMean:
      update_mean(layout, record, seg, scratch);
      break;
    case RT::kFix:
      update_fix(layout, record, seg);
      break;
    case RT::kDynamic: {
      float* importance = record_importance(layout, record);
      for (int t = 0; t < seg.count; ++t)
        importance[seg.offset + t] = seg.importance != nullptr ? seg.importance[t] : 0.f;
      repick_dynamic(layout, record, page, seg.offset + seg.count, scratch);
      break;
    }
  }
  if (layout.record_tail_offset != 0) update_tail_sums(layout, record, page, seg, scratch);
}

}  // namespace longctx::kvstore::detail
