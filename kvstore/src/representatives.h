// Representative records of blocks (private to the KV store): the per-type
// update run after a tile of tokens is written, and the DYNAMIC re-pick.
// The record layout and the definitions are in kv_store.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "longctx/kvstore/kv_store.h"

namespace longctx::kvstore::detail {

// Offset in the block of FIX slot j: floor(j * block_size / R).
inline int fix_offset(int slot, int block_size, int rep_num) {
  return static_cast<int>(int64_t{slot} * block_size / rep_num);
}

// Valid key slots of a record whose block holds n_filled (>= 1) tokens.
int valid_slots(const StoreLayout& layout, int n_filled);

// Scratch of one thread, reused across calls.
struct RepScratch {
  std::vector<float> acc0, acc1;  // [head_dim] running max / min / mean
  std::vector<float> keys_f32;    // [kTileTokens][head_dim] keys widened to f32
  std::vector<int> order;         // [block_size] DYNAMIC ranking
  std::vector<float> block_keys;  // [head_dim][n] a block's keys (q8_0 extremes)
};

// Tokens [offset, offset + count) of a block, already written to its page.
// keys: their keys [count][head_dim] as stored, in keys_dtype (kv_type, or
// f32 for q8_0: the dequantized values); importance: [count] f32, or null
// for 0 (read by DYNAMIC only).
struct Segment {
  int offset = 0;
  int count = 0;
  const std::byte* keys = nullptr;
  DType keys_dtype = DType::kF16;
  const float* importance = nullptr;
};

// Brings the block's record up to date with a segment: afterwards it
// describes tokens [0, offset + count) of the block. page: the block's page.
void update_record(const StoreLayout& layout, std::byte* record, const std::byte* page, const Segment& segment,
                   RepScratch& scratch);

// DYNAMIC: re-picks the slots of a block holding n_filled tokens from the
// importances in its record, copying keys from its page.
void repick_dynamic(const StoreLayout& layout, std::byte* record, const std::byte* page, int n_filled,
                    RepScratch& scratch);

// DYNAMIC: the record's per-token importance array.
inline float* record_importance(const StoreLayout& layout, std::byte* record) {
  return reinterpret_cast<float*>(record + layout.record_importance_offset);
}

}  // namespace longctx::kvstore::detail
