// A host-memory stand-in for a device backend, for the scheduler's device
// path tests: FakeDeviceAttention implements core/backend.h's DeviceAttention
// with plain fp64 loops (K/V rounded to kv_dtype with longctx::convert, as the
// device stores them), and FakeDeviceBackend forwards every Backend op to a
// host-memory backend (the CPU backend) while reporting host_memory() = false
// (so the scheduler stages through download/upload as on a GPU) and returning
// the fake from device_attention().
//
// Rings as the CUDA backend keeps them (gpu/src/cuda_device_attention.cpp):
// begin_prefill_layer also loads the last min(window, n_history) history
// tokens into the layer's ring, and decode_local(layer, pos) requires pos =
// the tokens the layer's ring has seen (set by begin_prefill_layer, advanced
// by prefill_chunk and decode_local).
//
// The fake is strict: it throws Error(kInvalidArgument) for calls outside the
// contract (a chunk of another layer than begun, first_pos not the tokens the
// layer holds, decode_local at another pos, wrong shapes, merge without
// decode_local), and Error(kInternal) from decode_merge when the last
// decode_local read a ring slot that does not hold the position it stands for
// (a stale window). It counts its calls so tests can tell the device path was
// taken.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/core/forwarding_backend.h"
#include "longctx/core/error.h"
#include "longctx/core/local_window.h"

namespace longctx::testing {

class FakeDeviceAttention final : public DeviceAttention {
 public:
  struct Calls {
    int configure = 0, clear = 0, begin_prefill_layer = 0, prefill_chunk = 0, chunk_kv = 0, decode_local = 0,
        decode_merge = 0;
    int total() const {
      return configure + clear + begin_prefill_layer + prefill_chunk + chunk_kv + decode_local + decode_merge;
    }
  };
  const Calls& calls() const { return calls_; }
  // history rows of every begin_prefill_layer call, in order.
  const std::vector<int64_t>& history_rows() const { return history_rows_; }
  const Shape& shape() const { return shape_; }

 protected:
  void configure_buffers(const Shape& shape) override {
    ++calls_.configure;
    auto bad = [](const char* field, auto value) {
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::configure: ", field, " = ", value, " unsupported");
    };
    if (shape.n_layers < 1) bad("n_layers", shape.n_layers);
    if (shape.n_kv_heads < 1 || shape.n_heads < 1 || shape.n_heads % shape.n_kv_heads != 0)
      bad("n_kv_heads", shape.n_kv_heads);
    if (shape.head_dim != 64 && shape.head_dim != 128 && shape.head_dim != 256) bad("head_dim", shape.head_dim);
    if (shape.kv_dtype != DType::kF16 && shape.kv_dtype != DType::kBF16) bad("kv_dtype", dtype_name(shape.kv_dtype));
    if (shape.max_tokens < 1) bad("max_tokens", shape.max_tokens);
    if (shape.window < 0) bad("window", shape.window);
    if (shape.initial_len < 0) bad("initial_len", shape.initial_len);
    shape_ = shape;
    row_ = size_t(shape.n_kv_heads) * size_t(shape.head_dim);
    layer_k_.assign(size_t(shape.max_tokens) * row_, 0.0f);
    layer_v_.assign(layer_k_.size(), 0.0f);
    ring_k_.assign(size_t(shape.n_layers), std::vector<float>(size_t(shape.window) * row_, 0.0f));
    ring_v_ = ring_k_;
    reset_rings();
  }

  void drop_tokens() override {
    ++calls_.clear;
    reset_rings();
  }

 public:
  void begin_prefill_layer(int layer, const TensorView& history_k, const TensorView& history_v) override {
    ++calls_.begin_prefill_layer;
    check_layer(layer, "begin_prefill_layer");
    const int64_t n = history_k.rank == 3 ? history_k.shape[0] : -1;
    check_kv_view(history_k, n, "begin_prefill_layer history_k");
    check_kv_view(history_v, n, "begin_prefill_layer history_v");
    if (n > shape_.max_tokens)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention: history of ", n, " tokens > max_tokens");
    if (n > 0) {  // any dtype -> f32, rounded to kv_dtype
      convert(history_k.data, history_k.dtype, layer_k_.data(), DType::kF32, size_t(n) * row_);
      convert(history_v.data, history_v.dtype, layer_v_.data(), DType::kF32, size_t(n) * row_);
      round_to_kv(layer_k_.data(), size_t(n) * row_);
      round_to_kv(layer_v_.data(), size_t(n) * row_);
    }
    for (int64_t p = std::max<int64_t>(0, n - shape_.window); p < n; ++p)
      ring_put(layer, p, layer_k_.data() + size_t(p) * row_, layer_v_.data() + size_t(p) * row_);
    ring_seen_[size_t(layer)] = n;
    history_rows_.push_back(n);
    prefill_layer_ = layer;
    layer_tokens_ = n;
    chunk_n_ = -1;
  }

  HostKVBuffer history_buffer(int64_t rows) override {
    if (rows < 0 || rows > shape_.max_tokens)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::history_buffer: ", rows, " rows");
    const size_t elems = std::max<size_t>(1, size_t(rows) * row_);  // never null
    history_k_.assign(elems * dtype_size(shape_.kv_dtype), std::byte{0});
    history_v_.assign(history_k_.size(), std::byte{0});
    HostKVBuffer b;
    b.k = make_mutable_view(history_k_.data(), shape_.kv_dtype, {rows, shape_.n_kv_heads, shape_.head_dim});
    b.v = make_mutable_view(history_v_.data(), shape_.kv_dtype, {rows, shape_.n_kv_heads, shape_.head_dim});
    return b;
  }

  void prefill_chunk(int layer, int64_t first_pos, const BackendTensor& q, const BackendTensor& k,
                     const BackendTensor& v, BackendTensor& out) override {
    ++calls_.prefill_chunk;
    if (layer != prefill_layer_)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::prefill_chunk: layer ", layer, " but layer ",
           prefill_layer_, " was begun");
    if (first_pos != layer_tokens_)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::prefill_chunk: first_pos ", first_pos, " but layer ",
           layer, " holds ", layer_tokens_, " tokens");
    const int64_t n = q.shape().empty() ? 0 : q.shape()[0];
    check_tensor(q, n, q_row(), "prefill_chunk q");
    check_tensor(k, n, int64_t(row_), "prefill_chunk k");
    check_tensor(v, n, int64_t(row_), "prefill_chunk v");
    check_tensor(out, n, q_row(), "prefill_chunk out");
    if (first_pos + n > shape_.max_tokens)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::prefill_chunk: ", first_pos + n, " tokens > max_tokens");
    const size_t at = size_t(first_pos) * row_, count = size_t(n) * row_;
    std::memcpy(layer_k_.data() + at, k.data(), count * sizeof(float));
    std::memcpy(layer_v_.data() + at, v.data(), count * sizeof(float));
    round_to_kv(layer_k_.data() + at, count);
    round_to_kv(layer_v_.data() + at, count);
    for (int64_t i = 0; i < n; ++i) ring_put(layer, first_pos + i, layer_k_.data() + at + size_t(i) * row_,
                                             layer_v_.data() + at + size_t(i) * row_);
    layer_tokens_ = first_pos + n;
    ring_seen_[size_t(layer)] = layer_tokens_;
    chunk_k_.resize(count);
    chunk_v_.resize(count);
    convert(layer_k_.data() + at, DType::kF32, chunk_k_.data(), shape_.kv_dtype, count);  // exact: already rounded
    convert(layer_v_.data() + at, DType::kF32, chunk_v_.data(), shape_.kv_dtype, count);
    chunk_n_ = n;

    const auto* qf = static_cast<const float*>(q.data());
    auto* of = static_cast<float*>(out.data());
    std::vector<int64_t> keys;
    for (int64_t i = 0; i < n; ++i) {
      keys.resize(size_t(first_pos + i + 1));
      for (size_t j = 0; j < keys.size(); ++j) keys[j] = int64_t(j);
      for (int h = 0; h < shape_.n_heads; ++h) {
        double lse = 0;
        attend(qf + i * q_row() + h * shape_.head_dim, h, keys, layer_k_.data(), layer_v_.data(),
               [](int64_t j) { return j; }, of + i * q_row() + h * shape_.head_dim, &lse);
      }
    }
  }

  HostKV chunk_kv() override {
    ++calls_.chunk_kv;
    if (chunk_n_ < 0) fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::chunk_kv: no prefill_chunk before");
    HostKV kv;
    kv.k = make_view(chunk_k_.data(), shape_.kv_dtype, {chunk_n_, shape_.n_kv_heads, shape_.head_dim});
    kv.v = make_view(chunk_v_.data(), shape_.kv_dtype, {chunk_n_, shape_.n_kv_heads, shape_.head_dim});
    return kv;
  }

  DecodeLocal decode_local(int layer, int64_t pos, const BackendTensor& q, const BackendTensor& k,
                           const BackendTensor& v) override {
    ++calls_.decode_local;
    check_layer(layer, "decode_local");
    check_tensor(q, 1, q_row(), "decode_local q");
    check_tensor(k, 1, int64_t(row_), "decode_local k");
    check_tensor(v, 1, int64_t(row_), "decode_local v");
    if (pos != ring_seen_[size_t(layer)] || pos >= shape_.max_tokens)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::decode_local: pos ", pos, " of layer ", layer,
           ": the ring has seen ", ring_seen_[size_t(layer)], " tokens (max_tokens ", shape_.max_tokens, ")");
    if (prefill_layer_ == layer) prefill_layer_ = -1;  // a decode step ends the layer's prefill
    std::vector<float> kr(row_), vr(row_);
    std::memcpy(kr.data(), k.data(), row_ * sizeof(float));
    std::memcpy(vr.data(), v.data(), row_ * sizeof(float));
    round_to_kv(kr.data(), row_);
    round_to_kv(vr.data(), row_);
    ring_put(layer, pos, kr.data(), vr.data());
    ring_seen_[size_t(layer)] = pos + 1;
    // [local_window_begin(pos + 1, initial_len, window), pos]; slot = position % window.
    const int64_t first = local_window_begin(pos + 1, shape_.initial_len, shape_.window);
    std::vector<int64_t> keys;
    pending_stale_ = false;
    for (int64_t p = first; p <= pos; ++p) {
      keys.push_back(p);
      if (ring_pos_[size_t(layer)][size_t(p % shape_.window)] != p) pending_stale_ = true;
    }
    local_ranges_.push_back({first, pos + 1});
    pending_out_.assign(size_t(q_row()), 0.0f);
    pending_lse_.assign(size_t(shape_.n_heads), 0.0);
    const int64_t w = shape_.window;
    for (int h = 0; h < shape_.n_heads; ++h)
      attend(static_cast<const float*>(q.data()) + h * shape_.head_dim, h, keys, ring_k_[size_t(layer)].data(),
             ring_v_[size_t(layer)].data(), [w](int64_t p) { return p % w; },
             pending_out_.data() + h * shape_.head_dim, &pending_lse_[size_t(h)]);
    pending_layer_ = layer;
    // The host copies, as the CUDA device's pinned ones.
    const auto* qp = static_cast<const float*>(q.data());
    step_qkv_.assign(qp, qp + q_row());
    step_qkv_.insert(step_qkv_.end(), static_cast<const float*>(k.data()), static_cast<const float*>(k.data()) + row_);
    step_qkv_.insert(step_qkv_.end(), static_cast<const float*>(v.data()), static_cast<const float*>(v.data()) + row_);
    DecodeLocal r;
    r.first_pos = first;
    r.q = make_view(step_qkv_.data(), DType::kF32, {shape_.n_heads, shape_.head_dim});
    r.k = make_view(step_qkv_.data() + q_row(), DType::kF32, {1, shape_.n_kv_heads, shape_.head_dim});
    r.v = make_view(step_qkv_.data() + q_row() + int64_t(row_), DType::kF32, {1, shape_.n_kv_heads, shape_.head_dim});
    return r;
  }

  void decode_merge(int layer, const TensorView& cpu_out, const TensorView& cpu_lse, BackendTensor& out) override {
    ++calls_.decode_merge;
    if (layer != pending_layer_)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::decode_merge: layer ", layer,
           " but the last decode_local was layer ", pending_layer_);
    pending_layer_ = -1;
    if (pending_stale_)
      fail(ErrorCode::kInternal, "FakeDeviceAttention::decode_merge: layer ", layer,
           ": the local part read ring slots that do not hold their positions");
    check_shape(cpu_out, "decode_merge cpu_out", {shape_.n_heads, shape_.head_dim});
    check_dtype(cpu_out, "decode_merge cpu_out", DType::kF32);
    check_shape(cpu_lse, "decode_merge cpu_lse", {shape_.n_heads});
    check_dtype(cpu_lse, "decode_merge cpu_lse", DType::kF32);
    check_tensor(out, 1, q_row(), "decode_merge out");
    const auto* co = static_cast<const float*>(cpu_out.data);
    const auto* cl = static_cast<const float*>(cpu_lse.data);
    auto* of = static_cast<float*>(out.data());
    const double inf = std::numeric_limits<double>::infinity();
    for (int h = 0; h < shape_.n_heads; ++h) {  // the contract's merge, fp64
      const double l1 = cl[h], l2 = pending_lse_[size_t(h)];
      const double m = std::max(l1, l2);
      const double w1 = l1 == -inf ? 0.0 : std::exp(l1 - m), w2 = l2 == -inf ? 0.0 : std::exp(l2 - m);
      for (int c = 0; c < shape_.head_dim; ++c) {
        const size_t i = size_t(h) * size_t(shape_.head_dim) + size_t(c);
        of[i] = w1 + w2 > 0 ? float((w1 * co[i] + w2 * pending_out_[i]) / (w1 + w2)) : 0.0f;
      }
    }
  }

  // [first, end) of every decode_local's local range, in order.
  const std::vector<std::pair<int64_t, int64_t>>& local_ranges() const { return local_ranges_; }

 private:
  int64_t q_row() const { return int64_t(shape_.n_heads) * shape_.head_dim; }

  void reset_rings() {
    ring_pos_.assign(size_t(shape_.n_layers), std::vector<int64_t>(size_t(shape_.window), -1));
    ring_seen_.assign(size_t(shape_.n_layers), 0);
    prefill_layer_ = -1;
    layer_tokens_ = 0;
    chunk_n_ = -1;
    pending_layer_ = -1;
  }

  void check_layer(int layer, const char* what) const {
    if (layer < 0 || layer >= shape_.n_layers)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention::", what, ": layer ", layer, " out of range");
  }
  void check_kv_view(const TensorView& t, int64_t n, const char* what) const {
    check_shape(t, what, {n, shape_.n_kv_heads, shape_.head_dim});
    if (!t.is_contiguous() || !t.data) fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention: ", what, " not contiguous");
  }
  static void check_tensor(const BackendTensor& t, int64_t rows, int64_t row_elems, const char* what) {
    if (t.dtype() != DType::kF32 || t.shape().empty() || t.shape()[0] != rows || t.numel() != rows * row_elems)
      fail(ErrorCode::kInvalidArgument, "FakeDeviceAttention: ", what, " is ", t.describe(), ", expected f32 ", rows,
           " rows of ", row_elems);
  }

  void ring_put(int layer, int64_t pos, const float* k, const float* v) {
    if (shape_.window == 0) return;
    const size_t slot = size_t(pos % shape_.window);
    std::memcpy(ring_k_[size_t(layer)].data() + slot * row_, k, row_ * sizeof(float));
    std::memcpy(ring_v_[size_t(layer)].data() + slot * row_, v, row_ * sizeof(float));
    ring_pos_[size_t(layer)][slot] = pos;
  }

  // x rounded to kv_dtype (longctx::convert's rounding, as the device stores K/V), in place.
  void round_to_kv(float* x, size_t n) const {
    std::vector<uint16_t> bits(n);
    convert(x, DType::kF32, bits.data(), shape_.kv_dtype, n);
    convert(bits.data(), shape_.kv_dtype, x, DType::kF32, n);
  }

  float kv_at(const float* base, int64_t row, int kv_head, int c) const {
    return base[size_t(row) * row_ + size_t(kv_head) * size_t(shape_.head_dim) + size_t(c)];
  }

  // One query head over keys (positions; row_of maps one to its row of k/v),
  // fp64 softmax; empty: out 0, lse -inf.
  template <typename RowOf>
  void attend(const float* q, int head, const std::vector<int64_t>& keys, const float* k, const float* v,
              RowOf row_of, float* out, double* lse) const {
    const int d = shape_.head_dim;
    const int kv_head = head / (shape_.n_heads / shape_.n_kv_heads);
    const double scale = shape_.scale != 0.0f ? double(shape_.scale) : 1.0 / std::sqrt(double(d));
    if (keys.empty()) {
      std::fill(out, out + d, 0.0f);
      *lse = -std::numeric_limits<double>::infinity();
      return;
    }
    std::vector<double> s(keys.size());
    double m = -std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < keys.size(); ++j) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += double(q[c]) * kv_at(k, row_of(keys[j]), kv_head, c);
      s[j] = dot * scale;
      m = std::max(m, s[j]);
    }
    double sum = 0;
    std::vector<double> acc(size_t(d), 0.0);
    for (size_t j = 0; j < keys.size(); ++j) {
      const double p = std::exp(s[j] - m);
      sum += p;
      for (int c = 0; c < d; ++c) acc[size_t(c)] += p * kv_at(v, row_of(keys[j]), kv_head, c);
    }
    for (int c = 0; c < d; ++c) out[c] = float(acc[size_t(c)] / sum);
    *lse = m + std::log(sum);
  }

  Shape shape_;
  size_t row_ = 0;  // n_kv_heads * head_dim
  std::vector<float> layer_k_, layer_v_;  // the prefill layer's K/V [max_tokens][row_], rounded to kv_dtype
  int prefill_layer_ = -1;
  int64_t layer_tokens_ = 0;
  std::vector<std::vector<float>> ring_k_, ring_v_;  // [layer][window][row_], rounded to kv_dtype
  std::vector<std::vector<int64_t>> ring_pos_;           // [layer][slot]: position held, -1 none
  std::vector<int64_t> ring_seen_;                       // [layer]: tokens the ring has seen
  std::vector<uint16_t> chunk_k_, chunk_v_;  // the last chunk's K/V, kv_dtype bits
  int64_t chunk_n_ = -1;
  int pending_layer_ = -1;
  bool pending_stale_ = false;
  std::vector<float> pending_out_;
  std::vector<float> step_qkv_;  // decode_local's host copies of q, k, v
  std::vector<std::byte> history_k_, history_v_;  // history_buffer's memory
  std::vector<double> pending_lse_;
  Calls calls_;
  std::vector<int64_t> history_rows_;
  std::vector<std::pair<int64_t, int64_t>> local_ranges_;
};

// Forwards every op to `inner` (a host-memory backend), reports device memory,
// and owns a FakeDeviceAttention.
class FakeDeviceBackend final : public ForwardingBackend {
 public:
  explicit FakeDeviceBackend(Backend& inner) : ForwardingBackend(inner) {}
  std::string name() const override { return "fake-device(" + ForwardingBackend::name() + ")"; }
  bool host_memory() const override { return false; }
  DeviceAttention* device_attention() override { return &attention_; }

  FakeDeviceAttention& attention() { return attention_; }

 private:
  FakeDeviceAttention attention_;
};

}  // namespace longctx::testing
