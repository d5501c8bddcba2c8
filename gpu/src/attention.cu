// Public entry points of gpu/attention.h: parameter validation (always before
// any CUDA call), the one table of supported (kv_dtype, head_dim), and the
// host-memory conveniences. The kernels are in attention_prefill.cu and
// attention_local.cu.
#include <cstdint>
#include <limits>

#include "attention_common.cuh"
#include "cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::gpu {
namespace {

using PrefillFn = void (*)(const PrefillAttentionParams&, float, cudaStream_t);
using LocalFn = void (*)(const LocalAttentionParams&, float, cudaStream_t);

// The supported (kv_dtype, head_dim) pairs and their kernels.
struct KernelEntry {
  DType kv_dtype;
  int head_dim;
  PrefillFn prefill;
  LocalFn local;
};
constexpr KernelEntry kKernels[] = {
    {DType::kF16, 64, &detail::launch_prefill<__half, 64>, &detail::launch_local<__half, 64>},
    {DType::kF16, 128, &detail::launch_prefill<__half, 128>, &detail::launch_local<__half, 128>},
    {DType::kF16, 256, &detail::launch_prefill<__half, 256>, &detail::launch_local<__half, 256>},
    {DType::kBF16, 64, &detail::launch_prefill<__nv_bfloat16, 64>, &detail::launch_local<__nv_bfloat16, 64>},
    {DType::kBF16, 128, &detail::launch_prefill<__nv_bfloat16, 128>, &detail::launch_local<__nv_bfloat16, 128>},
    {DType::kBF16, 256, &detail::launch_prefill<__nv_bfloat16, 256>, &detail::launch_local<__nv_bfloat16, 256>},
};

bool is_kv_dtype(DType t) { return t == DType::kF16 || t == DType::kBF16; }

const KernelEntry& find_kernels(const char* fn, DType kv_dtype, int head_dim) {
  if (!is_kv_dtype(kv_dtype))
    fail(ErrorCode::kInvalidArgument, fn, ": kv_dtype ", dtype_name(kv_dtype), " is not supported (f16 or bf16)");
  for (const KernelEntry& e : kKernels)
    if (e.kv_dtype == kv_dtype && e.head_dim == head_dim) return e;
  fail(ErrorCode::kInvalidArgument, fn, ": head_dim ", head_dim, " is not supported (64, 128 or 256)");
}

void check_heads(const char* fn, int n_heads, int n_kv_heads) {
  if (n_heads < 1) fail(ErrorCode::kInvalidArgument, fn, ": n_heads ", n_heads, " must be >= 1");
  if (n_kv_heads < 1 || n_kv_heads > 65535)
    fail(ErrorCode::kInvalidArgument, fn, ": n_kv_heads ", n_kv_heads, " must be in [1, 65535]");
  if (n_heads % n_kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, fn, ": n_heads ", n_heads, " is not a multiple of n_kv_heads ", n_kv_heads);
}

float resolve_scale(const char* fn, float scale, int head_dim) {
  if (!std::isfinite(scale)) fail(ErrorCode::kInvalidArgument, fn, ": scale ", scale, " is not finite");
  return scale == 0.f ? 1.f / std::sqrt(float(head_dim)) : scale;
}

void check_aligned(const char* fn, const char* field, const void* ptr) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
    fail(ErrorCode::kInvalidArgument, fn, ": ", field, " must be 16-byte aligned");
}

// Everything but the device-only alignment rule; pointers may be host or device.
const KernelEntry& check_prefill(const PrefillAttentionParams& p) {
  const char* fn = "prefill_attention";
  check_heads(fn, p.n_heads, p.n_kv_heads);
  const KernelEntry& kernels = find_kernels(fn, p.kv_dtype, p.head_dim);
  if (p.n_q < 0) fail(ErrorCode::kInvalidArgument, fn, ": n_q ", p.n_q, " must be >= 0");
  if (p.n_kv < 0) fail(ErrorCode::kInvalidArgument, fn, ": n_kv ", p.n_kv, " must be >= 0");
  // Row counts and element offsets must fit int64 and the grid (x <= 2^31 - 1 blocks of 64 rows).
  const int64_t group = p.n_heads / p.n_kv_heads;
  constexpr int64_t kMaxElems = int64_t{1} << 50;
  if (p.n_q > kMaxElems / (int64_t(p.n_heads) * p.head_dim) || p.n_q * group > (int64_t{1} << 36))
    fail(ErrorCode::kInvalidArgument, fn, ": n_q ", p.n_q, " is too large");
  if (p.n_kv > kMaxElems / (int64_t(p.n_kv_heads) * p.head_dim))
    fail(ErrorCode::kInvalidArgument, fn, ": n_kv ", p.n_kv, " is too large");
  if (p.q_first_pos < -kMaxElems || p.q_first_pos > kMaxElems)
    fail(ErrorCode::kInvalidArgument, fn, ": q_first_pos ", p.q_first_pos, " is out of range");
  if (p.n_q > 0) {
    if (!p.q) fail(ErrorCode::kInvalidArgument, fn, ": q is null");
    if (!p.out) fail(ErrorCode::kInvalidArgument, fn, ": out is null");
    if (p.n_kv > 0 && !p.k) fail(ErrorCode::kInvalidArgument, fn, ": k is null");
    if (p.n_kv > 0 && !p.v) fail(ErrorCode::kInvalidArgument, fn, ": v is null");
  }
  resolve_scale(fn, p.scale, p.head_dim);
  return kernels;
}

const KernelEntry& check_local(const LocalAttentionParams& p) {
  const char* fn = "local_window_attention";
  check_heads(fn, p.n_heads, p.n_kv_heads);
  const KernelEntry& kernels = find_kernels(fn, p.kv_dtype, p.head_dim);
  if (p.capacity < 1 || p.capacity > (int64_t{1} << 50) / (int64_t(p.n_kv_heads) * p.head_dim))
    fail(ErrorCode::kInvalidArgument, fn, ": capacity ", p.capacity, " must be >= 1 (and not absurdly large)");
  if (p.first_pos < 0) fail(ErrorCode::kInvalidArgument, fn, ": first_pos ", p.first_pos, " must be >= 0");
  if (p.last_pos < -1 || p.last_pos > (int64_t{1} << 60))
    fail(ErrorCode::kInvalidArgument, fn, ": last_pos ", p.last_pos, " must be >= -1");
  if (p.first_pos < p.last_pos + 1 - p.capacity)
    fail(ErrorCode::kInvalidArgument, fn, ": first_pos ", p.first_pos, " < last_pos + 1 - capacity = ",
         p.last_pos + 1 - p.capacity, " (the ring no longer holds those positions)");
  if (!p.q) fail(ErrorCode::kInvalidArgument, fn, ": q is null");
  if (!p.k) fail(ErrorCode::kInvalidArgument, fn, ": k is null");
  if (!p.v) fail(ErrorCode::kInvalidArgument, fn, ": v is null");
  if (!p.out) fail(ErrorCode::kInvalidArgument, fn, ": out is null");
  if (!p.lse) fail(ErrorCode::kInvalidArgument, fn, ": lse is null");
  resolve_scale(fn, p.scale, p.head_dim);
  return kernels;
}

void check_store(const StoreKVParams& p) {
  const char* fn = "store_kv";
  if (!is_kv_dtype(p.kv_dtype))
    fail(ErrorCode::kInvalidArgument, fn, ": kv_dtype ", dtype_name(p.kv_dtype), " is not supported (f16 or bf16)");
  if (p.n < 0) fail(ErrorCode::kInvalidArgument, fn, ": n ", p.n, " must be >= 0");
  if (p.row_elems < 1 || p.row_elems > (int64_t{1} << 30))
    fail(ErrorCode::kInvalidArgument, fn, ": row_elems ", p.row_elems, " must be in [1, 2^30]");
  if (p.capacity < 1 || p.capacity > (int64_t{1} << 50) / p.row_elems)
    fail(ErrorCode::kInvalidArgument, fn, ": capacity ", p.capacity, " must be >= 1 (and not absurdly large)");
  if (p.n > (int64_t{1} << 50) / p.row_elems) fail(ErrorCode::kInvalidArgument, fn, ": n ", p.n, " is too large");
  if (p.first_pos < 0 || p.first_pos > (int64_t{1} << 60))
    fail(ErrorCode::kInvalidArgument, fn, ": first_pos ", p.first_pos, " must be >= 0");
  if (!p.ring && p.n > p.capacity - p.first_pos)
    fail(ErrorCode::kInvalidArgument, fn, ": first_pos ", p.first_pos, " + n ", p.n, " exceeds capacity ",
         p.capacity, " (ring is false)");
  if (p.n > 0 && !p.src) fail(ErrorCode::kInvalidArgument, fn, ": src is null");
  if (p.n > 0 && !p.dst) fail(ErrorCode::kInvalidArgument, fn, ": dst is null");
}

// A device allocation freed on scope exit; out of memory -> kOutOfMemory.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes == 0) return;
    const cudaError_t status = cudaMalloc(&ptr_, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail(ErrorCode::kOutOfMemory, "cudaMalloc of ", bytes, " bytes: ", cudaGetErrorString(status));
    }
    cuda_check(status, "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

void upload(void* dst, const void* src, size_t bytes) {
  if (bytes) cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
}
void download(void* dst, const void* src, size_t bytes) {
  if (bytes) cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}

}  // namespace

void prefill_attention(const PrefillAttentionParams& p, void* stream) {
  const KernelEntry& kernels = check_prefill(p);
  if (p.n_q == 0) return;
  if (p.n_kv > 0) check_aligned("prefill_attention", "k", p.k), check_aligned("prefill_attention", "v", p.v);
  kernels.prefill(p, resolve_scale("prefill_attention", p.scale, p.head_dim), static_cast<cudaStream_t>(stream));
}

void local_window_attention(const LocalAttentionParams& p, void* stream) {
  const KernelEntry& kernels = check_local(p);
  check_aligned("local_window_attention", "k", p.k), check_aligned("local_window_attention", "v", p.v);
  if (p.workspace && reinterpret_cast<uintptr_t>(p.workspace) % alignof(float) != 0)
    fail(ErrorCode::kInvalidArgument, "local_window_attention: workspace must be 4-byte aligned");
  kernels.local(p, resolve_scale("local_window_attention", p.scale, p.head_dim), static_cast<cudaStream_t>(stream));
}

void store_kv(const StoreKVParams& p, void* stream) {
  check_store(p);
  if (p.n == 0) return;
  if (p.kv_dtype == DType::kF16) detail::launch_store_kv<__half>(p, static_cast<cudaStream_t>(stream));
  else detail::launch_store_kv<__nv_bfloat16>(p, static_cast<cudaStream_t>(stream));
}

void prefill_attention_host(const PrefillAttentionParams& host) {
  check_prefill(host);
  if (host.n_q == 0) return;
  const size_t es = dtype_size(host.kv_dtype);
  const size_t q_bytes = size_t(host.n_q) * host.n_heads * host.head_dim * sizeof(float);
  const size_t kv_bytes = size_t(host.n_kv) * host.n_kv_heads * host.head_dim * es;
  const size_t lse_bytes = host.lse ? size_t(host.n_q) * host.n_heads * sizeof(float) : 0;
  DeviceBuffer q(q_bytes), k(kv_bytes), v(kv_bytes), out(q_bytes), lse(lse_bytes);
  upload(q.as<void>(), host.q, q_bytes);
  upload(k.as<void>(), host.k, kv_bytes);
  upload(v.as<void>(), host.v, kv_bytes);
  PrefillAttentionParams dev = host;
  dev.q = q.as<float>(), dev.k = k.as<void>(), dev.v = v.as<void>();
  dev.out = out.as<float>(), dev.lse = host.lse ? lse.as<float>() : nullptr;
  prefill_attention(dev, nullptr);
  download(host.out, out.as<void>(), q_bytes);
  download(host.lse, lse.as<void>(), lse_bytes);
}

void local_window_attention_host(const LocalAttentionParams& host) {
  check_local(host);
  const size_t es = dtype_size(host.kv_dtype);
  const size_t q_bytes = size_t(host.n_heads) * host.head_dim * sizeof(float);
  const size_t kv_bytes = size_t(host.capacity) * host.n_kv_heads * host.head_dim * es;
  const size_t lse_bytes = size_t(host.n_heads) * sizeof(float);
  DeviceBuffer q(q_bytes), k(kv_bytes), v(kv_bytes), out(q_bytes), lse(lse_bytes), work(host.workspace_bytes);
  upload(q.as<void>(), host.q, q_bytes);
  upload(k.as<void>(), host.k, kv_bytes);
  upload(v.as<void>(), host.v, kv_bytes);
  LocalAttentionParams dev = host;
  dev.q = q.as<float>(), dev.k = k.as<void>(), dev.v = v.as<void>();
  dev.out = out.as<float>(), dev.lse = lse.as<float>();
  dev.workspace = work.as<void>(), dev.workspace_bytes = host.workspace_bytes;
  local_window_attention(dev, nullptr);
  download(host.out, out.as<void>(), q_bytes);
  download(host.lse, lse.as<void>(), lse_bytes);
}

void store_kv_host(const StoreKVParams& host) {
  check_store(host);
  if (host.n == 0) return;
  const size_t src_bytes = size_t(host.n) * host.row_elems * sizeof(float);
  const size_t dst_bytes = size_t(host.capacity) * host.row_elems * dtype_size(host.kv_dtype);
  DeviceBuffer src(src_bytes), dst(dst_bytes);
  upload(src.as<void>(), host.src, src_bytes);
  upload(dst.as<void>(), host.dst, dst_bytes);
  StoreKVParams dev = host;
  dev.src = src.as<float>(), dev.dst = dst.as<void>();
  store_kv(dev, nullptr);
  download(host.dst, dst.as<void>(), dst_bytes);
}

}  // namespace longctx::gpu
