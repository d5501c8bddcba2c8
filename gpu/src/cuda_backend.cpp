// CudaBackend (cuda_backend.h): tensors from the budgeted device pool, host
// copies, argument checks (the same as CpuBackend's), cuBLAS GEMMs; the other
// kernels are in cuda_ops.cu and the attention in cuda_device_attention.cpp.
#include "longctx/gpu/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <utility>

#include "cuda_check.h"
#include "cuda_internal.h"
#include "cuda_ops.h"
#include "longctx/core/backend_args.h"
#include "longctx/core/error.h"
#include "longctx/gpu/device.h"

namespace longctx::gpu {
namespace detail {

void activate(const CudaContext& context) { cuda_check(cudaSetDevice(context.device), "cudaSetDevice"); }

void copy_host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, const char* what) {
  if (bytes == 0) return;
  cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), what);
  // From pageable memory the call returns once src is staged; from pinned
  // memory it does not, so wait: the caller may reuse src at once.
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, src) != cudaSuccess) cudaGetLastError();
  if (attributes.type != cudaMemoryTypeUnregistered) cuda_check(cudaStreamSynchronize(stream), what);
}

namespace {

const char* cublas_status_text(cublasStatus_t status) { return cublasGetStatusString(status); }

void cublas_check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_ALLOC_FAILED) fail(ErrorCode::kOutOfMemory, what, ": ", cublas_status_text(status));
  if (status != CUBLAS_STATUS_SUCCESS) fail(ErrorCode::kInternal, what, ": ", cublas_status_text(status));
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kQ8_0: break;  // a KV store type, never a device tensor's (dtype_size refuses it)
  }
  return CUDA_R_32F;
}

// Owners of the CUDA handles, so that a constructor that throws half-way
// releases what it made. Streams are drained before they go.
struct StreamOwner {
  cudaStream_t stream = nullptr;
  StreamOwner() { cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~StreamOwner() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  StreamOwner(const StreamOwner&) = delete;
  StreamOwner& operator=(const StreamOwner&) = delete;
};

struct CublasOwner {
  cublasHandle_t handle = nullptr;
  CublasOwner() { cublas_check(cublasCreate(&handle), "cublasCreate"); }
  ~CublasOwner() { cublasDestroy(handle); }
  CublasOwner(const CublasOwner&) = delete;
  CublasOwner& operator=(const CublasOwner&) = delete;
};

int select_device(const CudaBackendOptions& options, std::string& device_name) {
  std::string why;
  const std::vector<DeviceInfo> devices = list_devices(&why);
  if (devices.empty()) fail(ErrorCode::kUnsupported, "make_cuda_backend: no CUDA device: ", why);
  for (const DeviceInfo& d : devices) {
    if (d.index == options.device) {
      device_name = d.name;
      // Current before the streams and the cuBLAS handle are made (members).
      cuda_check(cudaSetDevice(d.index), "cudaSetDevice");
      return d.index;
    }
  }
  fail(ErrorCode::kInvalidArgument, "make_cuda_backend: device ", options.device, " does not exist (this machine has ",
       devices.size(), " usable CUDA device", devices.size() == 1 ? "" : "s", ")");
}

uint64_t device_budget(const CudaBackendOptions& options, int device) {
  if (options.device_budget_bytes != 0) return options.device_budget_bytes;
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  size_t free = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return uint64_t(double(free) * 0.9);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override {
    return str_cat("cuda (", device_name_, ", ", dtype_name(weight_dtype_), " weights)");
  }
  bool host_memory() const override { return false; }

  std::unique_ptr<BackendTensor> alloc(std::vector<int64_t> shape, DType dtype) override;
  void upload(const TensorView& src, BackendTensor& dst) override;
  void download(const BackendTensor& src, const MutableTensorView& dst) override;
  std::unique_ptr<BackendTensor> load_weight(const HostWeight& host) override;

  void matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) override;
  void rms_norm(const BackendTensor& x, const BackendTensor& weight, float eps, BackendTensor& y) override;
  void rope(BackendTensor& x, int64_t first_pos, const RopeParams& params) override;
  void swiglu(const BackendTensor& gate, const BackendTensor& up, BackendTensor& out) override;
  void add(const BackendTensor& a, const BackendTensor& b, BackendTensor& out) override;
  void embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) override;
  void synchronize() override;
  DeviceAttention* device_attention() override { return attention_.get(); }

  // wrap_device_memory, wait_for_stream, join_stream (cuda_backend.h).
  std::unique_ptr<BackendTensor> wrap(void* data, std::vector<int64_t> shape, DType dtype, const char* what);
  void wait_for(cudaStream_t stream);
  void join(cudaStream_t stream);

 private:
  std::unique_ptr<BackendTensor> make_tensor(DType dtype, std::vector<int64_t> shape, const char* what);
  // Copies a host view into device memory of dst_dtype, converting on the host.
  void copy_to_device(const TensorView& src, void* dst, DType dst_dtype);
  // inv_freq of these params on the device (cached per distinct table).
  const float* inv_freq_on_device(const std::vector<float>& inv_freq);

  DType weight_dtype_;
  std::string device_name_;
  int device_;
  StreamOwner compute_, copy_;
  CublasOwner cublas_;
  CudaContext context_;
  PoolBlock x_scratch_;  // x converted to the weight dtype for cuBLAS
  PoolBlock f16_scale_;  // f16 weights: x's scale word, then cuBLAS's alpha and beta (device pointer mode)
  std::vector<std::pair<std::vector<float>, PoolBlock>> rope_tables_;
  std::unique_ptr<DeviceAttention> attention_;
};

CudaBackend::CudaBackend(const CudaBackendOptions& options)
    : weight_dtype_(options.weight_dtype), device_(select_device(options, device_name_)) {
  context_.device = device_;
  context_.compute = compute_.stream;
  context_.copy = copy_.stream;
  const std::vector<cudaStream_t> streams{compute_.stream, copy_.stream};
  context_.device_pool =
      MemoryPool::create(MemoryPool::Kind::kDevice, device_, device_budget(options, device_), streams);
  context_.pinned_pool = MemoryPool::create(MemoryPool::Kind::kPinned, device_, options.pinned_budget_bytes, streams);
  context_.overlap_decode = options.overlap_decode;
  cublas_check(cublasSetStream(cublas_.handle, compute_.stream), "cublasSetStream");
  // Plain fp32 for f32 weights (no TF32): the f32 path is the exact one.
  cublas_check(cublasSetMathMode(cublas_.handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  attention_ = make_device_attention(context_);
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  attention_.reset();
  cudaStreamSynchronize(copy_.stream);
  cudaStreamSynchronize(compute_.stream);
}

std::unique_ptr<BackendTensor> CudaBackend::make_tensor(DType dtype, std::vector<int64_t> shape, const char* what) {
  const size_t bytes = backend_tensor_bytes(shape, dtype, "CudaBackend", what);
  activate(context_);
  PoolBlock block =
      context_.device_pool->alloc(bytes, str_cat("CudaBackend::", what, ": ", dtype_name(dtype), format_shape(shape)));
  return std::make_unique<CudaTensor>(dtype, std::move(shape), std::move(block));
}

std::unique_ptr<BackendTensor> CudaBackend::alloc(std::vector<int64_t> shape, DType dtype) {
  return make_tensor(dtype, std::move(shape), "alloc");
}

void CudaBackend::copy_to_device(const TensorView& src, void* dst, DType dst_dtype) {
  const size_t bytes = size_t(src.numel()) * dtype_size(dst_dtype);
  if (bytes == 0) return;
  activate(context_);
  if (src.is_contiguous() && src.dtype == dst_dtype) {
    copy_host_to_device(dst, src.data, bytes, compute_.stream, "upload: cudaMemcpyAsync");
    return;
  }
  std::vector<std::byte> staging(bytes);
  gather_view(src, staging.data(), dst_dtype);
  copy_host_to_device(dst, staging.data(), bytes, compute_.stream, "upload: cudaMemcpyAsync");
}

void CudaBackend::upload(const TensorView& src, BackendTensor& dst) {
  auto& out = backend_tensor_cast<CudaTensor>(dst, "upload", "dst");
  check_upload_args(src, out);
  copy_to_device(src, out.data(), out.dtype());
}

void CudaBackend::download(const BackendTensor& src, const MutableTensorView& dst) {
  const auto& in = backend_tensor_cast<CudaTensor>(src, "download", "src");
  check_download_args(in, dst);
  const size_t bytes = size_t(in.numel()) * dtype_size(in.dtype());
  if (bytes == 0) return;
  activate(context_);
  std::vector<std::byte> staging(dst.is_contiguous() ? 0 : bytes);
  void* target = dst.is_contiguous() ? dst.data : staging.data();
  cuda_check(cudaMemcpyAsync(target, in.data(), bytes, cudaMemcpyDeviceToHost, compute_.stream),
             "download: cudaMemcpyAsync");
  cuda_check(cudaStreamSynchronize(compute_.stream), "download: cudaStreamSynchronize");
  if (!dst.is_contiguous()) scatter_view(staging.data(), dst);
}

// Every weight in the backend's weight dtype: quantized blocks are dequantized
// on the host (the GPU computes dense GEMMs on cuBLAS).
std::unique_ptr<BackendTensor> CudaBackend::load_weight(const HostWeight& host) {
  check_host_weight(host);
  auto tensor = make_tensor(weight_dtype_, host.shape, "load_weight");
  std::vector<std::byte> staging(size_t(host.numel()) * dtype_size(weight_dtype_));
  convert_weight(host, weight_dtype_, staging.data());
  activate(context_);
  copy_host_to_device(tensor->data(), staging.data(), staging.size(), compute_.stream, "load_weight: cudaMemcpyAsync");
  return tensor;
}

void CudaBackend::matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) {
  const auto& xt = backend_tensor_cast<CudaTensor>(x, "matmul", "x");
  const auto& wt = backend_tensor_cast<CudaTensor>(w, "matmul", "w");
  auto& yt = backend_tensor_cast<CudaTensor>(y, "matmul", "y");
  if (bias != nullptr) backend_tensor_cast<CudaTensor>(*bias, "matmul", "bias");
  check_backend_dtype(w, weight_dtype_, "matmul", "w (the weight dtype)");
  const MatmulDims dims = check_matmul_args(x, w, bias, y);
  const int64_t n = dims.n, in = dims.in, out = dims.out;
  if (n > INT_MAX || in > INT_MAX || out > INT_MAX)
    fail(ErrorCode::kUnsupported, "matmul: cuBLAS takes 32-bit sizes: ", describe_matmul_args(x, w, bias, y));
  if (n == 0 || out == 0) return;
  activate(context_);
  float* yp = static_cast<float*>(yt.data());
  if (in == 0) {  // an empty sum
    cuda_check(cudaMemsetAsync(yp, 0, size_t(n * out) * sizeof(float), compute_.stream), "matmul: cudaMemsetAsync");
  } else {
    const void* xp = xt.data();
    const float one_zero[2] = {1.f, 0.f};
    const float* alpha_beta = one_zero;  // host pointer mode, unless f16 below
    if (weight_dtype_ != DType::kF32) {
      // cuBLAS multiplies matching types: x rounded to the weight dtype, fp32 accumulation.
      const size_t bytes = size_t(n * in) * dtype_size(weight_dtype_);
      if (x_scratch_.bytes() < bytes)
        x_scratch_ = context_.device_pool->alloc(bytes, str_cat("CudaBackend::matmul: ", dtype_name(weight_dtype_),
                                                                 " copy of x ", x.describe()));
      if (weight_dtype_ == DType::kF16) {  // scaled so that large activations do not overflow f16
        if (f16_scale_.get() == nullptr) f16_scale_ = context_.device_pool->alloc(4 * sizeof(float), "CudaBackend::matmul: f16 scale");
        auto* words = static_cast<float*>(f16_scale_.get());
        convert_to_f16_scaled(static_cast<const float*>(xp), static_cast<__half*>(x_scratch_.get()), n * in,
                              reinterpret_cast<unsigned*>(words), words + 1, compute_.stream);
        alpha_beta = words + 1;
      } else {
        convert_from_f32(static_cast<const float*>(xp), x_scratch_.get(), weight_dtype_, n * in, compute_.stream);
      }
      xp = x_scratch_.get();
    }
    // Column-major view: y^T [out, n] = w [in, out]^T · x^T [in, n].
    const bool on_device = alpha_beta != one_zero;
    cublas_check(cublasSetPointerMode(cublas_.handle, on_device ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST),
                 "matmul: cublasSetPointerMode");
    const cudaDataType_t type = cuda_type(weight_dtype_);
    cublas_check(cublasGemmEx(cublas_.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(n), int(in), alpha_beta,
                              wt.data(), type, int(in), xp, type, int(in), alpha_beta + 1, yp, CUDA_R_32F, int(out),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "matmul: cublasGemmEx");
  }
  if (bias != nullptr) add_bias_rows(yp, bias->data(), bias->dtype(), n, out, compute_.stream);
}

void CudaBackend::rms_norm(const BackendTensor& x, const BackendTensor& weight, float eps, BackendTensor& y) {
  const auto& xt = backend_tensor_cast<CudaTensor>(x, "rms_norm", "x");
  const auto& wt = backend_tensor_cast<CudaTensor>(weight, "rms_norm", "weight");
  auto& yt = backend_tensor_cast<CudaTensor>(y, "rms_norm", "y");
  check_rms_norm_args(x, weight, eps, y);
  const int64_t d = x.shape().back();
  if (d == 0) return;
  if (x.numel() / d > INT_MAX) fail(ErrorCode::kUnsupported, "rms_norm: more than 2^31 rows in x ", x.describe());
  activate(context_);
  rms_norm_rows(static_cast<const float*>(xt.data()), wt.data(), weight.dtype(), eps, static_cast<float*>(yt.data()),
                x.numel() / d, d, compute_.stream);
}

const float* CudaBackend::inv_freq_on_device(const std::vector<float>& inv_freq) {
  for (const auto& [table, block] : rope_tables_)
    if (table == inv_freq) return static_cast<const float*>(block.get());
  if (rope_tables_.size() >= 16) rope_tables_.clear();  // stream order keeps queued readers safe
  PoolBlock block = context_.device_pool->alloc(inv_freq.size() * sizeof(float), "CudaBackend::rope: inv_freq table");
  rope_tables_.emplace_back(inv_freq, std::move(block));
  const auto& [table, stored] = rope_tables_.back();
  cuda_check(cudaMemcpyAsync(stored.get(), table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice,
                             compute_.stream),
             "rope: cudaMemcpyAsync");
  return static_cast<const float*>(stored.get());
}

void CudaBackend::rope(BackendTensor& x, int64_t first_pos, const RopeParams& params) {
  auto& xt = backend_tensor_cast<CudaTensor>(x, "rope", "x");
  check_rope_args(x, first_pos, params);
  const int64_t n = x.shape()[0], n_heads = x.shape()[1], head_dim = x.shape()[2];
  const std::vector<float> inv_freq = rope_inv_freq(params);  // validates params
  if (n == 0 || n_heads == 0) return;
  activate(context_);
  rope_rows(static_cast<float*>(xt.data()), n, n_heads, head_dim, first_pos, inv_freq_on_device(inv_freq),
            int64_t(inv_freq.size()), rope_magnitude(params), params.style == RopeStyle::kNeox, compute_.stream);
}

void CudaBackend::swiglu(const BackendTensor& gate, const BackendTensor& up, BackendTensor& out) {
  const auto& g = backend_tensor_cast<CudaTensor>(gate, "swiglu", "gate");
  const auto& u = backend_tensor_cast<CudaTensor>(up, "swiglu", "up");
  auto& o = backend_tensor_cast<CudaTensor>(out, "swiglu", "out");
  check_elementwise_args("swiglu", {"gate", "up", "out"}, gate, up, out);
  activate(context_);
  swiglu_elems(static_cast<const float*>(g.data()), static_cast<const float*>(u.data()), static_cast<float*>(o.data()),
               gate.numel(), compute_.stream);
}

void CudaBackend::add(const BackendTensor& a, const BackendTensor& b, BackendTensor& out) {
  const auto& at = backend_tensor_cast<CudaTensor>(a, "add", "a");
  const auto& bt = backend_tensor_cast<CudaTensor>(b, "add", "b");
  auto& o = backend_tensor_cast<CudaTensor>(out, "add", "out");
  check_elementwise_args("add", {"a", "b", "out"}, a, b, out);
  activate(context_);
  add_elems(static_cast<const float*>(at.data()), static_cast<const float*>(bt.data()), static_cast<float*>(o.data()),
            a.numel(), compute_.stream);
}

void CudaBackend::embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) {
  const auto& tt = backend_tensor_cast<CudaTensor>(table, "embed", "table");
  auto& o = backend_tensor_cast<CudaTensor>(out, "embed", "out");
  check_embed_args(table, tokens, out);
  if (tokens.empty() || table.shape()[1] == 0) return;
  activate(context_);
  // Freed right after the launch: stream order keeps it until the kernel ran.
  PoolBlock ids = context_.device_pool->alloc(tokens.size_bytes(), "CudaBackend::embed: token ids");
  copy_host_to_device(ids.get(), tokens.data(), tokens.size_bytes(), compute_.stream, "embed: cudaMemcpyAsync");
  embed_rows(tt.data(), table.dtype(), table.shape()[1], static_cast<const int32_t*>(ids.get()),
             int64_t(tokens.size()), static_cast<float*>(o.data()), compute_.stream);
}

void CudaBackend::synchronize() {
  activate(context_);
  cuda_check(cudaStreamSynchronize(copy_.stream), "synchronize: copy stream");
  cuda_check(cudaStreamSynchronize(compute_.stream), "synchronize: compute stream");
}

std::unique_ptr<BackendTensor> CudaBackend::wrap(void* data, std::vector<int64_t> shape, DType dtype,
                                                 const char* what) {
  backend_tensor_bytes(shape, dtype, "wrap_device_memory", what);  // checks the shape and the dtype
  if (data == nullptr) fail(ErrorCode::kInvalidArgument, "wrap_device_memory: ", what, " is a null pointer");
  activate(context_);
  cudaPointerAttributes attributes{};
  cuda_check(cudaPointerGetAttributes(&attributes, data), "wrap_device_memory: cudaPointerGetAttributes");
  if ((attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) ||
      attributes.device != device_)
    fail(ErrorCode::kInvalidArgument, "wrap_device_memory: ", what, " is not device memory of CUDA device ",
         device_, " (", attributes.type == cudaMemoryTypeDevice ? str_cat("device ", attributes.device)
                                                                 : std::string("host memory"),
         ")");
  return std::make_unique<CudaTensor>(dtype, std::move(shape), data);
}

// What `to` queues from now on runs after what `from` has queued so far: one
// event, recorded on `from`, waited for by `to`; destroying it right away is
// allowed (the wait keeps what it needs).
void hand_off(cudaStream_t from, cudaStream_t to, const char* what) {
  cudaEvent_t event = nullptr;
  const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (created != cudaSuccess) cuda_check(created, str_cat(what, ": cudaEventCreate").c_str());
  const cudaError_t recorded = cudaEventRecord(event, from);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(to, event, 0) : recorded;
  cudaEventDestroy(event);
  if (waited != cudaSuccess) cuda_check(waited, str_cat(what, ": cudaEventRecord / cudaStreamWaitEvent").c_str());
}

void CudaBackend::wait_for(cudaStream_t stream) {
  activate(context_);
  hand_off(stream, compute_.stream, "wait_for_stream");
}

void CudaBackend::join(cudaStream_t stream) {
  activate(context_);
  for (cudaStream_t own : {compute_.stream, copy_.stream}) hand_off(own, stream, "join_stream");
}

CudaBackend& cuda_backend(Backend& backend, const char* what) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr)
    fail(ErrorCode::kInvalidArgument, what, ": backend ", backend.name(), " is not a CUDA backend");
  return *cuda;
}

}  // namespace
}  // namespace detail

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  if (options.weight_dtype != DType::kF32 && options.weight_dtype != DType::kF16 &&
      options.weight_dtype != DType::kBF16) {
    fail(ErrorCode::kInvalidArgument, "make_cuda_backend: weight_dtype must be bf16, f16 or f32, got value ",
         int(options.weight_dtype));
  }
  return std::make_unique<detail::CudaBackend>(options);
}

std::unique_ptr<BackendTensor> wrap_device_memory(Backend& backend, void* data, std::vector<int64_t> shape,
                                                  DType dtype, const char* what) {
  return detail::cuda_backend(backend, "wrap_device_memory").wrap(data, std::move(shape), dtype, what);
}

void wait_for_stream(Backend& backend, uintptr_t stream) {
  detail::cuda_backend(backend, "wait_for_stream").wait_for(reinterpret_cast<cudaStream_t>(stream));
}

void join_stream(Backend& backend, uintptr_t stream) {
  detail::cuda_backend(backend, "join_stream").join(reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace longctx::gpu
