// The attention of one sequence's layers over its KV store, between the
// projections: what a layer does with its q/k/v (after RoPE) on the host.
// Sequence's CPU path runs it, its device path runs its decode step for the
// part the device does not attend, and longctx.torch's SparseAttention runs
// it for injected PyTorch modules, so all of them attend the same way.
//
//   prefill_chunk  appends the chunk's K/V and attends its queries over every
//                  earlier token and the chunk causally (QUOKA's restricted
//                  history when quoka.enabled), at the model's scale;
//   end_prefill    gives the policy the layer's last preselect.window prompt
//                  queries (SnapKV preselection, DYNAMIC representatives,
//                  H2O) and makes the layer's next decode step its first;
//   decode         appends the token's K/V and attends what config.policy
//                  selects (include_local: the local window too; false when a
//                  device attends it).
// Every attention scores at `scale` (0 = 1/sqrt(head_dim)): prefill, the
// policy's, so partial results merge by LSE. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/policy/decode_policy.h"

namespace longctx::scheduler {

class LayerAttention {
 public:
  // The store outlives this object and was built from a config describing the
  // same layout (DecodePolicy checks it); throws Error(kInvalidArgument)
  // naming the key otherwise, or for a bad scale.
  LayerAttention(kvstore::KVStore& store, const LongContextConfig& config, float scale);

  // Chunk of `layer` at [first_pos, first_pos + n), first_pos = the tokens the
  // layer holds: k/v [n, n_kv_heads, head_dim] (any dtype the store takes)
  // are appended, q f32 [n, n_heads, head_dim] attends into out f32 [n,
  // n_heads, head_dim] and lse f32 [n, n_heads].
  void prefill_chunk(int layer, int64_t first_pos, const TensorView& q, const TensorView& k, const TensorView& v,
                     const MutableTensorView& out, const MutableTensorView& lse);
  // window_q f32 [w, n_heads, head_dim], w <= preselect.window (0 rows: nothing for the policy).
  void end_prefill(int layer, const TensorView& window_q);
  // k/v [1, n_kv_heads, head_dim] appended; q f32 [n_heads, head_dim]; out
  // f32 [n_heads, head_dim], lse f32 [n_heads] (the numerical contract).
  void decode(int layer, const TensorView& q, const TensorView& k, const TensorView& v, bool include_local,
              const MutableTensorView& out, const MutableTensorView& lse);
  // A new sequence over the (cleared, truncated or loaded) store: a fresh
  // policy, every layer's next decode step its first.
  void restart();

  const policy::DecodePolicy& policy() const { return *policy_; }
  cpu::PrefillKernel prefill_kernel() const { return prefill_kernel_; }
  double last_append_seconds() const { return last_append_seconds_; }  // of the last decode

 private:
  void check_layer(int layer, const char* what) const;

  kvstore::KVStore& store_;  // the config and the scale are the policy's
  cpu::PrefillKernel prefill_kernel_;
  std::unique_ptr<policy::DecodePolicy> policy_;
  std::vector<int64_t> decode_idx_;  // per layer: decode steps since its prefill ended
  double last_append_seconds_ = 0.0;
};

}  // namespace longctx::scheduler
