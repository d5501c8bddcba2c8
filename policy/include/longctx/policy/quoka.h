// QUOKA sparse prefill (ALGORITHMS.md, longctx column): a prefill chunk
// attends only the cached keys that its most atypical queries point at, plus
// the sinks, the previous chunk and itself (causal).
//
// For a chunk of n queries q at positions [first_pos, first_pos + n), per
// query head h (kv head h / g, g = n_q_heads / n_kv_heads):
//   1. mean query m_h = (1/n) sum_i q_i,h;
//   2. retained queries R_h: the min(n_q, n) queries i with the lowest
//      cos(q_i,h, m_h) (ties: lower i first);
//   3. per cached key t of the kv head, s_h(t) = query_reduce over i in R_h
//      of cos(q_i,h, k_t)                      (max by default, or mean);
//   4. s(t) = head_reduce over the g query heads of the group of s_h(t)
//                                               (mean by default, or max);
//   5. keep the b_sa candidates with the largest s(t) (ties: lower position).
// The queries are retained per query head, not per kv group: the mean query
// and the geometry the paper relies on (queries far from the mean attend
// more keys) are properties of one head's queries, and the group's heads only
// meet at step 4, where the paper aggregates over the group.
//
// Always kept, never scored: the sinks [0, min(initial_len, first_pos)) and
// the previous chunk [max(sinks end, first_pos - b_cp), first_pos), b_cp =
// config.b_cp or chunk_size when 0. The candidates are the rest of the
// history; when there are at most b_sa of them the whole history is kept
// (nothing is scored). Keys are read as stored (kv_type widened to f32).
// cos(a, b) = a.b / (|a| |b|) in fp32 with fp32 norms (keys: a.b * (1/|b|),
// queries pre-normalized), and 0 when a norm is 0 or its inverse overflows:
// zero keys and queries score 0, never NaN (stored keys are finite).
#pragma once

#include <cstdint>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

// The history keys (positions < first_pos) a chunk attends, per kv head:
// sinks + previous chunk + top b_sa candidates, as sorted, merged spans (an
// empty list per head when first_pos == 0). q: f32 [n, n_q_heads, head_dim],
// n >= 1, the chunk's queries (after RoPE, as attention sees them). The chunk
// itself need not be in the store yet: requires 0 <= first_pos <=
// store.n_tokens(layer). config.enabled is not looked at (the caller decides).
// Throws Error(kInvalidArgument) for a bad layer, q shape/dtype/heads,
// first_pos, n_q < 1, b_sa < 0, b_cp < 0, initial_len < 0, or chunk_size < 1
// when b_cp == 0.
cpu::Selection quoka_select_keys(const kvstore::KVStore& store, int layer, int64_t first_pos, const TensorView& q,
                                 const QuokaConfig& config, int initial_len, int chunk_size);

// quoka_select_keys, then prefill_attention restricted to the selected
// history (the chunk stays complete and causal; its K/V must be in the store:
// first_pos + n <= n_tokens). out: f32 [n, n_q_heads, head_dim], lse: f32
// [n, n_q_heads], scale 0 = 1/sqrt(head_dim), products by `kernel`. Returns
// the selection used.
cpu::Selection quoka_prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos,
                                       const TensorView& q, const QuokaConfig& config, int initial_len,
                                       int chunk_size, float scale, const MutableTensorView& out,
                                       const MutableTensorView& lse,
                                       cpu::PrefillKernel kernel = cpu::best_prefill_kernel());

}  // namespace longctx::policy
