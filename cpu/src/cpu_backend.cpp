// CpuBackend: tensors from an accounted budget, host copies, argument checks;
// the math is in cpu_backend_ops.cpp (oneTBB) and cpu_backend_matmul.cpp (oneDNN).
#include "longctx/cpu/cpu_backend.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "cpu_backend_internal.h"
#include "longctx/core/backend_args.h"
#include "longctx/core/error.h"
#include "longctx/core/huge_pages.h"
#include "longctx/cpu/quant_matmul.h"

namespace longctx::cpu {

using detail::CpuTensor;
using detail::MemoryAccount;

namespace detail {
namespace {

uint64_t physical_memory_bytes() {
  static const uint64_t bytes = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
  return bytes;
}

// Tensors from this size on (weights, in practice) go on huge pages.
constexpr size_t kHugePageMinBytes = size_t(4) << 20;

void* allocate(size_t bytes) {
  if (bytes < kHugePageMinBytes) return ::operator new(bytes, std::align_val_t(64), std::nothrow);
  return allocate_on_huge_pages(bytes);
}

void release(void* data, size_t bytes) {
  if (bytes < kHugePageMinBytes) ::operator delete(data, std::align_val_t(64));
  else std::free(data);
}

}  // namespace

CpuTensor::CpuTensor(GgmlType type, std::vector<int64_t> shape, size_t bytes, std::shared_ptr<MemoryAccount> account,
                     const char* what, QuantLayout layout)
    : BackendTensor(type, std::move(shape)), bytes_(bytes), layout_(layout), account_(std::move(account)) {
  uint64_t used = account_->used.load();
  do {
    if (account_->budget != 0 && (bytes > account_->budget || used > account_->budget - bytes)) {
      fail(ErrorCode::kOutOfMemory, "CpuBackend::", what, ": ", describe(), " needs ", format_bytes(bytes), " but ",
           format_bytes(used), " of the budget of ", format_bytes(account_->budget), " are in use");
    }
  } while (!account_->used.compare_exchange_weak(used, used + bytes));
  if (bytes == 0) return;
  // More than the machine has cannot succeed; refuse it before the allocator
  // does (sanitizer allocators abort on absurd sizes instead of failing).
  if (bytes > physical_memory_bytes()) {
    account_->used -= bytes;
    fail(ErrorCode::kOutOfMemory, "CpuBackend::", what, ": ", describe(), " needs ", format_bytes(bytes),
         ", more than this machine's ", format_bytes(physical_memory_bytes()));
  }
  // At least 64-byte alignment: whole cache lines and full AVX-512 vectors for oneDNN.
  data_ = allocate(bytes);
  if (data_ == nullptr) {
    account_->used -= bytes;
    fail(ErrorCode::kOutOfMemory, "CpuBackend::", what, ": the system refused ", format_bytes(bytes), " for ",
         describe());
  }
}

CpuTensor::~CpuTensor() {
  if (data_ != nullptr) release(data_, bytes_);
  account_->used -= bytes_;
}

}  // namespace detail

struct CpuBackend::Impl {
  CpuBackendOptions options;
  std::shared_ptr<MemoryAccount> account = std::make_shared<MemoryAccount>();
  std::unique_ptr<detail::MatmulEngine> matmul;
};

CpuBackend::CpuBackend(CpuBackendOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.weights != WeightStorage::kNative && options.weights != WeightStorage::kBF16 &&
      options.weights != WeightStorage::kF32)
    fail(ErrorCode::kInvalidArgument, "CpuBackend: unknown weight storage value ", int(options.weights));
  impl_->options = options;
  impl_->account->budget = options.memory_budget_bytes;
  impl_->matmul = std::make_unique<detail::MatmulEngine>(options.bf16_matmul, options.quant_prefill);
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
  const QuantPrefill prefill = quant_prefill(), grouped = quant_prefill(QuantLayout::kRows8);
  const auto on_onednn = [](QuantPrefill p) {
    return p == QuantPrefill::kInt8 ? "int8" : str_cat(quant_prefill_name(p), " on oneDNN");
  };
  return str_cat("cpu (", weight_storage_name(impl_->options.weights), " weights, quantized matmul on ",
                 quant_isa_name(best_quant_isa()), " (prefill: ", on_onednn(prefill),
                 grouped == prefill ? "" : str_cat(", ", on_onednn(grouped), " for weights in groups of rows"),
                 "), bf16 matmul ", bf16_native() ? "on oneDNN bf16" : "widened to f32", ")");
}

WeightStorage CpuBackend::weight_storage() const { return impl_->options.weights; }
uint64_t CpuBackend::bytes_in_use() const { return impl_->account->used.load(); }
uint64_t CpuBackend::memory_budget_bytes() const { return impl_->account->budget; }
bool CpuBackend::bf16_native() const { return impl_->matmul->bf16_native(); }
QuantPrefill CpuBackend::quant_prefill(QuantLayout layout) const { return impl_->matmul->quant_prefill(layout); }

const char* quant_prefill_name(QuantPrefill path) {
  switch (path) {
    case QuantPrefill::kAuto: return "auto";
    case QuantPrefill::kInt8: return "int8";
    case QuantPrefill::kBf16Tiles: return "bf16 tiles";
    case QuantPrefill::kF32Tiles: return "f32 tiles";
  }
  return "?";
}

std::unique_ptr<BackendTensor> CpuBackend::alloc(std::vector<int64_t> shape, DType dtype) {
  const size_t bytes = backend_tensor_bytes(shape, dtype, "CpuBackend", "alloc");
  return std::make_unique<CpuTensor>(ggml_type_of(dtype), std::move(shape), bytes, impl_->account, "alloc");
}

void CpuBackend::upload(const TensorView& src, BackendTensor& dst) {
  auto& out = backend_tensor_cast<CpuTensor>(dst, "upload", "dst");
  check_upload_args(src, out);
  gather_view(src, out.data(), out.dtype());
}

void CpuBackend::download(const BackendTensor& src, const MutableTensorView& dst) {
  const auto& in = backend_tensor_cast<CpuTensor>(src, "download", "src");
  check_download_args(in, dst);
  scatter_view(in.data(), dst);
}

std::optional<GgmlType> CpuBackend::stored_type(GgmlType type, size_t rank, WeightStorage storage) {
  switch (storage) {
    case WeightStorage::kBF16: return GgmlType::kBF16;
    case WeightStorage::kF32: return GgmlType::kF32;
    case WeightStorage::kNative: break;
  }
  if (rank < 2) return GgmlType::kF32;
  if (dtype_of(type) || is_quant_matmul_type(type)) return type;
  return std::nullopt;
}

std::unique_ptr<BackendTensor> CpuBackend::load_weight(const HostWeight& host) {
  check_host_weight(host);
  const std::optional<GgmlType> stored = stored_type(host.type, host.shape.size(), impl_->options.weights);
  if (!stored)
    fail(ErrorCode::kUnsupported, "load_weight: weight '", host.name, "' is ", ggml_type_info(host.type).name,
         ", which the CPU backend does not compute with");
  const GgmlType type = *stored;
  const int64_t numel = host.numel();
  const size_t bytes = size_t(*ggml_bytes(type, numel));
  // Q4_0, Q8_0 and Q2_K..Q6_K matrices go in groups of 8 or 16 rows
  // where the kernels read those faster (quant_matmul.h, QuantLayout).
  const QuantLayout layout = impl_->options.weight_groups && type == host.type && host.shape.size() == 2
                                 ? preferred_quant_layout(type, host.shape[0])
                                 : QuantLayout::kRows;
  auto tensor = std::make_unique<CpuTensor>(type, host.shape, bytes, impl_->account, "load_weight", layout);
  if (layout != QuantLayout::kRows) {
    pack_groups(type, layout, host.bytes.data(), host.shape[0], host.shape[1], static_cast<uint8_t*>(tensor->data()));
    return tensor;
  }
  if (type == host.type) {
    std::memcpy(tensor->data(), host.bytes.data(), bytes);
    return tensor;
  }
  convert_weight(host, *dtype_of(type), tensor->data());
  return tensor;
}

void CpuBackend::matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) {
  const auto& xt = backend_tensor_cast<CpuTensor>(x, "matmul", "x");
  const auto& wt = backend_tensor_cast<CpuTensor>(w, "matmul", "w");
  auto& yt = backend_tensor_cast<CpuTensor>(y, "matmul", "y");
  if (bias != nullptr) backend_tensor_cast<CpuTensor>(*bias, "matmul", "bias");
  const MatmulDims d = check_matmul_args(x, w, bias, y);
  if (d.n == 0 || d.out == 0) return;
  impl_->matmul->run(static_cast<const float*>(xt.data()), wt.data(), w.type(), wt.layout(),
                     static_cast<float*>(yt.data()), d.n, d.in, d.out);
  if (bias != nullptr) detail::add_bias_rows(static_cast<float*>(yt.data()), bias->data(), bias->dtype(), d.n, d.out);
}

void CpuBackend::rms_norm(const BackendTensor& x, const BackendTensor& weight, float eps, BackendTensor& y) {
  const auto& xt = backend_tensor_cast<CpuTensor>(x, "rms_norm", "x");
  const auto& wt = backend_tensor_cast<CpuTensor>(weight, "rms_norm", "weight");
  auto& yt = backend_tensor_cast<CpuTensor>(y, "rms_norm", "y");
  check_rms_norm_args(x, weight, eps, y);
  const int64_t d = x.shape().back();
  if (d == 0) return;
  detail::rms_norm_rows(static_cast<const float*>(xt.data()), wt.data(), weight.dtype(), eps,
                        static_cast<float*>(yt.data()), x.numel() / d, d);
}

void CpuBackend::rope(BackendTensor& x, int64_t first_pos, const RopeParams& params) {
  auto& xt = backend_tensor_cast<CpuTensor>(x, "rope", "x");
  check_rope_args(x, first_pos, params);
  const std::vector<float> inv_freq = rope_inv_freq(params);  // validates params
  detail::rope_rows(static_cast<float*>(xt.data()), x.shape()[0], x.shape()[1], x.shape()[2], first_pos, inv_freq,
                    rope_magnitude(params), params.style);
}

void CpuBackend::swiglu(const BackendTensor& gate, const BackendTensor& up, BackendTensor& out) {
  const auto& g = backend_tensor_cast<CpuTensor>(gate, "swiglu", "gate");
  const auto& u = backend_tensor_cast<CpuTensor>(up, "swiglu", "up");
  auto& o = backend_tensor_cast<CpuTensor>(out, "swiglu", "out");
  check_elementwise_args("swiglu", {"gate", "up", "out"}, gate, up, out);
  detail::swiglu_elems(static_cast<const float*>(g.data()), static_cast<const float*>(u.data()),
                       static_cast<float*>(o.data()), gate.numel());
}

void CpuBackend::add(const BackendTensor& a, const BackendTensor& b, BackendTensor& out) {
  const auto& at = backend_tensor_cast<CpuTensor>(a, "add", "a");
  const auto& bt = backend_tensor_cast<CpuTensor>(b, "add", "b");
  auto& o = backend_tensor_cast<CpuTensor>(out, "add", "out");
  check_elementwise_args("add", {"a", "b", "out"}, a, b, out);
  detail::add_elems(static_cast<const float*>(at.data()), static_cast<const float*>(bt.data()),
                    static_cast<float*>(o.data()), a.numel());
}

void CpuBackend::embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) {
  const auto& tt = backend_tensor_cast<CpuTensor>(table, "embed", "table");
  auto& o = backend_tensor_cast<CpuTensor>(out, "embed", "out");
  check_embed_args(table, tokens, out);
  detail::embed_rows(tt.data(), table.type(), tt.layout(), table.shape()[1], tokens, static_cast<float*>(o.data()));
}

}  // namespace longctx::cpu
