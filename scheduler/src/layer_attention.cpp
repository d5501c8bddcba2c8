// LayerAttention (layer_attention.h).
#include "longctx/scheduler/layer_attention.h"

#include <chrono>

#include "longctx/core/error.h"
#include "longctx/policy/quoka.h"

namespace longctx::scheduler {

LayerAttention::LayerAttention(kvstore::KVStore& store, const LongContextConfig& config, float scale)
    : store_(store),
      prefill_kernel_(cpu::prefill_kernel_for(config.prefill_kernel)),
      policy_(std::make_unique<policy::DecodePolicy>(config, store_, scale)),
      decode_idx_(size_t(store.layout().shape.n_layers), 0) {}

void LayerAttention::check_layer(int layer, const char* what) const {
  if (layer < 0 || layer >= int(decode_idx_.size()))
    fail(ErrorCode::kInvalidArgument, "LayerAttention::", what, ": layer ", layer, " outside [0, ",
         decode_idx_.size(), ")");
}

void LayerAttention::prefill_chunk(int layer, int64_t first_pos, const TensorView& q, const TensorView& k,
                                   const TensorView& v, const MutableTensorView& out, const MutableTensorView& lse) {
  check_layer(layer, "prefill_chunk");
  if (first_pos != store_.n_tokens(layer))
    fail(ErrorCode::kInvalidArgument, "LayerAttention::prefill_chunk: the chunk starts at position ", first_pos,
         " but layer ", layer, " holds ", store_.n_tokens(layer), " tokens");
  store_.append(layer, k, v);
  const LongContextConfig& config = policy_->config();
  if (config.quoka.enabled)
    policy::quoka_prefill_attention(store_, layer, first_pos, q, config.quoka, config.initial_len,
                                    config.chunk_size, policy_->attn_scale(), out, lse, prefill_kernel_);
  else
    cpu::prefill_attention(store_, layer, first_pos, q, policy_->attn_scale(), out, lse, prefill_kernel_);
}

void LayerAttention::end_prefill(int layer, const TensorView& window_q) {
  check_layer(layer, "end_prefill");
  if (window_q.rank > 0 && window_q.shape[0] > 0) policy_->on_prefill_end(layer, window_q);
  decode_idx_[size_t(layer)] = 0;
}

void LayerAttention::decode(int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                            bool include_local, const MutableTensorView& out, const MutableTensorView& lse) {
  check_layer(layer, "decode");
  const auto start = std::chrono::steady_clock::now();
  store_.append(layer, k, v);
  last_append_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  policy_->decode(layer, decode_idx_[size_t(layer)], q, include_local, out, lse);
  ++decode_idx_[size_t(layer)];
}

void LayerAttention::restart() {
  // The old policy's config and scale, read while it still exists.
  policy_ = std::make_unique<policy::DecodePolicy>(policy_->config(), store_, policy_->attn_scale());
  decode_idx_.assign(decode_idx_.size(), 0);
}

}  // namespace longctx::scheduler
