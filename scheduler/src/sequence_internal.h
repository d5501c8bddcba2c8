// What sequence.cpp (CPU path) and sequence_device.cpp (device path) share:
// the per-pass activations and the host views of backend tensors.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/scheduler/sequence.h"

namespace longctx::scheduler {

// Activations of one pass over n rows (a prefill chunk, or the decode token).
struct Sequence::Workspace {
  int64_t n = 0;
  std::unique_ptr<BackendTensor> x;     // [n, n_embd] hidden state (decode only; prefill keeps its own)
  std::unique_ptr<BackendTensor> xn;    // [n, n_embd] normed
  std::unique_ptr<BackendTensor> q;     // [n, n_heads, head_dim]
  std::unique_ptr<BackendTensor> k, v;  // [n, n_kv_heads, head_dim]
  std::unique_ptr<BackendTensor> attn;  // [n, n_heads, head_dim] attention output
  std::unique_ptr<BackendTensor> o;     // [n, n_embd]
  std::unique_ptr<BackendTensor> gate, up;  // [n, n_ff]
  std::unique_ptr<BackendTensor> out_norm, logits;  // [n, n_embd], [n, n_vocab] (decode only)
  std::vector<float> lse;               // [n, n_heads]
  // Host copies for backends without host memory.
  std::vector<float> host_q, host_k, host_v, host_attn;

  Workspace(Backend& b, const TransformerSpec& s, int64_t rows, bool decode) : n(rows) {
    if (decode) {
      x = b.alloc({n, s.n_embd});
      out_norm = b.alloc({n, s.n_embd});
      logits = b.alloc({n, s.n_vocab});
    }
    xn = b.alloc({n, s.n_embd});
    q = b.alloc({n, s.n_heads, s.head_dim});
    k = b.alloc({n, s.n_kv_heads, s.head_dim});
    v = b.alloc({n, s.n_kv_heads, s.head_dim});
    attn = b.alloc({n, s.n_heads, s.head_dim});
    o = b.alloc({n, s.n_embd});
    gate = b.alloc({n, s.n_ff});
    up = b.alloc({n, s.n_ff});
    lse.resize(size_t(n * s.n_heads));
  }
};

// Adds the seconds from its construction to its end to *sum (null: nothing).
class PhaseTimer {
 public:
  explicit PhaseTimer(double* sum) : sum_(sum), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    if (sum_) *sum_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double* sum_;
  std::chrono::steady_clock::time_point start_;
};

// A host f32 view [rows, heads, dim] of a backend tensor: the tensor itself on
// a host-memory backend, else a downloaded copy in `staging` (download waits).
inline TensorView host_view(Backend& backend, const BackendTensor& t, std::vector<float>& staging) {
  const auto& s = t.shape();
  if (backend.host_memory()) return make_view(t.data(), DType::kF32, {s[0], s[1], s[2]});
  staging.resize(size_t(t.numel()));
  backend.download(t, make_mutable_view(staging.data(), DType::kF32, {s[0], s[1], s[2]}));
  return make_view(staging.data(), DType::kF32, {s[0], s[1], s[2]});
}

// Where host code writes a backend tensor [rows, heads, dim]: the tensor itself
// on a host-memory backend, else `staging` (then uploaded by the caller).
inline MutableTensorView host_out(Backend& backend, BackendTensor& t, std::vector<float>& staging) {
  const auto& s = t.shape();
  if (backend.host_memory()) return make_mutable_view(t.data(), DType::kF32, {s[0], s[1], s[2]});
  staging.resize(size_t(t.numel()));
  return make_mutable_view(staging.data(), DType::kF32, {s[0], s[1], s[2]});
}

}  // namespace longctx::scheduler
