// Which tokens a decode step attends, per kv head, and how they are chosen:
// score the context blocks with the query, keep the top k, add the initial
// tokens (sinks), the local window and the partial last block.
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::cpu {

// A half-open range of token positions [begin, end) of one layer.
struct TokenSpan {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const TokenSpan&) const = default;
};

// Tokens attended by each kv head: spans sorted by begin, non-overlapping,
// non-empty, adjacent spans merged. In SHARED mode every head has the same spans.
struct Selection {
  std::vector<std::vector<TokenSpan>> spans;  // [n_kv_heads]
  int64_t tokens(int kv_head) const;          // total tokens of a head
};

struct ScoreParams {
  Reduce gqa_reduce = Reduce::kSum;      // query heads of a group: sum (default) or max
  Reduce dynamic_reduce = Reduce::kMax;  // FIX/DYNAMIC: max (default) or mean over valid reps
};

// Block scores of every context block of `layer` (Partition::first_context_block
// up to end_context_block) for decode query q (f32 [n_q_heads, head_dim]).
// scores: f32 [n_kv_heads, n_context_blocks]; entry [h][i] scores block
// first_context_block + i for kv head h:
//   MAX/MEAN: q.rep; QUEST: sum_c max(q_c*max_c, q_c*min_c); FIX/DYNAMIC:
//   max (or mean) over the block's valid representatives of q.k;
// each combined over the g query heads of the group by params.gqa_reduce.
// Scores are unscaled (ranking does not depend on the scale).
void score_blocks(const kvstore::KVStore& store, int layer, const TensorView& q, const ScoreParams& params,
                  const MutableTensorView& scores);

// Indices of the k largest of scores[0..n) (k clamped to n), in decreasing
// score order; ties: lower index first. NaN scores rank last.
std::vector<int64_t> top_k(const float* scores, int64_t n, int64_t k);

// Blocks that fit a token budget: floor(token_budget / block_size).
int64_t blocks_for_token_budget(int64_t token_budget, int block_size);

struct SelectParams {
  int64_t blocks = 0;           // k: context blocks kept (second_select_num)
  HeadSelectMode mode = HeadSelectMode::kShared;
  bool include_local = true;    // attend the local window here (false when the GPU does)
  ScoreParams score;
};

// Builds the selection from chosen context blocks (absolute block indices per
// kv head; one list shared by all heads when chosen.size() == 1): initial
// tokens + chosen blocks clipped to the context range + the partial last
// block when it lies in the context range + (include_local) the local window.
Selection build_selection(const kvstore::Partition& partition, int block_size, int n_kv_heads,
                          const std::vector<std::vector<int64_t>>& chosen, bool include_local);

// score_blocks + top_k (per kv head in SEPARATE mode, on the sum over kv heads
// in SHARED mode) + build_selection.
Selection select_blocks(const kvstore::KVStore& store, int layer, const TensorView& q, const SelectParams& params);

// Every token of the layer (include_local) or every token before the local window.
Selection select_all(const kvstore::KVStore& store, int layer, bool include_local);

}  // namespace longctx::cpu
