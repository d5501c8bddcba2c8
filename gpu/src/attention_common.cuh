// Device helpers shared by the attention kernels (private to gpu/src): the
// 16-bit K/V element types, the online-softmax row state, warp reductions,
// and the launchers each kernel file provides for the table in attention.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "longctx/gpu/attention.h"

namespace longctx::gpu::detail {

// ---- K/V element types ------------------------------------------------------
// Round-to-nearest-even, like longctx::convert on the host, so that a host
// reference that rounds its inputs sees the kernel's exact inputs.
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// Eight consecutive elements (16 bytes, one vector load) widened to f32.
template <typename T>
__device__ __forceinline__ void load8(const T* src, float (&dst)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = to_f32(e[i]);
}

// ---- online softmax ---------------------------------------------------------
// State of one row over the keys seen so far (FlashInfer's state.cuh):
// m = max score, d = sum of exp(score - m); the caller keeps
// o = sum of exp(score - m) * v next to it. Empty: m = -inf, d = 0, o = 0.
struct RowState {
  float m = -INFINITY;
  float d = 0.f;

  // Raises the max to m_new (>= m) and returns the factor that rescales d (done
  // here) and the caller's o. m = -inf -> 0; m_new == m (also both -inf) -> 1,
  // never exp(-inf - -inf) = NaN.
  __device__ __forceinline__ float raise_max(float m_new) {
    const float alpha = (m_new == m) ? 1.f : expf(m - m_new);
    m = m_new;
    d *= alpha;
    return alpha;
  }
  // Folds in another state of the same row; returns the weights (w_self,
  // w_other) for the callers' o vectors: o = w_self * o + w_other * o_other.
  __device__ __forceinline__ float2 merge(const RowState& other) {
    const float m_new = fmaxf(m, other.m);
    const float w_other = (other.m == m_new) ? 1.f : expf(other.m - m_new);
    const float w_self = raise_max(m_new);
    d += w_other * other.d;
    return make_float2(w_self, w_other);
  }
  // log sum exp of the scores, -inf when no key was seen.
  __device__ __forceinline__ float lse() const { return d > 0.f ? m + logf(d) : -INFINITY; }
  // 1/d, 0 for an empty row (its o is 0: out = 0, no NaN).
  __device__ __forceinline__ float inv_d() const { return d > 0.f ? 1.f / d : 0.f; }
};

// ---- warp reductions (all 32 lanes take part) -------------------------------
// Over groups of `kWidth` consecutive lanes (kWidth a power of two <= 32).
template <int kWidth>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// ---- launchers (one per kernel file), instantiated for the table ------------
// Params are validated by the caller; scale is resolved (never 0).
template <typename T, int D>
void launch_prefill(const PrefillAttentionParams& p, float scale, cudaStream_t stream);
template <typename T, int D>
void launch_local(const LocalAttentionParams& p, float scale, cudaStream_t stream);
template <typename T>
void launch_store_kv(const StoreKVParams& p, cudaStream_t stream);

}  // namespace longctx::gpu::detail
