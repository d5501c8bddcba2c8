// Test helpers for the KV store: random inputs, a plain reference of what the
// store must hold (values rounded to kv_type, representatives from their
// definitions in kv_store.h, fp64 where numerical), and readers that decode
// pages and records through the documented layout (SnapshotAccess page lists
// plus byte offsets), not through the store's accessors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/kvstore/snapshot.h"

namespace longctx::kvstore::testref {

// ---- scalar encoding (the rounding contract is longctx's scalar functions) ----

inline void encode(std::byte* base, DType dtype, size_t i, float x) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(base + 4 * i, &x, 4);
      return;
    case DType::kF16: {
      const uint16_t bits = f32_to_f16_bits(x);
      std::memcpy(base + 2 * i, &bits, 2);
      return;
    }
    case DType::kBF16: {
      const uint16_t bits = f32_to_bf16_bits(x);
      std::memcpy(base + 2 * i, &bits, 2);
      return;
    }
    case DType::kQ8_0:
      ADD_FAILURE() << "encode: q8_0 has no element encoding";
      return;
  }
}

// ---- q8_0: the documented rule (kv_store.h), written out plainly ----

// One group of 32 values: s = f16(max|x| / 127), q = clamp(nearbyint(x / s), -127, 127) (0 when s == 0).
struct Q8Group {
  uint16_t scale_bits = 0;
  int8_t q[kQ8Group] = {};
  float value(int i) const { return float(q[i]) * f16_bits_to_f32(scale_bits); }
};

inline Q8Group q8_quantize(const float* x) {
  float amax = 0.f;
  for (int i = 0; i < kQ8Group; ++i) amax = std::max(amax, std::fabs(x[i]));
  Q8Group g;
  g.scale_bits = f32_to_f16_bits(amax / 127.f);
  const float s = f16_bits_to_f32(g.scale_bits);
  for (int i = 0; i < kQ8Group; ++i) {
    const float q = s > 0.f ? std::nearbyint(x[i] / s) : 0.f;
    g.q[i] = int8_t(std::min(127.f, std::max(-127.f, q)));
  }
  return g;
}

inline float decode(const std::byte* base, DType dtype, size_t i) {
  if (dtype == DType::kF32) {
    float x;
    std::memcpy(&x, base + 4 * i, 4);
    return x;
  }
  uint16_t bits;
  std::memcpy(&bits, base + 2 * i, 2);
  return dtype == DType::kF16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

// A MAX / QUEST slot's group on q8_0, rounded outward (kv_store.h): the
// smallest f16 s with 127 s >= max |x|, then per value the smallest code q
// with q s >= x (up) or the largest with q s <= x (down), found by counting.
inline Q8Group q8_quantize_outward(const float* x, bool up) {
  double amax = 0.0;
  for (int i = 0; i < kQ8Group; ++i) amax = std::max(amax, std::fabs(double(x[i])));
  Q8Group g;
  g.scale_bits = 0;
  while (127.0 * f16_bits_to_f32(g.scale_bits) < amax) ++g.scale_bits;
  const double s = f16_bits_to_f32(g.scale_bits);
  for (int i = 0; i < kQ8Group; ++i) {
    int q = up ? -127 : 127;
    if (s == 0.0) q = 0;
    else if (up) while (q < 127 && q * s < x[i]) ++q;
    else while (q > -127 && q * s > x[i]) --q;
    g.q[i] = int8_t(q);
  }
  return g;
}

// Bytes of a record's key slots before padding: rep_slots vectors of d values.
inline size_t slot_stride_bytes(DType rep, int d) { return rep == DType::kQ8_0 ? size_t(d) : size_t(d) * dtype_size(rep); }

inline float round_to(DType dtype, float x) {
  std::byte buf[4]{};
  encode(buf, dtype, 0, x);
  return decode(buf, dtype, 0);
}

// Unit roundoff (half the machine epsilon) and half the smallest subnormal.
inline double unit_roundoff(DType dtype) {
  return dtype == DType::kF32 ? std::ldexp(1.0, -24) : dtype == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}
inline double half_min_subnormal(DType dtype) {
  return dtype == DType::kF32 ? std::ldexp(1.0, -150) : dtype == DType::kF16 ? std::ldexp(1.0, -25) : std::ldexp(1.0, -134);
}

// ---- a store with everything it needs -------------------------------------------

struct TestStore {
  KVShape shape;
  LongContextConfig config;
  std::unique_ptr<NumaTopology> topology;
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<KVStore> store;
};

inline LongContextConfig small_config(int block_size, DType kv_type, RepresentativeType rep, int rep_num,
                                      int64_t max_seq_len) {
  LongContextConfig c;
  c.block_size = block_size;
  c.kv_type = kv_type;
  c.representative_type = rep;
  c.representative_num = rep_num;
  c.max_seq_len = max_seq_len;
  c.initial_len = 0;
  c.local_windows_len = 0;
  return c;
}

inline TestStore make_store(const KVShape& shape, const LongContextConfig& config,
                            uint64_t budget_bytes = uint64_t{1} << 34, const std::string& topology = "") {
  TestStore t;
  t.shape = shape;
  t.config = config;
  t.topology = std::make_unique<NumaTopology>(topology.empty() ? NumaTopology::detect()
                                                               : NumaTopology::synthetic(topology));
  t.budget = std::make_unique<MemoryBudget>(budget_bytes);
  t.store = std::make_unique<KVStore>(shape, config, *t.budget, *t.topology);
  return t;
}

// ---- inputs ------------------------------------------------------------------------

// K or V of n tokens, [n, heads, dim] in `dtype`, optionally laid out with
// padded (non-contiguous) strides; `values` holds the decoded inputs.
struct Input {
  DType dtype = DType::kF32;
  int64_t n = 0;
  int heads = 0, dim = 0;
  std::vector<std::byte> buffer;
  TensorView view;
  std::vector<float> values;  // [n][heads][dim]
  float at(int64_t t, int h, int c) const { return values[(size_t(t) * heads + h) * dim + c]; }
};

// Values with full f32 mantissas in [-8, 8], a few tiny ones (f16 subnormals)
// and exact ties, so rounding and max/min ties are exercised.
inline float random_value(std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-8.f, 8.f);
  const uint32_t kind = rng() % 16;
  if (kind == 0) return uni(rng) * 1e-6f;
  if (kind == 1) return 0.5f;
  return uni(rng);
}

inline Input random_input(std::mt19937& rng, int64_t n, int heads, int dim, DType dtype, bool strided) {
  Input in;
  in.dtype = dtype;
  in.n = n;
  in.heads = heads;
  in.dim = dim;
  const int64_t row = strided ? dim + 8 : dim;               // head stride
  const int64_t tok = strided ? heads * row + 3 : heads * row;  // token stride
  const size_t es = dtype_size(dtype);
  in.buffer.assign(size_t(std::max<int64_t>(n, 1) * tok) * es, std::byte{0x7f});  // padding is garbage
  in.values.resize(size_t(n) * heads * dim);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < dim; ++c) {
        const size_t at = size_t(t * tok + h * row + c);
        encode(in.buffer.data(), dtype, at, random_value(rng));
        in.values[(size_t(t) * heads + h) * dim + c] = decode(in.buffer.data(), dtype, at);
      }
  in.view.data = in.buffer.data();
  in.view.dtype = dtype;
  in.view.rank = 3;
  in.view.shape = {n, heads, dim, 0};
  in.view.strides = {tok, row, 1, 0};
  return in;
}

// Tokens [begin, end) of a [n, ...] view.
inline TensorView slice_tokens(const TensorView& view, int64_t begin, int64_t end) {
  TensorView s = view;
  s.data = static_cast<const std::byte*>(view.data) + begin * view.strides[0] * int64_t(dtype_size(view.dtype));
  s.shape[0] = end - begin;
  return s;
}

// Importances with many exact ties (DYNAMIC breaks them by offset).
inline std::vector<float> random_importance(std::mt19937& rng, int64_t n, int heads) {
  static const float kLevels[] = {0.f, 0.25f, 0.5f, 1.f, 2.f, -1.f, 3.75f};
  std::vector<float> imp(size_t(n) * heads);
  for (auto& x : imp) x = kLevels[rng() % 7];
  return imp;
}

inline TensorView importance_view(const std::vector<float>& imp, int64_t begin, int64_t end, int heads) {
  return make_view(imp.data() + size_t(begin) * heads, DType::kF32, {end - begin, heads});
}

// ---- the reference store ----------------------------------------------------------

struct RefHead {
  std::vector<float> k, v;        // [n][dim], rounded to kv_type (q8_0: dequantized)
  std::vector<float> importance;  // [n], fp32 sums in call order
  std::vector<Q8Group> kq, vq;    // q8_0: [n][dim / 32] groups
};

struct RefLayer {
  int64_t n = 0;
  std::vector<RefHead> heads;
};

inline void ref_append(RefLayer& ref, const Input& k, const Input& v, int64_t begin, int64_t end,
                       const float* importance /* [n][heads] of the whole input, or null */, DType kv_type) {
  if (ref.heads.empty()) ref.heads.resize(size_t(k.heads));
  for (int h = 0; h < k.heads; ++h) {
    RefHead& rh = ref.heads[size_t(h)];
    for (int64_t t = begin; t < end; ++t) {
      if (kv_type == DType::kQ8_0) {
        for (int c0 = 0; c0 < k.dim; c0 += kQ8Group) {
          float xk[kQ8Group], xv[kQ8Group];
          for (int i = 0; i < kQ8Group; ++i) xk[i] = k.at(t, h, c0 + i), xv[i] = v.at(t, h, c0 + i);
          rh.kq.push_back(q8_quantize(xk));
          rh.vq.push_back(q8_quantize(xv));
          for (int i = 0; i < kQ8Group; ++i) rh.k.push_back(rh.kq.back().value(i));
          for (int i = 0; i < kQ8Group; ++i) rh.v.push_back(rh.vq.back().value(i));
        }
      } else {
        for (int c = 0; c < k.dim; ++c) {
          rh.k.push_back(round_to(kv_type, k.at(t, h, c)));
          rh.v.push_back(round_to(kv_type, v.at(t, h, c)));
        }
      }
      rh.importance.push_back(importance != nullptr ? importance[size_t(t) * k.heads + h] : 0.f);
    }
  }
  ref.n += end - begin;
}

inline void ref_add_importance(RefLayer& ref, int64_t first, const std::vector<float>& delta, int heads) {
  const int64_t n = int64_t(delta.size()) / heads;
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < n; ++t) ref.heads[size_t(h)].importance[size_t(first + t)] += delta[size_t(t) * heads + h];
}

// Raw bytes of block b's page and record, found through the documented layout.
inline const std::byte* page_of(const KVStore& s, int layer, int h, int64_t b) {
  return SnapshotAccess::pages(s, layer, h).at(size_t(b));
}
inline const std::byte* record_of(const KVStore& s, int layer, int h, int64_t b) {
  const StoreLayout& L = s.layout();
  return SnapshotAccess::rep_pages(s, layer, h).at(size_t(b) / L.records_per_rep_page) +
         (size_t(b) % L.records_per_rep_page) * L.record_bytes;
}

// The page block b must hold, byte for byte.
inline std::vector<std::byte> expected_page(const StoreLayout& L, const RefHead& rh, int64_t n, int64_t b) {
  const int bs = L.block_size, d = L.shape.head_dim;
  std::vector<std::byte> page(L.page_bytes, std::byte{0});
  if (L.kv_type == DType::kQ8_0) {
    // codes K^T [d/4][bs][4], K scales [d/32][bs], codes V [ceil(bs/4)][d][4], V scales [bs][d/32], back to back
    const int groups = d / kQ8Group;
    std::byte* k_scales = page.data() + size_t(bs) * d;
    std::byte* v_codes = k_scales + size_t(bs) * groups * 2;
    std::byte* v_scales = v_codes + size_t((bs + 3) / 4 * 4) * d;
    for (int t = 0; t < bs && b * bs + t < n; ++t)
      for (int g = 0; g < groups; ++g) {
        const Q8Group& kg = rh.kq[(size_t(b) * bs + t) * groups + g];
        const Q8Group& vg = rh.vq[(size_t(b) * bs + t) * groups + g];
        std::memcpy(k_scales + (size_t(g) * bs + t) * 2, &kg.scale_bits, 2);
        std::memcpy(v_scales + (size_t(t) * groups + g) * 2, &vg.scale_bits, 2);
        for (int i = 0; i < kQ8Group; ++i) {
          const int c = g * kQ8Group + i;
          page[(size_t(c / 4) * bs + t) * 4 + c % 4] = std::byte(uint8_t(kg.q[i]));
          v_codes[(size_t(t / 4) * d + c) * 4 + t % 4] = std::byte(uint8_t(vg.q[i]));
        }
      }
    return page;
  }
  std::byte* v_base = page.data() + size_t(bs) * d * dtype_size(L.kv_type);
  for (int t = 0; t < bs && b * bs + t < n; ++t)
    for (int c = 0; c < d; ++c) {
      const size_t src = (size_t(b) * bs + t) * d + c;
      encode(page.data(), L.kv_type, size_t(c) * bs + t, rh.k[src]);
      encode(v_base, L.kv_type, size_t(t) * d + c, rh.v[src]);
    }
  return page;
}

// The record block b must hold, byte for byte. MEAN's sum and mean are not
// exact by definition: they are checked against fp64 bounds (failures go to
// `problems`) and then copied from `actual`.
inline std::vector<std::byte> expected_record(const StoreLayout& L, const RefHead& rh, int64_t n, int64_t b,
                                              const std::byte* actual, std::string& problems) {
  const int bs = L.block_size, d = L.shape.head_dim, R = L.rep_num;
  const int n_filled = int(std::min<int64_t>(bs, n - b * bs));
  const DType rep = L.kv_type;  // records keep their keys in kv_type
  const bool q8 = rep == DType::kQ8_0;
  const size_t key_bytes = slot_stride_bytes(rep, d);
  std::vector<std::byte> rec(L.record_bytes, std::byte{0});
  auto key = [&](int t, int c) { return rh.k[(size_t(b) * bs + t) * d + c]; };
  // Slot j from d values: float types rounded to nearest; q8_0 codes at j * d,
  // f16 scales after all rep_slots * d codes, groups rounded as `round` says
  // (0 nearest, 1 up, -1 down).
  auto put_slot = [&](int j, const std::vector<float>& x, int round) {
    if (!q8) {
      for (int c = 0; c < d; ++c) encode(rec.data() + j * key_bytes, rep, size_t(c), x[size_t(c)]);
      return;
    }
    for (int g = 0; g < d / kQ8Group; ++g) {
      const float* group = x.data() + g * kQ8Group;
      const Q8Group q = round == 0 ? q8_quantize(group) : q8_quantize_outward(group, round > 0);
      for (int i = 0; i < kQ8Group; ++i) rec[size_t(j) * d + size_t(g) * kQ8Group + i] = std::byte(uint8_t(q.q[i]));
      std::memcpy(rec.data() + size_t(L.rep_slots) * d + (size_t(j) * (d / kQ8Group) + g) * 2, &q.scale_bits, 2);
    }
  };
  auto put_key = [&](int slot, int t) {
    std::vector<float> x(static_cast<size_t>(d));
    for (int c = 0; c < d; ++c) x[size_t(c)] = key(t, c);
    put_slot(slot, x, 0);
  };
  auto put_i32 = [&](size_t offset, int j, int32_t x) { std::memcpy(rec.data() + offset + 4 * size_t(j), &x, 4); };

  switch (L.rep_type) {
    case RepresentativeType::kMax:
    case RepresentativeType::kQuest: {
      std::vector<float> mx(static_cast<size_t>(d)), mn(static_cast<size_t>(d));
      for (int c = 0; c < d; ++c) {
        double hi = -INFINITY, lo = INFINITY;
        for (int t = 0; t < n_filled; ++t) hi = std::max<double>(hi, key(t, c)), lo = std::min<double>(lo, key(t, c));
        mx[size_t(c)] = float(hi), mn[size_t(c)] = float(lo);
      }
      put_slot(0, mx, 1);
      if (L.rep_type == RepresentativeType::kQuest) put_slot(1, mn, -1);
      break;
    }
    case RepresentativeType::kMean: {
      const double u32 = unit_roundoff(DType::kF32), ukv = unit_roundoff(rep);
      const double gamma = (n_filled - 1) * u32 / (1 - (n_filled - 1) * u32);
      for (int c = 0; c < d; ++c) {
        double sum = 0, abs_sum = 0;
        for (int t = 0; t < n_filled; ++t) sum += key(t, c), abs_sum += std::fabs(key(t, c));
        float stored_sum;
        std::memcpy(&stored_sum, actual + L.record_sum_offset + 4 * size_t(c), 4);
        // Recursive fp32 summation: |fl(S) - S| <= gamma_{n-1} * sum |k|.
        if (!(std::fabs(stored_sum - sum) <= gamma * abs_sum))
          problems += "sum[" + std::to_string(c) + "] " + std::to_string(stored_sum) + " vs " + std::to_string(sum) + "; ";
        // mean = rnd_kv(fl32(fl(S) / n)): the sum's error, one fp32 division, one kv_type rounding
        // (q8_0: at most 0.5 of the group's scale, a little more where a code is clamped at 127).
        const double m = sum / n_filled;
        const double e_sum = gamma * abs_sum / n_filled;
        const double e_div = e_sum + u32 * (std::fabs(m) + e_sum);
        double tol = e_div + ukv * (std::fabs(m) + e_div) + half_min_subnormal(rep);
        float stored_mean;
        if (q8) {
          uint16_t bits;
          std::memcpy(&bits, actual + size_t(L.rep_slots) * d + size_t(c / kQ8Group) * 2, 2);
          const double scale = f16_bits_to_f32(bits);
          stored_mean = float(double(int8_t(actual[size_t(c)])) * scale);
          tol = e_div + 0.57 * scale;
        } else {
          stored_mean = decode(actual, rep, size_t(c));
        }
        if (!(std::fabs(stored_mean - m) <= tol))
          problems += "mean[" + std::to_string(c) + "] " + std::to_string(stored_mean) + " vs " + std::to_string(m) + "; ";
      }
      std::memcpy(rec.data(), actual, q8 ? size_t(d) + size_t(d / kQ8Group) * 2 : key_bytes);  // the one slot
      std::memcpy(rec.data() + L.record_sum_offset, actual + L.record_sum_offset, size_t(d) * 4);
      break;
    }
    case RepresentativeType::kFix:
      for (int j = 0; j < R; ++j) {
        const int offset = int(int64_t(j) * bs / R);
        put_i32(L.record_offsets_offset, j, offset);
        if (offset < n_filled) put_key(j, offset);
      }
      break;
    case RepresentativeType::kDynamic: {
      std::vector<int> order(static_cast<size_t>(n_filled));
      std::iota(order.begin(), order.end(), 0);
      const float* imp = rh.importance.data() + size_t(b) * bs;
      std::stable_sort(order.begin(), order.end(), [imp](int a, int c) { return imp[a] > imp[c]; });
      for (int t = 0; t < n_filled; ++t) std::memcpy(rec.data() + L.record_importance_offset + 4 * size_t(t), &imp[t], 4);
      for (int j = 0; j < R; ++j) {
        if (j < n_filled) {
          put_i32(L.record_offsets_offset, j, order[size_t(j)]);
          put_key(j, order[size_t(j)]);
        } else {
          put_i32(L.record_offsets_offset, j, -1);
        }
      }
      break;
    }
  }
  if (L.record_tail_offset != 0) {  // tail sums: fp32 sums in token order, within the fp64 bound, then copied
    const double u32 = unit_roundoff(DType::kF32);
    const double gamma = (n_filled + 1) * u32 / (1 - (n_filled + 1) * u32);  // + the square's rounding
    const char* names[3] = {"tail key sum[", "tail value sum[", "tail key square sum["};
    for (int part = 0; part < 3; ++part) {
      const std::vector<float>& x = part == 1 ? rh.v : rh.k;
      for (int c = 0; c < d; ++c) {
        double sum = 0, abs_sum = 0;
        for (int t = 0; t < n_filled; ++t) {
          const double v = x[(size_t(b) * bs + t) * d + c];
          const double term = part == 2 ? v * v : v;
          sum += term, abs_sum += std::fabs(term);
        }
        float stored;
        std::memcpy(&stored, actual + L.record_tail_offset + 4 * (size_t(part) * d + c), 4);
        if (!(std::fabs(stored - sum) <= gamma * abs_sum))
          problems += std::string(names[part]) + std::to_string(c) + "] " + std::to_string(stored) + " vs " +
                      std::to_string(sum) + "; ";
      }
    }
    std::memcpy(rec.data() + L.record_tail_offset, actual + L.record_tail_offset, 3 * size_t(d) * 4);
  }
  return rec;
}

// Slots the record of a block holding n_filled tokens must call valid.
inline int expected_valid_slots(const StoreLayout& L, int n_filled) {
  switch (L.rep_type) {
    case RepresentativeType::kMax:
    case RepresentativeType::kMean:
      return 1;
    case RepresentativeType::kQuest:
      return 2;
    case RepresentativeType::kFix: {
      int valid = 0;
      for (int j = 0; j < L.rep_num; ++j) valid += int64_t(j) * L.block_size / L.rep_num < n_filled ? 1 : 0;
      return valid;
    }
    case RepresentativeType::kDynamic:
      return std::min(n_filled, L.rep_num);
  }
  return -1;
}

// Every page and record of `layer` against the reference, plus the accessors
// pointing where the layout says.
inline ::testing::AssertionResult layer_matches(const KVStore& s, int layer, const RefLayer& ref) {
  const StoreLayout& L = s.layout();
  if (s.n_tokens(layer) != ref.n)
    return ::testing::AssertionFailure() << "layer " << layer << " n_tokens " << s.n_tokens(layer) << " vs " << ref.n;
  const int64_t blocks = (ref.n + L.block_size - 1) / L.block_size;
  if (s.n_blocks(layer) != blocks) return ::testing::AssertionFailure() << "n_blocks " << s.n_blocks(layer);
  for (int h = 0; h < L.shape.n_kv_heads; ++h) {
    if (SnapshotAccess::pages(s, layer, h).size() != size_t(blocks))
      return ::testing::AssertionFailure() << "layer " << layer << " head " << h << " has "
                                           << SnapshotAccess::pages(s, layer, h).size() << " pages";
    for (int64_t b = 0; b < blocks; ++b) {
      const RefHead& rh = ref.heads[size_t(h)];
      const std::byte* page = page_of(s, layer, h, b);
      const auto want_page = expected_page(L, rh, ref.n, b);
      if (std::memcmp(page, want_page.data(), L.page_bytes) != 0) {
        size_t at = 0;
        while (page[at] == want_page[at]) ++at;
        return ::testing::AssertionFailure() << "layer " << layer << " head " << h << " block " << b
                                             << ": page differs at byte " << at << " of " << L.page_bytes;
      }
      const BlockView view = s.block(layer, h, b);
      const int n_filled = int(std::min<int64_t>(L.block_size, ref.n - b * L.block_size));
      const size_t v_at = L.kv_type == DType::kQ8_0
                              ? size_t(L.block_size) * (L.shape.head_dim + L.shape.head_dim / kQ8Group * 2)
                              : size_t(L.block_size) * L.shape.head_dim * dtype_size(L.kv_type);
      if (view.k_t != page || view.v != page + v_at || view.n_filled != n_filled)
        return ::testing::AssertionFailure() << "block() view of layer " << layer << " head " << h << " block " << b;
      const std::byte* rec = record_of(s, layer, h, b);
      if (s.rep_record(layer, h, b) != rec)
        return ::testing::AssertionFailure() << "rep_record() of block " << b << " is not where the layout says";
      std::string problems;
      const auto want_rec = expected_record(L, rh, ref.n, b, rec, problems);
      if (!problems.empty())
        return ::testing::AssertionFailure() << "layer " << layer << " head " << h << " block " << b << ": " << problems;
      if (std::memcmp(rec, want_rec.data(), L.record_bytes) != 0) {
        size_t at = 0;
        while (rec[at] == want_rec[at]) ++at;
        return ::testing::AssertionFailure() << "layer " << layer << " head " << h << " block " << b << " (n_filled "
                                             << n_filled << "): record differs at byte " << at << " of "
                                             << L.record_bytes;
      }
      if (s.valid_rep_slots(layer, h, b) != expected_valid_slots(L, n_filled))
        return ::testing::AssertionFailure() << "valid_rep_slots " << s.valid_rep_slots(layer, h, b) << " vs "
                                             << expected_valid_slots(L, n_filled);
    }
  }
  return ::testing::AssertionSuccess();
}

// Token counts and the bytes of every page and record, for before/after checks.
struct StoreBytes {
  std::vector<int64_t> n_tokens;
  std::vector<std::vector<std::byte>> blobs;
  bool operator==(const StoreBytes&) const = default;
};

inline StoreBytes store_bytes(const KVStore& s) {
  const StoreLayout& L = s.layout();
  StoreBytes out;
  for (int layer = 0; layer < L.shape.n_layers; ++layer) {
    out.n_tokens.push_back(s.n_tokens(layer));
    for (int h = 0; h < L.shape.n_kv_heads; ++h) {
      const auto& pages = SnapshotAccess::pages(s, layer, h);
      for (size_t b = 0; b < pages.size(); ++b) {
        out.blobs.emplace_back(pages[b], pages[b] + L.page_bytes);
        const std::byte* rec = record_of(s, layer, h, int64_t(b));
        out.blobs.emplace_back(rec, rec + L.record_bytes);
      }
    }
  }
  return out;
}

}  // namespace longctx::kvstore::testref
