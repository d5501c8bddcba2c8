// The CPU implementation of Backend (core/backend.h): host tensors from an
// accounted budget, GEMMs on oneDNN, elementwise ops on oneTBB.
//
// Shapes the ops accept (every op checks them and throws
// Error(kInvalidArgument) naming the op and the shapes; dtypes likewise):
// - load_weight: WeightStorage::kNative keeps a matrix in its type (f32, f16,
//   bf16, or the quantized blocks of quant_matmul.h: Q4_0, Q4_1, Q5_0, Q5_1,
//   Q8_0, Q2_K..Q6_K) and stores vectors (norms, biases) as f32;
//   kBF16 / kF32 convert everything (quantized blocks dequantized) once.
//   Q4_0, Q8_0 and Q2_K..Q6_K matrices go in groups of rows where the
//   CPU's int8 kernels read those (preferred_quant_layout: 16 rows on AVX-512
//   VNNI, 8 on AVX2 and AVX-VNNI for Q4_0, Q8_0 and Q4_K only, row count a
//   multiple of the group's; CpuBackendOptions::weight_groups = false keeps
//   GGML's rows), so the bytes behind data() are theirs rearranged.
//   Weights of 4 MiB and more sit in 2 MiB-aligned memory marked for
//   transparent huge pages (fewer TLB misses while streaming them).
// - matmul: x f32 [n, ...] (in = product of the dims after the first),
//   w [out, in] as loaded, bias [out] (f32 or bf16) or null,
//   y f32 [n, ...] (out = product of the dims after the first), y distinct
//   from x. So a [n, n_heads, head_dim] tensor is a valid y for out =
//   n_heads * head_dim. Quantized w: the rows of x are quantized to int8 per
//   block and multiplied on the quant_matmul.h kernels (best ISA of the CPU),
//   split over weight rows with oneTBB, for any n; except that on a CPU with
//   AMX or AVX512-BF16, more than 4 rows of x go to oneDNN's bf16 kernels
//   (AMX tiles / vdpbf16ps) with tiles of w dequantized to bf16, or f32 tiles
//   (QuantPrefill; weights in groups only on AMX). Dense w: up to 4 rows
//   (decode) go to a Highway kernel that streams w once (f32 x; f16 / bf16 w
//   widened exactly). More rows go to oneDNN; bf16 weights there: where
//   oneDNN has bf16 kernels for the CPU (AVX-512), x is rounded to bf16 and
//   multiplied bf16 x bf16 with f32 accumulation; elsewhere (or with
//   Bf16Matmul::kDequantize), and for f16 weights, tiles of w are widened to f32.
// - rms_norm: x f32 of any rank >= 1, normalized over its last dim d; weight
//   [d] (f32 or bf16); y the shape of x (may be x).
// - rope: x f32 [n, n_heads, head_dim], n_rot <= head_dim; angles are
//   position * rope_inv_freq(params)[i], evaluated in fp64.
// - swiglu, add: f32 tensors of one shape; out may alias an input.
// - embed: table [n_vocab, d] of any loaded type (rows dequantized as read);
//   out f32 [tokens.size(), d].
//   All tokens are checked before anything is written.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/cpu/quant_matmul.h"

namespace longctx::cpu {

// How a bf16-weight matmul computes.
enum class Bf16Matmul : uint8_t {
  kAuto,        // oneDNN bf16 x bf16 where it has a bf16 kernel for this CPU and bf16 products
                // outrun f32 ones (peak_loops.h: bf16_outruns_fma), else kDequantize
  kDequantize,  // widen weight tiles to f32 and multiply in f32 (exact weights, f32 x)
};

// How a quantized-weight matmul of more than 4 rows (prefill) computes.
enum class QuantPrefill : uint8_t {
  kAuto,       // kBf16Tiles where oneDNN has a bf16 kernel for this CPU and bf16 products outrun
               // f32 ones (AMX; vdpbf16ps on Zen 4), else kF32Tiles where the CPU has AVX512-BF16
               // (slow there: a Xeon whose VM hides AMX), else kInt8; for weights in groups
               // (kRows8, kRows16: quant_matmul.h) kBf16Tiles on AMX and kInt8 elsewhere
  kInt8,       // the int8 kernels of quant_matmul.h
  kBf16Tiles,  // tiles of w dequantized to bf16, x rounded to bf16, oneDNN bf16 x bf16 -> f32
               // (Error(kUnsupported) at construction when oneDNN has no optimized bf16 kernel here)
  kF32Tiles,   // tiles of w dequantized to f32, oneDNN f32 x f32 -> f32 (exact weights, f32 x)
};

const char* quant_prefill_name(QuantPrefill path);  // "auto", "int8", "bf16 tiles", "f32 tiles"

struct CpuBackendOptions {
  WeightStorage weights = WeightStorage::kNative;
  // Bytes alloc() and load_weight() may hold at once; 0 = unlimited. oneDNN's
  // own scratch buffers and the per-shape caches are not counted.
  uint64_t memory_budget_bytes = 0;
  Bf16Matmul bf16_matmul = Bf16Matmul::kAuto;
  QuantPrefill quant_prefill = QuantPrefill::kAuto;
  // Quantized matrices go in groups of rows where this CPU's kernels read
  // those (preferred_quant_layout); false keeps GGML's row layout, so that
  // longctx-bench matmul can time what the groups gain on a CPU.
  bool weight_groups = true;
};

class CpuBackend final : public Backend {
 public:
  // Throws Error(kInvalidArgument) for a WeightStorage value it does not know.
  explicit CpuBackend(CpuBackendOptions options = {});
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string name() const override;
  bool host_memory() const override { return true; }
  WeightStorage weight_storage() const;
  // The type load_weight stores a weight of `type` and `rank` in: kNative
  // keeps a matrix whose type matmul computes with (nullopt for one it does
  // not) and makes vectors f32; kBF16 / kF32 convert everything.
  static std::optional<GgmlType> stored_type(GgmlType type, size_t rank, WeightStorage storage);

  std::unique_ptr<BackendTensor> alloc(std::vector<int64_t> shape, DType dtype = DType::kF32) override;
  void upload(const TensorView& src, BackendTensor& dst) override;
  void download(const BackendTensor& src, const MutableTensorView& dst) override;
  std::unique_ptr<BackendTensor> load_weight(const HostWeight& host) override;

  void matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) override;
  void rms_norm(const BackendTensor& x, const BackendTensor& weight, float eps, BackendTensor& y) override;
  void rope(BackendTensor& x, int64_t first_pos, const RopeParams& params) override;
  void swiglu(const BackendTensor& gate, const BackendTensor& up, BackendTensor& out) override;
  void add(const BackendTensor& a, const BackendTensor& b, BackendTensor& out) override;
  void embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) override;
  void synchronize() override {}

  // Bytes currently held by tensors of this backend (tensors may outlive it).
  uint64_t bytes_in_use() const;
  uint64_t memory_budget_bytes() const;
  // True when bf16 matmuls run on oneDNN's bf16 kernels (false: dequantize path).
  bool bf16_native() const;
  // How quantized matmuls of more than 4 rows compute here on weights laid
  // out as `layout` (never kAuto).
  QuantPrefill quant_prefill(QuantLayout layout = QuantLayout::kRows) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx::cpu
