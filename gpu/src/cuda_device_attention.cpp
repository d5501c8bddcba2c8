// DeviceAttention of the CUDA backend (core/backend.h): the K/V of the layer
// being prefilled and a ring of the last `window` tokens per layer, in device
// memory of kv_dtype, with the kernels of gpu/attention.h and gpu/merge.h.
//
// Streams: every kernel runs on the backend's compute stream. The K/V of a
// prefill chunk go to pinned host memory on the copy stream, which waits for
// an event recorded right after the chunk's K/V are stored, so the copy
// overlaps the chunk's attention and whatever the backend queues next. Two
// pinned slots alternate, so a chunk's host K/V stay intact while the next
// chunk copies. A decode step's q/k/v go to pinned host memory on the copy
// stream behind one event while the compute stream stores k/v in the ring
// and attends the window, so the host waits for three small copies, not for
// the attention, and computes the CPU part while the device attends. The CPU
// part comes back through a pinned staging buffer and is merged on the
// compute stream.
//
// The ring never attends a slot it was not given: each layer remembers the
// first position of the run of tokens its ring has seen without a gap
// (begin_prefill_layer: 0, the history is complete; clear(): 0). A
// decode_local at a position other than the next one (after clear() on a
// loaded KV store, say) restarts the run there, and until the window is full
// again the local part covers only [run start, pos]: a caller merging it must
// give the CPU part the rest. The scheduler never asks for that: clear() and
// configure() start a new DeviceAttention::epoch, and a Sequence that no
// longer owns the device attends its steps wholly on the CPU until its next
// prefill or sync_with_store refills the rings (sequence.h). A decode_local of a layer ends its prefill (call
// begin_prefill_layer again).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_check.h"
#include "cuda_internal.h"
#include "longctx/core/backend_args.h"
#include "longctx/core/error.h"
#include "longctx/core/local_window.h"
#include "longctx/gpu/attention.h"
#include "longctx/gpu/merge.h"

namespace longctx::gpu::detail {
namespace {

struct EventOwner {
  cudaEvent_t event = nullptr;
  EventOwner() { cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"); }
  ~EventOwner() { cudaEventDestroy(event); }
  EventOwner(const EventOwner&) = delete;
  EventOwner& operator=(const EventOwner&) = delete;
};

// Device and pinned buffers of one configuration.
struct Buffers {
  PoolBlock layer_k, layer_v;               // [max_tokens, n_kv_heads, head_dim] kv_dtype
  std::vector<PoolBlock> ring_k, ring_v;    // per layer [window, n_kv_heads, head_dim] kv_dtype
  PoolBlock local_out, local_lse;           // [n_heads, head_dim], [n_heads] f32
  PoolBlock local_workspace;                // split-K scratch of local_window_attention
  PoolBlock cpu_part;                       // [n_heads * head_dim + n_heads] f32: out then lse
  PoolBlock cpu_staging;                    // the same, pinned host
  PoolBlock decode_qkv;                     // pinned host f32: q, k, v of the last decode_local
};

class CudaDeviceAttention final : public DeviceAttention {
 public:
  explicit CudaDeviceAttention(const CudaContext& context) : ctx_(context) {}
  ~CudaDeviceAttention() override {
    cudaSetDevice(ctx_.device);
    cudaStreamSynchronize(ctx_.copy);  // pinned slots and layer buffers in use by copies
    cudaStreamSynchronize(ctx_.compute);
  }

  void begin_prefill_layer(int layer, const TensorView& history_k, const TensorView& history_v) override;
  HostKVBuffer history_buffer(int64_t rows) override;
  void prefill_chunk(int layer, int64_t first_pos, const BackendTensor& q, const BackendTensor& k,
                     const BackendTensor& v, BackendTensor& out) override;
  HostKV chunk_kv() override;
  DecodeLocal decode_local(int layer, int64_t pos, const BackendTensor& q, const BackendTensor& k,
                           const BackendTensor& v) override;
  void decode_merge(int layer, const TensorView& cpu_out, const TensorView& cpu_lse, BackendTensor& out) override;

 protected:
  void configure_buffers(const Shape& shape) override;
  void drop_tokens() override;

 private:
  void check_configured(const char* op) const;
  void check_layer(int layer, const char* op) const;
  // A device f32 tensor of n rows of row_elems each; returns n.
  int64_t check_rows(const BackendTensor& t, int64_t row_elems, const char* op, const char* arg) const;
  int64_t row_elems() const { return int64_t(shape_.n_kv_heads) * shape_.head_dim; }
  size_t row_bytes() const { return size_t(row_elems()) * dtype_size(shape_.kv_dtype); }
  void store(const float* src, void* dst, int64_t n, int64_t first_pos, int64_t capacity, bool ring);

  struct Slot {
    PoolBlock pinned;  // k rows then v rows
    EventOwner copied;
    int64_t n = 0;
  };

  CudaContext ctx_;
  bool configured_ = false;
  Shape shape_;
  Buffers buf_;
  Slot slots_[2];
  EventOwner kv_stored_;     // compute stream: a chunk's K/V are in the layer buffer
  EventOwner cpu_uploaded_;  // compute stream: the staging of decode_merge was read
  EventOwner qkv_ready_;     // compute stream: a decode step's q/k/v are computed
  EventOwner qkv_copied_;    // copy stream: they are in decode_qkv
  EventOwner history_read_;  // compute stream: the last upload of history_ is done
  // Pinned host memory for a layer's history (history_buffer), K then V
  // halves. Not from the pinned pool: Sequence counts it in its DRAM budget.
  struct PinnedHistory {
    void* ptr = nullptr;
    size_t half_bytes = 0;  // bytes of the K half (= of the V half)
    ~PinnedHistory() { cudaFreeHost(ptr); }
  } history_;
  int next_slot_ = 0;
  int pending_slot_ = -1;  // slot of the last prefill_chunk, -1 = none
  int prefill_layer_ = -1;
  int64_t layer_tokens_ = 0;        // tokens of prefill_layer_ on the device
  std::vector<int64_t> ring_seen_;  // per layer: tokens its ring has seen (next position)
  std::vector<int64_t> ring_from_;  // per layer: first position of the gapless run ending there
  int decode_layer_ = -1;           // layer of the last decode_local, until decode_merge
};

void CudaDeviceAttention::check_configured(const char* op) const {
  if (!configured_) fail(ErrorCode::kInvalidArgument, "DeviceAttention::", op, ": call configure() first");
}

void CudaDeviceAttention::check_layer(int layer, const char* op) const {
  check_configured(op);
  if (layer < 0 || layer >= shape_.n_layers)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::", op, ": layer ", layer, " outside [0, ", shape_.n_layers,
         ")");
}

int64_t CudaDeviceAttention::check_rows(const BackendTensor& t, int64_t row_elems, const char* op,
                                        const char* arg) const {
  backend_tensor_cast<CudaTensor>(t, op, arg);
  if (t.dtype() != DType::kF32 || t.shape().empty() || t.numel() != t.shape()[0] * row_elems)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::", op, ": ", arg, " must be f32 [n, ", row_elems, "], got ",
         t.describe());
  return t.shape()[0];
}

void CudaDeviceAttention::store(const float* src, void* dst, int64_t n, int64_t first_pos, int64_t capacity,
                                bool ring) {
  StoreKVParams p;
  p.src = src;
  p.dst = dst;
  p.kv_dtype = shape_.kv_dtype;
  p.n = n;
  p.row_elems = row_elems();
  p.first_pos = first_pos;
  p.capacity = capacity;
  p.ring = ring;
  store_kv(p, ctx_.compute);
}

void CudaDeviceAttention::configure_buffers(const Shape& s) {
  const auto bad = [](const char* field, auto value, const char* why) {
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::configure: ", field, " = ", value, ": ", why);
  };
  if (s.n_layers < 1) bad("n_layers", s.n_layers, "must be >= 1");
  if (s.n_heads < 1) bad("n_heads", s.n_heads, "must be >= 1");
  if (s.n_kv_heads < 1 || s.n_heads % s.n_kv_heads != 0)
    bad("n_kv_heads", s.n_kv_heads, "must be >= 1 and divide n_heads");
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
    bad("head_dim", s.head_dim, "the device kernels support 64, 128 and 256");
  if (s.kv_dtype != DType::kF16 && s.kv_dtype != DType::kBF16)
    bad("kv_dtype", dtype_name(s.kv_dtype), "the device kernels keep K/V as f16 or bf16");
  if (s.max_tokens < 1) bad("max_tokens", s.max_tokens, "must be >= 1");
  if (s.window < 0 || s.window > s.max_tokens) bad("window", s.window, "must be in [0, max_tokens]");
  if (s.initial_len < 0) bad("initial_len", s.initial_len, "must be >= 0");
  if (!std::isfinite(s.scale) || s.scale < 0.f) bad("scale", s.scale, "must be >= 0 (0 = 1/sqrt(head_dim))");
  const size_t row = size_t(s.n_kv_heads) * size_t(s.head_dim) * dtype_size(s.kv_dtype);
  if (uint64_t(s.max_tokens) > (uint64_t(1) << 40) / row)
    bad("max_tokens", s.max_tokens, "K/V of one layer would exceed 1 TiB");

  activate(ctx_);
  // Copies in flight read the old buffers (pinned ones too: the host may
  // reuse a freed pinned block at once).
  cuda_check(cudaStreamSynchronize(ctx_.copy), "configure: cudaStreamSynchronize");
  cuda_check(cudaStreamSynchronize(ctx_.compute), "configure: cudaStreamSynchronize");
  // Everything new first: on Error(kOutOfMemory) the old buffers stay.
  Buffers b;
  const size_t layer_bytes = size_t(s.max_tokens) * row, ring_bytes = size_t(s.window) * row;
  MemoryPool& dev = *ctx_.device_pool;
  b.layer_k = dev.alloc(layer_bytes, "DeviceAttention::configure: K of one layer");
  b.layer_v = dev.alloc(layer_bytes, "DeviceAttention::configure: V of one layer");
  for (int l = 0; l < s.n_layers; ++l) {
    b.ring_k.push_back(dev.alloc(ring_bytes, str_cat("DeviceAttention::configure: local window K of layer ", l)));
    b.ring_v.push_back(dev.alloc(ring_bytes, str_cat("DeviceAttention::configure: local window V of layer ", l)));
  }
  const size_t out_floats = size_t(s.n_heads) * s.head_dim;
  b.local_out = dev.alloc(out_floats * sizeof(float), "DeviceAttention::configure: local output");
  b.local_lse = dev.alloc(size_t(s.n_heads) * sizeof(float), "DeviceAttention::configure: local lse");
  b.local_workspace = dev.alloc(local_window_workspace_bytes(s.n_heads, s.head_dim),
                                "DeviceAttention::configure: local window workspace");
  b.cpu_part = dev.alloc((out_floats + s.n_heads) * sizeof(float), "DeviceAttention::configure: CPU part");
  b.cpu_staging = ctx_.pinned_pool->alloc((out_floats + s.n_heads) * sizeof(float),
                                          "DeviceAttention::configure: pinned staging of the CPU part");
  const size_t kv_floats = size_t(s.n_kv_heads) * s.head_dim;
  b.decode_qkv = ctx_.pinned_pool->alloc((out_floats + 2 * kv_floats) * sizeof(float),
                                         "DeviceAttention::configure: pinned copy of a decode step's q/k/v");
  buf_ = std::move(b);
  for (Slot& slot : slots_) slot.pinned.reset();  // sized for the old rows
  shape_ = s;
  if (shape_.scale == 0.f) shape_.scale = 1.f / std::sqrt(float(s.head_dim));
  configured_ = true;
  drop_tokens();
}

void CudaDeviceAttention::drop_tokens() {
  check_configured("clear");
  pending_slot_ = -1;
  prefill_layer_ = -1;
  layer_tokens_ = 0;
  ring_seen_.assign(size_t(shape_.n_layers), 0);
  ring_from_.assign(size_t(shape_.n_layers), 0);
  decode_layer_ = -1;
}

void CudaDeviceAttention::begin_prefill_layer(int layer, const TensorView& history_k, const TensorView& history_v) {
  check_layer(layer, "begin_prefill_layer");
  check_host_view(history_k, "DeviceAttention::begin_prefill_layer", "history_k");
  check_host_view(history_v, "DeviceAttention::begin_prefill_layer", "history_v");
  const int64_t n = history_k.rank == 3 ? history_k.shape[0] : -1;
  for (const TensorView* h : {&history_k, &history_v}) {
    if (h->rank != 3 || h->shape[0] != n || h->shape[1] != shape_.n_kv_heads || h->shape[2] != shape_.head_dim)
      fail(ErrorCode::kInvalidArgument, "DeviceAttention::begin_prefill_layer: history K/V must both be [n, ",
           shape_.n_kv_heads, ", ", shape_.head_dim, "]; got ", history_k.describe(), " and ", history_v.describe());
  }
  if (n > shape_.max_tokens)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::begin_prefill_layer: ", n,
         " history tokens exceed max_tokens ", shape_.max_tokens);
  activate(ctx_);
  cuda_check(cudaStreamSynchronize(ctx_.copy), "begin_prefill_layer: cudaStreamSynchronize");
  pending_slot_ = -1;
  prefill_layer_ = -1;  // until the history is in place
  const size_t bytes = size_t(n) * row_bytes();
  if (bytes > 0) {
    std::vector<std::byte> staging;
    const TensorView* sides[2] = {&history_k, &history_v};
    void* layer_buf[2] = {buf_.layer_k.get(), buf_.layer_v.get()};
    void* ring_buf[2] = {buf_.ring_k[size_t(layer)].get(), buf_.ring_v[size_t(layer)].get()};
    const auto* pinned = static_cast<const std::byte*>(history_.ptr);
    for (int side = 0; side < 2; ++side) {
      const TensorView& h = *sides[side];
      const void* src = h.data;  // as it is when it already has the device layout
      const bool layout_ok = h.is_contiguous() && h.dtype == shape_.kv_dtype;
      if (layout_ok && pinned != nullptr && src == pinned + size_t(side) * history_.half_bytes) {
        // history_buffer's pinned memory: the copy runs while the host goes on.
        cuda_check(cudaMemcpyAsync(layer_buf[side], src, bytes, cudaMemcpyHostToDevice, ctx_.compute),
                   "begin_prefill_layer: cudaMemcpyAsync");
      } else {
        if (!layout_ok) {
          staging.resize(bytes);
          gather_view(h, staging.data(), shape_.kv_dtype);
          src = staging.data();
        }
        copy_host_to_device(layer_buf[side], src, bytes, ctx_.compute, "begin_prefill_layer: cudaMemcpyAsync");
      }
      // The last `window` history tokens into the ring: at most two runs of slots.
      const int64_t w = shape_.window, m = std::min(w, n);
      for (int64_t p = n - m; p < n;) {
        const int64_t run = std::min(n - p, w - p % w);
        cuda_check(cudaMemcpyAsync(static_cast<std::byte*>(ring_buf[side]) + size_t(p % w) * row_bytes(),
                                   static_cast<const std::byte*>(layer_buf[side]) + size_t(p) * row_bytes(),
                                   size_t(run) * row_bytes(), cudaMemcpyDeviceToDevice, ctx_.compute),
                   "begin_prefill_layer: cudaMemcpyAsync");
        p += run;
      }
    }
  }
  // No wait: later work is ordered behind the copies on the compute stream,
  // pageable sources are staged by the time cudaMemcpyAsync returns, and
  // history_buffer() waits for this event before handing its memory out again.
  cuda_check(cudaEventRecord(history_read_.event, ctx_.compute), "begin_prefill_layer: cudaEventRecord");
  prefill_layer_ = layer;
  layer_tokens_ = n;
  ring_seen_[size_t(layer)] = n;
  ring_from_[size_t(layer)] = 0;
  if (decode_layer_ == layer) decode_layer_ = -1;
}

DeviceAttention::HostKVBuffer CudaDeviceAttention::history_buffer(int64_t rows) {
  check_configured("history_buffer");
  if (rows < 0 || rows > shape_.max_tokens)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::history_buffer: ", rows, " rows outside [0, max_tokens ",
         shape_.max_tokens, "]");
  activate(ctx_);
  cuda_check(cudaEventSynchronize(history_read_.event), "history_buffer: cudaEventSynchronize");
  const size_t half = size_t(std::max<int64_t>(rows, 1)) * row_bytes();  // never null, even for 0 rows
  if (half > history_.half_bytes) {
    // Grown by at least half again (up to max_tokens), so a growing conversation pins memory rarely.
    const size_t cap = size_t(shape_.max_tokens) * row_bytes();
    const size_t want = std::min(cap, std::max(half, history_.half_bytes + history_.half_bytes / 2));
    void* ptr = nullptr;
    const cudaError_t err = cudaHostAlloc(&ptr, 2 * want, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorCode::kOutOfMemory, "DeviceAttention::history_buffer: cudaHostAlloc of ", format_bytes(2 * want),
           " of pinned host memory for one layer's history K/V failed: ", cudaGetErrorString(err));
    }
    cudaFreeHost(history_.ptr);
    history_.ptr = ptr;
    history_.half_bytes = want;
  }
  auto* base = static_cast<std::byte*>(history_.ptr);
  HostKVBuffer b;
  b.k = make_mutable_view(base, shape_.kv_dtype, {rows, shape_.n_kv_heads, shape_.head_dim});
  b.v = make_mutable_view(base + history_.half_bytes, shape_.kv_dtype, {rows, shape_.n_kv_heads, shape_.head_dim});
  return b;
}

void CudaDeviceAttention::prefill_chunk(int layer, int64_t first_pos, const BackendTensor& q, const BackendTensor& k,
                                        const BackendTensor& v, BackendTensor& out) {
  const char* op = "prefill_chunk";
  check_layer(layer, op);
  if (layer != prefill_layer_)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::prefill_chunk: layer ", layer,
         " is not being prefilled; call begin_prefill_layer(", layer, ", ...) first");
  if (first_pos != layer_tokens_)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::prefill_chunk: first_pos ", first_pos, " must be the ",
         layer_tokens_, " tokens layer ", layer, " holds on the device");
  const int64_t q_row = int64_t(shape_.n_heads) * shape_.head_dim;
  const int64_t n = check_rows(q, q_row, op, "q");
  if (check_rows(k, row_elems(), op, "k") != n || check_rows(v, row_elems(), op, "v") != n ||
      check_rows(out, q_row, op, "out") != n)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::prefill_chunk: q ", q.describe(), ", k ", k.describe(),
         ", v ", v.describe(), " and out ", out.describe(), " must have the same number of rows");
  if (n > shape_.max_tokens - first_pos)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::prefill_chunk: ", first_pos, " + ", n,
         " tokens exceed max_tokens ", shape_.max_tokens);
  activate(ctx_);
  // The pinned slot first: Error(kOutOfMemory) before anything is queued.
  Slot& slot = slots_[next_slot_];
  const size_t chunk_bytes = size_t(n) * row_bytes();
  if (slot.pinned.bytes() < 2 * chunk_bytes) {
    cuda_check(cudaEventSynchronize(slot.copied.event), "prefill_chunk: cudaEventSynchronize");
    slot.pinned.reset();
    slot.pinned = ctx_.pinned_pool->alloc(2 * chunk_bytes, "DeviceAttention::prefill_chunk: pinned K/V of the chunk");
  }
  const auto* kp = static_cast<const float*>(k.data());
  const auto* vp = static_cast<const float*>(v.data());
  if (n > 0) {
    store(kp, buf_.layer_k.get(), n, first_pos, shape_.max_tokens, false);
    store(vp, buf_.layer_v.get(), n, first_pos, shape_.max_tokens, false);
    if (shape_.window > 0) {  // only the rows that stay in the ring (no two rows per slot)
      const int64_t m = std::min(n, shape_.window);
      const int64_t skip = (n - m) * row_elems();
      store(kp + skip, buf_.ring_k[size_t(layer)].get(), m, first_pos + n - m, shape_.window, true);
      store(vp + skip, buf_.ring_v[size_t(layer)].get(), m, first_pos + n - m, shape_.window, true);
    }
    cuda_check(cudaEventRecord(kv_stored_.event, ctx_.compute), "prefill_chunk: cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(ctx_.copy, kv_stored_.event, 0), "prefill_chunk: cudaStreamWaitEvent");
    auto* host = static_cast<std::byte*>(slot.pinned.get());
    const size_t offset = size_t(first_pos) * row_bytes();
    cuda_check(cudaMemcpyAsync(host, static_cast<const std::byte*>(buf_.layer_k.get()) + offset, chunk_bytes,
                               cudaMemcpyDeviceToHost, ctx_.copy),
               "prefill_chunk: cudaMemcpyAsync");
    cuda_check(cudaMemcpyAsync(host + chunk_bytes, static_cast<const std::byte*>(buf_.layer_v.get()) + offset,
                               chunk_bytes, cudaMemcpyDeviceToHost, ctx_.copy),
               "prefill_chunk: cudaMemcpyAsync");
    cuda_check(cudaEventRecord(slot.copied.event, ctx_.copy), "prefill_chunk: cudaEventRecord");

    PrefillAttentionParams p;
    p.q = static_cast<const float*>(q.data());
    p.k = buf_.layer_k.get();
    p.v = buf_.layer_v.get();
    p.out = static_cast<float*>(out.data());
    p.kv_dtype = shape_.kv_dtype;
    p.n_q = n;
    p.n_kv = first_pos + n;
    p.q_first_pos = first_pos;
    p.n_heads = shape_.n_heads;
    p.n_kv_heads = shape_.n_kv_heads;
    p.head_dim = shape_.head_dim;
    p.scale = shape_.scale;
    prefill_attention(p, ctx_.compute);
  }
  slot.n = n;
  pending_slot_ = next_slot_;
  next_slot_ ^= 1;
  layer_tokens_ += n;
  ring_seen_[size_t(layer)] = layer_tokens_;
}

DeviceAttention::HostKV CudaDeviceAttention::chunk_kv() {
  check_configured("chunk_kv");
  if (pending_slot_ < 0)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::chunk_kv: no prefill_chunk since the last ",
         "configure, clear, begin_prefill_layer or decode_local");
  activate(ctx_);
  Slot& slot = slots_[pending_slot_];
  cuda_check(cudaEventSynchronize(slot.copied.event), "chunk_kv: cudaEventSynchronize");
  const auto* host = static_cast<const std::byte*>(slot.pinned.get());
  const int64_t n = slot.n;
  HostKV kv;
  kv.k = make_view(host, shape_.kv_dtype, {n, shape_.n_kv_heads, shape_.head_dim});
  kv.v = make_view(host + size_t(n) * row_bytes(), shape_.kv_dtype, {n, shape_.n_kv_heads, shape_.head_dim});
  return kv;
}

DeviceAttention::DecodeLocal CudaDeviceAttention::decode_local(int layer, int64_t pos, const BackendTensor& q,
                                                              const BackendTensor& k, const BackendTensor& v) {
  const char* op = "decode_local";
  check_layer(layer, op);
  const int64_t q_row = int64_t(shape_.n_heads) * shape_.head_dim;
  if (check_rows(q, q_row, op, "q") != 1 || check_rows(k, row_elems(), op, "k") != 1 ||
      check_rows(v, row_elems(), op, "v") != 1)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::decode_local: q ", q.describe(), ", k ", k.describe(),
         " and v ", v.describe(), " must have one row");
  if (pos < 0 || pos >= shape_.max_tokens)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::decode_local: pos ", pos, " reaches max_tokens ",
         shape_.max_tokens);
  activate(ctx_);
  // q/k/v to the host on the copy stream, beside the window's attention.
  const int64_t kv_row = row_elems();
  auto* host = static_cast<float*>(buf_.decode_qkv.get());
  cuda_check(cudaEventRecord(qkv_ready_.event, ctx_.compute), "decode_local: cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(ctx_.copy, qkv_ready_.event, 0), "decode_local: cudaStreamWaitEvent");
  const std::pair<const BackendTensor*, int64_t> parts[] = {{&q, 0}, {&k, q_row}, {&v, q_row + kv_row}};
  for (const auto& [t, at] : parts)
    cuda_check(cudaMemcpyAsync(host + at, t->data(), size_t(t->numel()) * sizeof(float), cudaMemcpyDeviceToHost,
                               ctx_.copy),
               "decode_local: cudaMemcpyAsync");
  cuda_check(cudaEventRecord(qkv_copied_.event, ctx_.copy), "decode_local: cudaEventRecord");

  if (pos != ring_seen_[size_t(layer)]) ring_from_[size_t(layer)] = pos;  // a gap: the run restarts
  // Sinks are the CPU part's; before the first non-sink token the range is empty.
  const int64_t first = shape_.window > 0
                            ? std::max(local_window_begin(pos + 1, shape_.initial_len, shape_.window),
                                       ring_from_[size_t(layer)])
                            : pos + 1;
  if (shape_.window > 0) {
    store(static_cast<const float*>(k.data()), buf_.ring_k[size_t(layer)].get(), 1, pos, shape_.window, true);
    store(static_cast<const float*>(v.data()), buf_.ring_v[size_t(layer)].get(), 1, pos, shape_.window, true);
    LocalAttentionParams p;
    p.q = static_cast<const float*>(q.data());
    p.k = buf_.ring_k[size_t(layer)].get();
    p.v = buf_.ring_v[size_t(layer)].get();
    p.out = static_cast<float*>(buf_.local_out.get());
    p.lse = static_cast<float*>(buf_.local_lse.get());
    p.workspace = buf_.local_workspace.get();
    p.workspace_bytes = buf_.local_workspace.bytes();
    p.kv_dtype = shape_.kv_dtype;
    p.capacity = shape_.window;
    p.first_pos = first;
    p.last_pos = pos;
    p.n_heads = shape_.n_heads;
    p.n_kv_heads = shape_.n_kv_heads;
    p.head_dim = shape_.head_dim;
    p.scale = shape_.scale;
    local_window_attention(p, ctx_.compute);
  }
  ring_seen_[size_t(layer)] = pos + 1;
  decode_layer_ = layer;
  if (prefill_layer_ == layer) prefill_layer_ = -1;
  pending_slot_ = -1;
  cuda_check(cudaEventSynchronize(qkv_copied_.event), "decode_local: cudaEventSynchronize");  // the one host wait
  if (!ctx_.overlap_decode) cuda_check(cudaStreamSynchronize(ctx_.compute), "decode_local: cudaStreamSynchronize");
  DecodeLocal r;
  r.first_pos = first;
  r.q = make_view(host, DType::kF32, {shape_.n_heads, shape_.head_dim});
  r.k = make_view(host + q_row, DType::kF32, {1, shape_.n_kv_heads, shape_.head_dim});
  r.v = make_view(host + q_row + kv_row, DType::kF32, {1, shape_.n_kv_heads, shape_.head_dim});
  return r;
}

void CudaDeviceAttention::decode_merge(int layer, const TensorView& cpu_out, const TensorView& cpu_lse,
                                       BackendTensor& out) {
  const char* op = "decode_merge";
  check_layer(layer, op);
  if (layer != decode_layer_)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::decode_merge: layer ", layer,
         " has no local part; call decode_local(", layer, ", ...) first");
  const int64_t out_elems = int64_t(shape_.n_heads) * shape_.head_dim;
  check_host_view(cpu_out, "DeviceAttention::decode_merge", "cpu_out");
  check_host_view(cpu_lse, "DeviceAttention::decode_merge", "cpu_lse");
  if (cpu_out.dtype != DType::kF32 || cpu_out.numel() != out_elems || cpu_lse.dtype != DType::kF32 ||
      cpu_lse.numel() != shape_.n_heads)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::decode_merge: cpu_out must be f32 [", shape_.n_heads, ", ",
         shape_.head_dim, "] and cpu_lse f32 [", shape_.n_heads, "]; got ", cpu_out.describe(), " and ",
         cpu_lse.describe());
  if (check_rows(out, out_elems, op, "out") != 1)
    fail(ErrorCode::kInvalidArgument, "DeviceAttention::decode_merge: out must be [1, ", out_elems, "], got ",
         out.describe());
  activate(ctx_);
  // The previous merge's upload must have read the staging before it is rewritten.
  cuda_check(cudaEventSynchronize(cpu_uploaded_.event), "decode_merge: cudaEventSynchronize");
  auto* staging = static_cast<float*>(buf_.cpu_staging.get());
  gather_view(cpu_out, staging, DType::kF32);
  gather_view(cpu_lse, staging + out_elems, DType::kF32);
  auto* cpu_dev = static_cast<float*>(buf_.cpu_part.get());
  cuda_check(cudaMemcpyAsync(cpu_dev, staging, size_t(out_elems + shape_.n_heads) * sizeof(float),
                             cudaMemcpyHostToDevice, ctx_.compute),
             "decode_merge: cudaMemcpyAsync");
  cuda_check(cudaEventRecord(cpu_uploaded_.event, ctx_.compute), "decode_merge: cudaEventRecord");
  if (shape_.window > 0) {
    MergeParams p;
    p.out_a = static_cast<const float*>(buf_.local_out.get());
    p.lse_a = static_cast<const float*>(buf_.local_lse.get());
    p.out_b = cpu_dev;
    p.lse_b = cpu_dev + out_elems;
    p.out = static_cast<float*>(out.data());
    p.lse = static_cast<float*>(buf_.local_lse.get());  // the merged lse is not needed; may alias lse_a
    p.n_heads = shape_.n_heads;
    p.head_dim = shape_.head_dim;
    merge_attention_states(p, ctx_.compute);
  } else {  // no local window: the CPU part is the whole attention
    cuda_check(cudaMemcpyAsync(out.data(), cpu_dev, size_t(out_elems) * sizeof(float), cudaMemcpyDeviceToDevice,
                               ctx_.compute),
               "decode_merge: cudaMemcpyAsync");
  }
  decode_layer_ = -1;
}

}  // namespace

std::unique_ptr<DeviceAttention> make_device_attention(const CudaContext& context) {
  return std::make_unique<CudaDeviceAttention>(context);
}

}  // namespace longctx::gpu::detail
