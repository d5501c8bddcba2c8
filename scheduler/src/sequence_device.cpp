// Sequence, device path (sequence.h): attention through the backend's
// DeviceAttention. The backend computes q/k/v and the MLP as on the CPU path;
// the device attends the prefill chunks and the decode local window, the KV
// store still receives every token and the policy attends the rest on the CPU.
#include <algorithm>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "longctx/core/error.h"
#include "longctx/scheduler/sequence.h"
#include "sequence_internal.h"

namespace longctx::scheduler {

// Uploads the layer's cached tokens (an earlier turn, or a loaded snapshot;
// none on the first prefill) as the history of its device prefill, which also
// puts the last local_windows_len of them in the layer's ring: [n, n_kv_heads,
// head_dim] in kv_type, read back from the store's block pages (K transposed
// back to token-major) straight into the device's history_buffer (pinned:
// the upload does not hold the host up; counted in the DRAM budget by the
// constructor).
void Sequence::device_begin_layer(int layer) {
  const TransformerSpec& s = model_.spec;
  const int64_t n = store_->n_tokens(layer);
  const int bs = config_.block_size;
  const int n_kv = s.n_kv_heads, d = s.head_dim;
  const DeviceAttention::HostKVBuffer history = device_->history_buffer(n);
  auto* history_k = static_cast<uint16_t*>(history.k.data);
  auto* history_v = static_cast<uint16_t*>(history.v.data);
  const int64_t n_blocks = store_->n_blocks(layer);
  // The device path runs on 2-byte kv types only (device_path_declined).
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_blocks * n_kv), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const int h = int(i % n_kv);
      const int64_t b = i / n_kv;
      const kvstore::BlockView view = store_->block(layer, h, b);
      const auto* k_t = reinterpret_cast<const uint16_t*>(view.k_t);
      const auto* v = reinterpret_cast<const uint16_t*>(view.v);
      for (int t = 0; t < view.n_filled; ++t) {
        const size_t row = (size_t(b * bs + t) * n_kv + size_t(h)) * size_t(d);
        for (int c = 0; c < d; ++c) history_k[row + size_t(c)] = k_t[size_t(c) * bs + size_t(t)];
        std::memcpy(history_v + row, v + size_t(t) * d, size_t(d) * sizeof(uint16_t));
      }
    }
  });
  device_->begin_prefill_layer(layer, as_const(history.k), as_const(history.v));
}

void Sequence::device_prefill_chunk(int layer, int64_t first_pos, BackendTensor& x, Workspace& ws,
                                    const std::function<void(const float* q, int64_t n)>& on_queries) {
  attention_inputs(layer, first_pos, x, ws);
  device_->prefill_chunk(layer, first_pos, *ws.q, *ws.k, *ws.v, *ws.attn);
  attention_output(layer, x, ws);  // queued behind the attention
  // The chunk's K/V reach the store while the device runs the MLP.
  const DeviceAttention::HostKV kv = device_->chunk_kv();
  if (kv.k.rank != 3 || kv.k.shape[0] != ws.n || kv.v.rank != 3 || kv.v.shape[0] != ws.n)
    fail(ErrorCode::kInternal, "Sequence::prefill: layer ", layer, " chunk at ", first_pos,
         ": device returned K/V ", kv.k.describe(), " / ", kv.v.describe(), " for ", ws.n, " tokens");
  store_->append(layer, kv.k, kv.v);
  if (on_queries) {  // only the chunks with queries in the policy's window
    if (backend_.host_memory()) backend_.synchronize();
    const TensorView q = host_view(backend_, *ws.q, ws.host_q);
    on_queries(static_cast<const float*>(q.data), ws.n);
  }
}

int64_t Sequence::device_decode_layer(int layer, int64_t pos, BackendTensor& x, Workspace& ws) {
  Backend& b = backend_;
  const TransformerSpec& s = model_.spec;
  attention_inputs(layer, pos, x, ws);
  // The token enters the ring, which attends [ring_first, pos] on the device
  // while the CPU appends it to the store and attends the rest.
  if (b.host_memory()) b.synchronize();
  const DeviceAttention::DecodeLocal step = device_->decode_local(layer, pos, *ws.q, *ws.k, *ws.v);
  const int64_t ring_first = step.first_pos;
  const MutableTensorView lse = make_mutable_view(ws.lse.data(), DType::kF32, {s.n_heads});
  // A host buffer of its own: cpu_out must not alias ws.attn, merge's output.
  ws.host_attn.resize(size_t(s.n_heads) * size_t(s.head_dim));
  const MutableTensorView cpu_out = make_mutable_view(ws.host_attn.data(), DType::kF32, {s.n_heads, s.head_dim});
  attention_->decode(layer, step.q, step.k, step.v, /*include_local=*/false, cpu_out, lse);
  stats_.decode_append_seconds += attention_->last_append_seconds();
  // The CPU part (include_local = false: sinks + context) is the store's
  // Partition below its local range; it and the ring's range must partition
  // the tokens, or a token would be attended twice or not at all (checked
  // before the merge uses it).
  const kvstore::Partition part = store_->partition(layer);
  if (part.n_tokens != pos + 1 || part.local_begin != ring_first)
    fail(ErrorCode::kInternal, "Sequence::decode: layer ", layer, " at position ", pos, ": store local range [",
         part.local_begin, ", ", part.n_tokens, ") is not the device ring's [", ring_first, ", ", pos + 1, ")");
  device_->decode_merge(layer, as_const(cpu_out), as_const(lse), *ws.attn);
  attention_output(layer, x, ws);
  return policy().last_stats().attended_tokens + (part.n_tokens - part.local_begin) * s.n_kv_heads;
}

}  // namespace longctx::scheduler
