// LSE merge of two partial attention results on the GPU (docs/architecture.md numerical
// contract): for each query head h,
//   m = max(l1, l2); w_i = exp(l_i - m); o = (w1 o1 + w2 o2) / (w1 + w2);
//   l = m + log(w1 + w2);
// a part with l = -inf is empty: merging with it returns the other part, and
// two empty parts give o = 0, l = -inf. No NaN leaves the kernel.
#pragma once

namespace longctx::gpu {

struct MergeParams {
  const float* out_a = nullptr;  // [n_heads, head_dim] device
  const float* lse_a = nullptr;  // [n_heads] device
  const float* out_b = nullptr;  // [n_heads, head_dim] device
  const float* lse_b = nullptr;  // [n_heads] device
  float* out = nullptr;          // [n_heads, head_dim] device; may alias out_a or out_b
  float* lse = nullptr;          // [n_heads] device; may alias lse_a or lse_b
  int n_heads = 0;
  int head_dim = 0;
};

// Enqueues the merge on `stream` (a cudaStream_t, nullptr = default stream).
// Throws Error(kInvalidArgument) for bad sizes, Error(kUnsupported) in a build
// without CUDA, Error(kInternal) with CUDA's message if the launch fails.
void merge_attention_states(const MergeParams& params, void* stream);

// Host-memory convenience for tests and tools: copies in, merges, copies back
// (synchronous). Same arrays as MergeParams but in host memory.
void merge_attention_states_host(const MergeParams& host_params);

}  // namespace longctx::gpu
