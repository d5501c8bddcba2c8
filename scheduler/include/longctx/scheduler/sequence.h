// One sequence of a Transformer: its KV store, its decode policy and the
// forward passes that fill and read them (docs/architecture.md: one prefill
// chunk, one decode step).
//
// prefill(tokens), layer-major: the hidden states of all the tokens, kept as
// one backend tensor per chunk of chunk_size tokens, go through layer 0, then
// layer 1, ... For each layer and chunk at positions [p, p + n): RMSNorm,
// q/k/v projections (+ bias), RoPE at positions p.., K/V appended to the
// layer in the KV store, CPU prefill attention of the chunk's queries over
// the layer's earlier tokens and the chunk causally (QUOKA-restricted
// history when config.quoka.enabled), output projection, residual, MLP,
// residual. When a layer is done, DecodePolicy::on_prefill_end gets its last
// min(preselect.window, n) queries (SnapKV preselection, DYNAMIC
// representatives, H2O). The logits of the last token are returned; those of
// every position are passed chunk by chunk to PrefillOptions::on_logits.
//
// decode(token): one token through every layer; its K/V are appended and
// DecodePolicy::decode attends what config.policy selects (the local window
// included: there is no device window on the CPU path).
//
// Every attention, prefill and decode, CPU and device, scores at the model's
// scale, model.spec.attn_scale (the policy is built with it, the
// DeviceAttention configured with it), so partial results merge by LSE.
//
// Device path: when backend.device_attention() is non-null, kv_type is f16 or
// bf16, head_dim is 64, 128 or 256, policy is not h2o (it attends its recent
// tokens on the CPU) and QUOKA prefill is off (a restricted prefill on the
// CPU), attention goes through the backend's DeviceAttention, which the
// constructor configures. Prefill: per layer begin_prefill_layer with the
// layer's cached tokens (multi-turn), per chunk prefill_chunk on the device,
// then the chunk's K/V (chunk_kv) appended to the store while the device
// runs the MLP; only the chunks holding the policy's window queries download
// q. Decode: decode_local attends the device ring's [max(initial_len, pos + 1
// - window), pos], which is the store's Partition local range once the token
// is appended; the policy attends the rest (include_local = false) and
// decode_merge combines them. The rings are filled by prefill_chunk and
// decode_local, and by begin_prefill_layer from a layer's cached K/V, which
// is how sync_with_store refills them.
//
// One DeviceAttention, several sequences: its buffers belong to the sequence
// that last configured or cleared it (owns_device, DeviceAttention::epoch).
// A sequence whose device another one has taken runs its decode steps on the
// CPU path (window included; stats().decode_steps_off_device counts them),
// and takes the device back at its next prefill or sync_with_store, which
// configure it again and refill the rings from the store. reset() clears the
// device only when it owns it. So interleaved sequences give the tokens each
// gives alone. Without a device path everything runs on the CPU as described
// above.
//
// A later prefill continues at n_past (multi-turn): the new tokens attend
// everything before them and the policy is fed the new prompt's last queries.
//
// The backend's ops are queued in order; host reads wait with synchronize().
// Not thread-safe. If an operation throws after it started writing the KV
// store (an out-of-memory inside a layer, say), the sequence is marked broken
// and every later call throws until reset().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/core/config.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/scheduler/device_layer_attention.h"
#include "longctx/scheduler/layer_attention.h"
#include "longctx/scheduler/transformer.h"

namespace longctx::scheduler {

struct PrefillOptions {
  // Progress in token-layers: called after every (layer, chunk) with
  // done = layers finished * n + tokens of the current layer, total = n_layers * n.
  std::function<void(int64_t done, int64_t total)> progress;
  // When set, receives the logits of every position of this prefill, in order:
  // first = index (in `tokens`) of the chunk's first token, logits f32
  // [n, n_vocab] row-major. Costs one output projection per position.
  std::function<void(int64_t first, int64_t n, std::span<const float> logits)> on_logits;
};

struct SequenceStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  int64_t decode_tokens = 0;
  double decode_seconds = 0.0;
  // Attended fraction of a decode step: tokens attended exactly, summed over
  // layers and kv heads, over the tokens cached (layers x kv heads x n_tokens).
  double last_attended_fraction = 0.0;
  double sum_attended_fraction = 0.0;  // over the decode steps counted above
  // Where the decode steps' time went (seconds, summed over them and their
  // layers): the token's K/V into the store, the policy's scoring and
  // selection, its attention. The rest of decode_seconds is the backend's
  // work (GEMVs, norms, RoPE, MLP, logits) and the waits for it.
  double decode_append_seconds = 0.0;
  double decode_select_seconds = 0.0;
  double decode_attend_seconds = 0.0;
  // Decode steps of a device-path sequence that ran on the CPU because the
  // device held another sequence's tokens (owns_device() false).
  int64_t decode_steps_off_device = 0;
  // tail: estimate: the estimated tail's share of the attention mass, mean
  // over the layers and kv heads of a step (DecodePolicy::Stats::tail_mass),
  // summed over the steps that had one.
  double sum_tail_mass = 0.0;
  int64_t tail_steps = 0;
  // speculate: layer steps that reused their last selection (the query stayed
  // close) and that selected anew.
  int64_t speculated_selections = 0;
  int64_t fresh_selections = 0;

  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0.0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0; }
  double mean_attended_fraction() const { return decode_tokens > 0 ? sum_attended_fraction / decode_tokens : 0.0; }
  double mean_tail_mass() const { return tail_steps > 0 ? sum_tail_mass / double(tail_steps) : 0.0; }
};

class Sequence {
 public:
  // Validates the model (Transformer::validate) and the config
  // (validate_config), then builds the KV store for config.max_seq_len
  // (preflight: Error(kOutOfMemory) when config.dram_budget, or 90% of the
  // machine's memory when 0, cannot hold it) and the decode policy.
  // `backend` and `model` must outlive the sequence and `model`'s weights
  // must live on `backend`. `topology`: null = the machine's (hwloc).
  Sequence(Backend& backend, const Transformer& model, const LongContextConfig& config,
           const kvstore::NumaTopology* topology = nullptr);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Appends `tokens` (at least one) at n_past and returns the logits of the
  // last one, f32 [n_vocab]. Throws Error(kInvalidArgument) before touching
  // anything for an empty prompt, a token outside [0, n_vocab), or
  // n_past + n > max_seq_len.
  std::vector<float> prefill(std::span<const int32_t> tokens, const PrefillOptions& options = {});

  // Appends one token at n_past and returns the logits that follow it. The
  // same checks as prefill.
  std::vector<float> decode(int32_t token);

  int64_t n_past() const { return n_past_; }
  const SequenceStats& stats() const { return stats_; }
  void reset_stats() { stats_ = SequenceStats{}; }
  // The policy's record of the last decode step.
  const policy::DecodePolicy& policy() const { return attention_->policy(); }

  // The KV store, e.g. for snapshots. After load_snapshot into it, call
  // sync_with_store().
  kvstore::KVStore& store() { return *store_; }
  const kvstore::KVStore& store() const { return *store_; }
  // Takes n_past from the store (every layer must hold the same number of
  // tokens, else Error(kInvalidArgument)) and starts a fresh decode policy
  // (its prefill-end state is lost; the next prefill feeds it again). On the
  // device path it uploads every layer's K/V (begin_prefill_layer), which
  // refills the device rings; if that throws, the sequence is broken.
  void sync_with_store();

  // Keeps the first n_tokens (a whole number of blocks, at most n_past: else
  // Error(kInvalidArgument), nothing changed) and drops the rest
  // (KVStore::truncate), then sync_with_store(): a later prefill continues at
  // n_tokens as if only those tokens had been given. How a cached prefix is
  // reused for a prompt that starts with it.
  void truncate(int64_t n_tokens);

  // Drops every token (the device's too) and the policy's state; n_past = 0,
  // stats kept.
  void reset();

  const Transformer& model() const { return model_; }
  const LongContextConfig& config() const { return config_; }
  // True when attention goes through the backend's DeviceAttention (above).
  bool uses_device_attention() const { return device_ != nullptr; }
  // Why not ("" when it does), e.g. "policy h2o (it attends its recent tokens on the CPU)".
  const std::string& device_declined() const { return device_declined_; }
  // The CPU prefill attention kernel the config chose (prefill_kernel).
  cpu::PrefillKernel prefill_kernel() const { return attention_->prefill_kernel(); }
  // True while the device's buffers hold this sequence's tokens: it was the
  // last to configure or clear the backend's DeviceAttention (DeviceAttention::epoch).
  bool owns_device() const { return device_ != nullptr && device_->owns(); }

 private:
  struct Workspace;

  void check_usable(const char* what) const;
  void check_tokens(std::span<const int32_t> tokens, const char* what) const;
  // One layer over the rows of x [n, n_embd] at positions first_pos.., in
  // place. on_queries (may be empty) sees the rows' queries after RoPE, host
  // f32 [n, n_heads, head_dim].
  void layer_forward(int layer, int64_t first_pos, BackendTensor& x, Workspace& ws, bool decode_step,
                     const std::function<void(const float* q, int64_t n)>& on_queries);
  // The two halves of a layer around attention: norm, q/k/v (+ bias), RoPE
  // into ws.q/k/v; then output projection, residual and MLP from ws.attn.
  void attention_inputs(int layer, int64_t first_pos, const BackendTensor& x, Workspace& ws);
  void attention_output(int layer, BackendTensor& x, Workspace& ws);
  // Device path (sequence_device.cpp): one chunk, one decode layer, between
  // the layer's projections (DeviceLayerAttention does the attention).
  void device_prefill_chunk(int layer, int64_t first_pos, BackendTensor& x, Workspace& ws,
                            const std::function<void(const float* q, int64_t n)>& on_queries);
  // Returns the tokens the step attended exactly, summed over kv heads.
  int64_t device_decode_layer(int layer, int64_t pos, BackendTensor& x, Workspace& ws);
  // Logits f32 [rows, n_vocab] of every row of x [rows, n_embd]; `ws`, when
  // given, holds the [1, ...] tensors of the decode step's logits.
  std::vector<float> logits_of(const BackendTensor& x, Workspace* ws = nullptr);

  Backend& backend_;
  const Transformer& model_;
  LongContextConfig config_;
  std::unique_ptr<kvstore::NumaTopology> owned_topology_;
  const kvstore::NumaTopology* topology_ = nullptr;
  std::unique_ptr<kvstore::MemoryBudget> budget_;
  std::unique_ptr<kvstore::KVStore> store_;
  std::unique_ptr<LayerAttention> attention_;  // the store's attention and decode policy, at the model's scale
  std::unique_ptr<Workspace> decode_ws_;
  std::unique_ptr<DeviceLayerAttention> device_;  // the device path's attention; null: CPU path
  std::string device_declined_;                   // why device_ is null ("" when it is not)
  int64_t n_past_ = 0;
  bool broken_ = false;
  SequenceStats stats_;
};

}  // namespace longctx::scheduler
