// The per-layer block KV cache of a sequence, in NUMA-placed DRAM pages.
//
// Memory layout (elements in the storage dtype `kv_type`, es = its size; for
// q8_0 the elements are int8 codes, es = 1, with scales beside them):
//
//   One *block page* per (layer, kv head, block of block_size tokens):
//     K^T  [head_dim][block_size]   at byte 0: key of token t, channel c at
//                                   element c*block_size + t (channel-major: a
//                                   vector load of channel c covers consecutive
//                                   tokens, so one query scores many tokens per load)
//                                   q8_0 (since snapshot format 5): the codes in
//                                   quads of channels, [head_dim/4][block_size][4]:
//                                   channel c of token t at byte
//                                   (c/4*block_size + t)*4 + c%4 (q8_key_code_offset),
//                                   the four bytes an integer dot product
//                                   (vpdpbusd) sums per 32-bit lane
//     q8_0: K scales f16 [head_dim/32][block_size] at page_k_scales: the scale
//                                   of channels [32 j, 32 j + 32) of token t at j*block_size + t
//     V    [block_size][head_dim]   at page_v: value of token t, channel c at
//                                   element t*head_dim + c
//                                   q8_0 (since snapshot format 5): the codes in
//                                   quads of tokens, [ceil(block_size/4)][head_dim][4]:
//                                   channel c of token t at byte
//                                   (t/4*head_dim + c)*4 + t%4 (q8_value_code_offset);
//                                   the slots past block_size are zero
//     q8_0: V scales f16 [block_size][head_dim/32] at page_v_scales
//   Page bytes = the parts back to back, rounded up to 64; pages are 64-byte
//   aligned. Unfilled token slots of the last (partial) block and the padding
//   are zero.
//
//   q8_0 (llama.cpp's q8_0 KV: 8.5 bits per value): each group of 32
//   consecutive channels of one token's key (or value) vector is stored as
//   int8 codes q and one f16 scale s, value = q * s, with
//     s = f16(max |x| / 127)  (rounded to nearest even),
//     q = clamp(nearbyint(x / s), -127, 127), or 0 when s == 0.
//   Per 32 channels rather than per token: an outlier channel of a key
//   coarsens its own group only. Appending to a q8_0 store refuses a value that
//   is not finite or whose group's scale would not fit f16 (|x| > ~8.3e6).
//
//   One *representative record* per (layer, kv head, block). Records are
//   packed `records_per_rep_page` = max(1, 65536 / record_bytes) to a rep page
//   so that scoring streams them: block b is record b % records_per_rep_page
//   of rep page b / records_per_rep_page. Every part of a record starts at a
//   64-byte boundary (records are 64-byte aligned), in this order:
//     keys        at 0                         [rep_slots][head_dim] kv_type
//                                              (since snapshot format 4; version 3
//                                              kept f16 for q8_0): the vectors scored
//                                              (rep_slots: 1 MAX/MEAN, 2 QUEST, R FIX/DYNAMIC);
//                                              q8_0: the rep_slots * head_dim int8
//                                              codes, then one f16 scale per 32 of
//                                              them (slot j's at j * head_dim / 32)
//     sum         at record_sum_offset         MEAN only: [head_dim] f32
//     importance  at record_importance_offset  DYNAMIC only: [block_size] f32
//     offsets     at record_offsets_offset     FIX/DYNAMIC: [R] i32 token
//                                              offset (in the block) of each slot
//     tail sums   at record_tail_offset        tail: estimate only: [3][head_dim]
//                                              f32: the keys' sum, the values' sum,
//                                              the squared keys' sum
//   Record bytes = end of the last part rounded up to 64. Bytes of a part that
//   hold nothing (padding, slots not yet valid) are zero, except DYNAMIC's
//   unused offsets, which are -1.
//
//   Definitions, over the n_filled tokens the block holds, keys *as stored*
//   (rounded to kv_type; q8_0: the dequantized q * s), so a partial block
//   always describes what it holds; a slot is then rounded to kv_type:
//   f32/f16/bf16 to nearest (the extremes of stored values are stored values,
//   so MAX and QUEST slots are exact), q8_0 as a q8_0 store quantizes a key
//   vector, except that the extremes are rounded outward so they stay bounds
//   of the stored keys: per group of 32, the scale is the smallest f16 s with
//   127 s >= max |x|, a max slot's codes are the smallest q with q s >= x and
//   a min slot's the largest q with q s <= x. (A q8_0 record is 0.6x the
//   bytes of an f16 one, and scoring streams the records.)
//     MAX      slot 0 = channel-wise max.
//     QUEST    slot 0 = channel-wise max, slot 1 = channel-wise min (so the
//              QUEST bound q.max+ + q.min- is an upper bound of q.k for every
//              stored key, exact where the slots are).
//     MEAN     sum = fp32 running sum of the stored keys, added token by token
//              in token order; slot 0 = (sum / n_filled in fp32) rounded to kv_type.
//     FIX      offsets[j] = floor(j * block_size / R), written when the block
//              gets its first token; slot j = the key at offsets[j] once that
//              token exists (zero before).
//     DYNAMIC  importance[t] = fp32 sum, in call order, of the importances
//              given for token t (append, then add_importance; 0 when none was
//              given); slots 0..min(n_filled, R)-1 = the keys of the tokens of
//              highest importance, highest first (ties: lower offset first),
//              offsets[j] = their token offsets.
//     tail sums  (any type, with tail: estimate) fp32 running sums of the
//              stored keys, of the stored values (q8_0: dequantized) and of
//              the keys' squares (per channel), added token by token in token
//              order; policy/tail.h turns them into the block's mean key,
//              mean value and per-channel key variance.
//   valid slots: MAX/MEAN/QUEST all once the block has a token; FIX the slots
//   whose offset < n_filled; DYNAMIC min(n_filled, R).
//
// kv heads are spread over NUMA nodes (place_kv_heads); all pages of one kv
// head come from the pools of its node.
//
// Threads: append/add_importance on different layers may run concurrently;
// reads of a layer must not overlap a write to the same layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/block_pool.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"

namespace longctx::kvstore {

// The attention shape of the model the store serves.
struct KVShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
};

// The largest head_dim a store takes.
constexpr int kMaxHeadDim = 512;

// Channels per q8_0 scale.
constexpr int kQ8Group = 32;

// Key channels a q8_0 page keeps side by side per token (the page layout above).
constexpr int kQ8KeyQuad = 4;

// The byte of key channel c of token t among a q8_0 page's K codes.
constexpr size_t q8_key_code_offset(int block_size, int c, int t) {
  return (size_t(c / kQ8KeyQuad) * size_t(block_size) + size_t(t)) * kQ8KeyQuad + size_t(c % kQ8KeyQuad);
}

// Tokens a q8_0 page keeps side by side per value channel (the page layout above).
constexpr int kQ8ValueQuad = 4;

// The byte of value channel c of token t among a q8_0 page's V codes.
constexpr size_t q8_value_code_offset(int head_dim, int c, int t) {
  return (size_t(t / kQ8ValueQuad) * size_t(head_dim) + size_t(c)) * kQ8ValueQuad + size_t(t % kQ8ValueQuad);
}

// Bytes of one token's key (or value) vector of one kv head in `kv_type`:
// head_dim * es, or for q8_0 head_dim codes + head_dim / 32 f16 scales.
size_t kv_vector_bytes(DType kv_type, int head_dim);

// Sizes derived from a shape and a config; what preflight and snapshots check.
struct StoreLayout {
  KVShape shape;
  int block_size = 0;
  DType kv_type = DType::kF16;
  // Parts of a block page, bytes from its start (K^T at 0); the scales are 0 unless q8_0.
  size_t page_k_scales = 0;
  size_t page_v = 0;
  size_t page_v_scales = 0;
  RepresentativeType rep_type = RepresentativeType::kQuest;
  int rep_num = 0;            // R as configured
  int rep_slots = 0;          // key vectors per record: 1 MAX/MEAN, 2 QUEST, R FIX/DYNAMIC
  size_t page_bytes = 0;      // one block page
  size_t record_bytes = 0;    // one representative record
  size_t records_per_rep_page = 0;
  size_t rep_page_bytes = 0;  // records_per_rep_page * record_bytes
  // Offsets inside a record (bytes); 0 where the part does not exist.
  size_t record_sum_offset = 0;
  size_t record_importance_offset = 0;
  size_t record_offsets_offset = 0;
  size_t record_tail_offset = 0;  // tail: estimate; 0 = the record has no tail sums

  // Throws Error(kInvalidArgument) naming the field for a shape or config it
  // cannot hold: n_layers or n_kv_heads < 1, head_dim not a multiple of 8 in
  // [8, 512] (of 32 for q8_0), block_size < 1, representative_num outside
  // [1, block_size] for FIX/DYNAMIC (ignored for the other types).
  static StoreLayout make(const KVShape& shape, const LongContextConfig& config);
};

// What the store needs for max_seq_len tokens, computed before any allocation.
struct Preflight {
  uint64_t kv_bytes_per_token_per_layer = 0;  // K+V of all kv heads
  uint64_t rep_bytes_per_block_per_layer = 0; // records of all kv heads
  uint64_t blocks_per_head = 0;               // per layer, for max_seq_len
  uint64_t total_bytes = 0;                   // slabs on all nodes, pages + rep pages
  std::vector<uint64_t> bytes_per_node;       // slabs per node index (size: highest node + 1)
  StoreLayout layout;                         // what it was computed for
  int64_t max_seq_len = 0;
  // "KV store for 131072 tokens x 32 layers: 16.12 GiB (128.00 KiB per token;
  // 8 kv heads x 128 dims f16 + QUEST reps)"
  std::string describe() const;
};

// Exact bytes of slabs (BlockPool::slab_bytes_for, per node and page size) the
// store maps when every layer holds max_seq_len tokens; head_nodes[h] is the
// node index of kv head h (place_kv_heads).
Preflight preflight(const StoreLayout& layout, int64_t max_seq_len, const std::vector<int>& head_nodes);

// Token ranges of one layer's cache. context = [initial_end, local_begin) with
// initial_end = min(initial_len, n_tokens) and
// local_begin = max(initial_end, n_tokens - local_windows_len).
struct Partition {
  int64_t n_tokens = 0;
  int64_t initial_end = 0;          // [0, initial_end): sinks, always attended
  int64_t local_begin = 0;          // [local_begin, n_tokens): local window
  int64_t first_context_block = 0;  // blocks intersecting the context range
  int64_t end_context_block = 0;    // (one past the last); equal when the range is empty
  // The context blocks a selection ranks: those wholly inside the context
  // range, [first_ranked_block, end_ranked_block), equal when there are none.
  // The context tokens of the others (the first when the sinks end inside it,
  // the last when the local window begins inside it or when it is the partial
  // last block) are always attended, as the sinks and the window are: a
  // representative of the whole block would rank it by keys attended anyway,
  // and a ranked partial block would take a slot that "the rest" is owed.
  int64_t first_ranked_block = 0;
  int64_t end_ranked_block = 0;

  // The partition of n_tokens with the given sinks' end and local window's begin.
  static Partition of(int64_t n_tokens, int64_t initial_end, int64_t local_begin, int block_size);
  // Tokens (absolute indices) of block b inside the context range: the block's
  // range clipped to it; begin == end when the block lies outside.
  int64_t context_begin_of(int64_t block, int block_size) const;
  int64_t context_end_of(int64_t block, int block_size) const;
  // [ranked_begin, ranked_end): the tokens of the ranked blocks; both n_tokens
  // when there are none. Every other token is attended without ranking.
  int64_t ranked_begin(int block_size) const;
  int64_t ranked_end(int block_size) const;
};

struct BlockView {
  const std::byte* k_t = nullptr;  // [head_dim][block_size]; q8_0: codes [head_dim / 4][block_size][4]
  const std::byte* v = nullptr;    // [block_size][head_dim]; q8_0: codes [ceil(block_size / 4)][head_dim][4]
  const uint16_t* k_scales = nullptr;  // q8_0: f16 [head_dim / 32][block_size]; else null
  const uint16_t* v_scales = nullptr;  // q8_0: f16 [block_size][head_dim / 32]; else null
  int n_filled = 0;                // tokens present (block_size unless last block)
};

// The view of a block page holding n_filled tokens.
BlockView view_of_page(const StoreLayout& layout, const std::byte* page, int n_filled);

struct MemoryStats {
  uint64_t reserved_bytes = 0;  // slabs mapped, all pools
  uint64_t used_bytes = 0;      // pages in use, all pools
  uint64_t budget_bytes = 0;
  uint64_t budget_used_bytes = 0;
  std::vector<uint64_t> reserved_bytes_per_node;  // index = node index
};

class KVStore {
 public:
  // Runs preflight for config.max_seq_len and throws Error(kOutOfMemory) with
  // the bytes needed and available before allocating anything. Pools map
  // slabs lazily, as blocks are needed. `budget` and `topology` must outlive
  // the store.
  KVStore(const KVShape& shape, const LongContextConfig& config, MemoryBudget& budget,
          const NumaTopology& topology);
  // The store keeps a reference to the topology: a temporary (such as
  // NumaTopology::detect() written in the call) would dangle.
  KVStore(const KVShape&, const LongContextConfig&, MemoryBudget&, NumaTopology&&) = delete;
  ~KVStore();
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;

  // The budget the store draws from; an owner counts its own buffers for the
  // store's tokens there too (the device path's host staging).
  MemoryBudget& budget() const { return budget_; }

  // Appends n tokens to `layer`. k, v: [n, n_kv_heads, head_dim], any dtype,
  // innermost dimension contiguous, other strides arbitrary; converted to
  // kv_type with longctx::convert's rounding (q8_0: quantized as above). A
  // value the store cannot hold is an Error(kInvalidArgument) naming the
  // layer, kv head, position and channel: NaN and Inf in every type, and
  // what would round to Inf in it (f16: |x| >= 65520; q8_0: above).
  // importance (optional, rank 0 = absent = 0): finite f32 [n, n_kv_heads],
  // inner dimension contiguous; validated for every type, used by DYNAMIC only. Everything is validated
  // (Error kInvalidArgument, also when n_tokens + n > max_seq_len) and all
  // pages are allocated (Error kOutOfMemory) before anything is written: on
  // error the store is unchanged. n == 0 is a no-op.
  void append(int layer, const TensorView& k, const TensorView& v,
              const TensorView& importance = TensorView{});

  // DYNAMIC: adds importance (finite f32 [n, n_kv_heads], inner dimension
  // contiguous) to tokens [first_token, first_token + n) of `layer` and
  // re-picks their blocks' representatives. Error(kInvalidArgument) if the
  // store is not DYNAMIC or the range is out of bounds; store then unchanged.
  void add_importance(int layer, int64_t first_token, const TensorView& importance);

  // Drops every token of every layer; pages return to the pools (slabs stay
  // mapped and counted in the budget until the store is destroyed).
  void clear();

  // Keeps the first n_tokens of every layer and drops the rest, whole blocks
  // at a time (a kept block's page and record are exactly what appending its
  // tokens wrote, so the store equals one that held only them); dropped pages
  // return to the pools. Error(kInvalidArgument), store unchanged, unless n_tokens is a
  // multiple of block_size and at most every layer's count.
  void truncate(int64_t n_tokens);

  const StoreLayout& layout() const { return layout_; }
  const LongContextConfig& config() const { return config_; }
  int64_t n_tokens(int layer) const;
  int64_t n_blocks(int layer) const;  // ceil(n_tokens / block_size)
  Partition partition(int layer) const;

  // block(), rep_record() and valid_rep_slots() throw Error(kInvalidArgument)
  // naming layer/kv head/block and the limits when out of range.
  BlockView block(int layer, int kv_head, int64_t block) const;
  // The representative record of a block (see the layout above).
  const std::byte* rep_record(int layer, int kv_head, int64_t block) const;
  // Number of valid key slots in a block's record.
  int valid_rep_slots(int layer, int kv_head, int64_t block) const;

  int node_of_head(int kv_head) const { return head_nodes_[kv_head]; }
  const std::vector<int>& head_nodes() const { return head_nodes_; }
  const NumaTopology& topology() const { return topology_; }
  MemoryStats memory_stats() const;

 private:
  friend class SnapshotAccess;
  struct HeadCache {                   // one (layer, kv head)
    std::vector<std::byte*> pages;     // block pages, index = block
    std::vector<std::byte*> rep_pages; // index = block / records_per_rep_page
  };
  HeadCache& head_cache(int layer, int kv_head) { return heads_[size_t(layer) * layout_.shape.n_kv_heads + kv_head]; }
  const HeadCache& head_cache(int layer, int kv_head) const { return heads_[size_t(layer) * layout_.shape.n_kv_heads + kv_head]; }
  BlockPool& page_pool(int kv_head) { return *page_pools_[size_t(head_nodes_[kv_head])]; }
  BlockPool& rep_pool(int kv_head) { return *rep_pools_[size_t(head_nodes_[kv_head])]; }
  // Writes tokens [first_token, first_token + k.shape[0]) of one kv head into
  // pages already allocated, and updates the blocks' records.
  void write_head(int layer, int kv_head, int64_t first_token, const TensorView& k, const TensorView& v,
                  const TensorView* importance);
  std::byte* record_of(const HeadCache& hc, int64_t block) const;
  void check_layer(int layer, const char* what) const;
  void check_block(int layer, int kv_head, int64_t block, const char* what) const;

  LongContextConfig config_;
  StoreLayout layout_;
  MemoryBudget& budget_;
  const NumaTopology& topology_;
  std::vector<int> head_nodes_;                     // node index of each kv head
  std::vector<std::unique_ptr<BlockPool>> page_pools_;  // index = node index (null if unused)
  std::vector<std::unique_ptr<BlockPool>> rep_pools_;
  std::vector<HeadCache> heads_;                    // [layer][kv head]
  std::vector<int64_t> n_tokens_;                   // per layer
};

// The one way to read K/V out of a block page as f32 (kernels with their own
// vector loads aside): tokens [t0, t0 + n) of the block, 0 <= t0, t0 + n <=
// block_size, as stored.
//   read_keys_t:  dst[c * ld + (t - t0)], channel-major like the page (ld >= n)
//   read_values:  dst[(t - t0) * ld + c], token rows (ld >= head_dim)
void read_keys_t(const StoreLayout& layout, const BlockView& view, int t0, int n, float* dst, size_t ld);
void read_values(const StoreLayout& layout, const BlockView& view, int t0, int n, float* dst, size_t ld);

}  // namespace longctx::kvstore
