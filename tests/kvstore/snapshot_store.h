// The GoogleTest-free half of the snapshot tests' helpers, shared with the
// snapshot fuzz target (tests/fuzz/snapshot_fuzz.cpp): small store configs,
// stores filled with random content, an image of a store's bytes and page
// addresses to compare, and the little-endian fields of a snapshot file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/snapshot.h"

namespace longctx::kvstore::snapshot_testing {

// The config of the snapshot tests' small stores: a representative type, kv
// type, block size and capacity, the rest fixed.
inline LongContextConfig small_config(RepresentativeType rep, DType kv_type = DType::kF16, int block_size = 4,
                                      int64_t max_seq_len = 64) {
  LongContextConfig cfg;
  cfg.block_size = block_size;
  cfg.max_seq_len = max_seq_len;
  cfg.kv_type = kv_type;
  cfg.representative_type = rep;
  cfg.representative_num = rep == RepresentativeType::kFix || rep == RepresentativeType::kDynamic ? 3
                           : rep == RepresentativeType::kQuest                                      ? 2
                                                                                                    : 1;
  cfg.chunk_size = 16;
  cfg.local_windows_len = 8;
  cfg.initial_len = 4;
  cfg.second_select_num = 2;
  cfg.preselect_block_count = 2;
  cfg.dense_layer_num = 0;
  return cfg;
}

inline const NumaTopology& topology() {
  static const NumaTopology topo = NumaTopology::detect();
  return topo;
}

// Appends n tokens (none for n <= 0) of random K, V (and, for DYNAMIC,
// importance) to one layer.
inline void append_random(KVStore& store, int layer, int64_t n, uint32_t seed) {
  if (n <= 0) return;
  const KVShape& s = store.layout().shape;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  const size_t n_values = size_t(n) * size_t(s.n_kv_heads) * size_t(s.head_dim);
  std::vector<float> k(n_values), v(n_values), importance(size_t(n) * size_t(s.n_kv_heads));
  for (float& x : k) x = value(rng);
  for (float& x : v) x = value(rng);
  for (float& x : importance) x = weight(rng);
  const TensorView k_view = make_view(k.data(), DType::kF32, {n, s.n_kv_heads, s.head_dim});
  const TensorView v_view = make_view(v.data(), DType::kF32, {n, s.n_kv_heads, s.head_dim});
  if (store.layout().rep_type == RepresentativeType::kDynamic) {
    store.append(layer, k_view, v_view, make_view(importance.data(), DType::kF32, {n, s.n_kv_heads}));
  } else {
    store.append(layer, k_view, v_view);
  }
}

// Every byte of every page and rep page, their addresses and the token counts.
struct StoreImage {
  std::vector<int64_t> n_tokens;
  std::vector<std::byte> bytes;
  std::vector<const std::byte*> addresses;
  bool operator==(const StoreImage&) const = default;
};

inline StoreImage image_of(const KVStore& store) {
  const StoreLayout& l = store.layout();
  StoreImage image;
  for (int layer = 0; layer < l.shape.n_layers; ++layer) {
    image.n_tokens.push_back(store.n_tokens(layer));
    for (int head = 0; head < l.shape.n_kv_heads; ++head) {
      for (const std::byte* page : SnapshotAccess::pages(store, layer, head)) {
        image.bytes.insert(image.bytes.end(), page, page + l.page_bytes);
        image.addresses.push_back(page);
      }
      for (const std::byte* page : SnapshotAccess::rep_pages(store, layer, head)) {
        image.bytes.insert(image.bytes.end(), page, page + l.rep_page_bytes);
        image.addresses.push_back(page);
      }
    }
  }
  return image;
}

// The little-endian field of `width` bytes at `at` of a file's bytes (std::byte or uint8_t).
template <class Byte>
uint64_t get_le(const std::vector<Byte>& f, size_t at, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= uint64_t(f[at + size_t(i)]) << (8 * i);
  return v;
}

// Writes it; the bytes past the file's end are left out.
template <class Byte>
void put_le(std::vector<Byte>& f, size_t at, uint64_t v, int width) {
  for (int i = 0; i < width && at + size_t(i) < f.size(); ++i) f[at + size_t(i)] = Byte(uint8_t(v >> (8 * i)));
}

}  // namespace longctx::kvstore::snapshot_testing
