// The LSE merge of two partial attention results (docs/architecture.md, numerical contract).
#include <cmath>
#include <utility>

#include "longctx/core/error.h"
#include "longctx/core/lse_merge.h"
#include "longctx/cpu/attention.h"

namespace longctx::cpu {

void merge_attention(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b, float* out,
                     float* lse, int n_heads, int head_dim) {
  if (n_heads < 0 || head_dim < 0) {
    fail(ErrorCode::kInvalidArgument, "merge_attention: negative n_heads ", n_heads, " or head_dim ", head_dim);
  }
  // A part's lse is finite, or -inf when it saw no key: NaN or +inf would
  // come out as NaN (checked first: on error nothing is written).
  for (int h = 0; h < n_heads; ++h)
    for (const auto& [part, l] : {std::pair{"lse_a", lse_a[h]}, std::pair{"lse_b", lse_b[h]}})
      if (std::isnan(l) || l == INFINITY)
        fail(ErrorCode::kInvalidArgument, "merge_attention: ", part, "[", h, "] is ", l,
             "; a part's lse is finite, or -inf when it attended no key");
  for (int h = 0; h < n_heads; ++h) {
    const size_t row = size_t(h) * size_t(head_dim);
    // Read both lse before writing: lse may alias lse_a or lse_b.
    const float both[2] = {lse_a[h], lse_b[h]};
    const LseMerge m = lse_merge(both, 2);
    // Coefficients w / W; a part that weighs 0 (empty) is not read, and a
    // part that weighs all (the other empty) is copied exactly (1 * x).
    const float ca = m.weight_sum > 0.f ? lse_weight(both[0], m.max_lse) / m.weight_sum : 0.f;
    const float cb = m.weight_sum > 0.f ? lse_weight(both[1], m.max_lse) / m.weight_sum : 0.f;
    for (int c = 0; c < head_dim; ++c) {
      const float a = out_a[row + c] * ca, b = out_b[row + c] * cb;  // a NaN of an unread part is dropped below
      out[row + c] = ca > 0.f && cb > 0.f ? a + b : ca > 0.f ? a : cb > 0.f ? b : 0.f;
    }
    lse[h] = m.lse;
  }
}

}  // namespace longctx::cpu
