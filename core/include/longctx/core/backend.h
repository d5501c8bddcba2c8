// The Backend interface: the dense operations of a transformer forward pass
// (GEMMs, RMSNorm, RoPE, SwiGLU, residual adds, embedding lookup) on one
// device. The CPU backend (cpu/cpu_backend.h, oneDNN + oneTBB) and the CUDA
// backend (gpu/cuda_backend.h) implement it; the scheduler drives it and never
// sees a device header. Attention runs in the longctx engine (CPU kernels over
// the KV store) and, on a device backend, in its DeviceAttention (prefill of
// one layer's K/V, decode local window).
//
// Tensors live in the backend's memory (host memory for the CPU backend,
// device memory for CUDA), are row-major and contiguous, and are created by
// the backend. Activations are f32 on every backend; weights are stored as
// the backend's WeightStorage says (their GGUF type, quantized blocks
// included, or converted once at load_weight to bf16 / f32).
// Ops are asynchronous on device backends: download() and synchronize() wait.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/dtype.h"
#include "longctx/core/ggml_types.h"
#include "longctx/core/tensor.h"

namespace longctx {

class BackendTensor {
 public:
  virtual ~BackendTensor() = default;
  // How the tensor is stored: f32 / f16 / bf16, or a GGML block type (a
  // quantized weight, rows of whole blocks).
  GgmlType type() const { return type_; }
  bool quantized() const { return ggml_type_info(type_).block_elems > 1; }
  // The element dtype of an f32 / f16 / bf16 tensor; Error(kInvalidArgument)
  // for a quantized one, which has none.
  DType dtype() const;
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  // "f32[17, 4096]", "q4_k[4096, 4096]"
  std::string describe() const;
  // Backend memory; host-addressable only when the backend says host_memory().
  virtual void* data() = 0;
  virtual const void* data() const = 0;

 protected:
  BackendTensor(DType dtype, std::vector<int64_t> shape);
  BackendTensor(GgmlType type, std::vector<int64_t> shape) : type_(type), shape_(std::move(shape)) {}

 private:
  GgmlType type_;
  std::vector<int64_t> shape_;
};

// "[17, 4096]": the extents of a backend tensor or weight as messages print them.
std::string format_shape(std::span<const int64_t> shape);

// The GGML type of an f32 / f16 / bf16 dtype, and back (nullopt for a block type).
GgmlType ggml_type_of(DType dtype);
std::optional<DType> dtype_of(GgmlType type);

// A weight as the host holds it, for Backend::load_weight: row-major `shape`
// ([out, in] for a matrix, [d] for a vector) of `type`, in `bytes`
// (ggml_bytes(type, numel) of them, e.g. a GGUF tensor's mapped bytes).
// `name` names it in errors.
struct HostWeight {
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
  std::string name = "weight";

  HostWeight(GgmlType type_, std::vector<int64_t> shape_, std::span<const uint8_t> bytes_, std::string name_)
      : type(type_), shape(std::move(shape_)), bytes(bytes_), name(std::move(name_)) {}
  // A contiguous f32 / f16 / bf16 view (Error(kInvalidArgument) for a strided one).
  HostWeight(const TensorView& view);  // NOLINT(google-explicit-constructor): weights are views in tests
  int64_t numel() const;
};

// The values of `w` (checked: check_host_weight) written to dst as numel()
// elements of `dtype`, converted row by row through f32 (quantized blocks
// dequantized), never the whole tensor in f32 at once.
void convert_weight(const HostWeight& w, DType dtype, void* dst);

// How a backend stores the weights it loads.
enum class WeightStorage : uint8_t {
  kNative,  // as given: f32 / f16 / bf16 or quantized blocks computed in their own type
  kBF16,    // converted to bf16 at load
  kF32,     // converted to f32 at load
};
// "native", "bf16", "f32".
const char* weight_storage_name(WeightStorage storage);
std::optional<WeightStorage> parse_weight_storage(std::string_view text);

// How RoPE rotates: kNormal rotates adjacent pairs (x[2i], x[2i+1]) (GGUF
// "llama" layout, whose converter permutes Q/K), kNeox rotates halves
// (x[i], x[i + n_rot/2]) (Qwen2).
enum class RopeStyle : uint8_t { kNormal, kNeox };
// Frequency scaling of long-context models: none, linear (positions / factor),
// llama3 (Llama-3.1: per-frequency blend by wavelength), yarn (YaRN, Peng et
// al. 2023, as Qwen2.5 runs past 32K: per-frequency blend by the turns a pair
// makes over the original context, and a magnitude on the rotated pairs).
enum class RopeScaling : uint8_t { kNone, kLinear, kLlama3, kYarn };
// "none", "linear", "llama3", "yarn" (GGUF's <arch>.rope.scaling.type values).
const char* rope_scaling_name(RopeScaling scaling);

struct RopeParams {
  int n_rot = 0;  // rotated channels per head (<= head_dim, even); the rest pass through
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::kNormal;
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;            // linear, llama3 and yarn (yarn: >= 1)
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  int64_t original_context = 8192;  // llama3 and yarn: original_max_position_embeddings
  // yarn: a pair that turns more than beta_fast times over original_context
  // keeps its frequency, one that turns fewer than beta_slow times is divided
  // by factor, and the pairs between blend the two linearly in their index
  // (llama.cpp's defaults, which GGUF files do not carry).
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  // Times the magnitude of every rotated pair, whatever the scaling (GGUF
  // <arch>.rope.scaling.attn_factor, which llama.cpp applies so).
  float attn_factor = 1.0f;
  // Per-frequency divisors as GGUF stores them (tensor rope_freqs.weight,
  // n_rot/2 values, written by converters of Llama-3.1 models): when not
  // empty, inv_freq[i] /= freq_factors[i] and `scaling` must be kNone.
  std::vector<float> freq_factors;
};

// inv_freq[i] for i in [0, n_rot/2): theta^(-2i/n_rot), then scaled as
// params.scaling says (or divided by freq_factors). One definition shared by
// every backend and the tests. The angle of position p is p * inv_freq[i].
std::vector<float> rope_inv_freq(const RopeParams& params);
// What every rotated pair is multiplied by (its cosine and sine are):
// attn_factor, for yarn times 1 + 0.1 ln factor, YaRN's attention
// temperature sqrt(1/t) put on q and k alike, so the scores of the rotated
// channels grow by its square. Validates params as rope_inv_freq does.
float rope_magnitude(const RopeParams& params);

// Attention on a device backend (the CUDA backend; DESIGN.md "Data flow"): the
// device keeps the K/V of the layer being prefilled (layer-major prefill) and
// a ring of the last `window` tokens of every layer (decode local window).
// The scheduler drives it through this interface and never sees a device
// header. All BackendTensors are the backend's f32 activations; calls are
// queued on the backend's stream in order with its other ops, and return
// without waiting unless they say so. K/V are kept in `kv_dtype` (f16 or bf16).
class DeviceAttention {
 public:
  struct Shape {
    int n_layers = 0;
    int n_heads = 0;     // query heads
    int n_kv_heads = 0;  // divides n_heads (GQA: query head h reads kv head h / (n_heads / n_kv_heads))
    int head_dim = 0;    // 64, 128 or 256
    DType kv_dtype = DType::kF16;  // kF16 or kBF16
    int64_t max_tokens = 0;   // tokens one layer may hold (max_seq_len)
    int64_t window = 0;       // local_windows_len: ring slots per layer
    int64_t initial_len = 0;  // sink tokens: the ring never attends a token < initial_len
                              // (the CPU part attends those; KVStore's Partition)
    float scale = 0.0f;       // score scale; 0 = 1/sqrt(head_dim)
  };
  virtual ~DeviceAttention() = default;

  // (Re)sizes the device buffers for `shape` and drops every token: one
  // layer's K/V [max_tokens] and n_layers rings [window]. Throws
  // Error(kInvalidArgument) naming the field for a shape it cannot run, and
  // Error(kOutOfMemory) (buffers and epoch left as they were) beyond the
  // budget. Starts a new epoch.
  void configure(const Shape& shape) {
    configure_buffers(shape);
    ++epoch_;
  }
  // Drops every token of every layer (buffers kept). Starts a new epoch.
  void clear() {
    drop_tokens();
    ++epoch_;
  }
  // Who the buffers belong to: a sequence that configured (or cleared) the
  // device in epoch e owns its rings while epoch() == e; once another
  // configures or clears it, they are no longer its own (Sequence attends
  // its window on the CPU then, see sequence.h).
  uint64_t epoch() const { return epoch_; }

  // Layer-major prefill of `layer`, whose first `history.rows` tokens are
  // already cached (an earlier turn): history_k/v are host [n_history,
  // n_kv_heads, head_dim] in any DType (the layer's cached K/V as the KV store
  // holds them), uploaded as the start of the layer's device K/V; n_history
  // may be 0. Its last min(window, n_history) tokens also go into the
  // layer's ring, so calling it with a layer's whole cached K/V refills the
  // ring (after a KV-store snapshot load). Drops the previous layer's device
  // K/V. Returns once history_k/v may be reused, except for memory from
  // history_buffer(), which the device reads after the call returns.
  virtual void begin_prefill_layer(int layer, const TensorView& history_k, const TensorView& history_v) = 0;
  // Host memory for a layer's history: k and v [rows, n_kv_heads, head_dim]
  // in kv_dtype, for the caller to fill and pass to begin_prefill_layer,
  // which then uploads it without blocking the host (pinned memory on the
  // CUDA device). The same memory is reused by the next call, which first
  // waits until the device has read it. Error(kOutOfMemory) when it cannot be
  // had; valid until the next call, configure() or the object's end.
  struct HostKVBuffer {
    MutableTensorView k;
    MutableTensorView v;
  };
  virtual HostKVBuffer history_buffer(int64_t rows) = 0;
  // One chunk of `layer` at positions [first_pos, first_pos + n), first_pos =
  // the tokens the layer holds on the device: q [n, n_heads*head_dim], k/v
  // [n, n_kv_heads*head_dim] (after RoPE), out [n, n_heads*head_dim].
  // Appends k/v (rounded to kv_dtype) to the layer's device K/V and ring,
  // computes causal attention of the chunk's queries over every token of the
  // layer up to their own position into out, and starts an asynchronous copy
  // of the chunk's K/V (kv_dtype) to pinned host memory for chunk_kv().
  virtual void prefill_chunk(int layer, int64_t first_pos, const BackendTensor& q, const BackendTensor& k,
                             const BackendTensor& v, BackendTensor& out) = 0;
  struct HostKV {
    TensorView k;  // [n, n_kv_heads, head_dim] kv_dtype, pinned host memory
    TensorView v;
  };
  // Waits for the K/V copy of the last prefill_chunk and returns it; valid
  // until the next prefill_chunk or decode call. (The scheduler appends it to
  // the KV store while the device computes the rest of the layer.)
  virtual HostKV chunk_kv() = 0;

  // Decode step of `layer`: k/v [1, n_kv_heads*head_dim] of the new token at
  // position `pos` (= tokens the layer held before) go into the layer's ring;
  // the local part of the attention of q [1, n_heads*head_dim] over the ring's
  // tokens in [local_window_begin(pos + 1, initial_len, window), pos]
  // (core/local_window.h) is queued on the device (out and lse kept inside
  // until decode_merge). Returns once host f32 copies of q, k and v are ready
  // (the caller appends k/v to the KV store and computes the CPU part from
  // them while the device attends the window), with the first position the
  // local part attends (pos + 1 for an empty range), so the caller can check
  // that its CPU part is the rest. The copies stay valid until the next call
  // of this object. `pos` is normally the number of tokens the layer's ring
  // has seen (set by begin_prefill_layer, advanced by prefill_chunk and
  // decode_local); another `pos` is a gap, after which the local part starts
  // at `pos` (first_pos says so) until the window is full again.
  struct DecodeLocal {
    int64_t first_pos = 0;
    TensorView q;  // host f32 [n_heads, head_dim]
    TensorView k;  // host f32 [1, n_kv_heads, head_dim] (as KVStore::append takes it)
    TensorView v;
  };
  virtual DecodeLocal decode_local(int layer, int64_t pos, const BackendTensor& q, const BackendTensor& k,
                                   const BackendTensor& v) = 0;
  // Merges the CPU part (host f32 cpu_out [n_heads, head_dim], cpu_lse
  // [n_heads], numerical contract of DESIGN.md) with the local part of the
  // last decode_local into out [1, n_heads*head_dim].
  virtual void decode_merge(int layer, const TensorView& cpu_out, const TensorView& cpu_lse, BackendTensor& out) = 0;

 protected:
  // configure() and clear() of the implementation; the epoch is kept here.
  virtual void configure_buffers(const Shape& shape) = 0;
  virtual void drop_tokens() = 0;

 private:
  uint64_t epoch_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when BackendTensor::data() is host memory.
  virtual bool host_memory() const = 0;

  // Throws Error(kOutOfMemory) when the backend's budget is exhausted.
  virtual std::unique_ptr<BackendTensor> alloc(std::vector<int64_t> shape, DType dtype = DType::kF32) = 0;
  // Host <-> backend copies; shapes (numel) and dtypes must match.
  virtual void upload(const TensorView& src, BackendTensor& dst) = 0;
  virtual void download(const BackendTensor& src, const MutableTensorView& dst) = 0;
  // A weight from host data, stored as the backend's WeightStorage says.
  // Error(kInvalidArgument) naming the weight for bytes that do not match its
  // type and shape, rows that are not whole blocks, or a quantized block
  // whose scale is NaN or Inf (check_host_weight); Error(kUnsupported) for a
  // type the backend cannot compute with.
  virtual std::unique_ptr<BackendTensor> load_weight(const HostWeight& host) = 0;

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
  // out[t, :] = table[tokens[t], :] (table: weight [n_vocab, d] of any type
  // the backend loaded, rows dequantized as they are read); every token
  // is checked against n_vocab (Error(kInvalidArgument) naming the index).
  virtual void embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) = 0;
  // Waits for every queued op.
  virtual void synchronize() = 0;
  // The backend's device attention, or null when attention runs on the CPU
  // (host-memory backends). Owned by the backend.
  virtual DeviceAttention* device_attention() { return nullptr; }
};

}  // namespace longctx
