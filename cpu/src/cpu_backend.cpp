// CpuBackend: tensors from an accounted budget, host copies, argument checks;
// the math is in cpu_backend_ops.cpp (oneTBB) and cpu_backend_matmul.cpp (oneDNN).
#include "longctx/cpu/cpu_backend.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <new>

#include "cpu_backend_internal.h"
#include "longctx/core/error.h"

namespace longctx::cpu {

using detail::CpuTensor;
using detail::MemoryAccount;

namespace detail {
namespace {

uint64_t physical_memory_bytes() {
  static const uint64_t bytes = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
  return bytes;
}

}  // namespace

CpuTensor::CpuTensor(DType dtype, std::vector<int64_t> shape, size_t bytes, std::shared_ptr<MemoryAccount> account,
                     const char* what)
    : BackendTensor(dtype, std::move(shape)), bytes_(bytes), account_(std::move(account)) {
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
  // 64-byte alignment: whole cache lines and full AVX-512 vectors for oneDNN.
  data_ = ::operator new(bytes, std::align_val_t(64), std::nothrow);
  if (data_ == nullptr) {
    account_->used -= bytes;
    fail(ErrorCode::kOutOfMemory, "CpuBackend::", what, ": the system refused ", format_bytes(bytes), " for ",
         describe());
  }
}

CpuTensor::~CpuTensor() {
  if (data_ != nullptr) ::operator delete(data_, std::align_val_t(64));
  account_->used -= bytes_;
}

}  // namespace detail

struct CpuBackend::Impl {
  CpuBackendOptions options;
  std::shared_ptr<MemoryAccount> account = std::make_shared<MemoryAccount>();
  std::unique_ptr<detail::MatmulEngine> matmul;
};

namespace {

const CpuTensor& cpu_tensor(const BackendTensor& t, const char* op, const char* arg) {
  const auto* cpu = dynamic_cast<const CpuTensor*>(&t);
  if (cpu == nullptr)
    fail(ErrorCode::kInvalidArgument, op, ": ", arg, " ", t.describe(), " is not a CpuBackend tensor");
  return *cpu;
}

CpuTensor& cpu_tensor(BackendTensor& t, const char* op, const char* arg) {
  return const_cast<CpuTensor&>(cpu_tensor(static_cast<const BackendTensor&>(t), op, arg));
}

void check_dtype_is(const BackendTensor& t, DType dtype, const char* op, const char* arg) {
  if (t.dtype() != dtype) {
    fail(ErrorCode::kInvalidArgument, op, ": ", arg, " must be ", dtype_name(dtype), ", got ", t.describe());
  }
}

// Product of the extents after the first (the row length of an [n, ...] tensor).
int64_t row_length(const BackendTensor& t) {
  int64_t count = 1;
  for (size_t d = 1; d < t.shape().size(); ++d) count *= t.shape()[d];
  return count;
}


}  // namespace

CpuBackend::CpuBackend(CpuBackendOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.weight_dtype != DType::kF32 && options.weight_dtype != DType::kBF16) {
    fail(ErrorCode::kInvalidArgument, "CpuBackend: weight dtype must be f32 or bf16, got ",
         dtype_name(options.weight_dtype));
  }
  impl_->options = options;
  impl_->account->budget = options.memory_budget_bytes;
  impl_->matmul = std::make_unique<detail::MatmulEngine>(options.weight_dtype, options.bf16_matmul);
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
  return str_cat("cpu (", dtype_name(impl_->options.weight_dtype), " weights",
                 impl_->options.weight_dtype == DType::kBF16
                     ? (bf16_native() ? ", oneDNN bf16 matmul" : ", bf16 weights widened to f32")
                     : "",
                 ")");
}

DType CpuBackend::weight_dtype() const { return impl_->options.weight_dtype; }
uint64_t CpuBackend::bytes_in_use() const { return impl_->account->used.load(); }
uint64_t CpuBackend::memory_budget_bytes() const { return impl_->account->budget; }
bool CpuBackend::bf16_native() const { return impl_->matmul->bf16_native(); }

std::unique_ptr<BackendTensor> CpuBackend::alloc(std::vector<int64_t> shape, DType dtype) {
  const size_t elem = dtype_size(dtype);  // rejects an invalid dtype value
  int64_t numel = 1;
  for (int64_t extent : shape) {
    if (extent < 0 || __builtin_mul_overflow(numel, extent, &numel)) {
      std::string text;
      for (int64_t e : shape) text += (text.empty() ? "" : ", ") + std::to_string(e);
      fail(ErrorCode::kInvalidArgument, "CpuBackend::alloc: invalid shape [", text, "]");
    }
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(size_t(numel), elem, &bytes)) {
    fail(ErrorCode::kOutOfMemory, "CpuBackend::alloc: ", numel, " elements overflow the address space");
  }
  return std::make_unique<CpuTensor>(dtype, std::move(shape), bytes, impl_->account, "alloc");
}

void CpuBackend::upload(const TensorView& src, BackendTensor& dst) {
  auto& out = cpu_tensor(dst, "upload", "dst");
  check_host_view(src, "upload", "src");
  if (src.dtype != out.dtype() || src.numel() != out.numel()) {
    fail(ErrorCode::kInvalidArgument, "upload: src ", src.describe(), " does not match dst ", out.describe(),
         " (dtype and element count must be equal)");
  }
  gather_view(src, out.data(), out.dtype());
}

void CpuBackend::download(const BackendTensor& src, const MutableTensorView& dst) {
  const auto& in = cpu_tensor(src, "download", "src");
  check_host_view(as_const(dst), "download", "dst");
  if (dst.dtype != in.dtype() || dst.numel() != in.numel()) {
    fail(ErrorCode::kInvalidArgument, "download: src ", in.describe(), " does not match dst ", dst.describe(),
         " (dtype and element count must be equal)");
  }
  scatter_view(in.data(), dst);
}

std::unique_ptr<BackendTensor> CpuBackend::load_weight(const TensorView& host) {
  check_host_view(host, "load_weight", "host");
  const DType dtype = impl_->options.weight_dtype;
  std::vector<int64_t> shape(host.shape.begin(), host.shape.begin() + host.rank);
  const size_t bytes = size_t(host.numel()) * dtype_size(dtype);
  auto tensor = std::make_unique<CpuTensor>(dtype, std::move(shape), bytes, impl_->account, "load_weight");
  gather_view(host, tensor->data(), dtype);
  return tensor;
}

void CpuBackend::matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) {
  const auto& xt = cpu_tensor(x, "matmul", "x");
  const auto& wt = cpu_tensor(w, "matmul", "w");
  auto& yt = cpu_tensor(y, "matmul", "y");
  check_dtype_is(x, DType::kF32, "matmul", "x");
  check_dtype_is(y, DType::kF32, "matmul", "y");
  check_dtype_is(w, impl_->options.weight_dtype, "matmul", "w (the weight dtype)");
  const auto shapes = [&] {
    return str_cat("x ", x.describe(), ", w ", w.describe(), ", y ", y.describe(),
                   bias != nullptr ? ", bias " + bias->describe() : std::string());
  };
  if (x.shape().size() < 2 || y.shape().size() < 2 || w.shape().size() != 2) {
    fail(ErrorCode::kInvalidArgument, "matmul: need x [n, in...], w [out, in], y [n, out...]; got ", shapes());
  }
  const int64_t n = x.shape()[0], in = row_length(x), out = row_length(y);
  if (y.shape()[0] != n || w.shape()[1] != in || w.shape()[0] != out) {
    fail(ErrorCode::kInvalidArgument, "matmul: shapes do not match (y[n, out] = x[n, in] w[out, in]^T): ", shapes());
  }
  if (bias != nullptr) {
    cpu_tensor(*bias, "matmul", "bias");
    if (bias->shape().size() != 1 || bias->shape()[0] != out) {
      fail(ErrorCode::kInvalidArgument, "matmul: bias must be [", out, "]: ", shapes());
    }
  }
  if (yt.data() == xt.data() && yt.bytes() > 0) fail(ErrorCode::kInvalidArgument, "matmul: y aliases x: ", shapes());
  if (n == 0 || out == 0) return;
  impl_->matmul->run(static_cast<const float*>(xt.data()), wt.data(), static_cast<float*>(yt.data()), n, in, out);
  if (bias != nullptr) detail::add_bias_rows(static_cast<float*>(yt.data()), bias->data(), bias->dtype(), n, out);
}

void CpuBackend::rms_norm(const BackendTensor& x, const BackendTensor& weight, float eps, BackendTensor& y) {
  const auto& xt = cpu_tensor(x, "rms_norm", "x");
  const auto& wt = cpu_tensor(weight, "rms_norm", "weight");
  auto& yt = cpu_tensor(y, "rms_norm", "y");
  check_dtype_is(x, DType::kF32, "rms_norm", "x");
  check_dtype_is(y, DType::kF32, "rms_norm", "y");
  if (x.shape().empty() || x.shape() != y.shape() || weight.shape().size() != 1 ||
      weight.shape()[0] != x.shape().back()) {
    fail(ErrorCode::kInvalidArgument, "rms_norm: need x [..., d], weight [d], y like x; got x ", x.describe(),
         ", weight ", weight.describe(), ", y ", y.describe());
  }
  if (!std::isfinite(eps) || eps < 0.f) fail(ErrorCode::kInvalidArgument, "rms_norm: eps must be >= 0, got ", eps);
  const int64_t d = x.shape().back();
  if (d == 0) return;
  detail::rms_norm_rows(static_cast<const float*>(xt.data()), wt.data(), weight.dtype(), eps,
                        static_cast<float*>(yt.data()), x.numel() / d, d);
}

void CpuBackend::rope(BackendTensor& x, int64_t first_pos, const RopeParams& params) {
  auto& xt = cpu_tensor(x, "rope", "x");
  check_dtype_is(x, DType::kF32, "rope", "x");
  if (x.shape().size() != 3) {
    fail(ErrorCode::kInvalidArgument, "rope: x must be [n, n_heads, head_dim], got ", x.describe());
  }
  const int64_t n = x.shape()[0], n_heads = x.shape()[1], head_dim = x.shape()[2];
  if (params.n_rot > head_dim) {
    fail(ErrorCode::kInvalidArgument, "rope: n_rot ", params.n_rot, " exceeds head_dim of x ", x.describe());
  }
  int64_t last = 0;
  if (first_pos < 0 || __builtin_add_overflow(first_pos, n, &last)) {
    fail(ErrorCode::kInvalidArgument, "rope: invalid first position ", first_pos, " for x ", x.describe());
  }
  const std::vector<float> inv_freq = rope_inv_freq(params);  // validates params
  detail::rope_rows(static_cast<float*>(xt.data()), n, n_heads, head_dim, first_pos, inv_freq, params.style);
}

void CpuBackend::swiglu(const BackendTensor& gate, const BackendTensor& up, BackendTensor& out) {
  const auto& g = cpu_tensor(gate, "swiglu", "gate");
  const auto& u = cpu_tensor(up, "swiglu", "up");
  auto& o = cpu_tensor(out, "swiglu", "out");
  for (const BackendTensor* t : {&gate, &up, static_cast<const BackendTensor*>(&out)}) {
    if (t->dtype() != DType::kF32 || t->shape() != gate.shape()) {
      fail(ErrorCode::kInvalidArgument, "swiglu: gate, up and out must be f32 of one shape; got gate ", gate.describe(),
           ", up ", up.describe(), ", out ", out.describe());
    }
  }
  detail::swiglu_elems(static_cast<const float*>(g.data()), static_cast<const float*>(u.data()),
                       static_cast<float*>(o.data()), gate.numel());
}

void CpuBackend::add(const BackendTensor& a, const BackendTensor& b, BackendTensor& out) {
  const auto& at = cpu_tensor(a, "add", "a");
  const auto& bt = cpu_tensor(b, "add", "b");
  auto& o = cpu_tensor(out, "add", "out");
  for (const BackendTensor* t : {&a, &b, static_cast<const BackendTensor*>(&out)}) {
    if (t->dtype() != DType::kF32 || t->shape() != a.shape()) {
      fail(ErrorCode::kInvalidArgument, "add: a, b and out must be f32 of one shape; got a ", a.describe(), ", b ",
           b.describe(), ", out ", out.describe());
    }
  }
  detail::add_elems(static_cast<const float*>(at.data()), static_cast<const float*>(bt.data()),
                    static_cast<float*>(o.data()), a.numel());
}

void CpuBackend::embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) {
  const auto& tt = cpu_tensor(table, "embed", "table");
  auto& o = cpu_tensor(out, "embed", "out");
  check_dtype_is(out, DType::kF32, "embed", "out");
  if (table.shape().size() != 2 || out.shape().size() != 2 || out.shape()[0] != int64_t(tokens.size()) ||
      out.shape()[1] != table.shape()[1]) {
    fail(ErrorCode::kInvalidArgument, "embed: need table [n_vocab, d], out [", tokens.size(), ", d]; got table ",
         table.describe(), ", out ", out.describe());
  }
  const int64_t n_vocab = table.shape()[0];
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      fail(ErrorCode::kInvalidArgument, "embed: token ", tokens[i], " at index ", i, " is outside the vocabulary [0, ",
           n_vocab, ")");
    }
  }
  detail::embed_rows(tt.data(), table.dtype(), table.shape()[1], tokens, static_cast<float*>(o.data()));
}

}  // namespace longctx::cpu
