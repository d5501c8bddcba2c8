// The device half of one sequence's layer attention: the layer step of
// LayerAttention (layer_attention.h) when a backend's DeviceAttention attends
// the prefill chunks and the decode local window. Sequence's device path runs
// it between its projections, and longctx.torch runs it for injected modules
// whose tensors live on a CUDA device, so both attend the same way.
//
//   begin_layer    the start of a layer's prefill turn: the layer's cached
//                  K/V (earlier turns, a loaded snapshot) uploaded from the
//                  store as the device's history, which refills its ring;
//   prefill_chunk  the chunk attended on the device, its K/V appended to the
//                  store while the device goes on;
//   decode         the token enters the ring, which attends [ring_first, pos]
//                  on the device while the CPU appends it to the store and
//                  LayerAttention attends the rest (include_local = false);
//                  then one merge on the device.
//
// Ownership: the device's buffers belong to whoever last configured or
// cleared it (DeviceAttention::epoch). claim() takes them back, which drops
// what another owner left there; owns() says whether they are still ours.
// A caller that does not own the device must not call begin_layer,
// prefill_chunk or decode (they refuse); Sequence attends on the CPU then.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/core/config.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/scheduler/layer_attention.h"

namespace longctx::scheduler {

class DeviceLayerAttention {
 public:
  // Why `config` with heads of `head_dim` cannot attend on a device (the
  // device kernels' table: f16/bf16 K/V, head_dim 64/128/256; no policy that
  // needs the local window on the CPU, no restricted prefill); "" when it can.
  static std::string declined(const LongContextConfig& config, int head_dim);
  // The device shape of a model: its heads and scale, the config's kv_type,
  // max_seq_len, local_windows_len and initial_len.
  static DeviceAttention::Shape shape_for(const LongContextConfig& config, int n_layers, int n_heads,
                                          int n_kv_heads, int head_dim, float scale);
  // Host memory the device's history staging takes (history_buffer of
  // max_tokens rows, K and V): the caller counts it in its DRAM budget.
  static uint64_t history_bytes(const DeviceAttention::Shape& shape);

  // device, store and attention outlive this object; store's layout matches
  // `shape` (Error(kInvalidArgument) naming the field otherwise). Claims the device.
  DeviceLayerAttention(DeviceAttention& device, const DeviceAttention::Shape& shape, kvstore::KVStore& store,
                       LayerAttention& attention);

  bool owns() const { return device_.epoch() == epoch_; }
  // Configures the device for this shape (dropping every token on it) unless it is ours already.
  void claim();
  // Drops every token on the device if it is ours (another owner's tokens are not ours to drop).
  void clear();

  // The start of `layer`'s prefill turn (above).
  void begin_layer(int layer);
  // claim(), then begin_layer for every layer: the device's rings hold the
  // store's last tokens again (a loaded, truncated or cleared store, a new owner).
  void sync_with_store();
  // q [n, n_heads*head_dim], k/v [n, n_kv_heads*head_dim] (device f32, after
  // RoPE) of `layer` at [first_pos, first_pos + n), first_pos = the tokens
  // the store holds for it: out [n, n_heads*head_dim] queued on the device,
  // k/v appended to the store. The caller reads out in the backend's stream
  // order. queue_after (may be empty) queues more device work (the rest of
  // the layer) before the host waits for the chunk's K/V, so the device runs
  // it while the host appends them.
  void prefill_chunk(int layer, int64_t first_pos, const BackendTensor& q, const BackendTensor& k,
                     const BackendTensor& v, BackendTensor& out, const std::function<void()>& queue_after = {});
  // One decode step of `layer` at position pos (= the tokens the store holds
  // for it): q [1, n_heads*head_dim], k/v [1, n_kv_heads*head_dim] device f32;
  // out [1, n_heads*head_dim] queued on the device. Returns the kv-head
  // tokens attended (the CPU part's plus the window's). Error(kInternal) if
  // the ring's range and the store's local range do not partition the tokens.
  int64_t decode(int layer, int64_t pos, const BackendTensor& q, const BackendTensor& k, const BackendTensor& v,
                 BackendTensor& out);

  const DeviceAttention::Shape& shape() const { return shape_; }

 private:
  void check_owner(const char* what) const;

  DeviceAttention& device_;
  DeviceAttention::Shape shape_;
  kvstore::KVStore& store_;
  LayerAttention& attention_;
  uint64_t epoch_ = UINT64_MAX;  // the device's epoch when this object configured or cleared it
  std::vector<float> cpu_out_;   // the CPU part of a decode step [n_heads, head_dim]
  std::vector<float> cpu_lse_;   // and its lse [n_heads]
};

}  // namespace longctx::scheduler
