#include "longctx/gpu/merge.h"

#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "cuda_check.h"
#include "longctx/core/lse_merge.h"

namespace longctx::gpu {
namespace {

// One block per query head; threads stride over head_dim. The weights are
// computed once per head by every thread (cheap, avoids a shared-memory sync),
// as merge_attention computes them on the CPU (core/lse_merge.h).
__global__ void merge_kernel(MergeParams p) {
  const int h = blockIdx.x;
  const float both[2] = {p.lse_a[h], p.lse_b[h]};
  const LseMerge m = lse_merge(both, 2);
  const float ca = m.weight_sum > 0.f ? lse_weight(both[0], m.max_lse) / m.weight_sum : 0.f;
  const float cb = m.weight_sum > 0.f ? lse_weight(both[1], m.max_lse) / m.weight_sum : 0.f;
  const size_t base = size_t(h) * p.head_dim;
  for (int c = threadIdx.x; c < p.head_dim; c += blockDim.x) {
    // A part that weighs 0 (empty: out 0 by contract) is never read.
    const float a = ca > 0.f ? ca * p.out_a[base + c] : 0.f;
    const float b = cb > 0.f ? cb * p.out_b[base + c] : 0.f;
    p.out[base + c] = ca > 0.f && cb > 0.f ? a + b : ca > 0.f ? a : b;
  }
  __syncthreads();  // out may alias out_a/out_b; lse may alias lse_a/lse_b: write lse last
  if (threadIdx.x == 0) p.lse[h] = m.lse;
}

void check_params(const MergeParams& p) {
  if (p.n_heads < 0 || p.head_dim <= 0)
    fail(ErrorCode::kInvalidArgument, "merge_attention_states: n_heads ", p.n_heads, " and head_dim ",
         p.head_dim, " must be >= 0 and > 0");
  if (p.n_heads > 0 && (!p.out_a || !p.lse_a || !p.out_b || !p.lse_b || !p.out || !p.lse))
    fail(ErrorCode::kInvalidArgument, "merge_attention_states: null pointer in params");
}

}  // namespace

void merge_attention_states(const MergeParams& params, void* stream) {
  check_params(params);
  if (params.n_heads == 0) return;
  const int threads = params.head_dim >= 128 ? 128 : 64;
  merge_kernel<<<params.n_heads, threads, 0, static_cast<cudaStream_t>(stream)>>>(params);
  cuda_check(cudaGetLastError(), "merge_attention_states launch");
}

void merge_attention_states_host(const MergeParams& host) {
  check_params(host);
  if (host.n_heads == 0) return;
  const size_t n_out = size_t(host.n_heads) * host.head_dim;
  const size_t floats = 3 * n_out + 3 * size_t(host.n_heads);
  float* buffer = nullptr;
  cuda_check(cudaMalloc(&buffer, floats * sizeof(float)), "cudaMalloc");
  struct Free {
    float* p;
    ~Free() { cudaFree(p); }
  } guard{buffer};
  MergeParams dev;
  dev.n_heads = host.n_heads;
  dev.head_dim = host.head_dim;
  float* out_a = buffer;
  float* out_b = out_a + n_out;
  float* out = out_b + n_out;
  float* lse_a = out + n_out;
  float* lse_b = lse_a + host.n_heads;
  float* lse = lse_b + host.n_heads;
  dev.out_a = out_a, dev.out_b = out_b, dev.out = out;
  dev.lse_a = lse_a, dev.lse_b = lse_b, dev.lse = lse;
  cuda_check(cudaMemcpy(out_a, host.out_a, n_out * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_check(cudaMemcpy(out_b, host.out_b, n_out * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_check(cudaMemcpy(lse_a, host.lse_a, host.n_heads * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_check(cudaMemcpy(lse_b, host.lse_b, host.n_heads * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  merge_attention_states(dev, nullptr);
  cuda_check(cudaMemcpy(host.out, out, n_out * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda_check(cudaMemcpy(host.lse, lse, host.n_heads * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace longctx::gpu
