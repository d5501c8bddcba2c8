// Ada-KV adaptive budgets across heads (ALGORITHMS.md, kvpress form): a fixed
// total of H * B entries is shared among H heads by their scores, each head
// keeping at least floor(alpha * B) of its own best entries.
//
// Used on block scores per kv head (block votes at preselection, block scores
// at each re-selection in SEPARATE mode). The scores of different heads are
// compared directly, so they must be on one scale (e.g. attention mass).
#pragma once

#include <cstdint>
#include <vector>

namespace longctx::policy {

// Entries chosen per head, kvpress form of Ada-KV.
// scores: [n_heads][n_per_head], row h = head h. An entry scored -inf is
// excluded (never chosen: a block outside the preselected set); NaN ranks
// after every other value. Rank order: larger score first, -0 == +0; ties
// broken by lower head, then lower index.
//   B  = min(per_head_budget, n_per_head)
//   floor_h = min(floor(alpha * B), eligible_h)   (alpha * B in double)
//   total   = min(n_heads * B, sum_h eligible_h)
// Each head first takes its floor_h best entries; the remaining
// total - sum_h floor_h entries are the best of all heads' remaining eligible
// entries. Without -inf scores the total is exactly min(H*B, H*n) and every
// head keeps >= min(floor(alpha * per_head_budget), n) entries. alpha = 1
// gives every head its own top B (uniform budgets). A total_budget T >= 0
// caps the total as well, and the floors become min(floor(alpha * B),
// floor(alpha * T / H)) so that they fit in it (top_p shares a total that
// need not be a multiple of H).
// Returns the chosen indices of each head sorted by increasing index.
// Throws Error(kInvalidArgument) for n_heads < 1, n_per_head < 0,
// per_head_budget < 0, alpha outside [0, 1] (or NaN), null scores with n > 0,
// or n_heads * n_per_head >= 2^32 (an entry's place is a 32-bit key; 1M
// tokens of 16-token blocks are 65,536 per head).
std::vector<std::vector<int64_t>> adakv_select(const float* scores, int n_heads, int64_t n_per_head,
                                               int64_t per_head_budget, double alpha, int64_t total_budget = -1);

// The per-head counts of adakv_select: [n_heads].
std::vector<int64_t> adakv_budgets(const float* scores, int n_heads, int64_t n_per_head, int64_t per_head_budget,
                                   double alpha);

}  // namespace longctx::policy
