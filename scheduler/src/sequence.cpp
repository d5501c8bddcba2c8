// Sequence: layer-major chunked prefill and decode steps (sequence.h); the
// CPU path of attention here, the device path in sequence_device.cpp.
//
// Backend ops produce q/k/v and consume the attention output; the KV store
// and the CPU attention kernels are on the host. With a host-memory backend
// (the CPU backend) the kernels read and write the backend tensors in place;
// with another backend the tensors are staged through host vectors.
#include "longctx/scheduler/sequence.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "longctx/core/error.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/policy/quoka.h"
#include "sequence_internal.h"

namespace longctx::scheduler {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint64_t budget_bytes(const LongContextConfig& config) {
  return config.dram_budget != 0 ? config.dram_budget : kvstore::default_dram_budget();
}

// Rows [row, row + 1) of x [n, d] as a new [1, d] tensor.
std::unique_ptr<BackendTensor> copy_row(Backend& backend, const BackendTensor& x, int64_t row) {
  const int64_t d = x.shape()[1];
  auto out = backend.alloc({1, d});
  backend.synchronize();
  if (backend.host_memory()) {
    std::memcpy(out->data(), static_cast<const float*>(x.data()) + row * d, size_t(d) * sizeof(float));
    return out;
  }
  std::vector<float> host(size_t(x.numel()));
  backend.download(x, make_mutable_view(host.data(), DType::kF32, {x.shape()[0], d}));
  backend.upload(make_view(host.data() + row * d, DType::kF32, {1, d}), *out);
  return out;
}

}  // namespace

Sequence::Sequence(Backend& backend, const Transformer& model, const LongContextConfig& config,
                   const kvstore::NumaTopology* topology)
    : backend_(backend), model_(model), config_(config) {
  model_.validate();
  validate_config(config_);
  if (!topology) {
    owned_topology_ = std::make_unique<kvstore::NumaTopology>(kvstore::NumaTopology::detect());
    topology = owned_topology_.get();
  }
  topology_ = topology;
  budget_ = std::make_unique<kvstore::MemoryBudget>(budget_bytes(config_));
  DeviceAttention* device = backend_.device_attention();
  const TransformerSpec& s = model_.spec;
  device_declined_ =
      device ? DeviceLayerAttention::declined(config_, s.head_dim) : "the backend has no device attention";
  const bool device_path = device && device_declined_.empty();
  const DeviceAttention::Shape device_shape =
      DeviceLayerAttention::shape_for(config_, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.attn_scale);
  // The device path reads a layer's cached K/V back into the device's pinned
  // host memory (DeviceAttention::history_buffer) for begin_prefill_layer: up to max_seq_len
  // tokens of K and V, held in the budget before the store's preflight.
  uint64_t history_bytes = 0;
  if (device_path) {
    history_bytes = DeviceLayerAttention::history_bytes(device_shape);
    budget_->reserve(history_bytes, "Sequence: host staging of one layer's K/V for the device path");
  }
  try {
    store_ = std::make_unique<kvstore::KVStore>(model_.spec.kv_shape(), config_, *budget_, *topology_);
  } catch (const Error& e) {
    if (history_bytes == 0 || e.code() != ErrorCode::kOutOfMemory) throw;
    fail(ErrorCode::kOutOfMemory, e.what(), " (", format_bytes(history_bytes),
         " of it are held for the device path's host staging of one layer's K/V)");
  }
  attention_ = std::make_unique<LayerAttention>(*store_, config_, s.attn_scale);
  // history_bytes stay reserved: the budget is this sequence's own.
  if (device_path) device_ = std::make_unique<DeviceLayerAttention>(*device, device_shape, *store_, *attention_);
}

Sequence::~Sequence() = default;

void Sequence::check_usable(const char* what) const {
  if (broken_)
    fail(ErrorCode::kInvalidArgument, "Sequence::", what,
         ": an earlier call failed while writing the KV store; call reset() first");
}

void Sequence::check_tokens(std::span<const int32_t> tokens, const char* what) const {
  if (tokens.empty()) fail(ErrorCode::kInvalidArgument, "Sequence::", what, ": no tokens");
  const int64_t n_vocab = model_.spec.n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      fail(ErrorCode::kInvalidArgument, "Sequence::", what, ": token ", i, " is ", tokens[i], ", outside [0, ",
           n_vocab, ")");
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n_past_ + n > config_.max_seq_len)
    fail(ErrorCode::kInvalidArgument, "Sequence::", what, ": ", n, " tokens after the ", n_past_,
         " already cached exceed max_seq_len ", config_.max_seq_len);
}

void Sequence::attention_inputs(int layer, int64_t first_pos, const BackendTensor& x, Workspace& ws) {
  Backend& b = backend_;
  const TransformerSpec& s = model_.spec;
  const LayerWeights& w = model_.weights.layers[size_t(layer)];
  b.rms_norm(x, *w.attn_norm, s.rms_eps, *ws.xn);
  b.matmul(*ws.xn, *w.wq, w.bq.get(), *ws.q);
  b.matmul(*ws.xn, *w.wk, w.bk.get(), *ws.k);
  b.matmul(*ws.xn, *w.wv, w.bv.get(), *ws.v);
  b.rope(*ws.q, first_pos, s.rope);
  b.rope(*ws.k, first_pos, s.rope);
}

void Sequence::attention_output(int layer, BackendTensor& x, Workspace& ws) {
  Backend& b = backend_;
  const TransformerSpec& s = model_.spec;
  const LayerWeights& w = model_.weights.layers[size_t(layer)];
  b.matmul(*ws.attn, *w.wo, nullptr, *ws.o);
  b.add(x, *ws.o, x);
  b.rms_norm(x, *w.ffn_norm, s.rms_eps, *ws.xn);
  b.matmul(*ws.xn, *w.w_gate, nullptr, *ws.gate);
  b.matmul(*ws.xn, *w.w_up, nullptr, *ws.up);
  b.swiglu(*ws.gate, *ws.up, *ws.gate);
  b.matmul(*ws.gate, *w.w_down, nullptr, *ws.o);
  b.add(x, *ws.o, x);
}

// The CPU path of one layer (and the device path's decode steps whose local
// window the rings do not hold yet).
void Sequence::layer_forward(int layer, int64_t first_pos, BackendTensor& x, Workspace& ws, bool decode_step,
                             const std::function<void(const float* q, int64_t n)>& on_queries) {
  Backend& b = backend_;
  const TransformerSpec& s = model_.spec;
  const int64_t n = ws.n;

  attention_inputs(layer, first_pos, x, ws);
  b.synchronize();

  const TensorView q = host_view(b, *ws.q, ws.host_q);
  const TensorView k = host_view(b, *ws.k, ws.host_k), v = host_view(b, *ws.v, ws.host_v);
  const MutableTensorView out = host_out(b, *ws.attn, ws.host_attn);
  if (decode_step) {
    attention_->decode(layer, make_view(q.data, DType::kF32, {s.n_heads, s.head_dim}), k, v, /*include_local=*/true,
                       make_mutable_view(out.data, DType::kF32, {s.n_heads, s.head_dim}),
                       make_mutable_view(ws.lse.data(), DType::kF32, {s.n_heads}));
    stats_.decode_append_seconds += attention_->last_append_seconds();
  } else {
    attention_->prefill_chunk(layer, first_pos, q, k, v, out,
                              make_mutable_view(ws.lse.data(), DType::kF32, {n, s.n_heads}));
  }
  if (on_queries) on_queries(static_cast<const float*>(q.data), n);
  if (!b.host_memory()) b.upload(as_const(out), *ws.attn);
  attention_output(layer, x, ws);
}

// Logits of every row of x [rows, n_embd] (x is left as it was).
std::vector<float> Sequence::logits_of(const BackendTensor& x, Workspace* ws) {
  const TransformerSpec& s = model_.spec;
  const int64_t rows = x.shape()[0];
  std::unique_ptr<BackendTensor> owned_normed, owned_logits;
  if (!ws) {
    owned_normed = backend_.alloc({rows, s.n_embd});
    owned_logits = backend_.alloc({rows, s.n_vocab});
  }
  BackendTensor& normed = ws ? *ws->out_norm : *owned_normed;
  BackendTensor& logits = ws ? *ws->logits : *owned_logits;
  backend_.rms_norm(x, *model_.weights.output_norm, s.rms_eps, normed);
  backend_.matmul(normed, model_.weights.output_weight(), nullptr, logits);
  std::vector<float> host(size_t(rows * s.n_vocab));
  backend_.download(logits, make_mutable_view(host.data(), DType::kF32, {rows, s.n_vocab}));
  backend_.synchronize();
  return host;
}

std::vector<float> Sequence::prefill(std::span<const int32_t> tokens, const PrefillOptions& options) {
  check_usable("prefill");
  check_tokens(tokens, "prefill");
  const auto start = std::chrono::steady_clock::now();
  const TransformerSpec& s = model_.spec;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t chunk = config_.chunk_size;
  const int64_t n_chunks = (n + chunk - 1) / chunk;

  // The hidden states of the whole prompt, one tensor per chunk.
  std::vector<std::unique_ptr<BackendTensor>> hidden;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t first = c * chunk, rows = std::min(chunk, n - first);
    hidden.push_back(backend_.alloc({rows, s.n_embd}));
    backend_.embed(*model_.weights.token_embd, tokens.subspan(size_t(first), size_t(rows)), *hidden.back());
  }
  // At most two chunk lengths: chunk_size and the last chunk's.
  std::unique_ptr<Workspace> full, tail;
  auto workspace = [&](int64_t rows) -> Workspace& {
    std::unique_ptr<Workspace>& ws = rows == chunk ? full : tail;
    if (!ws) ws = std::make_unique<Workspace>(backend_, s, rows, false);
    return *ws;
  };

  // The queries of the last w prompt tokens of each layer, for the policy.
  const int64_t w = std::min<int64_t>(config_.preselect.window, n);
  const int64_t q_row = int64_t(s.n_heads) * s.head_dim;
  std::vector<float> window_q(size_t(w * q_row));

  if (device_) device_->claim();  // before broken_: a failure here leaves everything as it was
  broken_ = true;  // cleared when every layer holds the new tokens
  for (int layer = 0; layer < s.n_layers; ++layer) {
    if (device_) device_->begin_layer(layer);
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t first = c * chunk;
      BackendTensor& x = *hidden[size_t(c)];
      const int64_t rows = x.shape()[0];
      const std::function<void(const float*, int64_t)> keep_window = [&](const float* q, int64_t rows_in) {
        for (int64_t i = std::max(first, n - w); i < first + rows_in; ++i)
          std::memcpy(window_q.data() + (i - (n - w)) * q_row, q + (i - first) * q_row, size_t(q_row) * sizeof(float));
      };
      if (device_)
        device_prefill_chunk(layer, n_past_ + first, x, workspace(rows),
                             first + rows > n - w ? keep_window : std::function<void(const float*, int64_t)>());
      else
        layer_forward(layer, n_past_ + first, x, workspace(rows), false, keep_window);
      if (options.progress) options.progress(int64_t(layer) * n + first + rows, int64_t(s.n_layers) * n);
    }
    attention_->end_prefill(layer, make_view(window_q.data(), DType::kF32, {w, s.n_heads, s.head_dim}));
  }
  n_past_ += n;
  broken_ = false;

  if (options.on_logits) {
    for (int64_t c = 0; c < n_chunks; ++c) {
      const BackendTensor& x = *hidden[size_t(c)];
      const int64_t rows = x.shape()[0];
      const std::vector<float> logits = logits_of(x);
      options.on_logits(c * chunk, rows, logits);
    }
  }
  const BackendTensor& last = *hidden.back();
  const auto last_row = copy_row(backend_, last, last.shape()[0] - 1);
  std::vector<float> logits = logits_of(*last_row);
  stats_.prefill_tokens += n;
  stats_.prefill_seconds += seconds_since(start);
  return logits;
}

std::vector<float> Sequence::decode(int32_t token) {
  check_usable("decode");
  check_tokens(std::span<const int32_t>(&token, 1), "decode");
  const auto start = std::chrono::steady_clock::now();
  const TransformerSpec& s = model_.spec;
  if (!decode_ws_) decode_ws_ = std::make_unique<Workspace>(backend_, s, 1, true);
  Workspace& ws = *decode_ws_;
  backend_.embed(*model_.weights.token_embd, std::span<const int32_t>(&token, 1), *ws.x);

  // Another sequence may hold the device's rings: then this step runs on the CPU.
  const bool on_device = owns_device();
  if (device_ && !on_device) ++stats_.decode_steps_off_device;
  broken_ = true;
  int64_t attended = 0, cached = 0;
  double tail_mass = 0.0;
  int tail_layers = 0;
  for (int layer = 0; layer < s.n_layers; ++layer) {
    if (on_device) {
      attended += device_decode_layer(layer, n_past_, *ws.x, ws);
    } else {
      layer_forward(layer, n_past_, *ws.x, ws, true, nullptr);
      attended += policy().last_stats().attended_tokens;
    }
    stats_.decode_select_seconds += policy().last_stats().select_seconds;
    stats_.decode_attend_seconds += policy().last_stats().attend_seconds;
    stats_.speculated_selections += policy().last_stats().speculated ? 1 : 0;
    stats_.fresh_selections += policy().last_stats().reselected ? 1 : 0;
    cached += store_->n_tokens(layer) * s.n_kv_heads;
    if (const std::vector<double>& heads = policy().last_stats().tail_mass; !heads.empty()) {
      for (double m : heads) tail_mass += m / double(heads.size());
      ++tail_layers;
    }
  }
  if (tail_layers > 0) {
    stats_.sum_tail_mass += tail_mass / tail_layers;
    ++stats_.tail_steps;
  }
  ++n_past_;
  broken_ = false;

  std::vector<float> logits = logits_of(*ws.x, &ws);
  stats_.decode_tokens += 1;
  stats_.decode_seconds += seconds_since(start);
  stats_.last_attended_fraction = cached > 0 ? double(attended) / double(cached) : 0.0;
  stats_.sum_attended_fraction += stats_.last_attended_fraction;
  return logits;
}

void Sequence::sync_with_store() {
  const int64_t n = store_->n_tokens(0);
  for (int layer = 1; layer < model_.spec.n_layers; ++layer)
    if (store_->n_tokens(layer) != n)
      fail(ErrorCode::kInvalidArgument, "Sequence::sync_with_store: layer ", layer, " holds ",
           store_->n_tokens(layer), " tokens, layer 0 holds ", n);
  attention_->restart();
  if (device_) {
    device_->claim();  // before broken_: a failure here leaves the sequence usable
    broken_ = true;    // until every layer's ring holds the store's last tokens
    device_->sync_with_store();
  }
  n_past_ = n;
  broken_ = false;
}

void Sequence::truncate(int64_t n_tokens) {
  check_usable("truncate");
  if (n_tokens > n_past_)
    fail(ErrorCode::kInvalidArgument, "Sequence::truncate: keep ", n_tokens, " tokens, but it holds ", n_past_);
  store_->truncate(n_tokens);  // checks the block multiple before dropping anything
  sync_with_store();
}

void Sequence::reset() {
  store_->clear();
  if (device_) device_->clear();  // only if ours: another sequence's tokens are not ours to drop
  attention_->restart();
  n_past_ = 0;
  broken_ = false;
}

}  // namespace longctx::scheduler
