// Prefill attention on the CPU (what a machine without a GPU runs): the
// queries of one chunk, at positions [first_pos, first_pos + n), attend every
// token of the layer up to their own position (causal inside the chunk). The
// chunk's K/V must already be appended to the store. Tiled flash-attention
// style: blocks of queries x blocks of keys, online softmax, fp32 accumulators.
// A variant restricts the history (the tokens before the chunk) to given
// spans per kv head, for sparse prefill (QUOKA).
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::cpu {

// q: f32 [n, n_q_heads, head_dim]; out: f32 [n, n_q_heads, head_dim];
// lse: f32 [n, n_q_heads]. scale 0 = 1/sqrt(head_dim). Requires
// first_pos + n <= store.n_tokens(layer).
void prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const TensorView& q,
                       float scale, const MutableTensorView& out, const MutableTensorView& lse);

// The same with the history restricted: every query of the chunk attends the
// tokens of history.spans[kv_head] (all before first_pos) plus the chunk's
// tokens up to its own position [first_pos, position]. history has one span
// list per kv head, each sorted, non-empty spans, non-overlapping, inside
// [0, first_pos) (an empty list: the chunk only); anything else throws
// Error(kInvalidArgument) naming the head and span. The function above is
// this with the one span [0, first_pos) per head (same code path, same bits);
// keys are tiled in the order of the concatenated spans, so a row's result
// depends only on its query and its key list.
void prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const Selection& history,
                       const TensorView& q, float scale, const MutableTensorView& out, const MutableTensorView& lse);

}  // namespace longctx::cpu
