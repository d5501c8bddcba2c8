// Elementwise and row kernels of the CUDA backend (cuda_ops.cu), private to
// gpu/src. Pointers are device memory, arguments already checked by
// CudaBackend; each call enqueues on `stream` and throws Error(kInternal) if
// the launch fails. "Weight" inputs (norm weight, bias, embedding table) may
// be f32, f16 or bf16 and are widened exactly to f32.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::gpu::detail {

// dst[i] = src[i] rounded to `dtype` (f16/bf16: round to nearest even, like
// core's convert; f32: a copy).
void convert_from_f32(const float* src, void* dst, DType dtype, int64_t count, cudaStream_t stream);
// x for an f16 GEMM: dst = src * 2^-e rounded to f16, with the smallest e >= 0
// that keeps max |src| * 2^-e <= 2^15 (f16 overflows past 65504; e = 0 for
// the usual activations, so dst is then exactly convert_from_f32's), and
// alpha_beta[0] = 2^e, alpha_beta[1] = 0 on the device for cuBLAS's device
// pointer mode. max_bits: one device word of scratch.
void convert_to_f16_scaled(const float* src, __half* dst, int64_t count, unsigned* max_bits, float* alpha_beta,
                           cudaStream_t stream);
// y[r, i] += bias[i] for r < rows, i < n.
void add_bias_rows(float* y, const void* bias, DType bias_dtype, int64_t rows, int64_t n, cudaStream_t stream);
// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w; y may be x.
void rms_norm_rows(const float* x, const void* weight, DType weight_dtype, float eps, float* y, int64_t rows,
                   int64_t d, cudaStream_t stream);
// In place on x[n, n_heads, head_dim]: pair i of every head of row t turns by
// (first_pos + t) * inv_freq[i], the angle formed and its sine/cosine taken in
// fp64 and multiplied by magnitude (as CpuBackend does), then rounded to
// f32. half = n_rot / 2; pairs are (2i, 2i + 1) (RopeStyle::kNormal) or
// (i, i + half) when neox.
void rope_rows(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t first_pos, const float* inv_freq,
               int64_t half, float magnitude, bool neox, cudaStream_t stream);
// out = silu(gate) * up; out may alias gate or up.
void swiglu_elems(const float* gate, const float* up, float* out, int64_t count, cudaStream_t stream);
// out = a + b; out may alias a or b.
void add_elems(const float* a, const float* b, float* out, int64_t count, cudaStream_t stream);
// out[t, :] = table[tokens[t], :] widened to f32 (tokens checked by the caller).
void embed_rows(const void* table, DType table_dtype, int64_t d, const int32_t* tokens, int64_t n, float* out,
                cudaStream_t stream);

}  // namespace longctx::gpu::detail
