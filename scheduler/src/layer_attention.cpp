// LayerAttention (layer_attention.h).
#include "longctx/scheduler/layer_attention.h"

#include <chrono>

#include "longctx/core/error.h"
#include "longctx/policy/quoka.h"

namespace longctx::scheduler {

LayerAttention::LayerAttention(kvstore::KVStore& store, const LongContextConfig& config, float scale)
    : store_(store),
      config_(config),
      scale_(scale),
      prefill_kernel_(cpu::prefill_kernel_for(config.prefill_kernel)),
      policy_(std::make_unique<policy::DecodePolicy>(config_, store_, scale_)),
      decode_idx_(size_t(store.layout().shape.n_layers), 0) {}

void LayerAttention::prefill_chunk(int layer, int64_t first_pos, const TensorView& q, const TensorView& k,
                                   const TensorView& v, const MutableTensorView& out, const MutableTensorView& lse) {
  if (layer < 0 || layer >= int(decode_idx_.size()))
    fail(ErrorCode::kInvalidArgument, "LayerAttention::prefill_chunk: layer ", layer, " outside [0, ",
         decode_idx_.size(), ")");
  if (first_pos != store_.n_tokens(layer))
    fail(ErrorCode::kInvalidArgument, "LayerAttention::prefill_chunk: the chunk starts at position ", first_pos,
         " but layer ", layer, " holds ", store_.n_tokens(layer), " tokens");
  store_.append(layer, k, v);
  if (config_.quoka.enabled)
    policy::quoka_prefill_attention(store_, layer, first_pos, q, config_.quoka, config_.initial_len,
                                    config_.chunk_size, scale_, out, lse, prefill_kernel_);
  else
    cpu::prefill_attention(store_, layer, first_pos, q, scale_, out, lse, prefill_kernel_);
}

void LayerAttention::end_prefill(int layer, const TensorView& window_q) {
  if (layer < 0 || layer >= int(decode_idx_.size()))
    fail(ErrorCode::kInvalidArgument, "LayerAttention::end_prefill: layer ", layer, " outside [0, ",
         decode_idx_.size(), ")");
  if (window_q.rank > 0 && window_q.shape[0] > 0) policy_->on_prefill_end(layer, window_q);
  decode_idx_[size_t(layer)] = 0;
}

void LayerAttention::decode(int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                            bool include_local, const MutableTensorView& out, const MutableTensorView& lse) {
  if (layer < 0 || layer >= int(decode_idx_.size()))
    fail(ErrorCode::kInvalidArgument, "LayerAttention::decode: layer ", layer, " outside [0, ", decode_idx_.size(),
         ")");
  const auto start = std::chrono::steady_clock::now();
  store_.append(layer, k, v);
  last_append_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  policy_->decode(layer, decode_idx_[size_t(layer)], q, include_local, out, lse);
  ++decode_idx_[size_t(layer)];
}

void LayerAttention::restart() {
  policy_ = std::make_unique<policy::DecodePolicy>(config_, store_, scale_);
  decode_idx_.assign(decode_idx_.size(), 0);
}

}  // namespace longctx::scheduler
