// The one LSE merge of partial attention results (docs/architecture.md,
// numerical contract), inline for the CPU and the CUDA kernels alike.
// Parts s = 1..n hold (out_s, lse_s); an empty part (no keys) has lse = -inf
// and out = 0, and is never read:
//   m = max_s lse_s,   w_s = exp(lse_s - m)   (0 for an empty part),
//   out = sum_s w_s out_s / W,   W = sum_s w_s,   lse = m + log(W).
// A largest part weighs exactly 1, so W is in [1, n]: no overflow, no division
// by zero. lse is m + log1p(W - 1), with W - 1 summed from the other parts'
// weights so that a small part is not lost against the 1. Every part empty:
// W = 0, out = 0, lse = -inf.
#pragma once

#include <math.h>

#include <cstddef>

#if defined(__CUDACC__)
#define LONGCTX_HOST_DEVICE __host__ __device__
#else
#define LONGCTX_HOST_DEVICE
#endif

namespace longctx {

// Weight of a part against the largest lse of the merge: exp(lse - max_lse)
// in [0, 1]; 0 for an empty part (also when every part is empty).
LONGCTX_HOST_DEVICE inline float lse_weight(float lse, float max_lse) {
  return lse == -INFINITY ? 0.f : expf(lse - max_lse);
}

struct LseMerge {
  float max_lse = -INFINITY;  // m
  float weight_sum = 0.f;     // W: out = sum_s lse_weight(lse_s, m) out_s / W (W = 0: every part empty)
  float lse = -INFINITY;      // of the merged result
};

// The merge of the n parts whose lse are lse[0], lse[stride], ...
LONGCTX_HOST_DEVICE inline LseMerge lse_merge(const float* lse, int n, size_t stride = 1) {
  LseMerge m;
  for (int s = 0; s < n; ++s) m.max_lse = fmaxf(m.max_lse, lse[size_t(s) * stride]);
  if (m.max_lse == -INFINITY) return m;
  float others = 0.f;  // W - 1: every weight but that of the first largest part
  bool largest_seen = false;
  for (int s = 0; s < n; ++s) {
    const float l = lse[size_t(s) * stride];
    if (!largest_seen && l == m.max_lse) largest_seen = true;
    else others += lse_weight(l, m.max_lse);
  }
  m.weight_sum = 1.f + others;
  m.lse = m.max_lse + log1pf(others);
  return m;
}

}  // namespace longctx
