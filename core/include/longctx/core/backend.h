// The Backend interface: the dense operations of a transformer forward pass
// (GEMMs, RMSNorm, RoPE, SwiGLU, residual adds, embedding lookup) on one
// device. The CPU backend (cpu/cpu_backend.h, oneDNN + oneTBB) and the CUDA
// backend (gpu/, later) implement it; the scheduler drives it and never sees a
// device header. Attention is not here: it runs in the longctx engine (CPU
// kernels over the KV store, GPU local window).
//
// Tensors live in the backend's memory (host memory for the CPU backend,
// device memory for CUDA), are row-major and contiguous, and are created by
// the backend. Activations are f32 on every backend; weights are stored in
// the backend's weight dtype (f32 or bf16), converted once at load_weight.
// Ops are asynchronous on device backends: download() and synchronize() wait.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/dtype.h"
#include "longctx/core/tensor.h"

namespace longctx {

class BackendTensor {
 public:
  virtual ~BackendTensor() = default;
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  // "f32[17, 4096]"
  std::string describe() const;
  // Backend memory; host-addressable only when the backend says host_memory().
  virtual void* data() = 0;
  virtual const void* data() const = 0;

 protected:
  BackendTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {}

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
};

// How RoPE rotates: kNormal rotates adjacent pairs (x[2i], x[2i+1]) (GGUF
// "llama" layout, whose converter permutes Q/K), kNeox rotates halves
// (x[i], x[i + n_rot/2]) (Qwen2).
enum class RopeStyle : uint8_t { kNormal, kNeox };
// Frequency scaling of long-context models: none, linear (positions / factor),
// llama3 (Llama-3.1: per-frequency blend by wavelength).
enum class RopeScaling : uint8_t { kNone, kLinear, kLlama3 };

struct RopeParams {
  int n_rot = 0;  // rotated channels per head (<= head_dim, even); the rest pass through
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::kNormal;
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;            // linear and llama3
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  int64_t original_context = 8192;  // llama3: original_max_position_embeddings
  // Per-frequency divisors as GGUF stores them (tensor rope_freqs.weight,
  // n_rot/2 values, written by converters of Llama-3.1 models): when not
  // empty, inv_freq[i] /= freq_factors[i] and `scaling` must be kNone.
  std::vector<float> freq_factors;
};

// inv_freq[i] for i in [0, n_rot/2): theta^(-2i/n_rot), then scaled as
// params.scaling says (or divided by freq_factors). One definition shared by
// every backend and the tests. The angle of position p is p * inv_freq[i].
std::vector<float> rope_inv_freq(const RopeParams& params);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when BackendTensor::data() is host memory.
  virtual bool host_memory() const = 0;
  // DType weights are stored in (f32 or bf16).
  virtual DType weight_dtype() const = 0;

  // Throws Error(kOutOfMemory) when the backend's budget is exhausted.
  virtual std::unique_ptr<BackendTensor> alloc(std::vector<int64_t> shape, DType dtype = DType::kF32) = 0;
  // Host <-> backend copies; shapes (numel) and dtypes must match.
  virtual void upload(const TensorView& src, BackendTensor& dst) = 0;
  virtual void download(const BackendTensor& src, const MutableTensorView& dst) = 0;
  // A weight from host data (any DType, any shape) stored in weight_dtype().
  virtual std::unique_ptr<BackendTensor> load_weight(const TensorView& host) = 0;

  // y[n, out] = x[n, in] · w[out, in]^T (+ bias[out] when bias != nullptr).
  virtual void matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) = 0;
  // y[n, d] = x / sqrt(mean(x^2) + eps) * weight[d]; y may be x.
  virtual void rms_norm(const BackendTensor& x, const BackendTensor& weight, float eps, BackendTensor& y) = 0;
  // In place on x[n, n_heads, head_dim]; row t has position first_pos + t.
  virtual void rope(BackendTensor& x, int64_t first_pos, const RopeParams& params) = 0;
  // out[n, f] = silu(gate) * up; out may be gate.
  virtual void swiglu(const BackendTensor& gate, const BackendTensor& up, BackendTensor& out) = 0;
  // out = a + b (same shape); out may be a.
  virtual void add(const BackendTensor& a, const BackendTensor& b, BackendTensor& out) = 0;
  // out[t, :] = table[tokens[t], :] (table: weight [n_vocab, d]); every token
  // is checked against n_vocab (Error(kInvalidArgument) naming the index).
  virtual void embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) = 0;
  // Waits for every queued op.
  virtual void synchronize() = 0;
};

}  // namespace longctx
