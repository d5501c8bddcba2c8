// Token rerank (config rerank: tokens; ALGORITHMS.md "Token rerank", after
// ParisKV2): a second pass over the candidate blocks of a select step.
//
// `candidates` is a selection (sinks, context spans, the blocks that are not
// ranked, local window: what select_blocks builds) made with rerank_candidates
// times the block budget. Per kv head, every token of a candidate span inside
// the ranked blocks (Partition::ranked_begin; the others are always attended) is scored with its
// stored key: the kv head's queries reduced by gqa_reduce (sum: (Σ_h q_h)·k,
// max: max_h q_h·k), keys as stored (f16/bf16/f32, or a q8_0 store's 8-bit
// codes times their scales). The `keep` best (ties: the earlier token) stay;
// with the candidates' tokens outside the ranked blocks, they are the new
// spans, sorted and merged. A head with
// at most `keep` candidate tokens keeps them all.
#pragma once

#include <cstdint>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

// q f32 [n_q_heads, head_dim]; keep >= 0 tokens per kv head. Throws
// Error(kInvalidArgument) for a bad layer or q, candidates for another number
// of kv heads, keep < 0, or a gqa_reduce other than sum or max.
cpu::Selection rerank_tokens(const kvstore::KVStore& store, int layer, const TensorView& q,
                             const cpu::Selection& candidates, int64_t keep, Reduce gqa_reduce);

}  // namespace longctx::policy
