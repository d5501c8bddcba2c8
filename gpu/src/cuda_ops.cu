// Elementwise and row kernels of the CUDA backend (cuda_ops.h). Plain
// grid-stride loops: these ops are memory-bound and small next to the GEMMs.
#include "cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda_check.h"

namespace longctx::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride loops cover the rest

int blocks_for(int64_t count) { return int(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1, kMaxBlocks)); }

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

// Calls fn(T*) with the storage type of `dtype` (f32, f16 or bf16).
template <typename Fn>
void with_type(DType dtype, const void* data, Fn fn) {
  switch (dtype) {
    case DType::kF32: fn(static_cast<const float*>(data)); break;
    case DType::kF16: fn(static_cast<const __half*>(data)); break;
    case DType::kBF16: fn(static_cast<const __nv_bfloat16*>(data)); break;
    case DType::kQ8_0: fail(ErrorCode::kInvalidArgument, "with_type: q8_0 is not an element type");
  }
}

void check_launch(const char* what) { cuda_check(cudaGetLastError(), what); }

__global__ void to_f16_kernel(const float* src, __half* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2half_rn(src[i]);
}

// max |x| into *max_bits as float bits (non-negative floats order as their
// unsigned bits; NaN is skipped: it stays NaN through the product anyway).
__global__ void abs_max_kernel(const float* src, int64_t count, unsigned* max_bits) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(src[i]));
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) atomicMax(max_bits, __float_as_uint(m));
}

// The power of two 2^e (e >= 0) that brings max |x| to at most 2^15, well
// inside f16's 65504; e = 0 when it is already there or not finite.
__device__ int f16_exponent(unsigned max_bits) {
  const float m = __uint_as_float(max_bits);
  if (!(m > 32768.f) || isinf(m)) return 0;
  int e = 0;
  frexpf(m / 32768.f, &e);  // m / 2^15 = f * 2^e, f in [0.5, 1): m / 2^e <= 2^15
  return e;
}

__global__ void to_f16_scaled_kernel(const float* src, __half* dst, int64_t count, const unsigned* max_bits,
                                     float* alpha_beta) {
  const int e = f16_exponent(*max_bits);
  const float scale = ldexpf(1.f, -e);  // exact: a power of two
  if (blockIdx.x == 0 && threadIdx.x == 0) alpha_beta[0] = ldexpf(1.f, e), alpha_beta[1] = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2half_rn(src[i] * scale);
}

__global__ void to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

template <typename T>
__global__ void add_bias_kernel(float* y, const T* bias, int64_t rows, int64_t n) {
  const int64_t count = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += widen(bias[i % n]);
}

// One block per row: a block-wide fp32 sum of squares, then the scaled row.
template <typename T>
__global__ void rms_norm_kernel(const float* x, const T* w, float eps, float* y, int64_t d) {
  const float* xr = x + blockIdx.x * d;
  float* yr = y + blockIdx.x * d;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i] * xr[i];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float total;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int i = 0; i < kThreads / 32; ++i) s += warp_sums[i];
    total = s;
  }
  __syncthreads();
  const float scale = 1.f / sqrtf(total / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * scale * widen(w[i]);
}

// One thread per (row, pair): its angle once, applied to every head.
__global__ void rope_kernel(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t first_pos,
                            const float* inv_freq, int64_t half, float magnitude, bool neox) {
  const int64_t count = n * half;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / half, i = e % half;
    double s = 0.0, c = 1.0;
    sincos(double(first_pos + t) * double(inv_freq[i]), &s, &c);
    const float sf = float(s * magnitude), cf = float(c * magnitude);
    const int64_t lo = neox ? i : 2 * i;
    const int64_t hi = neox ? i + half : 2 * i + 1;
    float* row = x + t * n_heads * head_dim;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = row + h * head_dim;
      const float a = v[lo], b = v[hi];
      v[lo] = a * cf - b * sf;
      v[hi] = a * sf + b * cf;
    }
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];  // exp overflow gives g/inf = -0, the limit
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

template <typename T>
__global__ void embed_kernel(const T* table, int64_t d, const int32_t* tokens, int64_t n, float* out) {
  const int64_t count = n * d;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = widen(table[int64_t(tokens[e / d]) * d + e % d]);
}

}  // namespace

void convert_from_f32(const float* src, void* dst, DType dtype, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case DType::kF32:
      cuda_check(cudaMemcpyAsync(dst, src, size_t(count) * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                 "convert_from_f32: cudaMemcpyAsync");
      return;
    case DType::kF16: to_f16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(src, static_cast<__half*>(dst), count); break;
    case DType::kBF16:
      to_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), count);
      break;
    case DType::kQ8_0: fail(ErrorCode::kInvalidArgument, "convert_from_f32: q8_0 is not an element type");
  }
  check_launch("convert_from_f32 launch");
}

void convert_to_f16_scaled(const float* src, __half* dst, int64_t count, unsigned* max_bits, float* alpha_beta,
                           cudaStream_t stream) {
  if (count == 0) return;
  cuda_check(cudaMemsetAsync(max_bits, 0, sizeof(unsigned), stream), "convert_to_f16_scaled: cudaMemsetAsync");
  abs_max_kernel<<<blocks_for(count), kThreads, 0, stream>>>(src, count, max_bits);
  to_f16_scaled_kernel<<<blocks_for(count), kThreads, 0, stream>>>(src, dst, count, max_bits, alpha_beta);
  check_launch("convert_to_f16_scaled launch");
}

void add_bias_rows(float* y, const void* bias, DType bias_dtype, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows * n == 0) return;
  with_type(bias_dtype, bias, [&](auto* b) { add_bias_kernel<<<blocks_for(rows * n), kThreads, 0, stream>>>(y, b, rows, n); });
  check_launch("add_bias launch");
}

void rms_norm_rows(const float* x, const void* weight, DType weight_dtype, float eps, float* y, int64_t rows,
                   int64_t d, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  with_type(weight_dtype, weight, [&](auto* w) { rms_norm_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, w, eps, y, d); });
  check_launch("rms_norm launch");
}

void rope_rows(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t first_pos, const float* inv_freq,
               int64_t half, float magnitude, bool neox, cudaStream_t stream) {
  if (n == 0 || half == 0 || n_heads == 0) return;
  rope_kernel<<<blocks_for(n * half), kThreads, 0, stream>>>(x, n, n_heads, head_dim, first_pos, inv_freq, half,
                                                             magnitude, neox);
  check_launch("rope launch");
}

void swiglu_elems(const float* gate, const float* up, float* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  swiglu_kernel<<<blocks_for(count), kThreads, 0, stream>>>(gate, up, out, count);
  check_launch("swiglu launch");
}

void add_elems(const float* a, const float* b, float* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(a, b, out, count);
  check_launch("add launch");
}

void embed_rows(const void* table, DType table_dtype, int64_t d, const int32_t* tokens, int64_t n, float* out,
                cudaStream_t stream) {
  if (n * d == 0) return;
  with_type(table_dtype, table, [&](auto* t) { embed_kernel<<<blocks_for(n * d), kThreads, 0, stream>>>(t, d, tokens, n, out); });
  check_launch("embed launch");
}

}  // namespace longctx::gpu::detail
