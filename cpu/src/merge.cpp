// The LSE merge of two partial attention results (docs/architecture.md, numerical contract).
#include <algorithm>
#include <cmath>
#include <limits>

#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"

namespace longctx::cpu {

void merge_attention(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b, float* out,
                     float* lse, int n_heads, int head_dim) {
  if (n_heads < 0 || head_dim < 0) {
    fail(ErrorCode::kInvalidArgument, "merge_attention: negative n_heads ", n_heads, " or head_dim ", head_dim);
  }
  constexpr float kEmpty = -std::numeric_limits<float>::infinity();
  for (int h = 0; h < n_heads; ++h) {
    const size_t row = size_t(h) * size_t(head_dim);
    // Read both lse before writing: lse may alias lse_a or lse_b.
    const float la = lse_a[h];
    const float lb = lse_b[h];
    if (la == kEmpty && lb == kEmpty) {  // stays empty, out = 0 per the contract
      std::fill(out + row, out + row + head_dim, 0.f);
      lse[h] = kEmpty;
    } else if (lb == kEmpty || la == kEmpty) {  // the non-empty part, unchanged
      const float* keep = lb == kEmpty ? out_a : out_b;
      if (keep != out) std::copy(keep + row, keep + row + head_dim, out + row);
      lse[h] = lb == kEmpty ? la : lb;
    } else {
      // The larger part has weight 1, so w_a + w_b is in [1, 2]: no overflow,
      // no division by zero, and log1p keeps the small weight's precision.
      const float m = std::max(la, lb);
      const float wa = std::exp(la - m);
      const float wb = std::exp(lb - m);
      const float ca = wa / (wa + wb);
      const float cb = wb / (wa + wb);
      for (int c = 0; c < head_dim; ++c) out[row + c] = ca * out_a[row + c] + cb * out_b[row + c];
      lse[h] = m + std::log1p(std::min(wa, wb));
    }
  }
}

}  // namespace longctx::cpu
