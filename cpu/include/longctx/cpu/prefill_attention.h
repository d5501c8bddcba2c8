// Prefill attention on the CPU (what a machine without a GPU runs): the
// queries of one chunk, at positions [first_pos, first_pos + n), attend every
// token of the layer up to their own position (causal inside the chunk). The
// chunk's K/V must already be appended to the store. Tiled flash-attention
// style: blocks of queries x blocks of keys, online softmax, fp32 accumulators.
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::cpu {

// q: f32 [n, n_q_heads, head_dim]; out: f32 [n, n_q_heads, head_dim];
// lse: f32 [n, n_q_heads]. scale 0 = 1/sqrt(head_dim). Requires
// first_pos + n <= store.n_tokens(layer).
void prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const TensorView& q,
                       float scale, const MutableTensorView& out, const MutableTensorView& lse);

}  // namespace longctx::cpu
