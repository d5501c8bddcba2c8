// Sequence, device path (sequence.h): attention through the backend's
// DeviceAttention. The backend computes q/k/v and the MLP as on the CPU path;
// the device attends the prefill chunks and the decode local window, the KV
// store still receives every token and the policy attends the rest on the CPU.
#include "longctx/scheduler/sequence.h"
#include "sequence_internal.h"

namespace longctx::scheduler {

void Sequence::device_prefill_chunk(int layer, int64_t first_pos, BackendTensor& x, Workspace& ws,
                                    const std::function<void(const float* q, int64_t n)>& on_queries) {
  attention_inputs(layer, first_pos, x, ws);
  // The rest of the layer is queued behind the attention, so the device runs
  // it while the host appends the chunk's K/V to the store.
  device_->prefill_chunk(layer, first_pos, *ws.q, *ws.k, *ws.v, *ws.attn, [&] { attention_output(layer, x, ws); });
  if (on_queries) {  // only the chunks with queries in the policy's window
    if (backend_.host_memory()) backend_.synchronize();
    const TensorView q = host_view(backend_, *ws.q, ws.host_q);
    on_queries(static_cast<const float*>(q.data), ws.n);
  }
}

int64_t Sequence::device_decode_layer(int layer, int64_t pos, BackendTensor& x, Workspace& ws) {
  attention_inputs(layer, pos, x, ws);
  if (backend_.host_memory()) backend_.synchronize();
  const int64_t attended = device_->decode(layer, pos, *ws.q, *ws.k, *ws.v, *ws.attn);
  stats_.decode_append_seconds += attention_->last_append_seconds();
  attention_output(layer, x, ws);
  return attended;
}

}  // namespace longctx::scheduler
