// DeviceLayerAttention (device_layer_attention.h).
#include "longctx/scheduler/device_layer_attention.h"

#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "longctx/core/error.h"

namespace longctx::scheduler {

std::string DeviceLayerAttention::declined(const LongContextConfig& config, int head_dim) {
  if (config.kv_type != DType::kF16 && config.kv_type != DType::kBF16)
    return str_cat("kv_type ", dtype_name(config.kv_type), " (the device keeps K/V as f16 or bf16)");
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    return str_cat("head_dim ", head_dim, " (the device kernels run 64, 128 and 256)");
  if (config.policy == SelectionPolicy::kH2O) return "policy h2o (it attends its recent tokens on the CPU)";
  if (config.quoka.enabled) return "quoka.enabled (QUOKA's restricted prefill runs on the CPU)";
  return "";
}

DeviceAttention::Shape DeviceLayerAttention::shape_for(const LongContextConfig& config, int n_layers, int n_heads,
                                                       int n_kv_heads, int head_dim, float scale) {
  DeviceAttention::Shape shape;
  shape.n_layers = n_layers;
  shape.n_heads = n_heads;
  shape.n_kv_heads = n_kv_heads;
  shape.head_dim = head_dim;
  shape.kv_dtype = config.kv_type;
  shape.max_tokens = config.max_seq_len;
  shape.window = config.local_windows_len;
  shape.initial_len = config.initial_len;
  shape.scale = scale;
  return shape;
}

uint64_t DeviceLayerAttention::history_bytes(const DeviceAttention::Shape& shape) {
  return 2 * uint64_t(shape.max_tokens) * uint64_t(shape.n_kv_heads) * uint64_t(shape.head_dim) *
         dtype_size(shape.kv_dtype);
}

DeviceLayerAttention::DeviceLayerAttention(DeviceAttention& device, const DeviceAttention::Shape& shape,
                                           kvstore::KVStore& store, LayerAttention& attention)
    : device_(device), shape_(shape), store_(store), attention_(attention) {
  const kvstore::KVShape& s = store.layout().shape;
  if (s.n_layers != shape.n_layers || s.n_kv_heads != shape.n_kv_heads || s.head_dim != shape.head_dim)
    fail(ErrorCode::kInvalidArgument, "DeviceLayerAttention: device shape of ", shape.n_layers, " layers x ",
         shape.n_kv_heads, " kv heads x ", shape.head_dim, " for a store of ", s.n_layers, " x ", s.n_kv_heads,
         " x ", s.head_dim);
  if (store.config().kv_type != shape.kv_dtype)
    fail(ErrorCode::kInvalidArgument, "DeviceLayerAttention: device kv_dtype ", dtype_name(shape.kv_dtype),
         " for a store of kv_type ", dtype_name(store.config().kv_type));
  cpu_out_.resize(size_t(shape.n_heads) * size_t(shape.head_dim));
  cpu_lse_.resize(size_t(shape.n_heads));
  claim();
}

void DeviceLayerAttention::claim() {
  if (owns()) return;
  device_.configure(shape_);
  epoch_ = device_.epoch();
}

void DeviceLayerAttention::clear() {
  if (!owns()) return;
  device_.clear();
  epoch_ = device_.epoch();
}

void DeviceLayerAttention::check_owner(const char* what) const {
  if (!owns())
    fail(ErrorCode::kInvalidArgument, "DeviceLayerAttention::", what,
         ": the device holds another owner's tokens (it configured or cleared the DeviceAttention since); "
         "claim() it back first");
}

// The layer's cached tokens go up as [n, n_kv_heads, head_dim] in kv_type,
// read from the store's block pages (K transposed back to token-major)
// straight into the device's history_buffer (pinned: the upload does not hold
// the host up).
void DeviceLayerAttention::begin_layer(int layer) {
  check_owner("begin_layer");
  const int64_t n = store_.n_tokens(layer);
  const int bs = store_.config().block_size;
  const int n_kv = shape_.n_kv_heads, d = shape_.head_dim;
  const DeviceAttention::HostKVBuffer history = device_.history_buffer(n);
  auto* history_k = static_cast<uint16_t*>(history.k.data);
  auto* history_v = static_cast<uint16_t*>(history.v.data);
  const int64_t n_blocks = store_.n_blocks(layer);
  // 2-byte kv types only (declined() refuses the others).
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_blocks * n_kv), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const int h = int(i % n_kv);
      const int64_t b = i / n_kv;
      const kvstore::BlockView view = store_.block(layer, h, b);
      const auto* k_t = reinterpret_cast<const uint16_t*>(view.k_t);
      const auto* v = reinterpret_cast<const uint16_t*>(view.v);
      for (int t = 0; t < view.n_filled; ++t) {
        const size_t row = (size_t(b * bs + t) * n_kv + size_t(h)) * size_t(d);
        for (int c = 0; c < d; ++c) history_k[row + size_t(c)] = k_t[size_t(c) * bs + size_t(t)];
        std::memcpy(history_v + row, v + size_t(t) * d, size_t(d) * sizeof(uint16_t));
      }
    }
  });
  device_.begin_prefill_layer(layer, as_const(history.k), as_const(history.v));
}

void DeviceLayerAttention::sync_with_store() {
  claim();
  for (int layer = 0; layer < shape_.n_layers; ++layer) begin_layer(layer);
}

void DeviceLayerAttention::prefill_chunk(int layer, int64_t first_pos, const BackendTensor& q,
                                         const BackendTensor& k, const BackendTensor& v, BackendTensor& out,
                                         const std::function<void()>& queue_after) {
  check_owner("prefill_chunk");
  if (first_pos != store_.n_tokens(layer))
    fail(ErrorCode::kInvalidArgument, "DeviceLayerAttention::prefill_chunk: the chunk starts at position ",
         first_pos, " but layer ", layer, " holds ", store_.n_tokens(layer), " tokens");
  const int64_t n = q.shape().empty() ? 0 : q.shape()[0];
  device_.prefill_chunk(layer, first_pos, q, k, v, out);
  if (queue_after) queue_after();
  // The chunk's K/V reach the store while the device goes on.
  const DeviceAttention::HostKV kv = device_.chunk_kv();
  if (kv.k.rank != 3 || kv.k.shape[0] != n || kv.v.rank != 3 || kv.v.shape[0] != n)
    fail(ErrorCode::kInternal, "DeviceLayerAttention::prefill_chunk: layer ", layer, " chunk at ", first_pos,
         ": device returned K/V ", kv.k.describe(), " / ", kv.v.describe(), " for ", n, " tokens");
  store_.append(layer, kv.k, kv.v);
}

int64_t DeviceLayerAttention::decode(int layer, int64_t pos, const BackendTensor& q, const BackendTensor& k,
                                     const BackendTensor& v, BackendTensor& out) {
  check_owner("decode");
  if (pos != store_.n_tokens(layer))
    fail(ErrorCode::kInvalidArgument, "DeviceLayerAttention::decode: position ", pos, " but layer ", layer,
         " holds ", store_.n_tokens(layer), " tokens");
  const DeviceAttention::DecodeLocal step = device_.decode_local(layer, pos, q, k, v);
  const MutableTensorView cpu_out =
      make_mutable_view(cpu_out_.data(), DType::kF32, {shape_.n_heads, shape_.head_dim});
  const MutableTensorView cpu_lse = make_mutable_view(cpu_lse_.data(), DType::kF32, {shape_.n_heads});
  attention_.decode(layer, step.q, step.k, step.v, /*include_local=*/false, cpu_out, cpu_lse);
  // The CPU part (sinks + context) is the store's Partition below its local
  // range; it and the ring's range must partition the tokens, or a token
  // would be attended twice or not at all (checked before the merge uses it).
  const kvstore::Partition part = store_.partition(layer);
  if (part.n_tokens != pos + 1 || part.local_begin != step.first_pos)
    fail(ErrorCode::kInternal, "DeviceLayerAttention::decode: layer ", layer, " at position ", pos,
         ": store local range [", part.local_begin, ", ", part.n_tokens, ") is not the device ring's [",
         step.first_pos, ", ", pos + 1, ")");
  device_.decode_merge(layer, as_const(cpu_out), as_const(cpu_lse), out);
  return attention_.policy().last_stats().attended_tokens + (part.n_tokens - part.local_begin) * shape_.n_kv_heads;
}

}  // namespace longctx::scheduler
