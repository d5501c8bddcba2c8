// Which tokens a decode step attends, per kv head, and the pieces their choice
// is made of: block scores of the query, top k, and the spans of the initial
// tokens (sinks), the chosen blocks, the partial last block and the local
// window. The choice itself is policy::select_blocks (policy/select.h).
#pragma once

#include <cstdint>
#include <functional>
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

// Total tokens of one kv head's spans.
int64_t span_tokens(const std::vector<TokenSpan>& spans);

struct ScoreParams {
  Reduce gqa_reduce = Reduce::kSum;      // query heads of a group: sum (default) or max
  Reduce dynamic_reduce = Reduce::kMax;  // FIX/DYNAMIC: max (default) or mean over valid reps
};

// Throws Error(kInvalidArgument) naming `what` unless layer is a layer of the
// store and q a decode query for it: f32 [n_q_heads, head_dim], inner
// dimension contiguous, n_q_heads a positive multiple of the kv heads.
void check_decode_query(const kvstore::KVStore& store, int layer, const TensorView& q, const char* what);

// Block scores of every context block of `layer` (Partition::first_context_block
// up to end_context_block) for decode query q (f32 [n_q_heads, head_dim]).
// scores: f32 [n_kv_heads, n_context_blocks]; entry [h][i] scores block
// first_context_block + i for kv head h:
//   MAX/MEAN: q.rep; QUEST: sum_c max(q_c*max_c, q_c*min_c); FIX/DYNAMIC:
//   max (or mean) over the block's valid representatives of q.k;
// each combined over the g query heads of the group by params.gqa_reduce.
// Scores are unscaled (ranking does not depend on the scale).
// head_scored, when set, is called once for each kv head h whose row has
// blocks, by the task that scores the row's last records, once the whole row
// is written: work on one head's scores (its top-k) then runs while the other
// heads are still being scored, not in a parallel pass of its own after them.
// heads, a mask (core/head_mask.h: empty = every head, nonzero = in), names the rows to
// score: the others are neither read nor written, and head_scored is not
// called for them (RazorAttention's non-retrieval heads choose no block).
// Throws Error(kInvalidArgument) naming the argument for a bad layer, q,
// scores shape, reduce, or heads of another size than the kv heads.
void score_blocks(const kvstore::KVStore& store, int layer, const TensorView& q, const ScoreParams& params,
                  const MutableTensorView& scores, const std::function<void(int)>& head_scored = {},
                  const std::vector<uint8_t>& heads = {});

// Indices of the k largest of scores[0..n) (k clamped to n), in decreasing
// score order; ties: lower index first. NaN scores rank last.
std::vector<int64_t> top_k(const float* scores, int64_t n, int64_t k);

// Blocks that fit a token budget: floor(token_budget / block_size).
int64_t blocks_for_token_budget(int64_t token_budget, int block_size);

// Builds the selection from chosen context blocks (absolute block indices per
// kv head; one list shared by all heads when chosen.size() == 1): initial
// tokens + chosen blocks clipped to the context range + the context tokens of
// the blocks that are not ranked (Partition::first_ranked_block: those the
// sinks or the window reach into, and the partial last block) + (include_local)
// the local window.
Selection build_selection(const kvstore::Partition& partition, int block_size, int n_kv_heads,
                          const std::vector<std::vector<int64_t>>& chosen, bool include_local);

// Every token of the layer (include_local) or every token before the local window.
Selection select_all(const kvstore::KVStore& store, int layer, bool include_local);

}  // namespace longctx::cpu
