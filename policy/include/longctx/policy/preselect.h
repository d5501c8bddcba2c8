// SnapKV-style preselection at the end of prefill (ALGORITHMS.md): the last w
// prompt queries of a layer vote for the keys they attend; votes are pooled
// along the tokens, summed per context block, and the best
// `preselect_block_count` blocks (per layer in SHARED mode, per kv head in
// SEPARATE mode, Ada-KV budgets when budget.policy is adaptive) are the only
// candidates of later selections. The same token votes feed DYNAMIC
// representatives (feed_dynamic).
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

struct SnapKVParams {
  int pool_kernel = 7;               // odd, >= 1; 1 = no pooling
  Reduce pool = Reduce::kMax;        // kMax (SnapKV's shipped configs) or kMean (avg pooling)
  Reduce gqa_reduce = Reduce::kSum;  // the g query heads of a kv head: kSum or kMax
  bool prefix_only = false;          // true: votes of the window's own columns are zeroed
                                     // (before and after pooling), as SnapKV pools prefix columns only
  float scale = 0.f;                 // 0 = 1/sqrt(head_dim)
};

// SnapKV token votes of `layer`: [n_kv_heads][n_tokens] (row h = kv head h).
// window_q: f32 [w, n_q_heads, head_dim] (innermost contiguous), the queries
// of the last w tokens of the layer, positions [n_tokens - w, n_tokens).
//   1. Window query i (position p_i) attends keys 0..p_i (causal inside the
//      window): probabilities softmax(q_i.k_j * scale), fp32, max subtracted.
//   2. Per query head, the probabilities are summed over the window queries
//      for each key column j (window columns included unless prefix_only).
//   3. 1-D pooling along tokens per query head: kernel k, stride 1, padding
//      k/2 (output length n_tokens). max: padding never wins (votes >= 0);
//      mean: divides by k, padding counted as 0 (PyTorch avg_pool1d default).
//   4. The g pooled rows of a kv head combined by gqa_reduce (sum or max).
// Keys are read from the block pages as stored (rounded to kv_type); each
// block's keys are widened once per kv head and scored by all g*w queries.
// Work is spread over (kv head, block) with oneTBB; the result does not depend
// on the thread count. Throws Error(kInvalidArgument) naming the argument for
// a bad layer, shape, w outside [1, n_tokens], an even or < 1 pool_kernel,
// pool not kMax/kMean, gqa_reduce not kSum/kMax.
std::vector<float> snapkv_token_votes(const kvstore::KVStore& store, int layer, const TensorView& window_q,
                                      const SnapKVParams& params = {});

// Sum of token votes ([n_kv_heads][partition.n_tokens]) over each context
// block's tokens inside the context range (Partition::context_begin_of/_end_of),
// accumulated in fp64 and rounded to f32: [n_kv_heads][n_context_blocks],
// entry [h][i] for block partition.first_context_block + i.
std::vector<float> block_votes(const std::vector<float>& token_votes, int n_kv_heads,
                               const kvstore::Partition& partition, int block_size);

// The best `count` ranked blocks (Partition::first_ranked_block; the other
// context blocks are attended anyway) by block scores
// ([n_kv_heads][n_context_blocks], entry i = block
// partition.first_context_block + i), as absolute block indices sorted
// increasingly:
//   SHARED: one list (size 1), ranked by the sum over kv heads (fp32, in head order);
//   SEPARATE, budget uniform: one list per kv head, its top `count`;
//   SEPARATE, budget adaptive: one list per kv head, Ada-KV (adakv_select)
//     with per-head budget `count` and budget.alpha.
// Ranking as top_k: larger first, ties lower block first; -inf scores mark
// excluded blocks: top_k/Ada-KV never prefer them, and they are dropped from
// the result, so a list can be shorter than count. count is clamped to the
// number of ranked blocks. Throws Error(kInvalidArgument) for count < 0,
// a scores size that does not match, or alpha outside [0, 1].
std::vector<std::vector<int64_t>> choose_blocks(const std::vector<float>& scores, int n_kv_heads,
                                                const kvstore::Partition& partition, int64_t count,
                                                HeadSelectMode mode, const BudgetConfig& budget);

// One kv head's part of choose_blocks for SEPARATE with a uniform budget:
// the best `count` ranked blocks by its row of block scores (entry i =
// block partition.first_context_block + i), absolute and sorted, -inf dropped.
std::vector<int64_t> choose_head_blocks(const float* row, const kvstore::Partition& partition, int64_t count);

// Preselection of `count` (= preselect_block_count) blocks from block votes:
// choose_blocks on the votes.
std::vector<std::vector<int64_t>> preselect_blocks(const std::vector<float>& block_votes, int n_kv_heads,
                                                   const kvstore::Partition& partition, int64_t count,
                                                   HeadSelectMode mode, const BudgetConfig& budget);

// Blocks a layer may still choose from after SnapKV preselection: one list
// (shared by every kv head) or one per kv head, of at most `count`
// (preselect_block_count) absolute block indices, and every block from
// `first_unranked_block` on: the preselection did not rank those (they were
// partial, in the local window or not yet written), so later selections rank
// them on their scores, as they would without preselection.
struct Preselected {
  std::vector<std::vector<int64_t>> blocks;
  int64_t count = 0;
  int64_t first_unranked_block = 0;  // the partition's end_ranked_block at preselection
};

// Whether a selection from `preselected` in `partition` needs no scores: no
// block has become ranked since, and `count` keeps every preselected block.
bool keeps_preselected(const Preselected& preselected, const kvstore::Partition& partition, int64_t count);

// Sets to -inf the scores ([n_kv_heads][n_context_blocks]) of every block a
// head may not select: those outside its preselected list (preselected.blocks
// has 1 list, shared by all heads, or n_kv_heads) and before
// first_unranked_block. Blocks outside the context range in a list are ignored.
void restrict_scores_to(const Preselected& preselected, int n_kv_heads, const kvstore::Partition& partition,
                        std::vector<float>& scores);

// A later selection of `count` (= second_select_num) blocks restricted to the
// preselected set: its blocks as they are when keeps_preselected (select_blocks
// then does not score), else choose_blocks on the scores with every block it may
// not select excluded (restrict_scores_to).
std::vector<std::vector<int64_t>> reselect_blocks(const Preselected& preselected, std::vector<float> scores,
                                                  int n_kv_heads, const kvstore::Partition& partition,
                                                  int64_t count, HeadSelectMode mode, const BudgetConfig& budget);

// The heads that choose blocks, in increasing order: the heads of the mask
// `choosing` (SelectSpec::choosing_heads; core/head_mask.h: empty = every
// head). Throws Error(kInvalidArgument) for a mask of another size.
std::vector<int> choosing_head_list(const std::vector<uint8_t>& choosing, int n_kv_heads);

// The rows ([n_kv_heads][n], row-major) of `heads`, in that order: the
// choosing heads' part of a choice (SelectSpec::choosing_heads).
template <typename T>
std::vector<T> rows_of(const std::vector<T>& rows, int64_t n, const std::vector<int>& heads) {
  std::vector<T> out;
  out.reserve(heads.size() * size_t(n));
  for (const int h : heads) out.insert(out.end(), rows.begin() + h * n, rows.begin() + (h + 1) * n);
  return out;
}

// Block lists of `heads` (SEPARATE: one per choosing head) -> one per kv
// head, empty for the others; SHARED's one list stays as is.
std::vector<std::vector<int64_t>> for_every_head(std::vector<std::vector<int64_t>> chosen,
                                                 const std::vector<int>& heads, int n_kv_heads, HeadSelectMode mode);

// DYNAMIC representatives from the votes: store.add_importance(layer, 0, votes)
// with the votes ([n_kv_heads][n_tokens of the layer]) transposed to the
// store's [n_tokens, n_kv_heads]. Throws Error(kInvalidArgument) when the sizes
// do not match the layer or the store is not DYNAMIC (the store is then unchanged).
void feed_dynamic(kvstore::KVStore& store, int layer, const std::vector<float>& token_votes);

}  // namespace longctx::policy
