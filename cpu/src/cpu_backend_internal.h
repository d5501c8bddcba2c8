// Pieces of CpuBackend shared by its source files: the tensor type, the
// memory account, the matmul engine (oneDNN) and the elementwise kernels.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/cpu/quant_matmul.h"

namespace longctx::cpu::detail {

// Bytes held by the tensors of one backend against its budget; shared with
// the tensors so that one freed after the backend still returns its bytes.
struct MemoryAccount {
  uint64_t budget = 0;  // 0 = unlimited
  std::atomic<uint64_t> used{0};
};

class CpuTensor final : public BackendTensor {
 public:
  static constexpr const char* kBackendName = "CpuBackend";  // backend_tensor_cast's errors
  // Reserves and allocates `bytes` for a tensor of `type`; throws
  // Error(kOutOfMemory) leaving nothing reserved.
  CpuTensor(GgmlType type, std::vector<int64_t> shape, size_t bytes, std::shared_ptr<MemoryAccount> account,
            const char* what, QuantLayout layout = QuantLayout::kRows);
  ~CpuTensor() override;
  CpuTensor(const CpuTensor&) = delete;
  CpuTensor& operator=(const CpuTensor&) = delete;

  void* data() override { return data_; }
  const void* data() const override { return data_; }
  size_t bytes() const { return bytes_; }
  // How the rows of a quantized weight lie (load_weight packs some in groups).
  QuantLayout layout() const { return layout_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  QuantLayout layout_;
  std::shared_ptr<MemoryAccount> account_;
};

// y[m, n] = x[m, k] · w[n, k]^T, f32 x and y, w of `w_type`: f32, f16, bf16
// or a quant_matmul.h block type, its rows laid out as `w_layout` says.
class MatmulEngine {
 public:
  MatmulEngine(Bf16Matmul bf16_mode, QuantPrefill quant_mode);
  ~MatmulEngine();
  MatmulEngine(const MatmulEngine&) = delete;
  MatmulEngine& operator=(const MatmulEngine&) = delete;
  void run(const float* x, const void* w, GgmlType w_type, QuantLayout w_layout, float* y, int64_t m, int64_t k,
           int64_t n);
  bool bf16_native() const;
  QuantPrefill quant_prefill(QuantLayout layout) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Rows o in [o_begin, o_end) of y[m, *] (row stride ldy) = x[m, k] · w[o, k]^T,
// w f32, f16 or bf16 (cpu_backend_gemv_hwy.cpp): for the few rows of decode.
constexpr int kGemvMaxRows = 4;  // rows of x sharing one read of a weight row
struct GemvRun {
  const float* x = nullptr;
  int64_t m = 0, k = 0;
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t o_begin = 0, o_end = 0;
};
void gemv(const GemvRun& run);

// Elementwise kernels (cpu_backend_ops.cpp), parallel over rows with oneTBB.
// Arguments are already checked by CpuBackend.
void rms_norm_rows(const float* x, const void* weight, DType weight_dtype, float eps, float* y, int64_t rows,
                   int64_t d);
// rope_rows multiplies each rotated pair by magnitude (rope_magnitude).
void rope_rows(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t first_pos,
               const std::vector<float>& inv_freq, float magnitude, RopeStyle style);
void swiglu_elems(const float* gate, const float* up, float* out, int64_t count);
void add_elems(const float* a, const float* b, float* out, int64_t count);
void add_bias_rows(float* y, const void* bias, DType bias_dtype, int64_t rows, int64_t n);
// Row o of a weight of k values per row in GGML's layout: in place for
// kRows, unpacked into `scratch` for groups.
std::span<const uint8_t> weight_row(const void* w, GgmlType type, QuantLayout layout, int64_t k, int64_t o,
                                    std::vector<uint8_t>& scratch);
void embed_rows(const void* table, GgmlType table_type, QuantLayout table_layout, int64_t d,
                std::span<const int32_t> tokens, float* out);

}  // namespace longctx::cpu::detail
